"""Lowering of the implicit-GEMM convolution kernels (`conv_gemm`) to shaders/conv_gemm.wgsl.

A conv_gemm node is one tiled GEMM whose im2col operand is gathered from the image while the
GEMM tile is staged (see `meganeura/ir/ops/image.py` for the three modes as GEMMs). The kernel is
the matmul kernel's (codegen/matmul.py): its tiling comes from the matmul table of the target's
family (`gemm_tiling`, codegen/gemm_table.py), and the register tile, the staging of both
operands in workgroup memory and the K loop from `matmul.gemm_blocks`. What is the
convolution's: how a unit of a tile is loaded (the mode's gathers, `load_a` / `load_b` by element,
or `load_a4` / `load_b4` a unit at once where `gathers_units`), which
way a unit runs (`operand_tiles`: along the axis where a gather's neighbouring elements are
neighbouring words), and where an output element is stored (`conv_store4`: NCHW for forward and
grad_input, the weight matrix for grad_weight). The images are folded into the GEMM's columns
(forward, grad_input) or its reduction (grad_weight), so there is no batch dimension in the grid;
independent GEMMs of one dispatch ("groups") are the stride phases of grad_input (each pixel only
meets the taps of its phase: no multiplications by the zeros between strided positions), the
parts of the reduction (split-K: `chunks`; grad_weight's, see `weight_splits`, and a stride-1
grad_input's, `reduction_splits`) and the groups of a grouped convolution (`groups`: one GEMM per
group, M its filters or channels, so a depthwise convolution's GEMMs are one row high and take
the ladder's tile shrunk to 4·RM rows); the tiling counts them as the batch of matrices a matmul
would have.

A convolution of one channel a group (depthwise, any filters a channel) is no GEMM worth tiling:
its per-group GEMMs are one row high (grad_input's), or a few rows over 9 taps (forward's), or a
few rows of 9 columns (grad_weight's), so a tile computes mostly padding. Such a conv_gemm runs
as a direct convolution instead (`direct_conv`, `lower_direct_conv`; shaders/elementwise.wgsl): a
thread per output element sums its taps (forward), the filter taps that reach its pixel
(grad_input), or its part of the (n, ho, wo) reduction (grad_weight, split-K across threads:
`direct_weight_splits`).

The epilogue reads `$acc` and the extras `$0…`, each broadcast to the node's output shape and
indexed by the output element's row-major index.
"""

from __future__ import annotations

import math

from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    elementwise_kernel,
    expression_code,
    grid_for,
    output_binding,
    shape_text,
)
from meganeura.codegen.expressions import helper_functions
from meganeura.codegen.gemm_operands import OperandTile, store_guard
from meganeura.codegen.gemm_table import GemmTiling, gemm_tiling, shrunk, table_for
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.matmul import SPLIT_FILL, gemm_blocks, parts_to_fill
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops.image import conv_dilation, conv_gemm_geometry, conv_groups_of, conv_output_size
from meganeura.ir.ops.matmul import part_length
from meganeura.ir.ops.reduce import split_length
from meganeura.target import GENERIC, Target


def conv_gemm_dims(attrs: dict, a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...]) -> tuple[int, int, int]:
    """(M, N, K) of the GEMM of a conv_gemm with these attributes and operand and result shapes
    (K of one part where it is split: `conv_reduction` is the whole)."""
    mode, kernel, _, _, _ = conv_gemm_geometry(attrs)
    taps = kernel[0] * kernel[1]
    chunks = attrs.get("chunks", 1)
    image = out[-4:]  # forward, grad_input: [S,] N, C or O, H, W
    # (per group: a is the weight [O, C·taps] or [G, Og, Cg·taps], or the gradient [N, O, L] or [N, G, Og, L])
    if mode == "forward":  # [O, C·taps] · [C·taps, N·L]
        return a[-2], image[0] * math.prod(image[2:]), part_length(a[-1], chunks)
    if mode == "grad_input":  # per stride phase: [C, O·ti·tj] · [O·ti·tj, N·HP·WP], ti·tj ≤ TI·TJ
        (ti, tj), (hp, wp) = phase_sizes(attrs)
        return a[-1] // taps, image[0] * hp * wp, part_length(a[-2] * ti * tj, chunks)
    # grad_weight: [O, N·L] · [N·L, C·taps], per part of N·L
    return a[-2], out[-1], split_length(a[0] * a[-1], chunks)


