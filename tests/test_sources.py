"""What the sources may not say: a path outside the repository (a reader of a clone cannot open
it; the fact it stood for is written where it is used)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTSIDE = re.compile(r"(\.\./shared|shared/notes|shared/reference|/work/)")


def test_no_source_names_a_path_outside_the_repository():
    folders = ("meganeura", "shaders", "tests", "benchmarks", "scripts", "examples", "docs")
    files = [ROOT / "README.md"]
    kinds = (".py", ".wgsl", ".md")
    files += [path for folder in folders for path in (ROOT / folder).rglob("*") if path.suffix in kinds]
    found = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        if path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert len(files) > 200 and not found, found
