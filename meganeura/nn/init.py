"""torch.nn.init: fill a parameter in place with PyTorch's initialisation formulas.

`from meganeura.nn import init` or `nn.init.xavier_uniform_(layer.weight)`. Each function takes a
Parameter (or Buffer, or a numpy array, filled in place), computes its bounds exactly as PyTorch
does (fans: `_calculate_fan_in_and_fan_out`, gains: `calculate_gain`), draws from the generator
that `mn.manual_seed` seeds (meganeura/nn `_rng`; `generator=` takes a numpy Generator instead)
and returns the tensor. A parameter that a compiled program already owns is written on the device
(`Parameter.copy_`), so re-initialising after compile() takes effect in every program.

The draws are numpy's (float64, rounded to float32), not torch's generator: the same
distributions, not the same numbers as a torch run with the same seed.

>>> # def init_weights(m):
>>> #     if isinstance(m, nn.Linear):
>>> #         nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
>>> # model.apply(init_weights)
"""

from __future__ import annotations

import math
import sys
import warnings
from typing import Any

import numpy as np

from meganeura.parameter import Parameter
from meganeura.tensor import Tensor

__all__ = [
    "calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
    "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
]  # fmt: skip

LINEAR_FUNCTIONS = (
    "linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
)  # fmt: skip


# -- where values come from and go --------------------------------------------------------------


def generator_of(generator: np.random.Generator | None) -> np.random.Generator:
    """`generator`, or the one `mn.manual_seed` seeds."""
    if generator is None:
        return sys.modules["meganeura.nn"]._rng
    if not isinstance(generator, np.random.Generator):
        raise TypeError(f"generator must be a numpy Generator (np.random.default_rng(seed)), got {generator!r}")
    return generator


def shape_of(tensor: Any) -> tuple[int, ...]:
    """The shape of a Parameter or numpy array to fill; a traced Tensor is refused."""
    if isinstance(tensor, Parameter) or isinstance(tensor, np.ndarray):
        return tuple(tensor.shape)
    if isinstance(tensor, Tensor):
        raise TypeError("nn.init fills a parameter's value; a traced Tensor (inside forward) has none")
    raise TypeError(f"nn.init expects an nn.Parameter or a numpy array, got {type(tensor).__name__}")


def filled(tensor: Any, value: Any) -> Any:
    """`tensor` with its value replaced by `value` in place (on the device if a program owns it)."""
    value = np.broadcast_to(np.asarray(value), shape_of(tensor))
    if isinstance(tensor, Parameter):
        return tensor.copy_(value)
    tensor[...] = value
    return tensor


def numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


