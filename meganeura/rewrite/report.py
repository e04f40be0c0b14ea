"""RewriteReport: what the e-graph stage did, as data and as a readable table.

Per named rule: how often egglog matched it and how many of its results the extracted plan
uses; kernels, cost (bytes, dispatches) before and after; e-graph size; timings; whether the
saturation budget was hit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meganeura.rewrite.cost import Cost


@dataclass
class RuleStats:
    """One named rule: egglog matches (all variants summed) and uses in the chosen plan."""

    name: str
    matches: int = 0
    uses: int = 0


@dataclass
class RewriteReport:
    """What `optimize` did to one graph."""

    enabled: bool
    rules: list[RuleStats] = field(default_factory=list)
    kernels_before: int = 0
    kernels_after: int = 0
    cost_before: Cost = field(default_factory=Cost)
    cost_after: Cost = field(default_factory=Cost)
    enodes: int = 0
    eclasses: int = 0
    iterations: int = 0
    saturated: bool = False
    budget_hit: bool = False
    encode_s: float = 0.0
    saturate_s: float = 0.0
    extract_s: float = 0.0  # serialize, extract and decode

    def rule(self, name: str) -> RuleStats:
        """The stats of one named rule (KeyError if the rule is unknown)."""
        for stats in self.rules:
            if stats.name == name:
                return stats
        raise KeyError(f"no rule named {name!r}; rules: {[s.name for s in self.rules]}")

    @property
    def total_s(self) -> float:
        return self.encode_s + self.saturate_s + self.extract_s

    def __str__(self) -> str:
        lines = ["Rewrite report (e-graph)"]
        if not self.enabled:
            lines.append("  e-graph skipped (rewrite disabled): the graph is only pruned")
            lines.append(f"  kernels: {self.kernels_before}")
            lines.append(f"  cost: {format_cost(self.cost_before)}")
            return "\n".join(lines)
        width = max([len("rule"), *(len(s.name) for s in self.rules)])
        lines.append(f"  {'rule':<{width}}  {'matches':>7}  {'used':>4}")
        lines.extend(f"  {s.name:<{width}}  {s.matches:>7}  {s.uses:>4}" for s in self.rules)
        lines.append(f"  kernels: {self.kernels_before} -> {self.kernels_after}")
        lines.append(f"  cost: {format_cost(self.cost_before)} -> {format_cost(self.cost_after)}")
        state = "saturated" if self.saturated else "budget hit, not saturated" if self.budget_hit else "stopped"
        lines.append(
            f"  e-graph: {self.enodes} e-nodes, {self.eclasses} e-classes, {self.iterations} iterations ({state})"
        )
        lines.append(
            f"  time: encode {ms(self.encode_s)}, saturate {ms(self.saturate_s)}, extract {ms(self.extract_s)}"
        )
        return "\n".join(lines)


def format_cost(cost: Cost) -> str:
    """`12,345 bytes, 6,000 matmul flops, 7 dispatches`."""
    return f"{cost.bytes:,} bytes, {cost.flops:,} matmul flops, {cost.dispatches} dispatches"


def ms(seconds: float) -> str:
    """Seconds as milliseconds text."""
    return f"{seconds * 1000:.1f} ms"
