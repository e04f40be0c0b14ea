"""nn.init (meganeura/nn/init.py) against PyTorch: the gains, fans and the bounds and scales every
init function draws with, exactly (tests/reference/nn/modules.json, written by
scripts/make_module_references.py); the distributions' moments with fixed seeds; in-place
filling of parameters, also of one a compiled program owns."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import meganeura as mn
from meganeura import nn
from meganeura.nn import init

REFERENCES = json.load(open(os.path.join(os.path.dirname(__file__), "reference", "nn", "modules.json")))


def test_init_is_reachable_as_pytorch_spells_it():
    import meganeura.nn.init as imported
    from meganeura.nn import init as from_import

    assert imported is from_import is nn.init
    assert {"kaiming_uniform_", "trunc_normal_", "orthogonal_", "_calculate_fan_in_and_fan_out"} <= set(dir(init))


@pytest.mark.parametrize("nonlinearity, param, gain", REFERENCES["gains"])
def test_gains_are_pytorchs(nonlinearity, param, gain):
    assert init.calculate_gain(nonlinearity, param) == gain


def test_bad_gain_arguments_are_refused_as_pytorch_does():
    with pytest.raises(ValueError, match="Unsupported nonlinearity gelu"):
        init.calculate_gain("gelu")
    with pytest.raises(ValueError, match="negative_slope True not a valid number"):
        init.calculate_gain("leaky_relu", True)


@pytest.mark.parametrize("shape, fan_in, fan_out", REFERENCES["fans"])
def test_fans_are_pytorchs(shape, fan_in, fan_out):
    assert init._calculate_fan_in_and_fan_out(nn.Parameter(np.zeros(shape))) == (fan_in, fan_out)
    assert init._calculate_fan_in_and_fan_out(np.zeros(shape)) == (fan_in, fan_out)


def test_fewer_than_two_dims_have_no_fans():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.kaiming_uniform_(nn.Parameter(np.zeros(5)))
    with pytest.raises(ValueError, match="Mode fan_avg not supported"):
        init.kaiming_normal_(nn.Parameter(np.zeros((2, 3))), mode="fan_avg")


class Recorder:
    """A stand-in for the generator: records (distribution, a, b, shape) and draws from a real one."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.calls: list[tuple] = []

    def uniform(self, low=0.0, high=1.0, size=None):
        self.calls.append(("uniform", low, high, tuple(np.shape(np.empty(size)))))
        return self.rng.uniform(low, high, size)

    def normal(self, loc=0.0, scale=1.0, size=None):
        self.calls.append(("normal", loc, scale, tuple(np.shape(np.empty(size)))))
        return self.rng.normal(loc, scale, size)

    def standard_normal(self, size=None):
        self.calls.append(("normal", 0.0, 1.0, tuple(np.shape(np.empty(size)))))
        return self.rng.standard_normal(size)


@pytest.mark.parametrize("name, shape, kwargs, distribution, a, b", REFERENCES["draws"])
def test_each_init_draws_with_pytorchs_bounds_exactly(monkeypatch, name, shape, kwargs, distribution, a, b):
    recorder = Recorder(seed=5)
    monkeypatch.setattr(nn, "_rng", recorder)
    param = nn.Parameter(np.zeros(shape))
    assert getattr(init, name)(param, **kwargs) is param
    assert recorder.calls == [(distribution, a, b, tuple(shape))]  # the same floats as torch's, bit for bit
    rng = np.random.default_rng(5)
    expected = rng.uniform(a, b, shape) if distribution == "uniform" else rng.normal(a, b, shape)
    np.testing.assert_array_equal(param.numpy(), expected.astype(np.float32))


@pytest.mark.parametrize("constructor, draws", REFERENCES["defaults"], ids=[d[0] for d in REFERENCES["defaults"]])
def test_layers_initialise_as_pytorchs(monkeypatch, constructor, draws):
    """Every draw a layer's constructor makes, in order, with its shape and bounds: PyTorch's
    (nn.Linear and nn.Conv2d compute 1/√fan_in where PyTorch computes √3·gain/√fan_in: the same
    number to a few ulps)."""
    recorder = Recorder()
    monkeypatch.setattr(nn, "_rng", recorder)
    eval(constructor, {"nn": nn})
    assert [(d, shape) for d, _, _, shape in recorder.calls] == [(d, tuple(shape)) for shape, d, _, _ in draws]
    for (_, a, b, _), (_, _, want_a, want_b) in zip(recorder.calls, draws, strict=True):
        np.testing.assert_allclose([a, b], [want_a, want_b], rtol=1e-15)


