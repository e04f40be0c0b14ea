"""Lowering of the shape ops that copy: permute, slice, slice_grad and concat, one thread per output
element (shaders/elementwise.wgsl), each reading its source at index arithmetic of the element;
a permute that keeps a last axis of a multiple of 4 in place, a thread per vec4 of the output; on
a GPU, a large permute that swaps the last two axes (a weight's transpose) as a tiled transpose
(shaders/transpose.wgsl), whose reads and writes are both coalesced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    elementwise_kernel,
    grid_for,
    index_expr,
    output_binding,
    row_major_strides,
    shape_text,
    sum_terms,
    wgsl_type,
)
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import ELEMENTWISE_WORKGROUP, elementwise_workgroups, lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.target import GENERIC, Target

TRANSPOSE_TILE = 32  # shaders/transpose.wgsl: a 32×32 tile a workgroup of 32×8 threads
# The tiled transpose pays from about half a million elements. On the H200 (2026-12-02, one
# profiled step of each LM in one process as benchmarks/plan_ab.py runs them, gather → tiled, ms
# a step): SmolLM2's 1536x576 weight transposes 0.741 → 0.564 (60 a step), its 576x576 0.499 → 0.499,
# its 192x576 0.375 → 0.457 (fewer workgroups, each a load, a barrier and a store longer);
# GPT-2's step 64.32 → 64.12 ms of GPU time with every transpose tiled (its 768x3072 ones, 0.283
# ms a step gathered, left the 40 costliest kernels). SmolLM2's step was 88.20 ms both ways; with
# this bound, set after that run and not re-measured, its 576x576 and 192x576 transposes keep the
# gather (0.08 ms a step less by the figures above).
TRANSPOSE_MIN_ELEMENTS = 1 << 19


def swaps_last_two(perm: tuple[int, ...]) -> bool:
    """Whether `perm` is a batched transpose: the last two axes swapped, the others in place."""
    rank = len(perm)
    return rank >= 2 and perm == (*range(rank - 2), rank - 1, rank - 2)


def tiled_transpose(shape: tuple[int, ...], perm: tuple[int, ...], target: Target) -> bool:
    """Whether a permute of an input of `shape` takes the tiled transpose: a batched transpose of at
    least TRANSPOSE_MIN_ELEMENTS on a GPU. A CPU (lavapipe) keeps the gather, whose reads a core's
    caches serve."""
    return swaps_last_two(perm) and not target.cpu and math.prod(shape) >= TRANSPOSE_MIN_ELEMENTS


def transpose_tiles(shape: tuple[int, ...]) -> int:
    """The workgroups of the tiled transpose of an input of `shape`: a tile per 32×32 block of each matrix."""
    *batch, rows, cols = shape
    return math.prod(batch) * -(-rows // TRANSPOSE_TILE) * -(-cols // TRANSPOSE_TILE)


def moves_vec4s(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """Whether a permute of an input of `shape` moves whole vec4s: it keeps the last axis, a
    multiple of 4 long, in place (attention's [B, S, H, D] ⇄ [B, H, S, D] with D = 64), so that 4
    neighbouring output elements are 4 neighbouring input elements, 16-byte aligned."""
    return len(perm) >= 2 and perm[-1] == len(perm) - 1 and shape[-1] % 4 == 0


def permute_workgroups(
    attrs: dict, operands: Sequence[TensorType], results: tuple[TensorType, ...], target: Target = GENERIC
) -> int:
    """A permute's workgroups on `target`: a tile each for the tiled transpose, a thread per vec4
    where it moves vec4s, else the gather's thread per element."""
    shape, perm = operands[0].shape, tuple(attrs["perm"])
    if tiled_transpose(shape, perm, target):
        return transpose_tiles(shape)
    if moves_vec4s(shape, perm):
        return -(-results[0].numel // (4 * ELEMENTWISE_WORKGROUP))
    return elementwise_workgroups(attrs, operands, results)


@lowering("permute", workgroups=permute_workgroups, per_target=True)
def lower_permute(graph: Graph, node: Node, target: Target = GENERIC) -> KernelSpec:
    """`permute` (any rank, any dtype): output element i reads the input at its permuted index;
    on a GPU a large batched transpose moves 32×32 tiles through workgroup memory instead."""
    source = graph[node.inputs[0]]
    perm = tuple(node.attr("perm"))
    label = f"permute {shape_text(source.shape)} perm={perm}"
    operands = Operands(graph)
    if tiled_transpose(source.shape, perm, target):
        return lower_transpose(graph, node, operands, f"{label} (tiled)")
    strides = row_major_strides(source.shape)
    if moves_vec4s(source.shape, perm):
        # in vec4s: the last axis a quarter as long, every other stride a multiple of 4
        shape4 = (*node.shape[:-1], node.shape[-1] // 4)
        strides4 = (*(strides[p] // 4 for p in perm[:-1]), 1)
        value = operands.read_at(source.id, index_expr("i", shape4, strides4))
        return elementwise_kernel(graph, node, operands, "", value, "", f"{label} (vec4)", vec4=True)
    value = operands.read_at(source.id, index_expr("i", node.shape, tuple(strides[p] for p in perm)))
    return elementwise_kernel(graph, node, operands, "", value, "", label)


def lower_transpose(graph: Graph, node: Node, operands: Operands, label: str) -> KernelSpec:
    """The tiled transpose (shaders/transpose.wgsl) of `node`, a permute swapping its input's last two axes."""
    source = graph[node.inputs[0]]
    read = operands.read_at(source.id, "at")
    bindings = operands.bindings + [output_binding(node)]
    tiles = transpose_tiles(source.shape)
    grid = grid_for(tiles)
    wgsl = render(
        "transpose",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "TYPE": wgsl_type(node.dtype),
            "ROWS": source.shape[-2],
            "COLS": source.shape[-1],
            "TILES": tiles,
            "GRID_X": max(grid[0], 1),
            "READ": read,
        },
    )
    return KernelSpec(node.id, label, wgsl, "transpose", tuple(bindings), grid, (32, 8, 1))


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
