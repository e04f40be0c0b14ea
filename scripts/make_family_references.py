"""Write the PyTorch references of tests/test_families.py: tests/reference/families/<scenario>.npz.

    /tmp/torch311/bin/python scripts/make_family_references.py              # every scenario
    /tmp/torch311/bin/python scripts/make_family_references.py vae_digits   # some of them

Six model families trained end to end (issue 40): GPT-2 with dropout, a U-Net denoiser, a
Whisper-shaped audio encoder, a VAE, a ViT and an LSTM language model, each a tiny model, a loss and
an optimizer, 5 training steps in float64 from seeded float32 values. The file layout is the one
of scripts/make_torch_references.py (whose helpers this script reuses: meta, init/, step<k>/input,
step<k>/loss, step<k>/delta, step<k>/noise32), plus, for the models that draw random numbers:

    step<k>/random/<stream>  the values meganeura's draw number <stream> takes at step k (uniform
                             for a dropout mask, normal for randn_like, the 16-bit halves of a
                             fused attention's dropout), after the first and the last step's draws
                             (float32, exact)

and `meta` names the program seed (`rng_seed`) and lists the draws (stream, shape, kind: "uniform",
"normal" or "attention") in trace order. The digits families also name the rows of sklearn's load_digits() they train on
(`meta["rows"]`), which the tests check against sklearn.

Random numbers cannot come from torch's generator: meganeura draws Philox4x32-10
(meganeura/ir/ops/random.py), so this script computes the same numbers with numpy — the RNG state
(seed, step), key = seed, counter = (flat index in the random tensor's shape, stream, step),
uniform = (bits[0] >> 8)·2⁻²⁴, normal = Box–Muller of bits[0] and bits[1] — and the torch models
take them in meganeura's trace order: `Draws` numbers the draws of a step 0, 1, 2… as meganeura's
tracer numbers its random nodes. Dropout keeps u ≥ p and scales by f32(1)/f32(1 − p), as
meganeura's F.dropout (and torch's `noise.div_(1 - p)` in float32). SDPA's dropout_p is drawn
inside meganeura's fused attention kernels, a Philox call per eight keys (ir/ops/transformer.py):
`attention_dropout` keeps what they keep.

The digits (sklearn's bundled 8×8 images) are read from sklearn's CSV with numpy (this script
imports only torch and numpy): from the sklearn that Python finds, else from the file that
MEGANEURA_DIGITS_CSV names (e.g. a Python 3.12 venv's sklearn/datasets/data/digits.csv.gz).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_torch_references import step_arrays, to_torch, write_scenarios  # noqa: E402  (a sibling script)

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "tests" / "reference" / "families"
STEPS = 5
DELTA_STEPS = (0, STEPS - 1)  # the steps after which the updates (and the draws) are stored

# ---------------------------------------------------------------------------------------------
# Scenarios: model configurations (tiny: the tests run them on lavapipe), losses, optimizers.

GPT2 = {
    "kind": "gpt2", "batch": 2, "seq": 8, "vocab": 16, "dim": 16, "layers": 2, "heads": 2, "eps": 1e-5,
    "dropout": 0.1,
}  # fmt: skip
UNET = {"kind": "unet", "batch": 4, "width": 8, "groups": 4, "time_dim": 8, "timesteps": 100}
WHISPER = {
    "kind": "whisper", "batch": 2, "mels": 6, "frames": 12, "dim": 16, "heads": 2, "layers": 2, "classes": 5,
    "eps": 1e-5,
}  # fmt: skip
VAE = {"kind": "vae", "batch": 8, "hidden": 24, "latent": 4}
VIT = {
    "kind": "vit", "batch": 6, "patch": 4, "dim": 16, "heads": 2, "layers": 2, "mlp": 32, "classes": 10,
    "dropout": 0.1, "eps": 1e-5,
}  # fmt: skip
LSTM = {"kind": "lstm", "batch": 3, "seq": 7, "vocab": 11, "embed": 8, "hidden": 12}

SCENARIOS = {
    "gpt2_dropout": {
        "model": GPT2, "loss": "cross_entropy", "optimizer": ("AdamW", {"lr": 1e-2, "weight_decay": 0.1}),
        "seed": 21, "rng_seed": 1234,
    },
    "unet_diffusion": {"model": UNET, "loss": "noise_mse", "optimizer": ("Adam", {"lr": 3e-3}), "seed": 22},
    "whisper_encoder": {
        "model": WHISPER, "loss": "cross_entropy", "optimizer": ("AdamW", {"lr": 3e-3, "weight_decay": 0.05}),
        "seed": 23,
    },
    "vae_digits": {
        "model": VAE, "loss": "bce_sum_kl", "optimizer": ("Adam", {"lr": 1e-2}), "seed": 24, "rng_seed": 99,
    },
    "vit_digits": {
        "model": VIT, "loss": "cross_entropy", "optimizer": ("AdamW", {"lr": 3e-3, "weight_decay": 0.05}),
        "seed": 25, "rng_seed": 7,
    },
    "lstm_lm": {
        "model": LSTM, "loss": "cross_entropy", "optimizer": ("SGD", {"lr": 0.5, "momentum": 0.9}), "seed": 26,
    },
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# meganeura's random numbers, in numpy: Philox4x32-10 (Salmon et al., SC'11; Random123's philox.h).

PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # round multipliers
PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # key increments (Weyl sequence)
MASK32 = 0xFFFFFFFF
UNIT = np.float32(2.0**-24)


def philox4x32_10(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of counters [4, n] (uint32) under key (k0, k1): the four words [4, n]."""
    c0, c1, c2, c3 = (counter[i].astype(np.uint64) for i in range(4))
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    mask, shift = np.uint64(MASK32), np.uint64(32)
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + np.uint64(PHILOX_W[0])) & mask, (k1 + np.uint64(PHILOX_W[1])) & mask
        p0, p1 = np.uint64(PHILOX_M[0]) * c0, np.uint64(PHILOX_M[1]) * c2
        c0, c1, c2, c3 = (p1 >> shift) ^ c1 ^ k0, p1 & mask, (p0 >> shift) ^ c3 ^ k1, p0 & mask
    return np.stack([c0, c1, c2, c3]).astype(np.uint32)


