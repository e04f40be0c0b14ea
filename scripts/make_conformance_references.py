"""Write PyTorch's side of the conformance table (tests/conformance.py): tests/reference/conformance.npz.

    /tmp/torch311/bin/python scripts/make_conformance_references.py

This script imports only torch and numpy (and the table, which is data), so it runs wherever
torch installs. It is deterministic: each case draws its inputs from a numpy generator seeded by
the case's id (float32 values, so that meganeura's float32 device run starts from the same
numbers), torch runs on the CPU in float64 with one thread (its default dtype float64, so that
constants such as torch.zeros(3, 4) are float64 too; a case may ask for float32, where torch's
semantics depend on the dtype), modules and random draws are seeded by the
case's id, and the zip members carry a fixed date, so running it again writes the same bytes.

Every case of the table is evaluated, the unsupported items' too (meganeura's side must fail on
them; the values are there for the day it does not). The file holds, by case id:

    meta                      JSON: {case id: the case's fingerprint (what torch's side reads of
                              it)}: tests check that the table did not change since
    <id>/input/<name>         the inputs: float32, or int32
    <id>/out/<k>              each output, flattened (nested tuples in order, None left out):
                              float64 (bool as 0/1; float32 for a random sample), or int32
                              (torch's int64)
    <id>/weight/<k>           the cotangent r_k of each differentiable float output (0 where the
                              output is NaN or ±inf; float32 values)
    <id>/grad/<name>          d Σ_k Σ(out_k · r_k) / d input (float64), for the differentiated inputs
                              torch gives a gradient for
    <id>/state/<name>         a module case: the module's state_dict before the call (float32
                              values; integer buffers as int32)
    <id>/param_grad/<name>    a module case: the gradient of each parameter
    <id>/buffer/<name>        a module case: each buffer after the call (BatchNorm's statistics)
    <id>/init/<name>          an optimizer case: p and q before the first step (float32 values)
    <id>/feed<k>/<name>       an optimizer case: s, a, b of step k
    <id>/step<k>/<name>       an optimizer case: p and q after step k (float64)
    <id>/lr                   a scheduler case: every group's learning rate after construction
                              and after each step, [steps + 1, groups]
    <id>/value                an init case of a deterministic fill: the filled tensor; calculate_gain's value
    <id>/points, cdf, moments an init case of a distribution: the summary (tests/conformance.py
                              distribution_summary) of SAMPLE_SIZE numbers drawn by filling the
                              tensor again and again
    <id>/gram                 nn.init.orthogonal_: W·Wᵀ (or Wᵀ·W, the smaller) of the first draw
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim import lr_scheduler

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "reference" / "conformance.npz"
SPECIAL_COUNTS = {"nan": 2, "inf": 1, "-inf": 1}


def load_table():
    """tests/conformance.py (data only), imported by its path."""
    spec = importlib.util.spec_from_file_location("conformance", ROOT / "tests" / "conformance.py")
    table = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("conformance", table)
    spec.loader.exec_module(table)
    return table


TABLE = load_table()


def generated(description: tuple, rng: np.random.Generator) -> np.ndarray:
    """An input as tests/conformance.py describes it: float64 holding float32 values, or int32."""
    kind = description[0]
    if kind == "values":
        data = np.array(description[1])
        return data.astype(np.int32) if data.dtype.kind in "iu" else data.astype(np.float32).astype(np.float64)
    shape = tuple(description[1])
    if kind == "ints":
        return rng.integers(description[2], description[3], size=shape).astype(np.int32)
    if kind == "normal":
        value = rng.normal(size=shape)
    elif kind == "uniform":
        value = rng.uniform(description[2], description[3], size=shape)
    elif kind == "away":
        value = rng.uniform(0.5, 2.0, size=shape) * rng.choice([-1.0, 1.0], size=shape)
    elif kind == "tied":
        value = rng.integers(0, 3, size=shape).astype(np.float64)
    elif kind == "special":
        value = rng.normal(size=shape)
        flat = value.reshape(-1)
        picks = rng.choice(flat.size, sum(SPECIAL_COUNTS.values()), replace=False)
        flat[picks[:2]], flat[picks[2]], flat[picks[3]] = np.nan, np.inf, -np.inf
    else:
        raise ValueError(f"unknown input description {description!r}")
    return value.astype(np.float32).astype(np.float64)


def namespace() -> dict:
    return {"torch": torch, "F": F, "nn": nn, "optim": optim, "lr_scheduler": lr_scheduler, "math": math}


def flattened(value) -> list:
    """The outputs in order: nested tuples and lists flattened, None left out."""
    if value is None:
        return []
    if isinstance(value, (tuple, list)):
        return [leaf for part in value for leaf in flattened(part)]
    return [value]


def as_array(value) -> np.ndarray:
    if not isinstance(value, torch.Tensor):
        return np.asarray(value, dtype=np.float64)
    value = value.detach()
    if value.dtype == torch.bool:
        return value.to(torch.float64).numpy()
    if value.is_floating_point():
        return value.to(torch.float64).numpy()
    return value.numpy().astype(np.int32)


def stored_exactly(value: np.ndarray) -> np.ndarray:
    """A float array of float32 values as float32 (half the bytes), other arrays as they are."""
    return value.astype(np.float32) if value.dtype == np.float64 else value


def float32_exact(module: nn.Module) -> None:
    """Round every float parameter and buffer to float32's values (kept in the module's dtype)."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(tensor.float().double())


