"""Image ops (NCHW): unfold and fold (the plain form of a convolution), `conv_gemm` (the
implicit-GEMM convolution kernels the e-graph makes of them), and pooling with its gradients.

A convolution is traced as im2col and a matmul, exactly as torch.nn.functional.unfold defines
it: `unfold(x)` [N, C, H, W] → [N, C·kh·kw, L] (L = Ho·Wo output positions), then
`matmul(weight [O, C·kh·kw], cols)` → [N, O, L]. Autodiff of that is plain too: the weight
gradient is Σₙ g·colsᵀ and the input gradient is `fold(weightᵀ·g)` (fold, the adjoint of unfold,
sums the columns back onto the image). The e-graph rewrites these compositions into
implicit-GEMM kernels that gather their operand while loading it, so that the columns are never
written (`rewrite/conv.py`); without the rewrite the columns are a real buffer.

Geometry attributes, shared by every op here, each a pair of ints: `kernel` (kh, kw), `stride`
(sh, sw), `padding` (ph, pw); no dilation. Column row index (c·kh + i)·kw + j, column index
ho·Wo + wo, reading x[n, c, ho·sh − ph + i, wo·sw − pw + j] (0 outside the image).
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.expr import check_expr
from meganeura.ir.expr import evaluate as evaluate_expr
from meganeura.ir.graph import TensorType
from meganeura.ir.op import EXPR, INT, INTS, STR, Attr, Op, ShapeError, broadcasts_to, require_float
from meganeura.ir.ops.matmul import part_length
from meganeura.ir.ops.reduce import check_splits, split_parts

FAMILY = "image"


def pair(value, what: str) -> tuple[int, int]:
    """An int or a pair of ints as a pair (PyTorch accepts both for kernel_size, stride, padding)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return (int(value[0]), int(value[1]))
    raise ShapeError(f"{what}: expected an int or a pair of ints, got {value!r}")


