#!/usr/bin/python3
"""Optimizer-aware prediction of the weights' next move, measured on a training run that saves
weights with Adam's moments: does predicting each weight's delta from the previous version's
moments shrink what the lossy weights cost at the same bound?

Model (numpy, per weight tensor, version by version, closed loop as ckptd codes a forward chain):
version 1 is the lattice point of each element (step 2 * bound); version t + 1 codes the moves
q = round((x - r - p) / step) against the reconstruction r of version t and a prediction p the
decoder can compute too, and reconstructs r + p + q * step (every element within the bound).
  today      p = 0: the moves ckptd's lattice codes (before its contexts and low-rank shift)
  adam       p = a * u, u = m_hat / (sqrt(v_hat) + eps) from version t's exp_avg and exp_avg_sq
             (bias-corrected at its train.step), a = -lr * sum of beta1^k over the K steps to
             the next version: Adam's next K steps if the gradient's mean stayed as m says
  adam-fit   the same with a fitted per tensor and version (least squares; 4 bytes each, counted)
With --moment-error E the moments the prediction reads carry a relative error up to E (each
element rounded on a logarithmic grid), as a lossy full-state checkpoint's reconstructed
moments would (the full-state preset keeps exp_avg within 0.5, exp_avg_sq within 0.3).
Each way's cost is the adaptive order-0 code length of its moves per tensor and version
(Krichevsky-Trofimov: what an adaptive entropy coder approaches, learning included).

Usage: /usr/bin/python3 bench/adam_prediction_study.py CKPT_DIR [--bound 5e-3] [--lr 1e-3]
           [--beta1 0.9] [--beta2 0.999] [--eps 1e-8] [--moment-error E]
Prints a Markdown table and the decision figure (the weights' bits with the best prediction
against today's).
"""
import argparse
import glob
import os
import sys

import numpy as np
from scipy.special import gammaln

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import safetensors_arrays  # noqa: E402


def code_bits(moves):
    """Adaptive order-0 code length of the integer array `moves` in bits (KT estimator over the
    alphabet of values seen, escapes for new values charged at 16 bits each)."""
    _, counts = np.unique(moves, return_counts=True)
    k = max(2, counts.size)
    n = counts.sum()
    nats = (gammaln(n + k / 2) - gammaln(k / 2)) - (gammaln(counts + 0.5) - gammaln(0.5)).sum()
    return float(nats / np.log(2)) + 16 * counts.size


def with_relative_error(x, error):
    """x rounded on a logarithmic grid whose points are within `error` of every value."""
    if error <= 0:
        return x
    ratio = np.log1p(error) * 2
    magnitude = np.abs(x).astype(np.float64)
    safe = np.where(magnitude > 0, magnitude, 1.0)
    rounded = np.exp(np.round(np.log(safe) / ratio) * ratio)
    return (np.sign(x) * np.where(magnitude > 0, rounded, 0.0)).astype(np.float32)


def load(path):
    """The F32 and I64 tensors of a checkpoint file."""
    return safetensors_arrays(path, {"F32": np.float32, "I64": np.int64})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ckpt_dir")
    parser.add_argument("--bound", type=float, default=5e-3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--beta1", type=float, default=0.9)
    parser.add_argument("--beta2", type=float, default=0.999)
    parser.add_argument("--eps", type=float, default=1e-8)
    parser.add_argument("--moment-error", type=float, default=0.0)
    args = parser.parse_args()
    files = sorted(glob.glob(os.path.join(args.ckpt_dir, "*.safetensors")))
    step = 2 * args.bound
    ways = ["today", "adam", "adam-fit"]
    bits = dict.fromkeys(ways, 0.0)
    moved = dict.fromkeys(ways, 0)
    elements = 0
    first = load(files[0])
    names = [k[len("model."):] for k in first
             if k.startswith("model.") and f"optim.{k[len('model.'):]}.exp_avg" in first]
    recon = {way: {n: np.round(first["model." + n] / step) * step for n in names} for way in ways}
    previous = first
    worst = 0.0
    for path in files[1:]:
        current = load(path)
        s = float(previous["train.step"][0])
        k_steps = int(current["train.step"][0]) - int(s)
        decay = sum(args.beta1 ** k for k in range(1, k_steps + 1))
        for n in names:
            x = current["model." + n].astype(np.float64)
            m = with_relative_error(previous[f"optim.{n}.exp_avg"], args.moment_error)
            v = with_relative_error(previous[f"optim.{n}.exp_avg_sq"], args.moment_error)
            m_hat = m.astype(np.float64) / (1 - args.beta1 ** s)
            v_hat = v.astype(np.float64) / (1 - args.beta2 ** s)
            u = m_hat / (np.sqrt(v_hat) + args.eps)
            elements += x.size
            for way in ways:
                r = recon[way][n]
                if way == "today":
                    p = np.zeros_like(x)
                elif way == "adam":
                    p = -args.lr * decay * u
                else:
                    denom = float(np.dot(u, u))
                    a = float(np.dot(x - r, u)) / denom if denom > 0 else 0.0
                    p = np.float32(a) * u
                    bits[way] += 32
                q = np.round((x - r - p) / step)
                recon[way][n] = r + p + q * step
                worst = max(worst, float(np.abs(recon[way][n] - x).max()))
                bits[way] += code_bits(q.astype(np.int64))
                moved[way] += int(np.count_nonzero(q))
        previous = current
    print(f"{len(files)} files, {len(names)} weight tensors with Adam moments, bound {args.bound},"
          f" moments read with relative error {args.moment_error}; largest error "
          f"{worst:.2e}\n")
    print("| prediction | weights' deltas, KB | bits/element | elements moved |")
    print("|---|---|---|---|")
    for way in ways:
        print(f"| {way} | {bits[way] / 8e3:.1f} | {bits[way] / elements:.4f} | "
              f"{moved[way] / elements * 100:.1f}% |")
    best = min(bits[w] for w in ways if w != "today")
    print(f"\nbest prediction: {(1 - best / bits['today']) * 100:.1f}% fewer bits than today's "
          "moves (the decision's threshold: 10%)")


if __name__ == "__main__":
    main()
