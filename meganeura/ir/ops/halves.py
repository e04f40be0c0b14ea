"""Products on the tensor cores from operands split once: `split_halves` and `split_matmul`.

WGSL reaches the tensor cores only with f16 operands. A float32 x is held as s·(hi + lo): s a
power of two that puts the tensor's largest |x| in [2^13, 2^14) (f16's range ends at 65504), hi
the scaled x with its mantissa cut to f16's 10 bits, lo the rest rounded to f16; hi + lo keep
21-22 of x's 24 significant bits, and a product is (Ah·Bh + Ah·Bl + Al·Bh)/(sa·sb), three f16
products with f32 accumulation (Al·Bl, about 2^-22 of |a||b|, dropped). Splitting the operands
inside the product kernel, once per workgroup that reads them, cost more than the products (a
kernel that did so was measured and removed: docs/performance-log.md); here each operand is split
once, by a kernel of its own, into the layout the product reads, and every product of it reads
the halves.

`split_halves(x, top, transpose, rows_to, cols_to)`: x seen as the matrix X [rows, last dim] of
its row-major flattening, or Xᵀ with `transpose`, split into halves, padded with zeros to
multiples of `rows_to` × `cols_to` (the product's tiles then need no bounds checks). `top` holds
partial maxima of |x| (any shape): the scale comes from their largest. The result is int32
[2, Rp, Cp / 2]: plane 0 the hi halves, plane 1 the lo halves, each row-major [Rp, Cp] f16 packed
two to a word (the even column in the low 16 bits), which the product kernel reads as f16.

`split_matmul(a, a_top, b, b_top, extras…, m, k, n, shape, epilogue, splits)`: the product
A [m, k] · B [k, n] of split operands (A's halves [Mp, Kp], B's [Kp, Np], the tops their
`split_halves` read), scaled back, through the epilogue (`$acc`, the extras `$0…` broadcast to
`shape`, the result's); with `splits` S > 1 the partial products over S consecutive parts of K
of whole tiles (SPLIT_ALIGN), [S, *shape], which a sum completes (no epilogue then).

`multi_top(tensors…, parts)` and `multi_split_halves(x, top, x, top…, transposes, rows_to,
cols_to)` are the maxima and the splits of several tensors in one kernel each, a result per member
(the weights' splits, all ready when the step starts, in a few dispatches instead of three a weight).

All are made after extraction by passes/operand_splits.py, only for a target with tensor cores, so
they have no VJP and no e-graph form.
"""

from __future__ import annotations

import math

import numpy as np

from meganeura.ir.expr import check_expr
from meganeura.ir.expr import evaluate as evaluate_expr
from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, EXPR, INT, INTS, Attr, Op, ShapeError, broadcasts_to, require_float
from meganeura.ir.ops.reduce import split_length

FAMILY = "matmul"
TOP_EXPONENT = 13  # a tensor's largest |x| is scaled into [2^13, 2^14): twice that still fits f16
SPLIT_ALIGN = 32  # the product kernel's K tile: a part of K is whole tiles


