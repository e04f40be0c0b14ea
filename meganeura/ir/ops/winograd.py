"""Winograd's F(2×2, 3×3) convolution as three transforms around 16 GEMMs (family image): what the
e-graph may make of a stride-1 3×3 convolution or of its input gradient (rewrite/conv.py
`conv_winograd`), in place of the direct implicit GEMM `conv_gemm`.

The output is cut into 2×2 tiles; each reads a 4×4 tile of the (zero-padded) input. For one
tile d and one filter g of one channel pair, the 2×2 result is Aᵀ[(G·g·Gᵀ) ⊙ (Bᵀ·d·B)]A
(Lavin & Gray, "Fast algorithms for convolutional neural networks", 2016), so a convolution over
C channels is, for each of the 16 positions ξ = (a, b) of the transformed 4×4 tile, one GEMM
U[ξ] [O, C] · V[ξ] [C, T] over the T tiles of the whole batch: 16·O·C·T multiply-adds where the
direct GEMM does 9·O·C·4T, 2.25× fewer. The price is memory: V and M = U·V hold 4 values per
input (output) pixel. The matrices (with 0.5 the only non-integer, exact in f32):

    Bᵀ = [[1, 0, −1, 0], [0, 1, 1, 0], [0, −1, 1, 0], [0, 1, 0, −1]]
    G  = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]]
    Aᵀ = [[1, 1, 1, 0], [0, 1, −1, −1]]

Ops (none has a gradient: they only appear in plans, after autodiff):
- `winograd_input(x; padding, image)`: x [N, C, H, W], or [N, C, H·W] seen as the image (H, W)
  (an output gradient as autodiff leaves it), → V [16, C, T]. Output size (Ho, Wo) = (H + 2ph − 2,
  W + 2pw − 2), tiles th = ⌈Ho/2⌉ × tw = ⌈Wo/2⌉ per image, T = N·th·tw in (n, ty, tx) order;
  V[4a + b, c, t] = Σᵢⱼ Bᵀ[a, i]·Bᵀ[b, j]·x[n, c, 2ty − ph + i, 2tx − pw + j] (0 outside x).
- `winograd_weight(w; flip)`: the weight matrix [O, C·9] (g[o, c] = w[o, 9c : 9c + 9] as 3×3)
  → U [16, O, C], U[4a + b, o, c] = (G·g[o, c]·Gᵀ)[a, b]; with `flip`, the filter of the input
  gradient instead: [16, C, O], U[ξ, c, o] = (G·rot180(g[o, c])·Gᵀ)[a, b] (the input gradient of
  a stride-1 convolution with padding p is the correlation of the output gradient with the
  rotated, transposed filters, padding 2 − p).
- `winograd_output(m; size)`: M [16, O, T] → y [N, O, Ho, Wo] with (Ho, Wo) = `size`,
  y[n, o, 2ty + i, 2tx + j] = Σ_ab Aᵀ[i, a]·Aᵀ[j, b]·M[4a + b, o, t] (a ragged last tile's
  extra row or column is dropped).
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, INTS, Attr, Op, ShapeError, require_float

FAMILY = "image"
POSITIONS = 16  # the 4×4 transformed tile

B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float32)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float32)
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float32)


def tiles(size: tuple[int, int]) -> tuple[int, int]:
    """The 2×2 output tiles (th, tw) covering an output of `size` (Ho, Wo)."""
    return -(-size[0] // 2), -(-size[1] // 2)


def transformed_size(image: tuple[int, int], padding: tuple[int, int]) -> tuple[int, int]:
    """(Ho, Wo) of a 3×3 stride-1 correlation of `image` with `padding`."""
    return image[0] + 2 * padding[0] - 2, image[1] + 2 * padding[1] - 2


def infer_winograd_input(types, attrs) -> TensorType:
    (x,) = types
    require_float([x], "winograd_input")
    image, padding = tuple(attrs["image"]), tuple(attrs["padding"])
    if x.rank not in (3, 4) or (x.rank == 4 and tuple(x.shape[2:]) != image):
        raise ShapeError(f"winograd_input: expected an image batch [N, C, {image[0]}, {image[1]}], got {x}")
    if x.rank == 3 and x.shape[2] != image[0] * image[1]:
        raise ShapeError(f"winograd_input: expected [N, C, {image[0] * image[1]}] (image {list(image)}), got {x}")
    if min(padding) < 0 or max(padding) > 2:
        raise ShapeError(f"winograd_input: padding {list(padding)} must be 0, 1 or 2 (a 3×3 window)")
    size = transformed_size(image, padding)
    if min(size) < 1:
        raise ShapeError(f"winograd_input: a 3×3 window does not fit the image {list(image)} padded by {list(padding)}")
    th, tw = tiles(size)
    return TensorType((POSITIONS, x.shape[1], x.shape[0] * th * tw), "f32")


def evaluate_winograd_input(x, padding, image):
    """V = Bᵀ·d·B for every 4×4 input tile d (stride 2), as [16, C, N·th·tw]."""
    n, c = x.shape[:2]
    x = x.reshape(n, c, *image)
    (ph, pw), (th, tw) = padding, tiles(transformed_size(tuple(image), tuple(padding)))
    # Pad so that every tile's 4×4 window is inside: rows −ph … 2·th − ph + 1.
    padded = np.zeros((n, c, 2 * th + 2, 2 * tw + 2), dtype=x.dtype)
    rows, cols = min(image[0], 2 * th + 2 - ph), min(image[1], 2 * tw + 2 - pw)
    padded[:, :, ph : ph + rows, pw : pw + cols] = x[:, :, :rows, :cols]
    i = 2 * np.arange(th)[:, None] + np.arange(4)[None, :]  # [th, 4]
    j = 2 * np.arange(tw)[:, None] + np.arange(4)[None, :]  # [tw, 4]
    windows = padded[:, :, i[:, None, :, None], j[None, :, None, :]]  # [N, C, th, tw, 4, 4]
    v = np.einsum("ai,bj,nctsij->abcnts", B_T, B_T, windows)
    return v.reshape(POSITIONS, c, n * th * tw).astype(x.dtype)


def infer_winograd_weight(types, attrs) -> TensorType:
    (w,) = types
    require_float([w], "winograd_weight")
    if w.rank != 2 or w.shape[1] % 9:
        raise ShapeError(f"winograd_weight: expected a 3×3 weight matrix [O, C·9], got {w}")
    filters, channels = w.shape[0], w.shape[1] // 9
    return TensorType((POSITIONS, channels, filters) if attrs["flip"] else (POSITIONS, filters, channels), "f32")


def evaluate_winograd_weight(w, flip):
    """U = G·g·Gᵀ per filter (of the rotated filter with `flip`), [16, O, C] ([16, C, O] flipped)."""
    g = w.reshape(w.shape[0], -1, 3, 3)
    if flip:
        g = np.transpose(g[:, :, ::-1, ::-1], (1, 0, 2, 3))
    u = np.einsum("ai,bj,ocij->aboc", G, G, g)
    return u.reshape(POSITIONS, *g.shape[:2]).astype(w.dtype)


def infer_winograd_output(types, attrs) -> TensorType:
    (m,) = types
    require_float([m], "winograd_output")
    size = tuple(attrs["size"])
    th, tw = tiles(size)
    if m.rank != 3 or m.shape[0] != POSITIONS or m.shape[2] % (th * tw):
        raise ShapeError(f"winograd_output: expected [16, O, N·{th}·{tw}] (output {list(size)}), got {m}")
    return TensorType((m.shape[2] // (th * tw), m.shape[1], *size), "f32")


def evaluate_winograd_output(m, size):
    """y = Aᵀ·M·A per tile, the tiles laid out over [N, O, Ho, Wo]."""
    (th, tw), filters = tiles(tuple(size)), m.shape[1]
    tiled = m.reshape(4, 4, filters, -1, th, tw)
    y = np.einsum("ia,jb,abonts->notisj", A_T, A_T, tiled)  # [N, O, th, 2, tw, 2]
    y = y.reshape(-1, filters, 2 * th, 2 * tw)
    return np.ascontiguousarray(y[:, :, : size[0], : size[1]]).astype(m.dtype)


def describe_input(node) -> str:
    return f"image {'x'.join(map(str, node.attr('image')))} padding {','.join(map(str, node.attr('padding')))}"


WINOGRAD_INPUT = Op(
    "winograd_input",
    family=FAMILY,
    infer=infer_winograd_input,
    evaluate=evaluate_winograd_input,
    operands=("x",),
    attrs=(Attr("padding", INTS), Attr("image", INTS)),
    describe=describe_input,
    doc="Winograd F(2×2, 3×3) input transform: Bᵀ·d·B of every 4×4 tile, [16, C, N·tiles]",
)
WINOGRAD_WEIGHT = Op(
    "winograd_weight",
    family=FAMILY,
    infer=infer_winograd_weight,
    evaluate=evaluate_winograd_weight,
    operands=("w",),
    attrs=(Attr("flip", BOOL, False),),
    describe=lambda node: "rotated, transposed (input gradient)" if node.attr("flip") else "",
    doc="Winograd F(2×2, 3×3) filter transform: G·g·Gᵀ per 3×3 filter, [16, O, C] (flip: [16, C, O])",
)
WINOGRAD_OUTPUT = Op(
    "winograd_output",
    family=FAMILY,
    infer=infer_winograd_output,
    evaluate=evaluate_winograd_output,
    operands=("m",),
    attrs=(Attr("size", INTS),),
    describe=lambda node: f"to {'x'.join(map(str, node.attr('size')))}",
    doc="Winograd F(2×2, 3×3) output transform: Aᵀ·M·A of every tile, [N, O, Ho, Wo]",
)
