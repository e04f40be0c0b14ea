"""The IR: SSA nodes with N-d shapes, dtypes and named attributes, grouped into a Graph.

A Graph is plain data. Nodes are appended in a topological order (every input id is smaller
than the node's id); `print(graph)` gives one line per node, like a jaxpr:

    %3 = matmul %0 %1 {transpose_b=True} : f32[32,128]    # model.py:12

A node has one result, or several (an attention's output and its row log-sum-exp, like JAX's
`multiple_results`): such a node's type is a tuple, and its results are read through `result`
projections, which are views (no kernel, no copy):

    %9 = attention %6 %7 %8 {causal=True, scale=0.125} : (f32[2,4,8,16], f32[2,4,8])
    %10 = result %9 {index=0} : f32[2,4,8,16]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

DTYPES = ("f32", "i32")


@dataclass(frozen=True)
class TensorType:
    """The static type of a value: its shape and its dtype ("f32" or "i32")."""

    shape: tuple[int, ...]
    dtype: str = "f32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {DTYPES}")
        if any((not isinstance(d, int)) or isinstance(d, bool) or d < 0 for d in self.shape):
            raise ValueError(f"shape {self.shape} must be a tuple of non-negative ints")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        count = 1
        for d in self.shape:
            count *= d
        return count

    @property
    def nbytes(self) -> int:
        return 4 * self.numel

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"


def freeze_attrs(attrs: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Attributes as a sorted tuple of (name, value), so that nodes stay hashable values."""
    frozen = []
    for key in sorted(attrs):
        value = attrs[key]
        if isinstance(value, list):
            value = tuple(value)
        frozen.append((key, value))
    return tuple(frozen)


def as_types(types: TensorType | tuple[TensorType, ...]) -> tuple[TensorType, ...]:
    """One result type, or the tuple of a node with several results, as a tuple."""
    return (types,) if isinstance(types, TensorType) else tuple(types)


