"""Lowering of the selection ops (ir/ops/select.py).

One thread per output element (shaders/elementwise.wgsl), its READS doing the index arithmetic:
`cast`, `flip`, `gather_axis`, `flat_index`, and `scatter_axis_add`, whose thread loops over the
index positions along the axis that could land on its element and sums them in order
(deterministic, no atomics). The ops that walk a line of the axis use shaders/lines.wgsl: a
thread per line for `cumsum`, `cumprod` and `arg_reduce`, a thread per element for
`cumprod_grad` and `topk` (each element's rank in its line: O(L²) comparisons per line, over L
threads). NaN is told from its bits (`mn_isnan`): WGSL lets a compiler assume that no value is NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    coordinate,
    elementwise_kernel,
    grid_for,
    output_binding,
    row_major_strides,
    shape_text,
    sum_terms,
)
from meganeura.codegen.expressions import literal
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node, TensorType

NAN = literal(float("nan"))
LINES_WORKGROUP = 64

MN_TO_I32 = """// torch's .int() on x86: toward zero; NaN, ±inf and values outside i32 give i32's minimum
fn mn_to_i32(v: f32) -> i32 {
    if ((bitcast<u32>(v) & 0x7fffffffu) < 0x4f000000u) {
        return i32(v);
    }
    return bitcast<i32>(0x80000000u);
}"""
MN_ISNAN = "fn mn_isnan(v: f32) -> bool {\n    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;\n}"
# Whether v replaces the best so far, walking a line in order: NaN beats any number, a tie keeps the first.
MN_BETTER = {
    largest: f"""fn mn_better(v: f32, best: f32) -> bool {{
    let nv = mn_isnan(v);
    let nb = mn_isnan(best);
    return !nb && (nv || v {symbol} best);
}}"""
    for largest, symbol in ((True, ">"), (False, "<"))
}
# Whether w (at an earlier index when `earlier`) comes before v in topk's order.
MN_BEFORE = {
    True: """fn mn_before(w: f32, v: f32, earlier: bool) -> bool {
    let nw = mn_isnan(w);
    let nv = mn_isnan(v);
    if (nw || nv) {
        return nw && (!nv || earlier);
    }
    return w > v || (w == v && earlier);
}""",
    False: """fn mn_before(w: f32, v: f32, earlier: bool) -> bool {
    let nw = mn_isnan(w);
    let nv = mn_isnan(v);
    if (nw || nv) {
        return nv && (!nw || earlier);
    }
    return w < v || (w == v && earlier);
}""",
}


def coordinate_lets(var: str, shape: tuple[int, ...], prefix: str = "c") -> list[str]:
    """`let c0 = …;` … : the coordinates of row-major index `var` over `shape`."""
    lets, inner = [], 1
    for d in range(len(shape) - 1, -1, -1):
        lets.append(f"let {prefix}{d} = {coordinate(var, inner, shape[d], d == 0)};")
        inner *= shape[d]
    return list(reversed(lets))


def offset(coords: Sequence[str], strides: Sequence[int]) -> str:
    """WGSL u32 Σ coords[d]·strides[d] (terms with a zero stride left out)."""
    return sum_terms(*(c if s == 1 else f"{c} * {s}u" for c, s in zip(coords, strides, strict=True) if s))


def joined(lines: list[str]) -> str:
    return "\n    ".join(lines)


# ---------------------------------------------------------------------------------------------
# One thread per output element


@lowering("cast")
def lower_cast(graph: Graph, node: Node) -> KernelSpec:
    """cast: f32(x), or torch's x86 truncation to i32 (mn_to_i32)."""
    operands = Operands(graph)
    value = operands.read_at(node.inputs[0], "i")
    if node.dtype == "i32":
        return elementwise_kernel(graph, node, operands, "", f"mn_to_i32({value})", MN_TO_I32, "cast to i32")
    return elementwise_kernel(graph, node, operands, "", f"f32({value})", "", "cast to f32")


@lowering("flip")
def lower_flip(graph: Graph, node: Node) -> KernelSpec:
    """flip: out[c] = x[c with each flipped coordinate d read at size_d − 1 − c_d]."""
    shape, axes = node.shape, set(node.attr("axes"))
    coords = [f"({shape[d] - 1}u - c{d})" if d in axes else f"c{d}" for d in range(len(shape))]
    operands = Operands(graph)
    value = operands.read_at(node.inputs[0], offset(coords, row_major_strides(shape)))
    label = f"flip {shape_text(shape)} dims {sorted(axes)}"
    return elementwise_kernel(graph, node, operands, joined(coordinate_lets("i", shape)), value, "", label)


