"""The conv family: the im2col form that F.conv2d traces and autodiff differentiates becomes
implicit-GEMM kernels (forward, input gradient, weight gradient) with the bias and activation as
epilogue; 1×1 convolutions become plain matmuls; no buffer of im2col size is left in the plan.
Random geometries keep what the training step computes (interpreter before/after)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PROPERTY, assert_same_results, live_nodes, seeds
from hypothesis import given
from hypothesis import strategies as st

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen.buffers import plan_buffers
from meganeura.codegen.conv import weight_splits
from meganeura.codegen.lower import lower_graph
from meganeura.compiler import trace_step
from meganeura.rewrite import optimize
from meganeura.target import Target


class ConvNet(nn.Module):
    """conv → relu → conv → relu → global average → linear, the convolutions of geometry `first`/`second`."""

    def __init__(self, channels=(2, 3, 4), first=(3, 1, 1), second=(3, 2, 1), classes=3):
        super().__init__()
        (k1, s1, p1), (k2, s2, p2) = first, second
        self.conv1 = nn.Conv2d(channels[0], channels[1], k1, stride=s1, padding=p1)
        self.conv2 = nn.Conv2d(channels[1], channels[2], k2, stride=s2, padding=p2)
        self.fc = nn.Linear(channels[2], classes)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def ce_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def conv_step(model, image=(2, 2, 7, 5), classes=3, optimizer=None):
    """The traced training step of `model` on images of shape `image`, and values to run it with."""
    spec = {"x": mn.f32[image], "y": mn.i32[image[0]]}
    traced = trace_step(model, ce_loss, spec, optimizer or optim.SGD(lr=0.1, momentum=0.9))
    rng = np.random.default_rng(0)
    inputs = {"x": rng.normal(size=image).astype(np.float32), "y": rng.integers(0, classes, image[0])}
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    return traced.graph, inputs, params, traced.initial_states


kernels = st.tuples(st.integers(1, 3), st.integers(1, 3))
geometries = st.tuples(kernels, st.sampled_from([1, 2, (2, 1)]), st.sampled_from([0, 1, (1, 0)]))


@PROPERTY
@given(first=geometries, second=geometries, height=st.integers(7, 9), width=st.integers(7, 9), seed=seeds)
def test_convolutions_become_implicit_gemm_kernels_and_compute_the_same(first, second, height, width, seed):
    model = ConvNet(first=first, second=second)
    graph, inputs, params, states = conv_step(model, image=(2, 2, height, width))
    fused, report = optimize(graph)
    assert_same_results(graph, fused, inputs, params, states, tol=1e-4)
    spatial = [kernel != (1, 1) or stride != 1 or padding != 0 for kernel, stride, padding in (first, second)]
    modes = {n.attr("mode") for n in live_nodes(fused, "conv_gemm")}
    # Each spatial convolution has a forward and a weight gradient kernel; the input gradient is
    # the second's only (the first convolution's input is the data: no gradient). The plan may
    # also recompute a small forward in a backward kernel's epilogue, when the cost model says so.
    expected = {"forward", "grad_weight"} if any(spatial) else set()
    assert modes == expected | ({"grad_input"} if spatial[1] else set())
    for rule in ("conv_forward", "conv_grad_weight"):
        assert report.rule(rule).uses >= sum(spatial), rule
    assert not live_nodes(fused, "unfold") and not live_nodes(fused, "fold")
    assert report.cost_after.units < report.cost_before.units


def test_bias_and_relu_become_the_forward_epilogue_and_the_relu_mask_the_input_gradients():
    graph, inputs, params, states = conv_step(ConvNet())
    fused, report = optimize(graph)
    assert_same_results(graph, fused, inputs, params, states, tol=1e-4)
    forward = [n for n in live_nodes(fused, "conv_gemm") if n.attr("mode") == "forward"]
    assert [n.attr("epilogue") for n in forward] == ["relu(add($acc,$0))"] * 2
    assert [fused[n.inputs[2]].shape for n in forward] == [(3, 1, 1), (4, 1, 1)]  # the biases, per channel
    (grad_input,) = [n for n in live_nodes(fused, "conv_gemm") if n.attr("mode") == "grad_input"]
    assert grad_input.attr("epilogue") == "where(less_equal($0,0.0),0.0,$acc)"  # conv1's relu, differentiated
    assert report.rule("conv_epilogue").uses == 3
    text = str(report)
    for rule in ("conv_forward", "conv_grad_input", "conv_grad_weight", "conv_epilogue"):
        assert rule in text


def test_a_1x1_convolution_is_a_plain_matmul():
    model = ConvNet(first=(3, 1, 1), second=(1, 1, 0))
    graph, inputs, params, states = conv_step(model)
    fused, report = optimize(graph)
    assert_same_results(graph, fused, inputs, params, states, tol=1e-4)
    assert report.rule("pointwise_conv").uses >= 2  # its unfold and the fold of its input gradient
    assert [n.attr("mode") for n in live_nodes(fused, "conv_gemm")] == ["forward", "grad_weight"]  # conv1 only
    assert not live_nodes(fused, "unfold") and not live_nodes(fused, "fold")
    conv2_weight = next(n.id for n in fused if n.op == "param" and n.attr("name") == "conv2.weight")
    matmuls = [n for n in fused if n.op in ("matmul", "fused_matmul")]
    readers = [n for n in matmuls if fused[n.inputs[0]].inputs[:1] == (conv2_weight,)]
    assert readers, "the 1x1 convolution reads its weight through a matmul"


@pytest.mark.parametrize("rewrite", [True, False], ids=["fused", "unfused"])
def test_no_buffer_of_im2col_size_with_the_rewrite(rewrite):
    """3×3 windows over a 16×16 image: the columns are 9× the image, the largest tensor of the step.
    With the rewrite no value of that size is in the buffer plan; without it, the columns are there."""
    model = ConvNet(channels=(4, 8, 8), first=(3, 1, 1), second=(3, 1, 1))
    graph, *_ = conv_step(model, image=(2, 4, 16, 16))
    fused, _ = optimize(graph, enabled=rewrite)
    plan = plan_buffers(fused, lower_graph(fused))
    columns = 2 * (8 * 9) * (16 * 16) * 4  # conv2's columns [N, C·kh·kw, L] in bytes
    largest_other = max(
        fused[v].types[i].nbytes for v, i in plan.buffer_of if fused[v].op not in ("unfold", "matmul", "fold")
    )
    assert largest_other < columns
    if rewrite:
        assert max(slot.nbytes for slot in plan.buffers) < columns
        assert not [v for v, _ in plan.buffer_of if fused[v].op in ("unfold", "fold")]
    else:
        assert max(slot.nbytes for slot in plan.buffers) >= columns
        assert [v for v, _ in plan.buffer_of if fused[v].op == "unfold"]


@pytest.mark.parametrize("units", [64, 1], ids=["64 units", "1 unit"])
def test_the_weight_gradient_splits_its_reduction_where_the_adapter_has_units_to_fill(units):
    """32×32 images (L = 1024 positions per image) and a small weight: one GEMM over the whole batch
    is a few output tiles reducing over N·L, so few workgroups. Where the target has units to fill,
    the cost model prefers the GEMM split along its reduction (conv_gemm chunks = S, split-K: here
    64 parts of 256, more workgroups than one part per image, N = 16, gives) and the sum of the
    partials after it; on one unit, the whole-batch GEMM (no partial gradients to write and add)."""
    model = ConvNet(channels=(8, 8, 8), first=(3, 1, 1), second=(3, 1, 1))
    graph, inputs, params, states = conv_step(model, image=(16, 8, 32, 32))
    target = Target("test", units, 31)
    fused, report = optimize(graph, target=target)
    assert_same_results(graph, fused, inputs, params, states, tol=1e-4)
    weight_gradients = [n for n in live_nodes(fused, "conv_gemm") if n.attr("mode") == "grad_weight"]
    chunks = weight_splits(8, 8 * 9, 16 * 32 * 32, target)
    assert chunks == (64 if units == 64 else 1)
    assert [n.attr("chunks", 1) for n in weight_gradients] == [chunks, chunks]
    assert all(n.type.rank == (3 if chunks > 1 else 2) for n in weight_gradients)  # [S, O, C·kh·kw], summed after
    assert (report.rule("conv_split_k").uses > 0) == (units > 1)


def test_on_an_h200_a_small_weight_gradient_over_a_large_batch_is_split_along_its_reduction(monkeypatch):
    """ResNet-18's 8×8 stage at batch 128 on the H200: the whole-batch weight gradient [256, 2304]
    over 8192 positions has 36 tiles of the largest rung, so the ladder gives it 288 small ones,
    which looked busy to the cost model and ran at 9 TFLOP/s; counted in workgroups of the largest
    rung (codegen/conv.py `conv_workgroups`), the plan takes split-K instead (32 parts), and still
    computes what the step computes. (The H200 also offers Winograd, which takes these
    convolutions: switched off here, as for an adapter that offers the split only.)"""
    from meganeura.codegen import winograd
    from meganeura.codegen.conv import conv_workgroups
    from meganeura.ir.graph import TensorType

    monkeypatch.setattr(winograd, "WINOGRAD_TILES", {})

    h200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152)
    attrs = {"mode": "grad_weight", "kernel": (3, 3), "stride": (1, 1), "padding": (1, 1), "image": (8, 8)}
    g, x, out = TensorType((128, 256, 64)), TensorType((128, 256, 8, 8)), TensorType((256, 2304))
    assert conv_workgroups(attrs, [g, x], [out], h200) == 288 * 32 * 64 // (128 * 128 * 2)  # 18, of 132 units
    assert conv_workgroups(attrs, [g, x], [out], Target("lavapipe", 2, 32, cpu=True)) > 18  # a CPU counts each
    assert weight_splits(256, 2304, 128 * 64, h200) == 32

    model = ConvNet(channels=(16, 256, 256), first=(3, 1, 1), second=(3, 1, 1), classes=10)
    graph, inputs, params, states = conv_step(model, image=(128, 16, 8, 8), classes=10)
    fused, report = optimize(graph, target=h200)
    weight_gradients = [n for n in live_nodes(fused, "conv_gemm") if n.attr("mode") == "grad_weight"]
    second = [n for n in weight_gradients if n.shape[-1] == 256 * 9]
    assert [n.attr("chunks", 1) for n in second] == [32]
    assert report.rule("conv_split_k").uses > 0
    assert_same_results(graph, fused, inputs, params, states, tol=1e-3)


def test_on_an_h200_an_input_gradient_with_few_output_tiles_is_split_along_its_reduction(monkeypatch):
    """ResNet-18's 4×4 stage at batch 128 on the H200: the input gradient [128, 512, 4, 4] is a
    512 × 2048 GEMM (64 tiles of 128x128 for 132 SMs) over K = 512·9; the target offers 5 parts
    (codegen/conv.py `reduction_splits`), the plan takes them (partials [5, 128, 512, 4, 4],
    summed after), and still computes what the step computes. Neither a CPU nor an output with
    tiles enough for the GPU (the 32×32 stage's 64 × 131072) is offered a split, nor a forward.
    (The H200 also offers Winograd, which takes these convolutions: switched off here, as for an
    adapter that offers the split only.)"""
    from meganeura.codegen import winograd
    from meganeura.codegen.conv import reduction_splits

    monkeypatch.setattr(winograd, "WINOGRAD_TILES", {})

    h200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152)
    assert reduction_splits(512, 128 * 16, 512 * 9, h200) == 5
    assert reduction_splits(512, 128 * 16, 512 * 9, Target("lavapipe", 2, 32, cpu=True)) == 1
    assert reduction_splits(64, 128 * 1024, 64 * 9, h200) == 1

    model = ConvNet(channels=(16, 512, 512), first=(3, 1, 1), second=(3, 1, 1), classes=10)
    graph, inputs, params, states = conv_step(model, image=(128, 16, 4, 4), classes=10)
    fused, report = optimize(graph, target=h200)
    kernels = live_nodes(fused, "conv_gemm")
    assert [n.shape for n in kernels if n.attr("mode") == "grad_input"] == [(5, 128, 512, 4, 4)]
    assert {n.attr("chunks", 1) for n in kernels if n.attr("mode") == "forward"} == {1}
    assert report.rule("conv_split_reduction").uses > 0
    assert_same_results(graph, fused, inputs, params, states, tol=1e-3)


def test_the_example_resnet_plan_has_no_column_buffer():
    """examples/resnet_digits.py as it trains in CI (batch 32, width 16, lavapipe on two CPU
    threads): every spatial convolution, its input gradient (stride 2 included) and its weight
    gradient run as implicit GEMMs; no unfold of a window or fold is left, so no value of the buffer
    plan has a column layout [N, C·kh·kw, L]. (The 1×1 stride-2 projection may be a subsampling
    unfold, the size of its output, and a batched matmul: the cost model's call.)"""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import resnet_digits

    model = resnet_digits.ResNet(16)
    spec = {"x": mn.f32[32, 1, 8, 8], "y": mn.i32[32]}
    traced = trace_step(model, resnet_digits.loss_fn, spec, optim.SGD(lr=0.05, momentum=0.9, weight_decay=5e-4))
    fused, report = optimize(traced.graph, target=Target("lavapipe", 2, 32))
    windows = [n for n in live_nodes(fused, "unfold") if n.attr("kernel") != (1, 1)]
    assert not windows and not live_nodes(fused, "fold")
    plan = plan_buffers(fused, lower_graph(fused))
    columns = [n for n in traced.graph if n.op == "unfold"]
    assert len(columns) == 6  # 6 convolutions (stem, 2 blocks of 2, a projection), each through im2col
    assert all(fused[v].op != "fold" and fused[v] not in windows for v, _ in plan.buffer_of)
    largest_columns = max(n.type.nbytes for n in columns)  # a block's 3×3 columns [32, 144, 64]: 9 × its image
    assert max(slot.nbytes for slot in plan.buffers) < largest_columns
    assert {n.attr("mode") for n in live_nodes(fused, "conv_gemm")} == {"forward", "grad_input", "grad_weight"}
