"""Write the PyTorch reference fixture of tests/test_select.py: tests/reference/select.npz.

    /tmp/torch311/bin/python scripts/make_select_references.py

This script imports only torch and numpy (never meganeura), so it runs wherever torch installs,
and the fixture lets CI check meganeura's casts, constants, scans, selections and integer
indexing against PyTorch without torch. It is deterministic: every input comes from a seeded
numpy generator (float32 values, so that meganeura's float32 runs start from the same numbers),
torch runs on the CPU in float64, and the zip members carry a fixed date.

Each case is a function of named inputs, written with torch's names. The file holds, by name:

    <case>/input/<name>    the inputs: float32 values (as float64), or int32 indices
    <case>/out/<k>         each output: float64, or int32 for integer ones (torch's int64)
    <case>/weight/<k>      a random weight per float output (0 where the output is NaN or ±inf)
    <case>/grad/<name>     d Σ_k Σ(out_k · weight_k) / d input, for each float input the case does
                           not detach (float64)

tests/test_select.py builds the same cases with meganeura (its CASES table has the same names)
and compares values and gradients.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_npz import write_npz  # noqa: E402  (a sibling: numpy and the standard library only)

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "reference" / "select.npz"
RNG = np.random.default_rng(40)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32).astype(np.float64)


def ties(*shape: int) -> np.ndarray:
    """Small whole numbers: many equal values along any dim."""
    return RNG.integers(0, 3, size=shape).astype(np.float64)


def indices(low: int, high: int, *shape: int) -> np.ndarray:
    return RNG.integers(low, high, size=shape).astype(np.int32)


def with_nans(x: np.ndarray, count: int) -> np.ndarray:
    flat = x.copy().reshape(-1)
    flat[RNG.choice(flat.size, count, replace=False)] = np.nan
    return flat.reshape(x.shape)


SPECIAL = np.array([[2.7, -2.7, 0.5, -0.5, 1e10, -1e10], [np.nan, np.inf, -np.inf, 123456.9, -7.0, 2147483520.0]])
WITH_ZEROS = normal(3, 6, 2)
WITH_ZEROS[0, 2, 0] = WITH_ZEROS[1, 4, 1] = WITH_ZEROS[2, 1, 0] = WITH_ZEROS[2, 3, 0] = 0.0
NAN_ROWS = with_nans(normal(3, 7, 4), 6)
TIED = ties(3, 5, 4)
TIED_NAN = with_nans(ties(3, 5, 4), 4)
X345 = normal(3, 4, 5)
I3 = np.array([2, 0, -1], np.int32)
J21 = np.array([[1], [3]], np.int32)

# name -> (function of torch tensors, returning a tensor or a tuple of tensors; its inputs)
CASES = {
    "cast_int": (lambda x: x.float().int(), {"x": SPECIAL}),
    "cast_long": (lambda x: x.long(), {"x": normal(3, 4) * 50}),
    "cast_float": (lambda i: i.float() * 0.5, {"i": indices(-1000, 1000, 3, 4)}),
    "arange_end": (lambda: torch.arange(5), {}),
    "arange_step": (lambda: torch.arange(2, 11, 3), {}),
    "arange_down": (lambda: torch.arange(10, 0, -3), {}),
    "arange_float": (lambda: torch.arange(-3.5, 20.2, 0.7), {}),
    "arange_tenths": (lambda: torch.arange(0, 1, 0.1), {}),
    "arange_float_dtype": (lambda: torch.arange(1, 6, 2, dtype=torch.float32), {}),
    "full_int": (lambda: torch.full((2, 3), 7), {}),
    "full_float": (lambda: torch.full((2, 3), -1.5), {}),
    "zeros_ones": (lambda x: (torch.zeros(3, 4) + torch.ones((3, 4)) * x, torch.ones_like(x)), {"x": normal(3, 4)}),
    "zeros_long": (lambda: torch.zeros(2, 2, dtype=torch.long), {}),
    "full_like": (lambda x: torch.full_like(x, 2.5) * x, {"x": normal(2, 3)}),
    "tensor": (lambda x: x * torch.tensor([[0.5, -1.0, 2.0], [3.0, 0.25, -4.0]]), {"x": normal(4, 2, 3)}),
    "tensor_int": (lambda: torch.tensor([[3, -1], [0, 7]]), {}),
    "eye": (lambda: torch.eye(3, 5), {}),
    "eye_square": (lambda x: torch.eye(4).double() @ x, {"x": normal(4, 3)}),
    "tril": (lambda x: torch.tril(x), {"x": normal(2, 4, 6)}),
    "tril_below": (lambda x: x.tril(-1), {"x": normal(2, 4, 6)}),
    "triu_above": (lambda x: torch.triu(x, 2), {"x": normal(5, 3)}),
    "flip": (lambda x: torch.flip(x, (0, 2)), {"x": X345}),
    "flip_method": (lambda x: x.flip(-1), {"x": X345}),
    "roll": (lambda x: torch.roll(x, (1, -2), (0, 2)), {"x": X345}),
    "roll_flat": (lambda x: torch.roll(x, 4), {"x": X345}),
    "cumsum_0": (lambda x: torch.cumsum(x, 0), {"x": X345}),
    "cumsum_1": (lambda x: x.cumsum(1), {"x": X345}),
    "cumsum_last": (lambda x: x.cumsum(-1), {"x": X345}),
    "cumsum_int": (lambda i: torch.cumsum(i, 1), {"i": indices(-5, 6, 3, 5)}),
    "cumprod": (lambda x: torch.cumprod(x, 1), {"x": WITH_ZEROS}),
    "cumprod_last": (lambda x: x.cumprod(-1), {"x": normal(3, 5)}),
    "gather": (lambda x, i: torch.gather(x, 1, i), {"x": normal(3, 5, 4), "i": indices(0, 5, 3, 2, 4)}),
    "gather_smaller": (lambda x, i: x.gather(2, i), {"x": normal(3, 5, 4), "i": indices(0, 4, 2, 3, 6)}),
    "scatter_add": (
        lambda x, i, s: torch.scatter_add(x, 1, i, s),
        {"x": normal(3, 5, 4), "i": indices(0, 5, 3, 3, 4), "s": normal(3, 3, 4)},
    ),
    "scatter_add_larger_src": (  # torch's backward fails for a source larger than the index: no grad of s
        lambda x, i, s: x.scatter_add(0, i, s.detach()),
        {"x": normal(4, 3), "i": indices(0, 4, 3, 2), "s": normal(5, 3)},
    ),
    "scatter": (
        lambda x, i: x.scatter(1, i, 9.0),
        {"x": normal(3, 5), "i": np.array([[0, 3], [4, 4], [2, 1]], np.int32)},
    ),
    "index_select": (
        lambda x, i: torch.index_select(x, 1, i),
        {"x": normal(4, 6, 3), "i": np.array([5, 0, 2, 2], np.int32)},
    ),
    "take": (lambda x, i: torch.take(x, i), {"x": normal(3, 4), "i": np.array([[0, 11], [5, 5]], np.int32)}),
    "index_first": (lambda x, i: x[i], {"x": X345, "i": I3}),
    "index_second": (lambda x, j: x[:, j], {"x": X345, "j": J21}),
    "index_apart": (lambda x, i: x[i, :, i], {"x": X345, "i": I3}),
    "index_adjacent": (lambda x, i: x[:, i, i], {"x": X345, "i": I3}),
    "index_int_then_tensor": (lambda x, i: x[0, :, i], {"x": X345, "i": I3}),
    "index_tensor_int_tensor": (lambda x, i: x[i, 0, i], {"x": X345, "i": I3}),
    "index_with_slice": (lambda x, i: x[i, 1:3], {"x": X345, "i": I3}),
    "index_list_last": (lambda x: x[..., [0, -1]], {"x": X345}),
    "index_none_first": (lambda x, i: x[None, i], {"x": X345, "i": I3}),
    "index_broadcast": (lambda x, i, j: x[i, j], {"x": X345, "i": I3, "j": J21}),
    "index_two_lists": (lambda x: x[[0, 2], [1, 3]], {"x": X345}),
    "argmax": (lambda x: (x.argmax(1), torch.argmin(x, 2), x.argmax(), x.argmax(0, keepdim=True)), {"x": TIED_NAN}),
    "argmin_flat": (lambda x: torch.argmin(x), {"x": TIED}),
    "max_dim": (lambda x: tuple(torch.max(x, 1)), {"x": TIED}),
    "min_dim": (lambda x: tuple(x.min(2, keepdim=True)), {"x": TIED}),
    "max_dim_nan": (lambda x: tuple(x.max(1)), {"x": TIED_NAN}),
    "max_all": (lambda x: x.max(), {"x": TIED}),
    "min_all": (lambda x: torch.min(x), {"x": TIED}),
    "amin": (lambda x: torch.amin(x, 1), {"x": TIED}),
    "topk": (lambda x: tuple(torch.topk(x, 3, dim=1)), {"x": normal(3, 7, 4)}),
    "topk_smallest": (lambda x: tuple(x.topk(2, largest=False)), {"x": normal(3, 7, 4)}),
    "topk_nan": (lambda x: tuple(x.topk(3, dim=1)), {"x": NAN_ROWS}),
    "sort": (lambda x: tuple(torch.sort(x, dim=1)), {"x": normal(3, 7, 4)}),
    "sort_descending": (lambda x: tuple(x.sort(descending=True)), {"x": normal(3, 7, 4)}),
    "sort_nan": (lambda x: tuple(x.sort(dim=1, stable=True)), {"x": NAN_ROWS}),
    "sort_nan_descending": (lambda x: tuple(torch.sort(x, dim=1, descending=True, stable=True)), {"x": NAN_ROWS}),
    "sort_ties_stable": (lambda x: tuple(x.sort(dim=1, descending=True, stable=True)), {"x": TIED}),
    "argsort": (lambda x: torch.argsort(x, dim=0), {"x": normal(5, 3)}),
    "one_hot": (lambda i: F.one_hot(i, 5), {"i": indices(0, 5, 3, 4)}),
    "int_comparison": (lambda i: ((i == 2).float(), (i > 0).float()), {"i": indices(-3, 4, 3, 4)}),
}


def to_torch(value: np.ndarray) -> torch.Tensor:
    if value.dtype == np.int32:
        return torch.from_numpy(value.astype(np.int64))
    return torch.from_numpy(value.copy()).requires_grad_(True)


def as_array(value: torch.Tensor) -> np.ndarray:
    value = value.detach()
    if value.dtype == torch.bool:
        value = value.to(torch.float64)
    if value.is_floating_point():
        return value.to(torch.float64).numpy()
    return value.numpy().astype(np.int32)


def generate() -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    arrays: dict[str, np.ndarray] = {}
    for case, (fn, inputs) in CASES.items():
        tensors = {name: to_torch(value) for name, value in inputs.items()}
        outputs = fn(**tensors)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        total = None
        for name, value in inputs.items():
            arrays[f"{case}/input/{name}"] = value
        for index, out in enumerate(outputs):
            arrays[f"{case}/out/{index}"] = as_array(out)
            if out.is_floating_point() and out.requires_grad:
                # 0 where the output is NaN or infinite: the gradient is still defined there (w·g)
                weight = np.where(np.isfinite(as_array(out)), RNG.normal(size=tuple(out.shape)), 0.0)
                arrays[f"{case}/weight/{index}"] = weight
                term = (out * torch.from_numpy(weight)).sum()
                total = term if total is None else total + term
        if total is not None:
            grads = torch.autograd.grad(total, [t for t in tensors.values() if t.requires_grad], allow_unused=True)
            float_names = [n for n, t in tensors.items() if t.requires_grad]
            for name, grad in zip(float_names, grads, strict=True):
                if grad is not None:  # None: an input the case detaches
                    arrays[f"{case}/grad/{name}"] = grad.numpy()
    return arrays


if __name__ == "__main__":
    arrays = generate()
    write_npz(REFERENCE, arrays)
    print(f"{REFERENCE.name}: {len(CASES)} cases, {len(arrays)} arrays, {REFERENCE.stat().st_size} bytes")
