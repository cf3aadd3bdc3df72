#!/usr/bin/python3
"""Resume-quality benchmark: the whole training state (weights + Adam moments) through the real
daemon, judged by how training continues from a restored version.

For each mode (a codec policy): start ckptd on a fresh data directory (loopback, ephemeral port),
push every checkpoint of CKPT_DIR (bench/train_checkpoints.py ... without --weights-only), shut
down cleanly, measure the data directory as `du` counts it, restart, restore every version in
full, check every tensor against its contract (weights within their bound, moments within their
pointwise bound or the drop rule), then resume training from the restored --resume-step
version with the run's data order up to --end-step with the learning rate decayed linearly to
zero, and compare the final held-out loss with the same continuation from the original
checkpoint (charlm: on 1024 windows of the held-out text, with the quick 64-window figure of the
training log beside it). In the same run:
  original   the continuation from the original checkpoint at the run's constant rate must
             reproduce the uninterrupted run's --end-step checkpoint bit for bit (a check of
             the harness), and the annealed continuation is the reference of every row;
  nulls      annealed continuations from the original + N(0, --null-sigma) on the weights
             (--nulls seeds): the spread any perturbation causes; --null-kind lattice or
             dither instead rounds the weights to the uniform quantizer's lattice of bound
             --null-sigma, plainly or with a subtractive dither (the codec's error without
             its chain);
  ExCP       bench/excp_baseline.py, the same resume from its reconstruction.
Ratios: whole = raw bytes of all checkpoints / du of the data directory; weights and moments
= their raw bytes / their stored chunk bytes (version detail), as BitSnap reports them apart;
"moments for the newest 2 only": the same pushes into a second data directory whose retention
keeps optim.* for the newest 2 versions (a tensor rule), after its passes: every version's
other tensors are checked to restore exactly as in the first.
Continuations are cached in --cache (keyed by the resumed bytes), so a rerun with another mode
trains only that mode's continuation.

Usage:
  /usr/bin/python3 bench/resume_eval.py CKPT_DIR --workload charlm --layers 4 --lr 1e-3 \\
      --resume-step 300 --end-step 600 --mode NAME=POLICY_JSON [--mode ...] [--excp] \\
      [--nulls 3] [--constant] [--build build-release] [--cache DIR] [--out FILE]
--constant also runs each mode's continuation at the constant rate (informative: chaotic).
--ratios-only pushes, restores and checks every mode and reports the held-out loss of the
restored --resume-step version itself, without training.
"""
import argparse
import fnmatch
import glob
import hashlib
import json
import os
import struct
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_checkpoints as tc  # noqa: E402
from benchlib import Daemon, du_bytes, push_versions  # noqa: E402
from excp_baseline import ExcpCoder  # noqa: E402
from lossy_eval import parse  # noqa: E402

CHUNK_BYTES = 4 << 20  # storage.chunk_bytes' default: the drop rule's mean is per chunk


def body_of(header, arrays):
    """A safetensors body from a parsed header and (possibly changed) arrays."""
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    data = bytearray()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        data += arrays[name].astype(arrays[name].dtype).tobytes()
    return struct.pack("<Q", len(text)) + text + bytes(data)


def torch_tensors(body):
    import torch
    header, arrays = parse(body)
    return {name: torch.from_numpy(a.copy()).reshape(header[name]["shape"])
            for name, a in arrays.items()}


def override_for(policy, name):
    for o in policy.get("overrides", []):
        if fnmatch.fnmatchcase(name, o["tensors"]):
            return o
    return {}


