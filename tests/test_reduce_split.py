"""Two-level reductions and split-K weight gradients: `fused_reduce` with `splits` (partials
[S, *out] over ragged parts of the reduction), the rules that split a reduction (`split_reduce`)
and a convolution's weight gradient (`conv_split_k`) where the target has units to fill, and the
kernels, against the numpy interpreter at sizes that are not multiples of the split or the tile.

The suite runs on lavapipe (two CPU threads): the plans that split are made for GPU-like targets
with many units (`MANY`), and their kernels run on lavapipe all the same."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, emit, leaf, live_nodes, node, one_op, typed_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen.reduce import reduce_splits, reduce_workgroups
from meganeura.codegen.registry import dispatch_counted, node_workgroups
from meganeura.compiler import Program, compile_plan
from meganeura.ir.graph import Graph
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError, infer_type, op_def
from meganeura.ir.ops.reduce import split_length
from meganeura.passes import compile_step
from meganeura.rewrite import optimize
from meganeura.target import GENERIC, Target, target_for

MANY = Target("GPU-like", compute_units=256, max_storage_buffers=31)
ONE = Target("one unit", compute_units=1, max_storage_buffers=31)
H200 = target_for("NVIDIA H200", "DiscreteGPU", {})
RNG = np.random.default_rng(7)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


def fused_reduce_graph(shape, axes, kind="sum", keepdim=False, splits=1, prologue="$0", epilogue="$r", second=None):
    """out = fused_reduce(x0 [, x1]) over `axes` in `splits` parts."""
    graph = Graph()
    inputs = [typed_leaf(graph, "input", "x0", shape)]
    if second is not None:
        inputs.append(typed_leaf(graph, "input", "x1", second))
    attrs = dict(kind=kind, axes=axes, keepdim=keepdim, in_shape=shape, prologue=prologue, epilogue=epilogue)
    graph.outputs["out"] = emit(graph, "fused_reduce", inputs, **attrs, splits=splits)
    return graph


def parts_by_hand(x: np.ndarray, axes, splits: int, kind: str) -> np.ndarray:
    """The partials of a split reduction, from loops over the flattened reduced elements."""
    kept = [d for d in range(x.ndim) if d not in axes]
    rows = np.transpose(x, (*kept, *axes)).reshape(math.prod(x.shape[d] for d in kept), -1)
    length = split_length(rows.shape[1], splits)
    reduce = np.sum if kind == "sum" else np.max
    parts = [reduce(rows[:, s * length : (s + 1) * length], axis=1) for s in range(splits)]
    return np.stack(parts).reshape(splits, *(x.shape[d] for d in kept))


# -- the op: shapes and numpy semantics --------------------------------------------------------------


SEMANTICS = [  # shape, axes, splits: R = the reduced elements, never a multiple of the split
    ((5, 7, 3), (0, 2), 4),  # R = 15: parts of 4, the last of 3
    ((37,), (0,), 6),  # a full reduction to a scalar, R = 37: parts of 7, the last of 2
    ((3, 11, 2, 5), (0, 2, 3), 8),  # batch-norm statistics [N, C, H, W] → [C], R = 30 in parts of 4
    ((13, 9), (0,), 5),  # a column sum (bias gradient), R = 13
]


@pytest.mark.parametrize("kind", ["sum", "max"])
@pytest.mark.parametrize("shape, axes, splits", SEMANTICS)
def test_split_partials_combine_to_the_reduction(shape, axes, splits, kind):
    x = RNG.normal(size=shape)
    graph = fused_reduce_graph(shape, axes, kind, splits=splits)
    (partials,) = interpret(graph, {"x0": x}, dtype=np.float64).outputs.values()
    plain = np.sum(x, axis=axes) if kind == "sum" else np.max(x, axis=axes)
    assert partials.shape == (splits, *plain.shape)
    np.testing.assert_allclose(partials, parts_by_hand(x, axes, splits, kind), rtol=1e-12)
    combined = partials.sum(axis=0) if kind == "sum" else partials.max(axis=0)
    np.testing.assert_allclose(combined, plain, rtol=1e-12)


def test_split_partials_keep_dims():
    graph = fused_reduce_graph((4, 6, 5), (0, 2), keepdim=True, splits=3)
    assert graph[graph.outputs["out"]].shape == (3, 1, 6, 1)


def test_a_split_that_leaves_a_part_empty_is_refused():
    """R = 10 in 6 parts of 2 covers it with 5: the sixth would be empty (a max of nothing)."""
    attrs = dict(kind="max", axes=(0,), keepdim=False, in_shape=(10,), prologue="$0", epilogue="$r")
    with pytest.raises(ShapeError, match="leave the last part empty"):
        infer_type("fused_reduce", [mn.f32[10].type], {**attrs, "splits": 6})
    with pytest.raises(ShapeError, match="positive int"):
        infer_type("fused_reduce", [mn.f32[10].type], {**attrs, "splits": 0})
    assert infer_type("fused_reduce", [mn.f32[10].type], {**attrs, "splits": 5}).shape == (5,)


# -- the kernels against the interpreter ----------------------------------------------------------------


KERNELS = [  # shape, axes, splits, entry point the partials take
    ((37, 1500), (1,), 7, "reduce_tree"),  # long rows: a workgroup per partial
    ((3, 5, 19, 23), (0, 2, 3), 5, "reduce_tree"),  # batch-norm statistics, R = 1311 in parts of 263
    ((3001,), (0,), 9, "reduce_tree"),  # a scalar
    ((200, 1100), (0,), 13, "reduce_serial"),  # a column sum over many outputs: a thread per partial
    ((70, 3, 30), (0, 2), 3, "reduce_tree"),
    ((90, 33), (0,), 4, "reduce_serial"),  # short parts: a thread per partial
    ((1000, 37), (0,), 3, "reduce_tree"),  # long parts of columns: a workgroup per partial on a GPU
]
CPU_KERNELS = [  # on a CPU: 16 partials of long columns a workgroup
    ((1000, 37), (0,), 3, "reduce_columns"),
    ((517, 3, 21), (0, 1), 5, "reduce_columns"),  # a workgroup's 16 partials straddle two parts
    ((200, 1100), (0,), 13, "reduce_serial"),
]
CPU = Target("cpu", 2, 32, cpu=True)


@pytest.mark.parametrize("kind", ["sum", "max"])
@pytest.mark.parametrize("shape, axes, splits, entry", KERNELS)
def test_split_kernel_matches_interpreter(shape, axes, splits, entry, kind):
    check_split_kernel(shape, axes, splits, entry, kind, GENERIC)


@pytest.mark.parametrize("kind", ["sum", "max"])
@pytest.mark.parametrize("shape, axes, splits, entry", CPU_KERNELS)
def test_split_kernel_for_a_cpu_matches_interpreter(shape, axes, splits, entry, kind):
    check_split_kernel(shape, axes, splits, entry, kind, CPU)


def check_split_kernel(shape, axes, splits: int, entry: str, kind: str, target: Target) -> None:
    graph = fused_reduce_graph(shape, axes, kind, splits=splits, prologue="mul($0,$0)", epilogue="mul($r,0.5)")
    (spec,) = compile_step(graph, target).kernels
    assert spec.entry_point == entry and f"in {splits} parts" in spec.label
    assert math.prod(spec.grid) == node_workgroups(graph, graph[graph.outputs["out"]], target)
    check(graph, {"x0": normal(*shape)}, rtol=1e-4, atol=1e-4, target=target)


@pytest.mark.parametrize("kind", ["sum", "max"])
@pytest.mark.parametrize(
    "shape, axes, items",
    [
        ((2, 37, 29), (0,), 4),  # a split's partials: 1073 outputs, not a multiple of 64 · 4
        ((4, 3, 5, 7), (0, 1), 1),  # 12 elements a part: one a thread
        ((3, 300), (0,), 4),
        ((5, 41, 3), (2,), 1),  # the innermost dim: a workgroup per output on a GPU (reduce_tree) or…
        ((41, 3, 5), (1,), 1),  # …a short part that is not along the leading dims: one a thread
    ],
)
def test_short_leading_parts_take_several_items_a_thread(shape, axes, items, kind):
    """reduce_serial computes `serial_items` outputs a thread where each part is at most four
    elements over the leading dims (the combine of a split's partials), at ragged output counts;
    the grid is what the cost model counts."""
    graph = one_op(kind, [shape], axes=axes, keepdim=False)
    executable = check(graph, {"x0": normal(*shape)}, rtol=1e-5, atol=1e-5)
    (spec,) = executable.kernels
    if spec.entry_point == "reduce_serial":
        assert (f", {items} items a thread" in spec.label) == (items > 1)
    else:
        assert items == 1
    assert math.prod(spec.grid) == node_workgroups(graph, graph[graph.outputs["out"]], GENERIC)


def test_split_kernel_reads_a_broadcast_operand_in_its_prologue():
    """A batch-norm gradient statistic: Σ g·(x − mean) over (N, H, W), mean [1, C, 1, 1] broadcast."""
    shape = (3, 6, 17, 13)
    graph = Graph()
    x, mean = typed_leaf(graph, "input", "x", shape), typed_leaf(graph, "input", "mean", (1, 6, 1, 1))
    attrs = dict(kind="sum", axes=(0, 2, 3), keepdim=True, in_shape=shape, prologue="mul($0,sub($0,$1))")
    graph.outputs["out"] = emit(graph, "fused_reduce", [x, mean], **attrs, epilogue="$r", splits=4)
    check(graph, {"x": normal(*shape), "mean": normal(1, 6, 1, 1)}, rtol=1e-4, atol=1e-4)


def test_plain_reductions_are_unchanged_by_the_split_parameters():
    """splits = 1 is the reduction as it was: one workgroup per output or per 64 outputs."""
    graph = one_op("sum", [(130, 70)], axes=(0,), keepdim=False)
    check(graph, {"x0": normal(130, 70)}, rtol=1e-4, atol=1e-4)
    attrs = {"axes": (0, 2, 3)}
    assert reduce_workgroups(attrs, [mn.f32[128, 64, 32, 32].type], ()) == 64


# -- how far a target splits ------------------------------------------------------------------------


def test_the_split_fills_the_units_and_leaves_no_part_empty():
    """Batch-norm statistics of ResNet-18's first stage, a 28M-element sum and a bias gradient on
    the H200 (132 units): few outputs, so split into parts enough for 4 workgroups a unit; on one
    unit nothing is split, nor where the outputs fill the units already, unless their workgroups
    would walk down columns: a bias gradient over 2048 rows splits into parts of SERIAL_PART rows,
    a thread a partial, on any GPU."""
    cases = {  # (shape, axes): (splits on the H200, workgroups of the partials)
        ((128, 64, 32, 32), (0, 2, 3)): (9, 576),
        ((28 * 2**20,), (0,)): (528, 528),
        ((2048, 1536), (0,)): (32, 768),  # 32 · 1536 partials of 64 rows, 64 threads a workgroup
        ((8, 256, 576), (0, 1)): (32, 288),  # an RMSNorm weight's gradient
        ((2048, 5), (0,)): (2, 10),  # few columns: parts of a workgroup are 1024 rows at least
    }
    for (shape, axes), (splits, workgroups) in cases.items():
        assert reduce_splits(shape, axes, H200) == splits, shape
        partials = {"axes": axes, "in_shape": shape, "splits": splits}
        assert reduce_workgroups(partials, [], ()) == workgroups
        r = math.prod(shape[d] for d in axes)
        assert (splits - 1) * split_length(r, splits) < r
        walks_columns = shape in ((2048, 1536), (8, 256, 576), (2048, 5))  # one unit is filled: split for sectors
        assert reduce_splits(shape, axes, ONE) == (32 if walks_columns else 1)
    assert reduce_splits((128, 512, 4, 4), (0, 2, 3), H200) == 1  # 512 outputs: 512 workgroups
    assert reduce_splits((40, 3), (0,), H200) == 1  # too short to pay for a second level
    assert reduce_splits((1536, 2048), (1,), H200) == 1  # along rows: a workgroup reads a row
    assert reduce_splits((2048, 1536), (0,), CPU) == 1  # lavapipe's column sums read rows of 16 columns


# -- the rewrite: chosen by the cost model, fused like the reduction it splits --------------------------


def statistics_graph(shape=(16, 3, 40, 40)) -> Graph:
    """The forward statistics of a batch norm: mean and mean of squares over (N, H, W), and a sum
    to a scalar of a product (a loss), each reduction reading an elementwise expression."""
    graph = Graph()
    x, y = leaf(graph, "x", shape), leaf(graph, "y", shape)
    n = shape[0] * shape[2] * shape[3]
    total = node(graph, "sum", (x,), axes=(0, 2, 3), keepdim=True)
    scale = node(graph, "const", value=1.0 / n)
    graph.outputs["mean"] = node(graph, "mul", (total, scale))
    squares = node(graph, "sum", (node(graph, "mul", (x, x)),), axes=(0, 2, 3), keepdim=True)
    graph.outputs["mean_sq"] = node(graph, "mul", (squares, scale))
    graph.outputs["loss"] = node(graph, "sum", (node(graph, "mul", (x, y)),), axes=(0, 1, 2, 3), keepdim=False)
    return graph


def test_split_reduce_is_chosen_where_units_are_idle_and_keeps_the_prologue_fused():
    graph = statistics_graph()
    fused, report = optimize(graph, target=MANY)
    partials = [n for n in live_nodes(fused, "fused_reduce") if n.attr("splits") > 1]
    assert len(partials) == 3 and report.rule("split_reduce").uses > 0
    assert {n.attr("prologue") for n in partials} == {"$0", "mul($0,$0)", "mul($0,$1)"}  # no x² kernel
    assert {fused[i].op for n in partials for i in n.inputs} == {"input"}
    combines = [n for n in fused if n.id in fused.live_ids() and any(fused[i] in partials for i in n.inputs)]
    assert len(combines) == 3 and all(n.attr("axes") == (0,) for n in combines)
    assert {n.attr("epilogue", "$r") for n in combines} == {"$r", f"mul($r,{1 / 25600!r})"}  # means' 1/n folded
    inputs = {"x": normal(16, 3, 40, 40), "y": normal(16, 3, 40, 40)}
    expected = interpret(graph, inputs, dtype=np.float64).outputs
    for name, value in interpret(fused, inputs, dtype=np.float64).outputs.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-10)
    check(fused, inputs, rtol=1e-4, atol=1e-4, target=MANY)  # the plan's kernels, on lavapipe
    for spec in compile_step(fused, MANY).kernels:
        assert math.prod(spec.grid) == node_workgroups(fused, fused[spec.node], MANY), spec.label


def test_a_column_walk_is_priced_by_the_sectors_it_fetches_and_split_into_rows_of_threads():
    """A bias gradient Σ over 2048 rows of [2048, 300] on a GPU of 256 units: 300 outputs fill the
    units, but reduce_tree would walk each column a workgroup an output, fetching a 32-byte sector
    per float (read scale 8, codegen/reduce.py `reduce_read_scale`); the plan splits it into parts
    of 64 rows that reduce_serial sums a thread a partial, neighbouring threads in neighbouring
    columns (scale 1), and the result is the interpreter's. A sum along rows keeps scale 1 and one
    level, as does every reduction on a CPU."""
    from meganeura.codegen.lower import read_scale

    column = {"axes": (0,), "in_shape": (2048, 300)}
    assert read_scale("sum", column, [mn.f32[2048, 300].type], (mn.f32[300].type,), MANY) == 8
    assert read_scale("fused_reduce", {**column, "splits": 32}, [], (), MANY) == 1
    narrow = {"axes": (0,), "in_shape": (2048, 3)}
    assert read_scale("fused_reduce", narrow, [], (), MANY) == 3  # rows 12 bytes apart: a warp fetches 3× what it uses
    assert read_scale("fused_reduce", {"axes": (1,), "in_shape": (300, 2048)}, [], (), MANY) == 1
    assert read_scale("fused_reduce", column, [], (), CPU) == 1
    graph = one_op("sum", [(2048, 300)], axes=(0,), keepdim=False)
    fused, report = optimize(graph, target=MANY)
    (partial,) = live_nodes(fused, "fused_reduce")
    assert partial.attr("splits") == 32 and report.rule("split_reduce").uses > 0
    kernels = check(fused, {"x0": normal(2048, 300)}, rtol=1e-4, atol=1e-4, target=MANY).kernels
    assert [k.entry_point for k in kernels] == ["reduce_serial", "reduce_serial"]
    rows, _ = optimize(one_op("sum", [(300, 2048)], axes=(1,), keepdim=False), target=MANY)
    assert all(n.attr("splits", 1) == 1 for n in live_nodes(rows, "fused_reduce"))


def test_nothing_is_split_on_one_unit_or_for_small_reductions():
    graph = statistics_graph()
    fused, _ = optimize(graph, target=ONE)
    assert all(n.attr("splits") == 1 for n in live_nodes(fused, "fused_reduce"))
    small, _ = optimize(statistics_graph((2, 3, 5, 5)), target=MANY)  # a kernel's launch outweighs the fill
    assert all(n.attr("splits") == 1 for n in live_nodes(small, "fused_reduce"))


def test_an_optimized_split_graph_optimizes_again():
    """A fused_reduce with splits encodes as its kernel form (ReduceSplit) and decodes back."""
    fused, _ = optimize(statistics_graph(), target=MANY)
    again, _ = optimize(fused, target=MANY)
    assert sorted(n.attr("splits") for n in live_nodes(again, "fused_reduce")) == sorted(
        n.attr("splits") for n in live_nodes(fused, "fused_reduce")
    )


# -- a training step: batch norm and convolution weight gradients split, forward and backward ------------


class ConvBlock(nn.Module):
    """conv → batch norm → relu → conv → global average → linear: batch-norm statistics and their
    gradients (column reductions), bias gradients, and two weight gradients with long reductions."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 5, 3, padding=1)
        self.bn = nn.BatchNorm2d(5)
        self.conv2 = nn.Conv2d(5, 6, 3, stride=2, padding=1)
        self.fc = nn.Linear(6, 4)

    def forward(self, x):
        x = F.relu(self.bn(self.conv1(x)))
        return self.fc(F.adaptive_avg_pool2d(self.conv2(x), 1).flatten(1))


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def test_a_training_step_with_split_reductions_follows_the_interpreter():
    """Batch 10 of 3×30×30 images on a target of 256 units: the weight gradients run split-K (parts
    that are not whole images) and the batch-norm statistics in two levels; three steps on lavapipe
    follow the interpreter (losses and updates)."""
    mn.manual_seed(0)
    spec = {"x": mn.f32[10, 3, 30, 30], "y": mn.i32[10]}
    compilation = compile_plan(ConvBlock(), loss_fn, spec, optim.SGD(lr=0.05, momentum=0.9), target=MANY)
    fused = compilation.fused_graph
    weight_gradients = [n for n in live_nodes(fused, "conv_gemm") if n.attr("mode") == "grad_weight"]
    assert any(n.attr("chunks") not in (1, 10) for n in weight_gradients), [n.attr("chunks") for n in weight_gradients]
    assert any(n.attr("splits") > 1 for n in live_nodes(fused, "fused_reduce"))
    compiled = compilation.compiled.graph  # the optimizer's updates grouped into multi-tensor nodes
    for spec_ in compilation.compiled.kernels:
        dispatched = dispatch_counted(compiled, compiled[spec_.node], math.prod(spec_.grid), MANY)
        assert dispatched == node_workgroups(compiled, compiled[spec_.node], MANY), spec_.label
    program = Program(compilation)
    feeds = [{"x": normal(10, 3, 30, 30), "y": RNG.integers(0, 4, 10).astype(np.int32)} for _ in range(3)]
    assert_steps_follow_interpreter(program, feeds)


def test_conv_split_k_partials_are_a_ragged_split_of_the_batch():
    """conv_gemm grad_weight with chunks S: the reduction N·L in parts of ⌈N·L/S⌉, equal to the sum
    over the batch in the interpreter (the kernel tests are in test_conv_gemm.py)."""
    graph = Graph()
    g, x = typed_leaf(graph, "input", "g", (3, 4, 25)), typed_leaf(graph, "input", "x", (3, 2, 5, 5))
    attrs = dict(mode="grad_weight", kernel=(3, 3), stride=(1, 1), padding=(1, 1), image=(5, 5))
    whole = emit(graph, "conv_gemm", [g, x], **attrs)
    split = emit(graph, "conv_gemm", [g, x], **attrs, chunks=4)  # 75 in parts of 19: images cut apart
    graph.outputs["whole"], graph.outputs["split"] = whole, split
    values = {"g": RNG.normal(size=(3, 4, 25)), "x": RNG.normal(size=(3, 2, 5, 5))}
    out = interpret(graph, values, dtype=np.float64).outputs
    assert out["split"].shape == (4, 4, 18)
    np.testing.assert_allclose(out["split"].sum(axis=0), out["whole"], rtol=1e-12)
    columns = op_def("unfold").evaluate(values["x"], kernel=(3, 3), stride=(1, 1), padding=(1, 1))
    first = np.einsum("ol,kl->ok", values["g"][0, :, :19], columns[0, :, :19])
    np.testing.assert_allclose(out["split"][0], first, rtol=1e-12)


def test_an_mlp_step_whose_split_products_sum_with_bias_and_relu_follows_the_interpreter():
    """On a target of 256 units the MLP's products over K = 512 split along K, and the sum of their
    partials takes the bias and the relu (or the relu mask of the backward) in its epilogue
    (rewrite/reductions.py `reduce_epilogue_tensor`): no pointwise kernel after the sum. Three
    steps on lavapipe follow the interpreter."""
    from conftest import MLP, ce_loss

    mn.manual_seed(0)
    spec = {"x": mn.f32[64, 512], "y": mn.i32[64]}
    compilation = compile_plan(MLP(512, 512, 10), ce_loss, spec, optim.Adam(lr=1e-3), target=MANY)
    fused = compilation.fused_graph
    sums = [n for n in live_nodes(fused, "fused_reduce") if "$1" in n.attr("epilogue")]
    assert any(n.attr("epilogue") == "relu(add($r,$1))" for n in sums), [n.attr("epilogue") for n in sums]
    assert any(fused[n.inputs[0]].attr("splits", 1) > 1 for n in sums)  # the partials of a split product
    feeds = [{"x": normal(64, 512), "y": RNG.integers(0, 10, 64).astype(np.int32)} for _ in range(3)]
    assert_steps_follow_interpreter(Program(compilation), feeds)
