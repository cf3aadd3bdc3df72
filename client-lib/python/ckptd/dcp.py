"""ckptd as a storage of PyTorch Distributed Checkpoint (DCP): every rank's write items become
that rank's shard of one sharded version, committed atomically by the coordinator's `finish`;
loading reads, per item, the box it names.

    import ckptd.dcp
    dcp = ckptd.dcp.checkpoint_module()      # torch.distributed[._shard].checkpoint
    dcp.save_state_dict(state_dict, storage_writer=ckptd.dcp.Writer(client, "run1", step))
    dcp.load_state_dict(state_dict, storage_reader=ckptd.dcp.Reader(client, "run1"))

What a version holds (docs/dcp.md):
- each tensor item under its fully qualified name (FQN) as DCP plans it, in global coordinates:
  the slices ranks write (ShardedTensor shards, DTensor parts) are assembled into the global
  tensor, so deltas line up across versions whatever the sharding of either;
- each bytes item (what DCP pickles: step counters, RNG, data-loader and scheduler state) as a
  uint8 tensor named "ckptd.dcp/bytes/<FQN>", stored exactly under every policy (policies code
  float tensors only);
- DCP's metadata, pickled as DCP's own file storage pickles it, as the uint8 tensor
  "ckptd.dcp/metadata", sent by the coordinator's `finish` as the upload's last shard: the
  version appears then, whole, or not at all (an upload a failed save leaves expires, or the
  next save of that step drops it).

Loading unpickles that metadata and the bytes items, as DCP's FileSystemReader does: read only
models you trust. On torch < 2.0 keep the state dict flat (DCP pickles a nested dict whole,
as one bytes item).

Thread safety: a Writer or Reader belongs to one rank's save or load; give each its own Client
(Client.twin()).
"""
import dataclasses
import io
import pickle

import numpy as np

from .client import CkptdError
from .torch_compat import import_distributed_checkpoint

# Names of what the adapter stores beside the state dict's tensors.
PREFIX = "ckptd.dcp/"
METADATA_TENSOR = PREFIX + "metadata"
BYTES_PREFIX = PREFIX + "bytes/"


def checkpoint_module():
    """torch's distributed checkpoint module (torch.distributed.checkpoint, or on torch < 2.0
    torch.distributed._shard.checkpoint, imported with the Python 3.11 shim where needed)."""
    return import_distributed_checkpoint()


_dcp = checkpoint_module()
StorageWriter, StorageReader = _dcp.StorageWriter, _dcp.StorageReader
try:
    from torch.distributed.checkpoint.storage import WriteResult
except ImportError:
    from torch.distributed._shard.checkpoint.storage import WriteResult
try:
    from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
except ImportError:
    from torch.distributed._shard.checkpoint.planner import LoadItemType, WriteItemType


def _done(value):
    import torch.futures
    future = torch.futures.Future()
    future.set_result(value)
    return future


def _rank_and_world_size(rank, world_size):
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _bytes_tensor(buffer):
    import torch
    return torch.from_numpy(np.frombuffer(bytes(buffer), dtype=np.uint8).copy())


def stored_name(fqn, is_bytes):
    """The name under which an item of FQN `fqn` is stored."""
    return BYTES_PREFIX + fqn if is_bytes else fqn


