"""Winograd's F(m×m, 3×3) convolution (m = 2 or 4) as three transforms around (m + 2)² GEMMs
(family image): what the e-graph may make of a stride-1 3×3 convolution or of its input gradient
(rewrite/conv.py `conv_winograd`), in place of the direct implicit GEMM `conv_gemm`.

The output is cut into m×m tiles; each reads an n×n tile of the (zero-padded) input, n = m + 2,
its neighbours' overlapping by 2. For one tile d and one filter g of one channel pair, the m×m
result is Aᵀ[(G·g·Gᵀ) ⊙ (Bᵀ·d·B)]A (Lavin & Gray, "Fast algorithms for convolutional neural
networks", 2016), so a convolution over C channels is, for each of the P = n² positions
ξ = (a, b) of the transformed tile, one GEMM U[ξ] [O, C] · V[ξ] [C, T] over the T tiles of the
whole batch: P·O·C·T multiply-adds where the direct GEMM does 9·O·C·m²·T, 2.25× fewer for m = 2
and 4× for m = 4. The price is memory: V and M = U·V hold n²/m² values per input (output) pixel
(4 for m = 2, 2.25 for m = 4), and for m = 4 precision: its matrices' entries reach 8 and 1/24,
so its float32 result strays further from the exact one than the direct GEMM's
(tests/test_winograd.py measures both). The matrices, `MATRICES[m]` = (Bᵀ, G, Aᵀ):

    m = 2: Bᵀ = [[1, 0, −1, 0], [0, 1, 1, 0], [0, −1, 1, 0], [0, 1, 0, −1]]
           G  = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]]
           Aᵀ = [[1, 1, 1, 0], [0, 1, −1, −1]]
    m = 4: points 0, ±1, ±2 and ∞ (below).

Ops (none has a gradient: they only appear in plans, after autodiff); `tile` is m:
- `winograd_input(x; padding, image, tile)`: x [N, C, H, W], or [N, C, H·W] seen as the image
  (H, W) (an output gradient as autodiff leaves it), → V [P, C, T]. Output size (Ho, Wo) =
  (H + 2ph − 2, W + 2pw − 2), tiles th = ⌈Ho/m⌉ × tw = ⌈Wo/m⌉ per image, T = N·th·tw in
  (n, ty, tx) order; V[n·a + b, c, t] = Σᵢⱼ Bᵀ[a, i]·Bᵀ[b, j]·x[n, c, m·ty − ph + i, m·tx − pw + j]
  (0 outside x).
- `winograd_weight(w; flip, tile)`: the weight matrix [O, C·9] (g[o, c] = w[o, 9c : 9c + 9] as
  3×3) → U [P, O, C], U[n·a + b, o, c] = (G·g[o, c]·Gᵀ)[a, b]; with `flip`, the filter of the input
  gradient instead: [P, C, O], U[ξ, c, o] = (G·rot180(g[o, c])·Gᵀ)[a, b] (the input gradient of
  a stride-1 convolution with padding p is the correlation of the output gradient with the
  rotated, transposed filters, padding 2 − p).
- `winograd_output(m; size, tile)`: M [P, O, T] → y [N, O, Ho, Wo] with (Ho, Wo) = `size`,
  y[n, o, m·ty + i, m·tx + j] = Σ_ab Aᵀ[i, a]·Aᵀ[j, b]·M[n·a + b, o, t] (a ragged last tile's
  rows or columns past the output are dropped).

The weight gradient dW[o, c, i, j] = Σ g[n, o, y, x]·x[n, c, y − p + i, x − p + j] is the same
bilinear form read the other way round (Winograd's F(3×3, m×m), the transposition principle):
per tile, dW = Gᵀ[(A·g·Aᵀ) ⊙ (Bᵀ·d·B)]G with the same matrices, the m×m tile g of the output
gradient and the n×n input tile d that the forward's output tile reads; summed over the tiles,
that is one GEMM per position over the T tiles, M[ξ] = Ug[ξ] [O, T] · V[ξ]ᵀ [T, C]:
- `winograd_gradient(g; size, tile)`: the output gradient [N, O, Ho·Wo] (or [N, O, Ho, Wo]) of
  output size `size` → Ug [P, O, T], Ug[n·a + b, o, t] = Σ_uv Aᵀ[u, a]·Aᵀ[v, b]·g[n, o, m·ty + u,
  m·tx + v] (0 past the output); V is `winograd_input` of x with the forward's padding;
- `winograd_weight_gradient(m; tile)`: M [P, O, C] → the weight matrix's gradient [O, C·9],
  dW[o, 9c + 3i + j] = Σ_ab G[a, i]·G[b, j]·M[n·a + b, o, c].
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, INT, INTS, Attr, Op, ShapeError, require_float

FAMILY = "image"
MATRICES = {  # tile m: (Bᵀ [n, n], G [n, 3], Aᵀ [m, n]), n = m + 2, in float64 (exact)
    2: (
        np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64),
    ),
    4: (
        np.array(
            [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
             [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], dtype=np.float64,
        ),
        np.array(
            [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6],
             [1 / 24, 1 / 12, 1 / 6], [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], dtype=np.float64,
        ),
        np.array(
            [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], dtype=np.float64
        ),
    ),
}  # fmt: skip


def positions(tile: int) -> int:
    """P = (m + 2)², the positions of a transformed tile."""
    return (tile + 2) ** 2


def check_tile(attrs, op: str) -> int:
    """The op's m, checked: an F(m×m, 3×3) whose matrices are in MATRICES."""
    tile = attrs["tile"]
    if tile not in MATRICES:
        raise ShapeError(f"{op}: tile must be one of {sorted(MATRICES)} (F(m×m, 3×3)), got {tile}")
    return tile


