#!/usr/bin/python3
"""Cluster failure recovery, end to end: a real PyTorch training loop checkpoints into ckptd, the
trainer and the daemon are killed (SIGKILL) and restarted, the trainer resumes from `latest`,
and the final model must match an uninterrupted run. Walkthrough: docs/failure-recovery.md.

Scenarios (each trains the same model for --steps steps, pushing every --every steps):
  uninterrupted   never killed: the reference result
  trainer-crash   the trainer is killed at a random step, restarted, and resumes from `latest`
  daemon-crash    the daemon is killed mid-run and restarted; the trainer's pushes wait for it
                  and the run continues
  both-crash      the daemon and then the trainer are killed; the daemon comes back first, the
                  trainer restarts and resumes from the `latest` the restarted daemon serves
Prints one line per event (JSON) and a summary; exits 0 if every scenario's final held-out loss
equals the uninterrupted run's within --tolerance, 1 if not, 77 if PyTorch or scikit-learn is
missing (run it with Debian's /usr/bin/python3).

Usage: /usr/bin/python3 scripts/failure_recovery.py [--ckptd build/daemon/ckptd]
           [--steps 600] [--every 25] [--seed 1] [--tolerance 1e-6]
"""
import argparse
import http.client
import importlib.util
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time



class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """--help shows the description as written and every option's default."""

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------
# The trainer (runs as a child process: `failure_recovery.py trainer ...`)

def serialize(tensors, metadata):
    """name -> torch.Tensor (float32/int64) as a safetensors body."""
    dtypes = {"float32": "F32", "int64": "I64"}
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        a = t.detach().contiguous().cpu().numpy()
        data = a.tobytes()
        header[name] = {"dtype": dtypes[str(a.dtype)], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def deserialize(body):
    import numpy as np
    import torch
    (length,) = struct.unpack("<Q", body[:8])
    header = json.loads(body[8:8 + length])
    types = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        a = np.frombuffer(body[8 + length + begin: 8 + length + end], dtype=types[info["dtype"]])
        out[name] = torch.from_numpy(a.copy()).reshape(info["shape"])
    return out


class Server:
    """ckptd over HTTP; waits (bounded) for a daemon that is down or restarting."""

    def __init__(self, port):
        self.port = port

    def call(self, method, path, body=None, patience=120.0):
        deadline = time.monotonic() + patience
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                conn.request(method, path, body=body)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                if resp.status in (409, 503) and time.monotonic() < deadline:
                    time.sleep(0.1)  # busy model or shutting down: retry
                    continue
                return resp.status, data, dict(resp.getheaders())
            except OSError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)  # daemon down: wait for it to come back


def trainer(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=int, required=True)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)

    import hashlib
    import torch
    import torch.nn as nn
    from sklearn.datasets import load_digits
    torch.set_num_threads(1)  # bit-for-bit reproducible across processes

    def emit(**event):
        print(json.dumps(event), flush=True)

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.int64)
    held_out = torch.arange(len(x)) % 5 == 0
    train_x, train_y, test_x, test_y = x[~held_out], y[~held_out], x[held_out], y[held_out]
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    names = {id(p): n for n, p in model.named_parameters()}
    server = Server(args.port)

    # Resume: whatever `latest` ckptd has for this run.
    step = 0
    start = time.monotonic()
    status, body, headers = server.call("GET", f"/v1/models/{args.model}/versions/latest")
    if status == 200:
        if hashlib.sha256(body).hexdigest() != headers.get("X-Ckpt-Sha256"):
            sys.exit("restored body does not match its SHA-256")
        tensors = deserialize(body)
        model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")})
        step = int(tensors["train.step"].item())
        for p in model.parameters():
            n = names[id(p)]
            optimizer.state[p] = {"step": torch.tensor(float(step)),
                                  "exp_avg": tensors[f"optim.{n}.exp_avg"],
                                  "exp_avg_sq": tensors[f"optim.{n}.exp_avg_sq"]}
        emit(event="restored", model=args.model, step=step, bytes=len(body),
             seconds=round(time.monotonic() - start, 4))
    elif status != 404:
        sys.exit(f"restore failed: {status} {body[:200]!r}")
    else:
        emit(event="fresh-start", model=args.model)

    def evaluate():
        with torch.no_grad():
            out = model(test_x)
            return (nn.functional.cross_entropy(out, test_y).item(),
                    (out.argmax(1) == test_y).float().mean().item())

    while step < args.steps:
        # The batch of a step depends on the step only, so a resumed run sees the same data.
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        idx = torch.randint(0, len(train_x), (64,), generator=g)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(train_x[idx]), train_y[idx])
        loss.backward()
        optimizer.step()
        step += 1
        if step % args.every == 0 or step == args.steps:
            tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
            for p in model.parameters():
                state = optimizer.state[p]
                tensors[f"optim.{names[id(p)]}.exp_avg"] = state["exp_avg"]
                tensors[f"optim.{names[id(p)]}.exp_avg_sq"] = state["exp_avg_sq"]
            tensors["train.step"] = torch.tensor(step, dtype=torch.int64)
            held_loss, accuracy = evaluate()
            body = serialize(tensors, {"metric.loss": repr(held_loss)})
            t0 = time.monotonic()
            status, answer, _ = server.call("PUT", f"/v1/models/{args.model}/versions/{step}",
                                            body)
            if status == 409 and b"must be greater" in answer:
                # Pushed before a crash whose answer was lost: already stored, nothing to do.
                status = 201
            if status != 201:
                sys.exit(f"push of step {step} failed: {status} {answer[:200]!r}")
            emit(event="pushed", step=step, loss=held_loss,
                 seconds=round(time.monotonic() - t0, 4))
    held_loss, accuracy = evaluate()
    emit(event="done", step=step, loss=held_loss, accuracy=accuracy)


