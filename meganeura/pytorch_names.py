"""The PyTorch names meganeura does not have, and what to use instead: the error a user who writes
`nn.LSTM(...)` or `F.interpolate(x)` gets, in place of a bare AttributeError.

Each of `meganeura`, `meganeura.nn`, `meganeura.functional` and `meganeura.optim` ends with
`__getattr__ = missing_names(__name__)`: a name the module lacks raises `MissingName` (an
AttributeError, so `hasattr` still works) that says whether PyTorch has it, what to use here,
and the module's names closest to it. A Tensor method the DSL's Tensor lacks (`x.item()`) raises
the same through `missing_method` (Tensor.__getattr__); its table is "meganeura.Tensor". A
`meganeura` name that `meganeura.functional` has points there (`mn.softmax` → F.softmax).
"""

from __future__ import annotations

import difflib
import sys

ANOTHER_WAY = {
    "meganeura.nn": {
        "Conv3d": "no 3-D convolution: nn.Conv1d and nn.Conv2d",
    },
    "meganeura.functional": {
        "conv3d": "no 3-D convolution: F.conv1d and F.conv2d",
        "grid_sample": "no grid sampling: F.interpolate resamples on a regular grid",
        "ctc_loss": "no CTC loss",
        "embedding_bag": "F.embedding, then .sum(dim) or .mean(dim) over the bag",
    },
    "meganeura": {
        "from_numpy": "pass arrays as inputs (compile(..., inputs={name: mn.f32[...]}), then program(name=array))",
        "no_grad": "a program compiled without an optimizer (mn.compile(model)) runs the forward only",
        "inference_mode": "a program compiled without an optimizer (mn.compile(model)) runs the forward only",
        "device": "compile() picks the WebGPU adapter: no devices to name",
        "save": "meganeura.checkpoint.save(program, path), or program.state_dict()",
        "load": "meganeura.checkpoint.read(path), or program.load_state_dict(state)",
    },
    "meganeura.Tensor": {
        "item": "a traced Tensor has no value while the step is traced: return it (the loss) from the loss function",
        "tolist": "a traced Tensor has no value while the step is traced: return it as an output",
        "numpy": "a traced Tensor has no value while the step is traced: return it as an output",
        "backward": "program.train_step(...) runs the backward pass that compile() traced",
        "cuda": "compile() places every tensor on its adapter",
        "cpu": "compile() places every tensor on its adapter",
        "half": "traced tensors are f32 (values) or i32 (inputs of labels and indices): no casts",
        "double": "traced tensors are f32 (values) or i32 (inputs of labels and indices): no casts",
        "masked_select": "x.masked_fill(mask, value) or mn.where(mask, x, other)",
        "requires_grad_": "compile() takes the gradients of the model's nn.Parameters",
    },
    "meganeura.optim": {
        "LBFGS": "not here: first-order optimizers only (SGD, Adam, AdamW, RMSprop, Adagrad, Adamax, NAdam, RAdam, "
        "Adadelta)",
    },
}


class MissingName(AttributeError):
    """A name meganeura does not define, with what PyTorch does and what to use here."""


def missing_names(module_name: str):
    """The module-level `__getattr__` of `module_name` (see the module docstring)."""

    def __getattr__(name: str):
        if name.startswith("__"):  # the import system probes dunders: stay silent for them
            raise AttributeError(name)
        module = sys.modules[module_name]
        public = [n for n in vars(module) if not n.startswith("_")]
        torch_module = module_name.replace("meganeura", "torch").replace("torch.functional", "torch.nn.functional")
        raise MissingName(missing_message(module_name, torch_module, name, public, another_way(module_name, name)))

    return __getattr__


def another_way(module_name: str, name: str) -> str | None:
    """What ANOTHER_WAY says to use for `name`; for `meganeura`, the functional name of the same name."""
    other = ANOTHER_WAY.get(module_name, {}).get(name)
    if other is None and module_name == "meganeura":
        functional = sys.modules.get("meganeura.functional")
        if functional is not None and name in vars(functional):
            other = f"meganeura.functional has it: F.{name} (import meganeura.functional as F)"
    return other


def missing_method(cls: type, name: str) -> MissingName:
    """The error for `tensor.name` where the DSL's Tensor class `cls` lacks `name` (Tensor.__getattr__).

    An in-place method (`add_`) whose out-of-place form exists says to use that: traced values
    are never modified in place."""
    public = [n for n in dir(cls) if not n.startswith("_")]
    other = ANOTHER_WAY["meganeura.Tensor"].get(name)
    if other is None and name.endswith("_") and name[:-1] in public:
        other = f"traced tensors are not modified in place: x = x.{name[:-1]}(...)"
    return MissingName(missing_message("meganeura.Tensor", "torch.Tensor", name, public, other, what="method"))


def missing_message(
    owner: str, torch_owner: str, name: str, public: list[str], other: str | None, what: str = "name"
) -> str:
    """`owner` has no `name` (PyTorch's `torch_owner.name`: `other`), and the public names close to it."""
    message = f"{owner} has no {name!r}"
    if other is not None:
        message += f" (PyTorch's {torch_owner}.{name}): {other}"
    close = difflib.get_close_matches(name, public, n=3, cutoff=0.6)
    if close:
        message += f"; {what}s here that are close: {', '.join(close)}"
    return message
