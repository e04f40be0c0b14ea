"""Lowering of matmul and fused_matmul (shaders/matmul.wgsl): a batched GEMM with transposes, a
prologue on A's load and an epilogue on the result, register-tiled by a generator whose tile
configuration comes from a table measured per adapter family (codegen/gemm_table.py).

The kernel, for one BM × BN tile of the output per workgroup, walking K in steps of BK:
- Workgroup memory holds both operand tiles in one layout, k-major rows of vec4 along the output
  axis (A as [k][m / 4], B as [k][n / 4]), so the inner product is the same code for every
  transpose: per k, a thread loads RM vec4s of A (4 consecutive rows each) and RN vec4s of B and
  does 16·RM·RN scalar FMAs (4·RM·RN vec4 `fma`), 16 FMAs per 128-bit workgroup load.
- A thread's rows are RM groups of 4 consecutive rows, BM / RM apart; its columns RN vec4s,
  BN / RN apart: neighbouring threads read neighbouring vec4s of the B tile (no bank conflicts),
  threads of one row read the same A vec4 (a broadcast), and stores are neighbouring vec4s.
- Staging reads each operand along its contiguous axis. When that axis is the tile's output axis
  (A transposed, B not) a unit is one vec4 stored as is; when it is K, a unit is 4 consecutive k
  of one row, scattered into 4 workgroup words (consecutive threads take consecutive rows, so the
  scattered stores do not collide on banks). Units are vec4 loads from a vec4 binding where the
  contiguous length is a multiple of 4, else 4 scalar loads.
- Every bound check the shape makes unnecessary is left out (M, N, K are constants): a tile-multiple
  shape runs without a single comparison; a ragged one checks only its ragged axes, zero-filling
  the padding (never prologue(0)).
- `prefetch`: the next K tile's units are loaded into registers while this one is multiplied.
- Split-K (`fused_matmul(…, splits=S)`): workgroup t of S·TILES computes part t / TILES of the
  reduction, K range [s·⌈K/S⌉, min(K, (s+1)·⌈K/S⌉)), into matrix s of the partials; the loads
  check that range's end where it is not a multiple of BK. `matmul_splits` is how many parts a
  target splits a product into (the e-graph's `matmul_split_k` fact).
- The generator unrolls the whole K tile into straight-line code with named accumulators:
  dynamically indexed private arrays would leave registers for local memory on some drivers.
What each configuration reaches on the H200 and on lavapipe is in codegen/gemm_table.py, with the
command that measured it. Operand units and `store4` are codegen/gemm_operands.py's, shared with
conv_gemm. The products on the tensor cores are another pass's (passes/operand_splits.py).
"""

from __future__ import annotations

import math

from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    broadcast_strides,
    expression_code,
    grid_for,
    index_expr,
    output_binding,
    shape_text,
    sum_terms,
)
from meganeura.codegen.expressions import helper_functions
from meganeura.codegen.gemm_operands import OperandTile, store4_function, unit_code, unit_slot
from meganeura.codegen.gemm_table import SPLIT_TABLES, GemmTiling, gemm_tiling, shrunk, table_for
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops.matmul import matmul_a_view, matmul_dims, part_length
from meganeura.ir.ops.reduce import nonempty_splits, split_length
from meganeura.target import GENERIC, Target


def store_code(op: OperandTile, tiling: GemmTiling, j: int | str, register: str) -> list[str]:
    """WGSL that stores unit j (in `register`) into the workgroup tile of `op`."""
    s = unit_slot(tiling, j)
    tile4 = op.tile // 4
    shared = f"tile_{op.name}"
    if op.outer_contiguous:
        return [f"{shared}[({s}) / {tile4}u * {tile4}u + ({s}) % {tile4}u] = {register};"]
    row = f"({s}) % {op.tile}u"
    kq = f"({s}) / {op.tile}u * 4u"
    return [
        f"{shared}[({kq} + {c}u) * {tile4}u + {row} / 4u][{row} % 4u] = {register}.{comp};"
        for c, comp in enumerate("xyzw")
    ]


