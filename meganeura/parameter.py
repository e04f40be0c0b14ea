"""The model's state: trainable parameters (`nn.Parameter`) and module buffers (`nn.Buffer`).

A Parameter is a Tensor whose value lives on the host until a compiled program moves it to a
device buffer; while a model is traced it stands for its `param` (or, for a Buffer, `state`)
leaf. It lives below both `nn` (the modules that own parameters) and `functional` (batch_norm
updates a module's buffers), so that neither imports the other.

Outside a trace a Parameter answers what a PyTorch user reaches for: `.data` (itself; assigning
it copies the value in), `.detach()` and `.cpu()` (itself), `.numpy()` (a copy of the current
value) and `np.asarray(p)`. An integer buffer (BatchNorm's num_batches_tracked) is float32 on
the device, where the step counts in f32 (exact to 2^24), and its integer dtype at the state
dict boundary (`numpy()`, `state_dtype`), as in PyTorch.

`requires_grad` (PyTorch's flag: `p.requires_grad = False`, `p.requires_grad_(False)`) decides
whether a training step compiled afterwards computes the parameter's gradient and updates it. A
compiled step is fixed: changing the flag of a parameter that some compiled training step was
built with the other value warns (`requires_grad_changed`); the change applies to the programs
compiled after it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Protocol

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.trace import active_tracer
from meganeura.tensor import Tensor


def is_tracing() -> bool:
    try:
        active_tracer()
    except RuntimeError:
        return False
    return True


class ParameterStorage(Protocol):
    """Where a parameter's current value lives once a program owns it (a GPU buffer)."""

    def read(self) -> np.ndarray: ...

    def write(self, value: np.ndarray) -> None: ...


