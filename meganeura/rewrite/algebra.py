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
- `join_slice_grads`: slice_grad(x, s, A) + slice_grad(y, s, B) → slice_grad(concat(x, y), s,
  A∪B) when B follows A along one dim (steps 1): the gradient of a tensor split into parts
  (`qkv.split(…)`, `chunk`) is the concatenation of the parts' gradients, one copy, where the
  traced step wrote each part into a zero tensor of the whole and added them up (GPT-2's c_attn:
  three [8, 256, 2304] slice_grads and their sum a layer). `drop_full_slice_grad`:
  slice_grad(x, s, the whole of s) → x; `flatten_concats`: concat(concat(a, b), c) and
  concat(a, concat(b, c)) along one axis → concat(a, b, c). The ranges a graph can join are
  followed through its own adds of slice_grads (`slice_facts`: `slice_join`, `full_slice`),
  linear in the graph; the time steps of an unrolled recurrence (autodiff adds their gradients
  pairwise) join in log₂(steps) iterations.
- `rope_layout`: rope(permute(x, [b, s, h, d] → [b, h, s, d])) → rope(x, seq_first) and
  permute(rope_grad(g), back) → rope_grad(g, seq_first): rotary embeddings read the q and k
  projections, and write their gradients, in the Linear's [batch, seq, heads, D] layout, and the
  transposes between them (two a layer each way) need no kernel.
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
from meganeura.ir.ops.transformer import SEQ_FIRST
from meganeura.rewrite.rules import Rule, rule
from meganeura.rewrite.schema import term
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


def slice_grad_term(g: str, starts: str, stops: str) -> str:
    return term("slice_grad", g, shape="s", starts=starts, stops=stops, steps="st")


JOINED = term("concat", "x", "y", axis="axis")
JOIN_SLICE_GRADS = Rule(
    "join_slice_grads",
    FAMILY,
    "slice_grad(x, s, A) + slice_grad(y, s, B) → slice_grad(concat(x, y), s, A∪B) when B follows A along one dim",
    tuple(
        rule(
            [
                f'(= t (Binary "add" {first} {second}))',
                "(slice_join s st a0 a1 b0 b1 axis j0 j1 cat)",
            ],
            [f"(set (shape {JOINED}) cat)", f"(union t {slice_grad_term(JOINED, 'j0', 'j1')})"],
        )
        for first, second in (
            (slice_grad_term("x", "a0", "a1"), slice_grad_term("y", "b0", "b1")),
            (slice_grad_term("y", "b0", "b1"), slice_grad_term("x", "a0", "a1")),
        )
    ),
)

DROP_FULL_SLICE_GRAD = Rule(
    "drop_full_slice_grad",
    FAMILY,
    "slice_grad(x, s, the whole of s, steps 1) → x",
    (
        rule(
            [f"(= t {slice_grad_term('x', 'z', 's')})", "(full_slice s z st)"],
            ["(union t x)", f"(subsume {slice_grad_term('x', 'z', 's')})"],
        ),
    ),
)

MAX_CONCAT = 6  # the widest concat constructor (schema: Concat2 … Concat6)
FLATTEN_CONCATS = Rule(
    "flatten_concats",
    FAMILY,
    "concat(concat(a, b, …), c) and concat(a, concat(b, c, …)) along one axis → concat(a, b, c, …)",
    tuple(
        rule(
            f"(= t {term('concat', *outer, axis='ax')})",
            f"(union t {term('concat', *flat, axis='ax')})",
        )
        for k in range(2, MAX_CONCAT)
        for outer, flat in (
            (
                (term("concat", *[f"p{i}" for i in range(k)], axis="ax"), "q"),
                (*[f"p{i}" for i in range(k)], "q"),
            ),
            (
                ("q", term("concat", *[f"p{i}" for i in range(k)], axis="ax")),
                ("q", *[f"p{i}" for i in range(k)]),
            ),
        )
    ),
)

SEQ_FIRST_TEXT = ints(SEQ_FIRST)  # the ops' own permutation, as egglog text

