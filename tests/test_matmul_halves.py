"""Products on the tensor cores from operands split once (ir/ops/halves.py; the pass in
passes/operand_splits.py, the kernel in codegen/matmul_halves.py):
the pass against the interpreter (every transpose, ragged shapes, A's leading dims folded, split-K,
epilogues, operands over many binades; each product within its bound of |A|·|B|, the scale of a
float32 product's own rounding), the split kernel on any adapter against the interpreter, and the
product kernel where the device has f16 subgroup matrices (the H200 through Dawn)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import RNG, run_gpu
from test_tensor_tiles import H200, needs_tensor_cores

import meganeura as mn
from meganeura.codegen import tensor_tiles
from meganeura.ir.graph import TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.ops.halves import evaluate_split_halves, scale_exponent, unpacked
from meganeura.ir.trace import Tracer
from meganeura.passes import compile_step, operand_splits
from meganeura.target import GENERIC

BOUND = 2e-5  # of |A|·|B|


@pytest.fixture(autouse=True)
def every_size(monkeypatch):
    """Products of any size run from split operands here (the step's policy, MIN_DIM and MIN_MACS,
    keeps narrow and small ones on the f32 kernels: test_the_policy_keeps_narrow_products_…)."""
    monkeypatch.setattr(operand_splits, "MIN_DIM", 1)
    monkeypatch.setattr(operand_splits, "MIN_MACS", 0)


def spread(*shape: int, binades: float = 12.0) -> np.ndarray:
    """Normal values times magnitudes spread over `binades` powers of two."""
    return (RNG.normal(size=shape) * np.exp2(RNG.uniform(-binades, 0, size=shape))).astype(np.float32)


def product_graph(m, k, n, transpose_a=False, transpose_b=False, batch=(), splits=1, epilogue=None):
    """out = op(A)·op(B) (A with `batch` leading dims, B 2-D), a split product's sum, or through
    an epilogue reading a [batch…, m, n] extra and an [n] one."""
    tracer = Tracer()
    shape_a = (*batch, *((k, m) if transpose_a else (m, k)))
    a = tracer.leaf("input", "a", TensorType(shape_a))
    b = tracer.leaf("input", "b", TensorType((n, k) if transpose_b else (k, n)))
    flags = {"transpose_a": transpose_a, "transpose_b": transpose_b}
    if splits > 1:
        out = tracer.emit(
            "sum", [tracer.emit("fused_matmul", [a, b], **flags, splits=splits)], axes=(0,), keepdim=False
        )
    elif epilogue:
        extras = [tracer.leaf("input", "r", TensorType((*batch, m, n))), tracer.leaf("input", "c", TensorType((n,)))]
        out = tracer.emit("fused_matmul", [a, b, *extras], **flags, epilogue=epilogue)
    else:
        out = tracer.emit("matmul", [a, b], **flags)
    tracer.graph.outputs["out"] = out
    return tracer.graph


def inputs_of(graph) -> dict[str, np.ndarray]:
    return {node.attr("name"): spread(*node.shape) for node in graph.leaves("input").values()}


def error_of(graph, inputs, got) -> float:
    """The largest |got − exact| / (|A|·|B|) (the exact product in float64 by the interpreter)."""
    exact = interpret(graph, inputs, dtype=np.float64).outputs["out"]
    absolute = {name: np.abs(value) for name, value in inputs.items()}
    absolute.update({name: np.zeros_like(value) for name, value in inputs.items() if name in ("r", "c")})
    scale = np.maximum(interpret(graph, absolute, dtype=np.float64).outputs["out"], 1e-30)
    return float(np.max(np.abs(got - exact) / scale))


CASES = [  # m, k, n, transpose_a, transpose_b, batch, splits
    (1, 1, 1, False, False, (), 1),
    (7, 33, 65, False, False, (), 1),
    (65, 130, 7, True, False, (), 1),
    (130, 7, 33, False, True, (), 1),
    (36, 20, 44, True, True, (), 1),
    (100, 300, 136, False, False, (3,), 1),
    (64, 700, 48, True, False, (), 3),
    (200, 257, 129, False, True, (), 2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:3])) + "T" * c[3] + "t" * c[4])
def test_the_split_products_stay_within_their_bound(case):
    m, k, n, ta, tb, batch, splits = case
    graph = product_graph(m, k, n, ta, tb, batch, splits)
    step = compile_step(graph, H200)
    ops = [node.op for node in step.graph if node.id in step.graph.live_ids()]
    assert ops.count("split_matmul") == 1 and ops.count("split_halves") == 2
    assert "matmul" not in ops and "fused_matmul" not in ops
    inputs = inputs_of(graph)
    assert error_of(graph, inputs, interpret(step.graph, inputs).outputs["out"]) < BOUND


def test_parts_of_k_follow_the_tensor_core_tiles(monkeypatch):
    """A product that extraction split into parts of K for the f32 kernels gets the parts that fill
    the H200 with the tensor-core tiles (`halves_splits`), here two workgroups a compute unit
    (tensor_tiles.FILL = 2): a 512x512 output over K = 2,048, whose
    16 tiles of 128x128 would need more parts than K has of PART_MIN, in 5 parts of 64 tiles of
    64x64, its sum made again for them; a
    2048x576 output (288 tiles of 64x64, two a compute unit) in one part, and the fused_reduce that
    summed its parts and added two extras becomes the product's epilogue, no kernel summing one
    part; both within the bound of the exact product."""
    monkeypatch.setattr(tensor_tiles, "FILL", 2)
    graph = product_graph(512, 2048, 512, splits=8)
    step = compile_step(graph, H200)
    (product,) = [node for node in step.graph if node.op == "split_matmul"]
    (total,) = [node for node in step.graph if node.op == "sum"]
    assert product.attr("splits") == 5 and step.graph[total.inputs[0]].shape == (5, 512, 512)
    assert [k.label for k in step.kernels if k.entry_point == "matmul_halves"] == [
        "split_matmul 512x2048x512 in 5 parts of K"
    ]
    inputs = inputs_of(graph)
    assert error_of(graph, inputs, interpret(step.graph, inputs).outputs["out"]) < BOUND

    tracer = Tracer()
    a = tracer.leaf("input", "a", TensorType((2048, 200)))
    b = tracer.leaf("input", "b", TensorType((200, 576)))
    r = tracer.leaf("input", "r", TensorType((2048, 576)))
    c = tracer.leaf("input", "c", TensorType((576,)))
    parts = tracer.emit("fused_matmul", [a, b], splits=3)
    reduce = {"kind": "sum", "axes": (0,), "keepdim": False, "in_shape": (3, 2048, 576), "prologue": "$0"}
    out = tracer.emit("fused_reduce", [parts, r, c], **reduce, epilogue="add(mul($1,$2),$r)")
    tracer.graph.outputs["out"] = out
    step = compile_step(tracer.graph, H200)
    live = step.graph.live_ids()
    (product,) = [node for node in step.graph if node.op == "split_matmul"]
    assert product.attr("splits") == 1 and product.attr("epilogue") == "add(mul($0,$1),$acc)"
    summed = [node for node in step.graph if node.id in live and node.op in ("sum", "fused_reduce")]
    assert [node.attr("kind") for node in summed] == ["max"] * 2  # the two operands' maxima only
    inputs = {"a": spread(2048, 200), "b": spread(200, 576), "r": spread(2048, 576), "c": spread(576)}
    got = interpret(step.graph, inputs, dtype=np.float64).outputs["out"]
    exact = interpret(tracer.graph, inputs, dtype=np.float64).outputs["out"]
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-5)
    plain = compile_step(tracer.graph, dataclasses.replace(H200, tensor_cores=False)).graph
    assert any(node.op == "fused_reduce" for node in plain)  # the f32 plan keeps its parts


def test_an_epilogue_reads_its_extras_at_the_folded_rows():
    graph = product_graph(40, 24, 36, batch=(3,), epilogue="add(mul($acc,$0),$1)")
    step = compile_step(graph, H200)
    assert any(node.op == "split_matmul" for node in step.graph)
    inputs = inputs_of(graph)
    got = interpret(step.graph, inputs, dtype=np.float64).outputs["out"]
    exact = interpret(graph, inputs, dtype=np.float64).outputs["out"]
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-6)


def test_an_operand_is_split_once_for_every_product_that_reads_it_the_same_way():
    tracer = Tracer()
    x = tracer.leaf("input", "x", TensorType((64, 48)))
    w = tracer.leaf("input", "w", TensorType((48, 32)))
    v = tracer.leaf("input", "v", TensorType((48, 16)))
    y = tracer.emit("matmul", [x, w])  # x as A, w as B
    tracer.graph.outputs["z"] = tracer.emit("matmul", [x, v])  # x as A again
    tracer.graph.outputs["g"] = tracer.emit("matmul", [x, y], transpose_a=True)  # xᵀ as A, y as B
    tracer.graph.outputs["h"] = tracer.emit("matmul", [y, w], transpose_b=True)  # y as A, wᵀ as B
    step = compile_step(tracer.graph, H200)
    graph = step.graph
    names = {node.id: node.attr("name") or "y" for node in graph if node.op in ("input", "split_matmul")}
    splits = sorted((names[graph[n.inputs[0]].id], n.attr("transpose")) for n in graph if n.op == "split_halves")
    # y is A of h and B of g: one split serves both
    assert splits == [("v", False), ("w", False), ("w", True), ("x", False), ("x", True), ("y", False)]
    assert sum(node.op == "fused_reduce" for node in graph) == 4  # one top per tensor
    inputs = {"x": spread(64, 48), "w": spread(48, 32), "v": spread(48, 16)}
    got = interpret(graph, inputs, dtype=np.float64).outputs
    exact = interpret(tracer.graph, inputs, dtype=np.float64).outputs
    for name in ("z", "g", "h"):
        np.testing.assert_allclose(got[name], exact[name], rtol=1e-4, atol=1e-5)


def test_a_transposed_weight_is_split_from_the_weight():
    tracer = Tracer()
    x = tracer.leaf("input", "x", TensorType((40, 24)))
    w = tracer.leaf("input", "w", TensorType((36, 24)))
    tracer.graph.outputs["out"] = tracer.emit("matmul", [x, tracer.emit("permute", [w], perm=(1, 0))])
    step = compile_step(tracer.graph, H200)
    (split_w,) = [n for n in step.graph if n.op == "split_halves" and step.graph[n.inputs[0]].attr("name") == "w"]
    assert split_w.attr("transpose")
    assert not any(kernel.label.startswith("permute") for kernel in step.kernels)
    inputs = {"x": spread(40, 24), "w": spread(36, 24)}
    got = interpret(step.graph, inputs, dtype=np.float64).outputs["out"]
    assert error_of(tracer.graph, inputs, got) < BOUND


def test_products_the_pass_leaves_alone():
    """A prologue, a batch of B's, and a target without tensor cores keep their kernels."""
    tracer = Tracer()
    a = tracer.leaf("input", "a", TensorType((4, 8, 16)))
    b = tracer.leaf("input", "b", TensorType((4, 16, 8)))
    w = tracer.leaf("input", "w", TensorType((16, 8)))
    tracer.graph.outputs["batched"] = tracer.emit("matmul", [a, b])
    tracer.graph.outputs["prologue"] = tracer.emit("fused_matmul", [a, w], prologue="mul($a,2.0)")
    graph = tracer.graph
    assert not any(node.op == "split_matmul" for node in compile_step(graph, H200).graph)
    plain = product_graph(7, 33, 65)
    assert not any(node.op == "split_matmul" for node in compile_step(plain, GENERIC).graph)


