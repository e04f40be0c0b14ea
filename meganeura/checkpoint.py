"""Checkpoints of a training program: what `Program.save(path)` writes and `Program.load(path)` reads.

A checkpoint is one safetensors file (the `safetensors` package: a JSON header and raw tensors,
readable by PyTorch and HF tools):
- tensors `<name>`: the model's parameters and buffers under their bare PyTorch names
  (`Program.state_dict()`, a tied parameter under each of its names), so that
  `model.load_state_dict(mn.load_safetensors(path))` loads them (`load_safetensors` gives only
  these from a checkpoint); format version 1 stored them as `param/<name>`, still read;
- tensors `optim/<name>`: the optimizer's state leaves on the device, torch's state names after
  the parameter's — Adam's moments (`<param>.exp_avg`, `<param>.exp_avg_sq`,
  `<param>.max_exp_avg_sq`), SGD's and RMSprop's `<param>.momentum_buffer`, RMSprop's
  `<param>.square_avg` and `<param>.grad_avg`, Adagrad's `<param>.sum`, Adamax's
  `<param>.exp_inf`, Adadelta's `<param>.square_avg` and `<param>.acc_delta`, NAdam's
  `<param>.mu_product` (a scalar the host keeps, as torch keeps it on the CPU: one value for all
  parameters of a group), and the step count `step` (all but SGD), from which the program's
  count of updates is restored (not the groups' hyper-parameter vectors
  `param_groups.<g>.hyper`: the runtime writes those from the optimizer, which `hyper` below
  restores, and the step count);
- tensors `accum/<name>` (with compile(accumulate=k), meganeura/gate.py): the gradient
  accumulators and the position in the cycle, so that a run resumed mid-cycle goes on exactly;
- metadata (strings): `format` ("meganeura-checkpoint"), `version`, `model` (the model's class),
  `optimizer` (its class), `hyper` (JSON: `param_groups`, each group's hyper-parameters by
  their PyTorch names, what `load` restores into the live optimizer, and `fused`; the device's
  layout of them is no part of the file, so it may change without a new format version),
  `scheduler` (JSON: the class and `state_dict()` of the optimizer's learning-rate scheduler,
  `optimizer.scheduler`, the last one made on it; empty without one), `steps` (train steps run),
  `rng` (JSON `{"seed": …, "step": …}`: the seed and step counter of the random numbers the step
  draws, ir/ops/random.py, so that a resumed run draws exactly what the uninterrupted one would;
  empty for a program that draws none, and a file without it leaves the program's own).

An inference program (compiled without loss and optimizer) loads a training checkpoint's weights
and buffers and nothing else (`load`).

Writes are atomic: the file is written beside its destination under a temporary name, flushed to
disk (fsync) and renamed over it, so a crash mid-write leaves the previous checkpoint whole.
A load checks everything before it writes anything: a file that is not a checkpoint (truncated,
foreign), of another format version or model class, or whose tensors do not match the program's
names, shapes and dtypes, is refused with every problem named, and the program is unchanged.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

import numpy as np

from meganeura.optim.optimizers import HYPER_PREFIX

if TYPE_CHECKING:
    from meganeura.compiler import Program

FORMAT = "meganeura-checkpoint"
VERSION = "2"  # 2: the weights under their bare names (1: under "param/")
READABLE_VERSIONS = ("1", "2")
V1_WEIGHT_PREFIX = "param/"


class CheckpointError(ValueError):
    """A checkpoint file that this program cannot load, with every reason."""


def safetensors_numpy():
    """The `safetensors.numpy` module, or an ImportError saying how to get it."""
    try:
        import safetensors.numpy
    except ImportError as error:
        raise ImportError("checkpoints need the safetensors package: pip install safetensors") from error
    return safetensors.numpy


def hyper_parameters(optimizer: Any) -> dict[str, Any]:
    """The optimizer's parameter groups' hyper-parameters and its `fused` flag, as JSON values."""
    if optimizer is None:
        return {}
    return {"param_groups": optimizer.hyper_state(), "fused": optimizer.fused}


def scheduler_metadata(optimizer: Any) -> str:
    """The attached scheduler's class and state as JSON, or "" without one."""
    scheduler = getattr(optimizer, "scheduler", None)
    if scheduler is None:
        return ""
    return json.dumps({"class": type(scheduler).__name__, "state": scheduler.state_dict()}, sort_keys=True)


