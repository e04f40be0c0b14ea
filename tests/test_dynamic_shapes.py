"""Programs that take new input shapes (meganeura/shape_plans.py): a call at shapes the program was
not compiled for compiles a plan for them once, and every plan trains one model — parameters,
BatchNorm statistics, optimizer and gate states shared — so that a run alternating batch sizes is
the numpy interpreter's run of each step's own graph from one state, and each of its steps is the
step a program compiled for that shape alone takes from the same state."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from conftest import UPDATE_RTOL

import meganeura as mn
import meganeura.functional as F
from meganeura import checkpoint, nn, optim
from meganeura.compiler import StopExplain, explain_only
from meganeura.ir.interpret import interpret
from meganeura.shape_plans import ShapeLimitWarning

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(40)
C, H, W, CLASSES = 2, 3, 3, 3
SIZES = [8, 5, 8, 5, 5, 8]  # the batch sizes of the mixed runs


class Net(nn.Module):
    """BatchNorm2d (running statistics: module buffers) → flatten → Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(C)
        self.fc = nn.Linear(C * H * W, CLASSES)

    def forward(self, x):
        return self.fc(self.bn(x).flatten(1))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


SPEC = {"x": mn.f32[8, C, H, W], "y": mn.i32[8]}


def batch(size: int) -> dict[str, np.ndarray]:
    return {
        "x": RNG.normal(size=(size, C, H, W)).astype(np.float32),
        "y": RNG.integers(0, CLASSES, size).astype(np.int32),
    }


def training(seed: int = 0, optimizer=None, **options):
    mn.manual_seed(seed)
    return mn.compile(Net(), ce, SPEC, optimizer or optim.Adam(lr=5e-2), **options)


def plan_graph(program, feed):
    """The traced step of the plan that ran `feed`."""
    key = tuple(np.shape(feed[name]) for name in program.inputs)
    return program.plans.plans[key].compilation.traced.graph


def interpreted(program, feeds, params, states):
    """The run of `feeds` on the interpreter, each through its own shape's traced step, from
    `params` and `states` (updated in place): the losses and each step's outputs. Before update k
    the groups' hyper-parameter vectors get its values, as Program.write_hypers writes them."""
    losses, outputs = [], []
    optimizer = program.traced.optimizer
    for step, feed in enumerate(feeds, start=1):
        if optimizer is not None:
            states |= optimizer.hyper_values(step)
        result = interpret(plan_graph(program, feed), feed, params, {**states, **params})
        losses.append(float(result.outputs["loss"]))
        outputs.append(result.outputs)
        for name, value in result.updates.items():
            (params if name in params else states)[name] = value
    return losses, outputs


def initial_states(program) -> dict[str, np.ndarray]:
    return {**program.traced.initial_states, **program.traced.step_states}


def assert_moved_alike(got: dict, want: dict, start: dict) -> None:
    """Each tensor moved from `start` as the interpreter's did (conftest's measure)."""
    for name, value in got.items():
        moved = np.asarray(want[name], np.float64) - start[name]
        error = np.linalg.norm(value - start[name] - moved) / max(np.linalg.norm(moved), 1e-12)
        assert error <= UPDATE_RTOL, f"{name}: differs from the interpreter's by {error:.2e} of its move"


def test_alternating_batch_sizes_train_one_model_as_the_interpreter_does():
    program = training()
    feeds = [batch(size) for size in SIZES]
    start = program.state_dict()
    losses = [program.train_step(**feed) for feed in feeds]
    assert len(program.plans) == 2 and program.steps == len(SIZES)
    params, states = dict(start), initial_states(program)
    want, _ = interpreted(program, feeds, params, states)
    np.testing.assert_allclose(losses, want, rtol=1e-4, atol=1e-5)
    assert_moved_alike(program.state_dict(), params, start)  # BatchNorm's running statistics too
    assert program.state_dict()["bn.num_batches_tracked"] == len(SIZES)
    optimizer_state = program.optimizer_state_dict()
    assert optimizer_state["step"] == len(SIZES)  # one Adam step count: every step of every shape
    zeros = {name: np.zeros_like(value) for name, value in optimizer_state.items()}
    assert_moved_alike({k: v for k, v in optimizer_state.items() if k != "step"}, states, zeros)


def test_each_step_at_a_new_shape_is_the_step_of_a_program_compiled_for_it_alone():
    mixed = training(1)
    for index, size in enumerate(SIZES):
        if index == len(SIZES) - 1:  # written by the 8's plan, read by the 5's below
            mixed.compilation.optimizer.lr = 2e-2
        mixed.train_step(**batch(size))
    alone = mn.compile(Net(), ce, {"x": mn.f32[5, C, H, W], "y": mn.i32[5]}, optim.Adam(lr=2e-2), dynamic=False)
    alone.load_state_dict(mixed.state_dict())
    alone.load_optimizer_state_dict(mixed.optimizer_state_dict())
    feed = batch(5)
    assert mixed.train_step(**feed) == alone.train_step(**feed)
    for name, value in alone.state_dict().items():
        np.testing.assert_array_equal(mixed.state_dict()[name], value, err_msg=name)
    for name, value in alone.optimizer_state_dict().items():
        np.testing.assert_array_equal(mixed.optimizer_state_dict()[name], value, err_msg=name)


