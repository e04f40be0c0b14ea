"""Write the PyTorch reference values of tests/test_composites.py and tests/test_losses.py:
tests/reference/ops/composites.npz and tests/reference/ops/losses.npz (a folder of their own:
tests/test_torch_reference.py reads every tests/reference/*.npz as a training scenario).

    /tmp/torch311/bin/python scripts/make_composite_references.py              # both files
    /tmp/torch311/bin/python scripts/make_composite_references.py losses       # one of them

Each case is one expression, such as "F.smooth_l1_loss(x, y, beta=0.5)" or
"torch.einsum('bij,bjk->bik', a, b)", that reads the same in PyTorch and in meganeura (the tests
evaluate it with `torch` standing for `meganeura` and `F` for `meganeura.functional`), and its
inputs: float64 arrays from a seeded numpy generator, int32 class labels. Torch evaluates it in
float64 on the CPU; the gradient of Σ_k Σ out_k·r_k (r_k random, one per result) is taken with
respect to the inputs the case names. The file holds, by case name:

    meta                 a JSON string: {case: {"expr", "inputs", "grads", "results"}}, the torch version
    <case>/in/<name>     an input (float64, or int32 for labels)
    <case>/out/<k>       result k (float64; NaN and ±inf as torch gives them)
    <case>/r/<k>         the random weights of result k in the gradient's loss
    <case>/grad/<name>   the gradient of that loss with respect to input <name> (zeros where torch has none)

This script imports only torch and numpy (never meganeura), and is deterministic: rerunning it
rewrites the same bytes (the zip members carry a fixed date, as make_torch_references.py writes them).
"""

from __future__ import annotations

import io
import json
import math
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "tests" / "reference" / "ops"


# ---------------------------------------------------------------------------------------------
# Inputs: each spec makes one array from the case's generator.


def normal(*shape, scale=1.0):
    return lambda rng: scale * rng.normal(size=shape)


def uniform(low, high, *shape):
    return lambda rng: rng.uniform(low, high, size=shape)


def integers(low, high, *shape):
    """Small integers as floats: ties for amin, exact zeros for norms."""
    return lambda rng: rng.integers(low, high, size=shape).astype(np.float64)


def labels(classes, *shape, ignore=None, ignored=0.0):
    """int32 class labels in [0, classes), a fraction `ignored` of them set to `ignore`."""

    def make(rng):
        values = rng.integers(0, classes, size=shape)
        if ignore is not None:
            values = np.where(rng.uniform(size=shape) < ignored, ignore, values)
        return values.astype(np.int32)

    return make


def probabilities(*shape, axis=1):
    def make(rng):
        e = np.exp(rng.normal(size=shape))
        return e / e.sum(axis=axis, keepdims=True)

    return make


def signs(*shape):
    return lambda rng: rng.choice([-1.0, 1.0], size=shape)


def fixed(values):
    return lambda rng: np.asarray(values, dtype=np.float64)


def with_rows(spec, rows: dict):
    """spec's array with some rows (first-axis indices) replaced by constants."""

    def make(rng):
        value = spec(rng)
        for row, constant in rows.items():
            value[row] = constant
        return value

    return make


def case(expr: str, grads=None, **inputs):
    """An expression over named inputs; `grads` the inputs to differentiate (default: every float one)."""
    return {"expr": expr, "inputs": inputs, "grads": grads}


# ---------------------------------------------------------------------------------------------
# The cases. Shapes are small and ragged (no dim a power of two where it can be avoided).