def test_the_halves_hold_the_scaled_operand_to_twenty_one_bits():
    x = spread(37, 29, binades=20.0)
    top = np.abs(x).max(axis=1)
    for transpose in (False, True):
        halves = evaluate_split_halves(x, top, transpose, 128, 64)
        assert halves.shape == (2, 128, 32) and halves.dtype == np.int32
        hi, lo = unpacked(halves)
        matrix = (x.T if transpose else x).astype(np.float64) * 2.0 ** scale_exponent(top)
        rows, cols = matrix.shape
        assert 2**13 <= np.abs(matrix).max() < 2**14
        np.testing.assert_array_equal(hi[rows:], 0)
        np.testing.assert_array_equal(hi[:, cols:], 0)
        held = hi[:rows, :cols] + lo[:rows, :cols]
        big = np.abs(matrix) >= 2.0**-3  # lo normal in f16: 21 bits or more
        assert np.all(np.abs(held - matrix)[big] <= 2.0**-21 * np.abs(matrix)[big])
        assert np.all(np.abs(held - matrix) <= 2.0**-24 + 2.0**-21 * np.abs(matrix))


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("shape", [(37, 29), (3, 70, 66), (130, 1)], ids=str)
def test_the_split_kernel_matches_the_interpreter(shape, transpose):
    """split_halves on this device (lavapipe in CI): hi exactly, lo within one f16 step (WGSL
    leaves the rounding of pack2x16float to the implementation)."""
    tracer = Tracer()
    x = tracer.leaf("input", "x", TensorType(shape))
    top = tracer.leaf("input", "top", TensorType((5,)))
    tracer.graph.outputs["out"] = tracer.emit("split_halves", [x, top], transpose=transpose, rows_to=64, cols_to=128)
    inputs = {"x": spread(*shape, binades=30.0), "top": np.array([0.5, -3.0, 0.0, 1.0, 2.0], np.float32)}
    got = run_gpu(tracer.graph, inputs).run(inputs, read=("out",))["out"]
    expected = interpret(tracer.graph, inputs).outputs["out"]
    got_hi, got_lo = unpacked(got.astype(np.int32))
    hi, lo = unpacked(expected)
    np.testing.assert_array_equal(got_hi, hi)
    step = np.abs(lo) * 2.0**-10 + 2.0**-24
    assert np.all(np.abs(got_lo - lo) <= step)


