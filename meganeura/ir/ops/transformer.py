"""Transformer ops: rotary position embeddings and fused attention (whose forward has two results).

Rotary position embeddings, the half-split convention of Llama/SmolLM2 (HF transformers):
rope(x, cos, sin) = x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x[..., h:], x[..., :h])
with h = D/2 of x's even last dim D; cos and sin broadcast to x (typically [seq, D] against
x [batch, heads, seq, D]). rope_grad(g, cos, sin) = g·cos + rotate_halfᵀ(g·sin), the gradient
w.r.t. x, with rotate_halfᵀ(y) = cat(y[..., h:], −y[..., :h]). With `seq_first` the x side is
stored [batch, seq, heads, D], as a Linear's output seen per head before its transpose to
[batch, heads, seq, D]: rope reads x that way (its result is [batch, heads, seq, D]) and rope_grad
writes its result that way (g is [batch, heads, seq, D]), so that the transposes next to them
need no kernel (rewrite/algebra.py `rope_layout`); cos and sin broadcast to the heads-first side.

Attention, PyTorch's layout: q [B, H, Sq, D], k and v [B, H_kv, Skv, D] with H % H_kv == 0
(grouped KV heads: query head h reads KV head h // (H / H_kv)). `causal` masks key j > query i
(top-left aligned, as torch's is_causal). `attention(q, k, v)` has two results: the output
softmax(q·kᵀ·scale)·v and the row log-sum-exp [B, H, Sq], which the backward ops read to
recompute P = exp(q·kᵀ·scale − lse) instead of keeping it. `attention_grad_q(q, k, v, delta,
lse, do)` is dQ; `attention_grad_kv(…)` has two results, dK and dV (one pass over the key rows
recomputes P once for both), each summed over the query heads of a group; do is the output's
incoming gradient and delta [B, H, Sq] the rows' Dᵢ = dOᵢ·Oᵢ (o the forward's output), which
dS = P ∘ (dO·vᵀ − D) subtracts. The VJP computes delta as a reduction of its own, once per row:
the kernels read it instead of o (a dK/dV kernel would otherwise rebuild each query tile's D in
every key tile's workgroup that walks it, loading O beside dO: on the H200 the SmolLM2-135M
layer's dK/dV took 0.165 ms that way, 0.137 without, 2026-12-02, `benchmarks/attention.py
--ablate`). With `per_query_head` its results are [B, H, Skv, D], one
dK and dV per query head, not yet summed over the group (passes/attention_heads.py
`split_attention_heads`: a grouped kernel walks every query head of its group for each key tile,
a per-head one spreads that work over H / H_kv times the workgroups, and a sum after it adds the
group's parts). With `scores` it has a third result, the scores' gradient it computes on the way
(zero where the causal mask hides a key), times scale, transposed and grouped by KV head: dSᵀ·scale
[B, H_kv, Skv, G·Sq] with G = H / H_kv (element [b, j, k, g·Sq + i] is query head j·G + g's
dS[i, k]), from which dQ = dS·K·scale is a batched matmul, (dSᵀ)ᵀ·K per KV head
(passes/attention_scores.py `dq_from_scores`).

With `dropout` p > 0 (SDPA's dropout_p) each op takes the RNG state leaf as a last operand and
drops the probabilities: P' = P ∘ M / (1 − p), M_ij = 1 with probability 1 − p, so o = P'·v,
dV = P'ᵀ·dO and dS = P ∘ (M·(dO·vᵀ)/(1 − p) − D) (D is unchanged: Σ_j P'_ij·dO_i·v_j = dO_i·o_i).
The lse stays that of P. M is drawn, never stored: every kernel of the three draws it again where
it needs it, from the state's Philox stream `stream` (ir/ops/random.py), one Philox call per eight
keys: the 16-bit halves of philox((((b·H + h)·Sq + i)·⌈Skv/8⌉ + ⌊j/8⌋, stream, step), seed), low
half first, are keys 8⌊j/8⌋ … 8⌊j/8⌋ + 7, each kept where its half reaches ⌈p·2¹⁶⌉
(`dropout_keep`; p is thus rounded up to a multiple of 2⁻¹⁶, as FlashAttention-2 rounds it to 2⁻⁸).
A kernel makes a tile's mask with an eighth of the calls of `rand`'s draw per element: a Philox
call costs about 400 integer operations, what a tile's 64-wide dot products of four scores do.

The ops declare their arithmetic to the cost model (`attention_flops`): 2·D flops per (query,
key) pair and product — two products in the forward (q·kᵀ, P·v), three for dQ (the scores, dO·vᵀ,
dS·k), four for dK and dV (the scores, dO·vᵀ, Pᵀ·dO, dSᵀ·q) — over the pairs the causal mask
leaves (about half).
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, FLOAT, INT, Attr, Op, ShapeError, broadcasts_to, require_float
from meganeura.ir.ops.random import MASK32, RNG_STATE_TYPE, philox4x32

FAMILY = "transformer"

# ---------------------------------------------------------------------------------------------
# Rotary position embeddings


SEQ_FIRST = (0, 2, 1, 3)  # [batch, seq, heads, D] ⇄ [batch, heads, seq, D]: its own inverse


def swap_seq_heads(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape[axis] for axis in SEQ_FIRST)


def infer_rope(name: str):
    def infer(types, attrs) -> TensorType:
        require_float(types, name)
        x, cos, sin = types
        if x.rank < 1 or x.shape[-1] % 2 or x.shape[-1] == 0:
            raise ShapeError(f"{name}: expected x with an even, nonzero last dim (head_dim), got {x}")
        result = x
        if attrs.get("seq_first"):
            if x.rank != 4:
                raise ShapeError(f"{name}: seq_first needs a 4-D operand [batch, seq, heads, D], got {x}")
            result = TensorType(swap_seq_heads(x.shape), x.dtype)  # either op swaps seq and heads
        heads_first = result if name == "rope" else x  # what cos and sin broadcast to
        side = f"x {x}" if heads_first is x else f"x heads-first {heads_first}"
        for what, t in (("cos", cos), ("sin", sin)):
            if not broadcasts_to(t.shape, heads_first.shape):
                raise ShapeError(f"{name}: {what} {t} does not broadcast to {side}")
        return result

    return infer


def rotate_half(x: np.ndarray) -> np.ndarray:
    """cat(−x[..., h:], x[..., :h]) along the last axis (h = half the last dim)."""
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rotate_half_transposed(y: np.ndarray) -> np.ndarray:
    """cat(y[..., h:], −y[..., :h]): the transpose (and inverse) of rotate_half."""
    h = y.shape[-1] // 2
    return np.concatenate([y[..., h:], -y[..., :h]], axis=-1)


def evaluate_rope(x, cos, sin, seq_first=False):
    """x·cos + rotate_half(x)·sin (x read heads-first)."""
    x = x.transpose(SEQ_FIRST) if seq_first else x
    return np.broadcast_to(x * cos + rotate_half(x) * sin, x.shape).copy()


def evaluate_rope_grad(g, cos, sin, seq_first=False):
    """g·cos + rotate_halfᵀ(g·sin): rope's VJP w.r.t. x (written seq-first where x is)."""
    dx = np.broadcast_to(g * cos + rotate_half_transposed(g * sin), g.shape)
    return (dx.transpose(SEQ_FIRST) if seq_first else dx).copy()


