"""mn.load_onnx: ONNX graphs built with the onnx package, run as meganeura modules.

Each graph's output is compared with onnx.reference.ReferenceEvaluator (the onnx package's own
numpy evaluator), with onnxruntime where it is installed, on the numpy interpreter (the traced
graph) and on the GPU (an inference program); shapes are ragged (not tile multiples). A training
step runs and the loss goes down; the unsupported-op error lists every op and attribute.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import optim
from meganeura.compiler import trace_step
from meganeura.ir.interpret import interpret

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

RNG = np.random.default_rng(11)


def weight(*shape: int, scale: float = 0.5) -> np.ndarray:
    return (RNG.normal(size=shape) * scale).astype(np.float32)


def model_of(nodes, inputs, outputs, initializers, opset: int = 17):
    graph = helper.make_graph(
        nodes,
        "test",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in inputs],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        [numpy_helper.from_array(value, name) for name, value in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model


def reference(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ReferenceEvaluator(model).run(None, feeds)


def onnxruntime_outputs(model, feeds):
    """onnxruntime's outputs, the model declared at the newest IR version the installed onnxruntime
    reads where the onnx package writes a newer one (on the H200 machine, 2026-12-01, onnx wrote IR 14
    and onnxruntime read up to 13; the ops these tests use are the same in both)."""
    ort = pytest.importorskip("onnxruntime")
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:
        newest = re.search(r"max supported IR version: (\d+)", str(error))
        if newest is None:
            raise
        older = onnx.ModelProto()
        older.CopyFrom(model)
        older.ir_version = int(newest.group(1))
        session = ort.InferenceSession(older.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def interpreted(module, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The module's traced forward on the numpy interpreter (float64)."""
    specs = {name: mn.f32[value.shape] for name, value in feeds.items()}
    traced = trace_step(module, None, specs, None)
    params = {name: p.numpy() for name, p in module.named_parameters()}
    states = {name: b.numpy() for name, b in module.named_buffers()}
    out = interpret(traced.graph, feeds, params, states, dtype=np.float64).outputs
    return [out[name] for name in sorted(out)]


