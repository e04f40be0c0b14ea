"""The runtime and the buffer plan: reuse, the in-place schedule, end-of-step copies, shared
parameters, readback of only what is asked, input checks and adapter selection."""

from __future__ import annotations

import numpy as np
import pytest
import wgpu
from conftest import assert_steps_follow_interpreter, const, emit, typed_leaf

import meganeura.functional as F
from meganeura import nn, optim
from meganeura.codegen.buffers import plan_buffers
from meganeura.codegen.lower import lower_graph
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.passes import compile_step
from meganeura.runtime import Executable, backend, default_device, device, mapping

RNG = np.random.default_rng(1)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape).astype(np.float32)


# Tests of wgpu-native's C fast paths (runtime/native.py), which Dawn's backend does not have.
wgpu_native_only = pytest.mark.skipif(backend.NAME != "wgpu", reason="wgpu-native's C paths (MEGANEURA_BACKEND=wgpu)")


def executable(graph: Graph, params: dict | None = None, states: dict | None = None) -> Executable:
    parameters = {
        name: value if isinstance(value, nn.Parameter) else nn.Parameter(value)
        for name, value in (params or {}).items()
    }
    return Executable(compile_step(graph), default_device(), parameters, dict(states or {}))


def chain_graph(length: int = 6) -> Graph:
    """x -> tanh -> mul 0.5 -> tanh -> ... : every intermediate dies as soon as the next one exists."""
    graph = Graph()
    value = typed_leaf(graph, "input", "x", (7, 33))
    for index in range(length):
        value = emit(graph, "tanh", [value]) if index % 2 == 0 else emit(graph, "mul", [value, const(graph, 0.5)])
    graph.outputs["y"] = value
    return graph


def test_buffers_are_reused_along_a_chain():
    graph = chain_graph(6)
    program = executable(graph)
    plan = program.plan
    temps = [slot for slot in plan.buffers if slot.role == "temp"]
    assert len(plan.buffers) < len(plan.value_bytes)  # fewer buffers than values
    assert len(temps) == 2 and all(len(slot.values) > 1 for slot in temps)  # ping-pong
    assert plan.total_bytes < plan.bytes_without_reuse
    text = str(plan)
    assert "without reuse" in text and "output y" in text and "input x" in text
    x = normal(7, 33)
    for _ in range(2):
        got = program.run({"x": x}, read=("y",))["y"]
        np.testing.assert_allclose(got, interpret(graph, {"x": x}).outputs["y"], rtol=1e-6, atol=1e-6)


def test_no_kernel_writes_a_buffer_it_reads():
    graph = chain_graph(5)
    plan = plan_buffers(graph, lower_graph(graph))
    for spec in plan.schedule:
        written = {plan.buffer_of[value] for value in spec.written}
        assert all(plan.node_slot[b.value] not in written for b in spec.bindings if b.access == "read")


