"""The matmul family: matmuls become kernels with an epilogue, elementwise consumers fold in, and
an elementwise producer of operand A folds into A's load (a prologue).

`lift_matmul`: matmul(a, b, ta, tb) ≡ (MatmulKernel a b ta tb (Acc)), the epilogue `$acc`.

`matmul_epilogue`: a pointwise kernel of the matmul's shape whose body loads the result t of a
plain matmul kernel (epilogue `$acc`; anywhere in the body, at most `MENTION_DEPTH` calls deep)
is that matmul kernel with the body as its epilogue, t's loads replaced by `$acc`:
(Kernel F s), t ≡ (MatmulKernel a b ta tb (Acc)), (shape t) = s →
(MatmulKernel a b ta tb F[(Load t) := (Acc)]). Pointwise kernels are lifted one op at a time and
inlined into each other (`pointwise.py`): the body class of a kernel already holds its producers
inlined, so one application absorbs a whole chain: the bias add and then the activation of a
linear layer (forward), the relu mask multiply on dX = g·Wᵀ (backward), an optimizer update of a
weight gradient (SGD's p − lr·g, whose g is not at the root of the update's body), a fused
pointwise kernel of an already optimized graph. Absorbing into a kernel that already has an
epilogue would add nothing the chain does not give, and through a residual stream it would give
every class a form per matmul upstream (see `matmul_mentions`).

Guard: the kernel has the matmul's shape (`s` is both the kernel's shape and `(shape t)`), so
every other tensor of the body broadcasts into the matmul's result and never enlarges it ([M,1]
+ [N] is [M,N], which a matmul kernel producing [M,1] cannot compute).

The substitution is spelled out by two helper rules:
- `matmul_mentions`: (mentions p t) = d for every Pw class p that loads t, directly (d = 0) or
  d ≤ `MENTION_DEPTH` Pw calls below (the least such d). The bound keeps the e-graph linear in
  the graph: a body class holds every way to compute it, its producers inlined down the chain
  (`pointwise.py`), so without it the gradient of a residual stream, g_i = m_i + g_{i+1}, would
  mention every matmul m_j (j ≥ i) of the blocks after it, and each g_i would gain a matmul
  kernel form per later block (O(depth²) e-nodes, measured: 50 residual blocks, 93 s of
  extraction). The consumer chains an epilogue absorbs in practice (bias, activation, a mask,
  an optimizer formula with weight decay) are at most 4 calls deep;
- `matmul_substitute`: (Replace p t E) ≡ p with t's loads replaced by E (here `$acc`), one Pw node at a time
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
features] flattens its input to rows: a ≡ (Reshape k rows) where reshaping k's shape s to rows
keeps the last dim and merges the others (fact `(flattens_rows s rows)`, of the two shapes), k ≡
(Kernel F s) → (MatmulPrologue F s b ta tb E) with s the kernel's own shape: the kernel computes
F over s and reads A as the matrix of its rows (IR: `fused_matmul(…, flatten_a=True)`), so F's
loads keep broadcasting over s. RMSNorm → the q/k/v projections of a transformer layer.

`matmul_split_k`: a plain matmul kernel t whose output has too few tiles to fill the target's
compute units over a long reduction (a weight gradient xᵀ·g over 2048 tokens with a 576×192
output: 54 tiles for 132 SMs; the tied LM head's input gradient, 2048×576 over K = 49152) is
also the sum over axis 0 of its S partial products along K, (Reduce "sum" (MatmulSplit a b ta
tb S) "0" false): S times the workgroups, S·M·N partials written and summed after (IR:
`fused_matmul(…, splits=S)`, then the reductions family's kernels). Guard: the target fact
`(matmul_split t S p)` (`target_facts`, from `codegen.matmul.matmul_splits`: S > 1 where the
largest tile of the target's table leaves units idle, each part at least a few hundred long), p
the partials' shape; made for each traced matmul and for each transpose of one, whose e-class
holds the transposed product (`transpose_product`: a weight gradient splits in the orientation
its optimizer update reads). The split has no epilogue of its own: consumers fuse into the sum. Whether
the plan splits is the cost model's call (the fill of the units against the partials' traffic).
"""

from __future__ import annotations

import math

from meganeura.codegen.matmul import matmul_splits
from meganeura.ir.graph import Graph
from meganeura.ir.ops.matmul import matmul_dims
from meganeura.rewrite.rules import Rule, rule
from meganeura.rewrite.sorts import ints, swap_last_two
from meganeura.target import Target

FAMILY = "matmul"

LIFT_MATMUL = Rule(
    "lift_matmul",
    FAMILY,
    "a matmul is a matmul kernel with the epilogue $acc",
    (rule("(= t (Matmul a b ta tb))", "(union t (MatmulKernel a b ta tb (Acc)))"),),
)

# How deep an epilogue reaches: a Pw class mentions t when a load of t lies at most this many Pw
# calls below it (see the module docstring).
MENTION_DEPTH = 4

# A Pw call mentions t when one of its operands does: one variant per operand position.
MENTIONED_BY = (
    "(PUnary f p)",
    "(PBinary f p r)",
    "(PBinary f r p)",
    "(PTernary f p r u)",
    "(PTernary f r p u)",
    "(PTernary f r u p)",
)

MATMUL_MENTIONS = Rule(
    "matmul_mentions",
    FAMILY,
    "which Pw classes load a matmul kernel's result (helper of matmul_epilogue)",
    (
        rule(["(= l (Load t))", "(= t (MatmulKernel a b ta tb (Acc)))"], "(set (mentions l t) 0)"),
        *(
            rule(["(= d (mentions p t))", f"(< d {MENTION_DEPTH})", f"(= q {call})"], "(set (mentions q t) (+ d 1))")
            for call in MENTIONED_BY
        ),
    ),
)

