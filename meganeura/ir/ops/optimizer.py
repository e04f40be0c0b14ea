"""Optimizer updates: elementwise, PyTorch's rules (torch/optim/sgd.py, adam.py, rmsprop.py,
adagrad.py, adamax.py, nadam.py, radam.py, adadelta.py, single-tensor form), each float operation
in the order torch's does it.

Two forms of the same updates. The hyper-parameters are operands, not attributes: scalars read
from a buffer the runtime writes before a step, or constants where a term is absent by
construction (in the single-tensor form, Adam's decoupled decay of 1 and AdamW's L2 term of 0).
So a new learning rate needs no new kernel. A parameter group's run-time values are one vector, a `state` leaf
`param_groups.<g>.hyper` laid out as HYPER_FIELDS says, and each operand is an `element` view of
it (ir/ops/shape.py): a kernel that reads several binds the group's vector once and indexes it at
literal offsets, so a fused Adam update binds 5 buffers (p, m, v, the gradient and the vector),
within WebGPU's minimum of 8.

The vector holds what torch computes in Python double before its tensor ops, cast to f32 as a
tensor op casts a Python scalar: the hyper-parameters themselves and the values derived from them
and from the step count t, which the host computes (optim/optimizers.py `hyper_fields`) and the
Program writes before each step (compiler.py `Program.write_hypers`): Adam's
step_size = lr/(1 − β₁ᵗ) and bias_correction2_sqrt = √(1 − β₂ᵗ), the 1 − β that torch passes to
lerp and addcmul, AdamW's 1 − lr·wd, Adagrad's lr/(1 + (t − 1)·lr_decay), Adamax's lr/(1 − β₁ᵗ),
NAdam's two step sizes (from its momentum schedule μₜ and their running product), RAdam's
rectification. The kernels never compute a power or a 1 − β in f32.

The single-tensor ops, one per formula (`fused=False`), with g′ = g + wd·p (L2 weight decay):

- sgd_step(p, d, lr, wd): p − lr·(d + wd·p)
- momentum_buffer(buf, g, p, momentum, dampening, wd): momentum·buf + dampening·g′ (`dampening` the
  factor 1 − dampening, or 1 where torch starts the buffer as the gradient itself)
- adam_moment(m, g, p, beta, weight, wd; order): order 1: lerp(m, g′, weight) as torch's lerp
  (m + weight·(g′ − m) for weight < 0.5, else g′ − (g′ − m)·(1 − weight)); order 2:
  m·beta + (weight·g′)·g′ (torch's mul_ then addcmul_). weight is torch's 1 − β. RMSprop's square
  and gradient averages and Adagrad's sum (beta = weight = 1) are moments too.
- adam_step(p, m, v, step_size, bias_correction2_sqrt, eps, decay):
  p·decay − (step_size·m)/(√v / bias_correction2_sqrt + eps) (decay: AdamW's 1 − lr·wd, the
  constant 1 for Adam)
- rms_step(p, g, s, a, lr, eps, wd): p − (lr·g′)/(√(s − a·a) + eps): RMSprop's step without
  momentum (a: the centered gradient average, the constant 0 when not centered) and Adagrad's
  (s its sum, a = 0, lr the decayed rate)
- rms_buffer(buf, g, p, s, a, momentum, eps, wd): momentum·buf + g′/(√(s − a·a) + eps): RMSprop's
  momentum buffer (its step is then sgd_step(p, buf′, lr, 0))
- adamax_norm(u, g, p, beta2, eps, wd): maximum(u·beta2, |g′| + eps), NaN where either is (torch.maximum):
  Adamax's exponentially weighted infinity norm (its first moment is an adam_moment)
- adamax_step(p, m, u, step_size): p − (step_size·m)/u (torch's addcdiv_ with value −lr/(1 − β₁ᵗ))
- nadam_step(p, g, m, v, grad_step_size, momentum_step_size, bias_correction2, eps, wd, decay):
  d = √(v/bias_correction2) + eps, then (p·decay − (grad_step_size·g′)/d) − (momentum_step_size·m)/d,
  rounded after each of torch's two addcdiv_. NAdam's and RAdam's `decoupled_weight_decay` is a
  run-time value: their group's vector holds wd = 0 and decay = 1 − lr·wd when it is set, the
  weight decay and decay = 1 otherwise (p·1 and g + 0·p are exact), so no attribute fixes it
- radam_step(p, m, v, lr, bias_correction1, bias_correction2_sqrt, eps, rectification, decay):
  s = (m/bias_correction1)·lr; where rectification > 0 (torch's ρₜ > 5)
  s = (s·((1/(√v + eps))·bias_correction2_sqrt))·rectification; p·decay − s
- adadelta_delta(g, p, s, acc, eps, wd): (√(acc + eps)/√(s + eps))·g′: Adadelta's step direction (its
  square average and acc_delta are adam_moments, of g′ and of the direction; its step is
  sgd_step(p, delta, lr, 0))

The first operand is the value being replaced, so the runtime can update it in place.

The fused ops, the whole update of one parameter as one node with a result per value it replaces
(`fused=True`, the default), defined as the composition of the single-tensor ops above:

- sgd_update(p, g, lr, wd[, momentum, dampening, buf]; nesterov) → p′ (plain SGD), or (p′, buf′)
  with a momentum buffer (nesterov: the step is g′ + momentum·buf′)
- adam_update(p, g, m, v, vmax, weight1, beta2, weight2, step_size, bias_correction2_sqrt, eps, wd,
  decay; decoupled_weight_decay, amsgrad) → (p′, m′, v′[, vmax′]): both moments, AMSGrad's running
  maximum of v (vmax: the constant 0 without amsgrad) and the step; `decoupled_weight_decay` picks
  AdamW's decay (on p: it reads `decay`) over Adam's L2 term (on the gradient: `wd`)
- rmsprop_update(p, g, s, a, buf, lr, alpha, weight, eps, wd, momentum; centered, momentum_buffer)
  → (p′, s′[, a′][, buf′]): a and buf are the constant 0 where absent
- adagrad_update(p, g, s, step_size, eps, wd) → (p′, s′)
- adamax_update(p, g, m, u, weight1, beta2, step_size, eps, wd) → (p′, m′, u′)
- nadam_update(p, g, m, v, weight1, beta2, weight2, bias_correction2, eps, grad_step_size,
  momentum_step_size, wd, decay) → (p′, m′, v′)
- radam_update(p, g, m, v, weight1, beta2, weight2, lr, bias_correction1, bias_correction2_sqrt, eps,
  rectification, wd, decay) → (p′, m′, v′)
- adadelta_update(p, g, s, acc, lr, rho, weight, eps, wd) → (p′, s′, acc′)

A fused update's gradient may come as its parts: g of shape [P, *p.shape], summed over the first
axis as it is read (split products' partial sums, a two-level column reduction's partials), so
that no kernel of its own sums them (`passes/update_parts.py` `updates_reading_parts`).

`replaced_operands(op, attrs, arity)` says which operand each result replaces (in place, when
nothing else needs the old value). `multi_sgd_update`, `multi_adam_update`, … (`multi_` and a
fused update's name) are the same updates of several parameters in one node: their operands
are the members' operands one member after another (each member with its own hyper-parameter
operands, those of its parameter group), their results the members' results likewise (`members`
of them; multi_sgd_update's `momentum`: each member has a buffer). The compiler forms them after
the e-graph from the fused ops it can run in place (`passes/multi_tensor.py`); they have no
e-graph form.
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, INT, Attr, Op, ShapeError, require_float

FAMILY = "optimizer"

# The layout of a parameter group's hyper-parameter vector: field k at offset k. One layout for
# every optimizer (a field it has no use for stays 0), so the offsets are constants of the op set.
# The first fields are torch's hyper-parameters; the rest are what torch derives from them and
# from the step count in Python double (module docstring): `dampening_factor` 1 − dampening (1 on
# SGD's first step), `one_minus_*` the weights of torch's lerp_/addcmul_, `step_size` Adam's and
# Adamax's lr/(1 − β₁ᵗ) or Adagrad's decayed rate, `decay` AdamW's (NAdam's, RAdam's) 1 − lr·wd,
# `bias_correction1`/`bias_correction2` 1 − βᵗ (RAdam's and NAdam's divisors), NAdam's
# `grad_step_size` lr·(1 − μₜ)/(1 − Πμ) and `momentum_step_size` lr·μₜ₊₁/(1 − Πμ·μₜ₊₁), RAdam's
# `rectification` (0 where torch takes the unrectified step).
HYPER_FIELDS = (
    "lr",
    "weight_decay",
    "momentum",
    "dampening_factor",
    "beta1",
    "beta2",
    "one_minus_beta1",
    "one_minus_beta2",
    "eps",
    "step_size",
    "bias_correction2_sqrt",
    "decay",
    "alpha",
    "one_minus_alpha",
    "bias_correction1",
    "bias_correction2",
    "grad_step_size",
    "momentum_step_size",
    "rectification",
    "rho",
    "one_minus_rho",
)


def hyper_offset(field: str) -> int:
    """The offset of a hyper-parameter in its group's vector (a KeyError naming the fields)."""
    if field not in HYPER_FIELDS:
        raise KeyError(f"{field!r} is not a hyper-parameter field; the vector holds {HYPER_FIELDS}")
    return HYPER_FIELDS.index(field)


