"""The conv family: convolutions in their plain im2col form become implicit-GEMM kernels.

`F.conv2d` traces a convolution as `unfold` (im2col) and a matmul with the weight matrix, and
autodiff differentiates exactly that (ir/ops/image.py), so a training step holds three GEMMs over
columns [N, C·kh·kw, L] that a plain plan writes to memory. These rules give each GEMM the
implicit-GEMM kernel `(ConvKernel mode a b kernel stride padding dilation image chunks groups
epilogue)` (IR: `conv_gemm`), which gathers the column operand from the image (or from the output
gradient) while it loads its tiles, so the columns are never written. A convolution in G > 1
groups is traced with the columns seen per group, c4 = reshape(unfold(x), [N, G, Cg·kh·kw, L]),
and the weight W3 [G, Og, Cg·kh·kw] broadcast over the batch (`group_split` names the reshape's
G); each rule below has a second form for it, whose kernel runs one GEMM per group. A transposed
convolution (F.conv_transpose2d) is traced as the input gradient's form, so `conv_grad_input`
makes its forward and `conv_forward` and `conv_grad_weight` its gradients:

- `conv_forward`: reshape(matmul(W, unfold(x)), [N, O, Ho, Wo]) → ConvKernel "forward" W x;
  grouped, reshape(matmul(broadcast(W3), c4), [N, O, Ho, Wo]) → ConvKernel "forward" W3 x;
- `conv_grad_input`: fold(matmul(Wᵀ, g)) → ConvKernel "grad_input" W g (g [N, O, L]); grouped,
  fold(reshape(matmul(broadcast(W3)ᵀ, g4))) → ConvKernel "grad_input" W3 g4 (g4 [N, G, Og, L]);
- `conv_grad_weight`: sum over the batch of matmul(g, unfold(x)ᵀ) → ConvKernel "grad_weight" g x
  (one GEMM over the whole batch; grouped, of matmul(g4, c4ᵀ)), and the per-image products
  matmul(g, unfold(x)ᵀ) → the same
  kernel in chunks of one image (N GEMMs in one dispatch, summed after it). Which one the plan
  uses is the cost model's call: the whole-batch GEMM has a small output and a long reduction, so
  few workgroups; where that leaves most of the adapter idle, N times the workgroups and the sum
  cost less (`cost.py`, the fill of the target's compute units);
- `conv_split_k`: the same sum as one GEMM split along its reduction N·L into S parts (split-K),
  the partials [S, O, C·kh·kw] summed after it: where the whole-batch GEMM has fewer output
  tiles than the target has units, S of them (a target fact, `weight_split`, from
  `codegen.conv.weight_splits`) fill the units while writing far fewer partials than one per
  image. Per image, whole batch or split: the cost model's choice;
- `conv_split_reduction`: a stride-1 input gradient whose output has too few tiles for the
  target (ResNet-18's 4x4 and 8x8 stages) as the sum of S partial implicit GEMMs over parts of
  its reduction (o, i, j), [S, N, C, H, W] (a target fact, `reduction_split`, from
  `codegen.conv.reduction_splits`); its epilogue then fuses into the sum's consumers. The rule
  matches any convolution kernel the fact names; only input gradients are named;
- `conv_winograd`: a stride-1 3×3 convolution kernel, forward or input gradient, as Winograd's
  F(m×m, 3×3) (ir/ops/winograd.py): the input's transform, the filters' (rotated and transposed
  for the input gradient), their (m + 2)² products as one batched matmul, the output's transform.
  Fewer multiplications (2.25× for m = 2, 4× for m = 4), more bytes through memory between the
  kernels (4× and 2.25× the image's): the cost model weighs the two, on the targets that offer
  it (a target fact, `winograd`, from `codegen.winograd.winograd_tile`: the H200 and CPUs, where
  it was measured);
- `conv_winograd_weight`: a stride-1 3×3 convolution's whole-batch weight gradient as Winograd's
  F(3×3, m×m), the same bilinear form read the other way round: the output gradient's tiles'
  transform (`winograd_gradient`), the input's (`winograd_input`, as for the forward), their
  (m + 2)² products over the tiles as one batched matmul [P, O, T]·[P, C, T]ᵀ, the filters'
  transform back to the weight matrix (`winograd_weight_gradient`); a target fact,
  `winograd_grad`, on the batch sum of the per-image products;
- `conv_epilogue` (with the helper `conv_mentions`): a pointwise kernel of a conv kernel's shape
  that reads its result becomes its epilogue, as `matmul_epilogue` does for matmuls (the bias
  add and the activation after a convolution; the relu mask on an input gradient);
- `pointwise_conv`: a 1×1 convolution with stride 1 and no padding needs no gathering at all:
  unfold(x) is a view of x ([N, C, H·W]) and fold(c) a view of c, so the convolution is a plain
  (batched) matmul, which the matmul family then fuses like any other.

Guards (facts the encoder adds for this family, `facts`): `(rank t r)` for every tensor; the
window (kernel, stride, padding, dilation) of each unfold/fold is `(spatial_window k s p d)` or
`(pointwise_window k s p d)` (1×1, stride 1, padding 0); `(image x "H,W")` for every 4-D tensor;
`(positions t n ho wo)` for an unfold's result [N, C·kh·kw, Ho·Wo], and
`(splits_positions t n o ho wo)` for a 4-D reshape [N, O, Ho, Wo] of a 3-D [N, O, Ho·Wo] (or of a
grouped product [N, G, Og, Ho·Wo], G·Og = O): the forward rule needs the reshape to be the one
that unflattens the output positions; `(group_split t G)` for a reshape between [N, G·K, L] and
[N, G, K, L], G > 1; `(leading t d)`, the first dim of every 3-D tensor (a grouped weight
[G, Og, Cg·kh·kw] broadcast over the batch only). The weight is a matrix (rank 2; grouped, rank
3), the gradient g of rank 3 (grouped, 4). Target facts (`target_facts`): `(weight_split m S p)`
for a per-image weight-gradient product m whose sum the target splits into S parts, p the
partials' shape (`codegen.conv.weight_splits`, or `direct_weight_splits` for one channel a
group); `(reduction_split t S p)` for a stride-1 input gradient's fold t that the target splits
into S parts along K; `(winograd t flip m u v p pad image size)` for a stride-1 3×3
convolution t (its reshape, or its input gradient's fold) that the target may run as Winograd's
F(m×m, 3×3): the filter transform's flip, m, the shapes of the two transforms and of their
product, and the input and output transforms' attributes; `(winograd_grad t m u v p size)` for
the batch sum t of a stride-1 3×3 convolution's per-image weight-gradient products: m, the
shapes of the two transforms and of their product, and the output size.
"""

