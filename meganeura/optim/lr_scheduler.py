"""Learning-rate schedulers with torch.optim.lr_scheduler's names, arguments and values.

A scheduler changes its optimizer's `param_groups[i]["lr"]` (OneCycleLR also the momentum or
beta1); the compiled step reads those as run-time values (optim/__init__.py), so the schedule
costs no recompilation. Used as in PyTorch, after each step:

    opt = optim.AdamW(model.parameters(), lr=1e-3)
    program = mn.compile(model, loss, inputs, opt)
    sched = lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    for batch in batches:
        program.train_step(**batch)
        sched.step()

The values are PyTorch's to the last bit: `step()` uses the same recursive (chainable) forms
torch does, in the same order of float operations, and `step(epoch)` the closed forms. Making a
scheduler sets the group's `initial_lr` (once: a second scheduler on the same optimizer starts
from the same base, as in torch) and applies the schedule's value for step 0.

ReduceLROnPlateau is stepped with the metric it watches, `scheduler.step(val_loss)`, and changes
the rates when it stops improving.

The last scheduler made on an optimizer is `optimizer.scheduler` (SequentialLR: the sequence,
not its parts); `program.save` stores its `state_dict()` in the checkpoint and `program.load`
restores it into the scheduler made the same way before the load. State dicts are plain JSON
values (MultiStepLR's milestones as a sorted list, OneCycleLR's strategy by name; ReduceLROnPlateau's
best value of ±inf as JSON's Infinity, which Python's json reads back).
"""

from __future__ import annotations

import math
import types
import warnings
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from meganeura.optim.optimizers import Optimizer

__all__ = [
    "LRScheduler",
    "LambdaLR",
    "StepLR",
    "MultiStepLR",
    "ExponentialLR",
    "CosineAnnealingLR",
    "LinearLR",
    "SequentialLR",
    "OneCycleLR",
    "ReduceLROnPlateau",
    "ConstantLR",
    "PolynomialLR",
    "CosineAnnealingWarmRestarts",
    "CyclicLR",
]


def group_values(optimizer: Optimizer, key: str) -> list[Any]:
    return [group[key] for group in optimizer.param_groups]