def test_accumulation_clipping_gradients_and_the_finiteness_gate_span_the_shapes():
    program = training(2, optim.SGD(lr=0.1, momentum=0.9), accumulate=2, clip_grad_norm=0.5, keep_gradients=True,
                       check_finite=True)  # fmt: skip
    feeds = [batch(size) for size in (8, 5, 5, 3, 8)]  # a cycle of 8 and 5, one of 5 and 3, half of one
    start, states = program.state_dict(), initial_states(program)
    params = dict(start)
    losses = []
    for feed in feeds:
        losses.append(program.train_step(**feed))
        _, outputs = interpreted(program, [feed], params, states)
        gradients = program.gradients()  # of the step just run, at its shape
        for name, value in gradients.items():
            np.testing.assert_allclose(value, outputs[0]["grad:" + name], rtol=1e-4, atol=1e-6, err_msg=name)
        if program.micro_step == 0:
            assert program.last_grad_norm == pytest.approx(float(outputs[0]["grad_norm"]), rel=1e-5)
    assert program.micro_step == 1 and len(program.plans) == 3
    assert_moved_alike(program.state_dict(), params, start)
    gate_state = checkpoint.step_state(program)
    np.testing.assert_allclose(gate_state["fc.weight.grad_accum"], states["fc.weight.grad_accum"], rtol=1e-4)
    assert gate_state["accumulate.micro_step"] == 1
    before = program.state_dict() | program.optimizer_state_dict() | gate_state
    bad = batch(4)  # a new shape whose first step meets a NaN: nothing changes
    bad["x"][1, 0, 0, 0] = np.nan
    with pytest.raises(mn.NonFiniteError, match="input 'x' has 1 non-finite value"):
        program.train_step(**bad)
    after = program.state_dict() | program.optimizer_state_dict() | checkpoint.step_state(program)
    for name, value in before.items():
        np.testing.assert_array_equal(after[name], value, err_msg=name)
    assert program.micro_step == 1 and program.steps == len(feeds)


def test_a_checkpoint_of_a_mixed_run_resumes_at_every_shape(tmp_path):
    path = tmp_path / "mixed.safetensors"
    first = [batch(size) for size in SIZES]
    rest = [batch(size) for size in (5, 8, 5)]
    whole = training(3, accumulate=2)
    for feed in first:
        whole.train_step(**feed)
    whole.save(path)
    expected = [whole.train_step(**feed) for feed in rest]
    resumed = training(4, accumulate=2)  # other weights, no plan but the declared one: the file restores all
    resumed.load(path)
    assert resumed.steps == len(SIZES) and len(resumed.plans) == 1
    assert [resumed.train_step(**feed) for feed in rest] == expected  # the 5's plan binds the loaded state
    for name, value in whole.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)
    for name, value in whole.optimizer_state_dict().items():
        np.testing.assert_array_equal(resumed.optimizer_state_dict()[name], value, err_msg=name)


def test_programs_compiled_separately_share_the_weights_but_not_the_optimizer():
    mn.manual_seed(5)
    model = Net()
    eights = mn.compile(model, ce, SPEC, optim.Adam(lr=1e-2))
    fives = mn.compile(model, ce, {"x": mn.f32[5, C, H, W], "y": mn.i32[5]}, optim.Adam(lr=1e-2))
    eights.train_step(**batch(8))
    eights.train_step(**batch(8))
    fives.train_step(**batch(5))
    assert eights.optimizer_state_dict()["step"] == 2 and fives.optimizer_state_dict()["step"] == 1
    for name, value in eights.state_dict().items():
        np.testing.assert_array_equal(fives.state_dict()[name], value, err_msg=name)


def test_without_dynamic_shapes_another_shape_is_refused_as_before():
    program = training(6, dynamic=False)
    hint = (
        r"input 'x': expected shape \[8, 2, 3, 3\], got \[5, 2, 3, 3\]; a compiled step has static shapes: for "
        r"batches of 5, compile another program with x: mn.f32\[5, 2, 3, 3\] \(it shares the model's weights\)$"
    )
    with pytest.raises(ValueError, match=hint):
        program.train_step(**batch(5))
    assert len(program.plans) == 1 and program.steps == 0 and not program.dynamic
    assert "dynamic=False" in str(program.report()) and program.report().to_json()["max_shapes"] is None


