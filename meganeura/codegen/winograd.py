"""Lowering of Winograd's F(2×2, 3×3) transforms (ir/ops/winograd.py), and on which adapters the
plan may use them (`winograd_offered`); the 16 GEMMs between the transforms are one batched
matmul (codegen/matmul.py).

Each transform is a kernel of shaders/winograd.wgsl where a thread owns one unit of 16 values
and computes them in registers, the 4×4 matrix products written out as sums of rows (`B_T_ROWS`,
`G_ROWS`, `A_T_ROWS`: every row of Bᵀ and Aᵀ is two or three ±1 entries, every row of G at most
three ±½), and writes each of the 16 to its own position plane, so that neighbouring threads
write neighbouring elements:
- winograd_input: a thread per (channel, tile), t fastest: it loads its 4×4 input tile (0 outside
  the image; the index clamped so that every load is in bounds), V = Bᵀ·d·B;
- winograd_weight: a thread per filter pair (o, c), or (c, o) flipped: its 9 taps (rotated by 180°
  when flipped), U = G·g·Gᵀ;
- winograd_output: a thread per (filter, tile): its 16 values of M, y = Aᵀ·M·A, the 2×2 pixels
  that fall inside the output stored (a ragged last row or column of tiles stores fewer).
The first cut, a thread per output element with the taps picked through small arrays, ran
these transforms 4-7× slower on the H200 than this (ResNet-18's input transform of the 32×32
stage 0.35 → 0.05 ms) and made the step slower than the direct convolutions.
"""

from __future__ import annotations

from meganeura.codegen.common import Operands, bindings_wgsl, grid_for, output_binding, shape_text
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops.winograd import tiles, transformed_size
from meganeura.target import Target


def units_workgroups(units: int) -> int:
    return -(-units // WORKGROUP)


WORKGROUP = 256


def transform_kernel(
    graph: Graph, node: Node, operands: Operands, units: int, body: list[str], label: str
) -> KernelSpec:
    """The kernel of shaders/winograd.wgsl running `body` for each of `units` threads."""
    bindings = operands.bindings + [output_binding(node)]
    grid = grid_for(units_workgroups(units))
    wgsl = render(
        "winograd",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "UNITS": units,
            "GRID_X": max(grid[0], 1),
            "BODY": "\n    ".join(body),
        },
    )
    return KernelSpec(node.id, label, wgsl, "winograd", tuple(bindings), grid, (WORKGROUP, 1, 1), trusted=True)


# Bᵀ's rows as combinations of a 4×4 tile's rows (or of a row's 4 entries): d0 − d2, d1 + d2,
# d2 − d1, d1 − d3; Aᵀ's: d0 + d1 + d2, d1 − d2 − d3; G's: g0, (g0 + g1 + g2)/2, (g0 − g1 + g2)/2, g2.
B_T_ROWS = ("{0} - {2}", "{1} + {2}", "{2} - {1}", "{1} - {3}")
A_T_ROWS = ("{0} + {1} + {2}", "{1} - {2} - {3}")
G_ROWS = ("{0}", "0.5 * ({0} + {1} + {2})", "0.5 * ({0} - {1} + {2})", "{2}")


def combine(rows: tuple[str, ...], name: str, parts: list[str]) -> list[str]:
    """`let {name}{k} = …;` for each row of a transform matrix applied to `parts`."""
    return [f"let {name}{k} = {row.format(*parts)};" for k, row in enumerate(rows)]


def lanes(rows: tuple[str, ...], vector: str, size: int) -> list[str]:
    """Each row of a transform matrix applied to the `size` lanes of `vector` (x, y, z, w)."""
    names = [f"{vector}.{lane}" for lane in "xyzw"[:size]]
    return [row.format(*names) for row in rows]


