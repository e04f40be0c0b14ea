"""The DSL's Tensor and the primitive operations on it, each defined once.

A `Tensor` is a handle on one IR node of the trace that `compile()` is recording; its operators
and methods, PyTorch's, call the functions of this module, which apply one IR op each
(`apply`) or a few (`getitem` is a slice and a reshape). The composite functions that PyTorch
keeps in torch.nn.functional (layer_norm, conv2d, cross_entropy…) are in `functional.py`, built
on these; `meganeura.functional` re-exports everything here too. The composites PyTorch keeps on
torch and Tensor (split, stack, var, norm, logsumexp, einsum…) close this module, in a section
of their own, traced from the primitives.

The elementwise functions come from `ir/functions.py`: each one with a plain signature becomes a
function here (`exp(x)`, `greater(a, b)`) and, where it names one, a Tensor method (`x.exp()`);
those with Python parameters (`leaky_relu(x, negative_slope)`, `softplus(x, beta, threshold)`,
`clamp(x, min, max)`, `where(condition, x, y)`) are written out below.

>>> # inside a model's forward(): y = (x @ w.T + b).relu(); mask = y > 0
"""

from __future__ import annotations

import builtins
import math
from typing import Any

import numpy as np

from meganeura.ir.functions import FUNCTIONS, Function
from meganeura.ir.graph import TensorType
from meganeura.ir.op import ShapeError, broadcast_shapes, normalize_axes
from meganeura.ir.trace import Tracer, active_tracer, user_source_line
from meganeura.pytorch_names import missing_method


class Tensor:
    """A value being traced: a handle on one IR node, with PyTorch-like operators.

    Comparisons (`==`, `!=`, `<`, `<=`, `>`, `>=`) give masks in f32, 1.0 where true and 0.0
    elsewhere (PyTorch gives bool tensors, which arithmetic promotes to float the same way).
    """

    __hash__ = object.__hash__  # comparisons are elementwise ops, identity stays the hash

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

    def __bool__(self):
        raise TypeError("a traced Tensor has no truth value: its value is only known when the step runs")

    def __getattr__(self, name: str):
        """Only for names the class lacks: a PyTorch Tensor method meganeura does not have raises
        MissingName with what to use instead (meganeura/pytorch_names.py). Private and dunder names
        (pickle's and copy's probes, a half-built object's own fields) raise a plain AttributeError."""
        if name.startswith("_") or name in ("tracer", "node"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise missing_method(type(self), name)

    # -- operators ---------------------------------------------------------------------------

    def __add__(self, other):
        return apply("add", self, other)

    def __radd__(self, other):
        return apply("add", other, self)

    def __sub__(self, other):
        return apply("sub", self, other)

    def __rsub__(self, other):
        return apply("sub", other, self)

    def __mul__(self, other):
        return apply("mul", self, other)

    def __rmul__(self, other):
        return apply("mul", other, self)

    def __truediv__(self, other):
        return apply("div", self, other)

    def __rtruediv__(self, other):
        return apply("div", other, self)

    def __neg__(self):
        return apply("neg", self)

    def __matmul__(self, other):
        return matmul(self, other)

    def __pow__(self, exponent):
        return pow(self, exponent)

    def __rpow__(self, base):
        return pow(base, self)

    def __getitem__(self, key) -> Tensor:
        return getitem(self, key)

    def __eq__(self, other):  # type: ignore[override]
        return apply("equal", self, other) if comparable(other) else NotImplemented

    def __ne__(self, other):  # type: ignore[override]
        return apply("not_equal", self, other) if comparable(other) else NotImplemented

    def __lt__(self, other):
        return apply("less", self, other)

    def __le__(self, other):
        return apply("less_equal", self, other)

    def __gt__(self, other):
        return apply("greater", self, other)

    def __ge__(self, other):
        return apply("greater_equal", self, other)

    # -- methods -----------------------------------------------------------------------------

    @property
    def T(self) -> Tensor:
        return transpose2d(self)

    def t(self) -> Tensor:
        return transpose2d(self)

    @property
    def mT(self) -> Tensor:  # noqa: N802 (torch's name)
        """The last two dims swapped (torch.Tensor.mT), for any tensor of at least 2 dims."""
        if self.ndim < 2:
            raise ShapeError(f"{user_source_line()}: .mT needs at least 2 dims, got {self.type}")
        return transpose(self, -2, -1)

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        return transpose(self, dim0, dim1)

    def permute(self, *dims) -> Tensor:
        return permute(self, dims_argument(dims))

    def reshape(self, *shape) -> Tensor:
        return reshape(self, dims_argument(shape))

    def view(self, *shape) -> Tensor:
        return reshape(self, dims_argument(shape))

    def expand(self, *shape) -> Tensor:
        return expand(self, dims_argument(shape))

    def unsqueeze(self, dim: int) -> Tensor:
        return unsqueeze(self, dim)

    def squeeze(self, dim=None) -> Tensor:
        return squeeze(self, dim)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        return flatten(self, start_dim, end_dim)

    def sum(self, dim=None, keepdim: bool = False) -> Tensor:
        return sum(self, dim, keepdim)

    def mean(self, dim=None, keepdim: bool = False) -> Tensor:
        return mean(self, dim, keepdim)

    def amax(self, dim=None, keepdim: bool = False) -> Tensor:
        return amax(self, dim, keepdim)

    def softmax(self, dim: int = -1) -> Tensor:
        return softmax(self, dim)

    def log_softmax(self, dim: int = -1) -> Tensor:
        return log_softmax(self, dim)

    def clamp(self, min=None, max=None) -> Tensor:
        return clamp(self, min, max)

    clip = clamp

    def masked_fill(self, mask, value) -> Tensor:
        return masked_fill(self, mask, value)

    def where(self, condition, other) -> Tensor:
        """`self` where `condition` is not 0, else `other` (torch.Tensor.where)."""
        return where(condition, self, other)

    def contiguous(self) -> Tensor:
        """The tensor itself: traced tensors are always laid out densely."""
        return self

    # -- torch's method forms of the operators ---------------------------------------------------

    def add(self, other, *, alpha=1) -> Tensor:
        """self + alpha·other (torch.Tensor.add)."""
        return self + (other if alpha == 1 else other * alpha)

    def sub(self, other, *, alpha=1) -> Tensor:
        """self − alpha·other (torch.Tensor.sub)."""
        return self - (other if alpha == 1 else other * alpha)

    def mul(self, other) -> Tensor:
        return self * other

    def div(self, other, *, rounding_mode=None) -> Tensor:
        """self / other (torch.Tensor.div); rounding_mode "trunc" or "floor" rounds the quotient."""
        if rounding_mode not in (None, "trunc", "floor"):
            raise ValueError(f"{user_source_line()}: div: rounding_mode must be None, 'trunc' or 'floor'")
        quotient = self / other
        return quotient if rounding_mode is None else apply(rounding_mode, quotient)

    def neg(self) -> Tensor:
        return -self

    def view_as(self, other) -> Tensor:
        return reshape(self, other.shape)

    def reshape_as(self, other) -> Tensor:
        return reshape(self, other.shape)

    def expand_as(self, other) -> Tensor:
        return broadcast_to(self, other.shape)

    def pow(self, exponent) -> Tensor:
        return pow(self, exponent)

    # -- elementwise functions written out below (the plain ones come from ir/functions.py) ----

    def square(self) -> Tensor:
        return square(self)

    def reciprocal(self) -> Tensor:
        return reciprocal(self)

    def sign(self) -> Tensor:
        return sign(self)

    def round(self, decimals: int = 0) -> Tensor:
        return round(self, decimals=decimals)


def comparable(value: Any) -> bool:
    """Whether `==`/`!=` with `value` is elementwise (a Tensor or a number), not Python's identity."""
    return isinstance(value, Tensor) or is_number(value)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, (bool, np.bool_))


def dims_argument(dims: tuple) -> tuple:
    """`f(2, 3)` and `f((2, 3))` alike (PyTorch takes both for reshape, permute, expand)."""
    return tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else tuple(dims)


def lift(value: Any, tracer: Tracer | None = None) -> Tensor:
    """A Tensor for `value`: itself (a Parameter is one), or a Python number as a constant."""
    if isinstance(value, Tensor):
        return value
    if is_number(value):
        tracer = tracer or active_tracer()
        return Tensor(tracer, tracer.const(float(value)))
    raise TypeError(f"expected a Tensor or a Python number, got {type(value).__name__}")


def apply(op: str, *operands: Any, **attrs: Any) -> Tensor:
    """`op` applied to `operands` (Tensors, or numbers lifted to constants), with attributes `attrs`."""
    tracer = next((x.tracer for x in operands if isinstance(x, Tensor)), None) or active_tracer()
    tensors = [lift(x, tracer) for x in operands]
    for t in tensors:
        if t.tracer is not tracer:
            raise ValueError(f"{op}: operand comes from another trace (a Tensor kept from an earlier compile?)")
    if op in FUNCTIONS and any(t.dtype == "i32" for t in tensors):
        floating = any(
            isinstance(x, (float, np.floating)) or (isinstance(x, Tensor) and x.dtype == "f32") for x in operands
        )
        tensors = integer_operands(op, tensors, floating)  # see the selection section
    return Tensor(tracer, tracer.emit(op, [t.node for t in tensors], **attrs))


def apply_results(op: str, *operands: Any, **attrs: Any) -> tuple[Tensor, ...]:
    """`op`, a node with several results, applied to `operands`: one Tensor per result."""
    whole = apply(op, *operands, **attrs)
    count = whole.tracer.graph[whole.node].results
    return tuple(apply("result", whole, index=i) for i in range(count))


def user_error(error: ShapeError) -> ShapeError:
    """`error` with the user's file and line in front."""
    return ShapeError(f"{user_source_line()}: {error}")


# ---------------------------------------------------------------------------------------------
# Elementwise functions of ir/functions.py with a plain signature (module functions and methods)


def elementwise_function(function: Function):
    def apply_function(*operands):
        if len(operands) != function.arity:
            raise TypeError(f"{function.name}() takes {function.arity} operand(s), got {len(operands)}")
        return apply(function.name, *operands)

    apply_function.__name__ = apply_function.__qualname__ = function.functional or function.name
    apply_function.__doc__ = f"{function.doc}, elementwise (broadcasting its operands)."
    return apply_function


def elementwise_method(function: Function):
    def method(self, *others):
        return apply(function.name, self, *others)

    method.__name__ = method.__qualname__ = function.method
    method.__doc__ = f"{function.doc}, elementwise."
    return method


ELEMENTWISE = {f.functional: elementwise_function(f) for f in FUNCTIONS.values() if f.functional}
globals().update(ELEMENTWISE)
for _function in FUNCTIONS.values():
    if _function.method:
        setattr(Tensor, _function.method, elementwise_method(_function))