@needs_tensor_cores
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c[:3])) + "T" * c[3] + "t" * c[4])
def test_the_split_product_kernel_is_within_its_bound(case):
    m, k, n, ta, tb, batch, splits = case
    graph = product_graph(m, k, n, ta, tb, batch, splits)
    inputs = inputs_of(graph)
    executable = run_gpu(graph, inputs, target=H200)
    assert any(kernel.entry_point == "matmul_halves" for kernel in executable.kernels)
    assert error_of(graph, inputs, executable.run(inputs, read=("out",))["out"]) < BOUND


@needs_tensor_cores
@pytest.mark.parametrize("tiling", [(4, 4), (2, 2), (1, 1)], ids=str)
def test_each_tile_of_the_ladder_and_an_epilogue(monkeypatch, tiling):

    monkeypatch.setattr(tensor_tiles, "LADDER", (tensor_tiles.TensorTiling(*tiling),))
    graph = product_graph(100, 100, 250, batch=(2,), epilogue="add(mul($acc,$0),$1)")  # halves 256x128, 128x256
    inputs = inputs_of(graph)
    executable = run_gpu(graph, inputs, target=H200)
    (kernel,) = [kernel for kernel in executable.kernels if kernel.entry_point == "matmul_halves"]
    assert kernel.grid[0] == -(-250 // (32 * tiling[1]))
    got = executable.run(inputs, read=("out",))["out"]
    exact = interpret(graph, inputs, dtype=np.float64).outputs["out"]
    np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-5)


