"""How long the host waits to read a result back: a 16-byte copy submitted and its readback
buffer mapped, copied out and unmapped, by wgpu-py's `map_sync` (what the runtime did before) and
by `runtime/mapping.py`'s `read_after_submit`; with PyTorch on CUDA where it is installed, a tiny
kernel and `.item()`, its step's own wait for the loss. Medians of 300 after 20 untimed.

    PYTHONPATH=. python benchmarks/readback_latency.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import wgpu

from meganeura.runtime import default_device, mapping


def median_us(read: Callable[[], object], repeat: int = 300, warmup: int = 20) -> float:
    for _ in range(warmup):
        read()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        read()
        times.append(time.perf_counter() - started)
    return 1e6 * statistics.median(times)


def main() -> None:
    dev = default_device()
    usage = wgpu.BufferUsage
    source = dev.device.create_buffer(size=64, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)
    readback = dev.device.create_buffer(size=64, usage=usage.MAP_READ | usage.COPY_DST)
    dev.queue.write_buffer(source, 0, np.arange(16, dtype=np.float32))

    def submit_copy() -> None:
        encoder = dev.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(source, 0, readback, 0, 16)
        dev.queue.submit([encoder.finish()])

    def through_map_sync() -> bytes:
        submit_copy()
        readback.map_sync(wgpu.MapMode.READ, 0, 16)
        try:
            return bytes(readback.read_mapped(0, 16))
        finally:
            readback.unmap()

    def through_runtime() -> bytearray:
        submit_copy()
        return mapping.read_after_submit(dev.device, readback, 0, 16)

    print(f"{dev.describe()}")
    print(f"  submit + wgpu-py map_sync          {median_us(through_map_sync):8.1f} µs")
    path = "wgpu-native C calls" if mapping.NATIVE is not None else "wgpu-py (no C path here)"
    print(f"  submit + read_after_submit         {median_us(through_runtime):8.1f} µs ({path})")
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        value = torch.zeros(4, device="cuda")
        print(f"  PyTorch: a tiny kernel + .item()   {median_us(lambda: (value + 1).sum().item()):8.1f} µs")


if __name__ == "__main__":
    main()
