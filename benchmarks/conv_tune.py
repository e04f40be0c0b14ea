"""Every distinct conv_gemm kernel of the ResNet-18 bench step with each candidate GEMM tiling,
timed in one process: the data for the conv rows of codegen/gemm_table.py's ladders.

    PYTHONPATH=. python benchmarks/conv_tune.py [--small] [--repeat 8] [--candidates gpu|cpu]
                                                [--only TEXT] [--top N] [--json FILE]

The cases are the conv_gemm kernels of STEPS["resnet18"] (meganeura/bench/workloads.py; `--small`
its lavapipe-sized variant) as the compiler plans them for this adapter: mode, geometry, operand
shapes, split-K parts and the epilogue the e-graph fused in, with how many times a step runs each.
Each (case, tiling) is compiled alone with the tiling forced (codegen/conv.py takes it from
`gemm_tiling`), run back to back for 0.1 s (Executable.heat: the clocks idle low while a
pipeline compiles), then `repeat` dispatches are timed with GPU timestamps (Executable.profile);
the median counts, and its buffers are destroyed before the next (tilings run in a shuffled order
so that drift favours none). FLOPs are the cost model's (rewrite/cost.py: a grad_input counts
only the taps of its stride phases). For each case it prints TFLOP/s of the tiling the table
picks today and of every candidate; `--json` keeps every time.

Caveat, measured on the H200 (2026-12-01): timed alone, the forward and input-gradient kernels
ran up to 2-3x slower than the same kernels in the step's profile (forward 64x576x131072 at
64x128 prefetch: 699 µs here, 365 in the step), while the weight gradients agreed (within 5%).
Check a forward or input-gradient rung in the step (`python -m meganeura bench resnet18`) before
taking it into the table. On 2026-12-03 (about 19:30 UTC, `--only grad_weight`), since the
weight gradients gather a unit of 4 at once, they too read about twice their time in the step
(10.8 ms a step for the 7 against about 5.5): check every rung in the step
(`benchmarks/plan_ab.py --workloads resnet18`, replacing `gemm_table.CONV_TABLES['hopper']`).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass

from gemm_tune import median_seconds, one_op_graph  # benchmarks/ is the script's directory

from meganeura.codegen import conv as codegen_conv
from meganeura.codegen.gemm_table import GemmTiling
from meganeura.codegen.lower import lower_node
from meganeura.rewrite.cost import node_cost
from meganeura.runtime import default_device

# (bm, bn, bk, rm, rn, prefetch): the H200 ladders' rungs and their neighbours.
GPU_CANDIDATES = [
    GemmTiling(*c)
    for c in [
        (64, 128, 16, 2, 2, True), (64, 128, 16, 2, 2, False), (64, 128, 32, 2, 2, False),
        (128, 128, 16, 2, 2, False), (128, 128, 16, 2, 2, True), (128, 128, 32, 2, 2, False),
        (128, 64, 16, 2, 2, False), (64, 64, 16, 2, 2, False), (64, 64, 16, 1, 1, False),
        (32, 128, 16, 1, 2, False), (32, 64, 16, 1, 1, False),
    ]
]  # fmt: skip
CPU_CANDIDATES = [
    GemmTiling(*c)
    for c in [
        (128, 128, 16, 4, 4, False), (64, 128, 16, 4, 4, False), (128, 64, 16, 4, 4, False),
        (64, 64, 16, 4, 4, False), (64, 64, 16, 2, 2, False), (32, 64, 16, 1, 1, False),
    ]
]  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One conv_gemm kernel to time: its attributes as the step's plan has them, its operands'
    types (a float for a constant operand), its kernel label, its FLOPs and how many times a step
    runs it."""

    label: str
    operands: tuple
    attrs: tuple
    flops: int
    count: int


def one_node_graph(operands, attrs: dict, copies: int = 1):
    """A graph of `copies` conv_gemm nodes on the same leaves, outputs c0, c1, …"""
    return one_op_graph("conv_gemm", operands, attrs, copies)