# Random123's known answers (kat_vectors: philox4x32 10 rounds): counter, key -> words.
PHILOX_KNOWN = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((MASK32,) * 4, (MASK32,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def draw(seed: int, step: int, shape: tuple[int, ...], stream: int, normal: bool) -> np.ndarray:
    """What meganeura's random node `stream` of `shape` draws at `step` of a program seeded `seed`
    (float32): uniform (bits[0] >> 8)·2⁻²⁴, or normal sqrt(−2·ln u₁)·cos(2π·u₂) with
    u₁ = ((bits[0] >> 8) + 1)·2⁻²⁴ and u₂ = (bits[1] >> 8)·2⁻²⁴, computed in float32."""
    seed, step = seed % 2**64, step % 2**64
    count = int(np.prod(shape, dtype=np.int64))
    counter = np.empty((4, count), dtype=np.uint32)
    counter[0] = np.arange(count, dtype=np.uint32)
    counter[1] = stream
    counter[2], counter[3] = step & MASK32, step >> 32
    bits = philox4x32_10(counter, (seed & MASK32, seed >> 32))
    first = (bits[0] >> np.uint32(8)).astype(np.float32)
    if not normal:
        return (first * UNIT).reshape(shape)
    u1 = (first + np.float32(1.0)) * UNIT
    u2 = (bits[1] >> np.uint32(8)).astype(np.float32) * UNIT
    values = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2.0 * np.pi) * u2)
    return values.astype(np.float32).reshape(shape)


