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

    def float(self) -> Tensor:
        """The tensor as f32 (torch.Tensor.float): the identity on f32 (masks are f32 already);
        i32 values cannot be cast yet."""
        if self.dtype != "f32":
            raise ShapeError(f"{user_source_line()}: float(): casting {self.type} to f32 is not supported")
        return self

    def pow(self, exponent) -> Tensor:
        return pow(self, exponent)


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


def pow(x, exponent) -> Tensor:
    """x ** exponent for the exponents a model uses: 1, 2 and 3 as products (x·x for 2),
    0.5 as sqrt, −0.5 as rsqrt, −1 as 1/x."""
    x = lift(x)
    if is_number(exponent):
        e = float(exponent)
        if e == 1.0:
            return x
        if e == 2.0:
            return x * x
        if e == 3.0:
            return x * x * x
        if e == 0.5:
            return apply("sqrt", x)
        if e == -0.5:
            return apply("rsqrt", x)
        if e == -1.0:
            return 1.0 / x
    raise NotImplementedError(
        f"{user_source_line()}: pow: exponent {exponent!r} is not supported (1, 2, 3, 0.5, -0.5 or -1)"
    )


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


def amin(input, dim=None, keepdim: bool = False) -> Tensor:
    """The minimum over `dim` (torch.amin), as −amax(−x): the gradient is split evenly between ties."""
    return -amax(-lift(input), dim, keepdim)


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


# Tensor methods of the composites above (torch.Tensor's names; each takes the tensor first).
for _name, _function in {
    "split": split, "chunk": chunk, "unbind": unbind, "narrow": narrow, "repeat": repeat, "tile": tile,
    "repeat_interleave": repeat_interleave, "amin": amin, "prod": prod, "var": var, "std": std, "norm": norm,
    "logsumexp": logsumexp, "matmul": matmul, "mm": mm, "bmm": bmm, "outer": outer, "addmm": addmm,
    "baddbmm": baddbmm,
}.items():  # fmt: skip
    setattr(Tensor, _name, _function)
