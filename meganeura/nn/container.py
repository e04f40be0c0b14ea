"""Containers with torch.nn's names and semantics: `Sequential`, `ModuleList`, `ModuleDict`,
`ParameterList`, `ParameterDict` (indexing, slicing, append/insert/extend/pop, deletion with
renumbering, and PyTorch's printing: ModuleList folds repeated children into `(0-2): 3 x …`).

A module's members live both in its registries (`_modules`, `_parameters`) and as attributes, so
renumbering after a deletion rewrites both (`renumbered`)."""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain
from typing import Any

import numpy as np

from meganeura.nn.module import Module, add_indent
from meganeura.parameter import Buffer, Parameter
from meganeura.tensor import Tensor


def absolute_index(index: int, size: int) -> int:
    """`index` in [0, size), negative ones counted from the end; IndexError outside, as a list's."""
    index = operator.index(index)
    if not -size <= index < size:
        raise IndexError(f"index {index} is out of range")
    return index % size if size else index


def renumbered(module: Module, members: dict, values: list) -> None:
    """Replace the members named "0", "1", … of `module` by `values`, numbered again from 0."""
    for name in list(members):
        members.pop(name)
        module.__dict__.pop(name, None)
    for index, value in enumerate(values):
        setattr(module, str(index), value)


class Sequential(Module):
    """Modules applied in order; children are named "0", "1", … (or by an OrderedDict's keys), as
    torch.nn.Sequential: indexing and slicing (a slice keeps the children's names), assignment,
    deletion (renumbering), append, insert, extend, pop, +, *."""

    def __init__(self, *args) -> None:
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for index, module in enumerate(args):
                self.add_module(str(index), module)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(OrderedDict(list(self._modules.items())[index]))
        return list(self._modules.values())[absolute_index(index, len(self))]

    def __setitem__(self, index: int, module: Module) -> None:
        key = list(self._modules)[absolute_index(index, len(self))]
        setattr(self, key, module)

    def __delitem__(self, index) -> None:
        keys = list(self._modules)
        doomed = keys[index] if isinstance(index, slice) else [keys[absolute_index(index, len(self))]]
        for key in doomed:
            delattr(self, key)
        renumbered(self, self._modules, list(self._modules.values()))

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __add__(self, other: Sequential) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but {type(other)} is given.")
        return Sequential(*self, *other)

    def __iadd__(self, other: Sequential) -> Sequential:
        if not isinstance(other, Sequential):
            raise ValueError(f"add operator supports only objects of Sequential class, but {type(other)} is given.")
        offset = len(self)
        for index, module in enumerate(other):
            self.add_module(str(index + offset), module)
        return self

    def __mul__(self, times: int) -> Sequential:
        if not isinstance(times, int):
            raise TypeError(f"unsupported operand type(s) for *: {type(self)} and {type(times)}")
        if times <= 0:
            raise ValueError(f"Non-positive multiplication factor {times} for {type(self)}")
        return Sequential(*(list(self) * times))  # the same modules again, as torch's (shared weights)

    __rmul__ = __mul__

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self

    def insert(self, index: int, module: Module) -> Sequential:
        if not isinstance(module, Module):
            raise AssertionError(f"module should be of type: {Module}")
        size = len(self)
        if not -size <= index <= size:
            raise IndexError(f"Index out of range: {index}")
        modules = list(self)
        modules.insert(index + size if index < 0 else index, module)
        renumbered(self, self._modules, modules)
        return self

    def extend(self, sequential: Iterable[Module]) -> Sequential:
        for module in sequential:
            self.append(module)
        return self

    def pop(self, index) -> Module:
        module = self[index]
        del self[index]
        return module

    def forward(self, *args, **kwargs):
        """The children applied in turn to the one input, given by position or by any name (a
        compiled Sequential receives its input by the name in compile(inputs=...))."""
        given = [*args, *kwargs.values()]
        if len(given) != 1:
            raise TypeError(f"Sequential.forward() takes one input, got {len(args)} positional and {sorted(kwargs)}")
        (value,) = given
        for module in self:
            value = module(value)
        return value


