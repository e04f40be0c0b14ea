"""Reading a mappable buffer back after a submit, with as little waiting as the host allows.

A training step ends with the host waiting for the GPU: `train_step` returns the loss, so it maps
the readback buffer its step copied into. wgpu-py's `map_sync` makes that wait long. It first
submits an empty command buffer of its own (its workaround for a buffer mapped before any submit
wrote it, wgpu-native issue 305), then hands the wait to its per-device polling thread and sleeps
on a `threading.Event` until that thread reports: two thread wake-ups per step.
`benchmarks/readback_latency.py` (a 16-byte copy submitted and read back, 2026-12-02): on the
H200 141 µs through `map_sync`, 67 µs by the C path below (PyTorch's tiny kernel + `.item()`:
35 µs); on the 2-core lavapipe machine 326 and 117 µs. The MLP's whole step takes ~0.5 ms on the
H200: that wait is a large part of it.

`read_after_submit` maps through wgpu-native's C functions where wgpu-py exposes them (the
pinned wgpu 0.32.0 does: runtime/native.py), waits on the calling thread with a
blocking `wgpuDevicePoll`, copies the range out and unmaps; elsewhere it goes through wgpu-py's
`map_sync`. Only buffers that wgpu-py itself never maps may be read this way: wgpu-py's own
record of the buffer's map state is not updated.
"""

from __future__ import annotations

from meganeura.runtime.backend import wgpu
from meganeura.runtime.native import wgpu_native


class NativeMapper:
    """wgpu-native's map, poll and unmap, with one callback kept alive for every map."""

    def __init__(self, ffi, lib, text_of) -> None:
        self.ffi, self.lib = ffi, lib
        self.outcomes: list[tuple[int, str]] = []  # (status, message) of the map in flight

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def mapped(status, message, _userdata1, _userdata2):
            self.outcomes.append((status, text_of(message)))

        self.callback = mapped  # cffi frees a callback that nothing references
        self.info = ffi.new(
            "WGPUBufferMapCallbackInfo *", {"mode": lib.WGPUCallbackMode_AllowProcessEvents, "callback": mapped}
        )

    def read(self, device: wgpu.GPUDevice, buffer: wgpu.GPUBuffer, start: int, size: int) -> bytearray:
        ffi, lib = self.ffi, self.lib
        self.outcomes.clear()
        lib.wgpuBufferMapAsync(buffer._internal, lib.WGPUMapMode_Read, start, size, self.info[0])
        lib.wgpuDevicePoll(device._internal, True, ffi.NULL)  # returns once the queue's work is done
        while not self.outcomes:  # the callback ran in wgpu-py's polling thread, or is about to
            lib.wgpuDevicePoll(device._internal, False, ffi.NULL)
        status, message = self.outcomes[0]
        if status != lib.WGPUMapAsyncStatus_Success:
            raise RuntimeError(f"could not map {buffer.label or 'a buffer'} for reading ({status}: {message})")
        try:
            return bytearray(ffi.buffer(lib.wgpuBufferGetMappedRange(buffer._internal, start, size), size))
        finally:
            lib.wgpuBufferUnmap(buffer._internal)


def native_mapper() -> NativeMapper | None:
    """The C path, or None where this wgpu build does not expose it (runtime/native.py)."""
    api = wgpu_native()
    if api is None:
        return None
    try:
        return NativeMapper(api.ffi, api.lib, api.from_c_string_view)
    except AttributeError:  # a C function or constant this wgpu-native lacks
        return None


NATIVE = native_mapper()


def read_after_submit(device: wgpu.GPUDevice, buffer: wgpu.GPUBuffer, start: int, size: int) -> bytearray:
    """A copy of bytes `start` to `start + size` of `buffer` (MAP_READ) once the work submitted so
    far is done: a copy into it was submitted just before. A bytearray, so that arrays made on it
    are writable, as PyTorch's are."""
    if NATIVE is not None:
        return NATIVE.read(device, buffer, start, size)
    buffer.map_sync(wgpu.MapMode.READ, start, size)
    try:
        return bytearray(buffer.read_mapped(start, size))
    finally:
        buffer.unmap()
