"""Weights in and out (issue 11, item 5): load_state_dict from numpy or torch with every mismatch
reported at once and nothing loaded unless everything fits, strict=False as PyTorch, safetensors
files (single, sharded with their index, bfloat16), what a PyTorch user reaches for on parameters,
num_batches_tracked as int64, the last step's gradients on request, and a small random HF
LlamaForCausalLM loaded into the same model written with HF's module names (where transformers is
installed), matching its logits, gradients and one training step."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

N_IN, HIDDEN, N_OUT, BATCH = 7, 9, 3, 5  # ragged: no tile multiples


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(N_IN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, N_OUT)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def mse(model, x, t):
    return F.mse_loss(model(x), t)


def random_state(rng, model) -> dict[str, np.ndarray]:
    return {name: rng.normal(size=value.shape).astype(np.float32) for name, value in model.state_dict().items()}


# -- load_state_dict: every mismatch at once, nothing loaded unless everything fits -------------


def test_every_mismatch_is_reported_at_once_and_nothing_is_loaded():
    model = MLP()
    before = model.state_dict()
    bad = random_state(np.random.default_rng(0), model)
    del bad["fc1.bias"]  # missing
    bad["fc3.weight"] = np.zeros(2, np.float32)  # unexpected
    bad["fc1.weight"] = np.zeros((N_IN, HIDDEN), np.float32)  # transposed: a shape mismatch
    bad["fc2.weight"] = np.zeros((N_OUT, HIDDEN), np.int32)  # a dtype mismatch
    bad["fc2.bias"] = np.array([1.0, np.nan, 0.0], np.float32)  # not finite
    with pytest.raises(mn.StateDictError) as caught:
        model.load_state_dict(bad)
    message = str(caught.value)
    for expected in (
        "missing keys ['fc1.bias']",
        "unexpected keys ['fc3.weight']",
        f"fc1.weight: shape ({N_IN}, {HIDDEN}) in the state, ({HIDDEN}, {N_IN}) in the model",
        "fc2.weight: dtype int32 in the state, the model needs floating-point values",
        "fc2.bias: contains NaN or infinity",
    ):
        assert expected in message, message
    assert len(caught.value.problems) == 5
    assert isinstance(caught.value, KeyError) and isinstance(caught.value, ValueError)
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)  # not even the good ones


def test_strict_false_returns_missing_and_unexpected_names_as_pytorch():
    model = MLP()
    before = model.state_dict()
    new = random_state(np.random.default_rng(1), model)
    partial = {"fc1.weight": new["fc1.weight"], "fc2.bias": new["fc2.bias"], "head.weight": np.ones(2)}
    result = model.load_state_dict(partial, strict=False)
    assert isinstance(result, mn.IncompatibleKeys) and isinstance(result, tuple)
    assert result.missing_keys == ["fc1.bias", "fc2.weight"]
    assert result.unexpected_keys == ["head.weight"]
    assert result == (["fc1.bias", "fc2.weight"], ["head.weight"])
    state = model.state_dict()
    np.testing.assert_array_equal(state["fc1.weight"], new["fc1.weight"])
    np.testing.assert_array_equal(state["fc2.bias"], new["fc2.bias"])
    np.testing.assert_array_equal(state["fc1.bias"], before["fc1.bias"])
    assert model.load_state_dict(new) == mn.IncompatibleKeys([], [])
    # Shapes are checked even when names are not (PyTorch's size mismatch under strict=False too).
    with pytest.raises(ValueError, match=r"fc2.bias: shape \(4,\)"):
        model.load_state_dict({"fc2.bias": np.zeros(4)}, strict=False)


def test_program_loads_with_the_same_checks_and_runs_with_what_it_loaded():
    rng = np.random.default_rng(2)
    model = MLP()
    program = mn.compile(model, mse, {"x": mn.f32[BATCH, N_IN], "t": mn.f32[BATCH, N_OUT]}, optim.SGD(lr=0.1))
    infer = mn.compile(model, inputs={"x": mn.f32[BATCH, N_IN]})
    new = random_state(rng, model)
    before = program.state_dict()
    with pytest.raises(mn.StateDictError, match=r"unexpected keys \['x'\]\n  fc2.weight: shape \(3, 8\)"):
        program.load_state_dict({**new, "fc2.weight": new["fc2.weight"][:, :-1], "x": 1})
    for name, value in program.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    result = program.load_state_dict({k: v for k, v in new.items() if k != "fc2.bias"}, strict=False)
    assert result.missing_keys == ["fc2.bias"] and result.unexpected_keys == []
    x = rng.normal(size=(BATCH, N_IN)).astype(np.float32)
    hidden = np.maximum(x @ new["fc1.weight"].T + new["fc1.bias"], 0)
    expected = hidden @ new["fc2.weight"].T + before["fc2.bias"]
    np.testing.assert_allclose(infer(x=x), expected, rtol=1e-5, atol=1e-5)


# -- parameters: what a PyTorch user reaches for ------------------------------------------------


def test_parameter_data_detach_numpy_and_asarray_read_the_current_value():
    model = MLP()
    program = mn.compile(model, mse, {"x": mn.f32[BATCH, N_IN], "t": mn.f32[BATCH, N_OUT]}, optim.SGD(lr=0.5))
    rng = np.random.default_rng(3)
    weight = model.fc1.weight
    initial = weight.numpy()
    program.train_step(x=rng.normal(size=(BATCH, N_IN)), t=rng.normal(size=(BATCH, N_OUT)))
    trained = program.state_dict()["fc1.weight"]
    assert not np.array_equal(trained, initial)  # the step changed it on the GPU
    for read in (weight.numpy(), weight.data.numpy(), weight.detach().cpu().numpy(), np.asarray(weight)):
        np.testing.assert_array_equal(read, trained)
    assert np.asarray(weight, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="copy"):
        np.asarray(weight, copy=False)
    value = rng.normal(size=weight.shape).astype(np.float32)
    weight.data = value  # torch's `p.data = x` (same shape: the program holds the buffer)
    np.testing.assert_array_equal(program.state_dict()["fc1.weight"], value)
    weight.data.copy_(2 * value)
    np.testing.assert_array_equal(np.asarray(weight), 2 * value)
    with pytest.raises(ValueError, match="shape"):
        weight.data = np.zeros((2, 2), np.float32)


def test_num_batches_tracked_is_int64_at_the_state_dict_boundary():
    model = nn.Sequential(nn.BatchNorm2d(3))
    state = model.state_dict()
    assert state["0.num_batches_tracked"].dtype == np.int64 and state["0.num_batches_tracked"].shape == ()
    shape = (2, 3, 4, 5)
    loss = lambda m, x: F.mse_loss(m(x), x)  # noqa: E731
    program = mn.compile(model, loss, {"x": mn.f32[shape]}, optim.SGD(lr=0.1))
    rng = np.random.default_rng(4)
    for _ in range(3):
        program.train_step(x=rng.normal(size=shape))
    for source in (program.state_dict(), model.state_dict()):
        assert source["0.num_batches_tracked"].dtype == np.int64 and int(source["0.num_batches_tracked"]) == 3
    assert model[0].num_batches_tracked.numpy().dtype == np.int64
    loaded = {**model.state_dict(), "0.num_batches_tracked": np.int64(41)}
    program.load_state_dict(loaded)
    program.train_step(x=rng.normal(size=shape))
    assert program.state_dict()["0.num_batches_tracked"] == 42
    program.load_state_dict({**loaded, "0.num_batches_tracked": np.float32(7.0)})  # an integral float fits
    with pytest.raises(ValueError, match="0.num_batches_tracked: dtype float32 in the state, the model needs integer"):
        program.load_state_dict({**loaded, "0.num_batches_tracked": np.float32(7.5)})
    assert int(program.state_dict()["0.num_batches_tracked"]) == 7


# -- gradients on request -----------------------------------------------------------------------


def mlp_gradients(state, x, t):
    """d mean((fc2(relu(fc1(x))) − t)²) / d each parameter, by hand in float64."""
    w1, b1, w2, b2 = (state[k].astype(np.float64) for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"))
    pre = x @ w1.T + b1
    hidden = np.maximum(pre, 0)
    out = hidden @ w2.T + b2
    d_out = 2 * (out - t) / out.size
    d_pre = (d_out @ w2) * (pre > 0)
    return {
        "fc1.weight": d_pre.T @ x,
        "fc1.bias": d_pre.sum(0),
        "fc2.weight": d_out.T @ hidden,
        "fc2.bias": d_out.sum(0),
    }


@pytest.mark.parametrize("rewrite", [True, False])
def test_gradients_of_the_last_step_on_request(rewrite):
    rng = np.random.default_rng(5)
    inputs = {"x": mn.f32[BATCH, N_IN], "t": mn.f32[BATCH, N_OUT]}
    model = MLP()
    lr = 0.25
    program = mn.compile(model, mse, inputs, optim.SGD(lr=lr), rewrite=rewrite, keep_gradients=True)
    with pytest.raises(RuntimeError, match="no step has run yet"):
        program.gradients()
    for _ in range(2):  # the second step's gradients, at the parameters the first step left
        before = program.state_dict()
        x, t = rng.normal(size=(BATCH, N_IN)), rng.normal(size=(BATCH, N_OUT))
        program.train_step(x=x, t=t)
        grads = program.gradients()
    assert list(grads) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    expected = mlp_gradients(before, x, t)
    after = program.state_dict()
    for name, grad in grads.items():
        assert grad.dtype == np.float32 and grad.shape == before[name].shape
        np.testing.assert_allclose(grad, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)
        # SGD applied exactly this gradient.
        np.testing.assert_allclose(after[name], before[name] - lr * grad, rtol=1e-5, atol=1e-6, err_msg=name)


def test_gradients_cost_nothing_unless_asked_for():
    inputs = {"x": mn.f32[BATCH, N_IN], "t": mn.f32[BATCH, N_OUT]}
    plain = mn.compile(MLP(), mse, inputs, optim.Adam(lr=1e-3))
    assert list(plain.graph.outputs) == ["loss"]  # no gradient leaves the step, none is read back
    with pytest.raises(RuntimeError, match="keep_gradients=True"):
        plain.gradients()
    kept = mn.compile(MLP(), mse, inputs, optim.Adam(lr=1e-3), keep_gradients=True)
    assert sorted(kept.graph.outputs) == [
        "grad:fc1.bias",
        "grad:fc1.weight",
        "grad:fc2.bias",
        "grad:fc2.weight",
        "loss",
    ]
    infer = mn.compile(MLP(), inputs={"x": mn.f32[BATCH, N_IN]})
    with pytest.raises(RuntimeError, match="training program"):
        infer.gradients()


def test_gradients_match_finite_differences_of_the_loss():
    """Independent of the hand-written formula: central differences of the loss in float64."""
    rng = np.random.default_rng(6)
    model = MLP()
    inputs = {"x": mn.f32[BATCH, N_IN], "t": mn.f32[BATCH, N_OUT]}
    program = mn.compile(model, mse, inputs, optim.SGD(lr=0.0), keep_gradients=True)  # lr 0: weights stay
    x, t = rng.normal(size=(BATCH, N_IN)), rng.normal(size=(BATCH, N_OUT))
    program.train_step(x=x, t=t)
    grads = program.gradients()
    state = {k: v.astype(np.float64) for k, v in program.state_dict().items()}

    def loss_at(s):
        out = np.maximum(x @ s["fc1.weight"].T + s["fc1.bias"], 0) @ s["fc2.weight"].T + s["fc2.bias"]
        return np.mean((out - t) ** 2)

    eps = 1e-6
    for name in ("fc1.weight", "fc2.bias"):
        numeric = np.zeros_like(state[name])
        for index in np.ndindex(numeric.shape):
            for sign in (1, -1):
                shifted = {k: v.copy() for k, v in state.items()}
                shifted[name][index] += sign * eps
                numeric[index] += sign * loss_at(shifted) / (2 * eps)
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-3, atol=1e-5, err_msg=name)


# -- safetensors files --------------------------------------------------------------------------


def test_safetensors_single_and_sharded_files_written_with_numpy(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    rng = np.random.default_rng(7)
    model = MLP()
    state = random_state(rng, model)
    single = tmp_path / "model.safetensors"
    safetensors_numpy.save_file(state, str(single), metadata={"format": "np"})
    loaded = mn.load_safetensors(single)
    assert sorted(loaded) == sorted(state)
    for name, value in state.items():
        np.testing.assert_array_equal(loaded[name], value)
    from_folder = mn.load_safetensors(tmp_path)  # the folder's model.safetensors
    assert list(from_folder) == list(loaded)
    np.testing.assert_array_equal(from_folder["fc2.bias"], state["fc2.bias"])

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shards = {"model-00001-of-00002.safetensors": ["fc1.weight", "fc1.bias"]}
    shards["model-00002-of-00002.safetensors"] = ["fc2.weight", "fc2.bias"]
    weight_map = {}
    for shard, names in shards.items():
        # float16 in one shard: load_state_dict widens it to float32.
        arrays = {n: state[n].astype(np.float16 if n == "fc2.weight" else np.float32) for n in names}
        safetensors_numpy.save_file(arrays, str(sharded / shard))
        weight_map |= dict.fromkeys(names, shard)
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    from_index = mn.load_safetensors(sharded / "model.safetensors.index.json")
    assert list(from_index) == list(weight_map) and from_index["fc2.weight"].dtype == np.float16
    assert list(mn.load_safetensors(sharded)) == list(weight_map)  # the folder finds the index
    model.load_state_dict(from_index)
    np.testing.assert_array_equal(model.state_dict()["fc1.weight"], state["fc1.weight"])
    np.testing.assert_array_equal(model.state_dict()["fc2.weight"], state["fc2.weight"].astype(np.float16))

    # Broken checkpoints are refused with the file named.
    index["weight_map"]["fc2.extra"] = "model-00002-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match=r"fc2.extra \(in model-00002-of-00002.safetensors\)"):
        mn.load_safetensors(sharded)
    index["weight_map"]["fc2.extra"] = "model-00003-of-00002.safetensors"
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="model-00003-of-00002.safetensors"):
        mn.load_safetensors(sharded)
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(single.read_bytes()[:-40])
    with pytest.raises(ValueError, match="truncated.safetensors"):
        mn.load_safetensors(truncated)
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(b"PK\x03\x04 this is a zip file, not a checkpoint")
    with pytest.raises(ValueError, match="foreign.safetensors"):
        mn.load_safetensors(foreign)
    ambiguous = tmp_path / "ambiguous"
    ambiguous.mkdir()
    for name in ("a.safetensors", "b.safetensors"):
        safetensors_numpy.save_file({"w": np.zeros(2, np.float32)}, str(ambiguous / name))
    with pytest.raises(FileNotFoundError, match=r"neither .* pass one of them"):
        mn.load_safetensors(ambiguous)


# -- PyTorch tensors and files (where torch is installed) ---------------------------------------


def test_torch_state_dict_loads_as_is():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(N_IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, N_OUT))
    ours = nn.Sequential(nn.Linear(N_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, N_OUT))
    assert ours.load_state_dict(reference.state_dict()) == ([], [])
    # Tensors that need grad, bfloat16 and float16 ones are detached and widened.
    params = dict(reference.named_parameters())  # requires_grad=True
    ours.load_state_dict({**params, "2.bias": params["2.bias"].detach().to(torch.bfloat16)})
    np.testing.assert_array_equal(ours.state_dict()["2.bias"], params["2.bias"].detach().bfloat16().float().numpy())
    ours.load_state_dict(reference.state_dict())
    x = np.random.default_rng(8).normal(size=(BATCH, N_IN)).astype(np.float32)
    got = mn.compile(ours, inputs={"x": mn.f32[BATCH, N_IN]})(x=x)
    np.testing.assert_allclose(got, reference(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-5)
    with pytest.raises(mn.StateDictError, match=r"0.weight: dtype int64 in the state") as caught:
        ours.load_state_dict({**reference.state_dict(), "0.weight": torch.zeros(HIDDEN, N_IN, dtype=torch.int64)})
    assert "unexpected" not in str(caught.value)
    with pytest.raises(mn.StateDictError, match="meta"):
        ours.load_state_dict({**reference.state_dict(), "0.bias": torch.zeros(HIDDEN, device="meta")})


def test_torch_batch_norm_state_round_trips_with_int64_num_batches_tracked():
    torch = pytest.importorskip("torch")
    reference = torch.nn.BatchNorm2d(3)
    reference(torch.randn(4, 3, 2, 2))
    reference(torch.randn(4, 3, 2, 2))
    ours = nn.BatchNorm2d(3)
    ours.load_state_dict(reference.state_dict())
    state = ours.state_dict()
    assert state["num_batches_tracked"].dtype == np.int64 and int(state["num_batches_tracked"]) == 2
    back = {name: torch.from_numpy(np.asarray(value)) for name, value in state.items()}
    reference.load_state_dict(back)  # torch takes ours back with the dtypes it keeps
    assert reference.num_batches_tracked.dtype == torch.int64


def test_safetensors_written_by_torch_including_bfloat16(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(1)
    reference = torch.nn.Sequential(torch.nn.Linear(N_IN, HIDDEN), torch.nn.BatchNorm1d(HIDDEN))
    state = {k: v.contiguous() for k, v in reference.state_dict().items()}
    state["0.weight"] = state["0.weight"].to(torch.bfloat16)
    state["0.bias"] = state["0.bias"].to(torch.float16)
    safetensors_torch.save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    loaded = mn.load_safetensors(tmp_path / "model.safetensors")
    assert loaded["0.weight"].dtype == np.float32  # bfloat16 widened exactly
    np.testing.assert_array_equal(loaded["0.weight"], state["0.weight"].float().numpy())
    np.testing.assert_array_equal(loaded["0.bias"], state["0.bias"].numpy())
    assert loaded["1.num_batches_tracked"].dtype == np.int64
    assert sorted(loaded) == sorted(state)


# -- a small random HF LlamaForCausalLM (where transformers is installed) -----------------------


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.hidden_size // self.heads
        dim = cfg.hidden_size
        self.q_proj = nn.Linear(dim, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = F.apply_rotary_pos_emb(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, ids, cos, sin):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    """HF's LlamaForCausalLM with its module names (untied head): logits [batch·seq, vocab]."""

    def __init__(self, cfg):
        super().__init__()
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, ids, cos, sin):
        h = self.model(ids, cos, sin)
        return self.lm_head(h.reshape(h.shape[0] * h.shape[1], h.shape[2]))


