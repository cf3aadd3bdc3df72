#!/usr/bin/python3
"""End-to-end lossy benchmark: real checkpoints through the real daemon, restored and evaluated.

For each policy: start ckptd on a fresh data directory (loopback, ephemeral port), set the
policy, push every checkpoint over HTTP, shut down cleanly, measure the data directory as `du`
counts it (WAL, logs, RocksDB files: everything), restart, restore every version, check the
bound element by element, and evaluate every restored model (held-out loss, accuracy for
digits). In the same run, on the same files, reimplemented baselines:
  zstd -3      every file, lossless
  fp16 / bf16  plain casts of the float tensors
  Delta-DNN    closed-loop error-bounded uniform delta (bin 2*bound), symbols + zstd -3, no
               adaptive choice (Hu et al., ICPP 2020)
  LC-Checkpoint closed-loop delta, exponent buckets (sign, binary exponent) represented by the
               midpoint of each bucket's min and max, priority promotion keeping the 2^3-1
               largest buckets (the rest become 0), Huffman-coded symbols (Chen et al., ICML
               2020); the first version is stored lossless (zstd -3)
Prints one markdown table (and writes it with --out).

Usage:
  /usr/bin/python3 bench/lossy_eval.py CKPT_DIR --workload charlm --layers 4 \\
      --policy 'all-5e-3={"mode":"lossy","max_abs_error":5e-3,"lossless_tensors":[]}' \\
      [--policy NAME=JSON ...] [--bound 5e-3] [--build build-release] [--out FILE] [--gpt-style|--norm-first]
      [--baselines] [--save-restored DIR]
--bound sets the error bound of the Delta-DNN baseline (default: 5e-3).
"""
import argparse
import glob
import heapq
import json
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_checkpoints as tc  # noqa: E402
from benchlib import Daemon, du_bytes, push_versions  # noqa: E402

NP_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
            "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_, "BF16": np.uint16}


