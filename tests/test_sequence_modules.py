"""The sequence models (meganeura/nn/transformer.py, meganeura/nn/rnn.py) against PyTorch, and the
recurrent cells' kernels.

The references (tests/reference/sequence_modules.npz, written by
scripts/make_sequence_references.py, which needs torch; these tests do not) hold per case the
module's configuration, PyTorch's state_dict (values drawn from a seeded generator), the inputs,
the outputs and every parameter's gradient of loss = Σₖ sum(outputₖ · weightₖ), in float64.
Each case is built here with meganeura's module of the same name and loaded from that
state_dict with load_state_dict, unchanged:

- its keys, order and shapes are torch's, and state_dict() gives the loaded values back;
- on the numpy interpreter in float64, the traced inference program's outputs and the traced
  training step's loss and gradients (keep_gradients) equal torch's to 1e-9;
- on the device (lavapipe counts; a subset of cases), the compiled step's loss and gradients
  (Program.gradients) equal them to float32 rounding.

The recurrent cells (ir/ops/recurrent.py) are also checked as kernels against the interpreter
at ragged shapes, and their gradients by finite differences in the middle of a chain.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import check, emit, gradcheck, normal, typed_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import GRAD_PREFIX, StepOptions, compile_plan
from meganeura.ir.graph import Graph
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError
from meganeura.tensor import apply, apply_results

REFERENCE = Path(__file__).resolve().parent / "reference" / "sequence_modules.npz"
with np.load(REFERENCE) as _data:
    ARRAYS = {key: _data[key] for key in _data.files}
CASES = sorted({key.split("/", 1)[0] for key in ARRAYS})

DEVICE_CASES = [
    "mha_self_weights", "mha_self_fused", "mha_masks_weights", "mha_masks_fused", "transformer",
    "lstm_two_layers_bidirectional_hx", "gru_two_layers_bidirectional_h0", "rnn_relu_two_layers_no_bias_h0",
    "lstm_cell", "gru_cell",
]  # fmt: skip


def case_arrays(case: str, kind: str) -> dict[str, np.ndarray]:
    prefix = f"{case}/{kind}/"
    return {key[len(prefix) :]: value for key, value in ARRAYS.items() if key.startswith(prefix)}


def meta(case: str) -> dict:
    return json.loads(str(ARRAYS[f"{case}/meta"]))


def build(case: str) -> nn.Module:
    """meganeura's module of a case, built as the script builds torch's."""
    info = meta(case)
    if info["module"] == "TransformerEncoder":
        layer = nn.TransformerEncoderLayer(*info["layer"]["args"], **info["layer"]["kwargs"])
        norm = nn.LayerNorm(info["norm"]) if info.get("norm") else None
        return nn.TransformerEncoder(layer, norm=norm, **info["kwargs"])
    return getattr(nn, info["module"])(*info["args"], **info["kwargs"])


def call_value(spec, tensors: dict):
    if isinstance(spec, list):
        return tuple(call_value(s, tensors) for s in spec)
    if isinstance(spec, dict) and "input" in spec:
        return tensors[spec["input"]]
    if isinstance(spec, dict) and "mask" in spec:
        return tensors[spec["mask"]] > 0.5  # a comparison's mask: boolean
    return spec


def flattened(result) -> list:
    if result is None:
        return []
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in flattened(item)]
    return [result]


class Case(nn.Module):
    """A case's module (as `m`) called as the reference calls it, on inputs by name."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.m = build(case)
        self.m.load_state_dict(case_arrays(case, "init"))
        if meta(case).get("eval"):
            self.m.eval()

    def forward(self, **tensors):
        call = meta(self.case)["call"]
        args = [call_value(a, tensors) for a in call.get("args", [])]
        kwargs = {k: call_value(v, tensors) for k, v in call.get("kwargs", {}).items()}
        return tuple(flattened(self.m(*args, **kwargs)))


def weighted_loss(model: Case, **tensors):
    weights = {k: v for k, v in tensors.items() if k.startswith("w")}
    outputs = model(**{k: v for k, v in tensors.items() if not k.startswith("w")})
    return sum(F.sum(out * weights[f"w{index}"]) for index, out in enumerate(outputs))


def specs(values: dict[str, np.ndarray]) -> dict:
    return {name: mn.f32[value.shape] if value.shape else mn.f32[1] for name, value in values.items()}


def feeds(case: str, with_weights: bool) -> dict[str, np.ndarray]:
    values = dict(case_arrays(case, "input"))
    if with_weights:
        values |= {f"w{k}": v for k, v in case_arrays(case, "weight").items()}
    return values