def test_other_ranks_dtypes_and_empty_inputs_are_refused_before_compiling():
    program = training(7)
    x, y = batch(5).values()
    cases = [
        (ValueError, r"'x': expected shape \[8, 2, 3, 3\], got \[1, 5, 2, 3, 3\]$", {"x": x[None], "y": y}),
        (TypeError, "'y': expected integer data", {"x": x, "y": y.astype(np.float32)}),
        (TypeError, "'x': expected floating-point data", {"x": x.astype(np.int32), "y": y}),
        (ValueError, r"'x': shape \[0, 2, 3, 3\] has an empty dimension", {"x": x[:0], "y": y[:0]}),
    ]
    for error, message, arrays in cases:
        with pytest.raises(error, match=message):
            program.train_step(**arrays)
    assert len(program.plans) == 1 and program.steps == 0


def test_a_new_shape_the_model_cannot_take_raises_its_trace_error_and_changes_nothing():
    program = training(8, optim.SGD(lr=0.1, momentum=0.9))
    program.train_step(**batch(8))
    before = program.state_dict() | program.optimizer_state_dict()
    x, y = batch(5).values()
    with pytest.raises(
        ValueError,
        match=r"test_dynamic_shapes.py:\d+: .*\n\(while compiling the program for the "
        r"input shapes x: \[5, 2, 3, 4\], y: \[5\]; it was compiled for x: \[8, 2, 3, 3\], y: \[8\]\)",
    ):
        program.train_step(x=np.concatenate([x, x[..., :1]], axis=-1), y=y)  # fmt: skip
    # SGD's momentum set to 0 after compile: a new shape's trace would have no momentum buffers.
    program.compilation.optimizer.momentum = 0.0
    with pytest.raises(RuntimeError, match=r"other parameters, states or outputs .*momentum_buffer"):
        program.train_step(x=x, y=y)
    after = program.state_dict() | program.optimizer_state_dict()
    assert all(np.array_equal(after[name], value) for name, value in before.items())
    assert len(program.plans) == 1
    assert program.compilation.optimizer.structure == [
        {"momentum_buffer": True, "nesterov": False}
    ]  # kept: the step still runs
    program.train_step(**batch(8))


def test_a_new_shape_is_traced_in_the_modes_the_program_was_compiled_in():
    program = training(9)
    model = program.compilation.model
    with pytest.warns(UserWarning, match="keep the mode they were compiled in"):
        model.eval()
    program.train_step(**batch(5))  # training mode: batch statistics, the running ones updated
    assert program.state_dict()["bn.num_batches_tracked"] == 1
    assert not model.training and not model.bn.training


def test_at_most_max_shapes_plans_are_kept_the_least_recently_used_evicted_with_a_warning():
    mn.manual_seed(10)
    model = nn.Linear(3, 2)
    program = mn.compile(model, inputs={"x": mn.f32[4, 3]}, max_shapes=3)
    weight, bias = model.weight.numpy(), model.bias.numpy()
    xs = {n: RNG.normal(size=(n, 3)).astype(np.float32) for n in (1, 2, 3, 4, 5)}

    def run(n: int) -> None:
        np.testing.assert_allclose(program(x=xs[n]), xs[n] @ weight.T + bias, rtol=1e-5, atol=1e-6)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for n in (4, 1, 2, 1, 4):  # three shapes: no warning
            run(n)
    with pytest.warns(ShapeLimitWarning, match=r"max_shapes=3 .*compiling x: \[3, 3\] drops .*x: \[2, 3\]") as caught:
        run(3)  # 2 is the least recently used (4, the declared shape, is never evicted)
    assert caught[0].filename == __file__  # the warning points at the user's line
    assert program.report().shapes == [{"x": (4, 3)}, {"x": (1, 3)}, {"x": (3, 3)}]
    with pytest.warns(ShapeLimitWarning, match=r"compiling x: \[2, 3\] drops .*x: \[1, 3\]"):
        run(2)
    assert program.plans.evicted == 2 and len(program.plans) == 3
    text = str(program.report())
    assert "input shapes compiled (3, at most 3; this report is of the first): x: [4, 3]; x: [3, 3]; x: [2, 3]" in text
    with pytest.raises(ValueError, match="max_shapes must be a whole number >= 2"):
        mn.compile(model, inputs={"x": mn.f32[4, 3]}, max_shapes=1)
    with pytest.raises(TypeError, match="dynamic must be True or False"):
        mn.compile(model, inputs={"x": mn.f32[4, 3]}, dynamic="yes")


def test_a_profile_at_a_new_shape_times_its_plan_and_trains():
    program = training(11)
    if not program.executable.device.has_timestamps:
        pytest.skip("the adapter has no timestamp queries")
    feed = batch(5)
    profile = program.profile(warmup=1, **feed)
    plan = program.plans.plans[((5, C, H, W), (5,))]
    assert [k.node for k in profile.kernels] == [spec.node for spec in plan.executable.plan.schedule]
    assert program.steps == 2 and program.optimizer_state_dict()["step"] == 2


def test_explain_mode_stops_at_a_new_shape_without_compiling_it():
    with explain_only() as programs:
        program = training(12)
        with pytest.raises(StopExplain):
            program.train_step(**batch(5))
    assert programs == [program] and len(program.plans) == 1