MATMUL_EPILOGUE = Rule(
    "matmul_epilogue",
    FAMILY,
    "a pointwise kernel of a matmul's shape reading its result becomes the matmul's epilogue",
    (
        rule(
            [
                "(= k (Kernel body s))",
                "(= d (mentions body t))",
                "(= t (MatmulKernel a b ta tb (Acc)))",
                "(= s (shape t))",
            ],
            "(union k (MatmulKernel a b ta tb (Replace body t (Acc))))",
        ),
    ),
)


def substitutions(call: str, operands: tuple[str, ...]) -> list[str]:
    """Replace(call(f, operands…), t, e) → call(f, …) with the operands in each nonempty subset that
    mention t replaced (the subsets that leave a mentioning operand alone are sound too: they still
    read t); one rule per subset."""
    variants = []
    for mask in range(1, 1 << len(operands)):
        chosen = [name for index, name in enumerate(operands) if mask >> index & 1]
        replaced = " ".join(f"(Replace {name} t e)" if name in chosen else name for name in operands)
        query = [
            f"(= r (Replace ({call} f {' '.join(operands)}) t e))",
            *(f"(= d{name} (mentions {name} t))" for name in chosen),
        ]
        variants.append(rule(query, f"(union r ({call} f {replaced}))"))
    return variants


MATMUL_SUBSTITUTE = Rule(
    "matmul_substitute",
    FAMILY,
    "Replace(p, t, E): p with the loads of t replaced by E (helper of matmul_epilogue)",
    (
        rule("(= r (Replace (Load t) t e))", "(union r e)"),
        *substitutions("PUnary", ("p",)),
        *substitutions("PBinary", ("p", "q")),
        *substitutions("PTernary", ("p", "q", "u")),
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
                "(= k (Kernel f s))",
                "(= s (shape k))",
                "(flattens_rows s rows)",
            ],
            "(union t (MatmulPrologue f s b ta tb e))",
        ),
    ),
)

SPLIT = "(MatmulSplit a b ta tb n)"
MATMUL_SPLIT_K = Rule(
    "matmul_split_k",
    FAMILY,
    "a matmul with too few output tiles for the GPU is the sum of its partial products along K (split-K)",
    (
        rule(
            ["(= t (MatmulKernel a b ta tb (Acc)))", "(matmul_split t n p)"],
            [f"(set (shape {SPLIT}) p)", f'(union t (Reduce "sum" {SPLIT} "0" false))'],
        ),
    ),
)

RULES = [
    LIFT_MATMUL,
    MATMUL_EPILOGUE,
    MATMUL_MENTIONS,
    MATMUL_SUBSTITUTE,
    MATMUL_PROLOGUE,
    MATMUL_PROLOGUE_ROWS,
    MATMUL_SPLIT_K,
]

DECLARATIONS = """(relation flattens_rows (String String))
(relation matmul_split (Term i64 String))
"""


def facts(graph: Graph, node_ids: list[int]) -> list[str]:
    """`(flattens_rows s rows)` for the reshapes among `node_ids` of a tensor of rank > 2, shape s,
    to [rows, last dim]. The fact names the two shapes, not the reshape's e-class: that class also
    holds other reshapes to the same shape (merge_reshapes makes reshape(g, [24, 1]) of a
    reshape([2, 3, 4] → [2, 3, 4, 1] → [24, 1])), and only one whose source keeps the last dim
    flattens rows."""
    lines = []
    for node_id in node_ids:
        node = graph[node_id]
        if node.op != "reshape" or node.type.rank != 2:
            continue
        source = graph[node.inputs[0]].type
        if source.rank > 2 and node.shape[-1] == source.shape[-1]:
            lines.append(f"(flattens_rows {ints(source.shape)} {ints(node.shape)})")
    return list(dict.fromkeys(lines))


def target_facts(graph: Graph, node_ids: list[int], target: Target) -> list[str]:
    """`(matmul_split m S p)` for each matmul among `node_ids` that `target` would split into S > 1
    parts along K (`codegen.matmul.matmul_splits`), p the partials' shape [S, *batch, M, N]; and
    for each transpose of a matmul's result among them (swapping its last two dims), the same
    fact for the transposed product that `transpose_product` puts in its e-class, Bᵀ·Aᵀ: a
    Linear's weight gradient is traced as the transpose of xᵀ·g, and without the fact only that
    orientation could split, so a plan split it and then transposed the sum (a permute kernel
    per weight gradient: the SmolLM2-135M-shaped step on the H200 ran 630 permutes, 510 with
    this fact, and 96.9 ms of GPU time against 98.4, 2026-12-02)."""
    lines = []
    for node_id in node_ids:
        node = graph[node_id]
        product = graph[node.inputs[0]] if node.op == "permute" else node
        if product.op != "matmul" or (node is not product and not swaps_last_two(node)):
            continue
        batch, m, k, n = matmul_dims([graph[i].type for i in product.inputs], product.attr_dict)
        transpose_a, transpose_b = bool(product.attr("transpose_a")), bool(product.attr("transpose_b"))
        if node is not product:  # Bᵀ·Aᵀ: N×M, its A the product's B and its B the product's A, flags flipped
            m, n, transpose_a, transpose_b = n, m, not transpose_b, not transpose_a
        splits = matmul_splits(m, n, k, math.prod(batch), target, transpose_b, transpose_a)
        if splits > 1:
            lines.append(f"(matmul_split (Ref {node_id}) {splits} {ints((splits, *node.shape))})")
    return lines


def swaps_last_two(node) -> bool:
    """Whether a permute node swaps the last two dims of its operand and keeps the rest."""
    perm = tuple(node.attr("perm"))
    return len(perm) >= 2 and perm == swap_last_two(len(perm))
