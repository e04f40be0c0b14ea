"""Lowering of the row ops: softmax and log_softmax and their gradients along any axis
(shaders/softmax.wgsl), and the fused cross-entropy kernels (shaders/cross_entropy.wgsl); a
workgroup per row.
"""

from __future__ import annotations

import math

from meganeura.codegen.common import bindings_wgsl, constant_value, grid_for, output_binding, shape_text
from meganeura.codegen.expressions import literal
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node
from meganeura.ir.op import normalize_axes


def logit_rows(attrs: dict, operands, results) -> int:
    """A workgroup per row of the logits."""
    return operands[0].shape[0]


@lowering("cross_entropy_rows", "cross_entropy_rows_grad", workgroups=logit_rows)
def lower_cross_entropy(graph: Graph, node: Node) -> KernelSpec:
    """Softmax cross-entropy per row (forward) or its gradient (backward): a workgroup per row."""
    logits, labels = node.inputs[:2]
    rows, classes = graph[logits].shape
    is_grad = node.op == "cross_entropy_rows_grad"
    bindings = [Binding("logits", logits, "read"), Binding("labels", labels, "read")]
    grad_at = "0.0"
    if is_grad:
        grad = node.inputs[2]
        value = constant_value(graph, grad)
        if value is not None:
            grad_at = literal(value)
        else:
            bindings.append(Binding("grad", grad, "read"))
            grad_at = "grad[row]"
    bindings.append(output_binding(node))
    wg = min(256, max(32, 1 << (classes - 1).bit_length()))
    grid = grid_for(rows)
    wgsl = render(
        "cross_entropy",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "ROWS": rows,
            "C": classes,
            "WG": wg,
            "GRID_X": max(grid[0], 1),
            "GRAD": is_grad,
            "GRAD_AT": grad_at,
            "IGNORE": node.attr("ignore_index"),
        },
    )
    return KernelSpec(node.id, f"{node.op} {rows}x{classes}", wgsl, node.op, tuple(bindings), grid, (wg, 1, 1))


ROW_OPS = ("softmax", "log_softmax", "softmax_grad", "log_softmax_grad")


def softmax_rows(attrs: dict, operands, results) -> int:
    """A workgroup per row along the softmax axis."""
    shape = results[0].shape
    (axis,) = normalize_axes(attrs.get("axis"), len(shape))
    return results[0].numel // max(shape[axis], 1)


@lowering(*ROW_OPS, workgroups=softmax_rows)
def lower_rows(graph: Graph, node: Node) -> KernelSpec:
    """softmax, log_softmax or a gradient of one along any axis: rows are strided, never transposed."""
    shape = node.shape
    (axis,) = normalize_axes(node.attr("axis"), len(shape))
    classes, inner = shape[axis], math.prod(shape[axis + 1 :])
    rows = node.type.numel // max(classes, 1)
    names = ("y", "g") if node.op.endswith("_grad") else ("x",)
    bindings = [Binding(name, value, "read") for name, value in zip(names, node.inputs, strict=True)]
    bindings.append(output_binding(node))
    wg = min(256, max(32, 1 << (classes - 1).bit_length()))
    grid = grid_for(rows)
    values = {"BINDINGS": bindings_wgsl(graph, bindings), "ROWS": rows, "C": classes, "INNER": inner}
    flags = {op.upper(): op == node.op for op in ROW_OPS}
    flags["FORWARD"] = not node.op.endswith("_grad")
    wgsl = render("softmax", {**values, "WG": wg, "GRID_X": max(grid[0], 1), **flags})
    label = f"{node.op} {shape_text(shape)} axis={axis}"
    return KernelSpec(node.id, label, wgsl, node.op, tuple(bindings), grid, (wg, 1, 1))
