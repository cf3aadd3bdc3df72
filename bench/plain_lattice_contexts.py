#!/usr/bin/python3
"""Can the plain lattice, which the store can rearrange (newest version whole, older ones as
reverse deltas), code its moves as cheaply as the default lattice (element history, low-rank
shift), whose reconstructions carry their chain and so stay forward? A numpy model on a
checkpoint sequence under an absolute error bound; entropies, not the coder.

The plain lattice's reconstructions are k_t * step (step = 2 bound, k_t = round(x_t / step)),
the same whichever chain led to them; its moves are s_t = k_t - k_(t-1). Every model below
keeps those reconstructions and only changes the context the moves are coded in, so a reverse
delta (-s_t) costs what the forward one does under a symmetric context. Whole-sequence ratio
(raw bytes / coded bytes: the newest version's k as one keyframe at its order-0 entropy, plus
every move) under each context:
  order0        no context: the rearranged plain lattice as stored today
  newer_move    the direction of the element's next move (s_(t+1)): what a decoder walking back
                from the newest version knows; the newest reverse delta has none, and every
                delta's context changes when a version after it is pushed or deleted
  row_activity  the share of the row's elements that move in this delta, relative to the
                tensor's, in 6 classes sent per row (2-D tensors of at least 30000 elements)
  row_col       the same for rows and columns, their product in 6 classes (side bits counted)
  row_col_newer row_col x newer_move
  ref_magnitude |k| of the newer version in 5 classes
  prev_element  whether the element before moved in the same delta
With --soft, for the same large 2-D tensors and forward: the moves in the context of a rank-R
prediction of x_t - R_(t-1) fitted per version (the default lattice's fit, its factors' bits
counted), binned to 1/8 of a step in [-2, 2], with and without the element history; beside the
default lattice's own shift (which moves the lattice by that prediction instead), all on the
first --versions versions.

Usage: /usr/bin/python3 bench/plain_lattice_contexts.py CKPT_DIR [--bound 5e-3]
           [--soft [--versions 9] [--rank 16]]
Prints one JSON object.
"""
import argparse
import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from delta_entropy import entropy_bits, load_f32, next_history  # noqa: E402
from lowrank_study import column_bits, fit_directions, shifted_step  # noqa: E402

MIN_MATRIX = 30000
ACTIVITY = (0.25, 0.5, 1.0, 2.0, 4.0)


def is_matrix(x, shape):
    return len(shape) == 2 and x.size >= MIN_MATRIX


def context_bits(moves, indices, shape, big):
    """Bits of every move of one tensor under each symmetric context."""
    out = dict.fromkeys(("order0", "newer_move", "row_activity", "row_col", "row_col_newer",
                         "ref_magnitude", "prev_element"), 0.0)
    for t, s in enumerate(moves):
        order0 = entropy_bits(s)
        newer = (np.sign(moves[t + 1]).astype(np.int64) + 1) if t + 1 < len(moves) else None
        out["order0"] += order0
        out["newer_move"] += order0 if newer is None else entropy_bits(s, newer)
        out["ref_magnitude"] += entropy_bits(s, np.digitize(np.abs(indices[t + 1]),
                                                            (1, 3, 10, 30)))
        out["prev_element"] += entropy_bits(
            s, np.concatenate([[0], (s[:-1] != 0)]).astype(np.int64))
        if not big:
            for key in ("row_activity", "row_col", "row_col_newer"):
                out[key] += order0
            continue
        rows, cols = shape
        moved = (s.reshape(rows, cols) != 0).astype(float)
        mean = moved.mean() + 1e-9
        row_rel, col_rel = moved.mean(1) / mean, moved.mean(0) / mean
        row_side, col_side = rows * np.log2(6), cols * np.log2(6)
        row_class = np.repeat(np.digitize(row_rel, ACTIVITY), cols)
        both = np.digitize(np.outer(row_rel, col_rel).ravel(), ACTIVITY)
        out["row_activity"] += min(order0, entropy_bits(s, row_class) + row_side)
        out["row_col"] += min(order0, entropy_bits(s, both) + row_side + col_side)
        joint = both if newer is None else both * 3 + newer
        out["row_col_newer"] += min(order0, entropy_bits(s, joint) + row_side + col_side)
    return out


def soft_bits(mats, bound, rank):
    """Forward bits of one matrix's moves: plain with history, the soft prediction's contexts
    (with and without history), and the default lattice's shift."""
    step = 2 * bound
    ks = [np.round(m / step) for m in mats]
    history = np.full(ks[0].shape, 3)
    shifted_history = history.copy()
    shifted_prev = ks[0] * step
    out = dict.fromkeys(("plain_history", "soft", "soft_history", "shift"), 0.0)
    for t in range(1, len(mats)):
        s = ks[t] - ks[t - 1]
        e = mats[t] - ks[t - 1] * step
        vq, vd = fit_directions(e, rank, 1.0)
        aq = np.round(e @ vd @ np.linalg.pinv(vd.T @ vd) / (2 * bound))
        factors = column_bits(aq) + column_bits(vq)
        prediction = (aq * 2 * bound) @ vd.T / step
        bins = (np.clip(np.round(prediction * 8), -16, 16) + 16).astype(np.int64)
        plain = entropy_bits(s.ravel(), history.ravel())
        out["plain_history"] += plain
        out["soft"] += min(plain, entropy_bits(s.ravel(), bins.ravel()) + factors)
        out["soft_history"] += min(plain,
                                   entropy_bits(s.ravel(), (history * 64 + bins).ravel()) + factors)
        history = next_history(history, s)
        shifted_prev, moved, bits = min(
            (shifted_step(mats[t], shifted_prev, shifted_history, r, bound, 2.0, 1.0)
             for r in (0, 8, 16, 24)), key=lambda trial: trial[2])
        out["shift"] += bits
        shifted_history = next_history(shifted_history, moved)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--bound", type=float, default=5e-3)
    parser.add_argument("--soft", action="store_true")
    parser.add_argument("--versions", type=int, default=9)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    step = 2 * args.bound
    files = sorted(glob.glob(args.ckpt_dir + "/*.safetensors"))
    if args.soft:
        files = files[:args.versions]
    versions = [load_f32(f) for f in files]
    raw = sum(size for _, size in versions)
    totals, keyframe = {}, 0.0
    for name, (x0, shape) in versions[0][0].items():
        series = [v[0][name][0].astype(np.float64) for v in versions]
        if not all(np.isfinite(x).all() for x in series):
            continue
        indices = [np.round(x / step) for x in series]
        moves = [b - a for a, b in zip(indices, indices[1:])]
        big = is_matrix(x0, shape)
        if args.soft:
            keyframe += entropy_bits(indices[0])
            if big:
                flip = shape[0] < shape[1]  # the basis runs over the smaller dimension
                mats = [x.reshape(shape).T if flip else x.reshape(shape) for x in series]
                parts = soft_bits(mats, args.bound, args.rank)
            else:
                history, bits = np.full(indices[0].shape, 3), 0.0
                for s in moves:
                    bits += entropy_bits(s, history)
                    history = next_history(history, s)
                parts = dict.fromkeys(("plain_history", "soft", "soft_history", "shift"), bits)
        else:
            keyframe += entropy_bits(indices[-1])
            parts = context_bits(moves, indices, shape, big)
        for key, bits in parts.items():
            totals[key] = totals.get(key, 0.0) + bits
    out = {"dir": args.ckpt_dir, "bound": args.bound, "versions": len(files)}
    out.update({"ratio_" + k: round(raw * 8 / (keyframe + v), 2) for k, v in totals.items()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
