"""Optimizer updates: elementwise, PyTorch's rules (torch/optim/sgd.py, adam.py, single-tensor form).

The first operand is the value being replaced, so the runtime can update it in place. The
parameter p is an operand of momentum_buffer and adam_moment exactly when weight decay is added
to the gradient (weight_decay ≠ 0), so that a kernel reads only what it uses.

- sgd_step(p, d): p − lr·(d + weight_decay·p)
- momentum_buffer(buf, g[, p]): momentum·buf + (g + weight_decay·p)
- adam_moment(m, g[, p]): beta·m + (1 − beta)·gᵒʳᵈᵉʳ with g = grad + weight_decay·p (Adam's L2 form)
- adam_step(p, m, v, t): p·(1 − lr·weight_decay) − lr/(1 − beta1ᵗ)·m/(√v/√(1 − beta2ᵗ) + eps)
  (AdamW's decoupled decay; weight_decay 0 for Adam), t the step count (a scalar tensor)
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.op import FLOAT, INT, Attr, Op, ShapeError, require_float

FAMILY = "optimizer"


def infer_update(name: str, decayed_operand: int | None = None):
    def infer(types, attrs):
        require_float(types, name)
        for t in types[1:]:
            if t.shape not in (types[0].shape, ()):
                raise ShapeError(f"{name}: {t} does not match {types[0]}")
        if decayed_operand is not None and (attrs["weight_decay"] != 0.0) != (len(types) > decayed_operand):
            raise ShapeError(
                f"{name}: the parameter is an operand exactly when weight_decay is not 0 "
                f"(weight_decay {attrs['weight_decay']}, {len(types)} operands)"
            )
        return types[0]

    return infer


def evaluate_sgd_step(p, d, lr, weight_decay):
    """p − lr·(d + weight_decay·p)."""
    return p - lr * (d + weight_decay * p)


def evaluate_momentum_buffer(buf, g, p=None, *, momentum, weight_decay):
    """momentum·buf + (g + weight_decay·p)."""
    return momentum * buf + (g if p is None else g + weight_decay * p)


def evaluate_adam_moment(m, g, p=None, *, beta, order, weight_decay):
    """beta·m + (1−beta)·gᵒʳᵈᵉʳ, with g = grad + weight_decay·p (Adam's L2 form)."""
    g = g if p is None else g + weight_decay * p
    return beta * m + (1.0 - beta) * (g if order == 1 else g * g)


def evaluate_adam_step(p, m, v, t, lr, beta1, beta2, eps, weight_decay):
    """p·(1 − lr·wd) − lr·m̂/(√v̂ + eps): AdamW's decoupled decay (weight_decay=0 for Adam)."""
    bias1 = 1.0 - beta1**t
    bias2 = 1.0 - beta2**t
    p = p * (1.0 - lr * weight_decay)
    return p - (lr / bias1) * m / (np.sqrt(v) / np.sqrt(bias2) + eps)


WEIGHT_DECAY = Attr("weight_decay", FLOAT, 0.0)

SGD_STEP = Op(
    "sgd_step",
    family=FAMILY,
    infer=infer_update("sgd_step"),
    evaluate=evaluate_sgd_step,
    operands=("p", "d"),
    attrs=(Attr("lr", FLOAT), WEIGHT_DECAY),
    doc="p − lr·(d + weight_decay·p)",
)
MOMENTUM_BUFFER = Op(
    "momentum_buffer",
    family=FAMILY,
    infer=infer_update("momentum_buffer", decayed_operand=2),
    evaluate=evaluate_momentum_buffer,
    operands=("buf", "g", "p?"),
    attrs=(Attr("momentum", FLOAT), WEIGHT_DECAY),
    doc="momentum·buf + (g + weight_decay·p)",
)
ADAM_MOMENT = Op(
    "adam_moment",
    family=FAMILY,
    infer=infer_update("adam_moment", decayed_operand=2),
    evaluate=evaluate_adam_moment,
    operands=("m", "g", "p?"),
    attrs=(Attr("beta", FLOAT), Attr("order", INT), WEIGHT_DECAY),
    doc="beta·m + (1 − beta)·gᵒʳᵈᵉʳ, g = grad + weight_decay·p",
)
ADAM_STEP = Op(
    "adam_step",
    family=FAMILY,
    infer=infer_update("adam_step"),
    evaluate=evaluate_adam_step,
    operands=("p", "m", "v", "t"),
    attrs=(Attr("lr", FLOAT), Attr("beta1", FLOAT), Attr("beta2", FLOAT), Attr("eps", FLOAT), WEIGHT_DECAY),
    doc="p·(1 − lr·wd) − lr/(1 − beta1ᵗ)·m/(√v/√(1 − beta2ᵗ) + eps)",
)
