"""The op table: for every IR op, its arity, its shape rule and its numpy semantics.

Everything that knows "what an op means" reads this table: tracing checks shapes with
`OpDef.infer`, the interpreter runs `OpDef.evaluate`, the code generator and the e-graph
encoder look ops up by name. Gradients live in `autodiff.py`.

Ops are grouped by kind:
- leaves: input, param, state (persistent buffers), const (a scalar), causal_mask (an additive
  causal mask computed by a kernel);
- elementwise: unary and broadcasting binary ops (the functions of `expr.py`);
- shape and reduction: reshape, broadcast_to, permute, sum, max;
- matmul (batched over leading dims, optionally transposed operands);
- fused kernels, produced only by the e-graph: fused_matmul (a matmul with an epilogue
  expression, and optionally a prologue expression applied to A as it is loaded), pointwise
  (one expression over broadcast inputs), fused_reduce (a reduction with prologue and epilogue
  expressions);
- losses: cross_entropy_rows and its gradient;
- rows: softmax, log_softmax and their gradients along one axis; pick and scatter_rows (label
  indexing for nll_loss, and its gradient);
- indexing: gather and scatter_add (embedding lookup and its gradient), slice and slice_grad,
  concat;
- optimizer updates: sgd_step, momentum_buffer, adam_moment, adam_step;
- transformer ops, in `transformer_ops.py`: rope (rotary position embeddings) and rope_grad;
  attention (fused softmax(q·kᵀ·scale)·v with grouped KV heads and a causal mask), attention_lse
  and the backward ops attention_grad_q/k/v;
- image ops (NCHW), in `conv_ops.py`: unfold, fold (the plain form of a convolution), the
  kernels the e-graph makes of them, and pooling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from meganeura.ir.expr import BINARY_FUNCTIONS, NUMPY_FUNCTIONS, UNARY_FUNCTIONS, variables
from meganeura.ir.expr import evaluate as evaluate_expr
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import TensorType


class ShapeError(ValueError):
    """A shape or dtype mismatch found while tracing; the message names the user's file and line."""


@dataclass(frozen=True)
class OpDef:
    """What one op means: how many inputs, the result type, and how numpy computes it."""

    name: str
    kind: str  # "leaf", "unary", "binary", "shape", "matmul", "loss", "rows", "attention", "optimizer"
    arity: int | None  # None: variable
    infer: Callable[[list[TensorType], dict[str, Any]], TensorType]
    evaluate: Callable[..., np.ndarray]


OPS: dict[str, OpDef] = {}


def register(name: str, kind: str, arity: int | None, infer, evaluate) -> None:
    OPS[name] = OpDef(name, kind, arity, infer, evaluate)


def op_def(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown IR op {name!r}") from None


# ---------------------------------------------------------------------------------------------
# Shape helpers


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...], op: str = "op") -> tuple[int, ...]:
    """numpy's broadcasting rule, with an error that shows both shapes."""
    rank = max(len(a), len(b))
    pa = (1,) * (rank - len(a)) + a
    pb = (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(pa, pb, strict=True):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"{op}: shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(out)


def require_float(types: list[TensorType], op: str) -> None:
    for t in types:
        if t.dtype != "f32":
            raise ShapeError(f"{op}: expected f32 operands, got {t}")


def normalize_axes(axes, rank: int, op: str = "sum") -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = (axes,)
    result = []
    for axis in axes:
        if not -rank <= axis < max(rank, 1):
            raise ShapeError(f"{op}: dim {axis} is out of range for a tensor of rank {rank}")
        result.append(axis % rank if rank else 0)
    if len(set(result)) != len(result):
        raise ShapeError(f"{op}: repeated dims {tuple(axes)}")
    return tuple(sorted(result))


# ---------------------------------------------------------------------------------------------
# Leaves


def infer_leaf(types, attrs) -> TensorType:
    return TensorType(tuple(attrs["shape"]), attrs.get("dtype", "f32"))


def evaluate_leaf(*_args, **_attrs):
    raise RuntimeError("leaves are bound by the interpreter, not evaluated")


for _leaf in ("input", "param", "state"):
    register(_leaf, "leaf", 0, infer_leaf, evaluate_leaf)


def infer_const(types, attrs) -> TensorType:
    return TensorType((), attrs.get("dtype", "f32"))


register("const", "leaf", 0, infer_const, lambda **attrs: np.asarray(attrs["value"]))

# causal_mask(rows, cols): an additive f32 [rows, cols] mask, 0 where key j ≤ query i and
# CAUSAL_MASK_VALUE above the diagonal (top-left aligned, as `attention`'s causal flag). No
# operands; a kernel computes it from the index. The recognition rules match it (attention).
CAUSAL_MASK_VALUE = -1e9


def infer_causal_mask(types, attrs) -> TensorType:
    rows, cols = attrs["rows"], attrs["cols"]
    if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in (rows, cols)):
        raise ShapeError(f"causal_mask: expected positive integer sizes, got {rows} and {cols}")
    return TensorType((rows, cols), "f32")


