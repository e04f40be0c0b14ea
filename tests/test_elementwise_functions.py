"""Issue 40's elementwise functions and activations: their kernels against the interpreter where
precision is hard (log1p and expm1 near 0, sin and cos far from 0, pow's special cases), their
gradients by finite differences in the middle of a chain, and their DSL names.

Every function of ir/functions.py also runs in tests/test_kernels.py (test_unary, test_binary_broadcasting,
test_ternary_broadcasting), and its values and gradients at NaN, ±inf, ±0 and the kinks are checked
against PyTorch's in tests/test_nan_semantics.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check, gradcheck, one_op, run_traced, trace_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.trace import Tracer, tracing

RNG = np.random.default_rng(40)


def logspace_both_signs(low: float, high: float, count: int) -> np.ndarray:
    magnitudes = 10.0 ** RNG.uniform(low, high, count)
    return (magnitudes * RNG.choice([-1.0, 1.0], count)).astype(np.float32)


@pytest.mark.parametrize("op", ["log1p", "expm1"])
def test_log1p_and_expm1_keep_the_digits_of_a_small_x(op):
    """Relative accuracy near 0, where log(1 + x) and exp(x) − 1 in f32 lose x's digits (a 1e-6
    x would come back with a 5% error), and across the switch to the plain formula at |x| = 0.5."""
    x = np.concatenate([logspace_both_signs(-30, 0, 300), RNG.uniform(-0.99, 3.0, 100).astype(np.float32)])
    x = x.reshape(20, 20)
    executable = check(one_op(op, [(20, 20)]), {"x0": x}, rtol=1e-6, atol=0)
    got = executable.run({"x0": x}, read=("out",))["out"]
    exact = getattr(np, op)(x.astype(np.float64))
    assert np.max(np.abs(got - exact) / np.abs(exact)) < 6e-7  # a few ulps, everywhere


@pytest.mark.parametrize("op", ["sin", "cos"])
@pytest.mark.parametrize("reach", [4.0, 1e4, 2e5])
def test_sin_and_cos_stay_within_a_few_ulps_far_from_zero(op, reach):
    """WGSL's own sin and cos promise 2⁻¹¹ on [−π, π] only; the reduction by π/2 keeps a few ulps
    (absolute, of values in [−1, 1]) out to 2·10⁵, where lavapipe does not fuse fma."""
    x = RNG.uniform(-reach, reach, (33, 7)).astype(np.float32)
    got = check(one_op(op, [(33, 7)]), {"x0": x}, rtol=0, atol=6e-7).run({"x0": x}, read=("out",))["out"]
    assert np.max(np.abs(got - getattr(np, op)(x.astype(np.float64)))) < 3 * 2.0**-24


BASES = [np.nan, np.inf, -np.inf, 0.0, -0.0, -3.0, -2.0, -1.0, -0.5, 0.5, 1.0, 1.5, 2.0, 10.0]
POWERS = [np.nan, np.inf, -np.inf, 0.0, -0.0, -3.0, -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 2.5, 3.0, 1e9]


def test_pow_of_two_tensors_is_cs_pow_at_every_special_pair():
    """C's pow (torch.pow of tensors): the sign of an odd integer power, NaN for a negative base and
    a non-integer exponent, pow(x, 0) = pow(1, y) = pow(−1, ±inf) = 1, the infinities, ±0."""
    base, power = np.meshgrid(np.float32(BASES), np.float32(POWERS), indexing="ij")
    check(one_op("pow", [base.shape, power.shape]), {"x0": base, "x1": power}, rtol=2e-6, atol=0)


@pytest.mark.parametrize("exponent", [2.5, 2.0, 3.0, 0.5, -0.5, -1.0, 0.0, 1.0, -2.0, -1.5, 7.0, -3.0, 0.3])
def test_pow_of_a_number_exponent(exponent):
    base = np.concatenate([np.float32(BASES), RNG.uniform(-3, 3, 19).astype(np.float32)]).reshape(3, 11)
    graph = one_op("pow_scalar", [(3, 11), ()])
    check(graph, {"x0": base, "x1": np.float32(exponent)}, rtol=2e-6, atol=1e-30)


def test_the_dsl_takes_pytorchs_shortcuts_for_number_exponents():
    """x ** 1 is x, 2 and 3 products, 0.5 sqrt, −1 a reciprocal; others pow_scalar; a tensor exponent
    or a number base pow (as torch.pow's overloads)."""
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((3,)))
        y = trace_leaf(tracer, "input", "y", TensorType((3,)))
        results = {
            "1": x**1,
            "2": x**2,
            "3": x.pow(3),
            "0.5": x**0.5,
            "-1": x**-1,
            "2.5": x**2.5,
            "0": mn.pow(x, 0),
            "tensor": x**y,
            "rpow": 2**x,
        }
        with pytest.raises(TypeError, match="expected a Tensor"):
            mn.pow(2.0, 3.0)
    graph = tracer.graph
    op = {name: graph[t.node].op for name, t in results.items()}
    assert results["1"] is x
    assert op == {
        "1": "input", "2": "mul", "3": "mul", "0.5": "sqrt", "-1": "div", "2.5": "pow_scalar", "0": "pow_scalar",
        "tensor": "pow", "rpow": "pow",
    }  # fmt: skip


