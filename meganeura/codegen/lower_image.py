"""Lowering of the plain image ops (NCHW): `unfold` (im2col) and `fold` (col2im), one thread per
output element each, on the elementwise template.

This module owns these two lowerings only: the implicit-GEMM convolution kernels the e-graph makes
of unfold/fold compositions, and the pooling ops, are lowered elsewhere. `IMAGE_LOWERINGS` is
merged into `lower.LOWERINGS` at the end of `lower.py`.

Geometry (conv_ops.py): column row r = (c·kh + i)·kw + j, column l = ho·Wo + wo, reading pixel
(y, x) = (ho·sh − ph + i, wo·sw − pw + j) of channel c, 0 outside the image.
"""

from __future__ import annotations

from collections.abc import Callable

from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.lower import Operands, elementwise_kernel, shape_text
from meganeura.ir.graph import Graph, Node


def geometry_text(node: Node) -> str:
    kernel, stride, padding = (tuple(node.attr(key)) for key in ("kernel", "stride", "padding"))
    return f"k={kernel[0]}x{kernel[1]} s={stride[0]},{stride[1]} p={padding[0]},{padding[1]}"


def lower_unfold(graph: Graph, node: Node) -> KernelSpec:
    """unfold [N, C, H, W] → [N, C·kh·kw, L]: output element i decodes (n·C + c, i, j, ho, wo) and
    reads x at (ho·sh − ph + i, wo·sw − pw + j), or 0 in the padding."""
    image = node.inputs[0]
    _, _, height, width = graph[image].shape
    (kh, kw), (sh, sw), (ph, pw) = (tuple(node.attr(key)) for key in ("kernel", "stride", "padding"))
    positions = node.shape[2]
    wo_count = out_width(width, kw, sw, pw)
    operands = Operands(graph)
    lines = [
        f"let wo = i % {wo_count}u;",
        f"let ho = (i / {wo_count}u) % {positions // wo_count}u;",
        f"let j = (i / {positions}u) % {kw}u;",
        f"let ki = (i / {positions * kw}u) % {kh}u;",
        f"let plane = i / {positions * kw * kh}u;",
        f"let iy = i32(ho * {sh}u + ki) - {ph}i;",
        f"let ix = i32(wo * {sw}u + j) - {pw}i;",
        "var value = 0.0;",
        f"if (iy >= 0i && iy < {height}i && ix >= 0i && ix < {width}i) {{",
        f"    value = {operands.read_at(image, f'plane * {height * width}u + u32(iy) * {width}u + u32(ix)')};",
        "}",
    ]
    label = f"unfold {shape_text(graph[image].shape)} {geometry_text(node)}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "value", "", label)


def out_width(width: int, kw: int, sw: int, pw: int) -> int:
    return (width + 2 * pw - kw) // sw + 1


def lower_fold(graph: Graph, node: Node) -> KernelSpec:
    """fold [N, C·kh·kw, L] → [N, C, H, W], gathering (deterministic, no atomics): pixel (y, x) of
    plane n·C + c sums, over the taps (i, j), the column entry of the window (ho, wo) with
    ho·sh − ph + i = y and wo·sw − pw + j = x, where such a window exists."""
    cols = node.inputs[0]
    _, _, height, width = node.shape
    (kh, kw), (sh, sw), (ph, pw) = (tuple(node.attr(key)) for key in ("kernel", "stride", "padding"))
    positions = graph[cols].shape[2]
    wo_count = out_width(width, kw, sw, pw)
    ho_count = positions // wo_count
    operands = Operands(graph)
    entry = operands.read_at(
        cols, f"((plane * {kh}u + ki) * {kw}u + j) * {positions}u + u32(ty) * {wo_count}u + u32(tx)"
    )
    lines = [
        f"let px = i32(i % {width}u);",
        f"let py = i32((i / {width}u) % {height}u);",
        f"let plane = i / {height * width}u;",
        "var total = 0.0;",
        f"for (var ki = 0u; ki < {kh}u; ki++) {{",
        f"    let oy = py + {ph}i - i32(ki);",
        f"    if (oy < 0i || oy % {sh}i != 0i || oy / {sh}i >= {ho_count}i) {{",
        "        continue;",
        "    }",
        f"    let ty = oy / {sh}i;",
        f"    for (var j = 0u; j < {kw}u; j++) {{",
        f"        let ox = px + {pw}i - i32(j);",
        f"        if (ox < 0i || ox % {sw}i != 0i || ox / {sw}i >= {wo_count}i) {{",
        "            continue;",
        "        }",
        f"        let tx = ox / {sw}i;",
        f"        total += {entry};",
        "    }",
        "}",
    ]
    label = f"fold {shape_text(graph[cols].shape)} -> {shape_text(node.shape)} {geometry_text(node)}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "total", "", label)


IMAGE_LOWERINGS: dict[str, Callable[..., KernelSpec]] = {
    "unfold": lower_unfold,
    "fold": lower_fold,
}
