"""Time one training step (forward, backward, AdamW) of the Llama-style LM of examples/char_lm.py in
meganeura and, when installed, the same model written with torch.nn in PyTorch on the same machine,
same shapes, same batch. Prints milliseconds per step and the ratio.

    python benchmarks/lm_step.py [--layers 2] [--dim 64] [--heads 4] [--kv-heads 2] [--seq 32]
                                 [--batch 8] [--vocab 96] [--steps 50]

Ours is the example's model as written (attention and RoPE by hand, recognised by the e-graph);
PyTorch's uses F.scaled_dot_product_attention (its fused kernels) and the same RoPE, SwiGLU,
RMSNorm and tied head. Absolute times hold only for the adapter they were taken on; compare the ratio.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
from side_by_side import print_side_by_side, seconds_per_step, torch_seconds_per_step  # (this script's folder)

from meganeura.runtime import default_device

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))
import char_lm  # noqa: E402


def torch_llama(torch, args, cos: np.ndarray, sin: np.ndarray):
    """The example's model in torch.nn (RoPE tables fixed; SDPA with grouped heads)."""
    nn, functional = torch.nn, torch.nn.functional
    head_dim = args.dim // args.heads
    hidden = 16 * math.ceil(args.dim * 8 / 3 / 16)

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = nn.Linear(args.dim, args.heads * head_dim, bias=False)
            self.k_proj = nn.Linear(args.dim, args.kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(args.dim, args.kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(args.heads * head_dim, args.dim, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, args.heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, s, args.kv_heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, s, args.kv_heads, head_dim).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            out = functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return self.o_proj(out.transpose(1, 2).reshape(b, s, args.heads * head_dim))

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.input_layernorm = nn.RMSNorm(args.dim, eps=1e-5)
            self.self_attn = Attention()
            self.post_attention_layernorm = nn.RMSNorm(args.dim, eps=1e-5)
            self.gate_proj = nn.Linear(args.dim, hidden, bias=False)
            self.up_proj = nn.Linear(args.dim, hidden, bias=False)
            self.down_proj = nn.Linear(hidden, args.dim, bias=False)

        def forward(self, x, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(functional.silu(self.gate_proj(h)) * self.up_proj(h))

    class Llama(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(args.vocab, args.dim)
            self.layers = nn.ModuleList([Layer() for _ in range(args.layers)])
            self.norm = nn.RMSNorm(args.dim, eps=1e-5)
            self.register_buffer("cos", torch.tensor(cos))
            self.register_buffer("sin", torch.tensor(sin))

        def forward(self, tokens):
            x = self.embed_tokens(tokens)
            for layer in self.layers:
                x = layer(x, self.cos, self.sin)
            return functional.linear(self.norm(x).reshape(-1, args.dim), self.embed_tokens.weight)

    return Llama()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=96)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, args.vocab, size=(args.batch, args.seq)).astype(np.int32)
    targets = rng.integers(0, args.vocab, size=args.batch * args.seq).astype(np.int32)
    print(f"adapter: {default_device().describe()}")
    print(
        f"Llama-style LM: {args.layers} layers, dim {args.dim}, {args.heads}/{args.kv_heads} heads, "
        f"vocab {args.vocab}, batch {args.batch} × seq {args.seq}"
    )
    model = char_lm.CharLlama(args.vocab, dim=args.dim, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads)
    program = char_lm.compile_training(model, args.batch, args.seq, lr=1e-3)
    tables = char_lm.fixed_inputs(model, args.seq)
    ours = seconds_per_step(lambda: program.train_step(tokens=tokens, targets=targets, **tables), args.steps)

    def build(torch):
        return torch_llama(torch, args, tables["cos"], tables["sin"])

    def adamw(torch, parameters):
        return torch.optim.AdamW(parameters, lr=1e-3)

    reference = torch_seconds_per_step(build, adamw, tokens.astype(np.int64), targets, args.steps)
    print_side_by_side(ours, reference)


if __name__ == "__main__":
    main()
