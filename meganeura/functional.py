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

import numpy as np

from meganeura.ir.op import ShapeError, broadcasts_to
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
    permute,
    pow,
    reshape,
    rsqrt,
    softmax,
    softplus,
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
    "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "fold", "unfold", "max_pool1d", "max_pool2d",
    "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d",
    "adaptive_max_pool2d", "batch_norm", "group_norm",
]  # fmt: skip
PRIMITIVES = [
    "amax", "broadcast_to", "cat", "clamp", "clip", "expand", "flatten", "getitem", "leaky_relu", "log_softmax",
    "masked_fill", "matmul", "mean", "permute", "pow", "reshape", "softmax", "softplus", "squeeze", "sum",
    "transpose", "transpose2d", "unsqueeze", "where",
]  # fmt: skip
__all__ = sorted([*COMPOSITES, *PRIMITIVES, *ELEMENTWISE])


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
    """softmax(query·keyᵀ·scale + mask)·value, with PyTorch's signature and layout:
    query [batch, heads, seq_q, head_dim], key and value [batch, kv_heads, seq_kv, head_dim].
    scale=None means 1/√head_dim; is_causal hides key j > query i (top-left aligned, as torch).
    With enable_gqa=True, kv_heads may divide heads (grouped-query attention).

    attn_mask broadcasts to [batch, heads, seq_q, seq_kv]. torch tells a boolean mask (True takes
    part) from an additive float one by its dtype; meganeura has no bool tensors, so a mask that
    a comparison made (`x > 0`, `ids == pad`; also its reshapes, slices, broadcasts, and products
    and `where`s of such masks) is boolean, any other f32 tensor additive (−inf hides a key; its
    gradient flows where it is a parameter). A query row whose keys are all hidden gives zeros
    (and no gradient), as torch. Setting both attn_mask and is_causal raises, as torch's reference.
    Not supported: dropout_p > 0 (NotImplementedError).

    Without a mask, one fused op (`attention`): the forward kernel runs an online softmax and
    never writes the scores; the backward recomputes them from the row log-sum-exp. With a mask,
    traced as written (batched matmuls, the softmax of the masked scores), whose scores
    [batch, heads, seq_q, seq_kv] are a buffer: the fused kernels take no mask operand.
    """
    query, key, value = lift(query), lift(key), lift(value)
    at = user_source_line()
    if dropout_p:
        raise NotImplementedError(f"{at}: scaled_dot_product_attention: dropout_p > 0 is not supported")
    if attn_mask is not None and is_causal:
        raise RuntimeError(
            f"{at}: _scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True"
        )
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
    if attn_mask is None:
        out, _ = apply_results("attention", query, key, value, causal=bool(is_causal), scale=scale)
        return out
    return masked_attention(query, key, value, lift(attn_mask), scale, at)


COMPARISONS = frozenset({"greater", "greater_equal", "less", "less_equal", "equal", "not_equal"})
MASK_VIEWS = frozenset({"reshape", "broadcast_to", "permute", "slice", "concat"})


def is_boolean_mask(mask: Tensor) -> bool:
    """Whether `mask` is boolean for attention (`scaled_dot_product_attention`): a comparison's
    result, or a view, concatenation, product or `where` of such masks alone."""
    graph = mask.tracer.graph

    def boolean(node_id: int) -> bool:
        node = graph[node_id]
        if node.op in COMPARISONS:
            return True
        if node.op in MASK_VIEWS or node.op == "mul":
            return all(boolean(i) for i in node.inputs)
        if node.op == "where":
            return all(boolean(i) for i in node.inputs[1:])
        return False

    return boolean(mask.node)


