"""The Plan → a new IR Graph.

Each materialised e-class becomes one IR node, in rank order (a topological order that follows
the original graph). An e-node of an op's own constructor reads back as that op, its attributes
from the e-node's fields (`schema.op_of`); a kernel form decodes as `kernels.DECODERS` says:
- `Kernel` → `pointwise(inputs…, expr=…, shape=…)`, `$i` numbering the distinct tensors the
  expanded body loads in first-use order; a body that is one elementwise op over loads only goes
  back to that primitive op (`add %3 %4` reads better than `pointwise … {expr=add($0,$1)}`), a
  body that computes what the e-class's own IR node computes, reading the same tensors, goes
  back to that node's op (adam_moment, sgd_step: the runtime updates those in place), and a
  body that is a single load to `broadcast_to`;
- `MatmulKernel` → `matmul` when the epilogue is `$acc`, else `fused_matmul`; `MatmulPrologue`
  → `fused_matmul` with a prologue (A itself: a plain matmul); `ReduceKernel` → `sum`/`max`
  when the prologue is a plain load and the epilogue `$r`, else `fused_reduce`; `ReduceSplit` →
  `fused_reduce` with `splits` (the partials of a two-level reduction); `MatmulSplit` →
  `fused_matmul` with `splits` (the partials of a split-K product); `ConvKernel` → `conv_gemm`.
Every node's type is re-inferred with the op table and must equal its e-class's type (a rule that
broke this would be unsound: decoding fails loudly).

Outputs and updates are remapped by e-class; every input/param/state leaf is kept. A node's
`sources` are the user source lines of every original IR node it covers: the nodes of its own
e-class, plus the nodes the plan no longer materialises whose values flowed into it (the matmul
and the add folded into a fused matmul, the chain inlined into a pointwise kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meganeura.ir.graph import PERSISTENT, Graph, as_types
from meganeura.ir.op import checked_type, op_def, operand_types
from meganeura.rewrite.kernels import DECODERS, tree_loads
from meganeura.rewrite.plan import Plan, PlanEntry
from meganeura.rewrite.schema import CONSTRUCTORS, op_of


def single_op(tree) -> bool:
    """Whether a body is one elementwise call whose operands are all loads."""
    return tree[0] == "call" and all(child[0] == "load" for child in tree[2:])


def original_op(entry: PlanEntry, plan: Plan):
    """The e-class's own IR node when the kernel fused nothing into it: it reads the same tensors
    (and scalar constants, which cost nothing to read: kept by the plan, or, for an optimizer
    update, inlined as literals, which `decode` then gives back their `const` node — AdamW's
    constant-0 operands of adam_moment; other ops keep their literal in a pointwise kernel).
    Its op (adam_moment, sgd_step, sub…) reads better than a pointwise expression, and the runtime
    updates optimizer ops in place."""
    (tree,) = entry.bodies
    loads = set(tree_loads(tree))
    graph = plan.source
    for node_id in plan.ir_ids[entry.eclass]:
        node = graph[node_id]
        if node.op in ("pointwise", "broadcast_to") or not op_def(node.op).kernel:
            continue
        inputs = [plan.class_of_ir[i] for i in node.inputs]
        extra = set(inputs) - loads
        inlined_ok = op_def(node.op).family == "optimizer"  # its in-place update is worth a const node
        constants = all(
            (c in plan.entries and is_constant(plan, c)) or (inlined_ok and constant_node(plan, c) is not None)
            for c in extra
        )
        if loads <= set(inputs) and constants:
            return node.op, inputs, node.attr_dict
    return None


def is_constant(plan: Plan, eclass: int) -> bool:
    node = plan.entries[eclass].node
    return node.op == "Const" or (
        node.op == "Reshape" and node.children[0] in plan.entries and is_constant(plan, node.children[0])
    )


def constant_node(plan: Plan, eclass: int):
    """The source graph's scalar `const` node in an e-class the plan does not materialise (every
    kernel reads it as a literal), or None."""
    if eclass in plan.entries:
        return None
    for node_id in plan.ir_ids.get(eclass, ()):
        node = plan.source[node_id]
        if node.op == "const":
            return node
    return None


def ir_node(entry: PlanEntry, plan: Plan) -> tuple[str, list[int], dict[str, Any]]:
    """(op, input e-classes, attributes) of the IR node computing one materialised e-class."""
    node = entry.node
    constructor = CONSTRUCTORS[node.op]
    decoder = DECODERS.get(node.op)
    if decoder is None:
        attrs = {f.name: value for f, value in zip(constructor.primitives, node.primitives, strict=True)}
        attrs.pop("op", None)  # the tag of a shared constructor names the op
        return op_of(node.op, node.primitives), list(node.children), attrs
    if node.op == "Kernel":
        original = original_op(entry, plan)
        if original is not None:
            return original
        (tree,) = entry.bodies
        if single_op(tree):
            candidate = (tree[1], [child[1] for child in tree[2:]], {})
            try:
                _, candidate_type = checked_type(candidate[0], [plan.type(c) for c in candidate[1]], {})
            except ValueError:
                candidate_type = None
            if candidate_type == plan.type(entry.eclass):
                return candidate
    return decoder(entry, plan)


def covered_nodes(plan: Plan) -> dict[int, list[int]]:
    """For each kept e-class, the original IR nodes it computes (its own, and those absorbed into it)."""
    users = plan.source.users()
    kept = plan.entries
    covered: dict[int, list[int]] = {eclass: [] for eclass in kept}
    for node_id in plan.class_of_ir:
        for eclass in absorbing_classes(node_id, users, plan.class_of_ir, kept):
            covered[eclass].append(node_id)
    for eclass in reversed(kept):  # an e-class no IR node is in covers what the kernels reading it cover
        if eclass not in plan.ir_ids:
            readers = [c for c, entry in kept.items() if eclass in entry.reads]
            covered[eclass] = sorted({i for c in readers for i in covered[c]})
    return covered


def absorbing_classes(node_id: int, users: dict[int, list[int]], class_of_ir, kept):
    """The kept e-classes that compute IR node `node_id`: its own, or else the nearest kept users'."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [node_id]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        eclass = class_of_ir.get(current)
        if eclass in kept:
            found.add(eclass)
        elif eclass is not None:
            stack.extend(users[current])
    return found


