"""Activation modules and the shape modules without parameters (Identity, Unflatten), with
torch.nn's names, arguments and printing. Each forward calls the `F.<name>` function PyTorch's
module calls, with PyTorch's argument names. `inplace=True` is accepted and changes nothing: a
traced step has no in-place ops, and the values are the same."""

from __future__ import annotations

import math
import warnings

from meganeura import functional as F
from meganeura.ir.op import ShapeError
from meganeura.ir.trace import user_source_line
from meganeura.nn.module import Module
from meganeura.tensor import Tensor


def inplace_repr(inplace: bool, leading: bool = True) -> str:
    """PyTorch's ", inplace=True" suffix (or "inplace=True" alone), empty when not in place."""
    if not inplace:
        return ""
    return ", inplace=True" if leading else "inplace=True"


class Identity(Module):
    """The input itself (torch.nn.Identity; its arguments are ignored, as PyTorch's are)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()

    def forward(self, input):
        return input


class SiLU(Module):
    """x·sigmoid(x) (torch.nn.SiLU)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.silu(input)

    def extra_repr(self) -> str:
        return inplace_repr(self.inplace, leading=False)


class Mish(Module):
    """x·tanh(softplus(x)) (torch.nn.Mish)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.mish(input)

    def extra_repr(self) -> str:
        return inplace_repr(self.inplace, leading=False)


class Hardswish(Module):
    """x·relu6(x + 3)/6 (torch.nn.Hardswish; printed without its inplace flag, as PyTorch prints it)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.hardswish(input)


class Hardsigmoid(Module):
    """relu6(x + 3)/6 (torch.nn.Hardsigmoid)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.hardsigmoid(input)


class LeakyReLU(Module):
    """x where x > 0, negative_slope·x elsewhere (torch.nn.LeakyReLU)."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope = negative_slope
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.leaky_relu(input, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}{inplace_repr(self.inplace)}"


class ELU(Module):
    """x where x > 0, alpha·(eˣ − 1) elsewhere (torch.nn.ELU)."""

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha = alpha
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.elu(input, alpha=self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}{inplace_repr(self.inplace)}"


class SELU(Module):
    """scale·elu(x, alpha) with PyTorch's constants (torch.nn.SELU)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.selu(input)

    def extra_repr(self) -> str:
        return inplace_repr(self.inplace, leading=False)


class CELU(ELU):
    """x where x > 0, alpha·(e^(x/alpha) − 1) elsewhere (torch.nn.CELU)."""

    def forward(self, input: Tensor) -> Tensor:
        return F.celu(input, alpha=self.alpha)


class Hardtanh(Module):
    """x clamped to [min_val, max_val] (torch.nn.Hardtanh; min_value/max_value are its deprecated names)."""

    def __init__(
        self,
        min_val: float = -1.0,
        max_val: float = 1.0,
        inplace: bool = False,
        min_value: float | None = None,
        max_value: float | None = None,
    ) -> None:
        super().__init__()
        if min_value is not None:
            warnings.warn("keyword argument `min_value` is deprecated and rename to `min_val`", FutureWarning, 2)
            min_val = min_value
        if max_value is not None:
            warnings.warn("keyword argument `max_value` is deprecated and rename to `max_val`", FutureWarning, 2)
            max_val = max_value
        if not max_val > min_val:
            raise AssertionError(f"Hardtanh: max_val ({max_val}) must be greater than min_val ({min_val})")
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.hardtanh(input, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}{inplace_repr(self.inplace)}"


class ReLU6(Hardtanh):
    """min(max(x, 0), 6) (torch.nn.ReLU6: Hardtanh(0, 6))."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(0.0, 6.0, inplace)

    def extra_repr(self) -> str:
        return inplace_repr(self.inplace, leading=False)


class Softplus(Module):
    """log(1 + exp(beta·x))/beta, x itself where beta·x > threshold (torch.nn.Softplus)."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input: Tensor) -> Tensor:
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


def implicit_softmax_dim(name: str, ndim: int) -> int:
    """PyTorch's choice of dim when a Softmax/LogSoftmax was made without one (deprecated, with its
    warning): 0 for 0-, 1- and 3-d inputs, else 1."""
    warnings.warn(
        f"Implicit dimension choice for {name} has been deprecated. Change the call to include dim=X as an argument.",
        stacklevel=4,
    )
    return 0 if ndim in (0, 1, 3) else 1


class Softmax(Module):
    """exp(x) / Σ exp(x) along `dim` (torch.nn.Softmax; dim=None picks PyTorch's implicit dim, with its warning)."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        dim = self.dim if self.dim is not None else implicit_softmax_dim("softmax", input.ndim)
        return F.softmax(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Module):
    """x − log Σ exp(x) along `dim` (torch.nn.LogSoftmax; dim=None as Softmax's)."""

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        dim = self.dim if self.dim is not None else implicit_softmax_dim("log_softmax", input.ndim)
        return F.log_softmax(input, dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Tanhshrink(Module):
    """x − tanh(x) (torch.nn.Tanhshrink)."""

    def forward(self, input: Tensor) -> Tensor:
        return F.tanhshrink(input)


class Softshrink(Module):
    """torch.nn.Softshrink(lambd): x ∓ λ outside [−λ, λ], 0 inside."""

    def __init__(self, lambd: float = 0.5) -> None:
        super().__init__()
        self.lambd = lambd

    def forward(self, input: Tensor) -> Tensor:
        return F.softshrink(input, self.lambd)

    def extra_repr(self) -> str:
        return str(self.lambd)


class Hardshrink(Softshrink):
    """torch.nn.Hardshrink(lambd): x where |x| > λ, else 0."""

    def forward(self, input: Tensor) -> Tensor:
        return F.hardshrink(input, self.lambd)


class Unflatten(Module):
    """Dim `dim` split into `unflattened_size` (torch.nn.Unflatten; one size may be −1): a reshape."""

    def __init__(self, dim: int, unflattened_size) -> None:
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise TypeError(f"Unflatten: dim must be an int (named dims are not supported), got {type(dim).__name__}")
        if not isinstance(unflattened_size, (tuple, list)) or not all(
            isinstance(size, int) and not isinstance(size, bool) for size in unflattened_size
        ):
            raise TypeError("unflattened_size must be tuple of ints, but found type " + type(unflattened_size).__name__)
        self.dim = dim
        self.unflattened_size = unflattened_size

    def forward(self, input: Tensor) -> Tensor:
        shape, sizes = input.shape, tuple(self.unflattened_size)
        if not -len(shape) <= self.dim < len(shape):
            raise ShapeError(f"{user_source_line()}: Unflatten: dim {self.dim} is out of range for {input.type}")
        dim = self.dim % len(shape)
        known = math.prod(size for size in sizes if size != -1)
        if -1 in sizes:
            fits = sizes.count(-1) == 1 and known != 0 and shape[dim] % known == 0
        else:
            fits = known == shape[dim]
        if not fits:
            raise ShapeError(
                f"{user_source_line()}: unflatten: Provided sizes {list(sizes)} don't multiply up to the size of "
                f"dim {dim} ({shape[dim]}) in the input tensor"
            )
        return input.reshape(*shape[:dim], *sizes, *shape[dim + 1 :])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, unflattened_size={self.unflattened_size}"