@lowering("gather_axis")
def lower_gather_axis(graph: Graph, node: Node) -> KernelSpec:
    """gather_axis: out[c] = x[c with c[axis] = index[c]] (NaN for an index outside the dim)."""
    x, index = node.inputs
    axis, shape = node.attr("axis"), node.shape
    x_shape = graph[x].shape
    size = x_shape[axis]
    operands = Operands(graph)
    reads = [*coordinate_lets("i", shape), f"let sel = {operands.read_at(index, 'i')};"]
    coords = [f"u32(clamp(sel, 0i, {size - 1}i))" if d == axis else f"c{d}" for d in range(len(shape))]
    value = operands.read_at(x, offset(coords, row_major_strides(x_shape)))
    value = f"select({NAN}, {value}, sel >= 0i && sel < {size}i)"
    label = f"gather {shape_text(x_shape)} dim {axis} -> {shape_text(shape)}"
    return elementwise_kernel(graph, node, operands, joined(reads), value, "", label)


@lowering("scatter_axis_add")
def lower_scatter_axis_add(graph: Graph, node: Node) -> KernelSpec:
    """scatter_axis_add: out[c] = Σ src[q] over the index positions q along the axis through c
    (q = c with q[axis] = k) where index[q] == c[axis], in order of k; 0 outside the index's block."""
    src, index = node.inputs
    axis, shape = node.attr("axis"), node.shape
    index_shape, src_shape = graph[index].shape, graph[src].shape
    operands = Operands(graph)
    index_strides, src_strides = row_major_strides(index_shape), row_major_strides(src_shape)
    coords = [f"c{d}" for d in range(len(shape))]
    others = [d for d in range(len(shape)) if d != axis]
    inside = " && ".join(f"c{d} < {index_shape[d]}u" for d in others if index_shape[d] < shape[d]) or "true"
    at_k = ["k" if d == axis else c for d, c in enumerate(coords)]
    hit = operands.read_at(index, offset(at_k, index_strides))
    term = operands.read_at(src, offset(at_k, src_strides))
    reads = [
        *coordinate_lets("i", shape),
        "var total = 0.0;",
        f"if ({inside}) {{",
        f"    for (var k = 0u; k < {index_shape[axis]}u; k++) {{",
        f"        if ({hit} == i32(c{axis})) {{",
        f"            total += {term};",
        "        }",
        "    }",
        "}",
    ]
    label = f"scatter_add {shape_text(src_shape)} dim {axis} -> {shape_text(shape)}"
    return elementwise_kernel(graph, node, operands, joined(reads), "total", "", label)


@lowering("flat_index")
def lower_flat_index(graph: Graph, node: Node) -> KernelSpec:
    """flat_index: Σ wrap(index_d)·stride_d, each index broadcast to the result; -1 if any is out of range."""
    sizes = node.attr("sizes")
    operands = Operands(graph)
    reads, valid, terms = [], [], []
    for d, (index, size, stride) in enumerate(zip(node.inputs, sizes, row_major_strides(sizes), strict=True)):
        reads.append(f"let v{d} = {operands.read(index, node.shape)};")
        reads.append(f"let w{d} = select(v{d}, v{d} + {size}i, v{d} < 0i);")
        valid.append(f"w{d} >= 0i && w{d} < {size}i")
        terms.append(f"w{d}" if stride == 1 else f"w{d} * {stride}i")
    value = f"select(-1i, {' + '.join(terms)}, {' && '.join(valid)})"
    label = f"flat_index {shape_text(node.shape)} in {shape_text(sizes)}"
    return elementwise_kernel(graph, node, operands, joined(reads), value, "", label)


# ---------------------------------------------------------------------------------------------
# Walking lines (shaders/lines.wgsl)


def line_sizes(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    """(lines before the axis, L, INNER) of a tensor of `shape` walked along `axis`."""
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])


def line_start(shape: tuple[int, ...], axis: int, line: str) -> list[str]:
    """`let base = …;`: the flat index of element 0 of line `line` (before the axis, after it)."""
    _, length, inner = line_sizes(shape, axis)
    if inner == 1:
        return [f"let base = {line} * {length}u;"]
    return [f"let base = ({line} / {inner}u) * {length * inner}u + {line} % {inner}u;"]


def element_lets(shape: tuple[int, ...], axis: int) -> list[str]:
    """`let k = …; let base = …;`: element t's position along the axis and its line's element 0."""
    _, length, inner = line_sizes(shape, axis)
    k = f"(t % {length}u)" if inner == 1 else f"((t / {inner}u) % {length}u)"
    return [f"let k = {k};", f"let base = t - k * {inner}u;"]


