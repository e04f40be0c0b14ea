"""The matmul family: matmul kernels absorb elementwise consumers of their shape into the epilogue
(bias + activation forward, masks and updates backward). Random shapes and values keep what the
graph computes; the guard (no enlarging operand) and the cost (no recomputed matmul) hold."""

from __future__ import annotations

import pytest
from conftest import (
    PROPERTY,
    check_rewrite,
    const,
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
from hypothesis import given
from hypothesis import strategies as st

from meganeura.codegen.gemm_table import GemmTiling
from meganeura.codegen.matmul import MAX_SPLITS, fine_splits, matmul_splits, split_tiling
from meganeura.ir.expr import parse
from meganeura.ir.graph import Graph
from meganeura.rewrite import matmul as matmul_family
from meganeura.target import Target

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
@given(mn=st.tuples(dims, dims), no_decay=st.booleans(), seed=seeds)
def test_sgd_update_of_a_weight_gradient_is_the_matmul_epilogue(mn, no_decay, seed):
    m, n = mn
    graph = Graph()
    p, x, g = leaf(graph, "p", (m, n), "param"), leaf(graph, "x", (3, m)), leaf(graph, "g", (3, n))
    # lr a run-time scalar leaf; wd one too, or the constant 0 (SGD momentum's sgd_step)
    lr = leaf(graph, "lr", (), "state")
    wd = node(graph, "const", value=0.0) if no_decay else leaf(graph, "wd", (), "state")
    graph.updates["p"] = node(graph, "sgd_step", (p, matmul(graph, x, g, transpose_a=True), lr, wd))
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


# -- matmul_prologue: an elementwise producer of A computed while A is loaded -------------------


def producer_of_a(graph: Graph, x: int, batch: tuple[int, ...], kind: str) -> int:
    """An elementwise value of x's shape (A's stored shape) that reads x."""
    rows, cols = graph[x].shape[-2:]
    if kind == "rms":  # x · r · w: a per-row scale and a per-column weight, as RMSNorm gives
        scaled = node(graph, "mul", (x, leaf(graph, "r", (*batch, rows, 1))))
        return node(graph, "mul", (scaled, leaf(graph, "w", (cols,))))
    if kind == "full":  # another tensor of A's shape
        return node(graph, "sub", (x, leaf(graph, "other", graph[x].shape)))
    if kind == "literal":
        return node(graph, "mul", (x, const(graph, 0.5)))
    return node(graph, kind, (x,))


@pytest.mark.parametrize("kind", ["rms", "full", "literal", "exp", "silu"])
@PROPERTY
@given(batch=batches, mkn=st.tuples(dims, dims, dims), flag=flags, bias=st.booleans(), seed=seeds)
def test_matmul_prologue(kind, batch, mkn, flag, bias, seed):
    graph = Graph()
    x, b = operands(graph, batch, *mkn, *flag)
    value = matmul(graph, producer_of_a(graph, x, batch, kind), b, *flag)
    if bias:
        value = node(graph, "add", (value, leaf(graph, "bias", (mkn[2],))))
    graph.outputs["y"] = value
    fused, report = check_rewrite(graph, "matmul_prologue", seed)
    (kernel,) = live_nodes(fused, "fused_matmul")
    assert kernels(fused) == 1 and report.rule("matmul_prologue").uses == 1
    assert kernel.inputs[0] == x and kernel.attr("prologue") not in (None, "$a")  # A is never written
    assert kernel.attr("transpose_a") is flag[0] and kernel.attr("transpose_b") is flag[1]
    assert (kernel.attr("epilogue") != "$acc") is bias


def test_prologue_needs_a_load_of_the_full_shape_of_a():
    # An outer product [4,1]·[3] has A's shape but reads no tensor of it: nothing can be `$a`.
    graph = Graph()
    column, row, b = leaf(graph, "column", (4, 1)), leaf(graph, "row", (3,)), leaf(graph, "b", (3, 5))
    graph.outputs["y"] = matmul(graph, node(graph, "mul", (column, row)), b)
    fused, report = check_rewrite(graph, "matmul_prologue")
    assert report.rule("matmul_prologue").uses == 0 and ops(fused).count("mul") == 1


def test_a_reshape_that_is_not_a_row_flattening_blocks_the_prologue():
    # exp(x) [2,3,4] reshaped to [4,6]: not the rows of x, so neither prologue rule applies.
    graph = Graph()
    x, b = leaf(graph, "x", (2, 3, 4)), leaf(graph, "b", (6, 5))
    mixed = node(graph, "reshape", (node(graph, "exp", (x,)),), shape=(4, 6))
    graph.outputs["y"] = matmul(graph, mixed, b)
    fused, report = check_rewrite(graph)
    assert report.rule("matmul_prologue").matches == 0 and report.rule("matmul_prologue_rows").matches == 0
    assert ops(fused).count("exp") == 1


@PROPERTY
@given(lead=st.tuples(dims, dims), k=dims, outs=st.lists(dims, min_size=1, max_size=3), seed=seeds)
def test_a_prologue_through_the_rows_of_a_linear(lead, k, outs, seed):
    """RMSNorm → Linear on [batch, seq, features]: the norm x·r·w, flattened to rows for the
    matmuls, becomes each matmul's prologue (`flatten_a`) once every reader recomputes it."""
    graph = Graph()
    x = leaf(graph, "x", (*lead, k))
    scaled = node(graph, "mul", (x, leaf(graph, "r", (*lead, 1))))
    normed = node(graph, "mul", (scaled, leaf(graph, "w", (k,))))
    rows = node(graph, "reshape", (normed,), shape=(lead[0] * lead[1], k))
    for index, n in enumerate(outs):
        graph.outputs[f"y{index}"] = matmul(graph, rows, leaf(graph, f"weight{index}", (n, k)), transpose_b=True)
    fused, report = check_rewrite(graph, "matmul_prologue_rows", seed)
    assert report.rule("matmul_prologue_rows").uses == len(outs)
    prologues = live_nodes(fused, "fused_matmul")
    assert len(prologues) == len(outs) and all(n.attr("flatten_a") for n in prologues)
    assert fused[prologues[0].inputs[0]].shape == (*lead, k)  # reads x itself, not its rows
    assert not live_nodes(fused, "mul") and not live_nodes(fused, "pointwise")  # the norm is never written


def test_a_that_is_also_an_output_is_stored_and_read():
    graph = Graph()
    x, b = operands(graph, (), 6, 7, 5, False, False)
    a = producer_of_a(graph, x, (), "rms")
    graph.outputs["a"] = a
    graph.outputs["y"] = matmul(graph, a, b)
    fused, report = check_rewrite(graph, "matmul_prologue")
    assert report.rule("matmul_prologue").uses == 0
    assert fused[fused.outputs["y"]].op == "matmul" and fused[fused.outputs["y"]].inputs[0] == fused.outputs["a"]


@pytest.mark.parametrize("mkn, recomputed", [((64, 32, 16), True), ((128, 64, 64), False)], ids=str)
def test_prologue_rule_never_makes_the_plan_costlier(monkeypatch, mkn, recomputed):
    # A = x·c + y·s (rotary-like) is read by y = A·Wᵀ and, as autodiff writes it, by dW = (Aᵀ·g)ᵀ.
    # Recomputing A in both matmuls' prologues costs a permute of dW; storing A lets dW = gᵀ·A read it.
    # Which wins depends on the sizes; reaching the stored plan from the recomputed one takes the
    # extractor's compound move (A back to stored, and dW switched to read it), not single switches.
    m, k, n = mkn
    graph = Graph()
    x, y, c, s = leaf(graph, "x", (m, k)), leaf(graph, "y", (m, k)), leaf(graph, "c", (k,)), leaf(graph, "s", (k,))
    w, g = leaf(graph, "w", (n, k)), leaf(graph, "g", (m, n))
    a = node(graph, "add", (node(graph, "mul", (x, c)), node(graph, "mul", (y, s))))
    graph.outputs["y"] = matmul(graph, a, w, transpose_b=True)
    graph.outputs["dw"] = node(graph, "permute", (matmul(graph, a, g, transpose_a=True),), perm=(1, 0))
    fused, report = check_rewrite(graph, "matmul_prologue")
    assert (report.rule("matmul_prologue").uses == 2) is recomputed
    assert ("permute" in ops(fused)) is recomputed and kernels(fused) == 3
    monkeypatch.setattr(matmul_family, "RULES", [r for r in matmul_family.RULES if r.name != "matmul_prologue"])
    _, without = check_rewrite(graph)
    assert report.cost_after.units <= without.cost_after.units
    assert (report.cost_after.units < without.cost_after.units) is recomputed


def residual_stack(depth: int, width: int = 8) -> Graph:
    """The gradient stream of `depth` residual blocks: g_i = g_{i+1} + (h_i ⊙ g_{i+1})·W_iᵀ, with
    the input gradient and every weight gradient outputs."""
    graph = Graph()
    g = leaf(graph, "g", (4, width))
    for i in range(depth):
        h, w = leaf(graph, f"h{i}", (4, width)), leaf(graph, f"w{i}", (width, width), "param")
        masked = node(graph, "mul", (g, node(graph, "greater", (h, const(graph, 0.0)))))
        graph.outputs[f"dw{i}"] = matmul(graph, masked, h, transpose_a=True)
        g = node(graph, "add", (g, matmul(graph, masked, w, transpose_b=True)))
    graph.outputs["dx"] = g
    return graph


def test_residual_streams_keep_the_egraph_linear_in_depth():
    # A body class holds its producers inlined down the chain, so the gradient of a residual
    # stream could mention every matmul upstream; the epilogue rules reach only plain matmul
    # kernels, MENTION_DEPTH calls deep, so each block adds the same number of e-nodes.
    sizes = []
    for depth in (8, 16, 32):
        fused, report = check_rewrite(residual_stack(depth), "matmul_epilogue")
        sizes.append(report.enodes)
        assert len(live_nodes(fused, "fused_matmul")) >= depth  # each dX matmul absorbs the residual add
    assert sizes[2] - sizes[1] == 2 * (sizes[1] - sizes[0]), sizes


# -- matmul_split_k ----------------------------------------------------------------------------

HOPPER = Target("NVIDIA H200", 132, 31, tuning="hopper")


def test_split_k_counts_for_the_lm_weight_gradients_on_the_h200():
    """How many parts `matmul_splits` cuts the SmolLM2 step's products into on the H200: the
    weight gradients over 2048 tokens (A transposed) with outputs of 45 tiles or fewer; an output
    that fills the units, a short K, or a CPU: none."""
    assert matmul_splits(576, 192, 2048, 1, HOPPER, False, True) == 8
    assert matmul_splits(576, 576, 2048, 1, HOPPER, False, True) == 6
    assert matmul_splits(4096, 4096, 4096, 1, HOPPER) == 1
    assert matmul_splits(576, 192, 384, 1, HOPPER) == 1  # K below 2 · MIN_SPLIT_K
    assert matmul_splits(576, 192, 2048, 1, Target("lavapipe", 2, 32, cpu=True)) == 1
    assert all(matmul_splits(64, 64, k, 1, HOPPER) in range(1, MAX_SPLITS + 1) for k in (512, 700, 4099, 10**6))


H200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152)


