"""The elementwise functions, each declared once: numpy semantics, WGSL form, gradient, DSL names.

Every function here is an IR op of its own name (broadcasting its operands, `ir/ops/elementwise.py`),
a function of the expression language that fused kernels' bodies are written in (`ir/expr.py`),
`(Unary fn x)` / `(Binary fn x y)` / `(Ternary fn x y z)` in the e-graph, and a WGSL expression
in every kernel that computes it (`codegen/expressions.py`). Adding one is one entry in
`FUNCTIONS` below: those stages read this table and nothing else.

A `Function` has:
- `numpy`: its semantics on arrays (the oracle the kernels are tested against);
- `wgsl`: its WGSL f32 expression, `{0}`, `{1}`, `{2}` standing for the operands, each used at
  most once (so that nested expressions stay linear in size: a form that needs an operand twice
  calls a helper function, declared in `helpers`, whose text is in `WGSL_HELPERS`);
- `vjp(b, xs, y, g)`: the gradient of each operand as nodes emitted with the builder `b`, given
  the operand nodes `xs`, the result node `y` and the upstream gradient `g`, at the result's
  (broadcast) shape — the op's VJP sums them back to each operand's shape; None where an
  operand has no gradient;
- `method` / `functional`: the names it has in the DSL (`Tensor.exp`, `F.exp`, `mn.exp`);
  functions whose DSL form takes Python parameters (`F.leaky_relu(x, negative_slope)`) are
  wrapped by hand in `meganeura/tensor.py` instead (`method`/`functional` left None).

Comparisons give masks in the operands' float type, 1.0 where true and 0.0 elsewhere (PyTorch
gives bool tensors; arithmetic on them promotes to float the same way); `where(c, a, b)` picks a
where c is not 0.

NaN and ±inf give PyTorch's values and gradients (tests/test_nan_semantics.py holds PyTorch's
numbers): WGSL's min, max and clamp return the other operand where one is NaN, so the forms that
use them (relu, clamp, hardtanh, tanh's range guard, minimum, maximum) keep a NaN, tested from the
bits (`mn_isnan`; WGSL lets a compiler fold x != x to false). Gradients that PyTorch picks rather
than multiplies (relu's threshold_backward, clamp's) are `where`s, so a NaN or inf upstream
gradient does not leak through a zero mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Function:
    """One elementwise function (see the module docstring)."""

    name: str
    arity: int
    numpy: Callable[..., np.ndarray]
    wgsl: str
    vjp: Callable | None
    doc: str
    helpers: tuple[str, ...] = ()
    method: str | None = None
    functional: str | None = None


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


# The error function in double precision (math.erf, a few ulps): the oracle the WGSL kernel's
# polynomial approximation is tested against, so it must not share that approximation.
_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return _erf(x).astype(x.dtype if x.dtype.kind == "f" else np.float64, copy=False)


def mask(values: np.ndarray, like: tuple[np.ndarray, ...]) -> np.ndarray:
    """A boolean array as 1.0/0.0 in the operands' float type."""
    return values.astype(np.result_type(*like))


