"""The tilings and subgroup-matrix code of the products on the tensor cores (codegen/matmul_halves.py,
shaders/matmul_halves.wgsl): three f16 products of operands split once into halves, through Dawn's
subgroup matrices, for a target that offers them (`Target.tensor_cores`: Dawn with
`chromium-experimental-subgroup-matrix`, f16 × f16 → f32).

Layout: GM × GN subgroups a workgroup (2 × 2 on the ladder), each SM × SN 16×16 result matrices.
The operands' halves are staged in workgroup memory as A [m][BK + 8] and B [k][BN + 8], so that
every subgroup matrix loads row-major (the probe's fast layout), with 8 halves of padding a row
(a WGSL GEMM probe on the H200: 57 → 259 TFLOP/s at 4096³ from a row pad).
"""

from __future__ import annotations

from dataclasses import dataclass

from meganeura.codegen.gemm_operands import OperandTile
from meganeura.target import Target

SUBGROUP = 32  # threads a subgroup: the H200's (Dawn's subgroup matrices there), the only one measured
PAD = 8  # halves after each staged row
BK = 32


@dataclass(frozen=True)
class TensorTiling:
    """A BM × BN tile, BM = 16·SM·GM and BN = 16·SN·GN: GM × GN subgroups of 32 threads, each
    SM × SN 16×16 result matrices."""

    sm: int
    sn: int
    bk: int = BK
    gm: int = 2
    gn: int = 2

    @property
    def bm(self) -> int:
        return 16 * self.sm * self.gm

    @property
    def bn(self) -> int:
        return 16 * self.sn * self.gn

    @property
    def subgroups(self) -> int:
        return self.gm * self.gn

    @property
    def threads(self) -> int:
        return SUBGROUP * self.subgroups

    @property
    def units_per_thread(self) -> tuple[int, int]:
        return self.bm * self.bk // 4 // self.threads, self.bn * self.bk // 4 // self.threads

    def staged_halves(self, operand: str) -> int:
        """Halves of one of an operand's two staged arrays (hi or lo): A [BM][BK + PAD], B [BK][BN + PAD]."""
        return self.bm * (self.bk + PAD) if operand == "a" else self.bk * (self.bn + PAD)

    @property
    def workgroup_bytes(self) -> int:
        """The staged halves, a 16×16 f32 matrix and two f32 maxima per subgroup."""
        return 4 * (self.staged_halves("a") + self.staged_halves("b")) + self.subgroups * (4 * 256 + 8)

    def tiles(self, m: int, n: int, batches: int) -> int:
        return -(-m // self.bm) * -(-n // self.bn) * batches


# Largest first; a product takes the first that gives every compute unit FILL workgroups (and
# a split product the parts of K that do: passes/operand_splits.py halves_splits). On the H200, 2026-12-04
# (benchmarks/plan_ab.py, Dawn without robustness, MEGANEURA_TENSOR_CORES=1, one process; GPU ms
# of a step as one pass at FILL 2 / 3 / 4 / 6): GPT-2 43.15 / 41.90 / 42.66 / 45.93, SmolLM2
# 61.88 / 59.87 / 60.08 / 66.89. BK 16 instead of 32: GPT-2 49.13 against 43.01 (FILL 2).
LADDER = (TensorTiling(4, 4), TensorTiling(2, 2), TensorTiling(1, 1))
FILL = 3


def fitting_tilings(target: Target) -> list[TensorTiling]:
    """The ladder's tilings within the target's workgroup memory, largest first; at least its
    smallest (which fits the 16 KiB every WebGPU device offers)."""
    return [tiling for tiling in LADDER if tiling.workgroup_bytes <= target.workgroup_memory] or [LADDER[-1]]


def dividing_tilings(target: Target, rows: int, cols: int) -> list[TensorTiling]:
    """`fitting_tilings` whose tiles divide rows × cols (operands padded for whole tiles,
    codegen/matmul_halves.py), largest first; the smallest fitting one where none does."""
    fitting = fitting_tilings(target)
    return [t for t in fitting if rows % t.bm == 0 and cols % t.bn == 0] or fitting[-1:]


def tensor_tiling(m: int, n: int, batches: int, target: Target, padded: tuple[int, int] | None = None) -> TensorTiling:
    """The tiling of an M × N product (times `batches`, parts of K included) on `target`: the
    first of `fitting_tilings` that fills it, else the smallest of them. With `padded` (rows,
    columns of operands padded for whole tiles, codegen/matmul_halves.py), only the tilings that
    divide them (the smallest fitting one where none does: a ladder without the padding's tile)."""
    fitting = fitting_tilings(target) if padded is None else dividing_tilings(target, *padded)
    for tiling in fitting:
        if tiling.tiles(m, n, batches) >= FILL * target.compute_units:
            return tiling
    return fitting[-1]


def staged_ld(op: OperandTile, tiling: TensorTiling) -> int:
    """Halves from one staged row to the next: A [m][BK + PAD], B [k][BN + PAD]."""
    return tiling.bk + PAD if op.name == "a" else op.tile + PAD


def matrix_load(op: OperandTile, tiling: TensorTiling, half: str, index: int, kk: int) -> str:
    """The subgroup matrix of `op`'s staged `half` at the subgroup's `index`-th 16 rows (A, the
    left matrix) or columns (B, the right) and K offset kk, both row-major."""
    ld = staged_ld(op, tiling)
    if op.name == "a":
        offset, kind = f"(sm0 + {16 * index}u) * {ld}u + {kk}u", "left"
    else:
        offset, kind = f"{kk * ld}u + sn0 + {16 * index}u", "right"
    return f"subgroupMatrixLoad<subgroup_matrix_{kind}<f16, 16, 16>>(&{op.name}_{half}, {offset}, false, {ld}u)"


def multiply_code(op_a: OperandTile, op_b: OperandTile, tiling: TensorTiling) -> list[str]:
    """One K tile's products: per 16 of K, the small terms first (Ah·Bl, Al·Bh), then Ah·Bh."""
    lines = []
    for kk in range(0, tiling.bk, 16):
        lines.append("{")
        for half in ("hi", "lo"):
            lines += [f"  let a{half}{i} = {matrix_load(op_a, tiling, half, i, kk)};" for i in range(tiling.sm)]
            lines += [f"  let b{half}{j} = {matrix_load(op_b, tiling, half, j, kk)};" for j in range(tiling.sn)]
        for a_half, b_half in (("hi", "lo"), ("lo", "hi"), ("hi", "hi")):
            for i in range(tiling.sm):
                for j in range(tiling.sn):
                    lines.append(
                        f"  c{i}_{j} = subgroupMatrixMultiplyAccumulate(a{a_half}{i}, b{b_half}{j}, c{i}_{j});"
                    )
        lines.append("}")
    return lines


def output_code(tiling: TensorTiling) -> list[str]:
    """Each result matrix through the subgroup's 16×16 of workgroup memory, unscaled, to `store4`:
    a lane takes 8 neighbouring columns of one row."""
    lines = []
    for i in range(tiling.sm):
        for j in range(tiling.sn):
            lines += [
                f"subgroupMatrixStore(&result, sg * 256u, c{i}_{j}, false, 16u);",
                "workgroupBarrier();",
                "{",
                "  let r = lane / 2u; let c = lane % 2u * 8u; let e = sg * 256u + r * 16u + c;",
                f"  let row = m0 + sm0 + {16 * i}u + r; let col = n0 + sn0 + {16 * j}u + c;",
                "  let v0 = vec4<f32>(result[e], result[e + 1u], result[e + 2u], result[e + 3u]);",
                "  let v1 = vec4<f32>(result[e + 4u], result[e + 5u], result[e + 6u], result[e + 7u]);",
                "  store4(obat, row, col, v0 * ua * ub);",
                "  store4(obat, row, col + 4u, v1 * ua * ub);",
                "}",
                "workgroupBarrier();",
            ]
    return lines


def subgroup_blocks(op_a: OperandTile, op_b: OperandTile, tiling: TensorTiling) -> dict[str, object]:
    """The generated parts of matmul_halves.wgsl that come from the tiling: a K tile's products,
    the accumulators and their way out, and the subgroups' layout."""
    accumulators = [f"c{i}_{j}" for i in range(tiling.sm) for j in range(tiling.sn)]
    return {
        "MULTIPLY": "\n        ".join(multiply_code(op_a, op_b, tiling)),
        "RESULTS": "\n    ".join(f"var {c} = subgroup_matrix_result<f32, 16, 16>();" for c in accumulators),
        "OUTPUT": "\n    ".join(output_code(tiling)),
        "THREADS": tiling.threads,
        "SUBGROUPS": tiling.subgroups,
        "GN": tiling.gn,
        "SUB_M": 16 * tiling.sm,
        "SUB_N": 16 * tiling.sn,
    }
