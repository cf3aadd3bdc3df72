"""Pushes that do not hold training up, and large pushes over several connections.

BackgroundPusher copies the tensors to host memory (a snapshot: training may change them the
moment the call returns), then pushes from a thread of its own and hands back a
concurrent.futures.Future of the server's answer, done once the version is durable. The bytes
staged and not yet pushed are bounded: a push waits for room (a push larger than the bound
alone waits until nothing else is staged).

push_parallel splits one checkpoint into shards (tensors larger than an even share cut by rows,
the others whole) and sends them at once over several connections, each shard retried on
connection errors and on answers that say "try again" (5xx, 409 ABORTED)."""
import concurrent.futures
import threading

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with torch
    np = None
try:
    import torch
except ImportError:
    torch = None


def _nbytes(value):
    if torch is not None and isinstance(value, torch.Tensor):
        return value.element_size() * value.nelement()
    return value.nbytes


def _host_copy(value):
    """A copy of a tensor or array in host memory, contiguous."""
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).contiguous()
    return np.ascontiguousarray(value).copy()


class BackgroundPusher:
    """Pushes from `workers` threads, each with its own Client made by `make_client`, holding
    at most `max_staged_bytes` of copied tensors. Use as a context manager, or call close().
    Thread-safe."""

    def __init__(self, make_client, max_staged_bytes=2 << 30, workers=1):
        self._make_client = make_client
        self._max = max_staged_bytes
        self._staged = 0
        self._room = threading.Condition()
        self._local = threading.local()
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, "ckptd-push")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Waits for every push submitted, then stops the threads."""
        self._pool.shutdown(wait=True)

    @property
    def staged_bytes(self):
        with self._room:
            return self._staged

    def push(self, model, step, tensors, **kwargs):
        """Client.push in the background: returns a Future of its answer."""
        return self._submit(lambda c, t: c.push(model, step, t, **kwargs), tensors)

    def push_shard(self, model, step, rank, world_size, tensors, **kwargs):
        """Client.push_shard in the background: returns a Future of its answer."""
        return self._submit(
            lambda c, t: c.push_shard(model, step, rank, world_size, t, **kwargs), tensors)

    def _submit(self, send, tensors):
        size = sum(_nbytes(v) for v in tensors.values())
        with self._room:
            self._room.wait_for(lambda: self._staged == 0 or self._staged + size <= self._max)
            self._staged += size
        try:
            copies = {name: _host_copy(value) for name, value in tensors.items()}
        except BaseException:
            self._release(size)
            raise

        def run():
            try:
                client = getattr(self._local, "client", None)
                if client is None:
                    client = self._local.client = self._make_client()
                return send(client, copies)
            finally:
                copies.clear()
                self._release(size)

        return self._pool.submit(run)

    def _release(self, size):
        with self._room:
            self._staged -= size
            self._room.notify_all()


def split_into_shards(tensors, count):
    """`count` shards of `tensors` for push_shard: ([tensors of shard i], [slices of shard i]).
    A tensor larger than an even share is cut by rows across every shard (when it has that many
    rows), the others go whole to the least loaded shard."""
    total = sum(_nbytes(v) for v in tensors.values())
    share = total / count
    shards = [dict() for _ in range(count)]
    slices = [dict() for _ in range(count)]
    loads = [0] * count
    for name, value in sorted(tensors.items(), key=lambda kv: -_nbytes(kv[1])):
        shape = list(value.shape)
        if _nbytes(value) > share and shape and shape[0] >= count:
            parts = (value.tensor_split(count) if torch is not None
                     and isinstance(value, torch.Tensor) else np.array_split(value, count))
            offset = 0
            for i, part in enumerate(parts):
                shards[i][name] = part
                slices[i][name] = {"global_shape": shape,
                                   "offsets": [offset] + [0] * (len(shape) - 1)}
                loads[i] += _nbytes(part)
                offset += part.shape[0]
        else:
            i = loads.index(min(loads))
            shards[i][name] = value
            loads[i] += _nbytes(value)
    return shards, slices


def push_parallel(make_client, model, step, tensors, connections=4, retries=3, backoff=0.5,
                  metrics=None, tags=()):
    """Pushes one checkpoint as `connections` shards at once, each over a connection of its own
    (a Client from `make_client`) and retried `retries` times. Returns the answer of the shard
    that committed the version."""
    shards, slices = split_into_shards(tensors, connections)

    def send(i):
        return make_client().push_shard(model, step, i, connections, shards[i], slices=slices[i],
                                        metrics=metrics, tags=tags, retries=retries,
                                        backoff=backoff)

    with concurrent.futures.ThreadPoolExecutor(connections, "ckptd-shard") as pool:
        answers = list(pool.map(send, range(connections)))
    committed = [a for a in answers if a and "version" in a]
    return committed[0] if committed else answers[-1]