def evaluate_causal_mask(rows, cols):
    hidden = np.arange(cols)[None, :] > np.arange(rows)[:, None]
    return np.where(hidden, np.float32(CAUSAL_MASK_VALUE), np.float32(0.0)).astype(np.float32)


register("causal_mask", "leaf", 0, infer_causal_mask, evaluate_causal_mask)


# ---------------------------------------------------------------------------------------------
# Elementwise ops. The WGSL code generator has one expression per name (codegen/expressions.py).


UNARY_NUMPY: dict[str, Callable[[np.ndarray], np.ndarray]] = {name: NUMPY_FUNCTIONS[name] for name in UNARY_FUNCTIONS}
BINARY_NUMPY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    name: NUMPY_FUNCTIONS[name] for name in BINARY_FUNCTIONS
}


def infer_unary(name):
    def infer(types, attrs) -> TensorType:
        require_float(types, name)
        return types[0]

    return infer


def infer_binary(name):
    def infer(types, attrs) -> TensorType:
        require_float(types, name)
        return TensorType(broadcast_shapes(types[0].shape, types[1].shape, name), "f32")

    return infer


for _name, _fn in UNARY_NUMPY.items():
    register(_name, "unary", 1, infer_unary(_name), (lambda fn: lambda x, **_: fn(x))(_fn))
for _name, _fn in BINARY_NUMPY.items():
    register(_name, "binary", 2, infer_binary(_name), (lambda fn: lambda a, b, **_: fn(a, b))(_fn))


# ---------------------------------------------------------------------------------------------
# Shape ops


def infer_reshape(types, attrs) -> TensorType:
    shape = tuple(attrs["shape"])
    target = TensorType(shape, types[0].dtype)
    if target.numel != types[0].numel:
        raise ShapeError(f"reshape: cannot reshape {types[0]} ({types[0].numel} elements) to {list(shape)}")
    return target


def infer_broadcast_to(types, attrs) -> TensorType:
    shape = tuple(attrs["shape"])
    if broadcast_shapes(types[0].shape, shape, "broadcast_to") != shape:
        raise ShapeError(f"broadcast_to: cannot broadcast {types[0]} to {list(shape)}")
    return TensorType(shape, types[0].dtype)


def infer_sum(types, attrs) -> TensorType:
    require_float(types, "sum")
    shape = types[0].shape
    axes = normalize_axes(attrs["axes"], len(shape))
    if attrs.get("keepdim", False):
        out = tuple(1 if i in axes else d for i, d in enumerate(shape))
    else:
        out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return TensorType(out, "f32")


register("reshape", "shape", 1, infer_reshape, lambda x, shape: np.reshape(x, shape))
register("broadcast_to", "shape", 1, infer_broadcast_to, lambda x, shape: np.broadcast_to(x, shape).copy())
register(
    "sum",
    "reduce",
    1,
    infer_sum,
    lambda x, axes, keepdim=False: np.asarray(np.sum(x, axis=tuple(axes), keepdims=keepdim)),
)
register(
    "max",
    "reduce",
    1,
    infer_sum,
    lambda x, axes, keepdim=False: np.asarray(np.max(x, axis=tuple(axes), keepdims=keepdim)),
)


