"""Named rewrite rules, grouped in families, and the egglog program text that declares them.

A `Rule` is one named rewrite with one or more egglog variants (operand orders, ranks…). Its
egglog rules are named `<name>#<variant index>`, so that egglog's run report
(`num_matches_per_rule`) sums back per named rule (`rule_of`). Each family is an egglog ruleset
named after it; `saturate.py` schedules them.

Rules only add alternatives to existing e-classes (`union`); extraction with the cost model
decides which ones the plan uses. Guards are conditions inside the egglog rules (on the `shape`
facts and on attributes). A rule that removes a redundant node (x·1, a reshape to the same shape,
a constant expression) also `subsume`s the node it replaces, so that no other rule matches it
again (it would only create cycles such as x ≡ x·1).

The families, one module each: `algebra`, `pointwise`, `matmul`, `reductions`, `conv`, and
`recognition` (scheduled only on the forward graph, before autodiff: see `recognition.py`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One named rewrite rule: its family, what it does, and its egglog rule(s)."""

    name: str
    family: str
    doc: str
    variants: tuple[str, ...]  # each `(rule (query…) (actions…))` without :ruleset/:name

    def egglog_names(self) -> list[str]:
        return [f"{self.name}#{index}" for index in range(len(self.variants))]

    def program(self) -> str:
        """The egglog commands declaring this rule's variants in its family's ruleset."""
        return "\n".join(
            f'{variant[:-1]} :ruleset {self.family} :name "{name}")'
            for variant, name in zip(self.variants, self.egglog_names(), strict=True)
        )


def rule(query: str | list[str], actions: str | list[str]) -> str:
    """`(rule (query…) (actions…))` from lists of egglog facts and actions."""
    query = [query] if isinstance(query, str) else query
    actions = [actions] if isinstance(actions, str) else actions
    return f"(rule ({' '.join(query)}) ({' '.join(actions)}))"


def rule_of(egglog_rule_name: str) -> str:
    """The named rule an egglog rule belongs to (`fold_transpose_a#2` → `fold_transpose_a`)."""
    return egglog_rule_name.split("#", 1)[0]


def all_rules() -> list[Rule]:
    """Every rule, family by family, in the order the report lists them."""
    from meganeura.rewrite import algebra, conv, matmul, pointwise, recognition, reductions

    return [*algebra.RULES, *pointwise.RULES, *matmul.RULES, *reductions.RULES, *conv.RULES, *recognition.RULES]


FAMILIES = ("algebra", "pointwise", "matmul", "reductions", "conv", "recognition")


def rules_program(rules: list[Rule]) -> str:
    """The egglog text declaring the family rulesets and every rule."""
    from meganeura.rewrite import conv, matmul, recognition

    lines = [f"(ruleset {family})" for family in FAMILIES]
    lines += [recognition.DECLARATIONS, conv.DECLARATIONS, matmul.DECLARATIONS]
    lines.extend(r.program() for r in rules)
    return "\n".join(lines)
