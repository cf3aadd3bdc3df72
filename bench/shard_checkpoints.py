#!/usr/bin/python3
"""Writes a synthetic sharded run for bench/shard_bench.sh: VERSIONS versions of a checkpoint of
TENSORS float32 matrices (MIB MiB in all), each version a little moved from the one before
(as consecutive training checkpoints are), as one whole safetensors file per version and as
RANKS shard files per version (each matrix split by rows, or with --split columns by columns as
a row-parallel layer's weight is; slices declared under ckptd.slices).

Usage: shard_checkpoints.py OUT_DIR [--versions 4] [--ranks 4] [--mib 256] [--tensors 16]
                            [--split rows|columns]
"""
import argparse
import json
import os
import struct

import numpy as np


def write_safetensors(path, tensors, metadata):
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, array in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array).tobytes())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--tensors", type=int, default=16)
    parser.add_argument("--split", choices=["rows", "columns"], default="rows")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(1)
    cols = 1024
    rows = args.mib * (1 << 20) // 4 // args.tensors // cols
    weights = {f"layers.{i}.weight": rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
               for i in range(args.tensors)}
    for version in range(1, args.versions + 1):
        for w in weights.values():  # a small update, as an optimizer step makes
            w += rng.standard_normal(w.shape, dtype=np.float32) * 1e-4
        write_safetensors(os.path.join(args.out, f"whole-{version:03d}.safetensors"), weights, {})
        for rank in range(args.ranks):
            if args.split == "rows":
                part = rows // args.ranks
                tensors = {n: w[rank * part:(rank + 1) * part] for n, w in weights.items()}
                offsets = [rank * part, 0]
            else:
                part = cols // args.ranks
                tensors = {n: w[:, rank * part:(rank + 1) * part] for n, w in weights.items()}
                offsets = [0, rank * part]
            slices = {n: {"global_shape": [rows, cols], "offsets": offsets} for n in weights}
            write_safetensors(
                os.path.join(args.out, f"shard-{version:03d}-{rank}.safetensors"), tensors,
                {"ckptd.slices": json.dumps(slices)})


if __name__ == "__main__":
    main()
