"""The conformance table (tests/conformance.py) against PyTorch's stored values
(tests/reference/conformance.npz, written by scripts/make_conformance_references.py).

Every expression case is traced with meganeura's names standing for torch's (`torch` is meganeura,
`F` meganeura.functional, ...): its float inputs that torch differentiates are parameters, the loss
is Σ_k Σ(out_k · r_k) with torch's cotangents r_k, and autodiff gives the gradients. The numpy
interpreter in float64 must give torch's outputs, gradients (inputs' and a module's parameters')
and module buffers; a selection of the supported cases (conformance.py's docstring) is also
compiled, many to a program (the e-graph, the kernels), and run on the device in float32.
Optimizer cases train a few steps on the device, scheduler cases step on the host, init cases
fill a parameter. A case the table marks unsupported must fail (raise, or differ from torch):
when it starts to pass, the table is out of date. docs/supported-ops.md and the README's
unsupported items are the table's (scripts/conformance_table.py writes them).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import conformance
import numpy as np
import pytest
from conftest import trace_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.ops.random import RNG_STATE, rng_state
from meganeura.ir.trace import Tracer, tracing
from meganeura.passes import compile_step
from meganeura.rewrite import optimize
from meganeura.runtime import Executable, default_device
from meganeura.target import GENERIC

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_PATH = ROOT / "tests" / "reference" / "conformance.npz"
SCRIPT = ROOT / "scripts" / "make_conformance_references.py"
README = ROOT / "README.md"
SUPPORTED = ROOT / "docs" / "supported-ops.md"
CASES = conformance.cases()
NAMESPACE = {"torch": mn, "F": F, "nn": nn, "optim": optim, "lr_scheduler": optim.lr_scheduler, "math": math}
SEED = 40  # the device's and interpreter's RNG seed for the random cases


@cache
def stored() -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """The reference arrays by case id, then by kind (input, out, grad…), then by name."""
    by_case: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    with np.load(REFERENCE_PATH) as data:
        for key in data.files:
            if key == "meta":
                continue
            case_id, rest = key.split("/", 1)  # an id holds no "/" (test_the_table_is_well_formed)
            kind, _, name = rest.partition("/")
            by_case.setdefault(case_id, {}).setdefault(kind, {})[name] = data[key]
    return by_case


def reference(case_id: str, kind: str) -> dict[str, np.ndarray]:
    return stored().get(case_id, {}).get(kind, {})


def flattened(value) -> list:
    """The outputs in order: nested tuples and lists flattened, None left out (as the script does)."""
    if value is None:
        return []
    if isinstance(value, (tuple, list)):
        return [leaf for part in value for leaf in flattened(part)]
    return [value]


# ---------------------------------------------------------------------------------------------
# Tracing an expression case


@dataclass
class TracedCase:
    """What one case added to a trace: the graph's names of its results, by reference key
    ("out/0", "grad/x", "param_grad/weight", "buffer/running_mean"), and the values it binds."""

    case_id: str
    results: dict[str, str] = field(default_factory=dict)  # reference key -> graph output name
    buffers: dict[str, str] = field(default_factory=dict)  # "buffer/<name>" -> state leaf name
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    params: dict[str, np.ndarray] = field(default_factory=dict)
    states: dict[str, np.ndarray] = field(default_factory=dict)
    parameters: dict[str, nn.Parameter] = field(default_factory=dict)  # the module's, by leaf name
    wrt: dict[str, int] = field(default_factory=dict)  # "grad/x" -> the node differentiated
    loss: object = None
    # The case's module, alive as long as the trace: the tracer knows parameters and buffers by
    # id(), which a freed module's would hand on to the next case's.
    module: object = None


def leaf_type(value: np.ndarray) -> TensorType:
    return TensorType(value.shape, "i32" if value.dtype == np.int32 else "f32")


def built_module(case_id: str, case) -> nn.Module:
    """The case's module with torch's state dict loaded and torch's mode."""
    module = eval(case.module, dict(NAMESPACE))
    module.load_state_dict(reference(case_id, "state"))
    module.train(case.train)
    return module


