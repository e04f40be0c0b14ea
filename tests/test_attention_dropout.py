"""Attention with dropout (F.scaled_dot_product_attention(dropout_p=p)) as one fused op: its numpy
semantics against the written-out formula, its mask's statistics, its gradients against finite
differences mid-chain, its kernels (tiled and per-row) against the interpreter at ragged shapes,
the mask the device draws against numpy's bit for bit, and a small GPT training on the GPU like
the interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, emit, gradcheck, typed_leaf
from test_attention import CPU, attention_inputs

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen import attention_tiles
from meganeura.codegen.attention_tiles import Tiles
from meganeura.ir.graph import Graph
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError
from meganeura.ir.ops.random import RNG_STATE, RNG_STATE_TYPE, rng_state
from meganeura.ir.ops.transformer import dropout_keep, dropout_threshold, evaluate_attention
from meganeura.passes import attention_heads, attention_scores
from meganeura.target import GENERIC

STATE = rng_state(11, 5)


def softmax_reference(q, k, v, causal, scale, keep, p):
    """dropout(softmax(q·kᵀ·scale [+ causal mask]))·v written out, the mask given, in float64."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1).astype(np.float64), np.repeat(v, group, axis=1).astype(np.float64)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    weights = np.exp(s - s.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return (weights * keep / (1.0 - p)) @ v


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_dropout_attention_is_the_written_out_formula_with_its_mask(causal, heads):
    rng = np.random.default_rng(1)
    (h, hkv), p = heads, 0.3
    q, k, v = rng.normal(size=(2, h, 5, 8)), rng.normal(size=(2, hkv, 11, 8)), rng.normal(size=(2, hkv, 11, 8))
    keep = dropout_keep(STATE, (2, h, 5, 11), 7, p)
    out, lse = evaluate_attention(q, k, v, STATE, causal=causal, scale=0.3, dropout=p, stream=7)
    np.testing.assert_allclose(out, softmax_reference(q, k, v, causal, 0.3, keep, p), rtol=1e-6, atol=1e-9)
    _, undropped_lse = evaluate_attention(q, k, v, causal=causal, scale=0.3)
    np.testing.assert_array_equal(lse, undropped_lse)  # the backward's lse is the undropped softmax's


def test_the_mask_keeps_one_minus_p_independently_per_pair_stream_and_step():
    shape = (4, 6, 64, 70)  # 107,520 pairs; Skv no multiple of 8 (the last Philox call is cut)
    for p in (0.1, 0.5):
        keep = dropout_keep(STATE, shape, 3, p)
        rate = 1.0 - dropout_threshold(p) / 2**16  # p rounded up to a multiple of 2⁻¹⁶
        assert abs(rate - (1.0 - p)) < 2**-16
        sigma = math.sqrt(rate * (1.0 - rate) / keep.size)
        assert abs(keep.mean() - rate) < 4 * sigma, (p, keep.mean())
        flat = keep.reshape(-1, shape[-1]).astype(np.float64)
        for lag in (1, 2, 8):  # neighbouring keys, within and across Philox calls: uncorrelated
            correlation = np.corrcoef(flat[:, :-lag].ravel(), flat[:, lag:].ravel())[0, 1]
            assert abs(correlation) < 4 / math.sqrt(flat[:, lag:].size), (p, lag, correlation)
    keep = dropout_keep(STATE, shape, 3, 0.5)
    others = {
        "stream": dropout_keep(STATE, shape, 4, 0.5),
        "step": dropout_keep(rng_state(11, 6), shape, 3, 0.5),
        "seed": dropout_keep(rng_state(12, 5), shape, 3, 0.5),
    }
    for name, other in others.items():  # independent masks: they agree on half the pairs
        agree = (keep == other).mean()
        assert abs(agree - 0.5) < 4 * 0.5 / math.sqrt(keep.size), (name, agree)
    np.testing.assert_array_equal(dropout_keep(STATE, shape, 3, 0.5), keep)  # a function of (state, stream)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shapes",
    [((1, 2, 3, 2), (1, 2, 9, 2)), ((1, 4, 5, 3), (1, 2, 4, 3))],
    ids=["mha-skv9", "gqa-4/2"],
)
def test_dropout_attention_gradients_mid_chain(causal, shapes):
    q_shape, kv_shape = shapes

    def op(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.4, is_causal=causal, enable_gqa=True)

    states = {RNG_STATE: STATE}
    assert gradcheck(op, [q_shape, kv_shape, kv_shape], np.random.default_rng(2), states=states) < 1e-6


