"""Functional ops with PyTorch's names and semantics (`import meganeura.functional as F`).

The primitive operations on tensors (elementwise functions, reshape, sum, softmax, matmul,
indexing, cat…) are defined once in `meganeura/tensor.py` and re-exported here; this module adds
the composite functions PyTorch keeps in torch.nn.functional, built on them: normalisations,
losses, embedding, attention, rotary embeddings, convolutions, pooling, distances, padding and
resampling. Python numbers are lifted to constants.

>>> # inside forward(): F.relu(F.linear(x, self.weight, self.bias))
"""

from __future__ import annotations

import builtins
import math
import warnings

import numpy as np

from meganeura.ir.op import ShapeError, broadcast_shapes, broadcasts_to
from meganeura.ir.ops.image import conv_output_size, pair
from meganeura.ir.ops.transformer import dropout_scale
from meganeura.ir.trace import user_source_line
from meganeura.parameter import Buffer
from meganeura.pytorch_names import missing_names
from meganeura.tensor import (  # noqa: F401  (re-exported: the primitive operations; erf, rsqrt, tanh are
    # among the elementwise functions generated from ir/functions.py)
    ELEMENTWISE,
    Tensor,
    abs,
    addmm,
    amax,
    amin,
    apply,
    apply_results,
    baddbmm,
    bmm,
    broadcast_to,
    cat,
    chunk,
    clamp,
    clip,
    dim_index,
    einsum,
    erf,
    exp,
    expand,
    flatten,
    getitem,
    is_number,
    leaky_relu,
    lift,
    log,
    log_softmax,
    logsumexp,
    masked_fill,
    matmul,
    mean,
    mm,
    narrow,
    norm,
    one_hot,
    outer,
    permute,
    pow,
    prod,
    random_tensor,
    reciprocal,
    relu,
    repeat_interleave,
    reshape,
    round,
    rsqrt,
    sigmoid,
    sign,
    softmax,
    softplus,
    split,
    sqrt,
    square,
    squeeze,
    stack,
    std,
    std_mean,
    sum,
    tanh,
    tile,
    transpose,
    transpose2d,
    unbind,
    unsqueeze,
    var,
    var_mean,
    vector_norm,
    where,
)

globals().update(ELEMENTWISE)  # exp, log, relu, sigmoid, tanh, silu, erf, abs, add, greater, … (ir/functions.py)

COMPOSITES = [
    "gelu", "linear", "bilinear", "rms_norm", "layer_norm", "nll_loss", "cross_entropy", "mse_loss", "embedding",
    "causal_mask",
    "scaled_dot_product_attention", "rotary_embedding", "apply_rotary_pos_emb", "rotary_tables",
    "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "fold", "unfold", "max_pool1d", "max_pool2d",
    "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool1d",
    "adaptive_max_pool2d", "batch_norm", "group_norm",
    "dropout", "dropout1d", "dropout2d",
    "elu", "selu", "celu", "hardtanh", "relu6", "hardsigmoid", "hardswish", "mish", "softsign", "logsigmoid",
    "tanhshrink", "softshrink", "hardshrink", "instance_norm",
]  # fmt: skip
LOSSES_AND_RESAMPLING = [
    "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div",
    "gaussian_nll_loss", "poisson_nll_loss", "margin_ranking_loss", "cosine_embedding_loss", "triplet_margin_loss",
    "normalize", "cosine_similarity", "pairwise_distance", "softmin", "glu", "pad", "interpolate",
]  # fmt: skip
TENSOR_COMPOSITES = [
    "split", "chunk", "unbind", "narrow", "stack", "tile", "repeat_interleave", "amin", "prod", "var", "std",
    "var_mean", "std_mean", "norm", "vector_norm", "logsumexp", "mm", "bmm", "outer", "addmm", "baddbmm", "einsum",
]  # fmt: skip
PRIMITIVES = [
    "amax", "broadcast_to", "cat", "clamp", "clip", "expand", "flatten", "getitem", "leaky_relu", "log_softmax",
    "masked_fill", "matmul", "mean", "permute", "pow", "reshape", "softmax", "softplus", "squeeze", "sum",
    "transpose", "transpose2d", "unsqueeze", "where", "reciprocal", "round", "sign", "square",
]  # fmt: skip
SELECTION = ["one_hot"]
__all__ = sorted({*COMPOSITES, *PRIMITIVES, *ELEMENTWISE, *SELECTION, *LOSSES_AND_RESAMPLING, *TENSOR_COMPOSITES})


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


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y_o = Σ_ij x1_i · weight[o, i, j] · x2_j + bias_o over the last dims (torch.nn.functional.bilinear;
    weight [out, in1, in2], leading dims of the inputs alike): an einsum of two products."""
    input1, input2, weight = lift(input1), lift(input2), lift(weight)
    if weight.ndim != 3 or input1.shape[-1:] != weight.shape[1:2] or input2.shape[-1:] != weight.shape[2:]:
        raise ShapeError(
            f"{user_source_line()}: bilinear: weight {weight.type} does not fit inputs {input1.type} and {input2.type}"
        )
    y = einsum("...i,oij,...j->...o", input1, weight, input2)
    return y if bias is None else y + bias


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


# ---------------------------------------------------------------------------------------------
# Losses, with PyTorch's signatures and formulas. Each is traced as the composition PyTorch's
# kernels compute (autodiff derives the backward; the e-graph fuses the pointwise parts). A
# `reduction` is "mean" (the default), "sum" or "none"; the deprecated size_average and reduce
# override it, as in PyTorch (`legacy_reduction`).


def legacy_reduction(size_average, reduce, reduction: str) -> str:
    """PyTorch's _Reduction.legacy_get_string: when size_average or reduce is given, they decide."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "mean" if size_average and reduce else "sum" if reduce else "none"


def check_reduction(reduction: str, name: str, allowed=("mean", "sum", "none")) -> None:
    if reduction not in allowed:
        raise ValueError(f"{user_source_line()}: {name}: reduction must be one of {list(allowed)}, got {reduction!r}")


def reduce_loss(values: Tensor, reduction: str, name: str) -> Tensor:
    """`values` reduced: their mean, their sum, or themselves ("none")."""
    check_reduction(reduction, name)
    if reduction == "mean":
        return mean(values)
    return sum(values) if reduction == "sum" else values