@pytest.mark.parametrize(
    "m, n, k, transpose_b, transpose_a, splits, tiling",
    [
        # bench gemm's 2048×576×1536 G·Bᵀ, 2048×1536×576 A·B and the tied head's G·Bᵀ: fine splits
        (2048, 576, 1536, True, False, 8, GemmTiling(64, 64, 16, 2, 2, prefetch=True)),
        (2048, 576, 1536, False, False, 8, GemmTiling(64, 64, 16, 2, 2, prefetch=True)),
        (2048, 576, 49152, True, False, 8, GemmTiling(64, 64, 16, 2, 2, prefetch=True)),
        # GPT-2's 2048×768 outputs: 192 tiles of 64x128 (1.45 a unit): the coarse split
        (2048, 768, 3072, False, False, 2, GemmTiling(64, 128, 16, 2, 2, prefetch=True)),
        (2048, 768, 3072, True, False, 3, GemmTiling(128, 128, 16, 2, 2, checked=True)),
        (2048, 768, 50257, True, False, 3, GemmTiling(128, 128, 16, 2, 2, checked=True)),
        # the weight gradients (A transposed): the split by the largest tile, on the split ladder's tiles
        (576, 1536, 2048, False, True, 3, GemmTiling(64, 64, 16, 2, 2, prefetch=True)),
        (1536, 576, 2048, False, True, 3, GemmTiling(64, 64, 16, 2, 2, prefetch=True)),
        (576, 576, 2048, False, True, 6, GemmTiling(64, 64, 16, 2, 2, prefetch=True)),
        # SmolLM2's q and o projections and their input gradients, K = 576: 4 fine parts of 144
        (2048, 576, 576, False, False, 4, GemmTiling(64, 64, 16, 2, 2, prefetch=True)),
        (2048, 576, 576, True, False, 4, GemmTiling(64, 64, 16, 2, 2, prefetch=True)),
        # K = 784: no count of fine parts puts every boundary on a 16-multiple: the coarse split
        (2048, 576, 784, False, False, 2, GemmTiling(64, 128, 16, 2, 2, prefetch=True)),
        # a wide output: the split by the largest tile, on its tiles
        (2048, 1536, 576, True, False, 2, GemmTiling(128, 128, 16, 2, 2, checked=True)),
    ],
)
def test_fine_split_k_of_narrow_outputs_on_the_h200(m, n, k, transpose_b, transpose_a, splits, tiling):
    """On the H200 a product that splits, with A stored [M, K], K of at least 4 parts of 144 and an
    output of fewer than 1.25 largest tiles a unit, splits on the 64x64 tiles of the split ladder
    into parts enough for 16 workgroups a unit, each at least 144 long and every boundary on a
    16-multiple of K (measured:
    codegen/gemm_table.py HOPPER_SPLIT_TABLE, codegen/matmul.py); the others keep the split by
    the largest tile, the weight gradients (A transposed) on the split ladder's tiles."""
    assert matmul_splits(m, n, k, 1, H200, transpose_b, transpose_a) == splits
    assert split_tiling(m, n, k, 1, splits, H200, transpose_b, transpose_a) == tiling
    fine = fine_splits(m, n, k, 1, H200, transpose_a, transpose_b)
    assert fine == (splits if tiling.bm == tiling.bn == 64 and not transpose_a else 0)
    lavapipe = Target("lavapipe", 2, 32, cpu=True, workgroup_memory=32768)
    assert matmul_splits(m, n, k, 1, lavapipe, transpose_b, transpose_a) == 1
    assert fine_splits(m, n, k, 1, lavapipe, transpose_a, transpose_b) == 0
    assert fine_splits(m, n, k, 1, Target("some GPU", 132, 31), transpose_a, transpose_b) == 0  # no split ladder


