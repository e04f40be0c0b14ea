"""The matmul family: matmuls become kernels with an epilogue, elementwise consumers fold in, and
an elementwise producer of operand A folds into A's load (a prologue).

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

`matmul_prologue`: the mirror image, on the A operand: (MatmulKernel a b ta tb E), a ≡ (Kernel F s),
(shape a) = s → (MatmulPrologue F s b ta tb E), a matmul kernel that computes A's elements with F
while it stages them, so that A is never written (IR: `fused_matmul(x, b, extras…,
prologue=…)`, the prologue an expression of `$a`, the element of x, and extras broadcast to A's
stored shape). RMSNorm → Linear: the reductions family makes r = rsqrt(mean(x²) + eps) one
[M, 1] kernel, and x·r·w (F, inlined by `fuse_pointwise`) becomes the prologue, as in the seed
kernel `matmul_rms_norm`. It applies after `matmul_epilogue` too (it matches every matmul kernel
of the class), so one kernel can have both ends. Whether the plan uses it is the cost model's
call: extraction always inlines F into the prologue (recomputing A from F's inputs, reading them
instead of A), and keeps A stored where something else needs it (a graph output, the B operand of
the weight gradient in training) and reading A is cheaper than recomputing it.

Guard: F has A's stored shape (`s` is both the kernel's shape and `(shape a)`); extraction
further requires one of F's loads to have that full shape (it becomes `$a`, the matmul's A
input), so a broadcast-only body (an outer product) is never a prologue.

`matmul_prologue_rows`: the same through the reshape with which a Linear on [batch, seq,
features] flattens its input to rows: a ≡ (Reshape k s2) that keeps the last dim and merges the
others (fact `(flattens_rows a)`), k ≡ (Kernel F s) → (MatmulPrologue F s b ta tb E) with s the
kernel's own shape: the kernel computes F over s and reads A as the matrix of its rows (IR:
`fused_matmul(…, flatten_a=True)`), so F's loads keep broadcasting over s. RMSNorm → the q/k/v
projections of a transformer layer.
"""

from __future__ import annotations

from meganeura.ir.graph import Graph
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

MATMUL_PROLOGUE = Rule(
    "matmul_prologue",
    FAMILY,
    "a pointwise kernel producing a matmul's A operand (of A's shape) becomes the matmul's prologue",
    (
        rule(
            ["(= t (MatmulKernel a b ta tb e))", "(= a (Kernel f s))", "(= s (shape a))"],
            "(union t (MatmulPrologue f s b ta tb e))",
        ),
    ),
)

MATMUL_PROLOGUE_ROWS = Rule(
    "matmul_prologue_rows",
    FAMILY,
    "a pointwise kernel whose rows (flattened) are a matmul's A operand becomes the matmul's prologue",
    (
        rule(
            [
                "(= t (MatmulKernel a b ta tb e))",
                "(= a (Reshape k rows))",
                "(flattens_rows a)",
                "(= k (Kernel f s))",
                "(= s (shape k))",
            ],
            "(union t (MatmulPrologue f s b ta tb e))",
        ),
    ),
)

RULES = [LIFT_MATMUL, MATMUL_EPILOGUE, MATMUL_MENTIONS, MATMUL_SUBSTITUTE, MATMUL_PROLOGUE, MATMUL_PROLOGUE_ROWS]

DECLARATIONS = """(relation flattens_rows (Term))
"""


def facts(graph: Graph, node_ids: list[int]) -> list[str]:
    """`(flattens_rows r)` for the reshapes among `node_ids` of a tensor of rank > 2 to [rows, last dim]."""
    lines = []
    for node_id in node_ids:
        node = graph[node_id]
        if node.op != "reshape" or node.type.rank != 2:
            continue
        source = graph[node.inputs[0]].type
        if source.rank > 2 and node.shape[-1] == source.shape[-1]:
            lines.append(f"(flattens_rows (Ref {node_id}))")
    return lines
