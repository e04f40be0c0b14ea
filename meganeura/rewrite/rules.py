"""Named rewrite rules, grouped in families, and the egglog program text that declares them.

A `Rule` is one named rewrite with one or more egglog variants (operand orders, ranks…). Its
egglog rules are named `<name>#<variant index>`, so that egglog's run report
(`num_matches_per_rule`) sums back per named rule (`rule_of`). Each family is an egglog ruleset
named after it; `saturate.py` schedules them.

Rules only add alternatives to existing e-classes (`union`); extraction with the cost model
decides which ones the plan uses. Guards are conditions inside the egglog rules (on the `shape`
facts, on attributes, and on facts of the rule's family). A rule that removes a redundant node
(x·1, a reshape to the same shape, a constant expression) also `subsume`s the node it replaces,
so that no other rule matches it again (it would only create cycles such as x ≡ x·1).

Provenance. Every `(union OLD NEW)` of a rule is written with the rewritten term first and its
replacement second. The program adds, after the rule's own actions, a `made_C` fact for every
constructor application in NEW, and a `merged_C` fact for OLD (the term itself, or the pattern a
query variable is bound to) where the rule replaces it: NEW is an existing class (a variable),
or the rule subsumes OLD; each names the rule. After saturation they say which rules created
each e-node and which merged it away (`view.read_egraph`), and the report counts a rule's uses
in the plan from them (`attribution.py`) without knowing any rule by name.

The families, one module each: `algebra`, `pointwise`, `matmul`, `reductions`, `conv`, and
`recognition` (scheduled only on the forward graph, before autodiff: see `recognition.py`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from meganeura.rewrite.schema import CONSTRUCTORS
from meganeura.rewrite.sorts import REF


@dataclass(frozen=True)
class Rule:
    """One named rewrite rule: its family, what it does, and its egglog rule(s)."""

    name: str
    family: str
    doc: str
    variants: tuple[str, ...]  # each `(rule (query…) (actions…))` without :ruleset/:name

    def egglog_names(self) -> list[str]:
        return [f"{self.name}#{index}" for index in range(len(self.variants))]

    @functools.cached_property
    def program(self) -> str:
        """The egglog commands declaring this rule's variants in its family's ruleset, each with
        its provenance actions (built once per rule: every compilation declares them)."""
        commands = []
        for variant, name in zip(self.variants, self.egglog_names(), strict=True):
            commands.append(f'{with_provenance(variant, self.name)} :ruleset {self.family} :name "{name}")')
        return "\n".join(commands)


def rule(query: str | list[str], actions: str | list[str]) -> str:
    """`(rule (query…) (actions…))` from lists of egglog facts and actions."""
    query = [query] if isinstance(query, str) else query
    actions = [actions] if isinstance(actions, str) else actions
    return f"(rule ({' '.join(query)}) ({' '.join(actions)}))"


def rule_of(egglog_rule_name: str) -> str:
    """The named rule an egglog rule belongs to (`fold_transpose_a#2` → `fold_transpose_a`)."""
    return egglog_rule_name.split("#", 1)[0]


# ---------------------------------------------------------------------------------------------
# S-expressions, enough to read a rule's query and actions


def parse_sexpr(text: str) -> list:
    """The items of egglog text: nested lists of atoms (strings keep their quotes)."""
    stack: list[list] = [[]]
    position = 0
    while position < len(text):
        char = text[position]
        if char.isspace():
            position += 1
        elif char == "(":
            stack.append([])
            position += 1
        elif char == ")":
            done = stack.pop()
            stack[-1].append(done)
            position += 1
        elif char == '"':
            end = text.index('"', position + 1)
            stack[-1].append(text[position : end + 1])
            position = end + 1
        else:
            end = position
            while end < len(text) and not text[end].isspace() and text[end] not in "()":
                end += 1
            stack[-1].append(text[position:end])
            position = end
    if len(stack) != 1:
        raise ValueError(f"unbalanced egglog text: {text!r}")
    return stack[0]


def unparse(item) -> str:
    return f"({' '.join(unparse(i) for i in item)})" if isinstance(item, list) else item


def applications(item) -> list[list]:
    """The constructor applications in an expression, outermost first (Ref tags left out)."""
    if not isinstance(item, list) or not item:
        return []
    found = [item] if item[0] in CONSTRUCTORS and item[0] != REF else []
    for arg in item[1:]:
        found += applications(arg)
    return found


def with_provenance(variant: str, name: str) -> str:
    """The rule text with a `made_…` fact for each constructor application on the new side of its
    unions and a `merged_…` fact for the rewritten side (see the module docstring)."""
    ((head, query, actions),) = parse_sexpr(variant)
    if head != "rule":
        raise ValueError(f"not a rule: {variant!r}")
    bound = {
        fact[1]: fact[2]
        for fact in query
        if isinstance(fact, list) and fact[:1] == ["="] and len(fact) == 3 and isinstance(fact[1], str)
    }
    subsumed = {unparse(action[1]) for action in actions if isinstance(action, list) and action[:1] == ["subsume"]}
    extra = []
    for action in actions:
        if not isinstance(action, list) or action[:1] != ["union"]:
            continue
        old, new = action[1], action[2]
        for application in applications(new):
            extra.append(f'(made_{application[0]} {" ".join(unparse(a) for a in application[1:])} "{name}")')
        old = bound.get(old, old) if isinstance(old, str) else old
        replaced = isinstance(new, str) or unparse(old) in subsumed  # merged with an existing class, or removed
        if replaced and isinstance(old, list) and old and old[0] in CONSTRUCTORS and old[0] != REF:
            extra.append(f'(merged_{old[0]} {" ".join(unparse(a) for a in old[1:])} "{name}")')
    return f"(rule {unparse(query)} ({' '.join(unparse(a) for a in actions + parse_sexpr(' '.join(extra)))})"