def test_batched_products_take_the_batched_ladder_on_the_h200():
    """Attention's dQ products (SmolLM2's 8x3×768x256x64 Aᵀ, GPT-2's 8x12×256x256x64 Aᵀ) take the
    H200's ladder for batched products, 32x32 tiles (codegen/gemm_table.py HOPPER_BATCHED_TABLE);
    one matrix, a split product's parts (S matrices too), and a family without that ladder keep
    theirs."""
    batched = GemmTiling(32, 32, 16, 1, 1, prefetch=True)
    assert split_tiling(768, 64, 256, 24, 1, H200, False, True) == batched
    assert split_tiling(256, 64, 256, 96, 1, H200, False, True) == batched
    assert split_tiling(768, 64, 256, 1, 1, H200, False, True) == GemmTiling(32, 64, 16, 1, 1)
    assert split_tiling(576, 576, 2048, 1, 6, H200, False, True) == GemmTiling(64, 64, 16, 2, 2, prefetch=True)
    assert split_tiling(2048, 768, 3072, 1, 2, H200, False) == GemmTiling(64, 128, 16, 2, 2, prefetch=True)
    assert split_tiling(768, 64, 256, 24, 1, Target("some GPU", 132, 31, workgroup_memory=49152), False, True) == (
        GemmTiling(64, 64, 16, 2, 2)  # the generic ladder's 128x128 8x8 shrunk to N 64
    )


