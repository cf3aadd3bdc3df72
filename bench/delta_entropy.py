#!/usr/bin/python3
"""What a checkpoint sequence allows under an absolute error bound: a numpy model of the
closed-loop lattice quantizer, with the figures the lossy-mode issue and docs/benchmarks.md
compare ckptd against.

Every float32 element of version t is quantized to the lattice point k_t = round(x / (2 * bound))
(non-finite elements count as 0); version 1 is coded as k_1, later versions as the moves
s_t = k_t - k_(t-1). Per tensor and version (as the issue counts them):
  plain      s_t as int8 (clipped) through `zstd -3`: a plain closed-loop quantizer with zstd
  order0     the order-0 Shannon entropy of s_t (a perfect static coder, no context)
  moves      the share of elements with s_t != 0
Both ratios are raw bytes of the files / coded bytes. With --contexts, the conditional entropy
of the moves of finite 2-D tensors of at least 4096 elements (bits/element over every delta)
  history     the element's history state (ckptd's 8 states: direction of its last move x
              versions since, 0..3+; keyframes start at 3)
  rows+cols   history x 4 classes of the activity of its row and column: the share of the
              row's and column's elements that moved in the previous version, relative to the
              tensor's (thresholds 0.5, 1, 2 on the product), 32 contexts
  split       "moved or not" in the rows+cols contexts, the move itself in the history ones
  blocks256   history x 4 classes of the same activity over aligned blocks of 256 elements of
              the flattened tensor (what a codec that sees flat chunks could use)
under each model (table costs not counted).

Usage: /usr/bin/python3 bench/delta_entropy.py CKPT_DIR [--bound 5e-3] [--contexts]
Prints one JSON object.
"""
import argparse
import glob
import json
import struct
import subprocess

import numpy as np


def load_f32(path):
    """The float32 tensors of a safetensors file, by name, flattened."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        out[name] = (np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=np.float32),
                     info["shape"])
    return out, len(raw)


def entropy_bits(symbols, contexts=None):
    """Total Shannon entropy of `symbols` in bits, conditioned on `contexts` when given."""
    symbols = np.clip(symbols, -2000, 2000).astype(np.int64) + 2048
    key = symbols if contexts is None else contexts.astype(np.int64) * 4096 + symbols
    _, counts = np.unique(key, return_counts=True)
    if contexts is None:
        p = counts / counts.sum()
        return float(-(counts * np.log2(p)).sum())
    unique_keys = np.unique(key)
    context_of_key = unique_keys // 4096
    total = 0.0
    for c in np.unique(context_of_key):
        cc = counts[context_of_key == c].astype(float)
        total -= float((cc * np.log2(cc / cc.sum())).sum())
    return total


def zstd3_bytes(symbols):
    data = np.clip(symbols, -128, 127).astype(np.int8).tobytes()
    return len(subprocess.run(["zstd", "-3", "-c"], input=data, capture_output=True,
                              check=True).stdout)


def next_history(state, move):
    """ckptd's element history update (docs/format.md, "Element history")."""
    return np.where(move > 0, 4,
                    np.where(move < 0, 0, (state & 4) | np.minimum((state & 3) + 1, 3)))


def activity_classes(relative):
    return np.digitize(relative, (0.5, 1.0, 2.0))


def context_study(move, state, shape, acc):
    """Adds the conditional entropies of one 2-D tensor's moves to `acc`."""
    rows, cols = shape
    s, h = move.reshape(rows, cols), state.reshape(rows, cols)
    acc["history"] += entropy_bits(s.ravel(), h.ravel())
    moved = ((h & 3) == 0).astype(float)  # moved in the previous version
    mean = moved.mean() + 1e-9
    relative = np.outer(moved.mean(1), moved.mean(0)) / (mean * mean)
    act = activity_classes(relative)
    rich = h * 4 + act
    acc["rows+cols"] += entropy_bits(s.ravel(), rich.ravel())
    nonzero = s != 0
    acc["split"] += (entropy_bits(nonzero.ravel().astype(np.int64), rich.ravel()) +
                     entropy_bits(s[nonzero], h[nonzero]))
    flat = moved.ravel()
    if flat.size % 256 == 0:
        blocks = np.repeat(flat.reshape(-1, 256).mean(1), 256) / mean
        acc["blocks256"] += entropy_bits(s.ravel(), (h.ravel() * 4 + activity_classes(blocks)))
    else:
        acc["blocks256"] += entropy_bits(s.ravel(), h.ravel())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--bound", type=float, default=5e-3)
    parser.add_argument("--contexts", action="store_true")
    args = parser.parse_args()
    step = 2 * args.bound
    files = sorted(glob.glob(args.ckpt_dir + "/*.safetensors"))
    raw_bytes = order0_bits = plain_bytes = 0
    per_version_bits, per_version_moves = [], []
    previous, history = None, {}
    acc = {"order0": 0.0, "history": 0.0, "rows+cols": 0.0, "split": 0.0, "blocks256": 0.0}
    study_elements = 0
    for path in files:
        tensors, size = load_f32(path)
        raw_bytes += size
        lattice = {}
        bits = elements = moved = 0
        for name, (x, shape) in tensors.items():
            k = np.where(np.isfinite(x), np.round(x.astype(np.float64) / step), 0).astype(np.int64)
            lattice[name] = k
            continues = (previous is not None and name in previous and
                         previous[name].shape == k.shape)
            s = k - previous[name] if continues else k  # else coded as a keyframe
            b = entropy_bits(s)
            bits += b
            elements += s.size
            moved += int((s != 0).sum())
            plain_bytes += zstd3_bytes(s)
            studied = (args.contexts and len(shape) == 2 and x.size >= 4096 and
                       bool(np.isfinite(x).all()))
            if studied and continues and name in history:
                acc["order0"] += b
                context_study(s, history[name], shape, acc)
                study_elements += s.size
            if studied:
                history[name] = (next_history(history[name], s) if continues and name in history
                                 else np.full(s.shape, 3, np.int64))
        order0_bits += bits
        per_version_bits.append(bits / elements)
        per_version_moves.append(moved / elements)
        previous = lattice
    result = {
        "dir": args.ckpt_dir, "versions": len(files), "raw_bytes": raw_bytes, "bound": args.bound,
        "plain_zstd3_ratio": round(raw_bytes / plain_bytes, 2),
        "order0_ratio": round(raw_bytes / (order0_bits / 8), 2),
        "keyframe_bits_per_element": round(per_version_bits[0], 3),
        "delta_bits_per_element_median": round(float(np.median(per_version_bits[1:])), 3),
        "moves_median": round(float(np.median(per_version_moves[1:])), 3),
    }
    if args.contexts and study_elements:
        result["contexts_bits_per_element"] = {k: round(v / study_elements, 4)
                                               for k, v in acc.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