def params64(model: Case) -> dict[str, np.ndarray]:
    return {name: value.astype(np.float64) for name, value in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# state_dict


@pytest.mark.parametrize("case", CASES)
def test_state_dict_has_torchs_keys_shapes_and_values(case):
    """The module's state_dict keys (in order) and shapes are torch's; torch's loads unchanged and
    comes back as loaded."""
    init = case_arrays(case, "init")
    module = build(case)
    assert [(k, v.shape) for k, v in module.state_dict().items()] == [(k, v.shape) for k, v in init.items()]
    module.load_state_dict(init)
    for name, value in module.state_dict().items():
        np.testing.assert_array_equal(value, init[name], err_msg=name)


# ---------------------------------------------------------------------------------------------
# Outputs and gradients on the interpreter, float64


@pytest.mark.parametrize("case", CASES)
def test_outputs_and_gradients_equal_torch_on_the_interpreter(case):
    model = Case(case)
    values = feeds(case, with_weights=False)
    plan = compile_plan(model, None, specs(values))
    outputs = interpret(plan.traced.graph, values, params64(model), dtype=np.float64).outputs
    expected = case_arrays(case, "output")
    assert len(outputs) == len(expected)
    names = ["output"] if len(expected) == 1 else [f"output{k}" for k in range(len(expected))]
    for index, name in enumerate(names):
        np.testing.assert_allclose(outputs[name], expected[str(index)], rtol=1e-9, atol=1e-11, err_msg=name)
    values = feeds(case, with_weights=True)
    options = StepOptions(keep_gradients=True)
    step = compile_plan(model, weighted_loss, specs(values), optim.SGD(lr=0.1), options=options)
    params = params64(model)
    result = interpret(step.traced.graph, values, params, {**step.traced.initial_states, **params}, np.float64)
    np.testing.assert_allclose(result.outputs["loss"], ARRAYS[f"{case}/loss"], rtol=1e-9, atol=1e-11)
    grads = case_arrays(case, "grad")
    assert {GRAD_PREFIX + "m." + name for name in grads} == {k for k in result.outputs if k.startswith(GRAD_PREFIX)}
    for name, value in grads.items():
        got = result.outputs[GRAD_PREFIX + "m." + name]
        np.testing.assert_allclose(got, value, rtol=1e-9, atol=1e-11, err_msg=name)


# ---------------------------------------------------------------------------------------------
# The compiled step on the device, float32


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(got - expected) / max(np.linalg.norm(expected), 1e-12))


@pytest.mark.parametrize("case", DEVICE_CASES)
def test_compiled_step_loss_and_gradients_equal_torch(case):
    model = Case(case)
    values = feeds(case, with_weights=True)
    program = mn.compile(model, weighted_loss, specs(values), optim.SGD(lr=0.1), keep_gradients=True)
    loss = program.train_step(**values)
    np.testing.assert_allclose(loss, ARRAYS[f"{case}/loss"], rtol=1e-4, atol=1e-4)
    gradients = program.gradients()
    for name, value in case_arrays(case, "grad").items():
        assert relative_error(gradients["m." + name], value) < 1e-4, name


def test_self_attention_without_weights_is_the_fused_kernel():
    """need_weights=False, q is k is v: one fused attention forward (and its two backward kernels),
    no softmax; with the weights asked for, the softmax is traced explicitly."""
    model = Case("mha_self_fused")
    values = feeds("mha_self_fused", with_weights=True)
    program = mn.compile(model, weighted_loss, specs(values), optim.SGD(lr=0.1))
    ops = [n.op for n in program.fused_graph if n.id in program.fused_graph.live_ids()]
    assert ops.count("attention") == 1 and "attention_grad_kv" in ops and "softmax" not in ops
    assert "attention" in str(program.report())
    weights_model = Case("mha_self_weights")
    plan = compile_plan(weights_model, None, specs(feeds("mha_self_weights", with_weights=False)))
    assert "softmax" in [n.op for n in plan.traced.graph]


FUSED_ATTENTION = {  # case: the causal flag of each fused attention of its step, in graph order
    "encoder_causal_norm": [True, True],
    "decoder_layer_causal": [True, False],
    "transformer": [False, True, False, True, False],
    "mha_causal_fused": [True],
    "mha_three_inputs_fused": [False],
}