def state_array(value: torch.Tensor) -> np.ndarray:
    value = value.detach()
    return value.float().numpy() if value.is_floating_point() else value.numpy().astype(np.int32)


def expression_case(case_id: str, case, arrays: dict) -> None:
    dtype = getattr(torch, case.torch_dtype)
    torch.set_default_dtype(dtype)  # back to float64 in generate()
    rng = np.random.default_rng(TABLE.case_seed(case_id))
    inputs = {name: generated(d, rng) for name, d in case.inputs.items()}
    differentiated = [n for n, v in inputs.items() if v.dtype != np.int32 and (case.grads is None or n in case.grads)]
    tensors = {}
    for name, value in inputs.items():
        arrays[f"{case_id}/input/{name}"] = stored_exactly(value)
        tensor = torch.from_numpy(value.astype(np.int64) if value.dtype == np.int32 else value.copy())
        tensor = tensor if tensor.dtype == torch.int64 else tensor.to(dtype)
        tensors[name] = tensor.requires_grad_(True) if name in differentiated else tensor
    scope = namespace() | tensors
    torch.manual_seed(TABLE.case_seed(case_id))
    if case.module:
        m = eval(case.module, scope)
        m.to(dtype)
        float32_exact(m)
        m.train(case.train)
        for name, value in m.state_dict().items():
            arrays[f"{case_id}/state/{name}"] = state_array(value)
        scope["m"] = m
    outputs = flattened(eval(case.expr, scope))
    total = None
    for k, out in enumerate(outputs):
        # a random sample is compared in float32 (tests/test_conformance.py sample_problems)
        arrays[f"{case_id}/out/{k}"] = as_array(out) if case.compare == "values" else stored_exactly(as_array(out))
        if case.compare == "values" and isinstance(out, torch.Tensor) and out.requires_grad:
            weight = np.where(np.isfinite(as_array(out)), rng.normal(size=tuple(out.shape)), 0.0)
            weight = weight.astype(np.float32).astype(np.float64)  # exact in either dtype
            arrays[f"{case_id}/weight/{k}"] = stored_exactly(weight)
            term = (out * torch.from_numpy(weight).to(out.dtype)).sum()
            total = term if total is None else total + term
    if case.module:
        for name, value in scope["m"].named_buffers():
            arrays[f"{case_id}/buffer/{name}"] = as_array(value)
    if total is None:
        return
    wrt = {f"grad/{n}": tensors[n] for n in differentiated}
    if case.module:
        wrt |= {f"param_grad/{n}": p for n, p in scope["m"].named_parameters() if p.requires_grad}
    grads = torch.autograd.grad(total, list(wrt.values()), allow_unused=True)
    for key, grad in zip(wrt, grads, strict=True):
        if grad is not None:
            arrays[f"{case_id}/{key}"] = grad.to(torch.float64).numpy()


OPTIMIZER_SHAPES = {"p": (3, 4), "q": (4,)}
FEED_SHAPES = {"s": (3, 4), "a": (3, 4), "b": (4,)}


