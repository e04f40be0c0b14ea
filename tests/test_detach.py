"""`detach` (torch.Tensor.detach): the value itself, with no gradient through it — in a chain,
on the interpreter and on the device — and the operator methods (add, sub, div…, view_as)."""

from __future__ import annotations

import numpy as np
from conftest import assert_steps_follow_interpreter

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.trace import Tracer, tracing
from meganeura.tensor import Tensor

RNG = np.random.default_rng(5)


def test_detach_passes_the_value_and_stops_the_gradient_mid_chain():
    tracer = Tracer()
    with tracing(tracer):
        x = Tensor(tracer, tracer.leaf("input", "x", TensorType((3, 4))))
        y = x * 2.0
        loss = ((y.detach() * y) + y.exp().detach()).sum()  # d/dx = 2·y (the detached factor is a constant)
    graph = tracer.graph
    graph.outputs["loss"] = loss.node
    graph.outputs["grad"] = gradients(graph, loss.node, [x.node])[x.node]
    value = RNG.normal(size=(3, 4))
    out = interpret(graph, {"x": value}, {}, {}, dtype=np.float64).outputs
    np.testing.assert_allclose(out["loss"], np.sum(4 * value * value + np.exp(2 * value)))
    np.testing.assert_allclose(out["grad"], 2.0 * (2.0 * value))  # not 8x + 2e^(2x)


class Target(nn.Module):
    """A regression towards a detached copy of its own output (a target network's pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x):
        y = self.fc(x)
        return F.mse_loss(y, (y * 0.5 + 1.0).detach())


def test_a_detached_target_trains_on_the_device_as_the_interpreter():
    mn.manual_seed(3)
    program = mn.compile(Target(), lambda model, x: model(x), {"x": mn.f32[4, 5]}, optim.SGD(lr=0.1))
    feeds = [{"x": RNG.normal(size=(4, 5)).astype(np.float32)} for _ in range(3)]
    assert_steps_follow_interpreter(program, feeds)
    weight = program.state_dict()["fc.weight"]
    assert np.all(np.isfinite(weight))


def test_parameter_detach_outside_and_inside_a_trace():
    layer = nn.Linear(2, 2)
    assert layer.weight.detach() is layer.weight  # outside a trace: the parameter itself
    program = mn.compile(layer, lambda model, x: (model(x) * model.weight.detach().sum()).sum(),
                         {"x": mn.f32[3, 2]}, optim.SGD(lr=0.1), keep_gradients=True)  # fmt: skip
    x = RNG.normal(size=(3, 2)).astype(np.float32)
    w = layer.weight.numpy()
    program.train_step(x=x)
    grad = program.gradients()["weight"]
    np.testing.assert_allclose(grad, w.sum() * np.tile(x.sum(0), (2, 1)), rtol=1e-5)  # no term from the detached sum


def test_operator_methods_follow_the_operators():
    tracer = Tracer()
    with tracing(tracer):
        a = Tensor(tracer, tracer.leaf("input", "a", TensorType((2, 3))))
        b = Tensor(tracer, tracer.leaf("input", "b", TensorType((3,))))
        outs = {
            "add": a.add(b, alpha=2.0),
            "sub": a.sub(b),
            "mul": a.mul(b),
            "div": a.div(b),
            "trunc": a.div(b, rounding_mode="trunc"),
            "floor": a.div(b, rounding_mode="floor"),
            "neg": a.neg(),
            "view_as": a.view_as(a.reshape(3, 2)),
            "expand_as": b.expand_as(a),
        }
    graph = tracer.graph
    for name, t in outs.items():
        graph.outputs[name] = t.node
    va, vb = RNG.normal(size=(2, 3)), RNG.normal(size=(3,)) + 3.0
    got = interpret(graph, {"a": va, "b": vb}, {}, {}, dtype=np.float64).outputs
    want = {
        "add": va + 2 * vb, "sub": va - vb, "mul": va * vb, "div": va / vb, "trunc": np.trunc(va / vb),
        "floor": np.floor(va / vb), "neg": -va, "view_as": va.reshape(3, 2), "expand_as": np.broadcast_to(vb, (2, 3)),
    }  # fmt: skip
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, err_msg=name)


def gradient_of(build, value: np.ndarray):
    """(loss, d loss / d x) of `build(x)` summed, on the float64 interpreter."""
    tracer = Tracer()
    with tracing(tracer):
        x = Tensor(tracer, tracer.leaf("input", "x", TensorType(value.shape)))
        loss = build(x).sum()
    graph = tracer.graph
    graph.outputs["loss"] = loss.node
    graph.outputs["grad"] = gradients(graph, loss.node, [x.node])[x.node]
    out = interpret(graph, {"x": value}, {}, {}, dtype=np.float64).outputs
    return float(out["loss"]), out["grad"]


def test_gaussian_nll_clamps_var_outside_autograd_as_pytorch():
    """torch clamps var under no_grad: the value is eps, the gradient the unclamped formula's."""
    eps, diff = 1e-2, 0.3
    var = np.array([1e-4, 0.5, 2e-3])
    _, grad = gradient_of(lambda v: F.gaussian_nll_loss(v * 0.0 + diff, v * 0.0, v, eps=eps, reduction="sum"), var)
    clamped = np.maximum(var, eps)
    np.testing.assert_allclose(grad, 0.5 * (1 / clamped - diff**2 / clamped**2))  # d/dv at the clamped value


def test_cosine_similarity_divides_a_tiny_norm_by_eps_with_its_gradient():
    x1 = np.array([[1e-9, 2e-9], [3.0, 4.0]])
    loss, grad = gradient_of(lambda x: F.cosine_similarity(x, x * 0.0 + 1.0, dim=1, eps=1e-8), x1)
    norms = np.maximum(np.linalg.norm(x1, axis=1, keepdims=True), 1e-8)
    np.testing.assert_allclose(loss, np.sum((x1 / norms) * (1 / np.sqrt(2))))
    # torch 2.13, float64: x.grad of this sum (a traced clamp would give the first row ~0 instead)
    torch_grad = [[61223845.138149604, 51737012.157644466], [0.02262741699796955, -0.016970562748477136]]
    np.testing.assert_allclose(grad, torch_grad, rtol=1e-12)
