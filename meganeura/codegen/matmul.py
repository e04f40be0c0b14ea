"""Lowering of matmul and fused_matmul: a tiled, register-blocked, batched GEMM with transposes, a
prologue on A's load and an epilogue on the result (shaders/matmul.wgsl).
"""

from __future__ import annotations

import math

from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    broadcast_strides,
    expression_code,
    grid_for,
    index_expr,
    output_binding,
    shape_text,
    sum_terms,
)
from meganeura.codegen.expressions import helper_functions
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops.matmul import matmul_a_view, matmul_dims
from meganeura.target import GENERIC, Target

# On a CPU (lavapipe) large register tiles win: 128×128 per workgroup of 8×8 threads, 16×16
# outputs each. 1024×256×256 on this project's 2-core machine (benchmarks/gemm.py with each
# tiling, 2026-12-01): 9.6 GFLOP/s, against 2.4 for the GPU tiling (64×64, 16×16 threads of 4×4);
# 8×8 threads of 8×16: 7.5, 8×16 of 16×16: 9.2, 16×16 of 8×16: 7.6.
CPU_TILING = {"WG_X": 8, "WG_Y": 8, "TM": 16, "NV": 4, "BK": 16}


def matmul_tiling(m: int, n: int, batch: int = 1, target: Target = GENERIC) -> dict[str, int]:
    """Workgroup shape and register tile: the smallest tile that covers small outputs, 64×64 for
    most, 64×128 when there are workgroups enough to fill a large GPU anyway (measured on an H200:
    13 TFLOP/s for 64×64 and 16 for 64×128 at 4096³; 64×64 wins at 1024³); on a CPU, CPU_TILING
    for outputs of at least 64×64."""
    if target.cpu and m >= 64 and n >= 64:
        return dict(CPU_TILING)
    bm = next((size for size in (8, 16, 32) if m <= size), 64)
    bn = next((size for size in (16, 32) if n <= size), 64)
    if bm == 64 and batch * -(-m // 64) * -(-n // 128) >= 512:
        bn = 128
    wg_y, tm = {8: (8, 1), 16: (8, 2), 32: (16, 2), 64: (16, 4)}[bm]
    wg_x, nv = {16: (4, 1), 32: (8, 1), 64: (16, 1), 128: (16, 2)}[bn]
    return {"WG_X": wg_x, "WG_Y": wg_y, "TM": tm, "NV": nv, "BK": 16}


def register_tile(tm: int, nv: int, wg_x: int, wg_y: int) -> dict[str, str]:
    """The unrolled per-thread code of matmul.wgsl: TM × NV vec4 accumulators, their update, their store."""
    pairs = [(i, j) for i in range(tm) for j in range(nv)]
    declare = [f"var acc_{i}_{j} = vec4<f32>(0.0);" for i, j in pairs]
    loads = [f"let b_{j} = tile_b[b_row + {j * wg_x}u];" for j in range(nv)]
    loads += [f"let a_{i} = vec4<f32>(tile_a[a_row + {i * wg_y}u]);" for i in range(tm)]
    fmas = [f"acc_{i}_{j} = fma(a_{i}, b_{j}, acc_{i}_{j});" for i, j in pairs]
    stores = [f"store4(bat, row0 + {i * wg_y}u, col0 + {4 * j * wg_x}u, acc_{i}_{j});" for i, j in pairs]
    return {
        "ACCUMULATORS": "\n    ".join(declare),
        "MULTIPLY": "\n            ".join(loads + fmas),
        "STORE": "\n    ".join(stores),
    }


def tile_size(tiling: dict[str, int]) -> tuple[int, int]:
    """(rows, columns) of the output tile one workgroup computes."""
    return tiling["WG_Y"] * tiling["TM"], tiling["WG_X"] * tiling["NV"] * 4


def matmul_workgroups(attrs: dict, operands, results, target: Target = GENERIC) -> int:
    """One workgroup per output tile of every matrix of the batch."""
    out = results[0].shape
    m, n, batches = out[-2], out[-1], math.prod(out[:-2])
    bm, bn = tile_size(matmul_tiling(m, n, batches, target))
    return -(-m // bm) * -(-n // bn) * batches


@lowering("matmul", "fused_matmul", workgroups=matmul_workgroups, per_target=True)
def lower_matmul(graph: Graph, node: Node, target: Target = GENERIC) -> KernelSpec:
    """Tiled, register-blocked, batched matmul with transposes, a prologue and an epilogue expression.

    `fused_matmul` inputs are (a, b, *extras); its `epilogue` reads `$acc` and the extras `$0…`,
    each broadcast to the output [*batch, M, N] and indexed by the element's (bat, row, col).
    Its `prologue` reads `$a`, the stored element of A, and extras broadcast to A's stored shape,
    indexed by the element's stored coordinates (row k, column m when A is transposed); it runs
    while A's tile is staged, so the A the product uses is never written. With `flatten_a` the
    stored A [..., K] is the matrix of its rows: a row index runs over all its leading dims.
    """
    a, b, *extras = node.inputs
    transpose_a = bool(node.attr("transpose_a", False))
    transpose_b = bool(node.attr("transpose_b", False))
    flatten_a = bool(node.attr("flatten_a", False))
    a_view = matmul_a_view(graph[a].type, node.attr_dict)
    batch, m, k, n = matmul_dims([a_view, graph[b].type], node.attr_dict, node.op)
    batches = math.prod(batch)
    epilogue_text = node.attr("epilogue", "$acc") if node.op == "fused_matmul" else "$acc"
    prologue_text = node.attr("prologue", "$a") if node.op == "fused_matmul" else "$a"
    tree = parse_expr(epilogue_text)
    prologue_tree = parse_expr(prologue_text)
    operands = Operands(graph)
    operands.bound(a, "a")
    operands.bound(b, "b")

    def read(name: str) -> str:
        if name == "acc":
            return "x"
        extra = extras[int(name)]
        strides = broadcast_strides(graph[extra].shape, node.shape)
        index = sum_terms(
            index_expr("bat", batch, strides[:-2]),
            index_expr("row", (m,), strides[-2:-1]),
            index_expr("col", (n,), strides[-1:]),
        )
        return operands.read_at(extra, index)

    stored_rows, stored_cols = ("k", "m") if transpose_a else ("m", "k")
    a_shape = graph[a].shape
    a_batch = a_view.shape[:-2]  # () when A is 2-D and shared by every matrix of the batch
    # A stored row: one index over the dims before the last (all of them when A is flattened).
    row_dims = a_shape[:-1] if flatten_a else a_shape[-2:-1]

    def read_for_a(name: str) -> str:
        if name == "a":
            return "x"
        extra = extras[int(name)]
        strides = broadcast_strides(graph[extra].shape, a_shape)
        index = sum_terms(
            index_expr("bat", a_batch, strides[: len(a_batch)]),
            index_expr(stored_rows, row_dims, strides[len(a_batch) : -1]),
            index_expr(stored_cols, a_shape[-1:], strides[-1:]),
        )
        return operands.read_at(extra, index)

    reads, epilogue = expression_code(tree, read)
    a_reads, prologue = expression_code(prologue_tree, read_for_a)
    bindings = [Binding("a", a, "read"), Binding("b", b, "read"), *operands.bindings, output_binding(node)]
    tiling = matmul_tiling(m, n, batches, target)
    bm, bn = tile_size(tiling)
    tiles_m = -(-m // bm)
    rows_grid = grid_for(tiles_m * batches)  # (row tile, batch) pairs, folded over y and z
    wgsl = render(
        "matmul",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "M": m,
            "N": n,
            "K": k,
            "TILES_M": tiles_m,
            "TILES": tiles_m * batches,
            "GRID_Y": max(rows_grid[0], 1),
            **tiling,
            # Stage along the operand's contiguous axis so neighbouring threads read neighbouring words.
            # A 2-D operand beside a batched one is shared: the same matrix for every batch.
            "A_BATCH_STRIDE": "(M * K)" if len(a_batch) else "0u",
            "B_BATCH_STRIDE": "(K * N)" if len(graph[b].shape) > 2 else "0u",
            "A_INDEX": "k * M + m" if transpose_a else "m * K + k",
            "A_STAGE": "let k = s / BM; let m = s % BM;" if transpose_a else "let m = s / BK; let k = s % BK;",
            "B_INDEX": "n * K + k" if transpose_b else "k * N + n",
            "B_STAGE": "let n = s / BK; let k = s % BK;" if transpose_b else "let k = s / BN; let n = s % BN;",
            "FUNCTIONS": helper_functions([tree, prologue_tree]),
            "A_READS": a_reads,
            "PROLOGUE": prologue,
            "READS": reads,
            "EPILOGUE": epilogue,
            **register_tile(tiling["TM"], tiling["NV"], tiling["WG_X"], tiling["WG_Y"]),
        },
    )
    label = f"{node.op} {shape_text(batch) + '×' if batch else ''}{m}x{k}x{n}"
    label += " Aᵀ" * transpose_a + " Bᵀ" * transpose_b + ("" if epilogue_text == "$acc" else f" {epilogue_text}")
    label += "" if prologue_text == "$a" else f" A={prologue_text}"
    grid = (-(-n // bn), rows_grid[0], rows_grid[1])
    return KernelSpec(node.id, label, wgsl, "matmul", tuple(bindings), grid, (tiling["WG_X"], tiling["WG_Y"], 1))
