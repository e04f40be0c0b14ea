"""The optimizer part of the SmolLM2-shaped training step, per-parameter against multi-tensor
kernels: dispatches, GPU time (timestamps) and wall time, every variant in one process.

    python benchmarks/optimizer.py [--depth 30] [--vocab 49152] [--repeat 20] [--no-step]

1. The AdamW update alone, on the parameters of `benchmarks/workloads.smollm2(depth)` (272 at
   depth 30), with fixed gradients held in buffers, in four forms:
   - single-tensor: `optim.AdamW(fused=False)`, two moment kernels and a step kernel per
     parameter (what the project ran before multi-tensor updates);
   - fused: one `adam_update` kernel per parameter (`compile_step(multi_tensor=False)`);
   - multi-tensor: the fused updates grouped into kernels of as many parameters as the device
     binds buffers for (`Target.max_storage_buffers`, and at most 1000 in one bind group),
     planned as for a GPU even on lavapipe (where `mn.compile` keeps a kernel per parameter);
   - multi-tensor 31: the same with the generic target's 31 buffers per kernel.
   Each form: its dispatches, the sum of its kernels' GPU times (each dispatch timed in a pass of
   its own, `Executable.profile`: the median of three profiled runs) and the wall time of one
   update in a normal run (one pass, one submit, waited for: the median of `repeat`).
2. Unless `--no-step`: the whole training step, `fused=False` against the default, compiled by
   `mn.compile` for this device: dispatches in all and the optimizer's, the optimizer kernels' GPU
   time in a profiled step, and the step's wall time (median of `repeat` train_step calls,
   which wait for the loss); then the default again with a learning-rate schedule that changes
   the lr every step (`lr_scheduler.LambdaLR` stepped after each train_step, so each step first
   writes the groups' hyper-parameter vectors with the new lr): what a run-time hyper-parameter
   costs a step.
Warm-up runs come first everywhere (the GPU clocks idle low).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import numpy as np

import meganeura as mn
from meganeura import nn, optim
from meganeura.bench import workloads
from meganeura.ir.autodiff import GradBuilder
from meganeura.ir.graph import TensorType
from meganeura.ir.op import op_def
from meganeura.ir.trace import Tracer
from meganeura.optim import ParamGrad, lr_scheduler
from meganeura.passes import compile_step
from meganeura.runtime import Executable, default_device
from meganeura.target import GENERIC, Target

GENERIC_BUFFERS = GENERIC.max_storage_buffers


def update_step(shapes: dict[str, tuple[int, ...]], fused: bool):
    """A graph that is only the AdamW update of parameters of `shapes`, each gradient a state
    leaf that nothing updates (it keeps its values from step to step)."""
    tracer = Tracer()
    params = []
    for name, shape in shapes.items():
        node = tracer.leaf("param", name, TensorType(shape))
        grad = tracer.leaf("state", f"{name}.grad", TensorType(shape))
        params.append(ParamGrad(name, node, grad))
    initial = optim.AdamW(lr=1e-3, fused=fused).build_updates(GradBuilder(tracer.graph), params)
    rng = np.random.default_rng(0)
    for name, shape in shapes.items():
        initial[f"{name}.grad"] = rng.normal(scale=1e-2, size=shape).astype(np.float32)
    return tracer.graph.pruned(), initial


def optimizer_kernels(step) -> list:
    return [k for k in step.kernels if op_def(step.graph[k.node].op).family == "optimizer"]


def time_update(shapes, fused: bool, multi_tensor: bool, target: Target, repeat: int) -> dict:
    """Dispatches, summed kernel GPU time and wall time of one form of the update alone."""
    graph, initial = update_step(shapes, fused)
    step = compile_step(graph, target, multi_tensor=multi_tensor)
    rng = np.random.default_rng(1)
    parameters = {name: nn.Parameter(rng.normal(size=shape).astype(np.float32)) for name, shape in shapes.items()}
    device = default_device()
    executable = Executable(step, device, parameters, initial)
    probe = executable.states[next(iter(shapes))]

    def run_once() -> float:
        started = time.perf_counter()
        executable.run({})
        device.queue.read_buffer(probe, 0, 4)  # wait for the step
        return time.perf_counter() - started

    for _ in range(3):
        run_once()
    profiles = sorted((executable.profile({})[1] for _ in range(3)), key=lambda p: sum(k.ns for k in p.kernels))
    walls = [run_once() for _ in range(repeat)]
    row = {
        "dispatches": len(step.kernels),
        "max bindings": max(len(k.bindings) for k in step.kernels),
        "gpu_ms": sum(k.ns for k in profiles[1].kernels) / 1e6,
        "wall_ms": statistics.median(walls) * 1e3,
    }
    return row


def time_training_step(depth: int, vocab: int, fused: bool, repeat: int, scheduled: bool = False) -> dict:
    """Dispatches and times of the whole SmolLM2-shaped step with `fused` AdamW (`scheduled`: a
    new lr every step, the scheduler's step inside the timed span)."""
    mn.manual_seed(0)
    work = workloads.smollm2(depth, vocab=vocab)
    work.optimizer.fused = fused
    program = mn.compile(work.model, work.loss, work.inputs, work.optimizer)
    schedule = lr_scheduler.LambdaLR(work.optimizer, lambda step: 0.999**step) if scheduled else None
    feed = work.batch(np.random.default_rng(0))
    for _ in range(3):
        program.train_step(**feed)
    walls = []
    for _ in range(repeat):
        started = time.perf_counter()
        program.train_step(**feed)
        if schedule is not None:
            schedule.step()
        walls.append(time.perf_counter() - started)
    profile = program.profile(warmup=1, **feed)
    graph = program.compiled.graph
    optimizer_ns = sum(k.ns for k in profile.kernels if op_def(graph[k.node].op).family == "optimizer")
    counts = program.report().step_dispatches
    row = {
        "dispatches": counts.total,
        "optimizer dispatches": counts.optimizer,
        "optimizer_gpu_ms": optimizer_ns / 1e6,
        "step_gpu_ms": sum(k.ns for k in profile.kernels) / 1e6,
        "wall_ms": statistics.median(walls) * 1e3,
    }
    del program, work
    gc.collect()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--no-step", action="store_true", help="time the update alone, not the training step")
    args = parser.parse_args()
    device = default_device()
    target = device.target
    model = workloads.smollm2(args.depth, vocab=args.vocab).model
    shapes = {name: p.type.shape for name, p in model.named_parameters()}
    numel = sum(int(np.prod(s)) for s in shapes.values())
    print(f"adapter: {device.describe()}; {target.max_storage_buffers} storage buffers per kernel")
    print(f"AdamW update alone: {len(shapes)} parameters, {numel:,} elements (depth {args.depth})")
    print(f"  {'form':<34} {'dispatches':>10} {'bindings':>8} {'GPU ms':>8} {'wall ms':>8}")
    forms = (
        ("single-tensor (fused=False)", False, False, target),
        ("fused, a kernel per parameter", True, False, target),
        ("multi-tensor", True, True, Target(target.name, target.compute_units, target.max_storage_buffers)),
        ("multi-tensor, 31 buffers", True, True, Target(target.name, target.compute_units, GENERIC_BUFFERS)),
    )
    for label, fused, multi, form_target in forms:
        row = time_update(shapes, fused, multi, form_target, args.repeat)
        gc.collect()  # the form's buffers go before the next form's are made
        print(
            f"  {label:<34} {row['dispatches']:>10} {row['max bindings']:>8} "
            f"{row['gpu_ms']:>8.3f} {row['wall_ms']:>8.3f}"
        )
    if args.no_step:
        return
    print(f"SmolLM2-shaped training step (depth {args.depth}, vocab {args.vocab}), AdamW:")
    header = f"{'dispatches':>10} {'optimizer':>9} {'opt GPU ms':>10} {'step GPU ms':>11} {'wall ms':>8}"
    print(f"  {'optimizer':<24} {header}")
    for label, fused, scheduled in (
        ("fused=False", False, False),
        ("fused=True (default)", True, False),
        ("fused=True, lr each step", True, True),
    ):
        row = time_training_step(args.depth, args.vocab, fused, args.repeat, scheduled)
        print(
            f"  {label:<24} {row['dispatches']:>10} {row['optimizer dispatches']:>9} "
            f"{row['optimizer_gpu_ms']:>10.3f} {row['step_gpu_ms']:>11.3f} {row['wall_ms']:>8.3f}"
        )


if __name__ == "__main__":
    main()
