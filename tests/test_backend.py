"""The backend choice (runtime/backend.py): MEGANEURA_BACKEND, its errors, and Dawn's path checked
through Dawn's Null backend, which runs Tint on every kernel and executes nothing (Dawn refuses
Mesa 22.3's lavapipe, so no numbers come from Dawn here)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

from meganeura.runtime import backend


def test_the_backend_is_named_by_the_environment(monkeypatch):
    monkeypatch.delenv(backend.BACKEND_ENV, raising=False)
    assert backend.backend_name() == "wgpu" and backend.NAME == "wgpu"
    monkeypatch.setenv(backend.BACKEND_ENV, " Dawn ")
    assert backend.backend_name() == "dawn"
    monkeypatch.setenv(backend.BACKEND_ENV, "vulkan")
    with pytest.raises(RuntimeError, match="'vulkan' is not a backend; choose one of wgpu, dawn"):
        backend.backend_name()


def test_a_backend_whose_package_is_missing_says_what_to_install(monkeypatch):
    monkeypatch.setitem(backend.PACKAGES, "dawn", "wgpudawn_not_installed")
    with pytest.raises(
        RuntimeError, match="needs the wgpudawn_not_installed package.*pip install wgpudawn_not_installed"
    ):
        backend.backend_module("dawn")


DAWN_STEP = """
import numpy as np
import meganeura as mn
from meganeura import functional as F, nn, optim
from meganeura.runtime import backend, device, encoding, mapping, native

assert backend.wgpu.__name__ == "wgpudawn", backend.wgpu
assert native.webgpu_c().__name__ == "wgpudawn.backends.dawn._api" and native.wgpu_native() is None
assert encoding.NATIVE is not None and mapping.NATIVE is None  # C dispatch recording; public readback
dev = device.default_device()
assert dev.describe() == "Null backend — Null, Unknown, through Dawn", dev.describe()
model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
program = mn.compile(
    model,
    loss=lambda m, x, y: F.cross_entropy(m(x), y),  # its NaN for bad labels goes through mn_f32_bits
    inputs={"x": mn.f32[8, 12], "y": mn.i32[8]},
    optimizer=optim.AdamW(lr=1e-3),
)
rng = np.random.default_rng(0)
program.train_step(x=rng.standard_normal((8, 12), dtype=np.float32), y=rng.integers(0, 5, 8).astype(np.int32))
print("pipelines", len(dev._pipelines))
"""


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_the_dawn_backend_builds_a_training_step_through_tint():
    """A step under MEGANEURA_BACKEND=dawn: the package, the C fast paths it shares with wgpu-native
    (dispatch recording) and those it does not (readback), and every pipeline through Tint."""
    env = {**os.environ, backend.BACKEND_ENV: "dawn", "WGPU_BACKEND_TYPE": "Null"}
    env.pop("MEGANEURA_ADAPTER", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DAWN_STEP)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split("pipelines")[1]) >= 5, done.stdout
