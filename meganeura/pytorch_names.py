"""The PyTorch names meganeura does not have, and what to use instead: the error a user who writes
`nn.LSTM(...)` or `F.interpolate(x)` gets, in place of a bare AttributeError.

Each of `meganeura.nn`, `meganeura.functional` and `meganeura.optim` ends with
`__getattr__ = missing_names(__name__)`: a name the module lacks raises `MissingName` (an
AttributeError, so `hasattr` still works) that says whether PyTorch has it, what to use here,
and the module's names closest to it.
"""

from __future__ import annotations

import difflib
import sys

ANOTHER_WAY = {
    "meganeura.nn": {
        "Identity": "return the input from forward",
        "SiLU": "F.silu in forward",
        "Softmax": "F.softmax(x, dim) in forward",
        "LogSoftmax": "F.log_softmax(x, dim) in forward",
        "LeakyReLU": "F.leaky_relu(x, negative_slope) in forward",
        "Softplus": "F.softplus in forward",
        "Conv1d": "nn.Conv2d with a height of 1",
        "Conv3d": "no 3-D convolution: nn.Conv2d only",
        "ConvTranspose2d": "no transposed convolution yet (F.fold of a matmul is its adjoint)",
        "BatchNorm1d": "nn.BatchNorm2d on [N, C, 1, 1], or nn.LayerNorm",
        "InstanceNorm2d": "nn.GroupNorm(num_channels, num_channels)",
        "ModuleDict": "attributes on your Module, or nn.ModuleList",
        "CrossEntropyLoss": "F.cross_entropy(logits, labels) in the loss function",
        "MSELoss": "F.mse_loss(prediction, target) in the loss function",
        "NLLLoss": "F.nll_loss(log_probabilities, labels) in the loss function",
    },
    "meganeura.functional": {
        "binary_cross_entropy": "write it: -(y·log(p) + (1 − y)·log(1 − p)), mean()",
        "binary_cross_entropy_with_logits": "write it with F.softplus: softplus(x) − y·x, mean()",
        "l1_loss": "(prediction − target).abs().mean()",
        "smooth_l1_loss": "write it with abs, where and mean",
        "interpolate": "no resampling op yet",
        "pad": "the padding= argument of F.conv2d / the pools",
        "one_hot": "F.cross_entropy / F.nll_loss take integer labels directly",
        "normalize": "x / x.pow(2).sum(dim, keepdim=True).sqrt()",
        "hardtanh": "x.clamp(low, high)",
        "relu6": "x.clamp(0.0, 6.0)",
        "elu": "write it with mn.where and exp",
        "softmin": "F.softmax(-x, dim)",
    },
    "meganeura.optim": {
        "RMSprop": "optim.Adam with betas=(0.0, 0.99) is close; RMSprop itself is not here yet",
        "Adagrad": "not here yet: optim.Adam or optim.SGD",
        "LBFGS": "not here: first-order optimizers only (SGD, Adam, AdamW)",
        "NAdam": "not here yet: optim.Adam",
        "RAdam": "not here yet: optim.Adam",
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
        other = ANOTHER_WAY.get(module_name, {}).get(name)
        torch_module = module_name.replace("meganeura", "torch").replace("torch.functional", "torch.nn.functional")
        if other is not None:
            message = f"{module_name} has no {name!r} (PyTorch's {torch_module}.{name}): {other}"
        else:
            message = f"{module_name} has no {name!r}"
        close = difflib.get_close_matches(name, public, n=3, cutoff=0.6)
        if close:
            message += f"; names here that are close: {', '.join(close)}"
        raise MissingName(message)

    return __getattr__
