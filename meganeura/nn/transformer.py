"""Attention and the Transformer with PyTorch's names, signatures, parameters and initialisation:
MultiheadAttention, TransformerEncoderLayer, TransformerEncoder, TransformerDecoderLayer,
TransformerDecoder, Transformer. A PyTorch state_dict of each loads unchanged.

Traced from the existing ops: F.scaled_dot_product_attention (the fused attention kernel) where
the attention weights are not asked for (need_weights=False, as the Transformer's layers ask),
the explicit softmax of the scores otherwise.

>>> from meganeura import nn
>>> [(name, p.shape) for name, p in nn.MultiheadAttention(8, 2).named_parameters()]
[('in_proj_weight', (24, 8)), ('in_proj_bias', (24,)), ('out_proj.weight', (8, 8)), ('out_proj.bias', (8,))]
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np

from meganeura import functional as F
from meganeura.ir.op import ShapeError
from meganeura.ir.trace import user_source_line
from meganeura.nn import Dropout, LayerNorm, Linear, init
from meganeura.nn.container import ModuleList
from meganeura.nn.module import Module
from meganeura.parameter import Parameter, is_tracing
from meganeura.tensor import Tensor, lift

__all__ = [
    "MultiheadAttention", "NonDynamicallyQuantizableLinear", "TransformerEncoderLayer", "TransformerEncoder",
    "TransformerDecoderLayer", "TransformerDecoder", "Transformer",
]  # fmt: skip

# ---------------------------------------------------------------------------------------------
# Attention


def additive_mask(mask, name: str) -> Tensor | None:
    """torch's F._canonical_mask: a boolean mask (True hides; a comparison's mask,
    F.is_boolean_mask) as 0 / −inf, a float mask as is."""
    if mask is None:
        return None
    mask = lift(mask)
    if mask.dtype != "f32":
        raise ShapeError(f"{user_source_line()}: {name}: expected a float or boolean mask, got {mask.type}")
    return F.where(mask, -math.inf, 0.0) if F.is_boolean_mask(mask) else mask


class NonDynamicallyQuantizableLinear(Linear):
    """torch.nn.modules.linear.NonDynamicallyQuantizableLinear: MultiheadAttention's out_proj, a Linear."""


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention: in_proj_weight [3E, E] (xavier_uniform_) and in_proj_bias [3E]
    (zeros), or q/k/v_proj_weight when kdim or vdim differ from embed_dim; out_proj a Linear with
    its bias zeroed. Not supported: add_bias_kv, add_zero_attn (NotImplementedError)."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
    ) -> None:
        super().__init__()
        at = user_source_line()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(
                f"{at}: embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} and "
                f"num_heads={num_heads} instead"
            )
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError(
                f"{at}: MultiheadAttention: add_bias_kv and add_zero_attn are not supported (only False)"
            )
        self.embed_dim = int(embed_dim)
        self.kdim = int(kdim) if kdim is not None else self.embed_dim
        self.vdim = int(vdim) if vdim is not None else self.embed_dim
        self._qkv_same_embed_dim = self.kdim == self.embed_dim and self.vdim == self.embed_dim
        self.num_heads = int(num_heads)
        self.dropout = F.dropout_probability(dropout, "MultiheadAttention: dropout")
        self.batch_first = bool(batch_first)
        self.head_dim = self.embed_dim // self.num_heads
        if self.head_dim * self.num_heads != self.embed_dim:
            raise ValueError(f"{at}: embed_dim must be divisible by num_heads")
        e = self.embed_dim
        if self._qkv_same_embed_dim:
            self.in_proj_weight = Parameter(np.zeros((3 * e, e), np.float32))
            self.q_proj_weight = self.k_proj_weight = self.v_proj_weight = None
        else:
            self.q_proj_weight = Parameter(np.zeros((e, e), np.float32))
            self.k_proj_weight = Parameter(np.zeros((e, self.kdim), np.float32))
            self.v_proj_weight = Parameter(np.zeros((e, self.vdim), np.float32))
            self.in_proj_weight = None
        self.in_proj_bias = Parameter(np.zeros(3 * e, np.float32)) if bias else None
        self.out_proj = NonDynamicallyQuantizableLinear(e, e, bias=bias)
        self.bias_k = self.bias_v = None
        self.add_zero_attn = False
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """torch's: xavier_uniform_ on the input projections, zeros for in_proj_bias and out_proj.bias
        (out_proj.weight keeps Linear's initialisation)."""
        for weight in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if weight is not None:
                init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """(attn_output, attn_output_weights) as torch: [L, N, E] (batch_first: [N, L, E]) and the
        weights [N, L, S] averaged over the heads ([N, heads, L, S] if not), None unless
        need_weights. Boolean masks (comparisons) hide where True, float masks are added."""
        return multi_head_attention(
            self,
            query,
            key,
            value,
            key_padding_mask,
            need_weights,
            attn_mask,
            average_attn_weights,
            is_causal,
        )

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, batch_first={self.batch_first}"


