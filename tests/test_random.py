"""Random numbers on the GPU (ir/ops/random.py): Philox4x32-10 against Random123's known answers
in numpy and in WGSL, the device's draws against the numpy oracle bit for bit, seeds and the step
counter (checkpoints, resume), dropout's semantics and statistics, its gradient, and the plan that
regenerates a small dropout mask in the kernels using it (`regenerate_random`) or stores a large one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import wgpu
from conftest import (
    PROPERTY,
    assert_steps_follow_interpreter,
    check_rewrite,
    const,
    dims,
    emit,
    leaf,
    run_gpu,
    seeds,
    typed_leaf,
)
from hypothesis import given
from hypothesis import strategies as st

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen.render import load_template
from meganeura.compiler import compile_plan, explain_only
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.ops.random import RNG_STATE, draw, philox4x32, rng_state
from meganeura.ir.ops.transformer import dropout_keep
from meganeura.ir.trace import Tracer, tracing
from meganeura.runtime import default_device
from meganeura.target import GENERIC
from meganeura.tensor import Tensor

# Random123's known-answer vectors for philox4x32 with 10 rounds: DEShawResearch/random123,
# tests/kat_vectors (the three "philox4x32 10" lines): counter (4 words), key (2 words), result.
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def test_philox_in_numpy_gives_random123s_known_answers():
    counters = np.array([c for c, _, _ in KAT], dtype=np.uint32).T
    for index, (_, key, expected) in enumerate(KAT):
        words = philox4x32(counters[:, index : index + 1], np.array(key, dtype=np.uint32))
        assert words[:, 0].tolist() == list(expected)


def run_wgsl_words(body: str, words: int) -> np.ndarray:
    """`words` u32 that a one-thread WGSL kernel with shaders/philox.wgsl writes into `out`."""
    device = default_device().device
    code = load_template("philox") + (
        "\n@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n"
        f"@compute @workgroup_size(1)\nfn main() {{\n{body}\n}}\n"
    )
    module = device.create_shader_module(code=code)
    buffer = device.create_buffer(size=4 * words, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    entries = [{"binding": 0, "resource": {"buffer": buffer, "offset": 0, "size": 4 * words}}]
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(1)
    compute.end()
    device.queue.submit([encoder.finish()])
    return np.frombuffer(device.queue.read_buffer(buffer), dtype=np.uint32)


def test_philox_in_wgsl_gives_random123s_known_answers():
    lines = []
    for index, (counter, key, _) in enumerate(KAT):
        c = ", ".join(f"{w}u" for w in counter)
        k = ", ".join(f"{w}u" for w in key)
        lines.append(f"let r{index} = mn_philox4x32_10(vec4<u32>({c}), vec2<u32>({k}));")
        lines += [f"out[{4 * index + j}u] = r{index}.{'xyzw'[j]};" for j in range(4)]
    words = run_wgsl_words("\n".join(lines), 4 * len(KAT))
    assert words.reshape(len(KAT), 4).tolist() == [list(expected) for _, _, expected in KAT]


def test_the_counter_makes_every_element_node_and_step_distinct():
    state = rng_state(2**40 + 3, 2**33 + 1)
    assert state.dtype == np.int32 and state.view(np.uint32).tolist() == [3, 2**8, 1, 2]
    a = draw(state, (3, 4), stream=0)
    assert np.array_equal(a, draw(state, (12,), stream=0).reshape(3, 4))  # the flat index in its own shape
    others = [
        draw(state, (3, 4), 1),
        draw(rng_state(2**40 + 3, 2**33 + 2), (3, 4), 0),
        draw(rng_state(4, 0), (3, 4), 0),
    ]
    for other in others:  # another stream, another step, another seed
        assert not np.array_equal(a, other)
    big = draw(rng_state(0, 0), (4096,), 0)
    assert np.all(big * 2**24 == np.round(big * 2**24)) and 0.0 <= big.min() and big.max() < 1.0  # top 24 bits
    assert len(np.unique(big)) > 4090
    z = draw(rng_state(1, 0), (20000,), 0, normal_=True)
    assert abs(z.mean()) < 4 / math.sqrt(z.size) and abs(z.std() - 1.0) < 0.03


class RandomOutputs(nn.Module):
    """Random tensors read every way a kernel reads a value: stored (an output, a matmul operand),
    drawn in a reduction, a matmul prologue, a pointwise kernel (broadcast, vec4 and scalar)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(np.random.default_rng(1).normal(size=(16, 5)).astype(np.float32))

    def forward(self, x):
        return (
            mn.rand(2, 3),
            mn.rand(6, 16).sum(dim=1),
            mn.randn(3, 16) @ self.w,
            (mn.rand(3, 16) * x) @ self.w,
            x * mn.rand(3, 1) + mn.randn_like(x),
            (x * mn.rand(16)).sum(dim=0),
            x[:, :7] * mn.rand(3, 7),  # a scalar (not vec4) kernel
        )