def softplus_numpy(x: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """log(1 + eˣ), or x itself above the threshold (PyTorch's softplus with beta 1)."""
    return np.where(x > threshold, x, np.log1p(np.exp(np.minimum(x, threshold))))


def clamp_numpy(x: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """min(max(x, low), high): clamp's and hardtanh's values."""
    return np.minimum(np.maximum(x, low), high)


def isnan_numpy(x: np.ndarray) -> np.ndarray:
    return mask(np.isnan(x), (x,))


def hardsigmoid_numpy(x: np.ndarray) -> np.ndarray:
    """min(max(x + 3, 0), 6) / 6, NaN kept (PyTorch's hardsigmoid)."""
    return np.minimum(np.maximum(x + 3, 0), 6) / 6


def hardswish_numpy(x: np.ndarray) -> np.ndarray:
    """x·min(max(x + 3, 0), 6) / 6 (PyTorch's hardswish: NaN at −∞, where x·0 is)."""
    with np.errstate(invalid="ignore"):
        return x * np.minimum(np.maximum(x + 3, 0), 6) / 6


def elu_numpy(x: np.ndarray, alpha: np.ndarray, input_scale: np.ndarray) -> np.ndarray:
    """x where x > 0, alpha·expm1(x·input_scale) elsewhere (PyTorch's elu kernel; celu's input_scale is 1/alpha)."""
    return np.where(x <= 0, alpha * np.expm1(np.minimum(x, 0) * input_scale), x)


def pow_numpy(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """C's pow, as torch.pow(Tensor, Tensor): pow(x, 0) = pow(1, y) = 1 (NaN too), a negative finite
    base with a non-integer exponent NaN, the signs of zero and infinity by the exponent's parity."""
    with np.errstate(all="ignore"):
        return np.power(x, y)


# torch.pow(Tensor, Scalar)'s shortcuts (aten/src/ATen/native/cpu/PowKernel.cpp): these exponents
# are computed as sqrt, 1/sqrt, … and not by pow, which differs at −0 and −∞ (sqrt(−0) = −0 where
# pow(−0, 0.5) = +0, 1/sqrt(−∞) = NaN where pow(−∞, −0.5) = 0); pow's own gradient reads them too.
POW_SHORTCUTS: dict[float, Callable[[np.ndarray], np.ndarray]] = {
    0.5: np.sqrt,
    -0.5: lambda x: 1 / np.sqrt(x),
    -1.0: lambda x: 1 / x,
    2.0: lambda x: x * x,
    3.0: lambda x: x * x * x,
    -2.0: lambda x: 1 / (x * x),
}


def pow_scalar_numpy(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """x ** exponent as torch.pow(Tensor, number) computes it: the shortcuts of POW_SHORTCUTS, else C's pow."""
    with np.errstate(all="ignore"):
        out = np.power(x, exponent)
        for special, shortcut in POW_SHORTCUTS.items():
            out = np.where(exponent == special, shortcut(x), out)
    return out


# ---------------------------------------------------------------------------------------------
# Gradients. `b` is autodiff's GradBuilder; xs the operand nodes, y the result, g its gradient.


def mul(b, x, y):
    return b.emit("mul", [x, y])


def silu_derivative(b, x: int) -> int:
    """d silu(x)/dx = σ(x)·(1 + x·(1 − σ(x)))."""
    s = b.emit("sigmoid", [x])
    inner = b.emit("add", [b.const(1.0), mul(b, x, b.emit("sub", [b.const(1.0), s]))])
    return mul(b, s, inner)


def vjp_neg(b, xs, y, g):
    return [b.emit("neg", [g])]


def vjp_exp(b, xs, y, g):
    return [mul(b, g, y)]


def vjp_log(b, xs, y, g):
    return [b.emit("div", [g, xs[0]])]


def vjp_sqrt(b, xs, y, g):
    return [b.emit("div", [mul(b, g, b.const(0.5)), y])]


def vjp_rsqrt(b, xs, y, g):
    cube = mul(b, mul(b, y, y), y)  # d/dx x^(-1/2) = −½·y³
    return [mul(b, g, mul(b, cube, b.const(-0.5)))]


def where(b, condition, a, c):
    return b.emit("where", [condition, a, c])


def vjp_relu(b, xs, y, g):
    # PyTorch's threshold_backward: 0 where y ≤ 0, else g (so g where x is NaN, and 0 where g is
    # NaN but x ≤ 0). The mask reads relu's output (y > 0 exactly where x > 0), not its input, so
    # that the forward matmul that produced x can take relu into its epilogue without x being kept.
    return [where(b, b.emit("less_equal", [y, b.const(0.0)]), b.const(0.0), g)]


def vjp_sigmoid(b, xs, y, g):
    return [mul(b, g, mul(b, y, b.emit("sub", [b.const(1.0), y])))]


def vjp_tanh(b, xs, y, g):
    return [mul(b, g, b.emit("sub", [b.const(1.0), mul(b, y, y)]))]


def vjp_silu(b, xs, y, g):
    return [mul(b, g, silu_derivative(b, xs[0]))]


def vjp_erf(b, xs, y, g):
    x = xs[0]  # d/dx erf(x) = 2/√π · exp(−x²)
    density = b.emit("exp", [b.emit("neg", [mul(b, x, x)])])
    return [mul(b, g, mul(b, density, b.const(2.0 / math.sqrt(math.pi))))]


def vjp_abs(b, xs, y, g):
    x, zero = xs[0], b.const(0.0)  # sign(x), 0 at 0 (PyTorch's sgn)
    sign = b.emit("sub", [b.emit("greater", [x, zero]), b.emit("less", [x, zero])])
    return [mul(b, g, sign)]


def vjp_softplus(b, xs, y, g):
    x, threshold = xs  # PyTorch: g above the threshold, g·σ(x) below
    return [b.emit("where", [b.emit("greater", [x, threshold]), g, mul(b, g, b.emit("sigmoid", [x]))]), None]


def vjp_leaky_relu(b, xs, y, g):
    x, slope = xs  # PyTorch: g where x > 0, g·slope elsewhere (at 0 too)
    return [b.emit("where", [b.emit("greater", [x, b.const(0.0)]), g, mul(b, g, slope)]), None]


def vjp_add(b, xs, y, g):
    return [g, g]


def vjp_sub(b, xs, y, g):
    return [g, b.emit("neg", [g])]


def vjp_mul(b, xs, y, g):
    return [mul(b, g, xs[1]), mul(b, g, xs[0])]


def vjp_div(b, xs, y, g):
    gx = b.emit("div", [g, xs[1]])
    return [gx, b.emit("neg", [mul(b, gx, y)])]  # −g·x/y² = −(g/y)·(x/y)


def vjp_swiglu(b, xs, y, g):
    gate, up = xs
    return [mul(b, mul(b, g, up), silu_derivative(b, gate)), mul(b, g, b.emit("silu", [gate]))]


def vjp_where(b, xs, y, g):
    condition, zero = xs[0], b.const(0.0)
    return [None, b.emit("where", [condition, g, zero]), b.emit("where", [condition, zero, g])]


def vjp_clamp(b, xs, y, g):
    # PyTorch's clamp_backward: g to x where low ≤ x ≤ high, to low where x < low, to high where
    # x > high, 0 elsewhere (to each of them where x is NaN), picked rather than multiplied by a mask.
    x, low, high = xs
    zero = b.const(0.0)
    inside = mul(b, b.emit("greater_equal", [x, low]), b.emit("less_equal", [x, high]))
    below, above = b.emit("less", [x, low]), b.emit("greater", [x, high])
    return [where(b, inside, g, zero), where(b, below, g, zero), where(b, above, g, zero)]


def vjp_hardtanh(b, xs, y, g):
    # PyTorch's hardtanh_backward: 0 where x ≤ low or x ≥ high, else g (NaN too): no gradient to the bounds.
    x, low, high = xs
    outside = b.emit("add", [b.emit("less_equal", [x, low]), b.emit("greater_equal", [x, high])])
    return [where(b, outside, b.const(0.0), g), None, None]


def vjp_minimum_maximum(a_loses: str, b_loses: str):
    """maximum's (a loses where a < b: "less", b where a > b: "greater") or minimum's VJP, as
    PyTorch's: g/2 to each side of a tie, else g to the side kept, and g to both where either is
    NaN (no comparison holds there)."""

    def vjp(b, xs, y, g):
        a, other = xs
        zero, half = b.const(0.0), mul(b, g, b.const(0.5))
        tie = b.emit("equal", [a, other])
        to_a = where(b, b.emit(a_loses, [a, other]), zero, g)
        to_b = where(b, b.emit(b_loses, [a, other]), zero, g)
        return [where(b, tie, half, to_a), where(b, tie, half, to_b)]

    return vjp


def vjp_log1p(b, xs, y, g):
    return [b.emit("div", [g, b.emit("add", [xs[0], b.const(1.0)])])]


def vjp_expm1(b, xs, y, g):
    return [mul(b, g, b.emit("add", [y, b.const(1.0)]))]


def vjp_sin(b, xs, y, g):
    return [mul(b, g, b.emit("cos", [xs[0]]))]


def vjp_cos(b, xs, y, g):
    return [mul(b, g, b.emit("neg", [b.emit("sin", [xs[0]])]))]


def vjp_hardsigmoid(b, xs, y, g):
    # PyTorch: g/6 where −3 < x < 3, else 0 (NaN too)
    x = xs[0]
    inside = mul(b, b.emit("greater", [x, b.const(-3.0)]), b.emit("less", [x, b.const(3.0)]))
    return [where(b, inside, mul(b, g, b.const(1.0 / 6.0)), b.const(0.0))]


def vjp_hardswish(b, xs, y, g):
    # PyTorch: 0 where x ≤ −3, g·(x/3 + 0.5) where x < 3, else g (NaN too)
    x = xs[0]
    slope = b.emit("add", [b.emit("div", [x, b.const(3.0)]), b.const(0.5)])
    middle = where(b, b.emit("less", [x, b.const(3.0)]), mul(b, g, slope), g)
    return [where(b, b.emit("less_equal", [x, b.const(-3.0)]), b.const(0.0), middle)]


def vjp_elu(b, xs, y, g):
    # PyTorch's elu_backward: g·alpha·input_scale·exp(x·input_scale) where x ≤ 0, else g (NaN too)
    x, alpha, input_scale = xs
    curve = mul(b, mul(b, mul(b, g, input_scale), alpha), b.emit("exp", [mul(b, x, input_scale)]))
    return [where(b, b.emit("less_equal", [x, b.const(0.0)]), curve, g), None, None]


def constant_of(b, node: int) -> float | None:
    """The value of a scalar constant node, or None."""
    n = b.graph[node]
    return n.attr("value") if n.op == "const" else None


def vjp_pow(b, xs, y, g):
    # PyTorch's pow_backward_self and pow_backward_exponent: 0 to x where y = 0, else
    # g·y·x^(y−1); g·x^y·log(x) to y, 0 where x = 0 and y ≥ 0.
    x, exponent = xs
    zero = b.const(0.0)
    power = b.emit("pow", [x, b.emit("sub", [exponent, b.const(1.0)])])
    to_x = where(b, b.emit("equal", [exponent, zero]), zero, mul(b, g, mul(b, exponent, power)))
    flat = mul(b, b.emit("equal", [x, zero]), b.emit("greater_equal", [exponent, zero]))
    to_y = mul(b, g, where(b, flat, zero, mul(b, y, log_of(b, x))))
    return [to_x, to_y]


def log_of(b, x: int) -> int:
    """log(x), computed here where x is a constant (`2 ** t`'s base): WGSL rejects a shader whose
    constant expression log(0.0) or log(−2.0) is out of range."""
    value = constant_of(b, x)
    if value is None:
        return b.emit("log", [x])
    return b.const(math.log(value) if value > 0 else -math.inf if value == 0 else math.nan)


def vjp_pow_scalar(b, xs, y, g):
    # PyTorch's pow_backward for a number exponent e: 0 where e = 0, else g·(e·x^(e−1)), x^(e−1)
    # with torch.pow(Tensor, number)'s shortcuts again. The exponent, a number, has no gradient.
    x, exponent = xs
    e = constant_of(b, exponent)
    if e == 0.0:
        return [where(b, b.const(0.0), g, b.const(0.0)), None]
    lower = b.const(e - 1.0) if e is not None else b.emit("sub", [exponent, b.const(1.0)])
    grad = mul(b, g, mul(b, exponent, b.emit("pow_scalar", [x, lower])))
    if e is None:
        grad = where(b, b.emit("equal", [exponent, b.const(0.0)]), b.const(0.0), grad)
    return [grad, None]


def no_gradient(b, xs, y, g):
    return [None] * len(xs)


def value_with_gradient_of(value: np.ndarray, carrier: np.ndarray) -> np.ndarray:
    """`value` broadcast with `carrier` (whose values are not read)."""
    return np.broadcast_to(value, np.broadcast_shapes(np.shape(value), np.shape(carrier))).copy()


def vjp_gradient_of(b, xs, y, g):
    return [None, g]  # the value's operand gets none; the carrier the whole gradient


# ---------------------------------------------------------------------------------------------
# The table


def unary(name, numpy_fn, wgsl, vjp, doc, helpers=(), dsl=True) -> Function:
    return Function(name, 1, numpy_fn, wgsl, vjp, doc, helpers, name if dsl else None, name if dsl else None)


def comparison(name: str, numpy_fn, symbol: str) -> Function:
    doc = f"1.0 where a {symbol} b, else 0.0 (a mask in the operands' float type)"
    return Function(
        name,
        2,
        lambda a, b, fn=numpy_fn: mask(fn(a, b), (a, b)),
        f"select(0.0, 1.0, {{0}} {symbol} {{1}})",
        no_gradient,
        doc,
        functional=name,
    )


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        unary("neg", np.negative, "(-{0})", vjp_neg, "−x", dsl=False),
        unary("exp", np.exp, "exp({0})", vjp_exp, "eˣ"),
        unary("log", np.log, "log({0})", vjp_log, "the natural logarithm"),
        unary("sqrt", np.sqrt, "sqrt({0})", vjp_sqrt, "√x"),
        unary("rsqrt", lambda x: 1.0 / np.sqrt(x), "inverseSqrt({0})", vjp_rsqrt, "1/√x"),
        # WGSL's max, min and clamp return the other operand where one is NaN: the forms that use
        # them keep a NaN x (PyTorch's relu, clamp, tanh… propagate it), tested from the bits.
        unary("relu", lambda x: np.maximum(x, 0), "mn_relu({0})", vjp_relu, "max(x, 0)", ("mn_relu", "mn_isnan")),
        # exp(-x) overflows to inf for very negative x, and 1/(1+inf) is the right limit, 0.
        unary("sigmoid", sigmoid, "(1.0 / (1.0 + exp(-({0}))))", vjp_sigmoid, "1 / (1 + e⁻ˣ)"),
        unary("tanh", np.tanh, "mn_tanh({0})", vjp_tanh, "the hyperbolic tangent", ("mn_tanh", "mn_isnan")),
        unary("silu", lambda x: x * sigmoid(x), "mn_silu({0})", vjp_silu, "x·sigmoid(x) (swish)", ("mn_silu",)),
        unary("erf", erf, "mn_erf({0})", vjp_erf, "the error function 2/√π ∫₀ˣ exp(−t²) dt", ("mn_erf",)),
        unary("abs", np.abs, "abs({0})", vjp_abs, "|x| (gradient sign(x), 0 at 0)"),
        # torch's detach: the value itself, cut off from autodiff (its VJP gives no gradient); a
        # copy in the graph, which the pointwise rules inline into whatever reads it.
        unary("detach", lambda x: np.array(x, copy=True), "{0}", no_gradient, "x, with no gradient (stop-gradient)"),
        # The value of the first operand with the gradient of the second (whose value is unused): a
        # result PyTorch computes outside autograd and differentiates as something else — x.max()
        # spreads its gradient over the maxima, a clamp under no_grad passes it through unchanged.
        Function(
            "value_with_gradient_of",
            2,
            value_with_gradient_of,
            "mn_first({0}, {1})",
            vjp_gradient_of,
            "the first operand's value, the second's gradient",
            ("mn_first",),
        ),
        # Read from the bits, not as x == x or x - x == 0: WGSL lets a compiler assume that no
        # value is NaN or infinite, and such a test may then be folded to true.
        unary(
            "isfinite",
            lambda x: mask(np.isfinite(x), (x,)),
            "mn_isfinite({0})",
            no_gradient,
            "1.0 where x is neither NaN nor ±∞, else 0.0 (compile(check_finite=True))",
            ("mn_isfinite",),
        ),
        unary(
            "isnan",
            isnan_numpy,
            "select(0.0, 1.0, mn_isnan({0}))",
            no_gradient,
            "1.0 where x is NaN, else 0.0",
            ("mn_isnan",),
        ),
        unary(
            "isinf",
            lambda x: mask(np.isinf(x), (x,)),
            "select(0.0, 1.0, mn_isinf({0}))",
            no_gradient,
            "1.0 where x is ±∞, else 0.0",
            ("mn_isinf",),
        ),
        # log1p and expm1 by series near 0 (where log(1 + x) and exp(x) − 1 lose the digits of x)
        unary("log1p", np.log1p, "mn_log1p({0})", vjp_log1p, "log(1 + x), exact near 0", ("mn_log1p",)),
        unary("expm1", np.expm1, "mn_expm1({0})", vjp_expm1, "eˣ − 1, exact near 0", ("mn_expm1",)),
        # WGSL's sin and cos are only 2⁻¹¹-accurate on [−π, π] (and unbounded beyond): a reduction by
        # π/2 and polynomials instead, a few ulps for |x| ≤ 2·10⁵ (mn_sin_quarters).
        unary("sin", np.sin, "mn_sin_quarters({0}, 0)", vjp_sin, "the sine", ("mn_sin_quarters",)),
        unary("cos", np.cos, "mn_sin_quarters({0}, 1)", vjp_cos, "the cosine", ("mn_sin_quarters",)),
        unary("floor", np.floor, "floor({0})", no_gradient, "the largest integer ≤ x (gradient 0)"),
        unary("ceil", np.ceil, "ceil({0})", no_gradient, "the smallest integer ≥ x (gradient 0)"),
        unary(
            "round",
            np.round,
            "round({0})",
            no_gradient,
            "x to the nearest integer, halves to even (gradient 0)",
            dsl=False,  # round(x, decimals) is written out in tensor.py
        ),
        unary("trunc", np.trunc, "trunc({0})", no_gradient, "x rounded toward 0 (gradient 0)"),
        unary(
            "hardsigmoid",
            hardsigmoid_numpy,
            "mn_hardsigmoid({0})",
            vjp_hardsigmoid,
            "min(max(x + 3, 0), 6) / 6",
            ("mn_hardsigmoid", "mn_isnan"),
            dsl=False,
        ),
        unary(
            "hardswish",
            hardswish_numpy,
            "mn_hardswish({0})",
            vjp_hardswish,
            "x·min(max(x + 3, 0), 6) / 6",
            ("mn_hardswish",),
            dsl=False,
        ),
        Function(
            "softplus",
            2,
            softplus_numpy,
            "mn_softplus({0}, {1})",
            vjp_softplus,
            "log(1 + eˣ), x above the threshold (the second operand)",
            ("mn_softplus",),
        ),
        Function(
            "leaky_relu",
            2,
            lambda x, slope: np.where(x > 0, x, x * slope),
            "mn_leaky_relu({0}, {1})",
            vjp_leaky_relu,
            "x where x > 0, x·slope elsewhere (the slope is the second operand)",
            ("mn_leaky_relu",),
        ),
        Function("add", 2, np.add, "({0} + {1})", vjp_add, "a + b", functional="add"),
        Function("sub", 2, np.subtract, "({0} - {1})", vjp_sub, "a − b", functional="sub"),
        Function("mul", 2, np.multiply, "({0} * {1})", vjp_mul, "a · b", functional="mul"),
        Function("div", 2, np.divide, "({0} / {1})", vjp_div, "a / b", functional="div"),
        Function(
            "minimum",
            2,
            np.minimum,
            "mn_minimum({0}, {1})",
            vjp_minimum_maximum("greater", "less"),
            "the smaller of a and b, NaN where either is (gradient split evenly at ties)",
            ("mn_minimum", "mn_isnan"),
            "minimum",
            "minimum",
        ),
        Function(
            "maximum",
            2,
            np.maximum,
            "mn_maximum({0}, {1})",
            vjp_minimum_maximum("less", "greater"),
            "the larger of a and b, NaN where either is (gradient split evenly at ties)",
            ("mn_maximum", "mn_isnan"),
            "maximum",
            "maximum",
        ),
        Function(
            "pow",
            2,
            pow_numpy,
            "mn_pow({0}, {1})",
            vjp_pow,
            "a ** b (C's pow, as torch.pow of two tensors)",
            ("mn_pow", "mn_isnan", "mn_isinf"),
        ),
        Function(
            "pow_scalar",
            2,
            pow_scalar_numpy,
            "mn_pow_scalar({0}, {1})",
            vjp_pow_scalar,
            "a ** b for a number b (torch.pow(Tensor, number): b = ±0.5, −1, 2, 3, −2 by sqrt, products, quotients)",
            ("mn_pow_scalar", "mn_pow", "mn_isnan", "mn_isinf"),
        ),
        comparison("greater", np.greater, ">"),
        comparison("greater_equal", np.greater_equal, ">="),
        comparison("less", np.less, "<"),
        comparison("less_equal", np.less_equal, "<="),
        comparison("equal", np.equal, "=="),
        comparison("not_equal", np.not_equal, "!="),
        Function(
            "swiglu",
            2,
            lambda g, u: g * sigmoid(g) * u,
            "(mn_silu({0}) * {1})",
            vjp_swiglu,
            "silu(gate)·up",
            ("mn_silu",),
        ),
        Function(
            "where",
            3,
            lambda c, a, b: np.where(c != 0, a, b).astype(np.result_type(a, b)),
            "select({2}, {1}, {0} != 0.0)",
            vjp_where,
            "a where the condition is not 0, else b",
        ),
        Function(
            "clamp",
            3,
            clamp_numpy,
            # min(max(·)) rather than WGSL's clamp, which may return the median when low > high.
            "mn_clamp({0}, {1}, {2})",
            vjp_clamp,
            "min(max(x, low), high) (high where low > high, NaN where any is NaN, as PyTorch)",
            ("mn_clamp", "mn_minimum", "mn_maximum", "mn_isnan"),
        ),
        Function(
            "hardtanh",
            3,
            clamp_numpy,
            "mn_clamp({0}, {1}, {2})",
            vjp_hardtanh,
            "clamp's values, with PyTorch's hardtanh gradient (0 at the bounds, g where x is NaN)",
            ("mn_clamp", "mn_minimum", "mn_maximum", "mn_isnan"),
        ),
        Function(
            "elu",
            3,
            elu_numpy,
            "mn_elu({0}, {1}, {2})",
            vjp_elu,
            "x where x > 0, alpha·expm1(x·input_scale) elsewhere (x, alpha, input_scale)",
            ("mn_elu", "mn_expm1"),
        ),
    )
}

UNARY_FUNCTIONS = tuple(name for name, f in FUNCTIONS.items() if f.arity == 1)
BINARY_FUNCTIONS = tuple(name for name, f in FUNCTIONS.items() if f.arity == 2)
TERNARY_FUNCTIONS = tuple(name for name, f in FUNCTIONS.items() if f.arity == 3)
NUMPY_FUNCTIONS = {name: f.numpy for name, f in FUNCTIONS.items()}

# WGSL helper functions by name (the forms above that need an operand twice call them).
WGSL_HELPERS: dict[str, str] = {
    # x·sigmoid(x) with the sigmoid above: 0 (not NaN) for very negative x, x for very positive x.
    "mn_silu": "fn mn_silu(x: f32) -> f32 {\n    return x * (1.0 / (1.0 + exp(-x)));\n}",
    # erf in f32 to about 1 ulp (N. Juffa's minimax erff: within 6.5e-8 absolute, 1.2e-7 relative):
    # an odd polynomial for |x| < 0.9277, 1 − exp(polynomial) beyond (exp underflows to give ±1).
    "mn_erf": """fn mn_erf(x: f32) -> f32 {
    let t = abs(x);
    let s = x * x;
    if (t > 0.927734375) {
        var r = fma(fma(-1.72853470e-5, t, 3.83197126e-4), s, fma(-3.88396438e-3, t, 2.42546219e-2));
        r = fma(r, t, -1.06777877e-1);
        r = fma(r, t, -6.34846687e-1);
        r = fma(r, t, -1.28717512e-1);
        r = fma(r, t, -t);
        let e = 1.0 - exp(r);
        return select(-e, e, x >= 0.0);
    }
    var r = -5.96761703e-4;
    r = fma(r, s, 4.99119423e-3);
    r = fma(r, s, -2.67681349e-2);
    r = fma(r, s, 1.12819925e-1);
    r = fma(r, s, -3.76125336e-1);
    r = fma(r, s, 1.28379166e-1);
    return fma(r, x, x);
}""",
    # log1p(eˣ) with log1p(u) = log(1 + u)·u / ((1 + u) − 1) (exact to an ulp where 1 + u rounds),
    # so that softplus of a very negative x is eˣ, not 0.
    "mn_softplus": """fn mn_softplus(x: f32, threshold: f32) -> f32 {
    if (x > threshold) {
        return x;
    }
    let u = exp(x);
    let w = 1.0 + u;
    if (w == 1.0) {
        return u;
    }
    return log(w) * u / (w - 1.0);
}""",
    "mn_isfinite": """fn mn_isfinite(x: f32) -> f32 {
    return select(0.0, 1.0, (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u);
}""",
    "mn_first": "fn mn_first(value: f32, carrier: f32) -> f32 {\n    return value;\n}",
    "mn_leaky_relu": "fn mn_leaky_relu(x: f32, slope: f32) -> f32 {\n    return select(x * slope, x, x > 0.0);\n}",
    # NaN and ±∞ read from the bits (see isfinite above: x != x may be folded to false).
    "mn_isnan": "fn mn_isnan(x: f32) -> bool {\n    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;\n}",
    "mn_isinf": "fn mn_isinf(x: f32) -> bool {\n    return (bitcast<u32>(x) & 0x7fffffffu) == 0x7f800000u;\n}",
    "mn_relu": "fn mn_relu(x: f32) -> f32 {\n    return select(max(x, 0.0), x, mn_isnan(x));\n}",
    # Some drivers compute tanh from exp and return NaN for large |x|; tanh(±15) is ±1 in f32.
    "mn_tanh": "fn mn_tanh(x: f32) -> f32 {\n    return select(tanh(clamp(x, -15.0, 15.0)), x, mn_isnan(x));\n}",
    # a + b is NaN where either is (PyTorch's minimum and maximum propagate NaN; WGSL's drop it).
    "mn_minimum": """fn mn_minimum(a: f32, b: f32) -> f32 {
    return select(min(a, b), a + b, mn_isnan(a) || mn_isnan(b));
}""",
    "mn_maximum": """fn mn_maximum(a: f32, b: f32) -> f32 {
    return select(max(a, b), a + b, mn_isnan(a) || mn_isnan(b));
}""",
    "mn_clamp": """fn mn_clamp(x: f32, low: f32, high: f32) -> f32 {
    return mn_minimum(mn_maximum(x, low), high);
}""",
    "mn_hardsigmoid": """fn mn_hardsigmoid(x: f32) -> f32 {
    return select(min(max(x + 3.0, 0.0), 6.0) / 6.0, x, mn_isnan(x));
}""",
    # x times the hard sigmoid's numerator: NaN where x is NaN, and at −∞ (−∞·0), as PyTorch.
    "mn_hardswish": "fn mn_hardswish(x: f32) -> f32 {\n    return x * min(max(x + 3.0, 0.0), 6.0) / 6.0;\n}",
    # 2·atanh(s) = log((1 + s)/(1 − s)) with s = x/(2 + x), its odd series to s¹⁷ for |x| < 0.5
    # (s² ≤ 1/9: within an ulp or two); log(1 + x) beyond, where 1 + x keeps x's digits.
    "mn_log1p": """fn mn_log1p(x: f32) -> f32 {
    if (abs(x) < 0.5) {
        let s = x / (2.0 + x);
        let t = s * s;
        var p = fma(0.05882352941, t, 0.06666666667);
        p = fma(p, t, 0.07692307692);
        p = fma(p, t, 0.09090909091);
        p = fma(p, t, 0.11111111111);
        p = fma(p, t, 0.14285714286);
        p = fma(p, t, 0.2);
        p = fma(p, t, 0.33333333333);
        let twice = s + s;
        return fma(twice * t, p, twice);
    }
    if (x < -1.0) {
        return mn_f32_bits(0x7fc00000u);
    }
    return log(1.0 + x);
}""",
    # The Taylor series to x¹⁰/10! for |x| < 0.5 (the remainder is under 3e-10); exp(x) − 1 beyond.
    "mn_expm1": """fn mn_expm1(x: f32) -> f32 {
    if (abs(x) < 0.5) {
        var p = fma(2.755731922e-7, x, 2.755731922e-6);
        p = fma(p, x, 2.480158730e-5);
        p = fma(p, x, 1.984126984e-4);
        p = fma(p, x, 1.388888889e-3);
        p = fma(p, x, 8.333333333e-3);
        p = fma(p, x, 4.166666667e-2);
        p = fma(p, x, 1.666666667e-1);
        p = fma(p, x, 0.5);
        return fma(x * x, p, x);
    }
    return exp(x) - 1.0;
}""",
    # sin(x + quarters·π/2): r = x − j·π/2 (j the nearest integer to x·2/π) with π/2 in five parts
    # (Cody and Waite), the first four of 7 bits, so that each j·c is exact for |j| < 2¹⁷ without
    # an fma (lavapipe's fma lost digits here: 32 ulps at 10⁴ against 1.2 with these products), then
    # Cephes' sinf/cosf minimax polynomials on [−π/4, π/4], chosen and signed by (j + quarters) mod 4.
    # A few ulps for |x| ≤ 2·10⁵ (1.2 measured on lavapipe); beyond, the reduction loses digits.
    "mn_sin_quarters": """fn mn_sin_quarters(x: f32, quarters: i32) -> f32 {
    let j = round(x * 0.636619772);
    var r = x - j * 1.5625;
    r = r - j * 0.0081787109375;
    r = r - j * 0.00011730194091796875;
    r = r - j * 3.129243850708008e-07;
    r = r - j * 9.92093629470503e-10;
    let s = r * r;
    let sine = fma(s * r, fma(fma(-1.95152959e-4, s, 8.33216087e-3), s, -1.66666546e-1), r);
    let cosine = fma(fma(fma(fma(2.44331571e-5, s, -1.38873163e-3), s, 4.16666457e-2), s, -0.5), s, 1.0);
    let q = (i32(j) + quarters) & 3;
    let value = select(sine, cosine, (q & 1) == 1);
    return select(value, -value, q >= 2);
}""",
    "mn_elu": """fn mn_elu(x: f32, alpha: f32, input_scale: f32) -> f32 {
    return select(x, alpha * mn_expm1(x * input_scale), x <= 0.0);
}""",
    # C's pow (torch.pow of two tensors): WGSL's pow is defined for x > 0 only (exp2(y·log2(x))), so
    # |x|^y, then the sign of an odd integer power of a negative x (−0 too), NaN for a finite
    # negative x and a non-integer y, and pow(x, 0) = pow(1, y) = pow(−1, ±∞) = 1, NaN or not.
    "mn_pow": """fn mn_pow(x: f32, y: f32) -> f32 {
    let ax = abs(x);
    let integer = floor(y) == y;
    let half = 0.5 * y;
    let odd = integer && floor(half) != half;
    var magnitude = pow(ax, y);
    if (ax == 0.0) {
        magnitude = select(0.0, mn_f32_bits(0x7f800000u), y < 0.0);
    }
    var result = select(magnitude, -magnitude, odd && (bitcast<u32>(x) & 0x80000000u) != 0u);
    if ((x < 0.0 && !integer && !mn_isinf(x)) || mn_isnan(x) || mn_isnan(y)) {
        result = mn_f32_bits(0x7fc00000u);
    }
    if (x == 1.0 || y == 0.0 || (ax == 1.0 && mn_isinf(y))) {
        result = 1.0;
    }
    return result;
}""",
    # torch.pow(Tensor, number): its shortcuts (POW_SHORTCUTS), else C's pow; b is a literal, so a
    # compiler keeps one branch.
    "mn_pow_scalar": """fn mn_pow_scalar(x: f32, e: f32) -> f32 {
    if (e == 2.0) {
        return x * x;
    }
    if (e == 3.0) {
        return x * x * x;
    }
    if (e == 0.5) {
        return sqrt(x);
    }
    if (e == -0.5) {
        return 1.0 / sqrt(x);
    }
    if (e == -1.0) {
        return 1.0 / x;
    }
    if (e == -2.0) {
        return 1.0 / (x * x);
    }
    return mn_pow(x, e);
}""",
}
