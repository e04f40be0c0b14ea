"""Train a Llama-style character-level language model on the Python standard library's own source
files (on every machine, no download) with meganeura, then sample text from it.

    python examples/char_lm.py [--steps 1000] [--layers 2] [--dim 64] [--seq 32] [--batch 8] [--lr 3e-3]
                               [--seed 0] [--sample-chars 300] [--prompt "def "] [--report]

The model is written the way a PyTorch user writes a Llama by hand (SmolLM2's layout, scaled
down): token embedding, pre-norm decoder layers of RMSNorm → causal self-attention with grouped
KV heads and rotary embeddings → RMSNorm → SwiGLU MLP, a final RMSNorm and an LM head tied to
the embedding (as SmolLM2 does). Attention is written out — softmax(q·kᵀ·scale + mask)·v with
the additive causal mask `mn.causal_mask(seq)`, KV heads repeated with expand/reshape (the
e-graph's recognition rules turn it into the fused attention op before autodiff) — and so is RoPE,
in the half-split form of HF transformers, q·cos + rotate_half(q)·sin with rotate_half built
from slices and mn.cat; the e-graph decides what to fuse.

Prints the adapter, a summary of the e-graph's report (`--report` prints all of it: every rule
and every kernel with its source lines), the unigram entropy of the validation text, the
training and validation loss as they fall, and a sample: an inference program compiled from
the same model (it shares the trained weights) called autoregressively, with temperature
sampling, on the ids so far — [1, length], no padding — and, once they are longer than the
context the model was trained on (`--seq`), on a sliding window of the last `--seq`. The program
compiles a plan for each new length on its first call at it (meganeura/shape_plans.py): at most
`--seq` lengths are compiled, and it is made to keep them all (`max_shapes=seq`); the sample's
line says how long it took and how many lengths it compiled. Set MEGANEURA_ADAPTER (a
substring of the adapter name, or "cpu"/"gpu") to choose the adapter.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sysconfig
import time

import numpy as np

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.fit import loss_curve_saved
from meganeura.runtime import default_device

# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


def rotate_half(x):
    """[x1, x2] → [−x2, x1] over the last dim (HF transformers' rotate_half)."""
    half = x.shape[-1] // 2
    x1 = x[..., :half]
    x2 = x[..., half:]
    return mn.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    """Rotary position embeddings, the half-split convention of Llama/SmolLM2 in HF transformers."""
    q_embed = q * cos + rotate_half(q) * sin
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed, k_embed


def repeat_kv(x, n_rep: int):
    """[batch, kv_heads, seq, head_dim] → [batch, kv_heads·n_rep, seq, head_dim] (HF's repeat_kv)."""
    batch, kv_heads, seq, head_dim = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, head_dim)
    return x.reshape(batch, kv_heads * n_rep, seq, head_dim)


