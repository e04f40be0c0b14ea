"""program.report(): the text a user reads, its JSON form, the DOT picture, and the CLI."""

from __future__ import annotations

import json
import shutil
import textwrap

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.__main__ import main
from meganeura.compiler import explain_only
from meganeura.ir.op import launches_kernel


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        hidden = F.relu(self.fc1(x))
        return self.fc2(hidden)


def compile_without_gpu():
    """A training program traced and optimised in explain mode (nothing built on the GPU)."""
    with explain_only() as programs:
        program = mn.compile(
            MLP(),
            loss=lambda m, x, y: F.cross_entropy(m(x), y),
            inputs={"x": mn.f32[8, 12], "y": mn.i32[8]},
            optimizer=optim.AdamW(lr=1e-3),
        )
    assert programs == [program] and program.executable is None
    return program


def test_report_lists_rules_costs_and_kernels_with_source_lines():
    program = compile_without_gpu()
    report = program.report()
    text = str(report)
    kernel_count = sum(
        1 for n in program.fused_graph if launches_kernel(n.op) and n.id in program.fused_graph.live_ids()
    )
    assert f"Kernels ({kernel_count})" in text
    assert len(report.kernels) == kernel_count == report.rewrite.kernels_after
    # The first Linear's kernel names this file's forward() lines.
    first = report.kernels[0]
    assert any(source.startswith("test_explain.py:") for source in first.sources)
    for kernel in report.kernels:
        assert f"{kernel.node:>4}  {kernel.op}" in text
    assert "bytes" in text and "dispatches" in text


def test_summary_gives_size_kernels_and_the_rules_used():
    report = compile_without_gpu().report()
    size, kernels, rules = report.summary().splitlines()
    rewrite = report.rewrite
    assert size.startswith(f"e-graph: {rewrite.ir_nodes} IR nodes, {rewrite.enodes} e-nodes")
    assert kernels.startswith(f"kernels: {rewrite.kernels_before} -> {rewrite.kernels_after} (dispatches")
    used = [r for r in rewrite.rules if r.uses]
    assert used and rules == "rules used: " + ", ".join(f"{r.name} ×{r.uses}" for r in used)
    assert "matmul_epilogue ×" in rules  # bias + relu of fc1 in its matmul


def test_report_to_json_is_plain_data():
    report = compile_without_gpu().report()
    data = json.loads(json.dumps(report.to_json()))
    assert len(data["kernels"]) == len(report.kernels)
    assert data["rewrite"]["kernels_after"] == len(report.kernels)
    assert {"node", "op", "shape", "what", "sources"} <= set(data["kernels"][0])
    assert data["fused_graph"].splitlines()[0].startswith("%0 = ")


def test_report_to_dot_outlines_every_kernel_around_the_nodes_it_covers():
    program = compile_without_gpu()
    report = program.report()
    dot = report.to_dot()
    assert dot.startswith("digraph step {") and dot.rstrip().endswith("}")
    for kernel in report.kernels:  # one cluster per kernel of the plan
        assert f'label="kernel %{kernel.node} {kernel.op}' in dot
    # The first Linear's matmul, bias add and relu are drawn inside one (bold) cluster.
    first = dot.split("subgraph cluster_")[1]
    assert "bold" in first and "matmul" in first and " add" in first and "relu" in first
    live = program.graph.live_ids()
    for node in program.graph:
        if node.id in live and node.op != "const":
            assert f'"{node.id}" [' in dot  # every traced value is drawn
    assert '"out:loss"' in dot


def test_cli_explain_prints_reports_and_writes_dot(tmp_path, capsys):
    script = tmp_path / "tiny_model.py"
    script.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import meganeura as mn
            import meganeura.functional as F
            from meganeura import nn, optim

            model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
            program = mn.compile(model, loss=lambda m, x, y: F.cross_entropy(m(x), y),
                                 inputs={"x": mn.f32[4, 6], "y": mn.i32[4]}, optimizer=optim.SGD(lr=0.1))
            program.train_step(x=np.zeros((4, 6), np.float32), y=np.zeros(4, np.int32))
            raise SystemExit("explain must stop the script before it trains")
            """
        )
    )
    assert main(["explain", "--out", str(tmp_path / "out"), "--wgsl", str(script)]) == 0
    printed = capsys.readouterr().out
    assert "=== program 0: training step" in printed
    assert "Kernels (" in printed and "tiny_model.py:" in printed
    assert "planned for generic GPU: 64 compute units" in printed
    # --wgsl: every kernel's source, in run order, under a comment naming it
    kernels = printed.count("// ---- kernel ")
    assert kernels >= 3 and printed.count("@compute") >= kernels
    assert f"--- WGSL of program 0: {kernels} kernels" in printed
    assert (tmp_path / "out" / "tiny_model-0.dot").read_text().startswith("digraph step {")
    if shutil.which("dot"):  # Graphviz installed: the picture is written too
        assert (tmp_path / "out" / "tiny_model-0.svg").read_text().lstrip().startswith("<?xml")


def test_report_shows_each_pass_after_extraction_with_what_it_changed():
    """The passes after extraction (meganeura/passes/) are in the report in their order, each with
    its kernels and the cost model's price before and after, or "no change": here the optimizer's
    fused updates grouped into one multi-tensor kernel (a GPU's plan; explain mode plans for a
    generic one)."""
    from meganeura.passes import PASSES
    from meganeura.rewrite.cost import graph_cost

    program = compile_without_gpu()
    report = program.report()
    rows = report.pass_rows()
    assert [row["pass"] for row in rows] == [step.name for step in PASSES]
    grouped = next(row for row in rows if row["pass"] == "group_updates")
    assert grouped["changed"] and grouped["kernels"][1] < grouped["kernels"][0]
    assert grouped["units"][1] < grouped["units"][0]
    # the last pass's plan is the compiled step's graph, priced alike
    last = program.compiled.passes[-1]
    assert last.after is program.compiled.graph
    assert rows[-1]["units"][1] == graph_cost(program.compiled.graph, program.compiled.target).units
    text = str(report)
    assert "Passes after extraction" in text and "group_updates" in text and "no change" in text
    assert json.loads(json.dumps(report.to_json()))["passes"] == rows
