"""Conv1d, Conv2d and the transposed convolutions (ConvTranspose1d, ConvTranspose2d) with torch.nn's
signatures, checks, parameter shapes, default initialisation and printing.

As PyTorch's _ConvNd: weight [out, in/groups, k…] ([in, out/groups, k…] when transposed) and bias
[out]; `reset_parameters` draws the weight with kaiming_uniform_(a=√5) and the bias from
U(−1/√fan_in, 1/√fan_in), fan_in from PyTorch's fan computation on the weight (for a transposed
weight: out/groups·k…). The forward calls F.conv1d / F.conv2d / F.conv_transpose1d / F.conv_transpose2d
with PyTorch's arguments; padding_mode other than "zeros" pads with F.pad first, as PyTorch does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from meganeura import functional as F
from meganeura.ir.trace import user_source_line
from meganeura.nn import init
from meganeura.nn.module import Module
from meganeura.parameter import Parameter
from meganeura.tensor import Tensor

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


def ntuple(value, n: int) -> tuple:
    """`value` repeated n times, or as a tuple if it is already a sequence (torch's _single/_pair)."""
    if isinstance(value, Iterable) and not isinstance(value, str):
        return tuple(value)
    return (value,) * n


class ConvNd(Module):
    """PyTorch's _ConvNd: the checks, the parameters, their initialisation and the printing."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride,
        padding,
        dilation,
        transposed: bool,
        output_padding,
        groups: int,
        bias: bool,
        padding_mode: str,
        dims: int,
    ) -> None:
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        self.kernel_size, self.stride = ntuple(kernel_size, dims), ntuple(stride, dims)
        self.dilation, self.output_padding = ntuple(dilation, dims), ntuple(output_padding, dims)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = ntuple(padding, dims)
        if padding_mode not in PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {set(PADDING_MODES)}, but got padding_mode='{padding_mode}'")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.transposed, self.groups, self.padding_mode = transposed, groups, padding_mode
        self._reversed_padding_repeated_twice = self.reversed_padding()
        if transposed:
            shape = (in_channels, out_channels // groups, *self.kernel_size)
        else:
            shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = Parameter(np.zeros(shape, np.float32))
        if bias:
            self.bias = Parameter(np.zeros((out_channels,), np.float32))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reversed_padding(self) -> list[int]:
        """F.pad's padding for padding_mode != "zeros": (left, right) per dim, last dim first."""
        if not isinstance(self.padding, str):
            return [p for p in reversed(self.padding) for _ in range(2)]
        pads = [0, 0] * len(self.kernel_size)
        if self.padding == "same":
            for i, (d, k) in enumerate(zip(self.dilation, self.kernel_size, strict=True)):
                total = d * (k - 1)
                slot = len(self.kernel_size) - 1 - i
                pads[2 * slot], pads[2 * slot + 1] = total // 2, total - total // 2
        return pads

    def reset_parameters(self) -> None:
        """PyTorch's default initialisation (see the module docstring)."""
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0,) * len(self.padding):
            text += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            text += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            text += f", output_padding={self.output_padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text


class Conv1d(ConvNd):
    """A 1-D convolution over [N, C, L] or [C, L] (torch.nn.Conv1d): weight [out, in/groups, k]."""

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
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, False, 0, groups, bias, padding_mode, 1
        )

    def forward(self, input: Tensor) -> Tensor:
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv1d(padded, self.weight, self.bias, self.stride, (0,), self.dilation, self.groups)
        return F.conv1d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class Conv2d(ConvNd):
    """A 2-D convolution over [N, C, H, W] or [C, H, W] (torch.nn.Conv2d): weight
    [out, in/groups, kh, kw]; stride, padding ("valid", "same" too), dilation, groups (depthwise
    where groups == in_channels) and padding_mode as torch."""

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
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, False, 0, groups, bias, padding_mode, 2
        )

    def forward(self, input: Tensor) -> Tensor:
        if self.padding_mode != "zeros":
            padded = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(padded, self.weight, self.bias, self.stride, (0, 0), self.dilation, self.groups)
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)


class ConvTransposeNd(ConvNd):
    """PyTorch's _ConvTransposeNd: zero padding only, and `output_size` at forward time."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        if isinstance(self.padding, str):
            raise ValueError(f"{type(self).__name__}: padding must be an int or a tuple of ints, not {self.padding!r}")

    def output_padding_for(self, input: Tensor, output_size, dims: int) -> tuple[int, ...]:
        """The output_padding that makes the output `output_size` (PyTorch's _output_padding), or
        the module's own without one."""
        if output_size is None:
            return self.output_padding
        batched = input.ndim == dims + 2
        leading = 2 if batched else 1
        output_size = list(output_size)
        if len(output_size) == leading + dims:
            output_size = output_size[leading:]
        if len(output_size) != dims:
            raise ValueError(
                f"{user_source_line()}: ConvTranspose{dims}D: for {input.ndim}D input, output_size must have {dims} "
                f"or {leading + dims} elements (got {len(output_size)})"
            )
        smallest = [
            (input.shape[d + leading] - 1) * self.stride[d]
            - 2 * self.padding[d]
            + self.dilation[d] * (self.kernel_size[d] - 1)
            + 1
            for d in range(dims)
        ]
        largest = [size + self.stride[d] - 1 for d, size in enumerate(smallest)]
        for size, low, high in zip(output_size, smallest, largest, strict=True):
            if size < low or size > high:
                raise ValueError(
                    f"{user_source_line()}: requested an output size of {output_size}, but valid sizes range from "
                    f"{smallest} to {largest} (for an input of {list(input.shape[leading:])})"
                )
        return tuple(size - low for size, low in zip(output_size, smallest, strict=True))


class ConvTranspose1d(ConvTransposeNd):
    """The adjoint of a 1-D convolution over [N, C, L] or [C, L] (torch.nn.ConvTranspose1d):
    weight [in, out/groups, k]."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        output_padding=0,
        groups: int = 1,
        bias: bool = True,
        dilation=1,
        padding_mode: str = "zeros",
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, True, output_padding, groups, bias,
            padding_mode, 1,
        )  # fmt: skip

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        output_padding = self.output_padding_for(input, output_size, 1)
        return F.conv_transpose1d(
            input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups, self.dilation
        )


class ConvTranspose2d(ConvTransposeNd):
    """The adjoint of a 2-D convolution over [N, C, H, W] or [C, H, W] (torch.nn.ConvTranspose2d):
    weight [in, out/groups, kh, kw]."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size,
        stride=1,
        padding=0,
        output_padding=0,
        groups: int = 1,
        bias: bool = True,
        dilation=1,
        padding_mode: str = "zeros",
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size, stride, padding, dilation, True, output_padding, groups, bias,
            padding_mode, 2,
        )  # fmt: skip

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        output_padding = self.output_padding_for(input, output_size, 2)
        return F.conv_transpose2d(
            input, self.weight, self.bias, self.stride, self.padding, output_padding, self.groups, self.dilation
        )
