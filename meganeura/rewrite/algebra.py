"""The algebra family: layout and constant rewrites that remove work without fusing kernels.

- `fold_transpose_a`, `fold_transpose_b`: a matmul operand that is a transpose of its last two
  dims is read transposed instead: matmul(permute(a, swap), b, ta, tb) → matmul(a, b, ¬ta, tb)
  (one variant per rank 2…6). `F.linear` traces x·permute(W), autodiff emits transposed
  weights: the permute kernels vanish.
- `transpose_product`: (A·B)ᵀ = Bᵀ·Aᵀ, permute(matmul(a, b, ta, tb), swap) → matmul(b, a, ¬tb, ¬ta)
  (the weight gradient of `F.linear` is a transposed product).
- `compose_permutes`: permute(permute(x, p), q) → permute(x, p∘q); `cancel_permutes`: → x when
  p∘q is the identity. Permutations are text attributes, so the encoder fills the tables
  `perm_compose`/`perm_inverse` for the pairs the graph actually stacks (`permutation_facts`).
- `merge_reshapes`: reshape(reshape(x, s1), s2) → reshape(x, s2); `drop_reshape`: reshape(x, s)
  → x when x already has shape s.
- `fold_constants`: an elementwise op on scalar constants → the constant (add, sub, mul, div,
  neg), computed in f64 by egglog.
- `mul_one`, `add_zero`, `sub_zero`, `div_one`: x·1, 1·x, x+0, 0+x, x−0, x/1 → x, guarded so
  the result keeps x's shape (x + 0 with x [3] and 0 [4,3] broadcasts up: not rewritten).

Common subexpressions need no rule: the encoder adds each IR node as a term, and egglog's
hash-consing puts identical terms (same op, attributes and input classes) in one e-class; the
report counts the IR nodes merged that way (`RewriteReport.cse_merged`).
"""

from __future__ import annotations

from meganeura.ir.graph import Graph
from meganeura.rewrite.rules import Rule, rule
from meganeura.rewrite.sorts import ints, swap_last_two

FAMILY = "algebra"
MATMUL_RANKS = range(2, 7)


def swap_text(rank: int) -> str:
    return ints(swap_last_two(rank))


FOLD_TRANSPOSE_A = Rule(
    "fold_transpose_a",
    FAMILY,
    "matmul(permute(a, swap last two), b, ta, tb) → matmul(a, b, not ta, tb)",
    tuple(
        rule(f"(= t (Matmul (Permute a {swap_text(r)}) b ta tb))", "(union t (Matmul a b (not ta) tb))")
        for r in MATMUL_RANKS
    ),
)

FOLD_TRANSPOSE_B = Rule(
    "fold_transpose_b",
    FAMILY,
    "matmul(a, permute(b, swap last two), ta, tb) → matmul(a, b, ta, not tb)",
    tuple(
        rule(f"(= t (Matmul a (Permute b {swap_text(r)}) ta tb))", "(union t (Matmul a b ta (not tb)))")
        for r in MATMUL_RANKS
    ),
)

TRANSPOSE_PRODUCT = Rule(
    "transpose_product",
    FAMILY,
    "permute(matmul(a, b, ta, tb), swap last two) → matmul(b, a, not tb, not ta)",
    tuple(
        rule(f"(= t (Permute (Matmul a b ta tb) {swap_text(r)}))", "(union t (Matmul b a (not tb) (not ta)))")
        for r in MATMUL_RANKS
    ),
)

COMPOSE_PERMUTES = Rule(
    "compose_permutes",
    FAMILY,
    "permute(permute(x, p), q) → permute(x, p∘q)",
    (rule(["(= t (Permute (Permute x p) q))", "(= r (perm_compose p q))"], "(union t (Permute x r))"),),
)

CANCEL_PERMUTES = Rule(
    "cancel_permutes",
    FAMILY,
    "permute(permute(x, p), q) → x when p∘q is the identity",
    # No subsume: when x is itself a permute of what the pair cancels to (w, wᵀ, (wᵀ)ᵀ, ((wᵀ)ᵀ)ᵀ),
    # the node to subsume is congruent to x's only e-node, and x's class would be left empty (found
    # by tests/test_fuzz.py). The cost model never picks a pair of copies over x.
    (rule(["(= t (Permute (Permute x p) q))", "(perm_inverse p q)"], "(union t x)"),),
)

