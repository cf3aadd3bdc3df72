#!/usr/bin/python3
"""What Adam's first moment would cost under a bound relative to the update instead of to each
element: a numpy model for the optimizer-state rows of docs/benchmarks.md.

For every `*.exp_avg` tensor m of the checkpoints (with its `*.exp_avg_sq` v), the order-0
Shannon entropy (bits/element, table costs not counted) of
  pointwise  ckptd's `max_pointwise_rel_error` eps: |error| <= eps * |m|, coded as the sign and
             round(log2|m| / (2 * log2(1 + eps))) (the log quantizer in absolute mode)
  update     a bound relative to Adam's update scale: |error| <= eps * (sqrt(v) + 1e-8), coded as
             round(m / (2 * eps * (sqrt(v) + 1e-8))); an update m / (sqrt(v) + 1e-8) then moves by
             at most eps, in units of the learning rate
Checkpoints 30 steps apart share almost nothing of m (momentum renews it within ~10 steps), so
both are coded without a delta.

Usage: /usr/bin/python3 bench/moment_entropy.py CKPT_DIR [--eps 1e-2 5e-2] [--every 4]
Prints one line per eps.
"""
import argparse
import glob
import json
import struct

import numpy as np


def load_f32(path):
    with open(path, "rb") as f:
        body = f.read()
    n = struct.unpack("<Q", body[:8])[0]
    header = json.loads(body[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        if t["dtype"] == "F32":
            begin, end = t["data_offsets"]
            out[name] = np.frombuffer(body[8 + n + begin:8 + n + end], dtype=np.float32)
    return out


def entropy_bits(symbols):
    _, counts = np.unique(symbols, return_counts=True)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum() * symbols.size)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--eps", type=float, nargs="+", default=[1e-2, 5e-2])
    parser.add_argument("--every", type=int, default=4, help="use every Nth checkpoint")
    args = parser.parse_args()
    files = sorted(glob.glob(args.ckpt_dir + "/*.safetensors"))[::args.every]
    states = [load_f32(f) for f in files]
    for eps in args.eps:
        pointwise = update = elements = 0.0
        for state in states:
            for name, m in state.items():
                if not name.endswith(".exp_avg") or name + "_sq" not in state:
                    continue
                m = m.astype(np.float64)
                v = state[name + "_sq"].astype(np.float64)
                nonzero = m != 0
                pitch = 2 * np.log2(1 + eps)
                magnitude = np.round(np.log2(np.abs(np.where(nonzero, m, 1))) / pitch)
                pointwise += entropy_bits(np.where(nonzero, np.sign(m) * (magnitude + 1e5), 0))
                update += entropy_bits(np.round(m / (2 * eps * (np.sqrt(v) + 1e-8))))
                elements += m.size
        print(f"eps {eps:g}: exp_avg bits/element, pointwise {pointwise / elements:.2f}, "
              f"update-relative {update / elements:.2f} ({len(files)} checkpoints)")


if __name__ == "__main__":
    main()
