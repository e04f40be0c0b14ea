"""How the GEMM kernels (matmul.wgsl, conv_gemm.wgsl) move their operands and results: an operand
tile's vec4 units, where each thread's units sit in the tile and how they are loaded (bounds,
prologue), and the `store4` that writes four output columns through the epilogue (codegen/matmul.py
`gemm_blocks` stages them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Tiling(Protocol):
    """What unit placement needs of a tiling: its threads and its K tile."""

    threads: int
    bk: int


@dataclass(frozen=True)
class OperandTile:
    """How one operand's tile is staged: `name` "a" or "b", `outer` its output axis ("m" or "n")
    with `outer_size` (M or N) and `tile` (BM or BN) elements per tile, whether it is stored
    contiguous along that axis (else along K), whether units are vec4 loads, and whether they are
    gathered a unit at a time by the kernel's `load_a4` / `load_b4` (a convolution's gather that
    decodes a unit's position once, codegen/conv.py), else by element through `load_a` / `load_b`
    (each with its bound checks)."""

    name: str
    outer: str
    outer_size: int
    tile: int
    outer_contiguous: bool
    vector: bool
    units: bool = False

    def element_index(self, o: str, k: str) -> str:
        """Index of element (outer o, k) within one matrix of the stored operand."""
        return f"({k}) * {self.outer_size}u + ({o})" if self.outer_contiguous else f"({o}) * K + ({k})"


def unit_slot(tiling: Tiling, j: int | str) -> str:
    """The index, among an operand tile's vec4 units, of this thread's unit j (a number, or the
    WGSL name of a loop's unit index): consecutive threads take consecutive units."""
    if isinstance(j, str):
        return f"lid + {j} * {tiling.threads}u"
    return f"lid + {j * tiling.threads}u" if j else "lid"


def unit_code(
    op: OperandTile,
    tiling: Tiling,
    ragged_k: bool,
    j: int | str,
    kt: str,
    register: str,
    prologue: bool,
    lanes_along: str = "outer",
) -> list[str]:
    """WGSL that loads unit j of this thread's share of `op`'s tile at K offset `kt` into the vec4
    variable `register`: zeros outside the matrix, A's elements through the prologue. Consecutive
    threads take units along `lanes_along` (`unit_position`)."""
    o, kk = unit_position(op, tiling, j, kt, lanes_along)
    if op.outer_contiguous:  # 4 consecutive outer elements at one k
        steps = [(f"uo + {i}u", "uk") for i in range(4)]
    else:  # 4 consecutive k of one row
        steps = [("uo", f"uk + {i}u") for i in range(4)]
    if op.units:
        return [f"{{ let uo = {o}; let uk = {kk}; {register} = load_{op.name}4(bat, uo, uk); }}"]
    if not op.vector:
        loads = ", ".join(f"load_{op.name}(bat, {oc}, {kc})" for oc, kc in steps)
        return [f"{{ let uo = {o}; let uk = {kk}; {register} = vec4<f32>({loads}); }}"]
    load = f"{op.name}[({op.name}_base + {op.element_index('uo', 'uk')}) / 4u]"
    if prologue:
        parts = ", ".join(f"prologue(v.{comp}, bat, {oc}, {kc})" for comp, (oc, kc) in zip("xyzw", steps, strict=True))
        body = f"let v = {load}; {register} = vec4<f32>({parts});"
    else:
        body = f"{register} = {load};"
    # With a vec4 unit, the contiguous axis is a multiple of 4 long: a unit is all in or all out.
    checks = [f"uo < {op.outer_size}u"] * (op.outer_size % op.tile != 0) + ["uk < kend"] * ragged_k
    if checks:
        body = f"{register} = vec4<f32>(0.0); if ({' && '.join(checks)}) {{ {body} }}"
    return [f"{{ let uo = {o}; let uk = {kk}; {body} }}"]


def unit_position(
    op: OperandTile, tiling: Tiling, j: int | str, kt: str, lanes_along: str = "outer"
) -> tuple[str, str]:
    """The (outer, k) of the first element of this thread's unit j of `op`'s tile at K offset `kt`
    (the tile's offsets, `unit_offsets`, from its origin `m0`/`n0` and `kt`)."""
    o, k = unit_offsets(op, tiling, j, lanes_along)
    return f"{op.outer}0 + {o}", f"{kt} + {k}"


def unit_offsets(op: OperandTile, tiling: Tiling, j: int | str, lanes_along: str = "outer") -> tuple[str, str]:
    """The (outer, k) offsets within `op`'s tile of the first element of this thread's unit j,
    consecutive threads taking consecutive units along `lanes_along`: "outer" (for an operand stored
    along K, consecutive rows: the f32 kernels' [k][outer] tiles take them without bank conflicts;
    for one stored along its outer axis, coalesced runs) or "k" (coalesced runs along K, or
    consecutive k of one group of 4 rows: the tensor-core kernel's [outer][k] tiles)."""
    s = unit_slot(tiling, j)
    if lanes_along not in ("outer", "k"):
        raise ValueError(f"lanes_along is 'outer' or 'k', not {lanes_along!r}")
    if op.outer_contiguous and lanes_along == "outer":
        return f"({s}) % {op.tile // 4}u * 4u", f"({s}) / {op.tile // 4}u"
    if op.outer_contiguous:
        return f"({s}) / {tiling.bk}u * 4u", f"({s}) % {tiling.bk}u"
    if lanes_along == "outer":
        return f"({s}) % {op.tile}u", f"({s}) / {op.tile}u * 4u"
    runs = tiling.bk // 4
    return f"({s}) / {runs}u", f"({s}) % {runs}u * 4u"


def store_guard(m: int, n: int, bm: int, bn: int) -> str:
    """The WGSL that leaves `store4` for a (row, col) outside the M × N output: a check on each axis
    the tiles do not divide ("" when both do)."""
    checks = (["row < M"] if m % bm else []) + (["col < N"] if n % bn else [])
    return f"if (!({' && '.join(checks)})) {{ return; }}" if checks else ""


def store4_function(m: int, n: int, bm: int, bn: int, vector: bool) -> str:
    """`store4(bat, row, col, v)`: out[bat, row, col .. col + 3] = epilogue(v), inside the matrix."""
    guard = store_guard(m, n, bm, bn)
    if vector:
        parts = ", ".join(f"epilogue(v.{comp}, bat, row, col + {c}u)" for c, comp in enumerate("xyzw"))
        body = f"out[((bat * M + row) * N + col) / 4u] = vec4<f32>({parts});"
    else:
        body = (
            "for (var c = 0u; c < 4u; c++) { if (col + c < N) {"
            " out[(bat * M + row) * N + col + c] = epilogue(v[c], bat, row, col + c); } }"
        )
    return f"fn store4(bat: u32, row: u32, col: u32, v: vec4<f32>) {{\n    {guard}\n    {body}\n}}"
