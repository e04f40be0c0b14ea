"""The optimizers against PyTorch's float32 updates, kept in tests/reference/optimizers/*.npz
(written by scripts/make_optimizer_references.py, which needs torch; these tests do not).

Each file applies one torch.optim optimizer (its single-tensor code) to three parameters of
ragged shapes with given gradients for 6 steps, some from a loaded state 1000 updates in, some
with hyper-parameters changed between steps. Here a
model whose loss is Σ sum(p·g) has exactly those gradients (its inputs), so the step is the
optimizer alone. Compared after every step: the update p_k − p_{k−1} of each parameter, within
UPDATE_RTOL of torch's relative to its norm once each element is allowed the rounding of
p + update to f32 (one ulp of the new value: two updates equal to 1e-7 may still round to
neighbouring floats, and a parameter of 0.2 moved by 1e-3 shows that as 1e-5 of the update), and
at the end every state tensor element by element.
The bias corrections and the other scalars torch computes in Python double come from the host
(optim/optimizers.py `hyper_fields`), so on lavapipe they are torch's; the rest is f32 rounding:
torch's CPU kernels contract some operations into FMAs and take √ to within an ulp (MKL).

Also here: the same steps with compile(accumulate=2) (each gradient given twice), with a refused
step (check_finite: it does not count), and resumed from a checkpoint; and ReduceLROnPlateau's
learning rates against torch's, bit for bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import torch_script

import meganeura as mn
from meganeura import nn, optim
from meganeura.optim import lr_scheduler

REFERENCE_DIR = Path(__file__).resolve().parent / "reference" / "optimizers"
PLATEAU = "reduce_lr_on_plateau"
SCENARIOS = sorted(path.stem for path in REFERENCE_DIR.glob("*.npz") if path.stem != PLATEAU)
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_optimizer_references.py"

# ‖Δours − Δtorch‖ / ‖Δtorch‖ per parameter and step, beyond one ulp of the new value per element
# (module docstring). On lavapipe: 0 in most steps, at most ~1e-7; without the ulp allowance at
# most 1e-6 (single flipped roundings of p + update). A bias correction computed on the device
# (1 − β^t by WGSL's pow, 1 − β in f32) is 6e-5 off at the default betas and 0.1% at
# β₂ = 0.99999: what this bound is there to catch.
UPDATE_RTOL = 1e-6
STATE_RTOL = 1e-6  # each state element, relative to the largest of its tensor


def load(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(REFERENCE_DIR / f"{name}.npz") as data:
        arrays = {key: data[key] for key in data.files}
    return json.loads(str(arrays.pop("meta"))), arrays


def under(arrays: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {key.removeprefix(prefix): value for key, value in arrays.items() if key.startswith(prefix)}


class Tensors(nn.Module):
    """The scenario's parameters, and nothing else."""

    def __init__(self, shapes: dict[str, list[int]]) -> None:
        super().__init__()
        for name, shape in shapes.items():
            setattr(self, name, nn.Parameter(np.zeros(shape, np.float32)))


def gradients_as_given(model, **grads):
    """Σ sum(p·g): its gradient with respect to each p is the input g, exactly."""
    total = None
    for name, g in grads.items():
        term = (getattr(model, name.removeprefix("g_")) * g).sum()
        total = term if total is None else total + term
    return total


def optimizer_of(meta: dict, model: Tensors, fused: bool) -> optim.Optimizer:
    hyper = {key: tuple(value) if isinstance(value, list) else value for key, value in meta["hyper"].items()}
    if meta["groups"] is None:
        params = model.parameters()
    else:
        params = [
            {
                **{k: tuple(v) if isinstance(v, list) else v for k, v in group.items()},
                "params": [getattr(model, n) for n in group["params"]],
            }
            for group in meta["groups"]
        ]
    return getattr(optim, meta["optimizer"])(params, **hyper, fused=fused)


def program_of(meta: dict, arrays: dict[str, np.ndarray], fused: bool = True, **options):
    """The scenario's program, at the file's initial values (and loaded state)."""
    model = Tensors(meta["shapes"])
    specs = {f"g_{name}": mn.f32[tuple(shape)] for name, shape in meta["shapes"].items()}
    opt = optimizer_of(meta, model, fused)
    program = mn.compile(model, gradients_as_given, specs, opt, **options)
    program.load_state_dict(under(arrays, "init/"))
    start = under(arrays, "start/")
    if start:
        state = program.optimizer_state_dict()
        program.load_optimizer_state_dict({name: start[name] for name in state})
        assert program.optimizer_steps == meta["start"]
    return program, opt


def feed(arrays: dict[str, np.ndarray], step: int) -> dict[str, np.ndarray]:
    return {f"g_{name}": value for name, value in under(arrays, f"step{step}/grad/").items()}


