"""The recognition family: hand-written attention, softmax(q·kᵀ·scale [+ mn.causal_mask])·v with
k/v repeated over the query heads (HF's repeat_kv), becomes the fused `attention` op on the
forward graph before autodiff; guards keep look-alikes as they are; the tiny char_lm trains
with the fused op's backward."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter
from hypothesis import given, settings
from hypothesis import strategies as st
from test_char_lm import BATCH, SEQ, TEXT, char_lm, tiny_model

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.ir.interpret import interpret


def repeat_kv(x, n_rep: int):
    batch, kv_heads, seq, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None].expand(batch, kv_heads, n_rep, seq, head_dim).reshape(batch, kv_heads * n_rep, seq, head_dim)


class HandAttention(nn.Module):
    """softmax(q·kᵀ·scale [+ mask]) · v written out; `scale_form` says how the scale is applied."""

    def __init__(self, heads, kv_heads, causal=True, scale_form="mul", mask_input=False, dim=-1, scale=None):
        super().__init__()
        self.heads, self.kv_heads, self.causal = heads, kv_heads, causal
        self.scale_form, self.mask_input, self.dim, self.scale = scale_form, mask_input, dim, scale

    def forward(self, q, k, v, mask=None, s=None):
        group = self.heads // self.kv_heads
        k, v = repeat_kv(k, group), repeat_kv(v, group)
        scores = q @ k.transpose(-2, -1)
        d = q.shape[-1]
        if self.scale_form == "mul":
            scores = scores * (1.0 / math.sqrt(d))
        elif self.scale_form == "mul_left":
            scores = (1.0 / math.sqrt(d)) * scores
        elif self.scale_form == "div":
            scores = scores / math.sqrt(d)
        elif self.scale_form == "tensor":
            scores = scores * s
        if self.mask_input:
            scores = scores + mask
        elif self.causal:
            scores = scores + mn.causal_mask(q.shape[2], k.shape[2])
        return F.softmax(scores, dim=self.dim) @ v


def trace(model, inputs, recognize=True):
    return trace_step(model, None, inputs, None, recognize=recognize)


def specs(b, h, hkv, s, d):
    return {"q": mn.f32[b, h, s, d], "k": mn.f32[b, hkv, s, d], "v": mn.f32[b, hkv, s, d]}


def feeds(b, h, hkv, s, d, seed):
    rng = np.random.default_rng(seed)
    return {
        "q": rng.normal(size=(b, h, s, d)).astype(np.float32),
        "k": rng.normal(size=(b, hkv, s, d)).astype(np.float32),
        "v": rng.normal(size=(b, hkv, s, d)).astype(np.float32),
    }


def recognized(traced) -> int:
    report = traced.recognition
    if report is None:
        return 0
    return report.rule("recognize_attention").uses + report.rule("recognize_causal_attention").uses


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 2),
    hkv=st.integers(1, 3),
    group=st.integers(1, 3),
    s=st.integers(1, 9),
    d=st.integers(1, 8),
    causal=st.booleans(),
    scale_form=st.sampled_from(["mul", "mul_left", "div", "none"]),
    seed=st.integers(0, 2**16),
)
def test_hand_written_attention_becomes_the_fused_op_and_computes_the_same(
    b, hkv, group, s, d, causal, scale_form, seed
):
    h = hkv * group
    model = HandAttention(h, hkv, causal=causal, scale_form=scale_form)
    inputs = specs(b, h, hkv, s, d)
    before = trace(model, inputs, recognize=False).graph
    traced = trace(model, inputs)
    after = traced.graph
    rule = "recognize_causal_attention" if causal else "recognize_attention"
    assert traced.recognition.rule(rule).uses == 1 and traced.recognition.rule(rule).matches >= 1
    (attention,) = [n for n in after if n.op == "attention"]
    assert attention.attr("causal") == causal
    assert not [n for n in after if n.op in ("softmax", "matmul")]
    expected_scale = 1.0 if scale_form == "none" else 1.0 / math.sqrt(d)
    assert attention.attr("scale") == pytest.approx(expected_scale, rel=1e-12)
    assert after[attention.inputs[1]].shape == (b, hkv, s, d)  # grouped: k is read unrepeated
    values = feeds(b, h, hkv, s, d, seed)
    want = interpret(before, values, dtype=np.float64).outputs["output"]
    got = interpret(after, values, dtype=np.float64).outputs["output"]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "case",
    [
        dict(causal=False, mask_input=True),  # an additive mask input: its values are unknown
        dict(causal=True, dim=2),  # softmax over the queries, not the keys
        dict(causal=True, scale_form="tensor"),  # a scale that is not a constant
        dict(causal=False, scale_form="tensor"),
    ],
    ids=["mask-input", "softmax-axis", "tensor-scale-causal", "tensor-scale"],
)
def test_look_alikes_are_not_rewritten(case):
    b, h, hkv, s, d = 2, 4, 2, 5, 3
    model = HandAttention(h, hkv, **case)
    inputs = specs(b, h, hkv, s, d)
    if case.get("mask_input"):
        inputs["mask"] = mn.f32[s, s]
    if case.get("scale_form") == "tensor":
        inputs["s"] = mn.f32[1]
    traced = trace(model, inputs)
    assert recognized(traced) == 0
    assert not [n for n in traced.graph if n.op == "attention"]
    assert [n for n in traced.graph if n.op == "softmax"]


def test_causal_mask_matches_numpy_on_the_gpu_and_the_interpreter():
    class Mask(nn.Module):
        def forward(self, x):
            return x + mn.causal_mask(3, 5)

    program = mn.compile(Mask(), inputs={"x": mn.f32[3, 5]})
    expected = np.triu(np.full((3, 5), -1e9, dtype=np.float32), k=1)
    zeros = np.zeros((3, 5), np.float32)
    np.testing.assert_array_equal(program(x=zeros), expected)
    np.testing.assert_array_equal(interpret(program.graph, {"x": zeros}).outputs["output"], expected)


def test_tiny_char_lm_trains_with_the_recognised_attention():
    vocab, train, _ = char_lm.split_data(TEXT, val_fraction=0.25)
    model = tiny_model(len(vocab))
    inputs = char_lm.model_inputs(model, BATCH, SEQ) | {"targets": mn.i32[BATCH * SEQ]}
    # SGD with momentum: Adam's first steps, g/(|g| + eps), turn f32 rounding of near-zero
    # gradients into visible parameter differences (see test_char_lm's tolerance).
    program = mn.compile(model, loss=char_lm.lm_loss, inputs=inputs, optimizer=optim.SGD(lr=0.1, momentum=0.9))
    fused_ops = [n.op for n in program.fused_graph if n.id in program.fused_graph.live_ids()]
    assert fused_ops.count("attention") == 2 and "softmax_grad" not in fused_ops and "softmax" not in fused_ops
    assert {"attention_grad_q", "attention_grad_kv"} <= set(fused_ops)
    assert program.report().rewrite.rule("recognize_causal_attention").uses == 2
    assert "recognition (forward, before autodiff)" in str(program.report().rewrite)
    tables = char_lm.fixed_inputs(model, SEQ)
    tokens, targets = char_lm.get_batch(train, BATCH, SEQ, np.random.default_rng(0))
    losses = assert_steps_follow_interpreter(program, [{"tokens": tokens, "targets": targets, **tables}] * 5)
    assert losses[-1] < losses[0]


def scrambled_repeat(x, n_rep: int):
    """Heads repeated the wrong way for grouped attention: [b, g, s, d] → [b, g, s, n, d] → [b, g·n, s, d]
    (a reshape that interleaves positions, not heads)."""
    batch, kv_heads, seq, head_dim = x.shape
    expanded = x[:, :, :, None].expand(batch, kv_heads, seq, n_rep, head_dim)
    return expanded.reshape(batch, kv_heads * n_rep, seq, head_dim)


def test_a_repetition_that_is_not_repeat_kv_is_not_read_as_grouped_heads():
    b, h, hkv, s, d = 1, 4, 2, 5, 3

    class Scrambled(nn.Module):
        def forward(self, q, k, v):
            k, v = scrambled_repeat(k, h // hkv), scrambled_repeat(v, h // hkv)
            scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(d))
            return F.softmax(scores + mn.causal_mask(s), dim=-1) @ v

    inputs = specs(b, h, hkv, s, d)
    before = trace(Scrambled(), inputs, recognize=False).graph
    traced = trace(Scrambled(), inputs)
    assert traced.recognition.rule("match_repeat_kv").matches == 0
    (attention,) = [n for n in traced.graph if n.op == "attention"]
    assert traced.graph[attention.inputs[1]].shape == (b, h, s, d)  # reads the repeated k: not grouped
    values = feeds(b, h, hkv, s, d, 1)
    want = interpret(before, values, dtype=np.float64).outputs["output"]
    got = interpret(traced.graph, values, dtype=np.float64).outputs["output"]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