def check_contract(pushed, restored, detail, policy):
    """Every tensor within its contract; returns the worst |error| / bound over the weights
    (model.*) and over the moments' quantized elements."""
    _, a = parse(pushed)
    _, b = parse(restored)
    worst = {"weights": 0.0, "moments": 0.0}
    for t in detail["tensors"]:
        name = t["name"]
        x, r = a[name], b[name]
        if t["codec"] == "lossless":
            if x.tobytes() != r.tobytes():
                raise AssertionError(f"lossless tensor {name} differs")
            continue
        xf, rf = x.astype(np.float64), r.astype(np.float64)
        finite = np.isfinite(xf)
        if x[~finite].tobytes() != r[~finite].tobytes():
            raise AssertionError(f"non-finite elements of {name} not exact")
        with np.errstate(invalid="ignore"):
            err = np.where(finite, np.abs(xf - rf), 0.0)
        group = "weights" if name.startswith("model.") else "moments"
        if "max_pointwise_rel_error" in t:
            eps = t["max_pointwise_rel_error"]
            factor = override_for(policy, name).get("zero_below_mean", 0)
            allowed = eps * np.abs(xf)
            if factor:
                per_chunk = CHUNK_BYTES // x.itemsize
                for begin in range(0, x.size, per_chunk):
                    part = slice(begin, begin + per_chunk)
                    mean = np.mean(np.abs(xf[part][finite[part]])) if finite[part].any() else 0
                    dropped = (rf[part] == 0) & (np.abs(xf[part]) <= factor * mean * (1 + 1e-9))
                    allowed[part] = np.where(dropped, np.abs(xf[part]), allowed[part])
            if np.any(err[finite] > allowed[finite]):
                raise AssertionError(f"{name}: outside its pointwise contract")
            ratio = np.divide(err, allowed, out=np.zeros_like(err), where=allowed > 0)
        else:
            bound = t["max_abs_error"]  # the tensor's own, never looser than the policy's
            hard = override_for(policy, name).get("max_abs_error", policy.get("max_abs_error"))
            if hard is not None and bound > hard:
                raise AssertionError(f"{name}: bound {bound} looser than the policy's {hard}")
            if np.any(err[finite] > bound):
                raise AssertionError(f"{name}: error {err[finite].max()} > bound {bound}")
            ratio = err / bound
        if finite.any():
            worst[group] = max(worst[group], float(ratio[finite].max()))
    return worst


def run_mode(name, policy_text, files, binary, work, resume_index):
    data_dir = os.path.join(work, name)
    daemon = Daemon(binary, data_dir)
    daemon.start()
    daemon.request("PUT", "/v1/models/bench/policy", policy_text.encode())
    # The policy as stored (a preset expanded): what the contracts are checked against.
    policy = json.loads(daemon.request("GET", "/v1/models/bench/policy"))
    push_s, details = push_versions(daemon, "bench", files)
    daemon.stop()
    disk = du_bytes(data_dir)
    daemon.start()
    restored = [daemon.request("GET", f"/v1/models/bench/versions/{v}")
                for v in range(1, len(files) + 1)]
    daemon.stop()
    worst = {"weights": 0.0, "moments": 0.0}
    for p, r, d in zip(files, restored, details):
        for k, w in check_contract(p, r, d, policy).items():
            worst[k] = max(worst[k], w)
    parts = {"weights": [0, 0], "moments": [0, 0], "exp_avg": [0, 0], "exp_avg_sq": [0, 0]}
    for d in details:
        for t in d["tensors"]:
            group = "weights" if t["name"].startswith("model.") else \
                "moments" if t["name"].startswith("optim.") else None
            groups = [group] if group else []
            if group == "moments":
                groups.append(t["name"].rsplit(".", 1)[-1])
            for g in groups:
                if g in parts:
                    parts[g][0] += t["raw_bytes"]
                    parts[g][1] += t["stored_bytes"]
    raw = sum(len(b) for b in files)
    ratio = {g: raw_bytes / max(stored, 1) for g, (raw_bytes, stored) in parts.items()}
    newest_two = moments_for_newest(policy_text, files, restored, binary, data_dir + "-tail", 2)
    return {"whole": raw / disk, "weights": ratio["weights"], "moments": ratio["moments"],
            "moments_newest_two": raw / newest_two,
            "first_moment": ratio["exp_avg"], "second_moment": ratio["exp_avg_sq"],
            "worst": worst,
            "push_mbps": raw / 1e6 / push_s, "resume_body": restored[resume_index]}