def update_errors(before: dict, after: dict, arrays: dict, step: int) -> dict[str, float]:
    """‖Δours − Δtorch‖ / ‖Δtorch‖ of each parameter's update in step `step`, each element's
    difference less the one ulp that rounding p + update may put between two equal updates."""
    theirs_before = under(arrays, "init/") if step == 0 else under(arrays, f"step{step - 1}/param/")
    theirs_after = under(arrays, f"step{step}/param/")
    errors = {}
    for name, value in theirs_after.items():
        ours = after[name].astype(np.float64) - before[name]
        theirs = value.astype(np.float64) - theirs_before[name]
        rounding = np.spacing(np.maximum(np.abs(value), np.abs(after[name]))).astype(np.float64)
        beyond = np.maximum(np.abs(ours - theirs) - rounding, 0.0)
        errors[name] = float(np.linalg.norm(beyond) / np.linalg.norm(theirs))
    return errors


def state_problems(program, arrays: dict[str, np.ndarray]) -> list[str]:
    """Every state tensor against torch's after the last step (the step count exactly)."""
    expected = under(arrays, "state/")
    ours = program.optimizer_state_dict()
    problems = [f"state {name} missing" for name in ours.keys() - expected.keys()]
    for name, value in ours.items():
        want = expected[name].astype(np.float64)
        error = np.abs(value - want).max() / max(np.abs(want).max(), 1e-30)
        if name == "step" and value != want or not error <= STATE_RTOL:
            problems.append(f"state {name}: {error:.2e} of its largest element")
    return problems


def apply_changes(opt: optim.Optimizer, meta: dict, step: int) -> None:
    """The scenario's hyper-parameter changes before step `step` (0-based), in every group, as
    the script applies them to torch's optimizer."""
    for key, value in meta.get("changes", {}).get(str(step), {}).items():
        for group in opt.param_groups:
            group[key] = tuple(value) if isinstance(value, list) else value


def run_and_compare(program, meta, arrays, feeds_of_step, opt=None) -> list[str]:
    problems = []
    for step in range(meta["steps"]):
        if opt is not None:
            apply_changes(opt, meta, step)
        before = program.state_dict()
        for fed in feeds_of_step(step):
            program.train_step(**fed)
        errors = update_errors(before, program.state_dict(), arrays, step)
        problems += [f"step {step} {name}: {e:.2e}" for name, e in errors.items() if not e <= UPDATE_RTOL]
    return problems + state_problems(program, arrays)


@pytest.fixture(scope="module", params=SCENARIOS)
def scenario(request):
    return load(request.param)


@pytest.mark.gpu
def test_fused_updates_match_pytorch(scenario):
    meta, arrays = scenario
    program, opt = program_of(meta, arrays)
    problems = run_and_compare(program, meta, arrays, lambda step: [feed(arrays, step)], opt)
    assert not problems, f"{meta['scenario']} differs from torch's float32 run: " + "; ".join(problems)


SINGLE_TENSOR = [
    "adamw_amsgrad", "adam_from_step_1000", "sgd_nesterov", "rmsprop_centered_momentum", "adagrad_decay",
    "adamax_groups", "nadam_groups_changing_beta1", "nadam_decoupled", "radam_decoupled_groups",
    "radam_from_step_1000", "adadelta_groups",
]  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("name", SINGLE_TENSOR)
def test_single_tensor_updates_match_pytorch(name):
    meta, arrays = load(name)
    program, opt = program_of(meta, arrays, fused=False)
    problems = run_and_compare(program, meta, arrays, lambda step: [feed(arrays, step)], opt)
    assert not problems, f"{name} (fused=False) differs from torch's float32 run: " + "; ".join(problems)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["adamw_amsgrad_from_step_1000_betas_near_one", "sgd_dampening"])
def test_accumulated_steps_count_as_one_update(name):
    """compile(accumulate=2) fed each gradient twice: its mean is the gradient exactly, and each
    pair is one update, with that update's bias corrections (and SGD's first-step buffer)."""
    meta, arrays = load(name)
    program, _ = program_of(meta, arrays, accumulate=2)
    problems = run_and_compare(program, meta, arrays, lambda step: [feed(arrays, step)] * 2)
    assert not problems, "; ".join(problems)
    assert program.optimizer_steps == meta["start"] + meta["steps"] and program.steps == 2 * meta["steps"]