def rope_base(cfg) -> float:
    parameters = getattr(cfg, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def test_hf_llama_weights_logits_gradients_and_one_step(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=37, hidden_size=32, intermediate_size=44, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.LlamaForCausalLM(cfg).float()
    with torch.no_grad():  # norms away from ones, so that loading them matters
        for name, p in reference.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    reference.save_pretrained(tmp_path, max_shard_size="20KB")  # sharded: several files and their index
    assert (tmp_path / "model.safetensors.index.json").exists()
    weights = mn.load_safetensors(tmp_path)
    model = LlamaForCausalLM(cfg)
    result = model.load_state_dict(weights, strict=False)
    assert result.missing_keys == [] and all("rotary" in name for name in result.unexpected_keys), result

    batch, seq, head_dim = 2, 7, cfg.hidden_size // cfg.num_attention_heads
    rng = np.random.default_rng(9)
    ids = rng.integers(0, cfg.vocab_size, size=(batch, seq)).astype(np.int32)
    targets = rng.integers(0, cfg.vocab_size, size=(batch * seq,)).astype(np.int32)
    cos, sin = F.rotary_tables(seq, head_dim, base=rope_base(cfg))
    specs = {"ids": mn.i32[batch, seq], "cos": mn.f32[seq, head_dim], "sin": mn.f32[seq, head_dim]}

    infer = mn.compile(model, inputs=specs)
    logits = infer(ids=ids, cos=cos, sin=sin)
    ids_t = torch.from_numpy(ids.astype(np.int64))
    ref_logits = reference(input_ids=ids_t).logits.reshape(batch * seq, cfg.vocab_size)
    np.testing.assert_allclose(logits, ref_logits.detach().numpy(), rtol=1e-4, atol=1e-4)

    lr = 0.05
    step = mn.compile(
        model,
        lambda m, ids, cos, sin, y: F.cross_entropy(m(ids, cos, sin), y),
        {**specs, "y": mn.i32[batch * seq]},
        optim.SGD(lr=lr),
        keep_gradients=True,
    )
    loss = step.train_step(ids=ids, cos=cos, sin=sin, y=targets)
    sgd = torch.optim.SGD(reference.parameters(), lr=lr)
    sgd.zero_grad()
    ref_loss = torch.nn.functional.cross_entropy(
        reference(input_ids=ids_t).logits.reshape(batch * seq, cfg.vocab_size),
        torch.from_numpy(targets.astype(np.int64)),
    )
    ref_loss.backward()
    assert math.isclose(loss, ref_loss.item(), rel_tol=1e-5, abs_tol=1e-6)
    grads = step.gradients()
    ref_params = dict(reference.named_parameters())
    assert sorted(grads) == sorted(ref_params)
    for name, grad in grads.items():
        np.testing.assert_allclose(grad, ref_params[name].grad.numpy(), rtol=1e-3, atol=1e-5, err_msg=name)
    sgd.step()
    after = step.state_dict()
    for name, value in reference.state_dict().items():
        if name in after:
            np.testing.assert_allclose(after[name], value.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    logits_after = infer(ids=ids, cos=cos, sin=sin)  # the inference program shares the trained weights
    ref_after = reference(input_ids=ids_t).logits.reshape(batch * seq, cfg.vocab_size).detach().numpy()
    np.testing.assert_allclose(logits_after, ref_after, rtol=1e-4, atol=1e-4)
