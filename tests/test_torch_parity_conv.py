"""The conv-net layers side by side with PyTorch (CPU, float64; skipped where torch is not
installed, e.g. in CI; run on the GPU machine, which has it): F.conv2d, BatchNorm2d (training
and eval, running statistics), the pools, GroupNorm and the small ResNet of
examples/resnet_digits.py. Same weights (our state_dict loaded into the torch.nn model: the names
match), same inputs, same optimizer: same outputs, losses, gradients and updated weights.

Gradients are read from one plain SGD step with lr 1 (p₁ = p₀ − g); the image itself is made a
parameter where its gradient is wanted."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.nn import Parameter

torch = pytest.importorskip("torch")
TF = torch.nn.functional

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "resnet_digits.py")


def as_torch(value) -> torch.Tensor:
    """float64 for floating point data, int64 for labels (as torch's losses want them)."""
    array = np.asarray(value)
    if np.issubdtype(array.dtype, np.integer):
        return torch.tensor(array, dtype=torch.long)
    return torch.tensor(array.astype(np.float64))


def load_into(reference: torch.nn.Module, state: dict[str, np.ndarray]) -> torch.nn.Module:
    """`reference` in float64 with our parameters and buffers (num_batches_tracked stays int64)."""
    reference.double()
    assert set(reference.state_dict()) == set(state), (sorted(reference.state_dict()), sorted(state))
    reference.load_state_dict(
        {name: as_torch(np.asarray(state[name], np.float64)).to(v.dtype) for name, v in reference.state_dict().items()}
    )
    return reference


def assert_state_matches(state: dict[str, np.ndarray], reference: torch.nn.Module, rtol=1e-3, atol=1e-5) -> None:
    for name, value in reference.state_dict().items():
        np.testing.assert_allclose(state[name], value.double().numpy(), rtol=rtol, atol=atol, err_msg=name)


def train_side_by_side(model, reference, loss_fn, torch_loss, inputs, feeds, optimizer, torch_optimizer):
    """Train our compiled `model` and the torch `reference` on the same `feeds`: the losses agree
    (rel 1e-4) at every step, and then the weights and buffers (rel 1e-3). Returns our program."""
    program = mn.compile(model, loss=loss_fn, inputs=inputs, optimizer=optimizer)
    load_into(reference, program.state_dict())
    reference.train()
    opt = torch_optimizer(reference.parameters())
    for step, feed in enumerate(feeds):
        ours = program.train_step(**feed)
        opt.zero_grad()
        loss = torch_loss(reference, **{name: as_torch(value) for name, value in feed.items()})
        loss.backward()
        opt.step()
        assert ours == pytest.approx(loss.item(), rel=1e-4, abs=1e-5), f"step {step}"
    assert_state_matches(program.state_dict(), reference)
    return program


class Function(nn.Module):
    """`fn(x, *weights)` with the weights as parameters w0, w1, …"""

    def __init__(self, fn, *weights: np.ndarray) -> None:
        super().__init__()
        self.fn = fn
        self.names = [f"w{i}" for i in range(len(weights))]
        for name, value in zip(self.names, weights, strict=True):
            setattr(self, name, Parameter(np.asarray(value, np.float32)))

    def forward(self, x):
        return self.fn(x, *(getattr(self, name) for name in self.names))


def forward_of(fn, x: np.ndarray, *weights: np.ndarray) -> np.ndarray:
    """fn(x, *weights) run by an inference program."""
    program = mn.compile(Function(fn, *weights), inputs={"x": mn.f32[x.shape]})
    return program(x=x.astype(np.float32))


class Probe(Function):
    """The image is a parameter too, so that one SGD step with lr 1 shows its gradient."""

    def __init__(self, fn, image: np.ndarray, *weights: np.ndarray) -> None:
        super().__init__(fn, *weights)
        self.image = Parameter(image.astype(np.float32))

    def forward(self):
        return super().forward(self.image)


def probe_loss(model, r):
    return F.sum(model() * r)


def gradients_of(fn, r: np.ndarray, image: np.ndarray, *weights: np.ndarray) -> list[np.ndarray]:
    """d Σ fn(image, *weights)·r / d (image, *weights), on our GPU step, in float64."""
    model = Probe(fn, image, *weights)
    program = mn.compile(model, loss=probe_loss, inputs={"r": mn.f32[r.shape]}, optimizer=optim.SGD(lr=1.0))
    before = program.state_dict()
    program.train_step(r=r.astype(np.float32))
    after = program.state_dict()
    names = ["image", *model.names]
    return [before[n].astype(np.float64) - after[n].astype(np.float64) for n in names]


def torch_gradients_of(fn, r: np.ndarray, *arrays: np.ndarray) -> tuple[torch.Tensor, list[np.ndarray]]:
    """torch's output and gradients of Σ fn(*arrays)·r (float64)."""
    tensors = [as_torch(a.astype(np.float32)).requires_grad_() for a in arrays]
    out = fn(*tensors)
    (out * as_torch(r.astype(np.float32))).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for t in tensors]


