"""Weights in: state dicts from numpy or PyTorch checked against a model and loaded all at once,
and safetensors files (PyTorch's, HF transformers', sharded ones with their index) read as arrays.

`load_state(params, state, strict)` is the one implementation behind `Module.load_state_dict`
and `Program.load_state_dict`: every value is converted (torch tensors: detached, moved to the
CPU, float32), every mismatch — missing and unexpected names, shapes, dtypes, non-finite values —
is collected into one `StateDictError`, and only when there is none is anything written, so a
failed load leaves the model as it was. With `strict=False`, missing and unexpected names are not
errors but are returned, as PyTorch's `load_state_dict` returns them (`IncompatibleKeys`). A tied
parameter (one Parameter under several names) is given by any of its names, or by several
holding equal values.

`load_safetensors(path)` reads a `.safetensors` file (of a meganeura checkpoint, the model's
weights), a sharded checkpoint's `model.safetensors.index.json`, or a folder holding either, into
name → numpy array, with the `safetensors` package's numpy API. bfloat16 tensors (HF's usual
dtype), which numpy lacks, are widened to float32 here from the file's own layout.

>>> from meganeura import nn
>>> nn.Linear(2, 3).load_state_dict({"weight": [[1.0, 2.0]] * 3}, strict=False)
IncompatibleKeys(missing_keys=['bias'], unexpected_keys=[])
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from meganeura.parameter import Parameter

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


class IncompatibleKeys(NamedTuple):
    """The names `load_state_dict(strict=False)` skipped, as PyTorch returns them."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class StateDictError(KeyError, ValueError):
    """Every way a state dict does not fit a model, in one error (nothing was loaded).

    A KeyError (missing or unexpected names) and a ValueError (shapes, dtypes, values) at once, so
    that code catching either kind of mismatch catches this one."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems)
        self.problems = problems

    def __str__(self) -> str:
        lines = "\n  ".join(self.problems)
        count = f"{len(self.problems)} mismatch{'es' if len(self.problems) > 1 else ''}"
        return f"load_state_dict: {count} between the model and the state, nothing was loaded:\n  {lines}"


# -- values ------------------------------------------------------------------------------------


def torch_tensor_type():
    """torch.Tensor if torch has been imported (a torch tensor cannot exist otherwise), else None."""
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None)


def state_array(value: Any) -> np.ndarray:
    """`value` as a numpy array: a torch tensor detached and copied to the CPU (float16 and
    bfloat16 widened to float32, which numpy holds exactly), a Parameter's current value, or
    anything np.asarray takes."""
    tensor_type = torch_tensor_type()
    if tensor_type is not None and isinstance(value, tensor_type):
        return torch_array(value)
    if isinstance(value, Parameter):
        return value.numpy()
    return np.asarray(value)


def torch_array(tensor) -> np.ndarray:
    import torch

    tensor = tensor.detach()
    if tensor.device.type == "meta":
        raise ValueError("a torch tensor on the 'meta' device has no values to load")
    if tensor.dtype in (torch.float16, torch.bfloat16):
        tensor = tensor.to(torch.float32)
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    return tensor.cpu().numpy()


def value_problem(name: str, array: np.ndarray, param: Parameter) -> str | None:
    """Why `array` cannot be loaded into `param` (shape, dtype, values), or None."""
    if tuple(array.shape) != param.shape:
        return f"{name}: shape {tuple(array.shape)} in the state, {param.shape} in the model"
    wanted = param.state_dtype
    kind = array.dtype.kind
    if wanted.kind == "f":
        if kind != "f":
            return f"{name}: dtype {array.dtype} in the state, the model needs floating-point values ({wanted})"
        if not np.all(np.isfinite(array)):
            return f"{name}: contains NaN or infinity"
        return None
    # An integer buffer (BatchNorm's num_batches_tracked, int64 as in PyTorch): integers, or
    # floats that hold integers (what a state dict saved before it was int64 holds).
    if kind in "iu":
        return None
    if kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
        return None
    return f"{name}: dtype {array.dtype} in the state, the model needs integer values ({wanted})"


# -- loading a state into a model -------------------------------------------------------------


def load_state(params: Mapping[str, Parameter], state: Mapping[str, Any], strict: bool = True) -> IncompatibleKeys:
    """Check `state` against `params` (every parameter and buffer by name, a tied one under each of
    its names) and, if it all fits, write it; the names skipped under `strict=False`. Raises one
    StateDictError naming every mismatch before anything is written."""
    writes, skipped, problems = checked_state(params, state, strict)
    if problems:
        raise StateDictError(problems)
    for param, array in writes:
        param.copy_(array)
    return skipped


def checked_state(
    params: Mapping[str, Parameter], state: Mapping[str, Any], strict: bool = True
) -> tuple[list[tuple[Parameter, np.ndarray]], IncompatibleKeys, list[str]]:
    """(the writes `state` makes, the names skipped, every problem) of loading `state` into `params`,
    writing nothing. A parameter under several names (tied weights: `lm_head.weight` is
    `wte.weight`) is given by any of them; where several are given they must hold equal values.
    It is missing only when none is given (then all its names are listed)."""
    if not isinstance(state, Mapping):
        raise TypeError(f"load_state_dict expects a mapping of names to arrays, got {type(state).__name__}")
    names_of: dict[int, list[str]] = {}
    for name, param in params.items():
        names_of.setdefault(id(param), []).append(name)
    absent = {name for names in names_of.values() if not any(n in state for n in names) for name in names}
    missing = [name for name in params if name in absent]
    unexpected = [name for name in state if name not in params]
    problems = []
    if strict and missing:
        problems.append(f"missing keys {missing}")
    if strict and unexpected:
        problems.append(f"unexpected keys {unexpected}")
    writes: list[tuple[Parameter, np.ndarray]] = []
    for names in names_of.values():
        given: dict[str, np.ndarray] = {}
        param = params[names[0]]
        for name in names:
            if name not in state:
                continue
            try:
                array = state_array(state[name])
            except (TypeError, ValueError) as error:
                problems.append(f"{name}: {error}")
                continue
            problem = value_problem(name, array, param)
            if problem is None:
                given[name] = array
            else:
                problems.append(problem)
        if not given:
            continue
        (first, array), *others = given.items()
        differing = [name for name, other in others if not np.array_equal(np.asarray(other, np.float64), array)]
        if differing:
            problems.append(
                f"{first} and {', '.join(differing)} name one tied parameter but hold different values: give one "
                "name, or equal values"
            )
        else:
            writes.append((param, array))
    return writes, IncompatibleKeys(missing, unexpected), problems


# -- safetensors files ------------------------------------------------------------------------


def load_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """name → numpy array from a safetensors checkpoint: one `.safetensors` file, a sharded
    checkpoint's index (`model.safetensors.index.json`, whose `weight_map` names each tensor's
    shard), or a folder holding either (as `save_pretrained` writes it). Arrays keep the file's
    dtype, except bfloat16, widened to float32; `load_state_dict` converts floats to float32. Of a
    meganeura checkpoint (`Program.save`), the model's weights and buffers only.

    >>> # model.load_state_dict(mn.load_safetensors("smollm2/model.safetensors"))
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = checkpoint_in_folder(path)
    if path.endswith(".json"):
        return load_sharded(path)
    arrays = load_shard(path)
    if safetensors_metadata(path).get("format") == "meganeura-checkpoint":
        from meganeura.checkpoint import model_tensors

        return model_tensors(arrays)  # the weights, not the optimizer's state
    return arrays