class Writer(StorageWriter):
    """Saves a DCP checkpoint as version `step` of `model`.

    The shards are numbered by DCP's plan (the ranks of the process group it saves with; the
    upload has one more, the coordinator's metadata); `rank`/`world_size` (default:
    torch.distributed's of the default group) name this process outside that plan. `encoded`
    (default: the Client's) codes each rank's shard on the rank (Client.push_shard). `metrics`
    and `tags` apply to the version."""

    def __init__(self, client, model, step, rank=None, world_size=None, encoded=None,
                 metrics=None, tags=()):
        self.client, self.model, self.step = client, model, int(step)
        self._rank, self._world_size = rank, world_size
        self.encoded, self.metrics, self.tags = encoded, metrics, tuple(tags)
        self.is_coordinator = False
        self.shard_answer = None  # the daemon's answer to this rank's shard
        self.shard_bytes = 0  # the bytes of this rank's items
        self.answer = None  # the coordinator's: the version the finish committed

    # torch 1.13
    def init(self, is_coordinator):
        self.is_coordinator = is_coordinator
        self.rank, self.world_size = _rank_and_world_size(self._rank, self._world_size)

    # torch >= 2.0 (untested here: Debian 12 ships torch 1.13)
    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            if not self.validate_checkpoint_id(checkpoint_id):
                raise ValueError(f"checkpoint_id {checkpoint_id!r}: ckptd.dcp.Writer saves a "
                                 "version number")
            self.step = int(checkpoint_id)
        self.shard_answer, self.shard_bytes, self.answer = None, 0, None

    def set_up_storage_writer(self, is_coordinator):
        self.init(is_coordinator)

    def storage_meta(self):
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        try:
            int(checkpoint_id)
            return True
        except (TypeError, ValueError):
            return False

    def prepare_local_plan(self, plan):
        # Refused before any rank writes, so that a refused save stores nothing.
        seen = set()
        for item in plan.items:
            fqn = item.index.fqn
            if fqn.startswith(PREFIX):
                raise ValueError(f"state dict key {fqn!r}: names starting with {PREFIX!r} are "
                                 "ckptd's own")
            if fqn in seen:
                raise ValueError(f"rank {self.rank} writes two chunks of {fqn!r}: ckptd stores "
                                 "one slice of a tensor per rank")
            seen.add(fqn)
        return plan

    def prepare_global_plan(self, plans):
        # The shards are the planned ranks of the process group DCP saves with (shard i of
        # len(plans) + 1; the last is the metadata). Shards an earlier failed save of this
        # version left behind (maybe of another rank count) are dropped first: nothing of this
        # save is stored yet.
        try:
            self.client.abort_upload(self.model, self.step)
        except CkptdError as error:
            if error.status != 404:
                raise
        return [dataclasses.replace(p, storage_data=(i, len(plans) + 1))
                for i, p in enumerate(plans)]

    def write_data(self, plan, planner):
        shard, shard_count = plan.storage_data or (self.rank, self.world_size + 1)
        tensors, slices, results = {}, {}, []
        self.shard_bytes = 0
        for item in plan.items:
            fqn = item.index.fqn
            data = planner.resolve_data(item)
            is_bytes = item.type == WriteItemType.BYTE_IO
            name = stored_name(fqn, is_bytes)
            if is_bytes:
                tensors[name] = _bytes_tensor(data.getbuffer())
            else:
                tensors[name] = data.detach().cpu().contiguous()
                chunk = item.tensor_data.chunk
                if item.type == WriteItemType.SHARD or \
                        list(chunk.sizes) != list(item.tensor_data.size):
                    slices[name] = {"global_shape": list(item.tensor_data.size),
                                    "offsets": list(chunk.offsets)}
            size = tensors[name].numel() * tensors[name].element_size()
            self.shard_bytes += size
            results.append(WriteResult(index=item.index, size_in_bytes=size,
                                       storage_data={"name": name, "bytes": size}))
        self.shard_answer = self.client.push_shard(self.model, self.step, shard, shard_count,
                                                   tensors, slices=slices, encoded=self.encoded)
        return _done(results)

    def finish(self, metadata, results):
        storage = {}
        for rank_results in results:
            for result in rank_results:
                storage[result.index] = result.storage_data
        metadata = dataclasses.replace(metadata, storage_data=storage)
        blob = _bytes_tensor(pickle.dumps(metadata))
        refused = None
        try:
            self.answer = self.client.push_shard(
                self.model, self.step, len(results), len(results) + 1, {METADATA_TENSOR: blob},
                metrics=self.metrics, tags=self.tags, encoded=self.encoded)
        except CkptdError as error:
            refused = error  # or committed with its answer lost: asked below
        if "version" not in (self.answer or {}):
            # Waits for a commit in progress and answers the committed version; fails, saying
            # what is missing, when the upload is not complete.
            try:
                self.answer = self.client.commit_shards(self.model, self.step)
            except CkptdError:
                if refused is not None:
                    raise refused
                raise
        if "version" not in (self.answer or {}):
            raise CkptdError(500, "NOT_COMMITTED",
                             f"{self.model}@{self.step}: the last shard was stored but the "
                             f"version was not committed: {self.answer}")


