"""What the tests share: building graphs and small traces, random values, the check every rule
test makes, the traced MLP step, and "GPU steps follow the numpy interpreter".

Tests that need a WebGPU adapter (lavapipe counts) carry the `gpu` marker: `pytest -m "not gpu"`
runs the rest on a machine without one. The marker is given here, at collection, to every test
whose code (or a helper's call in it) opens the device: the names in GPU_CALLS; a test that
reaches the device some other way carries it by hand. (`MEGANEURA_ADAPTER=none pytest -m "not
gpu"` shows that the marks are complete: no adapter matches, and nothing unmarked needs one.)

Hypothesis runs derandomized (a fixed seed, the same examples every run, as in CI); set
MEGANEURA_HYPOTHESIS=explore for fresh examples (=audit: fixed examples, no shrinking, for mutation
audits). Every failure found stays as an @example.

Helpers are imported by name (`from conftest import ...`); pytest puts this folder on the path.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.op import checked_type, launches_kernel, operand_types
from meganeura.ir.ops.random import RNG_STATE, rng_state
from meganeura.ir.trace import Tracer, tracing
from meganeura.passes import compile_step
from meganeura.rewrite import optimize
from meganeura.runtime import Executable, default_device
from meganeura.target import GENERIC, Target
from meganeura.tensor import Tensor

RNG = np.random.default_rng(0)

AUDIT_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(  # for a mutation audit: a failing example is enough, no shrinking
    "audit", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=AUDIT_PHASES
)
settings.load_profile(os.environ.get("MEGANEURA_HYPOTHESIS", "ci"))
PROPERTY = settings(max_examples=12)

# Calls that open the WebGPU device: a test is marked `gpu` if it makes one, or a function of its
# module (or of this file) that it calls does, a few calls deep.
GPU_CALLS = re.compile(r"\b(run_gpu|default_device|Executable|train_step)\(|mn\.compile\(|\bcheck\(|\bprogram\(")
CALLED = re.compile(r"\b([A-Za-z_]\w*)\(")


def opens_the_device(function, namespaces: list[dict], depth: int = 3, seen: set | None = None) -> bool:
    seen = set() if seen is None else seen
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    if GPU_CALLS.search(source):
        return True
    if depth == 0:
        return False
    for name in set(CALLED.findall(source)) - seen:
        seen.add(name)
        for namespace in namespaces:
            callee = namespace.get(name)
            if inspect.isfunction(callee) and opens_the_device(callee, namespaces, depth - 1, seen):
                return True
    return False


def pytest_collection_modifyitems(config, items) -> None:
    here = globals()
    for item in items:
        function = getattr(item, "function", None)
        if function is None or item.get_closest_marker("gpu"):
            continue
        if opens_the_device(function, [vars(item.module), here]):
            item.add_marker(pytest.mark.gpu)


dims = st.integers(min_value=1, max_value=5)
seeds = st.integers(0, 2**16)


# ---------------------------------------------------------------------------------------------
# Building graphs


def node(graph: Graph, op: str, inputs=(), source: str = "", **attrs) -> int:
    """Append a node with its op's canonical attributes and the type its shape rule infers."""
    canonical, value_type = checked_type(op, operand_types(graph, inputs), attrs)
    return graph.add(op, inputs, value_type, canonical, (source,) if source else ())


def emit(graph: Graph, op: str, inputs: list[int], **attrs) -> int:
    """A new `op` node of `graph`, typed by the op table."""
    return node(graph, op, inputs, **attrs)


def leaf(graph: Graph, name: str, shape: tuple[int, ...], kind: str = "input", dtype: str = "f32") -> int:
    """Append an input (or param/state) leaf."""
    return node(graph, kind, name=name, shape=tuple(shape), dtype=dtype)


def typed_leaf(graph: Graph, kind: str, name: str, shape: tuple[int, ...], dtype: str = "f32") -> int:
    """A new input/param/state leaf of `graph` (kind first)."""
    return leaf(graph, name, shape, kind, dtype)


def const(graph: Graph, value: float) -> int:
    """A new scalar f32 constant of `graph`."""
    return node(graph, "const", value=float(value))


def matmul(graph: Graph, a: int, b: int, transpose_a=False, transpose_b=False, source="") -> int:
    return node(graph, "matmul", (a, b), source, transpose_a=transpose_a, transpose_b=transpose_b)


def operands(graph: Graph, batch: tuple[int, ...], m: int, k: int, n: int, ta: bool, tb: bool) -> tuple[int, int]:
    """Two fresh input leaves a, b shaped for matmul(a, b, ta, tb) → [*batch, m, n]."""
    a = leaf(graph, "a", (*batch, k, m) if ta else (*batch, m, k))
    b = leaf(graph, "b", (*batch, n, k) if tb else (*batch, k, n))
    return a, b


