"""The cost model: one pricing function for a kernel, used by extraction and by `graph_cost` alike.

A kernel costs

    (bytes read · read scale + bytes written + flops / FLOPS_PER_BYTE) / fill + DISPATCH_COST_BYTES

all in bytes, where "bytes read" counts each DISTINCT tensor the kernel reads once (a kernel
reading x twice, `mul(x, x)`, loads it once; the same tensor read by two kernels is paid by
each), "bytes written" is its results, and flops are what the op's declaration says (2·M·K·N
for a matmul, `Op.flops`), 0 otherwise. Leaves, constants, reshapes and projections are buffers
or views: they cost nothing, and so does reading a scalar constant (kernels inline it as a
literal). A plan's cost is the sum over the kernels it launches (each value it materialises is
computed once: DAG cost).

`fill` is how much of the compute units the kernel needs it keeps busy: busy / needed, where
`needed` is the units its work calls for, one per WORK_PER_UNIT bytes (a unit is worth occupying
once it has a dispatch's worth of work; a smaller kernel finishes within its launch anyway),
at most the `Target`'s compute units (meganeura/target.py: 132 on an H200, one per CPU thread on
lavapipe, 64 for a generic GPU), and `busy` = min(workgroups, needed), with the workgroups its
lowering launches (`codegen.lower.workgroups`, registered beside each lowering). A large kernel
of 9 workgroups on 132 units moves its bytes and does its flops at 9/132 of the adapter's rate,
so it costs 132/9 as much; this is what makes the weight gradient of a convolution over a large
batch (a GEMM with a small output and a long reduction: few workgroups) cost more than one GEMM
per image and a sum after them, where it does (`rewrite/conv.py`).

The read scale is 1 but for a kernel whose loads move more than they use, as its lowering says
(`codegen.lower.read_scale`): on a GPU a reduction down columns, a workgroup an output, fetches
a 32-byte sector for each 4-byte element (8), where the same sum split into parts of a thread an
output each (neighbouring threads, neighbouring columns) uses whole sectors (codegen/reduce.py).
Likewise the flops are charged at 100% but where the lowering says its layout runs them slower
(`codegen.lower.flop_scale`, a percentage): on a GPU a product whose B is stored transposed or
cannot be loaded by vec4 (codegen/matmul.py `matmul_flop_scale`), so that the plan transposes a
weight once where the product after it then runs faster.

`price` takes what both callers know: the op a kernel runs (for an e-node, the IR op it decodes
to), its attributes and operand and result types, the bytes of the distinct tensors it reads,
its flops (`kernel_flops`, from the op's declaration) and the target; extraction keeps the part
that does not depend on the reads per option (`pricing`). The pipeline checks that the plan's
cost, summed by extraction, equals `graph_cost` of the decoded graph.

Why bytes: elementwise kernels and epilogues are bound by memory traffic.
Why flops for matmuls: fusing an epilogue into a matmul whose plain result is needed anyway
recomputes the matmul. Priced by bytes alone, re-reading A and B looks cheap next to the
elementwise traffic it saves, even for a 4096³ matmul; the arithmetic term makes recomputing
cost what it does. FLOPS_PER_BYTE = 8: the WGSL SIMT GEMM reaches ~30 TFLOP/s on the H200, whose
memory moves ~4 TB/s (platform.md).
Why a fixed dispatch price: one dispatch costs a few microseconds inside a pass (about 6 µs on
an H200, 46 µs on lavapipe, see platform.md), the time to move tens of kilobytes or more; 64 KiB
is a moderate middle that makes removing a kernel worth more than a small tensor's traffic.
The dispatch price does not scale with the fill: it is the launch, not the work.

Why random draws: a random tensor read in place (`philox`, ir/ops/random.py) moves no bytes, but
each kernel reading it runs Philox for each of its elements: DRAW_FLOPS a draw, priced as flops
(not scaled by the kernel's layout), per element of the random tensor, as a read is priced at the
tensor's own bytes. So a dropout mask is regenerated in the backward where that costs less than
a kernel that stores it and the reads of it (small masks), and stored otherwise.

Extraction compares integer `units` (eighths of a byte, the fill applied by integer division)
so that sums and differences are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meganeura.codegen.lower import flop_scale as launched_flop_scale
from meganeura.codegen.lower import read_scale as launched_read_scale
from meganeura.codegen.lower import workgroups as launched_workgroups
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import op_def
from meganeura.ir.ops.random import DRAW_FLOPS
from meganeura.target import GENERIC, Target

DISPATCH_COST_BYTES = 64 * 1024
FLOPS_PER_BYTE = 8
WORK_PER_UNIT = DISPATCH_COST_BYTES


@dataclass(frozen=True)
class Cost:
    """Bytes moved (the tensors' bytes, read and written), flops and kernels dispatched by a plan
    (or by one kernel), and `units`, the number extraction minimises (eighths of a byte, the reads
    scaled as the module docstring says: sums and differences stay exact integers)."""

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
    bytes, its flops, whether it launches at all (buffers and views do not), the workgroups it
    launches, the compute units of the target, the factor on the bytes it reads and the
    percentage of its flops it is charged."""

    launches: bool
    written: int = 0
    flops: int = 0
    workgroups: int = 1
    compute_units: int = 1
    read_scale: int = 1
    flop_scale: int = 100  # percent

    def units(self, read_bytes: int, draws: int = 0) -> int:
        """The kernel's `Cost.units` when it reads `read_bytes` and draws `draws` random elements
        in place (extraction's hot path)."""
        if not self.launches:
            return 0
        flops = self.flops * self.flop_scale * 8 // (FLOPS_PER_BYTE * 100) + draws * DRAW_FLOPS * 8 // FLOPS_PER_BYTE
        work = 8 * (read_bytes * self.read_scale + self.written) + flops
        needed = min(self.compute_units, max(1, -(-work // (8 * WORK_PER_UNIT))))
        return work * needed // min(self.workgroups, needed) + 8 * DISPATCH_COST_BYTES

    def cost(self, read_bytes: int, draws: int = 0) -> Cost:
        if not self.launches:
            return FREE
        return Cost(read_bytes + self.written, self.flops + draws * DRAW_FLOPS, 1, self.units(read_bytes, draws))


def pricing(
    op: str,
    attrs: dict,
    operands: Sequence[TensorType],
    results: Sequence[TensorType],
    flops: int,
    target: Target = GENERIC,
) -> Pricing:
    """The pricing of a kernel running `op` on these types, with `flops`, on `target` (module docstring)."""
    if not op_def(op).kernel:
        return Pricing(False)
    workgroups = launched_workgroups(op, attrs, operands, results, target)
    scale = launched_read_scale(op, attrs, operands, results, target)
    flop_scale = launched_flop_scale(op, attrs, operands, results, target) if flops else 100
    return Pricing(True, sum(t.nbytes for t in results), flops, workgroups, target.compute_units, scale, flop_scale)


def price(
    op: str,
    attrs: dict,
    operands: Sequence[TensorType],
    results: Sequence[TensorType],
    read_bytes: int,
    target: Target = GENERIC,
    draws: int = 0,
) -> Cost:
    """The cost of one kernel running `op`: it reads `read_bytes` (its distinct tensors), draws
    `draws` random elements in place, writes its results, computes its flops, on `target` (see the
    module docstring); free for buffers and views."""
    flops = kernel_flops(op, attrs, operands, results)
    return pricing(op, attrs, operands, results, flops, target).cost(read_bytes, draws)


def constant_node(graph: Graph, node_id: int) -> bool:
    """Whether a node's value is a scalar constant (a const, or a reshape of one)."""
    node = graph[node_id]
    while node.op == "reshape":
        node = graph[node.inputs[0]]
    return node.op == "const"


def node_cost(
    graph: Graph, node_id: int, target: Target = GENERIC, attrs: dict | None = None, results: Sequence | None = None
) -> Cost:
    """The cost of one IR node of a graph, on `target`; with `attrs` and `results`, of the same
    node with those instead (a pass after extraction pricing a node's other form)."""
    node = graph[node_id]
    if not op_def(node.op).kernel:
        return FREE
    operands = [graph[i].type for i in node.inputs]
    distinct = dict.fromkeys(node.inputs)
    drawn = [i for i in distinct if graph[i].op == "philox"]
    read_bytes = sum(graph[i].type.nbytes for i in distinct if not constant_node(graph, i) and i not in drawn)
    draws = sum(graph[i].type.numel for i in drawn)
    attrs = node.attr_dict if attrs is None else attrs
    return price(node.op, attrs, operands, node.types if results is None else results, read_bytes, target, draws)


def graph_cost(graph: Graph, target: Target = GENERIC) -> Cost:
    """The total cost of the live nodes of an IR graph, on `target`."""
    total = Cost()
    for node_id in sorted(graph.live_ids()):
        total = total + node_cost(graph, node_id, target)
    return total


def kernel_count(graph: Graph) -> int:
    """How many live nodes of the graph launch a GPU kernel."""
    return sum(1 for node_id in graph.live_ids() if op_def(graph[node_id].op).kernel)