def infer_permute(types, attrs) -> TensorType:
    perm = tuple(attrs["perm"])
    shape = types[0].shape
    if sorted(perm) != list(range(len(shape))):
        raise ShapeError(f"permute: {list(perm)} is not a permutation of the {len(shape)} dims of {types[0]}")
    return TensorType(tuple(shape[p] for p in perm), types[0].dtype)


register("permute", "shape", 1, infer_permute, lambda x, perm: np.transpose(x, perm).copy())


# ---------------------------------------------------------------------------------------------
# Matmul over the last two dims, with equal leading (batch) dims; transpose flags swap the last
# two dims of an operand, so autodiff and the algebra rules express Aᵀ·B and A·Bᵀ without copies.


def matmul_dims(types, attrs, op="matmul") -> tuple[tuple[int, ...], int, int, int]:
    """(batch dims, M, K, N) of a (possibly transposed) matmul, checking that the operands fit.

    Both operands have the same leading (batch) dims, or one of them is 2-D and shared by every
    matrix of the other (a Linear applied to [batch, seq, features] is one matmul).
    """
    a, b = types[0], types[1]
    require_float([a, b], op)
    if a.rank < 2 or b.rank < 2:
        raise ShapeError(f"{op}: expected operands of rank >= 2, got {a} and {b}")
    if a.rank > 2 and b.rank > 2 and a.shape[:-2] != b.shape[:-2]:
        raise ShapeError(f"{op}: batch dimensions differ: {a} and {b}")
    m, k = (a.shape[-1], a.shape[-2]) if attrs.get("transpose_a") else a.shape[-2:]
    k2, n = (b.shape[-1], b.shape[-2]) if attrs.get("transpose_b") else b.shape[-2:]
    if k != k2:
        raise ShapeError(
            f"{op}: inner dimensions differ: {a}{'ᵀ' if attrs.get('transpose_a') else ''} "
            f"@ {b}{'ᵀ' if attrs.get('transpose_b') else ''} ({k} vs {k2})"
        )
    return a.shape[:-2] or b.shape[:-2], m, k, n


def infer_matmul(types, attrs) -> TensorType:
    batch, m, _, n = matmul_dims(types, attrs)
    return TensorType((*batch, m, n), "f32")


def evaluate_matmul(a, b, transpose_a=False, transpose_b=False):
    a = np.swapaxes(a, -1, -2) if transpose_a else a
    b = np.swapaxes(b, -1, -2) if transpose_b else b
    return a @ b


register("matmul", "matmul", 2, infer_matmul, evaluate_matmul)


def check_expr(op: str, text: str, allowed: set[str]) -> None:
    """Raise a ShapeError if expression `text` does not parse or reads a value not in `allowed`."""
    try:
        names = variables(parse_expr(text))
    except ValueError as error:
        raise ShapeError(f"{op}: {error}") from None
    unknown = names - allowed
    if unknown:
        raise ShapeError(f"{op}: expression {text!r} reads ${', $'.join(sorted(unknown))}, which it is not given")


def matmul_a_view(a: TensorType, attrs) -> TensorType:
    """A as the product sees it: with `flatten_a`, the stored A [..., K] read as the matrix
    [rows, K] of its row-major flattening (a prologue over a [batch, seq, features] tensor
    feeding a Linear, which multiplies its rows)."""
    if attrs.get("flatten_a"):
        rows = 1
        for d in a.shape[:-1]:
            rows *= d
        return TensorType((rows, a.shape[-1]), a.dtype)
    return a


def infer_fused_matmul(types, attrs) -> TensorType:
    batch, m, _, n = matmul_dims([matmul_a_view(types[0], attrs), *types[1:]], attrs, "fused_matmul")
    out = TensorType((*batch, m, n), "f32")
    extras = types[2:]
    names = set(map(str, range(len(extras))))
    prologue_text, epilogue_text = attrs.get("prologue", "$a"), attrs.get("epilogue", "$acc")
    check_expr("fused_matmul", prologue_text, {"a", *names})
    check_expr("fused_matmul", epilogue_text, {"acc", *names})
    in_prologue = variables(parse_expr(prologue_text))
    in_epilogue = variables(parse_expr(epilogue_text))
    for index, extra in enumerate(extras):
        name = str(index)
        if name in in_prologue and not broadcasts_to(extra.shape, types[0].shape):
            raise ShapeError(f"fused_matmul: prologue input ${index} {extra} does not broadcast to A {types[0]}")
        if (name in in_epilogue or name not in in_prologue) and not broadcasts_to(extra.shape, out.shape):
            raise ShapeError(f"fused_matmul: epilogue input ${index} {extra} does not broadcast to {out}")
    return out


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return broadcast_shapes(shape, target) == target
    except ShapeError:
        return False


