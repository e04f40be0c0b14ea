"""The benchmark models, written with the DSL as a PyTorch user writes them, with PyTorch's module
and parameter names (so a torch.nn mirror with the same structure loads their state_dict as is:
meganeura/bench/mirrors.py).

- `Llama`: SmolLM2's layout (examples/char_lm.py's model, kept here because an installed package
  cannot import the examples): token embedding, pre-norm decoder layers of RMSNorm → causal
  self-attention with grouped KV heads and rotary embeddings → RMSNorm → SwiGLU, a final RMSNorm
  and a head tied to the embedding. Attention and RoPE are written out by hand (softmax of
  q·kᵀ·scale plus the additive causal mask; q·cos + rotate_half(q)·sin): the e-graph recognises them.
- `GPT2`: LayerNorm, GELU (tanh), learned positions, F.scaled_dot_product_attention, tied head;
  nanoGPT's dropout when asked (embeddings, attention probabilities, residual branches).
- `ViT`: timm's VisionTransformer (patch embedding by a strided conv, class token, learned
  positions, pre-LN blocks with SDPA and a GELU MLP, dropout).
- `UNet`: DDPM's U-Net denoiser (GroupNorm, SiLU, time embedding, stride-2 conv down, nearest
  upsampling and conv up, skip concatenations, self-attention in the middle) and its noise loss.
- `ResNetStack`: torchvision's BasicBlock in four stages on CIFAR shapes (ResNet-18 at 8 blocks).
- `MLP`: Linear layers with ReLU between them (the digits MLP, 784-1024-1024-10).
- `ResidualMLP`: x + fc2(relu(fc1(x))) blocks and a linear head (compile_scale's sweep).
"""

from __future__ import annotations

import math

import numpy as np

import meganeura as mn
import meganeura.functional as F
from meganeura import nn

# --------------------------------------------------------------------------------------------
# SmolLM2-shaped Llama


def rotate_half(x):
    """[x1, x2] → [−x2, x1] over the last dim (HF transformers' rotate_half)."""
    half = x.shape[-1] // 2
    return mn.cat((-x[..., half:], x[..., :half]), dim=-1)


def repeat_kv(x, n_rep: int):
    """[batch, kv_heads, seq, head_dim] → [batch, kv_heads·n_rep, seq, head_dim] (HF's repeat_kv)."""
    if n_rep == 1:
        return x
    batch, kv_heads, seq, head_dim = x.shape
    x = x[:, :, None, :, :].expand(batch, kv_heads, n_rep, seq, head_dim)
    return x.reshape(batch, kv_heads * n_rep, seq, head_dim)


