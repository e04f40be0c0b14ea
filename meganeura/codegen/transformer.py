"""Lowering of the transformer ops: rope and rope_grad (elementwise, reading each element's partner
across the halves of the last dim) and the attention kernels: on a GPU flash-style tiles
(shaders/attention.wgsl, tiled by codegen/attention_tiles.py), on a CPU a thread per row
(shaders/attention_rows.wgsl). The forward writes the output and the row log-sum-exp in one
pass; one kernel writes dQ, one writes dK and dV.
"""

from __future__ import annotations

from meganeura.codegen.attention_tiles import (
    Tiles,
    layout_for,
    per_thread_work,
    tile_code,
    tiles_for,
    tiles_needed,
    vec4_bindings,
    vec4_helpers,
    vec4s,
    workgroup_bytes,
)
from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    elementwise_kernel,
    grid_for,
    index_expr,
    output_binding,
    row_major_strides,
    shape_text,
)
from meganeura.codegen.expressions import literal
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops.transformer import SEQ_FIRST, dropout_scale, dropout_threshold
from meganeura.target import GENERIC, Target

# ---------------------------------------------------------------------------------------------
# Rotary position embeddings: one thread per output element, reading its partner across the halves


@lowering("rope", "rope_grad")
def lower_rope(graph: Graph, node: Node) -> KernelSpec:
    """rope / rope_grad: element i with last coordinate c < h pairs with i + h, else with i − h.

    rope: x·cos + r·sin at i, r = −x[i + h] or x[i − h]; rope_grad: g·cos at i + r, r =
    (g·sin)[i + h] or −(g·sin)[i − h] (sin is read at the partner too). cos and sin broadcast to
    the heads-first side. With `seq_first` the x side is [B, S, H, D]: rope reads x at the index
    `xi` of its output element's coordinates there, rope_grad reads g at `xi`, the index of its
    output element's coordinates in g's [B, H, S, D] (and cos and sin there too); the partner is
    `xi` ± h either way (the last axis stays in place).
    """
    x, cos, sin = node.inputs
    shape, source_shape = node.shape, graph[x].shape
    h = shape[-1] // 2
    operands = Operands(graph)
    lines, at = [], "i"
    if node.attr("seq_first"):  # the source's strides along the output's axes
        strides = row_major_strides(source_shape)
        lines.append(f"let xi = {index_expr('i', shape, tuple(strides[axis] for axis in SEQ_FIRST))};")
        at = "xi"
    # cos and sin broadcast to the heads-first side: rope's output, rope_grad's operand
    heads_first, table_at = (shape, "i") if node.op == "rope" else (source_shape, at)
    lines += [
        f"let c = i % {2 * h}u;",
        f"let low = c < {h}u;",
        f"let p = select({at} - {h}u, {at} + {h}u, low);",
        f"let v_x = {operands.read_at(x, at)};",
        f"let v_partner = {operands.read_at(x, 'p')};",
        f"let v_cos = {operands.read(cos, heads_first, table_at)};",
    ]
    if node.op == "rope":
        lines.append(f"let v_sin = {operands.read(sin, heads_first, table_at)};")
        value = "v_x * v_cos + select(v_partner, -v_partner, low) * v_sin"
    else:
        lines.append(f"let y = v_partner * {operands.read(sin, heads_first, 'p')};")
        value = "v_x * v_cos + select(-y, y, low)"
    seq_first = " seq-first" * bool(node.attr("seq_first"))
    label = f"{node.op} {shape_text(shape)} cos {shape_text(graph[cos].shape)}{seq_first}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), value, "", label)


# ---------------------------------------------------------------------------------------------
# Attention: flash-style tiles on a GPU (attention.wgsl, tiling in codegen/attention_tiles.py),
# a thread per row on a CPU (attention_rows.wgsl)

