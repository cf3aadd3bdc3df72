"""A training job's whole state as one checkpoint: the model's weights, the optimizer's
per-parameter state and the step, under stable names that ckptd policies can match.

    tensors, metadata = training_state(model, optimizer, step, scheduler)
    ckpt.push("run1", step, tensors, metadata=metadata)
    ...
    tensors, metadata = ckpt.pull_with_metadata("run1")          # after a restart
    step = load_training_state(model, optimizer, tensors, metadata, scheduler)

Tensor names:
  model.<key>                     every entry of model.state_dict() (weights and buffers)
  optim.<parameter>.<state key>   every tensor the optimizer keeps for a parameter, named by the
                                  parameter's name in the model (Adam: exp_avg, exp_avg_sq,
                                  step; SGD with momentum: momentum_buffer)
Metadata (strings, never quantized):
  step                            the training step
  optim.param_groups              JSON list, one object per parameter group: its numeric and
                                  boolean hyperparameters (lr, betas, eps, weight_decay, ...),
                                  so a learning rate a scheduler has changed resumes as it was
  optim.state_numbers             JSON object: per-parameter state kept as Python numbers
                                  rather than tensors (older PyTorch keeps Adam's step so), by
                                  parameter name
  optim.state_keys                JSON object: the state keys each parameter had, by parameter
                                  name, so that a checkpoint whose optimizer tensors are gone
                                  (dropped by retention's tensor rules) is told from one saved
                                  before the optimizer's first step
  sched.state                     JSON: the LR scheduler's state_dict() (its functions left out:
                                  the scheduler being loaded keeps its own)

So a lossy policy can give each kind of tensor its own rule; the server's "full-state" preset
does it for Adam's moments (README, "Lossy mode"):
  {"tensors": "*exp_avg", "max_pointwise_rel_error": 0.5, "zero_below_mean": 3},
  {"tensors": "*exp_avg_sq", "max_pointwise_rel_error": 0.3}
"""
import json
import numbers
import warnings

_MODEL = "model."
_OPTIM = "optim."
_GROUPS = "optim.param_groups"
_NUMBERS = "optim.state_numbers"
_STATE_KEYS = "optim.state_keys"
_SCHEDULER = "sched.state"


class MissingOptimizerState(ValueError):
    """The checkpoint was saved with optimizer state that it no longer holds (retention's tensor
    rules drop optimizer tensors from older versions): resuming from it would restart the
    optimizer's moments from zero."""


def _parameter_names(model):
    return {id(p): name for name, p in model.named_parameters()}


def _hyperparameters(group):
    """The JSON-able hyperparameters of a param group: numbers, booleans and lists of numbers."""
    out = {}
    for key, value in group.items():
        if key == "params":
            continue
        if isinstance(value, bool) or isinstance(value, numbers.Real):
            out[key] = value
        elif isinstance(value, (tuple, list)) and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
            out[key] = list(value)
    return out


def training_state(model, optimizer=None, step=None, scheduler=None):
    """(tensors, metadata) of a training job, for Client.push. The tensors are the model's and
    the optimizer's own (not copies): push them before the next optimizer step. `scheduler`: an
    LR scheduler whose state goes into the metadata. Raises ValueError when the optimizer holds
    a parameter that is not in the model, or keeps state that is neither a tensor nor a number
    (LBFGS's history lists), or the scheduler's state is not JSON."""
    tensors = {_MODEL + key: value for key, value in model.state_dict().items()}
    metadata = {}
    if step is not None:
        metadata["step"] = str(int(step))
    if optimizer is not None:
        names = _parameter_names(model)
        numbers_by_name = {}
        state_keys = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in names:
                    raise ValueError("the optimizer holds a parameter that is not in the model "
                                     f"(shape {tuple(p.shape)}): pass the model it optimizes")
                for key, value in optimizer.state.get(p, {}).items():
                    if hasattr(value, "shape"):
                        tensors[f"{_OPTIM}{names[id(p)]}.{key}"] = value
                    elif isinstance(value, (bool, numbers.Real)):
                        numbers_by_name.setdefault(names[id(p)], {})[key] = value
                    else:
                        raise ValueError(f"optimizer state {key!r} of {names[id(p)]!r} is a "
                                         f"{type(value).__name__}: only tensors and numbers "
                                         "are saved")
                    state_keys.setdefault(names[id(p)], []).append(key)
        metadata[_GROUPS] = json.dumps([_hyperparameters(g) for g in optimizer.param_groups])
        metadata[_STATE_KEYS] = json.dumps(state_keys)
        if numbers_by_name:
            metadata[_NUMBERS] = json.dumps(numbers_by_name)
    if scheduler is not None:
        state = {k: v for k, v in scheduler.state_dict().items() if not callable(v)}
        try:
            metadata[_SCHEDULER] = json.dumps(state)
        except TypeError as error:
            raise ValueError(f"the scheduler's state is not JSON ({error}): it cannot be saved "
                             "in the checkpoint's metadata") from None
    return tensors, metadata