def per_line(attrs: dict, operands: Sequence[TensorType], results: tuple[TensorType, ...]) -> int:
    """A thread per line of the axis, 64 threads per workgroup."""
    outer, _, inner = line_sizes(operands[0].shape, attrs["axis"])
    return -(-outer * inner // LINES_WORKGROUP)


def per_element(attrs: dict, operands: Sequence[TensorType], results: tuple[TensorType, ...]) -> int:
    """A thread per element of the (first) operand, 64 threads per workgroup."""
    return -(-operands[0].numel // LINES_WORKGROUP)


def lines_kernel(
    graph: Graph, node: Node, reads: list[str], threads: int, body: list[str], functions: str, label: str
) -> KernelSpec:
    """A lines.wgsl kernel reading `reads` (bound as x, g…, in order) and writing node's results."""
    bindings = [Binding(name, value, "read") for name, value in zip(("x", "g")[: len(reads)], reads, strict=True)]
    if node.results == 1:
        bindings.append(output_binding(node))
    else:
        bindings += [output_binding(node, "values", 0), output_binding(node, "indices", 1)]
    grid = grid_for(-(-threads // LINES_WORKGROUP))
    values = {
        "BINDINGS": bindings_wgsl(graph, bindings),
        "THREADS": threads,
        "GRID_X": grid[0],
        "FUNCTIONS": functions,
        "BODY": joined(body),
    }
    spec = (node.id, label, render("lines", values), "lines", tuple(bindings), grid, (LINES_WORKGROUP, 1, 1))
    return KernelSpec(*spec, results=node.results)


@lowering("cumsum", "cumprod", workgroups=per_line)
def lower_scan(graph: Graph, node: Node) -> KernelSpec:
    """cumsum (forward or reverse) and cumprod: a thread per line keeps the running value."""
    (x,) = node.inputs
    shape, axis = node.shape, node.attr("axis")
    outer, length, inner = line_sizes(shape, axis)
    integer = node.dtype == "i32"
    product = node.op == "cumprod"
    start = ("1" if product else "0") + ("i" if integer else ".0")
    step = f"{length - 1}u - s" if node.attr("reverse", False) else "s"
    body = [
        *line_start(shape, axis, "t"),
        f"var acc = {start};",
        f"for (var s = 0u; s < {length}u; s++) {{",
        f"    let at = base + ({step}) * {inner}u;",
        f"    acc = acc {'*' if product else '+'} x[at];",
        "    out[at] = acc;",
        "}",
    ]
    label = f"{node.op} {shape_text(shape)} dim {axis}" + (" reversed" if node.attr("reverse", False) else "")
    return lines_kernel(graph, node, [x], outer * inner, body, "", label)


@lowering("cumprod_grad", workgroups=per_element)
def lower_cumprod_grad(graph: Graph, node: Node) -> KernelSpec:
    """cumprod_grad: a thread per element k sums g_j times the running product without x_k."""
    x, g = node.inputs
    shape, axis = node.shape, node.attr("axis")
    _, length, inner = line_sizes(shape, axis)
    body = [
        *element_lets(shape, axis),
        "var running = 1.0;",
        "for (var j = 0u; j < k; j++) {",
        f"    running = running * x[base + j * {inner}u];",
        "}",
        "var total = 0.0;",
        f"for (var j = k; j < {length}u; j++) {{",
        "    if (j > k) {",
        f"        running = running * x[base + j * {inner}u];",
        "    }",
        f"    total = total + g[base + j * {inner}u] * running;",
        "}",
        "out[t] = total;",
    ]
    return lines_kernel(graph, node, [x, g], node.type.numel, body, "", f"cumprod_grad {shape_text(shape)} dim {axis}")


@lowering("arg_reduce", workgroups=per_line)
def lower_arg_reduce(graph: Graph, node: Node) -> KernelSpec:
    """arg_reduce: a thread per line keeps the first maximum (minimum), NaN beating any number."""
    (x,) = node.inputs
    shape, axis, largest = graph[x].shape, node.attr("axis"), node.attr("largest")
    outer, length, inner = line_sizes(shape, axis)
    body = [
        *line_start(shape, axis, "t"),
        "var best = x[base];",
        "var index = 0u;",
        f"for (var k = 1u; k < {length}u; k++) {{",
        f"    let v = x[base + k * {inner}u];",
        "    if (mn_better(v, best)) {",
        "        best = v;",
        "        index = k;",
        "    }",
        "}",
        "values[t] = best;",
        "indices[t] = i32(index);",
    ]
    functions = f"{MN_ISNAN}\n\n{MN_BETTER[largest]}"
    label = f"{'max' if largest else 'min'} with index {shape_text(shape)} dim {axis}"
    return lines_kernel(graph, node, [x], outer * inner, body, functions, label)


@lowering("topk", workgroups=per_element)
def lower_topk(graph: Graph, node: Node) -> KernelSpec:
    """topk: a thread per element counts the elements before it in its line (its rank) and, if
    the rank is below k, writes itself and its index there."""
    (x,) = node.inputs
    shape, axis, count, largest = graph[x].shape, node.attr("axis"), node.attr("k"), node.attr("largest")
    _, length, inner = line_sizes(shape, axis)
    body = [
        *element_lets(shape, axis),
        "let v = x[t];",
        "var rank = 0u;",
        f"for (var j = 0u; j < {length}u; j++) {{",
        f"    if (mn_before(x[base + j * {inner}u], v, j < k)) {{",
        "        rank += 1u;",
        "    }",
        "}",
        f"if (rank < {count}u) {{",
        f"    let at = (base / {length * inner}u) * {count * inner}u + base % {inner}u + rank * {inner}u;",
        "    values[at] = v;",
        "    indices[at] = i32(k);",
        "}",
    ]
    functions = f"{MN_ISNAN}\n\n{MN_BEFORE[largest]}"
    label = f"top {count} of {shape_text(shape)} dim {axis}"
    return lines_kernel(graph, node, [x], graph[x].type.numel, body, functions, label)
