"""Fused and multi-tensor optimizer updates (ir/ops/optimizer.py, passes/multi_tensor.py,
shaders/optimizer_update.wgsl): the same numbers as the single-tensor updates, in the interpreter
and on the GPU, with many parameters of ragged sizes spread over several kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen.common import binding_limit
from meganeura.compiler import compile_plan, trace_step
from meganeura.explain import step_dispatches
from meganeura.ir.interpret import interpret
from meganeura.passes import compile_step
from meganeura.passes.multi_tensor import group_updates, plan_groups
from meganeura.runtime import Executable, default_device
from meganeura.target import Target

# Sizes around the 256-element workgroups: 1, 255, 256, 257 elements and odd shapes between.
WIDTHS = [7, 1, 255, 1, 257, 3, 16, 13, 5]


class Ragged(nn.Module):
    """A chain of Linear layers of ragged widths and an RMS norm: 17 parameters of 1 to 1,285
    elements."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(WIDTHS, WIDTHS[1:], strict=False)])
        self.norm = nn.RMSNorm(257)

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if x.shape[-1] == 257:
                x = self.norm(x)
            if index < len(self.layers) - 1:
                x = F.tanh(x)
        return x


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


SPEC = {"x": mn.f32[6, WIDTHS[0]], "y": mn.i32[6]}
OPTIMIZERS = {
    "adamw": lambda fused: optim.AdamW(lr=1e-2, fused=fused),
    "adam wd": lambda fused: optim.Adam(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1, fused=fused),
    "sgd momentum wd": lambda fused: optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.01, fused=fused),
    "sgd momentum": lambda fused: optim.SGD(lr=0.05, momentum=0.9, fused=fused),
    "sgd": lambda fused: optim.SGD(lr=0.05, fused=fused),
}
# The other forms, in the interpreter here (on the device: tests/test_optim_forms.py).
FORMS = {
    "adamw amsgrad": lambda fused: optim.AdamW(lr=1e-2, amsgrad=True, fused=fused),
    "sgd nesterov wd": lambda fused: optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, fused=fused),
    "sgd dampening": lambda fused: optim.SGD(lr=0.05, momentum=0.9, dampening=0.3, fused=fused),
    "rmsprop": lambda fused: optim.RMSprop(lr=1e-2, fused=fused),
    "rmsprop centered momentum wd": lambda fused: optim.RMSprop(
        lr=1e-2, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.1, fused=fused
    ),
    "adagrad": lambda fused: optim.Adagrad(
        lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1, fused=fused
    ),
    "adamax wd": lambda fused: optim.Adamax(lr=1e-2, weight_decay=0.1, fused=fused),
    "nadam wd": lambda fused: optim.NAdam(lr=1e-2, weight_decay=0.1, fused=fused),
    "nadam decoupled": lambda fused: optim.NAdam(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, fused=fused),
    "radam wd": lambda fused: optim.RAdam(lr=1e-2, betas=(0.9, 0.9), weight_decay=0.1, fused=fused),
    "radam decoupled": lambda fused: optim.RAdam(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, fused=fused),
    "adadelta wd": lambda fused: optim.Adadelta(lr=0.5, weight_decay=0.1, fused=fused),
}


PARAMS = 2 * (len(WIDTHS) - 1) + 1


def members_per_kernel(optimizer: str, limit: int) -> int:
    """Members of a multi-tensor kernel binding at most `limit` buffers: an Adam member binds p, m
    and v (read_write) and its gradient, beside the group's hyper-parameter vector; an SGD member
    with momentum p and buf (read_write) and its gradient, beside the vector (p and its gradient
    without momentum)."""
    if "adam" in optimizer:
        return (limit - 1) // 4
    return (limit - 1) // 3 if "momentum" in optimizer else (limit - 1) // 2


def batch(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(6, WIDTHS[0])).astype(np.float32), "y": rng.integers(0, WIDTHS[-1], 6)}


# The first update the interpreter applies, where it is not 1: RAdam's step is rectified from
# update 6 on (torch's ρₜ > 5), so updates 5 to 7 take both forms.
FIRST_UPDATE = {"radam wd": 5, "radam decoupled": 5}