@PROPERTY
@given(k=st.sampled_from([4096, 6000, 8195]), seed=seeds, bias=st.booleans(), transposes=flags)
def test_matmul_split_k_splits_a_small_output_over_a_long_reduction(k, seed, bias, transposes):
    """A 64×48 product over K ≥ 4096 on the H200: one tile, 131 units idle. The plan computes it
    as the sum of `matmul_splits` partials along K (a split fused_matmul, then a sum over axis 0),
    with the same result; the bias add after it is not lost: the sum's epilogue adds it."""
    ta, tb = transposes
    graph = Graph()
    x, g = operands(graph, (), 64, k, 48, ta, tb)
    value = matmul(graph, x, g, ta, tb)
    if bias:
        value = node(graph, "add", (value, leaf(graph, "bias", (48,))))
    graph.outputs["y"] = value
    fused, report = check_rewrite(graph, "matmul_split_k", seed, positive=True, target=HOPPER)
    (split,) = live_nodes(fused, "fused_matmul")
    parts = matmul_splits(64, 48, k, 1, HOPPER, tb, ta)
    assert parts > 1 and split.attr("splits") == parts and split.shape == (parts, 64, 48)
    sums = live_nodes(fused, "fused_reduce" if bias else "sum")
    assert [(n.attr("axes"), fused[n.inputs[0]].op) for n in sums] == [((0,), "fused_matmul")]
    assert [n.attr("epilogue") for n in sums] == (["add($r,$1)"] if bias else [None])
    assert report.rule("matmul_split_k").uses == 2  # the plan's two nodes it made: the split and its sum


