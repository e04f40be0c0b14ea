"""How long the e-graph stage takes on a real model: the full training step (forward, backward,
AdamW) of a Llama-style transformer with SmolLM2-135M's shapes, traced and then optimised.

    python benchmarks/egraph_scale.py [--layers 30] [--batch 1] [--seq 128] [--vocab 49152] [--json] [--profile]

No GPU is used: the script only traces the step and runs `meganeura.rewrite.optimize` on it. It
prints the IR size, the e-graph size, the time of each stage (encode, saturate, extract) and the
kernel count before and after, and says whether the whole stage fits in the 5 s goal.

How the model is written with the ops the DSL has (no embedding, gather, expand or concat yet):
- token embedding: a one-hot f32 input [B·S, V] times the embedding Parameter [V, 576];
- LM head: tied to the embedding (as in SmolLM2-135M), logits = h · embeddingᵀ;
- RMSNorm: x · rsqrt(mean(x², -1, keepdim) + eps) · weight;
- rotary embeddings: q·cos + rotate_half(q)·sin, with rotate_half(q) = q @ P for a fixed signed
  permutation input P [64, 64], and cos/sin inputs [S, 64] (broadcast over batch and heads);
- grouped KV heads: k and v [B, 3, S, 64] are reshaped to [B, 3, 1, S, 64], broadcast to
  [B, 3, 3, S, 64] with the IR's `broadcast_to` op (it has a gradient, a sum; the DSL has no
  `expand`, so the script emits it through the tracer) and reshaped to [B, 9, S, 64], which
  repeats each KV head for its 3 query heads like `repeat_interleave`;
- causal attention: softmax(q @ kᵀ · 1/√64 + mask) @ v, the mask an additive f32 input [S, S].
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import sys
import time
import traceback

import numpy as np

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import trace_step
from meganeura.rewrite import optimize
from meganeura.tensor import Tensor

HIDDEN = 576
HEADS = 9
KV_HEADS = 3
HEAD_DIM = HIDDEN // HEADS
MLP_HIDDEN = 1536
NORM_EPS = 1e-5
GOAL_S = 5.0


def expand(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    """x broadcast to `shape` (torch.expand), through the IR's broadcast_to op."""
    return x.tracer.emit("broadcast_to", [x], shape=tuple(shape))


class RMSNorm(nn.Module):
    """x / √(mean(x², last dim) + eps), scaled by a learned weight."""

    def __init__(self, dim: int, eps: float = NORM_EPS) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(np.ones(dim, np.float32))

    def forward(self, x: Tensor) -> Tensor:
        return x * F.rsqrt(F.mean(x * x, -1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal self-attention with rotary embeddings and grouped KV heads."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v_proj = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)

    def heads(self, x: Tensor, count: int) -> Tensor:
        """[B, S, count·D] → [B, count, S, D]."""
        batch, seq, _ = x.shape
        return x.reshape(batch, seq, count, HEAD_DIM).transpose(1, 2)

    def repeat_kv(self, x: Tensor) -> Tensor:
        """[B, KV, S, D] → [B, H, S, D], each KV head repeated for its group of query heads."""
        batch, _, seq, _ = x.shape
        group = HEADS // KV_HEADS
        grouped = expand(x.reshape(batch, KV_HEADS, 1, seq, HEAD_DIM), (batch, KV_HEADS, group, seq, HEAD_DIM))
        return grouped.reshape(batch, HEADS, seq, HEAD_DIM)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor, Tensor], mask: Tensor) -> Tensor:
        batch, seq, _ = x.shape
        q = rotary(self.heads(self.q_proj(x), HEADS), *rope)
        k = self.repeat_kv(rotary(self.heads(self.k_proj(x), KV_HEADS), *rope))
        v = self.repeat_kv(self.heads(self.v_proj(x), KV_HEADS))
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(HEAD_DIM)) + mask
        out = F.softmax(scores, -1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, HEADS * HEAD_DIM))


