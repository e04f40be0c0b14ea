"""dQ as a batched matmul of the scores' gradient that the dK/dV kernel writes, on a GPU where the
cost model prices it lower and the scores fit `SCORES_LIMIT`.

The dQ kernel (`attention_grad_q`) recomputes, per query tile, the two products the dK/dV kernel
has just computed for the same pairs — the scores q·kᵀ and dO·vᵀ — to build dS = P ∘ (dO·vᵀ − D)
and multiply it by K: three products of which only the last is new. `dq_from_scores(graph,
target)` makes the dK/dV node of each such pair write dS·scale as a third result
(`attention_grad_kv(…, scores=True)`: zero where the causal mask hides a key, stored transposed
and grouped by KV head, dSᵀ [B, H_kv, Skv, G·Sq] with G = H / H_kv, which the kernel writes
from its registers in coalesced rows) and replaces dQ by

    dQ = reshape(fused_matmul(dSᵀ·scale, k, transpose_a=True, causal_rows=Sq), [B, H, Sq, D])

the G query heads of a group reading one KV head, so that each group is one [G·Sq, Skv] ·
[Skv, D] product of the batch (the matmul kernel's, tiled by codegen/gemm_table.py). Under a
causal mask, `causal_rows` tells the kernel that row r of (dSᵀ)ᵀ is zero past key r mod Sq, so a
tile of query rows stops at its last query's K tile: about half the multiply-adds of the whole
product at Sq = Skv. The product runs at the matmul kernel's rate, where the flash kernels run at
a fraction of it (their small register tiles; the module docstring of
codegen/attention_tiles.py); and dS costs its bytes twice, written and read.

The scores are quadratic in the sequence: a flash kernel exists so that no [Sq, Skv] tensor is
kept. The route is taken only where dS stays within SCORES_LIMIT bytes (SmolLM2-135M's layer at
batch 8 × seq 256: 18.9 MB; at seq 2048, 1.2 GB: the dQ kernel stays). The buffer planner gives
dS a buffer for its short life (the dK/dV kernel to the matmul), which later layers reuse.

Why after extraction, not as an e-graph rule: the route needs two e-classes to switch at once
(dK/dV's node gaining a result, and dQ), and extraction moves one at a time (the same reason as
passes/attention_heads.py's split, which runs after this and keeps the third result as it is).
A CPU (lavapipe) keeps its row kernels, which have no dS output, and so does an adapter that binds
fewer storage buffers a kernel than the dK/dV kernel writing dS needs (9).
"""

from __future__ import annotations

from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.op import add_checked
from meganeura.rewrite.cost import node_cost, price
from meganeura.target import Target

# Bytes of dS per attention: beyond, the dQ kernel (no quadratic tensor). Half of the 128 MiB
# storage binding that WebGPU guarantees every adapter (lavapipe's own limit), so dS binds anywhere.
SCORES_LIMIT = 64 * 1024 * 1024


def grad_pairs(graph: Graph) -> dict[int, int]:
    """{dQ node: its dK/dV node} for the live attention_grad_q nodes whose operands and attributes
    an attention_grad_kv node shares (the two halves of one attention's backward)."""
    live = graph.live_ids()
    kv_nodes = {
        (n.inputs, n.attr("causal"), n.attr("scale")): n.id
        for n in graph
        if n.op == "attention_grad_kv" and n.id in live and not n.attr("scores")
    }
    pairs = {}
    for n in graph:
        key = (n.inputs, n.attr("causal"), n.attr("scale")) if n.op == "attention_grad_q" else None
        if n.id in live and key in kv_nodes:
            pairs[n.id] = kv_nodes[key]
    return pairs


def matmul_types(graph: Graph, grad_q: Node) -> tuple[TensorType, TensorType]:
    """(dSᵀ grouped by KV head [B, H_kv, Skv, G·Sq], the product (dSᵀ)ᵀ·K [B, H_kv, G·Sq, D])."""
    b, h, sq, d = graph[grad_q.inputs[0]].shape
    _, hkv, skv, _ = graph[grad_q.inputs[1]].shape
    group = h // hkv
    return TensorType((b, hkv, skv, group * sq)), TensorType((b, hkv, group * sq, d))


def product_attrs(graph: Graph, grad_q: Node) -> dict:
    """The attributes of dQ's fused_matmul: A transposed, and under a causal mask its rows' period
    (Sq: row r of the group's [G·Sq, Skv] is query r mod Sq, zero past that key)."""
    sq = graph[grad_q.inputs[0]].shape[2]
    return {"transpose_a": True, "causal_rows": sq if grad_q.attr("causal") else 0}


def route_pays(graph: Graph, grad_q: Node, grad_kv: Node, target: Target) -> bool:
    """Whether dK/dV writing dS and the matmul cost less than dK/dV and the dQ kernel, with dS
    within SCORES_LIMIT and the writing kernel's bindings (one more than dK/dV's) within the
    target's storage buffers: an adapter with WebGPU's default 8 keeps the dQ kernel."""
    scores, product = matmul_types(graph, grad_q)
    if scores.nbytes > SCORES_LIMIT or len(grad_kv.inputs) + len(grad_kv.types) + 1 > target.max_storage_buffers:
        return False
    before = node_cost(graph, grad_kv.id, target) + node_cost(graph, grad_q.id, target)
    writing = node_cost(graph, grad_kv.id, target, {**grad_kv.attr_dict, "scores": True}, (*grad_kv.types, scores))
    k = graph[grad_q.inputs[1]].type
    matmul = price(
        "fused_matmul", product_attrs(graph, grad_q), [scores, k], (product,), scores.nbytes + k.nbytes, target
    )
    return (writing + matmul).units < before.units


def dq_from_scores(graph: Graph, target: Target) -> Graph:
    """`graph` with dQ computed from dS (module docstring) wherever `route_pays`; the graph itself
    where it pays nowhere, and always on a CPU."""
    if target.cpu:
        return graph
    chosen = {q: kv for q, kv in grad_pairs(graph).items() if route_pays(graph, graph[q], graph[kv], target)}
    if not chosen:
        return graph
    writer: dict[int, int] = {}  # dK/dV node → its new node, which writes dS

    def grad_kv_writing_scores(node: Node, new: Graph, new_id: dict[int, int]) -> int:
        if node.id not in writer:
            inputs = tuple(new_id[i] for i in node.inputs)
            writer[node.id] = add_checked(new, node.op, inputs, {**node.attr_dict, "scores": True}, node.sources)
        return writer[node.id]

    def replace(node: Node, new: Graph, new_id: dict[int, int]) -> int | None:
        if node.id in chosen:  # dQ: the matmul of the dS its dK/dV node writes
            kv = grad_kv_writing_scores(graph[chosen[node.id]], new, new_id)
            ds = add_checked(new, "result", (kv,), {"index": 2}, node.sources)
            dq = add_checked(
                new, "fused_matmul", (ds, new_id[node.inputs[1]]), product_attrs(graph, node), node.sources
            )
            return add_checked(new, "reshape", (dq,), {"shape": node.shape}, node.sources)
        if node.id in chosen.values():
            return grad_kv_writing_scores(node, new, new_id)
        return None

    return graph.rebuilt(replace)
