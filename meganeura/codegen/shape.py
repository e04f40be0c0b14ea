"""Lowering of the shape ops that copy: permute, slice, slice_grad and concat, one thread per output
element (shaders/elementwise.wgsl), each reading its source at index arithmetic of the element.
"""

from __future__ import annotations

import math

from meganeura.codegen.common import (
    Operands,
    elementwise_kernel,
    index_expr,
    row_major_strides,
    shape_text,
    sum_terms,
    wgsl_type,
)
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.ir.graph import Graph, Node


@lowering("permute")
def lower_permute(graph: Graph, node: Node) -> KernelSpec:
    """`permute` (any rank, any dtype): output element i reads the input at its permuted index."""
    source = graph[node.inputs[0]]
    perm = tuple(node.attr("perm"))
    strides = row_major_strides(source.shape)
    operands = Operands(graph)
    value = operands.read_at(source.id, index_expr("i", node.shape, tuple(strides[p] for p in perm)))
    label = f"permute {shape_text(source.shape)} perm={perm}"
    return elementwise_kernel(graph, node, operands, "", value, "", label)


@lowering("slice")
def lower_slice(graph: Graph, node: Node) -> KernelSpec:
    """slice (any rank, any dtype): output element i reads the input at start + coordinate·step per dim."""
    source = graph[node.inputs[0]]
    starts, steps = node.attr("starts"), node.attr("steps")
    strides = row_major_strides(source.shape)
    offset = sum(a * s for a, s in zip(starts, strides, strict=True))
    operands = Operands(graph)
    stepped = tuple(s * t for s, t in zip(strides, steps, strict=True))
    index = sum_terms(index_expr("i", node.shape, stepped), f"{offset}u")
    value = operands.read_at(source.id, index)
    spans = ",".join(f"{a}:{b}:{s}" for a, b, s in zip(starts, node.attr("stops"), steps, strict=True))
    return elementwise_kernel(graph, node, operands, "", value, "", f"slice {shape_text(source.shape)}[{spans}]")


@lowering("slice_grad")
def lower_slice_grad(graph: Graph, node: Node) -> KernelSpec:
    """slice_grad: a thread per element of the sliced tensor's shape writes g there when the
    element lies on the slice, else 0."""
    g = node.inputs[0]
    starts, stops, steps = node.attr("starts"), node.attr("stops"), node.attr("steps")
    shape, g_strides = node.shape, row_major_strides(graph[g].shape)
    operands = Operands(graph)
    lines, conditions, terms, inner = [], [], [], 1
    for d in range(len(shape) - 1, -1, -1):
        size, start, stop, step = shape[d], starts[d], stops[d], steps[d]
        if (start, stop, step) == (0, size, 1) and size == 1:
            continue
        coord = "i" if inner == 1 else f"(i / {inner}u)"
        lines.append(f"let c{d} = {coord if d == 0 else f'({coord} % {size}u)'};")
        if (start, stop, step) != (0, size, 1):
            conditions.append(f"c{d} >= {start}u && c{d} < {stop}u")
            if step != 1:
                conditions.append(f"(c{d} - {start}u) % {step}u == 0u")
        position = f"c{d}" if start == 0 else f"(c{d} - {start}u)"
        position = position if step == 1 else f"({position} / {step}u)"
        terms.append(position if g_strides[d] == 1 else f"{position} * {g_strides[d]}u")
        inner *= size
    index = " + ".join(reversed(terms)) or "0u"
    lines.append(f"let on_slice = {' && '.join(conditions) or 'true'};")
    lines.append(f"var value = 0.0;\n    if (on_slice) {{\n        value = {operands.read_at(g, index)};\n    }}")
    spans = ",".join(f"{a}:{b}:{s}" for a, b, s in zip(starts, stops, steps, strict=True))
    label = f"slice_grad {shape_text(shape)}[{spans}]"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "value", "", label)


@lowering("concat")
def lower_concat(graph: Graph, node: Node) -> KernelSpec:
    """concat (any dtype) along `axis`: output element i reads the input its axis coordinate falls in."""
    axis, shape = node.attr("axis"), node.shape
    inner, total = math.prod(shape[axis + 1 :]), shape[axis]
    operands = Operands(graph)
    lines = [
        f"let a = (i / {inner}u) % {total}u;",
        f"let outer = i / {inner * total}u;",
        f"let inner = i % {inner}u;",
        f"var value: {wgsl_type(node.dtype)};",
    ]
    offset = 0
    for position, x in enumerate(node.inputs):
        size = graph[x].shape[axis]
        index = f"outer * {size * inner}u + (a - {offset}u) * {inner}u + inner"
        read = f"value = {operands.read_at(x, index)};"
        if position == len(node.inputs) - 1:
            lines.append(f"{'else ' if position else ''}{{\n        {read}\n    }}")
        else:
            lines.append(f"{'else ' if position else ''}if (a < {offset + size}u) {{\n        {read}\n    }}")
        offset += size
    label = f"concat {' '.join(shape_text(graph[x].shape) for x in node.inputs)} axis={axis}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "value", "", label)
