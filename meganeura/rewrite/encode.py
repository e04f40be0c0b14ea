"""IR → egglog: one tagged e-class per IR node, written as egglog program text.

Every encoded IR node (the live ones and every input/param/state leaf) becomes one e-class,
`(union (Ref id) TERM)` with TERM's children the tags `(Ref j)` of its inputs, and (for a node
of one result) one fact `(set (shape (Ref id)) "4,5")`. One union per node keeps the encoding
linear in the graph (platform.md, "egglog at scale").

How the terms get into egglog, fast: each IR node becomes one row of the fact table of its
constructor (generated from the op's declaration, `schema.py`: `Matmul_fact`: id, a, b, ta,
tb), written to tab-separated files and loaded with egglog's `input` command; one rule per
constructor (the `encode` ruleset, run once) then builds the terms, `(Matmul_fact i a b 1 0)` →
`(union (Ref i) (Matmul (Ref a) (Ref b) true false))`. For the 8,109 nodes of a 30-layer
transformer step this takes ~0.1 s, where ~8,000 actions in rule bodies took ~0.45 s. The fused
ops already in a graph (an optimized graph optimized again) are written as actions, in their
kernel forms (`kernels.py`).

Equal terms (same op, attributes and input classes) are one e-class by hash-consing: common
subexpressions merge with no rule (`Encoding.duplicates` counts them). `Encoding.terms` keeps each
node's term as data, which extraction uses to find the input graph's own plan among the e-nodes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from egglog import bindings

from meganeura.ir.graph import PERSISTENT, Graph, Node
from meganeura.ir.op import op_def
from meganeura.rewrite.algebra import permutation_facts
from meganeura.rewrite.families import rules_program
from meganeura.rewrite.kernels import encode_fused
from meganeura.rewrite.schema import (
    CONSTRUCTORS,
    FACT_CONSTRUCTORS,
    SCHEMA,
    constructor_of,
    fact_tables,
    provenance_tables,
)
from meganeura.rewrite.sorts import PW, PW_CALLS, TERM, f64, literal, ref, string

# A term as data: (constructor, args) where each arg is ("T", node id) for a Term child, ("P", tree)
# for a Pw child (a PwTree of plan.py over node ids), or a primitive (bool, int, float, str, tuple).
TermData = tuple[str, tuple]


@dataclass
class Encoding:
    """What encoding an IR graph into an e-graph wrote, to map e-classes back to IR nodes."""

    graph: Graph
    encoded_ids: list[int]  # IR node ids that have an e-class, in graph order
    terms: dict[int, TermData] = field(default_factory=dict)  # IR node id -> its own term
    duplicates: int = 0  # IR nodes whose term equals an earlier node's (merged by hash-consing)


def encoded_node_ids(graph: Graph) -> list[int]:
    """The nodes that get an e-class: the live ones and every input/param/state leaf."""
    live = graph.live_ids()
    return [n.id for n in graph.nodes if n.id in live or n.op in PERSISTENT]


def node_term(node: Node, graph: Graph) -> TermData:
    """The term of an IR node: its op's generated constructor, or the kernel form of a fused op."""
    if op_def(node.op).egraph is None:
        return encode_fused(node, graph)
    constructor = constructor_of(node.op, len(node.inputs))
    operands = iter(node.inputs)
    args = []
    for f in constructor.fields:
        if f.kind == "tag":
            args.append(constructor.tag)
        elif f.kind == "operand":
            args.append(("T", next(operands)))
        else:
            args.append(node.attr(f.name))
    return (constructor.name, tuple(args))


def pw_text(tree) -> str:
    kind = tree[0]
    if kind == "load":
        return f"(Load {ref(tree[1])})"
    if kind == "lit":
        return f"(Lit {f64(tree[1])})"
    if kind == "acc":
        return "(Acc)"
    if kind == "r":
        return "(R)"
    args = " ".join(pw_text(child) for child in tree[2:])
    return f"({PW_CALLS[len(tree) - 2]} {string(tree[1])} {args})"


def term_text(term: TermData) -> str:
    """The egglog text of a term (its children as Ref tags)."""
    name, args = term
    parts = []
    for f, arg in zip(CONSTRUCTORS[name].fields, args, strict=True):
        if f.sort == TERM:
            parts.append(ref(arg[1]))
        elif f.sort == PW:
            parts.append(pw_text(arg[1]))
        else:
            parts.append(literal(arg, f.sort, f.is_ints))
    return f"({name}{''.join(' ' + p for p in parts)})"


