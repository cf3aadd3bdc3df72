#!/usr/bin/python3
"""Writes COUNT synthetic safetensors checkpoints of about SIZE_MIB each: eight large F32 weight
tensors (Gaussian, std 0.02) plus a few small ones, drifting between versions like training does
(two thirds of the weights move by N(0, 1e-4) per version, one third stays frozen).

Usage: /usr/bin/python3 bench/synthetic_checkpoints.py SIZE_MIB COUNT OUT_DIR
"""
import json
import os
import struct
import sys

import numpy as np


def main():
    size_mib, count, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    per_tensor = size_mib * 1024 * 1024 // 4 // 8
    weights = [rng.standard_normal(per_tensor, dtype=np.float32) * np.float32(0.02)
               for _ in range(8)]
    frozen = [rng.random(per_tensor) < 1 / 3 for _ in range(8)]
    bias = rng.standard_normal(4096, dtype=np.float32)
    for v in range(1, count + 1):
        if v > 1:
            for w, f in zip(weights, frozen):
                step = rng.standard_normal(per_tensor, dtype=np.float32) * np.float32(1e-4)
                step[f] = 0
                w += step
            bias += rng.standard_normal(bias.size, dtype=np.float32) * np.float32(1e-4)
        tensors = [(f"layer{i}.weight", "F32", [per_tensor // 1024, 1024], w)
                   for i, w in enumerate(weights)]
        tensors.append(("head.bias", "F32", [bias.size], bias))
        tensors.append(("step", "I64", [], np.array(v, dtype=np.int64)))
        header, offset = {"__metadata__": {"step": str(v)}}, 0
        for name, dtype, shape, arr in tensors:
            header[name] = {"dtype": dtype, "shape": shape,
                            "data_offsets": [offset, offset + arr.nbytes]}
            offset += arr.nbytes
        text = json.dumps(header).encode()
        text += b" " * ((8 - len(text) % 8) % 8)
        path = os.path.join(out, f"v{v:04d}.safetensors")
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, _, _, arr in tensors:
                f.write(arr.tobytes())
        print(path, os.path.getsize(path), flush=True)


if __name__ == "__main__":
    main()
