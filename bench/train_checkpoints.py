#!/usr/bin/python3
"""Trains small models on data found on this machine and saves a safetensors checkpoint
(weights + Adam state + step counter) every K steps: real checkpoint sequences for benchmarks.

Workloads:
  digits      an MLP on scikit-learn's bundled 8x8 digits (1,797 images)
  digits-cnn  a small CNN (two 3x3 conv layers, 150k parameters) on the same digits
  charlm  a transformer character language model (d_model 256, --layers, default 2) on the
          Python standard library sources under /usr/lib/python3.11; post-norm layers with ReLU
          and PyTorch's initialisation, or pre-norm ones (--norm-first), or GPT-2's recipe
          (--gpt-style: pre-norm, GELU, N(0, 0.02) weights)

Usage: /usr/bin/python3 bench/train_checkpoints.py WORKLOAD OUT_DIR [--checkpoints N] [--every K]
           [--layers L] [--lr LR] [--dropout P] [--batch-size B] [--context C]
           [--gpt-style | --norm-first] [--weights-only]
           [--resume FILE.safetensors]
       /usr/bin/python3 bench/train_checkpoints.py eval WORKLOAD FILE.safetensors... [--layers L]
The eval form prints each file's held-out loss (charlm: the last 10% of the text; digits: the
whole dataset) and accuracy (digits) as one JSON line per file.
Run with Debian's /usr/bin/python3 (python3-torch, python3-sklearn). Deterministic (seeded).
"""
import argparse
import glob
import json
import os
import struct

import numpy as np
import torch
import torch.nn as nn

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
          torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}


def save_safetensors(tensors, path, metadata):
    """Writes tensors (name -> torch.Tensor) as safetensors, header padded to 8 bytes."""
    header = {"__metadata__": metadata}
    offset = 0
    blobs = []
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            data = t.view(torch.int16).numpy().tobytes()
        else:
            data = t.numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def checkpoint_tensors(model, optimizer, step):
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state:
                    out[f"optim.{names[id(p)]}.{key}"] = state[key]
    out["train.step"] = torch.tensor(step, dtype=torch.int64)
    return out


def load_safetensors(path):
    """Reads a safetensors file into name -> torch.Tensor (the __metadata__ entry is skipped)."""
    with open(path, "rb") as f:
        raw = f.read()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    base = 8 + length
    np_types = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                "U8": np.uint8, "BOOL": np.bool_, "BF16": np.int16}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(raw[base + begin: base + end], dtype=np_types[info["dtype"]])
        t = torch.from_numpy(array.copy()).reshape(info["shape"])
        out[name] = t.view(torch.bfloat16) if info["dtype"] == "BF16" else t
    return out


def load_digits_tensors():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)


def classification_workload(model, train_x, train_y, test_x, test_y, batch_size, lr):
    """Batches drawn from (train_x, train_y), cross-entropy, evaluation on (test_x, test_y)."""
    rng = torch.Generator().manual_seed(0)

    def batch():
        idx = torch.randint(0, len(train_x), (batch_size,), generator=rng)
        return train_x[idx], train_y[idx]

    def loss_fn(out, target):
        return nn.functional.cross_entropy(out, target)

    def evaluate(m):
        with torch.no_grad():
            out = m(test_x)
            return {"loss": loss_fn(out, test_y).item(),
                    "accuracy": (out.argmax(1) == test_y).float().mean().item()}

    return model, batch, loss_fn, evaluate, lr


def digits_workload(args):
    """An MLP on the digits; evaluated on the whole dataset (it also trains on all of it)."""
    x, y = load_digits_tensors()
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    return classification_workload(model, x, y, x, y, 128, args.lr or 1e-3)


def digits_cnn_workload(args):
    """A small CNN on the 8x8 digits: two 3x3 conv layers, max-pool, two linear layers. Trains
    on 4/5 of the images; every 5th image is held out for evaluation."""
    x, y = load_digits_tensors()
    held_out = torch.arange(len(x)) % 5 == 0
    model = nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10))
    return classification_workload(model, x[~held_out], y[~held_out], x[held_out], y[held_out], 64,
                                   args.lr or 1e-3)


class CharLM(nn.Module):
    def __init__(self, vocab, dim=256, layers=2, context=128, dropout=0.0, gpt_style=False,
                 norm_first=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(context, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=dropout, batch_first=True,
                                           norm_first=gpt_style or norm_first,
                                           activation="gelu" if gpt_style else "relu")
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        if gpt_style:
            # GPT-2's initialisation: N(0, 0.02) weights, zero biases.
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)
                    if getattr(module, "bias", None) is not None:
                        nn.init.zeros_(module.bias)
            for layer_module in self.encoder.layers:
                nn.init.normal_(layer_module.self_attn.in_proj_weight, std=0.02)
                nn.init.zeros_(layer_module.self_attn.in_proj_bias)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.encoder(h, mask=self.mask[: tokens.shape[1], : tokens.shape[1]])
        return self.head(self.norm(h))


