"""The e-graph optimizer stage: `optimize(graph)` returns the rewritten graph and a RewriteReport.

Modules, one idea each: `encode` (IR → egglog), `rules` (the named rewrite rules), `saturate`
(running them under a budget), `cost` (the cost model), `extract` (DAG-aware extraction),
`decode` (choice → IR), `report` (RewriteReport), `pipeline` (the stage end to end).
"""

from meganeura.rewrite.cost import Cost
from meganeura.rewrite.pipeline import optimize
from meganeura.rewrite.report import RewriteReport, RuleStats
from meganeura.rewrite.rules import RULE_NAMES

__all__ = ["Cost", "RULE_NAMES", "RewriteReport", "RuleStats", "optimize"]
