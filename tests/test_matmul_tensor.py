"""The split-f16 product on the tensor cores (codegen/matmul_tensor.py) against the interpreter in
float64: every transpose, ragged and whole-tile shapes, batches, split-K partials, prologues and
epilogues, operands spread over many binades, zeros, and each tile of the ladder. Its error is
measured against |A|·|B| (the scale of a float32 product's own rounding), bounded at 2e-5: the
method's is about 2^-22 per operand plus the tensor cores' f32 accumulation.

These run only where the device offers f16 subgroup matrices: Dawn (`MEGANEURA_BACKEND=dawn`)
with `MEGANEURA_TENSOR_CORES=1` on a GPU that has them (the H200: `run` on the lent machine).
Every kernel of the bench's steps planned with tensor cores also goes through Tint on Dawn's Null
adapter here (test_every_tensor_core_kernel_of_the_bench_steps_compiles_through_tint)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import normal, one_op, run_gpu

from meganeura.bench.workloads import STEPS
from meganeura.codegen import matmul_halves, matmul_tensor
from meganeura.codegen.matmul import matmul_workgroups
from meganeura.codegen.matmul_tensor import LADDER, TensorTiling, tensor_tiling
from meganeura.codegen.registry import dispatch_counted, node_workgroups
from meganeura.compiler import compile_plan
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.runtime import default_device
from meganeura.target import WEBGPU_WORKGROUP_MEMORY, Target

H200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152, tensor_cores=True)
BOUND = 2e-5  # of |A|·|B|


def has_tensor_cores() -> bool:
    try:
        return default_device().tensor_cores
    except RuntimeError:
        return False


needs_tensor_cores = pytest.mark.skipif(
    not has_tensor_cores(),
    reason="the device offers no f16 subgroup matrices (MEGANEURA_BACKEND=dawn, "
    "MEGANEURA_TENSOR_CORES=1 on a GPU with them)",
)


@pytest.fixture(autouse=True)
def in_kernel_split(monkeypatch):
    """These tests check the kernel that splits its operands itself, which the tensor cores' opt-in
    leaves off (`tensor_takes`): every product here goes to it, none to the split operands of
    codegen/matmul_halves.py (tests/test_matmul_halves.py checks those)."""
    monkeypatch.setattr(matmul_halves, "halves_take", lambda m, k, n: False)
    monkeypatch.setattr(matmul_tensor, "tensor_takes", lambda m, n, k, batches: True)


def operand_shapes(m, k, n, transpose_a, transpose_b, batch=()):
    return [(*batch, *((k, m) if transpose_a else (m, k))), (*batch, *((n, k) if transpose_b else (k, n)))]


def product_error(graph, inputs, a_abs, b_abs, transpose_a, transpose_b) -> tuple[float, object]:
    """The largest |ours − exact| / (|A|·|B|) over the output, and the executable."""
    executable = run_gpu(graph, inputs, target=H200)
    assert any(kernel.entry_point == "matmul_tensor" for kernel in executable.kernels)
    got = executable.run(inputs, read=("out",))["out"]
    exact = interpret(graph, inputs, dtype=np.float64).outputs["out"]
    a = np.swapaxes(a_abs, -1, -2) if transpose_a else a_abs
    b = np.swapaxes(b_abs, -1, -2) if transpose_b else b_abs
    scale = np.maximum(np.matmul(a.astype(np.float64), b.astype(np.float64)), 1e-30)
    if got.ndim > scale.ndim:  # split-K partials: compare their sum
        got, exact = got.sum(0), exact.sum(0)
    return float(np.max(np.abs(got - exact) / scale)), executable


SHAPES = [(1, 1, 1), (7, 33, 65), (65, 130, 7), (130, 7, 33), (36, 20, 44), (128, 64, 128), (200, 300, 136)]
TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]


@needs_tensor_cores
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=str)
@pytest.mark.parametrize("mkn", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_product_is_within_its_bound_of_the_exact_one(mkn, transposes):
    shapes = operand_shapes(*mkn, *transposes)
    graph = one_op("matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1])
    inputs = {"x0": normal(*shapes[0]), "x1": normal(*shapes[1])}
    error, _ = product_error(graph, inputs, np.abs(inputs["x0"]), np.abs(inputs["x1"]), *transposes)
    assert error < BOUND


def spread(rng, shape, axis, low=-30, high=10):
    """N(0, 1) times powers of two over [2^low, 2^high] along `axis`: rows of gradients and rows
    of activations, whose magnitudes a fixed f16 scale could not all hold."""
    x = rng.standard_normal(shape)
    along = [1] * len(shape)
    along[axis] = shape[axis]
    return (x * 2.0 ** rng.uniform(low, high, along)).astype(np.float32)


@needs_tensor_cores
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=str)
def test_operands_over_forty_binades_keep_their_bound(transposes):
    """K tiles whose largest |x| grows along K (the running scale lowered mid-product, the
    accumulators with it), rows far below their tile's largest, and exact zeros."""
    rng = np.random.default_rng(1)
    m, k, n = 70, 200, 66
    a = spread(rng, (m, k), 1)  # magnitudes vary along K: each K tile has its own largest
    b = spread(rng, (k, n), 0, -12, 4)
    a[3] = 0.0
    b[:, 5] = 0.0
    a_stored, b_stored = (a.T.copy() if transposes[0] else a), (b.T.copy() if transposes[1] else b)
    shapes = [a_stored.shape, b_stored.shape]
    graph = one_op("matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1])
    inputs = {"x0": a_stored, "x1": b_stored}
    error, executable = product_error(graph, inputs, np.abs(a_stored), np.abs(b_stored), *transposes)
    assert error < BOUND
    out = executable.run(inputs, read=("out",))["out"]
    assert np.all(out[3] == 0.0) and np.all(out[:, 5] == 0.0)


@needs_tensor_cores
@pytest.mark.parametrize("batch", [(2,), (2, 3)], ids=str)
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=str)
def test_batched_products(batch, transposes):
    shapes = operand_shapes(33, 40, 65, *transposes, batch=batch)
    graph = one_op("matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1])
    inputs = {"x0": normal(*shapes[0]), "x1": normal(*shapes[1])}
    error, _ = product_error(graph, inputs, np.abs(inputs["x0"]), np.abs(inputs["x1"]), *transposes)
    assert error < BOUND


@needs_tensor_cores
@pytest.mark.parametrize(
    "mkn, transposes, batch, parts",
    [
        ((36, 512, 44), (True, False), (), 4),
        ((37, 300, 9), (False, False), (), 7),
        ((33, 530, 20), (False, True), (2,), 4),
    ],
    ids=str,
)
def test_split_k_partials(mkn, transposes, batch, parts):
    m, k, n = mkn
    shapes = operand_shapes(m, k, n, *transposes, batch=batch) + [(k if transposes[0] else m, 1)]
    graph = one_op("fused_matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1],
                   prologue="mul($a,$0)", splits=parts)  # fmt: skip
    inputs = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}
    executable = run_gpu(graph, inputs, target=H200)
    got = executable.run(inputs, read=("out",))["out"]
    exact = interpret(graph, inputs, dtype=np.float64).outputs["out"]
    assert got.shape == (parts, *batch, m, n)
    np.testing.assert_allclose(got, exact, rtol=1e-3, atol=1e-3)