def trace_leaf(tracer: Tracer, kind: str, name: str, type: TensorType) -> Tensor:
    """A new leaf of a trace, as the DSL's Tensor."""
    return Tensor(tracer, tracer.leaf(kind, name, type))


# ---------------------------------------------------------------------------------------------
# Reading results


def ops(graph: Graph) -> list[str]:
    """The ops of the live nodes, in graph order."""
    live = graph.live_ids()
    return [n.op for n in graph if n.id in live]


def kernels(graph: Graph) -> int:
    return sum(1 for op in ops(graph) if launches_kernel(op))


def live_nodes(graph: Graph, op: str):
    live = graph.live_ids()
    return [n for n in graph if n.id in live and n.op == op]


def random_values(graph: Graph, seed: int = 0, positive: bool = False):
    """Random inputs, params and states for every leaf of a graph (i32 leaves get small ints)."""
    rng = np.random.default_rng(seed)
    values = {"input": {}, "param": {}, "state": {}}
    for n in graph:
        if n.op not in values:
            continue
        if n.dtype == "i32":
            value = rng.integers(0, 3, n.shape).astype(np.int32)
        else:
            value = rng.normal(size=n.shape).astype(np.float32)
            if positive:
                value = np.abs(value) + np.float32(0.5)
        values[n.op][n.attr("name")] = value
    return values["input"], values["param"], values["state"]


def assert_same_results(before: Graph, after: Graph, inputs, params=None, states=None, tol=1e-5) -> None:
    """Both graphs give the same outputs and updates through the interpreter (float32 tolerance)."""
    expected = interpret(before, inputs, params, states)
    actual = interpret(after, inputs, params, states)
    assert expected.outputs.keys() == actual.outputs.keys()
    assert expected.updates.keys() == actual.updates.keys()
    for kind in ("outputs", "updates"):
        for name, value in getattr(expected, kind).items():
            np.testing.assert_allclose(getattr(actual, kind)[name], value, rtol=tol, atol=tol, err_msg=name)


def check_rewrite(graph: Graph, rule: str | None = None, seed: int = 0, positive: bool = False, **options):
    """Optimize, check the results are unchanged (and that `rule` matched); the new graph and report."""
    rewritten, report = optimize(graph, **options)
    if rule is not None:
        assert report.rule(rule).matches > 0, str(report)
    assert_same_results(graph, rewritten, *random_values(graph, seed, positive))
    assert report.cost_after.units <= report.cost_before.units
    return rewritten, report


# ---------------------------------------------------------------------------------------------
# Programs: GPU steps against the interpreter


def interpreter_steps(program, feeds: list[dict[str, np.ndarray]]) -> tuple[list[float], dict[str, np.ndarray]]:
    """The program's training steps on the numpy interpreter (its traced, unfused graph), from its
    current parameters and its initial optimizer state (and its RNG's next steps): the losses and
    the final parameters. Before step k the groups' hyper-parameter vectors get update k's values,
    as Program.write_hypers writes them."""
    params = program.state_dict()
    states = dict(program.traced.initial_states)
    optimizer = program.traced.optimizer
    losses = []
    for step, feed in enumerate(feeds, start=1):
        if optimizer is not None:
            states |= optimizer.hyper_values(step)
        if program.rng_seed is not None:  # the RNG state the device's run `step` will draw from
            states[RNG_STATE] = rng_state(program.rng_seed, program.rng_step + step - 1)
        result = interpret(program.graph, feed, params, {**states, **params})  # module buffers are states
        losses.append(float(result.outputs["loss"]))
        for name, value in result.updates.items():
            (params if name in params else states)[name] = value
    return losses, params


def interpreted_steps(traced, feeds: list[dict[str, np.ndarray]], dtype=np.float64):
    """A traced training step (compiler.trace_step, no device) taken once per feed on the numpy
    interpreter in `dtype`, from the model's values and the optimizer's initial state: the losses
    and the final parameters and buffers (a float64 run to compare with PyTorch's float64 one).
    Before update k the groups' hyper-parameter vectors get its values (Program.write_hypers)."""
    params = {name: p.numpy().astype(dtype) for name, p in traced.parameters.items()}
    states = {name: np.asarray(value, dtype) for name, value in traced.initial_states.items()}
    losses = []
    for step, feed in enumerate(feeds, start=1):
        if traced.optimizer is not None:
            states |= {name: np.asarray(value, dtype) for name, value in traced.optimizer.hyper_values(step).items()}
        result = interpret(traced.graph, feed, params, {**states, **params}, dtype=dtype)  # buffers are states
        losses.append(float(result.outputs["loss"]))
        for name, value in result.updates.items():
            (params if name in params else states)[name] = value
    return losses, params


