"""Optimizer updates: elementwise, PyTorch's rules (torch/optim/sgd.py, adam.py, single-tensor form).

Two forms of the same updates. The hyper-parameters (lr, momentum, betas, eps, weight_decay)
are operands, not attributes: scalars read from buffers the runtime writes before a step when
the optimizer's values changed, or constants where a term is absent by construction (Adam's
decoupled decay of 0, AdamW's L2 term of 0). So a new learning rate needs no new kernel.
A parameter group's run-time values are one vector, a `state` leaf `param_groups.<g>.hyper`
laid out as HYPER_FIELDS says (optim/optimizers.py fills it), and each operand is an `element`
view of it (ir/ops/shape.py): a kernel that reads several binds the group's vector once and
indexes it at literal offsets, so a fused Adam update binds 6 buffers (p, m, v, the gradient,
the step count and the vector), within WebGPU's minimum of 8.

The single-tensor ops, one per formula (`optim.SGD/Adam(fused=False)`):

- sgd_step(p, d, lr, wd): p − lr·(d + wd·p)
- momentum_buffer(buf, g, p, momentum, wd): momentum·buf + (g + wd·p)
- adam_moment(m, g, p, beta, wd): beta·m + (1 − beta)·gᵒʳᵈᵉʳ with g = grad + wd·p (Adam's L2 form;
  AdamW passes constants 0 for p and wd, which kernels inline)
- adam_step(p, m, v, t, lr, beta1, beta2, eps, wd): p·(1 − lr·wd) − lr/(1 − beta1ᵗ)·m/(√v/√(1 − beta2ᵗ) + eps)
  (AdamW's decoupled decay; the constant 0 for Adam), t the step count (a scalar tensor)

The first operand is the value being replaced, so the runtime can update it in place.

The fused ops, the whole update of one parameter as one node with a result per value it replaces
(`fused=True`, the default), defined as the composition of the single-tensor ops above:

- sgd_update(p, g, lr, wd[, momentum, buf]) → p′ (plain SGD), or (p′, buf′) with a momentum buffer
- adam_update(p, g, m, v, t, lr, beta1, beta2, eps, wd) → (p′, m′, v′): both moments and the step;
  `decoupled_weight_decay` picks AdamW's decay (on p) over Adam's L2 term (on the gradient)

A fused update's gradient may come as its parts: g of shape [P, *p.shape], summed over the first
axis as it is read (split products' partial sums, a two-level column reduction's partials), so
that no kernel of its own sums them (`codegen/optimizer.py` `updates_reading_parts`).

`UPDATED_OPERANDS[op]` says which operand each result replaces (in place, when nothing else
needs the old value). `multi_sgd_update` and `multi_adam_update` are the same updates of several
parameters in one node: their operands are the members' operands one member after another (each
member with its own hyper-parameter operands, those of its parameter group), their results the
members' results likewise (`members` of them; multi_sgd_update's `momentum`: each member has a
buffer). The compiler forms them after the e-graph from the fused ops it can run in place
(`codegen/multi_tensor.py`); they have no e-graph form.
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, INT, Attr, Op, ShapeError, require_float

FAMILY = "optimizer"

# The layout of a parameter group's hyper-parameter vector: field k at offset k. One layout for
# every optimizer (a field it has no use for stays 0), so the offsets are constants of the op set.
# The step count is not a field: the step computes it (`step` + 1, gated with the updates),
# where the runtime writes this vector only when the optimizer's values change.
HYPER_FIELDS = ("lr", "weight_decay", "momentum", "beta1", "beta2", "eps")


def hyper_offset(field: str) -> int:
    """The offset of a hyper-parameter in its group's vector (a KeyError naming the fields)."""
    if field not in HYPER_FIELDS:
        raise KeyError(f"{field!r} is not a hyper-parameter field; the vector holds {HYPER_FIELDS}")
    return HYPER_FIELDS.index(field)


def hyper_vector(values: dict[str, float]) -> np.ndarray:
    """A group's hyper-parameter vector (f32, HYPER_FIELDS' order) from values by field name;
    the fields not given are 0."""
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


def evaluate_sgd_step(p, d, lr, weight_decay):
    """p − lr·(d + weight_decay·p)."""
    return p - lr * (d + weight_decay * p)


def evaluate_momentum_buffer(buf, g, p, momentum, weight_decay):
    """momentum·buf + (g + weight_decay·p)."""
    return momentum * buf + (g + weight_decay * p)


def evaluate_adam_moment(m, g, p, beta, weight_decay, *, order):
    """beta·m + (1−beta)·gᵒʳᵈᵉʳ, with g = grad + weight_decay·p (Adam's L2 form)."""
    g = g + weight_decay * p
    return beta * m + (1.0 - beta) * (g if order == 1 else g * g)


