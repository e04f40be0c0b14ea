"""Every candidate tile configuration of the matmul kernel on every product of a real training step,
timed in one process: the data behind codegen/gemm_table.py.

    python benchmarks/gemm_tune.py [--steps smollm2,gpt2] [--extra 4096x4096x4096,24*768x256x64] [--repeat 5]
                                   [--candidates all|cpu] [--json FILE]

The cases are the distinct matmul kernels of each named step as the compiler plans it for this
adapter (meganeura/bench/workloads.py, SmolLM2-135M and GPT-2-small shapes): shape, transposes,
batch, and the prologue and epilogue the e-graph fused into them (they change what a tile costs:
a prologue runs in the staging loads), with how many times a step runs each, plus the `--extra`
bare products (M×K×N, no transposes). Each (case, configuration) is compiled alone, run back to
back for 0.1 s (Executable.heat: the clocks idle low while a pipeline compiles), then `repeat`
dispatches are timed with GPU timestamps (Executable.profile); the median counts, and its buffers
are destroyed before the next (configurations run in a shuffled order so that drift favours
none). For each case it prints the configuration the table picks today and the fastest one
(`--json` keeps every time).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
from dataclasses import dataclass

import numpy as np

from meganeura.codegen import matmul as codegen_matmul
from meganeura.codegen.compiled import compile_step
from meganeura.codegen.gemm_table import GemmTiling, gemm_tiling
from meganeura.ir.graph import TensorType
from meganeura.ir.ops.matmul import matmul_a_view, matmul_dims
from meganeura.ir.trace import Tracer
from meganeura.runtime import Executable, default_device

# (bm, bn, bk, rm, rn, prefetch)
GPU_CANDIDATES = [
    GemmTiling(*c)
    for c in [
        (128, 128, 8, 2, 2, False), (128, 128, 16, 2, 2, False), (128, 128, 32, 2, 2, False),
        (128, 128, 16, 2, 2, True), (64, 128, 16, 2, 2, False), (64, 128, 32, 2, 2, False),
        (64, 128, 16, 2, 2, True), (128, 64, 16, 2, 2, False), (64, 64, 16, 2, 2, False),
        (64, 64, 16, 1, 1, False), (32, 128, 16, 1, 2, False), (32, 64, 16, 1, 1, False),
        (64, 64, 16, 2, 2, True), (64, 64, 32, 2, 2, False), (128, 64, 16, 2, 1, False),
        (32, 64, 32, 1, 1, False), (64, 64, 16, 2, 1, False), (32, 32, 16, 1, 1, False),
    ]
]  # fmt: skip
CPU_CANDIDATES = [
    GemmTiling(*c)
    for c in [
        (128, 128, 16, 4, 4, False), (64, 64, 16, 4, 4, False), (128, 64, 16, 4, 4, False),
        (64, 128, 16, 4, 4, False), (128, 128, 16, 2, 4, False), (128, 128, 16, 4, 2, False),
        (64, 64, 16, 2, 2, False), (128, 128, 32, 4, 4, False), (64, 64, 16, 1, 1, False),
    ]
]  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One matmul kernel to time: its op and attributes as the step's plan has them (prologue and
    epilogue included), its operands' types (a float for a constant operand) and how many times a
    step runs it."""

    label: str
    op: str
    operands: tuple
    attrs: tuple
    count: int

    @property
    def dims(self) -> tuple[tuple[int, ...], int, int, int]:
        attrs = dict(self.attrs)
        return matmul_dims([matmul_a_view(self.operands[0], attrs), self.operands[1]], attrs, self.op)

    @property
    def flops(self) -> int:
        batch, m, k, n = self.dims
        return 2 * math.prod(batch) * m * n * k


def step_cases(name: str, target) -> list[Case]:
    """The distinct matmul kernels (label: shape, transposes, prologue, epilogue) of workload
    `name`'s step as the compiler plans it for `target`, with how many times a step runs each."""
    from meganeura.bench import workloads
    from meganeura.compiler import compile_plan

    work = {"smollm2": lambda: workloads.smollm2(30), "gpt2": lambda: workloads.gpt2(12)}[name]()
    compilation = compile_plan(work.model, work.loss, work.inputs, work.optimizer, target=target)
    graph = compilation.fused_graph
    found: dict[str, Case] = {}
    for node in graph.nodes:
        if node.op not in ("matmul", "fused_matmul"):
            continue
        operands = tuple(
            float(graph[i].attr("value")) if graph[i].op == "const" else graph[i].type for i in node.inputs
        )
        case = Case("", node.op, operands, tuple(sorted(node.attr_dict.items())), 1)
        label = case_label(case)
        previous = found.get(label)
        found[label] = Case(label, case.op, operands, case.attrs, 1 + (previous.count if previous else 0))
    return list(found.values())


def case_label(case: Case) -> str:
    batch, m, k, n = case.dims
    attrs = dict(case.attrs)
    text = ("x".join(map(str, batch)) + "×" if batch else "") + f"{m}x{k}x{n}"
    text += " Aᵀ" * bool(attrs.get("transpose_a")) + " Bᵀ" * bool(attrs.get("transpose_b"))
    for key, plain in (("prologue", "$a"), ("epilogue", "$acc")):
        if attrs.get(key, plain) != plain:
            text += f" {key[:3]}={attrs[key]}"
    return text


