"""The wgpu runtime: device selection, and Executable (a step's buffers, pipelines and dispatches, built once)."""

from meganeura.runtime.device import Device, default_device
from meganeura.runtime.executable import DeviceStorage, Executable

__all__ = ["Device", "DeviceStorage", "Executable", "default_device"]