def test_the_policy_keeps_narrow_products_on_the_f32_kernels(monkeypatch):
    monkeypatch.setattr(operand_splits, "MIN_DIM", 256)
    ops = [node.op for node in compile_step(product_graph(300, 192, 260), H200).graph]
    assert "split_matmul" not in ops and "matmul" in ops
    ops = [node.op for node in compile_step(product_graph(300, 256, 260), H200).graph]
    assert "split_matmul" in ops and "matmul" not in ops


def test_the_policy_keeps_small_products_on_the_f32_kernels(monkeypatch):
    """The digits MLP's widest product (256·1024·1024 = 2^28 multiply-adds) is under MIN_MACS; one
    of 2^29 is not."""
    monkeypatch.setattr(operand_splits, "MIN_DIM", 256)
    monkeypatch.setattr(operand_splits, "MIN_MACS", 2**29)
    ops = [node.op for node in compile_step(product_graph(256, 1024, 1024), H200).graph]
    assert "split_matmul" not in ops and "matmul" in ops
    ops = [node.op for node in compile_step(product_graph(512, 1024, 1024), H200).graph]
    assert "split_matmul" in ops and "matmul" not in ops


def test_the_hook_can_keep_every_product_on_its_kernel(monkeypatch):
    monkeypatch.setattr(operand_splits, "halves_take", lambda m, k, n: False)
    assert not any(node.op == "split_matmul" for node in compile_step(product_graph(7, 33, 65), H200).graph)