MERGE_RESHAPES = Rule(
    "merge_reshapes",
    FAMILY,
    "reshape(reshape(x, s1), s2) → reshape(x, s2)",
    (rule("(= t (Reshape (Reshape x s1) s2))", "(union t (Reshape x s2))"),),
)

DROP_RESHAPE = Rule(
    "drop_reshape",
    FAMILY,
    "reshape(x, s) → x when x has shape s",
    (rule(["(= t (Reshape x s))", "(= s (shape x))"], ["(union t x)", "(subsume (Reshape x s))"]),),
)

EGGLOG_F64 = {"add": "+", "sub": "-", "mul": "*", "div": "/"}

FOLD_CONSTANTS = Rule(
    "fold_constants",
    FAMILY,
    "add/sub/mul/div of two scalar constants, and neg of one → the constant",
    (
        *(
            rule(
                f'(= t (Binary "{fn}" (Const a) (Const b)))',
                [f"(union t (Const ({op} a b)))", f'(subsume (Binary "{fn}" (Const a) (Const b)))'],
            )
            for fn, op in EGGLOG_F64.items()
        ),
        rule('(= t (Unary "neg" (Const a)))', ["(union t (Const (neg a)))", '(subsume (Unary "neg" (Const a)))']),
    ),
)


def identity_rule(name: str, doc: str, patterns: list[str]) -> Rule:
    """x op c → x for each pattern (a Binary term over x), when x already has the result's shape."""
    return Rule(
        name,
        FAMILY,
        doc,
        tuple(
            rule([f"(= t {pattern})", "(= s (shape t))", "(= s (shape x))"], ["(union t x)", f"(subsume {pattern})"])
            for pattern in patterns
        ),
    )


MUL_ONE = identity_rule("mul_one", "x·1 and 1·x → x", ['(Binary "mul" x (Const 1.0))', '(Binary "mul" (Const 1.0) x)'])
ADD_ZERO = identity_rule(
    "add_zero", "x+0 and 0+x → x", ['(Binary "add" x (Const 0.0))', '(Binary "add" (Const 0.0) x)']
)
SUB_ZERO = identity_rule("sub_zero", "x−0 → x", ['(Binary "sub" x (Const 0.0))'])
DIV_ONE = identity_rule("div_one", "x/1 → x", ['(Binary "div" x (Const 1.0))'])

RULES = [
    FOLD_TRANSPOSE_A,
    FOLD_TRANSPOSE_B,
    TRANSPOSE_PRODUCT,
    COMPOSE_PERMUTES,
    CANCEL_PERMUTES,
    MERGE_RESHAPES,
    DROP_RESHAPE,
    FOLD_CONSTANTS,
    MUL_ONE,
    ADD_ZERO,
    SUB_ZERO,
    DIV_ONE,
]


def compose(p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, ...]:
    """The single permutation equal to permuting by p, then by q (np.transpose semantics)."""
    return tuple(p[i] for i in q)


def permutation_facts(graph: Graph, node_ids: list[int]) -> list[str]:
    """`perm_compose`/`perm_inverse` facts for every pair of permutations the graph stacks.

    For each chain of permutes x → p1 → p2 → … in the graph, every split of every contiguous
    run (the composition of one part, then of the next) gets a fact, so that the rules can
    collapse the whole chain.
    """
    facts: dict[tuple[tuple[int, ...], tuple[int, ...]], None] = {}
    wanted = set(node_ids)
    for node_id in node_ids:
        node = graph[node_id]
        if node.op != "permute":
            continue
        chain = [tuple(node.attr("perm"))]
        below = graph[node.inputs[0]]
        while below.op == "permute" and below.id in wanted:
            chain.insert(0, tuple(below.attr("perm")))
            below = graph[below.inputs[0]]
        if len(chain) < 2:
            continue
        for start in range(len(chain)):
            for end in range(start + 2, len(chain) + 1):
                for split in range(start + 1, end):
                    first = chain[start]
                    for perm in chain[start + 1 : split]:
                        first = compose(first, perm)
                    second = chain[split]
                    for perm in chain[split + 1 : end]:
                        second = compose(second, perm)
                    facts[(first, second)] = None
    lines = []
    for first, second in facts:
        combined = compose(first, second)
        if combined == tuple(range(len(combined))):
            lines.append(f"(perm_inverse {ints(first)} {ints(second)})")
        else:
            lines.append(f"(set (perm_compose {ints(first)} {ints(second)}) {ints(combined)})")
    return lines