# -- gains and fans ------------------------------------------------------------------------------


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity (torch.nn.init.calculate_gain): 1 for linear, conv
    and sigmoid, 5/3 for tanh, √2 for relu, √(2 / (1 + slope²)) for leaky_relu (slope `param`,
    0.01 by default), 3/4 for selu."""
    if nonlinearity in LINEAR_FUNCTIONS or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif (not isinstance(param, bool) and isinstance(param, int)) or isinstance(param, float):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor: Any) -> tuple[int, int]:
    """(fan_in, fan_out) = (size(1), size(0)) times the product of the trailing dims, as PyTorch
    computes them (a transposed convolution's weight [in, out/groups, k…] gets its fans this way too)."""
    shape = shape_of(tensor)
    if len(shape) < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive_field = numel(shape[2:])
    return shape[1] * receptive_field, shape[0] * receptive_field


def _calculate_correct_fan(tensor: Any, mode: str) -> int:
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of ['fan_in', 'fan_out']")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


# -- plain distributions and constants -------------------------------------------------------------


def uniform_(tensor: Any, a: float = 0.0, b: float = 1.0, generator: np.random.Generator | None = None) -> Any:
    """Fill with U(a, b)."""
    return filled(tensor, generator_of(generator).uniform(a, b, size=shape_of(tensor)))


def normal_(tensor: Any, mean: float = 0.0, std: float = 1.0, generator: np.random.Generator | None = None) -> Any:
    """Fill with N(mean, std²)."""
    return filled(tensor, generator_of(generator).normal(mean, std, size=shape_of(tensor)))


def trunc_normal_(
    tensor: Any,
    mean: float = 0.0,
    std: float = 1.0,
    a: float = -2.0,
    b: float = 2.0,
    generator: np.random.Generator | None = None,
) -> Any:
    """Fill with N(mean, std²) truncated to [a, b], by PyTorch's method: normal draws redrawn
    outside [a, b] while that interval holds more than 30% of the mass, else uniform proposals on
    [a, b] accepted with the normal density's ratio to its peak."""
    rng, shape = generator_of(generator), shape_of(tensor)
    if mean < a - 2 * std or mean > b + 2 * std:
        warnings.warn(
            "mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
            "The distribution of values may be incorrect.",
            stacklevel=2,
        )

    def norm_cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    lo, hi = float(np.float32(a)), float(np.float32(b))  # the bounds as the float32 values can hold them
    if norm_cdf((b - mean) / std) - norm_cdf((a - mean) / std) > 0.3:
        values = rng.normal(mean, std, size=shape).astype(np.float32)
        outside = (values < lo) | (values > hi)
        while outside.any():
            values[outside] = rng.normal(mean, std, size=int(outside.sum()))
            outside = (values < lo) | (values > hi)
        return filled(tensor, values)
    mode = max(a, min(mean, b))
    log_peak = -0.5 * ((mode - mean) / std) ** 2
    values = np.empty(shape)
    pending = np.ones(shape, dtype=bool)
    while pending.any():
        candidates = rng.uniform(a, b, size=int(pending.sum()))
        log_ratio = -0.5 * ((candidates - mean) / std) ** 2 - log_peak
        accepted = np.log(rng.uniform(size=candidates.size)) <= log_ratio
        where = np.flatnonzero(pending)[accepted]
        values.flat[where] = candidates[accepted]
        pending.flat[where] = False
    return filled(tensor, values)


def constant_(tensor: Any, val: float) -> Any:
    """Fill with `val`."""
    return filled(tensor, float(val))


def ones_(tensor: Any) -> Any:
    return filled(tensor, 1.0)


def zeros_(tensor: Any) -> Any:
    return filled(tensor, 0.0)


def eye_(tensor: Any) -> Any:
    """The identity matrix (2-D tensors only), as torch.eye of the tensor's shape."""
    shape = shape_of(tensor)
    if len(shape) != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    return filled(tensor, np.eye(*shape))


def dirac_(tensor: Any, groups: int = 1) -> Any:
    """The Dirac delta of a convolution's weight [out, in, k…] (3 to 5 dims): 1 at the kernel's
    centre for out channel g·(out/groups) + d and in channel d, so the convolution keeps as many
    input channels as it can, per group."""
    shape = shape_of(tensor)
    if len(shape) not in (3, 4, 5):
        raise ValueError("Only tensors with 3, 4, or 5 dimensions are supported")
    if shape[0] % groups != 0:
        raise ValueError("dim 0 must be divisible by groups")
    per_group = shape[0] // groups
    values = np.zeros(shape)
    centre = tuple(size // 2 for size in shape[2:])
    for group in range(groups):
        for d in range(min(per_group, shape[1])):
            values[(group * per_group + d, d, *centre)] = 1.0
    return filled(tensor, values)


# -- scaled by the fans -------------------------------------------------------------------------


def xavier_uniform_(tensor: Any, gain: float = 1.0, generator: np.random.Generator | None = None) -> Any:
    """U(−a, a) with a = gain·√(6 / (fan_in + fan_out)) (Glorot)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor: Any, gain: float = 1.0, generator: np.random.Generator | None = None) -> Any:
    """N(0, std²) with std = gain·√(2 / (fan_in + fan_out)) (Glorot)."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def kaiming_uniform_(
    tensor: Any,
    a: float = 0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: np.random.Generator | None = None,
) -> Any:
    """U(−bound, bound) with bound = gain·√(3 / fan), gain = calculate_gain(nonlinearity, a) and fan
    the fan_in or fan_out (He). PyTorch's layers use a=√5: bound 1/√fan_in."""
    if 0 in shape_of(tensor):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan)
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Any,
    a: float = 0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: np.random.Generator | None = None,
) -> Any:
    """N(0, std²) with std = gain / √fan (He)."""
    if 0 in shape_of(tensor):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=2)
        return tensor
    fan = _calculate_correct_fan(tensor, mode)
    std = calculate_gain(nonlinearity, a) / math.sqrt(fan)
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor: Any, gain: float = 1, generator: np.random.Generator | None = None) -> Any:
    """A (semi-)orthogonal matrix times `gain` (trailing dims flattened), as PyTorch makes it: the
    Q of a normal matrix's QR, its columns' signs set by R's diagonal."""
    shape = shape_of(tensor)
    if len(shape) < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if numel(shape) == 0:
        return tensor
    rows = shape[0]
    cols = numel(shape) // rows
    flattened = generator_of(generator).normal(0.0, 1.0, size=(rows, cols))
    if rows < cols:
        flattened = flattened.T
    q, r = np.linalg.qr(flattened)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return filled(tensor, (q * gain).reshape(shape))


def sparse_(tensor: Any, sparsity: float, std: float = 0.01, generator: np.random.Generator | None = None) -> Any:
    """A 2-D tensor of N(0, std²) values with ceil(sparsity·rows) of each column's entries zero."""
    shape = shape_of(tensor)
    if len(shape) != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    rng = generator_of(generator)
    rows, cols = shape
    values = rng.normal(0.0, std, size=shape)
    zeros = math.ceil(sparsity * rows)
    for column in range(cols):
        values[rng.permutation(rows)[:zeros], column] = 0.0
    return filled(tensor, values)
