"""The buffer plan: the order kernels run in, and which device buffer holds each IR value.

- Values: a buffer's worth of data is (node, result index); a node with several results (an
  attention's output and log-sum-exp) writes one value per result in one dispatch.
- Schedule: kernels in a topological order of their data dependencies, plus anti-dependency
  edges: every kernel that reads a param/state leaf runs before the kernel that updates that
  leaf in place (it would otherwise read the new value). Ties keep graph order.
- Storage: inputs, params, states and constants that a kernel binds get one buffer each, for
  good. Graph outputs and update values keep theirs to the end of the step. Every other value
  is dead after its last reader in the schedule, and its buffer goes back to a free pool that
  later kernels' outputs draw from (a buffer grows to its largest tenant). A kernel's output
  is placed before its inputs are released, so no kernel writes a buffer it also reads.
- Aliases: a reshape is a view of its input's buffer, a `result` projection a view of its node's
  result; an in-place update lives in the buffer of the leaf it replaces.
- End of step: an update whose value is not already in its leaf's buffer (the Adam step count
  `add`, or an update that could not run in place) is copied there after the compute pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from meganeura.codegen.common import storage
from meganeura.codegen.kernel import Binding, KernelSpec, Value
from meganeura.ir.graph import PERSISTENT, Graph
from meganeura.ir.ops.constants import CONSTANT_LEAVES

LEAF_ROLES = ("input", "param", "state", "const")


@dataclass
class BufferSlot:
    """One device buffer: its size, what it is for, and the values that live in it over the step."""

    index: int
    nbytes: int
    role: str  # "input", "param", "state", "const", "output" (kept to the end of the step) or "temp"
    name: str = ""  # the leaf's or output's name
    values: list[Value] = field(default_factory=list)


@dataclass(frozen=True)
class StateCopy:
    """An end-of-step copy of an update's value into the buffer of the leaf it replaces."""

    source: int  # buffer index
    target: int  # buffer index
    nbytes: int
    leaf: str
    value: int  # IR node id


@dataclass
class BufferPlan:
    """Kernels in run order, buffers, the buffer of every value, and the end-of-step copies.

    `buffer_of` maps each value (node, result index) that owns or shares a buffer; `node_slot` maps
    every node of one result whose data is in a buffer (views included) to that buffer."""

    schedule: list[KernelSpec]
    buffers: list[BufferSlot]
    buffer_of: dict[Value, int]
    node_slot: dict[int, int]
    copies: list[StateCopy]
    value_bytes: dict[Value, int]  # bytes of every value that would own a buffer without reuse

    @property
    def total_bytes(self) -> int:
        return sum(slot.nbytes for slot in self.buffers)

    @property
    def bytes_without_reuse(self) -> int:
        return sum(self.value_bytes.values())

    def leaf_buffers(self, role: str) -> dict[str, int]:
        """Buffer index by leaf name, for one role ("input", "param", "state")."""
        return {slot.name: slot.index for slot in self.buffers if slot.role == role}

    def slot(self, binding: Binding) -> int:
        """The buffer a binding binds: the value it writes, or the data it reads."""
        if binding.access == "read_write":
            return self.buffer_of[(binding.value, binding.index)]
        return self.node_slot[binding.value]

    def __str__(self) -> str:
        head = (
            f"BufferPlan: {len(self.buffers)} buffers for {len(self.value_bytes)} values, "
            f"{format_bytes(self.total_bytes)} ({format_bytes(self.bytes_without_reuse)} without reuse); "
            f"{len(self.schedule)} kernels, {len(self.copies)} end-of-step copies"
        )
        lines = [head]
        for slot in self.buffers:
            what = f"{slot.role} {slot.name}".strip()
            values = " ".join(f"%{n}" if i == 0 else f"%{n}.{i}" for n, i in slot.values)
            lines.append(f"  #{slot.index:<4} {format_bytes(slot.nbytes):>10}  {what:<32} {values}")
        for copy in self.copies:
            lines.append(f"  copy #{copy.source} -> #{copy.target} ({copy.leaf} <- %{copy.value}, {copy.nbytes} B)")
        return "\n".join(lines)


def format_bytes(count: int) -> str:
    if count < 1024:
        return f"{count} B"
    if count < 1024 * 1024:
        return f"{count / 1024:.1f} KiB"
    return f"{count / (1024 * 1024):.1f} MiB"


def storage_root(graph: Graph, kernels_by_node: dict[int, KernelSpec], value: Value) -> Value:
    """The value that owns `value`'s buffer: from in-place results to the leaf they update."""
    spec = kernels_by_node.get(value[0])
    while spec is not None and spec.inplace_of(value[1]) is not None:
        value = storage(graph, spec.inplace_of(value[1]))
        spec = kernels_by_node.get(value[0])
    return value


def read_values(graph: Graph, spec: KernelSpec) -> list[Value]:
    """The values a kernel reads (its read bindings, and the old value of an in-place update)."""
    values = [storage(graph, b.value) for b in spec.bindings if b.access == "read"]
    return values + [storage(graph, i) for i in spec.inplace_reads]


