"""A program's plans by input shapes: what lets `program.train_step` and `program(...)` take inputs
of shapes the program was not compiled for (`mn.compile(..., dynamic=True)`, the default).

A Program is compiled for the shapes declared in `compile(inputs=...)`. Called with inputs of
other shapes — the same names, ranks and dtypes — it compiles a plan for those shapes once, by
the path `compile()` takes (trace, e-graph, lowering, executable) from the same model, loss,
optimizer, options and target, and keeps it, keyed by the input shapes. Every plan's executable
binds one set of device buffers for the model's state: the parameters and module buffers
(through `nn.Parameter.storage`, as every program of the model does) and the program's optimizer
and gate states (runtime/executable.py, `shared_states`), so a run that alternates shapes trains
one model, as PyTorch does.

- A new shape is traced with every module in the mode (`training`) it had when the program was
  made: a compiled program keeps its modes (nn.Module.train). Its step must read and update the
  same parameters and states, with the same outputs, as the declared shapes' step (a change of the
  optimizer that fixes the step's structure since then — SGD's momentum set to 0 — is refused).
- A trace error at a new shape is raised as at compile(): on the user's line, with a note naming
  the shapes.
- At most `max_shapes` plans are kept (the declared one included, which is never evicted): a new
  shape beyond that evicts the least recently used other plan, with a ShapeLimitWarning, and an
  evicted shape that comes back compiles again.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from meganeura import nn
from meganeura.compiler import MAX_SHAPES, Compilation, InputSpec, StopExplain, coerce_input, compile_plan

ShapeKey = tuple[tuple[int, ...], ...]  # the input shapes, in the order of compile(inputs=...)
PACKAGE = os.path.dirname(os.path.abspath(__file__))


class ShapeLimitWarning(UserWarning):
    """A program met more input shapes than its `max_shapes` and evicted a compiled plan."""


@dataclass
class ShapePlan:
    """One input-shape plan of a program: its compilation and its executable (None in explain mode)."""

    compilation: Compilation
    executable: Any  # runtime.Executable
    serial: int = 0  # the order plans were compiled in (0: the declared shapes)

    @property
    def key(self) -> ShapeKey:
        return tuple(spec.shape for spec in self.compilation.inputs.values())

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: spec.shape for name, spec in self.compilation.inputs.items()}


def shapes_text(shapes: dict[str, tuple[int, ...]]) -> str:
    """`x: [8, 4], y: [8]`."""
    return ", ".join(f"{name}: {list(shape)}" for name, shape in shapes.items())


def check_max_shapes(dynamic: bool, max_shapes: int) -> None:
    if not isinstance(dynamic, (bool, np.bool_)):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
    if not isinstance(max_shapes, (int, np.integer)) or isinstance(max_shapes, bool) or max_shapes < 2:
        raise ValueError(
            f"max_shapes must be a whole number >= 2 (it counts the declared shapes' plan), got {max_shapes!r}; "
            "dynamic=False keeps a program to its declared shapes"
        )


@contextlib.contextmanager
def modes_kept(model: nn.Module, modes: dict[str, bool]) -> Iterator[None]:
    """Every module of `model` in the mode `modes` gives it (as when the program was made), and back
    after, without the warning that switching modes gives."""
    modules = dict(model.named_modules())
    now = {name: module.training for name, module in modules.items()}
    try:
        for name, module in modules.items():
            object.__setattr__(module, "training", modes.get(name, module.training))
        yield
    finally:
        for name, module in modules.items():
            object.__setattr__(module, "training", now[name])


def step_signature(compilation: Compilation) -> dict[str, Any]:
    """What every shape's step of one program must share: its parameters and states by name and
    type, and its outputs' names."""
    graph = compilation.traced.graph
    leaves = {f"{op} {name}": node.type for op in ("param", "state") for name, node in graph.leaves(op).items()}
    return leaves | {f"output {name}": None for name in graph.outputs}


