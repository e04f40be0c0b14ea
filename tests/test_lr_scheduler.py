"""meganeura.optim.lr_scheduler (issue 11 item 1): PyTorch's schedulers on the live optimizer.

Against PyTorch's closed-form formulas (no torch needed), side by side with torch where it is
installed (the same learning rates bit for bit, and a warm-up + cosine AdamW run on the GPU that
ends with torch's parameters), state dicts that survive JSON, and checkpoints that resume a
scheduled run with exactly its losses."""

from __future__ import annotations

import json
import math
from bisect import bisect_right

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.checkpoint import CheckpointError
from meganeura.optim import lr_scheduler

BASE = (0.1, 0.03)  # two parameter groups with their own learning rates
STEPS = 40


def two_groups(kind: str = "sgd"):
    model = nn.Linear(3, 2)
    groups = [{"params": [model.weight]}, {"params": [model.bias], "lr": BASE[1]}]
    if kind == "sgd":
        return optim.SGD(groups, lr=BASE[0], momentum=0.9)
    return optim.AdamW(groups, lr=BASE[0])


def sequence(scheduler, steps: int = STEPS) -> list[list[float]]:
    """The learning rates at steps 0..steps (get_last_lr after construction, then each step())."""
    lrs = [scheduler.get_last_lr()]
    for _ in range(steps):
        scheduler.step()
        lrs.append(scheduler.get_last_lr())
    return lrs


def cosine(base: float, eta_min: float, t_max: int, e: int) -> float:
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * e / t_max)) / 2


def linear(base: float, start: float, end: float, total: int, e: int) -> float:
    return base * (start + (end - start) * min(total, e) / total)


def one_cycle(peak: float, e: int, total: int, pct: float = 0.3, div: float = 25.0, final: float = 1e4) -> float:
    """torch's documented 1cycle (two phases, cosine): up from peak/div to peak, down to peak/div/final."""
    initial = peak / div
    rise = pct * total - 1
    if e <= rise:
        start, end, fraction = initial, peak, e / rise
    else:
        start, end, fraction = peak, initial / final, (e - rise) / (total - 1 - rise)
    return end + (start - end) / 2 * (1 + math.cos(math.pi * fraction))


def cyclic(base: float, top: float, up: int, down: int, e: int) -> float:
    """torch's triangular CyclicLR from base_lr `base` to max_lr `top`: up over `up` steps, down over `down`."""
    x = (e % (up + down)) / (up + down)
    ratio = up / (up + down)
    return base + (top - base) * (x / ratio if x <= ratio else (x - 1) / (ratio - 1))


