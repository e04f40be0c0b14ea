"""Convolutions (grouped, depthwise, dilated, padding="same", 1-D, transposed), pools (ceil mode,
dilation, count_include_pad, divisor_override, adaptive, 1-D) and masked attention against
PyTorch: values and gradients stored by scripts/make_torch_conv_references.py
(tests/reference/conv_pool_attention.npz), on the interpreter in float64 and, for the
convolutions and pools, on the default adapter with the e-graph's kernels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_gpu, trace_leaf

import meganeura.functional as F
from meganeura.ir.autodiff import gradients
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.trace import Tracer, tracing
from meganeura.rewrite import optimize

REFERENCE = np.load(Path(__file__).parent / "reference" / "conv_pool_attention.npz")
CASES = sorted({key.split("/")[0] for key in REFERENCE.files if "/" in key})


def meta_of(case: str) -> dict:
    return json.loads(str(REFERENCE[f"{case}/meta"]))


def traced_case(case: str, leaf_kind: str = "param"):
    """The graph of the case's function, with outputs `out`, `loss` = Σ out·r and `grad/<name>`
    for each differentiated input, and its feeds (a bool mask as 1.0/0.0, passed on as `mask > 0.5`).
    The differentiated inputs are leaves of `leaf_kind`."""
    meta = meta_of(case)
    values = {name: REFERENCE[f"{case}/in/{name}"] for name in meta["inputs"]}
    tracer = Tracer()
    with tracing(tracer):
        leaves = {
            name: trace_leaf(tracer, leaf_kind if name in meta["grads"] else "input", name, TensorType(value.shape))
            for name, value in values.items()
        }
        arguments = [leaves[name] > 0.5 if values[name].dtype == bool else leaves[name] for name in meta["inputs"]]
        out = getattr(F, meta["function"])(*arguments, **meta["kwargs"])
        r = trace_leaf(tracer, "input", "r", out.type)
        loss = F.sum(out * r)
    graph = tracer.graph
    graph.outputs.update(out=out.node, loss=loss.node)
    grads = gradients(graph, loss.node, [leaves[name].node for name in meta["grads"]])
    for name in meta["grads"]:
        graph.outputs[f"grad/{name}"] = grads[leaves[name].node]
    feeds = {name: value.astype(np.float64) for name, value in values.items()}
    feeds["r"] = REFERENCE[f"{case}/r"]
    return graph, feeds, meta


def expected_of(case: str, meta: dict) -> dict[str, np.ndarray]:
    return {"out": REFERENCE[f"{case}/out"], **{f"grad/{n}": REFERENCE[f"{case}/grad/{n}"] for n in meta["grads"]}}


@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_match_pytorch(case):
    graph, feeds, meta = traced_case(case)
    params = {name: feeds.pop(name) for name in meta["grads"]}
    got = interpret(graph, feeds, params, dtype=np.float64).outputs
    for name, value in expected_of(case, meta).items():
        assert got[name].shape == value.shape, name
        np.testing.assert_allclose(got[name], value, rtol=1e-9, atol=1e-10, err_msg=f"{case} {name}")


GPU_CASES = [case for case in CASES if not case.startswith("sdpa")]


@pytest.mark.parametrize("case", GPU_CASES)
def test_the_gpu_plan_matches_pytorch(case):
    """The optimized forward and backward (conv_gemm kernels, pool kernels) on the default adapter."""
    graph, feeds, meta = traced_case(case, leaf_kind="input")
    fused, _ = optimize(graph)
    inputs = {name: value.astype(np.float32) for name, value in feeds.items()}
    got = run_gpu(fused, inputs).run(inputs, read=tuple(fused.outputs))
    for name, value in expected_of(case, meta).items():
        scale = max(np.abs(value).max(), 1.0)
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-4 * scale, err_msg=f"{case} {name}")
