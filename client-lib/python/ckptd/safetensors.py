"""safetensors writing and reading without the safetensors package (format: 8-byte little-endian
header length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}},
then the tensors' bytes back to back). Tensors are torch tensors or numpy arrays; writing hands
out views of their memory (no copy), reading fills one buffer per tensor (no second copy)."""
import json
import os
import struct

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy comes with torch
    np = None
try:
    import torch
except ImportError:
    torch = None

# safetensors dtype name -> (numpy dtype name or None, element size)
_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
          "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8}
_TORCH_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
                "BOOL": "bool"}
_NUMPY = {"F64": "float64", "F32": "float32", "F16": "float16", "I64": "int64", "I32": "int32",
          "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "U16": "uint16",
          "U32": "uint32", "U64": "uint64"}


def _torch_names():
    return {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
            torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def _view(value):
    """(dtype name, shape, memoryview of the bytes) of a tensor or array, without copying
    contiguous CPU data."""
    if torch is not None and isinstance(value, torch.Tensor):
        names = _torch_names()
        if value.dtype not in names:
            raise TypeError(f"dtype {value.dtype} has no safetensors name")
        t = value.detach().cpu().contiguous()
        array = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
        return names[value.dtype], list(t.shape), memoryview(array.reshape(-1)).cast("B")
    if np is not None and isinstance(value, np.ndarray):
        for name, numpy_name in _NUMPY.items():
            if value.dtype == np.dtype(numpy_name):
                array = np.ascontiguousarray(value)
                return name, list(array.shape), memoryview(array.reshape(-1)).cast("B")
        raise TypeError(f"dtype {value.dtype} has no safetensors name")
    raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(value).__name__}")


def safetensors_layout(tensors, metadata=None):
    """Returns (prefix bytes: length + header, [memoryview per tensor], total size)."""
    header = {}
    views = []
    offset = 0
    for name, value in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"invalid tensor name {name!r}")
        dtype, shape, view = _view(value)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [offset, offset + view.nbytes]}
        views.append(view)
        offset += view.nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the header is padded to a multiple of 8 bytes
    prefix = struct.pack("<Q", len(text)) + text
    return prefix, views, len(prefix) + offset


def _read_exactly(readinto, view):
    done = 0
    while done < len(view):
        n = readinto(view[done:])
        if not n:
            raise EOFError(f"body ended {len(view) - done} bytes early")
        done += n


def read_safetensors(readinto, as_torch=True, on_bytes=None):
    """Reads a safetensors stream through `readinto(memoryview) -> int`. Returns
    (tensors dict in file order, metadata dict). Tensors are torch tensors when torch is
    available and `as_torch`, else numpy arrays (BF16 as uint16 bit patterns without torch)."""
    head = bytearray(8)
    _read_exactly(readinto, memoryview(head))
    (length,) = struct.unpack("<Q", head)
    if length > 100 << 20:
        raise ValueError(f"safetensors header of {length} bytes is implausible")
    text = bytearray(length)
    _read_exactly(readinto, memoryview(text))
    if on_bytes:
        on_bytes(8 + length)
    header = json.loads(bytes(text))
    metadata = header.pop("__metadata__", {}) or {}
    entries = sorted(header.items(), key=lambda item: item[1]["data_offsets"][0])
    use_torch = as_torch and torch is not None
    out = {}
    position = 0
    for name, info in entries:
        begin, end = info["data_offsets"]
        if begin != position:
            raise ValueError(f"tensor {name!r} does not follow the previous one")
        dtype, shape = info["dtype"], info["shape"]
        if dtype not in _SIZES:
            raise ValueError(f"unsupported dtype {dtype}")
        buffer = bytearray(end - begin)
        _read_exactly(readinto, memoryview(buffer))
        if on_bytes:
            on_bytes(end - begin)
        position = end
        if use_torch and dtype in _TORCH_NAMES:
            torch_dtype = getattr(torch, _TORCH_NAMES[dtype])
            if end == begin:
                t = torch.empty(shape, dtype=torch_dtype)
            elif dtype == "BF16":
                t = torch.frombuffer(buffer, dtype=torch.int16).view(torch.bfloat16)
            else:
                t = torch.frombuffer(buffer, dtype=torch_dtype)
            out[name] = t.reshape(shape)
        else:
            numpy_name = _NUMPY.get(dtype, "uint16")
            out[name] = np.frombuffer(buffer, dtype=numpy_name).reshape(shape)
    return out, metadata


def save_file(tensors, path, metadata=None):
    """Writes `tensors` (a dict of torch tensors or numpy arrays) as the safetensors file `path`
    (through a temporary file renamed into place), with `metadata` (strings) in __metadata__:
    a checkpoint `ckpt push` and curl can send."""
    prefix, views, _ = safetensors_layout(tensors, metadata)
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as out:
        out.write(prefix)
        for view in views:
            out.write(view)
    os.replace(temporary, path)


def load_file(path, as_torch=True):
    """(tensors, metadata) of the safetensors file `path`, as read_safetensors returns them."""
    with open(path, "rb") as file:
        return read_safetensors(file.readinto, as_torch)
