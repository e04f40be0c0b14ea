"""The numpy interpreter: runs any IR graph, before or after rewriting. It is the oracle.

`interpret(graph, inputs, params, states)` returns the graph's outputs and its updates, each by
name. With dtype=np.float64 the same graph runs in double precision (for gradient checks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meganeura.ir import ops  # noqa: F401  (registers every op)
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import op_def


@dataclass
class Result:
    """What one run of a graph produced: named outputs and the new values of updated leaves."""

    outputs: dict[str, np.ndarray]
    updates: dict[str, np.ndarray]


def interpret(
    graph: Graph,
    inputs: dict[str, np.ndarray] | None = None,
    params: dict[str, np.ndarray] | None = None,
    states: dict[str, np.ndarray] | None = None,
    dtype=np.float32,
) -> Result:
    """Evaluate every live node of `graph` with numpy in `dtype` (integer values stay int32); a
    node with several results holds a tuple of arrays."""
    bound = {"input": inputs or {}, "param": params or {}, "state": states or {}}
    values: dict[int, np.ndarray | tuple[np.ndarray, ...]] = {}
    live = graph.live_ids()
    for node in graph:
        if node.id not in live:
            continue
        if node.op in bound:
            name = node.attr("name")
            if name not in bound[node.op]:
                raise KeyError(f"interpret: no value for {node.op} {name!r}")
            value = np.asarray(bound[node.op][name])
        else:
            args = [values[i] for i in node.inputs]
            value = op_def(node.op).evaluate(*args, **node.attr_dict)
        if node.results > 1:
            parts = tuple(checked(node, part, t, dtype) for part, t in zip(value, node.types, strict=True))
            values[node.id] = parts
        else:
            values[node.id] = checked(node, value, node.type, dtype)
    return Result(
        outputs={name: values[i] for name, i in graph.outputs.items()},
        updates={name: values[i] for name, i in graph.updates.items()},
    )


def checked(node, value, type: TensorType, dtype) -> np.ndarray:
    """`value` as an array of the IR type's dtype, after checking its shape against the IR."""
    value = np.asarray(value)
    if value.shape != type.shape:
        raise AssertionError(f"interpret: %{node.id} {node.op} gave shape {value.shape}, IR says {type.shape}")
    return value.astype(np.int32 if type.dtype == "i32" else dtype, copy=False)
