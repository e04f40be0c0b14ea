"""The target a plan is made for (meganeura/target.py): the workgroups the cost model counts are
those the lowered kernels dispatch (a GPU's matmuls counted in workgroups of the largest tile,
codegen/matmul.py `matmul_workgroups`), the cost of a kernel sees how much of the adapter it fills,
and no fused kernel binds more storage buffers than the target allows."""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest
from conftest import assert_same_results, assert_steps_follow_interpreter, mlp_step

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen.gemm_table import CPU_TABLE, GemmTiling, gemm_tiling
from meganeura.codegen.matmul import counted_workgroups
from meganeura.codegen.registry import dispatch_counted, node_workgroups
from meganeura.compiler import Program, compile_plan, trace_step
from meganeura.ir.graph import TensorType
from meganeura.ir.op import op_def
from meganeura.ir.ops.matmul import matmul_a_view, matmul_dims
from meganeura.passes import compile_step
from meganeura.rewrite import optimize
from meganeura.rewrite.cost import DISPATCH_COST_BYTES, WORK_PER_UNIT, pricing
from meganeura.runtime import default_device
from meganeura.runtime.device import RAISED_LIMITS, Device
from meganeura.target import GENERIC, WEBGPU_WORKGROUP_MEMORY, Target, target_for

EXAMPLES = os.path.join(os.path.dirname(__file__), os.pardir, "examples")