@dataclass(frozen=True)
class Node:
    """One SSA value: `op` applied to earlier nodes `inputs`, with attributes and the user's source lines.

    `types` holds one type per result; almost every node has one, read as `node.type`.
    """

    id: int
    op: str
    inputs: tuple[int, ...]
    types: tuple[TensorType, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    sources: tuple[str, ...] = ()

    def attr(self, name: str, default: Any = None) -> Any:
        for key, value in self.attrs:
            if key == name:
                return value
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def results(self) -> int:
        return len(self.types)

    @property
    def type(self) -> TensorType:
        if len(self.types) != 1:
            raise TypeError(
                f"%{self.id} {self.op} has {len(self.types)} results; read one through a `result` projection"
            )
        return self.types[0]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def nbytes(self) -> int:
        """Bytes of all its results."""
        return sum(t.nbytes for t in self.types)


LEAF_OPS = ("input", "param", "state", "const")
PERSISTENT = ("input", "param", "state")  # leaves that every encoding and plan keeps


@dataclass
class Graph:
    """A whole computation: nodes in topological order, named outputs, and state updates.

    `outputs` maps a name ("loss", "y0"...) to the node whose value the caller reads.
    `updates` maps a persistent leaf's name (a `param` or `state` node) to the node holding its
    value after the step: this is how the optimizer update lives in the same graph.
    """

    nodes: list[Node] = field(default_factory=list)
    outputs: dict[str, int] = field(default_factory=dict)
    updates: dict[str, int] = field(default_factory=dict)
    _users: dict[int, list[int]] | None = field(default=None, repr=False, compare=False)

    def add(
        self,
        op: str,
        inputs: tuple[int, ...] | list[int],
        type: TensorType | tuple[TensorType, ...],
        attrs: dict[str, Any] | None = None,
        sources: tuple[str, ...] = (),
    ) -> int:
        """Append a node and return its id."""
        inputs = tuple(inputs)
        node_id = len(self.nodes)
        for i in inputs:
            if not 0 <= i < node_id:
                raise ValueError(f"node %{node_id} ({op}) refers to %{i}, which is not an earlier node")
        self.nodes.append(Node(node_id, op, inputs, as_types(type), freeze_attrs(attrs or {}), sources))
        self._users = None
        return node_id

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def leaves(self, op: str) -> dict[str, Node]:
        """The leaf nodes of one kind ("input", "param", "state") by name, in graph order."""
        return {n.attr("name"): n for n in self.nodes if n.op == op}

    def users(self) -> dict[int, list[int]]:
        """For each node id, the ids of the nodes that read it (in graph order); computed once per
        version of the graph (do not change the lists)."""
        if self._users is None or len(self._users) != len(self.nodes):
            result: dict[int, list[int]] = {n.id: [] for n in self.nodes}
            for n in self.nodes:
                for i in n.inputs:
                    result[i].append(n.id)
            self._users = result
        return self._users

    def roots(self) -> list[int]:
        """The node ids whose values leave the graph: outputs, then updates."""
        return list(self.outputs.values()) + list(self.updates.values())

    def live_ids(self) -> set[int]:
        """The nodes the outputs and updates depend on (dead code is everything else)."""
        live: set[int] = set()
        stack = self.roots()
        while stack:
            node_id = stack.pop()
            if node_id in live:
                continue
            live.add(node_id)
            stack.extend(self.nodes[node_id].inputs)
        return live

    def pruned(self) -> Graph:
        """A copy without dead code: live nodes and every input/param/state leaf, renumbered in order."""
        live = self.live_ids()
        keep = [n for n in self.nodes if n.id in live or n.op in PERSISTENT]
        new_id = {n.id: index for index, n in enumerate(keep)}
        nodes = [
            Node(new_id[n.id], n.op, tuple(new_id[i] for i in n.inputs), n.types, n.attrs, n.sources) for n in keep
        ]
        return Graph(
            nodes,
            {name: new_id[i] for name, i in self.outputs.items()},
            {name: new_id[i] for name, i in self.updates.items()},
        )

    def rebuilt(self, replace: Callable[[Node, Graph, dict[int, int]], int | None]) -> Graph:
        """A new graph of this one's nodes in order, each copied as it is unless `replace(node,
        new, new_id)` appends what stands for it to `new` and returns that node's id, or returns
        SKIP (nothing does, or `replace` put the ids of its replacements in `new_id` itself);
        new_id maps this graph's ids to the new one's, and outputs and updates follow it. The
        passes after extraction rewrite a plan with it."""
        new = Graph()
        new_id: dict[int, int] = {}
        for node in self.nodes:
            replaced = replace(node, new, new_id)
            if replaced is None:
                inputs = tuple(new_id[i] for i in node.inputs)
                new_id[node.id] = new.add(node.op, inputs, node.types, node.attr_dict, node.sources)
            elif replaced != SKIP:
                new_id[node.id] = replaced
        new.outputs = {name: new_id[i] for name, i in self.outputs.items()}
        new.updates = {name: new_id[i] for name, i in self.updates.items()}
        return new

    def __str__(self) -> str:
        return format_graph(self)


SKIP = -1  # `Graph.rebuilt`: no node of the new graph stands for this one (or replace mapped it)


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        return "(" + ",".join(format_value(v) for v in value) + ")"
    return str(value)


def format_types(types: tuple[TensorType, ...]) -> str:
    return str(types[0]) if len(types) == 1 else "(" + ", ".join(str(t) for t in types) + ")"


# op -> {attribute: default}, filled by the op declarations (ir/op.py): the IR text leaves out
# attributes at their defaults.
ATTR_DEFAULTS: dict[str, dict[str, Any]] = {}
NO_DEFAULT = object()


def format_node(node: Node) -> str:
    """One line of IR text: `%id = op %a %b {attrs} : type    # source` (attributes at their defaults left out)."""
    text = f"%{node.id} = {node.op}"
    if node.inputs:
        text += " " + " ".join(f"%{i}" for i in node.inputs)
    defaults = ATTR_DEFAULTS.get(node.op, {})
    shown = [(k, v) for k, v in node.attrs if defaults.get(k, NO_DEFAULT) != v]
    if shown:
        text += " {" + ", ".join(f"{k}={format_value(v)}" for k, v in shown) + "}"
    text += f" : {format_types(node.types)}"
    if node.sources:
        text = f"{text:<60}  # {', '.join(node.sources)}"
    return text


def format_graph(graph: Graph) -> str:
    lines = [format_node(n) for n in graph.nodes]
    for name, node_id in graph.outputs.items():
        lines.append(f"output {name} = %{node_id}")
    for name, node_id in graph.updates.items():
        lines.append(f"update {name} <- %{node_id}")
    return "\n".join(lines)
