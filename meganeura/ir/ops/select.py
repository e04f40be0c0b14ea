"""Selection, scans, casts and indexing along an axis: the ops behind torch's `.long()`/`.float()`,
`flip`, `cumsum`/`cumprod`, `gather`/`scatter_add`, integer-tensor indexing (`x[idx]`),
`argmax`/`max(dim)` and `topk`/`sort`.

- `cast(x, dtype)`: f32 ↔ i32. f32 → i32 truncates toward zero; NaN, ±inf and values outside
  i32 give i32's minimum, as torch's `.int()` does on x86 (its `.long()` has a wider range).
- `flip(x, axes)`: the elements in reverse order along each of `axes`.
- `cumsum(x, axis, reverse)`: running sums along `axis` (from the end with `reverse`, which is
  cumsum's own VJP); `cumprod(x, axis)` running products, whose VJP `cumprod_grad(x, g, axis)`
  is Σ_{j≥k} g_j · Π_{i≤j, i≠k} x_i, exact where x has zeros. Accumulated in the element type in
  order along the axis (PyTorch's CPU kernel accumulates f32 in f64).
- `gather_axis(x, index, axis)`: torch.gather, out[p] = x[p with p[axis] = index[p]], index as
  large as x or smaller in the other dims; its VJP `scatter_axis_add(src, index, axis, shape)`:
  zeros of `shape` plus each src[q] at q with q[axis] = index[q] (torch.scatter_add onto
  zeros). The kernel gives each output element to one thread, which sums its contributions
  in index order: deterministic, no atomics.
- `flat_index(*indices, sizes)`: the row-major position in a block of `sizes` of one index per
  dim (broadcast together), negative indices counted from the end, as integer-tensor indexing
  (`x[i, j]`) reads them; -1 where any is out of range.
- `arg_reduce(x, axis, keepdim, largest)`: (the maximum (or minimum) along `axis`, its index), the
  first one where there are ties and NaN counting as the maximum and as the minimum (PyTorch's
  rule); the gradient of the values goes to that index alone (torch.max(x, dim)).
- `topk(x, k, axis, largest)`: the k largest (or smallest) along `axis` in order, and their
  indices; NaN counts as the largest; ties in order of index (a stable sort: torch.sort's
  stable=True; torch.topk's order of ties is unspecified). The gradient goes to the indices.

An index outside its range gives NaN (a value) or contributes nothing (a gradient), as the
embedding lookup does (ir/ops/indexing.py): PyTorch raises there, but the values are not known
until the step runs.
"""

from __future__ import annotations

import math

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import (
    BOOL,
    INT,
    INTS,
    STR,
    Attr,
    Op,
    ShapeError,
    broadcast_shapes,
    normalize_axes,
    require_float,
)
from meganeura.ir.ops.reduce import reduced_type

FAMILY = "select"
I32_MIN = -(2**31)


def check_axis(op: str, axis: int, x: TensorType) -> None:
    if not 0 <= axis < x.rank:
        raise ShapeError(f"{op}: axis {axis} is out of range for {x}")


def along_last(x: np.ndarray, axis: int) -> np.ndarray:
    return np.moveaxis(x, axis, -1)


# ---------------------------------------------------------------------------------------------
# cast


def infer_cast(types, attrs) -> TensorType:
    (x,) = types
    dtype = attrs["dtype"]
    if dtype not in ("f32", "i32") or dtype == x.dtype:
        raise ShapeError(f"cast: expected the other dtype of f32 and i32 than {x}'s, got {dtype!r}")
    return TensorType(x.shape, dtype)


def evaluate_cast(x, dtype):
    """f32 → i32 truncating toward zero (NaN, ±inf and values outside i32 → i32's minimum); i32 → f32."""
    if dtype == "f32":
        return x.astype(np.float32)
    with np.errstate(invalid="ignore"):
        whole = np.trunc(x.astype(np.float64))
        valid = np.isfinite(whole) & (whole >= I32_MIN) & (whole < 2**31)
        return np.where(valid, np.where(valid, whole, 0).astype(np.int64), I32_MIN).astype(np.int32)


CAST = Op(
    "cast",
    family=FAMILY,
    infer=infer_cast,
    evaluate=evaluate_cast,
    operands=("x",),
    attrs=(Attr("dtype", STR),),
    doc="x as the other dtype (f32 → i32 truncates toward zero)",
)


@CAST.vjp
def _cast(b, node, g):
    return [None]  # integers carry no gradient, in either direction


# ---------------------------------------------------------------------------------------------
# flip


