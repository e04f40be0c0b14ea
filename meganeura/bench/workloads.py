"""The workloads the benchmarks run: a DSL model with its loss, input specs, optimizer, a seeded
batch and the sizes its PyTorch mirror needs (meganeura/bench/mirrors.py).

Two registries:
- `STEPS`: the training steps `python -m meganeura bench` times against PyTorch, each at its real
  size and at a small one (`--small`: seconds on lavapipe, for tests):
  `smollm2` (SmolLM2-135M's shapes: 30 layers, dim 576, 9/3 heads, SwiGLU 1536, vocab 49152
  tied, batch 8 × seq 256, AdamW), `gpt2` (GPT-2-small: 12 layers, dim 768, 12 heads, LayerNorm,
  GELU tanh, learned positions, SDPA, vocab 50257 tied, batch 8 × seq 256, AdamW), `resnet18`
  (CIFAR shapes [128, 3, 32, 32], AdamW) and `digits-mlp` (784-1024-1024-10, batch 256, Adam);
- `WORKLOADS`: builders by depth for benchmarks/compile_scale.py's sweeps (residual-mlp,
  smollm2, gpt2, resnet).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.bench import models


@dataclass
class Workload:
    """A model with what it takes to compile and feed one training step, and to mirror it in PyTorch."""

    name: str
    title: str  # the shapes, in words
    model: nn.Module
    loss: Callable[..., Any]
    inputs: dict[str, mn.InputSpec]
    optimizer: Any
    batch: Callable[[np.random.Generator], dict[str, np.ndarray]]
    config: dict[str, Any] = field(default_factory=dict)  # the sizes the mirror is built with


def residual_mlp(depth: int, width: int = 256, batch: int = 64) -> Workload:
    def feed(rng):
        return {
            "x": rng.normal(size=(batch, width)).astype(np.float32),
            "y": rng.integers(0, 10, size=batch).astype(np.int32),
        }

    inputs = {"x": mn.f32[batch, width], "y": mn.i32[batch]}
    title = f"residual MLP: {depth} blocks of width {width}, batch {batch}, AdamW"
    model = models.ResidualMLP(depth, width)
    config = {"depth": depth, "width": width}
    return Workload(
        f"residual-mlp-{width}", title, model, models.cross_entropy, inputs, optim.AdamW(lr=1e-3), feed, config
    )


def smollm2(
    depth: int = 30,
    batch: int = 8,
    seq: int = 256,
    vocab: int = 49152,
    dim: int = 576,
    heads: int = 9,
    kv_heads: int = 3,
    hidden: int = 1536,
) -> Workload:
    model = models.Llama(vocab, dim, depth, heads, kv_heads, hidden)
    head_dim = dim // heads
    inputs = {
        "tokens": mn.i32[batch, seq],
        "targets": mn.i32[batch * seq],
        "cos": mn.f32[seq, head_dim],
        "sin": mn.f32[seq, head_dim],
    }
    cos, sin = F.rotary_tables(seq, head_dim)

    def feed(rng):
        return {
            "tokens": rng.integers(0, vocab, size=(batch, seq)).astype(np.int32),
            "targets": rng.integers(0, vocab, size=batch * seq).astype(np.int32),
            "cos": cos,
            "sin": sin,
        }

    title = (
        f"SmolLM2-shaped LM: {depth} layers, dim {dim}, {heads}/{kv_heads} heads, SwiGLU {hidden}, "
        f"vocab {vocab} tied, batch {batch} × seq {seq}, AdamW"
    )
    config = {"vocab": vocab, "dim": dim, "depth": depth, "heads": heads, "kv_heads": kv_heads, "hidden": hidden}
    return Workload("smollm2", title, model, models.llama_loss, inputs, optim.AdamW(lr=1e-3), feed, config)


def gpt2(
    depth: int = 12, batch: int = 8, seq: int = 256, vocab: int = 50257, dim: int = 768, heads: int = 12
) -> Workload:
    model = models.GPT2(depth, vocab, seq, dim, heads)
    inputs = {"tokens": mn.i32[batch, seq], "positions": mn.i32[seq], "targets": mn.i32[batch * seq]}

    def feed(rng):
        return {
            "tokens": rng.integers(0, vocab, size=(batch, seq)).astype(np.int32),
            "positions": np.arange(seq, dtype=np.int32),
            "targets": rng.integers(0, vocab, size=batch * seq).astype(np.int32),
        }

    title = (
        f"GPT-2-shaped LM: {depth} layers, dim {dim}, {heads} heads, LayerNorm, GELU tanh, learned positions, "
        f"SDPA, vocab {vocab} tied, batch {batch} × seq {seq}, AdamW"
    )
    config = {"depth": depth, "vocab": vocab, "seq": seq, "dim": dim, "heads": heads}
    return Workload("gpt2", title, model, models.gpt2_loss, inputs, optim.AdamW(lr=1e-3), feed, config)


def resnet(depth: int = 8, batch: int = 128, size: int = 32, width: int = 64) -> Workload:
    def feed(rng):
        return {
            "x": rng.normal(size=(batch, 3, size, size)).astype(np.float32),
            "y": rng.integers(0, 10, size=batch).astype(np.int32),
        }

    inputs = {"x": mn.f32[batch, 3, size, size], "y": mn.i32[batch]}
    layers = 2 * depth + 2
    title = f"ResNet-{layers} (CIFAR stem, widths {width}-{8 * width}): batch {batch} × 3 × {size} × {size}, AdamW"
    model = models.ResNetStack(depth, width=width)
    config = {"depth": depth, "width": width}
    return Workload("resnet", title, model, models.cross_entropy, inputs, optim.AdamW(lr=1e-3), feed, config)


def digits_mlp(sizes: tuple[int, ...] = (784, 1024, 1024, 10), batch: int = 256) -> Workload:
    def feed(rng):
        return {
            "x": rng.normal(size=(batch, sizes[0])).astype(np.float32),
            "y": rng.integers(0, sizes[-1], size=batch).astype(np.int32),
        }

    inputs = {"x": mn.f32[batch, sizes[0]], "y": mn.i32[batch]}
    title = f"digits MLP {'-'.join(map(str, sizes))}, batch {batch}, Adam"
    model = models.MLP(sizes)
    config = {"sizes": tuple(sizes)}
    return Workload("digits-mlp", title, model, models.cross_entropy, inputs, optim.Adam(lr=1e-3), feed, config)


@dataclass(frozen=True)
class StepWorkload:
    """A training step the bench times: its real size and a small one (seconds on lavapipe)."""

    name: str
    summary: str
    full: Callable[[], Workload]
    small: Callable[[], Workload]

    def build(self, small: bool = False) -> Workload:
        workload = (self.small if small else self.full)()
        workload.name = self.name
        return workload


STEPS: dict[str, StepWorkload] = {
    step.name: step
    for step in (
        StepWorkload(
            "smollm2",
            "SmolLM2-135M-shaped LM (30 layers, dim 576, 9/3 heads, vocab 49152 tied, batch 8 × seq 256, AdamW)",
            smollm2,
            lambda: smollm2(depth=2, batch=2, seq=16, vocab=96, dim=48, heads=3, kv_heads=1, hidden=80),
        ),
        StepWorkload(
            "gpt2",
            "GPT-2-small shapes (12 layers, dim 768, 12 heads, vocab 50257 tied, batch 8 × seq 256, AdamW)",
            gpt2,
            lambda: gpt2(depth=2, batch=2, seq=16, vocab=101, dim=48, heads=4),
        ),
        StepWorkload(
            "resnet18",
            "ResNet-18 on CIFAR shapes (batch 128 × 3 × 32 × 32, AdamW)",
            resnet,
            lambda: resnet(depth=4, batch=4, size=8, width=8),
        ),
        StepWorkload(
            "digits-mlp",
            "the digits MLP (784-1024-1024-10, batch 256, Adam)",
            digits_mlp,
            lambda: digits_mlp((98, 64, 48, 10), batch=16),
        ),
    )
}


WORKLOADS: dict[str, Callable[[int], Workload]] = {
    "residual-mlp": residual_mlp,
    "smollm2": smollm2,
    "gpt2": gpt2,
    "resnet": resnet,
}
