"""Convolutions in their plain im2col form: F.conv2d against a direct numpy convolution, unfold and
fold against reference loops (and fold as unfold's adjoint), their gradients by finite
differences mid-chain, the unfold/fold kernels against the interpreter on the default adapter,
nn.Conv2d's PyTorch layout and init, and a tiny conv net trained on the GPU step for step like
the interpreter, with and without the e-graph's rewrites."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, gradcheck, one_op, trace_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.ops.image import evaluate_fold, evaluate_unfold
from meganeura.ir.trace import Tracer, tracing

# (input shape, weight shape, stride, padding): stride 1 and 2, padding 0/1/(2,1), non-square
# kernels (3×2, 1×3), odd spatial sizes (7×5), 1×1 kernels.
GEOMETRIES = [
    ((2, 3, 7, 5), (4, 3, 3, 3), 1, 0),
    ((2, 3, 7, 5), (4, 3, 3, 3), 2, 1),
    ((1, 2, 7, 5), (3, 2, 3, 2), 1, (2, 1)),
    ((2, 2, 7, 5), (3, 2, 1, 3), 2, (2, 1)),
    ((2, 3, 7, 5), (5, 3, 1, 1), 1, 0),
    ((1, 3, 6, 7), (2, 3, 3, 2), (2, 1), 1),
]
GEOMETRY_IDS = ["3x3", "3x3-s2-p1", "3x2-p21", "1x3-s2-p21", "1x1", "3x2-s21-p1"]


def as_pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


def conv_reference(x, w, b, stride, padding):
    """A direct convolution (cross-correlation, as torch's conv2d), one output position at a time."""
    (sh, sw), (ph, pw) = as_pair(stride), as_pair(padding)
    n, _, h, width = x.shape
    o, _, kh, kw = w.shape
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho, wo = (h + 2 * ph - kh) // sh + 1, (width + 2 * pw - kw) // sw + 1
    out = np.zeros((n, o, ho, wo))
    for y in range(ho):
        for xx in range(wo):
            patch = padded[:, :, y * sh : y * sh + kh, xx * sw : xx * sw + kw]
            out[:, :, y, xx] = np.einsum("ncij,ocij->no", patch, w)
    return out if b is None else out + b[None, :, None, None]


def unfold_reference(x, kernel, stride, padding):
    """im2col by loops: column row (c·kh + i)·kw + j, column ho·Wo + wo, 0 in the padding."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, w = x.shape
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    cols = np.zeros((n, c * kh * kw, ho * wo))
    for ch, i, j, oy, ox in np.ndindex(c, kh, kw, ho, wo):
        y, xx = oy * sh - ph + i, ox * sw - pw + j
        if 0 <= y < h and 0 <= xx < w:
            cols[:, (ch * kh + i) * kw + j, oy * wo + ox] = x[:, ch, y, xx]
    return cols


def fold_reference(cols, size, kernel, stride, padding):
    """col2im by loops: every column entry added onto the pixel it was read from."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    h, w = size
    n, ck, _ = cols.shape
    c = ck // (kh * kw)
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.zeros((n, c, h, w))
    for ch, i, j, oy, ox in np.ndindex(c, kh, kw, ho, wo):
        y, xx = oy * sh - ph + i, ox * sw - pw + j
        if 0 <= y < h and 0 <= xx < w:
            out[:, ch, y, xx] += cols[:, (ch * kh + i) * kw + j, oy * wo + ox]
    return out


def window(weight_shape, stride, padding):
    return weight_shape[2:], as_pair(stride), as_pair(padding)


# -- forward values ---------------------------------------------------------------------------


def traced_conv(x_shape, w_shape, stride, padding, bias: bool):
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType(x_shape))
        w = trace_leaf(tracer, "input", "w", TensorType(w_shape))
        b = trace_leaf(tracer, "input", "b", TensorType(w_shape[:1])) if bias else None
        out = F.conv2d(x, w, b, stride=stride, padding=padding)
    tracer.graph.outputs["out"] = out.node
    return tracer.graph


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("x_shape, w_shape, stride, padding", GEOMETRIES, ids=GEOMETRY_IDS)
def test_conv2d_matches_a_direct_convolution(x_shape, w_shape, stride, padding, bias):
    rng = np.random.default_rng(0)
    graph = traced_conv(x_shape, w_shape, stride, padding, bias)
    feeds = {"x": rng.normal(size=x_shape), "w": rng.normal(size=w_shape), "b": rng.normal(size=w_shape[:1])}
    if not bias:
        del feeds["b"]
    got = interpret(graph, feeds, dtype=np.float64).outputs["out"]
    expected = conv_reference(feeds["x"], feeds["w"], feeds.get("b"), stride, padding)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert [n.op for n in graph if n.op in ("unfold", "matmul")] == ["unfold", "matmul"]  # the plain im2col form


