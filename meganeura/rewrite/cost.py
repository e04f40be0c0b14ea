"""The cost model: one pricing function for a kernel, used by extraction and by `graph_cost` alike.

A kernel costs

    bytes read + bytes written + flops / FLOPS_PER_BYTE + DISPATCH_COST_BYTES

all in bytes, where "bytes read" counts each DISTINCT tensor the kernel reads once (a kernel
reading x twice, `mul(x, x)`, loads it once; the same tensor read by two kernels is paid by
each), "bytes written" is its results, and flops are what the op's declaration says (2·M·K·N
for a matmul, `Op.flops`), 0 otherwise. Leaves, constants, reshapes and projections are buffers
or views: they cost nothing, and so does reading a scalar constant (kernels inline it as a
literal). A plan's cost is the sum over the kernels it launches (each value it materialises is
computed once: DAG cost).

`price` takes what both callers know: the op a kernel runs (for an e-node, the IR op it decodes
to), its result types, the bytes of the distinct tensors it reads, and its flops (`kernel_flops`,
from the op's declaration); extraction keeps the part that does not depend on the reads per
option (`pricing`). The pipeline checks that the plan's cost, summed by extraction,
equals `graph_cost` of the decoded graph.

Why bytes: elementwise kernels and epilogues are bound by memory traffic.
Why flops for matmuls: fusing an epilogue into a matmul whose plain result is needed anyway
recomputes the matmul. Priced by bytes alone, re-reading A and B looks cheap next to the
elementwise traffic it saves, even for a 4096³ matmul; the arithmetic term makes recomputing
cost what it does. FLOPS_PER_BYTE = 8: the WGSL SIMT GEMM reaches ~30 TFLOP/s on the H200, whose
memory moves ~4 TB/s (platform.md).
Why a fixed dispatch price: one dispatch costs a few microseconds inside a pass (about 6 µs on
an H200, 46 µs on lavapipe, see platform.md), the time to move tens of kilobytes or more; 64 KiB
is a moderate middle that makes removing a kernel worth more than a small tensor's traffic.

Extraction compares integer `units` (eighths of a byte) so that sums and differences are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import op_def

DISPATCH_COST_BYTES = 64 * 1024
FLOPS_PER_BYTE = 8


@dataclass(frozen=True)
class Cost:
    """Bytes moved, flops and kernels dispatched by a plan (or by one kernel), and `units`, the
    number extraction minimises (eighths of a byte: sums and differences stay exact integers)."""

    bytes: int = 0
    flops: int = 0
    dispatches: int = 0
    units: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.bytes + other.bytes,
            self.flops + other.flops,
            self.dispatches + other.dispatches,
            self.units + other.units,
        )

    def __sub__(self, other: Cost) -> Cost:
        return Cost(
            self.bytes - other.bytes,
            self.flops - other.flops,
            self.dispatches - other.dispatches,
            self.units - other.units,
        )

    @property
    def scalar(self) -> float:
        """The cost in bytes."""
        return self.units / 8


FREE = Cost()


def kernel_flops(op: str, attrs: dict, operands: Sequence[TensorType], results: Sequence[TensorType]) -> int:
    """The arithmetic the cost model charges a kernel of `op` (its declaration's `flops`, else 0)."""
    definition = op_def(op)
    return definition.flops(list(operands), tuple(results), attrs) if definition.flops else 0


@dataclass(frozen=True)
class Pricing:
    """What one kernel costs apart from its reads (which differ between plans): its results'
    bytes, its flops, and whether it launches at all (buffers and views do not)."""

    launches: bool
    written: int = 0
    flops: int = 0

    def units(self, read_bytes: int) -> int:
        """The kernel's `Cost.units` when it reads `read_bytes` (extraction's hot path)."""
        if not self.launches:
            return 0
        return 8 * (read_bytes + self.written) + self.flops * (8 // FLOPS_PER_BYTE) + 8 * DISPATCH_COST_BYTES

    def cost(self, read_bytes: int) -> Cost:
        if not self.launches:
            return FREE
        return Cost(read_bytes + self.written, self.flops, 1, self.units(read_bytes))


def pricing(op: str, results: Sequence[TensorType], flops: int) -> Pricing:
    """The pricing of a kernel running `op` with these results and `flops` (module docstring)."""
    if not op_def(op).kernel:
        return Pricing(False)
    return Pricing(True, sum(t.nbytes for t in results), flops)


def price(op: str, results: Sequence[TensorType], read_bytes: int, flops: int) -> Cost:
    """The cost of one kernel running `op`: it reads `read_bytes` (its distinct tensors), writes its
    results and computes `flops` (see the module docstring); free for buffers and views."""
    return pricing(op, results, flops).cost(read_bytes)


def constant_node(graph: Graph, node_id: int) -> bool:
    """Whether a node's value is a scalar constant (a const, or a reshape of one)."""
    node = graph[node_id]
    while node.op == "reshape":
        node = graph[node.inputs[0]]
    return node.op == "const"


def node_cost(graph: Graph, node_id: int) -> Cost:
    """The cost of one IR node of a graph."""
    node = graph[node_id]
    if not op_def(node.op).kernel:
        return FREE
    operands = [graph[i].type for i in node.inputs]
    read_bytes = sum(graph[i].type.nbytes for i in dict.fromkeys(node.inputs) if not constant_node(graph, i))
    return price(node.op, node.types, read_bytes, kernel_flops(node.op, node.attr_dict, operands, node.types))


def graph_cost(graph: Graph) -> Cost:
    """The total cost of the live nodes of an IR graph."""
    total = Cost()
    for node_id in sorted(graph.live_ids()):
        total = total + node_cost(graph, node_id)
    return total


def kernel_count(graph: Graph) -> int:
    """How many live nodes of the graph launch a GPU kernel."""
    return sum(1 for node_id in graph.live_ids() if op_def(graph[node_id].op).kernel)
