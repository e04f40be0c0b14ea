"""Write the PyTorch reference fixtures of tests/test_optim_reference.py:
tests/reference/optimizers/<scenario>.npz, and the ReduceLROnPlateau fixture
tests/reference/optimizers/reduce_lr_on_plateau.npz.

    /tmp/torch311/bin/python scripts/make_optimizer_references.py             # every fixture
    /tmp/torch311/bin/python scripts/make_optimizer_references.py adam_default # some of them

Like scripts/make_torch_references.py, this imports only torch and numpy, and is deterministic
(seeded numpy values, one thread, fixed zip dates: scripts/reference_npz.py).

An optimizer scenario isolates the optimizer: a few parameters of ragged shapes, and for each step
a given gradient (seeded float32 arrays, their scale changing from step to step so that AMSGrad's
maximum and the moments' history matter), applied by torch.optim in float32 on the CPU with its
single-tensor code (foreach=False), the reference the tests hold meganeura's update to within
1e-6 of. A scenario may start from a loaded state (`start`: the step count and moments of a
run already `start` updates in, torch's state["step"] and its tensors), the case where the bias
corrections differ most from 1 − β computed in f32, and may change hyper-parameters of every
group before some steps (`changes`: {step: {key: value}}, as a scheduler would: NAdam's running
product of its momentum schedule then sees each step's β₁). The file holds, by name:

    meta                    a JSON string: scenario, optimizer, hyper-parameters, parameter
                            groups (parameter names), shapes, steps, start, torch version, and
                            the changes where a scenario has some
    init/<name>             every parameter before the first step (float32)
    start/<name>.<state>    the loaded optimizer state (float32; NAdam's mu_product the product of
                            its μ over the `start` updates, as torch's float32 tensor holds it),
                            and start/step (scenarios with a start)
    step<k>/grad/<name>     the gradient of step k (float32)
    step<k>/param/<name>    the parameter after step k (float32, torch's float32 run)
    state/<name>.<state>    the optimizer's state after the last step (float32), in meganeura's
                            names (torch's state keys after the parameter's name), and state/step

The ReduceLROnPlateau fixture holds, for each case of PLATEAU_CASES, its arguments (meta), the
metric passed to each step (case<k>/metrics, float64) and the learning rates of two parameter
groups after construction and after each step (case<k>/lrs, float64, [steps + 1, 2]).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_npz import write_npz  # noqa: E402  (a sibling: numpy and the standard library only)

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "tests" / "reference" / "optimizers"
SHAPES = {"a": (3, 5, 7), "b": (11,), "c": (4, 6)}
STEPS = 6
# The gradients' scale at each step (× N(0, 1)): large and small in turn, so that AMSGrad's
# running maximum keeps old values and the second moments see both.
GRAD_SCALES = (1.0, 0.05, 2.0, 0.01, 0.5, 0.2, 1.5, 0.03)

# Each scenario: torch.optim's class and arguments, parameter groups (None: one group of all;
# else dicts with "params" naming parameters and the group's own arguments), the parameters'
# scale (small against the steps, so that one ulp of a parameter stays far below 1e-6 of an
# update's norm), and optionally `start`, the update count of a loaded state.
SCENARIOS = {
    "adam_default": {"optimizer": ("Adam", {}), "param_scale": 0.001, "seed": 1},
    "adam_custom": {
        "optimizer": ("Adam", {"lr": 1e-2, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.1}),
        "param_scale": 0.01, "seed": 2,
    },
    "adam_betas_near_one": {
        "optimizer": ("Adam", {"lr": 1e-2, "betas": (0.999, 0.99999), "eps": 1e-8}), "param_scale": 0.005, "seed": 3,
    },
    "adam_lerp_large_weight": {  # 1 − β₁ = 0.7: torch's lerp takes its other form
        "optimizer": ("Adam", {"lr": 1e-2, "betas": (0.3, 0.6)}), "param_scale": 0.005, "seed": 4,
    },
    "adam_from_step_1000": {
        "optimizer": ("Adam", {"lr": 1e-2, "weight_decay": 0.1}), "param_scale": 0.005, "seed": 5, "start": 1000,
    },
    "adam_amsgrad_groups": {
        "optimizer": ("Adam", {"lr": 1e-2, "amsgrad": True}),
        "groups": [{"params": ["a"], "betas": (0.5, 0.9)}, {"params": ["b", "c"], "lr": 3e-2, "eps": 1e-4}],
        "param_scale": 0.005, "seed": 6,
    },
    "adamw_default": {"optimizer": ("AdamW", {}), "param_scale": 0.001, "seed": 7},
    "adamw_amsgrad": {
        "optimizer": ("AdamW", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1, "amsgrad": True}),
        "param_scale": 0.01, "seed": 8,
    },
    "adamw_amsgrad_from_step_1000_betas_near_one": {
        "optimizer": ("AdamW", {"lr": 1e-2, "betas": (0.9999, 0.99999), "weight_decay": 0.05, "amsgrad": True}),
        "param_scale": 0.005, "seed": 9, "start": 1000,
    },
    "sgd_nesterov": {
        "optimizer": ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
        "param_scale": 0.05, "seed": 10,
    },
    "sgd_dampening": {
        "optimizer": ("SGD", {"lr": 0.1, "momentum": 0.8, "dampening": 0.3, "weight_decay": 0.05}),
        "param_scale": 0.05, "seed": 11,
    },
    "rmsprop_default": {"optimizer": ("RMSprop", {}), "param_scale": 0.01, "seed": 12},
    "rmsprop_centered_momentum": {
        "optimizer": (
            "RMSprop", {"lr": 1e-2, "alpha": 0.9, "eps": 1e-6, "weight_decay": 0.1, "momentum": 0.5, "centered": True},
        ),
        "param_scale": 0.01, "seed": 13,
    },
    "rmsprop_groups": {
        "optimizer": ("RMSprop", {"lr": 1e-2}),
        "groups": [{"params": ["a", "c"], "centered": True, "alpha": 0.5}, {"params": ["b"], "momentum": 0.9}],
        "param_scale": 0.01, "seed": 14,
    },
    "adagrad_default": {"optimizer": ("Adagrad", {}), "param_scale": 0.01, "seed": 15},
    "adagrad_decay": {
        "optimizer": (
            "Adagrad",
            {"lr": 0.1, "lr_decay": 0.05, "weight_decay": 0.1, "initial_accumulator_value": 0.5, "eps": 1e-6},
        ),
        "param_scale": 0.05, "seed": 16,
    },
    "adamax_default": {"optimizer": ("Adamax", {}), "param_scale": 0.002, "seed": 18},
    "adamax_groups": {
        "optimizer": ("Adamax", {"lr": 1e-2, "weight_decay": 0.1}),
        "groups": [{"params": ["a"], "betas": (0.3, 0.9), "eps": 1e-3}, {"params": ["b", "c"], "lr": 3e-2}],
        "param_scale": 0.01, "seed": 19,
    },
    "nadam_default": {"optimizer": ("NAdam", {}), "param_scale": 0.002, "seed": 20},
    "nadam_decoupled": {
        "optimizer": (
            "NAdam",
            {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.1, "momentum_decay": 0.01,
             "decoupled_weight_decay": True},
        ),
        "param_scale": 0.01, "seed": 21,
    },
    "nadam_groups_changing_beta1": {  # the running product of μ sees each step's β₁ and momentum_decay
        "optimizer": ("NAdam", {"lr": 1e-2, "weight_decay": 0.05}),
        "groups": [{"params": ["a", "b"], "betas": (0.5, 0.9)}, {"params": ["c"], "decoupled_weight_decay": True}],
        "changes": {2: {"betas": (0.95, 0.999)}, 4: {"momentum_decay": 0.05, "lr": 5e-3}},
        "param_scale": 0.01, "seed": 22,
    },
    "nadam_from_step_1000": {
        "optimizer": ("NAdam", {"lr": 1e-2, "betas": (0.99, 0.99999), "weight_decay": 0.1}),
        "param_scale": 0.005, "seed": 23, "start": 1000,
    },
    "radam_default": {"optimizer": ("RAdam", {}), "param_scale": 0.001, "seed": 24},  # rectified from step 6
    "radam_decoupled_groups": {
        "optimizer": ("RAdam", {"lr": 1e-2, "weight_decay": 0.1, "decoupled_weight_decay": True}),
        "groups": [{"params": ["a"], "betas": (0.8, 0.9), "eps": 1e-4}, {"params": ["b", "c"], "lr": 3e-2}],
        "param_scale": 0.01, "seed": 25,
    },
    "radam_from_step_1000": {  # every step rectified
        "optimizer": ("RAdam", {"lr": 1e-2, "betas": (0.9, 0.99999), "weight_decay": 0.1}),
        "param_scale": 0.005, "seed": 26, "start": 1000,
    },
    "adadelta_default": {"optimizer": ("Adadelta", {}), "param_scale": 0.002, "seed": 27},
    "adadelta_groups": {
        "optimizer": ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-4, "weight_decay": 0.1}),
        "groups": [{"params": ["a", "c"]}, {"params": ["b"], "rho": 0.95, "lr": 2.0}],
        "param_scale": 0.02, "seed": 28,
    },
}  # fmt: skip

# torch's state keys by optimizer, in the order meganeura names them after the parameter.
STATE_KEYS = {
    "Adam": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    "AdamW": ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"),
    "SGD": ("momentum_buffer",),
    "RMSprop": ("square_avg", "grad_avg", "momentum_buffer"),
    "Adagrad": ("sum",),
    "Adamax": ("exp_avg", "exp_inf"),
    "NAdam": ("exp_avg", "exp_avg_sq", "mu_product"),
    "RAdam": ("exp_avg", "exp_avg_sq"),
    "Adadelta": ("square_avg", "acc_delta"),
}


def mu_product(hyper: dict, steps: int) -> torch.Tensor:
    """NAdam's state["mu_product"] after `steps` updates at these hyper-parameters, as torch's
    single-tensor code multiplies it (a float32 tensor, μ in Python double)."""
    beta1, momentum_decay = hyper.get("betas", (0.9, 0.999))[0], hyper.get("momentum_decay", 4e-3)
    product = torch.tensor(1.0)
    for step in range(1, steps + 1):
        product *= beta1 * (1.0 - 0.5 * (0.96 ** (float(step) * momentum_decay)))
    return product


def loaded_state(name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A state `start` updates in for one parameter: moments of a run (first moments N(0, 0.01),
    second moments U(1e-6, 1e-4), AMSGrad's maximum above them; those of the optimizer's state)."""
    shape = SHAPES[name]
    v = rng.uniform(1e-6, 1e-4, shape).astype(np.float32)
    return {
        "exp_avg": rng.normal(0.0, 0.01, shape).astype(np.float32),
        "exp_avg_sq": v,
        "max_exp_avg_sq": (v * rng.uniform(1.0, 3.0, shape)).astype(np.float32),
    }


