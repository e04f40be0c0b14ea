"""Lowering of the implicit-GEMM convolution kernels (`conv_gemm`) to shaders/conv_gemm.wgsl.

A conv_gemm node is one tiled GEMM whose im2col operand is gathered from the image while the
GEMM tile is staged (see `meganeura/ir/ops/image.py` for the three modes as GEMMs). The tiling
and the register tile are codegen/gemm_tiles.py's, the epilogue `common.expression_code`; what
differs is how a tile element is loaded (the mode's gather, selected by a template flag) and
where an output element is stored (NCHW for forward and grad_input, the weight matrix for
grad_weight). The images are folded into the GEMM's columns (forward, grad_input) or its
reduction (grad_weight), so there is no batch dimension in the grid;
independent GEMMs of one dispatch ("groups") are the stride phases of grad_input (each pixel only
meets the taps of its phase: no multiplications by the zeros between strided positions) and the
parts of the reduction of grad_weight (split-K: `chunks`, see `weight_splits`).

The epilogue reads `$acc` and the extras `$0…`, each broadcast to the node's output shape and
indexed by the output element's row-major index.
"""

from __future__ import annotations

import math

from meganeura.codegen.common import Operands, bindings_wgsl, expression_code, grid_for, output_binding, shape_text
from meganeura.codegen.expressions import helper_functions
from meganeura.codegen.gemm_tiles import conv_tiling, register_tile, tile_size, workgroup_bytes
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops.image import conv_gemm_geometry, conv_output_size
from meganeura.ir.ops.reduce import split_length
from meganeura.target import Target

# How a staging loop walks the B tile: the coordinate that varies fastest between neighbouring
# threads. forward/grad_input: the column (neighbouring output positions, or pixels, read
# neighbouring words); grad_weight: the reduction index (neighbouring output positions of one
# image read x at neighbouring strided positions; a run of columns (c, i, j) breaks every kw).
B_STAGE = {
    "forward": "let k = s / BN; let n = s % BN;",
    "grad_input": "let k = s / BN; let n = s % BN;",
    "grad_weight": "let n = s / BK; let k = s % BK;",
}


def conv_gemm_dims(attrs: dict, a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, int, int]:
    """(M, N, K) of the GEMM of a conv_gemm with these attributes and operand and result shapes."""
    mode, kernel, _, _, _ = conv_gemm_geometry(attrs)
    taps = kernel[0] * kernel[1]
    if mode == "forward":  # [O, C·taps] · [C·taps, N·L]
        return a[0], out[0] * math.prod(out[2:]), a[1]
    if mode == "grad_input":  # per stride phase: [C, O·ti·tj] · [O·ti·tj, N·HP·WP], ti·tj ≤ TI·TJ
        (ti, tj), (hp, wp) = phase_sizes(attrs)
        return a[1] // taps, out[0] * hp * wp, a[0] * ti * tj
    chunks = attrs.get("chunks", 1)  # grad_weight: [O, N·L] · [N·L, C·taps], per part of N·L
    return a[1], out[-1], split_length(a[0] * a[2], chunks)


