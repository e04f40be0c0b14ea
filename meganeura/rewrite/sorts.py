"""The e-graph's vocabulary: its two sorts, what a constructor is, and how values are written.

The stage talks to egglog through its program-text interface (`egglog.bindings.EGraph`): building
terms through egglog-python's expression objects costs about a millisecond per IR node; loading
fact tables and building the terms with rules costs about ten microseconds (see `encode.py`).

Two sorts:
- `Term`: a tensor value (or the tuple of a node with several results). Every encoded IR node
  gets an e-class, named by the tag `(Ref id)` (never extracted).
- `Pw`: the body of a fused kernel, an elementwise expression over loads of Terms (the `Pw`
  constructors mirror `ir/expr.py`): `(Load t)` (tensor t, broadcast to the kernel's shape),
  `(Lit f64)`, `(Acc)` (a matmul's accumulator), `(R)` (a reduction's result), `(PUnary fn p)`,
  `(PBinary fn p q)`, `(PTernary fn p q r)`, and the helper `(Replace p t e)` of the epilogue
  rules (p with every (Load t) replaced by e; never extracted).

A `Constructor` lists its fields in egglog argument order; each field is an operand (a Term
child), a Pw body, an attribute of the op (bool, i64, f64 or String; integer tuples are written
as the text "4,5"), or the tag naming which op a shared constructor stands for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from meganeura.ir.op import INTS, Attr

TERM = "Term"
PW = "Pw"
REF = "Ref"


@dataclass(frozen=True)
class Field:
    """One argument of a constructor: `kind` is "tag", "operand", "body" or "attr"."""

    name: str
    kind: str
    sort: str
    attr: Attr | None = None

    @property
    def is_class(self) -> bool:
        """Whether the field is an e-class (a Term or Pw child) rather than a primitive."""
        return self.sort in (TERM, PW)

    @property
    def is_ints(self) -> bool:
        return self.attr is not None and self.attr.type is INTS


@dataclass(frozen=True)
class Constructor:
    """One egglog constructor: its name, output sort and fields; `op`/`tag` say which IR op it
    encodes (None for the kernel forms and the Pw constructors, whose decoding is their own)."""

    name: str
    sort: str
    fields: tuple[Field, ...]
    op: str | None = None
    tag: str | None = None

    @property
    def sorts(self) -> tuple[str, ...]:
        return tuple(f.sort for f in self.fields)

    @property
    def children(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if f.is_class)

    @property
    def primitives(self) -> tuple[Field, ...]:
        return tuple(f for f in self.fields if not f.is_class)

    def declaration(self) -> str:
        return f"({self.name}{''.join(' ' + s for s in self.sorts)})" if self.fields else f"({self.name})"


class ENode(NamedTuple):
    """One e-node of a saturated e-graph: its constructor, its e-class, child e-classes and
    primitive arguments, in field order (`view.read_egraph` makes them)."""

    op: str
    eclass: int
    children: tuple[int, ...]
    primitives: tuple

    @property
    def key(self) -> tuple:
        return (self.op, self.children, self.primitives)


def operand(name: str) -> Field:
    return Field(name, "operand", TERM)


def body(name: str) -> Field:
    return Field(name, "body", PW)


def attribute(attr: Attr) -> Field:
    return Field(attr.name, "attr", attr.type.egglog, attr)


def primitive(name: str, sort: str, is_ints: bool = False) -> Field:
    """A primitive field of a kernel form that is not an op attribute (a shape, a mode); with
    `is_ints` an integer tuple written as text."""
    return Field(name, "attr", sort, Attr(name, INTS) if is_ints else None)


PW_CONSTRUCTORS: tuple[Constructor, ...] = (
    Constructor("Lit", PW, (primitive("value", "f64"),)),
    Constructor("Acc", PW, ()),
    Constructor("R", PW, ()),
    Constructor("PUnary", PW, (Field("fn", "tag", "String"), body("x"))),
    Constructor("PBinary", PW, (Field("fn", "tag", "String"), body("a"), body("b"))),
    Constructor("PTernary", PW, (Field("fn", "tag", "String"), body("a"), body("b"), body("c"))),
    Constructor("Load", PW, (operand("t"),)),
    Constructor("Replace", PW, (body("p"), operand("t"), body("e"))),
)
PW_CALLS = {1: "PUnary", 2: "PBinary", 3: "PTernary"}  # expression functions by arity
HELPERS = ("Replace",)  # constructors that only drive rules: never part of a plan


# ---------------------------------------------------------------------------------------------
# Values as egglog text


def f64(value: float) -> str:
    """An egglog f64 literal (egglog reads `inf`, `-inf` and `NaN`)."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def boolean(value: bool) -> str:
    return "true" if value else "false"


def ints_text(values: Iterable[int]) -> str:
    """A tuple of ints as the text egglog stores: (4, 5) -> `4,5`."""
    return ",".join(str(int(v)) for v in values)


def ints(values: Iterable[int]) -> str:
    """A tuple of ints as an egglog string literal: (4, 5) -> `"4,5"`."""
    return f'"{ints_text(values)}"'


def parse_ints(text: str) -> tuple[int, ...]:
    """The inverse of `ints_text`."""
    return tuple(int(v) for v in text.split(",")) if text else ()


def string(text: str) -> str:
    """An egglog string literal (only identifiers, digit lists and expression text are written)."""
    if '"' in text or "\\" in text:
        raise ValueError(f"egglog string {text!r} needs escaping, which the encoder does not do")
    return f'"{text}"'


def ref(node_id: int) -> str:
    return f"(Ref {node_id})"


def literal(value, sort: str, is_ints: bool = False) -> str:
    """A primitive value as an egglog literal of `sort`."""
    if is_ints:
        return ints(value)
    if sort == "bool":
        return boolean(value)
    if sort == "i64":
        return str(int(value))
    if sort == "f64":
        return f64(value)
    return string(value)


def swap_last_two(rank: int) -> tuple[int, ...]:
    """The permutation exchanging the last two dims of a rank-`rank` tensor."""
    return (*range(rank - 2), rank - 1, rank - 2)
