"""ONNX graphs as trainable modules: `mn.load_onnx(path_or_model)`.

This module owns reading an ONNX model (a file path, bytes or an `onnx.ModelProto`), checking
that every node is one it can build (all unsupported ops and attributes are reported in one
error, before anything is built), and `OnnxModule`, an `nn.Module` whose forward replays the
graph on the DSL (meganeura.functional, Tensor methods): the compiler, autodiff and kernels see
the same ops a hand-written model would give them.

Initializers become Parameters named from the initializer names (sanitised to dotted Python
names: "fc1.weight" stays, "onnx::Conv_7" becomes "onnx__Conv_7"), nested as submodules at the
dots, so that a graph exported by torch.onnx keeps PyTorch's state_dict names. The running mean
and variance of BatchNormalization become module buffers, as in nn.BatchNorm2d: in training mode
(the default of every Module) the batch statistics normalise and the buffers are updated with
PyTorch's momentum (1 − ONNX's momentum); `model.eval()` gives ONNX's inference semantics.
Integer initializers and Constant nodes are static values (shapes, axes), computed at trace time;
so are shapes derived from them.

The `onnx` package is an optional dependency (`pip install meganeura[interop]`).

>>> # model = mn.load_onnx("mlp.onnx"); program = mn.compile(model, inputs={"x": mn.f32[8, 64]})
"""

from __future__ import annotations

import keyword
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from meganeura import functional as F
from meganeura import nn
from meganeura.compiler import InputSpec, f32, i32
from meganeura.parameter import Buffer, Parameter
from meganeura.tensor import Tensor


class OnnxImportError(NotImplementedError):
    """An ONNX graph that meganeura cannot build: every unsupported op and attribute, listed."""


def import_onnx():
    try:
        import onnx
    except ImportError as error:
        raise ImportError(
            "mn.load_onnx needs the onnx package, which is an optional dependency: pip install 'meganeura[interop]' "
            "(or pip install onnx)"
        ) from error
    return onnx


def read_model(path_or_model):
    """An onnx.ModelProto from a path, bytes or a ModelProto."""
    onnx = import_onnx()
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    if isinstance(path_or_model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(path_or_model))
    if isinstance(path_or_model, (str, os.PathLike)):
        return onnx.load(os.fspath(path_or_model))
    raise TypeError(f"load_onnx: expected a path, bytes or an onnx.ModelProto, got {type(path_or_model).__name__}")


# ---------------------------------------------------------------------------------------------
# Nodes: attributes, and the checks made before anything is built


@dataclass
class Node:
    """One ONNX node with its attributes as Python values."""

    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]

    def where(self) -> str:
        return f"{self.op} node {self.name!r}" if self.name else f"{self.op} node (output {self.outputs[0]!r})"


def attribute_value(onnx, attribute):
    value = onnx.helper.get_attribute_value(attribute)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value


def node_of(onnx, proto) -> Node:
    attrs = {a.name: attribute_value(onnx, a) for a in proto.attribute}
    return Node(proto.op_type, proto.name, list(proto.input), list(proto.output), attrs)


def symmetric_pads(pads, what: str) -> list[str]:
    if pads is None:
        return []
    half = len(pads) // 2
    if list(pads[:half]) != list(pads[half:]):
        return [f"{what}pads={list(pads)} (only symmetric padding: begin == end)"]
    return []


def window_problems(node: Node, dims: int = 2) -> list[str]:
    """Conv and pool attributes meganeura's 2-D windows do not cover."""
    attrs, problems = node.attrs, []
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        problems.append(f"auto_pad={attrs['auto_pad']!r} (only NOTSET or VALID)")
    if any(d != 1 for d in attrs.get("dilations", [1])):
        problems.append(f"dilations={attrs['dilations']} (only 1)")
    kernel = attrs.get("kernel_shape")
    if kernel is not None and len(kernel) != dims:
        problems.append(f"kernel_shape={kernel} (only 2-D windows)")
    problems += symmetric_pads(attrs.get("pads"), "")
    return problems


def conv_problems(node: Node, opset: int) -> list[str]:
    problems = window_problems(node)
    if node.attrs.get("group", 1) != 1:
        problems.append(f"group={node.attrs['group']} (only 1)")
    return problems