def infer_flip(types, attrs) -> TensorType:
    (x,) = types
    if normalize_axes(attrs["axes"], x.rank, "flip") != tuple(attrs["axes"]) or not attrs["axes"]:
        raise ShapeError(f"flip: expected sorted distinct axes of {x}, got {list(attrs['axes'])}")
    return x


FLIP = Op(
    "flip",
    family=FAMILY,
    infer=infer_flip,
    evaluate=lambda x, axes: np.flip(x, axes).copy(),
    operands=("x",),
    attrs=(Attr("axes", INTS),),
    doc="x in reverse order along each of `axes`",
)


@FLIP.vjp
def _flip(b, node, g):
    return [b.emit("flip", [g], axes=node.attr("axes"))]


# ---------------------------------------------------------------------------------------------
# cumsum, cumprod and cumprod's gradient


def infer_scan(op: str):
    def infer(types, attrs) -> TensorType:
        x = types[0]
        check_axis(op, attrs["axis"], x)
        if any(t.shape != x.shape or t.dtype != x.dtype for t in types[1:]):
            raise ShapeError(f"{op}: expected operands of one type, got {', '.join(map(str, types))}")
        if op == "cumprod_grad":
            require_float(types, op)
        return x

    return infer


def evaluate_cumsum(x, axis, reverse):
    """Running sums along `axis`, from its end with `reverse`."""
    if reverse:
        return np.flip(np.cumsum(np.flip(x, axis), axis=axis, dtype=x.dtype), axis).copy()
    return np.cumsum(x, axis=axis, dtype=x.dtype)


def evaluate_cumprod_grad(x, g, axis):
    """out_k = Σ_{j≥k} g_j · Π_{i≤j, i≠k} x_i along `axis`: cumprod's VJP, exact where x has zeros."""
    xs, gs = along_last(x, axis), along_last(g, axis)
    out = np.zeros_like(gs)
    for k in range(xs.shape[-1]):
        others = xs.copy()
        others[..., k] = 1
        out[..., k] = (gs[..., k:] * np.cumprod(others, axis=-1)[..., k:]).sum(-1)
    return np.moveaxis(out, -1, axis)


SCAN_ATTRS = (Attr("axis", INT),)

CUMSUM = Op(
    "cumsum",
    family=FAMILY,
    infer=infer_scan("cumsum"),
    evaluate=evaluate_cumsum,
    operands=("x",),
    attrs=(*SCAN_ATTRS, Attr("reverse", BOOL, False)),
    doc="running sums along `axis` (from its end with `reverse`)",
)
CUMPROD = Op(
    "cumprod",
    family=FAMILY,
    infer=infer_scan("cumprod"),
    evaluate=lambda x, axis: np.cumprod(x, axis=axis, dtype=x.dtype),
    operands=("x",),
    attrs=SCAN_ATTRS,
    doc="running products along `axis`",
)
CUMPROD_GRAD = Op(
    "cumprod_grad",
    family=FAMILY,
    infer=infer_scan("cumprod_grad"),
    evaluate=evaluate_cumprod_grad,
    operands=("x", "g"),
    attrs=SCAN_ATTRS,
    doc="Σ_{j≥k} g_j · Π_{i≤j, i≠k} x_i along `axis` (cumprod's VJP)",
)


@CUMSUM.vjp
def _cumsum(b, node, g):
    return [b.emit("cumsum", [g], axis=node.attr("axis"), reverse=not node.attr("reverse"))]


@CUMPROD.vjp
def _cumprod(b, node, g):
    return [b.emit("cumprod_grad", [node.inputs[0], g], axis=node.attr("axis"))]


# ---------------------------------------------------------------------------------------------
# gather_axis and scatter_axis_add


def check_index(op: str, index: TensorType, x: TensorType, axis: int, what: str) -> None:
    """`index` is i32, of x's rank, and no larger than x outside `axis` (torch.gather's rule)."""
    if index.dtype != "i32":
        raise ShapeError(f"{op}: expected an i32 index, got {index}")
    check_axis(op, axis, x)
    if index.rank != x.rank or any(index.shape[d] > x.shape[d] for d in range(x.rank) if d != axis):
        raise ShapeError(
            f"{op}: the index {index} must have the rank of {what} {x} and be no larger outside dim {axis}"
        )


def infer_gather_axis(types, attrs) -> TensorType:
    x, index = types
    require_float([x], "gather")
    check_index("gather", index, x, attrs["axis"], "the input")
    if x.shape[attrs["axis"]] == 0 and index.numel:
        raise ShapeError(f"gather: cannot index the empty dim {attrs['axis']} of {x}")
    return TensorType(index.shape, "f32")


