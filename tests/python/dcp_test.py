#!/usr/bin/python3
"""ckptd as a storage of PyTorch Distributed Checkpoint (client-lib/python/ckptd/dcp.py), with
torch's own save and load on gloo processes against the real daemon.

4 ranks build ShardedTensor state (ChunkShardingSpec over the 4, rows and columns) for a small
model's weights and Adam moments, replicated tensors and non-tensor items, and save it with
ckptd.dcp.Writer (lossless and lossy models) and with DCP's FileSystemWriter; 2 ranks with
another sharding load each. Lossless loads equal FileSystemReader's bit for bit, lossy ones are
within the bound, non-tensor items come back equal, and each rank receives about its share;
ranks that code their shards store the same; a save whose rank is SIGKILLed leaves no version,
and the same step saved again by 2 ranks commits; names that read as glob or list syntax, 0-dim
tensors, and items retention dropped (named when asked for) load as they should.

Usage: dcp_test.py --ckptd PATH. Exits 77 (skipped) when torch is not importable."""
import argparse
import json
import os
import socket
import sys
import tempfile
import unittest
import zlib

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_PACKAGE = os.path.join(HERE, "..", "..", "client-lib", "python")
sys.path.insert(0, os.environ.get("CKPT_PYTHON_PACKAGE_DIR") or SOURCE_PACKAGE)
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("skipped: torch is not importable by", sys.executable, "(Debian: python3-torch)")
    sys.exit(77)

import ckptd  # noqa: E402
import ckptd.dcp  # noqa: E402
from ckptd import torch_compat  # noqa: E402
import client_test  # noqa: E402  (its Daemon)

BOUND = 1e-3
LOSSY_POLICY = {"mode": "lossy", "max_abs_error": BOUND, "lossless_tensors": []}
# name: (global shape, sharded along) — None: a plain tensor every rank holds (written once).
LAYOUT = {
    "model.embed.weight": ((512, 64), 0),
    "model.proj.weight": ((64, 200), 1),
    "model.proj.bias": ((200,), None),
    "optim.state.model.embed.weight.exp_avg": ((512, 64), 0),
    "optim.state.model.embed.weight.exp_avg_sq": ((512, 64), 0),
    "optim.state.model.proj.weight.exp_avg": ((64, 200), 1),
    "optim.state.step": ((), None),  # a 0-dim tensor
    "model.w[0],x?": ((16, 8), 0),  # a name with what globs and lists read as syntax
}
# Chunks small enough that each rank's rows hold several: those its shard codes itself.
DAEMON_CONFIG = "[storage]\nchunk_bytes = 4096\n"
EXTRAS = {"step": 1200, "scheduler": {"last_epoch": 11, "lr": [3e-4]}, "rng[*],state": "warm"}


def global_tensor(name, version):
    """Tensor `name` at `version`: each version a small step from the one before."""
    shape, _ = LAYOUT[name]
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    values = torch.randn(shape, generator=g) * 0.02
    for _ in range(1, version):
        values += torch.randn(shape, generator=g) * 1e-5
    if name.endswith("exp_avg_sq"):
        values = values.abs()
    return values


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sharded_state(rank, world_size, version, along_columns_too=True):
    """The state dict a rank holds: ShardedTensors over `world_size` ranks, plain tensors,
    non-tensor items."""
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    import torch.distributed._shard.sharded_tensor as st
    state = {}
    for name, (shape, dim) in LAYOUT.items():
        full = global_tensor(name, version)
        if dim is None:
            state[name] = full.clone()
            continue
        if not along_columns_too:
            dim = 0
        spec = ChunkShardingSpec(dim=dim,
                                 placements=[f"rank:{r}/cpu" for r in range(world_size)])
        tensor = st.empty(spec, *shape)
        for shard in tensor.local_shards():
            part = full
            for d, (o, n) in enumerate(zip(shard.metadata.shard_offsets,
                                           shard.metadata.shard_sizes)):
                part = part.narrow(d, o, n)
            shard.tensor.copy_(part)
        state[name] = tensor
    state.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in EXTRAS.items()})
    return state


def empty_like_state(rank, world_size):
    """A state dict of another sharding to load into (zeros; non-tensor items blank)."""
    state = sharded_state(rank, world_size, version=0, along_columns_too=False)
    for name, value in state.items():
        if hasattr(value, "local_shards"):
            for shard in value.local_shards():
                shard.tensor.zero_()
        elif isinstance(value, torch.Tensor):
            value.zero_()
        else:
            state[name] = None
    return state


