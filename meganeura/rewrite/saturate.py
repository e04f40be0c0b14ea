"""Saturation under a budget, phase by phase: algebra first, then fusion.

The schedule (`SCHEDULE`) runs each phase's rulesets, one iteration at a time, until an
iteration changes nothing, before the next phase starts. Algebra first: folded transposes and
removed reshapes and constants are in place before the fusion rules lift ops into kernels, so
the kernels are built on the simplified graph. The budget (`Budget`: iterations over all phases,
e-nodes, seconds) is checked after every iteration; when it is hit, the e-graph holds fewer
alternatives, but every e-class still holds its input e-node, so extraction still finds a valid
plan (the report says the budget was hit and which).

Matches are summed per named rule (`rules.rule_of`) from egglog's run reports.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from egglog import bindings

from meganeura.rewrite.rules import rule_of
from meganeura.rewrite.schema import CONSTRUCTORS

SCHEDULE: tuple[tuple[str, ...], ...] = (("algebra",), ("pointwise", "matmul", "reductions", "conv"))


@dataclass(frozen=True)
class Budget:
    """Limits on saturation: iterations (all phases together), e-nodes, and seconds."""

    max_iterations: int = 64
    max_enodes: int = 1_000_000
    max_seconds: float = 3.0


DEFAULT_BUDGET = Budget()


@dataclass
class Saturation:
    """How a saturation run went."""

    matches: Counter = field(default_factory=Counter)  # named rule -> matches
    iterations: int = 0
    enodes: int = 0
    budget_hit: str = ""  # "" or which budget stopped it: "iterations", "e-nodes", "time"

    @property
    def saturated(self) -> bool:
        return not self.budget_hit


def enode_count(egraph: bindings.EGraph) -> int:
    """The number of e-nodes: rows of the constructor tables (facts and tags not counted)."""
    (output,) = egraph.parse_and_run_program("(print-size)")
    return sum(size for name, size in output.sizes if name in CONSTRUCTORS and name != "Ref")


def saturate(
    egraph: bindings.EGraph, budget: Budget = DEFAULT_BUDGET, schedule: tuple[tuple[str, ...], ...] = SCHEDULE
) -> Saturation:
    """Run the schedule's phases in order, each until nothing changes, within the budget."""
    result = Saturation()
    deadline = time.perf_counter() + budget.max_seconds
    for phase in schedule:
        command = "(run-schedule " + " ".join(f"(run {ruleset})" for ruleset in phase) + ")"
        while not result.budget_hit:
            if result.iterations >= budget.max_iterations:
                result.budget_hit = "iterations"
                break
            if time.perf_counter() > deadline:
                result.budget_hit = "time"
                break
            (output,) = egraph.parse_and_run_program(command)
            report = output.report
            result.iterations += 1
            for name, count in report.num_matches_per_rule.items():
                result.matches[rule_of(name)] += count
            result.enodes = enode_count(egraph)
            if result.enodes > budget.max_enodes:
                result.budget_hit = "e-nodes"
                break
            if not report.updated:
                break
    if not result.enodes:
        result.enodes = enode_count(egraph)
    return result