def test_device_draws_equal_the_numpy_oracle_and_change_every_step():
    program = mn.compile(RandomOutputs(), inputs={"x": mn.f32[3, 16]}, seed=2**63 + 11)
    assert any(n.op == "philox" for n in program.fused_graph) and any(n.op == "rand" for n in program.graph)
    x = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
    previous = None
    for step in range(2):
        got = program(x=x)
        state = {RNG_STATE: rng_state(2**63 + 11, step)}
        expected = interpret(program.graph, {"x": x}, {"w": program.state_dict()["w"]}, state).outputs
        for (name, want), value in zip(expected.items(), got, strict=True):
            np.testing.assert_allclose(value, want, rtol=1e-6, atol=3e-6, err_msg=name)
        np.testing.assert_array_equal(got[0], expected["output0"])  # uniform draws: bit for bit
        np.testing.assert_array_equal(got[6], expected["output6"])
        if previous is not None:
            assert not np.array_equal(got[0], previous)
        previous = got[0]
    assert program.rng_step == 2
    unfused = mn.compile(RandomOutputs(), inputs={"x": mn.f32[3, 16]}, seed=2**63 + 11, rewrite=False)
    assert any(n.op == "rand" for n in unfused.fused_graph) and not any(n.op == "philox" for n in unfused.fused_graph)
    unfused(x=x)  # step 0
    for fused, stored in zip(got, unfused(x=x), strict=True):  # step 1: the rand kernels draw the same numbers
        np.testing.assert_allclose(stored, fused, rtol=1e-6, atol=3e-6)


def test_the_vec4_kernels_of_a_gpu_draw_in_place_as_the_oracle():
    """The reductions and elementwise kernels planned for a generic GPU read four values at a time
    (vec4 items, vec4 rows, a broadcast scalar): drawn in place, each element at its own index."""
    graph = Graph()
    state = typed_leaf(graph, "state", RNG_STATE, (4,), "i32")
    wide = emit(graph, "philox", [state], shape=(2, 65536), stream=0)
    rows = emit(graph, "philox", [state], shape=(8, 64), stream=1, normal=True)
    graph.outputs["columns"] = emit(graph, "sum", [wide], axes=(0,))
    graph.outputs["rows"] = emit(graph, "sum", [rows], axes=(1,))
    graph.outputs["scaled"] = emit(graph, "mul", [rows, emit(graph, "philox", [state], shape=(8, 1), stream=2)])
    states = {RNG_STATE: rng_state(9, 4)}
    executable = run_gpu(graph, {}, states=states, target=GENERIC)
    assert [k.label.split(" (")[-1] for k in executable.step.kernels] == [
        "reduce_serial, vec4)",
        "reduce_rows, vec4 rows)",
        "vec4)",
    ]
    got = executable.run({}, read=tuple(graph.outputs))
    # A value drawn at another element's counter moves an output by about 1; float32 sums of 64
    # normals and a GPU's log and cos (a few ulps: the H100 is 5e-6 off float64 on a row) do not.
    for name, want in interpret(graph, {}, states=states, dtype=np.float64).outputs.items():
        np.testing.assert_allclose(got[name], want, rtol=1e-6, atol=5e-5, err_msg=name)


shapes = st.lists(dims, min_size=0, max_size=3).map(tuple)


def broadcastable(shape: tuple[int, ...], pick: int) -> tuple[int, ...]:
    """A shape that broadcasts into `shape`: a suffix of it with some dims set to 1."""
    suffix = shape[len(shape) - pick % (len(shape) + 1) :] if shape else ()
    return tuple(1 if (pick >> i) & 1 else d for i, d in enumerate(suffix))