# torch.add, torch.sub and torch.div take keywords the plain functions above do not (alpha,
# rounding_mode): the module-level names are torch's forms, through the Tensor methods.


def add(input, other, *, alpha=1) -> Tensor:
    """input + alpha·other (torch.add)."""
    return lift(input).add(other, alpha=alpha)


def sub(input, other, *, alpha=1) -> Tensor:
    """input − alpha·other (torch.sub)."""
    return lift(input).sub(other, alpha=alpha)


def div(input, other, *, rounding_mode=None) -> Tensor:
    """input / other, rounded by rounding_mode "trunc" or "floor" if given (torch.div)."""
    return lift(input).div(other, rounding_mode=rounding_mode)


def where(condition, input, other) -> Tensor:
    """`input` where `condition` is not 0, else `other`, broadcasting all three (torch.where; the
    condition is typically a comparison's mask). The gradient flows to the chosen operand."""
    return apply("where", condition, input, other)


def clamp(input, min=None, max=None) -> Tensor:
    """min(max(input, min), max), elementwise (torch.clamp; min and max are numbers or tensors,
    either may be None; max wins where min > max). The gradient flows to input where
    min ≤ input ≤ max, to min where input < min and to max where input > max, as in PyTorch."""
    if min is None and max is None:
        raise ValueError(f"{user_source_line()}: clamp: at least one of min and max must be given")
    low = -math.inf if min is None else min
    high = math.inf if max is None else max
    return apply("clamp", input, low, high)


clip = clamp


def masked_fill(input, mask, value) -> Tensor:
    """`value` where `mask` is not 0, else `input` (torch.Tensor.masked_fill; the mask broadcasts)."""
    return where(mask, value, input)


def leaky_relu(input, negative_slope: float = 0.01) -> Tensor:
    """x where x > 0, negative_slope·x elsewhere (torch.nn.functional.leaky_relu)."""
    return apply("leaky_relu", input, float(negative_slope))


def softplus(input, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta·x))/beta, and x where beta·x > threshold (torch.nn.functional.softplus)."""
    beta = float(beta)
    scaled = lift(input) if beta == 1.0 else lift(input) * beta
    out = apply("softplus", scaled, float(threshold))
    return out if beta == 1.0 else out * (1.0 / beta)


# ---------------------------------------------------------------------------------------------
# Shapes


def reshape(x, shape: tuple[int, ...]) -> Tensor:
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
    return apply("reshape", x, shape=shape)


def permute(x, dims: tuple[int, ...]) -> Tensor:
    """The dims of x reordered (torch.permute); a copy kernel unless the e-graph folds it away."""
    x = lift(x)
    dims = tuple(int(d) % max(x.ndim, 1) for d in dims)
    if dims == tuple(range(x.ndim)):
        return x
    return apply("permute", x, perm=dims)


def transpose(x, dim0: int, dim1: int) -> Tensor:
    """x with dims `dim0` and `dim1` swapped (torch.transpose)."""
    x = lift(x)
    perm = list(range(x.ndim))
    try:
        perm[dim0], perm[dim1] = perm[dim1], perm[dim0]
    except IndexError:
        raise ShapeError(f"{user_source_line()}: transpose: dims ({dim0}, {dim1}) out of range for {x.type}") from None
    return permute(x, tuple(perm))


def transpose2d(x) -> Tensor:
    """xᵀ of a 2-D tensor (Tensor.T)."""
    x = lift(x)
    if x.ndim != 2:
        raise ShapeError(f"{user_source_line()}: .T needs a 2-D tensor, got {x.type}; use transpose(dim0, dim1)")
    return permute(x, (1, 0))


def broadcast_to(x, shape: tuple[int, ...]) -> Tensor:
    """x repeated along dims of size 1 (and new leading dims) to `shape`, like torch.broadcast_to."""
    x = lift(x)
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return x
    return apply("broadcast_to", x, shape=shape)


def expand(x, shape: tuple[int, ...]) -> Tensor:
    """Broadcast to `shape` (−1 keeps a dim), like torch.Tensor.expand."""
    x = lift(x)
    lead = len(shape) - x.ndim
    full = tuple(x.shape[i - lead] if d == -1 else d for i, d in enumerate(shape))
    return broadcast_to(x, full)


def unsqueeze(x, dim: int) -> Tensor:
    """A dim of size 1 inserted at `dim` (a reshape), like torch.Tensor.unsqueeze."""
    x = lift(x)
    if not -x.ndim - 1 <= dim <= x.ndim:
        raise ShapeError(f"{user_source_line()}: unsqueeze: dim {dim} is out of range for {x.type}")
    dim %= x.ndim + 1
    return reshape(x, x.shape[:dim] + (1,) + x.shape[dim:])


def squeeze(x, dim=None) -> Tensor:
    """The dims of size 1 among `dim` (an int, a tuple, or None for all) removed (a reshape); a
    named dim of another size is kept, like torch.Tensor.squeeze."""
    x = lift(x)
    try:
        dims = normalize_axes(dim, x.ndim, "squeeze")
    except ShapeError as error:
        raise user_error(error) from None
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in dims or d != 1))


def flatten(x, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Dims start_dim…end_dim merged into one (a reshape), like torch.flatten; a 0-d tensor becomes [1]."""
    x = lift(x)
    if x.ndim == 0:
        return reshape(x, (1,))
    try:
        start, end = (normalize_axes(d, x.ndim, "flatten")[0] for d in (start_dim, end_dim))
    except ShapeError as error:
        raise user_error(error) from None
    if start > end:
        raise ShapeError(f"{user_source_line()}: flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    merged = math.prod(x.shape[start : end + 1])
    return reshape(x, x.shape[:start] + (merged,) + x.shape[end + 1 :])


def getitem(x, key) -> Tensor:
    """x[key] for ints (negative ones count from the end; each drops its dim), slices with a
    positive step, `...` and None (a new dim of size 1), as torch indexing: one `slice` node,
    then a reshape when dims are dropped or added."""
    x = lift(x)
    key = key if isinstance(key, tuple) else (key,)
    if any(is_index_array(k) for k in key):
        return advanced_getitem(x, key)  # integer tensors among the key (the selection section)
    if any(k is Ellipsis for k in key):
        if [k is Ellipsis for k in key].count(True) > 1:
            raise IndexError(f"{user_source_line()}: an index can only have a single ellipsis ('...')")
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        used = len([k for k in key if k is not None]) - 1
        key = key[:at] + (slice(None),) * max(x.ndim - used, 0) + key[at + 1 :]
    if len([k for k in key if k is not None]) > x.ndim:
        raise IndexError(f"{user_source_line()}: too many indices for a tensor of shape {list(x.shape)}: {key}")
    starts, stops, steps, shape = [], [], [], []
    dim = 0
    for k in key:
        if k is None:
            shape.append(1)
            continue
        size = x.shape[dim]
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
            index = int(k)
            if not -size <= index < size:
                raise IndexError(
                    f"{user_source_line()}: index {index} is out of range for dim {dim} of size {size} ({x.type})"
                )
            index %= size
            starts.append(index), stops.append(index + 1), steps.append(1)
        elif isinstance(k, slice):
            if k.step is not None and int(k.step) <= 0:
                raise ValueError(f"{user_source_line()}: slice step must be positive, got {k.step}")
            start, stop, step = k.indices(size)
            stop = max(stop, start)
            starts.append(start), stops.append(stop), steps.append(step)
            shape.append(-(-(stop - start) // step))
        else:
            raise TypeError(f"{user_source_line()}: unsupported index {k!r}: use ints, slices, '...' or None")
        dim += 1
    for d in range(dim, x.ndim):
        starts.append(0), stops.append(x.shape[d]), steps.append(1)
        shape.append(x.shape[d])
    if any((a, b, s) != (0, n, 1) for a, b, s, n in zip(starts, stops, steps, x.shape, strict=True)):
        x = apply("slice", x, starts=tuple(starts), stops=tuple(stops), steps=tuple(steps))
    return reshape(x, tuple(shape))


def cat(tensors, dim: int = 0) -> Tensor:
    """The tensors joined along `dim` (torch.cat): every other dim must match.

    One `concat` node takes at most 6 inputs (the e-graph's constructors have a fixed arity);
    longer lists are joined in groups of 6.
    """
    tensors = [lift(t) for t in tensors]
    if not tensors:
        raise ShapeError(f"{user_source_line()}: cat: expected a non-empty list of tensors")
    if len(tensors) == 1:
        return tensors[0]
    try:
        (axis,) = normalize_axes(int(dim), tensors[0].ndim, "cat")
    except ShapeError as error:
        raise user_error(error) from None
    while len(tensors) > 6:
        tensors = [cat(tensors[i : i + 6], axis) for i in range(0, len(tensors), 6)]
    return apply("concat", *tensors, axis=axis)


# ---------------------------------------------------------------------------------------------
# Reductions, rows, products


def reduction_axes(x: Tensor, dim, op: str) -> tuple[int, ...]:
    try:
        return normalize_axes(dim, x.ndim, op)
    except ShapeError as error:
        raise user_error(error) from None


def sum(x, dim=None, keepdim: bool = False) -> Tensor:
    """Sum over `dim` (an int, a tuple, or None for all dims), like torch.sum."""
    x = lift(x)
    return apply("sum", x, axes=reduction_axes(x, dim, "sum"), keepdim=keepdim)


def mean(x, dim=None, keepdim: bool = False) -> Tensor:
    """Mean over `dim` (an int, a tuple, or None for all dims), like torch.mean."""
    x = lift(x)
    total = sum(x, dim, keepdim)
    count = x.numel() // max(total.numel(), 1)
    return total * (1.0 / count)


def amax(x, dim=None, keepdim: bool = False) -> Tensor:
    """The maximum over `dim` (torch.amax); the gradient is split evenly between ties."""
    x = lift(x)
    return apply("max", x, axes=reduction_axes(x, dim, "amax"), keepdim=keepdim)


def row_op(op: str, x, dim: int) -> Tensor:
    x = lift(x)
    (axis,) = reduction_axes(x, int(dim), op)
    return apply(op, x, axis=axis)


def softmax(x, dim: int = -1) -> Tensor:
    """exp(x) / Σ exp(x) along `dim`, computed stably (the maximum is subtracted first): one op,
    one kernel (a workgroup per row)."""
    return row_op("softmax", x, dim)


def log_softmax(x, dim: int = -1) -> Tensor:
    """x − log Σ exp(x) along `dim`, computed stably (the maximum is subtracted first): one op,
    one kernel (a workgroup per row)."""
    return row_op("log_softmax", x, dim)


def matmul(input, other) -> Tensor:
    """a @ b like torch.matmul: over the last two dims, the leading (batch) dims broadcast against
    each other ([2, 1, 4, 6] @ [3, 6, 5] → [2, 3, 4, 5]); a with more dims than a 2-D b (or than a
    b whose batch dims are all 1) is flattened to rows first; a 1-D operand is a vector (a row of
    a, a column of b), its dim dropped from the result. Batch dims that differ otherwise are
    broadcast (copied) to their common shape.

    The IR's matmul also takes a 2-D operand shared by a batch directly, but tracing [batch,
    seq, features] @ W that way lets the matmul epilogue rules see whole residual streams, and
    the e-graph then grows past its budget on deep models; flattening keeps them apart for now.
    """
    a, b = lift(input), lift(other)
    if a.ndim == 1 or b.ndim == 1:  # torch: a vector operand is a one-row (or one-column) matrix, squeezed after
        if a.ndim == 0 or b.ndim == 0:
            raise ShapeError(f"{user_source_line()}: matmul: both operands need ≥ 1 dim, got {a.type} and {b.type}")
        out = matmul(unsqueeze(a, 0) if a.ndim == 1 else a, unsqueeze(b, -1) if b.ndim == 1 else b)
        out = squeeze(out, -2) if a.ndim == 1 else out
        return squeeze(out, -1) if b.ndim == 1 else out
    if a.ndim > 2 and b.ndim == 2:
        lead = a.shape[:-1]
        rows = reshape(a, (-1, a.shape[-1]))
        out = apply("matmul", rows, b)
        return reshape(out, lead + (out.shape[-1],))
    if a.ndim == 2 or b.ndim == 2 or a.shape[:-2] == b.shape[:-2]:
        return apply("matmul", a, b)
    try:
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2], "matmul")
    except ShapeError as error:
        raise ShapeError(f"{user_source_line()}: {error} (the batch dims of {a.type} @ {b.type})") from None
    if math.prod(b.shape[:-2]) == 1:  # b is one matrix: keep the shared-operand form
        return reshape(matmul(a, reshape(b, b.shape[-2:])), batch + (a.shape[-2], b.shape[-1]))
    if math.prod(a.shape[:-2]) == 1:
        return reshape(matmul(reshape(a, a.shape[-2:]), b), batch + (a.shape[-2], b.shape[-1]))
    return apply("matmul", broadcast_to(a, batch + a.shape[-2:]), broadcast_to(b, batch + b.shape[-2:]))


def pow(input, exponent) -> Tensor:
    """input ** exponent, elementwise, as torch.pow, values and gradients. A number exponent:
    1 is input itself, 2 and 3 products, 0.5 sqrt and −1 a reciprocal (PyTorch's own shortcuts,
    and their gradients are PyTorch's), any other number `pow_scalar` (torch.pow(Tensor, number):
    −0.5, −2 and 0 by its shortcuts too, e.g. x ** 0 = 1 where x is NaN). A tensor exponent or a
    number base (`2 ** x`): C's pow, NaN for a negative base and a non-integer exponent."""
    if not isinstance(input, Tensor) and not isinstance(exponent, Tensor):
        raise TypeError(
            f"{user_source_line()}: pow: expected a Tensor base or exponent, got {input!r} and {exponent!r}"
        )
    if is_number(exponent):
        x = lift(input)
        e = float(exponent)
        if e == 1.0:
            return x
        if e == 2.0:
            return x * x
        if e == 3.0:
            return x * x * x
        if e == 0.5:
            return apply("sqrt", x)
        if e == -1.0:
            return 1.0 / x
        return apply("pow_scalar", x, e)
    return apply("pow", input, exponent)


# ---------------------------------------------------------------------------------------------
# Random tensors (ir/ops/random.py: Philox4x32-10, a fresh stream every step)


def size_argument(size: tuple, name: str = "size") -> tuple[int, ...]:
    """`f(2, 3)`, `f((2, 3))` and `f([2, 3])` alike, as torch.rand takes them; sizes ≥ 0."""
    shape = dims_argument(size)
    if any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0 for d in shape):
        raise ShapeError(f"{user_source_line()}: {name}: sizes must be non-negative ints, got {list(shape)}")
    return tuple(int(d) for d in shape)