def test_readers_of_a_param_run_before_its_in_place_update():
    """The update comes first in graph order, yet the matmul must see the old weight."""
    graph = Graph()
    w = typed_leaf(graph, "param", "w", (5, 3))
    g = typed_leaf(graph, "input", "g", (5, 3))
    x = typed_leaf(graph, "input", "x", (4, 5))
    graph.updates["w"] = emit(graph, "sgd_step", [w, g, const(graph, 0.5), const(graph, 0.0)])
    graph.outputs["y"] = emit(graph, "matmul", [x, w])
    w0, inputs = normal(5, 3), {"g": normal(5, 3), "x": normal(4, 5)}
    program = executable(graph, {"w": w0})
    order = [spec.node for spec in program.plan.schedule]
    assert order.index(graph.outputs["y"]) < order.index(graph.updates["w"])
    assert program.plan.schedule[-1].inplace_input == w and not program.plan.copies
    expected = interpret(graph, inputs, {"w": w0})
    got = program.run(inputs, read=("y",))
    np.testing.assert_allclose(got["y"], expected.outputs["y"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(program.read_state("w"), expected.updates["w"], rtol=1e-6, atol=1e-6)


def test_update_falls_back_to_a_copy_when_the_old_value_is_needed_later():
    """A reader of both the old and the new weight forbids the in-place update; a copy replaces it."""
    graph = Graph()
    w = typed_leaf(graph, "param", "w", (6,))
    g = typed_leaf(graph, "input", "g", (6,))
    new_w = emit(graph, "sgd_step", [w, g, const(graph, 1.0), const(graph, 0.0)])
    graph.updates["w"] = new_w
    graph.outputs["delta"] = emit(graph, "sub", [new_w, w])
    graph.outputs["old"] = w  # an output that is a leaf the step updates: its old value comes back
    w0, inputs = normal(6), {"g": normal(6)}
    program = executable(graph, {"w": w0})
    assert all(spec.inplace_input is None for spec in program.kernels)
    assert [copy.leaf for copy in program.plan.copies] == ["w"]
    got = program.run(inputs, read=("delta", "old"))
    np.testing.assert_allclose(got["delta"], -inputs["g"], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got["old"], w0)
    np.testing.assert_allclose(program.read_state("w"), w0 - inputs["g"], rtol=1e-6, atol=1e-6)


def test_adam_step_counter_is_copied_into_its_state_each_step():
    graph = Graph()
    t = typed_leaf(graph, "state", "t", ())
    graph.updates["t"] = emit(graph, "add", [t, const(graph, 1.0)])
    graph.outputs["t_next"] = graph.updates["t"]
    program = executable(graph, states={"t": np.float32(3.0)})
    assert [program.run({}, read=("t_next",))["t_next"] for _ in range(3)] == [4.0, 5.0, 6.0]
    assert program.read_state("t") == 6.0
    program.write_state("t", np.float32(0.0))
    assert program.run({}, read=("t_next",))["t_next"] == 1.0


def test_the_step_recorded_ahead_sees_new_inputs_state_writes_and_reads():
    """run() records step N+1's command buffer while step N runs: the next call's inputs, a state
    written in between, and a change of the outputs read must all still hold."""
    graph = Graph()
    t = typed_leaf(graph, "state", "t", ())
    x = typed_leaf(graph, "input", "x", (5,))
    graph.updates["t"] = emit(graph, "add", [t, const(graph, 1.0)])
    graph.outputs["t_next"] = graph.updates["t"]
    graph.outputs["a"] = emit(graph, "exp", [x])
    program = executable(graph, states={"t": np.float32(3.0)})
    recordings = []
    record = program.step_commands
    program.step_commands = lambda copies, **kw: recordings.append(len(copies)) or record(copies, **kw)
    both = ("a", "t_next")
    xs = [normal(5) for _ in range(5)]
    got = program.run({"x": xs[0]}, read=both)
    assert got["t_next"] == 4.0 and program.recorded is not None and program.recorded[0] == both
    got = program.run({"x": xs[1]}, read=both)  # submits the buffer recorded ahead
    np.testing.assert_allclose(got["a"], np.exp(xs[1]), rtol=1e-6)
    assert got["t_next"] == 5.0 and recordings == [2, 2, 2]  # first step, then one ahead after each
    program.write_state("t", np.float32(10.0))
    got = program.run({"x": xs[2]}, read=both)
    np.testing.assert_allclose(got["a"], np.exp(xs[2]), rtol=1e-6)
    assert got["t_next"] == 11.0 and len(recordings) == 4
    assert program.run({"x": xs[3]}, read=("t_next",))["t_next"] == 12.0  # another read: recorded anew
    got = program.run({"x": xs[4]}, read=both)
    np.testing.assert_allclose(got["a"], np.exp(xs[4]), rtol=1e-6)
    assert got["t_next"] == 13.0 and recordings == [2, 2, 2, 2, 1, 1, 2, 2]
    program.record_ahead = False  # the buffer already recorded is used, then none ahead
    assert program.run({"x": xs[0]}, read=both)["t_next"] == 14.0 and len(recordings) == 8
    assert program.run({"x": xs[0]}, read=both)["t_next"] == 15.0 and len(recordings) == 9
    assert program.recorded is None


def test_a_step_submitted_in_parts_computes_what_one_submit_does(monkeypatch):
    """On Dawn a step goes to the queue in parts (executable.SUBMIT_PARTS): a chain of dependent
    kernels cut across parts, with an input, a state update and a readback, gives the same values
    step after step as one part; the part count follows the backend and the dispatch count."""
    from meganeura.runtime import executable as runtime_executable

    graph = Graph()
    t = typed_leaf(graph, "state", "t", ())
    x = typed_leaf(graph, "input", "x", (37,))
    value = x
    for i in range(7):  # seven kernels, each reading the last
        value = emit(graph, "add", [emit(graph, "exp" if i % 2 else "neg", [value]), const(graph, 0.25)])
    graph.updates["t"] = emit(graph, "add", [t, const(graph, 1.0)])
    graph.outputs["t_next"] = graph.updates["t"]
    graph.outputs["y"] = value
    xs = [normal(37) * 0.1 for _ in range(3)]
    runs = {}
    for parts in (1, 3, 7):
        monkeypatch.setattr(runtime_executable, "submit_parts", lambda dispatches, parts=parts: parts)
        program = executable(graph, states={"t": np.float32(0.0)})
        assert program.parts == parts and len(program.dispatches) >= 7
        runs[parts] = [program.run({"x": x}, read=("y", "t_next")) for x in xs]
        assert len(program.recorded[1]) == parts  # the next step's buffers, recorded ahead
    for parts in (3, 7):
        for one, split in zip(runs[1], runs[parts], strict=True):
            np.testing.assert_array_equal(split["y"], one["y"])
            assert split["t_next"] == one["t_next"]
    assert [r["t_next"] for r in runs[7]] == [1.0, 2.0, 3.0]
    expected = xs[-1].astype(np.float64)
    for i in range(7):
        expected = (np.exp(expected) if i % 2 else -expected) + 0.25
    np.testing.assert_allclose(runs[7][-1]["y"], expected, rtol=1e-5)
    monkeypatch.undo()
    monkeypatch.setattr(runtime_executable, "BACKEND", "dawn")
    assert [runtime_executable.submit_parts(n) for n in (20, 64, 200, 2894)] == [1, 1, 3, 8]
    monkeypatch.setattr(runtime_executable, "BACKEND", "wgpu")
    assert runtime_executable.submit_parts(2894) == 1


def staged_graph() -> Graph:
    """Inputs of odd sizes and both dtypes (their staging offsets are 256-byte aligned, their copies
    whole words) and outputs that read each."""
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (3,))
    z = typed_leaf(graph, "input", "z", (5, 7))
    y = typed_leaf(graph, "input", "y", (5,), "i32")
    graph.outputs["x2"] = emit(graph, "mul", [x, const(graph, 2.0)])
    graph.outputs["loss"] = emit(graph, "cross_entropy_rows", [z, y])
    graph.outputs["labels"] = y
    return graph


@pytest.mark.parametrize("staged", [True, False])
def test_inputs_reach_every_step_through_the_staging_buffer_or_queue_writes(staged, monkeypatch):
    """runtime/uploads.py: each step's inputs, new every call, reach run() (its command buffer
    recorded ahead), a run that reads nothing, timed_run() and profile(); a wrong shape is refused
    and the next step runs; without wgpu-native's C functions the inputs go by queue.write_buffer."""
    from meganeura.runtime import uploads

    if not staged:
        monkeypatch.setattr(uploads, "wgpu_native", lambda: None)
    elif uploads.wgpu_native() is None:
        pytest.skip("this wgpu build does not expose wgpu-native's C functions")
    graph = staged_graph()
    program = executable(graph)
    assert (program.staging is not None) is staged
    if staged:  # 3 inputs at 256-byte offsets; a device whose buffers hold less keeps queue writes
        inputs = {name: (buffer, program.leaf_types[name]) for name, buffer in program.inputs.items()}
        assert uploads.staged_bytes(inputs) == program.staging.size == 3 * 256
        assert uploads.input_staging(program.device.device, inputs, largest=3 * 256 - 1) is None
    reads = ("x2", "loss", "labels")

    def feed(step: int) -> dict:
        return {"x": normal(3), "z": normal(5, 7), "y": (np.arange(5) * (step + 1)) % 7}

    def check(got: dict, inputs: dict) -> None:
        want = interpret(graph, {**inputs, "y": inputs["y"].astype(np.int32)}).outputs
        np.testing.assert_allclose(got["x2"], want["x2"], rtol=1e-6)
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got["labels"], inputs["y"])

    for step in range(4):
        inputs = feed(step)
        check(program.run(inputs, read=reads), inputs)
        program.run(feed(step + 10), read=())  # nothing read: the next upload waits for its copy
    with pytest.raises(ValueError, match=r"input 'z': expected shape \[5, 7\], got \[7, 5\]"):
        program.run({**feed(0), "z": normal(7, 5)}, read=reads)
    inputs = feed(5)
    check(program.run(inputs, read=reads), inputs)
    if program.device.has_timestamps:
        inputs = feed(6)
        got, ns = program.timed_run(inputs, read=reads)
        check(got, inputs)
        inputs = feed(7)
        check(program.profile(inputs, read=reads)[0], inputs)
    inputs = feed(8)
    check(program.run(inputs, read=reads), inputs)