ROPE_LAYOUT = Rule(
    "rope_layout",
    FAMILY,
    "rope(permute(x, 0,2,1,3)) → rope(x, seq_first); permute(rope_grad(g), 0,2,1,3) → rope_grad(g, seq_first)",
    (
        rule(
            f"(= t {term('rope', f'(Permute x {SEQ_FIRST_TEXT})', 'c', 's', seq_first='false')})",
            f"(union t {term('rope', 'x', 'c', 's', seq_first='true')})",
        ),
        rule(
            f"(= t (Permute {term('rope_grad', 'g', 'c', 's', seq_first='false')} {SEQ_FIRST_TEXT}))",
            f"(union t {term('rope_grad', 'g', 'c', 's', seq_first='true')})",
        ),
    ),
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
    JOIN_SLICE_GRADS,
    DROP_FULL_SLICE_GRAD,
    FLATTEN_CONCATS,
    ROPE_LAYOUT,
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


DECLARATIONS = """(relation slice_join (String String String String String String i64 String String String))
(relation full_slice (String String String))
"""


def facts(graph: Graph, node_ids: list[int]) -> list[str]:
    """The guards of `join_slice_grads` and `drop_full_slice_grad` for the slice_grads among
    `node_ids` and the sums of them that the graph adds up (`slice_facts`)."""
    return slice_facts(graph, node_ids)


def slice_facts(graph: Graph, node_ids: list[int]) -> list[str]:
    """`(slice_join s st a0 a1 b0 b1 axis j0 j1 cat)` for every add of the graph whose operands are
    (or join into) slice_grads of one shape `s` and steps 1 with ranges A and B (starts, stops),
    where B starts along `axis` where A stops and they agree on every other dim: J = A∪B, and `cat`
    the shape of the joined part (concat(x, y) along `axis`); `(full_slice s z st)` where a range,
    a slice_grad's or a join's, is the whole of `s`.

    The ranges are followed through the graph's own adds, bottom up, so the facts are linear in
    the graph: the joins the rule can make are those of its sums (it does not reorder a sum). An
    unrolled recurrence adds the gradients of its T time steps' slices of one tensor: every pair
    of ranges would be O(T²) joins found in O(T⁴) pair tests."""
    spans: dict[int, tuple[tuple, tuple]] = {}  # node -> ((shape, steps), (starts, stops)) it equals
    lines: dict[str, None] = {}
    for node_id in node_ids:
        node = graph[node_id]
        if node.op == "slice_grad" and all(step == 1 for step in node.attr("steps")):
            key = (tuple(node.attr("shape")), tuple(node.attr("steps")))
            spans[node_id] = (key, (tuple(node.attr("starts")), tuple(node.attr("stops"))))
        elif node.op == "add" and len(node.inputs) == 2 and all(i in spans for i in node.inputs):
            (key, a), (other, b) = (spans[i] for i in node.inputs)
            if key != other:
                continue
            for first, second in ((a, b), (b, a)):
                joined = join_ranges(first, second)
                if joined is not None:
                    axis, j = joined
                    spans[node_id] = (key, j)
                    s, st = ints(key[0]), ints(key[1])
                    cat = ints(tuple(stop - start for start, stop in zip(*j, strict=True)))
                    lines[
                        f"(slice_join {s} {st} {ints(first[0])} {ints(first[1])} {ints(second[0])} "
                        f"{ints(second[1])} {axis} {ints(j[0])} {ints(j[1])} {cat})"
                    ] = None
                    break
    for (shape, steps), (starts, stops) in spans.values():
        if stops == shape and not any(starts):
            lines[f"(full_slice {ints(shape)} {ints(starts)} {ints(steps)})"] = None
    return list(lines)


def join_ranges(a: tuple, b: tuple) -> tuple[int, tuple] | None:
    """(axis, A∪B) where range B follows range A along one axis and they agree elsewhere, else None."""
    (a0, a1), (b0, b1) = a, b
    differ = [d for d in range(len(a0)) if (a0[d], a1[d]) != (b0[d], b1[d])]
    if len(differ) != 1 or a1[differ[0]] != b0[differ[0]]:
        return None
    axis = differ[0]
    return axis, (a0, tuple(b1[d] if d == axis else a1[d] for d in range(len(a1))))