def example(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example_steps():
    """The fused training steps of an MLP, the character LM (attention, rope, rows) and the ResNet
    (convolutions, pools, batch norm), each compiled on the generic target."""
    graph, *_ = mlp_step(batch=64, n_in=96, hidden=200, n_out=10)
    yield "mlp", optimize(graph)[0]
    char_lm = example("char_lm")
    mn.manual_seed(0)
    model = char_lm.CharLlama(40, dim=32, layers=2, heads=4, kv_heads=2)
    spec = {"tokens": mn.i32[4, 16], "targets": mn.i32[64], **char_lm.model_inputs(model, 4, 16)}
    traced = trace_step(model, char_lm.lm_loss, spec, optim.AdamW(lr=1e-3))
    yield "char_lm", optimize(traced.graph)[0]
    resnet = example("resnet_digits")
    traced = trace_step(
        resnet.ResNet(8), resnet.loss_fn, {"x": mn.f32[16, 1, 8, 8], "y": mn.i32[16]}, optim.SGD(lr=0.1)
    )
    yield "resnet", optimize(traced.graph)[0]


def test_every_kernel_dispatches_the_workgroups_the_cost_model_counts():
    seen = set()
    for name, graph in example_steps():
        step = compile_step(graph)  # its graph: the optimizer's updates grouped into multi-tensor nodes
        for spec in step.kernels:
            node = step.graph[spec.node]
            dispatched = math.prod(spec.grid)
            dispatched = dispatch_counted(step.graph, node, dispatched, GENERIC)
            assert dispatched == node_workgroups(step.graph, node), (name, spec.label)
            seen.add(node.op)
    assert {"fused_matmul", "conv_gemm", "fused_reduce", "attention", "pointwise"} <= seen, seen
    assert {"multi_adam_update", "multi_sgd_update"} <= seen, seen


def test_on_a_cpu_matmuls_take_the_cpu_table_and_dispatch_what_the_cost_model_counts():
    cpu = Target("cpu", 2, 32, cpu=True)
    graph = next(graph for name, graph in example_steps() if name == "mlp")  # 64×96 · 96×200 and more
    sizes = []
    step = compile_step(graph, cpu)
    for spec in step.kernels:
        node = step.graph[spec.node]
        assert math.prod(spec.grid) == node_workgroups(step.graph, node, cpu), spec.label
        if node.op in ("matmul", "fused_matmul"):
            a, b = (step.graph[i].type for i in node.inputs[:2])
            batch, m, k, n = matmul_dims([matmul_a_view(a, node.attr_dict), b], node.attr_dict, node.op)
            tiling = gemm_tiling(m, n, k, math.prod(batch), cpu, bool(node.attr("transpose_b", False)))
            assert spec.workgroup_size == (tiling.threads_x, tiling.threads_y, 1), spec.label
            sizes.append(spec.workgroup_size)
    assert len(set(sizes)) > 1  # the shapes pick different tiles
    assert gemm_tiling(1024, 256, 256, 1, cpu) == CPU_TABLE.ladder[0]
    assert gemm_tiling(1024, 256, 256) != CPU_TABLE.ladder[0]  # GPUs keep theirs
    # A CPU takes a rung only where the output holds a whole tile of it: the unfused digits
    # ResNet's batched 8×[16, 36] products take the 4x4 rung (shrunk), not a 16x16 one shrunk to
    # them (seconds of LLVM each on a fresh machine); 96 rows of 64 columns take 64x64 8x8.
    small = gemm_tiling(16, 36, 8, 8, cpu)
    assert (4 * small.rm, 4 * small.rn) == (4, 4) and (small.bm, small.bn) == (16, 64)
    assert gemm_tiling(96, 64, 64, 4, cpu) == CPU_TABLE.ladder[1] == GemmTiling(64, 64, 16, 2, 2)


# ---------------------------------------------------------------------------------------------
# The fill of the adapter


def test_a_kernel_with_few_workgroups_costs_what_it_leaves_idle():
    # A matmul with a long reduction: the product [64, 64] is a couple of workgroups.
    a, b = TensorType((64, 65536)), TensorType((65536, 64))
    out = (TensorType((64, 64)),)
    flops = 2 * 64 * 64 * 65536
    read = a.nbytes + b.nbytes
    one = pricing("matmul", {}, [a, b], out, flops, Target("one unit", 1, 31))
    many = pricing("matmul", {}, [a, b], out, flops, Target("132 units", 132, 31))
    tiling = gemm_tiling(64, 64, 65536)
    dispatched = -(-64 // tiling.bm) * -(-64 // tiling.bn)
    workgroups = counted_workgroups(dispatched, tiling, 64, 64, GENERIC, False)
    assert one.workgroups == many.workgroups == workgroups < 4
    work = 8 * (read + out[0].nbytes) + flops
    assert one.units(read) == work + 8 * DISPATCH_COST_BYTES
    # it needs every unit, it has `workgroups`
    assert many.units(read) == work * 132 // workgroups + 8 * DISPATCH_COST_BYTES
    # A small kernel finishes within its launch: one workgroup is all it needs, on any target.
    small = TensorType((8, 8))
    tiny = [pricing("relu", {}, [small], (small,), 0, Target("t", units, 31)).units(small.nbytes) for units in (1, 132)]
    assert tiny[0] == tiny[1] == 8 * 2 * small.nbytes + 8 * DISPATCH_COST_BYTES
    assert 2 * small.nbytes < WORK_PER_UNIT


H200_LIMITS = {"max-storage-buffers-per-shader-stage": 1_000_000, "max-compute-workgroup-storage-size": 49152}


def test_targets_of_known_adapters(monkeypatch):
    h200 = Target("NVIDIA H200", 132, 1_000_000, tuning="hopper", workgroup_memory=49152)
    assert target_for("NVIDIA H200", "DiscreteGPU", H200_LIMITS) == h200
    monkeypatch.setenv("LP_NUM_THREADS", "3")
    assert target_for("llvmpipe (LLVM 15.0.6, 256 bits)", "CPU", {}).compute_units == 3
    other = target_for("Some GPU", "IntegratedGPU", {})
    assert (other.compute_units, other.max_storage_buffers) == (GENERIC.compute_units, GENERIC.max_storage_buffers)
    with pytest.raises(ValueError, match="storage buffers"):
        Target("broken", 4, 1)


def test_the_target_has_the_workgroup_memory_its_adapter_reports():
    lavapipe = target_for("llvmpipe (LLVM 15.0.6, 256 bits)", "CPU", {"max-compute-workgroup-storage-size": 32768})
    assert lavapipe.workgroup_memory == 32768
    # An adapter that does not say gets what every WebGPU device offers, as does a Target that does not.
    assert target_for("Some GPU", "IntegratedGPU", {}).workgroup_memory == WEBGPU_WORKGROUP_MEMORY == 16384
    assert Target("t", 4, 31).workgroup_memory == WEBGPU_WORKGROUP_MEMORY
    assert GENERIC.workgroup_memory == 32768  # what the generic attention tiles need (target.py)
    with pytest.raises(ValueError, match="16384 bytes of workgroup memory"):
        Target("below WebGPU's floor", 4, 31, workgroup_memory=8192)


class FakeDevice:
    def __init__(self, limits: dict) -> None:
        self.limits = limits
        self.queue = None


class FakeAdapter:
    """An H200 as wgpu describes it, and the limits its device is requested with."""

    info = {"device": "NVIDIA H200", "adapter_type": "DiscreteGPU", "backend_type": "Vulkan"}
    features = frozenset()
    limits = {**H200_LIMITS, "max-buffer-size": 1 << 40, "max-compute-workgroups-per-dimension": 65535}

    def request_device_sync(self, label, required_limits, required_features):
        self.requested = dict(required_limits)
        return FakeDevice({"max-compute-workgroup-storage-size": 16384, **required_limits})


def test_the_device_is_requested_with_the_adapters_workgroup_memory_and_its_target_has_it():
    assert "max-compute-workgroup-storage-size" in RAISED_LIMITS  # else the device gets WebGPU's 16 KiB
    adapter = FakeAdapter()
    device = Device(adapter)
    assert adapter.requested["max-compute-workgroup-storage-size"] == 49152
    assert device.target == Target("NVIDIA H200", 132, 1_000_000, tuning="hopper", workgroup_memory=49152)
    real = default_device()  # the test device gets its adapter's own limit too
    limit = real.adapter.limits["max-compute-workgroup-storage-size"]
    assert real.limits["max-compute-workgroup-storage-size"] == real.target.workgroup_memory == limit


# ---------------------------------------------------------------------------------------------
# The binding limit


class Residual(nn.Module):
    def __init__(self, blocks: int, dim: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(dim) for _ in range(blocks)])
        self.layers = nn.ModuleList([nn.Linear(dim, dim) for _ in range(blocks)])

    def forward(self, x):
        for norm, layer in zip(self.norms, self.layers, strict=True):
            x = x + layer(norm(x))
        return x


def mse(model, x, y):
    return F.mse_loss(model(x), y)


WEBGPU_MINIMUM = 8  # WebGPU's guaranteed maxStorageBuffersPerShaderStage


@pytest.mark.parametrize("limit", [WEBGPU_MINIMUM, 12, 32])
def test_no_fused_kernel_binds_more_buffers_than_the_target_allows(limit):
    # Six residual blocks x + Linear(LayerNorm(x)): recomputing the gradient of the residual stream
    # in the weight gradients' prologues once read 37 tensors in one kernel, over lavapipe's 32.
    spec = {"x": mn.f32[4, 16], "y": mn.f32[4, 16]}
    mn.manual_seed(0)
    model = Residual(6, 16)
    target = Target("test", 16, limit)
    compilation = compile_plan(model, mse, spec, optim.AdamW(lr=1e-3), target=target)
    widest = max(len(spec.bindings) for spec in compilation.compiled.kernels)
    assert widest <= limit
    if limit == 32:
        unbounded = compile_plan(model, mse, spec, optim.AdamW(lr=1e-3), target=Target("wide", 16, 1000))
        assert max(len(s.bindings) for s in unbounded.compiled.kernels) > 32  # the limit is what held it
    traced = compilation.traced
    rng = np.random.default_rng(0)
    inputs = {name: rng.normal(size=s.shape).astype(np.float32) for name, s in spec.items()}
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    assert_same_results(traced.graph, compilation.fused_graph, inputs, params, traced.initial_states, tol=1e-4)


@pytest.mark.parametrize("make", [optim.Adam, optim.AdamW], ids=["adam", "adamw"])
def test_a_target_of_webgpus_minimum_runs_a_fused_adam_step(make):
    # Each fused update binds p, m, v, the gradient and its group's hyper-parameter vector (which
    # holds the step's bias corrections): 5 buffers, so one member per multi-tensor kernel fits
    # in 8, and the step runs.
    spec = {"x": mn.f32[4, 16], "y": mn.f32[4, 16]}
    mn.manual_seed(0)
    model = Residual(2, 16)
    optimizer = make(lr=1e-2, weight_decay=0.1)
    program = Program(compile_plan(model, mse, spec, optimizer, target=Target("minimum", 16, WEBGPU_MINIMUM)))
    kernels = program.compiled.kernels
    assert max(len(k.bindings) for k in kernels) <= WEBGPU_MINIMUM
    assert {program.compiled.graph[k.node].op for k in kernels} >= {"adam_update"}
    rng = np.random.default_rng(0)
    feeds = [{name: rng.normal(size=s.shape).astype(np.float32) for name, s in spec.items()} for _ in range(3)]
    losses = assert_steps_follow_interpreter(program, feeds)
    assert len(set(losses)) == 3


def update_kernels(compilation) -> dict[str, list]:
    """The optimizer's update kernels of a compiled step, by op."""
    graph = compilation.compiled.graph
    kernels: dict[str, list] = {}
    for spec in compilation.compiled.kernels:
        if op_def(graph[spec.node].op).family == "optimizer":
            kernels.setdefault(graph[spec.node].op, []).append(spec)
    return kernels


def test_an_adam_update_binds_its_groups_hyper_parameters_as_one_buffer():
    spec = {"x": mn.f32[4, 16], "y": mn.f32[4, 16]}
    mn.manual_seed(0)
    model = Residual(2, 16)  # 8 parameters: the 2 weights in a group with decay, the 6 others without
    weights = [layer.weight for layer in model.layers]
    others = [p for p in model.parameters() if all(p is not w for w in weights)]

    def grouped():
        return optim.AdamW([{"params": weights}, {"params": others, "weight_decay": 0.0}], lr=1e-3)

    def bound(compilation, kernel) -> list[str]:
        graph = compilation.compiled.graph
        return [graph[b.value].attr("name") for b in kernel.bindings if graph[b.value].op == "state"]

    # One parameter's fused update (a CPU target keeps one per parameter): p, m, v in place, its
    # gradient and its group's vector (the step's bias corrections included), where it bound 10
    # with a leaf per value and the step count.
    alone = compile_plan(model, mse, spec, grouped(), target=Target("cpu", 2, 32, cpu=True))
    fused = update_kernels(alone)["adam_update"]
    assert len(fused) == 8 and {len(k.bindings) for k in fused} == {5}
    assert (
        sorted(name for k in fused for name in bound(alone, k))
        == ["param_groups.0.hyper"] * 2 + ["param_groups.1.hyper"] * 6
    )
    # All 8 in one multi-tensor kernel: 4 bindings a member and one vector per group.
    wide = compile_plan(model, mse, spec, grouped(), target=Target("wide", 16, 1000))
    (multi,) = update_kernels(wide)["multi_adam_update"]
    assert len(multi.bindings) == 8 * 4 + 2
    assert sorted(bound(wide, multi)) == ["param_groups.0.hyper", "param_groups.1.hyper"]
    # fused=False: the step binds m, v, the vector and p; a moment m, g, the vector.
    single = compile_plan(model, mse, spec, optim.AdamW(lr=1e-3, fused=False), target=Target("cpu", 2, 32, cpu=True))
    kernels = update_kernels(single)
    assert {len(k.bindings) for k in kernels["adam_step"]} == {4}
    assert {len(k.bindings) for k in kernels["adam_moment"]} == {3}


def test_a_step_wider_than_its_target_is_refused_before_it_runs():
    spec = {"x": mn.f32[4, 16], "y": mn.f32[4, 16]}
    wide = compile_plan(Residual(6, 16), mse, spec, optim.AdamW(lr=1e-3), target=Target("wide", 16, 1000))
    with pytest.raises(ValueError, match="allows 32 per kernel"):
        compile_step(wide.fused_graph, Target("lavapipe", 2, 32))
