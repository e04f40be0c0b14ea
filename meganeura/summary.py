"""`mn.summary(model, inputs)`: each layer's output shape and parameter count, the totals
(trainable and frozen), and the device memory of the step that compile() would build — printed as
a table and returned as a `ModelSummary`. Nothing runs on a device: the model is traced (forward
hooks record each layer's output) and planned by `compile_plan` for the generic target, whose
buffer plan (meganeura/codegen/buffers.py) gives the memory.

>>> # mn.summary(model, {"x": mn.f32[32, 64], "y": mn.i32[32]}, loss=loss_fn, optimizer=optim.Adam(lr=1e-3))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meganeura import nn
from meganeura.codegen.buffers import format_bytes
from meganeura.tensor import Tensor

MEMORY_ROLES = {  # buffer-plan roles, by what they hold
    "param": "parameters",
    "state": "optimizer and module state",
    "input": "inputs",
    "const": "constants",
    "output": "outputs",
    "temp": "activations and gradients",
}


@dataclass(frozen=True)
class LayerSummary:
    """One call of a module in the traced forward: its dotted name, class, depth in the module tree,
    output shape(s), and the elements of the parameters it owns directly (each parameter counted at
    its first row: a tied or re-used one shows 0 later), of which `trainable` have requires_grad."""

    name: str
    type: str
    depth: int
    output_shape: Any
    params: int
    trainable: int


@dataclass(frozen=True)
class ModelSummary:
    """What `summary` found (see the module docstring). `memory` is bytes by what the buffers hold
    (MEMORY_ROLES' values); `step` says which step was planned ("training step" with a loss and an
    optimizer, else "inference program")."""

    layers: list[LayerSummary]
    total_params: int
    trainable_params: int
    frozen_params: int
    buffer_elements: int
    step: str
    memory: dict[str, int] = field(default_factory=dict)
    memory_total: int = 0
    memory_without_reuse: int = 0
    kernels: int = 0

    def __str__(self) -> str:
        rows = [("Layer (type)", "Output shape", "Param #")]
        for layer in self.layers:
            short = layer.name.rpartition(".")[2]
            label = "  " * layer.depth + (f"{short} ({layer.type})" if layer.name else layer.type)
            frozen = layer.params - layer.trainable
            params = f"{layer.params:,}" + (f" ({frozen:,} frozen)" if frozen else "")
            rows.append((label, format_shape(layer.output_shape), params))
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        rule = "=" * (sum(widths) + 4)
        lines = [rule, fit_row(rows[0], widths), rule, *(fit_row(row, widths) for row in rows[1:]), rule]
        lines += [
            f"Total params: {self.total_params:,}",
            f"Trainable params: {self.trainable_params:,}",
            f"Frozen params: {self.frozen_params:,}",
            f"Buffer elements: {self.buffer_elements:,}",
            rule,
            f"Device memory of the {self.step} ({self.kernels} kernels): {format_bytes(self.memory_total)} "
            f"({format_bytes(self.memory_without_reuse)} without buffer reuse)",
            *(f"  {what}: {format_bytes(count)}" for what, count in self.memory.items() if count),
            rule,
        ]
        return "\n".join(lines)


def fit_row(row: tuple[str, str, str], widths: list[int]) -> str:
    return f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:>{widths[2]}}".rstrip()


def format_shape(shape: Any) -> str:
    if isinstance(shape, list) and shape and isinstance(shape[0], list):
        return ", ".join(format_shape(s) for s in shape)
    return str(shape)


def output_shape(output: Any) -> Any:
    """A forward's result as shapes: [d, …] for a Tensor, a list of them for a tuple or list."""
    if isinstance(output, Tensor):
        return list(output.shape)
    if isinstance(output, (tuple, list)):
        return [output_shape(item) for item in output]
    return type(output).__name__


def summary(
    model: nn.Module,
    inputs: dict,
    loss: Callable[..., Tensor] | None = None,
    optimizer: Any = None,
    verbose: bool = True,
) -> ModelSummary:
    """Trace and plan `model` on `inputs` (compile()'s specs: {"x": mn.f32[32, 64]}), with `loss`
    and `optimizer` the training step, without them the inference program; print the table unless
    verbose=False and return the ModelSummary. No device is needed."""
    from meganeura.compiler import compile_plan

    names = {id(module): name for name, module in model.named_modules()}
    calls: list[dict[str, Any]] = []
    counted: set[int] = set()

    def before(module, args):
        own = [p for p in module.parameters(recurse=False) if id(p) not in counted]
        counted.update(id(p) for p in own)
        name = names.get(id(module), "?")
        calls.append(
            {
                "name": name,
                "type": type(module).__name__,
                "depth": 0 if not name else name.count(".") + 1,
                "output_shape": None,
                "params": sum(p.numel() for p in own),
                "trainable": sum(p.numel() for p in own if p.requires_grad),
                "module": module,
            }
        )

    def after(module, args, output):
        row = next(call for call in reversed(calls) if call["module"] is module and call["output_shape"] is None)
        row["output_shape"] = output_shape(output)

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(before))
        handles.append(module.register_forward_hook(after))
    # A summary is no program: the marks compiling leaves (for the warnings of a later train() or
    # requires_grad change) are put back as they were.
    modes = model.__dict__.get("_compiled_modes")
    marks = {id(p): (p, set(p.compiled_requires_grad)) for p in model.parameters()}
    try:
        compilation = compile_plan(model, loss, inputs, optimizer)
    finally:
        for handle in handles:
            handle.remove()
        if modes is None:
            model.__dict__.pop("_compiled_modes", None)
        else:
            object.__setattr__(model, "_compiled_modes", modes)
        for param, compiled in marks.values():
            param.compiled_requires_grad = compiled
    layers = [LayerSummary(**{k: v for k, v in call.items() if k != "module"}) for call in calls]
    params = list(model.parameters())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    total = sum(p.numel() for p in params)
    plan = compilation.compiled.plan
    memory = dict.fromkeys(MEMORY_ROLES.values(), 0)
    for slot in plan.buffers:
        role = MEMORY_ROLES.get(slot.role, slot.role)
        memory[role] = memory.get(role, 0) + slot.nbytes
    result = ModelSummary(
        layers=layers,
        total_params=total,
        trainable_params=trainable,
        frozen_params=total - trainable,
        buffer_elements=sum(b.numel() for b in model.buffers()),
        step="training step" if compilation.traced.optimizer is not None else "inference program",
        memory=memory,
        memory_total=plan.total_bytes,
        memory_without_reuse=plan.bytes_without_reuse,
        kernels=len(plan.schedule),
    )
    if verbose:
        print(result)
    return result
