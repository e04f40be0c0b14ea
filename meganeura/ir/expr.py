"""Elementwise expressions: the bodies of fused kernels, as small text programs.

A fused kernel (`pointwise`, `fused_matmul`'s epilogue, `fused_reduce`'s prologue/epilogue)
carries an expression in prefix form over numbered inputs and a few named values:

    relu(add($acc,$0))          # matmul accumulator plus input 0, then relu
    mul(sub($0,$1),0.5)         # inputs 0 and 1, a literal
    rsqrt(add(mul($r,0.25),1e-05))

`$0`, `$1`… are the kernel's extra inputs (broadcast to the kernel's shape), `$acc` is a
matmul's accumulator, `$r` a reduction's result. Functions are the elementwise ops of the op
table. The text is the IR attribute, so it prints, diffs and hashes as is.

>>> parse("relu(add($acc,$0))")
('relu', ('add', ('$', 'acc'), ('$', '0')))
>>> evaluate("mul($0,2.0)", {"0": np.array([1.0, 2.0])})
array([2., 4.])
"""

from __future__ import annotations

import math
import re

import numpy as np

Expr = tuple | float  # ("fn", arg...) | ("$", name) | a float literal

UNARY_FUNCTIONS = ("neg", "exp", "log", "sqrt", "rsqrt", "relu", "sigmoid", "tanh", "silu", "erf")
BINARY_FUNCTIONS = ("add", "sub", "mul", "div", "greater", "equal", "swiglu")

_TOKEN = re.compile(r"\s*(?:(\$[A-Za-z0-9_]+)|([A-Za-z_][A-Za-z0-9_]*)|([-+0-9.eE]+|nan|inf)|(.))")


class ExprError(ValueError):
    """An expression that does not parse or names an unknown function."""


def tokens(text: str) -> list[str]:
    result = []
    for match in _TOKEN.finditer(text):
        token = next(group for group in match.groups() if group is not None)
        result.append(token)
    return result


def parse(text: str) -> Expr:
    """The expression tree of `text` (raises ExprError on malformed input)."""
    items = tokens(text)
    tree, position = _parse_at(items, 0, text)
    if position != len(items):
        raise ExprError(f"unexpected {''.join(items[position:])!r} at the end of {text!r}")
    return tree


def _parse_at(items: list[str], position: int, text: str) -> tuple[Expr, int]:
    if position >= len(items):
        raise ExprError(f"expression {text!r} ends too early")
    token = items[position]
    if token.startswith("$"):
        return ("$", token[1:]), position + 1
    if token in UNARY_FUNCTIONS or token in BINARY_FUNCTIONS:
        arity = 1 if token in UNARY_FUNCTIONS else 2
        if position + 1 >= len(items) or items[position + 1] != "(":
            raise ExprError(f"{token} needs '(' in {text!r}")
        args, position = [], position + 2
        for index in range(arity):
            arg, position = _parse_at(items, position, text)
            args.append(arg)
            expected = "," if index < arity - 1 else ")"
            if position >= len(items) or items[position] != expected:
                raise ExprError(f"expected {expected!r} in {token}(...) of {text!r}")
            position += 1
        return (token, *args), position
    try:
        return float(token), position + 1
    except ValueError:
        raise ExprError(f"unknown name {token!r} in {text!r}") from None


def format_expr(tree: Expr) -> str:
    """The canonical text of an expression tree (the inverse of `parse`)."""
    if isinstance(tree, float):
        return repr(float(tree))
    if tree[0] == "$":
        return f"${tree[1]}"
    return f"{tree[0]}({','.join(format_expr(arg) for arg in tree[1:])})"


def variables(tree: Expr) -> set[str]:
    """The names of the `$` values an expression reads."""
    if isinstance(tree, float):
        return set()
    if tree[0] == "$":
        return {tree[1]}
    names: set[str] = set()
    for arg in tree[1:]:
        names |= variables(arg)
    return names


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


# The error function in double precision (math.erf, a few ulps): the oracle the WGSL kernel's
# polynomial approximation is tested against, so it must not share that approximation.
_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return _erf(x).astype(x.dtype if x.dtype.kind == "f" else np.float64, copy=False)


NUMPY_FUNCTIONS = {
    "neg": np.negative,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": sigmoid,
    "tanh": np.tanh,
    "silu": lambda x: x * sigmoid(x),
    "erf": erf,
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    # Masks come back in the operands' float type (1.0 / 0.0).
    "greater": lambda a, b: np.greater(a, b).astype(np.result_type(a, b)),
    "equal": lambda a, b: np.equal(a, b).astype(np.result_type(a, b)),
    "swiglu": lambda g, u: g * sigmoid(g) * u,
}


def evaluate(text_or_tree: str | Expr, values: dict[str, np.ndarray], dtype=None) -> np.ndarray:
    """Evaluate an expression with numpy; `values` maps `$` names ("0", "acc", "r") to arrays."""
    tree = parse(text_or_tree) if isinstance(text_or_tree, str) else text_or_tree
    return np.asarray(_evaluate(tree, values, dtype))


def _evaluate(tree: Expr, values: dict[str, np.ndarray], dtype):
    if isinstance(tree, float):
        return np.asarray(tree, dtype=dtype or np.float32)
    if tree[0] == "$":
        try:
            return values[tree[1]]
        except KeyError:
            raise ExprError(f"no value for ${tree[1]}") from None
    args = [_evaluate(arg, values, dtype) for arg in tree[1:]]
    return NUMPY_FUNCTIONS[tree[0]](*args)
