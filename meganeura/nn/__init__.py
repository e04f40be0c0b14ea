"""Modules and parameters with PyTorch's names, layouts and default initialisation.

>>> from meganeura import nn
>>> layer = nn.Linear(64, 10)
>>> layer.weight.shape, layer.bias.shape
((10, 64), (10,))
>>> [name for name, _ in nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).named_parameters()]
['0.weight', '0.bias', '2.weight', '2.bias']

The package: `module.py` (nn.Module), `container.py` (Sequential, ModuleList, ModuleDict,
ParameterList, ParameterDict), `init.py` (nn.init), `activation.py`, `loss.py`, `conv.py` (Conv1d
and the transposed convolutions), `pooling.py` (1-d pools, adaptive max pooling, Upsample),
`transformer.py` (MultiheadAttention and the Transformer's layers), `rnn.py` (RNN, LSTM, GRU and
their cells); the layers below (Linear, the normalisations, Embedding, the 2-d pools) are defined
here.
Parameters are drawn from `_rng`, the generator `manual_seed` seeds.
"""

from __future__ import annotations

import math

import numpy as np

from meganeura import functional as F
from meganeura.ir.trace import user_source_line
from meganeura.nn import init
from meganeura.nn.activation import (
    CELU,
    ELU,
    SELU,
    Hardshrink,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    Identity,
    LeakyReLU,
    LogSoftmax,
    Mish,
    ReLU6,
    SiLU,
    Softmax,
    Softplus,
    Softshrink,
    Tanhshrink,
    Unflatten,
)
from meganeura.nn.container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential
from meganeura.nn.conv import Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d
from meganeura.nn.loss import (
    BCELoss,
    BCEWithLogitsLoss,
    CrossEntropyLoss,
    HuberLoss,
    KLDivLoss,
    L1Loss,
    MSELoss,
    NLLLoss,
    SmoothL1Loss,
)
from meganeura.nn.module import Module, RemovableHandle
from meganeura.nn.pooling import AdaptiveAvgPool1d, AdaptiveMaxPool2d, AvgPool1d, MaxPool1d, Upsample
from meganeura.parameter import Buffer, Parameter, ParameterStorage
from meganeura.pytorch_names import missing_names
from meganeura.tensor import Tensor

__all__ = [
    "Module", "Parameter", "Buffer", "ParameterStorage", "RemovableHandle", "init", "manual_seed",
    "Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict",
    "Linear", "Identity", "Flatten", "Unflatten", "Embedding", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
    "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "InstanceNorm1d", "InstanceNorm2d",
    "Tanhshrink", "Softshrink", "Hardshrink", "SELU", "CELU", "Bilinear",
    "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d",
    "Upsample",
    "ReLU", "ReLU6", "LeakyReLU", "ELU", "GELU", "SiLU", "Mish", "Sigmoid", "Tanh", "Hardtanh", "Hardswish",
    "Hardsigmoid", "Softplus", "Softmax", "LogSoftmax",
    "CrossEntropyLoss", "NLLLoss", "MSELoss", "L1Loss", "SmoothL1Loss", "HuberLoss", "BCELoss", "BCEWithLogitsLoss",
    "KLDivLoss",
    "MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder", "TransformerDecoderLayer",
    "TransformerDecoder", "Transformer", "RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell",
    "GRUCell",
]  # fmt: skip

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


class Bilinear(Module):
    """y = x1ᵀ·A·x2 + b (torch.nn.Bilinear): weight [out, in1, in2] and bias [out], both
    U(−1/√in1, 1/√in1) as torch initialises them."""

    def __init__(self, in1_features: int, in2_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in1_features, self.in2_features, self.out_features = in1_features, in2_features, out_features
        bound = 1.0 / math.sqrt(in1_features) if in1_features > 0 else 0.0
        self.weight = Parameter(uniform(bound, (out_features, in1_features, in2_features)))
        self.bias = Parameter(uniform(bound, (out_features,))) if bias else None

    def forward(self, input1: Tensor, input2: Tensor) -> Tensor:
        return F.bilinear(input1, input2, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in1_features={self.in1_features}, in2_features={self.in2_features}, "
            f"out_features={self.out_features}, bias={self.bias is not None}"
        )


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
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
            f"bias={self.bias is not None}"
        )


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
    (torch.nn.Embedding: weight initialised N(0, 1); `_weight` gives it instead, `_freeze` freezes it).

    padding_idx (negative counts from the end): that row is initialised to zeros, its lookups give
    its value (a loaded one too) and no gradient, so training never moves it, as in PyTorch.
    max_norm and scale_grad_by_freq are not supported; sparse=True gives the
    same updates from dense gradients."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
        _weight=None,
        _freeze: bool = False,
    ) -> None:
        super().__init__()
        if max_norm is not None or scale_grad_by_freq:
            raise NotImplementedError(
                f"{user_source_line()}: nn.Embedding: max_norm and scale_grad_by_freq are not supported"
            )
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        if padding_idx is not None:
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx = padding_idx % self.num_embeddings
        self.padding_idx = padding_idx
        self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse = max_norm, norm_type, False, sparse
        shape = (self.num_embeddings, self.embedding_dim)
        if _weight is None:
            weight = _rng.standard_normal(shape).astype(np.float32)
            if padding_idx is not None:
                weight[padding_idx] = 0.0
        else:
            weight = np.asarray(_weight, dtype=np.float32)
            if weight.shape != shape:
                raise AssertionError("Shape of weight does not match num_embeddings and embedding_dim")
        self.weight = Parameter(weight, requires_grad=not _freeze)

    @classmethod
    def from_pretrained(
        cls,
        embeddings,
        freeze: bool = True,
        padding_idx: int | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        scale_grad_by_freq: bool = False,
        sparse: bool = False,
    ) -> Embedding:
        """An Embedding holding `embeddings` [num, dim] (frozen by default), as torch's."""
        from meganeura.weights import state_array

        table = state_array(embeddings)
        if table.ndim != 2:
            raise AssertionError("Embeddings parameter is expected to be 2-dimensional")
        return cls(*table.shape, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, table, freeze)

    def forward(self, input: Tensor) -> Tensor:
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        if self.sparse:
            text += ", sparse=True"
        return text


