"""IR → egglog: one tagged e-class per IR node, written as egglog program text.

Every encoded IR node (the live ones and every input/param/state leaf) becomes one e-class,
`(union (Ref id) TERM)` with TERM's children the tags `(Ref j)` of its inputs, and one fact
`(set (shape (Ref id)) "4,5")`. One union per node keeps the encoding linear in the graph
(platform.md, "egglog at scale").

How the terms get into egglog, fast: each IR node becomes one row of a fact table per
constructor (`Matmul_fact`: id, a, b, ta, tb; `shape_fact`: id, shape…), written to
tab-separated files and loaded with egglog's `input` command; one rule per constructor (the
`encode` ruleset, run once) then builds the terms, `(Matmul_fact i a b 1 0)` →
`(union (Ref i) (Matmul (Ref a) (Ref b) true false))`. For the 8,109 nodes of a 30-layer
transformer step this takes ~0.1 s, where ~8,000 actions in rule bodies took ~0.45 s
(~1 µs against ~55 µs a node in egglog) and egglog-python's expression objects ~900 µs a node.
Kernel terms (fused ops already in the graph, rare) are written as actions.

Ops that rules match have typed constructors with typed attributes (`schema.py`); fused ops
already in the graph (pointwise, fused_matmul, fused_reduce) are parsed back into kernel terms, so
an optimized graph can be optimized again. Every other op is a generic `(OpN op attrs …)` whose
`attrs` is an index into `Encoding.attrs_table`: equal attributes get equal indices, so
hash-consing still merges true duplicates (common subexpressions) and nothing else.

`Encoding.terms` keeps each node's term as data (a `Term` tuple), which extraction uses to find
the input graph's own plan among the e-nodes.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

from egglog import bindings

from meganeura.ir.expr import BINARY_FUNCTIONS, UNARY_FUNCTIONS
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops import normalize_axes
from meganeura.rewrite.algebra import permutation_facts
from meganeura.rewrite.conv import geometry_text
from meganeura.rewrite.schema import (
    MAX_GENERIC_ARITY,
    ROW_CONSTRUCTORS,
    SCHEMA,
    TERM_CONSTRUCTORS,
    boolean,
    f64,
    ints,
    ref,
    string,
)

LEAF_KINDS = ("input", "param", "state")

# A term as data. Pw trees: ("load", node_id) | ("lit", value) | ("acc",) | ("r",)
# | ("unary", fn, tree) | ("binary", fn, tree, tree). A Term: (constructor, args) where each arg is
# ("T", node_id) for a Term child, ("P", tree) for a Pw child, or a primitive (bool, int, float, str).
PwTree = tuple
TermData = tuple[str, tuple]


@dataclass
class Encoding:
    """An e-graph holding an IR graph, and what is needed to map e-classes back to IR nodes."""

    graph: Graph
    egraph: bindings.EGraph
    encoded_ids: list[int]  # IR node ids that have an e-class, in graph order
    attrs_table: list[tuple[tuple[str, Any], ...]] = field(default_factory=list)
    terms: dict[int, TermData] = field(default_factory=dict)  # IR node id -> its own term
    duplicates: int = 0  # IR nodes whose term equals an earlier node's (merged by hash-consing)


def encoded_node_ids(graph: Graph) -> list[int]:
    """The nodes that get an e-class: the live ones and every input/param/state leaf."""
    live = graph.live_ids()
    return [n.id for n in graph.nodes if n.id in live or n.op in LEAF_KINDS]


def pw_from_expr(tree, names: dict[str, PwTree]) -> PwTree:
    """An `ir/expr.py` tree as a Pw tree; `names` maps `$` names to Pw leaves."""
    if isinstance(tree, float):
        return ("lit", tree)
    if tree[0] == "$":
        return names[tree[1]]
    if len(tree) == 2:
        return ("unary", tree[0], pw_from_expr(tree[1], names))
    return ("binary", tree[0], pw_from_expr(tree[1], names), pw_from_expr(tree[2], names))


def only_attrs(node: Node, allowed: tuple[str, ...]) -> bool:
    return all(key in allowed for key, _ in node.attrs)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def typed_term(node: Node, graph: Graph) -> TermData | None:
    """The typed term of a node whose op rules match, or None (then it is generic)."""
    op, inputs = node.op, node.inputs
    children = tuple(("T", i) for i in inputs)
    attrs = node.attr_dict
    if op == "const" and node.dtype == "f32" and only_attrs(node, ("value", "dtype")) and is_number(attrs["value"]):
        return ("Const", (float(attrs["value"]),))
    if op in UNARY_FUNCTIONS and not attrs:
        return ("Unary", (op, *children))
    if op in BINARY_FUNCTIONS and not attrs:
        return ("Binary", (op, *children))
    if op == "matmul" and only_attrs(node, ("transpose_a", "transpose_b")):
        return ("Matmul", (*children, bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))))
    if op == "permute" and only_attrs(node, ("perm",)):
        return ("Permute", (*children, tuple(attrs["perm"])))
    if op == "reshape" and only_attrs(node, ("shape",)):
        return ("Reshape", (*children, tuple(attrs["shape"])))
    if op in ("sum", "max") and only_attrs(node, ("axes", "keepdim")):
        axes = normalize_axes(attrs["axes"], graph[inputs[0]].type.rank)
        return ("Reduce", (op, axes, bool(attrs.get("keepdim", False)), *children))
    if op == "attention" and only_attrs(node, ("causal", "scale")) and numbers(attrs, "scale"):
        return ("Attention", (*children, bool(attrs["causal"]), float(attrs["scale"])))
    if op == "rope" and not attrs:
        return ("Rope", children)
    if op in ("unfold", "fold"):
        constructor = "Unfold" if op == "unfold" else "Fold"
        return (constructor, (*children, tuple(int(v) for v in geometry_text(graph, node).split(","))))
    if op == "sgd_step" and only_attrs(node, ("lr", "weight_decay")) and numbers(attrs, "lr", "weight_decay"):
        return ("SgdStep", (*children, float(attrs["lr"]), float(attrs.get("weight_decay", 0.0))))
    if (
        op == "momentum_buffer"
        and only_attrs(node, ("momentum", "weight_decay"))
        and numbers(attrs, "momentum", "weight_decay")
    ):
        return ("MomentumBuffer", (*children, float(attrs["momentum"]), float(attrs.get("weight_decay", 0.0))))
    if (
        op == "adam_moment"
        and only_attrs(node, ("beta", "order", "weight_decay"))
        and numbers(attrs, "beta", "weight_decay")
        and attrs.get("order") in (1, 2)
    ):
        return (
            "AdamMoment",
            (*children, float(attrs["beta"]), int(attrs["order"]), float(attrs.get("weight_decay", 0.0))),
        )
    for constructor, (row_op, _, keys) in ROW_CONSTRUCTORS.items():
        if op == row_op and only_attrs(node, keys) and all(type(attrs.get(key)) is int for key in keys):
            values = {key: attrs[key] for key in keys}
            if "axis" in values:
                values["axis"] %= max(node.type.rank, 1)
            return (constructor, (*children, *values.values()))
    return fused_term(node, graph)


def numbers(attrs: dict[str, Any], *names: str) -> bool:
    return all(is_number(attrs.get(name, 0.0)) and math.isfinite(float(attrs.get(name, 0.0))) for name in names)


def fused_term(node: Node, graph: Graph) -> TermData | None:
    """The kernel term of a fused op already in the graph (pointwise, fused_matmul, fused_reduce)."""
    attrs = node.attr_dict
    loads = {str(index): ("load", i) for index, i in enumerate(node.inputs)}
    if node.op == "pointwise" and only_attrs(node, ("expr", "shape")):
        return ("Kernel", (("P", pw_from_expr(parse_expr(attrs["expr"]), loads)), tuple(attrs["shape"])))
    if node.op == "fused_matmul" and only_attrs(node, ("transpose_a", "transpose_b", "epilogue")):
        extras = {str(index): ("load", i) for index, i in enumerate(node.inputs[2:])}
        epilogue = pw_from_expr(parse_expr(attrs.get("epilogue", "$acc")), {**extras, "acc": ("acc",)})
        a, b = node.inputs[:2]
        flags = (bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b")))
        return ("MatmulKernel", (("T", a), ("T", b), *flags, ("P", epilogue)))
    if node.op == "fused_matmul" and only_attrs(
        node, ("transpose_a", "transpose_b", "epilogue", "prologue", "flatten_a")
    ):
        extras = {str(index): ("load", i) for index, i in enumerate(node.inputs[2:])}
        epilogue = pw_from_expr(parse_expr(attrs.get("epilogue", "$acc")), {**extras, "acc": ("acc",)})
        a, b = node.inputs[:2]
        prologue = pw_from_expr(parse_expr(attrs["prologue"]), {**extras, "a": ("load", a)})
        flags = (bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b")))
        return ("MatmulPrologue", (("P", prologue), graph[a].shape, ("T", b), *flags, ("P", epilogue)))
    if node.op == "fused_reduce" and only_attrs(node, ("kind", "axes", "keepdim", "in_shape", "prologue", "epilogue")):
        in_shape = tuple(attrs["in_shape"])
        prologue = pw_from_expr(parse_expr(attrs.get("prologue", "$0")), loads)
        epilogue = pw_from_expr(parse_expr(attrs.get("epilogue", "$r")), {"r": ("r",)})
        axes = normalize_axes(attrs["axes"], len(in_shape))
        keepdim = bool(attrs.get("keepdim", False))
        return ("ReduceKernel", (attrs["kind"], axes, keepdim, in_shape, ("P", prologue), ("P", epilogue)))
    return None


def generic_term(node: Node, attrs_id: int) -> TermData:
    if len(node.inputs) > MAX_GENERIC_ARITY:
        raise NotImplementedError(
            f"rewrite: op {node.op!r} has {len(node.inputs)} inputs; the e-graph encoding takes at most "
            f"{MAX_GENERIC_ARITY} (add a constructor Op{len(node.inputs)} in rewrite/schema.py)"
        )
    return (f"Op{len(node.inputs)}", (node.op, attrs_id, *(("T", i) for i in node.inputs)))


def pw_text(tree: PwTree) -> str:
    kind = tree[0]
    if kind == "load":
        return f"(Load {ref(tree[1])})"
    if kind == "lit":
        return f"(Lit {f64(tree[1])})"
    if kind == "acc":
        return "(Acc)"
    if kind == "r":
        return "(R)"
    if kind == "unary":
        return f"(PUnary {string(tree[1])} {pw_text(tree[2])})"
    return f"(PBinary {string(tree[1])} {pw_text(tree[2])} {pw_text(tree[3])})"


def arg_text(arg: Any) -> str:
    if isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "T":
        return ref(arg[1])
    if isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "P":
        return pw_text(arg[1])
    if isinstance(arg, tuple):  # shapes, permutations, axes
        return ints(arg)
    if isinstance(arg, bool):
        return boolean(arg)
    if isinstance(arg, int):
        return str(arg)
    if isinstance(arg, float):
        return f64(arg)
    return string(arg)


def term_text(term: TermData) -> str:
    constructor, args = term
    return f"({constructor}{''.join(' ' + arg_text(arg) for arg in args)})" if args else f"({constructor})"


def canonical_term(term: TermData, canonical: dict[int, int]):
    """The term with children renamed to their canonical (first identical) IR node: a hash-cons key."""

    def pw(tree):
        if tree[0] == "load":
            return ("load", canonical[tree[1]])
        if tree[0] in ("unary", "binary"):
            return (*tree[:2], *(pw(child) for child in tree[2:]))
        return tree

    def arg(a):
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "T":
            return ("T", canonical[a[1]])
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "P":
            return ("P", pw(a[1]))
        return a

    return (term[0], tuple(arg(a) for a in term[1]))


FACT_CONSTRUCTORS = {name: sorts for name, sorts in TERM_CONSTRUCTORS.items() if "Pw" not in sorts and name != "Ref"}
FACT_SORTS = {"Term": "i64", "bool": "i64"}  # how an argument is stored in a fact table


def fact_tables() -> str:
    """The fact tables and the `encode` rules that build terms from them."""
    lines = ["(ruleset encode)", "(relation shape_fact (i64 String))"]
    lines.append('(rule ((shape_fact i s)) ((set (shape (Ref i)) s)) :ruleset encode :name "encode_shape")')
    for name, sorts in FACT_CONSTRUCTORS.items():
        columns = " ".join(FACT_SORTS.get(sort, sort) for sort in ("i64", *sorts))
        lines.append(f"(relation {name}_fact ({columns}))")
        flags = [index for index, sort in enumerate(sorts) if sort == "bool"]
        for variant in range(1 << len(flags)):
            query, args = ["i"], []
            for index, sort in enumerate(sorts):
                if sort == "bool":
                    bit = (variant >> flags.index(index)) & 1
                    query.append(str(bit))
                    args.append(boolean(bool(bit)))
                else:
                    query.append(f"a{index}")
                    args.append(f"(Ref a{index})" if sort == "Term" else f"a{index}")
            lines.append(
                f"(rule (({name}_fact {' '.join(query)})) ((union (Ref i) ({name} {' '.join(args)})))"
                f' :ruleset encode :name "encode_{name}#{variant}")'
            )
    return "\n".join(lines)


def fact_value(arg: Any) -> str:
    """One argument of a term as a fact-table field (tab-separated text, strings unquoted)."""
    if isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "T":
        return str(arg[1])
    if isinstance(arg, tuple):
        return ",".join(str(int(v)) for v in arg)
    if isinstance(arg, bool):
        return "1" if arg else "0"
    if isinstance(arg, float):
        return f64(arg)
    if isinstance(arg, str) and ("\t" in arg or "\n" in arg):
        raise ValueError(f"fact field {arg!r} has a tab or a newline")
    return str(arg)


def new_egraph() -> bindings.EGraph:
    """A fresh egglog e-graph with the schema, the fact tables and every rule declared."""
    from meganeura.rewrite.rules import all_rules, rules_program

    egraph = bindings.EGraph()
    egraph.parse_and_run_program(SCHEMA + "\n" + fact_tables() + "\n" + rules_program(all_rules()))
    return egraph


def encode(graph: Graph) -> Encoding:
    """A fresh e-graph with one tagged e-class (and its shape fact) per encoded IR node."""
    node_ids = encoded_node_ids(graph)
    encoding = Encoding(graph, new_egraph(), node_ids)
    attrs_index: dict[tuple, int] = {}
    canonical: dict[int, int] = {}  # IR node id -> the first IR node with the same term
    seen_terms: dict[TermData, int] = {}
    tables: dict[str, list[str]] = {"shape": []}
    actions = []
    for node_id in node_ids:
        node = graph[node_id]
        term = typed_term(node, graph)
        if term is None:
            if node.attrs not in attrs_index:
                attrs_index[node.attrs] = len(encoding.attrs_table)
                encoding.attrs_table.append(node.attrs)
            term = generic_term(node, attrs_index[node.attrs])
        encoding.terms[node_id] = term
        key = canonical_term(term, canonical)
        canonical[node_id] = seen_terms.setdefault(key, node_id)
        encoding.duplicates += canonical[node_id] != node_id
        constructor, args = term
        if constructor in FACT_CONSTRUCTORS:
            row = "\t".join((str(node_id), *(fact_value(arg) for arg in args)))
            tables.setdefault(constructor, []).append(row)
        else:
            actions.append(f"(union {ref(node_id)} {term_text(term)})")
        tables["shape"].append(f"{node_id}\t{fact_value(tuple(node.shape))}")
    actions.extend(permutation_facts(graph, node_ids))
    with tempfile.TemporaryDirectory(prefix="meganeura-egraph-") as folder:
        program = []
        for name, rows in tables.items():
            if rows:
                path = os.path.join(folder, f"{name}.tsv")
                with open(path, "w") as file:
                    file.write("\n".join(rows) + "\n")
                program.append(f'(input {name}_fact "{path}")')
        if actions:
            program.append(f"(rule () ({' '.join(actions)}) :ruleset encode)")
        program.append("(run encode 1)")
        encoding.egraph.parse_and_run_program("\n".join(program))
    return encoding