@pytest.mark.parametrize("path", ["native", "wgpu-py"])
def test_a_readback_after_submit_returns_the_copied_range(path, monkeypatch):
    if path == "wgpu-py":
        monkeypatch.setattr(mapping, "NATIVE", None)
    elif mapping.NATIVE is None:
        pytest.skip("this wgpu build does not expose wgpu-native's C functions")
    dev = default_device()
    usage = wgpu.BufferUsage
    source = dev.device.create_buffer(size=64, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)
    readback = dev.device.create_buffer(size=64, usage=usage.MAP_READ | usage.COPY_DST)
    values = np.arange(16, dtype=np.float32)
    for _ in range(3):  # the buffer is unmapped after each read, and maps again
        dev.queue.write_buffer(source, 0, values)
        encoder = dev.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(source, 0, readback, 0, 64)
        dev.queue.submit([encoder.finish()])
        got = np.frombuffer(mapping.read_after_submit(dev.device, readback, 16, 32), np.float32)
        np.testing.assert_array_equal(got, values[4:12])
        got[0] = -1.0  # a copy the caller owns: arrays on it are writable
        values = values * 2 + 1


def test_outputs_are_writable_arrays():
    program = executable(chain_graph(2))
    y = program.run({"x": normal(7, 33)}, read=("y",))["y"]
    y += 1.0
    assert y.flags.writeable and y.shape == (7, 33)