@pytest.mark.parametrize("case", sorted(FUSED_ATTENTION))
def test_the_transformers_attention_is_the_fused_kernel(case):
    """need_weights=False (the Transformer's layers), causal with the is_causal hint: every
    attention of the step is the fused op, none leaves a softmax."""
    step = compile_plan(Case(case), weighted_loss, specs(feeds(case, with_weights=True)), optim.SGD(lr=0.1))
    live = [n for n in step.fused_graph if n.id in step.fused_graph.live_ids()]
    assert [n.attr("causal") for n in live if n.op == "attention"] == FUSED_ATTENTION[case]
    assert "softmax" not in [n.op for n in live]


def test_discarded_attention_weights_are_recognised_as_fused_attention():
    """need_weights=True (the default) traces softmax(q·kᵀ·scale)·v; when the step only uses the
    output, the recognition rules turn it into the fused attention op before autodiff."""

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            return self.attention(x, x, x)[0]

    plan = compile_plan(SelfAttention(), lambda m, x: F.mean(m(x) * m(x)), {"x": mn.f32[2, 5, 16]}, optim.SGD(lr=0.1))
    assert plan.traced.recognition.rule("recognize_attention").matches > 0
    ops = [n.op for n in plan.fused_graph if n.id in plan.fused_graph.live_ids()]
    assert "attention" in ops and "attention_grad_q" in ops and "softmax" not in ops


# ---------------------------------------------------------------------------------------------
# Modes, initialisation, errors


class Wrapped(nn.Module):
    """`inner(x)` reduced to one tensor by `take`."""

    def __init__(self, inner: nn.Module, take) -> None:
        super().__init__()
        self.inner = inner
        self.take = take

    def forward(self, x):
        return self.take(self.inner, x)


DROPPING = {  # a module with dropout, the same without, and how to call it
    "encoder layer": (lambda p: nn.TransformerEncoderLayer(8, 2, 16, dropout=p), lambda m, x: m(x)),
    "attention weights": (lambda p: nn.MultiheadAttention(8, 2, dropout=p), lambda m, x: m(x, x, x)[0]),
    "attention": (lambda p: nn.MultiheadAttention(8, 2, dropout=p), lambda m, x: m(x, x, x, need_weights=False)[0]),
    "LSTM layers": (lambda p: nn.LSTM(8, 6, num_layers=2, dropout=p), lambda m, x: m(x)[0]),
}


@pytest.mark.filterwarnings("ignore:.*keep the mode they were compiled in")
@pytest.mark.parametrize("name", sorted(DROPPING))
def test_eval_mode_disables_dropout(name):
    """Dropout draws random numbers in training only: after eval() the traced step has no random
    node and no attention that drops its weights (it reads no RNG state), and its output is the
    output of the same weights with p = 0."""
    make, take = DROPPING[name]
    x = normal(5, 2, 8)
    dropping, plain = Wrapped(make(0.4), take), Wrapped(make(0.0), take)
    plain.load_state_dict(dropping.state_dict())

    def draws(graph) -> bool:
        return any(n.op == "rand" or (n.op == "attention" and n.attr("dropout") > 0) for n in graph)

    traced = compile_plan(dropping, None, {"x": mn.f32[5, 2, 8]}).traced.graph
    assert draws(traced)
    dropping.eval()
    traced = compile_plan(dropping, None, {"x": mn.f32[5, 2, 8]}).traced.graph
    assert not draws(traced) and not any(n.op == "state" for n in traced)
    reference = compile_plan(plain, None, {"x": mn.f32[5, 2, 8]}).traced.graph
    params = params64(dropping)
    got = interpret(traced, {"x": x}, params, dtype=np.float64).outputs["output"]
    np.testing.assert_array_equal(got, interpret(reference, {"x": x}, params, dtype=np.float64).outputs["output"])


def test_default_initialisation_follows_torch():
    """MultiheadAttention: in_proj_weight xavier_uniform_ (bound √(6/(E + 3E))), in_proj_bias and
    out_proj.bias zeros, out_proj.weight Linear's U(±1/√E); recurrent layers and cells:
    every parameter U(±1/√hidden)."""
    nn.manual_seed(3)
    attention = nn.MultiheadAttention(64, 4)
    weight = attention.in_proj_weight.numpy()
    bound = math.sqrt(6.0 / (64 + 3 * 64))
    assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.95 * bound
    assert abs(weight.std() - bound / math.sqrt(3)) < 0.02 * bound
    assert not attention.in_proj_bias.numpy().any() and not attention.out_proj.bias.numpy().any()
    out = attention.out_proj.weight.numpy()
    assert np.abs(out).max() <= 1 / 8 and np.abs(out).max() > 0.95 / 8
    separate = nn.MultiheadAttention(8, 2, kdim=5, vdim=3)
    assert [name for name, _ in separate.named_parameters()] == [
        "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias",
    ]  # fmt: skip
    assert np.abs(separate.k_proj_weight.numpy()).max() <= math.sqrt(6.0 / 13)
    for module in (nn.LSTM(7, 16, 2, bidirectional=True), nn.GRU(5, 16), nn.RNN(4, 16), nn.LSTMCell(3, 16)):
        for name, param in module.named_parameters():
            values = param.numpy()
            assert np.abs(values).max() <= 0.25 and np.abs(values).max() > 0.2, (type(module).__name__, name)


