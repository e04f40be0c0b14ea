"""Freezing parameters (requires_grad=False): a frozen parameter is read by the step but has no
gradient work, no optimizer state and no update; the rest trains as PyTorch trains it (a torch run
of a 2-layer MLP with its first layer frozen: tests/reference/nn/modules.npz, `freeze/`, written by
scripts/make_module_references.py). A compiled step is fixed: changing the flag afterwards warns."""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict

import numpy as np
import pytest
from conftest import interpreted_steps

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import compile_plan, trace_step

REFERENCE = np.load(os.path.join(os.path.dirname(__file__), "reference", "nn", "modules.npz"))
STEPS = 4
SPEC = {"x": mn.f32[8, 6], "y": mn.i32[8]}


def reference(prefix: str) -> dict[str, np.ndarray]:
    return {key[len(prefix) :]: REFERENCE[key] for key in REFERENCE.files if key.startswith(prefix)}


def frozen_mlp() -> nn.Module:
    """The reference's model and initial values, its first layer frozen."""
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(6, 10), act=nn.Tanh(), fc2=nn.Linear(10, 4)))
    model.load_state_dict(reference("freeze/init/"))
    model.fc1.requires_grad_(False)
    return model


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def adamw(model: nn.Module) -> optim.AdamW:
    return optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)  # frozen ones included, as in the torch run


FEEDS = [{"x": REFERENCE[f"freeze/x{k}"], "y": REFERENCE[f"freeze/y{k}"]} for k in range(STEPS)]


def test_the_rest_trains_as_in_pytorch_and_the_frozen_layer_not_at_all():
    model = frozen_mlp()
    traced = trace_step(model, ce, SPEC, adamw(model))
    assert traced.frozen == ("fc1.weight", "fc1.bias")
    losses, params = interpreted_steps(traced, FEEDS)
    # float64 throughout, but the hyper-parameters are float32 (lr 0.05 is 0.05 + 7e-10): 1e-7.
    np.testing.assert_allclose(losses, REFERENCE["freeze/loss"], rtol=1e-7)
    final = reference("freeze/final/")
    for name, value in params.items():
        np.testing.assert_allclose(value, final[name], rtol=1e-7, atol=1e-8, err_msg=name)
    for name in traced.frozen:  # AdamW's decay would have moved them: it did not run on them
        np.testing.assert_array_equal(params[name], REFERENCE[f"freeze/init/{name}"])


def test_on_the_device_the_frozen_layer_stays_bit_identical():
    model = frozen_mlp()
    program = mn.compile(model, ce, SPEC, adamw(model))
    before = program.state_dict()
    losses = [program.train_step(**feed) for feed in FEEDS]
    after = program.state_dict()
    for name in ("fc1.weight", "fc1.bias"):
        np.testing.assert_array_equal(after[name], before[name])
    np.testing.assert_allclose(losses, REFERENCE["freeze/loss"], rtol=1e-5)
    final = reference("freeze/final/")
    for name in ("fc2.weight", "fc2.bias"):
        np.testing.assert_allclose(after[name], final[name], rtol=1e-4, atol=2e-5, err_msg=name)
        assert not np.array_equal(after[name], before[name])
    assert sorted(program.optimizer_state_dict()) == [
        "fc2.bias.exp_avg", "fc2.bias.exp_avg_sq", "fc2.weight.exp_avg", "fc2.weight.exp_avg_sq", "step",
    ]  # fmt: skip


def op_count(graph, op: str) -> int:
    return sum(1 for node in graph if node.op == op)


def test_the_step_has_no_gradient_work_for_the_frozen_weight():
    trained = nn.Sequential(OrderedDict(fc1=nn.Linear(6, 10), act=nn.Tanh(), fc2=nn.Linear(10, 4)))
    whole = compile_plan(trained, ce, SPEC, optim.AdamW(lr=0.05))
    frozen = compile_plan(frozen_mlp(), ce, SPEC, optim.AdamW(lr=0.05))
    # forward 2 matmuls; backward: fc2.weight's gradient, and only when fc1 trains, the hidden
    # layer's gradient and fc1.weight's.
    assert op_count(whole.traced.graph, "matmul") == 5
    assert op_count(frozen.traced.graph, "matmul") == 3
    assert op_count(frozen.traced.graph, "tanh") == 1  # no tanh backward either
    assert not [name for name in frozen.traced.graph.updates if name.startswith("fc1.")]
    assert len(frozen.compiled.kernels) < len(whole.compiled.kernels)
    # Nothing but the leaf has fc1.weight's shape: no gradient of it, no optimizer state for it.
    shaped = [n.op for n in frozen.traced.graph if any(t.shape == (10, 6) for t in n.types)]
    assert shaped == ["param"]
    assert [n.op for n in whole.traced.graph if any(t.shape == (10, 6) for t in n.types)].count("param") == 1


