"""Row ops: softmax and log_softmax along one axis and their gradients, and the fused
cross-entropy kernels the e-graph makes of nll_loss(log_softmax(x)) and its gradient.

Each row (the values along `axis` for fixed other indices) is one workgroup's work on the device
(shaders/softmax.wgsl): the reductions inside (max, Σ) never leave the kernel. Softmax's
gradients read the forward's output, not its input. `cross_entropy_rows(logits, labels)` is
−log softmax(logits)[row, label] per row of [batch, classes] logits with i32 labels [batch];
`cross_entropy_rows_grad(logits, labels, g)` its gradient w.r.t. the logits, (softmax −
onehot)·g[row] (rewrite/reductions.py makes both). Both carry `ignore_index`, as `pick` and
`scatter_rows` do (ir/ops/indexing.py): a row whose label is it gives 0 and a gradient row of zeros.
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import INT, Attr, Op, ShapeError, normalize_axes, require_float

FAMILY = "rows"


def infer_row_op(name):
    def infer(types, attrs) -> TensorType:
        require_float(types, name)
        if types[0].rank == 0:
            raise ShapeError(f"{name}: expected a tensor with at least one dim, got {types[0]}")
        normalize_axes(attrs["axis"], types[0].rank, name)
        for t in types[1:]:
            if t.shape != types[0].shape:
                raise ShapeError(f"{name}: operands {types[0]} and {t} differ in shape")
        return types[0]

    return infer


def stable_exp(x: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(exp(x − max), Σ exp(x − max)) along `axis`, keeping dims: the max-shifted softmax pieces."""
    shifted = np.exp(x - x.max(axis=axis, keepdims=True))
    return shifted, shifted.sum(axis=axis, keepdims=True)


def evaluate_softmax(x, axis):
    """exp(x − max) / Σ exp(x − max) along `axis`."""
    numerator, total = stable_exp(x, axis)
    return numerator / total


def evaluate_log_softmax(x, axis):
    """x − max − log Σ exp(x − max) along `axis`."""
    _, total = stable_exp(x, axis)
    return x - x.max(axis=axis, keepdims=True) - np.log(total)


def evaluate_softmax_grad(y, g, axis):
    """The VJP of y = softmax(x): y·(g − Σ g·y) along `axis`."""
    return y * (g - (g * y).sum(axis=axis, keepdims=True))


def evaluate_log_softmax_grad(y, g, axis):
    """The VJP of y = log_softmax(x): g − exp(y)·Σ g along `axis`."""
    return g - np.exp(y) * g.sum(axis=axis, keepdims=True)


AXIS = (Attr("axis", INT),)


def row_op(name: str, evaluate, operands, doc: str) -> Op:
    return Op(
        name,
        family=FAMILY,
        infer=infer_row_op(name),
        evaluate=evaluate,
        operands=operands,
        attrs=AXIS,
        describe=lambda node: f"axis {node.attr('axis')}",
        doc=doc,
    )


SOFTMAX = row_op("softmax", evaluate_softmax, ("x",), "exp(x) / Σ exp(x) along `axis`, stably")
LOG_SOFTMAX = row_op("log_softmax", evaluate_log_softmax, ("x",), "x − log Σ exp(x) along `axis`, stably")
SOFTMAX_GRAD = row_op("softmax_grad", evaluate_softmax_grad, ("y", "g"), "softmax's VJP from its output y")
LOG_SOFTMAX_GRAD = row_op(
    "log_softmax_grad", evaluate_log_softmax_grad, ("y", "g"), "log_softmax's VJP from its output y"
)


@SOFTMAX.vjp
def _softmax(b, node, g):
    return [b.emit("softmax_grad", [node.id, g], axis=node.attr("axis"))]


@LOG_SOFTMAX.vjp
def _log_softmax(b, node, g):
    return [b.emit("log_softmax_grad", [node.id, g], axis=node.attr("axis"))]


# ---------------------------------------------------------------------------------------------
# Cross-entropy with integer labels, one value per row (the mean is an ordinary reduction).


IGNORE_INDEX = -100  # PyTorch's default ignore_index of nll_loss and cross_entropy
IGNORE = (Attr("ignore_index", INT, IGNORE_INDEX),)


def check_labels(op: str, labels: TensorType, rows: int, what: str) -> None:
    if labels.dtype != "i32" or labels.shape != (rows,):
        raise ShapeError(f"{op}: expected i32 class labels [{rows}] for {what}, got {labels}")


def infer_ce_rows(types, attrs) -> TensorType:
    logits, labels = types[0], types[1]
    if logits.rank != 2 or logits.dtype != "f32":
        raise ShapeError(f"cross_entropy: expected f32 logits [batch, classes], got {logits}")
    check_labels("cross_entropy", labels, logits.shape[0], f"logits {logits}")
    return TensorType(logits.shape[:1], "f32")


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def evaluate_ce_rows(logits, labels, ignore_index=IGNORE_INDEX):
    """−log softmax(logits)[row, label] for each row: 0 where the label is ignore_index, NaN
    where it is otherwise outside [0, classes)."""
    labels = labels.astype(np.int64)
    valid = (labels >= 0) & (labels < logits.shape[1])
    rows = -log_softmax_rows(logits)[np.arange(logits.shape[0]), np.where(valid, labels, 0)]
    return np.where(labels == ignore_index, 0.0, np.where(valid, rows, np.nan)).astype(logits.dtype)


def infer_ce_rows_grad(types, attrs) -> TensorType:
    infer_ce_rows(types[:2], attrs)
    if types[2].shape != types[0].shape[:1]:
        raise ShapeError(f"cross_entropy_rows_grad: gradient {types[2]} does not match the rows of {types[0]}")
    return types[0]


def evaluate_ce_rows_grad(logits, labels, grad, ignore_index=IGNORE_INDEX):
    """(softmax(logits) − onehot(labels)) · grad[row]: a row of zeros where the label is
    ignore_index, of NaN where it is otherwise outside [0, classes)."""
    labels = labels.astype(np.int64)
    valid = (labels >= 0) & (labels < logits.shape[1])
    probs = np.exp(log_softmax_rows(logits))
    probs[np.arange(logits.shape[0]), np.where(valid, labels, 0)] -= valid
    out = np.where(valid[:, None], probs * grad[:, None], np.nan)
    return np.where((labels == ignore_index)[:, None], 0.0, out).astype(logits.dtype)


CROSS_ENTROPY_ROWS = Op(
    "cross_entropy_rows",
    family=FAMILY,
    infer=infer_ce_rows,
    evaluate=evaluate_ce_rows,
    operands=("logits", "labels"),
    attrs=IGNORE,
    doc="−log softmax(logits)[row, label] per row (0 where the label is ignore_index)",
)
CROSS_ENTROPY_ROWS_GRAD = Op(
    "cross_entropy_rows_grad",
    family=FAMILY,
    infer=infer_ce_rows_grad,
    evaluate=evaluate_ce_rows_grad,
    operands=("logits", "labels", "g"),
    attrs=IGNORE,
    doc="(softmax(logits) − onehot(labels))·g[row]: cross_entropy_rows's VJP",
)


@CROSS_ENTROPY_ROWS.vjp
def _ce_rows(b, node, g):
    logits, labels = node.inputs
    return [b.emit("cross_entropy_rows_grad", [logits, labels, g], ignore_index=node.attr("ignore_index")), None]