class Attention(nn.Module):
    """Causal multi-head self-attention with grouped KV heads and rotary embeddings."""

    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads = heads, kv_heads
        self.head_dim = dim // heads
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = repeat_kv(k, self.heads // self.kv_heads)
        v = repeat_kv(v, self.heads // self.kv_heads)
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(self.head_dim)) + mn.causal_mask(seq)
        out = F.softmax(scores, dim=-1) @ v  # [batch, heads, seq, head_dim]
        out = out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) · up(x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, dim: int, heads: int, kv_heads: int, mlp_hidden: int, eps: float) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(dim, eps=eps)
        self.self_attn = Attention(dim, heads, kv_heads)
        self.post_attention_layernorm = nn.RMSNorm(dim, eps=eps)
        self.mlp = MLP(dim, mlp_hidden)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class CharLlama(nn.Module):
    """Token ids [batch, seq] (+ the RoPE tables) → logits [batch·seq, vocab].

    The LM head is tied to the embedding (logits = h · embed_tokens.weightᵀ), as in SmolLM2.
    """

    def __init__(
        self,
        vocab: int,
        dim: int = 64,
        layers: int = 2,
        heads: int = 4,
        kv_heads: int = 2,
        mlp_hidden: int | None = None,
        eps: float = 1e-5,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.vocab, self.dim, self.heads = vocab, dim, heads
        # SmolLM2-135M: hidden 576, MLP 1536 (8/3 of it), 9 query / 3 KV heads of 64.
        mlp_hidden = mlp_hidden or 16 * math.ceil(dim * 8 / 3 / 16)
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([DecoderLayer(dim, heads, kv_heads, mlp_hidden, eps) for _ in range(layers)])
        self.norm = nn.RMSNorm(dim, eps=eps)
        # HF's Llama init: every matrix N(0, init_std) (torch's N(0, 1) embedding is too large
        # for a tied head); the norms start at ones.
        rng = np.random.default_rng(int(nn._rng.integers(2**31)))
        for name, param in self.named_parameters():
            if not name.endswith("layernorm.weight") and name != "norm.weight":
                param.copy_(rng.normal(0.0, init_std, size=param.shape))

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def forward(self, tokens, cos, sin):
        x = self.embed_tokens(tokens)  # [batch, seq, dim]
        for layer in self.layers:
            x = layer(x, cos, sin)
        h = self.norm(x).reshape(-1, self.dim)
        return F.linear(h, self.embed_tokens.weight)  # tied head


def lm_loss(model, tokens, targets, cos, sin):
    """Next-character cross-entropy (nats per character), averaged over batch and positions."""
    return F.cross_entropy(model(tokens, cos, sin), targets)


def rope_tables(seq: int, head_dim: int, theta: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [seq, head_dim] of HF's rotary embedding (frequencies repeated over both halves)."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(seq, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def model_inputs(model: CharLlama, batch: int, seq: int) -> dict:
    """The input specs of the inference program (tokens and the fixed tables)."""
    return {
        "tokens": mn.i32[batch, seq],
        "cos": mn.f32[seq, model.head_dim],
        "sin": mn.f32[seq, model.head_dim],
    }


def fixed_inputs(model: CharLlama, seq: int) -> dict[str, np.ndarray]:
    cos, sin = rope_tables(seq, model.head_dim)
    return {"cos": cos, "sin": sin}


def compile_training(model: CharLlama, batch: int, seq: int, lr: float, rewrite: bool = True) -> mn.Program:
    inputs = model_inputs(model, batch, seq) | {"targets": mn.i32[batch * seq]}
    return mn.compile(model, loss=lm_loss, inputs=inputs, optimizer=optim.AdamW(lr=lr), rewrite=rewrite)


# --------------------------------------------------------------------------------------------
# The data
# --------------------------------------------------------------------------------------------


def load_text(max_chars: int = 4_000_000) -> str:
    """The standard library's top-level .py files, in name order, up to `max_chars` characters;
    characters outside ASCII are replaced by '?' (the vocabulary stays small)."""
    stdlib = sysconfig.get_paths()["stdlib"]
    parts, total = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        parts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    text = "".join(parts)[:max_chars]
    return "".join(c if c == "\n" or c == "\t" or " " <= c <= "~" else "?" for c in text)


class Vocab:
    """Characters ↔ ids, in code-point order."""

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.index[c] for c in text], dtype=np.int32)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def split_data(text: str, val_fraction: float = 0.1):
    """(vocab, train ids, validation ids): the last `val_fraction` of the text is held out."""
    vocab = Vocab(text)
    ids = vocab.encode(text)
    n_val = int(len(ids) * val_fraction)
    return vocab, ids[:-n_val], ids[-n_val:]


