"""Every kernel of a training step indexes inside its arrays: whole steps run once with every
kernel sanitized (tests/bounds_check.py: each index checked against its array's length, an
out-of-bounds one recorded and clamped), at the bench's small sizes and at ragged ones, for this
device's plan and the H200's (the plan that runs unchecked on Dawn under
MEGANEURA_UNCHECKED_KERNELS=1, runtime/device.py), plus the kernels that only a single-op graph
reaches (the tensor splits, the tiled transpose). A kernel whose results match numpy can still
read past an array's end and discard the value; with the shader compiler's checks off that is
undefined behaviour, and only a check of the indices themselves shows it.

Also: the sanitizer catches an injected out-of-bounds read and write (a hand-written kernel, and a
generated one with its indices shifted), refuses what it cannot check, leaves a step's results
unchanged, and the entry points of the code generator that ran sanitized are listed
(`test_the_entry_points_that_ran_sanitized`; `pytest -rP` prints which case ran each). The split
products' subgroup-matrix loads and stores are checked with their matrices' extent; their
kernels compile sanitized through Tint here and run sanitized only on a device with f16
subgroup matrices (the H200 through Dawn).

Time: about 18 s on lavapipe with Mesa's shader cache warm (~/.cache/mesa_shader_cache). The
first run on a machine compiles some 600 sanitized kernels: about two minutes, the bench's
resnet18 step 30 s of it (its unsanitized step's first run takes 28 s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from bounds_check import (
    SanitizedExecutable,
    SanitizerError,
    run_kernel,
    sanitize,
    sanitized_program,
    sanitizer_target,
)
from conftest import MLP, ce_loss, emit, one_op, typed_leaf
from test_conv_gemm import RAGGED_GEOMETRIES, conv_graph
from test_kernels import operand_shapes
from test_matmul_halves import multi_split_graph
from test_tensor_tiles import needs_tensor_cores

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.bench import workloads
from meganeura.bench.workloads import STEPS
from meganeura.codegen import conv as codegen_conv
from meganeura.codegen import matmul as codegen_matmul
from meganeura.codegen import shape as codegen_shape
from meganeura.codegen.gemm_table import GemmTiling
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.render import SHADER_DIRS
from meganeura.compiler import Program, compile_plan
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.trace import Tracer
from meganeura.passes import compile_step, operand_splits
from meganeura.runtime import default_device
from meganeura.target import GENERIC, Target

# The H200's target as the tests of its plans write it (tests/test_winograd.py), without tensor
# cores: their products need Dawn's subgroup matrices, which lavapipe lacks.
H200 = Target("NVIDIA H200", 132, 31, tuning="hopper", workgroup_memory=49152)
LAVAPIPE = Target("lavapipe", 2, 32, cpu=True)

# A kernel the sanitizer tests itself with: a vec4 storage array read past its end, a vec4's
# component past the fourth, a write at an index read from another array (nested, an i32: −1 and
# 9 of 8), an atomic past its array's end, an early return after a bad index; and in-bounds
# indices into a function-scope array, a private array, a workgroup array and an array member of
# a struct returned by a function.
INJECTED = """
struct Pair {
    weight: f32,
    taps: array<f32, 3>,
}

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> ids: array<i32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<storage, read_write> counts: array<atomic<u32>>;

var<workgroup> tile: array<f32, 8>;
var<private> history: array<u32, 4>;

fn pair_of(x: f32) -> Pair {
    return Pair(x, array<f32, 3>(x, 2.0 * x, 3.0 * x));
}