def step_cases(small: bool, target) -> list[Case]:
    """The distinct conv_gemm kernels of the ResNet-18 step as the compiler plans it for `target`."""
    from meganeura.bench.workloads import STEPS
    from meganeura.compiler import compile_plan

    work = STEPS["resnet18"].build(small=small)
    graph = compile_plan(work.model, work.loss, work.inputs, work.optimizer, target=target).fused_graph
    found: dict[str, Case] = {}
    for node in graph.nodes:
        if node.op != "conv_gemm":
            continue
        operands = tuple(
            float(graph[i].attr("value")) if graph[i].op == "const" else graph[i].type for i in node.inputs
        )
        attrs = tuple(sorted(node.attr_dict.items()))
        single = one_node_graph(operands, dict(attrs))
        out = single.outputs["c0"]
        label = lower_node(single, out, target).label
        previous = found.get(label)
        count = 1 + (previous.count if previous else 0)
        found[label] = Case(label, operands, attrs, node_cost(single, out).flops, count)
    return list(found.values())


def seconds(case: Case, tiling: GemmTiling, repeat: int, device) -> float:
    """Median GPU time of one dispatch of `case` with `tiling`."""
    graph = one_node_graph(case.operands, dict(case.attrs), repeat)
    return median_seconds(graph, case.operands, codegen_conv, tiling, ("conv_gemm",), device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="the lavapipe-sized ResNet step (a check that it runs)")
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--candidates", choices=("gpu", "cpu"), default=None, help="default: by adapter type")
    parser.add_argument("--only", default="", help="only the kernels whose label contains this text")
    parser.add_argument("--top", type=int, default=0, help="only the N kernels of most FLOPs per step")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = default_device()
    target = device.target
    candidates = CPU_CANDIDATES if (args.candidates or ("cpu" if target.cpu else "gpu")) == "cpu" else GPU_CANDIDATES
    print(f"adapter: {device.describe()}; target {target.name} ({target.tuning}{', cpu' if target.cpu else ''})")
    cases = sorted(step_cases(args.small, target), key=lambda c: -c.count * c.flops)
    cases = [case for case in cases if args.only in case.label][: args.top or None]
    rows = []
    total_current = total_best = 0.0
    for case in cases:
        graph = one_node_graph(case.operands, dict(case.attrs))
        node = graph[graph.outputs["c0"]]
        types = [graph[i].type for i in node.inputs]
        current = codegen_conv.conv_tiling(node.attr_dict, types[0].shape, types[1].shape, node.shape, target)
        order = list(dict.fromkeys([current, *candidates]))
        random.Random(len(rows)).shuffle(order)  # no tiling always runs first (clock drift)
        times = {}
        for tiling in order:
            if tiling.workgroup_bytes > target.workgroup_memory:
                continue
            try:
                times[str(tiling)] = seconds(case, tiling, args.repeat, device)
            except Exception as error:  # a tiling the adapter refuses: report it, go on
                print(f"  {tiling}: {type(error).__name__}: {str(error)[:120]}")
        best = min(times, key=times.get)
        total_current += case.count * times[str(current)]
        total_best += case.count * times[best]
        rows.append({"kernel": case.label, "count": case.count, "flops": case.flops,
                     "current": str(current), "best": best, "seconds": times})  # fmt: skip
        print(f"{case.label}  ×{case.count}", flush=True)
        for name, time in sorted(times.items(), key=lambda item: item[1]):
            mark = " <- current" if name == str(current) else ""
            print(f"    {name:28s} {case.flops / time / 1e12:8.3f} TFLOP/s {time * 1e6:10.1f} µs{mark}", flush=True)
        if args.json:  # after every kernel: a run cut short keeps what it measured
            with open(args.json, "w") as file:
                json.dump({"adapter": device.describe(), "small": args.small, "rows": rows}, file, indent=1)
    print(
        f"per step, the {len(rows)} conv_gemm kernels: {total_current * 1e3:.3f} ms with today's tilings, "
        f"{total_best * 1e3:.3f} ms with each kernel's fastest candidate"
    )


if __name__ == "__main__":
    main()
