"""Shape ops: reshape (a view), broadcast_to, permute, slices and their gradient, concatenation,
`result`, the projection that reads one result of a node with several, and `element`, one
element of a vector as a scalar (a view at a constant offset).

`slice` keeps per-dim start/stop/step (normalised: 0 <= start <= stop <= dim, step >= 1);
`slice_grad` writes a slice's gradient into zeros of the sliced tensor's shape; `concat` joins
its operands along one axis (at most 6 per node: the e-graph's constructors have a fixed arity;
`cat` in the DSL groups longer lists).
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import INT, INTS, Attr, Op, ShapeError, broadcast_shapes, require_float

FAMILY = "shape"

# ---------------------------------------------------------------------------------------------
# reshape: the same elements in a new shape, a view of its operand's buffer


def infer_reshape(types, attrs) -> TensorType:
    target = TensorType(attrs["shape"], types[0].dtype)
    if target.numel != types[0].numel:
        raise ShapeError(f"reshape: cannot reshape {types[0]} ({types[0].numel} elements) to {list(target.shape)}")
    return target


RESHAPE = Op(
    "reshape",
    family=FAMILY,
    infer=infer_reshape,
    evaluate=lambda x, shape: np.reshape(x, shape),
    operands=("x",),
    attrs=(Attr("shape", INTS),),
    kernel=False,
    doc="the same elements in a new shape (a view)",
)


@RESHAPE.vjp
def _reshape(b, node, g):
    return [b.emit("reshape", [g], shape=b.shape(node.inputs[0]))]


# ---------------------------------------------------------------------------------------------
# broadcast_to


def infer_broadcast_to(types, attrs) -> TensorType:
    shape = attrs["shape"]
    if broadcast_shapes(types[0].shape, shape, "broadcast_to") != shape:
        raise ShapeError(f"broadcast_to: cannot broadcast {types[0]} to {list(shape)}")
    return TensorType(shape, types[0].dtype)


BROADCAST_TO = Op(
    "broadcast_to",
    family=FAMILY,
    infer=infer_broadcast_to,
    evaluate=lambda x, shape: np.broadcast_to(x, shape).copy(),
    operands=("x",),
    attrs=(Attr("shape", INTS),),
    doc="x repeated along dims of size 1 (and new leading dims) to `shape`",
)


@BROADCAST_TO.vjp
def _broadcast_to(b, node, g):
    return [b.unbroadcast(g, b.shape(node.inputs[0]))]


# ---------------------------------------------------------------------------------------------
# permute


def infer_permute(types, attrs) -> TensorType:
    perm = attrs["perm"]
    shape = types[0].shape
    if sorted(perm) != list(range(len(shape))):
        raise ShapeError(f"permute: {list(perm)} is not a permutation of the {len(shape)} dims of {types[0]}")
    return TensorType(tuple(shape[p] for p in perm), types[0].dtype)


PERMUTE = Op(
    "permute",
    family=FAMILY,
    infer=infer_permute,
    evaluate=lambda x, perm: np.transpose(x, perm).copy(),
    operands=("x",),
    attrs=(Attr("perm", INTS),),
    describe=lambda node: f"perm {list(node.attr('perm'))}",
    doc="the dims of x reordered",
)


@PERMUTE.vjp
def _permute(b, node, g):
    perm = node.attr("perm")
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [b.emit("permute", [g], perm=inverse)]


# ---------------------------------------------------------------------------------------------
# slice and slice_grad


def slice_shape(shape: tuple[int, ...], attrs, op: str) -> tuple[int, ...]:
    """The shape of `shape` sliced by attrs starts/stops/steps (checked to be normalised)."""
    starts, stops, steps = (attrs[key] for key in ("starts", "stops", "steps"))
    if not len(starts) == len(stops) == len(steps) == len(shape):
        raise ShapeError(f"{op}: expected one start, stop and step per dim of {list(shape)}")
    out = []
    for d, start, stop, step in zip(shape, starts, stops, steps, strict=True):
        if not (step >= 1 and 0 <= start <= stop <= d):
            raise ShapeError(f"{op}: bad slice {start}:{stop}:{step} of a dim of size {d}")
        out.append(-(-(stop - start) // step))
    return tuple(out)


def slices_of(starts, stops, steps) -> tuple[slice, ...]:
    return tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps, strict=True))


def infer_slice(types, attrs) -> TensorType:
    return TensorType(slice_shape(types[0].shape, attrs, "slice"), types[0].dtype)


def infer_slice_grad(types, attrs) -> TensorType:
    shape = attrs["shape"]
    require_float(types, "slice_grad")
    if slice_shape(shape, attrs, "slice_grad") != types[0].shape:
        raise ShapeError(f"slice_grad: gradient {types[0]} does not match the slice of {list(shape)}")
    return TensorType(shape, "f32")


def evaluate_slice(x, starts, stops, steps):
    """x[start:stop:step, …] per dim."""
    return x[slices_of(starts, stops, steps)].copy()


def evaluate_slice_grad(g, shape, starts, stops, steps):
    """Zeros of `shape` with g written at the slice: slice's VJP."""
    out = np.zeros(tuple(shape), dtype=g.dtype)
    out[slices_of(starts, stops, steps)] = g
    return out