def linear_graph(batch: int) -> Graph:
    graph = Graph()
    w = typed_leaf(graph, "param", "w", (3, 4))
    x = typed_leaf(graph, "input", "x", (batch, 4))
    graph.outputs["y"] = emit(graph, "matmul", [x, w], transpose_b=True)
    return graph


def sgd_graph() -> Graph:
    graph = Graph()
    w = typed_leaf(graph, "param", "w", (3, 4))
    g = typed_leaf(graph, "input", "g", (3, 4))
    graph.updates["w"] = emit(graph, "sgd_step", [w, g, const(graph, 1.0), const(graph, 0.0)])
    return graph


def test_executables_share_a_parameter_buffer():
    weight = nn.Parameter(normal(3, 4))
    trainer = executable(sgd_graph(), {"w": weight})
    predictor = executable(linear_graph(2), {"w": weight})
    assert predictor.states["w"] is trainer.states["w"]
    x, g = normal(2, 4), normal(3, 4)
    before = weight.numpy()
    trainer.run({"g": g})
    np.testing.assert_allclose(predictor.run({"x": x}, read=("y",))["y"], x @ (before - g).T, rtol=1e-5, atol=1e-6)
    weight.copy_(np.ones((3, 4), np.float32))  # a host write reaches both programs
    np.testing.assert_allclose(predictor.run({"x": x}, read=("y",))["y"], x @ np.ones((4, 3)), rtol=1e-6)
    np.testing.assert_array_equal(trainer.read_state("w"), np.ones((3, 4)))


