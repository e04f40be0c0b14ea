"""compile(check_finite=True) (meganeura/gate.py): the step counts the NaN/±inf elements of its
float inputs, its loss and every gradient on the GPU; when one is found it updates nothing
(parameters, module buffers, optimizer state) and train_step raises NonFiniteError naming the
first. A bad-input corpus with the error each case must give; the gate on the interpreter; the
`isfinite` kernel at ragged shapes; and no extra node at all without the option."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check, one_op

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import StepOptions, trace_step
from meganeura.gate import NONFINITE
from meganeura.ir.interpret import interpret

ROWS, N_IN, CLASSES = 6, 4, 3
RNG = np.random.default_rng(21)


class TwoHeads(nn.Module):
    """A regression head (mean squared error) and a classification head on the same input."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(N_IN, 1)
        self.head = nn.Linear(N_IN, CLASSES)

    def forward(self, x):
        return self.fc(x), self.head(x)


def two_losses(model, x, t, y):
    value, logits = model(x)
    return F.mse_loss(value, t) + F.cross_entropy(logits, y)


SPEC = {"x": mn.f32[ROWS, N_IN], "t": mn.f32[ROWS, 1], "y": mn.i32[ROWS]}


def good_batch() -> dict[str, np.ndarray]:
    return {
        "x": RNG.normal(size=(ROWS, N_IN)).astype(np.float32),
        "t": RNG.normal(size=(ROWS, 1)).astype(np.float32),
        "y": RNG.integers(0, CLASSES, ROWS).astype(np.int32),
    }


def with_value(name: str, index: tuple, value: float) -> dict[str, np.ndarray]:
    batch = good_batch()
    batch[name][index] = value
    return batch


def overflowing_gradient() -> dict[str, np.ndarray]:
    """Finite inputs and a finite loss whose gradient of fc.weight overflows float32: with
    fc.weight 0.01 (FC_WEIGHT), x = 1e20 and target 1.5e19 in row 0, the squared error there is
    1.96e38 (finite), its gradient at the output 2·(1e18 − 1.5e19)/6 ≈ −4.7e18, and that times
    x = 1e20 is −4.7e38, beyond float32's 3.4e38: −inf."""
    batch = good_batch()
    batch["x"][0] = [1e20, 0.0, 0.0, 0.0]
    batch["t"][0, 0] = 1.5e19
    return batch


# Each bad batch and the error it must give.
CORPUS = {
    "nan in x": (lambda: with_value("x", (1, 2), np.nan), mn.NonFiniteError, r"^input 'x' has 1 non-finite value "),
    "inf in x": (lambda: with_value("x", (0, 0), np.inf), mn.NonFiniteError, r"^input 'x' has 1 non-finite value "),
    "-inf in t": (lambda: with_value("t", (5, 0), -np.inf), mn.NonFiniteError, r"^input 't' has 1 non-finite"),
    "overflowing gradient": (
        overflowing_gradient,
        mn.NonFiniteError,
        r"^the gradient of 'fc.weight' has 1 non-finite value ",
    ),
    "label out of range": (lambda: with_value("y", (3,), CLASSES), ValueError, r"class labels must lie in \[0, 3\)"),
}


FC_WEIGHT = 0.01


def with_fc_weight(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return weights | {"fc.weight": np.full_like(weights["fc.weight"], FC_WEIGHT)}


@pytest.fixture(scope="module")
def checked():
    mn.manual_seed(0)
    program = mn.compile(TwoHeads(), two_losses, SPEC, optim.Adam(lr=1e-2), check_finite=True)
    program.train_step(**good_batch())  # optimizer state that is not all zeros
    return program


def snapshot(program) -> dict[str, np.ndarray]:
    return program.state_dict() | {f"optim/{k}": v for k, v in program.optimizer_state_dict().items()}


@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CORPUS))
def test_a_bad_batch_gives_its_error_and_changes_nothing(checked, case):
    make, error, message = CORPUS[case]
    checked.load_state_dict(with_fc_weight(checked.state_dict()))  # the weight the overflow is made for
    before, steps = snapshot(checked), checked.steps
    with pytest.raises(error, match=message) as caught:
        checked.train_step(**make())
    if error is mn.NonFiniteError:
        assert "the step was skipped" in str(caught.value)
        assert caught.value.what == message.split(" has ")[0].lstrip("^")
        assert sum(caught.value.counts.values()) >= 1
    after = snapshot(checked)
    assert after.keys() == before.keys() and checked.steps == steps
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    # The program goes on: a good batch after the bad one trains.
    checked.train_step(**good_batch())
    assert checked.steps == steps + 1
    assert not np.array_equal(checked.state_dict()["head.weight"], before["head.weight"])