SLICE_ATTRS = (Attr("starts", INTS), Attr("stops", INTS), Attr("steps", INTS))

SLICE = Op(
    "slice",
    family=FAMILY,
    infer=infer_slice,
    evaluate=evaluate_slice,
    operands=("x",),
    attrs=SLICE_ATTRS,
    doc="x[start:stop:step, …] per dim",
)
SLICE_GRAD = Op(
    "slice_grad",
    family=FAMILY,
    infer=infer_slice_grad,
    evaluate=evaluate_slice_grad,
    operands=("g",),
    attrs=(Attr("shape", INTS), *SLICE_ATTRS),
    doc="zeros of `shape` with g written at the slice (slice's VJP)",
)


def slice_attrs(node) -> dict:
    return {key: node.attr(key) for key in ("starts", "stops", "steps")}


@SLICE.vjp
def _slice(b, node, g):
    return [b.emit("slice_grad", [g], shape=b.shape(node.inputs[0]), **slice_attrs(node))]


@SLICE_GRAD.vjp
def _slice_grad(b, node, g):
    return [b.emit("slice", [g], **slice_attrs(node))]


# ---------------------------------------------------------------------------------------------
# concat


def infer_concat(types, attrs) -> TensorType:
    if not types:
        raise ShapeError("cat: expected at least one tensor")
    first, axis = types[0], attrs["axis"]
    if first.rank == 0 or not 0 <= axis < first.rank:
        raise ShapeError(f"cat: expected tensors with at least one dim and a dim in range, got {first} and {axis!r}")
    for t in types[1:]:
        others_differ = t.shape[:axis] + t.shape[axis + 1 :] != first.shape[:axis] + first.shape[axis + 1 :]
        if t.rank != first.rank or t.dtype != first.dtype or others_differ:
            raise ShapeError(f"cat: {t} does not match {first} outside dim {axis}")
    total = sum(t.shape[axis] for t in types)
    return TensorType((*first.shape[:axis], total, *first.shape[axis + 1 :]), first.dtype)


CONCAT = Op(
    "concat",
    family=FAMILY,
    infer=infer_concat,
    evaluate=lambda *xs, axis: np.concatenate(xs, axis=axis),
    operands=("first", "*rest"),
    attrs=(Attr("axis", INT),),
    doc="the operands joined along `axis`",
)


@CONCAT.vjp
def _concat(b, node, g):
    """Each input's gradient is its slice of g along the concatenated axis."""
    axis, shape = node.attr("axis"), b.shape(node.id)
    grads, offset = [], 0
    for x in node.inputs:
        size = b.shape(x)[axis]
        starts = tuple(offset if d == axis else 0 for d in range(len(shape)))
        stops = tuple(offset + size if d == axis else n for d, n in enumerate(shape))
        grads.append(b.emit("slice", [g], starts=starts, stops=stops, steps=(1,) * len(shape)))
        offset += size
    return grads


# ---------------------------------------------------------------------------------------------
# result: one result of a node with several (a view of that result's buffer)


def infer_result(types, attrs):
    (whole,) = types
    index = attrs["index"]
    if not isinstance(whole, tuple):
        raise ShapeError(f"result: its operand has a single result {whole}; read it directly")
    if not 0 <= index < len(whole):
        raise ShapeError(f"result: index {index} is out of range for a node with {len(whole)} results")
    return whole[index]


RESULT = Op(
    "result",
    family=FAMILY,
    infer=infer_result,
    evaluate=lambda whole, index: whole[index],
    operands=("node",),
    attrs=(Attr("index", INT),),
    kernel=False,
    tuple_operands=True,
    doc="result `index` of a node with several results (a view)",
)
# No VJP rule: autodiff routes a projection's gradient to its node's result (ir/autodiff.py).


# ---------------------------------------------------------------------------------------------
# element: one element of a vector, as a scalar (a view at a constant offset)
#
# What the optimizer updates read their hyper-parameters through: a parameter group's values
# are one vector (ir/ops/optimizer.py: HYPER_FIELDS), each update operand an element of it, so
# that a kernel reading several binds the vector once and indexes it by literal offsets
# (codegen/common.py: `Operands`).


def infer_element(types, attrs) -> TensorType:
    (vector,) = types
    index = attrs["index"]
    if vector.rank != 1:
        raise ShapeError(f"element: expected a vector, got {vector}")
    if not 0 <= index < vector.shape[0]:
        raise ShapeError(f"element: index {index} is out of range for {vector}")
    return TensorType((), vector.dtype)


ELEMENT = Op(
    "element",
    family=FAMILY,
    infer=infer_element,
    evaluate=lambda vector, index: np.asarray(vector[index]),
    operands=("vector",),
    attrs=(Attr("index", INT),),
    kernel=False,
    doc="element `index` of a vector, as a scalar (a view)",
)
# No VJP rule: only the optimizer's updates read elements, after autodiff.
