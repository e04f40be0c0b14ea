"""Reverse-mode autodiff on the IR: append the backward graph of a scalar to the same Graph.

Each op's vector-Jacobian product (VJP) is a function that receives the upstream gradient and
emits IR nodes for the gradient of each input. Every VJP multiplies by the upstream gradient
(the "grad_output contract"): a rule that assumes the gradient is 1 would be silently wrong in
the middle of a chain, which is where the tests check it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.ops import infer_type, normalize_axes


class GradBuilder:
    """Emits backward nodes into a graph, tagged with the source lines of the forward node."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.sources: tuple[str, ...] = ()
        self.consts: dict[float, int] = {n.attr("value"): n.id for n in graph if n.op == "const" and n.dtype == "f32"}

    def emit(self, op: str, inputs: list[int], **attrs) -> int:
        out_type = infer_type(op, [self.graph[i].type for i in inputs], attrs)
        return self.graph.add(op, inputs, out_type, attrs, self.sources)

    def const(self, value: float) -> int:
        value = float(value)
        if value not in self.consts:
            self.consts[value] = self.graph.add("const", (), TensorType((), "f32"), {"value": value})
        return self.consts[value]

    def shape(self, node_id: int) -> tuple[int, ...]:
        return self.graph[node_id].shape

    def unbroadcast(self, grad: int, shape: tuple[int, ...]) -> int:
        """Sum `grad` over the axes that broadcasting added or stretched, down to `shape`."""
        grad_shape = self.shape(grad)
        if grad_shape == shape:
            return grad
        lead = len(grad_shape) - len(shape)
        axes = list(range(lead))
        axes += [lead + i for i, d in enumerate(shape) if d == 1 and grad_shape[lead + i] != 1]
        if axes:
            grad = self.emit("sum", [grad], axes=tuple(axes), keepdim=False)
        if self.shape(grad) != shape:
            grad = self.emit("reshape", [grad], shape=shape)
        return grad


VJP = Callable[[GradBuilder, Node, int], list[int | None]]
VJPS: dict[str, VJP] = {}


def vjp(op: str):
    def register(fn: VJP) -> VJP:
        VJPS[op] = fn
        return fn

    return register


@vjp("add")
def _add(b: GradBuilder, node: Node, g: int):
    x, y = node.inputs
    return [b.unbroadcast(g, b.shape(x)), b.unbroadcast(g, b.shape(y))]


@vjp("sub")
def _sub(b, node, g):
    x, y = node.inputs
    return [b.unbroadcast(g, b.shape(x)), b.unbroadcast(b.emit("neg", [g]), b.shape(y))]


@vjp("mul")
def _mul(b, node, g):
    x, y = node.inputs
    return [
        b.unbroadcast(b.emit("mul", [g, y]), b.shape(x)),
        b.unbroadcast(b.emit("mul", [g, x]), b.shape(y)),
    ]


@vjp("div")
def _div(b, node, g):
    x, y = node.inputs
    gx = b.emit("div", [g, y])
    gy = b.emit("neg", [b.emit("mul", [gx, node.id])])  # −g·x/y² = −(g/y)·(x/y)
    return [b.unbroadcast(gx, b.shape(x)), b.unbroadcast(gy, b.shape(y))]


@vjp("greater")
@vjp("equal")
def _mask(b, node, g):
    return [None, None]


@vjp("neg")
def _neg(b, node, g):
    return [b.emit("neg", [g])]


@vjp("exp")
def _exp(b, node, g):
    return [b.emit("mul", [g, node.id])]


@vjp("log")
def _log(b, node, g):
    return [b.emit("div", [g, node.inputs[0]])]


@vjp("sqrt")
def _sqrt(b, node, g):
    return [b.emit("div", [b.emit("mul", [g, b.const(0.5)]), node.id])]


@vjp("rsqrt")
def _rsqrt(b, node, g):
    # d/dx x^(-1/2) = −½·y³
    cube = b.emit("mul", [b.emit("mul", [node.id, node.id]), node.id])
    return [b.emit("mul", [g, b.emit("mul", [cube, b.const(-0.5)])])]


def silu_derivative(b: GradBuilder, x: int) -> int:
    """d silu(x)/dx = σ(x)·(1 + x·(1 − σ(x)))."""
    s = b.emit("sigmoid", [x])
    inner = b.emit("add", [b.const(1.0), b.emit("mul", [x, b.emit("sub", [b.const(1.0), s])])])
    return b.emit("mul", [s, inner])


@vjp("silu")
def _silu(b, node, g):
    return [b.emit("mul", [g, silu_derivative(b, node.inputs[0])])]


