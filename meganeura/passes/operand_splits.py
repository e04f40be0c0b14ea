"""Products on the tensor cores from operands split once (ir/ops/halves.py): the pass that makes
them. Their kernel is codegen/matmul_halves.py's, the splits' codegen/halves_split.py's.

`split_operands(graph, target)`, on a target with tensor cores, replaces each product it takes
(`halves_product`: a matmul or a fused_matmul without a prologue, one matrix — A's leading dims
folded into its rows where B is 2-D —, `halves_take` by shape) by

    top = fused_reduce max of abs over x's TOP_PARTS rows      (once per operand tensor)
    halves = split_halves(x, top, transpose)                   (once per operand and layout)
    split_matmul(halves_a, top_a, halves_b, top_b, extras…)    (the product, its epilogue, its parts)

so that an activation, a weight or a gradient is split once for every product that reads it as
the same matrix (a gradient G is A of G·Wᵀ and B of Xᵀ·G), into the layout whose tiles load
row-major; a transposed weight (a `permute` the plan made for the f32 kernels) is split from the
weight itself, transposed by the split. The weights, all ready when the step starts, have their
maxima and splits made by multi-tensor nodes (multi_top, multi_split_halves) before the first
product, as many weights a kernel as its bindings allow (GROUP_WEIGHTS). The halves are padded
to SPLIT_PAD both ways, so that a tiling of the ladder that divides them (`halves_tiling`) reads
whole tiles and K is whole tiles of BK. A product that extraction split into parts of K for the
f32 kernels takes the parts that fill the GPU with the tensor tiles instead (`halves_splits`,
REPART): the sum of its parts is made again for the new count, or, where one part is left, the
product takes over that sum's epilogue and extras (`completed`). The other products keep their
kernels.

Why after extraction, like passes/attention_scores.py: a split is shared by several products
and changes their operands' type; extraction moves one e-class at a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meganeura.codegen import tensor_tiles
from meganeura.codegen.common import binding_limit, merged_sources
from meganeura.codegen.matmul_halves import SPLIT_PAD
from meganeura.codegen.tensor_tiles import dividing_tilings
from meganeura.ir.expr import format_expr, renamed
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import SKIP, Graph, Node
from meganeura.ir.op import add_checked
from meganeura.ir.ops.halves import split_part
from meganeura.ir.ops.matmul import matmul_a_view, matmul_dims
from meganeura.target import Target

# At most this many partial maxima of |x| a tensor (each workgroup of a split or a product reduces
# them). On the H200 (as MIN_DIM's runs, every product split): SmolLM2 78.19 ms at 1,024, 73.29 at
# 256; GPT-2 49.85, 48.87; in a second run 128 against 256, SmolLM2 73.38 and 73.20, GPT-2 49.20
# and 48.80. Units a thread of an untransposed split: 4 against 1, SmolLM2 78.19 and 78.27, GPT-2
# 49.85 and 50.61 (at 1,024 maxima; halves_split.SPLIT_UNITS).
TOP_PARTS = 256
# Whether the weights' maxima and splits run as multi-tensor kernels (codegen/halves_split.py),
# as many weights a kernel as its bindings allow, before the step's first product. On the H200
# (as above, 256 maxima, products ≥ 256 wide): SmolLM2 70.46 ms against 71.19 one by one, GPT-2
# 48.78 against 48.87 (GPU time as one pass).
GROUP_WEIGHTS = True


@dataclass(frozen=True)
class HalvesProduct:
    """A product `split_operands` takes: op(A) [m, k] · op(B) [k, n] (A's leading dims folded into
    m), through `epilogue` with `extras`, in `splits` parts of K."""

    a: int
    b: int
    transpose_a: bool
    transpose_b: bool
    m: int
    k: int
    n: int
    extras: tuple[int, ...]
    epilogue: str
    splits: int


# The smallest dim of a product that runs from split operands. Below, the f32 kernel: on the H200
# (2026-12-04, benchmarks/plan_ab.py on Dawn, GPU time of a step as one pass) SmolLM2's step took
# 73.20 ms with every product split, 71.07 with those ≥ 256 (its 192-wide K/V projections and
# their gradients keep the f32 kernels, and their operands no splits), 71.04 with those ≥ 512;
# GPT-2's 48.80, 48.86 and 48.83 (the f32 kernels: 67.74 and 56.73).
MIN_DIM = 256
# The fewest multiply-adds (m·k·n) of a product that runs from split operands. A small product's
# splits and maxima (a dispatch or two an operand) cost more than the tensor cores save: on the
# H200 (2026-12-04, benchmarks/plan_ab.py on Dawn with the opt-ins, GPU time of a step as one pass)
# the digits MLP's step, whose products are 2^28 multiply-adds at most, took 0.31 ms with them split
# and 0.24 on the f32 kernels (34 and 25 dispatches; wall 0.7 and 0.6 ms). The LMs' products are
# 1.3·2^29 and more: their plans are the same either way.
MIN_MACS = 2**29


def halves_take(m: int, k: int, n: int) -> bool:
    """Whether a product that can run from split operands does: where its every dim is at least
    MIN_DIM and it has MIN_MACS multiply-adds (the hook `benchmarks/plan_ab.py` replaces to A/B a
    policy)."""
    return min(m, k, n) >= MIN_DIM and m * k * n >= MIN_MACS


def halves_product(graph: Graph, node: Node) -> HalvesProduct | None:
    """The product `node` computes, where it can run from split operands: a matmul or a
    fused_matmul without a prologue, one matrix after folding A's leading dims into its rows (B
    2-D), in parts of K that whole tiles of 32 can make; else None."""
    if node.op not in ("matmul", "fused_matmul") or node.attr("prologue", "$a") != "$a":
        return None
    a, b, *extras = node.inputs
    attrs = node.attr_dict
    batch, m, k, n = matmul_dims([matmul_a_view(graph[a].type, attrs), graph[b].type], attrs, node.op)
    if graph[b].type.rank != 2 or (batch and attrs.get("transpose_a")):
        return None
    splits = node.attr("splits", 1)
    if splits > 1 and (splits - 1) * split_part(k, splits) >= k:
        return None
    return HalvesProduct(
        a,
        b,
        bool(attrs.get("transpose_a")),
        bool(attrs.get("transpose_b")),
        math.prod(batch) * m,
        k,
        n,
        tuple(extras),
        node.attr("epilogue", "$acc"),
        splits,
    )


# Whether a product split into parts of K for the f32 kernels (extraction's choice) gets the parts
# that fill the GPU with the tensor-core kernel's tiles instead (`halves_splits`). On the H200
# (as tensor_tiles.FILL's runs, FILL 3; GPU ms as one pass, with / without): GPT-2 41.90 /
# 42.68, SmolLM2 59.87 / 61.19; each part at least 128 of K instead of PART_MIN's 256: 42.21 and
# 60.15. At FILL 2 re-parting lost (GPT-2 43.20 / 42.76, SmolLM2 61.93 / 61.32).
REPART = True
PART_MIN = 256  # the fewest elements of K a part gets


def halves_splits(product: HalvesProduct, target: Target) -> int:
    """Parts of K for `product` on the tensor cores: with the largest tiling that divides its
    padded halves, the fewest parts whose tiles give every compute unit FILL workgroups
    (tensor_tiles.tensor_tiling's rule, which then picks that tiling), each part at least
    PART_MIN of K; the smallest tiling's count where none does."""
    rows, cols = -(-product.m // SPLIT_PAD) * SPLIT_PAD, -(-product.n // SPLIT_PAD) * SPLIT_PAD
    most = max(1, product.k // PART_MIN)
    for tiling in dividing_tilings(target, rows, cols):
        parts = max(1, -(-tensor_tiles.FILL * target.compute_units // tiling.tiles(product.m, product.n, 1)))
        if parts <= most:
            break
    parts = min(parts, most)
    while parts > 1 and (parts - 1) * split_part(product.k, parts) >= product.k:
        parts -= 1
    return parts


def repartable(graph: Graph, node: Node) -> bool:
    """Whether the parts of K of product `node` can change: one reader sums them over axis 0 (a
    `sum`, or a `fused_reduce` whose prologue reads them alone), so it can be made again for the
    new count, or become the product's epilogue where one part is left (`split_operands`)."""
    if len(graph.users()[node.id]) != 1 or node.id in graph.roots():
        return False
    for user in graph.users()[node.id]:
        reader = graph[user]
        if tuple(reader.attr("axes", ())) != (0,) or reader.attr("keepdim", False) or reader.inputs[0] != node.id:
            return False
        if reader.op == "fused_reduce":
            if reader.attr("prologue") != "$0" or node.id in reader.inputs[1:]:
                return False
        elif reader.op != "sum":
            return False
    return True


def top_parts(numel: int) -> int:
    """Rows of the partial maxima of |x| over `numel` elements: the largest divisor ≤ TOP_PARTS."""
    return max(d for d in range(1, TOP_PARTS + 1) if numel % d == 0)


def unpermuted(graph: Graph, x: int, transpose: bool) -> tuple[int, bool]:
    """(the tensor, transposed or not) a split of op(x) reads: through a reshape that keeps the
    last dim (the same matrix of rows: a split flattens the leading dims), and through a 2-D
    transpose, its input the other way round (a weight the plan transposed for the f32 kernels);
    so that a tensor is split, and its maxima found, once however the products view it."""
    while True:
        node = graph[x]
        if node.op == "reshape" and node.shape[-1:] == graph[node.inputs[0]].shape[-1:]:
            x = node.inputs[0]
        elif node.op == "permute" and node.attr("perm") == (1, 0):
            x, transpose = node.inputs[0], not transpose
        else:
            return x, transpose


def weight_splits(graph: Graph, chosen: dict[int, HalvesProduct]) -> list[tuple[int, bool]]:
    """The (param leaf, transposed) splits the chosen products read, in order of first use."""
    keys = []
    for product in chosen.values():
        for x, transpose in ((product.a, product.transpose_a), (product.b, product.transpose_b)):
            key = unpermuted(graph, x, transpose)
            if graph[key[0]].op == "param":
                keys.append(key)
    return list(dict.fromkeys(keys))


def bound_groups(members: list[list], limit: int) -> list[list]:
    """`members` (each the list of what it binds, distinct items bound once; its last item names
    it) in consecutive groups whose bindings — the distinct items of their members — fit `limit`:
    the names of each group's members."""
    groups: list[list] = []
    bound: set = set()
    for member in members:
        if not groups or len(bound | set(member)) > limit:
            groups.append([])
            bound = set()
        groups[-1].append(member[-1])
        bound |= set(member)
    return groups


def split_operands(graph: Graph, target: Target) -> Graph:
    """`graph` with the products `halves_product` finds and `halves_take` takes on split operands
    (module docstring); the graph itself on a target without tensor cores."""
    if not target.tensor_cores:
        return graph
    live = graph.live_ids()
    chosen = {}
    for node in graph:
        product = halves_product(graph, node) if node.id in live else None
        if product is not None and halves_take(product.m, product.k, product.n):
            chosen[node.id] = product
    if not chosen:
        return graph
    tops: dict[int, int] = {}
    splits: dict[tuple[int, bool], int] = {}
    weights = weight_splits(graph, chosen) if GROUP_WEIGHTS else []
    last_weight = max((x for x, _ in weights), default=None)
    first_after_weights = None if last_weight is None else next(n.id for n in graph if n.id > last_weight)
    limit = binding_limit(target)

    def top_of(x: int, new: Graph, new_id: dict[int, int], sources) -> int:
        if x not in tops:
            numel = graph[x].type.numel
            rows = top_parts(numel)
            flat = add_checked(new, "reshape", (new_id[x],), {"shape": (rows, numel // rows)}, sources)
            attrs = {"kind": "max", "axes": (1,), "keepdim": False, "in_shape": (rows, numel // rows)}
            tops[x] = add_checked(new, "fused_reduce", (flat,), {**attrs, "prologue": "abs($0)"}, sources)
        return tops[x]

    def halves_of(x: int, transpose: bool, new: Graph, new_id: dict[int, int], sources) -> tuple[int, int]:
        """(the halves of op(x), the top they were scaled by)."""
        x, transpose = unpermuted(graph, x, transpose)
        if (x, transpose) not in splits:
            top = top_of(x, new, new_id, sources)
            attrs = {"transpose": transpose, "rows_to": SPLIT_PAD, "cols_to": SPLIT_PAD}
            splits[x, transpose] = add_checked(new, "split_halves", (new_id[x], top), attrs, sources)
        return splits[x, transpose], tops[x]

    def split_weights(new: Graph, new_id: dict[int, int]) -> None:
        """The weights' maxima, then their splits, as multi-tensor nodes (`tops`, `splits` map
        each to its projection)."""
        tensors = list(dict.fromkeys(x for x, _ in weights))
        for group in bound_groups([[("maxima", x), x] for x in tensors], limit):  # binds x and its maxima
            parts = [top_parts(graph[x].type.numel) for x in group]
            sources = merged_sources(graph[x].sources for x in group)
            multi = add_checked(new, "multi_top", [new_id[x] for x in group], {"parts": parts}, sources)
            for index, x in enumerate(group):
                tops[x] = new.add("result", (multi,), new[multi].types[index], {"index": index}, graph[x].sources)
        for group in bound_groups([[x, tops[x], (x, t)] for x, t in weights], limit):
            operands = [i for x, t in group for i in (new_id[x], tops[x])]
            attrs = {"transposes": [int(t) for _, t in group], "rows_to": SPLIT_PAD, "cols_to": SPLIT_PAD}
            sources = merged_sources(graph[x].sources for x, _ in group)
            multi = add_checked(new, "multi_split_halves", operands, attrs, sources)
            for index, (x, t) in enumerate(group):
                splits[x, t] = new.add("result", (multi,), new[multi].types[index], {"index": index}, graph[x].sources)

    reparted: set[int] = set()  # products whose parts of K changed: their readers are made again
    completes: dict[int, tuple] = {}  # reader -> the product in one part it completes, made there

    def replace(node: Node, new: Graph, new_id: dict[int, int]) -> int | None:
        if node.id == first_after_weights:
            split_weights(new, new_id)
        if node.id in completes:
            return completed(node, *completes.pop(node.id), new, new_id)
        if reparted.intersection(node.inputs):  # a reader of parts whose count changed
            parts = new[new_id[node.inputs[0]]].shape
            attrs = node.attr_dict | ({"in_shape": parts} if node.op == "fused_reduce" else {})
            return add_checked(new, node.op, tuple(new_id[i] for i in node.inputs), attrs, node.sources)
        product = chosen.get(node.id)
        if product is None:
            return None
        halves_a, top_a = halves_of(product.a, product.transpose_a, new, new_id, node.sources)
        halves_b, top_b = halves_of(product.b, product.transpose_b, new, new_id, node.sources)
        operands = (halves_a, top_a, halves_b, top_b, *(new_id[e] for e in product.extras))
        shape = node.shape[1:] if product.splits > 1 else node.shape
        splits = product.splits
        if REPART and splits > 1 and repartable(graph, node):
            splits = halves_splits(product, target)
            reparted.update([node.id] if splits != product.splits else [])
        attrs = {"m": product.m, "k": product.k, "n": product.n, "shape": shape}
        attrs |= {"epilogue": product.epilogue, "splits": splits}
        if splits == 1 and product.splits > 1:
            (reader,) = graph.users()[node.id]  # repartable: the sum of its parts, which it now is
            completes[reader] = (operands, attrs, node.sources)
            return SKIP
        return add_checked(new, "split_matmul", operands, attrs, node.sources)

    return graph.rebuilt(replace)


def completed(reader: Node, operands: tuple, attrs: dict, sources, new: Graph, new_id: dict[int, int]) -> int:
    """The product in one part that `reader` summed the parts of, made in its place: with the
    reader's epilogue and extras where it is a fused_reduce (`$r` read as `$acc`, extra `$i` as
    `$(i-1)`), so that no kernel sums a single part."""
    extras, epilogue = (), "$acc"
    if reader.op == "fused_reduce":
        extras = tuple(new_id[i] for i in reader.inputs[1:])
        names = {"r": "acc", **{str(i + 1): str(i) for i in range(len(extras))}}
        epilogue = format_expr(renamed(parse_expr(reader.attr("epilogue")), names))
    attrs = attrs | {"epilogue": epilogue, "shape": reader.shape}
    merged = merged_sources([sources, reader.sources])
    return add_checked(new, "split_matmul", (*operands, *extras), attrs, merged)
