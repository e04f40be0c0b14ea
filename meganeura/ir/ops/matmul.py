"""Matmul over the last two dims, and `fused_matmul`, the matmul kernel with a prologue and an
epilogue that the e-graph makes (rewrite/matmul.py).

Both operands have the same leading (batch) dims, or one of them is 2-D and shared by every
matrix of the other (a Linear applied to [batch, seq, features] is one matmul); transpose flags
swap the last two dims of an operand, so that autodiff and the algebra rules express Aᵀ·B and
A·Bᵀ without copies.

`fused_matmul(a, b, extras…)`: epilogue(prologue(A, extras…) · B, extras…). The prologue reads
`$a`, the element of A as stored (before any transpose), and extras broadcast to A's stored
shape; it is applied while A is loaded, so its result is never written. The epilogue reads
`$acc`, the dot product, and extras broadcast to the output. Both number the extras
(inputs[2:]) the same way, `$0`, `$1`…; an extra that only the prologue reads need not broadcast
to the output. With `flatten_a`, A (after the prologue) is read as the matrix [rows, K] of its
row-major flattening (a prologue over a [batch, seq, features] tensor feeding a Linear).

`fused_matmul(…, splits=S)` with S > 1 is the product split along K (split-K): the reduction is
cut into S consecutive parts of ⌈K/S⌉ (the last may be shorter, none empty) and the result is
the S partial products [S, *batch, M, N], which a sum over axis 0 completes (rewrite/matmul.py
`matmul_split_k`: a small output over a long reduction launches too few workgroups to fill the
GPU; S times as many do). A split product has no epilogue: it applies to the sum, not to a part.

`fused_matmul(…, causal_rows=P)` with P > 0 promises that op(A)[r, k] is zero for k > r mod P (the
rows of A are queries, P of them a period, its columns keys, under a top-left causal mask: the
scores' gradient that dQ is computed from, passes/attention_scores.py). The product is the same;
the kernel skips the K tiles past a row tile's last nonzero column, and the numpy semantics check
the promise (an A that breaks it raises).
"""

from __future__ import annotations

import math

import numpy as np

from meganeura.ir.expr import check_expr, variables
from meganeura.ir.expr import evaluate as evaluate_expr
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, EXPR, INT, Attr, Op, ShapeError, broadcasts_to, require_float
from meganeura.ir.ops.reduce import check_splits, split_length

# The parts of K of a split product (`splits`) are ⌈K/S⌉ long, rounded up to a multiple of
# PART_ALIGN where that leaves no part empty: the matmul kernel walks K in tiles of 16 (BK,
# codegen/gemm_table.py), and a part that ends inside a tile takes its guarded ragged-K path.
# On the H200 (2026-12-02, `python -m meganeura bench smollm2 --no-torch`, one profiled step with
# PART_ALIGN 1 and 16): the weight gradients over 2048 tokens in 3 parts (683 → 688) and 6 (342
# → 352) 16.9 → 15.6 ms a step, GPU time 92.1 → 90.8 ms; the tied head's input gradient
# (2048x49152x576) had run 5.68 ms in 11 parts of 4469 against 3.26 in 8 of 6144.
PART_ALIGN = 16


def part_length(k: int, splits: int) -> int:
    """The elements of K in each part of a product split into `splits` (the last may be shorter):
    2048 in 3 parts: 688, 688, 672. Where ⌈K/S⌉ leaves no part empty (`check_splits`), so does
    this: it rounds up only where the last part keeps an element, else it is ⌈K/S⌉."""
    even = split_length(k, splits)
    aligned = -(-even // PART_ALIGN) * PART_ALIGN
    return aligned if splits > 1 and (splits - 1) * aligned < k else even


FAMILY = "matmul"


def matmul_dims(types, attrs, op="matmul") -> tuple[tuple[int, ...], int, int, int]:
    """(batch dims, M, K, N) of a (possibly transposed) matmul, checking that the operands fit."""
    a, b = types[0], types[1]
    require_float([a, b], op)
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"{op}: expected operands of rank >= 2, got {a} and {b}")
    if a.rank > 2 and b.rank > 2 and a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"{op}: batch dimensions differ: {a} and {b}")
    ta, tb = attrs.get("transpose_a"), attrs.get("transpose_b")
    m, k = (a.shape[-1], a.shape[-2]) if ta else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if tb else b.shape[-2:]
    if k != k2:
        raise ShapeError(
            f"{op}: inner dimensions differ: {a}{'ᵀ' if ta else ''} @ {b}{'ᵀ' if tb else ''} ({k} vs {k2})"
        )
    return a.shape[:-2] or b.shape[:-2], m, k, n


