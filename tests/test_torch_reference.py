"""meganeura against reference values PyTorch produced, kept in tests/reference/*.npz (written by
scripts/make_torch_references.py, which needs torch; these tests do not).

Each file is one scenario (model, loss, optimizer, 5 steps in float64 on seeded float32 batches).
The model is mirrored here in meganeura's DSL with PyTorch's parameter names, loaded with the
file's initial values and trained on the file's batches, two ways:

- on the numpy interpreter of the traced graph (`interpreter_steps`): no adapter needed. The
  GPU-vs-interpreter tests elsewhere run one traced graph twice, so a wrong gradient (autodiff)
  or a wrong update rule (the optimizer's graph) in it passes them; only a reference from
  outside catches those, and this path does on any machine.
- on the device (`train_step`, lavapipe counts): the e-graph's plan and the WGSL kernels,
  including shaders/optimizer.wgsl, which the interpreter never runs. Marked `gpu`.

Compared: the loss of every step (float32 against float64: rtol 1e-4, atol 1e-5), and per
tensor the update relative to its size, ‖Δours − Δtorch‖ / ‖Δtorch‖ with Δ = p_k − p_0, after
the first and the last step (the interpreter path: the last), for parameters and buffers
(BatchNorm's running statistics) alike; see UPDATE_RTOL. Comparing the parameters themselves
at rtol 1e-3 would hide weight decay entirely: it moves a parameter by lr·wd·p per step,
~1e-4 of p.

Where torch is importable, `test_reference_file_is_current` regenerates each scenario with the
script's own functions and checks that the stored file still matches (a stale fixture fails).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import declared_scenarios, interpreter_steps, torch_script

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_torch_references.py"


def is_scenario(path: Path) -> bool:
    """Whether a reference file is a training scenario of this module (it has `meta` and `init/`
    members); the folder also holds other modules' op references."""
    with np.load(path) as data:
        return "meta" in data.files and any(name.startswith("init/") for name in data.files)


SCENARIOS = sorted(path.stem for path in REFERENCE_DIR.glob("*.npz") if is_scenario(path))

LOSS_RTOL, LOSS_ATOL = 1e-4, 1e-5
# The bound on ‖Δours − Δtorch‖ / ‖Δtorch‖ of a tensor: UPDATE_RTOL, or NOISE_FACTOR times what
# float32 rounding alone does to that update in PyTorch (the file's noise32), whichever is larger.
# Measured (float32 against float64, 5 steps): at most 9e-5 for every other tensor, on the
# interpreter and on lavapipe, where the Adam scenarios' worst tensors now sit at torch's own
# float32 noise (the bias corrections come from the host in double; computed by WGSL's pow, every
# Adam step on lavapipe is 6e-5 long, 1 − β₂ᵗ cancelling a few ulps; the optimizers alone:
# tests/test_optim_reference.py); the few tensors whose gradient is a sum that nearly
# cancels (the first layers of the sigmoid-and-tanh MLP under SGD) reach 1e-3 in PyTorch's own
# float32 as well, and get 10× that. The bugs these tests are there to catch move the worst
# tensor of their scenario by 5e-3 (AdamW's default weight decay halved, Llama; Bessel's
# correction of BatchNorm's running variance dropped) to 1 (a tanh gradient doubled, SGD).
UPDATE_RTOL = 5e-4
NOISE_FACTOR = 10.0


# ---------------------------------------------------------------------------------------------
# The reference files


@dataclass
class Reference:
    name: str
    meta: dict
    init: dict[str, np.ndarray]
    feeds: list[dict[str, np.ndarray]]
    losses: list[float]
    deltas: dict[int, dict[str, np.ndarray]]  # step index → name → value after that step − initial
    noise32: dict[int, dict[str, float]]  # the same, PyTorch float32 against float64 (relative)


def load_reference(name: str) -> Reference:
    with np.load(REFERENCE_DIR / f"{name}.npz") as data:
        arrays = {key: data[key] for key in data.files}
    meta = json.loads(str(arrays["meta"]))
    steps = meta["steps"]
    init = {key.removeprefix("init/"): value for key, value in arrays.items() if key.startswith("init/")}
    feeds = [
        {key.split("/", 2)[2]: value for key, value in arrays.items() if key.startswith(f"step{k}/input/")}
        for k in range(steps)
    ]
    losses = [float(arrays[f"step{k}/loss"]) for k in range(steps)]

    def per_step(kind: str) -> dict[int, dict[str, np.ndarray]]:
        return {
            k: {key.split("/", 2)[2]: value for key, value in arrays.items() if key.startswith(f"step{k}/{kind}/")}
            for k in meta["delta_steps"]
        }

    noise32 = {k: {key: float(value) for key, value in table.items()} for k, table in per_step("noise32").items()}
    return Reference(name, meta, init, feeds, losses, per_step("delta"), noise32)