@pytest.mark.gpu
def test_a_refused_step_does_not_count():
    """compile(check_finite=True): a step with a NaN gradient changes nothing and is not an update,
    so the next step's bias corrections are still the next update's."""
    meta, arrays = load("adam_betas_near_one")
    program, _ = program_of(meta, arrays, check_finite=True)
    bad = {name: np.full_like(value, np.nan) for name, value in feed(arrays, 0).items()}

    def feeds(step):
        if step in (0, 3):
            with pytest.raises(mn.NonFiniteError):
                program.train_step(**bad)
        return [feed(arrays, step)]

    problems = run_and_compare(program, meta, arrays, feeds)
    assert not problems, "; ".join(problems)
    assert program.optimizer_steps == meta["steps"]


@pytest.mark.gpu
def test_a_checkpoint_resumes_the_update_count(tmp_path):
    """Saved after 3 updates and loaded into a fresh program, the run goes on with the bias
    corrections of update 4 on."""
    pytest.importorskip("safetensors")
    meta, arrays = load("adam_from_step_1000")
    first, _ = program_of(meta, arrays)
    for step in range(3):
        first.train_step(**feed(arrays, step))
    path = tmp_path / "three.safetensors"
    first.save(path)
    resumed, _ = program_of(meta, arrays)
    resumed.load(path)
    assert resumed.optimizer_steps == meta["start"] + 3
    problems = []
    for step in range(3, meta["steps"]):
        before = resumed.state_dict()
        resumed.train_step(**feed(arrays, step))
        errors = update_errors(before, resumed.state_dict(), arrays, step)
        problems += [f"step {step} {name}: {e:.2e}" for name, e in errors.items() if not e <= UPDATE_RTOL]
    assert not problems + state_problems(resumed, arrays), "; ".join(problems)


def test_the_interpreter_follows_pytorch(scenario):
    """The traced graph on the numpy interpreter, with the vectors the Program would write before
    each step: the optimizer's graph is torch's (the device's kernels aside)."""
    from meganeura.ir.interpret import interpret

    meta, arrays = scenario
    with mn.compiler.explain_only():
        program, opt = program_of_traced(meta, arrays)
    params = under(arrays, "init/")
    states = dict(program.traced.initial_states)
    start = under(arrays, "start/")
    states |= {name: start[name].reshape(states[name].shape) for name in start if name in states}
    if start:
        opt.load_host_state(start, meta["start"])  # (NAdam's mu_product: the Program's load does this)
    problems = []
    for step in range(meta["steps"]):
        apply_changes(opt, meta, step)
        states |= opt.hyper_values(meta["start"] + step + 1)
        result = interpret(program.graph, feed(arrays, step), params, states)
        opt.applied(meta["start"] + step + 1)  # (as Program.step_done)
        after = {name: result.updates[name] for name in params}
        errors = update_errors(params, after, arrays, step)
        problems += [f"step {step} {name}: {e:.2e}" for name, e in errors.items() if not e <= UPDATE_RTOL]
        params = after
        states |= {name: value for name, value in result.updates.items() if name in states}
    assert not problems, "; ".join(problems)
    host = opt.host_state(meta["start"] + meta["steps"])
    assert {name: float(value) for name, value in host.items()} == {
        name: float(value) for name, value in under(arrays, "state/").items() if name in host
    }  # NAdam's mu_product: torch's float32 product, bit for bit


def program_of_traced(meta: dict, arrays: dict[str, np.ndarray]):
    """The scenario's program traced in explain mode (nothing on a device)."""
    model = Tensors(meta["shapes"])
    specs = {f"g_{name}": mn.f32[tuple(shape)] for name, shape in meta["shapes"].items()}
    opt = optimizer_of(meta, model, True)
    return mn.compile(model, gradients_as_given, specs, opt), opt


def test_the_files_cover_the_options():
    """Every optimizer and option meganeura has is in some fixture, and one starts 1000 updates in."""
    metas = [load(name)[0] for name in SCENARIOS]
    seen = {(m["optimizer"], key) for m in metas for key in m["hyper"]}
    seen |= {(m["optimizer"], key) for m in metas for group in m["groups"] or () for key in group if key != "params"}
    expected = {
        ("Adam", "amsgrad"), ("AdamW", "amsgrad"), ("Adam", "betas"), ("Adam", "weight_decay"),
        ("AdamW", "weight_decay"), ("SGD", "nesterov"), ("SGD", "dampening"), ("RMSprop", "centered"),
        ("RMSprop", "momentum"), ("RMSprop", "alpha"), ("Adagrad", "lr_decay"),
        ("Adagrad", "initial_accumulator_value"), ("Adagrad", "weight_decay"), ("Adamax", "betas"),
        ("Adamax", "eps"), ("Adamax", "weight_decay"), ("NAdam", "betas"), ("NAdam", "weight_decay"),
        ("NAdam", "momentum_decay"), ("NAdam", "decoupled_weight_decay"), ("RAdam", "betas"), ("RAdam", "weight_decay"),
        ("RAdam", "decoupled_weight_decay"), ("Adadelta", "rho"), ("Adadelta", "eps"), ("Adadelta", "weight_decay"),
    }  # fmt: skip
    assert expected <= seen
    assert any(m["start"] == 1000 for m in metas)
    assert any(min(m["hyper"].get("betas", [0, 0])) >= 0.999 for m in metas)  # betas close to 1