def interpreted_steps(graph, traced, steps: int, first: int = 1) -> tuple[list[float], dict[str, np.ndarray]]:
    """`steps` steps of `graph` in the interpreter from the traced step's initial values (each with
    its update's hyper-parameter vectors, as Program.write_hypers writes them), the first of them
    update `first`."""
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    states = dict(traced.initial_states)
    losses = []
    for step in range(first, first + steps):
        states |= traced.optimizer.hyper_values(step)
        result = interpret(graph, batch(), params, states)
        losses.append(float(result.outputs["loss"]))
        for name, value in result.updates.items():
            (params if name in params else states)[name] = value
    return losses, {**params, **states}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS | FORMS))
def test_fused_updates_are_the_single_tensor_updates_in_the_interpreter(name):
    traced = {}
    for fused in (False, True):
        mn.manual_seed(1)
        traced[fused] = trace_step(Ragged(), ce, SPEC, (OPTIMIZERS | FORMS)[name](fused))
    first = FIRST_UPDATE.get(name, 1)
    single = interpreted_steps(traced[False].graph, traced[False], 3, first)
    fused = interpreted_steps(traced[True].graph, traced[True], 3, first)
    grouped_graph = group_updates(traced[True].graph, Target("tight", 4, 14))
    grouped = interpreted_steps(grouped_graph, traced[True], 3, first)
    assert any(node.op.startswith("multi_") for node in grouped_graph)
    assert single[0] == fused[0] == grouped[0]
    assert single[1].keys() == fused[1].keys() == grouped[1].keys()
    for key, value in single[1].items():  # the fused ops compose the single-tensor ones: same bits
        np.testing.assert_array_equal(fused[1][key], value, err_msg=key)
        np.testing.assert_array_equal(grouped[1][key], value, err_msg=key)
    moved = [key for key, p in traced[True].parameters.items() if not np.array_equal(p.numpy(), fused[1][key])]
    assert len(moved) == len(traced[True].parameters)  # every parameter was updated


def test_a_cpu_target_keeps_one_fused_kernel_per_parameter():
    mn.manual_seed(0)
    traced = trace_step(Ragged(), ce, SPEC, optim.AdamW(lr=1e-3))
    groups = plan_groups(traced.graph, Target("lavapipe", 2, 32, cpu=True))
    assert [len(g.members) for g in groups] == [1] * PARAMS
    assert group_updates(traced.graph, Target("lavapipe", 2, 32, cpu=True)) is traced.graph


def test_updates_are_grouped_within_the_binding_limit():
    mn.manual_seed(0)
    traced = trace_step(Ragged(), ce, SPEC, optim.AdamW(lr=1e-3))
    updates = [n for n in traced.graph if n.op == "adam_update"]
    assert len(updates) == PARAMS
    for limit in (10, 14, 31):
        target = Target("limited", 4, limit)
        groups = plan_groups(traced.graph, target)
        assert [m for g in groups for m in g.members] == [n.id for n in updates]  # each once, in order
        assert all(g.bindings <= binding_limit(target) for g in groups)
        # Each member binds p, m, v (read_write) and its gradient; the group's vector is shared.
        assert len(groups) == math.ceil(PARAMS / members_per_kernel("adamw", limit))
        step = compile_step(traced.graph, target)
        assert max(len(spec.bindings) for spec in step.kernels) <= limit
        multi = [spec for spec in step.kernels if step.graph[spec.node].op == "multi_adam_update"]
        assert len(multi) == sum(1 for g in groups if len(g.members) > 1)
        assert [c.leaf for c in step.plan.copies] == ["step"]  # every other update in place


def test_an_update_that_cannot_run_in_place_stays_out_of_the_groups():
    mn.manual_seed(0)
    traced = trace_step(Ragged(), ce, SPEC, optim.Adam(lr=1e-2))
    graph = traced.graph
    kept = graph.leaves("param")["layers.1.weight"].id
    graph.outputs["old weight"] = kept  # its old value is read after the step: not in place
    groups = plan_groups(graph, Target("wide", 4, 1000))
    members = [graph[m].inputs[0] for g in groups for m in g.members]
    assert kept not in members and len(members) == PARAMS - 1
    step = compile_step(graph, Target("wide", 4, 1000))
    kept = step.graph.leaves("param")["layers.1.weight"].id  # the grouped graph is renumbered
    (alone,) = [s for s in step.kernels if step.graph[s.node].op == "adam_update"]
    assert step.graph[alone.node].inputs[0] == kept
    assert alone.inplace_inputs[0] is None and None not in alone.inplace_inputs[1:]
    assert sorted(c.leaf for c in step.plan.copies) == ["layers.1.weight", "step"]