# ---------------------------------------------------------------------------------------------
# The models of scripts/make_torch_references.py, in meganeura's DSL, module for module.


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden"]
        self.fc1 = nn.Linear(cfg["in_features"], h)
        self.fc2 = nn.Linear(h, h)
        self.fc3 = nn.Linear(h, h)
        self.fc4 = nn.Linear(h, h)
        self.fc5 = nn.Linear(h, h)
        self.fc6 = nn.Linear(h, h)
        self.head = nn.Linear(h, cfg["classes"])

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.tanh(self.fc2(x))
        x = F.sigmoid(self.fc3(x))
        x = F.silu(self.fc4(x))
        x = F.gelu(self.fc5(x))
        x = F.gelu(self.fc6(x), approximate="tanh")
        return self.head(x)


class CNN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        w = cfg["width"]
        self.conv1 = nn.Conv2d(cfg["channels"], w, 3, padding=1)
        self.gn1 = nn.GroupNorm(cfg["groups"], w)
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(w, w, 3, stride=2, padding=1, bias=False)  # a bias before BatchNorm gets no gradient
        self.bn2 = nn.BatchNorm2d(w)
        self.pool2 = nn.AvgPool2d(3, stride=1, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(w, cfg["classes"])

    def forward(self, x):
        x = F.relu(self.pool1(self.gn1(self.conv1(x))))
        x = F.relu(self.bn2(self.conv2(x)))
        x = self.gap(self.pool2(x))
        return self.fc(F.flatten(x, 1))


class LlamaAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.heads, self.kv_heads = cfg["heads"], cfg["kv_heads"]
        self.head_dim = cfg["dim"] // cfg["heads"]
        dim = cfg["dim"]
        self.q_proj = nn.Linear(dim, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = F.apply_rotary_pos_emb(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg["dim"], cfg["mlp_hidden"], bias=False)
        self.up_proj = nn.Linear(cfg["dim"], cfg["mlp_hidden"], bias=False)
        self.down_proj = nn.Linear(cfg["mlp_hidden"], cfg["dim"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg["dim"], eps=cfg["eps"])
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg["dim"], eps=cfg["eps"])
        self.mlp = LlamaMLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dim = cfg["dim"]
        self.embed_tokens = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.layers = nn.ModuleList([LlamaLayer(cfg) for _ in range(cfg["layers"])])
        self.norm = nn.RMSNorm(cfg["dim"], eps=cfg["eps"])

    def forward(self, tokens, cos, sin):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x).reshape(-1, self.dim), self.embed_tokens.weight)  # tied head


class GPTBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        dim = cfg["dim"]
        self.heads = cfg["heads"]
        self.ln_1 = nn.LayerNorm(dim, eps=cfg["eps"])
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim, eps=cfg["eps"])
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        qkv = self.c_attn(self.ln_1(x))
        q, k, v = (qkv[..., i * d : (i + 1) * d].reshape(b, s, self.heads, hd).transpose(1, 2) for i in range(3))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.dim = cfg["dim"]
        self.wte = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.wpe = nn.Embedding(cfg["seq"], cfg["dim"])
        self.h = nn.ModuleList([GPTBlock(cfg) for _ in range(cfg["layers"])])
        self.ln_f = nn.LayerNorm(cfg["dim"], eps=cfg["eps"])
        self.lm_head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)

    def forward(self, tokens, positions):
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x).reshape(-1, self.dim))


MODELS = {"mlp": MLP, "cnn": CNN, "llama": Llama, "gpt": GPT}


def reduce(out, target, loss: str):
    if loss == "cross_entropy":
        return F.cross_entropy(out, target)
    if loss == "cross_entropy_sum":
        return F.cross_entropy(out, target, reduction="sum")
    if loss == "nll_log_softmax":
        return F.nll_loss(F.log_softmax(out, dim=1), target)
    if loss == "mse_loss":
        return F.mse_loss(out, target)
    raise ValueError(f"unknown loss {loss!r}")


