"""Fused attention (F.scaled_dot_product_attention): the ops' numpy semantics against a plain
softmax reference, their gradients against finite differences mid-chain, the WGSL kernels against
the interpreter on the default adapter, and a tiny GQA model training on the GPU like the
interpreter."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, emit, gradcheck, trace_leaf, typed_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen import attention_tiles
from meganeura.codegen.attention_tiles import Tiles
from meganeura.codegen.registry import node_workgroups
from meganeura.codegen.transformer import balanced_grad_kv_workgroups, lower_attention_tiles
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError
from meganeura.ir.ops.transformer import (
    attention_delta,
    evaluate_attention,
    evaluate_attention_grad_kv,
    evaluate_attention_grad_q,
    evaluate_attention_lse,
    sum_groups,
)
from meganeura.ir.trace import Tracer, tracing
from meganeura.passes import attention_heads, attention_scores, compile_step
from meganeura.runtime import Executable, default_device
from meganeura.target import GENERIC, Target, target_for

RNG = np.random.default_rng(7)


def reference(q, k, v, causal, scale):
    """The textbook form: explicit mask, softmax, repeated KV heads."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -1e30), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    return (p / p.sum(-1, keepdims=True)) @ v, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
@pytest.mark.parametrize("seqs", [(5, 5), (3, 6), (6, 3)])
def test_attention_semantics(causal, heads, seqs):
    (h, hkv), (sq, skv) = heads, seqs
    q, k, v = RNG.normal(size=(2, h, sq, 4)), RNG.normal(size=(2, hkv, skv, 4)), RNG.normal(size=(2, hkv, skv, 4))
    out, lse = reference(q, k, v, causal, 0.4)
    got_out, got_lse = evaluate_attention(q, k, v, causal=causal, scale=0.4)  # one op, two results
    np.testing.assert_allclose(got_out, out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got_lse, lse, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(evaluate_attention_lse(q, k, causal, 0.4), lse, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shapes",
    [((1, 2, 3, 2), (1, 2, 3, 2)), ((1, 4, 3, 2), (1, 2, 5, 2)), ((2, 2, 5, 3), (2, 1, 3, 3))],
    ids=["mha", "gqa-4/2-sq3-skv5", "gqa-2/1-sq5-skv3"],
)
def test_attention_gradients_mid_chain(causal, shapes):
    q_shape, kv_shape = shapes

    def op(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    assert gradcheck(op, [q_shape, kv_shape, kv_shape], np.random.default_rng(1)) < 1e-6


def test_attention_gradients_with_an_explicit_scale():
    def op(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, scale=0.9, is_causal=True)

    assert gradcheck(op, [(1, 1, 4, 3)] * 3, np.random.default_rng(2)) < 1e-6


def trace_sdpa(q_shape, kv_shape, **kwargs):
    tracer = Tracer()
    with tracing(tracer):
        q = trace_leaf(tracer, "input", "q", TensorType(q_shape))
        k = trace_leaf(tracer, "input", "k", TensorType(kv_shape))
        v = trace_leaf(tracer, "input", "v", TensorType(kv_shape))
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def test_sdpa_defaults_and_refusals():
    out = trace_sdpa((1, 2, 3, 16), (1, 2, 5, 16))
    graph = out.tracer.graph
    projection = graph[out.node]  # the output is result 0 of the attention node
    assert projection.op == "result" and projection.attr("index") == 0
    node = graph[projection.inputs[0]]
    assert node.op == "attention" and node.attr("scale") == 0.25 and node.attr("causal") is False
    assert [t.shape for t in node.types] == [(1, 2, 3, 16), (1, 2, 3)]  # the output and the row log-sum-exp
    assert out.shape == (1, 2, 3, 16)
    with pytest.raises(ShapeError, match="enable_gqa=True"):
        trace_sdpa((1, 4, 3, 8), (1, 2, 3, 8))
    with pytest.raises(ShapeError, match="heads dividing"):
        trace_sdpa((1, 4, 3, 8), (1, 3, 3, 8), enable_gqa=True)
    with pytest.raises(TypeError, match="expected a Tensor"):
        trace_sdpa((1, 2, 3, 8), (1, 2, 3, 8), attn_mask=np.zeros((3, 3)))
    with pytest.raises(ValueError, match="between 0 and 1"):
        trace_sdpa((1, 2, 3, 8), (1, 2, 3, 8), dropout_p=1.5)
    with pytest.raises(ShapeError, match="4-D"):
        trace_sdpa((2, 3, 8), (2, 3, 8))


# -- kernels against the interpreter --------------------------------------------------------------


def attention_inputs(q_shape, kv_shape, seed: int) -> dict[str, np.ndarray]:
    """Normal q, k, v and the incoming gradient do for `attention_graph`."""
    rng = np.random.default_rng(seed)
    shapes = (("q", q_shape), ("k", kv_shape), ("v", kv_shape), ("do", q_shape))
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes}


def attention_graph(q_shape, kv_shape, causal, scale):
    """Every attention op on the same inputs: the forward (o, lse), dQ and (dK, dV), with o, lse
    and the rows' D = Σ dO∘O computed on the device too, as the backward reads them."""
    graph = Graph()
    q, k, v = (typed_leaf(graph, "input", n, s) for n, s in (("q", q_shape), ("k", kv_shape), ("v", kv_shape)))
    d_o = typed_leaf(graph, "input", "do", q_shape)
    attrs = {"causal": causal, "scale": scale}
    forward = emit(graph, "attention", [q, k, v], **attrs)
    o, lse = (emit(graph, "result", [forward], index=i) for i in (0, 1))
    graph.outputs.update(o=o, lse=lse)
    rows = {"kind": "sum", "axes": (3,), "keepdim": False, "in_shape": q_shape, "prologue": "mul($0,$1)"}
    delta = emit(graph, "fused_reduce", [d_o, o], **rows)
    operands = [q, k, v, delta, lse, d_o]
    graph.outputs["dq"] = emit(graph, "attention_grad_q", operands, **attrs)
    kv = emit(graph, "attention_grad_kv", operands, **attrs)
    graph.outputs["dk"], graph.outputs["dv"] = (emit(graph, "result", [kv], index=i) for i in (0, 1))
    return graph


def shape_id(shape) -> str:
    return "x".join(map(str, shape))


KERNEL_CASES = [
    ((1, 4, 1, 8), (1, 2, 1, 8)),  # Sq = Skv = 1
    ((1, 4, 7, 8), (1, 1, 7, 8)),  # GQA 4/1
    ((2, 4, 7, 16), (2, 2, 7, 16)),  # GQA 4/2
    ((1, 4, 33, 16), (1, 2, 33, 16)),  # longer than a tile (WG = 32)
    ((1, 2, 33, 8), (1, 2, 7, 8)),  # Sq > Skv
    ((1, 2, 7, 8), (1, 1, 33, 8)),  # Sq < Skv
    ((1, 2, 5, 48), (1, 1, 9, 48)),  # head_dim not a power of two, WG = 64
]


CPU = Target("cpu", 2, 32, cpu=True)  # shaders/attention_rows.wgsl: a thread per row


@pytest.mark.parametrize("target", [GENERIC, CPU], ids=["gpu-kernels", "cpu-kernels"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shapes", KERNEL_CASES, ids=lambda s: f"q{shape_id(s[0])}-kv{shape_id(s[1])}")
def test_attention_kernels(causal, shapes, target, monkeypatch):
    """The three kernels against the interpreter, dQ's own kernel kept (a GPU's plan may take dQ
    from dS instead: passes/attention_scores.py, tested at the ragged shapes below)."""
    monkeypatch.setattr(attention_scores, "route_pays", lambda *args: False)
    q_shape, kv_shape = shapes
    graph = attention_graph(q_shape, kv_shape, causal, 1.0 / np.sqrt(q_shape[-1]))
    inputs = attention_inputs(q_shape, kv_shape, seed=3)
    executable = check(graph, inputs, rtol=1e-4, atol=2e-5, target=target)
    # One pass writes o and the LSE; one reduction the rows' D; one key-row kernel writes dK and
    # dV: four dispatches.
    labels = sorted(spec.label.split(" ")[0] for spec in executable.kernels)
    assert labels == ["attention", "attention_grad_kv", "attention_grad_q", "fused_reduce"]
    assert sorted(spec.results for spec in executable.kernels) == [1, 1, 2, 2]


# The tiled GPU kernels (codegen/attention_tiles.py) at sequence lengths that are no multiple of
# any tile, the head_dims of real models, and several tile configurations each.
RAGGED_CASES = [
    ((2, 3, 37, 64), (2, 1, 45, 64)),  # GQA 3/1 as SmolLM2's 9/3, Sq < Skv, batch 2
    ((1, 2, 45, 64), (1, 2, 19, 64)),  # MHA, Sq > Skv
    ((1, 3, 37, 32), (1, 1, 45, 32)),
    ((1, 3, 21, 48), (1, 3, 21, 48)),
    ((1, 2, 19, 80), (1, 1, 23, 80)),
    ((1, 2, 17, 128), (1, 1, 33, 128)),
    ((1, 2, 9, 6), (1, 1, 11, 6)),  # head_dim not a multiple of 4: guarded vec4 loads and stores
]
TILINGS = {  # per head_dim: configurations tried beside the chosen one (by each kernel that it fits)
    # The hopper family's forward 32x32/128p (23040 bytes) fits lavapipe's 32 KiB at head_dim 64.
    64: [Tiles(16, 16, 64), Tiles(32, 32, 64), Tiles(8, 16, 32), Tiles(16, 16, 64, prefetch=True)]
    + [Tiles(32, 32, 128, prefetch=True)],
    # Its backward tiles at head_dim 64 (dQ 39296, dK/dV 43520 bytes, at 32x32/256p as at
    # 32x32/128p before) do not: their code, from the same generator, at head_dim 32 (22912, 27136),
    # with the forward's 64x32/256p chosen before 2026-12-02 (25088).
    32: [
        Tiles(32, 32, 128),
        Tiles(32, 32, 128, prefetch=True),
        Tiles(32, 32, 256, prefetch=True),
        Tiles(64, 32, 256, prefetch=True),
    ],
    # dK/dV only: 8 query rows of 12 vec4s over 64 threads, the prefetch's guarded elements
    48: [Tiles(8, 16, 64, prefetch=True)],
    6: [
        Tiles(8, 4, 4),
        Tiles(8, 4, 4, prefetch=True),
    ],  # fewer threads than query rows: the per-row loops take several rows a thread
}


def tiling_cases():
    for q_shape, kv_shape in RAGGED_CASES:
        yield q_shape, kv_shape, None
        for tiles in TILINGS.get(q_shape[-1], []):
            yield q_shape, kv_shape, tiles


def ragged_cases():
    """Each tiling case as planned; where KV heads are grouped also with the grouped dK/dV kernel
    kept (the plan may split it per query head, passes/attention_heads.py); and for the chosen
    tiles and those of the guarded head_dims, with dQ taken from the dS that dK/dV writes
    (passes/attention_scores.py), grouped or split as planned."""
    for q_shape, kv_shape, tiles in tiling_cases():
        yield q_shape, kv_shape, tiles, "planned"
        if q_shape[1] != kv_shape[1]:
            yield q_shape, kv_shape, tiles, "grouped"
        if tiles is None or q_shape[-1] in (48, 6):
            yield q_shape, kv_shape, tiles, "scores"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "q_shape, kv_shape, tiles, variant",
    list(ragged_cases()),
    ids=lambda v: (
        "chosen" if v is None else str(v) if isinstance(v, Tiles) else v if isinstance(v, str) else shape_id(v)
    ),
)
def test_tiled_attention_kernels_at_ragged_shapes(causal, q_shape, kv_shape, tiles, variant, monkeypatch):
    """Every kernel against the interpreter (`variant` "grouped": the grouped dK/dV kernel, not
    split; "scores": dQ from dS wherever there is a dQ)."""
    grouped = variant == "grouped"
    if grouped:
        monkeypatch.setattr(attention_heads, "split_pays", lambda *args: False)
    scores = variant == "scores"
    monkeypatch.setattr(attention_scores, "route_pays", lambda *args: scores)
    d = q_shape[-1]
    kinds = ("attention", "attention_grad_q", "attention_grad_kv")
    if tiles is not None:
        fitting = [kind for kind in kinds if attention_tiles.fits(kind, tiles, d, GENERIC)]
        assert fitting, f"{tiles} fits no kernel at head_dim {d}"
        for kind in fitting:  # the lowering and the workgroup count both read the table
            monkeypatch.setitem(attention_tiles.CHOSEN, (GENERIC.tuning, kind, d), tiles)
    graph = attention_graph(q_shape, kv_shape, causal, 1.0 / np.sqrt(d))
    inputs = attention_inputs(q_shape, kv_shape, seed=11)
    executable = check(graph, inputs, rtol=1e-4, atol=3e-5)
    step = executable.graph  # the plan's: dK/dV per query head and their sums where split
    split = any(n.attr("per_query_head", False) for n in step if n.op == "attention_grad_kv")
    routed = attention_scores.dq_from_scores(graph, GENERIC)  # the graph the split sees
    (kv,) = [n for n in routed if n.op == "attention_grad_kv"]
    planned = attention_heads.grouped_heads(routed, kv) is not None and attention_heads.split_pays(routed, kv, GENERIC)
    assert split == (not grouped and planned)
    ops = sorted(step[spec.node].op for spec in executable.kernels if step[spec.node].op != "sum")
    dq = ["fused_matmul"] if scores else ["attention_grad_q"]
    assert ops == sorted(["attention", "attention_grad_kv", "fused_reduce", *dq])  # fused_reduce: the rows' D
    assert [n.attr("scores") for n in step if n.op == "attention_grad_kv"] == [scores]
    for spec in executable.kernels:
        node = step[spec.node]
        if node.op in ("sum", "fused_matmul", "fused_reduce"):
            continue
        wanted = attention_tiles.tiles_for(node.op, d, GENERIC)
        assert f"tiles {wanted} " in spec.label and spec.workgroup_size == (wanted.threads, 1, 1)
        assert math.prod(spec.grid) == dispatched_workgroups(step, node, wanted)
        assert spec.workgroup_memory == attention_tiles.workgroup_bytes(node.op, wanted, d)


@pytest.mark.parametrize(
    "d, tiles, ahead",
    [(8, Tiles(4, 8, 16), True), (8, Tiles(8, 4, 4), False), (6, Tiles(8, 4, 4), False), (64, None, True)],
    ids=["d8-4x8", "d8-8x4", "d6-8x4", "d64-chosen"],
)
@pytest.mark.parametrize("rows_ahead", [True, False], ids=["ahead", "staged"])
def test_dk_dv_loads_query_rows_ahead_and_moves_rows_as_vec4(d, tiles, ahead, rows_ahead, monkeypatch):
    """dK/dV loads each query tile's lse and D a tile ahead where it has a thread per query row of
    the tile (shaders/attention.wgsl ROWS_AHEAD; else, or turned off, it stages them after a
    barrier of their own); every kernel moves q, k, v, dO and its outputs as vec4 where head_dim is a
    multiple of 4, lse, D and dS as scalars (codegen/attention_tiles.py `vec4_bindings`). Both ways
    against the interpreter, causal, grouped heads, ragged sequences."""
    from meganeura.codegen import transformer

    monkeypatch.setattr(transformer, "ROWS_AHEAD", rows_ahead)
    monkeypatch.setattr(attention_scores, "route_pays", lambda *args: True)  # dK/dV writes dS
    if tiles is not None:
        for kind in KINDS:
            if attention_tiles.fits(kind, tiles, d, GENERIC):
                monkeypatch.setitem(attention_tiles.CHOSEN, (GENERIC.tuning, kind, d), tiles)
    q_shape, kv_shape = (2, 3, 21, d), (2, 1, 19, d)
    graph = attention_graph(q_shape, kv_shape, True, 0.3)
    inputs = attention_inputs(q_shape, kv_shape, seed=5)
    executable = check(graph, inputs, rtol=1e-4, atol=3e-5)
    (kv,) = [spec for spec in executable.kernels if spec.label.startswith("attention_grad_kv")]
    assert ("var rows_ahead" in kv.wgsl) == (ahead and rows_ahead)
    assert ("stage_rows(lid, bh, q0);" in kv.wgsl) == (not (ahead and rows_ahead))
    element = "vec4<f32>" if d % 4 == 0 else "f32"
    for spec in executable.kernels:
        if not spec.label.startswith("attention"):
            continue
        for name in ("q", "k", "v", "d_o", "out", "out_k", "out_v"):
            declared = re.search(rf"var<storage, read(?:_write)?> {name}: array<([^>]+>?)>;", spec.wgsl)
            assert declared is None or declared.group(1) == element, (spec.label, name)
        for name in ("lse", "delta", "out_lse", "out_s"):
            declared = re.search(rf"var<storage, read(?:_write)?> {name}: array<([^>]+>?)>;", spec.wgsl)
            assert declared is None or declared.group(1) == "f32", (spec.label, name)


@pytest.mark.parametrize("tile_major", [False, True], ids=["head-major", "tile-major"])
def test_both_workgroup_orders_compute_every_tile(tile_major, monkeypatch):
    """shaders/attention.wgsl numbers workgroups tile-major (every head's longest causal tile
    first, codegen/transformer.py TILE_MAJOR) or head-major: either covers every (head, tile)
    once, for the forward, dQ and dK/dV, and with dQ from the dS that dK/dV writes."""
    from meganeura.codegen import transformer

    monkeypatch.setattr(transformer, "TILE_MAJOR", tile_major)
    rng = np.random.default_rng(7)
    for scores in (False, True):
        monkeypatch.setattr(attention_scores, "route_pays", lambda *args, scores=scores: scores)
        graph = attention_graph((2, 3, 37, 64), (2, 1, 45, 64), True, 0.125)
        shapes = {"q": (2, 3, 37, 64), "k": (2, 1, 45, 64), "v": (2, 1, 45, 64), "do": (2, 3, 37, 64)}
        inputs = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
        executable = check(graph, inputs, rtol=1e-4, atol=3e-5)
        kernels = [spec.wgsl for spec in executable.kernels if "attention" in spec.label]
        assert len(kernels) == 3 - scores  # with dS, dQ is a matmul
        assert all(("return tile % HEADS_OUT;" in wgsl) == tile_major for wgsl in kernels)


def dispatched_workgroups(graph, node, tiles: Tiles, target: Target = GENERIC) -> int:
    """What an attention kernel dispatches, from the cost model's count: the same, except for
    dK/dV, which it counts as its work over its longest workgroup's (`balanced_grad_kv_workgroups`)."""
    counted = node_workgroups(graph, node, target)
    if node.op != "attention_grad_kv":
        return counted
    b, h, sq, _ = graph[node.inputs[0]].shape
    _, hkv, skv, _ = graph[node.inputs[1]].shape
    heads = b * (h if node.attr("per_query_head") else hkv)
    assert counted == balanced_grad_kv_workgroups(heads, sq, skv, tiles, bool(node.attr("causal")))
    return heads * -(-skv // tiles.bc)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "q_shape, kv_shape, tiles",
    [  # grouped heads (the split has parts to sum), tiles that fit dK/dV
        c
        for c in tiling_cases()
        if c[0][1] != c[1][1] and (c[2] is None or attention_tiles.fits("attention_grad_kv", c[2], c[0][-1], GENERIC))
    ],
    ids=lambda v: "chosen" if v is None else str(v) if isinstance(v, Tiles) else shape_id(v),
)
def test_dk_dv_per_query_head_at_ragged_shapes(causal, q_shape, kv_shape, tiles, monkeypatch):
    """attention_grad_kv(per_query_head=True): each query head's dK and dV [B, H, Skv, D], a
    workgroup per (b, query head, key tile); summed over each group they are the grouped kernel's."""
    d = q_shape[-1]
    if tiles is not None:
        monkeypatch.setitem(attention_tiles.CHOSEN, (GENERIC.tuning, "attention_grad_kv", d), tiles)
    rng = np.random.default_rng(5)
    b, h, sq, _ = q_shape
    shapes = [q_shape, kv_shape, kv_shape, (b, h, sq), (b, h, sq), q_shape]
    q, k, v, _, _, do = (rng.normal(size=shape).astype(np.float32) for shape in shapes)
    o, lse = evaluate_attention(q, k, v, causal=causal, scale=1.0 / np.sqrt(d))
    values = [q, k, v, attention_delta(o, do).astype(np.float32), lse.astype(np.float32), do]
    graph = Graph()
    leaves = [typed_leaf(graph, "input", f"x{i}", shape) for i, shape in enumerate(shapes)]
    node = emit(graph, "attention_grad_kv", leaves, causal=causal, scale=1.0 / np.sqrt(d), per_query_head=True)
    graph.outputs["dk"] = emit(graph, "result", [node], index=0)
    graph.outputs["dv"] = emit(graph, "result", [node], index=1)
    executable = check(graph, {f"x{i}": value for i, value in enumerate(values)}, rtol=1e-4, atol=3e-5)
    (spec,) = executable.kernels
    assert "per query head" in spec.label and graph[node].types[0].shape == (b, h, kv_shape[2], d)
    wanted = attention_tiles.tiles_for("attention_grad_kv", d, GENERIC)
    assert math.prod(spec.grid) == dispatched_workgroups(graph, graph[node], wanted)
    grouped = evaluate_attention_grad_kv(*values, causal=causal, scale=1.0 / np.sqrt(d))
    split = evaluate_attention_grad_kv(*values, causal=causal, scale=1.0 / np.sqrt(d), per_query_head=True)
    for whole, parts in zip(grouped, split, strict=True):
        np.testing.assert_allclose(sum_groups(parts, kv_shape[1]), whole, rtol=1e-5, atol=1e-5)


def test_every_chosen_configuration_runs_in_the_ragged_cases():
    """Each family's chosen tiles compute right above: at their head_dim where they fit the test
    device's 32 KiB (GENERIC's), else at a head_dim of TILINGS where the same generator fits them."""
    head_dims = {q_shape[-1] for q_shape, _ in RAGGED_CASES}
    for (family, kind, d), tiles in attention_tiles.CHOSEN.items():
        if attention_tiles.fits(kind, tiles, d, GENERIC):
            assert d in head_dims and tiles in [attention_tiles.tiles_for(kind, d, GENERIC), *TILINGS.get(d, [])]
        else:
            assert any(tiles in TILINGS[e] and attention_tiles.fits(kind, tiles, e, GENERIC) for e in TILINGS), (
                family,
                kind,
                tiles,
            )


def test_tile_configurations_that_do_not_fit_are_refused_with_a_reason():
    limit = GENERIC.workgroup_memory
    assert "workgroup memory" in attention_tiles.layout_of("attention_grad_kv", Tiles(32, 32, 128), 128, limit)
    assert "does not split" in attention_tiles.layout_of("attention", Tiles(32, 32, 96), 64, limit)
    with pytest.raises(ValueError, match="head_dim 128"):
        attention_tiles.layout_for("attention_grad_q", Tiles(64, 64, 256), 128, GENERIC)
    for kind in ("attention", "attention_grad_q", "attention_grad_kv"):
        for d in (1, 3, 48, 64, 80, 96, 128, 256):
            tiles = attention_tiles.tiles_for(kind, d, GENERIC)  # every head_dim gets a configuration that fits
            layout = attention_tiles.layout_for(kind, tiles, d, GENERIC)
            assert attention_tiles.workgroup_bytes(kind, tiles, d) <= GENERIC.workgroup_memory
            assert layout.sr * layout.sc * tiles.threads == tiles.br * tiles.bc


def target_with(tuning: str, workgroup_memory: int) -> Target:
    return Target(f"{tuning}, {workgroup_memory} B", 132, 31, tuning=tuning, workgroup_memory=workgroup_memory)


HOPPER = target_for("NVIDIA H200", "DiscreteGPU", {"max-compute-workgroup-storage-size": 48 * 1024})
KINDS = ("attention", "attention_grad_q", "attention_grad_kv")


def test_a_hopper_target_with_48_kib_takes_32x32_backward_tiles_at_head_dim_64():
    assert (HOPPER.tuning, HOPPER.workgroup_memory) == ("hopper", 49152)
    assert attention_tiles.tiles_for("attention", 64, HOPPER) == Tiles(32, 32, 128, prefetch=True)
    assert attention_tiles.tiles_for("attention_grad_q", 64, HOPPER) == Tiles(32, 32, 128)
    assert attention_tiles.tiles_for("attention_grad_kv", 64, HOPPER) == Tiles(32, 32, 256, prefetch=True)
    generic = [attention_tiles.CHOSEN[("generic", kind, 64)] for kind in KINDS]
    # The family with 32 KiB keeps its forward (23040 bytes) and takes the generic family's backward
    # tiles; a generic GPU keeps the generic ones with 48 KiB.
    assert [
        attention_tiles.tiles_for(kind, 64, dataclasses.replace(HOPPER, workgroup_memory=32768)) for kind in KINDS
    ] == [Tiles(32, 32, 128, prefetch=True), *generic[1:]]
    assert [attention_tiles.tiles_for(kind, 64, target_with("generic", 49152)) for kind in KINDS] == generic
    # The kernels lowered for the H200 dispatch the workgroups its cost model counts (SmolLM2's shape).
    graph = attention_graph((8, 9, 256, 64), (8, 3, 256, 64), True, 0.125)
    step = compile_step(graph, HOPPER)
    assert sorted(step.graph[spec.node].op for spec in step.kernels) == [
        "attention",
        "attention_grad_kv",
        "fused_matmul",  # dQ from the dS that dK/dV writes (passes/attention_scores.py)
        "fused_reduce",  # the rows' D = Σ dO∘O
        "sum",  # of dK's and dV's per-head parts
        "sum",
    ]
    for spec in step.kernels:
        node = step.graph[spec.node]
        if node.op in ("sum", "fused_matmul", "fused_reduce"):
            continue
        tiles = attention_tiles.tiles_for(node.op, 64, HOPPER)
        assert f"tiles {tiles} " in spec.label and spec.workgroup_size == (tiles.threads, 1, 1)
        assert math.prod(spec.grid) == dispatched_workgroups(graph, node, tiles, HOPPER)
        assert spec.workgroup_memory == attention_tiles.workgroup_bytes(node.op, tiles, 64) <= 49152
        if node.op == "attention_grad_kv":  # split per query head: 576 dispatched, none walks more than 8
            assert node.attr("per_query_head") and math.prod(spec.grid) == 576
            assert node_workgroups(step.graph, node, HOPPER) == 8 * 9 * 36 // 8
    (grouped,) = [n for n in graph if n.op == "attention_grad_kv"]  # 192 workgroups, the first walk 24 query tiles
    assert node_workgroups(graph, grouped, HOPPER) == 8 * 3 * 36 // 8 and attention_heads.split_pays(
        graph, grouped, HOPPER
    )


@pytest.mark.parametrize("workgroup_memory", [16384, 32768, 49152])
@pytest.mark.parametrize("tuning", ["generic", "hopper"])
def test_no_target_gets_tiles_over_its_workgroup_memory(tuning, workgroup_memory):
    target = target_with(tuning, workgroup_memory)
    refused = []
    for kind in KINDS:
        for d in (1, 3, 6, 8, 16, 32, 48, 64, 80, 96, 128, 256):
            try:
                tiles = attention_tiles.tiles_for(kind, d, target)
            except NotImplementedError as error:
                assert f"{workgroup_memory} bytes of workgroup memory" in str(error)
                refused.append((kind, d))
                continue
            assert attention_tiles.workgroup_bytes(kind, tiles, d) <= workgroup_memory, (kind, d, tiles)
            attention_tiles.layout_for(kind, tiles, d, target)
    # In WebGPU's 16 KiB, a backward tile of head_dim 256 (rows of 1040 bytes, four of each input) fits in none.
    assert refused == ([("attention_grad_q", 256), ("attention_grad_kv", 256)] if workgroup_memory == 16384 else [])


def test_tiles_over_the_workgroup_memory_are_refused_when_lowered_and_before_they_run():
    graph = attention_graph((1, 2, 37, 64), (1, 1, 45, 64), True, 0.125)
    grad_kv = next(node for node in graph if node.op == "attention_grad_kv")
    with pytest.raises(ValueError, match="needs 43520 bytes of workgroup memory, over the 32768 allowed"):
        lower_attention_tiles(graph, grad_kv, Tiles(32, 32, 256), GENERIC)  # forced on a 32 KiB target
    # Planned for the H200, run on the test device: wgpu would make the pipeline (lavapipe even runs
    # it, out of spec); the runtime refuses it, naming the limit.
    device = default_device()
    limit = device.limits["max-compute-workgroup-storage-size"]
    if limit >= 43520:
        pytest.skip(f"{device.describe()} offers {limit} bytes of workgroup memory: the H200's tiles fit")
    with pytest.raises(ValueError, match=rf"needs 43520 bytes of workgroup memory, .* allows {limit} \(max-compute-"):
        Executable(compile_step(graph, HOPPER), device, {}, {})


def test_the_report_counts_one_dispatch_for_each_node_with_two_results():
    from meganeura.explain import kernel_rows
    from meganeura.rewrite.cost import graph_cost

    graph = attention_graph((1, 4, 9, 8), (1, 2, 9, 8), True, 0.5)
    rows = {row.op: row for row in kernel_rows(graph)}
    assert set(rows) == {"attention", "attention_grad_q", "attention_grad_kv", "fused_reduce"}  # and the rows' D
    assert rows["attention"].shapes == ((1, 4, 9, 8), (1, 4, 9))
    assert rows["attention_grad_kv"].shapes == ((1, 2, 9, 8), (1, 2, 9, 8))
    assert graph_cost(graph).dispatches == 4  # the cost model prices one dispatch per node too


def test_an_unread_result_is_written_to_a_scratch_buffer():
    """The forward kernel writes both results; with only the log-sum-exp read, the output still
    gets a buffer of its own (and the plan does not reuse it under a live value)."""
    q_shape, kv_shape = (1, 4, 9, 8), (1, 2, 9, 8)
    graph = Graph()
    q, k, v = (typed_leaf(graph, "input", n, s) for n, s in (("q", q_shape), ("k", kv_shape), ("v", kv_shape)))
    forward = emit(graph, "attention", [q, k, v], causal=True, scale=0.5)
    graph.outputs["lse"] = emit(graph, "result", [forward], index=1)
    rng = np.random.default_rng(4)
    shapes = {"q": q_shape, "k": kv_shape, "v": kv_shape}
    inputs = {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}
    executable = check(graph, inputs, rtol=1e-4, atol=2e-5)
    (spec,) = executable.kernels
    slots = {executable.plan.slot(b) for b in spec.bindings if b.access == "read_write"}
    assert len(slots) == 2 and executable.plan.buffers[min(slots)].nbytes >= 4 * 9 * 4


# -- a tiny GQA model trains on the GPU like the interpreter ----------------------------------------

SEQ, EMBED, HEADS, KV_HEADS, HEAD_DIM, CLASSES = 7, 16, 4, 2, 8, 5


class TinyAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = nn.Linear(EMBED, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(EMBED, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(EMBED, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, CLASSES)

    def forward(self, x):
        batch, seq, _ = x.shape
        q = self.q_proj(x).reshape(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k_proj(x).reshape(batch, seq, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).reshape(batch, seq, KV_HEADS, HEAD_DIM).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        y = y.transpose(1, 2).reshape(batch * seq, HEADS * HEAD_DIM)
        return self.o_proj(y)


@pytest.mark.parametrize("rewrite", [True, False], ids=["fused", "unfused"])
def test_tiny_gqa_model_trains_on_the_gpu_like_the_interpreter(rewrite):
    mn.manual_seed(0)
    batch = 2
    program = mn.compile(
        TinyAttention(),
        loss=lambda model, x, y: F.cross_entropy(model(x), y),
        inputs={"x": mn.f32[batch, SEQ, EMBED], "y": mn.i32[batch * SEQ]},
        optimizer=optim.Adam(lr=1e-2),
        rewrite=rewrite,
    )
    wanted = {"attention", "attention_grad_q", "attention_grad_kv"}
    live = program.fused_graph.live_ids()
    assert wanted <= {node.op for node in program.fused_graph if node.id in live}  # through the e-graph and back
    rng = np.random.default_rng(5)
    x = rng.normal(size=(batch, SEQ, EMBED)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=batch * SEQ).astype(np.int32)
    losses = assert_steps_follow_interpreter(program, [{"x": x, "y": y}] * 3)
    assert losses[-1] < losses[0]


def test_grouped_gradients_split_per_query_head_on_a_gpu_where_the_cost_model_says_so():
    """passes/attention_heads.py: SmolLM2's 9/3 heads on the H200 take the per-head dK/dV kernel
    and a sum over each group for dK and dV; heads without groups, and a CPU, keep the graph."""
    smollm2 = attention_graph((8, 9, 256, 64), (8, 3, 256, 64), True, 0.125)
    split = attention_heads.split_attention_heads(smollm2, HOPPER)
    (kv,) = [n for n in split if n.op == "attention_grad_kv"]
    assert kv.attr("per_query_head") and kv.types == (TensorType((8, 9, 256, 64)),) * 2
    sums = [n for n in split if n.op == "sum"]
    assert [(n.attr("axes"), split[n.inputs[0]].shape, n.shape) for n in sums] == [
        ((2,), (8, 3, 3, 256, 64), (8, 3, 256, 64))
    ] * 2
    assert {split[split.outputs[name]].op for name in ("dk", "dv")} == {"sum"}
    mha = attention_graph((8, 12, 256, 64), (8, 12, 256, 64), True, 0.125)
    assert attention_heads.split_attention_heads(mha, HOPPER) is mha
    lavapipe = Target("lavapipe", 2, 32, cpu=True)
    assert attention_heads.split_attention_heads(smollm2, lavapipe) is smollm2
    with pytest.raises(NotImplementedError, match="no CPU kernel"):
        compile_step(split, lavapipe, multi_tensor=False)  # the row kernel has no per-head form


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (3, 1)])
@pytest.mark.parametrize("seqs", [(5, 5), (3, 6), (6, 3)])
def test_dq_is_the_matmul_of_the_scores_that_dk_dv_writes(causal, heads, seqs):
    """attention_grad_kv(scores=True)'s third result, dSᵀ·scale grouped by KV head [B, H_kv, Skv,
    G·Sq]: (dSᵀ)ᵀ·K per KV head is dQ (passes/attention_scores.py), and it is zero where the
    causal mask hides a key; dK and dV are unchanged."""
    (h, hkv), (sq, skv) = heads, seqs
    rng = np.random.default_rng(4)
    q, k, v, do = (rng.normal(size=s) for s in ((2, h, sq, 4), (2, hkv, skv, 4), (2, hkv, skv, 4), (2, h, sq, 4)))
    o, lse = evaluate_attention(q, k, v, causal=causal, scale=0.4)
    backward = (q, k, v, attention_delta(o, do), lse, do)
    attrs = {"causal": causal, "scale": 0.4}
    grad_k, grad_v, scores = evaluate_attention_grad_kv(*backward, **attrs, scores=True)
    assert scores.shape == (2, hkv, skv, h // hkv * sq)
    dq = (np.swapaxes(scores, -1, -2) @ k).reshape(2, h, sq, 4)
    np.testing.assert_allclose(dq, evaluate_attention_grad_q(*backward, **attrs), rtol=1e-12, atol=1e-12)
    for got, plain in zip((grad_k, grad_v), evaluate_attention_grad_kv(*backward, **attrs), strict=True):
        np.testing.assert_array_equal(got, plain)
    per_head = np.moveaxis(scores.reshape(2, hkv, skv, h // hkv, sq), 3, 2)  # [b, kv head, g, key, query]
    hidden = np.arange(skv)[:, None] > np.arange(sq)[None, :]  # [key, query]: the causal mask's
    assert np.count_nonzero(per_head[..., ~hidden]) > per_head[..., ~hidden].size // 2
    if causal:
        assert (per_head[..., hidden] == 0).all()


def test_dq_comes_from_the_scores_on_a_gpu_where_the_cost_model_says_so():
    """passes/attention_scores.py on the H200: SmolLM2's and GPT-2's layers (batch 8 × seq 256)
    take dQ as the matmul of the dS that dK/dV writes, the split per query head after it keeps dS
    as it is; sequences whose dS passes SCORES_LIMIT, a CPU, and a dQ without its dK/dV keep the
    dQ kernel."""
    smollm2 = attention_graph((8, 9, 256, 64), (8, 3, 256, 64), True, 0.125)
    routed = attention_scores.dq_from_scores(smollm2, HOPPER)
    assert "attention_grad_q" not in {n.op for n in routed}
    (kv,) = [n for n in routed if n.op == "attention_grad_kv"]
    assert kv.attr("scores") and kv.types[2] == TensorType((8, 3, 256, 3 * 256))
    dq = routed[routed.outputs["dq"]]
    product = routed[dq.inputs[0]]
    assert dq.op == "reshape" and dq.shape == (8, 9, 256, 64)
    assert product.op == "fused_matmul" and product.attr("transpose_a") and product.shape == (8, 3, 768, 64)
    assert product.attr("causal_rows") == 256  # row r of (dSᵀ)ᵀ is query r mod 256: zero past that key
    assert routed[product.inputs[0]].op == "result" and routed[product.inputs[0]].attr("index") == 2
    split = attention_heads.split_attention_heads(routed, HOPPER)
    (kv,) = [n for n in split if n.op == "attention_grad_kv"]
    assert kv.attr("per_query_head") and kv.types[2] == TensorType((8, 3, 256, 768))
    assert sum(n.op == "sum" for n in split) == 2  # dK's and dV's group sums, none for dS
    mha = attention_graph((8, 12, 256, 64), (8, 12, 256, 64), True, 0.125)
    assert "attention_grad_q" not in {n.op for n in attention_scores.dq_from_scores(mha, HOPPER)}
    long = attention_graph((8, 9, 2048, 64), (8, 3, 2048, 64), True, 0.125)  # dS: 1.2 GB
    assert attention_scores.dq_from_scores(long, HOPPER) is long
    lavapipe = Target("lavapipe", 2, 32, cpu=True)
    assert attention_scores.dq_from_scores(smollm2, lavapipe) is smollm2
    eight = Target("WebGPU's default limits", 132, 8, tuning="hopper", workgroup_memory=49152)  # dK/dV with dS binds 9
    assert attention_scores.dq_from_scores(smollm2, eight) is smollm2
    nine = Target("nine storage buffers", 132, 9, tuning="hopper", workgroup_memory=49152)
    assert "attention_grad_q" not in {n.op for n in attention_scores.dq_from_scores(smollm2, nine)}
    with pytest.raises(NotImplementedError, match="writing dS has no CPU kernel"):
        compile_step(routed, lavapipe, multi_tensor=False)
    alone = Graph()  # a dQ whose graph has no dK/dV (k and v need no gradient): nothing to take dS from
    q_shape, kv_shape = (8, 9, 256, 64), (8, 3, 256, 64)
    shapes = {"q": q_shape, "k": kv_shape, "v": kv_shape, "delta": q_shape[:3], "lse": q_shape[:3], "do": q_shape}
    leaves = [typed_leaf(alone, "input", name, shape) for name, shape in shapes.items()]
    alone.outputs["dq"] = emit(alone, "attention_grad_q", leaves, causal=True, scale=0.125)
    assert attention_scores.dq_from_scores(alone, HOPPER) is alone


@pytest.mark.parametrize("route", ["dq kernel", "scores"])
def test_causal_key_tiles_past_every_query_walk_nothing(route, monkeypatch):
    """Causal with Skv well over Sq and small query tiles: the key tiles from 16 on lie past every
    query tile (Q_TILES · BR = 8), so their dK/dV workgroups walk no tile (the walk's length
    was an unsigned subtraction that underflowed there) and write zero gradients, and dS zeros
    where dQ is taken from it."""
    tiles = Tiles(4, 8, 16)  # dK/dV's: 4 query rows a tile
    assert attention_tiles.fits("attention_grad_kv", tiles, 8, GENERIC)
    monkeypatch.setitem(attention_tiles.CHOSEN, (GENERIC.tuning, "attention_grad_kv", 8), tiles)
    monkeypatch.setattr(attention_scores, "route_pays", lambda *args: route == "scores")
    q_shape, kv_shape = (1, 2, 7, 8), (1, 1, 33, 8)
    graph = attention_graph(q_shape, kv_shape, True, 0.35)
    inputs = attention_inputs(q_shape, kv_shape, seed=9)
    executable = check(graph, inputs, rtol=1e-4, atol=3e-5)
    assert any(f"tiles {tiles} " in spec.label for spec in executable.kernels)
    got = executable.run(inputs, read=("dk",))["dk"]
    assert np.abs(got[:, :, 7:]).max() == 0 and np.abs(got[:, :, :7]).max() > 0


# -- attention with attn_mask (traced plain: matmuls, the masked softmax) --------------------------


def masked_reference(q, k, v, mask, scale, boolean):
    """torch's reference: bias −inf where a boolean mask is False (or the additive mask), repeated
    KV heads, a softmax whose row of hidden keys gives zeros (torch's _safe_softmax)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    bias = np.where(mask, 0.0, -np.inf) if boolean else mask
    s = q @ np.swapaxes(k, -1, -2) * scale + bias
    top = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    p = np.where(np.isneginf(top), 0.0, p / np.where(np.isneginf(top), 1.0, p.sum(-1, keepdims=True)))
    return p @ v


def masked_graph(q_shape, kv_shape, mask_shape, boolean: bool, **kwargs):
    """out = sdpa(q, k, v, attn_mask) with the mask an input `m` (boolean: passed as `m > 0`)."""
    tracer = Tracer()
    with tracing(tracer):
        q, k, v = (
            trace_leaf(tracer, "input", n, TensorType(s)) for n, s in (("q", q_shape), ("k", kv_shape), ("v", kv_shape))
        )
        m = trace_leaf(tracer, "input", "m", TensorType(mask_shape))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0.0 if boolean else m, **kwargs)
    tracer.graph.outputs["out"] = out.node
    return tracer.graph


@pytest.mark.parametrize("boolean", [True, False], ids=["bool", "additive"])
@pytest.mark.parametrize(
    "q_shape, kv_shape, mask_shape",
    [
        ((2, 2, 5, 4), (2, 2, 6, 4), (5, 6)),
        ((2, 4, 3, 4), (2, 2, 7, 4), (2, 1, 3, 7)),
        ((1, 3, 4, 2), (1, 1, 4, 2), (1, 3, 1, 4)),
    ],
    ids=["mha-[sq,skv]", "gqa-[b,1,sq,skv]", "mqa-[1,h,1,skv]"],
)
def test_masked_attention_matches_the_reference(boolean, q_shape, kv_shape, mask_shape):
    rng = np.random.default_rng(11)
    q, k, v = rng.normal(size=q_shape), rng.normal(size=kv_shape), rng.normal(size=kv_shape)
    if boolean:
        m = np.where(rng.random(mask_shape) < 0.5, 1.0, -1.0)
        m[..., 0] = 1.0
    else:
        m = np.where(rng.random(mask_shape) < 0.3, -np.inf, rng.normal(size=mask_shape))
    m.reshape(-1, mask_shape[-1])[-1] = -1.0 if boolean else -np.inf  # a row that hides every key
    graph = masked_graph(q_shape, kv_shape, mask_shape, boolean, scale=0.7, enable_gqa=True)
    got = interpret(graph, {"q": q, "k": k, "v": v, "m": m}, dtype=np.float64).outputs["out"]
    expected = masked_reference(q, k, v, m > 0 if boolean else m, 0.7, boolean)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert np.isfinite(got).all() and (got == 0).all(axis=-1).any()  # the hidden rows give zeros, not NaN
    check(graph, {name: value.astype(np.float32) for name, value in (("q", q), ("k", k), ("v", v), ("m", m))})


def test_masked_attention_gradients_mid_chain():
    """Through q, k, v and an additive mask that is a parameter (a learned bias [sq, skv]); and
    through q, k, v under a boolean mask made by a comparison (causal_mask(…) == 0)."""

    def additive(q, k, v, bias):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)

    shapes = [(1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 2), (3, 5)]
    assert gradcheck(additive, shapes, np.random.default_rng(2)) < 1e-6

    def boolean(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=F.causal_mask(4, 5) == 0.0, scale=0.5)

    assert gradcheck(boolean, [(2, 2, 4, 3), (2, 2, 5, 3), (2, 2, 5, 3)], np.random.default_rng(3)) < 1e-6


def test_a_causal_boolean_mask_gives_the_fused_causal_attention():
    rng = np.random.default_rng(4)
    tracer = Tracer()
    with tracing(tracer):
        q, k, v = (trace_leaf(tracer, "input", n, TensorType((2, 2, 5, 4))) for n in "qkv")
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=F.causal_mask(5) == 0.0)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    tracer.graph.outputs.update(masked=masked.node, causal=causal.node)
    out = interpret(tracer.graph, {n: rng.normal(size=(2, 2, 5, 4)) for n in "qkv"}, dtype=np.float64).outputs
    np.testing.assert_allclose(out["masked"], out["causal"], rtol=1e-12, atol=1e-12)


def test_boolean_masks_are_comparisons_and_other_masks_add():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((3, 4)))
        y = trace_leaf(tracer, "input", "y", TensorType((3, 4)))
        assert F.is_boolean_mask(x > 0) and F.is_boolean_mask(x == y)
        assert F.is_boolean_mask((x > 0).reshape(1, 3, 4)) and F.is_boolean_mask((x > 0)[:, :2])
        assert F.is_boolean_mask((x > 0) * (y < 1)) and F.is_boolean_mask(F.where(x > 0, y > 0, x < 0))
        assert (
            not F.is_boolean_mask(x) and not F.is_boolean_mask((x > 0) * 2.0) and not F.is_boolean_mask((x > 0) + 0.0)
        )


def test_masked_attention_refusals():
    mask = Tracer()
    with pytest.raises(
        RuntimeError, match=r"test_attention\.py:\d+: _scaled_dot_product_attention: Explicit attn_mask"
    ):
        with tracing(mask):
            m = trace_leaf(mask, "input", "m", TensorType((3, 3)))
            q = trace_leaf(mask, "input", "q", TensorType((1, 2, 3, 8)))
            F.scaled_dot_product_attention(q, q, q, attn_mask=m, is_causal=True)
    tracer = Tracer()
    with tracing(tracer):
        q = trace_leaf(tracer, "input", "q", TensorType((1, 2, 3, 8)))
        with pytest.raises(ShapeError, match=r"attn_mask must be an f32 additive mask or a comparison's mask"):
            F.scaled_dot_product_attention(
                q, q, q, attn_mask=trace_leaf(tracer, "input", "i", TensorType((3, 3), "i32"))
            )
        with pytest.raises(ShapeError, match=r"attn_mask f32\[3,4\] does not broadcast to \[1, 2, 3, 3\]"):
            F.scaled_dot_product_attention(q, q, q, attn_mask=trace_leaf(tracer, "input", "w", TensorType((3, 4))))
        k = trace_leaf(tracer, "input", "k", TensorType((1, 3, 3, 8)))
        with pytest.raises(ShapeError, match="heads dividing 2"):
            F.scaled_dot_product_attention(q, k, k, attn_mask=q[0, 0, :, :3] > 0, enable_gqa=True)


class MaskedAttention(nn.Module):
    """A self-attention over padded sequences: a boolean padding mask from the input (keys whose
    `keep` is 0 are hidden; a sequence of all padding hides every key) plus a learned additive
    bias over positions."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(EMBED, 3 * HEADS * HEAD_DIM, bias=False)
        self.bias = nn.Parameter(np.zeros((SEQ, SEQ), np.float32))
        self.head = nn.Linear(HEADS * HEAD_DIM, CLASSES)

    def forward(self, x, keep):
        batch = x.shape[0]
        q, k, v = (
            t.reshape(batch, SEQ, HEADS, HEAD_DIM).transpose(1, 2)
            for t in (self.qkv(x)[..., i * HEADS * HEAD_DIM : (i + 1) * HEADS * HEAD_DIM] for i in range(3))
        )
        padding = (keep > 0.5).reshape(batch, 1, 1, SEQ)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=padding) + F.scaled_dot_product_attention(
            q, k, v, attn_mask=self.bias
        )
        return self.head(y.transpose(1, 2).reshape(batch * SEQ, HEADS * HEAD_DIM))


def test_masked_attention_trains_on_the_gpu_like_the_interpreter():
    mn.manual_seed(0)
    batch = 3
    program = mn.compile(
        MaskedAttention(),
        loss=lambda model, x, keep, y: F.cross_entropy(model(x, keep), y),
        inputs={"x": mn.f32[batch, SEQ, EMBED], "keep": mn.f32[batch, SEQ], "y": mn.i32[batch * SEQ]},
        optimizer=optim.Adam(lr=1e-2),
    )
    rng = np.random.default_rng(6)
    x = rng.normal(size=(batch, SEQ, EMBED)).astype(np.float32)
    keep = (rng.random((batch, SEQ)) < 0.7).astype(np.float32)
    keep[0, 0], keep[2] = 1.0, 0.0  # the last sequence is all padding: its rows give zeros
    y = rng.integers(0, CLASSES, size=batch * SEQ).astype(np.int32)
    losses = assert_steps_follow_interpreter(program, [{"x": x, "keep": keep, "y": y}] * 3)
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    assert np.abs(program.state_dict()["bias"]).max() > 0  # the additive mask learns


def test_a_negative_infinity_literal_reads_back_from_its_text():
    """A boolean mask's −inf becomes an expression literal in the fused kernels: its text must parse."""
    from meganeura.ir.expr import format_expr, parse

    tree = ("where", ("$", "1"), 0.0, -math.inf)
    assert format_expr(tree) == "where($1,0.0,-inf)" and parse(format_expr(tree)) == tree