# Each case: the scheduler made on an optimizer, and its closed form lr(base, e).
CASES = {
    "LambdaLR": (lambda M, o: M.LambdaLR(o, lambda e: 0.95**e + 0.01 * e), lambda b, e: b * (0.95**e + 0.01 * e)),
    "StepLR": (lambda M, o: M.StepLR(o, step_size=7, gamma=0.5), lambda b, e: b * 0.5 ** (e // 7)),
    "MultiStepLR": (
        lambda M, o: M.MultiStepLR(o, milestones=[3, 9, 9, 20], gamma=0.3),
        lambda b, e: b * 0.3 ** bisect_right([3, 9, 9, 20], e),
    ),
    "ExponentialLR": (lambda M, o: M.ExponentialLR(o, gamma=0.93), lambda b, e: b * 0.93**e),
    # 40 steps of T_max 8: down, up again past T_max (torch's curve is periodic), twice over.
    "CosineAnnealingLR": (
        lambda M, o: M.CosineAnnealingLR(o, T_max=8, eta_min=1e-3),
        lambda b, e: cosine(b, 1e-3, 8, e),
    ),
    "LinearLR": (
        lambda M, o: M.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=6),
        lambda b, e: linear(b, 0.1, 0.9, 6, e),
    ),
    "SequentialLR": (
        lambda M, o: M.SequentialLR(
            o, [M.LinearLR(o, start_factor=0.01, total_iters=5), M.CosineAnnealingLR(o, T_max=35, eta_min=1e-4)], [5]
        ),
        lambda b, e: linear(b, 0.01, 1.0, 5, e) if e < 5 else cosine(b, 1e-4, 35, e - 5),
    ),
    "OneCycleLR": (lambda M, o: M.OneCycleLR(o, max_lr=[0.5, 0.2], total_steps=STEPS), None),
    "ConstantLR": (lambda M, o: M.ConstantLR(o, factor=0.4, total_iters=6), lambda b, e: b * (0.4 if e < 6 else 1.0)),
    "PolynomialLR": (
        lambda M, o: M.PolynomialLR(o, total_iters=12, power=2.0),
        lambda b, e: b * (1 - min(12, e) / 12) ** 2,
    ),
    # CyclicLR sets each group's lr to base_lr (0.01) and cycles it up to that group's max_lr.
    "CyclicLR": (
        lambda M, o: M.CyclicLR(o, base_lr=0.01, max_lr=[0.1, 0.05], step_size_up=4, step_size_down=3),
        lambda b, e: cyclic(0.01, {BASE[0]: 0.1, BASE[1]: 0.05}[b], 4, 3, e),
    ),
    # T_0 5, T_mult 2: restarts at steps 5, 15 and 35, each period twice the last.
    "CosineAnnealingWarmRestarts": (
        lambda M, o: M.CosineAnnealingWarmRestarts(o, T_0=5, T_mult=2, eta_min=1e-3),
        lambda b, e: next(cosine(b, 1e-3, t, e - s) for s, t in ((35, 40), (15, 20), (5, 10), (0, 5)) if e >= s),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_learning_rates_follow_pytorchs_closed_forms(name):
    make, closed = CASES[name]
    opt = two_groups()
    lrs = sequence(make(lr_scheduler, opt))
    for e, values in enumerate(lrs):
        if name == "OneCycleLR":
            expected = [one_cycle(peak, e, STEPS) for peak in (0.5, 0.2)]
        else:
            expected = [closed(base, e) for base in BASE]
        np.testing.assert_allclose(values, expected, rtol=1e-12, atol=1e-15, err_msg=f"step {e}")
    assert [g["lr"] for g in opt.param_groups] == lrs[-1]  # the optimizer holds the last ones
    assert len({tuple(v) for v in lrs}) > (1 if name == "ConstantLR" else 3)  # the schedule moved


def test_one_cycle_moves_momentum_and_beta1_against_the_learning_rate():
    sgd, adam = two_groups("sgd"), two_groups("adamw")
    s = lr_scheduler.OneCycleLR(sgd, max_lr=0.5, total_steps=20)
    a = lr_scheduler.OneCycleLR(adam, max_lr=0.5, total_steps=20)
    assert sgd.momentum == 0.95 and adam.betas == (0.95, 0.999)  # max_momentum at the lowest lr
    for _ in range(5):  # the peak: step pct_start·total − 1 = 5
        s.step()
        a.step()
    assert s.get_last_lr()[0] == pytest.approx(0.5) and sgd.momentum == pytest.approx(0.85)
    assert adam.betas[0] == pytest.approx(0.85) and adam.betas[1] == 0.999


torch_cases = pytest.mark.parametrize("name", sorted(CASES) + ["OneCycleLR three-phase linear"])


@torch_cases
@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_learning_rates_and_momenta_are_torchs_bit_for_bit(name, kind):
    torch = pytest.importorskip("torch")
    import torch.optim.lr_scheduler as theirs

    if name == "OneCycleLR three-phase linear":

        def make(M, o):
            return M.OneCycleLR(o, max_lr=0.4, total_steps=STEPS, three_phase=True, anneal_strategy="linear")
    else:
        make = CASES[name][0]
    w, b = torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(2))
    groups = [{"params": [w]}, {"params": [b], "lr": BASE[1]}]
    t_opt = (
        torch.optim.SGD(groups, lr=BASE[0], momentum=0.9) if kind == "sgd" else torch.optim.AdamW(groups, lr=BASE[0])
    )
    ours = two_groups(kind)
    mine, reference = make(lr_scheduler, ours), make(theirs, t_opt)
    key = "momentum" if kind == "sgd" else "betas"
    for step in range(STEPS + 1):
        assert mine.get_last_lr() == reference.get_last_lr(), step
        assert [g[key] for g in ours.param_groups] == [g[key] for g in t_opt.param_groups], step
        if step < STEPS:
            t_opt.step()
            mine.step()
            reference.step()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_state_dict_through_json_resumes_the_same_schedule(name):
    make = CASES[name][0]
    whole = sequence(make(lr_scheduler, two_groups()))
    opt = two_groups()
    first = make(lr_scheduler, opt)
    for _ in range(13):
        first.step()
    saved = json.loads(json.dumps({"groups": opt.hyper_state(), "scheduler": first.state_dict()}))
    fresh = two_groups()
    resumed = make(lr_scheduler, fresh)  # built as at the start, then given the saved state
    fresh.load_hyper_state(saved["groups"])
    resumed.load_state_dict(saved["scheduler"])
    assert resumed.get_last_lr() == whole[13]
    assert sequence(resumed, STEPS - 13)[1:] == whole[14:]


def test_the_last_scheduler_made_is_the_optimizers_and_errors_are_loud():
    opt = two_groups()
    warm = lr_scheduler.LinearLR(opt, total_iters=3)
    assert opt.scheduler is warm
    cos = lr_scheduler.CosineAnnealingLR(opt, T_max=10)
    sequential = lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[3])
    assert opt.scheduler is sequential
    with pytest.raises(ValueError, match="milestones"):
        lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[])
    with pytest.raises(ValueError, match="another optimizer"):
        lr_scheduler.SequentialLR(two_groups(), [warm], milestones=[])
    with pytest.raises(TypeError, match="meganeura.optim optimizer"):
        lr_scheduler.StepLR(object(), step_size=2)
    with pytest.raises(ValueError, match="start_factor"):
        lr_scheduler.LinearLR(opt, start_factor=0.0)
    with pytest.raises(ValueError, match="total_steps"):
        lr_scheduler.OneCycleLR(opt, max_lr=0.1)
    one = lr_scheduler.OneCycleLR(two_groups(), max_lr=0.1, total_steps=2)
    one.step()
    one.step()
    with pytest.raises(ValueError, match="total_steps is 2"):
        one.step()
    assert optim.lr_scheduler is lr_scheduler  # torch.optim.lr_scheduler's place