# -- (a) conv2d ------------------------------------------------------------------------------------

# (input shape, weight shape, stride, padding): stride 2 with padding 1, non-square kernels
CONVS = [
    ((2, 3, 7, 6), (4, 3, 3, 2), 2, 1),
    ((2, 2, 6, 7), (3, 2, 2, 3), (2, 1), (1, 0)),
    ((1, 3, 5, 5), (2, 3, 1, 3), 2, (0, 1)),
    ((2, 2, 8, 8), (5, 2, 3, 3), 1, 1),
]
CONV_IDS = ["3x2-s2-p1", "2x3-s21-p10", "1x3-s2-p01", "3x3-p1"]


@pytest.mark.parametrize("x_shape,w_shape,stride,padding", CONVS, ids=CONV_IDS)
def test_conv2d_forward_and_input_weight_bias_gradients(x_shape, w_shape, stride, padding):
    rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
    x = rng.normal(size=x_shape)
    w = rng.normal(size=w_shape) * 0.5
    b = rng.normal(size=w_shape[0])

    def ours(image, weight, bias):
        return F.conv2d(image, weight, bias, stride=stride, padding=padding)

    def theirs(image, weight, bias):
        return TF.conv2d(image, weight, bias, stride=stride, padding=padding)

    r = rng.normal(size=theirs(as_torch(x), as_torch(w), as_torch(b)).shape)
    expected_out, expected = torch_gradients_of(theirs, r, x, w, b)
    np.testing.assert_allclose(forward_of(ours, x, w, b), expected_out, rtol=1e-4, atol=1e-5)
    for name, got, want in zip(("input", "weight", "bias"), gradients_of(ours, r, x, w, b), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)


class TwoConvs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, (3, 2), stride=2, padding=1)
        self.conv2 = nn.Conv2d(4, 3, (2, 3), stride=(1, 2), padding=(1, 0))

    def forward(self, x):
        return self.conv2(F.tanh(self.conv1(x)))


class TorchTwoConvs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(2, 4, (3, 2), stride=2, padding=1)
        self.conv2 = torch.nn.Conv2d(4, 3, (2, 3), stride=(1, 2), padding=(1, 0))

    def forward(self, x):
        return self.conv2(torch.tanh(self.conv1(x)))


def test_a_two_conv_model_trains_like_pytorch():
    mn.manual_seed(1)
    rng = np.random.default_rng(1)
    shape, out_shape = (3, 2, 9, 9), (3, 3, 6, 2)  # conv1 → [3, 4, 5, 5], conv2 → [3, 3, 6, 2]
    feeds = [{"x": rng.normal(size=shape), "t": rng.normal(size=out_shape)} for _ in range(3)]
    train_side_by_side(
        TwoConvs(),
        TorchTwoConvs(),
        lambda m, x, t: F.mse_loss(m(x), t),
        lambda m, x, t: TF.mse_loss(m(x), t),
        {"x": mn.f32[shape], "t": mn.f32[out_shape]},
        feeds,
        optim.SGD(lr=0.5),
        lambda p: torch.optim.SGD(p, lr=0.5),
    )


# -- (b) BatchNorm2d -------------------------------------------------------------------------------


def bn_model(momentum):
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3, momentum=momentum))


def torch_bn_model(momentum):
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 3, 3, padding=1, bias=False), torch.nn.BatchNorm2d(3, momentum=momentum)
    )