def evaluate_adam_step(p, m, v, t, lr, beta1, beta2, eps, weight_decay):
    """p·(1 − lr·wd) − lr·m̂/(√v̂ + eps): AdamW's decoupled decay (weight_decay=0 for Adam)."""
    bias1 = 1.0 - beta1**t
    bias2 = 1.0 - beta2**t
    p = p * (1.0 - lr * weight_decay)
    return p - (lr / bias1) * m / (np.sqrt(v) / np.sqrt(bias2) + eps)


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
    operands=("buf", "g", "p", "momentum", "weight_decay"),
    doc="momentum·buf + (g + weight_decay·p)",
)
ADAM_MOMENT = Op(
    "adam_moment",
    family=FAMILY,
    infer=infer_update("adam_moment", 3),
    evaluate=evaluate_adam_moment,
    operands=("m", "g", "p", "beta", "weight_decay"),
    attrs=(Attr("order", INT),),
    doc="beta·m + (1 − beta)·gᵒʳᵈᵉʳ, g = grad + weight_decay·p",
)
ADAM_STEP = Op(
    "adam_step",
    family=FAMILY,
    infer=infer_update("adam_step", 4),
    evaluate=evaluate_adam_step,
    operands=("p", "m", "v", "t", "lr", "beta1", "beta2", "eps", "weight_decay"),
    doc="p·(1 − lr·wd) − lr/(1 − beta1ᵗ)·m/(√v/√(1 − beta2ᵗ) + eps)",
)


# ---------------------------------------------------------------------------------------------
# The fused updates: one node per parameter, one result per value it replaces


