"""Grouped, depthwise and dilated convolutions, conv1d and transposed convolutions: the traced
im2col forms against direct numpy loops, their gradients by finite differences mid-chain, the
`conv_gemm` kernel with `groups` and `dilation` and the dilated unfold/fold kernels against the
interpreter at ragged shapes on the default adapter, the conv rules making implicit-GEMM kernels
of every one of them in a training step (a transposed convolution's forward included), and a
small net of them training on the GPU like the interpreter. (Values against PyTorch:
test_conv_torch.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    PROPERTY,
    assert_same_results,
    assert_steps_follow_interpreter,
    check,
    emit,
    gradcheck,
    live_nodes,
    one_op,
    run_traced,
    seeds,
    trace_leaf,
    typed_leaf,
)
from hypothesis import given
from hypothesis import strategies as st

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen import conv as codegen_conv
from meganeura.codegen.gemm_table import GemmTiling
from meganeura.codegen.lower import lower_node
from meganeura.compiler import explain_only, trace_step
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.ops.image import conv_output_size, evaluate_unfold
from meganeura.ir.trace import Tracer, tracing
from meganeura.passes import compile_step
from meganeura.rewrite import optimize
from meganeura.target import Target

RNG = np.random.default_rng(17)
H100 = Target("NVIDIA H100", 132, 31, tuning="hopper", workgroup_memory=49152)


def pairs(*values) -> list[tuple[int, int]]:
    return [(v, v) if isinstance(v, int) else tuple(v) for v in values]


def conv_loops(x, w, stride, padding, dilation, groups):
    """out[n, o, y, x] = Σ_{c, i, j} w[o, c, i, j] · x[n, g·C/G + c, y·sh − ph + i·dh, x·sw − pw + j·dw]
    (g = o // (O/G)), 0 outside the image."""
    (sh, sw), (ph, pw), (dh, dw) = pairs(stride, padding, dilation)
    n, _, h, width = x.shape
    o, cg, kh, kw = w.shape
    ho, wo = conv_output_size((h, width), (kh, kw), (sh, sw), (ph, pw), dilation=(dh, dw))
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros((n, o, ho, wo))
    for f in range(o):
        first = f // (o // groups) * cg
        for i in range(kh):
            for j in range(kw):
                rows = padded[:, first : first + cg, i * dh : i * dh + (ho - 1) * sh + 1 : sh]
                window = rows[..., j * dw : j * dw + (wo - 1) * sw + 1 : sw]
                out[:, f] += np.einsum("nchw,c->nhw", window, w[f, :, i, j])
    return out


def transposed_loops(x, w, stride, padding, output_padding, dilation, groups):
    """The adjoint of conv_loops: each input pixel scatters w[c, o, i, j]·x[n, c, y, x] onto
    out[n, g·O/G + o, y·sh − ph + i·dh, x·sw − pw + j·dw]."""
    (sh, sw), (ph, pw), (oph, opw), (dh, dw) = pairs(stride, padding, output_padding, dilation)
    n, c, h, width = x.shape
    _, og, kh, kw = w.shape
    size = ((h - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1, (width - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1)
    out = np.zeros((n, og * groups, size[0] + 2 * ph + kh * dh, size[1] + 2 * pw + kw * dw))
    for ch in range(c):
        first = ch // (c // groups) * og
        for i in range(kh):
            for j in range(kw):
                for y in range(h):
                    for xx in range(width):
                        out[:, first : first + og, y * sh + i * dh, xx * sw + j * dw] += (
                            x[:, ch, y, xx, None] * w[ch, :, i, j]
                        )
    return out[:, :, ph : ph + size[0], pw : pw + size[1]]


def traced(build, **shapes):
    """The graph of out = build(**leaves), its inputs named and shaped by `shapes`."""
    tracer = Tracer()
    with tracing(tracer):
        leaves = {name: trace_leaf(tracer, "input", name, TensorType(shape)) for name, shape in shapes.items()}
        tracer.graph.outputs["out"] = build(**leaves).node
    return tracer.graph


# (x shape, weight shape, stride, padding, dilation, groups)
CONV_CASES = [
    ((2, 4, 9, 8), (6, 2, 3, 2), (1, 2), (2, 1), (2, 1), 2),
    ((2, 3, 7, 6), (3, 1, 3, 3), 2, 1, 1, 3),  # depthwise
    ((1, 3, 6, 7), (6, 1, 3, 3), 1, (1, 2), 2, 3),  # depthwise, 2 filters a channel
    ((2, 3, 11, 10), (4, 3, 3, 3), 2, 2, 2, 1),  # stride and dilation share a factor
    ((1, 2, 12, 11), (3, 2, 3, 3), 3, 1, 2, 1),
    ((2, 6, 7, 5), (6, 2, 1, 3), (2, 1), (0, 2), (1, 3), 3),
]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation, groups", CONV_CASES)
def test_conv2d_matches_direct_loops(x_shape, w_shape, stride, padding, dilation, groups):
    x, w = RNG.normal(size=x_shape), RNG.normal(size=w_shape)
    graph = traced(lambda x, w: F.conv2d(x, w, None, stride, padding, dilation, groups), x=x_shape, w=w_shape)
    got = interpret(graph, {"x": x, "w": w}, dtype=np.float64).outputs["out"]
    np.testing.assert_allclose(got, conv_loops(x, w, stride, padding, dilation, groups), rtol=1e-12, atol=1e-12)


# (x shape, weight shape [C, O/G, kh, kw], stride, padding, output_padding, dilation, groups)
TRANSPOSED_CASES = [
    ((2, 4, 5, 4), (4, 3, 3, 2), (2, 1), (1, 0), (1, 0), (1, 2), 1),
    ((2, 4, 4, 5), (4, 2, 3, 3), 2, 1, 1, 1, 2),
    ((1, 3, 4, 4), (3, 1, 2, 2), 2, 0, 0, 1, 3),  # depthwise
    ((1, 2, 3, 5), (2, 3, 3, 3), 3, 2, 2, 2, 1),
]


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, output_padding, dilation, groups", TRANSPOSED_CASES)
def test_conv_transpose2d_matches_scattering_loops(x_shape, w_shape, stride, padding, output_padding, dilation, groups):
    x, w = RNG.normal(size=x_shape), RNG.normal(size=w_shape)

    def build(x, w):
        return F.conv_transpose2d(x, w, None, stride, padding, output_padding, groups, dilation)

    graph = traced(build, x=x_shape, w=w_shape)
    got = interpret(graph, {"x": x, "w": w}, dtype=np.float64).outputs["out"]
    expected = transposed_loops(x, w, stride, padding, output_padding, dilation, groups)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert [n.op for n in graph if n.op in ("unfold", "fold", "matmul")] == ["matmul", "fold"]  # fold(Wᵀ·x)


def test_conv1d_and_conv_transpose1d_are_their_2d_forms_of_a_height_of_1():
    x, w, wt = RNG.normal(size=(2, 4, 11)), RNG.normal(size=(6, 2, 3)), RNG.normal(size=(4, 3, 4))

    def build(x, w, wt):
        return {
            "conv": F.conv1d(x, w, stride=2, padding=1, dilation=2, groups=2),
            "same": F.conv1d(x, w[:, :, :2], padding="same", groups=2),
            "transposed": F.conv_transpose1d(x, wt, stride=3, padding=1, output_padding=2, dilation=2, groups=2),
            "unbatched": F.conv1d(x[0], w, groups=2),
        }

    out = run_traced(build, {"x": x, "w": w, "wt": wt})
    image = x[:, :, None, :]
    np.testing.assert_allclose(out["conv"], conv_loops(image, w[:, :, None], (1, 2), (0, 1), (1, 2), 2)[:, :, 0])
    same = conv_loops(image, w[:, :, None, :2], 1, (0, 1), 1, 2)[:, :, 0, 1:]  # torch pads the odd one at the end
    np.testing.assert_allclose(out["same"], same, rtol=1e-12, atol=1e-12)
    transposed = transposed_loops(image, wt[:, :, None], (1, 3), (0, 1), (0, 2), (1, 2), 2)[:, :, 0]
    np.testing.assert_allclose(out["transposed"], transposed, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["unbatched"], conv_loops(image[:1], w[:, :, None], 1, 0, 1, 2)[0, :, 0])


def test_padding_same_matches_torchs_uneven_padding():
    """d·(k − 1) padding in all, ⌊half⌋ before and the rest after, per dim (kernel 4: 1 and 2)."""
    x, w = RNG.normal(size=(1, 2, 7, 6)), RNG.normal(size=(3, 2, 4, 3))
    for dilation in (1, (2, 1)):
        graph = traced(lambda x, w, d=dilation: F.conv2d(x, w, padding="same", dilation=d), x=x.shape, w=w.shape)
        got = interpret(graph, {"x": x, "w": w}, dtype=np.float64).outputs["out"]
        dh, dw = pairs(dilation)[0]
        top, left = dh * 3 // 2, dw * 2 // 2
        padded = np.pad(x, ((0, 0), (0, 0), (top, dh * 3 - top), (left, dw * 2 - left)))
        np.testing.assert_allclose(got, conv_loops(padded, w, 1, 0, dilation, 1), rtol=1e-12, atol=1e-12)
        assert got.shape == (1, 3, 7, 6)


def test_convolution_refusals_name_the_users_line():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((1, 4, 6, 6)))
        w = trace_leaf(tracer, "input", "w", TensorType((4, 3, 3, 3)))
        with pytest.raises(ValueError, match=r"test_conv_groups\.py:\d+: conv_transpose2d: output padding must be"):
            F.conv_transpose2d(x, w, stride=2, output_padding=2)
        with pytest.raises(NotImplementedError, match=r"output_padding \(2, 2\) at least the stride"):
            F.conv_transpose2d(x, w, stride=2, output_padding=2, dilation=3)
        with pytest.raises(mn.ShapeError, match=r"conv_transpose2d: expected input \[N, 4, H, W\]"):
            F.conv_transpose2d(trace_leaf(tracer, "input", "y", TensorType((1, 3, 6, 6))), w)
        with pytest.raises(mn.ShapeError, match=r"conv_transpose2d: Given groups=3, expected weight to be divisible"):
            F.conv_transpose2d(x, w, groups=3)
        with pytest.raises(mn.ShapeError, match=r"conv_transpose2d: the output size \(-2, -2\)"):
            F.conv_transpose2d(x, w, padding=5)
        with pytest.raises(mn.ShapeError, match=r"conv1d: expected a weight \[out_channels, in_channels/groups, k\]"):
            F.conv1d(x, w)
        with pytest.raises(mn.ShapeError, match=r"conv1d: stride: expected an int or a 1-tuple"):
            F.conv1d(trace_leaf(tracer, "input", "z", TensorType((2, 3, 7))), w[:, :, 0], stride=(1, 2))


# -- gradients, mid-chain ---------------------------------------------------------------------


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, dilation, groups", CONV_CASES[:3] + CONV_CASES[-1:])
def test_conv2d_gradients_mid_chain(x_shape, w_shape, stride, padding, dilation, groups):
    def op(x, w, b):
        return F.tanh(F.conv2d(x, w, b, stride, padding, dilation, groups))

    assert gradcheck(op, [x_shape, w_shape, w_shape[:1]], np.random.default_rng(1)) < 1e-6


def test_same_padding_and_conv1d_gradients_mid_chain():
    def same(x, w):
        return F.tanh(F.conv2d(x, w, padding="same", dilation=(1, 2)))

    assert gradcheck(same, [(1, 2, 5, 6), (3, 2, 2, 3)], np.random.default_rng(2)) < 1e-6

    def conv1d(x, w, b):
        return F.tanh(F.conv1d(x, w, b, stride=2, padding=1, dilation=2, groups=2))

    assert gradcheck(conv1d, [(2, 4, 9), (4, 2, 3), (4,)], np.random.default_rng(3)) < 1e-6


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, output_padding, dilation, groups", TRANSPOSED_CASES[:3])
def test_conv_transpose2d_gradients_mid_chain(x_shape, w_shape, stride, padding, output_padding, dilation, groups):
    def op(x, w, b):
        return F.tanh(F.conv_transpose2d(x, w, b, stride, padding, output_padding, groups, dilation))

    shapes = [(1, *x_shape[1:]), w_shape, (w_shape[1] * groups,)]
    assert gradcheck(op, shapes, np.random.default_rng(4)) < 1e-6


def test_conv_transpose1d_and_dilated_unfold_fold_gradients_mid_chain():
    def transposed(x, w):
        return F.tanh(F.conv_transpose1d(x, w, stride=2, padding=1, output_padding=1, groups=2))

    assert gradcheck(transposed, [(2, 4, 5), (4, 3, 3)], np.random.default_rng(5)) < 1e-6

    def through_unfold(x):
        return F.tanh(F.unfold(x, (2, 3), dilation=(3, 2), padding=1, stride=(1, 2)))

    assert gradcheck(through_unfold, [(1, 2, 6, 7)], np.random.default_rng(6)) < 1e-6
    cols = evaluate_unfold(np.zeros((1, 2, 6, 7)), (2, 3), (1, 2), (1, 1), (3, 2)).shape

    def through_fold(c):
        return F.tanh(F.fold(c, (6, 7), (2, 3), dilation=(3, 2), padding=1, stride=(1, 2)))

    assert gradcheck(through_fold, [cols], np.random.default_rng(7)) < 1e-6


# -- kernels against the interpreter ----------------------------------------------------------

# (N, C, O, image, kernel, stride, padding, dilation, groups): ragged everywhere; groups of one
# channel (depthwise) and of several; dilation with strides that share a factor with it (phases
# of a strided input gradient that no tap reaches) and that do not; output rows of 4 (the
# gathers' units) in groups.
GROUPED_GEOMETRIES = [
    (3, 4, 6, (9, 8), (3, 2), (1, 2), (2, 1), (2, 1), 2),
    (2, 5, 5, (7, 6), (3, 3), (2, 2), (1, 1), (1, 1), 5),
    (1, 3, 6, (6, 7), (3, 3), (1, 1), (1, 2), (2, 2), 3),
    (2, 3, 4, (11, 10), (3, 3), (2, 2), (2, 2), (2, 2), 1),
    (1, 2, 3, (12, 11), (3, 3), (3, 3), (1, 1), (2, 2), 1),
    (2, 6, 9, (6, 8), (3, 3), (1, 1), (1, 1), (1, 1), 3),
    (2, 8, 12, (9, 7), (1, 3), (2, 1), (0, 2), (1, 3), 4),
]


def geometry_id(geometry) -> str:
    n, c, o, image, kernel, stride, padding, dilation, groups = geometry
    size, window = (
        f"{image[0]}x{image[1]}",
        f"k{kernel[0]}{kernel[1]}-s{stride[0]}{stride[1]}-d{dilation[0]}{dilation[1]}",
    )
    return f"n{n}c{c}o{o}-{size}-{window}-g{groups}"


def grouped_graph(mode: str, geometry, chunks: int = 1, epilogue: str | None = None) -> tuple[Graph, dict]:
    """A one-node conv_gemm graph of `mode` in the grouped layout (weight [G, O/G, C/G·kh·kw],
    gradient [N, G, O/G, L]; the plain one for G = 1), with random inputs."""
    n, c, o, image, kernel, stride, padding, dilation, groups = geometry
    ho, wo = conv_output_size(image, kernel, stride, padding, dilation=dilation)
    k = c // groups * kernel[0] * kernel[1]
    weight = (groups, o // groups, k) if groups > 1 else (o, k)
    gradient = (n, groups, o // groups, ho * wo) if groups > 1 else (n, o, ho * wo)
    shapes = {
        "forward": [weight, (n, c, *image)],
        "grad_input": [weight, gradient],
        "grad_weight": [gradient, (n, c, *image)],
    }
    shapes = shapes[mode] + ([(1, o, 1, 1)] if epilogue else [])
    graph = Graph()
    inputs = [typed_leaf(graph, "input", f"x{i}", shape) for i, shape in enumerate(shapes)]
    attrs = {"mode": mode, "kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}
    attrs.update(image=image, groups=groups, chunks=chunks, epilogue=epilogue or "$acc")
    graph.outputs["out"] = emit(graph, "conv_gemm", inputs, **attrs)
    return graph, {f"x{i}": RNG.normal(size=shape).astype(np.float32) for i, shape in enumerate(shapes)}


@pytest.mark.parametrize("mode", ["forward", "grad_input", "grad_weight"])
@pytest.mark.parametrize("geometry", GROUPED_GEOMETRIES, ids=geometry_id)
def test_grouped_and_dilated_kernels_match_the_interpreter(mode, geometry):
    """An implicit GEMM per group, or where a group has one channel, the direct convolution."""
    graph, feeds = grouped_graph(mode, geometry)
    executable = check(graph, feeds, rtol=1e-4, atol=1e-4)
    depthwise = geometry[1] == geometry[-1]
    assert executable.kernels[0].entry_point == ("elementwise" if depthwise else "conv_gemm")
    assert executable.kernels[0].label.startswith("conv_direct" if depthwise else "conv_gemm")


def test_grouped_numpy_semantics_are_the_loops_and_their_adjoints():
    """forward is conv_loops; grad_input its adjoint (⟨conv(x), g⟩ = ⟨x, grad_input(g)⟩) and grad_weight
    the gradient of ⟨conv(x), g⟩ with respect to the weight."""
    for geometry in GROUPED_GEOMETRIES:
        n, c, o, image, kernel, stride, padding, dilation, groups = geometry
        x, w = RNG.normal(size=(n, c, *image)), RNG.normal(size=(o, c // groups, *kernel))
        forward_graph, _ = grouped_graph("forward", geometry)
        a = w.reshape(groups, o // groups, -1) if groups > 1 else w.reshape(o, -1)
        y = interpret(forward_graph, {"x0": a, "x1": x}, dtype=np.float64).outputs["out"]
        np.testing.assert_allclose(y, conv_loops(x, w, stride, padding, dilation, groups), rtol=1e-12, atol=1e-12)
        g = RNG.normal(size=y.shape)
        flat_g = g.reshape(n, groups, o // groups, -1) if groups > 1 else g.reshape(n, o, -1)
        dx = interpret(grouped_graph("grad_input", geometry)[0], {"x0": a, "x1": flat_g}, dtype=np.float64)
        assert np.vdot(y, g) == pytest.approx(np.vdot(x, dx.outputs["out"]), rel=1e-10)
        dw = interpret(grouped_graph("grad_weight", geometry)[0], {"x0": flat_g, "x1": x}, dtype=np.float64)
        assert np.vdot(y, g) == pytest.approx(np.vdot(a, dw.outputs["out"]), rel=1e-10)


@pytest.mark.parametrize("geometry", [GROUPED_GEOMETRIES[i] for i in (0, 1, 2, 5)], ids=geometry_id)
def test_grouped_kernels_split_their_reduction_and_take_epilogues(geometry):
    """chunks with groups: grad_weight's partials [S, G, O/G, C/G·kh·kw], a stride-1 forward's
    [S, N, O, Ho, Wo]; and an epilogue on the grouped forward."""
    graph, feeds = grouped_graph("grad_weight", geometry, chunks=3)
    whole, _ = grouped_graph("grad_weight", geometry)
    got = check(graph, feeds, rtol=1e-4, atol=1e-4).run(feeds, read=("out",))["out"]
    np.testing.assert_allclose(got.sum(axis=0), interpret(whole, feeds).outputs["out"], rtol=1e-4, atol=1e-4)
    if geometry[5] == (1, 1):
        check(*grouped_graph("forward", geometry, chunks=2), rtol=1e-4, atol=1e-4)
    check(*grouped_graph("forward", geometry, epilogue="relu(add($acc,$0))"), rtol=1e-4, atol=1e-4)


def test_depthwise_kernels_are_direct_convolutions_at_any_split():
    """One channel a group: a thread per output element (no GEMM tile of padding rows), the weight
    gradient in parts of N·L that do not fall on image boundaries, an input gradient with a mask
    epilogue; `direct_weight_splits` gives a GPU parts enough for its threads, a CPU none."""
    geometry = GROUPED_GEOMETRIES[2]  # 3 channels, 2 filters each, dilation 2, padding (1, 2)
    for parts in (1, 5):
        graph, feeds = grouped_graph("grad_weight", geometry, chunks=parts)
        spec = lower_node(graph, graph.outputs["out"])
        assert spec.entry_point == "elementwise"
        assert spec.label.startswith("conv_direct grad_weight 3x3/p1,2/d2 in 3 groups")
        check(graph, feeds, rtol=1e-4, atol=1e-4)
    graph, feeds = grouped_graph("grad_input", GROUPED_GEOMETRIES[1])
    node = graph[graph.outputs["out"]]
    mask = typed_leaf(graph, "input", "mask", node.shape)
    attrs = {**node.attr_dict, "epilogue": "mul($acc,$0)"}
    graph.outputs["out"] = emit(graph, "conv_gemm", [*node.inputs, mask], **attrs)
    feeds["mask"] = (RNG.random(node.shape) < 0.5).astype(np.float32)
    check(graph, feeds, rtol=1e-4, atol=1e-4)
    assert codegen_conv.direct_weight_splits(128 * 9, 64 * 28 * 28, H100) == 118
    assert codegen_conv.direct_weight_splits(128 * 9, 64 * 28 * 28, Target("lavapipe", 2, 32, cpu=True)) == 1


@pytest.mark.parametrize("tiling", [GemmTiling(32, 64, 16, 1, 1), GemmTiling(4, 64, 16, 1, 1)], ids=str)
def test_grouped_kernels_at_forced_tilings(monkeypatch, tiling):
    """Grouped GEMMs (of rows of 4: the gathers' units; and ragged) under a tile of many rows and one
    of 4 rows."""
    monkeypatch.setattr(codegen_conv, "gemm_tiling", lambda *_, **__: tiling)
    for geometry in (GROUPED_GEOMETRIES[0], GROUPED_GEOMETRIES[5]):
        for mode in ("forward", "grad_input", "grad_weight"):
            graph, feeds = grouped_graph(mode, geometry)
            assert lower_node(graph, graph.outputs["out"]).workgroup_size == (tiling.threads_x, tiling.threads_y, 1)
            check(graph, feeds, rtol=1e-4, atol=1e-4)


# (x shape, kernel, stride, padding, dilation)
DILATED_WINDOWS = [((2, 3, 9, 8), (3, 2), (1, 2), (2, 1), (2, 3)), ((1, 2, 8, 8), (2, 2), (3, 1), (0, 1), (3, 2))]


@pytest.mark.parametrize("x_shape, kernel, stride, padding, dilation", DILATED_WINDOWS)
def test_dilated_unfold_and_fold_kernels(x_shape, kernel, stride, padding, dilation):
    window = {"kernel": kernel, "stride": stride, "padding": padding, "dilation": dilation}
    check(one_op("unfold", [x_shape], **window), {"x0": RNG.normal(size=x_shape).astype(np.float32)})
    cols = evaluate_unfold(np.zeros(x_shape), kernel, stride, padding, dilation).shape
    graph = one_op("fold", [cols], output_size=x_shape[2:], **window)
    check(graph, {"x0": RNG.normal(size=cols).astype(np.float32)})


# -- the conv rules ---------------------------------------------------------------------------


class GroupedNet(nn.Module):
    """conv (groups, dilation) → relu → depthwise conv → relu → transposed conv (groups) → mean."""

    def __init__(self, channels=4, groups=2, dilation=(1, 1), transposed_stride=2):
        super().__init__()
        rng = np.random.default_rng(0)

        def weight(*shape):
            return nn.Parameter((rng.normal(size=shape) * 0.3).astype(np.float32))

        self.groups, self.dilation, self.stride = groups, dilation, transposed_stride
        self.conv = weight(channels, 2 // min(groups, 2), 3, 3)
        self.depthwise = weight(channels, 1, 3, 3)
        self.transposed = weight(channels, 2, 3, 3)
        self.bias = weight(2 * 2)

    def forward(self, x):
        x = F.relu(F.conv2d(x, self.conv, padding=self.dilation, dilation=self.dilation, groups=min(self.groups, 2)))
        x = F.relu(F.conv2d(x, self.depthwise, stride=2, padding=1, groups=x.shape[1]))
        x = F.conv_transpose2d(x, self.transposed, self.bias, self.stride, 1, self.stride - 1, groups=2)
        return x.mean(dim=(2, 3))


def grouped_step(model, image=(2, 2, 9, 8)):
    spec = {"x": mn.f32[image], "y": mn.i32[image[0]]}
    traced = trace_step(model, lambda m, x, y: F.cross_entropy(m(x), y), spec, optim.SGD(lr=0.1, momentum=0.9))
    rng = np.random.default_rng(1)
    inputs = {"x": rng.normal(size=image).astype(np.float32), "y": rng.integers(0, 4, image[0])}
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    return traced.graph, inputs, params, traced.initial_states


@PROPERTY
@given(
    dilation=st.sampled_from([(1, 1), (2, 1), (2, 2)]),
    stride=st.sampled_from([1, 2]),
    height=st.integers(7, 9),
    width=st.integers(7, 9),
    seed=seeds,
)
def test_grouped_dilated_and_transposed_convolutions_become_implicit_gemm_kernels(
    dilation, stride, height, width, seed
):
    """Every convolution of the step (a grouped and dilated one, a depthwise one, a grouped
    transposed one) and every gradient of theirs is a conv_gemm kernel in groups; no unfold or
    fold is left; the step computes what it computed."""
    graph, inputs, params, states = grouped_step(
        GroupedNet(dilation=dilation, transposed_stride=stride), (2, 2, height, width)
    )
    fused, report = optimize(graph)
    assert_same_results(graph, fused, inputs, params, states, tol=1e-4)
    kernels = live_nodes(fused, "conv_gemm")
    by_mode = {
        mode: sorted(n.attr("groups") for n in kernels if n.attr("mode") == mode)
        for mode in ("forward", "grad_input", "grad_weight")
    }
    # forward: conv (2 groups), depthwise (4), the transposed conv's input gradient (2);
    # grad_input: the transposed conv's forward (2) and the depthwise conv's (4) — conv's input is the data;
    # grad_weight: one per convolution.
    assert by_mode == {"forward": [2, 2, 4], "grad_input": [2, 4], "grad_weight": [2, 2, 4]}, by_mode
    assert not live_nodes(fused, "unfold") and not live_nodes(fused, "fold")
    for rule in ("conv_forward", "conv_grad_input", "conv_grad_weight"):
        assert report.rule(rule).uses >= 2, rule


class ConvTransposeModel(nn.Module):
    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(2)
        self.weight = nn.Parameter((rng.normal(size=(8, 6, 3, 3)) * 0.1).astype(np.float32))
        self.bias = nn.Parameter(np.zeros(6, np.float32))

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, stride=2, padding=1, output_padding=1)


def test_a_conv_transpose2d_models_report_shows_the_conv_rules():
    """The transposed convolution's forward is conv_grad_input's kernel, its weight gradient
    conv_grad_weight's; no scatter, no fold."""
    with explain_only():
        program = mn.compile(
            ConvTransposeModel(),
            loss=lambda m, x: F.sum(F.tanh(m(x))),
            inputs={"x": mn.f32[4, 8, 12, 12]},
            optimizer=optim.SGD(lr=0.1),
        )
    report = program.report()
    text = str(report)
    assert report.rewrite.rule("conv_grad_input").uses >= 1 and report.rewrite.rule("conv_grad_weight").uses >= 1, text
    assert "grad_input 3x3/s2,2/p1,1, epilogue tanh" in text  # the forward, its bias and tanh fused
    modes = {n.attr("mode") for n in live_nodes(program.fused_graph, "conv_gemm")}
    assert modes == {"grad_input", "grad_weight"}
    assert not live_nodes(program.fused_graph, "fold") and not live_nodes(program.fused_graph, "unfold")


class Depthwise(nn.Module):
    """A MobileNet block: conv 3×3 → relu → depthwise 3×3 → relu → pointwise 1×1."""

    def __init__(self, channels):
        super().__init__()
        rng = np.random.default_rng(3)
        self.stem = nn.Parameter((rng.normal(size=(channels, 3, 3, 3)) * 0.1).astype(np.float32))
        self.depthwise = nn.Parameter((rng.normal(size=(channels, 1, 3, 3)) * 0.1).astype(np.float32))
        self.pointwise = nn.Parameter((rng.normal(size=(channels, channels, 1, 1)) * 0.1).astype(np.float32))

    def forward(self, x):
        h = F.relu(F.conv2d(x, self.stem, padding=1))
        h = F.relu(F.conv2d(h, self.depthwise, padding=1, groups=h.shape[1]))
        return F.conv2d(h, self.pointwise)


def test_a_depthwise_convolution_on_an_h100_is_three_direct_kernels_its_weight_gradient_split():
    """At MobileNet's 28×28 stage (batch 64, 128 channels) on the H100: the depthwise forward,
    input gradient and weight gradient are one conv_gemm each (the relus fused in), run as direct
    convolutions; the weight gradient, 128·9 sums over N·L = 50176, is split along that reduction
    into parts for enough threads (its partials summed after), not 1152 threads walking 50176
    positions each."""
    spec = {"x": mn.f32[64, 3, 28, 28]}
    traced = trace_step(Depthwise(128), lambda m, x: F.mean(m(x) ** 2), spec, optim.SGD(lr=0.1))
    fused, _ = optimize(traced.graph, target=H100)
    depthwise = [n for n in live_nodes(fused, "conv_gemm") if n.attr("groups") == 128]
    assert sorted(n.attr("mode") for n in depthwise) == ["forward", "grad_input", "grad_weight"]
    (weight_gradient,) = [n for n in depthwise if n.attr("mode") == "grad_weight"]
    assert weight_gradient.attr("chunks") > 1 and weight_gradient.shape[1:] == (128, 1, 9)
    step = compile_step(fused, H100)
    labels = [spec.label for spec in step.kernels if "in 128 groups" in spec.label]
    assert len(labels) == 3 and all(label.startswith("conv_direct") for label in labels), labels


def test_a_grouped_net_trains_on_the_gpu_like_the_interpreter():
    mn.manual_seed(0)
    program = mn.compile(
        GroupedNet(),
        loss=lambda m, x, y: F.cross_entropy(m(x), y),
        inputs={"x": mn.f32[2, 2, 9, 8], "y": mn.i32[2]},
        optimizer=optim.Adam(lr=1e-2),
    )
    assert {n.attr("groups") for n in live_nodes(program.fused_graph, "conv_gemm")} == {2, 4}
    rng = np.random.default_rng(8)
    feed = {"x": rng.normal(size=(2, 2, 9, 8)).astype(np.float32), "y": np.array([1, 3], np.int32)}
    losses = assert_steps_follow_interpreter(program, [feed] * 4)
    assert losses[-1] < losses[0]


class BiasBeforeMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(np.array([0.5, -0.25, 1.0], np.float32))

    def forward(self, x):
        return (x + self.bias.reshape(3, 1, 1)).mean(dim=(2, 3))


def test_a_bias_gradient_through_a_mean_sums_the_broadcast_gradient():
    """The bias's gradient is Σ over (n, y, x) of the mean's gradient broadcast over the image: the
    plan's reduction reads the [N, C, 1, 1] gradient broadcast to [N, C, H, W] (rewrite/kernels.py
    `decode_reduce_kernel` once summed the unbroadcast load, H·W times too small)."""
    program = mn.compile(
        BiasBeforeMean(),
        loss=lambda m, x, y: F.cross_entropy(m(x), y),
        inputs={"x": mn.f32[2, 3, 4, 5], "y": mn.i32[2]},
        optimizer=optim.SGD(lr=0.5),
    )
    feed = {"x": np.random.default_rng(9).normal(size=(2, 3, 4, 5)).astype(np.float32), "y": np.array([0, 2], np.int32)}
    assert_steps_follow_interpreter(program, [feed] * 2)
