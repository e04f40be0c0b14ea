"""PyTorch's values for the composite ops and losses (tests/reference/ops/<file>.npz, written by
scripts/make_composite_references.py), and the checks that test_composites.py and test_losses.py
run on them.

A case is an expression that reads the same in PyTorch and here ("F.smooth_l1_loss(x, y,
beta=0.5)", "torch.einsum('bij,bjk->bik', a, b)"): it is evaluated with `torch` standing for
`meganeura` and `F` for `meganeura.functional`, so each one also checks the signature. Three
checks per case:

- `check_against_torch`: the traced graph on the numpy interpreter in float64 gives PyTorch's
  results (NaN and ±inf included) and, by autodiff, PyTorch's gradients of Σ_k Σ out_k·r_k;
- `check_gradients_by_differences`: those gradients against central differences of the same
  graph (the op mid-chain: each input is A·p + B of a parameter p);
- `check_on_device`: cases compiled together with `mn.compile` into one training step (a
  parameter per differentiated input, loss Σ out_k·r_k, SGD), run on the device against the
  interpreter (`assert_steps_follow_interpreter`); a case whose values or gradients are not
  finite runs as an inference program whose results are compared with PyTorch's.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
from conftest import assert_steps_follow_interpreter, trace_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.trace import Tracer, tracing

REFERENCE_DIR = Path(__file__).resolve().parent / "reference" / "ops"


@cache
def load(file: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(the cases' meta by name, every array) of tests/reference/ops/<file>.npz."""
    with np.load(REFERENCE_DIR / f"{file}.npz") as data:
        arrays = {key: data[key] for key in data.files}
    return json.loads(str(arrays.pop("meta")))["cases"], arrays