def summed_gradient(g: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The gradient of a fused update: `g`, or the sum of its parts over the first axis."""
    return g if g.ndim == p.ndim else np.sum(g, axis=0, dtype=g.dtype)


def gradient_fits(g: TensorType, p: TensorType) -> bool:
    """Whether `g` is the gradient of `p` (its shape) or its parts ([P, *p.shape])."""
    return g.shape == p.shape or (g.rank == p.rank + 1 and g.shape[1:] == p.shape and g.shape[0] >= 1)


def evaluate_sgd_update(p, g, lr, weight_decay, momentum=None, buf=None):
    """sgd_step(p, momentum_buffer(buf, g, p)) with momentum, else sgd_step(p, g): optim.SGD's graph."""
    g = summed_gradient(g, p)
    if buf is None:
        return evaluate_sgd_step(p, g, lr, weight_decay)
    new_buf = evaluate_momentum_buffer(buf, g, p, momentum, weight_decay)
    return evaluate_sgd_step(p, new_buf, lr, np.float32(0.0)), new_buf


def evaluate_adam_update(p, g, m, v, t, lr, beta1, beta2, eps, weight_decay, *, decoupled_weight_decay):
    """The two adam_moment updates and adam_step, as optim.Adam/AdamW's single-tensor graph has them."""
    g = summed_gradient(g, p)
    zero = np.float32(0.0)
    l2 = zero if decoupled_weight_decay else weight_decay
    new_m = evaluate_adam_moment(m, g, p, beta1, l2, order=1)
    new_v = evaluate_adam_moment(v, g, p, beta2, l2, order=2)
    decay = weight_decay if decoupled_weight_decay else zero
    return evaluate_adam_step(p, new_m, new_v, t, lr, beta1, beta2, eps, decay), new_m, new_v


def infer_sgd_update(types, attrs):
    require_float(types, "sgd_update")
    if len(types) not in (4, 6):
        raise ShapeError(f"sgd_update: (p, g, lr, weight_decay[, momentum, buf]), got {len(types)} operands")
    if not gradient_fits(types[1], types[0]):
        raise ShapeError(f"sgd_update: the gradient {types[1]} does not match the parameter {types[0]}")
    if len(types) == 6 and types[5].shape != types[0].shape:
        raise ShapeError(f"sgd_update: {types[5]} does not match the parameter {types[0]}")
    for t in types[2:5]:
        if t.shape != ():
            raise ShapeError(f"sgd_update: a hyper-parameter operand must be a scalar, got {t}")
    return types[0] if len(types) == 4 else (types[0], types[0])


def infer_adam_update(types, attrs):
    require_float(types, "adam_update")
    p, g, m, v, t, *hypers = types
    if not gradient_fits(g, p):
        raise ShapeError(f"adam_update: the gradient {g} does not match the parameter {p}")
    for what, other in (("exp_avg", m), ("exp_avg_sq", v)):
        if other.shape != p.shape:
            raise ShapeError(f"adam_update: the {what} {other} does not match the parameter {p}")
    if t.shape != ():
        raise ShapeError(f"adam_update: the step count must be a scalar, got {t}")
    if len(hypers) != 5 or any(h.shape != () for h in hypers):
        raise ShapeError(f"adam_update: needs 5 scalar hyper-parameter operands, got {hypers}")
    return (p, p, p)


SGD_UPDATE = Op(
    "sgd_update",
    family=FAMILY,
    infer=infer_sgd_update,
    evaluate=evaluate_sgd_update,
    operands=("p", "g", "lr", "weight_decay", "momentum?", "buf?"),
    doc="p′ = p − lr·d, d = g + wd·p, or with momentum buf′ = momentum·buf + d and d = buf′: (p′[, buf′])",
)
ADAM_UPDATE = Op(
    "adam_update",
    family=FAMILY,
    infer=infer_adam_update,
    evaluate=evaluate_adam_update,
    operands=("p", "g", "m", "v", "t", "lr", "beta1", "beta2", "eps", "weight_decay"),
    attrs=(Attr("decoupled_weight_decay", BOOL, False),),
    doc="(p′, m′, v′): adam_moment ×2 and adam_step of one parameter",
)

# For each fused op, the operand that each of its results replaces (result index → operand position).
UPDATED_OPERANDS = {"sgd_update": (0, 5), "adam_update": (0, 2, 3)}


def member_arity(op: str, attrs: dict) -> int:
    """The operands of one member of a multi-tensor update of `op` with these attributes."""
    if op == "sgd_update":
        return 6 if attrs["momentum"] else 4
    return 10


def member_results(op: str, attrs: dict) -> int:
    """The results of one member (the values it replaces)."""
    if op == "sgd_update":
        return 2 if attrs["momentum"] else 1
    return 3


def members_of(op: str, attrs: dict, items: list) -> list[list]:
    """`items` (the operands of a multi-tensor node) split into its members' operand lists."""
    arity, count = member_arity(op, attrs), attrs["members"]
    if len(items) != arity * count:
        raise ShapeError(f"multi_{op}: {count} members of {arity} operands need {arity * count}, got {len(items)}")
    return [items[k * arity : (k + 1) * arity] for k in range(count)]


def infer_multi(op: str):
    def infer(types, attrs):
        if attrs["members"] < 1:
            raise ShapeError(f"multi_{op}: needs at least one member, got {attrs['members']}")
        member = {k: v for k, v in attrs.items() if k not in ("members", "momentum")}
        results: list[TensorType] = []
        for operands in members_of(op, attrs, list(types)):
            out = OPS_BY_NAME[op].infer(operands, member)
            results.extend(out if isinstance(out, tuple) else (out,))
        return tuple(results)

    return infer


def evaluate_multi(op: str):
    def evaluate(*arrays, members, **attrs):
        results = []
        attrs.pop("momentum", None)
        arity = {"momentum": len(arrays) // members == 6} if op == "sgd_update" else {}
        for operands in members_of(op, {**attrs, **arity, "members": members}, list(arrays)):
            out = OPS_BY_NAME[op].evaluate(*operands, **attrs)
            results.extend(out if isinstance(out, tuple) else (out,))
        return tuple(results)

    return evaluate


def describe_multi(node) -> str:
    numel = sum(t.numel for t in node.types[:: max(1, len(node.types) // node.attr("members"))])
    return f"{node.attr('members')} parameters, {numel:,} elements"


OPS_BY_NAME = {"sgd_update": SGD_UPDATE, "adam_update": ADAM_UPDATE}
MEMBERS = Attr("members", INT)
MULTI_SGD_UPDATE = Op(
    "multi_sgd_update",
    family=FAMILY,
    infer=infer_multi("sgd_update"),
    evaluate=evaluate_multi("sgd_update"),
    operands=("*members",),
    attrs=(Attr("momentum", BOOL, False), MEMBERS),
    egraph=None,
    describe=describe_multi,
    doc="sgd_update of `members` parameters (momentum: each has a buffer), in one kernel",
)
MULTI_ADAM_UPDATE = Op(
    "multi_adam_update",
    family=FAMILY,
    infer=infer_multi("adam_update"),
    evaluate=evaluate_multi("adam_update"),
    operands=("*members",),
    attrs=(*ADAM_UPDATE.attrs, MEMBERS),
    egraph=None,
    describe=describe_multi,
    doc="adam_update of `members` parameters, in one kernel",
)
MULTI_OF = {"sgd_update": "multi_sgd_update", "adam_update": "multi_adam_update"}


def updated_operands(node) -> tuple[int, ...]:
    """For a fused or multi-tensor update node, the operand position each result replaces."""
    if node.op in UPDATED_OPERANDS:
        return UPDATED_OPERANDS[node.op][: node.results]
    member = next(op for op, multi in MULTI_OF.items() if multi == node.op)
    attrs = node.attr_dict
    arity, per = member_arity(member, attrs), member_results(member, attrs)
    return tuple(k * arity + UPDATED_OPERANDS[member][r] for k in range(attrs["members"]) for r in range(per))
