"""The buffer plan on real training steps: replaying its schedule, every kernel finds in each buffer
it reads the value it means to read (no buffer reused while a reader, directly or through a view,
still needs its value; an in-place update finds the old value), the outputs and updates are where
the runtime reads and copies them at the end; and on the device, no kernel writes past the end of
a value (canary words after every buffer stay as they were).

The replay is written here from the plan's public parts (schedule, bindings, buffers of values,
end-of-step copies), apart from `codegen/buffers.py`'s own bookkeeping, so that it checks it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen.buffers import BufferPlan
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.compiler import compile_plan
from meganeura.ir.graph import Graph, TensorType
from meganeura.passes import compile_step
from meganeura.runtime import Executable, default_device
from meganeura.target import Target

PLAN_EXAMPLES = 15


def data_of(graph: Graph, node_id: int) -> tuple[int, int]:
    """The value whose data node `node_id` is: through reshapes (views) and result projections."""
    node = graph[node_id]
    while node.op == "reshape":
        node = graph[node.inputs[0]]
    return (node.inputs[0], node.attr("index")) if node.op == "result" else (node.id, 0)


def replay(graph: Graph, plan: BufferPlan) -> list[str]:
    """Run the plan's schedule on names instead of data; every mismatch found."""
    problems = []
    holds: dict[int, tuple[int, int]] = {}  # buffer -> the value in it now
    for node in graph:
        if node.op in ("input", "param", "state", "const") and node.id in plan.node_slot:
            holds[plan.node_slot[node.id]] = (node.id, 0)
    for position, spec in enumerate(plan.schedule):
        for binding in spec.bindings:
            if binding.access == "read":
                slot, wanted = plan.slot(binding), data_of(graph, binding.value)
                if holds.get(slot) != wanted:
                    problems.append(
                        f"kernel {position} (%{spec.node}) reads %{wanted} from #{slot}: it holds {holds.get(slot)}"
                    )
        for value in spec.written:  # each result written in place over the old value it replaces
            if spec.inplace_of(value[1]) is not None:
                slot, wanted = plan.buffer_of[value], data_of(graph, spec.inplace_of(value[1]))
                if holds.get(slot) != wanted:
                    problems.append(
                        f"kernel {position} updates %{wanted} in place in #{slot}: it holds {holds.get(slot)}"
                    )
        for value in spec.written:
            holds[plan.buffer_of[value]] = value
    for name, node_id in graph.outputs.items():
        if holds.get(plan.node_slot[node_id]) != data_of(graph, node_id):
            problems.append(f"output {name}: #{plan.node_slot[node_id]} holds {holds.get(plan.node_slot[node_id])}")
    for copy in plan.copies:  # after the pass, in order
        if holds.get(copy.source) != data_of(graph, copy.value):
            problems.append(f"copy {copy.leaf}: #{copy.source} holds {holds.get(copy.source)}")
        holds[copy.target] = holds.get(copy.source)
    leaves = {**graph.leaves("param"), **graph.leaves("state")}
    for name, node_id in graph.updates.items():
        if holds.get(plan.node_slot[leaves[name].id]) != data_of(graph, node_id):
            problems.append(f"update {name}: its buffer ends holding {holds.get(plan.node_slot[leaves[name].id])}")
    return problems


# ---------------------------------------------------------------------------------------------
# Real training steps, drawn at random


class MLP(nn.Module):
    def __init__(self, widths: list[int], activation) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(widths, widths[1:], strict=False)])
        self.activation = activation

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            x = self.activation(x) if index < len(self.layers) - 1 else x
        return x


class Residual(nn.Module):
    def __init__(self, blocks: int, dim: int, norm: bool) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(blocks)]) if norm else None
        self.layers = nn.ModuleList([nn.Linear(dim, dim) for _ in range(blocks)])

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = x + F.gelu(layer(self.norms[index](x) if self.norms is not None else x))
        return x


class Conv(nn.Module):
    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, channels, 3, stride=stride, padding=1)
        self.norm = nn.BatchNorm2d(channels)
        self.head = nn.Linear(channels, 3)

    def forward(self, x):
        x = F.relu(self.norm(self.conv(x)))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def mse(model, x, y):
    return F.mse_loss(model(x), y)


OPTIMIZERS = {
    "sgd": lambda: optim.SGD(lr=0.1),
    "sgd momentum wd": lambda: optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3),
    "adam wd": lambda: optim.Adam(lr=1e-3, weight_decay=1e-2),
    "adamw": lambda: optim.AdamW(lr=1e-3),
}