def describe_rope(node) -> str:
    return "seq-first" if node.attr("seq_first") else ""


ROPE = Op(
    "rope",
    family=FAMILY,
    infer=infer_rope("rope"),
    evaluate=evaluate_rope,
    operands=("x", "cos", "sin"),
    attrs=(Attr("seq_first", BOOL, False),),
    describe=describe_rope,
    doc="x·cos + rotate_half(x)·sin (rotary position embeddings, half-split)",
)
ROPE_GRAD = Op(
    "rope_grad",
    family=FAMILY,
    infer=infer_rope("rope_grad"),
    evaluate=evaluate_rope_grad,
    operands=("g", "cos", "sin"),
    attrs=(Attr("seq_first", BOOL, False),),
    describe=describe_rope,
    doc="g·cos + rotate_halfᵀ(g·sin) (rope's VJP w.r.t. x)",
)


def rotate_half_nodes(b, x: int) -> int:
    """cat(−x[..., h:], x[..., :h]) along the last dim (h = half of it), from slice, neg and concat."""
    shape = b.shape(x)
    rank, h = len(shape), shape[-1] // 2
    steps = (1,) * rank
    low = b.emit("slice", [x], starts=(0,) * rank, stops=(*shape[:-1], h), steps=steps)
    high = b.emit("slice", [x], starts=(0,) * (rank - 1) + (h,), stops=shape, steps=steps)
    return b.emit("concat", [b.emit("neg", [high]), low], axis=rank - 1)


