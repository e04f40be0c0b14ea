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


def test_a_hyper_parameter_changed_in_place_reaches_the_device():
    """A step writes the groups' vectors when their values for it differ from the last step's
    (optimizer.hyper_key, step_key): Adam's bias corrections change with every update, and a list
    of betas edited in place is a change too."""
    opt, program = program_of(lambda m: optim.Adam(m.parameters(), lr=0.05))
    leaf = next(iter(opt.hyper_values()))

    def on_device():
        return program.executable.read_state(leaf)

    program.train_step(**batch())
    np.testing.assert_array_equal(on_device(), opt.hyper_values(1)[leaf])
    program.train_step(**batch())  # nothing changed but the step: update 2's bias corrections
    np.testing.assert_array_equal(on_device(), opt.hyper_values(2)[leaf])
    assert not np.array_equal(on_device(), opt.hyper_values(1)[leaf])
    opt.param_groups[0]["betas"] = [0.8, 0.95]
    program.train_step(**batch())
    np.testing.assert_array_equal(on_device(), opt.hyper_values(3)[leaf])
    opt.param_groups[0]["betas"][1] = 0.5
    program.train_step(**batch())
    np.testing.assert_array_equal(on_device(), opt.hyper_values(4)[leaf])
    assert 0.5 in on_device().tolist()


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda m: optim.SGD(m.parameters(), lr=0.1), [0, 0, 0, 1]),
        (lambda m: optim.Adam(m.parameters(), lr=0.05), [0, 1, 2, 3]),
    ],
    ids=["sgd", "adam"],
)
def test_a_step_whose_values_did_not_change_writes_nothing(make, expected):
    """Plain SGD's vector is the same every step: after compile() (which uploads update 1's) nothing
    is written until a value changes (the lr before step 4); Adam's changes with each update
    after the first (its bias corrections)."""
    opt, program = program_of(make)
    writes = []
    write_state = program.executable.write_state

    def counted(name, value):
        writes.append(name)
        write_state(name, value)

    program.executable.write_state = counted
    counts = []
    for step in range(4):
        if step == 3:
            opt.lr = 0.01
        program.train_step(**batch())
        counts.append(len(writes))
    assert counts == expected


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


def program_of(make_optimizer, **compile_options):
    mn.manual_seed(3)
    model = nn.Linear(7, 3)
    opt = make_optimizer(model)
    return opt, mn.compile(model, ce, SPEC, opt, **compile_options)


RUN_TIME_CHANGES = {
    "adamw betas eps wd": (
        lambda m: optim.AdamW(m.parameters(), lr=0.05),
        {"betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.3, "lr": 0.02},
    ),
    "adam wd": (lambda m: optim.Adam(m.parameters(), lr=0.05), {"weight_decay": 0.2, "betas": (0.5, 0.9)}),
    "sgd momentum wd": (
        lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
        {"momentum": 0.5, "weight_decay": 0.1, "lr": 0.3},
    ),
    "sgd dampening": (lambda m: optim.SGD(m.parameters(), lr=0.1, momentum=0.9), {"dampening": 0.4, "momentum": 0.7}),
    "adamw amsgrad": (
        lambda m: optim.AdamW(m.parameters(), lr=0.05, amsgrad=True),
        {"betas": (0.5, 0.9), "weight_decay": 0.2, "lr": 0.02},
    ),
    "rmsprop": (
        lambda m: optim.RMSprop(m.parameters(), lr=0.01, momentum=0.5, centered=True),
        {"alpha": 0.9, "eps": 1e-3, "weight_decay": 0.1, "momentum": 0.8, "lr": 0.02},
    ),
    "adagrad": (
        lambda m: optim.Adagrad(m.parameters(), lr=0.1),
        {"lr_decay": 0.1, "eps": 1e-3, "weight_decay": 0.1, "lr": 0.05},
    ),
    "adamax": (
        lambda m: optim.Adamax(m.parameters(), lr=0.05),
        {"betas": (0.5, 0.9), "eps": 1e-3, "weight_decay": 0.1, "lr": 0.02},
    ),
    "nadam": (  # mu_product (the host's) then runs on with the new β₁ and momentum_decay
        lambda m: optim.NAdam(m.parameters(), lr=0.05),
        {"betas": (0.5, 0.9), "momentum_decay": 0.05, "weight_decay": 0.1, "decoupled_weight_decay": True},
    ),
    "radam": (
        lambda m: optim.RAdam(m.parameters(), lr=0.05, weight_decay=0.1, decoupled_weight_decay=True),
        {"betas": (0.8, 0.9), "eps": 1e-3, "decoupled_weight_decay": False, "lr": 0.02},
    ),
    "adadelta": (
        lambda m: optim.Adadelta(m.parameters(), lr=0.5),
        {"rho": 0.5, "eps": 1e-4, "weight_decay": 0.1, "lr": 0.2},
    ),
}


@pytest.mark.parametrize("name", sorted(RUN_TIME_CHANGES))
def test_every_hyper_parameter_set_at_run_time_steps_as_if_compiled_with_it(name):
    make, changes = RUN_TIME_CHANGES[name]
    opt, program = program_of(make)
    program.train_step(**batch())
    for key, value in changes.items():
        opt.param_groups[0][key] = value
    compiled = program.compiled
    losses = [program.train_step(**batch()) for _ in range(3)]
    # The reference: one step with the first values, then a program compiled with the changed
    # ones, from that step's parameters and optimizer state.
    _, first = program_of(make)
    first.train_step(**batch())
    _, changed = program_of(lambda m: type(make(m))(m.parameters(), **{**make(m).defaults, **changes}))
    changed.load_state_dict(first.state_dict())
    changed.load_optimizer_state_dict(first.optimizer_state_dict())
    expected = [changed.train_step(**batch()) for _ in range(3)]
    assert losses == expected and len(set(losses)) == 3
    for key, value in changed.state_dict().items():
        np.testing.assert_array_equal(program.state_dict()[key], value, err_msg=key)
    assert program.compiled is compiled


def test_momentum_cannot_appear_at_run_time_without_a_buffer():
    opt, program = program_of(lambda m: optim.SGD(m.parameters(), lr=0.1))
    opt.momentum = 0.9
    with pytest.raises(ValueError, match="momentum was 0 at compile"):
        program.train_step(**batch())


def test_parameter_groups_with_clipping():
    def grouped(model):
        return optim.SGD([{"params": [model.weight], "lr": 0.0}, {"params": [model.bias]}], lr=0.5)

    opt, program = program_of(grouped, clip_grad_norm=1e-3)
    start = program.state_dict()
    program.train_step(**batch())
    now = program.state_dict()
    np.testing.assert_array_equal(now["weight"], start["weight"])  # its group's lr is 0
    moved = np.linalg.norm(now["bias"] - start["bias"])
    assert 0 < moved <= 0.5 * 1e-3 * (1 + 1e-5)  # lr · the clipped norm, at most
