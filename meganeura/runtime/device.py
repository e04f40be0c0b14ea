"""Adapter and device selection, and the per-device caches of shader modules and pipelines.

`default_device()` is one process-wide device, so that every program (and every Parameter
buffer they share) lives on the same wgpu device. The adapter is the high-performance one,
unless the environment variable MEGANEURA_ADAPTER names another: a case-insensitive substring
of the adapter's name, or "gpu" / "cpu" for the adapter type.

MEGANEURA_UNCHECKED_KERNELS=1 opts in to shader modules without the shader compiler's runtime
bounds checks (index clamping, loop bounding) for the kernels marked `trusted` — those whose
indexing the suite tests at ragged shapes (codegen/kernel.py). On wgpu-native the switch is per
module: `wgpuDeviceCreateShaderModuleTrusted` makes them (wgpu-py does not wrap it, so it is
called through cffi), and a kernel measured faster with its checks (`keeps_checks`) keeps them.
On the H200 a WGSL GEMM probe measured 29 → 35 TFLOP/s for one GEMM kernel without the
checks. Dawn has one switch for the whole device (its toggle `disable_robustness`),
so there the opt-in turns the checks off for every kernel, and a kernel not marked trusted is an
error when its pipeline is made, naming the kernel, rather than a kernel run unchecked that the
suite does not vouch for.

MEGANEURA_TENSOR_CORES=1 (with MEGANEURA_BACKEND=dawn) asks Dawn for f16 subgroup matrices and,
where the adapter offers them, runs the products on the tensor cores from operands split once into
f16 halves (passes/operand_splits.py; on the H200 faster than the f32 kernels in GPT-2's step,
slower in SmolLM2's: docs/architecture.md, "Backends"). Experimental: off by default.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

from meganeura.codegen.kernel import KernelSpec
from meganeura.runtime.backend import NAME as BACKEND
from meganeura.runtime.backend import wgpu
from meganeura.runtime.native import wgpu_native
from meganeura.target import Target, target_for

ADAPTER_ENV = "MEGANEURA_ADAPTER"
UNCHECKED_ENV = "MEGANEURA_UNCHECKED_KERNELS"
TENSOR_CORES_ENV = "MEGANEURA_TENSOR_CORES"
# What the split-f16 products need (passes/operand_splits.py, codegen/matmul_halves.py); Dawn
# offers the last two only behind its instance toggles `allow_unsafe_apis` and, on NVIDIA,
# `vulkan_enable_f16_on_nvidia`.
TENSOR_CORE_FEATURES = ("subgroups", "shader-f16", "chromium-experimental-subgroup-matrix")
DAWN_INSTANCE_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")


# The one subgroup-matrix configuration the kernel is written for (codegen/tensor_tiles.py): f16
# operands, f32 results, 16×16×16, in subgroups of exactly 32 threads (its lanes' share of a result
# matrix and its subgroups' place in a workgroup assume 32).
TENSOR_CORE_MATRICES = "f16 × f16 → f32 16×16×16 subgroup matrices in subgroups of 32"


def has_tensor_core_matrices(adapter: wgpu.GPUAdapter) -> bool:
    """Whether Dawn reports TENSOR_CORE_MATRICES for `adapter` (Dawn's Null adapter reports none)."""
    from wgpudawn.backends.dawn import extras

    configs = extras.get_adapter_properties(adapter).get("subgroup_matrix_configs", [])
    return any(
        (c["component_type"], c["result_component_type"], c["m"], c["n"], c["k"]) == ("f16", "f32", 16, 16, 16)
        and c["min_subgroup_size"] == c["max_subgroup_size"] == 32
        for c in configs
    )


def tensor_cores_wanted() -> bool:
    """Whether the user opted in to products on the tensor cores; an error off Dawn, the only
    backend whose WGSL reaches them."""
    if os.environ.get(TENSOR_CORES_ENV, "").strip() != "1":
        return False
    if BACKEND != "dawn":
        raise RuntimeError(
            f"{TENSOR_CORES_ENV}=1 needs the Dawn backend (MEGANEURA_BACKEND=dawn, `pip install "
            f'"meganeura[dawn]"`): {BACKEND} has no subgroup matrices'
        )
    return True


# Limits worth raising to the adapter's own maximum: big tensors and big workgroups (the device
# gets WebGPU's defaults otherwise: 16 KiB of workgroup memory where the H200 offers 48). The
# target (meganeura/target.py) is made from the raised limits, so the kernels planned for it run.
RAISED_LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
)

# Native backends first: wgpu also offers an OpenGL adapter for the same CPU, without compute
# features we rely on.
BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 0, "OpenGL": 2}
TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}


def adapter_name(adapter: wgpu.GPUAdapter) -> str:
    return adapter.info.get("device") or adapter.info.get("description") or "unknown adapter"


