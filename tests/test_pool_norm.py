"""Pooling (max_pool2d, avg_pool2d, adaptive_avg_pool2d) and normalisation (BatchNorm2d with its
running statistics, GroupNorm) of NCHW images: against numpy loops written from PyTorch's
definitions, finite differences mid-chain, the GPU kernels against the interpreter, BatchNorm's
buffers through training, eval mode, state_dict and load_state_dict, and a small net training."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, emit, gradcheck, one_op, typed_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.ir.graph import Graph
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError

GEOMETRIES = [(2, 1, 0), (2, 2, 0), (2, 2, 1), (3, 1, 1), (3, 2, 0), (3, 2, 1)]  # kernel, stride, padding


def attrs_of(k: int, s: int, p: int) -> dict:
    return {"kernel": (k, k), "stride": (s, s), "padding": (p, p)}


# -- numpy references: PyTorch's loops -------------------------------------------------------------


def windows(shape, k, s, p):
    """(ho, wo, [(y, x) image pixels of the window in scan order]) for every output position."""
    h, w = shape
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    for oh in range(ho):
        for ow in range(wo):
            pixels = [
                (oh * s - p + i, ow * s - p + j)
                for i in range(k)
                for j in range(k)
                if 0 <= oh * s - p + i < h and 0 <= ow * s - p + j < w
            ]
            yield oh, ow, pixels


def pool_reference(x, g, k, s, p):
    """(max, avg, max grad, avg grad) by loops: max pads with −inf and routes the gradient to the
    first maximum (strict >, scan order); avg divides by k·k (count_include_pad)."""
    n, c, h, w = x.shape
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    out_max, out_avg = np.zeros((n, c, ho, wo)), np.zeros((n, c, ho, wo))
    grad_max, grad_avg = np.zeros(x.shape), np.zeros(x.shape)
    for b in range(n):
        for ch in range(c):
            for oh, ow, pixels in windows((h, w), k, s, p):
                best, arg = -np.inf, None
                for y, xx in pixels:
                    if x[b, ch, y, xx] > best:
                        best, arg = x[b, ch, y, xx], (y, xx)
                    grad_avg[b, ch, y, xx] += g[b, ch, oh, ow] / (k * k)
                out_max[b, ch, oh, ow] = best
                out_avg[b, ch, oh, ow] = sum(x[b, ch, y, xx] for y, xx in pixels) / (k * k)
                grad_max[b, ch, arg[0], arg[1]] += g[b, ch, oh, ow]
    return out_max, out_avg, grad_max, grad_avg


def pool_graph(x_shape, k, s, p) -> Graph:
    """Outputs max, avg, max_grad, avg_grad of one image input `x` and an upstream gradient `g`."""
    graph = Graph()
    at = attrs_of(k, s, p)
    x = typed_leaf(graph, "input", "x", x_shape)
    graph.outputs["max"] = emit(graph, "max_pool2d", [x], **at)
    graph.outputs["avg"] = emit(graph, "avg_pool2d", [x], **at)
    g = typed_leaf(graph, "input", "g", graph[graph.outputs["max"]].shape)
    graph.outputs["max_grad"] = emit(graph, "max_pool2d_grad", [x, g], **at)
    graph.outputs["avg_grad"] = emit(graph, "avg_pool2d_grad", [g], **at, image=x_shape[2:])
    return graph


@pytest.mark.parametrize("k,s,p", GEOMETRIES)
def test_pool_ops_match_pytorch_loops(k, s, p):
    rng = np.random.default_rng(k * 100 + s * 10 + p)
    x = rng.normal(size=(2, 3, 7, 5))
    graph = pool_graph(x.shape, k, s, p)
    g = rng.normal(size=graph[graph.outputs["max"]].shape)
    got = interpret(graph, {"x": x, "g": g}, dtype=np.float64).outputs
    expected = pool_reference(x, g, k, s, p)
    for name, value in zip(("max", "avg", "max_grad", "avg_grad"), expected, strict=True):
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 1, 1), (3, 2, 1)])
def test_max_pool_ties_route_the_gradient_to_the_first_maximum(k, s, p):
    rng = np.random.default_rng(5)
    x = rng.integers(0, 2, size=(2, 2, 7, 5)).astype(np.float32)  # ties everywhere
    x[0, 0] = 1.0  # a constant plane: every window is all ties
    graph = pool_graph(x.shape, k, s, p)
    g = rng.normal(size=graph[graph.outputs["max"]].shape).astype(np.float32)
    _, _, grad_max, _ = pool_reference(x.astype(np.float64), g.astype(np.float64), k, s, p)
    got = interpret(graph, {"x": x, "g": g}, dtype=np.float64).outputs["max_grad"]
    np.testing.assert_allclose(got, grad_max, rtol=1e-12, atol=1e-12)
    # the first element of the first window of the constant plane takes its whole gradient
    assert got[0, 0, max(0, -p + 0), max(0, -p + 0)] != 0.0
    executable = check(graph, {"x": x, "g": g}, rtol=1e-5, atol=1e-5)
    gpu = executable.run({"x": x, "g": g}, read=("max_grad",))["max_grad"]
    np.testing.assert_allclose(gpu, grad_max, rtol=1e-5, atol=1e-5)


def test_pool_shapes_and_errors_follow_pytorch():
    def trace(fn, shape=(2, 3, 7, 5)):
        graph_holder = {}

        def model(x):
            out = fn(x)
            graph_holder["shape"] = out.shape
            return out

        class Wrap(nn.Module):
            def forward(self, x):
                return model(x)

        with mn.compiler.explain_only():
            mn.compile(Wrap(), inputs={"x": mn.f32[shape]})
        return graph_holder["shape"]

    assert trace(lambda x: F.max_pool2d(x, 2)) == (2, 3, 3, 2)  # stride defaults to the kernel
    assert trace(lambda x: F.avg_pool2d(x, 3, stride=2, padding=1)) == (2, 3, 4, 3)
    assert trace(lambda x: nn.MaxPool2d((3, 2), stride=1)(x)) == (2, 3, 5, 4)
    assert trace(lambda x: nn.AdaptiveAvgPool2d((1, 1))(x)) == (2, 3, 1, 1)
    assert trace(lambda x: F.max_pool2d(x, 2), (3, 7, 5)) == (3, 3, 2)  # unbatched [C, H, W]
    with pytest.raises(ShapeError, match="at most half"):
        trace(lambda x: F.max_pool2d(x, 2, padding=2))
    assert trace(lambda x: F.adaptive_avg_pool2d(x, 2)) == (2, 3, 2, 2)
    assert trace(lambda x: F.adaptive_max_pool2d(x, (None, 3))) == (2, 3, 7, 3)  # None keeps a dim
    assert trace(lambda x: F.avg_pool2d(x, 2, ceil_mode=True)) == (2, 3, 4, 3)
    assert trace(lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True)) == (2, 3, 4, 3)  # no window starts in the padding
    assert trace(lambda x: F.max_pool2d(x, 2, 1, dilation=2)) == (2, 3, 5, 3)
    assert trace(lambda x: F.max_pool1d(x[0], 3, 2, 1, ceil_mode=True), (2, 3, 8)) == (3, 5)  # unbatched [C, L]
    with pytest.raises(NotImplementedError, match="return_indices"):
        trace(lambda x: F.max_pool2d(x, 2, return_indices=True))
    with pytest.raises(NotImplementedError, match="return_indices"):
        trace(lambda x: F.adaptive_max_pool2d(x, 2, return_indices=True))
    with pytest.raises(ValueError, match="divisor_override must be a positive int"):
        trace(lambda x: F.avg_pool2d(x, 2, divisor_override=0))
    with pytest.raises(ShapeError, match="output_size must hold positive ints"):
        trace(lambda x: F.adaptive_avg_pool2d(x, (0, 2)))


# -- finite differences, mid-chain -----------------------------------------------------------------


@pytest.mark.parametrize("k,s,p", [(2, 2, 0), (3, 1, 1), (3, 2, 1)])
def test_pool_gradients_match_finite_differences(k, s, p):
    # normal inputs have no ties (and no near-ties at the scale of the 1e-6 step)
    assert gradcheck(lambda x: F.max_pool2d(x, k, s, p), [(2, 2, 7, 5)], np.random.default_rng(11)) < 1e-6
    assert gradcheck(lambda x: F.avg_pool2d(x, k, s, p), [(2, 2, 7, 5)], np.random.default_rng(12)) < 1e-6


def test_adaptive_avg_pool_gradient_matches_finite_differences():
    assert gradcheck(lambda x: F.adaptive_avg_pool2d(x, 1), [(2, 3, 5, 4)], np.random.default_rng(13)) < 1e-6


def test_batch_norm_training_gradients_match_finite_differences():
    def op(x, weight, bias):
        return F.batch_norm(x, None, None, weight, bias, training=True)

    assert gradcheck(op, [(3, 2, 4, 3), (2,), (2,)], np.random.default_rng(14)) < 1e-6


def test_group_norm_gradients_match_finite_differences():
    def op(x, weight, bias):
        return F.group_norm(x, 2, weight, bias)

    assert gradcheck(op, [(2, 4, 3, 3), (4,), (4,)], np.random.default_rng(15)) < 1e-6


# -- kernels against the interpreter ---------------------------------------------------------------


@pytest.mark.parametrize("shape", [(3, 5, 11, 9), (1, 7, 13, 6)])
@pytest.mark.parametrize("k,s,p", GEOMETRIES)
def test_pool_kernels_match_the_interpreter(shape, k, s, p):
    rng = np.random.default_rng(sum(shape) + k + s + p)
    x = rng.normal(size=shape).astype(np.float32)
    graph = pool_graph(shape, k, s, p)
    g = rng.normal(size=graph[graph.outputs["max"]].shape).astype(np.float32)
    check(graph, {"x": x, "g": g})


def test_pool_kernels_alone():
    x = np.random.default_rng(3).normal(size=(2, 3, 7, 5)).astype(np.float32)
    check(one_op("max_pool2d", [x.shape], **attrs_of(3, 2, 1)), {"x0": x})
    check(one_op("avg_pool2d", [x.shape], **attrs_of(2, 1, 1)), {"x0": x})


# -- BatchNorm2d: PyTorch's formulas in numpy ------------------------------------------------------


def bn_reference(x, weight, bias, eps=1e-5):
    """(y, batch mean, unbiased batch var) of PyTorch's training-mode batch norm."""
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    n = x.size // x.shape[1]
    y = (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps)
    return y * weight[None, :, None, None] + bias[None, :, None, None], mean, var * n / (n - 1)


