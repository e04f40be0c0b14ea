"""Uploading a step's inputs through one mapped staging buffer, where the backend allows it.

Every training step uploads its batch. `queue.write_buffer` copies the data into a staging
buffer that wgpu-native allocates for that call, and the next submit copies it on.
`InputStaging` keeps one buffer (MAP_WRITE | COPY_SRC) for all of a step's inputs instead: the
host copies the batch into its mapped range and unmaps it, and the step's command buffer starts
with a copy from it into each input's buffer; right after the submit the buffer is asked to map
again, which the driver completes once the GPU has copied it, while the host waits for the
step's results anyway (a step that reads nothing makes the next upload wait for that copy).
Measured on the H200 (2026-12-04, 06:09 UTC, `PYTHONPATH=. python benchmarks/host_time.py
--rounds 3`, the bench's digits MLP, its batch 256 × 784 floats): `train_step` 452, 450 and 457
µs staged against 471, 477 and 474 by `queue.write_buffer`, alternated in one process; the
staged step's upload took 50 µs of its host time, the submit 33, recording the next step 135
(behind the GPU's 259 µs) and the wait for the loss 203.

Mapping goes through wgpu-native's C functions (`wgpuBufferMapAsync`, `wgpuDevicePoll`,
`wgpuBufferUnmap`, runtime/native.py), as the readback does (runtime/mapping.py): wgpu-py's
own map calls wait on its polling thread. Elsewhere (Dawn, a build without them)
`input_staging` gives None and the executable uploads with `queue.write_buffer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import accumulate

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.runtime.backend import wgpu
from meganeura.runtime.native import wgpu_native

ALIGN = 256  # each input's bytes start at a multiple of this in the staging buffer (copies need 4)


def numpy_dtype(dtype: str) -> type:
    """The numpy dtype of a tensor's dtype, as its buffer holds it."""
    return {"f32": np.float32, "i32": np.int32}[dtype]


def staged_array(type: TensorType, value: np.ndarray, what: str) -> np.ndarray:
    """`value` as the contiguous array of `type`'s dtype that is uploaded, or a ValueError on its shape."""
    array = np.asarray(value, dtype=numpy_dtype(type.dtype), order="C")  # 0-d stays 0-d
    if array.shape != type.shape:
        raise ValueError(f"{what}: expected shape {list(type.shape)}, got {list(array.shape)}")
    return array


class InputStaging:
    """One MAP_WRITE staging buffer holding every input of a step at its own offset."""

    def __init__(self, api, device: wgpu.GPUDevice, inputs: Mapping[str, tuple[wgpu.GPUBuffer, TensorType]]) -> None:
        self.ffi, self.lib = api.ffi, api.lib
        self.device = device
        self.inputs = dict(inputs)
        self.size = staged_bytes(self.inputs)
        ends = accumulate(slot_bytes(type) for _, type in self.inputs.values())
        self.offsets = dict(zip(self.inputs, (0, *ends), strict=False))  # each slot starts where the last ends
        usage = wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
        self.buffer = device.create_buffer(label="input staging", size=self.size, usage=usage)
        self.outcomes: list[tuple[int, str]] = []
        ffi, lib = self.ffi, self.lib

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def mapped(status, message, _userdata1, _userdata2):
            self.outcomes.append((status, api.from_c_string_view(message)))

        self.callback = mapped  # cffi frees a callback that nothing references
        self.info = ffi.new(
            "WGPUBufferMapCallbackInfo *", {"mode": lib.WGPUCallbackMode_AllowProcessEvents, "callback": mapped}
        )
        self.pending = False
        self.request()

    def request(self) -> None:
        """Ask for the buffer mapped for the next upload (after the submit that copies from it)."""
        if not self.pending:
            self.outcomes.clear()
            self.lib.wgpuBufferMapAsync(self.buffer._internal, self.lib.WGPUMapMode_Write, 0, self.size, self.info[0])
            self.pending = True

    def write(self, values: Mapping[str, np.ndarray]) -> None:
        """Copy every input's value into the mapped buffer (waiting for the map: the GPU done
        with the last copy from it) and unmap it, ready for the step's copies (`encode`)."""
        ffi, lib = self.ffi, self.lib
        self.request()
        while not self.outcomes:
            lib.wgpuDevicePoll(self.device._internal, True, ffi.NULL)
        self.pending = False
        status, message = self.outcomes[0]
        if status != lib.WGPUMapAsyncStatus_Success:
            raise RuntimeError(f"could not map the input staging buffer for writing ({status}: {message})")
        try:
            base = lib.wgpuBufferGetMappedRange(self.buffer._internal, 0, self.size)
            for name, (_, type) in self.inputs.items():
                array = staged_array(type, values[name], f"input {name!r}")
                if array.nbytes:
                    ffi.memmove(base + self.offsets[name], ffi.from_buffer(array), array.nbytes)
        finally:
            lib.wgpuBufferUnmap(self.buffer._internal)

    def encode(self, encoder: wgpu.GPUCommandEncoder) -> None:
        """The copies of every input from the staging buffer into its own buffer, for the start of a step."""
        for name, (buffer, type) in self.inputs.items():
            if type.nbytes:
                encoder.copy_buffer_to_buffer(self.buffer, self.offsets[name], buffer, 0, -(-type.nbytes // 4) * 4)


def slot_bytes(type: TensorType) -> int:
    """The bytes an input of `type` takes in the staging buffer: whole words, to a multiple of ALIGN."""
    return -(-max(4, type.nbytes) // ALIGN) * ALIGN


def staged_bytes(inputs: Mapping[str, tuple[wgpu.GPUBuffer, TensorType]]) -> int:
    """The size of the staging buffer of these inputs."""
    return sum(slot_bytes(type) for _, type in inputs.values())


def input_staging(
    device: wgpu.GPUDevice, inputs: Mapping[str, tuple[wgpu.GPUBuffer, TensorType]], largest: int | None = None
) -> InputStaging | None:
    """The staging of these inputs, or None where there are none, where the backend has no C
    mapping, or where they would not fit one buffer of at most `largest` bytes (the device's
    max-buffer-size: each input fits one, their sum may not)."""
    api = wgpu_native()
    if api is None or not any(type.nbytes for _, type in inputs.values()):
        return None
    if largest is not None and staged_bytes(inputs) > largest:
        return None
    try:
        return InputStaging(api, device, inputs)
    except AttributeError:  # a C function or constant this wgpu-native lacks
        return None
