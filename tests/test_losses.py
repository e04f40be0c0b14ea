"""The losses with PyTorch's signatures (meganeura/functional.py): values and gradients against
PyTorch for every reduction (tests/reference/ops/losses.npz), gradients by finite differences
mid-chain, every case compiled and run on the device against the interpreter; nll_loss and
cross_entropy's ignore_index (pick, scatter_rows and the fused cross-entropy kernels with that
attribute, and the per-step label check that accepts it)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, gradcheck, one_op, trace_leaf
from reference_cases import check_against_torch, check_gradients_by_differences, check_on_device, load

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import label_bounds
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError
from meganeura.ir.trace import Tracer, tracing
from meganeura.rewrite import optimize
from meganeura.tensor import apply

FILE = "losses"
CASES, _ = load(FILE)
# Not smooth where a case's inputs sit (finite differences step across the kink or the clamp).
KINKED = {"binary_cross_entropy_clamped_log", "margin_ranking_loss", "triplet_margin_loss_swap"}
DIFFERENTIABLE = sorted(name for name, meta in CASES.items() if meta["grads"] and name not in KINKED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_follow_pytorch(name):
    check_against_torch(FILE, name)


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradients_by_finite_differences(name):
    assert check_gradients_by_differences(FILE, name) < 1e-6


GROUPS: dict[str, list[str]] = {}  # cases compiled together, by the first word of their name: one program each
for _name in sorted(CASES):
    GROUPS.setdefault(_name.split("_")[0], []).append(_name)


@pytest.mark.parametrize("prefix", sorted(GROUPS))
def test_on_device_against_the_interpreter(prefix):
    check_on_device(FILE, GROUPS[prefix])


# -- ignore_index: pick, scatter_rows and the fused kernels ------------------------------------

IGNORED_LABELS = np.array([0, -100, 4, 3, -100, 1, 2], np.int32)  # 5 classes, two rows ignored


@pytest.mark.parametrize("ignore", [-100, 3])
@pytest.mark.parametrize("op", ["pick", "cross_entropy_rows"])
def test_row_kernels_give_zero_for_the_ignored_label(op, ignore):
    x = np.random.default_rng(1).normal(size=(7, 5)).astype(np.float32)
    out = check(one_op(op, [(7, 5), (7,)], ["f32", "i32"], ignore_index=ignore), {"x0": x, "x1": IGNORED_LABELS})
    got = out.run({"x0": x, "x1": IGNORED_LABELS}, read=("out",))["out"]
    assert (got[IGNORED_LABELS == ignore] == 0).all() and np.isnan(got[IGNORED_LABELS == -100]).any() == (
        ignore != -100
    )


@pytest.mark.parametrize("ignore", [-100, 3])
@pytest.mark.parametrize("op", ["scatter_rows", "cross_entropy_rows_grad"])
def test_gradient_kernels_give_a_zero_row_for_the_ignored_label(op, ignore):
    rng = np.random.default_rng(2)
    if op == "scatter_rows":
        graph = one_op(op, [(7,), (7,)], ["f32", "i32"], classes=5, ignore_index=ignore)
        feeds = {"x0": rng.normal(size=7).astype(np.float32), "x1": IGNORED_LABELS}
    else:
        graph = one_op(op, [(7, 5), (7,), (7,)], ["f32", "i32", "f32"], ignore_index=ignore)
        feeds = {"x0": rng.normal(size=(7, 5)).astype(np.float32), "x1": IGNORED_LABELS}
        feeds["x2"] = rng.normal(size=7).astype(np.float32)
    got = check(graph, feeds).run(feeds, read=("out",))["out"]
    assert (got[IGNORED_LABELS == ignore] == 0).all()


def test_pick_reads_a_table_or_a_scalar():
    rng = np.random.default_rng(3)
    table = rng.normal(size=5).astype(np.float32)
    check(one_op("pick", [(5,), (7,)], ["f32", "i32"]), {"x0": table, "x1": IGNORED_LABELS})
    got = interpret(one_op("pick", [(5,), (7,)], ["f32", "i32"]), {"x0": table, "x1": IGNORED_LABELS}).outputs
    np.testing.assert_array_equal(got["out"], np.where(IGNORED_LABELS == -100, 0, table[IGNORED_LABELS % 5]))
    scalar = one_op("pick", [(), (7,)], ["f32", "i32"], ignore_index=4)
    feeds = {"x0": np.float32(2.5), "x1": IGNORED_LABELS}
    np.testing.assert_array_equal(
        check(scalar, feeds).run(feeds, read=("out",))["out"], [2.5, 2.5, 0, 2.5, 2.5, 2.5, 2.5]
    )
    with pytest.raises(ShapeError, match=r"expected i32 class labels \[batch\]"):
        one_op("pick", [(), (7, 1)], ["f32", "i32"])


def test_pick_gradients_mid_chain_with_ignored_labels():
    rng = np.random.default_rng(4)
    for shape in [(7, 5), (5,), ()]:
        pick = lambda x, labels: apply("pick", x, labels)  # noqa: E731
        assert gradcheck(pick, [shape], rng, labels=IGNORED_LABELS) < 1e-6, shape
    scatter = lambda g, labels: apply("scatter_rows", g, labels, classes=5, ignore_index=2)  # noqa: E731
    assert gradcheck(scatter, [(7,)], rng, labels=IGNORED_LABELS) < 1e-6


def test_the_fused_cross_entropy_kernels_carry_ignore_index():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "param", "x", TensorType((7, 5)))
        y = trace_leaf(tracer, "input", "y", TensorType((7,), "i32"))
        loss = F.cross_entropy(x, y, ignore_index=3)
    graph = tracer.graph
    graph.outputs["loss"] = loss.node
    graph.outputs["dx"] = gradients(graph, loss.node, [x.node])[x.node]
    fused, report = optimize(graph)
    kernels = {n.op: n for n in fused if n.id in fused.live_ids() and n.op.startswith("cross_entropy")}
    assert sorted(kernels) == ["cross_entropy_rows", "cross_entropy_rows_grad"]
    assert {n.attr("ignore_index") for n in kernels.values()} == {3}
    values = {"y": np.array([3, 0, 3, 4, 1, 3, 2], np.int32)}
    x_value = np.random.default_rng(5).normal(size=(7, 5))
    expected, actual = (interpret(g, values, {"x": x_value}, dtype=np.float64).outputs for g in (graph, fused))
    for name in ("loss", "dx"):
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-12, err_msg=name)
    assert (expected["dx"][values["y"] == 3] == 0).all()


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        return self.fc(x)


def test_a_training_step_ignores_the_padding_label_and_checks_the_others():
    """PyTorch's -100 padding label is accepted and skipped; other labels outside [0, 5) are refused."""
    program = mn.compile(
        Classifier(),
        loss=lambda model, x, y: F.cross_entropy(model(x), y, label_smoothing=0.1),
        inputs={"x": mn.f32[7, 6], "y": mn.i32[7]},
        optimizer=optim.SGD(lr=0.5),
    )
    x = np.random.default_rng(6).normal(size=(7, 6)).astype(np.float32)
    assert_steps_follow_interpreter(program, [{"x": x, "y": IGNORED_LABELS}])
    with pytest.raises(ValueError, match=r"class labels must lie in \[0, 5\) or -100, got 1 value"):
        program.train_step(x=x, y=np.array([0, -100, 4, 3, -1, 1, 2], np.int32))


