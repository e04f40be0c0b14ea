"""Every candidate tile configuration of the matmul kernel on every product of a real training step,
timed in one process: the data behind codegen/gemm_table.py.

    python benchmarks/gemm_tune.py [--steps smollm2,gpt2] [--extra 4096x4096x4096] [--repeat 5]
                                   [--candidates all|cpu] [--json FILE]

The products are the distinct matmuls (shape, transposes, batch) of each named step as the
compiler plans it for this adapter (meganeura/bench/workloads.py, SmolLM2-135M and GPT-2-small
shapes), with how many times a step runs each, plus the `--extra` shapes (M×K×N, no transposes).
Each (product, configuration) is compiled alone, run back to back for 0.1 s (Executable.heat: the
clocks idle low while a pipeline compiles), then `repeat` dispatches are timed with GPU timestamps
(Executable.profile); the median counts, and its buffers are destroyed before the next
(configurations run in a shuffled order so that drift favours none). Epilogues are left out:
they cost the same in every configuration. For each product it prints the configuration the table picks today
and the fastest one (`--json` keeps every time).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
from collections import defaultdict

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


def step_products(name: str, target) -> dict[tuple, int]:
    """{(batch, m, k, n, transpose_a, transpose_b): count} of the matmuls of workload `name`'s step."""
    from meganeura.bench import workloads
    from meganeura.compiler import compile_plan

    work = {"smollm2": lambda: workloads.smollm2(30), "gpt2": lambda: workloads.gpt2(12)}[name]()
    compilation = compile_plan(work.model, work.loss, work.inputs, work.optimizer, target=target)
    graph = compilation.fused_graph
    counts: dict[tuple, int] = defaultdict(int)
    for node in graph.nodes:
        if node.op in ("matmul", "fused_matmul"):
            a, b = (graph[i].type for i in node.inputs[:2])
            batch, m, k, n = matmul_dims([matmul_a_view(a, node.attr_dict), b], node.attr_dict, node.op)
            flags = (bool(node.attr("transpose_a", False)), bool(node.attr("transpose_b", False)))
            counts[(tuple(batch), m, k, n, *flags)] += 1
    return dict(counts)


def seconds(product: tuple, tiling: GemmTiling, repeat: int, device) -> float:
    """Median GPU time of one dispatch of `product` with `tiling`."""
    batch, m, k, n, transpose_a, transpose_b = product
    tracer = Tracer()
    a = tracer.leaf("input", "a", TensorType((*batch, *((k, m) if transpose_a else (m, k)))))
    b = tracer.leaf("input", "b", TensorType((*batch, *((n, k) if transpose_b else (k, n)))))
    for index in range(repeat):
        tracer.graph.outputs[f"c{index}"] = tracer.emit(
            "matmul", [a, b], transpose_a=transpose_a, transpose_b=transpose_b
        )
    original = codegen_matmul.gemm_tiling
    codegen_matmul.gemm_tiling = lambda *_: tiling
    try:
        executable = Executable(compile_step(tracer.graph, device.target), device, {}, {})
    finally:
        codegen_matmul.gemm_tiling = original
    rng = np.random.default_rng(0)
    inputs = {name: rng.normal(size=tracer.graph[v].shape).astype(np.float32) for name, v in (("a", a), ("b", b))}
    try:
        executable.heat(inputs, 0.1)  # GPU clocks idle low while the pipeline compiles
        _, profile = executable.profile(inputs)
        times = sorted(kernel.ns for kernel in profile.kernels if kernel.kind == "matmul")
        return times[len(times) // 2] / 1e9
    finally:  # free the device memory now: a full device slows every later configuration
        for buffer in executable.buffers:
            buffer.destroy()
        del executable
        gc.collect()


def product_text(product: tuple) -> str:
    batch, m, k, n, transpose_a, transpose_b = product
    text = ("x".join(map(str, batch)) + "×" if batch else "") + f"{m}x{k}x{n}"
    return text + " Aᵀ" * transpose_a + " Bᵀ" * transpose_b


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
    products: dict[tuple, int] = defaultdict(int)
    for name in filter(None, args.steps.split(",")):
        found = step_products(name, target)
        ranked = sorted(found, key=lambda p: -found[p] * math.prod(p[0]) * math.prod(p[1:4]))
        for product in ranked[: args.top or None]:
            products[product] += found[product]
    for text in filter(None, args.extra.split(",")):
        m, k, n = (int(v) for v in text.split("x"))
        products[((), m, k, n, False, False)] += 1
    rows = []
    for product, count in sorted(products.items(), key=lambda item: -math.prod(item[0][0]) * math.prod(item[0][1:4])):
        batch, m, k, n = product[:4]
        flops = 2 * math.prod(batch) * m * n * k
        current = gemm_tiling(m, n, k, math.prod(batch), target, product[5])
        times = {}
        order = list(dict.fromkeys([current, *candidates]))
        random.Random(len(rows)).shuffle(order)  # no configuration always runs first (clock drift)
        for tiling in order:
            try:
                times[str(tiling)] = seconds(product, tiling, args.repeat, device)
            except Exception as error:  # a configuration the adapter refuses: report it, go on
                print(f"  {product_text(product)} {tiling}: {type(error).__name__}: {str(error)[:120]}")
        best = min(times, key=times.get)
        rows.append({"product": product_text(product), "count": count, "flops": flops,
                     "current": str(current), "seconds": times})  # fmt: skip
        print(
            f"{product_text(product):32s} ×{count:<3d} current {current} "
            f"{flops / times[str(current)] / 1e9:8.1f} GFLOP/s; best {best} {flops / times[best] / 1e9:8.1f}",
            flush=True,
        )
        if args.json:  # after every product: a run cut short keeps what it measured
            with open(args.json, "w") as file:
                json.dump({"adapter": device.describe(), "rows": rows}, file, indent=1)


if __name__ == "__main__":
    main()
