"""Reductions: sum and max over axes, and `fused_reduce`, the reduction kernel the e-graph makes
with an elementwise prologue (what is reduced) and epilogue (what is written).

`fused_reduce(inputs…, kind, axes, keepdim, in_shape, prologue, epilogue, splits)`:
epilogue(reduce(prologue($0, $1, … broadcast to in_shape) over axes)), the epilogue reading `$r`
and inputs broadcast to the output's shape (the residual added to a split product's sum, a bias
before its activation); produced only by the e-graph (rewrite/reductions.py). An input the
epilogue reads need not broadcast to in_shape (a [B, T] tensor beside the sum over the last axis of
[B, T, C]); one only the prologue reads must; one both read must do both.

With `splits` S > 1 it is the first level of a two-level reduction: the result is [S, *out],
partial s reducing the reduced elements r (row-major over the reduced axes, r in [0, R)) in
[s·⌈R/S⌉, (s+1)·⌈R/S⌉) ∩ [0, R), each partial going through the epilogue (which then reads only
`$r`: the partials are not the output's shape); a second reduction over
axis 0 combines them. Every part must hold at least one element (`check_splits`): a short
reduction split in too many parts would leave a max with nothing to reduce. A long reduction
with few outputs is split so that it runs on many workgroups (rewrite/reductions.py,
`split_reduce`); the split of a convolution's weight gradient (`conv_gemm` chunks) is the same.
"""

from __future__ import annotations

import math

import numpy as np

from meganeura.ir.expr import check_expr, variables
from meganeura.ir.expr import evaluate as evaluate_expr
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import TensorType
from meganeura.ir.op import (
    BOOL,
    EXPR,
    INT,
    INTS,
    STR,
    Attr,
    EGraphForm,
    Op,
    ShapeError,
    broadcast_shapes,
    normalize_axes,
    require_float,
)

FAMILY = "reduce"
REDUCE_KINDS = ("sum", "max")