READS = ("q", "k", "v", "delta", "lse", "d_o")  # the WGSL names of the operands, in order
STATE = "state"  # the RNG state, the last operand of an op with dropout
ROW_READS = ("delta", "lse", STATE)  # per query row [B, H, SQ] (and the state): read as scalars, no vec4 loads
ROW_WRITES = ("out_lse", "out_s")  # the log-sum-exp per query row, dS per score: written as scalars
# Per op: the operands its kernel reads, and the binding and shader flag of each result it writes.
ATTENTION_KERNELS = {
    "attention": (("q", "k", "v"), (("out", "ATTENTION"), ("out_lse", "LSE"))),
    "attention_grad_q": (READS, (("out", "GRAD_Q"),)),
    "attention_grad_kv": (READS, (("out_k", "GRAD_K"), ("out_v", "GRAD_V"))),
}
FLAGS = ("ATTENTION", "LSE", "GRAD_Q", "GRAD_K", "GRAD_V", "GRAD_S")


# The tile kernels number their workgroups tile-major (shaders/attention.wgsl `tile_rank`).
TILE_MAJOR = True
# dK/dV loads each query tile's lse and Dᵢ into registers a tile ahead (shaders/attention.wgsl
# `query_rows`), where its workgroup has a thread per query row of the tile.
ROWS_AHEAD = True

ROWS_PER_CPU_WORKGROUP = 64  # shaders/attention_rows.wgsl: a thread per row


