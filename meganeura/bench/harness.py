"""Running one workload on both sides in one process: our compiled step and its PyTorch mirror,
from the same initial weights on the same batch, timed alike.

Our side: `mn.compile` (timed: our compile time), two steps whose losses are kept (the mirror
check), the rest of the warm-up, then `steps` timed calls of `train_step` (each returns the loss,
read back, so a step is synchronised), and one profiled step (runtime/profile.py: GPU time by
kernel kind) when the adapter has timestamp queries.

PyTorch's side, per mode, a fresh mirror loaded with our initial values and a fresh optimizer:
`fp32` (eager, TF32 off for matmuls and cuDNN), `bf16` (eager under torch.autocast bfloat16),
`compile` (the loss function through torch.compile; its compile time falls in the warm-up).
Each step ends with `loss.item()`, which waits for the step's work on the stream.

The check that the mirror is the same model: the first step's loss (before any update) on both
sides in fp32; when they differ by more than LOSS_RTOL relative, the result carries no ratios
(a mirror bug, not a speed result). The second step's loss (after one optimizer update) is
compared too and reported.

A stochastic workload (dropout) draws its masks from Philox here and from torch's generator
there, so no training-step loss is comparable. Its check is the loss of an eval-mode (dropout
off) forward from the initial weights on both sides: ours from an inference program compiled
from the model in eval mode (it shares the weights with the training program), PyTorch's from
the fp32 mirror under model.eval() and no_grad. The eval-mode loss after one update is kept on
both sides and reported, not checked (the updates themselves saw different masks); the
training-step losses are reported, not compared.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import meganeura as mn
from meganeura import nn
from meganeura.bench.workloads import Workload
from meganeura.runtime import default_device

LOSS_RTOL = 1e-3
MODES = ("fp32", "bf16", "compile")
MODE_TITLES = {
    "fp32": "PyTorch eager fp32 (TF32 off)",
    "bf16": "PyTorch eager bf16 autocast",
    "compile": "torch.compile fp32 (TF32 off)",
}
TOP_KINDS = 10  # printed and kept: the LM steps have nine kinds above 1%
TOP_KERNELS = 40  # distinct kernels (by label) kept in the JSON
CHECK_STEPS = 2  # losses compared: before any update, and after one


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def preload_torch(threads: int | None = None) -> None:
    """Import torch and torch._dynamo (PyTorch's optimizers import it, and it loads Triton's LLVM)
    before the WebGPU device is opened, when torch is installed: on lavapipe, whose driver loads
    Mesa's LLVM into the process, loading Triton's after it crashed the process (a segmentation
    fault in triton/knobs.py, torch 2.14 with Mesa 22.3); in this order both work."""
    if torch_available():
        import torch
        import torch._dynamo  # noqa: F401

        if threads:  # on a CPU shared with lavapipe's threads, torch's own pool can stall
            torch.set_num_threads(threads)


# The least wall time of a workload's warm-up steps: a GPU's clocks idle low (the H200's at 345
# MHz) and ramp under load, and 5 warm-up steps of the MLP's 0.3 ms step are 2 ms of work. (In
# the bench run of 20:23 UTC on 2026-12-03 the MLP's kernels ran at a third of their speed, GPU
# time 0.87 ms as one pass against 0.26 at 20:02 with the same plan; whether the short warm-up
# was the cause is not established: see docs/performance-log.md, 2026-12-04.)
WARM_SECONDS = 0.5


def warm_up(step: Callable[[], object], steps: int, seconds: float = WARM_SECONDS) -> None:
    """`steps` calls of `step()`, and more until `seconds` of wall time have passed since the first."""
    started, done = time.perf_counter(), 0
    while done < steps or time.perf_counter() - started < seconds:
        step()
        done += 1


def step_seconds(step: Callable[[], object], steps: int) -> list[float]:
    """The wall time of each of `steps` calls of `step()`."""
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return times


def relative_difference(ours: float, theirs: float) -> float:
    return abs(ours - theirs) / max(abs(theirs), 1e-12)


@dataclass
class KindShare:
    """One row of our profile: a kernel kind's share of the step's GPU time."""

    kind: str
    count: int
    ms: float
    share: float
    tflops: float


@dataclass
class TorchRun:
    """One PyTorch mode: its median step, or why there is none."""

    mode: str
    ms: float | None = None
    losses: list[float] = field(default_factory=list)  # the first CHECK_STEPS
    note: str = ""  # an error, when it failed
    first_ms: float | None = None  # its first step (torch.compile compiles there)
    times_ms: list[float] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)  # stochastic workloads, fp32: before and after one update


@dataclass
class StepResult:
    """Everything measured for one training-step workload."""

    name: str
    title: str
    steps: int
    warmup: int
    compile_s: float
    dispatches: int
    ours_ms: float
    ours_losses: list[float]
    times_ms: list[float]
    gpu_ms: float | None = None  # the profiled step's kernel time (a pass per dispatch)
    gpu_pass_ms: float | None = None  # a step's GPU time as one pass, as steps run
    top_kinds: list[KindShare] = field(default_factory=list)
    top_kernels: list[KindShare] = field(default_factory=list)  # by label: `kind` holds the label
    label_ms: dict[str, float] = field(default_factory=dict)  # every distinct kernel's ms (not in the JSON)
    shares: dict[str, dict] = field(default_factory=dict)  # per `--share` pattern: report.py `label_share`
    profile_note: str = ""
    torch_note: str = ""  # "torch not installed", or where torch ran
    torch_on_gpu: bool = False
    torch: dict[str, TorchRun] = field(default_factory=dict)
    parameters: int = 0  # the model's trained values
    stochastic: bool = False  # dropout: the check is the eval-mode loss (see the module docstring)
    eval_losses: list[float] = field(default_factory=list)  # ours, eval mode: before and after one update

    @property
    def check(self) -> str:
        """What the mirror check compares."""
        return "eval-mode forward (dropout off)" if self.stochastic else "first training step"

    @property
    def loss_difference(self) -> float | None:
        """|our checked loss − PyTorch fp32's| / |PyTorch's|, when both ran: the first training
        step's, or for a stochastic workload the eval-mode forward's before any update."""
        run = self.torch.get("fp32")
        if run is None:
            return None
        ours, theirs = (self.eval_losses, run.eval_losses) if self.stochastic else (self.ours_losses, run.losses)
        return relative_difference(ours[0], theirs[0]) if ours and theirs else None

    @property
    def second_loss_difference(self) -> float | None:
        """The same after one optimizer update; None for a stochastic workload, whose updates saw
        different dropout masks on each side (`eval_update_difference` says how far apart)."""
        run = self.torch.get("fp32")
        if self.stochastic or run is None or len(run.losses) < 2:
            return None
        return relative_difference(self.ours_losses[1], run.losses[1])

    @property
    def eval_update_difference(self) -> float | None:
        """A stochastic workload's eval-mode losses after one update, ours against PyTorch fp32's
        (reported, not checked)."""
        run = self.torch.get("fp32")
        if not self.stochastic or run is None or len(run.eval_losses) < 2 or len(self.eval_losses) < 2:
            return None
        return relative_difference(self.eval_losses[1], run.eval_losses[1])

    @property
    def mirror_ok(self) -> bool | None:
        """True when the checked losses (`check`) agree, False when they do not, None when unchecked."""
        difference = self.loss_difference
        return None if difference is None else difference <= LOSS_RTOL

    def ratio(self, mode: str) -> float | None:
        """Our median step time over PyTorch's in `mode`; None where not measured or the mirror failed."""
        run = self.torch.get(mode)
        if run is None or run.ms is None or not self.mirror_ok:
            return None
        return self.ours_ms / run.ms

    def as_dict(self) -> dict:
        return {
            "workload": self.name,
            "title": self.title,
            "steps": self.steps,
            "warmup": self.warmup,
            "ours_ms": self.ours_ms,
            "ours_times_ms": self.times_ms,
            "compile_s": self.compile_s,
            "dispatches": self.dispatches,
            "parameters": self.parameters,
            "ours_losses": self.ours_losses,
            "gpu_ms": self.gpu_ms,
            "gpu_one_pass_ms": self.gpu_pass_ms,
            "top_kinds": [vars(row) for row in self.top_kinds],
            "top_kernels": [vars(row) for row in self.top_kernels],
            "shares": self.shares,
            "profile_note": self.profile_note,
            "torch": self.torch_note,
            "torch_on_gpu": self.torch_on_gpu,
            "check": self.check,
            "stochastic": self.stochastic,
            "eval_losses": self.eval_losses,
            "loss_difference": self.loss_difference,
            "second_loss_difference": self.second_loss_difference,
            "eval_update_difference": self.eval_update_difference,
            "mirror_ok": self.mirror_ok,
            "modes": {
                mode: {
                    "ms": run.ms,
                    "ratio": self.ratio(mode),
                    "losses": run.losses,
                    "first_ms": run.first_ms,
                    "times_ms": run.times_ms,
                    "eval_losses": run.eval_losses,
                    "note": run.note,
                }
                for mode, run in self.torch.items()
            },
        }


