#!/usr/bin/python3
"""Does a low-rank shift of the lattice make the deltas of weight matrices cheaper? A numpy model
of a candidate lossy coder, against ckptd's lattice with element history, on a checkpoint
sequence under an absolute error bound.

Why: the 30-step deltas of a transformer trained with Adam are far from independent noise as
matrices. Their top 16 singular values carry 50-70% of the energy (`--spectrum` prints it),
while the element-wise coder of ckptd codes each element's lattice crossings on their own.

The candidate (per finite 2-D tensor of at least `--min-elements`; everything else stays on the
plain lattice). Reconstructions live on a fine lattice of pitch 2*bound/FINE (FINE = 64), so a
version can still be re-encoded exactly against any other, as the plain lattice allows:
  1. the encoder takes E = x_t - R_(t-1) (the new values against the last reconstruction),
     arranged so that its columns run over the smaller dimension n, and its top-r right
     singular vectors V (n x r);
  2. V is quantized to integers Vq = round(V * sqrt(n) / basis_step) and the coefficients
     A = E Vd (Vd the dequantized basis, least squares) to Aq = round(A / factor_step);
  3. the prediction P = R_(t-1) + Aq Vd^T, rounded to the fine lattice (integer arithmetic in
     a codec: the products of small integers are exact), and the moves s = round((x - P) /
     (2 bound)) with the history contexts ckptd uses; R_t = P + 2 bound s, within the bound.
The encoder tries each rank of `--ranks` (0 = no shift) per tensor and version and keeps the
cheapest (symbols' conditional entropy + the factors' entropy, column by column, + 32 bits per
column). Symbols are costed by their conditional entropy under the 8 history states, exactly as
`bench/delta_entropy.py --contexts` costs ckptd's lattice.

`--reversible` prices instead what the newest version costs as one decode. Stored backwards (the
newest version whole, older ones as reverse deltas), a chain's reconstructions must be cheap to
code exactly on their own: the candidate's fine offsets are the sum of every shift of the chain,
a dense field. So it also prices an *accumulated* shift: per matrix and chain, a basis that only
grows (at most `--max-basis` directions; each version may add `--grow` directions fitted to what
the basis leaves of its delta), integer coefficients that accumulate (A_t = A_(t-1) + C_t), and
reconstructions R_t = 2 bound n_t + fine O_t with O_t = round(scale A_t B^T): the newest version
is its lattice indices n plus one factor set, and a reverse delta is -s_t plus C_t. Element
history moves out of the reconstruction: the reverse deltas are coded in the context of the
history read backwards (the newer versions' moves), which this measures rather than assumes.

Usage: /usr/bin/python3 bench/lowrank_study.py CKPT_DIR [--bound 5e-3] [--ranks 0,8,16,24]
           [--factor-step 2.0] [--basis-step 1.0] [--save-restored DIR] [--spectrum]
           [--reversible [--max-basis 32] [--grow 8]]
  --factor-step is in units of the bound, --basis-step in units of 1/sqrt(n).
  --save-restored writes each version's reconstruction (the candidate's) as safetensors with
  the original header, for `bench/train_checkpoints.py eval`.
Prints one JSON object: bits per element of the studied tensors' deltas (ckptd's lattice with
history vs the candidate, factors included), the share of elements moving, the ranks chosen,
and the whole sequence's ratio under each (keyframe and the other tensors at their order-0 /
history entropy, as delta_entropy.py counts them).
"""
import argparse
import glob
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from delta_entropy import entropy_bits, load_f32, next_history  # noqa: E402

FINE = 64


def column_bits(q):
    return sum(entropy_bits(q[:, j]) + 32 for j in range(q.shape[1]))