@needs_tensor_cores
@pytest.mark.parametrize("transposes", TRANSPOSES, ids=str)
def test_prologue_and_epilogue(transposes):
    """RMSNorm's prologue on A's staged elements, a bias and an activation on the way out."""
    m, k, n = 37, 29, 45
    shapes = operand_shapes(m, k, n, *transposes) + [(n,), (k if transposes[0] else m, 1)]
    graph = one_op("fused_matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1],
                   epilogue="relu(add($acc,$0))", prologue="mul($a,$1)")  # fmt: skip
    inputs = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}
    got = run_gpu(graph, inputs, target=H200).run(inputs, read=("out",))["out"]
    np.testing.assert_allclose(got, interpret(graph, inputs, dtype=np.float64).outputs["out"], rtol=1e-3, atol=1e-3)


# Beyond the ladder: 8 subgroups a workgroup, 128x128 tiles of 64x32 or 32x64 a subgroup, 64x64 of 32x16.
OTHER_TILINGS = (TensorTiling(4, 2, gm=2, gn=4), TensorTiling(2, 4, gm=4, gn=2), TensorTiling(2, 1, gm=2, gn=4))


@needs_tensor_cores
@pytest.mark.parametrize("tiling", LADDER + OTHER_TILINGS, ids=str)
def test_each_tile_of_the_ladder(monkeypatch, tiling):
    monkeypatch.setattr(matmul_tensor, "LADDER", (tiling,))
    for transposes in TRANSPOSES:
        shapes = operand_shapes(150, 70, 140, *transposes)
        graph = one_op("matmul", shapes, transpose_a=transposes[0], transpose_b=transposes[1])
        inputs = {"x0": normal(*shapes[0]), "x1": normal(*shapes[1])}
        error, executable = product_error(graph, inputs, np.abs(inputs["x0"]), np.abs(inputs["x1"]), *transposes)
        assert error < BOUND
        assert executable.kernels[0].grid[0] == -(-140 // tiling.bn)


def test_the_ladder_fills_the_target_and_fits_its_workgroup_memory(monkeypatch):
    """The first tiling of the ladder that gives every compute unit FILL workgroups (here 2)."""
    monkeypatch.setattr(matmul_tensor, "FILL", 2)
    assert tensor_tiling(4096, 4096, 1, H200) == TensorTiling(4, 4)
    assert tensor_tiling(2048, 576, 1, H200) == TensorTiling(2, 2)  # 72 tiles of 128x128 for 132 units
    assert tensor_tiling(64, 64, 1, H200) == TensorTiling(1, 1)
    assert all(tiling.workgroup_bytes <= H200.workgroup_memory for tiling in LADDER + OTHER_TILINGS)
    # A target of 32 KiB skips the 128x128 tiles (45 KB of halves, maxima and result matrices).
    small = dataclasses.replace(H200, workgroup_memory=32768)
    assert TensorTiling(4, 4).workgroup_bytes > 32768 and tensor_tiling(4096, 4096, 1, small) == TensorTiling(2, 2)
    assert LADDER[-1].workgroup_bytes <= WEBGPU_WORKGROUP_MEMORY  # what every device offers
    assert tensor_tiling(4096, 4096, 1, dataclasses.replace(H200, workgroup_memory=16384)) == LADDER[-1]


def test_the_cost_model_counts_the_tensor_kernels_it_plans(monkeypatch):
    """On a target with tensor cores every product of a planned step dispatches the workgroups the
    cost model counts for it (the tensor ladder's, in its largest tile's units), as the f32
    kernels do (tests/test_target.py); the ladder filling at FILL 2."""
    monkeypatch.setattr(matmul_tensor, "FILL", 2)
    workload = STEPS["smollm2"].build(small=True)
    plan = compile_plan(workload.model, workload.loss, workload.inputs, workload.optimizer, target=H200)
    step = plan.compiled
    tensor = [spec for spec in step.kernels if spec.entry_point == "matmul_tensor"]
    assert len(tensor) >= 20
    for spec in tensor:
        node = step.graph[spec.node]
        counted = dispatch_counted(step.graph, node, math.prod(spec.grid), H200)
        assert counted == node_workgroups(step.graph, node, H200), spec.label
    # 2048x576x1536: 768 tensor tiles of 64x64 (the 128x128 rung's 192 leave units idle), counted
    # as 96 of 128x128 two a unit; the f32 kernel's 384 tiles of 64x128 count 192.
    types = [TensorType((2048, 576)), TensorType((576, 1536))], (TensorType((2048, 1536)),)
    assert tensor_tiling(2048, 1536, 1, H200) == TensorTiling(2, 2)
    assert matmul_workgroups({}, *types, H200) == 768 * 64 * 64 // (128 * 128 * 2) == 96
    assert matmul_workgroups({}, *types, dataclasses.replace(H200, tensor_cores=False)) == 192


TINT_CHECK = """
from meganeura.bench.workloads import STEPS
from meganeura.compiler import compile_plan
from meganeura.runtime import device
from meganeura.target import WEBGPU_WORKGROUP_MEMORY, Target

from meganeura.codegen import matmul_halves, matmul_tensor

matmul_halves.MIN_DIM, matmul_halves.MIN_MACS = 1, 0  # the small steps' products split too
dev = device.default_device()
# Dawn's Null adapter offers the features under the toggles (so Tint takes the kernels), but
# reports no matrix configuration: the device plans f32 products, the H200 target below does not.
assert device.TENSOR_CORE_FEATURES[-1] in dev.device.features and not dev.tensor_cores
h200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152, tensor_cores=True)
count = 0
for name in ("gpt2", "smollm2"):
    workload = STEPS[name].build(small=True)
    plan = compile_plan(workload.model, workload.loss, workload.inputs, workload.optimizer, target=h200)
    for kernel in plan.compiled.kernels:
        if kernel.entry_point in ("matmul_halves", "split_halves"):
            dev.device.create_shader_module(code=kernel.wgsl)
            count += 1
# and the kernel that splits its operands itself, which the opt-in leaves off
matmul_halves.halves_take = lambda m, k, n: False
matmul_tensor.tensor_takes = lambda m, n, k, batches: True
for name in ("gpt2", "smollm2"):
    workload = STEPS[name].build(small=True)
    plan = compile_plan(workload.model, workload.loss, workload.inputs, workload.optimizer, target=h200)
    for kernel in plan.compiled.kernels:
        if kernel.entry_point == "matmul_tensor":
            dev.device.create_shader_module(code=kernel.wgsl)
            count += 1
print("tensor kernels", count)
"""


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_every_tensor_core_kernel_of_the_bench_steps_compiles_through_tint():
    env = {**os.environ, "MEGANEURA_BACKEND": "dawn", "WGPU_BACKEND_TYPE": "Null", "MEGANEURA_TENSOR_CORES": "1"}
    env.pop("MEGANEURA_ADAPTER", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TINT_CHECK)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split("tensor kernels")[1]) >= 60, done.stdout


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_the_tensor_kernel_benchmark_compiles_through_tint():
    """benchmarks/tensor_core_kernel.py keeps compiling: each variant it times, and the probe's
    kernels beside them, at a ragged shape of every operand layout."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tensor_core_kernel.py")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout, for `import meganeura`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, script, "--validate", "--shapes", "70x130x90,70x130x90:At,70x130x90:Bt"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = [line.removeprefix("compiled ") for line in done.stdout.splitlines() if line.startswith("compiled ")]
    assert compiled == ["70x130x90", "70x130x90:At", "70x130x90:Bt"]