X = normal(3, 5, 7)
COMPOSITES = {
    "split_int": case("torch.split(x, 2, 1)", x=X),
    "split_sections": case("x.split([1, 4, 2], dim=-1)", x=X),
    "chunk_even": case("torch.chunk(x, 4, 1)", x=normal(2, 6, 3)),
    "chunk_ragged": case("x.chunk(3, dim=2)", x=X),
    "unbind": case("torch.unbind(x, 1)", x=X),
    "stack": case("torch.stack([a, b, c], 1)", a=normal(3, 5), b=normal(3, 5), c=normal(3, 5)),
    "stack_last": case("torch.stack((a, b), dim=-1)", a=normal(2, 3), b=normal(2, 3)),
    "narrow": case("torch.narrow(x, 2, 1, 4)", x=X),
    "repeat": case("x.repeat(2, 1, 3)", x=normal(3, 2, 5)),
    "repeat_new_dims": case("x.repeat(2, 3, 1)", x=normal(2, 5)),
    "repeat_interleave_dim": case("x.repeat_interleave(3, dim=1)", x=normal(3, 2, 5)),
    "repeat_interleave_flat": case("torch.repeat_interleave(x, 2)", x=normal(3, 5)),
    "tile_short": case("torch.tile(x, (2,))", x=normal(3, 5)),
    "tile": case("x.tile((2, 1, 2))", x=normal(3, 5)),
    "prod_dim": case("torch.prod(x, 1)", x=normal(3, 7, 2)),
    "prod_zeros": case("x.prod(dim=-1, keepdim=True)", x=integers(-2, 3, 4, 6)),
    "prod_all": case("torch.prod(x)", x=uniform(0.5, 1.5, 3, 5)),
    "var_dim": case("torch.var(x, 1)", x=X),
    "var_dims_keepdim": case("x.var(dim=(0, 2), keepdim=True)", x=X),
    "var_biased": case("torch.var(x, 1, unbiased=False)", x=X),
    "var_correction": case("torch.var(x, dim=-1, correction=0)", x=X),
    "var_all": case("torch.var(x)", x=X),
    "var_unbiased_positional": case("torch.var(x, False)", x=X),
    "var_single": case("torch.var(x, 0)", grads=(), x=normal(1, 4)),
    "std": case("x.std(-1)", x=X),
    "std_correction": case("torch.std(x, (0, 1), keepdim=True, correction=2)", x=X),
    "var_mean": case("torch.var_mean(x, 1)", x=X),
    "std_mean": case("torch.std_mean(x, dim=2, unbiased=False)", x=X),
    "norm_fro": case("torch.norm(x)", x=X),
    "norm_dim": case("torch.norm(x, dim=1)", x=X),
    "norm_zero_row": case("torch.norm(x, dim=1)", x=with_rows(normal(4, 5), {1: 0.0})),
    "norm_p1": case("x.norm(p=1, dim=-1, keepdim=True)", x=X),
    "norm_p3": case("torch.norm(x, p=3, dim=1)", x=X),
    "norm_inf": case("torch.norm(x, p=float('inf'), dim=(1, 2))", x=X),
    "vector_norm_half": case("torch.linalg.vector_norm(x, ord=0.5, dim=-1)", x=X),
    "vector_norm_neg_inf": case("torch.linalg.vector_norm(x, ord=-float('inf'), dim=0)", x=X),
    "vector_norm_zero": case("torch.linalg.vector_norm(x, ord=0, dim=1)", x=integers(-1, 2, 3, 5, 7)),
    "vector_norm_p3_zeros": case("torch.linalg.vector_norm(x, 3, dim=1)", x=integers(-1, 2, 4, 6)),
    "logsumexp": case("torch.logsumexp(x, 1)", x=normal(3, 5, 7, scale=10.0)),
    "logsumexp_keepdim": case("x.logsumexp((0, 2), keepdim=True)", x=X),
    "logsumexp_infinite_rows": case(
        "torch.logsumexp(x, 1)", grads=(), x=with_rows(normal(4, 5), {1: -math.inf, 2: math.inf})
    ),
    "amin": case("torch.amin(x, 1)", x=integers(0, 3, 3, 5, 7)),
    "amin_keepdim": case("x.amin(dim=(0, 2), keepdim=True)", x=integers(0, 3, 3, 5, 7)),
    "matmul_broadcast": case("torch.matmul(a, b)", a=normal(2, 1, 4, 6), b=normal(3, 6, 5)),
    "matmul_shared_b": case("a @ b", a=normal(3, 4, 6), b=normal(1, 6, 5)),
    "matmul_shared_a": case("a @ b", a=normal(1, 4, 6), b=normal(2, 3, 6, 5)),
    "matmul_vector": case("a.matmul(b)", a=normal(2, 3, 4, 6), b=normal(6)),
    "matmul_vector_left": case("a @ b", a=normal(5), b=normal(2, 5, 3)),
    "mm": case("torch.mm(a, b)", a=normal(3, 5), b=normal(5, 4)),
    "bmm": case("a.bmm(b)", a=normal(2, 3, 5), b=normal(2, 5, 4)),
    "outer": case("torch.outer(a, b)", a=normal(3), b=normal(5)),
    "addmm": case("torch.addmm(c, a, b, beta=0.5, alpha=2)", c=normal(5), a=normal(3, 4), b=normal(4, 5)),
    "addmm_beta_zero": case(
        "torch.addmm(c, a, b, beta=0)", grads=("a", "b"), c=fixed([[math.nan] * 5]), a=normal(3, 4), b=normal(4, 5)
    ),
    "baddbmm": case("torch.baddbmm(c, a, b, alpha=0.3)", c=normal(2, 3, 5), a=normal(2, 3, 4), b=normal(2, 4, 5)),
    "einsum_bmm": case("torch.einsum('bij,bjk->bik', a, b)", a=normal(2, 3, 4), b=normal(2, 4, 5)),
    "einsum_scores": case("torch.einsum('bhqd,bhkd->bhqk', a, b)", a=normal(2, 3, 4, 5), b=normal(2, 3, 6, 5)),
    "einsum_transpose": case("torch.einsum('ij->ji', a)", a=normal(3, 5)),
    "einsum_diagonal": case("torch.einsum('ii->i', a)", a=normal(4, 4)),
    "einsum_trace": case("torch.einsum('ii', a)", a=normal(4, 4)),
    "einsum_batch_diagonal": case("torch.einsum('bii->bi', a)", a=normal(2, 3, 3)),
    "einsum_outer": case("torch.einsum('i,j->ij', a, b)", a=normal(3), b=normal(5)),
    "einsum_rowwise_dot": case("torch.einsum('bi,bi->b', a, b)", a=normal(3, 5), b=normal(3, 5)),
    "einsum_ellipsis": case("torch.einsum('...ij,...jk->...ik', a, b)", a=normal(2, 3, 4, 5), b=normal(3, 5, 6)),
    "einsum_implicit": case("torch.einsum('ij,jk', a, b)", a=normal(3, 4), b=normal(4, 5)),
    "einsum_chain": case("torch.einsum('ij,jk,kl->il', a, b, c)", a=normal(2, 3), b=normal(3, 4), c=normal(4, 5)),
    "einsum_bilinear": case(
        "torch.einsum('bn,anm,bm->ba', a, b, c)", a=normal(3, 4), b=normal(2, 4, 5), c=normal(3, 5)
    ),
    "einsum_sum_all": case("torch.einsum('ijk->', a)", a=normal(2, 3, 4)),
    "einsum_dot": case("torch.einsum('i,i', a, b)", a=normal(5), b=normal(5)),
    "einsum_sum_dim": case("torch.einsum('bij->bj', a)", a=normal(2, 3, 4)),
    "einsum_list": case("torch.einsum('bij,bkj->bik', [a, b])", a=normal(2, 3, 4), b=normal(2, 5, 4)),
    "einsum_implicit_ellipsis": case("torch.einsum('...j,j', a, b)", a=normal(2, 3, 4), b=normal(4)),
    "einsum_multi_contract": case("torch.einsum('bijk,bjkl->bil', a, b)", a=normal(2, 3, 4, 5), b=normal(2, 4, 5, 3)),
    "normalize": case("F.normalize(x)", x=X),
    "normalize_p1": case("F.normalize(x, p=1, dim=-1)", x=X),
    "normalize_zero_row": case("F.normalize(x, dim=1)", x=with_rows(normal(4, 5), {2: 0.0})),
    "cosine_similarity": case("F.cosine_similarity(a, b)", a=normal(3, 5, 2), b=normal(3, 5, 2)),
    "cosine_similarity_broadcast": case(
        "F.cosine_similarity(a, b, dim=-1, eps=1e-3)", a=normal(4, 1, 5), b=normal(3, 5)
    ),
    "pairwise_distance": case("F.pairwise_distance(a, b)", a=normal(4, 5), b=normal(4, 5)),
    "pairwise_distance_p1": case("F.pairwise_distance(a, b, p=1, keepdim=True)", a=normal(4, 5), b=normal(4, 5)),
    "softmin": case("F.softmin(x, dim=1)", x=X),
    "glu": case("F.glu(x)", x=normal(3, 4, 6)),
    "glu_dim": case("F.glu(x, 1)", x=normal(3, 4, 6)),
    "pad_constant": case("F.pad(x, (1, 2))", x=X),
    "pad_constant_value": case("F.pad(x, (1, 0, 2, 1), value=3.5)", x=X),
    "pad_constant_3d": case("F.pad(x, (0, 1, 1, 1, 2, 0))", x=normal(2, 3, 4, 5)),
    "pad_crop": case("F.pad(x, (-1, 2, 1, -2))", x=X),
    "pad_reflect": case("F.pad(x, (2, 1), mode='reflect')", x=normal(2, 3, 5)),
    "pad_reflect_2d": case("F.pad(x, (1, 2, 2, 1), mode='reflect')", x=normal(2, 3, 4, 5)),
    "pad_reflect_3d": case("F.pad(x, (1, 1, 1, 0, 0, 1), mode='reflect')", x=normal(1, 2, 3, 4, 5)),
    "pad_replicate": case("F.pad(x, (2, 3, 1, 0), mode='replicate')", x=normal(2, 3, 4, 5)),
    "pad_circular": case("F.pad(x, (1, 2), mode='circular')", x=normal(2, 3, 5)),
    "pad_circular_2d": case("F.pad(x, (2, 1, 1, 3), mode='circular')", x=normal(2, 3, 4, 5)),
    "interpolate_nearest_2x": case("F.interpolate(x, scale_factor=2)", x=normal(2, 3, 4, 5)),
    "interpolate_nearest_size": case("F.interpolate(x, size=(5, 7))", x=normal(2, 3, 3, 4)),
    "interpolate_nearest_fraction": case("F.interpolate(x, scale_factor=1.5)", x=normal(2, 3, 7)),
    "interpolate_nearest_down": case("F.interpolate(x, scale_factor=0.5)", x=normal(2, 3, 7, 6)),
    "interpolate_nearest_odd_down": case("F.interpolate(x, size=(3, 4))", x=normal(1, 2, 7, 9)),
    "interpolate_nearest_recompute": case(
        "F.interpolate(x, scale_factor=1.7, recompute_scale_factor=True)", x=normal(2, 3, 5)
    ),
    "interpolate_nearest_exact": case("F.interpolate(x, size=(5, 3), mode='nearest-exact')", x=normal(2, 3, 3, 7)),
    "interpolate_nearest_5d": case("F.interpolate(x, scale_factor=(2, 1, 1.5))", x=normal(1, 2, 2, 3, 4)),
    "interpolate_bilinear_2x": case("F.interpolate(x, scale_factor=2, mode='bilinear')", x=normal(2, 3, 4, 5)),
    "interpolate_bilinear_corners": case(
        "F.interpolate(x, size=(5, 7), mode='bilinear', align_corners=True)", x=normal(2, 3, 3, 4)
    ),
    "interpolate_bilinear_down": case("F.interpolate(x, size=(3, 2), mode='bilinear')", x=normal(1, 2, 7, 5)),
    "interpolate_linear_fraction": case(
        "F.interpolate(x, scale_factor=1.7, mode='linear', align_corners=False)", x=normal(2, 3, 5)
    ),
    "interpolate_linear_corners_down": case(
        "F.interpolate(x, size=3, mode='linear', align_corners=True)", x=normal(2, 3, 8)
    ),
    "interpolate_trilinear": case("F.interpolate(x, size=(3, 4, 5), mode='trilinear')", x=normal(1, 2, 2, 3, 4)),
    "interpolate_area": case("F.interpolate(x, size=(3, 2), mode='area')", x=normal(2, 3, 6, 4)),
    "diagonal": case("torch.diagonal(x)", x=normal(4, 6)),
    "diagonal_offset_dims": case("x.diagonal(offset=-1, dim1=2, dim2=0)", x=normal(5, 3, 4)),
    "diagonal_offset_past": case("torch.diagonal(x, 2)", x=normal(3, 4)),
    "diff": case("torch.diff(x)", x=X),
    "diff_twice_prepend": case("x.diff(n=2, dim=1, prepend=p, append=a)", x=X, p=normal(3, 1, 7), a=normal(3, 2, 7)),
    # nan_to_num's default bounds are the dtype's extremes: float64's here, so the cases name theirs.
    "nan_to_num": case(
        "x.nan_to_num(nan=1.5, posinf=9.0, neginf=-9.0)", grads=(), x=fixed([[math.nan, math.inf, -math.inf, 3.0]])
    ),
    "nan_to_num_finite": case("torch.nan_to_num(x, posinf=1.0)", x=X),
    "tanhshrink": case("F.tanhshrink(x)", x=X),
    # At NaN torch's vectorised and scalar kernels disagree on the gradient: values only there.
    "softshrink": case("F.softshrink(x, 0.3)", x=normal(4, 5)),
    "softshrink_nan": case("F.softshrink(x, 0.3)", grads=(), x=with_rows(normal(4, 5), {0: math.nan, 1: 0.3})),
    "hardshrink": case("F.hardshrink(x, lambd=0.7)", x=normal(4, 5)),
    "hardshrink_nan": case("F.hardshrink(x, lambd=0.7)", grads=(), x=with_rows(normal(4, 5), {0: math.nan, 1: 0.7})),
    "instance_norm": case(
        "F.instance_norm(x, weight=w, bias=b, eps=1e-3)", x=normal(2, 3, 5, 4), w=normal(3), b=normal(3)
    ),
    "instance_norm_1d": case("F.instance_norm(x)", x=normal(3, 4, 6)),
}

