"""compile(clip_grad_norm=…): every gradient scaled by min(1, max_norm / (‖g‖₂ + 1e-6)) before
the update, ‖g‖₂ over all parameters — torch.nn.utils.clip_grad_norm_'s formula — and the norm
readable as program.last_grad_norm."""

from __future__ import annotations

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(5)
BATCH = {"x": RNG.normal(size=(8, 5)).astype(np.float32) * 3, "y": RNG.integers(0, 3, 8).astype(np.int32)}
SPEC = {"x": mn.f32[8, 5], "y": mn.i32[8]}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x):
        return self.fc2(F.tanh(self.fc1(x)))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def one_sgd_step(clip: float | None):
    """(parameters before, after, the program) of one plain SGD step at lr 1 from seed 0."""
    mn.manual_seed(0)
    program = mn.compile(Net(), ce, SPEC, optim.SGD(lr=1.0), clip_grad_norm=clip)
    before = program.state_dict()
    program.train_step(**BATCH)
    return before, program.state_dict(), program


def test_clipping_scales_every_gradient_by_the_global_norm():
    before, raw_after, unclipped = one_sgd_step(None)
    grads = {name: before[name] - raw_after[name] for name in before}  # lr 1: the step is the gradient
    norm = float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())))
    assert unclipped.last_grad_norm is None
    for max_norm in (0.05 * norm, 0.5 * norm, 2.0 * norm):
        _, after, program = one_sgd_step(max_norm)
        assert program.last_grad_norm == pytest.approx(norm, rel=1e-5)
        scale = min(1.0, max_norm / (norm + 1e-6))
        for name in before:
            step = before[name] - after[name]
            np.testing.assert_allclose(step, grads[name] * scale, rtol=2e-5, atol=1e-7, err_msg=name)


def test_clipping_needs_a_positive_norm_and_a_training_step():
    for bad in (0.0, -1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="clip_grad_norm must be a positive number"):
            mn.compile(Net(), ce, SPEC, optim.SGD(lr=1.0), clip_grad_norm=bad)
    with pytest.raises(ValueError, match="pass loss= and optimizer="):
        mn.compile(Net(), inputs={"x": mn.f32[8, 5]}, clip_grad_norm=1.0)