def product_case(text: str) -> Case:
    """A bare M×K×N product (no transposes) from its text; "B*M×K×N" is a batch of B of them
    (attention's dQ from dS: 24*768x256x64 at SmolLM2's shapes, codegen/attention_scores.py)."""
    batch, _, dims = text.rpartition("*")
    m, k, n = (int(v) for v in dims.split("x"))
    lead = (int(batch),) if batch else ()
    case = Case("", "matmul", (TensorType((*lead, m, k)), TensorType((*lead, k, n))), (), 1)
    return Case(case_label(case), case.op, case.operands, case.attrs, 1)


def one_op_graph(op: str, operands, attrs: dict, copies: int = 1):
    """A graph of `copies` nodes of `op` on the same leaves (a float operand is a constant),
    outputs c0, c1, …"""
    tracer = Tracer()
    leaves = [
        tracer.const(t) if isinstance(t, float) else tracer.leaf("input", f"x{i}", t) for i, t in enumerate(operands)
    ]
    for index in range(copies):
        tracer.graph.outputs[f"c{index}"] = tracer.emit(op, leaves, **attrs)
    return tracer.graph


def median_seconds(graph, operands, lowering_module, tiling: GemmTiling, kinds: tuple[str, ...], device) -> float:
    """Median GPU time of the dispatches of `kinds` in `graph`, every GEMM tiling of the lowering
    in `lowering_module` (codegen.matmul or codegen.conv) forced to `tiling`."""
    original = lowering_module.gemm_tiling
    lowering_module.gemm_tiling = lambda *_, **__: tiling
    try:
        executable = Executable(compile_step(graph, device.target), device, {}, {})
    finally:
        lowering_module.gemm_tiling = original
    rng = np.random.default_rng(0)
    inputs = {
        f"x{i}": rng.normal(size=t.shape).astype(np.float32) for i, t in enumerate(operands) if not isinstance(t, float)
    }
    try:
        executable.heat(inputs, 0.1)  # GPU clocks idle low while the pipeline compiles
        _, profile = executable.profile(inputs)
        times = sorted(kernel.ns for kernel in profile.kernels if kernel.kind in kinds)
        return times[len(times) // 2] / 1e9
    finally:  # free the device memory now: a full device slows every later configuration
        for buffer in executable.buffers:
            buffer.destroy()
        del executable
        gc.collect()


def seconds(case: Case, tiling: GemmTiling, repeat: int, device) -> float:
    """Median GPU time of one dispatch of `case` with `tiling`."""
    graph = one_op_graph(case.op, case.operands, dict(case.attrs), repeat)
    return median_seconds(graph, case.operands, codegen_matmul, tiling, ("matmul", "fused_matmul"), device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="smollm2,gpt2", help="workloads whose products to time ('' for none)")
    parser.add_argument("--top", type=int, default=0, help="only each step's N products of most FLOPs per step")
    parser.add_argument("--extra", default="4096x4096x4096,8192x768x3072", help="more M×K×N products")
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--candidates", choices=("gpu", "cpu"), default=None, help="default: by adapter type")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = default_device()
    target = device.target
    candidates = CPU_CANDIDATES if (args.candidates or ("cpu" if target.cpu else "gpu")) == "cpu" else GPU_CANDIDATES
    print(f"adapter: {device.describe()}; target {target.name} ({target.tuning}{', cpu' if target.cpu else ''})")
    cases: dict[str, Case] = {}
    for name in filter(None, args.steps.split(",")):
        found = sorted(step_cases(name, target), key=lambda c: -c.count * c.flops)
        for case in found[: args.top or None]:
            previous = cases.get(case.label)
            cases[case.label] = Case(
                case.label, case.op, case.operands, case.attrs, case.count + (previous.count if previous else 0)
            )
    for text in filter(None, args.extra.split(",")):
        case = product_case(text)
        cases.setdefault(case.label, case)
    rows = []
    for case in sorted(cases.values(), key=lambda c: -c.count * c.flops):
        batch, m, k, n = case.dims
        current = gemm_tiling(m, n, k, math.prod(batch), target, bool(dict(case.attrs).get("transpose_b")))
        times = {}
        order = list(dict.fromkeys([current, *candidates]))
        random.Random(len(rows)).shuffle(order)  # no configuration always runs first (clock drift)
        for tiling in order:
            try:
                times[str(tiling)] = seconds(case, tiling, args.repeat, device)
            except Exception as error:  # a configuration the adapter refuses: report it, go on
                print(f"  {case.label} {tiling}: {type(error).__name__}: {str(error)[:120]}")
        best = min(times, key=times.get)
        flops = case.flops
        rows.append({"product": case.label, "count": case.count, "flops": flops,
                     "current": str(current), "seconds": times})  # fmt: skip
        print(
            f"{case.label[:60]:60s} ×{case.count:<3d} current {current} "
            f"{flops / times[str(current)] / 1e9:8.1f} GFLOP/s; best {best} {flops / times[best] / 1e9:8.1f}",
            flush=True,
        )
        if args.json:  # after every product: a run cut short keeps what it measured
            with open(args.json, "w") as file:
                json.dump({"adapter": device.describe(), "rows": rows}, file, indent=1)


if __name__ == "__main__":
    main()