def matches(adapter: wgpu.GPUAdapter, wanted: str) -> bool:
    """Whether `adapter` is the one MEGANEURA_ADAPTER asks for."""
    kind = adapter.info.get("adapter_type", "")
    if wanted == "gpu":
        return kind.endswith("GPU")
    if wanted == "cpu":
        return kind == "CPU"
    return wanted in adapter_name(adapter).lower()


_instance_toggles_set = False  # Dawn takes instance toggles once, before its instance is made


def select_adapter() -> wgpu.GPUAdapter:
    """The adapter MEGANEURA_ADAPTER names, else the system's high-performance adapter."""
    global _instance_toggles_set
    if tensor_cores_wanted() and not _instance_toggles_set:
        from wgpudawn.backends.dawn import extras

        extras.set_instance_extras(enable_toggles=list(DAWN_INSTANCE_TOGGLES))  # once: before the instance exists
        _instance_toggles_set = True
    wanted = os.environ.get(ADAPTER_ENV, "").strip().lower()
    if not wanted:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise RuntimeError("no WebGPU adapter found (on a machine without a GPU, install mesa-vulkan-drivers)")
        return adapter
    adapters = wgpu.gpu.enumerate_adapters_sync()
    chosen = [a for a in adapters if matches(a, wanted)]
    if not chosen:
        available = ", ".join(
            f"{adapter_name(a)} ({a.info.get('adapter_type')}, {a.info.get('backend_type')})" for a in adapters
        )
        raise RuntimeError(f"{ADAPTER_ENV}={wanted!r} matches no adapter; available: {available or 'none'}")
    return min(
        chosen,
        key=lambda a: (
            BACKEND_RANK.get(a.info.get("backend_type"), 1),
            TYPE_RANK.get(a.info.get("adapter_type"), 4),
        ),
    )


# Dawn's device toggles: its timestamps at full resolution (Dawn quantizes them by default, a
# browser's guard against timing attacks, which would blur the profiler's per-kernel times).
DAWN_ENABLE: tuple[str, ...] = ()
DAWN_DISABLE = ("timestamp_quantization",)
# Under MEGANEURA_UNCHECKED_KERNELS=1 on Dawn: no index clamping in any module of the device.
# On the H200, 2026-12-04, with MEGANEURA_TENSOR_CORES=1 (benchmarks/plan_ab.py, a process with
# the toggle and one without): GPT-2's step 48.61 → 42.87 ms of GPU time as one pass (wall 51.9
# → 45.9), SmolLM2's 69.93 → 61.24 (78.4 → 70.0). Dawn's `skip_validation` saved SmolLM2 a
# further 3 ms of host time but is not taken: it changed a loss once (docs/architecture.md, "Backends").
DAWN_UNCHECKED = ("disable_robustness",)


def unchecked_wanted() -> bool:
    """Whether the user opted in to kernels without runtime bounds checks (module docstring)."""
    return os.environ.get(UNCHECKED_ENV, "") == "1"


def request_device(adapter: wgpu.GPUAdapter, limits: dict, features: list) -> wgpu.GPUDevice:
    """The adapter's device with `limits` and `features` (and, on Dawn, the toggles above)."""
    if BACKEND != "dawn":
        return adapter.request_device_sync(label="meganeura", required_limits=limits, required_features=features)
    from wgpudawn.backends.dawn import extras

    return extras.request_device_sync(
        adapter,
        label="meganeura",
        required_limits=limits,
        required_features=features,
        enable_toggles=DAWN_ENABLE + (DAWN_UNCHECKED if unchecked_wanted() else ()),
        disable_toggles=DAWN_DISABLE,
    )