from __future__ import annotations

import math

from meganeura.codegen.conv import direct_weight_splits, reduction_splits, weight_splits
from meganeura.codegen.winograd import winograd_tile
from meganeura.ir.graph import Graph
from meganeura.ir.ops.image import conv_output_size
from meganeura.ir.ops.winograd import positions, tiles
from meganeura.rewrite.rules import Rule, rule
from meganeura.rewrite.sorts import ints
from meganeura.target import Target

FAMILY = "conv"

UNFOLD = "(= c (Unfold x wk ws wp wd))"  # x's columns for window (k, st, p, d)
GROUPED_COLUMNS = [UNFOLD, "(= c4 (Reshape c s4))", "(group_split c4 grp)"]  # seen per group [N, G, K, L]
WINDOW = "(spatial_window wk ws wp wd)"
PLAIN_CONV = "(ConvKernel mode a b wk ws wp wd img chunks grp (Acc))"  # the epilogue $acc

CONV_FORWARD = Rule(
    "conv_forward",
    FAMILY,
    "reshape(W·unfold(x), [N, O, Ho, Wo]) → implicit-GEMM convolution (columns gathered from x)",
    (
        rule(
            [
                "(= t (Reshape m s))",
                "(= m (Matmul w c false false))",
                UNFOLD,
                WINDOW,
                "(image x img)",
                "(rank w 2)",
                "(positions c n ho wo)",
                "(splits_positions t n o ho wo)",
            ],
            '(union t (ConvKernel "forward" w x wk ws wp wd img 1 1 (Acc)))',
        ),
        rule(
            [
                "(= t (Reshape m s))",
                "(= m (Matmul wb c4 false false))",
                "(= wb (BroadcastTo w bs))",
                *GROUPED_COLUMNS,
                WINDOW,
                "(image x img)",
                "(rank w 3)",
                "(leading w grp)",
                "(positions c n ho wo)",
                "(splits_positions t n o ho wo)",
            ],
            '(union t (ConvKernel "forward" w x wk ws wp wd img 1 grp (Acc)))',
        ),
    ),
)

