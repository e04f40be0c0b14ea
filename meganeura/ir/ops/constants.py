"""Constant tensors known when the model is traced (torch.arange, torch.tensor, torch.eye…): leaves
whose values the graph itself holds. They launch no kernel: the buffer plan gives one that a
kernel reads a buffer of role "const", and the runtime writes `constant_array` into it once, when
the program is built (codegen/buffers.py, runtime/executable.py); the interpreter evaluates them.

- `arange(start, step, size, dtype)`: start + i·step for i in [0, size), computed in float64 and
  rounded once to f32 or i32. PyTorch's CPU kernel computes blocks of a vector width in float32,
  so a fractional step can differ from it by an ulp (-3.5 + 5·0.7 is 0 here, -2.2e-16 there);
  integer steps are exact. A step of 0 is a
  fill (`full` of i32: the f32 fills are a scalar `const` broadcast, which the e-graph folds into
  the literal of the kernel that reads it).
- `constant(data, shape, dtype)`: the values themselves, their little-endian bytes in base64 text
  (an attribute must be a hashable value that the e-graph can carry as a string); at most
  MAX_CONSTANT_ELEMENTS, so that the IR stays printable.

Why leaves: a constant costs nothing per step this way (a kernel computing it would run every
step), and it stays out of the parameters, the optimizer's state and state_dict (torch's
constants are plain tensors too). CONSTANT_LEAVES names every leaf whose value the graph knows,
the scalar `const` included.
"""

from __future__ import annotations

import base64

import numpy as np

from meganeura.ir.graph import Node, TensorType
from meganeura.ir.op import FLOAT, INT, INTS, STR, Attr, Op, ShapeError, op_def

FAMILY = "constants"
MAX_CONSTANT_ELEMENTS = 1 << 16
I32_RANGE = (-(2**31), 2**31 - 1)
NUMPY_DTYPES = {"f32": np.float32, "i32": np.int32}


def check_dtype(op: str, dtype: str) -> None:
    if dtype not in NUMPY_DTYPES:
        raise ShapeError(f"{op}: dtype must be 'f32' or 'i32', got {dtype!r}")


# ---------------------------------------------------------------------------------------------
# arange


def arange_values(start: float, step: float, size: int) -> np.ndarray:
    """start + i·step in float64 (integers stay exact up to 2^53)."""
    return start + np.arange(size, dtype=np.float64) * step


def infer_arange(types, attrs) -> TensorType:
    size, dtype = attrs["size"], attrs["dtype"]
    check_dtype("arange", dtype)
    if size < 0:
        raise ShapeError(f"arange: size must be >= 0, got {size}")
    if dtype == "i32":
        start, step = attrs["start"], attrs["step"]
        if not (float(start).is_integer() and float(step).is_integer()):
            raise ShapeError(f"arange: an i32 range needs integer start and step, got {start} and {step}")
        ends = arange_values(start, step, size)[[0, -1]] if size else ()
        if any(not I32_RANGE[0] <= v <= I32_RANGE[1] for v in ends):
            raise ShapeError(f"arange: values from {start} by {step} ({size} of them) do not fit in i32")
    return TensorType((size,), dtype)


def evaluate_arange(start, step, size, dtype):
    return arange_values(start, step, size).astype(NUMPY_DTYPES[dtype])


ARANGE = Op(
    "arange",
    family=FAMILY,
    infer=infer_arange,
    evaluate=evaluate_arange,
    attrs=(Attr("start", FLOAT), Attr("step", FLOAT), Attr("size", INT), Attr("dtype", STR, "f32")),
    kernel=False,
    doc="start + i·step for i < size, rounded once to the dtype (a constant leaf)",
)


# ---------------------------------------------------------------------------------------------
# constant: an array captured at trace time


def encode_data(values: np.ndarray, dtype: str) -> str:
    """The base64 text of `values` as little-endian 32-bit elements of `dtype` (the `data` attribute)."""
    array = np.ascontiguousarray(values, dtype=np.dtype(NUMPY_DTYPES[dtype]).newbyteorder("<"))
    return base64.b64encode(array.tobytes()).decode("ascii")


def decode_data(data: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    raw = np.frombuffer(base64.b64decode(data), dtype=np.dtype(NUMPY_DTYPES[dtype]).newbyteorder("<"))
    return raw.astype(NUMPY_DTYPES[dtype]).reshape(shape)


def infer_constant(types, attrs) -> TensorType:
    shape, dtype, data = attrs["shape"], attrs["dtype"], attrs["data"]
    check_dtype("constant", dtype)
    out = TensorType(shape, dtype)
    if out.numel > MAX_CONSTANT_ELEMENTS:
        raise ShapeError(
            f"constant: {out} has more than {MAX_CONSTANT_ELEMENTS} elements; register it as a module buffer "
            "(self.register_buffer) or pass it as an input"
        )
    try:
        size = len(base64.b64decode(data, validate=True))
    except ValueError:
        raise ShapeError("constant: data is not base64 text") from None
    if size != 4 * out.numel:
        raise ShapeError(f"constant: data holds {size} bytes, {out} needs {4 * out.numel}")
    return out


CONSTANT = Op(
    "constant",
    family=FAMILY,
    infer=infer_constant,
    evaluate=decode_data,
    attrs=(Attr("data", STR), Attr("shape", INTS), Attr("dtype", STR, "f32")),
    kernel=False,
    describe=lambda node: f"constant {node.type}",
    doc="an array captured at trace time (its bytes in base64; a constant leaf)",
)

# ---------------------------------------------------------------------------------------------
# What the buffer plan and the runtime share

CONSTANT_LEAVES = ("const", "arange", "constant")


def constant_array(node: Node) -> np.ndarray:
    """The value of a constant leaf (CONSTANT_LEAVES), as its buffer holds it."""
    value = op_def(node.op).evaluate(**node.attr_dict)
    return np.broadcast_to(np.asarray(value, NUMPY_DTYPES[node.dtype]), node.shape)
