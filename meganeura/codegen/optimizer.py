"""Lowering of the optimizer updates, in place on the parameter or state they replace when
nothing needs its old value afterwards.

- The single-tensor ops (sgd_step, momentum_buffer, adam_moment, adam_step, rms_step,
  rms_buffer, adamax_norm, adamax_step, nadam_step, radam_step, adadelta_delta: `fused=False`)
  are one kernel each (shaders/optimizer.wgsl).
- The fused updates (sgd_update, adam_update, rmsprop_update, adagrad_update, adamax_update,
  nadam_update, radam_update, adadelta_update) and their multi-tensor forms (multi_…, formed
  by passes/multi_tensor.py) share one kernel (shaders/optimizer_update.wgsl): one dispatch
  runs the whole update of every member parameter, each member in a range of workgroups of its
  own, writing a result per value it replaces.
"""

from __future__ import annotations

import math

from meganeura.codegen.common import Operands, alias_root, bindings_wgsl, grid_for, output_binding, shape_text
from meganeura.codegen.kernel import KernelSpec, Value
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.ops.optimizer import MULTI_OF, member_attrs, members_of, replaced_operands, updated_operands


def update_value(graph: Graph, name: str) -> Value | None:
    """(node, result index) that graph.updates records as leaf `name`'s new value: the node
    itself, or the node a `result` projection reads (not through reshapes: a view is no update
    that can be written in place)."""
    node_id = graph.updates.get(name)
    if node_id is None:
        return None
    node = graph[node_id]
    return (node.inputs[0], node.attr("index")) if node.op == "result" else (node.id, 0)


def updates_in_place(graph: Graph, node: Node, position: int = 0, result: int = 0) -> bool:
    """Whether result `result` of `node` may overwrite the buffer of its input at `position`: that
    result must be the leaf's update and no one may need the leaf's old value after it (a reader
    downstream of `node`, an output, another operand of `node`)."""
    target = graph[node.inputs[position]]
    if target.op not in ("param", "state") or update_value(graph, target.attr("name")) != (node.id, result):
        return False
    others = [i for index, i in enumerate(node.inputs) if index != position]
    if any(alias_root(graph, i) == target.id for i in others + list(graph.outputs.values())):
        return False
    users = graph.users()
    readers, stack = set(), [target.id]
    while stack:  # every reader of the leaf's buffer, through reshapes
        for user in users[stack.pop()]:
            if graph[user].op == "reshape":
                stack.append(user)
            elif user != node.id:
                readers.add(user)
    downstream, stack = set(), [node.id]
    while stack:
        for user in users[stack.pop()]:
            if user not in downstream:
                downstream.add(user)
                stack.append(user)
    return not (readers & downstream)


SINGLE_TENSOR = (
    "sgd_step", "momentum_buffer", "adam_moment", "adam_step", "rms_step", "rms_buffer", "adamax_norm", "adamax_step",
    "nadam_step", "radam_step", "adadelta_delta",
)  # fmt: skip