def run_steps(compiled, traced, steps: int, read=("loss",)) -> tuple[list[float], dict[str, np.ndarray]]:
    """`steps` steps of a compiled step on the test device; the losses and every parameter and state."""
    executable = Executable(compiled, default_device(), traced.parameters, traced.initial_states)
    losses = [float(executable.run(batch(), read=read)["loss"].reshape(())) for _ in range(steps)]
    return losses, {name: executable.read_state(name) for name in executable.states}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_five_steps_of_multi_tensor_updates_match_the_per_parameter_kernels(name):
    # The multi-tensor kernels are planned for a GPU (a CPU target keeps one kernel per parameter,
    # passes/multi_tensor.py) binding what this device binds (lavapipe 32: an Adam member takes
    # 4, so 17 parameters need 3 kernels), and for a GPU binding 9 buffers (9 kernels); all run
    # here, on the test device.
    device = default_device().target
    limit = device.max_storage_buffers
    runs = {}
    gpu = Target("a GPU", 4, limit)
    for label, fused, target in (
        ("per parameter", False, device),
        ("fused, on this device", True, device),
        ("per parameter, for a GPU", False, gpu),
        ("multi-tensor", True, gpu),
        ("multi-tensor, 14 buffers", True, Target("a GPU", 4, 14)),
    ):
        mn.manual_seed(2)
        compilation = compile_plan(Ragged(), ce, SPEC, OPTIMIZERS[name](fused), target=target)
        counts = step_dispatches(compilation.compiled)
        runs[label] = (*run_steps(compilation.compiled, compilation.traced, 5), counts)
    reference, expected, single = runs["per parameter"]
    assert np.isfinite(reference).all() and reference[-1] != reference[0]
    # To an ulp: the fused updates add a gradient given as parts (a split product's, a two-level
    # column sum's) as they read it (passes/update_parts.py updates_reading_parts), in another order
    # than the sum kernel the single-tensor updates read; and a GPU's compiler may contract the
    # two forms' arithmetic into FMAs differently (the H200 differed by 1 ulp in some elements
    # after 5 SGD-momentum steps).
    rtol = 2e-6
    # Each against the per-parameter step planned for the same kind of target: a GPU's plan may
    # reduce in another order than a CPU's (codegen/reduce.py reduce_rows), which moves the losses by an ulp.
    for label, base in (
        ("fused, on this device", "per parameter"),
        ("multi-tensor", "per parameter, for a GPU"),
        ("multi-tensor, 14 buffers", "per parameter, for a GPU"),
    ):
        reference, expected, _ = runs[base]
        losses, values, counts = runs[label]
        np.testing.assert_allclose(losses, reference, rtol=rtol, atol=0, err_msg=label)
        for key, value in expected.items():
            np.testing.assert_allclose(values[key], value, rtol=rtol, atol=rtol * 1e-2, err_msg=f"{label}: {key}")
        if name != "sgd":  # plain SGD's single-tensor update has a single kernel too
            assert counts.optimizer < single.optimizer, (label, counts, single)
    assert (runs["fused, on this device"][2].multi_tensor == 0) == device.cpu
    if name != "sgd":  # plain SGD's update may join the gradient's matmul instead
        assert runs["multi-tensor"][2].optimizer == math.ceil(PARAMS / members_per_kernel(name, limit))
        assert runs["multi-tensor, 14 buffers"][2].optimizer == math.ceil(PARAMS / members_per_kernel(name, 14))
    assert runs["multi-tensor"][2].optimizer < single.optimizer


def test_multi_tensor_updates_follow_the_interpreter_in_float64():
    mn.manual_seed(4)
    compilation = compile_plan(Ragged(), ce, SPEC, optim.AdamW(lr=1e-2), target=Target("tight", 4, 13))
    graph, traced = compilation.compiled.graph, compilation.traced
    expected_losses, expected = interpreted_steps(compilation.fused_graph, traced, 1)
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    result = interpret(graph, batch(), params, dict(traced.initial_states), dtype=np.float64)
    losses, values = run_steps(compilation.compiled, traced, 1)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for key, value in result.updates.items():
        np.testing.assert_allclose(values[key], value, rtol=1e-4, atol=1e-6, err_msg=key)