def moments_for_newest(policy_text, files, restored, binary, data_dir, keep):
    """The same pushes with the retention tensor rule that keeps optim.* for the newest `keep`
    versions only; returns `du` of the data directory after the rule's passes and a clean
    shutdown. Checks that every version's other tensors restore exactly as in the store that
    kept everything, the kept moments within their contract, and that the older versions say
    their moments were dropped."""
    daemon = Daemon(binary, data_dir)
    daemon.start()
    daemon.request("PUT", "/v1/models/bench/policy", policy_text.encode())
    policy = json.loads(daemon.request("GET", "/v1/models/bench/policy"))
    rule = {"tensor_rules": [{"tensors": ["optim.*"], "keep_last": keep}]}
    daemon.request("PUT", "/v1/models/bench/retention", json.dumps(rule).encode())
    push_versions(daemon, "bench", files)
    daemon.request("POST", "/v1/models/bench/retention:apply")  # after the background passes
    for v in range(1, len(files) + 1):
        detail = json.loads(daemon.request("GET", f"/v1/models/bench/versions/{v}?detail=1"))
        moments = sum(t["name"].startswith("optim.") for t in detail["tensors"])
        expected = moments if v <= len(files) - keep else 0
        if detail["dropped_tensors"] != expected:
            raise AssertionError(f"version {v}: {detail['dropped_tensors']} tensors dropped")
        body = daemon.request("GET", f"/v1/models/bench/versions/{v}")
        _, kept = parse(body)
        _, whole = parse(restored[v - 1])
        # The moments restart their chains every `keep` versions here: other reconstructions,
        # each within its contract; the other tensors restore exactly as in the first store.
        for name, array in kept.items():
            if not name.startswith("optim.") and array.tobytes() != whole[name].tobytes():
                raise AssertionError(f"version {v}: {name} restores differently")
        if len(kept) != len(whole) - expected:
            raise AssertionError(f"version {v}: {len(kept)} tensors restored")
        if expected == 0:
            check_contract(files[v - 1], body, detail, policy)
    daemon.stop()
    return du_bytes(data_dir)


def run_excp(files, resume_index, alpha, beta):
    coder = ExcpCoder(alpha=alpha, beta=beta)
    stored, resume_body = 0, None
    parts = {"weights": [0, 0], "moments": [0, 0]}
    for index, body in enumerate(files):
        header, arrays = parse(body)
        sizes, out = coder.code(arrays)
        stored += sum(sizes.values()) + 8 + struct.unpack("<Q", body[:8])[0]
        for name, a in arrays.items():
            group = "weights" if name.startswith("model.") else \
                "moments" if name.startswith("optim.") else None
            if group:
                parts[group][0] += a.nbytes
        for group in parts:
            parts[group][1] += sizes[group]
        if index == resume_index:
            resume_body = body_of(header, out)
    raw = sum(len(b) for b in files)
    return {"whole": raw / stored, "weights": parts["weights"][0] / parts["weights"][1],
            "moments": parts["moments"][0] / parts["moments"][1], "resume_body": resume_body}


class Continuations:
    """Training continued from a checkpoint body, cached by (schedule, body digest)."""

    def __init__(self, args, cache_dir):
        self.args, self.cache_dir = args, cache_dir
        os.makedirs(cache_dir, exist_ok=True)

    def run(self, body, schedule):
        key = hashlib.sha256(body).hexdigest()[:24]
        path = os.path.join(self.cache_dir, f"{self.args.workload}-{self.args.layers}-"
                                            f"{self.args.end_step}-{schedule}-{key}-wide.json")
        if os.path.exists(path):
            return json.load(open(path))
        import torch
        torch.manual_seed(0)
        torch.set_num_threads(self.args.threads)
        wl = argparse.Namespace(layers=self.args.layers, lr=self.args.lr, dropout=0.0,
                                batch_size=32, context=128, gpt_style=False, norm_first=False,
                                wide_eval=True)
        model, batch, loss_fn, evaluate, lr = tc.WORKLOADS[self.args.workload](wl)
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        start = tc.apply_checkpoint(model, optimizer, torch_tensors(body))
        for _ in range(start):  # the data order of the uninterrupted run
            batch()
        t0 = time.perf_counter()
        end = start if schedule == "restored" else self.args.end_step  # "restored": no training
        for s in range(start, end):
            if schedule == "anneal":
                for group in optimizer.param_groups:
                    group["lr"] = lr * (self.args.end_step - s) / (self.args.end_step - start)
            inputs, target = batch()
            optimizer.zero_grad()
            loss_fn(model(inputs), target).backward()
            optimizer.step()
        digest = hashlib.sha256()
        for k, v in model.state_dict().items():
            digest.update(k.encode())
            digest.update(v.detach().contiguous().numpy().tobytes())
        losses = evaluate(model)
        # "loss" judges: charlm's 1024 held-out windows, else the workload's held-out set;
        # "loss_windows" is charlm's quick 64-window figure.
        result = {"loss": losses.get("loss_wide", losses["loss"]), "loss_windows": losses["loss"],
                  "weights_sha256": digest.hexdigest(), "seconds": time.perf_counter() - t0}
        json.dump(result, open(path, "w"))
        print(f"  continuation {schedule} {key}: loss {result['loss']:.5f} "
              f"({result['seconds']:.0f} s)", flush=True)
        return result


