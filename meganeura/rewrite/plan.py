"""The Plan: what extraction chose, as an immutable value that decode, attribution and the report read.

For every e-class the plan materialises (computes into a buffer), a `PlanEntry` holds the chosen
e-node, each of its kernel bodies expanded into the expression tree the kernel computes, the
e-classes it reads (distinct, in first-use order), the Pw e-nodes the bodies are computed through,
the producers it recomputes inline, the plain e-nodes a kernel form stands for (the Matmul whose
product a fused matmul kernel computes, with its operands and transposes), and its cost
(`cost.price`, the one pricing function).
E-classes in inline mode are not materialised: the kernels reading them recompute them
(`Plan.inline`). The plan also carries what maps it back to the IR: the input graph, the IR
nodes of each e-class and their types, each e-class's rank (a topological order), and the rules
that created or merged each e-node (`provenance`, recorded by the rules themselves).

Expression trees (`PwTree`): ("load", e-class) | ("lit", value) | ("acc",) | ("r",) |
("call", fn, tree, …).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meganeura.ir.graph import Graph, TensorType
from meganeura.rewrite.cost import Cost
from meganeura.rewrite.sorts import ENode
from meganeura.target import GENERIC, Target

PwTree = tuple


@dataclass(frozen=True)
class PlanEntry:
    """One materialised e-class: how the plan computes it."""

    eclass: int
    node: ENode  # the chosen e-node
    bodies: tuple[PwTree, ...]  # the expanded Pw fields of the e-node, in field order
    reads: tuple[int, ...]  # the Term e-classes it reads, distinct, in first-use order
    cost: Cost
    through: tuple[ENode, ...] = ()  # the Pw e-nodes its bodies are computed through
    inlined: tuple[int, ...] = ()  # the inline-mode e-classes it recomputes instead of reading
    plain: tuple[ENode, ...] = ()  # the plain product or reduction a kernel form computes (Matmul, Reduce)
    literals: tuple[int, ...] = ()  # the Pw e-classes its bodies read as literals


@dataclass(frozen=True)
class Provenance:
    """Which rules created an e-node (it appears on the new side of their `union`), and which merged
    it with another term (it is the rewritten side), keyed by (constructor, children, primitives)."""

    created: Mapping[tuple, frozenset[str]]
    merged: Mapping[tuple, frozenset[str]]

    def creators(self, node: ENode) -> frozenset[str]:
        return self.created.get(node.key, frozenset())

    def mergers(self, node: ENode) -> frozenset[str]:
        return self.merged.get(node.key, frozenset())


@dataclass(frozen=True)
class Plan:
    """The chosen plan of one e-graph (see the module docstring)."""

    entries: Mapping[int, PlanEntry]  # materialised e-classes, in rank order (topological)
    inline: Mapping[int, ENode]  # e-classes in inline mode that a materialised kernel recomputes, and their kernel
    roots: tuple[int, ...]  # the e-classes the graph must compute: outputs, updates, leaves
    cost: Cost  # the sum of the entries' costs
    source: Graph  # the graph that was encoded
    class_of_ir: Mapping[int, int]  # IR node id -> its e-class
    ir_ids: Mapping[int, tuple[int, ...]]  # e-class -> the IR nodes in it, in graph order
    types: Mapping[int, tuple[TensorType, ...]]  # e-class -> its result types
    rank: Mapping[int, int]  # e-class -> the smallest IR node id in it
    provenance: Provenance
    own: Mapping[int, ENode | None]  # IR node id -> the e-node of its own term (None if none is kept)
    created_in: Mapping[int, tuple[ENode, ...]]  # Term e-class -> its e-nodes that some rule created
    merges_in: Mapping[int, tuple[tuple[tuple, frozenset[str]], ...]]  # Pw e-class -> (e-node key, rules
    # that merged that e-node into the class): a producer's load merged with its body, a constant's with a literal
    target: Target = GENERIC  # the adapter it was priced for

    def type(self, eclass: int) -> TensorType:
        (t,) = self.types[eclass]
        return t