def conv_reduction(attrs: dict, a: tuple[int, ...]) -> int:
    """The whole reduction of a conv_gemm's GEMM, before any split: C·kh·kw (forward), O·ti·tj of
    the largest stride phase (grad_input), N·L (grad_weight)."""
    mode, kernel, _, _, _ = conv_gemm_geometry(attrs)
    if mode == "forward":
        return a[-1]
    if mode == "grad_input":
        (ti, tj), _ = phase_sizes(attrs)
        return a[-2] * ti * tj
    return a[0] * a[-1]


def phase_steps(attrs: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    """((STEP_H, STEP_W), (DGH, DGW)) of a grad_input: the taps of one stride phase are
    s / gcd(d, s) apart along an axis (every s-th tap without dilation), and d / gcd(d, s) output
    positions apart (shaders/conv_gemm.wgsl `phase_taps`)."""
    _, _, stride, _, _ = conv_gemm_geometry(attrs)
    dilation = conv_dilation(attrs)
    common = [math.gcd(d, s) for d, s in zip(dilation, stride, strict=True)]
    steps = tuple(s // c for s, c in zip(stride, common, strict=True))
    spans = tuple(d // c for d, c in zip(dilation, common, strict=True))
    return steps, spans


def phase_sizes(attrs: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    """((TI, TJ), (HP, WP)) of a grad_input: the most taps of a stride phase per kernel row and column
    (⌈KH/STEP_H⌉, ⌈KW/STEP_W⌉, `phase_steps`: ⌈KH/SH⌉ without dilation; the kernel bounds its
    reduction per phase), and the rows and columns of pixels of a phase (the largest phase:
    ⌈H/SH⌉, ⌈W/SW⌉)."""
    _, kernel, stride, _, image = conv_gemm_geometry(attrs)
    steps, _ = phase_steps(attrs)
    taps = tuple(-(-k // s) for k, s in zip(kernel, steps, strict=True))
    pixels = tuple(-(-extent // s) for extent, s in zip(image, stride, strict=True))
    return taps, pixels


def conv_phases(attrs: dict) -> int:
    """The stride phases of a grad_input (its independent GEMMs, one per phase); 1 for the others."""
    mode, _, stride, _, _ = conv_gemm_geometry(attrs)
    return stride[0] * stride[1] if mode == "grad_input" else 1


def conv_groups(attrs: dict) -> int:
    """The independent GEMMs of one dispatch: the stride phases of grad_input, times the parts of
    the reduction where it is split (`chunks`), times the convolution's groups (`groups`)."""
    return conv_phases(attrs) * attrs.get("chunks", 1) * conv_groups_of(attrs)


def b_along_k(mode: str) -> bool:
    """Whether the gathered operand B is staged in units along K (the matmul table's Bᵀ ladder):
    grad_weight's, whose neighbouring reduction indices (n, ho, wo) are neighbouring output
    positions of one image, neighbouring words of x at stride 1, while its columns (c, i, j) break
    every KW. forward's and grad_input's B run along N, neighbouring output positions or pixels."""
    return mode == "grad_weight"


def conv_tiling(
    attrs: dict, a: tuple[int, ...], b: tuple[int, ...], out: tuple[int, ...], target: Target
) -> GemmTiling:
    """The GEMM tiling of a conv_gemm on `target`: the conv ladder's for its M×K·K×N product (a
    strided input gradient's, its phases uneven, the "strided" ladder's), its groups (stride
    phases, parts of K) counted as the batch."""
    m, n, k = conv_gemm_dims(attrs, a, b, out)
    groups = conv_groups(attrs)
    kind = "strided" if conv_phases(attrs) > 1 else "conv"
    return gemm_tiling(m, n, k, groups, target, b_along_k(attrs["mode"]), kind=kind)


def direct_conv(attrs: dict, a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether a conv_gemm runs as a direct convolution (module docstring): in groups of one
    channel each, unsplit but for a weight gradient."""
    groups = conv_groups_of(attrs)
    if groups == 1:
        return False
    mode, kernel, _, _, _ = conv_gemm_geometry(attrs)
    channels = b[1] // groups if mode == "grad_weight" else a[-1] // (kernel[0] * kernel[1])
    return channels == 1 and (mode == "grad_weight" or attrs.get("chunks", 1) == 1)


# The direct weight gradient's split (`direct_weight_splits`): parts enough for DIRECT_THREADS
# threads a compute unit, each part at least MIN_SPLIT_K long.
DIRECT_THREADS = 1024


def direct_weight_splits(outputs: int, reduction: int, target: Target) -> int:
    """The parts to split a direct weight gradient's reduction (N·L long, `outputs` elements) into
    on `target`: a thread per output element and part, so parts enough for DIRECT_THREADS threads
    a compute unit, at most MAX_SPLITS, each part at least MIN_SPLIT_K long (1 on a CPU, whose
    few threads the output already fills)."""
    if target.cpu or target.compute_units < 2:
        return 1
    wanted = -(-DIRECT_THREADS * target.compute_units // outputs)
    return max(1, min(wanted, MAX_SPLITS, reduction // MIN_SPLIT_K))


def conv_workgroups(attrs: dict, operands, results, target: Target = GENERIC) -> int:
    """The workgroups the cost model counts for a conv_gemm: one per output tile of each of the
    dispatch's GEMMs; for a weight gradient on a GPU, and for an input gradient whose reduction
    the target offers to split (`counted_in_largest_tiles`), counted in workgroups of
    the conv ladder's largest tile for the output, SPLIT_FILL a unit, as
    `matmul.counted_workgroups` counts a product's. Why there: the whole-batch weight gradient,
    its output too small for the largest tile, takes the ladder's smallest rung with enough
    workgroups to look busy, and ran at a third of the speed of the split-K it was priced
    against (256x8192x2304 at 32x64 tiles, 288 workgroups: 1.05 ms, 9.2 TFLOP/s in the H200's
    ResNet-18 step, 2026-12-02). The forwards and the other input gradients count every
    workgroup: their alternative is unfold + matmul, which the 4x4 stage took where it ran slower
    (codegen/gemm_table.py, HOPPER_CONV_TABLE)."""
    return conv_counted(attrs, operands, results, None, target)


def conv_counted(attrs: dict, operands, results, dispatched: int | None, target: Target = GENERIC) -> int:
    """`dispatched` workgroups of a conv_gemm's kernel (None: the ones its tiling launches) as the
    cost model counts them (`conv_workgroups`)."""
    a, b, out = operands[0].shape, operands[1].shape, results[0].shape
    if direct_conv(attrs, a, b):
        return -(-results[0].numel // 256) if dispatched is None else dispatched
    m, n, _ = conv_gemm_dims(attrs, a, b, out)
    tiling = conv_tiling(attrs, a, b, out, target)
    if dispatched is None:
        dispatched = -(-m // tiling.bm) * -(-n // tiling.bn) * conv_groups(attrs)
    if target.cpu or not counted_in_largest_tiles(attrs, a, m, n, target):
        return dispatched
    largest = largest_tiling(m, n, target, b_along_k(attrs["mode"]))
    return max(1, dispatched * tiling.bm * tiling.bn // (largest.bm * largest.bn * SPLIT_FILL))


def counted_in_largest_tiles(attrs: dict, a: tuple[int, ...], m: int, n: int, target: Target) -> bool:
    """Whether the cost model counts a conv_gemm's workgroups in the largest tile's (see
    `conv_workgroups`): every weight gradient, and an input gradient where the target offers to
    split its reduction (`reduction_splits`), split or not, so that both are priced alike."""
    if attrs["mode"] == "grad_weight":
        return True
    if attrs["mode"] != "grad_input" or conv_phases(attrs) > 1:
        return False
    return reduction_splits(m, n, conv_reduction(attrs, a), target) > 1


# Split-K of a weight gradient is offered where the one GEMM has fewer than FILL_WAVES tiles per
# compute unit, and aims at SPLIT_WAVES workgroups per unit, at most MAX_SPLITS parts, each part
# of the reduction at least MIN_SPLIT_K long: a part does 2·K flops per output element against
# 8 bytes of partials (written, then read by the sum), so K ≥ 256 keeps its arithmetic well
# above that traffic (cost.py: 8 flops a byte). Measured on the H200 (benchmarks/reductions.py,
# 2026-12-01, ResNet-18's 3×3 weight gradients at batch 128): the fastest splits gave 9-17
# workgroups per SM — 128 channels at 16×16: 6.26 ms whole-batch, 1.01 ms at 4 per SM, 0.82 at
# 17; 256 channels at 8×8 (144 tiles, more than the 132 SMs): 1.84 ms whole-batch, 0.81 split 16.
# (Those were 64x64 tiles of the kernel before it took the matmul's structure and ladder.) With
# the whole-batch GEMMs counted as `conv_workgroups` counts them, the ResNet-18 step on the H200
# (`benchmarks/plan_ab.py --workloads resnet18`, one profiled step, 2026-12-02) took 32 parts for
# 256x8192x2304 (3 a step: 3.10 → 1.29 ms, with their sums 0.15) and 256x8192x1152 (0.78 → 0.24),
# 8 for 512x2048x4608 (1.50 → 1.07) and 512x2048x2304 (0.35 → 0.20); MAX_SPLITS 64 or 32,
# SPLIT_WAVES 8 and FILL_WAVES 2 moved the step by under 0.35 ms, none faster than 0.03 ms.
FILL_WAVES = 4
SPLIT_WAVES = 16
MAX_SPLITS = 128
MIN_SPLIT_K = 256


def largest_tiling(m: int, n: int, target: Target, transpose_b: bool) -> GemmTiling:
    """The first rung of the target family's ladder that fits its workgroup memory, shrunk to an
    M × N output."""
    return shrunk(table_for(target, "conv").largest(transpose_b, target), m, n, target.workgroup_memory)


def weight_splits(filters: int, columns: int, reduction: int, target: Target, groups: int = 1) -> int:
    """The parts to split a weight gradient's reduction (N·L long, output [filters, columns] per
    group, `groups` of them) into on `target`: 1 where the GEMMs' tiles already fill the compute
    units FILL_WAVES times,
    else as many as give SPLIT_WAVES workgroups per unit (at most MAX_SPLITS), each part at
    least MIN_SPLIT_K long, none empty. Tiles are counted in the table's largest for the output
    (as `matmul.matmul_splits` does): the tile the ladder gives the split GEMM once its parts
    fill the units, where the whole-batch GEMM alone would take the smallest rung. The
    cost model decides whether the split is used (rewrite/conv.py `conv_split_k`)."""
    tiling = largest_tiling(filters, columns, target, b_along_k("grad_weight"))
    tiles = groups * -(-filters // tiling.bm) * -(-columns // tiling.bn)
    if target.compute_units == 1 or tiles >= FILL_WAVES * target.compute_units or reduction < 2 * MIN_SPLIT_K:
        return 1  # (one unit: nothing to fill)
    return parts_to_fill(tiles, reduction, SPLIT_WAVES * target.compute_units, MIN_SPLIT_K, MAX_SPLITS)


# Split-K of a stride-1 input gradient: where the GEMM's output fills fewer than
# REDUCTION_FILL_BELOW tiles of the conv ladder's largest per compute unit (ResNet-18's 4x4 stage
# at batch 128, 512x2048: 64 tiles of 128x128 for 132 SMs; the 8x8 stage's 128), parts enough for
# REDUCTION_SPLIT_FILL such tiles a unit, each at least MIN_SPLIT_K long. The partials are small
# next to the work (a 512x2048 output is 4 MB a part against 9.7 GFLOP). Measured in the
# ResNet-18 step on the H200 (2026-12-04, `benchmarks/plan_ab.py --workloads resnet18`, one
# profiled step): 21.10 → 20.66 ms at 01:12 UTC; at 01:10, ms a step for the stage's kernels, the
# 4x4 stage's input gradients 1.381 → 1.128 in 5 parts (1.045 in 9, REDUCTION_SPLIT_FILL 4), the
# 8x8 stage's 1.207 → 0.942 in 3 (1.179 in 2, 1.011 in 5). Forwards split the same way ran no
# faster (4x4: 1.340 → 1.321 in 5 parts, 1.233 in 9; 8x8: 1.087 → 1.096 in 3) and are not offered
# it (rewrite/conv.py `reduction_split`; ir/ops/image.py and the kernel have it).
REDUCTION_FILL_BELOW = 2
REDUCTION_SPLIT_FILL = 2


def reduction_splits(filters: int, columns: int, reduction: int, target: Target) -> int:
    """The parts to split a stride-1 input gradient's reduction (K long, output [channels,
    columns] as a GEMM) into on `target` (1: none): see REDUCTION_FILL_BELOW. The cost model
    decides whether the split is used (rewrite/conv.py `conv_split_reduction`)."""
    if target.cpu or target.compute_units < 2 or reduction < 2 * MIN_SPLIT_K:
        return 1
    tiling = largest_tiling(filters, columns, target, b_along_k("grad_input"))
    tiles = -(-filters // tiling.bm) * -(-columns // tiling.bn)
    if tiles >= REDUCTION_FILL_BELOW * target.compute_units:
        return 1
    splits = parts_to_fill(tiles, reduction, REDUCTION_SPLIT_FILL * target.compute_units, MIN_SPLIT_K, MAX_SPLITS)
    while splits > 1 and (splits - 1) * part_length(reduction, splits) >= reduction:
        splits -= 1  # (whole 16-element K tiles a part: fewer parts where the last would be empty)
    return splits


def pair_text(prefix: str, value: tuple[int, int], default: int) -> str:
    """The text of a stride ("/s2") or padding ("/p2,1") in a label; "" for the default."""
    if value == (default, default):
        return ""
    return f"/{prefix}{value[0]}" if value[0] == value[1] else f"/{prefix}{value[0]},{value[1]}"


def ragged_reduction(k: int, k_total: int, parts: int, phases: int, bk: int) -> bool:
    """Whether a K tile may pass the end of a GEMM's reduction: a part (of `k`, the whole
    reduction `k_total` split into `parts`) or its short last part not a multiple of BK, a stride
    phase of grad_input with fewer taps than the largest."""
    return phases > 1 or k % bk != 0 or (k_total - (parts - 1) * k) % bk != 0


def operand_tiles(
    mode: str, m: int, n: int, tiling: GemmTiling, vector_a: bool, units_a: bool, units_b: bool
) -> tuple[OperandTile, OperandTile]:
    """How each operand's tile is staged: a unit runs along the axis where the gather's neighbouring
    elements are neighbouring words (A: along K, the weight's rows or g's positions; B: along N but
    for grad_weight), loaded by element (`load_a`, `load_b`), but for forward's A, the weight
    matrix as stored, by vec4 where `vector_a`; with `units_a`, `units_b` (`gathers_units`) a unit
    at a time (`load_a4`, `load_b4`)."""
    op_a = OperandTile("a", "m", m, tiling.bm, False, vector_a, units_a)
    op_b = OperandTile("b", "n", n, tiling.bn, not b_along_k(mode), False, units_b)
    return op_a, op_b


def gathers_units(mode: str, k: int, wo: int, wp: int) -> bool:
    """Whether the gathered operands load a unit of 4 at once (shaders/conv_gemm.wgsl `load_b4`,
    `load_a4`): where every unit's 4 elements lie along one row of the tensor they are read from,
    so that the unit's position (image, channel, tap, row) is decoded and bounds-checked once and
    only the column moves, where a load by element decodes all of it for each of the 4. A unit
    starts at a multiple of 4 of its run, so that holds where the rows it runs along are a multiple
    of 4 long: forward's output rows (WO), grad_input's rows of a stride phase (WP),
    grad_weight's output rows (WO) with every part of its reduction a multiple of 4 long (K),
    which also makes g's units (grad_weight's A) 4 neighbouring words. Measured in the ResNet-18
    step on the H200 (2026-12-03, `benchmarks/plan_ab.py --workloads resnet18`, one profiled
    step, the variants setting this function or the template's form): against loads by element
    (18:45 UTC) 24.80 → 22.79 ms (one pass 23.47 → 21.46), the 3x3 weight gradients 14-32%
    faster (64x1024x576 in 128 parts 2.617 → 2.067 ms a step), the strided input gradients 35%
    (256x2048x2048 0.724 → 0.473), the stride-1 ones 5-7%. Forward's units ran 3-24% slower with
    the gradients' gather, which leaves a unit in a padding row at once (128x1152x32768 1.107 →
    1.372 ms), and faster with no branch on the row (shaders/conv_gemm.wgsl `gather_x4`, about
    20:15 UTC: 64x576x131072 1.458 → 1.368, 256x2304x8192 1.161 → 1.065, 128x1152x32768 1.120 →
    1.048), where that branchless form slowed the weight gradients by 6-9%: each mode has its
    form."""
    if mode == "forward":
        return wo % 4 == 0
    if mode == "grad_input":
        return wp % 4 == 0
    return wo % 4 == 0 and k % 4 == 0


def load_checks(size: int, tile: int, axis: str, ragged_k: bool) -> str:
    """The bound check of a scalar load at (axis, k): the outer axis where the tiles do not divide
    it, k where a K tile may pass the reduction's end ("true" for none)."""
    checks = [f"{axis} < {'M' if axis == 'm' else 'N'}"] * (size % tile != 0) + ["k < kend"] * ragged_k
    return " && ".join(checks) or "true"


def vector_columns(mode: str, n: int, phases: int, image: tuple[int, int], ho: int, wo: int) -> bool:
    """Whether 4 consecutive GEMM columns from a multiple of 4 are 4 consecutive words of the
    output: forward's positions with HO·WO a multiple of 4, grad_input's pixels with one stride
    phase and H·W a multiple of 4, grad_weight's weight rows with C·KH·KW a multiple of 4."""
    if mode == "forward":
        return ho * wo % 4 == 0
    if mode == "grad_input":
        return phases == 1 and image[0] * image[1] % 4 == 0
    return n % 4 == 0


def conv_store4(mode: str, m: int, n: int, tiling: GemmTiling, vector: bool) -> str:
    """`store4(bat, row, col, v)`: GEMM `bat`'s elements (row, col .. col + 3) = epilogue(v), inside
    the matrix, at `out_index`; one vec4 store where the 4 are consecutive words (`vector`)."""
    guard = store_guard(m, n, tiling.bm, tiling.bn)
    if vector:  # N is a multiple of 4 too: a vec4 is all in or all out
        parts = ", ".join(f"epilogue(v.{comp}, i + {c}u)" for c, comp in enumerate("xyzw"))
        body = f"let i = out_index(bat, row, col); out[i / 4u] = vec4<f32>({parts});"
    else:
        guard = "if (row >= M) { return; }" if m % tiling.bm else ""
        inside = "col + c < N" if n % tiling.bn else "true"
        body = (
            f"for (var c = 0u; c < 4u; c++) {{ if ({inside}) {{ let i = out_index(bat, row, col + c);"
            " if (i != NO_ELEMENT) { out[i] = epilogue(v[c], i); } } }"
        )
    return f"fn store4(bat: u32, row: u32, col: u32, v: vec4<f32>) {{\n    {guard}\n    {body}\n}}"


@lowering("conv_gemm", workgroups=conv_workgroups, per_target=True, counted=conv_counted)
def lower_conv_gemm(graph: Graph, node: Node, target: Target = GENERIC) -> KernelSpec:
    """One conv_gemm node as a tiled implicit GEMM (see the module docstring), or as a direct
    convolution (`direct_conv`)."""
    if direct_conv(node.attr_dict, graph[node.inputs[0]].shape, graph[node.inputs[1]].shape):
        return lower_direct_conv(graph, node)
    mode, kernel, stride, padding, image = conv_gemm_geometry(node.attr_dict)
    dilation, conv_group_count = conv_dilation(node.attr_dict), conv_groups_of(node.attr_dict)
    a, b, *extras = node.inputs
    m, n, k = conv_gemm_dims(node.attr_dict, graph[a].shape, graph[b].shape, node.shape)
    ho, wo = conv_output_size(image, kernel, stride, padding, "conv_gemm", dilation)
    taps = kernel[0] * kernel[1]
    # per convolution group: C its channels, O its filters
    channels = graph[a].shape[-1] // taps if mode != "grad_weight" else graph[b].shape[1] // conv_group_count
    filters = graph[a].shape[-2]
    (step_h, step_w), (span_h, span_w) = phase_steps(node.attr_dict)
    epilogue_text = node.attr("epilogue", "$acc")
    tree = parse_expr(epilogue_text)
    operands = Operands(graph)
    operands.bound(a, "a")
    operands.bound(b, "b")

    def read(name: str) -> str:
        return "x" if name == "acc" else operands.read(extras[int(name)], node.shape, "i")

    reads, epilogue = expression_code(tree, read)
    bindings = [Binding("a", a, "read"), Binding("b", b, "read"), *operands.bindings, output_binding(node)]
    tiling = conv_tiling(node.attr_dict, graph[a].shape, graph[b].shape, node.shape, target)
    tiles_m, tiles_n = -(-m // tiling.bm), -(-n // tiling.bn)
    chunks = node.attr("chunks", 1)
    groups = conv_groups(node.attr_dict)
    _, (hp, wp) = phase_sizes(node.attr_dict)
    phases = conv_phases(node.attr_dict)
    k_total = conv_reduction(node.attr_dict, graph[a].shape)
    ragged_k = ragged_reduction(k, k_total, chunks, phases, tiling.bk)
    # The weight as stored is A of forward: vec4 units along its rows where they are whole.
    vector_a = mode == "forward" and k_total % 4 == 0 and k % 4 == 0 and a not in extras
    units = gathers_units(mode, k, wo, wp)
    # grad_weight's A = g by vec4 (a bound as such), unless the epilogue reads g by element too.
    units_a = units and mode == "grad_weight" and a not in extras
    op_a, op_b = operand_tiles(mode, m, n, tiling, vector_a, units_a, units)
    vector_out = vector_columns(mode, n, phases, image, ho, wo)
    # On a CPU, the gathered units are staged by a loop: straight-line gathers for lavapipe's
    # 16x16-per-thread tiles (up to 64 units of 4 a thread) took LLVM seconds per kernel to compile.
    looped = (
        frozenset(op.name for op in (op_a, op_b) if not op.vector)
        if target.cpu and not tiling.prefetch
        else frozenset()
    )
    vec4_names = {name for name, on in (("a", vector_a or op_a.units), ("out", vector_out)) if on}
    grid = grid_for(tiles_m * tiles_n * groups)
    wgsl = render(
        "conv_gemm",
        {
            "BINDINGS": bindings_wgsl(graph, bindings, vec4_names),
            "M": m,
            "N": n,
            "K": k if mode == "grad_weight" else k_total,  # forward's and grad_input's K_PART: k
            "TILES_M": tiles_m,
            "TILES": tiles_m * tiles_n * groups,
            "GROUPS": groups,
            "PHASES": phases,
            "K_TOTAL": k_total,
            "K_PART": k,
            "OUT_PART": node.type.numel // chunks,
            "HP": hp,
            "WP": wp,
            "GRID_X": grid[0],
            "C": channels,
            "O": filters,
            "CG": conv_group_count,
            "PARTS": chunks,
            "DH": dilation[0],
            "DW": dilation[1],
            "STEP_H": step_h,
            "STEP_W": step_w,
            "DGH": span_h,
            "DGW": span_w,
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
            "A_SCALAR": not (vector_a or op_a.units),
            "A_UNITS": op_a.units,
            "B_UNITS": op_b.units,
            "A_IN": load_checks(m, tiling.bm, "m", ragged_k),
            "B_IN": load_checks(n, tiling.bn, "n", ragged_k),
            "FUNCTIONS": helper_functions([tree]),
            "READS": reads,
            "EPILOGUE": epilogue,
            "STORE4": conv_store4(mode, m, n, tiling, vector_out),
            **gemm_blocks(op_a, op_b, tiling, ragged_k, prologue=False, looped=looped),
        },
    )
    geometry = f"{kernel[0]}x{kernel[1]}{pair_text('s', stride, 1)}{pair_text('p', padding, 0)}"
    geometry += pair_text("d", dilation, 1)
    geometry += f" in {conv_group_count} groups" if conv_group_count > 1 else ""
    geometry += f" in {chunks} parts" if chunks > 1 else ""
    label = f"conv_gemm {mode} {geometry} {shape_text(graph[a].shape)},{shape_text(graph[b].shape)}"
    label += f" -> {shape_text(node.shape)} ({m}x{k}x{n})"
    label += "" if epilogue_text == "$acc" else f" {epilogue_text}"
    workgroup = (tiling.threads_x, tiling.threads_y, 1)
    return KernelSpec(
        node.id,
        label,
        wgsl,
        "conv_gemm",
        tuple(bindings),
        grid,
        workgroup,
        workgroup_memory=tiling.workgroup_bytes,
        keeps_checks=tiling.checked,
    )


def lower_direct_conv(graph: Graph, node: Node) -> KernelSpec:
    """A conv_gemm of one channel a group as a direct convolution, a thread per output element
    (shaders/elementwise.wgsl), the epilogue applied to its sum `acc`."""
    attrs = node.attr_dict
    mode, kernel, stride, padding, image = conv_gemm_geometry(attrs)
    dilation, groups = conv_dilation(attrs), conv_groups_of(attrs)
    a, b, *extras = node.inputs
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (height, width) = kernel, stride, padding, dilation, image
    ho, wo = conv_output_size(image, kernel, stride, padding, "conv_gemm", dilation)
    # O, all the filters: of the weight [G, Og, kh·kw], or of the gradient [N, G, Og, L]
    filters = math.prod(graph[a].shape[:2] if mode != "grad_weight" else graph[a].shape[1:3])
    per_group = filters // groups  # Og
    channels = groups  # one a group
    operands = Operands(graph)

    def weight_at(o: str, i: str, j: str) -> str:  # weight [O, 1, kh, kw]
        return operands.read_at(a, f"({o} * {kh}u + {i}) * {kw}u + {j}")

    if mode == "forward":
        x_at = operands.read_at(
            b, f"(n * {channels}u + o / {per_group}u) * {height * width}u + u32(y) * {width}u + u32(x)"
        )
        lines = [
            f"let ow = i % {wo}u;",
            f"let oh = (i / {wo}u) % {ho}u;",
            f"let o = (i / {ho * wo}u) % {filters}u;",
            f"let n = i / {filters * ho * wo}u;",
            "var acc = 0.0;",
            f"for (var ki = 0u; ki < {kh}u; ki++) {{",
            f"    let y = i32(oh * {sh}u + ki * {dh}u) - {ph}i;",
            f"    if (y < 0i || y >= {height}i) {{ continue; }}",
            f"    for (var kj = 0u; kj < {kw}u; kj++) {{",
            f"        let x = i32(ow * {sw}u + kj * {dw}u) - {pw}i;",
            f"        if (x < 0i || x >= {width}i) {{ continue; }}",
            f"        acc += {weight_at('o', 'ki', 'kj')} * {x_at};",
            "    }",
            "}",
        ]
    elif mode == "grad_input":  # pixel (n, c, y, x) sums the filters of its group whose taps reach it
        g_at = operands.read_at(b, f"(n * {filters}u + o) * {ho * wo}u + u32(gy / {sh}i) * {wo}u + u32(gx / {sw}i)")
        lines = [
            f"let x = i32(i % {width}u);",
            f"let y = i32((i / {width}u) % {height}u);",
            f"let c = (i / {height * width}u) % {channels}u;",
            f"let n = i / {channels * height * width}u;",
            "var acc = 0.0;",
            f"for (var f = 0u; f < {per_group}u; f++) {{",
            f"    let o = c * {per_group}u + f;",
            f"    for (var ki = 0u; ki < {kh}u; ki++) {{",
            f"        let gy = y + {ph}i - i32(ki * {dh}u);",
            f"        if (gy < 0i || gy % {sh}i != 0i || gy / {sh}i >= {ho}i) {{ continue; }}",
            f"        for (var kj = 0u; kj < {kw}u; kj++) {{",
            f"            let gx = x + {pw}i - i32(kj * {dw}u);",
            f"            if (gx < 0i || gx % {sw}i != 0i || gx / {sw}i >= {wo}i) {{ continue; }}",
            f"            acc += {weight_at('o', 'ki', 'kj')} * {g_at};",
            "        }",
            "    }",
            "}",
        ]
    else:  # weight element (part, o, ki, kj) sums g·x over its part of (n, ho, wo)
        images = graph[a].shape[0]
        reduction = images * ho * wo
        length = split_length(reduction, node.attr("chunks", 1))
        g_at = operands.read_at(a, f"(n * {filters}u + o) * {ho * wo}u + l")
        x_at = operands.read_at(
            b, f"(n * {channels}u + o / {per_group}u) * {height * width}u + u32(y) * {width}u + u32(x)"
        )
        lines = [
            f"let kj = i % {kw}u;",
            f"let ki = (i / {kw}u) % {kh}u;",
            f"let o = (i / {kh * kw}u) % {filters}u;",
            f"let first = (i / {filters * kh * kw}u) * {length}u;",
            "var acc = 0.0;",
            f"for (var k = first; k < min(first + {length}u, {reduction}u); k++) {{",
            f"    let n = k / {ho * wo}u;",
            f"    let l = k % {ho * wo}u;",
            f"    let y = i32((l / {wo}u) * {sh}u + ki * {dh}u) - {ph}i;",
            f"    let x = i32((l % {wo}u) * {sw}u + kj * {dw}u) - {pw}i;",
            f"    if (y < 0i || y >= {height}i || x < 0i || x >= {width}i) {{ continue; }}",
            f"    acc += {g_at} * {x_at};",
            "}",
        ]
    epilogue_text = node.attr("epilogue", "$acc")
    tree = parse_expr(epilogue_text)

    def read(name: str) -> str:
        return "acc" if name == "acc" else operands.read(extras[int(name)], node.shape, "i")

    reads, value = expression_code(tree, read)
    body = "\n    ".join([*lines, reads] if reads else lines)
    geometry = f"{kh}x{kw}{pair_text('s', stride, 1)}{pair_text('p', padding, 0)}{pair_text('d', dilation, 1)}"
    parts = f" in {node.attr('chunks')} parts" if node.attr("chunks", 1) > 1 else ""
    label = f"conv_direct {mode} {geometry} in {groups} groups{parts} {shape_text(graph[a].shape)},"
    label += f"{shape_text(graph[b].shape)} -> {shape_text(node.shape)}"
    label += "" if epilogue_text == "$acc" else f" {epilogue_text}"
    return elementwise_kernel(graph, node, operands, body, value, helper_functions([tree]), label)
