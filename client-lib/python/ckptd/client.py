"""ckptd HTTP client on the standard library (http.client), streaming in both directions."""
import hashlib
import http.client
import json
import os
import ssl
import sys
import tempfile
import time
import urllib.parse
import warnings

from . import edge
from .safetensors import load_file, read_safetensors, safetensors_layout

_PIECE = 1 << 20
_DEFAULT_SERVER = "http://127.0.0.1:8420"


class CkptdError(Exception):
    """An error answer from ckptd: `status` (HTTP), `code` (e.g. NOT_FOUND), the message, and
    `reason` where the daemon refines the code ("NO_SPACE" with 507: the data volume is full or
    at its reserve; freeing space through deletes or GC helps, resending alone does not;
    "SHARDS_DROPPED" with 409 from push_shard: this rank's shard is stored, but the commit it
    completed dropped the shards the message names, which their ranks must send again)."""

    def __init__(self, status, code, message, reason=None):
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message, self.reason = status, code, message, reason


def _retryable(error):
    """Whether a failed request may pass if sent again: the daemon unreachable, restarting or
    cutting the connection (connection errors, timeouts, a cut answer, 5xx) or the model busy
    (409 ABORTED). Not: a certificate the client does not trust, a file it cannot read, any
    other answer. docs/failure-recovery.md."""
    if isinstance(error, CkptdError):
        return error.status >= 500 or error.code == "ABORTED"
    if isinstance(error, ssl.SSLCertVerificationError):
        return False
    return isinstance(error, (ConnectionError, TimeoutError, http.client.HTTPException))


def _retrying(call, retries, backoff):
    """call(); again on retryable errors, up to `retries` more times, waiting `backoff` seconds
    before the first retry and twice as long before each next one."""
    for attempt in range(retries + 1):
        try:
            return call()
        except (OSError, http.client.HTTPException, CkptdError) as error:
            if attempt == retries or not _retryable(error):
                raise
        time.sleep(backoff * (2 ** attempt))


class _Progress:
    """A progress bar on stderr for transfers of 8 MiB or more, only on a terminal."""

    def __init__(self, label, total, enabled=None):
        self.label, self.total, self.done = label, total, 0
        self.enabled = (sys.stderr.isatty() if enabled is None else enabled) and total >= 8 << 20
        self.last = 0.0

    def add(self, n):
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self.last > 0.1 or self.done >= self.total):
            self.last = now
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] "
                             f"{self.done / 2**20:.0f}/{self.total / 2**20:.0f} MiB")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


class _Body:
    """A safetensors body to send, as often as a push is attempted: a dict of tensors (written
    on the fly from the tensors' memory: `prefix`, the length and header, then `views`, each
    tensor's bytes) or a file at `path` (read again for each attempt)."""

    def __init__(self, state_dict_or_path, metadata=None):
        if isinstance(state_dict_or_path, (str, os.PathLike)):
            self.path = os.fspath(state_dict_or_path)
            self.total = os.stat(self.path).st_size
        else:
            self.path = None
            self.prefix, self.views, self.total = safetensors_layout(state_dict_or_path, metadata)
        self._sha256 = None

    def pieces(self):
        if self.path is not None:
            with open(self.path, "rb") as file:
                while True:
                    chunk = file.read(_PIECE)
                    if not chunk:
                        return
                    yield chunk
        else:
            yield self.prefix
            for view in self.views:
                for start in range(0, len(view), _PIECE):
                    yield view[start:start + _PIECE]

    def sha256(self):
        if self._sha256 is None:
            digest = hashlib.sha256()
            for piece in self.pieces():
                digest.update(piece)
            self._sha256 = digest.hexdigest()
        return self._sha256