@compute @workgroup_size(8)
fn main(@builtin(local_invocation_index) lid: u32) {
    var local: array<f32, 4>;
    local[lid % 4u] = 1.0;
    history[lid / 2u] = lid;
    let v = src[lid];  // src holds 4 vec4s
    tile[lid] = v[lid % 5u] + local[lid % 4u];
    workgroupBarrier();
    if (lid == 6u) {
        return;
    }
    let p = pair_of(tile[lid]);
    dst[ids[lid]] = p.taps[lid % 3u] + f32(history[lid / 2u]);
    atomicAdd(&counts[lid + 1u], 1u);
}
"""


def test_the_sanitizer_catches_an_injected_out_of_bounds_read_and_write():
    """Each bad index is reported at its site, with the invocations for which it was the first:
    src[lid] for lids 4..7 (lid 6's too, which returns early), dst at −1 for lid 3 (v[4] of lid 4
    and counts[8] of lid 7 come after src's); every in-bounds site stays quiet, and the kernel
    runs on safely."""
    src = np.arange(16, dtype=np.float32)
    ids = np.array([0, 1, 2, -1, 4, 5, 9, 7], np.int32)
    arrays = [
        ("src", src, "read"),
        ("ids", ids, "read"),
        ("dst", np.zeros(8, np.float32), "read_write"),
        ("counts", np.zeros(8, np.uint32), "read_write"),
    ]
    written, found = run_kernel(INJECTED, "main", arrays, (1, 1, 1))
    by_array = {f.site.array: f for f in found}
    assert set(by_array) == {"src", "v", "dst", "counts"}, "\n".join(map(str, found))
    assert (by_array["src"].first_in, by_array["src"].index, by_array["src"].length) == (4, 7, 4)
    assert by_array["src"].site.index == "lid" and by_array["src"].site.length == "arrayLength(&src)"
    assert (by_array["dst"].first_in, by_array["dst"].index - 2**32) == (1, -1)  # −1 read as u32
    assert by_array["v"].first_in == 0 == by_array["counts"].first_in  # after src's, in lids 4 and 7
    assert "index up to -1 against length 8" in str(by_array["dst"])
    assert written["counts"].tolist() == [0, 1, 1, 1, 1, 1, 1, 1]  # lid 6 left; lid 7 clamped into counts[7]


def test_a_generated_kernel_with_its_indices_shifted_is_caught():
    """An elementwise kernel of a ragged broadcast add (13×7 + 7) with its output index shifted by
    one and its broadcast read by seven: the run names both arrays, with the indices reached."""
    graph = one_op("add", [(13, 7), (7,)])
    step = compile_step(graph, sanitizer_target(GENERIC))
    (spec,) = step.plan.schedule
    shifted = spec.wgsl.replace("    out[i] =", "    out[i + 1u] =").replace("x1[(i % 7u)]", "x1[(i % 7u) + 7u]")
    assert shifted.count("out[i + 1u] =") == 1 and shifted.count("+ 7u]") == 1
    step.plan.schedule[0] = dataclasses.replace(spec, wgsl=shifted)
    inputs = {"x0": np.ones((13, 7), np.float32), "x1": np.ones(7, np.float32)}
    executable = SanitizedExecutable(step, default_device(), {}, {})
    executable.run(inputs, read=("out",))
    found = {f.site.array: f for f in executable.out_of_bounds()}
    assert set(found) == {"x1", "out"}
    assert found["x1"].index == 13 and found["x1"].length == 7 and found["x1"].first_in == 91  # read first
    assert found["out"].entry_point == "elementwise" and found["out"].site.index == "i + 1u"


REFUSED = {
    "a pointer indexed": ("fn f() { var a: array<f32, 4>; let p = &a; let x = (*p)[1]; }", "parenthesised"),
    "a builtin's result indexed": ("fn f(v: vec4<f32>) { let x = abs(v)[1]; }", "abs(…)"),
    "an untyped let indexed": ("fn f(v: vec4<f32>) { let w = v * 2.0; let x = w[1]; }", "type of 'w'"),
    "a name it cannot see": ("fn f() { let x = nowhere[1]; }", "'nowhere' is indexed"),
    "a scalar indexed": ("fn f(x: f32) { let y = x[0]; }", "type scalar"),
    "a binding outside group 0": ("@group(1) @binding(0) var<storage, read> a: array<f32>;", "group"),
    "its own prefix": ("fn oob_index() {}", "prefix"),
    "a texture": ("@group(0) @binding(0) var t: texture_2d<f32>;", "var<> it does not know (t)"),
    "a subgroup matrix of no shape": ("fn f() { subgroupMatrixLoad(); }", "subgroupMatrixLoad without its matrix"),
    "a subgroup matrix of another pointer": (
        "fn f(p: ptr<function, array<f16, 64>>) { let m = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>"
        "(p, 0u, false, 16u); }",
        "of something other than &array",
    ),
}


@pytest.mark.parametrize("name", REFUSED)
def test_the_rewriter_refuses_what_it_cannot_check(name):
    """A construct it does not understand is an error naming it, never an access left unchecked."""
    source, words = REFUSED[name]
    with pytest.raises(SanitizerError, match=re.escape(words)):
        sanitize(source)


def split_product_graph(m: int, k: int, n: int, **flags) -> tuple[Graph, dict[str, tuple[int, ...]]]:
    """out = op(a)·op(b), a ragged m×k by k×n product, and its inputs' shapes."""
    shapes = {
        "a": (k, m) if flags.get("transpose_a") else (m, k),
        "b": (n, k) if flags.get("transpose_b") else (k, n),
    }
    tracer = Tracer()
    a, b = (tracer.leaf("input", name, TensorType(shape)) for name, shape in shapes.items())
    tracer.graph.outputs["out"] = tracer.emit("matmul", [a, b], **flags)
    return tracer.graph, shapes


def split_product_kernel(m: int, k: int, n: int, **flags) -> KernelSpec:
    """The split product (matmul_halves) of a ragged m×k by k×n, as planned for the H200 with
    tensor cores (products of any size split: tests/test_matmul_halves.py)."""
    graph, _ = split_product_graph(m, k, n, **flags)
    with patched(operand_splits, "halves_take", lambda m, k, n: True):
        kernels = compile_step(graph, dataclasses.replace(H200, tensor_cores=True)).kernels
    (product,) = [k for k in kernels if k.entry_point == "matmul_halves"]
    return product


def test_the_tensor_core_products_subgroup_matrix_loads_and_stores_are_checked():
    """The split products' kernel (matmul_halves, on Dawn's subgroup matrices: it cannot run on
    lavapipe) loads its tiles with subgroupMatrixLoad and stores its results with
    subgroupMatrixStore, through an offset into a workgroup array: each offset is checked with
    the matrix's extent, (rows − 1)·stride + columns elements, against the array's length."""
    product = split_product_kernel(37, 70, 45)
    sanitized = sanitize(product.wgsl)
    calls = len(re.findall(r"subgroupMatrix(?:Load|Store)\b", product.wgsl))
    spans = [site for site in sanitized.sites if "…" in site.index]
    assert calls >= 5 and len(spans) == calls
    assert {site.array for site in spans} == {"a_hi", "a_lo", "b_hi", "b_lo", "result"}
    assert all(site.index.endswith("+ (u32(16) - 1u) * u32(40u) + u32(16)") for site in spans if site.array != "result")
    assert sanitized.wgsl.count("oob_span(u32(") == calls


@pytest.mark.skipif(importlib.util.find_spec("wgpudawn") is None, reason="wgpudawn is not installed")
def test_the_sanitized_tensor_core_products_compile_through_tint():
    """Every transpose of a ragged split product, sanitized, goes through Tint (Dawn's Null adapter,
    with subgroup matrices): the checks are valid WGSL where the kernel runs."""
    sources = [
        sanitize(split_product_kernel(37, 70, 45, transpose_a=ta, transpose_b=tb).wgsl).wgsl
        for ta in (False, True)
        for tb in (False, True)
    ]
    script = textwrap.dedent(
        """
        import json, sys
        from wgpudawn.backends.dawn import extras
        extras.set_instance_extras(enable_toggles=["allow_unsafe_apis"])
        import wgpudawn
        adapter = wgpudawn.gpu.request_adapter_sync(power_preference="high-performance")
        wanted = ("subgroups", "shader-f16", "chromium-experimental-subgroup-matrix")
        device = extras.request_device_sync(adapter, required_features=[f for f in wanted if f in adapter.features])
        for source in json.load(sys.stdin):
            info = device.create_shader_module(code=source).get_compilation_info_sync()
            errors = [m for m in (getattr(info, "messages", None) or []) if "error" in str(getattr(m, "type", ""))]
            print("errors" if errors else "compiled", [str(getattr(m, "message", m))[:300] for m in errors])
        """
    )
    env = {**os.environ, "WGPU_BACKEND_TYPE": "Null"}
    done = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(sources), env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [line.split()[0] for line in done.stdout.splitlines()] == ["compiled"] * 4, done.stdout


@needs_tensor_cores
@pytest.mark.parametrize("flags", [{}, {"transpose_a": True}, {"transpose_b": True}], ids=["ab", "Ab", "aB"])
def test_the_split_products_index_in_bounds_on_the_tensor_cores(flags):
    """Where the device has f16 subgroup matrices (the H200 through Dawn): a ragged split product,
    its splits and maxima, run sanitized on the device's own plan, index nothing out of bounds."""
    graph, shapes = split_product_graph(130, 257, 70, **flags)
    with patched(operand_splits, "halves_take", lambda m, k, n: True):
        step = compile_step(graph, sanitizer_target(default_device().target))
    assert any(spec.entry_point == "matmul_halves" for spec in step.kernels)
    rng = np.random.default_rng(6)
    inputs = {name: spread(rng, *shape) for name, shape in shapes.items()}
    executable = step_run(step, inputs)
    assert "matmul_halves" in executable.entry_points
    assert not executable.out_of_bounds(), "\n".join(map(str, executable.out_of_bounds()))


# ---------------------------------------------------------------------------------------------
# Whole steps and single kernels, sanitized


def train_once(model, loss, inputs: dict, optimizer, feed: dict, target: Target) -> SanitizedExecutable:
    """One training step of `model` planned for `target`, every kernel sanitized."""
    target = sanitizer_target(target)  # a binding a kernel left for the flags
    program = sanitized_program(compile_plan(model, loss, inputs, optimizer, True, target))
    program.train_step(**feed)
    return program.executable


def workload_step(workload: workloads.Workload, target: Target) -> SanitizedExecutable:
    """One step of a bench workload (meganeura/bench/workloads.py) on its seeded batch."""
    feed = workload.batch(np.random.default_rng(0))
    return train_once(workload.model, workload.loss, workload.inputs, workload.optimizer, feed, target)


def bench_step(name: str) -> SanitizedExecutable:
    """The bench's step `name` at its small size, planned for this device as the bench plans it."""
    return workload_step(STEPS[name].build(small=True), default_device().target)


def labelled(rng: np.random.Generator, shape: tuple[int, ...], classes: int) -> dict[str, np.ndarray]:
    return {"x": rng.normal(size=shape).astype(np.float32), "y": rng.integers(0, classes, shape[0]).astype(np.int32)}


def classifier_step(model, shape: tuple[int, ...], classes: int, target: Target) -> SanitizedExecutable:
    """One AdamW step of a classifier of inputs `shape` (cross-entropy), every kernel sanitized."""
    inputs = {"x": mn.f32[shape], "y": mn.i32[shape[0]]}
    feed = labelled(np.random.default_rng(2), shape, classes)
    return train_once(model, ce_loss, inputs, optim.AdamW(lr=1e-3), feed, target)


class RowOps(nn.Module):
    """softmax along a middle axis, log_softmax along the last, a transpose: the row kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(7, 9)
        self.out = nn.Linear(5, 3)

    def forward(self, x):  # [B, 5, 7]
        h = self.fc(x)
        q = F.log_softmax(h * F.softmax(h, 1), -1)
        return self.out(q.transpose(1, 2)).sum(1)


class SelectOps(nn.Module):
    """Casts, scans, selections and integer indexing (ir/ops/select.py) along every kind of axis."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(7, 6)
        self.out = nn.Linear(6, 3)

    def forward(self, x):  # [B, 5, 7]
        h = self.fc(x).cumsum(1) * 0.1  # [B, 5, 6]
        best = h.max(dim=1)  # [B, 6]
        top = h.topk(2, dim=1).values.sum(1) + mn.sort(h, dim=-1).values[:, 0]
        picked = h.gather(2, mn.tensor([[1], [5], [0], [2], [4]]).expand(x.shape[0], 5, 1)).sum(1)
        rows = h[:, mn.tensor([4, -1, 0])].flip(2).cumprod(1)[:, -1] + mn.tril(h)[:, 1:4].sum(1)
        hot = F.one_hot(best.indices, 6).float().sum(-1) * mn.roll(h, 2, -1)[:, 0]
        return self.out(best.values + top + picked + rows + hot)


class SequenceOps(nn.Module):
    """An LSTM and a GRU over odd sizes (the fused recurrent cells, ir/ops/recurrent.py), a masked,
    dropped-out attention and an adaptive pool: the kernels the bench steps do not run."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(7, 6, batch_first=True)
        self.gru = nn.GRU(6, 5, batch_first=True)
        self.out = nn.Linear(5, 3)

    def forward(self, x):  # [B, 5, 7]
        h, _ = self.lstm(x)
        h, _ = self.gru(h)
        q = h.unsqueeze(1)  # [B, 1, 5, 5]
        mask = mn.tril(mn.ones(5, 5)) > 0
        a = F.scaled_dot_product_attention(q, q, q, attn_mask=mask, dropout_p=0.25).squeeze(1)
        pooled = F.adaptive_avg_pool1d(a.transpose(1, 2), 2).sum(-1)  # [B, 5]
        return self.out(pooled + F.adaptive_max_pool1d(h.transpose(1, 2), 3).sum(-1))


class SmallCNN(nn.Module):
    """conv → batch norm → max pool → strided conv → group norm → average pool → linear, odd sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 5, 3, padding=1)
        self.bn = nn.BatchNorm2d(5)
        self.pool = nn.MaxPool2d(2)
        self.c2 = nn.Conv2d(5, 7, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(1, 7)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(7, 3)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.c1(x))))
        x = self.avg(F.relu(self.gn(self.c2(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class WinogradNet(nn.Module):
    """Two stride-1 3×3 convolutions, which the H200's plan takes through Winograd's transforms."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 3)

    def forward(self, x):
        x = F.relu(self.c2(F.relu(self.c1(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def step_run(step, inputs: dict[str, np.ndarray]) -> SanitizedExecutable:
    """A compiled step of inputs only (no parameters) run once, every kernel sanitized."""
    executable = SanitizedExecutable(step, default_device(), {}, {})
    executable.run(inputs, read=tuple(step.graph.outputs))
    return executable


def spread(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Normal values over many binades, as the split kernels' tests feed them."""
    return (rng.normal(size=shape) * np.exp2(rng.uniform(-30, 0, size=shape))).astype(np.float32)


def split_kernels() -> SanitizedExecutable:
    """split_halves (both layouts), multi_top and multi_split_halves at ragged shapes, as
    tests/test_matmul_halves.py runs them on this device."""
    tracer, a, _ = multi_split_graph()
    top = tracer.leaf("input", "top", TensorType((5,)))
    for transpose in (False, True):
        single = tracer.emit("split_halves", [a, top], transpose=transpose, rows_to=64, cols_to=128)
        tracer.graph.outputs[f"single{int(transpose)}"] = single
    rng = np.random.default_rng(3)
    inputs = {"a": spread(rng, 37, 29), "b": spread(rng, 3, 70, 66), "top": np.array([0.5, -3, 0, 1, 2], np.float32)}
    return step_run(compile_step(tracer.graph, sanitizer_target(GENERIC)), inputs)


def tiled_transpose() -> SanitizedExecutable:
    """The tiled transpose (a GPU's, above TRANSPOSE_MIN_ELEMENTS) of a ragged 2×45×33."""
    graph = one_op("permute", [(2, 45, 33)], perm=(0, 2, 1))
    with patched(codegen_shape, "TRANSPOSE_MIN_ELEMENTS", 1):
        step = compile_step(graph, sanitizer_target(GENERIC))
    return step_run(step, {"x0": np.random.default_rng(4).normal(size=(2, 45, 33)).astype(np.float32)})


@contextlib.contextmanager
def patched(module, name: str, value):
    """`module.name` set to `value` for a while (a plan's policy, while it is planned)."""
    previous = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, previous)


# The matmul kernel's tilings that the H200's plans take at real sizes (gemm_table.py: its
# ladder, its checked 128×128, its split and batched rungs) and the generic ladder's, each forced
# on a product ragged on every axis or on ragged multiples of 4 (vec4 loads and stores), with a
# prologue and an epilogue: (tiling, M, K, N, Aᵀ, Bᵀ, batch, parts of K).
PRODUCTS = [
    (GemmTiling(64, 128, 16, 2, 2, prefetch=True), 37, 29, 45, False, False, (), 1),
    (GemmTiling(64, 128, 16, 2, 2, prefetch=True), 40, 32, 52, True, False, (), 1),
    (GemmTiling(128, 128, 16, 2, 2, checked=True), 38, 30, 46, False, True, (), 1),
    (GemmTiling(128, 128, 16, 2, 2, checked=True), 44, 36, 56, False, True, (), 1),
    (GemmTiling(32, 128, 16, 1, 2), 33, 50, 41, True, True, (2,), 1),
    (GemmTiling(64, 64, 16, 2, 2, prefetch=True), 35, 300, 9, False, False, (), 7),
    (GemmTiling(32, 32, 16, 1, 1, prefetch=True), 19, 21, 23, True, False, (3,), 1),
    (GemmTiling(32, 64, 16, 1, 1), 36, 28, 44, False, True, (), 1),
]


def forced_products() -> SanitizedExecutable:
    """PRODUCTS in one graph, each planned with its tiling (picked by its output's M × N)."""
    graph, feeds, rng = Graph(), {}, np.random.default_rng(6)
    for j, (_, m, k, n, ta, tb, batch, parts) in enumerate(PRODUCTS):
        shapes = operand_shapes(m, k, n, ta, tb, batch) + [(k if ta else m, 1)]
        attrs = {"transpose_a": ta, "transpose_b": tb, "prologue": "mul($a,$0)"}
        if parts > 1:
            attrs["splits"] = parts
        else:
            shapes.append((n,))
            attrs["epilogue"] = "relu(add($acc,$1))"
        names = [f"p{j}_{i}" for i in range(len(shapes))]
        leaves = [typed_leaf(graph, "input", name, shape) for name, shape in zip(names, shapes, strict=True)]
        graph.outputs[f"out{j}"] = emit(graph, "fused_matmul", leaves, **attrs)
        feeds |= {name: rng.normal(size=shape).astype(np.float32) for name, shape in zip(names, shapes, strict=True)}
    by_output = {(m, n): tiling for tiling, m, _, n, *_ in PRODUCTS}
    with patched(codegen_matmul, "gemm_tiling", lambda m, n, *_, **__: by_output[m, n]):
        step = compile_step(graph, sanitizer_target(GENERIC))
    return step_run(step, feeds)


def forced_convolutions() -> SanitizedExecutable:
    """The H200's largest convolution tiling (128×128, prefetch: gemm_table.py's conv and strided
    ladders) forced on a ragged 3×3 convolution at stride 1 (each mode: forward with an epilogue,
    grad_input, grad_weight in 3 parts of K) and on a strided input gradient."""
    tiling = GemmTiling(128, 128, 16, 2, 2, prefetch=True)
    stride1, stride2 = RAGGED_GEOMETRIES[0], RAGGED_GEOMETRIES[2]
    graphs = [
        conv_graph("forward", stride1, "relu(add($acc,$0))", (stride1[2], 1, 1)),
        conv_graph("grad_input", stride1),
        conv_graph("grad_weight", stride1, chunks=3),
        conv_graph("grad_input", stride2),
    ]
    checks = []
    for graph, feeds in graphs:
        with patched(codegen_conv, "gemm_tiling", lambda *_, **__: tiling):
            step = compile_step(graph, sanitizer_target(GENERIC))
        executable = step_run(step, feeds)
        checks += executable.checks
    executable.checks = checks  # the last one reports for all four
    return executable


def ragged_llama() -> workloads.Workload:
    """SmolLM2's layer at odd sizes: seq 13, vocab 97, 5 query heads over 1 KV head of 6, SwiGLU 71."""
    return workloads.smollm2(depth=1, batch=3, seq=13, vocab=97, dim=30, heads=5, kv_heads=1, hidden=71)


def ragged_gpt2() -> workloads.Workload:
    """GPT-2's block at odd sizes: seq 11, vocab 89, 3 heads of 12."""
    return workloads.gpt2(depth=1, batch=3, seq=11, vocab=89, dim=36, heads=3)


# name → the run (each returns its SanitizedExecutable after one step); "@h200": the H200's plan
CASES = {
    # The bench steps whose kernels no smaller case runs (unet, vit and gpt2-dropout's are the
    # convolutions, attention and dropout of the cases below, at a minute's cost sanitized).
    **{f"bench {name}": functools.partial(bench_step, name) for name in ("smollm2", "gpt2", "resnet18", "digits-mlp")},
    "mlp 37-53-11, batch 13": lambda: classifier_step(MLP(37, 53, 11), (13, 37), 11, default_device().target),
    # planned for lavapipe on every device: a CPU's column sums (reduce_columns) run nowhere else
    "mlp 5-6-3, batch 600 (column sums) @lavapipe": lambda: classifier_step(MLP(5, 6, 3), (600, 5), 3, LAVAPIPE),
    "llama ragged @h200": lambda: workload_step(ragged_llama(), H200),
    "gpt2 ragged": lambda: workload_step(ragged_gpt2(), default_device().target),
    "gpt2 ragged @h200": lambda: workload_step(ragged_gpt2(), H200),
    "cnn ragged": lambda: classifier_step(SmallCNN(), (3, 3, 11, 9), 3, default_device().target),
    "cnn ragged @h200": lambda: classifier_step(SmallCNN(), (3, 3, 11, 9), 3, H200),
    "winograd @h200": lambda: classifier_step(WinogradNet(), (2, 3, 13, 11), 3, H200),
    "row ops": lambda: classifier_step(RowOps(), (3, 5, 7), 3, default_device().target),
    "select ops": lambda: classifier_step(SelectOps(), (3, 5, 7), 3, default_device().target),
    "sequence ops": lambda: classifier_step(SequenceOps(), (3, 5, 7), 3, default_device().target),
    "matmul tilings forced": forced_products,
    "conv tilings forced": forced_convolutions,
    "tensor splits": split_kernels,
    "tiled transpose": tiled_transpose,
}


@dataclasses.dataclass(frozen=True)
class Run:
    """What one case's sanitized step left: the entry points it ran and what went out of bounds."""

    entry_points: frozenset[str]
    dispatches: int
    out_of_bounds: tuple[str, ...]


@functools.cache
def sanitized_run(case: str) -> Run:
    """Case `case` run once per session (the coverage test reuses the runs of the others)."""
    executable = CASES[case]()
    found = tuple(str(f) for f in executable.out_of_bounds())
    return Run(frozenset(executable.entry_points), len(executable.checks), found)


@pytest.mark.gpu  # (by hand: conftest's scan does not follow CASES)
@pytest.mark.parametrize("case", CASES)
def test_every_kernel_of_a_sanitized_step_indexes_in_bounds(case):
    """No site of any dispatch of the case's step indexed out of bounds (each reported by kernel
    label, entry point, array, index expression, function and line)."""
    run = sanitized_run(case)
    assert run.dispatches > 0
    assert not run.out_of_bounds, f"{len(run.out_of_bounds)} sites out of bounds:\n" + "\n".join(run.out_of_bounds)


def test_a_sanitized_step_computes_what_the_step_does():
    """The checks only clamp what is out of bounds: the ragged MLP's loss, and its parameters
    after the update, are those of the same plan unsanitized, to the bit."""
    weights = MLP(37, 53, 11).state_dict()
    inputs, feed = {"x": mn.f32[13, 37], "y": mn.i32[13]}, labelled(np.random.default_rng(5), (13, 37), 11)
    target = sanitizer_target(default_device().target)
    results = []
    for make in (Program, sanitized_program):
        model = MLP(37, 53, 11)  # a model each: programs of one model share its parameters' buffers
        model.load_state_dict(weights)
        program = make(compile_plan(model, ce_loss, inputs, optim.AdamW(lr=1e-3), True, target))
        results.append((program.train_step(**feed), program.state_dict()))
    (plain_loss, plain), (sanitized_loss, sanitized) = results
    assert sanitized_loss == plain_loss
    for name, value in plain.items():
        np.testing.assert_array_equal(sanitized[name], value, err_msg=name)


# The code generator's entry points (the @compute functions of shaders/*.wgsl) that a case above
# runs, and those none can here: the tensor-core products need Dawn's f16 subgroup matrices (the
# split products run sanitized where the device has them:
# test_the_split_products_index_in_bounds_on_the_tensor_cores).
EXERCISED = {
    "attention", "attention_grad_kv", "attention_grad_q", "conv_gemm", "cross_entropy_rows",
    "cross_entropy_rows_grad", "elementwise", "lines", "log_softmax", "log_softmax_grad", "matmul", "multi_top",
    "optimizer_update", "recurrent", "reduce_columns", "reduce_rows", "reduce_serial", "reduce_tree", "scatter_add",
    "softmax", "softmax_grad", "sort_ids", "split_halves", "transpose", "winograd",
}  # fmt: skip
NOT_EXERCISED = {"matmul_halves"}


def template_entry_points() -> set[str]:
    """The @compute functions of the shader templates."""
    folder = next(folder for folder in SHADER_DIRS if folder.is_dir())
    found = set()
    for path in folder.glob("*.wgsl"):
        found |= set(re.findall(r"@compute[^\n]*\n\s*fn\s+(\w+)", path.read_text()))
    return found


@pytest.mark.gpu
def test_the_entry_points_that_ran_sanitized():
    """Which of the code generator's entry points the cases above ran sanitized (EXERCISED), and
    which none can here (NOT_EXERCISED); together they are every entry point of the templates."""
    runs = {case: sanitized_run(case) for case in CASES}
    ran = set().union(*(run.entry_points for run in runs.values()))
    for entry in sorted(ran | NOT_EXERCISED):  # shown with `pytest -rP`
        cases = [case for case, run in runs.items() if entry in run.entry_points]
        print(f"{entry:24} {', '.join(cases) or 'not run: needs subgroup matrices (Dawn, a GPU)'}")
    assert ran == EXERCISED, f"ran sanitized: {sorted(ran)}"
    assert EXERCISED | NOT_EXERCISED == template_entry_points()


def test_the_kernels_trusted_to_run_unchecked_are_the_ones_checked_here():
    """codegen/kernel.py's TRUSTED_ENTRY_POINTS (the kernels MEGANEURA_UNCHECKED_KERNELS=1 runs
    without the shader compiler's bounds checks) are the entry points this file runs clean, and
    the split products, trusted on their padding (their halves are whole tiles: ir/ops/halves.py)
    and their ragged-shape tests on the H200 (tests/test_matmul_halves.py); this checker runs them
    only where the device has f16 subgroup matrices
    (test_the_split_products_index_in_bounds_on_the_tensor_cores)."""
    from meganeura.codegen.kernel import TRUSTED_ENTRY_POINTS

    assert TRUSTED_ENTRY_POINTS == EXERCISED | {"matmul_halves"}
