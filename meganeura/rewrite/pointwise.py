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
- `lift_sgd_step`, `lift_momentum_buffer`, `lift_adam_moment`, `lift_adamax_norm`,
  `lift_adadelta_delta`: the optimizer updates that are elementwise formulas over their inputs
  (PyTorch's, in the op order of `ir/ops/optimizer.py`, so the results are bit-identical), and
  plain SGD's fused update `sgd_update(p, g, lr, wd)` (one result, sgd_step's formula: the
  e-graph may still fold it into the gradient's matmul). The hyper-parameters are scalar
  operands, loaded (broadcast) like any tensor: run-time values as `element` views of their
  parameter group's vector (a kernel reading several binds the vector once), or literals where
  they are constants (`const_literal`).
  `adam_step`, `rms_step`, `rms_buffer`, `adamax_step`, `nadam_step` and `radam_step` stay ops
  of their own: they read moments that the moment kernels store anyway, so inlining those would
  only compute them twice. Adadelta's direction (`adadelta_delta`) is stored by no one: its two
  readers (acc_delta's moment and the step) may recompute it or read it, as extraction weighs;
- `regenerate_random`: rand(state) ≡ (Kernel (Load philox(state)) s), the same random values
  drawn by whichever kernel reads them (ir/ops/random.py): stored, the kernel writes them; inline,
  `fuse_pointwise` puts the draw into every consumer (a dropout mask into the activation's kernel
  and into the gradient's), and extraction weighs those draws against a stored mask (cost.py);
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


def decayed(grad: str) -> str:
    """The gradient with L2 weight decay added, g + wd·p (wd a loaded scalar: a run-time value, or
    a literal where it is the constant 0)."""
    return f'(PBinary "add" {grad} (PBinary "mul" (Load wd) (Load p)))'


LIFT_SGD_STEP = Rule(
    "lift_sgd_step",
    FAMILY,
    "sgd_step(p, d, lr, wd) = p − lr·(d + wd·p) as a kernel (and sgd_update(p, d, lr, wd), plain SGD's fused update)",
    tuple(
        rule(
            [f"(= t {term(op, 'p', 'd', 'lr', 'wd', **attrs)})", "(= s (shape t))"],
            f'(union t (Kernel (PBinary "sub" (Load p) (PBinary "mul" (Load lr) {decayed("(Load d)")})) s))',
        )
        for op, attrs in (("sgd_step", {}), ("sgd_update", {"nesterov": "false"}))
    ),
)

LIFT_MOMENTUM_BUFFER = Rule(
    "lift_momentum_buffer",
    FAMILY,
    "momentum_buffer(buf, g, p, momentum, dampening, wd) = momentum·buf + dampening·(g + wd·p) as a kernel",
    (
        rule(
            [f"(= t {term('momentum_buffer', 'buf', 'g', 'p', 'momentum', 'dampening', 'wd')})", "(= s (shape t))"],
            '(union t (Kernel (PBinary "add" (PBinary "mul" (Load momentum) (Load buf)) '
            f'(PBinary "mul" (Load dampening) {decayed("(Load g)")})) s))',
        ),
    ),
)


def binary(op: str, a: str, b: str) -> str:
    return f'(PBinary "{op}" {a} {b})'


def moment_term(order: int) -> str:
    """adam_moment's body: torch's lerp(m, g′, w) (order 1; its two forms picked by w < 0.5) or
    m·β + (w·g′)·g′ (order 2), as ir/ops/optimizer.py evaluates them."""
    grad, m, w = decayed("(Load g)"), "(Load m)", "(Load w)"
    if order == 2:
        return binary("add", binary("mul", m, "(Load beta)"), binary("mul", binary("mul", w, grad), grad))
    step = binary("sub", grad, m)
    small = binary("add", m, binary("mul", w, step))
    large = binary("sub", grad, binary("mul", step, binary("sub", "(Lit 1.0)", w)))
    return f'(PTernary "where" {binary("less", w, "(Lit 0.5)")} {small} {large})'


LIFT_ADAM_MOMENT = Rule(
    "lift_adam_moment",
    FAMILY,
    "adam_moment(m, g, p, beta, w, wd) = lerp(m, g′, w) or m·β + (w·g′)·g′, g′ = g + wd·p, as a kernel",
    tuple(
        rule(
            [f"(= t {term('adam_moment', 'm', 'g', 'p', 'beta', 'w', 'wd', order=str(order))})", "(= s (shape t))"],
            f"(union t (Kernel {moment_term(order)} s))",
        )
        for order in (1, 2)
    ),
)

LIFT_ADAMAX_NORM = Rule(
    "lift_adamax_norm",
    FAMILY,
    "adamax_norm(u, g, p, beta2, eps, wd) = maximum(u·β₂, |g′| + eps), g′ = g + wd·p, as a kernel",
    (
        rule(
            [f"(= t {term('adamax_norm', 'u', 'g', 'p', 'beta', 'eps', 'wd')})", "(= s (shape t))"],
            "(union t (Kernel "
            + binary(
                "maximum",
                binary("mul", "(Load u)", "(Load beta)"),
                binary("add", f'(PUnary "abs" {decayed("(Load g)")})', "(Load eps)"),
            )
            + " s))",
        ),
    ),
)

LIFT_ADADELTA_DELTA = Rule(
    "lift_adadelta_delta",
    FAMILY,
    "adadelta_delta(g, p, s, acc, eps, wd) = (√(acc + eps)/√(s + eps))·g′, g′ = g + wd·p, as a kernel",
    (
        rule(
            [f"(= t {term('adadelta_delta', 'g', 'p', 'sq', 'acc', 'eps', 'wd')})", "(= s (shape t))"],
            "(union t (Kernel "
            + binary(
                "mul",
                binary(
                    "div",
                    f'(PUnary "sqrt" {binary("add", "(Load acc)", "(Load eps)")})',
                    f'(PUnary "sqrt" {binary("add", "(Load sq)", "(Load eps)")})',
                ),
                decayed("(Load g)"),
            )
            + " s))",
        ),
    ),
)

REGENERATE_RANDOM = Rule(
    "regenerate_random",
    FAMILY,
    "a random tensor is a kernel that loads its draw, philox(state), which a kernel reading it computes at "
    "each element's index: inlined, its consumers draw it again (the backward regenerates a dropout mask)",
    (
        rule(
            f"(= t {term('rand', 'st', shape='s', stream='k', normal='n')})",
            f"(union t (Kernel (Load {term('philox', 'st', shape='s', stream='k', normal='n')}) s))",
        ),
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
    LIFT_ADAMAX_NORM,
    LIFT_ADADELTA_DELTA,
    REGENERATE_RANDOM,
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
    "MomentumBuffer",
    "AdamMoment",
    "AdamaxNorm",
    "AdadeltaDelta",
    "Rand",
)