class LlamaAttention(nn.Module):
    """Causal self-attention with grouped KV heads and rotary embeddings, written out."""

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
        k, v = repeat_kv(k, self.heads // self.kv_heads), repeat_kv(v, self.heads // self.kv_heads)
        scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(self.head_dim)) + mn.causal_mask(seq)
        out = F.softmax(scores, dim=-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) · up(x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(dim, eps=eps)
        self.self_attn = LlamaAttention(dim, heads, kv_heads)
        self.post_attention_layernorm = nn.RMSNorm(dim, eps=eps)
        self.mlp = LlamaMLP(dim, hidden)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Token ids [batch, seq] and the RoPE tables [seq, head_dim] → logits [batch·seq, vocab].

    Initialised as HF's Llama: every matrix N(0, 0.02), the norms at ones (PyTorch's N(0, 1)
    embedding makes the tied head's logits far too large)."""

    def __init__(
        self, vocab: int, dim: int, layers: int, heads: int, kv_heads: int, hidden: int, eps: float = 1e-5
    ) -> None:
        super().__init__()
        self.dim, self.head_dim = dim, dim // heads
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([LlamaLayer(dim, heads, kv_heads, hidden, eps) for _ in range(layers)])
        self.norm = nn.RMSNorm(dim, eps=eps)
        normal_init(self, std=0.02, skip=lambda name: "norm" in name)

    def forward(self, tokens, cos, sin):
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return F.linear(self.norm(x).reshape(-1, self.dim), self.embed_tokens.weight)


def llama_loss(model, tokens, targets, cos, sin):
    return F.cross_entropy(model(tokens, cos, sin), targets)


def normal_init(model: nn.Module, std: float, skip) -> None:
    """Every parameter whose name `skip` rejects drawn from N(0, std²) (the seeded generator of nn),
    biases set to zero."""
    rng = np.random.default_rng(int(nn._rng.integers(2**31)))
    for name, param in model.named_parameters():
        if skip(name):
            continue
        if name.endswith(".bias"):
            param.copy_(np.zeros(param.shape, np.float32))
        else:
            param.copy_(rng.normal(0.0, std, size=param.shape))


# --------------------------------------------------------------------------------------------
# GPT-2


class GPT2Block(nn.Module):
    """nanoGPT's block: dropout (when p > 0) on the attention probabilities (SDPA's dropout_p, in
    training only) and on both residual branches."""

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
        head_dim = dim // self.heads
        qkv = self.c_attn(self.ln_1(x))
        q, k, v = (
            qkv[..., i * dim : (i + 1) * dim].reshape(batch, seq, self.heads, head_dim).transpose(1, 2)
            for i in range(3)
        )
        p = self.dropout if self.training else 0.0  # SDPA drops whatever the mode, as PyTorch's
        attended = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        x = x + self.resid_dropout(self.c_proj(attended.transpose(1, 2).reshape(batch, seq, dim)))
        return x + self.mlp_dropout(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT2(nn.Module):
    """Token ids [batch, seq] and positions [seq] → logits [batch·seq, vocab]; GPT-2's init
    (matrices and embeddings N(0, 0.02), biases zero, the norms at ones); `dropout` on the
    embeddings and in every block (nanoGPT's), none by default."""

    def __init__(self, depth: int, vocab: int, seq: int, dim: int, heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dim = dim
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([GPT2Block(dim, heads, dropout) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)
        normal_init(self, std=0.02, skip=lambda name: "ln_" in name)

    def forward(self, tokens, positions):
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x).reshape(-1, self.dim), self.wte.weight)  # tied head


def gpt2_loss(model, tokens, positions, targets):
    return F.cross_entropy(model(tokens, positions), targets)


# --------------------------------------------------------------------------------------------
# ViT


class ViTAttention(nn.Module):
    """Multi-head self-attention over the tokens (timm's Attention): qkv, SDPA (dropout_p on the
    probabilities in training), proj, dropout."""

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
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, seq, dim)))


