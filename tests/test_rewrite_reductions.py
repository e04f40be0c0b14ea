"""The reductions family: sum/max become reduction kernels whose prologue inlines what feeds them
(fuse_pointwise) and whose epilogue folds elementwise ops with literals (mean, rsqrt(mean+eps))."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_rewrite_support import (
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

from meganeura.ir.graph import Graph

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
    x = tracer.leaf("input", "x", __import__("meganeura").f32[3, 4].type)
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


def test_epilogue_with_another_tensor_is_not_folded():
    graph = Graph()
    x, y = leaf(graph, "x", (3, 4)), leaf(graph, "y", (3,))
    graph.outputs["r"] = node(graph, "mul", (node(graph, "sum", (x,), axes=(1,), keepdim=False), y))
    fused, report = check_rewrite(graph)
    assert report.rule("reduce_epilogue_literal").matches == 0
    assert ops(fused).count("sum") == 1 and kernels(fused) == 2


def test_reduction_read_elsewhere_is_still_produced():
    graph = Graph()
    x = leaf(graph, "x", (3, 4))
    total = node(graph, "sum", (x,), axes=(1,), keepdim=False)
    graph.outputs["total"] = total
    graph.outputs["r"] = node(graph, "exp", (total,))
    fused, _ = check_rewrite(graph, "reduce_epilogue_unary")
    assert fused[fused.outputs["total"]].op == "sum"
    assert kernels(fused) == 2