def checkpoint_in_folder(folder: str) -> str:
    for name in (INDEX_NAME, SINGLE_NAME):
        candidate = os.path.join(folder, name)
        if os.path.exists(candidate):
            return candidate
    found = sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))
    if len(found) == 1:
        return os.path.join(folder, found[0])
    raise FileNotFoundError(
        f"load_safetensors: {folder} has neither {INDEX_NAME} nor {SINGLE_NAME}"
        + (f"; it has {found}: pass one of them" if found else " nor any .safetensors file")
    )


def load_sharded(index_path: str) -> dict[str, np.ndarray]:
    """Every tensor of a sharded checkpoint, in the index's order; a shard that is missing, or
    lacks a tensor the index puts in it, is an error naming it."""
    with open(index_path) as file:
        try:
            index = json.load(file)
        except json.JSONDecodeError as error:
            raise ValueError(f"load_safetensors: {index_path} is not a JSON index: {error}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(f"load_safetensors: {index_path} has no 'weight_map' (name → shard file)")
    folder = os.path.dirname(index_path)
    shards: dict[str, dict[str, np.ndarray]] = {}
    for shard in dict.fromkeys(weight_map.values()):
        shard_path = os.path.join(folder, shard)
        if not os.path.exists(shard_path):
            raise FileNotFoundError(f"load_safetensors: shard {shard} named by {index_path} does not exist")
        shards[shard] = load_shard(shard_path)
    absent = [f"{name} (in {shard})" for name, shard in weight_map.items() if name not in shards[shard]]
    if absent:
        raise ValueError(f"load_safetensors: tensors the index names are not in their shards: {absent}")
    return {name: shards[shard][name] for name, shard in weight_map.items()}


def load_shard(path: str) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file, in the file's order."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ImportError(
            "load_safetensors needs the safetensors package: pip install safetensors (a dependency of meganeura)"
        ) from None
    header = safetensors_header(path)
    arrays = {}
    try:
        with safe_open(path, framework="numpy") as file:
            for name in file.keys():
                if header[name]["dtype"] == "BF16":
                    arrays[name] = bfloat16_tensor(path, header, name)
                else:
                    arrays[name] = file.get_tensor(name)
    except SafetensorError as error:
        raise ValueError(f"load_safetensors: {path} is not a readable safetensors file: {error}") from None
    order = sorted(arrays, key=lambda name: header[name]["data_offsets"][0])
    return {name: arrays[name] for name in order}


def safetensors_metadata(path: str) -> dict[str, str]:
    """The file's `__metadata__` (strings by name; empty when it has none)."""
    return safetensors_header(path, keep_metadata=True).get("__metadata__") or {}


def safetensors_header(path: str, keep_metadata: bool = False) -> dict[str, Any]:
    """The file's header (name → dtype, shape, data_offsets), read from its first bytes: an
    8-byte little-endian length, then that much JSON; with `keep_metadata`, `__metadata__` too."""
    with open(path, "rb") as file:
        head = file.read(8)
        if len(head) < 8:
            raise ValueError(f"load_safetensors: {path} is too short to be a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > os.path.getsize(path) - 8:
            raise ValueError(f"load_safetensors: {path} is truncated or not a safetensors file")
        try:
            header = json.loads(file.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ValueError(f"load_safetensors: {path} is not a safetensors file (its header is not JSON)") from None
    if not keep_metadata:
        header.pop("__metadata__", None)
    return header


def bfloat16_tensor(path: str, header: dict[str, Any], name: str) -> np.ndarray:
    """A bfloat16 tensor widened to float32: bfloat16 is the top half of a float32's bits."""
    entry = header[name]
    start, end = entry["data_offsets"]
    count = (end - start) // 2
    with open(path, "rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        file.seek(8 + length + start)
        halves = np.frombuffer(file.read(end - start), dtype="<u2", count=count)
    return (halves.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])
