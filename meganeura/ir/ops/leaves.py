"""The leaves of a graph: inputs, parameters, persistent state, scalar constants, the causal mask.

`input`, `param` and `state` are bound by name when a graph runs (the interpreter's arguments,
the runtime's buffers); `const` is an f32 scalar; `causal_mask(rows, cols)` is an additive f32
mask [rows, cols] computed by a kernel from the index: 0 where key j ≤ query i, CAUSAL_MASK_VALUE
above the diagonal (top-left aligned, as `attention`'s causal flag); the recognition rules match
it (rewrite/recognition.py).
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import FLOAT, INT, INTS, STR, Attr, Op, ShapeError

FAMILY = "leaves"
CAUSAL_MASK_VALUE = -1e9


def infer_leaf(types, attrs) -> TensorType:
    return TensorType(attrs["shape"], attrs["dtype"])


def unbound(*_args, **_attrs):
    raise RuntimeError("leaves are bound by the interpreter, not evaluated")


LEAF_ATTRS = (Attr("name", STR), Attr("shape", INTS), Attr("dtype", STR, "f32"))

INPUT = Op("input", family=FAMILY, infer=infer_leaf, evaluate=unbound, attrs=LEAF_ATTRS, kernel=False,
           doc="a per-step input, bound by name")  # fmt: skip
PARAM = Op("param", family=FAMILY, infer=infer_leaf, evaluate=unbound, attrs=LEAF_ATTRS, kernel=False,
           doc="a trainable parameter, bound by its dotted name")  # fmt: skip
STATE = Op("state", family=FAMILY, infer=infer_leaf, evaluate=unbound, attrs=LEAF_ATTRS, kernel=False,
           doc="persistent state (optimizer moments, module buffers), bound by name")  # fmt: skip

CONST = Op(
    "const",
    family=FAMILY,
    infer=lambda types, attrs: TensorType((), "f32"),
    evaluate=lambda value: np.asarray(value),
    attrs=(Attr("value", FLOAT),),
    kernel=False,
    doc="an f32 scalar constant",
)


def infer_causal_mask(types, attrs) -> TensorType:
    rows, cols = attrs["rows"], attrs["cols"]
    if rows <= 0 or cols <= 0:
        raise ShapeError(f"causal_mask: expected positive integer sizes, got {rows} and {cols}")
    return TensorType((rows, cols), "f32")


def evaluate_causal_mask(rows, cols):
    hidden = np.arange(cols)[None, :] > np.arange(rows)[:, None]
    return np.where(hidden, np.float32(CAUSAL_MASK_VALUE), np.float32(0.0)).astype(np.float32)


CAUSAL_MASK = Op(
    "causal_mask",
    family=FAMILY,
    infer=infer_causal_mask,
    evaluate=evaluate_causal_mask,
    attrs=(Attr("rows", INT), Attr("cols", INT)),
    doc="the additive causal mask [rows, cols]: 0 on and below the diagonal, -1e9 above",
)