@PROPERTY
@given(seed=seeds, shape=st.sampled_from([(576, 2048, 1536), (576, 2048, 576), (64, 4096, 48)]))
def test_the_transpose_of_a_product_splits_as_its_own_product(seed, shape):
    """A Linear's weight gradient is traced as permute(xᵀ·g): the split fact is also made for the
    product in the permute's e-class, gᵀ·x, so the plan splits that one and needs no transpose of
    the sum (before, it split xᵀ·g and ran a permute kernel after the sum)."""
    m, k, n = shape
    graph = Graph()
    x, g = operands(graph, (), m, k, n, True, False)
    product = matmul(graph, x, g, True, False)
    graph.outputs["w"] = node(graph, "permute", (product,), perm=(1, 0))
    facts = matmul_family.target_facts(graph, list(range(len(graph.nodes))), HOPPER)
    parts = matmul_splits(n, m, k, 1, HOPPER, False, True)  # gᵀ·x: A (g) transposed, B (x) not
    assert f"(matmul_split (Ref {graph.outputs['w']}) {parts} " in " ".join(facts)
    fused, _ = check_rewrite(graph, "matmul_split_k", seed, positive=True, target=HOPPER)
    assert not live_nodes(fused, "permute")
    (split,) = live_nodes(fused, "fused_matmul")
    assert split.attr("splits") > 1 and split.shape[1:] == (n, m)


