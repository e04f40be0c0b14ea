"""Optimizers as IR update rules, with exactly PyTorch's update formulas.

An optimizer does not run anything: `build_updates` appends the update of every parameter to the
training graph (new state leaves for moments, and an `update` per parameter and state), so the
whole step — forward, backward, update — is one graph and one GPU submission.

`fused` is torch.optim's flag of the same name, with the same numbers either way. With
`fused=True` (the default) each parameter's whole update is one node (`sgd_update`,
`adam_update`: ir/ops/optimizer.py) and the compiler updates many parameters in one kernel
(codegen/multi_tensor.py); with `fused=False` each formula is a node of its own (Adam: two
moments and the step, PyTorch's single-tensor form), and each is a kernel per parameter.

>>> from meganeura import optim
>>> optim.AdamW(lr=1e-3).weight_decay
0.01
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meganeura.ir.autodiff import GradBuilder
from meganeura.ir.graph import TensorType
from meganeura.pytorch_names import missing_names


@dataclass(frozen=True)
class ParamGrad:
    """One trainable parameter in the graph: its name, its `param` leaf and its gradient node."""

    name: str
    node: int
    grad: int


class Optimizer:
    """Base class: subclasses append their update nodes and declare their state's initial values."""

    def build_updates(self, builder: GradBuilder, params: list[ParamGrad]) -> dict[str, np.ndarray]:
        """Append the update nodes; return the initial value of every state leaf they created."""
        raise NotImplementedError

    @staticmethod
    def state_leaf(builder: GradBuilder, name: str, shape: tuple[int, ...]) -> int:
        attrs = {"name": name, "shape": shape, "dtype": "f32"}
        return builder.graph.add("state", (), TensorType(shape, "f32"), attrs, builder.sources)


def check_hyper(name: str, value: float, low: float = 0.0, high: float | None = None) -> float:
    value = float(value)
    if not np.isfinite(value) or value < low or (high is not None and value >= high):
        span = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {span}, got {value}")
    return value


def check_flag(name: str, value: bool) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum and L2 weight decay (torch.optim.SGD)."""

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, fused: bool = True) -> None:
        self.lr = check_hyper("lr", lr)
        self.momentum = check_hyper("momentum", momentum)
        self.weight_decay = check_hyper("weight_decay", weight_decay)
        self.fused = check_flag("fused", fused)

    def build_updates(self, builder, params):
        if self.fused:
            return self.build_fused_updates(builder, params)
        initial: dict[str, np.ndarray] = {}
        for p in params:
            direction, decay = p.grad, self.weight_decay
            if self.momentum:
                buf_name = f"{p.name}.momentum_buffer"
                buf = self.state_leaf(builder, buf_name, builder.shape(p.node))
                operands = [buf, p.grad, p.node] if self.weight_decay else [buf, p.grad]
                direction = builder.emit(
                    "momentum_buffer", operands, momentum=self.momentum, weight_decay=self.weight_decay
                )
                builder.graph.updates[buf_name] = direction
                initial[buf_name] = np.zeros(builder.shape(p.node), np.float32)
                decay = 0.0
            builder.graph.updates[p.name] = builder.emit(
                "sgd_step", [p.node, direction], lr=self.lr, weight_decay=decay
            )
        return initial

    def build_fused_updates(self, builder, params):
        """One `sgd_update` per parameter: (p′) or, with momentum, (p′, buf′)."""
        initial: dict[str, np.ndarray] = {}
        hypers = {"lr": self.lr, "momentum": self.momentum, "weight_decay": self.weight_decay}
        for p in params:
            if not self.momentum:
                builder.graph.updates[p.name] = builder.emit("sgd_update", [p.node, p.grad], **hypers)
                continue
            buf_name = f"{p.name}.momentum_buffer"
            buf = self.state_leaf(builder, buf_name, builder.shape(p.node))
            update = builder.emit("sgd_update", [p.node, p.grad, buf], **hypers)
            builder.graph.updates[p.name] = builder.result(update, 0)
            builder.graph.updates[buf_name] = builder.result(update, 1)
            initial[buf_name] = np.zeros(builder.shape(p.node), np.float32)
        return initial


class Adam(Optimizer):
    """Adam with bias correction and L2 weight decay added to the gradient (torch.optim.Adam)."""

    decoupled = False

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool = True,
    ) -> None:
        self.lr = check_hyper("lr", lr)
        self.betas = (check_hyper("betas[0]", betas[0], 0.0, 1.0), check_hyper("betas[1]", betas[1], 0.0, 1.0))
        self.eps = check_hyper("eps", eps)
        self.weight_decay = check_hyper("weight_decay", weight_decay)
        self.fused = check_flag("fused", fused)

    def build_updates(self, builder, params):
        beta1, beta2 = self.betas
        step = self.state_leaf(builder, "step", ())
        new_step = builder.emit("add", [step, builder.const(1.0)])
        builder.graph.updates["step"] = new_step
        initial = {"step": np.zeros((), np.float32)}
        if self.fused:
            return initial | self.build_fused_updates(builder, params, new_step)
        l2 = 0.0 if self.decoupled else self.weight_decay
        for p in params:
            moments = []
            for suffix, beta, order in (("exp_avg", beta1, 1), ("exp_avg_sq", beta2, 2)):
                name = f"{p.name}.{suffix}"
                leaf = self.state_leaf(builder, name, builder.shape(p.node))
                operands = [leaf, p.grad, p.node] if l2 else [leaf, p.grad]
                moment = builder.emit("adam_moment", operands, beta=beta, order=order, weight_decay=l2)
                builder.graph.updates[name] = moment
                initial[name] = np.zeros(builder.shape(p.node), np.float32)
                moments.append(moment)
            builder.graph.updates[p.name] = builder.emit(
                "adam_step",
                [p.node, moments[0], moments[1], new_step],
                lr=self.lr,
                beta1=beta1,
                beta2=beta2,
                eps=self.eps,
                weight_decay=self.weight_decay if self.decoupled else 0.0,
            )
        return initial

    def build_fused_updates(self, builder, params, new_step: int) -> dict[str, np.ndarray]:
        """One `adam_update` per parameter, (p′, exp_avg′, exp_avg_sq′), reading the new step count."""
        beta1, beta2 = self.betas
        hypers = {"lr": self.lr, "beta1": beta1, "beta2": beta2, "eps": self.eps}
        hypers |= {"weight_decay": self.weight_decay, "decoupled_weight_decay": self.decoupled}
        initial = {}
        for p in params:
            names = (p.name, f"{p.name}.exp_avg", f"{p.name}.exp_avg_sq")
            moments = [self.state_leaf(builder, name, builder.shape(p.node)) for name in names[1:]]
            update = builder.emit("adam_update", [p.node, p.grad, *moments, new_step], **hypers)
            for index, name in enumerate(names):
                builder.graph.updates[name] = builder.result(update, index)
            for name in names[1:]:
                initial[name] = np.zeros(builder.shape(p.node), np.float32)
        return initial


class AdamW(Adam):
    """Adam with decoupled weight decay, p ← p·(1 − lr·wd) before the step (torch.optim.AdamW)."""

    decoupled = True

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, fused: bool = True) -> None:
        super().__init__(lr, betas, eps, weight_decay, fused)


__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