def test_label_bounds_keep_only_an_ignored_value_every_use_ignores():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((4, 6)))
        y = trace_leaf(tracer, "input", "y", TensorType((4,), "i32"))
        tracer.graph.outputs["a"] = F.nll_loss(x, y, ignore_index=2).node
        tracer.graph.outputs["b"] = F.nll_loss(x[:, :5], y).node
    bound = label_bounds(tracer.graph)["y"]
    assert (bound.rows, bound.ignored) == (5, frozenset())
    assert bound.bad_values(np.array([0, 4, 5, -100, 2], np.int32)).tolist() == [5, -100]


# -- signatures and errors --------------------------------------------------------------------


def test_losses_refuse_what_pytorch_refuses_naming_the_users_line():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((4, 5)))
        y = trace_leaf(tracer, "input", "y", TensorType((4,), "i32"))
        v = trace_leaf(tracer, "input", "v", TensorType((3,)))
        cases = [
            (TypeError, "third argument is PyTorch's weight", lambda: F.cross_entropy(x, y, "sum")),
            (ShapeError, r"expected a weight f32\[5\]", lambda: F.nll_loss(x, y, weight=v)),
            (ShapeError, r"expected i32 class labels \[4\]", lambda: F.cross_entropy(x, v)),
            (ValueError, "reduction must be one of", lambda: F.l1_loss(x, x, reduction="avg")),
            (ValueError, "label_smoothing must be in", lambda: F.cross_entropy(x, y, label_smoothing=1.5)),
            (ValueError, "weights and input must have the same size", lambda: F.mse_loss(x, x, weight=v)),
            (ValueError, "target size", lambda: F.binary_cross_entropy(x, x[:, :3])),
            (ValueError, "var is of incorrect size", lambda: F.gaussian_nll_loss(x, x, v)),
            (ValueError, "beta must be non-negative", lambda: F.smooth_l1_loss(x, x, beta=-1.0)),
        ]
        for error, message, call in cases:
            with pytest.raises(error, match=f"test_losses\\.py:\\d+: .*{message}"):
                call()
        with pytest.warns(UserWarning, match="different to the input size"):
            F.l1_loss(x, x[:1])