def pool_problems(node: Node, opset: int) -> list[str]:
    problems = window_problems(node)
    if "kernel_shape" not in node.attrs:
        problems.append("no kernel_shape")
    if node.attrs.get("ceil_mode", 0):
        problems.append("ceil_mode=1 (only 0)")
    if node.attrs.get("storage_order", 0):
        problems.append("storage_order=1 (only 0)")
    if len([o for o in node.outputs if o]) > 1:
        problems.append("the Indices output")
    pads = node.attrs.get("pads", [0])
    if node.op == "AveragePool" and any(pads) and not node.attrs.get("count_include_pad", 0):
        problems.append("count_include_pad=0 with padding (only count_include_pad=1, PyTorch's default)")
    return problems


def batch_norm_problems(node: Node, opset: int) -> list[str]:
    problems = []
    if node.attrs.get("spatial", 1) != 1:
        problems.append("spatial=0 (only 1)")
    if len([o for o in node.outputs if o]) > 1:
        problems.append("outputs besides Y (training-mode statistics)")
    return problems


def layer_norm_problems(node: Node, opset: int) -> list[str]:
    if len([o for o in node.outputs if o]) > 1:
        return ["the Mean and InvStdDev outputs"]
    return []


def gelu_problems(node: Node, opset: int) -> list[str]:
    approximate = node.attrs.get("approximate", "none")
    return [] if approximate in ("none", "tanh") else [f"approximate={approximate!r}"]


def reshape_problems(node: Node, opset: int) -> list[str]:
    return ["opset < 5 (shape as an attribute)"] if "shape" in node.attrs else []


def no_problems(node: Node, opset: int) -> list[str]:
    return []


# ---------------------------------------------------------------------------------------------
# Building: each op maps its input values (Tensors, or numpy arrays for static values) to its
# outputs. Static values (shapes, axes, constants) stay numpy as long as all their inputs are.


def is_static(value) -> bool:
    return isinstance(value, np.ndarray)


def tensor_operand(value):
    """A value usable by the DSL: a Tensor, or a static scalar as a Python float."""
    if isinstance(value, Tensor):
        return value
    if is_static(value) and value.size == 1:
        return float(value.reshape(()))
    raise OnnxImportError(
        f"a static array of shape {list(value.shape)} is used as a tensor operand; only scalars can be "
        "(make it an initializer to have it as a parameter)"
    )


def static(value, node: Node, what: str) -> np.ndarray:
    if not is_static(value):
        raise OnnxImportError(
            f"{node.where()}: {what} must be known when the graph is built (a constant), got a Tensor"
        )
    return value


def binary(numpy_fn: Callable, tensor_fn: Callable):
    def build(node: Node, values: list, opset: int):
        a, b = values
        if is_static(a) and is_static(b):
            return [numpy_fn(a, b)]
        return [tensor_fn(tensor_operand(a), tensor_operand(b))]

    return build


def static_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX's Div: integers truncate toward zero (numpy's // floors)."""
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        return np.trunc(a / b).astype(np.result_type(a, b))
    return a / b


def unary(tensor_fn: Callable):
    def build(node: Node, values: list, opset: int):
        return [tensor_fn(tensor_operand(values[0]))]

    return build


def build_gemm(node: Node, values: list, opset: int):
    a, b = tensor_operand(values[0]), tensor_operand(values[1])
    c = values[2] if len(values) > 2 else None
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    if node.attrs.get("transA", 0):
        a = F.transpose2d(a)
    if node.attrs.get("transB", 0) and alpha == 1.0 and beta == 1.0 and (c is None or isinstance(c, Tensor)):
        # PyTorch's nn.Linear export: the form the matmul rules know (F.linear)
        bias = c if c is not None and c.ndim == 1 else None
        y = F.linear(a, b, bias)
        return [y + c if c is not None and bias is None else y]
    y = F.matmul(a, F.transpose2d(b) if node.attrs.get("transB", 0) else b)
    if alpha != 1.0:
        y = y * float(alpha)
    if c is not None:
        c = tensor_operand(c)
        y = y + (c * float(beta) if beta != 1.0 else c)
    return [y]


def build_matmul(node: Node, values: list, opset: int):
    return [F.matmul(tensor_operand(values[0]), tensor_operand(values[1]))]


