"""The pointwise family: lifting, inlining (fuse_pointwise), silu/swiglu, the optimizer updates.
Each rule on random shapes and values keeps what the graph computes and fires; intermediates
that are outputs or read elsewhere are still produced."""

from __future__ import annotations

from conftest import (
    PROPERTY,
    check_rewrite,
    const,
    dims,
    kernels,
    leaf,
    live_nodes,
    node,
    ops,
    seeds,
)
from hypothesis import given
from hypothesis import strategies as st

from meganeura.ir.expr import parse
from meganeura.ir.functions import UNARY_FUNCTIONS
from meganeura.ir.graph import Graph
from meganeura.ir.ops.optimizer import HYPER_FIELDS, hyper_offset

shapes = st.lists(dims, min_size=0, max_size=3).map(tuple)
SAFE_UNARY = ("neg", "exp", "relu", "sigmoid", "tanh", "silu")  # defined on any input
POSITIVE_UNARY = ("log", "sqrt", "rsqrt")
SAFE_BINARY = ("add", "sub", "mul", "greater", "equal", "swiglu")


def broadcastable(shape: tuple[int, ...], pick: int) -> tuple[int, ...]:
    """A shape that broadcasts into `shape`: a suffix of it with some dims set to 1."""
    suffix = shape[len(shape) - pick % (len(shape) + 1) :] if shape else ()
    return tuple(1 if (pick >> i) & 1 else d for i, d in enumerate(suffix))


@PROPERTY
@given(fn=st.sampled_from(UNARY_FUNCTIONS), shape=shapes, seed=seeds)
def test_lift_unary(fn, shape, seed):
    graph = Graph()
    x = leaf(graph, "x", shape)
    graph.outputs["y"] = node(graph, "mul", (node(graph, fn, (x,)), x))
    fused, report = check_rewrite(graph, "lift_unary", seed, positive=fn in POSITIVE_UNARY)
    # sigmoid(x)·x is silu(x) and silu(x)·x swiglu(x, x): the plan's kernel is that rule's e-node
    made_by = {"sigmoid": "silu", "silu": "swiglu"}.get(fn, "lift_unary")
    assert kernels(fused) == 1 and report.rule(made_by).uses == 1


@PROPERTY
@given(fn=st.sampled_from(SAFE_BINARY + ("div",)), shape=shapes, pick=st.integers(0, 15), seed=seeds)
def test_lift_binary(fn, shape, pick, seed):
    graph = Graph()
    x, y = leaf(graph, "x", shape), leaf(graph, "y", broadcastable(shape, pick))
    graph.outputs["y"] = node(graph, "exp", (node(graph, fn, (x, y)),))
    fused, report = check_rewrite(graph, "lift_binary", seed, positive=fn == "div")
    assert kernels(fused) == 1 and report.rule("lift_binary").uses == 1


@PROPERTY
@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), pick=st.integers(0, 15), seed=seeds)
def test_lift_broadcast(shape, pick, seed):
    graph = Graph()
    x, y = leaf(graph, "x", broadcastable(shape, pick)), leaf(graph, "y", shape)
    expanded = node(graph, "broadcast_to", (x,), shape=shape)
    graph.outputs["y"] = node(graph, "mul", (expanded, y))
    fused, report = check_rewrite(graph, "lift_broadcast", seed)
    assert "broadcast_to" not in ops(fused) and kernels(fused) == 1


@PROPERTY
@given(value=st.floats(-3, 3, width=32).filter(lambda v: v != 1.0), shape=shapes, seed=seeds)
def test_const_literal(value, shape, seed):
    graph = Graph()
    x = leaf(graph, "x", shape)
    graph.outputs["y"] = node(graph, "tanh", (node(graph, "mul", (x, const(graph, value))),))
    fused, report = check_rewrite(graph, "const_literal", seed)
    (kernel,) = live_nodes(fused, "pointwise")
    assert kernel.inputs == (fused.nodes[0].id,)  # x only: the constant is a literal
    assert report.rule("const_literal").uses == 1