def evaluate_fused_matmul(
    a, b, *extras, transpose_a=False, transpose_b=False, epilogue="$acc", prologue="$a", flatten_a=False
):
    """epilogue(prologue(A, extras…) · B, extras…): the matmul with its prologue and epilogue, as one
    kernel computes it.

    The prologue reads `$a`, the element of A as stored (before any transpose), and extras
    broadcast to A's stored shape; it is applied while A is loaded, so its result is never
    written. The epilogue reads `$acc`, the dot product, and extras broadcast to the output.
    Both number the extras (inputs[2:]) the same way, `$0`, `$1`…; an extra that only the
    prologue reads need not broadcast to the output. With `flatten_a`, A (after the prologue) is
    read as the matrix of its rows (`matmul_a_view`).
    """
    if prologue != "$a":
        values = {"a": a, **{str(i): x for i, x in enumerate(extras)}}
        a = np.broadcast_to(evaluate_expr(prologue, values, a.dtype), a.shape)
    if flatten_a:
        a = a.reshape(-1, a.shape[-1])
    acc = evaluate_matmul(a, b, transpose_a, transpose_b)
    values = {"acc": acc, **{str(i): x for i, x in enumerate(extras)}}
    return np.broadcast_to(evaluate_expr(epilogue, values, acc.dtype), acc.shape)


register("fused_matmul", "matmul", None, infer_fused_matmul, evaluate_fused_matmul)


# ---------------------------------------------------------------------------------------------
# Fused elementwise and reduction kernels, produced by the e-graph's pointwise and reduction rules.


def infer_pointwise(types, attrs) -> TensorType:
    shape = tuple(attrs["shape"])
    require_float(types, "pointwise")
    for index, t in enumerate(types):
        if broadcast_shapes(t.shape, shape, "pointwise") != shape:
            raise ShapeError(f"pointwise: input ${index} {t} does not broadcast to {list(shape)}")
    check_expr("pointwise", attrs["expr"], set(map(str, range(len(types)))))
    return TensorType(shape, "f32")


def evaluate_pointwise(*inputs, expr, shape):
    """expr($0, $1, …) with every input broadcast to `shape`."""
    values = {str(i): x for i, x in enumerate(inputs)}
    dtype = inputs[0].dtype if inputs else np.float32
    return np.broadcast_to(evaluate_expr(expr, values, dtype), tuple(shape)).copy()


register("pointwise", "pointwise", None, infer_pointwise, evaluate_pointwise)

REDUCE_KINDS = ("sum", "max")


def infer_fused_reduce(types, attrs) -> TensorType:
    in_shape = tuple(attrs["in_shape"])
    require_float(types, "fused_reduce")
    if attrs["kind"] not in REDUCE_KINDS:
        raise ShapeError(f"fused_reduce: unknown kind {attrs['kind']!r}")
    for index, t in enumerate(types):
        if broadcast_shapes(t.shape, in_shape, "fused_reduce") != in_shape:
            raise ShapeError(f"fused_reduce: input ${index} {t} does not broadcast to {list(in_shape)}")
    check_expr("fused_reduce", attrs.get("prologue", "$0"), set(map(str, range(len(types)))))
    check_expr("fused_reduce", attrs.get("epilogue", "$r"), {"r"})
    return infer_sum([TensorType(in_shape)], attrs)


