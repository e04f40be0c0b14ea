"""The implicit-GEMM convolution op `conv_gemm`: its numpy semantics against direct loop references
(convolution, its input gradient, its weight gradient), its shape checks, its cost, and its WGSL
kernel against the interpreter on the default adapter (lavapipe in CI) for all three modes over
strides, paddings, kernel shapes, odd image sizes and sizes that do not divide the tiles, with
and without epilogues."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import emit, typed_leaf

from meganeura.codegen import conv as codegen_conv
from meganeura.codegen.gemm_table import GemmTiling
from meganeura.codegen.lower import lower_node
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError, infer_type, op_def
from meganeura.ir.ops.image import conv_output_size
from meganeura.ir.ops.matmul import part_length
from meganeura.passes import compile_step
from meganeura.rewrite.cost import node_cost
from meganeura.runtime import Executable, default_device
from meganeura.target import GENERIC, Target

CPU = Target("cpu", 2, 32, cpu=True)  # lavapipe's kind of target: its gathers staged by a loop

RNG = np.random.default_rng(7)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


# -- direct loop references (no unfold/fold) -------------------------------------------------------


def conv_reference(x, weight, stride, padding):
    """out[n, o, ho, wo] = Σ_{c,i,j} weight[o, c, i, j] · x[n, c, ho·sh − ph + i, wo·sw − pw + j]."""
    n, c, h, w = x.shape
    o, _, kh, kw = weight.shape
    ho, wo = conv_output_size((h, w), (kh, kw), stride, padding)
    out = np.zeros((n, o, ho, wo))
    for b in range(n):
        for f in range(o):
            for p in range(ho):
                for q in range(wo):
                    total = 0.0
                    for ch in range(c):
                        for i in range(kh):
                            for j in range(kw):
                                y, xx = p * stride[0] - padding[0] + i, q * stride[1] - padding[1] + j
                                if 0 <= y < h and 0 <= xx < w:
                                    total += weight[f, ch, i, j] * x[b, ch, y, xx]
                    out[b, f, p, q] = total
    return out


def grad_input_reference(g, weight, image, stride, padding):
    """dx[n, c, y, x] = Σ over the windows covering (y, x): weight[o, c, i, j] · g[n, o, ho, wo]."""
    n, o, ho, wo = g.shape
    _, c, kh, kw = weight.shape
    h, w = image
    dx = np.zeros((n, c, h, w))
    for b in range(n):
        for f in range(o):
            for p in range(ho):
                for q in range(wo):
                    for ch in range(c):
                        for i in range(kh):
                            for j in range(kw):
                                y, xx = p * stride[0] - padding[0] + i, q * stride[1] - padding[1] + j
                                if 0 <= y < h and 0 <= xx < w:
                                    dx[b, ch, y, xx] += weight[f, ch, i, j] * g[b, f, p, q]
    return dx


def grad_weight_reference(g, x, kernel, stride, padding):
    """dw[o, c, i, j] = Σ_{n,ho,wo} g[n, o, ho, wo] · x[n, c, ho·sh − ph + i, wo·sw − pw + j]."""
    n, c, h, w = x.shape
    _, o, ho, wo = g.shape
    kh, kw = kernel
    dw = np.zeros((o, c, kh, kw))
    for f in range(o):
        for ch in range(c):
            for i in range(kh):
                for j in range(kw):
                    total = 0.0
                    for b in range(n):
                        for p in range(ho):
                            for q in range(wo):
                                y, xx = p * stride[0] - padding[0] + i, q * stride[1] - padding[1] + j
                                if 0 <= y < h and 0 <= xx < w:
                                    total += g[b, f, p, q] * x[b, ch, y, xx]
                    dw[f, ch, i, j] = total
    return dw


# (N, C, O, image, kernel, stride, padding)
GEOMETRIES = [
    (2, 3, 4, (6, 6), (3, 3), (1, 1), (0, 0)),
    (3, 5, 6, (7, 5), (3, 3), (2, 2), (1, 1)),
    (1, 2, 3, (9, 9), (3, 2), (2, 1), (2, 1)),
    (2, 4, 2, (5, 7), (1, 3), (1, 2), (0, 1)),
    (1, 3, 2, (9, 9), (5, 5), (2, 2), (2, 2)),
    (2, 3, 5, (7, 5), (1, 1), (2, 2), (0, 0)),
]


def geometry_id(geometry) -> str:
    n, c, o, image, kernel, stride, padding = geometry
    return (
        f"n{n}c{c}o{o}-{image[0]}x{image[1]}-k{kernel[0]}x{kernel[1]}-s{stride[0]}{stride[1]}-p{padding[0]}{padding[1]}"
    )


def evaluate(mode, a, b, *extras, kernel, stride, padding, image, epilogue="$acc"):
    return op_def("conv_gemm").evaluate(
        a, b, *extras, mode=mode, kernel=kernel, stride=stride, padding=padding, image=image, epilogue=epilogue
    )


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=geometry_id)
def test_numpy_semantics_match_direct_loops(geometry):
    n, c, o, image, kernel, stride, padding = geometry
    ho, wo = conv_output_size(image, kernel, stride, padding)
    x = RNG.normal(size=(n, c, *image))
    weight = RNG.normal(size=(o, c, *kernel))
    g = RNG.normal(size=(n, o, ho, wo))
    attrs = {"kernel": kernel, "stride": stride, "padding": padding, "image": image}
    w2 = weight.reshape(o, -1)

    forward = evaluate("forward", w2, x, **attrs)
    np.testing.assert_allclose(forward, conv_reference(x, weight, stride, padding), rtol=1e-10, atol=1e-10)
    grad_input = evaluate("grad_input", w2, g.reshape(n, o, -1), **attrs)
    expected_dx = grad_input_reference(g, weight, image, stride, padding)
    np.testing.assert_allclose(grad_input, expected_dx, rtol=1e-10, atol=1e-10)
    grad_weight = evaluate("grad_weight", g.reshape(n, o, -1), x, **attrs)
    expected_dw = grad_weight_reference(g, x, kernel, stride, padding).reshape(o, -1)
    np.testing.assert_allclose(grad_weight, expected_dw, rtol=1e-10, atol=1e-10)

    # shape inference agrees with the evaluation
    types = {
        "forward": [t(*w2.shape), t(*x.shape)],
        "grad_input": [t(*w2.shape), t(n, o, ho * wo)],
        "grad_weight": [t(n, o, ho * wo), t(*x.shape)],
    }
    for mode, value in (("forward", forward), ("grad_input", grad_input), ("grad_weight", grad_weight)):
        assert infer_type("conv_gemm", types[mode], {"mode": mode, **attrs}).shape == value.shape


def test_numpy_epilogue_reads_broadcast_extras():
    x, weight, bias = normal(2, 3, 5, 5), normal(4, 3, 3, 3), normal(4, 1, 1)
    attrs = {"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1), "image": (5, 5)}
    out = evaluate("forward", weight.reshape(4, -1), x, bias, epilogue="relu(add($acc,$0))", **attrs)
    expected = np.maximum(conv_reference(x, weight, (1, 1), (1, 1)) + bias, 0)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert (out == 0).any() and (out > 0).any()


def t(*shape: int) -> TensorType:
    return TensorType(shape, "f32")


GEO = {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1), "image": (7, 5)}  # Ho, Wo = 4, 3


@pytest.mark.parametrize(
    ("mode", "types", "attrs", "message"),
    [
        ("sideways", [t(6, 45), t(3, 5, 7, 5)], {}, "mode must be one of"),
        ("forward", [t(6, 45)], {}, "at least 2 operands"),
        ("forward", [t(6, 44), t(3, 5, 7, 5)], {}, r"weight matrix \[O, C·9\]"),
        ("forward", [t(6, 45), t(3, 5, 35)], {}, r"image batch \[N, C, H, W\]"),
        ("forward", [t(6, 45), t(3, 4, 7, 5)], {}, "5 channels per filter"),
        ("forward", [t(6, 45), t(3, 5, 7, 6)], {}, "not of the image size"),
        ("forward", [t(6, 45), t(3, 5, 7, 5), t(5, 1, 1)], {}, r"\$0 .* does not broadcast"),
        ("forward", [t(6, 45), t(3, 5, 7, 5)], {"epilogue": "add($acc,$0)"}, r"reads \$0"),
        ("forward", [t(6, 45), t(3, 5, 7, 5)], {"kernel": (11, 3)}, "larger than the padded input"),
        ("forward", [t(6, 45), t(3, 5, 7, 5)], {"kernel": "3"}, "'kernel': expected a tuple of ints"),
        ("grad_input", [t(6, 45), t(3, 6, 4, 3)], {}, r"output gradient \[N, O, L\]"),
        ("grad_input", [t(6, 45), t(3, 7, 12)], {}, "6 filters"),
        ("grad_input", [t(6, 45), t(3, 6, 13)], {}, "should have 4·3 = 12 positions"),
        ("grad_weight", [t(3, 6, 4, 3), t(3, 5, 7, 5)], {}, r"output gradient \[N, O, L\]"),
        ("grad_weight", [t(3, 6, 12), t(5, 35)], {}, r"image batch \[N, C, H, W\]"),
        ("grad_weight", [t(2, 6, 12), t(3, 5, 7, 5)], {}, "batch sizes differ"),
        ("grad_weight", [t(3, 6, 12), t(3, 5, 5, 7)], {}, "not of the image size"),
        ("grad_weight", [t(3, 6, 11), t(3, 5, 7, 5)], {}, "should have 4·3 = 12 positions"),
    ],
)
def test_shape_errors(mode, types, attrs, message):
    with pytest.raises(ShapeError, match=message):
        infer_type("conv_gemm", types, {"mode": mode, **GEO, **attrs})


def test_shapes_and_flops():
    cases = {
        "forward": ([t(6, 45), t(3, 5, 7, 5)], (3, 6, 4, 3)),
        "grad_input": ([t(6, 45), t(3, 6, 12)], (3, 5, 7, 5)),
        "grad_weight": ([t(3, 6, 12), t(3, 5, 7, 5)], (6, 45)),
    }
    gemm_flops = 2 * 6 * 45 * 3 * 12  # 2·O·(C·kh·kw)·(N·L), the same product in every mode
    for mode, (types, shape) in cases.items():
        assert infer_type("conv_gemm", types, {"mode": mode, **GEO}).shape == shape
        graph = Graph()
        inputs = [typed_leaf(graph, "input", f"x{i}", tt.shape) for i, tt in enumerate(types)]
        node = emit(graph, "conv_gemm", inputs, mode=mode, **GEO)
        assert node_cost(graph, node).flops == (gemm_flops if mode != "grad_input" else 2 * 5 * 54 * 36)
    # grad_input runs one GEMM per stride phase (2·2): [C, O·ti·tj] · [O·ti·tj, N·HP·WP], the
    # phases sharing the 9 taps out (4 + 2 + 2 + 1) over ⌈7/2⌉·⌈5/2⌉ = 12 pixels per image (C 5,
    # O 6, N 3): 2·C·(O·9)·(N·12)


# -- the kernel against the interpreter --------------------------------------------------------------


def conv_graph(
    mode: str, geometry, epilogue: str | None = None, extra_shape=None, chunks: int = 1
) -> tuple[Graph, dict]:
    """A one-node conv_gemm graph of `mode` with random inputs (and an extra for the epilogue)."""
    n, c, o, image, kernel, stride, padding = geometry
    ho, wo = conv_output_size(image, kernel, stride, padding)
    taps = kernel[0] * kernel[1]
    shapes = {
        "forward": [(o, c * taps), (n, c, *image)],
        "grad_input": [(o, c * taps), (n, o, ho * wo)],
        "grad_weight": [(n, o, ho * wo), (n, c, *image)],
    }[mode]
    if extra_shape is not None:
        shapes.append(extra_shape)
    graph = Graph()
    inputs = [typed_leaf(graph, "input", f"x{i}", shape) for i, shape in enumerate(shapes)]
    attrs = {"mode": mode, "kernel": kernel, "stride": stride, "padding": padding, "image": image}
    if epilogue is not None:
        attrs["epilogue"] = epilogue
    if chunks > 1:
        attrs["chunks"] = chunks
    graph.outputs["out"] = emit(graph, "conv_gemm", inputs, **attrs)
    feeds = {f"x{i}": normal(*shape) for i, shape in enumerate(shapes)}
    return graph, feeds


def check_gpu(graph: Graph, feeds: dict, target: Target = GENERIC) -> np.ndarray:
    executable = Executable(compile_step(graph, target), default_device(), {}, {})
    got = executable.run(feeds, read=("out",))["out"]
    expected = interpret(graph, feeds, dtype=np.float64).outputs["out"]
    assert got.shape == expected.shape
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    return got


KERNEL_GEOMETRIES = [
    (3, 5, 6, (7, 5), (3, 3), (1, 1), (0, 0)),
    (3, 5, 6, (7, 5), (3, 3), (2, 2), (1, 1)),
    (2, 3, 6, (9, 9), (3, 2), (2, 2), (2, 1)),
    (3, 5, 6, (9, 9), (1, 3), (1, 1), (2, 1)),
    (2, 5, 6, (9, 9), (5, 5), (2, 2), (2, 2)),
    (3, 5, 6, (7, 5), (1, 1), (1, 1), (0, 0)),
    (2, 3, 6, (7, 5), (1, 1), (2, 2), (1, 1)),
    (3, 5, 6, (9, 9), (3, 3), (1, 2), (1, 0)),
    # larger: several tiles along every GEMM dimension (M, N, K), none of them a tile multiple
    (3, 37, 70, (9, 9), (3, 3), (1, 1), (1, 1)),
]


@pytest.mark.parametrize("mode", ["forward", "grad_input", "grad_weight"])
@pytest.mark.parametrize("geometry", KERNEL_GEOMETRIES, ids=geometry_id)
def test_kernel_matches_interpreter(mode, geometry):
    graph, feeds = conv_graph(mode, geometry)
    check_gpu(graph, feeds)


@pytest.mark.parametrize("chunks", [3, 6, 7, 11], ids=lambda c: f"{c}parts")
@pytest.mark.parametrize("geometry", KERNEL_GEOMETRIES[1:3] + KERNEL_GEOMETRIES[-1:], ids=geometry_id)
def test_grad_weight_split_along_its_reduction(geometry, chunks):
    """chunks = S (split-K): the reduction (n, ho, wo), N·L long, in S parts of ⌈N·L/S⌉, one
    partial weight gradient per part, [S, O, C·kh·kw], whose sum is the whole batch's gradient.
    3 and 6 parts are chunks of whole images (6 images); 7 and 11 cut images apart and leave a
    shorter last part (N·L is 72, 180 or 486 here)."""
    n, c, o, image, kernel, stride, padding = geometry
    geometry = (6, c, o, image, kernel, stride, padding)
    whole_graph, feeds = conv_graph("grad_weight", geometry)
    whole = interpret(whole_graph, feeds, dtype=np.float64).outputs["out"]
    graph, _ = conv_graph("grad_weight", geometry, chunks=chunks)
    got = check_gpu(graph, feeds)
    assert got.shape == (chunks, *whole.shape)
    np.testing.assert_allclose(got.sum(axis=0), whole, rtol=1e-4, atol=1e-4)
    # each partial is the GEMM over its own slice of (n, l): g [O, N·L] · columns [N·L, C·kh·kw]
    g, x = feeds["x0"].astype(np.float64), feeds["x1"].astype(np.float64)
    columns = op_def("unfold").evaluate(x, kernel=kernel, stride=stride, padding=padding)
    rows = g.transpose(1, 0, 2).reshape(o, -1)
    cols = columns.transpose(1, 0, 2).reshape(columns.shape[1], -1)
    part = -(-rows.shape[1] // chunks)
    last = rows[:, (chunks - 1) * part :] @ cols[:, (chunks - 1) * part :].T
    np.testing.assert_allclose(got[-1], last, rtol=1e-4, atol=1e-4)


def partial_conv(mode: str, geometry, feeds: dict, lo: int, hi: int) -> np.ndarray:
    """The GEMM of a stride-1 forward or input gradient over the reduction indices [lo, hi) alone,
    summed here tap by tap: forward's (c, i, j), c-major; grad_input's (o, i, j), o-major."""
    n, c, o, image, (kh, kw), stride, (ph, pw) = geometry
    assert stride == (1, 1)
    w = feeds["x0"].astype(np.float64).reshape(o, c, kh, kw)
    b = feeds["x1"].astype(np.float64)
    ho, wo = conv_output_size(image, (kh, kw), stride, (ph, pw))
    if mode == "forward":  # out[n, o, y, x] += w[o, c, i, j] · x[n, c, y - ph + i, x - pw + j]
        padded = np.pad(b, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        out = np.zeros((n, o, ho, wo))
        for r in range(lo, hi):
            ch, i, j = r // (kh * kw), r // kw % kh, r % kw
            out += w[None, :, ch, i, j, None, None] * padded[:, None, ch, i : i + ho, j : j + wo]
        return out
    g = np.pad(b.reshape(n, o, ho, wo), ((0, 0), (0, 0), (kh, kh), (kw, kw)))  # g[n, o, y + ph - i, x + pw - j]
    out = np.zeros((n, c, *image))
    for r in range(lo, hi):
        f, i, j = r // (kh * kw), r // kw % kh, r % kw
        top, left = kh + ph - i, kw + pw - j
        out += w[None, f, :, i, j, None, None] * g[:, None, f, top : top + image[0], left : left + image[1]]
    return out


SPLIT_GEOMETRIES = [
    KERNEL_GEOMETRIES[0],
    KERNEL_GEOMETRIES[3],
    (3, 13, 14, (7, 5), (1, 1), (1, 1), (0, 0)),
    KERNEL_GEOMETRIES[-1],
]


@pytest.mark.parametrize("chunks", [2, 3, 4], ids=lambda c: f"{c}parts")
@pytest.mark.parametrize("mode", ["forward", "grad_input"])
@pytest.mark.parametrize("geometry", SPLIT_GEOMETRIES, ids=geometry_id)
def test_forward_and_input_gradient_split_along_their_reduction(geometry, mode, chunks):
    """chunks = S (split-K) on a forward or stride-1 input gradient: the reduction, K = C·kh·kw or
    O·kh·kw long, in parts of `part_length(K, S)` (whole 16-element K tiles where that leaves no
    part empty), one partial per part, [S, N, C, H, W], each the GEMM over its own reduction
    indices (summed tap by tap here), their sum the whole convolution. K is 45 or 54, 15 or 18, 13
    or 14, and 333 or 630 here: parts of 16, 32 or 112 on tile boundaries, and of 12, 7 or 4 off them."""
    n, c, o, image, kernel, stride, padding = geometry
    whole_graph, feeds = conv_graph(mode, geometry)
    whole = interpret(whole_graph, feeds, dtype=np.float64).outputs["out"]
    graph, _ = conv_graph(mode, geometry, chunks=chunks)
    got = check_gpu(graph, feeds)
    assert got.shape == (chunks, *whole.shape)
    np.testing.assert_allclose(got.sum(axis=0), whole, rtol=1e-4, atol=1e-4)
    reduction = (c if mode == "forward" else o) * kernel[0] * kernel[1]
    length = part_length(reduction, chunks)
    for part in range(chunks):
        expected = partial_conv(mode, geometry, feeds, part * length, min(reduction, (part + 1) * length))
        np.testing.assert_allclose(got[part], expected, rtol=1e-4, atol=1e-4)


def test_split_reduction_refuses_strided_input_gradients_and_empty_parts():
    """A strided input gradient runs a GEMM per stride phase and does not split; K = 5 in 4 parts of
    2 would leave the fourth empty."""
    strided, _ = conv_graph("grad_input", KERNEL_GEOMETRIES[1])
    node = strided[strided.outputs["out"]]
    with pytest.raises(ShapeError, match="only a stride-1 input gradient splits"):
        infer_type("conv_gemm", [strided[i].type for i in node.inputs], {**node.attr_dict, "chunks": 2})
    narrow, _ = conv_graph("forward", KERNEL_GEOMETRIES[5])  # 1x1 over 5 channels: K = 5
    node = narrow[narrow.outputs["out"]]
    with pytest.raises(ShapeError, match="leave the last part empty"):
        infer_type("conv_gemm", [narrow[i].type for i in node.inputs], {**node.attr_dict, "chunks": 4})


def test_grad_weight_split_refuses_an_empty_part():
    """N·L = 72 in 10 parts of 8 would leave the tenth empty: a loud error, not a zero partial."""
    geometry = (6, 5, 6, (7, 5), (3, 3), (2, 2), (1, 1))  # L = 4·3 = 12
    graph, _ = conv_graph("grad_weight", geometry)
    types = [graph[i].type for i in graph[graph.outputs["out"]].inputs]
    with pytest.raises(ShapeError, match="leave the last part empty"):
        infer_type("conv_gemm", types, {**graph[graph.outputs["out"]].attr_dict, "chunks": 10})
    with pytest.raises(ShapeError, match="positive int"):
        infer_type("conv_gemm", types, {**graph[graph.outputs["out"]].attr_dict, "chunks": 0})


def test_forward_kernel_with_bias_relu_epilogue():
    geometry = (3, 5, 6, (7, 5), (3, 3), (2, 2), (1, 1))
    graph, feeds = conv_graph("forward", geometry, "relu(add($acc,$0))", (6, 1, 1))
    spec = lower_node(graph, graph.outputs["out"])
    assert spec.label == "conv_gemm forward 3x3/s2/p1 6x45,3x5x7x5 -> 3x6x4x3 (6x45x36) relu(add($acc,$0))"
    assert [b.name for b in spec.bindings] == ["a", "b", "x0", "out"]
    got = check_gpu(graph, feeds)
    assert (got == 0).any() and (got > 0).any()  # the relu did something


def test_grad_input_kernel_with_mask_epilogue():
    geometry = (3, 5, 6, (9, 9), (3, 2), (2, 1), (2, 1))
    n, c, *_ = geometry
    graph, feeds = conv_graph("grad_input", geometry, "mul($acc,$0)", (n, c, 9, 9))
    feeds["x2"] = (feeds["x2"] > 0).astype(np.float32)
    got = check_gpu(graph, feeds)
    assert (got[feeds["x2"] == 0] == 0).all()


def test_grad_weight_kernel_with_scale_and_extra():
    geometry = (3, 5, 6, (7, 5), (3, 3), (1, 1), (1, 1))
    graph, feeds = conv_graph("grad_weight", geometry, "add(mul($acc,0.5),$0)", (6, 45))
    check_gpu(graph, feeds)


def test_epilogue_constants_are_inlined():
    graph = Graph()
    w = typed_leaf(graph, "input", "w", (4, 3 * 9))
    x = typed_leaf(graph, "input", "x", (2, 3, 5, 5))
    half = graph.add("const", (), TensorType((), "f32"), {"value": 0.5})
    attrs = {"mode": "forward", "kernel": (3, 3), "stride": (1, 1), "padding": (1, 1), "image": (5, 5)}
    graph.outputs["out"] = emit(graph, "conv_gemm", [w, x, half], epilogue="mul($acc,$0)", **attrs)
    spec = lower_node(graph, graph.outputs["out"])
    assert [b.name for b in spec.bindings] == ["a", "b", "out"]
    check_gpu(graph, {"w": normal(4, 27), "x": normal(2, 3, 5, 5)})


def test_unknown_attributes_are_refused():
    graph, _ = conv_graph("forward", GEOMETRIES[0])
    node = graph[graph.outputs["out"]]
    bad = Graph()
    inputs = [typed_leaf(bad, "input", f"x{i}", graph[j].shape) for i, j in enumerate(node.inputs)]
    with pytest.raises(ShapeError, match=r"unknown attribute\(s\) \['rotation'\]"):
        emit(bad, "conv_gemm", inputs, **{**node.attr_dict, "rotation": (2, 2)})


def test_large_grids_fold_into_two_dimensions(monkeypatch):
    from meganeura.codegen import common

    monkeypatch.setattr(common, "MAX_WORKGROUPS_PER_DIM", 3)
    monkeypatch.setattr(codegen_conv, "gemm_tiling", lambda *_, **__: GemmTiling(64, 64, 16, 2, 2))
    graph, feeds = conv_graph("forward", KERNEL_GEOMETRIES[-1], "add($acc,$0)", (70, 1, 1))
    spec = lower_node(graph, graph.outputs["out"])
    assert spec.grid == (3, 3, 1)  # 2 row tiles × 4 column tiles of 64x64, 9 workgroups of which 1 idle
    check_gpu(graph, feeds)


def test_optimize_keeps_a_conv_gemm_as_a_generic_op():
    from meganeura.rewrite.pipeline import optimize

    graph, feeds = conv_graph("forward", GEOMETRIES[1], "add($acc,$0)", (6, 1, 1))
    out = graph.outputs["out"]
    graph.outputs["out"] = emit(graph, "relu", [out])
    optimized, _ = optimize(graph)
    assert "conv_gemm" in [node.op for node in optimized]
    expected = interpret(graph, feeds).outputs["out"]
    np.testing.assert_allclose(interpret(optimized, feeds).outputs["out"], expected, rtol=1e-5, atol=1e-5)


# -- the kernel at forced tilings ----------------------------------------------------------------------

# Geometries whose GEMMs no tile divides: every axis ragged with scalar loads and stores (K 45, HO·WO
# 63); multiples of 4 that take the vec4 paths (forward's weight rows K 36, output positions 64,
# grad_input's one phase of 64 pixels, grad_weight's rows of 36); stride 2 with padding (4 phases
# of unequal taps); a 1×1 kernel at stride 2 (phases without a tap) and at stride 1.
RAGGED_GEOMETRIES = [
    (3, 5, 37, (9, 7), (3, 3), (1, 1), (1, 1)),
    (2, 4, 36, (8, 8), (3, 3), (1, 1), (1, 1)),
    (3, 4, 20, (9, 9), (3, 3), (2, 2), (1, 1)),
    (2, 12, 20, (8, 6), (1, 1), (2, 2), (0, 0)),
    (2, 6, 10, (7, 7), (1, 1), (1, 1), (0, 0)),
]


# (tiling, the RAGGED_GEOMETRIES it runs): each geometry under several tilings, each tiling on a
# few geometries (a 16x16-per-thread kernel takes lavapipe seconds to compile).
FORCED_TILINGS = [
    (GemmTiling(64, 64, 16, 2, 2), (0, 2)),  # the CPU's conv rung (and the H200's): 8x8 per thread
    (GemmTiling(64, 128, 16, 2, 2, prefetch=True), (0, 1, 2, 3)),  # the H200's
    (GemmTiling(128, 128, 32, 2, 2), (1, 3)),
    (GemmTiling(32, 64, 16, 1, 1), (0, 1, 2, 3, 4)),
    (GemmTiling(64, 16, 16, 1, 1, prefetch=True), (2, 4)),
    (GemmTiling(64, 64, 16, 1, 1, prefetch=True), (1, 2, 3)),  # the H200's 4x4 stage
    (GemmTiling(4, 64, 16, 1, 1), (1, 3)),
]


@pytest.mark.parametrize(("tiling", "geometries"), FORCED_TILINGS, ids=[str(t) for t, _ in FORCED_TILINGS])
def test_kernel_tilings_on_ragged_shapes(monkeypatch, tiling, geometries):
    """Tile configurations the test sizes would not pick, in every mode, on ragged and vec4 shapes,
    strides 1 and 2, 1×1 and 3×3, with an epilogue on forward, grad_weight also in 3 parts of K,
    stride-1 forwards and input gradients also in 3 and 2."""
    monkeypatch.setattr(codegen_conv, "gemm_tiling", lambda *_, **__: tiling)
    for index in geometries:
        geometry = RAGGED_GEOMETRIES[index]
        graph, feeds = conv_graph("forward", geometry, "relu(add($acc,$0))", (geometry[2], 1, 1))
        assert lower_node(graph, graph.outputs["out"]).workgroup_size == (tiling.threads_x, tiling.threads_y, 1)
        check_gpu(graph, feeds)
        check_gpu(*conv_graph("grad_input", geometry))
        check_gpu(*conv_graph("grad_weight", geometry, chunks=3 if index % 2 == 0 else 1))
        if geometry[5] == (1, 1):  # split-K of forward and grad_input, with a short last part
            check_gpu(*conv_graph("forward", geometry, chunks=3))
            check_gpu(*conv_graph("grad_input", geometry, chunks=2))
        if not tiling.prefetch and index == geometries[0]:  # a CPU target's looped staging
            for mode in ("forward", "grad_input", "grad_weight"):
                check_gpu(*conv_graph(mode, geometry), target=CPU)


# Geometries whose gathers load a unit of 4 at once (codegen/conv.py `gathers_units`): output rows
# (WO: forward's, grad_weight's) and rows of a stride phase (WP, grad_input's) a multiple of 4, at stride 1
# and 2, with padding on every edge (a 3x5 kernel padded 1, 2: units half in the padding), a 1x1
# kernel at stride 2 (phases without a tap); the images' rows are not multiples of 4 where the
# stride is 2 and W is 7 or 9.
UNIT_GEOMETRIES = [
    (2, 5, 20, (8, 8), (3, 3), (2, 2), (1, 1)),  # HO = WO = 4, phases of 4x4 pixels
    (3, 3, 7, (6, 8), (3, 5), (1, 1), (1, 2)),  # WO = 8, W = 8
    (2, 6, 10, (7, 7), (1, 1), (2, 2), (0, 0)),  # WO = WP = 4 from a 7x7 image
    (1, 4, 9, (9, 16), (3, 3), (1, 2), (1, 1)),  # WO = 8 at stride (1, 2), WP = 8
]


@pytest.mark.parametrize("tiling", [GemmTiling(64, 64, 16, 2, 2), GemmTiling(32, 64, 16, 1, 1, prefetch=True)], ids=str)
@pytest.mark.parametrize("geometry", UNIT_GEOMETRIES, ids=geometry_id)
def test_gathers_load_a_unit_at_once_where_rows_hold_whole_units(monkeypatch, tiling, geometry):
    """Every mode's B units (and grad_weight's A = g by vec4) through load_b4 / load_a4 where their
    rows hold whole units, against the interpreter, forward also with an epilogue; grad_weight
    split into parts of a multiple of 4 keeps them and into other parts loads by element (a unit
    would straddle two parts)."""
    monkeypatch.setattr(codegen_conv, "gemm_tiling", lambda *_, **__: tiling)
    n, c, o, image, kernel, stride, padding = geometry
    reduction = n * math.prod(conv_output_size(image, kernel, stride, padding))
    cases = [("forward", 1), ("grad_input", 1), ("grad_weight", 1)]
    cases += [("grad_weight", parts) for parts in (2, 3) if reduction % parts == 0 or parts == 3]
    for mode, parts in cases:
        graph, feeds = conv_graph(mode, geometry, chunks=parts)
        wgsl = lower_node(graph, graph.outputs["out"]).wgsl
        whole_units = -(-reduction // parts) % 4 == 0
        assert ("load_b4(bat, uo, uk)" in wgsl) == whole_units, (mode, parts)
        assert ("load_a4(bat, uo, uk)" in wgsl) == (mode == "grad_weight" and whole_units), (mode, parts)
        check_gpu(graph, feeds)
        if parts == 1:
            check_gpu(graph, feeds, target=CPU)
    graph, feeds = conv_graph("forward", geometry, "relu(add($acc,$0))", (o, 1, 1))
    assert "load_b4(bat" in lower_node(graph, graph.outputs["out"]).wgsl
    check_gpu(graph, feeds)


def test_gathers_load_by_element_where_rows_do_not_hold_whole_units():
    """WO = 5, or a phase's rows of 5 pixels: every unit's 4 elements decoded one by one."""
    for mode in ("forward", "grad_input", "grad_weight"):
        graph, _ = conv_graph(mode, (3, 4, 20, (9, 9), (3, 3), (2, 2), (1, 1)))
        wgsl = lower_node(graph, graph.outputs["out"]).wgsl
        assert "load_b4(bat" not in wgsl and "load_a4(bat" not in wgsl
        assert "load_b(bat, uo" in wgsl


def test_on_a_cpu_conv_kernels_take_the_cpu_table_and_dispatch_what_the_cost_model_counts():
    """The lowering is per target: on a CPU (lavapipe) the CPU family's ladder, and the workgroups the
    cost model counts are the ones dispatched."""
    import math

    from meganeura.codegen.registry import node_workgroups

    cpu = CPU
    graph, _ = conv_graph("forward", (4, 16, 128, (16, 16), (3, 3), (1, 1), (1, 1)))
    sizes = {}
    for target in (cpu, GENERIC):
        step = compile_step(graph, target)
        (spec,) = [s for s in step.kernels if s.entry_point == "conv_gemm"]
        assert math.prod(spec.grid) == node_workgroups(step.graph, step.graph[spec.node], target)
        sizes[target.name] = spec.workgroup_size
        assert ("for (var j = 0u;" in spec.wgsl) == target.cpu  # the gathers' staging loop
    assert sizes["cpu"] == (8, 8, 1)  # 128x128, 16x16 per thread
    assert sizes["cpu"] != sizes[GENERIC.name]


def test_on_an_h200_convolutions_take_their_own_ladder_and_keep_the_matmuls_split_rung():
    """The H200's conv ladder (gemm_table.HOPPER_CONV_TABLE, measured in the ResNet-18 step):
    its forward and input-gradient GEMMs take 8x8 per thread where the matmul ladder's `fill`
    gave them 32x128 tiles of 4x8; a weight gradient's largest rung, which its split count is
    measured in, is the matmul's size."""
    from meganeura.codegen.gemm_table import table_for

    h200 = Target("NVIDIA H200", 132, 1_000_000, tuning="hopper", workgroup_memory=49152)
    forward = {"mode": "forward", "kernel": (3, 3), "stride": (1, 1), "padding": (1, 1), "image": (8, 8)}
    # the 8x8 stage's 3x3 forward: [256, 2304] · [2304, 128·8·8]
    tiling = codegen_conv.conv_tiling(forward, (256, 2304), (128, 256, 8, 8), (128, 256, 8, 8), h200)
    matmul_tiling = table_for(h200).pick(256, 8192, 1, h200, False)
    assert (tiling.bm, tiling.bn, tiling.rm, tiling.rn) == (64, 64, 2, 2)
    # the 4x4 stage's: 256 tiles of 64x64, under fill, take 256 threads of 4x4 each
    forward["image"] = (4, 4)
    late = codegen_conv.conv_tiling(forward, (512, 4608), (128, 512, 4, 4), (128, 512, 4, 4), h200)
    assert late == GemmTiling(64, 64, 16, 1, 1, prefetch=True) and late.threads == 256
    assert (matmul_tiling.bm, matmul_tiling.bn, matmul_tiling.rm, matmul_tiling.rn) == (32, 128, 1, 2)
    conv_rung, matmul_rung = table_for(h200, "conv").largest(True, h200), table_for(h200).largest(True, h200)
    assert (conv_rung.bm, conv_rung.bn) == (matmul_rung.bm, matmul_rung.bn)
    assert table_for(CPU, "conv") is not table_for(h200, "conv")