def optimizer_state(program: Program) -> dict[str, np.ndarray]:
    """Copies of the optimizer's state leaves on the device, by name (not the hyper-parameters),
    and the state the host keeps for it (NAdam's mu_product: `Optimizer.host_state`)."""
    executable = program.require_executable()
    state = {
        name: executable.read_state(name) for name in program.traced.initial_states if not name.startswith(HYPER_PREFIX)
    }
    optimizer = program.compilation.optimizer
    return state if optimizer is None else state | optimizer.host_state(program.optimizer_steps)


def optimizer_state_problems(program: Program, current: dict[str, np.ndarray], state: dict[str, Any]) -> list[str]:
    """Every way `state` does not fit the optimizer state `current` (names, shapes, dtypes, and the
    host's part: `Optimizer.host_state_problems`)."""
    problems = state_problems(current, state, "optimizer state")
    optimizer = program.compilation.optimizer
    if not problems and optimizer is not None:
        problems += [f"optimizer state: {problem}" for problem in optimizer.host_state_problems(state)]
    return problems


def step_state(program: Program) -> dict[str, np.ndarray]:
    """Copies of the gate's states on the device (gradient accumulators, the micro-step counter)."""
    executable = program.require_executable()
    return {name: executable.read_state(name) for name in program.traced.step_states}


def state_problems(expected: dict[str, np.ndarray], given: dict[str, Any], what: str) -> list[str]:
    """Every way `given` fails to match `expected` by name, shape and dtype."""
    problems = []
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing:
        problems.append(f"{what}: missing {missing}")
    if unexpected:
        problems.append(f"{what}: unexpected {unexpected}")
    for name in sorted(set(expected) & set(given)):
        want, got = np.asarray(expected[name]), np.asarray(given[name])
        if want.shape != got.shape:
            problems.append(f"{what} {name!r}: shape {list(got.shape)}, expected {list(want.shape)}")
        elif want.dtype != got.dtype:
            problems.append(f"{what} {name!r}: dtype {got.dtype}, expected {want.dtype}")
    return problems


def load_optimizer_state(program: Program, state: dict[str, np.ndarray]) -> None:
    """Replace every optimizer state leaf; all are checked before any is written. The program's
    count of updates applied follows the state's (`Optimizer.steps_in`: its `step`), so the next
    step's bias corrections are those of the step after it."""
    current = optimizer_state(program)
    problems = optimizer_state_problems(program, current, state)
    if problems:
        raise CheckpointError("the optimizer state does not fit this program: " + "; ".join(problems))
    executable = program.require_executable()
    for name in current:
        if name in program.traced.initial_states:  # (the rest is the host's)
            executable.write_state(name, np.asarray(state[name], order="C"))  # (ascontiguousarray makes 0-d 1-d)
    optimizer = program.compilation.optimizer
    if optimizer is not None:
        program.optimizer_steps = optimizer.steps_in(state)
        optimizer.load_host_state(state, program.optimizer_steps)


def metadata(program: Program) -> dict[str, str]:
    optimizer = program.compilation.optimizer
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": type(program.compilation.model).__name__,
        "optimizer": type(optimizer).__name__ if optimizer is not None else "",
        "hyper": json.dumps(hyper_parameters(optimizer), sort_keys=True),
        "scheduler": scheduler_metadata(optimizer),
        "steps": str(program.steps),
        "rng": rng_metadata(program),
    }