def index_block(index: np.ndarray, shape: tuple[int, ...], axis: int) -> tuple[slice, ...]:
    """The block of an array of `shape` that an index covers outside `axis` (all of `axis`)."""
    return tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(index.shape[: len(shape)]))


def evaluate_gather_axis(x, index, axis):
    """x[p with p[axis] = index[p]] for each position p of index (NaN where index is outside the dim)."""
    index = index.astype(np.int64)
    block = x[index_block(index, x.shape, axis)]
    valid = (index >= 0) & (index < x.shape[axis])
    picked = np.take_along_axis(block, np.where(valid, index, 0), axis=axis)
    return np.where(valid, picked, np.nan).astype(x.dtype)


def infer_scatter_axis_add(types, attrs) -> TensorType:
    src, index = types
    shape, axis = tuple(attrs["shape"]), attrs["axis"]
    require_float([src], "scatter_add")
    out = TensorType(shape, "f32")
    check_index("scatter_add", index, out, axis, "the result")
    if index.rank != src.rank or any(i > s for i, s in zip(index.shape, src.shape, strict=True)):
        raise ShapeError(f"scatter_add: the index {index} must be no larger than the source {src}")
    return out


def evaluate_scatter_axis_add(src, index, axis, shape):
    """Zeros of `shape` plus src[q] at q with q[axis] = index[q], for each position q of index, in
    order (an index outside the dim adds nothing)."""
    index = index.astype(np.int64)
    out = np.zeros(tuple(shape), dtype=src.dtype)
    coords = list(np.indices(index.shape))
    valid = (index >= 0) & (index < shape[axis])
    coords[axis] = index
    np.add.at(out, tuple(c[valid] for c in coords), src[tuple(slice(0, n) for n in index.shape)][valid])
    return out


GATHER_AXIS = Op(
    "gather_axis",
    family=FAMILY,
    infer=infer_gather_axis,
    evaluate=evaluate_gather_axis,
    operands=("x", "index"),
    attrs=(Attr("axis", INT),),
    doc="x[p with p[axis] = index[p]] (torch.gather)",
)
SCATTER_AXIS_ADD = Op(
    "scatter_axis_add",
    family=FAMILY,
    infer=infer_scatter_axis_add,
    evaluate=evaluate_scatter_axis_add,
    operands=("src", "index"),
    attrs=(Attr("axis", INT), Attr("shape", INTS)),
    doc="src summed into zeros of `shape` at index along `axis` (torch.scatter_add; gather_axis's VJP)",
)


def scatter_to(b, g: int, index: int, axis: int, shape: tuple[int, ...]) -> int:
    return b.emit("scatter_axis_add", [g, index], axis=axis, shape=shape)


@GATHER_AXIS.vjp
def _gather_axis(b, node, g):
    x, index = node.inputs
    return [scatter_to(b, g, index, node.attr("axis"), b.shape(x)), None]


@SCATTER_AXIS_ADD.vjp
def _scatter_axis_add(b, node, g):
    src, index = node.inputs
    grad = b.emit("gather_axis", [g, index], axis=node.attr("axis"))
    src_shape = b.shape(src)
    if b.shape(grad) != src_shape:  # src beyond the index's block gets no gradient
        rank = len(src_shape)
        grad = b.emit(
            "slice_grad", [grad], shape=src_shape, starts=(0,) * rank, stops=b.shape(index), steps=(1,) * rank
        )
    return [grad, None]


# ---------------------------------------------------------------------------------------------
# flat_index


def infer_flat_index(types, attrs) -> TensorType:
    sizes = attrs["sizes"]
    if len(types) != len(sizes) or any(t.dtype != "i32" for t in types):
        raise ShapeError(f"flat_index: expected one i32 index per size {list(sizes)}, got {', '.join(map(str, types))}")
    if any(s < 1 for s in sizes) or math.prod(sizes) >= 2**31:
        raise ShapeError(f"flat_index: sizes {list(sizes)} must be positive, their product below 2^31")
    shape = ()
    for t in types:
        shape = broadcast_shapes(shape, t.shape, "indexing")
    return TensorType(shape, "i32")