def hyper_vector(values: dict[str, float]) -> np.ndarray:
    """A group's hyper-parameter vector (f32, HYPER_FIELDS' order) from values by field name, each
    rounded to f32 once (as a tensor op casts a Python scalar); the fields not given are 0."""
    unknown = set(values) - set(HYPER_FIELDS)
    if unknown:
        raise KeyError(f"{sorted(unknown)} are not hyper-parameter fields; the vector holds {HYPER_FIELDS}")
    return np.array([values.get(field, 0.0) for field in HYPER_FIELDS], np.float32)


def infer_update(name: str, tensors: int):
    """The first `tensors` operands are tensors of the parameter's shape (or scalars); the rest are
    the hyper-parameters, scalar tensors (elements of the group's vector, or constants)."""

    def infer(types, attrs):
        require_float(types, name)
        for t in types[1:tensors]:
            if t.shape not in (types[0].shape, ()):
                raise ShapeError(f"{name}: {t} does not match {types[0]}")
        for t in types[tensors:]:
            if t.shape != ():
                raise ShapeError(f"{name}: a hyper-parameter operand must be a scalar, got {t}")
        return types[0]

    return infer


def decayed(g, p, weight_decay):
    """g + weight_decay·p: torch's grad.add(param, alpha=weight_decay)."""
    return g + weight_decay * p


