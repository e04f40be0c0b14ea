"""Loss modules with torch.nn's signatures, wrapping the functional losses: `criterion =
nn.CrossEntropyLoss(); loss = criterion(logits, labels)` inside a compiled loss function.

As in PyTorch, a class weight (`weight`, `pos_weight`) is a buffer of the module: it is part of
the model's state_dict where the loss module is a model attribute, and a compiled step reads it
only from there (a loss module made outside the model has no weight tensor it can trace: make it
an attribute of the model, e.g. `model.criterion = nn.CrossEntropyLoss(weight=w)`). The
deprecated `size_average`/`reduce` arguments map to `reduction` with PyTorch's warning.

Each forward calls `F.<name>` with PyTorch's argument names, passing the options left at their
defaults only where the functional form needs them, so that a loss whose functional form lacks
an option fails only when that option is used.
"""

from __future__ import annotations

import warnings
from typing import Any

from meganeura import functional as F
from meganeura.nn.module import Module
from meganeura.parameter import Buffer
from meganeura.tensor import Tensor


def legacy_reduction(size_average: bool | None, reduce: bool | None) -> str:
    """PyTorch's mapping of the deprecated size_average/reduce pair to a reduction, with its warning."""
    reduction = F.legacy_reduction(size_average, reduce, "mean")
    warnings.warn(
        f"size_average and reduce args will be deprecated, please use reduction='{reduction}' instead.", stacklevel=4
    )
    return reduction


def optional_buffer(value: Any) -> Buffer | None:
    """A class-weight argument as a module buffer (None stays None)."""
    if value is None or isinstance(value, Buffer):
        return value
    from meganeura.weights import state_array

    return Buffer(state_array(value).astype("float32"))


class Loss(Module):
    """PyTorch's _Loss: the `reduction` ("mean", "sum" or "none"; the functional form checks it),
    from the deprecated pair if given."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__()
        if size_average is not None or reduce is not None:
            reduction = legacy_reduction(size_average, reduce)
        self.reduction = reduction


class WeightedLoss(Loss):
    """PyTorch's _WeightedLoss: a loss with an optional per-class `weight` buffer."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean") -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", optional_buffer(weight))


def class_options(loss: WeightedLoss) -> dict[str, Any]:
    """The `weight` and `ignore_index` of an NLLLoss or a CrossEntropyLoss, those not at their
    defaults (module docstring)."""
    options: dict[str, Any] = {}
    if loss.weight is not None:
        options["weight"] = loss.weight
    if loss.ignore_index != -100:
        options["ignore_index"] = loss.ignore_index
    return options


class CrossEntropyLoss(WeightedLoss):
    """F.cross_entropy as a module (torch.nn.CrossEntropyLoss)."""

    def __init__(
        self,
        weight=None,
        size_average=None,
        ignore_index: int = -100,
        reduce=None,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index
        self.label_smoothing = label_smoothing

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        options = class_options(self)
        if self.label_smoothing != 0.0:
            options["label_smoothing"] = self.label_smoothing
        return F.cross_entropy(input, target, reduction=self.reduction, **options)


class NLLLoss(WeightedLoss):
    """F.nll_loss as a module (torch.nn.NLLLoss)."""

    def __init__(
        self, weight=None, size_average=None, ignore_index: int = -100, reduce=None, reduction: str = "mean"
    ) -> None:
        super().__init__(weight, size_average, reduce, reduction)
        self.ignore_index = ignore_index

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.nll_loss(input, target, reduction=self.reduction, **class_options(self))


class MSELoss(Loss):
    """F.mse_loss as a module (torch.nn.MSELoss)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.mse_loss(input, target, reduction=self.reduction)


class L1Loss(Loss):
    """F.l1_loss as a module (torch.nn.L1Loss)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.l1_loss(input, target, reduction=self.reduction)


class SmoothL1Loss(Loss):
    """F.smooth_l1_loss as a module (torch.nn.SmoothL1Loss)."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0) -> None:
        super().__init__(size_average, reduce, reduction)
        self.beta = beta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.smooth_l1_loss(input, target, reduction=self.reduction, beta=self.beta)


class HuberLoss(Loss):
    """F.huber_loss as a module (torch.nn.HuberLoss)."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0) -> None:
        super().__init__(reduction=reduction)
        self.delta = delta

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.huber_loss(input, target, reduction=self.reduction, delta=self.delta)


class BCELoss(WeightedLoss):
    """F.binary_cross_entropy as a module (torch.nn.BCELoss)."""

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        options = {} if self.weight is None else {"weight": self.weight}
        return F.binary_cross_entropy(input, target, reduction=self.reduction, **options)


class BCEWithLogitsLoss(Loss):
    """F.binary_cross_entropy_with_logits as a module (torch.nn.BCEWithLogitsLoss; weight and
    pos_weight are buffers)."""

    def __init__(self, weight=None, size_average=None, reduce=None, reduction: str = "mean", pos_weight=None) -> None:
        super().__init__(size_average, reduce, reduction)
        self.register_buffer("weight", optional_buffer(weight))
        self.register_buffer("pos_weight", optional_buffer(pos_weight))

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        options: dict[str, Any] = {}
        if self.weight is not None:
            options["weight"] = self.weight
        if self.pos_weight is not None:
            options["pos_weight"] = self.pos_weight
        return F.binary_cross_entropy_with_logits(input, target, reduction=self.reduction, **options)


class KLDivLoss(Loss):
    """F.kl_div as a module (torch.nn.KLDivLoss; input log-probabilities, target probabilities or,
    with log_target, log-probabilities)."""

    def __init__(self, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False) -> None:
        super().__init__(size_average, reduce, reduction)
        self.log_target = log_target

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return F.kl_div(input, target, reduction=self.reduction, log_target=self.log_target)
