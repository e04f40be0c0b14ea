"""Smoke test of examples/resnet_digits.py: the small ResNet (stem conv-bn-relu, a basic block with
the identity shortcut, a stride-2 block with a 1×1 conv + bn projection, max pool, global average
pool, linear) trains on the GPU step for step like the numpy interpreter, with and without the
e-graph's fusions (weights, momentum buffers and BatchNorm's running statistics), and a few dozen
steps on a subset of the digits lower the loss; the eval-mode program sees the trained statistics."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter

import meganeura as mn
from meganeura.ir.interpret import interpret

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "resnet_digits.py")
spec = importlib.util.spec_from_file_location("resnet_digits", EXAMPLE)
resnet_digits = importlib.util.module_from_spec(spec)
spec.loader.exec_module(resnet_digits)

WIDTH, BATCH = 4, 8


@pytest.fixture(scope="module")
def digits():
    return resnet_digits.load_split(seed=0)


def tiny_model(seed: int = 0):
    mn.manual_seed(seed)
    return resnet_digits.ResNet(WIDTH)


def test_model_layout_and_data(digits):
    (x_train, y_train), (x_test, y_test) = digits
    assert x_train.shape[1:] == (1, 8, 8) and x_train.dtype == np.float32
    assert len(x_train) + len(x_test) == 1797 and len(x_test) == 359
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0 and set(np.unique(y_train)) == set(range(10))
    state = tiny_model().state_dict()
    assert state["conv1.weight"].shape == (WIDTH, 1, 3, 3) and "conv1.bias" not in state
    assert "layer1.downsample.0.weight" not in state  # identity shortcut
    assert state["layer2.downsample.0.weight"].shape == (2 * WIDTH, WIDTH, 1, 1)
    assert state["layer2.downsample.1.running_var"].shape == (2 * WIDTH,)
    assert state["fc.weight"].shape == (10, 2 * WIDTH)


@pytest.mark.parametrize("rewrite", [True, False], ids=["fused", "unfused"])
def test_five_gpu_steps_follow_the_interpreter(digits, rewrite):
    (x_train, y_train), _ = digits
    model = tiny_model()
    program = resnet_digits.compile_training(model, BATCH, lr=0.05, rewrite=rewrite)
    feeds = [{"x": x_train[i * BATCH : (i + 1) * BATCH], "y": y_train[i * BATCH : (i + 1) * BATCH]} for i in range(5)]
    losses = assert_steps_follow_interpreter(program, feeds)
    assert all(np.isfinite(losses))
    state = program.state_dict()
    assert float(state["layer2.bn2.num_batches_tracked"]) == 5.0
    assert not np.allclose(state["bn1.running_mean"], 0.0)  # compared with the interpreter's above
    if rewrite:
        report = program.report().rewrite
        assert report.kernels_after < report.kernels_before


def test_a_few_dozen_steps_lower_the_loss_and_eval_uses_the_running_statistics(digits):
    (x_train, y_train), (x_test, _) = digits
    model = tiny_model(1)
    program = resnet_digits.compile_training(model, 16, lr=0.05)
    predict = resnet_digits.compile_inference(model, 32)
    assert model.training  # compile_inference puts the model back in training mode
    rng = np.random.default_rng(0)
    subset = rng.permutation(len(x_train))[:192]
    losses = []
    for _ in range(3):
        order = rng.permutation(subset)
        for step in range(len(order) // 16):
            batch = order[step * 16 : (step + 1) * 16]
            losses.append(program.train_step(x=x_train[batch], y=y_train[batch]))
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:5])
    state = program.state_dict()
    assert float(state["bn1.num_batches_tracked"]) == len(losses)
    # the eval program (compiled before training) normalises with the trained running statistics
    x = x_test[:32]
    (name,) = predict.graph.outputs
    expected = interpret(predict.graph, {"x": x}, state, state).outputs[name]
    logits = predict(x=x)
    assert logits.shape == (32, 10) and np.all(np.isfinite(logits))
    np.testing.assert_allclose(logits, expected, rtol=1e-3, atol=1e-4)
