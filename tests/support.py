"""Helpers shared by the test files: building one-op graphs, and checking that a compiled
program's GPU steps follow the numpy interpreter."""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.ops import infer_type


def leaf(graph: Graph, kind: str, name: str, shape: tuple[int, ...], dtype: str = "f32") -> int:
    """A new input/param/state leaf of `graph`."""
    return graph.add(kind, (), TensorType(tuple(shape), dtype), {"name": name, "shape": tuple(shape), "dtype": dtype})


def const(graph: Graph, value: float) -> int:
    """A new scalar f32 constant of `graph`."""
    return graph.add("const", (), TensorType((), "f32"), {"value": value})


def emit(graph: Graph, op: str, inputs: list[int], **attrs) -> int:
    """A new `op` node of `graph`, typed by the op table."""
    return graph.add(op, inputs, infer_type(op, [graph[i].type for i in inputs], attrs), attrs)


def interpreter_steps(program, feeds: list[dict[str, np.ndarray]]) -> tuple[list[float], dict[str, np.ndarray]]:
    """The program's training steps on the numpy interpreter (its traced, unfused graph), from its
    current parameters and its initial optimizer state: the losses and the final parameters."""
    params = program.state_dict()
    states = dict(program.traced.initial_states)
    losses = []
    for feed in feeds:
        result = interpret(program.graph, feed, params, {**states, **params})  # module buffers are states
        losses.append(float(result.outputs["loss"]))
        for name, value in result.updates.items():
            (params if name in params else states)[name] = value
    return losses, params


def assert_steps_follow_interpreter(program, feeds: list[dict[str, np.ndarray]]) -> list[float]:
    """Train on `feeds` on the GPU and on the interpreter; losses (rtol 1e-4) and final parameters
    (rtol 1e-3, float32 drift over several steps) must agree. Returns the GPU losses."""
    expected_losses, expected_params = interpreter_steps(program, feeds)
    losses = [program.train_step(**feed) for feed in feeds]
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-4, atol=1e-5)
    for name, value in program.state_dict().items():
        np.testing.assert_allclose(value, expected_params[name], rtol=1e-3, atol=1e-5, err_msg=name)
    return losses