# ---------------------------------------------------------------------------------------------
# On the GPU: a scheduled run against torch, and checkpoints of one

BATCH, N_IN, HIDDEN, CLASSES = 8, 5, 9, 3
RNG = np.random.default_rng(11)
BATCHES = [
    {"x": RNG.normal(size=(BATCH, N_IN)).astype(np.float32), "y": RNG.integers(0, CLASSES, BATCH).astype(np.int32)}
    for _ in range(8)
]
SPEC = {"x": mn.f32[BATCH, N_IN], "y": mn.i32[BATCH]}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(N_IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def warmup_cosine(module, opt, warmup: int = 3, total: int = 8):
    return module.SequentialLR(
        opt,
        [
            module.LinearLR(opt, start_factor=0.1, total_iters=warmup),
            module.CosineAnnealingLR(opt, T_max=total - warmup, eta_min=1e-4),
        ],
        milestones=[warmup],
    )


def scheduled_program(seed: int = 5):
    """AdamW with weight decay off the biases (two groups), warm-up + cosine."""
    mn.manual_seed(seed)
    model = Net()
    decay = [model.fc1.weight, model.fc2.weight]
    opt = optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": [model.fc1.bias, model.fc2.bias], "weight_decay": 0.0}],
        lr=0.05,
    )
    program = mn.compile(model, ce, SPEC, opt)
    return program, opt, warmup_cosine(lr_scheduler, opt)


@pytest.mark.gpu
def test_warmup_cosine_adamw_trains_as_torch_does():
    torch = pytest.importorskip("torch")
    import torch.optim.lr_scheduler as theirs

    # torch's optimizer first: its first use after the Vulkan device is open (lavapipe, in one
    # process) crashed with a segmentation fault (torch 2.14, measured 2026-12-01).
    t_model = torch.nn.Sequential(torch.nn.Linear(N_IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))
    t_opt = torch.optim.AdamW(
        [
            {"params": [t_model[0].weight, t_model[2].weight], "weight_decay": 0.1},
            {"params": [t_model[0].bias, t_model[2].bias], "weight_decay": 0.0},
        ],
        lr=0.05,
    )
    t_scheduler = warmup_cosine(theirs, t_opt)
    program, opt, scheduler = scheduled_program()
    start = program.state_dict()
    with torch.no_grad():  # the same initial weights
        for index, name in ((0, "fc1"), (2, "fc2")):
            t_model[index].weight.copy_(torch.from_numpy(start[f"{name}.weight"]))
            t_model[index].bias.copy_(torch.from_numpy(start[f"{name}.bias"]))
    losses, t_losses, lrs, t_lrs = [], [], [], []
    for batch in BATCHES:
        lrs.append(scheduler.get_last_lr())
        t_lrs.append(t_scheduler.get_last_lr())
        losses.append(program.train_step(**batch))
        scheduler.step()
        t_opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(
            t_model(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]).long()
        )
        loss.backward()
        t_opt.step()
        t_scheduler.step()
        t_losses.append(float(loss.detach()))
    assert lrs == t_lrs and len({lr[0] for lr in lrs}) == len(lrs)  # every step had its own lr
    np.testing.assert_allclose(losses, t_losses, rtol=1e-4)
    now = program.state_dict()
    for index, name in ((0, "fc1"), (2, "fc2")):
        for field in ("weight", "bias"):
            theirs_value = getattr(t_model[index], field).detach().numpy()
            ours_value = now[f"{name}.{field}"]
            moved = np.abs(theirs_value - start[f"{name}.{field}"]).max()
            assert moved > 1e-2  # the steps moved it (the comparison below means something)
            np.testing.assert_allclose(ours_value, theirs_value, rtol=0, atol=1e-4 * max(1.0, moved), err_msg=name)