class Draws:
    """The random numbers of one training step, taken in the order meganeura's tracer numbers its
    random nodes (stream 0, 1, 2… as the forward meets them). `log` keeps what was drawn."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self.step = 0
        self.log: list[tuple[int, tuple[int, ...], bool, np.ndarray]] = []

    def start(self, step: int) -> None:
        self.step, self.log = step, []

    def take(self, shape: tuple[int, ...], kind: str) -> np.ndarray:
        """The draw of the next stream: "uniform" or "normal" (a random node), or "attention" (the
        16-bit halves that a fused attention's dropout compares, `attention_halves`)."""
        if self.seed is None:
            raise RuntimeError("this scenario draws random numbers: give it an rng_seed")
        stream = len(self.log)
        if kind == "attention":
            values = attention_halves(self.seed, self.step, tuple(shape), stream)
        else:
            values = draw(self.seed, self.step, tuple(shape), stream, kind == "normal")
        self.log.append((stream, tuple(shape), kind, values))
        return values


def attention_halves(seed: int, step: int, shape: tuple[int, ...], stream: int) -> np.ndarray:
    """The random halves of meganeura's fused attention dropout (ir/ops/transformer.py): one
    Philox call per eight keys of a query row, counter ((row·⌈Skv/8⌉ + j // 8), stream, step), its
    four words split into 16-bit halves, low half first, as float32 (exact)."""
    b, h, sq, skv = shape
    groups = -(-skv // 8)
    calls = b * h * sq * groups
    counter = np.zeros((4, calls), dtype=np.uint32)
    counter[0] = np.arange(calls, dtype=np.uint32)
    counter[1] = stream
    counter[2], counter[3] = step & MASK32, step >> 32
    words = philox4x32_10(counter, (seed & MASK32, seed >> 32))  # [4, calls]
    halves = np.stack([words & np.uint32(0xFFFF), words >> np.uint32(16)])  # [2, 4, calls]
    per_key = halves.transpose(2, 1, 0).reshape(b * h * sq, groups * 8)[:, :skv]
    return per_key.astype(np.float32).reshape(shape)


def attention_dropout(weights: torch.Tensor, p: float, draws: Draws, training: bool = True) -> torch.Tensor:
    """SDPA's dropout of the attention weights as meganeura's fused attention draws it: a key is
    kept where its random half reaches ⌈f32(p)·2¹⁶⌉, the kept weights scaled by f32(1)/f32(1 − p)."""
    if not training or p == 0.0:
        return weights
    keep = draws.take(tuple(weights.shape), "attention") >= math.ceil(float(np.float32(p)) * 2.0**16)
    scale = float(np.float32(1.0) / np.float32(1.0 - p))
    return weights * torch.tensor(keep * scale, dtype=weights.dtype)


def dropout(x: torch.Tensor, p: float, draws: Draws, training: bool = True) -> torch.Tensor:
    """F.dropout with meganeura's mask: keep where the uniform draw u ≥ p (as float32 compares),
    the kept values scaled by float32(1) / float32(1 − p)."""
    if not training or p == 0.0:
        return x
    keep = draws.take(tuple(x.shape), "uniform") >= np.float32(p)
    scale = float(np.float32(1.0) / np.float32(1.0 - p))
    return x * torch.tensor(keep * scale, dtype=x.dtype)


def randn_like(x: torch.Tensor, draws: Draws) -> torch.Tensor:
    """torch.randn_like with meganeura's numbers (Box–Muller of Philox, float32 values)."""
    return torch.tensor(draws.take(tuple(x.shape), "normal"), dtype=x.dtype)


# ---------------------------------------------------------------------------------------------
# Models, written the way tests/test_families.py mirrors them in meganeura's DSL (same module
# names, so the same state_dict names). Each takes `draws` (shared with its submodules).


class CausalSelfAttention(nn.Module):
    """GPT-2's attention (HF names): c_attn → causal softmax(q·kᵀ/√d) → attn dropout → ·v → c_proj
    → resid dropout; written out, as torch's SDPA would draw its own dropout mask (the weights'
    mask is meganeura's fused attention's, `attention_dropout`)."""

    def __init__(self, cfg, draws):
        super().__init__()
        dim = cfg["dim"]
        self.heads, self.p, self.draws = cfg["heads"], cfg["dropout"], draws
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        q, k, v = (t.reshape(b, s, self.heads, hd).transpose(1, 2) for t in self.c_attn(x).split(d, dim=-1))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        att = attention_dropout(torch.softmax(scores, dim=-1), self.p, self.draws, self.training)
        out = (att @ v).transpose(1, 2).reshape(b, s, d)
        return dropout(self.c_proj(out), self.p, self.draws, self.training)


class GPT2Block(nn.Module):
    def __init__(self, cfg, draws):
        super().__init__()
        dim = cfg["dim"]
        self.p, self.draws = cfg["dropout"], draws
        self.ln_1 = nn.LayerNorm(dim, eps=cfg["eps"])
        self.attn = CausalSelfAttention(cfg, draws)
        self.ln_2 = nn.LayerNorm(dim, eps=cfg["eps"])
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        mlp = self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x + dropout(mlp, self.p, self.draws, self.training)


class TorchGPT2(nn.Module):
    """tokens [b, s] → logits [b·s, vocab]: token + learned position embeddings → dropout →
    pre-LN blocks → ln_f → the head tied to wte."""

    def __init__(self, cfg, draws):
        super().__init__()
        self.dim, self.p, self.draws = cfg["dim"], cfg["dropout"], draws
        self.wte = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.wpe = nn.Embedding(cfg["seq"], cfg["dim"])
        self.h = nn.ModuleList([GPT2Block(cfg, draws) for _ in range(cfg["layers"])])
        self.ln_f = nn.LayerNorm(cfg["dim"], eps=cfg["eps"])

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1])
        x = dropout(self.wte(tokens) + self.wpe(positions), self.p, self.draws, self.training)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x).reshape(-1, self.dim), self.wte.weight)


