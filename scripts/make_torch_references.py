"""Write the PyTorch reference fixtures of tests/test_torch_reference.py: tests/reference/<scenario>.npz.

    python3.11 -m venv /tmp/torch311 && /tmp/torch311/bin/pip install torch numpy
    /tmp/torch311/bin/python scripts/make_torch_references.py            # every scenario
    /tmp/torch311/bin/python scripts/make_torch_references.py mlp_sgd    # some of them

This script imports only torch and numpy (never meganeura), so it runs wherever torch installs
(Python 3.11 here) and the fixtures it writes let CI check meganeura against PyTorch without
torch. It is deterministic: every value comes from a seeded numpy generator, torch runs on the
CPU in float64 with one thread, and the files are written with fixed zip dates and member
order, so running it again rewrites the same bytes.

Each scenario is a tiny model (a few thousand parameters at most), a loss and an optimizer; its
initial parameters and buffers and its batches come from numpy (float32 values, so that the
float32 side starts from exactly the same numbers), and it takes `steps` training steps in
float64. The file holds, by name:

    meta                    a JSON string: scenario, model config, loss, optimizer and its
                            hyper-parameters, steps, the torch version that wrote it
    init/<name>             every parameter and buffer before the first step (float32, exact),
                            PyTorch's state_dict names; num_batches_tracked as float32
    step<k>/input/<name>    the inputs of step k (float32, or int32 for labels and token ids)
    step<k>/loss            the loss of step k, computed before its update (float64)
    step<k>/delta/<name>    value after step k minus its initial value, for every parameter and
                            buffer, after the first and the last step (DELTA_STEPS; float64
                            differences stored as float32: an update needs its own precision,
                            not the parameter's)
    step<k>/noise32/<name>  the same steps run by torch in float32: ‖Δ32 − Δ64‖ / ‖Δ64‖ per
                            tensor, how far float32 rounding alone moves that update (the
                            tests allow a multiple of it where it exceeds their floor)

tests/test_torch_reference.py builds the same model with meganeura from `meta`, loads `init/`,
and compares losses and updates; where torch is importable it also imports this file and checks
that `generate()` still reproduces every stored file.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_npz import write_npz  # noqa: E402  (a sibling: numpy and the standard library only)

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "tests" / "reference"
STEPS = 5
DELTA_STEPS = (0, STEPS - 1)  # the steps after which the updates are stored: the first and the last

# ---------------------------------------------------------------------------------------------
# Scenarios. Hyper-parameters are chosen so that every optimizer option moves the updates far
# more than the tests' tolerance: weight decay 0.1-0.2 against parameters of size ~0.1-1, Adam's
# eps 1e-3 against gradients of ~1e-3-1e-2, betas far from the defaults.

MLP = {"kind": "mlp", "batch": 8, "in_features": 10, "hidden": 16, "classes": 4}
CNN = {"kind": "cnn", "batch": 4, "channels": 3, "size": 12, "width": 8, "groups": 4, "classes": 5}
LLAMA = {
    "kind": "llama", "batch": 2, "seq": 8, "vocab": 16, "dim": 16, "layers": 2, "heads": 4, "kv_heads": 2,
    "mlp_hidden": 32, "eps": 1e-5,
}  # fmt: skip
GPT = {"kind": "gpt", "batch": 2, "seq": 8, "vocab": 16, "dim": 16, "layers": 1, "heads": 2, "eps": 1e-5}
GPT2 = dict(GPT, layers=2)

SCENARIOS = {
    "mlp_sgd": {"model": MLP, "loss": "cross_entropy", "optimizer": ("SGD", {"lr": 0.2}), "seed": 1},
    "mlp_sgd_wd": {
        "model": MLP, "loss": "mse_loss", "optimizer": ("SGD", {"lr": 0.2, "weight_decay": 0.2}), "seed": 2,
    },
    "mlp_sgd_momentum": {
        "model": MLP, "loss": "nll_log_softmax", "optimizer": ("SGD", {"lr": 0.1, "momentum": 0.9}), "seed": 3,
    },
    "mlp_adam": {"model": MLP, "loss": "cross_entropy_sum", "optimizer": ("Adam", {}), "seed": 4},
    "mlp_adam_custom": {
        "model": MLP, "loss": "mse_loss",
        "optimizer": ("Adam", {"lr": 1e-2, "betas": (0.8, 0.95), "eps": 1e-3, "weight_decay": 0.1}), "seed": 5,
    },
    "cnn_sgd_momentum_wd": {
        "model": CNN, "loss": "cross_entropy",
        "optimizer": ("SGD", {"lr": 0.1, "momentum": 0.8, "weight_decay": 0.1}), "seed": 6,
    },
    "llama_adamw": {"model": LLAMA, "loss": "cross_entropy", "optimizer": ("AdamW", {}), "seed": 7},
    "gpt_adamw_custom": {
        "model": GPT, "loss": "cross_entropy",
        "optimizer": ("AdamW", {"lr": 1e-2, "betas": (0.7, 0.9), "eps": 1e-3, "weight_decay": 0.2}), "seed": 8,
    },
    "gpt2_adamw": {
        "model": GPT2, "loss": "nll_log_softmax",
        "optimizer": ("AdamW", {"lr": 3e-3, "eps": 1e-5, "weight_decay": 0.1}), "seed": 9,
    },
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Models, written the way tests/test_torch_reference.py mirrors them in meganeura's DSL (same
# module names, so the same state_dict names).


class TorchMLP(nn.Module):
    """Linear layers with one activation each: relu, tanh, sigmoid, silu, gelu (exact), gelu (tanh)."""

    def __init__(self, cfg):
        super().__init__()
        h = cfg["hidden"]
        self.fc1 = nn.Linear(cfg["in_features"], h)
        self.fc2, self.fc3, self.fc4, self.fc5, self.fc6 = (nn.Linear(h, h) for _ in range(5))
        self.head = nn.Linear(h, cfg["classes"])

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = torch.tanh(self.fc2(x))
        x = torch.sigmoid(self.fc3(x))
        x = F.silu(self.fc4(x))
        x = F.gelu(self.fc5(x))
        x = F.gelu(self.fc6(x), approximate="tanh")
        return self.head(x)


class TorchCNN(nn.Module):
    """conv 3×3 pad 1 (bias) → GroupNorm → max-pool 2 → relu → conv 3×3 stride 2 pad 1 (no bias) →
    BatchNorm (training, running stats; 36 values per channel, so Bessel's n/(n−1) shows) → relu →
    avg-pool 3/1/1 → global average pool → flatten → linear."""

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
        return self.fc(torch.flatten(x, 1))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x, cos, sin):
    """HF Llama's half-split RoPE, meganeura's F.rotary_embedding: x·cos + rotate_half(x)·sin."""
    return x * cos + rotate_half(x) * sin


def rotary_tables(seq_len, head_dim, base=10000.0):
    """meganeura's F.rotary_tables, computed the same way in float32 (HF's LlamaRotaryEmbedding)."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = np.float32(1.0) / np.power(np.float32(base), exponents, dtype=np.float32)
    freqs = np.outer(np.arange(seq_len, dtype=np.float32), inv_freq).astype(np.float32)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


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
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
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