def bn_eval_reference(x, state, prefix="", eps=1e-5):
    view = lambda v: v[None, :, None, None]  # noqa: E731
    rm, rv = state[prefix + "running_mean"], state[prefix + "running_var"]
    y = (x - view(rm)) / np.sqrt(view(rv) + eps)
    return y * view(state[prefix + "weight"]) + view(state[prefix + "bias"])


SHAPE = (4, 3, 5, 6)


def bn_loss(model, x, r):
    return F.sum(model(x) * r) * 0.1


def test_batch_norm_state_dict_names_order_and_modes():
    model = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU(), nn.Linear(6, 2))
    assert list(model.state_dict()) == [
        "0.weight", "0.bias", "0.running_mean", "0.running_var", "0.num_batches_tracked", "2.weight", "2.bias",
    ]  # fmt: skip
    assert [name for name, _ in model.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert [name for name, _ in model.named_buffers()] == ["0.running_mean", "0.running_var", "0.num_batches_tracked"]
    state = model.state_dict()
    np.testing.assert_array_equal(state["0.running_var"], np.ones(3))
    assert state["0.num_batches_tracked"].shape == () and state["0.num_batches_tracked"] == 0
    assert model.training and model[0].training
    assert model.eval() is model and not model.training and not model[0].training and not model[2].training
    model.train()
    assert model[0].training
    assert "running_mean" not in nn.BatchNorm2d(3, track_running_stats=False).state_dict()
    assert list(nn.BatchNorm2d(3, affine=False).state_dict()) == ["running_mean", "running_var", "num_batches_tracked"]


def test_batch_norm_forward_and_running_statistics_follow_pytorch():
    rng = np.random.default_rng(20)
    bn = nn.BatchNorm2d(3, momentum=0.2)
    bn.weight.copy_(rng.uniform(0.5, 1.5, 3))
    bn.bias.copy_(rng.normal(size=3))
    # forward in training mode (an inference program: running it updates the statistics, as in PyTorch)
    forward = mn.compile(bn, inputs={"x": mn.f32[SHAPE]})
    x0 = (rng.normal(size=SHAPE) * 2 + 1).astype(np.float32)
    y, mean, var = bn_reference(x0.astype(np.float64), bn.weight.numpy(), bn.bias.numpy())
    np.testing.assert_allclose(forward(x=x0), y, rtol=1e-4, atol=1e-4)
    running_mean, running_var = 0.8 * np.zeros(3) + 0.2 * mean, 0.8 * np.ones(3) + 0.2 * var
    np.testing.assert_allclose(bn.running_mean.numpy(), running_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), running_var, rtol=1e-5, atol=1e-6)

    # three training steps: the statistics follow the batches; weight and bias train
    step = mn.compile(bn, bn_loss, {"x": mn.f32[SHAPE], "r": mn.f32[SHAPE]}, optim.SGD(lr=0.1))
    for _ in range(3):
        x = (rng.normal(size=SHAPE) * 3 - 1).astype(np.float32)
        r = rng.normal(size=SHAPE).astype(np.float32)
        weight, bias = bn.weight.numpy().astype(np.float64), bn.bias.numpy().astype(np.float64)
        y, mean, var = bn_reference(x.astype(np.float64), weight, bias)
        loss = step.train_step(x=x, r=r)
        np.testing.assert_allclose(loss, (y * r).sum() * 0.1, rtol=1e-4, atol=1e-4)
        running_mean = 0.8 * running_mean + 0.2 * mean
        running_var = 0.8 * running_var + 0.2 * var
        # SGD on weight and bias: d weight = Σ r·x̂·0.1, d bias = Σ r·0.1
        xhat = (y - bias[None, :, None, None]) / weight[None, :, None, None]
        np.testing.assert_allclose(
            bn.weight.numpy(), weight - 0.1 * 0.1 * (r * xhat).sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(bn.bias.numpy(), bias - 0.1 * 0.1 * r.sum(axis=(0, 2, 3)), rtol=1e-4, atol=1e-5)
    state = step.state_dict()
    np.testing.assert_allclose(state["running_mean"], running_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["running_var"], running_var, rtol=1e-5, atol=1e-6)
    assert float(state["num_batches_tracked"]) == 4.0  # one inference call in training mode, three steps
    assert list(state) == ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]
    np.testing.assert_array_equal(bn.state_dict()["running_var"], state["running_var"])