@dataclass
class Decoded:
    """The rewritten graph, the IR node of each materialised e-class, and what each covers."""

    graph: Graph
    node_of_class: dict[int, int]
    covered: dict[int, list[int]]  # e-class -> original IR node ids it computes


def decode(plan: Plan) -> Decoded:
    """The IR graph of a plan (which covers the outputs, updates and leaves)."""
    graph = plan.source
    covered = covered_nodes(plan)
    result = Graph()
    new_id: dict[int, int] = {}
    for eclass, entry in plan.entries.items():
        op, inputs, attrs = ir_node(entry, plan)
        for c in inputs:  # a constant the plan inlined everywhere, read by an op decoded back (original_op)
            if c not in new_id:
                const = constant_node(plan, c)
                new_id[c] = result.add(const.op, [], const.type, const.attr_dict, const.sources)
        expected = plan.types[eclass]
        if op in PERSISTENT:
            value_type, canonical = expected, op_def(op).canonical_attrs(attrs)
        else:
            canonical, value_type = checked_type(op, operand_types(result, [new_id[c] for c in inputs]), attrs)
            value_type = as_types(value_type)
            if value_type != expected:
                raise RuntimeError(
                    f"decode: {op} gives {value_type} where the e-class holds {expected} (a rule is unsound)"
                )
        sources = dict.fromkeys(line for i in sorted(covered[eclass]) for line in graph[i].sources)
        new_id[eclass] = result.add(op, [new_id[c] for c in inputs], value_type, canonical, tuple(sources))
    class_of_ir = plan.class_of_ir
    result.outputs = {name: new_id[class_of_ir[i]] for name, i in graph.outputs.items()}
    result.updates = {name: new_id[class_of_ir[i]] for name, i in graph.updates.items()}
    return Decoded(result, new_id, covered)