class ShapePlans:
    """The plans of one program by input shapes (see the module docstring), least recently used first."""

    def __init__(
        self,
        declared: Compilation,
        executable: Any,
        make_executable: Callable[[Compilation], Any],
        dynamic: bool = True,
        max_shapes: int = MAX_SHAPES,
    ) -> None:
        check_max_shapes(dynamic, max_shapes)
        self.declared = ShapePlan(declared, executable)
        self.make_executable = make_executable
        self.dynamic = bool(dynamic)
        self.max_shapes = int(max_shapes)
        self.names = tuple(declared.inputs)
        self.plans: OrderedDict[ShapeKey, ShapePlan] = OrderedDict({self.declared.key: self.declared})
        model = declared.model
        self.modes = {name: module.training for name, module in model.named_modules()} if model is not None else {}
        self.compiled = 0  # plans compiled after the declared one
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.plans)

    def shapes(self) -> list[dict[str, tuple[int, ...]]]:
        """The input shapes of the plans kept, the declared ones first, then in the order compiled."""
        return [plan.shapes for plan in sorted(self.plans.values(), key=lambda plan: plan.serial)]

    def of(self, values: dict[str, np.ndarray]) -> ShapePlan:
        """The plan of inputs checked by `plan_for` (their shapes are a key)."""
        return self.plans[tuple([values[name].shape for name in self.names])]

    def plan_for(self, arrays: dict[str, Any]) -> ShapePlan:
        """The plan for the shapes of `arrays` (every declared input present): the declared one, one
        compiled before, or, when dynamic, one compiled now. Inputs that no plan can take (another
        rank) get the declared plan, whose check (coerce_input) says why they do not fit."""
        key = tuple([np.shape(arrays[name]) for name in self.names])
        plan = self.plans.get(key)
        if plan is not None:
            if plan is not self.declared:  # (never evicted: its place in the order does not matter)
                self.plans.move_to_end(key)
            return plan
        if not self.dynamic or not self.takes(arrays):
            return self.declared
        specs = {name: InputSpec(shape, self.spec(name).dtype) for name, shape in zip(self.names, key, strict=True)}
        return self.added(self.compiled_for(specs))

    def spec(self, name: str) -> InputSpec:
        return self.declared.compilation.inputs[name]

    def takes(self, arrays: dict[str, Any]) -> bool:
        """Whether a plan can be compiled for `arrays`: each of the declared rank, and of the declared
        dtype (a TypeError or ValueError, as coerce_input's, when not; an empty dimension too)."""
        for name in self.names:
            shape = np.shape(arrays[name])
            if len(shape) != len(self.spec(name).shape):
                return False
            if 0 in shape:
                raise ValueError(f"input {name!r}: shape {list(shape)} has an empty dimension; a step needs data")
            coerce_input(name, arrays[name], InputSpec(shape, self.spec(name).dtype))
        return True

    def compiled_for(self, specs: dict[str, InputSpec]) -> Compilation:
        """The declared compilation's twin at `specs`; nothing changes if it fails."""
        if self.declared.executable is None:
            raise StopExplain()  # explain mode: a script that runs a program stops there, at any shape
        declared = self.declared.compilation
        optimizer, model = declared.optimizer, declared.model
        structure = getattr(optimizer, "structure", None)
        try:
            with modes_kept(model, self.modes):
                compilation = compile_plan(
                    model,
                    declared.loss,
                    specs,
                    optimizer,
                    declared.rewrite_report.enabled,
                    declared.target,
                    declared.options,
                )
        except Exception as error:
            error.add_note(
                f"(while compiling the program for the input shapes {shapes_text(shape_dict(specs))}; "
                f"it was compiled for {shapes_text(self.declared.shapes)})"
            )
            raise
        finally:
            if optimizer is not None:
                optimizer.structure = structure  # the live optimizer's checks stay those of the program's steps
        self.check_signature(compilation)
        return compilation

    def check_signature(self, compilation: Compilation) -> None:
        """Refuse a step that would read or update other parameters or states than the program's."""
        want, got = step_signature(self.declared.compilation), step_signature(compilation)
        if want == got:
            return
        differ = sorted(name for name in want.keys() | got.keys() if want.get(name, ...) != got.get(name, ...))
        raise RuntimeError(
            f"at the input shapes {shapes_text(shape_dict(compilation.inputs))} the step has other parameters, "
            f"states or outputs than at {shapes_text(self.declared.shapes)} ({', '.join(differ[:6])}): the "
            "model or the optimizer changed since compile() in a way that changes the step (SGD's momentum set "
            "to 0, parameters frozen) or the model takes another path at these shapes; compile a new program"
        )

    def added(self, compilation: Compilation) -> ShapePlan:
        """A plan of `compilation` with its executable, kept (evicting the least recently used other
        plan when `max_shapes` are kept)."""
        executable = self.make_executable(compilation)
        if len(self.plans) >= self.max_shapes:
            self.evict(compilation)
        self.compiled += 1
        plan = ShapePlan(compilation, executable, self.compiled)
        self.plans[plan.key] = plan
        return plan

    def evict(self, compilation: Compilation) -> None:
        oldest = next(key for key in self.plans if key != self.declared.key)
        evicted = self.plans.pop(oldest)
        self.evicted += 1
        warnings.warn(
            f"this program keeps at most max_shapes={self.max_shapes} compiled input shapes: compiling "
            f"{shapes_text(shape_dict(compilation.inputs))} drops the least recently used, "
            f"{shapes_text(evicted.shapes)}, which compiles again if it comes back. Pass mn.compile(..., "
            "max_shapes=N) to keep more, or feed fewer distinct shapes (bucket or pad them)",
            ShapeLimitWarning,
            skip_file_prefixes=(PACKAGE,),
        )


def shape_dict(specs: dict[str, InputSpec]) -> dict[str, tuple[int, ...]]:
    return {name: spec.shape for name, spec in specs.items()}