def test_batch_norm_eval_programs_see_the_trained_running_statistics():
    rng = np.random.default_rng(21)
    model = nn.Sequential(nn.BatchNorm2d(3))
    model.eval()
    early = mn.compile(model, inputs={"x": mn.f32[SHAPE]})  # compiled before any training
    model.train()
    step = mn.compile(model, bn_loss, {"x": mn.f32[SHAPE], "r": mn.f32[SHAPE]}, optim.Adam(lr=0.05))
    for _ in range(3):
        step.train_step(x=rng.normal(size=SHAPE) + 2.0, r=rng.normal(size=SHAPE))
    state = step.state_dict()
    assert not np.allclose(state["0.running_mean"], 0.0) and float(state["0.num_batches_tracked"]) == 3.0
    model.eval()
    late = mn.compile(model, inputs={"x": mn.f32[SHAPE]})  # compiled in eval mode after training
    x = rng.normal(size=SHAPE).astype(np.float32)
    expected = bn_eval_reference(x.astype(np.float64), state, "0.")
    np.testing.assert_allclose(late(x=x), expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(early(x=x), expected, rtol=1e-4, atol=1e-4)
    # eval mode does not update the statistics
    late(x=x + 5.0)
    np.testing.assert_array_equal(step.state_dict()["0.running_mean"], state["0.running_mean"])


def test_batch_norm_momentum_none_is_the_cumulative_average():
    rng = np.random.default_rng(22)
    bn = nn.BatchNorm2d(2, momentum=None)
    forward = mn.compile(bn, inputs={"x": mn.f32[3, 2, 4, 4]})
    batches = [rng.normal(size=(3, 2, 4, 4)).astype(np.float32) + i for i in range(3)]
    for x in batches:
        forward(x=x)
    means = [x.astype(np.float64).mean(axis=(0, 2, 3)) for x in batches]
    np.testing.assert_allclose(bn.running_mean.numpy(), np.mean(means, axis=0), rtol=1e-5, atol=1e-6)
    assert float(bn.num_batches_tracked.numpy()) == 3.0


def test_batch_norm_load_state_dict_round_trip_and_refusal():
    rng = np.random.default_rng(23)
    model = nn.Sequential(nn.BatchNorm2d(3))
    step = mn.compile(model, bn_loss, {"x": mn.f32[SHAPE], "r": mn.f32[SHAPE]}, optim.SGD(lr=0.1))
    step.train_step(x=rng.normal(size=SHAPE), r=rng.normal(size=SHAPE))
    new = {
        "0.weight": rng.uniform(0.5, 1.5, 3).astype(np.float32),
        "0.bias": rng.normal(size=3).astype(np.float32),
        "0.running_mean": rng.normal(size=3).astype(np.float32),
        "0.running_var": rng.uniform(0.5, 2.0, 3).astype(np.float32),
        "0.num_batches_tracked": np.float32(7.0),
    }
    step.load_state_dict(new)
    for source in (step.state_dict(), model.state_dict()):
        for name, value in new.items():
            np.testing.assert_array_equal(source[name], value, err_msg=name)
    model.eval()
    x = rng.normal(size=SHAPE).astype(np.float32)
    np.testing.assert_allclose(
        mn.compile(model, inputs={"x": mn.f32[SHAPE]})(x=x), bn_eval_reference(x, new, "0."), rtol=1e-4, atol=1e-4
    )
    model.train()
    step.train_step(x=x, r=x)
    assert float(step.state_dict()["0.num_batches_tracked"]) == 8.0

    before = model.state_dict()
    missing = {k: v for k, v in new.items() if k != "0.running_var"}
    with pytest.raises(KeyError, match="running_var"):
        step.load_state_dict({**missing, "0.running_mean": np.zeros(3)})
    with pytest.raises(ValueError, match="running_mean"):
        model.load_state_dict({**new, "0.weight": np.zeros(3), "0.running_mean": np.zeros(4)})
    with pytest.raises(ValueError, match="NaN"):
        step.load_state_dict({**new, "0.running_var": np.array([1.0, np.nan, 1.0])})
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)


