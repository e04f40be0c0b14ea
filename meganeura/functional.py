"""Functional ops with PyTorch's names and semantics (`import meganeura.functional as F`).

The primitive operations on tensors (elementwise functions, reshape, sum, softmax, matmul,
indexing, cat…) are defined once in `meganeura/tensor.py` and re-exported here; this module adds
the composite functions PyTorch keeps in torch.nn.functional, built on them: normalisations,
losses, embedding, attention, rotary embeddings, convolutions, pooling. Python numbers are
lifted to constants.

>>> # inside forward(): F.relu(F.linear(x, self.weight, self.bias))
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from meganeura.ir.op import ShapeError
from meganeura.ir.ops.image import conv_output_size, pair
from meganeura.ir.trace import user_source_line
from meganeura.parameter import Buffer
from meganeura.pytorch_names import missing_names
from meganeura.tensor import (  # noqa: F401  (re-exported: the primitive operations; erf, rsqrt, tanh are
    # among the elementwise functions generated from ir/functions.py)
    ELEMENTWISE,
    Tensor,
    amax,
    apply,
    apply_results,
    broadcast_to,
    cat,
    clamp,
    clip,
    erf,
    expand,
    flatten,
    getitem,
    leaky_relu,
    lift,
    log_softmax,
    masked_fill,
    matmul,
    mean,
    one_hot,
    permute,
    pow,
    random_tensor,
    reciprocal,
    reshape,
    round,
    rsqrt,
    sign,
    softmax,
    softplus,
    square,
    squeeze,
    sum,
    tanh,
    transpose,
    transpose2d,
    unsqueeze,
    where,
)

globals().update(ELEMENTWISE)  # exp, log, relu, sigmoid, tanh, silu, erf, abs, add, greater, … (ir/functions.py)

COMPOSITES = [
    "gelu", "linear", "rms_norm", "layer_norm", "nll_loss", "cross_entropy", "mse_loss", "embedding", "causal_mask",
    "scaled_dot_product_attention", "rotary_embedding", "apply_rotary_pos_emb", "rotary_tables",
    "conv2d", "fold", "unfold", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "batch_norm", "group_norm",
    "dropout", "dropout1d", "dropout2d",
    "elu", "selu", "celu", "hardtanh", "relu6", "hardsigmoid", "hardswish", "mish", "softsign", "logsigmoid",
]  # fmt: skip
PRIMITIVES = [
    "amax", "broadcast_to", "cat", "clamp", "clip", "expand", "flatten", "getitem", "leaky_relu", "log_softmax",
    "masked_fill", "matmul", "mean", "permute", "pow", "reshape", "softmax", "softplus", "squeeze", "sum",
    "transpose", "transpose2d", "unsqueeze", "where", "reciprocal", "round", "sign", "square",
]  # fmt: skip
SELECTION = ["one_hot"]
__all__ = sorted([*COMPOSITES, *PRIMITIVES, *ELEMENTWISE, *SELECTION])


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x·Φ(x), elementwise, with PyTorch's two definitions (torch.nn.functional.gelu):
    approximate="none": x·½·(1 + erf(x/√2)); approximate="tanh": x·½·(1 + tanh(√(2/π)·(x + 0.044715·x³))).

    Traced as that expression of elementwise ops, so the pointwise rules fuse it (and its
    gradient, which autodiff derives from the same ops) into one kernel.
    """
    x = lift(x)
    if approximate == "none":
        inner = erf(x * (1.0 / math.sqrt(2.0)))
    elif approximate == "tanh":
        inner = tanh((x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi))
    else:
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return x * 0.5 * (inner + 1.0)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x·weightᵀ + bias, with PyTorch's layout: weight [out, in], bias [out]."""
    y = matmul(x, transpose2d(weight))
    if bias is not None:
        y = y + bias
    return y


def check_class_scores(name: str, scores: Tensor, target: Tensor, what: str) -> None:
    """Scores [batch, classes] (f32) and i32 class indices [batch], or a ShapeError naming the user's line."""
    if scores.ndim != 2 or scores.dtype != "f32":
        raise ShapeError(f"{user_source_line()}: {name}: expected f32 {what} [batch, classes], got {scores.type}")
    if target.dtype != "i32" or target.shape != scores.shape[:1]:
        raise ShapeError(
            f"{user_source_line()}: {name}: expected i32 class labels [{scores.shape[0]}] for {what} "
            f"{scores.type}, got {target.type}"
        )


