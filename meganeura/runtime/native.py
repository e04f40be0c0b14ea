"""wgpu-native's C API, reached through the pinned wgpu-py's internals, in one place.

wgpu-py (0.32.0) wraps wgpu-native through cffi; its module `wgpu.backends.wgpu_native._api`
holds the `ffi` and `lib` objects and the helpers that build C structs and string views. Three
fast paths call the C functions directly: recording a step's dispatches (runtime/encoding.py),
reading results back without wgpu-py's map_sync (runtime/mapping.py) and shader modules without
runtime bounds checks (runtime/device.py). Each falls back to wgpu-py's public API, or refuses
with a reason, where `wgpu_native()` is None: a wgpu build without that module or without one of
the names the three use, which is what a wgpu upgrade that moves them looks like.
"""

from __future__ import annotations

import functools
from types import ModuleType

# What the fast paths read from the module (`lib` and `libf` are the C functions, checked and not).
NAMES = ("ffi", "lib", "libf", "new_struct_p", "to_c_string_view", "from_c_string_view", "GPUShaderModule")


@functools.cache
def wgpu_native() -> ModuleType | None:
    """wgpu-py's wgpu-native module, or None where this wgpu build lacks it or any of `NAMES`."""
    try:
        from wgpu.backends.wgpu_native import _api
    except ImportError:
        return None
    return _api if all(hasattr(_api, name) for name in NAMES) else None
