"""The composites PyTorch keeps on torch and Tensor (split, chunk, stack, repeat, var, norm,
logsumexp, amin, broadcasting matmul, einsum… in meganeura/tensor.py) and the functional ones
(normalize, cosine_similarity, pad, interpolate… in meganeura/functional.py): PyTorch's values and
gradients (tests/reference/ops/composites.npz), gradients by finite differences mid-chain, every case
compiled and run on the device against the interpreter, and the errors for what is not supported."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import torch_script, trace_leaf
from reference_cases import (
    check_against_torch,
    check_gradients_by_differences,
    check_on_device,
    differentiable_cases,
    groups_by_prefix,
    load,
)

import meganeura as mn
import meganeura.functional as F
from meganeura import nn
from meganeura.ir.graph import TensorType
from meganeura.ir.op import ShapeError
from meganeura.ir.trace import Tracer, tracing

FILE = "composites"
CASES, _ = load(FILE)
# Not smooth where a case's inputs sit: ties of the minimum (integers), a zero row under normalize's clamp.
NOT_SMOOTH = {"amin", "amin_keepdim", "normalize_zero_row"}
DIFFERENTIABLE = differentiable_cases(FILE, NOT_SMOOTH)


@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_follow_pytorch(name):
    check_against_torch(FILE, name)


@pytest.mark.parametrize("name", DIFFERENTIABLE)
def test_gradients_by_finite_differences(name):
    assert check_gradients_by_differences(FILE, name) < 1e-6


GROUPS = groups_by_prefix(FILE)


@pytest.mark.parametrize("prefix", sorted(GROUPS))
def test_on_device_against_the_interpreter(prefix):
    check_on_device(FILE, GROUPS[prefix])


# -- what is refused, and where ---------------------------------------------------------------


def traced(**shapes):
    tracer = Tracer()
    with tracing(tracer):
        return tracer, {name: trace_leaf(tracer, "input", name, TensorType(shape)) for name, shape in shapes.items()}


def test_unsupported_arguments_raise_naming_the_users_line():
    tracer, t = traced(x=(2, 3, 4), v=(5,), m=(3, 3))
    x = t["x"]
    with tracing(tracer):
        cases = [
            (NotImplementedError, "repeat_interleave: only an int", lambda: x.repeat_interleave(x)),
            (NotImplementedError, "p='nuc' is not supported", lambda: mn.norm(x, p="nuc")),
            (NotImplementedError, "mode 'bicubic' is not supported", lambda: F.interpolate(x[None], 2, mode="bicubic")),
            (NotImplementedError, "antialias=True", lambda: F.interpolate(x, 5, mode="linear", antialias=True)),
            (NotImplementedError, "mode 'area' is supported where", lambda: F.interpolate(x, 3, mode="area")),
            (NotImplementedError, "needs a 2-D or 3-D input", lambda: F.pad(t["v"], (1, 1), mode="reflect")),
            (ValueError, "reflect padding \\(4, 0\\) must be less", lambda: F.pad(x, (4, 0), mode="reflect")),
            (ValueError, "only one of size or scale_factor", lambda: F.interpolate(x, 2, 2.0)),
            (ValueError, "do not add up to 3", lambda: mn.split(x, [1, 1], 1)),
            (ValueError, "subscripts must be letters", lambda: mn.einsum("i1,i->", t["v"], t["v"])),
            (ValueError, "'ij' does not fit an operand of 1 dims", lambda: mn.einsum("ij->", t["v"])),
            (ShapeError, "subscript 'i' has size 3 and 5", lambda: mn.einsum("i,i->", t["v"], t["m"][0])),
            (ShapeError, "do not broadcast", lambda: mn.matmul(x, mn.stack([t["m"]] * 3))),
            (ShapeError, "stack: expects each tensor to be equal size", lambda: mn.stack([x, t["m"]])),
            (TypeError, "pass either unbiased or correction", lambda: x.var(1, unbiased=True, correction=0)),
        ]
        for error, message, call in cases:
            with pytest.raises(error, match=f"test_composites\\.py:\\d+: .*{message}"):
                call()


def test_matmul_keeps_the_shared_operand_form_when_a_batch_is_all_ones():
    tracer, t = traced(a=(3, 4, 6), b=(1, 6, 5), c=(2, 1, 4, 6), d=(3, 6, 5))
    with tracing(tracer):
        shared = t["a"] @ t["b"]
        broadcast = t["c"] @ t["d"]
    products = [n for n in tracer.graph if n.op == "matmul"]
    assert shared.shape == (3, 4, 5) and broadcast.shape == (2, 3, 4, 5)
    assert tracer.graph[products[0].inputs[1]].shape == (6, 5)  # b is one matrix: no copy
    assert [tracer.graph[i].shape for i in products[1].inputs] == [(2, 3, 4, 6), (2, 3, 6, 5)]
    assert sum(n.op == "broadcast_to" for n in tracer.graph) == 2


def test_einsum_lowers_to_one_batched_product_with_transposes_folded():
    from meganeura.rewrite import optimize

    tracer, t = traced(q=(2, 3, 4, 5), k=(2, 3, 6, 5))
    with tracing(tracer):
        tracer.graph.outputs["s"] = mn.einsum("bhqd,bhkd->bhqk", t["q"], t["k"]).node
    fused, _ = optimize(tracer.graph)
    live = fused.live_ids()
    kernels = [n for n in fused if n.id in live and n.op not in ("input", "reshape")]
    assert [n.op for n in kernels] in (["matmul"], ["fused_matmul"]) and kernels[0].attr("transpose_b")


def test_split_chunk_and_unbind_follow_torchs_sizes():
    tracer, t = traced(x=(2, 7, 3))
    with tracing(tracer):
        assert [p.shape[1] for p in t["x"].split(3, 1)] == [3, 3, 1]
        assert [p.shape[1] for p in t["x"].chunk(4, 1)] == [2, 2, 2, 1]
        assert [p.shape[1] for p in mn.chunk(t["x"], 3, 1)] == [3, 3, 1]
        assert [p.shape for p in mn.unbind(t["x"], -1)] == [(2, 7)] * 3


def test_the_reference_files_are_what_the_script_writes():
    """Where torch is importable: scripts/make_composite_references.py writes both files again (the
    computed values to the last bits another torch build or CPU rounds differently)."""
    from pathlib import Path

    from test_torch_reference import assert_regenerated

    script = torch_script(Path(__file__).resolve().parent.parent / "scripts" / "make_composite_references.py")
    for file in script.FILES:
        assert_regenerated(script.generate(file), script.REFERENCE_DIR / f"{file}.npz")


def test_fused_expressions_read_signed_infinities():
    """clamp(x, max=t) is clamp(x, -inf, t): a fused kernel's expression text must read -inf back."""
    from meganeura.ir.expr import format_expr, parse

    trees = [("clamp", ("$", "1"), -math.inf, ("$", "2")), ("add", ("$", "0"), math.inf), ("mul", -2.5, ("$", "r"))]
    for tree in trees:
        assert parse(format_expr(tree)) == tree