def test_the_split_kernels_dispatch_the_workgroups_the_cost_model_counts():
    from meganeura.bench.workloads import STEPS
    from meganeura.codegen.registry import dispatch_counted, node_workgroups
    from meganeura.compiler import compile_plan

    workload = STEPS["smollm2"].build(small=True)
    step = compile_plan(workload.model, workload.loss, workload.inputs, workload.optimizer, target=H200).compiled
    split = [kernel for kernel in step.kernels if kernel.entry_point in ("split_halves", "matmul_halves")]
    assert {kernel.entry_point for kernel in split} == {"split_halves", "matmul_halves"}
    for kernel in split:
        node = step.graph[kernel.node]
        assert dispatch_counted(step.graph, node, np.prod(kernel.grid), H200) == node_workgroups(step.graph, node, H200)


def layer_graph():
    """Two Linear-like products of param weights (one read through a transpose, as the plan
    writes a weight for the f32 kernels) and their gradients' products."""
    tracer = Tracer()
    x = tracer.leaf("input", "x", TensorType((3, 40, 24)))
    g = tracer.leaf("input", "g", TensorType((3, 40, 20)))
    w1 = tracer.leaf("param", "w1", TensorType((36, 24)))  # nn.Linear's [out, in]
    w2 = tracer.leaf("param", "w2", TensorType((36, 20)))
    h = tracer.emit("matmul", [x, tracer.emit("permute", [w1], perm=(1, 0))])  # x·w1ᵀ
    tracer.graph.outputs["y"] = tracer.emit("matmul", [h, w2])  # h·w2
    tracer.graph.outputs["dh"] = tracer.emit("matmul", [g, w2], transpose_b=True)  # g·w2ᵀ
    tracer.graph.outputs["dx"] = tracer.emit("matmul", [tracer.emit("reshape", [h], shape=(120, 36)), w1])
    return tracer.graph


def test_the_weights_are_split_by_multi_tensor_kernels_before_the_first_product(monkeypatch):
    graph = layer_graph()
    step = compile_step(graph, H200)
    ops = [node.op for node in step.graph if node.id in step.graph.live_ids()]
    assert ops.count("multi_top") == 1 and ops.count("multi_split_halves") == 1
    (split,) = [node for node in step.graph if node.op == "multi_split_halves"]
    members = sorted(
        (step.graph[x].attr("name"), t) for x, t in zip(split.inputs[::2], split.attr("transposes"), strict=True)
    )
    assert members == [("w1", 0), ("w1", 1), ("w2", 0), ("w2", 1)]
    first_product = min(node.id for node in step.graph if node.op == "split_matmul")
    assert split.id < first_product
    inputs = {"x": spread(3, 40, 24), "g": spread(3, 40, 20)}
    params = {"w1": spread(36, 24), "w2": spread(36, 20)}
    got = interpret(step.graph, inputs, params, dtype=np.float64).outputs
    exact = interpret(graph, inputs, params, dtype=np.float64).outputs
    for name in ("y", "dh", "dx"):
        np.testing.assert_allclose(got[name], exact[name], rtol=1e-4, atol=1e-5)
    # grouped by the target's bindings: at 6 a kernel, each multi-tensor kernel takes fewer weights
    narrow = dataclasses.replace(H200, max_storage_buffers=6)
    narrow_step = compile_step(graph, narrow)
    narrow_ops = [node.op for node in narrow_step.graph]
    assert narrow_ops.count("multi_top") == 1 and narrow_ops.count("multi_split_halves") == 2
    assert max(len(kernel.bindings) for kernel in narrow_step.kernels if "multi" in kernel.label) <= 6
    monkeypatch.setattr(operand_splits, "GROUP_WEIGHTS", False)
    single = [node.op for node in compile_step(graph, H200).graph]
    assert "multi_top" not in single and single.count("split_halves") >= 4