@lowering("winograd_input", workgroups=lambda attrs, operands, results: units_workgroups(results[0].numel // 16))
def lower_winograd_input(graph: Graph, node: Node) -> KernelSpec:
    """Thread (c, t) loads its 4×4 tile (0 outside the image) as four vec4 rows, forms Bᵀ·d
    row-wise, then ·B within each row, and writes the 16 values, C·T apart."""
    x = node.inputs[0]
    (height, width), (ph, pw) = tuple(node.attr("image")), tuple(node.attr("padding"))
    th, tw = tiles(transformed_size((height, width), (ph, pw)))
    _, channels, count = node.shape
    operands = Operands(graph)
    body = [
        f"let t = i % {count}u;",
        f"let plane = ((t / {th * tw}u) * {channels}u + i / {count}u) * {height * width}u;",
        f"let top = i32(((t / {tw}u) % {th}u) * 2u) - {ph}i;",
        f"let left = i32((t % {tw}u) * 2u) - {pw}i;",
    ]
    for s in range(4):
        body += [
            f"let col{s} = left + {s}i;",
            f"let in_col{s} = col{s} >= 0i && col{s} < {width}i;",
            f"let at_col{s} = u32(clamp(col{s}, 0i, {width - 1}i));",
        ]
    for r in range(4):
        body += [
            f"let row{r} = top + {r}i;",
            f"let in_row{r} = row{r} >= 0i && row{r} < {height}i;",
            f"let at_row{r} = plane + u32(clamp(row{r}, 0i, {height - 1}i)) * {width}u;",
        ]
        pixels = [
            f"select(0.0, {operands.read_at(x, f'at_row{r} + at_col{s}')}, in_row{r} && in_col{s})" for s in range(4)
        ]
        body.append(f"let d{r} = vec4<f32>({', '.join(pixels)});")
    body += combine(B_T_ROWS, "e", [f"d{r}" for r in range(4)])
    for a in range(4):
        for b, value in enumerate(lanes(B_T_ROWS, f"e{a}", 4)):
            body.append(f"out[{(4 * a + b) * channels * count}u + i] = {value};")
    label = f"winograd_input {shape_text(graph[x].shape)} image {height}x{width} p={ph},{pw}"
    return transform_kernel(graph, node, operands, channels * count, body, label)


@lowering("winograd_weight", workgroups=lambda attrs, operands, results: units_workgroups(results[0].numel // 16))
def lower_winograd_weight(graph: Graph, node: Node) -> KernelSpec:
    """Thread (o, c) (flipped: (c, o)) loads its filter's 9 taps as three vec3 rows (rotated by
    180° when flipped), forms G·g, then ·Gᵀ within each row, and writes the 16 values."""
    w = node.inputs[0]
    flip = node.attr("flip")
    filters, channels = graph[w].shape[0], graph[w].shape[1] // 9
    rows, cols = (channels, filters) if flip else (filters, channels)
    operands = Operands(graph)
    body = [
        f"let col = i % {cols}u;",
        f"let row = i / {cols}u;",
        f"let base = ({'col' if flip else 'row'} * {channels}u + {'row' if flip else 'col'}) * 9u;",
    ]
    for r in range(3):
        taps = [operands.read_at(w, f"base + {(2 - r) * 3 + 2 - c if flip else r * 3 + c}u") for c in range(3)]
        body.append(f"let g{r} = vec3<f32>({', '.join(taps)});")
    body += combine(G_ROWS, "h", [f"g{r}" for r in range(3)])
    for a in range(4):
        for b, value in enumerate(lanes(G_ROWS, f"h{a}", 3)):
            body.append(f"out[{(4 * a + b) * rows * cols}u + i] = {value};")
    label = f"winograd_weight {shape_text(graph[w].shape)}{' flipped' if flip else ''}"
    return transform_kernel(graph, node, operands, rows * cols, body, label)


@lowering("winograd_output", workgroups=lambda attrs, operands, results: units_workgroups(operands[0].numel // 16))
def lower_winograd_output(graph: Graph, node: Node) -> KernelSpec:
    """Thread (o, t) loads its tile's 16 values as four vec4 rows, forms Aᵀ·M, then ·A within
    each row, and writes the 2×2 pixels that fall inside the output."""
    m = node.inputs[0]
    _, filters, height, width = node.shape
    th, tw = tiles((height, width))
    count = graph[m].shape[2]
    operands = Operands(graph)
    body = [
        f"let t = i % {count}u;",
        f"let y = ((t / {tw}u) % {th}u) * 2u;",
        f"let x = (t % {tw}u) * 2u;",
        f"let corner = ((t / {th * tw}u) * {filters}u + i / {count}u) * {height * width}u + y * {width}u + x;",
    ]
    for a in range(4):
        values = [operands.read_at(m, f"{(4 * a + b) * filters * count}u + i") for b in range(4)]
        body.append(f"let m{a} = vec4<f32>({', '.join(values)});")
    body += combine(A_T_ROWS, "p", [f"m{a}" for a in range(4)])
    for p in range(2):
        for q, value in enumerate(lanes(A_T_ROWS, f"p{p}", 4)):
            inside = " && ".join(filter(None, [f"y + {p}u < {height}u" * (height % 2 == 1 and p == 1),
                                                f"x + {q}u < {width}u" * (width % 2 == 1 and q == 1)]))  # fmt: skip
            store = f"out[corner + {p * width + q}u] = {value};"
            body.append(f"if ({inside}) {{ {store} }}" if inside else store)
    label = f"winograd_output {shape_text(graph[m].shape)} -> {shape_text(node.shape)}"
    return transform_kernel(graph, node, operands, filters * count, body, label)


def winograd_offered(target: Target) -> bool:
    """Whether a plan for `target` may run stride-1 3×3 convolutions (forward and input gradient)
    as Winograd transforms around a batched GEMM (the cost model then chooses, convolution by
    convolution): on the adapter families where it was measured to pay. On the H200, ResNet-18's
    step (batch 128) went from 19.26 to 17.01 ms of GPU time with every stage offered it, 17.13
    with the convolutions over 128 channels or more, 17.79 over 256 or more
    (docs/performance-log.md, 2026-12-04)."""
    return target.tuning in WINOGRAD_TUNINGS


WINOGRAD_TUNINGS = frozenset({"hopper"})