def local_parts(state):
    """{(name, offsets): tensor} of what a rank holds."""
    parts = {}
    for name, value in state.items():
        if hasattr(value, "local_shards"):
            for shard in value.local_shards():
                parts[(name, tuple(shard.metadata.shard_offsets))] = shard.tensor.clone()
        elif isinstance(value, torch.Tensor):
            parts[(name, ())] = value.clone()
    return parts


def init_group(rank, world_size, port):
    import torch.distributed as dist
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def save_rank(rank, world_size, port, url, work):
    init_group(rank, world_size, port)
    dcp = ckptd.dcp.checkpoint_module()
    client = ckptd.Client(url)
    state = sharded_state(rank, world_size, version=1)
    dcp.save_state_dict(state, storage_writer=ckptd.dcp.Writer(client, "lossless", 1))
    dcp.save_state_dict(state, storage_writer=ckptd.dcp.Writer(client, "lossy", 1))
    dcp.save_state_dict(state, storage_writer=dcp.FileSystemWriter(os.path.join(work, "fs")))
    # A second version of the lossless model: a delta against the first.
    state = sharded_state(rank, world_size, version=2)
    writer = ckptd.dcp.Writer(client, "lossless", 2, metrics={"loss": 1.5}, tags=["last"])
    dcp.save_state_dict(state, storage_writer=writer)
    if rank == 0:
        with open(os.path.join(work, "committed.json"), "w") as f:
            json.dump(writer.answer, f)
    if ckptd.edge.available():
        # Every rank codes its own shard, the second version against its part of the first.
        coder = ckptd.Client(url, encoded=True,
                             reference_dir=os.path.join(work, f"references-{rank}"))
        for version in (1, 2):
            state = sharded_state(rank, world_size, version)
            writer = ckptd.dcp.Writer(coder, "encoded", version)
            dcp.save_state_dict(state, storage_writer=writer)
        with open(os.path.join(work, f"encoded-shard-{rank}.json"), "w") as f:
            json.dump(writer.shard_answer, f)


class DyingWriter(ckptd.dcp.Writer):
    """A Writer whose rank 2 is SIGKILLed instead of writing its shard, once the other ranks'
    shards are stored."""

    def write_data(self, plan, planner):
        if self.rank == 2:
            import signal
            import time
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if set(self.client.upload(self.model, self.step)["received"]) >= {0, 1, 3}:
                        break
                except ckptd.CkptdError:
                    pass  # no shard stored yet
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write_data(plan, planner)


def save_rank_killed(rank, world_size, port, url, work):
    init_group(rank, world_size, port)
    dcp = ckptd.dcp.checkpoint_module()
    state = sharded_state(rank, world_size, version=3)
    dcp.save_state_dict(state, storage_writer=DyingWriter(ckptd.Client(url), "lossless", 3))


def save_rank_again(rank, world_size, port, url, work):
    """Version 3 saved again, by 2 ranks: the dead save's shards (of 5) must not be in the way."""
    init_group(rank, world_size, port)
    dcp = ckptd.dcp.checkpoint_module()
    state = sharded_state(rank, world_size, version=3)
    dcp.save_state_dict(state, storage_writer=ckptd.dcp.Writer(ckptd.Client(url), "lossless", 3))


def load_rank(rank, world_size, port, url, work):
    init_group(rank, world_size, port)
    dcp = ckptd.dcp.checkpoint_module()
    client = ckptd.Client(url)
    results = {}
    readers = [("fs", dcp.FileSystemReader(os.path.join(work, "fs"))),
               ("lossless", ckptd.dcp.Reader(client, "lossless", 1)),
               ("lossless_latest", ckptd.dcp.Reader(client, "lossless")),
               ("lossless_2", ckptd.dcp.Reader(client, "lossless", 2)),
               ("lossy", ckptd.dcp.Reader(client, "lossy"))]
    if ckptd.edge.available():
        readers.append(("encoded", ckptd.dcp.Reader(client, "encoded", encoded=True)))
    for label, reader in readers:
        state = empty_like_state(rank, world_size)
        dcp.load_state_dict(state, storage_reader=reader)
        share = sum(t.numel() * t.element_size() for t in local_parts(state).values())
        results[label] = {
            "parts": {f"{n}@{list(o)}": t.tolist() for (n, o), t in local_parts(state).items()},
            "extras": {k: state[k] for k in EXTRAS},
            "bytes_read": getattr(reader, "bytes_read", None),
            "share": share,
        }
    with open(os.path.join(work, f"load-{rank}.json"), "w") as f:
        json.dump(results, f)