def split_length(total: int, splits: int) -> int:
    """The elements of each part of a reduction of `total` elements split into `splits` parts
    (the last part may be shorter): ⌈total/splits⌉."""
    return -(-total // splits)


def nonempty_splits(total: int, splits: int) -> int:
    """The parts of ⌈total/splits⌉ elements that cover `total`: `splits` or fewer, none empty
    (10 in 4 parts of 3: 4; 10 in 6 parts of 2: 5)."""
    return -(-total // split_length(total, max(splits, 1)))


def check_splits(total: int, splits, op: str) -> int:
    """`splits` as an int, checked: at least 1 and every part of `total` elements non-empty."""
    if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
        raise ShapeError(f"{op}: splits must be a positive int, got {splits!r}")
    if splits > 1 and (splits - 1) * split_length(total, splits) >= total:
        raise ShapeError(
            f"{op}: {total} elements in {splits} parts of {split_length(total, splits)} leave the last part empty"
        )
    return splits


def split_parts(values: np.ndarray, splits: int) -> list[np.ndarray]:
    """The parts of the last axis of `values` that a split reduction reduces one by one."""
    length = split_length(values.shape[-1], splits)
    return [values[..., start : start + length] for start in range(0, values.shape[-1], length)]


def reduced_type(shape: tuple[int, ...], axes, keepdim: bool) -> TensorType:
    axes = normalize_axes(axes, len(shape))
    if keepdim:
        return TensorType(tuple(1 if i in axes else d for i, d in enumerate(shape)), "f32")
    return TensorType(tuple(d for i, d in enumerate(shape) if i not in axes), "f32")


def infer_reduce(types, attrs) -> TensorType:
    require_float(types, "sum")
    return reduced_type(types[0].shape, attrs["axes"], attrs["keepdim"])


REDUCE_ATTRS = (Attr("axes", INTS), Attr("keepdim", BOOL, False))


def describe_reduce(node) -> str:
    return f"over {list(node.attr('axes'))}"


SUM = Op(
    "sum",
    family=FAMILY,
    infer=infer_reduce,
    evaluate=lambda x, axes, keepdim: np.asarray(np.sum(x, axis=tuple(axes), keepdims=keepdim)),
    operands=("x",),
    attrs=REDUCE_ATTRS,
    egraph=EGraphForm("Reduce", tag="sum"),
    describe=describe_reduce,
    doc="the sum over `axes`",
)
MAX = Op(
    "max",
    family=FAMILY,
    infer=infer_reduce,
    evaluate=lambda x, axes, keepdim: np.asarray(np.max(x, axis=tuple(axes), keepdims=keepdim)),
    operands=("x",),
    attrs=REDUCE_ATTRS,
    egraph=EGraphForm("Reduce", tag="max"),
    describe=describe_reduce,
    doc="the maximum over `axes`",
)


def kept_shape(b, node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(x's shape, the result's shape with the reduced dims kept as 1)."""
    x_shape = b.shape(node.inputs[0])
    axes = normalize_axes(node.attr("axes"), len(x_shape))
    return x_shape, tuple(1 if i in axes else d for i, d in enumerate(x_shape))


@SUM.vjp
def _sum(b, node, g):
    x_shape, kept = kept_shape(b, node)
    if b.shape(g) != kept:
        g = b.emit("reshape", [g], shape=kept)
    return [b.emit("broadcast_to", [g], shape=x_shape)]


@MAX.vjp
def _max(b, node, g):
    """The gradient goes to the maxima, split evenly between ties (as torch.amax does)."""
    x = node.inputs[0]
    x_shape, kept = kept_shape(b, node)
    axes = normalize_axes(node.attr("axes"), len(x_shape))
    peak = node.id if b.shape(node.id) == kept else b.emit("reshape", [node.id], shape=kept)
    mask = b.emit("equal", [x, peak])
    ties = b.emit("sum", [mask], axes=axes, keepdim=True)
    g = g if b.shape(g) == kept else b.emit("reshape", [g], shape=kept)
    return [b.emit("mul", [mask, b.emit("div", [g, ties])])]


def inputs_read(expression: str) -> set[int]:
    """The inputs ($0, $1, …) a fused_reduce's prologue or epilogue reads."""
    return {int(name) for name in variables(parse_expr(expression)) if name.isdigit()}


def infer_fused_reduce(types, attrs) -> TensorType:
    in_shape = attrs["in_shape"]
    require_float(types, "fused_reduce")
    if attrs["kind"] not in REDUCE_KINDS:
        raise ShapeError(f"fused_reduce: unknown kind {attrs['kind']!r}")
    names = set(map(str, range(len(types))))
    check_expr("fused_reduce", attrs["prologue"], names)
    check_expr("fused_reduce", attrs["epilogue"], names | {"r"})
    out = reduced_type(in_shape, attrs["axes"], attrs["keepdim"])
    early, late = inputs_read(attrs["prologue"]), inputs_read(attrs["epilogue"])  # at (o, r); at o
    for index, t in enumerate(types):
        shapes = [("the output", out.shape)] if index in late else []
        if index in early or index not in late:
            shapes.append(("in_shape", tuple(in_shape)))
        for where, shape in shapes:
            if broadcast_shapes(t.shape, shape, "fused_reduce") != shape:
                raise ShapeError(f"fused_reduce: input ${index} {t} does not broadcast to {where} {list(shape)}")
    axes = normalize_axes(attrs["axes"], len(in_shape), "fused_reduce")
    splits = check_splits(math.prod(in_shape[d] for d in axes), attrs.get("splits", 1), "fused_reduce")
    if splits != 1 and late:
        raise ShapeError(f"fused_reduce: a split reduction's epilogue reads only $r, got {attrs['epilogue']!r}")
    return out if splits == 1 else TensorType((splits, *out.shape), "f32")


def evaluate_fused_reduce(*inputs, kind, axes, keepdim, in_shape, prologue, epilogue, splits=1):
    """epilogue(reduce(prologue($0, $1, …) over `axes`)): a reduction with elementwise ends (in
    `splits` partial reductions, see the module docstring)."""
    values = {str(i): x for i, x in enumerate(inputs)}
    dtype = inputs[0].dtype if inputs else np.float32
    body = np.broadcast_to(evaluate_expr(prologue, values, dtype), tuple(in_shape))
    reduce = np.sum if kind == "sum" else np.max
    if splits == 1:
        reduced = np.asarray(reduce(body, axis=tuple(axes), keepdims=keepdim))
    else:
        axes = normalize_axes(axes, len(in_shape), "fused_reduce")
        kept = [d for d in range(len(in_shape)) if d not in axes]
        out_shape = reduced_type(tuple(in_shape), axes, keepdim).shape
        rows = np.transpose(body, (*kept, *axes)).reshape(*(in_shape[d] for d in kept), -1)
        reduced = np.stack([reduce(part, axis=-1).reshape(out_shape) for part in split_parts(rows, splits)])
    return np.asarray(evaluate_expr(epilogue, {**values, "r": reduced}, dtype))


def describe_fused_reduce(node) -> str:
    split = f" in {node.attr('splits')} parts" if node.attr("splits") != 1 else ""
    ends = f"{node.attr('prologue')} -> {node.attr('epilogue')}"
    return f"{node.attr('kind')} over {list(node.attr('axes'))}{split}: {ends}"


FUSED_REDUCE = Op(
    "fused_reduce",
    family=FAMILY,
    infer=infer_fused_reduce,
    evaluate=evaluate_fused_reduce,
    operands=("*inputs",),
    attrs=(
        Attr("kind", STR),
        *REDUCE_ATTRS,
        Attr("in_shape", INTS),
        Attr("prologue", EXPR, "$0"),
        Attr("epilogue", EXPR, "$r"),
        Attr("splits", INT, 1),
    ),
    egraph=None,
    describe=describe_fused_reduce,
    doc="a reduction kernel with an elementwise prologue and epilogue",
)
