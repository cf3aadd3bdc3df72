#!/usr/bin/python3
"""Trains small models on data found on this machine and saves a safetensors checkpoint
(weights + Adam state + step counter) every K steps: real checkpoint sequences for benchmarks.

Workloads:
  digits  an MLP on scikit-learn's bundled 8x8 digits (1,797 images)
  charlm  a 2-layer transformer character language model on the Python standard library
          sources under /usr/lib/python3.11

Usage: /usr/bin/python3 bench/train_checkpoints.py WORKLOAD OUT_DIR [--checkpoints N] [--every K]
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


def digits_workload():
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    rng = torch.Generator().manual_seed(0)

    def batch():
        idx = torch.randint(0, len(x), (128,), generator=rng)
        return x[idx], y[idx]

    def loss_fn(out, target):
        return nn.functional.cross_entropy(out, target)

    return model, batch, loss_fn, 1e-3


class CharLM(nn.Module):
    def __init__(self, vocab, dim=256, layers=2, context=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(context, dim))
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        mask = torch.triu(torch.full((context, context), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        h = self.encoder(h, mask=self.mask[: tokens.shape[1], : tokens.shape[1]])
        return self.head(self.norm(h))


def charlm_workload():
    files = sorted(glob.glob("/usr/lib/python3.11/*.py"))[:200]
    text = "".join(open(f, encoding="utf-8", errors="replace").read() for f in files)
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.int64)
    context = 128
    model = CharLM(len(chars), context=context)
    rng = torch.Generator().manual_seed(0)

    def batch():
        start = torch.randint(0, len(data) - context - 1, (32,), generator=rng)
        seq = torch.stack([data[s: s + context + 1] for s in start.tolist()])
        return seq[:, :-1], seq[:, 1:]

    def loss_fn(out, target):
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))

    return model, batch, loss_fn, 3e-4


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["digits", "charlm"])
    parser.add_argument("out_dir")
    parser.add_argument("--checkpoints", type=int, default=25)
    parser.add_argument("--every", type=int, default=20)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model, batch, loss_fn, lr = {"digits": digits_workload, "charlm": charlm_workload}[args.workload]()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    os.makedirs(args.out_dir, exist_ok=True)
    step = 0
    for c in range(1, args.checkpoints + 1):
        for _ in range(args.every):
            inputs, target = batch()
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), target)
            loss.backward()
            optimizer.step()
            step += 1
        path = os.path.join(args.out_dir, f"step-{step:06d}.safetensors")
        save_safetensors(checkpoint_tensors(model, optimizer, step), path,
                         {"format": "pt", "step": str(step), "loss": f"{loss.item():.5f}"})
        print(f"{args.workload} step {step} loss {loss.item():.4f} -> {path}", flush=True)


if __name__ == "__main__":
    main()