class Parameter(Tensor):
    """A trainable array. Its value lives on the host until a compiled program moves it to the GPU.

    While a model is traced, a Parameter acts as the Tensor of its `param` leaf.
    """

    state_dtype = np.dtype(np.float32)  # the dtype numpy() and state_dict() give

    def __init__(self, data: np.ndarray, requires_grad: bool = True) -> None:
        self._host = np.array(data, dtype=np.float32)
        self.storage: ParameterStorage | None = None
        self._requires_grad = bool(requires_grad)
        # The requires_grad values of the training steps compiled with this parameter (compiler.trace_step),
        # and the values a change to was already warned about.
        self.compiled_requires_grad: set[bool] = set()
        self.warned_requires_grad: set[bool] = set()

    @property
    def requires_grad(self) -> bool:
        """Whether training steps compiled from now on compute this parameter's gradient and update it."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        requires_grad_changed([self], value, stacklevel=2)

    def requires_grad_(self, requires_grad: bool = True) -> Parameter:
        """Set `requires_grad` (torch.Tensor.requires_grad_); returns the parameter."""
        requires_grad_changed([self], requires_grad, stacklevel=2)
        return self

    # Tracing: resolve to this parameter's leaf in the active trace.
    @property
    def tracer(self):
        return active_tracer()

    @property
    def node(self) -> int:
        bound = active_tracer().node_of(self)
        if bound is None:
            raise ValueError(
                f"a {type(self).__name__} that is not registered in the compiled model was used; assign it to a "
                "Module attribute"
            )
        return bound

    @property
    def type(self) -> TensorType:
        return TensorType(self._host.shape, "f32")

    def numpy(self) -> np.ndarray:
        """A copy of the current value (read back from the GPU when a program owns it), in `state_dtype`."""
        value = self.storage.read() if self.storage is not None else self._host.copy()
        if self.state_dtype.kind != "f":
            return np.asarray(np.rint(value), dtype=self.state_dtype)
        return value

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """`np.asarray(p)`: the current value (always a fresh copy: the live one may be on the GPU)."""
        if copy is False:
            raise ValueError("a Parameter's value cannot be viewed without a copy (it may live on the GPU)")
        value = self.numpy()
        return value if dtype is None else value.astype(dtype)

    @property
    def data(self) -> Parameter:
        """The parameter itself, outside autodiff (torch's `p.data`): `p.data.copy_(x)`, `p.data.numpy()`."""
        return self

    @data.setter
    def data(self, value) -> None:
        """`p.data = x` copies x in; unlike PyTorch the shape cannot change (programs hold the buffer)."""
        from meganeura.weights import state_array

        self.copy_(state_array(value))

    def detach(self):
        """Outside a trace, the parameter itself (`p.detach().cpu().numpy()` reads its value);
        inside one, its value with no gradient (torch's detach: a `detach` node)."""
        if is_tracing():
            return Tensor.detach(self)
        return self

    def cpu(self) -> Parameter:
        """The parameter itself: `numpy()` reads its value back from wherever it lives."""
        return self

    def copy_(self, value: np.ndarray) -> Parameter:
        """Overwrite the value (on the device when a program owns it); the shape must match.
        Returns the parameter, as torch's in-place methods do."""
        value = np.asarray(value, dtype=np.float32)
        if value.shape != self._host.shape:
            raise ValueError(f"parameter has shape {self._host.shape}, got {value.shape}")
        if self.storage is not None:
            self.storage.write(value)
        else:
            self._host = value.copy()
        return self

    def __repr__(self) -> str:
        return f"Parameter(shape={self._host.shape})"


class Buffer(Parameter):
    """A persistent array that is part of the model's state but not trained (torch.nn.Buffer):
    BatchNorm's running statistics. It is a Parameter that autodiff and the optimizer never see.

    Buffers are traced as `state` leaves named by their dotted name; a module updates one during
    the forward with `buffer.update(value)` (recorded in `graph.updates`, applied on the device at
    the end of the step). Like a parameter, its value moves to a device buffer that every program
    compiled from the model shares, so an inference program sees what a training step updated.

    A buffer made from integer data keeps that dtype at the state dict boundary (`numpy()`) and is
    float32 on the device and in the trace.
    """

    def __init__(self, data: np.ndarray) -> None:
        super().__init__(data, requires_grad=False)
        given = np.asarray(data).dtype
        if given.kind in "iu":
            self.state_dtype = given

    @property
    def requires_grad(self) -> bool:
        return False

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> Buffer:
        """A buffer is never trained: only requires_grad=False is accepted."""
        if requires_grad:
            raise ValueError("a Buffer is not trained (requires_grad=True): make it an nn.Parameter to train it")
        return self

    def update(self, value: Tensor) -> None:
        """Replace this buffer by `value` at the end of the traced step; later reads in the same
        forward see `value` (as in PyTorch, where the update is in place)."""
        if value.shape != self.shape:
            raise ValueError(f"buffer update of shape {list(value.shape)}, expected {list(self.shape)}")
        active_tracer().update_buffer(self, value.node)

    def __repr__(self) -> str:
        return f"Buffer(shape={self._host.shape})"


def requires_grad_changed(params: Iterable[Parameter], requires_grad: bool, stacklevel: int = 1) -> None:
    """Set `requires_grad` on every parameter of `params`; where a training step was already
    compiled with the other value, warn once per value (that step keeps what it was compiled
    with). `stacklevel` as warnings.warn's, counted from the caller."""
    flag = bool(requires_grad)
    stale = []
    for param in params:
        param._requires_grad = flag
        if any(value != flag for value in param.compiled_requires_grad) and flag not in param.warned_requires_grad:
            stale.append(param)
    if stale:
        warnings.warn(
            f"requires_grad={flag} on {len(stale)} parameter{'s' if len(stale) > 1 else ''} of a compiled training "
            "step: a compiled step is fixed and keeps training what it was compiled to train; compile the program "
            "again for the change to take effect (it shares the weights)",
            stacklevel=stacklevel + 1,
        )
        for param in stale:
            param.warned_requires_grad.add(flag)