# (the op, operand shapes, gradcheck options): inputs ±[0.25, 2.4] (away_from_zero) or [0.25, 2.35] (positive)
GRADIENTS = {
    "log1p": (mn.log1p, [(3, 4)], {"positive": True}),
    "expm1": (lambda x: x.expm1(), [(3, 4)], {}),
    "sin": (mn.sin, [(3, 4)], {}),
    "cos": (lambda x: x.cos(), [(3, 4)], {}),
    "minimum": (mn.minimum, [(3, 4), (4,)], {}),
    "maximum": (lambda a, b: a.maximum(b), [(3, 1), (1, 4)], {}),
    "pow of tensors": (lambda a, b: a**b, [(3, 4), (3, 4)], {"positive": True}),
    "pow of tensors, a negative base": (lambda a, b: mn.pow(a, mn.round(b * 2.0)), [(3, 4), (3, 4)], {}),
    "2 ** x": (lambda x: 2.0**x, [(3, 4)], {}),
    "x ** 2.5": (lambda x: x**2.5, [(3, 4)], {"positive": True}),
    "x ** -0.5": (lambda x: x**-0.5, [(3, 4)], {"positive": True}),
    "x ** -2": (lambda x: x.pow(-2), [(3, 4)], {"away_from_zero": True}),
    "x ** 0": (lambda x: x**0 * x, [(3, 4)], {}),
    "x ** 7": (lambda x: x**7, [(3, 4)], {}),
    "square": (mn.square, [(3, 4)], {}),
    "reciprocal": (lambda x: x.reciprocal(), [(3, 4)], {"away_from_zero": True}),
    "sign and round": (lambda x: x * x.sign() + mn.round(x, 1) * 0.0, [(3, 4)], {"away_from_zero": True}),
    "elu": (lambda x: F.elu(x, 0.7), [(3, 4)], {}),
    "selu": (F.selu, [(3, 4)], {}),
    "celu": (lambda x: F.celu(x, 1.5), [(3, 4)], {}),
    "hardtanh": (lambda x: F.hardtanh(x, -0.6, 0.8), [(3, 4)], {}),
    "relu6": (lambda x: F.relu6(x * 4.0), [(3, 4)], {}),
    "hardsigmoid": (lambda x: F.hardsigmoid(x * 3.0), [(3, 4)], {}),
    "hardswish": (lambda x: F.hardswish(x * 3.0), [(3, 4)], {}),
    "mish": (F.mish, [(3, 4)], {}),
    "softsign": (F.softsign, [(3, 4)], {}),
    "logsigmoid": (lambda x: F.logsigmoid(x * 10.0), [(3, 4)], {}),
}


@pytest.mark.parametrize("name", sorted(GRADIENTS))
def test_gradients_mid_chain(name):
    op, shapes, options = GRADIENTS[name]
    assert gradcheck(op, shapes, np.random.default_rng(41), **options) < 1e-6


