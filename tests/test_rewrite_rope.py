"""The recognition rule `recognize_rope`: RoPE written by hand as HF transformers writes it,
q·cos + rotate_half(q)·sin with rotate_half built from slices, unary minus and `mn.cat`, becomes
the `rope` op on the forward graph (so autodiff uses rope's own gradient), and computes the same;
look-alikes are left alone."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meganeura as mn
from meganeura import nn
from meganeura.compiler import trace_step
from meganeura.ir.interpret import interpret


def rotate_half(x, flip=False, axis=-1):
    half = x.shape[axis] // 2
    x1, x2 = (x[..., :half], x[..., half:]) if axis == -1 else (x[:, :half], x[:, half:])
    parts = (x2, -x1) if flip else (-x2, x1)
    return mn.cat(parts, dim=axis)


class HandRope(nn.Module):
    """q·cos + rotate_half(q)·sin in the operand order `order` (a permutation of the add and muls)."""

    def __init__(self, order=(False, False, False), flip=False):
        super().__init__()
        self.order, self.flip = order, flip

    def forward(self, q, cos, sin):
        swap_add, swap_cos, swap_sin = self.order
        plain = cos * q if swap_cos else q * cos
        turned = sin * rotate_half(q, self.flip) if swap_sin else rotate_half(q, self.flip) * sin
        return turned + plain if swap_add else plain + turned


def trace(model, inputs, recognize=True):
    return trace_step(model, None, inputs, None, recognize=recognize)


def feeds(shapes, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=shape) for name, shape in shapes.items()}


@settings(max_examples=12, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    seq=st.integers(1, 6),
    half=st.integers(1, 5),
    order=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    seed=st.integers(0, 2**16),
)
def test_hand_written_rope_becomes_the_rope_op_and_computes_the_same(lead, seq, half, order, seed):
    d = 2 * half
    shapes = {"q": (*lead, seq, d), "cos": (seq, d), "sin": (seq, d)}
    inputs = {name: mn.f32[shape] for name, shape in shapes.items()}
    before = trace(HandRope(order), inputs, recognize=False).graph
    traced = trace(HandRope(order), inputs)
    assert traced.recognition.rule("recognize_rope").uses == 1
    ops = [n.op for n in traced.graph if n.op not in ("input", "param")]
    assert ops == ["rope"]
    values = feeds(shapes, seed)
    want = interpret(before, values, dtype=np.float64).outputs["output"]
    got = interpret(traced.graph, values, dtype=np.float64).outputs["output"]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "case",
    ["flipped", "odd-split", "other-axis", "bigger-tables"],
)
def test_look_alikes_are_not_rewritten(case):
    """cat(x2, −x1) (the transposed rotation), halves of another axis, and tables that would make the
    result larger than q are not RoPE."""
    if case == "flipped":
        model, shapes = HandRope(flip=True), {"q": (2, 4, 6), "cos": (4, 6), "sin": (4, 6)}
    elif case == "odd-split":

        class OddSplit(nn.Module):
            def forward(self, q, cos, sin):
                turned = mn.cat((-q[..., 2:], q[..., :2]), dim=-1)
                return q * cos + turned * sin

        model, shapes = OddSplit(), {"q": (2, 4, 6), "cos": (4, 6), "sin": (4, 6)}
    elif case == "other-axis":

        class OtherAxis(nn.Module):
            def forward(self, q, cos, sin):
                return q * cos + rotate_half(q, axis=1) * sin

        model, shapes = OtherAxis(), {"q": (2, 4, 6), "cos": (4, 6), "sin": (4, 6)}
    else:
        model, shapes = HandRope(), {"q": (4, 6), "cos": (3, 4, 6), "sin": (3, 4, 6)}
    inputs = {name: mn.f32[shape] for name, shape in shapes.items()}
    traced = trace(model, inputs)
    assert not [n for n in traced.graph if n.op == "rope"]
    assert traced.recognition is None or traced.recognition.rule("recognize_rope").uses == 0


def test_the_char_lm_rope_is_recognised():
    """The example's attention writes RoPE by hand: every q and k rotation becomes a rope op, no
    concat is left in the training graph."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import char_lm

    model = char_lm.CharLlama(11, dim=16, layers=2, heads=4, kv_heads=2)
    with mn.compiler.explain_only():  # traced and optimised, no device
        program = char_lm.compile_training(model, batch=2, seq=5, lr=0.1)
    graph = program.traced.graph
    assert sum(n.op == "rope" for n in graph) == 4  # q and k in each of 2 layers
    assert sum(n.op == "rope_grad" for n in graph) == 4
    assert not [n for n in graph if n.op == "concat"]
    assert program.traced.recognition.rule("recognize_rope").uses == 4