def test_sdpa_with_dropout_is_one_op_reading_the_rng_state_with_a_stream_of_its_own():
    program = mn.compile(
        Dropped(0.25), inputs={"q": mn.f32[1, 2, 5, 8], "k": mn.f32[1, 2, 5, 8], "v": mn.f32[1, 2, 5, 8]}, seed=3
    )
    (node,) = [n for n in program.graph if n.op == "attention"]
    assert node.attr("dropout") == 0.25 and node.attr("causal") is True
    assert program.graph[node.inputs[-1]].type == RNG_STATE_TYPE
    with pytest.raises(ShapeError, match="takes the RNG state"):
        graph = Graph()
        q = typed_leaf(graph, "input", "q", (1, 2, 5, 8))
        emit(graph, "attention", [q, q, q], dropout=0.5)


class Dropped(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.p, is_causal=True)


def test_the_device_draws_the_mask_numpy_draws():
    """With q = 0 every weight is 1/Skv, and with v the identity the output is the mask itself:
    out[b, h, i, j] = keep_ij / ((1 − p)·Skv), bit for bit the interpreter's, on every kernel."""
    skv, p = 24, 0.5
    program = mn.compile(
        Dropped(p), inputs={"q": mn.f32[2, 3, 24, 24], "k": mn.f32[2, 3, skv, 24], "v": mn.f32[2, 3, skv, 24]}, seed=9
    )
    zeros = np.zeros((2, 3, 24, 24), np.float32)
    identity = np.broadcast_to(np.eye(skv, dtype=np.float32), (2, 3, skv, skv)).copy()
    got = program(q=zeros, k=zeros, v=identity)
    causal_rows = np.tril(np.ones((24, skv)))  # row i averages its i + 1 keys
    keep = dropout_keep(rng_state(9, 0), (2, 3, 24, skv), 0, p)
    expected = keep * causal_rows / (1.0 - p) / causal_rows.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert abs(keep[..., np.tril(np.ones((24, skv), bool))].mean() - 0.5) < 0.05


# -- kernels against the interpreter --------------------------------------------------------------


def dropout_graph(q_shape, kv_shape, causal, scale, p):
    """The three attention ops with dropout on one RNG state leaf, as `attention_graph` without."""
    graph = Graph()
    q, k, v = (typed_leaf(graph, "input", n, s) for n, s in (("q", q_shape), ("k", kv_shape), ("v", kv_shape)))
    d_o = typed_leaf(graph, "input", "do", q_shape)
    state = typed_leaf(graph, "state", RNG_STATE, (4,), "i32")
    attrs = {"causal": causal, "scale": scale, "dropout": p, "stream": 5}
    forward = emit(graph, "attention", [q, k, v, state], **attrs)
    o, lse = (emit(graph, "result", [forward], index=i) for i in (0, 1))
    graph.outputs.update(o=o, lse=lse)
    rows = {"kind": "sum", "axes": (3,), "keepdim": False, "in_shape": q_shape, "prologue": "mul($0,$1)"}
    delta = emit(graph, "fused_reduce", [d_o, o], **rows)
    operands = [q, k, v, delta, lse, d_o, state]
    graph.outputs["dq"] = emit(graph, "attention_grad_q", operands, **attrs)
    kv = emit(graph, "attention_grad_kv", operands, **attrs)
    graph.outputs["dk"], graph.outputs["dv"] = (emit(graph, "result", [kv], index=i) for i in (0, 1))
    return graph


DROPOUT_CASES = [
    ((1, 4, 7, 8), (1, 1, 7, 8), None),  # GQA 4/1, Skv no multiple of 8
    ((1, 2, 33, 16), (1, 2, 13, 16), None),  # Sq > Skv, more than one query tile
    ((2, 3, 37, 64), (2, 1, 45, 64), None),  # SmolLM2-like grouping, ragged
    ((2, 3, 37, 64), (2, 1, 45, 64), Tiles(16, 16, 64)),
    ((1, 2, 19, 32), (1, 2, 41, 32), Tiles(32, 32, 128, prefetch=True)),
    ((1, 2, 9, 6), (1, 1, 11, 6), Tiles(8, 8, 16)),  # head_dim no multiple of 4
]