def multiply_code(tiling: GemmTiling) -> list[str]:
    """The unrolled inner product of one K tile: per k, RM vec4 loads of A, RN of B, 4·RM·RN fmas."""
    bm4, bn4 = tiling.bm // 4, tiling.bn // 4
    lines = []
    for k in range(tiling.bk):
        lines.append("{")
        lines += [f"  let a{g} = tile_a[{k * bm4 + g * tiling.threads_y}u + ty];" for g in range(tiling.rm)]
        lines += [f"  let b{h} = tile_b[{k * bn4 + h * tiling.threads_x}u + tx];" for h in range(tiling.rn)]
        for g in range(tiling.rm):
            for c, comp in enumerate("xyzw"):
                for h in range(tiling.rn):
                    acc = f"acc_{4 * g + c}_{h}"
                    lines.append(f"  {acc} = fma(vec4<f32>(a{g}.{comp}), b{h}, {acc});")
        lines.append("}")
    return lines


def looped_staging(op: OperandTile, tiling: GemmTiling, units: int, ragged_k: bool) -> list[str]:
    """The staging of `op`'s tile as a loop over this thread's units, each loaded and stored into
    the workgroup tile at once (no staging registers): one unit's code however many there are."""
    body = unit_code(op, tiling, ragged_k, "j", "KT", "unit", False) + store_code(op, tiling, "j", "unit")
    return [f"for (var j = 0u; j < {units}u; j++) {{ var unit: vec4<f32>; {' '.join(body)} }}"]


def gemm_blocks(
    op_a: OperandTile,
    op_b: OperandTile,
    tiling: GemmTiling,
    ragged_k: bool,
    prologue: bool,
    looped: frozenset[str] = frozenset(),
) -> dict[str, object]:
    """The generated parts of a register-tiled GEMM kernel, as the placeholders and the flag of
    shaders/gemm_loop.wgsl (the K loop): the tile sizes, the staging registers, the named
    accumulators, the global loads of a K tile at `kbegin`, at `k0` and at `k0 + BK`, the stores
    of the staged units into the workgroup tiles, the unrolled inner product and the output stores
    through `store4(obat, row, col, v)`. `prologue`: A's vec4 units go through `prologue`.
    `looped`: the operands ("a", "b") staged by `looped_staging`, in the loads (not with
    `prefetch`). Shared by matmul and conv_gemm, which differ in how a unit is loaded (their
    `load_a`, `load_b`) and where an output element goes (their `store4`)."""
    if looped and tiling.prefetch:
        raise ValueError(f"GEMM tiling {tiling}: a looped staging has no registers to prefetch into")
    units_a, units_b = tiling.units_per_thread
    unrolled = [(op, units) for op, units in ((op_a, units_a), (op_b, units_b)) if op.name not in looped]
    registers = [f"var r{op.name}{j}: vec4<f32>;" for op, units in unrolled for j in range(units)]
    loads = [
        line
        for op, units in ((op_a, units_a), (op_b, units_b))
        for line in (
            looped_staging(op, tiling, units, ragged_k)
            if op.name in looped
            else [
                line
                for j in range(units)
                for line in unit_code(op, tiling, ragged_k, j, "KT", f"r{op.name}{j}", op is op_a and prologue)
            ]
        )
    ]
    stores = [
        line for op, units in unrolled for j in range(units) for line in store_code(op, tiling, j, f"r{op.name}{j}")
    ]
    load_text = "\n        ".join(loads)
    return {
        "BM": tiling.bm,
        "BN": tiling.bn,
        "BK": tiling.bk,
        "TX": tiling.threads_x,
        "TY": tiling.threads_y,
        "PREFETCH": tiling.prefetch,
        "REGISTERS": "\n    ".join(registers),
        "ACCUMULATORS": "\n    ".join(
            f"var acc_{i}_{h} = vec4<f32>(0.0);" for i in range(4 * tiling.rm) for h in range(tiling.rn)
        ),
        "LOAD_FIRST": load_text.replace("KT", "kbegin"),
        "LOAD": load_text.replace("KT", "k0"),
        "LOAD_NEXT": load_text.replace("KT", "(k0 + BK)"),
        "STAGE": "\n        ".join(stores),
        "MULTIPLY": "\n        ".join(multiply_code(tiling)),
        "STORE": "\n    ".join(output_code(tiling)),
    }


def output_code(tiling: GemmTiling) -> list[str]:
    """Stores of every accumulator through the epilogue (`store4`)."""
    lines = []
    for g in range(tiling.rm):
        for c in range(4):
            row = f"m0 + {g * 4 * tiling.threads_y + c}u + 4u * ty"
            for h in range(tiling.rn):
                col = f"n0 + {h * 4 * tiling.threads_x}u + 4u * tx"
                lines.append(f"store4(obat, {row}, {col}, acc_{4 * g + c}_{h});")
    return lines