class Device:
    """A wgpu device and its queue, with shader modules and pipelines cached by their WGSL text."""

    def __init__(self, adapter: wgpu.GPUAdapter) -> None:
        self.adapter = adapter
        limits = {name: adapter.limits[name] for name in RAISED_LIMITS if name in adapter.limits}
        # Timestamps only cost anything when a profiled step writes them (runtime/profile.py).
        features = [f for f in ("timestamp-query",) if f in adapter.features]
        tensor_cores = False
        if tensor_cores_wanted():
            missing = [f for f in TENSOR_CORE_FEATURES if f not in adapter.features]
            if not missing:  # the features compile the kernels, the matrices run them
                features += TENSOR_CORE_FEATURES
                missing = [] if has_tensor_core_matrices(adapter) else [TENSOR_CORE_MATRICES]
            if missing:
                warnings.warn(
                    f"{TENSOR_CORES_ENV}=1: {adapter_name(adapter)} lacks {', '.join(missing)}; "
                    "the products run in the f32 kernels",
                    stacklevel=2,
                )
            tensor_cores = not missing
        self.tensor_cores = tensor_cores
        self.device = request_device(adapter, limits, features)
        # Dawn's checks are off for every module of this device, or for none (module docstring)
        self.unchecked_everywhere = BACKEND == "dawn" and unchecked_wanted()
        self.has_timestamps = "timestamp-query" in features
        self.queue = self.device.queue
        self.limits = dict(self.device.limits)
        self._modules: dict[str, wgpu.GPUShaderModule] = {}
        self._pipelines: dict[tuple, tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout]] = {}

    def describe(self) -> str:
        """The adapter in words, e.g. "llvmpipe (LLVM 15.0.6, 256 bits) — Vulkan, CPU", with the
        backend named where it is not the default ("… — Vulkan, DiscreteGPU, through Dawn")."""
        info = self.adapter.info
        through = ", through Dawn" if BACKEND == "dawn" else ""
        return f"{adapter_name(self.adapter)} — {info.get('backend_type')}, {info.get('adapter_type')}{through}"

    def __repr__(self) -> str:
        return f"Device({self.describe()})"

    @property
    def target(self) -> Target:
        """What the compiler plans for on this device (meganeura/target.py)."""
        target = target_for(adapter_name(self.adapter), self.adapter.info.get("adapter_type", ""), self.limits)
        return dataclasses.replace(target, tensor_cores=self.tensor_cores)

    def shader_module(self, wgsl: str, unchecked: bool = False) -> wgpu.GPUShaderModule:
        """The compiled module of `wgsl`, compiled once per device; without runtime bounds checks
        when `unchecked` (wgpu-native's per-module switch: module docstring)."""
        module = self._modules.get((wgsl, unchecked))
        if module is None:
            make = unchecked_module if unchecked else lambda device, code: device.create_shader_module(code=code)
            module = self._modules[(wgsl, unchecked)] = make(self.device, wgsl)
        return module

    def runs_unchecked(self, spec: KernelSpec) -> bool:
        """Whether `spec` gets a module of its own without runtime bounds checks: trusted, not
        faster with them, and the user opted in; on Dawn never (the device decides, for all), and
        an untrusted kernel is an error there under the opt-in."""
        if self.unchecked_everywhere:
            if not spec.trusted:
                raise RuntimeError(
                    f"{UNCHECKED_ENV}=1 on Dawn turns the runtime bounds checks off for every kernel of the "
                    f"device (Dawn has no per-module switch), and kernel {spec.label!r} ({spec.entry_point}) "
                    "is not one whose indexing the suite checks at ragged shapes (KernelSpec.trusted); "
                    f"unset {UNCHECKED_ENV} or run on wgpu-native, where only trusted kernels go unchecked"
                )
            return False
        return spec.trusted and not spec.keeps_checks and unchecked_wanted()

    def pipeline(self, spec: KernelSpec) -> tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroupLayout]:
        """A compute pipeline for `spec`'s entry point; its group 0 holds its storage bindings."""
        accesses = tuple(b.access for b in spec.bindings)
        # keyed by the module it gets: a trusted kernel's pipeline built before the opt-in was set
        # holds a checked module, and must not be handed out once it is
        unchecked = self.runs_unchecked(spec)
        key = (spec.wgsl, spec.entry_point, accesses, unchecked)
        cached = self._pipelines.get(key)
        if cached is None:
            layout = self.device.create_bind_group_layout(
                entries=[
                    {
                        "binding": index,
                        "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": "read-only-storage" if access == "read" else "storage"},
                    }
                    for index, access in enumerate(accesses)
                ]
            )
            pipeline = self.device.create_compute_pipeline(
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": self.shader_module(spec.wgsl, unchecked), "entry_point": spec.entry_point},
            )
            cached = self._pipelines[key] = (pipeline, layout)
        return cached


def unchecked_module(device: wgpu.GPUDevice, wgsl: str) -> wgpu.GPUShaderModule:
    """A shader module of `wgsl` compiled without runtime bounds checks (wgpu-native only)."""
    api = wgpu_native()
    if api is None:
        raise RuntimeError(
            f"{UNCHECKED_ENV}=1 needs wgpu-native's C API, which the {BACKEND} backend's build does not expose"
        )
    ffi, lib = api.ffi, api.lib
    source = api.new_struct_p("WGPUShaderSourceWGSL *", code=api.to_c_string_view(wgsl))
    source[0].chain.next = ffi.NULL
    source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    descriptor = api.new_struct_p(
        "WGPUShaderModuleDescriptor *",
        nextInChain=ffi.cast("WGPUChainedStruct *", source),
        label=api.to_c_string_view("meganeura unchecked"),
    )
    handle = api.libf.wgpuDeviceCreateShaderModuleTrusted(
        device._internal, descriptor, lib.WGPUShaderRuntimeChecks_None
    )
    if handle == ffi.NULL:
        raise RuntimeError(f"{UNCHECKED_ENV}=1: wgpu-native could not create a shader module without bounds checks")
    return api.GPUShaderModule("meganeura unchecked", handle, device)


_default: Device | None = None


def default_device() -> Device:
    """The process-wide device (created on first use)."""
    global _default
    if _default is None:
        _default = Device(select_adapter())
    return _default
