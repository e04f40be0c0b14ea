"""Saturation under a budget: run a ruleset until nothing changes, or iterations or time run out.

Matches are summed per named rule (see `rules.rule_family`) over all iterations, from egglog's
run report (`num_matches_per_rule`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from egglog import EGraph, Ruleset

from meganeura.rewrite.rules import rule_family

MAX_ITERATIONS = 32
MAX_SECONDS = 2.0


@dataclass
class Saturation:
    """How a saturation run went."""

    matches: Counter = field(default_factory=Counter)  # named rule -> matches
    iterations: int = 0
    saturated: bool = False

    @property
    def budget_hit(self) -> bool:
        return not self.saturated


def saturate(
    egraph: EGraph, rules: Ruleset, max_iterations: int = MAX_ITERATIONS, max_seconds: float = MAX_SECONDS
) -> Saturation:
    """Run `rules` one iteration at a time until the e-graph stops changing or the budget is spent."""
    result = Saturation()
    deadline = time.perf_counter() + max_seconds
    while result.iterations < max_iterations and time.perf_counter() < deadline:
        report = egraph.run(rules)
        result.iterations += 1
        for egglog_rule, count in report.num_matches_per_rule.items():
            result.matches[rule_family(rule_name(egglog_rule))] += count
        if not report.updated:
            result.saturated = True
            break
    return result


def rule_name(egglog_rule) -> str:
    """The name of a rule as egglog's run report keys it (a rule declaration, or its name)."""
    return getattr(egglog_rule, "name", None) or str(egglog_rule)
