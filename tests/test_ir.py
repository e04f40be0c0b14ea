"""The IR as text, tracing (shapes, source lines, errors) and the DSL's PyTorch conventions."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.ir.graph import SKIP, Graph, TensorType
from meganeura.ir.interpret import interpret


class TwoLayer(nn.Module):
    def __init__(self, n_in=6, hidden=5, n_out=3):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, n_out)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def ce_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def test_graph_prints_one_line_per_node():
    graph = Graph()
    x = graph.add("input", (), TensorType((2, 3)), {"name": "x", "shape": (2, 3), "dtype": "f32"})
    y = graph.add("relu", (x,), TensorType((2, 3)), sources=("model.py:7",))
    graph.add("sum", (y,), TensorType(()), {"axes": (0, 1), "keepdim": False})
    graph.outputs["total"] = 2
    assert str(graph).splitlines() == [
        "%0 = input {name=x, shape=(2,3)} : f32[2,3]",  # attributes at their defaults are left out
        "%1 = relu %0 : f32[2,3]".ljust(60) + "  # model.py:7",
        "%2 = sum %1 {axes=(0,1)} : f32[]",
        "output total = %2",
    ]


def test_graph_rejects_references_to_later_nodes():
    graph = Graph()
    with pytest.raises(ValueError, match="not an earlier node"):
        graph.add("relu", (0,), TensorType((1,)))


def test_training_graph_has_forward_backward_and_update():
    traced = trace_step(TwoLayer(), ce_loss, {"x": mn.f32[4, 6], "y": mn.i32[4]}, optim.SGD(lr=0.1))
    ops = [node.op for node in traced.graph]
    assert ops.count("matmul") == 2 + 3  # forward, then dW1, dW2, dX for layer 2
    assert {"log_softmax", "pick", "scatter_rows", "log_softmax_grad"} <= set(ops)  # as written; fused later
    assert sorted(traced.graph.updates) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert all(traced.graph[i].op == "sgd_update" for i in traced.graph.updates.values())
    single = trace_step(TwoLayer(), ce_loss, {"x": mn.f32[4, 6], "y": mn.i32[4]}, optim.SGD(lr=0.1, fused=False))
    assert all(single.graph[i].op == "sgd_step" for i in single.graph.updates.values())
    # Every traced node remembers the user's line: this file.
    relu = next(node for node in traced.graph if node.op == "relu")
    assert relu.sources and relu.sources[0].startswith("test_ir.py:")


def test_shape_error_names_the_users_file_and_line():
    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(x)  # the line the error must name

    line = inspect.getsourcelines(Broken.forward)[1] + 1
    with pytest.raises(mn.ShapeError, match=rf"test_ir.py:{line}: matmul: inner dimensions differ"):
        mn.compile(Broken(), loss=lambda m, x: F.sum(m(x)), inputs={"x": mn.f32[2, 7]}, optimizer=optim.SGD(lr=1))


def test_cross_entropy_checks_label_dtype_and_shape():
    with pytest.raises(mn.ShapeError, match="i32 class labels"):
        trace_step(TwoLayer(), ce_loss, {"x": mn.f32[4, 6], "y": mn.f32[4]}, optim.SGD(lr=0.1))
    with pytest.raises(mn.ShapeError, match=r"i32 class labels \[4\]"):
        trace_step(TwoLayer(), ce_loss, {"x": mn.f32[4, 6], "y": mn.i32[5]}, optim.SGD(lr=0.1))


def test_compile_rejects_bad_arguments_before_anything_runs():
    model = TwoLayer()
    with pytest.raises(TypeError, match="nn.Module"):
        mn.compile(lambda x: x, inputs={"x": mn.f32[1, 6]})
    with pytest.raises(ValueError, match="optimizer="):
        mn.compile(model, loss=ce_loss, inputs={"x": mn.f32[4, 6], "y": mn.i32[4]})
    with pytest.raises(TypeError, match=r"called with inputs \['x', 'z'\]"):
        mn.compile(model, loss=ce_loss, inputs={"x": mn.f32[4, 6], "z": mn.i32[4]}, optimizer=optim.SGD(lr=1))
    with pytest.raises(ValueError, match="positive integer"):
        mn.f32[0, 3]
    with pytest.raises(mn.ShapeError, match="single-number"):
        mn.compile(model, loss=lambda m, x: m(x), inputs={"x": mn.f32[2, 6]}, optimizer=optim.SGD(lr=1))


def test_linear_uses_pytorch_layout_and_init_bounds():
    nn.manual_seed(0)
    layer = nn.Linear(64, 10)
    assert layer.weight.shape == (10, 64) and layer.bias.shape == (10,)
    bound = 1 / np.sqrt(64)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    assert w.dtype == np.float32 and np.abs(w).max() <= bound and np.abs(b).max() <= bound
    # U(−1/√in, 1/√in) has standard deviation bound/√3.
    assert abs(w.std() - bound / np.sqrt(3)) < 0.1 * bound
    assert [name for name, _ in TwoLayer().named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def test_sequential_and_module_list_names():
    seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    assert list(seq.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    blocks = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    assert list(dict(blocks.named_parameters())) == [f"{i}.{p}" for i in range(3) for p in ("weight", "bias")]


def test_module_load_state_dict_checks_everything_first():
    model = TwoLayer()
    before = model.state_dict()
    bad = dict(before)
    bad["fc1.weight"] = np.zeros((5, 6), np.float32)
    bad["fc2.bias"] = np.zeros((7,), np.float32)
    with pytest.raises(ValueError, match="fc2.bias"):
        model.load_state_dict(bad)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name])  # nothing changed, not even fc1.weight
    with pytest.raises(KeyError, match="missing keys"):
        model.load_state_dict({"fc1.weight": before["fc1.weight"]})


def test_inference_trace_and_interpreter_match_numpy():
    model = TwoLayer()
    traced = trace_step(model, None, {"x": mn.f32[3, 6]}, None)
    x = np.random.default_rng(0).normal(size=(3, 6)).astype(np.float32)
    params = {k: p.numpy() for k, p in traced.parameters.items()}
    got = interpret(traced.graph, {"x": x}, params).outputs["output"]
    hidden = np.maximum(x @ params["fc1.weight"].T + params["fc1.bias"], 0)
    np.testing.assert_allclose(got, hidden @ params["fc2.weight"].T + params["fc2.bias"], rtol=1e-5, atol=1e-6)


def test_rebuilt_copies_replaces_and_skips_nodes_and_follows_the_roots():
    """Graph.rebuilt, the passes after extraction's copy: a node `replace` leaves (None) is copied
    with its inputs renumbered, one it replaces is what `replace` appended, one it skips (SKIP)
    has no node, and outputs and updates name the new ids."""
    t = TensorType((3,))
    graph = Graph()
    x = graph.add("input", (), t, {"name": "x"})
    w = graph.add("param", (), t, {"name": "w"})
    scratch = graph.add("neg", (x,), t)  # dead: skipped
    product = graph.add("mul", (x, w), t)
    graph.outputs["y"] = graph.add("exp", (product,), t)
    graph.updates["w"] = product

    def replace(node, new, new_id):
        if node.id == scratch:
            return SKIP
        if node.op == "mul":  # x·w becomes x + w
            return new.add("add", tuple(new_id[i] for i in node.inputs), node.types, {}, node.sources)
        return None

    rebuilt = graph.rebuilt(replace)
    assert [n.op for n in rebuilt] == ["input", "param", "add", "exp"]
    assert rebuilt[rebuilt.outputs["y"]].inputs == (rebuilt.updates["w"],) and rebuilt.updates["w"] == 2
    assert [n.op for n in graph] == ["input", "param", "neg", "mul", "exp"]  # the original is untouched
