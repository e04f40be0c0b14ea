"""The lowering registry: for each op that launches a kernel, the function that lowers a node of
it to a KernelSpec (WGSL text, bindings, grid), and how many workgroups that kernel launches.

Each kernel family module registers its lowerings beside them, `@lowering("matmul",
"fused_matmul", workgroups=matmul_workgroups)`; `codegen/lower.py` imports every family, so the
table is complete wherever lowering happens. A lowering is `fn(graph, node) -> KernelSpec`; a
workgroup count is `fn(attrs, operand types, result types) -> int`, computed from types alone so
that the cost model can ask it of an e-node before any IR node exists (`rewrite/cost.py`). It
sits beside the lowering and shares its tiling helpers; tests/test_kernels.py checks that it is
what every lowered kernel of several models dispatches. The default count is the elementwise
kernel's: a workgroup of 256 threads per 256 elements of the first result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meganeura.codegen.kernel import KernelSpec
from meganeura.ir.graph import Graph, Node, TensorType

Lowering = Callable[[Graph, Node], KernelSpec]
Workgroups = Callable[[dict, Sequence[TensorType], tuple[TensorType, ...]], int]
LOWERINGS: dict[str, Lowering] = {}
WORKGROUPS: dict[str, Workgroups] = {}
ELEMENTWISE_WORKGROUP = 256


def elementwise_workgroups(attrs: dict, operands: Sequence[TensorType], results: tuple[TensorType, ...]) -> int:
    """One workgroup of 256 threads per 256 elements of the first result."""
    return -(-results[0].numel // ELEMENTWISE_WORKGROUP)


def lowering(*ops: str, workgroups: Workgroups = elementwise_workgroups) -> Callable[[Lowering], Lowering]:
    """Decorator: register the function as the lowering of `ops`, launching `workgroups`."""

    def register(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"op {op!r} has two lowerings: {LOWERINGS[op].__name__} and {fn.__name__}")
            LOWERINGS[op] = fn
            WORKGROUPS[op] = workgroups
        return fn

    return register


def registered_workgroups(op: str, attrs: dict, operands: Sequence[TensorType], results: Sequence[TensorType]) -> int:
    """How many workgroups the kernel of `op` launches for these types (at least one). Every op's
    entry is there once its family module is imported: `lower.workgroups` makes sure of that."""
    count = WORKGROUPS.get(op)
    if count is None:
        raise KeyError(f"op {op!r} launches a kernel but has no lowering")
    return max(1, count(attrs, operands, tuple(results)))


def node_workgroups(graph: Graph, node: Node) -> int:
    """The workgroups the kernel of an IR node launches (what its lowering dispatches)."""
    return registered_workgroups(node.op, node.attr_dict, [graph[i].type for i in node.inputs], node.types)