class ModuleList(Module):
    """A list of modules registered as children "0", "1", … (torch.nn.ModuleList): indexing,
    slicing (a new ModuleList), assignment, deletion (renumbering), append, insert, extend, pop, +."""

    def __init__(self, modules: Iterable[Module] | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(list(self._modules.values())[index])
        return self._modules[str(absolute_index(index, len(self)))]

    def __setitem__(self, index: int, module: Module) -> None:
        setattr(self, str(absolute_index(index, len(self))), module)

    def __delitem__(self, index) -> None:
        if isinstance(index, slice):
            for position in range(len(self))[index]:
                delattr(self, str(position))
        else:
            delattr(self, str(absolute_index(index, len(self))))
        renumbered(self, self._modules, list(self._modules.values()))

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList(chain(self, other))

    def insert(self, index: int, module: Module) -> None:
        modules = list(self)
        modules.insert(index, module)
        renumbered(self, self._modules, modules)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        if not isinstance(modules, Iterable):
            raise TypeError(f"ModuleList.extend should be called with an iterable, but got {type(modules).__name__}")
        offset = len(self)
        for index, module in enumerate(modules):
            self.add_module(str(offset + index), module)
        return self

    def pop(self, index) -> Module:
        module = self[index]
        del self[index]
        return module

    def __repr__(self) -> str:
        """PyTorch's: runs of children that print alike folded into `(i-j): n x child`."""
        reprs = [repr(module) for module in self]
        if not reprs:
            return self._get_name() + "()"
        runs: list[list] = []  # [first, last, text]
        for index, text in enumerate(reprs):
            if runs and runs[-1][2] == text:
                runs[-1][1] = index
            else:
                runs.append([index, index, text])
        lines = [
            add_indent(f"({first}): {text}" if first == last else f"({first}-{last}): {last - first + 1} x {text}", 2)
            for first, last, text in runs
        ]
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"


class ModuleDict(Module):
    """Modules by name, registered as children in insertion order (torch.nn.ModuleDict)."""

    def __init__(self, modules: Mapping[str, Module] | Iterable | None = None) -> None:
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        if key not in self._modules:
            raise KeyError(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def clear(self) -> None:
        for key in list(self._modules):
            del self[key]

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules) -> None:
        """Add or replace entries from a mapping (in its order) or from (name, module) pairs."""
        if not isinstance(modules, Iterable):
            raise TypeError(
                f"ModuleDict.update should be called with an iterable of key/value pairs, but got "
                f"{type(modules).__name__}"
            )
        pairs = modules.items() if isinstance(modules, (Mapping, ModuleDict)) else modules
        for index, pair in enumerate(pairs):
            if not isinstance(pair, Iterable):
                raise TypeError(
                    f"ModuleDict update sequence element #{index} should be Iterable; is{type(pair).__name__}"
                )
            if len(pair) != 2:
                raise ValueError(f"ModuleDict update sequence element #{index} has length {len(pair)}; 2 is required")
            self[pair[0]] = pair[1]


def as_parameter(value: Any) -> Any:
    """An array (numpy, or anything array-like but a Module or a traced Tensor) made an
    nn.Parameter, as torch's ParameterList/ParameterDict wrap tensors; anything else as it is."""
    if isinstance(value, (Parameter, Module, Tensor)) or value is None:
        return value
    if isinstance(value, np.ndarray) or (hasattr(value, "__array__") and hasattr(value, "shape")):
        from meganeura.weights import state_array

        return Parameter(state_array(value))
    return value


def parameter_line(key: Any, value: Any) -> str:
    """One line of a ParameterList/ParameterDict's extra_repr, as PyTorch prints it (with the
    numpy dtype name in place of torch's: float32 for torch.float32)."""
    if isinstance(value, Parameter):
        kind = "Parameter" if not isinstance(value, Buffer) else "Tensor"
        size = "x".join(str(d) for d in value.shape)
        return f"  ({key}): {kind} containing: [{value.state_dtype} of size {size}]"
    return f"  ({key}): Object of type: {type(value).__name__}"


class ParameterList(Module):
    """Parameters in a list, registered as "0", "1", … (torch.nn.ParameterList); arrays put in
    are made Parameters."""

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._size = 0
        if values is not None:
            self.extend(values)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(self[i] for i in range(len(self))[index])
        return getattr(self, str(absolute_index(index, len(self))))

    def __setitem__(self, index: int, value: Any) -> None:
        setattr(self, str(absolute_index(index, len(self))), as_parameter(value))

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))

    def __iadd__(self, values: Iterable[Any]) -> ParameterList:
        return self.extend(values)

    def append(self, value: Any) -> ParameterList:
        self._size += 1
        self[self._size - 1] = value
        return self

    def extend(self, values: Iterable[Any]) -> ParameterList:
        if not isinstance(values, Iterable) or isinstance(values, (np.ndarray, Parameter)):
            raise TypeError(f"ParameterList.extend should be called with an iterable, but got {type(values).__name__}")
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        return "\n".join(parameter_line(index, value) for index, value in enumerate(self))

    def __call__(self, *args, **kwargs):
        raise RuntimeError("ParameterList should not be called.")