P = uniform(0.02, 0.98, 4, 5)
LOSSES = {
    "l1_loss": case("F.l1_loss(x, y)", x=normal(4, 5), y=normal(4, 5)),
    "l1_loss_sum": case("F.l1_loss(x, y, reduction='sum')", x=normal(4, 5), y=normal(4, 5)),
    "l1_loss_none": case("F.l1_loss(x, y, reduction='none')", x=normal(4, 5), y=normal(4, 5)),
    "l1_loss_weight": case("F.l1_loss(x, y, weight=w)", x=normal(4, 5), y=normal(4, 5), w=uniform(0.1, 2, 4, 5)),
    "l1_loss_broadcast": case("F.l1_loss(x, y)", x=normal(4, 5), y=normal(5)),
    "mse_loss_weight": case("F.mse_loss(x, y, weight=w)", x=normal(4, 5), y=normal(4, 5), w=uniform(0.1, 2, 4, 5)),
    "mse_loss_legacy_sum": case("F.mse_loss(x, y, size_average=False)", x=normal(4, 5), y=normal(4, 5)),
    "mse_loss_legacy_none": case("F.mse_loss(x, y, reduce=False)", x=normal(4, 5), y=normal(4, 5)),
    "smooth_l1_loss": case("F.smooth_l1_loss(x, y)", x=normal(4, 5, scale=2), y=normal(4, 5)),
    "smooth_l1_loss_beta": case("F.smooth_l1_loss(x, y, beta=0.5, reduction='none')", x=normal(4, 5), y=normal(4, 5)),
    "smooth_l1_loss_beta0": case("F.smooth_l1_loss(x, y, beta=0.0, reduction='sum')", x=normal(4, 5), y=normal(4, 5)),
    "huber_loss": case("F.huber_loss(x, y, delta=0.7)", x=normal(4, 5, scale=2), y=normal(4, 5)),
    "huber_loss_weight": case(
        "F.huber_loss(x, y, reduction='mean', delta=1.3, weight=w)",
        x=normal(4, 5, scale=2),
        y=normal(4, 5),
        w=uniform(0.1, 2, 4, 5),
    ),
    "binary_cross_entropy": case("F.binary_cross_entropy(p, t)", grads=("p",), p=P, t=uniform(0, 1, 4, 5)),
    "binary_cross_entropy_weight": case(
        "F.binary_cross_entropy(p, t, weight=w, reduction='none')",
        grads=("p",),
        p=P,
        t=uniform(0, 1, 4, 5),
        w=uniform(0.1, 2, 5),
    ),
    "binary_cross_entropy_clamped_log": case(
        "F.binary_cross_entropy(p, t, reduction='sum')",
        grads=(),
        p=fixed([[0.0, 1.0, 0.5], [1.0, 0.0, 1e-50]]),
        t=fixed([[1.0, 0.0, 0.5], [0.3, 0.6, 1.0]]),
    ),
    "bce_with_logits": case("F.binary_cross_entropy_with_logits(x, t)", x=normal(4, 5, scale=3), t=uniform(0, 1, 4, 5)),
    "bce_with_logits_large": case(
        "F.binary_cross_entropy_with_logits(x, t, reduction='none')",
        x=fixed([[-80.0, -30.0, -1.0, 0.0], [1.0, 30.0, 80.0, 15.0]]),
        t=fixed([[1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 0.0, 0.2]]),
    ),
    "bce_with_logits_weights": case(
        "F.binary_cross_entropy_with_logits(x, t, weight=w, pos_weight=q, reduction='sum')",
        grads=("x", "t"),
        x=normal(4, 5, scale=2),
        t=uniform(0, 1, 4, 5),
        w=uniform(0.1, 2, 4, 1),
        q=uniform(0.5, 3, 5),
    ),
    "kl_div_batchmean": case(
        "F.kl_div(x, t, reduction='batchmean')", x=normal(4, 5), t=with_rows(probabilities(4, 5), {1: 0.0})
    ),
    "kl_div_mean": case("F.kl_div(x, t)", x=normal(4, 5), t=probabilities(4, 5)),
    "kl_div_none": case("F.kl_div(x, t, reduction='none')", grads=("x",), x=normal(4, 3), t=fixed([[0.0, 0.5, 0.5]])),
    "kl_div_log_target": case("F.kl_div(x, t, reduction='sum', log_target=True)", x=normal(4, 5), t=normal(4, 5)),
    "gaussian_nll_loss": case("F.gaussian_nll_loss(x, y, v)", x=normal(4, 5), y=normal(4, 5), v=uniform(0.1, 2, 4, 5)),
    "gaussian_nll_loss_short_var": case(
        "F.gaussian_nll_loss(x, y, v, full=True, reduction='sum')", x=normal(4, 5), y=normal(4, 5), v=uniform(0.1, 2, 4)
    ),
    "gaussian_nll_loss_float_var": case(
        "F.gaussian_nll_loss(x, y, 0.7, reduction='none')", x=normal(4, 5), y=normal(4, 5)
    ),
    "gaussian_nll_loss_var_dim1": case(
        "F.gaussian_nll_loss(x, y, v, eps=0.05)", x=normal(4, 5), y=normal(4, 5), v=uniform(0.1, 2, 4, 1)
    ),
    "poisson_nll_loss": case("F.poisson_nll_loss(x, t)", grads=("x",), x=normal(4, 5), t=integers(0, 5, 4, 5)),
    "poisson_nll_loss_full": case(
        "F.poisson_nll_loss(x, t, log_input=False, full=True, reduction='none')",
        grads=("x",),
        x=uniform(0.1, 3, 4, 5),
        t=integers(0, 5, 4, 5),
    ),
    "margin_ranking_loss": case(
        "F.margin_ranking_loss(a, b, t, margin=0.3)", grads=("a", "b"), a=normal(6), b=normal(6), t=signs(6)
    ),
    "cosine_embedding_loss": case(
        "F.cosine_embedding_loss(a, b, t, margin=0.2, reduction='none')",
        grads=("a", "b"),
        a=normal(6, 5),
        b=normal(6, 5),
        t=signs(6),
    ),
    "cosine_embedding_loss_mean": case(
        "F.cosine_embedding_loss(a, b, t)", grads=("a", "b"), a=normal(6, 5), b=normal(6, 5), t=signs(6)
    ),
    "triplet_margin_loss": case("F.triplet_margin_loss(a, p, n)", a=normal(5, 4), p=normal(5, 4), n=normal(5, 4)),
    "triplet_margin_loss_swap": case(
        "F.triplet_margin_loss(a, p, n, margin=2.0, p=1, swap=True, reduction='none')",
        a=normal(5, 4),
        p=normal(5, 4),
        n=normal(5, 4),
    ),
    "nll_loss": case("F.nll_loss(x, y)", x=normal(6, 5), y=labels(5, 6)),
    "nll_loss_weight_ignore": case(
        "F.nll_loss(x, y, weight=w)",
        grads=("x",),
        x=normal(6, 5),
        y=labels(5, 6, ignore=-100, ignored=0.4),
        w=uniform(0.2, 2, 5),
    ),
    "nll_loss_custom_ignore": case(
        "F.nll_loss(x, y, ignore_index=2, reduction='none')", x=normal(6, 5), y=labels(5, 6)
    ),
    "nll_loss_spatial": case(
        "F.nll_loss(x, y, reduction='sum')", x=normal(2, 5, 3, 4), y=labels(5, 2, 3, 4, ignore=-100, ignored=0.3)
    ),
    "nll_loss_unbatched": case("F.nll_loss(x, y)", x=normal(5), y=labels(5)),
    "nll_loss_all_ignored": case("F.nll_loss(x, y)", grads=(), x=normal(3, 5), y=labels(5, 3, ignore=-100, ignored=2)),
    "cross_entropy": case("F.cross_entropy(x, y)", x=normal(6, 5, scale=3), y=labels(5, 6)),
    "cross_entropy_ignore": case(
        "F.cross_entropy(x, y)", x=normal(6, 5, scale=3), y=labels(5, 6, ignore=-100, ignored=0.4)
    ),
    "cross_entropy_weight_ignore": case(
        "F.cross_entropy(x, y, w, ignore_index=1)", grads=("x",), x=normal(7, 5), y=labels(5, 7), w=uniform(0.2, 2, 5)
    ),
    "cross_entropy_smoothing": case(
        "F.cross_entropy(x, y, label_smoothing=0.1)", x=normal(6, 5), y=labels(5, 6, ignore=-100, ignored=0.3)
    ),
    "cross_entropy_smoothing_weight": case(
        "F.cross_entropy(x, y, weight=w, label_smoothing=0.2)",
        grads=("x",),
        x=normal(6, 5),
        y=labels(5, 6, ignore=-100, ignored=0.3),
        w=uniform(0.2, 2, 5),
    ),
    "cross_entropy_smoothing_sum": case(
        "F.cross_entropy(x, y, weight=w, reduction='sum', label_smoothing=0.3)",
        grads=("x",),
        x=normal(6, 5),
        y=labels(5, 6, ignore=-100, ignored=0.3),
        w=uniform(0.2, 2, 5),
    ),
    "cross_entropy_spatial_none": case(
        "F.cross_entropy(x, y, reduction='none', label_smoothing=0.05)",
        x=normal(2, 4, 3, 5),
        y=labels(4, 2, 3, 5, ignore=-100, ignored=0.2),
    ),
    "cross_entropy_spatial_mean": case("F.cross_entropy(x, y)", x=normal(2, 4, 3), y=labels(4, 2, 3)),
    "cross_entropy_unbatched": case("F.cross_entropy(x, y)", x=normal(5), y=labels(5)),
    "cross_entropy_probabilities": case("F.cross_entropy(x, t)", grads=("x",), x=normal(6, 5), t=probabilities(6, 5)),
    "cross_entropy_probabilities_smoothing": case(
        "F.cross_entropy(x, t, weight=w, label_smoothing=0.2, reduction='none')",
        grads=("x",),
        x=normal(2, 4, 3),
        t=probabilities(2, 4, 3),
        w=uniform(0.2, 2, 4),
    ),
    "cross_entropy_legacy_sum": case("F.cross_entropy(x, y, size_average=False)", x=normal(6, 5), y=labels(5, 6)),
}

