"""The benchmark models, written with the DSL as a PyTorch user writes them, with PyTorch's module
and parameter names (so a torch.nn mirror with the same structure loads their state_dict as is:
meganeura/bench/mirrors.py).

- `Llama`: SmolLM2's layout (examples/char_lm.py's model, kept here because an installed package
  cannot import the examples): token embedding, pre-norm decoder layers of RMSNorm → causal
  self-attention with grouped KV heads and rotary embeddings → RMSNorm → SwiGLU, a final RMSNorm
  and a head tied to the embedding. Attention and RoPE are written out by hand (softmax of
  q·kᵀ·scale plus the additive causal mask; q·cos + rotate_half(q)·sin): the e-graph recognises them.
- `GPT2`: LayerNorm, GELU (tanh), learned positions, F.scaled_dot_product_attention, tied head.
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
    """Token ids [batch, seq] and positions [seq] → logits [batch·seq, vocab]; GPT-2's init
    (matrices and embeddings N(0, 0.02), biases zero, the norms at ones)."""

    def __init__(self, depth: int, vocab: int, seq: int, dim: int, heads: int) -> None:
        super().__init__()
        self.dim = dim
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.h = nn.ModuleList([GPT2Block(dim, heads) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)
        normal_init(self, std=0.02, skip=lambda name: "ln_" in name)

    def forward(self, tokens, positions):
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x).reshape(-1, self.dim), self.wte.weight)  # tied head


def gpt2_loss(model, tokens, positions, targets):
    return F.cross_entropy(model(tokens, positions), targets)


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
