"""Casts, constants, scans, selections and integer indexing (ir/ops/select.py, ir/ops/constants.py,
the selection section of tensor.py): values and gradients against PyTorch (tests/reference/select.npz,
written by scripts/make_select_references.py), every kernel against the numpy interpreter at ragged
shapes on lavapipe, gradients by finite differences mid-chain, whole programs through the e-graph,
and the errors a user gets for what cannot work with static shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import (
    assert_steps_follow_interpreter,
    check,
    emit,
    gradcheck,
    kernels,
    one_op,
    trace_leaf,
    typed_leaf,
)

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import compile_plan
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.op import OPS, ShapeError, infer_type
from meganeura.ir.trace import Tracer, tracing
from meganeura.pytorch_names import ANOTHER_WAY, MissingName
from meganeura.tensor import dtype_name, one_hot

RNG = np.random.default_rng(7)
REFERENCE = np.load(Path(__file__).parent / "reference" / "select.npz")

# The cases of scripts/make_select_references.py, written with meganeura's names.
CASES = {
    "cast_int": lambda x: x.float().int(),
    "cast_long": lambda x: x.long(),
    "cast_float": lambda i: i.float() * 0.5,
    "arange_end": lambda: mn.arange(5),
    "arange_step": lambda: mn.arange(2, 11, 3),
    "arange_down": lambda: mn.arange(10, 0, -3),
    "arange_float": lambda: mn.arange(-3.5, 20.2, 0.7),
    "arange_tenths": lambda: mn.arange(0, 1, 0.1),
    "arange_float_dtype": lambda: mn.arange(1, 6, 2, dtype=mn.float32),
    "full_int": lambda: mn.full((2, 3), 7),
    "full_float": lambda: mn.full((2, 3), -1.5),
    "zeros_ones": lambda x: (mn.zeros(3, 4) + mn.ones((3, 4)) * x, mn.ones_like(x)),
    "zeros_long": lambda: mn.zeros(2, 2, dtype=mn.long),
    "full_like": lambda x: mn.full_like(x, 2.5) * x,
    "tensor": lambda x: x * mn.tensor([[0.5, -1.0, 2.0], [3.0, 0.25, -4.0]]),
    "tensor_int": lambda: mn.tensor([[3, -1], [0, 7]]),
    "eye": lambda: mn.eye(3, 5),
    "eye_square": lambda x: mn.eye(4) @ x,
    "tril": lambda x: mn.tril(x),
    "tril_below": lambda x: x.tril(-1),
    "triu_above": lambda x: mn.triu(x, 2),
    "flip": lambda x: mn.flip(x, (0, 2)),
    "flip_method": lambda x: x.flip(-1),
    "roll": lambda x: mn.roll(x, (1, -2), (0, 2)),
    "roll_flat": lambda x: mn.roll(x, 4),
    "cumsum_0": lambda x: mn.cumsum(x, 0),
    "cumsum_1": lambda x: x.cumsum(1),
    "cumsum_last": lambda x: x.cumsum(-1),
    "cumsum_int": lambda i: mn.cumsum(i, 1),
    "cumprod": lambda x: mn.cumprod(x, 1),
    "cumprod_last": lambda x: x.cumprod(-1),
    "gather": lambda x, i: mn.gather(x, 1, i),
    "gather_smaller": lambda x, i: x.gather(2, i),
    "scatter_add": lambda x, i, s: mn.scatter_add(x, 1, i, s),
    "scatter_add_larger_src": lambda x, i, s: x.scatter_add(0, i, s),
    "scatter": lambda x, i: x.scatter(1, i, 9.0),
    "index_select": lambda x, i: mn.index_select(x, 1, i),
    "take": lambda x, i: mn.take(x, i),
    "index_first": lambda x, i: x[i],
    "index_second": lambda x, j: x[:, j],
    "index_apart": lambda x, i: x[i, :, i],
    "index_adjacent": lambda x, i: x[:, i, i],
    "index_int_then_tensor": lambda x, i: x[0, :, i],
    "index_tensor_int_tensor": lambda x, i: x[i, 0, i],
    "index_with_slice": lambda x, i: x[i, 1:3],
    "index_list_last": lambda x: x[..., [0, -1]],
    "index_none_first": lambda x, i: x[None, i],
    "index_broadcast": lambda x, i, j: x[i, j],
    "index_two_lists": lambda x: x[[0, 2], [1, 3]],
    "argmax": lambda x: (x.argmax(1), mn.argmin(x, 2), x.argmax(), x.argmax(0, keepdim=True)),
    "argmin_flat": lambda x: mn.argmin(x),
    "max_dim": lambda x: tuple(mn.max(x, 1)),
    "min_dim": lambda x: tuple(x.min(2, keepdim=True)),
    "max_dim_nan": lambda x: tuple(x.max(1)),
    "max_all": lambda x: x.max(),
    "min_all": lambda x: mn.min(x),
    "amin": lambda x: mn.amin(x, 1),
    "topk": lambda x: tuple(mn.topk(x, 3, dim=1)),
    "topk_smallest": lambda x: tuple(x.topk(2, largest=False)),
    "topk_nan": lambda x: tuple(x.topk(3, dim=1)),
    "sort": lambda x: tuple(mn.sort(x, dim=1)),
    "sort_descending": lambda x: tuple(x.sort(descending=True)),
    "sort_nan": lambda x: tuple(x.sort(dim=1, stable=True)),
    "sort_nan_descending": lambda x: tuple(mn.sort(x, dim=1, descending=True, stable=True)),
    "sort_ties_stable": lambda x: tuple(x.sort(dim=1, descending=True, stable=True)),
    "argsort": lambda x: mn.argsort(x, dim=0),
    "one_hot": lambda i: F.one_hot(i, 5),
    "int_comparison": lambda i: ((i == 2).float(), (i > 0).float()),
}


def reference(case: str, kind: str) -> dict[str, np.ndarray]:
    prefix = f"{case}/{kind}/"
    return {key[len(prefix) :]: REFERENCE[key] for key in REFERENCE.files if key.startswith(prefix)}


def leaf_type(value: np.ndarray) -> TensorType:
    return TensorType(value.shape, "i32" if value.dtype == np.int32 else "f32")


def traced_case(case: str):
    """The case's graph: float inputs as params (so that autodiff reaches them), i32 ones as
    inputs, outputs out0, out1…, and the loss Σ_k Σ(out_k · weight_k) with its gradients."""
    inputs, weights = reference(case, "input"), reference(case, "weight")
    tracer = Tracer()
    with tracing(tracer):
        leaves = {
            name: trace_leaf(tracer, "input" if v.dtype == np.int32 else "param", name, leaf_type(v))
            for name, v in inputs.items()
        }
        outs = CASES[case](**leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        loss = None
        for index, out in enumerate(outs):
            tracer.graph.outputs[f"out{index}"] = out.node
            if str(index) in weights:
                weight = trace_leaf(tracer, "input", f"weight{index}", out.type)
                term = (out * weight).sum()
                loss = term if loss is None else loss + term
    graph = tracer.graph
    params = {name: v for name, v in inputs.items() if v.dtype != np.int32}
    if loss is not None:
        graph.outputs["loss"] = loss.node
        wrt = [leaves[name].node for name in params]
        for name, grad in zip(params, gradients(graph, loss.node, wrt).values(), strict=True):
            if grad is not None:
                graph.outputs[f"grad_{name}"] = grad
    feeds = {name: v for name, v in inputs.items() if v.dtype == np.int32}
    feeds |= {f"weight{k}": w for k, w in weights.items()}
    return graph, feeds, params


def test_every_reference_case_is_tested():
    cases = {key.split("/")[0] for key in REFERENCE.files}
    assert cases == set(CASES)


# torch.topk leaves the order of ties unspecified (its NaNs come in no index order): there the
# indices must point at the values, not equal torch's.
TIES_IN_ANY_ORDER = {"topk_nan": (1, 1)}  # case: (the output of indices, the dim)


@pytest.mark.parametrize("case", sorted(CASES))
def test_values_and_gradients_follow_pytorch(case):
    graph, feeds, params = traced_case(case)
    got = interpret(graph, feeds, params, dtype=np.float64).outputs
    for index, expected in reference(case, "out").items():
        value = got[f"out{index}"]
        assert value.shape == expected.shape, index
        if case in TIES_IN_ANY_ORDER and int(index) == TIES_IN_ANY_ORDER[case][0]:
            x, dim = reference(case, "input")["x"], TIES_IN_ANY_ORDER[case][1]
            picked, wanted = np.take_along_axis(x, value, dim), np.take_along_axis(x, expected, dim)
            np.testing.assert_array_equal(picked, wanted)  # NaN where torch has NaN
        elif expected.dtype == np.int32:
            assert value.dtype == np.int32 and np.array_equal(value, expected), (index, value, expected)
        else:  # f32 constants (arange) are rounded once from float64; torch's CPU kernel may be an ulp off
            np.testing.assert_allclose(value, expected, rtol=2e-7, atol=1e-12, err_msg=index)
    for name, expected in reference(case, "grad").items():
        np.testing.assert_allclose(got[f"grad_{name}"], expected, rtol=1e-9, atol=1e-12, err_msg=name)


# ---------------------------------------------------------------------------------------------
# Kernels against the interpreter on lavapipe, at ragged shapes


def results_graph(op: str, shapes, dtypes=None, **attrs) -> Graph:
    """`op` of input leaves x0, x1…, each of its results an output (values, indices)."""
    graph = Graph()
    dtypes = dtypes or ["f32"] * len(shapes)
    leaves = [typed_leaf(graph, "input", f"x{i}", s, d) for i, (s, d) in enumerate(zip(shapes, dtypes, strict=True))]
    whole = emit(graph, op, leaves, **attrs)
    for index in range(graph[whole].results):
        graph.outputs[f"out{index}"] = emit(graph, "result", [whole], index=index)
    return graph


def specials(*shape: int) -> np.ndarray:
    """Normals with ties, NaN and ±inf mixed in."""
    x = RNG.normal(size=shape).astype(np.float32)
    flat = x.reshape(-1)
    picks = RNG.choice(flat.size, 8, replace=False)
    flat[picks[:3]] = np.nan
    flat[picks[3]], flat[picks[4]] = np.inf, -np.inf
    flat[picks[5:]] = flat[picks[0] - 1] if picks[0] else 0.5  # ties
    return x


SHAPE = (3, 5, 7)


@pytest.mark.parametrize("axis", range(3))
def test_line_kernels_follow_the_interpreter(axis):
    x = specials(*SHAPE)
    finite = RNG.normal(size=SHAPE).astype(np.float32)
    finite[1, 2, 3] = finite[2, 4, 6] = 0.0
    check(one_op("cumsum", [SHAPE], axis=axis), {"x0": finite})
    check(one_op("cumsum", [SHAPE], axis=axis, reverse=True), {"x0": x})
    check(one_op("cumprod", [SHAPE], axis=axis), {"x0": finite}, rtol=1e-5, atol=1e-6)
    check(one_op("cumprod_grad", [SHAPE, SHAPE], axis=axis), {"x0": finite, "x1": x[::-1].copy()}, atol=1e-5)
    for largest in (True, False):
        check(results_graph("arg_reduce", [SHAPE], axis=axis, keepdim=axis == 1, largest=largest), {"x0": x})
        k = SHAPE[axis] - 1 if largest else 2
        check(results_graph("topk", [SHAPE], axis=axis, k=k, largest=largest), {"x0": x})


def test_integer_scan_and_casts_follow_the_interpreter():
    check(one_op("cumsum", [(4, 6)], ["i32"], axis=1), {"x0": RNG.integers(-9, 9, (4, 6)).astype(np.int32)})
    check(one_op("cumprod", [(4, 6)], ["i32"], axis=0), {"x0": RNG.integers(-3, 4, (4, 6)).astype(np.int32)})
    special = np.array([[2.7, -2.7, 1e10, np.nan], [np.inf, -np.inf, -0.5, -2147483648.0], [2147483520.0, 3e9, 7, -7]])
    check(one_op("cast", [(3, 4)], dtype="i32"), {"x0": special.astype(np.float32)})
    check(one_op("cast", [(3, 5)], ["i32"], dtype="f32"), {"x0": RNG.integers(-5000, 5000, (3, 5)).astype(np.int32)})


def test_index_kernels_follow_the_interpreter():
    x = RNG.normal(size=SHAPE).astype(np.float32)
    check(one_op("flip", [SHAPE], axes=(0, 2)), {"x0": x})
    check(one_op("flip", [SHAPE], axes=(1,)), {"x0": x})
    index = RNG.integers(-1, 6, (3, 4, 7)).astype(np.int32)  # -1 and 5: outside the dim
    check(one_op("gather_axis", [SHAPE, (3, 4, 7)], ["f32", "i32"], axis=1), {"x0": x, "x1": index})
    smaller = RNG.integers(0, 7, (2, 3, 9)).astype(np.int32)
    check(one_op("gather_axis", [SHAPE, (2, 3, 9)], ["f32", "i32"], axis=2), {"x0": x, "x1": smaller})
    src = RNG.normal(size=(3, 4, 7)).astype(np.float32)
    check(
        one_op("scatter_axis_add", [(3, 4, 7), (3, 4, 7)], ["f32", "i32"], axis=1, shape=SHAPE),
        {"x0": src, "x1": index},
    )
    small = RNG.integers(0, 3, (2, 4, 5)).astype(np.int32)
    graph = one_op("scatter_axis_add", [(3, 4, 7), (2, 4, 5)], ["f32", "i32"], axis=0, shape=SHAPE)
    check(graph, {"x0": src, "x1": small})
    rows, cols = np.array([[0], [-1], [3], [-4]], np.int32), np.array([0, 4, -5, 5, 2], np.int32)
    check(one_op("flat_index", [(4, 1), (5,)], ["i32", "i32"], sizes=(3, 5)), {"x0": rows, "x1": cols})


def test_scatter_sums_duplicates_in_index_order():
    """Every contribution to one place is summed by one thread, in order: bit-identical runs."""
    graph = one_op("scatter_axis_add", [(64, 3), (64, 3)], ["f32", "i32"], axis=0, shape=(2, 3))
    src = (RNG.normal(size=(64, 3)) * 1e4).astype(np.float32)
    index = RNG.integers(0, 2, (64, 3)).astype(np.int32)
    first = check(graph, {"x0": src, "x1": index}, rtol=1e-6, atol=1e-2).run({"x0": src, "x1": index}, ("out",))
    again = check(graph, {"x0": src, "x1": index}, rtol=1e-6, atol=1e-2).run({"x0": src, "x1": index}, ("out",))
    assert np.array_equal(first["out"], again["out"])


# ---------------------------------------------------------------------------------------------
# Gradients by finite differences, mid-chain (constant indices through mn.tensor)

GATHER_INDEX = [[[0, 2], [3, 3], [1, 0]], [[2, 2], [0, 1], [3, 0]]]
ZEROS = [[1.0, 0.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0]]  # cumprod's gradient through zeros
GRADIENTS = {
    "flip": (lambda x: mn.flip(x, (0, 2)), [(2, 3, 4)]),
    "roll": (lambda x: mn.roll(x, (1, 3), (0, 1)), [(3, 4)]),
    "cumsum": (lambda x: x.cumsum(1) * x, [(3, 4, 2)]),
    "cumsum first dim": (lambda x: mn.cumsum(x, 0), [(3, 4)]),
    "cumprod": (lambda x: x.cumprod(1), [(3, 4, 2)]),
    "cumprod through zeros": (
        lambda x: (x * mn.tensor([[1.0, 0.0, 1.0, 0.0, 1.0], [0.0, 1, 1, 1, 1]])).cumprod(-1),
        [(2, 5)],
    ),
    "gather": (lambda x: x.gather(2, mn.tensor(GATHER_INDEX)), [(2, 3, 4)]),
    "scatter_add": (lambda x, s: x.scatter_add(2, mn.tensor(GATHER_INDEX), s), [(2, 3, 4), (2, 3, 2)]),
    "scatter": (lambda x, s: x.scatter(2, mn.tensor(GATHER_INDEX), s), [(2, 3, 4), (2, 3, 2)]),
    "index_select": (lambda x: x.index_select(1, mn.tensor([2, 0, 2, 1])), [(2, 3, 4)]),
    "advanced indexing": (lambda x: x[mn.tensor([1, -1, 1]), :, mn.tensor([[0], [3]])], [(2, 3, 4)]),
    "max(dim)": (lambda x: x.max(1).values * x.argmax(1).float(), [(3, 4, 2)]),
    "min(dim) keepdim": (lambda x: x.min(-1, keepdim=True)[0] * x, [(3, 4)]),
    "topk": (lambda x: mn.topk(x, 2, dim=0).values, [(4, 3)]),
    "sort": (lambda x: x.sort(-1, descending=True).values * mn.arange(5).float(), [(3, 5)]),
    "tril": (lambda x: mn.tril(x, 1), [(2, 3, 4)]),
    "amin": (lambda x: mn.amin(x, 0), [(3, 4)]),
    "take": (lambda x: mn.take(x, mn.tensor([[0, 5], [11, 5]])), [(3, 4)]),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradients_mid_chain(name):
    op, shapes = GRADIENTS[name]
    assert gradcheck(op, shapes, np.random.default_rng(3)) < 1e-6


# ---------------------------------------------------------------------------------------------
# Whole programs: through the e-graph, on lavapipe


class Selector(nn.Module):
    """A model that reads constants, scans, selections and integer indexing between two layers."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(7, 6)
        self.out = nn.Linear(5, 3)

    def forward(self, x, ids):
        h = self.fc(x) + mn.tensor([0.5, -1.0, 2.0, 0.0, 1.0, 3.0]) * mn.arange(6).float()  # [4, 5, 6]
        h = mn.tril(h[..., :5]) + mn.eye(5)
        best = h.max(dim=1)  # values, indices: [4, 5]
        top = h.topk(2, dim=-1).values.cumsum(-1)
        picked = h.gather(2, best.indices.unsqueeze(-1))
        rows = h[ids].flip(0).cumprod(1)
        hot = F.one_hot(best.indices, 5).float()
        mixed = best.values + top.sum(-1) + picked.squeeze(-1) + (hot * h).sum(1) + mn.roll(h, 1, 2)[:, 0]
        return self.out(mixed + rows[:, :, 0].sum(0) * 0.1)


