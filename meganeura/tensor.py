"""The DSL's Tensor and the primitive operations on it, each defined once.

A `Tensor` is a handle on one IR node of the trace that `compile()` is recording; its operators
and methods, PyTorch's, call the functions of this module, which apply one IR op each
(`apply`) or a few (`getitem` is a slice and a reshape). The composite functions that PyTorch
keeps in torch.nn.functional (layer_norm, conv2d, cross_entropy…) are in `functional.py`, built
on these; `meganeura.functional` re-exports everything here too.

The elementwise functions come from `ir/functions.py`: each one with a plain signature becomes a
function here (`exp(x)`, `greater(a, b)`) and, where it names one, a Tensor method (`x.exp()`);
those with Python parameters (`leaky_relu(x, negative_slope)`, `softplus(x, beta, threshold)`,
`clamp(x, min, max)`, `where(condition, x, y)`) are written out below.

>>> # inside a model's forward(): y = (x @ w.T + b).relu(); mask = y > 0
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from meganeura.ir.functions import FUNCTIONS, Function
from meganeura.ir.graph import TensorType
from meganeura.ir.op import ShapeError, normalize_axes
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


def matmul(a, b) -> Tensor:
    """a @ b like torch.matmul: over the last two dims, batched over equal leading dims; a with
    more dims than a 2-D b is flattened to rows first; a 1-D operand is a vector (a row of a, a
    column of b), its dim dropped from the result.

    The IR's matmul also takes a 2-D operand shared by a batch directly, but tracing [batch,
    seq, features] @ W that way lets the matmul epilogue rules see whole residual streams, and
    the e-graph then grows past its budget on deep models; flattening keeps them apart for now.
    """
    a, b = lift(a), lift(b)
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
    return apply("matmul", a, b)


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