def test_conv2d_string_padding_and_unbatched_input():
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(3, 6, 5)), rng.normal(size=(2, 3, 3, 1))
    tracer = Tracer()
    with tracing(tracer):
        xs = trace_leaf(tracer, "input", "x", TensorType(x.shape))
        ws = trace_leaf(tracer, "input", "w", TensorType(w.shape))
        same, valid = F.conv2d(xs, ws, padding="same"), F.conv2d(xs, ws, padding="valid")
    tracer.graph.outputs.update(same=same.node, valid=valid.node)
    out = interpret(tracer.graph, {"x": x, "w": w}, dtype=np.float64).outputs
    np.testing.assert_allclose(out["same"], conv_reference(x[None], w, None, 1, (1, 0))[0], rtol=1e-12)
    np.testing.assert_allclose(out["valid"], conv_reference(x[None], w, None, 1, 0)[0], rtol=1e-12)
    assert out["same"].shape == (2, 6, 5) and out["valid"].shape == (2, 4, 5)


def test_unsupported_conv_options_are_refused_clearly():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((1, 2, 6, 6)))
        w = trace_leaf(tracer, "input", "w", TensorType((3, 2, 3, 3)))
        with pytest.raises(
            mn.ShapeError, match=r"test_conv\.py:\d+: conv2d: Given groups=2, expected weight to be divisible by 2"
        ):
            F.conv2d(x, w, groups=2)
        with pytest.raises(ValueError, match=r"test_conv\.py:\d+: conv2d: non-positive groups"):
            F.conv2d(x, w, groups=0)
        with pytest.raises(mn.ShapeError, match=r"conv2d: expected input \[N, 6, H, W\] .* in 3 group\(s\)"):
            F.conv2d(x, trace_leaf(tracer, "input", "g", TensorType((3, 2, 3, 3))), groups=3)
        with pytest.raises(ValueError, match="padding='same' is not supported for strided"):
            F.conv2d(x, w, stride=2, padding="same")
        with pytest.raises(ValueError, match="padding must be an int, a pair, 'valid' or 'same'"):
            F.conv2d(x, w, padding="full")
        with pytest.raises(
            mn.ShapeError, match=r"test_conv\.py:\d+: unfold: kernel \(3, 3\) \(dilated to 7\) is larger"
        ):
            F.unfold(x, 3, dilation=3)
        with pytest.raises(mn.ShapeError, match=r"test_conv\.py:\d+: conv2d: dilation: expected an int or a pair"):
            F.conv2d(x, w, dilation=(1, 2, 3))
        with pytest.raises(mn.ShapeError, match=r"test_conv\.py:\d+: conv2d: expected input \[N, 2, H, W\]"):
            F.conv2d(trace_leaf(tracer, "input", "y", TensorType((1, 3, 6, 6))), w)
        with pytest.raises(mn.ShapeError, match=r"test_conv\.py:\d+: unfold: kernel \(7, 7\) is larger"):
            F.unfold(x, 7)
        with pytest.raises(mn.ShapeError, match="kernel_size: expected an int or a pair"):
            F.unfold(x, (3, 3, 3))


@pytest.mark.parametrize("x_shape, w_shape, stride, padding", GEOMETRIES, ids=GEOMETRY_IDS)
def test_unfold_and_fold_match_reference_loops_and_are_adjoint(x_shape, w_shape, stride, padding):
    rng = np.random.default_rng(2)
    kernel, stride, padding = window(w_shape, stride, padding)
    x = rng.normal(size=x_shape)
    cols = evaluate_unfold(x, kernel, stride, padding)
    np.testing.assert_array_equal(cols, unfold_reference(x, kernel, stride, padding))
    y = rng.normal(size=cols.shape)
    image = evaluate_fold(y, x_shape[2:], kernel, stride, padding)
    np.testing.assert_allclose(image, fold_reference(y, x_shape[2:], kernel, stride, padding), rtol=1e-13, atol=1e-13)
    # ⟨unfold x, y⟩ = ⟨x, fold y⟩
    assert np.vdot(cols, y) == pytest.approx(np.vdot(x, image), rel=1e-12)