def window_pads(node: Node) -> tuple[int, int]:
    pads = node.attrs.get("pads")
    if pads is None or node.attrs.get("auto_pad", "NOTSET") == "VALID":
        return (0, 0)
    return (int(pads[0]), int(pads[1]))


def build_conv(node: Node, values: list, opset: int):
    x, weight = tensor_operand(values[0]), tensor_operand(values[1])
    bias = tensor_operand(values[2]) if len(values) > 2 and values[2] is not None else None
    if weight.ndim != 4:
        raise OnnxImportError(f"{node.where()}: only 2-D convolutions (a weight [O, C, kh, kw]), got {weight.type}")
    strides = tuple(node.attrs.get("strides", [1, 1]))
    return [F.conv2d(x, weight, bias, stride=strides, padding=window_pads(node))]


def build_pool(function: Callable):
    def build(node: Node, values: list, opset: int):
        kernel = tuple(node.attrs["kernel_shape"])
        strides = tuple(node.attrs.get("strides", [1, 1]))  # ONNX's default stride is 1, not the kernel
        return [function(tensor_operand(values[0]), kernel, strides, window_pads(node))]

    return build


def build_global_average_pool(node: Node, values: list, opset: int):
    x = tensor_operand(values[0])
    return [F.mean(x, tuple(range(2, x.ndim)), keepdim=True)]


def build_batch_norm(node: Node, values: list, opset: int, training: bool):
    x, scale, bias, mean, var = values
    eps = float(node.attrs.get("epsilon", 1e-5))
    momentum = 1.0 - float(node.attrs.get("momentum", 0.9))  # ONNX weighs the running value, PyTorch the batch
    tracked = isinstance(mean, Buffer) and isinstance(var, Buffer)
    batch_stats = training
    return [
        F.batch_norm(
            tensor_operand(x),
            mean if tracked or not batch_stats else None,
            var if tracked or not batch_stats else None,
            tensor_operand(scale),
            tensor_operand(bias),
            batch_stats,
            momentum,
            eps,
        )
    ]


def axis_of(axis: int, rank: int, node: Node) -> int:
    if not -rank <= axis < rank + (node.op == "Flatten"):
        raise OnnxImportError(f"{node.where()}: axis {axis} is out of range for rank {rank}")
    return axis % (rank + (node.op == "Flatten")) if axis < 0 else axis


def build_flatten(node: Node, values: list, opset: int):
    x = values[0]
    axis = axis_of(int(node.attrs.get("axis", 1)), len(x.shape), node)
    shape = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return [x.reshape(shape) if is_static(x) else F.reshape(x, shape)]


def reshape_target(node: Node, shape: tuple[int, ...], target: np.ndarray) -> tuple[int, ...]:
    """ONNX's target shape: 0 copies the input's dim (unless allowzero=1), −1 is inferred."""
    allow_zero = node.attrs.get("allowzero", 0)
    dims = []
    for index, d in enumerate(int(v) for v in target.reshape(-1)):
        if d == 0 and not allow_zero:
            if index >= len(shape):
                raise OnnxImportError(f"{node.where()}: shape {target.tolist()} copies dim {index} of {list(shape)}")
            d = shape[index]
        dims.append(d)
    return tuple(dims)


def build_reshape(node: Node, values: list, opset: int):
    x, target = values[0], static(values[1], node, "the shape")
    shape = reshape_target(node, tuple(x.shape), target)
    return [x.reshape(shape) if is_static(x) else F.reshape(x, shape)]


def build_transpose(node: Node, values: list, opset: int):
    x = values[0]
    perm = tuple(node.attrs.get("perm", range(len(x.shape) - 1, -1, -1)))
    return [np.transpose(x, perm) if is_static(x) else F.permute(x, perm)]


def build_softmax(node: Node, values: list, opset: int):
    x = tensor_operand(values[0])
    if opset >= 13:
        return [F.softmax(x, int(node.attrs.get("axis", -1)))]
    # before opset 13: the input is seen as 2-D, [prod(shape[:axis]), prod(shape[axis:])]
    axis = axis_of(int(node.attrs.get("axis", 1)), x.ndim, node)
    rows = F.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
    return [F.reshape(F.softmax(rows, -1), x.shape)]