@PROPERTY
@given(shape=shapes, pick=st.integers(0, 15), normal_=st.booleans(), seed=seeds)
def test_regenerate_random_keeps_the_draws_of_a_broadcast_random_tensor(shape, pick, normal_, seed):
    """A random tensor of its own (smaller) shape, used twice in kernels of a larger one: the rule
    fires, the plan draws it in place (no kernel writes it) and the values are the same numbers."""
    graph = Graph()
    x = leaf(graph, "x", shape)
    state = typed_leaf(graph, "state", RNG_STATE, (4,), "i32")
    noise = emit(graph, "rand", [state], shape=broadcastable(shape, pick), stream=3, normal=normal_)
    kept = emit(graph, "mul", [x, emit(graph, "greater_equal", [noise, const(graph, 0.5)])])
    graph.outputs["kept"] = emit(graph, "exp", [kept])
    graph.outputs["again"] = emit(graph, "add", [emit(graph, "tanh", [x]), noise])
    fused, report = check_rewrite(graph, "regenerate_random", seed)
    assert report.rule("regenerate_random").uses >= 1
    assert not any(n.op == "rand" for n in fused) and any(n.op == "philox" for n in fused)


class Dropouts(nn.Module):
    def __init__(self, ps) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Dropout(p) for p in ps])

    def forward(self, x):
        return tuple(layer(x) for layer in self.layers)


def runs_z(kept: np.ndarray) -> float:
    """The Wald–Wolfowitz runs test's z statistic of a 0/1 sequence."""
    n1, n0 = kept.sum(), (~kept).sum()
    n = n1 + n0
    runs = 1 + np.count_nonzero(kept[1:] != kept[:-1])
    mean = 2 * n1 * n0 / n + 1
    variance = 2 * n1 * n0 * (2 * n1 * n0 - n) / (n * n * (n - 1))
    return float((runs - mean) / math.sqrt(variance))


def test_dropout_keep_rate_scale_and_independence_on_the_device():
    ps = (0.1, 0.5, 0.8)
    program = mn.compile(Dropouts(ps), inputs={"x": mn.f32[64, 60]}, seed=5)
    x = np.random.default_rng(3).uniform(0.5, 2.0, size=(64, 60)).astype(np.float32)
    steps = [program(x=x), program(x=x)]
    for step, outputs in enumerate(steps):
        expected = interpret(program.graph, {"x": x}, states={RNG_STATE: rng_state(5, step)}).outputs
        for value, want in zip(outputs, expected.values(), strict=True):
            np.testing.assert_array_equal(value, want)  # the device's masks are the oracle's
    n = x.size
    for index, p in enumerate(ps):
        masks = [outputs[index] != 0 for outputs in steps]
        scale = np.float32(1.0) / np.float32(1.0 - p)  # torch's noise.div_(1 - p), in f32
        for outputs, kept in zip(steps, masks, strict=True):
            assert abs(kept.mean() - (1 - p)) <= 4 * math.sqrt(p * (1 - p) / n)  # 4-sigma binomial bound
            np.testing.assert_array_equal(outputs[index][kept], x[kept] * scale)  # kept: exactly x/(1-p)
            np.testing.assert_array_equal(outputs[index][~kept], 0.0)
        flat = masks[0].ravel().astype(np.float64)
        bound = 4 / math.sqrt(n)
        assert abs(np.corrcoef(flat[1:], flat[:-1])[0, 1]) < bound  # neighbours along rows
        assert abs(np.corrcoef(masks[0][1:].ravel(), masks[0][:-1].ravel())[0, 1]) < bound  # along columns
        assert abs(runs_z(masks[0].ravel())) < 4
        assert abs(np.corrcoef(flat, masks[1].ravel())[0, 1]) < bound  # across steps
    assert not np.array_equal(steps[0][0], steps[1][0])


class DropoutMLP(nn.Module):
    def __init__(self, hidden: int = 12) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, hidden)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(hidden, 3)

    def forward(self, x):
        return self.fc2(self.drop(F.gelu(self.fc1(x))))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def mask_kernels(graph) -> list:
    """The kernels whose only inputs are random values drawn in place: stored masks."""
    return [
        n
        for n in graph
        if n.inputs and n.op not in ("philox", "rand") and all(graph[i].op == "philox" for i in n.inputs)
    ]


def feeds(count: int, batch: int = 4, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(batch, 6)).astype(np.float32), "y": rng.integers(0, 3, batch)} for _ in range(count)]


def test_a_small_dropout_mask_is_regenerated_in_the_kernels_using_it():
    mn.manual_seed(0)
    program = mn.compile(DropoutMLP(), ce, {"x": mn.f32[4, 6], "y": mn.i32[4]}, optim.Adam(lr=1e-2), seed=1)
    graph = program.fused_graph
    readers = [n for n in graph if any(graph[i].op == "philox" for i in n.inputs)]
    assert len(readers) == 2 and not mask_kernels(graph)  # the activation's kernel and the gradient's
    assert all(len(n.inputs) > 1 for n in readers)
    assert not any(n.op == "rand" for n in graph)  # no kernel writes the mask
    assert program.rewrite_report.rule("regenerate_random").uses >= 1
    assert "regenerate_random" in str(program.report())
    assert_steps_follow_interpreter(program, feeds(3))