def random_options(name: str, generator, dtype, requires_grad) -> None:
    """Refuse the arguments of torch's random functions that a traced step does not take."""
    if generator is not None:
        raise NotImplementedError(
            f"{user_source_line()}: {name}: generator= is not supported; seed the program "
            "(mn.manual_seed, or mn.compile(..., seed=))"
        )
    if dtype is not None and str(dtype) not in ("f32", "mn.f32", "float32", "torch.float32"):
        raise NotImplementedError(f"{user_source_line()}: {name}: only f32 random tensors are supported, got {dtype}")
    if requires_grad and not outside_trace():
        raise NotImplementedError(f"{user_source_line()}: {name}: requires_grad=True is not supported")


def host_generator() -> np.random.Generator:
    """The numpy generator `mn.manual_seed` seeds (it initialises parameters: meganeura/nn), which
    rand/randn draw from outside a trace, as torch's do in a module's __init__."""
    import sys

    return sys.modules["meganeura.nn"]._rng


def random_tensor(shape: tuple[int, ...], normal: bool) -> Tensor:
    """A `rand` node of the active trace: its own stream, read from the step's RNG state."""
    tracer = active_tracer()
    state = tracer.rng_state()
    return Tensor(tracer, tracer.emit("rand", [state], shape=shape, stream=tracer.next_stream(), normal=normal))


