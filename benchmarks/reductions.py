"""Column reductions and convolution weight gradients, one kernel (or one pair) at a time: the
one-level form against two-level / split-K forms of several split sizes, GPU timestamps, one process.

    python benchmarks/reductions.py [--batch 128] [--elements 29360128] [--repeat 5]
                                    [--only bn,sum,col,partials,wgrad] [--entries reduce_serial[:64[x4]],…]

Workloads (ResNet-18 on CIFAR shapes at `--batch`, and the LM-sized bias gradient):
- bn: the batch-norm statistics of ResNet-18's stages, Σx² over (N, H, W) of [N, C, H, W] → [C]
  (a fused_reduce with the prologue x·x, as the training step runs them), C·H·W = 64·32², 128·16²,
  256·8², 512·4²;
- sum: a full sum of `--elements` elements (28M by default) to a scalar;
- col: column sums [rows, C] → [C]: the bias gradients of a 2048-token batch (C = 1536, 768)
  and of the digits MLP (256 × 1024), an RMSNorm weight's gradient (2048 × 576);
- partials: the combine of a split product's partials, [S, 2048, 576] → [2048, 576], S = 2, 4;
- wgrad: the 3×3 weight gradients (stride 1, padding 1) of the 32×32, 16×16 and 8×8 stages,
  g [N, C, H·W] and x [N, C, H, W] → [C, C·9]: the whole-batch GEMM (chunks 1), one per image
  (chunks N, then the sum over the batch) and split-K in S parts (then the sum).

Every variant is built as IR nodes directly (no e-graph: the forms are the ones the planner
chooses between), `--repeat` copies of it in one step; a variant's time is the median over its
copies of the GPU time of its kernels (partials + combine), each dispatch in its own timed pass
(Executable.profile). `S*` marks the split the compiler would choose on this adapter
(codegen/reduce.py `reduce_splits`, codegen/conv.py `weight_splits`), `*` alone the one-level form
where it chooses no split. GB/s counts the bytes the cost model counts (reads + writes, partials
included); TFLOP/s the GEMM's 2·M·N·K. `--entries` times every reduction again with each named
entry point of shaders/reduce.wgsl forced (each computes any reduction: the choice is speed
only), so the rule of `codegen.reduce.reduce_plan` can be checked against the others.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict

import numpy as np

from meganeura.codegen import reduce as codegen_reduce
from meganeura.codegen.conv import weight_splits
from meganeura.codegen.reduce import reduce_splits
from meganeura.ir.graph import TensorType
from meganeura.ir.ops.reduce import check_splits
from meganeura.ir.trace import Tracer
from meganeura.passes import compile_step
from meganeura.runtime import Executable, default_device
from meganeura.target import Target

STAGES = ((64, 32), (128, 16), (256, 8), (512, 4))  # ResNet-18 on CIFAR: (channels, image side)


def valid_splits(total: int, candidates) -> list[int]:
    """The split sizes among `candidates` that leave no part of `total` empty, in order, once each."""
    kept = []
    for splits in candidates:
        try:
            check_splits(total, splits, "benchmark")
        except Exception:
            continue
        if splits not in kept:
            kept.append(splits)
    return kept


class Bench:
    """One step holding every variant of every workload, `repeat` copies each."""

    def __init__(self, repeat: int, max_binding: int) -> None:
        self.tracer = Tracer()
        self.repeat = repeat
        self.max_binding = max_binding  # bytes one storage binding may hold on the device
        self.inputs: dict[str, np.ndarray] = {}
        self.variant_of: dict[int, tuple[str, str, int]] = {}  # node id -> (workload, variant, copy)
        self.rows: list[tuple[str, str, int, int]] = []  # workload, variant, bytes, flops
        self.rng = np.random.default_rng(0)

    def leaf(self, name: str, shape: tuple[int, ...]) -> int:
        self.inputs[name] = self.rng.normal(size=shape).astype(np.float32)
        return self.tracer.leaf("input", name, TensorType(shape))

    def emit(self, key: tuple[str, str, int], op: str, inputs: list[int], **attrs) -> int:
        node = self.tracer.emit(op, inputs, **attrs)
        self.variant_of[node] = key
        return node

    def output(self, node: int) -> None:
        self.tracer.graph.outputs[f"out{len(self.tracer.graph.outputs)}"] = node

    def reduction(self, workload: str, x: int, shape, axes, chosen: int, candidates, prologue: str = "$0") -> None:
        """The one-level reduction and its two-level forms in `candidates` parts."""
        r = math.prod(shape[d] for d in axes)
        outs = math.prod(shape) // r
        attrs = dict(kind="sum", axes=axes, keepdim=False, in_shape=shape, prologue=prologue, epilogue="$r")
        for splits in [1, *valid_splits(r, candidates)]:
            name = "one level" if splits == 1 else f"S={splits}"
            mark = "*" if splits == chosen or (splits == 1 and chosen == 1) else ""
            variant = f"{name}{mark}"
            for copy in range(self.repeat):
                key = (workload, variant, copy)
                partial = self.emit(key, "fused_reduce", [x], **attrs, splits=splits)
                if splits > 1:
                    partial = self.emit(key, "sum", [partial], axes=(0,), keepdim=False)
                self.output(partial)
            moved = 4 * (math.prod(shape) + outs + (2 * splits * outs if splits > 1 else 0))
            self.rows.append((workload, variant, moved, 0))

    def weight_gradient(self, workload: str, g: int, x: int, batch: int, channels: int, side: int, target) -> None:
        """The weight gradient of a 3×3 convolution (stride 1, padding 1) in every form."""
        positions = side * side
        columns = channels * 9
        chosen = weight_splits(channels, columns, batch * positions, target)
        attrs = dict(mode="grad_weight", kernel=(3, 3), stride=(1, 1), padding=(1, 1), image=(side, side))
        candidates = [1, batch, *sorted({4, 8, 16, 32, 64, chosen} - {1})]
        flops = 2 * channels * columns * batch * positions
        for splits in valid_splits(batch * positions, candidates):
            if 4 * splits * channels * columns > self.max_binding:
                print(f"{workload}: S={splits} skipped, its partials exceed a storage binding of the device")
                continue
            if splits == 1:
                name = "whole batch"
            elif splits == batch:
                name = f"per image (S={batch})"
            else:
                name = f"split-K S={splits}"
            variant = name + ("*" if splits == chosen else "")
            for copy in range(self.repeat):
                key = (workload, variant, copy)
                out = self.emit(key, "conv_gemm", [g, x], **attrs, chunks=splits)
                if splits > 1:
                    out = self.emit(key, "sum", [out], axes=(0,), keepdim=False)
                self.output(out)
            reads = 4 * batch * channels * positions * 2
            partials = 8 * splits * channels * columns if splits > 1 else 0
            self.rows.append((workload, variant, reads + 4 * channels * columns + partials, flops))


def build(args, target: Target, max_binding: int) -> Bench:
    bench = Bench(args.repeat, max_binding)
    only = set(args.only.split(","))
    n = args.batch
    if "bn" in only:
        for channels, side in STAGES:
            shape = (n, channels, side, side)
            x = bench.leaf(f"bn{channels}", shape)
            chosen = reduce_splits(shape, (0, 2, 3), target)
            candidates = sorted({2, 4, 8, 16, 32, 64, chosen} - {1})
            bench.reduction(f"bn stats {shape}", x, shape, (0, 2, 3), chosen, candidates, prologue="mul($0,$0)")
    if "sum" in only:
        shape = (args.elements,)
        x = bench.leaf("flat", shape)
        chosen = reduce_splits(shape, (0,), target)
        candidates = sorted({132, 264, 528, 1056, 2112, chosen} - {1})
        bench.reduction(f"sum of {args.elements}", x, shape, (0,), chosen, candidates)
    if "col" in only:
        for shape in ((2048, 3072), (2048, 1536), (2048, 768), (2048, 576), (256, 1024)):
            x = bench.leaf(f"rows{shape}", shape)
            chosen = reduce_splits(shape, (0,), target)
            candidates = sorted({4, 8, 16, 32, 64, chosen} - {1})
            bench.reduction(f"column sum [{shape[0]},{shape[1]}]", x, shape, (0,), chosen, candidates)
    if "partials" in only:
        for splits in (2, 4):
            shape = (splits, 2048, 576)
            x = bench.leaf(f"partials{splits}", shape)
            bench.reduction(f"partials [{splits},2048,576]", x, shape, (0,), 1, [])
    if "wgrad" in only:
        for channels, side in STAGES[:3]:
            g = bench.leaf(f"g{channels}", (n, channels, side * side))
            x = bench.leaf(f"x{channels}", (n, channels, side, side))
            workload = f"3x3 wgrad {channels}ch {side}x{side}"
            bench.weight_gradient(workload, g, x, n, channels, side, target)
    return bench


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--elements", type=int, default=28 * 2**20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default="bn,sum,col,partials,wgrad")
    parser.add_argument(
        "--entries",
        default="",
        help="also time with each of these reduce.wgsl entry points forced (ENTRY, ENTRY:WORKGROUP_SIZE, or "
        "reduce_serial:WORKGROUP_SIZExITEMS: that many items a thread, instead of codegen.reduce.serial_items)",
    )
    args = parser.parse_args()
    device = default_device()
    target = device.target
    print(f"adapter: {device.describe()}; target {target.name}: {target.compute_units} units")
    original, serial_items = codegen_reduce.reduce_plan, codegen_reduce.serial_items
    for forced in ["", *filter(None, args.entries.split(","))]:
        if forced:
            entry, _, shape = forced.partition(":")
            wg, _, items = shape.partition("x")
            size = int(wg) if wg else 64 if entry == "reduce_serial" else 256
            each = f", {items} items a thread" if entry == "reduce_serial" and items else ""
            print(f"\n-- every reduction with {entry} forced, {size} threads a workgroup{each}")
            codegen_reduce.reduce_plan = lambda outs, r, innermost, target=None, entry=entry, size=size: (entry, size)
            if items:
                codegen_reduce.serial_items = lambda part, leading, items=int(items): items
        try:
            run(args, device, target)
        finally:
            codegen_reduce.reduce_plan, codegen_reduce.serial_items = original, serial_items


def run(args, device, target: Target) -> None:
    """Build, compile and time every variant once; print a row per variant."""
    bench = build(args, target, device.limits.get("max-storage-buffer-binding-size", 2**27))
    compiled = compile_step(bench.tracer.graph, target)
    executable = Executable(compiled, device, {}, {})
    for _ in range(2):  # warm-up: GPU clocks idle low
        executable.run(bench.inputs)
    _, profile = executable.profile(bench.inputs)
    grids = {spec.node: math.prod(spec.grid) for spec in compiled.kernels}
    copy_ns: dict[tuple[str, str, int], int] = defaultdict(int)
    dispatches: dict[tuple[str, str, int], list[int]] = defaultdict(list)
    for kernel in profile.kernels:
        key = bench.variant_of[kernel.node]
        copy_ns[key] += kernel.ns
        dispatches[key].append(grids[kernel.node])
    print(f"{'workload':<36} {'variant':<24} {'kernels':>7} {'workgroups':>14} {'µs':>10} {'GB/s':>8} {'TFLOP/s':>8}")
    for workload, variant, moved, flops in bench.rows:
        copies = sorted(copy_ns[(workload, variant, copy)] for copy in range(bench.repeat))
        median = max(copies[len(copies) // 2], 1)
        grid = "+".join(str(count) for count in dispatches[(workload, variant, 0)])
        rate = f"{flops / median / 1e3:8.2f}" if flops else f"{'':>8}"
        count = len(dispatches[(workload, variant, 0)])
        print(f"{workload:<36} {variant:<24} {count:>7} {grid:>14} {median / 1e3:>10.1f} {moved / median:>8.1f} {rate}")


if __name__ == "__main__":
    main()
