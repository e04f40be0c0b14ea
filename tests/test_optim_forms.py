"""The optimizer forms of issue 40 on the device: AMSGrad, SGD's Nesterov momentum and dampening,
RMSprop, Adagrad, Adamax, NAdam, RAdam and Adadelta in their fused, single-tensor and
multi-tensor kernels (the same numbers), their state by torch's names, what compile() fixes (and
the errors that say so), NAdam's mu_product (kept by the host) through a state dict and a
checkpoint under OneCycleLR, and a checkpoint of an RMSprop run under ReduceLROnPlateau that
resumes exactly. Their values against torch's: tests/test_optim_reference.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.checkpoint import CheckpointError
from meganeura.compiler import Program, compile_plan
from meganeura.optim import lr_scheduler
from meganeura.runtime import default_device
from meganeura.target import Target

SPEC = {"x": mn.f32[6, 5], "y": mn.i32[6]}
RNG = np.random.default_rng(40)
BATCHES = [
    {"x": RNG.normal(size=(6, 5)).astype(np.float32), "y": RNG.integers(0, 3, 6).astype(np.int32)} for _ in range(6)
]


class Net(nn.Module):
    """4 parameters of ragged sizes (35, 7, 21, 3)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(5, 7), nn.Linear(7, 3)

    def forward(self, x):
        return self.fc2(F.tanh(self.fc1(x)))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


FORMS = {
    "adamw amsgrad": lambda fused: optim.AdamW(lr=1e-2, amsgrad=True, weight_decay=0.1, fused=fused),
    "sgd nesterov wd": lambda fused: optim.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, fused=fused),
    "sgd dampening": lambda fused: optim.SGD(lr=0.1, momentum=0.9, dampening=0.3, fused=fused),
    "rmsprop": lambda fused: optim.RMSprop(lr=1e-2, fused=fused),
    "rmsprop centered momentum wd": lambda fused: optim.RMSprop(
        lr=1e-2, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.1, fused=fused
    ),
    "adagrad": lambda fused: optim.Adagrad(lr=0.1, lr_decay=0.05, initial_accumulator_value=0.1, fused=fused),
    "adamax wd": lambda fused: optim.Adamax(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, fused=fused),
    "nadam wd": lambda fused: optim.NAdam(lr=1e-2, weight_decay=0.1, momentum_decay=0.01, fused=fused),
    "nadam decoupled": lambda fused: optim.NAdam(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, fused=fused),
    "radam decoupled": lambda fused: optim.RAdam(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True, fused=fused),
    "adadelta wd": lambda fused: optim.Adadelta(lr=0.5, rho=0.8, weight_decay=0.1, fused=fused),
}
# The updates a program has applied before its first step here, where not 0: RAdam's step is
# rectified from update 6 on (torch's ρₜ > 5), so updates 5 to 8 take both forms.
UPDATES_BEFORE = {"radam decoupled": 4}


def trained(name: str, fused: bool, target: Target) -> tuple[Program, list[float]]:
    mn.manual_seed(8)
    program = Program(compile_plan(Net(), ce, SPEC, FORMS[name](fused), target=target))
    if name in UPDATES_BEFORE:  # the moments' zeros, `step` updates in
        state = program.optimizer_state_dict() | {"step": np.array(UPDATES_BEFORE[name], np.float32)}
        program.load_optimizer_state_dict(state)
    return program, [program.train_step(**batch) for batch in BATCHES[:4]]


def update_ops(program: Program) -> set[str]:
    graph = program.compiled.graph
    return {graph[k.node].op for k in program.compiled.kernels if k.entry_point == "optimizer_update"}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(FORMS))
