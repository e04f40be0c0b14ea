"""Lowering of the reductions: sum, max and fused_reduce over any axes (shaders/reduce.wgsl)."""

from __future__ import annotations

import math

from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    broadcast_strides,
    expression_code,
    grid_for,
    index_expr,
    output_binding,
    shape_text,
    sum_terms,
)
from meganeura.codegen.expressions import helper_functions, literal
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node
from meganeura.ir.op import normalize_axes

REDUCE_INIT = {"sum": "0.0", "max": literal(float("-inf"))}
REDUCE_COMBINE = {"sum": "a + b", "max": "max(a, b)"}


def reduce_plan(outs: int, r: int, innermost_reduced: bool) -> tuple[str, int]:
    """(entry point, workgroup size): a workgroup per output for long rows, a thread per output otherwise.

    A workgroup per output wins when the reduction is long and contiguous (the workgroup reads
    one row together) or when there are too few outputs to fill the device; a thread per output
    wins for short reductions over many outputs, where neighbouring threads read neighbours.
    """
    if r > 64 and (innermost_reduced or outs < 1024):
        return "reduce_tree", 256 if r >= 256 else 128
    return "reduce_serial", 64


def reduce_workgroups(attrs: dict, operands, results) -> int:
    """A workgroup per output (reduce_tree) or per WG outputs (reduce_serial), as `reduce_plan` says."""
    # fused_reduce carries its input shape (a scalar's is (), so test presence, not truth)
    in_shape = tuple(attrs["in_shape"] if "in_shape" in attrs else operands[0].shape)
    axes = normalize_axes(attrs.get("axes"), len(in_shape))
    outs = math.prod(in_shape[d] for d in range(len(in_shape)) if d not in axes)
    entry, wg = reduce_plan(outs, math.prod(in_shape[d] for d in axes), bool(in_shape) and len(in_shape) - 1 in axes)
    return outs if entry == "reduce_tree" else -(-outs // wg)


@lowering("sum", "max", "fused_reduce", workgroups=reduce_workgroups)
def lower_reduce(graph: Graph, node: Node) -> KernelSpec:
    """`sum`, `max` or `fused_reduce` over any axes: kept dims index the output, reduced dims are
    combined. `fused_reduce` reduces prologue($0, $1, … broadcast to in_shape) and writes epilogue($r)."""
    if node.op == "fused_reduce":
        kind, in_shape = node.attr("kind"), tuple(node.attr("in_shape"))
        prologue_text, epilogue_text = node.attr("prologue", "$0"), node.attr("epilogue", "$r")
    else:
        kind, in_shape = node.op, graph[node.inputs[0]].shape
        prologue_text, epilogue_text = "$0", "$r"
    prologue, epilogue = parse_expr(prologue_text), parse_expr(epilogue_text)
    axes = normalize_axes(node.attr("axes"), len(in_shape))
    kept = [d for d in range(len(in_shape)) if d not in axes]
    kept_sizes, reduced_sizes = tuple(in_shape[d] for d in kept), tuple(in_shape[d] for d in axes)
    outs, r = math.prod(kept_sizes), math.prod(reduced_sizes)
    operands = Operands(graph)

    def read(name: str) -> str:
        source = node.inputs[int(name)]
        strides = broadcast_strides(graph[source].shape, in_shape)
        base = index_expr("o", kept_sizes, tuple(strides[d] for d in kept))
        offset = index_expr("r", reduced_sizes, tuple(strides[d] for d in axes))
        return operands.read_at(source, sum_terms(base, offset))

    reads, value = expression_code(prologue, read)
    _, finish = expression_code(epilogue, lambda name: "value")
    entry, wg = reduce_plan(outs, r, bool(in_shape) and (len(in_shape) - 1) in axes)
    grid = grid_for(outs if entry == "reduce_tree" else -(-outs // wg))
    bindings = operands.bindings + [output_binding(node)]
    wgsl = render(
        "reduce",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "OUTS": outs,
            "R": r,
            "WG": wg,
            "GRID_X": max(grid[0], 1),
            "FUNCTIONS": helper_functions([prologue, epilogue]),
            "READS": reads,
            "PROLOGUE": value,
            "INIT": REDUCE_INIT[kind],
            "COMBINE": REDUCE_COMBINE[kind],
            "EPILOGUE": finish,
        },
    )
    keep = ", keepdim" if node.attr("keepdim", False) else ""
    label = f"{kind} {shape_text(in_shape)} axes={axes}{keep} ({entry})"
    if node.op == "fused_reduce":
        label = f"fused_reduce {label} of {prologue_text} then {epilogue_text}"
    return KernelSpec(node.id, label, wgsl, entry, tuple(bindings), grid, (wg, 1, 1))