def evaluate_fused_reduce(*inputs, kind, axes, keepdim, in_shape, prologue="$0", epilogue="$r"):
    """epilogue(reduce(prologue($0, $1, …) over `axes`)): a reduction with elementwise ends."""
    values = {str(i): x for i, x in enumerate(inputs)}
    dtype = inputs[0].dtype if inputs else np.float32
    body = np.broadcast_to(evaluate_expr(prologue, values, dtype), tuple(in_shape))
    reduce = np.sum if kind == "sum" else np.max
    reduced = np.asarray(reduce(body, axis=tuple(axes), keepdims=keepdim))
    return np.asarray(evaluate_expr(epilogue, {"r": reduced}, dtype))


register("fused_reduce", "reduce", None, infer_fused_reduce, evaluate_fused_reduce)


# ---------------------------------------------------------------------------------------------
# Cross-entropy with integer labels, one value per row (the mean is an ordinary reduction).


def infer_ce_rows(types, attrs) -> TensorType:
    logits, labels = types[0], types[1]
    if logits.rank != 2 or logits.dtype != "f32":
        raise ShapeError(f"cross_entropy: expected f32 logits [batch, classes], got {logits}")
    if labels.dtype != "i32" or labels.shape != logits.shape[:1]:
        raise ShapeError(
            f"cross_entropy: expected i32 class labels [{logits.shape[0]}] for logits {logits}, got {labels}"
        )
    return TensorType(logits.shape[:1], "f32")


