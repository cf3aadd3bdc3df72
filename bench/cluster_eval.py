#!/usr/bin/python3
"""Scale-out benchmark: ckptd on Ceph RADOS against ckptd on its local RocksDB and against the
peer that stores without ckptd (`rados put` / `rados get` of the raw files), in one run.

Starts a one-node Ceph cluster (scripts/ceph-one-node.sh, loopback, a temporary directory), then
on the same checkpoints (every *.safetensors of CKPT_DIR, pushed as versions 10, 20, ...):
  1. `rados put` / `rados get` of each file with the rados CLI (a process per file, as a script
     would do it), and the same through librados in one process (python3-rados), for the pure
     data path;
  2. ckptd, single node: push all, restore all, data directory (`du` after a clean shutdown);
  3. ckptd with the RADOS backend (lossless, then lossy 5e-3): push all through daemon A, restore
     all through A and through a second daemon B (whose cache starts empty); stored bytes =
     the namespace's objects (their sizes) + the omap bytes of its model and index objects;
  4. takeover: daemon A owns a model, is killed with SIGKILL, and daemon B pushes until accepted;
     the time from the kill to B's acknowledged push (lease as configured, default 10 s).
Throughputs are raw checkpoint bytes per second of wall time, medians over --runs.

Usage:
  /usr/bin/python3 bench/cluster_eval.py CKPT_DIR [--build build-release] [--runs 3]
      [--takeovers 3] [--lease 10]
"""
import argparse
import glob
import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import rados

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import du_bytes, http_request  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POOL = "ckptd"
LOSSY = '{"mode":"lossy","max_abs_error":5e-3,"lossless_tensors":[]}'


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One ckptd: its own data directory and fixed port, optionally on the cluster."""

    def __init__(self, binary, work, name, cluster=None):
        self.binary, self.dir = binary, os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = os.path.join(self.dir, "ckptd.toml")
        with open(self.config, "w") as f:
            f.write("[retention]\ninterval_seconds = 0\nafter_push = false\n")
            if cluster:
                conf, namespace, lease = cluster
                f.write(f'[cluster]\nceph_conf = "{conf}"\npool = "{POOL}"\n'
                        f'namespace = "{namespace}"\nlease_seconds = {lease}\n'
                        f'advertise_url = "{self.url}"\n')
        self.proc = None

    def data_dir(self):
        return os.path.join(self.dir, "data")

    def start(self):
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.remove(ready)
        log = open(os.path.join(self.dir, "ckptd.log"), "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--config", self.config, "--listen", f"127.0.0.1:{self.port}",
             "--data-dir", self.data_dir(), "--ready-file", ready, "--log-level", "warn"],
            stdout=log, stderr=log)
        for _ in range(6000):
            if os.path.exists(ready) and open(ready).read().strip():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptd exited during start-up (log: {self.dir}/ckptd.log)")
            time.sleep(0.01)
        raise RuntimeError("ckptd did not become ready")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def request(self, method, path, body=None):
        return http_request(self.port, method, path, body)


def checked(node, method, path, body=None):
    status, data = node.request(method, path, body)
    if status >= 300:
        raise RuntimeError(f"{method} {path}: {status} {data[:300]!r}")
    return data


def push_all(node, files, policy=None):
    if policy:
        checked(node, "PUT", "/v1/models/m/policy", policy)
    start = time.monotonic()
    for i, (path, body) in enumerate(files):
        checked(node, "PUT", f"/v1/models/m/versions/{(i + 1) * 10}", body)
    return time.monotonic() - start


def restore_all(node, files, expect_exact=True):
    start = time.monotonic()
    for i, (path, body) in enumerate(files):
        data = checked(node, "GET", f"/v1/models/m/versions/{(i + 1) * 10}")
        if expect_exact and hashlib.sha256(data).digest() != hashlib.sha256(body).digest():
            raise RuntimeError(f"version {(i + 1) * 10} restored differently")
        if len(data) != len(body):
            raise RuntimeError(f"version {(i + 1) * 10}: wrong size")
    return time.monotonic() - start


def namespace_bytes(io, namespace):
    """Object bytes and omap bytes (keys + values) of one namespace."""
    io.set_namespace(namespace)
    data = omap = objects = 0
    for obj in io.list_objects():
        size, _ = io.stat(obj.key)
        data += size
        objects += 1
        if not obj.key.startswith("chunk/"):
            after = ""
            while True:
                with rados.ReadOpCtx() as op:
                    it, _ = io.get_omap_vals(op, after, "", 10000)
                    io.operate_read_op(op, obj.key)
                    page = list(it)
                omap += sum(len(k) + len(v or b"") for k, v in page)
                if len(page) < 10000:
                    break
                after = page[-1][0]
    return data, omap, objects


def restore_latest(node, files):
    """Seconds to restore `latest` once (the first request after a failure)."""
    start = time.monotonic()
    data = checked(node, "GET", "/v1/models/m/versions/latest")
    seconds = time.monotonic() - start
    if len(data) != len(files[-1][1]):
        raise RuntimeError("latest: wrong size")
    return seconds


def mb_s(total_bytes, seconds):
    return total_bytes / seconds / 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--build", default=os.path.join(ROOT, "build-release"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--takeovers", type=int, default=3)
    parser.add_argument("--lease", type=float, default=10)
    args = parser.parse_args()
    binary = os.path.join(args.build, "daemon", "ckptd")
    paths = sorted(glob.glob(os.path.join(args.ckpt_dir, "*.safetensors")))
    files = [(p, open(p, "rb").read()) for p in paths]
    raw = sum(len(b) for _, b in files)
    print(f"{len(files)} checkpoints, {raw / 2**20:.1f} MiB raw; ckptd {binary}")

    work = tempfile.mkdtemp(prefix="ckpt-cluster-bench-")
    ceph_dir = os.path.join(work, "ceph")
    env = dict(os.environ, CEPH_MON_PORT=str(free_port()), CEPH_MON_PORT_V1=str(free_port()))
    t0 = time.monotonic()
    subprocess.run([os.path.join(ROOT, "scripts", "ceph-one-node.sh"), "start", ceph_dir, POOL],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    print(f"one-node Ceph cluster up in {time.monotonic() - t0:.1f} s")
    conf = os.path.join(ceph_dir, "ceph.conf")
    cluster = rados.Rados(conffile=conf, conf={"admin_socket": ""})
    cluster.connect()
    io = cluster.open_ioctx(POOL)
    results = {}
    latest = {}  # seconds to restore `latest` once, right after the pushes
    try:
        # 1. The peer: raw files as objects.
        put_cli, get_cli, put_lib, get_lib = [], [], [], []
        for run in range(args.runs):
            ns = f"raw{run}"
            start = time.monotonic()
            for i, (path, _) in enumerate(files):
                subprocess.run(["rados", "-c", conf, "--admin-socket", "", "-p", POOL, "-N", ns,
                                "put", f"f{i}", path], check=True)
            put_cli.append(time.monotonic() - start)
            out = os.path.join(work, "got")
            start = time.monotonic()
            for i, _ in enumerate(files):
                subprocess.run(["rados", "-c", conf, "--admin-socket", "", "-p", POOL, "-N", ns,
                                "get", f"f{i}", out], check=True)
            get_cli.append(time.monotonic() - start)
            io.set_namespace(ns + "lib")
            start = time.monotonic()
            for i, (_, body) in enumerate(files):
                io.write_full(f"f{i}", body)
            put_lib.append(time.monotonic() - start)
            start = time.monotonic()
            for i, (_, body) in enumerate(files):
                if io.read(f"f{i}", len(body) + 1) != body:
                    raise RuntimeError("rados read differs")
            get_lib.append(time.monotonic() - start)
        raw_stored = namespace_bytes(io, "raw0")
        results["rados put/get (CLI)"] = (statistics.median(put_cli), statistics.median(get_cli),
                                          None, raw_stored[0] + raw_stored[1])
        results["librados write_full/read"] = (statistics.median(put_lib),
                                               statistics.median(get_lib), None, raw)

        # 2. ckptd on its local RocksDB.
        push_t, get_t, dus, latest_local = [], [], [], []
        for run in range(args.runs):
            node = Node(binary, work, f"local{run}")
            node.start()
            push_t.append(push_all(node, files))
            latest_local.append(restore_latest(node, files))
            get_t.append(restore_all(node, files))
            node.stop()
            dus.append(du_bytes(node.data_dir()))
        latest["ckptd, local RocksDB"] = statistics.median(latest_local)
        results["ckptd, local RocksDB"] = (statistics.median(push_t), statistics.median(get_t),
                                           None, statistics.median(dus))

        # 3. ckptd on RADOS: push through A, restore through A and through B.
        for label, policy in (("lossless", None), ("lossy 5e-3", LOSSY)):
            push_t, get_a, get_b, stored, latest_a, latest_b = [], [], [], [], [], []
            for run in range(args.runs):
                ns = f"ckptd-{label.split()[0]}-{run}"
                a = Node(binary, work, f"{ns}-a", (conf, ns, args.lease))
                b = Node(binary, work, f"{ns}-b", (conf, ns, args.lease))
                a.start()
                b.start()
                push_t.append(push_all(a, files, policy))
                latest_a.append(restore_latest(a, files))
                latest_b.append(restore_latest(b, files))
                get_a.append(restore_all(a, files, expect_exact=policy is None))
                get_b.append(restore_all(b, files, expect_exact=policy is None))
                a.stop()
                b.stop()
                data, omap, objects = namespace_bytes(io, ns)
                stored.append(data + omap)
            results[f"ckptd on RADOS, {label} (restore via A)"] = (
                statistics.median(push_t), statistics.median(get_a), None,
                statistics.median(stored))
            results[f"ckptd on RADOS, {label} (restore via B)"] = (
                None, statistics.median(get_b), None, statistics.median(stored))
            latest[f"ckptd on RADOS, {label}, via A (the writer)"] = statistics.median(latest_a)
            latest[f"ckptd on RADOS, {label}, via B (cold)"] = statistics.median(latest_b)

        # 4. Takeover after kill -9.
        takeovers = []
        ns = "takeover"
        a = Node(binary, work, "takeover-a", (conf, ns, args.lease))
        a.start()
        checked(a, "PUT", "/v1/models/m/versions/1", files[0][1])
        version = 1
        for run in range(args.takeovers):
            b = Node(binary, work, f"takeover-b{run}", (conf, ns, args.lease))
            b.start()
            time.sleep(args.lease / 3 * (run % 3) / 3)  # kill at different points of the renewal
            killed = time.monotonic()
            a.kill()
            version += 1
            while True:
                status, data = b.request("PUT", f"/v1/models/m/versions/{version}",
                                         files[version % len(files)][1])
                if status == 201:
                    break
                if status not in (307, 503):
                    raise RuntimeError(f"takeover push: {status} {data[:200]!r}")
                time.sleep(0.05)
            takeovers.append(time.monotonic() - killed)
            a = b
        a.stop()
    finally:
        io.close()
        cluster.shutdown()
        subprocess.run([os.path.join(ROOT, "scripts", "ceph-one-node.sh"), "stop", ceph_dir],
                       stdout=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)

    print("\n| store | push MB/s | restore MB/s | stored MiB | ratio |")
    print("|---|---|---|---|---|")
    for label, (push, get, _, stored) in results.items():
        p = f"{mb_s(raw, push):.0f}" if push else "—"
        print(f"| {label} | {p} | {mb_s(raw, get):.0f} | {stored / 2**20:.1f} | "
              f"{raw / stored:.2f}x |")
    one = len(files[-1][1])
    print(f"\n| restore of `latest` ({one / 2**20:.1f} MiB) | ms | MB/s |")
    print("|---|---|---|")
    for label, seconds in latest.items():
        print(f"| {label} | {seconds * 1000:.0f} | {mb_s(one, seconds):.0f} |")
    print(f"\ntakeover after kill -9 (lease {args.lease:g} s): "
          + ", ".join(f"{t:.2f}" for t in takeovers)
          + f" s; median {statistics.median(takeovers):.2f} s")


if __name__ == "__main__":
    main()
