"""The register tiling of the staged-tile implicit GEMM of conv_gemm (shaders/gemm_tiles.wgsl):
a workgroup of WG_X × WG_Y threads computes a BM × BN tile, each thread TM rows × NV vec4 columns.

(The matmul kernel has its own generator and measured tile tables: codegen/matmul.py.)
"""

from __future__ import annotations


def conv_tiling(m: int, n: int) -> dict[str, int]:
    """Workgroup shape and register tile: the smallest tile that covers small outputs, 64×64 for
    most, 64×128 when there are workgroups enough to fill a large GPU anyway (measured on an H200
    with the matmul kernel of 2026-11-30, which shared this tiling: 13 TFLOP/s for 64×64 and 16 for
    64×128 at 4096³; 64×64 wins at 1024³)."""
    bm = next((size for size in (8, 16, 32) if m <= size), 64)
    bn = next((size for size in (16, 32) if n <= size), 64)
    if bm == 64 and -(-m // 64) * -(-n // 128) >= 512:
        bn = 128
    wg_y, tm = {8: (8, 1), 16: (8, 2), 32: (16, 2), 64: (16, 4)}[bm]
    wg_x, nv = {16: (4, 1), 32: (8, 1), 64: (16, 1), 128: (16, 2)}[bn]
    return {"WG_X": wg_x, "WG_Y": wg_y, "TM": tm, "NV": nv, "BK": 16}


def register_tile(tm: int, nv: int, wg_x: int, wg_y: int) -> dict[str, str]:
    """The unrolled per-thread code of gemm_tiles.wgsl kernels: TM × NV vec4 accumulators, their
    update, their store (through the kernel's `store4(row, col, v)`)."""
    pairs = [(i, j) for i in range(tm) for j in range(nv)]
    declare = [f"var acc_{i}_{j} = vec4<f32>(0.0);" for i, j in pairs]
    loads = [f"let b_{j} = tile_b[b_row + {j * wg_x}u];" for j in range(nv)]
    loads += [f"let a_{i} = vec4<f32>(tile_a[a_row + {i * wg_y}u]);" for i in range(tm)]
    fmas = [f"acc_{i}_{j} = fma(a_{i}, b_{j}, acc_{i}_{j});" for i, j in pairs]
    stores = [f"store4(row0 + {i * wg_y}u, col0 + {4 * j * wg_x}u, acc_{i}_{j});" for i, j in pairs]
    return {
        "ACCUMULATORS": "\n    ".join(declare),
        "MULTIPLY": "\n            ".join(loads + fmas),
        "STORE": "\n    ".join(stores),
    }


def tile_size(tiling: dict[str, int]) -> tuple[int, int]:
    """(rows, columns) of the output tile one workgroup computes."""
    return tiling["WG_Y"] * tiling["TM"], tiling["WG_X"] * tiling["NV"] * 4


def workgroup_bytes(tiling: dict[str, int]) -> int:
    """The workgroup memory of the staged tiles: BK rows of A's BM floats and of B's BN."""
    bm, bn = tile_size(tiling)
    return 4 * tiling["BK"] * (bm + bn)