class LossOf(nn.Module):
    """`loss(model, **inputs)` as a model's forward: what an inference program of the loss compiles."""

    def __init__(self, model: nn.Module, loss: Callable) -> None:
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, **inputs):
        return self.loss(self.model, **inputs)


def eval_program(workload: Workload) -> mn.Program:
    """An inference program of the workload's loss with its model in eval mode (dropout off),
    sharing the model's weights; the model is back in training mode after."""
    workload.model.eval()
    try:
        return mn.compile(LossOf(workload.model, workload.loss), inputs=workload.inputs)
    finally:
        workload.model.train()


def run_ours(workload: Workload, batch: dict[str, np.ndarray], steps: int, warmup: int) -> StepResult:
    """Compile and time our step; the first CHECK_STEPS losses are kept for the mirror check
    (for a stochastic workload, the eval-mode losses before and after the first update)."""
    evaluate = eval_program(workload) if workload.stochastic else None
    started = time.perf_counter()
    program = mn.compile(workload.model, loss=workload.loss, inputs=workload.inputs, optimizer=workload.optimizer)
    compile_s = time.perf_counter() - started
    eval_losses = [] if evaluate is None else [np.asarray(evaluate(**batch)).item()]  # before any update
    losses = [program.train_step(**batch)]
    if evaluate is not None:
        eval_losses.append(np.asarray(evaluate(**batch)).item())  # after one
    losses += [program.train_step(**batch) for _ in range(CHECK_STEPS - 1)]
    warm_up(lambda: program.train_step(**batch), max(0, warmup - CHECK_STEPS))
    times = step_seconds(lambda: program.train_step(**batch), steps)
    result = StepResult(
        name=workload.name,
        title=workload.title,
        steps=steps,
        warmup=max(warmup, CHECK_STEPS),
        compile_s=compile_s,
        dispatches=len(program.compiled.kernels),
        ours_ms=1e3 * statistics.median(times),
        ours_losses=losses,
        times_ms=[1e3 * t for t in times],
        parameters=sum(math.prod(p.shape) for _, p in workload.model.named_parameters()),
        stochastic=workload.stochastic,
        eval_losses=eval_losses,
    )
    if default_device().has_timestamps:
        profile = program.profile(warmup=1, **batch)  # its warm-up step timed as one pass
        result.gpu_ms = profile.total_ns / 1e6
        result.gpu_pass_ms = profile.step_ns / 1e6 if profile.step_ns else None
        result.top_kinds = [
            KindShare(row.kind, row.count, row.ns / 1e6, row.share, row.tflop_per_s)
            for row in profile.by_kind()[:TOP_KINDS]
        ]
        labels = profile.by_label()
        result.top_kernels = [
            KindShare(row.kind, row.count, row.ns / 1e6, row.share, row.tflop_per_s) for row in labels[:TOP_KERNELS]
        ]
        result.label_ms = {row.kind: row.ns / 1e6 for row in labels}
    else:
        result.profile_note = f"{default_device().describe()} has no timestamp queries: no kernel profile"
    return result


