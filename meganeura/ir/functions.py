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


def vjp_relu(b, xs, y, g):
    # The mask reads relu's output (y > 0 exactly where x > 0), not its input, so that the
    # forward matmul that produced x can take relu into its epilogue without x being kept.
    return [mul(b, g, b.emit("greater", [y, b.const(0.0)]))]


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
    x, low, high = xs  # PyTorch's clamp_backward: x where low ≤ x ≤ high, low where x < low, high where x > high
    inside = mul(b, b.emit("greater_equal", [x, low]), b.emit("less_equal", [x, high]))
    below, above = b.emit("less", [x, low]), b.emit("greater", [x, high])
    return [mul(b, g, inside), mul(b, g, below), mul(b, g, above)]


def no_gradient(b, xs, y, g):
    return [None] * len(xs)


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
        unary("relu", lambda x: np.maximum(x, 0), "max({0}, 0.0)", vjp_relu, "max(x, 0)"),
        # exp(-x) overflows to inf for very negative x, and 1/(1+inf) is the right limit, 0.
        unary("sigmoid", sigmoid, "(1.0 / (1.0 + exp(-({0}))))", vjp_sigmoid, "1 / (1 + e⁻ˣ)"),
        # Some drivers compute tanh from exp and return NaN for large |x|; tanh(±15) is ±1 in f32.
        unary("tanh", np.tanh, "tanh(clamp({0}, -15.0, 15.0))", vjp_tanh, "the hyperbolic tangent"),
        unary("silu", lambda x: x * sigmoid(x), "mn_silu({0})", vjp_silu, "x·sigmoid(x) (swish)", ("mn_silu",)),
        unary("erf", erf, "mn_erf({0})", vjp_erf, "the error function 2/√π ∫₀ˣ exp(−t²) dt", ("mn_erf",)),
        unary("abs", np.abs, "abs({0})", vjp_abs, "|x| (gradient sign(x), 0 at 0)"),
        # Read from the bits, not as x == x or x - x == 0: WGSL lets a compiler assume that no
        # value is NaN or infinite, and such a test may then be folded to true.
        unary(
            "isfinite",
            lambda x: mask(np.isfinite(x), (x,)),
            "mn_isfinite({0})",
            no_gradient,
            "1.0 where x is neither NaN nor ±∞, else 0.0 (compile(check_finite=True))",
            ("mn_isfinite",),
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
            lambda x, low, high: np.minimum(np.maximum(x, low), high),
            # min(max(·)) rather than WGSL's clamp, which may return the median when low > high.
            "min(max({0}, {1}), {2})",
            vjp_clamp,
            "min(max(x, low), high) (high where low > high, as PyTorch)",
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
    "mn_leaky_relu": "fn mn_leaky_relu(x: f32, slope: f32) -> f32 {\n    return select(x * slope, x, x > 0.0);\n}",
}