CONV_GRAD_INPUT = Rule(
    "conv_grad_input",
    FAMILY,
    "fold(Wᵀ·g) → implicit-GEMM input gradient (operand gathered from g, no column buffer)",
    (
        rule(
            ["(= t (Fold m img wk ws wp wd))", "(= m (Matmul w g true false))", WINDOW, "(rank w 2)", "(rank g 3)"],
            '(union t (ConvKernel "grad_input" w g wk ws wp wd img 1 1 (Acc)))',
        ),
        rule(
            [
                "(= t (Fold r img wk ws wp wd))",
                "(= r (Reshape m s))",
                "(group_split r grp)",
                "(= m (Matmul wb g true false))",
                "(= wb (BroadcastTo w bs))",
                WINDOW,
                "(rank w 3)",
                "(leading w grp)",
                "(rank g 4)",
            ],
            '(union t (ConvKernel "grad_input" w g wk ws wp wd img 1 grp (Acc)))',
        ),
    ),
)

PARTIAL_WEIGHT_GRADIENT = [  # g·unfold(x)ᵀ per image, before autodiff's sum over the batch
    "(= m (Matmul g c false true))",
    UNFOLD,
    WINDOW,
    "(image x img)",
    "(rank g 3)",
]
GROUPED_WEIGHT_GRADIENT = [  # the same per group: g4·c4ᵀ
    "(= m (Matmul g c4 false true))",
    *GROUPED_COLUMNS,
    WINDOW,
    "(image x img)",
    "(rank g 4)",
]
CONV_GRAD_WEIGHT = Rule(
    "conv_grad_weight",
    FAMILY,
    "Σₙ g·unfold(x)ᵀ → implicit-GEMM weight gradient (columns gathered from x): one GEMM over the "
    "batch, or one per image summed after them (the cost model's choice)",
    (
        *(
            rule(
                ['(= t (Reduce "sum" m "0" false))', *partial],
                f'(union t (ConvKernel "grad_weight" g x wk ws wp wd img 1 {groups} (Acc)))',
            )
            for partial, groups in ((PARTIAL_WEIGHT_GRADIENT, 1), (GROUPED_WEIGHT_GRADIENT, "grp"))
        ),
        *(
            rule(
                [*partial, "(batch_images m images)", "(> images 1)"],
                f'(union m (ConvKernel "grad_weight" g x wk ws wp wd img images {groups} (Acc)))',
            )
            for partial, groups in ((PARTIAL_WEIGHT_GRADIENT, 1), (GROUPED_WEIGHT_GRADIENT, "grp"))
        ),
    ),
)


def split_conv(groups: str) -> str:
    return f'(ConvKernel "grad_weight" g x wk ws wp wd img n {groups} (Acc))'


CONV_SPLIT_K = Rule(
    "conv_split_k",
    FAMILY,
    "Σₙ g·unfold(x)ᵀ → an implicit-GEMM weight gradient split along its reduction (split-K) into "
    "partials, summed after it",
    tuple(
        rule(
            ['(= t (Reduce "sum" m "0" false))', *partial, "(weight_split m n p)"],
            [f"(set (shape {split_conv(groups)}) p)", f'(union t (Reduce "sum" {split_conv(groups)} "0" false))'],
        )
        for partial, groups in ((PARTIAL_WEIGHT_GRADIENT, "1"), (GROUPED_WEIGHT_GRADIENT, "grp"))
    ),
)

