"""Elementwise ops: one op per function of `ir/functions.py`, broadcasting its operands (numpy's
rule), and `pointwise`, the fused kernel the e-graph makes of chains of them.

`pointwise(inputs…, expr, shape)`: one expression of `ir/expr.py` over the inputs `$0`, `$1`…,
each broadcast to `shape`; produced only by the e-graph (rewrite/pointwise.py).
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.expr import check_expr
from meganeura.ir.expr import evaluate as evaluate_expr
from meganeura.ir.functions import FUNCTIONS, Function
from meganeura.ir.graph import TensorType
from meganeura.ir.op import EXPR, INTS, Attr, EGraphForm, Op, ShapeError, broadcast_shapes, require_float

FAMILY = "elementwise"
OPERAND_NAMES = {1: ("x",), 2: ("a", "b"), 3: ("a", "b", "c")}
FORMS = {1: "Unary", 2: "Binary", 3: "Ternary"}


def infer_broadcast(name: str):
    def infer(types, attrs) -> TensorType:
        require_float(types, name)
        shape = types[0].shape
        for t in types[1:]:
            shape = broadcast_shapes(shape, t.shape, name)
        return TensorType(shape, "f32")

    return infer


def function_vjp(function: Function):
    """The op's VJP: the function's gradients (at the result's shape) summed back to each operand's shape."""

    def vjp(b, node, g):
        grads = function.vjp(b, node.inputs, node.id, g)
        return [
            None if grad is None else b.unbroadcast(grad, b.shape(x))
            for grad, x in zip(grads, node.inputs, strict=True)
        ]

    return vjp


def declare(function: Function) -> Op:
    op = Op(
        function.name,
        family=FAMILY,
        infer=infer_broadcast(function.name),
        evaluate=function.numpy,
        operands=OPERAND_NAMES[function.arity],
        egraph=EGraphForm(FORMS[function.arity], tag=function.name),
        doc=function.doc,
    )
    op.vjp(function_vjp(function))
    return op


FUNCTION_OPS = {name: declare(function) for name, function in FUNCTIONS.items()}


def infer_pointwise(types, attrs) -> TensorType:
    shape = attrs["shape"]
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


POINTWISE = Op(
    "pointwise",
    family=FAMILY,
    infer=infer_pointwise,
    evaluate=evaluate_pointwise,
    operands=("*inputs",),
    attrs=(Attr("expr", EXPR), Attr("shape", INTS)),
    egraph=None,
    describe=lambda node: node.attr("expr"),
    doc="a fused elementwise kernel: one expression over inputs broadcast to `shape`",
)
