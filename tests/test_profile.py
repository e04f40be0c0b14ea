"""The GPU profiler (meganeura/runtime/profile.py): timestamps around every dispatch, the table by
kernel kind, the Chrome trace, MEGANEURA_TRACE and `python -m meganeura profile` — on lavapipe,
which has the timestamp-query feature."""

from __future__ import annotations

import json
import textwrap
import time

import numpy as np
import pytest
from conftest import MLP, ce_loss, emit, typed_leaf

import meganeura as mn
from meganeura import compiler, optim
from meganeura.__main__ import main
from meganeura.ir.graph import Graph
from meganeura.passes import compile_step
from meganeura.rewrite.cost import node_cost
from meganeura.runtime import Executable, default_device

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(0)


def mlp_program():
    model = MLP(n_in=6, hidden=5, n_out=3)
    inputs = {"x": mn.f32[4, 6], "y": mn.i32[4]}
    return mn.compile(model, loss=ce_loss, inputs=inputs, optimizer=optim.Adam(lr=1e-2))


def batch():
    return {"x": RNG.normal(size=(4, 6)).astype(np.float32), "y": np.array([0, 1, 2, 1], np.int32)}


def test_a_profiled_step_times_every_dispatch_and_computes_what_a_step_computes():
    mn.manual_seed(3)
    profiled = mlp_program()
    mn.manual_seed(3)
    plain = mlp_program()
    feed = batch()
    profile = profiled.profile(warmup=2, **feed)
    losses = [plain.train_step(**feed) for _ in range(3)]
    for name, value in plain.state_dict().items():  # three real steps on both: the same parameters
        np.testing.assert_array_equal(profiled.state_dict()[name], value, err_msg=name)
    assert np.isfinite(losses).all()
    kernels = profiled.compiled.kernels
    step = profiled.compiled.graph  # the fused graph, its optimizer updates grouped (multi_adam_update)
    assert [k.node for k in profile.kernels] == [spec.node for spec in profiled.executable.plan.schedule]
    assert len(profile.kernels) == len(kernels)
    assert {k.kind for k in profile.kernels} == {step[spec.node].op for spec in kernels}
    assert all(k.ns > 0 for k in profile.kernels)
    starts = [k.start_ns for k in profile.kernels]
    assert starts[0] == 0 and starts == sorted(starts)  # one queue: kernels run one after another
    for k in profile.kernels:
        cost = node_cost(step, k.node)
        assert (k.bytes, k.flops) == (cost.bytes, cost.flops)
        assert any("test_profile.py" in s or "conftest.py" in s for s in k.sources), k
    rows = profile.by_kind()
    assert sum(r.count for r in rows) == len(kernels) and sum(r.ns for r in rows) == profile.total_ns
    assert abs(sum(r.share for r in rows) - 1.0) < 1e-9 and rows == sorted(rows, key=lambda r: -r.ns)
    labels = profile.by_label()  # one row per distinct kernel, the same total
    assert {r.kind for r in labels} == {k.label for k in profile.kernels}
    assert sum(r.ns for r in labels) == profile.total_ns and labels == sorted(labels, key=lambda r: -r.ns)
    for row in labels:
        same = [k for k in profile.kernels if k.label == row.kind]
        assert (row.count, row.ns, row.flops) == (len(same), sum(k.ns for k in same), sum(k.flops for k in same))
    matmul = next(r for r in rows if r.kind == "fused_matmul")
    assert matmul.tflop_per_s == pytest.approx(matmul.flops / matmul.ns / 1000)
    text = str(profile)
    assert "fused_matmul" in text and "slowest" in text and "ms in" in text
    assert profile.step_ns > 0 and f"{profile.step_ns / 1e6:.3f} ms as one pass" in text  # the last warm-up step


def test_a_timed_run_is_a_step_whose_one_pass_gpu_time_is_within_its_wall_time():
    """Executable.timed_run: the step's outputs as `run` gives them, and its one compute pass's GPU
    time, which lies within the wall time of the call (which waits for the step's results)."""
    mn.manual_seed(3)
    timed = mlp_program()
    mn.manual_seed(3)
    plain = mlp_program()
    feed = batch()
    timed.train_step(**feed)  # a step recorded ahead, which timed_run must not submit untimed
    timed.write_hypers(timed.executable)  # update 2's hyper-parameters (Adam's bias corrections), as a step's
    started = time.perf_counter_ns()
    out, ns = timed.executable.timed_run(timed.check_inputs(feed), timed.step_reads)
    wall = time.perf_counter_ns() - started
    timed.step_done(out)
    losses = [plain.train_step(**feed) for _ in range(2)]
    assert float(out["loss"].reshape(())) == losses[1] and 0 < ns <= wall
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(timed.state_dict()[name], value, err_msg=name)