# -- GroupNorm ---------------------------------------------------------------------------------


def test_group_norm_matches_pytorch_formula():
    rng = np.random.default_rng(30)
    norm = nn.GroupNorm(2, 6)
    assert list(norm.state_dict()) == ["weight", "bias"]
    norm.weight.copy_(rng.uniform(0.5, 1.5, 6))
    norm.bias.copy_(rng.normal(size=6))
    x = rng.normal(size=(3, 6, 4, 5)).astype(np.float32) * 2 + 1
    got = mn.compile(norm, inputs={"x": mn.f32[3, 6, 4, 5]})(x=x)
    grouped = x.astype(np.float64).reshape(3, 2, -1)
    y = (grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-5)
    expected = y.reshape(x.shape) * norm.weight.numpy()[None, :, None, None] + norm.bias.numpy()[None, :, None, None]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="divisible"):
        nn.GroupNorm(4, 6)


# -- a small net trains on the GPU as on the interpreter ---------------------------------------------


class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(3)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.group = nn.GroupNorm(1, 3)
        self.fc = nn.Linear(3, 4)

    def forward(self, x):
        h = self.pool(F.relu(self.norm(x)))
        h = self.group(F.avg_pool2d(h, 3, stride=1, padding=1))
        return self.fc(F.flatten(self.gap(h), 1))