@st.composite
def training_steps(draw):
    """(model, loss, input specs, optimizer) of a small training step of a random architecture."""
    kind = draw(st.sampled_from(["mlp", "residual", "conv"]))
    batch = draw(st.integers(1, 6))
    if kind == "mlp":
        widths = draw(st.lists(st.integers(2, 12), min_size=2, max_size=4))
        activation = draw(st.sampled_from([F.relu, F.tanh, F.silu]))
        model, loss = MLP(widths, activation), ce
        spec = {"x": mn.f32[batch, widths[0]], "y": mn.i32[batch]}
    elif kind == "residual":
        dim = draw(st.integers(2, 10))
        model, loss = Residual(draw(st.integers(1, 5)), dim, draw(st.booleans())), mse
        spec = {"x": mn.f32[batch, dim], "y": mn.f32[batch, dim]}
    else:
        model, loss = Conv(draw(st.integers(1, 4)), draw(st.sampled_from([1, 2]))), ce
        spec = {"x": mn.f32[batch, 2, 6, 6], "y": mn.i32[batch]}
    return model, loss, spec, OPTIMIZERS[draw(st.sampled_from(sorted(OPTIMIZERS)))]()


@pytest.mark.parametrize("rewrite", [True, False], ids=["fused", "unfused"])
@settings(max_examples=PLAN_EXAMPLES)
@given(step=training_steps(), units=st.sampled_from([1, 64]))
def test_no_buffer_is_reused_while_its_value_is_still_needed(rewrite, step, units):
    model, loss, spec, optimizer = step
    compiled = compile_plan(model, loss, spec, optimizer, rewrite=rewrite, target=Target("test", units, 31)).compiled
    assert replay(compiled.graph, compiled.plan) == []
    assert len(compiled.plan.buffers) <= len(compiled.plan.value_bytes)


def test_the_replay_sees_a_buffer_reused_too_early():
    # The check itself: a plan whose second kernel's output is moved into the buffer of a value a
    # later kernel still reads is reported.
    model, spec = MLP([4, 6, 3], F.relu), {"x": mn.f32[2, 4], "y": mn.i32[2]}
    compiled = compile_plan(model, ce, spec, optim.SGD(lr=0.1), rewrite=False).compiled
    graph, plan = compiled.graph, compiled.plan
    assert replay(graph, plan) == []
    first, second = plan.schedule[0], plan.schedule[1]
    read_later = {plan.slot(b) for spec in plan.schedule[2:] for b in spec.bindings if b.access == "read"}
    victim = next(plan.buffer_of[v] for v in first.written if plan.buffer_of[v] in read_later)
    plan.buffer_of[second.written[0]] = victim
    assert replay(graph, plan)


# ---------------------------------------------------------------------------------------------
# Canary words on the device


def canary_executable(program: mn.Program, words: int = 64) -> Executable:
    traced = program.traced  # its parameters and module buffers move into the padded buffers
    return Executable(program.compiled, default_device(), traced.parameters, traced.initial_states, canary_words=words)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["mlp", "residual", "conv"])
def test_no_kernel_writes_past_the_end_of_a_value(kind):
    model, loss, spec = {
        "mlp": (MLP([5, 9, 3], F.tanh), ce, {"x": mn.f32[4, 5], "y": mn.i32[4]}),
        "residual": (Residual(3, 7, True), mse, {"x": mn.f32[3, 7], "y": mn.f32[3, 7]}),
        "conv": (Conv(3, 2), ce, {"x": mn.f32[2, 2, 6, 6], "y": mn.i32[2]}),
    }[kind]
    with mn.compiler.explain_only():
        program = mn.compile(model, loss, spec, optim.Adam(lr=1e-2))
    executable = canary_executable(program)
    rng = np.random.default_rng(0)
    feed = {
        name: rng.integers(0, 3, s.shape).astype(np.int32) if s.type.dtype == "i32" else rng.normal(size=s.shape)
        for name, s in spec.items()
    }
    losses = [float(executable.run(feed, read=("loss",))["loss"].reshape(())) for _ in range(2)]
    assert all(np.isfinite(losses))
    assert executable.changed_canaries() == []


@pytest.mark.gpu
def test_canaries_catch_a_kernel_that_writes_one_element_too_far():
    graph = Graph()
    x = graph.add("input", (), TensorType((5,)), {"name": "x", "dtype": "f32"})
    graph.outputs["y"] = y = graph.add("exp", (x,), TensorType((5,)))
    step = compile_step(graph)
    # The exp kernel with its bound off by one: thread 5 writes out[5], one past the end.
    (spec,) = step.kernels
    wrong = spec.wgsl.replace("if (i >= NUMEL)", "if (i > NUMEL)")
    assert wrong != spec.wgsl
    step.plan.schedule[0] = KernelSpec(spec.node, spec.label, wrong, spec.entry_point, spec.bindings, spec.grid,
                                       spec.workgroup_size)  # fmt: skip
    executable = Executable(step, default_device(), {}, {}, canary_words=8)
    executable.run({"x": np.zeros(5, np.float32)}, read=("y",))
    changed = executable.changed_canaries()
    assert len(changed) == 1 and "output y" in changed[0]
    assert y == spec.node and Binding("out", y, "read_write") in spec.bindings