def float_operands(name: str, *tensors) -> list[Tensor]:
    tensors = [lift(t) for t in tensors]
    for t in tensors:
        if t.dtype != "f32":
            raise ShapeError(f"{user_source_line()}: {name}: expected f32 tensors, got {t.type}")
    return tensors


def pointwise_operands(name: str, input, target) -> tuple[Tensor, Tensor]:
    """input and target (f32), whose shapes must broadcast; PyTorch warns where they differ, so does this."""
    input, target = float_operands(name, input, target)
    if input.shape != target.shape:
        warnings.warn(
            f"{user_source_line()}: {name}: using a target size ({list(target.shape)}) that is different to the "
            f"input size ({list(input.shape)}); this will likely lead to incorrect results due to broadcasting",
            stacklevel=3,
        )
        try:
            broadcast_shapes(input.shape, target.shape, name)
        except ShapeError as error:
            raise ShapeError(f"{user_source_line()}: {error}") from None
    return input, target


def element_weight(name: str, weight, input: Tensor) -> Tensor | None:
    """The per-element weight of mse_loss, l1_loss and huber_loss: None or a tensor of input's size."""
    if weight is None:
        return None
    (weight,) = float_operands(name, weight)
    if weight.shape != input.shape:
        raise ValueError(f"{user_source_line()}: {name}: weights and input must have the same size")
    return weight


def weighted_loss(values: Tensor, weight: Tensor | None, reduction: str, name: str) -> Tensor:
    """mse_loss's and l1_loss's reduction: with a weight, "mean" is Σ w·loss / Σ w (as PyTorch)."""
    check_reduction(reduction, name)
    if weight is None:
        return reduce_loss(values, reduction, name)
    values = values * weight
    return sum(values) / sum(weight) if reduction == "mean" else reduce_loss(values, reduction, name)


def mse_loss(
    input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean", weight=None
) -> Tensor:
    """(input − target)², reduced (torch.nn.functional.mse_loss); with `weight` (input's size),
    "mean" divides Σ w·(input − target)² by Σ w."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input, target = pointwise_operands("mse_loss", input, target)
    diff = input - target
    return weighted_loss(diff * diff, element_weight("mse_loss", weight, input), reduction, "mse_loss")


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean", weight=None):
    """|input − target|, reduced (torch.nn.functional.l1_loss; the gradient is sign(input − target),
    0 at 0); with `weight`, "mean" divides Σ w·|input − target| by Σ w."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input, target = pointwise_operands("l1_loss", input, target)
    values = abs(input - target)
    return weighted_loss(values, element_weight("l1_loss", weight, input), reduction, "l1_loss")


