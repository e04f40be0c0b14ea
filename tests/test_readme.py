"""The README's Python examples run as pasted (a user's first contact: the quick start and the
porting example), each in a fresh interpreter from a scratch folder, and print what they say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


@pytest.mark.gpu
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_a_readme_example_runs_as_pasted(index, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(python_blocks()[index])
    path = os.pathsep.join(filter(None, (str(README.parent), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path}  # the project first, then what this interpreter was given
    command = [sys.executable, str(script)]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    if "mn.summary" in python_blocks()[index]:
        assert "Total params" in run.stdout and "Frozen params: 8" in run.stdout  # the frozen conv bias
    if "program.report()" in python_blocks()[index]:
        assert "e-graph" in run.stdout.lower()