def test_only_the_requested_outputs_come_back():
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (5,))
    graph.outputs["a"] = emit(graph, "exp", [x])
    graph.outputs["b"] = emit(graph, "neg", [x])
    graph.outputs["c"] = emit(graph, "sum", [x], axes=(0,), keepdim=False)
    program = executable(graph)
    inputs = {"x": normal(5)}
    assert program.run(inputs) == {}
    got = program.run(inputs, read=("c", "b"))
    assert list(got) == ["c", "b"]
    np.testing.assert_allclose(got["b"], -inputs["x"])
    np.testing.assert_allclose(got["c"], inputs["x"].sum(), rtol=1e-6)
    with pytest.raises(KeyError, match="outputs are"):
        program.run(inputs, read=("d",))


def test_i32_labels_are_uploaded_as_integers():
    graph = Graph()
    logits = typed_leaf(graph, "input", "z", (4, 3))
    labels = typed_leaf(graph, "input", "y", (4,), "i32")
    graph.outputs["labels"] = labels
    graph.outputs["loss"] = emit(graph, "cross_entropy_rows", [logits, labels])
    program = executable(graph)
    inputs = {"z": normal(4, 3), "y": np.array([2, 0, 1, 2], np.int64)}  # int64 is converted
    got = program.run(inputs, read=("labels", "loss"))
    assert got["labels"].dtype == np.int32
    np.testing.assert_array_equal(got["labels"], inputs["y"])
    expected = interpret(graph, {"z": inputs["z"], "y": inputs["y"].astype(np.int32)}).outputs["loss"]
    np.testing.assert_allclose(got["loss"], expected, rtol=1e-6, atol=1e-6)


def test_bad_inputs_are_refused():
    program = executable(linear_graph(2), {"w": normal(3, 4)})
    with pytest.raises(KeyError, match=r"missing \['x'\]"):
        program.run({}, read=("y",))
    with pytest.raises(KeyError, match=r"unknown \['z'\]"):
        program.run({"x": normal(2, 4), "z": normal(1)}, read=("y",))
    with pytest.raises(ValueError, match=r"expected shape \[2, 4\], got \[3, 4\]"):
        program.run({"x": normal(3, 4)}, read=("y",))
    with pytest.raises(KeyError, match="params \\['w'\\]"):
        executable(linear_graph(2))
    weight = nn.Parameter(normal(4, 3))
    with pytest.raises(ValueError, match=r"param w: the graph needs f32\[3,4\], got shape \[4, 3\]"):
        executable(linear_graph(2), {"w": weight})
    assert weight.storage is None  # refused before the parameter moved to the device


def test_pipelines_are_built_once_per_wgsl_text():
    graph = Graph()
    a, b = typed_leaf(graph, "input", "a", (8,)), typed_leaf(graph, "input", "b", (8,))
    graph.outputs["ea"] = emit(graph, "exp", [a])
    graph.outputs["eb"] = emit(graph, "exp", [b])
    program = executable(graph)
    assert program.kernels[0].wgsl == program.kernels[1].wgsl
    assert program.dispatches[0][0] is program.dispatches[1][0]


def test_device_description_and_adapter_override(monkeypatch):
    default = default_device()
    assert default.describe().startswith(default.adapter.info["device"] + " — ")
    assert default_device() is default
    name, kind = default.adapter.info["device"], default.adapter.info["adapter_type"]
    monkeypatch.setenv(device.ADAPTER_ENV, name[:6].upper())  # a case-insensitive substring
    assert name[:6] in device.select_adapter().info["device"]
    monkeypatch.setenv(device.ADAPTER_ENV, "cpu" if kind == "CPU" else "gpu")
    chosen = device.select_adapter()
    assert chosen.info["adapter_type"] == kind and chosen.info["backend_type"] != "OpenGL"
    monkeypatch.setenv(device.ADAPTER_ENV, "no-such-adapter")
    with pytest.raises(RuntimeError, match="matches no adapter; available"):
        device.select_adapter()