def unigram_entropy(ids: np.ndarray, vocab_size: int) -> float:
    """The entropy of the character frequencies of `ids`, in nats per character: the loss of
    the best model that ignores context."""
    p = np.bincount(ids, minlength=vocab_size) / len(ids)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def get_batch(ids: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    """Random windows: tokens [batch, seq] and the next characters [batch·seq]."""
    starts = rng.integers(0, len(ids) - seq - 1, size=batch)
    tokens = np.stack([ids[s : s + seq] for s in starts])
    targets = np.stack([ids[s + 1 : s + seq + 1] for s in starts])
    return tokens, targets.reshape(-1)


def cross_entropy_np(logits: np.ndarray, targets: np.ndarray) -> float:
    logits = logits.astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    log_z = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
    return float((log_z - logits[np.arange(len(targets)), targets]).mean())


def evaluate(predict: mn.Program, ids: np.ndarray, batch: int, seq: int, tables: dict, windows: int = 8) -> float:
    """Mean cross-entropy of the inference program on `windows` fixed batches of `ids`."""
    rng = np.random.default_rng(1234)
    losses = []
    for _ in range(windows):
        tokens, targets = get_batch(ids, batch, seq, rng)
        losses.append(cross_entropy_np(predict(tokens=tokens, **tables), targets))
    return float(np.mean(losses))


def compile_sampling(model: CharLlama, seq: int) -> mn.Program:
    """The inference program that `sample` calls: batch 1, compiled for the full context `seq` and
    keeping a plan for every length up to it (a prompt shorter than `seq` grows one id a step)."""
    return mn.compile(model, inputs=model_inputs(model, 1, seq), max_shapes=seq)


def sample(
    predict: mn.Program,
    vocab: Vocab,
    prompt: np.ndarray,
    n_chars: int,
    seq: int,
    tables: dict,
    temperature: float = 0.8,
    seed: int = 0,
) -> str:
    """Generate `n_chars` characters after `prompt` (any length ≥ 1): the inference program runs on
    the last `seq` ids at most, as they are ([1, length] with the RoPE tables' first `length`
    rows), and the next id is drawn from softmax(logits / temperature) at the last position."""
    if len(prompt) == 0:
        raise ValueError("sample() needs a prompt of at least one character")
    rng = np.random.default_rng(seed)
    ids = [int(i) for i in prompt]
    for _ in range(n_chars):
        window = ids[-seq:]
        length = len(window)
        tokens = np.array([window], dtype=np.int32)
        cos, sin = tables["cos"][:length], tables["sin"][:length]
        logits = predict(tokens=tokens, cos=cos, sin=sin)[-1].astype(np.float64) / temperature
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return vocab.decode(ids[len(prompt) :])


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample-chars", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--prompt", default="def ", help="the text the sample starts from (any length)")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--report", action="store_true", help="print the whole e-graph report (every kernel)")
    parser.add_argument("--plot", default="out/char_lm_loss.png", help="loss-curve PNG ('' for none)")
    args = parser.parse_args()

    print(f"adapter: {default_device().describe()}")
    vocab, train_ids, val_ids = split_data(load_text())
    entropy = unigram_entropy(val_ids, len(vocab))
    print(f"data: {len(train_ids):,} training and {len(val_ids):,} validation characters of the standard library")
    print(f"vocabulary: {len(vocab)} characters; unigram entropy of the validation text {entropy:.3f} nats/char")

    mn.manual_seed(args.seed)
    model = CharLlama(len(vocab), args.dim, args.layers, args.heads, args.kv_heads)
    n_params = sum(p.numpy().size for p in model.parameters())
    print(
        f"model: {args.layers} layers, dim {args.dim}, {args.heads} heads / {args.kv_heads} KV heads of "
        f"{model.head_dim}, SwiGLU {model.layers[0].mlp.gate_proj.out_features}, tied head, {n_params:,} parameters"
    )
    start = time.perf_counter()
    program = compile_training(model, args.batch, args.seq, args.lr)
    predict = mn.compile(model, inputs=model_inputs(model, args.batch, args.seq))
    generate = compile_sampling(model, args.seq)
    print(f"compiled in {time.perf_counter() - start:.2f} s (training step, evaluation and sampling programs)\n")
    report = program.report()
    print(report if args.report else report.summary())
    print()

    tables = fixed_inputs(model, args.seq)
    rng = np.random.default_rng(args.seed)
    losses = []
    start = time.perf_counter()
    val_loss = float("nan")
    evaluations = []
    for step in range(1, args.steps + 1):
        tokens, targets = get_batch(train_ids, args.batch, args.seq, rng)
        losses.append(program.train_step(tokens=tokens, targets=targets, **tables))
        if step % args.eval_every == 0 or step == args.steps:
            val_loss = evaluate(predict, val_ids, args.batch, args.seq, tables)
            evaluations.append((step, {"validation loss": val_loss}))
            recent = np.mean(losses[-args.eval_every :])
            print(
                f"step {step:5d}  train loss {recent:.3f}  validation loss {val_loss:.3f}"
                f"  ({time.perf_counter() - start:.1f} s)"
            )
    elapsed = time.perf_counter() - start
    per_step = 1000 * elapsed / max(args.steps, 1)
    print(f"\ntrained {args.steps} steps in {elapsed:.1f} s ({per_step:.1f} ms per step, with evaluation)")
    verdict = "below" if val_loss < entropy else "NOT below"
    print(f"validation loss {val_loss:.3f} nats/char, {verdict} the unigram entropy {entropy:.3f}")
    if args.plot:
        curve = list(enumerate(losses, start=1))
        print(loss_curve_saved(curve, args.plot, "character-level Llama", evaluations))

    if args.sample_chars > 0:
        unknown = sorted(set(args.prompt) - set(vocab.chars))
        if not args.prompt:
            parser.error("--prompt needs at least one character")
        if unknown:
            parser.error(f"--prompt has characters that are not in the vocabulary: {unknown}")
        prompt = vocab.encode(args.prompt)
        start = time.perf_counter()
        text = sample(generate, vocab, prompt, args.sample_chars, args.seq, tables, args.temperature, args.seed)
        lengths = len(generate.report().shapes)
        print(
            f"\nsample (temperature {args.temperature}, {time.perf_counter() - start:.1f} s, {lengths} input "
            f"lengths compiled) after the prompt {args.prompt!r}:\n"
        )
        print(args.prompt + text)


if __name__ == "__main__":
    main()
