"""Helpers for the e-graph tests (`test_rewrite*.py`): graph building, random values, and the
check every rule test makes. No tests here."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.ir.graph import Graph
from meganeura.ir.interpret import interpret
from meganeura.ir.ops import infer_type, launches_kernel
from meganeura.rewrite import optimize

PROPERTY = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
dims = st.integers(min_value=1, max_value=5)
seeds = st.integers(0, 2**16)


# ---------------------------------------------------------------------------------------------
# Building graphs


def node(graph: Graph, op: str, inputs=(), source: str = "", **attrs) -> int:
    """Append a node whose type the op table infers."""
    value_type = infer_type(op, [graph[i].type for i in inputs], attrs)
    return graph.add(op, inputs, value_type, attrs, (source,) if source else ())


def leaf(graph: Graph, name: str, shape: tuple[int, ...], kind: str = "input") -> int:
    """Append an f32 input (or param/state) leaf."""
    return node(graph, kind, name=name, shape=tuple(shape), dtype="f32")


def const(graph: Graph, value: float) -> int:
    return node(graph, "const", value=float(value))


def matmul(graph: Graph, a: int, b: int, transpose_a=False, transpose_b=False, source="") -> int:
    return node(graph, "matmul", (a, b), source, transpose_a=transpose_a, transpose_b=transpose_b)


def operands(graph: Graph, batch: tuple[int, ...], m: int, k: int, n: int, ta: bool, tb: bool) -> tuple[int, int]:
    """Two fresh input leaves a, b shaped for matmul(a, b, ta, tb) → [*batch, m, n]."""
    a = leaf(graph, "a", (*batch, k, m) if ta else (*batch, m, k))
    b = leaf(graph, "b", (*batch, n, k) if tb else (*batch, k, n))
    return a, b


# ---------------------------------------------------------------------------------------------
# Reading results


def ops(graph: Graph) -> list[str]:
    """The ops of the live nodes, in graph order."""
    live = graph.live_ids()
    return [n.op for n in graph if n.id in live]


def kernels(graph: Graph) -> int:
    return sum(1 for op in ops(graph) if launches_kernel(op))


def live_nodes(graph: Graph, op: str):
    live = graph.live_ids()
    return [n for n in graph if n.id in live and n.op == op]


def random_values(graph: Graph, seed: int = 0, positive: bool = False):
    """Random inputs, params and states for every leaf of a graph (i32 leaves get small ints)."""
    rng = np.random.default_rng(seed)
    values = {"input": {}, "param": {}, "state": {}}
    for n in graph:
        if n.op not in values:
            continue
        if n.dtype == "i32":
            value = rng.integers(0, 3, n.shape).astype(np.int32)
        else:
            value = rng.normal(size=n.shape).astype(np.float32)
            if positive:
                value = np.abs(value) + np.float32(0.5)
        values[n.op][n.attr("name")] = value
    return values["input"], values["param"], values["state"]


def assert_same_results(before: Graph, after: Graph, inputs, params=None, states=None, tol=1e-5) -> None:
    """Both graphs give the same outputs and updates through the interpreter (float32 tolerance)."""
    expected = interpret(before, inputs, params, states)
    actual = interpret(after, inputs, params, states)
    assert expected.outputs.keys() == actual.outputs.keys()
    assert expected.updates.keys() == actual.updates.keys()
    for kind in ("outputs", "updates"):
        for name, value in getattr(expected, kind).items():
            np.testing.assert_allclose(getattr(actual, kind)[name], value, rtol=tol, atol=tol, err_msg=name)


def check_rewrite(graph: Graph, rule: str | None = None, seed: int = 0, positive: bool = False, **options):
    """Optimize, check the results are unchanged (and that `rule` matched); the new graph and report."""
    rewritten, report = optimize(graph, **options)
    if rule is not None:
        assert report.rule(rule).matches > 0, str(report)
    assert_same_results(graph, rewritten, *random_values(graph, seed, positive))
    assert report.cost_after.units <= report.cost_before.units
    return rewritten, report


# ---------------------------------------------------------------------------------------------
# The traced MLP training step


class MLP(nn.Module):
    def __init__(self, n_in=6, hidden=5, n_out=3, activation=F.relu):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, n_out)
        self.activation = activation

    def forward(self, x):
        return self.fc2(self.activation(self.fc1(x)))


def ce_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def mlp_step(activation=F.relu, batch=4, n_in=6, hidden=5, n_out=3, optimizer=None):
    """The traced training step (forward, backward, optimizer) of a 2-layer MLP, and its bound values."""
    model = MLP(n_in, hidden, n_out, activation)
    optimizer = optimizer or optim.Adam(lr=1e-2)
    traced = trace_step(model, ce_loss, {"x": mn.f32[batch, n_in], "y": mn.i32[batch]}, optimizer)
    rng = np.random.default_rng(0)
    inputs = {"x": rng.normal(size=(batch, n_in)).astype(np.float32), "y": rng.integers(0, n_out, batch)}
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    return traced.graph, inputs, params, traced.initial_states
