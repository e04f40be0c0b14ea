"""The e-graph stage: fusion rules fire under their guards, extraction's DAG cost picks the plan,
the rewritten graph computes what the original did (numpy interpreter), and the report says so."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.ir.graph import Graph
from meganeura.ir.interpret import interpret
from meganeura.ir.ops import infer_type, launches_kernel
from meganeura.rewrite import RULE_NAMES, RewriteReport, optimize
from meganeura.rewrite.cost import graph_cost
from meganeura.rewrite.encode import encode
from meganeura.rewrite.pipeline import default_ruleset
from meganeura.rewrite.saturate import saturate

# ---------------------------------------------------------------------------------------------
# Helpers


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


def mlp_step(activation=F.relu, batch=4, n_in=6, hidden=5, n_out=3):
    """The traced training step (forward, backward, Adam) of a 2-layer MLP, and its bound values."""
    model = MLP(n_in, hidden, n_out, activation)
    traced = trace_step(model, ce_loss, {"x": mn.f32[batch, n_in], "y": mn.i32[batch]}, optim.Adam(lr=1e-2))
    rng = np.random.default_rng(0)
    inputs = {"x": rng.normal(size=(batch, n_in)).astype(np.float32), "y": rng.integers(0, n_out, batch)}
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    return traced.graph, inputs, params, traced.initial_states


def node_add(graph: Graph, op: str, inputs=(), attrs=None, source: str = "") -> int:
    """Append a node whose type the op table infers."""
    attrs = attrs or {}
    value_type = infer_type(op, [graph[i].type for i in inputs], attrs)
    return graph.add(op, inputs, value_type, attrs, (source,) if source else ())


def leaf(graph: Graph, name: str, shape: tuple[int, ...], kind: str = "input") -> int:
    """Append an f32 input (or param/state) leaf."""
    return node_add(graph, kind, (), {"name": name, "shape": shape, "dtype": "f32"})


def matmul(graph: Graph, a: int, b: int, transpose_a=False, transpose_b=False, source="") -> int:
    return node_add(graph, "matmul", (a, b), {"transpose_a": transpose_a, "transpose_b": transpose_b}, source)


def random_leaves(graph: Graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random values for every input leaf of a graph."""
    return {n.attr("name"): rng.normal(size=n.shape).astype(np.float32) for n in graph if n.op == "input"}


def assert_same_results(before: Graph, after: Graph, inputs, params=None, states=None) -> None:
    """Both graphs give the same outputs and updates through the interpreter (float32 tolerance)."""
    expected = interpret(before, inputs, params, states)
    actual = interpret(after, inputs, params, states)
    assert expected.outputs.keys() == actual.outputs.keys()
    assert expected.updates.keys() == actual.updates.keys()
    for name in expected.outputs:
        np.testing.assert_allclose(actual.outputs[name], expected.outputs[name], rtol=1e-5, atol=1e-5, err_msg=name)
    for name in expected.updates:
        np.testing.assert_allclose(actual.updates[name], expected.updates[name], rtol=1e-5, atol=1e-5, err_msg=name)


def ops(graph: Graph) -> list[str]:
    """The ops of the live nodes, in graph order."""
    live = graph.live_ids()
    return [n.op for n in graph if n.id in live]


def kernels(graph: Graph) -> int:
    return sum(1 for op in ops(graph) if launches_kernel(op))


def linear_graph(bias_shape, activation=None, order="left", share=None, mkn=(4, 8, 6)):
    """x @ wᵀ + bias (then an activation), with extra outputs reading intermediates if asked."""
    m, k, n = mkn
    graph = Graph()
    x = leaf(graph, "x", (m, k))
    w = leaf(graph, "w", (n, k), "param")
    bias = leaf(graph, "b", bias_shape, "param")
    product = matmul(graph, x, w, transpose_b=True, source="model.py:1")
    operands = (product, bias) if order == "left" else (bias, product)
    total = node_add(graph, "add", operands, source="model.py:2")
    result = node_add(graph, activation, (total,), source="model.py:3") if activation else total
    graph.outputs["y"] = result
    if share == "matmul":
        graph.outputs["product"] = product
    if share == "add":
        graph.outputs["pre"] = total
    if share == "matmul_user":
        graph.outputs["square"] = node_add(graph, "mul", (product, product))
    return graph