@pytest.mark.parametrize(
    "freeze",
    [
        lambda m: setattr(m.fc1.weight, "requires_grad", False),
        lambda m: m.fc1.weight.requires_grad_(False),
        lambda m: m.fc1.requires_grad_(False),
    ],
    ids=["attribute", "tensor method", "module method"],
)
def test_every_way_of_freezing_freezes(freeze):
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(6, 10), act=nn.Tanh(), fc2=nn.Linear(10, 4)))
    freeze(model)
    assert model.fc1.weight.requires_grad is False and model.fc2.weight.requires_grad is True
    traced = trace_step(model, ce, SPEC, optim.SGD(lr=0.1))
    assert "fc1.weight" in traced.frozen and "fc1.weight" not in traced.graph.updates
    assert "fc2.weight" in traced.graph.updates


def test_requires_grad_flags_of_parameters_modules_and_buffers():
    assert nn.Parameter(np.zeros(2), requires_grad=False).requires_grad is False
    bn = nn.BatchNorm1d(3)
    assert bn.requires_grad_(False) is bn
    assert not any(p.requires_grad for p in bn.parameters())
    assert bn.running_mean.requires_grad is False
    bn.running_mean.requires_grad_(False)
    with pytest.raises(ValueError, match="a Buffer is not trained"):
        bn.running_mean.requires_grad = True
    table = nn.Embedding.from_pretrained(np.arange(6.0).reshape(3, 2))
    assert table.weight.requires_grad is False
    np.testing.assert_array_equal(table.weight.numpy(), np.arange(6.0).reshape(3, 2))
    assert nn.Embedding.from_pretrained(np.zeros((3, 2)), freeze=False).weight.requires_grad


def test_changing_the_flag_after_compile_warns_once_and_the_program_keeps_its_plan():
    mn.manual_seed(0)
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(6, 10), act=nn.Tanh(), fc2=nn.Linear(10, 4)))
    traced = trace_step(model, ce, SPEC, optim.SGD(lr=0.1))
    with pytest.warns(UserWarning, match="requires_grad=False on 2 parameters of a compiled training step") as caught:
        model.fc1.requires_grad_(False)
    assert caught[0].filename == __file__  # the user's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fc1.requires_grad_(False)  # once per value
        trace_step(model, None, {"x": mn.f32[8, 6]}, None)  # an inference program has no gradients to mind
    assert "fc1.weight" in traced.graph.updates  # the step compiled before still trains it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fc1.weight.requires_grad = True  # what that step was compiled with: nothing to say
    model.fc1.weight.requires_grad = False
    frozen = trace_step(model, ce, SPEC, optim.SGD(lr=0.1))
    assert "fc1.weight" not in frozen.graph.updates
    with pytest.warns(UserWarning, match="requires_grad=True on 1 parameter"):
        model.fc1.weight.requires_grad = True  # the frozen step will not train it


def test_a_frozen_parameter_in_a_param_group_is_skipped_as_torch_optim_skips_it():
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(6, 10), act=nn.Tanh(), fc2=nn.Linear(10, 4)))
    model.fc1.weight.requires_grad = False
    opt = optim.SGD([{"params": [model.fc1.weight, model.fc2.weight]}, {"params": [model.fc1.bias]}], lr=0.1)
    traced = trace_step(model, ce, SPEC, opt)
    assert sorted(name for name in traced.graph.updates) == ["fc1.bias", "fc2.weight"]


def test_a_step_with_every_parameter_frozen_computes_the_loss_and_updates_nothing():
    model = frozen_mlp().requires_grad_(False)
    traced = trace_step(model, ce, SPEC, optim.Adam(lr=0.1))
    losses, params = interpreted_steps(traced, FEEDS[:2])
    assert not traced.graph.updates.keys() - {"step"}
    assert losses[0] == pytest.approx(REFERENCE["freeze/loss"][0], rel=1e-10)
    for name, value in params.items():
        np.testing.assert_array_equal(value, REFERENCE[f"freeze/init/{name}"])