def test_fused_single_tensor_and_multi_tensor_kernels_agree(name):
    """Four steps of the single-tensor kernels, the fused kernel of each parameter and one
    multi-tensor kernel (planned for a GPU: every form binds at most 5 buffers a member) give the
    same losses and state, to a few ulps of each tensor's largest element (a GPU's compiler may
    contract the forms differently, and centered RMSprop's v − avg² cancels in small elements: 5e-6
    relative on an H100)."""
    device = default_device().target
    single, single_losses = trained(name, False, device)
    fused, fused_losses = trained(name, True, device)
    multi, multi_losses = trained(name, True, Target("a GPU", 4, 32))
    assert {op for op in update_ops(multi) if op.startswith("multi_")}, update_ops(multi)
    assert not {op for op in update_ops(single) if op.endswith("_update")}
    expected = single.state_dict() | single.optimizer_state_dict()
    assert np.isfinite(single_losses).all() and single_losses[-1] != single_losses[0]
    for label, program, losses in (("fused", fused, fused_losses), ("multi-tensor", multi, multi_losses)):
        np.testing.assert_allclose(losses, single_losses, rtol=2e-6, err_msg=label)
        values = program.state_dict() | program.optimizer_state_dict()
        assert values.keys() == expected.keys()
        for key, value in expected.items():
            atol = max(2e-6 * float(np.abs(value).max(initial=0.0)), 1e-8)
            np.testing.assert_allclose(values[key], value, rtol=2e-6, atol=atol, err_msg=f"{label}: {key}")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name",
    ["rmsprop centered momentum wd", "adagrad", "adamax wd", "nadam decoupled", "radam decoupled", "adadelta wd"],
)
def test_the_new_optimizers_follow_the_interpreter(name):
    mn.manual_seed(3)
    program = mn.compile(Net(), ce, SPEC, FORMS[name](True))
    losses = assert_steps_follow_interpreter(program, BATCHES[:3])
    assert len(set(losses)) == 3


