"""Gated training steps: updates that a step applies or leaves out at run time, decided on the
GPU, for gradient accumulation (`compile(accumulate=k)`) and the finiteness check
(`compile(check_finite=True)`).

Both are built around the optimizer, never inside it: after `Optimizer.build_updates` has put
each parameter's and state's new value in `graph.updates`, `gate_updates` replaces that value by
`where(gate, new, old)`, with `gate` a 0-d mask (1.0 or 0.0) computed in the same step. A step
whose gate is 0 leaves every parameter and optimizer state as it was, and any optimizer works
unchanged. The price: an update can no longer be written in place (the old value is still read
by the `where`), so each gated update has a buffer and an end-of-step copy of its own, and the
multi-tensor grouping of the fused updates (passes/multi_tensor.py) does not apply; and a step
whose gate is 0 still computes the update it throws away (the k − 1 micro-steps of a cycle too).
benchmarks/gated_step.py measures what that costs.

- Accumulation: a state per parameter, `<name>.grad_accum`, and a step counter,
  `accumulate.micro_step` (`TracedStep.step_states`: in checkpoints, not in the optimizer's state). Each step
  adds gradient/k to the accumulators; the step that brings the counter to k gives the optimizer
  the accumulated sum, applies its update and resets the accumulators and the counter to 0. That
  is what `(loss / k).backward()` k times and then `optimizer.step()` do in PyTorch.
- Finiteness: the step counts the non-finite elements of every float input, of the loss and of
  every parameter's gradient (before accumulation and clipping) into the output `nonfinite`, one
  count per checked value in the order of `finite_checks`; the gate is 1 when all are 0, and it
  gates every update, the accumulators, the counter and the module buffers too (BatchNorm's
  running statistics), so a bad batch changes nothing.
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.autodiff import GradBuilder
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import op_def
from meganeura.optim import ParamGrad

ACCUMULATOR_SUFFIX = ".grad_accum"
MICRO_STEP = "accumulate.micro_step"
NONFINITE = "nonfinite"  # the output: non-finite elements per checked value


def leaf_nodes(graph: Graph) -> dict[str, int]:
    """The `param` and `state` leaves by name."""
    return {node.attr("name"): node.id for node in graph if node.op in ("param", "state")}


def state_leaf(builder: GradBuilder, name: str, shape: tuple[int, ...]) -> int:
    attrs = {"name": name, "shape": shape, "dtype": "f32"}
    return builder.graph.add("state", (), TensorType(shape, "f32"), attrs, builder.sources)


def nonfinite_count(builder: GradBuilder, value: int) -> int:
    """A 0-d node: how many elements of `value` are NaN or ±∞."""
    bad = builder.emit("sub", [builder.const(1.0), builder.emit("isfinite", [value])])
    rank = builder.graph[value].type.rank
    return builder.emit("sum", [bad], axes=tuple(range(rank))) if rank else bad


def joined(builder: GradBuilder, parts: list[int]) -> int:
    """The 1-d nodes `parts` concatenated, through a tree of concats of as many operands as one
    concat node takes (its e-graph form has a fixed most)."""
    most = op_def("concat").max_operands
    while len(parts) > 1:
        chunks = [parts[i : i + most] for i in range(0, len(parts), most)]
        parts = [builder.emit("concat", chunk, axis=0) if len(chunk) > 1 else chunk[0] for chunk in chunks]
    return parts[0]


def finiteness(
    builder: GradBuilder, graph: Graph, loss: int, params: list[ParamGrad]
) -> tuple[int, int, tuple[str, ...]]:
    """(the vector of non-finite counts, the 0-d gate that is 1.0 when all are 0, what each count
    is of): the float inputs, the loss and every parameter's gradient, in that order — an input
    that is not finite explains the rest."""
    checked, names = [], []
    for node in graph:
        if node.op == "input" and node.dtype == "f32":
            checked.append(node.id)
            names.append(f"input {node.attr('name')!r}")
    checked.append(loss)
    names.append("the loss")
    for p in params:
        checked.append(p.grad)
        names.append(f"the gradient of {p.name!r}")
    counts = [builder.emit("reshape", [nonfinite_count(builder, value)], shape=(1,)) for value in checked]
    vector = joined(builder, counts)
    total = builder.emit("sum", [vector], axes=(0,))
    gate = builder.emit("equal", [total, builder.const(0.0)])
    return vector, gate, tuple(names)


def accumulated(
    builder: GradBuilder, params: list[ParamGrad], k: int
) -> tuple[list[ParamGrad], int, dict[str, np.ndarray]]:
    """(`params` with each gradient replaced by the accumulated sum of gradient/k, the 0-d mask
    that is 1.0 on the step that completes a cycle of k, the initial values of the new states).
    Records the accumulators' and the counter's updates in graph.updates: reset to 0 on that step."""
    graph = builder.graph
    counter = state_leaf(builder, MICRO_STEP, ())
    counted = builder.emit("add", [counter, builder.const(1.0)])
    ready = builder.emit("greater_equal", [counted, builder.const(float(k))])
    zero = builder.const(0.0)
    graph.updates[MICRO_STEP] = builder.emit("where", [ready, zero, counted])
    initial = {MICRO_STEP: np.zeros((), np.float32)}
    summed = []
    for p in params:
        name = p.name + ACCUMULATOR_SUFFIX
        shape = builder.shape(p.node)
        accumulator = state_leaf(builder, name, shape)
        total = builder.emit("add", [accumulator, builder.emit("mul", [p.grad, builder.const(1.0 / k)])])
        graph.updates[name] = builder.emit("where", [ready, zero, total])
        initial[name] = np.zeros(shape, np.float32)
        summed.append(ParamGrad(p.name, p.node, total, p.parameter))  # (its group: by identity)
    return summed, ready, initial


def gate_updates(builder: GradBuilder, graph: Graph, names: list[str], gate: int) -> None:
    """Replace the update of each leaf in `names` by where(gate, new, old)."""
    leaves = leaf_nodes(graph)
    for name in names:
        graph.updates[name] = builder.emit("where", [gate, graph.updates[name], leaves[name]])


def nonfinite_error(counts: np.ndarray, names: tuple[str, ...], loss: float, accumulating: bool):
    """The NonFiniteError for a step's `nonfinite` counts, naming the first value with one, or
    None when every checked value was finite."""
    bad = np.flatnonzero(counts)
    if not bad.size:
        return None
    what, count = names[int(bad[0])], int(counts[bad[0]])
    kept = "parameters, module buffers, optimizer state" + (", gradient accumulators" if accumulating else "")
    message = (
        f"{what} has {count} non-finite value{'s' if count != 1 else ''} (NaN or ±inf): the step was "
        f"skipped ({kept} unchanged; its loss was {loss})"
    )
    return NonFiniteError(message, what, dict(zip(names, (int(c) for c in counts), strict=True)))


class NonFiniteError(FloatingPointError):
    """A training step met a NaN or an infinity (compile(check_finite=True)) and updated nothing.

    `what` names the first non-finite value ("input 'x'", "the loss", "the gradient of
    'fc.weight'"); `counts` maps every checked value to its number of non-finite elements."""

    def __init__(self, message: str, what: str, counts: dict[str, int]) -> None:
        super().__init__(message)
        self.what = what
        self.counts = counts
