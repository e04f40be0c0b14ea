"""Optimizer updates in the IR follow PyTorch's algorithms step for step (numpy interpreter)."""

from __future__ import annotations

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.ir.interpret import interpret


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


def mse(model, x, t):
    return F.mse_loss(model(x), t)


def run_steps(optimizer, steps, x, t, model):
    """Run the traced step `steps` times in the interpreter; return the parameter history."""
    traced = trace_step(model, mse, {"x": mn.f32[4, 3], "t": mn.f32[4, 2]}, optimizer)
    params = {k: p.numpy() for k, p in traced.parameters.items()}
    states = dict(traced.initial_states)
    history = []
    for step in range(1, steps + 1):
        states |= optimizer.hyper_values(step)  # what Program.write_hypers writes before the step
        result = interpret(traced.graph, {"x": x, "t": t}, params, states)
        for name, value in result.updates.items():
            (params if name in params else states)[name] = value
        history.append({k: v.copy() for k, v in params.items()})
    return history


def reference_grads(w, b, x, t):
    """d/dw, d/db of mean((x·wᵀ + b − t)²), written out by hand."""
    residual = 2 * (x @ w.T + b - t) / t.size
    return residual.T @ x, residual.sum(0)


def torch_style_reference(kind, steps, w, b, x, t, lr, momentum=0.0, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8):
    """PyTorch's update loops (torch/optim/sgd.py, adam.py, single-tensor form) in float64."""
    params = [w.astype(np.float64), b.astype(np.float64)]
    state = [dict(step=0, buf=None, m=np.zeros_like(p), v=np.zeros_like(p)) for p in params]
    history = []
    for _ in range(steps):
        grads = reference_grads(params[0], params[1], x, t)
        for p, g, s in zip(params, grads, state, strict=True):
            if kind == "sgd":
                d = g + weight_decay * p
                if momentum:
                    s["buf"] = d.copy() if s["buf"] is None else momentum * s["buf"] + d
                    d = s["buf"]
                p -= lr * d
            else:
                if kind == "adamw":
                    p *= 1 - lr * weight_decay
                else:
                    g = g + weight_decay * p
                s["step"] += 1
                s["m"] = betas[0] * s["m"] + (1 - betas[0]) * g
                s["v"] = betas[1] * s["v"] + (1 - betas[1]) * g * g
                bc1, bc2 = 1 - betas[0] ** s["step"], 1 - betas[1] ** s["step"]
                denom = np.sqrt(s["v"]) / np.sqrt(bc2) + eps
                p -= (lr / bc1) * s["m"] / denom
        history.append([p.copy() for p in params])
    return history


CASES = [
    ("sgd", optim.SGD(lr=0.1), {}),
    ("sgd", optim.SGD(lr=0.1, momentum=0.9), {"momentum": 0.9}),
    ("sgd", optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01), {"momentum": 0.9, "weight_decay": 0.01}),
    ("adam", optim.Adam(lr=0.01), {}),
    ("adam", optim.Adam(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
     {"betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1}),
    ("adamw", optim.AdamW(lr=0.01), {"weight_decay": 0.01}),
]  # fmt: skip


@pytest.mark.parametrize("kind,optimizer,options", CASES, ids=lambda c: str(c) if isinstance(c, str) else "")
def test_update_rule_matches_pytorch_algorithm(kind, optimizer, options):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 3)).astype(np.float32)
    t = rng.normal(size=(4, 2)).astype(np.float32)
    model = Affine()
    w0, b0 = model.fc.weight.numpy(), model.fc.bias.numpy()
    ours = run_steps(optimizer, 4, x, t, model)
    expected = torch_style_reference(kind, 4, w0, b0, x, t, optimizer.lr, **options)
    for step, (got, (w, b)) in enumerate(zip(ours, expected, strict=True)):
        np.testing.assert_allclose(got["fc.weight"], w, rtol=1e-4, atol=1e-6, err_msg=f"step {step + 1}")
        np.testing.assert_allclose(got["fc.bias"], b, rtol=1e-4, atol=1e-6, err_msg=f"step {step + 1}")
    # The parameters moved: the check above is not comparing two unchanged copies.
    assert np.abs(ours[-1]["fc.weight"] - w0).max() > 1e-3


def test_optimizer_hyperparameters_are_validated():
    with pytest.raises(ValueError, match="lr"):
        optim.SGD(lr=-1)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        optim.Adam(betas=(0.9, 1.0))
    assert optim.AdamW().weight_decay == 0.01 and optim.Adam().weight_decay == 0.0
