"""DAG-aware extraction over the serialized e-graph: one e-node chosen per needed e-class.

The e-graph is read from `egraph._serialize(split_primitive_outputs=False).to_json()` into an
`EGraphView` (Term e-classes, their e-nodes with child e-classes and primitive arguments, the IR
tags of each class). Extraction then minimises the DAG cost of the plan: the sum of the node
costs of the distinct e-classes the roots reach, so a value used twice is paid once.

Two steps:
1. greedy bottom-up DAG extraction: each e-class keeps its cheapest e-node, priced as the node's
   own cost plus the costs of the distinct classes in its children's sub-DAGs (shared sub-DAGs
   counted once), iterated to a fixed point;
2. local improvement: try every alternative of every reached class against the exact cost of
   the whole plan, and keep a switch when it lowers it. It runs from the greedy plan and from
   the input graph's own plan (`starts`); the cheaper result wins. This is what keeps a matmul
   unfused when its result is needed anyway elsewhere: greedy step 1 sees only the local
   sub-DAG and would pay the matmul twice, and from the greedy plan two classes would have to
   switch back at once.

Every choice is checked to be acyclic and complete for the classes the roots need.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from egglog import EGraph

REF_OP = "Term.ref"
TERM_SORT_SUFFIX = ".Term"
MAX_IMPROVEMENT_PASSES = 8


@dataclass(frozen=True)
class ENode:
    """One e-node: its constructor (`Term.matmul`…), child e-classes and primitive arguments."""

    id: str
    op: str
    eclass: str
    children: tuple[str, ...]  # Term e-classes, in argument order
    primitives: tuple[object, ...]  # primitive argument values (str, bool, int), in argument order


@dataclass
class EGraphView:
    """The Term part of a serialized e-graph: e-nodes per e-class and the IR tags of each class."""

    nodes: dict[str, list[ENode]] = field(default_factory=dict)  # e-class -> extractable e-nodes
    refs: dict[str, list[str]] = field(default_factory=dict)  # e-class -> IR tags ("n5") in it
    class_of_ref: dict[str, str] = field(default_factory=dict)  # IR tag -> e-class

    @property
    def enode_count(self) -> int:
        return sum(len(nodes) for nodes in self.nodes.values())

    @property
    def eclass_count(self) -> int:
        return len(set(self.nodes) | set(self.refs))


def primitive_value(op: str) -> object:
    """The Python value of a serialized primitive node's op text (`"relu"`, `true`, `3`)."""
    return json.loads(op)


def read_egraph(egraph: EGraph) -> EGraphView:
    """The Term e-classes of an e-graph, read from its serialized JSON."""
    data = json.loads(egraph._serialize(split_primitive_outputs=False).to_json())
    raw = data["nodes"]
    view = EGraphView()
    for node_id, node in raw.items():
        sort = data["class_data"].get(node["eclass"], {}).get("type", "")
        if not sort.endswith(TERM_SORT_SUFFIX):
            continue  # primitives, and the rank/dim facts
        children, primitives = [], []
        for child in node["children"]:
            child_node = raw[child]
            if data["class_data"].get(child_node["eclass"], {}).get("type", "").endswith(TERM_SORT_SUFFIX):
                children.append(child_node["eclass"])
            else:
                primitives.append(primitive_value(child_node["op"]))
        eclass = node["eclass"]
        if node["op"] == REF_OP:
            tag = str(primitives[0])
            view.refs.setdefault(eclass, []).append(tag)
            view.class_of_ref[tag] = eclass
            continue
        view.nodes.setdefault(eclass, []).append(ENode(node_id, node["op"], eclass, tuple(children), tuple(primitives)))
    return view


NodeCost = Callable[[ENode], float]


def reachable_classes(choice: dict[str, ENode], roots: Iterable[str]) -> set[str] | None:
    """The e-classes a choice needs to compute the roots, or None if one of them has no choice."""
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        eclass = stack.pop()
        if eclass in seen:
            continue
        node = choice.get(eclass)
        if node is None:
            return None
        seen.add(eclass)
        stack.extend(node.children)
    return seen


def is_acyclic(choice: dict[str, ENode], classes: set[str]) -> bool:
    """Whether the chosen e-nodes of `classes` form a DAG (Kahn's algorithm)."""
    pending = {eclass: len(set(choice[eclass].children)) for eclass in classes}
    parents: dict[str, list[str]] = {}
    for eclass in classes:
        for child in set(choice[eclass].children):
            parents.setdefault(child, []).append(eclass)
    ready = [eclass for eclass, count in pending.items() if count == 0]
    done = 0
    while ready:
        eclass = ready.pop()
        done += 1
        for parent in parents.get(eclass, ()):
            pending[parent] -= 1
            if pending[parent] == 0:
                ready.append(parent)
    return done == len(classes)