# Split-K (`matmul_splits`): split where the largest tile leaves fewer than SPLIT_FILL workgroups
# per compute unit, into parts of at least MIN_SPLIT_K, at most MAX_SPLITS of them.
SPLIT_FILL = 2
MIN_SPLIT_K = 256
MAX_SPLITS = 16

# Fine split-K (`fine_splits`), on a family with a ladder for split parts (gemm_table.SPLIT_TABLES:
# the H200's 64x64 tiles of 64 threads): a product that splits, whose A is stored [M, K] and whose
# K makes at least FINE_MIN_PARTS parts of FINE_SPLIT_K, splits into parts of that ladder's tile,
# as many as give every compute unit FINE_FILL workgroups (at most FINE_MAX_SPLITS, each part at
# least FINE_SPLIT_K long): many small workgroups where the largest tile gave the units one or
# two. Measured on the H200 (the sweep's figures and command at gemm_table.HOPPER_SPLIT_TABLE: its
# fastest pairs had 9 to 26 workgroups a unit): 2048x1536x576 Bᵀ and A·B at 8 parts of 192 (0.1545
# and 0.203 ms; 6 parts of 256: 0.165 and 0.223). In the steps (`python -m meganeura bench smollm2
# gpt2 --no-torch`, 2026-12-02, GPU time of one profiled step; the coarse split alone: SmolLM2
# 94.7, 94.9 and 95.0 ms, GPT-2 64.4, 64.3 and 64.4): min(K // 192, 12) parts made SmolLM2 faster
# (92.3, 92.2) and GPT-2 slower (65.3, 65.4: its 2048x768 outputs over K 3072, 6.73 → 7.34 ms a
# step, and 12 partials to sum); parts for 16 workgroups a unit (FINE_FILL), SmolLM2 92.3 and 92.1,
# GPT-2 64.8 (its K-3072 products 6.74 → 7.40 ms at 6 parts); for 24, 94.5 and 73.3. So the fine
# split is taken only for outputs that the plain ladder's largest tile covers with fewer than
# FINE_BELOW workgroups a unit: SmolLM2's 2048x576 (160 tiles of 64x128 on 132 SMs, 1.2 a unit)
# and not GPT-2's 2048x768 (192, 1.45); between the two nothing was measured. Products with A
# transposed (weight gradients) keep the split above, on the split ladder's tiles
# (`split_ladder_takes`: their fine parts were slower in the step). Shorter reductions, measured
# the same way on 2026-12-02 (`benchmarks/plan_ab.py --workloads smollm2`, one profiled step):
# SmolLM2's 2048x576 outputs over K = 576 (the q and o projections and their input gradients, 120
# a step), coarsely split in 2 parts on 64x128 tiles, 8.15 ms a step and their sums 1.21; in 4
# fine parts of 144, 7.27 ms (and the plan then reads the o projection's weight through Bᵀ, its
# 0.49 ms transpose gone), sums 1.63; in 3 of 192, 7.26 and 1.40 with no transpose gone; the step
# 86.10 → 85.20 ms at 4 parts (85.71 at 3). Hence parts of FINE_SPLIT_K = 144 from FINE_MIN_PARTS
# = 4 (K ≥ 576; the longer reductions' counts are unchanged: they reach FINE_FILL first), and
# only parts whose every boundary is on a 16-multiple of K (FINE_ALIGN, the split ladder's BK):
# a part off it runs the ragged-K path, which lost most of the gain where it was timed.
FINE_SPLIT_K = 144
FINE_MAX_SPLITS = 12
FINE_MIN_PARTS = 4
FINE_FILL = 16
FINE_BELOW = 1.25
FINE_ALIGN = 16


