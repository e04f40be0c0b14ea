"""meganeura: a compiler for neural-network training steps, optimised by an e-graph, run on WebGPU.

>>> import meganeura as mn
>>> from meganeura import nn, optim
>>> import meganeura.functional as F
>>> # program = mn.compile(model, loss=loss_fn, inputs={"x": mn.f32[32, 64], "y": mn.i32[32]},
>>> #                      optimizer=optim.Adam(lr=1e-3))
"""

from meganeura import functional, linalg, nn, optim
from meganeura.compiler import InputSpec, Program, compile, f32, i32
from meganeura.functional import causal_mask
from meganeura.gate import NonFiniteError
from meganeura.ir.op import ShapeError
from meganeura.nn import manual_seed
from meganeura.onnx_import import OnnxImportError, load_onnx
from meganeura.tensor import (  # the elementwise ones are generated from ir/functions.py
    Tensor,
    abs,
    addmm,
    amin,
    baddbmm,
    bmm,
    cat,
    chunk,
    clamp,
    clip,
    einsum,
    equal,
    exp,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    logsumexp,
    matmul,
    mm,
    narrow,
    norm,
    not_equal,
    outer,
    prod,
    repeat_interleave,
    sigmoid,
    split,
    sqrt,
    stack,
    std,
    std_mean,
    tanh,
    tile,
    unbind,
    var,
    var_mean,
    where,
)
from meganeura.weights import IncompatibleKeys, StateDictError, load_safetensors

__all__ = [
    "compile", "Program", "InputSpec", "f32", "i32", "Tensor", "ShapeError", "manual_seed",
    "load_safetensors", "IncompatibleKeys", "StateDictError", "load_onnx", "OnnxImportError",
    "functional", "nn", "optim", "cat", "causal_mask", "where", "clamp", "clip", "abs", "exp", "log", "sqrt",
    "sigmoid", "tanh", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "NonFiniteError",
    "linalg", "split", "chunk", "unbind", "narrow", "stack", "tile", "repeat_interleave", "amin", "prod", "var",
    "std", "var_mean", "std_mean", "norm", "logsumexp", "matmul", "mm", "bmm", "outer", "addmm", "baddbmm", "einsum",
]  # fmt: skip
__version__ = "0.1.0"
