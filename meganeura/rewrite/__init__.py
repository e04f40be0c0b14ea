"""The e-graph optimizer stage: `optimize(graph)` returns the rewritten graph and a RewriteReport.

Modules, one idea each: `schema` (the egglog sorts), `encode` (IR → egglog), `rules` (named rules
and families) with one module per family (`algebra`, `pointwise`, `matmul`, `reductions`),
`saturate` (running them under a budget, phase by phase), `view` (the saturated e-graph as data),
`cost` (the cost model), `extract` (DAG-aware plan search), `decode` (plan → IR), `attribution`
(rule uses, savings per family), `report` (RewriteReport), `pipeline` (the stage end to end).
"""

from meganeura.rewrite.cost import Cost
from meganeura.rewrite.pipeline import optimize
from meganeura.rewrite.report import FamilyStats, RewriteReport, RuleStats
from meganeura.rewrite.rules import FAMILIES, all_rules
from meganeura.rewrite.saturate import Budget

RULE_NAMES = tuple(r.name for r in all_rules())

__all__ = ["Budget", "Cost", "FAMILIES", "FamilyStats", "RULE_NAMES", "RewriteReport", "RuleStats", "optimize"]
