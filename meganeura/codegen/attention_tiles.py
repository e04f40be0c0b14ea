"""The tiling of the flash-style attention kernels for GPUs (shaders/attention.wgsl): which tile
configuration each kernel takes per head_dim on a target (`tiles_for`), the per-thread register
tiles that configuration implies (`Layout`), and the unrolled per-thread WGSL that the template
leaves as placeholders (`tile_code`). codegen/transformer.py lowers the ops with it and registers
the workgroup counts from the same `tiles_for` and target, so the cost model counts what is
dispatched.

A configuration is taken only where its workgroup arrays (`workgroup_bytes`) fit the target's
`workgroup_memory` (meganeura/target.py): the measured one of the target's tuning family, else the
generic family's, else the first of `CANDIDATES` that fits.

A configuration is (BR query rows, BC key rows, THREADS, prefetch). Every kernel has two register tiles per
thread, both of named accumulators (a WGSL GEMM probe on the H200: dynamically indexed private
arrays spill there):
- a score tile: SR × SC scores of the workgroup's [BR, BC] tile (dK/dV: its transpose [BC, BR]),
  spread over the tile (a thread's rows are BR / SR apart, its columns BC / SC apart) so that the
  threads of a warp read different padded rows of workgroup memory (different banks) or the same
  one (a broadcast); the backward kernels keep two sums per score (q·k and do·v);
- an output tile: OR rows × OV vec4 columns of the [BR, D] output (dK/dV: [BC, D], twice), spread
  the same way, so that neighbouring threads read and write neighbouring vec4s.
Every tile staged in workgroup memory goes through registers (`TileRows`); with the
configuration's `prefetch`, the tiles a kernel streams (the forward's and dQ's K and V, dK/dV's
Q and dO) load a tile ahead, while the current one is computed (`TileRows.streamed`). The forward folds
each score row with THREADS / BR threads where that is two or more (`row_lanes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meganeura.target import Target

KINDS = ("attention", "attention_grad_q", "attention_grad_kv")

MAX_SCORES = 16  # per thread and score tile: beyond it, registers run out with the output tile
MAX_OUTPUT_VEC4 = 16  # per thread, all output tiles together


@dataclass(frozen=True)
class Tiles:
    br: int  # query rows per tile
    bc: int  # key rows per tile
    threads: int
    # The next tile's rows load into registers while the current one is computed (the forward
    # and dQ: K and V; dK/dV: Q, dO and O), instead of after the barrier that frees the arrays.
    prefetch: bool = False

    def __str__(self) -> str:
        return f"{self.br}x{self.bc}/{self.threads}{'p' if self.prefetch else ''}"


# The configuration of each kernel per (tuning family, kind, head_dim), timed on the H200 at head_dim
# 64, the SmolLM2 and GPT-2 shapes (`PYTHONPATH=. python benchmarks/attention.py --shapes
# smollm2,gpt2 --repeat 10`, 2026-12-01, batch 8, seq 256, causal, 9/3 and 12/12 heads; ms per
# dispatch; SmolLM2's figure first).
# generic: the fastest of those that fit 32 KiB (lavapipe's limit, so that they run in the tests
# here): forward 16x32/128 prefetched 0.108, 0.134 (32x16/128 0.126, 0.152), dQ 16x16/256 0.167
# (16x8/128 0.179), dK+dV 16x32/256 0.247 (16x16/256 0.291): 0.52 ms a SmolLM2 layer, against 4.7
# for the row-per-workgroup kernels before and PyTorch's fp32 SDPA forward + backward at
# 1.02-1.48 ms in the same runs.
# hopper (workgroups head-major then): the fastest in the H200's 48 KiB: the forward 64x32/256
# prefetched (0.100, 0.127; the best for GPT-2 alone, 32x32/128p, 0.157 for SmolLM2), dQ
# 32x32/128 (0.130 in two runs; 32x32/256 0.134), dK+dV 32x32/128 prefetched (0.176, 0.184 in
# two runs; without 0.179, 0.193; 32x32/256 0.199-0.27; per query head, as the SmolLM2 step
# splits it, `--per-query-head`: 0.177 against 0.187): 0.41 ms a SmolLM2 layer. (For SmolLM2's
# grouped heads, the sweeps without `--per-query-head` timed the per-head kernel too: the
# benchmark's plan split it, until 2026-12-02. The grouped kernel itself, writing dS: 0.258 ms,
# attention_heads.py.) The backward tiles need 39296 and 43520 bytes, so an adapter of the family
# that offers less takes the generic ones.
# dK/dV writing dS (passes/attention_scores.py, what both LM steps run on the H200 since
# 2026-12-02; `--scores`, three alternated runs, per query head): 32x32/128p 0.194, 32x32/256p
# 0.190, against 0.169 and 0.182 without dS; GPT-2's 0.246-0.260 and 0.242-0.257. 128p was kept
# then (2% where dS is written, 7% the other way where it is not); on 2026-12-02 (a later run,
# dS written) 256p took 0.1698 ms against 0.1725 (GPT-2 0.2163 against 0.2157), and in the
# SmolLM2 step 5.59 ms against 5.75 (one profiled step's GPU time 90.86 against 91.10 ms, the
# bench's step in one process as benchmarks/plan_ab.py runs it), so 256p is chosen: both LM steps
# write dS on the H200.
# Since the kernels number their workgroups tile-major (shaders/attention.wgsl `tile_rank`,
# 2026-12-02: SmolLM2 dK/dV 5.59 → 4.84 ms a step, forward 3.04 → 2.25 at 32x32/256p; GPT-2
# 2.84 → 2.50 and 1.46 → 1.22), the forward's fastest tiles are others: in the steps
# (`benchmarks/plan_ab.py --workloads smollm2` and `gpt2`, one profiled step's 30 and 12 layers)
# 32x32/128p 2.135 and 1.150 ms, 32x32/256p 2.252 and 1.224, 64x32/256p 2.440 and 1.288,
# 16x32/128p 2.620 and 1.329, 64x16/256p 2.956 and 1.513; dK/dV keeps 32x32/256p (4.84 ms, 128p
# 5.14, 16x32/128p 6.55).
# Two kernel changes before these figures: the backward kernels read Dᵢ = dOᵢ·Oᵢ while staging
# dO (a thread per row read its row alone, a cache line per thread and load: dQ 0.185, dK+dV
# 0.376 ms at 32x32/256 before), and the forward folds each score row with several threads
# (ROW_LANES).
# Since 2026-12-04 the kernels move q, k, v, dO and their outputs (not lse, D or dS) as vec4 where
# head_dim is a multiple of 4 (`vec4_bindings`; before, four scalar accesses a vec4), and dK/dV
# loads each query tile's lse and D a tile ahead (shaders/attention.wgsl `query_rows`, a barrier
# and a load wait fewer a step). In the steps (`benchmarks/plan_ab.py --workloads smollm2,gpt2`,
# one profiled step, each variant beside the others; ms a step): SmolLM2's forward 2.12 → 2.02,
# dK/dV 4.22 → 4.11 (vec4 alone 4.40, the rows ahead alone 4.22), its attention kernels with dQ's
# product, the group sums and the rows' D 8.06 → 7.84 (10.2% → 9.9% of the profiled step, in two
# runs each); GPT-2's 3.92 → 3.92 (forward 1.14 → 1.11, dK/dV 2.19 → 2.23). The tiles below,
# swept again with both (same runs): SmolLM2's forward 32x32/128p 2.03 (32x32/256p 2.18,
# 64x32/256p 2.42, 32x64/256p 2.75), dK/dV 32x32/256p 4.11 (128p 4.24, 16x32/256p 4.93); GPT-2's
# dK/dV 32x32/128p 2.19 against 2.25 (kept at 256p, SmolLM2's choice).
CHOSEN: dict[tuple[str, str, int], Tiles] = {
    ("generic", "attention", 64): Tiles(16, 32, 128, prefetch=True),
    ("generic", "attention_grad_q", 64): Tiles(16, 16, 256),
    ("generic", "attention_grad_kv", 64): Tiles(16, 32, 256),
    ("hopper", "attention", 64): Tiles(32, 32, 128, prefetch=True),
    ("hopper", "attention_grad_q", 64): Tiles(32, 32, 128),
    ("hopper", "attention_grad_kv", 64): Tiles(32, 32, 256, prefetch=True),
}

# Tried in order where no chosen configuration fits: the first that fits the target and divides
# (larger tiles first, then more threads; small head_dims need fewer threads for their output tile).
CANDIDATES = tuple(
    Tiles(br, bc, threads)
    for br, bc in ((32, 32), (32, 16), (16, 32), (16, 16), (16, 8), (8, 16), (8, 8), (8, 4), (4, 8), (4, 4))
    for threads in (128, 64, 32, 16)
)


def vec4s(d: int) -> int:
    """Vec4s per staged row of head_dim d."""
    return -(-d // 4)


def workgroup_bytes(kind: str, tiles: Tiles, d: int, dropout: bool = False) -> int:
    """The workgroup memory of `kind`'s kernel with `tiles` (shaders/attention.wgsl's arrays;
    dropout's mask adds a byte of bits per eight scores, each in a u32: BR·BC/2 bytes)."""
    row = 16 * (vec4s(d) + 1)  # a staged row of D floats, one vec4 of padding
    br, bc = tiles.br, tiles.bc
    mask = 4 * br * (bc // 8) if dropout else 0  # tile_keep: BR · BC/8 u32s
    if kind == "attention":
        lanes = 2 * 4 * tiles.threads if row_lanes(tiles) else 0  # lane_max, lane_sum
        return (br + bc) * row + 4 * br * (bc + 1) + 3 * 4 * br + lanes + mask
    if kind == "attention_grad_q":
        return 2 * (br + bc) * row + 4 * br * (bc + 1) + 2 * 4 * br + mask
    if kind == "attention_grad_kv":
        return 2 * (br + bc) * row + 2 * 4 * bc * (br + 1) + 2 * 4 * br + mask
    raise ValueError(f"no attention kernel {kind!r}; expected one of {KINDS}")


def row_lanes(tiles: Tiles) -> bool:
    """Whether the forward folds each score row with THREADS / BR threads (a whole number, at
    least two), else with a thread per row."""
    return tiles.threads % tiles.br == 0 and tiles.threads >= 2 * tiles.br


def split(per_thread: int, rows: int, cols: int) -> tuple[int, int] | None:
    """(a, b) with a·b = per_thread, a dividing rows and b dividing cols, the most square; None if none."""
    options = [(a, per_thread // a) for a in range(1, per_thread + 1) if per_thread % a == 0]
    options = [(a, b) for a, b in options if rows % a == 0 and cols % b == 0]
    return min(options, key=lambda ab: (abs(ab[0] - ab[1]), -ab[1]), default=None)


@dataclass(frozen=True)
class Layout:
    """The register tiles of one kernel: score tile [rows, cols] split SR × SC per thread, output
    tile [out_rows, DV vec4s] split OR × OV per thread."""

    kind: str
    tiles: Tiles
    d: int
    sr: int
    sc: int
    orows: int
    ov: int

    @property
    def score_rows(self) -> int:
        return self.tiles.bc if self.kind == "attention_grad_kv" else self.tiles.br

    @property
    def score_cols(self) -> int:
        return self.tiles.br if self.kind == "attention_grad_kv" else self.tiles.bc

    @property
    def out_rows(self) -> int:
        return self.score_rows


def layout_of(kind: str, tiles: Tiles, d: int, workgroup_memory: int) -> Layout | str:
    """The register tiles of `kind` with `tiles` at head_dim d within `workgroup_memory` bytes, or
    why there are none. The register limits are read at call time (benchmarks/attention.py raises
    them to sweep wider configurations)."""
    t = tiles.threads
    rows, cols = (tiles.bc, tiles.br) if kind == "attention_grad_kv" else (tiles.br, tiles.bc)
    if (rows * cols) % t or rows * cols < t:
        return f"the {rows}x{cols} score tile does not split over {t} threads"
    scores = split(rows * cols // t, rows, cols)
    if scores is None or scores[0] * scores[1] > MAX_SCORES:
        return f"the {rows}x{cols} score tile gives more than {MAX_SCORES} scores per thread, or no split"
    dv = vec4s(d)
    if (rows * dv) % t or rows * dv < t:
        return f"the {rows}x{dv} vec4 output tile does not split over {t} threads"
    outputs = split(rows * dv // t, rows, dv)
    copies = 2 if kind == "attention_grad_kv" else 1  # dK and dV
    if outputs is None or copies * outputs[0] * outputs[1] > MAX_OUTPUT_VEC4:
        return f"the {rows}x{dv} vec4 output tile gives too many accumulators per thread, or no split"
    used = workgroup_bytes(kind, tiles, d)
    if used > workgroup_memory:
        return f"needs {used} bytes of workgroup memory, over the {workgroup_memory} allowed"
    return Layout(kind, tiles, d, scores[0], scores[1], outputs[0], outputs[1])


def fits(kind: str, tiles: Tiles, d: int, target: Target) -> bool:
    return isinstance(layout_of(kind, tiles, d, target.workgroup_memory), Layout)


def chosen_tiles(kind: str, d: int, target: Target) -> Tiles | None:
    """The measured configuration of `kind` at head_dim d for the target's tuning family, else the
    generic family's, that fits the target; None where none does."""
    for family in dict.fromkeys((target.tuning, "generic")):
        tiles = CHOSEN.get((family, kind, d))
        if tiles is not None and fits(kind, tiles, d, target):
            return tiles
    return None


def tiles_for(kind: str, d: int, target: Target) -> Tiles:
    """The tile configuration of `kind`'s kernel at head_dim d on `target`: the chosen one that
    fits, else the first candidate that fits (types and the target alone decide it, so the
    workgroup count can be asked before lowering)."""
    chosen = chosen_tiles(kind, d, target)
    if chosen is not None:
        return chosen
    for tiles in CANDIDATES:
        if fits(kind, tiles, d, target):
            return tiles
    raise NotImplementedError(
        f"{kind}: no tile configuration fits head_dim {d} in {target.name}'s {target.workgroup_memory} bytes "
        "of workgroup memory"
    )


def layout_for(kind: str, tiles: Tiles, d: int, target: Target) -> Layout:
    """The register tiles of `kind` with `tiles` at head_dim d on `target`; ValueError with the
    reason where the configuration does not fit (a tiling forced by a benchmark or a test)."""
    layout = layout_of(kind, tiles, d, target.workgroup_memory)
    if isinstance(layout, str):
        raise ValueError(f"{kind}: tiles {tiles} at head_dim {d} on {target.name}: {layout}")
    return layout


# ---------------------------------------------------------------------------------------------
# The unrolled per-thread code


def vec4_helpers(reads: tuple[str, ...], writes: tuple[str, ...], d: int) -> str:
    """load4_<name>(row start, vec4 index) and store4_<name>(…, value) for the bindings: one vec4
    access where d is a multiple of 4 (the bindings are then arrays of vec4, `vec4_bindings`, and a
    row starts on a vec4), else four guarded scalars (arrays of f32)."""
    lines = []
    for name in reads:
        if d % 4 == 0:
            body = [f"    return {name}[at / 4u + c];"]
        else:
            values = [f"select(0.0, {name}[i + min({k}u, D - 1u - 4u * c)], 4u * c + {k}u < D)" for k in range(4)]
            body = ["    let i = at + 4u * c;", f"    return vec4<f32>({', '.join(values)});"]
        lines += [f"fn load4_{name}(at: u32, c: u32) -> vec4<f32> {{", *body, "}"]
    for name in writes:
        if d % 4 == 0:
            body = [f"    {name}[at / 4u + c] = x;"]
        else:
            body = ["    let i = at + 4u * c;"]
            body += [f"    if (4u * c + {k}u < D) {{ {name}[i + {k}u] = x.{part}; }}" for k, part in enumerate("xyzw")]
        lines += [f"fn store4_{name}(at: u32, c: u32, x: vec4<f32>) {{", *body, "}"]
    return "\n".join(lines)


def vec4_bindings(rows: tuple[str, ...], d: int) -> set[str]:
    """The bindings of `rows` (those the kernel moves a row of head_dim d at a time, through
    `vec4_helpers`) that are arrays of vec4: all where d is a multiple of 4, else none. Measured on
    the H200 against four scalar accesses: the comment at CHOSEN."""
    return set(rows) if d % 4 == 0 else set()


@dataclass(frozen=True)
class TileRows:
    """How a kernel stages a tile: `rows` rows of each of `sources` (bindings, row-major [·, D])
    loaded into registers, then stored into `arrays` (the workgroup arrays, one per source);
    consecutive threads take consecutive vec4s, each thread the same elements every tile, zeros
    past the rows' limit. Between the load and the store the registers hold the tile, so a kernel
    can load the next tile while the current one is computed (`TileRows.streamed`), or stage a tile
    at once (`staged`)."""

    sources: tuple[str, ...]
    arrays: tuple[str, ...]
    rows: int
    threads: int

    def per_thread(self, d: int) -> int:
        """The vec4s of each source a thread loads and stores."""
        return -(-self.rows * vec4s(d) // self.threads)

    def declare(self, d: int) -> list[str]:
        return [f"var pf_{name}_{i}: vec4<f32>;" for i in range(self.per_thread(d)) for name in self.sources]

    def guard(self, d: int) -> str:
        """The condition that element e is one of the tile's (true where the elements divide)."""
        return "" if (self.rows * vec4s(d)) % self.threads == 0 else f"e < {self.rows}u * DV"

    def load(self, d: int, row0: str, base: str, limit: str) -> list[str]:
        """Load the rows row0 … of the tile whose row 0 is at element `base`, zeros past `limit`."""
        lines = []
        for i in range(self.per_thread(d)):
            inside = " && ".join(filter(None, (self.guard(d), f"{row0} + e / DV < {limit}")))
            lines += ["{", f"    let e = lid + {i * self.threads}u;"]
            lines += [f"    pf_{name}_{i} = vec4<f32>(0.0);" for name in self.sources]
            lines += [f"    if ({inside}) {{", f"        let at = {base} + ({row0} + e / DV) * D;"]
            lines += [f"        pf_{name}_{i} = load4_{name}(at, e % DV);" for name in self.sources]
            lines += ["    }", "}"]
        return lines

    def staged(self, d: int, row0: str, base: str, limit: str) -> str:
        """Load and store at once (a tile staged once, not prefetched), in a block of its own."""
        return indent(["{", *self.declare(d), *self.load(d, row0, base, limit), *self.store(d), "}"])

    def streamed(
        self,
        d: int,
        limit: str,
        first: tuple[str, str],
        current: tuple[str, str],
        following: tuple[str, str],
        ahead: bool,
    ) -> tuple[list[str], list[str], list[str]]:
        """The code of a kernel's loop over these tiles, each tile given as (its first row, the
        element of its head's row 0): the declarations before the loop, the store after the
        barrier that frees the arrays, and the loads of the following tile where there is one.
        `ahead` (Tiles.prefetch): the first tile loads with the declarations, each following one
        while the current one is computed; else each tile loads where it is stored."""
        if ahead:
            return self.declare(d) + self.load(d, *first, limit), self.store(d), self.load(d, *following, limit)
        return self.declare(d), self.load(d, *current, limit) + self.store(d), []

    def store(self, d: int) -> list[str]:
        """Store the registers into the arrays, after the barrier that frees them."""
        lines = []
        for i in range(self.per_thread(d)):
            body = [
                f"{array}[(e / DV) * DS + e % DV] = pf_{name}_{i};"
                for name, array in zip(self.sources, self.arrays, strict=True)
            ]
            guard = self.guard(d)
            lines += ["{", f"    let e = lid + {i * self.threads}u;"]
            lines += (
                [f"    if ({guard}) {{", *("        " + line for line in body), "    }"]
                if guard
                else ["    " + line for line in body]
            )
            lines.append("}")
        return lines


def indent(lines: list[str], depth: int = 1) -> str:
    pad = "    " * depth
    return ("\n" + pad).join(lines)


def score_tile(layout: Layout, products: tuple[tuple[str, str, str], ...], epilogue: list[str]) -> str:
    """The score tile: per product (name, row array, column array) SR × SC dot products over D of a
    row-array row and a column-array row, then `epilogue` per score with `ri`, `cj` (its row and
    column in the tile) and `{name}` (each product's sum) substituted."""
    cols_threads = layout.score_cols // layout.sc
    row_step = layout.score_rows // layout.sr
    cells = [(a, b) for a in range(layout.sr) for b in range(layout.sc)]
    lines = [
        "{",
        f"    let sx = lid % {cols_threads}u;",
        f"    let sy = lid / {cols_threads}u;",
    ]  # column threads vary fastest
    for name, _, _ in products:
        lines += [f"    var {name}_{a}_{b} = 0.0;" for a, b in cells]
    lines.append("    for (var d = 0u; d < DV; d++) {")
    for name, row_array, col_array in products:
        lines += [f"        let {name}_r{a} = {row_array}[(sy + {a * row_step}u) * DS + d];" for a in range(layout.sr)]
        lines += [
            f"        let {name}_c{b} = {col_array}[(sx + {b * cols_threads}u) * DS + d];" for b in range(layout.sc)
        ]
        lines += [f"        {name}_{a}_{b} += dot({name}_r{a}, {name}_c{b});" for a, b in cells]
    lines.append("    }")
    for a, b in cells:
        lines.append("    {")
        lines.append(f"        let ri = sy + {a * row_step}u;")
        lines.append(f"        let cj = sx + {b * cols_threads}u;")
        for line in epilogue:
            text = line
            for name, _, _ in products:
                text = text.replace("{" + name + "}", f"{name}_{a}_{b}")
            lines.append(f"        {text}")
        lines.append("    }")
    lines.append("}")
    return indent(lines, 2)  # inside the kernels' tile loops


def output_cells(layout: Layout) -> tuple[int, int, list[tuple[int, int]]]:
    cols_threads = vec4s(layout.d) // layout.ov
    row_step = layout.out_rows // layout.orows
    return cols_threads, row_step, [(a, b) for a in range(layout.orows) for b in range(layout.ov)]


def output_declare(layout: Layout, names: tuple[str, ...]) -> str:
    _, _, cells = output_cells(layout)
    return indent([f"var {name}_{a}_{b} = vec4<f32>(0.0);" for name in names for a, b in cells])


def output_update(layout: Layout, sums: tuple[tuple[str, str, str], ...], weight_stride: str, rescale: str = "") -> str:
    """acc += Σ_j w[row][j]·x[j][col] over j < count, per (accumulator, weight array, x array);
    first acc *= rescale[row] when given (the forward's online softmax)."""
    cols_threads, row_step, cells = output_cells(layout)
    lines = ["{", f"    let ox = lid % {cols_threads}u;", f"    let oy = lid / {cols_threads}u;"]
    if rescale:
        for a in range(layout.orows):
            lines.append(f"    let alpha_{a} = {rescale}[oy + {a * row_step}u];")
        for name, _, _ in sums:
            lines += [f"    {name}_{a}_{b} *= alpha_{a};" for a, b in cells]
    lines.append("    for (var j = 0u; j < count; j++) {")
    for name, weights, values in sums:
        lines += [
            f"        let {name}_w{a} = {weights}[(oy + {a * row_step}u) * ({weight_stride} + 1u) + j];"
            for a in range(layout.orows)
        ]
        lines += [f"        let {name}_x{b} = {values}[j * DS + ox + {b * cols_threads}u];" for b in range(layout.ov)]
        lines += [
            f"        {name}_{a}_{b} = fma(vec4<f32>({name}_w{a}), {name}_x{b}, {name}_{a}_{b});" for a, b in cells
        ]
    lines += ["    }", "}"]
    return indent(lines, 2)  # inside the kernels' tile loops


def output_store(layout: Layout, stores: tuple[tuple[str, str, str], ...], row0: str, limit: str, base: str) -> str:
    """Per (accumulator, binding, expression of `{x}` (the accumulator) and the tile row `r`): store the thread's
    rows below `limit` to the binding's row-major [·, D] rows from element `base`."""
    cols_threads, row_step, cells = output_cells(layout)
    lines = ["{", f"    let ox = lid % {cols_threads}u;", f"    let oy = lid / {cols_threads}u;"]
    for a in range(layout.orows):
        lines.append(f"    if ({row0} + oy + {a * row_step}u < {limit}) {{")
        lines.append(f"        let r = oy + {a * row_step}u;")
        lines.append(f"        let at = {base} + ({row0} + r) * D;")
        for name, binding, expression in stores:
            for b in range(layout.ov):
                value = expression.replace("{x}", f"{name}_{a}_{b}")
                lines.append(f"        store4_{binding}(at, ox + {b * cols_threads}u, {value});")
        lines.append("    }")
    lines.append("}")
    return indent(lines)


def scores_code(scores: bool) -> dict[str, str]:
    """dK/dV's DS_ZEROS: with `scores`, zeros into out_s over the query rows before the walk's
    first tile (the causal mask hides the key tile from them; the walked tiles' scores are stored
    by the score tile's epilogue, SCORES_STORE). Empty without."""
    if not scores:
        return {"DS_ZEROS": ""}
    zeros = [
        "for (var g = g_first; g < g_end; g++) {",
        "    let at = ((b * HKV + kvh) * SKV + k0) * GROUP * SQ + g * SQ;",
        "    let rows = min(first_q0, SQ);",
        "    for (var e = lid; e < rows * BC; e += THREADS) {",
        "        if (k0 + e / rows < SKV) {",
        "            out_s[at + (e / rows) * GROUP * SQ + e % rows] = 0.0;",
        "        }",
        "    }",
        "}",
    ]
    return {"DS_ZEROS": indent(zeros)}


# dK/dV's score epilogue with `scores`: dS·scale of (key k0 + ri, query q0 + cj) of query head bh
# into out_s, dSᵀ grouped by KV head ([B, H_kv, SKV, GROUP·SQ], ir/ops/transformer.py): the
# threads of a warp hold consecutive queries of a key row, so these stores are coalesced.
SCORES_STORE = (
    "if (k0 + ri < SKV && q0 + cj < SQ) {"
    " out_s[((bh / GROUP) * SKV + k0 + ri) * GROUP * SQ + (bh % GROUP) * SQ + q0 + cj] = ds * SCALE; }"
)


def tile_code(layout: Layout, scores: bool = False) -> dict[str, str]:
    """The per-kernel placeholders of attention.wgsl for `layout` (`scores`: dK/dV also writes dS,
    `scores_code`)."""
    t = layout.tiles
    n = t.threads
    if layout.kind == "attention":
        return {
            "STAGE_Q": TileRows(("q",), ("tile_q",), t.br, n).staged(layout.d, "q0", "q_base", "SQ"),
            **forward_streams(layout),
            "ROW_LANES": row_lanes(t),
            "SCORES": score_tile(
                layout,
                (("s", "tile_q", "tile_kv"),),
                ["tile_s[ri * (BC + 1u) + cj] = select(LOWEST, {s} * SCALE, visible(q0 + ri, k0 + cj));"],
            ),
            "O_DECLARE": output_declare(layout, ("o",)),
            "O_UPDATE": output_update(layout, (("o", "tile_s", "tile_kv"),), "BC", rescale="row_scale"),
            "O_STORE": output_store(layout, (("o", "out", "{x} / row_l[r]"),), "q0", "SQ", "q_base"),
        }
    backward_epilogue = [
        "let p = select(0.0, exp({s} * SCALE - row_lse[{row}]), visible({i}, {j}));",
    ]
    if layout.kind == "attention_grad_q":
        epilogue = [line.format_map(SafeFormat(row="ri", i="q0 + ri", j="k0 + cj")) for line in backward_epilogue]
        epilogue.append("tile_s[ri * (BC + 1u) + cj] = p * ({dp} * kept(ri, cj) - row_delta[ri]);")
        keys = TileRows(("k", "v"), ("tile_k", "tile_v"), t.bc, n)
        queries = TileRows(("q", "d_o"), ("tile_q", "tile_do"), t.br, n)
        return {
            "ROW_LANES": False,  # the forward's softmax fold
            "STAGE_QDO": queries.staged(layout.d, "q0", "q_base", "SQ"),
            **prefetch_code(
                keys.streamed(layout.d, "SKV", ("0u", "kv_base"), ("k0", "kv_base"), ("next_k0", "kv_base"), t.prefetch)
            ),
            "SCORES": score_tile(layout, (("s", "tile_q", "tile_k"), ("dp", "tile_do", "tile_v")), epilogue),
            "DQ_DECLARE": output_declare(layout, ("dq",)),
            "DQ_UPDATE": output_update(layout, (("dq", "tile_s", "tile_k"),), "BC"),
            "DQ_STORE": output_store(layout, (("dq", "out", "{x} * SCALE"),), "q0", "SQ", "q_base"),
        }
    epilogue = [line.format_map(SafeFormat(row="cj", i="q0 + cj", j="k0 + ri")) for line in backward_epilogue]
    epilogue += [
        "let dropped = kept(cj, ri);",  # the tile's mask is staged by query row (shaders/attention.wgsl)
        "tile_p[ri * (BR + 1u) + cj] = p * dropped;",
        "let ds = p * ({dp} * dropped - row_delta[cj]);",
        "tile_ds[ri * (BR + 1u) + cj] = ds;",
        *([SCORES_STORE] if scores else []),
    ]
    queries = TileRows(("q", "d_o"), ("tile_q", "tile_do"), t.br, n)
    return {
        "ROW_LANES": False,
        "STAGE_KV": TileRows(("k", "v"), ("tile_k", "tile_v"), t.bc, n).staged(layout.d, "k0", "kv_base", "SKV"),
        **prefetch_code(
            queries.streamed(
                layout.d, "SQ", ("first_q0", "first_base"), ("q0", "q_base"), ("next_q0", "next_base"), t.prefetch
            )
        ),
        "SCORES": score_tile(layout, (("s", "tile_k", "tile_q"), ("dp", "tile_v", "tile_do")), epilogue),
        "DKV_DECLARE": output_declare(layout, ("dk", "dv")),
        "DKV_UPDATE": output_update(layout, (("dv", "tile_p", "tile_do"), ("dk", "tile_ds", "tile_q")), "BR"),
        "DKV_STORE": output_store(
            layout, (("dk", "out_k", "{x} * SCALE"), ("dv", "out_v", "{x}")), "k0", "SKV", "out_base"
        ),
        **scores_code(scores),
    }


def forward_streams(layout: Layout) -> dict[str, str]:
    """The forward's K and V tiles (both staged into tile_kv, V after the scores have read K):
    KV_DECLARE, STORE_K, STORE_V and KV_NEXT (the following tile's K and V, once both of the
    current one are stored)."""
    t = layout.tiles
    tiles = (("0u", "kv_base"), ("k0", "kv_base"), ("next_k0", "kv_base"))
    keys = TileRows(("k",), ("tile_kv",), t.bc, t.threads).streamed(layout.d, "SKV", *tiles, t.prefetch)
    values = TileRows(("v",), ("tile_kv",), t.bc, t.threads).streamed(layout.d, "SKV", *tiles, t.prefetch)
    return {
        "KV_DECLARE": indent(keys[0] + values[0]),
        "STORE_K": indent(keys[1], 2),
        "STORE_V": indent(values[1], 2),
        "KV_NEXT": indent(keys[2] + values[2], 3),
    }


def prefetch_code(streamed: tuple[list[str], list[str], list[str]]) -> dict[str, str]:
    """attention.wgsl's PREFETCH_DECLARE, PREFETCH_STORE and PREFETCH_NEXT of a backward kernel's
    streamed tiles, from `TileRows.streamed`."""
    declare, store, following_loads = streamed
    return {
        "PREFETCH_DECLARE": indent(declare),
        "PREFETCH_STORE": indent(store, 2),
        "PREFETCH_NEXT": indent(following_loads, 3),
    }


class SafeFormat(dict):
    """format_map that leaves unknown {names} (the products' sums) in place."""

    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def per_thread_work(layout: Layout) -> str:
    """The register tiles in words, for labels: scores SR×SC, outputs OR×OV vec4."""
    return f"s{layout.sr}x{layout.sc} o{layout.orows}x{layout.ov}"


def tiles_needed(rows: int, tile: int) -> int:
    return math.ceil(rows / tile)
