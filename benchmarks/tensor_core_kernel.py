"""The compiler's tensor-core product (codegen/matmul_tensor.py) timed alone beside the probe's
split GEMM of pre-split operands (benchmarks/tensor_core_split.py), in one process on Dawn:

    PYTHONPATH=. python benchmarks/tensor_core_kernel.py [--shapes 2048x576x1536,576x2048x1536:At]
    PYTHONPATH=. python benchmarks/tensor_core_kernel.py --validate   (Dawn's Null backend: Tint compiles each)

Per shape (M×K×N, ":At" A stored [K, M], ":Bt" B stored [N, K]) the kernel `lower_matmul` makes
for an H200 target with tensor cores, and two variants of its WGSL that say where its time goes:
"fixed scale" (the running scales never set: the operands split unscaled, so its results are
wrong where they leave f16's range; the scales' cost) and "no products" (the subgroup-matrix
products removed: the loads, the split and the staging alone). Then the probe's kernel at 64x64
and 128x128 tiles with B kept [K, N], its operands split beforehand (their conversion not timed).
Timing as the probe's: the best of 3 batches of back-to-back dispatches, wall clock per dispatch.
Needs wgpudawn and a GPU with subgroup matrices; the figures of 2026-12-04 are in
docs/performance-log.md.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import tensor_core_split as probe  # noqa: E402

from meganeura.codegen import matmul_halves, matmul_tensor  # noqa: E402
from meganeura.codegen.compiled import compile_step  # noqa: E402
from meganeura.ir.graph import TensorType  # noqa: E402
from meganeura.ir.trace import Tracer  # noqa: E402
from meganeura.target import Target  # noqa: E402

H200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152, tensor_cores=True)
SHAPES = "2048x576x1536,2048x1536x576,576x2048x1536:At,2048x576x1536:Bt,2048x768x3072,4096x4096x4096"


def product_kernel(m: int, k: int, n: int, transpose_a: bool, transpose_b: bool):
    """The KernelSpec of a bare product planned for H200 (tensor cores) on the kernel that splits its
    operands itself (which the opt-in leaves off: both hooks set so), and its operands' shapes."""
    matmul_tensor.tensor_takes = lambda *args: True
    matmul_halves.halves_take = lambda *args: False
    shapes = [(k, m) if transpose_a else (m, k), (n, k) if transpose_b else (k, n)]
    tracer = Tracer()
    leaves = [tracer.leaf("input", f"x{i}", TensorType(shape)) for i, shape in enumerate(shapes)]
    tracer.graph.outputs["out"] = tracer.emit("matmul", leaves, transpose_a=transpose_a, transpose_b=transpose_b)
    kernels = compile_step(tracer.graph, H200).kernels
    (spec,) = [kernel for kernel in kernels if kernel.entry_point == "matmul_tensor"]
    return spec, shapes


def variant(wgsl: str, name: str) -> str:
    """The kernel's WGSL with its entry point named `main` (the probe's), edited as `name` says."""
    lines = wgsl.replace("fn matmul_tensor(", "fn main(").split("\n")
    if name == "fixed scale":
        lines = [
            line.replace("if (top.x > 0.0)", "if (false)").replace("if (top.y > 0.0)", "if (false)") for line in lines
        ]
    if name == "no products":
        lines = [line for line in lines if "subgroupMatrixMultiplyAccumulate" not in line]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--validate", action="store_true", help="only compile every kernel (Dawn's Null backend)")
    args = parser.parse_args()
    gpu = probe.Gpu(args.validate)
    print(gpu.summary)
    rng = np.random.default_rng(0)
    for text in args.shapes.split(","):
        dims, _, flags = text.partition(":")
        m, k, n = map(int, dims.split("x"))
        spec, shapes = product_kernel(m, k, n, "At" in flags, "Bt" in flags)
        if args.validate:  # Tint compiles each; the Null adapter's limits would refuse the pipelines
            kp = -(-k // 64) * 64
            wgsls = [variant(spec.wgsl, name) for name in ("ours", "fixed scale", "no products")]
            wgsls += [probe.split_gemm(m, n, kp, sm=sm, sn=sm, b_kept=True)[0] for sm in (2, 4)]
            for wgsl in wgsls:
                gpu.device.create_shader_module(code=wgsl)
            print("compiled", text, flush=True)
            continue
        a = gpu.buffer(4 * m * k, rng.standard_normal(shapes[0]).astype(np.float32))
        b = gpu.buffer(4 * k * n, rng.standard_normal(shapes[1]).astype(np.float32))
        c = gpu.buffer(4 * m * n)
        flops = 2 * m * n * k
        for name in ("ours", "fixed scale", "no products"):
            seconds = gpu.seconds([gpu.job(variant(spec.wgsl, name), [a, b, c], spec.grid)])
            print(f"{text:22s} {name:26s} {1e3 * seconds:7.3f} ms {flops / seconds / 1e12:6.1f} TFLOP/s", flush=True)
        kp = -(-k // 64) * 64
        halves = [gpu.buffer(4 * max(m, n) * kp) for _ in range(4)]
        scales = [gpu.buffer(4 * max(m, n, 64)) for _ in range(2)]
        for sm in (2, 4):
            wgsl, grid = probe.split_gemm(m, n, kp, sm=sm, sn=sm, b_kept=True)
            seconds = gpu.seconds([gpu.job(wgsl, [*halves, *scales, c], grid)])
            label = f"probe {32 * sm}x{32 * sm} B kept"
            print(f"{text:22s} {label:26s} {1e3 * seconds:7.3f} ms {flops / seconds / 1e12:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
