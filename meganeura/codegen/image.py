"""Lowering of the plain image ops (NCHW), one thread per output element each
(shaders/elementwise.wgsl): `unfold` (im2col) and `fold` (col2im), and pooling.

Geometry (ir/ops/image.py): column row r = (c·kh + i)·kw + j, column l = ho·Wo + wo, reading pixel
(y, x) = (ho·sh − ph + i, wo·sw − pw + j) of channel c, 0 outside the image.

- max_pool2d / avg_pool2d: a thread per output (n, c, ho, wo) loops over its kh×kw window,
  skipping the padding (−inf for max, 0 for the average, which always divides by kh·kw).
- max_pool2d_grad / avg_pool2d_grad gather, deterministically and without atomics: a thread per
  image pixel (n, c, y, x) loops over the windows that contain it, oh ∈ [⌈(y + ph − kh + 1)/sh⌉,
  ⌊(y + ph)/sh⌋] ∩ [0, Ho) (the same for ow), and sums their gradient. max_pool2d_grad recomputes
  each such window's arg-max from x (the first maximum in scan order: a strict `>` while scanning
  row by row; the last NaN of a window that has one, as PyTorch) and takes the window's gradient
  only when the arg-max is this pixel.
"""

from __future__ import annotations

from collections.abc import Callable

from meganeura.codegen.common import Operands, elementwise_kernel, shape_text
from meganeura.codegen.expressions import helper_functions, literal
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.ir.graph import Graph, Node


def geometry_text(node: Node) -> str:
    kernel, stride, padding = (tuple(node.attr(key)) for key in ("kernel", "stride", "padding"))
    return f"k={kernel[0]}x{kernel[1]} s={stride[0]},{stride[1]} p={padding[0]},{padding[1]}"


@lowering("unfold")
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


@lowering("fold")
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


# ---------------------------------------------------------------------------------------------
# Pooling

NEG_INF = literal(float("-inf"))


def window(node: Node) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    kernel, stride, padding = (tuple(node.attr(key)) for key in ("kernel", "stride", "padding"))
    return kernel, stride, padding


def label(node: Node, image: tuple[int, ...]) -> str:
    (kh, kw), (sh, sw), (ph, pw) = window(node)
    return f"{node.op} {shape_text(image)} k={kh}x{kw} s={sh},{sw} p={ph},{pw}"


def window_scan(x_at: Callable[[str], str], image: tuple[int, int], kernel, stride, padding, body: str) -> list[str]:
    """WGSL lines looping over the window at (oh, ow) of the plane starting at `base`: `body` runs
    for each pixel inside the image with `v` its value and `p` its index in the plane (y·W + x)."""
    (height, width), (kh, kw), (sh, sw), (ph, pw) = image, kernel, stride, padding
    return [
        f"for (var ki = 0i; ki < {kh}i; ki++) {{",
        f"    let yy = oh * {sh}i - {ph}i + ki;",
        f"    if (yy < 0i || yy >= {height}i) {{ continue; }}",
        f"    for (var kj = 0i; kj < {kw}i; kj++) {{",
        f"        let xx = ow * {sw}i - {pw}i + kj;",
        f"        if (xx < 0i || xx >= {width}i) {{ continue; }}",
        f"        let p = u32(yy * {width}i + xx);",
        f"        let v = {x_at('base + p')};",
        f"        {body}",
        "    }",
        "}",
    ]