def rms_norm(x: Tensor, normalized_shape, weight: Tensor | None = None, eps: float | None = None) -> Tensor:
    """x / √(mean(x²) + eps) over the trailing `normalized_shape` dims, times `weight` (torch's
    F.rms_norm; eps=None means torch.finfo(float32).eps).

    Traced decomposed, x · rsqrt(mean(x², dims) + eps) · weight, so that the e-graph can fuse it:
    the row scale into one reduction kernel, the products into the next matmul's operand load.
    """
    x = lift(x)
    shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(d) for d in normalized_shape)
    if not shape or len(shape) > x.ndim or x.shape[x.ndim - len(shape) :] != shape:
        raise ShapeError(f"{user_source_line()}: rms_norm: normalized_shape {list(shape)} does not end {x.type}")
    weight = None if weight is None else lift(weight)
    if weight is not None and weight.shape != shape:
        raise ShapeError(f"{user_source_line()}: rms_norm: weight {weight.type} does not match {list(shape)}")
    eps = float(np.finfo(np.float32).eps) if eps is None else float(eps)
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    y = x * rsqrt(mean(x * x, dims, keepdim=True) + eps)
    return y if weight is None else y * weight


def layer_norm(
    x: Tensor, normalized_shape, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """(x − mean) / √(var + eps) · weight + bias over the trailing `normalized_shape` dims, with the
    biased variance (torch.nn.functional.layer_norm).

    Traced decomposed, like `rms_norm`: the mean, the centred x, its mean square, rsqrt.
    """
    x = lift(x)
    shape = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(d) for d in normalized_shape)
    if not shape or len(shape) > x.ndim or x.shape[x.ndim - len(shape) :] != shape:
        raise ShapeError(f"{user_source_line()}: layer_norm: normalized_shape {list(shape)} does not end {x.type}")
    weight = None if weight is None else lift(weight)
    bias = None if bias is None else lift(bias)
    for name, value in (("weight", weight), ("bias", bias)):
        if value is not None and value.shape != shape:
            raise ShapeError(f"{user_source_line()}: layer_norm: {name} {value.type} does not match {list(shape)}")
    dims = tuple(range(x.ndim - len(shape), x.ndim))
    centred = x - mean(x, dims, keepdim=True)
    y = centred * rsqrt(mean(centred * centred, dims, keepdim=True) + float(eps))
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def nll_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of log-probabilities [batch, classes] at i32 class indices [batch],
    like torch.nn.functional.nll_loss: −input[i, target[i]], then reduced.

    reduction is "mean" (over the batch, PyTorch's default), "sum" or "none".
    """
    input, target = lift(input), lift(target)
    check_class_scores("nll_loss", input, target, "log-probabilities")
    rows = -apply("pick", input, target)
    return reduce_loss(rows, reduction, "nll_loss")


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Softmax cross-entropy of logits [batch, classes] with i32 class indices [batch]:
    nll_loss(log_softmax(logits, 1), target), traced as written (the e-graph's reductions rules
    turn it, and its gradient, into the fused cross_entropy_rows kernels).

    reduction is "mean" (PyTorch's default), "sum" or "none".
    """
    logits, target = lift(logits), lift(target)
    check_class_scores("cross_entropy", logits, target, "logits")
    return nll_loss(log_softmax(logits, 1), target, reduction)


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean squared error, like torch.nn.functional.mse_loss."""
    input, target = lift(input), lift(target)
    if input.shape != target.shape:
        raise ShapeError(f"{user_source_line()}: mse_loss: input {input.type} and target {target.type} differ in shape")
    diff = input - target
    return reduce_loss(diff * diff, reduction, "mse_loss")


def reduce_loss(values: Tensor, reduction: str, name: str) -> Tensor:
    if reduction == "mean":
        return mean(values)
    if reduction == "sum":
        return sum(values)
    if reduction == "none":
        return values
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def embedding(input: Tensor, weight: Tensor) -> Tensor:
    """Rows of `weight` [num_embeddings, embedding_dim] at i32 indices `input` of any shape:
    the result is [*input.shape, embedding_dim] (torch.nn.functional.embedding). The gradient is
    a scatter-add of the incoming rows into [num_embeddings, embedding_dim]."""
    input, weight = lift(input), lift(weight)
    if input.dtype != "i32":
        raise ShapeError(f"{user_source_line()}: embedding: expected i32 indices, got {input.type}")
    return apply("gather", weight, input)


def causal_mask(rows: int, cols: int | None = None) -> Tensor:
    """An additive causal mask, f32 [rows, cols] (cols defaults to rows): 0 where key j ≤ query i,
    a large negative number (−1e9) above the diagonal, as a hand-written
    `softmax(q @ k.transpose(-2, -1) * scale + mn.causal_mask(seq)) @ v` adds it. Computed on the
    GPU (no input to feed); the e-graph recognises that pattern as fused causal attention."""
    cols = rows if cols is None else cols
    return apply("causal_mask", rows=int(rows), cols=int(cols))


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """softmax(query·keyᵀ·scale [+ causal mask])·value, with PyTorch's signature and layout:
    query [batch, heads, seq_q, head_dim], key and value [batch, kv_heads, seq_kv, head_dim].

    One fused op (`attention`): the forward kernel runs an online softmax and never writes the
    scores; the backward recomputes them from the row log-sum-exp. scale=None means
    1/√head_dim; is_causal hides key j > query i (top-left aligned, as torch). With
    enable_gqa=True, kv_heads may divide heads (grouped-query attention). With dropout_p > 0
    (applied whatever the training mode, as PyTorch) it is traced unfused instead
    (`attention_with_dropout`): the fused attention kernels draw no dropout. Not supported:
    attn_mask tensors (NotImplementedError).
    """
    query, key, value = lift(query), lift(key), lift(value)
    at = user_source_line()
    if attn_mask is not None:
        raise NotImplementedError(f"{at}: scaled_dot_product_attention: attn_mask is not supported; use is_causal")
    dropout_p = dropout_probability(dropout_p, "scaled_dot_product_attention: dropout_p")
    if query.ndim != 4 or key.ndim != 4 or value.ndim != 4:
        raise ShapeError(
            f"{at}: scaled_dot_product_attention: expected 4-D query, key and value "
            f"[batch, heads, seq, head_dim], got {query.type}, {key.type} and {value.type}"
        )
    if value.shape != key.shape:
        raise ShapeError(f"{at}: scaled_dot_product_attention: value {value.type} must match key {key.type}")
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads and not enable_gqa:
        raise ShapeError(
            f"{at}: scaled_dot_product_attention: query has {heads} heads and key/value {kv_heads}; "
            "pass enable_gqa=True for grouped-query attention"
        )
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    if dropout_p > 0.0:
        return attention_with_dropout(query, key, value, bool(is_causal), scale, dropout_p)
    out, _ = apply_results("attention", query, key, value, causal=bool(is_causal), scale=scale)
    return out


def attention_with_dropout(query: Tensor, key: Tensor, value: Tensor, causal: bool, scale: float, p: float) -> Tensor:
    """dropout(softmax(query·keyᵀ·scale [+ causal mask]), p)·value, traced unfused (PyTorch's
    reference formula): the scores are materialised, the dropout mask fuses into the kernels around
    them by the e-graph. Key and value heads are repeated for grouped-query attention (each kv
    head serves heads // kv_heads consecutive query heads, as torch's enable_gqa)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads:
        if heads % kv_heads:
            raise ShapeError(
                f"{user_source_line()}: scaled_dot_product_attention: {heads} query heads do not divide into "
                f"{kv_heads} key/value heads"
            )
        group = heads // kv_heads
        batch, _, seq, dim = key.shape
        key, value = (
            reshape(broadcast_to(reshape(t, (batch, kv_heads, 1, seq, dim)), (batch, kv_heads, group, seq, dim)),
                    (batch, heads, seq, dim))
            for t in (key, value)
        )  # fmt: skip
    scores = matmul(query, transpose(key, -2, -1)) * scale
    if causal:
        scores = scores + causal_mask(query.shape[-2], key.shape[-2])
    return matmul(dropout(softmax(scores, -1), p), value)


def dropout_probability(p, name: str) -> float:
    """`p` as a float in [0, 1], or PyTorch's ValueError."""
    if not isinstance(p, (int, float, np.integer, np.floating)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{user_source_line()}: {name} probability has to be between 0 and 1, but got {p}")
    return float(p)


def dropout_mask(shape: tuple[int, ...], p: float) -> Tensor:
    """1/(1−p) where a uniform draw is ≥ p (probability 1 − p), else 0, of `shape` (0 < p < 1): the
    factor PyTorch multiplies by, its scale an f32 quotient as torch's `noise.div_(1 - p)`."""
    keep = random_tensor(shape, normal=False) >= p
    return keep * float(np.float32(1.0) / np.float32(1.0 - p))


def dropped(input: Tensor, p: float, training: bool, mask_shape: tuple[int, ...] | None = None) -> Tensor:
    """input with dropout's mask (of `mask_shape`, broadcast; input's shape by default) applied."""
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return input * 0.0  # as PyTorch: zeros, NaN where input is ±inf or NaN
    return input * dropout_mask(input.shape if mask_shape is None else mask_shape, p)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """torch.nn.functional.dropout: each element zeroed with probability p, the others scaled by
    1/(1−p), a fresh mask every step; the identity when not training (or p = 0), zeros for p = 1.
    The gradient is the same mask times the scale. inplace=True returns the result as a new
    traced value (a traced input is never changed in place)."""
    p = dropout_probability(p, "dropout")
    return dropped(lift(input), p, bool(training))


def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """torch.nn.functional.dropout1d: whole channels zeroed, input [N, C, L] or [C, L] (one draw
    per channel, scaled by 1/(1−p)); see `dropout`."""
    p = dropout_probability(p, "dropout")
    input = lift(input)
    if input.ndim not in (2, 3):
        raise ShapeError(
            f"{user_source_line()}: dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input"
        )
    return dropped(input, p, bool(training), input.shape[:-1] + (1,))


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """torch.nn.functional.dropout2d: whole channels zeroed, input [N, C, H, W] or [C, H, W]…, as
    PyTorch reads them: a 3-D input as [N, C, L] (with its warning), a 2-D one elementwise (with
    its deprecation warning); see `dropout`."""
    p = dropout_probability(p, "dropout")
    input = lift(input)
    if input.ndim == 3:
        warnings.warn(
            "dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D dropout behavior is "
            "desired - input is interpreted as shape (N, C, L), where C is the channel dim (as PyTorch)",
            stacklevel=2,
        )
        return dropped(input, p, bool(training), input.shape[:2] + (1,))
    if input.ndim == 4:
        return dropped(input, p, bool(training), input.shape[:2] + (1, 1))
    if input.ndim == 2:
        warnings.warn(
            "dropout2d: Received a 2-D input to dropout2d, which is deprecated (as in PyTorch, each element is "
            "dropped on its own): use dropout instead",
            stacklevel=2,
        )
        return dropped(input, p, bool(training))
    raise ShapeError(f"{user_source_line()}: dropout2d: expected a 3-D or 4-D input, got {input.type}")


def rotary_embedding(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x[..., D/2:], x[..., :D/2]) (HF Llama's
    half-split RoPE): one `rope` op; cos and sin broadcast to x, e.g. [seq, D] against x
    [batch, heads, seq, D].

    >>> # q = F.rotary_embedding(q, cos, sin)  # cos, sin: inputs fed with F.rotary_tables(seq, D)
    """
    x, cos, sin = lift(x), lift(cos), lift(sin)
    return apply("rope", x, cos, sin)


def apply_rotary_pos_emb(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, unsqueeze_dim: int | None = None):
    """(q_embed, k_embed) = (rotary_embedding(q, cos, sin), rotary_embedding(k, cos, sin)), as
    HF transformers' function of that name; with unsqueeze_dim, cos and sin get a dim of size 1
    there first (HF passes [batch, seq, D] tables with unsqueeze_dim=1); without, they broadcast as given.

    >>> # q, k = F.apply_rotary_pos_emb(q, k, cos, sin)  # q [b, h, s, D], k [b, h_kv, s, D], cos [s, D]
    """
    cos, sin = lift(cos), lift(sin)
    if unsqueeze_dim is not None:
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return rotary_embedding(q, cos, sin), rotary_embedding(k, cos, sin)


def rotary_tables(seq_len: int, head_dim: int, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """float32 (cos, sin) [seq_len, head_dim] for positions 0…seq_len−1, as HF's LlamaRotaryEmbedding
    computes them (in float32): inv_freq = 1/base^(arange(0, D, 2)/D), emb = cat(freqs, freqs) of
    freqs = outer(positions, inv_freq).

    >>> # cos, sin = F.rotary_tables(128, 64); program(x=x, cos=cos, sin=sin)
    """
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"rotary_tables: head_dim must be even and positive, got {head_dim}")
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = np.float32(1.0) / np.power(np.float32(base), exponents, dtype=np.float32)
    freqs = np.outer(np.arange(seq_len, dtype=np.float32), inv_freq).astype(np.float32)
    emb = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Convolutions, traced in their plain im2col form (ir/ops/image.py): unfold, a matmul with the
# flattened weight, a reshape; the e-graph turns these compositions into implicit-GEMM kernels.


def window_geometry(op: str, kernel_size, stride, padding, dilation, at: str):
    """(kernel, stride, padding) as pairs of ints, or an error naming the user's line (dilation must be 1)."""
    try:
        if pair(dilation, f"{op}: dilation") != (1, 1):
            raise NotImplementedError(f"{at}: {op}: dilation={dilation!r} is not supported (only 1)")
        return pair(kernel_size, f"{op}: kernel_size"), pair(stride, f"{op}: stride"), pair(padding, f"{op}: padding")
    except ShapeError as error:
        raise ShapeError(f"{at}: {error}") from None


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """The sliding windows of an image batch [N, C, H, W] as columns [N, C·kh·kw, L]
    (torch.nn.functional.unfold, im2col): column l = ho·Wo + wo is the window at
    (ho·sh − ph, wo·sw − pw), row (c·kh + i)·kw + j its pixel (i, j) of channel c, 0 in the
    padding. Ints or pairs; dilation must be 1.

    >>> # cols = F.unfold(x, kernel_size=3, padding=1)  # x [8, 3, 32, 32] → [8, 27, 1024]
    """
    x = lift(input)
    kernel, stride, padding = window_geometry("unfold", kernel_size, stride, padding, dilation, user_source_line())
    return apply("unfold", x, kernel=kernel, stride=stride, padding=padding)


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Columns [N, C·kh·kw, L] summed back onto an image batch [N, C, *output_size]
    (torch.nn.functional.fold, col2im): overlapping windows add up, entries in the padding are
    dropped; the adjoint of `unfold` with the same geometry. Ints or pairs; dilation must be 1.

    >>> # image = F.fold(cols, output_size=(32, 32), kernel_size=3, padding=1)
    """
    cols = lift(input)
    at = user_source_line()
    kernel, stride, padding = window_geometry("fold", kernel_size, stride, padding, dilation, at)
    try:
        size = pair(output_size, "fold: output_size")
    except ShapeError as error:
        raise ShapeError(f"{at}: {error}") from None
    return apply("fold", cols, output_size=size, kernel=kernel, stride=stride, padding=padding)


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups=1):
    """A 2-D convolution (cross-correlation) of input [N, C, H, W] (or [C, H, W]) with weight
    [O, C, kh, kw] and an optional bias [O] (torch.nn.functional.conv2d): [N, O, Ho, Wo].
    stride and padding are ints or pairs; padding may also be "valid" (0) or "same" (stride 1
    and odd kernels only). dilation and groups must be 1.

    Traced as im2col: cols = unfold(input) [N, C·kh·kw, Ho·Wo], out = reshape(weight, [O, C·kh·kw])
    · cols (one matmul, the weight shared by the batch), reshaped to [N, O, Ho, Wo], plus
    reshape(bias, [O, 1, 1]). Its gradients are plain too: Σₙ g·colsᵀ for the weight,
    fold(weightᵀ·g) for the input.

    >>> # y = F.conv2d(x, self.weight, self.bias, stride=2, padding=1)
    """
    x, weight = lift(input), lift(weight)
    at = user_source_line()
    if groups != 1:
        raise NotImplementedError(f"{at}: conv2d: groups={groups!r} is not supported (only 1)")
    if weight.ndim != 4:
        raise ShapeError(f"{at}: conv2d: expected a weight [out_channels, in_channels, kh, kw], got {weight.type}")
    out_channels, channels, kh, kw = weight.shape
    literal_padding = 0 if isinstance(padding, str) else padding
    kernel, stride, padding_pair = window_geometry("conv2d", (kh, kw), stride, literal_padding, dilation, at)
    if isinstance(padding, str):
        padding_pair = string_padding(padding, kernel, stride, at)
    unbatched = x.ndim == 3
    if unbatched:
        x = reshape(x, (1, *x.shape))
    if x.ndim != 4 or x.shape[1] != channels:
        raise ShapeError(
            f"{at}: conv2d: expected input [N, {channels}, H, W] (or [{channels}, H, W]) for weight "
            f"{weight.type}, got {lift(input).type}"
        )
    cols = apply("unfold", x, kernel=kernel, stride=stride, padding=padding_pair)
    ho, wo = conv_output_size(x.shape[2:], kernel, stride, padding_pair)
    flat = reshape(weight, (out_channels, channels * kh * kw))
    out = apply("matmul", flat, cols)
    out = reshape(out, (x.shape[0], out_channels, ho, wo))
    if bias is not None:
        bias = lift(bias)
        if bias.shape != (out_channels,):
            raise ShapeError(
                f"{at}: conv2d: expected a bias [{out_channels}] for weight {weight.type}, got {bias.type}"
            )
        out = out + reshape(bias, (out_channels, 1, 1))
    return reshape(out, out.shape[1:]) if unbatched else out


def string_padding(padding: str, kernel: tuple[int, int], stride: tuple[int, int], at: str) -> tuple[int, int]:
    """conv2d's padding="valid" (none) or "same" (the output as large as the input: stride 1, and
    odd kernels, whose padding is symmetric; PyTorch pads even kernels unevenly, which is not supported)."""
    if padding == "valid":
        return (0, 0)
    if padding != "same":
        raise ValueError(f"{at}: conv2d: padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
    if stride != (1, 1):
        raise ValueError(f"{at}: conv2d: padding='same' is not supported for strided convolutions")
    if kernel[0] % 2 == 0 or kernel[1] % 2 == 0:
        raise NotImplementedError(
            f"{at}: conv2d: padding='same' with the even kernel {kernel} needs uneven padding, which is not "
            "supported; pad explicitly"
        )
    return ((kernel[0] - 1) // 2, (kernel[1] - 1) // 2)


# ---------------------------------------------------------------------------------------------
# Pooling and normalisation of images (NCHW). max_pool2d and avg_pool2d are ops of their own
# (ir/ops/image.py); adaptive_avg_pool2d to 1×1, batch_norm and group_norm are traced decomposed
# (means, rsqrt, products), so autodiff derives their exact backward from the same ops.


def pool2d(op: str, input: Tensor, kernel_size, stride, padding) -> Tensor:
    """`op` on [N, C, H, W] or [C, H, W] (PyTorch's unbatched form, traced as a batch of one)."""
    x = lift(input)
    at = user_source_line()
    if x.ndim not in (3, 4):
        raise ShapeError(f"{at}: {op}: expected [N, C, H, W] or [C, H, W], got {x.type}")
    try:
        kernel = pair(kernel_size, f"{op} kernel_size")
        strides = kernel if stride is None or stride == [] else pair(stride, f"{op} stride")
        pads = pair(padding, f"{op} padding")
    except ShapeError as error:
        raise ShapeError(f"{at}: {error}") from None
    unbatched = x.ndim == 3
    if unbatched:
        x = reshape(x, (1, *x.shape))
    out = apply(op, x, kernel=kernel, stride=strides, padding=pads)
    return reshape(out, out.shape[1:]) if unbatched else out


def max_pool2d(
    input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices=False
) -> Tensor:
    """The maximum over each kh×kw window (torch.nn.functional.max_pool2d): stride defaults to the
    kernel size, the padding (at most half the kernel) counts as −inf. The gradient goes to the
    first maximum of each window in scan order. dilation, ceil_mode and return_indices are not
    supported beyond their defaults.

    >>> # y = F.max_pool2d(x, 2)  # x [8, 16, 32, 32] → [8, 16, 16, 16]
    """
    if dilation not in (1, (1, 1)) or ceil_mode or return_indices:
        raise NotImplementedError(
            f"{user_source_line()}: max_pool2d: dilation, ceil_mode and return_indices are not supported"
        )
    return pool2d("max_pool2d", input, kernel_size, stride, padding)


def avg_pool2d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override=None,
) -> Tensor:
    """The mean over each kh×kw window (torch.nn.functional.avg_pool2d with its defaults: the zero
    padding counts, the divisor is kh·kw); stride defaults to the kernel size.

    >>> # y = F.avg_pool2d(x, 3, stride=2, padding=1)
    """
    if ceil_mode or not count_include_pad or divisor_override is not None:
        raise NotImplementedError(
            f"{user_source_line()}: avg_pool2d: only ceil_mode=False, count_include_pad=True and no "
            "divisor_override are supported"
        )
    return pool2d("avg_pool2d", input, kernel_size, stride, padding)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool2d for output_size 1 or (1, 1) only: the mean over H
    and W, keeping them as dims of size 1 ([N, C, H, W] → [N, C, 1, 1]).

    >>> # features = F.flatten(F.adaptive_avg_pool2d(x, 1), 1)  # [N, C]
    """
    x = lift(input)
    if output_size not in (1, (1, 1), [1, 1]):
        raise NotImplementedError(
            f"{user_source_line()}: adaptive_avg_pool2d: only output_size 1 or (1, 1) (global average "
            f"pooling) is supported, got {output_size!r}"
        )
    if x.ndim not in (3, 4):
        raise ShapeError(f"{user_source_line()}: adaptive_avg_pool2d: expected [N, C, H, W] or [C, H, W], got {x.type}")
    return mean(x, (-2, -1), keepdim=True)


def channel_view(value: Tensor, rank: int) -> Tensor:
    """A per-channel [C] value shaped [C, 1, …] to broadcast against [N, C, *] of `rank` dims."""
    return reshape(value, (value.shape[0],) + (1,) * (rank - 2))


def batch_norm(
    input: Tensor,
    running_mean,
    running_var,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum=0.1,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.batch_norm over [N, C, *]: per channel, over N and the trailing dims.

    training=True: normalise with the batch mean and the biased batch variance; when running
    statistics are given (nn.Buffers of a module) they are updated on the device at the end of the
    step, running ← (1 − momentum)·running + momentum·batch, with the unbiased variance (n/(n−1)).
    `momentum` may also be a traced scalar (BatchNorm's cumulative average, momentum=None).
    training=False: normalise with running_mean and running_var.
    """
    x = lift(input)
    at = user_source_line()
    if x.ndim < 2:
        raise ShapeError(f"{at}: batch_norm: expected [N, C, *], got {x.type}")
    channels = x.shape[1]
    per_channel = {"running_mean": running_mean, "running_var": running_var, "weight": weight, "bias": bias}
    for name, value in per_channel.items():
        if value is not None and lift(value).shape != (channels,):
            raise ShapeError(f"{at}: batch_norm: {name} {lift(value).type} does not match the {channels} channels")
    axes = (0, *range(2, x.ndim))
    if training:
        count = x.numel() // channels
        if count <= 1:
            raise ValueError(f"{at}: batch_norm: expected more than 1 value per channel when training, got {x.type}")
        batch_mean = mean(x, axes, keepdim=True)
        centred = x - batch_mean
        batch_var = mean(centred * centred, axes, keepdim=True)
        y = centred * rsqrt(batch_var + float(eps))
        for running, value, scale in ((running_mean, batch_mean, 1.0), (running_var, batch_var, count / (count - 1))):
            if running is None:
                continue
            if not isinstance(running, Buffer):
                raise TypeError(f"{at}: batch_norm: running statistics updated in training must be module buffers")
            stat = reshape(value, (channels,))
            stat = stat * scale if scale != 1.0 else stat
            running.update(lift(running) * (1.0 - momentum) + stat * momentum)
    else:
        if running_mean is None or running_var is None:
            raise ValueError(f"{at}: batch_norm: training=False needs running_mean and running_var")
        rank = x.ndim
        y = (x - channel_view(lift(running_mean), rank)) * channel_view(rsqrt(lift(running_var) + float(eps)), rank)
    if weight is not None:
        y = y * channel_view(lift(weight), x.ndim)
    return y if bias is None else y + channel_view(lift(bias), x.ndim)


def group_norm(
    input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> Tensor:
    """torch.nn.functional.group_norm over [N, C, *]: the channels split into `num_groups` groups,
    each (sample, group) normalised with its mean and biased variance, then a per-channel affine.
    Traced as a reshape to [N, G, C/G·…], the statistics over the last dim, and a reshape back."""
    x = lift(input)
    at = user_source_line()
    if x.ndim < 2 or num_groups < 1 or x.shape[1] % num_groups:
        raise ShapeError(f"{at}: group_norm: {x.type} does not split into {num_groups} groups of channels")
    channels = x.shape[1]
    for name, value in (("weight", weight), ("bias", bias)):
        if value is not None and lift(value).shape != (channels,):
            raise ShapeError(f"{at}: group_norm: {name} {lift(value).type} does not match the {channels} channels")
    grouped = reshape(x, (x.shape[0], num_groups, -1))
    centred = grouped - mean(grouped, -1, keepdim=True)
    y = reshape(centred * rsqrt(mean(centred * centred, -1, keepdim=True) + float(eps)), x.shape)
    if weight is not None:
        y = y * channel_view(lift(weight), x.ndim)
    return y if bias is None else y + channel_view(lift(bias), x.ndim)


# ---------------------------------------------------------------------------------------------
# Activations of torch.nn.functional (issue 40). The ones whose values or gradients differ from
# any composition of the ops at NaN, at ±∞ or at a kink are functions of ir/functions.py (elu,
# hardtanh, hardsigmoid, hardswish); the others are traced as compositions, which give PyTorch's
# numbers, gradients included: selu and celu (elu), relu6 (hardtanh), mish (x·tanh(softplus(x))),
# softsign (x / (1 + |x|)), logsigmoid (−softplus(−x)).


def not_in_place(name: str, inplace: bool) -> None:
    """inplace=True cannot be traced: a traced tensor is a value, never modified."""
    if inplace:
        raise NotImplementedError(f"{user_source_line()}: {name}: inplace=True is not supported (use the result)")


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x where x > 0, alpha·(eˣ − 1) elsewhere (torch.nn.functional.elu; gradient g where x is NaN)."""
    not_in_place("elu", inplace)
    return apply("elu", input, float(alpha), 1.0)


def selu(input: Tensor, inplace: bool = False) -> Tensor:
    """scale·elu(x, alpha) with PyTorch's alpha ≈ 1.6733 and scale ≈ 1.0507 (torch.nn.functional.selu)."""
    not_in_place("selu", inplace)
    return apply("elu", input, SELU_ALPHA, 1.0) * SELU_SCALE


def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    """x where x > 0, alpha·(e^(x/alpha) − 1) elsewhere (torch.nn.functional.celu)."""
    not_in_place("celu", inplace)
    if float(alpha) == 0.0:
        raise ValueError(f"{user_source_line()}: celu: alpha must not be 0 (ZeroDivisionError in PyTorch)")
    return apply("elu", input, float(alpha), 1.0 / float(alpha))


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Tensor:
    """x clamped to [min_val, max_val], NaN kept (torch.nn.functional.hardtanh): gradient 0 at and
    beyond the bounds, g between them and where x is NaN."""
    not_in_place("hardtanh", inplace)
    if float(max_val) < float(min_val):
        raise ValueError(f"{user_source_line()}: hardtanh: max_val {max_val} is below min_val {min_val}")
    return apply("hardtanh", input, float(min_val), float(max_val))


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """hardtanh(x, 0, 6) (torch.nn.functional.relu6)."""
    not_in_place("relu6", inplace)
    return apply("hardtanh", input, 0.0, 6.0)


def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """min(max(x + 3, 0), 6) / 6 (torch.nn.functional.hardsigmoid; gradient 0 where x is NaN)."""
    not_in_place("hardsigmoid", inplace)
    return apply("hardsigmoid", input)


def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """x·min(max(x + 3, 0), 6) / 6 (torch.nn.functional.hardswish)."""
    not_in_place("hardswish", inplace)
    return apply("hardswish", input)


def mish(input: Tensor, inplace: bool = False) -> Tensor:
    """x·tanh(softplus(x)) (torch.nn.functional.mish)."""
    not_in_place("mish", inplace)
    x = lift(input)
    return x * tanh(softplus(x))


def softsign(input: Tensor) -> Tensor:
    """x / (1 + |x|) (torch.nn.functional.softsign)."""
    x = lift(input)
    return x / (apply("abs", x) + 1.0)


def logsigmoid(input: Tensor) -> Tensor:
    """log(1 / (1 + e⁻ˣ)) = −softplus(−x), exact for large |x| (torch.nn.functional.logsigmoid)."""
    return -softplus(-lift(input))


__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