def test_activations_compute_pytorchs_formulas_at_ordinary_values():
    """PyTorch's definitions at a few points, written out (the extremes, NaN and ±inf are in
    test_nan_semantics.py)."""
    x = np.array([-4.0, -3.0, -1.5, -0.5, 0.0, 0.25, 1.0, 2.0, 3.0, 7.0])
    got = run_traced(
        lambda x: {
            "elu": F.elu(x, 0.5),
            "celu": F.celu(x, 2.0),
            "selu": F.selu(x),
            "hardtanh": F.hardtanh(x, -1.0, 2.0),
            "relu6": F.relu6(x),
            "hardsigmoid": F.hardsigmoid(x),
            "hardswish": F.hardswish(x),
            "mish": F.mish(x),
            "softsign": F.softsign(x),
            "logsigmoid": F.logsigmoid(x),
        },
        {"x": x},
    )
    softplus = np.log1p(np.exp(x))
    expected = {
        "elu": np.where(x > 0, x, 0.5 * np.expm1(x)),
        "celu": np.where(x > 0, x, 2.0 * np.expm1(x / 2.0)),
        "selu": 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * np.expm1(x)),
        "hardtanh": np.clip(x, -1.0, 2.0),
        "relu6": np.clip(x, 0.0, 6.0),
        "hardsigmoid": np.clip(x / 6 + 0.5, 0.0, 1.0),
        "hardswish": x * np.clip(x + 3, 0, 6) / 6,
        "mish": x * np.tanh(softplus),
        "softsign": x / (1 + np.abs(x)),
        "logsigmoid": -np.log1p(np.exp(-x)),
    }
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12, err_msg=name)


def test_round_to_decimals_as_pytorch():
    x = np.array([1.2345, -1.2355, 125.0, 135.0, -0.5, 2.5])
    got = run_traced(lambda x: {"2": mn.round(x, decimals=2), "-1": x.round(-1), "0": F.round(x)}, {"x": x})
    np.testing.assert_allclose(got["2"], np.round(x * 100) / 100)
    np.testing.assert_array_equal(got["-1"], [0.0, -0.0, 120.0, 140.0, -0.0, 0.0])  # halves to even: 12.5 → 12
    np.testing.assert_array_equal(got["0"], [1.0, -1.0, 125.0, 135.0, -0.0, 2.0])


def test_activations_refuse_what_they_cannot_trace():
    def traced(build):
        return run_traced(lambda x: {"out": build(x)}, {"x": np.ones(3)})

    for build in (lambda x: F.elu(x, inplace=True), lambda x: F.relu6(x, True), lambda x: F.mish(x, inplace=True)):
        with pytest.raises(NotImplementedError, match=r"test_elementwise_functions.py:\d+: .*inplace=True"):
            traced(build)
    with pytest.raises(ValueError, match="max_val 0.5 is below min_val 1.0"):
        traced(lambda x: F.hardtanh(x, 1.0, 0.5))
    with pytest.raises(ValueError, match="alpha must not be 0"):
        traced(lambda x: F.celu(x, 0.0))


def test_the_new_names_are_pytorchs():
    for name in ("log1p", "expm1", "sin", "cos", "minimum", "maximum", "pow", "sign", "floor", "ceil", "round",
                 "trunc", "reciprocal", "square", "isnan", "isinf", "isfinite", "selu", "celu"):  # fmt: skip
        assert callable(getattr(mn, name)) and name in mn.__all__, name
    for name in ("elu", "selu", "celu", "hardtanh", "relu6", "hardsigmoid", "hardswish", "mish", "softsign",
                 "logsigmoid", "log1p", "minimum", "pow", "square", "round"):  # fmt: skip
        assert callable(getattr(F, name)) and name in F.__all__, name
    for name in ("log1p", "expm1", "sin", "cos", "minimum", "maximum", "pow", "sign", "floor", "ceil", "round",
                 "trunc", "reciprocal", "square", "isnan", "isinf", "isfinite"):  # fmt: skip
        assert callable(getattr(mn.Tensor, name)), name


def test_isnan_isinf_isfinite_are_masks():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0])
    got = interpret_masks(x)
    np.testing.assert_array_equal(got["isnan"], [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(got["isinf"], [0, 1, 1, 0, 0])
    np.testing.assert_array_equal(got["isfinite"], [0, 0, 0, 1, 1])


def interpret_masks(x: np.ndarray) -> dict[str, np.ndarray]:
    tracer = Tracer()
    with tracing(tracer):
        t = trace_leaf(tracer, "input", "x", TensorType(x.shape))
        for name in ("isnan", "isinf", "isfinite"):
            tracer.graph.outputs[name] = getattr(t, name)().node
    return interpret(tracer.graph, {"x": x.astype(np.float32)}).outputs
