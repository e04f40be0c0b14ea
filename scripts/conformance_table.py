"""Write the conformance table's sections into README.md: the "Supported PyTorch surface" list
(between `<!-- conformance: begin -->` and `<!-- conformance: end -->`) and the unsupported items
in the limits (between `<!-- conformance-limits: begin/end -->`), from tests/conformance.py.

    python scripts/conformance_table.py            # rewrite README.md's two blocks
    python scripts/conformance_table.py --print    # print them

tests/test_conformance.py checks that README.md holds what this writes.
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


def with_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}: begin -->\n).*?(<!-- {name}: end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no <!-- {name}: begin --> ... <!-- {name}: end --> block")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


def main() -> None:
    supported, limits = load_table().markdown_sections()
    if "--print" in sys.argv:
        print(supported)
        print(limits)
        return
    readme = ROOT / "README.md"
    text = with_block(with_block(readme.read_text(), "conformance", supported), "conformance-limits", limits)
    readme.write_text(text)


if __name__ == "__main__":
    main()
