"""Lowering of the plain image ops (NCHW), one thread per output element each
(shaders/elementwise.wgsl): `unfold` (im2col) and `fold` (col2im), pooling, and the adaptive pools.

Geometry (ir/ops/image.py): column row r = (c·kh + i)·kw + j, column l = ho·Wo + wo, reading pixel
(y, x) = (ho·sh − ph + i·dh, wo·sw − pw + j·dw) of channel c, 0 outside the image.

- max_pool2d / avg_pool2d: a thread per output (n, c, ho, wo) loops over its kh×kw window (taps
  dh, dw apart for max), skipping the padding (−inf for max, 0 for the average, which divides by
  kh·kw, or by torch's divisor of the window where ceil_mode or count_include_pad=False make it vary).
- max_pool2d_grad / avg_pool2d_grad gather, deterministically and without atomics: a thread per
  image pixel (n, c, y, x) loops over the windows that may contain it, oh ∈ [⌈(y + ph − e + 1)/sh⌉,
  ⌊(y + ph)/sh⌋] ∩ [0, Ho) with e = dh·(kh − 1) + 1 the window's extent (the same for ow), and
  sums their gradient. max_pool2d_grad recomputes each such window's arg-max from x (the first
  maximum in scan order: a strict `>` while scanning row by row; the last NaN of a window that
  has one, as PyTorch) and takes the window's gradient
  only when the arg-max is this pixel (which also skips the windows whose dilated taps miss it).
- adaptive_max_pool2d: a thread per output loops over its adaptive window [⌊i·H/oh⌋,
  ⌈(i + 1)·H/oh⌉) × (the same for W); adaptive_max_pool2d_grad, a thread per pixel, over the
  windows i ∈ [⌊y·oh/H⌋, ⌊((y + 1)·oh − 1)/H⌋] that contain row y (the same for x), recomputing
  each window's arg-max as torch picks it. adaptive_pool_matrix: a thread per entry.
"""

from __future__ import annotations

from collections.abc import Callable

from meganeura.codegen.common import Operands, elementwise_kernel, shape_text
from meganeura.codegen.expressions import helper_functions, literal
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.ir.graph import Graph, Node


def geometry_text(node: Node) -> str:
    kernel, stride, padding, dilation = (
        tuple(node.attr(key, (1, 1))) for key in ("kernel", "stride", "padding", "dilation")
    )
    dilated = f" d={dilation[0]},{dilation[1]}" if dilation != (1, 1) else ""
    return f"k={kernel[0]}x{kernel[1]} s={stride[0]},{stride[1]} p={padding[0]},{padding[1]}{dilated}"


@lowering("unfold")
def lower_unfold(graph: Graph, node: Node) -> KernelSpec:
    """unfold [N, C, H, W] → [N, C·kh·kw, L]: output element i decodes (n·C + c, i, j, ho, wo) and
    reads x at (ho·sh − ph + i·dh, wo·sw − pw + j·dw), or 0 in the padding."""
    image = node.inputs[0]
    _, _, height, width = graph[image].shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = conv_window(node)
    positions = node.shape[2]
    wo_count = out_width(width, kw, sw, pw, dw)
    operands = Operands(graph)
    lines = [
        f"let wo = i % {wo_count}u;",
        f"let ho = (i / {wo_count}u) % {positions // wo_count}u;",
        f"let j = (i / {positions}u) % {kw}u;",
        f"let ki = (i / {positions * kw}u) % {kh}u;",
        f"let plane = i / {positions * kw * kh}u;",
        f"let iy = i32(ho * {sh}u + ki * {dh}u) - {ph}i;",
        f"let ix = i32(wo * {sw}u + j * {dw}u) - {pw}i;",
        "var value = 0.0;",
        f"if (iy >= 0i && iy < {height}i && ix >= 0i && ix < {width}i) {{",
        f"    value = {operands.read_at(image, f'plane * {height * width}u + u32(iy) * {width}u + u32(ix)')};",
        "}",
    ]
    label = f"unfold {shape_text(graph[image].shape)} {geometry_text(node)}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "value", "", label)


def conv_window(node: Node) -> tuple[tuple[int, int], ...]:
    """(kernel, stride, padding, dilation) of an unfold or fold node."""
    return tuple(tuple(node.attr(key)) for key in ("kernel", "stride", "padding", "dilation"))