def multi_split_graph():
    """Inputs a [37, 29] and b [3, 70, 66], their maxima by one multi_top (37 and 30 parts) and
    three splits by one multi_split_halves (a, bᵀ, aᵀ: both layouts, ragged, a tensor split both
    ways) as outputs s0-s2. Returns the tracer, a and b's maxima (also run by tests/test_bounds.py)."""
    tracer = Tracer()
    a = tracer.leaf("input", "a", TensorType((37, 29)))
    b = tracer.leaf("input", "b", TensorType((3, 70, 66)))
    tops = tracer.emit("multi_top", [a, b], parts=(37, 30))
    top_a, top_b = (tracer.emit("result", [tops], index=i) for i in range(2))
    split = tracer.emit(
        "multi_split_halves", [a, top_a, b, top_b, a, top_a], transposes=(0, 1, 1), rows_to=64, cols_to=64
    )
    for i in range(3):
        tracer.graph.outputs[f"s{i}"] = tracer.emit("result", [split], index=i)
    return tracer, a, top_b


def test_the_multi_tensor_maxima_and_splits_match_the_interpreter():
    """On this device (lavapipe in CI): members of both layouts, ragged, a tensor split both ways."""
    tracer, _, top_b = multi_split_graph()
    tracer.graph.outputs["top_b"] = top_b
    inputs = {"a": spread(37, 29, binades=30.0), "b": spread(3, 70, 66, binades=30.0)}
    got = run_gpu(tracer.graph, inputs).run(inputs, read=tuple(tracer.graph.outputs))
    expected = interpret(tracer.graph, inputs).outputs
    np.testing.assert_array_equal(got["top_b"], expected["top_b"])
    for i in range(3):
        got_hi, got_lo = unpacked(got[f"s{i}"].astype(np.int32))
        hi, lo = unpacked(expected[f"s{i}"])
        np.testing.assert_array_equal(got_hi, hi)
        assert np.all(np.abs(got_lo - lo) <= np.abs(lo) * 2.0**-10 + 2.0**-24)


def test_the_report_counts_the_split_products_and_the_dispatches_that_split_them():
    from meganeura.explain import step_dispatches

    step = compile_step(layer_graph(), H200)
    counts = step_dispatches(step)
    # 4 products; the weights' maxima and splits one kernel each; x, h (also read through a
    # reshape) and g a maximum and a split each
    assert (counts.split_products, counts.splitting) == (4, 2 + 3 + 3)
    assert "4 products on the tensor cores from split operands, 8 dispatches splitting" in str(counts)
    assert counts.total == len(step.kernels) == 4 + 8
    plain = step_dispatches(compile_step(layer_graph(), GENERIC))
    assert plain.split_products == plain.splitting == 0 and "tensor cores" not in str(plain)


@pytest.mark.parametrize("name", ["gpt2", "smollm2"])
def test_a_whole_lm_step_keeps_its_results_with_split_products(name):
    """The bench's LM steps (small) with their products split, against the same plan compiled
    without tensor cores, through the interpreter: the loss, every output and every update."""
    from conftest import random_values

    from meganeura.bench.workloads import STEPS
    from meganeura.compiler import compile_plan

    mn.manual_seed(0)
    workload = STEPS[name].build(small=True)
    plan = compile_plan(workload.model, workload.loss, workload.inputs, workload.optimizer, target=H200)
    split = plan.compiled.graph
    assert sum(node.op == "split_matmul" for node in split) >= 10
    plain = compile_step(plan.fused_graph, dataclasses.replace(H200, tensor_cores=False)).graph
    assert not any(node.op == "split_matmul" for node in plain)
    inputs = random_values(plain)[0]  # token ids 0…2
    params = {key: parameter.numpy() for key, parameter in plan.traced.parameters.items()}
    states = {**plan.traced.initial_states, **plan.traced.step_states, **params}  # module buffers are states
    expected = interpret(plain, inputs, params, states)
    actual = interpret(split, inputs, params, states)
    assert expected.outputs.keys() == actual.outputs.keys() and expected.updates.keys() == actual.updates.keys()
    for key, value in expected.outputs.items():
        np.testing.assert_allclose(actual.outputs[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
    # AdamW's first step moves a weight by lr·g/(|g| + eps): where |g| is near eps the ratio moves
    # with the gradient's last bits, so the updates are held to a tenth of a step (lr 1e-3).
    for key, value in expected.updates.items():
        np.testing.assert_allclose(actual.updates[key], value, rtol=1e-4, atol=1e-4, err_msg=key)
