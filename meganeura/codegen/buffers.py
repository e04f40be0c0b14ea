"""The buffer plan: the order kernels run in, and which device buffer holds each IR value.

- Schedule: kernels in a topological order of their data dependencies (a kernel that writes
  several values, `KernelSpec.also_writes`, produces them all), plus anti-dependency
  edges: every kernel that reads a param/state leaf runs before the kernel that updates that
  leaf in place (it would otherwise read the new value). Ties keep graph order.
- Storage: inputs, params, states and constants that a kernel binds get one buffer each, for
  good. Graph outputs and update values keep theirs to the end of the step. Every other value
  is dead after its last reader in the schedule, and its buffer goes back to a free pool that
  later kernels' outputs draw from (a buffer grows to its largest tenant). A kernel's output
  is placed before its inputs are released, so no kernel writes a buffer it also reads.
- Aliases: a reshape is a view of its input's buffer; an in-place update lives in the buffer
  of the leaf it replaces.
- End of step: an update whose value is not already in its leaf's buffer (the Adam step count
  `add`, or an update that could not run in place) is copied there after the compute pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.lower import alias_root
from meganeura.ir.graph import Graph

LEAF_ROLES = ("input", "param", "state", "const")


@dataclass
class BufferSlot:
    """One device buffer: its size, what it is for, and the IR values that live in it over the step."""

    index: int
    nbytes: int
    role: str  # "input", "param", "state", "const", "output" (kept to the end of the step) or "temp"
    name: str = ""  # the leaf's or output's name
    values: list[int] = field(default_factory=list)


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
    """Kernels in run order, buffers, the buffer of every value, and the end-of-step copies."""

    schedule: list[KernelSpec]
    buffers: list[BufferSlot]
    buffer_of: dict[int, int]
    copies: list[StateCopy]
    value_bytes: dict[int, int]  # bytes of every value that would own a buffer without reuse

    @property
    def total_bytes(self) -> int:
        return sum(slot.nbytes for slot in self.buffers)

    @property
    def bytes_without_reuse(self) -> int:
        return sum(self.value_bytes.values())

    def leaf_buffers(self, role: str) -> dict[str, int]:
        """Buffer index by leaf name, for one role ("input", "param", "state")."""
        return {slot.name: slot.index for slot in self.buffers if slot.role == role}

    def __str__(self) -> str:
        head = (
            f"BufferPlan: {len(self.buffers)} buffers for {len(self.value_bytes)} values, "
            f"{format_bytes(self.total_bytes)} ({format_bytes(self.bytes_without_reuse)} without reuse); "
            f"{len(self.schedule)} kernels, {len(self.copies)} end-of-step copies"
        )
        lines = [head]
        for slot in self.buffers:
            what = f"{slot.role} {slot.name}".strip()
            values = " ".join(f"%{v}" for v in slot.values)
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


def storage_root(graph: Graph, kernels_by_node: dict[int, KernelSpec], node_id: int) -> int:
    """The value that owns `node_id`'s buffer: through reshapes, and from in-place results to their leaf."""
    node_id = alias_root(graph, node_id)
    spec = kernels_by_node.get(node_id)
    while spec is not None and spec.inplace_input is not None:
        node_id = alias_root(graph, spec.inplace_input)
        spec = kernels_by_node.get(node_id)
    return node_id


def read_values(spec: KernelSpec) -> list[int]:
    """The values a kernel reads (its read bindings, and the old value of an in-place update)."""
    values = [b.value for b in spec.bindings if b.access == "read"]
    return values + ([spec.inplace_input] if spec.inplace_input is not None else [])