def smooth_l1_loss(
    input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean", beta: float = 1.0
) -> Tensor:
    """0.5·d²/beta where |d| < beta, else |d| − 0.5·beta, d = input − target, reduced
    (torch.nn.functional.smooth_l1_loss; beta=0 is l1_loss)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    beta = float(beta)
    if beta < 0:
        raise ValueError(f"{user_source_line()}: smooth_l1_loss: beta must be non-negative, got {beta}")
    input, target = pointwise_operands("smooth_l1_loss", input, target)
    diff = input - target
    size = abs(diff)
    if beta == 0.0:
        return reduce_loss(size, reduction, "smooth_l1_loss")
    values = where(size < beta, diff * diff * (0.5 / beta), size - 0.5 * beta)
    return reduce_loss(values, reduction, "smooth_l1_loss")


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0, weight=None) -> Tensor:
    """0.5·d² where |d| < delta, else delta·(|d| − 0.5·delta), d = input − target, reduced
    (torch.nn.functional.huber_loss); with `weight` (input's size) each term is weighted and
    "mean" is the mean of the weighted terms, as in PyTorch."""
    delta = float(delta)
    if delta <= 0:
        raise ValueError(f"{user_source_line()}: huber_loss: delta must be positive, got {delta}")
    input, target = pointwise_operands("huber_loss", input, target)
    weight = element_weight("huber_loss", weight, input)
    diff = input - target
    size = abs(diff)
    values = where(size < delta, diff * diff * 0.5, (size - 0.5 * delta) * delta)
    return reduce_loss(values if weight is None else values * weight, reduction, "huber_loss")


def binary_cross_entropy(
    input: Tensor, target: Tensor, weight=None, size_average=None, reduce=None, reduction: str = "mean"
) -> Tensor:
    """−w·(target·log(input) + (1 − target)·log(1 − input)), each log clamped at −100 as PyTorch
    does, reduced (torch.nn.functional.binary_cross_entropy; `weight` broadcasts to input).
    log(1 − input) is not log1p(−input): below 1e-7 the two differ by less than f32's rounding of
    the sum. Where a log is clamped the gradient of its term is 0 (PyTorch divides by max(x·(1 −
    x), 1e-12) instead); an input outside [0, 1] gives NaN (PyTorch raises)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input, target = float_operands("binary_cross_entropy", input, target)
    if input.shape != target.shape:
        raise ValueError(
            f"{user_source_line()}: binary_cross_entropy: using a target size ({list(target.shape)}) that is "
            f"different to the input size ({list(input.shape)}) is deprecated; please ensure they have the same size"
        )
    log_p = clamp(log(input), min=-100.0)
    log_q = clamp(log(1.0 - input), min=-100.0)
    values = (target - 1.0) * log_q - target * log_p
    if weight is not None:
        values = values * float_operands("binary_cross_entropy", weight)[0]
    return reduce_loss(values, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(
    input: Tensor,
    target: Tensor,
    weight=None,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
    pos_weight=None,
) -> Tensor:
    """Sigmoid and binary cross-entropy in PyTorch's stable form,
    (1 − target)·x + (1 + (pos_weight − 1)·target)·softplus(−x), times weight, reduced
    (torch.nn.functional.binary_cross_entropy_with_logits; weight and pos_weight broadcast, pos_weight
    along the last dim, the classes)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input, target = float_operands("binary_cross_entropy_with_logits", input, target)
    if input.shape != target.shape:
        raise ValueError(
            f"{user_source_line()}: binary_cross_entropy_with_logits: target size ({list(target.shape)}) must be "
            f"the same as input size ({list(input.shape)})"
        )
    log_sigmoid_neg = softplus(-input)  # −log σ(x) = log(1 + e⁻ˣ), stable for every x
    if pos_weight is not None:
        (pos_weight,) = float_operands("binary_cross_entropy_with_logits", pos_weight)
        log_sigmoid_neg = log_sigmoid_neg * ((pos_weight - 1.0) * target + 1.0)
    values = (1.0 - target) * input + log_sigmoid_neg
    if weight is not None:
        values = values * float_operands("binary_cross_entropy_with_logits", weight)[0]
    return reduce_loss(values, reduction, "binary_cross_entropy_with_logits")


def kl_div(
    input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean", log_target: bool = False
) -> Tensor:
    """Pointwise KL divergence of log-probabilities `input` from `target` (torch.nn.functional.kl_div):
    target·(log target − input), 0 where target is 0 (xlogy); with log_target, exp(target)·(target −
    input). reduction "batchmean" divides the sum by input.size(0); "mean" by the element count."""
    if size_average is not None or reduce is not None:
        reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction, "kl_div", ("mean", "batchmean", "sum", "none"))
    input, target = float_operands("kl_div", input, target)  # they broadcast, without PyTorch's warning
    if log_target:
        values = exp(target) * (target - input)
    else:
        values = where(target == 0.0, 0.0, target * log(target)) - target * input
    if reduction == "batchmean":
        total = sum(values)
        return total if input.ndim == 0 else total * (1.0 / input.shape[0])
    return reduce_loss(values, reduction, "kl_div")


def gaussian_nll_loss(
    input: Tensor,
    target: Tensor,
    var,  # noqa: F811 (PyTorch's name: it shadows the re-exported var function in here)
    full: bool = False,
    eps: float = 1e-6,
    reduction: str = "mean",
) -> Tensor:
    """0.5·(log(max(var, eps)) + (input − target)² / max(var, eps)) (+ 0.5·log 2π with full),
    reduced (torch.nn.functional.gaussian_nll_loss; var as input's shape, one dim short of it, with
    one dim of size 1, or a number). As PyTorch, var is clamped outside autograd: where var < eps
    its value is eps and its gradient that of the unclamped var. A negative var gives NaN (PyTorch
    raises)."""
    check_reduction(reduction, "gaussian_nll_loss")
    input, target = float_operands("gaussian_nll_loss", input, target)
    if is_number(var):
        if var < 0:
            raise ValueError(f"{user_source_line()}: gaussian_nll_loss: var has negative entry/entries")
        var = lift(float(var))
    else:
        (var,) = float_operands("gaussian_nll_loss", var)
        if var.shape != input.shape:
            if input.shape[:-1] == var.shape:
                var = unsqueeze(var, -1)
            elif not (
                var.ndim == input.ndim
                and builtins.sum(v for i, v in zip(input.shape, var.shape, strict=True) if i != v) == 1
            ):
                raise ValueError(f"{user_source_line()}: gaussian_nll_loss: var is of incorrect size {var.type}")
    var = clamped_outside_autograd(var, float(eps))
    diff = input - target
    values = (log(var) + diff * diff / var) * 0.5
    if full:
        values = values + 0.5 * math.log(2 * math.pi)
    return reduce_loss(values, reduction, "gaussian_nll_loss")


def poisson_nll_loss(
    input: Tensor,
    target: Tensor,
    log_input: bool = True,
    full: bool = False,
    size_average=None,
    eps: float = 1e-8,
    reduce=None,
    reduction: str = "mean",
) -> Tensor:
    """exp(input) − target·input (log_input) or input − target·log(input + eps), plus with full
    Stirling's target·log(target) − target + 0.5·log(2π·target) where target > 1, reduced
    (torch.nn.functional.poisson_nll_loss)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction, "poisson_nll_loss")
    input, target = float_operands("poisson_nll_loss", input, target)
    values = exp(input) - target * input if log_input else input - target * log(input + float(eps))
    if full:
        safe = where(target > 1.0, target, 1.0)
        stirling = safe * log(safe) - safe + log(safe * (2 * math.pi)) * 0.5
        values = values + where(target > 1.0, stirling, 0.0)
    return reduce_loss(values, reduction, "poisson_nll_loss")


def margin_ranking_loss(
    input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0, size_average=None, reduce=None, reduction="mean"
) -> Tensor:
    """max(0, −target·(input1 − input2) + margin), reduced (torch.nn.functional.margin_ranking_loss)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input1, input2, target = float_operands("margin_ranking_loss", input1, input2, target)
    if not input1.ndim == input2.ndim == target.ndim:
        raise ShapeError(
            f"{user_source_line()}: margin_ranking_loss: all input tensors should have the same number of dims, got "
            f"{input1.type}, {input2.type} and {target.type}"
        )
    return reduce_loss(relu(-target * (input1 - input2) + float(margin)), reduction, "margin_ranking_loss")


def cosine_embedding_loss(
    input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0, size_average=None, reduce=None, reduction="mean"
) -> Tensor:
    """1 − cos(input1, input2) where target is 1, max(0, cos − margin) where it is −1, 0 elsewhere,
    with PyTorch's cos = Σ x1·x2 / √((Σ x1² + 1e-12)·(Σ x2² + 1e-12)) over the last dim
    (torch.nn.functional.cosine_embedding_loss; inputs [N, D] with target [N], or [D] with [])."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input1, input2, target = float_operands("cosine_embedding_loss", input1, input2, target)
    if input1.shape != input2.shape or input1.ndim not in (1, 2) or target.shape != input1.shape[:-1]:
        raise ShapeError(
            f"{user_source_line()}: cosine_embedding_loss: expected inputs [N, D] with a target [N] (or [D] with []), "
            f"got {input1.type}, {input2.type} and {target.type}"
        )
    dim = target.ndim
    dot = sum(input1 * input2, dim)
    squares = (sum(input1 * input1, dim) + 1e-12) * (sum(input2 * input2, dim) + 1e-12)
    cos = dot / sqrt(squares)
    values = where(target == 1.0, 1.0 - cos, 0.0) + where(target == -1.0, relu(cos - float(margin)), 0.0)
    return reduce_loss(values, reduction, "cosine_embedding_loss")


def triplet_margin_loss(
    anchor: Tensor,
    positive: Tensor,
    negative: Tensor,
    margin: float = 1.0,
    p: float = 2,
    eps: float = 1e-6,
    swap: bool = False,
    size_average=None,
    reduce=None,
    reduction: str = "mean",
) -> Tensor:
    """max(0, margin + d(anchor, positive) − d(anchor, negative)) with d = pairwise_distance(·, ·, p,
    eps) (and, with swap, the smaller of d(anchor, negative) and d(positive, negative)), reduced
    (torch.nn.functional.triplet_margin_loss)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    anchor, positive, negative = float_operands("triplet_margin_loss", anchor, positive, negative)
    if not anchor.ndim == positive.ndim == negative.ndim or anchor.ndim not in (1, 2):
        raise ShapeError(
            f"{user_source_line()}: triplet_margin_loss: expected anchor, positive and negative of 1 or 2 dims "
            f"alike, got {anchor.type}, {positive.type} and {negative.type}"
        )
    to_positive = pairwise_distance(anchor, positive, p, eps)
    to_negative = pairwise_distance(anchor, negative, p, eps)
    if swap:
        to_negative = clamp(to_negative, max=pairwise_distance(positive, negative, p, eps))
    return reduce_loss(relu(to_positive - to_negative + float(margin)), reduction, "triplet_margin_loss")


# -- classification losses: nll_loss and cross_entropy ----------------------------------------
#
# A class-index target selects with `pick` (ir/ops/indexing.py), whose ignore_index attribute
# makes a row with that label 0 (and its gradient row zeros); the class weight of each target is
# a `pick` from the [C] weight table (from ones without a weight), so that "mean" divides by the
# summed weights of the targets not ignored, as PyTorch does. nll_loss(log_softmax(x, 1), y)
# keeps the form the e-graph fuses into the cross-entropy kernels (rewrite/reductions.py).


def class_rows(name: str, input: Tensor, target: Tensor, what: str) -> tuple[Tensor, Tensor, tuple[int, ...]]:
    """input [N, C, d1, …] (or [C]) as rows [M, C], classes last; i32 target [N, d1, …] (or []) as
    [M]; and the target's shape (the shape of the "none" losses)."""
    at = user_source_line()
    if input.dtype != "f32" or input.ndim < 1:
        raise ShapeError(f"{at}: {name}: expected f32 {what} [N, C] (or [C], or [N, C, d1, …]), got {input.type}")
    expected = () if input.ndim == 1 else (input.shape[0], *input.shape[2:])
    if target.dtype != "i32" or target.shape != expected:
        raise ShapeError(
            f"{at}: {name}: expected i32 class labels {list(expected)} for {what} {input.type}, got {target.type}"
        )
    classes = input.shape[0] if input.ndim == 1 else input.shape[1]
    if input.ndim > 2:
        input = permute(input, (0, *range(2, input.ndim), 1))
    return reshape(input, (-1, classes)), reshape(target, (-1,)), expected


def class_weights(name: str, weight, classes: int) -> Tensor | None:
    if weight is None:
        return None
    if isinstance(weight, str):
        raise TypeError(
            f"{user_source_line()}: {name}: the third argument is PyTorch's weight (a [C] tensor), got {weight!r}; "
            "pass the reduction by keyword: reduction=..."
        )
    weight = lift(weight)
    if weight.dtype != "f32" or weight.shape != (classes,):
        raise ShapeError(
            f"{user_source_line()}: {name}: expected a weight f32[{classes}] (one per class), got {weight.type}"
        )
    return weight


def target_weights(table: Tensor | None, labels: Tensor, ignore_index: int) -> Tensor:
    """weight[labels[i]] per row (1 without a weight table), 0 where the label is ignore_index."""
    return apply("pick", 1.0 if table is None else table, labels, ignore_index=ignore_index)


def nll_of_rows(name, log_probs, labels, shape, weight, ignore_index: int, reduction: str) -> Tensor:
    """nll_loss of log-probability rows [M, C] at labels [M], the "none" losses shaped `shape`."""
    check_reduction(reduction, name)
    classes = log_probs.shape[1]
    table = class_weights(name, weight, classes)
    losses = -apply("pick", log_probs, labels, ignore_index=ignore_index)
    weights = target_weights(table, labels, ignore_index) if table is not None or reduction == "mean" else None
    if table is not None:
        losses = losses * weights
    if reduction == "none":
        return reshape(losses, shape)
    return sum(losses) if reduction == "sum" else sum(losses) / sum(weights)


def nll_loss(
    input: Tensor,
    target: Tensor,
    weight=None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
) -> Tensor:
    """−weight[target]·input[target] per target, like torch.nn.functional.nll_loss: input holds
    log-probabilities [N, C] (or [C], or [N, C, d1, …] with the class dim 1), target i32 class
    indices [N] (or [], or [N, d1, …]). A target equal to ignore_index contributes 0; "mean"
    divides the sum by the summed weights of the other targets (NaN when all are ignored)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    input, target = lift(input), lift(target)
    rows, labels, shape = class_rows("nll_loss", input, target, "log-probabilities")
    return nll_of_rows("nll_loss", rows, labels, shape, weight, int(ignore_index), reduction)


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight=None,
    size_average=None,
    ignore_index: int = -100,
    reduce=None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Softmax cross-entropy of logits [N, C] (or [C], or [N, C, d1, …] with the class dim 1), like
    torch.nn.functional.cross_entropy: with i32 class indices [N] (or [], [N, d1, …]) it is
    nll_loss(log_softmax(input, 1), target, weight, ignore_index=…), traced as written (the e-graph
    turns it, and its gradient, into the fused cross-entropy kernels); with f32 class probabilities
    of input's shape it is −Σ_c weight_c·target_c·log_softmax(input)_c, "mean" over the positions.
    label_smoothing ε mixes in the uniform distribution as PyTorch does: (1 − ε)·nll + ε/C·(−Σ_c
    weight_c·log p_c), the smoothing term reduced like nll (ignored targets excluded)."""
    reduction = legacy_reduction(size_average, reduce, reduction)
    check_reduction(reduction, "cross_entropy")
    input, target = lift(input), lift(target)
    smoothing = float(label_smoothing)
    if not 0.0 <= smoothing <= 1.0:
        raise ValueError(f"{user_source_line()}: cross_entropy: label_smoothing must be in [0, 1], got {smoothing}")
    if target.dtype == "f32" and target.shape == input.shape:  # class probabilities, as PyTorch tells them apart
        return cross_entropy_probabilities(input, target, weight, reduction, smoothing)
    rows, labels, shape = class_rows("cross_entropy", input, target, "logits")
    log_probs = log_softmax(rows, 1)
    ignore = int(ignore_index)
    nll = nll_of_rows("cross_entropy", log_probs, labels, shape, weight, ignore, reduction)
    if smoothing == 0.0:
        return nll
    classes = rows.shape[1]
    table = class_weights("cross_entropy", weight, classes)
    smooth = -sum(log_probs if table is None else log_probs * table, 1)
    kept = target_weights(None, labels, ignore)  # 1, or 0 where the target is ignored
    smooth = where(kept, smooth, 0.0)
    if reduction == "none":
        smooth = reshape(smooth, shape)
    elif reduction == "sum":
        smooth = sum(smooth)
    else:
        smooth = sum(smooth) / sum(kept if table is None else target_weights(table, labels, ignore))
    return nll * (1.0 - smoothing) + smooth * (smoothing / classes)


def cross_entropy_probabilities(input: Tensor, target: Tensor, weight, reduction: str, smoothing: float) -> Tensor:
    """cross_entropy with class probabilities: −Σ_c w_c·t_c·log_softmax(input)_c per position."""
    if input.dtype != "f32" or input.ndim < 1:
        raise ShapeError(f"{user_source_line()}: cross_entropy: expected f32 logits, got {input.type}")
    classes = input.shape[0] if input.ndim == 1 else input.shape[1]
    positions = () if input.ndim == 1 else (input.shape[0], *input.shape[2:])
    if input.ndim > 2:
        order = (0, *range(2, input.ndim), 1)
        input, target = permute(input, order), permute(target, order)
    rows, target = reshape(input, (-1, classes)), reshape(target, (-1, classes))
    if smoothing:
        target = target * (1.0 - smoothing) + smoothing / classes
    terms = log_softmax(rows, 1) * target
    table = class_weights("cross_entropy", weight, classes)
    losses = -sum(terms if table is None else terms * table, 1)
    if reduction == "none":
        return reshape(losses, positions)
    return reduce_loss(losses, reduction, "cross_entropy")


# ---------------------------------------------------------------------------------------------
# Vector normalisation and distances, softmin and glu, traced from reductions and elementwise ops.


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out=None) -> Tensor:
    """input / max(‖input‖_p, eps) along `dim` (torch.nn.functional.normalize); out must be None."""
    if out is not None:
        raise NotImplementedError(f"{user_source_line()}: normalize: out= is not supported")
    x = lift(input)
    return x / clamp(vector_norm(x, p, dim, keepdim=True), min=float(eps))