def weights_sha256(body):
    import torch
    digest = hashlib.sha256()
    for k, v in torch_tensors(body).items():
        if k.startswith("model."):
            digest.update(k[len("model."):].encode())
            digest.update(v.contiguous().numpy().tobytes())
    return digest.hexdigest()


def with_noise(body, kind, size, seed):
    """The body with its float32 weights perturbed: kind "gauss" adds N(0, size); "lattice"
    rounds each weight to the nearest point of the lattice of pitch 2 * size (the uniform
    quantizer's error without a chain); "dither" rounds it on that lattice shifted by a uniform
    pseudo-random offset per element (subtractive dither: the same error size, independent of
    the value)."""
    header, arrays = parse(body)
    rng = np.random.default_rng(seed)
    out = dict(arrays)
    step = 2 * size
    for name, a in arrays.items():
        if not (name.startswith("model.") and a.dtype == np.float32):
            continue
        x = a.astype(np.float64)
        if kind == "gauss":
            r = x + rng.normal(0, size, a.shape)
        elif kind == "lattice":
            r = np.round(x / step) * step
        else:
            d = rng.uniform(-0.5, 0.5, a.shape)
            r = (np.round(x / step - d) + d) * step
        out[name] = r.astype(np.float32)
    return body_of(header, out)


NULL_LABELS = {"gauss": "original + N(0, {:g}) on the weights",
               "lattice": "original rounded to the lattice of bound {:g} (no chain)",
               "dither": "original on a dithered lattice of bound {:g}"}