def charlm_workload(args):
    files = sorted(glob.glob("/usr/lib/python3.11/*.py"))
    corpus = "".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
    split = len(corpus) * 9 // 10  # the last 10% is held out for evaluation
    text, held_out = corpus[:split], corpus[split:]
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.int64)
    test = torch.tensor([index.get(c, 0) for c in held_out], dtype=torch.int64)
    context = args.context
    model = CharLM(len(chars), layers=args.layers, context=context, dropout=args.dropout,
                   gpt_style=args.gpt_style, norm_first=args.norm_first)
    rng = torch.Generator().manual_seed(0)

    def batch():
        start = torch.randint(0, len(data) - context - 1, (args.batch_size,), generator=rng)
        seq = torch.stack([data[s: s + context + 1] for s in start.tolist()])
        return seq[:, :-1], seq[:, 1:]

    def loss_fn(out, target):
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))

    # Fixed held-out windows: 64 sequences spread evenly over the held-out text (quick, for the
    # training log); with args.wide_eval also 1024 ("loss_wide"), which comparisons of two models
    # that differ little need: the 64 windows' sampling alone separates two continuations of the
    # same run by tenths of a percent.
    def windows(count):
        starts = torch.linspace(0, len(test) - context - 2, count).long().tolist()
        return torch.stack([test[s: s + context + 1] for s in starts])

    eval_seq = windows(64)
    wide_seq = windows(1024)

    def mean_loss(m, seq):
        total = 0.0
        for part in seq.split(128):
            total += loss_fn(m(part[:, :-1]), part[:, 1:]).item() * len(part)
        return total / len(seq)

    def evaluate(m):
        # Evaluation mode turns dropout off; gradients stay enabled so that PyTorch 1.13 does not
        # take its fast path (which turns the -inf attention mask into NaN).
        was_training = m.training
        m.eval()
        result = {"loss": loss_fn(m(eval_seq[:, :-1]), eval_seq[:, 1:]).item()}
        if getattr(args, "wide_eval", False):
            result["loss_wide"] = mean_loss(m, wide_seq)
        m.train(was_training)
        return result

    return model, batch, loss_fn, evaluate, args.lr or 3e-4


WORKLOADS = {"digits": digits_workload, "digits-cnn": digits_cnn_workload,
             "charlm": charlm_workload}


def apply_checkpoint(model, optimizer, tensors):
    """Loads weights (and Adam moments, when the checkpoint has them) into model/optimizer."""
    model.load_state_dict({k[len("model."):]: v for k, v in tensors.items()
                           if k.startswith("model.")})
    names = dict(model.named_parameters())
    for name, p in names.items():
        m, v = tensors.get(f"optim.{name}.exp_avg"), tensors.get(f"optim.{name}.exp_avg_sq")
        if m is not None and v is not None:
            optimizer.state[p] = {"step": torch.tensor(float(tensors["train.step"].item())),
                                  "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
    return int(tensors["train.step"].item()) if "train.step" in tensors else 0


def run_eval(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("files", nargs="+")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.0, help="charlm: dropout rate")
    parser.add_argument("--batch-size", type=int, default=32, help="charlm: sequences per step")
    parser.add_argument("--context", type=int, default=128, help="charlm: characters per sequence")
    parser.add_argument("--gpt-style", action="store_true",
                        help="charlm: pre-norm layers, GELU, GPT-2's N(0, 0.02) initialisation")
    parser.add_argument("--norm-first", action="store_true",
                        help="charlm: pre-norm layers (PyTorch's initialisation, ReLU)")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--wide-eval", action="store_true",
                        help="charlm: also the loss over 1024 windows of the held-out text")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    model, _, _, evaluate, _ = WORKLOADS[args.workload](args)
    for path in args.files:
        tensors = load_safetensors(path)
        model.load_state_dict({k[len("model."):]: v for k, v in tensors.items()
                               if k.startswith("model.")})
        print(json.dumps({"file": path, **evaluate(model)}), flush=True)


def main():
    import sys
    if len(sys.argv) > 1 and sys.argv[1] == "eval":
        return run_eval(sys.argv[2:])
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=list(WORKLOADS))
    parser.add_argument("out_dir")
    parser.add_argument("--checkpoints", type=int, default=25)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.0, help="charlm: dropout rate")
    parser.add_argument("--batch-size", type=int, default=32, help="charlm: sequences per step")
    parser.add_argument("--context", type=int, default=128, help="charlm: characters per sequence")
    parser.add_argument("--gpt-style", action="store_true",
                        help="charlm: pre-norm layers, GELU, GPT-2's N(0, 0.02) initialisation")
    parser.add_argument("--norm-first", action="store_true",
                        help="charlm: pre-norm layers (PyTorch's initialisation, ReLU)")
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--weights-only", action="store_true",
                        help="save model weights only (no Adam moments, no step counter)")
    parser.add_argument("--resume", help="start from this checkpoint (weights + Adam state)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model, batch, loss_fn, evaluate, lr = WORKLOADS[args.workload](args)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    step = 0
    if args.resume:
        step = apply_checkpoint(model, optimizer, load_safetensors(args.resume))
        # Replay the data order so the resumed run sees the batches the original run saw.
        for _ in range(step):
            batch()
    os.makedirs(args.out_dir, exist_ok=True)
    # Training runs in train mode (dropout active when --dropout > 0); the charlm evaluation
    # switches to evaluation mode for its forward pass.
    for c in range(1, args.checkpoints + 1):
        for _ in range(args.every):
            inputs, target = batch()
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), target)
            loss.backward()
            optimizer.step()
            step += 1
        path = os.path.join(args.out_dir, f"step-{step:06d}.safetensors")
        tensors = checkpoint_tensors(model, optimizer, step)
        if args.weights_only:
            tensors = {k: v for k, v in tensors.items() if k.startswith("model.")}
        save_safetensors(tensors, path,
                         {"format": "pt", "step": str(step), "loss": f"{loss.item():.5f}"})
        print(json.dumps({"step": step, "train_loss": loss.item(), **evaluate(model),
                          "file": path}), flush=True)


if __name__ == "__main__":
    main()