def loss_function(kind: str, loss: str):
    if kind in ("mlp", "cnn"):
        return lambda model, x, y: reduce(model(x), y, loss)
    if kind == "llama":
        return lambda model, tokens, targets, cos, sin: reduce(model(tokens, cos, sin), targets, loss)
    return lambda model, tokens, targets, positions: reduce(model(tokens, positions), targets, loss)


def optimizer_of(meta: dict) -> optim.Optimizer:
    hyper = dict(meta["hyper"])
    if "betas" in hyper:
        hyper["betas"] = tuple(hyper["betas"])
    return getattr(optim, meta["optimizer"])(**hyper)


def input_specs(feed: dict[str, np.ndarray]) -> dict:
    return {name: (mn.i32 if value.dtype == np.int32 else mn.f32)[value.shape] for name, value in feed.items()}


def compile_reference(ref: Reference, on_device: bool) -> mn.Program:
    """The scenario's training program with the reference's initial parameters and buffers. Off
    the device it is compiled in explain mode (traced and optimised, nothing built on an adapter),
    which is all the interpreter needs."""
    cfg = ref.meta["model"]
    model = MODELS[cfg["kind"]](cfg)
    loss = loss_function(cfg["kind"], ref.meta["loss"])
    specs = input_specs(ref.feeds[0])
    if on_device:
        program = mn.compile(model, loss=loss, inputs=specs, optimizer=optimizer_of(ref.meta))
    else:
        with mn.compiler.explain_only():
            program = mn.compile(model, loss=loss, inputs=specs, optimizer=optimizer_of(ref.meta))
    assert sorted(program.state_dict()) == sorted(ref.init), "the mirrored model's names differ from PyTorch's"
    program.load_state_dict(ref.init)
    return program


# ---------------------------------------------------------------------------------------------
# Comparisons


def update_errors(state: dict[str, np.ndarray], ref: Reference, step: int) -> dict[str, float]:
    """‖Δours − Δtorch‖ / ‖Δtorch‖ for every parameter and buffer after `step`."""
    errors = {}
    for name, want in ref.deltas[step].items():
        got = state[name].astype(np.float64) - ref.init[name].astype(np.float64)
        want = want.astype(np.float64)
        errors[name] = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    return errors


def tolerance(ref: Reference, step: int, name: str) -> float:
    return max(UPDATE_RTOL, NOISE_FACTOR * ref.noise32[step][name])


def update_problems(state: dict[str, np.ndarray], ref: Reference, step: int) -> list[str]:
    errors = update_errors(state, ref, step)
    bad = [f"{name} {e:.3e} > {tolerance(ref, step, name):.1e}" for name, e in errors.items()
           if not e <= tolerance(ref, step, name)]  # fmt: skip
    if not bad:
        return []
    return [f"updates after step {step}, ‖Δours − Δtorch‖ / ‖Δtorch‖ per tensor: {'; '.join(bad)}"]


def loss_problems(losses: list[float], ref: Reference) -> list[str]:
    bad = [
        f"step {k}: {ours:.7g} vs {theirs:.7g}"
        for k, (ours, theirs) in enumerate(zip(losses, ref.losses, strict=True))
        if not abs(ours - theirs) <= LOSS_ATOL + LOSS_RTOL * abs(theirs)
    ]
    return [f"losses (rtol {LOSS_RTOL:g}, atol {LOSS_ATOL:g}): {'; '.join(bad)}"] if bad else []


def report(problems: list[str], ref: Reference, where: str) -> None:
    assert not problems, f"{ref.name} ({where}) differs from PyTorch:\n  " + "\n  ".join(problems)


# ---------------------------------------------------------------------------------------------
# The tests


@pytest.fixture(scope="module", params=SCENARIOS)
def reference(request) -> Reference:
    return load_reference(request.param)


def test_interpreter_matches_pytorch(reference):
    """The traced graph (forward, autodiff, optimizer update) on the numpy interpreter."""
    program = compile_reference(reference, on_device=False)
    losses, state = interpreter_steps(program, reference.feeds)
    problems = loss_problems(losses, reference) + update_problems(state, reference, reference.meta["steps"] - 1)
    report(problems, reference, "interpreter")


