"""Expression trees (`meganeura.ir.expr`) as WGSL, with each function's form from `ir/functions.py`.

Every kernel that computes elementwise values goes through `expr_to_wgsl`: the elementwise ops
(a one-call tree), `pointwise`, `fused_matmul`'s prologue and epilogue, `fused_reduce`'s and
`conv_gemm`'s. The kernel says how to read each `$` value (`value_of("0")` → `x0[i]`,
`value_of("acc")` → `x`), literals become f32 literals, and functions expand by their `wgsl` form.

A form reads each operand once, so that nested trees stay linear in size: functions that need an
operand twice (silu, swiglu, erf) call a helper WGSL function, whose definition
`helper_functions` returns for the kernel's module scope.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np

from meganeura.ir.expr import Expr, functions_used
from meganeura.ir.functions import FUNCTIONS, WGSL_HELPERS

# NaN and the infinities have no WGSL literal, and WGSL makes a constant expression that evaluates
# to one a shader-creation error: Tint (Dawn's and Chrome's compiler) rejects
# `bitcast<f32>(0x7fc00000u)`, naga lets it through. A `let` is evaluated at run time, so the bits
# pass through one in a helper that `render` declares in every module that calls it.
F32_BITS = "mn_f32_bits"
F32_BITS_HELPER = f"fn {F32_BITS}(bits: u32) -> f32 {{\n    let runtime = bits;\n    return bitcast<f32>(runtime);\n}}"


def literal(value: float | int, dtype: str = "f32") -> str:
    """`value` as a WGSL literal of `dtype`, parenthesised so it can stand anywhere in an expression
    (NaN and ±inf as a call of the F32_BITS helper)."""
    if dtype == "i32":
        return f"({int(value)}i)"
    single = np.float32(value)
    if math.isnan(single) or math.isinf(single):
        return f"{F32_BITS}(0x{single.view(np.uint32):08x}u)"
    return f"({str(single)}f)"  # the shortest text that rounds to this f32, e.g. 1e-05, 0.1


def expr_to_wgsl(tree: Expr, value_of: Callable[[str], str]) -> str:
    """The WGSL f32 expression of `tree`; `value_of(name)` is the WGSL text of `$name`."""
    if isinstance(tree, float | int):
        return literal(tree)
    head = tree[0]
    if head == "$":
        return value_of(tree[1])
    function = FUNCTIONS.get(head)
    if function is None:
        raise ValueError(f"no WGSL form for function {head!r}")
    return function.wgsl.format(*(expr_to_wgsl(arg, value_of) for arg in tree[1:]))


def helper_functions(trees: Iterable[Expr], also: Iterable[str] = ()) -> str:
    """The WGSL definitions of the helpers that `trees` call and of the functions named in `also`
    (a kernel's own use of one, e.g. the max reduction's combine; empty text when none)."""
    used: set[str] = set(also)
    for tree in trees:
        used |= functions_used(tree)
    helpers = sorted({helper for name in used for helper in FUNCTIONS[name].helpers})
    return "\n\n".join(WGSL_HELPERS[name] for name in helpers)