@lowering(*SINGLE_TENSOR)
def lower_optimizer(graph: Graph, node: Node) -> KernelSpec:
    """An elementwise optimizer update, in place on the parameter/state it replaces when allowed."""
    inplace = updates_in_place(graph, node)
    operands = Operands(graph)
    values = {}
    for position, input_id in enumerate(node.inputs):
        if position == 0 and inplace:
            values["V0"] = "out[i]"
        else:
            values[f"V{position}"] = operands.read(input_id, node.shape)
    bindings = operands.bindings + [output_binding(node)]
    flags = {op.upper(): op == node.op for op in SINGLE_TENSOR}
    numel = node.type.numel
    grid = grid_for(-(-numel // 256))
    wgsl = render(
        "optimizer",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "NUMEL": numel,
            "GRID_X": max(grid[0], 1),
            **values,
            **flags,
            "ORDER1": node.attr("order", 1) == 1,
        },
    )
    label = f"{node.op} {shape_text(node.shape)}{' in place' if inplace else ''}"
    return KernelSpec(
        node.id,
        label,
        wgsl,
        "optimizer_update",
        tuple(bindings),
        grid,
        (256, 1, 1),
        inplace_input=node.inputs[0] if inplace else None,
    )


# ---------------------------------------------------------------------------------------------
# The fused updates, of one parameter or many (shaders/optimizer_update.wgsl)

# The template's `Updated` field that holds the new value of each operand a fused update replaces.
GRADIENT = 1  # the gradient's operand position in every fused update
UPDATE_FIELDS = {
    "sgd_update": {0: "p", 6: "buf"},
    "adam_update": {0: "p", 2: "m", 3: "v", 4: "vmax"},
    "rmsprop_update": {0: "p", 2: "s", 3: "a", 4: "buf"},
    "adagrad_update": {0: "p", 2: "s"},
    "adamax_update": {0: "p", 2: "m", 3: "u"},
    "nadam_update": {0: "p", 2: "m", 3: "v"},
    "radam_update": {0: "p", 2: "m", 3: "v"},
    "adadelta_update": {0: "p", 2: "s", 3: "acc"},
}
MEMBER_OP = {multi: op for op, multi in MULTI_OF.items()}
THREADS = 256


def member_op(op: str) -> str:
    """The fused update op of a (multi-tensor) update op."""
    return MEMBER_OP.get(op, op)


def member_sizes(attrs: dict, results: tuple[TensorType, ...]) -> list[int]:
    """The elements of each member's parameter (its first result), in member order."""
    count = attrs.get("members", 1)
    per = len(results) // count
    return [results[k * per].numel for k in range(count)]


def update_workgroups(attrs: dict, operands, results: tuple[TensorType, ...]) -> int:
    """One workgroup of 256 threads per 256 elements of each member."""
    return sum(-(-numel // THREADS) for numel in member_sizes(attrs, results))


def member_search(starts: list[tuple[int, int]], indent: str = "    ") -> str:
    """WGSL statements returning the member of workgroup `w`: a binary search over (member, first
    workgroup) pairs in ascending order, as nested ifs with literal bounds."""
    if len(starts) == 1:
        return f"return {starts[0][0]}u;"
    mid = len(starts) // 2
    inner = indent + "    "
    return (
        f"if (w < {starts[mid][1]}u) {{\n{inner}{member_search(starts[:mid], inner)}\n{indent}}}"
        f" else {{\n{inner}{member_search(starts[mid:], inner)}\n{indent}}}"
    )


def member_case(index: int, first: int, numel: int, reads: list[str], writes: list[tuple[str, str]]) -> str:
    """The switch case that updates member `index`'s elements (workgroups from `first` on)."""
    stores = " ".join(f"{name}[i] = r.{field};" for name, field in writes)
    return (
        f"        case {index}u: {{\n"
        f"            let i = (w - {first}u) * {THREADS}u + lid;\n"
        f"            if (i < {numel}u) {{\n"
        f"                let r = update({', '.join(reads)});\n"
        f"                {stores}\n"
        f"            }}\n"
        f"        }}"
    )


def member_operands(node: Node) -> list[list[int]]:
    """The operands of each member of a fused (one member) or multi-tensor update node."""
    op = member_op(node.op)
    return [list(node.inputs)] if op == node.op else members_of(op, node.attr_dict, list(node.inputs))


def member_reads(operands: Operands, inputs: list[int], shape, replaced: dict[int, str]) -> list[str]:
    """The WGSL arguments of `update` for one member: an operand that the member replaces in
    place is read from its result's binding (`replaced`: operand position → binding name), a
    gradient given as its parts [P, *shape] as their sum, in order (as `sum` over axis 0 adds)."""
    gradient = operands.graph[inputs[GRADIENT]]
    numel, parts = math.prod(shape), len(gradient.shape) == len(shape) + 1

    def read(position: int, value: int) -> str:
        if position in replaced:
            return f"{replaced[position]}[i]"
        if position == GRADIENT and parts:
            terms = [operands.read_at(value, f"{k * numel}u + i" if k else "i") for k in range(gradient.shape[0])]
            return f"({' + '.join(terms)})"
        return operands.read(value, shape)

    return [read(position, value) for position, value in enumerate(inputs)]


@lowering(*UPDATE_FIELDS, *MEMBER_OP, workgroups=update_workgroups)
def lower_update(graph: Graph, node: Node) -> KernelSpec:
    """A fused optimizer update of one parameter, or of many (a multi-tensor node) in one dispatch."""
    op = member_op(node.op)
    attrs = node.attr_dict
    count = attrs.get("members", 1)
    arity = len(member_operands(node)[0])
    positions = replaced_operands(op, member_attrs(attrs), arity)
    fields = [UPDATE_FIELDS[op][position] for position in positions]
    inplace = tuple(
        node.inputs[position] if updates_in_place(graph, node, position, result) else None
        for result, position in enumerate(updated_operands(node))
    )
    if op != node.op and None in inplace:
        raise ValueError(f"%{node.id} {node.op}: a multi-tensor update must replace every value in place")
    operands = Operands(graph)
    sizes = member_sizes({"members": count}, node.types)
    outputs, cases, starts, first = [], [], [], 0
    for k, inputs in enumerate(member_operands(node)):
        names = [f"o{k}_{field}" for field in fields]
        results = range(k * len(fields), (k + 1) * len(fields))
        replaced = {positions[r]: names[r] for r, index in enumerate(results) if inplace[index] is not None}
        reads = member_reads(operands, inputs, node.types[results[0]].shape, replaced)
        outputs += [output_binding(node, name, index) for name, index in zip(names, results, strict=True)]
        cases.append(member_case(k, first, sizes[k], reads, list(zip(names, fields, strict=True))))
        if sizes[k]:
            starts.append((k, first))
        first += -(-sizes[k] // THREADS)
    bindings = operands.bindings + outputs
    grid = grid_for(first)
    wgsl = render(
        "optimizer_update",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "GRID_X": max(grid[0], 1),
            "MEMBER_OF": member_search(starts or [(0, 0)]),
            "CASES": "\n".join(cases),
            **{name.upper(): op == name for name in UPDATE_FIELDS},
            "HAS_MOMENTUM": arity == 7 if op == "sgd_update" else attrs.get("momentum_buffer", False),
            "NESTEROV": attrs.get("nesterov", False),
            "L2": not attrs.get("decoupled_weight_decay", False),
            "AMSGRAD": attrs.get("amsgrad", False),
            "CENTERED": attrs.get("centered", False),
        },
    )
    if op == node.op:
        label = f"{op} {shape_text(node.types[0].shape)}{' in place' if None not in inplace else ''}"
    else:
        label = f"{node.op} of {count} parameters ({sum(sizes):,} elements) in place"
    return KernelSpec(
        node.id,
        label,
        wgsl,
        "optimizer_update",
        tuple(bindings),
        grid,
        (THREADS, 1, 1),
        results=node.results,
        inplace_inputs=inplace,
    )