def tiles(size: tuple[int, int], tile: int) -> tuple[int, int]:
    """The m×m output tiles (th, tw) covering an output of `size` (Ho, Wo)."""
    return -(-size[0] // tile), -(-size[1] // tile)


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
    tile = check_tile(attrs, "winograd_input")
    th, tw = tiles(size, tile)
    return TensorType((positions(tile), x.shape[1], x.shape[0] * th * tw), "f32")


def evaluate_winograd_input(x, padding, image, tile):
    """V = Bᵀ·d·B for every n×n input tile d (stride m), as [P, C, N·th·tw]."""
    n, c = x.shape[:2]
    x = x.reshape(n, c, *image)
    (ph, pw), (th, tw), span = padding, tiles(transformed_size(tuple(image), tuple(padding)), tile), tile + 2
    # Pad so that every tile's n×n window is inside: rows −ph … m·th − ph + 1.
    padded = np.zeros((n, c, tile * th + 2, tile * tw + 2), dtype=x.dtype)
    rows, cols = min(image[0], tile * th + 2 - ph), min(image[1], tile * tw + 2 - pw)
    padded[:, :, ph : ph + rows, pw : pw + cols] = x[:, :, :rows, :cols]
    i = tile * np.arange(th)[:, None] + np.arange(span)[None, :]  # [th, n]
    j = tile * np.arange(tw)[:, None] + np.arange(span)[None, :]  # [tw, n]
    windows = padded[:, :, i[:, None, :, None], j[None, :, None, :]]  # [N, C, th, tw, n, n]
    b_t = MATRICES[tile][0]
    v = np.einsum("ai,bj,nctsij->abcnts", b_t, b_t, windows)
    return v.reshape(positions(tile), c, n * th * tw).astype(x.dtype)


def infer_winograd_weight(types, attrs) -> TensorType:
    (w,) = types
    require_float([w], "winograd_weight")
    if w.rank != 2 or w.shape[1] % 9:
        raise ShapeError(f"winograd_weight: expected a 3×3 weight matrix [O, C·9], got {w}")
    filters, channels = w.shape[0], w.shape[1] // 9
    count = positions(check_tile(attrs, "winograd_weight"))
    return TensorType((count, channels, filters) if attrs["flip"] else (count, filters, channels), "f32")


def evaluate_winograd_weight(w, flip, tile):
    """U = G·g·Gᵀ per filter (of the rotated filter with `flip`), [P, O, C] ([P, C, O] flipped)."""
    g = w.reshape(w.shape[0], -1, 3, 3)
    if flip:
        g = np.transpose(g[:, :, ::-1, ::-1], (1, 0, 2, 3))
    g_matrix = MATRICES[tile][1]
    u = np.einsum("ai,bj,ocij->aboc", g_matrix, g_matrix, g)
    return u.reshape(positions(tile), *g.shape[:2]).astype(w.dtype)


def infer_winograd_output(types, attrs) -> TensorType:
    (m,) = types
    require_float([m], "winograd_output")
    size, tile = tuple(attrs["size"]), check_tile(attrs, "winograd_output")
    th, tw = tiles(size, tile)
    count = positions(tile)
    if m.rank != 3 or m.shape[0] != count or m.shape[2] % (th * tw):
        raise ShapeError(f"winograd_output: expected [{count}, O, N·{th}·{tw}] (output {list(size)}), got {m}")
    return TensorType((m.shape[2] // (th * tw), m.shape[1], *size), "f32")


def evaluate_winograd_output(m, size, tile):
    """y = Aᵀ·M·A per tile, the tiles laid out over [N, O, Ho, Wo]."""
    (th, tw), filters, span = tiles(tuple(size), tile), m.shape[1], tile + 2
    tiled = m.reshape(span, span, filters, -1, th, tw)
    a_t = MATRICES[tile][2]
    y = np.einsum("ia,jb,abonts->notisj", a_t, a_t, tiled)  # [N, O, th, m, tw, m]
    y = y.reshape(-1, filters, tile * th, tile * tw)
    return np.ascontiguousarray(y[:, :, : size[0], : size[1]]).astype(m.dtype)


def describe_input(node) -> str:
    image, padding = "x".join(map(str, node.attr("image"))), ",".join(map(str, node.attr("padding")))
    return f"F({node.attr('tile')}, 3) image {image} padding {padding}"


def transform_op(name: str, infer, evaluate, operand: str, attrs: tuple, describe, doc: str) -> Op:
    """The declaration of one of the transforms: one operand, a `tile` attribute after `attrs`."""
    return Op(
        name, family=FAMILY, infer=infer, evaluate=evaluate, operands=(operand,),
        attrs=(*attrs, Attr("tile", INT, 2)), describe=describe, doc=doc,
    )  # fmt: skip


WINOGRAD_INPUT = transform_op(
    "winograd_input", infer_winograd_input, evaluate_winograd_input, "x", (Attr("padding", INTS), Attr("image", INTS)),
    describe_input, "Winograd F(m×m, 3×3) input transform: Bᵀ·d·B of every (m + 2)² tile, [P, C, N·tiles]",
)  # fmt: skip
WINOGRAD_WEIGHT = transform_op(
    "winograd_weight", infer_winograd_weight, evaluate_winograd_weight, "w", (Attr("flip", BOOL, False),),
    lambda node: f"F({node.attr('tile')}, 3)" + ", rotated, transposed (input gradient)" * node.attr("flip"),
    "Winograd F(m×m, 3×3) filter transform: G·g·Gᵀ per 3×3 filter, [P, O, C] (flip: [P, C, O])",
)  # fmt: skip
WINOGRAD_OUTPUT = transform_op(
    "winograd_output", infer_winograd_output, evaluate_winograd_output, "m", (Attr("size", INTS),),
    lambda node: f"F({node.attr('tile')}, 3) to {'x'.join(map(str, node.attr('size')))}",
    "Winograd F(m×m, 3×3) output transform: Aᵀ·M·A of every tile, [N, O, Ho, Wo]",
)  # fmt: skip


def infer_winograd_gradient(types, attrs) -> TensorType:
    (g,) = types
    require_float([g], "winograd_gradient")
    size, tile = tuple(attrs["size"]), check_tile(attrs, "winograd_gradient")
    if g.rank not in (3, 4) or (g.rank == 4 and tuple(g.shape[2:]) != size):
        raise ShapeError(f"winograd_gradient: expected an output gradient [N, O, {size[0]}, {size[1]}], got {g}")
    if g.rank == 3 and g.shape[2] != size[0] * size[1]:
        raise ShapeError(f"winograd_gradient: expected [N, O, {size[0] * size[1]}] (output {list(size)}), got {g}")
    th, tw = tiles(size, tile)
    return TensorType((positions(tile), g.shape[1], g.shape[0] * th * tw), "f32")


def evaluate_winograd_gradient(g, size, tile):
    """Ug = A·g·Aᵀ for every m×m tile of the output gradient (0 past the output), as [P, O, N·th·tw]."""
    n, o = g.shape[:2]
    (th, tw), span = tiles(tuple(size), tile), tile + 2
    padded = np.zeros((n, o, th * tile, tw * tile), dtype=g.dtype)
    padded[:, :, : size[0], : size[1]] = g.reshape(n, o, *size)
    a = MATRICES[tile][2].T  # [n, m]
    u = np.einsum("au,bv,notusv->abonts", a, a, padded.reshape(n, o, th, tile, tw, tile))
    return u.reshape(span * span, o, n * th * tw).astype(g.dtype)


def infer_winograd_weight_gradient(types, attrs) -> TensorType:
    (m,) = types
    require_float([m], "winograd_weight_gradient")
    count = positions(check_tile(attrs, "winograd_weight_gradient"))
    if m.rank != 3 or m.shape[0] != count:
        raise ShapeError(f"winograd_weight_gradient: expected [{count}, O, C], got {m}")
    return TensorType((m.shape[1], m.shape[2] * 9), "f32")


def evaluate_winograd_weight_gradient(m, tile):
    """dW = Gᵀ·M·G per filter pair, as the weight matrix [O, C·9]."""
    span, (_, filters, channels) = tile + 2, m.shape
    g_matrix = MATRICES[tile][1]
    dw = np.einsum("ai,bj,aboc->ocij", g_matrix, g_matrix, m.reshape(span, span, filters, channels))
    return dw.reshape(filters, channels * 9).astype(m.dtype)


WINOGRAD_GRADIENT = transform_op(
    "winograd_gradient", infer_winograd_gradient, evaluate_winograd_gradient, "g", (Attr("size", INTS),),
    lambda node: f"F(3, {node.attr('tile')}) of {'x'.join(map(str, node.attr('size')))}",
    "Winograd weight-gradient transform of the output gradient: A·g·Aᵀ of every m×m tile, [P, O, N·tiles]",
)  # fmt: skip
WINOGRAD_WEIGHT_GRADIENT = transform_op(
    "winograd_weight_gradient", infer_winograd_weight_gradient, evaluate_winograd_weight_gradient, "m", (),
    lambda node: f"F(3, {node.attr('tile')})",
    "Winograd weight-gradient output transform: Gᵀ·M·G per filter pair, the weight matrix [O, C·9]",
)  # fmt: skip