def test_refused_arguments_say_what_is_supported():
    with pytest.raises(NotImplementedError, match="proj_size is not supported"):
        nn.LSTM(4, 8, proj_size=2)
    with pytest.raises(NotImplementedError, match="add_bias_kv and add_zero_attn are not supported"):
        nn.MultiheadAttention(8, 2, add_bias_kv=True)
    with pytest.raises(NotImplementedError, match="add_bias_kv and add_zero_attn are not supported"):
        nn.MultiheadAttention(8, 2, add_zero_attn=True)
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads"):
        nn.MultiheadAttention(8, 3)
    with pytest.raises(ValueError, match="Unknown nonlinearity 'gelu'"):
        nn.RNN(4, 8, nonlinearity="gelu")
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not silu"):
        nn.TransformerEncoderLayer(8, 2, activation="silu")
    with pytest.raises(ValueError, match="dropout should be a number in range"):
        nn.GRU(4, 8, dropout=1.5)
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(4, 8, dropout=0.2)


def test_wrong_shapes_and_missing_masks_name_the_users_line():
    lstm, attention = nn.LSTM(4, 8), nn.MultiheadAttention(8, 2)

    class Model(nn.Module):
        def __init__(self, fn):
            super().__init__()
            self.lstm, self.attention, self.fn = lstm, attention, fn

        def forward(self, x):
            return self.fn(self, x)

    cases = [
        (lambda m, x: m.lstm(x)[0], (5, 3, 5), r"input.size\(-1\) must be equal to input_size. Expected 4, got 5"),
        (lambda m, x: m.lstm(x, (x, x))[0], (5, 3, 4), r"Expected hidden\[0\] size \(1, 3, 8\)"),
        (lambda m, x: m.attention(x, x, x, is_causal=True)[0], (5, 3, 8), "Need attn_mask if specifying"),
        (lambda m, x: m.attention(x, x, x)[0], (5, 3, 7), "was expecting embedding dimension of 8, but got 7"),
        (lambda m, x: m.lstm(x)[0], (2, 5, 3, 4), "Expected input to be 2D or 3D, got 4D instead"),
    ]
    for fn, shape, message in cases:
        with pytest.raises((ShapeError, RuntimeError), match=message) as error:
            compile_plan(Model(fn), None, {"x": mn.f32[shape]})
        assert "test_sequence_modules.py" in str(error.value)


def test_square_subsequent_mask_is_torchs():
    """nn.Transformer.generate_square_subsequent_mask: −inf above the diagonal, 0 elsewhere; a numpy
    array outside a trace, a traced Tensor with the same values inside one."""
    expected = np.where(np.triu(np.ones((4, 4)), 1) > 0, -np.inf, 0.0).astype(np.float32)
    np.testing.assert_array_equal(nn.Transformer.generate_square_subsequent_mask(4), expected)

    class Masked(nn.Module):
        def forward(self, x):
            return x + nn.Transformer.generate_square_subsequent_mask(4)

    plan = compile_plan(Masked(), None, {"x": mn.f32[4, 4]})
    got = interpret(plan.traced.graph, {"x": np.zeros((4, 4), np.float32)}).outputs["output"]
    np.testing.assert_array_equal(got, expected)


def test_missing_names_are_gone_from_the_hints():
    from meganeura.pytorch_names import ANOTHER_WAY

    for name in ("MultiheadAttention", "TransformerEncoderLayer", "TransformerEncoder", "LSTM", "GRU", "RNN"):
        assert hasattr(nn, name) and name not in ANOTHER_WAY["meganeura.nn"]
    for name in ("LSTMCell", "GRUCell", "RNNCell", "TransformerDecoderLayer", "TransformerDecoder", "Transformer"):
        assert hasattr(nn, name)


