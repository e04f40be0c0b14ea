"""Write the conformance table's sections, from tests/conformance.py: the supported surface into
docs/supported-ops.md (between `<!-- conformance: begin -->` and `<!-- conformance: end -->`) and
the unsupported items into the README's limits (between `<!-- conformance-limits: begin/end -->`).

    python scripts/conformance_table.py            # rewrite both blocks
    python scripts/conformance_table.py --print    # print them

tests/test_conformance.py checks that both files hold what this writes.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_table():
    spec = importlib.util.spec_from_file_location("conformance", ROOT / "tests" / "conformance.py")
    table = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("conformance", table)
    spec.loader.exec_module(table)
    return table


def rewrite_block(path: Path, name: str, body: str) -> None:
    """The file at `path` with its block `name` replaced by `body`."""
    pattern = re.compile(rf"(<!-- {name}: begin -->\n).*?(<!-- {name}: end -->)", re.S)
    text = path.read_text()
    if not pattern.search(text):
        raise SystemExit(f"{path.name} has no <!-- {name}: begin --> ... <!-- {name}: end --> block")
    path.write_text(pattern.sub(lambda m: m.group(1) + body + m.group(2), text))


def main() -> None:
    supported, limits = load_table().markdown_sections()
    if "--print" in sys.argv:
        print(supported)
        print(limits)
        return
    rewrite_block(ROOT / "docs" / "supported-ops.md", "conformance", supported)
    rewrite_block(ROOT / "README.md", "conformance-limits", limits)


if __name__ == "__main__":
    main()