UPDATE_RTOL = 5e-4  # float32 against the interpreter: up to 5e-5 over this suite (measured 2026-12-01)


def assert_steps_follow_interpreter(program, feeds: list[dict[str, np.ndarray]]) -> list[float]:
    """Train on `feeds` on the GPU and on the interpreter; the losses (rtol 1e-4) and, per tensor,
    the updates p_k − p_0 relative to their size (‖Δgpu − Δinterpreter‖ / ‖Δinterpreter‖ ≤
    UPDATE_RTOL) must agree. Comparing the parameters themselves would hide a wrong weight decay:
    it moves a parameter by lr·wd·p per step, ~1e-4 of p. Returns the GPU losses."""
    start = program.state_dict()
    expected_losses, expected_params = interpreter_steps(program, feeds)
    losses = [program.train_step(**feed) for feed in feeds]
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-4, atol=1e-5)
    for name, value in program.state_dict().items():
        moved = expected_params[name].astype(np.float64) - start[name]
        error = np.linalg.norm(value - start[name] - moved) / max(np.linalg.norm(moved), 1e-12)
        assert error <= UPDATE_RTOL, f"{name}: update differs from the interpreter's by {error:.2e} of its size"
    return losses


# ---------------------------------------------------------------------------------------------
# The traced MLP training step


class MLP(nn.Module):
    def __init__(self, n_in=6, hidden=5, n_out=3, activation=F.relu):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, n_out)
        self.activation = activation

    def forward(self, x):
        return self.fc2(self.activation(self.fc1(x)))


def ce_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def mlp_step(activation=F.relu, batch=4, n_in=6, hidden=5, n_out=3, optimizer=None):
    """The traced training step (forward, backward, optimizer) of a 2-layer MLP, and its bound values."""
    model = MLP(n_in, hidden, n_out, activation)
    optimizer = optimizer or optim.Adam(lr=1e-2)
    traced = trace_step(model, ce_loss, {"x": mn.f32[batch, n_in], "y": mn.i32[batch]}, optimizer)
    rng = np.random.default_rng(0)
    inputs = {"x": rng.normal(size=(batch, n_in)).astype(np.float32), "y": rng.integers(0, n_out, batch)}
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    return traced.graph, inputs, params, traced.initial_states


# ---------------------------------------------------------------------------------------------
# Kernels: one-op graphs on the GPU against the interpreter


def one_op(op: str, shapes: list[tuple[int, ...]], dtypes: list[str] | None = None, **attrs) -> Graph:
    """A graph `out = op(x0, x1, ...)` whose operands are inputs."""
    graph = Graph()
    dtypes = dtypes or ["f32"] * len(shapes)
    inputs = [typed_leaf(graph, "input", f"x{i}", s, dt) for i, (s, dt) in enumerate(zip(shapes, dtypes, strict=True))]
    graph.outputs["out"] = emit(graph, op, inputs, **attrs)
    return graph


def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (scale * RNG.normal(size=shape)).astype(np.float32)


def run_gpu(
    graph: Graph, inputs: dict, params: dict | None = None, states: dict | None = None, target: Target = GENERIC
) -> Executable:
    """`graph` lowered for `target` (the generic GPU's kernels unless told) on the test device."""
    parameters = {name: nn.Parameter(value) for name, value in (params or {}).items()}
    return Executable(compile_step(graph, target), default_device(), parameters, dict(states or {}))


def check(
    graph: Graph, inputs: dict, rtol: float = 1e-5, atol: float = 1e-5, target: Target = GENERIC, states=None
) -> Executable:
    """Run `graph` on the GPU (its kernels for `target`) and compare every output with the
    interpreter in float64 (`states`: the values of its state leaves, such as the RNG state)."""
    executable = run_gpu(graph, inputs, states=states, target=target)
    got = executable.run(inputs, read=tuple(graph.outputs))
    expected = interpret(graph, inputs, states=states, dtype=np.float64).outputs
    for name, value in expected.items():
        assert got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=name)
    return executable


# ---------------------------------------------------------------------------------------------
# Gradients: finite differences in float64, in the middle of a chain