def trace_case(tracer: Tracer, case_id: str, case, prefix: str) -> TracedCase:
    """Trace `case` into `tracer`, its leaves and outputs named with `prefix`."""
    traced = TracedCase(case_id)
    inputs = reference(case_id, "input")
    weights = reference(case_id, "weight")
    differentiated = [
        name for name, v in inputs.items() if v.dtype != np.int32 and (case.grads is None or name in case.grads)
    ]
    scope = dict(NAMESPACE)
    module = traced.module = built_module(case_id, case) if case.module else None
    with tracing(tracer):
        for name, value in inputs.items():
            kind = "param" if name in differentiated else "input"
            leaf = trace_leaf(tracer, kind, prefix + name, leaf_type(value))
            (traced.params if kind == "param" else traced.feeds)[prefix + name] = value
            scope[name] = leaf
            if kind == "param":
                traced.wrt[f"grad/{name}"] = leaf.node
        if module is not None:
            for name, p in module.named_parameters():
                node = tracer.leaf("param", f"{prefix}m.{name}", p.type)
                tracer.bind(p, node)
                traced.parameters[f"{prefix}m.{name}"] = p
                traced.params[f"{prefix}m.{name}"] = p.numpy()
                if p.requires_grad:
                    traced.wrt[f"param_grad/{name}"] = node
            for name, b in module.named_buffers():
                tracer.bind(b, tracer.leaf("state", f"{prefix}m.{name}", b.type))
                traced.states[f"{prefix}m.{name}"] = np.asarray(b.numpy(), np.float32)
                traced.buffers[f"buffer/{name}"] = f"{prefix}m.{name}"
            scope["m"] = module
        outputs = flattened(eval(case.expr, scope))
        expected = reference(case_id, "out")
        if len(outputs) != len(expected):
            raise AssertionError(f"{len(outputs)} outputs, torch gives {len(expected)}")
        for k, out in enumerate(outputs):
            name = f"{prefix}out{k}"
            tracer.graph.outputs[name] = out.node
            traced.results[f"out/{k}"] = name
            if str(k) in weights:
                weight = trace_leaf(tracer, "input", f"{prefix}weight{k}", out.type)
                traced.feeds[f"{prefix}weight{k}"] = weights[str(k)]
                term = F.sum(out * weight)
                traced.loss = term if traced.loss is None else traced.loss + term
    return traced


def differentiate(tracer: Tracer, traced: list[TracedCase], prefixes: list[str]) -> None:
    """Append the gradients of Σ of the cases' losses to each case's differentiated leaves, as outputs."""
    losses = [t.loss for t in traced if t.loss is not None]
    if not losses:
        return
    with tracing(tracer):
        total = losses[0]
        for term in losses[1:]:
            total = total + term
    graph = tracer.graph
    wrt = [node for t in traced for node in t.wrt.values()]
    grads = gradients(graph, total.node, wrt)
    for t, prefix in zip(traced, prefixes, strict=True):
        for key, node in t.wrt.items():
            if grads[node] is not None:
                name = f"{prefix}{key}"
                graph.outputs[name] = grads[node]
                t.results[key] = name


def random_states(graph) -> dict[str, np.ndarray]:
    """The RNG state leaf's value, where the graph draws random numbers."""
    uses_rng = any(n.op == "state" and n.attr("name") == RNG_STATE for n in graph)
    return {RNG_STATE: rng_state(SEED, 0)} if uses_rng else {}


# ---------------------------------------------------------------------------------------------
# Comparing with torch


def scale_of(value: np.ndarray) -> float:
    finite = np.abs(value[np.isfinite(value)]) if value.dtype.kind == "f" else np.abs(value)
    return max(1.0, float(finite.max())) if finite.size else 1.0