def lerp(start, end, weight):
    """torch.lerp(start, end, weight) for a scalar weight in [0, 1], as its kernel computes it:
    start + weight·(end − start) below 0.5, end − (end − start)·(1 − weight) from 0.5 on."""
    return np.where(weight < 0.5, start + weight * (end - start), end - (end - start) * (1.0 - weight))


def evaluate_sgd_step(p, d, lr, weight_decay):
    """p − lr·(d + weight_decay·p)."""
    return p - lr * decayed(d, p, weight_decay)


def evaluate_momentum_buffer(buf, g, p, momentum, dampening, weight_decay):
    """momentum·buf + dampening·(g + weight_decay·p)."""
    return momentum * buf + dampening * decayed(g, p, weight_decay)


def evaluate_adam_moment(m, g, p, beta, weight, weight_decay, *, order):
    """lerp(m, g′, weight) (order 1) or m·beta + (weight·g′)·g′ (order 2), g′ = g + weight_decay·p."""
    g = decayed(g, p, weight_decay)
    return lerp(m, g, weight) if order == 1 else m * beta + (weight * g) * g


def evaluate_adam_step(p, m, v, step_size, bias_correction2_sqrt, eps, decay):
    """p·decay − (step_size·m)/(√v/bias_correction2_sqrt + eps)."""
    return p * decay - (step_size * m) / (np.sqrt(v) / bias_correction2_sqrt + eps)


def rms_denominator(s, a, eps):
    """√(s − a·a) + eps: RMSprop's (centered when a is the gradient average) and Adagrad's."""
    return np.sqrt(s - a * a) + eps


def evaluate_rms_step(p, g, s, a, lr, eps, weight_decay):
    """p − (lr·g′)/(√(s − a·a) + eps)."""
    return p - (lr * decayed(g, p, weight_decay)) / rms_denominator(s, a, eps)


def evaluate_rms_buffer(buf, g, p, s, a, momentum, eps, weight_decay):
    """momentum·buf + g′/(√(s − a·a) + eps)."""
    return momentum * buf + decayed(g, p, weight_decay) / rms_denominator(s, a, eps)


def evaluate_adamax_norm(u, g, p, beta2, eps, weight_decay):
    """maximum(u·beta2, |g′| + eps) (torch.maximum: NaN where either is)."""
    return np.maximum(u * beta2, np.abs(decayed(g, p, weight_decay)) + eps)


def evaluate_adamax_step(p, m, u, step_size):
    """p − (step_size·m)/u."""
    return p - (step_size * m) / u


def evaluate_nadam_step(p, g, m, v, grad_step_size, momentum_step_size, bias_correction2, eps, weight_decay, decay):
    """(p·decay − (grad_step_size·g′)/d) − (momentum_step_size·m)/d, d = √(v/bias_correction2) + eps."""
    denominator = np.sqrt(v / bias_correction2) + eps
    p = p * decay - (grad_step_size * decayed(g, p, weight_decay)) / denominator
    return p - (momentum_step_size * m) / denominator


def evaluate_radam_step(p, m, v, lr, bias_correction1, bias_correction2_sqrt, eps, rectification, decay):
    """p·decay − s, s = (m/bias_correction1)·lr, times (1/(√v + eps))·bias_correction2_sqrt and then
    the rectification where it is > 0 (torch's products, in its order)."""
    step = (m / bias_correction1) * lr
    adaptive = (1 / (np.sqrt(v) + eps)) * bias_correction2_sqrt  # torch's c / t: t.reciprocal() * c
    return p * decay - np.where(rectification > 0, (step * adaptive) * rectification, step)


def evaluate_adadelta_delta(g, p, s, acc, eps, weight_decay):
    """(√(acc + eps)/√(s + eps))·g′."""
    return (np.sqrt(acc + eps) / np.sqrt(s + eps)) * decayed(g, p, weight_decay)