@vjp("swiglu")
def _swiglu(b, node, g):
    gate, up = node.inputs
    grad_gate = b.emit("mul", [b.emit("mul", [g, up]), silu_derivative(b, gate)])
    grad_up = b.emit("mul", [g, b.emit("silu", [gate])])
    return [b.unbroadcast(grad_gate, b.shape(gate)), b.unbroadcast(grad_up, b.shape(up))]


@vjp("relu")
def _relu(b, node, g):
    # The mask reads relu's output (y > 0 exactly where x > 0), not its input, so that the
    # forward matmul that produced x can take relu into its epilogue without x being kept.
    mask = b.emit("greater", [node.id, b.const(0.0)])
    return [b.emit("mul", [g, mask])]


@vjp("sigmoid")
def _sigmoid(b, node, g):
    one_minus = b.emit("sub", [b.const(1.0), node.id])
    return [b.emit("mul", [g, b.emit("mul", [node.id, one_minus])])]


@vjp("tanh")
def _tanh(b, node, g):
    square = b.emit("mul", [node.id, node.id])
    return [b.emit("mul", [g, b.emit("sub", [b.const(1.0), square])])]


@vjp("erf")
def _erf(b, node, g):
    # d/dx erf(x) = 2/√π · exp(−x²)
    x = node.inputs[0]
    density = b.emit("exp", [b.emit("neg", [b.emit("mul", [x, x])])])
    return [b.emit("mul", [g, b.emit("mul", [density, b.const(2.0 / math.sqrt(math.pi))])])]


@vjp("reshape")
def _reshape(b, node, g):
    return [b.emit("reshape", [g], shape=b.shape(node.inputs[0]))]


@vjp("broadcast_to")
def _broadcast_to(b, node, g):
    return [b.unbroadcast(g, b.shape(node.inputs[0]))]


@vjp("sum")
def _sum(b, node, g):
    x_shape = b.shape(node.inputs[0])
    axes = normalize_axes(node.attr("axes"), len(x_shape))
    kept = tuple(1 if i in axes else d for i, d in enumerate(x_shape))
    if b.shape(g) != kept:
        g = b.emit("reshape", [g], shape=kept)
    return [b.emit("broadcast_to", [g], shape=x_shape)]


@vjp("max")
def _max(b, node, g):
    """The gradient goes to the maxima, split evenly between ties (as torch.amax does)."""
    x = node.inputs[0]
    x_shape = b.shape(x)
    axes = normalize_axes(node.attr("axes"), len(x_shape))
    kept = tuple(1 if i in axes else d for i, d in enumerate(x_shape))
    peak = node.id if b.shape(node.id) == kept else b.emit("reshape", [node.id], shape=kept)
    mask = b.emit("equal", [x, peak])
    ties = b.emit("sum", [mask], axes=axes, keepdim=True)
    g = g if b.shape(g) == kept else b.emit("reshape", [g], shape=kept)
    return [b.emit("mul", [mask, b.emit("div", [g, ties])])]


@vjp("permute")
def _permute(b, node, g):
    perm = node.attr("perm")
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [b.emit("permute", [g], perm=inverse)]


def matmul_input_grads(b: GradBuilder, a: int, w: int, g: int, ta: bool, tb: bool) -> list[int]:
    """Gradients of C = op(A)·op(B) as matmuls with transposed operands (no transpose copies).

    A 2-D operand shared by a batched one gets the batch summed: for a weight W of
    x [batch, seq, in] · W, dW is one matmul over the flattened rows of x and g.
    """
    # dA = g·op(B)ᵀ (transposed back if A was used transposed); dB likewise.
    if ta:
        grad_a = b.emit("matmul", [w, g], transpose_a=tb, transpose_b=True)
    else:
        grad_a = b.emit("matmul", [g, w], transpose_a=False, transpose_b=not tb)
    shared_b = len(b.shape(w)) == 2 and len(b.shape(a)) > 2
    if shared_b and not ta:
        rows = b.emit("reshape", [a], shape=(flat_rows(b.shape(a)), b.shape(a)[-1]))
        grads = b.emit("reshape", [g], shape=(flat_rows(b.shape(g)), b.shape(g)[-1]))
        if tb:
            grad_b = b.emit("matmul", [grads, rows], transpose_a=True, transpose_b=False)
        else:
            grad_b = b.emit("matmul", [rows, grads], transpose_a=True, transpose_b=False)
    elif tb:
        grad_b = b.emit("matmul", [g, a], transpose_a=True, transpose_b=ta)
    else:
        grad_b = b.emit("matmul", [a, g], transpose_a=not ta, transpose_b=False)
    return [b.unbroadcast(grad_a, b.shape(a)), b.unbroadcast(grad_b, b.shape(w))]


