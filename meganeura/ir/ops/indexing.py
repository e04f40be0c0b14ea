"""Indexing by i32 tensors: label indexing for nll_loss (`pick`; from a [classes] table too, the
class weights of a weighted loss, and from a scalar, 1 per target not ignored) and its gradient
(`scatter_rows`), embedding lookup (`gather`) and its gradient (`scatter_add`), which reads the
ids grouped by a stable sort (`sort_ids`) so that its kernel never compares every id with every row.

An index outside [0, num) gives NaN forward (a NaN value or a row of NaN, as on the device) and
contributes nothing backward. `pick` and `scatter_rows` carry PyTorch's `ignore_index` (default
−100, nll_loss's): a label equal to it, in range or not, picks 0 and scatters a row of zeros, so
that an ignored target contributes nothing to a loss or its gradient.
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import INT, Attr, Op, ShapeError, require_float
from meganeura.ir.ops.rows import IGNORE, IGNORE_INDEX, check_labels

FAMILY = "indexing"


def valid_labels(labels: np.ndarray, classes: int) -> np.ndarray:
    return (labels >= 0) & (labels < classes)


def infer_pick(types, attrs) -> TensorType:
    x, labels = types
    if x.rank > 2 or x.dtype != "f32":
        raise ShapeError(f"pick: expected f32 values [batch, classes], a table [classes] or a scalar, got {x}")
    if x.rank < 2 and labels.rank != 1:
        raise ShapeError(f"pick: expected i32 class labels [batch] for values {x}, got {labels}")
    rows = x.shape[0] if x.rank == 2 else labels.shape[0]
    check_labels("pick", labels, rows, f"values {x}")
    return TensorType((rows,), "f32")


def evaluate_pick(x, labels, ignore_index=IGNORE_INDEX):
    """x[row, labels[row]] for each row, x[labels[row]] of a table x [classes], or a scalar x
    itself: 0 where the label is ignore_index, NaN where it is otherwise outside [0, classes)
    (as on the device; a scalar has no classes to be outside of)."""
    labels = labels.astype(np.int64)
    if x.ndim == 0:
        picked = np.broadcast_to(x, labels.shape)
    else:
        valid = valid_labels(labels, x.shape[-1])
        at = np.where(valid, labels, 0)
        picked = np.where(valid, x[at] if x.ndim == 1 else x[np.arange(x.shape[0]), at], np.nan)
    return np.where(labels == ignore_index, 0.0, picked).astype(x.dtype)


def infer_scatter_rows(types, attrs) -> TensorType:
    g, labels = types
    require_float([g], "scatter_rows")
    classes = attrs["classes"]
    if g.rank != 1 or classes < 1:
        raise ShapeError(f"scatter_rows: expected f32 values [batch] and classes >= 1, got {g} and {classes!r}")
    check_labels("scatter_rows", labels, g.shape[0], f"values {g}")
    return TensorType((g.shape[0], classes), "f32")


def evaluate_scatter_rows(g, labels, classes, ignore_index=IGNORE_INDEX):
    """out[row, c] = g[row] if c == labels[row] else 0: pick's VJP (a row of zeros where the label
    is ignore_index, a row of NaN for another label outside [0, classes))."""
    labels = labels.astype(np.int64)
    out = (np.arange(classes)[None, :] == labels[:, None]) * g[:, None]
    out = np.where(valid_labels(labels, classes)[:, None], out, np.nan)
    return np.where((labels == ignore_index)[:, None], 0.0, out).astype(g.dtype)


PICK = Op(
    "pick",
    family=FAMILY,
    infer=infer_pick,
    evaluate=evaluate_pick,
    operands=("x", "labels"),
    attrs=IGNORE,
    doc="x[row, labels[row]] per row (x[labels[row]] of a table x, x of a scalar; 0 where the label is ignore_index)",
)
SCATTER_ROWS = Op(
    "scatter_rows",
    family=FAMILY,
    infer=infer_scatter_rows,
    evaluate=evaluate_scatter_rows,
    operands=("g", "labels"),
    attrs=(Attr("classes", INT), *IGNORE),
    doc="g[row] at column labels[row] of [batch, classes] zeros (pick's VJP; no row for ignore_index)",
)


@PICK.vjp
def _pick(b, node, g):
    x, labels = node.inputs
    ignore = node.attr("ignore_index")
    if not b.shape(x):  # Σ of g over the rows not ignored
        kept = b.emit("pick", [b.const(1.0), labels], ignore_index=ignore)
        return [b.emit("sum", [b.emit("mul", [g, kept])], axes=(0,), keepdim=False), None]
    rows = b.emit("scatter_rows", [g, labels], classes=b.shape(x)[-1], ignore_index=ignore)
    return [rows if len(b.shape(x)) == 2 else b.unbroadcast(rows, b.shape(x)), None]


@SCATTER_ROWS.vjp
def _scatter_rows(b, node, g):
    return [b.emit("pick", [g, node.inputs[1]], ignore_index=node.attr("ignore_index")), None]


def infer_gather(types, attrs) -> TensorType:
    table, ids = types
    if table.rank != 2 or table.dtype != "f32":
        raise ShapeError(f"embedding: expected an f32 weight [num_embeddings, embedding_dim], got {table}")
    if ids.dtype != "i32":
        raise ShapeError(f"embedding: expected i32 indices, got {ids}")
    return TensorType((*ids.shape, table.shape[1]), "f32")


def evaluate_gather(table, ids):
    """table[ids] (a row of NaN where an id is outside [0, num), as on the device)."""
    ids = ids.astype(np.int64)
    valid = valid_labels(ids, table.shape[0])
    rows = table[np.where(valid, ids, 0)]
    return np.where(valid[..., None], rows, np.nan).astype(table.dtype)


def infer_sort_ids(types, attrs) -> TensorType:
    (ids,) = types
    if ids.dtype != "i32":
        raise ShapeError(f"sort_ids: expected i32 indices, got {ids}")
    return TensorType((2, ids.numel), "i32")


def evaluate_sort_ids(ids):
    """[the ids in ascending order; their flat positions], ties in order of position (a stable sort)."""
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    return np.stack([flat[order], order]).astype(np.int32)


def infer_scatter_add(types, attrs) -> TensorType:
    g, ids, order = types
    require_float([g], "scatter_add")
    num = attrs["num"]
    if ids.dtype != "i32" or g.rank != ids.rank + 1 or g.shape[:-1] != ids.shape:
        raise ShapeError(f"scatter_add: expected values [..., dim] for i32 indices [...], got {g} and {ids}")
    if order.dtype != "i32" or order.shape != (2, ids.numel):
        raise ShapeError(f"scatter_add: expected sort_ids of the indices, i32[2,{ids.numel}], got {order}")
    if num < 1:
        raise ShapeError(f"scatter_add: expected num >= 1, got {num!r}")
    return TensorType((num, g.shape[-1]), "f32")


def evaluate_scatter_add(g, ids, order, num):
    """out[r, c] = Σ g[j, c] over the j with ids[j] == r: gather's VJP (ids outside [0, num) are
    skipped). `order` (sort_ids of ids) is how the kernel finds the j of a row; the sum is the same."""
    ids = ids.astype(np.int64).reshape(-1)
    rows = g.reshape(ids.size, g.shape[-1])
    valid = valid_labels(ids, num)
    out = np.zeros((num, g.shape[-1]), dtype=g.dtype)
    np.add.at(out, ids[valid], rows[valid])
    return out


def scatter_add(b, g: int, ids: int, num: int) -> int:
    """Emit gather's VJP: the ids sorted once, then the gradient rows summed per row of the table."""
    return b.emit("scatter_add", [g, ids, b.emit("sort_ids", [ids])], num=num)


GATHER = Op(
    "gather",
    family=FAMILY,
    infer=infer_gather,
    evaluate=evaluate_gather,
    operands=("table", "ids"),
    doc="table[ids]: rows of [num, dim] at i32 indices of any shape (embedding lookup)",
)
SORT_IDS = Op(
    "sort_ids",
    family=FAMILY,
    infer=infer_sort_ids,
    evaluate=evaluate_sort_ids,
    operands=("ids",),
    doc="[ids ascending; their positions]: a stable sort of i32 indices, for scatter_add",
)
SCATTER_ADD = Op(
    "scatter_add",
    family=FAMILY,
    infer=infer_scatter_add,
    evaluate=evaluate_scatter_add,
    operands=("g", "ids", "order"),
    attrs=(Attr("num", INT),),
    doc="the rows of g summed into [num, dim] at their ids (gather's VJP); order = sort_ids(ids)",
)


@GATHER.vjp
def _gather(b, node, g):
    table, ids = node.inputs
    return [scatter_add(b, g, ids, b.shape(table)[0]), None]


@SCATTER_ADD.vjp
def _scatter_add(b, node, g):
    return [b.emit("gather", [g, node.inputs[1]]), None, None]
