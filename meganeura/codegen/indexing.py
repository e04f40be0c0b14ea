"""Lowering of the indexing ops: pick and scatter_rows (labels) and gather (embeddings), one
thread per output element (shaders/elementwise.wgsl); the embedding gradient as sort_ids, a
stable sort of the ids by rank (shaders/sort_ids.wgsl), and scatter_add, a workgroup per row of
the table summing the gradient rows of its run of sorted ids (shaders/scatter_add.wgsl)."""

from __future__ import annotations

from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    elementwise_kernel,
    grid_for,
    output_binding,
    shape_text,
)
from meganeura.codegen.expressions import literal
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node

NAN = literal(float("nan"))


@lowering("pick")
def lower_pick(graph: Graph, node: Node) -> KernelSpec:
    """pick: out[i] = x[i, labels[i]], x[labels[i]] of a table x [classes], or x of a scalar (0 for
    ignore_index, NaN for another label outside [0, classes))."""
    x, labels = node.inputs
    operands = Operands(graph)
    reads = f"let label = {operands.read_at(labels, 'i')};"
    if graph[x].shape:
        classes = graph[x].shape[-1]
        row = f"i * {classes}u + " if len(graph[x].shape) == 2 else ""
        value = operands.read_at(x, f"{row}min(u32(label), {classes - 1}u)")
        value = f"select({NAN}, {value}, label >= 0i && label < {classes}i)"
    else:
        value = operands.read_at(x, "0u")
    value = f"select({value}, 0.0, label == {node.attr('ignore_index')}i)"
    return elementwise_kernel(graph, node, operands, reads, value, "", f"pick {shape_text(graph[x].shape)}")


@lowering("scatter_rows")
def lower_scatter_rows(graph: Graph, node: Node) -> KernelSpec:
    """scatter_rows: out[i, c] = g[i] where c == labels[i], else 0 (a row of zeros for ignore_index,
    of NaN for another label outside [0, classes))."""
    g, labels = node.inputs
    classes = node.shape[1]
    operands = Operands(graph)
    reads = f"let row = i / {classes}u;\n    let label = {operands.read_at(labels, 'row')};"
    hit = f"select(0.0, {operands.read_at(g, 'row')}, i32(i % {classes}u) == label)"
    value = f"select({NAN}, {hit}, label >= 0i && label < {classes}i)"
    value = f"select({value}, 0.0, label == {node.attr('ignore_index')}i)"
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


SORT_WORKGROUP = 256
SORT_LANES = 8  # threads that count one id's rank together: 32 ids per workgroup


def sort_workgroups(attrs: dict, operands, results) -> int:
    """SORT_LANES threads per id, 256 threads per workgroup."""
    return -(-operands[0].numel * SORT_LANES // SORT_WORKGROUP)


@lowering("sort_ids", workgroups=sort_workgroups)
def lower_sort_ids(graph: Graph, node: Node) -> KernelSpec:
    """sort_ids: each id's rank among all (ties by position) counted by SORT_LANES threads, then
    a write at its rank."""
    (ids,) = node.inputs
    n = graph[ids].type.numel
    bindings = [Binding("ids", ids, "read"), output_binding(node)]
    grid = grid_for(-(-n * SORT_LANES // SORT_WORKGROUP))
    values = {"BINDINGS": bindings_wgsl(graph, bindings), "N": n, "LANES": SORT_LANES, "GRID_X": grid[0]}
    wgsl = render("sort_ids", values)
    return KernelSpec(node.id, f"sort_ids {n}", wgsl, "sort_ids", tuple(bindings), grid, (SORT_WORKGROUP, 1, 1))


def scatter_workgroups(attrs: dict, operands, results) -> int:
    """A workgroup per row of the table."""
    return results[0].shape[0]


@lowering("scatter_add", workgroups=scatter_workgroups)
def lower_scatter_add(graph: Graph, node: Node) -> KernelSpec:
    """scatter_add (gather's gradient), deterministic and without atomics: a workgroup per row of
    the [num, dim] table finds the row's run in the sorted ids (sort_ids) and sums the gradient
    rows at its positions, in order of position (shaders/scatter_add.wgsl)."""
    g, ids, order = node.inputs
    num, dim = node.shape
    n = graph[ids].type.numel
    bindings = [Binding("g", g, "read"), Binding("order", order, "read"), output_binding(node)]
    grid = grid_for(num)
    values = {"BINDINGS": bindings_wgsl(graph, bindings), "N": n, "DIM": dim, "ROWS": num, "GRID_X": grid[0]}
    label = f"scatter_add {shape_text(graph[g].shape)} -> {shape_text(node.shape)}"
    return KernelSpec(node.id, label, render("scatter_add", values), "scatter_add", tuple(bindings), grid, (256, 1, 1))