@lowering("max_pool2d", "avg_pool2d")
def lower_pool(graph: Graph, node: Node) -> KernelSpec:
    """max_pool2d / avg_pool2d: output element i = (plane, oh, ow) reduces its window."""
    x = node.inputs[0]
    _, _, height, width = graph[x].shape
    kernel, stride, padding = window(node)
    ho, wo = node.shape[2:]
    operands = Operands(graph)
    maximum = node.op == "max_pool2d"
    lines = [
        f"let ow = i32(i % {wo}u);",
        f"let oh = i32((i / {wo}u) % {ho}u);",
        f"let base = (i / {ho * wo}u) * {height * width}u;",
        f"var acc = {NEG_INF if maximum else '0.0'};",
    ]
    # NaN propagates through the maximum, as in PyTorch (and numpy's max); tested from the bits,
    # since a compiler may fold v != v to false (WGSL lets it assume there is no NaN).
    body = "if (v > acc || mn_isnan(v)) { acc = v; }" if maximum else "acc += v;"
    lines += window_scan(lambda at: operands.read_at(x, at), (height, width), kernel, stride, padding, body)
    value = "acc" if maximum else f"acc / {float(kernel[0] * kernel[1])}"
    functions = helper_functions([], ("isnan",)) if maximum else ""
    return elementwise_kernel(
        graph, node, operands, "\n    ".join(lines), value, functions, label(node, graph[x].shape)
    )


def covering_windows(image: tuple[int, int], out: tuple[int, int], kernel, stride, padding) -> list[str]:
    """WGSL lines opening two loops over the windows (oh, ow) that contain pixel (y, x) of a plane
    (`i` an index into [N, C, H, W]); the caller closes them with two `}`."""
    (height, width), (ho, wo), (kh, kw), (sh, sw), (ph, pw) = image, out, kernel, stride, padding
    # i32 division truncates toward zero; a negative numerator can only round up to 0, which the
    # max(·, 0) clamps anyway, so the lower bound is ⌈(y + ph − kh + 1)/sh⌉ clamped to 0.
    return [
        f"let y = i32((i / {width}u) % {height}u);",
        f"let x = i32(i % {width}u);",
        f"let oh_lo = max((y + {ph - kh + sh}i) / {sh}i, 0i);",
        f"let oh_hi = min((y + {ph}i) / {sh}i, {ho - 1}i);",
        f"let ow_lo = max((x + {pw - kw + sw}i) / {sw}i, 0i);",
        f"let ow_hi = min((x + {pw}i) / {sw}i, {wo - 1}i);",
        "var total = 0.0;",
        "for (var oh = oh_lo; oh <= oh_hi; oh++) {",
        "for (var ow = ow_lo; ow <= ow_hi; ow++) {",
    ]


@lowering("max_pool2d_grad", "avg_pool2d_grad")
def lower_pool_grad(graph: Graph, node: Node) -> KernelSpec:
    """max_pool2d_grad / avg_pool2d_grad: image pixel i sums the gradient of the windows covering it
    (for max, of those whose arg-max it is)."""
    g = node.inputs[-1]
    n, c, height, width = node.shape
    ho, wo = graph[g].shape[2:]
    kernel, stride, padding = window(node)
    operands = Operands(graph)
    lines = [
        f"let plane = i / {height * width}u;",
        f"let base = plane * {height * width}u;",
        f"let gbase = plane * {ho * wo}u;",
        *covering_windows((height, width), (ho, wo), kernel, stride, padding),
    ]
    g_at = operands.read_at(g, f"gbase + u32(oh * {wo}i + ow)")
    functions = ""
    if node.op == "max_pool2d_grad":
        x = node.inputs[0]
        # PyTorch's arg-max: the window's first pixel, then each that is greater or NaN (so the
        # first maximum, the last NaN, the first pixel of an all −inf window).
        none = height * width
        scan = window_scan(
            lambda at: operands.read_at(x, at),
            (height, width),
            kernel,
            stride,
            padding,
            f"if (arg == {none}u || v > best || mn_isnan(v)) {{ best = v; arg = p; }}",
        )
        lines += [f"var best = {NEG_INF};", f"var arg = {none}u;", *scan]
        lines += [f"if (arg == i % {height * width}u) {{ total += {g_at}; }}"]
        value = "total"
        functions = helper_functions([], ("isnan",))
    else:
        lines.append(f"total += {g_at};")
        value = f"total / {float(kernel[0] * kernel[1])}"
    lines += ["}", "}"]
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), value, functions, label(node, node.shape))
