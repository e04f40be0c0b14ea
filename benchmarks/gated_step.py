"""What the gated step costs (meganeura/gate.py): compile(check_finite=True) and
compile(accumulate=k) against the plain training step, every variant in one process.

    python benchmarks/gated_step.py [--workload smollm2] [--depth 30] [--vocab 49152] [--repeat 20] [--k 4]
    python benchmarks/gated_step.py --workload residual-mlp --depth 8      # seconds on lavapipe

Variants: plain; check_finite; accumulate=k; accumulate=k with check_finite. For each: the
dispatches (in all and the optimizer's), the bytes of device buffers the plan allocates, the sum
of the kernels' GPU times in a profiled step (each dispatch timed in a compute pass of its own,
GPU timestamps: the median of three profiled steps), and the wall time of a train_step, which waits
for its loss (median of `repeat`). Warm-up steps come first (the GPU clocks idle low). A gated
update cannot be written in place and is not grouped into multi-tensor kernels (gate.py says why),
so the optimizer's dispatches grow with the gate: this table is the price of that choice.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

import meganeura as mn
from meganeura.bench import workloads
from meganeura.ir.op import op_def
from meganeura.runtime import default_device

VARIANTS = {
    "plain": {},
    "check_finite": {"check_finite": True},
    "accumulate": {"accumulate": None},
    "accumulate+check_finite": {"accumulate": None, "check_finite": True},
}


def workload(name: str, depth: int, vocab: int) -> workloads.Workload:
    if name == "smollm2":
        return workloads.smollm2(depth, vocab=vocab)
    if name == "residual-mlp":
        return workloads.residual_mlp(depth)
    raise SystemExit(f"unknown workload {name!r}: smollm2 or residual-mlp")


def measure(args, options: dict) -> dict:
    mn.manual_seed(0)
    work = workload(args.workload, args.depth, args.vocab)
    options = {key: (args.k if value is None else value) for key, value in options.items()}
    program = mn.compile(work.model, work.loss, work.inputs, work.optimizer, **options)
    feed = work.batch(np.random.default_rng(0))
    for _ in range(3):
        program.train_step(**feed)
    walls = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        program.train_step(**feed)
        walls.append(time.perf_counter() - started)
    profiles = sorted((program.profile(warmup=0, **feed) for _ in range(3)), key=lambda p: p.total_ns)
    graph = program.compiled.graph
    kernels = program.compiled.kernels
    row = {
        "dispatches": len(kernels),
        "optimizer": sum(op_def(graph[k.node].op).family == "optimizer" for k in kernels),
        "buffers_mb": sum(slot.nbytes for slot in program.compiled.plan.buffers) / 2**20,
        "gpu_ms": profiles[1].total_ns / 1e6,
        "wall_ms": statistics.median(walls) * 1e3,
    }
    del program, work
    gc.collect()
    return row


def table(rows: dict[str, dict]) -> str:
    lines = [f"{'variant':<26}{'dispatches':>11}{'optimizer':>10}{'buffers MiB':>12}{'GPU ms':>9}{'wall ms':>9}"]
    for name, r in rows.items():
        lines.append(
            f"{name:<26}{r['dispatches']:>11}{r['optimizer']:>10}{r['buffers_mb']:>12.1f}"
            f"{r['gpu_ms']:>9.2f}{r['wall_ms']:>9.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="smollm2")
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--k", type=int, default=4, help="micro-batches per update for the accumulate variants")
    args = parser.parse_args()
    print(f"adapter: {default_device().describe()}; {args.workload} depth {args.depth}, accumulate={args.k}")
    rows = {}
    for name, options in VARIANTS.items():
        rows[name] = measure(args, options)
        print(table({name: rows[name]}).splitlines()[1], flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
