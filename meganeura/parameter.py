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
"""

from __future__ import annotations

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

    def __init__(self, data: np.ndarray) -> None:
        self._host = np.array(data, dtype=np.float32)
        self.storage: ParameterStorage | None = None

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

    def detach(self) -> Parameter:
        """Outside a trace, the parameter itself (`p.detach().cpu().numpy()` reads its value); inside
        one there is no stop-gradient op yet, so refuse rather than silently keep the gradient."""
        if is_tracing():
            raise NotImplementedError("detach() inside a traced forward is unsupported (there is no stop-gradient op)")
        return self

    def cpu(self) -> Parameter:
        """The parameter itself: `numpy()` reads its value back from wherever it lives."""
        return self

    def copy_(self, value: np.ndarray) -> None:
        """Overwrite the value; the shape must match."""
        value = np.asarray(value, dtype=np.float32)
        if value.shape != self._host.shape:
            raise ValueError(f"parameter has shape {self._host.shape}, got {value.shape}")
        if self.storage is not None:
            self.storage.write(value)
        else:
            self._host = value.copy()

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
        super().__init__(data)
        given = np.asarray(data).dtype
        if given.kind in "iu":
            self.state_dtype = given

    def update(self, value: Tensor) -> None:
        """Replace this buffer by `value` at the end of the traced step; later reads in the same
        forward see `value` (as in PyTorch, where the update is in place)."""
        if value.shape != self.shape:
            raise ValueError(f"buffer update of shape {list(value.shape)}, expected {list(self.shape)}")
        active_tracer().update_buffer(self, value.node)

    def __repr__(self) -> str:
        return f"Buffer(shape={self._host.shape})"
