"""The float32 product on the tensor cores (shaders/matmul_tensor.wgsl): matmul and fused_matmul
as three f16 products of split operands through Dawn's subgroup matrices, for a target that offers
them (`Target.tensor_cores`: Dawn with `chromium-experimental-subgroup-matrix`, f16 × f16 → f32).

The method. WGSL reaches the tensor cores only with f16 (or integer) operands. An f32 x is
s·(hi + lo): s a power of two, hi the scaled x with its mantissa cut to f16's 10 bits, lo the rest
rounded to f16, so hi + lo holds 21-22 of x's 24 significant bits; the product is
(Ah·Bh + Ah·Bl + Al·Bh) / (sa·sb) with f32 accumulation (Al·Bl, about 2^-22 of |a||b|, dropped).
The scale keeps the operands inside f16's range (normal from 2^-14, largest 65504): one per
operand tile of a workgroup, a running one — the first nonzero K tile sets it from its largest
|x|, a later tile that would overflow it lowers it and the accumulators with it (a power of two:
exact), so each workgroup reads its operands once, as the f32 kernel does. Elements more than
2^18 below their tile's largest lose bits of lo, those 2^29 below hi's too: the product's error
stays a small multiple of 2^-22 of |A|·|B| over the tile.

Layout: GM × GN subgroups a workgroup (2 × 2 on the ladder), each SM × SN 16×16 result matrices.
The operands' halves are staged in workgroup memory as A [m][BK + 8] and B [k][BN + 8] whichever
way each is stored, so that every subgroup matrix loads row-major (the probe's fast layout), with 8
halves of padding a row (the probe, shared/notes/gemm-probe.md: 57 → 259 TFLOP/s from a row pad).
Consecutive threads take consecutive units along the staged row (`LANES_ALONG`), so that their
stores are neighbouring halves. A transposed operand is slow either way: Aᵀ·B at 576x2048x1536 ran
at 12.3 TFLOP/s with A staged [k][m] and loaded column-major, 11.2 staged [m][k]; A·Bᵀ at
2048x576x1536 at 11.9 and 15.6 (A·B: 30).

Measured on the H200 (2026-12-04, docs/performance-log.md has the commands): correct — every
case of tests/test_matmul_tensor.py within 2e-5 of |A|·|B| — but slower than the f32 SIMT kernels
in the LM steps. Alone (benchmarks/tensor_core_kernel.py): 30 TFLOP/s at 2048x576x1536, 39 at
2048x768x3072, 42 at 4096³, against 49, 48 and 53 for the probe's kernel on operands split
beforehand; with its products removed the kernel still takes 0.088 ms at 2048x576x1536, more
than the probe's whole product (0.074): splitting each f32 in the kernel, once per workgroup that
reads it (N / BN times for A), and storing its halves into workgroup memory bound it, not the
tensor cores. In the steps, GPU time as one pass on Dawn: SmolLM2 69.1 ms (f32 kernels) → 90.5,
GPT-2 59.2 → 66.5; of the products only GPT-2's 2048x768x3072 and 2048x768x2304 Bᵀ ran faster
(4.63 → 3.27 and 3.85 → 3.23 ms a step). Hence off (`tensor_takes`) even under the tensor cores'
opt-in (MEGANEURA_TENSOR_CORES=1), which gives the products to operands split once
(codegen/matmul_halves.py) where they can, and keeps the f32 kernels for the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from meganeura.codegen.gemm_operands import OperandTile, unit_code, unit_offsets
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
# a split product the parts of K that do: matmul_halves.halves_splits). On the H200, 2026-12-04
# (benchmarks/plan_ab.py, Dawn without robustness, MEGANEURA_TENSOR_CORES=1, one process; GPU ms
# of a step as one pass at FILL 2 / 3 / 4 / 6): GPT-2 43.15 / 41.90 / 42.66 / 45.93, SmolLM2
# 61.88 / 59.87 / 60.08 / 66.89. BK 16 instead of 32: GPT-2 49.13 against 43.01 (FILL 2).
LADDER = (TensorTiling(4, 4), TensorTiling(2, 2), TensorTiling(1, 1))
FILL = 3


def tensor_takes(m: int, n: int, k: int, batches: int) -> bool:
    """Whether a product on a target with tensor cores runs on this kernel: none. It was slower
    than the f32 kernels in the LM steps (module docstring), and the products that can run from
    operands split once do so (codegen/matmul_halves.py), faster; the rest keep the f32 kernels.
    The hook where a policy by shape would go, and what the tests and `benchmarks/plan_ab.py`
    replace to run or A/B this kernel."""
    return False


def on_tensor_cores(m: int, n: int, k: int, batches: int, target: Target) -> bool:
    """Whether a product runs on the tensor cores: the target has them and `tensor_takes` it."""
    return target.tensor_cores and tensor_takes(m, n, k, batches)


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


# Consecutive threads take an operand's units along its staged rows: A's along K (its [m][k]
# tile), B's along N (its [k][n] tile), so that their stores into workgroup memory are neighbouring
# halves whichever way the operand is stored.
LANES_ALONG = {"a": "k", "b": "outer"}


def staged_ld(op: OperandTile, tiling: TensorTiling) -> int:
    """Halves from one staged row to the next: A [m][BK + PAD], B [k][BN + PAD]."""
    return tiling.bk + PAD if op.name == "a" else op.tile + PAD


def staged_store(op: OperandTile, tiling: TensorTiling, j: int) -> list[str]:
    """WGSL storing unit j (`r<op>j`, f32) scaled by `s<op>` as hi and lo halves: A into its
    [m][k] tiles, B into its [k][n] ones, a unit's 4 elements neighbours where they run along the
    staged row, `ld` apart where they run across it."""
    o, k = unit_offsets(op, tiling, j, LANES_ALONG[op.name])
    ld = staged_ld(op, tiling)
    row, col = (o, k) if op.name == "a" else (k, o)
    along_row = op.outer_contiguous == (op.name == "b")
    step = 1 if along_row else ld
    name = op.name
    stores = " ".join(
        f"{name}_hi[i + {c * step}u] = h.{comp}; {name}_lo[i + {c * step}u] = l.{comp};"
        for c, comp in enumerate("xyzw")
    )
    return [
        f"{{ let i = ({row}) * {ld}u + {col}; let v = r{name}{j} * s{name}; let hv = high_half(v); "
        f"let h = vec4<f16>(hv); let l = vec4<f16>(v - hv); {stores} }}"
    ]


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


def largest_of(count: int) -> str:
    """The WGSL max of `l[0]` … `l[count - 1]`, as a balanced tree."""
    terms = [f"l[{i}]" for i in range(count)]
    while len(terms) > 1:
        terms = [f"max({a}, {b})" for a, b in zip(terms[::2], terms[1::2], strict=True)] + terms[len(terms) // 2 * 2 :]
    return terms[0]


def tensor_blocks(
    op_a: OperandTile, op_b: OperandTile, tiling: TensorTiling, ragged_k: bool, prologue: bool
) -> dict[str, object]:
    """The generated parts of shaders/matmul_tensor.wgsl (its header lists them)."""
    units_a, units_b = tiling.units_per_thread
    per_operand = ((op_a, units_a), (op_b, units_b))
    units = [f"var r{op.name}{j}: vec4<f32>;" for op, count in per_operand for j in range(count)]
    units += [
        line
        for op, count in per_operand
        for j in range(count)
        for line in unit_code(
            op, tiling, ragged_k, j, "k0", f"r{op.name}{j}", op is op_a and prologue, LANES_ALONG[op.name]
        )
    ]
    largest = [f"m{op.name} = max(m{op.name}, max4(r{op.name}{j}));" for op, count in per_operand for j in range(count)]
    stage = [line for op, count in per_operand for j in range(count) for line in staged_store(op, tiling, j)]
    accumulators = [f"c{i}_{j}" for i in range(tiling.sm) for j in range(tiling.sn)]
    return {
        "BM": tiling.bm,
        "BN": tiling.bn,
        "BK": tiling.bk,
        "A_SIZE": tiling.staged_halves("a"),
        "B_SIZE": tiling.staged_halves("b"),
        "UNITS": "\n        ".join(units),
        "LARGEST": "\n        ".join(largest),
        "STAGE": "\n        ".join(stage),
        "RESCALE": "\n            ".join(f"{c} = subgroupMatrixScalarMultiply({c}, f);" for c in accumulators),
        "TILE_LARGEST": largest_of(tiling.subgroups),
        **subgroup_blocks(op_a, op_b, tiling),
    }


def subgroup_blocks(op_a: OperandTile, op_b: OperandTile, tiling: TensorTiling) -> dict[str, object]:
    """The generated parts both tensor-core kernels share (matmul_tensor.wgsl, matmul_halves.wgsl):
    a K tile's products, the accumulators and their way out, and the subgroups' layout."""
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
