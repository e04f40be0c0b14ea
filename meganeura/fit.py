"""The training loop `Program.fit` runs: epochs over batches, a progress bar, callbacks, evaluation
and checkpoints with resume.

    history = program.fit(batches, epochs=3, evaluate=lambda p: {"acc": accuracy(p)},
                          eval_every=100, checkpoint="run.safetensors", checkpoint_every=200,
                          resume=True)

- `batches`: a sequence of input dicts (read again every epoch), or a function of the epoch
  number returning an iterable of them (a shuffled loader). A batch of another size than the
  program was compiled for (a partial last batch) is trained on, as PyTorch's DataLoader gives it
  (drop_last=False): the program compiles a plan for its shapes once (meganeura/shape_plans.py).
  A program compiled with dynamic=False cannot: it skips such a batch, with one warning per fit.
- The bar is tqdm's (loss, steps/s); `progress=None` shows it when tqdm is installed,
  `progress=True` requires it (an ImportError saying how to get it), `False` hides it.
- `callbacks`: functions called as `callback(event)` after every step with a `StepEvent`.
- `evaluate(program)`: returns a number or a dict of numbers; run every `eval_every` steps and at
  the end of every epoch; its results are kept in the history and shown on the bar.
- `checkpoint` / `checkpoint_every`: `program.save(checkpoint)` every N steps and at the end;
  `resume=True` first loads that file when it exists and skips the steps it already holds
  (`program.steps`), so an interrupted run continues where its checkpoint left it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from meganeura.compiler import Program


@dataclass
class StepEvent:
    """What a callback sees after each step."""

    program: Program
    step: int  # steps run so far, resumed ones included
    epoch: int
    loss: float


@dataclass
class History:
    """The run as data: (step, loss) of every step, (step, results) of every evaluation."""

    losses: list[tuple[int, float]] = field(default_factory=list)
    evaluations: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    skipped_batches: int = 0

    def save_plot(self, path: str | os.PathLike, title: str = "") -> None:
        """A PNG of the loss per step (and every evaluation, on a second axis) at `path`."""
        save_loss_curve(self.losses, path, title, self.evaluations)


def loss_curve_saved(
    losses: Sequence[tuple[int, float]],
    path: str | os.PathLike,
    title: str = "",
    evaluations: Sequence[tuple[int, dict[str, float]]] = (),
) -> str:
    """`save_loss_curve`, for a script that goes on without matplotlib: the line to print, saying
    where the PNG went or why there is none."""
    try:
        save_loss_curve(losses, path, title, evaluations)
    except ImportError as error:
        return f"no loss curve: {error}"
    return f"loss curve: {path}"


def save_loss_curve(
    losses: Sequence[tuple[int, float]],
    path: str | os.PathLike,
    title: str = "",
    evaluations: Sequence[tuple[int, dict[str, float]]] = (),
) -> None:
    """Draw (step, loss) pairs, and evaluations beside them, into a PNG (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("a loss-curve PNG needs matplotlib: pip install matplotlib") from None
    figure, axis = plt.subplots(figsize=(7, 4))
    steps, values = zip(*losses, strict=True) if losses else ((), ())
    axis.plot(steps, values, linewidth=0.8, label="training loss")
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    if evaluations:
        other = axis.twinx()
        for name in evaluations[0][1]:
            other.plot([s for s, _ in evaluations], [r[name] for _, r in evaluations], "o-", color="C1", label=name)
        other.set_ylabel(", ".join(evaluations[0][1]))
        other.legend(loc="upper right")
    axis.legend(loc="upper left")
    axis.set_title(title)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def progress_bar(total: int | None, wanted: bool | None, initial: int):
    """A tqdm bar, or None when not wanted (or, with `wanted=None`, when tqdm is missing)."""
    if wanted is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        if wanted:
            raise ImportError("fit(progress=True) needs tqdm: pip install tqdm (or fit(progress=False))") from None
        return None
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def as_results(value: Any) -> dict[str, float]:
    """An evaluation's result as a dict of floats."""
    if isinstance(value, dict):
        return {str(k): float(v) for k, v in value.items()}
    return {"eval": float(value)}


def epoch_batches(batches: Sequence | Callable[[int], Iterable], epoch: int) -> Iterable:
    return batches(epoch) if callable(batches) else batches


def fits(program: Program, batch: dict[str, Any]) -> bool:
    """Whether the program can train on `batch`: any size when dynamic, else the leading size it
    was compiled for."""
    if program.dynamic:
        return True
    for name, spec in program.inputs.items():
        if name in batch and spec.shape and np.shape(batch[name])[:1] != spec.shape[:1]:
            return False
    return True


def fit(
    program: Program,
    batches: Sequence | Callable[[int], Iterable],
    epochs: int = 1,
    callbacks: Sequence[Callable[[StepEvent], Any]] = (),
    evaluate: Callable[[Program], Any] | None = None,
    eval_every: int | None = None,
    checkpoint: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    progress: bool | None = None,
) -> History:
    """Train `program` for `epochs` over `batches` (see the module docstring)."""
    if not program.is_training:
        raise RuntimeError("fit() trains: compile the program with loss= and optimizer=")
    if epochs < 1:
        raise ValueError(f"epochs must be ≥ 1, got {epochs}")
    for name, every in (("eval_every", eval_every), ("checkpoint_every", checkpoint_every)):
        if every is not None and every < 1:
            raise ValueError(f"{name} must be ≥ 1, got {every}")
    if (checkpoint_every or resume) and checkpoint is None:
        raise ValueError("checkpoint_every= and resume= need checkpoint= (the file to write and resume from)")
    if resume and os.path.exists(checkpoint):
        program.load(checkpoint)
    history = History()
    per_epoch = len(batches) if not callable(batches) else None
    total = per_epoch * epochs if per_epoch is not None else None
    bar = progress_bar(total, progress, initial=program.steps)
    to_skip = program.steps  # steps a resumed checkpoint already holds
    warned = False
    try:
        for epoch in range(epochs):
            for batch in epoch_batches(batches, epoch):
                if to_skip:
                    to_skip -= 1
                    continue
                if not fits(program, batch):
                    history.skipped_batches += 1
                    if not warned:
                        warnings.warn(
                            "fit(): skipping a batch whose size differs from the compiled one (a partial "
                            "last batch?): the program was compiled with dynamic=False; compile a program at "
                            "that size to train on it, or compile with dynamic=True",
                            stacklevel=2,
                        )
                        warned = True
                    continue
                loss = program.train_step(**batch)
                step = program.steps
                history.losses.append((step, loss))
                for callback in callbacks:
                    callback(StepEvent(program, step, epoch, loss))
                if evaluate is not None and eval_every and step % eval_every == 0:
                    history.evaluations.append((step, as_results(evaluate(program))))
                if checkpoint_every and step % checkpoint_every == 0:
                    program.save(checkpoint)
                if bar is not None:
                    bar.update(1)
                    shown = {"loss": f"{loss:.4f}", "epoch": epoch + 1}
                    if history.evaluations:
                        shown |= {k: f"{v:.4f}" for k, v in history.evaluations[-1][1].items()}
                    bar.set_postfix(shown, refresh=False)
            if (
                evaluate is not None
                and history.losses
                and (not history.evaluations or history.evaluations[-1][0] != program.steps)
            ):
                history.evaluations.append((program.steps, as_results(evaluate(program))))
    finally:
        if bar is not None:
            bar.close()
    if checkpoint is not None and (checkpoint_every or resume):
        program.save(checkpoint)
    return history
