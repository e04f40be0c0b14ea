"""The cost model that extraction minimises: bytes moved, matmul arithmetic, and a price per dispatch.

A kernel costs

    bytes read + bytes written + flops / FLOPS_PER_BYTE + DISPATCH_COST_BYTES

all in bytes, where "bytes read" counts each DISTINCT tensor the kernel reads once (a kernel
reading x twice, `mul(x, x)`, loads it once; the same tensor read by two kernels is paid by
each), "bytes written" is its result, and flops are 2·M·K·N for a (fused) matmul, 0 otherwise.
Leaves, constants and reshapes are buffers or views: they cost nothing. A plan's cost is the sum
over the kernels it launches (each value it materialises is computed once: DAG cost).

For a fused kernel the reads are the distinct tensors its body loads: a pointwise kernel that
inlines a producer reads the producer's inputs instead of the producer's result; a matmul kernel
reads A, B and the extra tensors of its epilogue. The same function prices an IR node (the
report's before/after figures, `graph_cost`) and an extraction candidate (`extract.py`), so the
two agree: the decoded node's inputs are exactly the candidate's distinct reads.

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
from meganeura.ir.ops import launches_kernel

DISPATCH_COST_BYTES = 64 * 1024
FLOPS_PER_BYTE = 8
MATMUL_OPS = ("matmul", "fused_matmul")


@dataclass(frozen=True)
class Cost:
    """Bytes moved, matmul flops and kernels dispatched by a plan (or by one node)."""

    bytes: int = 0
    flops: int = 0
    dispatches: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.bytes + other.bytes, self.flops + other.flops, self.dispatches + other.dispatches)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.bytes - other.bytes, self.flops - other.flops, self.dispatches - other.dispatches)

    @property
    def scalar(self) -> float:
        """The single number extraction minimises, in bytes."""
        return self.bytes + self.flops / FLOPS_PER_BYTE + DISPATCH_COST_BYTES * self.dispatches

    @property
    def units(self) -> int:
        """`scalar` in eighths of a byte, an exact integer."""
        return 8 * self.bytes + self.flops * (8 // FLOPS_PER_BYTE) + 8 * DISPATCH_COST_BYTES * self.dispatches


def matmul_flops(output: TensorType, inner: int) -> int:
    """2·K per element of the product: 2·(batch·M·N)·K, also where a 2-D operand is shared by a batch."""
    return 2 * output.numel * inner


def matmul_inner(a_shape: tuple[int, ...], transpose_a: bool = False, flatten_a: bool = False) -> int:
    """K, the reduced dim of a product whose A operand is stored with `a_shape` (transposed: its rows;
    flattened to rows (`fused_matmul` flatten_a) and transposed: all its leading dims)."""
    if not transpose_a:
        return a_shape[-1]
    rows = 1
    for d in a_shape[:-1] if flatten_a else a_shape[-2:-1]:
        rows *= d
    return rows


def conv_gemm_flops(output: TensorType, a: TensorType, mode: str = "forward", kernel=(1, 1), stride=(1, 1)) -> int:
    """2·M·K·N of an implicit-GEMM convolution (conv_gemm): its first operand holds M·K elements (the
    weight, or the gradient [N, O, L] for grad_weight) and its output M·N, M being the output's
    channel dim (dim 1 of an image [N, C, H, W], dim 0 of a weight gradient [O, C·kh·kw]); a
    weight gradient in chunks of images [S, O, C·kh·kw] does the same work in S parts. An input
    gradient runs one GEMM per stride phase (sh·sw of them), each over the taps of its phase (the
    phases share the kh·kw taps out) and the ⌈H/sh⌉·⌈W/sw⌉ pixels of the largest phase."""
    if mode == "grad_input":
        images, _, height, width = output.shape
        pixels = -(-height // stride[0]) * -(-width // stride[1])
        return 2 * a.numel * images * pixels  # a: the weight, O·C·kh·kw
    if output.rank == 4:
        return 2 * a.numel * output.numel // max(output.shape[1], 1)
    return 2 * a.numel * output.shape[-1]


def kernel_cost(op: str, output: TensorType, operands: Sequence[TensorType], attrs: dict | None = None) -> Cost:
    """The cost of one node, from its op, its result type and its distinct operands' types (in order).

    `operands` lists each distinct operand value once, the first operand first: a kernel
    reading `x` twice (`mul x x`) loads it once.
    """
    if not launches_kernel(op):
        return Cost()
    attrs = attrs or {}
    flops = 0
    if op in MATMUL_OPS:
        inner = matmul_inner(operands[0].shape, bool(attrs.get("transpose_a")), bool(attrs.get("flatten_a")))
        flops = matmul_flops(output, inner)
    if op == "conv_gemm":
        mode, window = attrs.get("mode", "forward"), (attrs.get("kernel", (1, 1)), attrs.get("stride", (1, 1)))
        flops = conv_gemm_flops(output, operands[0], mode, *window)
    return Cost(sum(t.nbytes for t in operands) + output.nbytes, flops, 1)


def node_cost(graph: Graph, node_id: int) -> Cost:
    """The cost of one IR node of a graph."""
    node = graph[node_id]
    operands = [graph[i].type for i in dict.fromkeys(node.inputs)]
    return kernel_cost(node.op, node.type, operands, node.attr_dict)


def graph_cost(graph: Graph) -> Cost:
    """The total cost of the live nodes of an IR graph."""
    total = Cost()
    for node_id in sorted(graph.live_ids()):
        total = total + node_cost(graph, node_id)
    return total


def kernel_count(graph: Graph) -> int:
    """How many live nodes of the graph launch a GPU kernel."""
    return sum(1 for node_id in graph.live_ids() if launches_kernel(graph[node_id].op))
