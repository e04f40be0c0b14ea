"""The C API under the backend's Python wrapper, reached through its internals, in one place.

wgpu-py (0.32.0) wraps wgpu-native through cffi, and wgpudawn wraps Dawn the same way; each
package's `_api` module holds the `ffi` and `lib` objects and the helpers that build C structs
and string views. Three fast paths call the C functions directly: recording a step's dispatches
(runtime/encoding.py: functions of webgpu.h, which both libraries export), reading results back
without wgpu-py's map_sync (runtime/mapping.py: wgpu-native's `wgpuDevicePoll`) and shader
modules without runtime bounds checks (runtime/device.py: wgpu-native's
`wgpuDeviceCreateShaderModuleTrusted`). Each falls back to the public API, or refuses with a
reason, where its module is None: another backend, or a build without the module or without one
of the names they use, which is what an upgrade that moves them looks like.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from meganeura.runtime.backend import NAME

# What the fast paths read from the module (`lib` and `libf` are the C functions, checked and not).
NAMES = ("ffi", "lib", "libf", "new_struct_p", "to_c_string_view", "from_c_string_view", "GPUShaderModule")
API_MODULES = {"wgpu": "wgpu.backends.wgpu_native._api", "dawn": "wgpudawn.backends.dawn._api"}


@functools.cache
def webgpu_c() -> ModuleType | None:
    """The backend's cffi module, or None where this build lacks it or any of `NAMES`."""
    try:
        api = importlib.import_module(API_MODULES[NAME])
    except ImportError:
        return None
    return api if all(hasattr(api, name) for name in NAMES) else None


def wgpu_native() -> ModuleType | None:
    """wgpu-py's wgpu-native module, or None on another backend or where webgpu_c() is None."""
    return webgpu_c() if NAME == "wgpu" else None
