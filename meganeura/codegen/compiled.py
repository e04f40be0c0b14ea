"""CompiledStep: a step lowered and planned, as plain data the runtime only has to bind and run.

`compile_step(graph)` lowers every kernel of a (fused) graph and plans its buffers, without any
device: the WGSL of every kernel, its bindings and grid, the run order, every buffer's size and
role, and the end-of-step copies are all decided here (`python -m meganeura explain --wgsl`
prints them). The runtime (`runtime/executable.py`) creates the buffers, pipelines and bind
groups once from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from meganeura.codegen.attention_heads import split_attention_heads
from meganeura.codegen.attention_scores import dq_from_scores
from meganeura.codegen.buffers import BufferPlan, plan_buffers
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.lower import lower_graph
from meganeura.codegen.matmul_halves import split_operands
from meganeura.codegen.multi_tensor import group_updates
from meganeura.codegen.optimizer import updates_reading_parts
from meganeura.ir.graph import PERSISTENT, Graph, TensorType
from meganeura.target import GENERIC, Target


@dataclass(frozen=True)
class CompiledStep:
    """A graph's kernels in run order and its buffer plan."""

    graph: Graph
    plan: BufferPlan
    target: Target = GENERIC  # the adapter it was compiled for

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


def compile_step(
    graph: Graph, target: Target = GENERIC, multi_tensor: bool = True, per_query_head: bool = True
) -> CompiledStep:
    """`graph` lowered to kernels for `target`, with its buffers planned (no device needed): first
    attention's dQ made a matmul of the dS that the dK/dV kernel writes (codegen/attention_scores.py)
    and, with `per_query_head`, the grouped dK/dV split per query head (codegen/attention_heads.py),
    each where that costs less; on a target with tensor cores, the products that can take them
    made products of operands split once into f16 halves (codegen/matmul_halves.py); each
    optimizer update whose gradient is a sum of parts made to read the parts (codegen/
    optimizer.py); with `multi_tensor`, the fused optimizer updates grouped into multi-tensor
    kernels (codegen/multi_tensor.py). The step's graph is then the rewritten one.
    (Both options are there for the benchmarks and tests that time or check the kernels without
    those passes.)"""
    graph = dq_from_scores(graph, target)
    if per_query_head:
        graph = split_attention_heads(graph, target)
    graph = split_operands(graph, target)  # before the updates take their gradients' parts: it re-parts products
    graph = updates_reading_parts(graph)
    if multi_tensor:
        graph = group_updates(graph, target)
    kernels = lower_graph(graph, target)
    for spec in kernels:
        if len(spec.bindings) > target.max_storage_buffers:
            raise ValueError(
                f"kernel %{spec.node} ({spec.label[:120]}) binds {len(spec.bindings)} storage buffers; "
                f"{target.name} allows {target.max_storage_buffers} per kernel"
            )
    return CompiledStep(graph, plan_buffers(graph, kernels), target)