def torch_groups(spec: dict, params: dict[str, torch.Tensor]):
    if spec.get("groups") is None:
        return list(params.values())
    return [{**group, "params": [params[n] for n in group["params"]]} for group in spec["groups"]]


def run(spec: dict, init, start_state, grads):
    """torch's float32 run: the parameters after each step, and the final state by meganeura's names."""
    torch.set_num_threads(1)
    name, hyper = spec["optimizer"]
    params = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
    optimizer = getattr(torch.optim, name)(torch_groups(spec, params), foreach=False, **hyper)
    if start_state:
        for n, p in params.items():
            state = {"step": torch.tensor(float(spec["start"]))}
            group = next(g for g in optimizer.param_groups if any(q is p for q in g["params"]))
            for key, value in start_state[n].items():
                if key != "max_exp_avg_sq" or group["amsgrad"]:
                    state[key] = torch.tensor(value)
            optimizer.state[p] = state
    history = []
    for step, step_grads in enumerate(grads):
        for group in optimizer.param_groups:
            group.update(spec.get("changes", {}).get(step, {}))
        for n, p in params.items():
            p.grad = torch.tensor(step_grads[n])
        optimizer.step()
        history.append({n: p.detach().numpy().copy() for n, p in params.items()})
    final = {}
    for n, p in params.items():
        state = optimizer.state[p]
        final["step"] = np.array(float(state["step"]) if "step" in state else len(grads), np.float32)
        for key in STATE_KEYS[name]:
            if state.get(key) is not None:
                final[f"{n}.{key}"] = state[key].detach().numpy().copy()
    return history, final