def test_state_names_are_torchs():
    """optimizer_state_dict(): torch's state keys after the parameter's name, and the step count."""
    expected = {
        "adamw amsgrad": ({"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, True),
        "sgd nesterov wd": ({"momentum_buffer"}, False),
        "rmsprop": ({"square_avg"}, True),
        "rmsprop centered momentum wd": ({"square_avg", "grad_avg", "momentum_buffer"}, True),
        "adagrad": ({"sum"}, True),
        "adamax wd": ({"exp_avg", "exp_inf"}, True),
        "nadam wd": ({"exp_avg", "exp_avg_sq"}, True),  # and mu_product, which the host keeps
        "radam decoupled": ({"exp_avg", "exp_avg_sq"}, True),
        "adadelta wd": ({"square_avg", "acc_delta"}, True),
    }
    for name, (states, step) in expected.items():
        with mn.compiler.explain_only():
            program = mn.compile(Net(), ce, SPEC, FORMS[name](True))
        names = {k for k in program.traced.initial_states if not k.startswith("param_groups.")}
        wanted = {f"{p}.{s}" for p in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias") for s in states}
        assert names == wanted | ({"step"} if step else set()), name
        sums = [v for k, v in program.traced.initial_states.items() if k.endswith(".sum")]
        assert all(np.all(v == np.float32(0.1)) for v in sums)  # Adagrad's initial_accumulator_value


def test_what_compile_fixes_cannot_change_later():
    def compiled(optimizer):
        with mn.compiler.explain_only():
            mn.compile(Net(), ce, SPEC, optimizer)
        return optimizer

    adam = compiled(optim.Adam(lr=1e-2))
    adam.param_groups[0]["amsgrad"] = True
    with pytest.raises(ValueError, match="amsgrad was False at compile"):
        adam.hyper_values(2)
    rms = compiled(optim.RMSprop(centered=True))
    rms.param_groups[0]["centered"] = False
    with pytest.raises(ValueError, match="centered was True at compile"):
        rms.hyper_values(2)
    rms = compiled(optim.RMSprop())
    rms.momentum = 0.9
    with pytest.raises(ValueError, match="momentum was 0 at compile"):
        rms.hyper_values(2)
    sgd = compiled(optim.SGD(lr=0.1, momentum=0.9, nesterov=True))
    sgd.param_groups[0]["nesterov"] = False
    with pytest.raises(ValueError, match="nesterov was True at compile"):
        sgd.hyper_values(2)
    sgd.param_groups[0]["nesterov"] = True
    sgd.momentum = 0.0  # momentum off at run time: plain SGD's step (torch's too), no error
    sgd.hyper_values(2)


def test_torchs_argument_checks():
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        optim.SGD(lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="Nesterov momentum requires a momentum and zero dampening"):
        optim.SGD(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="alpha"):
        optim.RMSprop(alpha=-0.1)
    with pytest.raises(ValueError, match="lr_decay"):
        optim.Adagrad(lr_decay=-1.0)
    with pytest.raises(ValueError, match="initial_accumulator_value"):
        optim.Adagrad(initial_accumulator_value=-1.0)
    with pytest.raises(TypeError, match="amsgrad"):
        optim.Adam(amsgrad=1)
    with pytest.raises(KeyError, match="unknown hyper-parameters"):
        optim.RMSprop([{"params": [nn.Linear(2, 2).weight], "betas": (0.9, 0.99)}])
    assert (optim.RMSprop().defaults, optim.Adagrad().defaults) == (
        {"lr": 1e-2, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0, "momentum": 0.0, "centered": False},
        {"lr": 1e-2, "lr_decay": 0.0, "weight_decay": 0.0, "initial_accumulator_value": 0.0, "eps": 1e-10},
    )
    with pytest.raises(ValueError, match=r"betas\[0\] must be \[0.0, 1.0\)"):
        optim.NAdam(betas=(1.0, 0.999))
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        optim.Adamax(betas=(0.9, -0.1))
    with pytest.raises(ValueError, match="momentum_decay"):
        optim.NAdam(momentum_decay=-1e-3)
    with pytest.raises(TypeError, match="decoupled_weight_decay"):
        optim.RAdam(decoupled_weight_decay="yes")
    with pytest.raises(ValueError, match=r"rho must be \[0.0, 1.0\]"):
        optim.Adadelta(rho=1.1)
    assert optim.Adadelta(rho=1.0).param_groups[0]["rho"] == 1.0  # torch allows 0 ≤ rho ≤ 1
    with pytest.raises(KeyError, match="unknown hyper-parameters"):
        optim.Adamax([{"params": [nn.Linear(2, 2).weight], "amsgrad": True}])
    betas = (0.9, 0.999)
    assert [o().defaults for o in (optim.Adamax, optim.NAdam, optim.RAdam, optim.Adadelta)] == [
        {"lr": 2e-3, "betas": betas, "eps": 1e-8, "weight_decay": 0.0},
        {"lr": 2e-3, "betas": betas, "eps": 1e-8, "weight_decay": 0.0, "momentum_decay": 4e-3,
         "decoupled_weight_decay": False},
        {"lr": 1e-3, "betas": betas, "eps": 1e-8, "weight_decay": 0.0, "decoupled_weight_decay": False},
        {"lr": 1.0, "rho": 0.9, "eps": 1e-6, "weight_decay": 0.0},
    ]  # torch's  # fmt: skip


def test_sgd_state_from_elsewhere_counts_as_started():
    """torch's SGD keeps no step count, only whether a buffer exists: a loaded state whose buffers
    are not all 0 has started (no first-step copy of the gradient), all 0 has not."""
    sgd = optim.SGD(lr=0.1, momentum=0.9, dampening=0.5)
    zero = {"fc.weight.momentum_buffer": np.zeros((2, 2), np.float32)}
    assert sgd.steps_in(zero) == 0
    assert sgd.steps_in({"fc.weight.momentum_buffer": np.eye(2, dtype=np.float32)}) == 1
    group = sgd.param_groups[0]
    assert sgd.hyper_fields(group, 1)["dampening_factor"] == 1.0  # buf = d on the first step
    assert sgd.hyper_fields(group, 2)["dampening_factor"] == 0.5
    assert optim.Adam().steps_in({"step": np.array(1000.0, np.float32)}) == 1000


@pytest.mark.gpu
def test_a_checkpoint_resumes_rmsprop_under_reduce_lr_on_plateau(tmp_path):
    pytest.importorskip("safetensors")

    def made(seed: int = 5):
        mn.manual_seed(seed)
        opt = optim.RMSprop(lr=0.05, momentum=0.5, centered=True)
        program = mn.compile(Net(), ce, SPEC, opt)
        return program, lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5, threshold=0.5)

    whole, whole_scheduler = made()
    expected = []
    for batch in BATCHES:
        expected.append(whole.train_step(**batch))
        whole_scheduler.step(expected[-1])
    first, first_scheduler = made()
    for batch in BATCHES[:3]:
        first_scheduler.step(first.train_step(**batch))
    path = tmp_path / "rmsprop.safetensors"
    first.save(path)
    resumed, scheduler = made(seed=9)
    assert json.loads(json.dumps(scheduler.state_dict()))["best"] == float("inf")  # JSON's Infinity
    resumed.load(path)
    assert scheduler.state_dict() == first_scheduler.state_dict() and resumed.optimizer_steps == 3
    losses = []
    for batch in BATCHES[3:]:
        losses.append(resumed.train_step(**batch))
        scheduler.step(losses[-1])
    assert losses == expected[3:]
    assert scheduler.get_last_lr() == whole_scheduler.get_last_lr() != [0.05]  # it reduced the rate


def test_host_scalars_are_torchs():
    """RAdam's rectification starts where torch's ρₜ first exceeds 5 (0 before: the plain step), and
    NAdam's step sizes come from its μ schedule and their float32 running product, as torch's
    Python code computes them."""
    radam = optim.RAdam(lr=0.1)
    group = radam.param_groups[0]
    rectification = [radam.hyper_fields(group, step)["rectification"] for step in range(1, 9)]
    assert rectification[:5] == [0.0] * 5 and all(0 < r < 1 for r in rectification[5:])
    nadam = optim.NAdam(lr=0.1, betas=(0.8, 0.99), momentum_decay=0.01)
    group = nadam.param_groups[0]
    product = np.float32(1.0)
    for step in range(1, 5):
        mu = 0.8 * (1.0 - 0.5 * 0.96 ** (step * 0.01))
        mu_next = 0.8 * (1.0 - 0.5 * 0.96 ** ((step + 1) * 0.01))
        product = product * np.float32(mu)  # torch's float32 tensor
        fields = nadam.hyper_fields(group, step)
        assert fields["grad_step_size"] == 0.1 * (1.0 - mu) / (1.0 - float(product))
        assert fields["momentum_step_size"] == (0.1 * mu_next) / (1.0 - float(product) * mu_next)
        assert fields["bias_correction2"] == 1 - 0.99**step
    assert nadam.mu_product(0, 4) == float(product)


@pytest.mark.gpu
def test_nadam_mu_product_follows_a_changing_beta1_through_a_checkpoint(tmp_path):
    """NAdam's mu_product, which the host keeps, in optimizer_state_dict() (one per parameter,
    torch's names) and in a checkpoint: a run under OneCycleLR (which cycles β₁) saved after 3
    steps and resumed gives the uninterrupted run's losses, and a state whose parameters of one
    group disagree on it is refused."""
    pytest.importorskip("safetensors")

    def made(seed: int = 5):
        mn.manual_seed(seed)
        opt = optim.NAdam(lr=0.01, weight_decay=0.01)
        return mn.compile(Net(), ce, SPEC, opt), lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=8)

    whole, whole_scheduler = made()
    expected = []
    for batch in BATCHES:
        expected.append(whole.train_step(**batch))
        whole_scheduler.step()
    state = whole.optimizer_state_dict()
    products = {k: v for k, v in state.items() if k.endswith(".mu_product")}
    assert sorted(products) == [f"{p}.mu_product" for p in ("fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight")]
    assert len({float(v) for v in products.values()}) == 1 and all(v.shape == () for v in products.values())
    constant = optim.NAdam(betas=(0.95, 0.999)).mu_product(0, len(BATCHES))  # β₁ as OneCycleLR starts it
    assert float(products["fc1.bias.mu_product"]) != np.float32(constant)  # the product saw each step's β₁
    first, first_scheduler = made()
    for batch in BATCHES[:3]:
        first.train_step(**batch)
        first_scheduler.step()
    path = tmp_path / "nadam.safetensors"
    first.save(path)
    resumed, scheduler = made(seed=9)
    resumed.load(path)
    assert (
        resumed.optimizer_state_dict()["fc1.weight.mu_product"] == first.optimizer_state_dict()["fc1.bias.mu_product"]
    )
    losses = []
    for batch in BATCHES[3:]:
        losses.append(resumed.train_step(**batch))
        scheduler.step()
    assert losses == expected[3:]
    assert resumed.optimizer_state_dict()["fc2.bias.mu_product"] == products["fc2.bias.mu_product"]
    bad = dict(state) | {"fc1.bias.mu_product": np.array(0.5, np.float32)}
    with pytest.raises(CheckpointError, match="mu_product differ"):
        resumed.load_optimizer_state_dict(bad)


class Given(nn.Module):
    """One parameter whose loss Σ p·g has the input g as its gradient."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(np.full((3, 5), 0.5, np.float32))

    def forward(self, g):
        return (self.p * g).sum()


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [True, False])
def test_adamax_infinity_norm_keeps_nan_from_either_side(fused):
    """Adamax's exp_inf is torch.maximum(exp_inf·β₂, |g| + eps): NaN where either side is (WGSL's
    max, and numpy's fmax, would return the other side), in the fused kernel and in the single-tensor
    form the e-graph extracts."""
    program = mn.compile(Given(), lambda model, g: model(g), {"g": mn.f32[3, 5]}, optim.Adamax(lr=0.1, fused=fused))
    state = program.optimizer_state_dict()
    state["p.exp_inf"] = np.full((3, 5), 2.0, np.float32)
    state["p.exp_inf"][0, 0] = np.nan
    program.load_optimizer_state_dict(state)
    g = np.linspace(-1.0, 1.0, 15, dtype=np.float32).reshape(3, 5)
    g[1, 1], g[2, 2] = np.nan, np.inf
    program.train_step(g=g)
    norm = program.optimizer_state_dict()["p.exp_inf"]
    expected = np.maximum(np.float32(0.999) * state["p.exp_inf"], np.abs(g) + np.float32(1e-8))
    np.testing.assert_array_equal(np.isnan(norm), np.isnan(expected))
    assert np.isnan(norm[0, 0]) and np.isnan(norm[1, 1]) and norm[2, 2] == np.inf
    np.testing.assert_allclose(norm, expected, rtol=1e-6)


@pytest.mark.gpu
def test_nadam_mu_product_survives_a_plan_for_another_shape():
    """A batch of another shape compiles another plan mid-run (the optimizer's updates traced
    again): the running product of μ goes on from the steps before, with the β₁ each step had."""
    mn.manual_seed(2)
    opt = optim.NAdam(lr=0.01, betas=(0.9, 0.999))
    program = mn.compile(Net(), ce, SPEC, opt)
    betas = [0.9, 0.6, 0.6]
    program.train_step(**BATCHES[0])
    opt.betas = (0.6, 0.999)
    program.train_step(**BATCHES[1])
    program.train_step(x=BATCHES[2]["x"][:4], y=BATCHES[2]["y"][:4])  # a plan for batches of 4
    assert len(program.plans) == 2
    product = np.float32(1.0)
    for step, beta1 in enumerate(betas, start=1):
        product = product * np.float32(beta1 * (1.0 - 0.5 * 0.96 ** (step * 4e-3)))
    assert program.optimizer_state_dict()["fc1.weight.mu_product"] == product