def ratios_only(args, files, resume_index):
    """Ratios, contracts and the held-out loss of the restored --resume-step version itself (no
    training: what evaluating or serving that version sees), against the original's."""
    runs = Continuations(args, args.cache)
    original = runs.run(files[resume_index], "restored")["loss"]
    print(f"held-out loss of the original step-{args.resume_step} checkpoint: {original:.5f}")
    with tempfile.TemporaryDirectory(prefix="ckpt-resume-") as work:
        binary = os.path.join(args.build, "daemon", "ckptd")
        for spec in args.mode:
            name, policy = spec.split("=", 1)
            r = run_mode(name, policy, files, binary, work, resume_index)
            loss = runs.run(r["resume_body"], "restored")["loss"]
            print(f"| ckptd {name} | {r['whole']:.2f}x | {r['weights']:.2f}x | "
                  f"{r['moments']:.2f}x (exp_avg {r['first_moment']:.1f}x, exp_avg_sq "
                  f"{r['second_moment']:.1f}x) | moments of the newest 2 only: "
                  f"{r['moments_newest_two']:.2f}x | {r['worst']['weights']:.3f}, "
                  f"{r['worst']['moments']:.3f} | push {r['push_mbps']:.0f} MB/s | restored "
                  f"loss {loss:.5f} ({100 * (loss - original) / original:+.3f}%) |", flush=True)
    if args.excp:
        r = run_excp(files, resume_index, args.excp_alpha, args.excp_beta)
        print(f"| ExCP | {r['whole']:.2f}x | {r['weights']:.2f}x | {r['moments']:.2f}x |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ckpt_dir")
    parser.add_argument("--workload", default="charlm")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--resume-step", type=int, default=300)
    parser.add_argument("--end-step", type=int, default=600)
    parser.add_argument("--mode", action="append", default=[])
    parser.add_argument("--excp", action="store_true")
    parser.add_argument("--excp-alpha", type=float, default=5e-5)
    parser.add_argument("--excp-beta", type=float, default=2.0)
    parser.add_argument("--nulls", type=int, default=3)
    parser.add_argument("--null-sigma", type=float, default=1e-6,
                        help="the nulls' sigma (gauss) or bound (lattice, dither)")
    parser.add_argument("--null-kind", choices=sorted(NULL_LABELS), default="gauss")
    parser.add_argument("--constant", action="store_true")
    parser.add_argument("--build", default="build-release")
    parser.add_argument("--cache", default="/tmp/ckpt-resume-cache")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per continuation")
    parser.add_argument("--ratios-only", action="store_true",
                        help="push, restore and check every mode, and the restored version's "
                             "own held-out loss; no training")
    parser.add_argument("--out")
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(args.ckpt_dir, "*.safetensors")))
    files = [open(p, "rb").read() for p in paths]
    steps = [int(json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])["__metadata__"]["step"])
             for b in files]
    resume_index = steps.index(args.resume_step)
    raw = sum(len(b) for b in files)
    print(f"{len(files)} checkpoints (steps {steps[0]}..{steps[-1]}), {raw} bytes; resume at "
          f"{args.resume_step}, end at {args.end_step}", flush=True)
    if args.ratios_only:
        return ratios_only(args, files, resume_index)
    end_index = steps.index(args.end_step)
    runs = Continuations(args, args.cache)
    original = files[resume_index]
    constant = runs.run(original, "constant")
    exact = constant["weights_sha256"] == weights_sha256(files[end_index])
    annealed = runs.run(original, "anneal")
    reference, reference_windows = annealed["loss"], annealed["loss_windows"]
    lines = [f"Uninterrupted run at step {args.end_step}: the constant-rate continuation from the "
             f"original step-{args.resume_step} checkpoint reproduces it "
             f"{'bit for bit' if exact else 'NOT bit for bit (harness broken)'}; held-out loss "
             f"{constant['loss']:.4f}. Annealed continuation from the original: {reference:.4f} "
             f"({reference_windows:.4f} on the 64 windows).",
             "",
             "| method | whole-state ratio | weights | moments | whole, moments for the newest 2 "
             "only | annealed loss (vs original) | the same on the 64 windows "
             "| constant rate (vs uninterrupted) | worst error / bound: weights, moments |",
             "|---|---|---|---|---|---|---|---|---|"]

    def emit(line):
        print(line, flush=True)
        lines.append(line)

    def change(loss, base):
        return f"{loss:.4f} ({100 * (loss - base) / base:+.3f}%)"

    def emit_resumed(label, r, worst=""):
        """Resumes from r's restored body and emits its row."""
        resumed = runs.run(r["resume_body"], "anneal")
        const = runs.run(r["resume_body"], "constant")["loss"] if args.constant else None
        newest = f"{r['moments_newest_two']:.2f}x" if "moments_newest_two" in r else ""
        emit(f"| {label} | {r['whole']:.2f}x | {r['weights']:.2f}x | {r['moments']:.2f}x | "
             f"{newest} | {change(resumed['loss'], reference)} | "
             f"{change(resumed['loss_windows'], reference_windows)} | "
             f"{change(const, constant['loss']) if const else ''} | {worst} |")

    with tempfile.TemporaryDirectory(prefix="ckpt-resume-") as work:
        binary = os.path.join(args.build, "daemon", "ckptd")
        for spec in args.mode:
            name, policy = spec.split("=", 1)
            r = run_mode(name, policy, files, binary, work, resume_index)
            emit_resumed(f"ckptd {name}", r,
                         f"{r['worst']['weights']:.3f}, {r['worst']['moments']:.3f}")
    if args.excp:
        r = run_excp(files, resume_index, args.excp_alpha, args.excp_beta)
        emit_resumed(f"ExCP (alpha {args.excp_alpha:g}, beta {args.excp_beta:g}, 4-bit k-means, "
                     "LZMA)", r)
    null_changes = []
    seeds = [1] if args.null_kind == "lattice" else range(1, args.nulls + 1)
    for seed in seeds if args.nulls else []:
        perturbed = with_noise(original, args.null_kind, args.null_sigma, seed)
        resumed = runs.run(perturbed, "anneal")
        null_changes.append(100 * (resumed["loss"] - reference) / reference)
        label = NULL_LABELS[args.null_kind].format(args.null_sigma)
        emit(f"| null: {label}, seed {seed} | | | | | "
             f"{change(resumed['loss'], reference)} | "
             f"{change(resumed['loss_windows'], reference_windows)} | | |")
    if null_changes:
        emit("")
        emit(f"Null spread (annealed): {min(null_changes):+.3f}% .. {max(null_changes):+.3f}%")
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
