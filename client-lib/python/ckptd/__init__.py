"""Python client for ckptd: push a PyTorch state_dict (or a safetensors file), pull it back.

    from ckptd import Client
    ckpt = Client("http://127.0.0.1:8420")
    ckpt.push("run1", step, model.state_dict())
    model.load_state_dict(ckpt.pull("run1"))          # latest

With the optimizer (training.py): training_state(model, opt, step) -> (tensors, metadata) to
push, load_training_state(model, opt, tensors, metadata) -> step after a pull_with_metadata.
"""
from .client import Client, CkptdError
from .safetensors import read_safetensors, safetensors_layout
from .training import load_training_state, training_state

__all__ = ["Client", "CkptdError", "load_training_state", "read_safetensors",
           "safetensors_layout", "training_state"]