def rand(*size, generator=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Uniform random numbers in [0, 1) of shape `size` (torch.rand): in a traced forward, new
    every step; outside one (a module's __init__), a float32 numpy array from mn.manual_seed's
    generator. generator= is not supported (seed with mn.manual_seed or compile(seed=))."""
    random_options("rand", generator, dtype, requires_grad)
    if outside_trace():
        return host_generator().random(size_argument(size, "rand")).astype(np.float32)
    return random_tensor(size_argument(size, "rand"), normal=False)


def randn(*size, generator=None, dtype=None, requires_grad: bool = False) -> Tensor:
    """Standard normal random numbers of shape `size` (torch.randn; Box–Muller from Philox): in a
    traced forward, new every step; outside one, a float32 numpy array from mn.manual_seed's
    generator. generator= is not supported."""
    random_options("randn", generator, dtype, requires_grad)
    if outside_trace():
        return host_generator().standard_normal(size_argument(size, "randn")).astype(np.float32)
    return random_tensor(size_argument(size, "randn"), normal=True)


def rand_like(input, *, dtype=None, requires_grad: bool = False) -> Tensor:
    """torch.rand_like: uniform random numbers in [0, 1) of input's shape."""
    random_options("rand_like", None, dtype, requires_grad)
    if not isinstance(input, Tensor) and outside_trace():
        return host_generator().random(np.shape(input)).astype(np.float32)
    return random_tensor(lift(input).shape, normal=False)


def randn_like(input, *, dtype=None, requires_grad: bool = False) -> Tensor:
    """torch.randn_like: standard normal random numbers of input's shape."""
    random_options("randn_like", None, dtype, requires_grad)
    if not isinstance(input, Tensor) and outside_trace():
        return host_generator().standard_normal(np.shape(input)).astype(np.float32)
    return random_tensor(lift(input).shape, normal=True)


def bernoulli(input, p: float | None = None, *, generator=None) -> Tensor:
    """torch.bernoulli: 1.0 with probability input (elementwise, in [0, 1]), else 0.0; with `p`,
    probability p for every element of input's shape. No gradient flows (as in PyTorch)."""
    random_options("bernoulli", generator, None, False)
    input = lift(input)
    if p is not None:
        if not is_number(p) or not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"{user_source_line()}: bernoulli: p must be a number in [0, 1], got {p!r}")
        return apply("less", random_tensor(input.shape, normal=False), float(p))
    return apply("less", random_tensor(input.shape, normal=False), input)


# dtypes, constants, selection and integer indexing (ir/ops/select.py, ir/ops/constants.py)
#
# Two dtypes: f32, and i32, which stands for torch's int64 and int32 alike (indices, labels).
# A dtype is written as a model writes it: mn.float32, mn.long… (meganeura/__init__.py), their
# names as text, numpy's, or Python's float and int. Values known when the model is traced
# (arange, tensor, eye…) are constant leaves, uploaded once; f32 fills are a scalar constant
# broadcast, which the e-graph folds into the literal of the kernel that reads it.

F32_NAMES = ("f32", "float32", "float")
I32_NAMES = ("i32", "int32", "int64", "long", "int")
COMPARISONS = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")


def dtype_name(dtype: Any) -> str:
    """'f32' or 'i32' for a dtype as a model writes it (mn.float32, mn.long, 'int64', np.int64,
    float, int…); a ShapeError naming the user's line for one meganeura has no tensors of."""
    if dtype is float:
        return "f32"
    if dtype is int:
        return "i32"
    spec = getattr(dtype, "dtype", None)  # mn.f32 and its aliases (compiler.DTypeSpec) hold their name
    name = spec if isinstance(spec, str) else dtype
    if isinstance(name, str) and name in F32_NAMES + I32_NAMES:
        return "f32" if name in F32_NAMES else "i32"
    try:
        kind = np.dtype(name).kind
    except TypeError:
        kind = ""
    if kind and kind in "iu":
        return "i32"
    if kind == "f" and np.dtype(name).itemsize <= 4:
        return "f32"
    raise ShapeError(
        f"{user_source_line()}: dtype {dtype!r} is not supported: meganeura has f32 (mn.float32) and i32 "
        "(mn.long, mn.int32: integers); comparisons give f32 masks"
    )


def to_dtype(x, dtype) -> Tensor:
    """`x` as `dtype`: itself where it is already, else a `cast` (f32 → i32 truncates toward zero)."""
    x = lift(x)
    target = dtype_name(dtype)
    return x if x.dtype == target else apply("cast", x, dtype=target)


def integer_operands(op: str, tensors: list[Tensor], floating: bool) -> list[Tensor]:
    """The operands of a comparison, or of arithmetic that has a float operand (an f32 tensor or a
    Python float: torch promotes the integers to float), with the i32 ones cast to f32 (exact for
    |values| < 2^24), so that `idx == 3` is a mask and `torch.arange(n) * x` a product as for
    floats; arithmetic on integers alone is refused (its result would be an integer in torch)."""
    if op not in COMPARISONS and not floating:
        raise ShapeError(
            f"{user_source_line()}: {op}: arithmetic on i32 tensors is not supported; use .float() (exact below "
            "2^24) and .long() back"
        )
    return [apply("cast", t, dtype="f32") if t.dtype == "i32" else t for t in tensors]


# -- constants -------------------------------------------------------------------------------


def constant_tensor(values: np.ndarray, dtype: str) -> Tensor:
    """A constant leaf holding `values` (ir/ops/constants.py)."""
    from meganeura.ir.ops.constants import encode_data

    tracer = active_tracer()
    values = np.asarray(values)
    data = encode_data(values, dtype)
    try:
        node = tracer.emit("constant", [], data=data, shape=values.shape, dtype=dtype)
    except ShapeError as error:
        raise ShapeError(str(error).replace("constant:", "tensor:", 1)) from None
    return Tensor(tracer, node)


def check_not_requiring_grad(what: str, requires_grad: bool) -> None:
    if requires_grad and not outside_trace():
        raise NotImplementedError(
            f"{user_source_line()}: {what}(requires_grad=True): a constant made in forward() is not trained; "
            "make it an nn.Parameter of the module"
        )


def outside_trace() -> bool:
    """Whether no trace is recording: then the constructors below give numpy arrays, as torch's do
    in a module's __init__ (`nn.Parameter(torch.zeros(1, 1, dim))`, `register_buffer(...)`)."""
    try:
        active_tracer()
    except RuntimeError:
        return True
    return False


def host_array(values, dtype) -> np.ndarray:
    """`values` on the host as torch's default dtypes would hold them: float32 unless `dtype` (or
    integer values with no dtype) asks for integers, which are int64 (torch.long)."""
    values = np.asarray(values)
    if dtype is not None:
        integral = dtype_name(dtype) == "i32"
    else:
        integral = values.dtype.kind in "iu"
    if values.dtype.kind == "b" and dtype is None:
        return values.copy()
    return values.astype(np.int64 if integral else np.float32)


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.arange: start, start + step, … below end (above it for a negative step), as a
    constant. i32 (torch's int64) when every argument is an int, else f32; f32 values are
    start + i·step computed in float64, rounded once (torch's CPU kernel may differ by an ulp).
    `device` is accepted and has no effect: the step runs on the adapter compile() chose."""
    check_not_requiring_grad("arange", requires_grad)
    if end is None:
        start, end = 0, start
    bounds = (start, end, step)
    if not all(is_number(v) for v in bounds):
        raise TypeError(f"{user_source_line()}: arange takes Python numbers, got {bounds}")
    integral = all(isinstance(v, (int, np.integer)) for v in bounds)
    target = dtype_name(dtype) if dtype is not None else ("i32" if integral else "f32")
    if step == 0:
        raise ValueError(f"{user_source_line()}: arange: step must be nonzero")
    if target == "i32" and not all(float(v).is_integer() for v in bounds):
        raise ValueError(f"{user_source_line()}: arange: an integer range needs integer bounds and step, got {bounds}")
    size = math.ceil((float(end) - float(start)) / float(step))
    if size < 0:
        raise ValueError(f"{user_source_line()}: arange: the step {step} goes away from the end ({start} to {end})")
    if outside_trace():
        return host_array(float(start) + np.arange(size) * float(step), target)
    tracer = active_tracer()
    node = tracer.emit("arange", [], start=float(start), step=float(step), size=size, dtype=target)
    return Tensor(tracer, node)


def full(size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.full: `size` filled with `fill_value`, i32 for an int fill, f32 for a float one (and
    for a bool: masks are f32 here). `device` has no effect (see arange)."""
    check_not_requiring_grad("full", requires_grad)
    shape = size_argument((size,))
    if not (is_number(fill_value) or isinstance(fill_value, (bool, np.bool_))):
        raise TypeError(f"{user_source_line()}: full: fill_value must be a number, got {fill_value!r}")
    integral = isinstance(fill_value, (int, np.integer)) and not isinstance(fill_value, (bool, np.bool_))
    target = dtype_name(dtype) if dtype is not None else ("i32" if integral else "f32")
    if outside_trace():
        return host_array(np.full(shape, float(fill_value)), target)
    if target == "f32":
        return broadcast_to(lift(float(fill_value)), shape)
    if not float(fill_value).is_integer():
        raise ValueError(f"{user_source_line()}: full: an i32 tensor cannot hold {fill_value!r}")
    tracer = active_tracer()
    fill = tracer.emit("arange", [], start=float(fill_value), step=0.0, size=math.prod(shape), dtype="i32")
    return reshape(Tensor(tracer, fill), shape)


def zeros(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.zeros: f32 zeros of `size` (`dtype` may ask for i32). `device` has no effect (see arange)."""
    return full(size_argument(size), 0.0, dtype=dtype, requires_grad=requires_grad)


def ones(*size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.ones: f32 ones of `size` (`dtype` may ask for i32). `device` has no effect (see arange)."""
    return full(size_argument(size), 1.0, dtype=dtype, requires_grad=requires_grad)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.full_like: input's shape filled with `fill_value`, in input's dtype unless `dtype` is given."""
    x = lift(input)
    return full(x.shape, fill_value, dtype=dtype or x.dtype, requires_grad=requires_grad)


def zeros_like(input, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.zeros_like: zeros of input's shape and dtype (or `dtype`)."""
    return full_like(input, 0, dtype=dtype, requires_grad=requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.ones_like: ones of input's shape and dtype (or `dtype`)."""
    return full_like(input, 1, dtype=dtype, requires_grad=requires_grad)


def tensor(data, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.tensor: a constant of `data` (numbers, nested lists, a numpy array) captured when the
    model is traced: not a parameter, not in state_dict, uploaded once. i32 for integers, f32 for
    floats (float64 values are rounded) and for bools (masks are f32 here); at most 65,536
    elements (larger arrays: a module buffer, or an input). A Tensor is returned as it is (cast to `dtype`)."""
    check_not_requiring_grad("tensor", requires_grad)
    if isinstance(data, Tensor):
        return to_dtype(data, dtype) if dtype is not None else data
    if outside_trace():
        return host_array(data, dtype)
    array = np.asarray(data)
    if array.dtype.kind == "b":
        array = array.astype(np.float32)
    if array.dtype.kind not in "iuf":
        raise TypeError(f"{user_source_line()}: tensor: expected numbers, got an array of {array.dtype}")
    target = dtype_name(dtype) if dtype is not None else ("f32" if array.dtype.kind == "f" else "i32")
    if target == "i32":
        if array.dtype.kind == "f":
            array = np.trunc(array)
        if array.size and (array.min() < -(2**31) or array.max() >= 2**31):
            raise ValueError(f"{user_source_line()}: tensor: values outside i32's range")
    if array.ndim == 0 and target == "f32":
        return lift(float(array))  # a scalar constant: the e-graph folds it into a literal
    return constant_tensor(array, target)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """torch.as_tensor: a Tensor as it is (cast to `dtype`), anything else as `tensor(data)`."""
    return tensor(data, dtype=dtype)


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
    """torch.eye: [n, m] (m = n by default) with ones on the diagonal, f32 unless `dtype` says i32."""
    check_not_requiring_grad("eye", requires_grad)
    m = n if m is None else m
    if outside_trace():
        return host_array(np.eye(n, m), dtype or "f32")
    mask = unsqueeze(arange(n, dtype="f32"), 1) == arange(m, dtype="f32")
    return to_dtype(mask, dtype or "f32")


def triangle(input, diagonal: int, lower: bool) -> Tensor:
    x = lift(input)
    name = "tril" if lower else "triu"
    if x.ndim < 2 or x.dtype != "f32":
        raise ShapeError(f"{user_source_line()}: {name} needs an f32 tensor of at least 2 dims, got {x.type}")
    rows, cols = x.shape[-2:]
    above = arange(cols, dtype="f32") - unsqueeze(arange(rows, dtype="f32"), 1)  # j − i
    keep = above <= int(diagonal) if lower else above >= int(diagonal)
    return where(keep, x, 0.0)


def tril(input, diagonal: int = 0) -> Tensor:
    """torch.tril: the elements on and below the `diagonal`-th diagonal of the last two dims, 0 above."""
    return triangle(input, diagonal, lower=True)


def triu(input, diagonal: int = 0) -> Tensor:
    """torch.triu: the elements on and above the `diagonal`-th diagonal of the last two dims, 0 below."""
    return triangle(input, diagonal, lower=False)


# -- flips, rolls, scans ---------------------------------------------------------------------


def dims_of(x: Tensor, dims, op: str) -> tuple[int, ...]:
    """`dims` (an int or a sequence) as sorted dims of x, each once."""
    return reduction_axes(x, (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims), op)


def flip(input, dims) -> Tensor:
    """torch.flip: the elements in reverse order along each of `dims`."""
    x = lift(input)
    axes = tuple(a for a in dims_of(x, dims, "flip") if x.shape[a] > 1)
    return apply("flip", x, axes=axes) if axes else x


def fliplr(input) -> Tensor:
    """torch.fliplr: flip along dim 1."""
    return flip(input, (1,))


def flipud(input) -> Tensor:
    """torch.flipud: flip along dim 0."""
    return flip(input, (0,))


def roll(input, shifts, dims=None) -> Tensor:
    """torch.roll: the elements moved `shifts` places along `dims` (those that pass the end come
    back at the start); with dims None, along the flattened tensor. Slices joined by `cat`."""
    x = lift(input)
    if dims is None:
        if not isinstance(shifts, (int, np.integer)):
            raise ShapeError(f"{user_source_line()}: roll: without dims, shifts must be one int, got {shifts!r}")
        return reshape(roll(reshape(x, (-1,)), int(shifts), 0), x.shape)
    shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if len(shifts) != len(dims):
        raise ShapeError(f"{user_source_line()}: roll: {len(shifts)} shifts for {len(dims)} dims")
    for shift, dim in zip(shifts, dims, strict=True):
        (axis,) = reduction_axes(x, int(dim), "roll")
        size = x.shape[axis]
        cut = size - int(shift) % size if size else 0
        if cut in (0, size):
            continue
        head = (slice(None),) * axis
        x = cat([getitem(x, (*head, slice(cut, None))), getitem(x, (*head, slice(None, cut)))], axis)
    return x


def scan(op: str, input, dim: int, dtype) -> Tensor:
    x = lift(input) if dtype is None else to_dtype(input, dtype)
    if x.ndim == 0:
        return x
    (axis,) = reduction_axes(x, int(dim), op)
    return apply(op, x, axis=axis)


def cumsum(input, dim: int, *, dtype=None) -> Tensor:
    """torch.cumsum: running sums along `dim` (in the element type, in order; torch's CPU kernel
    accumulates f32 in f64). The gradient is the running sum of the gradient from the end."""
    return scan("cumsum", input, dim, dtype)


def cumprod(input, dim: int, *, dtype=None) -> Tensor:
    """torch.cumprod: running products along `dim`; the gradient is exact where the input has zeros."""
    return scan("cumprod", input, dim, dtype)


# -- indexing with integer tensors -----------------------------------------------------------


def index_tensor(key, op: str = "index") -> Tensor:
    """An index as an i32 Tensor: an i32 Tensor, or a list or array of ints (a constant)."""
    if isinstance(key, Tensor):
        if key.dtype != "i32":
            raise TypeError(
                f"{user_source_line()}: unsupported index: {op} with an f32 tensor (a mask?): indexing by a boolean "
                "mask has a shape known only when the step runs; keep the shape with mn.where(mask, x, other) or "
                "x.masked_fill(mask, value), or index with integer (i32) tensors"
            )
        return key
    array = np.asarray(key)
    if array.dtype.kind == "b":
        return index_tensor(tensor(array), op)  # refused above, with the same advice
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"{user_source_line()}: unsupported index {key!r}: {op} takes integers")
    return tensor(array.astype(np.int64), dtype="i32")


def is_index_array(key) -> bool:
    return isinstance(key, (Tensor, list, np.ndarray))


def index_dims(x: Tensor, indices: dict[int, Tensor]) -> Tensor:
    """x indexed along the dims of `indices` by i32 tensors (broadcast together; negative values
    from the end; outside the dim: NaN), the rest of x's dims kept: torch's advanced indexing. The
    index dims take the place of the indexed ones when those are adjacent, else come first."""
    if x.dtype == "i32":  # the lookup (an embedding's `gather`) reads f32 tables
        return to_dtype(index_dims(to_dtype(x, "f32"), indices), "i32")
    dims = sorted(indices)
    sizes = tuple(x.shape[d] for d in dims)
    if 0 in sizes:
        raise IndexError(f"{user_source_line()}: cannot index an empty dim of {x.type}")
    flat = apply("flat_index", *(indices[d] for d in dims), sizes=sizes)
    rest = [d for d in range(x.ndim) if d not in indices]
    rest_shape = tuple(x.shape[d] for d in rest)
    rows = reshape(permute(x, (*dims, *rest)), (math.prod(sizes), math.prod(rest_shape)))
    out = reshape(apply("gather", rows, flat), flat.shape + rest_shape)
    first = dims[0]
    if dims == list(range(first, first + len(dims))) and first > 0:
        count = flat.ndim
        out = permute(out, (*range(count, count + first), *range(count), *range(count + first, out.ndim)))
    return out


def advanced_getitem(x: Tensor, key: tuple) -> Tensor:
    """x[key] with integer tensors (or lists of ints) among the key, as torch: the ints, slices,
    None and `...` first, then the tensors index their dims together (`index_dims`)."""
    if [k is Ellipsis for k in key].count(True) > 1:
        raise IndexError(f"{user_source_line()}: an index can only have a single ellipsis ('...')")
    if Ellipsis in [k for k in key if not is_index_array(k)]:
        at = next(i for i, k in enumerate(key) if k is Ellipsis)
        used = len([k for k in key if k is not None and k is not Ellipsis])
        key = key[:at] + (slice(None),) * max(x.ndim - used, 0) + key[at + 1 :]
    indices, basic, position = {}, [], 0
    for k in key:
        if is_index_array(k):
            indices[position] = index_tensor(k)
            basic.append(slice(None))
        else:
            basic.append(k)
        if k is None or isinstance(k, slice) or is_index_array(k):
            position += 1
    return index_dims(getitem(x, tuple(basic)), indices)


def index_select(input, dim: int, index) -> Tensor:
    """torch.index_select: the entries of `dim` at the i32 vector `index` (negative ones count from the end)."""
    x = lift(input)
    index = index_tensor(index, "index_select")
    if index.ndim > 1:
        raise ShapeError(f"{user_source_line()}: index_select: expected a 1-D index, got {index.type}")
    (axis,) = reduction_axes(x, int(dim), "index_select")
    return index_dims(x, {axis: index})


def take(input, index) -> Tensor:
    """torch.take: the elements of the flattened input at i32 `index`, in index's shape."""
    return index_dims(reshape(lift(input), (-1,)), {0: index_tensor(index, "take")})


def gather(input, dim: int, index, *, sparse_grad: bool = False) -> Tensor:
    """torch.gather: out[p] = input[p with p[dim] = index[p]], index i32 of input's rank and no
    larger outside `dim` (NaN where an index is outside the dim: torch raises). The gradient is
    summed back to the gathered places (deterministically, without atomics)."""
    if sparse_grad:
        raise NotImplementedError(f"{user_source_line()}: gather(sparse_grad=True): gradients are dense here")
    x, index = lift(input), index_tensor(index, "gather")
    (axis,) = reduction_axes(x, int(dim), "gather")
    return apply("gather_axis", x, index, axis=axis)


def scatter_add(input, dim: int, index, src) -> Tensor:
    """torch.scatter_add: input plus each src[q] (q over index's positions) added at q with
    q[dim] = index[q], in order (an index outside the dim adds nothing: torch raises)."""
    x, index, src = lift(input), index_tensor(index, "scatter_add"), lift(src)
    (axis,) = reduction_axes(x, int(dim), "scatter_add")
    return x + apply("scatter_axis_add", src, index, axis=axis, shape=x.shape)


def scatter(input, dim: int, index, src=None, *, value=None, reduce=None) -> Tensor:
    """torch.scatter: input with src[q] (or the number `value`) written at q with q[dim] = index[q].
    Where index repeats a place, torch leaves which src value lands unspecified; here they add up
    (a `value` lands as it is)."""
    if reduce is not None:
        raise NotImplementedError(f"{user_source_line()}: scatter(reduce={reduce!r}): use scatter_add")
    if is_number(src):  # torch's scatter(dim, index, value) overload
        src, value = None, src
    if (src is None) == (value is None):
        raise TypeError(f"{user_source_line()}: scatter takes one of src and value")
    x, index = lift(input), index_tensor(index, "scatter")
    (axis,) = reduction_axes(x, int(dim), "scatter")
    hits = apply("scatter_axis_add", broadcast_to(lift(1.0), index.shape), index, axis=axis, shape=x.shape)
    placed = float(value) if src is None else apply("scatter_axis_add", lift(src), index, axis=axis, shape=x.shape)
    return where(hits, placed, x)


def one_hot(tensor, num_classes: int = -1) -> Tensor:
    """torch.nn.functional.one_hot: i32 [..., num_classes], 1 at each class index (a row of 0
    for an index outside [0, num_classes): torch raises). num_classes must be given: the
    largest index is known only when the step runs."""
    labels = lift(tensor)
    if labels.dtype != "i32":
        raise ShapeError(f"{user_source_line()}: one_hot: expected i32 class indices, got {labels.type}")
    if num_classes is None or int(num_classes) < 0:
        raise ValueError(
            f"{user_source_line()}: one_hot: give num_classes (num_classes=-1 takes the largest index + 1, which is "
            "known only when the step runs)"
        )
    classes = arange(int(num_classes), dtype="f32")
    return to_dtype(unsqueeze(labels, -1) == classes, "i32")


# -- selections with indices -----------------------------------------------------------------


def is_device(value: Any) -> bool:
    """Whether `value` names a device: a string that is no dtype's name ("cuda:0"), or a torch.device."""
    if isinstance(value, str):
        return value not in F32_NAMES + I32_NAMES
    return isinstance(getattr(value, "type", None), str) and hasattr(value, "index")


class ValuesIndices(tuple):
    """(values, indices), as torch's return types of max(dim), min(dim), topk and sort."""

    __slots__ = ()

    def __new__(cls, values: Tensor, indices: Tensor):
        return super().__new__(cls, (values, indices))

    @property
    def values(self) -> Tensor:
        return self[0]

    @property
    def indices(self) -> Tensor:
        return self[1]

    def __repr__(self) -> str:
        return f"ValuesIndices(values={self[0]!r}, indices={self[1]!r})"


def float_values(x: Tensor) -> Tensor:
    return to_dtype(x, "f32")  # i32 values compare as f32: exact below 2^24


def extreme_along(input, dim, keepdim: bool, largest: bool) -> ValuesIndices:
    x = float_values(lift(input))
    if x.ndim == 0:
        x = reshape(x, (1,))
        values, indices = apply_results("arg_reduce", x, axis=0, keepdim=False, largest=largest)
        return ValuesIndices(values, indices)
    (axis,) = reduction_axes(x, int(dim), "max" if largest else "min")
    return ValuesIndices(*apply_results("arg_reduce", x, axis=axis, keepdim=bool(keepdim), largest=largest))


def argextreme(input, dim, keepdim: bool, largest: bool) -> Tensor:
    x = lift(input)
    if dim is None:
        index = extreme_along(reshape(x, (-1,)), 0, False, largest).indices
        return reshape(index, (1,) * x.ndim) if keepdim else index
    return extreme_along(x, dim, keepdim, largest).indices


def argmax(input, dim=None, keepdim: bool = False) -> Tensor:
    """torch.argmax: the i32 index of the maximum along `dim` (of the flattened tensor when dim is
    None): the first of ties, and NaN counts as the maximum."""
    return argextreme(input, dim, keepdim, largest=True)


def argmin(input, dim=None, keepdim: bool = False) -> Tensor:
    """torch.argmin: the i32 index of the minimum along `dim` (flattened when None): the first of
    ties, and NaN counts as the minimum."""
    return argextreme(input, dim, keepdim, largest=False)


def amin(x, dim=None, keepdim: bool = False) -> Tensor:
    """The minimum over `dim` (torch.amin); the gradient is split evenly between ties."""
    return -amax(-lift(x), dim, keepdim)


def elementwise_extreme(op: str, input, other) -> Tensor:
    from meganeura.ir.op import OPS

    if op not in OPS:
        raise NotImplementedError(f"{user_source_line()}: the elementwise {op} of two tensors is not here yet")
    return apply(op, input, other)


def extreme_of_all(input, largest: bool) -> Tensor:
    """torch.max(x) / torch.min(x) with no dim: the extreme of every element (NaN if any is NaN),
    its gradient split evenly between the elements equal to it, or between the NaNs when it is
    NaN (torch's evenly_distribute_backward; amax's gradient over a NaN is NaN everywhere)."""
    x = lift(input)
    peak = (amax(x) if largest else amin(x)).detach()
    nan = apply("isnan", x) * apply("isnan", peak)
    chosen = apply("equal", x, peak) + nan  # disjoint: x == NaN is never true
    share = (chosen / sum(chosen)).detach()
    carrier = sum(where(chosen, x, 0.0) * share)
    return apply("value_with_gradient_of", peak, carrier)


def tensor_max(input, dim=None, keepdim: bool = False):
    """torch.max: with no dim the maximum of all elements (the gradient split between ties, or
    between the NaNs: `extreme_of_all`); with a dim, (values, indices) along it (first of ties,
    NaN counts as the maximum; the gradient goes to that index alone); with a tensor, the
    elementwise maximum."""
    if isinstance(dim, Tensor):
        return elementwise_extreme("maximum", input, dim)
    if dim is None:
        return extreme_of_all(input, largest=True)
    return extreme_along(input, dim, keepdim, largest=True)


def tensor_min(input, dim=None, keepdim: bool = False):
    """torch.min: the minimum of all elements, (values, indices) along a dim, or the elementwise
    minimum with a tensor (see tensor_max)."""
    if isinstance(dim, Tensor):
        return elementwise_extreme("minimum", input, dim)
    if dim is None:
        return extreme_of_all(input, largest=False)
    return extreme_along(input, dim, keepdim, largest=False)


tensor_max.__name__ = tensor_max.__qualname__ = "max"
tensor_min.__name__ = tensor_min.__qualname__ = "min"


def topk(input, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    """torch.topk: (values, indices) of the k largest (smallest) along `dim`, in order; NaN counts
    as the largest; ties in order of index (torch leaves their order unspecified). The result is
    sorted with sorted=False too (torch leaves that order unspecified). The gradient goes to the
    indices."""
    x = float_values(lift(input))
    if x.ndim == 0:  # torch: a scalar is its own top 1 (k 0 or 1), as a scalar
        values, indices = topk(reshape(x, (1,)), k, 0, largest)
        return ValuesIndices(reshape(values, ()), reshape(indices, ())) if k else ValuesIndices(values, indices)
    (axis,) = reduction_axes(x, int(dim), "topk")
    if not 0 <= int(k) <= x.shape[axis]:
        raise ShapeError(f"{user_source_line()}: topk: k = {k} is out of range for dim {dim} of {x.type}")
    return ValuesIndices(*apply_results("topk", x, k=int(k), axis=axis, largest=bool(largest)))


def sort(input, dim: int = -1, descending: bool = False, *, stable: bool = False) -> ValuesIndices:
    """torch.sort: (values, indices) along `dim`, ascending (descending); NaN sorts as the largest;
    always stable (ties in order of index)."""
    x = lift(input)
    size = x.shape[reduction_axes(x, int(dim), "sort")[0]] if x.ndim else 1
    return topk(x, size, dim, largest=bool(descending))


def argsort(input, dim: int = -1, descending: bool = False, *, stable: bool = False) -> Tensor:
    """torch.argsort: the i32 indices that sort `input` along `dim` (see sort)."""
    return sort(input, dim, descending, stable=stable).indices


# -- Tensor methods --------------------------------------------------------------------------


class SelectionMethods:
    """The Tensor methods of this section (copied onto Tensor below)."""

    def float(self) -> Tensor:
        """torch.Tensor.float: as f32 (itself where it is; i32 → f32 is exact below 2^24)."""
        return to_dtype(self, "f32")

    def long(self) -> Tensor:
        """torch.Tensor.long: as i32 (meganeura's integers), truncating toward zero."""
        return to_dtype(self, "i32")

    def int(self) -> Tensor:
        """torch.Tensor.int: as i32, truncating toward zero."""
        return to_dtype(self, "i32")

    def type_as(self, other) -> Tensor:
        """torch.Tensor.type_as: as other's dtype."""
        return to_dtype(self, lift(other).dtype)

    def to(self, *args, **kwargs) -> Tensor:
        """torch.Tensor.to: to a dtype, or another tensor's; a device (a string such as "cuda", or a
        torch.device) has no effect: the step runs on the adapter compile() chose. non_blocking and
        copy have no effect either: traced values are never changed in place."""
        unknown = sorted(set(kwargs) - {"dtype", "device", "non_blocking", "copy"})
        if unknown:
            raise TypeError(f"{user_source_line()}: to() got unsupported arguments {unknown}")
        dtype = kwargs.get("dtype")
        for arg in args:
            if isinstance(arg, Tensor):
                dtype = arg.dtype
            elif not is_device(arg) and not isinstance(arg, bool):
                dtype = arg
        return self if dtype is None else to_dtype(self, dtype)

    def new_full(self, size, fill_value, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
        """torch.Tensor.new_full: `size` filled with `fill_value`, in this tensor's dtype by default."""
        return full(size, fill_value, dtype=dtype or self.dtype, requires_grad=requires_grad)

    def new_zeros(self, *size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
        """torch.Tensor.new_zeros: zeros of `size`, in this tensor's dtype by default."""
        return full(size_argument(size), 0, dtype=dtype or self.dtype, requires_grad=requires_grad)

    def new_ones(self, *size, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
        """torch.Tensor.new_ones: ones of `size`, in this tensor's dtype by default."""
        return full(size_argument(size), 1, dtype=dtype or self.dtype, requires_grad=requires_grad)

    def new_tensor(self, data, *, dtype=None, device=None, requires_grad: bool = False) -> Tensor:
        """torch.Tensor.new_tensor: a constant of `data`, in this tensor's dtype by default."""
        return tensor(data, dtype=dtype or self.dtype, requires_grad=requires_grad)

    def tril(self, diagonal: int = 0) -> Tensor:
        return tril(self, diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        return triu(self, diagonal)

    def flip(self, *dims) -> Tensor:
        return flip(self, dims_argument(dims))

    def fliplr(self) -> Tensor:
        return fliplr(self)

    def flipud(self) -> Tensor:
        return flipud(self)

    def roll(self, shifts, dims=None) -> Tensor:
        return roll(self, shifts, dims)

    def cumsum(self, dim: int, *, dtype=None) -> Tensor:
        return cumsum(self, dim, dtype=dtype)

    def cumprod(self, dim: int, *, dtype=None) -> Tensor:
        return cumprod(self, dim, dtype=dtype)

    def gather(self, dim: int, index, *, sparse_grad: bool = False) -> Tensor:
        return gather(self, dim, index, sparse_grad=sparse_grad)

    def scatter_add(self, dim: int, index, src) -> Tensor:
        return scatter_add(self, dim, index, src)

    def scatter(self, dim: int, index, src=None, *, value=None, reduce=None) -> Tensor:
        return scatter(self, dim, index, src, value=value, reduce=reduce)

    def index_select(self, dim: int, index) -> Tensor:
        return index_select(self, dim, index)

    def take(self, index) -> Tensor:
        return take(self, index)

    def argmax(self, dim=None, keepdim: bool = False) -> Tensor:
        return argmax(self, dim, keepdim)

    def argmin(self, dim=None, keepdim: bool = False) -> Tensor:
        return argmin(self, dim, keepdim)

    def amin(self, dim=None, keepdim: bool = False) -> Tensor:
        return amin(self, dim, keepdim)

    def max(self, dim=None, keepdim: bool = False):
        return tensor_max(self, dim, keepdim)

    def min(self, dim=None, keepdim: bool = False):
        return tensor_min(self, dim, keepdim)

    def topk(self, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
        return topk(self, k, dim, largest, sorted)

    def sort(self, dim: int = -1, descending: bool = False, *, stable: bool = False) -> ValuesIndices:
        return sort(self, dim, descending, stable=stable)

    def argsort(self, dim: int = -1, descending: bool = False, *, stable: bool = False) -> Tensor:
        return argsort(self, dim, descending, stable=stable)


for _name, _method in vars(SelectionMethods).items():
    if not _name.startswith("__"):
        setattr(Tensor, _name, _method)


def square(input) -> Tensor:
    """input · input (torch.square)."""
    x = lift(input)
    return x * x


def reciprocal(input) -> Tensor:
    """1 / input (torch.reciprocal)."""
    return apply("div", 1.0, input)


def sign(input) -> Tensor:
    """1 where input > 0, −1 where input < 0, 0 at ±0 and NaN, as torch.sign; gradient 0."""
    x = lift(input)
    return apply("greater", x, 0.0) - apply("less", x, 0.0)


def round(input, decimals: int = 0) -> Tensor:
    """input rounded to `decimals` decimal places, halves to even (torch.round: with decimals,
    round(x·10^d)/10^d, or round(x/10^−d)·10^−d for negative d); gradient 0."""
    x = lift(input)
    decimals = int(decimals)
    if decimals == 0:
        return apply("round", x)
    scale = 10.0 ** abs(decimals)
    if decimals > 0:
        return apply("round", x * scale) / scale
    return apply("round", x / scale) * scale


# ---------------------------------------------------------------------------------------------
# Composites PyTorch keeps on torch and Tensor: splitting and joining, repetition, statistics
# and norms, products with broadcast batch dims, einsum. Each is traced from the primitives
# above (slices, reshapes, broadcast_to, concat, sum, amax, matmul, elementwise functions), so
# autodiff derives the backward and the e-graph fuses them; none adds an op.


def dim_index(x: Tensor, dim: int, op: str) -> int:
    """`dim` of x made non-negative, or an error naming the user's line."""
    (axis,) = reduction_axes(x, int(dim), op)
    return axis


def narrow(input, dim: int, start: int, length: int) -> Tensor:
    """input[..., start:start + length, ...] along `dim` (torch.narrow)."""
    x = lift(input)
    axis = dim_index(x, dim, "narrow")
    size = x.shape[axis]
    start = int(start) + size if int(start) < 0 else int(start)
    if not (0 <= start <= size and 0 <= length and start + length <= size):
        raise ShapeError(
            f"{user_source_line()}: narrow: {start}:{start + length} is out of range for dim {dim} of {x.type}"
        )
    return getitem(x, (slice(None),) * axis + (slice(start, start + int(length)),))


def split(tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    """Consecutive pieces of `tensor` along `dim` (torch.split): of split_size_or_sections elements
    each (an int; the last may be shorter), or of the sizes it lists (they must add up to the dim)."""
    x = lift(tensor)
    axis = dim_index(x, dim, "split")
    size = x.shape[axis]
    if isinstance(split_size_or_sections, (int, np.integer)):
        step = int(split_size_or_sections)
        if step <= 0 and size:
            raise ValueError(f"{user_source_line()}: split: split_size must be positive, got {step}")
        sizes = [min(step, size - start) for start in range(0, size, step)] if size else [0]
    else:
        sizes = [int(s) for s in split_size_or_sections]
        if builtins.sum(sizes) != size or any(s < 0 for s in sizes):
            raise ValueError(
                f"{user_source_line()}: split: sizes {sizes} do not add up to {size}, the size of dim {dim} of {x.type}"
            )
    pieces, start = [], 0
    for length in sizes:
        pieces.append(narrow(x, axis, start, length))
        start += length
    return tuple(pieces)


def chunk(input, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    """`chunks` pieces along `dim` (torch.chunk): each ⌈size/chunks⌉ long, the last shorter, and
    fewer pieces where that size covers the dim sooner (6 in 4 chunks: 2, 2, 2)."""
    x = lift(input)
    if int(chunks) <= 0:
        raise ValueError(f"{user_source_line()}: chunk: chunks must be positive, got {chunks}")
    size = x.shape[dim_index(x, dim, "chunk")]
    return split(x, max(-(-size // int(chunks)), 1), dim)


def unbind(input, dim: int = 0) -> tuple[Tensor, ...]:
    """The slices of `input` along `dim`, that dim removed (torch.unbind)."""
    x = lift(input)
    axis = dim_index(x, dim, "unbind")
    return tuple(getitem(x, (slice(None),) * axis + (i,)) for i in range(x.shape[axis]))


def stack(tensors, dim: int = 0) -> Tensor:
    """The tensors, all of one shape, joined along a new dim `dim` (torch.stack)."""
    tensors = [lift(t) for t in tensors]
    if not tensors:
        raise ShapeError(f"{user_source_line()}: stack: expected a non-empty list of tensors")
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape:
            raise ShapeError(
                f"{user_source_line()}: stack: expects each tensor to be equal size, got {first.type} and {t.type}"
            )
    if not -first.ndim - 1 <= dim <= first.ndim:
        raise ShapeError(f"{user_source_line()}: stack: dim {dim} is out of range for {first.ndim + 1} dims")
    dim %= first.ndim + 1
    return cat([unsqueeze(t, dim) for t in tensors], dim)


def repeat(input, *sizes) -> Tensor:
    """`input` tiled sizes[i] times along each dim (torch.Tensor.repeat; sizes may add leading
    dims): one broadcast_to of input with a dim of 1 before each, and a reshape."""
    x = lift(input)
    sizes = tuple(int(s) for s in dims_argument(sizes))
    if len(sizes) < x.ndim:
        raise ShapeError(
            f"{user_source_line()}: repeat: number of repeat dims ({len(sizes)}) can not be smaller than the "
            f"number of dims of the tensor ({x.ndim})"
        )
    if any(s < 0 for s in sizes):
        raise ValueError(f"{user_source_line()}: repeat: sizes must be non-negative, got {list(sizes)}")
    shape = (1,) * (len(sizes) - x.ndim) + x.shape
    spread = reshape(x, tuple(d for n in shape for d in (1, n)))
    tiled = broadcast_to(spread, tuple(d for r, n in zip(sizes, shape, strict=True) for d in (r, n)))
    return reshape(tiled, tuple(r * n for r, n in zip(sizes, shape, strict=True)))


def tile(input, dims) -> Tensor:
    """`input` tiled dims[i] times along each dim (torch.tile): repeat, with dims padded with
    leading 1s where it has fewer entries than input has dims."""
    x = lift(input)
    dims = tuple(int(d) for d in ((dims,) if isinstance(dims, (int, np.integer)) else dims))
    return repeat(x, (1,) * (x.ndim - len(dims)) + dims)


def repeat_interleave(input, repeats, dim: int | None = None, *, output_size: int | None = None) -> Tensor:
    """Each element repeated `repeats` times along `dim` (torch.repeat_interleave with an int
    repeats; dim=None flattens first): a broadcast_to and a reshape. Tensor repeats are not supported."""
    x = lift(input)
    if isinstance(repeats, Tensor) or not isinstance(repeats, (int, np.integer)):
        raise NotImplementedError(f"{user_source_line()}: repeat_interleave: only an int repeats is supported")
    count = int(repeats)
    if count < 0:
        raise ValueError(f"{user_source_line()}: repeat_interleave: repeats must be non-negative, got {count}")
    if dim is None:
        x, dim = flatten(x), 0
    axis = dim_index(x, dim, "repeat_interleave")
    if output_size is not None and int(output_size) != x.shape[axis] * count:
        raise ValueError(
            f"{user_source_line()}: repeat_interleave: output_size {output_size} != {x.shape[axis] * count}"
        )
    spread = unsqueeze(x, axis + 1)
    wide = broadcast_to(spread, spread.shape[: axis + 1] + (count,) + spread.shape[axis + 2 :])
    return reshape(wide, x.shape[:axis] + (x.shape[axis] * count,) + x.shape[axis + 1 :])


def prod(input, dim: int | None = None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """The product over `dim` (one int; all dims when None), like torch.prod: a tree of products
    of the two halves (log₂ n slices and products), so that autodiff's gradient is exact where
    elements are 0 too. dtype must be None."""
    x = lift(input)
    if dtype is not None:
        raise NotImplementedError(f"{user_source_line()}: prod: dtype is not supported")
    if dim is None:
        whole = prod(reshape(x, (x.numel(),)), 0, keepdim=True)
        return reshape(whole, (1,) * x.ndim if keepdim else ())
    axis = dim_index(x, dim, "prod")
    while x.shape[axis] > 1:
        half = x.shape[axis] // 2
        product = narrow(x, axis, 0, half) * narrow(x, axis, half, half)
        x = cat([product, narrow(x, axis, 2 * half, 1)], axis) if x.shape[axis] % 2 else product
    if x.shape[axis] == 0:  # the empty product
        x = broadcast_to(1.0, x.shape[:axis] + (1,) + x.shape[axis + 1 :])
    return x if keepdim else squeeze(x, axis)


def correction_of(unbiased, correction, op: str) -> float:
    """The divisor's correction: PyTorch's `correction` (1 by default), or 1/0 from `unbiased`."""
    if unbiased is not None and correction is not None:
        raise TypeError(f"{user_source_line()}: {op}: pass either unbiased or correction, not both")
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased is None or unbiased else 0.0


def variance(x: Tensor, dim, keepdim: bool, correction: float, op: str) -> tuple[Tensor, Tensor]:
    """(Σ(x − mean)² / max(0, n − correction), mean) over `dim`: Σ/0 where n ≤ correction (inf or NaN, as PyTorch)."""
    axes = reduction_axes(x, dim, op)
    centre = mean(x, axes, keepdim=True)
    centred = x - centre
    total = sum(centred * centred, axes, keepdim)
    count = math.prod(x.shape[a] for a in axes)
    divisor = builtins.max(0.0, count - correction)
    if divisor:
        result = total * (1.0 / divisor)
    else:  # Σ/0: inf, NaN for 0/0; spelled out, as WGSL lets a compiler assume no division makes them
        result = where(total > 0.0, math.inf, where(total == 0.0, math.nan, total))
    return result, centre if keepdim else reshape(centre, result.shape)


def statistics_arguments(dim, unbiased, keepdim, correction, op: str):
    """var(x, dim, unbiased, keepdim) and var(x, unbiased) (a bool second argument) as PyTorch takes them."""
    if isinstance(dim, bool):
        if unbiased is not None:
            raise TypeError(f"{user_source_line()}: {op}: unbiased given twice")
        dim, unbiased = None, dim
    return dim, bool(keepdim), correction_of(unbiased, correction, op)


def var(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """The variance over `dim` (torch.var): Σ(x − mean)² / (n − correction), correction 1 by
    default (unbiased=False is correction=0)."""
    x = lift(input)
    dim, keepdim, correction = statistics_arguments(dim, unbiased, keepdim, correction, "var")
    return variance(x, dim, keepdim, correction, "var")[0]


def std(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    """√var (torch.std), with var's arguments."""
    return apply("sqrt", var(input, dim, unbiased, keepdim, correction=correction))


def var_mean(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> tuple[Tensor, Tensor]:
    """(var, mean) over `dim` (torch.var_mean)."""
    x = lift(input)
    dim, keepdim, correction = statistics_arguments(dim, unbiased, keepdim, correction, "var_mean")
    return variance(x, dim, keepdim, correction, "var_mean")


def std_mean(input, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> tuple[Tensor, Tensor]:
    """(std, mean) over `dim` (torch.std_mean)."""
    value, centre = var_mean(input, dim, unbiased, keepdim, correction=correction)
    return apply("sqrt", value), centre


def root(total: Tensor, order: float) -> Tensor:
    """total^(1/order) for total ≥ 0, with a zero gradient at 0 (PyTorch's norm backward masks it)."""
    positive = total > 0.0
    safe = where(positive, total, 1.0)
    value = apply("sqrt", safe) if order == 2.0 else apply("exp", apply("log", safe) * (1.0 / order))
    return where(positive, value, 0.0)


def vector_norm(x, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """(Σ|x|^ord)^(1/ord) over `dim` (all dims by default), like torch.linalg.vector_norm: ord inf
    is amax(|x|), −inf amin(|x|), 0 the count of nonzeros, 1 Σ|x|, 2 √Σx². The gradient at a
    zero vector is 0, as PyTorch's. dtype must be None."""
    x = lift(x)
    if dtype is not None:
        raise NotImplementedError(f"{user_source_line()}: vector_norm: dtype is not supported")
    if not is_number(ord):
        raise ValueError(f"{user_source_line()}: vector_norm: ord must be a number, got {ord!r}")
    order = float(ord)
    axes = reduction_axes(x, dim, "vector_norm")
    if order == math.inf:
        return amax(apply("abs", x), axes, keepdim)
    if order == -math.inf:
        return amin(apply("abs", x), axes, keepdim)
    if order == 0.0:
        return sum(apply("not_equal", x, 0.0), axes, keepdim)
    if order == 1.0:
        return sum(apply("abs", x), axes, keepdim)
    if order == 2.0:
        return root(sum(x * x, axes, keepdim), 2.0)
    size = apply("abs", x)
    nonzero = size > 0.0
    powers = where(nonzero, apply("exp", apply("log", where(nonzero, size, 1.0)) * order), 0.0)
    return root(sum(powers, axes, keepdim), order)


def norm(input, p="fro", dim=None, keepdim: bool = False, out=None, dtype=None) -> Tensor:
    """torch.norm for vector norms: p="fro" (or 2) is √Σx² over `dim` (all dims by default), a
    number p is vector_norm's ord. Not supported: p="nuc" (the nuclear norm), out, dtype."""
    if out is not None:
        raise NotImplementedError(f"{user_source_line()}: norm: out= is not supported")
    if p == "fro" or p is None:
        p = 2
    if isinstance(p, str):
        raise NotImplementedError(f"{user_source_line()}: norm: p={p!r} is not supported (use 'fro' or a number)")
    return vector_norm(input, p, dim, keepdim, dtype=dtype)


def logsumexp(input, dim, keepdim: bool = False) -> Tensor:
    """log Σ exp(x) over `dim` (torch.logsumexp), stably: m = amax(x) (0 where it is ±inf) is
    subtracted before exp and added after, so that a row of −inf gives −inf and +inf gives +inf."""
    x = lift(input)
    axes = reduction_axes(x, dim, "logsumexp")
    peak = amax(x, axes, keepdim=True)
    peak = where(apply("abs", peak) == math.inf, 0.0, peak)
    total = apply("log", sum(apply("exp", x - peak), axes, keepdim))
    return total + (peak if keepdim else reshape(peak, total.shape))


def mm(input, mat2) -> Tensor:
    """The product of two matrices (torch.mm): [n, m] @ [m, p]."""
    a, b = lift(input), lift(mat2)
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"{user_source_line()}: mm: expected 2-D tensors, got {a.type} and {b.type}")
    return matmul(a, b)


def bmm(input, mat2) -> Tensor:
    """Batched products of matrices (torch.bmm): [b, n, m] @ [b, m, p]."""
    a, b = lift(input), lift(mat2)
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0]:
        raise ShapeError(
            f"{user_source_line()}: bmm: expected 3-D tensors of one batch size, got {a.type} and {b.type}"
        )
    return matmul(a, b)


def outer(input, vec2) -> Tensor:
    """The outer product of two vectors (torch.outer): [n] and [m] → [n, m], a broadcast product."""
    a, b = lift(input), lift(vec2)
    if a.ndim != 1 or b.ndim != 1:
        raise ShapeError(f"{user_source_line()}: outer: expected 1-D tensors, got {a.type} and {b.type}")
    return unsqueeze(a, 1) * b


def scaled_sum(input, product: Tensor, beta, alpha) -> Tensor:
    """beta·input + alpha·product, with PyTorch's rule that beta = 0 ignores input (NaN included)."""
    product = product if alpha == 1 else product * float(alpha)
    if beta == 0:
        return product
    return (lift(input) if beta == 1 else lift(input) * float(beta)) + product


def addmm(input, mat1, mat2, *, beta=1, alpha=1) -> Tensor:
    """beta·input + alpha·(mat1 @ mat2) (torch.addmm; input broadcasts to the product)."""
    return scaled_sum(input, mm(mat1, mat2), beta, alpha)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1) -> Tensor:
    """beta·input + alpha·(batch1 @ batch2) per batch (torch.baddbmm)."""
    return scaled_sum(input, bmm(batch1, batch2), beta, alpha)


# -- einsum -------------------------------------------------------------------------------------
#
# An equation is lowered one operand at a time: repeated letters of an operand become its
# diagonal (a strided slice of the flattened pair), letters no one else needs are summed out, then
# operands are contracted left to right, each pair as one (batched) matmul [batch, M, K] @ [batch,
# K, N] of permuted and reshaped operands (the e-graph folds the transposes into the product), a
# broadcast product where nothing is contracted, or a product and sum where only K is left.


def einsum(equation: str, *operands) -> Tensor:
    """torch.einsum: `equation` as "ij,jk->ik" (or without "->": the letters used once, sorted),
    with "..." for broadcast leading dims; operands may also be given as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    tensors = [lift(t) for t in operands]
    at = user_source_line()
    inputs, output = parse_einsum(equation.replace(" ", ""), [t.ndim for t in tensors], at)
    sizes: dict[str, int] = {}
    for letters, t in zip(inputs, tensors, strict=True):
        for letter, size in zip(letters, t.shape, strict=True):
            known = sizes.get(letter, 1)
            if size != 1 and known != 1 and size != known:
                raise ShapeError(f"{at}: einsum: subscript {letter!r} has size {size} and {known} in {equation!r}")
            sizes[letter] = builtins.max(known, size)
    terms = [einsum_diagonal(t, letters) for t, letters in zip(tensors, inputs, strict=True)]
    needed_later = [set(output).union(*(set(letters) for _, letters in terms[i + 1 :])) for i in range(len(terms))]
    value, letters = einsum_reduce(*terms[0], needed_later[0])
    for index in range(1, len(terms)):
        other, other_letters = einsum_reduce(*terms[index], needed_later[index] | set(letters))
        value, letters = einsum_pair(value, letters, other, other_letters, needed_later[index], sizes)
    value, letters = einsum_reduce(value, letters, set(output))
    value = broadcast_to(value, tuple(sizes[c] for c in letters))
    return permute(value, tuple(letters.index(c) for c in output))


ELLIPSIS_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # stand-ins for "..." dims (torch takes only a-z, A-Z: see below)


def parse_einsum(equation: str, ranks: list[int], at: str) -> tuple[list[str], str]:
    """(the letters of each operand, the output's letters), "..." expanded to stand-in letters
    aligned from the right (the broadcast dims), the output implicit where "->" is missing."""
    lhs, arrow, rhs = equation.partition("->")
    inputs = lhs.split(",")
    if len(inputs) != len(ranks):
        raise ValueError(f"{at}: einsum: {equation!r} has {len(inputs)} operand(s), {len(ranks)} given")
    letters_used = set(equation) - set(".,->")
    if not all(c.isalpha() and c.isascii() for c in letters_used):
        raise ValueError(f"{at}: einsum: subscripts must be letters, got {equation!r}")
    stand_ins = "".join(c for c in ELLIPSIS_LETTERS if c not in letters_used)
    widest = 0
    expanded = []
    for term, rank in zip(inputs, ranks, strict=True):
        if "..." in term:
            head, _, tail = term.partition("...")
            width = rank - len(head) - len(tail)
            if width < 0 or "." in head + tail:
                raise ValueError(f"{at}: einsum: {term!r} does not fit an operand of {rank} dims")
            widest = builtins.max(widest, width)
            term = head + stand_ins[len(stand_ins) - width :] + tail if width else head + tail
        if len(term) != rank or "." in term:
            raise ValueError(f"{at}: einsum: {term!r} does not fit an operand of {rank} dims")
        expanded.append(term)
    ellipsis = stand_ins[len(stand_ins) - widest :] if widest else ""
    if arrow:
        if rhs.count("...") > 1 or "." in rhs.replace("...", ""):
            raise ValueError(f"{at}: einsum: bad output {rhs!r}")
        output = rhs.replace("...", ellipsis)
        missing = set(output) - set("".join(expanded))
        if missing or len(set(output)) != len(output):
            raise ValueError(f"{at}: einsum: output {rhs!r} names a subscript twice or one no operand has")
    else:
        counts = {c: "".join(expanded).count(c) for c in set("".join(expanded)) - set(ellipsis)}
        output = ellipsis + "".join(sorted(c for c, n in counts.items() if n == 1))
    return expanded, output


def einsum_diagonal(x: Tensor, letters: str) -> tuple[Tensor, str]:
    """x with each repeated letter's dims replaced by their diagonal (x[i, i] as a strided slice)."""
    while len(set(letters)) != len(letters):
        letter = next(c for c in letters if letters.count(c) > 1)
        first = letters.index(letter)
        second = letters.index(letter, first + 1)
        size = x.shape[first]
        if x.shape[second] != size:
            raise ShapeError(f"{user_source_line()}: einsum: the diagonal of {letter!r} needs equal dims, got {x.type}")
        rest = [i for i in range(x.ndim) if i not in (first, second)]
        moved = permute(x, (*rest, first, second))
        flat = reshape(moved, moved.shape[:-2] + (size * size,))
        x = getitem(flat, (..., slice(0, size * size, size + 1)))
        letters = "".join(letters[i] for i in rest) + letter
    return x, letters


def einsum_reduce(x: Tensor, letters: str, keep: set[str]) -> tuple[Tensor, str]:
    """x summed over the letters not in `keep`."""
    axes = tuple(i for i, c in enumerate(letters) if c not in keep)
    if not axes:
        return x, letters
    return sum(x, axes), "".join(c for c in letters if c in keep)


def einsum_pair(a: Tensor, la: str, b: Tensor, lb: str, keep: set[str], sizes: dict[str, int]) -> tuple[Tensor, str]:
    """The contraction of a and b over their shared letters not in `keep` (which both keep)."""
    batch = [c for c in la if c in lb and c in keep]
    contracted = [c for c in la if c in lb and c not in keep]
    rows = [c for c in la if c not in lb]
    cols = [c for c in lb if c not in la]

    def arranged(x: Tensor, letters: str, order: list[str]) -> Tensor:
        x = permute(x, tuple(letters.index(c) for c in order))
        return broadcast_to(x, tuple(sizes[c] for c in order))

    if not contracted or (not rows and not cols):  # a broadcast product (and a sum over K)
        order = batch + rows + cols + contracted
        x = arranged(a, la, [c for c in order if c in la])
        y = arranged(b, lb, [c for c in order if c in lb])
        x = reshape(x, tuple(sizes[c] if c in la else 1 for c in order))
        y = reshape(y, tuple(sizes[c] if c in lb else 1 for c in order))
        product = x * y
        if contracted:
            product = sum(product, tuple(range(len(order) - len(contracted), len(order))))
        return product, "".join(batch + rows + cols)
    batch_shape = tuple(sizes[c] for c in batch)
    m, k, n = (math.prod(sizes[c] for c in group) for group in (rows, contracted, cols))
    x = reshape(arranged(a, la, batch + rows + contracted), batch_shape + (m, k))
    y = reshape(arranged(b, lb, batch + contracted + cols), batch_shape + (k, n))
    product = matmul(x, y)
    return reshape(product, batch_shape + tuple(sizes[c] for c in rows + cols)), "".join(batch + rows + cols)


def diagonal(input, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The diagonal of the dims dim1 and dim2 (torch.diagonal): x[..., i, i + offset], that pair
    of dims removed and the diagonal appended last; a strided slice of the pair flattened."""
    x = lift(input)
    first, second = dim_index(x, dim1, "diagonal"), dim_index(x, dim2, "diagonal")
    if first == second:
        raise ShapeError(f"{user_source_line()}: diagonal: dim1 and dim2 cannot be the same dim, got {dim1}")
    rows, cols = x.shape[first], x.shape[second]
    offset = int(offset)
    length = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
    rest = [i for i in range(x.ndim) if i not in (first, second)]
    flat = reshape(permute(x, (*rest, first, second)), tuple(x.shape[i] for i in rest) + (rows * cols,))
    start = offset if offset >= 0 else -offset * cols
    if length == 0:
        return getitem(flat, (..., slice(0, 0)))
    return getitem(flat, (..., slice(start, start + (length - 1) * (cols + 1) + 1, cols + 1)))


def diff(input, n: int = 1, dim: int = -1, prepend=None, append=None) -> Tensor:
    """The n-th forward difference along `dim` (torch.diff): x[1:] − x[:-1], n times, after
    joining `prepend` and `append` (tensors) along that dim."""
    x = lift(input)
    axis = dim_index(x, dim, "diff")
    parts = [lift(t) for t in (prepend, x, append) if t is not None]
    x = cat(parts, axis) if len(parts) > 1 else x
    for _ in range(int(n)):
        if x.shape[axis] == 0:
            break
        x = narrow(x, axis, 1, x.shape[axis] - 1) - narrow(x, axis, 0, x.shape[axis] - 1)
    return x


def nan_to_num(input, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    """input with NaN, +inf and −inf replaced (torch.nan_to_num: by default 0, and the largest and
    smallest finite f32); the gradient flows where input is finite."""
    x = lift(input)
    top = float(np.finfo(np.float32).max) if posinf is None else float(posinf)
    bottom = float(np.finfo(np.float32).min) if neginf is None else float(neginf)
    x = where(apply("isnan", x), float(nan), x)
    x = where(apply("equal", x, math.inf), top, x)
    return where(apply("equal", x, -math.inf), bottom, x)


# Tensor methods of the composites above (torch.Tensor's names; each takes the tensor first).
for _name, _function in {
    "split": split, "chunk": chunk, "unbind": unbind, "narrow": narrow, "repeat": repeat, "tile": tile,
    "repeat_interleave": repeat_interleave, "amin": amin, "prod": prod, "var": var, "std": std, "norm": norm,
    "logsumexp": logsumexp, "matmul": matmul, "mm": mm, "bmm": bmm, "outer": outer, "addmm": addmm,
    "baddbmm": baddbmm, "diagonal": diagonal, "diff": diff, "nan_to_num": nan_to_num,
}.items():  # fmt: skip
    setattr(Tensor, _name, _function)