def flat_rows(shape: tuple[int, ...]) -> int:
    """The number of rows of `shape` seen as a 2-D matrix [rows, last dim]."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows


@vjp("matmul")
def _matmul(b, node, g):
    a, w = node.inputs
    return matmul_input_grads(b, a, w, g, bool(node.attr("transpose_a")), bool(node.attr("transpose_b")))


@vjp("cross_entropy_rows")
def _ce_rows(b, node, g):
    logits, labels = node.inputs
    return [b.emit("cross_entropy_rows_grad", [logits, labels, g]), None]


# Softmax's gradients read the forward's output (not its input), one op each: the row sums
# they need (Σ g·y, Σ g) stay inside their kernel.
@vjp("softmax")
def _softmax(b, node, g):
    return [b.emit("softmax_grad", [node.id, g], axis=node.attr("axis"))]


@vjp("log_softmax")
def _log_softmax(b, node, g):
    return [b.emit("log_softmax_grad", [node.id, g], axis=node.attr("axis"))]


@vjp("pick")
def _pick(b, node, g):
    x, labels = node.inputs
    return [b.emit("scatter_rows", [g, labels], classes=b.shape(x)[1]), None]


@vjp("scatter_rows")
def _scatter_rows(b, node, g):
    return [b.emit("pick", [g, node.inputs[1]]), None]


@vjp("gather")
def _gather(b, node, g):
    table, ids = node.inputs
    return [b.emit("scatter_add", [g, ids], num=b.shape(table)[0]), None]


@vjp("scatter_add")
def _scatter_add(b, node, g):
    return [b.emit("gather", [g, node.inputs[1]]), None]


def slice_attrs(node: Node) -> dict:
    return {key: node.attr(key) for key in ("starts", "stops", "steps")}


@vjp("slice")
def _slice(b, node, g):
    return [b.emit("slice_grad", [g], shape=b.shape(node.inputs[0]), **slice_attrs(node))]


@vjp("slice_grad")
def _slice_grad(b, node, g):
    return [b.emit("slice", [g], **slice_attrs(node))]


@vjp("concat")
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


def rotate_half(b: GradBuilder, x: int) -> int:
    """cat(−x[..., h:], x[..., :h]) along the last dim (h = half of it), from slice, neg and concat."""
    shape = b.shape(x)
    rank, h = len(shape), shape[-1] // 2
    steps = (1,) * rank
    low = b.emit("slice", [x], starts=(0,) * rank, stops=(*shape[:-1], h), steps=steps)
    high = b.emit("slice", [x], starts=(0,) * (rank - 1) + (h,), stops=shape, steps=steps)
    return b.emit("concat", [b.emit("neg", [high]), low], axis=rank - 1)


@vjp("rope")
def _rope(b, node, g):
    """dx = rope_grad(g, cos, sin); d cos = g·x and d sin = g·rotate_half(x), unbroadcast."""
    x, cos, sin = node.inputs
    grad_cos = b.unbroadcast(b.emit("mul", [g, x]), b.shape(cos))
    grad_sin = b.unbroadcast(b.emit("mul", [g, rotate_half(b, x)]), b.shape(sin))
    return [b.emit("rope_grad", [g, cos, sin]), grad_cos, grad_sin]


@vjp("rope_grad")
def _rope_grad(b, node, g):
    """rope_grad is linear in its first operand and rope is its transpose: d g = rope(gg, cos, sin);
    d cos = gg·g and d sin = rotate_half(gg)·g, unbroadcast."""
    upstream, cos, sin = node.inputs
    grad_cos = b.unbroadcast(b.emit("mul", [g, upstream]), b.shape(cos))
    grad_sin = b.unbroadcast(b.emit("mul", [rotate_half(b, g), upstream]), b.shape(sin))
    return [b.emit("rope", [g, cos, sin]), grad_cos, grad_sin]


@vjp("attention")
def _attention(b, node, g):
    """Flash-style backward: the row log-sum-exp is recomputed by its own op (the forward keeps
    no P), and each of dQ, dK, dV is one op that rebuilds P = exp(q·kᵀ·scale − lse) from it."""
    q, k, v = node.inputs
    attrs = {"causal": node.attr("causal"), "scale": node.attr("scale")}
    lse = b.emit("attention_lse", [q, k], **attrs)
    operands = [q, k, v, node.id, lse, g]
    return [b.emit(f"attention_grad_{which}", operands, **attrs) for which in ("q", "k", "v")]


# Image ops: unfold (im2col) and fold (col2im) are linear and each other's adjoint, with the same
# geometry; unfold's gradient needs the image size back as fold's output_size.


def window_attrs(node: Node) -> dict:
    return {key: tuple(node.attr(key)) for key in ("kernel", "stride", "padding")}


@vjp("unfold")
def _unfold(b, node, g):
    """Each column entry goes back to the pixel it was read from, summed over overlapping windows."""
    size = tuple(b.shape(node.inputs[0])[2:])
    return [b.emit("fold", [g], output_size=size, **window_attrs(node))]


@vjp("fold")
def _fold(b, node, g):
    """Each column entry of fold's input reads the gradient of the pixel it was summed into."""
    return [b.emit("unfold", [g], **window_attrs(node))]


