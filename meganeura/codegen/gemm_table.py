"""The matmul kernel's tile configurations (codegen/matmul.py): what a configuration is, and which
one each adapter family runs for each product, measured.

A `GemmTiling` is a BM × BN output tile per workgroup walked over K in steps of BK, each thread
owning 4·RM rows × 4·RN columns. `gemm_tiling(m, n, k, batches, target, transpose_b)` picks one
from the ladder of the target's family (`Target.tuning`; an adapter without one gets the generic
ladder): the largest tile that fits the target's workgroup memory and still gives every compute
unit `fill` workgroups, shrunk for outputs smaller than the tile.

Measured by `python benchmarks/gemm_tune.py` (every candidate configuration on the products of
real training steps in one process, GPU timestamps) and `python -m meganeura bench gemm`.
"""

from __future__ import annotations

from dataclasses import dataclass

from meganeura.target import GENERIC, Target

# No tiling is made past the H200's 48 KiB, the most workgroup memory of the adapters measured
# here; which tilings a target may take is its own `workgroup_memory` (`gemm_tiling`).
MAX_WORKGROUP_BYTES = 48 * 1024


@dataclass(frozen=True)
class GemmTiling:
    """A BM × BN output tile per workgroup, K in steps of BK; each thread owns RM groups of 4 rows
    (BM / RM apart) × RN vec4s of columns (BN / RN apart); `prefetch` loads the next K tile into
    registers while multiplying the current one. A `checked` tiling keeps the shader compiler's
    runtime bounds checks when the user opts out of them (`MEGANEURA_UNCHECKED_KERNELS=1`,
    runtime/device.py) on wgpu-native, whose switch is per module (Dawn's is per device): the
    family's measurements found it slower without them."""

    bm: int
    bn: int
    bk: int
    rm: int = 2
    rn: int = 2
    prefetch: bool = False
    checked: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.bm % (4 * self.rm) or self.bn % (4 * self.rn):
            problems.append("BM must be a multiple of 4·RM and BN of 4·RN")
        if self.bk % 4:
            problems.append("BK must be a multiple of 4")
        if not problems and not 1 <= self.threads <= 256:
            problems.append(f"{self.threads} threads per workgroup (1 to 256)")
        if not problems and any(
            units * self.threads != size
            for units, size in zip(self.units_per_thread, (self.bm * self.bk // 4, self.bn * self.bk // 4), strict=True)
        ):
            problems.append("each operand tile must split into whole vec4 units per thread")
        if self.workgroup_bytes > MAX_WORKGROUP_BYTES:
            problems.append(f"{self.workgroup_bytes} bytes of workgroup memory (at most {MAX_WORKGROUP_BYTES})")
        if problems:
            raise ValueError(f"GEMM tiling {self}: " + "; ".join(problems))

    @property
    def workgroup_bytes(self) -> int:
        """The staged tiles (shaders/matmul.wgsl): BK rows of A's BM floats and of B's BN."""
        return 4 * self.bk * (self.bm + self.bn)

    @property
    def threads_x(self) -> int:
        return self.bn // (4 * self.rn)

    @property
    def threads_y(self) -> int:
        return self.bm // (4 * self.rm)

    @property
    def threads(self) -> int:
        return self.threads_x * self.threads_y

    @property
    def units_per_thread(self) -> tuple[int, int]:
        """vec4 loads per thread per K tile, of A and of B."""
        return self.bm * self.bk // 4 // self.threads, self.bn * self.bk // 4 // self.threads

    def tiles(self, m: int, n: int, batches: int = 1) -> int:
        """The workgroups of this tiling for `batches` M×N outputs."""
        return batches * -(-m // self.bm) * -(-n // self.bn)

    def __str__(self) -> str:
        extra = " prefetch" * self.prefetch + " checked" * self.checked
        return f"{self.bm}x{self.bn}/k{self.bk} {4 * self.rm}x{4 * self.rn}{extra}"


@dataclass(frozen=True)
class GemmLadder:
    """An adapter family's measured tilings, largest tile first: a product takes the first whose
    tiles give every compute unit at least `fill` workgroups (the last one otherwise). Large tiles
    reuse each loaded element more; an output too small for them leaves units idle or runs a
    ragged last wave, where a smaller tile wins. `transposed_b` is the ladder of products whose
    B is stored [N, K] (x·Wᵀ with a Linear weight, an input gradient through Wᵀ): its staging
    scatters B's rows, and a different tile wins there."""

    fill: int
    ladder: tuple[GemmTiling, ...]
    transposed_b: tuple[GemmTiling, ...] = ()
    # Take a rung only where the output holds one whole tile of it (the last rung still takes the
    # rest): a CPU compiles a tile shrunk to a small output (`shrunk`) as slowly as a whole one.
    whole_tiles: bool = False

    def rungs(self, transpose_b: bool) -> tuple[GemmTiling, ...]:
        return (self.transposed_b or self.ladder) if transpose_b else self.ladder

    def largest(self, transpose_b: bool, target: Target) -> GemmTiling:
        """The first (largest) tiling of the ladder a product may take on `target`."""
        return self.fitting(transpose_b, target)[0]

    def fitting(self, transpose_b: bool, target: Target) -> list[GemmTiling]:
        ladder = self.rungs(transpose_b)
        fitting = [tiling for tiling in ladder if tiling.workgroup_bytes <= target.workgroup_memory]
        if not fitting:
            raise ValueError(
                f"no GEMM tiling of {', '.join(map(str, ladder))} fits {target.name}'s "
                f"{target.workgroup_memory} bytes of workgroup memory"
            )
        return fitting

    def pick(self, m: int, n: int, batches: int, target: Target, transpose_b: bool) -> GemmTiling:
        fitting = self.fitting(transpose_b, target)
        for tiling in fitting:
            if self.whole_tiles and (m < tiling.bm or n < tiling.bn):
                continue
            if tiling.tiles(m, n, batches) >= self.fill * target.compute_units:
                return tiling
        return fitting[-1]


GENERIC_TABLE = GemmLadder(
    fill=2, ladder=(GemmTiling(128, 128, 16, 2, 2), GemmTiling(64, 128, 16, 2, 2), GemmTiling(32, 64, 16, 1, 1))
)

# NVIDIA H200 (and H100). Measured on the H200 on 2026-12-01 with `python benchmarks/gemm_tune.py
# --top 4 --repeat 6` (the SmolLM2-135M and GPT-2-small steps' products; TFLOP/s of the fastest
# configuration, and of the 128x128 8x8 before in brackets) and `python -m meganeura bench gemm`:
#   4096³ 64x128 prefetch 38.5 (35.8); 8192x768x3072 64x128 36.9 (33.5); the LM-head gradient
#   50257x2048x768 Aᵀ 64x128 prefetch 41.0 (38.2); 3072x2048x768 Aᵀ (288 tiles of 64x128 on 132
#   SMs) 64x128 prefetch 29.3; 2048x50257x768 32x128 27.6 (64x128 22.6); 1536x2048x576 Aᵀ 32x64
#   15.2 (64x64 8.5). With B stored [N, K] 128x128 wins: the LM head 2048x576x49152 Bᵀ 33.9 and
#   2048x768x50257 Bᵀ 32.4 at 128x128, against 14.2 for 64x128 prefetch (bench gemm); a 2048x576
#   output (160 tiles of 64x128, 1.2 per SM) ran at 14-17 TFLOP/s: hence `fill` 2.
# The 128x128 8x8 tile keeps its bounds checks under MEGANEURA_UNCHECKED_KERNELS=1 (`checked`):
# on the H200, 2026-12-03, one profiled step of each bench workload with every trusted kernel
# checked and then unchecked (one process), the four products on that tile ran slower unchecked —
# GPT-2's 2048x768x3072 Bᵀ 3.78 → 4.84 ms a step, 2048x768x2304 Bᵀ 3.74 → 4.40, its tied head's
# 2048x768x50257 Bᵀ 4.90 → 5.10, SmolLM2's head 2048x576x49152 Bᵀ 3.46 → 3.59 — where the 64x128
# and 64x64 prefetch tiles gained on the whole. GPT-2's step under the opt-in went from 62.48 →
# 63.90 ms GPU to 62.55 → 62.14 with this tile checked (another run); SmolLM2 83.02 → 80.82,
# ResNet-18 (whose convolutions do not take it) 25.11 → 23.73.
HOPPER_TABLE = GemmLadder(
    fill=2,
    ladder=(GemmTiling(64, 128, 16, 2, 2, prefetch=True), GemmTiling(32, 128, 16, 1, 2), GemmTiling(32, 64, 16, 1, 1)),
    transposed_b=(
        GemmTiling(128, 128, 16, 2, 2, checked=True),
        GemmTiling(64, 128, 16, 2, 2, prefetch=True),
        GemmTiling(32, 128, 16, 1, 2),
        GemmTiling(32, 64, 16, 1, 1),
    ),
)

# lavapipe: large register tiles win on a CPU (each workgroup is one thread's loop). On this
# project's 2-core machine (`python benchmarks/gemm_tune.py --steps "" --extra
# 1024x256x256,2048x128x512,512x2048x128 --repeat 4`, 2026-12-01), 128x128 with 16x16 per thread:
# 1024x256x256 14.3 GFLOP/s (the kernel before: 9.6; 0.75 when issue 10 was filed), 2048x128x512 13.9,
# 512x2048x128 15.1 (16.7 at BK 32); next best 64x128 16x16 and 128x128 8x16, 15-25% slower.
#
# Products with an output smaller than a rung's tile skip it (`whole_tiles`): LLVM took 3.5-8.3 s to
# compile each 16x16-per-thread kernel shrunk to the tiny batched products of the unfused digits
# ResNet (8×8x16x36 …), 73 s for its first step on a fresh machine (`MESA_SHADER_CACHE_DIR` empty,
# the profiled first step, 2026-12-01), where the kernels then run in microseconds; a whole
# 128x128 tile of them is what the measured speed needs. Warm, the small rungs also run faster on
# such outputs: the `make train` MLP's five matmuls (batch 32) 1508 → 816 µs a step (profiled
# step, medians of 5); the character LM's default run, whose [256, 64] outputs went from 32x64 4x4
# to the new 64x64 8x8 rung, is unchanged (1000 steps: 79.1 s before, 81.1 s after, the same
# losses).
CPU_TABLE = GemmLadder(
    fill=2,
    ladder=(GemmTiling(128, 128, 16, 4, 4), GemmTiling(64, 64, 16, 2, 2), GemmTiling(32, 64, 16, 1, 1)),
    whole_tiles=True,
)

# lavapipe's convolutions (codegen/conv.py) take 8x8 per thread: as fast as the matmul's 16x16 once
# compiled and far quicker for LLVM to compile, which a CPU does for every distinct kernel on a
# fresh machine (no shader cache: CI). examples/resnet_digits.py, one epoch of 44 steps with
# MESA_SHADER_CACHE_DISABLE=true / two epochs with a warm cache, on this project's 2-core machine
# (2026-12-01): 128x128 16x16 110.2 s / 65.8 ms a step; 64x64 8x8 28.5 s / 66.5 ms; 32x64 4x4
# 12.4 s / 79.6 ms.
CPU_CONV_TABLE = GemmLadder(fill=2, ladder=(GemmTiling(64, 64, 16, 2, 2), GemmTiling(32, 64, 16, 1, 1)))

# The H200's convolutions (codegen/conv.py): 8x8 per thread where the matmul ladder's `fill`
# gave most of ResNet-18's outputs 32x64 or 32x128 tiles of 4x4 or 4x8. Measured on the H200 on
# 2026-12-01: `PYTHONPATH=. python benchmarks/conv_tune.py --repeat 8` (the 36 distinct
# conv_gemm kernels of the ResNet-18 bench step, 11 tilings each, summed over the step by how
# often each runs) put the weight gradients (B along K) at 14.1 ms on the matmul ladder and 12.7
# on this one; the forward and input gradients, timed alone, ran up to 3x slower than in the step,
# so their rungs were checked in the step (`python -m meganeura bench resnet18`): 128x128 tiles
# everywhere made the kernels faster (forward 256x2304x8192 1.34 → 1.03 ms for 3) but left the
# 4x4 stage's outputs 64 workgroups, and the plan took slower matmuls there; 64x64 keeps them
# conv_gemm kernels. The first rung of `transposed_b` is the matmul's size, so the weight
# gradients' split counts (conv.weight_splits, counted in that rung) stay as measured.
# The last rung, 4x4 a thread in 256 threads with prefetch, is the 4x4 stage's (512 filters over
# 2048 positions: 256 tiles of 64x64, under `fill`, where the 8x8 rung ran 64 threads a
# workgroup, two workgroups an SM): in the ResNet-18 step on the H200 (2026-12-03, 19:20-19:55 UTC,
# `benchmarks/plan_ab.py --workloads resnet18`, the ladder replaced in CONV_TABLES) the step
# 22.00 → 21.67 ms (one pass 20.68 → 20.34), forward 512x4608x2048 1.530 → 1.478 ms a step, its
# input gradients 1.125 → 0.914 and 0.561 → 0.455; 64x64 4x4 without prefetch 21.87, 32x64 4x4
# 21.96, 32x32 4x4 22.28.
HOPPER_CONV_TABLE = GemmLadder(
    fill=2,
    ladder=(
        GemmTiling(128, 128, 16, 2, 2, prefetch=True),
        GemmTiling(64, 64, 16, 2, 2),
        GemmTiling(64, 64, 16, 1, 1, prefetch=True),
    ),
    # The weight gradients' first rung runs without prefetch since their units load at once
    # (codegen/conv.py `gathers_units`): in the ResNet-18 step (2026-12-03, 19:20-19:55 UTC,
    # plan_ab.py as above) 64x1024x576 in 128 parts 2.108 → 1.904 ms a step, the others within
    # 0.05, the step 21.60 → 21.55 ms (one pass 20.32 → 20.21). Other first rungs change the
    # split counts, which are measured in it, and lost: 64x128 22.81 ms, 128x64 23.07, 64x64 23.10.
    transposed_b=(
        GemmTiling(128, 128, 16, 2, 2),
        GemmTiling(64, 128, 16, 2, 2, prefetch=True),
        GemmTiling(32, 64, 16, 1, 1),
    ),
)

# The H200's stride-2 input gradients (codegen/conv.py, grad_input with stride > 1): one GEMM per
# stride phase, and the phases are uneven (a 3x3 kernel at stride 2 gives them 1, 2, 2 and 4
# taps), so the dispatch waits on the 4-tap phase's quarter of the workgroups; smaller tiles give
# that phase more of them. Measured on the H200 on 2026-12-02 in the ResNet-18 step
# (`benchmarks/plan_ab.py --workloads resnet18`, one profiled step, the conv ladder's `fill` at 4
# and at 8 with a 32x64 4x4 rung after its two): 256x2048x2048 (3x3/s2, 512 → 256 channels)
# 1.125 → 0.725 ms at 32x64; 128x1024x8192 (256 → 128) 0.855 → 0.606 at 32x64; the 1x1/s2
# shortcuts' 256x512x2048 0.294 → 0.139 and 128x256x8192 0.205 → 0.132; 64x512x32768 (128 → 64),
# 0.571 at 64x128 (its 128x128 shrunk), ran slower at 64x64 (0.719). The stride-1 kernels ran slower on either
# ladder (forward 256x2304x8192 1.161 → 1.507 at fill 8), hence a ladder of its own: this `fill`
# gives 32x64 tiles to the four that gained and leaves the 128 → 64 stage its 64x128 (its first
# rung shrunk to 64 rows). The same step with this ladder, 2026-12-02: those four 1.116 → 0.724,
# 0.813 → 0.607, 0.295 → 0.139 and 0.207 → 0.138 ms, the rest unmoved.
HOPPER_STRIDED_TABLE = GemmLadder(
    fill=4, ladder=(GemmTiling(128, 128, 16, 2, 2, prefetch=True), GemmTiling(32, 64, 16, 1, 1))
)

# The H200's parts of a product split finely along K (codegen/matmul.py `fine_splits`: A stored
# [M, K], K of 4 parts of 144 or more, an output of fewer than 1.25 largest tiles a unit; parts
# for 16 workgroups a unit). Measured on the H200 on 2026-12-02 with `python
# benchmarks/gemm_tune.py --steps "" --extra 2048x1536x576:Bt,2048x1536x576,2048x49152x576:Bt
# --splits 1,2,3,4,6,8,12,16 --repeat 6` (18 tilings × 8 counts of parts, the split kernel plus
# the sum of its partials; ms, and TFLOP/s):
#   2048x1536x576 Bᵀ (bench gemm's 2048×576×1536 G·Bᵀ): this rung at 8 parts 0.1545 (23.5), the
#   fastest pair; 128x128 at 3 parts 0.158, at 6 0.161; the plan before, 128x128 in 4, 0.1996
#   (18.2). 2048x1536x576 (its down projection's A·B): 128x64 8x8 in 8 0.188 (19.3), this rung in
#   8 0.203 (17.8), in 4 0.204; the plan before, 64x128 prefetch in 2, 0.2237 (16.2).
#   2048x49152x576 Bᵀ (the tied head's dA): this rung in 12 4.176 (27.8), the fastest pair;
#   64x64 8x8 in 8 4.416, 128x64 8x4 in 8 4.434, 64x128 8x8 in 6 4.554; the plan before, 128x128
#   in 4, 4.955 (23.4); this rung in 16 5.63. The fastest pairs had 9 to 26 workgroups (of 64
#   or 128 threads) per SM; the plans before 2.4 (of 256 or 128) (as the convolutions' weight
#   gradients, codegen/conv.py: 9-17 per SM). The sweep's times scatter (the head's 64x64 rungs
#   at 8 parts 4.4 and 8.2 ms): its rows are one timing each.
# `python -m meganeura bench gemm` (same day, ours / torch TFLOP/s), before → with this rung at
# min(K // 192, 12) parts: 2048×576×1536 G·Bᵀ 20.3 / 36.3 → 23.1 / 35.3 (0.66), 2048×1536×576
# A·B 20.5 / 35.2 → 25.4 / 35.6 (0.71), the head's G·Bᵀ 23.3 / 43.5 → 28.5 / 43.6 (0.65, at
# 12 parts; the rule now gives it 8, timed only in the step: 3.26 and 3.28 ms against 3.30 and
# 3.31 at 12, the step's form of it, B not transposed). A count that leaves parts of K off the
# 16-multiple (that head at 11 parts: 5.68 ms) runs the ragged-K path and loses most of the gain.
HOPPER_SPLIT_TABLE = GemmLadder(fill=2, ladder=(GemmTiling(64, 64, 16, 2, 2, prefetch=True),))

# The H200's batched products (a matrix of the batch per head: attention's dQ, (dSᵀ)ᵀ·K over
# K = 256 keys, passes/attention_scores.py). Their reductions are short (16 K tiles), so a
# workgroup's walk is short and its fixed costs weigh: small tiles in many workgroups win. In the
# steps (`benchmarks/plan_ab.py --workloads smollm2`, 2026-12-02, GPU time of one profiled step's
# 30 layers, dQ's product 8x3×768x256x64 Aᵀ): the matmul ladder's 64x64 8x8 prefetch (288
# workgroups) 1.233 ms; 32x64 4x8 prefetch 0.995; 32x32 4x4 prefetch (1152) 0.936; the same
# products stopping each row tile's walk at its diagonal (the causal zeros of dS skipped) ran no
# faster at any of these tiles then (1.397, 1.016, 0.963): each workgroup's walk, not the GPU's
# multiply-adds, is what they wait for. On 2026-12-04, the kernels' loads since made vec4, the
# stop at the diagonal (fused_matmul `causal_rows`) did pay at 32x32: 0.927 → 0.879 ms on
# wgpu-native, 0.943 → 0.826 on Dawn with the opt-ins (docs/performance-log.md); the plan stops
# there since.
HOPPER_BATCHED_TABLE = GemmLadder(fill=2, ladder=(GemmTiling(32, 32, 16, 1, 1, prefetch=True),))

TABLES = {"generic": GENERIC_TABLE, "hopper": HOPPER_TABLE, "cpu": CPU_TABLE}
CONV_TABLES = {"hopper": HOPPER_CONV_TABLE}
STRIDED_TABLES = {"hopper": HOPPER_STRIDED_TABLE}
SPLIT_TABLES = {"hopper": HOPPER_SPLIT_TABLE}
BATCHED_TABLES = {"hopper": HOPPER_BATCHED_TABLE}


def table_for(target: Target, kind: str = "matmul") -> GemmLadder:
    """The ladder a product of `kind` ("matmul", "conv" for the implicit GEMMs, "strided" for the
    input gradients of strided convolutions, one GEMM per stride phase, "split" for the
    parts of a product split finely along K, codegen/matmul.py `fine_splits`, "batched" for an
    unsplit product of several matrices) takes on `target`; a family without a ladder of that
    kind takes its matmul ladder."""
    if kind == "strided" and (target.cpu or target.tuning not in STRIDED_TABLES):
        kind = "conv"
    if target.cpu:
        return CPU_CONV_TABLE if kind == "conv" else CPU_TABLE
    if kind == "strided":
        return STRIDED_TABLES[target.tuning]
    if kind == "conv" and target.tuning in CONV_TABLES:
        return CONV_TABLES[target.tuning]
    if kind == "split" and target.tuning in SPLIT_TABLES:
        return SPLIT_TABLES[target.tuning]
    if kind == "batched" and target.tuning in BATCHED_TABLES:
        return BATCHED_TABLES[target.tuning]
    return TABLES.get(target.tuning, GENERIC_TABLE)


def shrunk(tiling: GemmTiling, m: int, n: int, workgroup_memory: int) -> GemmTiling:
    """`tiling`, its tile halved along an axis the output does not fill (down to 4 rows of 16
    columns), keeping each thread's share and the per-thread load counts whole and the staged
    tiles within `workgroup_memory` (a smaller tile may need another BK)."""
    bm, bn, rm, rn = tiling.bm, tiling.bn, tiling.rm, tiling.rn
    while bm > 4 * rm and bm // 2 >= m:
        bm //= 2
    while bn > 16 * rn and bn // 2 >= n:
        bn //= 2
    for bk in (tiling.bk, 16, 32, 64, 8, 4):
        try:
            smaller = GemmTiling(bm, bn, bk, rm, rn, tiling.prefetch, tiling.checked)
        except ValueError:
            continue
        if smaller.workgroup_bytes <= workgroup_memory:
            return smaller
    return GemmTiling(bm, bn, 16, 1, 1) if (bm, bn) != (tiling.bm, tiling.bn) else tiling


def gemm_tiling(
    m: int, n: int, k: int, batches: int = 1, target: Target = GENERIC, transpose_b: bool = False, kind: str = "matmul"
) -> GemmTiling:
    """The tiling the matmul kernel (`kind` "conv": the implicit-GEMM convolution; "split": the
    parts of a finely split product) uses for an M×K·K×N product (`batches` of them) on `target`."""
    tiling = table_for(target, kind).pick(m, n, batches, target, transpose_b)
    return shrunk(tiling, m, n, target.workgroup_memory)
