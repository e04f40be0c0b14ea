"""Every WGSL kernel against the numpy interpreter, on one-op graphs run through an Executable on the
default adapter (lavapipe in CI): sizes that do not divide the tiles, every transpose, batched
matmuls, epilogue expressions with extras of every broadcast shape, every function of the
expression language, pointwise expressions, permutes, sum/max/fused reductions over several axis
sets, cross-entropy, softmax/log_softmax and their gradients along any axis, pick/scatter_rows,
and the optimizer updates."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from conftest import check, const, emit, normal, one_op, run_gpu, typed_leaf

from meganeura import nn
from meganeura.codegen import common, expressions
from meganeura.codegen import kernel as codegen_kernel
from meganeura.codegen import matmul as codegen_matmul
from meganeura.codegen import shape as codegen_shape
from meganeura.codegen.gemm_table import TABLES, GemmLadder, GemmTiling, gemm_tiling, shrunk
from meganeura.codegen.registry import LOWERINGS, node_workgroups
from meganeura.codegen.render import TemplateError, load_template, render
from meganeura.ir.expr import parse
from meganeura.ir.functions import BINARY_FUNCTIONS, FUNCTIONS, TERNARY_FUNCTIONS, UNARY_FUNCTIONS
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.op import OPS, ShapeError, infer_type, launches_kernel, op_def
from meganeura.ir.ops.matmul import part_length
from meganeura.ir.ops.optimizer import HYPER_FIELDS, hyper_offset, hyper_vector
from meganeura.passes import compile_step
from meganeura.runtime import Executable, default_device
from meganeura.target import GENERIC, WEBGPU_WORKGROUP_MEMORY, Target

RNG = np.random.default_rng(0)
CPU = Target("cpu", 2, 32, cpu=True)  # lavapipe's kind of target: its own reduction entry points


# -- templates ------------------------------------------------------------------------------------


def test_shared_snippets_are_included_once_per_kernel():
    for template in ("cross_entropy", "softmax"):
        text = load_template(template)
        directives = [line for line in text.splitlines() if line.lstrip().startswith("//#include")]
        assert not directives and text.count("fn combine(") == 1, template


def test_render_fails_loudly_on_missing_values():
    with pytest.raises(TemplateError, match="placeholder"):
        render("elementwise", {"BINDINGS": "", "NUMEL": 1, "GRID_X": 1})
    with pytest.raises(TemplateError, match="flag 'GRAD'"):
        render("cross_entropy", {"BINDINGS": "", "ROWS": 1, "C": 1, "WG": 32, "GRID_X": 1, "GRAD_AT": "0.0"})


def test_nan_and_infinities_reach_a_shader_through_a_runtime_let():
    """WGSL makes a constant expression that evaluates to NaN or ±inf a shader-creation error (Tint
    rejects one, naga does not): each such literal is a call of a helper whose `let` holds the
    bits, declared once in every module that calls it and in no other."""
    for value in (math.nan, math.inf, -math.inf):
        text = expressions.literal(value)
        bits = int(re.fullmatch(rf"{expressions.F32_BITS}\(0x([0-9a-f]{{8}})u\)", text).group(1), 16)
        got = np.array([bits], np.uint32).view(np.float32)[0]
        assert np.isnan(got) if math.isnan(value) else got == value, (value, text)
    values = {"BINDINGS": "", "NUMEL": 1, "GRID_X": 1, "FUNCTIONS": "", "READS": ""}
    special = render("elementwise", {**values, "VALUE": expressions.literal(-math.inf)})
    assert special.count(f"fn {expressions.F32_BITS}(") == 1 and "let runtime = bits;" in special
    assert "bitcast<f32>(0x" not in special
    assert expressions.F32_BITS not in render("elementwise", {**values, "VALUE": expressions.literal(0.5)})
    assert expressions.F32_BITS in load_template("cross_entropy")  # the template spells its NaN the same way


def test_index_expressions_merge_contiguous_and_broadcast_dims():
    assert common.index_expr("i", (7, 33), (33, 1)) == "i"
    assert common.index_expr("i", (7, 33), (0, 1)) == "(i % 33u)"
    assert common.index_expr("i", (7, 33), (1, 0)) == "(i / 33u)"
    assert common.index_expr("i", (2, 3, 4), (0, 0, 0)) == "0u"


# -- matmul ---------------------------------------------------------------------------------------

# Ragged everywhere, and ragged but multiples of 4 (the kernel's vec4 loads and stores: 36x20x44).
MATMUL_SHAPES = [(1, 1, 1), (7, 33, 65), (65, 130, 7), (130, 7, 33), (33, 65, 130), (36, 20, 44), (100, 132, 68)]
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


def operand_shapes(m: int, k: int, n: int, transpose_a: bool, transpose_b: bool, batch: tuple[int, ...] = ()):
    return [(*batch, *((k, m) if transpose_a else (m, k))), (*batch, *((n, k) if transpose_b else (k, n)))]


def transpose_id(flags) -> str:
    return ("At" if flags[0] else "A") + ("Bt" if flags[1] else "B")


@pytest.mark.parametrize("transposes", TRANSPOSES, ids=transpose_id)
@pytest.mark.parametrize("mkn", MATMUL_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matmul(mkn, transposes):
    shapes = operand_shapes(*mkn, *transposes)
    graph = one_op("matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1])
    check(graph, {"x0": normal(*shapes[0]), "x1": normal(*shapes[1])}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("transposes", TRANSPOSES, ids=transpose_id)
@pytest.mark.parametrize("batch", [(2,), (2, 3)], ids=lambda b: "x".join(map(str, b)))
@pytest.mark.parametrize("mkn", [(7, 33, 65), (33, 5, 1)], ids=lambda s: "x".join(map(str, s)))
def test_batched_matmul(mkn, batch, transposes):
    shapes = operand_shapes(*mkn, *transposes, batch=batch)
    graph = one_op("matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1])
    executable = check(graph, {"x0": normal(*shapes[0]), "x1": normal(*shapes[1])}, rtol=1e-4, atol=1e-4)
    spec = executable.kernels[0]  # check() plans for GENERIC
    tiling = gemm_tiling(
        mkn[0], mkn[2], mkn[1], int(np.prod(batch)), GENERIC, transposes[1]
    )  # check() plans for GENERIC
    tiles_m = -(-mkn[0] // tiling.bm)
    assert spec.grid[1:] == (tiles_m * int(np.prod(batch)), 1)  # the batch is in the grid


@pytest.mark.parametrize("transposes", [(False, False), (False, True), (True, False), (True, True)], ids=str)
@pytest.mark.parametrize("shared", ["a", "b"])
def test_matmul_with_a_2d_operand_shared_by_the_batch(shared, transposes):
    m, k, n, batch = 7, 33, 10, (2, 3)
    a_shape, b_shape = operand_shapes(m, k, n, *transposes, batch=batch)
    shapes = [a_shape[-2:], b_shape] if shared == "a" else [a_shape, b_shape[-2:]]
    graph = one_op("fused_matmul", shapes + [(n,)], transpose_a=transposes[0], transpose_b=transposes[1],
                   epilogue="add($acc,$0)", prologue="mul($a,2.0)")  # fmt: skip
    inputs = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes + [(n,)])}
    executable = check(graph, inputs, rtol=1e-4, atol=1e-4)
    assert executable.graph[len(shapes) + 1].shape == (*batch, m, n)


def test_batched_matmul_grid_folds_into_z(monkeypatch):
    monkeypatch.setattr(common, "MAX_WORKGROUPS_PER_DIM", 4)
    shapes = operand_shapes(20, 9, 5, False, True, batch=(3, 2)) + [(3, 1, 1, 5)]
    graph = one_op("fused_matmul", shapes, transpose_b=True, epilogue="add($acc,$0)")
    executable = check(graph, {f"x{i}": normal(*s) for i, s in enumerate(shapes)}, rtol=1e-4, atol=1e-4)
    # 1 row tile x 6 batches = 6 (tile, batch) pairs over a 4 x 2 grid: two workgroups have nothing to do.
    assert executable.kernels[0].grid == (1, 4, 2)


# (epilogue, extra shapes as a function of (batch, m, n)): 0, 1 and 2 extras broadcast every way.
EPILOGUES = [
    ("$acc", lambda b, m, n: []),
    ("relu(add($acc,$0))", lambda b, m, n: [(n,)]),
    ("sigmoid(add($acc,$0))", lambda b, m, n: [(1, n)]),
    ("mul($acc,greater($0,0.0))", lambda b, m, n: [(*b, m, n)]),  # a backward relu mask
    ("tanh(add(mul($acc,$0),$1))", lambda b, m, n: [(), (m, 1)]),
    ("swiglu($0,$acc)", lambda b, m, n: [(*b, m, n)]),
    ("silu(sub($acc,mul($0,$1)))", lambda b, m, n: [(1, n), (*b[:1], *(1,) * len(b[1:]), m, n)]),
    ("rsqrt(add(mul($acc,$acc),1.0))", lambda b, m, n: []),
]


@pytest.mark.parametrize("batch", [(), (2, 3)], ids=["2d", "batch2x3"])
@pytest.mark.parametrize("epilogue, extras", EPILOGUES, ids=[e for e, _ in EPILOGUES])
def test_fused_matmul_epilogue(epilogue, extras, batch):
    m, k, n = 33, 17, 65
    transpose_a, transpose_b = "sigmoid" in epilogue or "tanh" in epilogue, "relu" in epilogue or "silu" in epilogue
    shapes = operand_shapes(m, k, n, transpose_a, transpose_b, batch) + extras(batch, m, n)
    graph = one_op("fused_matmul", shapes, transpose_a=transpose_a, transpose_b=transpose_b, epilogue=epilogue)
    inputs = {f"x{i}": normal(*shape, scale=2.0) for i, shape in enumerate(shapes)}
    executable = check(graph, inputs, rtol=1e-4, atol=1e-4)
    assert len(executable.kernels[0].bindings) == len(shapes) + 1


def test_fused_matmul_constants_are_inlined_and_unused_extras_unbound():
    graph = Graph()
    a, b = typed_leaf(graph, "input", "a", (7, 5)), typed_leaf(graph, "input", "b", (5, 9))
    unused, bias = typed_leaf(graph, "input", "unused", (9,)), typed_leaf(graph, "input", "bias", (1, 9))
    scale = emit(graph, "reshape", [const(graph, 0.5)], shape=(1, 1))
    graph.outputs["out"] = emit(graph, "fused_matmul", [a, b, scale, unused, bias], epilogue="add(mul($acc,$0),$2)")
    inputs = {"a": normal(7, 5), "b": normal(5, 9), "unused": normal(9), "bias": normal(1, 9)}
    executable = check(graph, inputs, rtol=1e-5, atol=1e-5)
    spec = executable.kernels[0]
    assert [binding.name for binding in spec.bindings] == ["a", "b", "x0", "out"] and "(0.5f)" in spec.wgsl


# A prologue runs on A's stored elements while they are staged (RMSNorm folded into the matmul):
# its extras broadcast to A's STORED shape, so one value per row of op(A) is [M, 1] for a plain A
# and [1, M] (or [M]) for a transposed one, stored [K, M].
PROLOGUE_SHAPES = [((1, 1, 1), ()), ((7, 33, 65), ()), ((65, 130, 7), ()), ((33, 17, 20), (2,)), ((5, 70, 9), (2, 3))]


def rms_extras(batch: tuple[int, ...], m: int, k: int, transpose_a: bool) -> list[tuple[int, ...]]:
    """[per-row scale of op(A), per-K weight] in A's stored layout."""
    return [(*batch, 1, m), (k, 1)] if transpose_a else [(*batch, m, 1), (k,)]


