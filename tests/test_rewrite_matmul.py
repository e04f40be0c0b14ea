"""The matmul family: matmul kernels absorb elementwise consumers of their shape into the epilogue
(bias + activation forward, masks and updates backward). Random shapes and values keep what the
graph computes; the guard (no enlarging operand) and the cost (no recomputed matmul) hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from test_rewrite_support import (
    PROPERTY,
    check_rewrite,
    dims,
    kernels,
    leaf,
    live_nodes,
    matmul,
    node,
    operands,
    ops,
    seeds,
)

from meganeura.ir.expr import parse
from meganeura.ir.graph import Graph

batches = st.lists(dims, min_size=0, max_size=1).map(tuple)
flags = st.tuples(st.booleans(), st.booleans())
EXTRA_SHAPES = {  # kind -> shape of an extra operand for a [*batch, m, n] product; all broadcast into it
    "vector": lambda batch, m, n: (n,),
    "row": lambda batch, m, n: (1, n),
    "column": lambda batch, m, n: (m, 1),
    "matrix": lambda batch, m, n: (*batch, m, n),
    "scalar": lambda batch, m, n: (1,),
}


@PROPERTY
@given(batch=batches, mkn=st.tuples(dims, dims, dims), flag=flags, seed=seeds)
def test_lift_matmul(batch, mkn, flag, seed):
    graph = Graph()
    a, b = operands(graph, batch, *mkn, *flag)
    graph.outputs["y"] = matmul(graph, a, b, *flag)
    fused, _ = check_rewrite(graph, "lift_matmul", seed)
    assert ops(fused)[-1] == "matmul"


@PROPERTY
@given(
    batch=batches,
    mkn=st.tuples(dims, dims, dims),
    flag=flags,
    activation=st.sampled_from(["relu", "sigmoid", "tanh", "silu", "exp", "neg"]),
    extra=st.sampled_from([None, *EXTRA_SHAPES]),
    fn=st.sampled_from(["add", "mul", "sub"]),
    left=st.booleans(),
    seed=seeds,
)
def test_matmul_epilogue(batch, mkn, flag, activation, extra, fn, left, seed):
    m, _, n = mkn
    graph = Graph()
    a, b = operands(graph, batch, *mkn, *flag)
    value = matmul(graph, a, b, *flag)
    if extra is not None:
        bias = leaf(graph, "bias", EXTRA_SHAPES[extra](batch, m, n))
        value = node(graph, fn, (value, bias) if left else (bias, value))
    graph.outputs["y"] = node(graph, activation, (value,))
    fused, report = check_rewrite(graph, "matmul_epilogue", seed)
    (kernel,) = live_nodes(fused, "fused_matmul")
    assert kernels(fused) == 1 and report.rule("matmul_epilogue").uses == 1
    assert parse(kernel.attr("epilogue"))[0] == activation
    assert kernel.attr("transpose_a") is flag[0] and kernel.attr("transpose_b") is flag[1]


def test_operand_that_enlarges_the_product_is_not_fused():
    # [4,1] + [6] broadcasts to [4,6]: a matmul kernel producing [4,1] cannot compute it.
    graph = Graph()
    a, b = operands(graph, (), 4, 3, 1, False, False)
    graph.outputs["y"] = node(graph, "add", (matmul(graph, a, b), leaf(graph, "bias", (6,))))
    fused, report = check_rewrite(graph)
    assert "fused_matmul" not in ops(fused) and report.rule("matmul_epilogue").matches == 0


def test_matmul_read_elsewhere_keeps_its_result_and_a_cheap_epilogue_reads_it():
    graph = Graph()
    a, b = operands(graph, (), 64, 256, 64, False, False)
    product = matmul(graph, a, b)
    graph.outputs["product"] = product
    graph.outputs["y"] = node(graph, "relu", (product,))
    fused, report = check_rewrite(graph, "matmul_epilogue")
    assert ops(fused).count("matmul") == 1 and "fused_matmul" not in ops(fused)
    assert fused[fused.outputs["product"]].op == "matmul"


@PROPERTY
@given(mkn=st.tuples(dims, dims, dims), seed=seeds)
def test_backward_relu_mask_joins_the_dx_matmul(mkn, seed):
    m, k, n = mkn
    graph = Graph()
    g, w, h = leaf(graph, "g", (m, n)), leaf(graph, "w", (k, n)), leaf(graph, "h", (m, k))
    mask = node(graph, "greater", (h, node(graph, "const", value=0.0)))
    graph.outputs["dx"] = node(graph, "mul", (matmul(graph, g, w, transpose_b=True), mask))
    fused, _ = check_rewrite(graph, "matmul_epilogue", seed)
    (kernel,) = live_nodes(fused, "fused_matmul")
    assert kernel.attr("epilogue") == "mul($acc,greater($0,0.0))" and kernels(fused) == 1


@PROPERTY
@given(mn=st.tuples(dims, dims), lr=st.floats(0.001, 1.0), wd=st.sampled_from([0.0, 0.01]), seed=seeds)
def test_sgd_update_of_a_weight_gradient_is_the_matmul_epilogue(mn, lr, wd, seed):
    m, n = mn
    graph = Graph()
    p, x, g = leaf(graph, "p", (m, n), "param"), leaf(graph, "x", (3, m)), leaf(graph, "g", (3, n))
    graph.updates["p"] = node(graph, "sgd_step", (p, matmul(graph, x, g, transpose_a=True)), lr=lr, weight_decay=wd)
    fused, report = check_rewrite(graph, "matmul_epilogue", seed)
    (kernel,) = live_nodes(fused, "fused_matmul")
    assert kernels(fused) == 1 and parse(kernel.attr("epilogue"))[0] == "sub"
    assert report.rule("matmul_substitute").matches > 0


def test_epilogue_of_both_operands_of_a_binary_op_reading_the_product():
    graph = Graph()
    a, b = operands(graph, (), 3, 4, 5, False, False)
    product = matmul(graph, a, b)
    graph.outputs["y"] = node(graph, "mul", (product, node(graph, "sigmoid", (product,))))
    fused, _ = check_rewrite(graph, "matmul_epilogue")
    (kernel,) = live_nodes(fused, "fused_matmul")
    assert kernel.attr("epilogue") == "silu($acc)" and kernels(fused) == 1