@pytest.mark.gpu
def test_a_checkpoint_resumes_a_scheduled_run_with_its_losses(tmp_path):
    pytest.importorskip("safetensors")
    whole, _, whole_scheduler = scheduled_program()
    expected = []
    for batch in BATCHES:
        expected.append(whole.train_step(**batch))
        whole_scheduler.step()
    first, _, first_scheduler = scheduled_program()
    for batch in BATCHES[:4]:
        first.train_step(**batch)
        first_scheduler.step()
    path = tmp_path / "step4.safetensors"
    first.save(path)
    resumed, opt, scheduler = scheduled_program(seed=9)  # fresh weights and a fresh schedule at step 0
    assert scheduler.get_last_lr() != first_scheduler.get_last_lr()
    resumed.load(path)
    assert scheduler.get_last_lr() == first_scheduler.get_last_lr() == [g["lr"] for g in opt.param_groups]
    losses = []
    for batch in BATCHES[4:]:
        losses.append(resumed.train_step(**batch))
        scheduler.step()
    assert losses == expected[4:]
    assert scheduler.get_last_lr() == whole_scheduler.get_last_lr()

    plain, plain_opt, _ = scheduled_program()
    plain_opt.scheduler = None  # a program without a schedule refuses a scheduled checkpoint
    with pytest.raises(CheckpointError, match="scheduler is SequentialLR, this program's none"):
        plain.load(path)
    other, other_opt, _ = scheduled_program()
    lr_scheduler.StepLR(other_opt, step_size=2)
    with pytest.raises(CheckpointError, match="SequentialLR, this program's StepLR"):
        other.load(path)


@pytest.mark.gpu
def test_a_checkpoint_restores_changed_hyper_parameters(tmp_path):
    pytest.importorskip("safetensors")
    program, opt, _ = scheduled_program()
    opt.scheduler = None
    opt.param_groups[1]["weight_decay"] = 0.25
    opt.betas = (0.8, 0.99)
    opt.lr = 0.02
    program.train_step(**BATCHES[0])
    path = tmp_path / "changed.safetensors"
    program.save(path)
    fresh, fresh_opt, _ = scheduled_program()
    fresh_opt.scheduler = None
    fresh.load(path)
    assert fresh_opt.hyper_state() == opt.hyper_state()
    assert fresh_opt.param_groups[1]["weight_decay"] == 0.25 and fresh_opt.betas == (0.8, 0.99)
    assert fresh.train_step(**BATCHES[1]) == program.train_step(**BATCHES[1])


@pytest.mark.parametrize("mode", ["min", "max"])
def test_reduce_lr_on_plateau_rates_are_torchs_bit_for_bit(mode):
    """Live against torch where it is installed (tests/test_optim_reference.py checks the stored
    rates of five cases everywhere)."""
    torch = pytest.importorskip("torch")
    import torch.optim.lr_scheduler as theirs

    rng = np.random.default_rng(3)
    metrics = np.concatenate([np.linspace(1.0, 0.5, 10), 0.5 + rng.normal(0.0, 0.01, STEPS)])
    w, b = torch.nn.Parameter(torch.zeros(2, 3)), torch.nn.Parameter(torch.zeros(2))
    t_opt = torch.optim.SGD([{"params": [w]}, {"params": [b], "lr": BASE[1]}], lr=BASE[0], momentum=0.9)
    ours = two_groups()
    arguments = {"mode": mode, "factor": 0.3, "patience": 2, "cooldown": 1, "min_lr": [1e-3, 1e-4]}
    mine, reference = lr_scheduler.ReduceLROnPlateau(ours, **arguments), theirs.ReduceLROnPlateau(t_opt, **arguments)
    for metric in metrics if mode == "min" else -metrics:
        mine.step(float(metric))
        reference.step(float(metric))
        assert mine.get_last_lr() == reference.get_last_lr()
    assert mine.get_last_lr() != list(BASE)
    assert json.loads(json.dumps(mine.state_dict())) == json.loads(json.dumps(reference.state_dict()))
