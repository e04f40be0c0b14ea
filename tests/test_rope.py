"""Rotary position embeddings (the half-split RoPE of HF Llama/SmolLM2): the `rope` op and its
gradient `rope_grad`, checked against HF's formula in numpy, against the slice/neg/cat composition
traced through the DSL, by finite differences mid-chain (float64 interpreter), and their kernels
against the interpreter on the GPU; then `F.rotary_tables` and a compiled model that uses them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, const, emit, gradcheck, one_op, run_traced, typed_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import ShapeError, infer_type, op_def
from meganeura.tensor import apply


def rotate_half_reference(x: np.ndarray) -> np.ndarray:
    """HF transformers' rotate_half: cat(−x2, x1) of the two halves of the last dim."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return np.concatenate((-x2, x1), axis=-1)


def rope_reference(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """HF's apply_rotary_pos_emb for one tensor: x·cos + rotate_half(x)·sin."""
    return x * cos + rotate_half_reference(x) * sin


def tables_reference(seq_len: int, dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """LlamaRotaryEmbedding's cos and sin for positions 0…seq_len−1, in float64."""
    inv_freq = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    freqs = np.outer(np.arange(seq_len), inv_freq)
    emb = np.concatenate((freqs, freqs), axis=-1)
    return np.cos(emb), np.sin(emb)


RNG = np.random.default_rng(7)


def normal(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape)


# -- numpy semantics ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x_shape, table_shape",
    [((2, 3, 7, 8), (7, 8)), ((5, 4), (5, 4)), ((3, 6), (6,)), ((2, 3, 5, 2), (2, 1, 5, 2)), ((4, 6), (4, 1))],
    ids=str,
)
def test_rope_evaluates_hf_formula(x_shape, table_shape):
    x, cos, sin = normal(*x_shape), normal(*table_shape), normal(*table_shape)
    out = op_def("rope").evaluate(x, cos, sin)
    assert out.shape == x_shape and out.dtype == np.float64
    np.testing.assert_allclose(out, rope_reference(x, cos, sin), rtol=1e-14, atol=1e-14)
    # spelled out for one element of each half: the low half takes −x[c+h], the high half x[c−h]
    h = x_shape[-1] // 2
    c, s = np.broadcast_to(cos, x_shape), np.broadcast_to(sin, x_shape)
    low, high = (0,) * (len(x_shape) - 1) + (0,), (0,) * (len(x_shape) - 1) + (h,)
    assert out[low] == pytest.approx(x[low] * c[low] - x[high] * s[low])
    assert out[high] == pytest.approx(x[high] * c[high] + x[low] * s[high])


def test_rope_with_real_tables_rotates_each_pair_and_keeps_norms():
    cos, sin = tables_reference(9, 8)
    x = normal(2, 3, 9, 8)
    out = op_def("rope").evaluate(x, cos, sin)
    np.testing.assert_allclose(out, rope_reference(x, cos, sin), rtol=1e-14, atol=1e-14)
    pairs = lambda v: v[..., :4] ** 2 + v[..., 4:] ** 2  # noqa: E731
    np.testing.assert_allclose(pairs(out), pairs(x), rtol=1e-12)  # a rotation of each (c, c + h) pair
    np.testing.assert_array_equal(out[:, :, 0], x[:, :, 0])  # position 0 is not rotated


@pytest.mark.parametrize("x_shape, table_shape", [((2, 3, 7, 8), (7, 8)), ((4, 6), (4, 1)), ((3, 2), (2,))], ids=str)
def test_rope_grad_is_the_transpose_of_rope(x_shape, table_shape):
    """<g, rope(x)> = <rope_grad(g), x> for every x and g: rope_grad is rope's exact adjoint."""
    x, g, cos, sin = normal(*x_shape), normal(*x_shape), normal(*table_shape), normal(*table_shape)
    forward = op_def("rope").evaluate(x, cos, sin)
    backward = op_def("rope_grad").evaluate(g, cos, sin)
    assert backward.shape == x_shape
    assert np.sum(g * forward) == pytest.approx(np.sum(backward * x), rel=1e-12)
    h = x_shape[-1] // 2
    gs = g * sin
    expected = g * cos + np.concatenate((gs[..., h:], -gs[..., :h]), axis=-1)
    np.testing.assert_allclose(backward, expected, rtol=1e-14, atol=1e-14)


# -- the DSL ----------------------------------------------------------------------------------------


def rope_composed(x, cos, sin):
    """HF's formula written with slices, unary minus, cat, * and +."""
    h = x.shape[-1] // 2
    return x * cos + F.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def test_rope_op_equals_the_traced_composition():
    inputs = {"x": normal(2, 3, 7, 8), "k": normal(2, 1, 7, 8), "cos": normal(7, 8), "sin": normal(7, 8)}

    def build(x, k, cos, sin):
        q_embed, k_embed = F.apply_rotary_pos_emb(x, k, cos, sin)
        return {
            "op": F.rotary_embedding(x, cos, sin),
            "composed": rope_composed(x, cos, sin),
            "q": q_embed,
            "k": k_embed,
            "k_composed": rope_composed(k, cos, sin),
        }

    out = run_traced(build, inputs)
    np.testing.assert_allclose(out["op"], out["composed"], rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(out["op"], rope_reference(inputs["x"], inputs["cos"], inputs["sin"]), rtol=1e-14)
    np.testing.assert_array_equal(out["q"], out["op"])
    np.testing.assert_allclose(out["k"], out["k_composed"], rtol=1e-14, atol=1e-14)


def test_apply_rotary_pos_emb_unsqueezes_hf_tables():
    """HF's layout: cos/sin [batch, seq, D] with unsqueeze_dim=1 against q [batch, heads, seq, D]."""
    inputs = {"q": normal(2, 3, 5, 4), "k": normal(2, 1, 5, 4), "cos": normal(2, 5, 4), "sin": normal(2, 5, 4)}
    out = run_traced(
        lambda q, k, cos, sin: dict(zip("qk", F.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1), strict=True)),
        inputs,
    )
    cos, sin = inputs["cos"][:, None], inputs["sin"][:, None]
    np.testing.assert_allclose(out["q"], rope_reference(inputs["q"], cos, sin), rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(out["k"], rope_reference(inputs["k"], cos, sin), rtol=1e-14, atol=1e-14)


def test_rope_checks_its_shapes():
    with pytest.raises(ShapeError, match=r"rope: expected x with an even.*f32\[2,3,5\]"):
        run_traced(lambda x, c: {"y": F.rotary_embedding(x, c, c)}, {"x": np.zeros((2, 3, 5)), "c": np.zeros((3, 5))})
    with pytest.raises(ShapeError, match=r"rope: cos f32\[7,8\] does not broadcast to x f32\[2,6,8\]"):
        run_traced(
            lambda x, c, s: {"y": F.rotary_embedding(x, c, s)},
            {"x": np.zeros((2, 6, 8)), "c": np.zeros((7, 8)), "s": np.zeros((6, 8))},
        )
    with pytest.raises(ShapeError, match="rope: sin"):  # sin would make the result larger than x
        run_traced(
            lambda x, c, s: {"y": F.rotary_embedding(x, c, s)},
            {"x": np.zeros((6, 8)), "c": np.zeros((6, 8)), "s": np.zeros((2, 6, 8))},
        )
    with pytest.raises(ShapeError, match="rope_grad"):
        infer_type("rope_grad", [TensorType((3, 4)), TensorType((4, 4)), TensorType((4,))], {})
    with pytest.raises(ShapeError, match="rope_grad"):
        infer_type("rope_grad", [TensorType(()), TensorType(()), TensorType(())], {})
    with pytest.raises(ShapeError, match="f32"):
        infer_type("rope", [TensorType((3, 4), "i32"), TensorType((4,)), TensorType((4,))], {})
    assert infer_type("rope", [TensorType((2, 3, 5, 4)), TensorType((5, 4)), TensorType(())], {}).shape == (2, 3, 5, 4)


def test_seq_first_rope_reads_x_and_rope_grad_writes_its_result_seq_first():
    """With seq_first the x side is [batch, seq, heads, D]: rope(x) = rope(xᵀ) of x with seq and
    heads swapped, its result heads-first; rope_grad(g) is rope_grad of heads-first g, swapped."""
    x, g, cos, sin = normal(2, 5, 3, 8), normal(2, 3, 5, 8), normal(5, 8), normal(5, 8)
    got = op_def("rope").evaluate(x, cos, sin, seq_first=True)
    np.testing.assert_allclose(got, rope_reference(x.transpose(0, 2, 1, 3), cos, sin), rtol=1e-14)
    swapped = op_def("rope_grad").evaluate(g, cos, sin, seq_first=True)
    np.testing.assert_array_equal(swapped, op_def("rope_grad").evaluate(g, cos, sin).transpose(0, 2, 1, 3))
    tables = [TensorType((5, 8)), TensorType((5, 8))]
    assert infer_type("rope", [TensorType((2, 5, 3, 8)), *tables], {"seq_first": True}).shape == (2, 3, 5, 8)
    assert infer_type("rope_grad", [TensorType((2, 3, 5, 8)), *tables], {"seq_first": True}).shape == (2, 5, 3, 8)
    with pytest.raises(ShapeError, match="rope: seq_first needs a 4-D operand"):
        infer_type("rope", [TensorType((5, 3, 8)), TensorType((5, 8)), TensorType((5, 8))], {"seq_first": True})
    with pytest.raises(ShapeError, match=r"rope: cos f32\[3,8\] does not broadcast to x heads-first f32\[2,3,5,8\]"):
        infer_type("rope", [TensorType((2, 5, 3, 8)), TensorType((3, 8)), TensorType((5, 8))], {"seq_first": True})


# -- gradients --------------------------------------------------------------------------------------


GRAD_CASES = [((2, 3, 5, 4), (5, 4)), ((3, 2), (3, 2)), ((2, 5, 6), (1, 5, 6)), ((4, 6), (4, 1))]


@pytest.mark.parametrize("x_shape, table_shape", GRAD_CASES, ids=str)
def test_rope_gradient_wrt_x_cos_and_sin(x_shape, table_shape):
    rng = np.random.default_rng(31)
    assert gradcheck(F.rotary_embedding, [x_shape, table_shape, table_shape], rng) < 1e-6


def test_rope_gradient_with_q_and_k_sharing_the_tables():
    def both(q, k, cos, sin):
        q_embed, k_embed = F.apply_rotary_pos_emb(q, k, cos, sin)
        return q_embed * k_embed + q_embed

    assert gradcheck(both, [(1, 2, 3, 4), (1, 2, 3, 4), (3, 4), (3, 4)], np.random.default_rng(32)) < 1e-6


@pytest.mark.parametrize("x_shape, table_shape", [((2, 3, 4), (3, 4)), ((4, 6), (6,))], ids=str)
def test_rope_grad_gradient(x_shape, table_shape):
    """rope_grad's own VJP (second order): w.r.t. its upstream gradient, cos and sin."""

    def rope_grad(g, cos, sin):
        return apply("rope_grad", g, cos, sin)

    assert gradcheck(rope_grad, [x_shape, table_shape, table_shape], np.random.default_rng(33)) < 1e-6


@pytest.mark.parametrize("op", ["rope", "rope_grad"])
def test_seq_first_rope_gradients(op):
    """rope and rope_grad with seq_first, differentiated w.r.t. x (or g), cos and sin."""

    def seq_first(x, cos, sin):
        return apply(op, x, cos, sin, seq_first=True)

    shape = (2, 4, 3, 6) if op == "rope" else (2, 3, 4, 6)  # seq 4, heads 3 on the x side
    assert gradcheck(seq_first, [shape, (4, 6), (1, 6)], np.random.default_rng(34)) < 1e-6


# -- kernels ----------------------------------------------------------------------------------------

KERNEL_CASES = [
    ((3, 2), (3, 2), (3, 2)),  # D = 2
    ((2, 3, 7, 48), (7, 48), (7, 48)),  # D = 48, seq 7
    ((1, 5, 33, 8), (33, 8), (33, 8)),  # seq 33
    ((3, 5, 33, 6), (1, 33, 6), (33, 6)),  # odd leading dims, cos and sin of different shapes
    ((2, 3, 33, 16), (2, 1, 33, 16), (2, 1, 33, 16)),  # HF's unsqueezed [batch, 1, seq, D] tables
    ((7, 48), (48,), (7, 48)),  # cos broadcast over rows only
    ((5, 7, 6), (5, 7, 1), (7, 1)),  # one value per row: the partner shares it
    ((3, 7, 10), (3, 7, 10), (3, 7, 10)),  # no broadcasting
    ((2, 129, 64), (129, 64), (129, 64)),  # more than one workgroup
]


@pytest.mark.parametrize("op", ["rope", "rope_grad"])
@pytest.mark.parametrize("shapes", KERNEL_CASES, ids=lambda s: "_".join("x".join(map(str, t)) for t in s))
def test_rope_kernels(op, shapes):
    graph = one_op(op, list(shapes))
    inputs = {f"x{i}": RNG.normal(size=shape).astype(np.float32) for i, shape in enumerate(shapes)}
    executable = check(graph, inputs)
    assert [spec.label.split()[0] for spec in executable.kernels] == [op]
    got = executable.run(inputs, read=("out",))["out"]
    x, cos, sin = (inputs[f"x{i}"].astype(np.float64) for i in range(3))
    if op == "rope":
        np.testing.assert_allclose(got, rope_reference(x, cos, sin), rtol=1e-5, atol=1e-5)
    else:
        ys = x * sin
        h = x.shape[-1] // 2
        expected = x * cos + np.concatenate((ys[..., h:], -ys[..., :h]), axis=-1)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


SEQ_FIRST_CASES = [  # the x side [batch, seq, heads, D], the tables; ragged, several workgroups
    ((2, 7, 3, 8), (7, 8)),
    ((1, 33, 5, 6), (1, 33, 6)),
    ((3, 65, 2, 48), (65, 48)),
    ((2, 16, 9, 64), (16, 64)),
    ((2, 7, 3, 8), (2, 1, 7, 8)),  # HF's unsqueezed [batch, 1, seq, D] tables
]


@pytest.mark.parametrize("op", ["rope", "rope_grad"])
@pytest.mark.parametrize("x_side, table", SEQ_FIRST_CASES, ids=str)
def test_seq_first_rope_kernels(op, x_side, table):
    """The kernels with seq_first against the interpreter and the swapped reference."""
    b, s, h, d = x_side
    operand = x_side if op == "rope" else (b, h, s, d)
    graph = one_op(op, [operand, table, table], seq_first=True)
    inputs = {f"x{i}": RNG.normal(size=shape).astype(np.float32) for i, shape in enumerate([operand, table, table])}
    executable = check(graph, inputs)
    assert [spec.label.split()[0] for spec in executable.kernels] == [op] and "seq-first" in executable.kernels[0].label
    got = executable.run(inputs, read=("out",))["out"]
    x, cos, sin = (inputs[f"x{i}"].astype(np.float64) for i in range(3))
    if op == "rope":
        np.testing.assert_allclose(got, rope_reference(x.transpose(0, 2, 1, 3), cos, sin), rtol=1e-5, atol=1e-5)
    else:
        ys, half = x * sin, d // 2
        expected = x * cos + np.concatenate((ys[..., half:], -ys[..., :half]), axis=-1)
        np.testing.assert_allclose(got, expected.transpose(0, 2, 1, 3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["rope", "rope_grad"])
def test_rope_kernels_with_shared_and_constant_tables(op):
    """cos and sin the same buffer (bound once), or scalar constants (inlined as literals)."""
    graph = Graph()
    x, table = typed_leaf(graph, "input", "x", (3, 5, 8)), typed_leaf(graph, "input", "t", (5, 8))
    graph.outputs["shared"] = emit(graph, op, [x, table, table])
    graph.outputs["constant"] = emit(graph, op, [x, const(graph, 0.5), const(graph, -2.0)])
    inputs = {"x": RNG.normal(size=(3, 5, 8)).astype(np.float32), "t": RNG.normal(size=(5, 8)).astype(np.float32)}
    executable = check(graph, inputs)
    assert [len(spec.bindings) for spec in executable.kernels] == [3, 2]  # x, t, out; x, out
    got = executable.run(inputs, read=("constant",))["constant"]
    x64 = inputs["x"].astype(np.float64)
    if op == "rope":
        expected = rope_reference(x64, 0.5, -2.0)
    else:
        expected = 0.5 * x64 - 2.0 * np.concatenate((x64[..., 4:], -x64[..., :4]), axis=-1)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


# -- tables -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seq_len, dim, base", [(7, 2, 10000.0), (33, 48, 10000.0), (128, 64, 100000.0)], ids=str)
def test_rotary_tables_follow_hf_formula(seq_len, dim, base):
    cos, sin = F.rotary_tables(seq_len, dim, base)
    assert cos.shape == sin.shape == (seq_len, dim) and cos.dtype == sin.dtype == np.float32
    ref_cos, ref_sin = tables_reference(seq_len, dim, base)
    # float32 angles (as HF computes them): off by at most a few ulps of position·inv_freq
    tolerance = 4 * seq_len * np.finfo(np.float32).eps
    np.testing.assert_allclose(cos, ref_cos, rtol=0, atol=tolerance)
    np.testing.assert_allclose(sin, ref_sin, rtol=0, atol=tolerance)
    np.testing.assert_array_equal(cos[:, : dim // 2], cos[:, dim // 2 :])  # emb = cat(freqs, freqs)
    np.testing.assert_array_equal(cos[0], np.ones(dim, np.float32))
    np.testing.assert_array_equal(sin[0], np.zeros(dim, np.float32))
    np.testing.assert_allclose(cos[:, 0], np.cos(np.arange(seq_len)), atol=1e-6)  # inv_freq[0] = 1


def test_rotary_tables_rejects_odd_head_dim():
    with pytest.raises(ValueError, match="even"):
        F.rotary_tables(4, 5)


def test_rotary_tables_match_torch():
    torch = pytest.importorskip("torch")
    seq_len, dim, base = 40, 32, 10000.0
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = (inv_freq[None, :, None].float() @ torch.arange(seq_len)[None, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)[0]
    cos, sin = F.rotary_tables(seq_len, dim, base)
    np.testing.assert_allclose(cos, emb.cos().numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(sin, emb.sin().numpy(), rtol=0, atol=1e-6)


# -- end to end -------------------------------------------------------------------------------------


class RotaryAttention(nn.Module):
    """q/k/v projections, RoPE on q and k (grouped KV heads), causal attention, an output projection."""

    def __init__(self, width: int = 16, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv_heads * self.dim, bias=False)
        self.v = nn.Linear(width, kv_heads * self.dim, bias=False)
        self.o = nn.Linear(width, width, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, width = x.shape
        q = self.q(x).view(batch, seq, self.heads, self.dim).transpose(1, 2)
        k = self.k(x).view(batch, seq, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v(x).view(batch, seq, self.kv_heads, self.dim).transpose(1, 2)
        q, k = F.apply_rotary_pos_emb(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(out.transpose(1, 2).reshape(batch, seq, width))


def test_rope_compiles_and_runs_in_a_model():
    mn.manual_seed(0)
    model = RotaryAttention()
    program = mn.compile(model, inputs={"x": mn.f32[2, 7, 16], "cos": mn.f32[7, 4], "sin": mn.f32[7, 4]})
    assert sum(spec.label.startswith("rope ") for spec in program.executable.kernels) == 2
    x = np.random.default_rng(1).normal(size=(2, 7, 16)).astype(np.float32)
    cos, sin = F.rotary_tables(7, 4)
    got = program(x=x, cos=cos, sin=sin)
    weights = {name: p.numpy().astype(np.float64) for name, p in model.named_parameters()}
    x64 = x.astype(np.float64)
    heads = lambda t, n: t.reshape(2, 7, n, 4).transpose(0, 2, 1, 3)  # noqa: E731
    q = rope_reference(heads(x64 @ weights["q.weight"].T, 4), cos, sin)
    k = np.repeat(rope_reference(heads(x64 @ weights["k.weight"].T, 2), cos, sin), 2, axis=1)
    v = np.repeat(heads(x64 @ weights["v.weight"].T, 2), 2, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / 2.0 + np.triu(np.full((7, 7), -np.inf), 1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = (probs @ v).transpose(0, 2, 1, 3).reshape(2, 7, 16) @ weights["o.weight"].T
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_training_steps_through_rope_follow_the_interpreter():
    mn.manual_seed(1)
    program = mn.compile(
        RotaryAttention(),
        loss=lambda model, x, cos, sin, y: F.mse_loss(model(x, cos, sin), y),
        inputs={"x": mn.f32[2, 5, 16], "cos": mn.f32[5, 4], "sin": mn.f32[5, 4], "y": mn.f32[2, 5, 16]},
        optimizer=optim.Adam(lr=1e-2),
    )
    labels = [spec.label.split()[0] for spec in program.executable.kernels]
    assert "rope" in labels and "rope_grad" in labels
    rng = np.random.default_rng(2)
    cos, sin = F.rotary_tables(5, 4)
    feed = {
        "x": rng.normal(size=(2, 5, 16)).astype(np.float32),
        "cos": cos,
        "sin": sin,
        "y": rng.normal(size=(2, 5, 16)).astype(np.float32),
    }
    losses = assert_steps_follow_interpreter(program, [feed] * 3)
    assert losses[-1] < losses[0]


def test_the_llama_step_reads_and_writes_rope_seq_first():
    """In the bench's small SmolLM2 step, rope reads q and k as the projections lay them out and
    rope_grad writes dq and dk that way (rewrite/algebra.py `rope_layout`): no permute next to them."""
    from meganeura.bench.workloads import STEPS
    from meganeura.compiler import compile_plan

    work = STEPS["smollm2"].build(small=True)
    graph = compile_plan(work.model, work.loss, work.inputs, work.optimizer).fused_graph
    live = graph.live_ids()
    ropes = [n for n in graph if n.id in live and n.op in ("rope", "rope_grad")]
    assert len(ropes) == 8 and all(n.attr("seq_first") for n in ropes)  # q and k, 2 layers, each way
    rope_ids = {n.id for n in ropes}
    readers = {n.id for n in graph if n.id in live and n.inputs and n.inputs[0] in rope_ids}
    assert not [n for n in (*(graph[r.inputs[0]] for r in ropes), *(graph[i] for i in readers)) if n.op == "permute"]