class Reader(StorageReader):
    """Loads a DCP checkpoint from `version` of `model` (an int, "latest" or "tag:NAME"; every
    rank must resolve it to the same version: a version committed while ranks start loading
    "latest" makes the load fail, saying so). The items DCP plans for one of this rank's
    tensors are read as one box (the part of the global tensor the rank holds); `bytes_read`
    counts the body bytes received. `encoded` (default: the Client's): boxes are received as
    the stored records of their chunks and decoded here. Asking for an item a retention rule
    dropped from the version fails, naming it; the others load."""

    def __init__(self, client, model, version="latest", encoded=None):
        self.client, self.model, self.version = client, model, version
        self.encoded = encoded
        self.resolved = None
        self.metadata = None
        self.dropped = set()  # stored names retention's tensor rules dropped from the version
        self.bytes_read = 0

    def read_metadata(self):
        received = self.client.part_bytes_received
        self.resolved = self.client.resolve_version(self.model, self.version)
        try:
            tensors, _ = self.client.pull_with_metadata(self.model, self.resolved,
                                                        tensors=[METADATA_TENSOR],
                                                        encoded=self.encoded)
        except CkptdError as error:
            if error.status != 400:  # no tensor matches
                raise
            tensors = {}
        if METADATA_TENSOR not in tensors:
            raise CkptdError(404, "NOT_FOUND", f"{self.model}@{self.resolved} was not saved "
                                               "by ckptd.dcp.Writer (it has no DCP metadata)")
        metadata = pickle.loads(tensors[METADATA_TENSOR].numpy().tobytes())
        self.dropped = set()
        if any(r.get("version") == self.resolved and r.get("dropped_tensors")
               for r in self.client.versions(self.model)):
            detail = self.client.version_detail(self.model, self.resolved)
            self.dropped = {t["name"] for t in detail["tensors"] if t.get("dropped")}
        self.metadata = metadata
        self.bytes_read += self.client.part_bytes_received - received
        return self.metadata

    # torch 1.13
    def init(self, metadata, is_coordinator):
        self.metadata = metadata

    # torch >= 2.0 (untested here)
    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            if not self.validate_checkpoint_id(checkpoint_id):
                raise ValueError(f"checkpoint_id {checkpoint_id!r}: ckptd.dcp.Reader loads a "
                                 "version number, 'latest' or 'tag:NAME'")
            self.version = checkpoint_id
        self.resolved, self.metadata, self.dropped, self.bytes_read = None, None, set(), 0

    def set_up_storage_reader(self, metadata, is_coordinator):
        self.init(metadata, is_coordinator)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return Writer.validate_checkpoint_id(checkpoint_id) or checkpoint_id == "latest" or \
            (isinstance(checkpoint_id, str) and checkpoint_id.startswith("tag:"))

    def prepare_local_plan(self, plan):
        return dataclasses.replace(plan, storage_data=self.resolved)

    def prepare_global_plan(self, plans):
        versions = sorted({p.storage_data for p in plans})
        if len(versions) > 1:
            raise CkptdError(409, "VERSION_MOVED",
                             f"ranks resolved {self.version!r} of {self.model!r} to different "
                             f"versions {versions}: a version was committed while they started "
                             "loading; load a version number")
        return plans

    def _stored(self, index):
        """(name, bytes) of the stored item `index` names, as the Writer recorded them."""
        entry = self.metadata.storage_data[index]
        return entry["name"], entry["bytes"]

    def _box(self, name, offsets, shape):
        if name in self.dropped:
            raise CkptdError(404, "NOT_FOUND",
                             f"{self.model}@{self.resolved} no longer holds {name!r}: retention's "
                             "tensor rules dropped it; load a version that keeps it, or leave it "
                             "out of the state dict")
        return self.client.pull_box(self.model, name, offsets, shape, version=self.resolved,
                                    encoded=self.encoded)

    def read_data(self, plan, planner):
        received = self.client.part_bytes_received
        # Tensor items by the stored tensor and the destination they fill: one box each, the
        # union of the items' boxes in global coordinates.
        groups = {}
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                name, size = self._stored(item.storage_index)
                blob = self._box(name, [0], [size]).numpy().tobytes()
                planner.load_bytes(item, io.BytesIO(blob))
                continue
            name, _ = self._stored(item.storage_index)
            base = list(item.storage_index.offset or [0] * len(item.lengths))
            start = [b + o for b, o in zip(base, item.storage_offsets)]
            key = (name, item.dest_index.fqn, tuple(item.dest_index.offset or ()))
            groups.setdefault(key, []).append((item, start))
        for (name, _, _), items in groups.items():
            low = [min(start[d] for _, start in items) for d in range(len(items[0][1]))]
            high = [max(start[d] + item.lengths[d] for item, start in items)
                    for d in range(len(low))]
            box = self._box(name, low, [h - lo for h, lo in zip(high, low)])
            for item, start in items:
                part = box
                for d, (s, n) in enumerate(zip(start, item.lengths)):
                    part = part.narrow(d, s - low[d], n)
                target = planner.resolve_tensor(item).detach()
                if tuple(part.shape) != tuple(target.shape):
                    raise CkptdError(400, "INVALID_ARGUMENT",
                                     f"{self.model}@{self.resolved}: {name!r} box of shape "
                                     f"{tuple(part.shape)} for a destination of "
                                     f"{tuple(target.shape)}")
                target.copy_(part)
                planner.commit_tensor(item, target)
        self.bytes_read += self.client.part_bytes_received - received
        return _done(None)