def test_a_large_dropout_mask_is_stored_where_the_cost_model_says_so():
    traced = compile_plan(
        DropoutMLP(hidden=256), ce, {"x": mn.f32[64, 6], "y": mn.i32[64]}, optim.SGD(lr=0.1)
    ).fused_graph
    (mask,) = mask_kernels(traced)  # drawn once, stored, read by the forward and the backward
    assert mask.shape == (64, 256) and len(traced.users()[mask.id]) == 2


def fit_losses(seed: int, batches, **options):
    mn.manual_seed(0)  # the same initial weights
    program = mn.compile(DropoutMLP(), ce, {"x": mn.f32[4, 6], "y": mn.i32[4]}, optim.Adam(lr=1e-2), seed=seed)
    history = program.fit(batches, progress=False, **options)
    return program, [loss for _, loss in history.losses]


def test_same_seed_same_run_and_a_resumed_run_draws_what_the_uninterrupted_one_drew(tmp_path):
    batches = feeds(4, seed=7)
    whole, losses = fit_losses(5, batches)
    first, first_losses = fit_losses(5, batches[:2], checkpoint=tmp_path / "run.safetensors", checkpoint_every=2)
    assert first_losses == losses[:2]  # the same seed: the same masks, bit-identical losses
    # A fresh program compiled with another seed: the checkpoint's seed and step counter win.
    resumed, resumed_losses = fit_losses(99, batches, checkpoint=tmp_path / "run.safetensors", resume=True)
    assert resumed.rng_seed == 5 and resumed.rng_step == 4 == whole.rng_step
    assert resumed_losses == losses[2:]
    for name, value in whole.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)
    _, other = fit_losses(6, batches[:1])  # another seed: other masks
    assert other[0] != losses[0]


def test_seeds_follow_manual_seed_and_compile():
    model = DropoutMLP()
    spec = {"x": mn.f32[4, 6], "y": mn.i32[4]}
    with explain_only():
        mn.manual_seed(7)
        first, second = (mn.compile(model, ce, spec, optim.SGD(lr=0.1)) for _ in range(2))
        explicit = mn.compile(model, ce, spec, optim.SGD(lr=0.1), seed=-1)
        with pytest.warns(UserWarning, match="keep the mode they were compiled in"):  # Dropout depends on it
            model.eval()
        identity = mn.compile(model, ce, spec, optim.SGD(lr=0.1))
    assert (first.rng_seed, second.rng_seed, explicit.rng_seed) == (7, 8, 2**64 - 1)
    assert identity.rng_seed is None and not any(n.op == "rand" for n in identity.graph)  # eval: identity
    with pytest.raises(TypeError, match="seed must be an int"):
        mn.compile(model, ce, spec, optim.SGD(lr=0.1), seed="1")


def trace_with_state(build, x: np.ndarray):
    """The graph of `build(x)` with the gradient of sum(out · w) w.r.t. x (w fixed), traced."""
    tracer = Tracer()
    with tracing(tracer):
        node = tracer.leaf("input", "x", TensorType(x.shape))
        out = build(Tensor(tracer, node))
        weight = Tensor(tracer, tracer.leaf("input", "w", TensorType(out.shape)))
        loss = (out * weight).sum()
    graph = tracer.graph
    graph.outputs["out"] = out.node
    graph.outputs["loss"] = loss.node
    graph.outputs["grad"] = gradients(graph, loss.node, [node])[node]
    return graph


def test_dropout_gradient_is_the_mask_times_the_scale():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(5, 7))
    w = rng.normal(size=(5, 7))
    state = {RNG_STATE: rng_state(3, 9)}
    graph = trace_with_state(lambda t: F.dropout(F.tanh(t), 0.4) * 2.0, x)  # in the middle of a chain

    def run(values):
        return interpret(graph, {"x": values, "w": w}, states=state, dtype=np.float64).outputs

    result = run(x)
    mask = draw(state[RNG_STATE], (5, 7), 0) >= 0.4
    scale = float(np.float32(1.0) / np.float32(0.6))
    np.testing.assert_allclose(result["grad"], w * 2.0 * mask * scale * (1 - np.tanh(x) ** 2), rtol=1e-12)
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[index] = 1e-6
        numeric[index] = (run(x + step)["loss"] - run(x - step)["loss"]) / 2e-6
    np.testing.assert_allclose(result["grad"], numeric, rtol=1e-6, atol=1e-8)


