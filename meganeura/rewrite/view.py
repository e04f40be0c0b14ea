"""The saturated e-graph as plain Python data: e-classes of both sorts, their e-nodes, provenance.

Read through `EGraph.freeze()` (every constructor's rows with canonical e-class values; about
a millisecond for tens of thousands of rows, where serializing to JSON takes a tenth of a
second). Subsumed rows are left out: they are the nodes a rule replaced (x·1 by x…), and so are the
helper nodes of the rules (`sorts.HELPERS`). Each constructor's fields are read back by the
schema (`schema.py`): e-classes for Term and Pw fields, values for the others, integer tuples
parsed from their text.

Term and Pw e-classes share one id space of small ints; `is_pw[class]` tells them apart.
`Ref` rows are not e-nodes: they name the e-class of each IR node (`class_of_ir`). The
provenance relations (`made_C`, `merged_C`, filled by the rules' actions) become, per e-node key,
the rules that created it and the rules that merged it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from egglog import bindings

from meganeura.rewrite.schema import CONSTRUCTORS
from meganeura.rewrite.sorts import HELPERS, PW, REF, TERM, ENode, parse_ints


@dataclass
class EGraphView:
    """The e-classes of a saturated e-graph, with their e-nodes, and the IR node of each tag."""

    nodes: dict[int, list[ENode]] = field(default_factory=dict)  # e-class -> e-nodes
    is_pw: list[bool] = field(default_factory=list)
    class_of_ir: dict[int, int] = field(default_factory=dict)  # IR node id -> Term e-class
    by_key: dict[tuple, int] = field(default_factory=dict)  # (op, children, primitives) -> e-class
    made: dict[tuple, set[str]] = field(default_factory=dict)  # e-node key -> rules that created it
    merged: dict[tuple, set[str]] = field(default_factory=dict)  # e-node key -> rules that merged it
    subsumed: dict[tuple, int] = field(default_factory=dict)  # key of a subsumed e-node -> its e-class

    @property
    def enode_count(self) -> int:
        return sum(len(nodes) for nodes in self.nodes.values())

    @property
    def eclass_count(self) -> int:
        return len(self.is_pw)

    def find(self, op: str, children: tuple[int, ...], primitives: tuple) -> int | None:
        """The e-class holding the e-node (op, children, primitives), if there is one."""
        return self.by_key.get((op, children, primitives))


class RowReader:
    """Turns the rows of one constructor (or of its provenance relations) into e-node keys."""

    def __init__(self, egraph: bindings.EGraph, view: EGraphView, ids: dict) -> None:
        self.view, self.ids = view, ids
        self.converters = {
            "bool": egraph.value_to_bool,
            "i64": egraph.value_to_i64,
            "f64": egraph.value_to_f64,
            "String": egraph.value_to_string,
        }
        self.caches: dict[str, dict] = {sort: {} for sort in self.converters}

    def eclass(self, value, is_pw: bool, new: bool = True) -> int:
        found = self.ids.get(value)
        if found is None:
            if not new:
                return -1  # an e-class no kept e-node is in (a provenance row of a subsumed node)
            found = self.ids[value] = len(self.view.is_pw)
            self.view.is_pw.append(is_pw)
        return found

    def key(self, name: str, values, new: bool = True) -> tuple[str, tuple[int, ...], tuple]:
        children: list[int] = []
        primitives: list = []
        for f, value in zip(CONSTRUCTORS[name].fields, values, strict=True):
            if f.sort in (TERM, PW):
                children.append(self.eclass(value, f.sort == PW, new))
                continue
            cache = self.caches[f.sort]
            converted = cache.get(value)
            if converted is None:
                converted = cache[value] = self.converters[f.sort](value)
            primitives.append(parse_ints(converted) if f.is_ints else converted)
        return (name, tuple(children), tuple(primitives))


def read_egraph(egraph: bindings.EGraph) -> EGraphView:
    """The Term and Pw e-classes of an e-graph (subsumed and helper e-nodes left out) and provenance."""
    frozen = egraph.freeze()
    view = EGraphView()
    reader = RowReader(egraph, view, {})
    provenance = []
    for name, function in frozen.functions.items():
        for prefix, table in (("made_", view.made), ("merged_", view.merged)):
            if name.startswith(prefix) and name[len(prefix) :] in CONSTRUCTORS:
                provenance.append((name[len(prefix) :], table, function))
        if name not in CONSTRUCTORS or name in HELPERS or function.is_let_binding:
            continue
        out_pw = function.output_sort == PW
        for row in function.rows:
            if row.subsumed:
                if name != REF:
                    view.subsumed[reader.key(name, row.inputs)] = reader.eclass(row.output, out_pw)
                continue
            eclass = reader.eclass(row.output, out_pw)
            key = reader.key(name, row.inputs)
            if name == REF:
                view.class_of_ir[key[2][0]] = eclass
                continue
            view.nodes.setdefault(eclass, []).append(ENode(name, eclass, key[1], key[2]))
            view.by_key[key] = eclass
    for constructor, table, function in provenance:
        for row in function.rows:
            rule = egraph.value_to_string(row.inputs[-1])
            table.setdefault(reader.key(constructor, row.inputs[:-1], new=False), set()).add(rule)
    return view