def per_group(name: str, optimizer: Optimizer, value: Any) -> list[Any]:
    """One value per parameter group: a list as long as the groups, or one value for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{name}: expected {len(optimizer.param_groups)} values (one per group), got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


def check_optimizer(optimizer: Any) -> None:
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"a scheduler needs a meganeura.optim optimizer, got {type(optimizer).__name__}")


class LRScheduler:
    """The base class: `last_epoch` counts the scheduler's steps (0 after construction), `base_lrs`
    are the groups' `initial_lr`, `get_last_lr()` the learning rates last set."""

    # Attributes that are not state: the optimizer, and what a subclass keeps as code.
    NOT_STATE: tuple[str, ...] = ("optimizer",)

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        check_optimizer(optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for index, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param_groups[{index}] has no 'initial_lr': resuming with last_epoch={last_epoch} needs "
                        "the optimizer's groups as a scheduler left them (load them first)"
                    )
        self.base_lrs = group_values(optimizer, "initial_lr")
        self.last_epoch = last_epoch
        self.is_initial = False  # torch's _is_initial: the first step, made by the constructor
        self._step_count = 0
        optimizer.scheduler = self
        self.initial_step()

    def initial_step(self) -> None:
        """The constructor's step: last_epoch becomes 0 (or the resumed one + 1)."""
        self._step_count = 0
        self.is_initial = True
        try:
            self.step()
        finally:
            self.is_initial = False

    def get_lr(self) -> list[float]:
        """The learning rates for `last_epoch`, from the groups' current ones (the chainable form)."""
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def step(self, epoch: int | None = None) -> None:
        """Advance one step (after `train_step`); `epoch` (deprecated in torch too) jumps to that
        step with the closed form where there is one."""
        self._step_count += 1
        if epoch is not None:
            warnings.warn(
                "scheduler.step(epoch) is deprecated (as in torch): call step() once per step",
                UserWarning,
                stacklevel=2,
            )
        self.update_lr(epoch)

    def update_lr(self, epoch: int | None = None) -> None:
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            values = self.closed_form_lr() if hasattr(self, "closed_form_lr") else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = group_values(self.optimizer, "lr")

    def state_dict(self) -> dict[str, Any]:
        """Every attribute but the optimizer, as JSON values (a checkpoint stores it)."""
        return {key: value for key, value in vars(self).items() if key not in self.NOT_STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        unknown = sorted(set(state) - set(self.state_dict()))
        if unknown:
            raise KeyError(f"{type(self).__name__}.load_state_dict: unknown keys {unknown}")
        vars(self).update({key: value for key, value in state.items() if key not in self.NOT_STATE})


class LambdaLR(LRScheduler):
    """lr = base_lr · lr_lambda(step), a function per group or one for all."""

    NOT_STATE = ("optimizer", "lr_lambdas")

    def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float] | list, last_epoch: int = -1) -> None:
        check_optimizer(optimizer)
        self.lr_lambdas = per_group("lr_lambda", optimizer, lr_lambda)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs, strict=True)]

    def state_dict(self):
        # A plain function is code, not state (None); a callable object's attributes are its state.
        state = super().state_dict()
        state["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else dict(vars(f)) for f in self.lr_lambdas]
        return state

    def load_state_dict(self, state):
        state = dict(state)
        saved = state.pop("lr_lambdas", [None] * len(self.lr_lambdas))
        super().load_state_dict(state)
        for f, attributes in zip(self.lr_lambdas, saved, strict=True):
            if attributes is not None:
                vars(f).update(attributes)


class StepLR(LRScheduler):
    """lr = base_lr · gamma^(step // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1) -> None:
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return group_values(self.optimizer, "lr")
        return [lr * self.gamma for lr in group_values(self.optimizer, "lr")]

    def closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """lr = base_lr · gamma^(milestones passed); a milestone given twice counts twice."""

    def __init__(
        self, optimizer: Optimizer, milestones: Iterable[int], gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.last_epoch not in self.milestones:
            return group_values(self.optimizer, "lr")
        factor = self.gamma ** self.milestones[self.last_epoch]
        return [lr * factor for lr in group_values(self.optimizer, "lr")]

    def closed_form_lr(self):
        passed = bisect_right(sorted(self.milestones.elements()), self.last_epoch)
        return [base * self.gamma**passed for base in self.base_lrs]

    def state_dict(self):
        return super().state_dict() | {"milestones": sorted(self.milestones.elements())}  # JSON keys are strings

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.milestones = Counter(state["milestones"])


class ExponentialLR(LRScheduler):
    """lr = base_lr · gamma^step."""

    def __init__(self, optimizer: Optimizer, gamma: float, last_epoch: int = -1) -> None:
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        if self.is_initial:
            return group_values(self.optimizer, "lr")
        return [lr * self.gamma for lr in group_values(self.optimizer, "lr")]

    def closed_form_lr(self):
        return [base * self.gamma**self.last_epoch for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr − eta_min)·(1 + cos(π·step/T_max))/2 (SGDR without restarts;
    past T_max it rises again, as torch's does)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0, last_epoch: int = -1) -> None:  # noqa: N803 (torch's name)
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs, e, t_max, eta = group_values(self.optimizer, "lr"), self.last_epoch, self.T_max, self.eta_min
        if self.is_initial:
            return lrs
        if self._step_count == 1 and e > 0:  # resumed at a later step: the closed form
            return [eta + (base - eta) * (1 + math.cos(e * math.pi / t_max)) / 2 for base in self.base_lrs]
        if (e - 1 - t_max) % (2 * t_max) == 0:  # the bottom of the cosine: the ratio below would be 0/0
            return [
                lr + (base - eta) * (1 - math.cos(math.pi / t_max)) / 2
                for lr, base in zip(lrs, self.base_lrs, strict=True)
            ]
        ratio = (1 + math.cos(math.pi * e / t_max)) / (1 + math.cos(math.pi * (e - 1) / t_max))
        return [ratio * (lr - eta) + eta for lr in lrs]

    def closed_form_lr(self):
        cosine = 1 + math.cos(math.pi * self.last_epoch / self.T_max)
        return [self.eta_min + (base - self.eta_min) * cosine / 2 for base in self.base_lrs]


class LinearLR(LRScheduler):
    """lr = base_lr · (start_factor + (end_factor − start_factor)·min(step, total_iters)/total_iters):
    the usual linear warm-up."""

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        if not 0.0 < start_factor <= 1.0:
            raise ValueError(f"start_factor must be in (0, 1], got {start_factor}")
        if not 0.0 <= end_factor <= 1.0:
            raise ValueError(f"end_factor must be in [0, 1], got {end_factor}")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs = group_values(self.optimizer, "lr")
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in lrs]
        if self.is_initial or self.last_epoch > self.total_iters:
            return lrs
        rise = self.end_factor - self.start_factor
        factor = 1.0 + rise / (self.total_iters * self.start_factor + (self.last_epoch - 1) * rise)
        return [lr * factor for lr in lrs]

    def closed_form_lr(self):
        done = min(self.total_iters, self.last_epoch) / self.total_iters
        return [base * (self.start_factor + (self.end_factor - self.start_factor) * done) for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """lr = base_lr · factor for the first total_iters steps, base_lr after."""

    def __init__(self, optimizer: Optimizer, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1):
        if factor > 1.0 or factor < 0:
            raise ValueError("Constant multiplicative factor expected to be between 0 and 1.")
        self.factor, self.total_iters = factor, total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs = group_values(self.optimizer, "lr")
        if self.last_epoch == 0:
            return [lr * self.factor for lr in lrs]
        if self.last_epoch != self.total_iters:
            return lrs
        return [lr * (1.0 / self.factor) for lr in lrs]

    def closed_form_lr(self):
        after = self.last_epoch >= self.total_iters
        return [base * (self.factor + after * (1 - self.factor)) for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """lr = base_lr · (1 − min(step, total_iters)/total_iters)^power."""

    def __init__(self, optimizer: Optimizer, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1) -> None:
        self.total_iters, self.power = total_iters, power
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        lrs = group_values(self.optimizer, "lr")
        if self.is_initial or self.last_epoch > self.total_iters:
            return lrs
        decay = ((1.0 - self.last_epoch / self.total_iters) / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** (
            self.power
        )
        return [lr * decay for lr in lrs]

    def closed_form_lr(self):
        return [
            base * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power
            for base in self.base_lrs
        ]


class CosineAnnealingWarmRestarts(LRScheduler):
    """Cosine annealing from base_lr to eta_min over T_i steps, restarted with T_i ← T_i·T_mult
    (T_0 first), as torch's: lr = eta_min + (base_lr − eta_min)·(1 + cos(π·T_cur/T_i))/2."""

    def __init__(
        self,
        optimizer: Optimizer,
        T_0: int,  # noqa: N803 (torch's names)
        T_mult: int = 1,  # noqa: N803
        eta_min: float = 0.0,
        last_epoch: int = -1,
    ) -> None:
        if T_0 <= 0 or not isinstance(T_0, int):
            raise ValueError(f"Expected positive integer T_0, but got {T_0}")
        if T_mult < 1 or not isinstance(T_mult, int):
            raise ValueError(f"Expected integer T_mult >= 1, but got {T_mult}")
        if not isinstance(eta_min, (float, int)):
            raise ValueError(f"Expected float or int eta_min, but got {eta_min} of type {type(eta_min)}")
        self.T_0, self.T_i, self.T_mult, self.eta_min, self.T_cur = T_0, T_0, T_mult, eta_min, last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        return [
            self.eta_min + (base - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
            for base in self.base_lrs
        ]

    def step(self, epoch: int | None = None) -> None:  # noqa: D102 (torch's: epoch may be fractional)
        self._step_count += 1
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur, self.T_i = self.T_cur % self.T_i, self.T_i * self.T_mult
        elif epoch < 0:
            raise ValueError(f"Expected non-negative epoch, but got {epoch}")
        elif epoch >= self.T_0:
            if self.T_mult == 1:
                self.T_cur = epoch % self.T_0
            else:
                n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                self.T_cur = epoch - self.T_0 * (self.T_mult**n - 1) / (self.T_mult - 1)
                self.T_i = self.T_0 * self.T_mult**n
        else:
            self.T_i, self.T_cur = self.T_0, epoch
        self.last_epoch = math.floor(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = group_values(self.optimizer, "lr")


class SequentialLR(LRScheduler):
    """`schedulers[i]` from step `milestones[i-1]` on (each restarted from its own step 0 there):
    e.g. LinearLR warm-up, then CosineAnnealingLR."""

    NOT_STATE = ("optimizer", "_schedulers")

    def __init__(
        self, optimizer: Optimizer, schedulers: list[LRScheduler], milestones: list[int], last_epoch: int = -1
    ) -> None:
        check_optimizer(optimizer)
        if not schedulers:
            raise ValueError("SequentialLR needs at least one scheduler")
        for index, scheduler in enumerate(schedulers):
            if getattr(scheduler, "optimizer", None) is not optimizer:
                raise ValueError(
                    f"SequentialLR: schedulers[{index}] ({type(scheduler).__name__}) is on another optimizer"
                )
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"SequentialLR: {len(schedulers)} schedulers need {len(schedulers) - 1} milestones, "
                f"got {len(milestones)}"
            )
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        self.base_lrs = group_values(optimizer, "initial_lr")
        # Undo the steps the parts made when they were built, and start the first one afresh.
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self.undo_initial_steps(self)
        first = self._schedulers[bisect_right(self._milestones, 0)]
        first.initial_step()
        self._last_lr = first.get_last_lr()
        optimizer.scheduler = self

    def undo_initial_steps(self, scheduler: LRScheduler) -> None:
        for part in getattr(scheduler, "_schedulers", ()):
            self.undo_initial_steps(part)
        if not hasattr(scheduler, "_schedulers"):
            scheduler.last_epoch -= 1

    def step(self) -> None:  # noqa: D102 (no epoch argument, as torch's)
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            scheduler.update_lr(0)  # the next part starts at its own step 0, by its closed form
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self):
        return super().state_dict() | {"_schedulers": [s.state_dict() for s in self._schedulers]}

    def load_state_dict(self, state):
        state = dict(state)
        parts = state.pop("_schedulers")
        if len(parts) != len(self._schedulers):
            raise ValueError(
                f"SequentialLR.load_state_dict: {len(parts)} schedulers saved, {len(self._schedulers)} here"
            )
        super().load_state_dict(state)
        for scheduler, part in zip(self._schedulers, parts, strict=True):
            scheduler.load_state_dict(part)


def set_momentum(group: dict[str, Any], value: float, use_beta1: bool) -> None:
    """A group's momentum, or Adam's beta1 (the schedulers that cycle momentum move either)."""
    if use_beta1:
        group["betas"] = (value, *group["betas"][1:])
    else:
        group["momentum"] = value


class CyclicLR(LRScheduler):
    """The learning rate cycles between base_lr and max_lr (triangular, triangular2, exp_range or a
    custom scale_fn; step_size_up steps up, step_size_down down), momentum (or beta1) the other way
    between max_momentum and base_momentum, as torch's CyclicLR."""

    NOT_STATE = ("optimizer", "custom_scale")

    def __init__(
        self,
        optimizer: Optimizer,
        base_lr: float | list[float],
        max_lr: float | list[float],
        step_size_up: int = 2000,
        step_size_down: int | None = None,
        mode: str = "triangular",
        gamma: float = 1.0,
        scale_fn: Callable[[float], float] | None = None,
        scale_mode: str = "cycle",
        cycle_momentum: bool = True,
        base_momentum: float | list[float] = 0.8,
        max_momentum: float | list[float] = 0.9,
        last_epoch: int = -1,
    ) -> None:
        check_optimizer(optimizer)
        self.optimizer = optimizer
        base_lrs = per_group("base_lr", optimizer, base_lr)
        if last_epoch == -1:
            for lr, group in zip(base_lrs, optimizer.param_groups, strict=True):
                group["lr"] = lr
        self.max_lrs = per_group("max_lr", optimizer, max_lr)
        up = float(step_size_up)
        down = float(step_size_down) if step_size_down is not None else up
        self.total_size = up + down
        self.step_ratio = up / self.total_size
        if mode not in ("triangular", "triangular2", "exp_range") and scale_fn is None:
            raise ValueError("mode is invalid and scale_fn is None")
        self.mode, self.gamma, self.custom_scale = mode, gamma, scale_fn
        # torch: the built-in modes fix the scale mode (cycle, or iterations for exp_range).
        self.scale_mode = scale_mode if scale_fn is not None else ("iterations" if mode == "exp_range" else "cycle")
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError("optimizer must support momentum or beta1 with `cycle_momentum` option enabled")
            self.use_beta1 = "betas" in optimizer.defaults
            self.base_momentums = per_group("base_momentum", optimizer, base_momentum)
            self.max_momentums = per_group("max_momentum", optimizer, max_momentum)
            if last_epoch == -1:
                for high, low, group in zip(
                    self.max_momentums, self.base_momentums, optimizer.param_groups, strict=True
                ):
                    set_momentum(group, high, self.use_beta1)
                    group["max_momentum"], group["base_momentum"] = high, low
        super().__init__(optimizer, last_epoch)
        self.base_lrs = base_lrs

    def scale_fn(self, x: float) -> float:
        if self.custom_scale is not None:
            return self.custom_scale(x)
        if self.mode == "triangular":
            return 1.0
        if self.mode == "triangular2":
            return 1 / (2.0 ** (x - 1))
        return self.gamma**x

    def get_lr(self):
        cycle = math.floor(1 + self.last_epoch / self.total_size)
        x = 1.0 + self.last_epoch / self.total_size - cycle
        scale_factor = x / self.step_ratio if x <= self.step_ratio else (x - 1) / (self.step_ratio - 1)
        scale = self.scale_fn(cycle if self.scale_mode == "cycle" else self.last_epoch)
        lrs = [
            base + (top - base) * scale_factor * scale for base, top in zip(self.base_lrs, self.max_lrs, strict=True)
        ]
        if self.cycle_momentum:
            for group, low, high in zip(
                self.optimizer.param_groups, self.base_momentums, self.max_momentums, strict=True
            ):
                set_momentum(group, high - (high - low) * scale_factor * scale, self.use_beta1)
        return lrs


class OneCycleLR(LRScheduler):
    """The 1cycle policy: lr rises from max_lr/div_factor to max_lr over pct_start of total_steps,
    then anneals to initial_lr/final_div_factor (three_phase: back to initial_lr first); momentum
    (or Adam's beta1) moves the other way between max_momentum and base_momentum."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | list[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | list[float] = 0.85,
        max_momentum: float | list[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        check_optimizer(optimizer)
        self.optimizer = optimizer
        self.total_steps = self.steps_of(total_steps, epochs, steps_per_epoch)
        if not isinstance(pct_start, float) or not 0.0 <= pct_start <= 1.0:
            raise ValueError(f"pct_start must be a float in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal_strategy = anneal_strategy
        self.phases = self.phases_of(pct_start, three_phase)
        if last_epoch == -1:
            for group, peak in zip(optimizer.param_groups, per_group("max_lr", optimizer, max_lr), strict=True):
                group["initial_lr"] = peak / div_factor
                group["max_lr"] = peak
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        self.use_beta1 = "betas" in optimizer.defaults
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and not self.use_beta1:
                raise ValueError("OneCycleLR(cycle_momentum=True) needs an optimizer with momentum or betas")
            if last_epoch == -1:
                highs = per_group("max_momentum", optimizer, max_momentum)
                lows = per_group("base_momentum", optimizer, base_momentum)
                for group, high, low in zip(optimizer.param_groups, highs, lows, strict=True):
                    self.set_momentum(group, high)
                    group["max_momentum"] = high
                    group["base_momentum"] = low
        super().__init__(optimizer, last_epoch)

    @staticmethod
    def steps_of(total_steps, epochs, steps_per_epoch) -> int:
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
            return total_steps
        if epochs is None or steps_per_epoch is None:
            raise ValueError("OneCycleLR needs total_steps, or epochs and steps_per_epoch")
        for name, value in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        return epochs * steps_per_epoch

    def phases_of(self, pct_start: float, three_phase: bool) -> list[dict[str, Any]]:
        """(last step, lr from → to, momentum from → to) of each phase, the values named by group key."""
        rise_end = float(pct_start * self.total_steps) - 1
        if three_phase:
            return [
                {"end_step": rise_end, "lr": ["initial_lr", "max_lr"], "momentum": ["max_momentum", "base_momentum"]},
                {
                    "end_step": float(2 * pct_start * self.total_steps) - 2,
                    "lr": ["max_lr", "initial_lr"],
                    "momentum": ["base_momentum", "max_momentum"],
                },
                {
                    "end_step": self.total_steps - 1,
                    "lr": ["initial_lr", "min_lr"],
                    "momentum": ["max_momentum", "max_momentum"],
                },
            ]
        return [
            {"end_step": rise_end, "lr": ["initial_lr", "max_lr"], "momentum": ["max_momentum", "base_momentum"]},
            {
                "end_step": self.total_steps - 1,
                "lr": ["max_lr", "min_lr"],
                "momentum": ["base_momentum", "max_momentum"],
            },
        ]

    def set_momentum(self, group: dict[str, Any], value: float) -> None:
        set_momentum(group, value, self.use_beta1)

    def anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(f"OneCycleLR stepped {step} times; total_steps is {self.total_steps}")
        lrs = []
        for group in self.optimizer.param_groups:
            start = 0.0
            for index, phase in enumerate(self.phases):
                end = phase["end_step"]
                if step <= end or index == len(self.phases) - 1:
                    pct = (step - start) / (end - start)
                    lrs.append(self.anneal(group[phase["lr"][0]], group[phase["lr"][1]], pct))
                    if self.cycle_momentum:
                        self.set_momentum(
                            group, self.anneal(group[phase["momentum"][0]], group[phase["momentum"][1]], pct)
                        )
                    break
                start = end
        return lrs


class ReduceLROnPlateau(LRScheduler):
    """lr ← max(lr·factor, min_lr) once the metric given to `step(metrics)` has not improved for
    more than `patience` steps (then none for `cooldown` steps); an improvement beats the best by
    `threshold` (relative or absolute, `threshold_mode`) in `mode` "min" or "max"; a reduction
    smaller than `eps` is not made (torch.optim.lr_scheduler.ReduceLROnPlateau; its state dict
    has torch's keys)."""

    def __init__(
        self,
        optimizer: Optimizer,
        mode: str = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float | list[float] = 0,
        eps: float = 1e-8,
    ) -> None:
        if factor >= 1.0:
            raise ValueError("Factor should be < 1.0.")
        self.factor = factor
        check_optimizer(optimizer)
        self.optimizer = optimizer
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != len(optimizer.param_groups):
                raise ValueError(f"expected {len(optimizer.param_groups)} min_lrs, got {len(min_lr)}")
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * len(optimizer.param_groups)
        self.patience = patience
        self.cooldown = cooldown
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = group_values(optimizer, "lr")
        self.init_is_better(mode, threshold, threshold_mode)
        self.reset()
        optimizer.scheduler = self

    def init_is_better(self, mode: str, threshold: float, threshold_mode: str) -> None:
        if mode not in {"min", "max"}:
            raise ValueError("mode " + mode + " is unknown!")
        if threshold_mode not in {"rel", "abs"}:
            raise ValueError("threshold mode " + threshold_mode + " is unknown!")
        self.mode_worse = math.inf if mode == "min" else -math.inf  # the worst value for the mode
        self.mode = mode
        self.threshold = threshold
        self.threshold_mode = threshold_mode

    def reset(self) -> None:
        """No best value yet, and no bad steps or cooldown counted."""
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    @property
    def in_cooldown(self) -> bool:
        return self.cooldown_counter > 0

    def is_better(self, a: float, best: float) -> bool:
        if self.mode == "min" and self.threshold_mode == "rel":
            return a < best * (1.0 - self.threshold)
        if self.mode == "min":
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    def step(self, metrics: float, epoch: int | None = None) -> None:  # noqa: D102 (torch's signature)
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(
                "scheduler.step(metrics, epoch) is deprecated (as in torch): call step(metrics) once per step",
                UserWarning,
                stacklevel=2,
            )
        self.last_epoch = epoch
        if self.is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0  # bad steps in the cooldown do not count
        if self.num_bad_epochs > self.patience:
            self.reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = group_values(self.optimizer, "lr")

    def reduce_lr(self) -> None:
        if len(self.optimizer.param_groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError(
                    f"ReduceLROnPlateau has {len(self.min_lrs)} min_lrs and the optimizer now "
                    f"{len(self.optimizer.param_groups)} parameter groups: set its min_lrs to one per group"
                )
            self.min_lrs = [self.default_min_lr] * len(self.optimizer.param_groups)
        for group, min_lr in zip(self.optimizer.param_groups, self.min_lrs, strict=True):
            old_lr = float(group["lr"])
            new_lr = max(old_lr * self.factor, min_lr)
            if old_lr - new_lr > self.eps:
                group["lr"] = new_lr

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.init_is_better(self.mode, self.threshold, self.threshold_mode)
