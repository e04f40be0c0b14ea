"""Optimizers as IR update rules, with exactly PyTorch's update formulas (meganeura.optim re-exports
them): SGD (momentum, dampening, Nesterov), Adam and AdamW (amsgrad), RMSprop (centered, momentum),
Adagrad (lr_decay), Adamax, NAdam and RAdam (decoupled_weight_decay), Adadelta.

An optimizer does not run anything: `build_updates` appends the update of every parameter to the
training graph (new state leaves for moments, and an `update` per parameter and state), so the
whole step — forward, backward, update — is one graph and one GPU submission.

`fused` is torch.optim's flag of the same name, with the same numbers either way. With
`fused=True` (the default) each parameter's whole update is one node (`sgd_update`,
`adam_update`, `rmsprop_update`, …: ir/ops/optimizer.py) and the compiler updates
many parameters in one kernel (passes/multi_tensor.py); with `fused=False` each formula is a node
of its own (Adam: two moments and the step, PyTorch's single-tensor form), and each is a kernel
per parameter. Either way the state is updated in place.

The hyper-parameters are run-time values (`param_groups`, `optimizer.lr = …`: the next step
uses them, with no recompilation); `meganeura.optim.lr_scheduler` changes them step by step.
What fixes the graph's structure is fixed at compile() (a momentum buffer, Nesterov, AMSGrad,
RMSprop's centering: changing it later is an error that says so). A checkpoint
(meganeura/checkpoint.py) saves the groups' hyper-parameters (`hyper_state`) and the state of
the scheduler last made on the optimizer (`optimizer.scheduler`).

On the device each parameter group's hyper-parameters are one f32 vector, the state leaf
`param_groups.<g>.hyper` (`hyper_leaf`), laid out as ir/ops/optimizer.py's HYPER_FIELDS; the
update nodes read each value as an `element` of it, so an update kernel binds one buffer for
all of its group's hyper-parameters. The vector also holds what torch computes in Python double
from the hyper-parameters and the step count t before its tensor ops (Adam's lr/(1 − β₁ᵗ) and
√(1 − β₂ᵗ), the 1 − β of its lerp): `hyper_fields(group, t)` computes them in double on the host,
and the Program writes the vectors before each step whose values differ from the last
(compiler.py `Program.write_hypers`, with t = the updates applied so far + 1), so the device
never computes a power or 1 − β in f32 and every adapter gets torch's scalars.

NAdam's `mu_product` (Π μₖ over the updates so far), which torch keeps as a float32 tensor on
the CPU beside `step`, is kept by the host too: it is a function of the step count and the
hyper-parameters of each update, so the host replays it — in float32, rounded after each product
as torch's tensor is — and records it as each update is applied (`applied`, from
Program.step_done), so that hyper-parameters changed between steps (a scheduler cycling β₁)
enter it as they do torch's. `optimizer_state_dict()` and checkpoints carry it under torch's name
(`host_state`), and loading one restores it (`load_host_state`).

>>> from meganeura import optim
>>> optim.AdamW(lr=1e-3).weight_decay
0.01
"""

from __future__ import annotations

import copy
import math
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