def test_transposed_convolution_weights_use_pytorchs_fans():
    """ConvTranspose2d's weight is [in, out/groups, kh, kw]: PyTorch's fan_in is out/groups·kh·kw."""
    layer = nn.ConvTranspose2d(6, 9, (3, 2), groups=3)
    assert layer.weight.shape == (6, 3, 3, 2) and layer.bias.shape == (9,)
    bound = 1 / math.sqrt(3 * 3 * 2)
    assert 0.8 * bound < np.abs(layer.weight.numpy()).max() <= bound
    assert 0.8 * bound < np.abs(layer.bias.numpy()).max() <= bound


def test_seeded_inits_repeat_and_a_generator_can_be_given():
    def draw():
        p = nn.Parameter(np.zeros((4, 6)))
        return init.xavier_normal_(p).numpy()

    mn.manual_seed(11)
    first = draw()
    mn.manual_seed(11)
    np.testing.assert_array_equal(draw(), first)
    own = nn.Parameter(np.zeros((4, 6)))
    init.xavier_normal_(own, generator=np.random.default_rng(3))
    expected = np.random.default_rng(3).normal(0, math.sqrt(2 / 10), (4, 6)).astype(np.float32)
    np.testing.assert_array_equal(own.numpy(), expected)
    with pytest.raises(TypeError, match="numpy Generator"):
        init.uniform_(own, generator=3)


def moments_within(values: np.ndarray, mean: float, std: float, sigmas: float = 4.0) -> None:
    """The sample mean within `sigmas` standard errors of `mean`, and the sample std within 3%."""
    n = values.size
    assert abs(values.mean() - mean) < sigmas * std / math.sqrt(n), (values.mean(), mean)
    assert abs(values.std() / std - 1) < 0.03, (values.std(), std)


def test_distributions_have_the_moments_of_pytorchs_formulas():
    mn.manual_seed(0)
    shape = (300, 200)
    fan_in, fan_out = 200, 300
    kaiming = init.kaiming_normal_(nn.Parameter(np.zeros(shape)), nonlinearity="relu").numpy()
    moments_within(kaiming, 0.0, math.sqrt(2) / math.sqrt(fan_in))
    fan_out_std = init.kaiming_normal_(nn.Parameter(np.zeros(shape)), mode="fan_out", nonlinearity="relu").numpy()
    moments_within(fan_out_std, 0.0, math.sqrt(2) / math.sqrt(fan_out))
    bound = math.sqrt(6 / (fan_in + fan_out))
    xavier = init.xavier_uniform_(nn.Parameter(np.zeros(shape))).numpy()
    assert np.abs(xavier).max() <= bound and np.abs(xavier).max() > 0.99 * bound
    moments_within(xavier, 0.0, bound / math.sqrt(3))
    leaky = init.kaiming_uniform_(nn.Parameter(np.zeros(shape)), a=math.sqrt(5)).numpy()
    assert np.abs(leaky).max() <= 1 / math.sqrt(fan_in) and np.abs(leaky).max() > 0.99 / math.sqrt(fan_in)
    moments_within(init.normal_(nn.Parameter(np.zeros(shape)), 0.5, 2.0).numpy(), 0.5, 2.0)


def truncated_normal_moments(mean: float, std: float, a: float, b: float) -> tuple[float, float]:
    alpha, beta = (a - mean) / std, (b - mean) / std

    def pdf(x):
        return math.exp(-x * x / 2) / math.sqrt(2 * math.pi)

    def cdf(x):
        return (1 + math.erf(x / math.sqrt(2))) / 2

    z = cdf(beta) - cdf(alpha)
    shift = (pdf(alpha) - pdf(beta)) / z
    variance = 1 + (alpha * pdf(alpha) - beta * pdf(beta)) / z - shift**2
    return mean + std * shift, std * math.sqrt(variance)


