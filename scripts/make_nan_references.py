"""Write tests/reference/ops/nan_semantics.npz: PyTorch's values and gradients at NaN, ±inf, ±0, kinks
and ties, for tests/test_nan_semantics.py.

    /tmp/torch311/bin/python scripts/make_nan_references.py

Imports only torch and numpy (never meganeura). Every case runs in float32 on the CPU, as a
PyTorch user's model would, from fixed inputs; the file is written with fixed zip dates, so
running the script again rewrites the same bytes. For each case the file holds, by name:

    <case>/<operand>        the inputs (float32; int64 labels as int32)
    <case>/g                the gradient flowing into the case's output
    <case>/out              the output
    <case>/grad_<operand>   the gradient of each float operand (zeros where PyTorch gives none)

An elementwise case's operand runs over SPECIAL twice: once with a finite upstream gradient and once
with NaN there, which tells a backward that picks the gradient (threshold_backward, clamp's) from
one that multiplies it by a mask.

The elementwise cases are computed one element at a time. PyTorch's CPU kernels run a float32
tensor of 16 elements or more through vector code whose conventions at NaN and at the kinks differ
from its scalar code: in 2.13 the vector code gives hardtanh's and relu6's gradient 0 where x is
NaN, elu's NaN there, gelu(inf) NaN, and hardswish's gradient 0 at x = −3 and g at x = 3, where the
scalar code gives g, g, inf, −g/2 and 3g/2 — so a NaN gets one gradient or another by its position
in the tensor. The scalar code is also what PyTorch's CUDA kernels compute (the same formulas), so
it is the reference here; a tensor of one element always takes it.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# A folder of its own: tests/test_torch_reference.py takes every .npz of tests/reference/ for a training scenario.
PATH = Path(__file__).resolve().parent.parent / "tests" / "reference" / "ops" / "nan_semantics.npz"
NAN, INF = float("nan"), float("inf")

# NaN, the infinities, both zeros, and the kinks of the activations (0, ±1, ±3, 6, softplus's 20).
SPECIAL = [NAN, INF, -INF, 0.0, -0.0, -100.0, -25.0, -7.0, -3.0, -2.5, -1.0, -0.5, -1e-6,
           1e-6, 0.5, 1.0, 2.5, 3.0, 6.0, 7.0, 20.5, 25.0, 100.0, 1e30, -1e30]  # fmt: skip
# sin and cos: the arguments meganeura reduces accurately (|x| ≤ 1e6)
TRIG = [NAN, INF, -INF, 0.0, -0.0, -1e5, -100.0, -7.0, -3.0, -1.0, -1e-6, 1e-6, 0.5, 1.0, 3.0, 6.0, 100.0, 1e5]
EXPONENTS = [2.5, 2.0, 3.0, 0.5, -0.5, -1.0, 0.0, 1.0, -2.0, -1.5, 1.5, 0.3]

UNARY = {
    "relu": torch.relu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "softplus": F.softplus,
    "elu": lambda x: F.elu(x, 0.7),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, 1.5),
    "hardtanh": lambda x: F.hardtanh(x, -1.0, 2.5),
    "relu6": F.relu6,
    "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish,
    "mish": F.mish,
    "softsign": F.softsign,
    "logsigmoid": F.logsigmoid,
    "clamp": lambda x: x.clamp(-1.0, 1.0),
    "clamp_min": lambda x: x.clamp(min=0.0),
    "abs": torch.abs,
    "sign": torch.sign,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "log1p": torch.log1p,
    "expm1": torch.expm1,
    "erf": torch.erf,
    "reciprocal": torch.reciprocal,
    "square": torch.square,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "trunc": torch.trunc,
    "isnan": lambda x: torch.isnan(x).float(),
    "isinf": lambda x: torch.isinf(x).float(),
    "isfinite": lambda x: torch.isfinite(x).float(),
    **{f"pow_{e}": (lambda x, e=e: x.pow(e)) for e in EXPONENTS},
    "rpow_2": lambda x: 2.0**x,
    "rpow_minus_2": lambda x: (-2.0) ** x,
    "rpow_0": lambda x: 0.0**x,
}
TRIGONOMETRIC = {"sin": torch.sin, "cos": torch.cos}

# Binary: every pair of a few special values (ties, NaN on either side, the infinities, ±0).
PAIR_VALUES = [NAN, INF, -INF, 0.0, -0.0, -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 3.0]
BINARY = {
    "minimum": torch.minimum,
    "maximum": torch.maximum,
    "pow_tensor": torch.pow,
}

ROWS = [  # the rows of the reductions and the row ops: finite, NaN, +inf, all −inf, one −inf, ties, huge
    [0.5, -1.0, 2.0, 1.0, -0.25],
    [1.0, NAN, 3.0, 2.0, 0.0],
    [INF, 1.0, INF, 0.0, -2.0],
    [-INF, -INF, -INF, -INF, -INF],
    [-INF, 1.0, 2.0, 0.5, 2.0],
    [NAN, NAN, 1.0, INF, -INF],
    [1e30, -1e30, 0.0, 1.0, 3.0],
    [INF, -INF, 0.0, 1.0, 2.0],
]
ROW_OPS = {
    "amax_rows": lambda x: x.amax(1),
    "amax_columns": lambda x: x.amax(0),
    "amax_all": lambda x: x.amax(),
    "amax_of_tanh": lambda x: torch.tanh(x).amax(1),
    "softmax": lambda x: x.softmax(1),
    "log_softmax": lambda x: x.log_softmax(1),
    "softmax_columns": lambda x: x.softmax(0),
}
LABELS = [0, 2, 1, 3, 0, 2, 1, 3]  # rows 4 and 7 point at −inf

IMAGE = [  # [1, 2, 5, 6]: windows with one NaN, two NaNs (the gradient goes to the last), all −inf, ties
    [
        [1.0, NAN, 2.0, NAN, 0.0, 1.0],
        [3.0, 0.0, NAN, 1.0, 2.0, 2.0],
        [-INF, -INF, 5.0, 5.0, INF, 0.0],
        [-INF, -INF, 5.0, 6.0, 1.0, INF],
        [7.0, -1.0, 0.0, -2.0, 3.0, 3.0],
    ],
    [
        [NAN, NAN, 1.0, 1.0, -INF, 2.0],
        [NAN, 2.0, 1.0, 1.0, -INF, -INF],
        [0.0, 0.0, 0.0, 0.0, 4.0, NAN],
        [-0.0, 0.0, 2.0, -1.0, NAN, 4.0],
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    ],
]
POOLS = {
    "max_pool_2": lambda x: F.max_pool2d(x, 2),
    "max_pool_3_s1_p1": lambda x: F.max_pool2d(x, 3, stride=1, padding=1),
}


def grad_of(out: torch.Tensor, rng: np.random.Generator, nan_half: bool) -> np.ndarray:
    """A fixed upstream gradient for `out`: finite, non-trivial; NaN in the second half of the last dim
    when `nan_half`."""
    g = rng.uniform(0.5, 1.5, size=out.shape).astype(np.float32)
    if nan_half:
        g[..., g.shape[-1] // 2 :] = NAN
    return g


def run_elementwise(fn, operands: dict[str, np.ndarray], rng: np.random.Generator, nan_half=False):
    """`run` for an elementwise fn, each element computed alone (PyTorch's scalar code: see the docstring)."""
    shape = next(iter(operands.values())).shape
    g = grad_of(np.empty(shape), rng, nan_half)
    arrays = {**operands, "g": g, "out": np.empty(shape, np.float32)}
    arrays.update({f"grad_{name}": np.zeros(shape, np.float32) for name in operands})
    for index in np.ndindex(shape):
        tensors = {k: torch.tensor([v[index]], dtype=torch.float32, requires_grad=True) for k, v in operands.items()}
        out = fn(*tensors.values())
        arrays["out"][index] = out.item()
        if out.requires_grad:
            out.backward(torch.tensor([g[index]]))
        for name, t in tensors.items():
            arrays[f"grad_{name}"][index] = 0.0 if t.grad is None else t.grad.item()
    return arrays


def run(fn, operands: dict[str, np.ndarray], rng: np.random.Generator, nan_half=False, labels=None):
    """fn's output and gradients at `operands` (float32), with a fixed upstream gradient."""
    tensors = {k: torch.tensor(v, dtype=torch.float32, requires_grad=True) for k, v in operands.items()}
    extra = () if labels is None else (torch.tensor(labels, dtype=torch.int64),)
    out = fn(*tensors.values(), *extra)
    g = grad_of(out, rng, nan_half)
    arrays = {**operands, "g": g, "out": out.detach().numpy()}
    if out.requires_grad:
        out.backward(torch.tensor(g))
    for name, t in tensors.items():
        grad = t.grad if t.grad is not None else torch.zeros_like(t)
        arrays[f"grad_{name}"] = grad.numpy()
    if labels is not None:
        arrays["labels"] = np.asarray(labels, dtype=np.int32)
    return arrays


def generate() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(40)
    cases: dict[str, dict[str, np.ndarray]] = {}
    special = np.array(SPECIAL + SPECIAL, dtype=np.float32)
    for name, fn in UNARY.items():
        cases[name] = run_elementwise(fn, {"x": special}, rng, nan_half=True)
    for name, fn in TRIGONOMETRIC.items():
        cases[name] = run_elementwise(fn, {"x": np.array(TRIG + TRIG, dtype=np.float32)}, rng, nan_half=True)
    a, b = np.meshgrid(np.array(PAIR_VALUES, np.float32), np.array(PAIR_VALUES, np.float32), indexing="ij")
    for name, fn in BINARY.items():
        cases[name] = run_elementwise(fn, {"x": a.copy(), "y": b.copy()}, rng)
    rows = np.array(ROWS, dtype=np.float32)
    for name, fn in ROW_OPS.items():
        cases[name] = run(fn, {"x": rows}, rng)
    cases["cross_entropy"] = run(lambda x, y: F.cross_entropy(x, y, reduction="none"), {"x": rows}, rng, labels=LABELS)
    image = np.array([IMAGE], dtype=np.float32)
    for name, fn in POOLS.items():
        cases[name] = run(fn, {"x": image}, rng)
    # relu in a matmul's epilogue (forward) and its mask in dX's (backward): a NaN and an inf in x
    x = rng.normal(size=(3, 4)).astype(np.float32)
    x[0, 1], x[2, 3] = NAN, INF
    w, bias = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)
    cases["linear_relu"] = run(lambda x, w, b: torch.relu(F.linear(x, w, b)), {"x": x, "w": w, "b": bias}, rng)
    arrays = {"meta": np.array(json.dumps({"torch": torch.__version__, "cases": list(cases)}))}
    for case, values in cases.items():
        arrays.update({f"{case}/{key}": value for key, value in values.items()})
    return arrays


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """np.savez_compressed's format with a fixed date on every member (scripts/make_torch_references.py)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    arrays = generate()
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_bytes(npz_bytes(arrays))
    print(f"{PATH.name}: {len(json.loads(str(arrays['meta']))['cases'])} cases, {PATH.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