def heads_first(b, node, value: int) -> int:
    """`value` (the seq-first side of a rope or rope_grad node) seen heads-first."""
    return b.emit("permute", [value], perm=SEQ_FIRST) if node.attr("seq_first") else value


@ROPE.vjp
def _rope(b, node, g):
    """dx = rope_grad(g, cos, sin) (seq-first where x is); d cos = g·x and d sin = g·rotate_half(x),
    x heads-first, unbroadcast."""
    x, cos, sin = node.inputs
    x = heads_first(b, node, x)
    grad_cos = b.unbroadcast(b.emit("mul", [g, x]), b.shape(cos))
    grad_sin = b.unbroadcast(b.emit("mul", [g, rotate_half_nodes(b, x)]), b.shape(sin))
    return [b.emit("rope_grad", [g, cos, sin], seq_first=node.attr("seq_first")), grad_cos, grad_sin]


@ROPE_GRAD.vjp
def _rope_grad(b, node, g):
    """rope_grad is linear in its first operand and rope is its transpose: d g = rope(gg, cos, sin)
    (gg read seq-first where it is); d cos = gg·g and d sin = rotate_half(gg)·g, gg heads-first,
    unbroadcast."""
    upstream, cos, sin = node.inputs
    incoming = heads_first(b, node, g)
    grad_cos = b.unbroadcast(b.emit("mul", [incoming, upstream]), b.shape(cos))
    grad_sin = b.unbroadcast(b.emit("mul", [rotate_half_nodes(b, incoming), upstream]), b.shape(sin))
    return [b.emit("rope", [g, cos, sin], seq_first=node.attr("seq_first")), grad_cos, grad_sin]


# ---------------------------------------------------------------------------------------------
# Attention


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


def check_dropout(types, attrs, operands: int, op: str) -> None:
    """The RNG state is a last operand exactly when dropout > 0, and the mask's counters fit 32 bits."""
    p = float(attrs.get("dropout", 0.0))
    if not 0.0 <= p < 1.0:
        raise ShapeError(f"{op}: dropout must be in [0, 1), got {p}")
    if len(types) != operands + (p > 0.0):
        state = "takes the RNG state as its last operand" if p > 0.0 else "takes no RNG state"
        raise ShapeError(f"{op}: with dropout {p} the op {state}; got {len(types)} operands")
    if p > 0.0:
        if types[-1] != RNG_STATE_TYPE:
            raise ShapeError(f"{op}: expected the RNG state {RNG_STATE_TYPE} as the last operand, got {types[-1]}")
        b, h, sq, _ = types[0].shape
        if b * h * sq * key_groups(types[1].shape[2]) > MASK32 + 1:
            raise ShapeError(
                f"{op}: dropout's Philox counters ({b}·{h}·{sq} query rows × ⌈{types[1].shape[2]}/8⌉ key groups) "
                "do not fit 32 bits"
            )


def infer_attention(types, attrs) -> tuple[TensorType, TensorType]:
    check_dropout(types, attrs, 3, "attention")
    b, h, _, sq, _, _ = attention_dims(types[:3], "attention")
    return (types[0], TensorType((b, h, sq), "f32"))