class ReLU(Module):
    """max(x, 0) as a module (torch.nn.ReLU; inplace changes nothing in a traced step)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


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
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


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


class BatchNorm(Module):
    """Batch normalisation of [N, C, *] per channel: PyTorch's _BatchNorm, the base of BatchNorm1d
    and BatchNorm2d (which check the input's rank); BatchNorm2d's docstring says what it computes."""

    mode_dependent = True  # batch statistics in training, running ones in evaluation

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum=0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.num_features = int(num_features)
        self.eps, self.momentum = float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        shape = (self.num_features,)
        self.weight = Parameter(np.ones(shape, np.float32)) if affine else None
        self.bias = Parameter(np.zeros(shape, np.float32)) if affine and bias else None
        if track_running_stats:
            self.running_mean = Buffer(np.zeros(shape, np.float32))
            self.running_var = Buffer(np.ones(shape, np.float32))
            self.num_batches_tracked = Buffer(np.zeros((), np.int64))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def check_input_dim(self, x: Tensor) -> None:
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        self.check_input_dim(x)
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
            f"bias={self.bias is not None}, track_running_stats={self.track_running_stats}"
        )


class BatchNorm2d(BatchNorm):
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

    def check_input_dim(self, x: Tensor) -> None:
        if x.ndim != 4:
            raise ValueError(f"{user_source_line()}: BatchNorm2d: expected 4D input (got {x.ndim}D input)")


class BatchNorm1d(BatchNorm):
    """Batch normalisation of [N, C] or [N, C, L] per channel (torch.nn.BatchNorm1d): BatchNorm2d's
    statistics, updates and state, over N (and L)."""

    def check_input_dim(self, x: Tensor) -> None:
        if x.ndim not in (2, 3):
            raise ValueError(f"{user_source_line()}: BatchNorm1d: expected 2D or 3D input (got {x.ndim}D input)")


class GroupNorm(Module):
    """Group normalisation of [N, C, *] (torch.nn.GroupNorm): each sample's channels in num_groups
    groups, normalised with their mean and biased variance; weight ones, bias zeros per channel."""

    def __init__(
        self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, *, bias: bool = True
    ) -> None:
        super().__init__()
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError("GroupNorm: num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps, self.affine = int(num_groups), int(num_channels), eps, affine
        self.weight = Parameter(np.ones((num_channels,), np.float32)) if affine else None
        self.bias = Parameter(np.zeros((num_channels,), np.float32)) if affine and bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}, bias={bias}"


class InstanceNorm(Module):
    """torch.nn.InstanceNorm1d/2d: each sample's channels normalised over their own spatial dims
    (F.instance_norm); affine=False by default; track_running_stats is not supported."""

    spatial = 1

    def __init__(
        self, num_features: int, eps: float = 1e-5, momentum=0.1, affine: bool = False, track_running_stats=False
    ) -> None:
        super().__init__()
        if track_running_stats:
            raise NotImplementedError(
                f"{user_source_line()}: {type(self).__name__}: track_running_stats=True is not supported"
            )
        self.num_features, self.eps, self.momentum = int(num_features), eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = Parameter(np.ones((self.num_features,), np.float32)) if affine else None
        self.bias = Parameter(np.zeros((self.num_features,), np.float32)) if affine else None

    def forward(self, input: Tensor) -> Tensor:
        rank = self.spatial + 2
        if input.ndim not in (rank - 1, rank):
            raise ValueError(f"{type(self).__name__}: expected {rank - 1}D or {rank}D input (got {input.ndim}D input)")
        if input.ndim == rank - 1:  # unbatched [C, *]
            out = F.instance_norm(input.unsqueeze(0), None, None, self.weight, self.bias, True, self.momentum, self.eps)
            return out.squeeze(0)
        return F.instance_norm(input, None, None, self.weight, self.bias, True, self.momentum, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
            f"track_running_stats={self.track_running_stats}"
        )


class InstanceNorm1d(InstanceNorm):
    spatial = 1


class InstanceNorm2d(InstanceNorm):
    spatial = 2


# Attention, the Transformer and the recurrent layers, built on the layers above.
from meganeura.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase  # noqa: E402
from meganeura.nn.transformer import (  # noqa: E402
    MultiheadAttention,
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)

__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
