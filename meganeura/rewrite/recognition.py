"""The recognition family: hand-written compositions recognised as the fused op they compute.

Scheduled alone, on the forward graph before autodiff (`compiler.trace_step`), so that the fused
op's own VJP builds the backward; the main pass never runs it (its graph is already
differentiated).

- `recognize_attention`: matmul(softmax(scores, last axis), v) → attention(q, k, v, causal=False,
  scale), where scores is q·kᵀ (k read transposed: `matmul(q, k, tb)` or
  `matmul(q, permute(k, swap))`) times a constant (c·x, x·c, or x/c; or no scale: 1).
- `recognize_causal_attention`: the same with an additive `causal_mask` (`mn.causal_mask`)
  added to the scaled scores (either order) → attention(…, causal=True, scale).

Both also match k and v repeated over the query heads (HF's repeat_kv,
`x[:, :, None].expand(b, h_kv, n, s, d).reshape(b, h_kv·n, s, d)`): the attention then reads
the unrepeated k and v (grouped KV heads). The helper rule `match_repeat_kv` finds those
repetitions: `(repeats_kv r x)` when r is reshape(broadcast_to(reshape(x))) with the shapes
[b, g, s, d] → [b, g, 1, s, d] → [b, g, n, s, d] → [b, g·n, s, d].

Guards, in the rules' queries over facts the encoder adds for this pass (`facts`: the dims of
every 4-D and 5-D tensor, which softmaxes are over the last axis; a causal mask's size is its attributes):
q, k, v are 4-D [b, h, s, d] with one batch, head and head-dim size (v's head dim equals k's:
the op's requirement), k and v have one sequence length, the softmax is over the last axis, the
mask is [s_q, s_kv] and the scale is a constant.

- `recognize_rope`: x·cos + rotate_half(x)·sin → rope(x, cos, sin), rotate_half written as HF
  transformers does, cat((−x[..., D/2:], x[..., :D/2]), dim=−1) (any operand order of the add
  and the muls). Guards: the slices take the two halves of x's last axis whole (facts
  `half_slice`), the concat is over the last axis (`concat_last`), and the result has x's shape
  (cos and sin broadcast to x, as the op requires).
"""

from __future__ import annotations

from meganeura.ir.graph import Graph
from meganeura.rewrite.rules import Rule, rule
from meganeura.rewrite.schema import term

FAMILY = "recognition"

SCALES = {  # pattern of the scaled scores y over the product s, and the scale egglog computes
    "mul": ('(Binary "mul" s (Const c))', "c"),
    "mul_left": ('(Binary "mul" (Const c) s)', "c"),
    "div": ('(Binary "div" s (Const c))', "(/ 1.0 c)"),
    "none": (None, "1.0"),
}
PRODUCTS = {  # the scores s = q·kᵀ
    "tb": "(Matmul q kk false true)",
    "permute": '(Matmul q (Permute kk "0,1,3,2") false false)',
}


def attention_variants(causal: bool) -> tuple[str, ...]:
    variants = []
    masks = ("right", "left") if causal else (None,)
    for product in PRODUCTS.values():
        for scaled, scale in SCALES.values():
            for mask in masks:
                for grouped in (False, True):
                    query = ["(= t (Matmul p vv false false))", "(= p (Softmax z ax))", "(last_softmax p)"]
                    y = "s" if scaled is None else "y"
                    if causal:
                        added = f'(Binary "add" {y} m)' if mask == "right" else f'(Binary "add" m {y})'
                        query += [f"(= z {added})", "(= m (CausalMask sq skv))"]
                    else:
                        query.append(f"(= z {y})")
                    if scaled is not None:
                        query.append(f"(= y {scaled})")
                    query += [f"(= s {product})", "(attn_dims q b h sq d)"]
                    if grouped:
                        query += ["(repeats_kv kk k)", "(repeats_kv vv v)"]
                        query += ["(attn_dims k b hkv skv d)", "(attn_dims v b hkv skv d)"]
                        operands = "q k v"
                    else:
                        query += ["(attn_dims kk b h skv d)", "(attn_dims vv b h skv d)"]
                        operands = "q kk vv"
                    flag = "true" if causal else "false"
                    attention = term(
                        "attention", *operands.split(), causal=flag, scale=scale, dropout="0.0", stream="0"
                    )
                    action = f"(union t (Result {attention} 0))"
                    variants.append(rule(query, action))
    return tuple(variants)


RECOGNIZE_ATTENTION = Rule(
    "recognize_attention",
    FAMILY,
    "matmul(softmax(q·kᵀ·c), v) → attention(q, k, v, causal=False, scale=c) (k, v repeated: grouped)",
    attention_variants(causal=False),
)