class Client:
    """A connection profile for ckptd: one daemon, or several daemons of one deployment
    ("http://a:8420,http://b:8420"). Writes follow redirects to the daemon that writes the model.
    Thread-compatible (one request at a time per call; make one Client per thread for parallel
    transfers)."""

    def __init__(self, url=None, token=None, ca_file=None, timeout=600, progress=None,
                 encoded=False, reference_dir=None, encode_threads=0):
        """`url`: the daemon ("http://HOST:PORT"; several separated by commas), default
        $CKPT_SERVER, else http://127.0.0.1:8420. `token`: bearer token, default $CKPT_TOKEN.
        `ca_file`: PEM file of the CAs an https:// server's certificate must chain to, default
        $CKPT_CACERT, else the system's. The same variables as the ckpt CLI.

        `encoded`: push and pull whole versions coded here (edge.py), the wire carrying the
        stored bytes: pushes code their deltas against the restored body of the model's last
        version pushed or pulled, kept in `reference_dir` (default: where `ckpt push --encoded`
        keeps them, ~/.cache/ckpt/references/HOST-PORT, under $XDG_CACHE_HOME if set: one
        restored checkpoint per model), coded and decoded on `encode_threads` threads (0: the
        machine's cores). Each push and pull may override `encoded`. Needs the native module
        (`make python-client`); without it, transfers are coded by the daemon, and a warning
        says so once."""
        url = url or os.environ.get("CKPT_SERVER") or _DEFAULT_SERVER
        ca_file = ca_file or os.environ.get("CKPT_CACERT") or None
        self._settings = dict(url=url, token=token, ca_file=ca_file, timeout=timeout,
                              progress=progress, encoded=encoded, reference_dir=reference_dir,
                              encode_threads=encode_threads)
        self.url = url
        # Body bytes received for parts of versions (pull_box, pull_with_metadata with a
        # selection): what a part costs the wire.
        self.part_bytes_received = 0
        # Several daemons of one deployment (one Ceph pool) may be listed, separated by commas:
        # each request goes to the first that accepts a connection.
        self._endpoints = []
        schemes = set()
        for one in url.split(","):
            parsed = urllib.parse.urlsplit(one.strip())
            if parsed.scheme not in ("http", "https") or not parsed.hostname:
                raise ValueError(
                    f"server URL {one!r} must be http://HOST:PORT or https://HOST:PORT")
            if parsed.path not in ("", "/"):
                raise ValueError(f"server URL {one!r} must not have a path")
            schemes.add(parsed.scheme)
            self._endpoints.append(
                (parsed.hostname, parsed.port or (443 if parsed.scheme == "https" else 80)))
        if len(schemes) != 1:
            raise ValueError(f"server URLs {url!r} mix http:// and https://")
        self._https = schemes.pop() == "https"
        self._token = token if token is not None else os.environ.get("CKPT_TOKEN")
        self._timeout = timeout
        self._progress = progress
        self._ssl = ssl.create_default_context(cafile=ca_file) if self._https else None
        # With several daemons on one Ceph pool, a model's writes go through the daemon holding
        # its lease; the others answer 307. Where each model's writes were last redirected to.
        self._writer = {}
        self._encoded = encoded
        self.reference_dir = reference_dir or edge.default_reference_dir(*self._endpoints[0])
        self._encode_threads = encode_threads

    # -- plumbing -----------------------------------------------------------------------------
    def _connect(self, endpoint=None):
        """A connected connection to `endpoint`, or to the first listed server that accepts."""
        candidates = [endpoint] if endpoint else self._endpoints
        errors = []
        for host, port in candidates:
            if self._https:
                conn = http.client.HTTPSConnection(host, port, timeout=self._timeout,
                                                   context=self._ssl)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self._timeout)
            try:
                conn.connect()
                return conn
            except OSError as error:
                conn.close()
                if isinstance(error, ssl.SSLError) and len(candidates) == 1:
                    raise  # reached, but not trusted: the certificate is the problem
                errors.append(f"{'https' if self._https else 'http'}://{host}:{port}: {error}")
        raise ConnectionError("cannot reach ckptd at " + "; ".join(errors) +
                              " (is it running? the URL comes from Client(url=...), "
                              "else $CKPT_SERVER)")

    def _redirect(self, model, response, path):
        """The endpoint a 307/308 answer for a write of `model` points to (remembered for the
        model's next writes); raises if it cannot be followed."""
        location = urllib.parse.urlsplit(response.getheader("Location") or "")
        target = location.path + ("?" + location.query if location.query else "")
        if location.scheme != ("https" if self._https else "http") or target != path \
                or not location.hostname:
            self._raise_for(response)
        response.read()
        endpoint = (location.hostname, location.port or (443 if self._https else 80))
        self._writer[model] = endpoint
        return endpoint

    def _write(self, model, send, answer=None):
        """Runs `send(conn, ...)` -> response for a write of `model` against the daemon that
        takes the model's writes, following up to 4 redirects; returns `answer(response)`
        (default: its JSON)."""
        endpoint = self._writer.get(model)
        for _ in range(5):
            conn = self._connect(endpoint)
            try:
                try:
                    response, path = send(conn)
                except OSError:
                    if endpoint is None:
                        raise
                    self._writer.pop(model, None)  # the remembered writer is gone: ask again
                    endpoint = None
                    continue
                if response.status in (307, 308):
                    endpoint = self._redirect(model, response, path)
                    continue
                return (answer or self._json_answer)(response)
            finally:
                conn.close()
        raise CkptdError(508, "REDIRECT_LOOP", f"writes of model {model!r} redirect in a loop")

    def _headers(self, extra=None):
        headers = {"User-Agent": "ckptd-python/0.1"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        headers.update(extra or {})
        return headers

    @staticmethod
    def _raise_for(response):
        body = response.read()
        code, message, reason = "HTTP_ERROR", body.decode(errors="replace"), None
        try:
            error = json.loads(body)["error"]
            code, message = error["code"], error["message"]
            reason = error.get("reason")
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
        raise CkptdError(response.status, code, message, reason)

    def _json_answer(self, response):
        if response.status >= 300:
            self._raise_for(response)
        data = response.read()
        return json.loads(data) if data else None

    def _json(self, method, path, body=None, model=None):
        """A JSON request; `model`: a write of that model (redirects to its writer followed)."""
        payload = json.dumps(body).encode() if body is not None else None
        headers = self._headers({"Content-Type": "application/json"} if payload else None)

        def send(conn):
            conn.request(method, path, body=payload, headers=headers)
            return conn.getresponse(), path

        if model is not None and method != "GET":
            return self._write(model, send)
        conn = self._connect()
        try:
            return self._json_answer(send(conn)[0])
        finally:
            conn.close()

    @staticmethod
    def _quote(name):
        return urllib.parse.quote(str(name), safe="")

    # -- checkpoints --------------------------------------------------------------------------
    def push(self, model, step, state_dict_or_path, metadata=None, metrics=None, tags=(),
             retries=5, backoff=0.5, encoded=None):
        """Pushes a checkpoint as `model` at version `step`: a dict of tensors (torch or numpy,
        written as safetensors on the fly, never copied whole) or the path of a safetensors
        file. `metadata` goes into `__metadata__` (strings); `metrics` ({"loss": 1.2}) and
        `tags` are attached to the version. Returns the server's answer (dict).

        A push that fails in a way that may pass (the daemon unreachable or restarting, 5xx, the
        model busy) is sent again up to `retries` times, `backoff` seconds before the first
        retry and twice as long before each next one (by default for about 15 s; raise
        `retries` to wait out a longer restart). If an earlier attempt committed although
        its answer was lost, the version's record is returned when it holds this very body
        (same SHA-256); a different body at that version stays an error (409).

        `encoded` (default: the Client's): the checkpoint is coded here by the daemon's plan and
        the wire carries the stored bytes; the answer then has "encoded" (whether it was),
        "sent_bytes", "reference" (how its deltas' base was had: "held", "pulled", "" when none
        was needed or the daemon coded the push) and "reference_note" (in words: that the one
        held did not restore the base, or why the daemon coded the push; else "")."""
        query = [(f"metric.{k}", repr(float(v))) for k, v in (metrics or {}).items()]
        query += [("tag", t) for t in tags]
        path = f"/v1/models/{self._quote(model)}/versions/{int(step)}"
        if query:
            path += "?" + urllib.parse.urlencode(query)
        body = _Body(state_dict_or_path, metadata)
        attempts = []

        label = f"push {model}@{step}"
        encode = self._use_encoded(encoded)
        # Asked for encoded without the codec here: the daemon codes, and the answer says so.
        uncoded = not encode and (self._encoded if encoded is None else encoded)

        def once():
            attempts.append(1)
            try:
                if encode:
                    return edge.push_encoded(self, model, step, body, path, self.reference_dir,
                                             self._encode_threads, 3, label)
                answer = self._put_body(model, path, body, label)
                if uncoded:
                    answer = dict(answer, encoded=False, sent_bytes=body.total, reference="",
                                  reference_note="no native codec module: the daemon coded this "
                                                 "push")
                return answer
            except CkptdError as error:
                if len(attempts) > 1 and error.status == 409 \
                        and error.code == "FAILED_PRECONDITION":
                    stored = self._version_record(model, int(step))
                    if stored and stored.get("pushed_sha256") == body.sha256():
                        return dict(stored, model=model)  # as the push's own answer
                raise

        return _retrying(once, retries, backoff)

    def push_shard(self, model, step, rank, world_size, tensors, slices=None, metadata=None,
                   metrics=None, tags=(), retries=5, backoff=0.5, encoded=None):
        """Pushes the shard of rank `rank` of `world_size` of version `step` (every rank its
        own, in parallel): `tensors` is a dict of whole tensors or of slices of global tensors,
        `slices` maps the name of each slice to {"global_shape": [...], "offsets": [...]}
        (where it lies in its global tensor; the tensor's own shape is its extent). Tensors held
        whole by several ranks must be equal. The version becomes visible when its last shard
        is stored; the answer's "version" is set then (a commit that drops other ranks' encoded
        shards, coded by a stale plan or against a drifted reference, raises CkptdError with
        reason "SHARDS_DROPPED": they must be sent again). Sending a shard again replaces the
        earlier attempt, so failures are retried as push() does. `metrics` and `tags` apply
        when this shard completes the version. With several daemons on one pool any daemon
        takes the shard; when it completes the version on a daemon that does not write the
        model, this asks the writer for the commit and returns its answer.

        `encoded` (default: the Client's): the rank codes its shard by the daemon's plan of it —
        the chunks of global tensors its slices hold whole, against its part of the last version
        (kept in `reference_dir` under "<model>.rank<r>-of-<n>", or pulled encoded), the rest
        sent raw for the daemon to code; the answer then has "encoded", "sent_bytes",
        "reference" and "reference_note" as push()'s."""
        metadata = dict(metadata or {})
        if slices:
            metadata["ckptd.slices"] = json.dumps(
                {name: {"global_shape": [int(d) for d in s["global_shape"]],
                        "offsets": [int(d) for d in s["offsets"]]} for name, s in slices.items()})
        query = [("of", str(int(world_size)))]
        query += [(f"metric.{k}", repr(float(v))) for k, v in (metrics or {}).items()]
        query += [("tag", t) for t in tags]
        path = (f"/v1/models/{self._quote(model)}/versions/{int(step)}/shards/{int(rank)}?"
                + urllib.parse.urlencode(query))
        body = _Body(tensors, metadata)
        label = f"push {model}@{step} rank {rank}"
        if self._use_encoded(encoded):
            def once():
                return edge.push_shard_encoded(self, model, step, rank, world_size, body, path,
                                               self.reference_dir, self._encode_threads, 3, label)
        else:
            def once():
                return self._put_body(model, path, body, label)
        # The version's metrics and tags go with the commit, wherever it runs.
        commit_query = [(k, v) for k, v in query if k != "of"]

        def stored_and_committed():
            for _ in range(3):
                try:
                    return self._completed(model, step, once(), commit_query)
                except CkptdError as error:
                    # The commit dropped this rank's shard, coded by a plan gone stale: it codes
                    # and sends its shard again.
                    if error.reason != "STALE_PLAN":
                        raise
            return self._completed(model, step, once(), commit_query)
        return _retrying(stored_and_committed, retries, backoff)

    def _completed(self, model, step, answer, commit_query):
        """A shard's answer; when the shard completed its upload on a daemon that does not write
        the model (a cluster: the answer names the writer in "commit_through"), the commit's
        answer, asked of the writer, with what the shard's own answer adds."""
        upload = (answer or {}).get("upload") or {}
        if "version" in (answer or {}) or upload.get("committed") or upload.get("missing") \
                or not upload.get("commit_through"):
            return answer
        path = f"/v1/models/{self._quote(model)}/versions/{int(step)}/shards:commit"
        if commit_query:
            path += "?" + urllib.parse.urlencode(commit_query)
        # Retried alone: the shard is stored.
        committed = _retrying(lambda: self._json("POST", path, model=model), 3, 0.5)
        return dict(answer, **(committed or {}))

    def _version_record(self, model, version):
        """The listing entry of `version` of `model`, or None."""
        for record in self.versions(model):
            if record.get("version") == version:
                return record
        return None

    def twin(self):
        """A new Client with the same settings (Clients are not shared between threads)."""
        return Client(**self._settings)

    def background(self, max_staged_bytes=2 << 30, workers=1):
        """A BackgroundPusher: pushes that return once the tensors are copied to host memory,
        with a Future of the answer (done when the version is durable)."""
        from .background import BackgroundPusher
        return BackgroundPusher(self.twin, max_staged_bytes, workers)

    def push_parallel(self, model, step, tensors, connections=4, retries=3, metrics=None,
                      tags=()):
        """Pushes one checkpoint as `connections` shards sent at once (each retried), for large
        checkpoints and slow single connections. Returns the committing shard's answer."""
        from .background import push_parallel
        return push_parallel(self.twin, model, step, tensors, connections, retries,
                             metrics=metrics, tags=tags)

    def upload(self, model, step):
        """The state of the sharded upload of version `step`: received and missing shards."""
        return self._json("GET", f"/v1/models/{self._quote(model)}/versions/{int(step)}/shards")

    def commit_shards(self, model, step):
        """Commits a sharded upload whose shards are all stored (the last shard does it by
        itself; this is for a commit that failed and was fixed)."""
        return self._json("POST",
                          f"/v1/models/{self._quote(model)}/versions/{int(step)}/shards:commit",
                          model=model)

    def abort_upload(self, model, step):
        self._json("DELETE", f"/v1/models/{self._quote(model)}/versions/{int(step)}/shards",
                   model=model)

    def version_detail(self, model, version="latest"):
        """How `version` is stored, tensor by tensor (kind, codec, bound, chunk_bytes, bytes)."""
        return self._json("GET", f"/v1/models/{self._quote(model)}/versions/"
                                 f"{self._quote(version)}?detail=1")

    def layout(self, model, version="latest"):
        """How `version` was pushed: its shards and where each tensor's slices lie."""
        return self._json("GET", f"/v1/models/{self._quote(model)}/versions/"
                                 f"{self._quote(version)}?layout=1")

    def pull_shard(self, model, rank, world_size, version="latest", tensors=None, as_torch=True,
                   encoded=None):
        """The part of `version` that rank `rank` of `world_size` holds: each tensor pushed as
        slices along one dimension is split along it into `world_size` consecutive parts (the
        first `extent % world_size` one longer, as torch.tensor_split), every other tensor
        whole. Returns (tensors, slices): slices maps each cut tensor to its "global_shape" and
        "offsets". `encoded` (default: the Client's): the records of the chunks holding the
        part are received and decoded here."""
        out, metadata = self.pull_with_metadata(model, version, as_torch, tensors=tensors,
                                                rank=rank, world_size=world_size,
                                                encoded=encoded)
        return out, json.loads(metadata.get("ckptd.slices", "{}"))

    def _put_body(self, model, path, body, label):
        """PUTs a safetensors `body` (_Body) to `path`."""
        progress = _Progress(label, body.total, self._progress)

        def send(conn):
            conn.putrequest("PUT", path)
            for key, value in self._headers({"Content-Type": "application/octet-stream",
                                             "Content-Length": str(body.total)}).items():
                conn.putheader(key, value)
            conn.endheaders()
            try:
                for piece in body.pieces():
                    conn.send(piece)
                    progress.add(len(piece))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered early (an error or a redirect): read it below
            return conn.getresponse(), path

        return self._write(model, send)

    def _put_stream(self, model, path, read, content_type):
        """PUTs a body of unknown length, chunked, read through `read(size) -> bytes` (b"" at
        its end). The body can be read once: when the model's writer moved (a redirect, the
        remembered writer gone) after it was begun, the push must start again from its plan,
        which a 503 makes push() do."""
        attempts = []

        def send(conn):
            if attempts:
                raise CkptdError(503, "UNAVAILABLE",
                                 f"the writer of model {model!r} changed while an encoded push "
                                 "was sent: it is planned and sent again")
            attempts.append(1)
            conn.putrequest("PUT", path)
            for key, value in self._headers({"Content-Type": content_type,
                                             "Transfer-Encoding": "chunked"}).items():
                conn.putheader(key, value)
            conn.endheaders()
            try:
                while True:
                    piece = read(_PIECE)
                    conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
                    if not piece:
                        break
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered early (an error or a redirect): read it below
            return conn.getresponse(), path

        return self._write(model, send)

    def _post_bytes(self, model, path, payload):
        """POSTs `payload` (octet-stream) as a write of `model`; the answer's body (text)."""

        def send(conn):
            conn.request("POST", path, body=payload,
                         headers=self._headers({"Content-Type": "application/octet-stream"}))
            return conn.getresponse(), path

        def text(response):
            if response.status >= 300:
                self._raise_for(response)
            return response.read().decode()

        return self._write(model, send, text)

    def _use_encoded(self, encoded):
        """Whether a transfer is encoded: asked for (`encoded`, else the Client's setting) and
        the codec installed."""
        wanted = self._encoded if encoded is None else encoded
        if wanted and not edge.available():
            edge.warn_unavailable()
            return False
        return wanted

    def pull(self, model, version="latest", as_torch=True, tensors=None, encoded=None):
        """Restores `version` (a step, "latest" or "tag:NAME") as a dict of tensors (torch, or
        numpy arrays when torch is missing or `as_torch` is False), streamed from the socket
        into one buffer per tensor. `tensors`: name patterns ("layers.*.weight") to restore
        only those. The SHA-256 the server announces (for a whole version) is verified.
        `encoded` (default: the Client's): as pull_with_metadata."""
        out, _ = self.pull_with_metadata(model, version, as_torch, tensors=tensors,
                                         encoded=encoded)
        return out

    def pull_encoded(self, model, path, version="latest"):
        """Pulls `version` as its stored records into the safetensors file `path`, decoded here
        (bit-identical to a restore; SHA-256 verified). When the restored body of an earlier
        version of the model is held in `reference_dir`, only what turns it into `version` is
        sent (the chains' deltas after it: a follower's sync); the version pulled becomes the
        one held unless it is older. Returns {"model", "version", "file", "sha256",
        "restored_bytes", "received_bytes", "since_version" (the version held that the deltas
        were sent against; 0: none, or one the daemon could not code against), "verified",
        "encoded"}, as `ckpt pull --json` (which also says "resumed_bytes"). Without the
        native module (edge.available()) the daemon decodes: a plain restore into `path`, with
        "encoded" False, and a warning once."""
        if not edge.available():
            edge.warn_unavailable()
            return self._download(model, os.fspath(path), version)
        return dict(edge.pull_encoded(self, model, str(version), os.fspath(path),
                                      self.reference_dir), model=model, file=os.fspath(path),
                    encoded=True)

    def _open_restore(self, model, version, query=None, accept=None):
        """(connection, response) of GET version; raises CkptdError unless 200. The caller
        closes the connection."""
        conn = self._connect()
        path = f"/v1/models/{self._quote(model)}/versions/{self._quote(version)}"
        if query:
            path += "?" + urllib.parse.urlencode(query)
        try:
            conn.request("GET", path, headers=self._headers({"Accept": accept} if accept else None))
            response = conn.getresponse()
            if response.status != 200:
                self._raise_for(response)
            return conn, response
        except BaseException:
            conn.close()
            raise

    def pull_with_metadata(self, model, version="latest", as_torch=True, tensors=None, rank=None,
                           world_size=None, encoded=None):
        """(tensors, metadata) of `version`, as pull; `rank` of `world_size`: as pull_shard.
        `encoded` (default: the Client's): received as stored records and decoded here; a whole
        version syncs the reference held (pull_encoded), a part (`tensors`, `rank`) receives
        the records of the chunks holding it and leaves the reference alone."""
        query = [("tensors", ",".join(tensors))] if tensors else []
        if rank is not None:
            query += [("rank", str(int(rank))), ("of", str(int(world_size)))]
        return self._pull_part(model, version, query, as_torch, encoded)

    def pull_box(self, model, name, offsets, shape, version="latest", as_torch=True,
                 encoded=None):
        """One box of tensor `name` of `version`: the elements from `offsets` (one per dimension)
        spanning `shape`. Only the chunks holding it are decoded (along dimension 0; a box cut
        along another dimension decodes its tensor's chunks); `encoded` as pull_with_metadata.
        Raises CkptdError 404 for an unknown tensor, 400 for a box reaching past it."""
        query = [("tensor", name), ("offsets", ",".join(str(int(o)) for o in offsets)),
                 ("shape", ",".join(str(int(d)) for d in shape))]
        tensors, _ = self._pull_part(model, version, query, as_torch, encoded)
        return tensors[name]

    def _pull_part(self, model, version, query, as_torch, encoded):
        """(tensors, metadata) of `version`, or of the part `query` selects (restore parameters,
        docs/api.md)."""
        if self._use_encoded(encoded):
            with tempfile.TemporaryDirectory(prefix="ckptd-pull-") as scratch:
                path = os.path.join(scratch, "restored.safetensors")
                try:
                    if query:
                        pulled = edge.pull_part_encoded(self, model, str(version), path, query)
                        self.part_bytes_received += pulled["received_bytes"]
                    else:
                        self.pull_encoded(model, path, version)
                    return load_file(path, as_torch)
                except CkptdError as error:
                    # A daemon that sends parts of versions only decoded refuses the request
                    # (400); the plain restore below says what is wrong with one that is bad.
                    if not query or error.status != 400:
                        raise
        conn, response = self._open_restore(model, version, query)
        try:
            expected = response.getheader("X-Ckpt-Sha256")
            total = int(response.getheader("Content-Length", "0"))
            if query:
                self.part_bytes_received += total
            progress = _Progress(f"pull {model}@{version}", total, self._progress)
            sha = hashlib.sha256()

            def readinto(view):
                n = response.readinto(view)
                if n:
                    sha.update(view[:n])
                return n

            tensors, metadata = read_safetensors(readinto, as_torch, progress.add)
            if response.read(1):
                raise CkptdError(200, "DATA_LOSS", "restore has bytes after the last tensor")
            if expected and sha.hexdigest() != expected:
                raise CkptdError(200, "DATA_LOSS",
                                 f"restored bytes hash to {sha.hexdigest()}, server said {expected}")
            return tensors, metadata
        finally:
            conn.close()

    def pull_to_file(self, model, path, version="latest", encoded=None):
        """Restores `version` into a safetensors file (SHA-256 verified). Returns its size.
        `encoded` (default: the Client's): as pull_encoded."""
        if self._use_encoded(encoded):
            return self.pull_encoded(model, path, version)["restored_bytes"]
        return self._download(model, path, version)["restored_bytes"]

    def _download(self, model, path, version):
        """A plain restore of `version` into the file `path` (written as `path`.partial and
        renamed once verified: a failed pull leaves `path` as it was), as pull_encoded
        answers."""
        conn, response = self._open_restore(model, version)
        partial = os.fspath(path) + ".partial"
        try:
            expected = response.getheader("X-Ckpt-Sha256")
            sha, size = hashlib.sha256(), 0
            with open(partial, "wb") as out:
                while True:
                    chunk = response.read(_PIECE)
                    if not chunk:
                        break
                    sha.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            if expected and sha.hexdigest() != expected:
                raise CkptdError(200, "DATA_LOSS", "restored file does not match its SHA-256")
            os.replace(partial, path)
            return {"model": model,
                    "version": int(response.getheader("X-Ckpt-Version", "0")),
                    "file": os.fspath(path), "sha256": sha.hexdigest(),
                    "restored_bytes": size, "received_bytes": size, "since_version": 0,
                    "verified": bool(expected), "encoded": False}
        finally:
            conn.close()
            if os.path.exists(partial):
                os.remove(partial)

    # -- models, versions, policies -----------------------------------------------------------
    def list_models(self):
        """Every model: a list of {"name", "latest_version", "version_count", "raw_bytes",
        "stored_bytes", ...}."""
        return self._json("GET", "/v1/models")["models"]

    def model(self, model):
        """One model's summary (as list_models); CkptdError 404 if there is no such model."""
        return self._json("GET", f"/v1/models/{self._quote(model)}")

    def latest_version(self, model):
        """The model's newest version number, or None when it has none yet (no such model, or
        a model that got its policy before its first push): where a job starts or resumes."""
        try:
            return self.model(model).get("latest_version")
        except CkptdError as error:
            if error.status == 404:
                return None
            raise

    def versions(self, model):
        """The model's versions, oldest first: a list of {"version", "kind", "lossy",
        "raw_bytes", "stored_bytes", "sha256", "tags", "metrics", "dropped_tensors", ...}."""
        return self._json("GET", f"/v1/models/{self._quote(model)}/versions")["versions"]

    def resolve_version(self, model, version):
        """The number `version` names: an int, "latest" or "tag:NAME"."""
        if isinstance(version, int):
            return version
        if version == "latest":
            latest = self.latest_version(model)
            if latest is None:
                raise CkptdError(404, "NOT_FOUND", f"model {model!r} has no versions")
            return latest
        if isinstance(version, str) and version.startswith("tag:"):
            for record in self.versions(model):
                if version[4:] in record.get("tags", []):
                    return record["version"]
            raise CkptdError(404, "NOT_FOUND",
                             f"model {model!r} has no version tagged {version[4:]!r}")
        return int(version)

    def delete_version(self, model, version):
        """Deletes one version (an int, "latest" or "tag:NAME"); every other version restores
        exactly as before. A tagged version is refused (409) until untagged."""
        number = self.resolve_version(model, version)
        self._json("DELETE", f"/v1/models/{self._quote(model)}/versions/{number}", model=model)

    def delete_model(self, model):
        """Deletes the model with every version, its policies and tags."""
        self._json("DELETE", f"/v1/models/{self._quote(model)}", model=model)

    def get_policy(self, model):
        """The model's codec policy (dict; the server's default if none was set)."""
        return self._json("GET", f"/v1/models/{self._quote(model)}/policy")

    def set_policy(self, model, policy):
        """Merges `policy` (dict of the fields to change) into the model's codec policy, as
        `ckpt policy MODEL JSON` does; returns the policy stored. Fields stored that change
        nothing (a bound on a lossless policy) are told with warnings.warn."""
        answer = self._json("PUT", f"/v1/models/{self._quote(model)}/policy", policy, model=model)
        for text in answer.pop("warnings", []):
            warnings.warn(f"ckptd policy of {model!r}: {text}", stacklevel=2)
        return answer

    def get_retention(self, model):
        """The model's retention policy (dict; {} keeps everything)."""
        return self._json("GET", f"/v1/models/{self._quote(model)}/retention")

    def set_retention(self, model, retention, allow_deletes=False):
        """Replaces the model's retention policy with `retention` (rules not given are removed),
        as `ckpt retention MODEL JSON` does. Retention runs after every push and periodically,
        so a policy whose next pass would delete versions or tensors the stored one keeps is
        refused with ValueError listing them, unless `allow_deletes`. Returns the policy."""
        if not allow_deletes:
            try:
                before = _removals(self.preview_retention(model))
            except CkptdError as error:
                if error.status != 404:
                    raise
                before = None  # no such model yet: nothing to delete
            more = [] if before is None else \
                sorted(_removals(self.preview_retention(model, retention)) - before)
            if more:
                legend = "; VERSION:TENSOR for dropped tensors" \
                    if any(":" in item for item in more) else ""
                raise ValueError(f"the new retention policy of {model!r} would delete what the "
                                 f"stored one keeps ({', '.join(more[:8])}"
                                 f"{', ...' if len(more) > 8 else ''}{legend}): pass "
                                 "allow_deletes=True to store it")
        return self._json("PUT", f"/v1/models/{self._quote(model)}/retention", retention,
                          model=model)

    def preview_retention(self, model, retention=None):
        """What the stored retention policy (or `retention`, not stored) would delete now:
        {"deleted": [...], "kept": [{"version", "kept_by"}], "tensors_dropped": [...]}."""
        return self._json("POST", f"/v1/models/{self._quote(model)}/retention:preview",
                          retention)

    def apply_retention(self, model):
        """Applies the stored retention policy now (deletes what it does not keep) and reclaims
        the space; the report of preview_retention with "gc"."""
        return self._json("POST", f"/v1/models/{self._quote(model)}/retention:apply",
                          model=model)

    def tag(self, model, version, tag):
        """Tags `version` (an int, "latest" or "tag:NAME") as `tag`: retention keeps it; a tag
        another version holds moves. Returns the version's record."""
        number = self.resolve_version(model, version)
        return self._json("PUT", f"/v1/models/{self._quote(model)}/versions/{number}"
                                 f"/tags/{self._quote(tag)}", model=model)

    def untag(self, model, version, tag):
        """Removes `tag` from `version` (an int, "latest" or "tag:NAME")."""
        number = self.resolve_version(model, version)
        self._json("DELETE", f"/v1/models/{self._quote(model)}/versions/{number}"
                             f"/tags/{self._quote(tag)}", model=model)

    # -- administration (admin scope) ---------------------------------------------------------
    def gc(self):
        """Applies every model's stored retention policy now and reclaims the space:
        {"models": [...], "deleted_versions", "bytes_freed"}."""
        return self._json("POST", "/v1/admin/gc")

    def scrub(self):
        """Reads and verifies every stored byte and restores every version:
        {"clean": bool, "models": [...]} naming damaged versions."""
        return self._json("POST", "/v1/admin/scrub")

    def backup(self, directory):
        """A consistent online backup of the whole store into `directory` on the server (an
        absolute path; created with its parents if missing)."""
        return self._json("POST", "/v1/admin/backup", {"to": str(directory)})


def _removals(report):
    """The versions a retention report deletes and its dropped tensors ("VERSION:TENSOR")."""
    out = {str(v) for v in report.get("deleted", [])}
    for item in report.get("tensors_dropped", []):
        out.update(f"{item['version']}:{t}" for t in item.get("tensors", []))
    return out