def plan_cost(
    choice: dict[str, ENode], roots: Iterable[str], node_cost: NodeCost, check_cycles: bool = True
) -> float | None:
    """The DAG cost of a choice (each reached class paid once), or None if it has a gap or a cycle."""
    classes = reachable_classes(choice, roots)
    if classes is None or (check_cycles and not is_acyclic(choice, classes)):
        return None
    return sum(node_cost(choice[eclass]) for eclass in classes)


def greedy_dag_choice(view: EGraphView, order: list[str], node_cost: NodeCost) -> dict[str, ENode]:
    """Bottom-up greedy DAG extraction: per class, the node whose sub-DAG (shared parts once) is cheapest."""
    best: dict[str, tuple[float, dict[str, float], ENode]] = {}
    changed = True
    while changed:
        changed = False
        for eclass in order:
            for node in view.nodes.get(eclass, ()):
                if any(child not in best for child in node.children):
                    continue
                subdag: dict[str, float] = {}
                for child in node.children:
                    subdag.update(best[child][1])
                if eclass in subdag:
                    continue  # this node reaches its own class: a cycle
                subdag[eclass] = node_cost(node)
                total = sum(subdag.values())
                current = best.get(eclass)
                if current is None or total < current[0]:
                    best[eclass] = (total, subdag, node)
                    changed = True
    return {eclass: entry[2] for eclass, entry in best.items()}


def improve_choice(
    view: EGraphView, choice: dict[str, ENode], roots: list[str], node_cost: NodeCost
) -> dict[str, ENode]:
    """Switch single classes to other alternatives while the whole plan's DAG cost drops."""
    choice = dict(choice)
    cost = plan_cost(choice, roots, node_cost)
    if cost is None:
        raise RuntimeError("extraction: a starting choice is cyclic or incomplete")
    alternatives = {eclass: nodes for eclass, nodes in view.nodes.items() if len(nodes) > 1}
    for _ in range(MAX_IMPROVEMENT_PASSES):
        improved = False
        # Switching a class the plan does not reach cannot change its cost.
        for eclass in sorted((reachable_classes(choice, roots) or set()) & alternatives.keys()):
            for node in alternatives[eclass]:
                if node is choice.get(eclass):
                    continue
                trial = {**choice, eclass: node}
                # Screen on cost first; check cycles only for a switch worth taking.
                trial_cost = plan_cost(trial, roots, node_cost, check_cycles=False)
                if trial_cost is not None and trial_cost < cost and plan_cost(trial, roots, node_cost) is not None:
                    choice, cost, improved = trial, trial_cost, True
        if not improved:
            break
    return choice


def extract(
    view: EGraphView,
    roots: list[str],
    order: list[str],
    node_cost: NodeCost,
    starts: Iterable[dict[str, ENode]] = (),
) -> dict[str, ENode]:
    """The cheapest plan found for `roots`: one e-node per needed e-class, acyclic and complete.

    `order` lists the e-classes bottom-up (children before parents, e.g. IR order): greedy
    extraction converges in one pass when it is followed. Each of `starts` (e.g. the input
    graph's own plan) is improved too and competes with the greedy plan: single switches can
    get stuck where two classes must change together (a fused add whose matmul is needed
    elsewhere must go back to add(matmul) before its relu can), and the input plan has no such
    trap for them.
    """
    greedy = greedy_dag_choice(view, order, node_cost)
    missing = [root for root in roots if root not in greedy]
    if missing:
        raise RuntimeError(f"extraction: no acyclic term for e-classes {missing}")
    candidates = [improve_choice(view, start, roots, node_cost) for start in (greedy, *starts)]
    choice = min(candidates, key=lambda candidate: plan_cost(candidate, roots, node_cost))
    needed = reachable_classes(choice, roots)
    assert needed is not None and is_acyclic(choice, needed)
    return {eclass: choice[eclass] for eclass in needed}


def choice_from_signatures(
    view: EGraphView, signatures: dict[str, tuple[str, tuple[str, ...], tuple]]
) -> dict[str, ENode]:
    """The choice picking, in each listed e-class, the e-node with the given (op, child classes, primitives)."""
    choice = {}
    for eclass, (op, children, primitives) in signatures.items():
        for node in view.nodes.get(eclass, ()):
            if node.op == op and node.children == children and node.primitives == primitives:
                choice[eclass] = node
                break
        else:
            raise RuntimeError(f"extraction: e-class {eclass} lost its input e-node {op}{children}")
    return choice