class TinyBlock(nn.Module):
    """RMS norm, two-head self-attention and a SiLU-gated MLP: permutes, batched matmuls with
    transposed operands, max/sum reductions, rsqrt and silu, forward and backward."""

    def __init__(self, d: int = 8, heads: int = 2, hidden: int = 12, classes: int = 3) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(d, d, bias=False) for _ in range(3))
        self.o = nn.Linear(d, d)
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d)
        self.head = nn.Linear(d, classes)

    @staticmethod
    def rms(x):
        return x * F.rsqrt(F.mean(x * x, dim=-1, keepdim=True) + 1e-5)

    def forward(self, x):
        batch, tokens, d = x.shape
        dh = d // self.heads

        def split(t):
            return t.reshape(batch, tokens, self.heads, dh).permute(0, 2, 1, 3)

        h = self.rms(x)
        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        attention = F.softmax((q @ k.transpose(-1, -2)) * (1.0 / dh**0.5), dim=-1)
        mixed = (attention @ v).permute(0, 2, 1, 3).reshape(batch, tokens, d)
        x = x + self.o(mixed)
        h = self.rms(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return self.head(F.mean(x, dim=1))


def test_unfused_attention_block_trains_like_the_interpreter():
    import meganeura as mn

    mn.manual_seed(3)
    model = TinyBlock()
    program = mn.compile(
        model,
        loss=lambda model, x, y: F.cross_entropy(model(x), y),
        inputs={"x": mn.f32[2, 5, 8], "y": mn.i32[2]},
        optimizer=optim.Adam(lr=1e-2),
        rewrite=False,
    )
    ops = {node.op for node in program.graph}
    assert {"permute", "softmax", "softmax_grad", "rsqrt", "silu", "log_softmax", "pick", "scatter_rows"} <= ops
    assert any(node.op == "matmul" and len(node.shape) == 4 for node in program.graph)
    x, y = RNG.normal(size=(2, 5, 8)).astype(np.float32), np.array([0, 2], np.int32)
    assert_steps_follow_interpreter(program, [{"x": x, "y": y}] * 3)


def test_dispatches_recorded_through_wgpu_natives_c_calls_train_exactly_like_the_public_methods(monkeypatch):
    """runtime/encoding.py: the pinned wgpu exposes its C functions, the runtime records through
    them, and three Adam steps give the same losses and parameters, bit for bit, as recording
    through wgpu-py's methods."""
    import meganeura as mn
    from meganeura.runtime import encoding
    from meganeura.runtime import executable as executable_module

    assert encoding.NATIVE is not None and executable_module.record is encoding.record_native
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.normal(size=(8, 6)).astype(np.float32), "y": rng.integers(0, 3, 8).astype(np.int32)}]
    results = []
    for record in (encoding.record_native, encoding.record_public):
        monkeypatch.setattr(executable_module, "record", record)
        mn.manual_seed(11)
        model = nn.Sequential(nn.Linear(6, 7), nn.ReLU(), nn.Linear(7, 3))
        program = mn.compile(
            model,
            loss=lambda m, x, y: F.cross_entropy(m(x), y),
            inputs={"x": mn.f32[8, 6], "y": mn.i32[8]},
            optimizer=optim.Adam(lr=1e-2),
        )
        losses = [program.train_step(**feeds[0]) for _ in range(3)]
        results.append((losses, program.state_dict()))
    (native_losses, native_state), (public_losses, public_state) = results
    assert native_losses == public_losses and native_losses[2] < native_losses[0]
    for name, value in native_state.items():
        np.testing.assert_array_equal(value, public_state[name], err_msg=name)
    assert encoding.recorder(native=False) is encoding.record_public