class TorchVAE(nn.Module):
    """pytorch/examples' VAE, scaled to the 8×8 digits: fc1 → relu → (fc21: μ, fc22: log σ²);
    z = μ + ε·exp(½ log σ²) with ε = randn_like (meganeura's draw); fc3 → relu → fc4 → sigmoid."""

    def __init__(self, cfg, draws):
        super().__init__()
        self.draws = draws
        self.fc1 = nn.Linear(64, cfg["hidden"])
        self.fc21 = nn.Linear(cfg["hidden"], cfg["latent"])
        self.fc22 = nn.Linear(cfg["hidden"], cfg["latent"])
        self.fc3 = nn.Linear(cfg["latent"], cfg["hidden"])
        self.fc4 = nn.Linear(cfg["hidden"], 64)

    def forward(self, x):
        h1 = F.relu(self.fc1(x))
        mu, logvar = self.fc21(h1), self.fc22(h1)
        std = torch.exp(0.5 * logvar)
        z = mu + randn_like(std, self.draws) * std
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar


class SelfAttention(nn.Module):
    """nn.MultiheadAttention's parameters (in_proj_weight, in_proj_bias, out_proj) and its math
    for self-attention, batch_first, with meganeura's attention-dropout mask."""

    def __init__(self, dim, heads, p, draws):
        super().__init__()
        self.heads, self.p, self.draws = heads, p, draws
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.empty(3 * dim))
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = (t.reshape(b, s, self.heads, hd).transpose(1, 2) for t in qkv.split(d, dim=-1))
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)), dim=-1)
        att = attention_dropout(att, self.p, self.draws, self.training)
        return self.out_proj((att @ v).transpose(1, 2).reshape(b, s, d))


class EncoderLayer(nn.Module):
    """nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation="gelu",
    batch_first=True, norm_first=True), its names and its math, with meganeura's dropout masks
    in torch's order: attention weights, dropout1, dropout (feed-forward), dropout2.
    `check_encoder_layer` holds it to torch's module."""

    def __init__(self, cfg, draws):
        super().__init__()
        dim = cfg["dim"]
        self.p, self.draws = cfg["dropout"], draws
        self.self_attn = SelfAttention(dim, cfg["heads"], cfg["dropout"], draws)
        self.linear1 = nn.Linear(dim, cfg["mlp"])
        self.linear2 = nn.Linear(cfg["mlp"], dim)
        self.norm1 = nn.LayerNorm(dim, eps=cfg["eps"])
        self.norm2 = nn.LayerNorm(dim, eps=cfg["eps"])

    def forward(self, x):
        x = x + dropout(self.self_attn(self.norm1(x)), self.p, self.draws, self.training)
        hidden = dropout(F.gelu(self.linear1(self.norm2(x))), self.p, self.draws, self.training)
        return x + dropout(self.linear2(hidden), self.p, self.draws, self.training)


