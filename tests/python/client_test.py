#!/usr/bin/python3
"""End-to-end test of the Python client (client-lib/python) against the real ckptd.

Usage: client_test.py --ckptd PATH. Exits 77 (skipped) when torch is not importable, so that
CTest reports a skip with the reason instead of a failure."""
import argparse
import hashlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
# The package as the build assembles it (its sources and the native codec module), else the
# sources alone.
SOURCE_PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "client-lib", "python")
sys.path.insert(0, os.environ.get("CKPT_PYTHON_PACKAGE_DIR") or SOURCE_PACKAGE)

try:
    import torch
except ImportError:
    print("skipped: torch is not importable by", sys.executable, "(Debian: python3-torch)")
    sys.exit(77)
import numpy as np

import ckptd  # noqa: E402

CKPTD = None


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


class Daemon:
    def __init__(self, work, config=None):
        self.work = work
        ready = os.path.join(work, "ready")
        self.log = open(os.path.join(work, "ckptd.log"), "wb")
        extra = []
        if config is not None:
            path = os.path.join(work, "ckptd.toml")
            with open(path, "w") as f:
                f.write(config)
            extra = ["--config", path]
        self.proc = subprocess.Popen(
            [CKPTD, *extra, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, "data"),
             "--ready-file", ready, "--log-level", "warn"], stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(ready) and read(ready).strip():
                self.port = int(read(ready))
                return
            if self.proc.poll() is not None:
                raise RuntimeError("ckptd exited: " + read(self.log.name))
            time.sleep(0.01)
        raise RuntimeError("ckptd did not become ready")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


