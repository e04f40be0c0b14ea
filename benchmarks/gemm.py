"""GEMM alone, side by side with PyTorch fp32 (TF32 off) on the same GPU, same shapes.

    python benchmarks/gemm.py [--shapes 4096x4096x4096,8192x768x3072] [--repeat 10]

Ours: the matmul kernel the code generator picks for the shape (meganeura/codegen/matmul.py),
`repeat` dispatches timed with GPU timestamps (Executable.profile: the median dispatch);
PyTorch: `repeat` matmuls between two CUDA events. Shapes are M×K×N, C = A·B, all row-major;
FLOPs are 2·M·N·K. Defaults: 4096³, the FFN shape 8192×768×3072 and the SmolLM2-shaped LM's
projections (2048×576×1536, 2048×1536×576) and tied head (2048×576×49152).
"""

from __future__ import annotations

import argparse

import numpy as np

from meganeura.codegen.compiled import compile_step
from meganeura.ir.graph import TensorType
from meganeura.ir.trace import Tracer
from meganeura.runtime import Executable, default_device

SHAPES = "4096x4096x4096,8192x768x3072,2048x576x1536,2048x1536x576,2048x576x49152"


def ours_seconds(m: int, k: int, n: int, repeat: int) -> float:
    """The median time of one matmul dispatch, from `repeat` profiled in one step."""
    tracer = Tracer()  # builds the graph node by node, each typed by its op's declaration
    graph = tracer.graph
    a = tracer.leaf("input", "a", TensorType((m, k)))
    b = tracer.leaf("input", "b", TensorType((k, n)))
    for index in range(repeat):
        graph.outputs[f"c{index}"] = tracer.emit("matmul", [a, b])  # no e-graph here: `repeat` kernels
    device = default_device()
    executable = Executable(compile_step(graph, device.target), device, {}, {})
    rng = np.random.default_rng(0)
    inputs = {"a": rng.normal(size=(m, k)).astype(np.float32), "b": rng.normal(size=(k, n)).astype(np.float32)}
    for _ in range(2):  # warm-up: GPU clocks idle low
        executable.run(inputs)
    _, profile = executable.profile(inputs)
    times = sorted(kernel.ns for kernel in profile.kernels if kernel.kind == "matmul")
    return times[len(times) // 2] / 1e9


def torch_seconds(m: int, k: int, n: int, repeat: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print(f"adapter: {default_device().describe()}")
    for text in args.shapes.split(","):
        m, k, n = (int(v) for v in text.split("x"))
        flops = 2 * m * n * k
        ours = ours_seconds(m, k, n, args.repeat)
        line = f"{m}x{k}x{n}: meganeura {flops / ours / 1e12:7.3f} TFLOP/s"
        theirs = torch_seconds(m, k, n, args.repeat)
        if theirs is not None:
            line += f", pytorch fp32 {flops / theirs / 1e12:7.3f} TFLOP/s, ratio {theirs / ours:.2f} of PyTorch's speed"
        print(line)


if __name__ == "__main__":
    main()
