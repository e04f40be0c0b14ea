"""The PyTorch names meganeura does not have, and what to use instead: the error a user who writes
`nn.Dropout(0.1)` or `F.dropout(x)` gets, in place of a bare AttributeError.

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
        "Dropout": "no dropout yet: train without it, or multiply by a mask input (mn.where)",
        "Dropout1d": "no dropout yet",
        "Dropout2d": "no dropout yet",
        "Identity": "return the input from forward",
        "SiLU": "F.silu in forward",
        "Softmax": "F.softmax(x, dim) in forward",
        "LogSoftmax": "F.log_softmax(x, dim) in forward",
        "LeakyReLU": "F.leaky_relu(x, negative_slope) in forward",
        "Softplus": "F.softplus in forward",
        "MultiheadAttention": "F.scaled_dot_product_attention on your own q/k/v projections (nn.Linear)",
        "TransformerEncoderLayer": "write the block with nn.Linear, nn.LayerNorm and F.scaled_dot_product_attention",
        "Conv1d": "nn.Conv2d with a height of 1",
        "Conv3d": "no 3-D convolution: nn.Conv2d only",
        "ConvTranspose2d": "no transposed convolution yet (F.fold of a matmul is its adjoint)",
        "BatchNorm1d": "nn.BatchNorm2d on [N, C, 1, 1], or nn.LayerNorm",
        "InstanceNorm2d": "nn.GroupNorm(num_channels, num_channels)",
        "LSTM": "no recurrent layers: unroll one with nn.Linear",
        "GRU": "no recurrent layers: unroll one with nn.Linear",
        "RNN": "no recurrent layers: unroll one with nn.Linear",
        "ModuleDict": "attributes on your Module, or nn.ModuleList",
        "CrossEntropyLoss": "F.cross_entropy(logits, labels) in the loss function",
        "MSELoss": "F.mse_loss(prediction, target) in the loss function",
        "NLLLoss": "F.nll_loss(log_probabilities, labels) in the loss function",
    },
    "meganeura.functional": {
        "dropout": "no dropout yet: train without it, or multiply by a mask input (mn.where)",
        "one_hot": "F.cross_entropy / F.nll_loss take integer labels directly",
        "hardtanh": "x.clamp(low, high)",
        "relu6": "x.clamp(0.0, 6.0)",
        "elu": "write it with mn.where and exp",
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