def matmul_splits(
    m: int, n: int, k: int, batches: int, target: Target, transpose_b: bool = False, transpose_a: bool = False
) -> int:
    """The parts a product's reduction is split into on `target` (1: none): where the table's
    largest tile for the output leaves a compute unit fewer than SPLIT_FILL workgroups, the fine
    split's parts where the product takes one (`fine_splits`), else enough that the largest tile
    gives every unit SPLIT_FILL workgroups, each part at least MIN_SPLIT_K long, none empty. A
    CPU (lavapipe) never splits: its units are threads that a tiled product already keeps busy."""
    if target.cpu or target.compute_units < 2 or k < 2 * MIN_SPLIT_K:
        return 1
    tiles = largest_tiling(m, n, target, transpose_b).tiles(m, n, batches)
    if tiles >= SPLIT_FILL * target.compute_units:
        return 1
    return fine_splits(m, n, k, batches, target, transpose_a, transpose_b) or parts_to_fill(
        tiles, k, SPLIT_FILL * target.compute_units, MIN_SPLIT_K, MAX_SPLITS
    )


def fine_splits(m: int, n: int, k: int, batches: int, target: Target, transpose_a: bool, transpose_b: bool) -> int:
    """The parts of a fine split of a product over `k` on `target` (0: it takes none): A stored
    [M, K], a family with a ladder for split parts, K of at least FINE_MIN_PARTS parts of
    FINE_SPLIT_K, an output the plain ladder's largest tile covers with fewer than FINE_BELOW
    workgroups a unit; parts enough that the split ladder's tiles give every unit FINE_FILL
    workgroups, at most FINE_MAX_SPLITS, each at least FINE_SPLIT_K long, none empty, fewer where
    that leaves a part's boundary off a FINE_ALIGN-multiple of K (none where no count is on it)."""
    if transpose_a or target.cpu or target.tuning not in SPLIT_TABLES or k < FINE_MIN_PARTS * FINE_SPLIT_K:
        return 0
    if largest_tiling(m, n, target, False).tiles(m, n, batches) >= FINE_BELOW * target.compute_units:
        return 0
    tiles = largest_tiling(m, n, target, transpose_b, "split").tiles(m, n, batches)
    parts = parts_to_fill(tiles, k, FINE_FILL * target.compute_units, FINE_SPLIT_K, FINE_MAX_SPLITS)
    while parts > 1 and (k % FINE_ALIGN or split_length(k, parts) % FINE_ALIGN):
        parts -= 1
    return parts if parts > 1 else 0


def largest_tiling(m: int, n: int, target: Target, transpose_b: bool, kind: str = "matmul") -> GemmTiling:
    """The largest tiling of `kind`'s ladder on `target`, shrunk to an M×N output."""
    return shrunk(table_for(target, kind).largest(transpose_b, target), m, n, target.workgroup_memory)


