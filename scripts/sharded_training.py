#!/usr/bin/python3
"""Tensor-parallel training checkpointed by every rank into ckptd, killed, and resumed on a
different number of ranks (walkthrough: docs/sharded-versions.md).

A small character transformer is trained by --ranks processes (torch.distributed, gloo, CPU)
in the Megatron layout: attention heads and the MLP's hidden units are split across ranks
(qkv and fc1 by rows, proj and fc2 by columns), embeddings, norms and the head replicated;
each rank owns the Adam state of its slices. Every --every steps each rank pushes its shard
(weights and moments, each slice declared with its offsets) to ckptd in parallel, twice (a
lossless and a lossy model), and also saves it to a local file. After --kill-at steps the job is
killed (SIGKILL). It is restarted on --resume-ranks processes, three times: from ckptd's
lossless version, from its lossy version, and from the local files (the reference), each rank
pulling its resharded slices; training continues to --steps with the learning rate decayed
linearly to zero. With --encoded, each rank codes its shard itself (the chunks its slices hold
whole, against its part of the last checkpoint; the rest is sent raw) and the restarts pull
their parts as stored records, decoded by the ranks. With --dcp, the job checkpoints with
PyTorch Distributed Checkpoint instead (walkthrough: docs/dcp.md): each split tensor a
ShardedTensor of the rank's slice, saved by ckptd.dcp.Writer and, for the reference, by DCP's
FileSystemWriter; the restarts load with ckptd.dcp.Reader and FileSystemReader.

Checks (exit 0 when all hold, 1 if not, 77 without PyTorch):
  - the lossless restart's final model is bit-identical to the reference restart's;
  - every tensor of the lossy version (the full-state preset) is within its contract of what
    the ranks pushed;
  - the lossy restart's final held-out loss is within --tolerance (0.3%) of the reference's.
Prints one JSON line per event and a summary.

Usage: /usr/bin/python3 scripts/sharded_training.py --ckptd build/daemon/ckptd
           [--ranks 4] [--resume-ranks 2] [--steps 160] [--every 20] [--kill-at 90]
           [--encoded] [--dcp]
"""
import argparse
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
# The client as the build assembles it (with its native codec module), else its sources.
sys.path.insert(0, os.environ.get("CKPT_PYTHON_PACKAGE_DIR") or next(
    d for d in (os.path.join(HERE, "..", "build", "python"),
                os.path.join(HERE, "..", "client-lib", "python"))
    if os.path.isdir(os.path.join(d, "ckptd"))))

# Model and data sizes: small enough for four processes on two cores.
VOCAB_CAP, D, HEADS, LAYERS, SEQ, BATCH, FFN = 96, 64, 4, 2, 32, 16, 256
HEAD_DIM = D // HEADS
LR = 3e-3
# The full-state preset (the moments' own rules) with this small model's weight bound.
LOSSY_POLICY = {"preset": "full-state", "max_abs_error": 1e-3}



class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help shows the description as written and every option's default."""

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def report(event):
    print(json.dumps(event), flush=True)


# ---------------------------------------------------------------------------------------------
# The model: global parameter shapes and how each is split across ranks (dimension, or None
# for replicated).

def parameter_specs(vocab):
    specs = {"emb": ([vocab, D], None), "pos": ([SEQ, D], None)}
    for l in range(LAYERS):
        p = f"layers.{l}."
        specs.update({
            p + "ln1.w": ([D], None), p + "ln1.b": ([D], None),
            # Rows ordered head by head (q, k, v of head 0, then head 1...): a split by rows
            # gives each rank whole heads, for any rank count dividing HEADS.
            p + "qkv.w": ([HEADS * 3 * HEAD_DIM, D], 0), p + "qkv.b": ([HEADS * 3 * HEAD_DIM], 0),
            p + "proj.w": ([D, HEADS * HEAD_DIM], 1), p + "proj.b": ([D], None),
            p + "ln2.w": ([D], None), p + "ln2.b": ([D], None),
            p + "fc1.w": ([FFN, D], 0), p + "fc1.b": ([FFN], 0),
            p + "fc2.w": ([D, FFN], 1), p + "fc2.b": ([D], None)})
    specs.update({"lnf.w": ([D], None), "lnf.b": ([D], None), "head": ([vocab, D], None)})
    return specs


