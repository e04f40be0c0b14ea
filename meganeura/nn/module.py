"""`nn.Module`, the base class of models, with torch.nn.Module's API: attributes that are
Parameters, Buffers or Modules are registered in order; the iterators (`named_parameters`,
`named_modules`, `children`…), `apply`, `add_module`/`register_*`, `get_submodule`/
`get_parameter`, `state_dict`/`load_state_dict`, `train`/`eval`, `requires_grad_`, forward hooks
and `__repr__` behave and print as PyTorch's.

A parameter shared by two modules (tied weights, `lm_head.weight = wte.weight`) is yielded once by
`named_parameters()` (under its first name), and appears under every name in `state_dict()`, as in
PyTorch; `load_state_dict` takes either name or both (meganeura/weights.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

from meganeura.ir.trace import LAYER_CALLS, user_source_line
from meganeura.parameter import Buffer, Parameter, requires_grad_changed
from meganeura.weights import load_state


class RemovableHandle:
    """What `register_forward_hook` returns: `handle.remove()` unregisters the hook (also as a
    context manager), as torch.utils.hooks.RemovableHandle."""

    def __init__(self, hooks: dict[int, Callable], key: int) -> None:
        self.hooks, self.id = hooks, key

    def remove(self) -> None:
        self.hooks.pop(self.id, None)

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


_hook_ids = iter(range(1 << 62))  # one id per hook, as torch numbers its handles


def add_indent(text: str, spaces: int) -> str:
    """Every line of `text` but the first indented by `spaces` (torch.nn.modules.module._addindent)."""
    first, *rest = text.split("\n")
    return "\n".join([first, *(" " * spaces + line for line in rest)]) if rest else text


def check_member_name(kind: str, name: Any, module: Module, registered: dict) -> None:
    """PyTorch's checks of a name given to add_module / register_parameter / register_buffer."""
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
    if hasattr(module, name) and name not in registered:
        raise KeyError(f"attribute '{name}' already exists")