def matmul_a_view(a: TensorType, attrs) -> TensorType:
    """A as the product sees it: with `flatten_a`, the stored A [..., K] read as the matrix
    [rows, K] of its row-major flattening."""
    if attrs.get("flatten_a"):
        rows = 1
        for d in a.shape[:-1]:
            rows *= d
        return TensorType((rows, a.shape[-1]), a.dtype)
    return a


def infer_matmul(types, attrs) -> TensorType:
    batch, m, _, n = matmul_dims(types, attrs)
    return TensorType((*batch, m, n), "f32")


def evaluate_matmul(a, b, transpose_a=False, transpose_b=False):
    a = np.swapaxes(a, -1, -2) if transpose_a else a
    b = np.swapaxes(b, -1, -2) if transpose_b else b
    return a @ b


def matmul_flops(operands, results, attrs) -> int:
    """2·K per element of the product: 2·(batch·M·N)·K, also where a 2-D operand is shared by a
    batch, and where the product is split into partials (the same work in S parts); for a causal
    product (`causal_rows`), 2 per nonzero element of op(A) and column of the result."""
    batch, m, k, n = matmul_dims([matmul_a_view(operands[0], attrs), operands[1]], attrs)
    period = attrs.get("causal_rows", 0)
    if period:
        return 2 * math.prod(batch) * n * causal_terms(m, k, period)
    return 2 * results[0].numel // attrs.get("splits", 1) * k


def causal_terms(m: int, k: int, period: int) -> int:
    """The elements of an [m, k] matrix whose row r is zero past column r mod `period`:
    Σ_r min(k, r mod period + 1)."""

    def first(rows: int) -> int:  # Σ_{q < rows} min(k, q + 1)
        under = min(rows, k)
        return under * (under + 1) // 2 + (rows - under) * k

    return m // period * first(period) + first(m % period)


def causal_mask(m: int, k: int, period: int) -> np.ndarray:
    """[m, k]: True where a causal product's op(A) may be nonzero (k ≤ r mod period)."""
    return np.arange(k)[None, :] <= (np.arange(m) % period)[:, None]


def describe_matmul(node) -> str:
    flags = [name for name in ("transpose_a", "transpose_b") if node.attr(name)]
    return " ".join(flags)


TRANSPOSES = (Attr("transpose_a", BOOL, False), Attr("transpose_b", BOOL, False))

MATMUL = Op(
    "matmul",
    family=FAMILY,
    infer=infer_matmul,
    evaluate=evaluate_matmul,
    operands=("a", "b"),
    attrs=TRANSPOSES,
    flops=matmul_flops,
    describe=describe_matmul,
    doc="op(a)·op(b) over the last two dims (op: the transpose where the flag says so)",
)


