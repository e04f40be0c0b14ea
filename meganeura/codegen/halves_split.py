"""The kernels that split operands into f16 halves (ir/ops/halves.py) for the tensor-core product
(codegen/matmul_halves.py): `split_halves`, and `multi_split_halves` / `multi_top`, the splits and
the maxima of several tensors in one dispatch (shaders/split_halves.wgsl, shaders/multi_top.wgsl).

Each member of a kernel owns a range of its workgroups and has its own code and bindings (a
kernel's bindings are fixed), generated here: `split_member` and `top_member`. A split of one
member is `split_halves`; a tensor split both ways in one kernel binds its data and maxima once.
"""

from __future__ import annotations

from dataclasses import dataclass

from meganeura.codegen.common import grid_for
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.ops.halves import halves_shape

BLOCK = 64  # a transposed split's block of the operand
SPLIT_UNITS = 4  # units of four elements a thread of an untransposed split takes (operand_splits.TOP_PARTS)
THREADS = 256


@dataclass(frozen=True)
class SplitMember:
    """One split in a kernel: op(x) padded to rows_to × cols_to, its names in the kernel."""

    x: TensorType
    tops: int  # the elements of its maxima
    transpose: bool
    rows_to: int
    cols_to: int

    @property
    def sizes(self) -> tuple[int, int, int, int]:
        return halves_shape(self.x, self.transpose, self.rows_to, self.cols_to)

    @property
    def workgroups(self) -> int:
        """Transposed, one per 64×64 block; else one per THREADS threads of SPLIT_UNITS units."""
        _, _, rows_p, cols_p = self.sizes
        if self.transpose:
            return -(-rows_p // BLOCK) * -(-cols_p // BLOCK)
        return -(-rows_p * cols_p // 4 // (THREADS * SPLIT_UNITS))


def split_member(member: SplitMember, first: int, x: str, top: str, out: str) -> str:
    """WGSL of one member's split for the workgroups from `first` (module docstring)."""
    rows, cols, rows_p, cols_p = member.sizes
    x_cols = member.x.shape[-1]
    plane = rows_p * cols_p // 4
    lines = [
        f"if (w >= {first}u && w < {first + member.workgroups}u) {{",
        f"    let b = w - {first}u;",
        "    var m = 0.0;",
        f"    for (var i = t; i < {member.tops}u; i += {THREADS}u) {{ m = max(m, abs({top}[i])); }}",
        "    let s = power_of_two(scale_exponent(combine(m, t, true)));",
    ]
    store = f"let h = halves_of(o * s); {out}[at] = h[0]; {out}[{plane}u + at] = h[1];"
    if member.transpose:  # X [cols, rows]: O[r, c] = X[c, r], staged through a block read along X's rows
        column = "block[(c + {q}u) * 65u + r]"
        lines += [
            f"    let r0 = b / {cols_p // BLOCK}u * 64u;",
            f"    let c0 = b % {cols_p // BLOCK}u * 64u;",
            "    for (var j = 0u; j < 16u; j++) {",
            f"        let i = (t + {THREADS}u * j) / 64u;",
            f"        let jj = (t + {THREADS}u * j) % 64u;",
            "        var v = 0.0;",
            f"        if (c0 + i < {cols}u && r0 + jj < {rows}u) {{ v = {x}[(c0 + i) * {x_cols}u + r0 + jj]; }}",
            "        block[i * 65u + jj] = v;",
            "    }",
            "    workgroupBarrier();",
            "    for (var j = 0u; j < 4u; j++) {",
            f"        let r = (t + {THREADS}u * j) / 16u;",
            f"        let c = (t + {THREADS}u * j) % 16u * 4u;",
            f"        let o = vec4<f32>({', '.join(column.format(q=q) for q in range(4))});",
            f"        let at = ((r0 + r) * {cols_p}u + c0 + c) / 4u;",
            f"        {store}",
            "    }",
        ]
    else:
        lines += [
            f"    for (var j = 0u; j < {SPLIT_UNITS}u; j++) {{",
            f"        let u = (b * {SPLIT_UNITS}u + j) * {THREADS}u + t;",
            f"        let r = u / {cols_p // 4}u;",
            f"        let c = u % {cols_p // 4}u * 4u;",
            f"        if (r < {rows_p}u) {{",
            "            var o = vec4<f32>(0.0);",
            f"            if (r < {rows}u) {{",
            "                for (var q = 0u; q < 4u; q++) {",
            f"                    if (c + q < {cols}u) {{ o[q] = {x}[r * {x_cols}u + c + q]; }}",
            "                }",
            "            }",
            f"            let at = (r * {cols_p}u + c) / 4u;",
            f"            {store}",
            "        }",
            "    }",
        ]
    return "\n    ".join([*lines, "}"])


def members_of(attrs: dict, operands: list[TensorType]) -> list[SplitMember]:
    """The members of a split_halves (attribute `transpose`) or multi_split_halves (`transposes`)
    node, from its operands' types: (tensor, maxima) pairs."""
    transposes = [attrs["transpose"]] if "transpose" in attrs else [bool(t) for t in attrs["transposes"]]
    pads = {"rows_to": attrs["rows_to"], "cols_to": attrs["cols_to"]}
    return [SplitMember(operands[2 * i], operands[2 * i + 1].numel, t, **pads) for i, t in enumerate(transposes)]


def split_workgroups(attrs: dict, operands, results) -> int:
    return sum(member.workgroups for member in members_of(attrs, list(operands)))


def read_bindings(nodes: list[int], prefix: str) -> tuple[list[Binding], dict[int, str]]:
    """A read binding per distinct node, named prefix0, prefix1…; the name of each."""
    names: dict[int, str] = {}
    for node in nodes:
        names.setdefault(node, f"{prefix}{len(names)}")
    return [Binding(name, node, "read") for node, name in names.items()], names


def declarations(bindings: list[Binding], outputs: str) -> str:
    """The WGSL bindings: reads as f32 arrays, the results as arrays of `outputs`."""
    lines = []
    for index, binding in enumerate(bindings):
        element, access = ("f32", "read") if binding.access == "read" else (outputs, "read_write")
        lines.append(f"@group(0) @binding({index}) var<storage, {access}> {binding.name}: array<{element}>;")
    return "\n".join(lines)


@lowering("split_halves", "multi_split_halves", workgroups=split_workgroups)
def lower_split_halves(graph: Graph, node: Node) -> KernelSpec:
    """The splits of one node's members in one dispatch (shaders/split_halves.wgsl)."""
    pairs = zip(node.inputs[::2], node.inputs[1::2], strict=True)
    kinds = members_of(node.attr_dict, [graph[i].type for i in node.inputs])
    members = [(member, x, top) for member, (x, top) in zip(kinds, pairs, strict=True)]
    data, data_names = read_bindings([x for _, x, _ in members], "x")
    tops, top_names = read_bindings([top for _, _, top in members], "top")
    outputs = [Binding(f"out{i}", node.id, "read_write", i) for i in range(len(members))]
    grid = grid_for(sum(member.workgroups for member, _, _ in members))
    code, first = [], 0
    for i, (member, x, top) in enumerate(members):
        code.append(split_member(member, first, data_names[x], top_names[top], f"out{i}"))
        first += member.workgroups
    bindings = [*data, *tops, *outputs]
    values = {
        "BINDINGS": declarations(bindings, "vec2<u32>"),
        "GRID_X": grid[0],
        "MEMBERS": "\n    ".join(code),
        "BLOCKS": any(member.transpose for member, _, _ in members),
    }
    shown = ", ".join(f"{'x'.join(map(str, m.sizes[:2]))}{'ᵀ' * m.transpose}" for m, _, _ in members)
    label = f"{node.op} {shown}"
    return KernelSpec(node.id, label, render("split_halves", values), "split_halves", tuple(bindings), grid,
                      (THREADS, 1, 1), results=len(members))  # fmt: skip


def top_member(x: str, out: str, parts: int, row: int, first: int) -> str:
    """WGSL of one member's partial maxima: a workgroup per row of `row` elements."""
    return "\n    ".join([
        f"if (w >= {first}u && w < {first + parts}u) {{",
        f"    let r = w - {first}u;",
        "    var m = 0.0;",
        f"    for (var e = t; e < {row}u; e += {THREADS}u) {{ m = max(m, abs({x}[r * {row}u + e])); }}",
        "    let top = combine(m, t, true);",
        f"    if (t == 0u) {{ {out}[r] = top; }}",
        "}",
    ])  # fmt: skip


@lowering("multi_top", workgroups=lambda attrs, operands, results: sum(attrs["parts"]))
def lower_multi_top(graph: Graph, node: Node) -> KernelSpec:
    """The partial maxima of |x| of several tensors in one dispatch (shaders/multi_top.wgsl)."""
    parts = node.attr("parts")
    data, names = read_bindings(list(node.inputs), "x")
    outputs = [Binding(f"out{i}", node.id, "read_write", i) for i in range(len(parts))]
    code, first = [], 0
    for i, (x, count) in enumerate(zip(node.inputs, parts, strict=True)):
        code.append(top_member(names[x], f"out{i}", count, graph[x].type.numel // count, first))
        first += count
    grid = grid_for(first)
    bindings = [*data, *outputs]
    values = {"BINDINGS": declarations(bindings, "f32"), "GRID_X": grid[0], "MEMBERS": "\n    ".join(code)}
    label = f"multi_top of {len(parts)} tensors ({sum(graph[x].type.numel for x in node.inputs):,} elements)"
    return KernelSpec(node.id, label, render("multi_top", values), "multi_top", tuple(bindings), grid,
                      (THREADS, 1, 1), results=len(parts))  # fmt: skip
