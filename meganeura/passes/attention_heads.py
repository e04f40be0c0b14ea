"""Attention's grouped gradients, split per query head on a GPU where the cost model prices it lower.

`split_attention_heads(graph, target)` replaces each grouped `attention_grad_kv` (H query heads
over H_kv < H KV heads) by the per-query-head kernel (`per_query_head=True`: dK and dV [B, H,
Skv, D], ir/ops/transformer.py) and, for each of dK and dV, a reshape to [B, H_kv, H / H_kv, Skv,
D] and a sum over the group axis. A workgroup of the grouped kernel walks every query head of its
group for its key tile, and under the causal mask the first key tiles walk every query tile: the
SmolLM2-135M-shaped layer (9 query heads over 3, batch 8 × seq 256, 32x32 tiles) dispatches 192
workgroups whose first ones walk 24 query tiles, and took 493 µs on the H200 (2026-12-01); since
the kernels read Dᵢ while staging dO, and writing dS (passes/attention_scores.py), 0.258 ms
against 0.194 for the per-head kernel (2026-12-02, 32x32/128p, three alternated runs with this
split turned off; the 0.18-0.23 noted before had been timed through it: the per-head kernel). The
per-head kernel dispatches H / H_kv times the workgroups, each walking one head's tiles, and
writes H / H_kv times the bytes for the sums to add. The choice is the cost model's
(rewrite/cost.py node costs, with the fill that `codegen.transformer.balanced_grad_kv_workgroups`
counts): the split is made where the three kernels cost less than the one. A CPU (lavapipe) keeps
the grouped row kernel, which has no per-head form.

Why after extraction, not as an e-graph rule: the node has two results, and the split pays only
when both switch (the grouped kernel stays for the other one); extraction's moves switch one
e-class at a time, so a rule unioning each result with its sum matched and was never used. The
split itself needs no choice between alternatives beyond this price.
"""

from __future__ import annotations

from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.op import add_checked
from meganeura.rewrite.cost import node_cost, price
from meganeura.target import Target


def grouped_heads(graph: Graph, node: Node) -> tuple[int, int] | None:
    """(H, H_kv) of a grouped attention_grad_kv node, None for any other node."""
    if node.op != "attention_grad_kv" or node.attr("per_query_head"):
        return None
    h, hkv = graph[node.inputs[0]].shape[1], graph[node.inputs[1]].shape[1]
    return (h, hkv) if h > hkv else None


def split_types(graph: Graph, node: Node) -> tuple[TensorType, TensorType, tuple[int, ...]]:
    """(dK's and dV's per-head type, their summed type, the grouped shape the sum reduces)."""
    b, h, _, _ = graph[node.inputs[0]].shape
    _, hkv, skv, d = graph[node.inputs[1]].shape
    return TensorType((b, h, skv, d)), TensorType((b, hkv, skv, d)), (b, hkv, h // hkv, skv, d)


def split_pays(graph: Graph, node: Node, target: Target) -> bool:
    """Whether the per-head kernel and the two sums cost less than the grouped kernel on `target`."""
    per_head, summed, grouped_shape = split_types(graph, node)
    results = (per_head, per_head, *node.types[2:])  # dS, where it writes dS, is per query head already
    split = node_cost(graph, node.id, target, {**node.attr_dict, "per_query_head": True}, results)
    parts = TensorType(grouped_shape)
    sums = price("sum", {"axes": (2,), "keepdim": False}, [parts], (summed,), parts.nbytes, target)
    return (split + sums + sums).units < node_cost(graph, node.id, target).units


def split_attention_heads(graph: Graph, target: Target) -> Graph:
    """`graph` with every grouped attention_grad_kv that `split_pays` for split per query head
    (module docstring); the graph itself where none is, and always on a CPU."""
    if target.cpu:
        return graph
    live = graph.live_ids()  # once: per node it made this pass quadratic (1.6 s of SmolLM2-8's compile)
    chosen = {n.id for n in graph if n.id in live and grouped_heads(graph, n) and split_pays(graph, n, target)}
    if not chosen:
        return graph

    def replace(node: Node, new: Graph, new_id: dict[int, int]) -> int | None:
        source = graph[node.inputs[0]] if node.op == "result" else None
        if node.id in chosen:
            inputs = tuple(new_id[i] for i in node.inputs)
            return add_checked(new, node.op, inputs, {**node.attr_dict, "per_query_head": True}, node.sources)
        if source is not None and source.id in chosen and node.attr("index") < 2:  # dK or dV: its group's sum
            per_head, summed, grouped_shape = split_types(graph, source)
            part = new.add("result", (new_id[source.id],), per_head, node.attr_dict, node.sources)
            grouped = new.add("reshape", (part,), (TensorType(grouped_shape),), {"shape": grouped_shape}, node.sources)
            return new.add("sum", (grouped,), (summed,), {"axes": (2,), "keepdim": False}, node.sources)
        return None

    return graph.rebuilt(replace)
