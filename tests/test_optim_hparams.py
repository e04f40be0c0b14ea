"""Run-time hyper-parameters (issue 11 item 1): the optimizer given to compile() stays live."""

from __future__ import annotations

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

SPEC = {"x": mn.InputSpec((5, 7), "f32"), "y": mn.InputSpec((5,), "i32")}


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def batch():
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(5, 7)).astype(np.float32), "y": rng.integers(0, 3, 5)}


def sgd_program(lr, **kwargs):
    mn.manual_seed(3)
    model = nn.Linear(7, 3)
    opt = optim.SGD(model.parameters(), lr=lr, **kwargs)
    return model, opt, mn.compile(model, ce, SPEC, opt)


def test_setting_lr_changes_the_next_step_without_recompiling():
    model, opt, program = sgd_program(0.0)
    kernels, compiled = list(program.compiled.kernels), program.compiled
    before = program.state_dict()
    program.train_step(**batch())  # lr 0: nothing moves
    np.testing.assert_array_equal(program.state_dict()["weight"], before["weight"])
    opt.lr = 0.5
    program.train_step(**batch())
    after_half = program.state_dict()
    moved = after_half["weight"] - before["weight"]
    assert np.abs(moved).max() > 0
    opt.param_groups[0]["lr"] = 0.25  # PyTorch's spelling
    assert opt.lr == 0.25
    _, _, reference = sgd_program(0.5)
    reference.train_step(**batch())  # one step at lr 0.5 from the same start: the same weights
    np.testing.assert_allclose(after_half["weight"], reference.state_dict()["weight"], rtol=1e-6, atol=1e-7)
    assert program.compiled is compiled and list(program.compiled.kernels) == kernels


def test_parameter_groups_have_their_own_weight_decay():
    mn.manual_seed(3)
    model = nn.Linear(7, 3)
    opt = optim.SGD([{"params": [model.weight], "weight_decay": 0.5}, {"params": [model.bias]}], lr=0.0)
    program = mn.compile(model, ce, SPEC, opt)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.5, 0.0]
    start = program.state_dict()
    opt.param_groups[0]["lr"] = 0.1  # only the weights' group moves
    program.train_step(**batch())
    now = program.state_dict()
    np.testing.assert_array_equal(now["bias"], start["bias"])
    assert np.abs(now["weight"] - start["weight"]).max() > 0


def test_constructor_forms_and_errors():
    model = nn.Linear(2, 2)
    assert optim.AdamW(model.parameters(), lr=0.1).lr == 0.1
    assert optim.AdamW(lr=1e-3).param_groups[0]["params"] is None
    with pytest.raises(TypeError, match="parameters"):
        optim.SGD(0.1)
    with pytest.raises(ValueError, match="lr"):
        optim.SGD(model.parameters(), lr=-1.0)
    opt = optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        opt.lr = float("nan")
