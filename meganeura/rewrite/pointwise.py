"""The pointwise family: elementwise ops become kernels with expression bodies, and chains fuse.

Every elementwise op is lifted to a one-op kernel, `relu(x)` ≡ `(Kernel (PUnary "relu" (Load x))
shape)`, and fusion is then a single rule, `fuse_pointwise`: when t ≡ (Kernel F s), the load of t
is F itself, `(Load t)` ≡ F. Loads broadcast to the shape of the kernel reading them and a
kernel's loads all broadcast into its own shape, so substituting F for the load is sound in any
kernel (broadcasting composes, right-aligned). After saturation, the body class of a kernel holds
every way to compute it from earlier tensors: reading t, or recomputing t inline from t's inputs,
and so on down the chain; extraction picks, per kernel, what to read and what to recompute.
Matmul epilogues and reduction prologues are Pw bodies too, so they fuse by the same rule.

- `lift_unary`, `lift_binary`, `lift_ternary`: the one-op kernels of elementwise ops;
- `lift_broadcast`: broadcast_to(x, s) ≡ (Kernel (Load x) s), which a consumer inlines as a plain
  broadcasting load (the copy kernels that autodiff's sum/mean gradients emit vanish);
- `const_literal`: the load of a scalar constant, or of a reshape of one, is a literal (the load
  is subsumed: a kernel never reads a constant as a buffer);
- `lift_sgd_step`, `lift_momentum_buffer`, `lift_adam_moment`: the optimizer updates that are
  elementwise formulas over their inputs (PyTorch's, in the op order of `ir/ops/optimizer.py`,
  so the results are bit-identical), and plain SGD's fused update `sgd_update(p, g)` (one
  result, sgd_step's formula: the e-graph may still fold it into the gradient's matmul).
  `adam_step` stays one op: its bias correction needs β^t for a step count t held in a tensor,
  which the expression language has no power function for (nor does the fused `adam_update`);
- `fuse_pointwise`: the inlining rule above;
- `silu`: x·sigmoid(x) and sigmoid(x)·x → silu(x); `swiglu`: silu(g)·u and u·silu(g) → swiglu(g, u).
"""

from __future__ import annotations

from meganeura.rewrite.rules import Rule, rule
from meganeura.rewrite.schema import term

FAMILY = "pointwise"

LIFT_UNARY = Rule(
    "lift_unary",
    FAMILY,
    "an elementwise unary op is a one-op kernel",
    (rule(["(= t (Unary f x))", "(= s (shape t))"], "(union t (Kernel (PUnary f (Load x)) s))"),),
)

LIFT_BINARY = Rule(
    "lift_binary",
    FAMILY,
    "an elementwise binary op is a one-op kernel",
    (rule(["(= t (Binary f x y))", "(= s (shape t))"], "(union t (Kernel (PBinary f (Load x) (Load y)) s))"),),
)

LIFT_TERNARY = Rule(
    "lift_ternary",
    FAMILY,
    "an elementwise ternary op (where, clamp) is a one-op kernel",
    (
        rule(
            ["(= t (Ternary f x y z))", "(= s (shape t))"],
            "(union t (Kernel (PTernary f (Load x) (Load y) (Load z)) s))",
        ),
    ),
)

LIFT_BROADCAST = Rule(
    "lift_broadcast",
    FAMILY,
    "broadcast_to(x) is a kernel that only loads x (broadcast to its shape)",
    (rule([f"(= t {term('broadcast_to', 'x', shape='s')})"], "(union t (Kernel (Load x) s))"),),
)

CONST_LITERAL = Rule(
    "const_literal",
    FAMILY,
    "the load of a scalar constant (or of a reshape of one: still one element) is a literal",
    (
        rule("(= t (Const v))", ["(union (Load t) (Lit v))", "(subsume (Load t))"]),
        rule(["(= t (Reshape c s))", "(= c (Const v))"], ["(union (Load t) (Lit v))", "(subsume (Load t))"]),
    ),
)


def decayed(grad: str, wd_zero: bool) -> str:
    """The gradient with L2 weight decay added: g, or g + wd·p."""
    return grad if wd_zero else f'(PBinary "add" {grad} (PBinary "mul" (Lit wd) (Load p)))'


def plain_sgd(op: str, zero: bool) -> str:
    """sgd_step(p, d), or the fused update of plain SGD sgd_update(p, d) (no momentum: one result)."""
    decay = "0.0" if zero else "wd"
    if op == "sgd_step":
        return term("sgd_step", "p", "d", lr="lr", weight_decay=decay)
    return term("sgd_update", "p", "d", lr="lr", momentum="0.0", weight_decay=decay)


