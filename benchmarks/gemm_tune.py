"""Every candidate tile configuration of the matmul kernel on every product of a real training step,
timed in one process: the data behind codegen/gemm_table.py.

    python benchmarks/gemm_tune.py [--steps smollm2,gpt2] [--extra 4096x4096x4096,24*768x256x64,2048x1536x576:Bt]
                                   [--splits 1,2,3,4,6,8] [--runs 10] [--repeat 5] [--candidates gpu|cpu]
                                   [--tilings "64x64/k16 8x8 prefetch;128x128/k16 8x8"] [--json FILE]

The cases are the distinct matmul kernels of each named step as the compiler plans it for this
adapter (meganeura/bench/workloads.py, SmolLM2-135M and GPT-2-small shapes): shape, transposes,
batch, and the prologue and epilogue the e-graph fused into them (they change what a tile costs:
a prologue runs in the staging loads), with how many times a step runs each, plus the `--extra`
bare products: M×K×N of the product computed, "B*M×K×N" a batch of B, and a suffix ":Bt" where B
is stored [N, K] (x·Wᵀ, dA = G·Bᵀ), ":At" where A is stored [K, M] (dB = Aᵀ·G), ":AtBt" both
(2048x1536x576:Bt is `bench gemm`'s 2048×576×1536 G·Bᵀ). Each (case, configuration) is compiled
alone, run back to back for 0.1 s (Executable.heat: the clocks idle low while a pipeline
compiles), then `repeat` dispatches are timed with GPU timestamps (Executable.profile); the median
counts, and its buffers are destroyed before the next (configurations run in a shuffled order so
that drift favours none). For each case it prints the configuration the table picks today and the fastest one
(`--json` keeps every time).

`--splits 1,2,4`: each `--extra` product is instead timed split along K as the split-K rewrite
plans it (rewrite/matmul.py `matmul_split_k`): a fused_matmul(splits=S) into partials
[S, *batch, M, N], then a `sum` over axis 0, for every (tiling, S) pair (S = 1: the product
alone; an S that leaves a part of K empty is skipped). A pair's time is the median split kernel
plus the median sum kernel; its first result is checked against numpy (an error past CHECK_RTOL
of the largest |value| aborts the sweep). For each case it prints the fastest pairs and the pair
the planner picks today (rewrite.optimize for this adapter: its split count, and the tiling
`split_tiling` gives it). "M×K×N@4/8" sweeps that product over its own counts of parts;
`--tilings` times only the tilings named (and the table's); `--runs N` times each pair as bench
gemm times a planned product (one product a graph, N of it back to back in one pass, the median of
bench gemm's TIMINGS such passes) instead of `repeat` copies in one profiled run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
from dataclasses import dataclass

import numpy as np

from meganeura.bench.gemm import TIMINGS
from meganeura.codegen import matmul as codegen_matmul
from meganeura.codegen.gemm_table import GemmTiling, gemm_tiling
from meganeura.codegen.matmul import split_tiling
from meganeura.ir.graph import TensorType
from meganeura.ir.ops.matmul import matmul_a_view, matmul_dims
from meganeura.ir.ops.reduce import split_length
from meganeura.ir.trace import Tracer
from meganeura.passes import compile_step
from meganeura.runtime import Executable, default_device

CHECK_RTOL = 1e-3  # as bench gemm: of the largest |value|; a wrong split is off by far more

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
    """A bare M×K×N product from its text; "B*M×K×N" is a batch of B of them (attention's dQ from
    dS: 24*768x256x64 at SmolLM2's shapes, passes/attention_scores.py); a suffix ":Bt" stores B
    as [N, K], ":At" A as [K, M], ":AtBt" both (the transposes of one matmul's flags)."""
    shape, _, flags = text.partition(":")
    if flags not in ("", "At", "Bt", "AtBt"):
        raise ValueError(f"a product's suffix is :At, :Bt or :AtBt, got {text!r}")
    batch, _, dims = shape.rpartition("*")
    m, k, n = (int(v) for v in dims.split("x"))
    lead = (int(batch),) if batch else ()
    ta, tb = "At" in flags, "Bt" in flags
    a = TensorType((*lead, k, m) if ta else (*lead, m, k))
    b = TensorType((*lead, n, k) if tb else (*lead, k, n))
    attrs = tuple(sorted({"transpose_a": ta, "transpose_b": tb}.items())) if flags else ()
    case = Case("", "matmul", (a, b), attrs, 1)
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


def operand_values(operands) -> dict[str, np.ndarray]:
    """The inputs x0, x1, … of a graph on `operands` (normal, seed 0), made once per operands:
    the LM head's 2048x49152 operand takes seconds to draw."""
    key = tuple(operands)
    if _VALUES.get("key") != key:
        rng = np.random.default_rng(0)
        drawn = [(i, t) for i, t in enumerate(operands) if not isinstance(t, float)]
        values = {f"x{i}": rng.normal(size=t.shape).astype(np.float32) for i, t in drawn}
        _VALUES.update(key=key, values=values)
    return _VALUES["values"]


_VALUES: dict = {}


def forced_executable(graph, lowering_module, tiling: GemmTiling, device) -> Executable:
    """`graph` compiled for the device with every GEMM tiling of the lowering in
    `lowering_module` (codegen.matmul or codegen.conv) forced to `tiling`."""
    original = lowering_module.gemm_tiling
    lowering_module.gemm_tiling = lambda *_, **__: tiling
    try:
        return Executable(compile_step(graph, device.target), device, {}, {})
    finally:
        lowering_module.gemm_tiling = original


def destroy(executable: Executable) -> None:
    """Free the device memory now: a full device slows every later configuration."""
    for buffer in executable.buffers:
        buffer.destroy()
    gc.collect()


def median(values) -> float:
    values = sorted(values)
    return values[len(values) // 2]


def median_seconds(graph, operands, lowering_module, tiling: GemmTiling, kinds: tuple[str, ...], device) -> float:
    """Median GPU time of the dispatches of `kinds` in `graph`, every GEMM tiling of the lowering
    in `lowering_module` (codegen.matmul or codegen.conv) forced to `tiling`."""
    executable = forced_executable(graph, lowering_module, tiling, device)
    inputs = operand_values(operands)
    try:
        executable.heat(inputs, 0.1)  # GPU clocks idle low while the pipeline compiles
        _, profile = executable.profile(inputs)
        return median(kernel.ns for kernel in profile.kernels if kernel.kind in kinds) / 1e9
    finally:
        destroy(executable)
        del executable


def seconds(case: Case, tiling: GemmTiling, repeat: int, device) -> float:
    """Median GPU time of one dispatch of `case` with `tiling`."""
    graph = one_op_graph(case.op, case.operands, dict(case.attrs), repeat)
    return median_seconds(graph, case.operands, codegen_matmul, tiling, ("matmul", "fused_matmul"), device)


def split_graph(case: Case, splits: int, copies: int):
    """A graph of `copies` of `case`'s product as the split-K rewrite plans it in `splits` parts
    (the nodes `optimize` leaves: a fused_matmul with `splits` into partials [S, *batch, M, N] and
    a `sum` over axis 0, outputs c0, c1, …); `splits` 1: the product alone."""
    if splits == 1:
        return one_op_graph(case.op, case.operands, dict(case.attrs), copies)
    attrs = {"epilogue": "$acc", "prologue": "$a", "flatten_a": False, "transpose_a": False, "transpose_b": False}
    attrs.update(dict(case.attrs), splits=splits)
    tracer = Tracer()
    leaves = [tracer.leaf("input", f"x{i}", t) for i, t in enumerate(case.operands)]
    for index in range(copies):
        partials = tracer.emit("fused_matmul", leaves, **attrs)
        tracer.graph.outputs[f"c{index}"] = tracer.emit("sum", [partials], axes=(0,), keepdim=False)
    return tracer.graph


def reference(case: Case) -> np.ndarray:
    """numpy's (float64) product of `case`'s operands (operand_values), made once per case."""
    if _REFERENCE.get("key") != case.label:
        attrs = dict(case.attrs)
        a, b = (operand_values(case.operands)[f"x{i}"].astype(np.float64) for i in range(2))
        a = np.swapaxes(a, -1, -2) if attrs.get("transpose_a") else a
        b = np.swapaxes(b, -1, -2) if attrs.get("transpose_b") else b
        _REFERENCE.update(key=case.label, value=a @ b)
    return _REFERENCE["value"]


_REFERENCE: dict = {}


MATMUL_KINDS = ("matmul", "fused_matmul")


def split_seconds(case: Case, tiling: GemmTiling, splits: int, repeat: int, device, runs: int = 0) -> dict:
    """{product_s, sum_s, seconds, error} of `case` in `splits` parts of K with `tiling`: the median
    split kernel and sum kernel (0 for 1 part) of `repeat` copies in one profiled run, `seconds`
    their total; with `runs`, as bench gemm times a product instead: one copy, `seconds` the median
    of TIMINGS passes of `runs` of it back to back (Executable.repeated_ns), `product_s` and
    `sum_s` its parts in the proportions of one profiled run. `error`: the first result's against numpy,
    relative to its largest |value|."""
    executable = forced_executable(split_graph(case, splits, 1 if runs else repeat), codegen_matmul, tiling, device)
    inputs = operand_values(case.operands)
    try:
        executable.heat(inputs, 0.1)  # GPU clocks idle low while the pipeline compiles
        outputs, profile = executable.profile(inputs, ("c0",))
        expected = reference(case)
        error = float(np.abs(outputs["c0"] - expected).max() / max(float(np.abs(expected).max()), 1e-30))
        if runs:
            share = sum(k.ns for k in profile.kernels if k.kind in MATMUL_KINDS) / max(profile.total_ns, 1)
            total = median(executable.repeated_ns(inputs, runs) for _ in range(TIMINGS)) / 1e9
            return {"product_s": share * total, "sum_s": (1 - share) * total, "seconds": total, "error": error}
        products = [k.ns for k in profile.kernels if k.kind in MATMUL_KINDS]
        per_copy: dict[int, int] = {}  # the sum's kernels (all of them, were it lowered to several) per copy
        for kernel in profile.kernels:
            if kernel.kind not in MATMUL_KINDS:
                per_copy[kernel.node] = per_copy.get(kernel.node, 0) + kernel.ns
        product_s, sum_s = median(products) / 1e9, (median(per_copy.values()) / 1e9 if per_copy else 0.0)
        return {"product_s": product_s, "sum_s": sum_s, "seconds": product_s + sum_s, "error": error}
    finally:
        destroy(executable)
        del executable


def parse_tiling(text: str) -> GemmTiling:
    """A GemmTiling from its `str`: "64x64/k16 8x8 prefetch" (BMxBN/kBK, then 4·RM x 4·RN)."""
    tile, per_thread, *extra = text.split()
    bm, rest = tile.split("x")
    bn, bk = rest.split("/k")
    rows, cols = (int(v) // 4 for v in per_thread.split("x"))
    if extra not in ([], ["prefetch"]):
        raise ValueError(f"a tiling reads like '64x64/k16 8x8 prefetch', got {text!r}")
    return GemmTiling(int(bm), int(bn), int(bk), rows, cols, bool(extra))


def planned_split(case: Case, target) -> tuple[int, GemmTiling]:
    """(parts of K, tiling) the planner gives `case`'s product on `target` today: `optimize` on the
    product alone (the cost model decides whether the split fact is taken), the tiling as the
    lowering picks it (`split_tiling`)."""
    from meganeura.rewrite import optimize

    graph = one_op_graph(case.op, case.operands, dict(case.attrs))
    planned, _ = optimize(graph, target=target)
    (node,) = [n for n in planned.nodes if n.op in ("matmul", "fused_matmul")]
    splits = node.attr("splits", 1) if node.op == "fused_matmul" else 1
    batch, m, k, n = case.dims
    attrs = dict(case.attrs)
    transposes = bool(attrs.get("transpose_b")), bool(attrs.get("transpose_a"))
    return splits, split_tiling(m, n, k, math.prod(batch), splits, target, *transposes)


def sweep_splits(
    case: Case, split_counts, candidates, repeat: int, device, row: dict, save, runs: int = 0, top: int = 6
) -> dict:
    """Every (tiling, parts of K) pair of `case` (split_seconds), in a shuffled order, each kept in
    `row["pairs"]` and `save()`d as it is measured; prints the `top` fastest, the fastest at each
    count of parts and the planner's pick; returns the row `--json` keeps."""
    batch, m, k, n = case.dims
    batches, attrs = math.prod(batch), dict(case.attrs)
    transposes = bool(attrs.get("transpose_b")), bool(attrs.get("transpose_a"))
    target = device.target
    planned = planned_split(case, target)
    pairs = []
    for splits in split_counts:
        if splits > 1 and (splits - 1) * split_length(k, splits) >= k:
            print(f"  {case.label}: {splits} parts of K={k} leave one empty: skipped")
            continue
        table = split_tiling(m, n, k, batches, splits, target, *transposes)
        pairs += [(tiling, splits) for tiling in dict.fromkeys([table, *candidates])]
    random.Random(case.label).shuffle(pairs)  # no configuration always runs first (clock drift)
    times = row["pairs"]
    for tiling, splits in pairs:
        key = f"{tiling} S{splits}"
        try:
            timed = split_seconds(case, tiling, splits, repeat, device, runs)
        except Exception as error:  # a configuration the adapter refuses: report it, go on
            print(f"  {case.label} {key}: {type(error).__name__}: {str(error)[:120]}")
            continue
        if timed["error"] > CHECK_RTOL:
            raise AssertionError(f"{case.label} {key}: error {timed['error']:.1e} of the largest |value| (numpy)")
        times[key] = {"tiling": str(tiling), "splits": splits, **timed}
        save()
    ranked = sorted(times, key=lambda key: times[key]["seconds"])
    pick = f"{planned[1]} S{planned[0]}"

    def line(what: str, key: str) -> str:
        t = times[key]
        return (
            f"  {what:12s} {key:32s} {1e3 * t['seconds']:8.4f} ms = {1e3 * t['product_s']:.4f} + "
            f"{1e3 * t['sum_s']:.4f}  {case.flops / t['seconds'] / 1e12:7.3f} TFLOP/s  error {t['error']:.1e}"
        )

    print(f"{case.label}: {len(times)} pairs (ms = split kernel + sum); the fastest, then each S's, then the planner's")
    for key in ranked[:top]:
        print(line("", key))
    for splits in sorted({t["splits"] for t in times.values()}):
        best = min((key for key in times if times[key]["splits"] == splits), key=lambda key: times[key]["seconds"])
        print(line(f"best S={splits}", best))
    print(line("planner", pick) if pick in times else f"  planner      {pick} not timed", flush=True)
    return {"product": case.label, "flops": case.flops, "planned": pick, "best": ranked[0] if ranked else None,
            "pairs": times}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="smollm2,gpt2", help="workloads whose products to time ('' for none)")
    parser.add_argument("--top", type=int, default=0, help="only each step's N products of most FLOPs per step")
    parser.add_argument(
        "--extra",
        default="4096x4096x4096,8192x768x3072",
        help="more M×K×N products ('B*' before: a batch of B; ':Bt' after: B stored [N, K]; ':At': A stored [K, M]; "
        "'@4/8' last: with --splits, this product's own counts of parts)",
    )
    parser.add_argument(
        "--splits",
        default="",
        help="e.g. 1,2,4: time each --extra product split along K into each count of parts, with every tiling "
        "(the split kernel plus the sum of its partials)",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=0,
        help="with --splits: time each pair as bench gemm does (one product, this many back to back in a pass)",
    )
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--candidates", choices=("gpu", "cpu"), default=None, help="default: by adapter type")
    parser.add_argument(
        "--tilings", default="", help="only these candidates, ';'-separated as printed: '64x64/k16 8x8 prefetch;…'"
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = default_device()
    target = device.target
    candidates = CPU_CANDIDATES if (args.candidates or ("cpu" if target.cpu else "gpu")) == "cpu" else GPU_CANDIDATES
    candidates = [parse_tiling(text) for text in args.tilings.split(";") if text.strip()] or candidates
    print(f"adapter: {device.describe()}; target {target.name} ({target.tuning}{', cpu' if target.cpu else ''})")
    cases: dict[str, Case] = {}
    for name in filter(None, args.steps.split(",")):
        found = sorted(step_cases(name, target), key=lambda c: -c.count * c.flops)
        for case in found[: args.top or None]:
            previous = cases.get(case.label)
            cases[case.label] = Case(
                case.label, case.op, case.operands, case.attrs, case.count + (previous.count if previous else 0)
            )
    texts = [text.partition("@") for text in filter(None, args.extra.split(","))]  # "…@4/8": its own --splits
    extras = [product_case(text) for text, _, _ in texts]
    split_counts = [int(v) for v in filter(None, args.splits.split(","))]
    own_counts = {
        case.label: [int(v) for v in own.split("/")] for case, (_, _, own) in zip(extras, texts, strict=True) if own
    }
    split_mode = bool(split_counts or own_counts)
    for case in [] if split_mode else extras:  # with --splits the extras are swept apart
        cases.setdefault(case.label, case)
    rows, split_rows = [], []

    def save() -> None:  # after every product: a run cut short keeps what it measured
        if args.json:
            with open(args.json, "w") as file:
                json.dump({"adapter": device.describe(), "rows": rows, "split_rows": split_rows}, file, indent=1)

    for case in extras if split_mode else []:
        split_rows.append({"product": case.label, "pairs": {}})
        counts = own_counts.get(case.label, split_counts)
        split_rows[-1] = sweep_splits(case, counts, candidates, args.repeat, device, split_rows[-1], save, args.runs)
        save()
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
        save()


if __name__ == "__main__":
    main()
