#!/usr/bin/python3
"""What an S3 endpoint guarantees of conditional writes, the primitive an S3 commit rests on.

Against an endpoint (--endpoint URL --access-key K --secret-key S), or against Ceph's RADOS
Gateway on a throwaway one-node cluster this script starts and stops (scripts/ceph-one-node.sh,
Debian's `radosgw`; the default):
  1. create races: two clients PUT a new key at once with `If-None-Match: *`, --trials times per
     body size: a safe store lets exactly one win (the other 412);
  2. compare-and-swap races: two clients PUT an existing key at once with `If-Match: <its ETag>`
     (every body distinct, so every write changes the ETag): exactly one may win;
  3. the forms it takes: `If-None-Match: *` on an existing key, `If-Match` with a stale ETag, on a
     missing key, and with the current ETag quoted (as HTTP writes it) and unquoted.
Requests go through curl (`--aws-sigv4`, payload `UNSIGNED-PAYLOAD`); each race starts both
curls behind a barrier.

Usage: /usr/bin/python3 bench/s3_conditional_probe.py [--trials 100] [--sizes 100,1048576]
           [--endpoint URL --access-key K --secret-key S]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import free_port  # noqa: E402


class S3:
    def __init__(self, endpoint, access_key, secret_key):
        self.endpoint = endpoint.rstrip("/")
        self.auth = ["--aws-sigv4", "aws:amz:us-east-1:s3", "-u", f"{access_key}:{secret_key}",
                     "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"]

    def put(self, path, body=None, headers=()):
        """The status of a PUT of file `body` (none: a bucket) to `path`."""
        cmd = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT"] + self.auth
        for header in headers:
            cmd += ["-H", header]
        if body:
            cmd += ["-T", body]
        return int(subprocess.run(cmd + [self.endpoint + path], capture_output=True,
                                  text=True).stdout or 0)

    def etag(self, path):
        out = subprocess.run(["curl", "-s", "-I"] + self.auth + [self.endpoint + path],
                             capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines()
                    if line.lower().startswith("etag:"))


def race(s3, path, bodies, headers):
    """Both PUTs at once; the number that succeeded."""
    codes = [0, 0]
    barrier = threading.Barrier(2)

    def run(i):
        barrier.wait()
        codes[i] = s3.put(path, bodies[i], headers)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(200 <= c < 300 for c in codes)


def write_body(path, size, label):
    with open(path, "wb") as f:
        f.write(label.encode().ljust(size, b"x")[:max(size, len(label))])


def probe(s3, trials, sizes, work):
    bucket = f"/probe-{os.getpid()}"
    if s3.put(bucket) != 200:
        raise SystemExit(f"could not create bucket {bucket}")
    bodies = [os.path.join(work, f"body{i}") for i in range(3)]
    print("| race | body bytes | trials | exactly one won | both won | none won |")
    print("|---|---|---|---|---|---|")
    for size in sizes:
        tally = [0, 0, 0]
        for t in range(trials):
            for i in range(2):
                write_body(bodies[i], size, f"create {t} {i}")
            won = race(s3, f"{bucket}/create-{size}-{t}", bodies, ["If-None-Match: *"])
            tally[{1: 0, 2: 1, 0: 2}[won]] += 1
        print(f"| `If-None-Match: *` create | {size} | {trials} | {tally[0]} | {tally[1]} | "
              f"{tally[2]} |")
        tally = [0, 0, 0]
        key = f"{bucket}/swap-{size}"
        write_body(bodies[2], size, "seed")
        s3.put(key, bodies[2])
        for t in range(trials):
            current = s3.etag(key).strip('"')
            for i in range(2):
                write_body(bodies[i], size, f"swap {t} {i}")
            won = race(s3, key, bodies, [f"If-Match: {current}"])
            tally[{1: 0, 2: 1, 0: 2}[won]] += 1
        print(f"| `If-Match: <ETag>` swap | {size} | {trials} | {tally[0]} | {tally[1]} | "
              f"{tally[2]} |")
    key = f"{bucket}/forms"
    write_body(bodies[0], 100, "forms 0")
    write_body(bodies[1], 100, "forms 1")
    s3.put(key, bodies[0])
    stale = s3.etag(key)
    s3.put(key, bodies[1])
    current = s3.etag(key)
    print()
    print("| request | status |")
    print("|---|---|")
    checks = [
        ("`If-None-Match: *` on an existing key", key, ["If-None-Match: *"]),
        ("`If-Match` with a stale ETag", key, [f"If-Match: {stale.strip(chr(34))}"]),
        ("`If-Match` on a missing key", f"{bucket}/missing", [f"If-Match: {current}"]),
        ("`If-Match` with the current ETag, quoted", key, [f"If-Match: {current}"]),
    ]
    for label, path, headers in checks:
        print(f"| {label} | {s3.put(path, bodies[0], headers)} |")
    current = s3.etag(key)
    print(f"| `If-Match` with the current ETag, unquoted | "
          f"{s3.put(key, bodies[1], [f'If-Match: {current.strip(chr(34))}'])} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\nUsage:")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100, help="races per body size and kind")
    parser.add_argument("--sizes", default="100,1048576", help="body sizes, comma-separated")
    parser.add_argument("--endpoint", help="an S3 endpoint to probe instead of a local RGW")
    parser.add_argument("--access-key")
    parser.add_argument("--secret-key")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="ckptd-s3-probe-")
    ceph = None
    try:
        if args.endpoint:
            s3 = S3(args.endpoint, args.access_key, args.secret_key)
        else:
            if not shutil.which("radosgw"):
                print("skipped: radosgw is not installed (scripts/install-deps.sh --bench)")
                return 77
            script = os.path.join(HERE, "..", "scripts", "ceph-one-node.sh")
            ceph = os.path.join(work, "ceph")
            env = dict(os.environ, CEPH_MON_PORT=str(free_port()),
                       CEPH_MON_PORT_V1=str(free_port()), S3_ACCESS_KEY="probe",
                       S3_SECRET_KEY="probe-secret")
            subprocess.run([script, "start", ceph, "probe"], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            out = subprocess.run([script, "start-rgw", ceph, str(free_port())], env=env,
                                 check=True, capture_output=True, text=True).stdout
            endpoint = next(line.split("=", 1)[1] for line in out.splitlines()
                            if line.startswith("S3_ENDPOINT="))
            s3 = S3(endpoint, "probe", "probe-secret")
            version = subprocess.run(["radosgw", "--version"], capture_output=True,
                                     text=True).stdout.split("(")[0].strip()
            print(f"endpoint: {version}, one-node cluster (BlueStore on a file), loopback\n")
        probe(s3, args.trials, sizes, work)
        return 0
    finally:
        if ceph:
            subprocess.run([os.path.join(HERE, "..", "scripts", "ceph-one-node.sh"), "stop",
                            ceph], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