# ---------------------------------------------------------------------------------------------
# ReduceLROnPlateau


def test_reduce_lr_on_plateau_gives_torchs_rates_bit_for_bit():
    meta, arrays = load(PLATEAU)
    for index, case in enumerate(meta["cases"]):
        model = nn.Linear(2, 1)
        opt = optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.03}], lr=0.1)
        scheduler = lr_scheduler.ReduceLROnPlateau(opt, **case)
        lrs = [scheduler.get_last_lr()]
        for metric in arrays[f"case{index}/metrics"]:
            scheduler.step(float(metric))
            lrs.append(scheduler.get_last_lr())
        expected = arrays[f"case{index}/lrs"]
        assert np.array_equal(np.array(lrs), expected), (case, np.flatnonzero((np.array(lrs) != expected).any(1)))
        assert len({tuple(lr) for lr in lrs}) > 2, case  # the rates moved
        assert [g["lr"] for g in opt.param_groups] == lrs[-1]


def test_reduce_lr_on_plateau_state_resumes_through_json():
    meta, arrays = load(PLATEAU)
    case, metrics = meta["cases"][2], arrays["case2/metrics"]

    def made():
        model = nn.Linear(2, 1)
        opt = optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.03}], lr=0.1)
        return opt, lr_scheduler.ReduceLROnPlateau(opt, **case)

    opt, first = made()
    for metric in metrics[:25]:
        first.step(float(metric))
    saved = json.loads(json.dumps({"groups": opt.hyper_state(), "scheduler": first.state_dict()}))
    assert set(saved["scheduler"]) == {
        "factor", "min_lrs", "default_min_lr", "patience", "cooldown", "cooldown_counter", "mode", "threshold",
        "threshold_mode", "best", "num_bad_epochs", "mode_worse", "eps", "last_epoch", "_last_lr",
    }  # torch's keys  # fmt: skip
    fresh_opt, resumed = made()
    fresh_opt.load_hyper_state(saved["groups"])
    resumed.load_state_dict(saved["scheduler"])
    for metric in metrics[25:]:
        first.step(float(metric))
        resumed.step(float(metric))
        assert resumed.get_last_lr() == first.get_last_lr()
    assert resumed.get_last_lr() == arrays["case2/lrs"][-1].tolist()


def test_reduce_lr_on_plateau_errors():
    opt = optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="Factor should be < 1.0"):
        lr_scheduler.ReduceLROnPlateau(opt, factor=1.0)
    with pytest.raises(ValueError, match="mode avg is unknown"):
        lr_scheduler.ReduceLROnPlateau(opt, mode="avg")
    with pytest.raises(ValueError, match="threshold mode"):
        lr_scheduler.ReduceLROnPlateau(opt, threshold_mode="pct")
    with pytest.raises(ValueError, match="expected 1 min_lrs, got 2"):
        lr_scheduler.ReduceLROnPlateau(opt, min_lr=[0.1, 0.2])
    scheduler = lr_scheduler.ReduceLROnPlateau(opt)
    assert opt.scheduler is scheduler
    with pytest.raises(TypeError):
        scheduler.step()  # the metric is required, as in torch


@pytest.mark.parametrize("name", [*SCENARIOS, PLATEAU])
def test_reference_file_is_current(name):
    """Regenerated with torch in memory, the fixture gives the stored file (needs torch)."""
    script = torch_script(SCRIPT)
    assert sorted(script.SCENARIOS) == SCENARIOS
    fresh = script.generate_plateau() if name == PLATEAU else script.generate(name)
    meta, stored = load(name)
    fresh_meta = json.loads(str(fresh.pop("meta")))
    fresh_meta.pop("torch"), meta.pop("torch")
    assert fresh_meta == meta and sorted(fresh) == sorted(stored)
    for key, value in stored.items():
        if key.startswith(("init/", "start/", "case")) or "/grad/" in key:  # numpy's, and Python's rates
            np.testing.assert_array_equal(fresh[key], value, err_msg=key)
        else:  # torch's float32 kernels round by the CPU (its vector width, MKL's √): to an ulp or two
            np.testing.assert_allclose(fresh[key], value, rtol=1e-6, atol=1e-6 * np.abs(value).max(), err_msg=key)