def test_functional_unfold_and_fold_trace_torch_semantics():
    """F.unfold / F.fold take torch's arguments (kernel_size, dilation, padding, stride; ints or pairs)."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 3, 7, 5))
    tracer = Tracer()
    with tracing(tracer):
        xs = trace_leaf(tracer, "input", "x", TensorType(x.shape))
        cols = F.unfold(xs, (3, 2), padding=(2, 1), stride=2)
        image = F.fold(cols, output_size=(7, 5), kernel_size=(3, 2), padding=(2, 1), stride=2)
    tracer.graph.outputs.update(cols=cols.node, image=image.node)
    out = interpret(tracer.graph, {"x": x}, dtype=np.float64).outputs
    cols_ref = unfold_reference(x, (3, 2), (2, 2), (2, 1))
    np.testing.assert_array_equal(out["cols"], cols_ref)
    np.testing.assert_allclose(out["image"], fold_reference(cols_ref, (7, 5), (3, 2), (2, 2), (2, 1)), rtol=1e-13)


# -- gradients --------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("x_shape, w_shape, stride, padding", GEOMETRIES, ids=GEOMETRY_IDS)
def test_conv2d_gradients_mid_chain(x_shape, w_shape, stride, padding, bias):
    """conv → tanh → weighted sum, w.r.t. input, weight and bias."""
    if bias:

        def op(x, w, b):
            return F.tanh(F.conv2d(x, w, b, stride=stride, padding=padding))

        shapes = [x_shape, w_shape, w_shape[:1]]
    else:

        def op(x, w):
            return F.tanh(F.conv2d(x, w, stride=stride, padding=padding))

        shapes = [x_shape, w_shape]
    assert gradcheck(op, shapes, np.random.default_rng(4)) < 1e-6


@pytest.mark.parametrize("x_shape, w_shape, stride, padding", GEOMETRIES, ids=GEOMETRY_IDS)
def test_unfold_and_fold_gradients_mid_chain(x_shape, w_shape, stride, padding):
    kernel, stride, padding = window(w_shape, stride, padding)
    x_shape = (1, *x_shape[1:])

    def through_unfold(x):
        return F.tanh(F.unfold(x, kernel, padding=padding, stride=stride))

    assert gradcheck(through_unfold, [x_shape], np.random.default_rng(5)) < 1e-6
    cols_shape = evaluate_unfold(np.zeros(x_shape), kernel, stride, padding).shape

    def through_fold(cols):
        return F.tanh(F.fold(cols, x_shape[2:], kernel, padding=padding, stride=stride))

    assert gradcheck(through_fold, [cols_shape], np.random.default_rng(6)) < 1e-6


def test_conv_backward_is_fold_and_a_batch_summed_weight_product():
    """The input gradient is fold(Wᵀ·g), the weight gradient sums the batch of g·colsᵀ."""
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "param", "x", TensorType((2, 3, 7, 5)))
        w = trace_leaf(tracer, "param", "w", TensorType((4, 3, 3, 3)))
        loss = F.sum(F.conv2d(x, w, padding=1))
    grads = gradients(tracer.graph, loss.node, [x.node, w.node])
    graph = tracer.graph
    assert graph[grads[x.node]].op == "fold"
    assert graph[grads[x.node]].attr("output_size") == (7, 5) and graph[grads[x.node]].attr("padding") == (1, 1)
    assert graph[graph[grads[x.node]].inputs[0]].op == "matmul"
    ops = {graph[i].op for i in range(loss.node, len(graph))}
    assert {"fold", "matmul", "sum"} <= ops


# -- kernels ----------------------------------------------------------------------------------

# Shapes whose element counts divide neither 64 nor 256.
KERNEL_CASES = [
    ((3, 5, 11, 9), (3, 3), (1, 1), (0, 0)),
    ((3, 5, 11, 9), (3, 3), (2, 2), (1, 1)),
    ((2, 3, 7, 5), (3, 2), (1, 1), (2, 1)),
    ((2, 3, 7, 5), (1, 3), (2, 2), (2, 1)),
    ((1, 7, 13, 10), (1, 1), (1, 1), (0, 0)),
    ((2, 3, 9, 7), (3, 2), (2, 1), (1, 1)),
    ((1, 2, 8, 8), (2, 2), (3, 3), (0, 1)),  # windows that skip pixels and pixels no window reads
]


@pytest.mark.parametrize("x_shape, kernel, stride, padding", KERNEL_CASES)
def test_unfold_kernel(x_shape, kernel, stride, padding):
    rng = np.random.default_rng(7)
    graph = one_op("unfold", [x_shape], kernel=kernel, stride=stride, padding=padding)
    check(graph, {"x0": rng.normal(size=x_shape).astype(np.float32)})


@pytest.mark.parametrize("x_shape, kernel, stride, padding", KERNEL_CASES)
def test_fold_kernel(x_shape, kernel, stride, padding):
    rng = np.random.default_rng(8)
    cols_shape = evaluate_unfold(np.zeros(x_shape), kernel, stride, padding).shape
    attrs = {"output_size": x_shape[2:], "kernel": kernel, "stride": stride, "padding": padding}
    graph = one_op("fold", [cols_shape], **attrs)
    executable = check(graph, {"x0": rng.normal(size=cols_shape).astype(np.float32)})
    assert "atomic" not in executable.kernels[0].wgsl  # a gather, deterministic


# -- modules ----------------------------------------------------------------------------------


def test_conv2d_module_uses_pytorch_layout_names_and_init_bounds():
    nn.manual_seed(0)
    layer = nn.Conv2d(6, 16, (5, 3), stride=2, padding=1)
    assert layer.weight.shape == (16, 6, 5, 3) and layer.bias.shape == (16,)
    bound = 1 / np.sqrt(6 * 5 * 3)
    w, b = layer.weight.numpy(), layer.bias.numpy()
    assert w.dtype == np.float32 and np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert abs(w.std() - bound / np.sqrt(3)) < 0.1 * bound  # U(−bound, bound)
    assert np.abs(w).max() > 0.9 * bound
    assert repr(layer) == "Conv2d(6, 16, kernel_size=(5, 3), stride=(2, 2), padding=(1, 1))"
    assert repr(nn.Conv2d(3, 8, 3, bias=False)) == "Conv2d(3, 8, kernel_size=(3, 3), stride=(1, 1), bias=False)"
    assert nn.Conv2d(3, 8, 1, bias=False).bias is None
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2))
    assert list(model.state_dict()) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    assert repr(nn.Flatten()) == "Flatten(start_dim=1, end_dim=-1)"
    grouped = nn.Conv2d(4, 6, 3, groups=2, dilation=2, padding_mode="reflect", padding=2)
    assert grouped.weight.shape == (6, 2, 3, 3) and grouped.dilation == (2, 2)
    assert repr(grouped) == (
        "Conv2d(4, 6, kernel_size=(3, 3), stride=(1, 1), padding=(2, 2), dilation=(2, 2), groups=2, "
        "padding_mode=reflect)"
    )
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(4, 4, 3, groups=3)


class ChannelMismatch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        return self.conv(x)  # the line the error names


def test_channel_mismatch_names_the_users_line():
    line = ChannelMismatch.forward.__code__.co_firstlineno + 1
    with pytest.raises(mn.ShapeError, match=rf"test_conv\.py:{line}: conv2d: expected input \[N, 3, H, W\]"):
        mn.compile(ChannelMismatch(), inputs={"x": mn.f32[2, 2, 8, 8]})


def test_flatten_and_a_conv_classifier_trace_like_torch():
    rng = np.random.default_rng(9)
    nn.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 5 * 4, 2))
    program = mn.compile(model, inputs={"x": mn.f32[2, 2, 5, 4]})
    x = rng.normal(size=(2, 2, 5, 4)).astype(np.float32)
    state = model.state_dict()
    hidden = np.tanh(conv_reference(x, state["0.weight"], state["0.bias"], 1, 1)).reshape(2, -1)
    np.testing.assert_allclose(program(x=x), hidden @ state["3.weight"].T + state["3.bias"], rtol=1e-4, atol=1e-5)
    tracer = Tracer()
    with tracing(tracer):
        t = trace_leaf(tracer, "input", "t", TensorType((2, 3, 4, 5)))
        assert t.flatten().shape == (120,)
        assert t.flatten(1).shape == (2, 60)
        assert t.flatten(1, 2).shape == (2, 12, 5)
        assert t.flatten(-2, -1).shape == (2, 3, 20)
        with pytest.raises(mn.ShapeError, match=r"test_conv\.py:\d+: flatten: start_dim 2 comes after end_dim 1"):
            t.flatten(2, 1)


# -- training ---------------------------------------------------------------------------------

BATCH, CLASSES = 3, 4


class TinyConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 5, 3, padding=1)
        self.conv2 = nn.Conv2d(5, CLASSES, (3, 2), stride=2, padding=(1, 0))

    def forward(self, x):
        return self.conv2(F.relu(self.conv1(x))).mean(dim=(2, 3))


def conv_loss(model, x, y):
    return F.cross_entropy(model(x), y)


@pytest.mark.parametrize("rewrite", [True, False], ids=["fused", "unfused"])
def test_tiny_conv_net_trains_on_the_gpu_like_the_interpreter(rewrite):
    mn.manual_seed(0)
    program = mn.compile(
        TinyConvNet(),
        loss=conv_loss,
        inputs={"x": mn.f32[BATCH, 2, 9, 7], "y": mn.i32[BATCH]},
        optimizer=optim.Adam(lr=1e-2),
        rewrite=rewrite,
    )
    rng = np.random.default_rng(10)
    x = rng.normal(size=(BATCH, 2, 9, 7)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=BATCH).astype(np.int32)
    losses = assert_steps_follow_interpreter(program, [{"x": x, "y": y}] * 5)
    assert losses[-1] < losses[0]
    if not rewrite:  # the plain form runs as traced (the rewrites may make implicit-GEMM kernels of it)
        kernel_ops = {spec.label.split()[0] for spec in program.executable.kernels}
        assert {"unfold", "fold"} <= kernel_ops
