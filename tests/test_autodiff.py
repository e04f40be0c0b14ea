"""Every op's gradient against central finite differences, in float64, in the middle of a chain.

Each check builds loss = sum(R ⊙ op(A ⊙ p + B)) for parameters p: the op sits between an affine
map and a weighted sum, so a rule that ignores its upstream gradient (or its input's chain
factor) is caught — a wrong grad_output contract hides at the end of a chain.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gradcheck, run_traced, trace_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.trace import Tracer, tracing
from meganeura.tensor import Tensor, apply

UNARY = {
    "neg": (lambda x: -x, {}),
    "exp": (F.exp, {}),
    "log": (F.log, {"positive": True}),
    "sqrt": (F.sqrt, {"positive": True}),
    "relu": (F.relu, {"away_from_zero": True}),
    "sigmoid": (F.sigmoid, {}),
    "tanh": (F.tanh, {}),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_gradients(name):
    op, options = UNARY[name]
    assert gradcheck(op, [(3, 4)], np.random.default_rng(1), **options) < 1e-6


BINARY_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((), (2, 3))]


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
@pytest.mark.parametrize("name", ["add", "sub", "mul"])
def test_binary_gradients_with_broadcasting(name, shapes):
    op = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}[name]
    assert gradcheck(op, list(shapes), np.random.default_rng(2)) < 1e-6


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=str)
def test_div_gradient(shapes):
    assert gradcheck(lambda a, b: a / b, list(shapes), np.random.default_rng(3), positive=True) < 1e-6


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_gradients(ta, tb):
    m, k, n = 3, 5, 4
    a_shape = (k, m) if ta else (m, k)
    b_shape = (n, k) if tb else (k, n)

    def op(a, b):
        return F.matmul(a.T if ta else a, b.T if tb else b)

    assert gradcheck(op, [a_shape, b_shape], np.random.default_rng(4)) < 1e-6


@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (1, True), ((0, 2), False), (-1, True)])
def test_sum_and_mean_gradients(dim, keepdim):
    rng = np.random.default_rng(5)
    assert gradcheck(lambda x: F.sum(x, dim, keepdim), [(2, 3, 4)], rng) < 1e-6
    assert gradcheck(lambda x: F.mean(x, dim, keepdim), [(2, 3, 4)], rng) < 1e-6


def test_reshape_and_linear_gradients():
    rng = np.random.default_rng(6)
    assert gradcheck(lambda x: F.reshape(x, (4, -1)), [(2, 3, 2)], rng) < 1e-6
    assert gradcheck(lambda x, w, b: F.linear(x, w, b), [(5, 3), (4, 3), (4,)], rng) < 1e-6
    # Linear on a 3-D input flattens the leading dims, like torch.
    assert gradcheck(lambda x, w: F.linear(x, w), [(2, 3, 4), (5, 4)], rng) < 1e-6


def test_cross_entropy_gradient_mid_chain():
    rng = np.random.default_rng(7)
    labels = np.array([0, 2, 4, 1, 2], dtype=np.int32)
    for reduction in ("mean", "sum", "none"):
        err = gradcheck(
            lambda z, labels, r=reduction: F.cross_entropy(z, labels, reduction=r), [(5, 5)], rng, labels=labels
        )
        assert err < 1e-6, reduction


def test_mse_loss_gradient():
    assert gradcheck(lambda a, b: F.mse_loss(a, b), [(4, 3), (4, 3)], np.random.default_rng(8)) < 1e-6


def test_fan_in_accumulates():
    # x used three times: gradients from each use are summed.
    assert gradcheck(lambda x: x * x + F.exp(x) * x, [(3, 3)], np.random.default_rng(9)) < 1e-6


def test_unused_parameter_has_no_gradient():
    tracer = Tracer()
    with tracing(tracer):
        used = trace_leaf(tracer, "param", "used", TensorType((2,)))
        unused = trace_leaf(tracer, "param", "unused", TensorType((2,)))
        loss = F.sum(used * used)
    grads = gradients(tracer.graph, loss.node, [used.node, unused.node])
    assert grads[unused.node] is None
    assert grads[used.node] is not None


def test_new_unary_gradients():
    rng = np.random.default_rng(10)
    assert gradcheck(F.rsqrt, [(3, 4)], rng, positive=True) < 1e-6
    assert gradcheck(F.silu, [(3, 4)], rng) < 1e-6


def test_swiglu_gradient_with_broadcasting():
    rng = np.random.default_rng(11)
    assert gradcheck(lambda g, u: apply("swiglu", g, u), [(3, 4), (3, 4)], rng) < 1e-6
    assert gradcheck(lambda g, u: apply("swiglu", g, u), [(3, 4), (4,)], rng) < 1e-6


@pytest.mark.parametrize("dim,keepdim", [(None, False), (1, True), ((0, 2), False)])
def test_amax_gradient(dim, keepdim):
    assert gradcheck(lambda x: F.amax(x, dim, keepdim), [(2, 3, 4)], np.random.default_rng(12)) < 1e-6


def test_amax_splits_the_gradient_between_ties():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "param", "x", TensorType((4,)))
        loss = F.amax(x) * 3.0
    grads = gradients(tracer.graph, loss.node, [x.node])
    tracer.graph.outputs["g"] = grads[x.node]
    got = interpret(tracer.graph, params={"x": np.array([1.0, 5.0, 5.0, 2.0])}, dtype=np.float64).outputs["g"]
    np.testing.assert_allclose(got, [0.0, 1.5, 1.5, 0.0])


def test_permute_transpose_and_batched_matmul_gradients():
    rng = np.random.default_rng(13)
    assert gradcheck(lambda x: F.permute(x, (2, 0, 1)), [(2, 3, 4)], rng) < 1e-6
    assert gradcheck(lambda x: x.transpose(0, 1), [(3, 4)], rng) < 1e-6
    assert gradcheck(lambda a, b: a @ b, [(2, 3, 4), (2, 4, 5)], rng) < 1e-6
    assert gradcheck(lambda a, b: a @ b.transpose(1, 2), [(2, 3, 4), (2, 5, 4)], rng) < 1e-6


@pytest.mark.parametrize("dim", [-1, 0])
def test_softmax_and_log_softmax_gradients(dim):
    rng = np.random.default_rng(14)
    assert gradcheck(lambda x: F.softmax(x, dim), [(3, 5)], rng) < 1e-6
    assert gradcheck(lambda x: F.log_softmax(x, dim), [(3, 5)], rng) < 1e-6


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_softmax_and_log_softmax_gradients_along_each_axis_of_a_3d_tensor(dim):
    rng = np.random.default_rng(16)
    assert gradcheck(lambda x: F.softmax(x, dim), [(2, 3, 4)], rng) < 1e-6
    assert gradcheck(lambda x: F.log_softmax(x, dim), [(2, 3, 4)], rng) < 1e-6


def test_nll_loss_pick_and_scatter_rows_gradients_mid_chain():
    rng = np.random.default_rng(17)
    labels = np.array([0, 2, 4, 1, 2], dtype=np.int32)
    for reduction in ("mean", "sum", "none"):
        err = gradcheck(lambda z, labels, r=reduction: F.nll_loss(z, labels, reduction=r), [(5, 5)], rng, labels=labels)
        assert err < 1e-6, reduction
    scatter = lambda g, labels: apply("scatter_rows", g, labels, classes=6)  # noqa: E731
    assert gradcheck(scatter, [(5,)], rng, labels=labels) < 1e-6


def test_cross_entropy_and_nll_loss_follow_pytorch():
    """F.cross_entropy = F.nll_loss(F.log_softmax(z, 1)); "mean" averages over the batch."""
    z = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, 0.0], [-5.0, 0.0, 5.0], [0.5, 0.5, 0.5]])
    y = np.array([2, 0, 0, 1], dtype=np.int32)
    shifted = z - z.max(1, keepdims=True)
    rows = -(shifted - np.log(np.exp(shifted).sum(1, keepdims=True)))[np.arange(4), y]
    picked = z[np.arange(4), y]  # nll_loss(−z) = −(−z)[i, y[i]]
    expected = {"mean": (rows.mean(), picked.mean()), "sum": (rows.sum(), picked.sum()), "none": (rows, picked)}
    for reduction, (ce, nll) in expected.items():
        tracer = Tracer()
        with tracing(tracer):
            logits = trace_leaf(tracer, "input", "z", TensorType((4, 3)))
            labels = trace_leaf(tracer, "input", "y", TensorType((4,), "i32"))
            tracer.graph.outputs["ce"] = F.cross_entropy(logits, labels, reduction=reduction).node
            tracer.graph.outputs["nll"] = F.nll_loss(-logits, labels, reduction=reduction).node
        out = interpret(tracer.graph, {"z": z, "y": y}, dtype=np.float64).outputs
        np.testing.assert_allclose(out["ce"], ce, rtol=1e-12)
        np.testing.assert_allclose(out["nll"], nll, rtol=1e-12)


def test_softmax_matches_a_direct_formula():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((2, 3)))
        tracer.graph.outputs["p"] = F.softmax(x * 1.0).node
        tracer.graph.outputs["lp"] = F.log_softmax(x * 1.0).node
    value = np.array([[1.0, 2.0, 3.0], [1000.0, 1000.0, 0.0]])
    out = interpret(tracer.graph, {"x": value}, dtype=np.float64).outputs
    expected = np.exp(value - value.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    np.testing.assert_allclose(out["p"], expected)
    shifted = value - value.max(1, keepdims=True)
    np.testing.assert_allclose(out["lp"], shifted - np.log(np.exp(shifted).sum(1, keepdims=True)), atol=1e-12)


def test_expand_gradient():
    rng = np.random.default_rng(15)
    assert gradcheck(lambda x: x.expand(2, 3, 4), [(3, 1)], rng) < 1e-6
    assert gradcheck(lambda x: F.broadcast_to(x, (2, 3, 4)), [(4,)], rng) < 1e-6


@pytest.mark.parametrize("shapes", [((3, 4), (4,)), ((2, 3, 4), (3, 4))], ids=str)
def test_rms_norm_gradient(shapes):
    """x · rsqrt(mean(x², trailing dims) + eps) · weight, traced decomposed, mid-chain."""
    x_shape, w_shape = shapes
    rng = np.random.default_rng(16)
    assert gradcheck(lambda x, w: F.rms_norm(x, w_shape, w, eps=1e-5), [x_shape, w_shape], rng) < 1e-6
    assert gradcheck(lambda x: F.rms_norm(x, x_shape[-1]), [x_shape], rng) < 1e-6


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_with_a_shared_2d_operand_gradients(ta, tb):
    rng = np.random.default_rng(16)
    m, k, n = 3, 4, 5
    a3 = (2, k, m) if ta else (2, m, k)
    b2 = (n, k) if tb else (k, n)

    def op(a, b):
        return apply("matmul", a, b, transpose_a=ta, transpose_b=tb)

    assert gradcheck(op, [a3, b2], rng) < 1e-6  # B shared by the batch of A
    a2 = (k, m) if ta else (m, k)
    b3 = (2, n, k) if tb else (2, k, n)
    assert gradcheck(op, [a2, b3], rng) < 1e-6  # A shared by the batch of B


@pytest.mark.parametrize("shapes", [[(4,), (4, 3)], [(2, 3, 4), (4,)], [(4,), (4,)], [(5,), (2, 5, 3)]])
def test_matmul_of_vectors_follows_torch(shapes):
    # torch.matmul (and numpy's @): a 1-D operand is a row of a or a column of b, its dim dropped;
    # F.linear of a 1-D input is the case the fuzzer found (it raised "rank >= 2").
    rng = np.random.default_rng(17)
    a, b = (rng.normal(size=shape) for shape in shapes)
    got = run_traced(lambda a, b: {"out": a @ b}, {"a": a, "b": b})["out"]
    np.testing.assert_allclose(got, a @ b, rtol=1e-12)
    assert gradcheck(lambda a, b: a @ b, shapes, rng) < 1e-6
    with pytest.raises(mn.ShapeError, match="need ≥ 1 dim"):
        run_traced(lambda v: {"out": v @ v.sum()}, {"v": np.ones(3)})


# ---------------------------------------------------------------------------------------------
# where, masked_fill, clamp, abs, leaky_relu, softplus and the comparisons (issue 9's new ops)

NEW_OPS = {
    "abs": (lambda x: F.abs(x), [(3, 4)]),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), [(3, 4)]),
    "softplus": (lambda x: F.softplus(x), [(3, 4)]),
    # beta 2 and threshold 1.5: some elements of 2·x are above the threshold (the gradient is 1 there)
    "softplus beta threshold": (lambda x: F.softplus(x, beta=2.0, threshold=1.5), [(3, 4)]),
    "where": (lambda c, a, b: mn.where(c > 0, a, b), [(3, 4), (3, 4), (4,)]),
    "where of a broadcast condition": (lambda c, a, b: mn.where(c < 0, a, b), [(3, 1), (3, 4), (3, 4)]),
    "masked_fill": (lambda x, m: x.masked_fill(m >= 0, -2.5), [(3, 4), (4,)]),
    "clamp numbers": (lambda x: x.clamp(-1.0, 0.9), [(3, 4)]),
    "clamp min only": (lambda x: mn.clamp(x, min=-0.8), [(3, 4)]),
    "clamp tensors": (lambda x, lo, hi: mn.clamp(x, lo - 1.0, hi + 1.0), [(3, 4), (4,), (3, 1)]),
    "a mask times x": (lambda x, y: (x > y) * x + (x <= y) * y * 0.5 + (x != y) * 0.1, [(3, 4), (3, 4)]),
}


@pytest.mark.parametrize("name", sorted(NEW_OPS))
def test_gradients_of_the_new_ops_mid_chain(name):
    # Away from zero: the ops have kinks or jumps at 0 (abs, leaky_relu, the masks), and a finite
    # difference across one is no gradient; the chain A·p + B keeps every input in ±[0.25, 2.4].
    op, shapes = NEW_OPS[name]
    assert gradcheck(op, shapes, np.random.default_rng(20), away_from_zero=True) < 1e-6


def test_comparisons_of_tensors_are_tensors_not_python_bools():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((2, 3)))
        y = trace_leaf(tracer, "input", "y", TensorType((3,)))
        masks = {
            "==": x == 0,
            "!=": x != y,
            "<": x < y,
            "<=": 0.5 <= x,
            "<=t": x <= y,
            ">": x > 1,
            ">=": x >= y,
            "r==": 0 == x,
        }
    for symbol, mask in masks.items():
        assert isinstance(mask, Tensor) and mask.shape == (2, 3), symbol
    ops = {symbol: tracer.graph[m.node].op for symbol, m in masks.items()}
    assert ops == {  # 0.5 <= x is x >= 0.5 (Python reflects it), 0 == x is x == 0
        "==": "equal",
        "!=": "not_equal",
        "<": "less",
        "<=": "greater_equal",
        "<=t": "less_equal",
        ">": "greater",
        ">=": "greater_equal",
        "r==": "equal",
    }
    assert (x == "text") is False  # not a number or a Tensor: Python's own comparison
    assert len({x, y}) == 2  # tensors still hash by identity


def test_the_new_ops_compute_what_pytorch_computes():
    # PyTorch's results for these inputs, written out: masks are 0/1 floats, clamp lets max win
    # where min > max, softplus follows x above the threshold, masked_fill fills where the mask is set.
    values = {"x": np.array([[-2.0, -0.5, 0.0, 0.5, 30.0]]), "m": np.array([[1.0, 0.0, 1.0, 0.0, 0.0]])}
    got = run_traced(
        lambda x, m: {
            "abs": F.abs(x),
            "leaky": F.leaky_relu(x, 0.1),
            "softplus": F.softplus(x, threshold=20.0),
            "clamp": x.clamp(-1.0, 0.25),
            "clamp_crossed": mn.clamp(x, 1.0, -1.0),
            "where": mn.where(x >= 0, x, m),
            "fill": x.masked_fill(m, 7.0),
            "eq": x == 0.5,
            "ne": x != 0.5,
        },
        values,
    )
    x = values["x"][0]
    expected = {
        "abs": [2.0, 0.5, 0.0, 0.5, 30.0],
        "leaky": [-0.2, -0.05, 0.0, 0.5, 30.0],
        "softplus": [np.log1p(np.exp(v)) if v <= 20 else v for v in x],
        "clamp": [-1.0, -0.5, 0.0, 0.25, 0.25],
        "clamp_crossed": [-1.0] * 5,
        "where": [1.0, 0.0, 0.0, 0.5, 30.0],
        "fill": [7.0, -0.5, 7.0, 0.5, 30.0],
        "eq": [0.0, 0.0, 0.0, 1.0, 0.0],
        "ne": [1.0, 1.0, 1.0, 0.0, 1.0],
    }
    for name, want in expected.items():
        np.testing.assert_allclose(got[name][0], want, rtol=1e-12, err_msg=name)
