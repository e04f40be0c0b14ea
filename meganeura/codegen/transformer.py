"""Lowering of the transformer ops: rope and rope_grad (elementwise, reading each element's partner
across the halves of the last dim) and the attention kernels (shaders/attention.wgsl): the
forward writes the output and the row log-sum-exp in one pass, and one pass over the key rows
writes dK and dV.
"""

from __future__ import annotations

from meganeura.codegen.common import Operands, bindings_wgsl, elementwise_kernel, grid_for, output_binding, shape_text
from meganeura.codegen.expressions import literal
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node
from meganeura.target import GENERIC, Target

# ---------------------------------------------------------------------------------------------
# Rotary position embeddings: one thread per output element, reading its partner across the halves


@lowering("rope", "rope_grad")
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
# Attention: a workgroup per query row (forward, dQ) or per key row (dK and dV)

READS = ("q", "k", "v", "o", "lse", "d_o")  # the WGSL names of the operands, in order
# Per op: the operands its kernel reads, and the binding and shader flag of each result it writes.
ATTENTION_KERNELS = {
    "attention": (("q", "k", "v"), (("out", "ATTENTION"), ("out_lse", "LSE"))),
    "attention_grad_q": (READS, (("out", "GRAD_Q"),)),
    "attention_grad_kv": (READS, (("out_k", "GRAD_K"), ("out_v", "GRAD_V"))),
}
FLAGS = ("ATTENTION", "LSE", "GRAD_Q", "GRAD_K", "GRAD_V")


ROWS_PER_CPU_WORKGROUP = 64  # shaders/attention_rows.wgsl: a thread per row


def row_workgroups(rows: int, target: Target) -> int:
    """A workgroup per row (attention.wgsl), or a thread per row on a CPU (attention_rows.wgsl)."""
    return -(-rows // ROWS_PER_CPU_WORKGROUP) if target.cpu else rows


def query_rows(attrs: dict, operands, results, target: Target = GENERIC) -> int:
    """A workgroup (a thread on a CPU) per (batch, head, query) row."""
    b, h, sq, _ = operands[0].shape
    return row_workgroups(b * h * sq, target)


def key_rows(attrs: dict, operands, results, target: Target = GENERIC) -> int:
    """A workgroup (a thread on a CPU) per (batch, key head, key) row: the gradient of K and V."""
    b, hkv, skv, _ = operands[1].shape
    return row_workgroups(b * hkv * skv, target)


@lowering("attention_grad_kv", workgroups=key_rows, per_target=True)
@lowering("attention", "attention_grad_q", workgroups=query_rows, per_target=True)
def lower_attention(graph: Graph, node: Node, target: Target = GENERIC) -> KernelSpec:
    """attention (output and log-sum-exp), attention_grad_q, attention_grad_kv (dK and dV):
    WG threads (a power of two, at least head_dim) per row, one element of the row's head_dim
    vector each; keys or query rows are walked in tiles of WG. On a CPU, where workgroup barriers
    cost much, a thread per row instead (shaders/attention_rows.wgsl; the character LM's three
    attention kernels took 10-17 ms each on lavapipe the other way)."""
    q, k = node.inputs[:2]
    b, h, sq, d = graph[q].shape
    _, hkv, skv, _ = graph[k].shape
    if d > 256:
        raise NotImplementedError(f"{node.op} %{node.id}: head_dim {d} > 256 is not supported by the attention kernel")
    reads, writes = ATTENTION_KERNELS[node.op]
    bindings = [Binding(name, value, "read") for name, value in zip(reads, node.inputs, strict=True)]
    bindings += [output_binding(node, name, index) for index, (name, _) in enumerate(writes)]
    per_key = node.op == "attention_grad_kv"
    rows = b * hkv * skv if per_key else b * h * sq
    template = "attention_rows" if target.cpu else "attention"
    wg = ROWS_PER_CPU_WORKGROUP if target.cpu else max(32, 1 << (d - 1).bit_length())
    grid = grid_for(row_workgroups(rows, target))
    written = {flag for _, flag in writes}
    flags = {flag: flag in written for flag in FLAGS}
    flags |= {"CAUSAL": bool(node.attr("causal")), "FORWARD": node.op == "attention", "GRAD_KV": per_key}
    sizes = {"ROWS": rows, "H": h, "HKV": hkv, "SQ": sq, "SKV": skv, "D": d, "WG": wg}
    wgsl = render(
        template,
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            **sizes,
            "GRID_X": max(grid[0], 1),
            "SCALE": literal(float(node.attr("scale"))),
            **flags,
        },
    )
    causal = " causal" if flags["CAUSAL"] else ""
    label = f"{node.op} q {shape_text(graph[q].shape)} kv {shape_text(graph[k].shape)}{causal}"
    return KernelSpec(node.id, label, wgsl, node.op, tuple(bindings), grid, (wg, 1, 1), results=len(writes))