def evaluate_flat_index(*indices, sizes):
    """Σ_d wrap(index_d)·stride_d over a row-major block of `sizes` (wrap: negative ones count from
    the end), -1 where any index is outside [-size, size)."""
    shape = np.broadcast_shapes(*(i.shape for i in indices))
    flat, valid, stride = np.zeros(shape, np.int64), np.ones(shape, bool), 1
    for index, size in zip(reversed(indices), reversed(sizes), strict=True):
        index = index.astype(np.int64)
        valid &= (index >= -size) & (index < size)
        flat = flat + np.where(index < 0, index + size, index) * stride
        stride *= size
    return np.where(valid, flat, -1).astype(np.int32)


FLAT_INDEX = Op(
    "flat_index",
    family=FAMILY,
    infer=infer_flat_index,
    evaluate=evaluate_flat_index,
    operands=("first", "*rest"),
    attrs=(Attr("sizes", INTS),),
    doc="the row-major position of one index per dim in a block of `sizes` (negative from the end; -1 outside)",
)


@FLAT_INDEX.vjp
def _flat_index(b, node, g):
    return [None] * len(node.inputs)


# ---------------------------------------------------------------------------------------------
# arg_reduce: max/min along an axis with the index


def infer_arg_reduce(types, attrs):
    (x,) = types
    axis = attrs["axis"]
    require_float([x], "argmax")
    check_axis("argmax", axis, x)
    if x.shape[axis] == 0:
        raise ShapeError(f"argmax: dim {axis} of {x} is empty")
    shape = reduced_type(x.shape, (axis,), attrs["keepdim"]).shape
    return (TensorType(shape, "f32"), TensorType(shape, "i32"))


def evaluate_arg_reduce(x, axis, keepdim, largest):
    """(values, indices) of the maximum (or minimum) along `axis`: the first of ties, NaN before
    anything (numpy's argmax and argmin take the first NaN too)."""
    index = np.argmax(x, axis=axis, keepdims=True) if largest else np.argmin(x, axis=axis, keepdims=True)
    values = np.take_along_axis(x, index, axis=axis)
    if not keepdim:
        values, index = values.squeeze(axis), index.squeeze(axis)
    return values, index.astype(np.int32)


ARG_REDUCE = Op(
    "arg_reduce",
    family=FAMILY,
    infer=infer_arg_reduce,
    evaluate=evaluate_arg_reduce,
    operands=("x",),
    attrs=(Attr("axis", INT), Attr("keepdim", BOOL, False), Attr("largest", BOOL, True)),
    describe=lambda node: f"{'max' if node.attr('largest') else 'min'} and its index along dim {node.attr('axis')}",
    doc="(values, indices) of the max (or min) along `axis`: first of ties, NaN counts as the extreme",
)


@ARG_REDUCE.vjp
def _arg_reduce(b, node, g):
    grad = g[0]
    if grad is None:
        return [None]
    (x,) = node.inputs
    axis = node.attr("axis")
    kept = reduced_type(b.shape(x), (axis,), True).shape
    index = b.emit("reshape", [b.result(node.id, 1)], shape=kept)
    return [scatter_to(b, b.emit("reshape", [grad], shape=kept), index, axis, b.shape(x))]


# ---------------------------------------------------------------------------------------------
# topk (and sort: k = the whole dim)


def infer_topk(types, attrs):
    (x,) = types
    axis, k = attrs["axis"], attrs["k"]
    require_float([x], "topk")
    check_axis("topk", axis, x)
    if not 0 <= k <= x.shape[axis]:
        raise ShapeError(f"topk: k = {k} is out of range for dim {axis} of {x}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1 :]
    return (TensorType(shape, "f32"), TensorType(shape, "i32"))


def evaluate_topk(x, k, axis, largest):
    """The k largest (smallest) along `axis` in order and their indices: NaN largest, ties by index."""
    xs = along_last(x, axis)
    nan = np.isnan(xs)
    value = np.where(nan, 0, xs)
    order = np.lexsort((-value, ~nan) if largest else (value, nan), axis=-1)[..., :k]
    values = np.take_along_axis(xs, order, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(order, -1, axis).astype(np.int32)


TOPK = Op(
    "topk",
    family=FAMILY,
    infer=infer_topk,
    evaluate=evaluate_topk,
    operands=("x",),
    attrs=(Attr("k", INT), Attr("axis", INT), Attr("largest", BOOL, True)),
    describe=lambda node: f"top {node.attr('k')} along dim {node.attr('axis')}",
    doc="(values, indices) of the k largest (or smallest) along `axis`, in order; NaN largest, ties by index",
)


@TOPK.vjp
def _topk(b, node, g):
    grad = g[0]
    if grad is None:
        return [None]
    (x,) = node.inputs
    return [scatter_to(b, grad, b.result(node.id, 1), node.attr("axis"), b.shape(x))]