def generate(name: str) -> dict[str, np.ndarray]:
    """The arrays of one optimizer scenario's file, computed afresh."""
    spec = SCENARIOS[name]
    rng = np.random.default_rng(spec["seed"])
    init = {n: rng.normal(0.0, spec["param_scale"], shape).astype(np.float32) for n, shape in SHAPES.items()}
    start_state = {n: loaded_state(n, rng) for n in SHAPES} if spec.get("start") else None
    if start_state:  # the states of the optimizer (and NAdam's product of μ over the start)
        opt_name, hyper = spec["optimizer"]
        keys = STATE_KEYS[opt_name]
        start_state = {n: {k: v for k, v in state.items() if k in keys} for n, state in start_state.items()}
        if "mu_product" in keys:
            product = mu_product(hyper, spec["start"]).numpy()
            start_state = {n: {**state, "mu_product": product} for n, state in start_state.items()}
    grads = [
        {n: (rng.normal(0.0, 1.0, shape) * GRAD_SCALES[k]).astype(np.float32) for n, shape in SHAPES.items()}
        for k in range(STEPS)
    ]
    history, final = run(spec, init, start_state, grads)
    opt_name, hyper = spec["optimizer"]
    meta = {
        "scenario": name,
        "optimizer": opt_name,
        "hyper": hyper,
        "groups": spec.get("groups"),
        "shapes": SHAPES,
        "steps": STEPS,
        "start": spec.get("start", 0),
        "torch": torch.__version__.split("+")[0],
    }
    if "changes" in spec:
        meta["changes"] = spec["changes"]
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta, sort_keys=True))}
    for n, value in init.items():
        arrays[f"init/{n}"] = value
    if start_state:
        arrays["start/step"] = np.array(float(spec["start"]), np.float32)
        for n, state in start_state.items():
            for key, value in state.items():
                arrays[f"start/{n}.{key}"] = value
    for k in range(STEPS):
        for n in SHAPES:
            arrays[f"step{k}/grad/{n}"] = grads[k][n]
            arrays[f"step{k}/param/{n}"] = history[k][n]
    for key, value in final.items():
        arrays[f"state/{key}"] = value
    return arrays