# ---------------------------------------------------------------------------------------------
# The recurrent cells as kernels and their gradients


CELL_SHAPES = {
    "lstm_cell": [(3, 20), (3, 5)],
    "lstm_cell_grad": [(3, 20), (3, 5), (3, 5), (3, 5)],
    "gru_cell": [(2, 3, 21), (2, 3, 21), (2, 3, 7)],
    "gru_cell_grad": [(2, 3, 21), (2, 3, 21), (2, 3, 7), (2, 3, 7)],
}


@pytest.mark.parametrize("op", sorted(CELL_SHAPES))
def test_cell_kernels_follow_the_interpreter(op):
    """At ragged shapes (hidden 5 and 7, leading dims 3 and 2×3), every result; the gradients also
    with a zero constant for a gradient that does not reach (a literal, no buffer)."""
    for zero_last in (False, True):
        if zero_last and not op.endswith("_grad"):
            continue
        graph = Graph()
        shapes = CELL_SHAPES[op][:-1] if zero_last else CELL_SHAPES[op]
        leaves = [typed_leaf(graph, "input", f"x{i}", s) for i, s in enumerate(shapes)]
        if zero_last:
            leaves.append(emit(graph, "const", [], value=0.0))
        node = emit(graph, op, leaves)
        for k in range(graph[node].results):
            graph.outputs[f"r{k}"] = emit(graph, "result", [node], index=k) if graph[node].results > 1 else node
        inputs = {f"x{i}": normal(*s) for i, s in enumerate(shapes)}
        executable = check(graph, inputs)
        assert [spec.entry_point for spec in executable.kernels] == ["recurrent"]


def test_cell_gradients_match_finite_differences():
    rng = np.random.default_rng(1)

    def lstm(gates, c):
        h, c_new = apply_results("lstm_cell", gates, c)
        return h * 1.5 + c_new * c_new

    def lstm_hidden_only(gates, c):
        return apply_results("lstm_cell", gates, c)[0]

    def gru(gx, gh, h):
        return apply("gru_cell", gx, gh, h)

    assert gradcheck(lstm, [(3, 8), (3, 2)], rng) < 1e-6
    assert gradcheck(lstm_hidden_only, [(2, 12), (2, 3)], rng) < 1e-6
    assert gradcheck(gru, [(3, 6), (3, 6), (3, 2)], rng) < 1e-6


# ---------------------------------------------------------------------------------------------
# Compile time of a long unroll (the benchmark figure is in the report; this bound is generous)


def test_a_long_lstm_unroll_plans_quickly():
    """A 128-step LSTM's training step plans (trace, e-graph, lowering) within seconds: the fused
    cells keep a step ~20 IR nodes, and the time steps' gradients join in log₂(T) e-graph passes."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 16)

        def forward(self, x):
            return self.lstm(x)[0]

    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = compile_plan(Model(), lambda m, x: F.mean(m(x) * m(x)), {"x": mn.f32[128, 2, 8]}, optim.Adam(lr=1e-3))
    assert time.perf_counter() - started < 30.0
    assert not plan.rewrite_report.budget_hit
    assert len(plan.compiled.kernels) < 10 * 128


@pytest.mark.parametrize("op", sorted(CELL_SHAPES))
@pytest.mark.filterwarnings("ignore:invalid value encountered")
def test_cell_kernels_keep_nan_and_inf_as_the_interpreter(op):
    """Gates and states holding ±inf and NaN: the kernels give the interpreter's values (σ(±inf) =
    1, 0 and tanh(±inf) = ±1 as torch, inf·0 = NaN), NaN where it has one. (No finite gate below
    −17: there σ's oracle, ½(tanh(x/2) + 1), rounds to 0 where the kernel's 1/(1 + e⁻ˣ) gives
    torch's ~4e-18 at −40, and an infinite state times either differs.)"""
    special = np.array([np.inf, -np.inf, np.nan, 3.5, -3.5, 0.0, 1e-3, -7.5], np.float32)
    rng = np.random.default_rng(4)
    graph = Graph()
    shapes = CELL_SHAPES[op]
    leaves = [typed_leaf(graph, "input", f"x{i}", s) for i, s in enumerate(shapes)]
    node = emit(graph, op, leaves)
    for k in range(graph[node].results):
        graph.outputs[f"r{k}"] = emit(graph, "result", [node], index=k) if graph[node].results > 1 else node
    check(graph, {f"x{i}": rng.choice(special, size=s) for i, s in enumerate(shapes)})
