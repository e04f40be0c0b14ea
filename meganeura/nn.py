"""Modules and parameters with PyTorch's names, layouts and default initialisation.

>>> from meganeura import nn
>>> layer = nn.Linear(64, 10)
>>> layer.weight.shape, layer.bias.shape
((10, 64), (10,))
>>> [name for name, _ in nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).named_parameters()]
['0.weight', '0.bias', '2.weight', '2.bias']
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from meganeura import functional as F
from meganeura.ir.ops.image import pair
from meganeura.ir.trace import LAYER_CALLS, user_source_line
from meganeura.parameter import Buffer, Parameter, ParameterStorage  # noqa: F401  (nn.Parameter, nn.Buffer)
from meganeura.pytorch_names import missing_names
from meganeura.tensor import Tensor
from meganeura.weights import IncompatibleKeys, load_state

_rng = np.random.default_rng(0)
# The seeds of the programs compiled without seed= that draw random numbers: (base, how many drew one).
_program_seeds = [0, 0]


def manual_seed(seed: int) -> None:
    """Seed the generator that initialises parameters (like torch.manual_seed), and the random
    numbers of the programs compiled afterwards without seed=: the first draws with `seed`, the
    next with seed + 1, and so on (meganeura/ir/ops/random.py)."""
    global _rng
    _rng = np.random.default_rng(seed)
    _program_seeds[:] = [int(seed), 0]


def next_program_seed() -> int:
    """The seed of the next program compiled without seed= (see `manual_seed`), modulo 2⁶⁴."""
    base, count = _program_seeds
    _program_seeds[1] += 1
    return (base + count) % 2**64


def uniform(bound: float, shape: tuple[int, ...]) -> np.ndarray:
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


class Module:
    """Base class of models: attributes that are Parameters or Modules are registered in order.

    A module remembers the user's line that constructed it (`_source`): the ops of a layer that the
    library calls (a child of nn.Sequential) are attributed to that line (ir/trace.py)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_source", user_source_line())

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() at the start of your Module's __init__")
        self._parameters.pop(name, None)
        self._buffers.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Buffer):  # before Parameter: a Buffer is a Parameter that is not trained
            self._buffers[name] = value
        elif isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)  # a frame user_source_line recognises (LAYER_CALLS)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs in registration order, each parameter once."""
        seen: set[int] = set()
        for name, param in self._named_parameters_all(prefix):
            if id(param) not in seen:
                seen.add(id(param))
                yield name, param

    def _named_parameters_all(self, prefix: str) -> Iterator[tuple[str, Parameter]]:
        for name, param in self._parameters.items():
            yield prefix + name, param
        for name, module in self._modules.items():
            yield from module._named_parameters_all(prefix + name + ".")

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix.rstrip("."), self
        for name, module in self._modules.items():
            yield from module.named_modules(prefix + name + ".")

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the current parameter and buffer values by dotted name (PyTorch's names and order)."""
        return {name: param.numpy() for name, param in self.named_state()}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Set every parameter and buffer from `state` (numpy arrays, torch tensors, anything array-like;
        `mn.load_safetensors` reads files). Every mismatch — names, shapes, dtypes, NaN — is reported
        at once in one StateDictError, and nothing changes unless everything fits. With `strict=False`
        missing and unexpected names are skipped and returned, as PyTorch does (meganeura/weights.py)."""
        return load_state(dict(self.named_state()), state, strict)

    # -- buffers and training mode (PyTorch's register_buffer, named_buffers, train, eval) -------

    def register_buffer(self, name: str, value) -> None:
        """Register a persistent non-trained array (e.g. BatchNorm's running statistics) as `name`."""
        setattr(self, name, value if isinstance(value, Buffer) else Buffer(value))

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Buffer]]:
        """(dotted name, buffer) pairs in registration order, each buffer once."""
        for name, value in self.named_state(prefix):
            if isinstance(value, Buffer):
                yield name, value

    def buffers(self) -> list[Buffer]:
        return [b for _, b in self.named_buffers()]

    def named_state(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter and buffer by dotted name, in state_dict order (PyTorch's: each module's
        parameters, then its buffers, then its children's), each once."""
        seen: set[int] = set()
        for name, value in self._named_state_all(prefix):
            if id(value) not in seen:
                seen.add(id(value))
                yield name, value

    def _named_state_all(self, prefix: str) -> Iterator[tuple[str, Parameter]]:
        for name, param in self._parameters.items():
            yield prefix + name, param
        for name, buffer in self._buffers.items():
            yield prefix + name, buffer
        for name, module in self._modules.items():
            yield from module._named_state_all(prefix + name + ".")

    def train(self, mode: bool = True) -> Module:
        """Set training mode (the default) on this module and every submodule; returns self.

        Programs already compiled from this model keep the mode they were compiled in (a compiled
        step is fixed): where that matters (a BatchNorm in the model), switching warns once."""
        compiled = getattr(self, "_compiled_modes", None)
        if compiled and bool(mode) not in compiled and not getattr(self, "_mode_warned", False):
            if any(getattr(module, "mode_dependent", False) for _, module in self.named_modules()):
                object.__setattr__(self, "_mode_warned", True)
                warnings.warn(
                    f"{type(self).__name__}.{'train' if mode else 'eval'}(): the programs compiled from this model "
                    f"keep the mode they were compiled in (training={sorted(compiled)[0]}); compile a program "
                    "after switching to run in the new mode (it shares the weights)",
                    stacklevel=2,
                )
        for _, module in self.named_modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Module:
        """Evaluation mode: `train(False)` (BatchNorm then normalises with its running statistics)."""
        return self.train(False)

    def __repr__(self) -> str:
        children = "".join(f"\n  ({name}): {module!r}".replace("\n", "\n  ") for name, module in self._modules.items())
        return f"{type(self).__name__}({self.extra_repr()}{children}{chr(10) if children else ''})"

    def extra_repr(self) -> str:
        return ""


LAYER_CALLS.add(Module.__call__.__code__)


class Linear(Module):
    """y = x·weightᵀ + bias; weight [out_features, in_features], PyTorch's default init."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        bound = 1.0 / math.sqrt(in_features) if in_features > 0 else 0.0
        # kaiming_uniform_(a=√5) reduces to U(−1/√in, 1/√in), as does the bias.
        self.weight = Parameter(uniform(bound, (out_features, in_features)))
        self.bias = Parameter(uniform(bound, (out_features,))) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class RMSNorm(Module):
    """x / √(mean(x²) + eps) · weight over the trailing `normalized_shape` dims (torch.nn.RMSNorm:
    weight initialised to ones, eps=None means torch.finfo(float32).eps)."""

    def __init__(self, normalized_shape, eps: float | None = None, elementwise_affine: bool = True) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape = tuple(int(d) for d in shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, dtype=np.float32)) if elementwise_affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LayerNorm(Module):
    """(x − mean) / √(var + eps) · weight + bias over the trailing `normalized_shape` dims
    (torch.nn.LayerNorm: weight initialised to ones, bias to zeros; the biased variance)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape = tuple(int(d) for d in shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        affine = elementwise_affine
        self.weight = Parameter(np.ones(self.normalized_shape, dtype=np.float32)) if affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, dtype=np.float32)) if affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GELU(Module):
    """x·Φ(x) as a module (torch.nn.GELU; approximate="none" or "tanh")."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Embedding(Module):
    """A lookup table: rows of weight [num_embeddings, embedding_dim] at i32 indices of any shape
    (torch.nn.Embedding, weight initialised N(0, 1))."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        self.weight = Parameter(_rng.standard_normal((self.num_embeddings, self.embedding_dim)).astype(np.float32))

    def forward(self, input: Tensor) -> Tensor:
        return F.embedding(input, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class ReLU(Module):
    """max(x, 0) as a module."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)


class Dropout(Module):
    """torch.nn.Dropout: F.dropout(x, p) in training, the identity in eval (the mode at compile time)."""

    mode_dependent = True  # a mask in training, the identity in evaluation
    functional = staticmethod(F.dropout)

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        F.dropout_probability(p, "dropout")
        self.p = float(p)
        self.inplace = bool(inplace)

    def forward(self, x: Tensor) -> Tensor:
        return self.functional(x, self.p, self.training, self.inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


class Dropout1d(Dropout):
    """torch.nn.Dropout1d: whole channels of [N, C, L] (or [C, L]) zeroed (F.dropout1d)."""

    functional = staticmethod(F.dropout1d)


class Dropout2d(Dropout):
    """torch.nn.Dropout2d: whole channels of [N, C, H, W] (or [C, H, W]) zeroed (F.dropout2d)."""

    functional = staticmethod(F.dropout2d)


class Sigmoid(Module):
    """The logistic function as a module."""

    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Tanh(Module):
    """tanh as a module."""

    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Flatten(Module):
    """Dims start_dim…end_dim merged into one (a reshape), as torch.nn.Flatten (by default all
    but the batch dim)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Conv2d(Module):
    """A 2-D convolution over [N, C, H, W] (torch.nn.Conv2d): weight [out_channels, in_channels,
    kh, kw] and bias [out_channels], both U(−1/√fan_in, 1/√fan_in) with fan_in = in_channels·kh·kw
    (PyTorch's default init: kaiming_uniform_(a=√5) reduces to that bound). kernel_size, stride and
    padding are ints or pairs (padding also "valid" or "same"); dilation and groups must be 1 and
    padding_mode "zeros"."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
    ) -> None:
        super().__init__()
        if groups != 1 or dilation not in (1, (1, 1)) or padding_mode != "zeros":
            raise NotImplementedError(
                f"Conv2d: only groups=1, dilation=1 and padding_mode='zeros' are supported, got groups={groups!r}, "
                f"dilation={dilation!r}, padding_mode={padding_mode!r}"
            )
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = pair(kernel_size, "Conv2d: kernel_size")
        self.stride = pair(stride, "Conv2d: stride")
        self.padding = padding if isinstance(padding, str) else pair(padding, "Conv2d: padding")
        self.dilation = (1, 1)
        self.groups = 1
        self.padding_mode = padding_mode
        fan_in = self.in_channels * self.kernel_size[0] * self.kernel_size[1]
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        self.weight = Parameter(uniform(bound, (self.out_channels, self.in_channels, *self.kernel_size)))
        self.bias = Parameter(uniform(bound, (self.out_channels,))) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding!r}"
        if self.bias is None:
            text += ", bias=False"
        return text


class Sequential(Module):
    """Modules applied in order; children are named "0", "1", … like PyTorch's."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for index, module in enumerate(modules):
            setattr(self, str(index), module)

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    def forward(self, x: Tensor) -> Tensor:
        for module in self._modules.values():
            x = module(x)
        return x


class ModuleList(Module):
    """A list of modules whose parameters are registered as "0.…", "1.…"."""

    def __init__(self, modules=()) -> None:
        super().__init__()
        for module in modules:
            self.append(module)

    def append(self, module: Module) -> ModuleList:
        setattr(self, str(len(self._modules)), module)
        return self

    def __getitem__(self, index: int) -> Module:
        return list(self._modules.values())[index]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())


# ---------------------------------------------------------------------------------------------
# Pooling and normalisation of images (NCHW), with PyTorch's names, defaults and state.


class MaxPool2d(Module):
    """The maximum over each window (torch.nn.MaxPool2d; stride defaults to kernel_size)."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False) -> None:
        super().__init__()
        self.kernel_size, self.padding = kernel_size, padding
        self.stride = stride if stride is not None else kernel_size
        self.dilation, self.return_indices, self.ceil_mode = dilation, return_indices, ceil_mode

    def forward(self, x: Tensor) -> Tensor:
        return F.max_pool2d(
            x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode, self.return_indices
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AvgPool2d(Module):
    """The mean over each window (torch.nn.AvgPool2d; count_include_pad=True, divisor kh·kw)."""

    def __init__(
        self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None
    ) -> None:
        super().__init__()
        self.kernel_size, self.padding = kernel_size, padding
        self.stride = stride if stride is not None else kernel_size
        self.ceil_mode, self.count_include_pad, self.divisor_override = ceil_mode, count_include_pad, divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return F.avg_pool2d(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Global average pooling (torch.nn.AdaptiveAvgPool2d with output_size 1 or (1, 1) only)."""

    def __init__(self, output_size) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class BatchNorm2d(Module):
    """Batch normalisation of [N, C, H, W] per channel (torch.nn.BatchNorm2d).

    Training mode (the default): the batch mean and biased variance over (N, H, W) normalise, and
    the buffers are updated on the device by every step: running_mean ← (1 − m)·running_mean +
    m·mean, running_var ← (1 − m)·running_var + m·var·n/(n − 1) (n = N·H·W), num_batches_tracked
    += 1 (float32 on the device, exact to 2^24 steps; int64 in state_dict(), as in PyTorch);
    momentum=None uses m = 1/num_batches_tracked (the cumulative average). Eval mode
    (`model.eval()`): the running statistics normalise. weight (ones) and bias (zeros) are
    parameters; state_dict names and order are PyTorch's: weight, bias, running_mean,
    running_var, num_batches_tracked.
    """

    mode_dependent = True  # batch statistics in training, running ones in evaluation

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum=0.1, affine: bool = True, track_running_stats: bool = True
    ) -> None:
        super().__init__()
        self.num_features = int(num_features)
        self.eps, self.momentum = float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        shape = (self.num_features,)
        self.weight = Parameter(np.ones(shape, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(shape, np.float32)) if affine else None
        if track_running_stats:
            self.running_mean = Buffer(np.zeros(shape, np.float32))
            self.running_var = Buffer(np.ones(shape, np.float32))
            self.num_batches_tracked = Buffer(np.zeros((), np.int64))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4:
            raise ValueError(f"BatchNorm2d: expected 4D input (got {x.ndim}D input)")
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            count = self.num_batches_tracked + 1.0
            self.num_batches_tracked.update(count)
            if self.momentum is None:
                momentum = 1.0 / count
        # As PyTorch: batch statistics in training (or when none are tracked); the running ones are
        # updated in training and read in eval.
        batch_stats = self.training or not self.track_running_stats
        track = not self.training or self.track_running_stats
        return F.batch_norm(
            x,
            self.running_mean if track else None,
            self.running_var if track else None,
            self.weight,
            self.bias,
            batch_stats,
            momentum,
            self.eps,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )


class GroupNorm(Module):
    """Group normalisation of [N, C, *] (torch.nn.GroupNorm): each sample's channels in num_groups
    groups, normalised with their mean and biased variance; weight ones, bias zeros per channel."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError("GroupNorm: num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps, self.affine = int(num_groups), int(num_channels), eps, affine
        self.weight = Parameter(np.ones((num_channels,), np.float32)) if affine else None
        self.bias = Parameter(np.zeros((num_channels,), np.float32)) if affine else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


# Sequence models (attention, the Transformer, recurrent layers), built on the modules above.
from meganeura.nn_sequence import (  # noqa: E402, F401  (re-exported)
    GRU,
    LSTM,
    RNN,
    GRUCell,
    LSTMCell,
    MultiheadAttention,
    RNNCell,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