# ReduceLROnPlateau: the arguments of each case, on an SGD with two groups (lr 0.1 and 0.03).
PLATEAU_CASES = [
    {},
    {"mode": "max", "factor": 0.5, "patience": 2, "threshold": 0.01},
    {"patience": 1, "threshold_mode": "abs", "threshold": 0.05, "cooldown": 2, "min_lr": [0.02, 1e-3]},
    {"mode": "max", "threshold_mode": "abs", "factor": 0.3, "patience": 0, "min_lr": 0.004, "eps": 1e-3},
    {"factor": 0.7, "patience": 3, "cooldown": 1, "threshold": 0.0},
]
PLATEAU_STEPS = 60


def plateau_metrics(rng: np.random.Generator) -> np.ndarray:
    """A loss-like metric: falling, then flat with noise, with repeats and a NaN."""
    trend = np.concatenate([np.linspace(2.0, 1.0, 15), np.full(PLATEAU_STEPS - 15, 1.0)])
    metrics = trend + rng.normal(0.0, 0.02, PLATEAU_STEPS)
    metrics[20:24] = metrics[19]  # exactly the best again: not an improvement
    metrics[40] = np.nan
    return metrics


def generate_plateau() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(17)
    arrays: dict[str, np.ndarray] = {}
    meta = {"cases": PLATEAU_CASES, "base_lrs": [0.1, 0.03], "torch": torch.__version__.split("+")[0]}
    arrays["meta"] = np.array(json.dumps(meta, sort_keys=True))
    for index, case in enumerate(PLATEAU_CASES):
        metrics = plateau_metrics(rng)
        w, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))
        optimizer = torch.optim.SGD([{"params": [w]}, {"params": [b], "lr": 0.03}], lr=0.1)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **case)
        lrs = [scheduler.get_last_lr()]
        for metric in metrics:
            optimizer.step()
            scheduler.step(float(metric))
            lrs.append(scheduler.get_last_lr())
        arrays[f"case{index}/metrics"] = metrics
        arrays[f"case{index}/lrs"] = np.array(lrs, np.float64)
    return arrays


PLATEAU = "reduce_lr_on_plateau"


def main(argv: list[str]) -> None:
    names = argv or [*SCENARIOS, PLATEAU]
    unknown = [n for n in names if n not in SCENARIOS and n != PLATEAU]
    if unknown:
        raise SystemExit(f"unknown fixtures {unknown}; known: {[*SCENARIOS, PLATEAU]}")
    for name in names:
        path = write_npz(REFERENCE_DIR / f"{name}.npz", generate_plateau() if name == PLATEAU else generate(name))
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