def parts_to_fill(tiles: int, reduction: int, wanted: int, shortest: int, most: int) -> int:
    """The parts a reduction of `reduction` elements splits into so that `tiles` output tiles
    become `wanted` workgroups, each part at least `shortest` long, at most `most` parts, none
    empty (1: no split). Matmul split-K and the convolutions' weight gradients share it."""
    splits = min(-(-wanted // tiles), reduction // shortest, most)
    splits = nonempty_splits(reduction, splits)
    return splits if splits > 1 else 1


def split_tiling(
    m: int, n: int, k: int, batches: int, splits: int, target: Target, transpose_b: bool, transpose_a: bool = False
) -> GemmTiling:
    """The tiling of a product split into `splits` parts along K: each part is a product of
    ⌈K/S⌉, and the S parts are S times the matrices of the batch; a product that takes a fine
    split (`fine_splits`), or any split one with A transposed (a weight gradient), takes the tiling
    of the family's ladder for split parts (`split_ladder_takes`), an unsplit batched one of
    narrow matrices (N < NARROW_BATCHED, attention's dQ per head) that of its ladder for batched
    products (gemm_table.BATCHED_TABLES); a batched product of wide matrices (Winograd's 16
    products, N the tiles of a batch of images) takes the matmul ladder: in ResNet-18's step on
    the H200 (2026-12-04, `benchmarks/plan_ab.py --workloads resnet18`) its products took 64x128
    tiles there against the batched ladder's 32x32, 16×512x512x512 1.073 → 0.661 ms a step,
    16×64x64x32768 1.487 → 0.987, the step's GPU time as one pass 17.04 → 15.09 ms."""
    if split_ladder_takes(m, n, k, batches, splits, target, transpose_a, transpose_b):
        kind = "split"
    else:
        kind = "batched" if batches > 1 and splits == 1 and n < NARROW_BATCHED else "matmul"
    return gemm_tiling(m, n, part_length(k, splits), batches * splits, target, transpose_b, kind)


NARROW_BATCHED = 128  # the matmul ladders' widest tile: a narrower output leaves its columns idle


def split_ladder_takes(
    m: int, n: int, k: int, batches: int, splits: int, target: Target, transpose_a: bool, transpose_b: bool
) -> bool:
    """Whether a product split into `splits` parts takes the tiles of the family's ladder for split
    parts: where it takes a fine split, and where A is transposed (a weight gradient, split into as
    many parts as the largest tile needs: `matmul_splits`). Why the second: on the H200 SmolLM2's
    weight gradients over 2048 tokens ran faster on the split ladder's 64x64 8x8 tiles than on the
    64x128 or 32x128 the matmul ladder gives them, at the same counts of parts (one profiled step's
    GPU time, the bench's steps in one process as benchmarks/plan_ab.py runs them, 2026-12-02:
    SmolLM2 91.10 → 88.46 ms — 1536x2048x576 Aᵀ in 3 parts 7.96 → 7.15 ms a step, 576x2048x576 Aᵀ
    in 6 parts 4.15 → 3.13, the k and v projections' 2.18 → 1.65, with the product transposed —
    and GPT-2 64.39 → 64.46, unchanged; the same tiles without prefetch 89.40; the fine split's
    parts (10) instead of the largest tile's 89.09: more partials to sum)."""
    if splits < 2:
        return False
    if transpose_a:
        return target.tuning in SPLIT_TABLES and not target.cpu
    return bool(fine_splits(m, n, k, batches, target, transpose_a, transpose_b))


def matmul_workgroups(attrs: dict, operands, results, target: Target = GENERIC) -> int:
    """The workgroups the cost model counts for a product: one per output tile of every matrix of
    the batch (and of every part of K), on a GPU counted in workgroups of the table's largest tile
    for the output, SPLIT_FILL of them per compute unit. Why: a unit runs several workgroups at
    once, and the table's ladder gives a product too small for the largest tile smaller tiles so
    that the units get SPLIT_FILL each; but a small tile keeps fewer threads per unit busy with
    less reuse per load (on the H200, 2048x49152x576 at 32x128 tiles: 19 TFLOP/s; 49152x2048x576
    Aᵀ at 64x128: 33, `python -m meganeura bench`, 2026-12-01). Counted this way, a product the
    ladder has shrunk looks as partly idle as it runs, and the split along K (`matmul_splits`),
    which keeps the large tile, can win in the cost model. A CPU's units are threads that run one
    workgroup at a time: there, every workgroup counts."""
    return matmul_counted(attrs, operands, results, None, target)


def matmul_counted(attrs: dict, operands, results, dispatched: int | None, target: Target = GENERIC) -> int:
    """`dispatched` workgroups of a product's kernel (None: the ones its tiling launches) as the
    cost model counts them (`matmul_workgroups`)."""
    batch, m, k, n = matmul_dims([matmul_a_view(operands[0], attrs), operands[1]], attrs, "matmul")
    batches, splits = math.prod(batch), attrs.get("splits", 1)
    transpose_b = bool(attrs.get("transpose_b", False))
    tiling = split_tiling(m, n, k, batches, splits, target, transpose_b, bool(attrs.get("transpose_a", False)))
    if dispatched is None:
        dispatched = -(-m // tiling.bm) * -(-n // tiling.bn) * batches * splits
    return counted_workgroups(dispatched, tiling, m, n, target, transpose_b)


def counted_workgroups(dispatched: int, tiling: GemmTiling, m: int, n: int, target: Target, transpose_b: bool) -> int:
    """`dispatched` workgroups of `tiling` as the cost model counts them (`matmul_workgroups`)."""
    if target.cpu:
        return dispatched
    largest = largest_tiling(m, n, target, transpose_b)
    return max(1, dispatched * tiling.bm * tiling.bn // (largest.bm * largest.bn * SPLIT_FILL))


# The percentage of its flops a product is charged on a GPU where its B tile is staged across the
# layout it is stored in (Bᵀ: B stored [N, K], each vec4 along K scattered over four rows of the
# k-major tile) or loaded by element (no vec4 units: N of an A·B product, or K of an A·Bᵀ one, not a
# multiple of 4). Measured on the H200 in the LM steps (benchmarks/plan_ab.py, 2026-12-04 05:30 UTC,
# the plan made to transpose the weights first; ms a step): GPT-2's 2048x768x2304 Bᵀ 3.74 against
# A·B 2.75, 2048x768x3072 Bᵀ 3.77 against 3.23, its tied head 2048x768x50257 Bᵀ 4.90 against A·B
# 5.14 with B by element; SmolLM2's head 2048x576x49152 Bᵀ 3.50 against 2.91, 2048x576x576 Bᵀ in 4
# parts 3.80 against 3.43 (docs/performance-log.md).
TRANSPOSED_B_FLOPS = 120
SCALAR_B_FLOPS = 130


def matmul_flop_scale(attrs: dict, operands, results, target: Target = GENERIC) -> int:
    """The percentage of a product's flops the cost model charges on `target` (the constants'
    comment). 100 on a CPU, whose kernel (`Target.cpu`) was not measured this way, and for a batched
    product, whose planned alternatives (attention's dQ, the Winograd products, the convolutions
    as batched GEMMs) were not either."""
    if target.cpu:
        return 100
    batch, m, k, n = matmul_dims([matmul_a_view(operands[0], attrs), operands[1]], attrs, "matmul")
    if batch:
        return 100
    transpose_b = bool(attrs.get("transpose_b", False))
    by_vec4 = loads_vec4(transpose_b, n, k, part_length(k, attrs.get("splits", 1)))
    return max(TRANSPOSED_B_FLOPS if transpose_b else 100, 100 if by_vec4 else SCALAR_B_FLOPS)


def loads_vec4(along_k: bool, outer: int, k: int, k_part: int) -> bool:
    """Whether an operand's units can be vec4 loads: stored along K, K and each part of it a
    multiple of 4 (a unit must not straddle a part's end); stored along its outer axis (M or N),
    that length a multiple of 4."""
    return k % 4 == 0 and k_part % 4 == 0 if along_k else outer % 4 == 0


@lowering(
    "matmul",
    "fused_matmul",
    workgroups=matmul_workgroups,
    per_target=True,
    counted=matmul_counted,
    flop_scale=matmul_flop_scale,
)
def lower_matmul(graph: Graph, node: Node, target: Target = GENERIC) -> KernelSpec:
    """Tiled, register-blocked, batched matmul with transposes, a prologue and an epilogue expression.

    `fused_matmul` inputs are (a, b, *extras); its `epilogue` reads `$acc` and the extras `$0…`,
    each broadcast to the output [*batch, M, N] and indexed by the element's (bat, row, col).
    Its `prologue` reads `$a`, the stored element of A, and extras broadcast to A's stored shape,
    indexed by the element's stored coordinates (row k, column m when A is transposed); it runs
    while A's tile is staged, so the A the product uses is never written. With `flatten_a` the
    stored A [..., K] is the matrix of its rows: a row index runs over all its leading dims.
    """
    a, b, *extras = node.inputs
    transpose_a = bool(node.attr("transpose_a", False))
    transpose_b = bool(node.attr("transpose_b", False))
    flatten_a = bool(node.attr("flatten_a", False))
    a_view = matmul_a_view(graph[a].type, node.attr_dict)
    batch, m, k, n = matmul_dims([a_view, graph[b].type], node.attr_dict, node.op)
    batches = math.prod(batch)
    splits = node.attr("splits", 1) if node.op == "fused_matmul" else 1
    causal_rows = node.attr("causal_rows", 0) if node.op == "fused_matmul" else 0
    k_part = part_length(k, splits)
    epilogue_text = node.attr("epilogue", "$acc") if node.op == "fused_matmul" else "$acc"
    prologue_text = node.attr("prologue", "$a") if node.op == "fused_matmul" else "$a"
    tree = parse_expr(epilogue_text)
    prologue_tree = parse_expr(prologue_text)
    operands = Operands(graph)
    operands.bound(a, "a")
    operands.bound(b, "b")

    def read(name: str) -> str:
        if name == "acc":
            return "x"
        extra = extras[int(name)]
        strides = broadcast_strides(graph[extra].shape, node.shape)
        index = sum_terms(
            index_expr("bat", batch, strides[:-2]),
            index_expr("row", (m,), strides[-2:-1]),
            index_expr("col", (n,), strides[-1:]),
        )
        return operands.read_at(extra, index)

    stored_rows, stored_cols = ("k", "m") if transpose_a else ("m", "k")
    a_shape = graph[a].shape
    a_batch = a_view.shape[:-2]  # () when A is 2-D and shared by every matrix of the batch
    # A stored row: one index over the dims before the last (all of them when A is flattened).
    row_dims = a_shape[:-1] if flatten_a else a_shape[-2:-1]

    def read_for_a(name: str) -> str:
        if name == "a":
            return "x"
        extra = extras[int(name)]
        strides = broadcast_strides(graph[extra].shape, a_shape)
        index = sum_terms(
            index_expr("bat", a_batch, strides[: len(a_batch)]),
            index_expr(stored_rows, row_dims, strides[len(a_batch) : -1]),
            index_expr(stored_cols, a_shape[-1:], strides[-1:]),
        )
        return operands.read_at(extra, index)

    reads, epilogue = expression_code(tree, read)
    a_reads, prologue = expression_code(prologue_tree, read_for_a)
    tiling = split_tiling(m, n, k, batches, splits, target, transpose_b, transpose_a)
    ragged_k = k % tiling.bk != 0 or k_part % tiling.bk != 0  # a K tile may pass the part's end
    # An operand an epilogue or prologue also reads by element keeps its scalar binding.
    elementwise = set(extras)
    a_vec4 = loads_vec4(not transpose_a, m, k, k_part) and a not in elementwise
    b_vec4 = loads_vec4(transpose_b, n, k, k_part) and b not in elementwise
    op_a = OperandTile("a", "m", m, tiling.bm, transpose_a, a_vec4)
    op_b = OperandTile("b", "n", n, tiling.bn, not transpose_b, b_vec4)
    vector_out = n % 4 == 0
    bindings = [Binding("a", a, "read"), Binding("b", b, "read"), *operands.bindings, output_binding(node)]
    vec4_names = {name for name, on in (("a", op_a.vector), ("b", op_b.vector), ("out", vector_out)) if on}
    tiles_m = -(-m // tiling.bm)
    rows_grid = grid_for(tiles_m * batches * splits)  # (row tile, batch, part) triples, folded over y and z
    values = {
        "BINDINGS": bindings_wgsl(graph, bindings, vec4_names),
        "M": m,
        "N": n,
        "K": k,
        "TILES_M": tiles_m,
        "TILES": tiles_m * batches,
        "SPLITS": splits,
        "K_PART": k_part,
        "CAUSAL": bool(causal_rows),
        "CAUSAL_ROWS": causal_rows,
        "GRID_Y": max(rows_grid[0], 1),
        "A_SCALAR": not op_a.vector,
        "B_SCALAR": not op_b.vector,
        # Elements between an operand's matrices; 0u for a 2-D operand shared by the whole batch.
        "A_BATCH_STRIDE": "(M * K)" if len(a_batch) else "0u",
        "B_BATCH_STRIDE": "(K * N)" if len(graph[b].shape) > 2 else "0u",
        "A_INDEX": op_a.element_index("m", "k"),
        "B_INDEX": op_b.element_index("n", "k"),
        "FUNCTIONS": helper_functions([tree, prologue_tree]),
        "A_READS": a_reads,
        "PROLOGUE": prologue,
        "READS": reads,
        "EPILOGUE": epilogue,
        "STORE4": store4_function(m, n, tiling.bm, tiling.bn, vector_out),
    }
    wgsl = render("matmul", {**values, **gemm_blocks(op_a, op_b, tiling, ragged_k, prologue_text != "$a")})
    entry, workgroup = "matmul", (tiling.threads_x, tiling.threads_y, 1)
    memory, keeps_checks = tiling.workgroup_bytes, tiling.checked
    label = f"{node.op} {shape_text(batch) + '×' if batch else ''}{m}x{k}x{n}"
    label += " Aᵀ" * transpose_a + " Bᵀ" * transpose_b + ("" if epilogue_text == "$acc" else f" {epilogue_text}")
    label += "" if prologue_text == "$a" else f" A={prologue_text}"
    label += f" in {splits} parts of K" if splits > 1 else ""
    label += f" causal rows of {causal_rows}" if causal_rows else ""
    grid = (-(-n // tiling.bn), rows_grid[0], rows_grid[1])
    return KernelSpec(
        node.id,
        label,
        wgsl,
        entry,
        tuple(bindings),
        grid,
        workgroup,
        keeps_checks=keeps_checks,
        workgroup_memory=memory,
    )