def phase_sizes(attrs: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    """((TI, TJ), (HP, WP)) of a grad_input: the most taps of a stride phase per kernel row and column
    (⌈KH/SH⌉, ⌈KW/SW⌉; the kernel bounds its reduction per phase), and the rows and columns of
    pixels of a phase (the largest phase: ⌈H/SH⌉, ⌈W/SW⌉)."""
    _, kernel, stride, _, image = conv_gemm_geometry(attrs)
    taps = tuple(-(-k // s) for k, s in zip(kernel, stride, strict=True))
    pixels = tuple(-(-extent // s) for extent, s in zip(image, stride, strict=True))
    return taps, pixels


def conv_groups(attrs: dict) -> int:
    """The independent GEMMs of one dispatch: the stride phases of grad_input, the parts of grad_weight."""
    mode, _, stride, _, _ = conv_gemm_geometry(attrs)
    return stride[0] * stride[1] if mode == "grad_input" else attrs.get("chunks", 1)


def conv_workgroups(attrs: dict, operands, results) -> int:
    """One workgroup per output tile of each of the dispatch's GEMMs."""
    m, n, _ = conv_gemm_dims(attrs, operands[0].shape, operands[1].shape, results[0].shape)
    bm, bn = tile_size(conv_tiling(m, n))
    return -(-m // bm) * -(-n // bn) * conv_groups(attrs)


# Split-K of a weight gradient is offered where the one GEMM has fewer than FILL_WAVES tiles per
# compute unit, and aims at SPLIT_WAVES workgroups per unit, at most MAX_SPLITS parts, each part
# of the reduction at least MIN_SPLIT_K long: a part does 2·K flops per output element against
# 8 bytes of partials (written, then read by the sum), so K ≥ 256 keeps its arithmetic well
# above that traffic (cost.py: 8 flops a byte). Measured on the H200 (benchmarks/reductions.py,
# 2026-12-01, ResNet-18's 3×3 weight gradients at batch 128): the fastest splits gave 9-17
# workgroups per SM — 128 channels at 16×16: 6.26 ms whole-batch, 1.01 ms at 4 per SM, 0.82 at
# 17; 256 channels at 8×8 (144 tiles, more than the 132 SMs): 1.84 ms whole-batch, 0.81 split 16.
FILL_WAVES = 4
SPLIT_WAVES = 16
MAX_SPLITS = 128
MIN_SPLIT_K = 256


def weight_splits(filters: int, columns: int, reduction: int, target: Target) -> int:
    """The parts to split a weight gradient's reduction (N·L long, output [filters, columns]) into
    on `target`: 1 where the one GEMM's tiles already fill the compute units FILL_WAVES times,
    else as many as give SPLIT_WAVES workgroups per unit (at most MAX_SPLITS), each part at
    least MIN_SPLIT_K long, none empty. The
    cost model decides whether the split is used (rewrite/conv.py `conv_split_k`)."""
    bm, bn = tile_size(conv_tiling(filters, columns))
    tiles = -(-filters // bm) * -(-columns // bn)
    if target.compute_units == 1 or tiles >= FILL_WAVES * target.compute_units or reduction < 2 * MIN_SPLIT_K:
        return 1  # (one unit: nothing to fill)
    splits = min(-(-SPLIT_WAVES * target.compute_units // tiles), reduction // MIN_SPLIT_K, MAX_SPLITS)
    splits = -(-reduction // split_length(reduction, splits))  # no empty part
    return splits if splits > 1 else 1


def pair_text(prefix: str, value: tuple[int, int], default: int) -> str:
    """The text of a stride ("/s2") or padding ("/p2,1") in a label; "" for the default."""
    if value == (default, default):
        return ""
    return f"/{prefix}{value[0]}" if value[0] == value[1] else f"/{prefix}{value[0]},{value[1]}"


@lowering("conv_gemm", workgroups=conv_workgroups)
def lower_conv_gemm(graph: Graph, node: Node) -> KernelSpec:
    """One conv_gemm node as a tiled implicit GEMM (see the module docstring)."""
    mode, kernel, stride, padding, image = conv_gemm_geometry(node.attr_dict)
    a, b, *extras = node.inputs
    m, n, k = conv_gemm_dims(node.attr_dict, graph[a].shape, graph[b].shape, node.shape)
    ho, wo = conv_output_size(image, kernel, stride, padding, "conv_gemm")
    taps = kernel[0] * kernel[1]
    channels = graph[a].shape[1] // taps if mode != "grad_weight" else graph[b].shape[1]
    filters = graph[a].shape[0] if mode != "grad_weight" else graph[a].shape[1]
    epilogue_text = node.attr("epilogue", "$acc")
    tree = parse_expr(epilogue_text)
    operands = Operands(graph)
    operands.bound(a, "a")
    operands.bound(b, "b")

    def read(name: str) -> str:
        return "x" if name == "acc" else operands.read(extras[int(name)], node.shape, "i")

    reads, epilogue = expression_code(tree, read)
    bindings = [Binding("a", a, "read"), Binding("b", b, "read"), *operands.bindings, output_binding(node)]
    tiling = conv_tiling(m, n)
    bm, bn = tile_size(tiling)
    tiles_m, tiles_n = -(-m // bm), -(-n // bn)
    chunks = node.attr("chunks", 1)
    groups = conv_groups(node.attr_dict)
    _, (hp, wp) = phase_sizes(node.attr_dict)
    grid = grid_for(tiles_m * tiles_n * groups)
    tile = register_tile(tiling["TM"], tiling["NV"], tiling["WG_X"], tiling["WG_Y"])
    wgsl = render(
        "conv_gemm",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "M": m,
            "N": n,
            "K": k,
            "TILES_M": tiles_m,
            "TILES": tiles_m * tiles_n * groups,
            "GROUPS": groups,
            "K_TOTAL": graph[a].shape[0] * graph[a].shape[2] if mode == "grad_weight" else k,
            "HP": hp,
            "WP": wp,
            "GRID_X": grid[0],
            **tiling,
            "C": channels,
            "O": filters,
            "H": image[0],
            "W": image[1],
            "HO": ho,
            "WO": wo,
            "KH": kernel[0],
            "KW": kernel[1],
            "SH": stride[0],
            "SW": stride[1],
            "PH": padding[0],
            "PW": padding[1],
            "FORWARD": mode == "forward",
            "GRAD_INPUT": mode == "grad_input",
            "GRAD_WEIGHT": mode == "grad_weight",
            "B_STAGE": B_STAGE[mode],
            "FUNCTIONS": helper_functions([tree]),
            "READS": reads,
            "EPILOGUE": epilogue,
            **tile,
        },
    )
    geometry = f"{kernel[0]}x{kernel[1]}{pair_text('s', stride, 1)}{pair_text('p', padding, 0)}"
    geometry += f" in {chunks} parts" if chunks > 1 else ""
    label = f"conv_gemm {mode} {geometry} {shape_text(graph[a].shape)},{shape_text(graph[b].shape)}"
    label += f" -> {shape_text(node.shape)} ({m}x{k}x{n})"
    label += "" if epilogue_text == "$acc" else f" {epilogue_text}"
    workgroup = (tiling["WG_X"], tiling["WG_Y"], 1)
    return KernelSpec(
        node.id, label, wgsl, "conv_gemm", tuple(bindings), grid, workgroup, workgroup_memory=workgroup_bytes(tiling)
    )
