"""Tracing: the Tensor the user's code manipulates, and the context that records it as IR.

While `compile()` runs the user's model and loss, every op on a Tensor appends a node to the
current Graph, checks its shapes with the op table, and remembers the user's file and line
(the first stack frame outside this package). A shape error is raised as a ShapeError whose
message starts with that file and line.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.ops import ShapeError, infer_type, normalize_axes

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def user_source_line() -> str:
    """`file:line` of the innermost stack frame that is not in meganeura's own code."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(PACKAGE_DIR + os.sep):
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<meganeura>"


class Tracer:
    """Builds one Graph while the user's code runs."""

    def __init__(self) -> None:
        self.graph = Graph()
        self.const_cache: dict[tuple[float, str], int] = {}
        # id(Parameter or Buffer) -> the node it reads as now (a Buffer's last update, once updated)
        self.parameter_nodes: dict[int, int] = {}
        self.buffer_leaves: dict[int, int] = {}  # id(Buffer) -> its state leaf, which names its update

    def emit(self, op: str, inputs: list[Tensor], **attrs: Any) -> Tensor:
        """Append `op(inputs)` with a checked type and the user's source line; return its Tensor."""
        for t in inputs:
            if t.tracer is not self:
                raise ValueError(f"{op}: operand comes from another trace (a Tensor kept from an earlier compile?)")
        source = user_source_line()
        try:
            out_type = infer_type(op, [t.type for t in inputs], attrs)
        except ShapeError as error:
            raise ShapeError(f"{source}: {error}") from None
        node_id = self.graph.add(op, [t.node for t in inputs], out_type, attrs, (source,))
        return Tensor(self, node_id)

    def leaf(self, op: str, name: str, type: TensorType) -> Tensor:
        attrs = {"name": name, "shape": type.shape, "dtype": type.dtype}
        node_id = self.graph.add(op, (), type, attrs, (user_source_line(),))
        return Tensor(self, node_id)

    def const(self, value: float) -> Tensor:
        """A scalar f32 constant, shared between uses of the same value."""
        key = (float(value), "f32")
        if key not in self.const_cache:
            self.const_cache[key] = self.graph.add("const", (), TensorType((), "f32"), {"value": float(value)})
        return Tensor(self, self.const_cache[key])


_ACTIVE: list[Tracer] = []


@contextlib.contextmanager
def tracing(tracer: Tracer) -> Iterator[Tracer]:
    _ACTIVE.append(tracer)
    try:
        yield tracer
    finally:
        _ACTIVE.pop()


def active_tracer() -> Tracer:
    if not _ACTIVE:
        raise RuntimeError(
            "meganeura ops only run while compile() traces a model; call mn.compile(...) instead of the model"
        )
    return _ACTIVE[-1]


