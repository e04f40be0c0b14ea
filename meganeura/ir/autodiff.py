"""Reverse-mode autodiff on the IR: append the backward graph of a scalar to the same Graph.

Each op's vector-Jacobian product (VJP) is declared beside the op (`@OP.vjp` in `ir/ops/` and
`ir/functions.py`): a function that receives the upstream gradient and emits IR nodes for the
gradient of each operand through a `GradBuilder`. Every VJP multiplies by the upstream gradient
(the "grad_output contract"): a rule that assumes the gradient is 1 would be silently wrong in
the middle of a chain, which is where the tests check it.

A node with several results receives a tuple of gradients, one per result (None where nothing
flows back); the gradient of a `result` projection goes to its node's result.
"""

from __future__ import annotations

from meganeura.ir import ops  # noqa: F401  (registers every op and its VJP)
from meganeura.ir.graph import LEAF_OPS, Graph, TensorType
from meganeura.ir.op import checked_type, op_def, operand_types


class GradBuilder:
    """Emits backward nodes into a graph, tagged with the source lines of the forward node."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.sources: tuple[str, ...] = ()
        self.consts: dict[float, int] = {n.attr("value"): n.id for n in graph if n.op == "const"}

    def emit(self, op: str, inputs: list[int], **attrs) -> int:
        canonical, out_type = checked_type(op, operand_types(self.graph, inputs), attrs)
        return self.graph.add(op, inputs, out_type, canonical, self.sources)

    def result(self, node: int, index: int) -> int:
        """The projection of result `index` of a node with several results."""
        return self.emit("result", [node], index=index)

    def const(self, value: float) -> int:
        value = float(value)
        if value not in self.consts:
            self.consts[value] = self.graph.add("const", (), TensorType((), "f32"), {"value": value})
        return self.consts[value]

    def shape(self, node_id: int) -> tuple[int, ...]:
        return self.graph[node_id].shape

    def unbroadcast(self, grad: int, shape: tuple[int, ...]) -> int:
        """Sum `grad` over the axes that broadcasting added or stretched, down to `shape`."""
        grad_shape = self.shape(grad)
        if grad_shape == shape:
            return grad
        lead = len(grad_shape) - len(shape)
        axes = list(range(lead))
        axes += [lead + i for i, d in enumerate(shape) if d == 1 and grad_shape[lead + i] != 1]
        if axes:
            grad = self.emit("sum", [grad], axes=tuple(axes), keepdim=False)
        if self.shape(grad) != shape:
            grad = self.emit("reshape", [grad], shape=shape)
        return grad


def gradients(graph: Graph, loss: int, wrt: list[int]) -> dict[int, int | None]:
    """Append the backward pass of scalar `loss` to `graph`; return {node id in wrt: its grad node}.

    A node in `wrt` that the loss does not depend on maps to None.
    """
    if graph[loss].results != 1 or graph[loss].type.numel != 1:
        raise ValueError(f"the loss must be a single number, got {graph[loss].types}")
    builder = GradBuilder(graph)
    needed = nodes_between(graph, set(wrt), loss)
    seed = builder.const(1.0)
    if graph[loss].shape != ():
        seed = builder.emit("broadcast_to", [seed], shape=graph[loss].shape)
    grads: dict[int, list[int]] = {loss: [seed]}  # single-result nodes: the contributions
    result_grads: dict[int, dict[int, list[int]]] = {}  # several results: per result index
    for node_id in range(loss, -1, -1):
        if node_id not in needed or (node_id not in grads and node_id not in result_grads):
            continue
        node = graph[node_id]
        builder.sources = node.sources
        if node.results > 1:
            parts = result_grads[node_id]
            upstream = tuple(accumulate(builder, parts[i]) if i in parts else None for i in range(node.results))
        else:
            upstream = accumulate(builder, grads[node_id])
            grads[node_id] = [upstream]
        if node.op in LEAF_OPS:
            continue
        if node.op == "result":
            result_grads.setdefault(node.inputs[0], {}).setdefault(node.attr("index"), []).append(upstream)
            continue
        rule = op_def(node.op).vjp_rule
        if rule is None:
            raise NotImplementedError(f"autodiff: no gradient rule for op {node.op!r} ({', '.join(node.sources)})")
        for input_id, input_grad in zip(node.inputs, rule(builder, node, upstream), strict=True):
            if input_grad is not None and input_id in needed:
                grads.setdefault(input_id, []).append(input_grad)
    return {w: (grads[w][0] if w in grads else None) for w in wrt}


def accumulate(builder: GradBuilder, parts: list[int]) -> int:
    """The sum of the gradient contributions that reach one node (fan-in), added pairwise: a
    balanced tree of neighbours, log₂(n) adds deep. The contributions come in graph order, so the
    slices of one tensor (the time steps of an unrolled recurrence, the parts of a split) are
    neighbours, and the e-graph joins their slice_grads in log₂(n) iterations (a chain took n,
    past the saturation budget for a 64-step unroll)."""
    while len(parts) > 1:
        pairs = range(0, len(parts) - 1, 2)
        parts = [builder.emit("add", [parts[i], parts[i + 1]]) for i in pairs] + parts[len(parts) - len(parts) % 2 :]
    return parts[0]


def nodes_between(graph: Graph, sources: set[int], target: int) -> set[int]:
    """Nodes on some path from a node in `sources` to `target`: the only ones that need gradients."""
    reaches_source: set[int] = set()
    for node in graph:
        if node.id > target:
            break
        if node.id in sources or any(i in reaches_source for i in node.inputs):
            reaches_source.add(node.id)
    ancestors: set[int] = set()
    stack = [target]
    while stack:
        node_id = stack.pop()
        if node_id in ancestors:
            continue
        ancestors.add(node_id)
        stack.extend(graph[node_id].inputs)
    return reaches_source & ancestors