class Module:
    """Base class of models: attributes that are Parameters, Buffers or Modules are registered in order.

    A module remembers the user's line that constructed it (`_source`): the ops of a layer that the
    library calls (a child of nn.Sequential) are attributed to that line (ir/trace.py)."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_forward_hooks", {})
        object.__setattr__(self, "_forward_pre_hooks", {})
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_source", user_source_line())

    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("call super().__init__() at the start of your Module's __init__")
        if isinstance(value, Buffer):  # before Parameter: a Buffer is a Parameter that is not trained
            kind = self._buffers
        elif isinstance(value, Parameter):
            kind = self._parameters
        elif isinstance(value, Module):
            kind = self._modules
        else:
            kind = None
        for members in (self._parameters, self._buffers, self._modules):
            if members is not kind:
                members.pop(name, None)
        if kind is not self._buffers:
            self._non_persistent_buffers_set.discard(name)
        if kind is not None:
            kind[name] = value  # a member replaced by one of its kind keeps its place, as in PyTorch
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        for members in (self._parameters, self._buffers, self._modules):
            members.pop(name, None)
        self._non_persistent_buffers_set.discard(name)
        if name in self.__dict__:
            object.__delattr__(self, name)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        if self._forward_pre_hooks:
            args, kwargs = self._run_pre_hooks(args, kwargs)
        result = self.forward(*args, **kwargs)  # a frame user_source_line recognises (LAYER_CALLS)
        if self._forward_hooks:
            result = self._run_hooks(args, kwargs, result)
        return result

    # -- forward hooks (torch's register_forward_pre_hook / register_forward_hook) --------------

    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False):
        """Call `hook(module, args)` (with_kwargs: `hook(module, args, kwargs)`) before each forward;
        a value it returns replaces the arguments. Returns a handle whose remove() unregisters it."""
        return self._add_hook(self._forward_pre_hooks, hook, prepend, with_kwargs)

    def register_forward_hook(
        self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False, always_call: bool = False
    ):
        """Call `hook(module, args, output)` (with_kwargs: `hook(module, args, kwargs, output)`) after
        each forward; a value it returns replaces the output. always_call is not supported."""
        if always_call:
            raise NotImplementedError("register_forward_hook: always_call=True is not supported")
        return self._add_hook(self._forward_hooks, hook, prepend, with_kwargs)

    @staticmethod
    def _add_hook(hooks: dict, hook: Callable, prepend: bool, with_kwargs: bool) -> RemovableHandle:
        key = next(_hook_ids)
        entry = {key: (hook, with_kwargs)}
        if prepend:
            entry |= hooks
            hooks.clear()
        hooks.update(entry)
        return RemovableHandle(hooks, key)

    def _run_pre_hooks(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        for hook, with_kwargs in list(self._forward_pre_hooks.values()):
            if with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        return args, kwargs

    def _run_hooks(self, args: tuple, kwargs: dict, output: Any) -> Any:
        for hook, with_kwargs in list(self._forward_hooks.values()):
            result = hook(self, args, kwargs, output) if with_kwargs else hook(self, args, output)
            if result is not None:
                output = result
        return output

    # -- registering members ---------------------------------------------------------------------

    def add_module(self, name: str, module: Module | None) -> None:
        """Register `module` as the child `name` (torch.nn.Module.add_module; None leaves an empty slot)."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        check_member_name("module", name, self, self._modules)
        if module is None:
            self._modules[name] = None
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, module)

    register_module = add_module

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register `param` as the parameter `name` (None leaves an empty slot, as a bias=False layer's)."""
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign parameter before Module.__init__() call")
        check_member_name("parameter", name, self, self._parameters)
        if param is None:
            self._parameters[name] = None
            object.__setattr__(self, name, None)
        elif not isinstance(param, Parameter) or isinstance(param, Buffer):
            raise TypeError(
                f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                "(torch.nn.Parameter or None required)"
            )
        else:
            setattr(self, name, param)

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Register a non-trained array (e.g. BatchNorm's running statistics) as `name`. A buffer
        that is not `persistent` is part of the step but not of `state_dict()` (rotary tables)."""
        check_member_name("buffer", name, self, self._buffers)
        if tensor is None:
            self._buffers[name] = None
            object.__setattr__(self, name, None)
        else:
            setattr(self, name, tensor if isinstance(tensor, Buffer) else Buffer(tensor))
        if not persistent:
            self._non_persistent_buffers_set.add(name)

    # -- iterating (PyTorch's semantics: pre-order, each module and member once by default) ------

    def named_modules(self, memo: set | None = None, prefix: str = "", remove_duplicate: bool = True):
        """(dotted name, module) for this module ("" or `prefix`) and every submodule, in pre-order;
        a module reachable twice is yielded once unless remove_duplicate=False."""
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is not None:
                yield from module.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """(name, module) of the immediate children, each once."""
        seen: set[int] = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self) -> Iterator[Module]:
        for _, module in self.named_children():
            yield module

    def _named_members(self, members: Callable, prefix: str, recurse: bool, remove_duplicate: bool):
        """torch's _named_members: `members(module)` of each module, by dotted name, each once."""
        seen: set[int] = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for name, value in members(module):
                if value is None or id(value) in seen:
                    continue
                if remove_duplicate:
                    seen.add(id(value))
                yield module_prefix + ("." if module_prefix else "") + name, value

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs in registration order, a shared (tied) parameter once,
        under its first name."""
        return self._named_members(lambda m: m._parameters.items(), prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, Buffer]]:
        """(dotted name, buffer) pairs in registration order, each buffer once."""
        return self._named_members(lambda m: m._buffers.items(), prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Buffer]:
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def named_state(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter and buffer (non-persistent ones too) by dotted name, in state_dict order
        (PyTorch's: each module's parameters, then its buffers, then its children's), each once:
        the leaves a compiled program binds."""
        seen: set[int] = set()
        for name, value in self.state_items(prefix, persistent_only=False):
            if id(value) not in seen:
                seen.add(id(value))
                yield name, value

    def state_items(self, prefix: str = "", persistent_only: bool = True) -> Iterator[tuple[str, Parameter]]:
        """Every (name, parameter or buffer) that PyTorch's state_dict writes, in its order: a tied
        parameter under each of its names."""
        for name, param in self._parameters.items():
            if param is not None:
                yield prefix + name, param
        for name, buffer in self._buffers.items():
            if buffer is not None and not (persistent_only and name in self._non_persistent_buffers_set):
                yield prefix + name, buffer
        for name, module in self._modules.items():
            if module is not None:
                yield from module.state_items(prefix + name + ".", persistent_only)

    # -- looking members up by dotted name -------------------------------------------------------

    def get_submodule(self, target: str) -> Module:
        """The submodule at dotted path `target` ("" is this module), as torch's."""
        module = self
        if target == "":
            return module
        for item in target.split("."):
            if not hasattr(module, item):
                raise AttributeError(f"{type(module).__name__} has no attribute `{item}`")
            module = getattr(module, item)
            if not isinstance(module, Module):
                raise AttributeError(f"`{item}` is not an nn.Module")
        return module

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at dotted path `target` ("fc1.weight")."""
        path, _, name = target.rpartition(".")
        module = self.get_submodule(path)
        if not hasattr(module, name):
            raise AttributeError(f"{type(module).__name__} has no attribute `{name}`")
        param = getattr(module, name)
        if not isinstance(param, Parameter) or isinstance(param, Buffer):
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return param

    def get_buffer(self, target: str) -> Buffer:
        """The buffer at dotted path `target` ("bn.running_mean")."""
        path, _, name = target.rpartition(".")
        module = self.get_submodule(path)
        if not hasattr(module, name):
            raise AttributeError(f"{type(module).__name__} has no attribute `{name}`")
        if name not in module._buffers:
            raise AttributeError(f"`{name}` is not a buffer")
        return getattr(module, name)

    def apply(self, fn: Callable[[Module], Any]) -> Module:
        """`fn` on every child (recursively), then on this module; returns self (torch's apply,
        as in `model.apply(init_weights)`)."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # -- state -------------------------------------------------------------------------------------

    def state_dict(self, *, destination: dict | None = None, prefix: str = "", keep_vars: bool = False) -> dict:
        """Copies of the current parameter and persistent buffer values by dotted name (PyTorch's
        names and order; a tied parameter under each of its names, one array). keep_vars=True gives
        the Parameters themselves."""
        state = {} if destination is None else destination
        values: dict[int, Any] = {}
        for name, value in self.state_items(prefix):
            if keep_vars:
                state[name] = value
            else:
                if id(value) not in values:
                    values[id(value)] = value.numpy()
                state[name] = values[id(value)]
        return state

    def load_state_dict(self, state_dict: dict[str, Any], strict: bool = True, assign: bool = False):
        """Set every parameter and buffer from `state_dict` (numpy arrays, torch tensors, anything
        array-like; `mn.load_safetensors` reads files). Every mismatch — names, shapes, dtypes, NaN —
        is reported at once in one StateDictError, and nothing changes unless everything fits. With
        `strict=False` missing and unexpected names are skipped and returned, as PyTorch does; a tied
        parameter takes either of its names, or both holding the same values (meganeura/weights.py).
        assign=True (replacing the parameter objects) is not supported: values are copied in."""
        if assign:
            raise NotImplementedError("load_state_dict(assign=True) is not supported: values are copied in")
        return load_state(dict(self.state_items()), state_dict, strict)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set requires_grad on every parameter: a training step compiled afterwards neither computes
        the gradients of the frozen ones nor updates them (programs compiled before keep theirs: a
        warning says so)."""
        requires_grad_changed(list(self.parameters()), requires_grad, stacklevel=2)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: a compiled step computes its gradients afresh each step and applies them
        itself (accumulating over k steps is compile(accumulate=k)); kept so ported loops run."""

    # -- training mode -------------------------------------------------------------------------------

    def train(self, mode: bool = True) -> Module:
        """Set training mode (the default) on this module and every submodule; returns self.

        Programs already compiled from this model keep the mode they were compiled in (a compiled
        step is fixed): where that matters (a BatchNorm in the model), switching warns once."""
        return self._set_training(mode, "train")

    def eval(self) -> Module:
        """Evaluation mode: `train(False)` (BatchNorm then normalises with its running statistics)."""
        return self._set_training(False, "eval")

    def _set_training(self, mode: bool, called: str) -> Module:
        """train()/eval() (named by `called`), warning at the caller's line."""
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        compiled = getattr(self, "_compiled_modes", None)
        if compiled and mode not in compiled and not getattr(self, "_mode_warned", False):
            if any(getattr(module, "mode_dependent", False) for module in self.modules()):
                object.__setattr__(self, "_mode_warned", True)
                warnings.warn(
                    f"{type(self).__name__}.{called}(): the programs compiled from this model keep the mode they were "
                    f"compiled in (training={sorted(compiled)[0]}); compile a program after switching to run in the "
                    "new mode (it shares the weights)",
                    stacklevel=3,
                )
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    # -- printing ----------------------------------------------------------------------------------

    def _get_name(self) -> str:
        return type(self).__name__

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        """As PyTorch prints a module: `Name(extra)` or the children indented, one per line."""
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): {add_indent(repr(module), 2)}" for name, module in self._modules.items()]
        lines = extra_lines + child_lines
        text = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                text += extra_lines[0]
            else:
                text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"


LAYER_CALLS.add(Module.__call__.__code__)
