"""Lowering of the recurrent cells (ir/ops/recurrent.py): lstm_cell, gru_cell and their gradients,
a thread per hidden unit of each row (shaders/recurrent.wgsl) that reads the unit's gates and
state and writes every result of the step. The activations are spelled as the elementwise
kernels spell them (ir/functions.py), so a cell computes what the traced ops would.
"""

from __future__ import annotations

from collections.abc import Sequence

from meganeura.codegen.common import Operands, bindings_wgsl, grid_for, output_binding, shape_text
from meganeura.codegen.expressions import helper_functions
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import ELEMENTWISE_WORKGROUP, lowering
from meganeura.codegen.render import render
from meganeura.ir.functions import FUNCTIONS
from meganeura.ir.graph import Graph, Node, TensorType


def sigmoid(x: str) -> str:
    return FUNCTIONS["sigmoid"].wgsl.format(x)


def tanh(x: str) -> str:
    return FUNCTIONS["tanh"].wgsl.format(x)


def unit_workgroups(attrs: dict, operands: Sequence[TensorType], results: tuple[TensorType, ...]) -> int:
    """A workgroup of 256 threads per 256 hidden units of all rows (the last result is [*, H])."""
    return -(-results[-1].numel // ELEMENTWISE_WORKGROUP)


class CellReads:
    """The reads of a cell kernel: the k-th gate of the thread's unit from a gates operand, and a
    state operand (broadcast to the state, a literal for a constant) at the thread's unit."""

    def __init__(self, graph: Graph, node: Node, hidden: int) -> None:
        self.operands = Operands(graph)
        self.node, self.hidden = node, hidden
        self.state_shape = node.types[-1].shape

    def gate(self, operand: int, k: int, count: int) -> str:
        """The WGSL reading gate k of `count` of the unit from operand `operand` of the node."""
        width = count * self.hidden
        return self.operands.read_at(self.node.inputs[operand], f"row * {width}u + {k * self.hidden}u + j")

    def state(self, operand: int) -> str:
        return self.operands.read(self.node.inputs[operand], self.state_shape)


def lstm_body(reads: CellReads, grad: bool) -> list[str]:
    """The lines of an LSTM step (or its gradient): the gates' activations, c', then the results."""
    lines = [
        f"let gi = {sigmoid(reads.gate(0, 0, 4))};",
        f"let gf = {sigmoid(reads.gate(0, 1, 4))};",
        f"let gg = {tanh(reads.gate(0, 2, 4))};",
        f"let go = {sigmoid(reads.gate(0, 3, 4))};",
        f"let c = {reads.state(1)};",
        "let c_new = gf * c + gi * gg;",
        f"let tanh_c = {tanh('c_new')};",
    ]
    if not grad:
        return lines + ["out0[i] = go * tanh_c;", "out1[i] = c_new;"]
    width = 4 * reads.hidden
    at = [f"row * {width}u + {k * reads.hidden}u + j" for k in range(4)]
    return lines + [
        f"let dh = {reads.state(2)};",
        f"let dc = {reads.state(3)} + dh * go * (1.0 - tanh_c * tanh_c);",
        f"out0[{at[0]}] = dc * gg * gi * (1.0 - gi);",
        f"out0[{at[1]}] = dc * c * gf * (1.0 - gf);",
        f"out0[{at[2]}] = dc * gi * (1.0 - gg * gg);",
        f"out0[{at[3]}] = dh * tanh_c * go * (1.0 - go);",
        "out1[i] = dc * gf;",
    ]


def gru_body(reads: CellReads, grad: bool) -> list[str]:
    """The lines of a GRU step (or its gradient): r, z, n, then the results."""
    lines = [
        f"let hn = {reads.gate(1, 2, 3)};",
        f"let r = {sigmoid(f'{reads.gate(0, 0, 3)} + {reads.gate(1, 0, 3)}')};",
        f"let z = {sigmoid(f'{reads.gate(0, 1, 3)} + {reads.gate(1, 1, 3)}')};",
        f"let n = {tanh(f'{reads.gate(0, 2, 3)} + r * hn')};",
        f"let h = {reads.state(2)};",
    ]
    if not grad:
        return lines + ["out0[i] = (h - n) * z + n;"]
    width = 3 * reads.hidden
    at = [f"row * {width}u + {k * reads.hidden}u + j" for k in range(3)]
    return lines + [
        f"let dh = {reads.state(3)};",
        "let dz = dh * (h - n) * z * (1.0 - z);",
        "let dn = dh * (1.0 - z) * (1.0 - n * n);",
        "let dr = dn * hn * r * (1.0 - r);",
        f"out0[{at[0]}] = dr;",
        f"out0[{at[1]}] = dz;",
        f"out0[{at[2]}] = dn;",
        f"out1[{at[0]}] = dr;",
        f"out1[{at[1]}] = dz;",
        f"out1[{at[2]}] = dn * r;",
        "out2[i] = dh * z;",
    ]


@lowering("lstm_cell", "lstm_cell_grad", "gru_cell", "gru_cell_grad", workgroups=unit_workgroups)
def lower_cell(graph: Graph, node: Node) -> KernelSpec:
    """A recurrent cell: a thread per hidden unit of each row (module docstring)."""
    lstm = node.op.startswith("lstm")
    hidden = graph[node.inputs[0]].shape[-1] // (4 if lstm else 3)
    reads = CellReads(graph, node, hidden)
    grad = node.op.endswith("_grad")
    body = (lstm_body if lstm else gru_body)(reads, grad)
    bindings = [*reads.operands.bindings, *(output_binding(node, f"out{k}", k) for k in range(node.results))]
    numel = node.types[-1].numel
    grid = grid_for(-(-numel // ELEMENTWISE_WORKGROUP))
    wgsl = render(
        "recurrent",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "NUMEL": numel,
            "HIDDEN": hidden,
            "GRID_X": max(grid[0], 1),
            "FUNCTIONS": helper_functions((), also=("sigmoid", "tanh")),
            "BODY": "\n    ".join(body),
        },
    )
    label = f"{node.op} {shape_text(node.types[-1].shape)}"
    return KernelSpec(node.id, label, wgsl, "recurrent", tuple(bindings), grid, (256, 1, 1), results=node.results)
