"""The transformer ops of the op table: rotary position embeddings and fused attention.

Registered into `ops.OPS` when `ops` is imported (it imports this module at its end); shapes
are checked with the helpers of `ops`, and the numpy semantics here are the oracle the kernels
(codegen, shaders/attention.wgsl, the rope lowering) and the recognition rules are tested
against.
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.ops import ShapeError, broadcasts_to, register, require_float

# ---------------------------------------------------------------------------------------------
# Rotary position embeddings, the half-split convention of Llama/SmolLM2 (HF transformers):
# rope(x, cos, sin) = x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x[..., h:], x[..., :h])
# with h = D/2 of x's even last dim D; cos and sin broadcast to x (typically [seq, D] against
# x [batch, heads, seq, D]). rope_grad(g, cos, sin) = g·cos + rotate_halfᵀ(g·sin), the gradient
# w.r.t. x, with rotate_halfᵀ(y) = cat(y[..., h:], −y[..., :h]).


def infer_rope(name: str):
    def infer(types, attrs) -> TensorType:
        require_float(types, name)
        x, cos, sin = types
        if x.rank < 1 or x.shape[-1] % 2 or x.shape[-1] == 0:
            raise ShapeError(f"{name}: expected x with an even, nonzero last dim (head_dim), got {x}")
        for what, t in (("cos", cos), ("sin", sin)):
            if not broadcasts_to(t.shape, x.shape):
                raise ShapeError(f"{name}: {what} {t} does not broadcast to x {x}")
        return x

    return infer


def rotate_half(x: np.ndarray) -> np.ndarray:
    """cat(−x[..., h:], x[..., :h]) along the last axis (h = half the last dim)."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rotate_half_transposed(y: np.ndarray) -> np.ndarray:
    """cat(y[..., h:], −y[..., :h]): the transpose (and inverse) of rotate_half."""
    h = y.shape[-1] // 2
    return np.concatenate([y[..., h:], -y[..., :h]], axis=-1)


def evaluate_rope(x, cos, sin):
    """x·cos + rotate_half(x)·sin."""
    return np.broadcast_to(x * cos + rotate_half(x) * sin, x.shape).copy()


def evaluate_rope_grad(g, cos, sin):
    """g·cos + rotate_halfᵀ(g·sin): rope's VJP w.r.t. x."""
    return np.broadcast_to(g * cos + rotate_half_transposed(g * sin), g.shape).copy()


register("rope", "rope", 3, infer_rope("rope"), evaluate_rope)
register("rope_grad", "rope", 3, infer_rope("rope_grad"), evaluate_rope_grad)


# ---------------------------------------------------------------------------------------------
# Attention, PyTorch's layout: q [B, H, Sq, D], k and v [B, H_kv, Skv, D] with H % H_kv == 0
# (grouped KV heads: query head h reads KV head h // (H / H_kv)). `causal` masks key j > query i
# (top-left aligned, as torch's is_causal). `attention` is softmax(q·kᵀ·scale)·v; `attention_lse`
# its row log-sum-exp [B, H, Sq], which the backward ops read to recompute P = exp(q·kᵀ·scale − lse)
# instead of keeping it. attention_grad_q/k/v take (q, k, v, o, lse, do), o the forward's output
# and do its incoming gradient; dK and dV sum over the query heads of a group.


def attention_dims(types, op: str) -> tuple[int, int, int, int, int, int]:
    """(B, H, H_kv, Sq, Skv, D) of attention operands q, k[, v], checking that they fit."""
    require_float(types, op)
    q, k = types[0], types[1]
    if q.rank != 4 or k.rank != 4:
        raise ShapeError(f"{op}: expected q and k of rank 4 [batch, heads, seq, head_dim], got {q} and {k}")
    b, h, sq, d = q.shape
    kb, hkv, skv, kd = k.shape
    if kb != b or kd != d or hkv < 1 or h % hkv:
        raise ShapeError(f"{op}: k {k} does not fit q {q} (same batch and head_dim, heads dividing {h})")
    for t in types[2:3]:
        if t.shape != k.shape:
            raise ShapeError(f"{op}: v {t} differs from k {k}")
    return b, h, hkv, sq, skv, d