SPLIT_REDUCTION = "(ConvKernel mode a b wk ws wp wd img n grp (Acc))"
CONV_SPLIT_REDUCTION = Rule(
    "conv_split_reduction",
    FAMILY,
    "a stride-1 input gradient with too few output tiles for the GPU is the sum of partial "
    "implicit GEMMs over parts of its reduction (split-K)",
    (
        rule(
            ["(= t (ConvKernel mode a b wk ws wp wd img 1 grp (Acc)))", "(reduction_split t n p)"],
            [f"(set (shape {SPLIT_REDUCTION}) p)", f'(union t (Reduce "sum" {SPLIT_REDUCTION} "0" false))'],
        ),
    ),
)

WINOGRAD_WEIGHT = "(WinogradWeight a flip wt)"
WINOGRAD_INPUT = "(WinogradInput b wpad wimg wt)"
WINOGRAD_GEMM = f"(Matmul {WINOGRAD_WEIGHT} {WINOGRAD_INPUT} false false)"
CONV_WINOGRAD = Rule(
    "conv_winograd",
    FAMILY,
    "a stride-1 3×3 convolution or its input gradient → Winograd F(m×m, 3×3): the input's and the "
    "filters' transforms, (m + 2)² GEMMs as one batched matmul, the output's transform (fewer "
    "multiplications than the direct GEMM, more bytes between the kernels)",
    (
        rule(
            ["(= t (ConvKernel mode a b wk ws wp wd img 1 grp (Acc)))", "(winograd t flip wt u v m wpad wimg wsize)"],
            [
                f"(set (shape {WINOGRAD_WEIGHT}) u)",
                f"(set (shape {WINOGRAD_INPUT}) v)",
                f"(set (shape {WINOGRAD_GEMM}) m)",
                f"(union t (WinogradOutput {WINOGRAD_GEMM} wsize wt))",
            ],
        ),
    ),
)

WINOGRAD_GRADIENT = "(WinogradGradient g wsize wt)"
WINOGRAD_IMAGE = "(WinogradInput x wp img wt)"
WINOGRAD_GRADIENT_GEMM = f"(Matmul {WINOGRAD_GRADIENT} {WINOGRAD_IMAGE} false true)"
CONV_WINOGRAD_WEIGHT = Rule(
    "conv_winograd_weight",
    FAMILY,
    "a stride-1 3×3 convolution's weight gradient → Winograd F(3×3, m×m): the output gradient's "
    "and the input's transforms, (m + 2)² GEMMs over the tiles as one batched matmul, the "
    "filters' transform",
    (
        rule(
            ['(= t (ConvKernel "grad_weight" g x wk ws wp wd img 1 grp (Acc)))', "(winograd_grad t wt u v m wsize)"],
            [
                f"(set (shape {WINOGRAD_GRADIENT}) u)",
                f"(set (shape {WINOGRAD_IMAGE}) v)",
                f"(set (shape {WINOGRAD_GRADIENT_GEMM}) m)",
                f"(union t (WinogradWeightGradient {WINOGRAD_GRADIENT_GEMM} wt))",
            ],
        ),
    ),
)

CONV_MENTIONS = Rule(
    "conv_mentions",
    FAMILY,
    "the Pw classes that load a conv kernel's result (helper of conv_epilogue)",
    (rule(["(= l (Load t))", f"(= t {PLAIN_CONV})"], "(set (mentions l t) 0)"),),
)

CONV_EPILOGUE = Rule(
    "conv_epilogue",
    FAMILY,
    "a pointwise kernel of a conv kernel's shape reading its result becomes the conv's epilogue",
    (
        rule(
            ["(= k (Kernel body s))", "(= d (mentions body t))", f"(= t {PLAIN_CONV})", "(= s (shape t))"],
            "(union k (ConvKernel mode a b wk ws wp wd img chunks grp (Replace body t (Acc))))",
        ),
    ),
)

POINTWISE_CONV = Rule(
    "pointwise_conv",
    FAMILY,
    "a 1×1 convolution (stride 1, no padding) is a plain matmul: unfold and fold are views",
    (
        rule([UNFOLD, "(pointwise_window wk ws wp wd)", "(= s (shape c))"], "(union c (Reshape x s))"),
        rule(
            ["(= t (Fold c img wk ws wp wd))", "(pointwise_window wk ws wp wd)", "(= s (shape t))"],
            "(union t (Reshape c s))",
        ),
    ),
)