@pytest.mark.parametrize(
    "mean, std, a, b",
    [(0.0, 1.0, -2.0, 2.0), (0.5, 0.2, 0.0, 1.0), (0.0, 1.0, 1.5, 3.0), (0.0, 0.02, -0.04, 0.04)],
    ids=["redraw", "narrow std", "tail: uniform proposals", "timm's"],
)
def test_trunc_normal_stays_in_bounds_with_the_truncated_moments(mean, std, a, b):
    mn.manual_seed(1)
    values = init.trunc_normal_(nn.Parameter(np.zeros((200, 100))), mean, std, a, b).numpy()
    assert values.min() >= a and values.max() <= b
    want_mean, want_std = truncated_normal_moments(mean, std, a, b)
    moments_within(values, want_mean, want_std)


def test_trunc_normal_far_from_its_bounds_warns_as_pytorch():
    with pytest.warns(UserWarning, match="mean is more than 2 std from"):
        init.trunc_normal_(nn.Parameter(np.zeros(10)), mean=5.0, std=1.0, a=-1.0, b=1.0)


@pytest.mark.parametrize("shape, gain", [((3, 5), 1.0), ((6, 3), 2.0), ((4, 2, 3), 0.5)])
def test_orthogonal_rows_or_columns_are_orthonormal_times_gain(shape, gain):
    mn.manual_seed(2)
    matrix = init.orthogonal_(nn.Parameter(np.zeros(shape)), gain=gain).numpy().reshape(shape[0], -1).astype(np.float64)
    small = min(matrix.shape)
    gram = matrix @ matrix.T if matrix.shape[0] == small else matrix.T @ matrix
    np.testing.assert_allclose(gram, gain**2 * np.eye(small), atol=1e-5)


def test_constants_eye_and_dirac():
    param = nn.Parameter(np.zeros((3, 4)))
    np.testing.assert_array_equal(init.constant_(param, 0.25).numpy(), np.full((3, 4), 0.25))
    np.testing.assert_array_equal(init.ones_(param).numpy(), np.ones((3, 4)))
    np.testing.assert_array_equal(init.zeros_(param).numpy(), np.zeros((3, 4)))
    np.testing.assert_array_equal(init.eye_(param).numpy(), np.eye(3, 4))
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions"):
        init.eye_(nn.Parameter(np.zeros((2, 2, 2))))
    weight = init.dirac_(nn.Parameter(np.ones((4, 3, 3, 5))), groups=2).numpy()
    expected = np.zeros((4, 3, 3, 5))
    for group in range(2):
        for d in range(2):  # min(4 // 2 out channels per group, 3 in channels)
            expected[group * 2 + d, d, 1, 2] = 1.0
    np.testing.assert_array_equal(weight, expected)
    with pytest.raises(ValueError, match="dim 0 must be divisible by groups"):
        init.dirac_(nn.Parameter(np.zeros((3, 3, 3))), groups=2)


def test_sparse_zeroes_the_asked_share_of_each_column():
    mn.manual_seed(3)
    values = init.sparse_(nn.Parameter(np.zeros((10, 6))), sparsity=0.3, std=0.5).numpy()
    assert ((values == 0).sum(axis=0) == 3).all()


def test_numpy_arrays_fill_in_place_and_traced_tensors_are_refused():
    array = np.zeros((2, 3), np.float32)
    assert init.ones_(array) is array and array.sum() == 6
    with pytest.warns(UserWarning, match="zero-element tensors is a no-op"):
        init.kaiming_normal_(nn.Parameter(np.zeros((0, 3))))
    with pytest.raises(TypeError, match="expects an nn.Parameter or a numpy array"):
        init.zeros_([1.0, 2.0])


def test_init_acts_on_the_weights_a_compiled_program_owns():
    layer = nn.Linear(3, 2)
    program = mn.compile(layer, inputs={"x": mn.f32[1, 3]})
    x = np.ones((1, 3), np.float32)
    program(x=x)  # the weights now live on the device
    init.eye_(layer.weight)
    init.constant_(layer.bias, 0.5)
    np.testing.assert_array_equal(program(x=x), [[1.5, 1.5]])
    np.testing.assert_array_equal(layer.weight.numpy(), np.eye(2, 3))
