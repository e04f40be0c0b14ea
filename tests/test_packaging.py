"""Packaging: the wheel holds the whole package and its WGSL templates, and an installed meganeura
trains from outside the checkout; render.py finds the templates in a package or a checkout.

The wheel test builds from a copy of the files the wheel is made of (pyproject.toml, setup.py,
README.md, meganeura/, shaders/), so that it neither writes build/ into the checkout nor ships a
stale build/lib. It needs no network: `pip wheel --no-build-isolation` uses this environment's
setuptools (the dev extra brings it), and the fresh venv borrows this environment's copies of the
dependencies through a .pth file instead of downloading them — its own site-packages, which holds
the installed wheel, comes first on sys.path, and the test checks that this is the meganeura it ran.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from meganeura.codegen import render
from meganeura.codegen.render import TemplateError, load_template, template_path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_SOURCES = ("pyproject.toml", "setup.py", "README.md", "meganeura", "shaders")
DEPENDENCIES = ("numpy", "egglog", "wgpu", "networkx", "safetensors")
EXTRAS = {"examples", "interop", "plots", "dev"}

# Training steps as a user of the installed package writes them; the script prints what it ran with.
TRAIN_STEPS = """
import numpy as np
import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)

def train():
    mn.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 20), nn.ReLU(), nn.Linear(20, 5))
    inputs = {"x": mn.f32[8, 12], "y": mn.i32[8]}
    program = mn.compile(model, loss=loss_fn, inputs=inputs, optimizer=optim.Adam(lr=1e-2))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 12)).astype(np.float32)
    y = rng.integers(0, 5, size=8).astype(np.int32)
    return [program.train_step(x=x, y=y) for _ in range(5)]
"""
TRAIN_SCRIPT = (
    TRAIN_STEPS
    + """
import json, sys
from meganeura.codegen.render import template_path
report = {"meganeura": mn.__file__, "template": str(template_path("matmul")), "sys_path": sys.path}
print(json.dumps({**report, "losses": train()}))
"""
)


# -- where render.py finds the templates ----------------------------------------------------------


@pytest.fixture
def shader_dirs(tmp_path, monkeypatch):
    """Two empty template folders, (installed, checkout), in place of render.SHADER_DIRS."""
    dirs = (tmp_path / "package" / "shaders", tmp_path / "checkout" / "shaders")
    for folder in dirs:
        folder.mkdir(parents=True)
    monkeypatch.setattr(render, "SHADER_DIRS", dirs)
    load_template.cache_clear()
    yield dirs
    load_template.cache_clear()  # the real templates again for the tests that follow


def test_templates_are_found_in_the_checkout_when_the_package_has_none(shader_dirs):
    installed, checkout = shader_dirs
    (checkout / "probe.wgsl").write_text("// checkout\n")
    assert template_path("probe") == checkout / "probe.wgsl"
    assert load_template("probe") == "// checkout\n"


def test_the_packaged_templates_come_before_a_checkout(shader_dirs):
    installed, checkout = shader_dirs
    (installed / "probe.wgsl").write_text("// package\n//#include part\n")
    (installed / "part.wgsl").write_text("// package part")
    (checkout / "probe.wgsl").write_text("// checkout\n")
    (checkout / "part.wgsl").write_text("// checkout part\n")
    assert template_path("probe") == installed / "probe.wgsl"
    assert load_template("probe") == "// package\n// package part\n"


def test_a_missing_template_names_both_places(shader_dirs):
    installed, checkout = shader_dirs
    with pytest.raises(TemplateError) as error:
        load_template("probe")
    message = str(error.value)
    assert str(installed / "probe.wgsl") in message and str(checkout / "probe.wgsl") in message, message
    assert "'probe'" in message


def test_the_real_templates_resolve_in_this_checkout():
    # Run from the source tree (or an editable install), meganeura/shaders does not exist and
    # every template comes from the top-level shaders/; installed, from the package's copy.
    names = sorted(path.stem for path in (ROOT / "shaders").glob("*.wgsl"))
    assert names, ROOT / "shaders"
    for name in names:
        assert template_path(name).parent in render.SHADER_DIRS, name
        assert template_path(name).read_text() == (ROOT / "shaders" / f"{name}.wgsl").read_text(), name


# -- the wheel ------------------------------------------------------------------------------------


def run(command: list[str], cwd: Path, env: dict | None = None) -> str:
    """The standard output of `command`; its output in the failure when it fails."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{' '.join(map(str, command))} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def quiet_env() -> dict:
    """This process's environment without what would put a checkout on sys.path or reach a network."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_NO_INDEX="1")
    return env


def built_wheel(tmp_path: Path) -> Path:
    """A wheel built offline from a copy of the checkout's packaged files."""
    source = tmp_path / "source"
    source.mkdir()
    for name in WHEEL_SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir"]
    run([*command, "--wheel-dir", str(wheels), str(source)], cwd=tmp_path, env=quiet_env())
    (wheel,) = wheels.glob("meganeura-*.whl")
    return wheel


def site_packages(python: Path) -> Path:
    """The site-packages folder of the interpreter `python`."""
    return Path(
        run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=python.parent).strip()
    )


def dependency_dirs() -> list[str]:
    """The folders this process imports the dependencies from (none of them holds meganeura)."""
    dirs = {str(Path(importlib.util.find_spec(name).origin).parents[1]) for name in DEPENDENCIES}
    return sorted(dirs)


def checkout_losses() -> list[float]:
    """The losses of TRAIN_STEPS run by the checkout's meganeura, in this process."""
    namespace: dict = {}
    exec(TRAIN_STEPS, namespace)  # the same code as the installed run, so the two cannot drift apart
    return namespace["train"]()


@pytest.mark.gpu
def test_the_wheel_installs_into_a_fresh_venv_and_trains_from_outside_the_checkout(tmp_path):
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("building the wheel offline needs setuptools in this environment (pip install -e '.[dev]')")
    wheel = built_wheel(tmp_path)

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata_name,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        metadata = archive.read(metadata_name).decode()
    modules = {path.relative_to(ROOT).as_posix() for path in (ROOT / "meganeura").rglob("*.py")}
    shaders = {f"meganeura/shaders/{path.name}" for path in (ROOT / "shaders").glob("*.wgsl")}
    assert any(name.startswith("meganeura/bench/") for name in modules)
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"
    assert not shaders - names, f"templates missing from the wheel: {sorted(shaders - names)}"
    assert not [name for name in names if name.startswith("shaders/")], "templates outside the package"
    provided = {line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Provides-Extra:")}
    assert EXTRAS <= provided, provided
    for dependency in DEPENDENCIES:
        assert f"Requires-Dist: {dependency}" in metadata, dependency

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-cache-dir"]
    run([*install, str(wheel)], cwd=tmp_path, env=quiet_env())
    installed = site_packages(python)
    (installed / "borrowed_dependencies.pth").write_text("\n".join(dependency_dirs()) + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text(TRAIN_SCRIPT)
    result = json.loads(run([str(python), "train.py"], cwd=elsewhere, env=quiet_env()).splitlines()[-1])

    assert Path(result["meganeura"]).is_relative_to(installed), result["meganeura"]
    assert Path(result["template"]) == installed / "meganeura" / "shaders" / "matmul.wgsl", result["template"]
    assert not [entry for entry in result["sys_path"] if Path(entry or ".").resolve() == ROOT], result["sys_path"]
    losses = result["losses"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    np.testing.assert_allclose(losses, checkout_losses(), rtol=1e-6)
