"""RewriteReport: what the e-graph stage did, as plain data and as a readable table.

Per named rule: its family, how often egglog matched it, how many of its results the extracted
plan uses and what it saves (`attribution.py` says what counts, from the plan's provenance).
Per family: the bytes, flops and dispatches the plan saves thanks to its rules, and the share no
rule explains (`e-graph`: hash-consing merged common subexpressions); the parts add up to the
total. Kernels and cost
(bytes, dispatches) before and after; e-graph size; timings; whether the saturation budget was
hit (and which limit).

The per-rule uses and savings are read off the plan when first asked for (`rules`, `families`,
`uses()`), not while compiling: `compile()` returns as soon as the plan is decoded, and a
program whose report nobody reads never pays for them (~0.2 s on the 30-layer SmolLM2 step).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields

from meganeura.rewrite.cost import Cost

UNATTRIBUTED = "e-graph"  # what hash-consing and the search did without a rule of their own


@dataclass
class RuleStats:
    """One named rule: egglog matches (all variants summed), uses in the chosen plan, and what it saves."""

    name: str
    matches: int = 0
    uses: int = 0
    family: str = ""
    saved: Cost = field(default_factory=Cost)


@dataclass
class FamilyStats:
    """What one rule family saves in the chosen plan (positive: less traffic, fewer kernels)."""

    family: str
    saved: Cost = field(default_factory=Cost)


@dataclass
class RewriteReport:
    """What `optimize` did to one graph."""

    enabled: bool
    matches: dict[str, int] = field(default_factory=dict)  # egglog's matches per rule name
    kernels_before: int = 0
    kernels_after: int = 0
    cost_before: Cost = field(default_factory=Cost)
    cost_after: Cost = field(default_factory=Cost)
    ir_nodes: int = 0
    cse_merged: int = 0  # IR nodes that hash-consing put in the e-class of an identical earlier node
    enodes: int = 0  # rows of the e-graph's tables (e-nodes and facts)
    eclasses: int = 0
    iterations: int = 0
    saturated: bool = False
    budget_hit: bool = False
    budget: str = ""  # which limit stopped saturation: "iterations", "e-nodes" or "time"
    search_passes: int = 0
    encode_s: float = 0.0
    saturate_s: float = 0.0
    extract_s: float = 0.0  # read the e-graph and extract the plan
    decode_s: float = 0.0  # the plan back to IR
    report_s: float = 0.0  # costs, rule uses and savings for this report (the last two when first read)
    # For each node of the rewritten graph, the ids of the original IR nodes it computes (what a
    # fused kernel covers); empty when the e-graph was skipped.
    covers: dict[int, list[int]] = field(default_factory=dict)
    # The recognition pass on the forward graph before autodiff (compiler.trace_step), if it ran;
    # its rules' matches and uses are also in `rules` (`merge_recognition`).
    recognition: RewriteReport | None = None
    # Attribution, run on first use: the rules in report order, their uses in the plan (a
    # Counter by rule name), and the savings (rule name or `e-graph` -> Cost).
    rule_order: list[tuple[str, str]] = field(default_factory=list, repr=False)  # (name, family)
    family_order: list[str] = field(default_factory=list, repr=False)
    count_uses: Callable[[], Counter] | None = field(default=None, repr=False, compare=False)
    count_savings: Callable[[], dict[str, Cost]] | None = field(default=None, repr=False, compare=False)
    _uses: Counter | None = field(default=None, init=False, repr=False, compare=False)
    _savings: dict[str, Cost] | None = field(default=None, init=False, repr=False, compare=False)

    def merge_recognition(self, recognition: RewriteReport) -> None:
        """Take the recognition family's rule figures from the forward pass's report."""
        self.recognition = recognition

    def uses(self) -> Counter:
        """Per rule name, how often the plan uses it (computed once, on first call)."""
        if self._uses is None:
            self._uses = self.timed(self.count_uses) if self.count_uses else Counter()
            self.count_uses = None
        return self._uses

    def uses_family(self, family: str) -> bool:
        """Whether the plan uses any rule of `family` (needs the uses only, not the savings)."""
        uses = self.uses()
        return any(uses.get(name, 0) for name, f in self.rule_order if f == family)

    def savings(self) -> dict[str, Cost]:
        """Per rule name (and `e-graph`), what the plan saves (computed once, on first call)."""
        if self._savings is None:
            self._savings = self.timed(self.count_savings) if self.count_savings else {}
            self.count_savings = None  # the closure holds the plan: let it go
        return self._savings

    def timed(self, compute: Callable):
        started = time.perf_counter()
        result = compute()
        self.report_s += time.perf_counter() - started
        return result

    @property
    def rules(self) -> list[RuleStats]:
        """Every rule in report order: family, matches, uses, savings (recognition's from the forward pass)."""
        uses, saved = self.uses(), self.savings()
        theirs = {} if self.recognition is None else {s.name: s for s in self.recognition.rules}
        return [
            theirs[name]
            if family == "recognition" and name in theirs
            else RuleStats(name, self.matches.get(name, 0), uses.get(name, 0), family, saved.get(name, Cost()))
            for name, family in self.rule_order
        ]

    @property
    def families(self) -> list[FamilyStats]:
        """What each family saves, then the share no rule explains (`e-graph`)."""
        rules, saved = self.rules, self.savings()
        stats = [FamilyStats(f, sum((s.saved for s in rules if s.family == f), Cost())) for f in self.family_order]
        if self.family_order:
            stats.append(FamilyStats(UNATTRIBUTED, saved.get(UNATTRIBUTED, Cost())))
        return stats

    def rule(self, name: str) -> RuleStats:
        """The stats of one named rule (KeyError if the rule is unknown)."""
        for stats in self.rules:
            if stats.name == name:
                return stats
        raise KeyError(f"no rule named {name!r}; rules: {[s.name for s in self.rules]}")

    def family(self, name: str) -> FamilyStats:
        """The savings of one rule family (KeyError if unknown)."""
        for stats in self.families:
            if stats.family == name:
                return stats
        raise KeyError(f"no family named {name!r}; families: {[s.family for s in self.families]}")

    def to_data(self) -> dict:
        """The report as plain data (dicts, lists, numbers, strings), rules and families included."""
        data = {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.repr and f.name not in ("recognition", "covers")  # the attribution's closures have repr=False
        }
        data["cost_before"], data["cost_after"] = asdict(self.cost_before), asdict(self.cost_after)
        data["covers"] = {str(node): ids for node, ids in self.covers.items()}
        data["rules"] = [asdict(s) for s in self.rules]
        data["families"] = [asdict(s) for s in self.families]
        data["recognition"] = None if self.recognition is None else self.recognition.to_data()
        return data

    @property
    def total_s(self) -> float:
        return self.encode_s + self.saturate_s + self.extract_s + self.decode_s + self.report_s

    def __str__(self) -> str:
        lines = ["Rewrite report (e-graph)"]
        if not self.enabled:
            lines.append("  e-graph skipped (rewrite disabled): the graph is only pruned")
            lines.append(f"  kernels: {self.kernels_before}")
            lines.append(f"  cost: {format_cost(self.cost_before)}")
            return "\n".join(lines)
        width = max([len("rule"), *(len(s.name) for s in self.rules)])
        head = f"  {'family':<11}  {'rule':<{width}}  {'matches':>7}  {'used':>5}"
        lines.append(f"{head}  {'saves bytes':>14}  {'dispatches':>10}")
        for s in self.rules:
            row = f"  {s.family:<11}  {s.name:<{width}}  {s.matches:>7}  {s.uses:>5}"
            lines.append(f"{row}  {s.saved.bytes:>14,}  {s.saved.dispatches:>10}")
        lines.append("  saved per family:")
        for stats in self.families:
            saved = stats.saved
            lines.append(
                f"    {stats.family:<11}  {saved.bytes:>14,} bytes  {saved.dispatches:>6} dispatches"
                f"  {saved.flops:>14,} matmul flops"
            )
        if self.recognition is not None:
            forward = self.recognition
            lines.append(
                f"  recognition (forward, before autodiff): kernels {forward.kernels_before}"
                f" -> {forward.kernels_after}, {ms(forward.total_s)}"
            )
        lines.append(f"  kernels: {self.kernels_before} -> {self.kernels_after}")
        lines.append(f"  cost: {format_cost(self.cost_before)} -> {format_cost(self.cost_after)}")
        state = "saturated" if self.saturated else f"budget hit ({self.budget}), not saturated"
        lines.append(
            f"  e-graph: {self.ir_nodes} IR nodes ({self.cse_merged} merged as duplicates), {self.enodes} e-nodes,"
            f" {self.eclasses} e-classes, {self.iterations} iterations ({state})"
        )
        lines.append(
            f"  time: encode {ms(self.encode_s)}, saturate {ms(self.saturate_s)}, extract {ms(self.extract_s)}"
            f" ({self.search_passes} search passes), decode {ms(self.decode_s)}, report {ms(self.report_s)}"
            f", total {ms(self.total_s)}"
        )
        return "\n".join(lines)


def format_cost(cost: Cost) -> str:
    """`12,345 bytes, 6,000 matmul flops, 7 dispatches`."""
    return f"{cost.bytes:,} bytes, {cost.flops:,} matmul flops, {cost.dispatches} dispatches"


def ms(seconds: float) -> str:
    """Seconds as milliseconds text."""
    return f"{seconds * 1000:.1f} ms"