def canonical_term(term: TermData, canonical: dict[int, int]):
    """The term with children renamed to their canonical (first identical) IR node: a hash-cons key."""

    def pw(tree):
        if tree[0] == "load":
            return ("load", canonical[tree[1]])
        if tree[0] == "call":
            return (*tree[:2], *(pw(child) for child in tree[2:]))
        return tree

    def arg(a):
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "T":
            return ("T", canonical[a[1]])
        if isinstance(a, tuple) and len(a) == 2 and a[0] == "P":
            return ("P", pw(a[1]))
        return a

    return (term[0], tuple(arg(a) for a in term[1]))


def fact_value(arg, f) -> str:
    """One argument of a term as a fact-table field (tab-separated text, strings unquoted)."""
    if f.sort == TERM:
        return str(arg[1])
    if f.is_ints:
        return ",".join(str(int(v)) for v in arg)
    if f.sort == "bool":
        return "1" if arg else "0"
    if f.sort == "f64":
        return f64(arg)
    text = str(arg)
    if "\t" in text or "\n" in text:
        raise ValueError(f"fact field {text!r} has a tab or a newline")
    return text


def declarations() -> str:
    """The egglog program declaring the schema, the fact tables, provenance and every rule."""
    return "\n".join((SCHEMA, fact_tables(), provenance_tables(), rules_program()))


def new_egraph(program: str | None = None) -> bindings.EGraph:
    """A fresh egglog e-graph with `program` (default: `declarations()`) run in it."""
    egraph = bindings.EGraph()
    egraph.parse_and_run_program(declarations() if program is None else program)
    return egraph


_templates: dict[str, bindings.EGraph] = {}  # declared, empty e-graphs by their declarations
_template_lock = threading.Lock()


@contextlib.contextmanager
def empty_egraph() -> Iterator[bindings.EGraph]:
    """An e-graph with everything declared and no terms, for the duration of the `with` block.

    Declaring the schema and the rules costs ~50 ms, which a compilation paid twice (the forward
    recognition pass and the step); pushing the state of a declared e-graph costs ~7 ms. So this
    is a template e-graph kept per text of the declarations (a test may change the rule set), its
    state pushed on entry and popped on exit; while the templates are in use (a nested or
    concurrent compilation) a new e-graph is declared instead."""
    program = declarations()
    if not _template_lock.acquire(blocking=False):
        yield new_egraph(program)
        return
    try:
        egraph = _templates.get(program)
        if egraph is None:
            egraph = _templates[program] = new_egraph(program)
        egraph.parse_and_run_program("(push)")
        try:
            yield egraph
        finally:
            egraph.parse_and_run_program("(pop)")
    finally:
        _template_lock.release()


def encode(graph: Graph, egraph: bindings.EGraph) -> Encoding:
    """`egraph` (declared, with no terms: `empty_egraph`) holding one tagged e-class (and its shape
    fact) per encoded IR node."""
    node_ids = encoded_node_ids(graph)
    encoding = Encoding(graph, node_ids)
    canonical: dict[int, int] = {}  # IR node id -> the first IR node with the same term
    seen_terms: dict[TermData, int] = {}
    tables: dict[str, list[str]] = {"shape": []}
    actions = []
    for node_id in node_ids:
        node = graph[node_id]
        term = node_term(node, graph)
        encoding.terms[node_id] = term
        key = canonical_term(term, canonical)
        canonical[node_id] = seen_terms.setdefault(key, node_id)
        encoding.duplicates += canonical[node_id] != node_id
        name, args = term
        if name in FACT_CONSTRUCTORS:
            fields = FACT_CONSTRUCTORS[name].fields
            row = "\t".join((str(node_id), *(fact_value(arg, f) for arg, f in zip(args, fields, strict=True))))
            tables.setdefault(name, []).append(row)
        else:
            actions.append(f"(union {ref(node_id)} {term_text(term)})")
        if node.results == 1:
            tables["shape"].append(f"{node_id}\t{','.join(str(d) for d in node.shape)}")
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
        egraph.parse_and_run_program("\n".join(program))
    return encoding