def value_problems(key: str, got, expected: np.ndarray, rtol: float, atol: float) -> list[str]:
    """Why `got` is not torch's `expected` (empty: it is)."""
    if got is None:
        if key.startswith(("grad/", "param_grad/")) and not np.any(expected):
            return []  # not differentiable here (floor, sign): no gradient, torch's zeros
        return [f"{key}: missing (torch gives {expected.shape})"]
    got = np.asarray(got)
    if got.shape != expected.shape:
        return [f"{key}: shape {got.shape}, torch's {expected.shape}"]
    if expected.dtype == np.int32 and not key.startswith("buffer/"):
        if got.dtype.kind not in "iu":
            return [f"{key}: dtype {got.dtype}, torch's is an integer"]
        if not np.array_equal(got, expected):
            return [f"{key}: {got.ravel()[:12]} ≠ torch's {expected.ravel()[:12]}"]
        return []
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    try:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol * scale_of(expected), equal_nan=True)
    except AssertionError as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        return [f"{key}: " + "; ".join(lines[1:5])]
    return []


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap of the empirical CDFs."""
    a, b = np.sort(a.ravel()), np.sort(b.ravel())
    points = np.concatenate([a, b])
    return float(
        np.abs(np.searchsorted(a, points, "right") / a.size - np.searchsorted(b, points, "right") / b.size).max()
    )


def sample_problems(key: str, got, expected: np.ndarray) -> list[str]:
    """Whether `got` could be drawn from the distribution torch's sample `expected` came from: the
    same shape, KS statistic and moments within ~4 standard errors, and, where torch's values are
    few (dropout's 0 and 1/(1 − p)), only those values."""
    if got is None:
        return [f"{key}: missing"]
    # In float32, both: meganeura's 1/(1 − p) is a float32 constant, torch's (float64) is not.
    got, expected = np.asarray(got, np.float32).astype(np.float64), expected.astype(np.float32).astype(np.float64)
    if got.shape != expected.shape:
        return [f"{key}: shape {got.shape}, torch's {expected.shape}"]
    n = expected.size
    problems = []
    bound = 2.5 * math.sqrt(2 / n)  # KS, both samples of n: p ≈ 4e-6 under the same distribution
    if (d := ks_statistic(got, expected)) > bound:
        problems.append(f"{key}: KS statistic {d:.3f} > {bound:.3f}")
    spread = max(float(expected.std()), 1e-12)
    if abs(got.mean() - expected.mean()) > 4 * spread * math.sqrt(2 / n):
        problems.append(f"{key}: mean {got.mean():.4f}, torch's {expected.mean():.4f}")
    if abs(got.std() / spread - 1) > 4 * math.sqrt(2 / n) * 2:
        problems.append(f"{key}: std {got.std():.4f}, torch's {spread:.4f}")
    levels = np.unique(expected)
    if levels.size <= 4:  # each value as often as torch's, within 4 standard errors
        strays = got[~np.isclose(got[..., None], levels, rtol=1e-6, atol=1e-7).any(-1)]
        if strays.size:
            problems.append(f"{key}: values {np.unique(strays)[:5]} outside torch's {levels}")
        for level in levels:
            share, got_share = np.mean(expected == level), np.mean(np.isclose(got, level, rtol=1e-6, atol=1e-7))
            if abs(got_share - share) > 4 * math.sqrt(2 * share * (1 - share) / n) + 1 / n:
                problems.append(f"{key}: {level:g} in a fraction {got_share:.4f}, torch's {share:.4f}")
    return problems


def case_problems(case_id: str, case, got: dict[str, np.ndarray], device: bool = False) -> list[str]:
    """Every difference between meganeura's results `got` (by reference key) and torch's."""
    rtol, atol = (case.device_rtol, case.device_atol) if device else (case.rtol, case.atol)
    problems = []
    for k, expected in reference(case_id, "out").items():
        key = f"out/{k}"
        if case.compare == "sample":
            problems += sample_problems(key, got.get(key), expected)
        else:
            problems += value_problems(key, got.get(key), expected, rtol, atol)
    if case.compare != "values":
        return problems
    for kind in ("grad", "param_grad", "buffer"):
        expected_all = reference(case_id, kind)
        for name, expected in expected_all.items():
            problems += value_problems(f"{kind}/{name}", got.get(f"{kind}/{name}"), expected, rtol, atol)
    for key, value in got.items():  # a gradient torch does not have (a comparison's input) must be 0
        kind, _, name = key.partition("/")
        if kind in ("grad", "param_grad") and name not in reference(case_id, kind) and np.any(value != 0):
            problems.append(f"{key}: nonzero where torch has no gradient")
    return problems


# ---------------------------------------------------------------------------------------------
# The numpy interpreter, in float64


def interpreted(case_id: str, case) -> dict[str, np.ndarray]:
    """The case's results on the numpy interpreter in float64, by reference key."""
    tracer = Tracer()
    traced = trace_case(tracer, case_id, case, "")
    differentiate(tracer, [traced], [""])
    graph = tracer.graph
    states = traced.states | random_states(graph)
    with np.errstate(all="ignore"):  # the NaN and ±inf cases
        result = interpret(graph, traced.feeds, traced.params, {**states, **traced.params}, dtype=np.float64)
    got = {key: result.outputs[name] for key, name in traced.results.items()}
    for key, leaf in traced.buffers.items():
        got[key] = result.updates.get(leaf, states[leaf])
    return got


def expression_problems(case_id: str, case) -> list[str]:
    return case_problems(case_id, case, interpreted(case_id, case))


# ---------------------------------------------------------------------------------------------
# Optimizers (on the device), schedulers and nn.init (on the host)


class Pair(nn.Module):
    """The two parameters every optimizer case trains (tests/conformance.py's OptimizerCase)."""

    def __init__(self, p: np.ndarray, q: np.ndarray) -> None:
        super().__init__()
        self.p = nn.Parameter(p)
        self.q = nn.Parameter(q)


def pair_loss(model: Pair, s, a, b):
    return ((model.p * s - a) ** 2).sum() * 0.5 + (model.q * b).sum()


def optimizer_scope(p, q) -> dict:
    return dict(NAMESPACE) | {"params": [p, q], "p": p, "q": q}


def optimizer_problems(case_id: str, case) -> list[str]:
    """Train `case.steps` steps on the device; each step's parameters against torch's, as
    ‖Δ − Δ_torch‖ / ‖Δ_torch‖ with Δ the move from the start."""
    init = reference(case_id, "init")
    model = Pair(init["p"], init["q"])
    scope = optimizer_scope(model.p, model.q)
    opt = eval(case.optimizer, scope)
    sched = eval(case.scheduler, scope | {"opt": opt}) if case.scheduler else None
    specs = {"s": mn.f32[3, 4], "a": mn.f32[3, 4], "b": mn.f32[4]}
    program = mn.compile(model, loss=pair_loss, inputs=specs, optimizer=opt)
    problems = []
    for step in range(case.steps):
        program.train_step(**reference(case_id, f"feed{step}"))
        if sched is not None:
            sched.step()
        state = program.state_dict()
        for name, expected in reference(case_id, f"step{step}").items():
            moved = expected - init[name]
            error = np.linalg.norm(state[name] - init[name] - moved) / max(np.linalg.norm(moved), 1e-12)
            if not error <= case.device_rtol:
                problems.append(f"step {step} {name}: update differs from torch's by {error:.2e} of its size")
    return problems


def scheduler_problems(case_id: str, case) -> list[str]:
    p, q = nn.Parameter(np.zeros((3, 4))), nn.Parameter(np.zeros(4))
    scope = optimizer_scope(p, q)
    opt = eval(case.optimizer, scope)
    sched = eval(case.scheduler, scope | {"opt": opt})
    rates = [[group["lr"] for group in opt.param_groups]]
    for step in range(case.steps):
        sched.step(case.metrics[step]) if case.metrics else sched.step()
        rates.append([group["lr"] for group in opt.param_groups])
    return value_problems("lr", np.array(rates, np.float64), reference(case_id, "lr")[""], 1e-13, 0.0)


def distribution_problems(key: str, got: dict, expected: dict) -> list[str]:
    """Whether two distribution summaries (conformance.distribution_summary) could be of one
    distribution: the empirical CDFs at torch's quantiles (a KS statistic), the mean, the std and
    the fraction of zeros within ~4 standard errors of a two-sample difference."""
    mean, std, kurtosis, zeros, low, high, n = expected["moments"]
    got_mean, got_std, _, got_zeros, *_ = got["moments"]
    problems = []
    if (gap := np.abs(got["cdf"] - expected["cdf"]).max()) > 2.5 * math.sqrt(2 / n):
        problems.append(f"{key}: the CDFs differ by {gap:.4f} (KS)")
    if abs(got_mean - mean) > 4 * std * math.sqrt(2 / n):
        problems.append(f"{key}: mean {got_mean:.5f}, torch's {mean:.5f}")
    if abs(got_std / std - 1) > 4 * math.sqrt(2 * (kurtosis - 1) / (4 * n)):
        problems.append(f"{key}: std {got_std:.5f}, torch's {std:.5f}")
    if abs(got_zeros - zeros) > 4 * math.sqrt(2 * zeros * (1 - zeros) / n) + 1 / n:
        problems.append(f"{key}: a fraction {got_zeros:.4f} of zeros, torch's {zeros:.4f}")
    return problems


def init_problems(case_id: str, case) -> list[str]:
    if not case.shape:
        return value_problems("value", eval(case.expr, dict(NAMESPACE)), reference(case_id, "value")[""], 1e-15, 0.0)
    nn.manual_seed(conformance.case_seed(case_id))
    w = nn.Parameter(np.zeros(case.shape, np.float32))
    draws = []
    for _ in range(1 if case.compare == "values" else conformance.draws_needed(case.shape)):
        eval(case.expr, dict(NAMESPACE) | {"w": w})
        draws.append(w.numpy().astype(np.float64))
    if case.compare == "values":
        return value_problems("w", draws[0], reference(case_id, "value")[""], 1e-7, 0.0)
    expected = {kind: reference(case_id, kind)[""] for kind in ("points", "cdf", "moments")}
    got = conformance.distribution_summary(np.concatenate([d.ravel() for d in draws]), expected["points"])
    problems = distribution_problems("w", got, expected)
    if case.compare == "bounded":  # the support's ends: within 0.1% of its width of torch's
        (*_, low, high, _), (*_, got_low, got_high, _) = expected["moments"], got["moments"]
        if max(abs(got_low - low), abs(got_high - high)) > 1e-3 * (high - low):
            problems.append(f"w: values in [{got_low:.5f}, {got_high:.5f}], torch's in [{low:.5f}, {high:.5f}]")
    if case.compare == "gram":  # orthogonal rows (or columns), scaled by the gain, as torch's
        rows = draws[0].reshape(case.shape[0], -1)
        gram = rows @ rows.T if rows.shape[0] <= rows.shape[1] else rows.T @ rows
        problems += value_problems("W·Wᵀ", gram, reference(case_id, "gram")[""], 0.0, 1e-5)
    return problems


# ---------------------------------------------------------------------------------------------
# One test per case


def problems_of(case_id: str, case) -> list[str]:
    kind = type(case).__name__
    if kind == "Case":
        return expression_problems(case_id, case)
    if kind == "OptimizerCase":
        return optimizer_problems(case_id, case)
    if kind == "SchedulerCase":
        return scheduler_problems(case_id, case)
    return init_problems(case_id, case)


def unsupported_reason(item, case) -> str:
    return item.unsupported or case.unsupported


HOST_CASES = sorted(case_id for case_id, (_, case) in CASES.items() if type(case).__name__ != "OptimizerCase")
OPTIMIZER_CASES = sorted(case_id for case_id, (_, case) in CASES.items() if type(case).__name__ == "OptimizerCase")


def check_case(case_id: str) -> None:
    item, case = CASES[case_id]
    reason = unsupported_reason(item, case)
    try:
        problems = problems_of(case_id, case)
    except Exception as error:  # noqa: BLE001  (a case that cannot be traced is a failure to report)
        if reason:
            return  # unsupported, and it says so
        raise AssertionError(f"{case_id}: {type(error).__name__}: {error}") from error
    if reason:
        assert problems, f"{case_id} now matches torch: remove its unsupported mark ({reason})"
        return
    assert not problems, f"{case_id} ({getattr(case, 'expr', '')}) differs from torch:\n" + "\n".join(problems)


@pytest.mark.parametrize("case_id", HOST_CASES)
def test_case_matches_pytorch(case_id):
    """Values and gradients on the float64 interpreter (schedulers' rates, inits' fills on the host)."""
    check_case(case_id)


@pytest.mark.parametrize("case_id", OPTIMIZER_CASES)
def test_optimizer_steps_match_pytorch(case_id):
    """A few training steps on the device (mn.compile, train_step) against torch's parameters."""
    check_case(case_id)


# ---------------------------------------------------------------------------------------------
# The supported expression cases on the device, many to a program


def runs_on_device(item, case_id: str, case) -> bool:
    """Whether a supported expression case runs on the device (conformance.py's docstring: the
    item's first supported case, special values, random numbers, or device=True)."""
    if case.device is not None:
        return case.device
    supported = [i for i, c in zip(item.case_ids(), item.cases, strict=True) if not unsupported_reason(item, c)]
    special = any(
        d[0] == "special" or (d[0] == "values" and not np.all(np.isfinite(d[1]))) for d in case.inputs.values()
    )
    return case_id == supported[0] or special or case.compare == "sample"


def device_cases(category: str) -> list[str]:
    return [
        case_id
        for case_id, (item, case) in CASES.items()
        if item.category == category and type(case).__name__ == "Case" and not case.device_fails
        and not unsupported_reason(item, case) and runs_on_device(item, case_id, case)
    ]  # fmt: skip


PROGRAM_SIZE = 48  # cases per compiled program: few programs (compiling costs ~1 s each), fast e-graphs
DEVICE_GROUPS = {
    f"{category}{index // PROGRAM_SIZE}": ids[index : index + PROGRAM_SIZE]
    for category in ("tensor", "functional", "loss", "module")
    for ids in [device_cases(category)]
    for index in range(0, len(ids), PROGRAM_SIZE)
}


def device_results(case_ids: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """The cases traced into one graph (leaves named c<k>.…), rewritten by the e-graph, compiled
    and run once on the device: each case's results by reference key."""
    tracer = Tracer()
    prefixes = [f"c{k}." for k in range(len(case_ids))]
    traced = [trace_case(tracer, case_id, CASES[case_id][1], p) for case_id, p in zip(case_ids, prefixes, strict=True)]
    differentiate(tracer, traced, prefixes)
    graph = tracer.graph.pruned()
    fused, _ = optimize(graph, target=GENERIC)
    parameters = {name: nn.Parameter(value) for t in traced for name, value in t.params.items()}
    states = {name: value for t in traced for name, value in t.states.items()} | random_states(graph)
    executable = Executable(compile_step(fused, GENERIC), default_device(), parameters, states)
    feeds = {
        name: np.asarray(v, np.int32 if v.dtype == np.int32 else np.float32)
        for t in traced
        for name, v in t.feeds.items()
    }
    out = executable.run(feeds, read=tuple(fused.outputs))
    results = {}
    for t in traced:
        got = {key: out[name] for key, name in t.results.items()}
        for key, leaf in t.buffers.items():
            got[key] = executable.read_state(leaf) if leaf in fused.updates else states[leaf]
        results[t.case_id] = got
    return results


@pytest.mark.parametrize("group", sorted(DEVICE_GROUPS))
def test_device_matches_pytorch(group):
    """The group's cases compiled into one program and run on the device (float32) against torch."""
    case_ids = DEVICE_GROUPS[group]
    results = device_results(case_ids)
    problems = []
    for case_id in case_ids:
        problems += [
            f"{case_id}: {p}" for p in case_problems(case_id, CASES[case_id][1], results[case_id], device=True)
        ]
    assert not problems, f"{len(problems)} differences on the device:\n" + "\n".join(problems)


DEVICE_FAILURES = sorted(
    case_id
    for case_id, (item, case) in CASES.items()
    if type(case).__name__ == "Case" and case.device_fails and not unsupported_reason(item, case)
)


@pytest.mark.parametrize("case_id", DEVICE_FAILURES)
def test_device_failure_is_still_there(case_id):
    """A case the table says fails on the device (a bug, in the README's limits) still does: alone
    in its program, it raises or differs from torch."""
    case = CASES[case_id][1]
    try:
        problems = case_problems(case_id, case, device_results([case_id])[case_id], device=True)
    except Exception:  # noqa: BLE001  (the failure the table records)
        return
    assert problems, f"{case_id} now passes on the device: remove device_fails ({case.device_fails})"


# ---------------------------------------------------------------------------------------------
# The table, the reference file and the documents agree


def test_reference_file_is_current_with_the_table():
    """Every case of the table is in the reference file, as it reads now (no torch needed)."""
    with np.load(REFERENCE_PATH) as data:
        meta = json.loads(str(data["meta"]))
    current = {case_id: case.fingerprint() for case_id, (_, case) in CASES.items()}
    changed = sorted(k for k in current if meta.get(k) != current[k]) + sorted(set(meta) - set(current))
    assert not changed, f"regenerate tests/reference/conformance.npz ({SCRIPT.name}): {changed[:10]}"


def test_reference_file_regenerates_identically():
    """With torch installed, the script writes the stored file again (the computed values to the
    last bits another torch build or CPU rounds differently)."""
    from test_torch_reference import assert_regenerated

    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("make_conformance_references", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert_regenerated(script.generate(), REFERENCE_PATH)


def block(path: Path, name: str) -> str:
    match = re.search(rf"<!-- {name}: begin -->\n(.*?)<!-- {name}: end -->", path.read_text(), re.S)
    assert match, f"{path.name} has no <!-- {name}: begin/end --> block"
    return match.group(1)


def test_the_docs_list_the_table():
    """docs/supported-ops.md's surface and the README's unsupported items are what the table generates."""
    supported, limits = conformance.markdown_sections()
    assert block(SUPPORTED, "conformance") == supported, "run scripts/conformance_table.py"
    assert block(README, "conformance-limits") == limits, "run scripts/conformance_table.py"


def test_the_table_is_well_formed():
    """Names are unique, categories known, every case's kind fits its category."""
    items = conformance.items()
    names = [item.name for item in items]
    assert len(names) == len(set(names))
    kinds = {"optimizer": "OptimizerCase", "scheduler": "SchedulerCase", "init": "InitCase"}
    for item in items:
        assert item.category in conformance.CATEGORIES, item.name
        assert item.cases, item.name
        for case in item.cases:
            assert type(case).__name__ == kinds.get(item.category, "Case"), item.name
            modes = {"Case": ("values", "sample"), "InitCase": ("values", "sample", "bounded", "gram")}
            assert getattr(case, "compare", "values") in modes.get(type(case).__name__, ("values",)), item.name
        assert "/" not in item.name, f"{item.name}: a case id may hold no '/' (the reference file's separator)"
        if not item.unsupported:  # an item none of whose cases works is unsupported as a whole
            assert any(not case.unsupported for case in item.cases), f"{item.name}: mark the item unsupported"