def build_layer_norm(node: Node, values: list, opset: int):
    x = tensor_operand(values[0])
    scale = tensor_operand(values[1])
    bias = tensor_operand(values[2]) if len(values) > 2 and values[2] is not None else None
    axis = axis_of(int(node.attrs.get("axis", -1)), x.ndim, node)
    shape = x.shape[axis:]
    eps = float(node.attrs.get("epsilon", 1e-5))
    fits = all(isinstance(v, Tensor) and v.shape == shape for v in (scale, bias) if v is not None)
    if fits:
        return [F.layer_norm(x, shape, scale, bias, eps)]
    y = F.layer_norm(x, shape, None, None, eps) * scale  # ONNX broadcasts Scale and B to the normalised shape
    return [y if bias is None else y + bias]


def build_identity(node: Node, values: list, opset: int):
    return [values[0]]


def build_gelu(node: Node, values: list, opset: int):
    return [F.gelu(tensor_operand(values[0]), approximate=node.attrs.get("approximate", "none"))]


@dataclass(frozen=True)
class OpRule:
    build: Callable
    problems: Callable = no_problems


OPS: dict[str, OpRule] = {
    "Gemm": OpRule(build_gemm),
    "MatMul": OpRule(build_matmul),
    "Add": OpRule(binary(np.add, lambda a, b: a + b)),
    "Sub": OpRule(binary(np.subtract, lambda a, b: a - b)),
    "Mul": OpRule(binary(np.multiply, lambda a, b: a * b)),
    "Div": OpRule(binary(static_divide, lambda a, b: a / b)),
    "Relu": OpRule(unary(F.relu)),
    "Sigmoid": OpRule(unary(F.sigmoid)),
    "Tanh": OpRule(unary(F.tanh)),
    "Gelu": OpRule(build_gelu, gelu_problems),
    "Conv": OpRule(build_conv, conv_problems),
    "MaxPool": OpRule(build_pool(F.max_pool2d), pool_problems),
    "AveragePool": OpRule(build_pool(F.avg_pool2d), pool_problems),
    "GlobalAveragePool": OpRule(build_global_average_pool),
    "BatchNormalization": OpRule(build_batch_norm, batch_norm_problems),
    "Flatten": OpRule(build_flatten),
    "Reshape": OpRule(build_reshape, reshape_problems),
    "Transpose": OpRule(build_transpose),
    "Softmax": OpRule(build_softmax),
    "LayerNormalization": OpRule(build_layer_norm, layer_norm_problems),
    "Identity": OpRule(build_identity),
}
SUPPORTED_OPS = sorted([*OPS, "Constant"])


def graph_problems(nodes: list[Node], domains: list[str], opset: int) -> str:
    """Every unsupported op (with its count) and attribute of the graph, as one message; '' if none."""
    unsupported = Counter(
        f"{domain}::{node.op}" if domain not in ("", "ai.onnx") else node.op
        for node, domain in zip(nodes, domains, strict=True)
        if node.op not in OPS and node.op != "Constant" or domain not in ("", "ai.onnx")
    )
    lines = []
    if unsupported:
        listed = ", ".join(f"{op} ×{count}" for op, count in sorted(unsupported.items()))
        lines.append(f"unsupported ops: {listed}")
    for node, domain in zip(nodes, domains, strict=True):
        if domain in ("", "ai.onnx") and node.op in OPS:
            lines += [f"{node.where()}: unsupported attribute {p}" for p in OPS[node.op].problems(node, opset)]
        if node.op == "Constant" and "value" not in node.attrs:
            lines.append(f"{node.where()}: unsupported attribute (only value=, got {sorted(node.attrs)})")
    if not lines:
        return ""
    return (
        "load_onnx: this ONNX graph uses what meganeura cannot build:\n  "
        + "\n  ".join(lines)
        + f"\n(supported ops: {', '.join(SUPPORTED_OPS)})"
    )


# ---------------------------------------------------------------------------------------------
# Names: ONNX initializer names as dotted module paths


IDENTIFIER_PART = re.compile(r"[^0-9A-Za-z_]")
MODULE_ATTRIBUTES = {"graph_inputs", "graph_outputs", "nodes", "opset", "input_shapes", "input_dtypes", "input_specs"}
# instance attributes (training) are not in dir(Module) but would be clobbered just the same
RESERVED = set(dir(nn.Module)) | MODULE_ATTRIBUTES | {"feeds", "build_state", "training"}