# ---------------------------------------------------------------------------------------------
# The orchestrator

class Daemon:
    def __init__(self, binary, data_dir, port, log):
        self.binary, self.data_dir, self.port, self.log = binary, data_dir, port, log
        self.proc = None

    def start(self):
        ready = self.data_dir + ".ready"
        if os.path.exists(ready):
            os.remove(ready)
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [self.binary, "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data_dir,
             "--ready-file", ready, "--log-level", "info"], stdout=self.log, stderr=self.log)
        while not (os.path.exists(ready) and open(ready).read().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError("ckptd exited during start-up")
            if time.monotonic() - t0 > 60:
                raise RuntimeError("ckptd did not become ready")
            time.sleep(0.01)
        return time.monotonic() - t0

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def report(event):
    print(json.dumps(event), flush=True)


class Trainer:
    def __init__(self, port, model, steps, every, seed):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "trainer", "--port", str(port),
             "--model", model, "--steps", str(steps), "--every", str(every), "--seed",
             str(seed)], stdout=subprocess.PIPE, text=True)
        self.events = []

    def next_event(self):
        line = self.proc.stdout.readline()
        if not line:
            return None
        event = json.loads(line)
        self.events.append(event)
        report(event)
        return event

    def run_until(self, predicate):
        while True:
            event = self.next_event()
            if event is None or predicate(event):
                return event

    def finish(self):
        self.run_until(lambda e: e["event"] == "done")
        if self.proc.wait() != 0:
            raise RuntimeError("trainer failed")
        return self.events[-1]

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "trainer":
        return trainer(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\nUsage:")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("--ckptd", default="build/daemon/ckptd", help="the ckptd binary")
    parser.add_argument("--steps", type=int, default=600, help="training steps of every run")
    parser.add_argument("--every", type=int, default=25, help="steps between two checkpoints")
    parser.add_argument("--seed", type=int, default=1,
                        help="seed of the model, the data and the moments of the kills")
    parser.add_argument("--tolerance", type=float, default=1e-6,
                        help="largest absolute difference of a scenario's final held-out "
                             "loss from the uninterrupted run's")
    args = parser.parse_args()
    missing = [m for m in ("torch", "sklearn") if importlib.util.find_spec(m) is None]
    if missing:
        print(f"skipped: no {', '.join(missing)} (install python3-torch python3-sklearn; run "
              "with /usr/bin/python3)")
        return 77
    rng = random.Random(args.seed)
    pushes = args.steps // args.every
    with tempfile.TemporaryDirectory(prefix="ckpt-recovery-") as work:
        log = open(os.path.join(work, "ckptd.log"), "w")
        port = free_port()
        daemon = Daemon(args.ckptd, os.path.join(work, "data"), port, log)
        daemon.start()
        results = {}

        def train(model):
            return Trainer(port, model, args.steps, args.every, args.seed)

        results["uninterrupted"] = train("uninterrupted").finish()

        # Trainer killed at a random step after a random number of checkpoints.
        kill_after = rng.randint(2, pushes - 2)
        t = train("trainer-crash")
        t.run_until(lambda e: e["event"] == "pushed" and e["step"] >= kill_after * args.every)
        time.sleep(rng.uniform(0, 0.05))  # somewhere between two checkpoints
        t.kill()
        report({"event": "trainer-killed", "scenario": "trainer-crash"})
        results["trainer-crash"] = train("trainer-crash").finish()

        # Daemon killed mid-run and restarted; the trainer waits for it and continues.
        t = train("daemon-crash")
        t.run_until(lambda e: e["event"] == "pushed" and
                    e["step"] >= rng.randint(2, pushes - 2) * args.every)
        daemon.kill()
        report({"event": "daemon-killed", "scenario": "daemon-crash"})
        time.sleep(0.5)
        seconds = daemon.start()
        report({"event": "daemon-restarted", "seconds_to_ready": round(seconds, 3)})
        results["daemon-crash"] = t.finish()

        # Both: the daemon dies, then the trainer; the daemon comes back, then the trainer,
        # which resumes from what the restarted daemon has.
        t = train("both-crash")
        t.run_until(lambda e: e["event"] == "pushed" and
                    e["step"] >= rng.randint(2, pushes - 2) * args.every)
        daemon.kill()
        t.kill()
        report({"event": "daemon-and-trainer-killed", "scenario": "both-crash"})
        seconds = daemon.start()
        report({"event": "daemon-restarted", "seconds_to_ready": round(seconds, 3)})
        results["both-crash"] = train("both-crash").finish()
        if daemon.stop() != 0:
            print("ckptd did not stop cleanly")
            return 1
        log.close()

    reference = results["uninterrupted"]["loss"]
    failed = False
    print("\nscenario        final held-out loss   accuracy   difference")
    for name, done in results.items():
        diff = abs(done["loss"] - reference)
        ok = diff <= args.tolerance
        failed |= not ok
        print(f"{name:15} {done['loss']:.9f}          {done['accuracy']:.4f}     {diff:.2e}"
              f"{'' if ok else '  FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