def test_dropout_follows_pytorch_at_the_edges():
    x = np.array([[1.0, np.inf, np.nan, -2.0]], dtype=np.float32)
    state = {RNG_STATE: rng_state(0, 0)}

    def run(build):
        tracer = Tracer()
        with tracing(tracer):
            out = build(Tensor(tracer, tracer.leaf("input", "x", TensorType(x.shape))))
        tracer.graph.outputs["out"] = out.node
        with np.errstate(invalid="ignore"):  # inf · 0
            return interpret(tracer.graph, {"x": x}, states=state).outputs["out"]

    np.testing.assert_array_equal(run(lambda t: F.dropout(t, 1.0)), np.float32([[0.0, np.nan, np.nan, -0.0]]))
    for identity in (lambda t: F.dropout(t, 0.0), lambda t: F.dropout(t, 0.5, training=False)):
        np.testing.assert_array_equal(run(identity), x)
    for bad in (-0.1, 1.1, True):
        with pytest.raises(ValueError, match="between 0 and 1"):
            run(lambda t, p=bad: F.dropout(t, p))
        with pytest.raises(ValueError, match="between 0 and 1"):
            nn.Dropout(bad)
    assert repr(nn.Dropout(0.3)) == "Dropout(p=0.3, inplace=False)"
    assert repr(nn.Dropout2d(0.3)) == "Dropout2d(p=0.3, inplace=False)"
    with pytest.raises(mn.ShapeError, match="Expected 2D or 3D input"):
        run(lambda t: F.dropout1d(t.reshape(1, 1, 1, 4)))
    with pytest.raises(NotImplementedError, match="generator"):
        run(lambda t: mn.rand(2, generator=object()))
    outside = mn.rand(3)  # outside a trace (a module's __init__): numpy draws of manual_seed's generator
    assert isinstance(outside, np.ndarray) and outside.dtype == np.float32 and 0.0 <= outside.min() < 1.0
    assert mn.randn_like(np.zeros((2, 5))).shape == (2, 5)


class ChannelDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.two = nn.Dropout2d(0.5)
        self.one = nn.Dropout1d(0.5)

    def forward(self, image, sequence):
        return self.two(image), self.one(sequence), mn.bernoulli(F.sigmoid(image)), mn.bernoulli(sequence, 0.25)


def test_channel_dropout_and_bernoulli_on_the_device():
    program = mn.compile(ChannelDropout(), inputs={"image": mn.f32[3, 5, 2, 4], "sequence": mn.f32[4, 6, 5]}, seed=8)
    rng = np.random.default_rng(2)
    image = rng.uniform(1.0, 2.0, size=(3, 5, 2, 4)).astype(np.float32)
    sequence = rng.uniform(1.0, 2.0, size=(4, 6, 5)).astype(np.float32)
    got = program(image=image, sequence=sequence)
    expected = interpret(program.graph, {"image": image, "sequence": sequence}, states={RNG_STATE: rng_state(8, 0)})
    for value, want in zip(got, expected.outputs.values(), strict=True):
        np.testing.assert_array_equal(value, want)
    two, one = got[0] != 0, got[1] != 0
    assert np.all(two == two[:, :, :1, :1]) and 0 < two.mean() < 1  # whole channels
    assert np.all(one == one[:, :, :1]) and 0 < one.mean() < 1
    assert set(np.unique(got[2])) <= {0.0, 1.0} and set(np.unique(got[3])) <= {0.0, 1.0}


class DropoutAttention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.25, is_causal=True, enable_gqa=True)


def test_attention_with_dropout_matches_the_formula():
    program = mn.compile(
        DropoutAttention(), inputs={"q": mn.f32[1, 4, 5, 8], "k": mn.f32[1, 2, 5, 8], "v": mn.f32[1, 2, 5, 8]}, seed=4
    )
    (node,) = [n for n in program.graph if n.op == "attention"]  # one fused op that draws its own mask
    assert node.attr("dropout") == 0.25 and node.attr("stream") == 0
    rng = np.random.default_rng(6)
    q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)))
    got = program(q=q, k=k, v=v)
    k4, v4 = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    scores = q.astype(np.float64) @ k4.transpose(0, 1, 3, 2) / math.sqrt(8) + np.triu(np.full((5, 5), -np.inf), 1)
    probabilities = np.exp(scores - scores.max(-1, keepdims=True))
    probabilities /= probabilities.sum(-1, keepdims=True)
    keep = dropout_keep(rng_state(4, 0), (1, 4, 5, 5), 0, 0.25)
    np.testing.assert_allclose(got, (probabilities * keep / 0.75) @ v4, rtol=1e-5, atol=1e-5)