def sanitized(name: str) -> str:
    """A dotted name whose parts are identifiers (or digits, as PyTorch's Sequential children are),
    none of them a Module attribute."""
    parts = []
    for part in name.split("."):
        part = IDENTIFIER_PART.sub("_", part)
        if not part:
            continue
        if part in RESERVED or part.startswith("_") or keyword.iskeyword(part):
            part = "p" + part if part.startswith("_") else part + "_"
        parts.append(part)
    return ".".join(parts) or "param"


class Namespace(nn.Module):
    """A submodule standing for one dotted prefix of initializer names."""


def unique_names(names: list[str]) -> dict[str, str]:
    """ONNX name → its sanitised dotted name, unique, with no name a prefix path of another (a
    clash gets a suffix on the part where it occurs: "a" and "a.b" give "a" and "a_1.b")."""
    taken: set[str] = set()
    prefixes: set[str] = set()
    result = {}
    for name in names:
        parts = sanitized(name).split(".")
        for i, base in enumerate(parts):
            index = 0
            while clashes(".".join(parts[: i + 1]), i == len(parts) - 1, taken, prefixes):
                index += 1
                parts[i] = f"{base}_{index}"
        dotted = ".".join(parts)
        taken.add(dotted)
        prefixes.update(dotted_prefixes(dotted))
        result[name] = dotted
    return result


def clashes(path: str, is_leaf: bool, taken: set[str], prefixes: set[str]) -> bool:
    """Whether `path` is already a parameter (or, for a leaf, also a submodule)."""
    return path in taken or (is_leaf and path in prefixes)


def dotted_prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def place(root: nn.Module, dotted: str, value: Parameter) -> None:
    module = root
    *path, leaf = dotted.split(".")
    for part in path:
        child = module._modules.get(part)
        if child is None:
            child = Namespace()
            setattr(module, part, child)
        module = child
    setattr(module, leaf, value)


# ---------------------------------------------------------------------------------------------
# The module


