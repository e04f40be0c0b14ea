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
import tempfile
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


def ensure_runtime_dir() -> None:
    """XDG_RUNTIME_DIR set to a private folder of this user's where it is unset or no folder.

    Mesa's Vulkan drivers (lavapipe among them) look for a Wayland display when a Vulkan instance
    is made and print "XDG_RUNTIME_DIR is invalid or not set" to stderr without one. Compute needs
    no display; the variable only keeps a script's output clean, and a valid one is left alone."""
    current = os.environ.get("XDG_RUNTIME_DIR", "")
    if (current and os.path.isdir(current)) or not hasattr(os, "getuid"):  # a freedesktop variable
        return
    folder = os.path.join(tempfile.gettempdir(), f"meganeura-xdg-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.environ["XDG_RUNTIME_DIR"] = folder


ensure_runtime_dir()  # before the backend makes its Vulkan instance
NAME = backend_name()
wgpu = backend_module(NAME)
