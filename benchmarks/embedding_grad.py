"""The embedding gradient (gather's VJP: sort_ids + scatter_add) alone, side by side with
PyTorch's embedding backward on the same GPU, same shapes.

    python benchmarks/embedding_grad.py [--vocab 49152] [--dim 576] [--ids 2048] [--runs 300]

Ours is timed as the difference of two programs run back to back, each a submission with its
result read back: ids → gather(table) → sum, with and without the table's gradient
scatter_add(gather, ids, sort_ids(ids)) as a further output (computed, not read back). PyTorch's is
`aten.embedding_dense_backward` timed with CUDA events (no submission cost), so the ratio is
in PyTorch's favour if anything. Defaults: the SmolLM2-135M-shaped LM's (vocab 49152, dim 576,
batch 8 × seq 256 ids).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from meganeura import nn
from meganeura.ir.graph import TensorType
from meganeura.ir.trace import Tracer
from meganeura.passes import compile_step
from meganeura.runtime import Executable, default_device


def program(vocab: int, dim: int, n: int, with_gradient: bool, sort_only: bool = False) -> Executable:
    tracer = Tracer()  # builds the graph node by node, each typed by its op's declaration
    graph = tracer.graph
    table = tracer.leaf("param", "table", TensorType((vocab, dim)))
    ids = tracer.leaf("input", "ids", TensorType((n,), "i32"))
    rows = tracer.emit("gather", [table, ids])
    if with_gradient and sort_only:
        graph.outputs["order"] = tracer.emit("sort_ids", [ids])
    elif with_gradient:  # an output that is not read back: computed, but no reduction of it is timed
        graph.outputs["grad"] = tracer.emit("scatter_add", [rows, ids, tracer.emit("sort_ids", [ids])], num=vocab)
    graph.outputs["total"] = tracer.emit("sum", [rows], axes=(0, 1))
    device = default_device()
    weights = {"table": nn.Parameter(np.random.default_rng(0).normal(size=(vocab, dim)).astype(np.float32))}
    return Executable(compile_step(graph, device.target), device, weights, {})


def seconds_per_run(executable: Executable, ids: np.ndarray, runs: int) -> float:
    for _ in range(10):
        executable.run({"ids": ids}, read=("total",))
    start = time.perf_counter()
    for _ in range(runs):
        executable.run({"ids": ids}, read=("total",))
    return (time.perf_counter() - start) / runs


def torch_seconds(vocab: int, dim: int, ids: np.ndarray, runs: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    g = torch.randn(len(ids), dim, device="cuda")
    index = torch.tensor(ids, device="cuda", dtype=torch.long)
    backward = torch.ops.aten.embedding_dense_backward
    for _ in range(10):
        backward(g, index, vocab, -1, False)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        backward(g, index, vocab, -1, False)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--dim", type=int, default=576)
    parser.add_argument("--ids", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--sort-only", action="store_true", help="time sort_ids alone")
    args = parser.parse_args()
    ids = np.random.default_rng(1).integers(0, args.vocab, size=args.ids).astype(np.int32)
    print(f"adapter: {default_device().describe()}")
    print(f"embedding gradient: vocab {args.vocab}, dim {args.dim}, {args.ids} ids")
    with_gradient = program(args.vocab, args.dim, args.ids, True, args.sort_only)
    without = program(args.vocab, args.dim, args.ids, False)
    timings = []
    for _ in range(3):  # interleaved, so that clock changes hit both
        timings.append(seconds_per_run(with_gradient, ids, args.runs) - seconds_per_run(without, ids, args.runs))
    ours = min(timings)
    what = "sort_ids" if args.sort_only else "sort_ids + scatter_add"
    print(f"meganeura ({what}): {1000 * ours:.3f} ms (three estimates: "
          f"{', '.join(f'{1000 * t:.3f}' for t in timings)})")  # fmt: skip
    theirs = torch_seconds(args.vocab, args.dim, ids, args.runs)
    if theirs is not None:
        print(f"pytorch embedding_dense_backward (cuda, fp32): {1000 * theirs:.3f} ms")
        print(f"ratio meganeura/pytorch: {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