class ParameterDict(Module):
    """Parameters by name (torch.nn.ParameterDict); arrays put in are made Parameters. As in
    PyTorch, update() from a plain dict adds its entries in sorted key order (an OrderedDict's
    and a ParameterDict's in theirs)."""

    def __init__(self, parameters: Any = None) -> None:
        super().__init__()
        self._keys: dict[str, None] = {}
        if parameters is not None:
            self.update(parameters)

    @staticmethod
    def checked_key(key: Any) -> str:
        if not isinstance(key, str):
            raise TypeError(
                "Index given to ParameterDict cannot be used as a key as it is not a string "
                f"(type is '{type(key).__name__}')."
            )
        return key

    def __getitem__(self, key: str) -> Any:
        return getattr(self, self.checked_key(key))

    def __setitem__(self, key: str, value: Any) -> None:
        self._keys[key] = None
        setattr(self, self.checked_key(key), as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        delattr(self, self.checked_key(key))

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __reversed__(self) -> Iterator[str]:
        return reversed(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def copy(self) -> ParameterDict:
        return ParameterDict(OrderedDict((key, self[key]) for key in self._keys))

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def clear(self) -> None:
        for key in list(self._keys):
            del self[key]

    def pop(self, key: str) -> Any:
        value = self[key]
        del self[key]
        return value

    def popitem(self) -> tuple[str, Any]:
        key = next(reversed(self._keys))
        return key, self.pop(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def fromkeys(self, keys: Iterable[str], default: Any = None) -> ParameterDict:
        return ParameterDict((key, default) for key in keys)

    def keys(self):
        return self._keys.keys()

    def items(self):
        return ((key, self[key]) for key in self._keys)

    def values(self):
        return (self[key] for key in self._keys)

    def update(self, parameters) -> None:
        if not isinstance(parameters, Iterable):
            raise TypeError(
                "ParametersDict.update should be called with an iterable of key/value pairs, but got "
                f"{type(parameters).__name__}"
            )
        if isinstance(parameters, (OrderedDict, ParameterDict)):
            pairs = list(parameters.items())
        elif isinstance(parameters, Mapping):
            pairs = sorted(parameters.items())
        else:
            pairs = list(parameters)
        for index, pair in enumerate(pairs):
            if not isinstance(pair, Iterable):
                raise TypeError(
                    f"ParameterDict update sequence element #{index} should be Iterable; is{type(pair).__name__}"
                )
            if len(pair) != 2:
                raise ValueError(
                    f"ParameterDict update sequence element #{index} has length {len(pair)}; 2 is required"
                )
            self[pair[0]] = pair[1]

    def extra_repr(self) -> str:
        return "\n".join(parameter_line(key, value) for key, value in self.items())

    def __call__(self, *args, **kwargs):
        raise RuntimeError("ParameterDict should not be called.")