def infer_attention(types, attrs) -> TensorType:
    attention_dims(types, "attention")
    return types[0]


def infer_attention_lse(types, attrs) -> TensorType:
    b, h, _, sq, _, _ = attention_dims(types, "attention_lse")
    return TensorType((b, h, sq), "f32")


def infer_attention_grad(which: str):
    def infer(types, attrs) -> TensorType:
        name = f"attention_grad_{which}"
        b, h, _, sq, _, _ = attention_dims(types[:3], name)
        o, lse, do = types[3:]
        if o.shape != types[0].shape or do.shape != types[0].shape or lse.shape != (b, h, sq):
            raise ShapeError(f"{name}: o {o}, lse {lse} and do {do} do not fit q {types[0]}")
        return types[0] if which == "q" else types[1]

    return infer


def attention_scores(q, k, causal, scale):
    """q·kᵀ·scale per query head ([B, H, Sq, Skv]), −inf where the causal mask hides a key."""
    group = q.shape[1] // k.shape[1]
    scores = (q @ np.swapaxes(np.repeat(k, group, axis=1), -1, -2)) * q.dtype.type(scale)
    if causal:
        hidden = np.arange(k.shape[2])[None, :] > np.arange(q.shape[2])[:, None]
        scores = np.where(hidden, -np.inf, scores)
    return scores


def evaluate_attention_lse(q, k, causal=False, scale=1.0):
    """log Σ_j exp(q·kⱼ·scale) per query row (over the unmasked keys)."""
    scores = attention_scores(q, k, causal, scale)
    peak = scores.max(axis=-1, keepdims=True)
    return (peak + np.log(np.exp(scores - peak).sum(axis=-1, keepdims=True)))[..., 0]


def evaluate_attention(q, k, v, causal=False, scale=1.0):
    """softmax(q·kᵀ·scale, masked)·v."""
    probs = np.exp(attention_scores(q, k, causal, scale) - evaluate_attention_lse(q, k, causal, scale)[..., None])
    return probs @ np.repeat(v, q.shape[1] // k.shape[1], axis=1)


def sum_groups(x, kv_heads):
    """[B, H, S, D] summed over the query heads of each KV head: [B, H_kv, S, D]."""
    b, h, s, d = x.shape
    return x.reshape(b, kv_heads, h // kv_heads, s, d).sum(axis=2)


def attention_backward(q, k, v, o, lse, do, causal, scale):
    """(P, dS) per query head, P recomputed from q, k and lse: dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O))."""
    group = q.shape[1] // k.shape[1]
    probs = np.exp(attention_scores(q, k, causal, scale) - lse[..., None])
    dp = do @ np.swapaxes(np.repeat(v, group, axis=1), -1, -2)
    return probs, probs * (dp - (do * o).sum(axis=-1, keepdims=True))


def evaluate_attention_grad_q(q, k, v, o, lse, do, causal=False, scale=1.0):
    """dQ = dS·K·scale."""
    _, ds = attention_backward(q, k, v, o, lse, do, causal, scale)
    return ds @ np.repeat(k, q.shape[1] // k.shape[1], axis=1) * q.dtype.type(scale)


def evaluate_attention_grad_k(q, k, v, o, lse, do, causal=False, scale=1.0):
    """dK = Σ_group dSᵀ·Q·scale."""
    _, ds = attention_backward(q, k, v, o, lse, do, causal, scale)
    return sum_groups(np.swapaxes(ds, -1, -2) @ q, k.shape[1]) * q.dtype.type(scale)


def evaluate_attention_grad_v(q, k, v, o, lse, do, causal=False, scale=1.0):
    """dV = Σ_group Pᵀ·dO."""
    probs, _ = attention_backward(q, k, v, o, lse, do, causal, scale)
    return sum_groups(np.swapaxes(probs, -1, -2) @ do, k.shape[1])


register("attention", "attention", 3, infer_attention, evaluate_attention)
register("attention_lse", "attention", 2, infer_attention_lse, evaluate_attention_lse)
for _which, _fn in (
    ("q", evaluate_attention_grad_q),
    ("k", evaluate_attention_grad_k),
    ("v", evaluate_attention_grad_v),
):
    register(f"attention_grad_{_which}", "attention", 6, infer_attention_grad(_which), _fn)