@pytest.mark.gpu
def test_the_check_with_accumulation_keeps_the_cycle_and_its_accumulators():
    """accumulate=2 with a bad micro-batch between two good ones: the bad one is not counted, and
    the update is the one of the two good micro-batches (against the interpreter's plain step on
    their union, the same as a large-batch step)."""
    mn.manual_seed(1)
    program = mn.compile(TwoHeads(), two_losses, SPEC, optim.SGD(lr=0.1), accumulate=2, check_finite=True)
    mn.manual_seed(1)
    large_spec = {"x": mn.f32[2 * ROWS, N_IN], "t": mn.f32[2 * ROWS, 1], "y": mn.i32[2 * ROWS]}
    large = mn.compile(TwoHeads(), two_losses, large_spec, optim.SGD(lr=0.1))
    first, second = good_batch(), good_batch()
    program.train_step(**first)
    with pytest.raises(mn.NonFiniteError, match="gradient accumulators unchanged"):
        program.train_step(**with_value("x", (2, 1), np.nan))
    assert program.micro_step == 1
    program.train_step(**second)
    assert program.micro_step == 0
    large.train_step(**{name: np.concatenate([first[name], second[name]]) for name in first})
    for name, value in large.state_dict().items():
        np.testing.assert_allclose(program.state_dict()[name], value, rtol=2e-5, atol=2e-6, err_msg=name)


def interpreted_step(graph, initial_states, params, batch):
    states = dict(initial_states)
    return interpret(graph, batch, params, states | params, dtype=np.float32)


def test_the_gate_on_the_interpreter_keeps_every_value_or_applies_the_plain_update():
    mn.manual_seed(2)
    model = TwoHeads()
    gated = trace_step(
        model, two_losses, SPEC, optim.Adam(lr=1e-2), recognize=False, options=StepOptions(check_finite=True)
    )
    plain = trace_step(model, two_losses, SPEC, optim.Adam(lr=1e-2), recognize=False)
    params = {name: p.numpy() for name, p in model.named_parameters()}
    leaves = params | gated.initial_states
    good = good_batch()
    ok = interpreted_step(gated.graph, gated.initial_states, params, good)
    expected = interpreted_step(plain.graph, plain.initial_states, params, good)
    assert not ok.outputs[NONFINITE].any()
    for name, value in expected.updates.items():
        np.testing.assert_array_equal(ok.updates[name], value, err_msg=name)
    nan = interpreted_step(gated.graph, gated.initial_states, params, with_value("x", (0, 1), np.nan))
    counts = dict(zip(gated.finite_checks, nan.outputs[NONFINITE], strict=True))
    assert counts["input 'x'"] == 1 and counts["input 't'"] == 0
    for name, value in nan.updates.items():
        np.testing.assert_array_equal(value, leaves[name], err_msg=name)
    params = with_fc_weight(params)
    leaves = params | gated.initial_states
    with np.errstate(over="ignore", invalid="ignore"):
        overflow = interpreted_step(gated.graph, gated.initial_states, params, overflowing_gradient())
    counts = dict(zip(gated.finite_checks, overflow.outputs[NONFINITE], strict=True))
    assert [name for name, count in counts.items() if count] == ["the gradient of 'fc.weight'"]
    assert np.isfinite(overflow.outputs["loss"])
    for name, value in overflow.updates.items():
        np.testing.assert_array_equal(value, leaves[name], err_msg=name)


def test_without_the_option_the_step_has_no_extra_node():
    mn.manual_seed(3)
    model = TwoHeads()
    default = trace_step(model, two_losses, SPEC, optim.Adam(lr=1e-2), recognize=False)
    off = trace_step(
        model, two_losses, SPEC, optim.Adam(lr=1e-2), recognize=False, options=StepOptions(check_finite=False)
    )
    on = trace_step(
        model, two_losses, SPEC, optim.Adam(lr=1e-2), recognize=False, options=StepOptions(check_finite=True)
    )
    assert [n.op for n in off.graph] == [n.op for n in default.graph]
    assert not any(n.op == "isfinite" for n in off.graph) and NONFINITE not in off.graph.outputs
    # With it: one count per float input, the loss and each gradient, and one where per update.
    assert sum(n.op == "isfinite" for n in on.graph) == 2 + 1 + 4
    assert sum(n.op == "where" for n in on.graph) == sum(n.op == "where" for n in off.graph) + len(on.graph.updates)


@pytest.mark.gpu
def test_the_isfinite_kernel_reads_the_bits_at_a_ragged_shape():
    x = RNG.normal(size=(7, 33)).astype(np.float32) * 1e3
    specials = [np.nan, np.inf, -np.inf, -np.nan, 3.4e38, -3.4e38, 1e-45, -0.0, 0.0, np.float32(1e-38)]
    x.flat[::23][: len(specials)] = specials
    check(one_op("isfinite", [(7, 33)]), {"x0": x}, rtol=0, atol=0)


def test_check_finite_is_a_flag_of_a_training_step():
    with pytest.raises(TypeError, match="check_finite must be True or False"):
        mn.compile(TwoHeads(), two_losses, SPEC, optim.SGD(lr=0.1), check_finite=1)
    with pytest.raises(ValueError, match="pass loss= and optimizer="):
        mn.compile(TwoHeads(), inputs={"x": mn.f32[ROWS, N_IN]}, check_finite=True)