def flat_rows(shape: tuple[int, ...]) -> int:
    """The number of rows of `shape` seen as a 2-D matrix [rows, last dim]."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows


@MATMUL.vjp
def _matmul(b, node, g):
    """Gradients of C = op(A)·op(B) as matmuls with transposed operands (no transpose copies).

    A 2-D operand shared by a batched one gets the batch summed: for a weight W of
    x [batch, seq, in] · W, dW is one matmul over the flattened rows of x and g.
    """
    a, w = node.inputs
    ta, tb = node.attr("transpose_a"), node.attr("transpose_b")
    if ta:  # dA = g·op(B)ᵀ (transposed back if A was used transposed); dB likewise.
        grad_a = b.emit("matmul", [w, g], transpose_a=tb, transpose_b=True)
    else:
        grad_a = b.emit("matmul", [g, w], transpose_a=False, transpose_b=not tb)
    shared_b = len(b.shape(w)) == 2 and len(b.shape(a)) > 2
    if shared_b and not ta:
        rows = b.emit("reshape", [a], shape=(flat_rows(b.shape(a)), b.shape(a)[-1]))
        grads = b.emit("reshape", [g], shape=(flat_rows(b.shape(g)), b.shape(g)[-1]))
        if tb:
            grad_b = b.emit("matmul", [grads, rows], transpose_a=True, transpose_b=False)
        else:
            grad_b = b.emit("matmul", [rows, grads], transpose_a=True, transpose_b=False)
    elif tb:
        grad_b = b.emit("matmul", [g, a], transpose_a=True, transpose_b=ta)
    else:
        grad_b = b.emit("matmul", [a, g], transpose_a=not ta, transpose_b=False)
    return [b.unbroadcast(grad_a, b.shape(a)), b.unbroadcast(grad_b, b.shape(w))]


def infer_fused_matmul(types, attrs) -> TensorType:
    if len(types) < 2:
        raise ShapeError(f"fused_matmul: expected at least two operands (a, b), got {len(types)}")
    batch, m, k, n = matmul_dims([matmul_a_view(types[0], attrs), *types[1:2]], attrs, "fused_matmul")
    splits = check_splits(k, attrs.get("splits", 1), "fused_matmul")
    if splits > 1 and attrs["epilogue"] != "$acc":
        raise ShapeError(
            f"fused_matmul: a product split into {splits} partials has no epilogue, got {attrs['epilogue']}"
        )
    out = TensorType((*batch, m, n), "f32")
    extras = types[2:]
    names = set(map(str, range(len(extras))))
    check_expr("fused_matmul", attrs["prologue"], {"a", *names})
    check_expr("fused_matmul", attrs["epilogue"], {"acc", *names})
    in_prologue = variables(parse_expr(attrs["prologue"]))
    in_epilogue = variables(parse_expr(attrs["epilogue"]))
    for index, extra in enumerate(extras):
        name = str(index)
        if name in in_prologue and not broadcasts_to(extra.shape, types[0].shape):
            raise ShapeError(f"fused_matmul: prologue input ${index} {extra} does not broadcast to A {types[0]}")
        if (name in in_epilogue or name not in in_prologue) and not broadcasts_to(extra.shape, out.shape):
            raise ShapeError(f"fused_matmul: epilogue input ${index} {extra} does not broadcast to {out}")
    if attrs.get("causal_rows", 0) < 0:
        raise ShapeError(f"fused_matmul: causal_rows is a period of rows, got {attrs['causal_rows']}")
    return TensorType((splits, *out.shape), "f32") if splits > 1 else out


def evaluate_fused_matmul(
    a, b, *extras, transpose_a, transpose_b, epilogue, prologue, flatten_a, splits=1, causal_rows=0
):
    """epilogue(prologue(A, extras…) · B, extras…), as one kernel computes it (module docstring);
    with `splits`, the partial products over consecutive parts of K, stacked; with `causal_rows`,
    the same after checking that A keeps the promise."""
    if prologue != "$a":
        values = {"a": a, **{str(i): x for i, x in enumerate(extras)}}
        a = np.broadcast_to(evaluate_expr(prologue, values, a.dtype), a.shape)
    if flatten_a:
        a = a.reshape(-1, a.shape[-1])
    if causal_rows:
        op_a = np.swapaxes(a, -1, -2) if transpose_a else a
        if np.any(op_a[..., ~causal_mask(*op_a.shape[-2:], causal_rows)]):
            raise ValueError(f"fused_matmul: op(A) is not zero past column r mod {causal_rows} of each row r")
    if splits > 1:
        a = np.swapaxes(a, -1, -2) if transpose_a else a
        b = np.swapaxes(b, -1, -2) if transpose_b else b
        length = part_length(a.shape[-1], splits)
        parts = [
            a[..., s * length : (s + 1) * length] @ b[..., s * length : (s + 1) * length, :] for s in range(splits)
        ]
        return np.stack(parts)
    acc = evaluate_matmul(a, b, transpose_a, transpose_b)
    values = {"acc": acc, **{str(i): x for i, x in enumerate(extras)}}
    return np.broadcast_to(evaluate_expr(epilogue, values, acc.dtype), acc.shape)


def describe_fused_matmul(node) -> str:
    prologue = f"prologue {node.attr('prologue')}, " if node.attr("prologue") != "$a" else ""
    flags = describe_matmul(node)
    splits = f" in {node.attr('splits')} parts of K" if node.attr("splits") != 1 else ""
    causal = f" causal rows of {node.attr('causal_rows')}" if node.attr("causal_rows") else ""
    return f"{prologue}epilogue {node.attr('epilogue')}" + (f" {flags}" if flags else "") + splits + causal


FUSED_MATMUL = Op(
    "fused_matmul",
    family=FAMILY,
    infer=infer_fused_matmul,
    evaluate=evaluate_fused_matmul,
    operands=("a", "b", "*extras"),
    attrs=(
        *TRANSPOSES,
        Attr("epilogue", EXPR, "$acc"),
        Attr("prologue", EXPR, "$a"),
        Attr("flatten_a", BOOL, False),
        Attr("splits", INT, 1),
        Attr("causal_rows", INT, 0),
    ),
    egraph=None,
    flops=matmul_flops,
    describe=describe_fused_matmul,
    doc="a matmul kernel with a prologue on A's load and an epilogue on the result (or split-K partials)",
)
