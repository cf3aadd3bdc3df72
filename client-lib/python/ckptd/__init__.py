"""Python client for ckptd: push a PyTorch state_dict (or a safetensors file), pull it back.

    from ckptd import Client
    ckpt = Client("http://127.0.0.1:8420")
    ckpt.push("run1", step, model.state_dict())
    model.load_state_dict(ckpt.pull("run1"))          # latest

Without holding training up: `with ckpt.background() as pusher: future = pusher.push(...)`
returns once the tensors are copied to host memory; `ckpt.push_parallel(...)` sends a large
checkpoint as shards over several connections (background.py).

With the optimizer (training.py): training_state(model, opt, step, scheduler) -> (tensors,
metadata) to push, load_training_state(model, opt, tensors, metadata, scheduler) -> step after a
pull_with_metadata. save_file(tensors, path) writes a safetensors file, load_file(path) reads one.

Coded here, the wire carrying the stored bytes (edge.py): Client(url, encoded=True) pushes deltas
against the last version it pushed or pulled and pulls "since" it; edge.available() says whether
the native codec module is installed. What the client's codec itself refuses (a damaged body or
reference, a file it cannot write, an invalid model name) raises CodecError, a RuntimeError with
`code` (e.g. "DATA_LOSS"); the daemon's answers raise CkptdError.
"""
from . import edge
from .background import BackgroundPusher, push_parallel, split_into_shards
from .client import Client, CkptdError
from .edge import CodecError
from .safetensors import load_file, read_safetensors, safetensors_layout, save_file
from .training import MissingOptimizerState, load_training_state, training_state

__all__ = ["BackgroundPusher", "edge", "Client", "CkptdError", "CodecError",
           "MissingOptimizerState", "load_file", "load_training_state", "push_parallel",
           "read_safetensors", "safetensors_layout", "save_file", "split_into_shards",
           "training_state"]