def shifted_step(x, r_prev, history, rank, bound, factor_step, basis_step):
    """One version of the candidate at one rank: (reconstruction, symbols, bits)."""
    step = 2 * bound
    fine = step / FINE
    bits = 0.0
    prediction = r_prev
    if rank > 0:
        e = x - r_prev
        n = e.shape[1]
        _, _, vt = np.linalg.svd(e, full_matrices=False)
        vq = np.round(vt[:rank].T * np.sqrt(n) / basis_step)
        vd = vq * basis_step / np.sqrt(n)
        a = e @ vd @ np.linalg.pinv(vd.T @ vd)
        aq = np.round(a / (factor_step * bound))
        bits += column_bits(aq) + column_bits(vq)
        prediction = np.round((r_prev + (aq * factor_step * bound) @ vd.T) / fine) * fine
    s = np.round((x - prediction) / step)
    bits += entropy_bits(s.ravel(), history.ravel())
    return prediction + step * s, s, bits


def reverse_bits(moves):
    """Bits of a chain's moves stored backwards: -s_t, newest first, each in the context of the
    history of the moves read so far (the decoder walks from the newest version)."""
    history = np.full(moves[0].shape, 3)
    bits = 0.0
    for s in reversed(moves):
        bits += entropy_bits(-s.ravel(), history.ravel())
        history = next_history(history, -s)
    return bits


def fit_directions(e, count, basis_step):
    """The top `count` right singular vectors of e, quantized: (integer basis, dequantized)."""
    n = e.shape[1]
    _, _, vt = np.linalg.svd(e, full_matrices=False)
    vq = np.round(vt[:count].T * np.sqrt(n) / basis_step)
    return vq, vq * basis_step / np.sqrt(n)


def accumulated_chain(mats, bound, factor_step, basis_step, max_basis, grow):
    """One matrix's chain under the accumulated shift. Returns (forward delta bits, reverse
    delta bits, factor bits, keyframe bits of the newest version); the first version is the
    plain lattice's keyframe."""
    step = 2 * bound
    fine = step / FINE
    unit = factor_step * bound
    rows, n = mats[0].shape
    vd = np.zeros((n, 0))
    a = np.zeros((rows, 0))
    offset = np.zeros((rows, n))           # O_t, in fine units
    index = np.round(mats[0] / step)       # n_t
    history = np.full(index.shape, 3)
    forward = factors = 0.0
    moves = []
    for t in range(1, len(mats)):
        x = mats[t]
        e = x - (step * index + fine * offset)
        trials = []
        for add in sorted({0, min(grow, max_basis - vd.shape[1])}):
            basis, extra_bits = vd, 0.0
            if add > 0:
                residual = e - (e @ vd @ np.linalg.pinv(vd.T @ vd)) @ vd.T if vd.shape[1] else e
                vq, new = fit_directions(residual, add, basis_step)
                basis, extra_bits = np.hstack([vd, new]), column_bits(vq)
            for fit in (True, False):
                if basis.shape[1] == 0 and fit:
                    continue
                if fit:
                    c = np.round(e @ basis @ np.linalg.pinv(basis.T @ basis) / unit)
                else:
                    c = np.zeros((rows, basis.shape[1]))
                acc = np.hstack([a, np.zeros((rows, basis.shape[1] - a.shape[1]))]) + c
                o = np.round((acc * unit) @ basis.T / fine) if basis.shape[1] else offset * 0
                k = np.round((x - fine * o) / step)
                s = k - index
                bits = entropy_bits(s.ravel(), history.ravel())
                side = (column_bits(c) if fit else 0.0) + extra_bits
                trials.append((bits + side, bits, side, basis, acc, o, k, s))
        _, bits, side, vd, a, offset, k, s = min(trials, key=lambda trial: trial[0])
        r = step * k + fine * offset
        worst = float(np.abs(r.astype(np.float32) - x.astype(np.float32)).max())
        assert worst <= bound * (1 + 1e-6), worst
        forward += bits
        factors += side
        history = next_history(history, s)
        moves.append(s)
        index = k
    return forward, reverse_bits(moves), factors, entropy_bits(index.ravel())