def schedule_kernels(graph: Graph, kernels: list[KernelSpec]) -> list[KernelSpec]:
    """Kernels in dependency order, readers of a leaf before its in-place update; ties in graph order."""
    by_node = {spec.node: spec for spec in kernels}
    producer_of = {value: spec.node for spec in kernels for value in spec.written}
    order = nx.DiGraph()
    order.add_nodes_from(by_node)
    updaters = {alias_root(graph, s.inplace_input): s.node for s in kernels if s.inplace_input is not None}
    for spec in kernels:
        for value in read_values(spec):
            producer = alias_root(graph, value)
            if producer in producer_of:
                order.add_edge(producer_of[producer], spec.node)
            updater = updaters.get(producer)
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
    buffer_of: dict[int, int] = {}
    value_bytes: dict[int, int] = {}

    def new_slot(nbytes: int, role: str, name: str = "") -> BufferSlot:
        buffers.append(BufferSlot(len(buffers), nbytes, role, name))
        return buffers[-1]

    def place(value: int, slot: BufferSlot) -> None:
        buffer_of[value] = slot.index
        slot.values.append(value)
        slot.nbytes = max(slot.nbytes, nbytes_of(graph, value))

    # Leaves: every input, param and state, and the constants that something binds or returns.
    bound = {b.value for spec in kernels for b in spec.bindings} | set(graph.roots())
    bound_roots = {alias_root(graph, v) for v in bound}
    for node in graph:
        if node.op in ("input", "param", "state") or (node.op == "const" and node.id in bound_roots):
            place(node.id, new_slot(nbytes_of(graph, node.id), node.op, node.attr("name") or ""))
            value_bytes[node.id] = nbytes_of(graph, node.id)

    pinned = {storage_root(graph, by_node, v) for v in graph.roots()} | set(buffer_of)
    out_names = {}
    for name, value in list(graph.outputs.items()) + list(graph.updates.items()):
        out_names.setdefault(storage_root(graph, by_node, value), name)
    last_use: dict[int, int] = {}
    for position, spec in enumerate(schedule):
        for value in read_values(spec):
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
        released = {storage_root(graph, by_node, v) for v in read_values(spec)} | roots
        for value in released:
            if value not in pinned and last_use.get(value, position) == position:
                free.append(buffers[buffer_of[value]])

    for node in graph:  # reshapes share their input's buffer
        if node.op == "reshape" and alias_root(graph, node.id) in buffer_of:
            place(node.id, buffers[buffer_of[alias_root(graph, node.id)]])

    copies = state_copies(graph, buffer_of)
    return BufferPlan(schedule, buffers, buffer_of, copies, value_bytes)


def take_free(free: list[BufferSlot], nbytes: int) -> BufferSlot | None:
    """Remove and return the best free buffer for `nbytes`: the smallest that fits, else the largest."""
    if not free:
        return None
    fitting = [slot for slot in free if slot.nbytes >= nbytes]
    slot = min(fitting, key=lambda s: s.nbytes) if fitting else max(free, key=lambda s: s.nbytes)
    free.remove(slot)
    return slot


def nbytes_of(graph: Graph, value: int) -> int:
    """Bytes of a value's buffer: 4 per element, at least 4 (WebGPU has no empty bindings)."""
    return max(4, graph[value].type.nbytes)


def state_copies(graph: Graph, buffer_of: dict[int, int]) -> list[StateCopy]:
    """End-of-step copies for the updates whose value is not already in its leaf's buffer."""
    leaves = {**graph.leaves("param"), **graph.leaves("state")}
    copies = []
    for name, value in graph.updates.items():
        leaf = leaves[name]
        if buffer_of[value] == buffer_of[leaf.id]:
            continue
        source = graph[alias_root(graph, value)]
        if source.op in ("param", "state") and source.attr("name") in graph.updates:
            # By the end of the step that leaf's buffer holds its new value, not the old one asked for.
            raise NotImplementedError(
                f"update {name} <- %{value}: the old value of {source.attr('name')}, "
                "which the same step also updates, is not kept"
            )
        copies.append(StateCopy(buffer_of[value], buffer_of[leaf.id], nbytes_of(graph, leaf.id), name, value))
    return copies