def run_bound(graph: Graph, seed: int = 0):
    """Random inputs and params for `linear_graph`-style graphs."""
    rng = np.random.default_rng(seed)
    inputs = random_leaves(graph, rng)
    params = {n.attr("name"): rng.normal(size=n.shape).astype(np.float32) for n in graph if n.op == "param"}
    return inputs, params


# ---------------------------------------------------------------------------------------------
# The MLP training step


def test_mlp_fuses_fc1_with_relu_and_fc2_with_bias():
    graph, *_ = mlp_step()
    fused, report = optimize(graph)
    fused_nodes = [n for n in fused if n.op == "fused_matmul"]
    assert len(fused_nodes) == 2
    assert {n.attr("activation") for n in fused_nodes} == {"relu", "none"}
    assert all(len(n.inputs) == 3 for n in fused_nodes)  # both carry their bias
    assert "relu" not in ops(fused)  # the relu went into fc1's epilogue
    assert kernels(fused) == kernels(graph) - 3
    assert report.kernels_before == kernels(graph) and report.kernels_after == kernels(fused)


def test_mlp_report_lists_rules_with_matches_and_uses():
    graph, *_ = mlp_step()
    _, report = optimize(graph)
    assert [s.name for s in report.rules] == list(RULE_NAMES)
    assert report.rule("matmul_bias").matches == 2 and report.rule("matmul_bias").uses == 2
    assert report.rule("matmul_epilogue_relu").matches >= 1 and report.rule("matmul_epilogue_relu").uses == 1
    assert report.rule("matmul_epilogue_tanh").matches == 0
    assert report.saturated and not report.budget_hit
    assert report.enodes > report.eclasses > 0
    assert report.cost_after.dispatches == report.kernels_after
    assert report.cost_after.scalar < report.cost_before.scalar
    text = str(report)
    for name in ("matmul_bias", "matmul_epilogue_relu", "kernels", "e-nodes", "encode", "saturate", "extract"):
        assert name in text


def test_mlp_rewrite_keeps_outputs_and_updates():
    graph, inputs, params, states = mlp_step()
    fused, _ = optimize(graph)
    assert_same_results(graph, fused, inputs, params, states)


@pytest.mark.parametrize("activation", [F.sigmoid, F.tanh], ids=["sigmoid", "tanh"])
def test_mlp_with_other_activations_keeps_results(activation):
    graph, inputs, params, states = mlp_step(activation)
    fused, report = optimize(graph)
    assert report.rule("matmul_bias").uses >= 1
    assert_same_results(graph, fused, inputs, params, states)


def test_mlp_rewrite_is_fast():
    graph, *_ = mlp_step(batch=32, n_in=64, hidden=128, n_out=10)
    optimize(graph)  # first call declares the egglog sorts and rules
    _, report = optimize(graph)
    assert report.total_s < 0.5, str(report)


def test_rewritten_graph_is_renumbered_topologically_and_keeps_leaves():
    graph, *_ = mlp_step()
    fused, _ = optimize(graph)
    for node in fused:
        assert node.id == fused.nodes.index(node)
        assert all(i < node.id for i in node.inputs)
    assert fused.live_ids() | {n.id for n in fused if n.op in ("input", "param", "state")} == set(range(len(fused)))
    for kind in ("input", "param", "state"):
        assert {name: n.attrs for name, n in fused.leaves(kind).items()} == {
            name: n.attrs for name, n in graph.leaves(kind).items()
        }
    assert list(fused.outputs) == list(graph.outputs) and list(fused.updates) == list(graph.updates)


def test_optimizing_a_fused_graph_changes_nothing():
    graph, inputs, params, states = mlp_step()
    once, _ = optimize(graph)
    twice, report = optimize(once)
    assert str(twice) == str(once)
    assert all(s.uses == 0 for s in report.rules)
    assert_same_results(graph, twice, inputs, params, states)


