"""IR → egglog: the `Term` sort, its constructors, the shape facts, and the encoder.

Every live IR node (and every input/param/state leaf) becomes one e-class, named by an
unextractable tag `Term.ref("n<id>")` and unioned with the node's own constructor, whose
children are the tags of its inputs. One `union` per node keeps the encoding linear in the
graph: egglog-python walks nested expressions as trees, so building the graph as one term would
blow up on shared sub-terms (platform.md, "egglog at scale").

The ops that rules match have typed constructors with typed attributes (transpose flags as
`Bool`, the activation as `String`) so that rules can bind and guard on them. Every other op
goes through a generic constructor `Term.opN(op, attrs_text, child…)`: the attribute text only
has to tell nodes apart (so that hash-consing merges true duplicates and nothing else); the
decoder maps it back to the IR attributes through `Encoding.attrs_by_text`.

Shape facts for guards are egglog functions set at encode time: `rank(t)` and `dim(t, i)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from egglog import (
    Bool,
    BoolLike,
    EGraph,
    Expr,
    String,
    StringLike,
    function,
    i64,
    i64Like,
    method,
    set_,
    union,
)

from meganeura.ir.graph import Graph, Node, TensorType

LEAF_KINDS = ("input", "param", "state")
ACTIVATIONS = ("relu", "sigmoid", "tanh")
MAX_GENERIC_ARITY = 6


class Term(Expr):
    """A tensor value in the e-graph."""

    @method(unextractable=True)
    @classmethod
    def ref(cls, name: StringLike) -> Term: ...

    @classmethod
    def matmul(cls, a: Term, b: Term, transpose_a: BoolLike, transpose_b: BoolLike) -> Term: ...

    @classmethod
    def fused_matmul(
        cls, a: Term, b: Term, bias: Term, transpose_a: BoolLike, transpose_b: BoolLike, activation: StringLike
    ) -> Term: ...

    @classmethod
    def no_bias(cls) -> Term: ...

    @classmethod
    def add(cls, a: Term, b: Term) -> Term: ...

    @classmethod
    def relu(cls, x: Term) -> Term: ...

    @classmethod
    def sigmoid(cls, x: Term) -> Term: ...

    @classmethod
    def tanh(cls, x: Term) -> Term: ...

    @classmethod
    def op0(cls, op: StringLike, attrs: StringLike) -> Term: ...

    @classmethod
    def op1(cls, op: StringLike, attrs: StringLike, x0: Term) -> Term: ...

    @classmethod
    def op2(cls, op: StringLike, attrs: StringLike, x0: Term, x1: Term) -> Term: ...

    @classmethod
    def op3(cls, op: StringLike, attrs: StringLike, x0: Term, x1: Term, x2: Term) -> Term: ...

    @classmethod
    def op4(cls, op: StringLike, attrs: StringLike, x0: Term, x1: Term, x2: Term, x3: Term) -> Term: ...

    @classmethod
    def op5(cls, op: StringLike, attrs: StringLike, x0: Term, x1: Term, x2: Term, x3: Term, x4: Term) -> Term: ...

    @classmethod
    def op6(
        cls, op: StringLike, attrs: StringLike, x0: Term, x1: Term, x2: Term, x3: Term, x4: Term, x5: Term
    ) -> Term: ...


@function
def rank(x: Term) -> i64:
    """The number of dimensions of a value (a fact set at encode time)."""


@function
def dim(x: Term, axis: i64Like) -> i64:
    """The size of one dimension of a value (a fact set at encode time)."""


GENERIC_CONSTRUCTORS = (Term.op0, Term.op1, Term.op2, Term.op3, Term.op4, Term.op5, Term.op6)
UNARY_CONSTRUCTORS = {"relu": Term.relu, "sigmoid": Term.sigmoid, "tanh": Term.tanh}


# How an IR node was encoded: (constructor as the serialized e-graph names it, input IR node ids
# with None for the `no_bias` placeholder, primitive arguments). It finds the input graph's own
# e-nodes again after saturation, so that extraction can start from the input plan.
Signature = tuple[str, tuple[int | None, ...], tuple[object, ...]]


@dataclass
class Encoding:
    """An e-graph holding an IR graph, and what is needed to map e-classes back to IR nodes."""

    graph: Graph
    egraph: EGraph
    encoded_ids: list[int]  # IR node ids that have an e-class, in graph order
    attrs_by_text: dict[str, tuple[tuple[str, Any], ...]] = field(default_factory=dict)
    signatures: dict[int, Signature] = field(default_factory=dict)


def ref_name(node_id: int) -> str:
    """The tag naming the e-class of IR node `node_id`."""
    return f"n{node_id}"


def ref(node_id: int) -> Term:
    """The tag term of IR node `node_id`."""
    return Term.ref(ref_name(node_id))


def attrs_text(node: Node) -> str:
    """A text that tells the node's attributes apart (it is only compared, never parsed)."""
    return repr(node.attrs)


