"""Lowering of Winograd's F(m×m, 3×3) transforms (ir/ops/winograd.py), and which m a plan may use
on which adapters (`winograd_tile`); the (m + 2)² GEMMs between the transforms are one batched
matmul (codegen/matmul.py).

Each transform is a kernel of shaders/winograd.wgsl where a thread owns one unit of P = (m + 2)²
values and computes them in registers, the matrix products unrolled from the matrices themselves
(`transformed`: zeros left out, ±1 as plain sums), and writes each of the P values to its own
position plane, so that neighbouring threads write neighbouring elements:
- winograd_input: a thread per (channel, tile), t fastest: it loads its n×n input tile (0 outside
  the image; the index clamped so that every load is in bounds), V = Bᵀ·d·B;
- winograd_weight: a thread per filter pair (o, c), or (c, o) flipped: its 9 taps (rotated by 180°
  when flipped), U = G·g·Gᵀ;
- winograd_output: a thread per (filter, tile): its P values of M, y = Aᵀ·M·A, the m×m pixels
  that fall inside the output stored (a ragged last row or column of tiles stores fewer);
- winograd_gradient: a thread per (filter, tile) of the output gradient: its m×m values (0 past
  the output), Ug = A·g·Aᵀ;
- winograd_weight_gradient: a thread per filter pair (o, c): its P values of M, dW = Gᵀ·M·G, the
  9 taps stored.
The first cut, a thread per output element with the taps picked through small arrays, ran the
F(2×2) transforms 4-7× slower on the H200 (ResNet-18's input transform of the 32×32 stage
0.35 → 0.05 ms) and made the step slower than the direct convolutions.
"""

from __future__ import annotations

import numpy as np

from meganeura.codegen.common import Operands, bindings_wgsl, grid_for, output_binding, shape_text
from meganeura.codegen.expressions import literal
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.ops.winograd import MATRICES, tiles, transformed_size
from meganeura.target import Target

WORKGROUP = 256  # threads of a transform's workgroup, one unit each


