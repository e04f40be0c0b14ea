"""The op declaration: what one IR op means, declared once, in its family module (`ir/ops/`).

    rope = Op(
        "rope", family="transformer", operands=("x", "cos", "sin"),
        infer=infer_rope, evaluate=evaluate_rope,
        doc="x·cos + rotate_half(x)·sin (rotary position embeddings)",
    )

    @rope.vjp
    def _rope_vjp(b, node, g):
        ...

Every stage reads these declarations, and nothing else, to know what an op is: tracing checks
the attributes against the schema and the shapes with `infer` (`infer_type`); the numpy
interpreter runs `evaluate`; autodiff calls the VJP; the e-graph's schema, its fact tables, the
view of a saturated e-graph and the decoding of a plan are generated from `operands`, `attrs`
and `egraph`; the cost model reads `kernel` and `flops`; the report reads `describe`. The WGSL
lowering of an op registers itself in `codegen/` (`@lowering("rope")`).

Attributes have types (`BOOL`, `INT`, `FLOAT`, `STR`, `INTS` for integer tuples such as shapes,
`EXPR` for the expression text of fused kernels) and defaults; a node always carries every
attribute of its op, canonical (tuples, not lists; floats, not ints), so that equal nodes are
equal values.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from meganeura.ir.graph import ATTR_DEFAULTS, Node, TensorType


class ShapeError(ValueError):
    """A shape, dtype or attribute mismatch found while tracing; the message names the user's file and line."""


# ---------------------------------------------------------------------------------------------
# Attribute types


@dataclass(frozen=True)
class AttrType:
    """One kind of attribute value: how it is checked and made canonical, and its egglog sort."""

    name: str
    egglog: str  # the egglog sort of the attribute in a generated e-graph constructor
    canonical: Callable[[Any], Any]  # the canonical value, or raises ValueError/TypeError

    def __repr__(self) -> str:
        return self.name.upper()


def _bool(value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"expected a bool, got {value!r}")
    return bool(value)


def _int(value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"expected an int, got {value!r}")
    return int(value)


def _float(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"expected a number, got {value!r}")
    return float(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"expected a tuple of ints, got {value!r}")
    return tuple(_int(v) for v in value)


BOOL = AttrType("bool", "bool", _bool)
INT = AttrType("int", "i64", _int)
FLOAT = AttrType("float", "f64", _float)
STR = AttrType("str", "String", _str)
INTS = AttrType("ints", "String", _ints)  # in the e-graph as text "4,5" (one field per attribute)
EXPR = AttrType("expr", "String", _str)  # expression text (ir/expr.py); fused kernels only

REQUIRED = object()


@dataclass(frozen=True)
class Attr:
    """One attribute of an op: its name, type, and default (REQUIRED when it has none)."""

    name: str
    type: AttrType
    default: Any = REQUIRED

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


# ---------------------------------------------------------------------------------------------
# E-graph forms


@dataclass(frozen=True)
class EGraphForm:
    """How an op's nodes are written in the e-graph: `(Constructor [tag] operand… attribute…)`.

    Most ops get a constructor of their own, named after them in CamelCase (`conv_gemm` →
    `ConvGemm`). Ops that rules treat alike share one, with a leading `tag` naming the op: the
    elementwise functions `(Unary "exp" x)`, `(Binary "add" x y)`, the reductions
    `(Reduce "sum" x axes keepdim)`. An op with a variable number of operands has one
    constructor per arity, the arity appended (`Concat2`, `Concat3`…).
    """

    constructor: str
    tag: str | None = None


def camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


# ---------------------------------------------------------------------------------------------
# The declaration


OPS: dict[str, Op] = {}


