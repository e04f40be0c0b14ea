"""The reductions family: sum/max become reduction kernels with a prologue and an epilogue.

`lift_reduce`: sum/max(x) ≡ (ReduceKernel kind axes keepdim in_shape (Load x) (R)). The prologue
is a Pw body, so the pointwise rule `fuse_pointwise` inlines what feeds the reduction (Σx² reads x
once, with no x² kernel). The epilogue rules fold an elementwise op of the reduction's result, one
op at a time (so chains fold): mean = sum·(1/n) becomes one kernel, and so does
rsqrt(mean(x²) + eps) of RMSNorm.

- `reduce_epilogue_unary`: (Kernel f((Load t)) s), t ≡ a reduction kernel with epilogue E → epilogue f(E)
- `reduce_epilogue_literal`: g((Load t), literal) and g(literal, (Load t)) → epilogue g(E, literal)
- `reduce_epilogue_tensor`: g((Load t), (Load x)) and g((Load x), (Load t)) → epilogue g(E, (Load x)),
  x read at the output element (it broadcasts to the kernel's shape, which is the reduction's),
  for t the sum over axis 0 of partials [S, *out] (`PARTS_SUM`): the residual added to a split
  product's sum, the bias and then the activation after it. Other reductions are left out: in
  an 8-layer SmolLM2 step the rule matched 186 times over all reductions and 17 were kept, all
  sums of partials, and the alternatives cost extraction 1.3 → 2.2 s on the 30-layer step (each
  made the classes its epilogue reads candidates for compound moves, extract.py
  `prologue_readers`); over sums of partials alone, 50 matches and 1.36 s.

Guard: the kernel has the reduction's output shape. A split reduction's partials keep the
epilogue $r (`split_reduce` takes only those): an extra has the output's shape, not theirs.

Two-level reductions. `split_reduce`: a reduction kernel with the epilogue $r, t ≡ (ReduceKernel
kind axes keep i pro (R)), is also the reduction over axis 0 of its partials (ReduceSplit kind
axes keep i S pro (R)) [S, *out], each partial reducing one part of the reduced elements (the
prologue stays fused into the partials). The combine is then an ordinary reduction: lift_reduce
makes it a kernel and the epilogue rules fold the reduction's epilogue into it (mean's 1/n,
RMSNorm's rsqrt). Guard `(reduce_split i axes keep S p)`, a target fact (`target_facts`): a
reduction of shape i over axes is split into S parts on this target, the partials of shape p;
there is one only where the reduction leaves compute units idle (`codegen.reduce.reduce_splits`).
The cost model decides: the split pays an extra kernel and the partials' traffic for the units it
fills. (The split is an IR rewrite rather than two dispatches of one kernel so that the partials
are an ordinary tensor: buffer plan, interpreter and cost model all see them; codegen/reduce.py.)

Softmax + cross-entropy. `F.cross_entropy` traces as the user would write it,
nll_loss(log_softmax(x, 1), y) = neg(pick(log_softmax(x, 1), y)), and autodiff gives its gradient
as log_softmax_grad(log_softmax(x, 1), scatter_rows(neg(h), y, C), 1) (h: the gradient of the
loss rows; pick's VJP is scatter_rows, neg's is neg). Two rules fuse them into the
cross-entropy kernels, which never write the [B, C] log-probabilities nor the one-hot scatter:

- `cross_entropy_forward`: neg(pick(log_softmax(x, 1), y)) → cross_entropy_rows(x, y);
- `cross_entropy_backward`: log_softmax_grad(log_softmax(x, 1), scatter_rows(neg(h), y, C), 1)
  → cross_entropy_rows_grad(x, y, h), since g − softmax(x)·Σg with g = −h·onehot(y) is
  (softmax(x) − onehot(y))·h.

Each fused op carries the `ignore_index` of the pick (forward) or scatter_rows (backward) it
replaces: a row with that label is 0 forward and a row of zeros backward on both sides.

Guards: the log_softmax is over axis 1 of a [B, C] tensor, the class axis (pick and
cross_entropy_rows take [B, C] values and [B] labels, so axis 1 is also the only one for which
the rules are sound; log_softmax over the batch axis never matches), and the log_softmax_grad is
over the same axis. Shapes agree by the op table: pick's labels are [B], scatter_rows's output is
the log_softmax_grad's [B, C], and neg keeps h's shape [B]. Labels need not be the forward's:
each identity holds for any labels (a bad label gives NaN rows on both sides). Both rules only add
an alternative: when the log-probabilities are needed anyway (an output, or read by another op)
the plan still computes them, and cost decides which kernels to run.
"""

from __future__ import annotations

from meganeura.codegen.reduce import reduce_splits
from meganeura.ir.graph import Graph
from meganeura.rewrite.rules import Rule, rule
from meganeura.rewrite.sorts import boolean, ints
from meganeura.target import Target