class NanToNum(nn.Module):
    def forward(self, x):
        return mn.nan_to_num(x)


def test_nan_to_num_defaults_to_float32s_extremes():
    """torch.nan_to_num replaces ±inf by the dtype's largest finite values: float32's here."""
    value = np.array([np.nan, np.inf, -np.inf, 2.0], np.float32)
    program = mn.compile(NanToNum(), inputs={"x": mn.f32[4]})
    out = program(x=value)
    np.testing.assert_array_equal(out, [0.0, np.finfo(np.float32).max, np.finfo(np.float32).min, 2.0])


def test_instance_norm_modules_normalise_each_sample_and_channel():
    layer = nn.InstanceNorm2d(3, affine=True)
    assert repr(layer) == "InstanceNorm2d(3, eps=1e-05, momentum=0.1, affine=True, track_running_stats=False)"
    assert [name for name, _ in layer.named_parameters()] == ["weight", "bias"]
    layer.weight.copy_(np.array([1.0, 2.0, 0.5], np.float32))
    value = np.random.default_rng(1).normal(size=(3, 5, 4)).astype(np.float32)  # unbatched [C, H, W]
    out = mn.compile(layer, inputs={"input": mn.f32[3, 5, 4]})(input=value)
    mean, var = value.mean((1, 2), keepdims=True), value.var((1, 2), keepdims=True)
    np.testing.assert_allclose(out, (value - mean) / np.sqrt(var + 1e-5) * [[[1.0]], [[2.0]], [[0.5]]], atol=1e-5)
    with pytest.raises(NotImplementedError, match="track_running_stats"):
        nn.InstanceNorm1d(4, track_running_stats=True)


def test_bilinear_follows_its_formula_and_selu_celu_modules_their_functions():
    """nn.Bilinear's y_o = x1ᵀ·W_o·x2 + b_o (torch's layout and init bound), and SELU/CELU as modules."""
    mn.manual_seed(2)
    layer = nn.Bilinear(3, 4, 2)
    assert layer.weight.shape == (2, 3, 4) and np.abs(layer.weight.numpy()).max() <= 1 / np.sqrt(3)
    assert repr(layer) == "Bilinear(in1_features=3, in2_features=4, out_features=2, bias=True)"

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bilinear, self.selu, self.celu = layer, nn.SELU(), nn.CELU(0.5)

        def forward(self, a, b):
            return self.celu(self.selu(self.bilinear(a, b)))

    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)
    out = mn.compile(Pair(), inputs={"a": mn.f32[5, 3], "b": mn.f32[5, 4]})(a=a, b=b)
    w, bias = layer.weight.numpy().astype(np.float64), layer.bias.numpy()
    y = np.einsum("ni,oij,nj->no", a, w, b) + bias
    alpha, scale = 1.6732632423543772, 1.0507009873554805
    y = scale * np.where(y > 0, y, alpha * np.expm1(y))
    y = np.where(y > 0, y, 0.5 * np.expm1(y / 0.5))
    np.testing.assert_allclose(out, y, rtol=1e-5, atol=1e-6)