def parse(body):
    """safetensors bytes -> (header dict, {name: numpy array}) (BF16 as raw uint16)."""
    (n,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(body[base + b: base + e], dtype=NP_TYPES[info["dtype"]])
    return header, out


def tensors_for_eval(header, arrays):
    import torch
    out = {}
    for name, a in arrays.items():
        t = torch.from_numpy(a.copy()).reshape(header[name]["shape"])
        out[name] = t.view(torch.bfloat16) if header[name]["dtype"] == "BF16" else t
    return out


class Evaluator:
    def __init__(self, workload, layers, gpt_style=False, norm_first=False):
        args = argparse.Namespace(layers=layers, lr=None, dropout=0.0, batch_size=32, context=128,
                                  gpt_style=gpt_style, norm_first=norm_first)
        self.model, _, _, self.evaluate, _ = tc.WORKLOADS[workload](args)

    def __call__(self, header, arrays):
        import torch
        tensors = tensors_for_eval(header, arrays)
        self.model.load_state_dict({k[len("model."):]: v.float() if v.is_floating_point() else v
                                    for k, v in tensors.items() if k.startswith("model.")})
        with torch.no_grad():
            return self.evaluate(self.model)


def zstd_size(data, level=3):
    return len(subprocess.run(["zstd", f"-{level}", "-c", "-q"], input=data,
                              stdout=subprocess.PIPE, check=True).stdout)


def huffman_bits(counts):
    """Total bits of an optimal prefix code for symbol counts (lengths from Huffman's algorithm)."""
    counts = [c for c in counts if c > 0]
    if len(counts) <= 1:
        return sum(counts)  # one symbol still needs a bit each in a Huffman code
    heap = [(c, i, 0) for i, c in enumerate(counts)]
    heapq.heapify(heap)
    total = 0
    uid = len(counts)
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        total += a[0] + b[0]  # every merge adds one bit to each symbol below it
        heapq.heappush(heap, (a[0] + b[0], uid, 0))
        uid += 1
    return total


def float_names(header):
    return [n for n, i in header.items() if n != "__metadata__" and i["dtype"] == "F32"]


def closed_loop_baseline(files, code_tensor):
    """Runs a closed-loop baseline over the versions. code_tensor(array, reference or None,
    version index) returns (stored bytes, reconstruction as float64) for one F32 tensor; other
    tensors (and non-finite ones) are stored with zstd -3. Returns (stored bytes, versions)."""
    recon, stored, versions = {}, 0, []
    for index, body in enumerate(files):
        header, arrays = parse(body)
        out = dict(arrays)
        stored += 8 + struct.unpack("<Q", body[:8])[0]
        for name, a in arrays.items():
            if header[name]["dtype"] != "F32" or not np.isfinite(a).all():
                stored += zstd_size(a.tobytes())
                continue
            size, r = code_tensor(a, recon.get(name), index)
            stored += size
            recon[name] = r
            out[name] = r.astype(np.float32)
        versions.append((header, out))
    return stored, versions


def baseline_delta_dnn(files, bound):
    """Closed-loop error-bounded uniform delta (bin width 2*bound) + zstd -3 of the symbols."""
    step = 2 * bound

    def code(a, ref, _):
        ref = np.zeros_like(a, dtype=np.float64) if ref is None else ref
        q = np.round((a.astype(np.float64) - ref) / step).astype(np.int64)
        width = np.int8 if np.abs(q).max(initial=0) < 127 else np.int32
        r = (ref + q * step).astype(np.float32).astype(np.float64)
        return zstd_size(q.astype(width).tobytes()), r

    return closed_loop_baseline(files, code)


def baseline_lc_checkpoint(files, bits=3):
    """LC-Checkpoint: exponent buckets + priority promotion + Huffman, closed loop; the first
    version is stored lossless (zstd -3)."""
    keep = 2 ** bits - 1

    def code(a, ref, index):
        if index == 0:
            return zstd_size(a.tobytes()), a.astype(np.float64)
        delta = a.astype(np.float64) - ref
        _, exponent = np.frexp(delta)
        key = np.where(delta == 0, -10**6, exponent.astype(np.int64) * 2 + (delta < 0))
        buckets = [k for k in np.unique(key) if k != -10**6]
        reps = {}
        for k in buckets:
            member = delta[key == k]
            reps[k] = (member.max() + member.min()) / 2
        kept = sorted(buckets, key=lambda k: -abs(reps[k]))[:keep]
        symbol = np.zeros(delta.shape, np.int64)
        value = np.zeros_like(delta)
        for s, k in enumerate(kept, start=1):
            mask = key == k
            symbol[mask] = s
            value[mask] = reps[k]
        counts = np.bincount(symbol, minlength=keep + 1)
        size = (huffman_bits(counts.tolist()) + 7) // 8 + 9 * len(kept)  # + codebook
        return size, ref + value

    return closed_loop_baseline(files, code)


def cast_baseline(files, kind):
    versions, stored = [], 0
    for body in files:
        header, arrays = parse(body)
        out = dict(arrays)
        for name, a in arrays.items():
            if header[name]["dtype"] != "F32":
                stored += a.nbytes
                continue
            if kind == "fp16":
                out[name] = a.astype(np.float16).astype(np.float32)
                stored += a.size * 2
            else:
                bits = a.view(np.uint32).astype(np.uint64)
                rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
                out[name] = rounded.astype(np.uint32).view(np.float32)
                stored += a.size * 2
        stored += 8 + struct.unpack("<Q", body[:8])[0]
        versions.append((header, out))
    return stored, versions


def check_bound(pushed, restored, detail):
    """Every element of every tensor within the bound the daemon applied (exact if lossless).
    Returns the worst |error| / bound over lossy tensors."""
    header, a = parse(pushed)
    _, b = parse(restored)
    worst = 0.0
    for t in detail["tensors"]:
        name = t["name"]
        x, r = a[name], b[name]
        if t["codec"] == "lossless":
            if x.tobytes() != r.tobytes():
                raise AssertionError(f"lossless tensor {name} differs")
            continue
        pointwise = "max_pointwise_rel_error" in t
        bound = t["max_pointwise_rel_error"] if pointwise else t["max_abs_error"]
        xf = x.astype(np.float64) if header[name]["dtype"] != "BF16" else \
            (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        rf = r.astype(np.float64) if header[name]["dtype"] != "BF16" else \
            (r.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        finite = np.isfinite(xf)
        if x[~finite].tobytes() != r[~finite].tobytes():
            raise AssertionError(f"non-finite elements of {name} not exact")
        err = np.abs(xf[finite] - rf[finite])
        if pointwise:  # |x - r| <= eps |x|: report the error relative to each element
            scale = np.abs(xf[finite])
            if np.any(err > bound * scale):
                raise AssertionError(f"{name}: pointwise error above {bound}")
            err = np.divide(err, scale, out=np.zeros_like(err), where=scale > 0)
        if err.size and err.max() > bound:
            raise AssertionError(f"{name}: error {err.max()} > bound {bound}")
        if err.size and bound > 0:
            worst = max(worst, float(err.max() / bound))
    return worst


def run_policy(name, policy, files, binary, evaluate, original_metrics, work, save_dir=None,
               names=None):
    data_dir = os.path.join(work, name.replace("/", "_"))
    daemon = Daemon(binary, data_dir)
    daemon.start()
    daemon.request("PUT", "/v1/models/bench/policy", policy.encode())
    push_s, details = push_versions(daemon, "bench", files)
    daemon.stop()
    disk = du_bytes(data_dir)
    daemon.start()  # restores come from the stored chains, after a restart
    # What a restarted training job asks for first: `latest`, cold (its chain is replayed and
    # the decoded chunks refill the reference cache) and then warm (served from the cache).
    latest_s = []
    for _ in range(2):
        t0 = time.perf_counter()
        daemon.request("GET", "/v1/models/bench/versions/latest")
        latest_s.append(time.perf_counter() - t0)
    daemon.stop()
    daemon.start()
    restored = []
    t0 = time.perf_counter()
    for v in range(1, len(files) + 1):
        restored.append(daemon.request("GET", f"/v1/models/bench/versions/{v}"))
    pull_s = time.perf_counter() - t0
    daemon.stop()
    worst_bound = max(check_bound(p, r, d) for p, r, d in zip(files, restored, details))
    if save_dir:
        out = os.path.join(save_dir, name)
        os.makedirs(out, exist_ok=True)
        for body, file_name in zip(restored, names):
            with open(os.path.join(out, file_name), "wb") as f:
                f.write(body)
    changes, accuracy_changes = [], []
    for body, orig in zip(restored, original_metrics):
        header, arrays = parse(body)
        m = evaluate(header, arrays)
        changes.append(100.0 * (m["loss"] - orig["loss"]) / orig["loss"])
        if "accuracy" in m:
            accuracy_changes.append(100.0 * (m["accuracy"] - orig["accuracy"]))
    lossy_elements = sum(t["raw_bytes"] // 4 for d in details for t in d["tensors"]
                         if t["codec"] == "lossy")
    lossy_bits = sum(t["stored_bytes"] * 8 for d in details for t in d["tensors"]
                     if t["codec"] == "lossy")
    entropy_bits = sum(t.get("entropy_bits_per_element", 0) * t["raw_bytes"] / 4
                       for d in details for t in d["tensors"] if t["codec"] == "lossy")
    keyframes = sum(1 for d in details for t in d["tensors"]
                    if t["codec"] == "lossy" and t["kind"] == "keyframe")
    raw = sum(len(b) for b in files)
    return {"name": name, "ratio": raw / disk, "disk": disk,
            "bits": lossy_bits / lossy_elements if lossy_elements else 0.0,
            "entropy": entropy_bits / lossy_elements if lossy_elements else 0.0,
            "worst_loss": max(changes, key=abs), "worst_bound": worst_bound,
            "worst_accuracy": min(accuracy_changes) if accuracy_changes else None,
            "push_mbps": raw / 1e6 / push_s, "pull_mbps": raw / 1e6 / pull_s,
            "latest_cold_mbps": len(files[-1]) / 1e6 / latest_s[0],
            "latest_warm_mbps": len(files[-1]) / 1e6 / latest_s[1],
            "keyframes": keyframes}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--workload", default="charlm")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--gpt-style", action="store_true",
                        help="charlm: checkpoints of train_checkpoints.py --gpt-style")
    parser.add_argument("--norm-first", action="store_true",
                        help="charlm: checkpoints of train_checkpoints.py --norm-first")
    parser.add_argument("--policy", action="append", default=[])
    parser.add_argument("--bound", type=float, default=5e-3)
    parser.add_argument("--build", default="build-release")
    parser.add_argument("--baselines", action="store_true", help="also run the baselines")
    parser.add_argument("--out")
    parser.add_argument("--save-restored", help="write each policy's restored files to DIR/NAME/")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    paths = sorted(glob.glob(os.path.join(args.ckpt_dir, "*.safetensors")))
    files = [open(p, "rb").read() for p in paths]
    raw = sum(len(b) for b in files)
    evaluate = Evaluator(args.workload, args.layers, args.gpt_style, args.norm_first)
    originals = [evaluate(*parse(b)) for b in files]
    print(f"{len(files)} checkpoints, {raw} bytes; held-out loss {originals[0]['loss']:.4f} -> "
          f"{originals[-1]['loss']:.4f}", flush=True)
    lines = ["| method | ratio | bits/element (entropy) | worst held-out loss change | worst error/bound "
             "| push MB/s | restore MB/s | latest after restart, cold / warm MB/s |",
             "|---|---|---|---|---|---|---|---|"]

    def emit(line):
        print(line, flush=True)
        lines.append(line)

    with tempfile.TemporaryDirectory(prefix="ckpt-lossy-") as work:
        binary = os.path.join(args.build, "daemon", "ckptd")
        for spec in args.policy:
            name, policy = spec.split("=", 1)
            r = run_policy(name, policy, files, binary, evaluate, originals, work,
                           args.save_restored, [os.path.basename(p) for p in paths])
            accuracy = "" if r["worst_accuracy"] is None else \
                f" (accuracy {r['worst_accuracy']:+.2f} pt)"
            emit(f"| ckptd {name} `{policy}` | {r['ratio']:.2f}x | {r['bits']:.3f} "
                 f"({r['entropy']:.3f}) | {r['worst_loss']:+.3f}%{accuracy} | "
                 f"{r['worst_bound']:.3f} | {r['push_mbps']:.0f} | {r['pull_mbps']:.0f} | "
                 f"{r['latest_cold_mbps']:.0f} / {r['latest_warm_mbps']:.0f} |")
    if args.baselines:
        z = sum(zstd_size(b) for b in files)
        emit(f"| zstd -3 (lossless) | {raw / z:.2f}x | | 0 | | | | |")
        for label, (stored, versions) in [
                ("fp16 cast", cast_baseline(files, "fp16")),
                ("bf16 cast", cast_baseline(files, "bf16")),
                (f"Delta-DNN (bound {args.bound:g}, zstd -3)", baseline_delta_dnn(files, args.bound)),
                ("LC-Checkpoint (3 bits, Huffman)", baseline_lc_checkpoint(files))]:
            metrics = [evaluate(h, a) for h, a in versions]
            changes = [100.0 * (m["loss"] - o["loss"]) / o["loss"]
                       for m, o in zip(metrics, originals)]
            accuracy = ""
            if "accuracy" in originals[0]:
                worst = min(100.0 * (m["accuracy"] - o["accuracy"])
                            for m, o in zip(metrics, originals))
                accuracy = f" (accuracy {worst:+.2f} pt)"
            emit(f"| {label} | {raw / stored:.2f}x | {8 * stored / (raw / 4):.3f} | "
                 f"{max(changes, key=abs):+.3f}%{accuracy} | | | | |")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
