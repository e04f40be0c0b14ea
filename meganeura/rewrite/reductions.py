"""The reductions family: sum/max become reduction kernels with a prologue and an epilogue.

`lift_reduce`: sum/max(x) ≡ (ReduceKernel kind axes keepdim in_shape (Load x) (R)). The prologue
is a Pw body, so the pointwise rule `fuse_pointwise` inlines what feeds the reduction (Σx² reads x
once, with no x² kernel). The epilogue rules fold an elementwise op of the reduction's result, one
op at a time (so chains fold): mean = sum·(1/n) becomes one kernel, and so does
rsqrt(mean(x²) + eps) of RMSNorm.

- `reduce_epilogue_unary`: (Kernel f((Load t)) s), t ≡ a reduction kernel with epilogue E → epilogue f(E)
- `reduce_epilogue_literal`: g((Load t), literal) and g(literal, (Load t)) → epilogue g(E, literal)

Guard: the kernel has the reduction's output shape. The epilogue of `fused_reduce` reads only
`$r` (no other tensors), hence literals only.

Not done: softmax + cross-entropy (forward and backward) as one kernel: `F.cross_entropy` still
emits the fused `cross_entropy_rows` op, and softmax's max/sub/exp/sum/div chain needs a
reduction whose prologue reads another reduction's result ($r of the max inside the sum's
prologue, an "online softmax" kernel) — an IR op with two chained reductions.
"""

from __future__ import annotations

from meganeura.rewrite.rules import Rule, rule

FAMILY = "reductions"

LIFT_REDUCE = Rule(
    "lift_reduce",
    FAMILY,
    "a sum/max is a reduction kernel with the prologue (Load x) and the epilogue $r",
    (
        rule(
            ["(= t (Reduce kind axes keep x))", "(= i (shape x))"],
            "(union t (ReduceKernel kind axes keep i (Load x) (R)))",
        ),
    ),
)

REDUCTION = ["(= t (ReduceKernel kind axes keep i pro e))", "(= s (shape t))"]

REDUCE_EPILOGUE_UNARY = Rule(
    "reduce_epilogue_unary",
    FAMILY,
    "an elementwise unary op on a reduction's result joins its epilogue",
    (
        rule(
            ["(= k (Kernel (PUnary f (Load t)) s))", *REDUCTION],
            "(union k (ReduceKernel kind axes keep i pro (PUnary f e)))",
        ),
    ),
)

REDUCE_EPILOGUE_LITERAL = Rule(
    "reduce_epilogue_literal",
    FAMILY,
    "an elementwise binary op of a reduction's result and a literal joins its epilogue",
    (
        rule(
            ["(= k (Kernel (PBinary f (Load t) (Lit v)) s))", *REDUCTION],
            "(union k (ReduceKernel kind axes keep i pro (PBinary f e (Lit v))))",
        ),
        rule(
            ["(= k (Kernel (PBinary f (Lit v) (Load t)) s))", *REDUCTION],
            "(union k (ReduceKernel kind axes keep i pro (PBinary f (Lit v) e)))",
        ),
    ),
)

RULES = [LIFT_REDUCE, REDUCE_EPILOGUE_UNARY, REDUCE_EPILOGUE_LITERAL]