def test_reshaped_constant_is_a_literal_too():
    graph = Graph()
    x = leaf(graph, "x", (2, 3, 4))
    scale = node(graph, "reshape", (const(graph, 0.25),), shape=(1, 1, 1))
    graph.outputs["y"] = node(graph, "mul", (scale, node(graph, "tanh", (x,))))
    fused, _ = check_rewrite(graph, "const_literal")
    (kernel,) = live_nodes(fused, "pointwise")
    assert kernel.attr("expr") == "mul(0.25,tanh($0))" and len(kernel.inputs) == 1


CHAIN_OPS = ("add", "sub", "mul", "relu", "tanh", "sigmoid", "neg", "greater", "swiglu")


@PROPERTY
@given(
    shape=st.lists(dims, min_size=1, max_size=3).map(tuple),
    steps=st.lists(st.tuples(st.sampled_from(CHAIN_OPS), st.integers(0, 15)), min_size=2, max_size=6),
    seed=seeds,
)
def test_fuse_pointwise_chain_is_one_kernel(shape, steps, seed):
    graph = Graph()
    value = leaf(graph, "x", shape)
    for index, (fn, pick) in enumerate(steps):
        if fn in ("add", "sub", "mul", "greater", "swiglu"):
            other = leaf(graph, f"y{index}", broadcastable(shape, pick))
            value = node(graph, fn, (value, other) if pick % 2 else (other, value))
        else:
            value = node(graph, fn, (value,))
    graph.outputs["y"] = value
    fused, report = check_rewrite(graph, "fuse_pointwise", seed)
    assert kernels(fused) == 1
    assert report.rule("fuse_pointwise").uses == len(steps) - 1


def test_chain_intermediate_that_is_an_output_is_still_produced():
    graph = Graph()
    x, b = leaf(graph, "x", (4, 6)), leaf(graph, "b", (6,))
    pre = node(graph, "add", (x, b))
    graph.outputs["pre"] = pre
    graph.outputs["y"] = node(graph, "tanh", (node(graph, "relu", (pre,)),))
    fused, _ = check_rewrite(graph, "fuse_pointwise")
    assert fused[fused.outputs["pre"]].op == "add"
    assert kernels(fused) == 2  # pre, and tanh(relu(pre)) reading it


def test_value_read_by_a_matmul_and_a_pointwise_op_is_computed_once():
    graph = Graph()
    x, w = leaf(graph, "x", (4, 6)), leaf(graph, "w", (3, 4))
    hidden = node(graph, "exp", (x,))
    # B operand: a matmul reads B as stored (an A operand could be recomputed in its prologue)
    product = node(graph, "matmul", (w, hidden), transpose_a=False, transpose_b=False)
    graph.outputs["y"] = node(
        graph,
        "add",
        (
            node(graph, "sum", (product,), axes=(0,), keepdim=False),
            node(graph, "sum", (hidden,), axes=(0,), keepdim=False),
        ),
    )
    fused, _ = check_rewrite(graph)
    assert ops(fused).count("exp") == 1  # the matmul needs it stored; the sum reads it


@PROPERTY
@given(shape=shapes, sigmoid_first=st.booleans(), seed=seeds)
def test_silu(shape, sigmoid_first, seed):
    graph = Graph()
    x = leaf(graph, "x", shape)
    s = node(graph, "sigmoid", (x,))
    graph.outputs["y"] = node(graph, "mul", (s, x) if sigmoid_first else (x, s))
    fused, report = check_rewrite(graph, "silu", seed)
    assert ops(fused) == ["input", "silu"] and report.rule("silu").uses == 1


def test_silu_needs_the_same_value_twice():
    graph = Graph()
    x, z = leaf(graph, "x", (3,)), leaf(graph, "z", (3,))
    graph.outputs["y"] = node(graph, "mul", (x, node(graph, "sigmoid", (z,))))
    _, report = check_rewrite(graph)
    assert report.rule("silu").matches == 0


