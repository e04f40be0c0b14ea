"""The models the benchmarks build, written with the DSL as a user writes them.

Each builder returns a `Workload`: the model, its loss, its input specs, an optimizer and a
function that makes one batch of inputs (numpy, seeded). The shapes are the real ones of the
architectures named; `depth` is the number of blocks or layers.

- `residual_mlp(depth, width=256)`: x + fc2(relu(fc1(x))) blocks on [64, width], a linear head,
  cross-entropy, AdamW;
- `smollm2(depth)`: the Llama of examples/char_lm.py (attention and RoPE written by hand, recognised
  by the e-graph) with SmolLM2-135M's shapes: dim 576, 9/3 heads, SwiGLU 1536, vocab 49152 tied,
  batch 8 × seq 256, AdamW;
- `gpt2(depth)`: GPT-2-small shapes: dim 768, 12 heads, LayerNorm, GELU (tanh), learned positions,
  F.scaled_dot_product_attention, vocab 50257 tied, batch 8 × seq 256, AdamW;
- `resnet(depth)`: torchvision's BasicBlock stacks on CIFAR shapes [128, 3, 32, 32], four stages of
  widths 64-128-256-512 (depth 8 is ResNet-18), AdamW.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples"))
import char_lm  # noqa: E402  (the example's model)


@dataclass
class Workload:
    """A model with what it takes to compile and feed one training step."""

    name: str
    model: nn.Module
    loss: Callable[..., Any]
    inputs: dict[str, mn.InputSpec]
    optimizer: Any
    batch: Callable[[np.random.Generator], dict[str, np.ndarray]]


def cross_entropy(model, x, y):
    return F.cross_entropy(model(x), y)


# --------------------------------------------------------------------------------------------
# Residual MLP


class ResidualBlock(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc2(F.relu(self.fc1(x)))


class ResidualMLP(nn.Module):
    def __init__(self, depth: int, width: int, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(ResidualBlock(width) for _ in range(depth)))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        return self.head(self.blocks(x))


def residual_mlp(depth: int, width: int = 256, batch: int = 64) -> Workload:
    def feed(rng):
        return {
            "x": rng.normal(size=(batch, width)).astype(np.float32),
            "y": rng.integers(0, 10, size=batch).astype(np.int32),
        }

    inputs = {"x": mn.f32[batch, width], "y": mn.i32[batch]}
    return Workload(
        f"residual-mlp-{width}", ResidualMLP(depth, width), cross_entropy, inputs, optim.AdamW(lr=1e-3), feed
    )


# --------------------------------------------------------------------------------------------
# SmolLM2-shaped Llama (the example's model)


def smollm2(depth: int, batch: int = 8, seq: int = 256, vocab: int = 49152, dim: int = 576) -> Workload:
    model = char_lm.CharLlama(vocab, dim=dim, layers=depth, heads=9, kv_heads=3)
    inputs = char_lm.model_inputs(model, batch, seq) | {"targets": mn.i32[batch * seq]}
    tables = char_lm.fixed_inputs(model, seq)

    def feed(rng):
        return {
            "tokens": rng.integers(0, vocab, size=(batch, seq)).astype(np.int32),
            "targets": rng.integers(0, vocab, size=batch * seq).astype(np.int32),
            **tables,
        }

    return Workload("smollm2", model, char_lm.lm_loss, inputs, optim.AdamW(lr=1e-3), feed)


# --------------------------------------------------------------------------------------------
# GPT-2


class GPT2Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        batch, seq, dim = x.shape
        head_dim = dim // self.heads
        qkv = self.c_attn(self.ln_1(x))
        q, k, v = (
            qkv[..., i * dim : (i + 1) * dim].reshape(batch, seq, self.heads, head_dim).transpose(1, 2)
            for i in range(3)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(attended.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, depth: int, vocab: int, seq: int, dim: int, heads: int) -> None:
        super().__init__()
        self.dim = dim
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.h = nn.ModuleList([GPT2Block(dim, heads) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, tokens, positions):
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x).reshape(-1, self.dim), self.wte.weight)  # tied head


def gpt2_loss(model, tokens, positions, targets):
    return F.cross_entropy(model(tokens, positions), targets)


def gpt2(depth: int, batch: int = 8, seq: int = 256, vocab: int = 50257, dim: int = 768, heads: int = 12) -> Workload:
    model = GPT2(depth, vocab, seq, dim, heads)
    inputs = {"tokens": mn.i32[batch, seq], "positions": mn.i32[seq], "targets": mn.i32[batch * seq]}

    def feed(rng):
        return {
            "tokens": rng.integers(0, vocab, size=(batch, seq)).astype(np.int32),
            "positions": np.arange(seq, dtype=np.int32),
            "targets": rng.integers(0, vocab, size=batch * seq).astype(np.int32),
        }

    return Workload("gpt2", model, gpt2_loss, inputs, optim.AdamW(lr=1e-3), feed)


# --------------------------------------------------------------------------------------------
# ResNet basic-block stacks


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNetStack(nn.Module):
    """A 3×3 stem, `depth` basic blocks in four stages (64, 128, 256, 512 channels; each later stage
    starts with stride 2), global average pooling and a linear classifier (CIFAR's ResNet-18 at
    depth 8)."""

    def __init__(self, depth: int, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        blocks, cin = [], 64
        per_stage = [depth // 4 + (1 if stage < depth % 4 else 0) for stage in range(4)]
        for stage, count in enumerate(per_stage):
            cout = 64 << stage
            for index in range(count):
                blocks.append(BasicBlock(cin, cout, 2 if stage and index == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.flatten(self.pool(x), 1))


def resnet(depth: int, batch: int = 128, size: int = 32) -> Workload:
    def feed(rng):
        return {
            "x": rng.normal(size=(batch, 3, size, size)).astype(np.float32),
            "y": rng.integers(0, 10, size=batch).astype(np.int32),
        }

    inputs = {"x": mn.f32[batch, 3, size, size], "y": mn.i32[batch]}
    return Workload("resnet", ResNetStack(depth), cross_entropy, inputs, optim.AdamW(lr=1e-3), feed)


WORKLOADS: dict[str, Callable[[int], Workload]] = {
    "residual-mlp": residual_mlp,
    "smollm2": smollm2,
    "gpt2": gpt2,
    "resnet": resnet,
}