def out_width(width: int, kw: int, sw: int, pw: int, dw: int = 1) -> int:
    return (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1


@lowering("fold")
def lower_fold(graph: Graph, node: Node) -> KernelSpec:
    """fold [N, C·kh·kw, L] → [N, C, H, W], gathering (deterministic, no atomics): pixel (y, x) of
    plane n·C + c sums, over the taps (i, j), the column entry of the window (ho, wo) with
    ho·sh − ph + i·dh = y and wo·sw − pw + j·dw = x, where such a window exists."""
    cols = node.inputs[0]
    _, _, height, width = node.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = conv_window(node)
    positions = graph[cols].shape[2]
    wo_count = out_width(width, kw, sw, pw, dw)
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
        f"    let oy = py + {ph}i - i32(ki * {dh}u);",
        f"    if (oy < 0i || oy % {sh}i != 0i || oy / {sh}i >= {ho_count}i) {{",
        "        continue;",
        "    }",
        f"    let ty = oy / {sh}i;",
        f"    for (var j = 0u; j < {kw}u; j++) {{",
        f"        let ox = px + {pw}i - i32(j * {dw}u);",
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


def dilation_of(node: Node) -> tuple[int, int]:
    """A max pooling window's dilation ((1, 1) for the average's, which has none)."""
    return tuple(node.attr("dilation", (1, 1)))


def label(node: Node, image: tuple[int, ...]) -> str:
    return f"{node.op} {shape_text(image)} {geometry_text(node)}"


def window_scan(
    x_at: Callable[[str], str], image: tuple[int, int], kernel, stride, padding, body: str, dilation=(1, 1)
) -> list[str]:
    """WGSL lines looping over the window at (oh, ow) of the plane starting at `base`: `body` runs
    for each pixel inside the image with `v` its value and `p` its index in the plane (y·W + x)."""
    (height, width), (kh, kw), (sh, sw), (ph, pw), (dh, dw) = image, kernel, stride, padding, dilation
    return [
        f"for (var ki = 0i; ki < {kh}i; ki++) {{",
        f"    let yy = oh * {sh}i - {ph}i + ki * {dh}i;",
        f"    if (yy < 0i || yy >= {height}i) {{ continue; }}",
        f"    for (var kj = 0i; kj < {kw}i; kj++) {{",
        f"        let xx = ow * {sw}i - {pw}i + kj * {dw}i;",
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
    scan = window_scan(
        lambda at: operands.read_at(x, at), (height, width), kernel, stride, padding, body, dilation_of(node)
    )
    lines += scan
    value = "acc" if maximum else f"acc / {avg_divisor(node, (height, width))}"
    functions = helper_functions([], ("isnan",)) if maximum else ""
    return elementwise_kernel(
        graph, node, operands, "\n    ".join(lines), value, functions, label(node, graph[x].shape)
    )


def avg_divisor(node: Node, image: tuple[int, int]) -> str:
    """The f32 WGSL divisor of avg_pool2d's window at (oh, ow) (ir/ops/image.py `avg_divisors`):
    a literal where it is the same for every window (a divisor given, or kh·kw: the padding
    counts and no window passes it), else the window clipped to the padded image or to the image."""
    (kh, kw), (sh, sw), (ph, pw) = window(node)
    if node.attr("divisor"):
        return f"{float(node.attr('divisor'))}"
    if node.attr("count_include_pad") and not node.attr("ceil_mode"):
        return f"{float(kh * kw)}"
    height, width = image
    hs, ws = f"(oh * {sh}i - {ph}i)", f"(ow * {sw}i - {pw}i)"
    he, we = f"min({hs} + {kh}i, {height + ph}i)", f"min({ws} + {kw}i, {width + pw}i)"
    if node.attr("count_include_pad"):
        return f"f32(({he} - {hs}) * ({we} - {ws}))"
    return f"f32((min({he}, {height}i) - max({hs}, 0i)) * (min({we}, {width}i) - max({ws}, 0i)))"


def covering_windows(
    image: tuple[int, int], out: tuple[int, int], kernel, stride, padding, dilation=(1, 1)
) -> list[str]:
    """WGSL lines opening two loops over the windows (oh, ow) whose extent (dilation·(k − 1) + 1)
    contains pixel (y, x) of a plane (`i` an index into [N, C, H, W]); the caller closes them with
    two `}`."""
    (height, width), (ho, wo), (sh, sw), (ph, pw) = image, out, stride, padding
    kh, kw = (d * (k - 1) + 1 for k, d in zip(kernel, dilation, strict=True))
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
        *covering_windows((height, width), (ho, wo), kernel, stride, padding, dilation_of(node)),
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
            dilation_of(node),
        )
        lines += [f"var best = {NEG_INF};", f"var arg = {none}u;", *scan]
        lines += [f"if (arg == i % {height * width}u) {{ total += {g_at}; }}"]
        value = "total"
        functions = helper_functions([], ("isnan",))
    else:
        divisor = avg_divisor(node, (height, width))
        varies = divisor.startswith("f32(")
        lines.append(f"total += {g_at} / {divisor};" if varies else f"total += {g_at};")
        value = "total" if varies else f"total / {divisor}"
    lines += ["}", "}"]
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), value, functions, label(node, node.shape))