def test_an_inference_program_profiles_too():
    model = MLP(n_in=6, hidden=5, n_out=3)
    predict = mn.compile(model, inputs={"x": mn.f32[4, 6]})
    x = batch()["x"]
    profile = predict.profile(warmup=1, x=x)
    assert [k.node for k in profile.kernels] == [spec.node for spec in predict.executable.plan.schedule]
    assert predict.runs == 2 and np.isfinite(predict(x=x)).all()


def test_the_chrome_trace_has_one_complete_event_per_kernel(tmp_path):
    program = mlp_program()
    profile = program.profile(warmup=0, **batch())
    path = tmp_path / "trace.json"
    profile.write_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(profile.kernels)
    for event, kernel in zip(events, profile.kernels, strict=True):
        assert event["name"] == kernel.label and event["cat"] == kernel.kind
        assert event["ts"] == kernel.start_ns / 1000 and event["dur"] == kernel.ns / 1000 > 0
        assert event["args"]["sources"] == list(kernel.sources)


def test_a_step_of_more_dispatches_than_a_query_set_holds():
    # 2,100 kernels: two query sets (2,048 dispatches each at most)
    graph = Graph()
    value = typed_leaf(graph, "input", "x", (3,))
    for _ in range(2100):
        value = emit(graph, "neg", [value])
    graph.outputs["out"] = value
    executable = Executable(compile_step(graph, default_device().target), default_device(), {}, {})
    x = np.arange(3, dtype=np.float32)
    out, profile = executable.profile({"x": x}, read=("out",))
    np.testing.assert_array_equal(out["out"], x)  # an even number of negations
    assert len(profile.kernels) == 2100 and all(k.ns > 0 for k in profile.kernels)
    starts = [k.start_ns for k in profile.kernels]
    assert starts == sorted(starts) and starts[2048] > starts[2047]


def product_executable() -> Executable:
    graph = Graph()
    a, b = typed_leaf(graph, "input", "a", (7, 5)), typed_leaf(graph, "input", "b", (5, 3))
    graph.outputs["c"] = emit(graph, "matmul", [a, b])
    return Executable(compile_step(graph, default_device().target), default_device(), {}, {})


def test_repeated_runs_time_the_kernels_back_to_back_after_one_upload(monkeypatch):
    """Executable.repeated_ns (how `bench gemm` times our products): one upload, then the step's
    dispatches `count` times in one pass; its figure is a run's mean GPU time, within the call's
    wall time; the outputs stay the product; a count below 1 is refused."""
    executable = product_executable()
    inputs = {"a": RNG.normal(size=(7, 5)).astype(np.float32), "b": RNG.normal(size=(5, 3)).astype(np.float32)}
    uploads, encoded = [], []
    upload, record = Executable.upload, Executable.encode_dispatches
    monkeypatch.setattr(Executable, "upload", lambda self, *args: uploads.append(1) or upload(self, *args))
    counted = staticmethod(lambda compute, dispatches: encoded.append(len(dispatches)) or record(compute, dispatches))
    monkeypatch.setattr(Executable, "encode_dispatches", counted)
    commands = executable.repeated_commands(4)
    assert encoded == [len(executable.dispatches)] * 4 and uploads == []
    executable.device.queue.submit([commands])
    started = time.perf_counter_ns()
    ns = executable.repeated_ns(inputs, 6)
    wall = time.perf_counter_ns() - started
    assert uploads == [1] and 0 < 6 * ns <= wall
    np.testing.assert_allclose(executable.run(inputs, ("c",))["c"], inputs["a"] @ inputs["b"], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="count of at least 1, got 0"):
        executable.repeated_ns(inputs, 0)