def clamped_outside_autograd(x: Tensor, low: float) -> Tensor:
    """max(x, low) whose gradient is x's own (PyTorch's `with torch.no_grad(): x.clamp_(min=low)`
    on a tensor autograd tracks)."""
    return apply("value_with_gradient_of", clamp(x, min=low), x)


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """Σ (x1 / max(‖x1‖, eps))·(x2 / max(‖x2‖, eps)) along `dim`, PyTorch's current formula
    (torch.nn.functional.cosine_similarity; x1 and x2 broadcast). As PyTorch, the norms are clamped
    outside autograd: a norm below eps divides as eps, its gradient that of the unclamped norm."""
    x1, x2 = lift(x1), lift(x2)
    try:
        shape = broadcast_shapes(x1.shape, x2.shape, "cosine_similarity")
    except ShapeError as error:
        raise ShapeError(f"{user_source_line()}: {error}") from None
    x1, x2 = broadcast_to(x1, shape), broadcast_to(x2, shape)
    unit1 = x1 / clamped_outside_autograd(vector_norm(x1, 2, dim, keepdim=True), float(eps))
    unit2 = x2 / clamped_outside_autograd(vector_norm(x2, 2, dim, keepdim=True), float(eps))
    return sum(unit1 * unit2, dim)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False) -> Tensor:
    """‖x1 − x2 + eps‖_p over the last dim (torch.nn.functional.pairwise_distance)."""
    x1, x2 = lift(x1), lift(x2)
    return vector_norm(x1 - x2 + float(eps), p, -1, keepdim)


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    """softmax(−input, dim) (torch.nn.functional.softmin); dim=None takes PyTorch's implicit dim
    (0 for 0-, 1- and 3-D input, else 1); dtype must be None."""
    x = lift(input)
    if dtype is not None:
        raise NotImplementedError(f"{user_source_line()}: softmin: dtype is not supported")
    if dim is None:
        warnings.warn("Implicit dimension choice for softmin has been deprecated", stacklevel=2)
        dim = 0 if x.ndim in (0, 1, 3) else 1
    return softmax(-x, dim)


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """a·sigmoid(b) for the halves a, b of input along `dim` (torch.nn.functional.glu)."""
    x = lift(input)
    axis = dim_index(x, dim, "glu")
    if x.shape[axis] % 2:
        raise ShapeError(f"{user_source_line()}: glu: halving only works on an even dim, got {x.type} at dim {dim}")
    a, b = chunk(x, 2, axis)
    return a * sigmoid(b)