RECOGNIZE_CAUSAL_ATTENTION = Rule(
    "recognize_causal_attention",
    FAMILY,
    "matmul(softmax(q·kᵀ·c + causal_mask), v) → attention(q, k, v, causal=True, scale=c)",
    attention_variants(causal=True),
)

MATCH_REPEAT_KV = Rule(
    "match_repeat_kv",
    FAMILY,
    "repeats_kv(r, x): r repeats the KV heads of x HF-style (helper of the attention rules)",
    (
        rule(
            [
                "(= r (Reshape e shape_r))",
                "(= e (BroadcastTo u shape_e))",
                "(= u (Reshape x shape_u))",
                "(attn_dims x b g s d)",
                "(dims5 u b g 1 s d)",
                "(dims5 e b g n s d)",
                "(attn_dims r b h s d)",
                "(= h (* g n))",
            ],
            "(repeats_kv r x)",
        ),
    ),
)


def rope_variants() -> tuple[str, ...]:
    """x·c + rotate_half(x)·s in every operand order of the add and the two muls."""
    rotated = [
        '(= r (Concat2 (Unary "neg" x2) x1 ca))',
        "(concat_last r)",
        "(= x1 (Slice x st1 sp1 se1))",
        "(half_slice x1 0)",
        "(= x2 (Slice x st2 sp2 se2))",
        "(half_slice x2 1)",
    ]
    variants = []
    for plain in ('(Binary "mul" x c)', '(Binary "mul" c x)'):
        for turned in ('(Binary "mul" r s)', '(Binary "mul" s r)'):
            for added in ('(Binary "add" p t)', '(Binary "add" t p)'):
                query = [f"(= y {added})", f"(= p {plain})", f"(= t {turned})", *rotated, "(= (shape y) (shape x))"]
                variants.append(rule(query, f"(union y {term('rope', 'x', 'c', 's', seq_first='false')})"))
    return tuple(variants)


RECOGNIZE_ROPE = Rule(
    "recognize_rope",
    FAMILY,
    "x·cos + cat(−x[..., h:], x[..., :h])·sin → rope(x, cos, sin) (HF's rotate_half form)",
    rope_variants(),
)

RULES = [MATCH_REPEAT_KV, RECOGNIZE_ATTENTION, RECOGNIZE_CAUSAL_ATTENTION, RECOGNIZE_ROPE]

DECLARATIONS = """(relation attn_dims (Term i64 i64 i64 i64))
(relation dims5 (Term i64 i64 i64 i64 i64))
(relation last_softmax (Term))
(relation repeats_kv (Term Term))
(relation half_slice (Term i64))
(relation concat_last (Term))
"""


def facts(graph: Graph, node_ids: list[int]) -> list[str]:
    """The facts the recognition rules guard on, for the encoded nodes `node_ids`: node attributes
    and shapes only (the structure is matched by the rules)."""
    lines = []
    for node_id in node_ids:
        node = graph[node_id]
        if node.results != 1:
            continue
        if node.type.rank == 4:
            lines.append(f"(attn_dims (Ref {node_id}) {' '.join(str(d) for d in node.shape)})")
        if node.type.rank == 5:
            lines.append(f"(dims5 (Ref {node_id}) {' '.join(str(d) for d in node.shape)})")
        if node.op == "softmax" and node.type.rank == 4 and node.attr("axis") % 4 == 3:
            lines.append(f"(last_softmax (Ref {node_id}))")
        if node.op == "concat" and node.attr("axis") == node.type.rank - 1:
            lines.append(f"(concat_last (Ref {node_id}))")
        half = half_of_last_axis(graph, node)
        if half is not None:
            lines.append(f"(half_slice (Ref {node_id}) {half})")
    return lines


def half_of_last_axis(graph: Graph, node) -> int | None:
    """0 or 1 when `node` is x[..., :D/2] or x[..., D/2:] of an f32 x with an even last dim D, else None."""
    if node.op != "slice" or node.dtype != "f32" or node.type.rank == 0:
        return None
    shape = graph[node.inputs[0]].shape
    starts, stops, steps = node.attr("starts"), node.attr("stops"), node.attr("steps")
    last = len(shape) - 1
    whole = all(starts[i] == 0 and stops[i] == shape[i] and steps[i] == 1 for i in range(last))
    half = shape[last] // 2
    if not whole or shape[last] % 2 or steps[last] != 1 or stops[last] - starts[last] != half:
        return None
    return {0: 0, half: 1}.get(starts[last])
