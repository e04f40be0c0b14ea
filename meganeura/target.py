"""What the compiler assumes about the adapter a step will run on: how many workgroups it runs at
once, how many storage buffers one kernel may bind, and how much workgroup memory one kernel's
shared arrays may take.

A `Target` is plain data. `compile()` takes it from the device it runs on (`Device.target`,
runtime/device.py); `compile_plan` and `rewrite.optimize`, which need no device, default to
`GENERIC`. The cost model (`rewrite/cost.py`) prices a kernel that launches fewer workgroups than
the target has compute units at the fraction of the adapter it fills, and extraction never fuses
a kernel that would bind more buffers than the target allows. The tiled kernels
(codegen/attention_tiles.py, codegen/gemm_table.py) only take tile configurations whose workgroup
arrays fit the target's `workgroup_memory`.

Compute units per adapter (workgroups in flight at once, one per unit, the first-order model of
`cost.py`; occupancy within a unit is not modelled):
- NVIDIA H200: 132 streaming multiprocessors (NVIDIA's H200 datasheet; the H100 SXM has the same
  132). An adapter named "H100" gets the same figure.
- lavapipe (llvmpipe): one rasterizer thread per CPU, `LP_NUM_THREADS` or the CPU count (Mesa's
  default): each thread runs one workgroup at a time.
- any other adapter: `GENERIC.compute_units`, 64 (between a laptop GPU's ~30 and a large
  discrete GPU's ~130 units).
Storage buffers per kernel: the device's `max-storage-buffers-per-shader-stage` (lavapipe 32); 31
for `GENERIC`, the most that Metal's 31 buffer slots and every Vulkan driver we know allow.
Workgroup memory per kernel: the device's `max-compute-workgroup-storage-size` (lavapipe 32768,
the H200 48 KiB), which runtime/device.py raises the device to. An adapter that does not report
it, and a `Target` that does not say, get the 16384 bytes of WebGPU's default limit, which every
device offers and every kernel but the attention tiles fits (the GEMM and conv tiles take at most
16384 bytes, the reductions a word per thread). `GENERIC` says 32768, as its 31 storage
buffers stand for a native GPU rather than WebGPU's floor: the generic attention tiles at head_dim
64 need 18624 (dQ) and 19712 (dK/dV) bytes, so a plan made without a device shows the kernels of a
GPU with lavapipe's 32 KiB. A device with 16 KiB reports it, and its target gets tiles within it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# The workgroup memory every WebGPU device offers (the default maxComputeWorkgroupStorageSize).
WEBGPU_WORKGROUP_MEMORY = 16384


@dataclass(frozen=True)
class Target:
    """The adapter a plan is made for, as far as the compiler cares."""

    name: str
    compute_units: int  # workgroups that run at once (SMs, compute units, CPU threads)
    max_storage_buffers: int  # storage buffers one kernel may bind
    cpu: bool = False  # a CPU (lavapipe): kernels with a CPU form pick it (attention rows, codegen/transformer.py)
    tuning: str = "generic"  # the GPU family whose measured kernel tables it uses (codegen/gemm_table.py)
    workgroup_memory: int = WEBGPU_WORKGROUP_MEMORY  # bytes one kernel's workgroup arrays may take
    tensor_cores: bool = False  # products as split f16 on subgroup matrices (codegen/matmul_halves.py)

    def __post_init__(self) -> None:
        if self.compute_units < 1 or self.max_storage_buffers < 2:
            raise ValueError(f"target {self.name!r}: needs ≥ 1 compute unit and ≥ 2 storage buffers, got {self}")
        if self.workgroup_memory < WEBGPU_WORKGROUP_MEMORY:
            # Every WebGPU device offers that much, and the GEMM tiles are made to fit it.
            raise ValueError(
                f"target {self.name!r}: needs ≥ {WEBGPU_WORKGROUP_MEMORY} bytes of workgroup memory, got {self}"
            )


GENERIC = Target("generic GPU", compute_units=64, max_storage_buffers=31, workgroup_memory=32768)

# Adapter name substring (lower case) → compute units, from the vendors' data (module docstring).
COMPUTE_UNITS = {"h200": 132, "h100": 132}
# Adapter name substring → the family of measured kernel tables (codegen/gemm_table.py).
TUNINGS = {"h200": "hopper", "h100": "hopper"}


def cpu_threads() -> int:
    """The rasterizer threads llvmpipe starts: LP_NUM_THREADS if set, else one per CPU."""
    configured = os.environ.get("LP_NUM_THREADS", "").strip()
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    return os.cpu_count() or 1


def target_for(adapter_name: str, adapter_type: str, limits: Mapping[str, int]) -> Target:
    """The target of an adapter, from its name, its type ("CPU" for lavapipe) and its WebGPU
    limits by name (a device's, or an adapter's: `devices` lists those before a device exists)."""
    name = adapter_name.lower()
    units = next((count for key, count in COMPUTE_UNITS.items() if key in name), None)
    if units is None:
        units = cpu_threads() if adapter_type == "CPU" or "llvmpipe" in name else GENERIC.compute_units
    buffers = limits.get("max-storage-buffers-per-shader-stage") or GENERIC.max_storage_buffers
    workgroup_memory = limits.get("max-compute-workgroup-storage-size") or WEBGPU_WORKGROUP_MEMORY
    cpu = adapter_type == "CPU" or "llvmpipe" in name
    tuning = next((family for key, family in TUNINGS.items() if key in name), "generic")
    return Target(adapter_name, units, buffers, cpu=cpu, tuning=tuning, workgroup_memory=workgroup_memory)