# ---------------------------------------------------------------------------------------------
# Padding and resampling, traced from slices, concat and broadcasts: no index tensors, no
# constant matrices. A resampled dim is built per phase (the output positions t, t + b, t + 2b…
# that the in/out ratio a/b maps onto input positions a apart): each phase is a weighted sum of
# two strided slices of the input (one for nearest), and the phases are interleaved by a stack
# and a reshape; the few positions near the edges that clamping moves are slices of their own.


def pad(input: Tensor, pad, mode: str = "constant", value: float | None = None) -> Tensor:
    """torch.nn.functional.pad: pad = (left, right) pairs for the last dim first, then the one
    before…; negative sizes crop. mode "constant" (value, 0 by default; any number of dims),
    "reflect", "replicate" or "circular" (the last 1-3 dims of an input with 1 or 2 more)."""
    x = lift(input)
    at = user_source_line()
    sizes = [int(p) for p in pad]
    if len(sizes) % 2 or len(sizes) // 2 > x.ndim:
        raise ValueError(f"{at}: pad: padding length must be even and at most twice the {x.ndim} dims, got {sizes}")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        raise NotImplementedError(f"{at}: pad: mode {mode!r} is not supported (constant, reflect, replicate, circular)")
    dims = len(sizes) // 2
    if mode != "constant":
        if value not in (None, 0, 0.0):
            raise ValueError(f"{at}: pad: padding mode {mode!r} doesn't take in value argument")
        if not 1 <= dims <= 3 or x.ndim not in (dims + 1, dims + 2):
            raise NotImplementedError(
                f"{at}: pad: {mode} padding of the last {dims} dim(s) needs a {dims + 1}-D or {dims + 2}-D input, "
                f"got {x.type}"
            )
    fill = 0.0 if value is None else float(value)
    for index in range(dims):
        axis = x.ndim - 1 - index
        before, after = sizes[2 * index], sizes[2 * index + 1]
        x = pad_dim(x, axis, before, after, mode, fill, at)
    return x