def test_disabled_rewrite_returns_the_pruned_graph():
    graph, *_ = mlp_step()
    graph.add("relu", (graph.outputs["loss"],), graph[graph.outputs["loss"]].type)  # dead code
    result, report = optimize(graph, enabled=False)
    assert str(result) == str(graph.pruned())
    assert isinstance(report, RewriteReport) and not report.enabled
    assert report.kernels_before == report.kernels_after == kernels(graph)
    assert "skipped" in str(report)


# ---------------------------------------------------------------------------------------------
# Guards and the DAG cost


@pytest.mark.parametrize("order", ["left", "right"])
@pytest.mark.parametrize("bias_shape", [(6,), (1, 6)], ids=["vector", "row"])
def test_row_vector_bias_is_fused(bias_shape, order):
    graph = linear_graph(bias_shape, order=order)
    fused, report = optimize(graph)
    assert ops(fused) == ["input", "param", "param", "fused_matmul"]
    assert report.rule("matmul_bias").uses == 1
    assert_same_results(graph, fused, *run_bound(graph))


@pytest.mark.parametrize("bias_shape", [(4, 1), (4, 6), (1,), (1, 1)], ids=["column", "matrix", "scalar1", "scalar11"])
def test_bias_that_is_not_a_row_vector_is_not_fused(bias_shape):
    graph = linear_graph(bias_shape)
    fused, report = optimize(graph)
    assert "fused_matmul" not in ops(fused) and "add" in ops(fused)
    assert report.rule("matmul_bias").matches == 0
    assert_same_results(graph, fused, *run_bound(graph))


@pytest.mark.parametrize("share", ["matmul", "matmul_user"])
def test_matmul_read_elsewhere_is_not_recomputed_by_bias_fusion(share):
    graph = linear_graph((6,), share=share)
    fused, report = optimize(graph)
    assert report.rule("matmul_bias").matches == 1  # the fused alternative existed...
    assert ops(fused).count("matmul") == 1  # ...but the DAG cost kept the matmul computed once
    assert "fused_matmul" not in ops(fused)
    assert report.cost_after == graph_cost(graph)
    assert_same_results(graph, fused, *run_bound(graph))


@pytest.mark.parametrize("share", ["matmul", "matmul_user"])
def test_matmul_read_elsewhere_is_not_recomputed_by_epilogue_fusion(share):
    # Fusing bias and relu would save a dispatch but recompute a 64x256x64 matmul: not worth it.
    graph = linear_graph((64,), "relu", share=share, mkn=(64, 256, 64))
    fused, report = optimize(graph)
    assert report.rule("matmul_bias").matches >= 1  # the alternative existed...
    assert ops(fused).count("matmul") == 1  # ...but the cost kept the matmul computed once
    assert "fused_matmul" not in ops(fused)
    assert report.cost_after == graph_cost(graph)
    assert_same_results(graph, fused, *run_bound(graph))


def test_preactivation_read_elsewhere_keeps_the_activation_apart():
    graph = linear_graph((6,), "relu", share="add")
    fused, report = optimize(graph)
    assert ops(fused).count("fused_matmul") == 1 and "relu" in ops(fused) and "matmul" not in ops(fused)
    assert [n.attr("activation") for n in fused if n.op == "fused_matmul"] == ["none"]
    assert report.rule("matmul_epilogue_relu").matches >= 1 and report.rule("matmul_epilogue_relu").uses == 0
    assert_same_results(graph, fused, *run_bound(graph))


def test_fused_node_carries_the_source_lines_of_what_it_covers():
    graph = linear_graph((6,), "relu")
    fused, _ = optimize(graph)
    (node,) = [n for n in fused if n.op == "fused_matmul"]
    assert node.sources == ("model.py:1", "model.py:2", "model.py:3")


def test_activation_of_a_plain_matmul_is_fused_without_bias():
    graph = Graph()
    a, b = leaf(graph, "a", (5, 3)), leaf(graph, "b", (5, 7))
    graph.outputs["y"] = node_add(graph, "tanh", (matmul(graph, a, b, transpose_a=True),))
    fused, report = optimize(graph)
    (node,) = [n for n in fused if n.op == "fused_matmul"]
    assert len(node.inputs) == 2 and node.attr("activation") == "tanh" and node.attr("transpose_a") is True
    assert report.rule("matmul_epilogue_tanh").uses == 1
    assert_same_results(graph, fused, random_leaves(graph, np.random.default_rng(1)))


