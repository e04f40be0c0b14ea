"""`python -m meganeura`: `devices` lists the adapters and marks the default; every subcommand has
its `--help`; `explain` writes no file unless `--out` asks, and its stop cannot be swallowed by a
script's `except Exception`; kernels of an nn.Sequential name the lines that constructed its layers."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.__main__ import main
from meganeura.compiler import StopExplain, explain_only
from meganeura.ir.op import ShapeError
from meganeura.runtime.device import ADAPTER_ENV, select_adapter

HERE = os.path.basename(__file__)


# -- devices ------------------------------------------------------------------------------------


def on_lavapipe() -> bool:
    """Whether the default adapter is lavapipe (CI, this project's machine): the tests below check
    its listing in detail there, and the listing of whatever adapter is the default elsewhere."""
    return "llvmpipe" in select_adapter().info["device"]


@pytest.mark.gpu
def test_devices_lists_the_adapters_and_marks_the_default(capsys, monkeypatch):
    monkeypatch.delenv(ADAPTER_ENV, raising=False)
    assert main(["devices"]) == 0
    lines = capsys.readouterr().out.splitlines()
    marked = [index for index, line in enumerate(lines) if line.startswith("* ")]
    assert len(marked) == 1, lines  # exactly one default
    default = marked[0]
    info = select_adapter().info
    assert info["device"] in lines[default]
    assert lines[default + 1].strip().startswith(f"backend {info['backend_type']}, type {info['adapter_type']}")
    assert "default: wgpu's high-performance adapter" in lines[default + 2]
    text = "\n".join(lines)
    assert "plans for: " in text and "features (" in text and "max-storage-buffer-binding-size" in text
    if on_lavapipe():
        assert lines[default + 1].strip().startswith("backend Vulkan, type CPU")
        assert "max-storage-buffer-binding-size 128 MiB" in text
        # the OpenGL adapter for the same CPU is listed, unmarked
        assert any(line.startswith("  ") and "llvmpipe" in line for line in lines[:default] + lines[default + 1 :])
        assert "backend OpenGL" in text


@pytest.mark.gpu
def test_devices_json_has_features_limits_and_the_adapter_programs_run_on(capsys, monkeypatch):
    monkeypatch.delenv(ADAPTER_ENV, raising=False)
    assert main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    defaults = [a for a in data["adapters"] if a["default"]]
    assert len(defaults) == 1 and data["error"] is None
    chosen, info = defaults[0], select_adapter().info
    assert (chosen["name"], chosen["backend"], chosen["type"]) == (
        info["device"], info["backend_type"], info["adapter_type"],
    )  # fmt: skip
    assert chosen["target"]["cpu"] is (info["adapter_type"] == "CPU")
    assert chosen["limits"]["max-compute-workgroup-storage-size"] == chosen["target"]["workgroup_memory"]
    if on_lavapipe():
        assert {"subgroup", "timestamp-query", "shader-f16"} <= set(chosen["features"])  # platform.md's lavapipe
        assert chosen["limits"]["max-storage-buffer-binding-size"] == 128 << 20
        assert chosen["limits"]["max-compute-workgroup-storage-size"] == 32 << 10


@pytest.mark.gpu
def test_devices_follows_meganeura_adapter(capsys, monkeypatch):
    if not on_lavapipe():
        pytest.skip("picks lavapipe by name: needs Mesa's llvmpipe, the default adapter in CI")
    monkeypatch.setenv(ADAPTER_ENV, "cpu")  # both llvmpipe adapters match; the ranking picks Vulkan
    assert main(["devices", "--all-limits"]) == 0
    lines = capsys.readouterr().out.splitlines()
    default = next(index for index, line in enumerate(lines) if line.startswith("* "))
    assert "backend Vulkan" in lines[default + 1] and f"default: {ADAPTER_ENV}='cpu'" in lines[default + 2]
    assert "max-texture-dimension-2d 16,384" in "\n".join(lines)  # --all-limits: not only the raised ones
    monkeypatch.setenv(ADAPTER_ENV, "no such adapter")
    assert main(["devices"]) == 1
    captured = capsys.readouterr()
    assert not any(line.startswith("* ") for line in captured.out.splitlines())
    assert "no default adapter" in captured.err and "matches no adapter" in captured.err


# -- help ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, option",
    [("devices", "--all-limits"), ("explain", "--out"), ("profile", "--trace"), ("bench", "--steps")],
)
def test_every_subcommand_has_help(command, option, capsys):
    with pytest.raises(SystemExit) as exit:
        main([command, "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m meganeura {command}") and option in out


def test_top_level_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    for command in ("devices", "explain", "profile", "bench"):
        assert f"    {command} " in out  # one line of help each


# -- explain ------------------------------------------------------------------------------------

SCRIPT = """
import numpy as np
import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
program = mn.compile(model, loss=lambda m, x, y: F.cross_entropy(m(x), y),
                     inputs={"x": mn.f32[4, 6], "y": mn.i32[4]}, optimizer=optim.SGD(lr=0.1))
"""


def write_script(folder, body: str):
    script = folder / "tiny_model.py"
    script.write_text(textwrap.dedent(SCRIPT) + textwrap.dedent(body))
    return script


def files_under(folder) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(root, name), folder) for root, _, names in os.walk(folder) for name in names
    )


def test_explain_without_out_writes_no_file(tmp_path, monkeypatch, capsys):
    script = write_script(tmp_path, "program.train_step(x=np.zeros((4, 6), np.float32), y=np.zeros(4, np.int32))\n")
    monkeypatch.chdir(tmp_path)
    assert main(["explain", str(script)]) == 0
    printed = capsys.readouterr().out
    assert "=== program 0: training step" in printed and "Kernels (" in printed
    assert "wrote " not in printed and "pass --out DIR" in printed
    assert files_under(tmp_path) == ["tiny_model.py"]  # no out/explain, no .dot, no .svg


def test_explain_with_out_writes_the_picture_there(tmp_path, monkeypatch, capsys):
    script = write_script(tmp_path, "program.train_step(x=np.zeros((4, 6), np.float32), y=np.zeros(4, np.int32))\n")
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "--out", "pictures", str(script)]) == 0
    assert f"wrote {os.path.join('pictures', 'tiny_model-0.dot')}" in capsys.readouterr().out
    assert (tmp_path / "pictures" / "tiny_model-0.dot").read_text().startswith("digraph step {")
    assert "pass --out DIR" not in capsys.readouterr().out


def test_a_script_that_catches_exception_cannot_swallow_the_stop(tmp_path, capsys):
    assert issubclass(StopExplain, BaseException) and not issubclass(StopExplain, Exception)
    script = write_script(
        tmp_path,
        """
        for step in range(3):
            try:
                loss = program.train_step(x=np.zeros((4, 6), np.float32), y=np.zeros(4, np.int32))
            except Exception as error:  # what a training loop that logs and goes on does
                print(f"step {step} failed: {error!r}")
        raise SystemExit("explain must stop the script at its first step")
        """,
    )
    assert main(["explain", str(script)]) == 0  # the SystemExit after the loop was never reached
    printed = capsys.readouterr().out
    assert "failed" not in printed and "=== program 0: training step" in printed


# -- source lines of nn.Sequential ----------------------------------------------------------------


def line_of(marker: str) -> str:
    """`test_cli.py:N` of the line of this file that ends with `# marker`."""
    with open(__file__) as file:
        numbers = [n for n, line in enumerate(file, 1) if line.rstrip().endswith(f"# {marker}")]
    assert len(numbers) == 1, marker
    return f"{HERE}:{numbers[0]}"


def explained(model, loss_fn):
    with explain_only():
        program = mn.compile(
            model, loss=loss_fn, inputs={"x": mn.f32[5, 6], "y": mn.i32[5]}, optimizer=optim.SGD(lr=0.1)
        )
    return program.report().kernels


def test_kernels_of_a_sequential_name_the_lines_that_constructed_its_layers():
    model = nn.Sequential(
        nn.Linear(6, 7),  # first layer
        nn.ReLU(),  # activation
        nn.Sequential(nn.Linear(7, 3)),  # nested layer
    )
    loss = line_of("the loss")
    kernels = explained(model, lambda m, x, y: F.cross_entropy(m(x), y))  # the loss
    first, activation, nested = line_of("first layer"), line_of("activation"), line_of("nested layer")
    forward = [k for k in kernels if k.op == "fused_matmul" and "transpose_b" in k.what]
    assert [set(k.sources) for k in forward] == [{first, activation}, {nested}]  # linear+relu fused, then the last
    sources = {source for k in kernels for source in k.sources}
    assert {first, activation, nested, loss} <= sources  # the backward keeps the layers' lines too
    cross_entropy = [k for k in kernels if k.op == "cross_entropy_rows"]
    assert cross_entropy and all(k.sources == (loss,) for k in cross_entropy)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)  # block's layer

    def forward(self, x):
        return self.fc(x)  # block's forward


def test_a_layer_called_from_user_code_keeps_the_calling_line():
    kernels = explained(nn.Sequential(Block()), lambda m, x, y: F.cross_entropy(m(x), y))
    forward = [k for k in kernels if k.op == "fused_matmul" and "transpose_b" in k.what]
    assert [k.sources for k in forward] == [(line_of("block's forward"),)]
    assert line_of("block's layer") not in {s for k in kernels for s in k.sources}


def test_a_shape_error_inside_a_sequential_names_the_layer():
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(9, 3))  # mismatched layers
    with pytest.raises(ShapeError) as error:
        explained(model, lambda m, x, y: F.cross_entropy(m(x), y))
    assert str(error.value).startswith(line_of("mismatched layers") + ":")
