"""Lowering of the elementwise ops (one per function of ir/functions.py, and broadcast_to), the
fused `pointwise` kernel and the causal mask: one thread per output element
(shaders/elementwise.wgsl), each input read at an index expression of the element through
broadcasting.
"""

from __future__ import annotations

from meganeura.codegen.common import Operands, elementwise_kernel, expression_code, shape_text
from meganeura.codegen.expressions import helper_functions
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.ir.expr import Expr
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.functions import FUNCTIONS
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops.leaves import CAUSAL_MASK_VALUE


@lowering(*FUNCTIONS, "broadcast_to")
def lower_elementwise(graph: Graph, node: Node) -> KernelSpec:
    """An elementwise op, or broadcast_to: a one-function `pointwise` kernel."""
    if node.op in FUNCTIONS:
        tree: Expr = (node.op, *(("$", str(i)) for i in range(FUNCTIONS[node.op].arity)))
    else:  # broadcast_to (f32 or i32)
        tree = ("$", "0")
    return thread_per_element(graph, node, tree, f"{node.op} {shape_text(node.shape)}")


@lowering("pointwise")
def lower_pointwise(graph: Graph, node: Node) -> KernelSpec:
    """`pointwise`: one expression over inputs broadcast to the output shape."""
    text = node.attr("expr")
    return thread_per_element(graph, node, parse_expr(text), f"pointwise {shape_text(node.shape)} {text}")


def thread_per_element(graph: Graph, node: Node, tree: Expr, label: str) -> KernelSpec:
    """out[i] = tree($0, $1, … at i), the inputs broadcast to the output shape by index expressions."""
    operands = Operands(graph)
    reads, value = expression_code(tree, lambda name: operands.read(node.inputs[int(name)], node.shape))
    return elementwise_kernel(graph, node, operands, reads, value, helper_functions([tree]), label)


@lowering("causal_mask")
def lower_causal_mask(graph: Graph, node: Node) -> KernelSpec:
    """causal_mask [rows, cols]: 0 where col ≤ row, CAUSAL_MASK_VALUE above the diagonal."""
    rows, cols = node.shape
    reads = f"let row = i / {cols}u;\n    let col = i % {cols}u;"
    value = f"select(0.0, {CAUSAL_MASK_VALUE:.1f}, col > row)"
    return elementwise_kernel(graph, node, Operands(graph), reads, value, "", f"causal_mask [{rows},{cols}]")
