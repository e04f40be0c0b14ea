"""Multi-tensor optimizer updates: the fused updates of many parameters in one dispatch.

`group_updates(graph, target)` replaces the fused updates (sgd_update, adam_update, rmsprop_update,
adagrad_update, adamax_update, nadam_update, radam_update, adadelta_update: one node per parameter,
ir/ops/optimizer.py) that have the same op and form (attributes and arity) by multi-tensor nodes
(multi_sgd_update, multi_adam_update, …), as many members each as one kernel may bind buffers for;
the lowering (codegen/optimizer.py) runs each as one dispatch in which every member owns a range
of workgroups. The hyper-parameters are operands (elements of one vector leaf per parameter
group, optim/optimizers.py), so members of different parameter groups share a kernel: each member's case
reads its own group's values, and a group's vector is bound once however many members read it.
A SmolLM2-135M-shaped AdamW step has 272 parameters: 816 single-tensor kernels
(two moments and the step each, `fused=False`), 272 fused ones, and 39 multi-tensor ones on a
target of 31 buffers per kernel (7 members of 4 bindings and one group's vector).

Why grouping after extraction, and why by bindings:
- Grouping independent updates moves no byte more or less (each member reads and writes what it
  did alone), it only removes dispatches; it needs no choice between alternatives, so there is
  nothing for the cost model to weigh. The e-graph still decides each parameter's own update
  (plain SGD's may fold into the gradient's matmul, rewrite/pointwise.py); whatever is left as a
  fused update node after extraction is grouped here. As an e-graph rule, horizontal fusion
  would need a group e-node for every set of updates it might merge, and an extractor that
  switches all members of a group at once.
- Every parameter and optimizer state keeps its own device buffer (codegen/buffers.py), so
  reshape views, in-place updates, parameters shared between programs (runtime/executable.py)
  and `state_dict()` stay as they are. Packing them into arena buffers at fixed offsets would let
  one kernel sweep everything, but every Parameter's storage would become a slice of an arena
  owned by one program, and a second program on the same model would have to adopt its layout.
  The price of separate buffers is the binding limit: a kernel binds at most
  `Target.max_storage_buffers` (lavapipe 32, 31 on the generic target) and at most
  MAX_BINDINGS_PER_GROUP in one bind group, so a step has several multi-tensor kernels.

Not on a CPU (`Target.cpu`: lavapipe), where a multi-tensor kernel was measured slower than its
members one by one: AdamW on 8 parameters of [576, 576] (benchmarks/optimizer.py's time_update,
wall time of a step on a loaded 2-core machine), fused kernels one per parameter 24 ms, in groups
of 2 40 ms, of 4 43 ms, of 7 67 ms (the single-tensor kernels 30 ms), while a dispatch costs
~46 µs there. Our reading, not checked in Mesa's code: llvmpipe runs a workgroup's threads as SIMD
lanes under execution masks and does not skip the switch cases of the other members, although
the member is uniform per workgroup. So a CPU target keeps one fused kernel per parameter. A GPU
branches per warp, and a warp's threads are all in one workgroup: they run one case.

A member joins a group when the kernel can replace all its values in place (codegen/optimizer.
`updates_in_place`) and nothing but the step's updates reads its results; then merging it with
others cannot create a dependency cycle (no node depends on a member), and the anti-dependencies
the buffer plan adds (readers of a leaf before its update) only move the group after readers of
its members' leaves, which the updates followed anyway. A member must not read a leaf that any
update replaces (a gradient that is a parameter's buffer would then be bound read-only beside
that parameter's read_write binding in one dispatch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meganeura.codegen.common import binding_limit, bound_value, constant_value, merged_sources, storage
from meganeura.codegen.optimizer import updates_in_place
from meganeura.ir.graph import SKIP, Graph, Node
from meganeura.ir.op import add_checked
from meganeura.ir.ops.optimizer import MULTI_OF, updated_operands
from meganeura.target import GENERIC, Target


@dataclass
class Group:
    """Fused update nodes of one op and form that one multi-tensor kernel will run."""

    key: tuple
    members: list[int] = field(default_factory=list)
    reads: set[int] = field(default_factory=set)  # the distinct buffers the members read
    outputs: int = 0  # the result buffers (one per value replaced)

    @property
    def bindings(self) -> int:
        return len(self.reads) + self.outputs


def groups_updates(target: Target) -> bool:
    """Whether multi-tensor kernels pay on `target`: on a GPU, not on a CPU (module docstring)."""
    return not target.cpu


def update_roots(graph: Graph, node_id: int) -> list[int]:
    """The nodes that hold a fused update's results: its `result` projections, or the node itself
    (plain SGD's update has one result)."""
    node = graph[node_id]
    if node.results == 1:
        return [node_id]
    return sorted(graph.users()[node_id], key=lambda user: graph[user].attr("index", -1))


def groupable(graph: Graph, node_id: int, replaced_leaves: set[int]) -> bool:
    """Whether a fused update may join a multi-tensor kernel (module docstring): every result in
    place, read by nothing but the step's updates, and no operand it only reads is a leaf that an
    update replaces."""
    node = graph[node_id]
    positions = updated_operands(node)
    if not all(updates_in_place(graph, node, p, r) for r, p in enumerate(positions)):
        return False
    users = graph.users()
    roots = update_roots(graph, node_id)
    if node.results > 1 and [(graph[r].op, graph[r].attr("index")) for r in roots] != [
        ("result", index) for index in range(node.results)
    ]:
        return False  # a projection of each result, once (nothing else reads the node)
    updates, outputs = set(graph.updates.values()), set(graph.outputs.values())
    if any(users[r] or r not in updates or r in outputs for r in roots):
        return False
    reads = [bound_value(graph, i)[0] for p, i in enumerate(node.inputs) if p not in positions]
    return not any(storage(graph, i)[0] in replaced_leaves for i in reads)


def member_reads(graph: Graph, node_id: int) -> set[int]:
    """The buffers a member reads besides the values it replaces (constants are inlined; the
    hyper-parameters are elements of their group's vector, one binding)."""
    node = graph[node_id]
    positions = set(updated_operands(node))
    return {
        bound_value(graph, i)[0]
        for p, i in enumerate(node.inputs)
        if p not in positions and constant_value(graph, i) is None
    }


def plan_groups(graph: Graph, target: Target = GENERIC) -> list[Group]:
    """The multi-tensor kernels: groupable fused updates in graph order, by op, attributes and arity,
    each group filled while its bindings fit the target's limit (groups of one included; on a CPU
    target every group has one member)."""
    limit = binding_limit(target)
    replaced_leaves = {n.id for n in graph if n.op in ("param", "state") and n.attr("name") in graph.updates}
    live = graph.live_ids()
    open_groups: dict[tuple, Group] = {}
    groups: list[Group] = []
    for node in graph:
        if node.op not in MULTI_OF or node.id not in live or not groupable(graph, node.id, replaced_leaves):
            continue
        key = (node.op, node.attrs, len(node.inputs))
        reads = member_reads(graph, node.id)
        group = open_groups.get(key)
        if group is not None and (
            not groups_updates(target) or len(group.reads | reads) + group.outputs + node.results > limit
        ):
            group = None
        if group is None:
            group = open_groups[key] = Group(key)
            groups.append(group)
        group.members.append(node.id)
        group.reads |= reads
        group.outputs += node.results
    return groups


def group_updates(graph: Graph, target: Target = GENERIC) -> Graph:
    """`graph` with the fused updates of each multi-member group (`plan_groups`) replaced by one
    multi-tensor node and `result` projections of it, which graph.updates then names."""
    groups = [g for g in plan_groups(graph, target) if len(g.members) > 1]
    if not groups:
        return graph
    last_member = {g.members[-1]: g for g in groups}
    replaced = {m for g in groups for m in g.members}
    projections = {r for m in replaced for r in update_roots(graph, m) if r != m}

    def replace(node: Node, new: Graph, new_id: dict[int, int]) -> int | None:
        if node.id not in replaced and node.id not in projections:
            return None
        group = last_member.get(node.id)
        if group is not None:  # every member's operands come before its last member
            add_multi_node(graph, new, group, new_id)
        return SKIP  # the members and their projections: add_multi_node maps them

    return graph.rebuilt(replace)


def add_multi_node(graph: Graph, new: Graph, group: Group, new_id: dict[int, int]) -> None:
    """Append the group's multi-tensor node and a projection per member result to `new`, mapping
    each member's old result nodes to the projections in `new_id`."""
    op, attrs, _ = group.key
    members = [graph[m] for m in group.members]
    inputs = [new_id[i] for m in members for i in m.inputs]
    multi_attrs = {**dict(attrs), "members": len(members)}
    if op == "sgd_update":  # the members' arity: with a momentum buffer each, or none
        multi_attrs["momentum"] = len(members[0].inputs) == 7
    multi = add_checked(new, MULTI_OF[op], inputs, multi_attrs, merged_sources(m.sources for m in members))
    types = new[multi].types
    index = 0
    for member in members:
        for root in update_roots(graph, member.id):
            new_id[root] = new.add("result", (multi,), types[index], {"index": index}, member.sources)
            index += 1