RULES = [
    CONV_FORWARD,
    CONV_GRAD_INPUT,
    CONV_GRAD_WEIGHT,
    CONV_SPLIT_K,
    CONV_SPLIT_REDUCTION,
    CONV_WINOGRAD,
    CONV_WINOGRAD_WEIGHT,
    CONV_EPILOGUE,
    CONV_MENTIONS,
    POINTWISE_CONV,
]

DECLARATIONS = """(relation rank (Term i64))
(relation spatial_window (String String String String))
(relation pointwise_window (String String String String))
(relation group_split (Term i64))
(relation leading (Term i64))
(relation image (Term String))
(relation positions (Term i64 i64 i64))
(relation splits_positions (Term i64 i64 i64 i64))
(relation batch_images (Term i64))
(relation weight_split (Term i64 String))
(relation reduction_split (Term i64 String))
(relation winograd (Term bool i64 String String String String String String))
(relation winograd_grad (Term i64 String String String String))
"""


def window(node) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(kernel, stride, padding) of an unfold or fold node."""
    return node.attr("kernel"), node.attr("stride"), node.attr("padding")


def full_window(node) -> tuple[tuple[int, ...], ...]:
    """(kernel, stride, padding, dilation) of an unfold or fold node."""
    return (*window(node), node.attr("dilation"))


def group_split(graph: Graph, node) -> int:
    """G where `node` reshapes between [N, G·K, L] and [N, G, K, L] (either way) with G > 1 (the
    columns of a grouped convolution seen per group, or its input gradient's seen whole); else 0."""
    if node.op != "reshape":
        return 0
    shapes = sorted((graph[node.inputs[0]].shape, node.shape), key=len)
    if [len(shape) for shape in shapes] != [3, 4]:
        return 0
    (n, gk, length), (n4, groups, k, length4) = shapes
    return groups if (n, length, gk) == (n4, length4, groups * k) and groups > 1 else 0


def weight_product(graph: Graph, node):
    """(g, the unfold node, G) where `node` is a weight gradient's per-image product before its
    batch sum: matmul(g [N, O, L], unfold(x), transpose_b) (G = 1) or, grouped,
    matmul(g [N, G, Og, L], reshape(unfold(x)) [N, G, Cg·kh·kw, L], transpose_b); else None."""
    if node.op != "matmul" or not node.attr("transpose_b") or node.attr("transpose_a"):
        return None
    g, columns = (graph[i] for i in node.inputs)
    if columns.op == "unfold" and g.type.rank == 3:
        return g, columns, 1
    groups = group_split(graph, columns)
    if groups and g.type.rank == 4 and graph[columns.inputs[0]].op == "unfold":
        return g, graph[columns.inputs[0]], groups
    return None


def batch_images(graph: Graph, node) -> int | None:
    """For a weight gradient's per-image product (`weight_product`): N; None for other nodes."""
    product = weight_product(graph, node)
    return None if product is None else product[0].shape[0]


def facts(graph: Graph, node_ids: list[int]) -> list[str]:
    """The facts the conv rules guard on, for the encoded nodes `node_ids` (see the module docstring)."""
    lines, windows = [], set()
    for node_id in node_ids:
        node = graph[node_id]
        if node.results != 1:
            continue
        lines.append(f"(rank (Ref {node_id}) {node.type.rank})")
        if node.type.rank == 3:
            lines.append(f"(leading (Ref {node_id}) {node.shape[0]})")
        if node.type.rank == 4:
            lines.append(f"(image (Ref {node_id}) {ints(node.shape[2:])})")
        if node.op in ("unfold", "fold"):
            windows.add(full_window(node))
        if node.op == "unfold":
            kernel, stride, padding, dilation = full_window(node)
            ho, wo = conv_output_size(graph[node.inputs[0]].shape[2:], kernel, stride, padding, dilation=dilation)
            lines.append(f"(positions (Ref {node_id}) {node.shape[0]} {ho} {wo})")
        if node.op == "reshape" and node.type.rank == 4:
            n, o, ho, wo = node.shape
            source = graph[node.inputs[0]].shape
            grouped = len(source) == 4 and source[0] == n and source[1] * source[2] == o and source[3] == ho * wo
            if source == (n, o, ho * wo) or grouped:
                lines.append(f"(splits_positions (Ref {node_id}) {n} {o} {ho} {wo})")
        groups = group_split(graph, node)
        if groups:
            lines.append(f"(group_split (Ref {node_id}) {groups})")
        images = batch_images(graph, node)
        if images is not None:
            lines.append(f"(batch_images (Ref {node_id}) {images})")
    for kernel, stride, padding, dilation in sorted(windows):
        kind = "pointwise" if (kernel, stride, padding) == ((1, 1), (1, 1), (0, 0)) else "spatial"
        lines.append(f"({kind}_window {ints(kernel)} {ints(stride)} {ints(padding)} {ints(dilation)})")
    return lines


def target_facts(graph: Graph, node_ids: list[int], target: Target) -> list[str]:
    """`(weight_split m S p)` for each per-image weight-gradient product m (before its batch sum)
    whose one GEMM `target` would split into S > 1 parts (`codegen.conv.weight_splits`),
    `(reduction_split t S p)` for each stride-1 input gradient t that it would split along K
    (`codegen.conv.reduction_splits`), and the Winograd facts `winograd` and `winograd_grad` of the
    stride-1 3×3 convolutions where it offers Winograd (`winograd_facts`, `winograd_gradient_facts`)."""
    lines = []
    for node_id in node_ids:
        node = graph[node_id]
        lines += winograd_facts(graph, node, target) + winograd_gradient_facts(graph, node, target)
        split = reduction_split(graph, node, target)
        if split > 1:
            lines.append(f"(reduction_split (Ref {node_id}) {split} {ints((split, *node.shape))})")
        product = weight_product(graph, node)
        if product is None:
            continue
        g, columns_node, groups = product  # g [N, O, L] or [N, G, Og, L]; node [N, O, K] or [N, G, Og, K]
        filters, columns, reduction = node.shape[-2], node.shape[-1], g.shape[0] * g.shape[-1]
        if graph[columns_node.inputs[0]].shape[1] == groups:  # one channel a group: a direct kernel's split
            splits = direct_weight_splits(math.prod(node.shape[1:]), reduction, target)
        else:
            splits = weight_splits(filters, columns, reduction, target, groups)
        if splits > 1:
            lines.append(f"(weight_split (Ref {node_id}) {splits} {ints((splits, *node.shape[1:]))})")
    return lines


def reduction_split(graph: Graph, node, target: Target) -> int:
    """The parts `target` splits the input gradient that `node` computes into along K (1: none, or
    not a stride-1 input gradient's fold(Wᵀ·g) [N, C, H, W]: M = C, N·H·W columns, K = O·kh·kw).
    Forwards are not offered the split (the kernel and the IR have it): on the H200 it ran no
    faster (`codegen.conv.REDUCTION_FILL_BELOW`)."""
    operands = input_gradient_operands(graph, node)
    if operands is None or tuple(node.attr("stride")) != (1, 1):
        return 1
    n, c, h, w = node.shape
    taps = node.attr("kernel")[0] * node.attr("kernel")[1]
    return reduction_splits(c, n * h * w, operands[0].shape[0] * taps, target)


def input_gradient_operands(graph: Graph, node) -> tuple | None:
    """(the weight matrix W, the output gradient g [N, O, L]) where `node` is fold(Wᵀ·g), the
    input gradient that `conv_grad_input` makes a kernel of; else None."""
    if node.op != "fold":
        return None
    product = graph[node.inputs[0]]
    if product.op != "matmul" or not product.attr("transpose_a") or product.attr("transpose_b"):
        return None
    weight, g = (graph[i] for i in product.inputs)
    return (weight, g) if weight.type.rank == 2 and g.type.rank == 3 else None


def winograd_facts(graph: Graph, node, target: Target) -> list[str]:
    """`(winograd t flip m u v p pad image size)` where `node` is a stride-1 3×3 convolution
    (reshape(W·unfold(x))) or its input gradient (fold(Wᵀ·g)), padding at most 2, on a `target`
    that offers Winograd's F(m×m, 3×3) (`codegen.winograd.winograd_tile`): whether the filter
    transform flips, m, the shapes of the filter and input transforms and of their product, and
    the attributes of the input and output transforms (ir/ops/winograd.py)."""
    tile = winograd_tile(target)
    if tile is None:
        return []
    geometry = winograd_forward(graph, node) or winograd_input_gradient(graph, node)
    if geometry is None:
        return []
    flip, rows, inner, images, padding, image, size = geometry
    th, tw = tiles(size, tile)
    count, planes = images * th * tw, positions(tile)
    shapes = [(planes, rows, inner), (planes, inner, count), (planes, rows, count)]
    texts = [ints(shape) for shape in shapes] + [ints(padding), ints(image), ints(size)]
    return [f"(winograd (Ref {node.id}) {'true' if flip else 'false'} {tile} {' '.join(texts)})"]


def winograd_gradient_facts(graph: Graph, node, target: Target) -> list[str]:
    """`(winograd_grad t m u v p size)` where `node` is a stride-1 3×3 convolution's weight
    gradient Σₙ g·unfold(x)ᵀ [O, C·9] (the batch sum of the per-image products), padding at most
    2, on a `target` that offers F(m×m, 3×3): m, the shapes of the output gradient's and the
    input's transforms [P, O, T], [P, C, T] and of their product [P, O, C], and the output size."""
    tile = winograd_tile(target)
    if tile is None or node.op != "sum" or tuple(node.attr("axes")) != (0,) or node.attr("keepdim"):
        return []
    product = weight_product(graph, graph[node.inputs[0]])
    if product is None or product[2] != 1 or not winograd_window(columns := product[1]):
        return []
    g, x = product[0], graph[columns.inputs[0]]
    images = g.shape[0]
    size = conv_output_size(x.shape[2:], *window(columns))
    th, tw = tiles(size, tile)
    planes, count = positions(tile), images * th * tw
    filters, channels = g.shape[1], x.shape[1]
    shapes = [(planes, filters, count), (planes, channels, count), (planes, filters, channels)]
    return [f"(winograd_grad (Ref {node.id}) {tile} {' '.join(ints(shape) for shape in shapes)} {ints(size)})"]


def winograd_forward(graph: Graph, node) -> tuple | None:
    """For reshape(W·unfold(x)) [N, O, Ho, Wo] with a Winograd window: (flip False, O, C, N,
    padding, (H, W), (Ho, Wo)); else None."""
    if node.op != "reshape" or node.type.rank != 4:
        return None
    product = graph[node.inputs[0]]
    if product.op != "matmul" or product.attr("transpose_a") or product.attr("transpose_b"):
        return None
    weight, columns = (graph[i] for i in product.inputs)
    if columns.op != "unfold" or not winograd_window(columns) or weight.type.rank != 2:
        return None
    x = graph[columns.inputs[0]]
    images, filters, *size = node.shape
    if x.type.rank != 4 or tuple(size) != conv_output_size(x.shape[2:], *window(columns)):
        return None
    return False, filters, x.shape[1], images, columns.attr("padding"), tuple(x.shape[2:]), tuple(size)


def winograd_input_gradient(graph: Graph, node) -> tuple | None:
    """For fold(Wᵀ·g) [N, C, H, W] with a Winograd window: the correlation of g [N, O, Ho·Wo]
    with the rotated filters, padding 2 − p: (flip True, C, O, N, 2 − p, (Ho, Wo), (H, W));
    else None."""
    operands = input_gradient_operands(graph, node)
    if operands is None or not winograd_window(node):
        return None
    g = operands[1]
    images, channels, *size = node.shape
    padding = tuple(2 - p for p in node.attr("padding"))
    return True, channels, g.shape[1], images, padding, conv_output_size(tuple(size), *window(node)), tuple(size)


def winograd_window(node) -> bool:
    """Whether an unfold or fold's window is 3×3, stride 1, dilation 1, padding at most 2 (Winograd's F(m×m, 3×3))."""
    kernel, stride, padding, dilation = full_window(node)
    return tuple(kernel) == (3, 3) and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1) and max(padding) <= 2
