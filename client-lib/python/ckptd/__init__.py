"""Python client for ckptd: push a PyTorch state_dict (or a safetensors file), pull it back.

    from ckptd import Client
    ckpt = Client("http://127.0.0.1:8420")
    ckpt.push("run1", step, model.state_dict())
    model.load_state_dict(ckpt.pull("run1"))          # latest
"""
from .client import Client, CkptdError
from .safetensors import read_safetensors, safetensors_layout

__all__ = ["Client", "CkptdError", "read_safetensors", "safetensors_layout"]
