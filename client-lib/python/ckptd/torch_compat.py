"""Importing torch's distributed checkpoint modules where their own code does not import.

torch 1.13 (Debian 12's python3-torch) declares `ShardedTensorMetadata.tensor_properties` as
`field(default=TensorProperties())`: a dataclass instance, which is unhashable, as a default.
Python 3.11's `dataclasses` refuses such defaults ("mutable default ... use default_factory"),
so `torch.distributed._shard` (ShardedTensor, the checkpoint modules) fails to import there.
`import_distributed_checkpoint()` imports them with, for the duration of the import only, a
`dataclasses._get_field` that turns such a default into a `default_factory` returning a deep
copy of it — what torch 2.x declares itself. The shim is applied only where it is needed: torch
below 2.0 on Python 3.11 or later; elsewhere the modules are imported as they are.
"""
import contextlib
import copy
import dataclasses
import sys


def shim_needed(torch_version, python_version=None):
    """Whether torch `torch_version` (a version string such as "1.13.1") on Python
    `python_version` (a (major, minor) tuple; default: this interpreter) needs the shim."""
    python_version = tuple(python_version or sys.version_info[:2])
    try:
        major = int(str(torch_version).split(".")[0])
    except ValueError:
        return False
    return major < 2 and python_version >= (3, 11)


def _unhashable_dataclass_instance(value):
    return dataclasses.is_dataclass(value) and not isinstance(value, type) \
        and type(value).__hash__ is None


@contextlib.contextmanager
def dataclass_instance_defaults():
    """While active, a dataclass field whose default is an unhashable dataclass instance gets a
    `default_factory` that deep-copies it instead of being refused."""
    original = dataclasses._get_field

    def get_field(cls, a_name, a_type, *args, **kwargs):
        default = cls.__dict__.get(a_name, dataclasses.MISSING)
        if isinstance(default, dataclasses.Field):
            if _unhashable_dataclass_instance(default.default):
                value = default.default
                default.default = dataclasses.MISSING
                default.default_factory = lambda value=value: copy.deepcopy(value)
        elif _unhashable_dataclass_instance(default):
            setattr(cls, a_name, dataclasses.field(
                default_factory=lambda value=default: copy.deepcopy(value)))
        return original(cls, a_name, a_type, *args, **kwargs)

    dataclasses._get_field = get_field
    try:
        yield
    finally:
        dataclasses._get_field = original


def import_distributed_checkpoint():
    """torch's distributed checkpoint module for this torch: `torch.distributed.checkpoint`
    (torch >= 2.0), else `torch.distributed._shard.checkpoint` (with the shim where needed)."""
    import torch
    if not shim_needed(torch.__version__):
        try:
            import torch.distributed.checkpoint as dcp
            return dcp
        except ImportError:
            import torch.distributed._shard.checkpoint as dcp
            return dcp
    with dataclass_instance_defaults():
        import torch.distributed._shard.checkpoint as dcp
        import torch.distributed._shard.sharded_tensor  # noqa: F401 (its metadata, same fix)
    return dcp
