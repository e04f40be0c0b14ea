"""The named passes after extraction: rewrites of the extracted plan that no e-graph rule expresses
yet, each deciding by the cost model or by a fixed policy, run in order by `run_passes`.

- `dq_from_scores` (passes/attention_scores.py): attention's dQ made a product of the dS that the
  dK/dV kernel writes, where the cost model prices that lower;
- `split_attention_heads` (passes/attention_heads.py): a grouped dK/dV split per query head, where
  the three kernels cost less than the one;
- `split_operands` (passes/operand_splits.py): on a target with tensor cores, the products that can
  take them made products of operands split once into f16 halves;
- `updates_reading_parts` (passes/update_parts.py): an optimizer update whose gradient is a sum of
  parts reads the parts (one kernel fewer);
- `group_updates` (passes/multi_tensor.py): the fused updates grouped into multi-tensor kernels.

Each is a pass, not a rule, because its choice switches several e-classes at once (a node gaining
a result and its reader changing with it), which extraction's one-class moves do not find; the
kernel-layer issue makes rules of those that can be. `program.report()` lists what each changed:
kernels before and after, and the cost model's price of the plan before and after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meganeura.codegen.compiled import CompiledStep, lower_step
from meganeura.ir.graph import Graph
from meganeura.passes.attention_heads import split_attention_heads
from meganeura.passes.attention_scores import dq_from_scores
from meganeura.passes.multi_tensor import group_updates
from meganeura.passes.operand_splits import split_operands
from meganeura.passes.update_parts import updates_reading_parts
from meganeura.rewrite.cost import Cost, graph_cost, kernel_count, node_cost
from meganeura.target import GENERIC, Target


@dataclass(frozen=True)
class Pass:
    """A pass: its name, what it does in a line, and the rewrite (a graph for a target → a graph)."""

    name: str
    does: str
    run: Callable[[Graph, Target], Graph]


PASSES = (
    Pass("dq_from_scores", "attention's dQ as a product of the dS that dK/dV writes", dq_from_scores),
    Pass("split_attention_heads", "grouped dK/dV split per query head", split_attention_heads),
    # before the updates take their gradients' parts: it re-parts products
    Pass("split_operands", "products on the tensor cores from operands split once", split_operands),
    Pass("updates_reading_parts", "updates read their gradients' parts", lambda graph, _: updates_reading_parts(graph)),
    Pass("group_updates", "fused optimizer updates grouped into multi-tensor kernels", group_updates),
)


@dataclass(frozen=True)
class PassRun:
    """What one pass did to a plan: the graphs before and after it, priced on `target` when read."""

    name: str
    does: str
    before: Graph
    after: Graph
    target: Target

    @property
    def changed(self) -> bool:
        return self.after is not self.before

    @property
    def kernels(self) -> tuple[int, int]:
        """Kernels of the plan before and after the pass."""
        return kernel_count(self.before), kernel_count(self.after)

    @property
    def costs(self) -> tuple[Cost, Cost]:
        """The cost model's price of the plan before and after the pass."""
        return graph_cost(self.before, self.target), graph_cost(self.after, self.target)


def run_passes(graph: Graph, target: Target = GENERIC, skip: tuple[str, ...] = ()) -> tuple[Graph, list[PassRun]]:
    """`graph` after every pass but those named in `skip`, in order, and what each did."""
    unknown = set(skip) - {p.name for p in PASSES}
    if unknown:
        raise ValueError(f"no pass named {sorted(unknown)}; the passes are {[p.name for p in PASSES]}")
    runs = []
    for step in PASSES:
        if step.name in skip:
            continue
        after = step.run(graph, target)
        runs.append(PassRun(step.name, step.does, graph, after, target))
        graph = after
    return graph, runs


def compile_step(
    graph: Graph, target: Target = GENERIC, multi_tensor: bool = True, per_query_head: bool = True
) -> CompiledStep:
    """`graph` after the passes (without `group_updates` where not `multi_tensor`, without
    `split_attention_heads` where not `per_query_head`: for the benchmarks and tests that time or
    check the kernels without them), lowered to kernels for `target` with its buffers planned."""
    skip = ("group_updates",) * (not multi_tensor) + ("split_attention_heads",) * (not per_query_head)
    planned, runs = run_passes(graph, target, skip)
    return lower_step(planned, target, tuple(runs), node_cost)
