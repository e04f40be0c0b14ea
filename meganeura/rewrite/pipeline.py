"""The rewrite stage end to end: encode, saturate, extract a Plan with the cost model, decode, report."""

from __future__ import annotations

import time

from meganeura.ir.graph import PERSISTENT, Graph
from meganeura.rewrite.attribution import rule_savings, rule_uses
from meganeura.rewrite.cost import graph_cost, kernel_count
from meganeura.rewrite.decode import decode
from meganeura.rewrite.encode import empty_egraph, encode
from meganeura.rewrite.extract import MAX_PASSES, Extractor, input_choice
from meganeura.rewrite.families import FAMILIES, all_rules, family_facts
from meganeura.rewrite.report import RewriteReport
from meganeura.rewrite.saturate import DEFAULT_BUDGET, SCHEDULE, Budget, saturate
from meganeura.rewrite.view import read_egraph
from meganeura.target import GENERIC, Target


def optimize(
    graph: Graph,
    enabled: bool = True,
    budget: Budget = DEFAULT_BUDGET,
    schedule: tuple[tuple[str, ...], ...] = SCHEDULE,
    max_passes: int = MAX_PASSES,
    target: Target = GENERIC,
) -> tuple[Graph, RewriteReport]:
    """The graph rewritten by the e-graph (fusions chosen by the cost model), and a report of it.

    With `enabled=False` the e-graph is skipped: the result is `graph.pruned()`. `budget` limits
    saturation, `schedule` lists the phases of rulesets to run (e.g. `(("algebra",),)` for the
    algebra family alone), `max_passes` the local-search passes of extraction, `target` the adapter
    the cost model prices kernels for (meganeura/target.py).
    """
    if not enabled:
        pruned = graph.pruned()
        cost = graph_cost(pruned, target)
        count = kernel_count(pruned)
        report = RewriteReport(False, kernels_before=count, kernels_after=count, cost_before=cost, cost_after=cost)
        return pruned, report
    started = time.perf_counter()
    with empty_egraph() as egraph:
        encoding = encode(graph, egraph)
        scheduled = {family for phase in schedule for family in phase}
        facts = family_facts(graph, encoding.encoded_ids, scheduled, target)
        if facts:
            egraph.parse_and_run_program("\n".join(facts))
        encoded = time.perf_counter()
        saturation = saturate(egraph, budget, schedule)
        saturated = time.perf_counter()
        view = read_egraph(egraph)
    extractor = Extractor(view, encoding, target)
    extractor.start(root_classes(graph, view.class_of_ir), input_choice(extractor, view, encoding))
    passes = extractor.search(max_passes)
    extractor.check()
    plan = extractor.plan()
    extracted = time.perf_counter()
    decoded = decode(plan)
    rewritten = decoded.graph
    decoded_at = time.perf_counter()
    cost_after = graph_cost(rewritten, target)
    if cost_after != plan.cost:
        raise RuntimeError(
            f"rewrite: the plan's cost {plan.cost} differs from its decoded graph's {cost_after}: extraction "
            "and the cost model disagree about a kernel"
        )
    rules = all_rules()
    order = {r.name: index for index, r in enumerate(rules)}
    report = RewriteReport(
        True,
        matches=dict(saturation.matches),
        rule_order=[(r.name, r.family) for r in rules],
        family_order=list(FAMILIES),
        count_uses=lambda: rule_uses(plan),
        count_savings=lambda: rule_savings(plan, decoded, order),
        kernels_before=kernel_count(graph),
        kernels_after=kernel_count(rewritten),
        cost_before=graph_cost(graph, target),
        cost_after=cost_after,
        ir_nodes=len(encoding.encoded_ids),
        cse_merged=encoding.duplicates,
        enodes=saturation.enodes,
        eclasses=view.eclass_count,
        iterations=saturation.iterations,
        saturated=saturation.saturated,
        budget_hit=not saturation.saturated,
        budget=saturation.budget_hit,
        search_passes=passes,
        encode_s=encoded - started,
        saturate_s=saturated - encoded,
        extract_s=extracted - saturated,
        decode_s=decoded_at - extracted,
        covers={
            decoded.node_of_class[eclass]: sorted(ids)
            for eclass, ids in decoded.covered.items()
            if eclass in decoded.node_of_class
        },
    )
    report.report_s = time.perf_counter() - decoded_at
    return rewritten, report


def root_classes(graph: Graph, class_of_ir: dict[int, int]) -> list[int]:
    """The e-classes the new graph must compute: outputs, updates, and every input/param/state leaf."""
    leaves = [n.id for n in graph if n.op in PERSISTENT]
    node_ids = [*graph.outputs.values(), *graph.updates.values(), *leaves]
    return list(dict.fromkeys(class_of_ir[i] for i in node_ids))
