"""Functional ops with PyTorch's names and semantics (`import meganeura.functional as F`).

Each function emits IR through the active trace; Python numbers are lifted to constants.

>>> # inside forward(): F.relu(F.linear(x, self.weight, self.bias))
"""

from __future__ import annotations

from meganeura.ir.ops import ShapeError, normalize_axes
from meganeura.ir.trace import Tensor, lift, user_source_line

__all__ = [
    "add", "cross_entropy", "exp", "linear", "log", "matmul", "mean", "mse_loss", "relu",
    "reshape", "sigmoid", "sqrt", "sum", "tanh", "transpose2d",
]  # fmt: skip


def unary(op: str, x: Tensor) -> Tensor:
    x = lift(x)
    return x.tracer.emit(op, [x])


def relu(x: Tensor) -> Tensor:
    """max(x, 0), elementwise."""
    return unary("relu", x)


def sigmoid(x: Tensor) -> Tensor:
    """1 / (1 + exp(−x)), elementwise."""
    return unary("sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    """Hyperbolic tangent, elementwise."""
    return unary("tanh", x)


def exp(x: Tensor) -> Tensor:
    """eˣ, elementwise."""
    return unary("exp", x)


def log(x: Tensor) -> Tensor:
    """Natural logarithm, elementwise."""
    return unary("log", x)


def sqrt(x: Tensor) -> Tensor:
    """Square root, elementwise."""
    return unary("sqrt", x)


def add(x: Tensor, y: Tensor) -> Tensor:
    """x + y with broadcasting."""
    return lift(x) + y


def reshape(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The same elements in a new shape; one dimension may be −1."""
    x = lift(x)
    shape = tuple(int(d) for d in shape)
    if shape.count(-1) > 1:
        raise ShapeError(f"{user_source_line()}: reshape: only one dimension can be -1, got {list(shape)}")
    if -1 in shape:
        known = 1
        for d in shape:
            if d != -1:
                known *= d
        if known == 0 or x.numel() % known:
            raise ShapeError(f"{user_source_line()}: reshape: cannot reshape {x.type} to {list(shape)}")
        shape = tuple(x.numel() // known if d == -1 else d for d in shape)
    if shape == x.shape:
        return x
    return x.tracer.emit("reshape", [x], shape=shape)


def sum(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Sum over `dim` (an int, a tuple, or None for all dims), like torch.sum."""
    x = lift(x)
    try:
        axes = normalize_axes(dim, x.ndim)
    except ShapeError as error:
        raise ShapeError(f"{user_source_line()}: {error}") from None
    return x.tracer.emit("sum", [x], axes=axes, keepdim=keepdim)


def mean(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Mean over `dim` (an int, a tuple, or None for all dims), like torch.mean."""
    x = lift(x)
    total = sum(x, dim, keepdim)
    count = x.numel() // max(total.numel(), 1)
    return total * (1.0 / count)


def transpose2d(x: Tensor) -> Tensor:
    """xᵀ of a 2-D tensor; consumed by matmul as a transposed operand (no copy)."""
    x = lift(x)
    if x.ndim != 2:
        raise ShapeError(f"{user_source_line()}: .T needs a 2-D tensor here, got {x.type}")
    return TransposedView(x)


class TransposedView(Tensor):
    """A lazy 2-D transpose: matmul reads it as a transposed operand."""

    def __init__(self, base: Tensor) -> None:
        self.base = base

    @property
    def tracer(self):
        return self.base.tracer

    @property
    def node(self):
        raise ShapeError(f"{user_source_line()}: a transposed tensor can only be used as a matmul operand for now")

    @property
    def type(self):
        from meganeura.ir.graph import TensorType

        rows, cols = self.base.shape
        return TensorType((cols, rows), self.base.dtype)

    @property
    def T(self) -> Tensor:
        return self.base


def split_transpose(x: Tensor) -> tuple[Tensor, bool]:
    if isinstance(x, TransposedView):
        return x.base, True
    return lift(x), False


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """a @ b for 2-D tensors; a with more dims is flattened to rows first, like torch.matmul."""
    a, ta = split_transpose(a)
    b, tb = split_transpose(b)
    if not ta and a.ndim > 2 and b.ndim == 2:
        lead = a.shape[:-1]
        rows = reshape(a, (-1, a.shape[-1]))
        out = a.tracer.emit("matmul", [rows, b], transpose_a=False, transpose_b=tb)
        return reshape(out, lead + (out.shape[-1],))
    return a.tracer.emit("matmul", [a, b], transpose_a=ta, transpose_b=tb)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x·weightᵀ + bias, with PyTorch's layout: weight [out, in], bias [out]."""
    y = matmul(x, transpose2d(weight))
    if bias is not None:
        y = y + bias
    return y


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of logits [batch, classes] with i32 class indices [batch].

    reduction is "mean" (PyTorch's default), "sum" or "none".
    """
    logits, target = lift(logits), lift(target)
    rows = logits.tracer.emit("cross_entropy_rows", [logits, target])
    return reduce_loss(rows, reduction, "cross_entropy")


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error, like torch.nn.functional.mse_loss."""
    input, target = lift(input), lift(target)
    if input.shape != target.shape:
        raise ShapeError(f"{user_source_line()}: mse_loss: input {input.type} and target {target.type} differ in shape")
    diff = input - target
    return reduce_loss(diff * diff, reduction, "mse_loss")


def reduce_loss(values: Tensor, reduction: str, name: str) -> Tensor:
    if reduction == "mean":
        return mean(values)
    if reduction == "sum":
        return sum(values)
    if reduction == "none":
        return values
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