def gradcheck(op, shapes, rng, positive=False, labels=None, away_from_zero=False, states=None):
    """Compare autodiff's gradients of a mid-chain `op` with central differences; return max rel error
    (`states`: the values of the state leaves the op reads, such as the RNG state)."""
    tracer = Tracer()
    params, values = [], {}
    with tracing(tracer):
        chained = []
        for index, shape in enumerate(shapes):
            name = f"p{index}"
            leaf = trace_leaf(tracer, "param", name, TensorType(shape))
            params.append((name, leaf.node))
            scale = trace_leaf(tracer, "input", f"a{index}", TensorType(shape))
            shift = trace_leaf(tracer, "input", f"b{index}", TensorType(shape))
            chained.append(leaf * scale + shift)
            if positive or away_from_zero:
                # A·p + B stays in ±[0.25, 2.4] (positive: [0.25, 2.35]), never near 0 where the op is
                # not smooth or not defined, and the chain factors A and B are not the identity.
                sign = rng.choice([-1, 1], size=shape) if away_from_zero else 1
                values[f"a{index}"] = rng.uniform(0.5, 1.5, size=shape)
                values[f"b{index}"] = rng.uniform(0.0, 0.1, size=shape) * sign
                values[name] = np.asarray(rng.uniform(0.5, 1.5, size=shape) * sign, dtype=np.float64)
            else:
                values[f"a{index}"] = rng.uniform(0.5, 1.5, size=shape)
                values[f"b{index}"] = rng.normal(size=shape) * 0.1
                values[name] = np.asarray(rng.normal(size=shape), dtype=np.float64)
        extra = {}
        if labels is not None:
            label_leaf = trace_leaf(tracer, "input", "labels", TensorType(labels.shape, "i32"))
            extra["labels"] = label_leaf
            values["labels"] = labels
        out = op(*chained, **extra)
        weights = trace_leaf(tracer, "input", "r", out.type)
        values["r"] = rng.normal(size=out.shape)
        loss = F.sum(out * weights) * 0.75
    graph = tracer.graph
    graph.outputs["loss"] = loss.node
    grads = gradients(graph, loss.node, [node for _, node in params])
    for name, node in params:
        if grads[node] is not None:  # None: the loss does not depend on it smoothly (a mask's input)
            graph.outputs[f"grad_{name}"] = grads[node]
    inputs = {k: v for k, v in values.items() if not k.startswith("p")}
    return worst_gradient_error(graph, inputs, {name: values[name] for name, _ in params}, states=states)


def worst_gradient_error(
    graph: Graph, inputs: dict, params: dict[str, np.ndarray], eps: float = 1e-6, states: dict | None = None
) -> float:
    """The worst relative error of the graph's outputs grad_<p> (zero where missing) against
    central differences of its output `loss` in each parameter p, on the interpreter in float64;
    relative to the largest numeric gradient of p, at least 1e-3."""

    def loss_at(point):
        return float(interpret(graph, inputs, point, states, dtype=np.float64).outputs["loss"])

    analytic = interpret(graph, inputs, params, states, dtype=np.float64).outputs
    worst = 0.0
    for name in params:
        numeric = np.zeros_like(params[name], dtype=np.float64)
        for index in np.ndindex(params[name].shape):
            plus = {k: v.copy() for k, v in params.items()}
            minus = {k: v.copy() for k, v in params.items()}
            plus[name][index] += eps
            minus[name][index] -= eps
            numeric[index] = (loss_at(plus) - loss_at(minus)) / (2 * eps)
        got = analytic.get(f"grad_{name}", np.zeros_like(numeric))
        assert got.shape == numeric.shape
        scale = max(np.abs(numeric).max(), 1e-3)
        worst = max(worst, np.abs(got - numeric).max() / scale)
    return worst


def module_at(path: Path):
    """The module of the Python file at `path` (an example, a benchmark or a script), loaded by path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_script(path: Path):
    """The module of a scripts/make_*_references.py, which imports torch: the test is skipped where
    torch is not importable."""
    pytest.importorskip("torch")
    return module_at(path)


def declared_scenarios(script: Path) -> list[str]:
    """The sorted keys of the SCENARIOS dict a reference script declares, read from its source
    (no torch needed)."""
    tree = ast.parse(script.read_text())
    declared = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SCENARIOS" for t in node.targets)
    )
    return sorted(ast.literal_eval(key) for key in declared.keys)


def run_traced(build, inputs: dict[str, np.ndarray], dtype=np.float64) -> dict[str, np.ndarray]:
    """Interpret the graph of `build(**tensors)` (a dict of named outputs) on `inputs`."""
    tracer = Tracer()
    with tracing(tracer):
        tensors = {name: trace_leaf(tracer, "input", name, TensorType(value.shape)) for name, value in inputs.items()}
        for name, value in build(**tensors).items():
            tracer.graph.outputs[name] = value.node
    return interpret(tracer.graph, inputs, dtype=dtype).outputs