def case_of(file: str, name: str) -> tuple[dict, dict[str, np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """(meta, inputs by name, results, their loss weights r) of one case."""
    cases, arrays = load(file)
    meta = cases[name]
    inputs = {key: arrays[f"{name}/in/{key}"] for key in meta["inputs"]}
    results = [arrays[f"{name}/out/{k}"] for k in range(meta["results"])]
    weights = [arrays[f"{name}/r/{k}"] for k in range(meta["results"])]
    return meta, inputs, results, weights


def evaluate(expr: str, tensors: dict):
    """The case's expression on traced tensors: `torch` is meganeura, `F` meganeura.functional."""
    value = eval(expr, {"torch": mn, "F": F, "math": math}, dict(tensors))
    return list(value) if isinstance(value, (tuple, list)) else [value]


def dtype_of(value: np.ndarray) -> str:
    return "i32" if value.dtype == np.int32 else "f32"


def traced_case(file: str, name: str):
    """The case's graph: outputs out<k>, loss = Σ_k Σ out_k·r_k, and grad_<input> of each
    differentiated input (a param leaf); the feeds (inputs and r<k>) and the params."""
    meta, inputs, results, weights = case_of(file, name)
    tracer = Tracer()
    feeds, params = {}, {}
    with tracing(tracer):
        leaves = {}
        for key, value in inputs.items():
            kind = "param" if key in meta["grads"] else "input"
            leaves[key] = trace_leaf(tracer, kind, key, TensorType(value.shape, dtype_of(value)))
            (params if kind == "param" else feeds)[key] = value
        outs = evaluate(meta["expr"], leaves)
        assert len(outs) == len(results), f"{name}: {len(outs)} results, PyTorch gives {len(results)}"
        loss = None
        for k, (out, r) in enumerate(zip(outs, weights, strict=True)):
            assert out.shape == results[k].shape, f"{name}: result {k} is {out.type}, PyTorch's {results[k].shape}"
            tracer.graph.outputs[f"out{k}"] = out.node
            feeds[f"r{k}"] = r
            term = mn.functional.sum(out * trace_leaf(tracer, "input", f"r{k}", TensorType(r.shape)))
            loss = term if loss is None else loss + term
    graph = tracer.graph
    graph.outputs["loss"] = loss.node
    grads = gradients(graph, loss.node, [leaves[key].node for key in meta["grads"]])
    for key in meta["grads"]:
        if grads[leaves[key].node] is not None:
            graph.outputs[f"grad_{key}"] = grads[leaves[key].node]
    return graph, feeds, params


def check_against_torch(file: str, name: str, rtol: float = 1e-9, atol: float = 1e-12) -> None:
    """The interpreter's results and gradients in float64 against PyTorch's."""
    meta, _, results, _ = case_of(file, name)
    graph, feeds, params = traced_case(file, name)
    out = interpret(graph, feeds, params, dtype=np.float64).outputs
    for k, expected in enumerate(results):
        np.testing.assert_allclose(out[f"out{k}"], expected, rtol=rtol, atol=atol, err_msg=f"{name} result {k}")
    _, arrays = load(file)
    for key in meta["grads"]:
        expected = arrays[f"{name}/grad/{key}"]
        got = out.get(f"grad_{key}", np.zeros_like(expected))
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=f"{name} gradient of {key}")


def check_gradients_by_differences(file: str, name: str, seed: int = 0, eps: float = 1e-6) -> float:
    """The worst relative error of autodiff's gradients of the case, each differentiated input
    being A·p + B (a parameter p mid-chain), against central differences in float64."""
    meta, inputs, _, weights = case_of(file, name)
    rng = np.random.default_rng(seed)
    tracer = Tracer()
    values, params, nodes = {}, {}, {}
    with tracing(tracer):
        leaves = {}
        for key, value in inputs.items():
            if key not in meta["grads"]:
                leaves[key] = trace_leaf(tracer, "input", key, TensorType(value.shape, dtype_of(value)))
                values[key] = value
                continue
            p = trace_leaf(tracer, "param", key, TensorType(value.shape))
            nodes[key] = p.node
            a = trace_leaf(tracer, "input", f"{key}_a", TensorType(value.shape))
            b = trace_leaf(tracer, "input", f"{key}_b", TensorType(value.shape))
            values[f"{key}_a"] = rng.uniform(0.5, 1.5, size=value.shape)
            values[f"{key}_b"] = rng.normal(size=value.shape) * 1e-3
            params[key] = (value - values[f"{key}_b"]) / values[f"{key}_a"]  # A·p + B is the case's input
            leaves[key] = p * a + b
        loss = None
        for k, out in enumerate(evaluate(meta["expr"], leaves)):
            values[f"r{k}"] = weights[k]
            term = mn.functional.sum(out * trace_leaf(tracer, "input", f"r{k}", TensorType(weights[k].shape)))
            loss = term if loss is None else loss + term
    graph = tracer.graph
    graph.outputs["loss"] = loss.node
    grads = gradients(graph, loss.node, [nodes[key] for key in meta["grads"]])
    for key in meta["grads"]:
        if grads[nodes[key]] is not None:
            graph.outputs[f"grad_{key}"] = grads[nodes[key]]
    analytic = interpret(graph, values, params, dtype=np.float64).outputs

    def loss_at(point):
        return float(interpret(graph, values, point, dtype=np.float64).outputs["loss"])

    worst = 0.0
    for key in meta["grads"]:
        numeric = np.zeros_like(params[key])
        for index in np.ndindex(params[key].shape):
            plus = {k: v.copy() for k, v in params.items()}
            minus = {k: v.copy() for k, v in params.items()}
            plus[key][index] += eps
            minus[key][index] -= eps
            numeric[index] = (loss_at(plus) - loss_at(minus)) / (2 * eps)
        got = analytic.get(f"grad_{key}", np.zeros_like(numeric))
        scale = max(np.abs(numeric).max(), 1e-3)
        worst = max(worst, np.abs(got - numeric).max() / scale)
    return worst


def finite_case(file: str, name: str) -> bool:
    """Whether the case's inputs, results and PyTorch's gradients are all finite."""
    meta, inputs, results, _ = case_of(file, name)
    grads = [load(file)[1][f"{name}/grad/{key}"] for key in meta["grads"]]
    return all(np.isfinite(v).all() for v in (*results, *grads, *inputs.values()) if v.dtype != np.int32)


class CaseModel(nn.Module):
    """A parameter per differentiated input of each case, named <case>_<input>."""

    def __init__(self, file: str, names: list[str]) -> None:
        super().__init__()
        for name in names:
            meta, inputs, _, _ = case_of(file, name)
            for key in meta["grads"]:
                setattr(self, f"{name}_{key}", nn.Parameter(inputs[key].astype(np.float32)))


def case_loss(file: str, names: list[str]):
    """The loss of a program running several cases: Σ over the cases of Σ_k Σ out_k·r_k."""

    def loss(model, **arrays):
        total = None
        for name in names:
            meta, inputs, _, _ = case_of(file, name)
            tensors = {
                key: getattr(model, f"{name}_{key}") if key in meta["grads"] else arrays[f"{name}__{key}"]
                for key in inputs
            }
            for k, out in enumerate(evaluate(meta["expr"], tensors)):
                term = F.sum(out * arrays[f"{name}__r{k}"])
                total = term if total is None else total + term
        return total

    return loss


def case_feeds(file: str, names: list[str]) -> dict[str, np.ndarray]:
    """The non-parameter inputs and the weights r<k> of the cases, as f32 (or i32) arrays."""
    feeds = {}
    for name in names:
        meta, inputs, _, weights = case_of(file, name)
        for key, value in inputs.items():
            if key not in meta["grads"]:
                feeds[f"{name}__{key}"] = value if value.dtype == np.int32 else value.astype(np.float32)
        for k, r in enumerate(weights):
            feeds[f"{name}__r{k}"] = r.astype(np.float32)
    return feeds


def spec_of(value: np.ndarray):
    return (mn.i32 if value.dtype == np.int32 else mn.f32)[value.shape]


def check_on_device(file: str, names: list[str]) -> None:
    """The cases compiled into one training step (SGD) and run on the device against the
    interpreter; a case with non-finite inputs or results alone as an inference program, its
    results against PyTorch's."""
    training = [name for name in names if finite_case(file, name)]
    if training:
        feeds = case_feeds(file, training)
        program = mn.compile(
            CaseModel(file, training),
            loss=case_loss(file, training),
            inputs={key: spec_of(value) for key, value in feeds.items()},
            optimizer=optim.SGD(lr=0.1),
        )
        assert_steps_follow_interpreter(program, [feeds])
    for name in sorted(set(names) - set(training)):
        check_results_on_device(file, name)


class Expression(nn.Module):
    def __init__(self, expr: str) -> None:
        super().__init__()
        self.expr = expr

    def forward(self, **tensors):
        return tuple(evaluate(self.expr, tensors))


def check_results_on_device(file: str, name: str) -> None:
    """One case as an inference program on the device: its results against PyTorch's (NaN, ±inf)."""
    meta, inputs, results, _ = case_of(file, name)
    feeds = {key: value if value.dtype == np.int32 else value.astype(np.float32) for key, value in inputs.items()}
    program = mn.compile(Expression(meta["expr"]), inputs={key: spec_of(value) for key, value in feeds.items()})
    got = program(**feeds)
    got = list(got) if isinstance(got, tuple) else [got]
    for k, expected in enumerate(results):
        np.testing.assert_allclose(got[k], expected, rtol=1e-5, atol=1e-5, err_msg=f"{name} result {k}")