def spawn(fn, world_size, *args):
    import torch.multiprocessing as mp
    mp.spawn(fn, args=(world_size, free_port(), *args), nprocs=world_size, join=True)


class DcpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="ckptd-dcp-test-")
        cls.work = cls.tmp.name
        cls.addClassCleanup(cls.tmp.cleanup)
        cls.daemon = client_test.Daemon(cls.work, DAEMON_CONFIG)
        cls.addClassCleanup(cls.daemon.stop)
        cls.url = f"http://127.0.0.1:{cls.daemon.port}"
        client = ckptd.Client(cls.url)
        client.set_policy("lossy", LOSSY_POLICY)
        spawn(save_rank, 4, cls.url, cls.work)
        # A save of version 3 whose rank 2 dies: the other ranks' shards are stored, the version
        # never appears (spawn stops the survivors once it sees the death).
        import torch.multiprocessing as mp
        try:
            spawn(save_rank_killed, 4, cls.url, cls.work)
        except mp.ProcessExitedException:
            pass
        cls.killed_upload = client.upload("lossless", 3)
        cls.latest_after_kill = client.latest_version("lossless")
        spawn(save_rank_again, 2, cls.url, cls.work)
        spawn(load_rank, 2, cls.url, cls.work)
        cls.loads = []  # per rank: what load_rank saw
        for rank in range(2):
            with open(os.path.join(cls.work, f"load-{rank}.json")) as f:
                cls.loads.append(json.load(f))

    def test_lossless_load_equals_dcps_own_file_storage_bit_for_bit(self):
        for rank, load in enumerate(self.loads):
            fs, ours = load["fs"]["parts"], load["lossless"]["parts"]
            # Each rank holds its rows of every sharded tensor (resharded by rows for 2) and
            # every plain tensor whole.
            expected = {f"{name}@{[rank * shape[0] // 2] + [0] * (len(shape) - 1)}"
                        if dim is not None else f"{name}@[]"
                        for name, (shape, dim) in LAYOUT.items()}
            self.assertEqual(set(ours), expected)
            for key in fs:
                got = torch.tensor(ours[key]).view(torch.int32)
                want = torch.tensor(fs[key]).view(torch.int32)
                self.assertTrue(torch.equal(got, want), f"rank {rank} {key}")
            self.assertEqual(load["lossless"]["extras"], EXTRAS)

    def assert_parts_are(self, parts, version):
        """Every part a rank loaded equals that part of `version` as saved, bit for bit."""
        for key, values in parts.items():
            name, offsets = key.split("@")[0], json.loads(key.split("@")[1])
            want = global_tensor(name, version)
            got = torch.tensor(values)
            for d, o in enumerate(offsets):
                want = want.narrow(d, o, got.shape[d])
            self.assertTrue(torch.equal(got.view(torch.int32), want.view(torch.int32)), key)

    def test_each_version_loads_as_saved_and_latest_is_the_newest(self):
        # "latest" is version 3, saved again after a save of it died.
        for load in self.loads:
            self.assert_parts_are(load["lossless_latest"]["parts"], 3)
        client = ckptd.Client(self.url)
        record = client.versions("lossless")[-2]
        self.assertEqual(record["version"], 2)
        self.assertEqual(record["tags"], ["last"])
        self.assertEqual(record["metrics"], {"loss": 1.5})
        with open(os.path.join(self.work, "committed.json")) as f:
            self.assertEqual(json.load(f)["version"]["version"], 2)

    def test_ranks_that_code_their_shards_store_and_load_the_same(self):
        if not ckptd.edge.available():
            if os.environ.get("CKPT_EXPECT_PYTHON_NATIVE") == "1":
                self.fail("the build has the native codec module, yet ckptd.edge cannot load it")
            self.skipTest("no native codec module")
        for load in self.loads:
            self.assertEqual(set(load["encoded"]["parts"]), set(load["lossless"]["parts"]))
            self.assert_parts_are(load["encoded"]["parts"], 2)
            self.assertEqual(load["encoded"]["extras"], EXTRAS)
        for rank in range(4):
            with open(os.path.join(self.work, f"encoded-shard-{rank}.json")) as f:
                answer = json.load(f)
            self.assertTrue(answer["encoded"], answer)
            self.assertEqual(answer["reference"], "held", answer)
            # Each rank's rows of the row-sharded tensors go as deltas against its part of the
            # first version (the column slices, raw for the daemon to code).
            raw_share = 3 * (512 // 4) * 64 * 4 + 2 * 64 * (200 // 4) * 4 + (16 // 4) * 8 * 4
            self.assertLess(answer["sent_bytes"], 0.85 * raw_share, answer)

    def test_a_save_whose_rank_died_leaves_no_version_and_is_replaced_by_the_next(self):
        upload = self.killed_upload
        self.assertFalse(upload["committed"])
        self.assertEqual(sorted(upload["received"]), [0, 1, 3])
        self.assertIn(2, upload["missing"])
        self.assertIn(4, upload["missing"])  # the coordinator's metadata: finish never ran
        self.assertEqual(self.latest_after_kill, 2)
        for load in self.loads:  # the version before it, as saved
            self.assert_parts_are(load["lossless_2"]["parts"], 2)
            self.assertEqual(load["lossless_2"]["extras"], EXTRAS)
        # Saved again by 2 ranks (3 shards), whose coordinator dropped the dead save's upload.
        client = ckptd.Client(self.url)
        self.assertEqual(client.latest_version("lossless"), 3)
        self.assertEqual(client.layout("lossless", 3)["shards"], 3)

    def test_lossy_load_is_within_the_bound_and_non_tensor_items_are_exact(self):
        for load in self.loads:
            fs, ours = load["fs"]["parts"], load["lossy"]["parts"]
            for key in fs:
                error = (torch.tensor(ours[key]) - torch.tensor(fs[key])).abs().max().item()
                self.assertLessEqual(error, BOUND * (1 + 1e-6), key)
            self.assertEqual(load["lossy"]["extras"], EXTRAS)

    def test_each_rank_receives_about_its_share(self):
        # Body bytes received: the rank's share (one box per tensor, whatever slices the save
        # cut it into), the metadata, the non-tensor items and a header per box.
        labels = ["lossless", "lossy"] + (["encoded"] if "encoded" in self.loads[0] else [])
        for rank, load in enumerate(self.loads):
            for label in labels:
                read, share = load[label]["bytes_read"], load[label]["share"]
                if label != "encoded":  # coded records may be smaller than the floats
                    self.assertGreaterEqual(read, share, f"rank {rank} {label}")
                self.assertLessEqual(read, share * 1.10 + 16384, f"rank {rank} {label}")

    def test_a_version_holds_the_global_tensors_and_the_metadata(self):
        client = ckptd.Client(self.url)
        layout = {t["name"]: t for t in client.version_detail("lossless", 1)["tensors"]}
        for name, (shape, _) in LAYOUT.items():
            self.assertEqual(layout[name]["shape"], list(shape), name)
        self.assertIn(ckptd.dcp.METADATA_TENSOR, layout)
        self.assertIn(ckptd.dcp.BYTES_PREFIX + "step", layout)


class RetentionTest(unittest.TestCase):
    """A version whose optimizer state retention dropped loads its weights, and a load asking
    for the dropped state fails naming it (one process: DCP without a process group)."""

    def test_dropped_items_fail_by_name_and_the_rest_loads(self):
        with tempfile.TemporaryDirectory(prefix="ckptd-dcp-retention-") as work:
            daemon = client_test.Daemon(work, DAEMON_CONFIG)
            self.addCleanup(daemon.stop)
            client = ckptd.Client(f"http://127.0.0.1:{daemon.port}", progress=False)
            dcp = ckptd.dcp.checkpoint_module()
            for version in (1, 2):
                state = {name: global_tensor(name, version) for name in LAYOUT}
                dcp.save_state_dict(state, storage_writer=ckptd.dcp.Writer(
                    client, "kept", version, rank=0, world_size=1), no_dist=True)
            client.set_retention("kept", {"keep_last": 10, "tensor_rules": [
                {"tensors": ["optim.*"], "keep_last": 1}]}, allow_deletes=True)
            client.apply_retention("kept")
            weights = {"model.embed.weight": torch.zeros(512, 64)}
            dcp.load_state_dict(weights, storage_reader=ckptd.dcp.Reader(client, "kept", 1),
                                no_dist=True)
            self.assertTrue(torch.equal(weights["model.embed.weight"],
                                        global_tensor("model.embed.weight", 1)))
            moments = {"optim.state.model.embed.weight.exp_avg": torch.zeros(512, 64)}
            with self.assertRaises(dcp.CheckpointException) as refused:
                dcp.load_state_dict(moments, storage_reader=ckptd.dcp.Reader(client, "kept", 1),
                                    no_dist=True)
            self.assertIn("retention", str(refused.exception))
            self.assertIn("optim.state.model.embed.weight.exp_avg", str(refused.exception))


class Torch2InterfaceTest(unittest.TestCase):
    """What torch >= 2.0 calls beside the 1.13 interface, checked without torch 2 (which cannot
    run here): checkpoint ids and resets."""

    def test_checkpoint_ids_are_versions(self):
        self.assertTrue(ckptd.dcp.Writer.validate_checkpoint_id(1200))
        self.assertTrue(ckptd.dcp.Writer.validate_checkpoint_id("1200"))
        self.assertFalse(ckptd.dcp.Writer.validate_checkpoint_id("/checkpoints/step-1200"))
        self.assertFalse(ckptd.dcp.Writer.validate_checkpoint_id("latest"))
        for good in (7, "latest", "tag:best"):
            self.assertTrue(ckptd.dcp.Reader.validate_checkpoint_id(good), good)
        self.assertFalse(ckptd.dcp.Reader.validate_checkpoint_id("s3://bucket/step"))

    def test_reset_moves_to_the_new_checkpoint_and_forgets_the_last(self):
        writer = ckptd.dcp.Writer(None, "m", 1)
        writer.answer, writer.shard_bytes = {"version": {}}, 10
        writer.reset(2)
        self.assertEqual((writer.step, writer.answer, writer.shard_bytes), (2, None, 0))
        writer.reset()
        self.assertEqual(writer.step, 2)
        with self.assertRaises(ValueError):
            writer.reset("/checkpoints/step-3")
        reader = ckptd.dcp.Reader(None, "m", 1)
        reader.resolved, reader.bytes_read = 1, 99
        reader.reset("tag:best")
        self.assertEqual((reader.version, reader.resolved, reader.bytes_read),
                         ("tag:best", None, 0))
        with self.assertRaises(ValueError):
            reader.reset("s3://bucket/step")
        self.assertIsNone(writer.storage_meta())


class ShimTest(unittest.TestCase):
    def test_applied_only_for_torch_below_2_on_python_3_11_or_later(self):
        self.assertTrue(torch_compat.shim_needed("1.13.1", (3, 11)))
        self.assertTrue(torch_compat.shim_needed("1.13.0a0+git", (3, 12)))
        self.assertFalse(torch_compat.shim_needed("1.13.1", (3, 10)))
        self.assertFalse(torch_compat.shim_needed("2.0.0", (3, 11)))
        self.assertFalse(torch_compat.shim_needed("2.3.1+cpu", (3, 12)))

    @unittest.skipIf(sys.version_info < (3, 11), "older Pythons take such defaults")
    def test_dataclasses_are_left_as_they_were_after_the_import(self):
        import dataclasses
        before = dataclasses._get_field
        torch_compat.import_distributed_checkpoint()
        self.assertIs(dataclasses._get_field, before)
        # Outside the import, an unhashable dataclass default is refused as Python says.
        @dataclasses.dataclass
        class Inner:
            x: int = 0
        with self.assertRaises(ValueError):
            @dataclasses.dataclass
            class Outer:  # noqa: F841
                inner: Inner = dataclasses.field(default=Inner())

    def test_within_the_shim_each_instance_gets_its_own_copy(self):
        import dataclasses

        @dataclasses.dataclass
        class Inner:
            x: int = 0
        with torch_compat.dataclass_instance_defaults():
            @dataclasses.dataclass
            class Outer:
                inner: Inner = dataclasses.field(default=Inner(x=3))
        a, b = Outer(), Outer()
        self.assertEqual(a.inner.x, 3)
        self.assertIsNot(a.inner, b.inner)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckptd", required=True, help="path of the ckptd binary")
    args, rest = parser.parse_known_args()
    client_test.CKPTD = os.path.abspath(args.ckptd)
    os.environ["CKPTD_BINARY_FOR_TESTS"] = client_test.CKPTD
    unittest.main(argv=[sys.argv[0]] + rest)