@PROPERTY
@given(
    shape=st.lists(dims, min_size=1, max_size=3).map(tuple),
    pick=st.integers(0, 15),
    silu_first=st.booleans(),
    seed=seeds,
)
def test_swiglu(shape, pick, silu_first, seed):
    graph = Graph()
    g, u = leaf(graph, "g", shape), leaf(graph, "u", broadcastable(shape, pick))
    s = node(graph, "silu", (g,))
    graph.outputs["y"] = node(graph, "mul", (s, u) if silu_first else (u, s))
    fused, report = check_rewrite(graph, "swiglu", seed)
    assert ops(fused)[-1] == "swiglu" and report.rule("swiglu").uses == 1


def test_swiglu_keeps_a_silu_that_is_also_an_output():
    graph = Graph()
    g, u = leaf(graph, "g", (2, 3)), leaf(graph, "u", (2, 3))
    s = node(graph, "silu", (g,))
    graph.outputs["gate"] = s
    graph.outputs["y"] = node(graph, "mul", (s, u))
    fused, _ = check_rewrite(graph, "swiglu")
    assert fused[fused.outputs["gate"]].op == "silu"


def hyper(graph: Graph, name: str, constant_zero: bool = False) -> int:
    """A hyper-parameter operand as optim/optimizers.py builds it: an element of the group's
    vector, a `state` leaf the runtime writes (random values here, like every leaf), or the
    constant 0 where a term is absent by construction (AdamW's L2 term, SGD momentum's decay in
    sgd_step)."""
    if constant_zero:
        return const(graph, 0.0)
    vectors = [n.id for n in graph if n.op == "state" and n.attr("name") == "hyper"]
    vector = vectors[0] if vectors else leaf(graph, "hyper", (len(HYPER_FIELDS),), "state")
    field = {"wd": "weight_decay", "beta": "beta1", "weight": "one_minus_beta1", "dampening": "dampening_factor"}
    field = field.get(name, name)
    return node(graph, "element", (vector,), index=hyper_offset(field))


@PROPERTY
@given(shape=st.lists(dims, min_size=1, max_size=2).map(tuple), no_decay=st.booleans(), seed=seeds)
def test_lift_sgd_step(shape, no_decay, seed):
    graph = Graph()
    p, g = leaf(graph, "p", shape, "param"), leaf(graph, "g", shape)
    lr, wd = hyper(graph, "lr"), hyper(graph, "wd", no_decay)
    graph.updates["p"] = node(graph, "sgd_step", (p, node(graph, "tanh", (g,)), lr, wd))
    fused, report = check_rewrite(graph, "lift_sgd_step", seed)
    assert kernels(fused) == 1 and report.rule("lift_sgd_step").uses == 1


@PROPERTY
@given(shape=st.lists(dims, min_size=1, max_size=2).map(tuple), no_decay=st.booleans(), seed=seeds)
def test_lift_momentum_buffer(shape, no_decay, seed):
    graph = Graph()
    p, buf, g = leaf(graph, "p", shape, "param"), leaf(graph, "buf", shape, "state"), leaf(graph, "g", shape)
    momentum, dampening = hyper(graph, "momentum"), hyper(graph, "dampening")
    operands = (buf, node(graph, "exp", (g,)), p, momentum, dampening, hyper(graph, "wd", no_decay))
    graph.updates["buf"] = node(graph, "momentum_buffer", operands)
    fused, report = check_rewrite(graph, "lift_momentum_buffer", seed)
    assert kernels(fused) == 1 and report.rule("lift_momentum_buffer").uses == 1


@PROPERTY
@given(
    shape=st.lists(dims, min_size=1, max_size=2).map(tuple),
    order=st.sampled_from([1, 2]),
    decoupled=st.booleans(),
    seed=seeds,
)
def test_lift_adam_moment(shape, order, decoupled, seed):
    graph = Graph()
    p, m, g = leaf(graph, "p", shape, "param"), leaf(graph, "m", shape, "state"), leaf(graph, "g", shape)
    # AdamW's moments read constants 0 for p and wd; Adam's the parameter and its decay leaf.
    decayed, wd = (const(graph, 0.0), const(graph, 0.0)) if decoupled else (p, hyper(graph, "wd"))
    operands = (m, node(graph, "neg", (g,)), decayed, hyper(graph, "beta"), hyper(graph, "weight"), wd)
    graph.updates["m"] = node(graph, "adam_moment", operands, order=order)
    fused, report = check_rewrite(graph, "lift_adam_moment", seed)
    assert kernels(fused) == 1 and report.rule("lift_adam_moment").uses == 1
    (kernel,) = live_nodes(fused, "pointwise")
    assert "neg(" in kernel.attr("expr")  # the gradient's neg is inlined into the moment kernel
    assert parse(kernel.attr("expr"))[0] == ("where" if order == 1 else "add")  # lerp's two forms, or mul_ + addcmul_


