"""Optimizer updates: elementwise, PyTorch's rules (torch/optim/sgd.py, adam.py, single-tensor form).

Two forms of the same updates. The single-tensor ops, one per formula (`optim.SGD/Adam(fused=False)`):

- sgd_step(p, d): p − lr·(d + weight_decay·p)
- momentum_buffer(buf, g[, p]): momentum·buf + (g + weight_decay·p)
- adam_moment(m, g[, p]): beta·m + (1 − beta)·gᵒʳᵈᵉʳ with g = grad + weight_decay·p (Adam's L2 form)
- adam_step(p, m, v, t): p·(1 − lr·weight_decay) − lr/(1 − beta1ᵗ)·m/(√v/√(1 − beta2ᵗ) + eps)
  (AdamW's decoupled decay; weight_decay 0 for Adam), t the step count (a scalar tensor)

The first operand is the value being replaced, so the runtime can update it in place. The
parameter p is an operand of momentum_buffer and adam_moment exactly when weight decay is added
to the gradient (weight_decay ≠ 0), so that a kernel reads only what it uses.

The fused ops, the whole update of one parameter as one node with a result per value it replaces
(`fused=True`, the default), defined as the composition of the single-tensor ops above:

- sgd_update(p, g[, buf]) → p′ (plain SGD), or (p′, buf′) with momentum (buf given exactly then)
- adam_update(p, g, m, v, t) → (p′, m′, v′): both moments and the step; `decoupled_weight_decay`
  picks AdamW's decay (on p) over Adam's L2 term (on the gradient), as torch.optim.Adam's flag

`UPDATED_OPERANDS[op]` says which operand each result replaces (in place, when nothing else
needs the old value). `multi_sgd_update` and `multi_adam_update` are the same updates of several
parameters with the same hyper-parameters in one node: their operands are the members' operands
one member after another, their results the members' results likewise (`members` of them). The
compiler forms them after the e-graph from the fused ops it can run in place
(`codegen/multi_tensor.py`); they have no e-graph form.
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, FLOAT, INT, Attr, Op, ShapeError, require_float

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


# ---------------------------------------------------------------------------------------------
# The fused updates: one node per parameter, one result per value it replaces


def evaluate_sgd_update(p, g, buf=None, *, lr, momentum, weight_decay):
    """sgd_step(p, momentum_buffer(buf, g, p)) with momentum, else sgd_step(p, g): optim.SGD's graph."""
    if buf is None:
        return evaluate_sgd_step(p, g, lr, weight_decay)
    decayed = p if weight_decay else None
    new_buf = evaluate_momentum_buffer(buf, g, decayed, momentum=momentum, weight_decay=weight_decay)
    return evaluate_sgd_step(p, new_buf, lr, 0.0), new_buf


def evaluate_adam_update(p, g, m, v, t, *, lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay):
    """The two adam_moment updates and adam_step, as optim.Adam/AdamW's single-tensor graph has them."""
    l2 = 0.0 if decoupled_weight_decay else weight_decay
    decayed = p if l2 else None
    new_m = evaluate_adam_moment(m, g, decayed, beta=beta1, order=1, weight_decay=l2)
    new_v = evaluate_adam_moment(v, g, decayed, beta=beta2, order=2, weight_decay=l2)
    decay = weight_decay if decoupled_weight_decay else 0.0
    return evaluate_adam_step(p, new_m, new_v, t, lr, beta1, beta2, eps, decay), new_m, new_v


def infer_sgd_update(types, attrs):
    require_float(types, "sgd_update")
    if (attrs["momentum"] != 0.0) != (len(types) == 3):
        raise ShapeError(
            f"sgd_update: the momentum buffer is an operand exactly when momentum is not 0 "
            f"(momentum {attrs['momentum']}, {len(types)} operands)"
        )
    for t in types[1:]:
        if t.shape != types[0].shape:
            raise ShapeError(f"sgd_update: {t} does not match the parameter {types[0]}")
    return types[0] if len(types) == 2 else (types[0], types[0])


def infer_adam_update(types, attrs):
    require_float(types, "adam_update")
    p, g, m, v, t = types
    for what, other in (("gradient", g), ("exp_avg", m), ("exp_avg_sq", v)):
        if other.shape != p.shape:
            raise ShapeError(f"adam_update: the {what} {other} does not match the parameter {p}")
    if t.shape != ():
        raise ShapeError(f"adam_update: the step count must be a scalar, got {t}")
    return (p, p, p)


LR = Attr("lr", FLOAT)
SGD_UPDATE = Op(
    "sgd_update",
    family=FAMILY,
    infer=infer_sgd_update,
    evaluate=evaluate_sgd_update,
    operands=("p", "g", "buf?"),
    attrs=(LR, Attr("momentum", FLOAT, 0.0), WEIGHT_DECAY),
    doc="p′ = p − lr·d, d = g + wd·p, or with momentum buf′ = momentum·buf + d and d = buf′: (p′[, buf′])",
)
ADAM_HYPERS = (
    LR,
    Attr("beta1", FLOAT),
    Attr("beta2", FLOAT),
    Attr("eps", FLOAT),
    WEIGHT_DECAY,
    Attr("decoupled_weight_decay", BOOL, False),
)
ADAM_UPDATE = Op(
    "adam_update",
    family=FAMILY,
    infer=infer_adam_update,
    evaluate=evaluate_adam_update,
    operands=("p", "g", "m", "v", "t"),
    attrs=ADAM_HYPERS,
    doc="(p′, m′, v′): adam_moment ×2 and adam_step of one parameter",
)

# For each fused op, the operand that each of its results replaces (result index → operand position).
UPDATED_OPERANDS = {"sgd_update": (0, 2), "adam_update": (0, 2, 3)}


def member_arity(op: str, attrs: dict) -> int:
    """The operands of one member of a multi-tensor update of `op` with these attributes."""
    if op == "sgd_update":
        return 3 if attrs["momentum"] != 0.0 else 2
    return 5


def member_results(op: str, attrs: dict) -> int:
    """The results of one member (the values it replaces)."""
    return member_arity(op, attrs) - 1 if op == "sgd_update" else 3


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
        member = {k: v for k, v in attrs.items() if k != "members"}
        results: list[TensorType] = []
        for operands in members_of(op, attrs, list(types)):
            out = OPS_BY_NAME[op].infer(operands, member)
            results.extend(out if isinstance(out, tuple) else (out,))
        return tuple(results)

    return infer


def evaluate_multi(op: str):
    def evaluate(*arrays, members, **attrs):
        results = []
        for operands in members_of(op, {**attrs, "members": members}, list(arrays)):
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
    attrs=(*SGD_UPDATE.attrs, MEMBERS),
    egraph=None,
    describe=describe_multi,
    doc="sgd_update of `members` parameters with the same hyper-parameters, in one kernel",
)
MULTI_ADAM_UPDATE = Op(
    "multi_adam_update",
    family=FAMILY,
    infer=infer_multi("adam_update"),
    evaluate=evaluate_multi("adam_update"),
    operands=("*members",),
    attrs=(*ADAM_HYPERS, MEMBERS),
    egraph=None,
    describe=describe_multi,
    doc="adam_update of `members` parameters with the same hyper-parameters, in one kernel",
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