def has_only_attrs(node: Node, allowed: tuple[str, ...]) -> bool:
    """Whether every attribute of the node is one a typed constructor carries."""
    return all(key in allowed for key, _ in node.attrs)


def typed_term(node: Node, inputs: list[Term]) -> tuple[Term, Signature] | None:
    """The typed constructor term (and signature) of a node whose op rules match, or None."""
    transpose_a = bool(node.attr("transpose_a", False))
    transpose_b = bool(node.attr("transpose_b", False))
    if node.op == "matmul" and has_only_attrs(node, ("transpose_a", "transpose_b")):
        term = Term.matmul(inputs[0], inputs[1], Bool(transpose_a), Bool(transpose_b))
        return term, ("Term.matmul", node.inputs, (transpose_a, transpose_b))
    if node.op == "fused_matmul" and has_only_attrs(node, ("transpose_a", "transpose_b", "activation")):
        bias, bias_id = (inputs[2], node.inputs[2]) if len(inputs) == 3 else (Term.no_bias(), None)
        activation = str(node.attr("activation", "none"))
        term = Term.fused_matmul(inputs[0], inputs[1], bias, Bool(transpose_a), Bool(transpose_b), String(activation))
        return term, ("Term.fused_matmul", (*node.inputs[:2], bias_id), (transpose_a, transpose_b, activation))
    if node.op == "add" and not node.attrs:
        return Term.add(inputs[0], inputs[1]), ("Term.add", node.inputs, ())
    if node.op in UNARY_CONSTRUCTORS and not node.attrs:
        return UNARY_CONSTRUCTORS[node.op](inputs[0]), (f"Term.{node.op}", node.inputs, ())
    return None


def generic_term(node: Node, inputs: list[Term]) -> tuple[Term, Signature]:
    """The generic constructor term `opN(op, attrs_text, children…)` (and signature) of any other node."""
    if len(node.inputs) > MAX_GENERIC_ARITY:
        raise NotImplementedError(
            f"rewrite: op {node.op!r} has {len(node.inputs)} inputs; the e-graph encoding takes at most "
            f"{MAX_GENERIC_ARITY} (add a constructor Term.op{len(node.inputs)} in rewrite/encode.py)"
        )
    constructor = GENERIC_CONSTRUCTORS[len(node.inputs)]
    text = attrs_text(node)
    term = constructor(String(node.op), String(text), *inputs)
    return term, (f"Term.op{len(node.inputs)}", node.inputs, (node.op, text))


def shape_facts(tag: Term, value_type: TensorType) -> list:
    """The actions setting `rank` and `dim` of one node's e-class (named by `tag`)."""
    facts = [set_(rank(tag)).to(i64(value_type.rank))]
    facts.extend(set_(dim(tag, i64(axis))).to(i64(size)) for axis, size in enumerate(value_type.shape))
    return facts


def encoded_node_ids(graph: Graph) -> list[int]:
    """The nodes that get an e-class: the live ones and every input/param/state leaf."""
    live = graph.live_ids()
    return [n.id for n in graph.nodes if n.id in live or n.op in LEAF_KINDS]


def encode(graph: Graph) -> Encoding:
    """A fresh e-graph with one tagged e-class (and its shape facts) per encoded IR node."""
    node_ids = encoded_node_ids(graph)
    encoding = Encoding(graph, EGraph(), node_ids)
    actions = []
    tags: dict[int, Term] = {}  # built once per node: egglog-python expressions are slow to make
    for node_id in node_ids:
        node = graph[node_id]
        inputs = [tags[i] for i in node.inputs]
        typed = typed_term(node, inputs)
        if typed is None:
            encoding.attrs_by_text[attrs_text(node)] = node.attrs
        term, encoding.signatures[node_id] = typed or generic_term(node, inputs)
        tags[node_id] = ref(node_id)
        actions.append(union(tags[node_id]).with_(term))
        actions.extend(shape_facts(tags[node_id], node.type))
    if actions:
        # One register call: egglog-python compiles the batch once instead of per action.
        encoding.egraph.register(*actions)
    return encoding
