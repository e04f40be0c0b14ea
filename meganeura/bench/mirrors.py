"""PyTorch mirrors of the bench's workloads (meganeura/bench/workloads.py): the same models in
torch.nn, with the same module structure and parameter names as the DSL models, so that each
loads OUR initial state_dict as is and both sides start from the same weights; and their losses
and optimizers with the same hyper-parameters.

This module imports torch: import it only where torch is installed (`torch_available()` in
meganeura/bench/harness.py says).

`Mirror(workload)` is what the harness needs: a fresh torch.nn model holding the workload's
initial values (`model(device)`), the loss called like ours (`loss(model, **batch)`), and the
optimizer (`optimizer(parameters)`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as TF
from torch import nn

from meganeura.bench.workloads import Workload

# --------------------------------------------------------------------------------------------
# SmolLM2-shaped Llama (models.Llama)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)

    def forward(self, x, cos, sin):
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        # PyTorch's fused attention (what a PyTorch user calls), grouped heads without copies.
        out = TF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(TF.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(dim, eps=1e-5)
        self.self_attn = LlamaAttention(dim, heads, kv_heads)
        self.post_attention_layernorm = nn.RMSNorm(dim, eps=1e-5)
        self.mlp = LlamaMLP(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, vocab: int, dim: int, depth: int, heads: int, kv_heads: int, hidden: int) -> None:
        super().__init__()
        self.dim = dim
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([LlamaLayer(dim, heads, kv_heads, hidden) for _ in range(depth)])
        self.norm = nn.RMSNorm(dim, eps=1e-5)

    def forward(self, tokens, cos, sin):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return TF.linear(self.norm(x).reshape(-1, self.dim), self.embed_tokens.weight)


def llama_loss(model, tokens, targets, cos, sin):
    return TF.cross_entropy(model(tokens, cos, sin), targets)


# --------------------------------------------------------------------------------------------
# GPT-2 (models.GPT2)


class GPT2Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.resid_dropout = nn.Dropout(dropout)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)
        self.mlp_dropout = nn.Dropout(dropout)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = (
            part.reshape(batch, seq, self.heads, dim // self.heads).transpose(1, 2)
            for part in self.c_attn(self.ln_1(x)).split(dim, dim=-1)
        )
        p = self.dropout if self.training else 0.0
        attended = TF.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.resid_dropout(self.c_proj(attended.transpose(1, 2).reshape(batch, seq, dim)))
        return x + self.mlp_dropout(self.mlp_proj(TF.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT2(nn.Module):
    def __init__(self, depth: int, vocab: int, seq: int, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dim = dim
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([GPT2Block(dim, heads, dropout) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, tokens, positions):
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return TF.linear(self.ln_f(x).reshape(-1, self.dim), self.wte.weight)


def gpt2_loss(model, tokens, positions, targets):
    return TF.cross_entropy(model(tokens, positions), targets)


# --------------------------------------------------------------------------------------------
# ViT (models.ViT)


class ViTAttention(nn.Module):
    def __init__(self, dim: int, heads: int, attn_drop: float, proj_drop: float) -> None:
        super().__init__()
        self.heads, self.attn_drop = heads, attn_drop
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = (
            part.reshape(batch, seq, self.heads, dim // self.heads).transpose(1, 2)
            for part in self.qkv(x).split(dim, dim=-1)
        )
        p = self.attn_drop if self.training else 0.0
        out = TF.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, seq, dim)))


class ViTMlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(TF.gelu(self.fc1(x)))))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, drop: float, attn_drop: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ViTAttention(dim, heads, attn_drop, drop)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ViTMlp(dim, hidden, drop)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, channels: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class ViT(nn.Module):
    def __init__(
        self,
        size: int,
        patch: int,
        dim: int,
        depth: int,
        heads: int,
        hidden: int,
        classes: int,
        drop: float = 0.0,
        attn_drop: float = 0.0,
    ) -> None:
        super().__init__()
        tokens = (size // patch) ** 2 + 1
        self.patch_embed = PatchEmbed(patch, 3, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, dim))
        self.pos_drop = nn.Dropout(drop)
        self.blocks = nn.ModuleList([ViTBlock(dim, heads, hidden, drop, attn_drop) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(x + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


# --------------------------------------------------------------------------------------------
# U-Net denoiser (models.UNet)


def timestep_embedding(t, dim: int):
    half = dim // 2
    frequencies = torch.exp(
        torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(10000.0) / (half - 1))
    )
    angles = t[:, None] * frequencies[None, :]
    return torch.cat((torch.sin(angles), torch.cos(angles)), dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb_proj = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, temb):
        h = self.conv1(TF.silu(self.norm1(x)))
        h = h + self.temb_proj(TF.silu(temb))[:, :, None, None]
        h = self.conv2(TF.silu(self.norm2(h)))
        return h + (x if self.skip is None else self.skip(x))


class AttnBlock(nn.Module):
    def __init__(self, channels: int, head_dim: int, groups: int) -> None:
        super().__init__()
        self.heads = channels // head_dim
        self.norm = nn.GroupNorm(groups, channels)
        self.qkv = nn.Conv2d(channels, 3 * channels, 1)
        self.proj = nn.Conv2d(channels, channels, 1)

    def forward(self, x, temb):
        batch, channels, height, width = x.shape
        qkv = self.qkv(self.norm(x)).reshape(batch, 3 * channels, height * width)
        q, k, v = (
            part.reshape(batch, self.heads, channels // self.heads, height * width).transpose(-2, -1)
            for part in qkv.chunk(3, dim=1)
        )
        out = TF.scaled_dot_product_attention(q, k, v)
        return x + self.proj(out.transpose(-2, -1).reshape(batch, channels, height, width))


class Downsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x, temb):
        return self.conv(x)


class Upsample(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, temb):
        return self.conv(self.up(x))


class UNet(nn.Module):
    def __init__(
        self, channels: int, mult: tuple[int, ...], blocks: int, groups: int, head_dim: int, image_channels: int = 3
    ) -> None:
        super().__init__()
        self.channels, tdim = channels, 4 * channels
        self.time_fc1 = nn.Linear(channels, tdim)
        self.time_fc2 = nn.Linear(tdim, tdim)
        self.conv_in = nn.Conv2d(image_channels, channels, 3, padding=1)
        down, skips, width = [], [channels], channels
        for level, factor in enumerate(mult):
            for _ in range(blocks):
                down.append(ResBlock(width, channels * factor, tdim, groups))
                width = channels * factor
                skips.append(width)
            if level < len(mult) - 1:
                down.append(Downsample(width))
                skips.append(width)
        self.down = nn.ModuleList(down)
        self.mid = nn.ModuleList(
            [
                ResBlock(width, width, tdim, groups),
                AttnBlock(width, head_dim, groups),
                ResBlock(width, width, tdim, groups),
            ]
        )
        up = []
        for level, factor in reversed(list(enumerate(mult))):
            for _ in range(blocks + 1):
                up.append(ResBlock(width + skips.pop(), channels * factor, tdim, groups))
                width = channels * factor
            if level > 0:
                up.append(Upsample(width))
        self.up = nn.ModuleList(up)
        self.norm_out = nn.GroupNorm(groups, width)
        self.conv_out = nn.Conv2d(width, image_channels, 3, padding=1)

    def forward(self, x, t):
        temb = self.time_fc2(TF.silu(self.time_fc1(timestep_embedding(t, self.channels))))
        h = self.conv_in(x)
        skips = [h]
        for module in self.down:
            h = module(h, temb)
            skips.append(h)
        for module in self.mid:
            h = module(h, temb)
        for module in self.up:
            h = module(torch.cat((h, skips.pop()), dim=1), temb) if isinstance(module, ResBlock) else module(h, temb)
        return self.conv_out(TF.silu(self.norm_out(h)))


def diffusion_loss(model, x0, noise, t, signal, sigma):
    x_t = signal[:, None, None, None] * x0 + sigma[:, None, None, None] * noise
    return TF.mse_loss(model(x_t, t), noise)


# --------------------------------------------------------------------------------------------
# ResNet (models.ResNetStack) and the MLP (models.MLP)


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
        out = self.bn2(self.conv2(TF.relu(self.bn1(self.conv1(x)))))
        return TF.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNetStack(nn.Module):
    def __init__(self, depth: int, width: int, classes: int = 10) -> None:
        super().__init__()
        from meganeura.bench.models import stage_depths

        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        blocks, cin = [], width
        for stage, count in enumerate(stage_depths(depth)):
            cout = width << stage
            for index in range(count):
                blocks.append(BasicBlock(cin, cout, 2 if stage and index == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.layers(TF.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(self.pool(x), 1))


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)])

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index < len(self.layers) - 1:
                x = TF.relu(x)
        return x


def cross_entropy(model, x, y):
    return TF.cross_entropy(model(x), y)


# --------------------------------------------------------------------------------------------
# Workload → mirror


def build_module(workload: Workload) -> nn.Module:
    """The torch.nn model of `workload` (PyTorch's own init: the caller loads our values)."""
    c = workload.config
    if workload.name == "smollm2":
        return Llama(c["vocab"], c["dim"], c["depth"], c["heads"], c["kv_heads"], c["hidden"])
    if workload.name in ("gpt2", "gpt2-dropout"):
        return GPT2(c["depth"], c["vocab"], c["seq"], c["dim"], c["heads"], c.get("dropout", 0.0))
    if workload.name == "vit":
        return ViT(c["size"], c["patch"], c["dim"], c["depth"], c["heads"], c["hidden"], c["classes"], c["drop"])
    if workload.name == "unet":
        return UNet(c["channels"], c["mult"], c["blocks"], c["groups"], c["head_dim"])
    if workload.name in ("resnet", "resnet18"):
        return ResNetStack(c["depth"], c["width"])
    if workload.name == "digits-mlp":
        return MLP(c["sizes"])
    raise KeyError(f"no PyTorch mirror of workload {workload.name!r}")


LOSSES: dict[str, Callable] = {
    "smollm2": llama_loss,
    "gpt2": gpt2_loss,
    "gpt2-dropout": gpt2_loss,
    "vit": cross_entropy,
    "unet": diffusion_loss,
    "resnet": cross_entropy,
    "resnet18": cross_entropy,
    "digits-mlp": cross_entropy,
}


def torch_optimizer(ours, parameters) -> torch.optim.Optimizer:
    """PyTorch's optimizer with our optimizer's hyper-parameters (meganeura/optim/optimizers.py)."""
    from meganeura import optim

    if isinstance(ours, optim.Adam):  # AdamW too: decoupled says which
        kind = torch.optim.AdamW if ours.decoupled else torch.optim.Adam
        return kind(parameters, lr=ours.lr, betas=ours.betas, eps=ours.eps, weight_decay=ours.weight_decay)
    if isinstance(ours, optim.SGD):
        return torch.optim.SGD(parameters, lr=ours.lr, momentum=ours.momentum, weight_decay=ours.weight_decay)
    raise TypeError(f"no PyTorch counterpart of {type(ours).__name__}")


def torch_state(state: dict[str, np.ndarray], module: nn.Module, device) -> dict[str, torch.Tensor]:
    """Our state_dict as `module`'s tensors (its dtypes: num_batches_tracked is int64 there);
    the names must be the same on both sides, or the mirror is not the same model."""
    theirs = module.state_dict()
    missing, extra = sorted(set(theirs) - set(state)), sorted(set(state) - set(theirs))
    if missing or extra:
        raise ValueError(f"mirror of different structure: torch only {missing[:8]}, ours only {extra[:8]}")
    out = {}
    for name, tensor in theirs.items():
        value = np.asarray(state[name])
        if tuple(value.shape) != tuple(tensor.shape):
            raise ValueError(f"mirror {name}: torch {tuple(tensor.shape)}, ours {value.shape}")
        out[name] = torch.as_tensor(value).to(device=device, dtype=tensor.dtype)
    return out


def torch_batch(batch: dict[str, np.ndarray], device) -> dict[str, torch.Tensor]:
    """Our batch as torch tensors: integers as int64 (indices), floats as float32."""
    return {
        name: torch.as_tensor(np.asarray(value, dtype=np.int64 if value.dtype.kind in "iu" else np.float32)).to(device)
        for name, value in batch.items()
    }


class Mirror:
    """What it takes to run `workload`'s step in PyTorch from our initial values `state`."""

    def __init__(self, workload: Workload, state: dict[str, np.ndarray]) -> None:
        if workload.name not in LOSSES:
            raise KeyError(f"no PyTorch mirror of workload {workload.name!r}")
        self.workload, self.state = workload, state
        self.loss = LOSSES[workload.name]

    def model(self, device) -> nn.Module:
        module = build_module(self.workload)
        module.load_state_dict(torch_state(self.state, module, device="cpu"), strict=True)
        return module.to(device).train()

    def optimizer(self, parameters) -> torch.optim.Optimizer:
        return torch_optimizer(self.workload.optimizer, parameters)


def parameter_count(module: nn.Module) -> int:
    return sum(math.prod(p.shape) for p in module.parameters())
