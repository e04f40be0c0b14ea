"""Lowering a graph: one KernelSpec per node that launches a kernel, by the registered lowerings.

The kernel families register their lowerings in `codegen/registry.py`; this module imports them
all (elementwise, shape, matmul, matmul_halves, halves_split, reduce, rows, indexing, optimizer,
recurrent, transformer, image, conv, select), so `lower_node`, `lower_graph` and `workgroups` see every op.
"""

from __future__ import annotations

from collections.abc import Sequence

from meganeura.codegen import (  # noqa: F401  (imported for their registered lowerings)
    conv,
    elementwise,
    halves_split,
    image,
    indexing,
    matmul,
    matmul_halves,
    optimizer,
    recurrent,
    reduce,
    rows,
    select,
    shape,
    transformer,
    winograd,
)
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import (
    LOWERINGS,
    lowered,
    registered_flop_scale,
    registered_read_scale,
    registered_workgroups,
)
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import op_def
from meganeura.target import GENERIC, Target


def workgroups(
    op: str, attrs: dict, operands: Sequence[TensorType], results: Sequence[TensorType], target: Target = GENERIC
) -> int:
    """How many workgroups the kernel of `op` launches for these types on `target` (the cost model's question)."""
    return registered_workgroups(op, attrs, operands, results, target)


def read_scale(
    op: str, attrs: dict, operands: Sequence[TensorType], results: Sequence[TensorType], target: Target = GENERIC
) -> int:
    """The factor on the bytes the kernel of `op` reads, as the memory moves them (the cost model's question)."""
    return registered_read_scale(op, attrs, operands, results, target)


def flop_scale(
    op: str, attrs: dict, operands: Sequence[TensorType], results: Sequence[TensorType], target: Target = GENERIC
) -> int:
    """The percentage of its flops the kernel of `op` is charged, for the rate its layout reaches
    (the cost model's question)."""
    return registered_flop_scale(op, attrs, operands, results, target)


def lower_node(graph: Graph, node_id: int, target: Target = GENERIC) -> KernelSpec:
    """The kernel that computes node `node_id` on `target`."""
    node = graph[node_id]
    lowering = LOWERINGS.get(node.op)
    if lowering is None:
        raise NotImplementedError(
            f"no GPU kernel for op {node.op!r} (node %{node_id}); the code generator lowers {sorted(LOWERINGS)}"
        )
    return lowered(graph, node, target)


def lower_graph(graph: Graph, target: Target = GENERIC) -> list[KernelSpec]:
    """A kernel for every live node that computes something (not leaves, views or projections), in
    graph order, for `target`."""
    live = graph.live_ids()
    return [lower_node(graph, n.id, target) for n in graph if n.id in live and op_def(n.op).kernel]