def optimizer_loss(p, q, s, a, b):
    """The loss every optimizer case minimises: ½·Σ(p·s − a)² + Σ(q·b) (tests/conformance.py)."""
    return ((p * s - a) ** 2).sum() * 0.5 + (q * b).sum()


def optimizer_case(case_id: str, case, arrays: dict) -> None:
    rng = np.random.default_rng(TABLE.case_seed(case_id))
    params = {}
    for name, shape in OPTIMIZER_SHAPES.items():
        value = rng.normal(size=shape).astype(np.float32)
        arrays[f"{case_id}/init/{name}"] = value
        params[name] = nn.Parameter(torch.from_numpy(value.astype(np.float64)))
    scope = namespace() | params | {"params": list(params.values())}
    opt = eval(case.optimizer, scope)
    sched = eval(case.scheduler, scope | {"opt": opt}) if case.scheduler else None
    for step in range(case.steps):
        feed = {name: rng.normal(size=shape).astype(np.float32) for name, shape in FEED_SHAPES.items()}
        for name, value in feed.items():
            arrays[f"{case_id}/feed{step}/{name}"] = value
        opt.zero_grad()
        optimizer_loss(*params.values(), *(torch.from_numpy(v.astype(np.float64)) for v in feed.values())).backward()
        opt.step()
        if sched is not None:
            sched.step()
        for name, p in params.items():
            arrays[f"{case_id}/step{step}/{name}"] = p.detach().numpy().copy()


def scheduler_case(case_id: str, case, arrays: dict) -> None:
    params = {name: nn.Parameter(torch.zeros(shape)) for name, shape in OPTIMIZER_SHAPES.items()}
    scope = namespace() | params | {"params": list(params.values())}
    opt = eval(case.optimizer, scope)
    sched = eval(case.scheduler, scope | {"opt": opt})
    rates = [[group["lr"] for group in opt.param_groups]]
    for step in range(case.steps):
        opt.step()  # no gradients: nothing moves, but the scheduler sees a step taken
        sched.step(case.metrics[step]) if case.metrics else sched.step()
        rates.append([group["lr"] for group in opt.param_groups])
    arrays[f"{case_id}/lr"] = np.array(rates, dtype=np.float64)


def init_case(case_id: str, case, arrays: dict) -> None:
    torch.manual_seed(TABLE.case_seed(case_id))
    if not case.shape:
        arrays[f"{case_id}/value"] = np.float64(eval(case.expr, namespace()))
        return
    w = torch.zeros(case.shape, dtype=torch.float32)
    draws = []
    with torch.no_grad():
        for _ in range(1 if case.compare == "values" else TABLE.draws_needed(case.shape)):
            eval(case.expr, namespace() | {"w": w})
            draws.append(w.numpy().astype(np.float64))
    if case.compare == "values":
        arrays[f"{case_id}/value"] = draws[0]
        return
    for key, value in TABLE.distribution_summary(np.concatenate([d.ravel() for d in draws])).items():
        arrays[f"{case_id}/{key}"] = value
    if case.compare == "gram":
        rows = draws[0].reshape(case.shape[0], -1)
        arrays[f"{case_id}/gram"] = rows @ rows.T if rows.shape[0] <= rows.shape[1] else rows.T @ rows


def generate() -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    arrays: dict[str, np.ndarray] = {}
    meta = {}
    write = {
        "Case": expression_case, "OptimizerCase": optimizer_case, "SchedulerCase": scheduler_case,
        "InitCase": init_case,
    }  # fmt: skip
    for case_id, (_, case) in TABLE.cases().items():
        meta[case_id] = case.fingerprint()
        torch.set_default_dtype(torch.float64)
        try:
            write[type(case).__name__](case_id, case, arrays)
        except Exception as error:
            raise RuntimeError(f"{case_id}: {case}: {error}") from error
    return {"meta": np.array(json.dumps(meta, sort_keys=True))} | arrays


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """np.savez_compressed's format with a fixed date on every member, so the bytes depend only on the arrays."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


if __name__ == "__main__":
    arrays = generate()
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_bytes(npz_bytes(arrays))
    cases = len(json.loads(str(arrays["meta"])))
    print(f"{REFERENCE.name}: {cases} cases, {len(arrays)} arrays, {REFERENCE.stat().st_size} bytes")
