"""NaN, ±inf, ±0, kinks and ties: values and gradients as PyTorch computes them, on the numpy
interpreter and on the adapter (lavapipe in CI), one kernel per op and fused by the e-graph.

The references are PyTorch's own numbers in float32 (tests/reference/ops/nan_semantics.npz, written by
scripts/make_nan_references.py, which holds the inputs and the PyTorch calls). Each case here is the
same call in meganeura; a case's graph outputs its value and the gradient of sum(out · g) with
respect to each float operand, g being the stored upstream gradient (NaN in half of it for the
elementwise cases). WGSL's min, max and clamp drop a NaN operand, and WGSL lets a compiler assume
that no value is NaN or infinite: these are the checks that the kernels do not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import check, one_op, run_gpu, trace_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.trace import Tracer, tracing
from meganeura.rewrite import optimize
from meganeura.target import GENERIC, Target

REFERENCE = np.load(Path(__file__).parent / "reference" / "ops" / "nan_semantics.npz")
STORED_CASES = json.loads(str(REFERENCE["meta"]))["cases"]
EXPONENTS = [2.5, 2.0, 3.0, 0.5, -0.5, -1.0, 0.0, 1.0, -2.0, -1.5, 1.5, 0.3]

UNARY = {
    "relu": F.relu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "tanh": F.tanh,
    "sigmoid": F.sigmoid,
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
    "abs": mn.abs,
    "sign": lambda x: x.sign(),
    "exp": mn.exp,
    "log": mn.log,
    "sqrt": mn.sqrt,
    "rsqrt": F.rsqrt,
    "log1p": mn.log1p,
    "expm1": lambda x: x.expm1(),
    "erf": F.erf,
    "reciprocal": lambda x: x.reciprocal(),
    "square": mn.square,
    "floor": mn.floor,
    "ceil": lambda x: x.ceil(),
    "round": mn.round,
    "trunc": mn.trunc,
    "isnan": lambda x: x.isnan(),
    "isinf": mn.isinf,
    "isfinite": mn.isfinite,
    **{f"pow_{e}": (lambda x, e=e: x.pow(e)) for e in EXPONENTS},
    "rpow_2": lambda x: 2.0**x,
    "rpow_minus_2": lambda x: (-2.0) ** x,
    "rpow_0": lambda x: 0.0**x,
    "sin": mn.sin,
    "cos": lambda x: x.cos(),
}
BINARY = {"minimum": mn.minimum, "maximum": lambda x, y: x.maximum(y), "pow_tensor": lambda x, y: x**y}
ROWS = {
    "amax_rows": lambda x: x.amax(1),
    "amax_columns": lambda x: x.amax(0),
    "amax_all": lambda x: x.amax(),
    "amax_of_tanh": lambda x: F.tanh(x).amax(1),
    "softmax": lambda x: x.softmax(1),
    "log_softmax": lambda x: x.log_softmax(1),
    "softmax_columns": lambda x: x.softmax(0),
    "cross_entropy": lambda x, labels: F.cross_entropy(x, labels, reduction="none"),
    "max_pool_2": lambda x: F.max_pool2d(x, 2),
    "max_pool_3_s1_p1": lambda x: F.max_pool2d(x, 3, stride=1, padding=1),
    "linear_relu": lambda x, w, b: F.relu(F.linear(x, w, b)),
}
CASES = {**UNARY, **BINARY, **ROWS}
GROUPS = {"unary": sorted(UNARY), "binary_and_rows": sorted({**BINARY, **ROWS})}


def stored(case: str) -> dict[str, np.ndarray]:
    return {key.split("/", 1)[1]: REFERENCE[key] for key in REFERENCE.files if key.startswith(f"{case}/")}


def operand_names(case: str) -> list[str]:
    """The float operands of a case, in the order its call takes them."""
    values = stored(case)
    return [name for name in ("x", "y", "w", "b") if name in values]


def traced_cases(cases: list[str]):
    """One graph computing every case of `cases`: outputs `<case>:out` and `<case>:grad_<operand>`
    (the gradient of Σ out·g; float operands are params), and the values to run it with."""
    tracer = Tracer()
    inputs, params = {}, {}
    with tracing(tracer):
        loss, wrt = None, []
        for case in cases:
            values = stored(case)
            operands = []
            for name in operand_names(case):
                leaf = trace_leaf(tracer, "param", f"{case}:{name}", TensorType(values[name].shape))
                params[f"{case}:{name}"] = values[name]
                operands.append(leaf)
                wrt.append((f"{case}:grad_{name}", leaf.node))
            if "labels" in values:
                operands.append(trace_leaf(tracer, "input", f"{case}:labels", TensorType((8,), "i32")))
                inputs[f"{case}:labels"] = values["labels"]
            out = CASES[case](*operands)
            g = trace_leaf(tracer, "input", f"{case}:g", out.type)
            inputs[f"{case}:g"] = values["g"]
            tracer.graph.outputs[f"{case}:out"] = out.node
            term = F.sum(out * g)
            loss = term if loss is None else loss + term
    graph = tracer.graph
    for name, node in wrt:
        grad = gradients(graph, loss.node, [node])[node]
        if grad is not None:  # None: no gradient flows (sign, floor, isnan…): PyTorch's zeros
            graph.outputs[name] = grad
    return graph, inputs, params


def expected(case: str, name: str) -> np.ndarray:
    return stored(case)[name.split(":")[1]]


def assert_matches_pytorch(got: dict[str, np.ndarray], cases: list[str], rtol=2e-5) -> None:
    """Every output of every case equal to PyTorch's: NaN where it has NaN, the same infinities,
    float32 rounding elsewhere (a gradient that is None here is PyTorch's zeros)."""
    failures = []
    for case in cases:
        names = ["out", *(f"grad_{operand}" for operand in operand_names(case))]
        for name in names:
            want = stored(case)[name]
            value = got.get(f"{case}:{name}", np.zeros_like(want))
            try:
                np.testing.assert_allclose(value, want, rtol=rtol, atol=1e-6, equal_nan=True)
            except AssertionError:
                wrong = ~np.isclose(value, want, rtol=rtol, atol=1e-6, equal_nan=True)
                failures.append(
                    f"{case}:{name} at {np.argwhere(wrong).tolist()[:6]}: {value[wrong][:6]} != {want[wrong][:6]}"
                )
    assert not failures, "\n".join(failures)


def test_every_stored_case_is_checked():
    assert sorted(STORED_CASES) == sorted(CASES)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_the_interpreter_computes_what_pytorch_computes(group):
    graph, inputs, params = traced_cases(GROUPS[group])
    got = interpret(graph, inputs, params).outputs
    assert_matches_pytorch(got, GROUPS[group])


@pytest.mark.parametrize("fused", [False, True], ids=["one kernel an op", "fused"])
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_the_kernels_compute_what_pytorch_computes(group, fused):
    graph, inputs, params = traced_cases(GROUPS[group])
    if fused:
        graph, _ = optimize(graph)
    executable = run_gpu(graph, inputs, params)
    got = executable.run(inputs, read=tuple(graph.outputs))
    assert_matches_pytorch(got, GROUPS[group])


# Max reductions with NaN and ±inf through every entry point of shaders/reduce.wgsl (codegen/reduce.py
# `reduce_plan`): (shape, axes, splits, target, the entry point, what its label says besides).
CPU = Target("cpu", 2, 32, cpu=True)
MAX_REDUCTIONS = [
    ((3, 1000), (1,), 1, GENERIC, "reduce_tree", ""),
    ((300, 5), (0,), 1, CPU, "reduce_columns", ""),
    ((13, 37), (1,), 1, GENERIC, "reduce_rows", ""),
    ((13, 36), (1,), 1, GENERIC, "reduce_rows", "vec4 rows"),
    ((40, 300), (0,), 1, GENERIC, "reduce_serial", ""),
    ((5, 67, 1012), (0,), 1, GENERIC, "reduce_serial", "vec4"),
    ((3, 1000), (1,), 4, GENERIC, "reduce_tree", "in 4 parts"),  # the partials of a split
]


def with_specials(shape: tuple[int, ...], axes: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Normal values; per output along the reduced axes, a NaN (outputs 0, 3, 6, …), a +inf and a
    −inf (1, 4, …), only −inf (2, 5, … where at most 4 elements are reduced), or nothing."""
    kept = [d for d in range(len(shape)) if d not in axes]
    x = rng.normal(size=shape).astype(np.float32)
    rows = np.moveaxis(x, axes, range(len(kept), len(shape))).reshape(-1, int(np.prod([shape[d] for d in axes])))
    for o, row in enumerate(rows):
        at = rng.integers(0, row.size, 2)
        if o % 3 == 0:
            row[at[0]] = np.nan
        elif o % 3 == 1:
            row[at] = [np.inf, -np.inf]
        elif row.size <= 4:
            row[:] = -np.inf
    restored = rows.reshape([shape[d] for d in kept] + [shape[d] for d in axes])
    return np.ascontiguousarray(np.moveaxis(restored, range(len(kept), len(shape)), axes))


@pytest.mark.parametrize(
    "shape, axes, splits, target, entry, note",
    MAX_REDUCTIONS,
    ids=[" ".join(filter(None, (entry, note, "x".join(map(str, shape))))) for shape, *_, entry, note in MAX_REDUCTIONS],
)
def test_max_reductions_propagate_nan_through_every_entry_point(shape, axes, splits, target, entry, note):
    x = with_specials(shape, axes, np.random.default_rng(7))
    assert np.isnan(np.max(x, axis=axes)).any() and not np.isnan(np.max(x, axis=axes)).all()
    attrs = {"kind": "max", "axes": axes, "keepdim": False, "in_shape": shape, "splits": splits}
    graph = one_op("fused_reduce", [shape], prologue="$0", epilogue="$r", **attrs)
    spec = check(graph, {"x0": x}, rtol=0, atol=0, target=target).kernels[0]
    assert spec.entry_point == entry and note in spec.label
