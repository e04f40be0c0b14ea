"""The matmul kernel's tile configurations (codegen/matmul.py): what a configuration is, and which
one each adapter family runs for each class of shape, measured.

A `GemmTiling` is a BM × BN output tile per workgroup walked over K in steps of BK, each thread
owning 4·RM rows × 4·RN columns. `gemm_tiling(m, n, k, batches, target)` picks one: the
measured table of the target's family (`Target.tuning`) for the shape's class, shrunk for outputs
smaller than the tile; an adapter without a table gets the generic one.

Measured by `python benchmarks/gemm_tune.py` (every configuration of `CANDIDATES` on every
shape of `benchmarks/gemm_tune.py` in one process, GPU timestamps, median of 10 dispatches).
"""

from __future__ import annotations

from dataclasses import dataclass

# Workgroup memory every WebGPU device offers (the default limit) and lavapipe's: 32 KiB.
WORKGROUP_BYTES = 32 * 1024


@dataclass(frozen=True)
class GemmTiling:
    """A BM × BN output tile per workgroup, K in steps of BK; each thread owns RM groups of 4 rows
    (BM / RM apart) × RN vec4s of columns (BN / RN apart); `prefetch` loads the next K tile into
    registers while multiplying the current one."""

    bm: int
    bn: int
    bk: int
    rm: int = 2
    rn: int = 2
    prefetch: bool = False

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
        if 4 * self.bk * (self.bm + self.bn) > WORKGROUP_BYTES:
            problems.append(
                f"{4 * self.bk * (self.bm + self.bn)} bytes of workgroup memory (at most {WORKGROUP_BYTES})"
            )
        if problems:
            raise ValueError(f"GEMM tiling {self}: " + "; ".join(problems))

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

    def __str__(self) -> str:
        extra = " prefetch" if self.prefetch else ""
        return f"{self.bm}x{self.bn}/k{self.bk} {4 * self.rm}x{4 * self.rn}{extra}"


def shape_class(m: int, n: int, k: int, batches: int) -> str:
    """The class a product falls in, by the outputs it has to spread over the adapter (batches·M·N):
    "small" (under 16k: a few workgroups whatever the tile), "narrow" (under 1M: at 128×128, fewer
    tiles than an H200 has units — a transformer's weight gradients, its KV projections), "medium"
    (under 4M: its other projections at batch × seq 2048), "large" (the rest: square products,
    an LM head). K does not enter: every class holds short and long reductions alike."""
    outputs = batches * m * n
    if outputs < 16384:
        return "small"
    if outputs < 1 << 20:
        return "narrow"
    if outputs < 4 << 20:
        return "medium"
    return "large"


GENERIC_TABLE = {
    "small": GemmTiling(32, 64, 16, 1, 1),
    "narrow": GemmTiling(64, 64, 16, 1, 1),
    "medium": GemmTiling(64, 128, 16, 2, 2),
    "large": GemmTiling(128, 128, 16, 2, 2),
}

# NVIDIA H200 (and H100): `python benchmarks/gemm_tune.py --top 4 --repeat 6` on the H200,
# 2026-12-01, the SmolLM2-135M and GPT-2-small steps' products, TFLOP/s of the fastest
# configuration against the generic pick:
#   large:  4096³ 64x128 prefetch 38.5 (128x128 35.8); 8192x768x3072 64x128 36.9 (128x128 33.5);
#           LM-head gradient 50257x2048x768 Aᵀ 64x128 prefetch 41.0 (38.2); the LM head itself,
#           2048x576x49152 Bᵀ and 2048x768x50257 Bᵀ, 128x128 33.9 and 32.4 (64x128 prefetch not
#           timed alone there: the sweep ran out of time);
#   medium: 3072x2048x768 Aᵀ 64x128 prefetch 29.3 (64x128 14.0); 2048x576x1536 Bᵀ 64x128
#           prefetch 19.9 (14.9); 2048x50257x768 32x128 27.6 (64x128 22.6);
#   narrow: 1536x2048x576 Aᵀ 32x64 15.2 (64x64 4x4 8.5).
HOPPER_TABLE = {
    "small": GemmTiling(32, 64, 16, 1, 1),
    "narrow": GemmTiling(32, 64, 16, 1, 1),
    "medium": GemmTiling(64, 128, 16, 2, 2, prefetch=True),
    "large": GemmTiling(64, 128, 16, 2, 2, prefetch=True),
}

# lavapipe: large register tiles win on a CPU (each workgroup is one thread's loop). On this
# project's 2-core machine (`python benchmarks/gemm_tune.py --steps "" --extra
# 1024x256x256,2048x128x512,512x2048x128 --repeat 4`, 2026-12-01), 128x128 with 16x16 per thread:
# 1024x256x256 14.3 GFLOP/s (the kernel before: 9.6; in November 0.75), 2048x128x512 13.9,
# 512x2048x128 15.1 (16.7 at BK 32); next best 64x128 16x16 and 128x128 8x16, 15-25% slower.
CPU_TABLE = dict.fromkeys(GENERIC_TABLE, GemmTiling(128, 128, 16, 4, 4)) | {"small": GemmTiling(32, 64, 16, 1, 1)}

TABLES = {"generic": GENERIC_TABLE, "hopper": HOPPER_TABLE, "cpu": CPU_TABLE}


def shrunk(tiling: GemmTiling, m: int, n: int) -> GemmTiling:
    """`tiling`, its tile halved along an axis the output does not fill (down to 4 rows of 16
    columns), keeping each thread's share and the per-thread load counts whole."""
    bm, bn, rm, rn = tiling.bm, tiling.bn, tiling.rm, tiling.rn
    while bm > 4 * rm and bm // 2 >= m:
        bm //= 2
    while bn > 16 * rn and bn // 2 >= n:
        bn //= 2
    for bk in (tiling.bk, 16, 32, 64, 8, 4):
        try:
            return GemmTiling(bm, bn, bk, rm, rn, tiling.prefetch)
        except ValueError:
            continue
    return GemmTiling(bm, bn, 16, 1, 1) if (bm, bn) != (tiling.bm, tiling.bn) else tiling


def gemm_tiling(m: int, n: int, k: int, batches: int = 1, target=None) -> GemmTiling:
    """The tiling the matmul kernel uses for an M×K·K×N product (`batches` of them) on `target`."""
    family = "generic" if target is None else "cpu" if target.cpu else target.tuning
    table = TABLES.get(family, GENERIC_TABLE)
    return shrunk(table[shape_class(m, n, k, batches)], m, n)
