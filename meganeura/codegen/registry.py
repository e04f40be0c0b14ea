"""The lowering registry: for each op that launches a kernel, the function that lowers a node of
it to a KernelSpec (WGSL text, bindings, grid), and how many workgroups that kernel launches.

Each kernel family module registers its lowerings beside them, `@lowering("matmul",
"fused_matmul", workgroups=matmul_workgroups)`; `codegen/lower.py` imports every family, so the
table is complete wherever lowering happens. A lowering is `fn(graph, node) -> KernelSpec`; a
workgroup count is `fn(attrs, operand types, result types) -> int`, computed from types alone so
that the cost model can ask it of an e-node before any IR node exists (`rewrite/cost.py`). It
sits beside the lowering and shares its tiling helpers; tests/test_target.py checks that it is
what every lowered kernel of several models dispatches. The default count is the elementwise
kernel's: a workgroup of 256 threads per 256 elements of the first result.

A family whose kernel is tuned per adapter registers with `per_target=True`: its lowering is
then `fn(graph, node, target)` and its workgroup count `fn(attrs, operands, results, target)`
(`meganeura/target.py`), so that both pick the same tiling for the adapter.

A family whose workgroups the cost model counts in other units than one each (a GEMM's, in its
ladder's largest tile) registers `counted=fn(attrs, operands, results, dispatched, target)`: a
dispatched grid in the units its workgroup count gives (identity where none is registered), so
that a check can hold every lowered kernel's grid against the count (tests/test_target.py).

A family whose kernel moves more memory than the bytes it uses registers `read_scale=fn(attrs,
operands, results, target)`: the factor the cost model puts on the bytes it reads (1 where none
is registered). A GPU fetches memory in 32-byte sectors: a reduction walking down columns, a
workgroup an output, uses 4 bytes of every sector a warp's load fetches (codegen/reduce.py).

A family whose kernel reaches a lower arithmetic rate for some layouts registers
`flop_scale=fn(attrs, operands, results, target)`: the percentage of its flops the cost model
charges (100 where none is registered). The GEMM's transposed-B products, measured slower than
the same product after a weight transpose (codegen/matmul.py `matmul_flop_scale`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meganeura.codegen.kernel import KernelSpec
from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.target import GENERIC, Target

Lowering = Callable[[Graph, Node], KernelSpec]
Workgroups = Callable[[dict, Sequence[TensorType], tuple[TensorType, ...]], int]
ReadScale = Callable[[dict, Sequence[TensorType], tuple[TensorType, ...], Target], int]
Counted = Callable[[dict, Sequence[TensorType], tuple[TensorType, ...], int, Target], int]
FlopScale = ReadScale
LOWERINGS: dict[str, Lowering] = {}
WORKGROUPS: dict[str, Workgroups] = {}
READ_SCALES: dict[str, ReadScale] = {}
COUNTED: dict[str, Counted] = {}
FLOP_SCALES: dict[str, FlopScale] = {}
PER_TARGET: set[str] = set()  # ops whose lowering and workgroup count also take the target
ELEMENTWISE_WORKGROUP = 256


def elementwise_workgroups(attrs: dict, operands: Sequence[TensorType], results: tuple[TensorType, ...]) -> int:
    """One workgroup of 256 threads per 256 elements of the first result."""
    return -(-results[0].numel // ELEMENTWISE_WORKGROUP)


def lowering(
    *ops: str,
    workgroups: Workgroups = elementwise_workgroups,
    per_target: bool = False,
    read_scale: ReadScale | None = None,
    counted: Counted | None = None,
    flop_scale: FlopScale | None = None,
) -> Callable[[Lowering], Lowering]:
    """Decorator: register the function as the lowering of `ops`, launching `workgroups` (both
    given the target as a last argument with `per_target`), its reads priced at `read_scale`, its
    dispatched workgroups in the cost model's units by `counted`, its flops charged at
    `flop_scale` percent (module docstring)."""

    def register(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"op {op!r} has two lowerings: {LOWERINGS[op].__name__} and {fn.__name__}")
            LOWERINGS[op] = fn
            WORKGROUPS[op] = workgroups
            if read_scale is not None:
                READ_SCALES[op] = read_scale
            if counted is not None:
                COUNTED[op] = counted
            if flop_scale is not None:
                FLOP_SCALES[op] = flop_scale
            if per_target:
                PER_TARGET.add(op)
        return fn

    return register


def registered_workgroups(
    op: str, attrs: dict, operands: Sequence[TensorType], results: Sequence[TensorType], target: Target = GENERIC
) -> int:
    """How many workgroups the kernel of `op` launches for these types on `target` (at least one).
    Every op's entry is there once its family module is imported: `lower.workgroups` makes sure."""
    count = WORKGROUPS.get(op)
    if count is None:
        raise KeyError(f"op {op!r} launches a kernel but has no lowering")
    extra = (target,) if op in PER_TARGET else ()
    return max(1, count(attrs, operands, tuple(results), *extra))


def registered_read_scale(
    op: str, attrs: dict, operands: Sequence[TensorType], results: Sequence[TensorType], target: Target = GENERIC
) -> int:
    """The factor on the bytes the kernel of `op` reads for these types on `target` (module docstring)."""
    scale = READ_SCALES.get(op)
    return 1 if scale is None else max(1, scale(attrs, operands, tuple(results), target))


def registered_flop_scale(
    op: str, attrs: dict, operands: Sequence[TensorType], results: Sequence[TensorType], target: Target = GENERIC
) -> int:
    """The percentage of its flops the cost model charges the kernel of `op` for these types on
    `target` (module docstring)."""
    scale = FLOP_SCALES.get(op)
    return 100 if scale is None else max(1, scale(attrs, operands, tuple(results), target))


def dispatch_counted(graph: Graph, node: Node, dispatched: int, target: Target = GENERIC) -> int:
    """`dispatched` workgroups of the kernel of an IR node in the units its workgroup count gives
    on `target` (`node_workgroups` is that count, from types: the two agree for every lowering)."""
    count = COUNTED.get(node.op)
    if count is None:
        return dispatched
    return count(node.attr_dict, [graph[i].type for i in node.inputs], node.types, dispatched, target)


def lowered(graph: Graph, node: Node, target: Target = GENERIC) -> KernelSpec:
    """The registered lowering of `node` for `target`."""
    extra = (target,) if node.op in PER_TARGET else ()
    return LOWERINGS[node.op](graph, node, *extra)


def node_workgroups(graph: Graph, node: Node, target: Target = GENERIC) -> int:
    """The workgroups the kernel of an IR node launches on `target` (what its lowering dispatches)."""
    types = [graph[i].type for i in node.inputs]
    return registered_workgroups(node.op, node.attr_dict, types, node.types, target)
