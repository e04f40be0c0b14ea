"""The reductions family: sum/max become reduction kernels whose prologue inlines what feeds them
(fuse_pointwise) and whose epilogue folds elementwise ops with literals (mean, rsqrt(mean+eps));
nll_loss(log_softmax) and its gradient become the fused cross-entropy kernels."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    PROPERTY,
    assert_same_results,
    check_rewrite,
    const,
    dims,
    kernels,
    leaf,
    live_nodes,
    mlp_step,
    node,
    ops,
    seeds,
    trace_leaf,
)
from hypothesis import given
from hypothesis import strategies as st

import meganeura.functional as F
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.trace import Tracer, tracing
from meganeura.rewrite import optimize

shapes = st.lists(dims, min_size=1, max_size=3).map(tuple)


def axes_of(shape: tuple[int, ...], pick: int) -> tuple[int, ...]:
    axes = tuple(i for i in range(len(shape)) if (pick >> i) & 1)
    return axes or (len(shape) - 1,)


@PROPERTY
@given(shape=shapes, pick=st.integers(0, 7), keepdim=st.booleans(), kind=st.sampled_from(["sum", "max"]), seed=seeds)
def test_lift_reduce_with_a_fused_prologue(shape, pick, keepdim, kind, seed):
    graph = Graph()
    x, y = leaf(graph, "x", shape), leaf(graph, "y", shape[-1:])
    body = node(graph, "exp", (node(graph, "mul", (x, y)),))
    graph.outputs["r"] = node(graph, kind, (body,), axes=axes_of(shape, pick), keepdim=keepdim)
    fused, report = check_rewrite(graph, "lift_reduce", seed)
    (kernel,) = live_nodes(fused, "fused_reduce")
    assert kernels(fused) == 1 and kernel.attr("prologue") == "exp(mul($0,$1))"
    assert kernel.attr("kind") == kind and report.rule("lift_reduce").uses == 1


@PROPERTY
@given(
    shape=shapes, pick=st.integers(0, 7), fn=st.sampled_from(["exp", "neg", "tanh", "rsqrt", "sqrt", "log"]), seed=seeds
)
def test_reduce_epilogue_unary(shape, pick, fn, seed):
    graph = Graph()
    x = leaf(graph, "x", shape)
    total = node(graph, "sum", (node(graph, "mul", (x, x)),), axes=axes_of(shape, pick), keepdim=True)
    graph.outputs["r"] = node(graph, fn, (node(graph, "add", (total, const(graph, 1.0))),))
    fused, report = check_rewrite(graph, "reduce_epilogue_unary", seed)
    (kernel,) = live_nodes(fused, "fused_reduce")
    assert kernels(fused) == 1 and kernel.attr("epilogue") == f"{fn}(add($r,1.0))"
    assert report.rule("reduce_epilogue_unary").uses == 1 and report.rule("reduce_epilogue_literal").uses == 1


@PROPERTY
@given(
    shape=shapes,
    pick=st.integers(0, 7),
    fn=st.sampled_from(["mul", "add", "sub", "div"]),
    left=st.booleans(),
    value=st.floats(0.5, 4.0).filter(lambda v: v != 1.0),  # x·1 and x/1 are identities
    seed=seeds,
)
def test_reduce_epilogue_literal(shape, pick, fn, left, value, seed):
    graph = Graph()
    x = leaf(graph, "x", shape)
    total = node(graph, "sum", (x,), axes=axes_of(shape, pick), keepdim=False)
    c = const(graph, value)
    graph.outputs["r"] = node(graph, fn, (total, c) if left else (c, total))
    fused, report = check_rewrite(graph, "reduce_epilogue_literal", seed)
    assert kernels(fused) == 1 and report.rule("reduce_epilogue_literal").uses == 1


def test_mean_is_one_kernel():
    import meganeura.functional as F
    from meganeura.ir.trace import Tracer, tracing

    tracer = Tracer()
    x = trace_leaf(tracer, "input", "x", __import__("meganeura").f32[3, 4].type)
    with tracing(tracer):
        tracer.graph.outputs["m"] = F.mean(x * x, 1).node
    graph = tracer.graph
    fused, _ = check_rewrite(graph, "reduce_epilogue_literal")
    (kernel,) = live_nodes(fused, "fused_reduce")
    assert kernel.attr("prologue") == "mul($0,$0)" and kernel.attr("epilogue") == "mul($r,0.25)"


def test_rms_norm_scale_is_one_reduction_kernel():
    graph = Graph()
    x = leaf(graph, "x", (2, 8))
    total = node(graph, "sum", (node(graph, "mul", (x, x)),), axes=(1,), keepdim=True)
    mean = node(graph, "mul", (total, const(graph, 0.125)))
    graph.outputs["scale"] = node(graph, "rsqrt", (node(graph, "add", (mean, const(graph, 1e-5))),))
    fused, _ = check_rewrite(graph)
    (kernel,) = live_nodes(fused, "fused_reduce")
    assert kernel.attr("epilogue") == "rsqrt(add(mul($r,0.125),1e-05))" and kernels(fused) == 1


@PROPERTY
@given(
    parts=st.integers(2, 5),
    shape=shapes,
    fn=st.sampled_from(["mul", "add", "sub", "div", "greater"]),
    left=st.booleans(),
    broadcast=st.booleans(),
    seed=seeds,
)
def test_reduce_epilogue_tensor(parts, shape, fn, left, broadcast, seed):
    """g(sum(p, 0), y) and g(y, sum(p, 0)), p partials [S, *out] and y of the output's shape or
    broadcast to it (its last dim only): one reduction kernel whose epilogue reads y at the output
    element; then relu of that folds too (one op at a time)."""
    graph = Graph()
    partials = leaf(graph, "p", (parts, *shape))
    total = node(graph, "sum", (partials,), axes=(0,), keepdim=False)
    y = leaf(graph, "y", shape[-1:] if broadcast else shape)
    combined = node(graph, fn, (total, y) if left else (y, total))
    graph.outputs["r"] = node(graph, "relu", (combined,))
    fused, report = check_rewrite(graph, "reduce_epilogue_tensor", seed, positive=fn == "div")
    (kernel,) = live_nodes(fused, "fused_reduce")
    assert kernels(fused) == 1 and report.rule("reduce_epilogue_tensor").uses == 1
    assert kernel.attr("epilogue").startswith("relu(") and "$1" in kernel.attr("epilogue")


def test_only_a_sum_of_partials_takes_a_tensor_in_its_epilogue():
    """sum(x, 1) · y (a row sum beside a tensor of its shape) keeps two kernels: the rule folds
    tensors only into the sum over axis 0 of partials, the split products' and reductions' sums
    (rewrite/reductions.py `PARTS_SUM`)."""
    graph = Graph()
    x, y = leaf(graph, "x", (3, 4)), leaf(graph, "y", (3,))
    graph.outputs["r"] = node(graph, "mul", (node(graph, "sum", (x,), axes=(1,), keepdim=False), y))
    fused, report = check_rewrite(graph)
    assert report.rule("reduce_epilogue_tensor").matches == 0
    assert ops(fused).count("sum") == 1 and kernels(fused) == 2


def test_a_reduction_broadcast_back_over_its_input_is_not_folded():
    """x − max(x) (softmax's shift) has the input's shape, not the reduction's: the reduction stays
    a kernel of its own and the subtraction another."""
    graph = Graph()
    x = leaf(graph, "x", (3, 4))
    peak = node(graph, "max", (x,), axes=(1,), keepdim=True)
    graph.outputs["r"] = node(graph, "sub", (x, peak))
    fused, report = check_rewrite(graph)
    assert report.rule("reduce_epilogue_tensor").matches == 0
    assert kernels(fused) == 2


def test_reduction_read_elsewhere_is_still_produced():
    graph = Graph()
    x = leaf(graph, "x", (3, 4))
    total = node(graph, "sum", (x,), axes=(1,), keepdim=False)
    graph.outputs["total"] = total
    graph.outputs["r"] = node(graph, "exp", (total,))
    fused, _ = check_rewrite(graph, "reduce_epilogue_unary")
    assert fused[fused.outputs["total"]].op == "sum"
    assert kernels(fused) == 2


# ---------------------------------------------------------------------------------------------
# Softmax + cross-entropy: nll_loss(log_softmax(x, 1), y) and its gradient → the fused kernels

CE_KERNELS = ("cross_entropy_rows", "cross_entropy_rows_grad")
DECOMPOSED = ("log_softmax", "pick", "scatter_rows", "log_softmax_grad")
batches, class_counts = st.integers(1, 6), st.integers(1, 9)
scales = st.sampled_from([0.1, 1.0, 30.0])  # 30: logits whose exp overflows without the max shift


def labels_leaf(graph: Graph, batch: int) -> int:
    return node(graph, "input", name="y", shape=(batch,), dtype="i32")


def ce_values(batch: int, classes: int, scale: float, seed: int, **shapes) -> dict[str, np.ndarray]:
    """Logits x [batch, classes] (times `scale`), valid labels y, and normal f32 inputs of `shapes`."""
    rng = np.random.default_rng(seed)
    values = {"x": (scale * rng.normal(size=(batch, classes))).astype(np.float32)}
    values["y"] = rng.integers(0, classes, batch).astype(np.int32)
    values.update({name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()})
    return values


def ce_ops(graph: Graph) -> list[str]:
    """The cross-entropy ops of the live nodes, leaving out picks from a [classes] table or a
    scalar: the target weights whose sum "mean" divides by (F.nll_loss, ignore_index)."""
    live = graph.live_ids()
    return [
        n.op
        for n in graph
        if n.id in live
        and n.op in CE_KERNELS + DECOMPOSED
        and not (n.op == "pick" and len(graph[n.inputs[0]].shape) < 2)
    ]


@PROPERTY
@given(batch=batches, classes=class_counts, scale=scales, seed=seeds)
def test_cross_entropy_forward(batch, classes, scale, seed):
    graph = Graph()
    x, y = leaf(graph, "x", (batch, classes)), labels_leaf(graph, batch)
    log_probs = node(graph, "log_softmax", (x,), axis=1)
    graph.outputs["rows"] = node(graph, "neg", (node(graph, "pick", (log_probs, y)),))
    fused, report = optimize(graph)
    assert report.rule("cross_entropy_forward").matches == 1 and report.rule("cross_entropy_forward").uses == 1
    assert ops(fused)[-1] == "cross_entropy_rows" and kernels(fused) == 1
    assert_same_results(graph, fused, ce_values(batch, classes, scale, seed), tol=1e-4)


@PROPERTY
@given(batch=batches, classes=class_counts, scale=scales, seed=seeds)
def test_cross_entropy_backward(batch, classes, scale, seed):
    graph = Graph()
    x, y, h = leaf(graph, "x", (batch, classes)), labels_leaf(graph, batch), leaf(graph, "h", (batch,))
    log_probs = node(graph, "log_softmax", (x,), axis=1)
    onehot = node(graph, "scatter_rows", (node(graph, "neg", (h,)), y), classes=classes)
    graph.outputs["dx"] = node(graph, "log_softmax_grad", (log_probs, onehot), axis=1)
    fused, report = optimize(graph)
    assert report.rule("cross_entropy_backward").matches == 1 and report.rule("cross_entropy_backward").uses == 1
    assert ops(fused)[-1] == "cross_entropy_rows_grad" and kernels(fused) == 1
    assert_same_results(graph, fused, ce_values(batch, classes, scale, seed, h=(batch,)), tol=1e-4)


@PROPERTY
@given(batch=batches, classes=class_counts, reduction=st.sampled_from(["mean", "sum", "none"]), seed=seeds)
def test_traced_cross_entropy_and_its_gradient_become_the_fused_kernels(batch, classes, reduction, seed):
    """F.cross_entropy as traced (nll_loss of log_softmax) and autodiff's gradient of it; "none"
    rows weighted by an input, so the gradient reaching the rows is not a constant."""
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "param", "x", TensorType((batch, classes)))
        y = trace_leaf(tracer, "input", "y", TensorType((batch,), "i32"))
        loss = F.cross_entropy(x, y, reduction=reduction)
        if reduction == "none":
            loss = F.sum(loss * trace_leaf(tracer, "input", "w", TensorType((batch,))))
    graph = tracer.graph
    graph.outputs["loss"] = loss.node
    graph.outputs["dx"] = gradients(graph, loss.node, [x.node])[x.node]
    assert set(DECOMPOSED) <= set(ops(graph))
    fused, report = optimize(graph)
    assert ce_ops(fused) == list(CE_KERNELS)
    assert report.rule("cross_entropy_forward").uses == report.rule("cross_entropy_backward").uses == 1
    values = ce_values(batch, classes, 3.0, seed, w=(batch,))
    x_value = values.pop("x")
    expected, actual = (interpret(g, values, {"x": x_value}).outputs for g in (graph, fused))
    for name in ("loss", "dx"):
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_log_softmax_over_the_batch_axis_is_not_fused():
    graph = Graph()
    x, y, h = leaf(graph, "x", (4, 3)), labels_leaf(graph, 4), leaf(graph, "h", (4,))
    log_probs = node(graph, "log_softmax", (x,), axis=0)  # over the batch: not cross-entropy
    graph.outputs["rows"] = node(graph, "neg", (node(graph, "pick", (log_probs, y)),))
    onehot = node(graph, "scatter_rows", (node(graph, "neg", (h,)), y), classes=3)
    graph.outputs["dx"] = node(graph, "log_softmax_grad", (log_probs, onehot), axis=0)
    fused, report = optimize(graph)
    assert report.rule("cross_entropy_forward").matches == report.rule("cross_entropy_backward").matches == 0
    assert ce_ops(fused) == list(DECOMPOSED)
    assert_same_results(graph, fused, ce_values(4, 3, 1.0, 0, h=(4,)))


@pytest.mark.parametrize("kept", ["log_probs", "picked"])
def test_cross_entropy_intermediates_that_are_outputs_are_still_produced(kept):
    graph = Graph()
    x, y = leaf(graph, "x", (5, 7)), labels_leaf(graph, 5)
    log_probs = node(graph, "log_softmax", (x,), axis=1)
    picked = node(graph, "pick", (log_probs, y))
    graph.outputs["loss"] = node(graph, "sum", (node(graph, "neg", (picked,)),), axes=(0,), keepdim=False)
    graph.outputs[kept] = log_probs if kept == "log_probs" else picked
    fused, report = optimize(graph)
    assert report.rule("cross_entropy_forward").matches == 1
    assert fused[fused.outputs[kept]].op == ("log_softmax" if kept == "log_probs" else "pick")
    assert_same_results(graph, fused, ce_values(5, 7, 1.0, 0))


def test_mlp_training_step_ends_with_the_two_cross_entropy_kernels():
    graph, inputs, params, states = mlp_step()
    fused, report = optimize(graph)
    assert ce_ops(fused) == list(CE_KERNELS)
    reductions = next(family for family in report.families if family.family == "reductions")
    assert reductions.saved.dispatches >= 4  # log_softmax, pick, neg, scatter_rows → 2 kernels (+ the mean)
    assert_same_results(graph, fused, inputs, params, states)
    unfused, _ = optimize(graph, enabled=False)
    assert ce_ops(unfused) == list(DECOMPOSED)  # rewrite=False runs the primitives


def test_a_fused_reduce_epilogue_reads_tensors_broadcast_to_its_output():
    """fused_reduce's epilogue extras broadcast to the output, not to in_shape (a [B, T] tensor
    beside a sum over the last axis of [B, T, C]); one read by both ends broadcasts to both; a split
    reduction's partials keep $r alone; the interpreter adds them as numpy does."""
    from meganeura.ir.op import ShapeError, infer_type, op_def

    attrs = dict(kind="sum", axes=(2,), keepdim=False, in_shape=(2, 3, 4), prologue="$0", epilogue="add($r,$1)")
    x, y = TensorType((2, 3, 4)), TensorType((2, 3))
    assert infer_type("fused_reduce", [x, y], attrs).shape == (2, 3)
    with pytest.raises(ShapeError, match="not broadcast"):
        infer_type("fused_reduce", [x, TensorType((3, 4))], attrs)  # in_shape's, not the output's
    with pytest.raises(ShapeError, match="not broadcast"):
        infer_type("fused_reduce", [x, y], {**attrs, "prologue": "mul($0,$1)"})  # read by both ends
    with pytest.raises(ShapeError, match="reads only"):
        infer_type("fused_reduce", [x, y], {**attrs, "splits": 2})
    rng = np.random.default_rng(0)
    xv, yv = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3))
    got = op_def("fused_reduce").evaluate(xv, yv, **attrs)
    np.testing.assert_allclose(got, xv.sum(axis=2) + yv, rtol=1e-12)


def test_an_optimized_graph_whose_reduction_epilogue_reads_a_tensor_optimizes_again():
    """A fused_reduce whose epilogue reads a tensor encodes as its kernel form and decodes back."""
    graph = Graph()
    x, y = leaf(graph, "x", (6, 5)), leaf(graph, "y", (5,))
    graph.outputs["r"] = node(graph, "relu", (node(graph, "add", (node(graph, "sum", (x,), axes=(0,)), y)),))
    fused, _ = check_rewrite(graph, "reduce_epilogue_tensor")
    again, _ = optimize(fused)
    ((first,), (second,)) = live_nodes(fused, "fused_reduce"), live_nodes(again, "fused_reduce")
    assert first.attr("epilogue") == second.attr("epilogue") == "relu(add($r,$1))"
    assert_same_results(graph, again, {"x": np.ones((6, 5), np.float32), "y": np.arange(5, dtype=np.float32) - 7})