@wgpu_native_only
def test_a_bad_dispatch_recorded_natively_fails_when_the_encoder_finishes(monkeypatch):
    """Errors are not lost on the C path: WebGPU reports a pass's errors at finish, both ways."""
    import wgpu

    import meganeura as mn
    from meganeura.runtime import encoding

    program = mn.compile(
        nn.Sequential(nn.Linear(6, 3)),
        loss=lambda m, x, y: F.cross_entropy(m(x), y),
        inputs={"x": mn.f32[8, 6], "y": mn.i32[8]},
        optimizer=optim.SGD(lr=0.1),
    )
    pipeline, group, _ = program.executable.dispatches[0]
    device = program.executable.device.device
    for record in (encoding.record_native, encoding.record_public):
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        record(compute, [(pipeline, group, (70000, 1, 1))])  # over the 65535 a dimension allows
        compute.end()
        with pytest.raises(wgpu.GPUValidationError, match="65535"):
            encoder.finish()


@wgpu_native_only
def test_without_a_name_of_wgpu_natives_module_every_fast_path_falls_back_or_refuses(monkeypatch):
    """runtime/native.py: a wgpu build whose wgpu-native module lacks a name the fast paths use (what
    an upgrade that moves it looks like) gives None, and then recording and readback take wgpu-py's
    public API, and an unchecked shader module is refused with the reason."""
    from wgpu.backends.wgpu_native import _api

    from meganeura.runtime import encoding, native, uploads

    assert native.wgpu_native() is _api
    monkeypatch.delattr(_api, "from_c_string_view")
    native.webgpu_c.cache_clear()
    try:
        assert native.wgpu_native() is None
        assert encoding.native_functions() is None and mapping.native_mapper() is None
        dev = default_device().device
        buffer = dev.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST)
        assert uploads.input_staging(dev, {"x": (buffer, TensorType((4,)))}) is None
        with pytest.raises(RuntimeError, match="C API"):
            device.unchecked_module(default_device().device, "@compute @workgroup_size(1) fn main() {}")
    finally:
        monkeypatch.undo()
        native.webgpu_c.cache_clear()
    assert native.wgpu_native() is _api and encoding.native_functions() is not None


def test_host_time_takes_the_step_apart_as_run_does():
    """benchmarks/host_time.py spells out `Executable.run` with a clock between its parts (it broke
    unnoticed once, when a step went to the queue in parts): on the small MLP step every part is
    timed, and the steps it runs so still train (the loss read back falls)."""
    import importlib.util
    import pathlib

    import meganeura as mn
    from meganeura.bench.workloads import STEPS

    path = pathlib.Path(__file__).parent.parent / "benchmarks" / "host_time.py"
    spec = importlib.util.spec_from_file_location("host_time", path)
    host_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_time)
    workload = STEPS["digits-mlp"].build(small=True)
    program = mn.compile(workload.model, loss=workload.loss, inputs=workload.inputs, optimizer=workload.optimizer)
    batch = workload.batch(np.random.default_rng(0))
    first = program.train_step(**batch)
    parts = host_time.step_parts(program, batch, 20)
    assert list(parts) == ["check inputs", "hypers", "upload", "submit", "record next", "wait for the loss"]
    assert all(us > 0 for us in parts.values())
    assert program.train_step(**batch) < first


@pytest.mark.gpu
def test_a_script_without_xdg_runtime_dir_prints_no_vulkan_complaint(tmp_path):
    """Run outside `make` (no XDG_RUNTIME_DIR), a script that makes the device writes nothing to
    stderr: the runtime gives Mesa's drivers a private folder instead of their error lines."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {key: value for key, value in os.environ.items() if key != "XDG_RUNTIME_DIR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))
    script = "import os; from meganeura.runtime import default_device as d; d(); print(os.environ['XDG_RUNTIME_DIR'])"
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "XDG_RUNTIME_DIR" not in run.stderr, run.stderr
    assert os.path.isdir(run.stdout.strip())