# ---------------------------------------------------------------------------------------------
# Adaptive pooling (ir/ops/image.py): torch's windows [⌊i·H/oh⌋, ⌈(i + 1)·H/oh⌉)

# The scan of one adaptive window (oh, ow) of the plane at `base`, torch's arg-max rule: a NaN
# replaces the best so far, a number only a smaller one (`best`, `arg` its index in the plane).
# NaN is told from the bits: a compiler may fold v != v to false (WGSL lets it assume no NaN).
ADAPTIVE_SCAN = """let hs = (u32(oh) * {h}u) / {oh}u;
    let he = ((u32(oh) + 1u) * {h}u + {oh}u - 1u) / {oh}u;
    let ws = (u32(ow) * {w}u) / {ow}u;
    let we = ((u32(ow) + 1u) * {w}u + {ow}u - 1u) / {ow}u;
    var best = {neg_inf};
    var arg = hs * {w}u + ws;
    for (var yy = hs; yy < he; yy++) {{
        for (var xx = ws; xx < we; xx++) {{
            let p = yy * {w}u + xx;
            let v = {x_at};
            if (v > best || (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u) {{ best = v; arg = p; }}
        }}
    }}"""


def adaptive_scan(x_at: Callable[[str], str], image: tuple[int, int], out: tuple[int, int]) -> str:
    (height, width), (oh, ow) = image, out
    return ADAPTIVE_SCAN.format(h=height, w=width, oh=oh, ow=ow, neg_inf=NEG_INF, x_at=x_at("base + p"))


@lowering("adaptive_max_pool2d")
def lower_adaptive_max_pool2d(graph: Graph, node: Node) -> KernelSpec:
    """adaptive_max_pool2d: output element i = (plane, oh, ow) scans its adaptive window."""
    x = node.inputs[0]
    _, _, height, width = graph[x].shape
    ho, wo = node.shape[2:]
    operands = Operands(graph)
    lines = [
        f"let ow = i % {wo}u;",
        f"let oh = (i / {wo}u) % {ho}u;",
        f"let base = (i / {ho * wo}u) * {height * width}u;",
        adaptive_scan(lambda at: operands.read_at(x, at), (height, width), (ho, wo)),
    ]
    label = f"adaptive_max_pool2d {shape_text(graph[x].shape)} -> {ho}x{wo}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "best", "", label)


@lowering("adaptive_max_pool2d_grad")
def lower_adaptive_max_pool2d_grad(graph: Graph, node: Node) -> KernelSpec:
    """adaptive_max_pool2d_grad: pixel i = (plane, y, x) sums the gradient of the windows that
    contain it and whose arg-max it is."""
    x, g = node.inputs
    _, _, height, width = node.shape
    ho, wo = graph[g].shape[2:]
    operands = Operands(graph)
    g_at = operands.read_at(g, f"gbase + oh * {wo}u + ow")
    scan = adaptive_scan(lambda at: operands.read_at(x, at), (height, width), (ho, wo))
    lines = [
        f"let plane = i / {height * width}u;",
        f"let base = plane * {height * width}u;",
        f"let gbase = plane * {ho * wo}u;",
        f"let y = (i / {width}u) % {height}u;",
        f"let x = i % {width}u;",
        "var total = 0.0;",
        f"for (var oh = (y * {ho}u) / {height}u; oh <= ((y + 1u) * {ho}u - 1u) / {height}u; oh++) {{",
        f"for (var ow = (x * {wo}u) / {width}u; ow <= ((x + 1u) * {wo}u - 1u) / {width}u; ow++) {{",
        scan,
        f"if (arg == i % {height * width}u) {{ total += {g_at}; }}",
        "}",
        "}",
    ]
    label = f"adaptive_max_pool2d_grad {shape_text(node.shape)} <- {ho}x{wo}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "total", "", label)


@lowering("adaptive_pool_matrix")
def lower_adaptive_pool_matrix(graph: Graph, node: Node) -> KernelSpec:
    """adaptive_pool_matrix [out, size]: entry (row, col) 1/|window row| inside the window, else 0."""
    out, size = node.shape
    reads = "\n    ".join(
        [
            f"let row = i / {size}u;",
            f"let col = i % {size}u;",
            f"let start = (row * {size}u) / {out}u;",
            f"let end = ((row + 1u) * {size}u + {out}u - 1u) / {out}u;",
        ]
    )
    value = "select(0.0, 1.0 / f32(end - start), col >= start && col < end)"
    return elementwise_kernel(graph, node, Operands(graph), reads, value, "", f"adaptive_pool_matrix [{out},{size}]")
