"""The lowering registry: for each op that launches a kernel, the function that lowers a node of
it to a KernelSpec (WGSL text, bindings, grid).

Each kernel family module registers its lowerings beside them, `@lowering("matmul",
"fused_matmul")`; `codegen/lower.py` imports every family, so the table is complete wherever
lowering happens. A lowering is `fn(graph, node) -> KernelSpec`.
"""

from __future__ import annotations

from collections.abc import Callable

from meganeura.codegen.kernel import KernelSpec
from meganeura.ir.graph import Graph, Node

Lowering = Callable[[Graph, Node], KernelSpec]
LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops: str) -> Callable[[Lowering], Lowering]:
    """Decorator: register the function as the lowering of `ops`."""

    def register(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"op {op!r} has two lowerings: {LOWERINGS[op].__name__} and {fn.__name__}")
            LOWERINGS[op] = fn
        return fn

    return register