class ViTMlp(nn.Module):
    """fc1, GELU (erf), dropout, fc2, dropout (timm's Mlp)."""

    def __init__(self, dim: int, hidden: int, drop: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(drop)

    def forward(self, x):
        return self.drop2(self.fc2(self.drop1(F.gelu(self.fc1(x)))))


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
    """Non-overlapping patches by a strided convolution, as tokens [batch, patches, dim]."""

    def __init__(self, patch: int, channels: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class ViT(nn.Module):
    """timm's VisionTransformer layout (vit_tiny_patch16_224 at its defaults): images [batch, 3,
    size, size] → logits [batch, classes]; patch embedding, class token, learned positions,
    dropout `drop` after them, pre-LN blocks (dropout `drop` on the residual branches and after
    the MLP's GELU, `attn_drop` on the attention probabilities), a final LayerNorm and a linear
    head on the class token. Initialised as timm's: positions and class token N(0, 0.02), Linear
    weights N(0, 0.02) with zero biases, the norms at ones, the patch convolution PyTorch's."""

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
        self.cls_token = nn.Parameter(np.zeros((1, 1, dim), np.float32))
        self.pos_embed = nn.Parameter(np.zeros((1, tokens, dim), np.float32))
        self.pos_drop = nn.Dropout(drop)
        self.blocks = nn.ModuleList([ViTBlock(dim, heads, hidden, drop, attn_drop) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, classes)
        normal_init(self, std=0.02, skip=lambda name: "norm" in name or name.startswith("patch_embed"))

    def forward(self, x):
        x = self.patch_embed(x)
        x = mn.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(x + self.pos_embed)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


# --------------------------------------------------------------------------------------------
# U-Net denoiser


def timestep_embedding(t, dim: int):
    """DDPM's sinusoidal embedding of timesteps t [batch] (float) → [batch, dim]: sin and cos of
    t·10000^(−i/(dim/2 − 1)), built in the step from constants."""
    half = dim // 2
    frequencies = mn.exp(mn.arange(half, dtype=mn.float32) * (-math.log(10000.0) / (half - 1)))
    angles = t[:, None] * frequencies[None, :]
    return mn.cat((mn.sin(angles), mn.cos(angles)), dim=1)


class ResBlock(nn.Module):
    """DDPM's residual block: GroupNorm, SiLU, 3×3 conv, plus the projected time embedding,
    GroupNorm, SiLU, 3×3 conv; a 1×1 conv on the shortcut where the channels change."""

    def __init__(self, cin: int, cout: int, tdim: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb_proj = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.skip is None else self.skip(x))


class AttnBlock(nn.Module):
    """Self-attention over the pixels (DDPM's, with heads of `head_dim` channels as ADM's):
    GroupNorm, 1×1 conv to q, k, v, SDPA, 1×1 conv, residual."""

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
        out = F.scaled_dot_product_attention(q, k, v)  # [batch, heads, pixels, head_dim]
        return x + self.proj(out.transpose(-2, -1).reshape(batch, channels, height, width))


class Downsample(nn.Module):
    """A stride-2 3×3 convolution (halves the resolution)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x, temb):
        return self.conv(x)


class Upsample(nn.Module):
    """Nearest-neighbour upsampling by 2, then a 3×3 convolution."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, temb):
        return self.conv(self.up(x))


class UNet(nn.Module):
    """DDPM's U-Net (Ho et al. 2020, its CIFAR-10 layout) at `channels`·`mult` widths: noisy
    images [batch, 3, size, size] and timesteps [batch] → predicted noise of the images' shape.
    A sinusoidal time embedding through Linear-SiLU-Linear (4·channels wide) feeds every residual
    block; `blocks` residual blocks per level, each level after the first at half the resolution
    (stride-2 conv); a middle of block, self-attention (heads of `head_dim`), block; the way up
    with `blocks` + 1 blocks per level, each on the concatenation of the previous output and a
    skip from the way down, nearest-neighbour upsampling and a conv between levels; GroupNorm,
    SiLU and a 3×3 conv out. No dropout. PyTorch's default init."""

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
        temb = self.time_fc2(F.silu(self.time_fc1(timestep_embedding(t, self.channels))))
        h = self.conv_in(x)
        skips = [h]
        for module in self.down:
            h = module(h, temb)
            skips.append(h)
        for module in self.mid:
            h = module(h, temb)
        for module in self.up:
            h = module(mn.cat((h, skips.pop()), dim=1), temb) if isinstance(module, ResBlock) else module(h, temb)
        return self.conv_out(F.silu(self.norm_out(h)))


def diffusion_loss(model, x0, noise, t, signal, sigma):
    """DDPM's simple objective: the noise of x_t = signal·x0 + sigma·noise predicted, by MSE
    (signal = √ᾱ_t and sigma = √(1 − ᾱ_t) per image, from the host's noise schedule)."""
    x_t = signal[:, None, None, None] * x0 + sigma[:, None, None, None] * noise
    return F.mse_loss(model(x_t, t), noise)


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
    """A 3×3 stem, `depth` basic blocks in four stages (width, 2·width, 4·width, 8·width channels;
    each later stage starts with stride 2), global average pooling and a linear classifier
    (CIFAR's ResNet-18 at depth 8, width 64)."""

    def __init__(self, depth: int, classes: int = 10, width: int = 64) -> None:
        super().__init__()
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
        x = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(F.flatten(self.pool(x), 1))


def stage_depths(depth: int) -> list[int]:
    """Blocks per stage: `depth` spread over four stages, the earlier ones taking the remainder."""
    return [depth // 4 + (1 if stage < depth % 4 else 0) for stage in range(4)]


def cross_entropy(model, x, y):
    return F.cross_entropy(model(x), y)


# --------------------------------------------------------------------------------------------
# MLPs


class MLP(nn.Module):
    """Linear layers of the given sizes with ReLU between them (PyTorch's default init)."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)])

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index < len(self.layers) - 1:
                x = F.relu(x)
        return x


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