def assert_all_agree(model, feeds: dict[str, np.ndarray], eval_mode: bool = True, rtol=1e-4, atol=1e-4):
    """The ONNX reference evaluator, the interpreter and the GPU give the same outputs."""
    module = mn.load_onnx(model)
    if eval_mode:
        module.eval()
    expected = reference(model, feeds)
    for got, want in zip(interpreted(module, feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    program = mn.compile(module, inputs={name: mn.f32[value.shape] for name, value in feeds.items()})
    gpu = program(**feeds)
    gpu = list(gpu) if isinstance(gpu, tuple) else [gpu]
    for got, want in zip(gpu, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return module, expected


# -- models -----------------------------------------------------------------------------------


def mlp_model(n_in=13, hidden=19, n_out=5):
    """What torch.onnx exports for Linear → ReLU → Linear: Gemm with transB=1."""
    init = {
        "fc1.weight": weight(hidden, n_in),
        "fc1.bias": weight(hidden),
        "fc2.weight": weight(n_out, hidden),
        "fc2.bias": weight(n_out),
    }
    nodes = [
        helper.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["logits"], transB=1),
    ]
    return model_of(nodes, [("x", ["batch", n_in])], ["logits"], init)


def cnn_model(channels=3, filters=6, classes=4):
    init = {
        "conv.weight": weight(filters, channels, 3, 3),
        "conv.bias": weight(filters),
        "bn.weight": RNG.uniform(0.5, 1.5, filters).astype(np.float32),
        "bn.bias": weight(filters),
        "bn.running_mean": weight(filters),
        "bn.running_var": RNG.uniform(0.5, 2.0, filters).astype(np.float32),
        "onnx::Gemm_7": weight(classes, filters),
        "fc.bias": weight(classes),
    }
    nodes = [
        helper.make_node("Conv", ["image", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node(
            "BatchNormalization",
            ["c", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
            ["b"],
            epsilon=1e-5,
            momentum=0.9,
        ),
        helper.make_node("Relu", ["b"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "onnx::Gemm_7", "fc.bias"], ["logits"], transB=1),
    ]
    return model_of(nodes, [("image", ["N", channels, 9, 11])], ["logits"], init)


def attention_like_model(seq=7, dim=10):
    init = {"ln.weight": RNG.uniform(0.5, 1.5, dim).astype(np.float32), "ln.bias": weight(dim), "proj": weight(dim, 6)}
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln.weight", "ln.bias"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["n", "proj"], ["m"]),
        helper.make_node("Softmax", ["m"], ["probs"], axis=-1),
    ]
    return model_of(nodes, [("x", [3, seq, dim])], ["probs"], init)


def shapes_model():
    """Reshape (with 0 and −1), Transpose, the pointwise ops, AveragePool, Gelu; two inputs, two outputs."""
    init = {"shape": np.array([0, -1, 4], np.int64), "scale": weight(4), "w": weight(4, 3)}
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),  # [2, 3, 8] → [2, 6, 4]
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),  # [2, 4, 6]
        helper.make_node("Sub", ["t", "y"], ["d"]),  # y [4, 6] broadcasts
        helper.make_node("Tanh", ["d"], ["th"]),
        helper.make_node("Transpose", ["th"], ["back"], perm=[0, 2, 1]),  # [2, 6, 4]
        helper.make_node("Mul", ["back", "scale"], ["s"]),
        helper.make_node("Sigmoid", ["s"], ["sg"]),
        helper.make_node("Div", ["sg", "x2"], ["q"]),
        helper.make_node("Add", ["q", "s"], ["sum"]),
        helper.make_node("MatMul", ["sum", "w"], ["out1"]),  # [2, 6, 3]
        helper.make_node("Reshape", ["out1", "img_shape"], ["img"]),
        helper.make_node("AveragePool", ["img"], ["avg"], kernel_shape=[3, 2], strides=[1, 1]),
        helper.make_node("Gelu", ["avg"], ["out2"]),
    ]
    init["x2"] = RNG.uniform(1.0, 2.0, (1, 6, 4)).astype(np.float32)
    init["img_shape"] = np.array([2, 1, 6, 3], np.int64)
    return model_of(nodes, [("x", [2, 3, 8]), ("y", [4, 6])], ["out1", "out2"], init, opset=20)


# -- the outputs agree ------------------------------------------------------------------------------


def test_mlp_with_gemm_matches_the_reference():
    model = mlp_model()
    x = RNG.normal(size=(7, 13)).astype(np.float32)
    module, expected = assert_all_agree(model, {"x": x})
    assert [name for name, _ in module.named_parameters()] == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    np.testing.assert_array_equal(module.state_dict()["fc1.weight"], numpy_helper.to_array(model.graph.initializer[0]))
    for got, want in zip(onnxruntime_outputs(model, {"x": x}), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cnn_matches_the_reference_in_eval_mode():
    model = cnn_model()
    image = RNG.normal(size=(2, 3, 9, 11)).astype(np.float32)
    module, expected = assert_all_agree(model, {"image": image})
    # PyTorch's order: the root's own parameters, then each child's
    assert list(module.state_dict()) == [
        "onnx__Gemm_7", "conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
        "fc.bias",
    ]  # fmt: skip
    assert [name for name, _ in module.named_buffers()] == ["bn.running_mean", "bn.running_var"]
    assert "bn.running_mean" not in dict(module.named_parameters())
    for got, want in zip(onnxruntime_outputs(model, {"image": image}), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_layer_norm_matmul_softmax_match_the_reference():
    model = attention_like_model()
    x = RNG.normal(size=(3, 7, 10)).astype(np.float32)
    _, expected = assert_all_agree(model, {"x": x})
    np.testing.assert_allclose(expected[0].sum(-1), 1.0, rtol=1e-5)
    for got, want in zip(onnxruntime_outputs(model, {"x": x}), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_reshape_transpose_and_pointwise_ops_match_the_reference():
    model = shapes_model()
    feeds = {"x": RNG.normal(size=(2, 3, 8)).astype(np.float32), "y": RNG.normal(size=(4, 6)).astype(np.float32)}
    module, expected = assert_all_agree(model, feeds)
    assert [e.shape for e in expected] == [(2, 6, 3), (2, 1, 4, 2)]
    for got, want in zip(onnxruntime_outputs(model, feeds), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_positional_inputs_follow_graph_order_and_bad_calls_say_why():
    module = mn.load_onnx(shapes_model())
    feeds = {"x": RNG.normal(size=(2, 3, 8)).astype(np.float32), "y": RNG.normal(size=(4, 6)).astype(np.float32)}
    positional = mn.compile(PositionalCall(module), inputs={"a": mn.f32[2, 3, 8], "b": mn.f32[4, 6]})
    keywords = mn.compile(module, inputs={"x": mn.f32[2, 3, 8], "y": mn.f32[4, 6]})
    for got, want in zip(positional(a=feeds["x"], b=feeds["y"]), keywords(**feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match=r"missing \['y'\]"):
        mn.compile(module, inputs={"x": mn.f32[2, 3, 8]})
    with pytest.raises(ValueError, match=r"expected shape \[2, 3, 8\]"):
        mn.compile(module, inputs={"x": mn.f32[2, 3, 9], "y": mn.f32[4, 6]})
    assert module.input_specs()["x"].shape == (2, 3, 8)
    assert mn.load_onnx(mlp_model()).input_specs(batch=5)["x"].shape == (5, 13)
    with pytest.raises(ValueError, match="batch"):
        mn.load_onnx(mlp_model()).input_specs()


class PositionalCall(mn.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, a, b):
        return self.inner(a, b)


def test_a_file_path_loads_and_softmax_before_opset_13_is_two_dimensional(tmp_path):
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=1)]  # opset 11: softmax over dims 1.. flattened
    model = model_of(nodes, [("x", [2, 3, 5])], ["y"], {}, opset=11)
    path = tmp_path / "softmax.onnx"
    onnx.save(model, path)
    x = RNG.normal(size=(2, 3, 5)).astype(np.float32)
    got = interpreted(mn.load_onnx(str(path)), {"x": x})[0]
    # onnx.reference's Softmax-1 normalises over axis 1 alone; the spec (and onnxruntime) flatten
    rows = np.exp(x.reshape(2, 15).astype(np.float64))
    np.testing.assert_allclose(got, (rows / rows.sum(-1, keepdims=True)).reshape(x.shape), rtol=1e-6, atol=1e-7)
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return
    np.testing.assert_allclose(got, onnxruntime_outputs(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_gemm_attributes_and_padded_pools_match_the_reference():
    init = {"a": weight(5, 3), "c": weight(1, 7)}
    nodes = [
        helper.make_node("Gemm", ["a", "x", "c"], ["g"], transA=1, alpha=0.5, beta=2.0),  # aᵀ [3, 5] · x [5, 7]
        helper.make_node("Reshape", ["g", "img_shape"], ["img"]),  # [3, 7] as an image [1, 1, 3, 7]
        helper.make_node("AveragePool", ["img"], ["avg"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        helper.make_node("MaxPool", ["avg"], ["mx"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["mx"], ["out"]),
    ]
    init["img_shape"] = np.array([1, 1, 3, 7], np.int64)
    model = model_of(nodes, [("x", [5, 7])], ["out"], init)
    x = RNG.normal(size=(5, 7)).astype(np.float32)
    got = interpreted(mn.load_onnx(model), {"x": x})[0]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_constant_nodes_are_static_shapes_or_untrained_buffers():
    offset = weight(2, 6)
    nodes = [
        helper.make_node("Constant", [], ["shape"], value=numpy_helper.from_array(np.array([2, 6], np.int64))),
        helper.make_node("Constant", [], ["offset"], value=numpy_helper.from_array(offset)),
        helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, np.float32))),
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Add", ["r", "offset"], ["a"]),
        helper.make_node("Mul", ["a", "half"], ["m"]),
        helper.make_node("Identity", ["m"], ["y"]),
    ]
    model = model_of(nodes, [("x", [3, 4])], ["y"], {})
    module = mn.load_onnx(model)
    assert list(module.named_parameters()) == [] and [n for n, _ in module.named_buffers()] == ["offset"]
    x = RNG.normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(interpreted(module, {"x": x})[0], (x.reshape(2, 6) + offset) * 0.5, rtol=1e-6)


# -- training --------------------------------------------------------------------------------------


def test_the_cnn_trains_and_batch_norm_updates_its_running_statistics():
    module = mn.load_onnx(cnn_model())
    images = RNG.normal(size=(4, 3, 9, 11)).astype(np.float32)
    labels = np.array([0, 1, 2, 3], np.int32)
    before_mean = module.bn.running_mean.numpy()

    def loss_fn(model, image, y):
        return F.cross_entropy(model(image), y)

    step = mn.compile(module, loss_fn, {"image": mn.f32[4, 3, 9, 11], "y": mn.i32[4]}, optim.Adam(lr=0.02))
    losses = [step.train_step(image=images, y=labels) for _ in range(8)]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)) and losses[-1] < 0.85 * losses[0], losses
    # training mode: batch statistics, and the buffers move with PyTorch's momentum 1 − 0.9
    assert not np.allclose(module.bn.running_mean.numpy(), before_mean)
    start = mn.load_onnx(cnn_model())  # new random weights: just check the state names train
    assert set(start.state_dict()) == set(module.state_dict())


def test_the_mlp_training_steps_follow_the_interpreter():
    from conftest import assert_steps_follow_interpreter

    module = mn.load_onnx(mlp_model())

    def loss_fn(model, x, y):
        return F.cross_entropy(model(x), y)

    step = mn.compile(module, loss_fn, {"x": mn.f32[6, 13], "y": mn.i32[6]}, optim.SGD(lr=0.1))
    feeds = [
        {"x": RNG.normal(size=(6, 13)).astype(np.float32), "y": RNG.integers(0, 5, 6).astype(np.int32)}
        for _ in range(3)
    ]
    losses = assert_steps_follow_interpreter(step, feeds * 2)
    assert losses[3] < losses[0] and losses[4] < losses[1]


# -- errors ------------------------------------------------------------------------------------------


def test_unsupported_ops_and_attributes_are_all_listed_before_anything_is_built():
    init = {"w": weight(4, 3, 3, 3), "w2": weight(4, 3, 3, 3)}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], dilations=[2, 2]),
        helper.make_node("Conv", ["x", "w2"], ["c2"], auto_pad="SAME_UPPER"),
        helper.make_node("Erf", ["c"], ["e"]),
        helper.make_node("Erf", ["e"], ["e2"]),
        helper.make_node("LeakyRelu", ["e2"], ["l"]),
        helper.make_node("MaxPool", ["l"], ["m"], kernel_shape=[2, 2], ceil_mode=1),
        helper.make_node("Add", ["m", "c2"], ["y"]),
    ]
    model = model_of(nodes, [("x", [1, 3, 8, 8])], ["y"], init)
    with pytest.raises(mn.OnnxImportError) as error:
        mn.load_onnx(model)
    text = str(error.value)
    assert "unsupported ops: Erf ×2, LeakyRelu ×1" in text
    assert "dilations=[2, 2]" in text and "auto_pad='SAME_UPPER'" in text and "ceil_mode=1" in text
    assert isinstance(error.value, NotImplementedError)


def test_grouped_convolutions_and_foreign_domains_are_named():
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], group=3),
        helper.make_node("FusedThing", ["c"], ["y"], domain="com.example"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight(3, 1, 3, 3), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    with pytest.raises(mn.OnnxImportError, match=r"(?s)com\.example::FusedThing ×1.*group=3"):
        mn.load_onnx(model)


def test_names_are_sanitised_to_dotted_module_paths():
    from meganeura.onnx_import import sanitized, unique_names

    assert sanitized("fc1.weight") == "fc1.weight"
    assert sanitized("onnx::Conv_7") == "onnx__Conv_7"
    assert sanitized("/layer1/conv/weight") == "p_layer1_conv_weight"
    assert sanitized("forward") == "forward_" and sanitized("bn.training") == "bn.training_"
    assert sanitized("a..b") == "a.b" and sanitized("0.weight") == "0.weight"
    names = unique_names(["a", "a.b", "a:b", "a_b"])
    assert names == {"a": "a", "a.b": "a_1.b", "a:b": "a_b", "a_b": "a_b_1"}


def test_a_missing_onnx_package_gives_a_clear_import_error(monkeypatch):
    import builtins

    from meganeura import onnx_import

    real_import = builtins.__import__

    def no_onnx(name, *args, **kwargs):
        if name == "onnx" or name.startswith("onnx."):
            raise ImportError("No module named 'onnx'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnx)
    with pytest.raises(ImportError, match=r"pip install 'meganeura\[interop\]'"):
        onnx_import.load_onnx("model.onnx")
