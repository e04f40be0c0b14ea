"""Image ops (NCHW): unfold and fold (the plain form of a convolution), `conv_gemm` (the
implicit-GEMM convolution kernels the e-graph makes of them), pooling with its gradients, and the
adaptive pools' windows.

A convolution is traced as im2col and a matmul, exactly as torch.nn.functional.unfold defines
it: `unfold(x)` [N, C, H, W] → [N, C·kh·kw, L] (L = Ho·Wo output positions), then
`matmul(weight [O, C·kh·kw], cols)` → [N, O, L]. Autodiff of that is plain too: the weight
gradient is Σₙ g·colsᵀ and the input gradient is `fold(weightᵀ·g)` (fold, the adjoint of unfold,
sums the columns back onto the image). A convolution in G groups views the columns as
[N, G, C/G·kh·kw, L] and the weight as [G, O/G, C/G·kh·kw] (broadcast over the batch): one
batched matmul [N, G, O/G, L]. The e-graph rewrites these compositions into implicit-GEMM kernels
that gather their operand while loading it, so that the columns are never written
(`rewrite/conv.py`); without the rewrite the columns are a real buffer.

Geometry attributes, shared by every op here, each a pair of ints: `kernel` (kh, kw), `stride`
(sh, sw), `padding` (ph, pw), `dilation` (dh, dw), default (1, 1). Column row index
(c·kh + i)·kw + j, column index ho·Wo + wo, reading x[n, c, ho·sh − ph + i·dh, wo·sw − pw + j·dw]
(0 outside the image), as torch's unfold.
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.expr import check_expr
from meganeura.ir.expr import evaluate as evaluate_expr
from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, EXPR, INT, INTS, STR, Attr, Op, ShapeError, broadcasts_to, require_float
from meganeura.ir.ops.matmul import part_length
from meganeura.ir.ops.reduce import check_splits, split_parts

FAMILY = "image"
ONES = (1, 1)


def pair(value, what: str) -> tuple[int, int]:
    """An int or a pair of ints as a pair (PyTorch accepts both for kernel_size, stride, padding)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    raise ShapeError(f"{what}: expected an int or a pair of ints, got {value!r}")