def masked_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float, at: str) -> Tensor:
    """torch's reference attention with a mask: scores = q·kᵀ·scale + bias (bias = mask, or 0 where
    a boolean mask holds and −inf elsewhere), KV heads repeated for grouped queries, and a
    softmax that gives a row of hidden keys zeros (torch's _safe_softmax), not NaN."""
    batch, heads, seq_q, dim = query.shape
    kv_heads, seq_kv = key.shape[1], key.shape[2]
    if key.shape[0] != batch or key.shape[3] != dim or heads % kv_heads:
        raise ShapeError(
            f"{at}: scaled_dot_product_attention: key {key.type} does not fit query {query.type} (same batch and "
            f"head_dim, heads dividing {heads})"
        )
    if mask.dtype != "f32":
        raise ShapeError(
            f"{at}: scaled_dot_product_attention: attn_mask must be an f32 additive mask or a comparison's mask, "
            f"got {mask.type}"
        )
    scores_shape = (batch, heads, seq_q, seq_kv)
    if not broadcasts_to(mask.shape, scores_shape):
        raise ShapeError(
            f"{at}: scaled_dot_product_attention: attn_mask {mask.type} does not broadcast to {list(scores_shape)}"
        )
    if heads != kv_heads:  # repeat_interleave along the heads: query head h reads KV head h // (heads / kv_heads)
        repeated = (batch, kv_heads, heads // kv_heads, seq_kv, dim)
        key, value = (
            reshape(broadcast_to(reshape(t, (batch, kv_heads, 1, seq_kv, dim)), repeated), (batch, heads, seq_kv, dim))
            for t in (key, value)
        )
    bias = where(mask, 0.0, -math.inf) if is_boolean_mask(mask) else mask
    scores = apply("matmul", query, key, transpose_b=True) * scale + bias
    live = apply("not_equal", amax(scores, -1, keepdim=True), -math.inf)  # 0 where a row hides every key
    weights = softmax(where(live, scores, 0.0), -1) * live
    return apply("matmul", weights, value)


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
# flattened weight (per group, in groups), a reshape; the e-graph turns these compositions into
# implicit-GEMM kernels. A transposed convolution is the adjoint form, fold(weightᵀ·x), the same
# that autodiff makes of a convolution's input gradient, so the same rules make its kernels.


def pair_argument(value, what: str, at: str) -> tuple[int, int]:
    """An int or a pair of ints as a pair, or a ShapeError naming the user's line."""
    try:
        return pair(value, what)
    except ShapeError as error:
        raise ShapeError(f"{at}: {error}") from None


def single_argument(value, what: str, at: str) -> int:
    """An int or a 1-tuple (a 1-D function's argument, as PyTorch takes it) as an int."""
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    raise ShapeError(f"{at}: {what}: expected an int or a 1-tuple, got {value!r}")


def window_geometry(op: str, kernel_size, stride, padding, dilation, at: str):
    """(kernel, stride, padding, dilation) as pairs of ints, or an error naming the user's line."""
    names = ("kernel_size", "stride", "padding", "dilation")
    values = (kernel_size, stride, padding, dilation)
    return tuple(pair_argument(value, f"{op}: {name}", at) for name, value in zip(names, values, strict=True))


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """The sliding windows of an image batch [N, C, H, W] as columns [N, C·kh·kw, L]
    (torch.nn.functional.unfold, im2col): column l = ho·Wo + wo is the window at
    (ho·sh − ph, wo·sw − pw), row (c·kh + i)·kw + j its pixel (i·dh, j·dw) of channel c, 0 in the
    padding. Ints or pairs.

    >>> # cols = F.unfold(x, kernel_size=3, padding=1)  # x [8, 3, 32, 32] → [8, 27, 1024]
    """
    x = lift(input)
    kernel, stride, padding, dilation = window_geometry(
        "unfold", kernel_size, stride, padding, dilation, user_source_line()
    )
    return apply("unfold", x, kernel=kernel, stride=stride, padding=padding, dilation=dilation)


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """Columns [N, C·kh·kw, L] summed back onto an image batch [N, C, *output_size]
    (torch.nn.functional.fold, col2im): overlapping windows add up, entries in the padding are
    dropped; the adjoint of `unfold` with the same geometry. Ints or pairs.

    >>> # image = F.fold(cols, output_size=(32, 32), kernel_size=3, padding=1)
    """
    cols = lift(input)
    at = user_source_line()
    kernel, stride, padding, dilation = window_geometry("fold", kernel_size, stride, padding, dilation, at)
    size = pair_argument(output_size, "fold: output_size", at)
    return apply("fold", cols, output_size=size, kernel=kernel, stride=stride, padding=padding, dilation=dilation)


def group_count(op: str, groups, filters: int, at: str) -> int:
    """`groups` checked as torch checks it: a positive int dividing the weight's filters."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{at}: {op}: non-positive groups is not supported, got {groups!r}")
    if filters % groups:
        raise ShapeError(
            f"{at}: {op}: Given groups={groups}, expected weight to be divisible by {groups} at dimension 0"
        )
    return groups


def convolution(x: Tensor, weight: Tensor, stride, padding, dilation, groups: int) -> Tensor:
    """x [N, C, H, W] cross-correlated with weight [O, C/G, kh, kw] in `groups` G (pairs
    given): unfold(x) [N, C·kh·kw, L] times reshape(weight, [O, C·kh·kw]), or per group,
    broadcast(reshape(weight, [G, O/G, C/G·kh·kw])) · reshape(cols, [N, G, C/G·kh·kw, L]), then
    reshaped to [N, O, Ho, Wo]."""
    filters, group_channels, kh, kw = weight.shape
    kernel, n, k = (kh, kw), x.shape[0], group_channels * kh * kw
    cols = apply("unfold", x, kernel=kernel, stride=stride, padding=padding, dilation=dilation)
    ho, wo = conv_output_size(x.shape[2:], kernel, stride, padding, dilation=dilation)
    if groups == 1:
        out = apply("matmul", reshape(weight, (filters, k)), cols)
    else:
        per_group = (groups, filters // groups, k)
        shared = broadcast_to(reshape(weight, per_group), (n, *per_group))
        out = apply("matmul", shared, reshape(cols, (n, groups, k, ho * wo)))
    return reshape(out, (n, filters, ho, wo))


def transposed_convolution(x: Tensor, weight: Tensor, size, stride, padding, dilation, groups: int) -> Tensor:
    """The adjoint of `convolution` with weight [C, O/G, kh, kw] taking [N, O, *size] to x's
    shape [N, C, H, W], applied to x: fold(weightᵀ·x) onto [N, O, *size] (per group,
    fold(reshape(broadcast(W3)ᵀ · reshape(x, [N, G, C/G, H·W])))), as autodiff writes a
    convolution's input gradient."""
    channels, group_filters, kh, kw = weight.shape
    n, k, positions = x.shape[0], group_filters * kh * kw, x.shape[2] * x.shape[3]
    window = {"kernel": (kh, kw), "stride": stride, "padding": padding, "dilation": dilation}
    if groups == 1:
        cols = apply("matmul", reshape(weight, (channels, k)), reshape(x, (n, channels, positions)), transpose_a=True)
    else:
        per_group = (groups, channels // groups, k)
        shared = broadcast_to(reshape(weight, per_group), (n, *per_group))
        product = apply("matmul", shared, reshape(x, (n, groups, channels // groups, positions)), transpose_a=True)
        cols = reshape(product, (n, groups * k, positions))
    return apply("fold", cols, output_size=tuple(size), **window)


def add_channel_bias(out: Tensor, bias, channels: int, op: str, weight: Tensor, at: str) -> Tensor:
    """out [N, channels, *spatial] plus bias [channels] (None: out)."""
    if bias is None:
        return out
    bias = lift(bias)
    if bias.shape != (channels,):
        raise ShapeError(f"{at}: {op}: expected a bias [{channels}] for weight {weight.type}, got {bias.type}")
    return out + reshape(bias, (channels,) + (1,) * (out.ndim - 2))


def batched(x: Tensor, rank: int, op: str, expected: str, at: str) -> tuple[Tensor, bool]:
    """x with a batch dim of 1 prepended where it is unbatched (rank − 1 dims, PyTorch's form), and
    whether it was."""
    if x.ndim == rank - 1:
        return reshape(x, (1, *x.shape)), True
    if x.ndim != rank:
        raise ShapeError(f"{at}: {op}: expected input {expected}, got {x.type}")
    return x, False


def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d: input [N, C, H, W] (or [C, H, W]) cross-correlated with weight
    [O, C/groups, kh, kw], plus bias [O]: [N, O, Ho, Wo]. stride, padding and dilation are ints or
    pairs; padding may be "valid" or "same" (stride 1; an odd total padding d·(k − 1) puts its
    extra row or column at the end, as torch). groups splits the channels (groups = C: depthwise).

    Traced as im2col: cols = unfold(input) [N, C·kh·kw, Ho·Wo], out = reshape(weight, [O, C·kh·kw])
    · cols (one matmul, the weight shared by the batch; per group, a batched matmul), reshaped to
    [N, O, Ho, Wo], plus reshape(bias, [O, 1, 1]). Its gradients are plain too: Σₙ g·colsᵀ for the
    weight, fold(weightᵀ·g) for the input.

    >>> # y = F.conv2d(x, self.weight, self.bias, stride=2, padding=1)
    """
    x, weight = lift(input), lift(weight)
    at = user_source_line()
    if weight.ndim != 4:
        raise ShapeError(
            f"{at}: conv2d: expected a weight [out_channels, in_channels/groups, kh, kw], got {weight.type}"
        )
    filters, group_channels, kh, kw = weight.shape
    groups = group_count("conv2d", groups, filters, at)
    channels = group_channels * groups
    x, unbatched = batched(x, 4, "conv2d", f"[N, {channels}, H, W] (or [{channels}, H, W])", at)
    if x.shape[1] != channels:
        raise ShapeError(
            f"{at}: conv2d: expected input [N, {channels}, H, W] (or [{channels}, H, W]) for weight "
            f"{weight.type} in {groups} group(s), got {lift(input).type}"
        )
    stride, dilation = pair_argument(stride, "conv2d: stride", at), pair_argument(dilation, "conv2d: dilation", at)
    out = padded_convolution("conv2d", x, weight, stride, padding, dilation, groups, at)
    out = add_channel_bias(out, bias, filters, "conv2d", weight, at)
    return reshape(out, out.shape[1:]) if unbatched else out


def padded_convolution(op: str, x: Tensor, weight: Tensor, stride, padding, dilation, groups: int, at: str) -> Tensor:
    """`convolution` with torch's padding argument: an int, a pair, "valid" or "same". An odd total
    "same" padding is the larger half on both sides, and the output's first row (column) dropped:
    the window then starts where torch's, whose extra padding is at the end."""
    kernel = weight.shape[2:]
    trim = (0, 0)
    if isinstance(padding, str):
        padding, trim = string_padding(op, padding, kernel, stride, dilation, at)
    else:
        padding = pair_argument(padding, f"{op}: padding", at)
    out = convolution(x, weight, stride, padding, dilation, groups)
    if trim != (0, 0):
        out = getitem(out, (slice(None), slice(None), slice(trim[0], None), slice(trim[1], None)))
    return out


def string_padding(op: str, padding: str, kernel, stride, dilation, at: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """(padding, trim) of padding="valid" (none) or "same" (stride 1; the output as large as the
    input): each dim pads d·(k − 1) in all, ⌊half⌋ before and the rest after, as torch; where that
    is odd, the larger half on both sides and the output's first row or column trimmed."""
    if padding == "valid":
        return (0, 0), (0, 0)
    if padding != "same":
        raise ValueError(f"{at}: {op}: padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
    if tuple(stride) != (1, 1):
        raise ValueError(f"{at}: {op}: padding='same' is not supported for strided convolutions")
    totals = [d * (k - 1) for k, d in zip(kernel, dilation, strict=True)]
    pads = tuple(total - total // 2 for total in totals)
    return pads, tuple(total % 2 for total in totals)


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv1d: input [N, C, L] (or [C, L]) cross-correlated with weight
    [O, C/groups, k], plus bias [O]: [N, O, Lo]. stride, padding and dilation are ints (or
    1-tuples); padding may be "valid" or "same". Traced as conv2d of a height of 1.

    >>> # y = F.conv1d(x, self.weight, self.bias, padding="same")
    """
    x, weight = lift(input), lift(weight)
    at = user_source_line()
    if weight.ndim != 3:
        raise ShapeError(f"{at}: conv1d: expected a weight [out_channels, in_channels/groups, k], got {weight.type}")
    filters, group_channels, _ = weight.shape
    groups = group_count("conv1d", groups, filters, at)
    channels = group_channels * groups
    x, unbatched = batched(x, 3, "conv1d", f"[N, {channels}, L] (or [{channels}, L])", at)
    if x.shape[1] != channels:
        raise ShapeError(
            f"{at}: conv1d: expected input [N, {channels}, L] (or [{channels}, L]) for weight {weight.type} "
            f"in {groups} group(s), got {lift(input).type}"
        )
    stride, dilation = (
        (1, single_argument(v, f"conv1d: {name}", at)) for name, v in (("stride", stride), ("dilation", dilation))
    )
    if not isinstance(padding, str):
        padding = (0, single_argument(padding, "conv1d: padding", at))
    image = reshape(x, (x.shape[0], channels, 1, x.shape[2]))
    planar = reshape(weight, (filters, group_channels, 1, weight.shape[2]))
    out = padded_convolution("conv1d", image, planar, stride, padding, dilation, groups, at)
    out = reshape(out, (out.shape[0], filters, out.shape[3]))
    out = add_channel_bias(out, bias, filters, "conv1d", weight, at)
    return reshape(out, out.shape[1:]) if unbatched else out


def transposed_size(op: str, image, kernel, stride, padding, output_padding, dilation, at: str) -> tuple[int, int]:
    """The output size of a transposed convolution, (H − 1)·s − 2·p + d·(k − 1) + output_padding + 1
    per dim, checked as torch checks output_padding (smaller than the stride or the dilation; here
    smaller than the stride)."""
    size = []
    for extent, k, s, p, extra, d in zip(image, kernel, stride, padding, output_padding, dilation, strict=True):
        if extra >= s and extra >= d:
            raise ValueError(
                f"{at}: {op}: output padding must be smaller than either stride or dilation, got output_padding "
                f"{tuple(output_padding)}, stride {tuple(stride)}, dilation {tuple(dilation)}"
            )
        if extra >= s:
            raise NotImplementedError(
                f"{at}: {op}: output_padding {tuple(output_padding)} at least the stride {tuple(stride)} is not "
                "supported (only output_padding < stride)"
            )
        size.append((extent - 1) * s - 2 * p + d * (k - 1) + extra + 1)
    if min(size) < 1 or min(padding) < 0:
        raise ShapeError(f"{at}: {op}: the output size {tuple(size)} of input {tuple(image)} is too small")
    return size[0], size[1]


def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    output_padding=0,
    groups=1,
    dilation=1,
):
    """torch.nn.functional.conv_transpose2d: input [N, C, H, W] (or [C, H, W]) with weight
    [C, O/groups, kh, kw] (torch's layout), plus bias [O]: [N, O, Ho, Wo] with
    Ho = (H − 1)·sh − 2·ph + dh·(kh − 1) + output_padding + 1. Ints or pairs; output_padding must
    be smaller than the stride.

    Traced as the adjoint of conv2d, fold(weightᵀ·input) (the form of conv2d's input gradient), so
    that its forward and both gradients become implicit-GEMM kernels (rewrite/conv.py).

    >>> # y = F.conv_transpose2d(x, self.weight, self.bias, stride=2, padding=1, output_padding=1)
    """
    x, weight = lift(input), lift(weight)
    at = user_source_line()
    if weight.ndim != 4:
        raise ShapeError(
            f"{at}: conv_transpose2d: expected a weight [in_channels, out_channels/groups, kh, kw], got {weight.type}"
        )
    channels, group_filters, kh, kw = weight.shape
    groups = group_count("conv_transpose2d", groups, channels, at)
    x, unbatched = batched(x, 4, "conv_transpose2d", f"[N, {channels}, H, W] (or [{channels}, H, W])", at)
    if x.shape[1] != channels:
        raise ShapeError(
            f"{at}: conv_transpose2d: expected input [N, {channels}, H, W] (or [{channels}, H, W]) for weight "
            f"{weight.type}, got {lift(input).type}"
        )
    geometry = [
        pair_argument(value, f"conv_transpose2d: {name}", at)
        for name, value in (
            ("stride", stride),
            ("padding", padding),
            ("output_padding", output_padding),
            ("dilation", dilation),
        )
    ]
    stride, padding, output_padding, dilation = geometry
    size = transposed_size("conv_transpose2d", x.shape[2:], (kh, kw), stride, padding, output_padding, dilation, at)
    out = transposed_convolution(x, weight, size, stride, padding, dilation, groups)
    out = add_channel_bias(out, bias, group_filters * groups, "conv_transpose2d", weight, at)
    return reshape(out, out.shape[1:]) if unbatched else out


def conv_transpose1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride=1,
    padding=0,
    output_padding=0,
    groups=1,
    dilation=1,
):
    """torch.nn.functional.conv_transpose1d: input [N, C, L] (or [C, L]) with weight
    [C, O/groups, k], plus bias [O]: [N, O, (L − 1)·s − 2·p + d·(k − 1) + output_padding + 1].
    Traced as conv_transpose2d of a height of 1."""
    x, weight = lift(input), lift(weight)
    at = user_source_line()
    if weight.ndim != 3:
        raise ShapeError(
            f"{at}: conv_transpose1d: expected a weight [in_channels, out_channels/groups, k], got {weight.type}"
        )
    channels, group_filters, k = weight.shape
    groups = group_count("conv_transpose1d", groups, channels, at)
    x, unbatched = batched(x, 3, "conv_transpose1d", f"[N, {channels}, L] (or [{channels}, L])", at)
    if x.shape[1] != channels:
        raise ShapeError(
            f"{at}: conv_transpose1d: expected input [N, {channels}, L] (or [{channels}, L]) for weight "
            f"{weight.type}, got {lift(input).type}"
        )
    names = ("stride", "padding", "output_padding", "dilation")
    values = (stride, padding, output_padding, dilation)
    stride, padding, output_padding, dilation = (
        (1 if name in ("stride", "dilation") else 0, single_argument(value, f"conv_transpose1d: {name}", at))
        for name, value in zip(names, values, strict=True)
    )
    size = transposed_size("conv_transpose1d", (1, x.shape[2]), (1, k), stride, padding, output_padding, dilation, at)
    image = reshape(x, (x.shape[0], channels, 1, x.shape[2]))
    out = transposed_convolution(
        image, reshape(weight, (channels, group_filters, 1, k)), size, stride, padding, dilation, groups
    )
    out = reshape(out, (out.shape[0], out.shape[1], out.shape[3]))
    out = add_channel_bias(out, bias, group_filters * groups, "conv_transpose1d", weight, at)
    return reshape(out, out.shape[1:]) if unbatched else out


# ---------------------------------------------------------------------------------------------
# Pooling and normalisation of images (NCHW). max_pool2d, avg_pool2d and adaptive_max_pool2d are
# ops of their own (ir/ops/image.py), the 1-D pools those of a height of 1; adaptive_avg_pool2d is
# traced as products with the averaging matrices of its windows (a mean to 1×1); batch_norm and
# group_norm are traced decomposed (means, rsqrt, products), so autodiff derives their exact
# backward from the same ops.


def pool2d(op: str, input: Tensor, kernel_size, stride, padding, **attrs) -> Tensor:
    """`op` on [N, C, H, W] or [C, H, W] (PyTorch's unbatched form, traced as a batch of one)."""
    x = lift(input)
    at = user_source_line()
    if x.ndim not in (3, 4):
        raise ShapeError(f"{at}: {op}: expected [N, C, H, W] or [C, H, W], got {x.type}")
    kernel = pair_argument(kernel_size, f"{op} kernel_size", at)
    strides = kernel if stride is None or stride == [] else pair_argument(stride, f"{op} stride", at)
    pads = pair_argument(padding, f"{op} padding", at)
    unbatched = x.ndim == 3
    if unbatched:
        x = reshape(x, (1, *x.shape))
    out = apply(op, x, kernel=kernel, stride=strides, padding=pads, **attrs)
    return reshape(out, out.shape[1:]) if unbatched else out


def pool1d(op: str, input: Tensor, kernel_size, stride, padding, **attrs) -> Tensor:
    """`op` (a 2-D pool) on [N, C, L] or [C, L] as an image of a height of 1."""
    x = lift(input)
    at = user_source_line()
    name = op.replace("2d", "1d")
    if x.ndim not in (2, 3):
        raise ShapeError(f"{at}: {name}: expected [N, C, L] or [C, L], got {x.type}")
    kernel = (1, single_argument(kernel_size, f"{name} kernel_size", at))
    strides = kernel if stride is None or stride == [] else (1, single_argument(stride, f"{name} stride", at))
    pads = (0, single_argument(padding, f"{name} padding", at))
    image = reshape(x, (*x.shape[:-1], 1, x.shape[-1]))
    out = pool2d(op, image, kernel, strides, pads, **attrs)
    return reshape(out, (*out.shape[:-2], out.shape[-1]))


def refuse_indices(op: str, return_indices) -> None:
    if return_indices:
        raise NotImplementedError(f"{user_source_line()}: {op}: return_indices=True is not supported")


def max_pool2d(
    input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices=False
) -> Tensor:
    """The maximum over each kh×kw window, its taps dilation apart (torch.nn.functional.max_pool2d):
    stride defaults to the kernel size, the padding (at most half the kernel) counts as −inf,
    ceil_mode rounds the output size up. The gradient goes to the first maximum of each window in
    scan order. return_indices is not supported.

    >>> # y = F.max_pool2d(x, 2)  # x [8, 16, 32, 32] → [8, 16, 16, 16]
    """
    refuse_indices("max_pool2d", return_indices)
    dilation = pair_argument(dilation, "max_pool2d dilation", user_source_line())
    return pool2d("max_pool2d", input, kernel_size, stride, padding, dilation=dilation, ceil_mode=bool(ceil_mode))


def avg_pool2d(
    input: Tensor,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override=None,
) -> Tensor:
    """The mean over each kh×kw window (torch.nn.functional.avg_pool2d): stride defaults to the
    kernel size; the divisor is divisor_override, or the window's size within the padded image
    (count_include_pad=True: kh·kw but where ceil_mode lets a window pass the padding), or its
    pixels within the image.

    >>> # y = F.avg_pool2d(x, 3, stride=2, padding=1)
    """
    divisor = 0 if divisor_override is None else divisor_override
    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < 0 or divisor_override == 0:
        raise ValueError(
            f"{user_source_line()}: avg_pool2d: divisor_override must be a positive int, got {divisor_override!r}"
        )
    attrs = {"ceil_mode": bool(ceil_mode), "count_include_pad": bool(count_include_pad), "divisor": divisor}
    return pool2d("avg_pool2d", input, kernel_size, stride, padding, **attrs)


def max_pool1d(
    input: Tensor, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False, return_indices=False
) -> Tensor:
    """torch.nn.functional.max_pool1d over [N, C, L] (or [C, L]): max_pool2d of a height of 1."""
    refuse_indices("max_pool1d", return_indices)
    dilation = (1, single_argument(dilation, "max_pool1d dilation", user_source_line()))
    return pool1d("max_pool2d", input, kernel_size, stride, padding, dilation=dilation, ceil_mode=bool(ceil_mode))


def avg_pool1d(
    input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True
) -> Tensor:
    """torch.nn.functional.avg_pool1d over [N, C, L] (or [C, L]): avg_pool2d of a height of 1."""
    attrs = {"ceil_mode": bool(ceil_mode), "count_include_pad": bool(count_include_pad), "divisor": 0}
    return pool1d("avg_pool2d", input, kernel_size, stride, padding, **attrs)


def adaptive_output_size(op: str, output_size, spatial: tuple[int, ...], at: str) -> tuple[int, ...]:
    """torch's output_size of an adaptive pool over `spatial` dims: an int for all, or one entry per
    dim, None keeping the input's size."""
    sizes = (output_size,) * len(spatial) if not isinstance(output_size, (tuple, list)) else tuple(output_size)
    if len(sizes) != len(spatial):
        raise ShapeError(f"{at}: {op}: expected output_size of {len(spatial)} entries, got {output_size!r}")
    out = []
    for size, extent in zip(sizes, spatial, strict=True):
        if size is None:
            size = extent
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ShapeError(f"{at}: {op}: output_size must hold positive ints (or None), got {output_size!r}")
        out.append(int(size))
    return tuple(out)


def adaptive_input(op: str, input: Tensor, rank: int, at: str) -> Tensor:
    x = lift(input)
    if x.ndim not in (rank - 1, rank):
        form = "[N, C, H, W] or [C, H, W]" if rank == 4 else "[N, C, L] or [C, L]"
        raise ShapeError(f"{at}: {op}: expected {form}, got {x.type}")
    return x


def pooled_along(x: Tensor, axis: int, size: int) -> Tensor:
    """x with dim `axis` (−1 or −2) averaged over torch's adaptive windows of `size` outputs: a
    product with the [size, extent] averaging matrix."""
    extent = x.shape[axis]
    if extent == size:
        return x
    weights = apply("adaptive_pool_matrix", size=extent, output_size=size)
    if axis == -1:
        return matmul(x, transpose2d(weights))
    return apply("matmul", weights, x)


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool2d: [N, C, H, W] (or [C, H, W]) → [N, C, oh, ow], output
    (i, j) the mean over rows [⌊i·H/oh⌋, ⌈(i + 1)·H/oh⌉) and the columns likewise (uneven windows
    where oh does not divide H). output_size is an int or a pair (None keeps a dim). Traced as a
    mean for 1×1, else as products with each dim's averaging matrix (A_h · x · A_wᵀ).

    >>> # features = F.flatten(F.adaptive_avg_pool2d(x, 1), 1)  # [N, C]
    """
    at = user_source_line()
    x = adaptive_input("adaptive_avg_pool2d", input, 4, at)
    oh, ow = adaptive_output_size("adaptive_avg_pool2d", output_size, x.shape[-2:], at)
    if (oh, ow) == (1, 1):
        return mean(x, (-2, -1), keepdim=True)
    return pooled_along(pooled_along(x, -1, ow), -2, oh)


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:
    """torch.nn.functional.adaptive_avg_pool1d: [N, C, L] (or [C, L]) → [N, C, output_size], each
    output the mean over torch's adaptive window (a product with the averaging matrix)."""
    at = user_source_line()
    x = adaptive_input("adaptive_avg_pool1d", input, 3, at)
    (size,) = adaptive_output_size("adaptive_avg_pool1d", output_size, x.shape[-1:], at)
    return mean(x, -1, keepdim=True) if size == 1 else pooled_along(x, -1, size)


def adaptive_max_pool2d(input: Tensor, output_size, return_indices=False) -> Tensor:
    """torch.nn.functional.adaptive_max_pool2d: [N, C, H, W] (or [C, H, W]) → [N, C, oh, ow], the
    maximum over each of adaptive_avg_pool2d's windows (NaN propagates). The gradient goes to each
    window's maximum as torch picks it. return_indices is not supported."""
    at = user_source_line()
    refuse_indices("adaptive_max_pool2d", return_indices)
    x = adaptive_input("adaptive_max_pool2d", input, 4, at)
    size = adaptive_output_size("adaptive_max_pool2d", output_size, x.shape[-2:], at)
    unbatched = x.ndim == 3
    if unbatched:
        x = reshape(x, (1, *x.shape))
    out = apply("adaptive_max_pool2d", x, output_size=size)
    return reshape(out, out.shape[1:]) if unbatched else out


def adaptive_max_pool1d(input: Tensor, output_size, return_indices=False) -> Tensor:
    """torch.nn.functional.adaptive_max_pool1d: [N, C, L] (or [C, L]) → [N, C, output_size] (as
    adaptive_max_pool2d of a height of 1). return_indices is not supported."""
    at = user_source_line()
    refuse_indices("adaptive_max_pool1d", return_indices)
    x = adaptive_input("adaptive_max_pool1d", input, 3, at)
    (size,) = adaptive_output_size("adaptive_max_pool1d", output_size, x.shape[-1:], at)
    image = reshape(x, (*x.shape[:-1], 1, x.shape[-1]))
    out = adaptive_max_pool2d(image, (1, size))
    return reshape(out, (*out.shape[:-2], out.shape[-1]))


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


__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
