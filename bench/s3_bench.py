#!/usr/bin/python3
"""ckptd on S3 against the S3 tools a user would run instead, on one S3 server in the same run.

Starts Ceph's S3 gateway (radosgw, Debian's) on a throwaway one-node cluster
(scripts/ceph-one-node.sh), then, for the *.safetensors files of CKPT_DIR in name order:
  - ckptd with an [s3] store on that gateway: each file pushed as the next version (time to
    durable: the pushes' 201s), then every version restored (GET); the requests and bytes ckptd
    sent to the bucket (its ckptd_s3_* metrics), and the bucket's bytes under its prefix; once
    with chunk records packed (the default) and once with an object per record (pack_bytes = 0);
  - ckptd on its local disk with the same policy: the stored bytes the S3 store must match;
  - `aws s3 cp` (Debian's awscli) of each raw file up and back down;
  - `s3cmd put` / `s3cmd get` of each raw file.
Prints MB/s of raw checkpoint bytes each way, requests per GB of raw checkpoints, stored bytes,
and the cost of the run (every version pushed once and restored once, plus a month of storage)
at AWS S3 Standard list prices. The gateway, the OSD and ckptd share the machine's cores.

The raw tools' request counts are not observed: they are what their defaults send (awscli:
multipart above 8 MiB in 8 MiB parts, ranged GETs of 8 MiB after a HEAD; s3cmd: multipart above
15 MiB in 15 MiB parts, one GET).

Usage: /usr/bin/python3 bench/s3_bench.py CKPT_DIR BUILD_DIR [--policy JSON] [--versions N]
"""
import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
from benchlib import free_port, http_request  # noqa: E402

ACCESS, SECRET = "benchaccess", "benchsecret0123456789"
BUCKET = "ckptd-bench"
MIB = 1 << 20
# AWS S3 Standard, us-east-1 list prices.
PUT_PRICE, GET_PRICE, GB_MONTH_PRICE = 0.005 / 1000, 0.0004 / 1000, 0.023


def metric(port, name):
    text = http_request(port, "GET", "/metrics")[1].decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def start_ckptd(binary, work, name, policy, endpoint=None, s3_extra=""):
    data = os.path.join(work, name)
    config = os.path.join(work, name + ".toml")
    with open(config, "w") as f:
        f.write("[retention]\ninterval_seconds = 0\n")
        if endpoint:
            f.write(f'[s3]\nendpoint = "{endpoint}"\nbucket = "{BUCKET}"\nprefix = "{name}"\n'
                    f'access_key = "{ACCESS}"\nsecret_key = "{SECRET}"\n'
                    f'advertise_url = "http://127.0.0.1:1"\n{s3_extra}')
    ready = data + ".ready"
    proc = subprocess.Popen([binary, "--config", config, "--listen", "127.0.0.1:0", "--data-dir",
                             data, "--ready-file", ready, "--log-level", "warn"],
                            stdout=open(os.path.join(work, name + ".log"), "w"),
                            stderr=subprocess.STDOUT)
    for _ in range(3000):
        if os.path.exists(ready) and open(ready).read().strip():
            break
        if proc.poll() is not None:
            raise SystemExit(f"ckptd ({name}) exited: see {work}/{name}.log")
        time.sleep(0.01)
    port = int(open(ready).read())
    status, body = http_request(port, "PUT", "/v1/models/m/policy", policy.encode())
    if status != 200:
        raise SystemExit(f"policy: {status} {body[:200]!r}")
    return proc, port


def through_ckptd(port, files, on_pushed=lambda: None):
    """(push seconds, restore seconds, stored bytes); calls on_pushed between the two."""
    t0 = time.perf_counter()
    for v, path in enumerate(files, start=1):
        status, body = http_request(port, "PUT", f"/v1/models/m/versions/{v}",
                                    open(path, "rb").read())
        if status != 201:
            raise SystemExit(f"push {v}: {status} {body[:300]!r}")
    push = time.perf_counter() - t0
    on_pushed()
    t0 = time.perf_counter()
    for v in range(1, len(files) + 1):
        status, body = http_request(port, "GET", f"/v1/models/m/versions/{v}")
        if status != 200:
            raise SystemExit(f"restore {v}: {status}")
    restore = time.perf_counter() - t0
    stored = json.loads(http_request(port, "GET", "/v1/models/m")[1])["stored_bytes"]
    return push, restore, stored