def schedule_kernels(graph: Graph, kernels: list[KernelSpec]) -> list[KernelSpec]:
    """Kernels in dependency order, readers of a leaf before its in-place update; ties in graph order."""
    by_node = {spec.node: spec for spec in kernels}
    producer_of = {value: spec.node for spec in kernels for value in spec.written}
    order = nx.DiGraph()
    order.add_nodes_from(by_node)
    updaters = {storage(graph, i): s.node for s in kernels for i in s.inplace_reads}
    for spec in kernels:
        for value in read_values(graph, spec):
            if value in producer_of:
                order.add_edge(producer_of[value], spec.node)
            updater = updaters.get(value)
            if updater is not None and updater != spec.node:
                order.add_edge(spec.node, updater)  # read the old value before it is overwritten
    try:
        return [by_node[n] for n in nx.lexicographical_topological_sort(order)]
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(order)
        raise ValueError(
            "no schedule: an in-place update must run after every reader of the old value, but a reader "
            f"depends on the update (cycle {' -> '.join(f'%{a}' for a, _ in cycle)})"
        ) from None


def plan_buffers(graph: Graph, kernels: list[KernelSpec]) -> BufferPlan:
    """Schedule `kernels` (from lower_graph) and assign every value they touch a buffer."""
    schedule = schedule_kernels(graph, kernels)
    by_node = {spec.node: spec for spec in kernels}
    buffers: list[BufferSlot] = []
    buffer_of: dict[Value, int] = {}
    value_bytes: dict[Value, int] = {}

    def new_slot(nbytes: int, role: str, name: str = "") -> BufferSlot:
        buffers.append(BufferSlot(len(buffers), nbytes, role, name))
        return buffers[-1]

    def place(value: Value, slot: BufferSlot) -> None:
        buffer_of[value] = slot.index
        slot.values.append(value)
        slot.nbytes = max(slot.nbytes, nbytes_of(graph, value))

    def root_of(node_id: int) -> Value:
        return storage_root(graph, by_node, storage(graph, node_id))

    # Leaves: every input, param and state, and the constants that something binds or returns
    # (scalars, and the arrays of ir/ops/constants.py: role "const", written once by the runtime).
    bound = {storage(graph, v) for v in [*(b.value for s in kernels for b in s.bindings), *graph.roots()]}
    for node in graph:
        if node.op in PERSISTENT or (node.op in CONSTANT_LEAVES and (node.id, 0) in bound):
            value = (node.id, 0)
            role = "const" if node.op in CONSTANT_LEAVES else node.op
            place(value, new_slot(nbytes_of(graph, value), role, node.attr("name") or ""))
            value_bytes[value] = nbytes_of(graph, value)

    pinned = {root_of(v) for v in graph.roots()} | set(buffer_of)
    out_names: dict[Value, str] = {}
    for name, node_id in list(graph.outputs.items()) + list(graph.updates.items()):
        out_names.setdefault(root_of(node_id), name)
    last_use: dict[Value, int] = {}
    for position, spec in enumerate(schedule):
        for value in read_values(graph, spec):
            last_use[storage_root(graph, by_node, value)] = position

    free: list[BufferSlot] = []
    for position, spec in enumerate(schedule):
        roots = set()
        for value in spec.written:
            root = storage_root(graph, by_node, value)
            roots.add(root)
            if root != value:  # in place: the result lives in its leaf's buffer
                place(value, buffers[buffer_of[root]])
            else:
                value_bytes[value] = nbytes_of(graph, value)
                if root in pinned:
                    place(value, new_slot(nbytes_of(graph, value), "output", out_names.get(root, "")))
                else:
                    place(value, take_free(free, nbytes_of(graph, value)) or new_slot(0, "temp"))
        released = {storage_root(graph, by_node, v) for v in read_values(graph, spec)} | roots
        for value in released:
            if value not in pinned and last_use.get(value, position) == position:
                free.append(buffers[buffer_of[value]])

    node_slot = {}
    for node in graph:  # every node of one result whose data is in a buffer: views share it
        if node.results == 1 and storage(graph, node.id) in buffer_of:
            node_slot[node.id] = buffer_of[storage(graph, node.id)]
    copies = state_copies(graph, node_slot)
    return BufferPlan(schedule, buffers, buffer_of, node_slot, copies, value_bytes)


def take_free(free: list[BufferSlot], nbytes: int) -> BufferSlot | None:
    """Remove and return the best free buffer for `nbytes`: the smallest that fits, else the largest."""
    if not free:
        return None
    fitting = [slot for slot in free if slot.nbytes >= nbytes]
    slot = min(fitting, key=lambda s: s.nbytes) if fitting else max(free, key=lambda s: s.nbytes)
    free.remove(slot)
    return slot


def nbytes_of(graph: Graph, value: Value) -> int:
    """Bytes of a value's buffer: 4 per element, at least 4 (WebGPU has no empty bindings)."""
    node, index = value
    return max(4, graph[node].types[index].nbytes)


def state_copies(graph: Graph, node_slot: dict[int, int]) -> list[StateCopy]:
    """End-of-step copies for the updates whose value is not already in its leaf's buffer."""
    leaves = {**graph.leaves("param"), **graph.leaves("state")}
    copies = []
    for name, value in graph.updates.items():
        leaf = leaves[name]
        if node_slot[value] == node_slot[leaf.id]:
            continue
        source_node, _ = storage(graph, value)
        source = graph[source_node]
        if source.op in ("param", "state") and source.attr("name") in graph.updates:
            # By the end of the step that leaf's buffer holds its new value, not the old one asked for.
            raise NotImplementedError(
                f"update {name} <- %{value}: the old value of {source.attr('name')}, "
                "which the same step also updates, is not kept"
            )
        copies.append(StateCopy(node_slot[value], node_slot[leaf.id], nbytes_of(graph, (leaf.id, 0)), name, value))
    return copies
