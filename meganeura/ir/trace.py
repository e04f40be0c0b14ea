"""Tracing: the context that records the user's code as IR while `compile()` runs it.

A `Tracer` owns one Graph. Every op the DSL applies goes through `Tracer.emit`, which checks the
attributes against the op's schema and the shapes with the op's shape rule, and remembers the
user's file and line (the first stack frame outside this package, or, when a layer's forward was
called by the library itself — `nn.Sequential` calling its children — the line that constructed
that layer: `user_source_line`); a mismatch is raised as a ShapeError whose message starts with
that file and line. The tracer also keeps which node each
of the model's parameters and buffers reads as (`bind`, `node_of`), and the new values of module
buffers that the forward updates (`update_buffer`). It knows nothing of the DSL's Tensor
(`meganeura/tensor.py`): it speaks in node ids.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from meganeura.ir import ops  # noqa: F401  (registers every op)
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import ShapeError, checked_type, operand_types
from meganeura.ir.ops.random import RNG_STATE, RNG_STATE_TYPE

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Code objects of the calls that run a layer's forward (nn.Module.__call__), registered by nn/module.py
# (which imports this module, so it cannot be imported from here).
LAYER_CALLS: set = set()


def in_package(frame) -> bool:
    return os.path.abspath(frame.f_code.co_filename).startswith(PACKAGE_DIR + os.sep)


def frame_line(frame) -> str:
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def user_source_line() -> str:
    """`file:line` of the innermost stack frame that is not in meganeura's own code, unless a layer
    whose forward is ours was called from our own code first (a child of nn.Sequential): then the
    line where the user constructed that layer, which says more than the line of the loss that
    called the whole Sequential."""
    frame = sys._getframe(1)
    while frame is not None:
        if not in_package(frame):
            return frame_line(frame)
        if frame.f_code in LAYER_CALLS and frame.f_back is not None and in_package(frame.f_back):
            constructed = getattr(frame.f_locals.get("self"), "_source", None)
            if constructed:
                return constructed
        frame = frame.f_back
    return "<meganeura>"


class Tracer:
    """Builds one Graph while the user's code runs."""

    def __init__(self) -> None:
        self.graph = Graph()
        self.const_cache: dict[float, int] = {}
        self._bound: dict[int, int] = {}  # id(Parameter or Buffer) -> the node it reads as now
        self._buffer_leaves: dict[int, int] = {}  # id(Buffer) -> its state leaf (which names its update)
        self.streams = 0  # random nodes traced so far: the next one's stream number (ir/ops/random.py)

    def emit(self, op: str, inputs: list[int], **attrs: Any) -> int:
        """Append `op(inputs)` with checked attributes and type and the user's source line; its id."""
        source = user_source_line()
        try:
            canonical, out_type = checked_type(op, operand_types(self.graph, inputs), attrs)
        except ShapeError as error:
            raise ShapeError(f"{source}: {error}") from None
        return self.graph.add(op, inputs, out_type, canonical, (source,))

    def leaf(self, op: str, name: str, type: TensorType) -> int:
        """A new input/param/state leaf."""
        attrs = {"name": name, "shape": type.shape, "dtype": type.dtype}
        return self.graph.add(op, (), type, attrs, (user_source_line(),))

    def const(self, value: float) -> int:
        """A scalar f32 constant, shared between uses of the same value."""
        value = float(value)
        if value not in self.const_cache:
            self.const_cache[value] = self.graph.add("const", (), TensorType((), "f32"), {"value": value})
        return self.const_cache[value]

    def rng_state(self) -> int:
        """The node of the step's RNG state leaf (ir/ops/random.py), made on first use."""
        leaf = self.graph.leaves("state").get(RNG_STATE)
        return leaf.id if leaf is not None else self.leaf("state", RNG_STATE, RNG_STATE_TYPE)

    def next_stream(self) -> int:
        """The stream number of a new random node: 0, 1, 2… in trace order, one per node."""
        self.streams += 1
        return self.streams - 1

    # -- the model's persistent values ---------------------------------------------------------

    def bind(self, owner: object, node: int) -> None:
        """From now on `owner` (a Parameter or module Buffer) reads as node `node` in this trace."""
        self._bound[id(owner)] = node

    def node_of(self, owner: object) -> int | None:
        """The node `owner` reads as in this trace, or None if it is not bound."""
        return self._bound.get(id(owner))

    def update_buffer(self, owner: object, value: int) -> str:
        """Record `value` as the new value of a module buffer at the end of the step (its leaf's
        update); later reads of the buffer in this trace see `value`. Returns the leaf's name."""
        leaf = self._buffer_leaves.setdefault(id(owner), self._bound[id(owner)])
        name = self.graph[leaf].attr("name")
        self.graph.updates[name] = value
        self._bound[id(owner)] = value
        return name

    def replace_graph(self, graph: Graph, owners: dict[str, object]) -> None:
        """Continue on `graph`, a rewritten copy of this trace's graph whose leaves keep their names;
        `owners` maps each param leaf's name to the object bound to it."""
        self.graph = graph
        leaves = graph.leaves("param")
        self._bound = {id(owner): leaves[name].id for name, owner in owners.items() if name in leaves}
        self.const_cache = {n.attr("value"): n.id for n in graph if n.op == "const"}


_ACTIVE: list[Tracer] = []


@contextlib.contextmanager
def tracing(tracer: Tracer) -> Iterator[Tracer]:
    _ACTIVE.append(tracer)
    try:
        yield tracer
    finally:
        _ACTIVE.pop()


def active_tracer() -> Tracer:
    if not _ACTIVE:
        raise RuntimeError(
            "meganeura ops only run while compile() traces a model; call mn.compile(...) instead of the model"
        )
    return _ACTIVE[-1]
