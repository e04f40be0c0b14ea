"""The pointwise family: elementwise ops become kernels with expression bodies, and chains fuse.

Every elementwise op is lifted to a one-op kernel, `relu(x)` ≡ `(Kernel (PUnary "relu" (Load x))
shape)`, and fusion is then a single rule, `fuse_pointwise`: when t ≡ (Kernel F s), the load of t
is F itself, `(Load t)` ≡ F. Loads broadcast to the shape of the kernel reading them and a
kernel's loads all broadcast into its own shape, so substituting F for the load is sound in any
kernel (broadcasting composes, right-aligned). After saturation, the body class of a kernel holds
every way to compute it from earlier tensors: reading t, or recomputing t inline from t's inputs,
and so on down the chain; extraction picks, per kernel, what to read and what to recompute.
Matmul epilogues and reduction prologues are Pw bodies too, so they fuse by the same rule.

- `lift_unary`, `lift_binary`: the one-op kernels of elementwise ops;
- `lift_broadcast`: broadcast_to(x, s) ≡ (Kernel (Load x) s), which a consumer inlines as a plain
  broadcasting load (the copy kernels that autodiff's sum/mean gradients emit vanish);
- `const_literal`: the load of a scalar constant, or of a reshape of one, is a literal;
- `lift_sgd_step`, `lift_momentum_buffer`, `lift_adam_moment`: the optimizer updates that are
  elementwise formulas over their inputs (PyTorch's, in the op order of `ir/ops.py`, so the
  results are bit-identical). `adam_step` stays one op: its bias correction needs β^t for a
  step count t held in a tensor, which the expression language has no power function for;
- `fuse_pointwise`: the inlining rule above;
- `silu`: x·sigmoid(x) and sigmoid(x)·x → silu(x); `swiglu`: silu(g)·u and u·silu(g) → swiglu(g, u).
"""

from __future__ import annotations

from meganeura.rewrite.rules import Rule, rule

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

LIFT_BROADCAST = Rule(
    "lift_broadcast",
    FAMILY,
    "broadcast_to(x) is a kernel that only loads x (broadcast to its shape)",
    (rule(['(= t (Op1 "broadcast_to" a x))', "(= s (shape t))"], "(union t (Kernel (Load x) s))"),),
)

CONST_LITERAL = Rule(
    "const_literal",
    FAMILY,
    "the load of a scalar constant (or of a reshape of one: still one element) is a literal",
    (
        rule("(= t (Const v))", "(union (Load t) (Lit v))"),
        rule(["(= t (Reshape c s))", "(= c (Const v))"], "(union (Load t) (Lit v))"),
    ),
)


def decayed(grad: str, wd_zero: bool) -> str:
    """The gradient with L2 weight decay added: g, or g + wd·p."""
    return grad if wd_zero else f'(PBinary "add" {grad} (PBinary "mul" (Lit wd) (Load p)))'


LIFT_SGD_STEP = Rule(
    "lift_sgd_step",
    FAMILY,
    "sgd_step(p, d) = p − lr·(d + wd·p) as a kernel",
    tuple(
        rule(
            [
                f"(= t (SgdStep p d lr {'wd' if not zero else '0.0'}))",
                "(= s (shape t))",
                *([] if zero else ["(!= wd 0.0)"]),
            ],
            f'(union t (Kernel (PBinary "sub" (Load p) (PBinary "mul" (Lit lr) {decayed("(Load d)", zero)})) s))',
        )
        for zero in (True, False)
    ),
)

LIFT_MOMENTUM_BUFFER = Rule(
    "lift_momentum_buffer",
    FAMILY,
    "momentum_buffer(buf, g, p) = momentum·buf + (g + wd·p) as a kernel",
    tuple(
        rule(
            [
                f"(= t (MomentumBuffer buf g p momentum {'wd' if not zero else '0.0'}))",
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
    "adam_moment(m, g, p) = β·m + (1−β)·gᵒʳᵈᵉʳ (g + wd·p if wd) as a kernel",
    tuple(
        rule(
            [
                f"(= t (AdamMoment m g p beta {order} {'wd' if not zero else '0.0'}))",
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
    LIFT_BROADCAST,
    CONST_LITERAL,
    LIFT_SGD_STEP,
    LIFT_MOMENTUM_BUFFER,
    LIFT_ADAM_MOMENT,
    FUSE_POINTWISE,
    SILU,
    SWIGLU,
]
