"""RMSNorm → Linear: `F.rms_norm` and `nn.RMSNorm` with PyTorch's semantics, and the matmul family's
`matmul_prologue` on them. The cost model decides: the normalisation is computed while the matmul
loads its A operand when that is cheaper (inference: the normalised tensor is never written), and
the normalised tensor is kept where something else needs it and reading it is cheaper. Each plan
is checked against the interpreter, and against the plan the cost model did not choose."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    assert_same_results,
    assert_steps_follow_interpreter,
    kernels,
    live_nodes,
    random_values,
    trace_leaf,
)

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.ir.expr import format_expr, parse
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import ShapeError, infer_type, op_def
from meganeura.ir.trace import Tracer, tracing
from meganeura.rewrite import matmul as matmul_family
from meganeura.rewrite import optimize
from meganeura.rewrite.cost import graph_cost

M, K, N = 16, 64, 32
EPS32 = float(np.finfo(np.float32).eps)


def rms_norm_reference(x: np.ndarray, dims: int, weight=None, eps: float = EPS32) -> np.ndarray:
    """torch.nn.functional.rms_norm, in float64."""
    x = x.astype(np.float64)
    axes = tuple(range(x.ndim - dims, x.ndim))
    y = x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
    return y if weight is None else y * weight


def traced(build, leaves: dict[str, tuple[str, tuple[int, ...]]]) -> Graph:
    """The graph of `build(**tensors)` (a dict of named outputs) over leaves {name: (kind, shape)}."""
    tracer = Tracer()
    with tracing(tracer):
        tensors = {name: trace_leaf(tracer, kind, name, TensorType(shape)) for name, (kind, shape) in leaves.items()}
        for name, value in build(**tensors).items():
            tracer.graph.outputs[name] = value.node
    return tracer.graph


def without_prologue_rule(monkeypatch) -> None:
    rules = [r for r in matmul_family.RULES if r.name != "matmul_prologue"]
    monkeypatch.setattr(matmul_family, "RULES", rules)


def recompute_in_prologue(graph: Graph, producer: int) -> Graph:
    """`graph` with every matmul that reads pointwise node `producer` as A computing it in a
    prologue instead (the producer is still computed if anything else reads it): the plan the
    cost model did not choose, built by hand."""
    kernel = graph[producer]
    if kernel.op == "pointwise":
        expr = parse(kernel.attr("expr"))
    else:  # a primitive elementwise op
        expr = (kernel.op, *(("$", str(i)) for i in range(len(kernel.inputs))))
    a = next(i for i in kernel.inputs if graph[i].shape == kernel.shape)
    others = [i for i in kernel.inputs if i != a]
    result = Graph()
    for node in graph:
        attrs = node.attr_dict
        inputs = list(node.inputs)
        if node.op in ("matmul", "fused_matmul") and node.inputs[0] == producer:
            extras = inputs[2:]
            number = {x: "a" if x == a else str(len(extras) + others.index(x)) for x in kernel.inputs}
            names = {str(i): ("$", number[x]) for i, x in enumerate(kernel.inputs)}
            attrs["prologue"] = format_expr(rename(expr, names))
            attrs.setdefault("epilogue", "$acc")
            inputs = [a, inputs[1], *extras, *others]
            op = "fused_matmul"
        else:
            op = node.op
        value_type = node.type if not inputs else infer_type(op, [result[i].type for i in inputs], attrs)
        result.add(op, inputs, value_type, op_def(op).canonical_attrs(attrs), node.sources)
    result.outputs, result.updates = dict(graph.outputs), dict(graph.updates)
    return result.pruned()


def rename(tree, names):
    if isinstance(tree, float):
        return tree
    if tree[0] == "$":
        return names[tree[1]]
    return (tree[0], *(rename(arg, names) for arg in tree[1:]))


def normalised_nodes(graph: Graph, shape: tuple[int, ...]) -> list:
    """Live computed nodes of `shape` (the normalised tensor, if the plan writes it)."""
    return [n for n in graph if n.id in graph.live_ids() and n.shape == shape and n.op not in ("input", "param")]


# -- the DSL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dims, eps, affine", [(1, None, True), (2, 1e-5, True), (1, 1e-6, False)])
def test_rms_norm_follows_pytorchs_formula(dims, eps, affine):
    shape = (2, 3, 8)
    normalized = shape[-dims:]
    norm = nn.RMSNorm(normalized if dims > 1 else shape[-1], eps=eps, elementwise_affine=affine)
    assert [name for name, _ in norm.named_parameters()] == (["weight"] if affine else [])
    if affine:
        np.testing.assert_array_equal(norm.weight.numpy(), np.ones(normalized, np.float32))
        norm.weight.copy_(np.random.default_rng(1).normal(size=normalized))
    program = mn.compile(norm, inputs={"x": mn.f32[shape]})
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    weight = norm.weight.numpy() if affine else None
    expected = rms_norm_reference(x, dims, weight, EPS32 if eps is None else eps)
    np.testing.assert_allclose(program(x=x), expected, rtol=1e-5, atol=1e-6)


def test_rms_norm_checks_its_shapes():
    with pytest.raises(ShapeError, match="normalized_shape"):
        traced(lambda x: {"y": F.rms_norm(x, (3,))}, {"x": ("input", (2, 4))})
    with pytest.raises(ShapeError, match="weight"):
        traced(lambda x, w: {"y": F.rms_norm(x, (4,), w)}, {"x": ("input", (2, 4)), "w": ("param", (2, 4))})


# -- inference: the normalisation folds into the matmul's A load -------------------------------------


class NormLinear(nn.Module):
    def __init__(self, heads: int = 1) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(K)
        self.heads = nn.ModuleList([nn.Linear(K, N) for _ in range(heads)])

    def forward(self, x):
        h = self.norm(x)
        outputs = [head(h) for head in self.heads]
        return outputs[0] if len(outputs) == 1 else outputs[0] * outputs[1]


def test_rms_norm_linear_inference_folds_the_norm_into_the_matmul(monkeypatch):
    mn.manual_seed(0)
    model = NormLinear()
    model.norm.weight.copy_(np.random.default_rng(2).uniform(0.5, 1.5, K))
    graph = trace_step(model, None, {"x": mn.f32[M, K]}, None).graph
    fused, report = optimize(graph)
    # Two kernels: r = rsqrt(mean(x²) + eps) [M, 1], then the matmul reading x, r and the weights.
    (scale,) = live_nodes(fused, "fused_reduce")
    (kernel,) = live_nodes(fused, "fused_matmul")
    assert kernels(fused) == 2 and scale.attr("epilogue").startswith("rsqrt(") and scale.shape == (M, 1)
    assert kernel.attr("prologue") == "mul(mul($a,$1),$2)" and kernel.attr("epilogue") == "add($acc,$0)"
    assert fused[kernel.inputs[0]].attr("name") == "x" and kernel.inputs[3] == scale.id
    assert not normalised_nodes(fused, (M, K))  # the normalised x is never written
    assert report.rule("matmul_prologue").uses == 1
    assert_same_results(graph, fused, *random_values(graph, 3))
    # Chosen by cost: cheaper than the best plan without the rule (which writes the normalised x).
    without_prologue_rule(monkeypatch)
    stored, stored_report = optimize(graph)
    assert normalised_nodes(stored, (M, K)) and stored_report.cost_after.units > report.cost_after.units
    monkeypatch.undo()
    # On the GPU, the fused plan gives torch's rms_norm → linear.
    predict = mn.compile(model, inputs={"x": mn.f32[M, K]})
    assert "A=mul(mul($a,$1),$2)" in " ".join(spec.label for spec in predict.executable.kernels)
    x = np.random.default_rng(4).normal(size=(M, K)).astype(np.float32)
    state = model.state_dict()
    expected = rms_norm_reference(x, 1, state["norm.weight"]) @ state["heads.0.weight"].T + state["heads.0.bias"]
    np.testing.assert_allclose(predict(x=x), expected, rtol=1e-4, atol=1e-5)


def test_two_projections_of_one_norm_both_recompute_it(monkeypatch):
    # q and k of one normalised x: recomputing it in both matmuls reads r and w twice (small),
    # storing it writes and reads M·K floats and costs a dispatch. The cost model recomputes.
    graph = trace_step(NormLinear(heads=2), None, {"x": mn.f32[M, K]}, None).graph
    fused, report = optimize(graph)
    for kernel in live_nodes(fused, "fused_matmul"):  # the extras' numbers depend on the epilogue's
        _, (_, inner, row), weight = parse(kernel.attr("prologue"))
        shapes = [fused[kernel.inputs[2 + int(v[1])]].shape for v in (row, weight)]
        assert inner == ("$", "a") and shapes == [(M, 1), (K,)]
    assert len(live_nodes(fused, "fused_matmul")) == 2 and not normalised_nodes(fused, (M, K))
    assert_same_results(graph, fused, *random_values(graph, 5), tol=1e-4)
    without_prologue_rule(monkeypatch)
    stored, stored_report = optimize(graph)
    assert len(normalised_nodes(stored, (M, K))) == 1  # the alternative: stored once, read twice
    assert stored_report.cost_after.units > report.cost_after.units


# -- the normalised tensor needed elsewhere: kept, when reading it is the cheaper plan ------------


def test_normalised_tensor_that_is_an_output_stays_materialised():
    def build(x, norm_weight, weight, bias):
        h = F.rms_norm(x, (K,), norm_weight)
        return {"normalised": h, "y": F.linear(h, weight, bias)}

    leaves = {"x": ("input", (M, K)), "norm_weight": ("param", (K,)), "weight": ("param", (N, K))}
    graph = traced(build, {**leaves, "bias": ("param", (N,))})
    fused, report = optimize(graph)
    normalised = fused[fused.outputs["normalised"]]
    assert normalised.op == "pointwise" and report.rule("matmul_prologue").uses == 0
    assert fused[fused.outputs["y"]].inputs[0] == normalised.id  # the matmul reads it
    assert_same_results(graph, fused, *random_values(graph, 6))
    # The plan not chosen: the matmul recomputes it though it is written anyway (reads x, r, w).
    recomputed = recompute_in_prologue(fused, normalised.id)
    assert [n.attr("prologue") for n in live_nodes(recomputed, "fused_matmul")] == ["mul(mul($a,$1),$2)"]
    assert_same_results(graph, recomputed, *random_values(graph, 6))
    assert graph_cost(recomputed).units > report.cost_after.units


def test_costly_operand_read_by_four_matmuls_is_stored():
    # A = x·g of two full [256, 256] inputs: recomputing it in four matmuls reads 8 such tensors,
    # storing it reads 2, writes 1, and then 4 matmuls read it (7, plus one dispatch): stored.
    size, n = 256, 8
    leaves = {"x": ("input", (size, size)), "g": ("input", (size, size))}
    leaves |= {f"w{i}": ("param", (n, size)) for i in range(4)}

    def build(x, g, **weights):
        a = x * g
        return {name: F.linear(a, w) for name, w in weights.items()}

    graph = traced(build, leaves)
    fused, report = optimize(graph)
    (product,) = live_nodes(fused, "mul")
    assert report.rule("matmul_prologue").uses == 0 and report.rule("matmul_prologue").matches >= 4
    assert all(fused[i].inputs[0] == product.id for i in fused.outputs.values())
    recomputed = recompute_in_prologue(fused, product.id)
    assert not live_nodes(recomputed, "mul") and len(live_nodes(recomputed, "fused_matmul")) == 4
    assert graph_cost(recomputed).units > report.cost_after.units
    inputs, params, _ = random_values(graph, 7)
    assert_same_results(graph, fused, inputs, params, tol=1e-4)
    assert_same_results(graph, recomputed, inputs, params, tol=1e-4)


# -- training: RMSNorm → Linear compiles and follows the interpreter on the GPU ------------------


class NormClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(12)
        self.fc = nn.Linear(12, 5)

    def forward(self, x):
        return self.fc(self.norm(x))


def test_three_training_steps_of_rms_norm_linear_follow_the_interpreter():
    mn.manual_seed(0)
    program = mn.compile(
        NormClassifier(),
        loss=lambda model, x, y: F.cross_entropy(model(x), y),
        inputs={"x": mn.f32[8, 12], "y": mn.i32[8]},
        optimizer=optim.Adam(lr=1e-2),
    )
    report = program.rewrite_report
    assert report.kernels_after < report.kernels_before and report.cost_after.units < report.cost_before.units
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 12)).astype(np.float32), rng.integers(0, 5, 8).astype(np.int32)
    assert_steps_follow_interpreter(program, [{"x": x, "y": y}] * 3)