@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum", "cumulative"])
def test_batch_norm_training_running_statistics_and_eval_follow_pytorch(momentum):
    mn.manual_seed(2)
    model = bn_model(momentum)
    rng = np.random.default_rng(2)
    model[1].weight.copy_(rng.uniform(0.5, 1.5, 3))
    model[1].bias.copy_(rng.normal(size=3))
    shape = (4, 2, 5, 6)

    # a training-mode forward (an inference program: it updates the running statistics, as torch's does)
    reference = load_into(torch_bn_model(momentum), model.state_dict()).train()
    forward = mn.compile(model, inputs={"x": mn.f32[shape]})
    for _ in range(2):
        x = rng.normal(size=shape) * 2 + 1
        with torch.no_grad():
            expected = reference(as_torch(x)).numpy()
        np.testing.assert_allclose(forward(x=x), expected, rtol=1e-4, atol=1e-4)
    assert_state_matches(model.state_dict(), reference, rtol=1e-5, atol=1e-6)

    # three SGD steps: the loss, then the running statistics, weight and bias, and the conv weight
    # before the norm (through the norm's input gradient)
    out_shape = (4, 3, 5, 6)
    feeds = [{"x": rng.normal(size=shape) * 3 - 1, "r": rng.normal(size=out_shape)} for _ in range(3)]
    reference = torch_bn_model(momentum)
    program = train_side_by_side(
        model,
        reference,
        lambda m, x, r: F.sum(m(x) * r) * 0.1,
        lambda m, x, r: (m(x) * r).sum() * 0.1,
        {"x": mn.f32[shape], "r": mn.f32[out_shape]},
        feeds,
        optim.SGD(lr=0.1),
        lambda p: torch.optim.SGD(p, lr=0.1),
    )
    state = program.state_dict()
    assert float(state["1.num_batches_tracked"]) == 5.0 == float(reference[1].num_batches_tracked)

    # eval mode: the running statistics normalise
    model.eval()
    reference.eval()
    x = rng.normal(size=shape)
    with torch.no_grad():
        expected = reference(as_torch(x)).numpy()
    np.testing.assert_allclose(mn.compile(model, inputs={"x": mn.f32[shape]})(x=x), expected, rtol=1e-4, atol=1e-4)


# -- (c) pooling -----------------------------------------------------------------------------------

POOLS = [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)), ((3, 3), (1, 1), (1, 1)), ((3, 2), (2, 1), (1, 0))]
POOL_IDS = ["k2-s2", "k3-s2-p1", "k3-s1-p1", "k32-s21-p10"]


def pool_pairs(kind, kernel=None, stride=None, padding=None):
    """(ours, torch's) as functions of one image."""
    if kind == "max":
        return (
            lambda x: F.max_pool2d(x, kernel, stride, padding),
            lambda x: TF.max_pool2d(x, kernel, stride, padding),
        )
    if kind == "avg":
        return (
            lambda x: F.avg_pool2d(x, kernel, stride, padding),
            lambda x: TF.avg_pool2d(x, kernel, stride, padding),
        )
    return lambda x: F.adaptive_avg_pool2d(x, 1), lambda x: TF.adaptive_avg_pool2d(x, 1)


def check_pool(kind, geometry, x, rng):
    ours, theirs = pool_pairs(kind, *(geometry or ()))
    r = rng.normal(size=theirs(as_torch(x)).shape)
    expected_out, (expected_grad,) = torch_gradients_of(theirs, r, x)
    np.testing.assert_allclose(forward_of(ours, x), expected_out, rtol=1e-5, atol=1e-6)
    (grad,) = gradients_of(ours, r, x)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("geometry", POOLS, ids=POOL_IDS)
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pools_forward_and_gradients(kind, geometry):
    rng = np.random.default_rng(len(kind) + sum(geometry[0]) + sum(geometry[1]) + sum(geometry[2]))
    check_pool(kind, geometry, rng.normal(size=(2, 3, 7, 6)), rng)


@pytest.mark.parametrize("geometry", POOLS, ids=POOL_IDS)
def test_max_pool_ties_route_the_gradient_where_torch_does(geometry):
    rng = np.random.default_rng(7)
    x = rng.integers(0, 2, size=(2, 2, 7, 6)).astype(np.float64)  # ties everywhere
    x[0, 0] = 1.0  # a constant plane: every window is all ties
    x[1, 1] = 0.0
    check_pool("max", geometry, x, rng)


def test_adaptive_avg_pool_forward_and_gradient():
    rng = np.random.default_rng(8)
    check_pool("adaptive", None, rng.normal(size=(2, 3, 5, 4)), rng)


