"""meganeura: a compiler for neural-network training steps, optimised by an e-graph, run on WebGPU.

>>> import meganeura as mn
>>> from meganeura import nn, optim
>>> import meganeura.functional as F
>>> # program = mn.compile(model, loss=loss_fn, inputs={"x": mn.f32[32, 64], "y": mn.i32[32]},
>>> #                      optimizer=optim.Adam(lr=1e-3))
"""

from meganeura import functional, nn, optim
from meganeura.compiler import InputSpec, Program, compile, f32, i32
from meganeura.functional import causal_mask
from meganeura.gate import NonFiniteError
from meganeura.ir.op import ShapeError
from meganeura.nn import manual_seed
from meganeura.onnx_import import OnnxImportError, load_onnx
from meganeura.pytorch_names import missing_names
from meganeura.tensor import (  # the elementwise ones are generated from ir/functions.py
    Tensor,
    abs,
    cat,
    ceil,
    clamp,
    clip,
    cos,
    equal,
    exp,
    expm1,
    floor,
    greater,
    greater_equal,
    isfinite,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    log1p,
    maximum,
    minimum,
    not_equal,
    pow,
    reciprocal,
    round,
    sigmoid,
    sign,
    sin,
    sqrt,
    square,
    tanh,
    trunc,
    where,
)
from meganeura.weights import IncompatibleKeys, StateDictError, load_safetensors

__all__ = [
    "compile", "Program", "InputSpec", "f32", "i32", "Tensor", "ShapeError", "manual_seed",
    "load_safetensors", "IncompatibleKeys", "StateDictError", "load_onnx", "OnnxImportError",
    "functional", "nn", "optim", "cat", "causal_mask", "where", "clamp", "clip", "abs", "exp", "log", "sqrt",
    "sigmoid", "tanh", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "NonFiniteError",
    "ceil", "cos", "expm1", "floor", "isfinite", "isinf", "isnan", "log1p", "maximum", "minimum", "pow",
    "reciprocal", "round", "sign", "sin", "square", "trunc", "selu", "celu",
]  # fmt: skip
__version__ = "0.1.0"

selu, celu = functional.selu, functional.celu  # torch.selu and torch.celu


__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
