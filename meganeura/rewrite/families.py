"""The rule families, in the order the report lists them, and the egglog program that declares them.

One module per family: `algebra`, `pointwise`, `matmul`, `reductions`, `conv`, and `recognition`
(scheduled only on the forward graph, before autodiff). A family module has `FAMILY` (its
ruleset's name), `RULES`, and optionally `DECLARATIONS` (the relations its guards read),
`facts(graph, node_ids)` (the rows of those relations for an encoded graph) and
`target_facts(graph, node_ids, target)` (rows that depend on the adapter the plan is for: how far
the reductions and weight gradients split, meganeura/target.py).
"""

from __future__ import annotations

from meganeura.ir.graph import Graph
from meganeura.rewrite import algebra, conv, matmul, pointwise, recognition, reductions
from meganeura.rewrite.rules import Rule
from meganeura.target import GENERIC, Target

MODULES = (algebra, pointwise, matmul, reductions, conv, recognition)
FAMILIES = tuple(module.FAMILY for module in MODULES)


def all_rules() -> list[Rule]:
    """Every rule, family by family, in the order the report lists them."""
    return [rule for module in MODULES for rule in module.RULES]


def rules_program() -> str:
    """The egglog text declaring the family rulesets, their guard relations and every rule."""
    lines = [f"(ruleset {family})" for family in FAMILIES]
    lines += [getattr(module, "DECLARATIONS", "") for module in MODULES]
    lines.extend(r.program for r in all_rules())
    return "\n".join(lines)


def family_facts(graph: Graph, node_ids: list[int], families: set[str], target: Target = GENERIC) -> list[str]:
    """The guard facts of the families in `families` for the encoded nodes of `graph`, on `target`."""
    lines = []
    for module in MODULES:
        if module.FAMILY not in families:
            continue
        if hasattr(module, "facts"):
            lines += module.facts(graph, node_ids)
        if hasattr(module, "target_facts"):
            lines += module.target_facts(graph, node_ids, target)
    return lines
