"""A PyTorch name meganeura lacks, as a Tensor method (`x.item()`) or a `meganeura` name
(`mn.from_numpy`), raises MissingName (an AttributeError) saying what to use, as `F`, `nn` and `optim`
names do (meganeura/pytorch_names.py); attribute access that should work still does."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from conftest import trace_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn
from meganeura.ir.graph import TensorType
from meganeura.ir.trace import Tracer, tracing
from meganeura.pytorch_names import ANOTHER_WAY, MissingName
from meganeura.tensor import Tensor


def traced_tensor() -> Tensor:
    tracer = Tracer()
    with tracing(tracer):
        return trace_leaf(tracer, "input", "x", TensorType((2, 3)))


def test_a_missing_tensor_method_says_what_to_use():
    x = traced_tensor()
    cases = [
        (lambda: x.item(), r"meganeura.Tensor has no .item. \(PyTorch.s torch.Tensor.item\): a traced Tensor has no"),
        (lambda: x.masked_select(x > 0), r"torch.Tensor.masked_select\): x.masked_fill"),
        (lambda: x.exp_(), r"no 'exp_' \(PyTorch's torch.Tensor.exp_\): traced tensors are not modified in place: "
                           r"x = x.exp\(...\)"),
        (lambda: x.sofmax(1), r"no 'sofmax'; methods here that are close: softmax"),
        (lambda: x.no_such_thing, r"^meganeura.Tensor has no 'no_such_thing'$"),
    ]  # fmt: skip
    for attempt, message in cases:
        with pytest.raises(MissingName, match=message):
            attempt()
    assert not hasattr(x, "item") and hasattr(x, "exp") and hasattr(x, "shape")  # an AttributeError for hasattr
    assert getattr(x, "numpy", None) is None


def test_tensor_attribute_access_copies_and_pickles_as_before():
    x = traced_tensor()
    assert x.shape == (2, 3) and x.T.shape == (3, 2) and x.ndim == 2
    clone = copy.copy(x)
    assert clone.node == x.node and clone.tracer is x.tracer
    bare = Tensor.__new__(Tensor)  # as pickle and copy build it: no fields yet, and no recursion
    for name in ("node", "tracer", "__setstate__", "_private"):
        with pytest.raises(AttributeError) as error:
            getattr(bare, name)
        assert not isinstance(error.value, MissingName), name
    bare.node, bare.tracer = 3, None
    assert pickle.loads(pickle.dumps(bare)).node == 3
    parameter = nn.Parameter(np.ones((2, 2), np.float32))  # a Tensor outside a trace
    assert parameter.shape == (2, 2) and np.array_equal(parameter.numpy(), np.ones((2, 2)))
    with pytest.raises(MissingName, match="torch.Tensor.backward"):
        parameter.backward()


def test_a_missing_meganeura_name_says_what_to_use():
    cases = [
        (lambda: mn.from_numpy, r"meganeura has no 'from_numpy' \(PyTorch's torch.from_numpy\): pass arrays as inputs"),
        (lambda: mn.layer_norm, r"meganeura has no 'layer_norm' \(PyTorch's torch.layer_norm\): meganeura.functional "
                                r"has it: F.layer_norm"),
        (lambda: mn.no_grad, r"torch.no_grad\): a program compiled without an optimizer"),
        (lambda: mn.cta, r"^meganeura has no 'cta'; names here that are close: cat"),
    ]  # fmt: skip
    for attempt, message in cases:
        with pytest.raises(MissingName, match=message):
            attempt()
    assert not hasattr(mn, "from_numpy") and hasattr(mn, "compile")
    from meganeura import checkpoint  # a submodule not yet imported is still found

    assert callable(checkpoint.save)


def test_the_hints_name_only_what_meganeura_lacks():
    """A hint for a name that exists would never be shown: the tables list missing names only."""
    x = traced_tensor()
    for owner, names in ANOTHER_WAY.items():
        for name in names:
            if owner == "meganeura.Tensor":
                assert not hasattr(type(x), name), name
            else:
                module = {"meganeura": mn, "meganeura.functional": F, "meganeura.nn": nn}.get(owner)
                if module is not None:
                    assert name not in vars(module), f"{owner}.{name}"
