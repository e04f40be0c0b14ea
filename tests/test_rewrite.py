"""The e-graph stage end to end: the traced MLP step is fused as intended, the plan computes what
the original did (numpy interpreter), the report says what happened, budgets and idempotence.

Per-family rule tests are in test_rewrite_<family>.py; helpers in conftest.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import (
    assert_same_results,
    check_rewrite,
    kernels,
    leaf,
    live_nodes,
    matmul,
    mlp_step,
    node,
    ops,
)

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.ir.expr import parse
from meganeura.ir.graph import Graph
from meganeura.ir.ops.optimizer import hyper_offset
from meganeura.passes import compile_step
from meganeura.rewrite import FAMILIES, RULE_NAMES, Budget, RewriteReport, optimize
from meganeura.rewrite.encode import Encoding, empty_egraph, encode
from meganeura.rewrite.extract import Extractor, input_choice
from meganeura.rewrite.families import all_rules, family_facts
from meganeura.rewrite.pipeline import root_classes
from meganeura.rewrite.saturate import saturate
from meganeura.rewrite.view import EGraphView, read_egraph

# ---------------------------------------------------------------------------------------------
# The MLP training step


def test_mlp_forward_is_two_fused_matmuls_with_bias_and_relu():
    graph, *_ = mlp_step()
    fused, _ = optimize(graph)
    forward = [n for n in live_nodes(fused, "fused_matmul") if "add($acc,$0)" in n.attr("epilogue")]
    assert sorted(n.attr("epilogue") for n in forward) == ["add($acc,$0)", "relu(add($acc,$0))"]
    for n in forward:
        assert len(n.inputs) == 3 and fused[n.inputs[2]].op == "param"  # the bias is extra 0
        assert fused[n.inputs[1]].op == "param" and n.attr("transpose_b") is True  # W read transposed
    unfused = [n for op in ("relu", "add") for n in live_nodes(fused, op)]  # the step counter's t + 1 may stay an add
    assert not [n for n in unfused if any(fused[i].op in ("matmul", "fused_matmul") for i in n.inputs)]
    assert "relu" not in ops(fused)


def test_mlp_permutes_vanish_into_transposed_matmul_operands():
    graph, *_ = mlp_step()
    assert ops(graph).count("permute") == 4
    fused, report = optimize(graph)
    assert "permute" not in ops(fused)
    assert report.rule("fold_transpose_b").uses >= 2 and report.rule("transpose_product").uses == 2


def test_mlp_backward_relu_mask_joins_the_dx_matmul():
    graph, *_ = mlp_step()
    fused, report = optimize(graph)
    (masked,) = [n for n in live_nodes(fused, "fused_matmul") if "less_equal" in n.attr("epilogue")]
    # relu's threshold_backward: 0 where relu's output y ≤ 0, else the product (g·Wᵀ)
    assert parse(masked.attr("epilogue")) == ("where", ("less_equal", ("$", "0"), 0.0), 0.0, ("$", "acc"))
    assert "less_equal" not in ops(fused) and "where" not in ops(fused)
    assert report.rule("matmul_epilogue").uses == 3


def test_mlp_kernels_drop_and_results_stay_the_same():
    graph, inputs, params, states = mlp_step()
    fused, report = optimize(graph)
    # cross-entropy traced as nll_loss(log_softmax), its mean divided by the count of the targets
    # not ignored (ignore_index: a pick and a sum); one adam_update per parameter
    assert report.kernels_before == kernels(graph) == 33
    assert report.kernels_after == kernels(fused) <= 25
    assert report.cost_after.dispatches == report.kernels_after
    assert report.cost_after.bytes < report.cost_before.bytes
    assert_same_results(graph, fused, inputs, params, states)


def test_mlp_mean_loss_is_one_reduction_kernel():
    graph, *_ = mlp_step()
    fused, report = optimize(graph)
    loss = fused[fused.outputs["loss"]]  # Σ rows / the count of targets not ignored (F.cross_entropy's ignore_index)
    assert loss.op == "fused_reduce" and loss.attr("epilogue") == "div($r,$1)"
    assert fused[loss.inputs[1]].op == "sum" and report.rule("reduce_epilogue_tensor").uses == 1


def test_mlp_with_other_activations_and_optimizers_keeps_results():
    for activation, optimizer in (
        (F.sigmoid, optim.AdamW(lr=1e-2)),
        (F.tanh, optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01)),
        (F.silu, optim.Adam(lr=1e-2, weight_decay=0.1)),
    ):
        graph, inputs, params, states = mlp_step(activation, optimizer=optimizer)
        fused, report = optimize(graph)
        assert report.kernels_after < report.kernels_before
        assert_same_results(graph, fused, inputs, params, states)


@pytest.mark.parametrize("single", [True, False], ids=["sgd_step", "sgd_update"])
def test_sgd_update_joins_the_weight_gradient_matmul(single):
    graph, inputs, params, states = mlp_step(optimizer=optim.SGD(lr=0.1, fused=not single))
    fused, report = optimize(graph)
    weights = [fused[i] for name, i in fused.updates.items() if name.endswith("weight")]
    # p − lr·(g + wd·p), lr and wd read at run time: elements of the parameter group's vector
    assert [n.attr("epilogue") for n in weights] == ["sub($0,mul($1,add($acc,mul($2,$0))))"] * 2
    assert all(n.op == "fused_matmul" and fused[n.inputs[2]].op == "param" for n in weights)
    hypers = [
        [(fused[i].op, fused[fused[i].inputs[0]].attr("name"), fused[i].attr("index")) for i in n.inputs[3:]]
        for n in weights
    ]
    group = "param_groups.0.hyper"
    assert hypers == [[("element", group, hyper_offset("lr")), ("element", group, hyper_offset("weight_decay"))]] * 2
    step = compile_step(fused, multi_tensor=False)  # its graph after the passes (node ids anew)
    updated = {i for name, i in step.graph.updates.items() if name.endswith("weight")}
    kernels_of_weights = [s for s in step.kernels if s.node in updated]
    # a and b, the parameter, the group's vector (once, for lr and wd) and the result
    assert [[(b.name, step.graph[b.value].attr("name")) for b in s.bindings[2:]] for s in kernels_of_weights] == [
        [("x0", name), ("x1", group), ("out", None)] for name in ("fc1.weight", "fc2.weight")
    ]
    biases = [fused[i] for name, i in fused.updates.items() if name.endswith("bias")]
    op = "sgd_step" if single else "sgd_update"
    assert [n.op for n in biases] == [op] * 2  # a reduction's epilogue reads no other tensor
    assert report.rule("lift_sgd_step").matches == 4
    # sgd_step: the bias kernels are the lifted kernels (decoded back to sgd_step), and the weight
    # updates' epilogues are lifted bodies; with sgd_update, extraction keeps the bias updates'
    # own e-nodes at the same cost
    assert report.rule("lift_sgd_step").uses == (4 if single else 2)
    assert_same_results(graph, fused, inputs, params, states)


# ---------------------------------------------------------------------------------------------
# The report


def test_report_lists_every_rule_by_family_with_matches_and_uses():
    graph, *_ = mlp_step()
    _, report = optimize(graph)
    assert [s.name for s in report.rules] == list(RULE_NAMES) == [r.name for r in all_rules()]
    assert {s.family for s in report.rules} == set(FAMILIES)
    assert all(s.uses == 0 for s in report.rules if s.matches == 0)
    assert report.rule("fuse_pointwise").matches > 0
    assert report.saturated and not report.budget_hit and report.budget == ""
    assert report.enodes > report.eclasses > 0 and report.iterations > 1
    text = str(report)
    for word in ("fold_transpose_b", "matmul_epilogue", "saved per family", "kernels", "e-nodes", "encode"):
        assert word in text
    data = report.to_data()  # plain data: what json.dumps takes
    assert data["rules"][0]["name"] == "fold_transpose_a" and data["rules"][0]["matches"] == report.rules[0].matches
    assert json.loads(json.dumps(data))["families"][-1]["family"] == "e-graph"


def test_report_savings_per_family_add_up_to_the_total():
    graph, *_ = mlp_step()
    _, report = optimize(graph)
    total = report.cost_before - report.cost_after
    parts = [s.saved for s in report.families]
    assert sum(p.bytes for p in parts) == total.bytes
    assert sum(p.dispatches for p in parts) == total.dispatches == report.kernels_before - report.kernels_after
    assert sum(p.flops for p in parts) == total.flops
    assert report.family("algebra").saved.dispatches == 4  # the four permutes
    assert report.family("matmul").saved.dispatches >= 4


def test_rewrite_is_fast():
    graph, *_ = mlp_step(batch=32, n_in=64, hidden=128, n_out=10)
    optimize(graph)
    _, report = optimize(graph)
    assert report.total_s < 0.5, str(report)


def test_rewritten_graph_is_renumbered_topologically_and_keeps_leaves():
    graph, *_ = mlp_step()
    fused, _ = optimize(graph)
    for n in fused:
        assert n.id == fused.nodes.index(n)
        assert all(i < n.id for i in n.inputs)
    for kind in ("input", "param", "state"):
        assert {name: n.attrs for name, n in fused.leaves(kind).items()} == {
            name: n.attrs for name, n in graph.leaves(kind).items()
        }
    assert list(fused.outputs) == list(graph.outputs) and list(fused.updates) == list(graph.updates)


def test_optimizing_a_fused_graph_again_finds_nothing_more():
    graph, inputs, params, states = mlp_step()
    once, _ = optimize(graph)
    twice, report = optimize(once)
    assert report.kernels_after == report.kernels_before == kernels(once)
    assert report.cost_after == report.cost_before
    assert sorted(ops(twice)) == sorted(ops(once))
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
# Budgets and the schedule


def test_iteration_budget_hit_still_gives_a_valid_plan_and_says_so():
    graph, inputs, params, states = mlp_step()
    fused, report = optimize(graph, budget=Budget(max_iterations=2))
    assert report.budget_hit and report.budget == "iterations" and not report.saturated
    assert report.iterations == 2
    assert "budget hit (iterations)" in str(report)
    assert_same_results(graph, fused, inputs, params, states)


def test_time_budget_of_zero_keeps_the_input_plan():
    graph, inputs, params, states = mlp_step()
    fused, report = optimize(graph, budget=Budget(max_seconds=0.0))
    assert report.budget == "time" and report.iterations == 0
    assert report.kernels_after == report.kernels_before
    assert_same_results(graph, fused, inputs, params, states)


def test_enode_budget_stops_saturation():
    graph, inputs, params, states = mlp_step()
    fused, report = optimize(graph, budget=Budget(max_enodes=10))
    assert report.budget == "e-nodes" and report.iterations == 1
    assert_same_results(graph, fused, inputs, params, states)


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return x + self.down(F.silu(self.up(self.norm(x))))


def test_budget_hit_in_the_middle_of_matmul_epilogue_rules_still_gives_a_valid_plan():
    # Saturation stopped between a rule that creates `Replace` helpers and the rules that expand
    # them used to leave e-classes without any extractable e-node, and extraction crashed.
    model = nn.Sequential(ResidualBlock(), ResidualBlock(), nn.Linear(16, 5))
    inputs = {"x": mn.f32[8, 16], "y": mn.i32[8]}
    graph = trace_step(model, lambda m, x, y: F.cross_entropy(m(x), y), inputs, optim.Adam()).graph
    rng = np.random.default_rng(0)
    values = {"x": rng.normal(size=(8, 16)).astype(np.float32), "y": rng.integers(0, 5, 8).astype(np.int32)}
    params = {name: p.numpy() for name, p in model.named_parameters()}
    states = {n.attr("name"): np.zeros(n.shape, np.float32) for n in graph if n.op == "state"}
    hits = 0
    for limit in range(300, 1500, 100):
        fused, report = optimize(graph, budget=Budget(max_enodes=limit))
        hits += report.budget_hit
        assert report.budget == ("e-nodes" if report.budget_hit else ""), limit
        assert_same_results(graph, fused, values, params, states, tol=1e-4)
    assert hits >= 5


def test_schedule_with_algebra_alone_folds_transposes_but_fuses_nothing():
    graph, inputs, params, states = mlp_step()
    fused, report = optimize(graph, schedule=(("algebra",),))
    assert "permute" not in ops(fused) and "fused_matmul" not in ops(fused)
    assert report.rule("fuse_pointwise").matches == 0
    assert_same_results(graph, fused, inputs, params, states)


# ---------------------------------------------------------------------------------------------
# Sources, the DAG cost, common subexpressions


def linear_relu(share: str | None = None, mkn=(4, 8, 6)) -> Graph:
    """relu(x @ wᵀ + b), with an extra output reading an intermediate if asked."""
    m, k, n = mkn
    graph = Graph()
    x, w, b = leaf(graph, "x", (m, k)), leaf(graph, "w", (n, k), "param"), leaf(graph, "b", (n,), "param")
    product = matmul(graph, x, w, transpose_b=True, source="model.py:1")
    total = node(graph, "add", (product, b), "model.py:2")
    graph.outputs["y"] = node(graph, "relu", (total,), "model.py:3")
    if share == "product":
        graph.outputs["product"] = product
    if share == "pre":
        graph.outputs["pre"] = total
    return graph


def test_fused_node_carries_the_source_lines_of_what_it_covers():
    fused, _ = optimize(linear_relu())
    (n,) = live_nodes(fused, "fused_matmul")
    assert n.sources == ("model.py:1", "model.py:2", "model.py:3")


def test_matmul_read_elsewhere_is_not_recomputed_by_epilogue_fusion():
    # Fusing bias and relu would save a dispatch but recompute a 64x256x64 matmul: not worth it.
    graph = linear_relu("product", mkn=(64, 256, 64))
    fused, report = check_rewrite(graph, "matmul_epilogue")
    assert ops(fused).count("matmul") == 1 and "fused_matmul" not in ops(fused)
    assert len(live_nodes(fused, "pointwise")) == 1  # relu(add) in one kernel reading the product
    assert report.rule("matmul_epilogue").uses == 0


def test_intermediate_that_is_an_output_stays_an_output():
    graph = linear_relu("pre")
    fused, report = check_rewrite(graph)
    pre = fused[fused.outputs["pre"]]
    assert pre.op == "fused_matmul" and pre.attr("epilogue") == "add($acc,$0)"
    assert fused[fused.outputs["y"]].op in ("relu", "pointwise")  # relu reads the stored sum


def test_common_subexpressions_share_one_node():
    graph = Graph()
    x, y = leaf(graph, "x", (3, 4)), leaf(graph, "y", (3, 4))
    first = node(graph, "exp", (node(graph, "add", (x, y)),))
    second = node(graph, "exp", (node(graph, "add", (x, y)),))  # the same expression again
    graph.outputs["a"] = node(graph, "mul", (first, second))
    graph.outputs["b"] = second
    fused, report = check_rewrite(graph)
    assert report.cse_merged == 2
    assert fused.outputs["b"] in fused[fused.outputs["a"]].inputs
    assert kernels(fused) == 2 < kernels(graph)


def test_graph_without_fusion_sites_is_unchanged():
    graph = Graph()
    x = leaf(graph, "x", (3, 4))
    unused = leaf(graph, "unused", (2,), "param")
    graph.outputs["y"] = node(graph, "exp", (x,))
    result, report = optimize(graph)
    assert str(result) == str(graph)
    assert result[unused].op == "param" and report.kernels_after == report.kernels_before == 1


def searched(graph: Graph) -> tuple[Extractor, Encoding, EGraphView, list[int]]:
    """The extraction stage of `optimize`, its extractor kept after the search."""
    with empty_egraph() as egraph:
        encoding = encode(graph, egraph)
        egraph.parse_and_run_program("\n".join(family_facts(graph, encoding.encoded_ids, set(FAMILIES))))
        saturate(egraph)
        view = read_egraph(egraph)
    extractor = Extractor(view, encoding)
    roots = root_classes(graph, view.class_of_ir)
    extractor.start(roots, input_choice(extractor, view, encoding))
    extractor.search()
    return extractor, encoding, view, roots


def test_search_totals_kept_incrementally_match_the_plan_evaluated_from_scratch():
    # The search keeps the plan's cost by increments and undoes rejected moves from a journal;
    # evaluating its final choice afresh must give the same materialised classes and totals.
    graph = block_step()[0].graph
    extractor, encoding, view, roots = searched(graph)
    fresh = Extractor(view, encoding)
    fresh.start(roots, extractor.choice)
    assert fresh.current == extractor.current
    assert fresh.objective() == extractor.objective()
    assert [fresh.refcount[c] for c in fresh.current] == [extractor.refcount[c] for c in fresh.current]
    assert extractor.plan().cost.units == extractor.total > 0


def test_rollback_restores_the_plan_state():
    graph = block_step()[0].graph
    extractor, encoding, view, roots = searched(graph)
    state = (dict(extractor.choice), dict(extractor.current), list(extractor.refcount), extractor.objective())
    moved = 0
    for eclass, options in extractor.options.items():
        if len(options) < 2 or not extractor.refcount[eclass]:
            continue
        mark = extractor.checkpoint()
        extractor.set_option(eclass, (extractor.choice[eclass] + 1) % len(options))
        moved += extractor.objective() != state[3]
        extractor.rollback(mark)
    assert moved > 10  # the moves changed the plan, and each was undone
    assert (dict(extractor.choice), dict(extractor.current), list(extractor.refcount), extractor.objective()) == state
    # Every use of a mode or a memo that evaluating the plan afresh records is still recorded
    # (more may be: a stale entry costs one re-evaluation, a missing one a wrong plan).
    fresh = Extractor(view, encoding)
    fresh.start(roots, extractor.choice)
    for table, kept in ((fresh.mode_dependents, extractor.mode_dependents), (fresh.dependents, extractor.dependents)):
        assert table and all(users <= kept.get(key, set()) for key, users in table.items())


def test_each_optimization_starts_from_an_empty_egraph():
    # The declared e-graph is reused across compilations (its state pushed and popped): a graph
    # optimized after another gets the same e-graph and plan as in an e-graph of its own.
    first, *_ = mlp_step(batch=4, n_in=6, hidden=8, n_out=3)
    second = block_step()[0].graph
    optimize(first)
    _, after_another = optimize(second)
    with empty_egraph():  # holds the template: the next optimization declares a new e-graph
        _, alone = optimize(second)
    assert after_another.enodes == alone.enodes > 0
    assert after_another.cost_after == alone.cost_after


# ---------------------------------------------------------------------------------------------
# A transformer block: every family at once


class Block(nn.Module):
    """Pre-norm causal-free attention (softmax) and a SwiGLU MLP with residuals, on [batch, seq, dim]."""

    def __init__(self, dim=8, hidden=12):
        super().__init__()
        self.norm = nn.Parameter(np.ones(dim, np.float32))
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.out = nn.Linear(dim, dim, bias=False)
        self.gate, self.up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        normed = x * F.rsqrt(F.mean(x * x, -1, keepdim=True) + 1e-5) * self.norm
        q, k, v = self.q(normed), self.k(normed), self.v(normed)
        attention = F.softmax(F.matmul(q, F.transpose(k, 1, 2)) * 0.5, -1)
        x = x + self.out(F.matmul(attention, v))
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


def block_step():
    """The traced AdamW training step of `Block`, and its input spec."""

    def loss(model, x, target):
        return F.mse_loss(model(x), target)

    spec = {"x": mn.f32[2, 5, 8], "target": mn.f32[2, 5, 8]}
    return trace_step(Block(), loss, spec, optim.AdamW(lr=1e-2)), spec


def test_transformer_block_step_keeps_results_and_uses_every_family():
    traced, spec = block_step()
    graph = traced.graph
    fused, report = optimize(graph)
    rng = np.random.default_rng(3)
    inputs = {name: rng.normal(size=s.shape).astype(np.float32) for name, s in spec.items()}
    params = {
        name: p.numpy() + rng.normal(size=p.shape).astype(np.float32) * 0.1 for name, p in traced.parameters.items()
    }
    assert_same_results(graph, fused, inputs, params, traced.initial_states, tol=1e-4)
    assert report.kernels_after < 0.7 * report.kernels_before
    for family in report.families:  # recognition runs on the forward graph, in trace_step; no convolutions here
        assert family.saved.dispatches > 0 or family.family in ("recognition", "conv"), family
    for rule in ("fold_transpose_b", "fuse_pointwise", "swiglu", "lift_reduce", "reduce_epilogue_literal"):
        assert report.rule(rule).uses > 0, rule
    assert any(n.attr("prologue") == "mul($0,$0)" for n in live_nodes(fused, "fused_reduce"))  # Σx² reads x once