def selector_loss(model, x, ids, y):
    return F.cross_entropy(model(x, ids), y)


def test_a_training_step_with_selections_follows_the_interpreter():
    program = mn.compile(
        Selector(),
        loss=selector_loss,
        inputs={"x": mn.f32[4, 5, 7], "ids": mn.i32[3], "y": mn.i32[4]},
        optimizer=optim.Adam(lr=0.01),
    )
    rng = np.random.default_rng(5)
    feeds = [
        {
            "x": rng.normal(size=(4, 5, 7)).astype(np.float32),
            "ids": np.array([2, 0, -1], np.int32),
            "y": rng.integers(0, 3, 4).astype(np.int32),
        }
        for _ in range(3)
    ]
    losses = assert_steps_follow_interpreter(program, feeds)
    assert np.all(np.isfinite(losses))


class Constants(nn.Module):
    def forward(self, x):
        grid = mn.arange(-3.5, 20.2, 0.7)
        return grid, x * mn.ones(3, 4) + mn.full((3, 4), 2.5), mn.tensor([[3, -1], [0, 7]]), mn.full((2, 3), 7)


def test_constants_are_leaves_uploaded_once_and_fills_fold_into_literals():
    plan = compile_plan(Constants(), inputs={"x": mn.f32[3, 4]})
    fused = plan.fused_graph
    assert {"arange", "constant"} <= {n.op for n in fused}
    slots = {slot.role for slot in plan.compiled.plan.buffers}
    assert "const" in slots
    # The f32 fills are literals of the one kernel (it reads x alone); the other constants are
    # buffers written once.
    (pointwise,) = [n for n in fused if n.op == "pointwise"]
    assert kernels(fused) == 1 and [fused[i].op for i in pointwise.inputs] == ["input"]
    program = mn.compile(Constants(), inputs={"x": mn.f32[3, 4]})
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    for _ in range(2):  # the second run reads the same buffers: nothing recomputes them
        grid, shifted, table, sevens = program(x=x)
        np.testing.assert_allclose(grid, REFERENCE["arange_float/out/0"], rtol=2e-7, atol=1e-12)
        np.testing.assert_allclose(shifted, x + 2.5, rtol=1e-6)
        np.testing.assert_array_equal(table, REFERENCE["tensor_int/out/0"])
        np.testing.assert_array_equal(sevens, REFERENCE["full_int/out/0"])


