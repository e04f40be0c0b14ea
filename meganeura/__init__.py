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
from meganeura.pytorch_names import missing_names
from meganeura.summary import ModelSummary, summary
from meganeura.tensor import (  # the elementwise ones are generated from ir/functions.py
    Tensor,
    ValuesIndices,
    abs,
    add,
    addmm,
    amax,
    amin,
    arange,
    argmax,
    argmin,
    argsort,
    as_tensor,
    baddbmm,
    bernoulli,
    bmm,
    broadcast_to,
    cat,
    ceil,
    chunk,
    clamp,
    clip,
    cos,
    cumprod,
    cumsum,
    diagonal,
    diff,
    div,
    einsum,
    equal,
    erf,
    exp,
    expm1,
    eye,
    flatten,
    flip,
    fliplr,
    flipud,
    floor,
    full,
    full_like,
    gather,
    greater,
    greater_equal,
    index_select,
    isfinite,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    log1p,
    log_softmax,
    logsumexp,
    matmul,
    maximum,
    mean,
    minimum,
    mm,
    mul,
    nan_to_num,
    narrow,
    norm,
    not_equal,
    ones,
    ones_like,
    outer,
    permute,
    pow,
    prod,
    rand,
    rand_like,
    randn,
    randn_like,
    reciprocal,
    relu,
    repeat_interleave,
    reshape,
    roll,
    round,
    rsqrt,
    scatter,
    scatter_add,
    sigmoid,
    sign,
    sin,
    softmax,
    sort,
    split,
    sqrt,
    square,
    squeeze,
    stack,
    std,
    std_mean,
    sub,
    sum,
    take,
    tanh,
    tensor,
    tile,
    topk,
    transpose,
    tril,
    triu,
    trunc,
    unbind,
    unsqueeze,
    var,
    var_mean,
    where,
    zeros,
    zeros_like,
)
from meganeura.tensor import tensor_max as max  # noqa: A004  (torch.max; builtins.max is not used here)
from meganeura.tensor import tensor_min as min  # noqa: A004
from meganeura.weights import IncompatibleKeys, StateDictError, load_safetensors

# torch's dtype names: f32 for floats, i32 for integers (torch's int64 and int32 alike).
float32 = float = f32  # noqa: A001
int64 = long = int32 = int = i32  # noqa: A001

__all__ = [
    "compile", "Program", "InputSpec", "f32", "i32", "Tensor", "ShapeError", "manual_seed",
    "load_safetensors", "IncompatibleKeys", "StateDictError", "load_onnx", "OnnxImportError",
    "functional", "nn", "optim", "cat", "causal_mask", "where", "clamp", "clip", "abs", "exp", "log", "sqrt",
    "sigmoid", "tanh", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "NonFiniteError", "rand", "randn", "rand_like", "randn_like", "bernoulli", "summary", "ModelSummary",
    "float32", "float", "int64", "long", "int32", "int", "ValuesIndices", "amin", "arange", "argmax", "argmin",
    "argsort", "as_tensor", "cumprod", "cumsum", "eye", "flip", "fliplr", "flipud", "full", "full_like", "gather",
    "index_select", "max", "min", "ones", "ones_like", "roll", "scatter", "scatter_add", "sort", "take", "tensor",
    "topk", "tril", "triu", "zeros", "zeros_like",
    "ceil", "cos", "expm1", "floor", "isfinite", "isinf", "isnan", "log1p", "maximum", "minimum", "pow",
    "reciprocal", "round", "sign", "sin", "square", "trunc", "selu", "celu",
    "broadcast_to", "diagonal", "diff", "erf", "nan_to_num", "rsqrt", "add", "sub", "mul", "div", "sum", "mean",
    "amax", "reshape", "permute", "transpose", "unsqueeze", "squeeze", "flatten", "softmax", "log_softmax", "relu",
    "linalg", "split", "chunk", "unbind", "narrow", "stack", "tile", "repeat_interleave", "prod", "var",
    "std", "var_mean", "std_mean", "norm", "logsumexp", "matmul", "mm", "bmm", "outer", "addmm", "baddbmm", "einsum",
]  # fmt: skip
__version__ = "0.1.0"

selu, celu = functional.selu, functional.celu  # torch.selu and torch.celu


__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