def spectrum(tensors_a, tensors_b):
    out = {}
    for name, (x, shape) in tensors_a.items():
        if len(shape) != 2 or x.size < 60000 or not np.isfinite(x).all():
            continue
        d = (tensors_b[name][0].astype(np.float64) - x).reshape(shape)
        s = np.linalg.svd(d, compute_uv=False) ** 2
        e = np.cumsum(s) / s.sum()
        out[name] = {"top1": round(float(e[0]), 3), "top16": round(float(e[15]), 3),
                     "top64": round(float(e[63]), 3)}
    return out


def write_restored(src, dst, restored):
    raw = open(src, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    body = bytearray(raw[8 + n:])
    for name, values in restored.items():
        begin, end = header[name]["data_offsets"]
        body[begin:end] = values.astype(np.float32).tobytes()
    with open(dst, "wb") as f:
        f.write(raw[:8 + n])
        f.write(body)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--bound", type=float, default=5e-3)
    parser.add_argument("--ranks", default="0,8,16,24")
    parser.add_argument("--factor-step", type=float, default=2.0)
    parser.add_argument("--basis-step", type=float, default=1.0)
    parser.add_argument("--min-elements", type=int, default=30000)
    parser.add_argument("--save-restored")
    parser.add_argument("--spectrum", action="store_true")
    parser.add_argument("--reversible", action="store_true")
    parser.add_argument("--max-basis", type=int, default=32)
    parser.add_argument("--grow", type=int, default=8)
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    step = 2 * args.bound
    files = sorted(glob.glob(args.ckpt_dir + "/*.safetensors"))
    versions = [load_f32(f) for f in files]
    if args.spectrum:
        middle = len(versions) // 2
        print(json.dumps(spectrum(versions[middle - 1][0], versions[middle][0])))
        return
    raw_bytes = sum(size for _, size in versions)
    first = versions[0][0]
    if args.reversible:
        print(json.dumps(reversible_study(args, versions, raw_bytes)))
        return
    studied = [n for n, (x, shape) in first.items()
               if len(shape) == 2 and x.size >= args.min_elements and np.isfinite(x).all()]
    other_bits = 0.0          # keyframe of everything, deltas of the tensors not studied
    lattice_bits = candidate_bits = 0.0
    lattice_moves = candidate_moves = delta_elements = 0
    chosen = {r: 0 for r in ranks}
    restored = [{} for _ in versions]
    for name, (x0, shape) in first.items():
        series = [v[0][name][0].astype(np.float64) for v in versions]
        k0 = np.where(np.isfinite(series[0]), np.round(series[0] / step), 0)
        other_bits += entropy_bits(k0)
        if name not in studied:
            previous = k0
            for t in range(1, len(series)):
                k = np.where(np.isfinite(series[t]), np.round(series[t] / step), 0)
                other_bits += entropy_bits(k - previous)
                previous = k
                restored[t][name] = np.where(np.isfinite(series[t]), k * step, series[t])
            restored[0][name] = np.where(np.isfinite(series[0]), k0 * step, series[0])
            continue
        flip = shape[0] < shape[1]   # the basis runs over the smaller dimension
        mats = [v.reshape(shape).T if flip else v.reshape(shape) for v in series]
        k_prev = np.round(mats[0] / step)
        h_lattice = np.full(k_prev.shape, 3)
        r_prev = k_prev * step
        h_candidate = h_lattice.copy()
        restored[0][name] = r_prev.T.ravel() if flip else r_prev.ravel()
        for t in range(1, len(mats)):
            k = np.round(mats[t] / step)
            s = k - k_prev
            lattice_bits += entropy_bits(s.ravel(), h_lattice.ravel())
            lattice_moves += int((s != 0).sum())
            h_lattice = next_history(h_lattice, s)
            k_prev = k
            best = None
            for rank in ranks:
                trial = shifted_step(mats[t], r_prev, h_candidate, rank, args.bound,
                                     args.factor_step, args.basis_step)
                if best is None or trial[2] < best[1][2]:
                    best = (rank, trial)
            rank, (r, s, bits) = best
            worst = float(np.abs(r.astype(np.float32) - mats[t].astype(np.float32)).max())
            assert worst <= args.bound * (1 + 1e-6), (name, t, worst)
            chosen[rank] += 1
            candidate_bits += bits
            candidate_moves += int((s != 0).sum())
            delta_elements += s.size
            h_candidate = next_history(h_candidate, s)
            r_prev = r
            restored[t][name] = r.T.ravel() if flip else r.ravel()
    if args.save_restored:
        os.makedirs(args.save_restored, exist_ok=True)
        for path, tensors in zip(files, restored):
            write_restored(path, os.path.join(args.save_restored, os.path.basename(path)), tensors)
    print(json.dumps({
        "dir": args.ckpt_dir, "bound": args.bound, "versions": len(files),
        "studied_tensors": len(studied),
        "lattice_bits_per_element": round(lattice_bits / delta_elements, 4),
        "candidate_bits_per_element": round(candidate_bits / delta_elements, 4),
        "change": f"{candidate_bits / lattice_bits - 1:+.1%}",
        "lattice_moves": round(lattice_moves / delta_elements, 3),
        "candidate_moves": round(candidate_moves / delta_elements, 3),
        "ranks_chosen": chosen,
        "ratio_lattice": round(raw_bytes * 8 / (other_bits + lattice_bits), 2),
        "ratio_candidate": round(raw_bytes * 8 / (other_bits + candidate_bits), 2),
    }))


def reversible_study(args, versions, raw_bytes):
    """Whole-sequence bits of each coding, forward (first version whole) and backwards
    (newest version whole, reverse deltas in the context of the backwards history)."""
    step = 2 * args.bound
    ranks = [int(r) for r in args.ranks.split(",")]
    totals = {k: 0.0 for k in ("plain_fwd", "plain_rev", "today_fwd", "acc_fwd", "acc_rev")}
    for name, (x0, shape) in versions[0][0].items():
        series = [v[0][name][0].astype(np.float64) for v in versions]
        if not all(np.isfinite(x).all() for x in series):
            continue
        indices = [np.round(x / step) for x in series]
        moves = [b - a for a, b in zip(indices, indices[1:])]
        plain_first, plain_last = entropy_bits(indices[0]), entropy_bits(indices[-1])
        history, plain_fwd = np.full(indices[0].shape, 3), plain_first
        for s in moves:
            plain_fwd += entropy_bits(s, history)
            history = next_history(history, s)
        plain_rev = plain_last + reverse_bits(moves)
        if len(shape) != 2 or x0.size < args.min_elements:
            for key, bits in (("plain_fwd", plain_fwd), ("plain_rev", plain_rev),
                              ("today_fwd", plain_fwd), ("acc_fwd", plain_fwd),
                              ("acc_rev", plain_rev)):
                totals[key] += bits
            continue
        totals["plain_fwd"] += plain_fwd
        totals["plain_rev"] += plain_rev
        flip = shape[0] < shape[1]
        mats = [x.reshape(shape).T if flip else x.reshape(shape) for x in series]
        # Today's shift: a fresh fit per version, reconstructions on the fine lattice.
        r_prev = np.round(mats[0] / step) * step
        history = np.full(r_prev.shape, 3)
        today = plain_first
        for t in range(1, len(mats)):
            best = min((shifted_step(mats[t], r_prev, history, rank, args.bound,
                                     args.factor_step, args.basis_step) for rank in ranks),
                       key=lambda trial: trial[2])
            r_prev, s, bits = best
            today += bits
            history = next_history(history, s)
        totals["today_fwd"] += today
        fwd, rev, side, last_bits = accumulated_chain(
            mats, args.bound, args.factor_step, args.basis_step, args.max_basis, args.grow)
        totals["acc_fwd"] += plain_first + fwd + side
        totals["acc_rev"] += last_bits + rev + side
    out = {"dir": args.ckpt_dir, "bound": args.bound, "versions": len(versions),
           "max_basis": args.max_basis, "grow": args.grow}
    for key in ("plain_fwd", "plain_rev", "today_fwd", "acc_fwd", "acc_rev"):
        out["ratio_" + key] = round(raw_bytes * 8 / totals[key], 2)
    return out


if __name__ == "__main__":
    main()