def check_backward_operands(types, name: str) -> tuple[int, int, int]:
    b, h, _, sq, _, _ = attention_dims(types[:3], name)
    delta, lse, do = types[3:6]
    if do.shape != types[0].shape or lse.shape != (b, h, sq) or delta.shape != (b, h, sq):
        raise ShapeError(f"{name}: delta {delta}, lse {lse} and do {do} do not fit q {types[0]}")
    return b, h, sq


def infer_attention_grad_q(types, attrs) -> TensorType:
    check_dropout(types, attrs, 6, "attention_grad_q")
    check_backward_operands(types, "attention_grad_q")
    return types[0]


def infer_attention_grad_kv(types, attrs) -> tuple[TensorType, ...]:
    check_dropout(types, attrs, 6, "attention_grad_kv")
    b, h, sq = check_backward_operands(types, "attention_grad_kv")
    _, _, skv, d = types[1].shape
    per_head = TensorType((b, h, skv, d), "f32")
    results = (per_head, per_head) if attrs.get("per_query_head") else (types[1], types[2])
    hkv = types[1].shape[1]
    return (*results, TensorType((b, hkv, skv, h // hkv * sq), "f32")) if attrs.get("scores") else results


def attention_scores(q, k, causal, scale):
    """q·kᵀ·scale per query head ([B, H, Sq, Skv]), −inf where the causal mask hides a key."""
    group = q.shape[1] // k.shape[1]
    scores = (q @ np.swapaxes(np.repeat(k, group, axis=1), -1, -2)) * q.dtype.type(scale)
    if causal:
        hidden = np.arange(k.shape[2])[None, :] > np.arange(q.shape[2])[:, None]
        scores = np.where(hidden, -np.inf, scores)
    return scores


def evaluate_attention_lse(q, k, causal, scale):
    """log Σ_j exp(q·kⱼ·scale) per query row (over the unmasked keys)."""
    scores = attention_scores(q, k, causal, scale)
    peak = scores.max(axis=-1, keepdims=True)
    return (peak + np.log(np.exp(scores - peak).sum(axis=-1, keepdims=True)))[..., 0]


KEYS_PER_CALL = 8  # a Philox call's four words, as 16-bit halves


def key_groups(skv: int) -> int:
    """The Philox calls of a query row's dropout mask: one per eight keys."""
    return -(-skv // KEYS_PER_CALL)


def dropout_threshold(p: float) -> int:
    """⌈p·2¹⁶⌉ for p as an f32: a key is kept where its 16-bit half reaches it."""
    return int(np.ceil(float(np.float32(p)) * 2.0**16))


def dropout_scale(p: float) -> float:
    """1/(1 − p) as an f32 quotient, as torch's `noise.div_(1 - p)` (and `dropout_mask`)."""
    return float(np.float32(1.0) / np.float32(1.0 - p))


def dropout_halves(state, shape: tuple[int, int, int, int], stream: int) -> np.ndarray:
    """The 16-bit random halves [B, H, Sq, Skv] (uint32) that attention's dropout compares with
    its threshold, per (query, key) pair (module docstring)."""
    b, h, sq, skv = shape
    groups = key_groups(skv)
    words = np.asarray(state).astype(np.int32).view(np.uint32).reshape(4)
    counter = np.empty((4, b * h * sq * groups), dtype=np.uint32)
    counter[0] = np.arange(counter.shape[1], dtype=np.uint32)
    counter[1] = np.uint32(stream & MASK32)
    counter[2], counter[3] = words[2], words[3]
    bits = philox4x32(counter, words[:2]).T  # [calls, 4]
    halves = np.stack([bits & np.uint32(0xFFFF), bits >> np.uint32(16)], axis=-1)  # word w: keys 2w, 2w + 1
    return halves.reshape(b * h * sq, groups * KEYS_PER_CALL)[:, :skv].reshape(shape)


def dropout_keep(state, shape: tuple[int, int, int, int], stream: int, p: float) -> np.ndarray:
    """The kept (query, key) pairs [B, H, Sq, Skv] of attention's dropout with probability p."""
    return dropout_halves(state, shape, stream) >= np.uint32(dropout_threshold(p))


def dropout_factor(state, probs_shape, stream: int, p: float, dtype) -> np.ndarray | float:
    """M/(1 − p) per pair (1 without dropout): what P is multiplied by."""
    if p <= 0.0:
        return dtype.type(1.0)
    return dropout_keep(state, probs_shape, stream, p).astype(dtype) * dtype.type(dropout_scale(p))


def evaluate_attention(q, k, v, state=None, causal=False, scale=1.0, dropout=0.0, stream=0):
    """(dropout(softmax(q·kᵀ·scale, masked))·v, the row log-sum-exp of the undropped scores)."""
    lse = evaluate_attention_lse(q, k, causal, scale)
    probs = np.exp(attention_scores(q, k, causal, scale) - lse[..., None])
    probs = probs * dropout_factor(state, probs.shape, stream, dropout, q.dtype)
    return probs @ np.repeat(v, q.shape[1] // k.shape[1], axis=1), lse


def sum_groups(x, kv_heads):
    """[B, H, S, D] summed over the query heads of each KV head: [B, H_kv, S, D]."""
    b, h, s, d = x.shape
    return x.reshape(b, kv_heads, h // kv_heads, s, d).sum(axis=2)


def attention_delta(o, do):
    """The rows' Dᵢ = dOᵢ·Oᵢ [B, H, Sq] that the backward ops read (`delta`)."""
    return (do * o).sum(axis=-1)


def attention_backward(q, k, v, delta, lse, do, causal, scale, state=None, dropout=0.0, stream=0):
    """(P', dS) per query head, P recomputed from q, k and lse and dropped (P' = P·M/(1 − p)):
    dS = P ∘ (M/(1 − p)·(dO·Vᵀ) − D)."""
    group = q.shape[1] // k.shape[1]
    probs = np.exp(attention_scores(q, k, causal, scale) - lse[..., None])
    factor = dropout_factor(state, probs.shape, stream, dropout, q.dtype)
    dp = do @ np.swapaxes(np.repeat(v, group, axis=1), -1, -2)
    return probs * factor, probs * (dp * factor - delta[..., None])


def evaluate_attention_grad_q(q, k, v, delta, lse, do, state=None, causal=False, scale=1.0, dropout=0.0, stream=0):
    """dQ = dS·K·scale."""
    _, ds = attention_backward(q, k, v, delta, lse, do, causal, scale, state, dropout, stream)
    return ds @ np.repeat(k, q.shape[1] // k.shape[1], axis=1) * q.dtype.type(scale)


def evaluate_attention_grad_kv(
    q, k, v, delta, lse, do, state=None, causal=False, scale=1.0, dropout=0.0, stream=0, per_query_head=False,
    scores=False,
):  # fmt: skip
    """(dK = Σ_group dSᵀ·Q·scale, dV = Σ_group P'ᵀ·dO); with `per_query_head`, each query head's
    part; with `scores`, dSᵀ·scale grouped by KV head after them (`grouped_scores`)."""
    probs, ds = attention_backward(q, k, v, delta, lse, do, causal, scale, state, dropout, stream)
    grad_k = (np.swapaxes(ds, -1, -2) @ q) * q.dtype.type(scale)
    grad_v = np.swapaxes(probs, -1, -2) @ do
    if not per_query_head:
        grad_k, grad_v = sum_groups(grad_k, k.shape[1]), sum_groups(grad_v, k.shape[1])
    return (grad_k, grad_v, grouped_scores(ds * q.dtype.type(scale), k.shape[1])) if scores else (grad_k, grad_v)


def grouped_scores(ds, kv_heads):
    """dS [B, H, Sq, Skv] as dSᵀ grouped by KV head, [B, H_kv, Skv, G·Sq] (G = H / H_kv)."""
    b, h, sq, skv = ds.shape
    grouped = ds.reshape(b, kv_heads, h // kv_heads, sq, skv).transpose(0, 1, 4, 2, 3)
    return grouped.reshape(b, kv_heads, skv, h // kv_heads * sq)


def visible_pairs(sq: int, skv: int, causal: bool) -> int:
    """The (query, key) pairs attention computes: all, or those with key j ≤ query i."""
    if not causal:
        return sq * skv
    return sum(min(i + 1, skv) for i in range(sq))


def attention_flops(products: int):
    """2·D flops per visible (query, key) pair per product, for every head of the batch."""

    def flops(operands, results, attrs) -> int:
        b, h, sq, d = operands[0].shape
        skv = operands[1].shape[2]
        return 2 * d * products * b * h * visible_pairs(sq, skv, bool(attrs.get("causal")))

    return flops


ATTENTION_ATTRS = (
    Attr("causal", BOOL, False),
    Attr("scale", FLOAT, 1.0),
    Attr("dropout", FLOAT, 0.0),
    Attr("stream", INT, 0),
)


def describe_attention(node) -> str:
    words = ("causal" * bool(node.attr("causal")), f"dropout {node.attr('dropout'):g}" * (node.attr("dropout") > 0))
    return " ".join(filter(None, words))


def describe_attention_grad_kv(node) -> str:
    words = (
        describe_attention(node),
        "per query head" * bool(node.attr("per_query_head")),
        "writes dS" * bool(node.attr("scores")),
    )
    return " ".join(filter(None, words))


ATTENTION = Op(
    "attention",
    family=FAMILY,
    infer=infer_attention,
    evaluate=evaluate_attention,
    operands=("q", "k", "v", "state?"),
    attrs=ATTENTION_ATTRS,
    flops=attention_flops(2),
    describe=describe_attention,
    doc="(softmax(q·kᵀ·scale)·v, row log-sum-exp) with grouped KV heads and an optional causal mask",
)
ATTENTION_GRAD_Q = Op(
    "attention_grad_q",
    family=FAMILY,
    infer=infer_attention_grad_q,
    evaluate=evaluate_attention_grad_q,
    operands=("q", "k", "v", "delta", "lse", "do", "state?"),
    attrs=ATTENTION_ATTRS,
    flops=attention_flops(3),
    describe=describe_attention,
    doc="attention's gradient w.r.t. q",
)
ATTENTION_GRAD_KV = Op(
    "attention_grad_kv",
    family=FAMILY,
    infer=infer_attention_grad_kv,
    evaluate=evaluate_attention_grad_kv,
    operands=("q", "k", "v", "delta", "lse", "do", "state?"),
    attrs=(*ATTENTION_ATTRS, Attr("per_query_head", BOOL, False), Attr("scores", BOOL, False)),
    flops=attention_flops(4),
    describe=describe_attention_grad_kv,
    doc="attention's gradients w.r.t. k and v (per query head, or summed over each group), and with `scores` dS·scale",
)


@ATTENTION.vjp
def _attention(b, node, grads):
    """Flash-style backward: dQ and (dK, dV) each rebuild P = exp(q·kᵀ·scale − lse) from the
    forward's log-sum-exp (its second result), so the forward keeps no P; both read the rows'
    D = Σ dO∘O, reduced once here (`attention_delta`)."""
    g, g_lse = grads
    if g_lse is not None:
        raise NotImplementedError(f"autodiff: attention's log-sum-exp has no gradient rule ({', '.join(node.sources)})")
    q, k, v, *state = node.inputs
    attrs = {name: node.attr(name) for name in ("causal", "scale", "dropout", "stream")}
    delta = b.emit("sum", [b.emit("mul", [g, b.result(node.id, 0)])], axes=(3,), keepdim=False)
    operands = [q, k, v, delta, b.result(node.id, 1), g, *state]  # the same mask, drawn again
    grad_q = b.emit("attention_grad_q", operands, **attrs)
    grad_kv = b.emit("attention_grad_kv", operands, **attrs)
    return [grad_q, b.result(grad_kv, 0), b.result(grad_kv, 1), *(None for _ in state)]
