"""The package's layers, read from every import statement of its source (module level and inside
functions alike): the IR below everything, the e-graph stage and the passes after extraction above
it, the code generator and the runtime below the optimizer and the DSL. An import that runs back up
is a failure unless it is one of KNOWN_BACK_EDGES, the ones the kernel-layer issue removes; that
list only shrinks: an entry no longer in the source fails too, so that it is struck when its edge
goes."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "meganeura"

# What each layer may not import (by module prefix).
DSL = ("meganeura.nn", "meganeura.functional", "meganeura.tensor", "meganeura.compiler", "meganeura.optim")
FORBIDDEN = {
    "meganeura.ir": ("meganeura.rewrite", "meganeura.passes", "meganeura.codegen", "meganeura.runtime",
                     "meganeura.parameter", *DSL),
    "meganeura.rewrite": ("meganeura.passes", "meganeura.codegen", "meganeura.runtime", *DSL),
    "meganeura.passes": ("meganeura.runtime", *DSL),
    "meganeura.codegen": ("meganeura.rewrite", "meganeura.passes", "meganeura.runtime", *DSL),
    "meganeura.runtime": ("meganeura.rewrite", "meganeura.passes", *DSL),
    "meganeura.target": ("meganeura.",),
}  # fmt: skip

# (importing module, imported module): the cost model's questions answered by the emitters'
# modules (issue: one optimizer and one kernel layer, item 1).
KNOWN_BACK_EDGES = {
    ("meganeura.rewrite.conv", "meganeura.codegen.conv"),
    ("meganeura.rewrite.conv", "meganeura.codegen.winograd"),
    ("meganeura.rewrite.cost", "meganeura.codegen.lower"),
    ("meganeura.rewrite.matmul", "meganeura.codegen.matmul"),
    ("meganeura.rewrite.reductions", "meganeura.codegen.reduce"),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement of the file names (`from a.b import c` names a.b, and
    a.b.c where that is a module of the package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists():
                    names.add(candidate)
    return {name for name in names if name == "meganeura" or name.startswith("meganeura.")}


def edges() -> set[tuple[str, str]]:
    return {(module_name(path), imported) for path in PACKAGE.rglob("*.py") for imported in imported_modules(path)}


def within(module: str, prefix: str) -> bool:
    return module == prefix.rstrip(".") or module.startswith(prefix if prefix.endswith(".") else prefix + ".")


def back_edges() -> set[tuple[str, str]]:
    """The imports that break FORBIDDEN."""
    return {
        (source, target)
        for source, target in edges()
        for layer, forbidden in FORBIDDEN.items()
        if within(source, layer) and any(within(target, banned) for banned in forbidden)
    }


def test_imports_run_down_the_layers():
    new = back_edges() - KNOWN_BACK_EDGES
    assert not new, f"imports that run back up the layers: {sorted(new)}"


def test_the_known_back_edges_are_all_still_there():
    gone = KNOWN_BACK_EDGES - back_edges()
    assert not gone, f"strike these from KNOWN_BACK_EDGES, they are gone: {sorted(gone)}"


def test_the_reader_sees_imports_inside_functions_and_of_submodules(tmp_path):
    """The checker is not blind: it finds a function-level import, and a module named by `from`."""
    assert ("meganeura.rewrite.cost", "meganeura.codegen.lower") in edges()
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from meganeura.codegen import matmul\n    import meganeura.runtime.device\n")
    assert imported_modules(source) == {"meganeura.codegen", "meganeura.codegen.matmul", "meganeura.runtime.device"}
