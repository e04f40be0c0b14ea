"""Which WebGPU implementation runs the kernels, chosen once per process.

MEGANEURA_BACKEND names it:
- `wgpu` (the default): wgpu-native through wgpu-py; naga compiles the WGSL.
- `dawn`: Dawn, the WebGPU of Chrome, through wgpudawn (`pip install "meganeura[dawn]"`), which
  offers wgpu-py's API over Dawn; Tint compiles the WGSL. Mesa 22.3's lavapipe is refused by Dawn,
  so this backend needs a GPU.

`wgpu` below is the chosen package. The runtime uses it through wgpu-py's API, which both share;
its fast paths call the C functions of webgpu.h that both export (runtime/native.py).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

BACKEND_ENV = "MEGANEURA_BACKEND"
PACKAGES = {"wgpu": "wgpu", "dawn": "wgpudawn"}


def backend_name() -> str:
    """The backend MEGANEURA_BACKEND asks for ("wgpu" when unset)."""
    name = os.environ.get(BACKEND_ENV, "").strip().lower() or "wgpu"
    if name not in PACKAGES:
        raise RuntimeError(f"{BACKEND_ENV}={name!r} is not a backend; choose one of {', '.join(PACKAGES)}")
    return name


def backend_module(name: str) -> ModuleType:
    """The package that implements backend `name`, with the install command where it is missing."""
    try:
        return importlib.import_module(PACKAGES[name])
    except ImportError as error:
        raise RuntimeError(
            f"{BACKEND_ENV}={name} needs the {PACKAGES[name]} package, which does not import here ({error}); "
            f"install it with `pip install {PACKAGES[name]}`"
        ) from error


NAME = backend_name()
wgpu = backend_module(NAME)
