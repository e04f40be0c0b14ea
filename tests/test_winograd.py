"""Winograd's F(m×m, 3×3) convolution and its weight gradient (ir/ops/winograd.py,
codegen/winograd.py, rules `conv_winograd` and `conv_winograd_weight`): their numpy semantics
against the direct convolution and its gradients over paddings, tiles and ragged image sizes,
their float32 error, their shape checks, their five kernels against the interpreter on the
default adapter (lavapipe in CI) at ragged sizes, the rules on the H200's target, where the
plan takes them for stride-1 3×3 convolutions and still computes the step, and a training step
through them on lavapipe against the interpreter."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import PROPERTY, assert_same_results, assert_steps_follow_interpreter, emit, live_nodes, seeds, typed_leaf
from hypothesis import given
from hypothesis import strategies as st
from test_conv_gemm import conv_reference
from test_rewrite_conv import ConvNet, ce_loss, conv_step

import meganeura as mn
from meganeura import optim
from meganeura.codegen.registry import node_workgroups
from meganeura.ir.graph import Graph
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError, infer_type
from meganeura.ir.ops.image import evaluate_conv_gemm
from meganeura.ir.ops.winograd import (
    evaluate_winograd_gradient,
    evaluate_winograd_input,
    evaluate_winograd_output,
    evaluate_winograd_weight,
    evaluate_winograd_weight_gradient,
)
from meganeura.passes import compile_step
from meganeura.rewrite import optimize
from meganeura.runtime import Executable, default_device
from meganeura.target import GENERIC, Target

H200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152)


def winograd_conv(x, weight, padding, tile):
    """The forward convolution through the three transforms and the (m + 2)² products."""
    n, c, h, w = x.shape
    size = (h + 2 * padding[0] - 2, w + 2 * padding[1] - 2)
    v = evaluate_winograd_input(x, padding, (h, w), tile)
    u = evaluate_winograd_weight(weight.reshape(weight.shape[0], -1), False, tile)
    return evaluate_winograd_output(u @ v, size, tile)


def winograd_input_gradient(g, weight, padding, image, tile):
    """The input gradient through the transforms: g correlated with the rotated filters, padding 2 − p."""
    n, o, ho, wo = g.shape
    v = evaluate_winograd_input(g.reshape(n, o, -1), (2 - padding[0], 2 - padding[1]), (ho, wo), tile)
    u = evaluate_winograd_weight(weight.reshape(o, -1), True, tile)
    return evaluate_winograd_output(u @ v, image, tile)


def winograd_weight_gradient(g, x, padding, tile):
    """The weight gradient through the transposed form: Gᵀ[(A·g·Aᵀ) ⊙ (Bᵀ·d·B)]G summed over tiles."""
    n, o, ho, wo = g.shape
    ug = evaluate_winograd_gradient(g.reshape(n, o, -1), (ho, wo), tile)
    v = evaluate_winograd_input(x, padding, x.shape[2:], tile)
    return evaluate_winograd_weight_gradient(ug @ np.transpose(v, (0, 2, 1)), tile)


@PROPERTY
@given(
    channels=st.integers(1, 3),
    filters=st.integers(1, 3),
    height=st.integers(1, 11),
    width=st.integers(1, 11),
    padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    tile=st.sampled_from([2, 4]),
    seed=seeds,
)
def test_the_transforms_compute_the_convolution_and_its_gradients(
    channels, filters, height, width, padding, tile, seed
):
    """Against a loop over every output and tap (the forward) and against conv_gemm's numpy
    semantics (both gradients), in float64: any image size (odd sizes leave a ragged last tile),
    paddings 0-2 (2 − p for the input gradient), error at float64 rounding."""
    if height + 2 * padding[0] < 3 or width + 2 * padding[1] < 3:
        return  # the window does not fit
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(2, channels, height, width))
    weight = rng.normal(size=(filters, channels, 3, 3))
    expected = conv_reference(x, weight, (1, 1), padding)
    got = winograd_conv(x, weight, padding, tile)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-12)
    g = rng.normal(size=expected.shape)
    gradient = evaluate_conv_gemm(
        weight.reshape(filters, -1), g.reshape(2, filters, -1), mode="grad_input", kernel=(3, 3),
        stride=(1, 1), padding=padding, image=(height, width),
    )  # fmt: skip
    np.testing.assert_allclose(winograd_input_gradient(g, weight, padding, (height, width), tile), gradient, atol=1e-12)
    weight_gradient = evaluate_conv_gemm(
        g.reshape(2, filters, -1), x, mode="grad_weight", kernel=(3, 3), stride=(1, 1), padding=padding,
        image=(height, width),
    )  # fmt: skip
    np.testing.assert_allclose(winograd_weight_gradient(g, x, padding, tile), weight_gradient, atol=1e-11)


def relative_errors(graph: Graph, feeds: dict, exact: np.ndarray) -> tuple[float, float]:
    """Run `graph` in float32 on the default adapter: the largest error of its outputs "winograd"
    and "direct" against `exact`, relative to the largest |exact|."""
    got = Executable(compile_step(graph, GENERIC), default_device(), {}, {}).run(feeds, read=("winograd", "direct"))
    scale = np.abs(exact).max()
    return tuple(float(np.abs(got[name] - exact).max() / scale) for name in ("winograd", "direct"))


def float32_errors(channels: int, image: int, tile: int) -> tuple[float, float]:
    """(Winograd's, the direct GEMM's) largest error against the float64 convolution, relative to
    its largest |value|, both run in float32 on the default adapter: 8 filters over `channels`
    channels of N(0, 1) images, padding 1."""
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (2, channels, image, image))
    w = typed_leaf(graph, "input", "w", (8, channels * 9))
    v = emit(graph, "winograd_input", [x], padding=(1, 1), image=(image, image), tile=tile)
    u = emit(graph, "winograd_weight", [w], flip=False, tile=tile)
    product = emit(graph, "matmul", [u, v])
    graph.outputs["winograd"] = emit(graph, "winograd_output", [product], size=(image, image), tile=tile)
    graph.outputs["direct"] = emit(
        graph, "conv_gemm", [w, x], mode="forward", kernel=(3, 3), stride=(1, 1), padding=(1, 1), image=(image, image)
    )
    rng = np.random.default_rng(3)
    feeds = {"x": rng.normal(size=(2, channels, image, image)), "w": rng.normal(size=(8, channels * 9))}
    feeds = {name: value.astype(np.float32) for name, value in feeds.items()}
    exact = conv_reference(feeds["x"].astype(np.float64), feeds["w"].reshape(8, channels, 3, 3).astype(np.float64),
                           (1, 1), (1, 1))  # fmt: skip
    return relative_errors(graph, feeds, exact)


@pytest.mark.parametrize("tile, bound", [(2, 3), (4, 20)])
def test_float32_error_against_the_direct_gemms(tile, bound):
    """F(2×2, 3×3)'s matrices hold 0, ±½ and ±1, F(4×4, 3×3)'s reach 8 and 1/24: run in float32
    over 64 channels, F(2) stays within 3× the direct GEMM's error, F(4) within 20× (on lavapipe,
    2026-12-04: direct 1.0e-6 of the largest |value|, F(2) 2.8e-7, F(4) 5.4e-6)."""
    winograd, direct = float32_errors(64, 10, tile)
    assert direct > 0 and winograd < bound * direct, (winograd, direct)


def weight_gradient_errors(channels: int, image: int, tile: int) -> tuple[float, float]:
    """(Winograd's, the direct GEMM's) largest error in the weight gradient against float64,
    relative to its largest |value|, both run in float32 on the default adapter: 8 filters over
    `channels` channels, a batch of 4 N(0, 1) images and output gradients, padding 1."""
    graph = Graph()
    g = typed_leaf(graph, "input", "g", (4, 8, image * image))
    x = typed_leaf(graph, "input", "x", (4, channels, image, image))
    ug = emit(graph, "winograd_gradient", [g], size=(image, image), tile=tile)
    v = emit(graph, "winograd_input", [x], padding=(1, 1), image=(image, image), tile=tile)
    product = emit(graph, "matmul", [ug, v], transpose_b=True)
    graph.outputs["winograd"] = emit(graph, "winograd_weight_gradient", [product], tile=tile)
    graph.outputs["direct"] = emit(
        graph, "conv_gemm", [g, x], mode="grad_weight", kernel=(3, 3), stride=(1, 1), padding=(1, 1),
        image=(image, image),
    )  # fmt: skip
    rng = np.random.default_rng(4)
    feeds = {"g": rng.normal(size=(4, 8, image * image)), "x": rng.normal(size=(4, channels, image, image))}
    feeds = {name: value.astype(np.float32) for name, value in feeds.items()}
    exact = interpret(graph, feeds, dtype=np.float64).outputs["direct"]
    return relative_errors(graph, feeds, exact)


@pytest.mark.parametrize("tile, bound", [(2, 3), (4, 20)])
def test_float32_error_of_the_weight_gradient_against_the_direct_gemms(tile, bound):
    """The weight gradient sums over every tile of the batch: run in float32 (16 channels, 12×12
    images, batch 4), F(3×3, 2×2) stays within 3× the direct GEMM's error, F(3×3, 4×4) within 20×
    (on lavapipe, 2026-12-04: direct 6.3e-7 of the largest |value|, m = 2 5.7e-7, m = 4 2.6e-6)."""
    winograd, direct = weight_gradient_errors(16, 12, tile)
    assert direct > 0 and winograd < bound * direct, (winograd, direct)


def test_shape_checks_say_what_they_expected():
    with pytest.raises(ShapeError, match="image batch"):
        infer_type("winograd_input", [_type(2, 3, 5, 5)], {"padding": (1, 1), "image": (5, 6), "tile": 2})
    with pytest.raises(ShapeError, match="padding"):
        infer_type("winograd_input", [_type(2, 3, 5, 5)], {"padding": (3, 1), "image": (5, 5), "tile": 2})
    with pytest.raises(ShapeError, match="does not fit"):
        infer_type("winograd_input", [_type(2, 3, 1, 5)], {"padding": (0, 1), "image": (1, 5), "tile": 2})
    with pytest.raises(ShapeError, match=r"\[O, C·9\]"):
        infer_type("winograd_weight", [_type(4, 10)], {"flip": False, "tile": 2})
    with pytest.raises(ShapeError, match="output"):
        infer_type("winograd_output", [_type(16, 4, 7)], {"size": (4, 4), "tile": 2})
    with pytest.raises(ShapeError, match="tile must be one of"):
        infer_type("winograd_weight", [_type(4, 27)], {"flip": False, "tile": 3})
    two, four = {"tile": 2}, {"tile": 4}
    assert infer_type("winograd_input", [_type(2, 3, 35)], {"padding": (1, 1), "image": (7, 5), **two}).shape == (
        16,
        3,
        24,
    )
    assert infer_type("winograd_input", [_type(2, 3, 35)], {"padding": (1, 1), "image": (7, 5), **four}).shape == (
        36,
        3,
        8,
    )
    assert infer_type("winograd_weight", [_type(4, 27)], {"flip": True, **two}).shape == (16, 3, 4)
    assert infer_type("winograd_weight", [_type(4, 27)], {"flip": False, **four}).shape == (36, 4, 3)
    assert infer_type("winograd_output", [_type(16, 4, 24)], {"size": (7, 5), **two}).shape == (2, 4, 7, 5)
    assert infer_type("winograd_output", [_type(36, 4, 8)], {"size": (7, 5), **four}).shape == (2, 4, 7, 5)
    assert infer_type("winograd_gradient", [_type(2, 4, 35)], {"size": (7, 5), **four}).shape == (36, 4, 8)
    assert infer_type("winograd_weight_gradient", [_type(16, 4, 3)], two).shape == (4, 27)
    with pytest.raises(ShapeError, match=r"expected \[N, O, 35\]"):
        infer_type("winograd_gradient", [_type(2, 4, 34)], {"size": (7, 5), **two})
    with pytest.raises(ShapeError, match=r"\[36, O, C\]"):
        infer_type("winograd_weight_gradient", [_type(16, 4, 3)], four)


def _type(*shape):
    from meganeura.ir.graph import TensorType

    return TensorType(shape, "f32")


KERNEL_CASES = [
    ("winograd_input", (2, 3, 7, 5), {"padding": (1, 1), "image": (7, 5), "tile": 2}),
    ("winograd_input", (3, 5, 4, 4), {"padding": (0, 2), "image": (4, 4), "tile": 2}),
    ("winograd_input", (2, 3, 35), {"padding": (2, 1), "image": (7, 5), "tile": 2}),  # an output gradient [N, O, L]
    ("winograd_input", (1, 300, 1, 1), {"padding": (1, 1), "image": (1, 1), "tile": 2}),  # units past a workgroup
    ("winograd_input", (2, 3, 9, 6), {"padding": (1, 1), "image": (9, 6), "tile": 4}),
    ("winograd_input", (2, 3, 45), {"padding": (2, 0), "image": (9, 5), "tile": 4}),
    ("winograd_weight", (5, 27), {"flip": False, "tile": 2}),
    ("winograd_weight", (5, 27), {"flip": True, "tile": 2}),
    ("winograd_weight", (70, 45), {"flip": True, "tile": 2}),
    ("winograd_weight", (70, 45), {"flip": False, "tile": 4}),
    ("winograd_weight", (5, 27), {"flip": True, "tile": 4}),
    ("winograd_output", (16, 3, 2 * 4 * 3), {"size": (7, 5), "tile": 2}),
    ("winograd_output", (16, 5, 3 * 2 * 2), {"size": (4, 4), "tile": 2}),
    ("winograd_output", (16, 2, 300), {"size": (1, 1), "tile": 2}),
    ("winograd_output", (36, 3, 2 * 3 * 2), {"size": (9, 6), "tile": 4}),
    ("winograd_output", (36, 3, 2 * 2 * 2), {"size": (7, 5), "tile": 4}),
    ("winograd_output", (36, 3, 2 * 1 * 1), {"size": (4, 4), "tile": 4}),
    ("winograd_gradient", (2, 3, 35), {"size": (7, 5), "tile": 2}),
    ("winograd_gradient", (2, 3, 7, 5), {"size": (7, 5), "tile": 4}),
    ("winograd_gradient", (2, 3, 8, 8), {"size": (8, 8), "tile": 4}),
    ("winograd_gradient", (1, 300, 1), {"size": (1, 1), "tile": 2}),
    ("winograd_weight_gradient", (16, 3, 5), {"tile": 2}),
    ("winograd_weight_gradient", (36, 70, 5), {"tile": 4}),
]


CASE_IDS = [f"{op}-{'x'.join(map(str, shape))}" for op, shape, _ in KERNEL_CASES]


@pytest.mark.parametrize("op, shape, attrs", KERNEL_CASES, ids=CASE_IDS)
def test_each_kernel_computes_what_the_interpreter_does(op, shape, attrs):
    """Ragged image sizes (a last tile half outside), every padding, the flipped filter, and more
    units than one workgroup runs: the WGSL kernel against the numpy semantics; it dispatches the
    workgroups the cost model counts."""
    graph = Graph()
    x = typed_leaf(graph, "input", "x0", shape)
    graph.outputs["out"] = emit(graph, op, [x], **attrs)
    feeds = {"x0": np.random.default_rng(5).normal(size=shape).astype(np.float32)}
    step = compile_step(graph, GENERIC)
    (spec,) = step.kernels
    assert math.prod(spec.grid) == node_workgroups(step.graph, step.graph[spec.node])  # what the cost model counts
    executable = Executable(step, default_device(), {}, {})
    got = executable.run(feeds, read=("out",))["out"]
    expected = interpret(graph, feeds, dtype=np.float64).outputs["out"]
    assert got.shape == expected.shape and np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tile", [2, 4])
def test_on_an_h200_stride_1_convolutions_run_as_winograd_and_compute_the_same(tile, monkeypatch):
    """Two stride-1 3×3 convolutions over 256 channels on 9×7 images (ragged tiles) at batch 2,
    planned for the H200 with F(m×m, 3×3) offered: both forwards and the second's input gradient
    run as Winograd transforms around batched matmuls [P, 256, 256]·[P, 256, 2·tiles], both
    weight gradients as F(3×3, m×m) around [P, O, 2·tiles]·[P, C, 2·tiles]ᵀ (the cost model's
    choice at these sizes), no direct convolution is left, and the plan computes what the step
    computes. A generic target is not offered the rules (not measured there)."""
    from meganeura.codegen import winograd

    monkeypatch.setitem(winograd.WINOGRAD_TILES, "hopper", tile)
    model = ConvNet(channels=(16, 256, 256), first=(3, 1, 1), second=(3, 1, 1), classes=10)
    graph, inputs, params, states = conv_step(model, image=(2, 16, 9, 7), classes=10)
    fused, report = optimize(graph, target=H200)
    assert report.rule("conv_winograd").uses > 0
    assert [n.shape for n in live_nodes(fused, "winograd_output")] == [(2, 256, 9, 7)] * 3
    assert {n.attr("tile") for n in live_nodes(fused, "winograd_output")} == {tile}
    assert sorted(n.attr("flip") for n in live_nodes(fused, "winograd_weight")) == [False, False, True]
    planes, tiles = (tile + 2) ** 2, 2 * -(-9 // tile) * -(-7 // tile)
    products = [n for n in fused.nodes if n.op in ("matmul", "fused_matmul") and n.shape == (planes, 256, tiles)]
    assert len(products) == 3
    assert report.rule("conv_winograd_weight").uses > 0
    assert sorted(n.shape for n in live_nodes(fused, "winograd_weight_gradient")) == [(256, 144), (256, 2304)]
    assert not live_nodes(fused, "conv_gemm")
    assert_same_results(graph, fused, inputs, params, states, tol=1e-4)

    generic, generic_report = optimize(graph, target=GENERIC)
    assert not live_nodes(generic, "winograd_output") and not live_nodes(generic, "winograd_weight_gradient")
    assert generic_report.rule("conv_winograd").matches == 0 == generic_report.rule("conv_winograd_weight").matches


def test_on_a_cpu_a_training_step_through_winograd_follows_the_interpreter():
    """On lavapipe (the CPU target offers F(4×4, 3×3): measured there, codegen/winograd.py), two
    stride-1 3×3 convolutions over 32 channels on 16×16 images at batch 4: the plan runs a forward
    and a weight gradient through the transforms, and three SGD-momentum steps on the device
    follow the interpreter's (losses and each parameter's update)."""
    if not default_device().target.cpu:
        pytest.skip("the default adapter is not a CPU: Winograd is offered there only where measured")
    model = ConvNet(channels=(8, 32, 32), first=(3, 1, 1), second=(3, 1, 1), classes=10)
    spec = {"x": mn.f32[4, 8, 16, 16], "y": mn.i32[4]}
    program = mn.compile(model, loss=ce_loss, inputs=spec, optimizer=optim.SGD(lr=0.05, momentum=0.9))
    ops = {program.compiled.graph[k.node].op for k in program.compiled.kernels}
    assert {"winograd_input", "winograd_output", "winograd_gradient", "winograd_weight_gradient"} <= ops, ops
    rng = np.random.default_rng(8)
    feeds = [
        {"x": rng.normal(size=(4, 8, 16, 16)).astype(np.float32), "y": rng.integers(0, 10, 4).astype(np.int32)}
        for _ in range(3)
    ]
    losses = assert_steps_follow_interpreter(program, feeds)
    assert all(np.isfinite(losses))