def plane_workgroups(transformed: TensorType) -> int:
    """The workgroups of a transform whose threads own a unit of each plane of `transformed` [P, …]."""
    return -(-(transformed.numel // transformed.shape[0]) // WORKGROUP)


def stored_planes(name: str, span: int, plane: int) -> list[str]:
    """The stores of a unit's P = span² values `{name}{a}_{b}`, each to its own plane of `plane` elements."""
    return [f"out[{(span * a + b) * plane}u + i] = {name}{a}_{b};" for a in range(span) for b in range(span)]


def transform_kernel(
    graph: Graph, node: Node, operands: Operands, units: int, body: list[str], label: str
) -> KernelSpec:
    """The kernel of shaders/winograd.wgsl running `body` for each of `units` threads."""
    bindings = operands.bindings + [output_binding(node)]
    grid = grid_for(-(-units // WORKGROUP))
    wgsl = render(
        "winograd",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "UNITS": units,
            "GRID_X": max(grid[0], 1),
            "BODY": "\n    ".join(body),
        },
    )
    return KernelSpec(node.id, label, wgsl, "winograd", tuple(bindings), grid, (WORKGROUP, 1, 1))


def tile_origin(count: int, tiles_hw: tuple[int, int], tile: int, planes: int, size: tuple[int, int]) -> list[str]:
    """WGSL lets decoding unit i = (plane row, t) of a transform over `count` tiles: `t`, the
    tile's first row `y` and column `x` (tiles of `tile` pixels, th × tw per image), and `plane`,
    the start of its image's plane among `planes` channels of `size` pixels."""
    (th, tw), (height, width) = tiles_hw, size
    return [
        f"let t = i % {count}u;",
        f"let y = ((t / {tw}u) % {th}u) * {tile}u;",
        f"let x = (t % {tw}u) * {tile}u;",
        f"let plane = ((t / {th * tw}u) * {planes}u + i / {count}u) * {height * width}u;",
    ]


def combination(coefficients, terms: list[str]) -> str:
    """WGSL for Σ coefficients[k]·terms[k]: zeros left out, ±1 as a plain sum or difference, other
    coefficients as float32 literals (every entry of the transform matrices is exact in f32 but
    m = 4's sixths, rounded as numpy rounds them)."""
    parts = []
    for coefficient, term in zip(coefficients, terms, strict=True):
        if coefficient == 0:
            continue
        magnitude = abs(float(coefficient))
        sign = "-" if coefficient < 0 else "+"
        parts.append((sign, term if magnitude == 1 else f"{literal(float(np.float32(magnitude)))} * {term}"))
    if not parts:
        return "0.0"
    text = ("-" if parts[0][0] == "-" else "") + parts[0][1]
    return text + "".join(f" {sign} {term}" for sign, term in parts[1:])


def transformed(matrix, name: str, source: str, count: int) -> list[str]:
    """`let`s applying `matrix` [rows, k] on both sides of the k×k values `{source}{i}_{j}`:
    first down the columns (`{name}r{a}_{j}`), then along the rows, into `{name}{a}_{b}`."""
    lines = []
    for a, row in enumerate(matrix):
        for j in range(count):
            lines.append(f"let {name}r{a}_{j} = {combination(row, [f'{source}{i}_{j}' for i in range(count)])};")
    for a in range(len(matrix)):
        for b, row in enumerate(matrix):
            lines.append(f"let {name}{a}_{b} = {combination(row, [f'{name}r{a}_{j}' for j in range(count)])};")
    return lines


@lowering("winograd_input", workgroups=lambda attrs, operands, results: plane_workgroups(results[0]))
def lower_winograd_input(graph: Graph, node: Node) -> KernelSpec:
    """Thread (c, t) loads its n×n tile (0 outside the image; the index clamped so that every load
    is in bounds), forms V = Bᵀ·d·B and writes its P values, C·T apart."""
    x = node.inputs[0]
    (height, width), (ph, pw), tile = tuple(node.attr("image")), tuple(node.attr("padding")), node.attr("tile")
    th, tw = tiles(transformed_size((height, width), (ph, pw)), tile)
    span, (_, channels, count) = tile + 2, node.shape
    operands = Operands(graph)
    body = tile_origin(count, (th, tw), tile, channels, (height, width))
    body += [f"let top = i32(y) - {ph}i;", f"let left = i32(x) - {pw}i;"]
    for s in range(span):
        body += [
            f"let in_col{s} = left + {s}i >= 0i && left + {s}i < {width}i;",
            f"let at_col{s} = u32(clamp(left + {s}i, 0i, {width - 1}i));",
        ]
    for r in range(span):
        body += [
            f"let in_row{r} = top + {r}i >= 0i && top + {r}i < {height}i;",
            f"let at_row{r} = plane + u32(clamp(top + {r}i, 0i, {height - 1}i)) * {width}u;",
        ]
        for s in range(span):
            pixel = operands.read_at(x, f"at_row{r} + at_col{s}")
            body.append(f"let d{r}_{s} = select(0.0, {pixel}, in_row{r} && in_col{s});")
    body += transformed(MATRICES[tile][0], "v", "d", span)
    body += stored_planes("v", span, channels * count)
    label = f"winograd_input F({tile},3) {shape_text(graph[x].shape)} image {height}x{width} p={ph},{pw}"
    return transform_kernel(graph, node, operands, channels * count, body, label)


@lowering("winograd_weight", workgroups=lambda attrs, operands, results: plane_workgroups(results[0]))
def lower_winograd_weight(graph: Graph, node: Node) -> KernelSpec:
    """Thread (o, c) (flipped: (c, o)) loads its filter's 9 taps (rotated by 180° when flipped),
    forms U = G·g·Gᵀ and writes its P values."""
    w = node.inputs[0]
    flip, tile = node.attr("flip"), node.attr("tile")
    filters, channels = graph[w].shape[0], graph[w].shape[1] // 9
    rows, cols = (channels, filters) if flip else (filters, channels)
    span = tile + 2
    operands = Operands(graph)
    body = [
        f"let col = i % {cols}u;",
        f"let row = i / {cols}u;",
        f"let base = ({'col' if flip else 'row'} * {channels}u + {'row' if flip else 'col'}) * 9u;",
    ]
    for r in range(3):
        for c in range(3):
            body.append(
                f"let g{r}_{c} = {operands.read_at(w, f'base + {(2 - r) * 3 + 2 - c if flip else r * 3 + c}u')};"
            )
    body += transformed(MATRICES[tile][1], "u", "g", 3)
    body += stored_planes("u", span, rows * cols)
    label = f"winograd_weight F({tile},3) {shape_text(graph[w].shape)}{' flipped' if flip else ''}"
    return transform_kernel(graph, node, operands, rows * cols, body, label)


@lowering("winograd_output", workgroups=lambda attrs, operands, results: plane_workgroups(operands[0]))
def lower_winograd_output(graph: Graph, node: Node) -> KernelSpec:
    """Thread (o, t) loads its tile's P values of M, forms y = Aᵀ·M·A and stores the m×m pixels
    that fall inside the output."""
    m = node.inputs[0]
    _, filters, height, width = node.shape
    tile = node.attr("tile")
    th, tw = tiles((height, width), tile)
    span, count = tile + 2, graph[m].shape[2]
    operands = Operands(graph)
    body = tile_origin(count, (th, tw), tile, filters, (height, width))
    body.append(f"let corner = plane + y * {width}u + x;")
    for a in range(span):
        for b in range(span):
            body.append(f"let m{a}_{b} = {operands.read_at(m, f'{(span * a + b) * filters * count}u + i')};")
    body += transformed(MATRICES[tile][2], "y", "m", span)
    for p in range(tile):
        for q in range(tile):
            # Only a ragged last row (column) of tiles reaches past the output, by up to m − 1.
            guards = [
                f"y + {p}u < {height}u" * past_edge(p, height, tile),
                f"x + {q}u < {width}u" * past_edge(q, width, tile),
            ]
            inside = " && ".join(filter(None, guards))
            store = f"out[corner + {p * width + q}u] = y{p}_{q};"
            body.append(f"if ({inside}) {{ {store} }}" if inside else store)
    label = f"winograd_output F({tile},3) {shape_text(graph[m].shape)} -> {shape_text(node.shape)}"
    return transform_kernel(graph, node, operands, filters * count, body, label)


@lowering("winograd_gradient", workgroups=lambda attrs, operands, results: plane_workgroups(results[0]))
def lower_winograd_gradient(graph: Graph, node: Node) -> KernelSpec:
    """Thread (o, t) loads its m×m tile of the output gradient (0 past the output), forms
    Ug = A·g·Aᵀ and writes its P values, O·T apart."""
    g = node.inputs[0]
    (height, width), tile = tuple(node.attr("size")), node.attr("tile")
    th, tw = tiles((height, width), tile)
    span, (_, filters, count) = tile + 2, node.shape
    operands = Operands(graph)
    body = tile_origin(count, (th, tw), tile, filters, (height, width))
    for u in range(tile):
        row = f"min(y + {u}u, {height - 1}u)" if past_edge(u, height, tile) else f"y + {u}u"
        for v in range(tile):
            col = f"min(x + {v}u, {width - 1}u)" if past_edge(v, width, tile) else f"x + {v}u"
            value = operands.read_at(g, f"plane + ({row}) * {width}u + {col}")
            guards = [
                f"y + {u}u < {height}u" * past_edge(u, height, tile),
                f"x + {v}u < {width}u" * past_edge(v, width, tile),
            ]
            inside = " && ".join(filter(None, guards))
            # Past the output's edge the tile reads 0 (its index clamped to stay in the plane).
            body.append(f"let g{u}_{v} = select(0.0, {value}, {inside});" if inside else f"let g{u}_{v} = {value};")
    body += transformed(MATRICES[tile][2].T, "w", "g", tile)
    body += stored_planes("w", span, filters * count)
    label = f"winograd_gradient F(3,{tile}) {shape_text(graph[g].shape)} of {height}x{width}"
    return transform_kernel(graph, node, operands, filters * count, body, label)


@lowering("winograd_weight_gradient", workgroups=lambda attrs, operands, results: plane_workgroups(operands[0]))
def lower_winograd_weight_gradient(graph: Graph, node: Node) -> KernelSpec:
    """Thread (o, c) loads its P values of M, forms dW = Gᵀ·M·G and stores its filter's 9 taps."""
    m = node.inputs[0]
    tile = node.attr("tile")
    span, (_, filters, channels) = tile + 2, graph[m].shape
    operands = Operands(graph)
    body = []
    for a in range(span):
        for b in range(span):
            body.append(f"let m{a}_{b} = {operands.read_at(m, f'{(span * a + b) * filters * channels}u + i')};")
    body += transformed(MATRICES[tile][1].T, "d", "m", span)
    body += [f"out[i * 9u + {3 * r + c}u] = d{r}_{c};" for r in range(3) for c in range(3)]
    label = f"winograd_weight_gradient F(3,{tile}) {shape_text(graph[m].shape)}"
    return transform_kernel(graph, node, operands, filters * channels, body, label)


def past_edge(offset: int, extent: int, tile: int) -> bool:
    """Whether row (column) `offset` of the last tile of `tile`s over `extent` falls past it."""
    return extent % tile != 0 and offset >= extent % tile


def winograd_tile(target: Target) -> int | None:
    """The m of F(m×m, 3×3) that a plan for `target` may run stride-1 3×3 convolutions (forward,
    input gradient, and weight gradient as F(3×3, m×m)) as, Winograd transforms around a batched
    GEMM (the cost model then chooses, convolution by convolution), or None: on the adapter
    families where it was measured to pay (docs/performance-log.md, 2026-12-04)."""
    return CPU_WINOGRAD_TILE if target.cpu else WINOGRAD_TILES.get(target.tuning)


# On the H200 (`benchmarks/plan_ab.py --workloads resnet18`, ResNet-18's step at batch 128, GPU
# time as one pass, 2026-12-04): no Winograd 19.25 ms; F(2×2, 3×3) 15.10 (15.07 repeated), its
# 16 products on 64x128 tiles (codegen/matmul.py `split_tiling`; 17.01 on the 32x32 tiles of the
# batched ladder, and 17.13 or 17.79 with only the convolutions over 128 or 256 channels or more
# offered it); F(4×4, 3×3) 14.17 (14.18): its 36 products 2.12 ms a step against F(2)'s 16 at
# 3.23, its transforms moving 2.25× the image's bytes against 4×. Its float32 error is ~5× the
# direct GEMM's (tests/test_winograd.py), F(2)'s about the same. The weight gradients as
# F(3×3, 4×4) (rule conv_winograd_weight; the plan takes it for the 8×8 and 4×4 stages, whose
# outputs fill the GPU): 14.26 → 13.02 ms (14.23 → 13.07 again), 02:40 UTC.
WINOGRAD_TILES = {"hopper": 4}
# On a CPU (lavapipe, this project's 2-core machine, 2026-12-04 ~03:00 UTC, a scratch script
# timing `train_step` of `bench.workloads.resnet(depth=8, batch=16, size=32, width=32)`, medians
# of 5 steps, ms): no Winograd 2636, 2147, 2034 in three processes; F(2×2) 1559 (69 of its 418
# kernels transforms); F(4×4) 1516, 1277, 1283 (98 of 448). The example ResNet of 8×8 digits
# (examples/resnet_digits.py) takes none: its convolutions are too small for the transforms to
# pay in the cost model.
CPU_WINOGRAD_TILE = 4
