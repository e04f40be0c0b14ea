"""Lowering of the transformer ops: rope/rope_grad (elementwise, reading each element's partner
across the halves of the last dim) and the attention family (shaders/attention.wgsl), including
the pairs of attention nodes one dispatch computes (`sibling_kernels`: an attention and its
log-sum-exp, dK and dV)."""

from __future__ import annotations

from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.lower import (
    Operands,
    bindings_wgsl,
    elementwise_kernel,
    grid_for,
    literal,
    shape_text,
)
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node

# ---------------------------------------------------------------------------------------------
# Rotary position embeddings: one thread per output element, reading its partner across the halves


def lower_rope(graph: Graph, node: Node) -> KernelSpec:
    """rope / rope_grad: element i with last coordinate c < h pairs with i + h, else with i − h.

    rope: x·cos + r·sin at i, r = −x[i + h] or x[i − h]; rope_grad: g·cos at i + r, r =
    (g·sin)[i + h] or −(g·sin)[i − h] (sin is read at the partner too). cos and sin broadcast.
    """
    x, cos, sin = node.inputs
    shape = node.shape
    h = shape[-1] // 2
    operands = Operands(graph)
    lines = [
        f"let c = i % {2 * h}u;",
        f"let low = c < {h}u;",
        f"let p = select(i - {h}u, i + {h}u, low);",
        f"let v_x = {operands.read(x, shape)};",
        f"let v_partner = {operands.read_at(x, 'p')};",
        f"let v_cos = {operands.read(cos, shape)};",
    ]
    if node.op == "rope":
        lines.append(f"let v_sin = {operands.read(sin, shape)};")
        value = "v_x * v_cos + select(v_partner, -v_partner, low) * v_sin"
    else:
        lines.append(f"let y = v_partner * {operands.read(sin, shape, 'p')};")
        value = "v_x * v_cos + select(-y, y, low)"
    label = f"{node.op} {shape_text(shape)} cos {shape_text(graph[cos].shape)}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), value, "", label)


# ---------------------------------------------------------------------------------------------
# Attention: a workgroup per query row (forward, LSE, dQ) or per key row (dK, dV)

ATTENTION_BINDINGS = {
    "attention": ("q", "k", "v"),
    "attention_lse": ("q", "k"),
    "attention_grad_q": ("q", "k", "v", "o", "lse", "d_o"),
    "attention_grad_k": ("q", "k", "v", "o", "lse", "d_o"),
    "attention_grad_v": ("q", "k", None, None, "lse", "d_o"),
}
# The binding each attention op writes, and its flag in shaders/attention.wgsl.
ATTENTION_OUTPUTS = {
    "attention": ("out", "ATTENTION"),
    "attention_lse": ("out_lse", "LSE"),
    "attention_grad_q": ("out", "GRAD_Q"),
    "attention_grad_k": ("out_k", "GRAD_K"),
    "attention_grad_v": ("out_v", "GRAD_V"),
}
# Pairs computed by one kernel (host op, sibling op): the forward writes its row log-sum-exp in
# the same pass, and the key-row backward kernel accumulates dK and dV from one recomputed P.
ATTENTION_SIBLINGS = {"attention_lse": "attention", "attention_grad_v": "attention_grad_k"}


def sibling_kernels(graph: Graph, node_ids: list[int]) -> dict[int, int]:
    """{sibling: host} for the attention nodes among `node_ids` that another node's kernel
    computes: an attention_lse with the same q, k and attributes as an attention, an
    attention_grad_v with the same operands and attributes as an attention_grad_k."""
    hosts: dict[tuple, int] = {}
    for node_id in node_ids:
        node = graph[node_id]
        if node.op in ATTENTION_SIBLINGS.values():
            hosts.setdefault((node.op, node.inputs[: 2 if node.op == "attention" else 6], node.attrs), node_id)
    siblings = {}
    for node_id in node_ids:
        node = graph[node_id]
        host_op = ATTENTION_SIBLINGS.get(node.op)
        if host_op is not None:
            key = (host_op, node.inputs[: 2 if host_op == "attention" else 6], node.attrs)
            if key in hosts:
                siblings[node_id] = hosts[key]
    return siblings


def lower_attention(graph: Graph, node: Node, siblings: tuple[int, ...] = ()) -> KernelSpec:
    """attention, attention_lse, attention_grad_q/k/v (shaders/attention.wgsl): WG threads (a power
    of two, at least head_dim) per row, one element of the row's head_dim vector each; keys or query
    rows are walked in tiles of WG. `siblings` (see `sibling_kernels`) are written by the same
    kernel: their buffers are extra outputs."""
    q, k = node.inputs[:2]
    b, h, sq, d = graph[q].shape
    _, hkv, skv, _ = graph[k].shape
    if d > 256:
        raise NotImplementedError(f"{node.op} %{node.id}: head_dim {d} > 256 is not supported by the attention kernel")
    names = ATTENTION_BINDINGS[node.op]
    bindings = [Binding(name, value, "read") for name, value in zip(names, node.inputs, strict=False) if name]
    written = [node, *(graph[s] for s in siblings)]
    bindings += [Binding(ATTENTION_OUTPUTS[n.op][0], n.id, "read_write") for n in written]
    ops = {n.op for n in written}
    per_key = node.op in ("attention_grad_k", "attention_grad_v")
    rows = b * hkv * skv if per_key else b * h * sq
    wg = max(32, 1 << (d - 1).bit_length())
    grid = grid_for(rows)
    flags = {flag: op in ops for op, (_, flag) in ATTENTION_OUTPUTS.items()}
    flags |= {
        "CAUSAL": bool(node.attr("causal")),
        "FORWARD": node.op in ("attention", "attention_lse"),
        "GRAD_KV": per_key,
    }
    sizes = {"ROWS": rows, "H": h, "HKV": hkv, "SQ": sq, "SKV": skv, "D": d, "WG": wg}
    wgsl = render(
        "attention",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            **sizes,
            "GRID_X": max(grid[0], 1),
            "SCALE": literal(float(node.attr("scale"))),
            **flags,
        },
    )
    entry = "attention_grad_kv" if per_key else ("attention" if flags["FORWARD"] else node.op)
    causal = " causal" if flags["CAUSAL"] else ""
    ops_text = " + ".join(n.op for n in written)
    label = f"{ops_text} q {shape_text(graph[q].shape)} kv {shape_text(graph[k].shape)}{causal}"
    return KernelSpec(node.id, label, wgsl, entry, tuple(bindings), grid, (wg, 1, 1), also_writes=tuple(siblings))


TRANSFORMER_LOWERINGS = {
    "rope": lower_rope,
    "rope_grad": lower_rope,
    **{op: lower_attention for op in ATTENTION_BINDINGS},
}
