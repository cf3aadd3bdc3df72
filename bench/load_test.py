#!/usr/bin/python3
"""Bounded load test of one ckptd on loopback.

N clients (threads, one connection per request, standard-library HTTP) for D seconds, each on
its own model: push the next version (a ~1 MB float32 safetensors that drifts like training),
restore a random earlier version and check its SHA-256 against what the push answered, list
the model's versions; in a loop. Reports requests, errors, throughput, p50/p99 latency per kind
and the daemon's RSS and open file descriptors sampled every second (RSS must stay flat).

Then the disconnect phase (--abort-seconds): clients that send half a push body and hang up, or
read a few KB of a restore and hang up, beside normal clients; afterwards no partial version may
exist, every acknowledged version still restores, and RSS / fds return to where they were.

Usage: /usr/bin/python3 bench/load_test.py [--build build-release] [--clients 32]
       [--seconds 60] [--abort-seconds 20]
"""
import argparse
import hashlib
import http.client
import json
import os
import random
import socket
import struct
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Daemon  # noqa: E402


def checkpoint(rng, values):
    """A safetensors body of one F32 tensor (values: list of floats, drifted in place)."""
    for i in range(0, len(values), 7):
        values[i] += rng.gauss(0, 1e-3)
    data = struct.pack(f"<{len(values)}f", *values)
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values) // 256, 256],
                               "data_offsets": [0, len(data)]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def proc_stats(pid):
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return rss * 1024, len(os.listdir(f"/proc/{pid}/fd"))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.latency = {}
        self.errors = []
        self.bytes = 0

    def add(self, kind, seconds, nbytes=0):
        with self.lock:
            self.latency.setdefault(kind, []).append(seconds)
            self.bytes += nbytes

    def error(self, what):
        with self.lock:
            self.errors.append(what)


def request(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("X-Ckpt-Sha256")
    finally:
        conn.close()


def worker(port, prefix, index, deadline, stats, acknowledged):
    rng = random.Random(index)
    values = [rng.gauss(0, 0.05) for _ in range(256 * 1024)]  # 1 MiB of float32
    model = f"{prefix}{index}"
    version = 0
    while time.monotonic() < deadline:
        try:
            version += 1
            body = checkpoint(rng, values)
            start = time.monotonic()
            status, data, _ = request(port, "PUT", f"/v1/models/{model}/versions/{version}", body)
            stats.add("push", time.monotonic() - start, len(body))
            if status != 201:
                stats.error(f"push {model}@{version}: {status} {data[:200]!r}")
                continue
            acknowledged[(model, version)] = json.loads(data)["sha256"]
            pick = rng.randint(1, version)
            start = time.monotonic()
            status, data, sha = request(port, "GET", f"/v1/models/{model}/versions/{pick}")
            stats.add("restore", time.monotonic() - start, len(data))
            if status != 200 or hashlib.sha256(data).hexdigest() != acknowledged[(model, pick)]:
                stats.error(f"restore {model}@{pick}: {status}, digest mismatch or error")
            start = time.monotonic()
            status, data, _ = request(port, "GET", f"/v1/models/{model}/versions")
            stats.add("list", time.monotonic() - start)
            if status != 200 or len(json.loads(data)["versions"]) != version:
                stats.error(f"list {model}: {status}")
        except Exception as e:  # noqa: BLE001 - every failure is an error of the run
            stats.error(f"{model}: {type(e).__name__}: {e}")


def aborter(port, prefix, index, deadline, stats):
    rng = random.Random(1000 + index)
    values = [rng.gauss(0, 0.05) for _ in range(256 * 1024)]
    body = checkpoint(rng, values)
    n = 0
    while time.monotonic() < deadline:
        n += 1
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if n % 2:  # half a push, then hang up
                s.sendall(f"PUT /v1/models/abort{index}/versions/{n} HTTP/1.1\r\nHost: x\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:len(body) // 2])
            else:  # a restore of a model the normal clients push, read a little, hang up
                s.sendall(f"GET /v1/models/{prefix}{index}/versions/latest HTTP/1.1\r\n"
                          "Host: x\r\n\r\n".encode())
                s.recv(4096)
            s.close()
            stats.add("abort", 0)
        except OSError as e:
            stats.error(f"aborter {index}: {e}")


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))] if values else 0