SGD_STEP = Op(
    "sgd_step",
    family=FAMILY,
    infer=infer_update("sgd_step", 2),
    evaluate=evaluate_sgd_step,
    operands=("p", "d", "lr", "weight_decay"),
    doc="p − lr·(d + weight_decay·p)",
)
MOMENTUM_BUFFER = Op(
    "momentum_buffer",
    family=FAMILY,
    infer=infer_update("momentum_buffer", 3),
    evaluate=evaluate_momentum_buffer,
    operands=("buf", "g", "p", "momentum", "dampening", "weight_decay"),
    doc="momentum·buf + dampening·(g + weight_decay·p)",
)
ADAM_MOMENT = Op(
    "adam_moment",
    family=FAMILY,
    infer=infer_update("adam_moment", 3),
    evaluate=evaluate_adam_moment,
    operands=("m", "g", "p", "beta", "weight", "weight_decay"),
    attrs=(Attr("order", INT),),
    doc="lerp(m, g′, weight) (order 1) or m·beta + (weight·g′)·g′ (order 2), g′ = g + weight_decay·p",
)
ADAM_STEP = Op(
    "adam_step",
    family=FAMILY,
    infer=infer_update("adam_step", 3),
    evaluate=evaluate_adam_step,
    operands=("p", "m", "v", "step_size", "bias_correction2_sqrt", "eps", "decay"),
    doc="p·decay − (step_size·m)/(√v/bias_correction2_sqrt + eps)",
)
RMS_STEP = Op(
    "rms_step",
    family=FAMILY,
    infer=infer_update("rms_step", 4),
    evaluate=evaluate_rms_step,
    operands=("p", "g", "s", "a", "lr", "eps", "weight_decay"),
    doc="p − (lr·g′)/(√(s − a·a) + eps), g′ = g + weight_decay·p (RMSprop, Adagrad)",
)
RMS_BUFFER = Op(
    "rms_buffer",
    family=FAMILY,
    infer=infer_update("rms_buffer", 5),
    evaluate=evaluate_rms_buffer,
    operands=("buf", "g", "p", "s", "a", "momentum", "eps", "weight_decay"),
    doc="momentum·buf + g′/(√(s − a·a) + eps), g′ = g + weight_decay·p (RMSprop's momentum)",
)
ADAMAX_NORM = Op(
    "adamax_norm",
    family=FAMILY,
    infer=infer_update("adamax_norm", 3),
    evaluate=evaluate_adamax_norm,
    operands=("u", "g", "p", "beta2", "eps", "weight_decay"),
    doc="maximum(u·beta2, |g′| + eps), g′ = g + weight_decay·p (Adamax's infinity norm)",
)
ADAMAX_STEP = Op(
    "adamax_step",
    family=FAMILY,
    infer=infer_update("adamax_step", 3),
    evaluate=evaluate_adamax_step,
    operands=("p", "m", "u", "step_size"),
    doc="p − (step_size·m)/u (Adamax's step)",
)
NADAM_STEP = Op(
    "nadam_step",
    family=FAMILY,
    infer=infer_update("nadam_step", 4),
    evaluate=evaluate_nadam_step,
    operands=(
        "p",
        "g",
        "m",
        "v",
        "grad_step_size",
        "momentum_step_size",
        "bias_correction2",
        "eps",
        "weight_decay",
        "decay",
    ),  # fmt: skip
    doc="(p·decay − (grad_step_size·g′)/d) − (momentum_step_size·m)/d, d = √(v/bias_correction2) + eps (NAdam's step)",
)
RADAM_STEP = Op(
    "radam_step",
    family=FAMILY,
    infer=infer_update("radam_step", 3),
    evaluate=evaluate_radam_step,
    operands=("p", "m", "v", "lr", "bias_correction1", "bias_correction2_sqrt", "eps", "rectification", "decay"),
    doc="p·decay − (m/bias_correction1)·lr (times the adaptive rate and the rectification where it is > 0)",
)
ADADELTA_DELTA = Op(
    "adadelta_delta",
    family=FAMILY,
    infer=infer_update("adadelta_delta", 4),
    evaluate=evaluate_adadelta_delta,
    operands=("g", "p", "s", "acc", "eps", "weight_decay"),
    doc="(√(acc + eps)/√(s + eps))·g′, g′ = g + weight_decay·p (Adadelta's step direction)",
)


# ---------------------------------------------------------------------------------------------
# The fused updates: one node per parameter, one result per value it replaces