class OnnxModule(nn.Module):
    """An ONNX graph as a module: forward takes the graph's inputs by name (or positionally, in
    graph order) and returns its output (a tuple for several, in graph order)."""

    def __init__(self, model) -> None:
        super().__init__()
        onnx = import_onnx()
        graph = model.graph
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        nodes = [node_of(onnx, n) for n in graph.node]
        problems = graph_problems(nodes, [n.domain for n in graph.node], opset)
        if problems:
            raise OnnxImportError(problems)
        initializers = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
        for node in nodes:  # Constant nodes: static values, or (float arrays) buffers
            if node.op == "Constant":
                initializers[node.outputs[0]] = np.asarray(node.attrs["value"])
        object.__setattr__(self, "opset", opset)
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "graph_inputs", [i.name for i in graph.input if i.name not in initializers])
        object.__setattr__(self, "graph_outputs", [o.name for o in graph.output])
        object.__setattr__(self, "input_shapes", {i.name: value_shape(i) for i in graph.input})
        integer = (onnx.TensorProto.INT32, onnx.TensorProto.INT64)
        dtypes = {i.name: "i32" if i.type.tensor_type.elem_type in integer else "f32" for i in graph.input}
        object.__setattr__(self, "input_dtypes", dtypes)
        object.__setattr__(self, "_values", self.build_state(initializers, nodes))

    def build_state(self, initializers: dict[str, np.ndarray], nodes: list[Node]) -> dict[str, Any]:
        """ONNX name → Parameter, Buffer (BatchNorm statistics, float Constant arrays) or static array."""
        statistics = {name for node in nodes if node.op == "BatchNormalization" for name in node.inputs[3:5]}
        constants = {node.outputs[0] for node in nodes if node.op == "Constant"}
        # scalar floats stay static (a Python number in the trace): exported graphs use them as
        # constants (1/√d, ε), not as weights
        floats = [name for name, value in initializers.items() if value.dtype.kind == "f" and value.ndim > 0]
        names = unique_names(floats)
        values: dict[str, Any] = {}
        for name, value in initializers.items():
            if name in names:
                kind = Buffer if name in statistics or name in constants else Parameter
                values[name] = kind(value.astype(np.float32))
                place(self, names[name], values[name])
            else:
                values[name] = value
        return values

    def forward(self, *args, **kwargs):
        feeds = self.feeds(args, kwargs)
        values: dict[str, Any] = {**self._values, **feeds, "": None}
        for node in self.nodes:
            if node.op == "Constant":
                continue
            operands = [values[name] for name in node.inputs]
            if node.op == "BatchNormalization":
                outputs = build_batch_norm(node, operands, self.opset, self.training)
            else:
                outputs = OPS[node.op].build(node, operands, self.opset)
            values.update(zip(node.outputs, outputs, strict=False))
        results = tuple(values[name] for name in self.graph_outputs)
        return results[0] if len(results) == 1 else results

    def feeds(self, args: tuple, kwargs: dict) -> dict[str, Tensor]:
        names = self.graph_inputs
        if len(args) > len(names):
            raise TypeError(f"the ONNX graph takes {len(names)} inputs {names}, got {len(args)} positional")
        feeds = dict(zip(names, args, strict=False))
        doubled = [name for name in kwargs if name in feeds]
        unknown = [name for name in kwargs if name not in names]
        missing = [name for name in names if name not in feeds and name not in kwargs]
        if doubled or unknown or missing:
            raise TypeError(
                f"the ONNX graph's inputs are {names}: missing {missing}, unexpected {unknown}, given twice {doubled}"
            )
        feeds |= kwargs
        for name, value in feeds.items():
            expected = self.input_shapes.get(name)
            if isinstance(value, Tensor) and expected is not None and not shape_matches(value.shape, expected):
                raise ValueError(f"ONNX input {name!r}: expected shape {expected}, got {list(value.shape)}")
        return feeds

    def input_specs(self, **dims: int) -> dict[str, InputSpec]:
        """`compile(inputs=...)` for the graph's inputs, with symbolic dims (e.g. batch=32) given by name.

        >>> # mn.compile(model, inputs=model.input_specs(batch=8))
        """
        specs = {}
        for name in self.graph_inputs:
            shape = self.input_shapes.get(name)
            if shape is None:
                raise ValueError(f"ONNX input {name!r} has no declared shape: write its spec by hand")
            unknown = [d for d in shape if isinstance(d, str) and d not in dims]
            if unknown:
                raise ValueError(f"ONNX input {name!r} has the symbolic dims {unknown}: give them, e.g. {unknown[0]}=8")
            concrete = tuple(dims[d] if isinstance(d, str) else d for d in shape)
            specs[name] = (i32 if self.input_dtypes[name] == "i32" else f32)[concrete]
        return specs

    def extra_repr(self) -> str:
        return f"inputs={self.graph_inputs}, outputs={self.graph_outputs}, nodes={len(self.nodes)}, opset={self.opset}"


def value_shape(info) -> list | None:
    """A graph input's declared shape: ints, names of symbolic dims, or None for an unknown dim."""
    if not info.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for d in info.type.tensor_type.shape.dim:
        dims.append(d.dim_value if d.HasField("dim_value") else (d.dim_param or None))
    return dims


def shape_matches(shape: tuple[int, ...], expected: list) -> bool:
    return len(shape) == len(expected) and all(
        not isinstance(e, int) or e == s for s, e in zip(shape, expected, strict=True)
    )


def load_onnx(path_or_model) -> OnnxModule:
    """A trainable nn.Module built from an ONNX graph (a path, bytes or an onnx.ModelProto).

    Supported: Gemm, MatMul, Add, Sub, Mul, Div, Relu, Sigmoid, Tanh, Gelu, Conv (2-D, group 1,
    dilation 1), MaxPool, AveragePool, GlobalAveragePool, BatchNormalization, Flatten, Reshape,
    Transpose, Softmax, LayerNormalization, Identity and Constant. An OnnxImportError lists every
    unsupported op (with its count) and attribute before anything is built. Initializers become
    Parameters, BatchNormalization's statistics Buffers; the module is in training mode, as
    every new Module: call `.eval()` for ONNX's inference semantics of BatchNormalization.

    >>> # model = mn.load_onnx("cnn.onnx").eval()
    >>> # program = mn.compile(model, inputs=model.input_specs(batch=8)); logits = program(input=x)
    """
    return OnnxModule(read_model(path_or_model))