def test_the_report_counts_the_dispatches_of_a_step():
    mn.manual_seed(0)
    with mn.compiler.explain_only():
        program = mn.compile(Ragged(), ce, SPEC, optim.AdamW(lr=1e-3))
        single = mn.compile(Ragged(), ce, SPEC, optim.AdamW(lr=1e-3, fused=False))
    report, before = program.report(), single.report()
    counts = report.step_dispatches
    assert counts.total == report.dispatches == len(program.compiled.kernels)
    # 17 parameters on the generic target (31 buffers): 7 Adam members per kernel, 3 kernels.
    assert (counts.optimizer, counts.multi_tensor, counts.parameters) == (3, 3, PARAMS)
    assert before.step_dispatches.optimizer == 3 * PARAMS and before.step_dispatches.multi_tensor == 0
    # and the sums of its gradients' parts that the fused updates read themselves (7 here)
    absorbed = len(parts_readers(program.compiled.graph))
    assert absorbed == 7 and counts.total == before.step_dispatches.total - 3 * PARAMS + 3 - absorbed
    assert f"Dispatches: {counts}" in str(report) and str(counts) in report.summary()
    wanted = {"total": counts.total, "optimizer": 3, "multi_tensor": 3, "parameters": PARAMS}
    wanted |= {"split_products": 0, "splitting": 0}  # no tensor cores on the generic target
    assert report.to_json()["dispatches"] == wanted


class Wide(nn.Module):
    """Linear, LayerNorm, GELU, Linear over 2,048 rows: on a GPU of 4 units the biases' and the
    norm's gradients are column sums in two levels, partial rows then their sum."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(24, 40), nn.LayerNorm(40), nn.Linear(40, 7)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


def parts_readers(graph) -> list[str]:
    """The update members (by parameter shape) that read their gradient as parts [P, *shape]."""
    from meganeura.codegen.optimizer import member_operands

    found = []
    for node in graph:
        if node.op.endswith(("adam_update", "sgd_update")):
            for operands in member_operands(node):
                p, g = graph[operands[0]], graph[operands[1]]
                if len(g.shape) == len(p.shape) + 1:
                    found.append(f"{list(g.shape)} for {list(p.shape)}")
    return found


@pytest.mark.parametrize("name", ["adamw", "sgd momentum wd"])
def test_updates_read_their_gradients_parts_instead_of_a_sum_kernel(monkeypatch, name):
    """passes/update_parts.py `updates_reading_parts`: an update whose gradient is the sum over the
    first axis of partial rows reads the rows and adds them, and the sum's kernel goes; three
    steps on the test device match the same plan with the sums kept, and the step follows the
    interpreter of the graph before the pass in float64."""
    from meganeura import passes

    spec = {"x": mn.f32[2048, 24], "y": mn.i32[2048]}
    rng = np.random.default_rng(3)
    feed = {"x": rng.normal(size=(2048, 24)).astype(np.float32), "y": rng.integers(0, 7, 2048)}
    monkeypatch.setattr("test_multi_tensor.batch", lambda seed=0: feed)
    gpu = Target("a GPU", 4, 31)
    runs = {}
    for label in ("parts", "sums"):
        if label == "sums":
            kept = tuple(step for step in passes.PASSES if step.name != "updates_reading_parts")
            monkeypatch.setattr(passes, "PASSES", kept)
        mn.manual_seed(5)
        compilation = compile_plan(Wide(), ce, spec, OPTIMIZERS[name](True), target=gpu)
        runs[label] = (compilation, *run_steps(compilation.compiled, compilation.traced, 3))
    parts, sums = runs["parts"][0].compiled, runs["sums"][0].compiled
    assert len(parts_readers(parts.graph)) >= 4 and parts_readers(sums.graph) == []
    removed = len(sums.kernels) - len(parts.kernels)
    assert removed == len(parts_readers(parts.graph)), (removed, parts_readers(parts.graph))
    np.testing.assert_allclose(runs["parts"][1], runs["sums"][1], rtol=1e-6)
    for key, value in runs["sums"][2].items():
        np.testing.assert_allclose(runs["parts"][2][key], value, rtol=1e-5, atol=1e-7, err_msg=key)
    mn.manual_seed(5)
    fresh = compile_plan(Wide(), ce, spec, OPTIMIZERS[name](True), target=gpu)
    params = {key: p.numpy() for key, p in fresh.traced.parameters.items()}
    args = (feed, params, dict(fresh.traced.initial_states))
    expected = interpret(fresh.fused_graph, *args, dtype=np.float64)
    actual = interpret(fresh.compiled.graph, *args, dtype=np.float64)
    for key, value in expected.updates.items():
        np.testing.assert_allclose(actual.updates[key], value, rtol=1e-9, atol=1e-12, err_msg=key)