class Lookup(nn.Module):
    def forward(self, x, i, j):
        return x[i, j], x[:, j], *mn.topk(x, 3, dim=1), mn.sort(x, dim=0, descending=True).indices


def test_an_inference_program_matches_pytorch():
    x, i, j = (REFERENCE[f"index_broadcast/input/{name}"] for name in "xij")
    program = mn.compile(Lookup(), inputs={"x": mn.f32[3, 4, 5], "i": mn.i32[3], "j": mn.i32[2, 1]})
    both, second, values, indices, order = program(x=x.astype(np.float32), i=i, j=j)
    np.testing.assert_allclose(both, REFERENCE["index_broadcast/out/0"], rtol=1e-6)
    np.testing.assert_allclose(second, x[:, j], rtol=1e-6)
    expected = np.argsort(-x, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_allclose(values, np.take_along_axis(x, expected, 1), rtol=1e-6)
    np.testing.assert_array_equal(order, np.argsort(-x, axis=0, kind="stable"))


# ---------------------------------------------------------------------------------------------
# dtypes, casts and errors


def traced(fn, **values):
    tracer = Tracer()
    with tracing(tracer):
        leaves = {name: trace_leaf(tracer, "input", name, leaf_type(v)) for name, v in values.items()}
        return fn(**leaves)


def test_dtype_names_are_aliases_of_f32_and_i32():
    assert mn.long is mn.int64 is mn.int32 is mn.int is mn.i32
    assert mn.float32 is mn.float is mn.f32
    assert mn.long == "i32" and "f32" == mn.float32 and mn.long != mn.float32
    for name in (mn.long, "int64", np.int64, int, "long", np.dtype("int32")):
        assert dtype_name(name) == "i32"
    for name in (mn.float32, "float32", np.float32, float):
        assert dtype_name(name) == "f32"
    for bad in ("float64", np.float64, bool, "bfloat16"):
        with pytest.raises(ShapeError, match=r"test_select\.py:\d+: dtype .* is not supported"):
            dtype_name(bad)


def test_casts_and_to():
    def build(x, i):
        assert x.long().dtype == mn.long and x.to(mn.int64).dtype == "i32" and x.to(dtype=int).dtype == "i32"
        assert x.to("cuda") is x and x.to("cpu", mn.float32) is x and x.float() is x
        assert i.float().dtype == mn.float32 and i.type_as(x).dtype == "f32" and x.to(i).dtype == "i32"
        assert i.long() is i and x.new_zeros(2, 3).dtype == "f32" and i.new_ones((2,)).dtype == "i32"
        with pytest.raises(TypeError, match="unsupported arguments"):
            x.to(memory_format=None)
        return True

    assert traced(build, x=np.zeros((2, 3), np.float32), i=np.zeros(3, np.int32))


def test_integer_arithmetic_and_boolean_masks_are_refused_kindly():
    def build(x, i):
        with pytest.raises(ShapeError, match=r"test_select\.py:\d+: add: arithmetic on i32 tensors"):
            i + 1
        with pytest.raises(TypeError, match=r"unsupported index: .*mn\.where\(mask, x, other\).*masked_fill"):
            x[x > 0]
        with pytest.raises(TypeError, match="unsupported index"):
            x[[True, False, True]]
        with pytest.raises(ValueError, match=r"one_hot: give num_classes"):
            F.one_hot(i)
        with pytest.raises(ShapeError, match="one_hot: expected i32"):
            F.one_hot(x, 3)
        with pytest.raises(NotImplementedError, match="sparse_grad"):
            x.gather(0, i.reshape(3, 1), sparse_grad=True)
        with pytest.raises(NotImplementedError, match="requires_grad=True"):
            mn.zeros(2, requires_grad=True)
        with pytest.raises(ShapeError, match="more than 65536 elements"):
            mn.tensor(np.zeros(70000))
        with pytest.raises(ShapeError, match="topk: k = 4 is out of range"):
            x.topk(4)
        with pytest.raises(ValueError, match="integer range needs integer bounds"):
            mn.arange(0, 2.5, dtype=mn.long)
        with pytest.raises(ValueError, match="goes away from the end"):
            mn.arange(3, 0)
        with pytest.raises(ShapeError, match="tril needs an f32 tensor of at least 2 dims"):
            mn.tril(i)
        with pytest.raises(ShapeError, match="gather: the index i32"):
            x.gather(1, mn.zeros(4, 1, dtype=mn.long))
        return True

    assert traced(build, x=np.zeros((3, 3), np.float32), i=np.zeros(3, np.int32))


def test_ir_shape_rules_refuse_what_does_not_fit():
    f, i = TensorType((3, 4)), TensorType((3, 4), "i32")
    for op, types, attrs, message in (
        ("cast", [f], {"dtype": "f32"}, "the other dtype"),
        ("flip", [f], {"axes": (1, 0)}, "sorted distinct axes"),
        ("cumsum", [f], {"axis": 2}, "out of range"),
        ("gather_axis", [f, TensorType((3, 5), "i32")], {"axis": 0}, "no larger outside dim 0"),
        ("gather_axis", [f, f], {"axis": 0}, "i32 index"),
        ("scatter_axis_add", [f, i], {"axis": 0, "shape": (3, 3)}, "no larger outside"),
        ("flat_index", [i], {"sizes": (3, 4)}, "one i32 index per size"),
        ("arg_reduce", [i], {"axis": 0}, "f32"),
        ("topk", [f], {"axis": 1, "k": 5}, "k = 5"),
        ("arange", [], {"start": 0.5, "step": 1.0, "size": 3, "dtype": "i32"}, "integer start"),
        ("constant", [], {"data": "AAAA", "shape": (2,), "dtype": "f32"}, "holds 3 bytes"),
    ):
        with pytest.raises(ShapeError, match=message):
            infer_type(op, types, attrs)


def test_max_and_min_of_two_tensors_are_elementwise():
    """torch.max(a, b) is maximum(a, b): another change declares maximum and minimum
    (ir/functions.py); until it lands, the call says so."""
    a, b = RNG.normal(size=(2, 3)), RNG.normal(size=(3,))
    if "maximum" not in OPS:
        with pytest.raises(NotImplementedError, match="maximum of two tensors is not here yet"):
            traced(lambda a, b: mn.max(a, b), a=a, b=b)
        return
    tracer = Tracer()
    with tracing(tracer):
        x, y = (trace_leaf(tracer, "input", name, leaf_type(v)) for name, v in (("a", a), ("b", b)))
        tracer.graph.outputs = {"max": mn.max(x, y).node, "min": x.min(y).node}
    got = interpret(tracer.graph, {"a": a, "b": b}, dtype=np.float64).outputs
    np.testing.assert_array_equal(got["max"], np.maximum(a, b))
    np.testing.assert_array_equal(got["min"], np.minimum(a, b))


def test_one_hot_has_left_the_missing_names():
    assert F.one_hot is one_hot and "one_hot" in F.__all__
    assert "one_hot" not in ANOTHER_WAY["meganeura.functional"]
    with pytest.raises(MissingName):
        F.no_such_function  # noqa: B018


def test_integers_with_a_float_operand_promote_to_float_as_torch():
    """torch: int64 · float32 (or · a Python float) is float32; here the i32 operand is cast."""
    tracer = Tracer()
    with tracing(tracer):
        i = trace_leaf(tracer, "input", "i", TensorType((4,), "i32"))
        x = trace_leaf(tracer, "input", "x", TensorType((4,)))
        outs = {"product": mn.arange(4) * x, "scaled": i * 0.5, "sum": x + i, "mixed": (i - x) / 2.0}
    for name, t in outs.items():
        assert t.dtype == "f32", name
        tracer.graph.outputs[name] = t.node
    iv, xv = np.array([3, -1, 0, 7], np.int32), np.array([0.5, 2.0, -1.0, 1.5], np.float32)
    got = interpret(tracer.graph, {"i": iv, "x": xv}, {}, {}).outputs
    want = {"product": np.arange(4) * xv, "scaled": iv * 0.5, "sum": xv + iv, "mixed": (iv - xv) / 2.0}
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, err_msg=name)