@pytest.mark.parametrize("variant", ["planned", "scores", "grouped", "cpu"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "q_shape, kv_shape, tiles",
    DROPOUT_CASES,
    ids=lambda v: "chosen" if v is None else str(v) if isinstance(v, Tiles) else "x".join(map(str, v)),
)
def test_dropout_attention_kernels_at_ragged_shapes(q_shape, kv_shape, tiles, causal, variant, monkeypatch):
    """Forward, dQ and dK/dV with dropout against the interpreter: the tiled kernels as planned,
    with dQ from the dS that dK/dV writes ("scores"), with the grouped dK/dV kept ("grouped"), and
    the CPU's per-row kernels ("cpu")."""
    monkeypatch.setattr(attention_scores, "route_pays", lambda *args: variant == "scores")
    if variant == "grouped":
        monkeypatch.setattr(attention_heads, "split_pays", lambda *args: False)
    d = q_shape[-1]
    if tiles is not None:
        for kind in attention_tiles.KINDS:
            if attention_tiles.fits(kind, tiles, d, GENERIC):
                monkeypatch.setitem(attention_tiles.CHOSEN, (GENERIC.tuning, kind, d), tiles)
    graph = dropout_graph(q_shape, kv_shape, causal, 1.0 / math.sqrt(d), 0.3)
    inputs = attention_inputs(q_shape, kv_shape, seed=4)
    states = {RNG_STATE: STATE}
    target = CPU if variant == "cpu" else GENERIC
    executable = check(graph, inputs, rtol=1e-4, atol=3e-5, target=target, states=states)
    labels = [spec.label for spec in executable.kernels if spec.label.startswith("attention")]
    assert labels and all("dropout 0.3" in label for label in labels)
    dropped = interpret(graph, inputs, states=states, dtype=np.float64).outputs
    nearly_none = dropout_graph(q_shape, kv_shape, causal, 1.0 / math.sqrt(d), 1e-9)
    undropped = interpret(nearly_none, inputs, states=states).outputs
    assert not np.allclose(dropped["o"], undropped["o"], atol=1e-3)  # the mask does change the output


def test_tiles_whose_key_block_is_no_multiple_of_eight_are_refused_with_dropout():
    from meganeura.codegen.transformer import lower_attention_tiles

    graph = dropout_graph((1, 2, 9, 6), (1, 1, 11, 6), False, 0.5, 0.3)
    (node,) = [n for n in graph if n.op == "attention"]
    with pytest.raises(ValueError, match="multiple of 8"):
        lower_attention_tiles(graph, node, Tiles(8, 4, 4), GENERIC)


class TinyGPT(nn.Module):
    """Two causal blocks with SDPA dropout on the weights and dropout on the residual branches."""

    def __init__(self, vocab=13, dim=16, heads=2, p=0.2):
        super().__init__()
        self.heads, self.p = heads, p
        self.embed = nn.Embedding(vocab, dim)
        # No bias: a key's bias gets no gradient (the softmax ignores it), whose rounding Adam amplifies
        self.qkv = nn.ModuleList([nn.Linear(dim, 3 * dim, bias=False) for _ in range(2)])
        self.proj = nn.ModuleList([nn.Linear(dim, dim) for _ in range(2)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        batch, seq, dim = x.shape
        for qkv, proj in zip(self.qkv, self.proj, strict=True):
            q, k, v = qkv(x).reshape(batch, seq, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
            p = self.p if self.training else 0.0
            attended = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            x = x + F.dropout(proj(attended.transpose(1, 2).reshape(batch, seq, dim)), self.p, self.training)
        return self.head(self.norm(x))


def test_a_gpt_with_attention_dropout_trains_on_the_gpu_like_the_interpreter():
    mn.manual_seed(0)
    model = TinyGPT()

    def loss_fn(model, ids, targets):
        return F.cross_entropy(model(ids).reshape(-1, 13), targets.reshape(-1))

    program = mn.compile(
        model,
        loss=loss_fn,
        inputs={"ids": mn.i32[3, 10], "targets": mn.i32[3, 10]},
        optimizer=optim.AdamW(lr=1e-2),
        seed=5,
    )
    live = program.fused_graph.live_ids()
    fused = [n for n in program.fused_graph if n.id in live and n.op.startswith("attention")]
    assert sorted(n.op for n in fused) == ["attention"] * 2 + ["attention_grad_kv"] * 2 + ["attention_grad_q"] * 2
    assert all(n.attr("dropout") == 0.2 for n in fused)
    rng = np.random.default_rng(3)
    feeds = [{"ids": rng.integers(0, 13, (3, 10)), "targets": rng.integers(0, 13, (3, 10))} for _ in range(4)]
    feeds = [{k: v.astype(np.int32) for k, v in feed.items()} for feed in feeds]
    losses = assert_steps_follow_interpreter(program, feeds)
    assert all(np.isfinite(losses))
    report = program.report()
    assert "dropout 0.2" in str(report)
