"""The host's share of a small training step: where `train_step`'s wall time goes besides the GPU,
and the inputs' upload through their staging buffer against `queue.write_buffer`, in one process.

    PYTHONPATH=. python benchmarks/host_time.py [--workload digits-mlp] [--steps 200] [--rounds 2]

Prints, for the bench workload's step (its full size), the median wall time of `train_step` with
the inputs staged (runtime/uploads.py) and with them written by `queue.write_buffer`, alternated
`--rounds` times; then the median time of each part of one step (`Executable.run` taken apart:
checking the inputs, the optimizer's hyper-parameters, the upload, the submit, recording the next
step's commands while the GPU runs, waiting for the loss) and the step's GPU time as one pass.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from readback_latency import median_us  # noqa: E402

import meganeura as mn  # noqa: E402
from meganeura.bench.workloads import STEPS  # noqa: E402


def step_parts(program, batch: dict, steps: int) -> dict[str, float]:
    """Median µs of each part of `Executable.run` (its code, spelled out with a clock between parts)."""
    executable = program.executable
    parts: dict[str, list[float]] = {}
    for _ in range(steps):
        clock = [time.perf_counter()]
        values = program.check_inputs(batch)
        clock.append(time.perf_counter())
        program.write_hypers(executable)
        clock.append(time.perf_counter())
        read, copies, start, size = executable.upload(values, program.step_reads)
        clock.append(time.perf_counter())
        executable.submit(executable.commands_for(read, copies))
        clock.append(time.perf_counter())
        executable.record_next(read, copies)
        clock.append(time.perf_counter())
        executable.read_outputs(read, start, size)
        clock.append(time.perf_counter())
        names = ("check inputs", "hypers", "upload", "submit", "record next", "wait for the loss")
        for name, begin, end in zip(names, clock, clock[1:], strict=False):
            parts.setdefault(name, []).append(end - begin)
    return {name: 1e6 * statistics.median(times) for name, times in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="digits-mlp", help=f"any of {', '.join(STEPS)}")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    workload = STEPS[args.workload].build(small=False)
    program = mn.compile(workload.model, loss=workload.loss, inputs=workload.inputs, optimizer=workload.optimizer)
    batch = workload.batch(np.random.default_rng(0))
    executable = program.executable
    staging = executable.staging
    print(f"{args.workload}: {len(executable.dispatches)} dispatches, {executable.device.describe()}")
    for _ in range(30):
        program.train_step(**batch)
    for round_ in range(args.rounds):
        for name, value in (("staged", staging), ("write_buffer", None)):
            if name == "staged" and staging is None:
                continue
            executable.staging, executable.recorded = value, None  # a recorded step copies as it was recorded
            us = median_us(lambda: program.train_step(**batch), args.steps, warmup=10)
            print(f"round {round_}: train_step {us:8.1f} µs ({name})")
    executable.staging, executable.recorded = staging, None
    for name, us in step_parts(program, batch, args.steps).items():
        print(f"  {name:20s} {us:8.1f} µs")
    if executable.device.has_timestamps:
        values = program.check_inputs(batch)
        gpu = [executable.timed_run(values, program.step_reads)[1] for _ in range(20)]
        print(f"  {'GPU, one pass':20s} {statistics.median(gpu) / 1e3:8.1f} µs")


if __name__ == "__main__":
    main()