def rotary(x: Tensor, cos: Tensor, sin: Tensor, rotate_half: Tensor) -> Tensor:
    """x·cos + rotate_half(x)·sin, rotate_half a matmul with a signed permutation."""
    return x * cos + (x @ rotate_half) * sin


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) · up(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(HIDDEN, MLP_HIDDEN, bias=False)
        self.up_proj = nn.Linear(HIDDEN, MLP_HIDDEN, bias=False)
        self.down_proj = nn.Linear(MLP_HIDDEN, HIDDEN, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """One pre-norm decoder layer: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(HIDDEN)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor, Tensor], mask: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Embedding, decoder layers, final norm and an LM head tied to the embedding."""

    def __init__(self, vocab: int, layers: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Parameter(np.zeros((vocab, HIDDEN), np.float32))
        self.layers = nn.ModuleList([Block() for _ in range(layers)])
        self.norm = RMSNorm(HIDDEN)

    def forward(self, one_hot: Tensor, rope: tuple[Tensor, Tensor, Tensor], mask: Tensor, batch: int) -> Tensor:
        """Logits [B·S, V] of one-hot tokens [B·S, V]."""
        x = (one_hot @ self.embed_tokens).reshape(batch, -1, HIDDEN)
        for layer in self.layers:
            x = layer(x, rope, mask)
        return F.linear(self.norm(x).reshape(-1, HIDDEN), self.embed_tokens)


def build_graph(layers: int, batch: int, seq: int, vocab: int):
    """The traced training step (forward, backward, AdamW) of the model, and the trace time."""
    model = Llama(vocab, layers)

    def loss_fn(model, tokens, labels, cos, sin, rotate_half, mask):
        logits = model(tokens, (cos, sin, rotate_half), mask, batch)
        return F.cross_entropy(logits, labels)

    inputs = {
        "tokens": mn.f32[batch * seq, vocab],
        "labels": mn.i32[batch * seq],
        "cos": mn.f32[seq, HEAD_DIM],
        "sin": mn.f32[seq, HEAD_DIM],
        "rotate_half": mn.f32[HEAD_DIM, HEAD_DIM],
        "mask": mn.f32[seq, seq],
    }
    started = time.perf_counter()
    traced = trace_step(model, loss_fn, inputs, optim.AdamW(lr=1e-3))
    return traced.graph, time.perf_counter() - started


def measure(graph) -> dict:
    """Run `optimize` once; its figures as a dict (or the error and the trace-only figures)."""
    figures: dict = {"ir_nodes": len(graph)}
    started = time.perf_counter()
    try:
        _, report = optimize(graph)
    except Exception as error:  # the rewrite stage may be mid-change: report and fall back
        figures["error"] = f"{type(error).__name__}: {error}"
        figures["traceback"] = traceback.format_exc()
        started = time.perf_counter()
        _, report = optimize(graph, enabled=False)
        figures.update(
            kernels_before=report.kernels_before,
            kernels_after=report.kernels_after,
            disabled_s=time.perf_counter() - started,
        )
        return figures
    figures.update(
        enodes=report.enodes,
        eclasses=report.eclasses,
        iterations=report.iterations,
        saturated=report.saturated,
        budget_hit=report.budget_hit,
        encode_s=report.encode_s,
        saturate_s=report.saturate_s,
        extract_s=report.extract_s,
        total_s=report.total_s,
        kernels_before=report.kernels_before,
        kernels_after=report.kernels_after,
        goal_met=report.total_s <= GOAL_S,
        rules={rule.name: {"matches": rule.matches, "uses": rule.uses} for rule in report.rules},
    )
    return figures


def print_figures(figures: dict) -> None:
    print(f"IR nodes:   {figures['ir_nodes']:,}")
    if "error" in figures:
        print(figures["traceback"], end="", file=sys.stderr)
        print(f"optimize failed: {figures['error']}")
        print(f"optimize(enabled=False): {figures['disabled_s']:.3f} s")
        print(f"kernels:    {figures['kernels_before']:,} (no rewrite)")
        return
    state = "saturated" if figures["saturated"] else "budget hit" if figures["budget_hit"] else "stopped"
    print(f"e-nodes:    {figures['enodes']:,}")
    print(f"e-classes:  {figures['eclasses']:,}  ({figures['iterations']} iterations, {state})")
    for stage in ("encode", "saturate", "extract", "total"):
        print(f"{stage + ':':<11} {figures[stage + '_s']:.3f} s")
    print(f"kernels:    {figures['kernels_before']:,} -> {figures['kernels_after']:,}")
    matched = [f"{name} {n['matches']}/{n['uses']}" for name, n in figures["rules"].items() if n["matches"]]
    print(f"rules (matches/used): {', '.join(matched) or 'none matched'}")
    print(f"goal (total <= {GOAL_S:g} s): {'met' if figures['goal_met'] else 'NOT met'}")


def profile(graph, top: int = 25) -> None:
    """cProfile over one `optimize` call; the `top` functions by cumulative time."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        optimize(graph)
    finally:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
        print(out.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--profile", action="store_true", help="profile optimize(); print the top 25 functions")
    args = parser.parse_args()
    graph, trace_s = build_graph(args.layers, args.batch, args.seq, args.vocab)
    if args.profile:
        profile(graph)
        return
    figures = {"layers": args.layers, "batch": args.batch, "seq": args.seq, "vocab": args.vocab, "trace_s": trace_s}
    figures |= measure(graph)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"Llama (SmolLM2-135M shapes), {args.layers} layers, batch {args.batch}, seq {args.seq}, vocab {args.vocab}")
    print(f"trace:      {trace_s:.3f} s")
    print_figures(figures)


if __name__ == "__main__":
    main()
