"""CompiledStep: a step lowered and planned, as plain data the runtime only has to bind and run.

`lower_step(graph)` lowers every kernel of a planned graph and plans its buffers, without any
device: the WGSL of every kernel, its bindings and grid, the run order, every buffer's size and
role, and the end-of-step copies are all decided here (`python -m meganeura explain --wgsl`
prints them). The runtime (`runtime/executable.py`) creates the buffers, pipelines and bind
groups once from it. The passes after extraction (meganeura/passes/) run before it:
`meganeura.passes.compile_step` is both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meganeura.codegen.buffers import BufferPlan, plan_buffers
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.lower import lower_graph
from meganeura.ir.graph import PERSISTENT, Graph, TensorType
from meganeura.target import GENERIC, Target


@dataclass(frozen=True)
class CompiledStep:
    """A graph's kernels in run order and its buffer plan."""

    graph: Graph
    plan: BufferPlan
    target: Target = GENERIC  # the adapter it was compiled for
    passes: tuple = ()  # what each pass after extraction did (meganeura.passes.PassRun), in order
    # The cost model's price of a kernel's node, (graph, node id) -> Cost (meganeura.passes gives
    # rewrite.cost.node_cost): the profiler's bytes and flops, without the runtime importing it.
    pricing: Callable | None = None

    @property
    def kernels(self) -> list[KernelSpec]:
        """The kernels in the order they run."""
        return self.plan.schedule

    @property
    def leaf_types(self) -> dict[str, TensorType]:
        """The type of every input, param and state leaf, by name."""
        return {n.attr("name"): n.type for n in self.graph if n.op in PERSISTENT}

    def wgsl(self) -> str:
        """Every kernel's WGSL, in run order, each under a comment naming its node and label."""
        parts = [f"// ---- kernel {i}: %{spec.node} {spec.label}\n{spec.wgsl}" for i, spec in enumerate(self.kernels)]
        return "\n\n".join(parts)


def lower_step(
    graph: Graph, target: Target = GENERIC, passes: tuple = (), pricing: Callable | None = None
) -> CompiledStep:
    """`graph` (after the passes) lowered to kernels for `target`, with its buffers planned (no
    device needed); `passes` (what the passes did) and `pricing` kept with it for the report and
    the profiler."""
    kernels = lower_graph(graph, target)
    for spec in kernels:
        if len(spec.bindings) > target.max_storage_buffers:
            raise ValueError(
                f"kernel %{spec.node} ({spec.label[:120]}) binds {len(spec.bindings)} storage buffers; "
                f"{target.name} allows {target.max_storage_buffers} per kernel"
            )
    return CompiledStep(graph, plan_buffers(graph, kernels), target, passes, pricing)
