"""The saturated e-graph as plain Python data: e-classes of both sorts and their e-nodes.

Read through `EGraph.freeze()` (every constructor's rows with canonical e-class values; about
a millisecond for tens of thousands of rows, where serializing to JSON takes a tenth of a
second). Subsumed rows are left out: they are the nodes a rule replaced (x·1 by x…), and so are the
`Replace` helper nodes of the matmul epilogue rules.

Term and Pw e-classes share one id space of small ints; `is_pw[class]` tells them apart.
`Ref` rows are not e-nodes: they name the e-class of each IR node (`class_of_ir`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from egglog import bindings

from meganeura.rewrite.schema import PW_SORT, REF, TERM_SORT, parse_ints

# How each primitive argument of a constructor is read back into Python (by egglog sort name).
_TEXT_TUPLE_ARGS = {  # constructor -> primitive positions whose String is an int tuple
    "Permute": (0,),
    "Reshape": (0,),
    "Reduce": (1,),
    "Kernel": (0,),
    "ReduceKernel": (1, 3),
    "MatmulPrologue": (0,),
    "Unfold": (0,),
    "Fold": (0,),
    "ConvKernel": (1,),
}


HELPERS = ("Replace",)  # constructors that only drive rules: never part of a plan


class ENode(NamedTuple):
    """One e-node: its constructor, its e-class, child e-classes and primitive arguments, in order."""

    op: str
    eclass: int
    children: tuple[int, ...]
    primitives: tuple


@dataclass
class EGraphView:
    """The e-classes of a saturated e-graph, with their e-nodes, and the IR node of each tag."""

    nodes: dict[int, list[ENode]] = field(default_factory=dict)  # e-class -> e-nodes
    is_pw: list[bool] = field(default_factory=list)
    class_of_ir: dict[int, int] = field(default_factory=dict)  # IR node id -> Term e-class
    by_key: dict[tuple, int] = field(default_factory=dict)  # (op, children, primitives) -> e-class

    @property
    def enode_count(self) -> int:
        return sum(len(nodes) for nodes in self.nodes.values())

    @property
    def eclass_count(self) -> int:
        return len(self.is_pw)

    def find(self, op: str, children: tuple[int, ...], primitives: tuple) -> int | None:
        """The e-class holding the e-node (op, children, primitives), if there is one."""
        return self.by_key.get((op, children, primitives))


def read_egraph(egraph: bindings.EGraph) -> EGraphView:
    """The Term and Pw e-classes of an e-graph (subsumed e-nodes and helper nodes left out)."""
    frozen = egraph.freeze()
    view = EGraphView()
    ids: dict[bindings.Value, int] = {}
    is_pw = view.is_pw
    converters = {
        "bool": egraph.value_to_bool,
        "i64": egraph.value_to_i64,
        "f64": egraph.value_to_f64,
        "String": egraph.value_to_string,
    }
    caches: dict[str, dict] = {sort: {} for sort in converters}

    for name, function in frozen.functions.items():
        output = function.output_sort
        if output not in (TERM_SORT, PW_SORT) or function.is_let_binding or name in HELPERS:
            continue
        out_pw = output == PW_SORT
        # per argument: ("c", is_pw) for an e-class, ("p", converter, cache) for a primitive
        plan = []
        for sort in function.input_sorts:
            if sort in (TERM_SORT, PW_SORT):
                plan.append((True, sort == PW_SORT, None))
            else:
                plan.append((False, converters[sort], caches[sort]))
        tuple_positions = _TEXT_TUPLE_ARGS.get(name, ())
        nodes = view.nodes
        by_key = view.by_key
        for row in function.rows:
            if row.subsumed:
                continue
            value = row.output
            eclass = ids.get(value)
            if eclass is None:
                eclass = ids[value] = len(is_pw)
                is_pw.append(out_pw)
            children: list[int] = []
            primitives: list = []
            for (is_class, kind, cache), arg in zip(plan, row.inputs, strict=True):
                if is_class:
                    child = ids.get(arg)
                    if child is None:
                        child = ids[arg] = len(is_pw)
                        is_pw.append(kind)
                    children.append(child)
                else:
                    converted = cache.get(arg)
                    if converted is None:
                        converted = cache[arg] = kind(arg)
                    primitives.append(converted)
            if name == REF:
                view.class_of_ir[primitives[0]] = eclass
                continue
            for position in tuple_positions:
                primitives[position] = parse_ints(primitives[position])
            key = (name, tuple(children), tuple(primitives))
            nodes.setdefault(eclass, []).append(ENode(name, eclass, key[1], key[2]))
            by_key[key] = eclass
    return view
