"""Compile time and step time of an unrolled recurrent layer's training step (issue 40: a
256-step LSTM must compile in under 10 s).

    python benchmarks/lstm_unroll.py [--cell lstm|gru|rnn] [--steps 256] [--hidden 64] [--batch 4]
                                     [--input 32] [--runs 5]

The model is one nn.LSTM (or GRU, RNN) layer over a [steps, batch, input] sequence, its output
scored with F.mse_loss, trained with Adam: `mn.compile` of that step, timed from the call to
the ready Program (the device's buffers and pipelines included), wall clock and this process's
CPU time (on a shared machine the wall clock also counts other processes' turns), with the
stages `program.compilation.timings` splits it into; then the median of `--runs` train steps
after one warm-up step. Each configuration runs in a fresh process.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def measure(cell: str, steps: int, hidden: int, batch: int, features: int, runs: int) -> dict:
    import meganeura as mn
    import meganeura.functional as F
    from meganeura import nn, optim

    layer = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = layer(features, hidden)

        def forward(self, x):
            return self.rnn(x)[0]

    def loss(model, x, y):
        return F.mse_loss(model(x), y)

    inputs = {"x": mn.f32[steps, batch, features], "y": mn.f32[steps, batch, hidden]}
    wall, cpu = time.perf_counter(), time.process_time()
    program = mn.compile(Model(), loss, inputs, optim.Adam(lr=1e-3))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.normal(size=(steps, batch, features)).astype(np.float32),
        "y": rng.normal(size=(steps, batch, hidden)).astype(np.float32),
    }
    program.train_step(**feed)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        program.train_step(**feed)
        times.append(time.perf_counter() - started)
    timings = program.compilation.timings
    return {
        "compile_s": wall,
        "compile_cpu_s": cpu,
        "stages_s": sum(timings.values()),
        "timings": timings,
        "ir_nodes": len(program.graph),
        "kernels": len(program.compiled.kernels),
        "step_ms": 1000 * statistics.median(times),
        "device": program.executable.device.describe(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="lstm", choices=("lstm", "gru", "rnn"))
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--input", type=int, default=32)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    result = measure(args.cell, args.steps, args.hidden, args.batch, args.input, args.runs)
    print(
        f"{args.cell} {args.steps} steps, hidden {args.hidden}, batch {args.batch}, input {args.input} "
        f"on {result['device']}"
    )
    print(
        f"  compile {result['compile_s']:.2f} s wall, {result['compile_cpu_s']:.2f} s CPU "
        f"(stages {result['stages_s']:.2f} s, the device's buffers and pipelines the rest); "
        f"{result['ir_nodes']} IR nodes, {result['kernels']} kernels"
    )
    print("  " + ", ".join(f"{stage} {seconds:.3f}" for stage, seconds in result["timings"].items()))
    print(f"  train step {result['step_ms']:.1f} ms (median of {args.runs})")


if __name__ == "__main__":
    main()
