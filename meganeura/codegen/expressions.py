"""Expression trees (`meganeura.ir.expr`) as WGSL: the one place that knows each function's WGSL form.

Every kernel that computes elementwise values goes through `expr_to_wgsl`: the unary and binary
ops (a one-call tree), `pointwise`, `fused_matmul`'s epilogue and `fused_reduce`'s prologue and
epilogue. The kernel says how to read each `$` value (`value_of("0")` → `x0[i]`, `value_of("acc")`
→ `x`), literals become f32 literals, and functions expand by UNARY_WGSL / BINARY_WGSL.

A form may read its argument only once, so that nested trees stay linear in size: functions that
need an argument twice (silu, swiglu) call a helper WGSL function, whose definition
`helper_functions` returns for the kernel's module scope.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from meganeura.ir.expr import BINARY_FUNCTIONS, UNARY_FUNCTIONS, Expr

UNARY_WGSL: dict[str, str] = {
    "neg": "(-{x})",
    "exp": "exp({x})",
    "log": "log({x})",
    "sqrt": "sqrt({x})",
    "rsqrt": "inverseSqrt({x})",
    "relu": "max({x}, 0.0)",
    # exp(-x) overflows to inf for very negative x, and 1/(1+inf) is the right limit, 0.
    "sigmoid": "(1.0 / (1.0 + exp(-({x}))))",
    # Some drivers compute tanh from exp and return NaN for large |x|; tanh(±15) is ±1 in f32.
    "tanh": "tanh(clamp({x}, -15.0, 15.0))",
    "silu": "mn_silu({x})",
    "erf": "mn_erf({x})",
}

BINARY_WGSL: dict[str, str] = {
    "add": "({a} + {b})",
    "sub": "({a} - {b})",
    "mul": "({a} * {b})",
    "div": "({a} / {b})",
    "greater": "select(0.0, 1.0, {a} > {b})",
    "equal": "select(0.0, 1.0, {a} == {b})",
    "swiglu": "(mn_silu({a}) * {b})",
}

# Helper functions by name, and the forms that call them.
HELPERS: dict[str, str] = {
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
}
USES_HELPER: dict[str, str] = {"silu": "mn_silu", "swiglu": "mn_silu", "erf": "mn_erf"}

assert set(UNARY_WGSL) == set(UNARY_FUNCTIONS) and set(BINARY_WGSL) == set(BINARY_FUNCTIONS)


def literal(value: float | int, dtype: str = "f32") -> str:
    """`value` as a WGSL literal of `dtype`, parenthesised so it can stand anywhere in an expression."""
    if dtype == "i32":
        return f"({int(value)}i)"
    single = np.float32(value)
    if math.isnan(single):
        return "bitcast<f32>(0x7fc00000u)"
    if math.isinf(single):
        return "bitcast<f32>(0x7f800000u)" if single > 0 else "bitcast<f32>(0xff800000u)"
    return f"({str(single)}f)"  # the shortest text that rounds to this f32, e.g. 1e-05, 0.1


def expr_to_wgsl(tree: Expr, value_of: Callable[[str], str]) -> str:
    """The WGSL f32 expression of `tree`; `value_of(name)` is the WGSL text of `$name`."""
    if isinstance(tree, float | int):
        return literal(tree)
    head = tree[0]
    if head == "$":
        return value_of(tree[1])
    args = [expr_to_wgsl(arg, value_of) for arg in tree[1:]]
    if head in UNARY_WGSL:
        return UNARY_WGSL[head].format(x=args[0])
    if head in BINARY_WGSL:
        return BINARY_WGSL[head].format(a=args[0], b=args[1])
    raise ValueError(f"no WGSL form for function {head!r}")


def functions_used(tree: Expr) -> set[str]:
    """The function names a tree calls."""
    if isinstance(tree, float | int) or tree[0] == "$":
        return set()
    names = {tree[0]}
    for arg in tree[1:]:
        names |= functions_used(arg)
    return names


def helper_functions(trees: Iterable[Expr]) -> str:
    """The WGSL definitions of the helpers that `trees` call (empty text when none)."""
    used: set[str] = set()
    for tree in trees:
        used |= functions_used(tree)
    helpers = sorted({USES_HELPER[name] for name in used if name in USES_HELPER})
    return "\n\n".join(HELPERS[name] for name in helpers)
