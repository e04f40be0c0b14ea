"""The matmul family: matmuls become kernels with an epilogue, and elementwise consumers fold in.

`lift_matmul`: matmul(a, b, ta, tb) ≡ (MatmulKernel a b ta tb (Acc)), the epilogue `$acc`.

`matmul_epilogue`: a pointwise kernel of the matmul's shape whose body loads the matmul's result t
(anywhere in the body) is the matmul kernel with that body as its epilogue, t's loads replaced by
t's own epilogue: (Kernel F s), t ≡ (MatmulKernel a b ta tb E), (shape t) = s →
(MatmulKernel a b ta tb F[(Load t) := E]). Pointwise kernels are lifted one op at a time and
inlined into each other (`pointwise.py`), so applying it again absorbs whole chains: the bias add
and then the activation of a linear layer (forward), the relu mask multiply on dX = g·Wᵀ
(backward), an optimizer update of a weight gradient (SGD's p − lr·g, whose g is not at the root
of the update's body), a fused pointwise kernel of an already optimized graph.

Guard: the kernel has the matmul's shape (`s` is both the kernel's shape and `(shape t)`), so
every other tensor of the body broadcasts into the matmul's result and never enlarges it ([M,1]
+ [N] is [M,N], which a matmul kernel producing [M,1] cannot compute).

The substitution is spelled out by two helper rules:
- `matmul_mentions`: (mentions p t) for every Pw class p that loads t, directly or below;
- `matmul_substitute`: (Replace p t E) ≡ p with t's loads replaced by E, one Pw node at a time
  (only below children that mention t; where both operands of a binary op mention t, the
  variants replacing one side only are kept too: they still read t and are sound).

Not done: RMSNorm folded into the matmul's A-operand load (the seed kernel `matmul_rms_norm`).
It needs a matmul *prologue* in the IR (fused_matmul reading A through an expression of per-row
values: A'[i,k] = A[i,k]·r[i]·w[k]).
"""

from __future__ import annotations

from meganeura.rewrite.rules import Rule, rule

FAMILY = "matmul"

LIFT_MATMUL = Rule(
    "lift_matmul",
    FAMILY,
    "a matmul is a matmul kernel with the epilogue $acc",
    (rule("(= t (Matmul a b ta tb))", "(union t (MatmulKernel a b ta tb (Acc)))"),),
)

MATMUL_MENTIONS = Rule(
    "matmul_mentions",
    FAMILY,
    "which Pw classes load a matmul kernel's result (helper of matmul_epilogue)",
    (
        rule(["(= l (Load t))", "(= t (MatmulKernel a b ta tb e))"], "(mentions l t)"),
        rule(["(mentions p t)", "(= q (PUnary f p))"], "(mentions q t)"),
        rule(["(mentions p t)", "(= q (PBinary f p r))"], "(mentions q t)"),
        rule(["(mentions p t)", "(= q (PBinary f r p))"], "(mentions q t)"),
    ),
)

MATMUL_EPILOGUE = Rule(
    "matmul_epilogue",
    FAMILY,
    "a pointwise kernel of a matmul's shape reading its result becomes the matmul's epilogue",
    (
        rule(
            ["(= k (Kernel body s))", "(mentions body t)", "(= t (MatmulKernel a b ta tb e))", "(= s (shape t))"],
            "(union k (MatmulKernel a b ta tb (Replace body t e)))",
        ),
    ),
)

MATMUL_SUBSTITUTE = Rule(
    "matmul_substitute",
    FAMILY,
    "Replace(p, t, E): p with the loads of t replaced by E (helper of matmul_epilogue)",
    (
        rule("(= r (Replace (Load t) t e))", "(union r e)"),
        rule(["(= r (Replace (PUnary f p) t e))", "(mentions p t)"], "(union r (PUnary f (Replace p t e)))"),
        rule(["(= r (Replace (PBinary f p q) t e))", "(mentions p t)"], "(union r (PBinary f (Replace p t e) q))"),
        rule(["(= r (Replace (PBinary f p q) t e))", "(mentions q t)"], "(union r (PBinary f p (Replace q t e)))"),
        rule(
            ["(= r (Replace (PBinary f p q) t e))", "(mentions p t)", "(mentions q t)"],
            "(union r (PBinary f (Replace p t e) (Replace q t e)))",
        ),
    ),
)

RULES = [LIFT_MATMUL, MATMUL_EPILOGUE, MATMUL_MENTIONS, MATMUL_SUBSTITUTE]
