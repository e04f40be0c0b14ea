"""The matmul fusion rules: a bias add and an activation folded into `fused_matmul`.

Each named rule (`RULE_NAMES`) is one or more egglog rules, named `<rule>:<variant>` so that
egglog's run report (`num_matches_per_rule`) can be summed back per named rule by `rule_family`.
Rules only add alternatives to an e-class (`union`); extraction with the cost model decides
whether the plan uses them. All guards are conditions inside the egglog rules, on the shape
facts `rank`/`dim` set by the encoder.

- `matmul_bias`: add(matmul(a, b), bias) and add(bias, matmul(a, b)) → fused_matmul(a, b, bias,
  activation="none"), when bias is [N] or [1, N] with N the matmul's output columns (so the sum
  has the matmul's shape).
- `matmul_epilogue_<act>` (relu, sigmoid, tanh): act(matmul(a, b)) → fused_matmul(a, b,
  activation=act) and act(fused_matmul(…, activation="none")) → fused_matmul(…, activation=act).
"""

from __future__ import annotations

from egglog import Bool, Ruleset, String, eq, i64, rule, ruleset, union, vars_

from meganeura.rewrite.encode import ACTIVATIONS, UNARY_CONSTRUCTORS, Term, dim, rank

MATMUL_BIAS = "matmul_bias"
RULE_NAMES = (MATMUL_BIAS, *(f"matmul_epilogue_{act}" for act in ACTIVATIONS))


def rule_family(egglog_rule_name: str) -> str:
    """The named rule an egglog rule belongs to (`matmul_bias:add_left_vector` → `matmul_bias`)."""
    return egglog_rule_name.split(":", 1)[0]


def matmul_bias_rules() -> list:
    """`matmul_bias`: both operand orders of the add, for a [N] and a [1, N] bias."""
    a, b, bias, total = vars_("a b bias total", Term)
    transpose_a, transpose_b = vars_("transpose_a transpose_b", Bool)
    product = Term.matmul(a, b, transpose_a, transpose_b)
    fused = Term.fused_matmul(a, b, bias, transpose_a, transpose_b, String("none"))
    # The matmul's own columns, not the sum's: a [M,1] product plus an [N] bias broadcasts up to
    # [M,N], which a fused matmul (output [M,1]) cannot compute.
    columns = dim(product, i64(1))
    bias_shapes = {
        "vector": (rank(bias) == i64(1), dim(bias, i64(0)) == columns),
        "row": (rank(bias) == i64(2), dim(bias, i64(0)) == i64(1), dim(bias, i64(1)) == columns),
    }
    orders = {"add_left": Term.add(product, bias), "add_right": Term.add(bias, product)}
    rules = []
    for order, pattern in orders.items():
        for shape, guards in bias_shapes.items():
            rules.append(
                rule(eq(total).to(pattern), *guards, name=f"{MATMUL_BIAS}:{order}_{shape}").then(
                    union(total).with_(fused)
                )
            )
    return rules


def matmul_epilogue_rules(activation: str) -> list:
    """`matmul_epilogue_<activation>`: the activation of a plain or unactivated fused matmul."""
    a, b, bias, result = vars_("a b bias result", Term)
    transpose_a, transpose_b = vars_("transpose_a transpose_b", Bool)
    apply = UNARY_CONSTRUCTORS[activation]
    name = f"matmul_epilogue_{activation}"
    plain = Term.matmul(a, b, transpose_a, transpose_b)
    unactivated = Term.fused_matmul(a, b, bias, transpose_a, transpose_b, String("none"))
    return [
        rule(eq(result).to(apply(plain)), name=f"{name}:matmul").then(
            union(result).with_(Term.fused_matmul(a, b, Term.no_bias(), transpose_a, transpose_b, activation))
        ),
        rule(eq(result).to(apply(unactivated)), name=f"{name}:fused_matmul").then(
            union(result).with_(Term.fused_matmul(a, b, bias, transpose_a, transpose_b, activation))
        ),
    ]


def fusion_ruleset() -> Ruleset:
    """The ruleset holding every rule of this module."""
    rules = ruleset(name="matmul_fusion")
    rules.register(*matmul_bias_rules())
    for activation in ACTIVATIONS:
        rules.register(*matmul_epilogue_rules(activation))
    return rules


def rules_used_by(op: str, primitives: tuple, has_bias: bool) -> list[str]:
    """The named rules whose rewrite a fused_matmul e-node (not in the input graph) carries.

    A fused matmul with a bias carries `matmul_bias`; one with an activation carries that
    activation's epilogue rule (fc1's relu(matmul + bias) carries both).
    """
    if op != "Term.fused_matmul":
        return []
    activation = primitives[2]
    used = [MATMUL_BIAS] if has_bias else []
    if activation != "none":
        used.append(f"matmul_epilogue_{activation}")
    return used
