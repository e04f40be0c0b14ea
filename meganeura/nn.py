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
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from meganeura import functional as F
from meganeura.ir.graph import TensorType
from meganeura.ir.trace import Tensor, active_tracer

_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seed the generator that initialises parameters (like torch.manual_seed)."""
    global _rng
    _rng = np.random.default_rng(seed)


class ParameterStorage(Protocol):
    """Where a parameter's current value lives once a program owns it (a GPU buffer)."""

    def read(self) -> np.ndarray: ...

    def write(self, value: np.ndarray) -> None: ...


class Parameter(Tensor):
    """A trainable array. Its value lives on the host until a compiled program moves it to the GPU.

    While a model is traced, a Parameter acts as the Tensor of its `param` leaf.
    """

    def __init__(self, data: np.ndarray) -> None:
        self._host = np.array(data, dtype=np.float32)
        self.storage: ParameterStorage | None = None

    # Tracing: resolve to this parameter's leaf in the active trace.
    @property
    def tracer(self):
        return active_tracer()

    @property
    def node(self) -> int:
        tracer = active_tracer()
        bound = getattr(tracer, "parameter_nodes", {}).get(id(self))
        if bound is None:
            raise ValueError(
                "a Parameter that is not registered in the compiled model was used; assign it to a Module attribute"
            )
        return bound

    @property
    def type(self) -> TensorType:
        return TensorType(self._host.shape, "f32")

    def numpy(self) -> np.ndarray:
        """A copy of the current value (read back from the GPU when a program owns it)."""
        return self.storage.read() if self.storage is not None else self._host.copy()

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


def uniform(bound: float, shape: tuple[int, ...]) -> np.ndarray:
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


class Module:
    """Base class of models: attributes that are Parameters or Modules are registered in order."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() at the start of your Module's __init__")
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

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
        """Copies of the current parameter values by dotted name (PyTorch's names)."""
        return {name: param.numpy() for name, param in self.named_parameters()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Set every parameter from `state`; names and shapes are all checked before anything changes."""
        params = dict(self.named_parameters())
        check_state_dict(params, state)
        for name, param in params.items():
            param.copy_(state[name])

    def __repr__(self) -> str:
        children = "".join(f"\n  ({name}): {module!r}".replace("\n", "\n  ") for name, module in self._modules.items())
        return f"{type(self).__name__}({self.extra_repr()}{children}{chr(10) if children else ''})"

    def extra_repr(self) -> str:
        return ""


def check_state_dict(params: dict[str, Parameter], state: dict[str, Any]) -> None:
    """Raise a KeyError/ValueError naming every mismatch between a model's parameters and `state`."""
    missing = [name for name in params if name not in state]
    unexpected = [name for name in state if name not in params]
    if missing or unexpected:
        raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
    for name, param in params.items():
        shape = tuple(np.shape(state[name]))
        if shape != param.shape:
            raise ValueError(f"load_state_dict: {name} has shape {param.shape} in the model, {shape} in the state")
        if not np.all(np.isfinite(np.asarray(state[name], dtype=np.float64))):
            raise ValueError(f"load_state_dict: {name} contains NaN or infinity")


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


class Sigmoid(Module):
    """The logistic function as a module."""

    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Tanh(Module):
    """tanh as a module."""

    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


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