def torch_setup():
    """torch, with TF32 off for fp32 matmuls and convolutions (our kernels compute in fp32), and
    the device it runs on."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch, torch.device("cuda" if torch.cuda.is_available() else "cpu")


def torch_note(torch, device) -> str:
    if device.type == "cuda":
        return f"torch {torch.__version__} on cuda ({torch.cuda.get_device_name(device)})"
    return f"torch {torch.__version__} on the CPU (no CUDA): ratios are NOT GPU-vs-GPU"


def timed_run(
    run: TorchRun, step: Callable[[], float], steps: int, warmup: int, evaluate: Callable[[], float] | None = None
) -> list[float]:
    """The first CHECK_STEPS losses into `run` (and the first step's time: torch.compile compiles
    there), with `evaluate()` before and after the first step when given (the eval-mode losses),
    the rest of the warm-up, then the time of each of `steps` steps."""
    if evaluate is not None:
        run.eval_losses = [evaluate()]
    started = time.perf_counter()
    run.losses = [step()]
    run.first_ms = 1e3 * (time.perf_counter() - started)
    if evaluate is not None:
        run.eval_losses.append(evaluate())
    run.losses += [step() for _ in range(CHECK_STEPS - 1)]
    warm_up(step, max(0, warmup - CHECK_STEPS))
    return step_seconds(step, steps)


def run_torch_mode(mirror, batch, mode: str, steps: int, warmup: int) -> TorchRun:
    """One PyTorch mode from a fresh mirror. torch.compile failing (no Triton or C++ compiler, say)
    is reported in the run's note instead of ending the bench; an eager mode failing is raised."""
    torch, device = torch_setup()
    from meganeura.bench.mirrors import torch_batch

    run = TorchRun(mode)
    model = mirror.model(device)
    optimizer = mirror.optimizer(model.parameters())
    tensors = torch_batch(batch, device)

    def loss_of(values):
        return mirror.loss(model, **values)

    forward = torch.compile(loss_of) if mode == "compile" else loss_of
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if mode == "bf16" else contextlib.nullcontext

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = forward(tensors)
        loss.backward()
        optimizer.step()
        return loss.item()  # waits for the step's work on the stream

    def evaluate() -> float:  # the loss with dropout off, without gradients; training mode after
        model.eval()
        try:
            with torch.no_grad():
                return loss_of(tensors).item()
        finally:
            model.train()

    checked = mode == "fp32" and mirror.workload.stochastic  # the check runs in fp32 eager
    try:
        times = timed_run(run, step, steps, warmup, evaluate if checked else None)
    except Exception as error:
        if mode != "compile":  # eager PyTorch failing on the mirror is a bug here: loudly
            raise
        # torch.compile needs a working backend (Triton, a C++ compiler): reported, the rest runs
        text = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        run.note = f"failed: {type(error).__name__}: {text}"
        return run
    run.ms = 1e3 * statistics.median(times)
    run.times_ms = [1e3 * t for t in times]
    return run


def run_step_workload(
    workload: Workload, steps: int, warmup: int, modes: tuple[str, ...] = ("fp32", "bf16"), with_torch: bool = True
) -> StepResult:
    """Ours, then each PyTorch mode, on the same initial weights and batch."""
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise ValueError(f"unknown PyTorch modes {unknown}; known: {list(MODES)}")
    state = workload.model.state_dict()  # the initial values, before our step changes them
    batch = workload.batch(np.random.default_rng(0))
    result = run_ours(workload, batch, steps, warmup)
    if not with_torch:
        result.torch_note = "torch not measured"
        return result
    if not torch_available():
        result.torch_note = "torch not installed"
        return result
    from meganeura.bench.mirrors import Mirror

    torch, device = torch_setup()
    result.torch_note, result.torch_on_gpu = torch_note(torch, device), device.type == "cuda"
    mirror = Mirror(workload, state)
    for mode in ("fp32", *(m for m in modes if m != "fp32")):  # fp32 first: it is the check
        result.torch[mode] = run_torch_mode(mirror, batch, mode, steps, warmup)
        gc.collect()  # the mode's model and optimizer, before the next one allocates
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result