def pad_dim(x: Tensor, axis: int, before: int, after: int, mode: str, fill: float, at: str) -> Tensor:
    """x padded along one dim (negative sizes crop first)."""
    size = x.shape[axis]
    if before < 0 or after < 0:
        start, stop = max(-before, 0), size - max(-after, 0)
        if stop < start:
            raise ValueError(f"{at}: pad: cropping {-before} and {-after} from a dim of size {size} leaves nothing")
        x = narrow(x, axis, start, stop - start)
        before, after, size = max(before, 0), max(after, 0), stop - start
    if not before and not after:
        return x
    if mode == "reflect" and (before >= size or after >= size):
        raise ValueError(f"{at}: pad: reflect padding ({before}, {after}) must be less than the dim size {size}")
    if mode == "circular" and (before > size or after > size):
        raise ValueError(f"{at}: pad: circular padding ({before}, {after}) may not exceed the dim size {size}")
    if mode in ("replicate", "reflect", "circular") and size == 0:
        raise ValueError(f"{at}: pad: {mode} padding needs a non-empty dim, got {x.type}")

    def block(count: int, left: bool) -> list[Tensor]:
        if not count:
            return []
        if mode == "constant":
            return [broadcast_to(fill, x.shape[:axis] + (count,) + x.shape[axis + 1 :])]
        if mode == "replicate":
            edge = narrow(x, axis, 0 if left else size - 1, 1)
            return [broadcast_to(edge, x.shape[:axis] + (count,) + x.shape[axis + 1 :])]
        if mode == "circular":
            return [narrow(x, axis, size - count, count) if left else narrow(x, axis, 0, count)]
        # reflect: x[count], …, x[1] before; x[size − 2], …, x[size − 1 − count] after
        order = range(count, 0, -1) if left else range(size - 2, size - 2 - count, -1)
        return [narrow(x, axis, i, 1) for i in order]

    return cat([*block(before, True), x, *block(after, False)], axis)


def interpolate(
    input: Tensor,
    size=None,
    scale_factor=None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
) -> Tensor:
    """torch.nn.functional.interpolate of [N, C, *spatial] (1-3 spatial dims) to `size` or by
    `scale_factor`, with PyTorch's index rules: "nearest" (src = floor(dst·scale), scale in/out or
    1/scale_factor, computed in float32 as PyTorch does), "nearest-exact" (floor((dst + ½)·scale)),
    "linear"/"bilinear"/"trilinear" (align_corners False: src = max((dst + ½)·scale − ½, 0); True:
    dst·(in − 1)/(out − 1)), and "area" where each output dim divides its input dim. Not supported:
    "bicubic", "area" with other sizes, antialias."""
    x = lift(input)
    at = user_source_line()
    spatial = x.ndim - 2
    if not 1 <= spatial <= 3:
        raise ShapeError(f"{at}: interpolate: expected a 3-D, 4-D or 5-D input [N, C, *spatial], got {x.type}")
    linear_modes = {"linear": 1, "bilinear": 2, "trilinear": 3}
    if mode not in ("nearest", "nearest-exact", "area", *linear_modes):
        raise NotImplementedError(
            f"{at}: interpolate: mode {mode!r} is not supported (nearest, nearest-exact, linear, bilinear, "
            "trilinear, area)"
        )
    if mode in linear_modes and linear_modes[mode] != spatial:
        raise NotImplementedError(
            f"{at}: interpolate: mode {mode!r} needs {linear_modes[mode] + 2}-D input, got {x.type}"
        )
    if align_corners is not None and mode not in linear_modes:
        raise ValueError(f"{at}: interpolate: align_corners option can only be set with the interpolating modes")
    if antialias:
        raise NotImplementedError(f"{at}: interpolate: antialias=True is not supported")
    sizes, scales = output_sizes(x.shape[2:], size, scale_factor, recompute_scale_factor, at)
    for index, (length, scale) in enumerate(zip(sizes, scales, strict=True)):
        axis = 2 + index
        if mode == "area":
            x = area_resample(x, axis, length, at)
        else:
            x = resample(x, axis, resample_taps(x.shape[axis], length, scale, mode, bool(align_corners)))
    return x


def output_sizes(shape, size, scale_factor, recompute: bool | None, at: str):
    """(the output size, the scale PyTorch's kernels use or None) per spatial dim."""
    count = len(shape)
    if (size is None) == (scale_factor is None):
        raise ValueError(f"{at}: interpolate: only one of size or scale_factor should be defined")
    if size is not None:
        sizes = [int(size)] * count if isinstance(size, (int, np.integer)) else [int(s) for s in size]
        if len(sizes) != count:
            raise ValueError(f"{at}: interpolate: size {size!r} must have {count} entries for {count} spatial dims")
        return sizes, [None] * count
    factors = [float(scale_factor)] * count if is_number(scale_factor) else [float(f) for f in scale_factor]
    if len(factors) != count:
        raise ValueError(f"{at}: interpolate: scale_factor {scale_factor!r} must have {count} entries")
    sizes = [math.floor(float(n) * f) for n, f in zip(shape, factors, strict=True)]
    return sizes, [None if recompute else f for f in factors]


def kernel_scale(length: int, out: int, scale: float | None, dtype) -> float:
    """PyTorch's compute_scales_value: 1/scale_factor where one was given, else in/out."""
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(length) / dtype(out)