def multi_head_attention(
    mha: MultiheadAttention,
    query,
    key,
    value,
    key_padding_mask,
    need_weights: bool,
    attn_mask,
    average_attn_weights: bool,
    is_causal: bool,
) -> tuple[Tensor, Tensor | None]:
    """MultiheadAttention.forward: torch's F.multi_head_attention_forward on the module's
    parameters, in the module's layout (a leading batch dim with batch_first)."""
    at = user_source_line()
    query, key, value = lift(query), lift(key), lift(value)
    heads, e = mha.num_heads, mha.embed_dim
    batched = attention_inputs_batched(query, key, value, key_padding_mask, attn_mask, heads, at)
    batch_first = mha.batch_first and batched
    if not batched:  # torch: a batch of one along dim 1
        query, key, value = (F.unsqueeze(t, 1) for t in (query, key, value))
        key_padding_mask = None if key_padding_mask is None else F.unsqueeze(lift(key_padding_mask), 0)
    seq_dim = 1 if batch_first else 0
    tgt_len, src_len, bsz = query.shape[seq_dim], key.shape[seq_dim], query.shape[1 - seq_dim]
    if query.shape[-1] != e:
        raise ShapeError(f"{at}: was expecting embedding dimension of {e}, but got {query.shape[-1]}")
    if key.shape[1 - seq_dim] != bsz or value.shape[:2] != key.shape[:2]:
        raise ShapeError(f"{at}: key {key.type} and value {value.type} do not fit query {query.type}")
    if mha._qkv_same_embed_dim and key.shape != value.shape:
        raise ShapeError(f"{at}: key shape {list(key.shape)} does not match value shape {list(value.shape)}")
    q, k, v = in_projection(mha, query, key, value)
    q, k, v = (heads_first(t, heads, batch_first) for t in (q, k, v))
    mask = merged_mask(attn_mask, key_padding_mask, bsz, heads, tgt_len, src_len, batched, at)
    if is_causal and attn_mask is None:
        raise RuntimeError(
            f"{at}: Need attn_mask if specifying the is_causal hint. You may use the Transformer module method "
            "`generate_square_subsequent_mask` to create this mask."
        )
    causal = bool(is_causal) and key_padding_mask is None and not need_weights
    if causal:  # torch: the hint replaces the mask when no weights are asked for
        mask = None
    dropout_p = mha.dropout if mha.training else 0.0
    if need_weights:
        scores = F.matmul(q, F.transpose(k, -2, -1)) * (1.0 / math.sqrt(mha.head_dim))
        if mask is not None:
            scores = scores + mask
        weights = F.dropout(F.softmax(scores, -1), dropout_p)
        out = F.matmul(weights, v)
        if average_attn_weights:
            weights = F.mean(weights, 1)
        if not batched:
            weights = F.squeeze(weights, 0)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
        weights = None
    out = F.permute(out, (0, 2, 1, 3) if batch_first else (2, 0, 1, 3))
    out = mha.out_proj(F.reshape(out, (*out.shape[:2], e)))
    return (F.squeeze(out, 1) if not batched else out), weights


def attention_inputs_batched(query, key, value, key_padding_mask, attn_mask, heads: int, at: str) -> bool:
    """Whether the inputs are batched (3-D), checking the ranks as torch's _mha_shape_check."""
    if query.ndim == 3:
        if key.ndim != 3 or value.ndim != 3:
            raise ShapeError(
                f"{at}: For batched (3-D) `query`, expected `key` and `value` to be 3-D but found {key.ndim}-D "
                f"and {value.ndim}-D tensors respectively"
            )
        if key_padding_mask is not None and lift(key_padding_mask).ndim != 2:
            raise ShapeError(f"{at}: For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D")
        if attn_mask is not None and lift(attn_mask).ndim not in (2, 3):
            raise ShapeError(f"{at}: For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D")
        return True
    if query.ndim == 2:
        if key.ndim != 2 or value.ndim != 2:
            raise ShapeError(
                f"{at}: For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found {key.ndim}-D "
                f"and {value.ndim}-D tensors respectively"
            )
        if key_padding_mask is not None and lift(key_padding_mask).ndim != 1:
            raise ShapeError(f"{at}: For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D")
        if attn_mask is not None and lift(attn_mask).ndim not in (2, 3):
            raise ShapeError(f"{at}: For unbatched (2-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D")
        return False
    raise ShapeError(
        f"{at}: query should be unbatched 2D or batched 3D tensor but received {query.ndim}-D query tensor"
    )