LIFT_SGD_STEP = Rule(
    "lift_sgd_step",
    FAMILY,
    "sgd_step(p, d) = p − lr·(d + wd·p) as a kernel (and sgd_update(p, d), plain SGD's fused update)",
    tuple(
        rule(
            [f"(= t {plain_sgd(op, zero)})", "(= s (shape t))", *([] if zero else ["(!= wd 0.0)"])],
            f'(union t (Kernel (PBinary "sub" (Load p) (PBinary "mul" (Lit lr) {decayed("(Load d)", zero)})) s))',
        )
        for op in ("sgd_step", "sgd_update")
        for zero in (True, False)
    ),
)


def update_operands(zero: bool, *names: str) -> tuple[str, ...]:
    """The operands of momentum_buffer/adam_moment: the parameter p only where weight decay reads it."""
    return names if zero else (*names, "p")


def momentum_buffer(zero: bool) -> str:
    decay = "0.0" if zero else "wd"
    return term("momentum_buffer", *update_operands(zero, "buf", "g"), momentum="momentum", weight_decay=decay)


def adam_moment(order: int, zero: bool) -> str:
    decay = "0.0" if zero else "wd"
    return term("adam_moment", *update_operands(zero, "m", "g"), beta="beta", order=str(order), weight_decay=decay)


LIFT_MOMENTUM_BUFFER = Rule(
    "lift_momentum_buffer",
    FAMILY,
    "momentum_buffer(buf, g[, p]) = momentum·buf + (g + wd·p) as a kernel",
    tuple(
        rule(
            [
                f"(= t {momentum_buffer(zero)})",
                "(= s (shape t))",
                *([] if zero else ["(!= wd 0.0)"]),
            ],
            '(union t (Kernel (PBinary "add" (PBinary "mul" (Lit momentum) (Load buf)) '
            f"{decayed('(Load g)', zero)}) s))",
        )
        for zero in (True, False)
    ),
)


def moment_term(order: int, zero: bool) -> str:
    grad = decayed("(Load g)", zero)
    power = grad if order == 1 else f'(PBinary "mul" {grad} {grad})'
    return f'(PBinary "add" (PBinary "mul" (Lit beta) (Load m)) (PBinary "mul" (Lit (- 1.0 beta)) {power}))'


LIFT_ADAM_MOMENT = Rule(
    "lift_adam_moment",
    FAMILY,
    "adam_moment(m, g[, p]) = β·m + (1−β)·gᵒʳᵈᵉʳ (g + wd·p if wd) as a kernel",
    tuple(
        rule(
            [
                f"(= t {adam_moment(order, zero)})",
                "(= s (shape t))",
                *([] if zero else ["(!= wd 0.0)"]),
            ],
            f"(union t (Kernel {moment_term(order, zero)} s))",
        )
        for order in (1, 2)
        for zero in (True, False)
    ),
)

FUSE_POINTWISE = Rule(
    "fuse_pointwise",
    FAMILY,
    "the load of a kernel's result is the kernel's body (inlining: chains fuse)",
    (rule("(= t (Kernel f s))", "(union (Load t) f)"),),
)

SILU = Rule(
    "silu",
    FAMILY,
    "x·sigmoid(x) → silu(x), both operand orders",
    (
        rule('(= e (PBinary "mul" x (PUnary "sigmoid" x)))', '(union e (PUnary "silu" x))'),
        rule('(= e (PBinary "mul" (PUnary "sigmoid" x) x))', '(union e (PUnary "silu" x))'),
    ),
)

SWIGLU = Rule(
    "swiglu",
    FAMILY,
    "silu(g)·u → swiglu(g, u), both operand orders",
    (
        rule('(= e (PBinary "mul" (PUnary "silu" g) u))', '(union e (PBinary "swiglu" g u))'),
        rule('(= e (PBinary "mul" u (PUnary "silu" g)))', '(union e (PBinary "swiglu" g u))'),
    ),
)

RULES = [
    LIFT_UNARY,
    LIFT_BINARY,
    LIFT_TERNARY,
    LIFT_BROADCAST,
    CONST_LITERAL,
    LIFT_SGD_STEP,
    LIFT_MOMENTUM_BUFFER,
    LIFT_ADAM_MOMENT,
    FUSE_POINTWISE,
    SILU,
    SWIGLU,
]

# The constructors the lift rules above give a `Kernel` twin in the same e-class, which computes
# the same thing at the same cost when stored: extraction offers the kernel's modes instead.
LIFTED = (
    "Unary",
    "Binary",
    "Ternary",
    "BroadcastTo",
    "SgdStep",
    "MomentumBuffer2",
    "MomentumBuffer3",
    "AdamMoment2",
    "AdamMoment3",
)