def resample_taps(length: int, out: int, scale: float | None, mode: str, align_corners: bool) -> list:
    """Per output position, its (input index, weight) pairs, as PyTorch's upsample kernels compute them."""
    if out <= 0:
        raise ValueError(f"{user_source_line()}: interpolate: output size {out} must be positive")
    if mode in ("nearest", "nearest-exact"):
        if mode == "nearest" and out == length:
            return [((i, 1.0),) for i in range(out)]
        if mode == "nearest" and out == 2 * length:  # PyTorch's nearest_idx shortcuts (none for nearest-exact)
            return [((i // 2, 1.0),) for i in range(out)]
        ratio = kernel_scale(length, out, scale, np.float32)
        if mode == "nearest":  # floorf(dst·scale) in float
            index = [int(np.floor(np.float32(i) * ratio)) for i in range(out)]
        else:  # floorf((dst + 0.5)·scale): dst + 0.5 is a double
            index = [int(np.floor((i + 0.5) * float(ratio))) for i in range(out)]
        return [((min(i, length - 1), 1.0),) for i in index]
    if out == length:  # compute_source_index_and_lambda copies
        return [((i, 1.0),) for i in range(out)]
    if align_corners:
        ratio = (length - 1) / (out - 1) if out > 1 else 0.0
    else:
        ratio = kernel_scale(length, out, scale, float)
    taps = []
    for i in range(out):
        source = ratio * i if align_corners else max(ratio * (i + 0.5) - 0.5, 0.0)
        low = min(int(math.floor(source)), length - 1)
        weight = min(max(source - low, 0.0), 1.0)
        high = low + (1 if low < length - 1 else 0)
        taps.append(((low, 1.0 - weight), (high, weight)))
    return taps


def resample(x: Tensor, axis: int, taps: list) -> Tensor:
    """x along `axis` resampled: output position j is Σ weight·x[index] over taps[j].

    The ratio in/out reduced to a/b: output positions t + b·k (a phase) read inputs a·k apart, so
    each phase is a sum of strided slices; a run of a phase breaks where a tap does not follow
    that stride (the edges) and starts a slice of its own. The phases are interleaved by stacking
    them on a new dim after `axis` and merging the two."""
    length, out = x.shape[axis], len(taps)
    period = math.gcd(length, out)
    a, b = length // period, out // period
    phases = []
    for t in range(b):
        positions = taps[t::b]
        runs = [[positions[0]]]
        for tap in positions[1:]:
            last = runs[-1][-1]
            step = len(tap) == len(last) and all(
                i == j + a and builtins.abs(w - v) <= 1e-12 for (i, w), (j, v) in zip(tap, last, strict=True)
            )
            if step:
                runs[-1].append(tap)
            else:
                runs.append([tap])
        phases.append(cat([tap_run(x, axis, run, a) for run in runs], axis))
    if b == 1:
        return phases[0]
    joined = stack(phases, axis + 1)
    return reshape(joined, x.shape[:axis] + (out,) + x.shape[axis + 1 :])


def tap_run(x: Tensor, axis: int, run: list, stride: int) -> Tensor:
    """Σ over a tap's terms of weight·x[index + stride·k, k < len(run)] along `axis`."""
    total = None
    for index, weight in run[0]:
        if weight == 0.0:
            continue
        rows = getitem(x, (slice(None),) * axis + (slice(index, index + stride * (len(run) - 1) + 1, stride),))
        term = rows if weight == 1.0 else rows * weight
        total = term if total is None else total + term
    if total is None:  # every weight 0 (cannot happen for PyTorch's taps, whose weights sum to 1)
        total = getitem(x, (slice(None),) * axis + (slice(0, len(run)),)) * 0.0
    return total


def area_resample(x: Tensor, axis: int, out: int, at: str) -> Tensor:
    """interpolate(mode="area") along `axis` where `out` divides the dim: the mean of each block."""
    length = x.shape[axis]
    if out <= 0 or length % out:
        raise NotImplementedError(
            f"{at}: interpolate: mode 'area' is supported where the output size divides the input size, "
            f"got {length} → {out}"
        )
    blocks = reshape(x, x.shape[:axis] + (out, length // out) + x.shape[axis + 1 :])
    return mean(blocks, axis + 1)


def embedding(
    input: Tensor,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """Rows of `weight` [num_embeddings, embedding_dim] at i32 indices `input` of any shape:
    the result is [*input.shape, embedding_dim] (torch.nn.functional.embedding). The gradient is
    a scatter-add of the incoming rows into [num_embeddings, embedding_dim]; with padding_idx
    (negative counts from the end) the lookups of that row give its value and no gradient.
    max_norm and scale_grad_by_freq are not supported; sparse changes nothing (dense gradients)."""
    input, weight = lift(input), lift(weight)
    if input.dtype != "i32":
        raise ShapeError(f"{user_source_line()}: embedding: expected i32 indices, got {input.type}")
    if max_norm is not None or scale_grad_by_freq:
        raise NotImplementedError(f"{user_source_line()}: embedding: max_norm and scale_grad_by_freq are not supported")
    rows = apply("gather", weight, input)
    if padding_idx is None:
        return rows
    count = weight.shape[0]
    if not -count <= int(padding_idx) < count:
        raise ValueError(f"{user_source_line()}: embedding: Padding_idx must be within num_embeddings")
    padding_idx = int(padding_idx) % count
    # keep: 1 for every row but padding_idx, looked up as a [num, 1] table; the padding lookups
    # then read the row's value through a detach (no gradient), as torch's padding_idx.
    runs = ((1.0, padding_idx), (0.0, 1), (1.0, count - padding_idx - 1))
    keep = apply("gather", cat([broadcast_to(lift(value), (n, 1)) for value, n in runs if n], 0), input)
    return rows * keep + rows.detach() * (1.0 - keep)


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

    Without a mask, one fused op (`attention`): the forward kernel runs an online softmax and
    never writes the scores; the backward recomputes them from the row log-sum-exp. dropout_p > 0
    (applied whatever the training mode, as PyTorch) is drawn inside those kernels, each drawing
    the weights' mask again from the step's random stream (ir/ops/transformer.py). With a mask,
    traced as written (batched matmuls, the softmax of the masked scores, dropout of the weights),
    whose scores [batch, heads, seq_q, seq_kv] are a buffer: the fused kernels take no mask operand.
    """
    query, key, value = lift(query), lift(key), lift(value)
    at = user_source_line()
    dropout_p = dropout_probability(dropout_p, "scaled_dot_product_attention: dropout_p")
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
        return fused_attention(query, key, value, bool(is_causal), scale, dropout_p)
    return masked_attention(query, key, value, lift(attn_mask), scale, at, dropout_p)


def fused_attention(query: Tensor, key: Tensor, value: Tensor, causal: bool, scale: float, p: float) -> Tensor:
    """The `attention` op's output; with p > 0 it reads the step's RNG state and a stream of its own."""
    if p == 0.0:
        out, _ = apply_results("attention", query, key, value, causal=causal, scale=scale)
        return out
    if p == 1.0:  # every weight dropped: zeros (NaN where the weights are NaN), as PyTorch
        return fused_attention(query, key, value, causal, scale, 0.0) * 0.0
    tracer = query.tracer
    state = Tensor(tracer, tracer.rng_state())
    stream = tracer.next_stream()
    out, _ = apply_results("attention", query, key, value, state, causal=causal, scale=scale, dropout=p, stream=stream)
    return out


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


def masked_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor, scale: float, at: str, dropout_p: float = 0.0
) -> Tensor:
    """torch's reference attention with a mask: scores = q·kᵀ·scale + bias (bias = mask, or 0 where
    a boolean mask holds and −inf elsewhere), KV heads repeated for grouped queries, a softmax
    that gives a row of hidden keys zeros (torch's _safe_softmax), not NaN, and dropout of the
    weights with probability dropout_p."""
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
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return apply("matmul", weights, value)


def dropout_probability(p, name: str) -> float:
    """`p` as a float in [0, 1], or PyTorch's ValueError."""
    if not isinstance(p, (int, float, np.integer, np.floating)) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{user_source_line()}: {name} probability has to be between 0 and 1, but got {p}")
    return float(p)


def dropout_mask(shape: tuple[int, ...], p: float) -> Tensor:
    """1/(1−p) where a uniform draw is ≥ p (probability 1 − p), else 0, of `shape` (0 < p < 1): the
    factor PyTorch multiplies by, its scale an f32 quotient as torch's `noise.div_(1 - p)`."""
    keep = random_tensor(shape, normal=False) >= p
    return keep * dropout_scale(p)


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


def convolution_operands(op: str, input, weight, groups, dims: int, transposed: bool, at: str):
    """(input as [N, C, *spatial], weight, groups, whether the input was unbatched) of a `dims`-D
    convolution or transposed convolution, checked as torch checks them: the weight's rank, groups
    dividing its first dim, the input's rank and channels (C = weight.shape[0] when transposed,
    weight.shape[1]·groups otherwise)."""
    x, weight = lift(input), lift(weight)
    kernel, spatial = ("k", "L") if dims == 1 else ("kh, kw", "H, W")
    layout = "in_channels, out_channels/groups" if transposed else "out_channels, in_channels/groups"
    if weight.ndim != dims + 2:
        raise ShapeError(f"{at}: {op}: expected a weight [{layout}, {kernel}], got {weight.type}")
    groups = group_count(op, groups, weight.shape[0], at)
    channels = weight.shape[0] if transposed else weight.shape[1] * groups
    expected = f"[N, {channels}, {spatial}] (or [{channels}, {spatial}])"
    x, unbatched = batched(x, dims + 2, op, expected, at)
    if x.shape[1] != channels:
        in_groups = "" if transposed else f" in {groups} group(s)"
        raise ShapeError(
            f"{at}: {op}: expected input {expected} for weight {weight.type}{in_groups}, got {lift(input).type}"
        )
    return x, weight, groups, unbatched


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
    at = user_source_line()
    x, weight, groups, unbatched = convolution_operands("conv2d", input, weight, groups, 2, False, at)
    filters = weight.shape[0]
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
    at = user_source_line()
    x, weight, groups, unbatched = convolution_operands("conv1d", input, weight, groups, 1, False, at)
    filters, group_channels, _ = weight.shape
    channels = group_channels * groups
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
    at = user_source_line()
    x, weight, groups, unbatched = convolution_operands("conv_transpose2d", input, weight, groups, 2, True, at)
    _, group_filters, kh, kw = weight.shape
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
    at = user_source_line()
    x, weight, groups, unbatched = convolution_operands("conv_transpose1d", input, weight, groups, 1, True, at)
    channels, group_filters, k = weight.shape
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


def instance_norm(
    input: Tensor,
    running_mean=None,
    running_var=None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """torch.nn.functional.instance_norm over [N, C, *]: each (sample, channel) normalised with its
    own mean and biased variance over the trailing dims, then a per-channel affine (group_norm with
    a group per channel). Running statistics (track_running_stats) are not supported."""
    if running_mean is not None or running_var is not None or not use_input_stats:
        raise NotImplementedError(
            f"{user_source_line()}: instance_norm: running statistics are not supported (use_input_stats=True, "
            "no running_mean/running_var)"
        )
    x = lift(input)
    if x.ndim < 3:
        raise ShapeError(f"{user_source_line()}: instance_norm: expected [N, C, *] with spatial dims, got {x.type}")
    return group_norm(x, x.shape[1], weight, bias, eps)


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


def tanhshrink(input: Tensor) -> Tensor:
    """x − tanh(x) (torch.nn.functional.tanhshrink)."""
    x = lift(input)
    return x - tanh(x)


def softshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x − λ above λ, x + λ below −λ, 0 between (torch.nn.functional.softshrink); NaN stays NaN."""
    x = lift(input)
    lambd = float(lambd)
    return x - clamp(x, -lambd, lambd)  # 0 inside (x − x), NaN for NaN; gradient 1 outside only


def hardshrink(input: Tensor, lambd: float = 0.5) -> Tensor:
    """x where |x| > λ, else 0 (torch.nn.functional.hardshrink); NaN stays NaN."""
    x = lift(input)
    lambd = float(lambd)
    return where(apply("abs", x) <= lambd, 0.0, x)


def logsigmoid(input: Tensor) -> Tensor:
    """log(1 / (1 + e⁻ˣ)) = −softplus(−x), exact for large |x| (torch.nn.functional.logsigmoid)."""
    return -softplus(-lift(input))


__getattr__ = missing_names(__name__)  # PyTorch names meganeura lacks say what to use (meganeura/pytorch_names.py)