# -- (d) GroupNorm ---------------------------------------------------------------------------------


@pytest.mark.parametrize("groups", [1, 3, 6])
def test_group_norm_forward_and_training_follow_pytorch(groups):
    mn.manual_seed(4)
    model = nn.Sequential(nn.Conv2d(2, 6, 3, padding=1), nn.GroupNorm(groups, 6))
    rng = np.random.default_rng(4)
    model[1].weight.copy_(rng.uniform(0.5, 1.5, 6))
    model[1].bias.copy_(rng.normal(size=6))

    def torch_model():
        return torch.nn.Sequential(torch.nn.Conv2d(2, 6, 3, padding=1), torch.nn.GroupNorm(groups, 6))

    shape = (3, 2, 5, 4)
    x = rng.normal(size=shape) * 2 + 1
    with torch.no_grad():
        expected = load_into(torch_model(), model.state_dict())(as_torch(x)).numpy()
    np.testing.assert_allclose(mn.compile(model, inputs={"x": mn.f32[shape]})(x=x), expected, rtol=1e-4, atol=1e-4)
    feeds = [{"x": rng.normal(size=shape) * 2 + 1, "r": rng.normal(size=(3, 6, 5, 4))} for _ in range(3)]
    train_side_by_side(
        model,
        torch_model(),
        lambda m, x, r: F.sum(m(x) * r) * 0.1,
        lambda m, x, r: (m(x) * r).sum() * 0.1,
        {"x": mn.f32[shape], "r": mn.f32[3, 6, 5, 4]},
        feeds,
        optim.SGD(lr=0.1),
        lambda p: torch.optim.SGD(p, lr=0.1),
    )


# -- (e) the ResNet of examples/resnet_digits.py ---------------------------------------------------


def load_example():
    spec = importlib.util.spec_from_file_location("resnet_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TorchBasicBlock(torch.nn.Module):
    """torchvision's BasicBlock, written out (the example's names)."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)
        self.downsample = None
        if stride != 1 or in_channels != channels:
            self.downsample = torch.nn.Sequential(
                torch.nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), torch.nn.BatchNorm2d(channels)
            )

    def forward(self, x):
        out = TF.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return TF.relu(out + identity)


class TorchResNet(torch.nn.Module):
    def __init__(self, width: int, n_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, width, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.layer1 = TorchBasicBlock(width, width)
        self.layer2 = TorchBasicBlock(width, 2 * width, stride=2)
        self.pool = torch.nn.MaxPool2d(2)
        self.avgpool = torch.nn.AdaptiveAvgPool2d(1)
        self.flatten = torch.nn.Flatten()
        self.fc = torch.nn.Linear(2 * width, n_classes)

    def forward(self, x):
        x = TF.relu(self.bn1(self.conv1(x)))
        x = self.pool(self.layer2(self.layer1(x)))
        return self.fc(self.flatten(self.avgpool(x)))


def test_the_example_resnet_trains_like_pytorch():
    example = load_example()
    width, batch, lr = 4, 8, 0.05
    mn.manual_seed(5)
    model = example.ResNet(width)
    (x_train, y_train), (x_test, _) = example.load_split(seed=0)
    feeds = [{"x": x_train[i * batch : (i + 1) * batch], "y": y_train[i * batch : (i + 1) * batch]} for i in range(5)]
    reference = TorchResNet(width)
    # the example's optimizer: SGD, momentum 0.9, weight decay 5e-4 (torch's SGD the same way)
    program = example.compile_training(model, batch, lr)
    load_into(reference, program.state_dict())
    opt = torch.optim.SGD(reference.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    for step, feed in enumerate(feeds):
        ours = program.train_step(**feed)
        opt.zero_grad()
        loss = TF.cross_entropy(reference(as_torch(feed["x"])), as_torch(feed["y"]))
        loss.backward()
        opt.step()
        assert ours == pytest.approx(loss.item(), rel=1e-4, abs=1e-5), f"step {step}"
    assert_state_matches(program.state_dict(), reference)
    # the eval-mode program (running statistics) gives torch's eval-mode logits
    predict = example.compile_inference(model, 16)
    reference.eval()
    with torch.no_grad():
        expected = reference(as_torch(x_test[:16])).numpy()
    np.testing.assert_allclose(predict(x=x_test[:16]), expected, rtol=1e-3, atol=1e-4)