def check_hyper(name: str, value: float, low: float = 0.0, high: float | None = None, closed: bool = False) -> float:
    """`value` as a float in [low, high) (`closed`: [low, high]), or a TypeError/ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    beyond = high is not None and (value > high if closed else value >= high)
    if not np.isfinite(value) or value < low or beyond:
        span = f"[{low}, {high}{']' if closed else ')'}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be {span}, got {value}")
    return value


def check_betas(index: int, group: dict[str, Any]) -> None:
    """A group's betas: two numbers in [0, 1) (torch's check)."""
    betas = group["betas"]
    if len(tuple(betas)) != 2:
        raise ValueError(f"param_groups[{index}]['betas'] must be two numbers, got {betas!r}")
    for k in (0, 1):
        check_hyper(f"param_groups[{index}] betas[{k}]", betas[k], 0.0, 1.0)


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

    # The fields of the group's vector (HYPER_FIELDS) that the update nodes read.
    FIELDS: tuple[str, ...] = ()
    # The group keys that fix the graph's structure at compile() (`group_structure`).
    STRUCTURE: tuple[str, ...] = ()
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

    def hyper_values(self, step: int = 1, checked: bool = False) -> dict[str, np.ndarray]:
        """The value of every hyper-parameter leaf of the compiled step (a group's vector) for the
        step that applies update number `step` (1 for the first: torch's state["step"] after its
        increment), by leaf name. `checked`: the groups are as they were when last checked (a
        step whose hyper_key did not change), so only the values are computed."""
        if self.structure is None:
            return {}
        if not checked:
            self.check_groups()
            if len(self.param_groups) != len(self.structure):
                raise ValueError(
                    f"the step was compiled with {len(self.structure)} parameter groups, the optimizer now has "
                    f"{len(self.param_groups)}: adding groups after compile() needs a new compile()"
                )
            for index, group in enumerate(self.param_groups):
                self.check_structure(index, group)
        return {
            hyper_leaf(index): hyper_vector(self.hyper_fields(group, step))
            for index, group in enumerate(self.param_groups)
        }

    def hyper_fields(self, group: dict[str, Any], step: int) -> dict[str, float]:
        """A group's values by their field in its vector, computed in double as torch computes
        them for update number `step` (each is rounded to f32 once, in `hyper_vector`)."""
        raise NotImplementedError

    def step_key(self, step: int) -> Any:
        """What of the step count the vectors depend on: a step whose key equals the last one's
        needs no new vectors (the default: every step does)."""
        return step

    def steps_in(self, state: dict[str, Any]) -> int:
        """The updates an optimizer state (`optimizer_state_dict()`) has seen: its `step`, torch's
        state["step"] (0 without one)."""
        if "step" not in state:
            return 0
        return int(np.asarray(state["step"]).reshape(()))

    def applied(self, step: int) -> None:
        """Update number `step` was applied on the device, with the values `hyper_values(step)` gave
        (Program.step_done): what the host keeps across updates follows (NAdam's mu_product)."""

    def host_state(self, step: int) -> dict[str, np.ndarray]:
        """The state torch keeps that the host holds instead of the device, by name, after update
        `step` (none but NAdam's `<param>.mu_product`)."""
        return {}

    def host_state_problems(self, state: dict[str, Any]) -> list[str]:
        """Every reason the host's part of an optimizer state (names and shapes checked) cannot be loaded."""
        return []

    def load_host_state(self, state: dict[str, Any], step: int) -> None:
        """Take the host's part of an optimizer state that has seen `step` updates."""

    def group_index(self, group: dict[str, Any]) -> int:
        """The position of `group` (by identity) in param_groups."""
        return next(index for index, g in enumerate(self.param_groups) if g is group)

    def check_structure(self, index: int, group: dict[str, Any]) -> None:
        """A change that the compiled graph cannot follow (AMSGrad switched on or off) is an error."""
        compiled = self.structure[index]
        now = self.group_structure(group)
        for key in self.STRUCTURE:
            if now[key] != compiled[key]:
                raise ValueError(
                    f"param_groups[{index}]: {key} was {compiled[key]} at compile(), which fixed the step's graph; "
                    f"compile again with {key}={now[key]}"
                )

    def build_updates(self, builder: GradBuilder, params: list[ParamGrad]) -> dict[str, np.ndarray]:
        """Append the update nodes; return the initial value of every state leaf they created
        (the hyper-parameter leaves included)."""
        groups = self.resolve_groups(params)
        self.structure = [self.group_structure(group) for group in self.param_groups]
        hypers = [self.hyper_operands(builder, index) for index in range(len(self.param_groups))]
        return self.hyper_values(1) | self.build_group_updates(builder, groups, hypers)

    def hyper_operands(self, builder: GradBuilder, index: int) -> dict[str, int]:
        """Group `index`'s hyper-parameter operands by field: elements of the group's vector leaf."""
        vector = self.state_leaf(builder, hyper_leaf(index), (len(HYPER_FIELDS),))
        return {name: builder.emit("element", [vector], index=hyper_offset(name)) for name in self.FIELDS}

    def group_structure(self, group: dict[str, Any]) -> dict[str, Any]:
        """What of a group fixes the graph at compile() (`STRUCTURE`), by key."""
        return {key: bool(group[key]) for key in self.STRUCTURE}

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

    def step_counter(self, builder: GradBuilder) -> dict[str, np.ndarray]:
        """The state `step` (torch's state["step"], one for all parameters), counted on the device
        with the updates (so a skipped step does not count); the kernels read the values derived
        from it in the groups' vectors instead. Its initial value."""
        step = self.state_leaf(builder, "step", ())
        builder.graph.updates["step"] = builder.emit("add", [step, builder.const(1.0)])
        return {"step": np.zeros((), np.float32)}

    def state_leaves(self, builder: GradBuilder, p: ParamGrad, names: list[str]) -> list[int]:
        """A state leaf of the parameter's shape for each of `names` (`<param>.<name>`)."""
        return [self.state_leaf(builder, f"{p.name}.{name}", builder.shape(p.node)) for name in names]

    @staticmethod
    def record(builder: GradBuilder, update: int, names: list[str]) -> None:
        """graph.updates[names[k]] = result k of the fused update node `update`."""
        for index, name in enumerate(names):
            builder.graph.updates[name] = builder.result(update, index) if len(names) > 1 else update


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


def check_momentum_buffer(index: int, group: dict[str, Any], compiled: dict[str, Any]) -> None:
    """A momentum other than 0 needs the buffer that compile() made only for one other than 0."""
    if group["momentum"] != 0.0 and not compiled["momentum_buffer"]:
        raise ValueError(
            f"param_groups[{index}]: momentum was 0 at compile(), so the step has no momentum buffer; "
            "compile with a momentum other than 0 to change it at run time"
        )


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum, dampening, Nesterov momentum and L2
    weight decay (torch.optim.SGD). A momentum buffer exists where a group's momentum is not 0 at
    compile(); set to 0 later, the step is plain SGD's (the buffer then holds the last direction,
    where torch's keeps its old value)."""

    FIELDS = ("lr", "weight_decay", "momentum", "dampening_factor")
    STRUCTURE = ("nesterov",)

    def __init__(
        self,
        params=None,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        if check_flag("nesterov", nesterov) and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = {"lr": lr, "momentum": momentum, "dampening": dampening, "weight_decay": weight_decay}
        super().__init__(params, {**defaults, "nesterov": nesterov})

    momentum = group_property("momentum")

    def check_group(self, index, group):
        for key in ("lr", "momentum", "weight_decay"):
            check_hyper(f"param_groups[{index}] {key}", group[key])
        check_hyper(f"param_groups[{index}] dampening", group["dampening"], -math.inf)
        check_flag(f"param_groups[{index}] nesterov", group["nesterov"])

    def hyper_fields(self, group, step):
        # torch starts the buffer as the gradient itself (buf = d) and then adds (1 − dampening)·d:
        # with the buffer's initial 0, a factor of 1 on the first step does the former.
        momentum = group["momentum"]
        first = step == 1 or momentum == 0
        return {
            "lr": group["lr"],
            "weight_decay": group["weight_decay"],
            "momentum": momentum,
            "dampening_factor": 1.0 if first else 1 - group["dampening"],
        }

    def step_key(self, step):
        return step == 1

    def steps_in(self, state):
        # torch's SGD keeps no step count, only whether a buffer exists: one that is not all 0 has
        # been started (a state from a program that never stepped has zero buffers).
        buffers = [np.asarray(v) for k, v in state.items() if k.endswith(".momentum_buffer")]
        return int(any(np.any(b != 0) for b in buffers))

    def group_structure(self, group):
        buffer = group["momentum"] != 0.0
        return {"momentum_buffer": buffer, "nesterov": buffer and bool(group["nesterov"])}

    def check_structure(self, index, group):
        check_momentum_buffer(index, group, self.structure[index])
        if self.structure[index]["momentum_buffer"]:  # (without a buffer, nesterov changes nothing)
            super().check_structure(index, {**group, "momentum": 1.0})

    def build_group_updates(self, builder, groups, hypers):
        initial: dict[str, np.ndarray] = {}
        zero = builder.const(0.0)
        for params, h, structure in zip(groups, hypers, self.structure, strict=True):
            for p in params:
                initial |= self.build_parameter_update(builder, p, h, structure, zero)
        return initial

    def build_parameter_update(self, builder, p: ParamGrad, h: dict[str, int], structure: dict, zero: int):
        """The update of one parameter: fused (sgd_update) or one node per formula."""
        lr, wd = h["lr"], h["weight_decay"]
        if not structure["momentum_buffer"]:
            op = "sgd_update" if self.fused else "sgd_step"
            builder.graph.updates[p.name] = builder.emit(op, [p.node, p.grad, lr, wd])
            return {}
        nesterov = structure["nesterov"]
        (buf,) = self.state_leaves(builder, p, ["momentum_buffer"])
        names = [p.name, f"{p.name}.momentum_buffer"]
        if self.fused:
            operands = [p.node, p.grad, lr, wd, h["momentum"], h["dampening_factor"], buf]
            self.record(builder, builder.emit("sgd_update", operands, nesterov=nesterov), names)
        else:
            # Nesterov's g′ = g + wd·p, emitted before the buffer's update, whose kernel computes
            # the same: extraction then may read it there (a node after it could not be read).
            decayed = builder.emit("add", [p.grad, builder.emit("mul", [wd, p.node])]) if nesterov else None
            operands = [buf, p.grad, p.node, h["momentum"], h["dampening_factor"], wd]
            direction = builder.graph.updates[names[1]] = builder.emit("momentum_buffer", operands)
            if nesterov:  # g′ + momentum·buf′ (torch's grad.add(buf, alpha=momentum))
                direction = builder.emit("add", [decayed, builder.emit("mul", [h["momentum"], direction])])
            builder.graph.updates[p.name] = builder.emit("sgd_step", [p.node, direction, lr, zero])
        return {names[1]: np.zeros(builder.shape(p.node), np.float32)}


class Adam(Optimizer):
    """Adam with bias correction, L2 weight decay added to the gradient and optional AMSGrad
    (torch.optim.Adam)."""

    decoupled = False
    FIELDS = (
        "one_minus_beta1", "beta2", "one_minus_beta2", "step_size", "bias_correction2_sqrt", "eps", "weight_decay",
        "decay",
    )  # fmt: skip
    STRUCTURE = ("amsgrad",)

    def __init__(
        self,
        params=None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad}
        super().__init__(params, defaults)

    betas = group_property("betas")
    eps = group_property("eps")

    def check_group(self, index, group):
        for key in ("lr", "eps", "weight_decay"):
            check_hyper(f"param_groups[{index}] {key}", group[key])
        check_betas(index, group)
        check_flag(f"param_groups[{index}] amsgrad", group["amsgrad"])

    def hyper_fields(self, group, step):
        # torch's _single_tensor_adam, in Python double: bias_correction1 = 1 − β₁ᵗ,
        # step_size = lr / bias_correction1, bias_correction2_sqrt = (1 − β₂ᵗ)^0.5; lerp's weight
        # 1 − β₁, addcmul's value 1 − β₂; AdamW's param.mul_(1 − lr·wd).
        lr, weight_decay = group["lr"], group["weight_decay"]
        beta1, beta2 = (float(b) for b in group["betas"])
        bias_correction1 = 1 - beta1**step
        bias_correction2 = 1 - beta2**step
        return {
            "lr": lr,
            "weight_decay": weight_decay,
            "beta1": beta1,
            "beta2": beta2,
            "one_minus_beta1": 1 - beta1,
            "one_minus_beta2": 1 - beta2,
            "eps": group["eps"],
            "step_size": lr / bias_correction1,
            "bias_correction2_sqrt": bias_correction2**0.5,
            "decay": 1 - lr * weight_decay,
        }

    def build_group_updates(self, builder, groups, hypers):
        initial = self.step_counter(builder)
        constants = {"zero": builder.const(0.0), "one": builder.const(1.0)}
        for params, h, structure in zip(groups, hypers, self.structure, strict=True):
            for p in params:
                initial |= self.build_parameter_update(builder, p, h, structure["amsgrad"], constants)
        return initial

    def build_parameter_update(self, builder, p: ParamGrad, h: dict[str, int], amsgrad: bool, constants: dict):
        """(p′, exp_avg′, exp_avg_sq′[, max_exp_avg_sq′]) of one parameter: one adam_update, or
        (fused=False) two adam_moment, AMSGrad's maximum and an adam_step, PyTorch's single-tensor
        form."""
        zero, one = constants["zero"], constants["one"]
        states = ["exp_avg", "exp_avg_sq", *(["max_exp_avg_sq"] if amsgrad else [])]
        leaves = self.state_leaves(builder, p, states)
        names = [p.name, *(f"{p.name}.{state}" for state in states)]
        step = [h["step_size"], h["bias_correction2_sqrt"], h["eps"]]
        if self.fused:  # (adam_update reads weight_decay for Adam, decay for AdamW: its attribute says)
            m, v, *vmax = leaves
            operands = [p.node, p.grad, m, v, *(vmax or [zero]), h["one_minus_beta1"], h["beta2"]]
            operands += [h["one_minus_beta2"], *step, h["weight_decay"], h["decay"]]
            update = builder.emit("adam_update", operands, decoupled_weight_decay=self.decoupled, amsgrad=amsgrad)
            self.record(builder, update, names)
        else:
            # Adam adds wd·p to the gradient and AdamW multiplies p by 1 − lr·wd: the other term is a
            # constant (0 and 1), which kernels inline.
            l2 = zero if self.decoupled else h["weight_decay"]
            decay = h["decay"] if self.decoupled else one
            decayed = zero if self.decoupled else p.node
            m = builder.emit("adam_moment", [leaves[0], p.grad, decayed, zero, h["one_minus_beta1"], l2], order=1)
            v = builder.emit("adam_moment", [leaves[1], p.grad, decayed, h["beta2"], h["one_minus_beta2"], l2], order=2)
            builder.graph.updates[names[1]], builder.graph.updates[names[2]] = m, v
            if amsgrad:  # torch.maximum(max_exp_avg_sq, exp_avg_sq): NaN in v wins
                vmax = leaves[2]
                v = builder.emit("where", [builder.emit("less", [v, vmax]), vmax, v])
                builder.graph.updates[names[3]] = v
            builder.graph.updates[p.name] = builder.emit("adam_step", [p.node, m, v, *step, decay])
        return {name: np.zeros(builder.shape(p.node), np.float32) for name in names[1:]}


class AdamW(Adam):
    """Adam with decoupled weight decay, p ← p·(1 − lr·wd) before the step (torch.optim.AdamW)."""

    decoupled = True

    def __init__(
        self, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *, fused=True
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, fused=fused)


class RMSprop(Optimizer):
    """RMSprop with optional momentum, centering and L2 weight decay (torch.optim.RMSprop). A
    momentum buffer exists where a group's momentum is not 0 at compile(); set to 0 later, the
    step still goes through the buffer (p − lr·(g′/avg), where torch computes p − (lr·g′)/avg:
    the same to an ulp). torch's RMSprop has no `fused` flag; here it picks the fused or
    single-tensor form, as for the others."""

    FIELDS = ("lr", "weight_decay", "momentum", "alpha", "one_minus_alpha", "eps")
    STRUCTURE = ("centered",)

    def __init__(
        self,
        params=None,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        *,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        defaults = {"lr": lr, "alpha": alpha, "eps": eps, "weight_decay": weight_decay, "momentum": momentum}
        super().__init__(params, {**defaults, "centered": centered})

    momentum = group_property("momentum")
    eps = group_property("eps")

    def check_group(self, index, group):
        for key in ("lr", "alpha", "eps", "weight_decay", "momentum"):
            check_hyper(f"param_groups[{index}] {key}", group[key])
        check_flag(f"param_groups[{index}] centered", group["centered"])

    def hyper_fields(self, group, step):
        return {
            "lr": group["lr"],
            "weight_decay": group["weight_decay"],
            "momentum": group["momentum"],
            "alpha": group["alpha"],
            "one_minus_alpha": 1 - group["alpha"],  # addcmul's value and lerp's weight
            "eps": group["eps"],
        }

    def step_key(self, step):
        return None  # nothing depends on the step count

    def group_structure(self, group):
        return {"centered": bool(group["centered"]), "momentum_buffer": group["momentum"] != 0.0}

    def check_structure(self, index, group):
        check_momentum_buffer(index, group, self.structure[index])
        super().check_structure(index, group)

    def build_group_updates(self, builder, groups, hypers):
        initial = self.step_counter(builder)
        zero = builder.const(0.0)
        for params, h, structure in zip(groups, hypers, self.structure, strict=True):
            for p in params:
                initial |= self.build_parameter_update(builder, p, h, structure, zero)
        return initial

    def build_parameter_update(self, builder, p: ParamGrad, h: dict[str, int], structure: dict, zero: int):
        """(p′, square_avg′[, grad_avg′][, momentum_buffer′]) of one parameter: one
        rmsprop_update, or (fused=False) adam_moment for each average, then rms_step, or
        rms_buffer and sgd_step."""
        centered, buffer = structure["centered"], structure["momentum_buffer"]
        states = ["square_avg", *(["grad_avg"] if centered else []), *(["momentum_buffer"] if buffer else [])]
        leaves = dict(zip(states, self.state_leaves(builder, p, states), strict=True))
        names = [p.name, *(f"{p.name}.{state}" for state in states)]
        wd, average = h["weight_decay"], [h["alpha"], h["one_minus_alpha"]]
        if self.fused:
            operands = [p.node, p.grad, leaves["square_avg"], leaves.get("grad_avg", zero)]
            operands += [leaves.get("momentum_buffer", zero), h["lr"], *average, h["eps"], wd]
            operands.append(h["momentum"] if buffer else zero)
            update = builder.emit("rmsprop_update", operands, centered=centered, momentum_buffer=buffer)
            self.record(builder, update, names)
        else:
            updates = builder.graph.updates
            s = updates[names[1]] = builder.emit(
                "adam_moment", [leaves["square_avg"], p.grad, p.node, *average, wd], order=2
            )
            a = zero
            if centered:
                a = updates[names[2]] = builder.emit(
                    "adam_moment", [leaves["grad_avg"], p.grad, p.node, *average, wd], order=1
                )
            if buffer:
                operands = [leaves["momentum_buffer"], p.grad, p.node, s, a, h["momentum"], h["eps"], wd]
                direction = updates[names[-1]] = builder.emit("rms_buffer", operands)
                updates[p.name] = builder.emit("sgd_step", [p.node, direction, h["lr"], zero])
            else:
                updates[p.name] = builder.emit("rms_step", [p.node, p.grad, s, a, h["lr"], h["eps"], wd])
        return {name: np.zeros(builder.shape(p.node), np.float32) for name in names[1:]}


class Adagrad(Optimizer):
    """Adagrad with learning-rate decay and L2 weight decay (torch.optim.Adagrad); each group's
    `initial_accumulator_value` fills its sums at compile()."""

    FIELDS = ("step_size", "eps", "weight_decay")

    def __init__(
        self,
        params=None,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        *,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        defaults = {"lr": lr, "lr_decay": lr_decay, "weight_decay": weight_decay}
        super().__init__(params, {**defaults, "initial_accumulator_value": initial_accumulator_value, "eps": eps})

    eps = group_property("eps")

    def check_group(self, index, group):
        for key in ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps"):
            check_hyper(f"param_groups[{index}] {key}", group[key])

    def hyper_fields(self, group, step):
        # torch's _single_tensor_adagrad: clr = lr / (1 + (step − 1)·lr_decay), in double.
        return {
            "lr": group["lr"],
            "weight_decay": group["weight_decay"],
            "eps": group["eps"],
            "step_size": group["lr"] / (1 + (step - 1) * group["lr_decay"]),
        }

    def build_group_updates(self, builder, groups, hypers):
        initial = self.step_counter(builder)
        zero, one = builder.const(0.0), builder.const(1.0)
        for params, h, group in zip(groups, hypers, self.param_groups, strict=True):
            for p in params:
                (s,) = self.state_leaves(builder, p, ["sum"])
                names = [p.name, f"{p.name}.sum"]
                wd = h["weight_decay"]
                if self.fused:
                    update = builder.emit("adagrad_update", [p.node, p.grad, s, h["step_size"], h["eps"], wd])
                    self.record(builder, update, names)
                else:  # state_sum.addcmul_(grad, grad, value=1): a moment with beta = weight = 1
                    s = builder.graph.updates[names[1]] = builder.emit(
                        "adam_moment", [s, p.grad, p.node, one, one, wd], order=2
                    )
                    operands = [p.node, p.grad, s, zero, h["step_size"], h["eps"], wd]
                    builder.graph.updates[p.name] = builder.emit("rms_step", operands)
                shape = builder.shape(p.node)
                initial[names[1]] = np.full(shape, group["initial_accumulator_value"], np.float32)
        return initial


def decoupled_fields(group: dict[str, Any]) -> dict[str, float]:
    """NAdam's and RAdam's weight decay as their kernels read it: the L2 term's weight (0 when
    decoupled) and the factor of p (torch's 1 − lr·wd when decoupled, else 1): a run-time choice."""
    lr, weight_decay = group["lr"], group["weight_decay"]
    if group["decoupled_weight_decay"]:
        return {"weight_decay": 0.0, "decay": 1 - lr * weight_decay}
    return {"weight_decay": weight_decay, "decay": 1.0}


class Adamax(Optimizer):
    """Adamax, Adam on the infinity norm, with L2 weight decay (torch.optim.Adamax); torch has no
    `fused` flag for it: here it picks the fused or single-tensor form, as for the others."""

    FIELDS = ("one_minus_beta1", "beta2", "step_size", "eps", "weight_decay")

    def __init__(
        self,
        params=None,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        *,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay})

    betas = group_property("betas")
    eps = group_property("eps")

    def check_group(self, index, group):
        for key in ("lr", "eps", "weight_decay"):
            check_hyper(f"param_groups[{index}] {key}", group[key])
        check_betas(index, group)

    def hyper_fields(self, group, step):
        # torch's _single_tensor_adamax: clr = lr / (1 − β₁ᵗ) in double (addcdiv_'s value −clr).
        lr = group["lr"]
        beta1, beta2 = (float(b) for b in group["betas"])
        return {
            "lr": lr,
            "weight_decay": group["weight_decay"],
            "beta1": beta1,
            "beta2": beta2,
            "one_minus_beta1": 1 - beta1,
            "eps": group["eps"],
            "step_size": lr / (1 - beta1**step),
        }

    def build_group_updates(self, builder, groups, hypers):
        initial = self.step_counter(builder)
        zero = builder.const(0.0)
        for params, h in zip(groups, hypers, strict=True):
            for p in params:
                m, u = self.state_leaves(builder, p, ["exp_avg", "exp_inf"])
                names = [p.name, f"{p.name}.exp_avg", f"{p.name}.exp_inf"]
                wd = h["weight_decay"]
                if self.fused:
                    operands = [p.node, p.grad, m, u, h["one_minus_beta1"], h["beta2"], h["step_size"], h["eps"], wd]
                    self.record(builder, builder.emit("adamax_update", operands), names)
                else:
                    updates = builder.graph.updates
                    m = updates[names[1]] = builder.emit(
                        "adam_moment", [m, p.grad, p.node, zero, h["one_minus_beta1"], wd], order=1
                    )
                    u = updates[names[2]] = builder.emit("adamax_norm", [u, p.grad, p.node, h["beta2"], h["eps"], wd])
                    updates[p.name] = builder.emit("adamax_step", [p.node, m, u, h["step_size"]])
                initial |= {name: np.zeros(builder.shape(p.node), np.float32) for name in names[1:]}
        return initial


class NAdam(Optimizer):
    """NAdam, Adam with Nesterov momentum on a momentum schedule μₜ = β₁·(1 − ½·0.96^(t·momentum_decay)),
    with L2 or decoupled weight decay (torch.optim.NAdam). `decoupled_weight_decay` may change at
    run time, as the other hyper-parameters; torch's per-parameter `mu_product` is kept by the
    host, one per group (module docstring). torch has no `fused` flag for it: here it picks the
    fused or single-tensor form, as for the others."""

    FIELDS = (
        "one_minus_beta1", "beta2", "one_minus_beta2", "bias_correction2", "eps", "grad_step_size",
        "momentum_step_size", "weight_decay", "decay",
    )  # fmt: skip

    def __init__(
        self,
        params=None,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum_decay: float = 4e-3,
        decoupled_weight_decay: bool = False,
        *,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        defaults |= {"momentum_decay": momentum_decay, "decoupled_weight_decay": decoupled_weight_decay}
        super().__init__(params, defaults)
        # Per group: torch's mu_product after update k, for the k recorded (`mu_product`).
        self.mu_products: list[dict[int, float]] = [{} for _ in self.param_groups]
        self.members: list[list[str]] = []  # per group: its parameters' names, once compiled

    betas = group_property("betas")
    eps = group_property("eps")

    def check_group(self, index, group):
        for key in ("lr", "eps", "weight_decay", "momentum_decay"):
            check_hyper(f"param_groups[{index}] {key}", group[key])
        check_betas(index, group)
        check_flag(f"param_groups[{index}] decoupled_weight_decay", group["decoupled_weight_decay"])

    @staticmethod
    def mu(group: dict[str, Any], step: int) -> float:
        """torch's μ of update `step`, in double: β₁·(1 − 0.5·0.96^(step·momentum_decay))."""
        return float(group["betas"][0]) * (1.0 - 0.5 * (0.96 ** (step * group["momentum_decay"])))

    def mu_product(self, index: int, step: int) -> float:
        """torch's state["mu_product"] of group `index` after update `step`: the float32 running
        product of the μₖ, from the last one recorded at or before `step` (1 at step 0), each
        further μₖ at the group's current hyper-parameters."""
        known = self.mu_products[index] if index < len(self.mu_products) else {}
        start = max((k for k in known if k <= step), default=0)
        product = np.float32(known.get(start, 1.0))
        group = self.param_groups[index]
        for k in range(start + 1, step + 1):
            product = product * np.float32(self.mu(group, k))  # torch's mu_product *= mu, a float32 tensor
        return float(product)

    def hyper_fields(self, group, step):
        # torch's _single_tensor_nadam, in Python double from the float32 mu_product: the two
        # addcdiv_ values −lr·(1 − μₜ)/(1 − Πμ) and −lr·μₜ₊₁/(1 − Πμ·μₜ₊₁), and 1 − β₂ᵗ.
        lr = group["lr"]
        beta1, beta2 = (float(b) for b in group["betas"])
        mu_next = self.mu(group, step + 1)
        product = self.mu_product(self.group_index(group), step)
        return {
            "lr": lr,
            "beta1": beta1,
            "beta2": beta2,
            "one_minus_beta1": 1 - beta1,
            "one_minus_beta2": 1 - beta2,
            "eps": group["eps"],
            "bias_correction2": 1 - beta2**step,
            "grad_step_size": lr * (1.0 - self.mu(group, step)) / (1.0 - product),
            "momentum_step_size": (lr * mu_next) / (1.0 - product * mu_next),
            **decoupled_fields(group),
        }

    def applied(self, step):
        for index in range(len(self.param_groups)):
            self.mu_products[index] = {step: self.mu_product(index, step)}

    def host_state(self, step):
        return {
            f"{name}.mu_product": np.array(self.mu_product(index, step), np.float32)
            for index, names in enumerate(self.members)
            for name in names
        }

    def host_state_problems(self, state):
        problems = []
        for index, names in enumerate(self.members):
            values = np.unique([np.asarray(state[f"{name}.mu_product"], np.float32).reshape(()) for name in names])
            if len(values) > 1:  # (np.unique counts NaN once)
                problems.append(
                    f"param_groups[{index}]: its parameters' mu_product differ ({values.tolist()}); "
                    "meganeura's NAdam keeps one for each parameter group"
                )
        return problems

    def load_host_state(self, state, step):
        for index, names in enumerate(self.members):
            if names:
                self.mu_products[index] = {step: float(np.asarray(state[f"{names[0]}.mu_product"]).reshape(()))}

    def build_group_updates(self, builder, groups, hypers):
        initial = self.step_counter(builder)
        self.members = [[p.name for p in params] for params in groups]
        # (kept: the plan of another input shape is built mid-run, on the same history)
        self.mu_products += [{} for _ in self.param_groups[len(self.mu_products) :]]
        zero = builder.const(0.0)
        for params, h in zip(groups, hypers, strict=True):
            for p in params:
                m, v = self.state_leaves(builder, p, ["exp_avg", "exp_avg_sq"])
                names = [p.name, f"{p.name}.exp_avg", f"{p.name}.exp_avg_sq"]
                moments = [h["one_minus_beta1"], h["beta2"], h["one_minus_beta2"]]
                steps = [h["grad_step_size"], h["momentum_step_size"], h["bias_correction2"], h["eps"]]
                wd, decay = h["weight_decay"], h["decay"]
                if self.fused:
                    operands = [p.node, p.grad, m, v, *moments, h["bias_correction2"], h["eps"]]
                    operands += [h["grad_step_size"], h["momentum_step_size"], wd, decay]
                    self.record(builder, builder.emit("nadam_update", operands), names)
                else:
                    updates = builder.graph.updates
                    m = updates[names[1]] = builder.emit(
                        "adam_moment", [m, p.grad, p.node, zero, moments[0], wd], order=1
                    )
                    v = updates[names[2]] = builder.emit("adam_moment", [v, p.grad, p.node, *moments[1:], wd], order=2)
                    updates[p.name] = builder.emit("nadam_step", [p.node, p.grad, m, v, *steps, wd, decay])
                initial |= {name: np.zeros(builder.shape(p.node), np.float32) for name in names[1:]}
        return initial


class RAdam(Optimizer):
    """RAdam, Adam with its variance rectified (the unrectified step p − lr·m̂ while torch's ρₜ ≤ 5),
    with L2 or decoupled weight decay (torch.optim.RAdam); `decoupled_weight_decay` may change at
    run time, as the other hyper-parameters. torch has no `fused` flag for it: here it picks the
    fused or single-tensor form, as for the others."""

    FIELDS = (
        "one_minus_beta1", "beta2", "one_minus_beta2", "lr", "bias_correction1", "bias_correction2_sqrt", "eps",
        "rectification", "weight_decay", "decay",
    )  # fmt: skip

    def __init__(
        self,
        params=None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled_weight_decay: bool = False,
        *,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, {**defaults, "decoupled_weight_decay": decoupled_weight_decay})

    betas = group_property("betas")
    eps = group_property("eps")

    def check_group(self, index, group):
        for key in ("lr", "eps", "weight_decay"):
            check_hyper(f"param_groups[{index}] {key}", group[key])
        check_betas(index, group)
        check_flag(f"param_groups[{index}] decoupled_weight_decay", group["decoupled_weight_decay"])

    def hyper_fields(self, group, step):
        # torch's _single_tensor_radam, in Python double: 1 − β₁ᵗ, (1 − β₂ᵗ)^0.5, the SMA lengths
        # ρ∞ = 2/(1 − β₂) − 1 and ρₜ = ρ∞ − 2t·β₂ᵗ/(1 − β₂ᵗ), and where ρₜ > 5 the rectification
        # ((ρₜ − 4)(ρₜ − 2)ρ∞ / ((ρ∞ − 4)(ρ∞ − 2)ρₜ))^0.5 (else 0: the kernels take the plain step).
        beta1, beta2 = (float(b) for b in group["betas"])
        bias_correction2 = 1 - beta2**step
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2**step) / bias_correction2
        rectification = 0.0
        if rho_t > 5.0:
            rectification = ((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        return {
            "lr": group["lr"],
            "beta1": beta1,
            "beta2": beta2,
            "one_minus_beta1": 1 - beta1,
            "one_minus_beta2": 1 - beta2,
            "eps": group["eps"],
            "bias_correction1": 1 - beta1**step,
            "bias_correction2_sqrt": bias_correction2**0.5,
            "rectification": rectification,
            **decoupled_fields(group),
        }

    def build_group_updates(self, builder, groups, hypers):
        initial = self.step_counter(builder)
        zero = builder.const(0.0)
        for params, h in zip(groups, hypers, strict=True):
            for p in params:
                m, v = self.state_leaves(builder, p, ["exp_avg", "exp_avg_sq"])
                names = [p.name, f"{p.name}.exp_avg", f"{p.name}.exp_avg_sq"]
                moments = [h["one_minus_beta1"], h["beta2"], h["one_minus_beta2"]]
                step = [h["lr"], h["bias_correction1"], h["bias_correction2_sqrt"], h["eps"], h["rectification"]]
                wd, decay = h["weight_decay"], h["decay"]
                if self.fused:
                    operands = [p.node, p.grad, m, v, *moments, *step, wd, decay]
                    self.record(builder, builder.emit("radam_update", operands), names)
                else:
                    updates = builder.graph.updates
                    m = updates[names[1]] = builder.emit(
                        "adam_moment", [m, p.grad, p.node, zero, moments[0], wd], order=1
                    )
                    v = updates[names[2]] = builder.emit("adam_moment", [v, p.grad, p.node, *moments[1:], wd], order=2)
                    updates[p.name] = builder.emit("radam_step", [p.node, m, v, *step, decay])
                initial |= {name: np.zeros(builder.shape(p.node), np.float32) for name in names[1:]}
        return initial


class Adadelta(Optimizer):
    """Adadelta with L2 weight decay (torch.optim.Adadelta); torch has no `fused` flag for it: here
    it picks the fused or single-tensor form, as for the others."""

    FIELDS = ("lr", "rho", "one_minus_rho", "eps", "weight_decay")

    def __init__(
        self,
        params=None,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        *,
        fused: bool = True,
    ) -> None:
        self.fused = check_flag("fused", fused)
        super().__init__(params, {"lr": lr, "rho": rho, "eps": eps, "weight_decay": weight_decay})

    eps = group_property("eps")

    def check_group(self, index, group):
        for key in ("lr", "eps", "weight_decay"):
            check_hyper(f"param_groups[{index}] {key}", group[key])
        check_hyper(f"param_groups[{index}] rho", group["rho"], 0.0, 1.0, closed=True)

    def hyper_fields(self, group, step):
        return {
            "lr": group["lr"],
            "weight_decay": group["weight_decay"],
            "rho": group["rho"],
            "one_minus_rho": 1 - group["rho"],  # both addcmul_'s value
            "eps": group["eps"],
        }

    def step_key(self, step):
        return None  # nothing depends on the step count

    def build_group_updates(self, builder, groups, hypers):
        initial = self.step_counter(builder)
        zero = builder.const(0.0)
        for params, h in zip(groups, hypers, strict=True):
            for p in params:
                s, acc = self.state_leaves(builder, p, ["square_avg", "acc_delta"])
                names = [p.name, f"{p.name}.square_avg", f"{p.name}.acc_delta"]
                average, wd = [h["rho"], h["one_minus_rho"]], h["weight_decay"]
                if self.fused:
                    operands = [p.node, p.grad, s, acc, h["lr"], *average, h["eps"], wd]
                    self.record(builder, builder.emit("adadelta_update", operands), names)
                else:
                    # square_avg and acc_delta are moments (of g′, and of the direction δ), and the
                    # step is p − lr·δ (torch's add_ with alpha −lr).
                    updates = builder.graph.updates
                    s = updates[names[1]] = builder.emit("adam_moment", [s, p.grad, p.node, *average, wd], order=2)
                    delta = builder.emit("adadelta_delta", [p.grad, p.node, s, acc, h["eps"], wd])
                    updates[names[2]] = builder.emit("adam_moment", [acc, delta, zero, *average, zero], order=2)
                    updates[p.name] = builder.emit("sgd_step", [p.node, delta, h["lr"], zero])
                initial |= {name: np.zeros(builder.shape(p.node), np.float32) for name in names[1:]}
        return initial
