"""Optimizers as IR update rules, with exactly PyTorch's update formulas (meganeura.optim re-exports them).

An optimizer does not run anything: `build_updates` appends the update of every parameter to the
training graph (new state leaves for moments, and an `update` per parameter and state), so the
whole step — forward, backward, update — is one graph and one GPU submission.

`fused` is torch.optim's flag of the same name, with the same numbers either way. With
`fused=True` (the default) each parameter's whole update is one node (`sgd_update`,
`adam_update`: ir/ops/optimizer.py) and the compiler updates many parameters in one kernel
(codegen/multi_tensor.py); with `fused=False` each formula is a node of its own (Adam: two
moments and the step, PyTorch's single-tensor form), and each is a kernel per parameter.

The hyper-parameters are run-time values (`param_groups`, `optimizer.lr = …`: the next step
uses them, with no recompilation); `meganeura.optim.lr_scheduler` changes them step by step.
A checkpoint (meganeura/checkpoint.py) saves the groups' hyper-parameters (`hyper_state`) and
the state of the scheduler last made on the optimizer (`optimizer.scheduler`).

On the device each parameter group's hyper-parameters are one f32 vector, the state leaf
`param_groups.<g>.hyper` (`hyper_leaf`), laid out as ir/ops/optimizer.py's HYPER_FIELDS; the
update nodes read each value as an `element` of it, so an update kernel binds one buffer for
all of its group's hyper-parameters.

>>> from meganeura import optim
>>> optim.AdamW(lr=1e-3).weight_decay
0.01
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from meganeura.ir.autodiff import GradBuilder
from meganeura.ir.graph import TensorType
from meganeura.ir.ops.optimizer import HYPER_FIELDS, hyper_offset, hyper_vector


@dataclass(frozen=True)
class ParamGrad:
    """One trainable parameter in the graph: its name, its `param` leaf, its gradient node and the
    Parameter object (which parameter group it belongs to is decided by identity)."""

    name: str
    node: int
    grad: int
    parameter: Any = None


def check_hyper(name: str, value: float, low: float = 0.0, high: float | None = None) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not np.isfinite(value) or value < low or (high is not None and value >= high):
        span = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {span}, got {value}")
    return value


def check_flag(name: str, value: bool) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def group_property(key: str):
    """optimizer.<key>: the first group's value; assigning sets it in every group (the next step
    uses it, with no recompilation)."""

    def get(self):
        return self.param_groups[0][key]

    def set_(self, value):
        for group in self.param_groups:
            group[key] = value
        self.check_groups()

    return property(get, set_, doc=f"param_groups[0][{key!r}]; assigning sets every group's {key}")


class Optimizer:
    """Base class: parameter groups as torch.optim keeps them, `param_groups` (a list of dicts with
    "params" and the hyper-parameters), and the update nodes subclasses append.

    `params` is what torch.optim takes: an iterable of Parameters, or of dicts each with "params"
    and hyper-parameters of its own (the others default to the constructor's), or None: one group
    with all of the model's parameters (those compile() finds). The object stays live after
    compile(): each group's hyper-parameters are one `state` leaf of the step, a vector
    (`param_groups.<g>.hyper`, module docstring) that the Program writes before a step when its
    values changed.
    """

    # The run-time hyper-parameters: their fields in the group's vector (HYPER_FIELDS), and the
    # group key and index each reads.
    HYPERS: dict[str, tuple[str, int | None]] = {}
    # Keys torch's schedulers add to a group beside the hyper-parameters (read by them only).
    SCHEDULER_KEYS = frozenset({"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"})

    def __init__(self, params, defaults: dict[str, Any]) -> None:
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = [{**self.defaults, **group} for group in parameter_groups(params)]
        self.structure: list[dict[str, Any]] | None = None  # per group: what the compiled graph fixed
        self.scheduler = None  # the last lr_scheduler made on this optimizer (a checkpoint saves its state)
        self.check_groups()

    lr = group_property("lr")
    weight_decay = group_property("weight_decay")

    def check_groups(self) -> None:
        """Every group's hyper-parameters in range (a ValueError/TypeError naming the group)."""
        for index, group in enumerate(self.param_groups):
            unknown = set(group) - set(self.defaults) - {"params"} - self.SCHEDULER_KEYS
            if unknown:
                raise KeyError(f"param_groups[{index}]: unknown hyper-parameters {sorted(unknown)}")
            self.check_group(index, group)

    def check_group(self, index: int, group: dict[str, Any]) -> None:
        raise NotImplementedError

    def hyper_state(self) -> list[dict[str, Any]]:
        """Every group's hyper-parameters (and scheduler keys) without its parameters, as JSON
        values (tuples as lists): what a checkpoint saves."""
        return [
            {key: list(value) if isinstance(value, tuple) else value for key, value in group.items() if key != "params"}
            for group in self.param_groups
        ]

    def hyper_problems(self, groups: Any) -> list[str]:
        """Every reason `groups` (a `hyper_state`) cannot replace this optimizer's; none: it fits."""
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            return [f"hyper-parameters: expected a list of parameter groups, got {type(groups).__name__}"]
        if len(groups) != len(self.param_groups):
            return [f"hyper-parameters: {len(groups)} parameter groups, this optimizer has {len(self.param_groups)}"]
        trial = copy.copy(self)
        trial.param_groups = [
            {**group, **restored(saved)} for group, saved in zip(self.param_groups, groups, strict=True)
        ]
        try:
            trial.hyper_values() if self.structure is not None else trial.check_groups()
        except (KeyError, TypeError, ValueError) as error:
            return [f"hyper-parameters: {error}"]
        return []

    def load_hyper_state(self, groups: list[dict[str, Any]]) -> None:
        """Replace every group's hyper-parameters by a `hyper_state` (checked first: a ValueError
        with every reason, and nothing changes); the next step uses them."""
        problems = self.hyper_problems(groups)
        if problems:
            raise ValueError("; ".join(problems))
        for group, saved in zip(self.param_groups, groups, strict=True):
            group.update(restored(saved))

    def hyper_key(self) -> str:
        """Every group's hyper-parameters as one value that changes when any of them does (their
        repr: exact for floats, and a list changed in place changes it too). A training step
        compares it with the last step's, and checks and builds the vectors only on a change."""
        return repr([[(key, value) for key, value in group.items() if key != "params"] for group in self.param_groups])

    def hyper_values(self) -> dict[str, np.ndarray]:
        """The value of every hyper-parameter leaf of the compiled step (a group's vector), by leaf name."""
        if self.structure is None:
            return {}
        self.check_groups()
        if len(self.param_groups) != len(self.structure):
            raise ValueError(
                f"the step was compiled with {len(self.structure)} parameter groups, the optimizer now has "
                f"{len(self.param_groups)}: adding groups after compile() needs a new compile()"
            )
        values = {}
        for index, group in enumerate(self.param_groups):
            self.check_structure(index, group)
            values[hyper_leaf(index)] = hyper_vector(self.hyper_fields(group))
        return values

    def hyper_fields(self, group: dict[str, Any]) -> dict[str, Any]:
        """A group's run-time hyper-parameters by their field in its vector (`HYPERS`)."""
        return {name: group[key] if item is None else group[key][item] for name, (key, item) in self.HYPERS.items()}

    def check_structure(self, index: int, group: dict[str, Any]) -> None:
        """A change that the compiled graph cannot follow (SGD's momentum from 0) is an error."""

    def build_updates(self, builder: GradBuilder, params: list[ParamGrad]) -> dict[str, np.ndarray]:
        """Append the update nodes; return the initial value of every state leaf they created
        (the hyper-parameter leaves included)."""
        groups = self.resolve_groups(params)
        self.structure = [self.group_structure(group) for group in self.param_groups]
        hypers = [self.hyper_operands(builder, index) for index in range(len(self.param_groups))]
        return self.hyper_values() | self.build_group_updates(builder, groups, hypers)

    def hyper_operands(self, builder: GradBuilder, index: int) -> dict[str, int]:
        """Group `index`'s hyper-parameter operands by field: elements of the group's vector leaf."""
        vector = self.state_leaf(builder, hyper_leaf(index), (len(HYPER_FIELDS),))
        return {name: builder.emit("element", [vector], index=hyper_offset(name)) for name in self.HYPERS}

    def group_structure(self, group: dict[str, Any]) -> dict[str, Any]:
        return {}

    def build_group_updates(self, builder, groups, hypers) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def resolve_groups(self, params: list[ParamGrad]) -> list[list[ParamGrad]]:
        """The trainable parameters of each group, in graph order; a parameter in two groups, or
        not in the model, is an error (as torch.optim's); one in no group is not updated."""
        if len(self.param_groups) == 1 and self.param_groups[0]["params"] is None:
            return [list(params)]
        by_id = {id(p.parameter): p for p in params}
        seen: dict[int, int] = {}
        groups = []
        for index, group in enumerate(self.param_groups):
            if group["params"] is None:
                raise ValueError(f"param_groups[{index}] has no 'params' (only a single group may leave them out)")
            members = []
            for parameter in group["params"]:
                key = id(parameter)
                if key in seen:
                    raise ValueError(
                        f"a parameter is in param_groups {seen[key]} and {index}: each may be in one group"
                    )
                seen[key] = index
                if key in by_id:
                    members.append(by_id[key])
                elif getattr(parameter, "requires_grad", True) is False:
                    continue  # frozen: no gradient, so no update (torch.optim skips it the same way)
                elif not any(parameter is p.parameter for p in params):
                    known = getattr(parameter, "shape", None)
                    if not hasattr(parameter, "shape"):
                        raise TypeError(f"param_groups[{index}]: {parameter!r} is not a Parameter")
                    raise ValueError(
                        f"param_groups[{index}]: a parameter of shape {list(known)} is not a trainable "
                        "parameter of the compiled model (no gradient reaches it, or it is another model's)"
                    )
            groups.append(members)
        return groups

    @staticmethod
    def state_leaf(builder: GradBuilder, name: str, shape: tuple[int, ...]) -> int:
        attrs = {"name": name, "shape": shape, "dtype": "f32"}
        return builder.graph.add("state", (), TensorType(shape, "f32"), attrs, builder.sources)


HYPER_PREFIX = "param_groups."  # every hyper-parameter leaf's name starts so (`hyper_leaf`)


def hyper_leaf(index: int) -> str:
    """The name of parameter group `index`'s hyper-parameter vector, a state leaf of the step."""
    return f"{HYPER_PREFIX}{index}.hyper"


def restored(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved group's values as the optimizer keeps them (JSON lists back to tuples: betas)."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in saved.items() if key != "params"}


def parameter_groups(params) -> list[dict[str, Any]]:
    """torch.optim's `params` argument as a list of group dicts (None: one group of all parameters)."""
    if params is None:
        return [{"params": None}]
    if isinstance(params, (int, float, np.number)) and not isinstance(params, bool):
        raise TypeError(
            f"the first argument is the parameters, as in torch.optim (got {params!r}): pass lr={params!r}, "
            "e.g. optim.SGD(model.parameters(), lr=0.1) or optim.SGD(lr=0.1)"
        )
    if hasattr(params, "shape"):
        raise TypeError("params must be an iterable of Parameters or of dicts, not one Parameter")
    items = list(params)
    if not items:
        raise ValueError("the optimizer got an empty parameter list")
    if all(isinstance(item, dict) for item in items):
        groups = []
        for index, item in enumerate(items):
            if "params" not in item:
                raise KeyError(f"parameter group {index} has no 'params'")
            members = item["params"]
            members = [members] if hasattr(members, "shape") else list(members)
            groups.append({**item, "params": members})
        return groups
    if any(isinstance(item, dict) for item in items):
        raise TypeError("params must be all Parameters or all dicts (parameter groups), not a mix")
    return [{"params": items}]


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum and L2 weight decay (torch.optim.SGD)."""

    HYPERS = {"lr": ("lr", None), "momentum": ("momentum", None), "weight_decay": ("weight_decay", None)}

    def __init__(
        self, params=None, lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0, fused: bool = True
    ) -> None:
        self.fused = check_flag("fused", fused)
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    momentum = group_property("momentum")

    def check_group(self, index, group):
        for key in ("lr", "momentum", "weight_decay"):
            check_hyper(f"param_groups[{index}] {key}", group[key])

    def group_structure(self, group):
        return {"momentum_buffer": group["momentum"] != 0.0}

    def check_structure(self, index, group):
        if group["momentum"] != 0.0 and not self.structure[index]["momentum_buffer"]:
            raise ValueError(
                f"param_groups[{index}]: momentum was 0 at compile(), so the step has no momentum buffer; "
                "compile with a momentum other than 0 to change it at run time"
            )

    def build_group_updates(self, builder, groups, hypers):
        initial: dict[str, np.ndarray] = {}
        zero = builder.const(0.0)
        for params, h, structure in zip(groups, hypers, self.structure, strict=True):
            for p in params:
                initial |= self.build_parameter_update(builder, p, h, structure["momentum_buffer"], zero)
        return initial

    def build_parameter_update(self, builder, p: ParamGrad, h: dict[str, int], momentum: bool, zero: int):
        """The update of one parameter: fused (sgd_update) or one node per formula."""
        lr, wd = h["lr"], h["weight_decay"]
        if not momentum:
            op = "sgd_update" if self.fused else "sgd_step"
            builder.graph.updates[p.name] = builder.emit(op, [p.node, p.grad, lr, wd])
            return {}
        buf_name = f"{p.name}.momentum_buffer"
        buf = self.state_leaf(builder, buf_name, builder.shape(p.node))
        if self.fused:
            update = builder.emit("sgd_update", [p.node, p.grad, lr, wd, h["momentum"], buf])
            builder.graph.updates[p.name] = builder.result(update, 0)
            builder.graph.updates[buf_name] = builder.result(update, 1)
        else:
            direction = builder.emit("momentum_buffer", [buf, p.grad, p.node, h["momentum"], wd])
            builder.graph.updates[buf_name] = direction
            builder.graph.updates[p.name] = builder.emit("sgd_step", [p.node, direction, lr, zero])
        return {buf_name: np.zeros(builder.shape(p.node), np.float32)}


class Adam(Optimizer):
    """Adam with bias correction and L2 weight decay added to the gradient (torch.optim.Adam)."""

    decoupled = False
    HYPERS = {
        "lr": ("lr", None),
        "beta1": ("betas", 0),
        "beta2": ("betas", 1),
        "eps": ("eps", None),
        "weight_decay": ("weight_decay", None),
    }

    def __init__(
        self,
        params=None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    betas = group_property("betas")
    eps = group_property("eps")

    def check_group(self, index, group):
        for key in ("lr", "eps", "weight_decay"):
            check_hyper(f"param_groups[{index}] {key}", group[key])
        betas = group["betas"]
        if len(tuple(betas)) != 2:
            raise ValueError(f"param_groups[{index}]['betas'] must be two numbers, got {betas!r}")
        for k in (0, 1):
            check_hyper(f"param_groups[{index}] betas[{k}]", betas[k], 0.0, 1.0)

    def build_group_updates(self, builder, groups, hypers):
        step = self.state_leaf(builder, "step", ())
        new_step = builder.emit("add", [step, builder.const(1.0)])
        builder.graph.updates["step"] = new_step
        initial = {"step": np.zeros((), np.float32)}
        zero = builder.const(0.0)
        for params, h in zip(groups, hypers, strict=True):
            for p in params:
                initial |= self.build_parameter_update(builder, p, h, new_step, zero)
        return initial

    def build_parameter_update(self, builder, p: ParamGrad, h: dict[str, int], new_step: int, zero: int):
        """(p′, exp_avg′, exp_avg_sq′) of one parameter: one adam_update, or (fused=False) two
        adam_moment and an adam_step, PyTorch's single-tensor form."""
        names = (p.name, f"{p.name}.exp_avg", f"{p.name}.exp_avg_sq")
        moments = [self.state_leaf(builder, name, builder.shape(p.node)) for name in names[1:]]
        wd = h["weight_decay"]
        hyper = [h["lr"], h["beta1"], h["beta2"], h["eps"], wd]
        if self.fused:
            update = builder.emit(
                "adam_update", [p.node, p.grad, *moments, new_step, *hyper], decoupled_weight_decay=self.decoupled
            )
            for index, name in enumerate(names):
                builder.graph.updates[name] = builder.result(update, index)
        else:
            # Adam adds wd·p to the gradient; AdamW reads neither (constants 0, inlined).
            decayed, l2 = (zero, zero) if self.decoupled else (p.node, wd)
            new = [
                builder.emit("adam_moment", [leaf, p.grad, decayed, beta, l2], order=order)
                for leaf, beta, order in zip(moments, (h["beta1"], h["beta2"]), (1, 2), strict=True)
            ]
            builder.graph.updates[names[1]], builder.graph.updates[names[2]] = new
            decay = wd if self.decoupled else zero
            builder.graph.updates[p.name] = builder.emit(
                "adam_step", [p.node, *new, new_step, h["lr"], h["beta1"], h["beta2"], h["eps"], decay]
            )
        return {name: np.zeros(builder.shape(p.node), np.float32) for name in names[1:]}


class AdamW(Adam):
    """Adam with decoupled weight decay, p ← p·(1 − lr·wd) before the step (torch.optim.AdamW)."""

    decoupled = True

    def __init__(
        self, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, fused: bool = True
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, fused)