def log_softmax_rows(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def evaluate_ce_rows(logits, labels):
    """−log softmax(logits)[row, label] for each row."""
    logp = log_softmax_rows(logits)
    return -logp[np.arange(logits.shape[0]), labels.astype(np.int64)]


def infer_ce_rows_grad(types, attrs) -> TensorType:
    infer_ce_rows(types[:2], attrs)
    if types[2].shape != types[0].shape[:1]:
        raise ShapeError(f"cross_entropy_rows_grad: gradient {types[2]} does not match the rows of {types[0]}")
    return types[0]


def evaluate_ce_rows_grad(logits, labels, grad):
    """(softmax(logits) − onehot(labels)) · grad[row]."""
    probs = np.exp(log_softmax_rows(logits))
    probs[np.arange(logits.shape[0]), labels.astype(np.int64)] -= 1.0
    return probs * grad[:, None]


register("cross_entropy_rows", "loss", 2, infer_ce_rows, evaluate_ce_rows)
register("cross_entropy_rows_grad", "loss", 3, infer_ce_rows_grad, evaluate_ce_rows_grad)


# ---------------------------------------------------------------------------------------------
# Softmax along one axis, its gradient, and label indexing. Each row (the values along `axis`
# for fixed other indices) is one workgroup's work on the device (shaders/softmax.wgsl): the
# reductions inside (max, Σ) never leave the kernel and need no ones-matrix or broadcast copy.
# `pick`/`scatter_rows` are nll_loss's indexing and its gradient; the reductions rules turn
# pick(log_softmax(x)) and its gradient into the fused cross_entropy_rows kernels.


def infer_row_op(name):
    def infer(types, attrs) -> TensorType:
        require_float(types, name)
        if types[0].rank == 0 or not isinstance(attrs["axis"], int):
            raise ShapeError(f"{name}: expected a tensor with at least one dim and an int axis, got {types[0]}")
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


for _name, _fn in (
    ("softmax", evaluate_softmax),
    ("log_softmax", evaluate_log_softmax),
    ("softmax_grad", evaluate_softmax_grad),
    ("log_softmax_grad", evaluate_log_softmax_grad),
):
    register(_name, "rows", 2 if _name.endswith("_grad") else 1, infer_row_op(_name), _fn)


def check_labels(op: str, labels: TensorType, rows: int, what: str) -> None:
    if labels.dtype != "i32" or labels.shape != (rows,):
        raise ShapeError(f"{op}: expected i32 class labels [{rows}] for {what}, got {labels}")


def infer_pick(types, attrs) -> TensorType:
    x, labels = types
    if x.rank != 2 or x.dtype != "f32":
        raise ShapeError(f"pick: expected f32 values [batch, classes], got {x}")
    check_labels("pick", labels, x.shape[0], f"values {x}")
    return TensorType(x.shape[:1], "f32")


def valid_labels(labels: np.ndarray, classes: int) -> np.ndarray:
    return (labels >= 0) & (labels < classes)


def evaluate_pick(x, labels):
    """x[row, labels[row]] for each row (NaN where a label is outside [0, classes), as on the device)."""
    labels = labels.astype(np.int64)
    valid = valid_labels(labels, x.shape[1])
    picked = x[np.arange(x.shape[0]), np.where(valid, labels, 0)]
    return np.where(valid, picked, np.nan).astype(x.dtype)


def infer_scatter_rows(types, attrs) -> TensorType:
    g, labels = types
    require_float([g], "scatter_rows")
    classes = attrs["classes"]
    if g.rank != 1 or not isinstance(classes, int) or classes < 1:
        raise ShapeError(f"scatter_rows: expected f32 values [batch] and classes >= 1, got {g} and {classes!r}")
    check_labels("scatter_rows", labels, g.shape[0], f"values {g}")
    return TensorType((g.shape[0], classes), "f32")


def evaluate_scatter_rows(g, labels, classes):
    """out[row, c] = g[row] if c == labels[row] else 0: pick's VJP (a row of NaN for a bad label)."""
    labels = labels.astype(np.int64)
    out = (np.arange(classes)[None, :] == labels[:, None]) * g[:, None]
    return np.where(valid_labels(labels, classes)[:, None], out, np.nan).astype(g.dtype)


register("pick", "rows", 2, infer_pick, evaluate_pick)
register("scatter_rows", "rows", 2, infer_scatter_rows, evaluate_scatter_rows)


# ---------------------------------------------------------------------------------------------
# Indexing: embedding lookup (gather) and its gradient (scatter_add), slices and concatenation.
# `gather`/`scatter_add` follow pick/scatter_rows: an id outside [0, num) gives a row of NaN
# forward and contributes nothing backward. `slice` keeps per-dim start/stop/step (normalised:
# 0 <= start <= stop <= dim, step >= 1); `slice_grad` writes a slice's gradient into zeros of the
# sliced tensor's shape; `concat` joins any number of tensors along one axis.


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


def infer_scatter_add(types, attrs) -> TensorType:
    g, ids = types
    require_float([g], "scatter_add")
    num = attrs["num"]
    if ids.dtype != "i32" or g.rank != ids.rank + 1 or g.shape[:-1] != ids.shape:
        raise ShapeError(f"scatter_add: expected values [..., dim] for i32 indices [...], got {g} and {ids}")
    if not isinstance(num, int) or num < 1:
        raise ShapeError(f"scatter_add: expected num >= 1, got {num!r}")
    return TensorType((num, g.shape[-1]), "f32")


def evaluate_scatter_add(g, ids, num):
    """out[r, c] = Σ g[j, c] over the j with ids[j] == r: gather's VJP (ids outside [0, num) are skipped)."""
    ids = ids.astype(np.int64).reshape(-1)
    rows = g.reshape(ids.size, g.shape[-1])
    valid = valid_labels(ids, num)
    out = np.zeros((num, g.shape[-1]), dtype=g.dtype)
    np.add.at(out, ids[valid], rows[valid])
    return out


register("gather", "rows", 2, infer_gather, evaluate_gather)
register("scatter_add", "rows", 2, infer_scatter_add, evaluate_scatter_add)


def slice_shape(shape: tuple[int, ...], attrs, op: str) -> tuple[int, ...]:
    """The shape of `shape` sliced by attrs starts/stops/steps (checked to be normalised)."""
    starts, stops, steps = (tuple(attrs[key]) for key in ("starts", "stops", "steps"))
    if not len(starts) == len(stops) == len(steps) == len(shape):
        raise ShapeError(f"{op}: expected one start, stop and step per dim of {list(shape)}")
    out = []
    for d, start, stop, step in zip(shape, starts, stops, steps, strict=True):
        if not (isinstance(step, int) and step >= 1 and 0 <= start <= stop <= d):
            raise ShapeError(f"{op}: bad slice {start}:{stop}:{step} of a dim of size {d}")
        out.append(-(-(stop - start) // step))
    return tuple(out)


def slices_of(starts, stops, steps) -> tuple[slice, ...]:
    return tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps, strict=True))


def infer_slice(types, attrs) -> TensorType:
    return TensorType(slice_shape(types[0].shape, attrs, "slice"), types[0].dtype)


def infer_slice_grad(types, attrs) -> TensorType:
    shape = tuple(attrs["shape"])
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


register("slice", "shape", 1, infer_slice, evaluate_slice)
register("slice_grad", "shape", 1, infer_slice_grad, evaluate_slice_grad)


def infer_concat(types, attrs) -> TensorType:
    if not types:
        raise ShapeError("cat: expected at least one tensor")
    first, axis = types[0], attrs["axis"]
    if first.rank == 0 or not isinstance(axis, int) or not 0 <= axis < first.rank:
        raise ShapeError(f"cat: expected tensors with at least one dim and a dim in range, got {first} and {axis!r}")
    for t in types[1:]:
        others_differ = t.shape[:axis] + t.shape[axis + 1 :] != first.shape[:axis] + first.shape[axis + 1 :]
        if t.rank != first.rank or t.dtype != first.dtype or others_differ:
            raise ShapeError(f"cat: {t} does not match {first} outside dim {axis}")
    total = sum(t.shape[axis] for t in types)
    return TensorType((*first.shape[:axis], total, *first.shape[axis + 1 :]), first.dtype)


register("concat", "shape", None, infer_concat, lambda *xs, axis: np.concatenate(xs, axis=axis))


# ---------------------------------------------------------------------------------------------
# Optimizer updates: elementwise, PyTorch's rules. The first input is the value being replaced,
# so the runtime can update it in place.


def infer_same_as_first(types, attrs) -> TensorType:
    require_float(types, "optimizer update")
    for t in types[1:]:
        if t.shape not in (types[0].shape, ()):
            raise ShapeError(f"optimizer update: {t} does not match {types[0]}")
    return types[0]


def evaluate_sgd_step(p, d, lr, weight_decay=0.0):
    """p − lr·(d + weight_decay·p)."""
    return p - lr * (d + weight_decay * p)


def evaluate_momentum_buffer(buf, g, p, momentum, weight_decay=0.0):
    """momentum·buf + (g + weight_decay·p)."""
    return momentum * buf + (g + weight_decay * p)


def evaluate_adam_moment(m, g, p, beta, order, weight_decay=0.0):
    """beta·m + (1−beta)·gᵒʳᵈᵉʳ, with g = grad + weight_decay·p (Adam's L2 form)."""
    g = g + weight_decay * p
    return beta * m + (1.0 - beta) * (g if order == 1 else g * g)


def evaluate_adam_step(p, m, v, t, lr, beta1, beta2, eps, weight_decay=0.0):
    """p·(1 − lr·wd) − lr·m̂/(√v̂ + eps): AdamW's decoupled decay (weight_decay=0 for Adam)."""
    bias1 = 1.0 - beta1**t
    bias2 = 1.0 - beta2**t
    p = p * (1.0 - lr * weight_decay)
    return p - (lr / bias1) * m / (np.sqrt(v) / np.sqrt(bias2) + eps)


register("sgd_step", "optimizer", 2, infer_same_as_first, evaluate_sgd_step)
register("momentum_buffer", "optimizer", 3, infer_same_as_first, evaluate_momentum_buffer)
register("adam_moment", "optimizer", 3, infer_same_as_first, evaluate_adam_moment)
register("adam_step", "optimizer", 4, infer_same_as_first, evaluate_adam_step)


def infer_type(op: str, types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    """The result type of `op` on operands `types`, or a ShapeError saying what did not fit."""
    definition = op_def(op)
    if definition.arity is not None and len(types) != definition.arity:
        raise ShapeError(f"{op}: expected {definition.arity} operands, got {len(types)}")
    return definition.infer(types, attrs)


def launches_kernel(op: str) -> bool:
    """Whether a node of this op runs a GPU kernel (leaves and reshapes are only buffers/views)."""
    return op not in ("input", "param", "state", "const", "reshape")


# The transformer ops (rope, attention) and the image ops (unfold, fold, convolution kernels,
# pooling) register themselves from their own modules; importing them here keeps `OPS` complete
# for everyone who imports this one.
from meganeura.ir import conv_ops, transformer_ops  # noqa: E402, F401