def rng_metadata(program: Program) -> str:
    """The program's RNG seed and step counter as JSON, or "" when it draws no random numbers."""
    seed = getattr(program, "rng_seed", None)
    return "" if seed is None else json.dumps({"seed": seed, "step": program.rng_step}, sort_keys=True)


def saved_rng(meta: dict[str, str], program: Program) -> tuple[tuple[int, int] | None, list[str]]:
    """((seed, step) to restore, or None; problems) from a checkpoint's `rng` metadata."""
    text = meta.get("rng", "")
    if not text or getattr(program, "rng_seed", None) is None:
        return None, []
    try:
        saved = json.loads(text)
        seed, step = int(saved["seed"]), int(saved["step"])
    except (ValueError, KeyError, TypeError):
        return None, [f"its random-number state is not readable: {text!r}"]
    if not (0 <= seed < 2**64 and 0 <= step < 2**64):
        return None, [f"its random-number state is out of range: {text!r}"]
    return (seed, step), []


def save(program: Program, path: str | os.PathLike) -> None:
    """Write `program`'s parameters, buffers, optimizer state and step count to `path`, atomically."""
    st = safetensors_numpy()
    tensors = {name: np.ascontiguousarray(value) for name, value in program.state_dict().items()}
    tensors |= {f"optim/{name}": np.ascontiguousarray(value) for name, value in optimizer_state(program).items()}
    tensors |= {f"accum/{name}": np.ascontiguousarray(value) for name, value in step_state(program).items()}
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".meganeura-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(st.save(tensors, metadata=metadata(program)))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    if hasattr(os, "O_DIRECTORY"):  # the rename itself reaches the disk
        directory = os.open(folder, os.O_DIRECTORY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def read(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """(metadata, tensors) of a checkpoint file, or a CheckpointError when it is not one."""
    st = safetensors_numpy()
    from safetensors import safe_open

    try:
        with safe_open(os.fspath(path), framework="numpy") as file:
            meta = file.metadata() or {}
        tensors = st.load_file(os.fspath(path))
    except FileNotFoundError:
        raise
    except Exception as error:  # safetensors raises its own errors for short or garbled files
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from error
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a meganeura checkpoint (format {meta.get('format')!r})")
    if meta.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(
            f"{path}: checkpoint format version {meta.get('version')!r}; this meganeura reads "
            f"{', '.join(map(repr, READABLE_VERSIONS))}"
        )
    return meta, tensors


def model_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's weights and buffers among a checkpoint's tensors, by their PyTorch names: the
    bare names (no "/": the other parts' names have a prefix) and version 1's `param/<name>`."""
    return {
        name.removeprefix(V1_WEIGHT_PREFIX): value
        for name, value in tensors.items()
        if "/" not in name or name.startswith(V1_WEIGHT_PREFIX)
    }


def with_tied_names(names: dict[str, Any], weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`weights` with each tied parameter's missing names filled from a name it has (a version 1
    checkpoint kept a tied parameter under its first name only)."""
    filled = dict(weights)
    names_of: dict[int, list[str]] = {}
    for name, param in names.items():
        names_of.setdefault(id(param), []).append(name)
    for group in names_of.values():
        given = next((name for name in group if name in weights), None)
        if given is not None:
            filled |= {name: weights[given] for name in group if name not in weights}
    return filled


def scalars_restored(expected: dict[str, np.ndarray], given: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`given` with the 0-d values (Adam's step count) back in their shape: safetensors reads a
    0-d tensor back as shape [1]."""
    return {
        name: value.reshape(()) if name in expected and expected[name].ndim == 0 and value.size == 1 else value
        for name, value in given.items()
    }


def load(program: Program, path: str | os.PathLike) -> None:
    """Restore `program` from `path` (see the module docstring); nothing changes unless it all fits.
    A training program restores everything; an inference program the weights and buffers only."""
    from meganeura.weights import checked_state

    meta, tensors = read(path)
    problems = []
    model = type(program.compilation.model).__name__
    if meta.get("model") != model:
        problems.append(f"it holds a {meta.get('model')!r} model, this program trains a {model!r}")
    names = program.traced.state_names
    # The weights' expected shapes and dtypes, from the parameters (nothing read back from the device).
    expected = {name: np.broadcast_to(np.zeros((), p.state_dtype), p.shape) for name, p in names.items()}
    params = with_tied_names(names, scalars_restored(expected, model_tensors(tensors)))
    problems += state_problems(expected, params, "parameter")
    if not problems:
        problems += checked_state(names, params)[2]  # values: NaN, tied names holding different ones
    training = program.is_training
    optimizer = program.compilation.optimizer
    if training:
        wanted = type(optimizer).__name__ if optimizer is not None else ""
        if meta.get("optimizer") != wanted:
            problems.append(f"its optimizer is {meta.get('optimizer')!r}, this program's {wanted!r}")
        current_state, current_accum = optimizer_state(program), step_state(program)
        state = scalars_restored(current_state, {k[6:]: v for k, v in tensors.items() if k.startswith("optim/")})
        accum = scalars_restored(current_accum, {k[6:]: v for k, v in tensors.items() if k.startswith("accum/")})
        problems += optimizer_state_problems(program, current_state, state)
        problems += state_problems(current_accum, accum, "gradient accumulation state (compile(accumulate=...))")
    groups, schedule = None, None
    if training and optimizer is not None:
        groups, schedule, more = saved_schedule(meta, optimizer)
        problems += more
    rng, more = saved_rng(meta, program)
    problems += more
    if problems:
        raise CheckpointError(f"{path} does not fit this program: " + "; ".join(problems))
    program.load_state_dict(params)
    if not training:
        return
    load_optimizer_state(program, state)
    load_step_state(program, accum)
    if groups is not None:
        optimizer.load_hyper_state(groups)
    if schedule is not None:
        optimizer.scheduler.load_state_dict(schedule)
    program.steps = int(meta.get("steps", "0"))
    if rng is not None:
        program.rng_seed, program.rng_step = rng


def load_step_state(program: Program, state: dict[str, np.ndarray]) -> None:
    """Write the gate's states (checked by the caller) and set the program's position in the cycle."""
    from meganeura.gate import MICRO_STEP

    executable = program.require_executable()
    for name, value in state.items():
        executable.write_state(name, np.asarray(value, order="C"))
    if MICRO_STEP in state:
        program.micro_step = int(np.asarray(state[MICRO_STEP]).reshape(()))


def saved_schedule(meta: dict[str, str], optimizer: Any) -> tuple[Any, Any, list[str]]:
    """(the saved param_groups, the saved scheduler state, problems) of a checkpoint's metadata,
    checked against the live optimizer and its scheduler: a run saved with a schedule resumes
    only with the same kind of scheduler, and one without a schedule only without one."""
    problems = []
    try:
        groups = json.loads(meta.get("hyper", ""))["param_groups"]
    except (ValueError, KeyError, TypeError):
        return None, None, ["its metadata has no parameter groups ('hyper')"]
    problems += optimizer.hyper_problems(groups)
    scheduler = getattr(optimizer, "scheduler", None)
    wanted = type(scheduler).__name__ if scheduler is not None else ""
    try:
        saved = json.loads(meta["scheduler"]) if meta.get("scheduler") else None
    except ValueError:
        return groups, None, [*problems, "its scheduler metadata is not JSON"]
    found = saved["class"] if saved else ""
    if found != wanted:
        problems.append(
            f"its learning-rate scheduler is {found or 'none'}, this program's {wanted or 'none'}"
            " (make the same scheduler on the optimizer before load)"
        )
        return groups, None, problems
    return groups, (saved["state"] if saved else None), problems
