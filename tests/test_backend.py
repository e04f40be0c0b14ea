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
model = nn.Sequential(
    nn.Conv2d(2, 4, 3, padding=1), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 16), nn.ReLU(), nn.Linear(16, 5)
)


def loss(m, x, y):  # the NaN of a bad label, max's -inf start and max-pooling's: through mn_f32_bits
    logits = m(x)
    return F.cross_entropy(logits, y) + logits.amax(dim=1).mean()


program = mn.compile(
    model,
    loss=loss,
    inputs={"x": mn.f32[8, 2, 6, 6], "y": mn.i32[8]},
    optimizer=optim.AdamW(lr=1e-3),
)
rng = np.random.default_rng(0)
program.train_step(x=rng.standard_normal((8, 2, 6, 6), dtype=np.float32), y=rng.integers(0, 5, 8).astype(np.int32))
# Dawn's Null adapter binds 8 storage buffers a kernel, WebGPU's default: attention's backward keeps
# its dQ kernel there (passes/attention_scores.py), and the whole step builds.
from meganeura.bench.workloads import STEPS

lm = STEPS["smollm2"].build(small=True)
mn.compile(lm.model, loss=lm.loss, inputs=lm.inputs, optimizer=lm.optimizer).train_step(**lm.batch(rng))
print("pipelines", len(dev._pipelines))

# The bench's steps as planned for the H200 and for a CPU, every distinct kernel's module through
# Tint (a module, not a pipeline: Dawn's Null adapter allows 8 storage buffers a kernel, fewer than
# the dK/dV kernel writing dS binds).
from meganeura.compiler import compile_plan
from meganeura.target import Target

targets = (Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152), Target("lavapipe", 2, 31, cpu=True))
modules = set()
for name in ("resnet18", "gpt2", "smollm2"):  # convolutions, pooling, norms, attention, rope, max
    workload = STEPS[name].build(small=True)
    for target in targets:
        plan = compile_plan(workload.model, workload.loss, workload.inputs, workload.optimizer, target=target)
        for kernel in plan.compiled.kernels:
            if kernel.wgsl not in modules:
                dev.device.create_shader_module(code=kernel.wgsl)
                modules.add(kernel.wgsl)
print("modules", len(modules))
"""


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_the_dawn_backend_builds_a_training_step_through_tint():
    """Steps under MEGANEURA_BACKEND=dawn: the package, the C fast paths it shares with wgpu-native
    (dispatch recording) and those it does not (readback); every pipeline of a small conv net's
    step and of the small SmolLM2 step on an adapter of 8 storage buffers a kernel, and every
    module of the bench's small ResNet-18, GPT-2 and SmolLM2 steps planned for the H200 and for
    lavapipe, through Tint."""
    env = {**os.environ, backend.BACKEND_ENV: "dawn", "WGPU_BACKEND_TYPE": "Null"}
    env.pop("MEGANEURA_ADAPTER", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DAWN_STEP)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pipelines, modules = (int(done.stdout.split(word)[1].split()[0]) for word in ("pipelines", "modules"))
    assert pipelines >= 30 and modules >= 100, done.stdout


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_the_tensor_core_probe_compiles_through_tint():
    """benchmarks/tensor_core_split.py (a probe for the H200, not the compiler's) keeps compiling:
    every kernel it would time on two shapes, subgroup matrices included, goes through Tint."""
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tensor_core_split.py")
    done = subprocess.run(
        [sys.executable, script, "--validate", "--shapes", "lm-up,lm-kv"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = [line.removeprefix("compiled ") for line in done.stdout.splitlines() if line.startswith("compiled ")]
    assert compiled == ["lm-up 2048x576x1536", "lm-up-dW 576x2048x1536", "lm-kv 2048x576x192"]


DAWN_UNCHECKED = """
import dataclasses
import numpy as np
import meganeura as mn
from meganeura import functional as F, nn, optim
from meganeura.runtime import device
from wgpudawn.backends.dawn import extras

dev = device.default_device()
assert dev.unchecked_everywhere and "disable_robustness" in extras.get_toggles(dev.device)
model = nn.Sequential(nn.Linear(13, 21), nn.GELU(), nn.LayerNorm(21), nn.Linear(21, 5))
program = mn.compile(
    model,
    loss=lambda m, x, y: F.cross_entropy(m(x), y),
    inputs={"x": mn.f32[7, 13], "y": mn.i32[7]},
    optimizer=optim.AdamW(lr=1e-3),
)
rng = np.random.default_rng(0)
program.train_step(x=rng.standard_normal((7, 13), dtype=np.float32), y=rng.integers(0, 5, 7).astype(np.int32))
kernels = program.executable.kernels
print("trusted", sum(k.trusted for k in kernels), "of", len(kernels))
try:
    dev.pipeline(dataclasses.replace(kernels[0], entry_point="unchecked_kernel"))  # not among the trusted
except RuntimeError as error:
    print("refused:", error)
"""


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_unchecked_kernels_on_dawn_turn_the_checks_off_for_the_device_and_refuse_untrusted_kernels():
    """MEGANEURA_UNCHECKED_KERNELS=1 under Dawn (runtime/device.py): the device gets Dawn's
    `disable_robustness` toggle, a step whose kernels are all trusted builds and runs, and a kernel
    not marked trusted is refused by name when its pipeline is made (Dawn's Null backend)."""
    env = {**os.environ, backend.BACKEND_ENV: "dawn", "WGPU_BACKEND_TYPE": "Null", "MEGANEURA_UNCHECKED_KERNELS": "1"}
    env.pop("MEGANEURA_ADAPTER", None)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DAWN_UNCHECKED)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trusted, _, total = done.stdout.split("trusted ")[1].split("\n")[0].split()
    assert int(trusted) == int(total) >= 5, done.stdout
    assert "refused: MEGANEURA_UNCHECKED_KERNELS=1 on Dawn turns the runtime bounds checks off" in done.stdout
    assert "is not one whose indexing the suite checks at ragged shapes" in done.stdout


def test_tensor_cores_are_asked_for_only_on_dawn(monkeypatch):
    """MEGANEURA_TENSOR_CORES=1 (codegen/matmul_halves.py) on a backend without subgroup matrices
    says what it needs, rather than running the f32 kernels the user did not ask for."""
    from meganeura.runtime import device

    monkeypatch.delenv(device.TENSOR_CORES_ENV, raising=False)
    assert device.tensor_cores_wanted() is False
    monkeypatch.setenv(device.TENSOR_CORES_ENV, "1")
    monkeypatch.setattr(device, "BACKEND", "wgpu")
    with pytest.raises(RuntimeError, match="MEGANEURA_TENSOR_CORES=1 needs the Dawn backend"):
        device.tensor_cores_wanted()
    monkeypatch.setattr(device, "BACKEND", "dawn")
    assert device.tensor_cores_wanted() is True