def through_ckptd_on_s3(binary, work, name, policy, endpoint, files, aws, aws_env, procs,
                        s3_extra=""):
    """ckptd on S3 under prefix `name`: the figures of one run, and the bucket's objects."""
    proc, port = start_ckptd(binary, work, name, policy, endpoint, s3_extra)
    procs.append(proc)
    requests0 = metric(port, "ckptd_s3_requests_total")
    marks = []
    t_push, t_restore, stored = through_ckptd(
        port, files, lambda: marks.append(metric(port, "ckptd_s3_requests_total")))
    requests = metric(port, "ckptd_s3_requests_total") - requests0
    listing = subprocess.run(aws + ["ls", "--recursive", "--summarize", f"s3://{BUCKET}/{name}/"],
                             env=aws_env, check=True, capture_output=True, text=True).stdout
    return {
        "push": t_push, "restore": t_restore, "stored": stored, "requests": requests,
        "push_requests": marks[0] - requests0,
        "sent": metric(port, "ckptd_s3_sent_bytes_total"),
        "received": metric(port, "ckptd_s3_received_bytes_total"),
        "bucket_bytes": int(next(line.split(":")[1] for line in listing.splitlines()
                                 if "Total Size" in line)),
        "objects": int(next(line.split(":")[1] for line in listing.splitlines()
                            if "Total Objects" in line)),
    }


def timed(commands, env=None):
    t0 = time.perf_counter()
    for command in commands:
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - t0


