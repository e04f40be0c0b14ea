"""GELU (exact, through erf, and tanh), LayerNorm, and the Tensor methods a transformer uses, with
PyTorch's names and semantics: each checked against a closed-form numpy formula, its gradient by
finite differences mid-chain (float64 interpreter), and its kernels against the interpreter on the GPU."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, gradcheck, one_op, run_traced, trace_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.ir.functions import NUMPY_FUNCTIONS
from meganeura.ir.graph import TensorType
from meganeura.ir.op import ShapeError
from meganeura.ir.trace import Tracer, tracing

erf64 = np.vectorize(math.erf)


def gelu_reference(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    """torch.nn.functional.gelu, in float64."""
    x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + erf64(x / math.sqrt(2.0)))


def layer_norm_reference(x: np.ndarray, dims: int, weight=None, bias=None, eps: float = 1e-5) -> np.ndarray:
    """torch.nn.functional.layer_norm, in float64: the biased variance over the trailing dims."""
    x = x.astype(np.float64)
    axes = tuple(range(x.ndim - dims, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


# -- erf ------------------------------------------------------------------------------------------


def test_erf_interpreter_is_exact():
    x = np.linspace(-5, 5, 101)
    np.testing.assert_array_equal(NUMPY_FUNCTIONS["erf"](x), [math.erf(v) for v in x])
    assert NUMPY_FUNCTIONS["erf"](np.float32(0.5)).dtype == np.float32


def test_erf_kernel_is_accurate_to_a_few_ulps():
    x = np.concatenate([np.linspace(-6, 6, 24001), [0.0, -0.0, 1e-30, -1e-8, 0.927734375, 100.0, -100.0, 1e10]])
    x = x.astype(np.float32)
    graph = one_op("erf", [x.shape])
    executable = check(graph, {"x0": x}, rtol=0, atol=2e-7)
    got = executable.run({"x0": x}, read=("out",))["out"]
    exact = erf64(x.astype(np.float64))
    small = np.abs(x) < 1.0  # relative accuracy near 0, where erf(x) ≈ 1.128·x is small
    assert np.all(np.abs(got - exact)[small] <= 4e-7 * np.abs(exact[small]))
    assert np.all(np.abs(got) <= 1.0)


def test_erf_gradient():
    rng = np.random.default_rng(20)
    assert gradcheck(F.erf, [(3, 4)], rng) < 1e-6
    assert gradcheck(lambda x: x.erf(), [(5,)], rng) < 1e-6


# -- GELU -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_follows_pytorchs_formula(approximate):
    x = np.concatenate([np.linspace(-8, 8, 160), [-30.0, 30.0]]).reshape(3, -1)
    out = run_traced(lambda x: {"y": F.gelu(x, approximate=approximate)}, {"x": x})["y"]
    np.testing.assert_allclose(out, gelu_reference(x, approximate), rtol=1e-12, atol=1e-15)


def test_gelu_tanh_is_close_to_the_exact_form():
    x = np.linspace(-6, 6, 241)
    assert np.abs(gelu_reference(x, "tanh") - gelu_reference(x)).max() < 1e-3


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradient(approximate):
    rng = np.random.default_rng(21)
    assert gradcheck(lambda x: F.gelu(x, approximate), [(3, 4)], rng) < 1e-6
    assert gradcheck(lambda x: nn.GELU(approximate)(x * 3.0), [(2, 3, 2)], rng) < 1e-6


def test_gelu_checks_its_argument():
    with pytest.raises(ValueError, match="approximate"):
        nn.GELU("erf")
    with pytest.raises(ValueError, match="approximate"):
        run_traced(lambda x: {"y": F.gelu(x, "fast")}, {"x": np.zeros(3)})
    assert repr(nn.GELU("tanh")) == "GELU(approximate='tanh')"


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_fuses_into_one_kernel_on_the_gpu(approximate):
    program = mn.compile(nn.GELU(approximate), inputs={"x": mn.f32[7, 33]})
    assert len(program.executable.kernels) == 1
    x = np.random.default_rng(3).normal(scale=3.0, size=(7, 33)).astype(np.float32)
    x[0, :4] = [-100.0, 100.0, -9.0, 9.0]
    np.testing.assert_allclose(program(x=x), gelu_reference(x, approximate), rtol=2e-6, atol=2e-6)


# -- LayerNorm -------------------------------------------------------------------------------------


@pytest.mark.parametrize("x_shape, dims", [((3, 4), 1), ((2, 3, 4), 2), ((2, 3, 5), 1)], ids=str)
def test_layer_norm_gradient(x_shape, dims):
    rng = np.random.default_rng(22)
    shape = x_shape[-dims:]
    op = lambda x, w, b: F.layer_norm(x, shape, w, b, eps=1e-5)  # noqa: E731
    assert gradcheck(op, [x_shape, shape, shape], rng) < 1e-6
    assert gradcheck(lambda x: F.layer_norm(x, shape), [x_shape], rng) < 1e-6


def test_layer_norm_follows_pytorchs_formula():
    rng = np.random.default_rng(23)
    x = rng.normal(loc=3.0, scale=2.0, size=(2, 3, 8))
    w, b = rng.normal(size=(3, 8)), rng.normal(size=(3, 8))
    out = run_traced(
        lambda x, w, b: {"plain": F.layer_norm(x, 8), "affine": F.layer_norm(x, (3, 8), w, b, eps=1e-3)},
        {"x": x, "w": w, "b": b},
    )
    np.testing.assert_allclose(out["plain"], layer_norm_reference(x, 1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["affine"], layer_norm_reference(x, 2, w, b, 1e-3), rtol=1e-12, atol=1e-12)


def test_layer_norm_checks_its_shapes():
    x = np.zeros((2, 4))
    with pytest.raises(ShapeError, match="normalized_shape"):
        run_traced(lambda x: {"y": F.layer_norm(x, (3,))}, {"x": x})
    with pytest.raises(ShapeError, match="bias"):
        run_traced(lambda x, b: {"y": F.layer_norm(x, 4, None, b)}, {"x": x, "b": np.zeros((2, 4))})


@pytest.mark.parametrize(
    "dims, eps, affine, bias", [(1, 1e-5, True, True), (2, 1e-6, True, False), (1, 1e-5, False, True)]
)
def test_layer_norm_module_on_the_gpu(dims, eps, affine, bias):
    shape = (2, 3, 16)
    normalized = shape[-dims:]
    norm = nn.LayerNorm(normalized if dims > 1 else shape[-1], eps=eps, elementwise_affine=affine, bias=bias)
    names = [name for name, _ in norm.named_parameters()]
    assert names == ["weight", "bias"][: int(affine) * (1 + int(bias))]
    if affine:
        np.testing.assert_array_equal(norm.weight.numpy(), np.ones(normalized, np.float32))
        norm.weight.copy_(np.random.default_rng(1).normal(size=normalized))
    if affine and bias:
        np.testing.assert_array_equal(norm.bias.numpy(), np.zeros(normalized, np.float32))
        norm.bias.copy_(np.random.default_rng(2).normal(size=normalized))
    program = mn.compile(norm, inputs={"x": mn.f32[shape]})
    x = np.random.default_rng(0).normal(loc=1.0, size=shape).astype(np.float32)
    weight = norm.weight.numpy() if affine else None
    bias_value = norm.bias.numpy() if affine and bias else None
    expected = layer_norm_reference(x, dims, weight, bias_value, eps)
    np.testing.assert_allclose(program(x=x), expected, rtol=1e-5, atol=1e-5)


class Block(nn.Module):
    """LayerNorm → Linear → GELU → Linear, with a residual: a transformer MLP block."""

    def __init__(self, width: int = 12, approximate: str = "none") -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.act = nn.GELU(approximate)
        self.down = nn.Linear(2 * width, 5)

    def forward(self, x):
        return self.down(self.act(self.up(self.norm(x))))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_three_training_steps_of_a_layer_norm_gelu_block_follow_the_interpreter(approximate):
    mn.manual_seed(0)
    program = mn.compile(
        Block(approximate=approximate),
        loss=lambda model, x, y: F.cross_entropy(model(x), y),
        inputs={"x": mn.f32[8, 12], "y": mn.i32[8]},
        optimizer=optim.Adam(lr=1e-2),
    )
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 12)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int32)
    assert_steps_follow_interpreter(program, [{"x": x, "y": y}] * 3)


# -- Tensor methods --------------------------------------------------------------------------------


def test_tensor_shape_size_float_and_contiguous():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((2, 3, 4)))
        labels = trace_leaf(tracer, "input", "y", TensorType((2,), "i32"))
        assert x.shape == (2, 3, 4) and isinstance(x.shape, tuple)
        batch, seq, width = x.shape
        assert (batch, seq, width) == (2, 3, 4) and all(type(d) is int for d in x.shape)
        assert x.size() == (2, 3, 4) and x.size(-1) == 4 and x.size(0) == 2
        assert x.float() is x and x.contiguous() is x
        cast = labels.float()  # i32 labels cast to f32 (torch's .float())
        assert cast.dtype == "f32" and cast.shape == (2,) and tracer.graph[cast.node].op == "cast"


def test_unsqueeze_and_squeeze_are_reshapes():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((2, 1, 3)))
        assert x.unsqueeze(0).shape == (1, 2, 1, 3) and x.unsqueeze(-1).shape == (2, 1, 3, 1)
        assert x.unsqueeze(2).shape == (2, 1, 1, 3) and x.unsqueeze(-4).shape == (1, 2, 1, 3)
        assert x.squeeze(1).shape == (2, 3) and x.squeeze().shape == (2, 3) and x.squeeze(-2).shape == (2, 3)
        assert x.squeeze(0) is x  # a dim of size 2 is kept, like torch
        assert x.unsqueeze(0).squeeze((0, 2)).shape == (2, 3)
        assert tracer.graph[x.unsqueeze(1).node].op == "reshape"
        with pytest.raises(ShapeError, match="unsqueeze"):
            x.unsqueeze(4)
        with pytest.raises(ShapeError, match="squeeze"):
            x.squeeze(3)
    rng = np.random.default_rng(24)
    assert gradcheck(lambda x: x.unsqueeze(1) * x.unsqueeze(0), [(3,)], rng) < 1e-6
    assert gradcheck(lambda x: x.squeeze(1).exp(), [(3, 1, 2)], rng) < 1e-6


def test_pow_and_power_operator():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((3,)))
        square = x**2
        node = tracer.graph[square.node]
        assert node.op == "mul" and node.inputs == (x.node, x.node)  # x·x, no pow op
        assert x.pow(1) is x and tracer.graph[x.pow(0.5).node].op == "sqrt"
        # −0.5 is not rsqrt: torch.pow's gradient there differs from torch.rsqrt's at −0 and −inf
        assert tracer.graph[x.pow(-0.5).node].op == "pow_scalar"
        assert tracer.graph[(x**2.5).node].op == "pow_scalar" and tracer.graph[x.pow(x).node].op == "pow"
    value = np.array([0.5, 2.0, 3.0])
    out = run_traced(lambda x: {f"p{i}": x.pow(e) for i, e in enumerate((2, 3, 0.5, -0.5, -1))}, {"x": value})
    for i, e in enumerate((2, 3, 0.5, -0.5, -1)):
        np.testing.assert_allclose(out[f"p{i}"], value**e, rtol=1e-14)
    rng = np.random.default_rng(25)
    assert gradcheck(lambda x: x**2, [(3, 4)], rng) < 1e-6
    assert gradcheck(lambda x: x.pow(3) + x.pow(2.0), [(3, 4)], rng) < 1e-6
    assert gradcheck(lambda x: x.pow(-1) + x**0.5 + x**-0.5, [(3, 4)], rng, positive=True) < 1e-6


def test_transformer_tensor_methods_chain_gradient():
    """reshape/view, transpose, permute, @, unary minus, sum/mean with dim/keepdim, exp, rsqrt,
    unsqueeze, ** 2 and size(), as attention-like code writes them."""

    def attention_like(q, k):
        batch, seq, width = q.shape
        heads = 2
        qh = q.view(batch, seq, heads, width // heads).transpose(1, 2)  # [b, h, s, d]
        kh = k.reshape(batch, seq, heads, -1).permute(0, 2, 3, 1)  # [b, h, d, s]
        scores = (qh @ kh) * (1.0 / math.sqrt(q.size(-1) // heads))
        weights = (-(scores**2)).exp() / (scores**2 + 1.0).sum(dim=-1, keepdim=True)
        scale = (q.float().pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt()  # [b, s, 1]
        return weights.sum(1) * scale.unsqueeze(1).squeeze(1) + weights.mean(dim=(1, 3)).unsqueeze(-1)

    assert gradcheck(attention_like, [(2, 3, 4), (2, 3, 4)], np.random.default_rng(26)) < 1e-6
