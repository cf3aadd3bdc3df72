#!/usr/bin/python3
"""How far lossless coding of a checkpoint sequence is from its limit: the XOR deltas of
consecutive versions, split into byte planes as ckptd's lossless codec splits them, measured
against what zstd level 1 (the codec's plane coder) stores of them today.

Every float tensor of version t (t > 1) is XORed with the same tensor of version t - 1 as
unsigned integers of its element size and cut into chunks of --chunk-mib (each plane of a chunk
is coded on its own, as in a push). Per plane of every chunk:
  zstd-1     `zstd -1` of the plane, or the plane as is where that is not 2% smaller: the codec
  order0     an adaptive order-0 coder of the plane's bytes (its code length, learning
             included: what a context-modelled rANS with adaptive tables would approach)
  ref-exp    the same in the context of the reference element's top byte (its sign and the
             high bits of its exponent, which say how large the element is)
  above      in the context of the XOR byte of the plane above of the same element (the
             exponent's change, for the top mantissa bits)
  ref+above  in both contexts (256 x 256)
Sizes are summed over the run, with the zstd-1 bytes of the planes no context model would code
(the low mantissa planes) added to every total so each is a whole run's lossless payloads.
--dtype bf16 rounds every F32 element to bfloat16 first (round to nearest even), as a bf16
training run's checkpoints would hold.

Usage: /usr/bin/python3 bench/lossless_entropy.py CKPT_DIR [--dtype f32|bf16] [--chunk-mib 4]
Prints a table (Markdown) and the decision figure: the share of today's payload bytes a coder
at the best context entropy of the top two planes would save.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
from scipy.special import gammaln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import safetensors_arrays  # noqa: E402


def load_floats(path, dtype):
    """The floating-point tensors of a safetensors file as unsigned integers of their width."""
    out = safetensors_arrays(path, {"F32": np.uint32, "BF16": np.uint16, "F16": np.uint16})
    for name, bits in out.items():
        if bits.dtype == np.uint32 and dtype == "bf16":
            # Round to nearest even on the upper 16 bits (NaNs do not occur in these runs).
            rounding = ((bits >> 16) & 1) + 0x7FFF
            out[name] = ((bits + rounding) >> 16).astype(np.uint16)
    return out


def code_bits(symbols, contexts=None):
    """Bits an adaptive coder spends on the byte array `symbols` in the contexts `contexts`:
    the Krichevsky-Trofimov code length per context, which depends only on the final counts
    and includes what learning each context's statistics costs (no table is sent)."""
    if contexts is None:
        contexts = np.zeros(symbols.size, dtype=np.int64)
    contexts = contexts.astype(np.int64)
    joint = np.bincount(contexts * 256 + symbols)
    nz = joint[joint > 0].astype(np.float64)
    per_context = np.bincount(contexts)
    n = per_context[per_context > 0].astype(np.float64)
    nats = ((gammaln(n + 128.0) - gammaln(128.0)).sum() - (gammaln(nz + 0.5) - gammaln(0.5)).sum())
    return float(nats / np.log(2))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpt_dir")
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    parser.add_argument("--chunk-mib", type=float, default=4)
    args = parser.parse_args()
    files = sorted(glob.glob(os.path.join(args.ckpt_dir, "*.safetensors")))
    width = 4 if args.dtype == "f32" else 2
    top, second = width - 1, width - 2  # the sign/exponent plane and the one below it
    ways = ["zstd-1", "order0", "ref-exp", "above", "ref+above"]
    totals = {plane: dict.fromkeys(ways, 0.0) for plane in range(width)}
    raw_bytes = 0
    planes_dir = tempfile.mkdtemp(prefix="ckpt-lossless-entropy-")
    plane_files = []  # (plane, path)
    previous = load_floats(files[0], args.dtype)
    for path in files[1:]:
        current = load_floats(path, args.dtype)
        for name, bits in current.items():
            ref = previous.get(name)
            if ref is None or ref.size != bits.size:
                continue
            chunk = max(1, int(args.chunk_mib * (1 << 20)) // width)
            for begin in range(0, bits.size, chunk):
                x = bits[begin:begin + chunk]
                r = ref[begin:begin + chunk]
                delta = (x ^ r).view(np.uint8).reshape(-1, width)
                ref_top = r.view(np.uint8).reshape(-1, width)[:, top]
                raw_bytes += delta.size
                for plane in range(width):
                    symbols = np.ascontiguousarray(delta[:, plane])
                    file = os.path.join(planes_dir, f"{len(plane_files)}.plane")
                    symbols.tofile(file)
                    plane_files.append((plane, file))
                    if plane not in (top, second):
                        continue  # the low mantissa planes: zstd-1 only (near random)
                    t = totals[plane]
                    t["order0"] += code_bits(symbols) / 8
                    t["ref-exp"] += code_bits(symbols, ref_top) / 8
                    if plane == top:  # no plane above it
                        t["above"] = t["order0"]
                        t["ref+above"] = t["ref-exp"]
                        continue
                    above = delta[:, plane + 1]
                    t["above"] += code_bits(symbols, above) / 8
                    t["ref+above"] += code_bits(symbols,
                                                ref_top.astype(np.int64) * 256 + above) / 8
        previous = current
    # One zstd process for every plane file; the codec stores a plane that does not shrink.
    subprocess.run(["zstd", "-1", "-q", "-f"] + [f for _, f in plane_files], check=True)
    for plane, file in plane_files:
        size = os.path.getsize(file)
        zst = os.path.getsize(file + ".zst")
        totals[plane]["zstd-1"] += size if zst > 0.98 * size else zst
        os.remove(file)
        os.remove(file + ".zst")
    os.rmdir(planes_dir)

    low_planes = sum(totals[p]["zstd-1"] for p in range(width) if p not in (top, second))
    print(f"{len(files)} files, {args.dtype}, XOR deltas of {raw_bytes / 1e6:.1f} MB "
          f"({len(files) - 1} versions), chunks of {args.chunk_mib} MiB\n")
    print("| plane | " + " | ".join(f"{w} MB" for w in ways) + " |")
    print("|---|" + "---|" * len(ways))
    names = {top: "top (sign, exponent)", second: "second (exponent, top mantissa)"}
    for plane in reversed(range(width)):
        row = totals[plane]
        coded = plane in (top, second)
        print(f"| {names.get(plane, f'mantissa {plane}')} | " +
              " | ".join(f"{row[w] / 1e6:.2f}" if coded or w == "zstd-1" else "" for w in ways) +
              " |")
    whole = {w: low_planes + totals[top][w] + totals[second][w] for w in ways}
    print("| every plane (low planes at zstd-1) | " +
          " | ".join(f"{whole[w] / 1e6:.2f}" for w in ways) + " |")
    best = min(whole[w] for w in ways if w != "zstd-1")
    print(f"\nbest context model on the top two planes: {best / 1e6:.2f} MB against "
          f"{whole['zstd-1'] / 1e6:.2f} MB today: {(1 - best / whole['zstd-1']) * 100:.1f}% "
          "smaller")


if __name__ == "__main__":
    main()