def load_training_state(model, optimizer, tensors, metadata=None, scheduler=None,
                        allow_missing_optimizer_state=False):
    """Loads what training_state saved into `model` (strictly: every key, nothing else),
    `optimizer` (may be None): each parameter's state by its name, and the param groups'
    hyperparameters from `metadata`, and `scheduler` (may be None). Returns the step from
    `metadata`, or None. Raises, before changing anything:
      MissingOptimizerState (a ValueError) when the checkpoint was saved with optimizer state it
        no longer holds (retention dropped it from this older version): resume from a version
        that keeps it (the latest, or a tagged one), or pass allow_missing_optimizer_state=True
        to load the weights and start the optimizer's state afresh (with a warning);
      ValueError when the optimizer state does not fit the optimizer (state of a parameter the
        model does not have or the optimizer does not optimize, or a different number of param
        groups), or a scheduler is given and the checkpoint has no scheduler state."""
    metadata = metadata or {}
    state_dict = None
    if scheduler is not None and _SCHEDULER not in metadata:
        raise ValueError("the checkpoint has no LR scheduler state: it was saved without "
                         "training_state(..., scheduler=...)")
    if optimizer is not None:
        missing = _missing_optimizer_state(tensors, metadata)
        if missing and allow_missing_optimizer_state:
            # A parameter with part of its state would fail the optimizer's next step: each one
            # missing anything starts afresh as a whole.
            gone = {name.rpartition(".")[0] for name in missing}
            tensors = {k: v for k, v in tensors.items() if k.rpartition(".")[0] not in gone}
            numbers = json.loads(metadata.get(_NUMBERS, "{}"))
            metadata = dict(metadata)
            metadata[_NUMBERS] = json.dumps({k: v for k, v in numbers.items()
                                              if f"{_OPTIM}{k}" not in gone})
        if missing and not allow_missing_optimizer_state:
            raise MissingOptimizerState(
                f"the checkpoint lacks the optimizer state of {len(missing)} tensor(s) it was "
                f"saved with (e.g. {missing[0]!r}): retention's tensor rules drop optimizer state "
                "from older versions. Resume from a version that keeps it (the latest, or a "
                "tagged one), or pass allow_missing_optimizer_state=True to start the optimizer "
                "afresh")
        if missing:
            warnings.warn(f"resuming without the optimizer state of {len(missing)} tensor(s) "
                          f"(e.g. {missing[0]!r}): the optimizer starts them afresh",
                          stacklevel=2)
        parameters = dict(model.named_parameters())
        names = {id(p): name for name, p in parameters.items()}
        by_name = {}
        for key, value in tensors.items():
            if not key.startswith(_OPTIM):
                continue
            name, _, state_key = key[len(_OPTIM):].rpartition(".")
            if name not in parameters:
                raise ValueError(f"checkpoint tensor {key!r}: the model has no parameter {name!r}")
            by_name.setdefault(name, {})[state_key] = value
        for name, values in json.loads(metadata.get(_NUMBERS, "{}")).items():
            if name not in parameters:
                raise ValueError(f"checkpoint has optimizer state for {name!r}: the model has no "
                                 "such parameter")
            by_name.setdefault(name, {}).update(values)
        state_dict = optimizer.state_dict()
        state_dict["state"] = {}
        index = 0
        for group in optimizer.param_groups:
            for p in group["params"]:
                name = names.get(id(p))
                if name in by_name:
                    state_dict["state"][index] = by_name.pop(name)
                index += 1
        if by_name:
            raise ValueError(f"checkpoint has optimizer state for {sorted(by_name)[0]!r}, which "
                             "the optimizer does not optimize")
        if _GROUPS in metadata:
            saved = json.loads(metadata[_GROUPS])
            if len(saved) != len(state_dict["param_groups"]):
                raise ValueError(f"checkpoint has {len(saved)} optimizer param groups, the "
                                 f"optimizer {len(state_dict['param_groups'])}")
            for live, values in zip(state_dict["param_groups"], saved):
                for key, value in values.items():
                    if key in live:
                        live[key] = tuple(value) if isinstance(live[key], tuple) else value
    model.load_state_dict({k[len(_MODEL):]: v for k, v in tensors.items()
                           if k.startswith(_MODEL)})
    if state_dict is not None:
        optimizer.load_state_dict(state_dict)
    if scheduler is not None:
        scheduler.load_state_dict(json.loads(metadata[_SCHEDULER]))
    return int(metadata["step"]) if "step" in metadata else None


def _missing_optimizer_state(tensors, metadata):
    """The names ("optim.<parameter>.<key>") of the optimizer state the checkpoint was saved
    with and does not hold. A checkpoint written before the state's keys were recorded counts as
    missing all of it when it has an optimizer's hyperparameters and no optimizer state at all
    (what retention leaves of one; an optimizer saved before its first step looks the same, and
    allow_missing_optimizer_state loads it)."""
    numbers_by_name = json.loads(metadata.get(_NUMBERS, "{}"))
    if _STATE_KEYS not in metadata:
        has_state = numbers_by_name or any(k.startswith(_OPTIM) for k in tensors)
        return ["optim.*"] if _GROUPS in metadata and not has_state else []
    saved = json.loads(metadata[_STATE_KEYS])
    missing = []
    for name, keys in saved.items():
        for key in keys:
            if f"{_OPTIM}{name}.{key}" not in tensors and key not in numbers_by_name.get(name, {}):
                missing.append(f"{_OPTIM}{name}.{key}")
    return missing
