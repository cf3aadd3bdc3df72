#!/usr/bin/python3
"""Space reclamation benchmark: delete 90% of a model's versions, collect garbage, measure disk.

For each codec policy and each retention policy: start ckptd (release build) on a fresh data
directory, push every checkpoint of CKPT_DIR, shut down cleanly and measure the data directory
as `du` counts it; restart, set the retention policy, run POST /v1/admin/gc (timed), shut down and
measure again. Then restart and check that every kept version restores to the SHA-256 it had.

With --rules-first the model has retention rules while its versions are pushed (a rule that keeps
them all, {"keep_last": 1000000000}, replaced by the measured policy afterwards): ckptd codes
the lattice chains of such models without element history, which makes exact rebases cheaper
(docs/design.md). Without it the model has no rules until the measured policy is set.

"Space those versions used" is the sum of the deleted versions' stored bytes as reported at push
time (what each version added to the store); "freed" is the drop of the data directory on disk.

Usage:
  /usr/bin/python3 bench/gc_eval.py CKPT_DIR [--build build-release] [--out FILE]
      [--codec NAME=JSON ...] [--retention NAME=JSON ...] [--rules-first]
Defaults: codecs lossless (the default policy) and lossy 5e-3 (all tensors); retention
keep_every (2 of 20 versions: the tenth and the twentieth) and keep_last 2.
"""
import argparse
import glob
import hashlib
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import Daemon, du_bytes  # noqa: E402

DEFAULT_CODECS = {
    "lossless": '{"mode":"lossless"}',
    "lossy-5e-3": '{"mode":"lossy","max_abs_error":5e-3,"lossless_tensors":[]}',
}


KEEP_ALL_RULE = json.dumps({"keep_last": 1000000000})


def run(ckpt_files, codec_json, retention_json, binary, work, rules_first):
    data_dir = os.path.join(work, "data")
    daemon = Daemon(binary, data_dir)
    daemon.start()
    daemon.request("PUT", "/v1/models/m/policy", codec_json)
    if rules_first:
        daemon.request("PUT", "/v1/models/m/retention", KEEP_ALL_RULE)
    versions = {}
    for index, path in enumerate(ckpt_files):
        body = open(path, "rb").read()
        version = (index + 1) * 10
        answer = json.loads(daemon.request("PUT", f"/v1/models/m/versions/{version}", body))
        versions[version] = answer
    daemon.stop()
    before = du_bytes(data_dir)

    daemon.start()
    preview = json.loads(daemon.request("POST", "/v1/models/m/retention:preview", retention_json))
    deleted = preview["deleted"]
    deleted_stored = sum(versions[v]["stored_bytes"] for v in deleted)
    daemon.request("PUT", "/v1/models/m/retention", retention_json)
    start = time.monotonic()
    gc = json.loads(daemon.request("POST", "/v1/admin/gc"))
    seconds = time.monotonic() - start
    daemon.stop()
    after = du_bytes(data_dir)

    daemon.start()
    kept = [v for v in versions if v not in deleted]
    for v in kept:
        body = daemon.request("GET", f"/v1/models/m/versions/{v}")
        if hashlib.sha256(body).hexdigest() != versions[v]["sha256"]:
            raise RuntimeError(f"version {v} restores differently after GC")
    daemon.stop()
    report = gc["models"][0]["gc"]
    return {
        "versions": len(versions), "deleted": len(deleted), "before": before, "after": after,
        "deleted_stored": deleted_stored, "freed": before - after, "seconds": seconds,
        "rebased": report["versions_rebased"], "rewritten": report["bytes_rewritten"],
        "retained": report["bytes_retained"],
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--build", default="build-release")
    parser.add_argument("--out")
    parser.add_argument("--codec", action="append", default=[])
    parser.add_argument("--retention", action="append", default=[])
    parser.add_argument("--rules-first", action="store_true",
                        help="give the model retention rules before pushing (see above)")
    args = parser.parse_args()
    files = sorted(glob.glob(os.path.join(args.ckpt_dir, "*.safetensors")),
                   key=lambda p: int("".join(c for c in os.path.basename(p) if c.isdigit())))
    if len(files) < 10:
        sys.exit("need at least 10 checkpoints")
    codecs = dict(c.split("=", 1) for c in args.codec) or DEFAULT_CODECS
    last = len(files) * 10
    retentions = dict(r.split("=", 1) for r in args.retention) or {
        "keep_every": json.dumps({"keep_every": last // 2}),
        "keep_last 2": json.dumps({"keep_last": 2}),
    }
    binary = os.path.join(args.build, "daemon", "ckptd")
    lines = ["| codec | retention | versions kept | data dir before | after | deleted versions' "
             "stored bytes | freed on disk | freed / used | kept versions rebased (bytes "
             "rewritten) | retained for lossy chains | GC time |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for codec_name, codec_json in codecs.items():
        for retention_name, retention_json in retentions.items():
            with tempfile.TemporaryDirectory(prefix="ckpt-gc-") as work:
                r = run(files, codec_json, retention_json, binary, work, args.rules_first)
            mib = 1 << 20
            lines.append(
                f"| {codec_name} | `{retention_json}` | {r['versions'] - r['deleted']} of "
                f"{r['versions']} | {r['before'] / mib:.1f} MiB | {r['after'] / mib:.1f} MiB | "
                f"{r['deleted_stored'] / mib:.1f} MiB | {r['freed'] / mib:.1f} MiB | "
                f"{100 * r['freed'] / max(1, r['deleted_stored']):.0f}% | {r['rebased']} "
                f"({r['rewritten'] / mib:.1f} MiB) | {r['retained'] / mib:.1f} MiB | "
                f"{r['seconds']:.2f} s |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