class AnswerLosingProxy:
    """A loopback proxy in front of the daemon that forwards the first `lose` requests whole but
    closes their connections when the answer starts, unsent: a push that committed while its
    client saw the connection break."""

    def __init__(self, port, lose=1):
        import threading
        self.port_to, self.lose = port, lose
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.lost = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        import threading
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            drop = self.lost < self.lose
            if drop:
                self.lost += 1
            threading.Thread(target=self._pump, args=(client, drop), daemon=True).start()

    def _pump(self, client, drop):
        import selectors
        server = socket.create_connection(("127.0.0.1", self.port_to))
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, server)
        sel.register(server, selectors.EVENT_READ, client)
        try:
            while True:
                for key, _ in sel.select(timeout=30):
                    data = key.fileobj.recv(1 << 16)
                    if not data or (drop and key.fileobj is server):
                        return
                    key.data.sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            server.close()

    def close(self):
        self.listener.close()


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.daemon = Daemon(self.tmp.name)
        self.client = ckptd.Client(f"http://127.0.0.1:{self.daemon.port}", progress=False)

    def tearDown(self):
        self.daemon.stop()
        self.tmp.cleanup()

    def state_dict(self, seed):
        g = torch.Generator().manual_seed(seed)
        return {
            "layer.weight": torch.randn(64, 32, generator=g),
            "layer.bias": torch.randn(64, generator=g),
            "half": torch.randn(8, 8, generator=g).half(),
            "brain": torch.randn(16, generator=g).bfloat16(),
            "steps": torch.tensor(1234, dtype=torch.int64),
            "mask": torch.rand(5, generator=g) > 0.5,
            "empty": torch.zeros(0, 3),
        }

    def assert_equal_dicts(self, a, b):
        self.assertEqual(list(a), list(b))
        for name in a:
            self.assertEqual(a[name].dtype, b[name].dtype, name)
            self.assertEqual(tuple(a[name].shape), tuple(b[name].shape), name)
            self.assertTrue(torch.equal(a[name], b[name]), name)

    def test_push_state_dict_and_pull_it_back_equal(self):
        first, second = self.state_dict(1), self.state_dict(2)
        answer = self.client.push("run1", 100, first, metadata={"epoch": 3},
                                  metrics={"loss": 1.5}, tags=["start"])
        self.assertEqual(answer["version"], 100)
        self.client.push("run1", 200, second)
        self.assert_equal_dicts(self.client.pull("run1"), second)
        self.assert_equal_dicts(self.client.pull("run1", 100), first)
        self.assert_equal_dicts(self.client.pull("run1", "tag:start"), first)
        _, metadata = self.client.pull_with_metadata("run1", 100)
        self.assertEqual(metadata.get("epoch"), "3")
        self.assertEqual([v["version"] for v in self.client.versions("run1")], [100, 200])
        self.assertEqual([m["name"] for m in self.client.list_models()], ["run1"])
        # numpy without torch tensors
        arrays = self.client.pull("run1", as_torch=False)
        self.assertIsInstance(arrays["layer.weight"], np.ndarray)
        np.testing.assert_array_equal(arrays["layer.weight"], second["layer.weight"].numpy())

    def test_push_a_file_and_pull_to_a_file(self):
        path = os.path.join(self.tmp.name, "a.safetensors")
        prefix, views, total = ckptd.safetensors_layout(self.state_dict(3))
        with open(path, "wb") as out:
            out.write(prefix)
            for view in views:
                out.write(view)
        self.assertEqual(os.path.getsize(path), total)
        self.client.push("files", 1, path)
        restored = os.path.join(self.tmp.name, "b.safetensors")
        self.assertEqual(self.client.pull_to_file("files", restored), total)
        self.assertEqual(read(path, "rb"), read(restored, "rb"))

    def test_lossy_policy_retention_tags_and_errors(self):
        self.client.set_policy("lossy", {"mode": "lossy", "max_abs_error": 1e-3})
        weights = {"w": torch.randn(256, 256)}
        self.client.push("lossy", 1, weights)
        back = self.client.pull("lossy")
        self.assertLessEqual(float((back["w"] - weights["w"]).abs().max()), 1e-3)
        self.client.push("lossy", 2, weights)
        self.client.tag("lossy", 1, "keep")
        self.client.set_retention("lossy", {"keep_last": 1})
        with self.assertRaises(ckptd.CkptdError) as missing:
            self.client.pull("lossy", 99)
        self.assertEqual(missing.exception.status, 404)
        self.assertEqual(missing.exception.code, "NOT_FOUND")
        with self.assertRaises(ckptd.CkptdError) as stale:
            self.client.push("lossy", 2, weights)
        self.assertEqual(stale.exception.status, 409)
        with self.assertRaises(ValueError):
            ckptd.Client("ftp://x:1")
        with self.assertRaises(ValueError):
            ckptd.Client("http://a:1,https://b:2")

    @staticmethod
    def train(model, optimizer, steps, seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x, y = torch.randn(32, 64, generator=g), torch.randint(0, 8, (32,), generator=g)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

    @staticmethod
    def model_and_adam(seed):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 8))
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    def test_training_state_resumes_bit_identically(self):
        model, adam = self.model_and_adam(0)
        self.train(model, adam, 5, seed=1)
        adam.param_groups[0]["lr"] = 4e-3  # as a scheduler would
        tensors, metadata = ckptd.training_state(model, adam, step=5)
        self.assertIn("optim.0.weight.exp_avg", tensors)
        self.assertIn("optim.2.bias.exp_avg_sq", tensors)
        self.client.push("train", 5, tensors, metadata=metadata)

        restored, restored_adam = self.model_and_adam(1)  # other weights, no Adam state
        tensors, metadata = self.client.pull_with_metadata("train")
        self.assertEqual(ckptd.load_training_state(restored, restored_adam, tensors, metadata), 5)
        self.assertEqual(restored_adam.param_groups[0]["lr"], 4e-3)
        self.assertEqual(restored_adam.param_groups[0]["betas"], (0.9, 0.999))
        # Both runs go on from step 5 on the same batches: a resumed run is the same run.
        self.train(model, adam, 3, seed=2)
        self.train(restored, restored_adam, 3, seed=2)
        for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
            self.assertTrue(torch.equal(a, b), name)

    def test_training_state_keeps_state_held_as_python_numbers(self):
        # Rprop keeps its step as a Python int: it travels in the metadata and comes back an int.
        torch.manual_seed(0)
        model = torch.nn.Linear(64, 8)
        rprop = torch.optim.Rprop(model.parameters())
        self.train(model, rprop, 3, seed=1)
        tensors, metadata = ckptd.training_state(model, rprop, step=3)
        self.client.push("rprop", 3, tensors, metadata=metadata)
        torch.manual_seed(1)
        restored = torch.nn.Linear(64, 8)
        restored_rprop = torch.optim.Rprop(restored.parameters())
        tensors, metadata = self.client.pull_with_metadata("rprop")
        ckptd.load_training_state(restored, restored_rprop, tensors, metadata)
        self.assertEqual(restored_rprop.state[restored.weight]["step"], 3)
        self.assertIsInstance(restored_rprop.state[restored.weight]["step"], int)
        self.train(model, rprop, 2, seed=2)
        self.train(restored, restored_rprop, 2, seed=2)
        self.assertTrue(torch.equal(model.weight, restored.weight))
        lbfgs = torch.optim.LBFGS(model.parameters())
        lbfgs.step(lambda: model(torch.ones(1, 64)).sum().backward() or torch.tensor(0.0))
        with self.assertRaisesRegex(ValueError, "only tensors and numbers"):
            ckptd.training_state(model, lbfgs)

    def test_training_state_refuses_what_does_not_fit(self):
        model, adam = self.model_and_adam(0)
        self.train(model, adam, 1, seed=1)
        stranger = torch.nn.Linear(3, 3)
        with self.assertRaisesRegex(ValueError, "not in the model"):
            ckptd.training_state(model, torch.optim.Adam([*model.parameters(),
                                                          stranger.weight]))
        tensors, metadata = ckptd.training_state(model, adam, step=1)
        target, _ = self.model_and_adam(1)
        before = {k: v.clone() for k, v in target.state_dict().items()}
        partial = torch.optim.Adam(target[0].parameters())  # not the last layer
        with self.assertRaisesRegex(ValueError, "does not optimize"):
            ckptd.load_training_state(target, partial, tensors, metadata)
        two_groups = torch.optim.Adam([{"params": target[0].parameters()},
                                       {"params": target[2].parameters()}])
        with self.assertRaisesRegex(ValueError, "param groups"):
            ckptd.load_training_state(target, two_groups, tensors, metadata)
        extra = dict(tensors, **{"optim.9.weight.exp_avg": torch.zeros(1)})
        with self.assertRaisesRegex(ValueError, "no parameter"):
            ckptd.load_training_state(target, torch.optim.Adam(target.parameters()), extra,
                                      metadata)
        for key, value in target.state_dict().items():  # nothing was loaded
            self.assertTrue(torch.equal(value, before[key]), key)
        self.assertEqual(len(partial.state), 0)

    def test_recommended_lossy_policy_for_adam_moments(self):
        # README's policy: the globs match training_state's names; each moment meets its
        # pointwise bound, the weights theirs.
        self.client.set_policy("adam", {
            "mode": "lossy", "max_abs_error": 5e-3,
            "overrides": [{"tensors": "optim.*.exp_avg", "max_pointwise_rel_error": 0.25},
                          {"tensors": "optim.*.exp_avg_sq", "max_pointwise_rel_error": 0.05}]})
        model, adam = self.model_and_adam(0)
        self.train(model, adam, 4, seed=1)
        tensors, metadata = ckptd.training_state(model, adam, step=4)
        self.client.push("adam", 4, tensors, metadata=metadata)
        back = self.client.pull("adam")
        for key, eps in (("exp_avg", 0.25), ("exp_avg_sq", 0.05)):
            name = f"optim.0.weight.{key}"
            pushed, restored = tensors[name], back[name]
            self.assertFalse(torch.equal(pushed, restored), name + " was not quantized")
            self.assertTrue(bool(((pushed - restored).abs() <= eps * pushed.abs()).all()), name)
        self.assertLessEqual(float((back["model.0.weight"] - tensors["model.0.weight"])
                                   .abs().max()), 5e-3)
        self.assertTrue(torch.equal(back["model.0.bias"], tensors["model.0.bias"]))
        self.assertTrue(torch.equal(back["optim.0.weight.step"], tensors["optim.0.weight.step"]))

    def test_shards_pushed_by_ranks_in_parallel_restore_resharded(self):
        import concurrent.futures
        g = torch.Generator().manual_seed(3)
        w = torch.randn(12, 8, generator=g)     # split by rows over 4 ranks
        o = torch.randn(8, 12, generator=g)     # split by columns
        bias = torch.randn(8, generator=g)      # replicated
        url = f"http://127.0.0.1:{self.daemon.port}"

        def push(rank):
            client = ckptd.Client(url, progress=False)  # one per thread
            rows, cols = slice(3 * rank, 3 * rank + 3), slice(3 * rank, 3 * rank + 3)
            return client.push_shard(
                "tp", 100, rank, 4,
                {"w": w[rows].contiguous(), "o": o[:, cols].contiguous(), "bias": bias},
                slices={"w": {"global_shape": [12, 8], "offsets": [3 * rank, 0]},
                        "o": {"global_shape": [8, 12], "offsets": [0, 3 * rank]}})

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(push, range(4)))
        committed = [a for a in answers if "version" in a]
        self.assertEqual(len(committed), 1)
        self.assertEqual(committed[0]["version"]["version"], 100)
        whole = self.client.pull("tp", 100)
        self.assertTrue(torch.equal(whole["w"], w))
        self.assertTrue(torch.equal(whole["o"], o))
        for rank in range(2):
            part, slices = self.client.pull_shard("tp", rank, 2)
            self.assertTrue(torch.equal(part["w"], w[6 * rank:6 * rank + 6]))
            self.assertTrue(torch.equal(part["o"], o[:, 6 * rank:6 * rank + 6]))
            self.assertTrue(torch.equal(part["bias"], bias))
            self.assertEqual(slices["w"], {"global_shape": [12, 8], "offsets": [6 * rank, 0]})
            self.assertNotIn("bias", slices)
        only = self.client.pull("tp", tensors=["b*"])
        self.assertEqual(list(only), ["bias"])
        layout = self.client.layout("tp", 100)
        self.assertEqual(layout["shards"], 4)
        self.assertEqual(len(layout["tensors"]["bias"]["slices"]), 4)

        # An incomplete upload is invisible, can be inspected and aborted.
        self.client.push_shard("tp", 200, 0, 2, {"bias": bias})
        state = self.client.upload("tp", 200)
        self.assertEqual(state["missing"], [1])
        self.assertEqual(self.client.versions("tp")[-1]["version"], 100)
        with self.assertRaises(ckptd.CkptdError) as refused:
            self.client.commit_shards("tp", 200)
        self.assertEqual(refused.exception.status, 409)
        self.client.abort_upload("tp", 200)
        with self.assertRaises(ckptd.CkptdError) as gone:
            self.client.upload("tp", 200)
        self.assertEqual(gone.exception.status, 404)

    def test_background_pushes_snapshot_the_tensors_and_bound_what_is_staged(self):
        w = torch.ones(256, 256)
        with self.client.background(max_staged_bytes=2 * w.nelement() * 4) as pusher:
            first = pusher.push("bg", 1, {"w": w})
            w.add_(1)  # training goes on: the push carries the values at the call
            second = pusher.push("bg", 2, {"w": w})
            self.assertLessEqual(pusher.staged_bytes, 2 * w.nelement() * 4)
            self.assertEqual(first.result(timeout=60)["version"], 1)
            self.assertEqual(second.result(timeout=60)["version"], 2)
        self.assertTrue(torch.equal(self.client.pull("bg", 1)["w"], torch.ones(256, 256)))
        self.assertTrue(torch.equal(self.client.pull("bg", 2)["w"], torch.full((256, 256), 2.0)))
        with self.client.background() as pusher:
            refused = pusher.push("bg", 2, {"w": w})  # not above the latest
            with self.assertRaises(ckptd.CkptdError):
                refused.result(timeout=60)

    def test_a_large_push_goes_as_shards_over_several_connections(self):
        g = torch.Generator().manual_seed(5)
        state = {"big": torch.randn(1000, 64, generator=g), "small": torch.randn(10, generator=g),
                 "mid": torch.randn(50, 64, generator=g)}
        answer = self.client.push_parallel("par", 7, state, connections=3)
        self.assertEqual(answer["version"]["version"], 7)
        self.assertEqual(self.client.layout("par", 7)["shards"], 3)
        back = self.client.pull("par", 7)
        for name, value in state.items():
            self.assertTrue(torch.equal(back[name], value), name)

    def test_fails_over_to_the_next_listed_server(self):
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]
        client = ckptd.Client(f"http://127.0.0.1:{dead},http://127.0.0.1:{self.daemon.port}",
                              progress=False)
        weights = {"w": torch.arange(1000, dtype=torch.float32)}
        client.push("failover", 1, weights)
        self.assertTrue(torch.equal(client.pull("failover")["w"], weights["w"]))
        nobody = ckptd.Client(f"http://127.0.0.1:{dead},http://127.0.0.1:{dead}", progress=False)
        with self.assertRaises(ConnectionError) as error:
            nobody.list_models()
        self.assertIn("cannot reach ckptd at http://127.0.0.1:", str(error.exception))

    def test_a_full_volume_is_a_507_with_reason_no_space(self):
        work = os.path.join(self.tmp.name, "full")
        os.makedirs(work)
        # A reserve larger than any volume: every push is refused, everything else works.
        full = Daemon(work, config="[storage]\nmin_free_bytes = 1125899906842624\n")
        try:
            client = ckptd.Client(f"http://127.0.0.1:{full.port}", progress=False)
            with self.assertRaises(ckptd.CkptdError) as error:
                client.push("run", 1, {"w": torch.zeros(16)})
            self.assertEqual(error.exception.status, 507)
            self.assertEqual(error.exception.code, "RESOURCE_EXHAUSTED")
            self.assertEqual(error.exception.reason, "NO_SPACE")
            self.assertIn("storage.min_free_bytes", error.exception.message)
            self.assertEqual(client.list_models(), [])
        finally:
            full.stop()

    def test_installs_offline_with_debians_pip(self):
        # As `make python-client` does: a venv seeing Debian's packages, the client built from
        # a copy of its sources, with the build's native module when it has one.
        venv = os.path.join(self.tmp.name, "venv")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                              "install-python-client.sh")
        package = os.environ.get("CKPT_PYTHON_PACKAGE_DIR")
        native = [os.path.join(package, "ckptd", name)
                  for name in os.listdir(os.path.join(package, "ckptd"))
                  if name.startswith("_native")] if package else []
        result = subprocess.run(["bash", script, venv, *native], capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        check = subprocess.run(
            [os.path.join(venv, "bin", "python"), "-c",
             "import ckptd, torch; print(ckptd.__file__, ckptd.edge.available())"],
            capture_output=True, text=True, cwd=self.tmp.name)
        self.assertEqual(check.returncode, 0, check.stderr)
        where, available = check.stdout.split()
        self.assertTrue(where.startswith(venv), where)
        self.assertEqual(available, str(bool(native)))


class EncodedTest(unittest.TestCase):
    """Pushes coded by the client and pulls decoded by it (client.push(encoded=True),
    pull_encoded): the wire carries about the stored bytes, and what is stored and restored is
    what the daemon's own coding stores and restores."""

    def setUp(self):
        if not ckptd.edge.available():
            if os.environ.get("CKPT_EXPECT_PYTHON_NATIVE") == "1":
                self.fail("the build has ckptd._native, but it does not import")
            self.skipTest("built without ckptd._native")
        self.tmp = tempfile.TemporaryDirectory()
        self.daemon = Daemon(self.tmp.name)
        self.url = f"http://127.0.0.1:{self.daemon.port}"
        self.plain = ckptd.Client(self.url, progress=False)

    def tearDown(self):
        self.daemon.stop()
        self.tmp.cleanup()

    def coder(self, name):
        return ckptd.Client(self.url, progress=False, encoded=True,
                            reference_dir=os.path.join(self.tmp.name, name))

    @staticmethod
    def damage(path):
        """Flips bytes near the end of the file at `path` (a kept reference's tensor data)."""
        damaged = bytearray(read(path, "rb"))
        for i in range(len(damaged) - 4096, len(damaged) - 4000):
            damaged[i] ^= 0x5A
        with open(path, "wb") as f:
            f.write(damaged)

    def versions(self, count, seed=0):
        """`count` checkpoints of a model drifting as training does, with tensors no codec
        shrinks much (steps) and a lossless integer tensor."""
        g = torch.Generator().manual_seed(seed)
        weights = {"w": torch.randn(256, 512, generator=g), "b": torch.randn(512, generator=g),
                   "h": torch.randn(64, 64, generator=g).half(),
                   "steps": torch.tensor(0, dtype=torch.int64)}
        out = []
        for step in range(count):
            weights = {k: (v + 0.002 * torch.randn(v.shape, generator=g).to(v.dtype)
                           if v.is_floating_point() else v + 1) for k, v in weights.items()}
            out.append(weights)
        return out

    def sha(self, model, version):
        path = os.path.join(self.tmp.name, "plain.safetensors")
        self.plain.pull_to_file(model, path, version)
        return hashlib.sha256(read(path, "rb")).hexdigest()

    def test_a_ranks_part_pulled_encoded_is_its_restored_part(self):
        g = torch.Generator().manual_seed(5)
        w, o = torch.randn(512, 256, generator=g), torch.randn(256, 512, generator=g)
        bias = torch.randn(256, generator=g)
        for rank in range(4):
            rows, cols = slice(128 * rank, 128 * rank + 128), slice(128 * rank, 128 * rank + 128)
            self.plain.push_shard(
                "tp", 1, rank, 4,
                {"w": w[rows].contiguous(), "o": o[:, cols].contiguous(), "bias": bias},
                slices={"w": {"global_shape": [512, 256], "offsets": [128 * rank, 0]},
                        "o": {"global_shape": [256, 512], "offsets": [0, 128 * rank]}})
        reader = self.coder("reader")
        for rank in range(2):
            part, slices = reader.pull_shard("tp", rank, 2)
            plain, plain_slices = self.plain.pull_shard("tp", rank, 2)
            self.assertEqual(sorted(part), sorted(plain))
            for name in plain:
                self.assertTrue(torch.equal(part[name], plain[name]), name)
            self.assertEqual(slices, plain_slices)
        only = reader.pull("tp", tensors=["w"])
        self.assertTrue(torch.equal(only["w"], w))
        # A part leaves the reference alone: nothing was held, nothing is.
        held = os.path.join(self.tmp.name, "reader", "tp.json")
        self.assertFalse(os.path.exists(held))

    def test_ranks_push_encoded_shards_that_store_what_the_daemon_stores(self):
        # 4 ranks (rows of `w` and the column tiles of `o` coded by their ranks, `bias`
        # replicated) for two versions, then 2 ranks: each re-syncs its new part by an encoded
        # part pull; `o` keeps its 4 tiles, which 2 ranks do not hold one each (sent raw).
        for model in ("edge", "daemon"):
            self.plain.set_policy(model, {"mode": "lossy", "max_abs_error": 5e-3})
        g = torch.Generator().manual_seed(9)
        w, o = torch.randn(512, 256, generator=g), torch.randn(256, 512, generator=g)
        bias = torch.randn(256, generator=g)
        ranks = [self.coder(f"rank{r}") for r in range(4)]
        for step, world in ((1, 4), (2, 4), (3, 2), (4, 2)):
            w, o, bias = (t + 0.01 * torch.randn(t.shape, generator=g) for t in (w, o, bias))
            answers, server = [], None
            for rank in range(world):
                n = 512 // world
                shard = {"w": w[n * rank:n * rank + n].contiguous(),
                         "o": o[:, n * rank:n * rank + n].contiguous(), "bias": bias}
                slices = {"w": {"global_shape": [512, 256], "offsets": [n * rank, 0]},
                          "o": {"global_shape": [256, 512], "offsets": [0, n * rank]}}
                answers.append(ranks[rank].push_shard("edge", step, rank, world, shard,
                                                      slices=slices))
                plain = self.plain.push_shard("daemon", step, rank, world, shard, slices=slices)
                server = plain.get("version") or server
            coded = next(a["version"] for a in answers if a.get("version"))
            for rank, answer in enumerate(answers):
                self.assertTrue(answer["encoded"], answer)
                # Version 2 deltas against what each rank kept of version 1; version 3's ranks
                # hold other parts: they pull theirs.
                self.assertEqual(answer["reference"],
                                 {1: "", 2: "held", 3: "pulled", 4: "held"}[step], (step, rank))
                # The rows' chunks are coded, and the columns' where a slice is a tile.
                shard_bytes = (512 // world) * (256 + 256) * 4 + 1024
                self.assertLess(answer["sent_bytes"], shard_bytes // 2 if world == 4
                                else shard_bytes + 1024, (step, rank))
            self.assertEqual(coded["sha256"], server["sha256"])
            self.assertEqual(coded["stored_bytes"], server["stored_bytes"])
            self.assertEqual(self.sha("edge", step), self.sha("daemon", step))
            detail = {t["name"]: t for t in self.plain.version_detail("edge", step)["tensors"]}
            self.assertEqual(detail["o"].get("tiles"), [1, 4])
            self.assertNotIn("tiles", detail["w"])
        # Version 4 was planned on a base of 2 shards: the parts kept for 4 ranks went.
        for rank in range(2):
            kept = os.listdir(os.path.join(self.tmp.name, f"rank{rank}"))
            self.assertIn(f"edge.rank{rank}-of-2.safetensors", kept)
            self.assertNotIn(f"edge.rank{rank}-of-4.safetensors", kept)
            self.assertNotIn(f"edge.rank{rank}-of-4.json", kept)

    def test_a_rank_completing_a_version_hears_that_another_ranks_shard_was_dropped(self):
        # Rank 0's part of version 1 is damaged: its shard of version 2 is stored as it comes,
        # and dropped by the commit that rank 1's shard completes. Rank 1 hears of it (its own
        # shard stays); rank 0 sends its shard again, pulling its part first: version 2 commits.
        self.plain.set_policy("tp", {"mode": "lossy", "max_abs_error": 5e-3})
        g = torch.Generator().manual_seed(11)
        w = torch.randn(512, 256, generator=g)
        ranks = [self.coder(f"drop{r}") for r in range(2)]

        def shard(rank):
            return ({"w": w[256 * rank:256 * rank + 256].contiguous()},
                    {"w": {"global_shape": [512, 256], "offsets": [256 * rank, 0]}})

        for rank in range(2):
            tensors, slices = shard(rank)
            ranks[rank].push_shard("tp", 1, rank, 2, tensors, slices=slices)
        part = os.path.join(self.tmp.name, "drop0", "tp.rank0-of-2.safetensors")
        damaged = bytearray(read(part, "rb"))
        for i in range(len(damaged) // 2, len(damaged) // 2 + 4096):
            damaged[i] ^= 0x40
        with open(part, "wb") as f:
            f.write(damaged)
        w = w + 0.01 * torch.randn(w.shape, generator=g)
        tensors, slices = shard(0)
        self.assertNotIn("version", ranks[0].push_shard("tp", 2, 0, 2, tensors, slices=slices))
        tensors, slices = shard(1)
        with self.assertRaises(ckptd.CkptdError) as dropped:
            ranks[1].push_shard("tp", 2, 1, 2, tensors, slices=slices)
        self.assertEqual(dropped.exception.status, 409)
        self.assertEqual(dropped.exception.reason, "SHARDS_DROPPED")
        self.assertIn("shard 0 of version 2", dropped.exception.message)
        # Rank 1's shard is stored: its part of version 2 is its reference.
        sidecar = os.path.join(self.tmp.name, "drop1", "tp.rank1-of-2.json")
        self.assertEqual(json.loads(read(sidecar))["version"], 2)
        tensors, slices = shard(0)
        again = ranks[0].push_shard("tp", 2, 0, 2, tensors, slices=slices)
        self.assertEqual(again["version"]["version"], 2, again)
        self.assertEqual(again["reference"], "pulled")
        back = self.plain.pull("tp", 2, encoded=False)
        self.assertLessEqual((back["w"] - w).abs().max().item(), 5e-3)

    def test_encoded_pushes_store_what_the_daemons_coding_stores(self):
        for model in ("edge", "daemon"):
            self.plain.set_policy(model, {"mode": "lossy", "max_abs_error": 5e-3})
        edge = self.coder("edge")
        for step, weights in enumerate(self.versions(4), start=1):
            coded = edge.push("edge", step, weights)
            server = self.plain.push("daemon", step, weights)
            self.assertTrue(coded["encoded"])
            self.assertEqual(coded["reference"], "" if step == 1 else "held")
            self.assertEqual(coded["kind"], server["kind"])
            self.assertEqual(coded["sha256"], server["sha256"])
            self.assertEqual(coded["stored_bytes"], server["stored_bytes"])
            # The wire carries the stored bytes and a small fixed framing.
            self.assertLess(coded["sent_bytes"], 1.05 * coded["stored_bytes"] + 4096)
            self.assertLess(coded["sent_bytes"], coded["raw_bytes"] / 2)
            self.assertEqual(self.sha("edge", step), coded["sha256"])
            back = edge.pull("edge", step, encoded=False)
            for name, value in weights.items():
                error = (back[name].double() - value.double()).abs().max().item()
                self.assertLessEqual(error, 5e-3 if value.is_floating_point() else 0, name)

    def test_a_damaged_reference_is_forgotten_and_the_base_pulled(self):
        self.plain.set_policy("m", {"mode": "lossy", "max_abs_error": 5e-3})
        coder = self.coder("damaged")
        first, second, third = self.versions(3)
        coder.push("m", 1, first)
        coder.push("m", 2, second)
        held = os.path.join(self.tmp.name, "damaged", "m.safetensors")
        self.damage(held)
        answer = coder.push("m", 3, third)
        self.assertTrue(answer["encoded"])
        self.assertEqual(answer["reference"], "pulled")
        self.assertIn("did not restore the base", answer["reference_note"])
        self.assertEqual(self.sha("m", 3), answer["sha256"])
        self.assertEqual(hashlib.sha256(read(held, "rb")).hexdigest(), answer["sha256"])
        # One that is no longer a safetensors file at all: the same.
        with open(held, "wb") as f:
            f.write(b"truncated")
        fourth = self.versions(4)[3]
        answer = coder.push("m", 4, fourth)
        self.assertEqual(answer["reference"], "pulled")
        self.assertEqual(self.sha("m", 4), answer["sha256"])

    def test_what_the_clients_codec_refuses_raises_codec_error(self):
        self.plain.push("m", 1, self.versions(1)[0])
        out = os.path.join(self.tmp.name, "no-such-dir", "m.safetensors")
        with self.assertRaises(ckptd.CodecError) as error:
            self.coder("refused").pull_encoded("m", out)
        self.assertEqual(error.exception.code, "IO_ERROR")
        self.assertIn("no-such-dir", str(error.exception))

    def test_a_file_that_is_not_safetensors_is_named_so(self):
        path = os.path.join(self.tmp.name, "notes.txt")
        with open(path, "w") as f:
            f.write("just a line of text\n")
        with self.assertRaisesRegex(ValueError, "not a safetensors file: header length"):
            self.coder("text").push("m", 1, path)
        self.assertEqual(self.plain.list_models(), [])

    def test_a_client_of_a_trusting_daemon_checks_its_reference_itself(self):
        work = os.path.join(self.tmp.name, "trusting")
        os.makedirs(work)
        trusting = Daemon(work, config="[server]\ndecode_encoded_payloads = false\n")
        try:
            url = f"http://127.0.0.1:{trusting.port}"
            plain = ckptd.Client(url, progress=False)
            plain.set_policy("m", {"mode": "lossy", "max_abs_error": 5e-3})
            coder = ckptd.Client(url, progress=False, encoded=True,
                                 reference_dir=os.path.join(work, "refs"))
            first, second = self.versions(2)
            self.assertEqual(coder.push("m", 1, first)["reference"], "")
            self.damage(os.path.join(work, "refs", "m.safetensors"))
            answer = coder.push("m", 2, second)
            self.assertTrue(answer["encoded"])
            self.assertEqual(answer["reference"], "pulled")
            self.assertIn("did not restore the base", answer["reference_note"])
            back = plain.pull("m", 2)
            for name, value in second.items():
                error = (back[name].double() - value.double()).abs().max().item()
                self.assertLessEqual(error, 5e-3 if value.is_floating_point() else 0, name)
        finally:
            trusting.stop()

    def test_a_file_pushed_by_a_client_without_the_base_pulls_it_first(self):
        first, second = self.versions(2)
        self.coder("a").push("m", 1, first)
        path = os.path.join(self.tmp.name, "second.safetensors")
        ckptd.save_file(second, path)
        answer = self.coder("b").push("m", 2, path)
        self.assertEqual(answer["kind"], "delta")
        self.assertEqual(answer["reference"], "pulled")
        self.assertEqual(self.sha("m", 2), answer["sha256"])
        self.assertEqual(self.sha("m", 2), hashlib.sha256(read(path, "rb")).hexdigest())

    def test_followers_sync_each_version_by_its_stored_delta(self):
        leader = self.coder("leader")
        follower = self.coder("follower")
        out = os.path.join(self.tmp.name, "synced.safetensors")
        for step, weights in enumerate(self.versions(5), start=1):
            pushed = leader.push("m", step, weights)
            got = follower.pull_encoded("m", out)
            self.assertEqual(got["version"], step)
            self.assertEqual(got["since_version"], step - 1)
            # The names `ckpt pull --json` answers with, too.
            self.assertEqual((got["model"], got["file"]), ("m", out))
            self.assertGreater(got["restored_bytes"], got["received_bytes"])
            self.assertEqual(got["sha256"], pushed["sha256"])
            self.assertEqual(hashlib.sha256(read(out, "rb")).hexdigest(), pushed["sha256"])
            self.assertLessEqual(got["received_bytes"], 1.1 * pushed["stored_bytes"] + 4096)
        # Into memory: the same tensors as a restore.
        mine = follower.pull("m")
        theirs = self.plain.pull("m")
        self.assertEqual(list(mine), list(theirs))
        for name in mine:
            self.assertTrue(torch.equal(mine[name], theirs[name]), name)

    def test_followers_sharing_a_reference_directory_keep_it_consistent(self):
        import threading
        leader = self.coder("leader")
        shared = os.path.join(self.tmp.name, "shared")
        errors, results = [], []

        def follow(index, step):
            try:
                follower = ckptd.Client(self.url, progress=False, encoded=True,
                                        reference_dir=shared)
                out = os.path.join(self.tmp.name, f"f{index}.safetensors")
                got = follower.pull_encoded("m", out, step)
                results.append((got["sha256"], hashlib.sha256(read(out, "rb")).hexdigest()))
            except Exception as error:  # noqa: BLE001 - reported below
                errors.append(error)

        for step, weights in enumerate(self.versions(4), start=1):
            leader.push("m", step, weights)
            threads = [threading.Thread(target=follow, args=(i, step)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 16)
        for announced, actual in results:
            self.assertEqual(announced, actual)
        # The file held and its sidecar are one pair: the sidecar names the file's digest.
        with open(os.path.join(shared, "m.json")) as f:
            sidecar = json.load(f)
        self.assertEqual(sidecar["version"], 4)
        self.assertEqual(sidecar["restored_sha256"],
                         hashlib.sha256(read(os.path.join(shared, "m.safetensors"), "rb"))
                         .hexdigest())

    def test_a_plan_made_stale_by_another_writer_is_planned_again(self):
        first, second, third = self.versions(3)
        edge = self.coder("edge")
        edge.push("m", 1, first)
        put_stream = edge._put_stream
        calls = []

        def interloper_first(*args):
            calls.append(1)
            if len(calls) == 1:
                self.plain.push("m", 2, second)  # after the plan, before the body
            return put_stream(*args)

        edge._put_stream = interloper_first
        answer = edge.push("m", 3, third)
        self.assertEqual(len(calls), 2)
        self.assertEqual(answer["reference"], "pulled")
        self.assertEqual(self.sha("m", 3), answer["sha256"])

    def test_a_version_taken_is_refused_by_the_plan_and_nothing_changes(self):
        first, second = self.versions(2)
        edge = self.coder("edge")
        edge.push("m", 1, first)
        with self.assertRaises(ckptd.CkptdError) as refused:
            edge.push("m", 1, second)
        self.assertEqual(refused.exception.status, 409)
        self.assertIn("greater than the latest", refused.exception.message)
        self.assertEqual([v["version"] for v in self.plain.versions("m")], [1])
        self.assertEqual(edge.push("m", 2, second)["reference"], "held")

    def test_without_the_module_the_daemon_codes_and_it_says_so_once(self):
        script = f"""
import sys, warnings
sys.path.insert(0, {SOURCE_PACKAGE!r})
import numpy as np, ckptd
assert not ckptd.edge.available()
client = ckptd.Client({self.url!r}, encoded=True, progress=False)
for step in (1, 2):
    answer = client.push("m", step, {{"w": np.ones(8, dtype=np.float32) * step}})
    assert answer["encoded"] is False and answer["sent_bytes"] == answer["raw_bytes"], answer
    assert "daemon coded" in answer["reference_note"] and not answer["reference"], answer
out = {os.path.join(self.tmp.name, "fallback.safetensors")!r}
pulled = client.pull_encoded("m", out)
assert pulled["encoded"] is False and pulled["version"] == 2 and pulled["verified"], pulled
assert pulled["restored_bytes"] == pulled["received_bytes"] == answer["raw_bytes"], pulled
print(float(client.pull("m")["w"][0]))
"""
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "2.0")
        self.assertEqual(result.stderr.count("native codec module"), 1, result.stderr)


class NewUserTest(unittest.TestCase):
    """What a new user meets first: the environment the CLI reads, a job's first start, failed
    pushes, resuming from what retention left, and every operation of the CLI."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.daemon = Daemon(self.tmp.name)
        self.url = f"http://127.0.0.1:{self.daemon.port}"
        self.client = ckptd.Client(self.url, progress=False)

    def tearDown(self):
        self.daemon.stop()
        self.tmp.cleanup()

    def test_reads_the_same_environment_as_the_cli(self):
        saved = dict(os.environ)
        try:
            os.environ["CKPT_SERVER"] = self.url
            os.environ["CKPT_CACERT"] = os.path.join(self.tmp.name, "no-such-ca.pem")
            client = ckptd.Client(progress=False)
            self.assertEqual(client.url, self.url)
            self.assertEqual(client.list_models(), [])  # http://: the CA file is not read
            with self.assertRaises(FileNotFoundError):
                ckptd.Client("https://127.0.0.1:1")  # https://: $CKPT_CACERT is used
        finally:
            os.environ.clear()
            os.environ.update(saved)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = s.getsockname()[1]
        with self.assertRaises(ConnectionError) as error:
            ckptd.Client(f"http://127.0.0.1:{dead}", progress=False).list_models()
        self.assertIn(f"cannot reach ckptd at http://127.0.0.1:{dead}", str(error.exception))

    def test_readme_resume_snippet_on_a_model_with_a_policy_and_no_versions(self):
        self.client.set_retention("mnist", {"keep_last": 3})  # policy before the first push
        self.assertIn("mnist", [m["name"] for m in self.client.list_models()])
        self.assertIsNone(self.client.latest_version("mnist"))
        self.assertIsNone(self.client.latest_version("never-seen"))
        model, opt = ClientTest.model_and_adam(0)
        start = 0
        if self.client.latest_version("mnist") is not None:
            tensors, metadata = self.client.pull_with_metadata("mnist")
            start = ckptd.load_training_state(model, opt, tensors, metadata) + 1
        self.assertEqual(start, 0)
        ClientTest.train(model, opt, 1, seed=1)
        tensors, metadata = ckptd.training_state(model, opt, 0)
        self.client.push("mnist", 0, tensors, metadata=metadata)
        self.assertEqual(self.client.latest_version("mnist"), 0)

    def test_push_is_retried_and_an_earlier_commit_is_recognised(self):
        weights = {"w": torch.randn(256, 64)}
        proxy = AnswerLosingProxy(self.daemon.port, lose=1)
        try:
            via = ckptd.Client(f"http://127.0.0.1:{proxy.port}", progress=False)
            answer = via.push("lost", 1, weights, backoff=0.01)
            self.assertEqual(proxy.lost, 1)
            self.assertEqual(answer["version"], 1)
            self.assertEqual(answer["model"], "lost")
            self.assertEqual(answer["sha256"], self.client.versions("lost")[0]["sha256"])
            self.assertTrue(torch.equal(self.client.pull("lost")["w"], weights["w"]))
            # The same version with another body is not taken for an earlier attempt.
            proxy.lose, proxy.lost = 2, 1
            with self.assertRaises(ckptd.CkptdError) as other:
                via.push("lost", 1, {"w": torch.zeros(256, 64)}, backoff=0.01)
            self.assertEqual(other.exception.status, 409)
        finally:
            proxy.close()
        # Without retries the lost answer is the caller's to handle.
        proxy = AnswerLosingProxy(self.daemon.port, lose=1)
        try:
            via = ckptd.Client(f"http://127.0.0.1:{proxy.port}", progress=False)
            with self.assertRaises(OSError):
                via.push("lost", 2, weights, retries=0)
        finally:
            proxy.close()

    def test_resuming_from_a_version_without_its_optimizer_state_is_refused(self):
        model, adam = ClientTest.model_and_adam(0)
        for step in (1, 2, 3):
            ClientTest.train(model, adam, 1, seed=step)
            tensors, metadata = ckptd.training_state(model, adam, step)
            self.client.push("run", step, tensors, metadata=metadata)
        rules = {"tensor_rules": [{"tensors": ["optim.*"], "keep_last": 1}]}
        with self.assertRaisesRegex(ValueError, "allow_deletes"):
            self.client.set_retention("run", rules)
        self.client.set_retention("run", rules, allow_deletes=True)
        report = self.client.apply_retention("run")
        self.assertEqual([d["version"] for d in report["tensors_dropped"]], [1, 2])
        with self.assertRaises(ckptd.CkptdError) as dropped:
            self.client.pull("run", 1, tensors=["optim.*"])
        self.assertEqual(dropped.exception.status, 404)
        self.assertIn("retention's tensor rules dropped them", dropped.exception.message)
        tensors, metadata = self.client.pull_with_metadata("run", 1)
        fresh, fresh_adam = ClientTest.model_and_adam(1)
        before = {k: v.clone() for k, v in fresh.state_dict().items()}
        with self.assertRaises(ckptd.MissingOptimizerState) as missing:
            ckptd.load_training_state(fresh, fresh_adam, tensors, metadata)
        self.assertIn("optimizer state of 12 tensor(s)", str(missing.exception))
        self.assertIn("'optim.0.weight.", str(missing.exception))
        for key, value in fresh.state_dict().items():  # nothing was loaded
            self.assertTrue(torch.equal(value, before[key]), key)
        with self.assertWarns(UserWarning):
            step = ckptd.load_training_state(fresh, fresh_adam, tensors, metadata,
                                             allow_missing_optimizer_state=True)
        self.assertEqual(step, 1)
        # A checkpoint written before the client recorded the state's keys is refused too.
        legacy = {k: v for k, v in metadata.items() if k != "optim.state_keys"}
        with self.assertRaises(ckptd.MissingOptimizerState):
            ckptd.load_training_state(fresh, fresh_adam, tensors, legacy)
        tensors, metadata = self.client.pull_with_metadata("run")  # latest keeps everything
        self.assertEqual(ckptd.load_training_state(fresh, fresh_adam, tensors, metadata), 3)
        # Part of a parameter's state missing: that parameter starts afresh as a whole, and
        # training goes on.
        partial = {k: v for k, v in tensors.items() if k != "optim.0.weight.exp_avg_sq"}
        again, again_adam = ClientTest.model_and_adam(2)
        with self.assertWarns(UserWarning):
            ckptd.load_training_state(again, again_adam, partial, metadata,
                                      allow_missing_optimizer_state=True)
        self.assertNotIn(again[0].weight, again_adam.state)
        self.assertIn(again[0].bias, again_adam.state)
        ClientTest.train(again, again_adam, 1, seed=9)

    def test_a_resumed_run_with_a_scheduler_is_bit_identical(self):
        def setup(seed):
            model, adam = ClientTest.model_and_adam(seed)
            return model, adam, torch.optim.lr_scheduler.OneCycleLR(adam, max_lr=0.05,
                                                                    total_steps=20)

        def train(model, adam, scheduler, steps, seed):
            for i in range(steps):
                ClientTest.train(model, adam, 1, seed=seed + i)
                scheduler.step()

        model, adam, scheduler = setup(0)
        train(model, adam, scheduler, 6, seed=10)
        tensors, metadata = ckptd.training_state(model, adam, 6, scheduler)
        self.client.push("sched", 6, tensors, metadata=metadata)
        restored, restored_adam, restored_scheduler = setup(1)
        tensors, metadata = self.client.pull_with_metadata("sched")
        self.assertEqual(ckptd.load_training_state(restored, restored_adam, tensors, metadata,
                                                   restored_scheduler), 6)
        self.assertEqual(restored_scheduler.last_epoch, 6)
        train(model, adam, scheduler, 5, seed=100)
        train(restored, restored_adam, restored_scheduler, 5, seed=100)
        self.assertEqual(adam.param_groups[0]["lr"], restored_adam.param_groups[0]["lr"])
        for (name, a), b in zip(model.state_dict().items(), restored.state_dict().values()):
            self.assertTrue(torch.equal(a, b), name)
        without, _ = ckptd.training_state(model, adam, 7)
        with self.assertRaisesRegex(ValueError, "no LR scheduler state"):
            ckptd.load_training_state(restored, restored_adam, without, {}, restored_scheduler)

    def test_every_cli_operation_from_python(self):
        path = os.path.join(self.tmp.name, "step-1.safetensors")
        ckptd.save_file({"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, path,
                        metadata={"origin": "test"})
        tensors, metadata = ckptd.load_file(path, as_torch=False)
        np.testing.assert_array_equal(tensors["w"], np.arange(12, dtype=np.float32).reshape(3, 4))
        self.assertEqual(metadata, {"origin": "test"})
        for step in (1, 2, 3):
            self.client.push("ops", step, path)
        self.client.tag("ops", "latest", "best")
        self.assertEqual(self.client.resolve_version("ops", "tag:best"), 3)
        self.client.untag("ops", "tag:best", "best")
        self.assertEqual(self.client.versions("ops")[-1]["tags"], [])
        with self.assertWarns(UserWarning):
            self.client.set_policy("ops", {"max_abs_error": 1e-3})
        self.assertEqual(self.client.get_policy("ops")["mode"], "lossless")
        self.client.set_retention("ops", {"keep_last": 1}, allow_deletes=True)
        self.assertEqual(self.client.get_retention("ops"), {"keep_last": 1})
        self.assertEqual(self.client.preview_retention("ops")["deleted"], [1, 2])
        self.assertEqual(self.client.preview_retention("ops", {"keep_last": 2})["deleted"], [1])
        self.assertEqual(self.client.apply_retention("ops")["deleted"], [1, 2])
        self.assertEqual(self.client.gc()["deleted_versions"], 0)
        self.assertTrue(self.client.scrub()["clean"])
        backup = os.path.join(self.tmp.name, "no", "such", "parents")
        self.assertEqual(self.client.backup(backup)["backup_id"], 1)
        self.client.delete_version("ops", "latest")
        self.client.delete_model("ops")
        self.assertEqual(self.client.list_models(), [])


class HttpsAndTokenTest(unittest.TestCase):
    """The client over HTTPS (a private CA made here with openssl) with bearer tokens."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = self.tmp.name
        script = (
            "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca"
            " -keyout ca.key -out ca.crt"
            " && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key"
            " -out server.csr"
            " && printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > san.ext"
            " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
            " -days 2 -extfile san.ext -out server.crt")
        made = subprocess.run(["sh", "-c", script], cwd=d, capture_output=True, text=True)
        self.assertEqual(made.returncode, 0, made.stderr)
        digest = hashlib.sha256(b"trainer-token").hexdigest()
        reader = hashlib.sha256(b"reader-token").hexdigest()
        self.daemon = Daemon(d, config=(
            f'[server]\ntls_cert_file = "{d}/server.crt"\ntls_key_file = "{d}/server.key"\n'
            f'[[auth.tokens]]\nname = "trainer"\nscope = "write"\nsha256 = "{digest}"\n'
            f'[[auth.tokens]]\nname = "reader"\nscope = "read"\nsha256 = "{reader}"\n'))
        self.url = f"https://127.0.0.1:{self.daemon.port}"
        self.ca = os.path.join(d, "ca.crt")

    def tearDown(self):
        self.daemon.stop()
        self.tmp.cleanup()

    def test_push_and_pull_over_https_with_a_token(self):
        client = ckptd.Client(self.url, token="trainer-token", ca_file=self.ca, progress=False)
        weights = {"w": torch.randn(128, 64), "step": torch.tensor(7)}
        client.push("secure", 1, weights)
        back = client.pull("secure")
        self.assertTrue(torch.equal(back["w"], weights["w"]))
        self.assertEqual(int(back["step"]), 7)
        reader = ckptd.Client(self.url, token="reader-token", ca_file=self.ca, progress=False)
        self.assertTrue(torch.equal(reader.pull("secure", 1)["w"], weights["w"]))
        with self.assertRaises(ckptd.CkptdError) as denied:
            reader.push("secure", 2, weights)
        self.assertEqual(denied.exception.status, 403)
        with self.assertRaises(ckptd.CkptdError) as anonymous:
            ckptd.Client(self.url, ca_file=self.ca, progress=False).list_models()
        self.assertEqual(anonymous.exception.status, 401)
        # Without the private CA the server's certificate is not trusted.
        with self.assertRaises(ssl.SSLError):
            ckptd.Client(self.url, token="reader-token", progress=False).list_models()


def main():
    global CKPTD
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckptd", required=True)
    args, rest = parser.parse_known_args()
    CKPTD = args.ckptd
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
