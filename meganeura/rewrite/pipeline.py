"""The rewrite stage end to end: encode, saturate, extract with the cost model, decode, report."""

from __future__ import annotations

import functools
import time
from collections import Counter

from egglog import Ruleset

from meganeura.ir.graph import Graph
from meganeura.rewrite.cost import graph_cost, kernel_cost, kernel_count
from meganeura.rewrite.decode import NO_BIAS_OP, class_order_key, decode, ir_ids_per_class, ir_op, real_children
from meganeura.rewrite.encode import LEAF_KINDS, Encoding, encode, ref_name
from meganeura.rewrite.extract import EGraphView, ENode, NodeCost, choice_from_signatures, extract, read_egraph
from meganeura.rewrite.report import RewriteReport, RuleStats
from meganeura.rewrite.rules import RULE_NAMES, fusion_ruleset, rules_used_by
from meganeura.rewrite.saturate import saturate


@functools.cache
def default_ruleset() -> Ruleset:
    """The rules `optimize` runs, built once per process."""
    return fusion_ruleset()


def optimize(graph: Graph, enabled: bool = True) -> tuple[Graph, RewriteReport]:
    """The graph rewritten by the e-graph (fusions chosen by the cost model), and a report of it.

    With `enabled=False` the e-graph is skipped: the result is `graph.pruned()`.
    """
    if not enabled:
        pruned = graph.pruned()
        cost = graph_cost(pruned)
        count = kernel_count(pruned)
        report = RewriteReport(False, kernels_before=count, kernels_after=count, cost_before=cost, cost_after=cost)
        return pruned, report
    started = time.perf_counter()
    encoding = encode(graph)
    encoded = time.perf_counter()
    saturation = saturate(encoding.egraph, default_ruleset())
    saturated = time.perf_counter()
    view = read_egraph(encoding.egraph)
    ir_ids = ir_ids_per_class(encoding, view)
    choice = extract(
        view,
        root_classes(encoding, view),
        sorted(view.nodes, key=class_order_key(ir_ids)),
        enode_cost(encoding, view, ir_ids),
        starts=[input_choice(encoding, view)],
    )
    rewritten = decode(encoding, view, choice)
    extracted = time.perf_counter()
    report = RewriteReport(
        True,
        rules=rule_stats(saturation.matches, count_rule_uses(choice, ir_ids, encoding)),
        kernels_before=kernel_count(graph),
        kernels_after=kernel_count(rewritten),
        cost_before=graph_cost(graph),
        cost_after=graph_cost(rewritten),
        enodes=view.enode_count,
        eclasses=view.eclass_count,
        iterations=saturation.iterations,
        saturated=saturation.saturated,
        budget_hit=saturation.budget_hit,
        encode_s=encoded - started,
        saturate_s=saturated - encoded,
        extract_s=extracted - saturated,
    )
    return rewritten, report


def root_classes(encoding: Encoding, view: EGraphView) -> list[str]:
    """The e-classes the new graph must compute: outputs, updates, and every input/param/state leaf."""
    graph = encoding.graph
    leaves = [node_id for node_id in encoding.encoded_ids if graph[node_id].op in LEAF_KINDS]
    node_ids = [*graph.outputs.values(), *graph.updates.values(), *leaves]
    return list(dict.fromkeys(view.class_of_ref[ref_name(i)] for i in node_ids))


def input_choice(encoding: Encoding, view: EGraphView) -> dict[str, ENode]:
    """The plan of the input graph itself: each IR node's own e-node."""
    no_bias = [c for c, nodes in view.nodes.items() if any(n.op == NO_BIAS_OP for n in nodes)]
    signatures = {}
    for node_id, (op, inputs, primitives) in encoding.signatures.items():
        children = tuple(no_bias[0] if i is None else view.class_of_ref[ref_name(i)] for i in inputs)
        signatures[view.class_of_ref[ref_name(node_id)]] = (op, children, primitives)
    for eclass in no_bias:
        signatures[eclass] = (NO_BIAS_OP, (), ())
    return choice_from_signatures(view, signatures)


def enode_cost(encoding: Encoding, view: EGraphView, ir_ids: dict[str, list[int]]) -> NodeCost:
    """The cost model on e-nodes: the kernel cost of the IR node each would decode to (cached)."""
    graph = encoding.graph
    cache: dict[str, float] = {}

    def cost(node: ENode) -> float:
        if node.id not in cache:
            if node.op == NO_BIAS_OP:
                cache[node.id] = 0.0
            else:
                children = [c for c in dict.fromkeys(node.children) if c in ir_ids]
                operands = [graph[ir_ids[c][0]].type for c in children]
                cache[node.id] = float(kernel_cost(ir_op(node), graph[ir_ids[node.eclass][0]].type, operands).scalar)
        return cache[node.id]

    return cost


def count_rule_uses(choice: dict[str, ENode], ir_ids: dict[str, list[int]], encoding: Encoding) -> Counter:
    """Per named rule, how many chosen e-nodes carry its rewrite (nodes already in the input excluded)."""
    uses: Counter = Counter()
    for eclass, node in choice.items():
        originals = {encoding.graph[i].op for i in ir_ids.get(eclass, ())}
        if "fused_matmul" in originals:
            continue
        has_bias = len(real_children(node, choice)) == 3
        uses.update(rules_used_by(node.op, node.primitives, has_bias))
    return uses


def rule_stats(matches: Counter, uses: Counter) -> list[RuleStats]:
    """One RuleStats per named rule, in the rule set's order."""
    return [RuleStats(name, matches.get(name, 0), uses.get(name, 0)) for name in RULE_NAMES]
