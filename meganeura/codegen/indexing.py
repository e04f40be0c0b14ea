"""Lowering of the indexing ops: pick and scatter_rows (labels), gather and scatter_add
(embeddings), one thread per output element (shaders/elementwise.wgsl)."""

from __future__ import annotations

from meganeura.codegen.common import Operands, elementwise_kernel, shape_text
from meganeura.codegen.expressions import literal
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.ir.graph import Graph, Node

NAN = literal(float("nan"))


@lowering("pick")
def lower_pick(graph: Graph, node: Node) -> KernelSpec:
    """pick: out[i] = x[i, labels[i]] (NaN for a label outside [0, classes))."""
    x, labels = node.inputs
    classes = graph[x].shape[1]
    operands = Operands(graph)
    value = operands.read_at(x, f"i * {classes}u + min(u32(label), {classes - 1}u)")
    reads = f"let label = {operands.read_at(labels, 'i')};"
    value = f"select({NAN}, {value}, label >= 0i && label < {classes}i)"
    return elementwise_kernel(graph, node, operands, reads, value, "", f"pick {shape_text(graph[x].shape)}")


@lowering("scatter_rows")
def lower_scatter_rows(graph: Graph, node: Node) -> KernelSpec:
    """scatter_rows: out[i, c] = g[i] where c == labels[i], else 0 (a row of NaN for a bad label)."""
    g, labels = node.inputs
    classes = node.shape[1]
    operands = Operands(graph)
    reads = f"let row = i / {classes}u;\n    let label = {operands.read_at(labels, 'row')};"
    hit = f"select(0.0, {operands.read_at(g, 'row')}, i32(i % {classes}u) == label)"
    value = f"select({NAN}, {hit}, label >= 0i && label < {classes}i)"
    return elementwise_kernel(graph, node, operands, reads, value, "", f"scatter_rows {shape_text(node.shape)}")


@lowering("gather")
def lower_gather(graph: Graph, node: Node) -> KernelSpec:
    """gather (embedding lookup): out[j, c] = table[ids[j], c] (NaN for an id outside [0, num))."""
    table, ids = node.inputs
    num, dim = graph[table].shape
    operands = Operands(graph)
    reads = f"let row = i / {dim}u;\n    let sel = {operands.read_at(ids, 'row')};"
    value = operands.read_at(table, f"min(u32(sel), {num - 1}u) * {dim}u + i % {dim}u")
    value = f"select({NAN}, {value}, sel >= 0i && sel < {num}i)"
    return elementwise_kernel(graph, node, operands, reads, value, "", f"gather {shape_text(node.shape)}")


@lowering("scatter_add")
def lower_scatter_add(graph: Graph, node: Node) -> KernelSpec:
    """scatter_add (gather's gradient), deterministic and without atomics: one thread per (row,
    column) of the [num, dim] table scans all n ids and sums, in order, the gradient rows whose
    id selects its row. It reads n·num·dim ids (from cache: every thread reads the same ones) and
    n·dim gradient values in all, so it costs O(n·num) per column: cheap for a small vocabulary
    (a character LM), quadratic-ish for large vocabularies × long batches (a sort by id, then a
    segmented sum, would be the next step)."""
    g, ids = node.inputs
    dim = node.shape[1]
    n = graph[ids].type.numel
    operands = Operands(graph)
    ids_at, g_at = operands.read_at(ids, "j"), operands.read_at(g, f"j * {dim}u + col")
    reads = (
        f"let row = i32(i / {dim}u);\n    let col = i % {dim}u;\n    var total = 0.0;\n"
        f"    for (var j = 0u; j < {n}u; j++) {{\n"
        f"        if ({ids_at} == row) {{\n            total += {g_at};\n        }}\n    }}"
    )
    label = f"scatter_add {shape_text(graph[g].shape)} -> {shape_text(node.shape)}"
    return elementwise_kernel(graph, node, operands, reads, "total", "", label)