@pytest.mark.parametrize("transposes", TRANSPOSES, ids=transpose_id)
@pytest.mark.parametrize("mkn, batch", PROLOGUE_SHAPES, ids=lambda v: "x".join(map(str, v)) or "2d")
def test_fused_matmul_rms_prologue(mkn, batch, transposes):
    m, k, n = mkn
    shapes = operand_shapes(*mkn, *transposes, batch) + [(n,)] + rms_extras(batch, m, k, transposes[0])
    graph = one_op(
        "fused_matmul",
        shapes,
        transpose_a=transposes[0],
        transpose_b=transposes[1],
        epilogue="add($acc,$0)",
        prologue="mul(mul($a,$1),$2)",
    )
    executable = check(graph, {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}, rtol=1e-4, atol=1e-4)
    assert "A=mul(mul($a,$1),$2)" in executable.kernels[0].label


@pytest.mark.parametrize("transpose_a", [False, True], ids=["A", "At"])
@pytest.mark.parametrize("lead, k, n", [((2, 3), 5, 4), ((3, 11), 33, 65), ((1, 1), 1, 1)], ids=str)
def test_fused_matmul_prologue_over_the_rows_of_a_tensor(lead, k, n, transpose_a):
    """flatten_a: A is the [rows, K] matrix of a stored [*lead, K] (or its transpose, [K, rows] stored
    as [*lead, K]… read transposed); the prologue's extras broadcast over the stored shape."""
    rows = lead[0] * lead[1]
    stored = (*lead, k)
    b_shape = (n, k) if not transpose_a else (n, rows)
    shapes = [stored, b_shape, (*lead, 1), (k,)]
    graph = one_op(
        "fused_matmul",
        shapes,
        transpose_a=transpose_a,
        transpose_b=True,
        flatten_a=True,
        prologue="mul(mul($a,$0),$1)",
        epilogue="$acc",
    )
    out = graph[graph.outputs["out"]]
    assert out.shape == ((k, n) if transpose_a else (rows, n))
    check(graph, {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "prologue, epilogue, extras",
    [
        ("silu($a)", "$acc", ()),
        ("mul($a,$a)", "relu($acc)", ()),
        ("add($a,$0)", "$acc", ("full",)),  # a second A-shaped input
        ("mul($a,$0)", "mul($acc,$0)", ("scalar",)),  # one extra read at both ends
        ("sub($a,$0)", "add($acc,$0)", ("const",)),  # a scalar constant, inlined at both ends
    ],
)
@pytest.mark.parametrize("transpose_a", [False, True], ids=["A", "At"])
def test_fused_matmul_prologue_expressions(prologue, epilogue, extras, transpose_a):
    graph = Graph()
    m, k, n = 9, 21, 6
    a_shape = (k, m) if transpose_a else (m, k)
    a, b = typed_leaf(graph, "input", "a", a_shape), typed_leaf(graph, "input", "b", (k, n))
    values = {"a": normal(*a_shape), "b": normal(k, n), "full": normal(*a_shape), "scalar": normal(1, 1)}
    made = {
        "full": lambda: typed_leaf(graph, "input", "full", a_shape),
        "scalar": lambda: typed_leaf(graph, "input", "scalar", (1, 1)),
        "const": lambda: const(graph, 0.25),
    }
    inputs = [a, b, *(made[name]() for name in extras)]
    graph.outputs["out"] = emit(
        graph, "fused_matmul", inputs, transpose_a=transpose_a, prologue=prologue, epilogue=epilogue
    )
    executable = check(graph, {name: values[name] for name in ("a", "b", *extras) if name in values}, 1e-4, 1e-4)
    assert len(executable.kernels[0].bindings) == 3 + (extras in (("full",), ("scalar",)))


def test_fused_matmul_prologue_shapes_are_checked():
    a, b = TensorType((4, 3)), TensorType((3, 5))
    with pytest.raises(ValueError, match="prologue input \\$0"):
        infer_type("fused_matmul", [a, b, TensorType((5,))], {"prologue": "mul($a,$0)"})
    with pytest.raises(ValueError, match="epilogue input \\$0"):
        infer_type("fused_matmul", [a, b, TensorType((3,))], {"prologue": "mul($a,$0)", "epilogue": "add($acc,$0)"})
    with pytest.raises(ValueError, match="acc"):
        infer_type("fused_matmul", [a, b], {"prologue": "mul($a,$acc)"})
    # an extra only the prologue reads need not fit the output: [3] is a per-K weight of A [4, 3]
    assert infer_type("fused_matmul", [a, b, TensorType((3,))], {"prologue": "mul($a,$0)"}).shape == (4, 5)


@pytest.mark.parametrize(
    "tiling",
    [
        GemmTiling(128, 128, 16, 4, 4),  # the CPU's: 16x16 per thread
        GemmTiling(128, 128, 32, 2, 2),
        GemmTiling(64, 128, 16, 2, 2, prefetch=True),
        GemmTiling(32, 64, 16, 2, 1),
        GemmTiling(4, 64, 16, 1, 1),
        GemmTiling(64, 16, 16, 1, 1, prefetch=True),
        GemmTiling(32, 32, 16, 1, 1, prefetch=True),  # the H200's batched products' (gemm_table.BATCHED_TABLES)
    ],
    ids=str,
)
def test_matmul_tilings_on_ragged_shapes(monkeypatch, tiling):
    """Tile configurations the test sizes would not pick, on shapes ragged on every axis (scalar
    loads) and ragged multiples of 4 (vec4 loads and stores), with a prologue and an epilogue."""
    monkeypatch.setattr(codegen_matmul, "gemm_tiling", lambda *_: tiling)
    cases = [((37, 29, 45), (False, False), ()), ((36, 28, 44), (True, True), (2,)), ((36, 28, 44), (False, True), ())]
    for (m, k, n), (transpose_a, transpose_b), batch in cases:
        shapes = operand_shapes(m, k, n, transpose_a, transpose_b, batch) + [(n,), (k if transpose_a else m, 1)]
        graph = one_op(
            "fused_matmul", shapes, transpose_a=transpose_a, transpose_b=transpose_b,
            epilogue="relu(add($acc,$0))", prologue="mul($a,$1)",
        )  # fmt: skip
        check(graph, {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}, rtol=1e-4, atol=1e-4)


# (M, K, N), transposes, batch, parts: parts of K that are tile multiples (K 512 in 4 of 128),
# ragged (K 300 in 7 of 43: a K tile crosses each part's end, vec4 units along K would too), and a
# last part shorter than the others (K 530 in 4 of 133).
SPLIT_CASES = [
    ((36, 512, 44), (True, False), (), 4),
    ((37, 300, 9), (False, False), (), 7),
    ((8, 300, 20), (True, True), (), 7),
    ((33, 530, 20), (False, True), (2,), 4),
    ((36, 64, 12), (True, False), (3,), 2),
]


@pytest.mark.parametrize(
    "tiling",
    [
        None,
        GemmTiling(64, 128, 16, 2, 2, prefetch=True),
        GemmTiling(64, 64, 16, 2, 2, prefetch=True),  # the H200's split ladder (gemm_table.SPLIT_TABLES)
        GemmTiling(32, 64, 16, 1, 1),
        GemmTiling(128, 128, 32, 2, 2),
    ],
    ids=str,
)
def test_split_k_partials_on_ragged_shapes(monkeypatch, tiling):
    """fused_matmul(splits=S): the S partial products along K, with a prologue, every transpose,
    batched; with the table's tiling (None) and forced ones (register prefetch, BK 32)."""
    if tiling is not None:
        monkeypatch.setattr(codegen_matmul, "gemm_tiling", lambda *_: tiling)
    for (m, k, n), (transpose_a, transpose_b), batch, parts in SPLIT_CASES:
        shapes = operand_shapes(m, k, n, transpose_a, transpose_b, batch) + [(k if transpose_a else m, 1)]
        graph = one_op("fused_matmul", shapes, transpose_a=transpose_a, transpose_b=transpose_b,
                       prologue="mul($a,$0)", splits=parts)  # fmt: skip
        assert graph[3].shape == (parts, *batch, m, n)
        executable = check(graph, {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}, rtol=1e-4, atol=1e-4)
        assert executable.kernels[0].label.endswith(f"in {parts} parts of K")


# (M, K, N), transposes, batch, the rows' period P, parts: dQ's product in small (3 query heads of
# 20 rows over 23 keys, A stored transposed as passes/attention_scores.py has it), a period that
# row tiles cross, more keys than a period's rows (the last ones zero in every row), and split
# into parts of K (a part past a tile's last key multiplies nothing and writes zeros).
CAUSAL_CASES = [
    ((60, 23, 12), (True, False), (2,), 20, 1),
    ((37, 29, 45), (False, False), (), 13, 1),
    ((36, 40, 8), (False, True), (), 36, 1),
    ((48, 64, 20), (True, False), (3,), 16, 3),
]


def causal_operands(m: int, k: int, n: int, transposes: tuple[bool, bool], batch: tuple, period: int):
    """A (zero where the causal promise says, stored as `transposes` say) and B, as inputs."""
    from meganeura.ir.ops.matmul import causal_mask

    a_shape, b_shape = operand_shapes(m, k, n, *transposes, batch)
    op_a = normal(*batch, m, k) * causal_mask(m, k, period)
    a = np.ascontiguousarray(np.swapaxes(op_a, -1, -2) if transposes[0] else op_a)
    return {"x0": a, "x1": normal(*b_shape)}, [a_shape, b_shape]


@pytest.mark.parametrize(
    "tiling",
    [
        None,
        GemmTiling(32, 32, 16, 1, 1, prefetch=True),  # the H200's batched products' (dQ's)
        GemmTiling(128, 128, 16, 4, 4),  # the CPU's
        GemmTiling(4, 64, 16, 1, 1),
        GemmTiling(64, 64, 32, 2, 2, prefetch=True),
    ],
    ids=str,
)
def test_causal_products_match_the_interpreter_on_ragged_shapes(monkeypatch, tiling):
    """fused_matmul(causal_rows=P): each row tile stops at its last row's K tile (shaders/
    gemm_tile.wgsl), every transpose, batched, split into parts of K."""
    if tiling is not None:
        monkeypatch.setattr(codegen_matmul, "gemm_tiling", lambda *_: tiling)
    for (m, k, n), transposes, batch, period, parts in CAUSAL_CASES:
        inputs, shapes = causal_operands(m, k, n, transposes, batch, period)
        graph = one_op("fused_matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1],
                       causal_rows=period, splits=parts)  # fmt: skip
        executable = check(graph, inputs, rtol=1e-4, atol=1e-4)
        assert f"causal rows of {period}" in executable.kernels[0].label


def test_a_causal_product_skips_the_keys_past_its_row_tiles(monkeypatch):
    """The kernel does not read past a row tile's last K tile: a NaN planted there (row 0's last
    key, with tiles of 32 rows and 16 keys, 64 rows a period) leaves the product finite, equal to
    the product without it; the interpreter refuses the A that breaks the promise, and a negative
    period is refused by name. The flops count only the nonzero terms."""
    from meganeura.ir.ops.matmul import causal_terms, matmul_flops

    monkeypatch.setattr(codegen_matmul, "gemm_tiling", lambda *_: GemmTiling(32, 32, 16, 1, 1))
    inputs, shapes = causal_operands(128, 64, 8, (False, False), (), 64)
    graph = one_op("fused_matmul", shapes, causal_rows=64)
    want = inputs["x0"].astype(np.float64) @ inputs["x1"]
    planted = inputs["x0"].copy()
    planted[0, 63] = np.nan
    got = run_gpu(graph, inputs).run({**inputs, "x0": planted}, read=("out",))["out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    planted[0, 63] = 1.0
    with pytest.raises(ValueError, match="not zero past column r mod 64"):
        interpret(graph, {**inputs, "x0": planted})
    with pytest.raises(ShapeError, match="causal_rows"):
        infer_type("fused_matmul", [TensorType(s) for s in shapes], {"causal_rows": -1})
    assert causal_terms(128, 64, 64) == 2 * (64 * 65 // 2)
    assert causal_terms(5, 3, 4) == 1 + 2 + 3 + 3 + 1  # rows 0-3 see 1, 2, 3, 3 keys; row 4 one
    types = [TensorType(s) for s in shapes]
    out = [TensorType((128, 8))]
    assert matmul_flops(types, out, {"causal_rows": 64}) == 2 * 8 * 64 * 65
    assert matmul_flops(types, out, {}) == 2 * 128 * 8 * 64


def test_split_parts_of_k_are_whole_k_tiles_where_no_part_is_left_empty():
    """A split product's parts of K are ⌈K/S⌉ rounded up to 16 (the kernels' K tile), except where
    that would leave the last part empty; they always cover K exactly once."""
    assert [part_length(k, s) for k, s in ((2048, 3), (2048, 6), (49152, 8), (300, 7), (40, 3))] == [
        688,
        352,
        6144,
        48,
        16,
    ]
    assert part_length(20, 3) == 7 and part_length(2048, 1) == 2048  # 16 · 2 ≥ 20: the even parts
    for k in range(2, 300):
        for splits in range(2, min(k, 17)):
            if (splits - 1) * -(-k // splits) >= k:
                continue  # check_splits refuses it
            length = part_length(k, splits)
            assert (splits - 1) * length < k <= splits * length


def test_split_k_partials_sum_to_the_product_and_bad_splits_say_why():
    a, b = normal(6, 300), normal(300, 5)
    graph = one_op("fused_matmul", [(6, 300), (300, 5)], splits=7)
    partials = interpret(graph, {"x0": a, "x1": b}, {}, {}).outputs["out"]
    np.testing.assert_allclose(partials.sum(axis=0), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    # parts of ⌈300/7⌉ = 43 rounded up to 48 (ir/ops/matmul.py part_length): the last one 288…300
    np.testing.assert_allclose(partials[6], a[:, 288:] @ b[288:], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(partials[0], a[:, :48] @ b[:48], rtol=1e-5, atol=1e-5)
    types = [TensorType((6, 300)), TensorType((300, 5))]
    with pytest.raises(ShapeError, match="last part empty"):
        infer_type("fused_matmul", types, {"splits": 80})  # 80 parts of 4: the last starts past 300
    with pytest.raises(ShapeError, match="no epilogue"):
        infer_type("fused_matmul", types, {"splits": 2, "epilogue": "relu($acc)"})


def test_trusted_kernels_run_without_bounds_checks_when_the_user_opts_in(monkeypatch):
    """MEGANEURA_UNCHECKED_KERNELS=1: the matmul kernels (indexing tested at ragged shapes above) and
    the elementwise ones get modules without runtime bounds checks and compute the same; a kernel
    whose entry point is not trusted (codegen/kernel.py TRUSTED_ENTRY_POINTS) keeps them."""
    monkeypatch.setenv("MEGANEURA_UNCHECKED_KERNELS", "1")
    shapes = operand_shapes(37, 28, 44, True, False)
    graph = one_op("fused_matmul", shapes + [(44,)], transpose_a=True, epilogue="relu(add($acc,$0))")
    executable = check(
        graph, {f"x{i}": normal(*shape) for i, shape in enumerate(shapes + [(44,)])}, rtol=1e-4, atol=1e-4
    )
    modules = default_device()._modules
    assert all(spec.trusted for spec in executable.kernels)
    assert all((spec.wgsl, True) in modules for spec in executable.kernels)
    relu_kernels = check(one_op("relu", [(5, 7)]), {"x0": normal(5, 7)}).kernels
    assert all(spec.trusted for spec in relu_kernels) and (relu_kernels[0].wgsl, True) in modules
    # an entry point not in TRUSTED_ENTRY_POINTS keeps its checks
    monkeypatch.setattr(codegen_kernel, "TRUSTED_ENTRY_POINTS", codegen_kernel.TRUSTED_ENTRY_POINTS - {"elementwise"})
    relu_kernels = check(one_op("relu", [(6, 7)]), {"x0": normal(6, 7)}).kernels
    assert not any(spec.trusted for spec in relu_kernels) and (relu_kernels[0].wgsl, False) in modules


def test_a_checked_tiling_keeps_its_bounds_checks_when_the_user_opts_in(monkeypatch):
    """On the H200 a product with B stored [N, K] and a large output takes the 128x128 tile, which
    ran slower without bounds checks (gemm_table.py `checked`): under MEGANEURA_UNCHECKED_KERNELS=1
    its kernel, trusted, keeps its checks and gets a checked module; shrunk to a ragged output it stays
    checked; its kernel at a ragged size computes what the interpreter does; the same product with
    B stored [K, N] takes the 64x128 tile, trusted."""
    from meganeura.codegen.matmul import lower_matmul

    monkeypatch.setenv("MEGANEURA_UNCHECKED_KERNELS", "1")
    h200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152)
    tiling = gemm_tiling(2048, 3072, 768, target=h200, transpose_b=True)
    assert (tiling.bm, tiling.bn, tiling.checked) == (128, 128, True) and "checked" in str(tiling)
    assert shrunk(tiling, 37, 44, h200.workgroup_memory).checked
    assert not gemm_tiling(2048, 3072, 768, target=h200).checked
    shapes = operand_shapes(2050, 7, 2090, False, True)  # 17 × 17 ragged tiles of 128x128
    graph = one_op("matmul", shapes, transpose_b=True)
    spec = lower_matmul(graph, graph[graph.outputs["out"]], h200)
    assert spec.workgroup_memory == tiling.workgroup_bytes and spec.trusted and spec.keeps_checks
    unshared = one_op("matmul", operand_shapes(2050, 7, 2090, False, False))
    unshared_spec = lower_matmul(unshared, unshared[unshared.outputs["out"]], h200)
    assert unshared_spec.trusted and not unshared_spec.keeps_checks
    inputs = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}
    kernels = check(graph, inputs, rtol=1e-4, atol=1e-4, target=h200).kernels
    assert [k.keeps_checks for k in kernels] == [True] and (kernels[0].wgsl, False) in default_device()._modules


def test_every_gemm_table_entry_is_a_valid_tiling_and_bad_ones_say_why():
    for family, table in TABLES.items():
        for tiling in table.ladder + table.transposed_b:
            assert tiling.workgroup_bytes <= WEBGPU_WORKGROUP_MEMORY, (family, str(tiling))  # fits every device
            assert tiling.threads <= 256 and tiling.threads_x * 4 * tiling.rn == tiling.bn
    for m, n, k in [(1, 1, 1), (8, 16, 3), (33, 33, 5), (1000, 1000, 64), (4096, 4096, 4096), (1, 50000, 64)]:
        tiling = gemm_tiling(m, n, k)
        assert tiling.bm <= max(4 * tiling.rm, 2 * m) and tiling.bn <= max(16 * tiling.rn, 2 * n)  # shrunk to fit
    with pytest.raises(ValueError, match="workgroup memory"):
        GemmTiling(256, 256, 32, 4, 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        GemmTiling(64, 64, 6, 1, 1)


def test_a_gemm_tiling_is_picked_within_the_targets_workgroup_memory(monkeypatch):
    """A ladder whose largest tile (32 KiB of staged tiles) only some targets hold: a 16 KiB one
    takes the next, for the kernel and for the workgroups the cost model counts."""
    large, next_one = GemmTiling(128, 128, 32, 2, 2), GemmTiling(64, 128, 16, 2, 2)
    monkeypatch.setitem(TABLES, "generic", GemmLadder(fill=2, ladder=(large, next_one)))
    roomy, small = (Target(f"{size} B", 4, 31, workgroup_memory=size) for size in (32768, 16384))
    assert large.workgroup_bytes == 32768 and next_one.workgroup_bytes == 12288
    assert gemm_tiling(4096, 4096, 4096, 1, roomy) == large
    assert gemm_tiling(4096, 4096, 4096, 1, small) == next_one
    graph = one_op("matmul", [(512, 64), (64, 512)])
    for target, tiling in ((roomy, large), (small, next_one)):
        (spec,) = compile_step(graph, target).kernels
        assert spec.workgroup_memory == tiling.workgroup_bytes
        assert math.prod(spec.grid) == (512 // tiling.bm) * 4
        counted = codegen_matmul.counted_workgroups(math.prod(spec.grid), tiling, 512, 512, target, False)
        assert node_workgroups(graph, graph[spec.node], target) == counted
    monkeypatch.setitem(TABLES, "generic", GemmLadder(fill=2, ladder=(large,)))
    with pytest.raises(ValueError, match="16384 bytes of workgroup memory"):
        gemm_tiling(4096, 4096, 4096, 1, small)


# -- expressions ----------------------------------------------------------------------------------


def test_expressions_have_one_wgsl_form_per_function_and_stay_linear():
    for function in FUNCTIONS.values():  # each operand appears exactly once in the form
        assert sorted(re.findall(r"\{(\d)\}", function.wgsl)) == [str(i) for i in range(function.arity)], function.name
    value_of = {"0": "v0", "acc": "x"}.__getitem__
    assert expressions.expr_to_wgsl(parse("relu(add($acc,$0))"), value_of) == "mn_relu((x + v0))"
    assert expressions.expr_to_wgsl(parse("mul($0,-2.5)"), value_of) == "(v0 * (-2.5f))"
    nested = parse("silu(" * 12 + "$0" + ")" * 12)
    assert expressions.expr_to_wgsl(nested, value_of).count("v0") == 1  # no argument is repeated
    assert "fn mn_silu" in expressions.helper_functions([parse("swiglu($0,$1)")])
    assert expressions.helper_functions([parse("exp($0)"), 1.0]) == ""
    relu = expressions.helper_functions([parse("relu($0)")])  # a helper calls another: both, once each
    assert relu.count("fn mn_relu(") == 1 and relu.count("fn mn_isnan(") == 1


# -- elementwise ----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", UNARY_FUNCTIONS)
def test_unary(op):
    x = normal(7, 33, scale=3.0)
    if op in ("log", "sqrt", "rsqrt"):
        x = np.abs(x) + 0.1
    if op in ("sigmoid", "tanh", "silu"):
        x[0, :6] = [-100.0, 100.0, -30.0, 30.0, -1000.0, 1000.0]  # saturates without NaN
    check(one_op(op, [(7, 33)]), {"x0": x}, rtol=2e-6, atol=1e-6)


BROADCASTS = [((7, 33), (7, 33)), ((7, 33), (33,)), ((7, 1), (1, 33)), ((2, 3, 4), (3, 1)), ((5,), ()), ((), (4, 1))]


@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{list(s[0])}-{list(s[1])}")
@pytest.mark.parametrize("op", BINARY_FUNCTIONS)
def test_binary_broadcasting(op, shapes):
    a, b = normal(*shapes[0]), normal(*shapes[1])
    if op == "div":
        b = np.abs(b) + 0.5
    if FUNCTIONS[op].wgsl.startswith("select(0.0, 1.0"):  # a comparison: with ties (equal, ≥, ≤ differ there)
        a, b = np.round(a), np.round(b)
    if op == "swiglu":
        a.flat[:2] = [-100.0, 100.0][: a.size]
    check(one_op(op, list(shapes)), {"x0": a, "x1": b}, rtol=2e-6, atol=1e-6)


def test_softplus_and_leaky_relu_at_extremes():
    x = np.array([-1000.0, -100.0, -30.0, -1.0, 0.0, 1.0, 19.5, 20.5, 30.0, 100.0, 1000.0], np.float32)
    check(one_op("softplus", [(11,), ()]), {"x0": x, "x1": np.float32(20.0)}, rtol=2e-6, atol=1e-6)
    check(one_op("leaky_relu", [(11,), ()]), {"x0": x, "x1": np.float32(0.01)}, rtol=2e-6, atol=1e-6)


TERNARY_SHAPES = [((7, 33), (7, 33), (7, 33)), ((7, 1), (33,), ()), ((), (2, 3, 4), (3, 1)), ((5,), (1,), (5,))]


@pytest.mark.parametrize("shapes", TERNARY_SHAPES, ids=lambda s: "-".join(str(list(d)) for d in s))
@pytest.mark.parametrize("op", TERNARY_FUNCTIONS)
def test_ternary_broadcasting(op, shapes):
    a, b, c = (normal(*shape) for shape in shapes)
    if op == "where":  # a condition of zeros and other values (not only 0/1 masks)
        a = np.where(np.abs(a) < 0.5, 0.0, a)
    check(one_op(op, list(shapes)), {"x0": a, "x1": b, "x2": c}, rtol=2e-6, atol=1e-6)


def test_scalar_constants_are_inlined_and_repeated_inputs_bound_once():
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (7, 33))
    scaled = emit(graph, "mul", [x, const(graph, 0.25)])
    shifted = emit(graph, "sub", [scaled, emit(graph, "reshape", [const(graph, -1.5)], shape=(1, 1))])
    graph.outputs["out"] = emit(graph, "mul", [shifted, shifted])
    executable = check(graph, {"x": normal(7, 33)})
    assert [len(spec.bindings) for spec in executable.kernels] == [2, 2, 2]
    assert "(0.25f)" in executable.kernels[0].wgsl and "(-1.5f)" in executable.kernels[1].wgsl


@pytest.mark.parametrize("source, target", [((3, 1), (2, 3, 4)), ((), (5,)), ((4,), (3, 4)), ((1, 6), (5, 6))])
def test_broadcast_to(source, target):
    check(one_op("broadcast_to", [source], shape=target), {"x0": normal(*source)})


def test_broadcast_to_i32():
    graph = one_op("broadcast_to", [(3,)], ["i32"], shape=(2, 3))
    labels = np.array([4, -2, 7], np.int32)
    got = run_gpu(graph, {}).run({"x0": labels}, read=("out",))["out"]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.broadcast_to(labels, (2, 3)))


def test_large_grids_fold_into_two_dimensions(monkeypatch):
    monkeypatch.setattr(common, "MAX_WORKGROUPS_PER_DIM", 3)
    graph = one_op("exp", [(33, 65)])  # 9 workgroups of 256 -> a 3 x 3 grid
    executable = check(graph, {"x0": normal(33, 65)})
    assert executable.kernels[0].grid == (3, 3, 1)
    check(one_op("sum", [(7, 1, 9)], axes=(1,), keepdim=False), {"x0": normal(7, 1, 9)})
    check(one_op("sum", [(7, 300)], axes=(1,), keepdim=True), {"x0": normal(7, 300)})
    check(one_op("cross_entropy_rows", [(7, 5), (7,)], ["f32", "i32"]), {"x0": normal(7, 5), "x1": np.arange(7) % 5})
    assert check(one_op("softmax", [(2, 7, 5)], axis=1), {"x0": normal(2, 7, 5)}).kernels[0].grid == (3, 4, 1)


# -- pointwise and permute ------------------------------------------------------------------------

# (expression, input shapes, output shape): 0 to 4 inputs, broadcast every way, literals, helpers.
POINTWISE = [
    ("1.5", [], (3, 4)),
    ("mul(sub($0,1.0),0.5)", [(7, 33)], (7, 33)),
    ("sigmoid($0)", [(33,)], (7, 33)),
    ("div(exp(sub($0,$1)),add($1,3.0))", [(7, 33), (7, 1)], (7, 33)),
    ("swiglu(mul($0,$0),$1)", [(2, 1, 5), (3, 1)], (2, 3, 5)),
    ("add(mul($0,greater($1,0.0)),mul($2,rsqrt(add(mul($1,$1),1e-05))))", [(65,), (1, 65), ()], (3, 65)),
    ("tanh(add(add(mul($0,$1),$2),silu($3)))", [(2, 3, 4), (4,), (3, 1), (2, 1, 1)], (2, 3, 4)),
    ("sub($0,equal($1,$2))", [(), (), ()], ()),
]


@pytest.mark.parametrize("expr, shapes, shape", POINTWISE, ids=[f"{len(s)}in-{e}" for e, s, _ in POINTWISE])
def test_pointwise(expr, shapes, shape):
    inputs = {f"x{i}": np.round(normal(*s, scale=2.0), 1) for i, s in enumerate(shapes)}  # rounded: some ties
    executable = check(one_op("pointwise", shapes, expr=expr, shape=shape), inputs, rtol=1e-5, atol=1e-6)
    assert len(executable.kernels[0].bindings) == len(shapes) + 1


def test_pointwise_inlines_constants_and_folds_large_grids(monkeypatch):
    monkeypatch.setattr(common, "MAX_WORKGROUPS_PER_DIM", 3)
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (33, 65))
    half = emit(graph, "reshape", [const(graph, 0.5)], shape=(1, 1))
    graph.outputs["out"] = emit(graph, "pointwise", [x, half, x], expr="add(mul($0,$1),exp($2))", shape=(33, 65))
    spec = check(graph, {"x": normal(33, 65)}).kernels[0]
    assert spec.grid == (3, 3, 1) and [b.name for b in spec.bindings] == ["x0", "out"] and "(0.5f)" in spec.wgsl


# Outputs whose rows are whole vec4s: a thread per 4 elements (codegen/elementwise.py
# `runs_vec4s`), ragged leading dims, inputs along the last axis (vec4 loads, also broadcast over
# rows), broadcast along it (one scalar for 4), scalars, literals.
POINTWISE_VEC4 = [
    ("mul(sub($0,1.0),0.5)", [(7, 36)], (7, 36)),
    ("add(mul($0,$1),$2)", [(3, 5, 8), (8,), (3, 5, 1)], (3, 5, 8)),
    ("div(exp(sub($0,$1)),add($2,3.0))", [(1, 12), (5, 1), ()], (5, 12)),
    ("swiglu($0,mul($1,$2))", [(2, 3, 4), (3, 4), (2, 1, 1)], (2, 3, 4)),
    ("where($0,$1,neg($1))", [(9, 1), (4,)], (9, 4)),
]


@pytest.mark.parametrize("expr, shapes, shape", POINTWISE_VEC4, ids=[e for e, _, _ in POINTWISE_VEC4])
def test_pointwise_runs_a_thread_per_vec4_where_rows_are_whole_vec4s(expr, shapes, shape):
    inputs = {f"x{i}": np.round(normal(*s, scale=2.0), 1) for i, s in enumerate(shapes)}
    inputs = {k: np.where(np.abs(v) < 0.5, 0.0, v).astype(np.float32) for k, v in inputs.items()}
    graph = one_op("pointwise", shapes, expr=expr, shape=shape)
    (kernel,) = check(graph, inputs, rtol=1e-5, atol=1e-6).kernels
    assert kernel.label.endswith("(vec4)")
    assert math.prod(kernel.grid) == node_workgroups(graph, graph[graph.outputs["out"]], GENERIC)
    # a binding is vec4 exactly where its input runs along the last axis
    along = {f"x{i}" for i, s in enumerate(shapes) if s and s[-1] == shape[-1]} | {"out"}
    declared = dict(re.findall(r"var<storage, \w+> (\w+): array<(\w+)", kernel.wgsl))
    assert {name for name, kind in declared.items() if kind == "vec4"} == along


def test_a_vector_read_as_vec4s_and_by_element_in_one_kernel():
    """An input along the last axis and an element of the same vector: one binding, of vec4s, the
    element read by component."""
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (5, 8))
    v = typed_leaf(graph, "input", "v", (8,))
    third = emit(graph, "element", [v], index=3)
    graph.outputs["out"] = emit(graph, "pointwise", [x, third, v], expr="add(mul($0,$1),$2)", shape=(5, 8))
    feeds = {"x": normal(5, 8), "v": normal(8)}
    (kernel,) = check(graph, feeds, rtol=1e-6, atol=1e-6).kernels
    assert [b.name for b in kernel.bindings] == ["x0", "x1", "out"] and "[(3u) / 4u][(3u) % 4u]" in kernel.wgsl


def test_elementwise_kernels_keep_a_thread_per_element_off_whole_vec4s():
    """Rows not a multiple of 4 long, an i32 input or result, a scalar result: a thread an element."""
    for graph in (
        one_op("pointwise", [(7, 33)], expr="exp($0)", shape=(7, 33)),
        one_op("broadcast_to", [(3,)], ["i32"], shape=(2, 3)),
        one_op("broadcast_to", [(4,)], ["i32"], shape=(2, 4)),
        one_op("pointwise", [()], expr="exp($0)", shape=()),
    ):
        (kernel,) = compile_step(graph, GENERIC).kernels
        assert "(vec4)" not in kernel.label and "array<vec4" not in kernel.wgsl, kernel.label
        assert math.prod(kernel.grid) == node_workgroups(graph, graph[graph.outputs["out"]], GENERIC)
    labels = np.arange(8, dtype=np.int32).reshape(2, 4)[0]
    got = run_gpu(one_op("broadcast_to", [(4,)], ["i32"], shape=(2, 4)), {}).run({"x0": labels}, read=("out",))
    np.testing.assert_array_equal(got["out"], np.broadcast_to(labels, (2, 4)))


PERMUTES = [
    ((7, 33), (1, 0)),
    ((1, 65), (1, 0)),
    ((2, 3, 4), (2, 0, 1)),
    ((2, 3, 4), (0, 2, 1)),
    ((2, 3, 4), (1, 0, 2)),
    ((2, 3, 4, 5), (0, 2, 1, 3)),
    ((2, 3, 4, 5), (3, 1, 2, 0)),
    ((2, 1, 7, 5), (2, 3, 1, 0)),
    # the last axis kept, a multiple of 4: a thread per vec4 (ragged outer dims), and not
    ((3, 5, 7, 8), (0, 2, 1, 3)),
    ((2, 9, 3, 64), (0, 2, 1, 3)),
    ((3, 4, 12), (1, 0, 2)),
    ((5, 12), (0, 1)),
    ((2, 3, 6), (1, 0, 2)),
    # batched transposes, the tiled kernel on a GPU: several 32×32 tiles, ragged both ways
    ((37, 70), (1, 0)),
    ((2, 45, 33), (0, 2, 1)),
    ((3, 1, 64, 40), (0, 1, 3, 2)),
]


@pytest.mark.parametrize("tiled_from", [0, None], ids=["tiled", "sized"])
@pytest.mark.parametrize("shape, perm", PERMUTES, ids=lambda v: "x".join(map(str, v)))
def test_permute(shape, perm, tiled_from, monkeypatch):
    """Every permute against numpy; the batched transposes with the tiled kernel forced (from 0
    elements) and as sized (these small ones: the gather)."""
    if tiled_from is not None:
        monkeypatch.setattr(codegen_shape, "TRANSPOSE_MIN_ELEMENTS", tiled_from)
    check(one_op("permute", [shape], perm=perm), {"x0": normal(*shape)}, rtol=0, atol=0)


def test_batched_transposes_take_the_tiled_kernel_on_a_gpu_and_the_gather_on_a_cpu(monkeypatch):
    """A permute swapping the last two axes of TRANSPOSE_MIN_ELEMENTS or more is the tiled
    transpose (shaders/transpose.wgsl) for a GPU, a tile per 32×32 block of each matrix, as the
    cost model counts; a smaller one, and any on a CPU, the gather."""
    assert codegen_shape.tiled_transpose((1536, 576), (1, 0), GENERIC)
    assert not codegen_shape.tiled_transpose((576, 576), (1, 0), GENERIC)  # measured no faster
    assert not codegen_shape.tiled_transpose((1536, 576), (1, 0), Target("lavapipe", 2, 32, cpu=True))
    monkeypatch.setattr(codegen_shape, "TRANSPOSE_MIN_ELEMENTS", 2 * 45 * 33)
    graph = one_op("permute", [(2, 45, 33)], perm=(0, 2, 1))
    x = normal(2, 45, 33)
    executable = check(graph, {"x0": x}, rtol=0, atol=0)
    (kernel,) = executable.kernels
    assert (kernel.entry_point, kernel.workgroup_size) == ("transpose", (32, 8, 1))
    assert math.prod(kernel.grid) == 2 * 2 * 2 == node_workgroups(graph, graph[1], GENERIC)
    cpu = Target("lavapipe", 2, 32, cpu=True)
    (kernel,) = compile_step(graph, cpu).kernels
    assert kernel.entry_point == "elementwise" and math.prod(kernel.grid) == node_workgroups(graph, graph[1], cpu)
    not_last_two = one_op("permute", [(2, 45, 33)], perm=(1, 0, 2))
    assert [k.entry_point for k in compile_step(not_last_two, GENERIC).kernels] == ["elementwise"]


def test_tiled_transpose_i32(monkeypatch):
    monkeypatch.setattr(codegen_shape, "TRANSPOSE_MIN_ELEMENTS", 0)
    labels = np.arange(2 * 40 * 35, dtype=np.int32).reshape(2, 40, 35)
    got = run_gpu(one_op("permute", [labels.shape], ["i32"], perm=(0, 2, 1)), {}).run({"x0": labels}, read=("out",))
    assert got["out"].dtype == np.int32
    np.testing.assert_array_equal(got["out"], labels.transpose(0, 2, 1))


def test_permutes_keeping_a_last_axis_of_vec4s_move_vec4s():
    """A permute that keeps its last axis in place, a multiple of 4 long, runs a thread per vec4
    (input and output bound as vec4 arrays), as the cost model counts it; any other, the gather."""
    graph = one_op("permute", [(3, 5, 7, 8)], perm=(0, 2, 1, 3))
    x = normal(3, 5, 7, 8)
    (kernel,) = check(graph, {"x0": x}, rtol=0, atol=0).kernels
    assert kernel.label.endswith("(vec4)") and "array<vec4<f32>>" in kernel.wgsl
    assert math.prod(kernel.grid) == 1 == node_workgroups(graph, graph[1], GENERIC)  # 210 vec4s
    labels = np.arange(2 * 9 * 3 * 64, dtype=np.int32).reshape(2, 9, 3, 64)
    got = run_gpu(one_op("permute", [labels.shape], ["i32"], perm=(0, 2, 1, 3)), {}).run({"x0": labels}, read=("out",))
    np.testing.assert_array_equal(got["out"], labels.transpose(0, 2, 1, 3))
    for shape, perm in (((2, 3, 6), (1, 0, 2)), ((2, 3, 4), (0, 2, 1))):
        (kernel,) = compile_step(one_op("permute", [shape], perm=perm), GENERIC).kernels
        assert "array<vec4" not in kernel.wgsl and "(vec4)" not in kernel.label, (shape, perm)


def test_permute_i32():
    labels = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    got = run_gpu(one_op("permute", [(2, 3, 4)], ["i32"], perm=(2, 0, 1)), {}).run({"x0": labels}, read=("out",))
    assert got["out"].dtype == np.int32
    np.testing.assert_array_equal(got["out"], labels.transpose(2, 0, 1))


# -- reductions: sum, max, fused_reduce -----------------------------------------------------------

SUMS = [
    ((7, 33), (0,)),
    ((7, 33), (1,)),
    ((7, 33), (0, 1)),
    ((2, 3, 4, 5), (1, 3)),
    ((2, 3, 4, 5), (0, 2)),
    ((2, 3, 4, 5), (3,)),
    ((3, 1000), (1,)),  # long rows: a workgroup per output
    ((40, 300), (0,)),  # short columns: a thread per output
    ((300, 5), (0,)),  # long columns, few outputs: 16 outputs a workgroup, 16 threads each
    ((257, 37), (0,)),  # long columns, outputs not a multiple of 16, rows not of the 16 lanes
    ((3, 131, 7, 5), (0, 1)),  # outer dims reduced: neighbouring outputs are neighbouring words
    ((2000,), (0,)),
    ((), ()),
]


@pytest.mark.parametrize("keepdim", [False, True], ids=["drop", "keep"])
@pytest.mark.parametrize("shape, axes", SUMS, ids=lambda v: "x".join(map(str, v)) if v else "scalar")
def test_sum(shape, axes, keepdim):
    """Every shape with a GPU's kernels and with a CPU's: long column sums take a workgroup per
    output on a GPU and 16 outputs a workgroup on a CPU (codegen/reduce.py `reduce_plan`)."""
    graph, x = one_op("sum", [shape], axes=axes, keepdim=keepdim), normal(*shape)
    entries = {t.cpu: check(graph, {"x0": x}, 1e-5, 1e-4, t).kernels[0].entry_point for t in (GENERIC, CPU)}
    if shape == (3, 1000):
        assert entries == {False: "reduce_tree", True: "reduce_tree"}
    if shape == (40, 300):
        assert entries == {False: "reduce_serial", True: "reduce_serial"}
    if shape in ((300, 5), (257, 37), (3, 131, 7, 5)):
        assert entries == {False: "reduce_tree", True: "reduce_columns"}


@pytest.mark.parametrize(
    "shape", [(2, 3, 129, 64), (5, 131, 33), (77, 5), (40, 1)], ids=lambda s: "x".join(map(str, s))
)
def test_a_short_row_reduction_runs_lanes_of_a_row_on_a_gpu(shape):
    """A sum over the innermost dim of at most 64 elements (attention's rows' Dᵢ = dOᵢ·Oᵢ over
    head_dim): on a GPU reduce_rows, `row_lanes` neighbouring threads a row and 256 / lanes rows a
    workgroup (ragged: rows not a multiple of the workgroup's, lengths not of the lanes); on a CPU
    a thread a row. Both agree with the interpreter."""
    from meganeura.codegen.reduce import ROW_WG, row_lanes

    axes = (len(shape) - 1,)
    attrs = {"kind": "sum", "axes": axes, "keepdim": False, "in_shape": shape}
    graph = one_op("fused_reduce", [shape, shape], prologue="mul($0,$1)", epilogue="$r", **attrs)
    inputs = {"x0": normal(*shape), "x1": normal(*shape)}
    gpu, cpu = (check(graph, inputs, 1e-5, 1e-5, t).kernels[0] for t in (GENERIC, CPU))
    assert (gpu.entry_point, cpu.entry_point) == ("reduce_rows", "reduce_serial")
    rows, lanes = int(np.prod(shape[:-1])), row_lanes(shape[-1])
    assert lanes == min(16, 1 << (shape[-1] - 1).bit_length())
    assert gpu.workgroup_size == (ROW_WG, 1, 1) and int(np.prod(gpu.grid)) >= -(-rows // (ROW_WG // lanes))


@pytest.mark.parametrize(
    "kind, shape, axes, splits, entry",
    [
        ("sum", (2600, 37), (0,), 1, "reduce_tree"),  # a column sum: 2600 = 10 · 256 + 40 a workgroup
        ("max", (3, 701, 7, 5), (0, 1), 1, "reduce_tree"),
        ("sum", (5000, 3, 5), (0,), 3, "reduce_tree"),  # parts of 1667 and 1666: ragged against 4 · 256
        ("sum", (6, 1297), (1,), 1, "reduce_tree"),  # along the innermost dim, past what row lanes take
        ("sum", (7, 300, 5), (0,), 1, "reduce_serial"),  # a split product's 7 partials: 4 + a rest of 3
        ("max", (2, 11, 3, 13), (0, 2), 1, "reduce_serial"),
        ("sum", (30, 301), (0,), 3, "reduce_serial"),  # parts of 10: two walks of 4 and a rest of 2
    ],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v),
)
def test_a_reduction_on_a_gpu_carries_several_accumulators_a_thread(kind, shape, axes, splits, entry):
    """On a GPU reduce_tree and reduce_serial walk a thread's elements with TREE_UNROLL and
    SERIAL_UNROLL accumulators (codegen/reduce.py `part_loop`), the rest of a part that does not
    fill them by the first; at lengths that are not multiples of the walk, split or not, each
    agrees with the interpreter. On a CPU a thread keeps one accumulator."""
    from meganeura.codegen.reduce import SERIAL_UNROLL, TREE_UNROLL

    unroll, stride = (TREE_UNROLL, 256) if entry == "reduce_tree" else (SERIAL_UNROLL, 1)
    part = -(-int(np.prod([shape[d] for d in axes])) // splits)
    assert unroll > 1 and part > stride * unroll and part % (stride * unroll)  # the unrolled walk runs, and a rest
    attrs = {"kind": kind, "axes": axes, "keepdim": False, "in_shape": shape, "splits": splits}
    graph = one_op("fused_reduce", [shape], prologue="mul($0,$0)" if kind == "sum" else "$0", epilogue="$r", **attrs)
    gpu = check(graph, {"x0": normal(*shape)}, 1e-5, 1e-5, GENERIC).kernels[0]
    assert gpu.entry_point == entry and f"acc_{unroll - 1}" in gpu.wgsl and f"acc_{unroll} " not in gpu.wgsl
    cpu = check(graph, {"x0": normal(*shape)}, 1e-5, 1e-5, CPU).kernels[0]
    assert "acc_1" not in cpu.wgsl


def test_a_short_reduction_with_many_outputs_runs_wide_workgroups_on_a_gpu():
    """A sum over 3 of [2, 3, 3, 129, 101] (dK's group sum, ragged: 78,174 outputs): on a GPU
    reduce_serial in workgroups of 256 threads (codegen/reduce.py SERIAL_WIDE_OUTPUTS), on a CPU
    of 64; fewer outputs keep 64; the sums agree with the interpreter."""
    from meganeura.codegen.reduce import SERIAL_WIDE_OUTPUTS

    graph, x = one_op("sum", [(2, 3, 3, 129, 101)], axes=(2,), keepdim=False), normal(2, 3, 3, 129, 101)
    assert 2 * 3 * 129 * 101 >= SERIAL_WIDE_OUTPUTS
    sizes = {t.cpu: check(graph, {"x0": x}, 1e-5, 1e-5, t).kernels[0].workgroup_size for t in (GENERIC, CPU)}
    assert sizes == {False: (256, 1, 1), True: (64, 1, 1)}
    small = one_op("sum", [(2, 3, 3, 13, 11)], axes=(2,), keepdim=False)
    assert check(small, {"x0": normal(2, 3, 3, 13, 11)}, 1e-5, 1e-5).kernels[0].workgroup_size == (64, 1, 1)


@pytest.mark.parametrize("shape, axes", SUMS, ids=lambda v: "x".join(map(str, v)) if v else "scalar")
def test_max_with_ties(shape, axes):
    x = np.round(normal(*shape, scale=2.0)) - 10.0  # integers, all negative: many ties, and 0 is no maximum
    for keepdim in (False, True):
        check(one_op("max", [shape], axes=axes, keepdim=keepdim), {"x0": x}, rtol=0, atol=0)


RMS = ("mul($0,$0)", "rsqrt(add(mul($r,0.125),1e-05))")
# (kind, prologue, epilogue, input shapes (the first is in_shape), axes)
FUSED_REDUCES = [
    ("sum", *RMS, [(7, 8)], (1,)),
    ("sum", *RMS, [(3, 5, 8), (8,)], (0, 2)),
    ("sum", "exp(sub($0,$1))", "log($r)", [(7, 33), (7, 1)], (1,)),  # log Σ exp(x − max)
    ("sum", "mul(mul($0,$1),$2)", "mul($r,-0.5)", [(40, 300), (300,), ()], (0,)),
    ("sum", "mul($0,$1)", "$r", [(3, 1000), (3, 1000)], (1,)),
    ("sum", "1.0", "$r", [(2, 3, 4, 5)], (1, 3)),
    ("max", "$0", "$r", [(2, 3, 4, 5)], (0, 2)),
    ("max", "mul($0,$1)", "neg($r)", [(7, 33), (1, 33)], (0,)),
    ("max", "add($0,$1)", "exp($r)", [(300, 5), (300, 1)], (0, 1)),
    ("max", "swiglu($0,$1)", "sigmoid($r)", [(33, 300), (33, 300)], (1,)),
    ("max", "$0", "$r", [()], ()),
    # an RMSNorm weight's gradient Σ g·x·r over (batch, seq): reduce_columns, r broadcast per row
    ("sum", "mul(mul($0,$1),$2)", "$r", [(3, 43, 37), (3, 43, 37), (3, 43, 1)], (0, 1)),
    ("max", "add($0,$1)", "neg($r)", [(129, 19), (19,)], (0,)),
]


@pytest.mark.parametrize("keepdim", [False, True], ids=["drop", "keep"])
@pytest.mark.parametrize(
    "kind, prologue, epilogue, shapes, axes",
    FUSED_REDUCES,
    ids=[f"{k}-{'x'.join(map(str, s[0]))}-{a}-{p}-{e}" for k, p, e, s, a in FUSED_REDUCES],
)
def test_fused_reduce(kind, prologue, epilogue, shapes, axes, keepdim):
    attrs = {"kind": kind, "axes": axes, "keepdim": keepdim, "in_shape": shapes[0]}
    graph = one_op("fused_reduce", shapes, prologue=prologue, epilogue=epilogue, **attrs)
    inputs = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}
    if "exp(sub" in prologue:
        inputs["x1"] = inputs["x0"].max(axis=1, keepdims=True)
    for target in (GENERIC, CPU):
        check(graph, inputs, rtol=1e-5, atol=1e-5, target=target)


# (kind, prologue, epilogue, input shapes (the first is in_shape), axes, keepdim, the GPU's and the
# CPU's entry points): epilogues that read tensors at the output element, every entry point.
EPILOGUE_EXTRAS = [
    ("sum", "$0", "add($r,$1)", [(3, 1000), (3,)], (1,), False, "reduce_tree", "reduce_tree"),
    ("sum", "mul($0,$0)", "mul($1,rsqrt($r))", [(7, 33), (7, 1)], (1,), True, "reduce_rows", "reduce_serial"),
    ("sum", "$0", "relu(add($r,$1))", [(4, 37, 45), (37, 45)], (0,), False, "reduce_serial", "reduce_serial"),
    ("max", "$0", "sub($1,$r)", [(300, 5), (5,)], (0,), False, "reduce_tree", "reduce_columns"),
    ("sum", "mul($0,$1)", "add(add($2,$r),$1)", [(7, 33), (33,), (1,)], (0,), False, None, None),  # $1 in both
    ("sum", "$0", "mul($r,$1)", [(3, 131, 7, 5), (5,)], (0, 1), False, "reduce_tree", "reduce_columns"),
]


@pytest.mark.parametrize(
    "kind, prologue, epilogue, shapes, axes, keepdim, gpu_entry, cpu_entry",
    EPILOGUE_EXTRAS,
    ids=[f"{k}-{'x'.join(map(str, s[0]))}-{a}-{e}" for k, _, e, s, a, *_ in EPILOGUE_EXTRAS],
)
def test_fused_reduce_epilogue_reads_tensors_at_the_output_element(
    kind, prologue, epilogue, shapes, axes, keepdim, gpu_entry, cpu_entry
):
    """The epilogue's extras (the residual after a split product's sum, a bias before its
    activation) broadcast to the output and are read at its element, in every entry point, on a
    GPU's kernels and a CPU's."""
    attrs = {"kind": kind, "axes": axes, "keepdim": keepdim, "in_shape": shapes[0]}
    graph = one_op("fused_reduce", shapes, prologue=prologue, epilogue=epilogue, **attrs)
    inputs = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}
    for target, entry in ((GENERIC, gpu_entry), (CPU, cpu_entry)):
        spec = check(graph, inputs, rtol=1e-5, atol=1e-5, target=target).kernels[0]
        assert entry is None or spec.entry_point == entry, (target.name, spec.entry_point)


# (kind, prologue, epilogue, input shapes (the first is in_shape), axes, keepdim, splits): reductions
# that keep the innermost dim (a multiple of 4) and write 65,536 values or more, which a GPU's
# reduce_serial computes four neighbouring outputs a thread (codegen/reduce.py `reduces_vec4s`);
# every other dim ragged; inputs along the innermost dim (vec4 loads) and broadcast along it (one
# scalar for the four), at (o, r) and at the output element, constants inlined.
VEC4_REDUCES = [
    ("sum", "$0", "$r", [(3, 17, 3860)], (0,), False, 1),  # a split product's partials
    ("sum", "$0", "$r", [(2, 3, 11, 2980)], (1,), True, 1),  # dK's group sum, over a middle axis
    (
        "sum",
        "mul(mul($0,$1),0.5)",
        "add($2,mul($r,$3))",
        [(3, 17, 3860), (3, 17, 1), (17, 3860), (17, 1)],
        (0,),
        False,
        1,
    ),
    ("max", "add($0,$1)", "neg($r)", [(5, 67, 1012), (1012,)], (0,), False, 1),
    ("sum", "mul($0,$1)", "$r", [(4, 17, 3860), (1,)], (0,), False, 2),  # the first level of a split
]


@pytest.mark.parametrize(
    "kind, prologue, epilogue, shapes, axes, keepdim, splits",
    VEC4_REDUCES,
    ids=[f"{k}-{'x'.join(map(str, s[0]))}-{a}-{p}-{e}-{n}" for k, p, e, s, a, _, n in VEC4_REDUCES],
)
def test_reductions_keeping_the_innermost_dim_take_four_outputs_a_thread(
    kind, prologue, epilogue, shapes, axes, keepdim, splits
):
    attrs = {"kind": kind, "axes": axes, "keepdim": keepdim, "in_shape": shapes[0], "splits": splits}
    graph = one_op("fused_reduce", shapes, prologue=prologue, epilogue=epilogue, **attrs)
    inputs = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}
    spec = check(graph, inputs, rtol=1e-5, atol=1e-5).kernels[0]
    assert spec.entry_point == "reduce_serial" and ", vec4)" in spec.label
    node = graph[graph.outputs["out"]]
    # the cost model counts the workgroups dispatched: 256 threads (SERIAL_WIDE_OUTPUTS), 4 outputs each
    assert math.prod(spec.grid) == node_workgroups(graph, node, GENERIC) == -(-node.type.numel // 4 // 256)
    assert "array<vec4<f32>>" in spec.wgsl and "alias item_t = vec4<f32>;" in spec.wgsl
    cpu = check(graph, inputs, rtol=1e-5, atol=1e-5, target=CPU).kernels[0]  # a CPU's, one output a thread
    assert "vec4" not in cpu.label


# (kind, prologue, epilogue, input shapes (the first is in_shape), keepdim): reductions over the
# innermost dim alone (a multiple of 4, at most 64 long), which a GPU's reduce_rows walks as vec4s
# (codegen/reduce.py `rows_vec4s`): attention's rows' D, a row scale broadcast along the row, a
# constant, 8 elements (2 lanes), and an epilogue extra at the output element.
ROW_VEC4_REDUCES = [
    ("sum", "mul($0,$1)", "$r", [(3, 5, 7, 64), (3, 5, 7, 64)], False),
    ("sum", "mul(mul($0,$1),0.5)", "add($r,$2)", [(5, 7, 64), (5, 7, 1), (5, 7)], False),
    ("max", "$0", "neg($r)", [(9, 8)], True),
    ("sum", "exp($0)", "log($r)", [(33, 44)], True),
]


@pytest.mark.parametrize(
    "kind, prologue, epilogue, shapes, keepdim",
    ROW_VEC4_REDUCES,
    ids=[f"{k}-{'x'.join(map(str, s[0]))}-{p}-{e}" for k, p, e, s, _ in ROW_VEC4_REDUCES],
)
def test_row_reductions_read_their_rows_as_vec4s(kind, prologue, epilogue, shapes, keepdim):
    in_shape = shapes[0]
    attrs = {"kind": kind, "axes": (len(in_shape) - 1,), "keepdim": keepdim, "in_shape": in_shape}
    graph = one_op("fused_reduce", shapes, prologue=prologue, epilogue=epilogue, **attrs)
    inputs = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}
    spec = check(graph, inputs, rtol=1e-5, atol=1e-5).kernels[0]
    assert spec.entry_point == "reduce_rows" and ", vec4 rows)" in spec.label
    assert f"const R: u32 = {in_shape[-1] // 4}u;" in spec.wgsl and "x0: array<vec4<f32>>" in spec.wgsl
    node = graph[graph.outputs["out"]]
    lanes = min(16, 1 << (in_shape[-1] // 4 - 1).bit_length())  # a vec4 of the row a lane, 256 threads a workgroup
    assert math.prod(spec.grid) == node_workgroups(graph, node, GENERIC) == -(-node.type.numel // (256 // lanes))


def test_a_vector_read_along_the_innermost_dim_and_by_element_in_one_reduction():
    """A vector read as vec4s along the innermost dim, and one element of it (a view: a scalar at
    an offset in the same binding) read by component from that vec4 binding."""
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (2, 16400, 4))
    v = typed_leaf(graph, "input", "v", (4,))
    second = emit(graph, "element", [v], index=1)
    attrs = {"kind": "sum", "axes": (0,), "keepdim": False, "in_shape": (2, 16400, 4)}
    graph.outputs["out"] = emit(
        graph, "fused_reduce", [x, v, second], prologue="mul($0,$1)", epilogue="mul($r,$2)", **attrs
    )
    spec = check(graph, {"x": normal(2, 16400, 4), "v": normal(4)}, rtol=1e-5, atol=1e-5).kernels[0]
    assert ", vec4)" in spec.label and "[(1u) / 4u][(1u) % 4u]" in spec.wgsl


def test_fused_reduce_inlines_constants_and_reads_repeated_inputs_once():
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (7, 33))
    scale = emit(graph, "reshape", [const(graph, 0.25)], shape=(1, 1))
    attrs = {"kind": "sum", "axes": (1,), "keepdim": True, "in_shape": (7, 33)}
    graph.outputs["out"] = emit(graph, "fused_reduce", [x, scale, x], prologue="mul(mul($0,$2),$1)", **attrs)
    spec = check(graph, {"x": normal(7, 33)}, rtol=1e-5, atol=1e-5).kernels[0]
    assert [b.name for b in spec.bindings] == ["x0", "out"] and "(0.25f)" in spec.wgsl


# -- cross-entropy --------------------------------------------------------------------------------


@pytest.mark.parametrize("rows, classes", [(1, 3), (5, 10), (33, 300)])
def test_cross_entropy_rows(rows, classes):
    logits = normal(rows, classes, scale=30.0)  # large logits: only a max-shifted softmax survives
    labels = RNG.integers(0, classes, size=rows).astype(np.int32)
    graph = one_op("cross_entropy_rows", [(rows, classes), (rows,)], ["f32", "i32"])
    check(graph, {"x0": logits, "x1": labels}, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows, classes", [(1, 3), (5, 10), (33, 300)])
def test_cross_entropy_rows_grad(rows, classes):
    logits = normal(rows, classes, scale=30.0)
    labels = RNG.integers(0, classes, size=rows).astype(np.int32)
    graph = one_op("cross_entropy_rows_grad", [(rows, classes), (rows,), (rows,)], ["f32", "i32", "f32"])
    check(graph, {"x0": logits, "x1": labels, "x2": normal(rows)}, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "grad"])
def test_cross_entropy_rows_in_one_pass_agree_where_the_row_max_keeps_moving(grad):
    """The kernels read a row's max and Σ exp(z − max) in one pass (cross_entropy.wgsl `row_stats`):
    each thread's running sum is rescaled whenever its max grows. Rows of 5,001 logits (about 20
    a thread, ragged against 256 threads) rising (the max moves at every element), falling,
    constant, and at a scale where exp(z − any stale max) would overflow, agree with the interpreter."""
    classes = 5001
    ramp = np.linspace(-40.0, 40.0, classes)
    logits = np.stack([ramp, ramp[::-1], np.zeros(classes), 50.0 * normal(classes)]).astype(np.float32)
    labels = np.array([classes - 1, 0, 17, 4000], np.int32)
    if grad:
        graph = one_op("cross_entropy_rows_grad", [(4, classes), (4,), (4,)], ["f32", "i32", "f32"])
        check(graph, {"x0": logits, "x1": labels, "x2": normal(4)}, rtol=1e-4, atol=1e-6)
    else:
        graph = one_op("cross_entropy_rows", [(4, classes), (4,)], ["f32", "i32"])
        check(graph, {"x0": logits, "x1": labels}, rtol=1e-5, atol=1e-4)


def test_cross_entropy_grad_with_a_constant_incoming_gradient():
    graph = Graph()
    logits, labels = typed_leaf(graph, "input", "z", (1, 7)), typed_leaf(graph, "input", "y", (1,), "i32")
    scale = emit(graph, "reshape", [const(graph, 0.5)], shape=(1,))
    graph.outputs["out"] = emit(graph, "cross_entropy_rows_grad", [logits, labels, scale])
    executable = check(graph, {"z": normal(1, 7), "y": np.array([6], np.int32)})
    assert [b.name for b in executable.kernels[0].bindings] == ["logits", "labels", "out"]


# -- softmax family and label indexing ------------------------------------------------------------

ROW_SHAPES = [((1, 3), 1), ((5, 10), 1), ((33, 300), 1), ((4,), 0), ((3, 7, 5), 1), ((3, 7, 5), 0), ((2, 3, 33), -1)]


def row_id(case) -> str:
    return "x".join(map(str, case)) if isinstance(case, tuple) else str(case)


@pytest.mark.parametrize("shape, axis", ROW_SHAPES, ids=row_id)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_and_log_softmax_along_any_axis(op, shape, axis):
    x = normal(*shape, scale=30.0)  # large logits: only a max-shifted softmax survives
    x.flat[0] = 90.0  # exp(90) overflows f32
    check(one_op(op, [shape], axis=axis), {"x0": x}, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape, axis", ROW_SHAPES, ids=row_id)
@pytest.mark.parametrize("op", ["softmax_grad", "log_softmax_grad"])
def test_softmax_gradients_along_any_axis(op, shape, axis):
    logits = normal(*shape, scale=3.0)
    y = op_def("softmax" if op == "softmax_grad" else "log_softmax").evaluate(logits, axis)
    graph = one_op(op, [shape, shape], axis=axis)
    check(graph, {"x0": y.astype(np.float32), "x1": normal(*shape)}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rows, classes", [(1, 3), (5, 10), (33, 300)])
def test_pick_and_scatter_rows(rows, classes):
    labels = RNG.integers(0, classes, size=rows).astype(np.int32)
    check(one_op("pick", [(rows, classes), (rows,)], ["f32", "i32"]), {"x0": normal(rows, classes), "x1": labels})
    graph = one_op("scatter_rows", [(rows,), (rows,)], ["f32", "i32"], classes=classes)
    check(graph, {"x0": normal(rows), "x1": labels})


def test_pick_and_scatter_rows_give_nan_for_bad_labels():
    labels = np.array([0, -1, 4, 3], np.int32)  # 4 classes: -1 and 4 are outside
    pick = one_op("pick", [(4, 4), (4,)], ["f32", "i32"])
    picked = run_gpu(pick, {}).run({"x0": normal(4, 4), "x1": labels}, read=("out",))["out"]
    assert np.isnan(picked).tolist() == [False, True, True, False]
    graph = one_op("scatter_rows", [(4,), (4,)], ["f32", "i32"], classes=4)
    scattered = run_gpu(graph, {}).run({"x0": normal(4), "x1": labels}, read=("out",))["out"]
    assert np.isnan(scattered).all(axis=1).tolist() == [False, True, True, False]
    check(graph, {"x0": normal(4), "x1": labels})  # the interpreter agrees (NaN rows too)


def test_scatter_rows_inlines_a_constant_gradient():
    graph = Graph()
    labels = typed_leaf(graph, "input", "y", (1,), "i32")
    g = emit(graph, "reshape", [const(graph, 0.5)], shape=(1,))
    graph.outputs["out"] = emit(graph, "scatter_rows", [g, labels], classes=5)
    spec = check(graph, {"y": np.array([3], np.int32)}).kernels[0]
    assert [b.value for b in spec.bindings] == [labels, graph.outputs["out"]] and "(0.5f)" in spec.wgsl


# -- optimizer updates ----------------------------------------------------------------------------


# Each single-tensor update: its tensor operands (the first is the leaf it replaces; "p" a
# parameter, the others optimizer states or inputs) and its hyper-parameter operands, as fields of
# a group's vector.
UPDATE_OPERANDS = {
    "sgd_step": (("p", "d"), ("lr", "weight_decay")),
    "momentum_buffer": (("buf", "g", "p"), ("momentum", "dampening_factor", "weight_decay")),
    "adam_moment": (("m", "g", "p"), ("beta", "weight", "weight_decay")),
    "adam_step": (("p", "m", "v"), ("step_size", "bias_correction2_sqrt", "eps", "decay")),
    "rms_step": (("p", "g", "s", "a"), ("lr", "eps", "weight_decay")),
    "rms_buffer": (("buf", "g", "p", "s", "a"), ("momentum", "eps", "weight_decay")),
    "adamax_norm": (("u", "g", "p"), ("beta2", "eps", "weight_decay")),
    "adamax_step": (("p", "m", "u"), ("step_size",)),
    "nadam_step": (
        ("p", "g", "m", "v"),
        ("grad_step_size", "momentum_step_size", "bias_correction2", "eps", "weight_decay", "decay"),
    ),
    "radam_step": (
        ("p", "m", "v"),
        ("lr", "bias_correction1", "bias_correction2_sqrt", "eps", "rectification", "decay"),
    ),
    "adadelta_delta": (("g", "p", "s", "acc"), ("eps", "weight_decay")),
}
FIELD = {"beta": "beta2", "weight": "one_minus_beta2"}  # adam_moment's operands as Adam's fields


def hyper_operands(graph: Graph, states: dict, op: str, values: dict) -> list[int]:
    """`op`'s hyper-parameter operands as optim/optimizers.py builds them: elements of a group's
    vector (a state leaf the runtime writes, laid out as HYPER_FIELDS), a weight decay of 0 as the
    constant 0 (inlined)."""
    names = UPDATE_OPERANDS[op][1]
    vector = typed_leaf(graph, "state", "hyper", (len(HYPER_FIELDS),))
    states["hyper"] = hyper_vector({FIELD.get(name, name): values[name] for name in names})
    operands = []
    for name in names:
        if name == "weight_decay" and values[name] == 0.0:
            operands.append(const(graph, 0.0))
        else:
            operands.append(emit(graph, "element", [vector], index=hyper_offset(FIELD.get(name, name))))
    return operands


def optimizer_graph(op: str, **values) -> tuple[Graph, dict, dict, dict]:
    """A graph updating one leaf with `op` (its first tensor operand: the parameter "p" or the
    state "buf"), with values for its leaves: the other tensors are inputs (second moments and
    square averages positive, the centered average smaller than its square's root)."""
    graph, shape = Graph(), (7, 33)
    attrs = {"order": values.pop("order")} if "order" in values else {}
    tensors, _ = UPDATE_OPERANDS[op]
    params, states, inputs, leaves = {}, {}, {}, {}
    for name in tensors:
        if name == "p" and tensors[0] != "p" and values.get("weight_decay") == 0.0:
            leaves["p"] = const(graph, 0.0)  # p only where it is decayed
            continue
        value = normal(*shape)
        if name in ("v", "s", "u", "acc"):
            value = np.abs(value) + 0.5
        elif name == "a":
            value = value * 0.2  # a·a < s: the centered variance stays positive
        if name == "p":
            leaves[name], params[name] = typed_leaf(graph, "param", name, shape), value
        elif name == tensors[0]:
            leaves[name], states[name] = typed_leaf(graph, "state", name, shape), value
        else:
            leaves[name], inputs[name] = typed_leaf(graph, "input", name, shape), value
    operands = [leaves[name] for name in tensors] + hyper_operands(graph, states, op, values)
    graph.updates[tensors[0]] = emit(graph, op, operands, **attrs)
    return graph, params, states, inputs


OPTIMIZER_CASES = [
    ("sgd_step", {"lr": 0.1, "weight_decay": 0.01}),
    ("momentum_buffer", {"momentum": 0.9, "dampening_factor": 0.7, "weight_decay": 0.001}),
    ("adam_moment", {"beta": 0.9, "weight": 0.1, "order": 1, "weight_decay": 0.01}),
    ("adam_moment", {"beta": 0.3, "weight": 0.7, "order": 1, "weight_decay": 0.0}),  # lerp's other form
    ("adam_moment", {"beta": 0.999, "weight": 0.001, "order": 2, "weight_decay": 0.0}),
    ("adam_step", {"step_size": 0.1, "bias_correction2_sqrt": 0.0316, "eps": 1e-8, "decay": 1.0}),
    ("adam_step", {"step_size": 0.01, "bias_correction2_sqrt": 0.3, "eps": 1e-3, "decay": 0.999}),
    ("rms_step", {"lr": 0.01, "eps": 1e-8, "weight_decay": 0.1}),
    ("rms_buffer", {"momentum": 0.9, "eps": 1e-3, "weight_decay": 0.0}),
    ("adamax_norm", {"beta2": 0.999, "eps": 1e-3, "weight_decay": 0.01}),
    ("adamax_norm", {"beta2": 0.5, "eps": 1e-8, "weight_decay": 0.0}),  # |g| wins more often
    ("adamax_step", {"step_size": 0.01}),
    ("nadam_step", {"grad_step_size": 0.005, "momentum_step_size": 0.009, "bias_correction2": 0.03, "eps": 1e-8,
                    "weight_decay": 0.1, "decay": 1.0}),
    ("nadam_step", {"grad_step_size": 0.02, "momentum_step_size": 0.05, "bias_correction2": 0.5, "eps": 1e-3,
                    "weight_decay": 0.0, "decay": 0.999}),  # decoupled weight decay
    ("radam_step", {"lr": 0.01, "bias_correction1": 0.4, "bias_correction2_sqrt": 0.2, "eps": 1e-8,
                    "rectification": 0.3, "decay": 1.0}),
    ("radam_step", {"lr": 0.01, "bias_correction1": 0.4, "bias_correction2_sqrt": 0.2, "eps": 1e-8,
                    "rectification": 0.0, "decay": 0.999}),  # not rectified (torch's ρₜ ≤ 5)
    ("adadelta_delta", {"eps": 1e-6, "weight_decay": 0.1}),
]  # fmt: skip


@pytest.mark.parametrize("op, attrs", OPTIMIZER_CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_optimizer_updates_in_place_over_two_steps(op, attrs):
    graph, params, states, inputs = optimizer_graph(op, **attrs)
    parameters = {name: nn.Parameter(value) for name, value in params.items()}
    executable = Executable(compile_step(graph), default_device(), parameters, states)
    update = next(spec for spec in executable.kernels if spec.entry_point == "optimizer_update")
    assert update.inplace_input is not None and "in place" in update.label
    expected_params, expected_states = dict(params), dict(states)
    for _ in range(2):
        executable.run(inputs)
        result = interpret(graph, inputs, expected_params, expected_states, dtype=np.float64)
        for name, value in result.updates.items():
            (expected_params if name in expected_params else expected_states)[name] = value
    # float32 on the device against a float64 reference: Adam's m̂/(√v̂+ε) amplifies rounding in
    # v by up to ~1/ε, so parameters get an absolute tolerance of 1e-3 of a 0.01 step.
    for name, value in expected_params.items():
        np.testing.assert_allclose(parameters[name].numpy(), value, rtol=1e-5, atol=1e-5, err_msg=name)
    for name, value in expected_states.items():
        np.testing.assert_allclose(executable.read_state(name), value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_adamax_norm_kernel_keeps_nan_from_either_side():
    """adamax_norm's own kernel (the e-graph may extract its lifted form instead): torch.maximum's
    NaN where u·β₂ or |g| + eps is NaN, which WGSL's max would drop."""
    graph = Graph()
    u, g = typed_leaf(graph, "input", "u", (4, 3)), typed_leaf(graph, "input", "g", (4, 3))
    zero = const(graph, 0.0)
    graph.outputs["out"] = emit(graph, "adamax_norm", [u, g, zero, const(graph, 0.9), const(graph, 1e-3), zero])
    u_value, g_value = np.abs(normal(4, 3)), normal(4, 3)
    u_value[0, 0], g_value[1, 1], g_value[2, 2] = np.nan, np.nan, -np.inf
    executable = check(graph, {"u": u_value, "g": g_value})
    out = executable.run({"u": u_value, "g": g_value}, read=("out",))["out"]
    assert np.isnan(out[0, 0]) and np.isnan(out[1, 1]) and out[2, 2] == np.inf and np.isfinite(out).sum() == 9


def test_optimizer_out_of_place_with_scalar_operands():
    """An update that is not a leaf's update gets its own output buffer; shape-() operands broadcast."""
    graph = Graph()
    p, d = typed_leaf(graph, "input", "p", (5, 3)), typed_leaf(graph, "input", "d", ())
    half, decay = const(graph, 0.5), const(graph, 0.1)
    graph.outputs["out"] = emit(graph, "sgd_step", [p, d, half, decay])
    graph.outputs["m"] = emit(graph, "momentum_buffer", [p, const(graph, 2.0), p, half, half, decay])
    executable = check(graph, {"p": normal(5, 3), "d": normal()})
    assert all(spec.inplace_input is None for spec in executable.kernels)


def test_elements_of_one_vector_share_its_binding():
    """A kernel reading several `element`s of one vector (a parameter group's hyper-parameters)
    binds the vector once and reads each at its literal offset."""
    graph = Graph()
    x, v = typed_leaf(graph, "input", "x", (5, 3)), typed_leaf(graph, "input", "v", (4,))
    lr, wd = emit(graph, "element", [v], index=1), emit(graph, "element", [v], index=3)
    graph.outputs["out"] = emit(graph, "sgd_step", [x, x, lr, wd])
    (spec,) = check(graph, {"x": normal(5, 3), "v": normal(4)}).kernels
    assert [b.value for b in spec.bindings] == [x, v, graph.outputs["out"]]
    assert "x1[1u]" in spec.wgsl and "x1[3u]" in spec.wgsl
    for shape, index in (((2, 2), 0), ((4,), 4)):
        with pytest.raises(ShapeError, match="element"):
            infer_type("element", [TensorType(shape)], {"index": index})


def test_every_lowered_op_is_in_the_op_table_and_every_kernel_op_is_lowered():
    for op in LOWERINGS:
        assert op_def(op).name == op
    assert {op for op in OPS if launches_kernel(op)} == set(LOWERINGS)


def test_fused_nodes_with_unknown_attributes_are_refused():
    """The retired `activation` attribute must fail loudly (the op's schema), not lower to a plain matmul."""
    graph = Graph()
    a, b = typed_leaf(graph, "input", "a", (4, 3)), typed_leaf(graph, "input", "b", (3, 5))
    with pytest.raises(ShapeError, match=r"unknown attribute\(s\) \['activation'\]"):
        emit(graph, "fused_matmul", [a, b], activation="relu")