class TorchLlama(nn.Module):
    """tokens [b, s] → logits [b·s, vocab]; the head is the embedding matrix (tied)."""

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
        return F.linear(self.norm(x).reshape(-1, self.dim), self.embed_tokens.weight)


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


class TorchGPT(nn.Module):
    """tokens [b, s] and positions [s] → logits [b·s, vocab]; learned position embedding, untied head."""

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


MODELS = {"mlp": TorchMLP, "cnn": TorchCNN, "llama": TorchLlama, "gpt": TorchGPT}


# ---------------------------------------------------------------------------------------------
# Seeded initial values (float32) and batches.


def initial_state(model: nn.Module, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every parameter and buffer by state_dict name, as float32: matrices and embeddings
    U(−1/√fan_in, 1/√fan_in) (embeddings N(0, 0.5)), norm weights 1 + N(0, 0.1) and biases
    N(0, 0.1) (not PyTorch's ones and zeros, so that their updates and weight decay show),
    BatchNorm running stats away from 0 and 1."""
    state = {}
    for name, value in model.state_dict().items():
        shape = tuple(value.shape)
        leaf = name.rsplit(".", 1)[-1]
        module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        is_norm = isinstance(module, (nn.BatchNorm2d, nn.GroupNorm, nn.LayerNorm, nn.RMSNorm))
        if leaf == "num_batches_tracked":
            array = np.zeros(shape)
        elif leaf == "running_mean":
            array = rng.normal(0.0, 0.1, shape)
        elif leaf == "running_var":
            array = rng.uniform(0.5, 1.5, shape)
        elif is_norm and leaf == "weight":
            array = 1.0 + rng.normal(0.0, 0.1, shape)
        elif is_norm and leaf == "bias":
            array = rng.normal(0.0, 0.1, shape)
        elif isinstance(module, nn.Embedding):
            array = rng.normal(0.0, 0.5, shape)
        else:  # Linear and Conv2d weights and biases
            fan_in = int(np.prod(module.weight.shape[1:]))
            bound = 1.0 / math.sqrt(fan_in)
            array = rng.uniform(-bound, bound, shape)
        state[name] = array.astype(np.float32)
    return state


def batches(cfg: dict, loss: str, rng: np.random.Generator, steps: int) -> list[dict[str, np.ndarray]]:
    """The inputs of every step, float32 or int32, as meganeura's train_step takes them."""
    feeds = []
    for _ in range(steps):
        if cfg["kind"] == "mlp":
            feed = {"x": rng.normal(0.0, 1.0, (cfg["batch"], cfg["in_features"])).astype(np.float32)}
            if loss == "mse_loss":
                feed["y"] = rng.normal(0.0, 1.0, (cfg["batch"], cfg["classes"])).astype(np.float32)
            else:
                feed["y"] = rng.integers(0, cfg["classes"], cfg["batch"]).astype(np.int32)
        elif cfg["kind"] == "cnn":
            shape = (cfg["batch"], cfg["channels"], cfg["size"], cfg["size"])
            feed = {
                "x": rng.normal(0.0, 1.0, shape).astype(np.float32),
                "y": rng.integers(0, cfg["classes"], cfg["batch"]).astype(np.int32),
            }
        else:
            b, s, vocab = cfg["batch"], cfg["seq"], cfg["vocab"]
            stream = rng.integers(0, vocab, (b, s + 1)).astype(np.int32)
            feed = {"tokens": stream[:, :-1].copy(), "targets": stream[:, 1:].reshape(-1).copy()}
            if cfg["kind"] == "llama":
                feed["cos"], feed["sin"] = rotary_tables(s, cfg["dim"] // cfg["heads"])
            else:
                feed["positions"] = np.arange(s, dtype=np.int32)
        feeds.append(feed)
    return feeds


def to_torch(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if np.issubdtype(array.dtype, np.integer):
        return torch.tensor(array, dtype=torch.long)
    return torch.tensor(array, dtype=dtype)


def loss_value(model: nn.Module, kind: str, loss: str, feed: dict[str, np.ndarray], dtype) -> torch.Tensor:
    inputs = {k: to_torch(v, dtype) for k, v in feed.items()}
    if kind in ("mlp", "cnn"):
        out, target = model(inputs["x"]), inputs["y"]
    elif kind == "llama":
        out, target = model(inputs["tokens"], inputs["cos"], inputs["sin"]), inputs["targets"]
    else:
        out, target = model(inputs["tokens"], inputs["positions"]), inputs["targets"]
    if loss == "cross_entropy":
        return F.cross_entropy(out, target)
    if loss == "cross_entropy_sum":
        return F.cross_entropy(out, target, reduction="sum")
    if loss == "nll_log_softmax":
        return F.nll_loss(F.log_softmax(out, dim=1), target)
    if loss == "mse_loss":
        return F.mse_loss(out, target)
    raise ValueError(loss)


def make_optimizer(name: str, hyper: dict, params):
    return getattr(torch.optim, name)(params, **hyper)


# ---------------------------------------------------------------------------------------------


def train(spec: dict, init: dict[str, np.ndarray], feeds: list[dict], dtype: torch.dtype):
    """(loss per step, {step in DELTA_STEPS: {name: value after that step − initial, float64}})."""
    cfg = spec["model"]
    torch.manual_seed(0)  # nothing should draw from it; set anyway
    torch.set_num_threads(1)
    model = MODELS[cfg["kind"]](cfg).to(dtype)
    model.train()
    model.load_state_dict({k: torch.tensor(v).to(dtype) for k, v in init.items()}, strict=True)
    optimizer = make_optimizer(*spec["optimizer"], model.parameters())
    start = {k: v.detach().clone().double() for k, v in model.state_dict().items()}
    losses, deltas = [], {}
    for step, feed in enumerate(feeds):
        optimizer.zero_grad(set_to_none=True)
        value = loss_value(model, cfg["kind"], spec["loss"], feed, dtype)
        value.backward()
        optimizer.step()
        losses.append(value.item())
        if step in DELTA_STEPS:
            deltas[step] = {k: (v.double() - start[k]).numpy() for k, v in model.state_dict().items()}
    return losses, deltas


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """‖got − want‖ / ‖want‖, the tests' measure of an update's error."""
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def step_arrays(step: int, feed: dict, loss: float, deltas: dict, deltas32: dict) -> dict[str, np.ndarray]:
    """The arrays of training step `step`: its inputs, its loss, and where `deltas` holds the
    updates after it (DELTA_STEPS), each update and its float32 run's relative error."""
    arrays = {f"step{step}/input/{key}": value for key, value in feed.items()}
    arrays[f"step{step}/loss"] = np.array(loss, dtype=np.float64)
    for key, delta in deltas.items():
        arrays[f"step{step}/delta/{key}"] = delta.astype(np.float32)
    for key, delta in deltas.items():
        arrays[f"step{step}/noise32/{key}"] = np.array(relative_error(deltas32[key], delta))
    return arrays


def generate(name: str) -> dict[str, np.ndarray]:
    """The arrays of one scenario's reference file, computed afresh."""
    spec = SCENARIOS[name]
    cfg, loss = spec["model"], spec["loss"]
    opt_name, hyper = spec["optimizer"]
    rng = np.random.default_rng(spec["seed"])
    init = initial_state(MODELS[cfg["kind"]](cfg), rng)
    feeds = batches(cfg, loss, rng, STEPS)
    losses, deltas = train(spec, init, feeds, torch.float64)
    _, deltas32 = train(spec, init, feeds, torch.float32)
    meta = {
        "scenario": name,
        "model": cfg,
        "loss": loss,
        "optimizer": opt_name,
        "hyper": hyper,
        "steps": STEPS,
        "delta_steps": list(DELTA_STEPS),
        "torch": torch.__version__.split("+")[0],
    }
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta, sort_keys=True))}
    for key, value in init.items():
        arrays[f"init/{key}"] = value
    for step, feed in enumerate(feeds):
        arrays |= step_arrays(step, feed, losses[step], deltas.get(step, {}), deltas32.get(step, {}))
    return arrays


def write_scenarios(names: list[str], scenarios: dict, generate, directory: Path) -> None:
    """Write <directory>/<name>.npz = generate(name) for the named scenarios (every one where none
    is named), a line each on what it holds; scripts/make_family_references.py runs the same."""
    names = names or list(scenarios)
    unknown = [n for n in names if n not in scenarios]
    if unknown:
        raise SystemExit(f"unknown scenarios {unknown}; known: {list(scenarios)}")
    for name in names:
        arrays = generate(name)
        path = write_npz(directory / f"{name}.npz", arrays)
        losses = [float(arrays[f"step{k}/loss"]) for k in range(json.loads(str(arrays["meta"]))["steps"])]
        count = sum(v.size for k, v in arrays.items() if k.startswith("init/"))
        print(f"{path.name}: {count} values, {path.stat().st_size} bytes, losses {np.round(losses, 5).tolist()}")


if __name__ == "__main__":
    write_scenarios(sys.argv[1:], SCENARIOS, generate, REFERENCE_DIR)