def tiny_loss(model, x, y):
    return F.cross_entropy(model(x), y)


@pytest.mark.parametrize("rewrite", [True, False])
def test_tiny_net_steps_follow_the_interpreter(rewrite):
    nn.manual_seed(3)
    model = TinyNet()
    rng = np.random.default_rng(40)
    inputs = {"x": mn.f32[4, 3, 7, 9], "y": mn.i32[4]}
    program = mn.compile(model, tiny_loss, inputs, optim.Adam(lr=0.02), rewrite=rewrite)
    feeds = [
        {"x": (rng.normal(size=(4, 3, 7, 9)) + 0.5).astype(np.float32), "y": rng.integers(0, 4, 4)} for _ in range(5)
    ]
    losses = assert_steps_follow_interpreter(program, feeds)
    assert all(np.isfinite(losses))
    state = program.state_dict()
    assert float(state["norm.num_batches_tracked"]) == 5.0
    expected_mean = np.zeros(3)
    for feed in feeds:
        expected_mean = 0.9 * expected_mean + 0.1 * feed["x"].astype(np.float64).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(state["norm.running_mean"], expected_mean, rtol=1e-4, atol=1e-5)


def test_side_by_side_with_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(50)
    x = rng.normal(size=(2, 3, 7, 5))
    graph = pool_graph(x.shape, 3, 2, 1)
    g = rng.normal(size=graph[graph.outputs["max"]].shape)
    got = interpret(graph, {"x": x, "g": g}, dtype=np.float64).outputs
    for name, fn in (("max", torch.nn.functional.max_pool2d), ("avg", torch.nn.functional.avg_pool2d)):
        tx = torch.tensor(x, requires_grad=True)
        out = fn(tx, 3, 2, 1)
        out.backward(torch.tensor(g))
        np.testing.assert_allclose(got[name], out.detach().numpy(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(got[f"{name}_grad"], tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    bn, reference = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    forward = mn.compile(bn, inputs={"x": mn.f32[2, 3, 7, 5]})
    for _ in range(2):
        batch = rng.normal(size=(2, 3, 7, 5)).astype(np.float32)
        np.testing.assert_allclose(forward(x=batch), reference(torch.tensor(batch)).detach().numpy(), atol=1e-4)
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(bn.state_dict()[name], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