class Op:
    """One IR op, declared once (see the module docstring).

    `operands` names the inputs in order; a name ending in `?` is optional (only trailing ones),
    one starting with `*` takes any number (`max_operands` at most in the e-graph). `infer(types,
    attrs)` returns the result type (a tuple of types for several results) or raises ShapeError;
    `evaluate(*arrays, **attrs)` computes it with numpy (a tuple for several results). `kernel`:
    whether a node launches a GPU kernel (False: a buffer or a view). `egraph`: the e-graph form,
    or None for the fused kernels, which the rewrite stage encodes itself (`rewrite/kernels.py`).
    `flops(operand types, result types, attrs)`: the arithmetic the cost model charges beyond the
    bytes moved (matmuls). `describe(node)`: a short text for the report's kernel list.
    """

    def __init__(
        self,
        name: str,
        *,
        family: str,
        infer: Callable[[list[TensorType], dict[str, Any]], TensorType | tuple[TensorType, ...]],
        evaluate: Callable[..., Any],
        operands: tuple[str, ...] = (),
        attrs: tuple[Attr, ...] = (),
        kernel: bool = True,
        egraph: EGraphForm | None | str = "default",
        max_operands: int = 6,
        tuple_operands: bool = False,
        flops: Callable[[list[TensorType], tuple[TensorType, ...], dict[str, Any]], int] | None = None,
        describe: Callable[[Node], str] | None = None,
        doc: str = "",
    ) -> None:
        if name in OPS:
            raise ValueError(f"op {name!r} is declared twice")
        self.name = name
        self.family = family
        self.infer = infer
        self.evaluate = evaluate
        self.operands = operands
        self.attrs = attrs
        self.kernel = kernel
        self.flops = flops
        self.describe = describe
        self.doc = doc
        self.vjp_rule: Callable | None = None
        self.tuple_operands = tuple_operands  # whether it reads nodes with several results (`result`)
        self.min_operands, self.max_operands = operand_range(operands, max_operands)
        self.egraph = EGraphForm(camel(name)) if egraph == "default" else egraph
        self.attr_by_name = {a.name: a for a in attrs}
        ATTR_DEFAULTS[name] = {a.name: a.default for a in attrs if not a.required}
        OPS[name] = self

    def __repr__(self) -> str:
        return f"Op({self.name!r})"

    @property
    def fixed_arity(self) -> bool:
        return self.min_operands == self.max_operands

    def vjp(self, rule: Callable) -> Callable:
        """Decorator: register `rule(builder, node, g)` as this op's vector-Jacobian product.

        `g` is the gradient of the node's result (a tuple of gradients, None where a result has
        none, for a node with several results); the rule returns one gradient node id (or None)
        per operand, each already multiplied by `g` (the grad_output contract)."""
        self.vjp_rule = rule
        return rule

    def canonical_attrs(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Every attribute of the op, checked against the schema, defaults filled in (or a ShapeError)."""
        unknown = sorted(set(attrs) - set(self.attr_by_name))
        if unknown:
            raise ShapeError(f"{self.name}: unknown attribute(s) {unknown}; it takes {sorted(self.attr_by_name)}")
        result = {}
        for attr in self.attrs:
            if attr.name not in attrs:
                if attr.required:
                    raise ShapeError(f"{self.name}: attribute {attr.name!r} is required")
                result[attr.name] = attr.default
                continue
            try:
                result[attr.name] = attr.type.canonical(attrs[attr.name])
            except (TypeError, ValueError) as error:
                raise ShapeError(f"{self.name}: attribute {attr.name!r}: {error}") from None
        return result


def operand_range(operands: tuple[str, ...], max_operands: int) -> tuple[int, int]:
    """(min, max) number of operands of an operand list such as ("a", "b", "*extras") or ("m", "g", "p?")."""
    required = [o for o in operands if not o.endswith("?") and not o.startswith("*")]
    if any(o.startswith("*") for o in operands):
        return len(required), max_operands
    return len(required), len(operands)


def op_def(name: str) -> Op:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown IR op {name!r}") from None


def infer_type(op: str, types: list, attrs: dict[str, Any]) -> TensorType | tuple[TensorType, ...]:
    """The result type of `op` on operands `types` (a tuple for several results), or a ShapeError
    saying what did not fit (attributes are checked against the op's schema first; an operand
    with several results has a tuple of types, `operand_types`, which only `result` reads)."""
    definition = op_def(op)
    attrs = definition.canonical_attrs(attrs)
    count = len(types)
    if not definition.tuple_operands and any(isinstance(t, tuple) for t in types):
        raise ShapeError(f"{op}: an operand has several results; read one of them with `result`")
    most = definition.max_operands if definition.egraph else math.inf  # the fused kernels take any number
    if not definition.min_operands <= count <= most:
        if definition.fixed_arity:
            expected = f"{definition.min_operands}"
        elif most == math.inf:
            expected = f"at least {definition.min_operands}"
        else:
            expected = f"{definition.min_operands} to {most}"
        raise ShapeError(f"{op}: expected {expected} operands, got {count}")
    return definition.infer(types, attrs)


def operand_types(graph, inputs) -> list:
    """The types of nodes `inputs` of `graph` as infer_type takes them (a tuple for a node with several results)."""
    return [graph[i].types[0] if len(graph[i].types) == 1 else graph[i].types for i in inputs]


def checked_type(op: str, types: list, attrs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """(the canonical attributes, the result type) of `op` on operands of `types`, or a ShapeError."""
    return op_def(op).canonical_attrs(attrs), infer_type(op, types, attrs)


def add_checked(graph, op: str, inputs, attrs: dict[str, Any], sources: tuple[str, ...] = ()) -> int:
    """A node of `op` appended to `graph`, its attributes made canonical and its type inferred
    (`checked_type`); its id. The passes after extraction build their new nodes with it."""
    canonical, types = checked_type(op, operand_types(graph, inputs), attrs)
    return graph.add(op, tuple(inputs), types, canonical, sources)


def launches_kernel(op: str) -> bool:
    """Whether a node of this op runs a GPU kernel (leaves, reshapes and projections are buffers or views)."""
    return op_def(op).kernel


# ---------------------------------------------------------------------------------------------
# Shape helpers the families share


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...], op: str = "op") -> tuple[int, ...]:
    """numpy's broadcasting rule, with an error that shows both shapes."""
    rank = max(len(a), len(b))
    pa = (1,) * (rank - len(a)) + a
    pb = (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(pa, pb, strict=True):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError(f"{op}: shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(out)


def broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    try:
        return broadcast_shapes(shape, target) == target
    except ShapeError:
        return False


def require_float(types: list[TensorType], op: str) -> None:
    for t in types:
        if t.dtype != "f32":
            raise ShapeError(f"{op}: expected f32 operands, got {t}")


def normalize_axes(axes, rank: int, op: str = "sum") -> tuple[int, ...]:
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = (axes,)
    result = []
    for axis in axes:
        if not -rank <= axis < max(rank, 1):
            raise ShapeError(f"{op}: dim {axis} is out of range for a tensor of rank {rank}")
        result.append(axis % rank if rank else 0)
    if len(set(result)) != len(result):
        raise ShapeError(f"{op}: repeated dims {tuple(axes)}")
    return tuple(sorted(result))


def same_as_first(types: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return types[0]