def conv_output_size(size: tuple[int, int], kernel, stride, padding, op: str = "conv2d") -> tuple[int, int]:
    """(Ho, Wo) of a window of `kernel` sliding over `size` with `stride` and `padding`."""
    out = []
    for extent, k, s, p in zip(size, kernel, stride, padding, strict=True):
        if k < 1 or s < 1 or p < 0:
            raise ShapeError(f"{op}: kernel {kernel}, stride {stride}, padding {padding} must be positive")
        if extent + 2 * p < k:
            raise ShapeError(f"{op}: kernel {tuple(kernel)} is larger than the padded input {tuple(size)}")
        out.append((extent + 2 * p - k) // s + 1)
    return out[0], out[1]


def window_index(shape, kernel, stride, padding):
    """(rows, cols, valid) index arrays of the unfolded layout into the image [H, W]: for each column
    row r = (c·kh + i)·kw + j (c left out: the same for every channel) and column l = ho·Wo + wo."""
    height, width = shape
    kh, kw = kernel
    ho, wo = conv_output_size(shape, kernel, stride, padding)
    i, j = np.meshgrid(np.arange(kh), np.arange(kw), indexing="ij")
    oy, ox = np.meshgrid(np.arange(ho), np.arange(wo), indexing="ij")
    rows = oy.reshape(1, -1) * stride[0] - padding[0] + i.reshape(-1, 1)
    cols = ox.reshape(1, -1) * stride[1] - padding[1] + j.reshape(-1, 1)
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
    kernel, stride, padding = attrs["kernel"], attrs["stride"], attrs["padding"]
    ho, wo = conv_output_size((h, w), kernel, stride, padding, "unfold")
    return TensorType((n, c * kernel[0] * kernel[1], ho * wo), "f32")


def evaluate_unfold(x, kernel, stride, padding):
    """torch.nn.functional.unfold: [N, C, H, W] → [N, C·kh·kw, L]."""
    n, c, h, w = x.shape
    rows, cols, valid = window_index((h, w), kernel, stride, padding)
    patches = x[:, :, rows, cols] * valid  # [N, C, kh·kw, L]
    return patches.reshape(n, c * kernel[0] * kernel[1], -1)


def infer_fold(types, attrs) -> TensorType:
    (cols,) = types
    require_float([cols], "fold")
    kernel, stride, padding = attrs["kernel"], attrs["stride"], attrs["padding"]
    size = tuple(attrs["output_size"])
    taps = kernel[0] * kernel[1]
    ho, wo = conv_output_size(size, kernel, stride, padding, "fold")
    if cols.rank != 3 or cols.shape[1] % taps or cols.shape[2] != ho * wo:
        raise ShapeError(f"fold: expected columns [N, C·{taps}, {ho * wo}] for output {list(size)}, got {cols}")
    return TensorType((cols.shape[0], cols.shape[1] // taps, *size), "f32")


def evaluate_fold(cols, output_size, kernel, stride, padding):
    """torch.nn.functional.fold: [N, C·kh·kw, L] → [N, C, H, W], overlapping windows summed."""
    n, ck, _ = cols.shape
    c = ck // (kernel[0] * kernel[1])
    rows, columns, valid = window_index(tuple(output_size), kernel, stride, padding)
    out = np.zeros((n, c, *output_size), dtype=cols.dtype)
    patches = cols.reshape(n, c, kernel[0] * kernel[1], -1) * valid
    np.add.at(out, (slice(None), slice(None), rows, columns), patches)
    return out


def window_attrs(node) -> dict:
    return {key: node.attr(key) for key in ("kernel", "stride", "padding")}


def describe_window(node) -> str:
    (kh, kw), (sh, sw), (ph, pw) = (node.attr(key) for key in ("kernel", "stride", "padding"))
    return f"{kh}x{kw}/s{sh},{sw}/p{ph},{pw}"


WINDOW = (Attr("kernel", INTS), Attr("stride", INTS, (1, 1)), Attr("padding", INTS, (0, 0)))

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
# matmul. Each mode is one GEMM  out[row, col] = epilogue(Σ_r A[row, r] · B[r, col]) whose
# im2col operand is gathered from the image while the GEMM tile is loaded, never written:
#
# - forward (a = weight [O, C·kh·kw], b = x [N, C, H, W] → [N, O, Ho, Wo]):
#   rows o, columns (n, ho, wo), reduction r = (c, i, j). A[o, r] = weight[o, r] as stored;
#   B[r, (n, ho, wo)] = x[n, c, ho·sh − ph + i, wo·sw − pw + j] (0 outside the image) is the
#   gathered column. Output element (n, o, ho, wo), NCHW.
# - grad_input (a = weight [O, C·kh·kw], b = g [N, O, L] → [N, C, H, W]): the adjoint,
#   fold(weightᵀ·g). Rows c, columns (n, y, x), reduction (o, i, j). A[c, (o, i, j)] =
#   weight[o, (c·kh + i)·kw + j] (a permuted read of the weight); B[(o, i, j), (n, y, x)] =
#   g[n, o, ho·Wo + wo] with ho = (y + ph − i)/sh, wo = (x + pw − j)/sw when both divide exactly
#   and land inside [0, Ho) × [0, Wo), else 0: each output pixel gathers the output positions
#   whose windows cover it, so fold's scattered sum becomes a reduction without atomics.
# - grad_weight (a = g [N, O, L], b = x [N, C, H, W] → [O, C·kh·kw]): Σₙ g[n]·unfold(x)[n]ᵀ.
#   Rows o, columns (c, i, j), reduction (n, ho, wo) over every image. A[o, (n, l)] = g[n, o, l];
#   B[(n, l), (c, i, j)] = x gathered as in forward (the transposed column).
#
# Attributes: mode, kernel, stride, padding (pairs, as for unfold), image = (H, W), the spatial
# size of the image (x for forward and grad_weight, the result for grad_input: it cannot be
# recovered from L alone when the stride does not divide), epilogue (an expression over `$acc`
# and the extras `$0, $1…` = inputs[2:], each broadcast to the output; default "$acc"), and for
# `chunks` S (default 1): with S > 1 the GEMM's reduction is split into S parts and the result
# holds one partial sum per part, [S, *out] (summed by a reduction after it): split-K, for a GEMM
# whose output has too few tiles to keep the GPU busy. grad_weight's reduction (n, ho, wo), N·L
# long, splits into parts of ⌈N·L/S⌉ (the last may be shorter; none empty, `reduce.check_splits`;
# S = N is one part per image); forward's (c, i, j) and a stride-1 grad_input's (o, i, j), K
# long, into parts of `matmul.part_length(K, S)` (whole 16-element K tiles, as a split matmul's).

CONV_GEMM_MODES = ("forward", "grad_input", "grad_weight")


def conv_gemm_geometry(attrs) -> tuple[str, tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(mode, kernel, stride, padding, image) of a conv_gemm, checked."""
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


def infer_conv_gemm(types, attrs) -> TensorType:
    if len(types) < 2:
        raise ShapeError(f"conv_gemm: expected at least two operands (a, b), got {len(types)}")
    require_float(types, "conv_gemm")
    mode, kernel, stride, padding, image = conv_gemm_geometry(attrs)
    a, b, extras = types[0], types[1], types[2:]
    taps = kernel[0] * kernel[1]
    ho, wo = conv_output_size(image, kernel, stride, padding, "conv_gemm")
    if mode in ("forward", "grad_input"):
        if a.rank != 2 or a.shape[1] % taps:
            raise ShapeError(f"conv_gemm {mode}: expected a weight matrix [O, C·{taps}] as a, got {a}")
        filters, channels = a.shape[0], a.shape[1] // taps
    if mode == "forward":
        if b.rank != 4:
            raise ShapeError(f"conv_gemm forward: expected an image batch [N, C, H, W] as b, got {b}")
        if b.shape[1] != channels:
            raise ShapeError(f"conv_gemm forward: weight {a} has {channels} channels per filter, x {b} {b.shape[1]}")
        if tuple(b.shape[2:]) != image:
            raise ShapeError(f"conv_gemm forward: x {b} is not of the image size {list(image)}")
        out = parts_type(TensorType((b.shape[0], filters, ho, wo), "f32"), a.shape[1], attrs, mode)
    elif mode == "grad_input":
        if b.rank != 3:
            raise ShapeError(f"conv_gemm grad_input: expected an output gradient [N, O, L] as b, got {b}")
        if b.shape[1] != filters:
            raise ShapeError(f"conv_gemm grad_input: weight {a} has {filters} filters, the gradient {b} {b.shape[1]}")
        if b.shape[2] != ho * wo:
            raise ShapeError(
                f"conv_gemm grad_input: gradient {b} should have {ho}·{wo} = {ho * wo} positions (image {list(image)})"
            )
        out = parts_type(TensorType((b.shape[0], channels, *image), "f32"), filters * taps, attrs, mode)
    else:
        if a.rank != 3:
            raise ShapeError(f"conv_gemm grad_weight: expected an output gradient [N, O, L] as a, got {a}")
        if b.rank != 4:
            raise ShapeError(f"conv_gemm grad_weight: expected an image batch [N, C, H, W] as b, got {b}")
        if a.shape[0] != b.shape[0]:
            raise ShapeError(f"conv_gemm grad_weight: batch sizes differ: gradient {a}, x {b}")
        if tuple(b.shape[2:]) != image:
            raise ShapeError(f"conv_gemm grad_weight: x {b} is not of the image size {list(image)}")
        if a.shape[2] != ho * wo:
            raise ShapeError(
                f"conv_gemm grad_weight: gradient {a} should have {ho}·{wo} = {ho * wo} positions (image {list(image)})"
            )
        chunks = check_splits(a.shape[0] * a.shape[2], attrs.get("chunks", 1), "conv_gemm grad_weight chunks")
        out = TensorType((*((chunks,) if chunks > 1 else ()), a.shape[1], b.shape[1] * taps), "f32")
    check_expr("conv_gemm", attrs.get("epilogue", "$acc"), {"acc", *map(str, range(len(extras)))})
    for index, extra in enumerate(extras):
        if not broadcasts_to(extra.shape, out.shape):
            raise ShapeError(f"conv_gemm: epilogue input ${index} {extra} does not broadcast to {out}")
    return out


def parts_type(out: TensorType, reduction: int, attrs, mode: str) -> TensorType:
    """`out`, or [S, *out] for a forward or input gradient split into S = chunks parts of its
    `reduction` (K = C·kh·kw or O·kh·kw), none empty."""
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


def evaluate_conv_gemm(a, b, *extras, mode, kernel, stride, padding, image, epilogue="$acc", chunks=1):
    """The GEMM of `mode` on the unfolded (or folded) operand, then the epilogue."""
    kernel, stride, padding, image = tuple(kernel), tuple(stride), tuple(padding), tuple(image)
    if mode == "forward":
        ho, wo = conv_output_size(image, kernel, stride, padding)
        cols = evaluate_unfold(b, kernel, stride, padding)  # [N, C·kh·kw, L]
        weights = [a * mask for mask in reduction_masks(a.shape[1], chunks)] if chunks > 1 else [a]
        parts = [(w @ cols).reshape(b.shape[0], a.shape[0], ho, wo) for w in weights]
        acc = np.stack(parts) if chunks > 1 else parts[0]
    elif mode == "grad_input":  # the reduction (o, i, j): a's element [o, c·taps + t] is index o·taps + t
        filters, taps = a.shape[0], kernel[0] * kernel[1]
        masks = reduction_masks(filters * taps, chunks) if chunks > 1 else [np.ones(filters * taps, np.float32)]
        weights = [(a.reshape(filters, -1, taps) * m.reshape(filters, 1, taps)).reshape(a.shape) for m in masks]
        parts = [evaluate_fold(w.T @ b, image, kernel, stride, padding) for w in weights]
        acc = np.stack(parts) if chunks > 1 else parts[0]
    elif mode == "grad_weight":
        cols = evaluate_unfold(b, kernel, stride, padding)  # [N, C·kh·kw, L]
        rows = np.transpose(a, (1, 0, 2)).reshape(a.shape[1], -1)  # [O, (n, l)]
        columns = np.transpose(cols, (1, 0, 2)).reshape(cols.shape[1], -1)  # [C·kh·kw, (n, l)]
        pairs = zip(split_parts(rows, chunks), split_parts(columns, chunks), strict=True)
        parts = [part_a @ part_b.T for part_a, part_b in pairs]
        acc = np.stack(parts) if chunks > 1 else parts[0]
    else:
        raise ValueError(f"conv_gemm: unknown mode {mode!r}")
    values = {"acc": acc, **{str(i): x for i, x in enumerate(extras)}}
    return np.broadcast_to(evaluate_expr(epilogue, values, acc.dtype), acc.shape).copy()


def conv_gemm_flops(operands, results, attrs) -> int:
    """2·M·K·N of an implicit-GEMM convolution: its first operand holds M·K elements (the
    weight, or the gradient [N, O, L] for grad_weight) and its output M·N, M being the output's
    channel dim (dim 1 of an image [N, C, H, W], dim 0 of a weight gradient [O, C·kh·kw]); a
    convolution in chunks (partials [S, …]) does the same work in S parts. An input gradient runs
    one GEMM per stride phase (sh·sw of them), each over the taps of its phase (the phases share
    the kh·kw taps out) and the ⌈H/sh⌉·⌈W/sw⌉ pixels of the largest phase."""
    a, output = operands[0], results[0]
    if attrs["mode"] == "grad_input":
        images, _, height, width = output.shape[-4:]
        stride = attrs["stride"]
        pixels = -(-height // stride[0]) * -(-width // stride[1])
        return 2 * a.numel * images * pixels  # a: the weight, O·C·kh·kw
    if attrs["mode"] == "forward":
        images, _, height, width = output.shape[-4:]
        return 2 * a.numel * images * height * width
    return 2 * a.numel * output.shape[-1]


def describe_conv_gemm(node) -> str:
    epilogue = f", epilogue {node.attr('epilogue')}" if node.attr("epilogue") != "$acc" else ""
    reduction = "N·L" if node.attr("mode") == "grad_weight" else "K"
    chunks = f" in {node.attr('chunks')} parts of {reduction}" if node.attr("chunks") != 1 else ""
    return f"{node.attr('mode')} {describe_window(node)}{chunks}{epilogue}"


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
    ),
    egraph=None,
    flops=conv_gemm_flops,
    describe=describe_conv_gemm,
    doc="an implicit-GEMM convolution kernel (forward, grad_input or grad_weight) with an epilogue",
)


# ---------------------------------------------------------------------------------------------
# Pooling (NCHW), PyTorch's semantics: max_pool2d pads with −inf, avg_pool2d counts the padding
# (count_include_pad=True) and divides by kh·kw; ceil_mode=False, no dilation; the padding may be
# at most half the kernel, so every window holds at least one image pixel. Attributes: kernel,
# stride, padding (pairs). The gradients:
# - max_pool2d_grad(x, g) → [N, C, H, W]: each window's gradient goes to its arg-max, the first
#   maximal element in window scan order (row by row, as PyTorch picks on ties), or the last NaN
#   of a window that has one (PyTorch's scan takes a value that is greater or NaN), summed where
#   windows overlap. It recomputes the arg-max from x (no index buffer). max_pool2d propagates NaN.
# - avg_pool2d_grad(g; …, image=(H, W)) → [N, C, H, W]: g/(kh·kw) summed over the windows that
#   cover each pixel (padding receives nothing).


def pool_geometry(attrs, op: str) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """(kernel, stride, padding) of a pooling op, checked as PyTorch checks them."""
    kernel = pair(attrs.get("kernel"), f"{op} kernel")
    stride = pair(attrs.get("stride", kernel), f"{op} stride")
    padding = pair(attrs.get("padding", 0), f"{op} padding")
    if min(kernel) < 1 or min(stride) < 1 or min(padding) < 0:
        raise ShapeError(f"{op}: kernel {kernel}, stride {stride} must be positive and padding {padding} >= 0")
    if padding[0] > kernel[0] // 2 or padding[1] > kernel[1] // 2:
        raise ShapeError(f"{op}: padding {padding} should be at most half of the kernel size {kernel}")
    return kernel, stride, padding


def infer_pool(op: str):
    def infer(types, attrs) -> TensorType:
        (x,) = types
        require_float([x], op)
        if x.rank != 4:
            raise ShapeError(f"{op}: expected an image batch [N, C, H, W], got {x}")
        kernel, stride, padding = pool_geometry(attrs, op)
        ho, wo = conv_output_size(x.shape[2:], kernel, stride, padding, op)
        return TensorType((*x.shape[:2], ho, wo), "f32")

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


def pool_windows(x, kernel, stride, padding, fill):
    """The windows of x [N, C, H, W] as [N, C, kh·kw, L] (scan order), `fill` outside the image,
    and the (rows, cols, valid) index arrays [kh·kw, L] of `window_index`."""
    rows, cols, valid = window_index(x.shape[2:], kernel, stride, padding)
    patches = np.where(valid, x[:, :, rows, cols], np.asarray(fill, dtype=x.dtype))
    return patches, rows, cols, valid


def evaluate_max_pool2d(x, kernel, stride, padding):
    """torch.nn.functional.max_pool2d (padding counts as −inf)."""
    n, c, h, w = x.shape
    ho, wo = conv_output_size((h, w), kernel, stride, padding)
    patches, *_ = pool_windows(x, kernel, stride, padding, -np.inf)
    return patches.max(axis=2).reshape(n, c, ho, wo)


def window_argmax(patches: np.ndarray) -> np.ndarray:
    """The tap [N, C, L] of each window's maximum in patches [N, C, kh·kw, L], as PyTorch's
    max_pool2d picks it: the first maximum in scan order, or the last NaN (its scan takes a value
    that is greater or NaN); the first pixel where all are −inf."""
    nan = np.isnan(patches)
    last_nan = patches.shape[2] - 1 - nan[:, :, ::-1].argmax(axis=2)
    return np.where(nan.any(axis=2), last_nan, np.where(nan, -np.inf, patches).argmax(axis=2))


def evaluate_max_pool2d_grad(x, g, kernel, stride, padding):
    """g of every window added at its arg-max (`window_argmax`)."""
    n, c, h, w = x.shape
    patches, rows, cols, _ = pool_windows(x, kernel, stride, padding, -np.inf)
    tap = window_argmax(patches)  # [N, C, L]
    position = np.arange(tap.shape[-1])
    flat = rows[tap, position] * w + cols[tap, position]  # [N, C, L] index into H·W
    out = np.zeros((n * c, h * w), dtype=np.result_type(x, g))
    np.add.at(out, (np.arange(n * c)[:, None], flat.reshape(n * c, -1)), g.reshape(n * c, -1))
    return out.reshape(n, c, h, w)


def evaluate_avg_pool2d(x, kernel, stride, padding):
    """torch.nn.functional.avg_pool2d (count_include_pad=True: the sum over kh·kw, padding 0)."""
    n, c, h, w = x.shape
    ho, wo = conv_output_size((h, w), kernel, stride, padding)
    patches, *_ = pool_windows(x, kernel, stride, padding, 0.0)
    return (patches.sum(axis=2) / (kernel[0] * kernel[1])).reshape(n, c, ho, wo)


def evaluate_avg_pool2d_grad(g, kernel, stride, padding, image):
    """g/(kh·kw) added onto every image pixel of its window."""
    n, c = g.shape[:2]
    rows, cols, valid = window_index(tuple(image), kernel, stride, padding)
    share = g.reshape(n, c, 1, -1) / (kernel[0] * kernel[1]) * valid  # [N, C, kh·kw, L]
    out = np.zeros((n, c, *image), dtype=g.dtype)
    np.add.at(out, (slice(None), slice(None), rows, cols), share)
    return out


POOL_WINDOW = (Attr("kernel", INTS), Attr("stride", INTS), Attr("padding", INTS, (0, 0)))


def pool_op(name: str, infer, evaluate, operands, attrs, doc) -> Op:
    return Op(
        name, family=FAMILY, infer=infer, evaluate=evaluate, operands=operands, attrs=attrs,
        describe=describe_window, doc=doc,
    )  # fmt: skip


MAX_POOL2D = pool_op("max_pool2d", infer_pool("max_pool2d"), evaluate_max_pool2d, ("x",), POOL_WINDOW,
                     "the maximum over each window (padding counts as −inf)")  # fmt: skip
MAX_POOL2D_GRAD = pool_op("max_pool2d_grad", infer_max_pool2d_grad, evaluate_max_pool2d_grad, ("x", "g"),
                          POOL_WINDOW, "each window's gradient at its first arg-max")  # fmt: skip
AVG_POOL2D = pool_op("avg_pool2d", infer_pool("avg_pool2d"), evaluate_avg_pool2d, ("x",), POOL_WINDOW,
                     "the mean over each window (the zero padding counts)")  # fmt: skip
AVG_POOL2D_GRAD = pool_op("avg_pool2d_grad", infer_avg_pool2d_grad, evaluate_avg_pool2d_grad, ("g",),
                          (*POOL_WINDOW, Attr("image", INTS)), "g/(kh·kw) spread back over each window")  # fmt: skip


@MAX_POOL2D.vjp
def _max_pool2d(b, node, g):
    """dx = max_pool2d_grad(x, g): g routed to each window's first arg-max."""
    return [b.emit("max_pool2d_grad", [node.inputs[0], g], **window_attrs(node))]


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
    """dx = avg_pool2d_grad(g): g/(kh·kw) spread back over each window."""
    x = node.inputs[0]
    return [b.emit("avg_pool2d_grad", [g], **window_attrs(node), image=tuple(b.shape(x)[2:]))]


@AVG_POOL2D_GRAD.vjp
def _avg_pool2d_grad(b, node, g):
    """avg_pool2d_grad is linear and avg_pool2d is its adjoint."""
    return [b.emit("avg_pool2d", [g], **window_attrs(node))]
