"""Extracted choice → a new IR Graph.

Each needed e-class becomes one IR node, built from its chosen e-node; nodes are numbered in a
topological order that follows the original graph's order as closely as possible. Outputs and
updates are remapped by name; every input/param/state leaf is kept with its attributes, used or
not. A new node's `sources` are the user source lines of every original IR node it covers: the
nodes of its own e-class, plus the nodes the plan no longer computes whose values flowed into it
(the matmul and the add folded into a fused matmul).
"""

from __future__ import annotations

import heapq
from typing import Any

from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.ops import infer_type
from meganeura.rewrite.encode import Encoding, ref_name
from meganeura.rewrite.extract import EGraphView, ENode

TYPED_OPS = {
    "Term.matmul": "matmul",
    "Term.fused_matmul": "fused_matmul",
    "Term.add": "add",
    "Term.relu": "relu",
    "Term.sigmoid": "sigmoid",
    "Term.tanh": "tanh",
}
GENERIC_PREFIX = "Term.op"
NO_BIAS_OP = "Term.no_bias"


def ir_ids_per_class(encoding: Encoding, view: EGraphView) -> dict[str, list[int]]:
    """For each e-class, the original IR node ids tagged into it, in graph order."""
    result: dict[str, list[int]] = {}
    for node_id in encoding.encoded_ids:
        result.setdefault(view.class_of_ref[ref_name(node_id)], []).append(node_id)
    return result


def class_order_key(ir_ids: dict[str, list[int]]):
    """A sort key placing e-classes in original graph order (classes without IR nodes first)."""
    return lambda eclass: (ir_ids[eclass][0] if eclass in ir_ids else -1, eclass)


def real_children(node: ENode, choice: dict[str, ENode]) -> list[str]:
    """The node's child e-classes that become IR inputs (the `no_bias` placeholder does not)."""
    return [child for child in node.children if child in choice and choice[child].op != NO_BIAS_OP]


def topological_classes(choice: dict[str, ENode], order_key) -> list[str]:
    """The chosen e-classes, children first, ties broken by the original graph order."""
    pending = {eclass: len(set(real_children(node, choice))) for eclass, node in choice.items()}
    parents: dict[str, list[str]] = {}
    for eclass, node in choice.items():
        for child in set(real_children(node, choice)):
            parents.setdefault(child, []).append(eclass)
    ready = [(order_key(eclass), eclass) for eclass, count in pending.items() if count == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, eclass = heapq.heappop(ready)
        ordered.append(eclass)
        for parent in parents.get(eclass, ()):
            pending[parent] -= 1
            if pending[parent] == 0:
                heapq.heappush(ready, (order_key(parent), parent))
    if len(ordered) != len(choice):
        raise RuntimeError("decode: the extracted choice has a cycle")
    return ordered


def ir_op(node: ENode) -> str:
    """The IR op an e-node stands for ("" for the `no_bias` placeholder)."""
    if node.op.startswith(GENERIC_PREFIX):
        return str(node.primitives[0])
    return TYPED_OPS.get(node.op, "")


def op_and_attrs(node: ENode, encoding: Encoding) -> tuple[str, dict[str, Any]]:
    """The IR op and attributes of a chosen e-node."""
    op = ir_op(node)
    if node.op.startswith(GENERIC_PREFIX):
        return op, dict(encoding.attrs_by_text[str(node.primitives[1])])
    if op == "matmul":
        return op, {"transpose_a": node.primitives[0], "transpose_b": node.primitives[1]}
    if op == "fused_matmul":
        transpose_a, transpose_b, activation = node.primitives
        return op, {"transpose_a": transpose_a, "transpose_b": transpose_b, "activation": activation}
    return op, {}


def covered_sources(
    graph: Graph, encoding: Encoding, class_of_ir: dict[int, str], kept: set[str]
) -> dict[str, list[str]]:
    """For each kept e-class, the source lines of the original IR nodes it covers, in graph order."""
    users = graph.users()
    covered: dict[str, dict[int, None]] = {eclass: {} for eclass in kept}
    for node_id in encoding.encoded_ids:
        for eclass in absorbing_classes(node_id, users, class_of_ir, kept):
            covered[eclass][node_id] = None
    return {
        eclass: list(dict.fromkeys(line for i in sorted(ids) for line in graph[i].sources))
        for eclass, ids in covered.items()
    }


def absorbing_classes(node_id: int, users: dict[int, list[int]], class_of_ir: dict[int, str], kept: set[str]):
    """The kept e-classes that compute IR node `node_id`: its own, or else the nearest kept users'."""
    found: set[str] = set()
    seen: set[int] = set()
    stack = [node_id]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        eclass = class_of_ir.get(current)
        if eclass in kept:
            found.add(eclass)
        elif eclass is not None:
            stack.extend(users[current])
    return found


def decode(encoding: Encoding, view: EGraphView, choice: dict[str, ENode]) -> Graph:
    """The IR graph of an extracted choice (which must cover the outputs, updates and leaves)."""
    graph = encoding.graph
    class_of_ir = {i: view.class_of_ref[ref_name(i)] for i in encoding.encoded_ids}
    ir_ids = ir_ids_per_class(encoding, view)
    kept = {eclass for eclass, node in choice.items() if node.op != NO_BIAS_OP}
    sources = covered_sources(graph, encoding, class_of_ir, kept)
    result = Graph()
    new_id: dict[str, int] = {}
    for eclass in topological_classes({e: n for e, n in choice.items() if e in kept}, class_order_key(ir_ids)):
        node = choice[eclass]
        op, attrs = op_and_attrs(node, encoding)
        inputs = [new_id[child] for child in real_children(node, choice)]
        operand_types = [result[i].type for i in inputs]
        if eclass in ir_ids:
            value_type = graph[ir_ids[eclass][0]].type
            check_type(op, operand_types, attrs, value_type)
        else:  # a class that only a rule created (no IR node of the input computes it)
            value_type = infer_type(op, operand_types, attrs)
        new_id[eclass] = result.add(op, inputs, value_type, attrs, tuple(sources[eclass]))
    result.outputs = {name: new_id[class_of_ir[i]] for name, i in graph.outputs.items()}
    result.updates = {name: new_id[class_of_ir[i]] for name, i in graph.updates.items()}
    return result


def check_type(op: str, operands: list[TensorType], attrs: dict[str, Any], expected: TensorType) -> None:
    """Fail loudly if a rewritten node's type differs from its e-class's original IR type."""
    if op in ("input", "param", "state"):
        return
    actual = infer_type(op, operands, attrs)
    if actual != expected:
        raise RuntimeError(f"decode: {op} gives {actual} where the e-class holds {expected} (a rule is unsound)")
