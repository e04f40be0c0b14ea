"""Lowering of the optimizer updates (shaders/optimizer.wgsl), in place on the parameter or state
they replace when nothing needs its old value afterwards."""

from __future__ import annotations

from meganeura.codegen.common import Operands, alias_root, bindings_wgsl, grid_for, output_binding, shape_text
from meganeura.codegen.expressions import literal
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node


def updates_in_place(graph: Graph, node: Node) -> bool:
    """Whether `node` may overwrite its first input's buffer: it must be that leaf's update and
    no one may need the leaf's old value after it (a reader downstream of `node`, an output)."""
    target = graph[node.inputs[0]]
    if target.op not in ("param", "state") or graph.updates.get(target.attr("name")) != node.id:
        return False
    if any(alias_root(graph, i) == target.id for i in list(node.inputs[1:]) + list(graph.outputs.values())):
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


OPTIMIZER_HYPERS = {
    "sgd_step": ("lr", "weight_decay"),
    "momentum_buffer": ("momentum", "weight_decay"),
    "adam_moment": ("beta", "weight_decay"),
    "adam_step": ("lr", "beta1", "beta2", "eps", "weight_decay"),
}


@lowering(*OPTIMIZER_HYPERS)
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
    for position in range(len(node.inputs), 4):  # the parameter of an update without weight decay
        values[f"V{position}"] = "0.0"
    bindings = operands.bindings + [output_binding(node)]
    hypers = {name.upper(): literal(node.attr(name, 0.0)) for name in OPTIMIZER_HYPERS[node.op]}
    flags = {op.upper(): op == node.op for op in OPTIMIZER_HYPERS}
    numel = node.type.numel
    grid = grid_for(-(-numel // 256))
    wgsl = render(
        "optimizer",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "NUMEL": numel,
            "GRID_X": max(grid[0], 1),
            **values,
            **hypers,
            **flags,
            "G_POWER": "g" if node.attr("order", 1) == 1 else "g * g",
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
