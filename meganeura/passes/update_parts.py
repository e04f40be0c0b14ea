"""Optimizer updates that read their gradient's parts: `updates_reading_parts(graph)`.

An update whose gradient is the sum of a split product's partials (a weight's gradient in parts of
K) or of a two-level column reduction's partial rows (a bias's or a norm weight's gradient) reads
the parts and adds them as it reads its gradient (ir/ops/optimizer.py); the sum's dispatch goes.
A pass, not a rule: the update and the sum switch together, and extraction moves one e-class at a
time.
"""

from __future__ import annotations

from meganeura.codegen.optimizer import GRADIENT, UPDATE_FIELDS
from meganeura.ir.graph import SKIP, Graph, Node

# A gradient summed from at most this many parts is read as its parts by the update
# (`updates_reading_parts`): its kernel unrolls one read a part.
MAX_PARTS = 32


def updates_reading_parts(graph: Graph) -> Graph:
    """`graph` with each fused update (sgd_update, adam_update, …) whose gradient is a `sum` over the
    first axis of at most MAX_PARTS parts, read by nothing else, reading the parts instead: the
    update adds them as it reads its gradient (ir/ops/optimizer.py), and the sum's dispatch goes.
    Those sums complete split products' partials (a weight's gradient in parts of K) and
    two-level column reductions (a bias's or a norm weight's gradient in 32 partial rows)."""
    users, roots = graph.users(), set(graph.roots())
    parts_of: dict[int, int] = {}  # the sum → its parts
    for node in graph:
        if node.op not in UPDATE_FIELDS:
            continue
        total = graph[node.inputs[GRADIENT]]
        parts = graph[total.inputs[0]] if total.op == "sum" else None
        if (
            parts is not None
            and tuple(total.attr("axes")) == (0,)
            and not total.attr("keepdim", False)
            and len(parts.shape) == len(total.shape) + 1
            and parts.shape[0] <= MAX_PARTS
            and users[total.id] == [node.id]
            and total.id not in roots
        ):
            parts_of[total.id] = parts.id
    if not parts_of:
        return graph

    def replace(node: Node, new: Graph, new_id: dict[int, int]) -> int | None:
        if node.id in parts_of:  # read by its update alone, which now reads the parts
            new_id[node.id] = new_id[parts_of[node.id]]
            return SKIP
        return None

    return graph.rebuilt(replace)