FAMILY = "reductions"

LIFT_REDUCE = Rule(
    "lift_reduce",
    FAMILY,
    "a sum/max is a reduction kernel with the prologue (Load x) and the epilogue $r",
    (
        rule(
            ["(= t (Reduce kind x axes keep))", "(= i (shape x))"],
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

# The sum over axis 0 of partials [S, *out] (of a split product, weight gradient or reduction):
# the reductions whose result a residual or a bias is added to. Why only these: every other
# reduction the rule matched too (186 matches in an 8-layer SmolLM2 step, 17 kept), and each
# alternative made extraction try compound moves on what its epilogue reads (module docstring).
PARTS_SUM = ['(= t (ReduceKernel "sum" "0" false i pro e))', "(= s (shape t))"]

REDUCE_EPILOGUE_TENSOR = Rule(
    "reduce_epilogue_tensor",
    FAMILY,
    "an elementwise binary op of a reduction's result and a tensor of (or broadcast to) its shape joins its epilogue",
    (
        rule(
            ["(= k (Kernel (PBinary f (Load t) (Load x)) s))", *PARTS_SUM],
            '(union k (ReduceKernel "sum" "0" false i pro (PBinary f e (Load x))))',
        ),
        rule(
            ["(= k (Kernel (PBinary f (Load x) (Load t)) s))", *PARTS_SUM],
            '(union k (ReduceKernel "sum" "0" false i pro (PBinary f (Load x) e)))',
        ),
    ),
)

SPLIT = "(ReduceSplit kind axes keep i n pro (R))"
SPLIT_REDUCE = Rule(
    "split_reduce",
    FAMILY,
    "a long reduction with few outputs is a reduction of partial reductions over parts of it (two levels)",
    (
        rule(
            ["(= t (ReduceKernel kind axes keep i pro (R)))", "(reduce_split i axes keep n p)"],
            [f"(set (shape {SPLIT}) p)", f'(union t (Reduce kind {SPLIT} "0" false))'],
        ),
    ),
)

CROSS_ENTROPY_FORWARD = Rule(
    "cross_entropy_forward",
    FAMILY,
    "neg(pick(log_softmax(x, 1), y)) → cross_entropy_rows(x, y): nll_loss of log_softmax in one kernel",
    (
        rule(
            ['(= t (Unary "neg" p))', "(= p (Pick l y ignore))", "(= l (LogSoftmax x 1))"],
            "(union t (CrossEntropyRows x y ignore))",
        ),
    ),
)

CROSS_ENTROPY_BACKWARD = Rule(
    "cross_entropy_backward",
    FAMILY,
    "log_softmax_grad(log_softmax(x, 1), scatter_rows(neg(h), y, C), 1) → cross_entropy_rows_grad(x, y, h)",
    (
        rule(
            [
                "(= t (LogSoftmaxGrad l s 1))",
                "(= l (LogSoftmax x 1))",
                "(= s (ScatterRows n y c ignore))",
                '(= n (Unary "neg" h))',
            ],
            "(union t (CrossEntropyRowsGrad x y h ignore))",
        ),
    ),
)

RULES = [
    LIFT_REDUCE,
    REDUCE_EPILOGUE_UNARY,
    REDUCE_EPILOGUE_LITERAL,
    REDUCE_EPILOGUE_TENSOR,
    SPLIT_REDUCE,
    CROSS_ENTROPY_FORWARD,
    CROSS_ENTROPY_BACKWARD,
]

DECLARATIONS = """(relation reduce_split (String String bool i64 String))
"""


def reduced_in_shape(graph: Graph, node) -> tuple[int, ...] | None:
    """The shape a reduction node reduces (None for other nodes and for split partials)."""
    if node.op in ("sum", "max"):
        return graph[node.inputs[0]].shape
    if node.op == "fused_reduce" and node.attr("splits") == 1:
        return tuple(node.attr("in_shape"))
    return None


def target_facts(graph: Graph, node_ids: list[int], target: Target) -> list[str]:
    """`(reduce_split i axes keep S p)` for each reduction of the encoded nodes that `target`
    splits (`codegen.reduce.reduce_splits`)."""
    lines = []
    for node_id in node_ids:
        node = graph[node_id]
        in_shape = reduced_in_shape(graph, node)
        if in_shape is None:
            continue
        splits = reduce_splits(in_shape, node.attr("axes"), target)
        if splits > 1:
            keep = boolean(node.attr("keepdim"))
            partials = ints((splits, *node.shape))
            lines.append(f"(reduce_split {ints(in_shape)} {ints(node.attr('axes'))} {keep} {splits} {partials})")
    return list(dict.fromkeys(lines))
