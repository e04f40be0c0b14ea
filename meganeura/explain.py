"""What `program.report()` returns: the e-graph's rewrite report plus the kernel list, as text,
as JSON-ready data (`to_json`) and as a Graphviz picture of the step (`to_dot`).

>>> # report = program.report(); print(report); report.to_json()["kernels"][0]["sources"]
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from meganeura.codegen.common import storage
from meganeura.ir.graph import Graph
from meganeura.ir.op import op_def


def kernel_summary(node) -> str:
    """A short description of what a kernel node computes (its op's `describe`, if it has one)."""
    describe = op_def(node.op).describe
    return describe(node) if describe else ""


@dataclass(frozen=True)
class KernelRow:
    """One kernel of the plan (one dispatch): the IR node it computes, the shapes of its results and
    the user source lines it covers."""

    node: int
    op: str
    shapes: tuple[tuple[int, ...], ...]
    what: str
    sources: tuple[str, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shapes[0]


def kernel_rows(graph: Graph) -> list[KernelRow]:
    """The kernels of `graph` (live nodes that launch one), in graph order."""
    live = graph.live_ids()
    return [
        KernelRow(n.id, n.op, tuple(t.shape for t in n.types), kernel_summary(n), n.sources)
        for n in graph
        if n.id in live and op_def(n.op).kernel
    ]


@dataclass(frozen=True)
class Dispatches:
    """The dispatches one step runs (the compiled step's kernels), and how many of them update the
    parameters (ops of the optimizer family), of which `multi_tensor` update several at once; on
    tensor cores, the products from split operands and the kernels that split them and find their
    scales (codegen/matmul_halves.py)."""

    total: int
    optimizer: int
    multi_tensor: int
    parameters: int  # the parameters the optimizer's dispatches update
    split_products: int = 0
    splitting: int = 0

    def __str__(self) -> str:
        text = f"{self.total} dispatches per step, {self.optimizer} of them the optimizer's"
        if self.multi_tensor:
            text += f" ({self.multi_tensor} multi-tensor kernels; {self.parameters} parameters in all)"
        if self.split_products:
            text += (
                f"; {self.split_products} products on the tensor cores from split operands, "
                f"{self.splitting} dispatches splitting their operands"
            )
        return text


def step_dispatches(compiled) -> Dispatches:
    """The dispatches of a CompiledStep (codegen/compiled.py), the optimizer's counted apart."""
    graph = compiled.graph
    optimizer = [graph[k.node] for k in compiled.kernels if op_def(graph[k.node].op).family == "optimizer"]
    multi = [n for n in optimizer if "members" in n.attr_dict]
    params = graph.leaves("param")
    updated = [storage(graph, graph.updates[name])[0] for name in params if name in graph.updates]
    parameters = sum(1 for n in updated if op_def(graph[n].op).family == "optimizer")
    ops = [graph[k.node].op for k in compiled.kernels]
    maxima = {n.inputs[1] for n in graph if n.op == "split_halves" and graph[n.inputs[1]].op == "fused_reduce"}
    splitting = sum(op in ("split_halves", "multi_split_halves", "multi_top") for op in ops) + len(maxima)
    return Dispatches(
        len(compiled.kernels), len(optimizer), len(multi), parameters, ops.count("split_matmul"), splitting
    )


@dataclass
class StepReport:
    """The rewrites the e-graph chose for one step, and the kernels that run it.

    `kernels` are the plan's kernels as the e-graph chose them (one per node of the fused graph);
    with the compiled step, `dispatches` counts what runs, after the optimizer's updates of many
    parameters were grouped into multi-tensor kernels (passes/multi_tensor.py)."""

    rewrite: Any  # meganeura.rewrite.RewriteReport
    graph: Graph  # the traced step
    fused_graph: Graph  # after the e-graph
    kernels: list[KernelRow] = field(default_factory=list)
    compiled: Any = None  # meganeura.codegen.compiled.CompiledStep, when the report has it
    # The input shapes a program has compiled plans for (the declared ones first: this report's),
    # and how many it keeps at most (None: a program that takes only its declared shapes).
    shapes: list[dict[str, tuple[int, ...]]] = field(default_factory=list)
    max_shapes: int | None = None

    def __post_init__(self) -> None:
        if not self.kernels:
            self.kernels = kernel_rows(self.fused_graph)

    @property
    def dispatches(self) -> int:
        """How many dispatches run the step: one per compiled kernel (a node with several results,
        a multi-tensor update, is one); without the compiled step, one per kernel of the plan."""
        return len(self.compiled.kernels) if self.compiled is not None else len(self.kernels)

    @property
    def step_dispatches(self) -> Dispatches | None:
        """The step's dispatches, the optimizer's counted apart (None without the compiled step)."""
        return step_dispatches(self.compiled) if self.compiled is not None else None

    def shapes_line(self) -> str:
        """The input shapes compiled, in one line ("" without them)."""
        if not self.shapes:
            return ""
        kept = f"at most {self.max_shapes}" if self.max_shapes is not None else "dynamic=False"
        listed = "; ".join(", ".join(f"{name}: {list(shape)}" for name, shape in s.items()) for s in self.shapes)
        return f"input shapes compiled ({len(self.shapes)}, {kept}; this report is of the first): {listed}"

    def pass_rows(self) -> list[dict[str, Any]]:
        """What each pass after extraction did (meganeura/passes/): its kernels and the cost model's
        price of the plan before and after it (priced here, when the report is read)."""
        rows = []
        for run in self.compiled.passes if self.compiled is not None else ():
            row = {"pass": run.name, "does": run.does, "changed": run.changed}
            if run.changed:
                (kernels_before, kernels_after), (before, after) = run.kernels, run.costs
                row |= {"kernels": [kernels_before, kernels_after], "units": [before.units, after.units]}
                row |= {"bytes": [before.bytes, after.bytes], "dispatches": [before.dispatches, after.dispatches]}
            rows.append(row)
        return rows

    def passes_text(self) -> list[str]:
        """`pass_rows` as lines ([] without the compiled step)."""
        rows = self.pass_rows()
        if not rows:
            return []
        width = max(len(row["pass"]) for row in rows)
        lines = ["Passes after extraction (meganeura/passes/): kernels, the cost model's price before -> after"]
        for row in rows:
            if not row["changed"]:
                lines.append(f"  {row['pass']:<{width}}  no change  ({row['does']})")
                continue
            (k0, k1), (u0, u1) = row["kernels"], row["units"]
            change = (u1 - u0) / u0 if u0 else 0.0
            lines.append(
                f"  {row['pass']:<{width}}  kernels {k0} -> {k1}, price {u0:,} -> {u1:,} ({change:+.1%})"
                f"  ({row['does']})"
            )
        return lines + [""]

    def __str__(self) -> str:
        lines = [str(self.rewrite), ""]
        if self.shapes:
            lines += [self.shapes_line(), ""]
        lines += self.passes_text()
        if self.compiled is not None:
            lines += [f"Dispatches: {self.step_dispatches}", ""]
        lines.append(f"Kernels ({len(self.kernels)})")
        op_width = max([2, *(len(k.op) for k in self.kernels)])
        shape_width = max([5, *(len(shapes_text(k.shapes)) for k in self.kernels)])
        what_width = min(48, max([4, *(len(k.what) for k in self.kernels)]))
        lines.append(f"  {'%':>4}  {'op':<{op_width}}  {'shape':<{shape_width}}  {'what':<{what_width}}  source lines")
        for k in self.kernels:
            what = k.what if len(k.what) <= what_width else k.what[: what_width - 1] + "…"
            lines.append(
                f"  {k.node:>4}  {k.op:<{op_width}}  {shapes_text(k.shapes):<{shape_width}}  "
                f"{what:<{what_width}}  {', '.join(k.sources)}"
            )
        return "\n".join(lines)

    def summary(self) -> str:
        """Three lines: the e-graph's size and time, kernels before → after (dispatches, bytes), and
        the rules the plan uses with how often (`str(report)` is the whole report).

        >>> # print(program.report().summary())
        """
        rewrite = self.rewrite
        if not rewrite.enabled:
            return f"e-graph skipped: {rewrite.kernels_before} kernels"
        used = [f"{r.name} ×{r.uses}" for r in rewrite.rules if r.uses]
        before, after = rewrite.cost_before, rewrite.cost_after
        return "\n".join(
            [
                f"e-graph: {rewrite.ir_nodes} IR nodes, {rewrite.enodes} e-nodes, {rewrite.total_s * 1000:.0f} ms",
                f"kernels: {rewrite.kernels_before} -> {rewrite.kernels_after} (dispatches {before.dispatches}"
                f" -> {after.dispatches}, bytes {before.bytes:,} -> {after.bytes:,})"
                + (f"; {self.step_dispatches}" if self.compiled is not None else ""),
                f"rules used: {', '.join(used) or 'none'}",
            ]
        )

    def to_json(self) -> dict[str, Any]:
        """The same report as plain data (dicts, lists, numbers, strings): `json.dumps` works on it."""
        rewrite = json.loads(json.dumps(self.rewrite.to_data(), default=str))
        counts = self.step_dispatches
        return {
            "rewrite": rewrite,
            "dispatches": None if counts is None else dataclasses.asdict(counts),
            "passes": self.pass_rows(),
            "kernels": [
                {
                    "node": k.node,
                    "op": k.op,
                    "shape": list(k.shape),
                    "shapes": [list(s) for s in k.shapes],
                    "what": k.what,
                    "sources": list(k.sources),
                }
                for k in self.kernels
            ],
            "graph": str(self.graph),
            "fused_graph": str(self.fused_graph),
            "shapes": [{name: list(shape) for name, shape in s.items()} for s in self.shapes],
            "max_shapes": self.max_shapes,
        }

    def to_dot(self) -> str:
        """Graphviz DOT text of the traced step with each kernel of the plan outlined as a cluster
        around the IR nodes it covers (a fused kernel's cluster holds several nodes)."""
        return step_dot(self.graph, kernel_groups(self.fused_graph, getattr(self.rewrite, "covers", {})))


def shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def shapes_text(shapes: tuple[tuple[int, ...], ...]) -> str:
    return " ".join(shape_text(s) for s in shapes)


def step_graph(graph: Graph) -> nx.DiGraph:
    """The live part of `graph` as a networkx DiGraph; node attributes say how to draw it."""
    drawn = nx.DiGraph()
    live = graph.live_ids()
    for node in graph:
        if node.id not in live or node.op == "const":
            continue
        if node.op in ("input", "param", "state"):
            label = f"{node.op} {node.attr('name')}\\n{shape_text(node.shape)}"
            drawn.add_node(node.id, label=label, shape="ellipse", style="filled", fillcolor="#eeeeee")
        else:
            what = kernel_summary(node)
            fused = op_def(node.op).egraph is None  # the fused kernels the e-graph makes
            shapes = shapes_text(tuple(t.shape for t in node.types))
            label = f"%{node.id} {node.op}\\n{shapes}" + (f"\\n{escape(what)}" if what else "")
            drawn.add_node(
                node.id,
                label=label,
                shape="box",
                style="rounded,filled,bold" if fused else "rounded",
                fillcolor="#d8ecff" if fused else "white",
                tooltip=escape(", ".join(node.sources)),
            )
        for source in node.inputs:
            if source in drawn:
                drawn.add_edge(source, node.id)
    for name, node_id in {**graph.outputs, **graph.updates}.items():
        key = f"out:{name}"
        drawn.add_node(key, label=escape(name), shape="plaintext")
        drawn.add_edge(node_id, key, style="dashed")
    return drawn


def kernel_groups(fused_graph: Graph, covers: dict[int, list[int]]) -> dict[str, list[int]]:
    """Cluster label → the original IR nodes that one kernel of the plan computes."""
    groups: dict[str, list[int]] = {}
    for node in fused_graph:
        if op_def(node.op).kernel and covers.get(node.id):
            what = kernel_summary(node)
            groups[f"kernel %{node.id} {node.op}" + (f": {what}" if what else "")] = covers[node.id]
    return groups


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def step_dot(graph: Graph, groups: dict[str, list[int]] | None = None) -> str:
    """DOT text for `step_graph(graph)`; each group (a kernel of the plan) is an outlined cluster."""
    drawn = step_graph(graph)
    lines = ["digraph step {", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];']
    placed: set = set()
    for index, (label, members) in enumerate((groups or {}).items()):
        inside = [m for m in members if m in drawn and m not in placed and graph[m].op not in LEAVES]
        if not inside:
            continue
        fused = len(inside) > 1
        lines.append(f"  subgraph cluster_{index} {{")
        lines.append(
            f'    label="{escape(label)}"; fontsize=9; style="{"bold,rounded" if fused else "dashed,rounded"}";'
        )
        lines.append(f'    color="{"#1f6fd0" if fused else "#bbbbbb"}";')
        lines.extend(f"    {node_line(m, drawn.nodes[m])}" for m in inside)
        lines.append("  }")
        placed.update(inside)
    for node, attrs in drawn.nodes(data=True):
        if node not in placed:
            lines.append(f"  {node_line(node, attrs)}")
    for source, target, attrs in drawn.edges(data=True):
        fields = ", ".join(f'{key}="{value}"' for key, value in attrs.items())
        lines.append(f'  "{source}" -> "{target}"' + (f" [{fields}]" if fields else "") + ";")
    lines.append("}")
    return "\n".join(lines)


LEAVES = ("input", "param", "state", "const")


def node_line(node, attrs: dict) -> str:
    fields = ", ".join(f'{key}="{value}"' for key, value in attrs.items())
    return f'"{node}" [{fields}];'