def test_on_an_h200_strided_input_gradients_take_the_strided_ladder():
    """A stride-2 input gradient is one GEMM per stride phase, the phases uneven (1, 2, 2, 4 taps of
    a 3x3 kernel): on the H200 its own ladder (gemm_table.HOPPER_STRIDED_TABLE) gives the late
    stages 32x64 tiles where the conv ladder gave 64x64, and keeps 64x128 for the early stage's
    larger phases; a stride-1 input gradient stays on the conv ladder; a CPU has one conv ladder."""
    h200 = Target("NVIDIA H200", 132, 1_000_000, tuning="hopper", workgroup_memory=49152)

    def tiling(channels, filters, image, stride):
        h, w = image
        attrs = {"mode": "grad_input", "kernel": (3, 3), "stride": (stride, stride), "padding": (1, 1), "image": image}
        g = (128, filters, (h // stride) * (w // stride))
        t = codegen_conv.conv_tiling(attrs, (filters, channels * 9), g, (128, channels, h, w), h200)
        return t.bm, t.bn

    assert tiling(256, 512, (8, 8), 2) == (32, 64)  # the 8x8 → 4x4 stage: 4 phases of 256x2048
    assert tiling(128, 256, (16, 16), 2) == (32, 64)
    assert tiling(64, 128, (32, 32), 2) == (64, 128)  # 32768 pixels a phase: tiles enough
    assert tiling(256, 256, (8, 8), 1) == (64, 64)  # stride 1: the conv ladder's
    from meganeura.codegen.gemm_table import table_for

    assert table_for(CPU, "strided") is table_for(CPU, "conv")
    assert table_for(GENERIC, "strided") is table_for(GENERIC, "conv")  # no measured ladder: the conv one


def test_conv_kernels_run_without_bounds_checks_when_the_user_opts_in(monkeypatch):
    """MEGANEURA_UNCHECKED_KERNELS=1: the conv_gemm kernels (trusted: the ragged shapes above) get
    modules without runtime bounds checks, also where the same kernel ran checked before in this
    process, and every mode computes what the interpreter does at ragged shapes."""
    tiling = GemmTiling(32, 64, 16, 1, 1)
    monkeypatch.setattr(codegen_conv, "gemm_tiling", lambda *_, **__: tiling)
    geometry = RAGGED_GEOMETRIES[2]  # stride 2 with padding: four phases of unequal taps
    graphs = [conv_graph("grad_input", geometry), conv_graph("grad_weight", geometry, chunks=3)]
    graphs.append(conv_graph("forward", geometry, "relu(add($acc,$0))", (geometry[2], 1, 1)))
    check_gpu(*graphs[0])  # checked first: its pipeline is cached
    monkeypatch.setenv("MEGANEURA_UNCHECKED_KERNELS", "1")
    modules = default_device()._modules
    for graph, feeds in graphs:
        (spec,) = compile_step(graph, GENERIC).kernels
        assert spec.trusted
        check_gpu(graph, feeds)
        assert (spec.wgsl, True) in modules
