"""Elementwise expressions: the bodies of fused kernels, as small text programs.

A fused kernel (`pointwise`, `fused_matmul`'s epilogue, `fused_reduce`'s prologue/epilogue)
carries an expression in prefix form over numbered inputs and a few named values:

    relu(add($acc,$0))          # matmul accumulator plus input 0, then relu
    mul(sub($0,$1),0.5)         # inputs 0 and 1, a literal
    rsqrt(add(mul($r,0.25),1e-05))

`$0`, `$1`… are the kernel's extra inputs (broadcast to the kernel's shape), `$acc` is a
matmul's accumulator, `$r` a reduction's result, `$a` the element of a matmul's A operand in a
prologue. Functions are the elementwise functions of `ir/functions.py` (unary, binary and
ternary). The text is the IR attribute, so it prints, diffs and hashes as is.

>>> parse("relu(add($acc,$0))")
('relu', ('add', ('$', 'acc'), ('$', '0')))
>>> evaluate("mul($0,2.0)", {"0": np.array([1.0, 2.0])})
array([2., 4.])
"""

from __future__ import annotations

import re

import numpy as np

from meganeura.ir.functions import FUNCTIONS
from meganeura.ir.op import ShapeError

Expr = tuple | float  # ("fn", arg...) | ("$", name) | a float literal

# A number: a signed inf or nan first (format_expr writes clamp's missing bound as -inf), then digits.
_TOKEN = re.compile(r"\s*(?:(\$[A-Za-z0-9_]+)|([A-Za-z_][A-Za-z0-9_]*)|([-+]?(?:inf|nan)|[-+0-9.eE]+)|(.))")


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
    function = FUNCTIONS.get(token)
    if function is not None:
        if position + 1 >= len(items) or items[position + 1] != "(":
            raise ExprError(f"{token} needs '(' in {text!r}")
        args, position = [], position + 2
        for index in range(function.arity):
            arg, position = _parse_at(items, position, text)
            args.append(arg)
            expected = "," if index < function.arity - 1 else ")"
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


def renamed(tree: Expr, names: dict[str, str]) -> Expr:
    """`tree` with each `$` value named in `names` read under its new name.

    >>> format_expr(renamed(parse("add($1,$r)"), {"1": "0", "r": "acc"}))
    'add($0,$acc)'
    """
    if isinstance(tree, float):
        return tree
    if tree[0] == "$":
        return ("$", names.get(tree[1], tree[1]))
    return (tree[0], *(renamed(arg, names) for arg in tree[1:]))


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


def functions_used(tree: Expr) -> set[str]:
    """The function names a tree calls."""
    if isinstance(tree, float) or tree[0] == "$":
        return set()
    names = {tree[0]}
    for arg in tree[1:]:
        names |= functions_used(arg)
    return names


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
    return FUNCTIONS[tree[0]].numpy(*args)


def check_expr(op: str, text: str, allowed: set[str]) -> None:
    """Raise a ShapeError if expression `text` does not parse or reads a value not in `allowed`."""
    try:
        names = variables(parse(text))
    except ValueError as error:
        raise ShapeError(f"{op}: {error}") from None
    unknown = names - allowed
    if unknown:
        raise ShapeError(f"{op}: expression {text!r} reads ${', $'.join(sorted(unknown))}, which it is not given")
