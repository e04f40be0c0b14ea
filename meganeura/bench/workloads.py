"""The workloads the benchmarks run: a DSL model with its loss, input specs, optimizer, a seeded
batch and the sizes its PyTorch mirror needs (meganeura/bench/mirrors.py).

Two registries:
- `STEPS`: the training steps `python -m meganeura bench` times against PyTorch, each at its real
  size and at a small one (`--small`: seconds on lavapipe, for tests):
  `smollm2` (SmolLM2-135M's shapes: 30 layers, dim 576, 9/3 heads, SwiGLU 1536, vocab 49152
  tied, batch 8 × seq 256, AdamW), `gpt2` (GPT-2-small: 12 layers, dim 768, 12 heads, LayerNorm,
  GELU tanh, learned positions, SDPA, vocab 50257 tied, batch 8 × seq 256, AdamW), `resnet18`
  (CIFAR shapes [128, 3, 32, 32], AdamW), `digits-mlp` (784-1024-1024-10, batch 256, Adam),
  `gpt2-dropout` (gpt2 with nanoGPT's dropout 0.1), `vit` (ViT-Tiny/16: timm's layout, 12 layers,
  dim 192, 3 heads, MLP 768, dropout 0.1, batch 64 × 3 × 224 × 224, 1000 classes, AdamW) and
  `unet` (DDPM's U-Net layout at widths 64/128/256 on 32 × 32, 2 res blocks per level, attention
  in the middle, batch 64, noise-prediction MSE, AdamW);
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
    # The step draws random numbers (dropout): PyTorch's draws differ from ours, so the mirror
    # check compares an eval-mode (dropout-off) forward's loss instead (meganeura/bench/harness.py).
    stochastic: bool = False


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
    depth: int = 12,
    batch: int = 8,
    seq: int = 256,
    vocab: int = 50257,
    dim: int = 768,
    heads: int = 12,
    dropout: float = 0.0,
) -> Workload:
    model = models.GPT2(depth, vocab, seq, dim, heads, dropout)
    inputs = {"tokens": mn.i32[batch, seq], "positions": mn.i32[seq], "targets": mn.i32[batch * seq]}

    def feed(rng):
        return {
            "tokens": rng.integers(0, vocab, size=(batch, seq)).astype(np.int32),
            "positions": np.arange(seq, dtype=np.int32),
            "targets": rng.integers(0, vocab, size=batch * seq).astype(np.int32),
        }

    dropped = f"dropout {dropout:g} (embeddings, attention probabilities, residuals), " if dropout else ""
    title = (
        f"GPT-2-shaped LM: {depth} layers, dim {dim}, {heads} heads, LayerNorm, GELU tanh, learned positions, "
        f"SDPA, {dropped}vocab {vocab} tied, batch {batch} × seq {seq}, AdamW"
    )
    config = {"depth": depth, "vocab": vocab, "seq": seq, "dim": dim, "heads": heads, "dropout": dropout}
    return Workload(
        "gpt2", title, model, models.gpt2_loss, inputs, optim.AdamW(lr=1e-3), feed, config, stochastic=dropout > 0
    )


def vit(
    batch: int = 64,
    size: int = 224,
    patch: int = 16,
    dim: int = 192,
    depth: int = 12,
    heads: int = 3,
    hidden: int = 768,
    classes: int = 1000,
    drop: float = 0.1,
) -> Workload:
    model = models.ViT(size, patch, dim, depth, heads, hidden, classes, drop)
    inputs = {"x": mn.f32[batch, 3, size, size], "y": mn.i32[batch]}

    def feed(rng):
        return {
            "x": rng.normal(size=(batch, 3, size, size)).astype(np.float32),
            "y": rng.integers(0, classes, size=batch).astype(np.int32),
        }

    title = (
        f"ViT/{patch} (timm layout): {depth} layers, dim {dim}, {heads} heads, MLP {hidden} GELU, pre-LN, SDPA, "
        f"class token, learned positions, dropout {drop:g}, {classes} classes, batch {batch} × 3 × {size} × {size}, "
        "AdamW"
    )
    config = {
        "size": size,
        "patch": patch,
        "dim": dim,
        "depth": depth,
        "heads": heads,
        "hidden": hidden,
        "classes": classes,
        "drop": drop,
    }
    return Workload(
        "vit", title, model, models.cross_entropy, inputs, optim.AdamW(lr=1e-3), feed, config, stochastic=drop > 0
    )


# DDPM's noise schedule: β linear from 1e-4 to 0.02 over 1000 steps, ᾱ_t = Π (1 − β).
DIFFUSION_STEPS = 1000
ALPHAS_BAR = np.cumprod(1.0 - np.linspace(1e-4, 0.02, DIFFUSION_STEPS))


def unet(
    batch: int = 64,
    size: int = 32,
    channels: int = 64,
    mult: tuple[int, ...] = (1, 2, 4),
    blocks: int = 2,
    groups: int = 32,
    head_dim: int = 64,
) -> Workload:
    model = models.UNet(channels, mult, blocks, groups, head_dim)
    image = (batch, 3, size, size)
    inputs = {
        "x0": mn.f32[image],
        "noise": mn.f32[image],
        "t": mn.f32[batch],
        "signal": mn.f32[batch],
        "sigma": mn.f32[batch],
    }

    def feed(rng):
        t = rng.integers(0, DIFFUSION_STEPS, size=batch)
        return {
            "x0": rng.uniform(-1.0, 1.0, size=image).astype(np.float32),  # images scaled to [−1, 1]
            "noise": rng.normal(size=image).astype(np.float32),
            "t": t.astype(np.float32),
            "signal": np.sqrt(ALPHAS_BAR[t]).astype(np.float32),
            "sigma": np.sqrt(1.0 - ALPHAS_BAR[t]).astype(np.float32),
        }

    widths = "/".join(str(channels * m) for m in mult)
    title = (
        f"U-Net denoiser (DDPM layout): widths {widths}, {blocks} res blocks per level, GroupNorm {groups}, SiLU, "
        f"attention (heads of {head_dim}) at {size >> (len(mult) - 1)}², noise MSE, batch {batch} × 3 × {size} × "
        f"{size}, AdamW"
    )
    config = {
        "channels": channels,
        "mult": tuple(mult),
        "blocks": blocks,
        "groups": groups,
        "head_dim": head_dim,
    }
    return Workload("unet", title, model, models.diffusion_loss, inputs, optim.AdamW(lr=1e-3), feed, config)


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
            "gpt2-dropout",
            "the gpt2 step with nanoGPT's dropout 0.1 (embeddings, attention probabilities, residuals)",
            lambda: gpt2(dropout=0.1),
            lambda: gpt2(depth=2, batch=2, seq=16, vocab=101, dim=48, heads=4, dropout=0.1),
        ),
        StepWorkload(
            "vit",
            "ViT-Tiny/16 (12 layers, dim 192, 3 heads, MLP 768, dropout 0.1, batch 64 × 3 × 224 × 224, AdamW)",
            vit,
            lambda: vit(batch=2, size=16, patch=4, dim=24, depth=2, heads=2, hidden=48, classes=10),
        ),
        StepWorkload(
            "unet",
            "U-Net denoiser (DDPM layout, widths 64/128/256, batch 64 × 3 × 32 × 32, noise MSE, AdamW)",
            unet,
            lambda: unet(batch=2, size=8, channels=8, mult=(1, 2), blocks=1, groups=4, head_dim=8),
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
