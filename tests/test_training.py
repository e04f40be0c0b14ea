"""End to end on the default adapter (lavapipe in CI): GPU steps follow the numpy interpreter,
programs share weights, and bad input is refused without changing anything."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

BATCH, N_IN, HIDDEN, N_OUT = 8, 12, 20, 5


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(N_IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, N_OUT)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def ce_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def batches(steps, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(BATCH, N_IN)).astype(np.float32), rng.integers(0, N_OUT, size=BATCH).astype(np.int32))
        for _ in range(steps)
    ]


def compile_mlp(optimizer, rewrite=True, seed=0):
    mn.manual_seed(seed)
    model = MLP()
    program = mn.compile(
        model,
        loss=ce_loss,
        inputs={"x": mn.f32[BATCH, N_IN], "y": mn.i32[BATCH]},
        optimizer=optimizer,
        rewrite=rewrite,
    )
    return model, program


@pytest.mark.parametrize("rewrite", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize(
    "optimizer",
    [optim.Adam(lr=1e-2), optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3), optim.AdamW(lr=1e-2)],
    ids=["adam", "sgd-momentum", "adamw"],
)
def test_five_gpu_steps_follow_the_interpreter(optimizer, rewrite):
    _, program = compile_mlp(optimizer, rewrite)
    (x, y) = batches(1)[0]
    losses = assert_steps_follow_interpreter(program, [{"x": x, "y": y}] * 5)
    assert losses[-1] < losses[0]  # one batch again and again: the loss must fall on it


def test_inference_program_sees_trained_weights():
    model, program = compile_mlp(optim.Adam(lr=1e-2))
    for x, y in batches(3):
        program.train_step(x=x, y=y)
    predict = mn.compile(model, inputs={"x": mn.f32[3, N_IN]})
    x = np.random.default_rng(1).normal(size=(3, N_IN)).astype(np.float32)
    state = program.state_dict()
    hidden = np.maximum(x @ state["fc1.weight"].T + state["fc1.bias"], 0)
    expected = hidden @ state["fc2.weight"].T + state["fc2.bias"]
    np.testing.assert_allclose(predict(x=x), expected, rtol=1e-4, atol=1e-5)
    # ...and keeps seeing them as training goes on.
    program.train_step(x=batches(1, seed=5)[0][0], y=batches(1, seed=5)[0][1])
    state = program.state_dict()
    hidden = np.maximum(x @ state["fc1.weight"].T + state["fc1.bias"], 0)
    np.testing.assert_allclose(predict(x=x), hidden @ state["fc2.weight"].T + state["fc2.bias"], rtol=1e-4, atol=1e-5)


def test_state_dict_round_trip_and_copies():
    model, program = compile_mlp(optim.SGD(lr=0.1))
    state = program.state_dict()
    assert list(state) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert state["fc1.weight"].shape == (HIDDEN, N_IN)
    state["fc1.weight"][:] = 7.0  # a copy: the program is not affected
    assert not np.any(program.state_dict()["fc1.weight"] == 7.0)
    new = {name: np.full_like(value, 0.01) for name, value in program.state_dict().items()}
    program.load_state_dict(new)
    for name, value in program.state_dict().items():
        np.testing.assert_array_equal(value, new[name])
    assert model.state_dict()["fc2.bias"][0] == np.float32(0.01)  # the module sees the same values


def snapshot(program):
    return program.state_dict(), program.executable.read_state("step")


def assert_unchanged(program, before):
    params, step = before
    after_params, after_step = snapshot(program)
    for name, value in params.items():
        np.testing.assert_array_equal(after_params[name], value)
    np.testing.assert_array_equal(after_step, step)


def test_bad_inputs_are_refused_and_change_nothing():
    _, program = compile_mlp(optim.Adam(lr=1e-2))
    x, y = batches(1)[0]
    program.train_step(x=x, y=y)
    before = snapshot(program)
    cases = [
        (KeyError, "missing \\['y'\\]", {"x": x}),
        (KeyError, "unknown \\['z'\\]", {"x": x, "y": y, "z": y}),
        (ValueError, r"'x': expected shape \[8, 12\], got \[1, 8, 12\]$", {"x": x[None], "y": y}),
        # Another shape compiles a plan for it, which the model cannot have: its trace error, on the user's line.
        (
            ValueError,
            r"test_training.py:\d+: matmul: inner dimensions differ.*\n\(while compiling the program for the input "
            r"shapes x: \[8, 11\], y: \[8\]; it was compiled for x: \[8, 12\], y: \[8\]\)",
            {"x": x[:, :11], "y": y},
        ),
        (ValueError, r"test_training.py:\d+: .*\n\(while compiling .* x: \[8, 12\], y: \[4\];", {"x": x, "y": y[:4]}),
        (TypeError, "expected integer data", {"x": x, "y": y.astype(np.float32)}),
        (TypeError, "expected floating-point data", {"x": x.astype(np.int32), "y": y}),
        (ValueError, r"class labels must lie in \[0, 5\)", {"x": x, "y": np.full(BATCH, 5, np.int32)}),
    ]
    for error, message, arrays in cases:
        with pytest.raises(error, match=message):
            program.train_step(**arrays)
        assert_unchanged(program, before)
    bad_state = program.state_dict()
    bad_state["fc2.weight"] = np.zeros((N_OUT, HIDDEN + 1), np.float32)
    with pytest.raises(ValueError, match="fc2.weight"):
        program.load_state_dict(bad_state)
    assert_unchanged(program, before)


def test_report_shows_the_chosen_rewrites():
    _, program = compile_mlp(optim.Adam(lr=1e-2))
    report = program.report()
    text = str(report)
    for rule in ("fold_transpose_b", "matmul_epilogue", "fuse_pointwise"):
        assert rule in text and report.rewrite.rule(rule).uses > 0, rule
    epilogues = {node.attr("epilogue") for node in program.fused_graph if node.op == "fused_matmul"}
    assert {"relu(add($acc,$0))", "add($acc,$0)"} <= epilogues
    assert not any(node.op == "permute" for node in program.fused_graph)  # folded into operand layouts
    assert report.rewrite.kernels_after < report.rewrite.kernels_before


class MaskedNet(nn.Module):
    """The new elementwise ops of issue 9 in one training step: comparisons, where, masked_fill,
    clamp, abs, leaky_relu and softplus (fused by the e-graph like any other elementwise op)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(6, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h, g = self.a(x), self.b(x)
        mixed = mn.where(h > g, F.leaky_relu(h, 0.1), F.softplus(g, beta=2.0))
        mixed = mixed.masked_fill(F.abs(g) <= 0.05, 0.0).clamp(-1.5, 2.0)
        return self.out(mixed + (h != 0) * 0.01)


def test_the_new_elementwise_ops_train_on_the_gpu_like_the_interpreter():
    mn.manual_seed(0)
    model = MaskedNet()
    program = mn.compile(model, ce_loss, {"x": mn.f32[16, 6], "y": mn.i32[16]}, optim.Adam(lr=1e-2))
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.normal(size=(16, 6)).astype(np.float32), "y": rng.integers(0, 3, 16)}] * 5  # one batch
    losses = assert_steps_follow_interpreter(program, feeds)
    assert losses[-1] < losses[0]
    fused_ops = {n.op for n in program.fused_graph}
    assert "pointwise" in fused_ops or "fused_matmul" in fused_ops  # the e-graph fused them