def test_heat_uploads_once_then_doubles_its_command_buffers_until_each_is_long(monkeypatch):
    """Executable.heat keeps the GPU busy without waiting on the host: GPU clocks fall while it waits
    (an H200 ran a 4096³ product at a third of its speed after a heat of whole runs, each behind its
    upload). One `run`, then command buffers of the dispatches repeated 1, 2, 4, … times, doubling
    while a buffer takes under HEAT_BUFFER_SECONDS; the results stay right."""
    from meganeura.runtime import executable as runtime

    program = product_executable()
    inputs = {"a": RNG.normal(size=(7, 5)).astype(np.float32), "b": RNG.normal(size=(5, 3)).astype(np.float32)}
    runs, counts = [], []
    run, repeated = Executable.run, Executable.repeated_commands
    monkeypatch.setattr(Executable, "run", lambda self, *args: runs.append(1) or run(self, *args))
    monkeypatch.setattr(Executable, "repeated_commands", lambda self, n, *a: counts.append(n) or repeated(self, n, *a))
    monkeypatch.setattr(runtime, "HEAT_BUFFER_SECONDS", 10.0)  # always short: it doubles every time
    program.heat(inputs, 0.2)
    assert runs == [1] and len(counts) >= 2 and counts == [2**i for i in range(len(counts))]
    counts.clear()
    monkeypatch.setattr(runtime, "HEAT_BUFFER_SECONDS", 0.0)  # always long enough: it stays at 1
    program.heat(inputs, 0.05)
    assert set(counts) == {1}
    np.testing.assert_allclose(program.run(inputs, ("c",))["c"], inputs["a"] @ inputs["b"], rtol=1e-5, atol=1e-6)


def test_without_timestamps_profiling_says_why(monkeypatch):
    program = mlp_program()
    monkeypatch.setattr(program.executable.device, "has_timestamps", False)
    with pytest.raises(RuntimeError, match="timestamp-query"):
        program.profile(warmup=0, **batch())


def test_meganeura_trace_on_an_adapter_without_timestamps_warns_and_trains_on(tmp_path, monkeypatch, capsys):
    path = tmp_path / "trace.json"
    monkeypatch.setenv("MEGANEURA_TRACE", str(path))
    monkeypatch.setattr(compiler, "_TRACED", [])
    program = mlp_program()
    monkeypatch.setattr(program.executable.device, "has_timestamps", False)
    losses = [program.train_step(**batch()) for _ in range(compiler.TRACE_AFTER + 2)]
    assert np.isfinite(losses).all() and not path.exists()
    assert "has no timestamp queries" in capsys.readouterr().err


def test_meganeura_trace_profiles_the_fourth_step_of_the_first_program_once(tmp_path, monkeypatch, capsys):
    path = tmp_path / "trace.json"
    monkeypatch.setenv("MEGANEURA_TRACE", str(path))
    monkeypatch.setattr(compiler, "_TRACED", [])
    program = mlp_program()
    feed = batch()
    for _ in range(compiler.TRACE_AFTER):
        program.train_step(**feed)
    assert not path.exists()
    program.train_step(**feed)
    assert path.exists() and compiler._TRACED == [str(path)]
    assert "wrote the Chrome trace of step 4" in capsys.readouterr().err
    path.unlink()
    for _ in range(5):
        program.train_step(**feed)
    mlp_program().train_step(**feed)
    assert not path.exists()  # once per process


def test_cli_profile_runs_a_script_and_writes_its_trace(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(compiler, "_TRACED", [])
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import numpy as np
            import meganeura as mn
            import meganeura.functional as F
            from meganeura import nn, optim

            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            program = mn.compile(model, loss=lambda m, x, y: F.cross_entropy(m(x), y),
                                 inputs={"x": mn.f32[5, 4], "y": mn.i32[5]}, optimizer=optim.SGD(lr=0.1))
            x, y = np.ones((5, 4), np.float32), np.zeros(5, np.int32)
            for _ in range(int(sys.argv[1])):
                program.train_step(x=x, y=y)
            """
        )
    )
    trace = tmp_path / "out.json"
    assert main(["profile", "--trace", str(trace), str(script), "5"]) == 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert "GPU time of one step" in capsys.readouterr().err
    monkeypatch.setattr(compiler, "_TRACED", [])
    assert main(["profile", "--trace", str(tmp_path / "none.json"), str(script), "2"]) == 1
    assert "no program ran 4 steps" in capsys.readouterr().err