@pytest.mark.gpu
def test_device_matches_pytorch(reference):
    """The e-graph's plan and the WGSL kernels, on the default adapter (the plan made for it: a
    GPT-2 step once fused a kernel binding 34 storage buffers, over lavapipe's 32)."""
    program = compile_reference(reference, on_device=True)
    losses, problems = [], []
    for step, feed in enumerate(reference.feeds):
        losses.append(program.train_step(**feed))
        if step in reference.deltas:
            problems += update_problems(program.state_dict(), reference, step)
    report(loss_problems(losses, reference) + problems, reference, "device")


def test_reference_files_cover_the_options():
    """Every optimizer option, loss and model family meganeura has is in some fixture."""
    metas = [load_reference(name).meta for name in SCENARIOS]
    seen = {(m["optimizer"], tuple(sorted(k for k, v in m["hyper"].items() if k != "lr"))) for m in metas}
    expected = {
        ("SGD", ()), ("SGD", ("weight_decay",)), ("SGD", ("momentum",)), ("SGD", ("momentum", "weight_decay")),
        ("Adam", ()), ("Adam", ("betas", "eps", "weight_decay")),
        ("AdamW", ()), ("AdamW", ("betas", "eps", "weight_decay")),
    }  # fmt: skip
    assert expected <= seen
    assert {m["loss"] for m in metas} >= {"cross_entropy", "cross_entropy_sum", "mse_loss", "nll_log_softmax"}
    assert {m["model"]["kind"] for m in metas} >= set(MODELS)


def test_rotary_tables_are_the_references():
    """The Llama fixture's cos/sin inputs are meganeura's own F.rotary_tables."""
    for name in SCENARIOS:
        ref = load_reference(name)
        if ref.meta["model"]["kind"] == "llama":
            cfg = ref.meta["model"]
            cos, sin = F.rotary_tables(cfg["seq"], cfg["dim"] // cfg["heads"])
            np.testing.assert_allclose(ref.feeds[0]["cos"], cos, atol=1e-6)
            np.testing.assert_allclose(ref.feeds[0]["sin"], sin, atol=1e-6)


def test_reference_files_are_all_there():
    """One file per scenario of the script and no other; read from its source (no torch needed)."""
    assert declared_scenarios(SCRIPT) == SCENARIOS


@pytest.mark.parametrize("name", SCENARIOS)
def test_reference_file_is_current(name):
    """Regenerated with torch in memory, the scenario gives the stored file (needs torch)."""
    script = torch_script(SCRIPT)
    assert sorted(script.SCENARIOS) == SCENARIOS
    assert_regenerated(script.generate(name), REFERENCE_DIR / f"{name}.npz")


def assert_regenerated(fresh: dict[str, np.ndarray], path: Path) -> None:
    """A reference file's arrays generated afresh by its script against the stored file: the same
    members and meta (but the torch version), the seeded values (init/, inputs, feeds, random draws)
    exactly, the computed ones to what another torch build or another CPU rounds differently (its
    vector width orders float32 sums: by the stored file's CPU, not this one, on a GPU machine)."""
    with np.load(path) as data:
        stored = {key: data[key] for key in data.files}
    assert sorted(fresh) == sorted(stored)
    for key, value in stored.items():
        got = fresh[key]
        if key == "torch_version":
            continue
        if key == "meta" or key.endswith("/meta"):
            assert without_torch_version(got) == without_torch_version(value), key
        elif key.startswith("init/") or any(part in key for part in SEEDED):
            np.testing.assert_array_equal(got, value, err_msg=key)
        elif "/noise32/" in key:  # the order of magnitude of the bound it sets (tolerance, above)
            floor = UPDATE_RTOL / NOISE_FACTOR
            assert abs(math.log10(max(float(got), floor) / max(float(value), floor))) <= 1.0, key
        elif value.dtype.kind == "f":
            rtol = 1e-6 if value.dtype == np.float64 else 1e-5
            scale = float(np.max(np.abs(value), initial=0.0, where=np.isfinite(value)))
            np.testing.assert_allclose(got, value, rtol=rtol, atol=max(rtol * scale, 1e-12), err_msg=key)
        else:
            np.testing.assert_array_equal(got, value, err_msg=key)


# Members drawn from a seed, which any torch and any CPU draw alike.
SEEDED = ("/input/", "/in/", "/random/", "/feed", "/init/")


def without_torch_version(meta: np.ndarray):
    """A file's JSON meta without the torch version it was written with."""
    decoded = json.loads(str(meta))
    if isinstance(decoded, dict):
        decoded.pop("torch", None)
    return decoded