def gradients(graph: Graph, loss: int, wrt: list[int]) -> dict[int, int | None]:
    """Append the backward pass of scalar `loss` to `graph`; return {node id in wrt: its grad node}.

    A node in `wrt` that the loss does not depend on maps to None.
    """
    if graph[loss].type.numel != 1:
        raise ValueError(f"the loss must be a single number, got {graph[loss].type}")
    builder = GradBuilder(graph)
    needed = nodes_between(graph, set(wrt), loss)
    seed = builder.const(1.0)
    if graph[loss].shape != ():
        seed = builder.emit("broadcast_to", [seed], shape=graph[loss].shape)
    grads: dict[int, list[int]] = {loss: [seed]}
    for node_id in range(loss, -1, -1):
        if node_id not in grads or node_id not in needed:
            continue
        node = graph[node_id]
        builder.sources = node.sources
        total = accumulate(builder, grads[node_id])
        grads[node_id] = [total]
        if node.op in ("input", "param", "state", "const"):
            continue
        rule = VJPS.get(node.op)
        if rule is None:
            raise NotImplementedError(f"autodiff: no gradient rule for op {node.op!r} ({', '.join(node.sources)})")
        for input_id, input_grad in zip(node.inputs, rule(builder, node, total), strict=True):
            if input_grad is not None and input_id in needed:
                grads.setdefault(input_id, []).append(input_grad)
    return {w: (grads[w][0] if w in grads else None) for w in wrt}


def accumulate(builder: GradBuilder, parts: list[int]) -> int:
    """The sum of the gradient contributions that reach one node (fan-in)."""
    total = parts[0]
    for part in parts[1:]:
        total = builder.emit("add", [total, part])
    return total


def nodes_between(graph: Graph, sources: set[int], target: int) -> set[int]:
    """Nodes on some path from a node in `sources` to `target`: the only ones that need gradients."""
    reaches_source: set[int] = set()
    for node in graph:
        if node.id > target:
            break
        if node.id in sources or any(i in reaches_source for i in node.inputs):
            reaches_source.add(node.id)
    ancestors: set[int] = set()
    stack = [target]
    while stack:
        node_id = stack.pop()
        if node_id in ancestors:
            continue
        ancestors.add(node_id)
        stack.extend(graph[node_id].inputs)
    return reaches_source & ancestors


# ---------------------------------------------------------------------------------------------
# Pooling (ir/conv_ops.py): max_pool2d's gradient recomputes the arg-max from x; avg_pool2d and
# its gradient are linear and each other's adjoint.


def pool_attrs(node: Node) -> dict:
    return {name: node.attr(name) for name in ("kernel", "stride", "padding")}


@vjp("max_pool2d")
def _max_pool2d(b, node, g):
    """dx = max_pool2d_grad(x, g): g routed to each window's first arg-max."""
    return [b.emit("max_pool2d_grad", [node.inputs[0], g], **pool_attrs(node))]


@vjp("max_pool2d_grad")
def _max_pool2d_grad(b, node, g):
    """Second derivatives of max pooling are not needed by a training step (gradients are taken
    once); refuse clearly rather than guess."""
    raise NotImplementedError(
        f"autodiff: max_pool2d_grad has no gradient rule (double backward through max pooling), "
        f"{', '.join(node.sources)}"
    )


@vjp("avg_pool2d")
def _avg_pool2d(b, node, g):
    """dx = avg_pool2d_grad(g): g/(kh·kw) spread back over each window."""
    x = node.inputs[0]
    return [b.emit("avg_pool2d_grad", [g], **pool_attrs(node), image=tuple(b.shape(x)[2:]))]


@vjp("avg_pool2d_grad")
def _avg_pool2d_grad(b, node, g):
    """avg_pool2d_grad is linear and avg_pool2d is its adjoint."""
    return [b.emit("avg_pool2d", [g], **pool_attrs(node))]
