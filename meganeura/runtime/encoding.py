"""Recording a step's dispatches into a compute pass, as fast as the host allows.

A training step records every dispatch anew (WebGPU command buffers are used once), so the
host's time per dispatch adds to every step: the SmolLM2-135M-shaped step records 2,359 of them.
wgpu-py's `set_bind_group` allocates a cffi array and checks its arguments on every call; on
this project's 2-core machine a dispatch (set_bind_group + dispatch_workgroups, set_pipeline
when it changes) takes 3.6 µs through wgpu-py's methods and 1.0-1.3 µs through the wgpu-native
C functions they wrap (lavapipe, the 250 dispatches of a 4-layer SmolLM2-shaped step, the
fastest of 20 recordings, 2026-12-01); finishing the encoder adds 1.6-1.9 µs a dispatch.
`record` uses the C functions where the backend's package exposes them (the pinned wgpu 0.32.0
and wgpudawn 0.32.0.4 do: runtime/native.py), else the methods.

Errors are not lost: WebGPU reports a pass's validation errors when its command encoder
finishes, which goes through wgpu-py's checked call either way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meganeura.runtime.backend import wgpu
from meganeura.runtime.native import webgpu_c

Dispatch = tuple  # (GPUComputePipeline, GPUBindGroup, (x, y, z))


def native_functions():
    """(set_pipeline, set_bind_group, dispatch, NULL) of webgpu.h in the backend's C library, or
    None where its build does not expose them (runtime/native.py)."""
    api = webgpu_c()
    if api is None:
        return None
    try:
        lib = api.lib
        return (
            lib.wgpuComputePassEncoderSetPipeline,
            lib.wgpuComputePassEncoderSetBindGroup,
            lib.wgpuComputePassEncoderDispatchWorkgroups,
            api.ffi.NULL,
        )
    except AttributeError:  # a C function this wgpu-native lacks
        return None


NATIVE = native_functions()


def record_native(compute: wgpu.GPUComputePassEncoder, dispatches: Sequence[Dispatch]) -> None:
    set_pipeline, set_bind_group, dispatch, null = NATIVE
    handle = compute._internal
    current = None
    for pipeline, group, (x, y, z) in dispatches:
        if pipeline is not current:
            set_pipeline(handle, pipeline._internal)
            current = pipeline
        set_bind_group(handle, 0, group._internal, 0, null)
        dispatch(handle, x, y, z)


def record_public(compute: wgpu.GPUComputePassEncoder, dispatches: Sequence[Dispatch]) -> None:
    current = None
    for pipeline, group, grid in dispatches:
        if pipeline is not current:
            compute.set_pipeline(pipeline)
            current = pipeline
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(*grid)


def recorder(native: bool = True) -> Callable[[wgpu.GPUComputePassEncoder, Sequence[Dispatch]], None]:
    """The function that records dispatches into a pass: the C path where available and asked for."""
    return record_native if native and NATIVE is not None else record_public