def conv_output_size(
    size: tuple[int, int], kernel, stride, padding, op: str = "conv2d", dilation=ONES
) -> tuple[int, int]:
    """(Ho, Wo) of a window of `kernel` (taps `dilation` apart) sliding over `size` with `stride`
    and `padding`: ⌊(size + 2·p − d·(k − 1) − 1)/s⌋ + 1, as torch."""
    out = []
    for extent, k, s, p, d in zip(size, kernel, stride, padding, dilation, strict=True):
        if k < 1 or s < 1 or p < 0 or d < 1:
            raise ShapeError(
                f"{op}: kernel {tuple(kernel)}, stride {tuple(stride)}, dilation {tuple(dilation)} must be positive "
                f"and padding {tuple(padding)} at least 0"
            )
        if extent + 2 * p < d * (k - 1) + 1:
            span = "" if tuple(dilation) == ONES else f" (dilated to {d * (k - 1) + 1})"
            raise ShapeError(f"{op}: kernel {tuple(kernel)}{span} is larger than the padded input {tuple(size)}")
        out.append((extent + 2 * p - d * (k - 1) - 1) // s + 1)
    return out[0], out[1]


def window_index(shape, kernel, stride, padding, dilation=ONES, out=None):
    """(rows, cols, valid) index arrays [kh·kw, L] of the unfolded layout into the image [H, W]: for
    each column row r = (c·kh + i)·kw + j (c left out: the same for every channel) and column
    l = ho·Wo + wo. `out` (Ho, Wo) defaults to `conv_output_size` (a pool in ceil mode has more)."""
    height, width = shape
    kh, kw = kernel
    ho, wo = conv_output_size(shape, kernel, stride, padding, dilation=dilation) if out is None else out
    i, j = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    oy, ox = np.meshgrid(np.arange(ho), np.arange(wo), indexing="ij")
    rows = oy.reshape(1, -1) * stride[0] - padding[0] + i.reshape(-1, 1) * dilation[0]
    cols = ox.reshape(1, -1) * stride[1] - padding[1] + j.reshape(-1, 1) * dilation[1]
    valid = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    return np.clip(rows, 0, height - 1), np.clip(cols, 0, width - 1), valid


# ---------------------------------------------------------------------------------------------
# unfold (im2col) and fold (col2im, its adjoint)


def infer_unfold(types, attrs) -> TensorType:
    (x,) = types
    require_float([x], "unfold")
    if x.rank != 4:
        raise ShapeError(f"unfold: expected an image batch [N, C, H, W], got {x}")
    n, c, h, w = x.shape
    kernel = attrs["kernel"]
    ho, wo = conv_output_size((h, w), kernel, attrs["stride"], attrs["padding"], "unfold", attrs["dilation"])
    return TensorType((n, c * kernel[0] * kernel[1], ho * wo), "f32")


def evaluate_unfold(x, kernel, stride, padding, dilation=ONES):
    """torch.nn.functional.unfold: [N, C, H, W] → [N, C·kh·kw, L]."""
    n, c, h, w = x.shape
    rows, cols, valid = window_index((h, w), kernel, stride, padding, dilation)
    patches = x[:, :, rows, cols] * valid  # [N, C, kh·kw, L]
    return patches.reshape(n, c * kernel[0] * kernel[1], -1)


def infer_fold(types, attrs) -> TensorType:
    (cols,) = types
    require_float([cols], "fold")
    kernel = attrs["kernel"]
    size = tuple(attrs["output_size"])
    taps = kernel[0] * kernel[1]
    ho, wo = conv_output_size(size, kernel, attrs["stride"], attrs["padding"], "fold", attrs["dilation"])
    if cols.rank != 3 or cols.shape[1] % taps or cols.shape[2] != ho * wo:
        raise ShapeError(f"fold: expected columns [N, C·{taps}, {ho * wo}] for output {list(size)}, got {cols}")
    return TensorType((cols.shape[0], cols.shape[1] // taps, *size), "f32")


def evaluate_fold(cols, output_size, kernel, stride, padding, dilation=ONES):
    """torch.nn.functional.fold: [N, C·kh·kw, L] → [N, C, H, W], overlapping windows summed."""
    n, ck, _ = cols.shape
    c = ck // (kernel[0] * kernel[1])
    rows, columns, valid = window_index(tuple(output_size), kernel, stride, padding, dilation)
    out = np.zeros((n, c, *output_size), dtype=cols.dtype)
    patches = cols.reshape(n, c, kernel[0] * kernel[1], -1) * valid
    np.add.at(out, (slice(None), slice(None), rows, columns), patches)
    return out


def window_attrs(node) -> dict:
    return {key: node.attr(key) for key in ("kernel", "stride", "padding", "dilation")}


def describe_window(node) -> str:
    (kh, kw), (sh, sw), (ph, pw) = (node.attr(key) for key in ("kernel", "stride", "padding"))
    dilation = node.attr("dilation", ONES)
    dilated = "" if tuple(dilation) == ONES else f"/d{dilation[0]},{dilation[1]}"
    return f"{kh}x{kw}/s{sh},{sw}/p{ph},{pw}{dilated}"


WINDOW = (
    Attr("kernel", INTS),
    Attr("stride", INTS, ONES),
    Attr("padding", INTS, (0, 0)),
    Attr("dilation", INTS, ONES),
)

UNFOLD = Op(
    "unfold",
    family=FAMILY,
    infer=infer_unfold,
    evaluate=evaluate_unfold,
    operands=("x",),
    attrs=WINDOW,
    describe=describe_window,
    doc="im2col: [N, C, H, W] → [N, C·kh·kw, L] (torch.nn.functional.unfold)",
)
FOLD = Op(
    "fold",
    family=FAMILY,
    infer=infer_fold,
    evaluate=evaluate_fold,
    operands=("cols",),
    attrs=(Attr("output_size", INTS), *WINDOW),
    describe=describe_window,
    doc="col2im: [N, C·kh·kw, L] → [N, C, H, W], overlapping windows summed (unfold's adjoint)",
)


@UNFOLD.vjp
def _unfold(b, node, g):
    """Each column entry goes back to the pixel it was read from, summed over overlapping windows."""
    size = tuple(b.shape(node.inputs[0])[2:])
    return [b.emit("fold", [g], output_size=size, **window_attrs(node))]


@FOLD.vjp
def _fold(b, node, g):
    """Each column entry of fold's input reads the gradient of the pixel it was summed into."""
    return [b.emit("unfold", [g], **window_attrs(node))]


# ---------------------------------------------------------------------------------------------
# conv_gemm: the implicit-GEMM convolution kernels, produced by the e-graph from unfold/fold and
# matmul. Each mode is one GEMM per group  out[row, col] = epilogue(Σ_r A[row, r] · B[r, col])
# whose im2col operand is gathered from the image while the GEMM tile is loaded, never written
# (Cg = C/G channels and Og = O/G filters a group; G = `groups`, 1 for a plain convolution):
#
# - forward (a = weight [O, C·kh·kw], in G > 1 groups [G, Og, Cg·kh·kw]; b = x [N, C, H, W] →
#   [N, O, Ho, Wo]): group g's rows o, columns (n, ho, wo), reduction r = (c, i, j) over its Cg
#   channels. A[o, r] = weight[g·Og + o, r] as stored; B[r, (n, ho, wo)] =
#   x[n, g·Cg + c, ho·sh − ph + i·dh, wo·sw − pw + j·dw] (0 outside the image) is the gathered
#   column. Output element (n, g·Og + o, ho, wo), NCHW.
# - grad_input (a = the weight as for forward, b = g [N, O, L], in G > 1 groups [N, G, Og, L] →
#   [N, C, H, W]): the adjoint, fold(weightᵀ·g). Rows c, columns (n, y, x), reduction (o, i, j).
#   A[c, (o, i, j)] = weight[g·Og + o, (c·kh + i)·kw + j] (a permuted read of the weight);
#   B[(o, i, j), (n, y, x)] = g[n, g·Og + o, ho·Wo + wo] with ho = (y + ph − i·dh)/sh,
#   wo = (x + pw − j·dw)/sw when both divide exactly and land inside [0, Ho) × [0, Wo), else 0:
#   each output pixel gathers the output positions whose windows cover it, so fold's scattered
#   sum becomes a reduction without atomics. A transposed convolution is this GEMM (F.conv_transpose2d).
# - grad_weight (a = g [N, O, L] or [N, G, Og, L], b = x [N, C, H, W] → [O, C·kh·kw] or
#   [G, Og, Cg·kh·kw]): Σₙ g[n]·unfold(x)[n]ᵀ. Rows o, columns (c, i, j), reduction (n, ho, wo)
#   over every image. A[o, (n, l)] = g[n, g·Og + o, l]; B[(n, l), (c, i, j)] = x gathered as in
#   forward (the transposed column).
#
# Attributes: mode, kernel, stride, padding, dilation (pairs, as for unfold), image = (H, W), the
# spatial size of the image (x for forward and grad_weight, the result for grad_input: it cannot
# be recovered from L alone when the stride does not divide), epilogue (an expression over `$acc`
# and the extras `$0, $1…` = inputs[2:], each broadcast to the output; default "$acc"), `groups`
# G, and `chunks` S (default 1): with S > 1 the GEMM's reduction is split into S parts and the
# result holds one partial sum per part, [S, *out] (summed by a reduction after it): split-K, for
# a GEMM whose output has too few tiles to keep the GPU busy. grad_weight's reduction (n, ho, wo),
# N·L long, splits into parts of ⌈N·L/S⌉ (the last may be shorter; none empty,
# `reduce.check_splits`; S = N is one part per image); forward's (c, i, j) and a stride-1
# grad_input's (o, i, j), K long, into parts of `matmul.part_length(K, S)` (whole 16-element K
# tiles, as a split matmul's).

CONV_GEMM_MODES = ("forward", "grad_input", "grad_weight")


def conv_gemm_geometry(attrs) -> tuple[str, tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(mode, kernel, stride, padding, image) of a conv_gemm, checked (`conv_dilation` and
    `conv_groups_of` read the rest)."""
    mode = attrs.get("mode")
    if mode not in CONV_GEMM_MODES:
        raise ShapeError(f"conv_gemm: mode must be one of {CONV_GEMM_MODES}, got {mode!r}")
    kernel = pair(attrs.get("kernel"), "conv_gemm kernel")
    stride = pair(attrs.get("stride", 1), "conv_gemm stride")
    padding = pair(attrs.get("padding", 0), "conv_gemm padding")
    image = pair(attrs.get("image"), "conv_gemm image")
    if attrs.get("chunks", 1) != 1 and mode == "grad_input" and stride != (1, 1):
        raise ShapeError(
            f"conv_gemm grad_input: only a stride-1 input gradient splits its reduction, got stride {stride}"
        )
    return mode, kernel, stride, padding, image


def conv_dilation(attrs) -> tuple[int, int]:
    return pair(attrs.get("dilation", 1), "conv_gemm dilation")


def conv_groups_of(attrs) -> int:
    """The groups G of a conv_gemm (1: a plain convolution), checked."""
    groups = attrs.get("groups", 1)
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ShapeError(f"conv_gemm: groups must be a positive int, got {groups!r}")
    return groups


def weight_operand(a: TensorType, taps: int, groups: int, mode: str) -> tuple[int, int]:
    """(Og, Cg) of the weight operand of forward and grad_input: [O, C·taps], or [G, Og, Cg·taps]
    in G > 1 groups."""
    rank = 2 if groups == 1 else 3
    if a.rank != rank or a.shape[-1] % taps or (groups > 1 and a.shape[0] != groups):
        form = f"[O, C·{taps}]" if groups == 1 else f"[{groups}, O/{groups}, C/{groups}·{taps}]"
        raise ShapeError(f"conv_gemm {mode}: expected a weight matrix {form} as a, got {a}")
    return a.shape[-2], a.shape[-1] // taps


def gradient_operand(g: TensorType, groups: int, mode: str, what: str) -> tuple[int, int, int]:
    """(N, Og, L) of an output gradient [N, O, L], or [N, G, Og, L] in G > 1 groups."""
    rank = 3 if groups == 1 else 4
    if g.rank != rank or (groups > 1 and g.shape[1] != groups):
        form = "[N, O, L]" if groups == 1 else f"[N, {groups}, O/{groups}, L]"
        raise ShapeError(f"conv_gemm {mode}: expected an output gradient {form} as {what}, got {g}")
    return g.shape[0], g.shape[-2], g.shape[-1]


def infer_conv_gemm(types, attrs) -> TensorType:
    if len(types) < 2:
        raise ShapeError(f"conv_gemm: expected at least two operands (a, b), got {len(types)}")
    require_float(types, "conv_gemm")
    mode, kernel, stride, padding, image = conv_gemm_geometry(attrs)
    dilation, groups = conv_dilation(attrs), conv_groups_of(attrs)
    a, b, extras = types[0], types[1], types[2:]
    taps = kernel[0] * kernel[1]
    ho, wo = conv_output_size(image, kernel, stride, padding, "conv_gemm", dilation)
    if mode in ("forward", "grad_input"):
        filters, channels = weight_operand(a, taps, groups, mode)
    if mode == "forward":
        if b.rank != 4:
            raise ShapeError(f"conv_gemm forward: expected an image batch [N, C, H, W] as b, got {b}")
        if b.shape[1] != channels * groups:
            raise ShapeError(
                f"conv_gemm forward: weight {a} has {channels} channels per filter in {groups} group(s), "
                f"x {b} {b.shape[1]}"
            )
        if tuple(b.shape[2:]) != image:
            raise ShapeError(f"conv_gemm forward: x {b} is not of the image size {list(image)}")
        out = parts_type(TensorType((b.shape[0], filters * groups, ho, wo), "f32"), a.shape[-1], attrs, mode)
    elif mode == "grad_input":
        images, per_group, positions = gradient_operand(b, groups, mode, "b")
        if per_group != filters:
            raise ShapeError(f"conv_gemm grad_input: weight {a} has {filters} filters, the gradient {b} {per_group}")
        if positions != ho * wo:
            raise ShapeError(
                f"conv_gemm grad_input: gradient {b} should have {ho}·{wo} = {ho * wo} positions (image {list(image)})"
            )
        out = parts_type(TensorType((images, channels * groups, *image), "f32"), filters * taps, attrs, mode)
    else:
        images, filters, positions = gradient_operand(a, groups, mode, "a")
        if b.rank != 4:
            raise ShapeError(f"conv_gemm grad_weight: expected an image batch [N, C, H, W] as b, got {b}")
        if images != b.shape[0]:
            raise ShapeError(f"conv_gemm grad_weight: batch sizes differ: gradient {a}, x {b}")
        if b.shape[1] % groups:
            raise ShapeError(f"conv_gemm grad_weight: x {b} has channels that do not split into {groups} groups")
        if tuple(b.shape[2:]) != image:
            raise ShapeError(f"conv_gemm grad_weight: x {b} is not of the image size {list(image)}")
        if positions != ho * wo:
            raise ShapeError(
                f"conv_gemm grad_weight: gradient {a} should have {ho}·{wo} = {ho * wo} positions (image {list(image)})"
            )
        chunks = check_splits(images * positions, attrs.get("chunks", 1), "conv_gemm grad_weight chunks")
        matrix = (filters, b.shape[1] // groups * taps) if groups > 1 else (filters, b.shape[1] * taps)
        out = TensorType((*((chunks,) if chunks > 1 else ()), *((groups,) if groups > 1 else ()), *matrix), "f32")
    check_expr("conv_gemm", attrs.get("epilogue", "$acc"), {"acc", *map(str, range(len(extras)))})
    for index, extra in enumerate(extras):
        if not broadcasts_to(extra.shape, out.shape):
            raise ShapeError(f"conv_gemm: epilogue input ${index} {extra} does not broadcast to {out}")
    return out


def parts_type(out: TensorType, reduction: int, attrs, mode: str) -> TensorType:
    """`out`, or [S, *out] for a forward or input gradient split into S = chunks parts of its
    `reduction` (K = C·kh·kw or O·kh·kw, per group), none empty."""
    chunks = attrs.get("chunks", 1)
    if chunks == 1:
        return out
    check_splits(reduction, chunks, f"conv_gemm {mode} chunks")
    if (chunks - 1) * part_length(reduction, chunks) >= reduction:
        raise ShapeError(f"conv_gemm {mode}: K = {reduction} in {chunks} parts leaves the last part empty")
    return TensorType((chunks, *out.shape), out.dtype)


def reduction_masks(reduction: int, chunks: int) -> list[np.ndarray]:
    """For each part of a reduction of `reduction` split into `chunks` (`part_length`), the 0/1
    mask of the reduction indices it covers."""
    length, index = part_length(reduction, chunks), np.arange(reduction)
    return [((index >= s * length) & (index < (s + 1) * length)).astype(np.float32) for s in range(chunks)]


def grouped_columns(x, groups: int, kernel, stride, padding, dilation) -> np.ndarray:
    """unfold(x) [N, C·kh·kw, L] seen per group: [N, G, Cg·kh·kw, L]."""
    cols = evaluate_unfold(x, kernel, stride, padding, dilation)
    return cols.reshape(cols.shape[0], groups, -1, cols.shape[-1])


def evaluate_conv_gemm(
    a, b, *extras, mode, kernel, stride, padding, image, dilation=ONES, epilogue="$acc", chunks=1, groups=1
):
    """The GEMM of `mode` on the unfolded (or folded) operand, per group, then the epilogue."""
    kernel, stride, padding, image, dilation = (tuple(v) for v in (kernel, stride, padding, image, dilation))
    window = (kernel, stride, padding, dilation)
    taps = kernel[0] * kernel[1]
    if mode == "forward":
        ho, wo = conv_output_size(image, kernel, stride, padding, dilation=dilation)
        weight = a.reshape(groups, -1, a.shape[-1])  # [G, Og, Cg·taps]
        cols = grouped_columns(b, groups, *window)  # [N, G, Cg·taps, L]
        weights = [weight * mask for mask in reduction_masks(a.shape[-1], chunks)] if chunks > 1 else [weight]
        parts = [(w @ cols).reshape(b.shape[0], -1, ho, wo) for w in weights]
    elif mode == "grad_input":  # the reduction (o, i, j): a's element [o, c·taps + t] is index o·taps + t
        filters = a.shape[-2]
        weight = a.reshape(groups, filters, -1, taps)  # [G, Og, Cg, taps]
        masks = reduction_masks(filters * taps, chunks) if chunks > 1 else [np.ones(filters * taps, np.float32)]
        g = b.reshape(b.shape[0], groups, filters, -1)  # [N, G, Og, L]
        parts = []
        for mask in masks:
            w = (weight * mask.reshape(1, filters, 1, taps)).reshape(groups, filters, -1)
            cols = np.swapaxes(w, -1, -2) @ g  # [N, G, Cg·taps, L]
            parts.append(evaluate_fold(cols.reshape(b.shape[0], -1, cols.shape[-1]), image, *window))
    elif mode == "grad_weight":
        cols = grouped_columns(b, groups, *window)  # [N, G, Cg·taps, L]
        g = a.reshape(a.shape[0], groups, a.shape[-2], a.shape[-1])  # [N, G, Og, L]
        rows = np.transpose(g, (1, 2, 0, 3)).reshape(groups, g.shape[2], -1)  # [G, Og, (n, l)]
        columns = np.transpose(cols, (1, 2, 0, 3)).reshape(groups, cols.shape[2], -1)  # [G, Cg·taps, (n, l)]
        pairs = zip(split_parts(rows, chunks), split_parts(columns, chunks), strict=True)
        parts = [part_a @ np.swapaxes(part_b, -1, -2) for part_a, part_b in pairs]
        parts = parts if groups > 1 else [part[0] for part in parts]
    else:
        raise ValueError(f"conv_gemm: unknown mode {mode!r}")
    acc = np.stack(parts) if chunks > 1 else parts[0]
    values = {"acc": acc, **{str(i): x for i, x in enumerate(extras)}}
    return np.broadcast_to(evaluate_expr(epilogue, values, acc.dtype), acc.shape).copy()


def conv_gemm_flops(operands, results, attrs) -> int:
    """2·M·K·N of an implicit-GEMM convolution over all its groups: its first operand holds the
    G·M·K elements of the weight (or N·O·L of the gradient, for grad_weight) and its output M·N
    per group, M being the output's channel dim (dim 1 of an image [N, C, H, W], the filters of a
    weight gradient); a convolution in chunks (partials [S, …]) does the same work in S parts. An
    input gradient runs one GEMM per stride phase (sh·sw of them), each over the taps of its phase
    (the phases share the kh·kw taps out) and the ⌈H/sh⌉·⌈W/sw⌉ pixels of the largest phase."""
    a, output = operands[0], results[0]
    if attrs["mode"] == "grad_input":
        images, _, height, width = output.shape[-4:]
        stride = attrs["stride"]
        pixels = -(-height // stride[0]) * -(-width // stride[1])
        return 2 * a.numel * images * pixels  # a: the weight, O·C/G·kh·kw
    if attrs["mode"] == "forward":
        images, _, height, width = output.shape[-4:]
        return 2 * a.numel * images * height * width
    return 2 * a.numel * output.shape[-1]


def describe_conv_gemm(node) -> str:
    epilogue = f", epilogue {node.attr('epilogue')}" if node.attr("epilogue") != "$acc" else ""
    reduction = "N·L" if node.attr("mode") == "grad_weight" else "K"
    chunks = f" in {node.attr('chunks')} parts of {reduction}" if node.attr("chunks") != 1 else ""
    groups = f" in {node.attr('groups')} groups" if node.attr("groups") != 1 else ""
    return f"{node.attr('mode')} {describe_window(node)}{groups}{chunks}{epilogue}"


CONV_GEMM = Op(
    "conv_gemm",
    family=FAMILY,
    infer=infer_conv_gemm,
    evaluate=evaluate_conv_gemm,
    operands=("a", "b", "*extras"),
    attrs=(
        Attr("mode", STR),
        *WINDOW,
        Attr("image", INTS),
        Attr("epilogue", EXPR, "$acc"),
        Attr("chunks", INT, 1),
        Attr("groups", INT, 1),
    ),
    egraph=None,
    flops=conv_gemm_flops,
    describe=describe_conv_gemm,
    doc="an implicit-GEMM convolution kernel (forward, grad_input or grad_weight, in groups) with an epilogue",
)


# ---------------------------------------------------------------------------------------------
# Pooling (NCHW), PyTorch's semantics: max_pool2d pads with −inf and may dilate its window;
# avg_pool2d divides by the window's size clipped to the padded image (count_include_pad, the
# default: kh·kw but for a window past the padding in ceil mode), by its pixels inside the image
# (count_include_pad=False), or by `divisor` (torch's divisor_override; 0 for none). With
# `ceil_mode` the output size rounds up, keeping only windows that start inside the image or its
# left padding (torch's rule); the padding may be at most half the kernel, so every window holds
# an image pixel. Attributes: kernel, stride, padding (pairs); max: dilation, ceil_mode; avg:
# ceil_mode, count_include_pad, divisor. The gradients:
# - max_pool2d_grad(x, g) → [N, C, H, W]: each window's gradient goes to its arg-max, the first
#   maximal element in window scan order (row by row, as PyTorch picks on ties), or the last NaN
#   of a window that has one (PyTorch's scan takes a value that is greater or NaN), summed where
#   windows overlap. It recomputes the arg-max from x (no index buffer). max_pool2d propagates NaN.
# - avg_pool2d_grad(g; …, image=(H, W)) → [N, C, H, W]: g over the window's divisor, summed over
#   the windows that cover each pixel (padding receives nothing).


def pool_output_size(size, kernel, stride, padding, dilation, ceil_mode: bool, op: str) -> tuple[int, int]:
    """(Ho, Wo) of a pooling window (torch's pooling_output_shape): ⌊ or ⌈(size + 2·p − d·(k − 1)
    − 1)/s⌉ + 1, less the last window in ceil mode where it would start in the right padding."""
    out = []
    for extent, k, s, p, d in zip(size, kernel, stride, padding, dilation, strict=True):
        count = (extent + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (count - 1) * s >= extent + p:
            count -= 1
        if count < 1:
            raise ShapeError(f"{op}: kernel {tuple(kernel)} is larger than the padded input {tuple(size)}")
        out.append(count)
    return out[0], out[1]


def pool_geometry(attrs, op: str) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(kernel, stride, padding, dilation) of a pooling op, checked as PyTorch checks them."""
    kernel = pair(attrs.get("kernel"), f"{op} kernel")
    stride = pair(attrs.get("stride", kernel), f"{op} stride")
    padding = pair(attrs.get("padding", 0), f"{op} padding")
    dilation = pair(attrs.get("dilation", 1), f"{op} dilation")
    if min(kernel) < 1 or min(stride) < 1 or min(dilation) < 1 or min(padding) < 0:
        raise ShapeError(
            f"{op}: kernel {kernel}, stride {stride}, dilation {dilation} must be positive and padding {padding} >= 0"
        )
    if padding[0] > kernel[0] // 2 or padding[1] > kernel[1] // 2:
        raise ShapeError(f"{op}: padding {padding} should be at most half of the kernel size {kernel}")
    return kernel, stride, padding, dilation


def pool_size(image, attrs, op: str) -> tuple[int, int]:
    """(Ho, Wo) of a pooling op with these attributes over `image` (H, W)."""
    return pool_output_size(image, *pool_geometry(attrs, op), attrs.get("ceil_mode", False), op)


def infer_pool(op: str):
    def infer(types, attrs) -> TensorType:
        (x,) = types
        require_float([x], op)
        if x.rank != 4:
            raise ShapeError(f"{op}: expected an image batch [N, C, H, W], got {x}")
        if attrs.get("divisor", 0) < 0:
            raise ShapeError(f"{op}: the divisor must be positive (0: none), got {attrs['divisor']}")
        return TensorType((*x.shape[:2], *pool_size(x.shape[2:], attrs, op)), "f32")

    return infer


def infer_max_pool2d_grad(types, attrs) -> TensorType:
    x, g = types
    expected = infer_pool("max_pool2d_grad")([x], attrs)
    if g != expected:
        raise ShapeError(f"max_pool2d_grad: expected a gradient {expected} for x {x}, got {g}")
    return x


def infer_avg_pool2d_grad(types, attrs) -> TensorType:
    (g,) = types
    require_float([g], "avg_pool2d_grad")
    image = pair(attrs.get("image"), "avg_pool2d_grad image")
    if g.rank != 4:
        raise ShapeError(f"avg_pool2d_grad: expected a gradient [N, C, Ho, Wo], got {g}")
    image_type = TensorType((*g.shape[:2], *image), "f32")
    expected = infer_pool("avg_pool2d_grad")([image_type], attrs)
    if g != expected:
        raise ShapeError(f"avg_pool2d_grad: expected a gradient {expected} for the image {list(image)}, got {g}")
    return image_type


def pool_windows(x, kernel, stride, padding, fill, dilation=ONES, ceil_mode=False):
    """The windows of x [N, C, H, W] as [N, C, kh·kw, L] (scan order), `fill` outside the image,
    and the (rows, cols, valid) index arrays [kh·kw, L] of `window_index`."""
    out = pool_output_size(x.shape[2:], kernel, stride, padding, dilation, ceil_mode, "pool")
    rows, cols, valid = window_index(x.shape[2:], kernel, stride, padding, dilation, out)
    patches = np.where(valid, x[:, :, rows, cols], np.asarray(fill, dtype=x.dtype))
    return patches, rows, cols, valid


def evaluate_max_pool2d(x, kernel, stride, padding, dilation=ONES, ceil_mode=False):
    """torch.nn.functional.max_pool2d (padding counts as −inf)."""
    n, c, h, w = x.shape
    ho, wo = pool_output_size((h, w), kernel, stride, padding, dilation, ceil_mode, "max_pool2d")
    patches, *_ = pool_windows(x, kernel, stride, padding, -np.inf, dilation, ceil_mode)
    return patches.max(axis=2).reshape(n, c, ho, wo)


def window_argmax(patches: np.ndarray) -> np.ndarray:
    """The tap [N, C, L] of each window's maximum in patches [N, C, kh·kw, L], as PyTorch's
    max_pool2d picks it: the first maximum in scan order, or the last NaN (its scan takes a value
    that is greater or NaN); the first pixel where all are −inf."""
    nan = np.isnan(patches)
    last_nan = patches.shape[2] - 1 - nan[:, :, ::-1].argmax(axis=2)
    return np.where(nan.any(axis=2), last_nan, np.where(nan, -np.inf, patches).argmax(axis=2))


def evaluate_max_pool2d_grad(x, g, kernel, stride, padding, dilation=ONES, ceil_mode=False):
    """g of every window added at its arg-max (`window_argmax`)."""
    n, c, h, w = x.shape
    patches, rows, cols, _ = pool_windows(x, kernel, stride, padding, -np.inf, dilation, ceil_mode)
    tap = window_argmax(patches)  # [N, C, L]
    position = np.arange(tap.shape[-1])
    flat = rows[tap, position] * w + cols[tap, position]  # [N, C, L] index into H·W
    out = np.zeros((n * c, h * w), dtype=np.result_type(x, g))
    np.add.at(out, (np.arange(n * c)[:, None], flat.reshape(n * c, -1)), g.reshape(n * c, -1))
    return out.reshape(n, c, h, w)


def avg_divisors(image, kernel, stride, padding, out, count_include_pad=True, divisor=0) -> np.ndarray:
    """[Ho, Wo]: what avg_pool2d divides each window's sum by (torch's avg_pool2d): `divisor` when
    given, else the window clipped to the padded image (count_include_pad) or to the image."""
    if divisor:
        return np.full(out, float(divisor))
    sizes = []
    for extent, k, s, p, count in zip(image, kernel, stride, padding, out, strict=True):
        start = np.arange(count) * s - p
        end = np.minimum(start + k, extent + p)
        sizes.append(end - start if count_include_pad else np.minimum(end, extent) - np.maximum(start, 0))
    return np.outer(*sizes).astype(np.float64)


def evaluate_avg_pool2d(x, kernel, stride, padding, ceil_mode=False, count_include_pad=True, divisor=0):
    """torch.nn.functional.avg_pool2d: the sum over the window's image pixels over its divisor."""
    n, c, h, w = x.shape
    ho, wo = pool_output_size((h, w), kernel, stride, padding, ONES, ceil_mode, "avg_pool2d")
    patches, *_ = pool_windows(x, kernel, stride, padding, 0.0, ONES, ceil_mode)
    divisors = avg_divisors((h, w), kernel, stride, padding, (ho, wo), count_include_pad, divisor)
    return (patches.sum(axis=2).reshape(n, c, ho, wo) / divisors).astype(x.dtype)


def evaluate_avg_pool2d_grad(g, kernel, stride, padding, image, ceil_mode=False, count_include_pad=True, divisor=0):
    """g over its window's divisor added onto every image pixel of the window."""
    n, c, ho, wo = g.shape
    rows, cols, valid = window_index(tuple(image), kernel, stride, padding, ONES, (ho, wo))
    divisors = avg_divisors(tuple(image), kernel, stride, padding, (ho, wo), count_include_pad, divisor)
    share = (g / divisors).reshape(n, c, 1, -1) * valid  # [N, C, kh·kw, L]
    out = np.zeros((n, c, *image), dtype=g.dtype)
    np.add.at(out, (slice(None), slice(None), rows, cols), share)
    return out


MAX_POOL_WINDOW = (
    Attr("kernel", INTS),
    Attr("stride", INTS),
    Attr("padding", INTS, (0, 0)),
    Attr("dilation", INTS, ONES),
    Attr("ceil_mode", BOOL, False),
)
AVG_POOL_WINDOW = (
    Attr("kernel", INTS),
    Attr("stride", INTS),
    Attr("padding", INTS, (0, 0)),
    Attr("ceil_mode", BOOL, False),
    Attr("count_include_pad", BOOL, True),
    Attr("divisor", INT, 0),
)


def describe_pool(node) -> str:
    flags = [name for name in ("ceil_mode",) if node.attr(name)]
    flags += ["count_include_pad=False"] * (node.attr("count_include_pad", True) is False)
    flags += [f"divisor {node.attr('divisor')}"] * bool(node.attr("divisor", 0))
    return " ".join([describe_window(node), *flags])


def pool_op(name: str, infer, evaluate, operands, attrs, doc) -> Op:
    return Op(
        name, family=FAMILY, infer=infer, evaluate=evaluate, operands=operands, attrs=attrs,
        describe=describe_pool, doc=doc,
    )  # fmt: skip


MAX_POOL2D = pool_op("max_pool2d", infer_pool("max_pool2d"), evaluate_max_pool2d, ("x",), MAX_POOL_WINDOW,
                     "the maximum over each window (padding counts as −inf)")  # fmt: skip
MAX_POOL2D_GRAD = pool_op("max_pool2d_grad", infer_max_pool2d_grad, evaluate_max_pool2d_grad, ("x", "g"),
                          MAX_POOL_WINDOW, "each window's gradient at its first arg-max")  # fmt: skip
AVG_POOL2D = pool_op("avg_pool2d", infer_pool("avg_pool2d"), evaluate_avg_pool2d, ("x",), AVG_POOL_WINDOW,
                     "the mean over each window (torch's divisor)")  # fmt: skip
AVG_POOL2D_GRAD = pool_op("avg_pool2d_grad", infer_avg_pool2d_grad, evaluate_avg_pool2d_grad, ("g",),
                          (*AVG_POOL_WINDOW, Attr("image", INTS)),
                          "g over its window's divisor spread back over the window")  # fmt: skip


def pool_attrs(node) -> dict:
    """The window attributes of a pooling op (all but a gradient's `image`)."""
    return {key: value for key, value in node.attr_dict.items() if key != "image"}


@MAX_POOL2D.vjp
def _max_pool2d(b, node, g):
    """dx = max_pool2d_grad(x, g): g routed to each window's first arg-max."""
    return [b.emit("max_pool2d_grad", [node.inputs[0], g], **pool_attrs(node))]


@MAX_POOL2D_GRAD.vjp
def _max_pool2d_grad(b, node, g):
    """Second derivatives of max pooling are not needed by a training step (gradients are taken
    once); refuse clearly rather than guess."""
    raise NotImplementedError(
        f"autodiff: max_pool2d_grad has no gradient rule (double backward through max pooling), "
        f"{', '.join(node.sources)}"
    )


@AVG_POOL2D.vjp
def _avg_pool2d(b, node, g):
    """dx = avg_pool2d_grad(g): g over each window's divisor spread back over the window."""
    x = node.inputs[0]
    return [b.emit("avg_pool2d_grad", [g], **pool_attrs(node), image=tuple(b.shape(x)[2:]))]


@AVG_POOL2D_GRAD.vjp
def _avg_pool2d_grad(b, node, g):
    """avg_pool2d_grad is linear and avg_pool2d is its adjoint."""
    return [b.emit("avg_pool2d", [g], **pool_attrs(node))]


# ---------------------------------------------------------------------------------------------
# Adaptive pooling, torch's windows: output index i of a dim of `size` pixels pooled to `out`
# covers [⌊i·size/out⌋, ⌈(i + 1)·size/out⌉), uneven where out does not divide size (windows may
# overlap, and repeat a pixel where out > size).
# - adaptive_max_pool2d(x; output_size) [N, C, oh, ow]: the maximum over each window (NaN
#   propagates, as torch);
# - adaptive_max_pool2d_grad(x, g; output_size) [N, C, H, W]: each window's gradient at its
#   arg-max, recomputed from x as torch's kernel picks it: the first maximum in scan order, or
#   the last NaN of a window that holds one;
# - adaptive_pool_matrix(; size, output_size) [out, size]: the averaging matrix of one dim, entry
#   (i, h) 1/|window i| where h is in window i, else 0. adaptive_avg_pool2d is traced as products
#   with it (functional.py), so that autodiff derives its gradient from matmuls.


def adaptive_windows(size: int, out: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of the `out` adaptive windows over `size` pixels."""
    index = np.arange(out)
    return index * size // out, -(-(index + 1) * size // out)


def adaptive_size(attrs, op: str) -> tuple[int, int]:
    size = pair(attrs.get("output_size"), f"{op} output_size")
    if min(size) < 1:
        raise ShapeError(f"{op}: output_size {size} must be positive")
    return size


def infer_adaptive_max_pool2d(types, attrs) -> TensorType:
    (x,) = types
    require_float([x], "adaptive_max_pool2d")
    if x.rank != 4:
        raise ShapeError(f"adaptive_max_pool2d: expected an image batch [N, C, H, W], got {x}")
    return TensorType((*x.shape[:2], *adaptive_size(attrs, "adaptive_max_pool2d")), "f32")


def infer_adaptive_max_pool2d_grad(types, attrs) -> TensorType:
    x, g = types
    expected = infer_adaptive_max_pool2d([x], attrs)
    if g != expected:
        raise ShapeError(f"adaptive_max_pool2d_grad: expected a gradient {expected} for x {x}, got {g}")
    return x


def adaptive_window_pixels(image, output_size):
    """For each output (i, j) in row-major order: the window's pixel rows and columns, scan order."""
    (rows_start, rows_end), (cols_start, cols_end) = (
        adaptive_windows(s, o) for s, o in zip(image, output_size, strict=True)
    )
    for i in range(output_size[0]):
        for j in range(output_size[1]):
            yield i, j, np.arange(rows_start[i], rows_end[i]), np.arange(cols_start[j], cols_end[j])


def evaluate_adaptive_max_pool2d(x, output_size):
    """torch.nn.functional.adaptive_max_pool2d."""
    out = np.empty((*x.shape[:2], *output_size), dtype=x.dtype)
    for i, j, rows, cols in adaptive_window_pixels(x.shape[2:], output_size):
        out[:, :, i, j] = x[:, :, rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].max(axis=(2, 3))
    return out


def torch_arg_max(patches: np.ndarray) -> np.ndarray:
    """The index along the last axis that torch's max pooling keeps: the last NaN where there is
    one (`v > best || isnan(v)` replaces it), else the first maximum."""
    nan = np.isnan(patches)
    last_nan = patches.shape[-1] - 1 - np.argmax(nan[..., ::-1], axis=-1)
    first_max = np.argmax(np.where(nan, -np.inf, patches), axis=-1)
    return np.where(nan.any(axis=-1), last_nan, first_max)


def evaluate_adaptive_max_pool2d_grad(x, g, output_size):
    """g of every window added at its arg-max (`torch_arg_max`)."""
    n, c, h, w = x.shape
    out = np.zeros((n * c, h * w), dtype=np.result_type(x, g))
    planes = np.arange(n * c)
    for i, j, rows, cols in adaptive_window_pixels((h, w), output_size):
        flat = (rows[:, None] * w + cols[None, :]).reshape(-1)  # scan order
        tap = torch_arg_max(x.reshape(n * c, h * w)[:, flat])
        np.add.at(out, (planes, flat[tap]), g[:, :, i, j].reshape(-1))
    return out.reshape(n, c, h, w)


def infer_adaptive_pool_matrix(types, attrs) -> TensorType:
    size, out = attrs["size"], attrs["output_size"]
    if size < 1 or out < 1:
        raise ShapeError(f"adaptive_pool_matrix: sizes must be positive, got {size} and {out}")
    return TensorType((out, size), "f32")


def evaluate_adaptive_pool_matrix(size, output_size):
    starts, ends = adaptive_windows(size, output_size)
    pixels = np.arange(size)[None, :]
    inside = (pixels >= starts[:, None]) & (pixels < ends[:, None])
    return np.where(inside, 1.0 / (ends - starts)[:, None], 0.0)


ADAPTIVE_MAX_POOL2D = Op(
    "adaptive_max_pool2d",
    family=FAMILY,
    infer=infer_adaptive_max_pool2d,
    evaluate=evaluate_adaptive_max_pool2d,
    operands=("x",),
    attrs=(Attr("output_size", INTS),),
    doc="the maximum over each of torch's adaptive windows",
)
ADAPTIVE_MAX_POOL2D_GRAD = Op(
    "adaptive_max_pool2d_grad",
    family=FAMILY,
    infer=infer_adaptive_max_pool2d_grad,
    evaluate=evaluate_adaptive_max_pool2d_grad,
    operands=("x", "g"),
    attrs=(Attr("output_size", INTS),),
    doc="each adaptive window's gradient at its arg-max (as torch picks it)",
)
ADAPTIVE_POOL_MATRIX = Op(
    "adaptive_pool_matrix",
    family=FAMILY,
    infer=infer_adaptive_pool_matrix,
    evaluate=evaluate_adaptive_pool_matrix,
    attrs=(Attr("size", INT), Attr("output_size", INT)),
    doc="[out, size]: 1/|window| over each adaptive window of one dim (adaptive_avg_pool2d's factor)",
)


@ADAPTIVE_MAX_POOL2D.vjp
def _adaptive_max_pool2d(b, node, g):
    """dx = adaptive_max_pool2d_grad(x, g)."""
    return [b.emit("adaptive_max_pool2d_grad", [node.inputs[0], g], output_size=node.attr("output_size"))]


@ADAPTIVE_MAX_POOL2D_GRAD.vjp
def _adaptive_max_pool2d_grad(b, node, g):
    raise NotImplementedError(
        f"autodiff: adaptive_max_pool2d_grad has no gradient rule (double backward through max pooling), "
        f"{', '.join(node.sources)}"
    )
