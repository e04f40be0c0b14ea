"""Lowering of the reductions: sum, max and fused_reduce over any axes (shaders/reduce.wgsl), and
how far a long reduction with few outputs is split into partial reductions (`reduce_splits`).

Two-level reductions. A reduction launches a workgroup per output (or per 16 or 64 outputs): a
batch-norm statistic [N, C, H, W] → [C] runs C workgroups, a full sum one, whatever the length
of the reduction, and leaves most of a GPU idle. The split is an IR rewrite, not a second
dispatch inside this lowering: `fused_reduce` with `splits` S writes S partials per output
([S, *out], ir/ops/reduce.py) and an ordinary reduction over axis 0 combines them, so the
partials are a tensor like any other (the buffer plan reuses their memory, the interpreter
checks both levels, the cost model prices both kernels, and extraction chooses the split only
where it pays: rewrite/reductions.py `split_reduce`). Two dispatches from one lowering would
need what nothing here has: a lowering returns one KernelSpec, a KernelSpec writes only its
node's results (no scratch buffer in the buffer plan), and the cost model, the workgroup
registry and the profiler all count one dispatch per node. The combine is deterministic: a
fixed order of additions, no atomics (WGSL has no float atomics).
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
from meganeura.codegen.expressions import helper_functions, literal
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.reduce_vec4 import ItemReads, RowReads
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node
from meganeura.ir.op import normalize_axes
from meganeura.ir.ops.reduce import nonempty_splits, split_length
from meganeura.target import GENERIC, Target

REDUCE_INIT = {"sum": "0.0", "max": literal(float("-inf"))}
# ⊕ of two items, f32 or vec4. WGSL's max returns the other operand where one is NaN; PyTorch's
# max reductions (amax, and a fused reduction's) give NaN: maximum's helper, and its vec4 form here.
REDUCE_COMBINE = {
    ("sum", "f32"): "a + b",
    ("sum", "vec4<f32>"): "a + b",
    ("max", "f32"): "mn_maximum(a, b)",
    ("max", "vec4<f32>"): "mn_maximum4(a, b)",
}
MAXIMUM4 = """fn mn_maximum4(a: vec4<f32>, b: vec4<f32>) -> vec4<f32> {
    let magnitude = vec4<u32>(0x7fffffffu);
    let infinity = vec4<u32>(0x7f800000u);
    let nan = ((bitcast<vec4<u32>>(a) & magnitude) > infinity) | ((bitcast<vec4<u32>>(b) & magnitude) > infinity);
    return select(max(a, b), a + b, nan);
}"""


def combine_functions(kind: str, item_type: str, trees) -> str:
    """The helper functions of a reduction kernel: its expressions' and its combine's."""
    text = helper_functions(trees, ("maximum",) if kind == "max" else ())
    return text + "\n\n" + MAXIMUM4 if (kind, item_type) == ("max", "vec4<f32>") else text


# reduce_columns: a workgroup computes COLUMNS neighbouring outputs, each with WG / COLUMNS
# threads. 16 floats are 64 bytes, two whole 32-byte memory sectors per row read.
COLUMNS = 16
# A short reduction (64 elements or fewer, not along the innermost dim) with this many outputs or
# more runs in workgroups of 256 threads on a GPU, not 64. Measured on the H200, 2026-12-02, in the
# SmolLM2-135M-shaped step (`benchmarks/plan_ab.py --workloads smollm2`, one profiled step):
# dK/dV's group sums over axis 2 of [8, 3, 3, 256, 64] 0.559 → 0.487 ms a step, the 6 partials
# of [576, 576] 0.553 → 0.494, the rest within 0.05; the step 83.68 → 83.39 ms GPU.
SERIAL_WIDE_OUTPUTS = 65536
# reduce_rows: a short reduction along the innermost dim (at most ROW_LANES_MAX elements) with
# many outputs runs ROW_LANES neighbouring threads an output on a GPU, not a thread an output.
# Measured on the H200, 2026-12-02, on the rows' Dᵢ = Σ dO∘O of attention's backward over
# head_dim 64: alone ([8, 9, 256, 64] → [8, 9, 256]; a copy of benchmarks/reductions.py), a thread
# a row 16.6-22.8 µs at 32-256 threads a workgroup, a workgroup a row (reduce_tree) 16.8; in the
# SmolLM2-135M-shaped step (`benchmarks/plan_ab.py`, one profiled step) 20.4 µs a layer as
# reduce_serial, 11.3 as reduce_rows (GPT-2's [8, 12, 256, 64]: 21.3 and 11.7), the step 83.43
# → 83.05 ms GPU; 8 or 32 lanes moved it by under 0.15 ms.
ROW_LANES = 16
ROW_LANES_MAX = 64
ROW_WG = 256


def row_lanes(r: int) -> int:
    """The lanes reduce_rows gives each output of `r` elements: ROW_LANES, fewer for shorter rows."""
    return min(ROW_LANES, 1 << max(0, (r - 1).bit_length()))


# On a GPU a long reduction over outer dims takes a workgroup per output up to this many outputs
# (measured up to 1536, `reduce_plan`; past that a guess: the outputs alone fill the units).
TREE_OUTPUTS = 16384


def reduce_plan(outs: int, r: int, innermost_reduced: bool, target: Target = GENERIC) -> tuple[str, int]:
    """(entry point, workgroup size) of a reduction of `r` elements for each of `outs` outputs on `target`.

    - reduce_tree, a workgroup per output: a long reduction along contiguous memory (the
      innermost dim is reduced), which the workgroup reads one row together; on a GPU also a
      long reduction over outer dims (a column sum [rows, C] → [C]: a bias's or a norm weight's
      gradient) with up to TREE_OUTPUTS outputs. Measured on the H200 (`python
      benchmarks/reductions.py --only col --entries reduce_serial,reduce_tree`, 2026-12-01):
      [256, 1024] 8.1 µs (a thread per output: 51 µs; 16 outputs a workgroup: 21 µs),
      [2048, 768] 14.8 µs (28-36 µs at the others' best splits into parts): a GPU needs many loads in
      flight more than whole sectors, and its L2 serves the neighbouring columns' reads;
    - reduce_columns, COLUMNS outputs per workgroup, WG / COLUMNS threads each: the same column
      sums on a CPU (lavapipe), where a workgroup is one thread's loop over its threads and the
      contiguous row segments are what count: [2048, 1536] 5.1 ms (a thread per output 16.6,
      a workgroup per output 47; the same run on this project's 2-core machine);
    - reduce_rows, `row_lanes` threads per output: short reductions along the innermost dim on
      a GPU (at most ROW_LANES_MAX elements), read a whole row per group of lanes;
    - reduce_serial, a thread per output: short reductions (the partials of a split product or
      reduction), and column sums over more outputs than TREE_OUTPUTS on a GPU, where
      neighbouring threads read neighbours and the outputs alone fill the units; short ones over
      SERIAL_WIDE_OUTPUTS outputs or more in workgroups of 256 threads on a GPU, else 64.
    """
    if innermost_reduced and r <= ROW_LANES_MAX and not target.cpu:
        return "reduce_rows", ROW_WG
    if r <= 64:
        wide = not target.cpu and not innermost_reduced and outs >= SERIAL_WIDE_OUTPUTS
        return "reduce_serial", 256 if wide else 64
    if innermost_reduced or (not target.cpu and outs <= TREE_OUTPUTS):
        return "reduce_tree", 256 if r >= 256 else 128
    return ("reduce_columns", 256) if target.cpu else ("reduce_serial", 64)


# reduce_serial: a thread computes SHORT_PART_ITEMS items (WG apart, its loads all issued before
# its stores) where each item's part is at most SHORT_PART elements along the leading dims (the
# partials [S, *out] of a split product or reduction, S ≤ 4), else one. A thread per item there
# has one or two loads in flight. Measured on the H200, 2026-12-02: the SmolLM2-135M-shaped
# step's sums, profiled (`python -m meganeura bench smollm2 --no-torch`, one run with every
# reduce_serial at 1 item a thread, one at 4; GPU time 97.0 → 95.8 ms; `python
# benchmarks/reductions.py --only partials --entries reduce_serial:64x4,…` times the forms
# alone): [2, 2048, 576] → [2048, 576] 16.4 → 10.1 µs, [3, 1536, 576] 14.0 → 9.7,
# [2, 2048, 192] 9.0 → 7.5, [4, 2048, 576] 17.0 → 14.1; but longer or strided parts got slower
# with fewer threads (6 × [576, 576] 9.2 → 11.4 µs, 8 × [576, 192] 7.4 → 12.8, dK's group sum
# over axis 2 of [8, 3, 3, 256, 64] 9.2 → 11.1), so they keep one.
SHORT_PART = 4
SHORT_PART_ITEMS = 4


def serial_items(part: int, leading: bool) -> int:
    """The items a reduce_serial thread computes, for parts of `part` elements over the leading dims or not."""
    return SHORT_PART_ITEMS if leading and part <= SHORT_PART else 1


def items_per_workgroup(entry: str, wg: int, items: int = 1, part: int = 1) -> int:
    """The values (outputs or partials) one workgroup of `entry` computes (reduce_serial: `items`
    a thread; reduce_rows: one per `row_lanes(part)` threads)."""
    if entry == "reduce_rows":
        return wg // row_lanes(part)
    return {"reduce_tree": 1, "reduce_columns": COLUMNS}.get(entry, wg * items)


# On a GPU part_value's walk carries TREE_UNROLL accumulators in reduce_tree and SERIAL_UNROLL
# in reduce_serial, each combining every n-th of the thread's elements, combined in a fixed order
# at the end: that many loads in flight a thread where one accumulator waits for each load before
# the next.
# Measured on the H200, 2026-12-03: alone (`python benchmarks/reductions.py --only bn,col`, medians
# of 5, µs, at 1 → 4), the batch-norm statistics of [128, 64, 32, 32] in the 9 parts the planner
# takes 24.7 → 16.6, of [128, 128, 16, 16] in 5 17.4 → 13.8, [128, 256, 8, 8] 12.1 → 8.1; column
# sums [2048, 1536] 26.6 → 25.0, [2048, 768] 15.3 → 15.0, [2048, 576] 12.8 → 13.6. In the steps
# (one profiled step each, one process): ResNet-18 25.97 → 25.11 ms GPU (its batch-norm sums), the
# LMs' within 0.05 ms (SmolLM2 82.99 → 83.02, GPT-2 62.60 → 62.55). The same unroll in
# reduce_columns, 16 to 64 columns a workgroup, ran 1.5-2× slower there than one accumulator.
TREE_UNROLL = 4
# reduce_serial's: the combines of split products' partials, [S, M, N] → [M, N], and of the
# convolutions' split weight gradients. In the steps on the H200, 2026-12-03 (one profiled step,
# one process; 1 → 4, and 8): SmolLM2 82.78 → 81.89 ms GPU (its sums 1.14 ms less: [8, 2048, 576]
# 1.298 → 0.888 ms a step, [4, 2048, 576] at 4 items a thread 1.225 → 0.965); ResNet-18 25.28 →
# 24.66 (its split weight gradients' sums, [128, 64, 576] 0.183 → 0.077); GPT-2 62.58 → 62.58.
# At 8 the 8-part sums gained a little more (0.819) and the 4-part ones lost (1.372): SmolLM2 82.32.
SERIAL_UNROLL = 4


def loop_unroll(entry: str, target: Target) -> int:
    """The accumulators part_value's walk carries in a kernel of `entry` on `target` (`part_loop`)."""
    if target.cpu:
        return 1
    return {"reduce_tree": TREE_UNROLL, "reduce_serial": SERIAL_UNROLL}.get(entry, 1)


def part_loop(unroll: int, init: str) -> str:
    """part_value's loop over r = first + start, + step, … < end with `unroll` accumulators."""
    if unroll == 1:
        return "\n    ".join(
            [
                f"var acc = {init};",
                "for (var r = first + start; r < end; r += step) {",
                "    acc = combine(acc, value_at(o, r));",
                "}",
                "return acc;",
            ]
        )
    lines = [f"var acc_{j} = {init};" for j in range(unroll)]
    lines += [
        "var r = first + start;",
        f"for (; r + {unroll - 1}u * step < end; r += {unroll}u * step) {{",
        *[f"    acc_{j} = combine(acc_{j}, value_at(o, r + {j}u * step));" for j in range(unroll)],
        "}",
        "for (; r < end; r += step) {",
        "    acc_0 = combine(acc_0, value_at(o, r));",
        "}",
    ]
    total = "acc_0"
    for j in range(1, unroll):
        total = f"combine({total}, acc_{j})"
    return "\n    ".join([*lines, f"return {total};"])


def serial_body(items: int, init: str) -> str:
    """reduce_serial's body: `items` items per thread, WG apart, every value (from `init`, the
    identity of ⊕) computed before any store."""
    lines = [f"let first = (wid.x + wid.y * GRID_X) * WG * {items}u + lid;"]
    for j in range(items):
        lines += [
            f"let item_{j} = first + {j}u * WG;",
            f"var value_{j} = {init};",
            f"if (item_{j} < ITEMS) {{ value_{j} = part_value(item_{j}, 0u, 1u); }}",
        ]
    lines += [f"if (item_{j} < ITEMS) {{ out[item_{j}] = finish(item_{j}, value_{j}); }}" for j in range(items)]
    return "\n    ".join(lines)


# A split aims at SPLIT_WAVES workgroups per compute unit: a unit (an SM) holds several
# workgroups at once, and a memory-bound reduction needs many loads in flight to hide latency.
# A guess to tune with benchmarks/reductions.py (it times several split sizes on the target).
SPLIT_WAVES = 4
# The shortest part of a split, by the entry point that computes the partials: reduce_tree's
# 1024 are a few elements per thread, reduce_columns' 256 are 16 loads for each of an output's 16
# threads, reduce_serial's 64 a thread's loop; shorter parts spend more on writing and combining
# partials than they save.
MIN_PART = {"reduce_tree": 1024, "reduce_columns": 256, "reduce_serial": 64, "reduce_rows": 64}


def reduce_geometry(in_shape: tuple[int, ...], axes) -> tuple[int, int, bool, bool]:
    """(outputs, reduction length, whether the innermost dim is reduced, whether the reduced
    dims are the leading ones) of a reduction of `in_shape` over `axes`."""
    axes = normalize_axes(axes, len(in_shape))
    outs = math.prod(in_shape[d] for d in range(len(in_shape)) if d not in axes)
    innermost = bool(in_shape) and len(in_shape) - 1 in axes
    return outs, math.prod(in_shape[d] for d in axes), innermost, set(axes) == set(range(len(axes)))


def plan_workgroups(
    items: int, part: int, innermost_reduced: bool, target: Target = GENERIC, leading: bool = False, lanes: int = 1
) -> int:
    """The workgroups of a reduction computing `items` values (outputs, or partials), each over
    `part` elements (along the leading dims or not), `lanes` neighbouring values a kernel item (4
    where `reduces_vec4s`): one item per workgroup (reduce_tree), per COLUMNS items
    (reduce_columns), per WG / `row_lanes` items (reduce_rows) or per WG · `serial_items` items
    (reduce_serial)."""
    entry, wg = reduce_plan(items, part, innermost_reduced, target)
    each = 1 if lanes > 1 else serial_items(part, leading)  # a vec4 item is four already
    return -(-(items // lanes) // items_per_workgroup(entry, wg, each, part))


# reduce_serial on a GPU computes four neighbouring outputs a thread (one item a thread), from
# 16-byte loads, where the reduction keeps the innermost dim, that dim is a multiple of 4 long and
# it writes SERIAL_WIDE_OUTPUTS values or more (`reduces_vec4s`): the partials of split products,
# [S, …, N] → […, N], and dK's and dV's group sums. Measured on the H200, 2026-12-04 (`benchmarks/
# plan_ab.py --workloads smollm2,gpt2,resnet18`, one profiled step, ms a step, scalar → vec4 at 4
# items a thread → vec4 at 1): SmolLM2's [4, 2048, 576] 0.930 → 0.874 → 0.769, [3, 1536, 576]
# 0.589 → 0.583 → 0.484, [4, 2048, 192] 0.431 → 0.473 → 0.377, the same with the residual add
# 0.427 → 0.389 → 0.324; [8, 2048, 576] 0.884 → 0.840, with the add 0.518 → 0.454, [6, 576, 576]
# 0.452 → 0.403, dK/dV's group sums 0.480 → 0.433 (1 item a thread each way); GPT-2's [3, 2048,
# 768] 0.513 → 0.406 → 0.366. Fewer outputs lost: the 32 partials of GPT-2's LayerNorm weight
# gradients ([8, 256, 768] in 32 parts, 24,576 values, 6,144 threads as vec4s) 0.343 → 0.770.
SERIAL_VEC4 = True


# reduce_rows reads its rows as vec4s where the reduction is over the innermost dim alone and that
# dim is a multiple of 4 long (`rows_vec4s`): attention's rows' D = Σ dO∘O over head_dim, a lane
# reading one vec4 of each input where it read four floats 16 apart.
ROWS_VEC4 = True


def rows_vec4s(in_shape: tuple[int, ...], axes, splits: int, target: Target) -> bool:
    """Whether a reduction of `in_shape` over `axes` in `splits` parts walks its rows as vec4s on
    `target` (ROWS_VEC4): reduce_rows, over the innermost dim alone, a multiple of 4 long, unsplit."""
    if not ROWS_VEC4 or target.cpu or not in_shape or in_shape[-1] % 4 or splits != 1:
        return False
    if normalize_axes(axes, len(in_shape)) != (len(in_shape) - 1,):
        return False
    outs, r, innermost, _ = reduce_geometry(in_shape, axes)
    return reduce_plan(outs, r, innermost, target)[0] == "reduce_rows"


def reduces_vec4s(in_shape: tuple[int, ...], axes, splits: int, target: Target) -> bool:
    """Whether a reduction of `in_shape` over `axes` in `splits` parts runs its items as vec4s of
    four neighbouring outputs on `target` (SERIAL_VEC4): reduce_serial on a GPU, the innermost
    dim kept and a multiple of 4 long, SERIAL_WIDE_OUTPUTS values or more."""
    if not SERIAL_VEC4 or target.cpu or not in_shape or in_shape[-1] % 4:
        return False
    outs, r, innermost, _ = reduce_geometry(in_shape, axes)
    if innermost or outs * splits < SERIAL_WIDE_OUTPUTS:
        return False
    return reduce_plan(outs * splits, split_length(r, splits), innermost, target)[0] == "reduce_serial"


def reduce_splits(in_shape: tuple[int, ...], axes, target: Target) -> int:
    """How many parts to split a reduction of `in_shape` over `axes` into on `target` (1: none).

    A reduction that leaves units of the target idle is split into as many parts as give
    SPLIT_WAVES workgroups per unit, each part at least MIN_PART of its entry point long, and
    no part empty. One that fills them but walks down columns a workgroup an output (`column_walk`)
    is split into parts of at most SERIAL_PART, which reduce_serial computes a thread a partial,
    neighbouring threads reading neighbouring columns. Whether the split is used is the cost
    model's call (it pays an extra dispatch and the partials' traffic for the units it fills, or
    for the sectors it stops wasting: `reduce_read_scale`)."""
    outs, r, innermost, leading = reduce_geometry(in_shape, axes)
    if outs == 0 or r == 0:
        return 1
    if plan_workgroups(outs, r, innermost, target, leading) >= target.compute_units:
        if not column_walk(in_shape, axes, 1, target):
            return 1
        return nonempty_splits(r, split_length(r, SERIAL_PART))
    wanted = SPLIT_WAVES * target.compute_units
    splits = 1
    while splits < r:  # the entry point of the partials depends on their count: settle it
        part = split_length(r, splits)
        entry, wg = reduce_plan(outs * splits, part, innermost, target)
        per_item = items_per_workgroup(entry, wg, serial_items(part, leading), part)
        shortest = MIN_PART[entry]
        proposal = min(-(-wanted * per_item // outs), max(1, r // shortest))
        proposal = nonempty_splits(r, proposal)
        if proposal <= splits:
            break
        splits = proposal
    return splits if splits > 1 else 1


# A GPU loads memory in sectors of SECTOR_BYTES: a warp's load of 32 floats a column apart
# fetches 32 sectors for 128 bytes. reduce_tree walking down columns (a reduction over outer dims,
# the innermost dim kept: a bias's or a norm weight's gradient [rows, C] → [C]) reads that way.
SECTOR_BYTES = 32
# The longest part a column walk's split gives each partial (reduce_serial's parts, `reduce_plan`).
# Measured on the H200, 2026-12-03 (`python benchmarks/reductions.py --only col`, µs, the tree
# walk with 4 accumulators): [2048, 3072] → [3072] one level 44.7, in 32 parts of 64 15.9 (8 parts:
# 23.3, 64: 17.5); [2048, 1536] 25.0 and 15.5; [2048, 768] 15.0 and 15.3; [2048, 576] 13.6 and 15.1.
# In the steps (one profiled step each, one process, 2026-12-03): GPT-2-small 62.52 → 62.08 ms GPU,
# 59.64 → 58.97 as one pass (its bias and LayerNorm weight gradients: [2048, 3072] 0.561 → 0.267 ms
# a step with the partials' sum, [2048, 768] 0.755 → 0.574 + 0.503 for 74 of them); SmolLM2
# 81.41 → 81.42, 73.36 → 72.95 as one pass (its RMSNorm weights', 1.370 → 0.926 + 0.415).
SERIAL_PART = 64
# Only a walk of at least LONG_COLUMN elements counts as one: alone, [256, 1024] → [1024] took
# 8.2 µs one level and 14.3 in 4 parts of 64 (the L2 cache serves a short column's neighbours).
LONG_COLUMN = 1024


def reduced_stride(in_shape: tuple[int, ...], axes) -> int:
    """The elements between neighbouring elements of a reduction of `in_shape` over `axes` (1
    where the innermost dim, or every dim after the last reduced one, is of size 1 or reduced)."""
    last = max(normalize_axes(axes, len(in_shape)), default=len(in_shape) - 1)
    return math.prod(in_shape[last + 1 :])


def column_walk(in_shape: tuple[int, ...], axes, splits: int, target: Target) -> bool:
    """Whether a reduction of `in_shape` over `axes` in `splits` parts runs reduce_tree down
    columns on `target`, each part at least LONG_COLUMN long."""
    outs, r, innermost, _ = reduce_geometry(in_shape, axes)
    part = split_length(r, splits)
    entry, _ = reduce_plan(outs * splits, part, innermost, target)
    return entry == "reduce_tree" and part >= LONG_COLUMN and reduced_stride(in_shape, axes) > 1


def reduce_read_scale(attrs: dict, operands, results, target: Target = GENERIC) -> int:
    """The factor on a reduction's reads for the cost model: SECTOR_BYTES / 4 for a column walk
    (`column_walk`; its stride, in elements, where that is shorter), else 1."""
    in_shape = tuple(attrs["in_shape"] if "in_shape" in attrs else operands[0].shape)
    axes, splits = attrs.get("axes"), attrs.get("splits", 1)
    if not in_shape or not column_walk(in_shape, axes, splits, target):
        return 1
    return min(SECTOR_BYTES // 4, reduced_stride(in_shape, axes))


def reduce_workgroups(attrs: dict, operands, results, target: Target = GENERIC) -> int:
    """A workgroup per output or partial (reduce_tree) or per WG of them (reduce_serial), as
    `reduce_plan` says."""
    # fused_reduce carries its input shape (a scalar's is (), so test presence, not truth)
    in_shape = tuple(attrs["in_shape"] if "in_shape" in attrs else operands[0].shape)
    outs, r, innermost, leading = reduce_geometry(in_shape, attrs.get("axes"))
    splits = attrs.get("splits", 1)
    lanes = 4 if reduces_vec4s(in_shape, attrs.get("axes"), splits, target) else 1
    part = split_length(r, splits) // (4 if rows_vec4s(in_shape, attrs.get("axes"), splits, target) else 1)
    return plan_workgroups(outs * splits, part, innermost, target, leading, lanes)


@lowering("sum", "max", "fused_reduce", workgroups=reduce_workgroups, per_target=True, read_scale=reduce_read_scale)
def lower_reduce(graph: Graph, node: Node, target: Target = GENERIC) -> KernelSpec:
    """`sum`, `max` or `fused_reduce` over any axes: kept dims index the output, reduced dims are
    combined. `fused_reduce` reduces prologue($0, $1, … broadcast to in_shape) and writes
    epilogue($r, and the extras it reads broadcast to the output)."""
    if node.op == "fused_reduce":
        kind, in_shape = node.attr("kind"), tuple(node.attr("in_shape"))
        prologue_text, epilogue_text = node.attr("prologue", "$0"), node.attr("epilogue", "$r")
    else:
        kind, in_shape = node.op, graph[node.inputs[0]].shape
        prologue_text, epilogue_text = "$0", "$r"
    prologue, epilogue = parse_expr(prologue_text), parse_expr(epilogue_text)
    axes = normalize_axes(node.attr("axes"), len(in_shape))
    kept = [d for d in range(len(in_shape)) if d not in axes]
    kept_sizes, reduced_sizes = tuple(in_shape[d] for d in kept), tuple(in_shape[d] for d in axes)
    outs, r, innermost, leading = reduce_geometry(in_shape, axes)
    operands = Operands(graph)

    def read(name: str) -> str:
        source = node.inputs[int(name)]
        strides = broadcast_strides(graph[source].shape, in_shape)
        base = index_expr("o", kept_sizes, tuple(strides[d] for d in kept))
        offset = index_expr("r", reduced_sizes, tuple(strides[d] for d in axes))
        return operands.read_at(source, sum_terms(base, offset))

    def read_out(name: str) -> str:
        if name == "r":
            return "value"
        source = node.inputs[int(name)]  # an epilogue's extra, broadcast to the output (no split: o is the output's)
        return operands.read_at(source, index_expr("o", node.shape, broadcast_strides(graph[source].shape, node.shape)))

    splits = node.attr("splits", 1) if node.op == "fused_reduce" else 1
    vec4 = reduces_vec4s(in_shape, axes, splits, target)
    rows4 = rows_vec4s(in_shape, axes, splits, target)
    vec4_names: set[str] = set()
    if vec4:
        items = ItemReads(graph, node, operands, in_shape, axes, prologue, epilogue)
        reads, value = items.vector(prologue, items.read)
        finish_reads, finish = items.vector(epilogue, items.read_out)
        vec4_names = items.vector_names() | {"out"}
    elif rows4:
        rows = RowReads(graph, node, operands, in_shape, prologue)
        reads, value = rows.combined(prologue, "combine({a}, {b})")  # the template's ⊕
        finish_reads, finish = expression_code(epilogue, read_out)
        vec4_names = rows.vector_names()
        r //= 4  # r counts vec4s of the row
    else:
        reads, value = expression_code(prologue, read)
        finish_reads, finish = expression_code(epilogue, read_out)
    part = split_length(r, splits)
    entry, wg = reduce_plan(outs * splits, part, innermost, target)
    items = serial_items(part, leading) if entry == "reduce_serial" and not vec4 else 1
    lanes = 4 if vec4 else 1
    grid = grid_for(plan_workgroups(outs * splits, part, innermost, target, leading, lanes))
    bindings = operands.bindings + [output_binding(node)]
    item_type = "vec4<f32>" if vec4 else "f32"
    wgsl = render(
        "reduce",
        {
            "BINDINGS": bindings_wgsl(graph, bindings, vec4_names),
            "ITEM_TYPE": item_type,
            "OUTS": outs // lanes,
            "R": r,
            "SPLITS": splits,
            "PART": part,
            "WG": wg,
            "COLUMNS": items_per_workgroup(entry, wg, part=part) if entry == "reduce_rows" else COLUMNS,
            "SERIAL_BODY": serial_body(items, f"{item_type}({REDUCE_INIT[kind]})"),
            "PART_LOOP": part_loop(loop_unroll(entry, target), f"{item_type}({REDUCE_INIT[kind]})"),
            "GRID_X": max(grid[0], 1),
            "FUNCTIONS": combine_functions(kind, item_type, [prologue, epilogue]),
            "READS": reads,
            "PROLOGUE": value,
            "INIT": f"{item_type}({REDUCE_INIT[kind]})",
            "COMBINE": REDUCE_COMBINE[kind, item_type],
            "EPILOGUE_READS": finish_reads,
            "EPILOGUE": finish,
        },
    )
    keep = ", keepdim" if node.attr("keepdim", False) else ""
    split = f" in {splits} parts" if splits > 1 else ""
    each = f", {items} items a thread" if items > 1 else ""
    each += ", vec4" if vec4 else ", vec4 rows" if rows4 else ""
    label = f"{kind} {shape_text(in_shape)} axes={axes}{keep}{split} ({entry}{each})"
    if node.op == "fused_reduce":
        label = f"fused_reduce {label} of {prologue_text} then {epilogue_text}"
    return KernelSpec(node.id, label, wgsl, entry, tuple(bindings), grid, (wg, 1, 1))