def attention_workgroups(op: str, b: int, h: int, hkv: int, sq: int, skv: int, d: int, target: Target) -> int:
    """A workgroup per query tile (forward, dQ) or key tile (dK, dV) of each head on a GPU; on a
    CPU a thread per row, 64 to a workgroup."""
    if target.cpu:
        rows = b * hkv * skv if op == "attention_grad_kv" else b * h * sq
        return -(-rows // ROWS_PER_CPU_WORKGROUP)
    tiles = tiles_for(op, d, target)
    if op == "attention_grad_kv":
        return b * hkv * tiles_needed(skv, tiles.bc)
    return b * h * tiles_needed(sq, tiles.br)


def key_tile_walks(sq: int, skv: int, tiles: Tiles, causal: bool) -> list[int]:
    """The query tiles each key tile's workgroup of a dK/dV kernel walks (per query head): all of
    them, or under the causal mask those from the diagonal on (shaders/attention.wgsl `query_start`)."""
    query_tiles = tiles_needed(sq, tiles.br)
    return [query_tiles - (k0 // tiles.br if causal else 0) for k0 in range(0, skv, tiles.bc)]


def balanced_grad_kv_workgroups(heads: int, sq: int, skv: int, tiles: Tiles, causal: bool) -> int:
    """The workgroups the cost model counts for a dK/dV kernel of `heads` output heads: its work
    over the longest workgroup's. Under the causal mask the first key tile walks every query
    tile and the last only its own, so the kernel lasts as long as its first key tiles, and its
    other workgroups leave units idle for the rest of it; a grouped kernel (a workgroup per KV
    head walking every query head of its group: SmolLM2's 3 KV heads, 192 workgroups of 32x32
    tiles at batch 8 × seq 256 on 132 SMs) lasts as long as its longest workgroup, 24 query
    tiles (H200, 2026-12-01: 493 µs a layer)."""
    walks = key_tile_walks(sq, skv, tiles, causal)
    return max(1, heads * sum(walks) // max(walks))


def attention_op_workgroups(op: str):
    def count(attrs: dict, operands, results, target: Target = GENERIC) -> int:
        b, h, sq, d = operands[0].shape
        _, hkv, skv, _ = operands[1].shape
        if op == "attention_grad_kv" and not target.cpu:
            heads = b * (h if attrs.get("per_query_head") else hkv)
            return balanced_grad_kv_workgroups(heads, sq, skv, tiles_for(op, d, target), bool(attrs.get("causal")))
        return attention_workgroups(op, b, h, hkv, sq, skv, d, target)

    count.__name__ = f"{op}_workgroups"
    return count


@lowering("attention_grad_kv", workgroups=attention_op_workgroups("attention_grad_kv"), per_target=True)
@lowering("attention_grad_q", workgroups=attention_op_workgroups("attention_grad_q"), per_target=True)
@lowering("attention", workgroups=attention_op_workgroups("attention"), per_target=True)
def lower_attention(graph: Graph, node: Node, target: Target = GENERIC) -> KernelSpec:
    """attention (output and log-sum-exp), attention_grad_q, attention_grad_kv (dK and dV). On a
    GPU, flash-style tiles (`tiles_for` the op, head_dim and target); on a CPU, where workgroup
    barriers cost much, a thread per row (the character LM's three attention kernels took 10-17 ms
    each on lavapipe with a workgroup per row)."""
    if target.cpu:
        return lower_attention_rows(graph, node)
    return lower_attention_tiles(graph, node, tiles_for(node.op, graph[node.inputs[0]].shape[-1], target), target)


def kernel_writes(node: Node) -> tuple[tuple[str, str], ...]:
    """The binding and flag of each result `node`'s kernel writes (dK/dV with `scores`: dS too)."""
    writes = ATTENTION_KERNELS[node.op][1]
    return (*writes, ("out_s", "GRAD_S")) if node.attr("scores", False) else writes


def attention_bindings(node: Node) -> tuple[list[Binding], dict[str, bool]]:
    """The kernel's bindings (its reads, then one output per result) and the flags of what it writes."""
    reads, writes = ATTENTION_KERNELS[node.op][0], kernel_writes(node)
    reads += (STATE,) * dropout_of(node)
    bindings = [Binding(name, value, "read") for name, value in zip(reads, node.inputs, strict=True)]
    bindings += [output_binding(node, name, index) for index, (name, _) in enumerate(writes)]
    written = {flag for _, flag in writes}
    flags = {flag: flag in written for flag in FLAGS}
    flags |= {
        "CAUSAL": bool(node.attr("causal")),
        "DROPOUT": dropout_of(node),
        "FORWARD": node.op == "attention",
        "GRAD_KV": node.op == "attention_grad_kv",
        "PER_QUERY_HEAD": node.op == "attention_grad_kv" and bool(node.attr("per_query_head")),
        "TILE_MAJOR": TILE_MAJOR,
    }
    return bindings, flags


def dropout_of(node: Node) -> bool:
    """Whether the op drops its weights (it then reads the RNG state: shaders/attention_dropout.wgsl)."""
    return node.attr("dropout", 0.0) > 0.0


def dropout_sizes(node: Node) -> dict[str, int | str]:
    """attention_dropout.wgsl's placeholders (unused without dropout, filled all the same)."""
    p = float(node.attr("dropout", 0.0))
    return {
        "STREAM": int(node.attr("stream", 0)),
        "THRESHOLD": dropout_threshold(p),
        "DROP_SCALE": literal(dropout_scale(p) if p > 0.0 else 1.0),
    }


def attention_sizes(graph: Graph, node: Node) -> dict[str, int | str]:
    q, k = node.inputs[:2]
    b, h, sq, d = graph[q].shape
    _, hkv, skv, _ = graph[k].shape
    rows = b * hkv * skv if node.op == "attention_grad_kv" else b * h * sq
    scale = literal(float(node.attr("scale")))
    return {"ROWS": rows, "H": h, "HKV": hkv, "SQ": sq, "SKV": skv, "D": d, "SCALE": scale, **dropout_sizes(node)}


def attention_label(graph: Graph, node: Node, extra: str = "") -> str:
    q, k = node.inputs[:2]
    causal = " causal" if node.attr("causal") else ""
    causal += f" dropout {node.attr('dropout'):g}" if dropout_of(node) else ""
    return f"{node.op} q {shape_text(graph[q].shape)} kv {shape_text(graph[k].shape)}{causal}{extra}"


def lower_attention_tiles(graph: Graph, node: Node, tiles: Tiles, target: Target) -> KernelSpec:
    """The flash-style kernel of `node` with `tiles` on `target` (the benchmark and tests pass
    others than the chosen ones; ValueError where they do not fit its workgroup memory)."""
    bindings, flags = attention_bindings(node)
    sizes = attention_sizes(graph, node)
    b, h, sq, d = graph[node.inputs[0]].shape
    _, hkv, skv, _ = graph[node.inputs[1]].shape
    layout = layout_for(node.op, tiles, d, target)
    if dropout_of(node) and tiles.bc % 8:
        raise ValueError(
            f"attention tiles {tiles} at head_dim {d}: dropout stages its mask by eight keys, "
            "BC must be a multiple of 8"
        )
    if node.op == "attention_grad_kv":
        per_head, heads = tiles_needed(skv, tiles.bc), b * (h if node.attr("per_query_head") else hkv)
    else:
        per_head, heads = tiles_needed(sq, tiles.br), b * h
    count = per_head * heads
    grid = grid_for(count)
    reads = tuple(binding.name for binding in bindings if binding.access == "read" and binding.name not in ROW_READS)
    writes = tuple(binding.name for binding in bindings if binding.access != "read" and binding.name not in ROW_WRITES)
    wgsl = render(
        "attention",
        {
            "BINDINGS": bindings_wgsl(graph, bindings, vec4_bindings(reads + writes, d)),
            **sizes,
            "GRID_X": max(grid[0], 1),
            "BR": tiles.br,
            "BC": tiles.bc,
            "THREADS": tiles.threads,
            "DV": vec4s(d),
            "TILES": count,
            "SEQ_TILES": per_head,
            "VEC4": vec4_helpers(reads, writes, d),
            **tile_code(layout, bool(node.attr("scores", False))),
            **flags,
            "ROWS_AHEAD": ROWS_AHEAD and node.op == "attention_grad_kv" and tiles.threads >= tiles.br,
        },
    )
    split = " per query head" if node.attr("per_query_head", False) else ""
    split += " writes dS" if node.attr("scores", False) else ""
    label = attention_label(graph, node, f"{split} tiles {tiles} {per_thread_work(layout)}")
    results = len(kernel_writes(node))
    return KernelSpec(
        node.id,
        label,
        wgsl,
        node.op,
        tuple(bindings),
        grid,
        (tiles.threads, 1, 1),
        results=results,
        workgroup_memory=workgroup_bytes(node.op, tiles, d, dropout_of(node)),
    )


def lower_attention_rows(graph: Graph, node: Node) -> KernelSpec:
    """The CPU kernel of `node`: a thread per row (attention_rows.wgsl)."""
    if node.attr("per_query_head", False):
        raise NotImplementedError(
            f"attention_grad_kv per query head has no CPU kernel (a thread per key row sums its group): "
            f"node %{node.id}; the plan makes one only for GPUs (passes/attention_heads.py split_attention_heads)"
        )
    if node.attr("scores", False):
        raise NotImplementedError(
            f"attention_grad_kv writing dS has no CPU kernel (a thread per key row): node %{node.id}; the plan "
            "makes one only for GPUs (passes/attention_scores.py dq_from_scores)"
        )
    bindings, flags = attention_bindings(node)
    sizes = attention_sizes(graph, node)
    grid = grid_for(-(-int(sizes["ROWS"]) // ROWS_PER_CPU_WORKGROUP))
    wgsl = render(
        "attention_rows",
        {"BINDINGS": bindings_wgsl(graph, bindings), **sizes, "GRID_X": max(grid[0], 1), **flags},
    )
    results = len(ATTENTION_KERNELS[node.op][1])
    return KernelSpec(
        node.id,
        attention_label(graph, node),
        wgsl,
        node.op,
        tuple(bindings),
        grid,
        (ROWS_PER_CPU_WORKGROUP, 1, 1),
        results=results,
    )