def multipart_requests(size, part):
    return 1 if size <= part else 2 + math.ceil(size / part)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\nUsage:")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ckpt_dir")
    parser.add_argument("build_dir")
    parser.add_argument("--policy", default='{"mode":"lossless"}')
    parser.add_argument("--versions", type=int, default=0, help="the first N files (0: all)")
    args = parser.parse_args()
    files = sorted(glob.glob(os.path.join(args.ckpt_dir, "*.safetensors")))
    if args.versions:
        files = files[:args.versions]
    raw = sum(os.path.getsize(f) for f in files)
    for tool in ("radosgw", "/usr/bin/aws", "s3cmd"):
        if not shutil.which(tool):
            print(f"skipped: {tool} is not installed (scripts/install-deps.sh --bench)")
            return 77
    binary = os.path.join(args.build_dir, "daemon", "ckptd")
    work = tempfile.mkdtemp(prefix="ckptd-s3-bench-")
    script = os.path.join(HERE, "..", "scripts", "ceph-one-node.sh")
    ceph = os.path.join(work, "ceph")
    procs = []
    try:
        env = dict(os.environ, CEPH_MON_PORT=str(free_port()), CEPH_MON_PORT_V1=str(free_port()),
                   S3_ACCESS_KEY=ACCESS, S3_SECRET_KEY=SECRET)
        subprocess.run([script, "start", ceph], env=env, check=True, stdout=subprocess.DEVNULL)
        out = subprocess.run([script, "start-rgw", ceph, str(free_port())], env=env, check=True,
                             capture_output=True, text=True).stdout
        endpoint = next(line.split("=", 1)[1] for line in out.splitlines()
                        if line.startswith("S3_ENDPOINT="))
        aws_env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS, AWS_SECRET_ACCESS_KEY=SECRET,
                       AWS_DEFAULT_REGION="us-east-1", AWS_PAGER="")
        aws = ["/usr/bin/aws", "--endpoint-url", endpoint, "s3"]
        subprocess.run(aws + ["mb", f"s3://{BUCKET}"], env=aws_env, check=True,
                       stdout=subprocess.DEVNULL)
        host = endpoint.split("://", 1)[1]
        s3cmd = ["s3cmd", "--access_key", ACCESS, "--secret_key", SECRET, "--host", host,
                 "--host-bucket", host, "--no-ssl", "--no-progress", "-q", "--config",
                 "/dev/null"]

        rows = []
        # ckptd on S3: records packed, then an object per record.
        runs = {}
        for name, label, extra in (("s3", "ckptd on S3", ""),
                                   ("s3-single", "ckptd on S3, an object per record",
                                    "pack_bytes = 0\n")):
            r = through_ckptd_on_s3(binary, work, name, args.policy, endpoint, files, aws, aws_env,
                                    procs, extra)
            runs[name] = r
            rows.append((label, r["push"], r["restore"],
                         (r["push_requests"], r["requests"] - r["push_requests"]), r["stored"]))
        # ckptd on its disk, same policy.
        lproc, lport = start_ckptd(binary, work, "local", args.policy)
        procs.append(lproc)
        l_push, l_restore, l_stored = through_ckptd(lport, files)
        rows.append(("ckptd on its local disk", l_push, l_restore, None, l_stored))
        # aws s3 cp.
        down = os.path.join(work, "down")
        os.makedirs(down)
        up = timed([aws + ["cp", f, f"s3://{BUCKET}/aws/{os.path.basename(f)}", "--quiet"]
                    for f in files], aws_env)
        back = timed([aws + ["cp", f"s3://{BUCKET}/aws/{os.path.basename(f)}",
                             os.path.join(down, os.path.basename(f)), "--quiet"] for f in files],
                     aws_env)
        aws_requests = (sum(multipart_requests(os.path.getsize(f), 8 * MIB) for f in files),
                        sum(1 + math.ceil(os.path.getsize(f) / (8 * MIB)) for f in files))
        rows.append(("`aws s3 cp` of the files", up, back, aws_requests, raw))
        # s3cmd.
        up = timed([s3cmd + ["put", f, f"s3://{BUCKET}/s3cmd/{os.path.basename(f)}"]
                    for f in files])
        back = timed([s3cmd + ["get", "--force", f"s3://{BUCKET}/s3cmd/{os.path.basename(f)}",
                               os.path.join(down, os.path.basename(f))] for f in files])
        s3cmd_requests = (sum(multipart_requests(os.path.getsize(f), 15 * MIB) for f in files),
                          len(files))
        rows.append(("`s3cmd put` / `get` of the files", up, back, s3cmd_requests, raw))

        version = subprocess.run(["radosgw", "--version"], capture_output=True,
                                 text=True).stdout.split("(")[0].strip()
        print(f"{len(files)} checkpoints, {raw / 1e6:.1f} MB raw, policy {args.policy}; "
              f"{version} on a one-node cluster, loopback\n")
        print("| store | push MB/s | restore MB/s | requests per GB pushed / restored | stored | "
              "cost of the run |")
        print("|---|---|---|---|---|---|")
        gb = raw / 1e9
        for name, t_up, t_down, reqs, kept in rows:
            if reqs is None:
                cost = "—"
                per_gb = "—"
            else:
                # Requests of the pushes priced as PUTs, of the restores as GETs.
                cost = f"${reqs[0] * PUT_PRICE + reqs[1] * GET_PRICE + kept / 1e9 * GB_MONTH_PRICE:.4f}"
                per_gb = f"{reqs[0] / gb:.0f} / {reqs[1] / gb:.0f}"
            print(f"| {name} | {raw / 1e6 / t_up:.0f} | {raw / 1e6 / t_down:.0f} | {per_gb} | "
                  f"{kept / 1e6:.2f} MB ({raw / kept:.2f}x) | {cost} |")
        for name, r in runs.items():
            print(f"\nckptd on S3 (prefix {name}): {int(r['requests'])} requests, "
                  f"{r['sent'] / 1e6:.1f} MB sent, {r['received'] / 1e6:.1f} MB received; the "
                  f"bucket holds {r['objects']} objects, {r['bucket_bytes'] / 1e6:.2f} MB under "
                  f"its prefix; stored bytes {r['stored']} vs {l_stored} on the local disk "
                  f"({(r['stored'] / l_stored - 1) * 100:+.2f}%).")
        print(f"Cost: the pushes' requests at ${PUT_PRICE * 1000:.3f} per 1,000 (ckptd's include "
              f"its reads and listings while pushing), the restores' at "
              f"${GET_PRICE * 1000:.4f}, and one month of the stored bytes at "
              f"${GB_MONTH_PRICE}/GB.")
        return 0
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
        subprocess.run([script, "stop", ceph], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