def test_no_split_where_the_target_has_no_fact():
    """On a CPU target (and for an output that fills the GPU) the rule never matches."""
    for target, (m, k, n) in ((Target("lavapipe", 2, 32, cpu=True), (64, 4096, 48)), (HOPPER, (2048, 1024, 2048))):
        graph = Graph()
        x, g = operands(graph, (), m, k, n, True, False)
        graph.outputs["y"] = matmul(graph, x, g, True, False)
        fused, report = check_rewrite(graph, positive=True, target=target)
        assert report.rule("matmul_split_k").matches == 0 and not any(n.attr("splits", 1) > 1 for n in fused.nodes)


def test_flop_scale_charges_a_transposed_or_scalar_b_on_a_gpu():
    """`matmul_flop_scale`: a GPU product whose B is stored transposed is charged 120% of its flops,
    one whose B cannot be loaded by vec4 130%; a CPU and a batched product 100%; the cost model's
    arithmetic term grows by that factor and nothing else does."""
    from meganeura.codegen.lower import flop_scale
    from meganeura.ir.graph import TensorType
    from meganeura.rewrite.cost import price

    def scale(m, k, n, tb=False, target=H200, batch=(), **attrs):
        a, b = TensorType((*batch, m, k)), TensorType((*batch, n, k) if tb else (*batch, k, n))
        return flop_scale("matmul", {"transpose_b": tb, **attrs}, [a, b], (TensorType((*batch, m, n)),), target)

    assert scale(2048, 768, 2304) == 100
    assert scale(2048, 768, 2304, tb=True) == 120
    assert scale(2048, 768, 50257) == 130  # B's rows of 50257 floats: no vec4 units
    assert scale(2048, 50257, 768, tb=True) == 130  # B's rows along K of 50257
    assert scale(2048, 1536, 576, tb=True, splits=8) == 120  # parts of 192: vec4 units still
    assert scale(2048, 1538, 576, tb=True, splits=2) == 130  # parts of 769: not
    assert scale(2048, 768, 2304, tb=True, target=Target("lavapipe", 2, 32, cpu=True)) == 100
    assert scale(256, 64, 256, tb=True, batch=(24,)) == 100
    a, b, out = TensorType((2048, 768)), TensorType((2304, 768)), (TensorType((2048, 2304)),)
    plain = price("matmul", {"transpose_b": False}, [a, TensorType((768, 2304))], out, 0, H200)
    transposed = price("matmul", {"transpose_b": True}, [a, b], out, 0, H200)
    assert transposed.flops == plain.flops == 2 * 2048 * 768 * 2304
    assert transposed.units - plain.units == plain.flops * 20 // 100  # both fill the H200


@pytest.mark.parametrize("n, transposes", [(2304, True), (50257, False)])
def test_a_weight_is_transposed_once_where_the_product_after_runs_faster(n, transposes):
    """y = x·Wᵀ with W [N, 768] on the H200, traced as F.linear traces it (x·permute(W)): the plan
    keeps the transpose (a permute kernel) and multiplies A·B, charged 100% of its flops against
    Bᵀ's 120%; with N = 50257 the A·B product would load B by element (130%), so the transpose folds
    into a Bᵀ product. On a CPU target it always folds."""
    graph = Graph()
    x, w = leaf(graph, "x", (2048, 768)), leaf(graph, "w", (n, 768), "param")
    graph.outputs["y"] = matmul(graph, x, node(graph, "permute", (w,), perm=(1, 0)))
    fused, _ = check_rewrite(graph, target=H200)
    products = [nd for nd in fused.nodes if nd.op in ("matmul", "fused_matmul")]
    assert len(products) == 1 and bool(products[0].attr("transpose_b")) is not transposes
    assert any(nd.op == "permute" for nd in fused.nodes) is transposes
    cpu, _ = optimize_for_cpu(graph)
    assert all(nd.attr("transpose_b") for nd in cpu.nodes if nd.op in ("matmul", "fused_matmul"))


def optimize_for_cpu(graph):
    from meganeura.rewrite import optimize

    return optimize(graph, target=Target("lavapipe", 2, 32, cpu=True, workgroup_memory=32768))