FILES = {"composites": COMPOSITES, "losses": LOSSES}


# ---------------------------------------------------------------------------------------------
# Evaluation


def results_of(value) -> list[torch.Tensor]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def evaluate(name: str, spec: dict, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {key: make(rng) for key, make in spec["inputs"].items()}
    grads = [k for k, v in values.items() if v.dtype == np.float64] if spec["grads"] is None else list(spec["grads"])
    tensors = {}
    for key, value in values.items():
        if value.dtype == np.int32:
            tensors[key] = torch.from_numpy(value.astype(np.int64))
        else:
            tensors[key] = torch.tensor(value, dtype=torch.float64, requires_grad=key in grads)
    results = results_of(eval(spec["expr"], {"torch": torch, "F": F, "math": math}, dict(tensors)))
    arrays = {f"{name}/in/{key}": value for key, value in values.items()}
    loss = 0.0
    for index, result in enumerate(results):
        weights = rng.normal(size=tuple(result.shape))
        arrays[f"{name}/out/{index}"] = result.detach().numpy().astype(np.float64)
        arrays[f"{name}/r/{index}"] = weights
        loss = loss + (result * torch.from_numpy(weights)).sum()
    if grads:
        loss.backward()
    for key in grads:
        grad = tensors[key].grad
        arrays[f"{name}/grad/{key}"] = np.zeros_like(values[key]) if grad is None else grad.numpy().copy()
    spec["meta"] = {"expr": spec["expr"], "inputs": list(values), "grads": grads, "results": len(results)}
    return arrays


def generate(file: str) -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    cases = FILES[file]
    arrays: dict[str, np.ndarray] = {}
    for seed, (name, spec) in enumerate(cases.items()):
        arrays.update(evaluate(name, spec, seed))
    meta = {"torch": torch.__version__, "cases": {name: spec["meta"] for name, spec in cases.items()}}
    return {"meta": np.array(json.dumps(meta, sort_keys=True)), **arrays}


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """np.savez_compressed's format with a fixed date on every zip member (bytes depend only on the arrays)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def main(argv: list[str]) -> None:
    names = argv or list(FILES)
    for name in names:
        if name not in FILES:
            raise SystemExit(f"unknown file {name!r}; known: {list(FILES)}")
        path = REFERENCE_DIR / f"{name}.npz"
        path.write_bytes(npz_bytes(generate(name)))
        print(f"wrote {path} ({len(FILES[name])} cases)")


if __name__ == "__main__":
    main(sys.argv[1:])