def run_phase(port, pid, prefix, clients, seconds, aborters, acknowledged, label):
    stats = Stats()
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=worker,
                                args=(port, prefix, i, deadline, stats, acknowledged))
               for i in range(clients)]
    threads += [threading.Thread(target=aborter, args=(port, prefix, i, deadline, stats))
                for i in range(aborters)]
    samples = []
    start = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        samples.append(proc_stats(pid))
        time.sleep(1)
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    total = sum(len(v) for k, v in stats.latency.items() if k != "abort")
    print(f"\n{label}: {clients} clients + {aborters} aborting clients, {elapsed:.0f} s")
    print(f"  requests {total} ({total / elapsed:.0f}/s), errors {len(stats.errors)}, "
          f"body bytes {stats.bytes / 2**20:.0f} MiB ({stats.bytes / 2**20 / elapsed:.0f} MiB/s)")
    for kind in ("push", "restore", "list"):
        lat = stats.latency.get(kind, [])
        print(f"  {kind:8s} n={len(lat):6d}  p50 {percentile(lat, 50) * 1e3:7.1f} ms"
              f"  p99 {percentile(lat, 99) * 1e3:7.1f} ms")
    if "abort" in stats.latency:
        print(f"  aborted transfers {len(stats.latency['abort'])}")
    rss = [s[0] / 2**20 for s in samples]
    fds = [s[1] for s in samples]
    third = max(1, len(rss) // 3)
    print(f"  daemon RSS MiB: first third max {max(rss[:third]):.0f}, last third max "
          f"{max(rss[-third:]):.0f}, overall {min(rss):.0f}..{max(rss):.0f}; fds {min(fds)}..{max(fds)}")
    for e in stats.errors[:10]:
        print("  ERROR", e)
    return stats, samples


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build-release")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--abort-seconds", type=float, default=20)
    args = parser.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as work:
        log = open(os.path.join(work, "ckptd.log"), "wb")  # aborted pushes are logged
        daemon = Daemon(os.path.join(root, args.build, "daemon", "ckptd"),
                        os.path.join(work, "data"), log)
        daemon.start()
        pid = daemon.proc.pid
        acknowledged = {}
        before = proc_stats(pid)
        print(f"daemon at start: RSS {before[0] / 2**20:.0f} MiB, {before[1]} fds")
        steady, _ = run_phase(daemon.port, pid, "load", args.clients, args.seconds, 0,
                              acknowledged, "steady load")
        after_load = proc_stats(pid)
        aborted, _ = run_phase(daemon.port, pid, "mixed", args.clients // 2,
                               args.abort_seconds, args.clients // 2, acknowledged,
                               "with disconnects")
        time.sleep(2)
        after_abort = proc_stats(pid)
        # No partial version; every acknowledged version restores to its digest.
        problems = []
        status, data, _ = request(daemon.port, "GET", "/v1/models")
        for m in json.loads(data)["models"]:
            if m["name"].startswith("abort") and m.get("version_count", 0):
                problems.append(f"partial push visible: {m}")
        for (model, version), digest in sorted(acknowledged.items()):
            status, data, _ = request(daemon.port, "GET", f"/v1/models/{model}/versions/{version}")
            if status != 200 or hashlib.sha256(data).hexdigest() != digest:
                problems.append(f"{model}@{version} does not restore")
        print(f"\nafter: RSS {after_load[0] / 2**20:.0f} MiB / {after_load[1]} fds after the "
              f"load, {after_abort[0] / 2**20:.0f} MiB / {after_abort[1]} fds after the "
              f"disconnects; {len(acknowledged)} acknowledged versions all checked, "
              f"problems {len(problems)}")
        for p in problems[:10]:
            print("  PROBLEM", p)
        daemon.stop()
        failed = steady.errors or aborted.errors or problems
        sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