class TorchViT(nn.Module):
    """images [b, 1, 8, 8] → logits [b, classes]: patches by a strided conv (torchvision's
    conv_proj) → class token + positional embedding → dropout → encoder layers → LayerNorm →
    the class token's head."""

    def __init__(self, cfg, draws):
        super().__init__()
        dim, patch = cfg["dim"], cfg["patch"]
        self.p, self.draws = cfg["dropout"], draws
        self.conv_proj = nn.Conv2d(1, dim, patch, stride=patch)
        self.class_token = nn.Parameter(torch.empty(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.empty(1, (8 // patch) ** 2 + 1, dim))
        self.layers = nn.ModuleList([EncoderLayer(cfg, draws) for _ in range(cfg["layers"])])
        self.ln = nn.LayerNorm(dim, eps=cfg["eps"])
        self.head = nn.Linear(dim, cfg["classes"])

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = dropout(x + self.pos_embedding, self.p, self.draws, self.training)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x)[:, 0])


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's positional table [length, channels] (whisper/model.py `sinusoids`), float32."""
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = np.exp(-increment * np.arange(channels // 2))
    scaled = np.arange(length)[:, None] * inv_timescales[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


class WhisperAttention(nn.Module):
    """whisper's MultiHeadAttention for self-attention: query, key (no bias), value, out."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim, bias=False)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in (self.query(x), self.key(x), self.value(x)))
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d))


class WhisperBlock(nn.Module):
    """whisper's ResidualAttentionBlock without cross-attention: pre-LN attention and GELU MLP."""

    def __init__(self, dim, heads, eps):
        super().__init__()
        self.attn = WhisperAttention(dim, heads)
        self.attn_ln = nn.LayerNorm(dim, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.mlp_ln = nn.LayerNorm(dim, eps=eps)

    def forward(self, x):
        x = x + self.attn(self.attn_ln(x))
        return x + self.mlp(self.mlp_ln(x))


class TorchWhisperEncoder(nn.Module):
    """mel [b, mels, frames] → logits [b, classes]: whisper's AudioEncoder (conv1 → GELU → conv2
    stride 2 → GELU → + sinusoidal positions → blocks → ln_post), then a classifier of the mean
    over time."""

    def __init__(self, cfg, draws):
        super().__init__()
        dim = cfg["dim"]
        self.conv1 = nn.Conv1d(cfg["mels"], dim, 3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, stride=2, padding=1)
        self.register_buffer("positional_embedding", torch.tensor(sinusoids(cfg["frames"] // 2, dim)))
        self.blocks = nn.ModuleList([WhisperBlock(dim, cfg["heads"], cfg["eps"]) for _ in range(cfg["layers"])])
        self.ln_post = nn.LayerNorm(dim, eps=cfg["eps"])
        self.head = nn.Linear(dim, cfg["classes"])

    def forward(self, mel):
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).permute(0, 2, 1)
        x = x + self.positional_embedding
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_post(x).mean(dim=1))


class ResBlock(nn.Module):
    """A diffusion U-Net's residual block: GroupNorm → SiLU → conv, plus the projected time
    embedding, GroupNorm → SiLU → conv, plus the input (a 1×1 conv where the channels change)."""

    def __init__(self, cin, cout, time_dim, groups):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_proj = nn.Linear(time_dim, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.skip is None else self.skip(x))


def timestep_frequencies(time_dim: int) -> np.ndarray:
    """exp(−ln(10000)·i/half), i < half = time_dim/2 (diffusers' get_timestep_embedding), float32."""
    half = time_dim // 2
    return np.exp(-math.log(10000.0) * np.arange(half, dtype=np.float64) / half).astype(np.float32)


def noise_schedule(timesteps: int) -> tuple[np.ndarray, np.ndarray]:
    """(√ᾱ_t, √(1 − ᾱ_t)) for t < timesteps of DDPM's linear β schedule 1e-4…0.02, float32."""
    alphas_cumprod = np.cumprod(1.0 - np.linspace(1e-4, 0.02, timesteps))
    return np.sqrt(alphas_cumprod).astype(np.float32), np.sqrt(1.0 - alphas_cumprod).astype(np.float32)


class TorchUNet(nn.Module):
    """(x_t [b, 1, 8, 8], t [b]) → predicted noise [b, 1, 8, 8]: sinusoidal time features → MLP;
    conv_in → ResBlock (8×8, the skip) → stride-2 conv (4×4) → ResBlock → ConvTranspose2d (8×8)
    → cat with the skip → ResBlock → GroupNorm → SiLU → conv_out."""

    def __init__(self, cfg, draws):
        super().__init__()
        w, g, td = cfg["width"], cfg["groups"], cfg["time_dim"]
        self.time_dim = td
        self.time_mlp = nn.Sequential(nn.Linear(td, 2 * td), nn.SiLU(), nn.Linear(2 * td, 2 * td))
        self.conv_in = nn.Conv2d(1, w, 3, padding=1)
        self.down = ResBlock(w, w, 2 * td, g)
        self.downsample = nn.Conv2d(w, 2 * w, 3, stride=2, padding=1)
        self.mid = ResBlock(2 * w, 2 * w, 2 * td, g)
        self.upsample = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.up = ResBlock(2 * w, w, 2 * td, g)
        self.norm_out = nn.GroupNorm(g, w)
        self.conv_out = nn.Conv2d(w, 1, 3, padding=1)

    def forward(self, x, t):
        freqs = torch.tensor(timestep_frequencies(self.time_dim), dtype=x.dtype)
        args = t.to(x.dtype)[:, None] * freqs[None, :]
        temb = self.time_mlp(torch.cat([torch.sin(args), torch.cos(args)], dim=-1))
        skip = self.down(self.conv_in(x), temb)
        h = self.mid(self.downsample(skip), temb)
        h = self.up(torch.cat([self.upsample(h), skip], dim=1), temb)
        return self.conv_out(F.silu(self.norm_out(h)))


class TorchLSTM(nn.Module):
    """tokens [b, s] → logits [b·s, vocab]: nn.Embedding → nn.LSTM(batch_first=True) → Linear."""

    def __init__(self, cfg, draws):
        super().__init__()
        self.embedding = nn.Embedding(cfg["vocab"], cfg["embed"])
        self.lstm = nn.LSTM(cfg["embed"], cfg["hidden"], batch_first=True)
        self.fc = nn.Linear(cfg["hidden"], cfg["vocab"])

    def forward(self, tokens):
        out, _ = self.lstm(self.embedding(tokens))
        return self.fc(out.reshape(-1, out.shape[-1]))


MODELS = {
    "gpt2": TorchGPT2, "unet": TorchUNet, "whisper": TorchWhisperEncoder, "vae": TorchVAE, "vit": TorchViT,
    "lstm": TorchLSTM,
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Seeded initial values (float32) and batches.


def initial_state(model: nn.Module, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every parameter and buffer by state_dict name, float32: norm weights 1 + N(0, 0.1), other
    vectors (biases) N(0, 0.1), embedding tables N(0, 0.5), the other parameters (matrices,
    kernels, class token, positions) U(±1/√fan_in) with fan_in their size past the first dim;
    buffers as the model made them (whisper's sinusoids)."""
    buffers = {name for name, _ in model.named_buffers()}
    state = {}
    for name, value in model.state_dict().items():
        shape = tuple(value.shape)
        module = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        leaf = name.rsplit(".", 1)[-1]
        if name in buffers:
            array = value.numpy()
        elif isinstance(module, (nn.LayerNorm, nn.GroupNorm)) and leaf == "weight":
            array = 1.0 + rng.normal(0.0, 0.1, shape)
        elif len(shape) == 1:
            array = rng.normal(0.0, 0.1, shape)
        elif isinstance(module, nn.Embedding):
            array = rng.normal(0.0, 0.5, shape)
        else:
            bound = 1.0 / math.sqrt(int(np.prod(shape[1:])))
            array = rng.uniform(-bound, bound, shape)
        state[name] = np.asarray(array).astype(np.float32)
    return state


def digits_csv() -> Path:
    """sklearn's bundled digits.csv.gz, found without importing sklearn."""
    if os.environ.get("MEGANEURA_DIGITS_CSV"):
        return Path(os.environ["MEGANEURA_DIGITS_CSV"])
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise SystemExit("the digits families need sklearn's digits.csv.gz: set MEGANEURA_DIGITS_CSV to its path")
    return Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images [1797, 8, 8] float64 in 0…16, labels [1797] int), as sklearn's load_digits()."""
    table = np.loadtxt(digits_csv(), delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(np.int64)


def batches(cfg: dict, rng: np.random.Generator, steps: int) -> tuple[list[dict[str, np.ndarray]], list | None]:
    """The inputs of every step as meganeura's train_step takes them (float32, or int32 for
    labels, token ids and timesteps), and for the digits families the rows of load_digits()."""
    kind, b = cfg["kind"], cfg["batch"]
    if kind in ("unet", "vae", "vit"):
        images, labels = load_digits()
        rows = [sorted(rng.choice(len(images), b, replace=False).tolist()) for _ in range(steps)]
        feeds = []
        for picked in rows:
            x = (images[picked] / 16.0).astype(np.float32)
            if kind == "vae":
                feeds.append({"x": x.reshape(b, 64)})
            elif kind == "vit":
                feeds.append({"x": x[:, None], "y": labels[picked].astype(np.int32)})
            else:
                feeds.append({
                    "x": (x[:, None] * 2.0 - 1.0).astype(np.float32),
                    "noise": rng.normal(0.0, 1.0, (b, 1, 8, 8)).astype(np.float32),
                    "t": rng.integers(0, cfg["timesteps"], b).astype(np.int32),
                })  # fmt: skip
        return feeds, rows
    feeds = []
    for _ in range(steps):
        if kind == "whisper":
            feeds.append({
                "mel": rng.normal(0.0, 1.0, (b, cfg["mels"], cfg["frames"])).astype(np.float32),
                "y": rng.integers(0, cfg["classes"], b).astype(np.int32),
            })  # fmt: skip
        elif kind == "lstm":  # counting by a per-sequence stride modulo vocab: the next token is predictable
            start = rng.integers(0, cfg["vocab"], (b, 1))
            stride = rng.integers(1, 3, (b, 1))
            stream = (start + stride * np.arange(cfg["seq"] + 1)) % cfg["vocab"]
            feeds.append(
                {"tokens": stream[:, :-1].astype(np.int32), "targets": stream[:, 1:].reshape(-1).astype(np.int32)}
            )
        else:  # gpt2: random tokens
            stream = rng.integers(0, cfg["vocab"], (b, cfg["seq"] + 1))
            feeds.append(
                {"tokens": stream[:, :-1].astype(np.int32), "targets": stream[:, 1:].reshape(-1).astype(np.int32)}
            )
    return feeds, None


def loss_value(model: nn.Module, cfg: dict, feed: dict[str, np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    inputs = {k: to_torch(v, dtype) for k, v in feed.items()}
    kind = cfg["kind"]
    if kind in ("gpt2", "lstm"):
        return F.cross_entropy(model(inputs["tokens"]), inputs["targets"])
    if kind == "vit":
        return F.cross_entropy(model(inputs["x"]), inputs["y"])
    if kind == "whisper":
        return F.cross_entropy(model(inputs["mel"]), inputs["y"])
    if kind == "vae":
        x = inputs["x"]
        recon, mu, logvar = model(x)
        kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return F.binary_cross_entropy(recon, x, reduction="sum") + kld
    if kind == "unet":
        sqrt_ab, sqrt_1mab = (torch.tensor(table, dtype=dtype) for table in noise_schedule(cfg["timesteps"]))
        t, noise = inputs["t"], inputs["noise"]
        x_t = sqrt_ab[t][:, None, None, None] * inputs["x"] + sqrt_1mab[t][:, None, None, None] * noise
        return F.mse_loss(model(x_t, t), noise)
    raise ValueError(kind)


# ---------------------------------------------------------------------------------------------


def train(spec: dict, init: dict[str, np.ndarray], feeds: list[dict], dtype: torch.dtype):
    """(loss per step, {step in DELTA_STEPS: {name: value after that step − initial}}, {step in
    DELTA_STEPS: the draws of that step})."""
    cfg = spec["model"]
    torch.manual_seed(0)  # nothing should draw from it; set anyway
    torch.set_num_threads(1)
    draws = Draws(spec.get("rng_seed"))
    model = MODELS[cfg["kind"]](cfg, draws).to(dtype)
    model.train()
    model.load_state_dict({k: torch.tensor(v).to(dtype) for k, v in init.items()}, strict=True)
    optimizer = getattr(torch.optim, spec["optimizer"][0])(model.parameters(), **spec["optimizer"][1])
    start = {k: v.detach().clone().double() for k, v in model.state_dict().items()}
    losses, deltas, drawn = [], {}, {}
    for step, feed in enumerate(feeds):
        draws.start(step)  # meganeura's step counter: the program's k-th run draws at step k
        optimizer.zero_grad(set_to_none=True)
        value = loss_value(model, cfg, feed, dtype)
        value.backward()
        optimizer.step()
        losses.append(value.item())
        if step in DELTA_STEPS:
            deltas[step] = {k: (v.double() - start[k]).numpy() for k, v in model.state_dict().items()}
            drawn[step] = draws.log
    return losses, deltas, drawn


def check_philox() -> None:
    """The numpy Philox gives Random123's known answers."""
    for counter, key, words in PHILOX_KNOWN:
        got = philox4x32_10(np.array(counter, dtype=np.uint32).reshape(4, 1), key)[:, 0]
        assert tuple(int(w) for w in got) == words, (counter, key, [hex(w) for w in got])


def check_encoder_layer() -> None:
    """EncoderLayer without dropout is torch's nn.TransformerEncoderLayer(norm_first=True, gelu,
    batch_first=True) to float64 rounding, on the same parameters."""
    cfg = dict(VIT, dropout=0.0)
    mine = EncoderLayer(cfg, Draws(None)).double()
    rng = np.random.default_rng(0)
    mine.load_state_dict({k: torch.tensor(v).double() for k, v in initial_state(mine, rng).items()})
    theirs = nn.TransformerEncoderLayer(
        cfg["dim"], cfg["heads"], cfg["mlp"], 0.0, activation="gelu", layer_norm_eps=cfg["eps"], batch_first=True,
        norm_first=True,
    ).double()  # fmt: skip
    theirs.load_state_dict(mine.state_dict(), strict=True)
    x = torch.tensor(rng.normal(0.0, 1.0, (3, 5, cfg["dim"])))
    torch.testing.assert_close(mine(x), theirs(x), rtol=1e-12, atol=1e-12)


def generate(name: str) -> dict[str, np.ndarray]:
    """The arrays of one scenario's reference file, computed afresh."""
    check_philox()
    check_encoder_layer()
    spec = SCENARIOS[name]
    cfg = spec["model"]
    rng = np.random.default_rng(spec["seed"])
    init = initial_state(MODELS[cfg["kind"]](cfg, Draws(None)), rng)
    feeds, rows = batches(cfg, rng, STEPS)
    losses, deltas, drawn = train(spec, init, feeds, torch.float64)
    _, deltas32, drawn32 = train(spec, init, feeds, torch.float32)
    for step, log in drawn.items():  # the draws do not depend on the precision
        assert all(np.array_equal(a[3], b[3]) for a, b in zip(log, drawn32[step], strict=True))
    opt_name, hyper = spec["optimizer"]
    meta = {
        "scenario": name,
        "model": cfg,
        "loss": spec["loss"],
        "optimizer": opt_name,
        "hyper": hyper,
        "steps": STEPS,
        "delta_steps": list(DELTA_STEPS),
        "rng_seed": spec.get("rng_seed"),
        "random": [[stream, list(shape), kind] for stream, shape, kind, _ in drawn[0]],
        "rows": rows,
        "torch": torch.__version__.split("+")[0],
    }
    arrays: dict[str, np.ndarray] = {"meta": np.array(json.dumps(meta, sort_keys=True))}
    for key, value in init.items():
        arrays[f"init/{key}"] = value
    for step, feed in enumerate(feeds):
        arrays |= step_arrays(step, feed, losses[step], deltas.get(step, {}), deltas32.get(step, {}))
        for stream, _, _, values in drawn.get(step, []):
            arrays[f"step{step}/random/{stream}"] = values
    return arrays


if __name__ == "__main__":
    write_scenarios(sys.argv[1:], SCENARIOS, generate, REFERENCE_DIR)