def test_saturation_budget_is_reported_when_hit():
    graph, *_ = mlp_step()
    encoding = encode(graph)
    result = saturate(encoding.egraph, default_ruleset(), max_iterations=1)
    assert result.iterations == 1 and result.budget_hit and not result.saturated
    assert result.matches["matmul_bias"] == 2


# ---------------------------------------------------------------------------------------------
# Property tests: each rule preserves what the graph computes

dims = st.integers(min_value=1, max_value=6)
PROPERTY_SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def random_matmul(draw_values, graph: Graph):
    """A matmul of two fresh inputs with random sizes and transpose flags; returns (node, n)."""
    m, k, n, transpose_a, transpose_b = draw_values
    a = leaf(graph, "a", (k, m) if transpose_a else (m, k))
    b = leaf(graph, "b", (n, k) if transpose_b else (k, n))
    return matmul(graph, a, b, transpose_a, transpose_b), n


BIAS_SHAPES = {  # kind -> bias shape for an [m, n] product; only the first two are row vectors
    "vector": lambda m, n: (n,),
    "row": lambda m, n: (1, n),
    "column": lambda m, n: (m, 1),
    "matrix": lambda m, n: (m, n),
    "single": lambda m, n: (1,),
}


@PROPERTY_SETTINGS
@given(
    shape=st.tuples(dims, dims, dims, st.booleans(), st.booleans()),
    bias_kind=st.sampled_from(list(BIAS_SHAPES)),
    left=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matmul_bias_preserves_values(shape, bias_kind, left, seed):
    graph = Graph()
    product, n = random_matmul(shape, graph)
    bias = leaf(graph, "bias", BIAS_SHAPES[bias_kind](graph[product].shape[0], n))
    graph.outputs["y"] = node_add(graph, "add", (product, bias) if left else (bias, product))
    fused, report = optimize(graph)
    if bias_kind in ("vector", "row"):
        assert report.rule("matmul_bias").matches >= 1 and ops(fused)[-1] == "fused_matmul"
    assert_same_results(graph, fused, random_leaves(graph, np.random.default_rng(seed)))


@PROPERTY_SETTINGS
@given(
    shape=st.tuples(dims, dims, dims, st.booleans(), st.booleans()),
    activation=st.sampled_from(["relu", "sigmoid", "tanh"]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_matmul_epilogue_preserves_values(shape, activation, with_bias, seed):
    graph = Graph()
    value, n = random_matmul(shape, graph)
    if with_bias:
        value = node_add(graph, "add", (value, leaf(graph, "bias", (n,))))
    graph.outputs["y"] = node_add(graph, activation, (value,))
    fused, report = optimize(graph)
    assert report.rule(f"matmul_epilogue_{activation}").matches >= 1
    assert ops(fused)[-1] == "fused_matmul" and kernels(fused) == 1
    assert_same_results(graph, fused, random_leaves(graph, np.random.default_rng(seed)))


def test_bias_that_broadcasts_the_matmul_up_is_not_fused():
    # [4,1] + [6] broadcasts to [4,6]: a fused matmul would produce [4,1].
    graph = linear_graph((6,), mkn=(4, 8, 1))
    fused, report = optimize(graph)
    assert "fused_matmul" not in ops(fused) and report.rule("matmul_bias").matches == 0
    assert_same_results(graph, fused, *run_bound(graph))


def test_graph_without_fusion_sites_is_unchanged():
    graph = Graph()
    x = leaf(graph, "x", (3, 4))
    unused = leaf(graph, "unused", (2,), "param")
    total = node_add(graph, "sum", (node_add(graph, "exp", (x,)),), {"axes": (1,), "keepdim": False})
    graph.outputs["total"] = total
    result, report = optimize(graph)
    assert str(result) == str(graph)
    assert result[unused].op == "param" and report.kernels_after == report.kernels_before == 2