def test_constructors_outside_a_trace_give_numpy_arrays_as_torch_in_init():
    """torch.zeros/ones/full/arange/eye/tensor/rand/randn in a module's __init__ make the arrays a
    Parameter or buffer is built from: float32, or int64 for integers (torch.long)."""
    mn.manual_seed(4)
    first = mn.randn(3, 2)
    mn.manual_seed(4)
    assert np.array_equal(first, mn.randn(3, 2)) and first.dtype == np.float32
    assert mn.rand(5).min() >= 0.0 and mn.rand(5).max() < 1.0
    assert mn.zeros(2, 3).dtype == np.float32 and not mn.zeros(2, 3).any()
    assert np.array_equal(mn.ones((2,), dtype=mn.long), [1, 1]) and mn.ones(2, dtype=mn.long).dtype == np.int64
    assert np.array_equal(mn.arange(5), np.arange(5)) and mn.arange(5).dtype == np.int64
    assert np.allclose(mn.arange(0.0, 1.0, 0.25), [0, 0.25, 0.5, 0.75]) and mn.arange(0.0, 1.0, 0.5).dtype == np.float32
    assert np.array_equal(mn.full((2, 2), 7.5), np.full((2, 2), 7.5, np.float32)) and np.array_equal(
        mn.eye(2), np.eye(2)
    )
    assert mn.tensor([1, 2]).dtype == np.int64 and mn.tensor([1.5]).dtype == np.float32

    class WithToken(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.token = nn.Parameter(mn.zeros(1, 1, 4))
            self.register_buffer("positions", mn.arange(6))

        def forward(self, x):
            return x + self.token + self.positions[:4].float()

    model = WithToken()
    assert model.state_dict()["positions"].dtype == np.int64
    out = mn.compile(model, inputs={"x": mn.f32[2, 1, 4]})(x=np.ones((2, 1, 4), np.float32))
    np.testing.assert_array_equal(out, np.ones((2, 1, 4)) + np.arange(4))