def ceil_to(x: int, step: int) -> int:
    return -(-x // step) * step


def halves_shape(x: TensorType, transpose: bool, rows_to: int, cols_to: int) -> tuple[int, int, int, int]:
    """(rows, cols, padded rows, padded cols) of the matrix `split_halves` splits out of x."""
    rows, cols = math.prod(x.shape[:-1]), x.shape[-1]
    if transpose:
        rows, cols = cols, rows
    return rows, cols, ceil_to(rows, rows_to), ceil_to(cols, cols_to)


def infer_split_halves(types, attrs) -> TensorType:
    x, top = types
    require_float([x, top], "split_halves")
    if x.rank < 1 or top.numel < 1:
        raise ShapeError(f"split_halves: expected a tensor and its partial maxima, got {x} and {top}")
    if attrs["rows_to"] < 1 or attrs["cols_to"] < 2 or attrs["cols_to"] % 2:
        raise ShapeError(f"split_halves: rows_to ≥ 1 and an even cols_to, got {attrs['rows_to']}, {attrs['cols_to']}")
    _, _, rows, cols = halves_shape(x, attrs["transpose"], attrs["rows_to"], attrs["cols_to"])
    return TensorType((2, rows, cols // 2), "i32")


def scale_exponent(top: np.ndarray) -> int:
    """e of the scale 2^e that puts the largest of |top| in [2^TOP_EXPONENT, 2^(TOP_EXPONENT + 1));
    0 where it is 0 (what the kernels compute with frexp)."""
    largest = float(np.max(np.abs(top)))
    if largest == 0.0 or not math.isfinite(largest):
        return 0
    return int(np.clip(TOP_EXPONENT + 1 - math.frexp(largest)[1], -126, 126))


def high_half(v: np.ndarray) -> np.ndarray:
    """v (f32) with its mantissa cut to f16's 10 bits."""
    return (np.ascontiguousarray(v, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def evaluate_split_halves(x, top, transpose, rows_to, cols_to):
    rows, cols, rows_p, cols_p = halves_shape(TensorType(x.shape), transpose, rows_to, cols_to)
    matrix = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
    matrix = matrix.T if transpose else matrix
    scaled = (matrix * np.float32(2.0 ** scale_exponent(top))).astype(np.float32)
    hi = high_half(scaled)
    planes = np.zeros((2, rows_p, cols_p), np.float16)
    planes[0, :rows, :cols] = hi.astype(np.float16)
    planes[1, :rows, :cols] = (scaled - hi).astype(np.float16)
    return planes.view(np.int32)


def unpacked(halves: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hi, lo) as float64 [Rp, Cp] from `split_halves`' packed planes."""
    planes = np.ascontiguousarray(halves).view(np.float16).astype(np.float64)
    return planes[0], planes[1]


def split_part(k: int, splits: int) -> int:
    """The elements of K in each part of a split product: ⌈K/S⌉ in whole tiles of SPLIT_ALIGN."""
    return ceil_to(split_length(k, splits), SPLIT_ALIGN)


def infer_split_matmul(types, attrs) -> TensorType:
    a, a_top, b, b_top, *extras = types
    m, k, n, splits = attrs["m"], attrs["k"], attrs["n"], attrs["splits"]
    if a.dtype != "i32" or b.dtype != "i32" or a.rank != 3 or b.rank != 3:
        raise ShapeError(f"split_matmul: expected the int32 halves of split_halves, got {a} and {b}")
    if a.shape[1] < m or 2 * a.shape[2] < k or b.shape[1] != 2 * a.shape[2] or 2 * b.shape[2] < n:
        raise ShapeError(f"split_matmul: halves {a} and {b} do not hold a {m}x{k} by {k}x{n} product")
    require_float([a_top, b_top, *extras], "split_matmul")
    shape = tuple(attrs["shape"])
    if math.prod(shape) != m * n or shape[-1] != n:
        raise ShapeError(f"split_matmul: shape {list(shape)} is not the {m}x{n} product's")
    if splits < 1 or (splits - 1) * split_part(k, splits) >= k:
        raise ShapeError(f"split_matmul: {splits} parts of K = {k} in tiles of {SPLIT_ALIGN} leave one empty")
    if splits > 1 and attrs["epilogue"] != "$acc":
        raise ShapeError(f"split_matmul: a product in {splits} parts has no epilogue, got {attrs['epilogue']}")
    check_expr("split_matmul", attrs["epilogue"], {"acc", *map(str, range(len(extras)))})
    for index, extra in enumerate(extras):
        if not broadcasts_to(extra.shape, shape):
            raise ShapeError(f"split_matmul: epilogue input ${index} {extra} does not broadcast to {list(shape)}")
    return TensorType((splits, *shape) if splits > 1 else shape, "f32")


def evaluate_split_matmul(a, a_top, b, b_top, *extras, m, k, n, shape, epilogue, splits):
    """(Ah·Bh + Ah·Bl + Al·Bh) · 2^-(ea + eb), in float64, rounded to f32: what the kernel's f32
    accumulators hold up to their rounding."""
    ah, al = (x[:m, :k] for x in unpacked(a))
    bh, bl = (x[:k, :n] for x in unpacked(b))
    unscale = 2.0 ** -(scale_exponent(a_top) + scale_exponent(b_top))
    part = split_part(k, splits)
    parts = []
    for s in range(splits):
        cut = slice(s * part, (s + 1) * part)
        product = ah[:, cut] @ bh[cut] + ah[:, cut] @ bl[cut] + al[:, cut] @ bh[cut]
        parts.append((product * unscale).astype(np.float32).reshape(shape))
    if splits > 1:
        return np.stack(parts)
    values = {"acc": parts[0], **{str(i): x for i, x in enumerate(extras)}}
    return np.broadcast_to(evaluate_expr(epilogue, values, np.float32), tuple(shape)).astype(np.float32)


def split_matmul_flops(operands, results, attrs) -> int:
    """2·M·N·K, the product's (the tensor cores do it three times over, in f16)."""
    return 2 * attrs["m"] * attrs["n"] * attrs["k"]


SPLIT_HALVES = Op(
    "split_halves",
    family=FAMILY,
    infer=infer_split_halves,
    evaluate=evaluate_split_halves,
    operands=("x", "top"),
    attrs=(Attr("transpose", BOOL, False), Attr("rows_to", INT, 1), Attr("cols_to", INT, 2)),
    egraph=None,
    describe=lambda node: (
        f"{'transposed, ' * node.attr('transpose')}padded to {node.attr('rows_to')}x{node.attr('cols_to')}"
    ),
    doc="x (or xᵀ) as f16 hi and lo halves under one power-of-two scale, for the tensor cores",
)

SPLIT_MATMUL = Op(
    "split_matmul",
    family=FAMILY,
    infer=infer_split_matmul,
    evaluate=evaluate_split_matmul,
    operands=("a", "a_top", "b", "b_top", "*extras"),
    attrs=(
        Attr("m", INT),
        Attr("k", INT),
        Attr("n", INT),
        Attr("shape", INTS),
        Attr("epilogue", EXPR, "$acc"),
        Attr("splits", INT, 1),
    ),
    egraph=None,
    flops=split_matmul_flops,
    describe=lambda node: f"{node.attr('m')}x{node.attr('k')}x{node.attr('n')} epilogue {node.attr('epilogue')}",
    doc="A·B on the tensor cores from split_halves operands (three f16 products, f32 accumulation)",
)


# ---------------------------------------------------------------------------------------------
# The same for many tensors in one kernel: the weights, all ready when the step starts


def infer_multi_top(types, attrs) -> tuple[TensorType, ...]:
    parts = attrs["parts"]
    require_float(list(types), "multi_top")
    if len(parts) != len(types) or any(p < 1 or t.numel % p for t, p in zip(types, parts, strict=False)):
        raise ShapeError(f"multi_top: parts {list(parts)} do not divide the tensors {[str(t) for t in types]}")
    return tuple(TensorType((p,), "f32") for p in parts)


def evaluate_multi_top(*tensors, parts):
    """Each tensor's partial maxima of |x|: the largest of each of its `parts` rows."""
    return tuple(
        np.abs(np.asarray(x, np.float32)).reshape(p, -1).max(axis=1) for x, p in zip(tensors, parts, strict=True)
    )


def infer_multi_split_halves(types, attrs) -> tuple[TensorType, ...]:
    transposes = attrs["transposes"]
    if len(types) != 2 * len(transposes):
        raise ShapeError(f"multi_split_halves: expected a tensor and its maxima per member, got {len(types)} operands")
    one = {"rows_to": attrs["rows_to"], "cols_to": attrs["cols_to"]}
    return tuple(
        infer_split_halves(types[2 * i : 2 * i + 2], {**one, "transpose": bool(t)}) for i, t in enumerate(transposes)
    )


def evaluate_multi_split_halves(*operands, transposes, rows_to, cols_to):
    return tuple(
        evaluate_split_halves(operands[2 * i], operands[2 * i + 1], bool(t), rows_to, cols_to)
        for i, t in enumerate(transposes)
    )


MULTI_TOP = Op(
    "multi_top",
    family=FAMILY,
    infer=infer_multi_top,
    evaluate=evaluate_multi_top,
    operands=("*tensors",),
    attrs=(Attr("parts", INTS),),
    egraph=None,
    describe=lambda node: f"{len(node.inputs)} tensors",
    doc="each tensor's partial maxima of |x| (the tops `split_halves` reads), in one kernel",
)

MULTI_SPLIT_HALVES = Op(
    "multi_split_halves",
    family=FAMILY,
    infer=infer_multi_split_halves,
    evaluate=evaluate_multi_split_halves,
    operands=("*inputs",),
    attrs=(Attr("transposes", INTS), Attr("rows_to", INT, 1), Attr("cols_to", INT, 2)),
    egraph=None,
    describe=lambda node: f"{len(node.attr('transposes'))} splits",
    doc="`split_halves` of several (tensor, maxima) pairs, in one kernel",
)