def test_adam_moments_that_share_a_gradient_leave_it_stored():
    graph = Graph()
    m, v, g = (
        leaf(graph, "m", (5,), "state"),
        leaf(graph, "v", (5,), "state"),
        leaf(graph, "g", (5,)),
    )
    grad = node(graph, "exp", (g,))
    zero, beta1, beta2 = const(graph, 0.0), hyper(graph, "beta1"), hyper(graph, "beta2")
    weight1, weight2 = hyper(graph, "one_minus_beta1"), hyper(graph, "one_minus_beta2")
    graph.updates["m"] = node(graph, "adam_moment", (m, grad, zero, beta1, weight1, zero), order=1)
    graph.updates["v"] = node(graph, "adam_moment", (v, grad, zero, beta2, weight2, zero), order=2)
    fused, _ = check_rewrite(graph, "lift_adam_moment")
    assert kernels(fused) == 2  # exp is cheap enough to recompute in both moment kernels


@PROPERTY
@given(shape=st.lists(dims, min_size=1, max_size=2).map(tuple), no_decay=st.booleans(), seed=seeds)
def test_lift_adamax_norm(shape, no_decay, seed):
    graph = Graph()
    p, u, g = leaf(graph, "p", shape, "param"), leaf(graph, "u", shape, "state"), leaf(graph, "g", shape)
    operands = (
        u,
        node(graph, "tanh", (g,)),
        p,
        hyper(graph, "beta2"),
        hyper(graph, "eps"),
        hyper(graph, "wd", no_decay),
    )
    graph.updates["u"] = node(graph, "adamax_norm", operands)
    fused, report = check_rewrite(graph, "lift_adamax_norm", seed)
    assert kernels(fused) == 1 and report.rule("lift_adamax_norm").uses == 1
    (kernel,) = live_nodes(fused, "pointwise")
    assert parse(kernel.attr("expr"))[0] == "maximum"  # torch.maximum, NaN-propagating (mn_maximum)


@PROPERTY
@given(shape=st.lists(dims, min_size=1, max_size=2).map(tuple), seed=seeds)
def test_lift_adadelta_delta(shape, seed):
    """Adadelta's single-tensor step: its direction δ, read by acc_delta's moment and by the step,
    is stored by neither: extraction recomputes it in both kernels or stores it, the numbers the same."""
    graph = Graph()
    p, g = leaf(graph, "p", shape, "param"), leaf(graph, "g", shape)
    s, acc = leaf(graph, "s", shape, "state"), leaf(graph, "acc", shape, "state")
    zero, eps, wd = const(graph, 0.0), hyper(graph, "eps"), hyper(graph, "wd")
    rho, weight = hyper(graph, "rho"), hyper(graph, "one_minus_rho")
    grad = node(graph, "exp", (g,))
    s2 = graph.updates["s"] = node(graph, "adam_moment", (s, grad, p, rho, weight, wd), order=2)
    delta = node(graph, "adadelta_delta", (grad, p, s2, acc, eps, wd))
    graph.updates["acc"] = node(graph, "adam_moment", (acc, delta, zero, rho, weight, zero), order=2)
    graph.updates["p"] = node(graph, "sgd_step", (p, delta, hyper(graph, "lr"), zero))
    fused, report = check_rewrite(graph, "lift_adadelta_delta", seed, positive=True)
    assert "adadelta_delta" not in ops(fused)  # its kernel form: stored by a kernel of its own, or inlined
