"""What the chosen plan owes to each rule: its uses, and the cost it saves, read off the plan's
provenance (which rules created or merged each e-node, recorded by the rules themselves, see
`rules.py`) — no rule is named here.

A rule's uses in a plan:
- the kernels of the plan it contributed an e-node to (once per kernel; a view of a value the
  same rule made, the projection of a recognised attention's output, adds none): the chosen e-node, the
  elementwise calls its bodies are computed through (loads, literals, `$acc`, `$r` are the shared
  leaves of every body, not uses), and the plain product
  or reduction a kernel form computes (`PlanEntry.plain`: the transposes a rule folded into a
  matmul's operands count where the matmul kernel also took an epilogue);
- each Pw e-class a kernel's bodies go through (computed through a call, or read as a literal)
  into which the rule merged another e-node: a producer's load merged with its body (the
  inlining rule: one use per producer recomputed), a constant's load merged with a literal;
- the IR nodes the plan no longer computes because the rule merged their term with another
  (x·1 with x, a reshape back to its source), when the plan's e-node for that class was not
  created by the same rule (a lift rule merges an op with its own kernel: one use, not two).

Savings: the input graph's cost minus the plan's, split exactly between the rules, per e-class.
An e-class the plan computes saves its input cost (its first IR node's) minus its plan cost,
credited to the rule that created the chosen e-node (the first in report order, where several
did). One it no longer computes saves its whole input cost, credited to: the inlining rule if a
kernel recomputes it; the rule that merged its IR node with a term that needs no kernel (a
folded constant); the rule that made the plain product of the nearest kernel absorbing it, when
that product reads what the IR node read (a transpose folded into a matmul's operand); else the
rule that made that kernel's chosen e-node (the fused matmul an add was folded into, the
cross-entropy kernel that replaced log_softmax and pick). A further IR node merged into an
e-class saves its whole cost, credited to the rule that merged it. What no rule explains (an
e-class whose own e-node is kept but reads something cheaper, common subexpressions that
hash-consing merged) is the `e-graph` share. A family saves what its rules save.
"""

from __future__ import annotations

from collections import Counter

from meganeura.ir.op import op_def
from meganeura.rewrite.cost import Cost, node_cost
from meganeura.rewrite.decode import Decoded
from meganeura.rewrite.plan import Plan
from meganeura.rewrite.report import UNATTRIBUTED
from meganeura.rewrite.schema import TERM_CONSTRUCTORS, op_of
from meganeura.rewrite.sorts import ENode

PW_CALLS = ("PUnary", "PBinary", "PTernary")
OP_CONSTRUCTOR_NAMES = {name for name, c in TERM_CONSTRUCTORS.items() if c.op is not None or c.tag is not None}


def rule_uses(plan: Plan) -> Counter:
    """Per rule name, how many of the plan's e-nodes, inlinings and removed IR nodes it accounts for."""
    prov = plan.provenance
    uses: Counter = Counter()
    credited_at: dict[int, set[str]] = {}
    for eclass, entry in plan.entries.items():
        credited: set[str] = set()
        for node in (entry.node, *entry.plain, *(n for n in entry.through if n.op in PW_CALLS)):
            credited |= prov.creators(node)
        credited_at[eclass] = credited
        if not op_free(entry.node) or not any(credited & credited_at.get(c, set()) for c in entry.reads):
            uses.update(credited)  # a view of what the same rule made (an attention's result) is no extra use
        for pw_class in dict.fromkeys((*(n.eclass for n in entry.through), *entry.literals)):
            for key, rules in plan.merges_in.get(pw_class, ()):
                if key != ("Load", (entry.eclass,), ()):  # a kernel's own body is the load of its result
                    uses.update(rules)
    for _, rules in merged_away(plan):
        uses.update(rules)
    return uses


def chosen_nodes(plan: Plan, eclass: int):
    """The e-node the plan computes an e-class with (and the plain forms it stands for), or ()."""
    if eclass in plan.entries:
        entry = plan.entries[eclass]
        return (entry.node, *entry.plain)
    return (plan.inline[eclass],) if eclass in plan.inline else ()


def merged_away(plan: Plan):
    """(IR node id, rules) for the IR nodes whose own e-node the plan does not use, with the rules
    that merged that e-node away (and did not create the plan's e-node of its class)."""
    prov = plan.provenance
    for eclass, ids in plan.ir_ids.items():
        chosen = chosen_nodes(plan, eclass)
        creators = frozenset().union(*(prov.creators(node) for node in chosen))
        for node_id in ids:
            own = plan.own.get(node_id)
            if own is None or own in chosen:
                continue
            rules = prov.mergers(own) - creators
            if rules:
                yield node_id, rules


def first_rule(rules, order: dict[str, int]) -> str:
    return min(rules, key=lambda r: order.get(r, len(order))) if rules else UNATTRIBUTED


def rule_savings(plan: Plan, decoded: Decoded, order: dict[str, int]) -> dict[str, Cost]:
    """Per rule name (and UNATTRIBUTED), what the plan saves thanks to it; the parts add up to
    cost(input graph) − cost(plan) exactly. `order`: rule name → its place in the report."""
    graph = plan.source
    prov = plan.provenance
    saved: dict[str, Cost] = {}

    def credit(rule: str, amount: Cost) -> None:
        saved[rule] = saved.get(rule, Cost()) + amount

    absorbing: dict[int, list[int]] = {}
    for eclass, covered in decoded.covered.items():
        for i in covered:
            absorbing.setdefault(i, []).append(eclass)
    for eclass, ids in plan.ir_ids.items():
        first, *others = ids
        creators = frozenset().union(*(prov.creators(node) for node in chosen_nodes(plan, eclass)))
        for node_id in others:
            own, first_own = plan.own.get(node_id), plan.own.get(first)
            rules = prov.mergers(own) - creators if own is not None and own != first_own else frozenset()
            credit(first_rule(rules, order), node_cost(graph, node_id, plan.target))
        before = node_cost(graph, first, plan.target)
        if eclass in plan.entries:
            entry = plan.entries[eclass]
            credit(first_rule(prov.creators(entry.node), order), before - entry.cost)
        elif eclass in plan.inline:  # the rule that merged its load with its body
            credit(first_rule(prov.mergers(ENode("Load", -1, (eclass,), ())), order), before)
        else:
            credit(eliminated_by(plan, eclass, absorbing.get(first, ()), order), before)
    return saved


def eliminated_by(plan: Plan, eclass: int, kernels, order: dict[str, int]) -> str:
    """The rule credited with an e-class the plan no longer computes (see the module docstring)."""
    prov = plan.provenance
    first = plan.ir_ids[eclass][0]
    own = plan.own.get(first)
    mergers = prov.mergers(own) if own is not None else frozenset()
    for node in (n for n in plan.created_in.get(eclass, ()) if op_free(n)):
        made = prov.creators(node) & mergers
        if made:
            return first_rule(made, order)
    if not kernels:
        return first_rule(mergers, order)
    entry = plan.entries[min(kernels, key=lambda c: plan.rank[c])]
    read = {plan.class_of_ir[i] for i in plan.source[first].inputs}
    for plain in entry.plain:
        if read <= set(plain.children) and prov.creators(plain):
            return first_rule(prov.creators(plain), order)
    return first_rule(prov.creators(entry.node), order)


def op_free(node) -> bool:
    """Whether an e-node is a value that needs no kernel (a constant, a leaf, a view)."""
    op = op_of(node.op, node.primitives) if node.op in OP_CONSTRUCTOR_NAMES else None
    return op is not None and not op_def(op).kernel