def summed_gradient(g: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The gradient of a fused update: `g`, or the sum of its parts over the first axis."""
    return g if g.ndim == p.ndim else np.sum(g, axis=0, dtype=g.dtype)


def gradient_fits(g: TensorType, p: TensorType) -> bool:
    """Whether `g` is the gradient of `p` (its shape) or its parts ([P, *p.shape])."""
    return g.shape == p.shape or (g.rank == p.rank + 1 and g.shape[1:] == p.shape and g.shape[0] >= 1)


def evaluate_sgd_update(p, g, lr, weight_decay, momentum=None, dampening=None, buf=None, *, nesterov=False):
    """optim.SGD's single-tensor graph: sgd_step(p, g) without momentum; with it
    sgd_step(p, buf′) where buf′ = momentum_buffer(buf, g, p), or Nesterov's
    sgd_step(p, g′ + momentum·buf′)."""
    g = summed_gradient(g, p)
    if buf is None:
        return evaluate_sgd_step(p, g, lr, weight_decay)
    new_buf = evaluate_momentum_buffer(buf, g, p, momentum, dampening, weight_decay)
    direction = decayed(g, p, weight_decay) + momentum * new_buf if nesterov else new_buf
    return evaluate_sgd_step(p, direction, lr, np.zeros_like(lr)), new_buf


def evaluate_adam_update(
    p, g, m, v, vmax, weight1, beta2, weight2, step_size, bias_correction2_sqrt, eps, weight_decay, decay,
    *, decoupled_weight_decay, amsgrad,
):  # fmt: skip
    """The two adam_moment updates, AMSGrad's maximum and adam_step, as optim.Adam/AdamW's
    single-tensor graph has them."""
    g = summed_gradient(g, p)
    zero, one = np.zeros_like(eps), np.ones_like(eps)
    l2 = zero if decoupled_weight_decay else weight_decay
    new_m = evaluate_adam_moment(m, g, p, zero, weight1, l2, order=1)
    new_v = evaluate_adam_moment(v, g, p, beta2, weight2, l2, order=2)
    denominator = running_max(vmax, new_v) if amsgrad else new_v
    new_p = evaluate_adam_step(
        p, new_m, denominator, step_size, bias_correction2_sqrt, eps, decay if decoupled_weight_decay else one
    )
    return (new_p, new_m, new_v, denominator) if amsgrad else (new_p, new_m, new_v)


def running_max(vmax, v):
    """AMSGrad's max(vmax, v) as where(v < vmax, vmax, v): NaN in v wins, as in torch.maximum."""
    return np.where(v < vmax, vmax, v)


def evaluate_rmsprop_update(
    p, g, s, a, buf, lr, alpha, weight, eps, weight_decay, momentum, *, centered, momentum_buffer
):
    """adam_moment of the square average (and of the gradient average, centered), then rms_step,
    or rms_buffer and sgd_step with a momentum buffer: optim.RMSprop's single-tensor graph."""
    g = summed_gradient(g, p)
    new_s = evaluate_adam_moment(s, g, p, alpha, weight, weight_decay, order=2)
    new_a = evaluate_adam_moment(a, g, p, alpha, weight, weight_decay, order=1) if centered else np.zeros_like(eps)
    extra = (new_a,) if centered else ()
    if momentum_buffer:
        new_buf = evaluate_rms_buffer(buf, g, p, new_s, new_a, momentum, eps, weight_decay)
        return (evaluate_sgd_step(p, new_buf, lr, np.zeros_like(lr)), new_s, *extra, new_buf)
    return (evaluate_rms_step(p, g, new_s, new_a, lr, eps, weight_decay), new_s, *extra)


def evaluate_adagrad_update(p, g, s, step_size, eps, weight_decay):
    """adam_moment(s, g, p, 1, 1) (s + g′·g′) and rms_step: optim.Adagrad's single-tensor graph."""
    g = summed_gradient(g, p)
    one = np.ones_like(eps)
    new_s = evaluate_adam_moment(s, g, p, one, one, weight_decay, order=2)
    return evaluate_rms_step(p, g, new_s, np.zeros_like(eps), step_size, eps, weight_decay), new_s


def evaluate_adamax_update(p, g, m, u, weight1, beta2, step_size, eps, weight_decay):
    """adam_moment (order 1), adamax_norm and adamax_step: optim.Adamax's single-tensor graph."""
    g = summed_gradient(g, p)
    new_m = evaluate_adam_moment(m, g, p, np.zeros_like(eps), weight1, weight_decay, order=1)
    new_u = evaluate_adamax_norm(u, g, p, beta2, eps, weight_decay)
    return evaluate_adamax_step(p, new_m, new_u, step_size), new_m, new_u


def evaluate_nadam_update(
    p, g, m, v, weight1, beta2, weight2, bias_correction2, eps, grad_step_size, momentum_step_size, weight_decay, decay
):
    """The two adam_moment updates and nadam_step: optim.NAdam's single-tensor graph."""
    g = summed_gradient(g, p)
    new_m = evaluate_adam_moment(m, g, p, np.zeros_like(eps), weight1, weight_decay, order=1)
    new_v = evaluate_adam_moment(v, g, p, beta2, weight2, weight_decay, order=2)
    steps = (grad_step_size, momentum_step_size, bias_correction2, eps, weight_decay, decay)
    return evaluate_nadam_step(p, g, new_m, new_v, *steps), new_m, new_v


def evaluate_radam_update(
    p, g, m, v, weight1, beta2, weight2, lr, bias_correction1, bias_correction2_sqrt, eps, rectification,
    weight_decay, decay,
):  # fmt: skip
    """The two adam_moment updates and radam_step: optim.RAdam's single-tensor graph."""
    g = summed_gradient(g, p)
    new_m = evaluate_adam_moment(m, g, p, np.zeros_like(eps), weight1, weight_decay, order=1)
    new_v = evaluate_adam_moment(v, g, p, beta2, weight2, weight_decay, order=2)
    steps = (lr, bias_correction1, bias_correction2_sqrt, eps, rectification, decay)
    return evaluate_radam_step(p, new_m, new_v, *steps), new_m, new_v


def evaluate_adadelta_update(p, g, s, acc, lr, rho, weight, eps, weight_decay):
    """adam_moment of the square average, adadelta_delta, adam_moment of acc_delta (of the
    direction, without decay) and sgd_step: optim.Adadelta's single-tensor graph."""
    g = summed_gradient(g, p)
    zero = np.zeros_like(eps)
    new_s = evaluate_adam_moment(s, g, p, rho, weight, weight_decay, order=2)
    delta = evaluate_adadelta_delta(g, p, new_s, acc, eps, weight_decay)
    new_acc = evaluate_adam_moment(acc, delta, zero, rho, weight, zero, order=2)
    return evaluate_sgd_step(p, delta, lr, zero), new_s, new_acc


def check_gradient(name: str, g: TensorType, p: TensorType) -> None:
    """A ShapeError unless `g` is the gradient of `p` or its parts (`gradient_fits`)."""
    if not gradient_fits(g, p):
        raise ShapeError(f"{name}: the gradient {g} does not match the parameter {p}")


def check_hypers(name: str, types) -> None:
    for t in types:
        if t.shape != ():
            raise ShapeError(f"{name}: a hyper-parameter operand must be a scalar, got {t}")


def check_states(name: str, p: TensorType, states: dict[str, TensorType], present: dict[str, bool]) -> None:
    """Each state tensor of a fused update has the parameter's shape; an absent one is a scalar."""
    for what, t in states.items():
        if present.get(what, True) and t.shape != p.shape:
            raise ShapeError(f"{name}: the {what} {t} does not match the parameter {p}")
        if not present.get(what, True) and t.shape != ():
            raise ShapeError(f"{name}: without a {what}, its operand must be the scalar 0, got {t}")


def infer_sgd_update(types, attrs):
    require_float(types, "sgd_update")
    if len(types) not in (4, 7):
        raise ShapeError(f"sgd_update: (p, g, lr, weight_decay[, momentum, dampening, buf]), got {len(types)} operands")
    check_gradient("sgd_update", types[1], types[0])
    if len(types) == 7:
        check_states("sgd_update", types[0], {"momentum buffer": types[6]}, {})
    elif attrs.get("nesterov"):
        raise ShapeError("sgd_update: nesterov needs a momentum buffer")
    check_hypers("sgd_update", types[2:6])
    return types[0] if len(types) == 4 else (types[0], types[0])


def infer_adam_update(types, attrs):
    require_float(types, "adam_update")
    p, g, m, v, vmax, *hypers = types
    check_gradient("adam_update", g, p)
    check_states("adam_update", p, {"exp_avg": m, "exp_avg_sq": v, "max_exp_avg_sq": vmax}, {
        "max_exp_avg_sq": attrs["amsgrad"]
    })  # fmt: skip
    check_hypers("adam_update", hypers)
    return (p,) * (4 if attrs["amsgrad"] else 3)


def infer_rmsprop_update(types, attrs):
    require_float(types, "rmsprop_update")
    p, g, s, a, buf, *hypers = types
    check_gradient("rmsprop_update", g, p)
    present = {"grad_avg": attrs["centered"], "momentum_buffer": attrs["momentum_buffer"]}
    check_states("rmsprop_update", p, {"square_avg": s, "grad_avg": a, "momentum_buffer": buf}, present)
    check_hypers("rmsprop_update", hypers)
    return (p,) * (2 + sum(present.values()))


def infer_adagrad_update(types, attrs):
    require_float(types, "adagrad_update")
    p, g, s, *hypers = types
    check_gradient("adagrad_update", g, p)
    check_states("adagrad_update", p, {"sum": s}, {})
    check_hypers("adagrad_update", hypers)
    return (p, p)


def infer_three_state_update(name: str, states: tuple[str, str]):
    """The shape rule of a fused update (p, g, two states, hyper-parameters…) → (p′, and the states′)."""

    def infer(types, attrs):
        require_float(types, name)
        p, g, first, second, *hypers = types
        check_gradient(name, g, p)
        check_states(name, p, dict(zip(states, (first, second), strict=True)), {})
        check_hypers(name, hypers)
        return (p, p, p)

    return infer


SGD_UPDATE = Op(
    "sgd_update",
    family=FAMILY,
    infer=infer_sgd_update,
    evaluate=evaluate_sgd_update,
    operands=("p", "g", "lr", "weight_decay", "momentum?", "dampening?", "buf?"),
    attrs=(Attr("nesterov", BOOL, False),),
    doc="p′ = p − lr·d, d = g + wd·p, or with momentum buf′ = momentum·buf + dampening·d and d = buf′ "
    "(nesterov: d + momentum·buf′): (p′[, buf′])",
)
ADAM_UPDATE = Op(
    "adam_update",
    family=FAMILY,
    infer=infer_adam_update,
    evaluate=evaluate_adam_update,
    operands=(
        "p",
        "g",
        "m",
        "v",
        "vmax",
        "weight1",
        "beta2",
        "weight2",
        "step_size",
        "bias_correction2_sqrt",
        "eps",
        "weight_decay",
        "decay",
    ),  # fmt: skip
    attrs=(Attr("decoupled_weight_decay", BOOL, False), Attr("amsgrad", BOOL, False)),
    doc="(p′, m′, v′[, vmax′]): adam_moment ×2 (AMSGrad's maximum) and adam_step of one parameter",
)
RMSPROP_UPDATE = Op(
    "rmsprop_update",
    family=FAMILY,
    infer=infer_rmsprop_update,
    evaluate=evaluate_rmsprop_update,
    operands=("p", "g", "s", "a", "buf", "lr", "alpha", "weight", "eps", "weight_decay", "momentum"),
    attrs=(Attr("centered", BOOL, False), Attr("momentum_buffer", BOOL, False)),
    doc="(p′, s′[, a′][, buf′]): RMSprop's averages and step of one parameter",
)
ADAGRAD_UPDATE = Op(
    "adagrad_update",
    family=FAMILY,
    infer=infer_adagrad_update,
    evaluate=evaluate_adagrad_update,
    operands=("p", "g", "s", "step_size", "eps", "weight_decay"),
    doc="(p′, s′): Adagrad's sum and step of one parameter",
)

ADAMAX_UPDATE = Op(
    "adamax_update",
    family=FAMILY,
    infer=infer_three_state_update("adamax_update", ("exp_avg", "exp_inf")),
    evaluate=evaluate_adamax_update,
    operands=("p", "g", "m", "u", "weight1", "beta2", "step_size", "eps", "weight_decay"),
    doc="(p′, m′, u′): Adamax's moment, infinity norm and step of one parameter",
)
NADAM_UPDATE = Op(
    "nadam_update",
    family=FAMILY,
    infer=infer_three_state_update("nadam_update", ("exp_avg", "exp_avg_sq")),
    evaluate=evaluate_nadam_update,
    operands=(
        "p",
        "g",
        "m",
        "v",
        "weight1",
        "beta2",
        "weight2",
        "bias_correction2",
        "eps",
        "grad_step_size",
        "momentum_step_size",
        "weight_decay",
        "decay",
    ),  # fmt: skip
    doc="(p′, m′, v′): adam_moment ×2 and nadam_step of one parameter",
)
RADAM_UPDATE = Op(
    "radam_update",
    family=FAMILY,
    infer=infer_three_state_update("radam_update", ("exp_avg", "exp_avg_sq")),
    evaluate=evaluate_radam_update,
    operands=(
        "p",
        "g",
        "m",
        "v",
        "weight1",
        "beta2",
        "weight2",
        "lr",
        "bias_correction1",
        "bias_correction2_sqrt",
        "eps",
        "rectification",
        "weight_decay",
        "decay",
    ),  # fmt: skip
    doc="(p′, m′, v′): adam_moment ×2 and radam_step of one parameter",
)
ADADELTA_UPDATE = Op(
    "adadelta_update",
    family=FAMILY,
    infer=infer_three_state_update("adadelta_update", ("square_avg", "acc_delta")),
    evaluate=evaluate_adadelta_update,
    operands=("p", "g", "s", "acc", "lr", "rho", "weight", "eps", "weight_decay"),
    doc="(p′, s′, acc′): Adadelta's square average, step direction, acc_delta and step of one parameter",
)

FUSED_UPDATES = (
    "sgd_update", "adam_update", "rmsprop_update", "adagrad_update", "adamax_update", "nadam_update", "radam_update",
    "adadelta_update",
)  # fmt: skip


def replaced_operands(op: str, attrs: dict, arity: int) -> tuple[int, ...]:
    """For a fused update, the operand position that each of its results replaces, in result order."""
    if op == "sgd_update":
        return (0, 6) if arity == 7 else (0,)
    if op == "adam_update":
        return (0, 2, 3, 4) if attrs["amsgrad"] else (0, 2, 3)
    if op == "rmsprop_update":
        return (0, 2) + ((3,) if attrs["centered"] else ()) + ((4,) if attrs["momentum_buffer"] else ())
    if op == "adagrad_update":
        return (0, 2)
    if op in ("adamax_update", "nadam_update", "radam_update", "adadelta_update"):
        return (0, 2, 3)
    raise KeyError(f"{op!r} is not a fused optimizer update; they are {FUSED_UPDATES}")


def member_arity(op: str, attrs: dict) -> int:
    """The operands of one member of a multi-tensor update of `op` with these attributes."""
    if op == "sgd_update":
        return 7 if attrs["momentum"] else 4
    return OPS_BY_NAME[op].min_operands


def member_results(op: str, attrs: dict) -> int:
    """The results of one member (the values it replaces)."""
    return len(replaced_operands(op, attrs, member_arity(op, attrs)))


def members_of(op: str, attrs: dict, items: list) -> list[list]:
    """`items` (the operands of a multi-tensor node) split into its members' operand lists."""
    arity, count = member_arity(op, attrs), attrs["members"]
    if len(items) != arity * count:
        raise ShapeError(f"multi_{op}: {count} members of {arity} operands need {arity * count}, got {len(items)}")
    return [items[k * arity : (k + 1) * arity] for k in range(count)]


def member_attrs(attrs: dict) -> dict:
    """A multi-tensor node's attributes as its members' (without `members` and SGD's `momentum`)."""
    return {k: v for k, v in attrs.items() if k not in ("members", "momentum")}


def infer_multi(op: str):
    def infer(types, attrs):
        if attrs["members"] < 1:
            raise ShapeError(f"multi_{op}: needs at least one member, got {attrs['members']}")
        results: list[TensorType] = []
        for operands in members_of(op, attrs, list(types)):
            out = OPS_BY_NAME[op].infer(operands, member_attrs(attrs))
            results.extend(out if isinstance(out, tuple) else (out,))
        return tuple(results)

    return infer


def evaluate_multi(op: str):
    def evaluate(*arrays, members, **attrs):
        results = []
        layout = {"members": members, **attrs}
        if op == "sgd_update":
            layout["momentum"] = len(arrays) // members == 7
        for operands in members_of(op, layout, list(arrays)):
            out = OPS_BY_NAME[op].evaluate(*operands, **member_attrs(attrs))
            results.extend(out if isinstance(out, tuple) else (out,))
        return tuple(results)

    return evaluate


def describe_multi(node) -> str:
    numel = sum(t.numel for t in node.types[:: max(1, len(node.types) // node.attr("members"))])
    return f"{node.attr('members')} parameters, {numel:,} elements"


OPS_BY_NAME = {
    op.name: op
    for op in (
        SGD_UPDATE, ADAM_UPDATE, RMSPROP_UPDATE, ADAGRAD_UPDATE, ADAMAX_UPDATE, NADAM_UPDATE, RADAM_UPDATE,
        ADADELTA_UPDATE,
    )
}  # fmt: skip
MEMBERS = Attr("members", INT)


def multi_op(op: Op, extra: tuple[Attr, ...] = ()) -> Op:
    """The multi-tensor form of the fused update `op` (no e-graph form: formed after extraction)."""
    return Op(
        f"multi_{op.name}",
        family=FAMILY,
        infer=infer_multi(op.name),
        evaluate=evaluate_multi(op.name),
        operands=("*members",),
        attrs=(*extra, *op.attrs, MEMBERS),
        egraph=None,
        describe=describe_multi,
        doc=f"{op.name} of `members` parameters, in one kernel",
    )


MULTI_SGD_UPDATE = multi_op(SGD_UPDATE, (Attr("momentum", BOOL, False),))  # momentum: each member has a buffer
MULTI_ADAM_UPDATE = multi_op(ADAM_UPDATE)
MULTI_RMSPROP_UPDATE = multi_op(RMSPROP_UPDATE)
MULTI_ADAGRAD_UPDATE = multi_op(ADAGRAD_UPDATE)
MULTI_ADAMAX_UPDATE = multi_op(ADAMAX_UPDATE)
MULTI_NADAM_UPDATE = multi_op(NADAM_UPDATE)
MULTI_RADAM_UPDATE = multi_op(RADAM_UPDATE)
MULTI_ADADELTA_UPDATE = multi_op(ADADELTA_UPDATE)
MULTI_OF = {op: f"multi_{op}" for op in FUSED_UPDATES}


def updated_operands(node) -> tuple[int, ...]:
    """For a fused or multi-tensor update node, the operand position each result replaces."""
    attrs = node.attr_dict
    if node.op in OPS_BY_NAME:
        return replaced_operands(node.op, attrs, len(node.inputs))
    member = next(op for op, multi in MULTI_OF.items() if multi == node.op)
    arity = member_arity(member, attrs)
    positions = replaced_operands(member, member_attrs(attrs), arity)
    return tuple(k * arity + position for k in range(attrs["members"]) for position in positions)