def in_projection(mha: MultiheadAttention, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v projected as torch's _in_projection_packed (one matmul for self-attention, two when
    key is value) or _in_projection (separate weights)."""
    e = mha.embed_dim
    b = mha.in_proj_bias
    biases = (None, None, None) if b is None else (b[:e], b[e : 2 * e], b[2 * e :])
    if not mha._qkv_same_embed_dim:
        weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        return tuple(F.linear(x, w, bb) for x, w, bb in zip((query, key, value), weights, biases, strict=True))
    w = mha.in_proj_weight
    if key is value:
        if query is key:  # self-attention: one product for q, k and v
            proj = F.linear(query, w, b)
            return proj[..., :e], proj[..., e : 2 * e], proj[..., 2 * e :]
        kv = F.linear(key, w[e:], None if b is None else b[e:])
        return F.linear(query, w[:e], biases[0]), kv[..., :e], kv[..., e:]
    return tuple(
        F.linear(x, w[i * e : (i + 1) * e], biases[i]) for i, x in enumerate((query, key, value))
    )  # fmt: skip


def heads_first(x: Tensor, heads: int, batch_first: bool) -> Tensor:
    """[L, N, E] (batch_first: [N, L, E]) as [N, heads, L, E / heads]."""
    split = F.reshape(x, (*x.shape[:2], heads, x.shape[-1] // heads))
    return F.permute(split, (0, 2, 1, 3) if batch_first else (1, 2, 0, 3))


def merged_mask(attn_mask, key_padding_mask, bsz, heads, tgt_len, src_len, batched, at) -> Tensor | None:
    """attn_mask ([L, S], or [N·heads, L, S]; unbatched [heads, L, S]) plus key_padding_mask
    ([N, S]), both additive, broadcastable to the scores [N, heads, L, S]; None without either."""
    mask = additive_mask(attn_mask, "attn_mask")
    if mask is not None:
        if mask.ndim == 2:
            if mask.shape != (tgt_len, src_len):
                raise ShapeError(
                    f"{at}: The shape of the 2D attn_mask is {list(mask.shape)}, but should be {[tgt_len, src_len]}."
                )
            mask = F.reshape(mask, (1, 1, tgt_len, src_len))
        else:
            expected = (bsz * heads if batched else heads, tgt_len, src_len)
            if mask.shape != expected:
                raise ShapeError(
                    f"{at}: The shape of the 3D attn_mask is {list(mask.shape)}, but should be {list(expected)}."
                )
            mask = F.reshape(mask, (bsz, heads, tgt_len, src_len))
    padding = additive_mask(key_padding_mask, "key_padding_mask")
    if padding is not None:
        if padding.shape != (bsz, src_len):
            raise ShapeError(
                f"{at}: expecting key_padding_mask shape of {[bsz, src_len]}, but got {list(padding.shape)}"
            )
        padding = F.reshape(padding, (bsz, 1, 1, src_len))
        mask = padding if mask is None else mask + padding
    return mask


# ---------------------------------------------------------------------------------------------
# The Transformer encoder


def activation_function(activation) -> Callable[[Tensor], Tensor]:
    """torch's _get_activation_fn: "relu", "gelu", or a callable (a function or a Module)."""
    if isinstance(activation, str):
        if activation == "relu":
            return F.relu
        if activation == "gelu":
            return F.gelu
        raise RuntimeError(f"{user_source_line()}: activation should be relu/gelu, not {activation}")
    if not callable(activation):
        raise TypeError(f"{user_source_line()}: activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    return activation


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention and a feed-forward block, each with a
    residual connection and a LayerNorm (after it, or before with norm_first); submodules
    self_attn, linear1, dropout, linear2, norm1, norm2, dropout1, dropout2."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = F.relu,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = activation_function(activation)

    def forward(self, src: Tensor, src_mask=None, src_key_padding_mask=None, is_causal: bool = False) -> Tensor:
        x = lift(src)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        out = self.self_attn(
            x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, need_weights=False, is_causal=is_causal
        )[0]
        return self.dropout1(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder: `num_layers` deep copies of `encoder_layer` (layers.0, …),
    then `norm` if given. A mask is used as given (is_causal=None is not inferred from its values,
    which are only known when the step runs; pass is_causal=True to use the causal kernel)."""

    def __init__(
        self,
        encoder_layer: TransformerEncoderLayer,
        num_layers: int,
        norm: Module | None = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ) -> None:
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = int(num_layers)
        self.norm = norm
        self.enable_nested_tensor, self.mask_check = enable_nested_tensor, mask_check

    def forward(self, src: Tensor, mask=None, src_key_padding_mask=None, is_causal: bool | None = None) -> Tensor:
        out = lift(src)
        for layer in self.layers:
            out = layer(out, src_mask=mask, is_causal=bool(is_causal), src_key_padding_mask=src_key_padding_mask)
        return self.norm(out) if self.norm is not None else out


class TransformerDecoderLayer(Module):
    """torch.nn.TransformerDecoderLayer: self-attention, attention over the encoder's memory and a
    feed-forward block, each with a residual connection and a LayerNorm (after it, or before with
    norm_first); submodules self_attn, multihead_attn, linear1, dropout, linear2, norm1, norm2,
    norm3, dropout1, dropout2, dropout3."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = F.relu,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = activation_function(activation)

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> Tensor:
        x, memory = lift(tgt), lift(memory)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff_block(x))

    def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        out = self.self_attn(
            x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask, is_causal=is_causal, need_weights=False
        )[0]
        return self.dropout1(out)

    def _mha_block(self, x: Tensor, memory: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        out = self.multihead_attn(
            x,
            memory,
            memory,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            is_causal=is_causal,
            need_weights=False,
        )[0]
        return self.dropout2(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout3(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerDecoder(Module):
    """torch.nn.TransformerDecoder: `num_layers` deep copies of `decoder_layer` (layers.0, …),
    then `norm` if given (a mask is used as given, as TransformerEncoder's)."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(decoder_layer) for _ in range(num_layers)])
        self.num_layers = int(num_layers)
        self.norm = norm

    def forward(
        self,
        tgt: Tensor,
        memory: Tensor,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> Tensor:
        out = lift(tgt)
        for layer in self.layers:
            out = layer(
                out,
                memory,
                tgt_mask=tgt_mask,
                memory_mask=memory_mask,
                tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask,
                tgt_is_causal=bool(tgt_is_causal),
                memory_is_causal=memory_is_causal,
            )
        return self.norm(out) if self.norm is not None else out


class Transformer(Module):
    """torch.nn.Transformer: a TransformerEncoder and a TransformerDecoder, each ending in a
    LayerNorm (or custom_encoder / custom_decoder); every parameter of more than one dim
    re-initialised xavier_uniform_, as torch's _reset_parameters."""

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = F.relu,
        custom_encoder: Module | None = None,
        custom_decoder: Module | None = None,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        layer_args = (
            d_model,
            nhead,
            dim_feedforward,
            dropout,
            activation,
            layer_norm_eps,
            batch_first,
            norm_first,
            bias,
        )
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
            self.encoder = TransformerEncoder(TransformerEncoderLayer(*layer_args), num_encoder_layers, norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
            self.decoder = TransformerDecoder(TransformerDecoderLayer(*layer_args), num_decoder_layers, norm)
        self._reset_parameters()
        self.d_model, self.nhead, self.batch_first = int(d_model), int(nhead), bool(batch_first)

    def _reset_parameters(self) -> None:
        """torch's: xavier_uniform_ on every parameter of more than one dim."""
        for param in self.parameters():
            if param.ndim > 1:
                init.xavier_uniform_(param)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask=None,
        tgt_mask=None,
        memory_mask=None,
        src_key_padding_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> Tensor:
        src, tgt = lift(src), lift(tgt)
        at = user_source_line()
        batch_dim = 0 if self.batch_first else 1
        if src.ndim == 3 and src.shape[batch_dim] != tgt.shape[batch_dim]:
            raise RuntimeError(f"{at}: the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError(f"{at}: the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal)
        return self.decoder(
            tgt,
            memory,
            tgt_mask=tgt_mask,
            memory_mask=memory_mask,
            tgt_key_padding_mask=tgt_key_padding_mask,
            memory_key_padding_mask=memory_key_padding_mask,
            tgt_is_causal=tgt_is_causal,
            memory_is_causal=memory_is_causal,
        )

    @staticmethod
    def generate_square_subsequent_mask(sz: int):
        """[sz, sz], −inf above the diagonal and 0 elsewhere (torch's): inside a traced forward a
        Tensor computed on the GPU; outside, a float32 numpy array, to feed as an input."""
        if is_tracing():
            return F.where(F.causal_mask(int(sz)) < 0.0, -math.inf, 0.0)
        return np.triu(np.full((int(sz), int(sz)), -np.inf, np.float32), 1)
