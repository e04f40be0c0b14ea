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
the unrepeated k and v (grouped KV heads). Guards, in the rules' queries over facts the encoder
adds for this pass (`facts`): q, k, v are 4-D [b, h, s, d] with one batch, head and head-dim
size (v's head dim equals k's: the op's requirement), k and v have one sequence length, the
softmax is over the last axis, the mask is [s_q, s_kv] and the scale is a constant.
"""

from __future__ import annotations

from meganeura.ir.graph import Graph
from meganeura.rewrite.rules import Rule, rule

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
                    query = ["(= t (Matmul p vv false false))", '(= p (Op1 "softmax" ax z))', "(last_softmax p)"]
                    y = "s" if scaled is None else "y"
                    if causal:
                        added = f'(Binary "add" {y} m)' if mask == "right" else f'(Binary "add" m {y})'
                        query += [f"(= z {added})", '(= m (Op0 "causal_mask" ma))', "(mask_dims m sq skv)"]
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
                    action = f"(union t (Attention {operands} {'true' if causal else 'false'} {scale}))"
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

RULES = [RECOGNIZE_ATTENTION, RECOGNIZE_CAUSAL_ATTENTION]

DECLARATIONS = """(relation attn_dims (Term i64 i64 i64 i64))
(relation last_softmax (Term))
(relation mask_dims (Term i64 i64))
(relation repeats_kv (Term Term))
"""


def facts(graph: Graph, node_ids: list[int]) -> list[str]:
    """The facts the recognition rules guard on, for the encoded nodes `node_ids`."""
    lines = []
    wanted = set(node_ids)
    for node_id in node_ids:
        node = graph[node_id]
        if node.type.rank == 4:
            lines.append(f"(attn_dims (Ref {node_id}) {' '.join(str(d) for d in node.shape)})")
        if node.op == "softmax" and node.type.rank == 4 and node.attr("axis") % 4 == 3:
            lines.append(f"(last_softmax (Ref {node_id}))")
        if node.op == "causal_mask":
            lines.append(f"(mask_dims (Ref {node_id}) {node.shape[0]} {node.shape[1]})")
        source = repeated_kv_source(graph, node_id)
        if source is not None and source in wanted:
            lines.append(f"(repeats_kv (Ref {node_id}) (Ref {source}))")
    return lines


def repeated_kv_source(graph: Graph, node_id: int) -> int | None:
    """x when node `node_id` is reshape(broadcast_to(reshape(x, [b, g, 1, s, d]), [b, g, n, s, d]),
    [b, g·n, s, d]) with x [b, g, s, d] (HF's repeat_kv), else None."""
    out = graph[node_id]
    if out.op != "reshape" or out.type.rank != 4:
        return None
    expanded = graph[out.inputs[0]]
    if expanded.op != "broadcast_to" or expanded.type.rank != 5:
        return None
    unsqueezed = graph[expanded.inputs[0]]
    if unsqueezed.op != "reshape":
        return None
    source = graph[unsqueezed.inputs[0]]
    if source.type.rank != 4 or source.dtype != "f32":
        return None
    b, g, s, d = source.shape
    n = expanded.shape[2]
    if unsqueezed.shape != (b, g, 1, s, d) or expanded.shape != (b, g, n, s, d) or out.shape != (b, g * n, s, d):
        return None
    return source.id
