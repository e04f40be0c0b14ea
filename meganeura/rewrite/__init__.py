"""The e-graph optimizer stage: `optimize(graph)` returns the rewritten graph and a RewriteReport.

Modules, one idea each: `sorts` (the e-graph's vocabulary), `kernels` (the fused kernel forms),
`schema` (the constructors generated from the op declarations, and the fact tables), `encode`
(IR → egglog), `rules` (named rules and their provenance) with one module per family (`algebra`,
`pointwise`, `matmul`, `reductions`, `conv`, `recognition`; `families` lists them), `saturate`
(running them under a budget, phase by phase), `view` (the saturated e-graph as data), `cost`
(the pricing function), `extract` (DAG-aware plan search), `plan` (its result), `decode` (plan →
IR), `attribution` (rule uses and savings), `report` (RewriteReport), `pipeline` (the stage end
to end).
"""

from meganeura.rewrite.cost import Cost
from meganeura.rewrite.families import FAMILIES, all_rules
from meganeura.rewrite.pipeline import optimize
from meganeura.rewrite.report import FamilyStats, RewriteReport, RuleStats
from meganeura.rewrite.saturate import Budget

RULE_NAMES = tuple(r.name for r in all_rules())

__all__ = ["Budget", "Cost", "FAMILIES", "FamilyStats", "RULE_NAMES", "RewriteReport", "RuleStats", "optimize"]