class Tensor:
    """A value being traced: a handle on one IR node, with PyTorch-like operators.

    >>> # inside a model's forward(): y = (x @ w.T + b).relu()
    """

    def __init__(self, tracer: Tracer, node: int) -> None:
        self.tracer = tracer
        self.node = node

    @property
    def type(self) -> TensorType:
        return self.tracer.graph[self.node].type

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return self.type.numel

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __repr__(self) -> str:
        return f"Tensor(%{self.node}: {self.type})"

    # Arithmetic, with Python scalars lifted to constants.
    def _lift(self, other: Any) -> Tensor:
        return lift(other, self.tracer)

    def __add__(self, other):
        return self.tracer.emit("add", [self, self._lift(other)])

    def __radd__(self, other):
        return self.tracer.emit("add", [self._lift(other), self])

    def __sub__(self, other):
        return self.tracer.emit("sub", [self, self._lift(other)])

    def __rsub__(self, other):
        return self.tracer.emit("sub", [self._lift(other), self])

    def __mul__(self, other):
        return self.tracer.emit("mul", [self, self._lift(other)])

    def __rmul__(self, other):
        return self.tracer.emit("mul", [self._lift(other), self])

    def __truediv__(self, other):
        return self.tracer.emit("div", [self, self._lift(other)])

    def __rtruediv__(self, other):
        return self.tracer.emit("div", [self._lift(other), self])

    def __neg__(self):
        return self.tracer.emit("neg", [self])

    def __matmul__(self, other):
        from meganeura import functional

        return functional.matmul(self, other)

    def __gt__(self, other):
        return self.tracer.emit("greater", [self, self._lift(other)])

    def __getitem__(self, key) -> Tensor:
        """Indexing with ints, slices (positive step), `...` and None, like torch (see F.getitem)."""
        from meganeura import functional

        return functional.getitem(self, key)

    def __bool__(self):
        raise TypeError("a traced Tensor has no truth value: its value is only known when the step runs")

    @property
    def T(self) -> Tensor:
        from meganeura import functional

        return functional.transpose2d(self)

    def t(self) -> Tensor:
        return self.T

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        from meganeura import functional

        return functional.transpose(self, dim0, dim1)

    def permute(self, *dims) -> Tensor:
        from meganeura import functional

        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        return functional.permute(self, dims)

    def silu(self):
        return self.tracer.emit("silu", [self])

    def expand(self, *shape) -> Tensor:
        """Broadcast to `shape` (−1 keeps a dim), like torch.Tensor.expand."""
        from meganeura import functional

        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        lead = len(shape) - self.ndim
        full = tuple(self.shape[i - lead] if d == -1 else d for i, d in enumerate(shape))
        return functional.broadcast_to(self, full)

    def softmax(self, dim: int = -1) -> Tensor:
        from meganeura import functional

        return functional.softmax(self, dim)

    def log_softmax(self, dim: int = -1) -> Tensor:
        from meganeura import functional

        return functional.log_softmax(self, dim)

    def rsqrt(self):
        return self.tracer.emit("rsqrt", [self])

    def amax(self, dim=None, keepdim: bool = False):
        from meganeura import functional

        return functional.amax(self, dim, keepdim)

    def relu(self):
        return self.tracer.emit("relu", [self])

    def sigmoid(self):
        return self.tracer.emit("sigmoid", [self])

    def tanh(self):
        return self.tracer.emit("tanh", [self])

    def exp(self):
        return self.tracer.emit("exp", [self])

    def log(self):
        return self.tracer.emit("log", [self])

    def sqrt(self):
        return self.tracer.emit("sqrt", [self])

    def sum(self, dim=None, keepdim: bool = False):
        from meganeura import functional

        return functional.sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim: bool = False):
        from meganeura import functional

        return functional.mean(self, dim, keepdim)

    def reshape(self, *shape):
        from meganeura import functional

        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return functional.reshape(self, shape)

    view = reshape

    def unsqueeze(self, dim: int) -> Tensor:
        """A dim of size 1 inserted at `dim` (a reshape), like torch.Tensor.unsqueeze."""
        from meganeura import functional

        if not -self.ndim - 1 <= dim <= self.ndim:
            raise ShapeError(f"{user_source_line()}: unsqueeze: dim {dim} is out of range for {self.type}")
        dim %= self.ndim + 1
        return functional.reshape(self, self.shape[:dim] + (1,) + self.shape[dim:])

    def squeeze(self, dim=None) -> Tensor:
        """The dims of size 1 among `dim` (an int, a tuple, or None for all) removed (a reshape);
        a named dim of another size is kept, like torch.Tensor.squeeze."""
        from meganeura import functional

        try:
            dims = normalize_axes(dim, self.ndim, "squeeze")
        except ShapeError as error:
            raise ShapeError(f"{user_source_line()}: {error}") from None
        shape = tuple(d for i, d in enumerate(self.shape) if i not in dims or d != 1)
        return functional.reshape(self, shape)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        """Dims start_dim…end_dim merged into one (a reshape), like torch.Tensor.flatten; a 0-d
        tensor becomes [1]."""
        from meganeura import functional

        if self.ndim == 0:
            return functional.reshape(self, (1,))
        try:
            start, end = (normalize_axes(d, self.ndim, "flatten")[0] for d in (start_dim, end_dim))
        except ShapeError as error:
            raise ShapeError(f"{user_source_line()}: {error}") from None
        if start > end:
            raise ShapeError(f"{user_source_line()}: flatten: start_dim {start_dim} comes after end_dim {end_dim}")
        merged = 1
        for d in self.shape[start : end + 1]:
            merged *= d
        return functional.reshape(self, self.shape[:start] + (merged,) + self.shape[end + 1 :])

    def contiguous(self) -> Tensor:
        """The tensor itself: traced tensors are always laid out densely."""
        return self

    def float(self) -> Tensor:
        """The tensor as f32 (torch.Tensor.float): the identity on f32; i32 values cannot be cast yet."""
        if self.dtype != "f32":
            raise ShapeError(f"{user_source_line()}: float(): casting {self.type} to f32 is not supported")
        return self

    def erf(self) -> Tensor:
        return self.tracer.emit("erf", [self])

    def pow(self, exponent) -> Tensor:
        """x ** exponent for the exponents a model uses: 1, 2 and 3 as products (x·x for 2),
        0.5 as sqrt, −0.5 as rsqrt, −1 as 1/x."""
        if isinstance(exponent, (int, float, np.integer, np.floating)) and not isinstance(exponent, bool):
            e = float(exponent)
            if e == 1.0:
                return self
            if e == 2.0:
                return self * self
            if e == 3.0:
                return self * self * self
            if e == 0.5:
                return self.sqrt()
            if e == -0.5:
                return self.rsqrt()
            if e == -1.0:
                return 1.0 / self
        raise NotImplementedError(
            f"{user_source_line()}: pow: exponent {exponent!r} is not supported (1, 2, 3, 0.5, -0.5 or -1)"
        )

    __pow__ = pow


def lift(value: Any, tracer: Tracer | None = None) -> Tensor:
    """A Tensor for `value`: itself, a bound Parameter's trace, or a Python scalar as a constant."""
    if isinstance(value, Tensor):
        return value
    bound = getattr(value, "traced", None)
    if callable(bound):
        return bound()
    if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
        return (tracer or active_tracer()).const(float(value))
    raise TypeError(f"expected a Tensor or a Python number, got {type(value).__name__}")