def cut(tensor, dim, rank, ranks):
    """Rank `rank` of `ranks`' part of a global tensor (whole when dim is None)."""
    if dim is None:
        return tensor.clone()
    return tensor.tensor_split(ranks, dim=dim)[rank].contiguous().clone()


def corpus():
    """Text of the Python standard library: characters as token ids, split train / held out."""
    import glob
    text = ""
    for path in sorted(glob.glob("/usr/lib/python3*/*.py"))[:40]:
        with open(path, encoding="utf-8", errors="replace") as f:
            text += f.read()
    chars = sorted(set(text))[:VOCAB_CAP - 1]
    index = {c: i + 1 for i, c in enumerate(chars)}  # 0: any other character
    ids = [index.get(c, 0) for c in text]
    cut_at = len(ids) * 9 // 10
    return ids[:cut_at], ids[cut_at:], VOCAB_CAP


# ---------------------------------------------------------------------------------------------
# A rank (runs as a child process: `sharded_training.py rank ...`).

def rank_main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--url", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=int, required=True)
    parser.add_argument("--stop-at", type=int, required=True)
    parser.add_argument("--resume", choices=["none", "lossless", "lossy", "files"], default="none")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--encoded", action="store_true")
    parser.add_argument("--dcp", action="store_true")
    args = parser.parse_args(argv)

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import ckptd

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=args.rank, world_size=args.ranks)
    rank, ranks = args.rank, args.ranks

    class CopyToRanks(torch.autograd.Function):
        """Identity forward; the gradient is summed over ranks (the input of a split layer)."""
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    class SumOverRanks(torch.autograd.Function):
        """Sums the ranks' partial outputs (the output of a layer split by columns)."""
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    train_ids, held_ids, vocab = corpus()
    specs = parameter_specs(vocab)
    torch.manual_seed(args.seed)
    params = {}
    for name, (shape, dim) in specs.items():
        # The same global initialization on every rank, whatever the rank count.
        if ".ln" in name or name.startswith("lnf"):
            full = torch.ones(shape) if name.endswith(".w") else torch.zeros(shape)
        elif len(shape) == 1:
            full = torch.zeros(shape)
        else:
            full = torch.randn(shape) * 0.02
        params[name] = torch.nn.Parameter(cut(full, dim, rank, ranks))
    adam = torch.optim.Adam(params.values(), lr=LR)
    local_heads = HEADS // ranks

    def forward(tokens):
        x = F.embedding(tokens, params["emb"]) + params["pos"][: tokens.shape[1]]
        mask = torch.full((tokens.shape[1], tokens.shape[1]), float("-inf")).triu(1)
        for l in range(LAYERS):
            p = lambda n: params[f"layers.{l}.{n}"]  # noqa: E731
            h = F.layer_norm(x, (D,), p("ln1.w"), p("ln1.b"))
            h = CopyToRanks.apply(h) if ranks > 1 else h
            qkv = (h @ p("qkv.w").t() + p("qkv.b")).view(*h.shape[:2], local_heads, 3, HEAD_DIM)
            q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM) + mask, dim=-1)
            out = (att @ v).transpose(1, 2).reshape(*h.shape[:2], local_heads * HEAD_DIM)
            out = out @ p("proj.w").t()
            x = x + (SumOverRanks.apply(out) if ranks > 1 else out) + p("proj.b")
            h = F.layer_norm(x, (D,), p("ln2.w"), p("ln2.b"))
            h = CopyToRanks.apply(h) if ranks > 1 else h
            h = F.gelu(h @ p("fc1.w").t() + p("fc1.b")) @ p("fc2.w").t()
            x = x + (SumOverRanks.apply(h) if ranks > 1 else h) + p("fc2.b")
        x = F.layer_norm(x, (D,), params["lnf.w"], params["lnf.b"])
        return x @ params["head"].t()

    def batch(ids, step, size):
        g = torch.Generator().manual_seed(args.seed * 100003 + step)
        starts = torch.randint(0, len(ids) - SEQ - 1, (size,), generator=g)
        data = torch.tensor(ids)
        x = torch.stack([data[s:s + SEQ] for s in starts])
        y = torch.stack([data[s + 1:s + SEQ + 1] for s in starts])
        return x, y

    def held_out_loss():
        with torch.no_grad():
            total = 0.0
            for i in range(8):
                x, y = batch(held_ids, 10 ** 7 + i, 32)
                total += float(F.cross_entropy(forward(x).reshape(-1, vocab), y.reshape(-1)))
            return total / 8

    def shard_state(step):
        """This rank's tensors and the slices they are of."""
        tensors, slices = {"train.step": torch.tensor(step, dtype=torch.int64)}, {}
        for name, p in params.items():
            shape, dim = specs[name]
            state = adam.state.get(p, {})
            entries = {f"model.{name}": p.detach()}
            if state:
                entries[f"optim.{name}.exp_avg"] = state["exp_avg"]
                entries[f"optim.{name}.exp_avg_sq"] = state["exp_avg_sq"]
                tensors[f"optim.{name}.step"] = state["step"].reshape(())
            for key, t in entries.items():
                tensors[key] = t.contiguous()
                if dim is not None:
                    offsets = [0] * len(shape)
                    offsets[dim] = rank * (shape[dim] // ranks)
                    slices[key] = {"global_shape": shape, "offsets": offsets}
        return tensors, slices

    def load_state(tensors):
        """Sets the parameters and Adam's state from this rank's part of a version."""
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(tensors[f"model.{name}"])
                adam.state[p] = {"step": tensors[f"optim.{name}.step"].reshape(()).clone(),
                                 "exp_avg": tensors[f"optim.{name}.exp_avg"].clone(),
                                 "exp_avg_sq": tensors[f"optim.{name}.exp_avg_sq"].clone()}
        return int(tensors["train.step"])

    def dcp_state(tensors, slices):
        """The state dict DCP saves or loads into: each slice a ShardedTensor of this rank's
        part, every other tensor as it is, and a non-tensor item."""
        from torch.distributed._shard.metadata import ShardMetadata
        from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards
        state = {}
        for key, t in tensors.items():
            if key in slices:
                shard = Shard(tensor=t, metadata=ShardMetadata(
                    shard_offsets=list(slices[key]["offsets"]), shard_sizes=list(t.shape),
                    placement=f"rank:{rank}/cpu"))
                state[key] = init_from_local_shards([shard], *slices[key]["global_shape"])
            else:
                state[key] = t
        state["train.config"] = {"lr": LR, "seed": args.seed, "every": args.every}
        return state

    def dcp_load(reader):
        """This rank's part (cut for `ranks`) of the checkpoint `reader` reads, as tensors."""
        template, slices = shard_state(0)
        for name, p in params.items():  # Adam's state of a run that has not stepped yet
            if f"optim.{name}.exp_avg" not in template:
                shape, dim = specs[name]
                template[f"optim.{name}.exp_avg"] = torch.zeros_like(p)
                template[f"optim.{name}.exp_avg_sq"] = torch.zeros_like(p)
                template[f"optim.{name}.step"] = torch.zeros(())
                if dim is not None:
                    for key in (f"optim.{name}.exp_avg", f"optim.{name}.exp_avg_sq"):
                        slices[key] = slices[f"model.{name}"]
        template = {k: torch.zeros_like(t) for k, t in template.items()}
        state = dcp_state(template, slices)
        state["train.config"] = None
        dcp.load_state_dict(state, storage_reader=reader)
        if state["train.config"] != {"lr": LR, "seed": args.seed, "every": args.every}:
            raise RuntimeError(f"non-tensor item came back as {state['train.config']!r}")
        return {k: (v.local_shards()[0].tensor if hasattr(v, "local_shards") else v)
                for k, v in state.items() if k != "train.config"}

    client = ckptd.Client(args.url, progress=False, encoded=args.encoded,
                          reference_dir=os.path.join(args.work, "references"))
    if args.dcp:
        import ckptd.dcp
        dcp = ckptd.dcp.checkpoint_module()
    start = 0
    sent = {"raw_bytes": 0, "sent_bytes": 0}
    if args.dcp and args.resume in ("lossless", "lossy"):
        start = load_state(dcp_load(ckptd.dcp.Reader(client, f"tp-{args.resume}")))
    elif args.dcp and args.resume == "files":
        newest = max(os.listdir(os.path.join(args.work, "dcp-files")))
        start = load_state(dcp_load(dcp.FileSystemReader(
            os.path.join(args.work, "dcp-files", newest))))
    elif args.resume in ("lossless", "lossy"):
        tensors, slices = client.pull_shard(f"tp-{args.resume}", rank, ranks)
        start = load_state(tensors)
    elif args.resume == "files":
        # The reference: the old ranks' files assembled and cut for this rank the same way.
        old = [torch.load(os.path.join(args.work, "files", name))
               for name in sorted(os.listdir(os.path.join(args.work, "files")))]
        newest = max(o["step"] for o in old)
        old = [o for o in old if o["step"] == newest]
        old.sort(key=lambda o: o["rank"])
        tensors = {}
        for key in old[0]["tensors"]:
            if key in old[0]["slices"]:
                dim = next(d for d, o in enumerate(old[1]["slices"][key]["offsets"]) if o)
                full = torch.cat([o["tensors"][key] for o in old], dim=dim)
                tensors[key] = full.tensor_split(ranks, dim=dim)[rank].contiguous()
            else:
                tensors[key] = old[0]["tensors"][key]
        start = load_state(tensors)
    report({"event": "rank started", "rank": rank, "ranks": ranks, "resume": args.resume,
            "from_step": start})

    for step in range(start, args.stop_at):
        if args.resume != "none":  # a run's end: the rate decays linearly to zero
            for group in adam.param_groups:
                group["lr"] = LR * (args.steps - step) / (args.steps - start)
        x, y = batch(train_ids, step, BATCH)
        loss = F.cross_entropy(forward(x).reshape(-1, vocab), y.reshape(-1))
        adam.zero_grad()
        loss.backward()
        adam.step()
        done = step + 1
        if args.resume == "none" and done % args.every == 0:
            tensors, slices = shard_state(done)
            shard_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
            for model in ("tp-lossless", "tp-lossy"):
                if args.dcp:
                    writer = ckptd.dcp.Writer(client, model, done)
                    dcp.save_state_dict(dcp_state(tensors, slices), storage_writer=writer)
                    # DCP's planner has one rank write each replicated tensor.
                    answer, shard_bytes = writer.shard_answer, writer.shard_bytes
                else:
                    answer = client.push_shard(model, done, rank, ranks, tensors, slices=slices)
                sent["raw_bytes"] += shard_bytes
                sent["sent_bytes"] += answer.get("sent_bytes", shard_bytes)
            if args.dcp:  # the reference: DCP's own file storage
                dcp.save_state_dict(dcp_state(tensors, slices), storage_writer=dcp.FileSystemWriter(
                    os.path.join(args.work, "dcp-files", f"step{done:06d}")))
            os.makedirs(os.path.join(args.work, "files"), exist_ok=True)
            path = os.path.join(args.work, "files", f"step{done:06d}-rank{rank}.pt")
            torch.save({"step": done, "rank": rank, "tensors": tensors, "slices": slices},
                       path + ".tmp")
            os.replace(path + ".tmp", path)
            report({"event": "checkpoint", "rank": rank, "step": done, "loss": float(loss)})
    if args.resume == "none":
        # The job's checkpoints are out; it is killed here (the orchestrator's SIGKILL, once
        # every rank's file exists: each appears whole, by a rename).
        stopped = os.path.join(args.work, f"stopped-{rank}")
        with open(stopped + ".tmp", "w") as f:
            json.dump(sent, f)
        os.replace(stopped + ".tmp", stopped)
        time.sleep(3600)
        return 0
    final = {n: p.detach().clone() for n, p in params.items()}
    torch.save(final, os.path.join(args.work, f"final-{args.resume}-rank{rank}.pt"))
    loss = held_out_loss()
    if rank == 0:
        with open(os.path.join(args.work, f"loss-{args.resume}.json"), "w") as f:
            json.dump({"held_out_loss": loss}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ---------------------------------------------------------------------------------------------
# The orchestrator.

class Daemon:
    def __init__(self, binary, work):
        self.ready = os.path.join(work, "ready")
        self.log = open(os.path.join(work, "ckptd.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--data-dir", os.path.join(work, "data"),
             "--ready-file", self.ready, "--log-level", "warn"], stdout=self.log,
            stderr=self.log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if os.path.exists(self.ready) and open(self.ready).read().strip():
                self.url = f"http://127.0.0.1:{int(open(self.ready).read())}"
                return
            if self.proc.poll() is not None:
                raise RuntimeError("ckptd exited at start")
            time.sleep(0.01)
        raise RuntimeError("ckptd did not become ready")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def run_ranks(args, work, url, ranks, resume, stop_at, kill_when_stopped=False):
    port = free_port()
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "rank", "--rank", str(r), "--ranks",
         str(ranks), "--port", str(port), "--url", url, "--work", work, "--steps",
         str(args.steps), "--every", str(args.every), "--stop-at", str(stop_at), "--resume",
         resume, "--seed", str(args.seed)] + (["--encoded"] if args.encoded else [])
        + (["--dcp"] if args.dcp else []))
        for r in range(ranks)]
    deadline = time.monotonic() + args.timeout
    try:
        while time.monotonic() < deadline:
            if kill_when_stopped and all(
                    os.path.exists(os.path.join(work, f"stopped-{r}")) for r in range(ranks)):
                for p in procs:
                    p.send_signal(signal.SIGKILL)
                for p in procs:
                    p.wait()
                report({"event": "job killed", "ranks": ranks, "at_step": stop_at})
                return
            codes = [p.poll() for p in procs]
            if any(c not in (None, 0) for c in codes):
                raise RuntimeError(f"a rank failed: exit codes {codes}")
            if all(c == 0 for c in codes):
                return
            time.sleep(0.05)
        raise RuntimeError("ranks did not finish in time")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def check_lossy_bounds(torch, client, work):
    """Every tensor of the newest lossy version within its bound of the files' values."""
    files = [torch.load(os.path.join(work, "files", n)) for n in os.listdir(os.path.join(work, "files"))]
    newest = max(f["step"] for f in files)
    files = sorted((f for f in files if f["step"] == newest), key=lambda f: f["rank"])
    restored = client.pull("tp-lossy", newest)
    detail = {t["name"]: t for t in client.version_detail("tp-lossy", newest)["tensors"]}

    def tiles_of(tensor, counts):
        # The tiles a tensor is stored in (the detail's "tiles"), in the grid's row-major order.
        parts = [tensor]
        for dim, count in enumerate(counts or []):
            parts = [q for p in parts for q in p.chunk(count, dim=dim)]
        return parts

    worst = {}
    ok = True
    for key in files[0]["tensors"]:
        if key in files[0]["slices"]:
            dim = next(d for d, o in enumerate(files[1]["slices"][key]["offsets"]) if o)
            pushed = torch.cat([f["tensors"][key] for f in files], dim=dim)
        else:
            pushed = files[0]["tensors"][key]
        got = restored[key]
        error = (pushed - got).abs()
        if key.endswith(".exp_avg_sq"):
            within = bool((error <= 0.3 * pushed.abs()).all())
            worst[key] = float((error / pushed.abs().clamp_min(1e-30)).max())
        elif key.endswith(".exp_avg"):
            # The drop rule: 0 where |x| <= 3 x the mean |x| of its chunk, else within half of
            # |x|. Chunks are runs of each tile's row-major order.
            per_chunk = detail[key]["chunk_bytes"] // pushed.element_size()
            within = True
            for p, g in zip(tiles_of(pushed, detail[key].get("tiles")),
                            tiles_of(got, detail[key].get("tiles"))):
                flat = p.abs().reshape(-1)
                floor = torch.cat([c.mean().expand(c.numel()) for c in flat.split(per_chunk)])
                floor = (3 * floor * (1 + 1e-9)).reshape(p.shape)
                dropped = (g == 0) & (p.abs() <= floor)
                within = within and bool((dropped | ((p - g).abs() <= 0.5 * p.abs())).all())
            worst[key] = float(error.max())
        elif pushed.is_floating_point():
            within = float((pushed - got).abs().max()) <= 1e-3
            worst[key] = float((pushed - got).abs().max())
        else:
            within = torch.equal(pushed, got)
        ok = ok and within
        if not within:
            report({"event": "out of bound", "tensor": key, "worst": worst.get(key)})
    return ok, newest


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\nUsage:")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--ckptd", default=os.path.join(HERE, "..", "build", "daemon", "ckptd"),
                        help="the ckptd binary")
    parser.add_argument("--ranks", type=int, default=4, help="ranks of the first job")
    parser.add_argument("--resume-ranks", type=int, default=2,
                        help="ranks of the restarted jobs")
    parser.add_argument("--steps", type=int, default=160, help="training steps in all")
    parser.add_argument("--every", type=int, default=20, help="steps between two checkpoints")
    parser.add_argument("--kill-at", type=int, default=90,
                        help="the step at which the first job is killed")
    parser.add_argument("--seed", type=int, default=1, help="seed of the model and the data")
    parser.add_argument("--tolerance", type=float, default=0.003,
                        help="largest relative difference of the lossy restart's final held-out "
                             "loss from the reference restart's")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds the whole walkthrough may take")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--encoded", action="store_true",
                        help="ranks code their shards and decode their parts (ckptd._native)")
    parser.add_argument("--dcp", action="store_true",
                        help="checkpoint with PyTorch Distributed Checkpoint (ckptd.dcp's Writer "
                             "and Reader; the reference restart from DCP's FileSystemWriter's "
                             "files)")
    args = parser.parse_args()
    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError:
        print("skipped: PyTorch is not importable by", sys.executable, "(Debian: python3-torch)")
        return 77
    import ckptd
    if args.encoded and not ckptd.edge.available():
        print("skipped: --encoded needs ckptd's native codec module (ckptd._native)")
        return 77

    work = tempfile.mkdtemp(prefix="ckptd-sharded-")
    daemon = Daemon(args.ckptd, work)
    started = time.monotonic()
    try:
        client = ckptd.Client(daemon.url, progress=False)
        client.set_policy("tp-lossy", LOSSY_POLICY)
        run_ranks(args, work, daemon.url, args.ranks, "none", args.kill_at, kill_when_stopped=True)
        pushed = [json.load(open(os.path.join(work, f"stopped-{r}"))) for r in range(args.ranks)]
        versions = [v["version"] for v in client.versions("tp-lossless")]
        layout = client.layout("tp-lossless")
        report({"event": "versions", "lossless": versions,
                "lossy": [v["version"] for v in client.versions("tp-lossy")],
                "shards": layout["shards"]})
        ok_bounds, newest = check_lossy_bounds(torch, client, work)
        for resume in ("files", "lossless", "lossy"):
            run_ranks(args, work, daemon.url, args.resume_ranks, resume, args.steps)
        identical = True
        for r in range(args.resume_ranks):
            ref = torch.load(os.path.join(work, f"final-files-rank{r}.pt"))
            got = torch.load(os.path.join(work, f"final-lossless-rank{r}.pt"))
            identical = identical and all(torch.equal(ref[k], got[k]) for k in ref)
        losses = {k: json.load(open(os.path.join(work, f"loss-{k}.json")))["held_out_loss"]
                  for k in ("files", "lossless", "lossy")}
        lossy_change = losses["lossy"] / losses["files"] - 1
        stored = {m: sum(v["stored_bytes"] for v in client.versions(m))
                  for m in ("tp-lossless", "tp-lossy")}
        raw = sum(v["raw_bytes"] for v in client.versions("tp-lossless"))
        summary = {"event": "summary", "ranks": args.ranks, "resume_ranks": args.resume_ranks,
                   "resumed_from_step": newest, "steps": args.steps,
                   "lossless_bit_identical": identical, "lossy_within_bounds": ok_bounds,
                   "held_out_loss": losses, "lossy_change": lossy_change,
                   "ratio_lossless": raw / stored["tp-lossless"],
                   "ratio_lossy": raw / stored["tp-lossy"], "encoded": args.encoded,
                   "dcp": args.dcp,
                   "pushed_raw_bytes": sum(p["raw_bytes"] for p in pushed),
                   "pushed_sent_bytes": sum(p["sent_bytes"] for p in pushed),
                   "seconds": round(time.monotonic() - started, 1)}
        report(summary)
        passed = identical and ok_bounds and abs(lossy_change) <= args.tolerance
        return 0 if passed else 1
    finally:
        daemon.stop()
        if not args.keep:
            import shutil
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        sys.exit(rank_main(sys.argv[2:]))
    sys.exit(main())
