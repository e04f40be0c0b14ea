"""The tensor cores' tilings (codegen/tensor_tiles.py) and what every tensor-core kernel of the
bench's steps is: Tint, Dawn's WGSL compiler, takes each (on Dawn's Null adapter, no GPU needed).
The split products themselves are tested against the interpreter in tests/test_matmul_halves.py,
where the device offers f16 subgroup matrices (`needs_tensor_cores`, below)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from meganeura.codegen import tensor_tiles
from meganeura.codegen.tensor_tiles import LADDER, TensorTiling, tensor_tiling
from meganeura.runtime import default_device
from meganeura.target import WEBGPU_WORKGROUP_MEMORY, Target

H200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152, tensor_cores=True)


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


# Beyond the ladder: 8 subgroups a workgroup, 128x128 tiles of 64x32 or 32x64 a subgroup, 64x64 of 32x16.
OTHER_TILINGS = (TensorTiling(4, 2, gm=2, gn=4), TensorTiling(2, 4, gm=4, gn=2), TensorTiling(2, 1, gm=2, gn=4))


def test_the_ladder_fills_the_target_and_fits_its_workgroup_memory(monkeypatch):
    """The first tiling of the ladder that gives every compute unit FILL workgroups (here 2)."""
    monkeypatch.setattr(tensor_tiles, "FILL", 2)
    assert tensor_tiling(4096, 4096, 1, H200) == TensorTiling(4, 4)
    assert tensor_tiling(2048, 576, 1, H200) == TensorTiling(2, 2)  # 72 tiles of 128x128 for 132 units
    assert tensor_tiling(64, 64, 1, H200) == TensorTiling(1, 1)
    assert all(tiling.workgroup_bytes <= H200.workgroup_memory for tiling in LADDER + OTHER_TILINGS)
    # A target of 32 KiB skips the 128x128 tiles (45 KB of halves, maxima and result matrices).
    small = dataclasses.replace(H200, workgroup_memory=32768)
    assert TensorTiling(4, 4).workgroup_bytes > 32768 and tensor_tiling(4096, 4096, 1, small) == TensorTiling(2, 2)
    assert LADDER[-1].workgroup_bytes <= WEBGPU_WORKGROUP_MEMORY  # what every device offers
    assert tensor_tiling(4096, 4096, 1, dataclasses.replace(H200, workgroup_memory=16384)) == LADDER[-1]


MIN_TINT_KERNELS = 100  # the small GPT-2 and SmolLM2 steps planned for the H200: 143 on 2026-12-08

TINT_CHECK = """
from meganeura.bench.workloads import STEPS
from meganeura.compiler import compile_plan
from meganeura.runtime import device
from meganeura.target import Target

from meganeura.passes import operand_splits

operand_splits.MIN_DIM, operand_splits.MIN_MACS = 1, 0  # the small steps' products split too
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
    assert int(done.stdout.split("tensor kernels")[1]) >= MIN_TINT_KERNELS, done.stdout
