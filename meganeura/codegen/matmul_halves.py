"""The kernel of `split_matmul` (shaders/matmul_halves.wgsl): a product on the tensor cores from
operands split once (ir/ops/halves.py). The pass that makes these products is
passes/operand_splits.py; the splits' kernels are codegen/halves_split.py's.
"""

from __future__ import annotations

from meganeura.codegen.common import (
    Operands,
    bindings_wgsl,
    broadcast_strides,
    expression_code,
    grid_for,
    index_expr,
    output_binding,
    sum_terms,
)
from meganeura.codegen.expressions import helper_functions
from meganeura.codegen.gemm_operands import OperandTile, store4_function
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.registry import lowering
from meganeura.codegen.render import render
from meganeura.codegen.tensor_tiles import PAD, TensorTiling, subgroup_blocks, tensor_tiling
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.ops.halves import split_part
from meganeura.target import Target

SPLIT_PAD = 64  # the halves padded to multiples of this both ways: whole K tiles, and M/N tiles up to it


def halves_tiling(attrs: dict, a: TensorType, b: TensorType, target: Target) -> TensorTiling:
    """The tiling of a split product on `target`: tensor_tiles' choice by fill among the tilings
    that divide the padded halves (A's rows, B's columns)."""
    return tensor_tiling(attrs["m"], attrs["n"], attrs["splits"], target, padded=(a.shape[1], 2 * b.shape[2]))


def split_matmul_workgroups(attrs: dict, operands, results, target: Target) -> int:
    tiling = halves_tiling(attrs, operands[0], operands[2], target)
    return tiling.tiles(attrs["m"], attrs["n"], attrs["splits"])


def halves_loads(tiling: TensorTiling, kp: int, np_: int) -> tuple[list[str], list[str]]:
    """(the loads of a thread's units of one K tile into registers, their stores into workgroup
    memory): A's units four halves along K of a row, B's four along N of a k; hi and lo each."""
    loads, stores = [], []
    per_operand = (
        ("a", tiling.bm, tiling.bk // 4, kp // 4, tiling.bk + PAD),
        ("b", tiling.bk, tiling.bn // 4, np_ // 4, tiling.bn + PAD),
    )
    for name, rows, units_a_row, row_units, ld in per_operand:
        for j in range(rows * units_a_row // tiling.threads):
            slot = f"lid + {j * tiling.threads}u" if j else "lid"
            row, col = f"({slot}) / {units_a_row}u", f"({slot}) % {units_a_row}u"
            if name == "a":
                at = f"(m0 + {row}) * {row_units}u + k0 / 4u + {col}"
            else:
                at = f"(k0 + {row}) * {row_units}u + n0 / 4u + {col}"
            plane = "A_PLANE" if name == "a" else "B_PLANE"
            index = f"{name}{j}i"
            loads.append(
                f"let {index} = {at}; let {name}h{j} = {name}[{index}]; let {name}l{j} = {name}[{plane} + {index}];"
            )
            place = f"{row} * {ld}u + {col} * 4u"
            stores.append(
                f"{{ let s = {place}; "
                + " ".join(
                    f"{name}_{half}[s + {q}u] = {name}{half[0]}{j}.{c};"
                    for half in ("hi", "lo")
                    for q, c in enumerate("xyzw")
                )
                + " }"
            )
    return loads, stores


@lowering("split_matmul", workgroups=split_matmul_workgroups, per_target=True)
def lower_split_matmul(graph: Graph, node: Node, target: Target) -> KernelSpec:
    """The product of split operands on the tensor cores (shaders/matmul_halves.wgsl)."""
    a, a_top, b, b_top, *extras = node.inputs
    attrs = node.attr_dict
    m, k, n, splits = attrs["m"], attrs["k"], attrs["n"], attrs["splits"]
    shape = tuple(attrs["shape"])
    kp, np_ = 2 * graph[a].shape[2], 2 * graph[b].shape[2]
    tiling = halves_tiling(attrs, graph[a].type, graph[b].type, target)
    if graph[a].shape[1] % tiling.bm or np_ % tiling.bn or kp % tiling.bk:
        raise ValueError(
            f"split_matmul %{node.id}: halves {graph[a].type}, {graph[b].type} are not whole tiles of {tiling}"
        )
    operands = Operands(graph)
    tree = parse_expr(attrs["epilogue"])

    def read(name: str) -> str:
        if name == "acc":
            return "x"
        extra = extras[int(name)]
        strides = broadcast_strides(graph[extra].shape, shape)
        index = sum_terms(index_expr("row", shape[:-1], strides[:-1]), index_expr("col", (n,), strides[-1:]))
        return operands.read_at(extra, index)

    reads, epilogue = expression_code(tree, read)
    vector_out = n % 4 == 0
    bindings = [
        Binding("a", a, "read"),
        Binding("a_top", a_top, "read"),
        Binding("b", b, "read"),
        Binding("b_top", b_top, "read"),
        *operands.bindings,
        output_binding(node),
    ]
    declared = bindings_wgsl(graph, bindings, {"out"} if vector_out else set())
    declared = declared.replace("var<storage, read> a: array<i32>", "var<storage, read> a: array<vec4<f16>>")
    declared = declared.replace("var<storage, read> b: array<i32>", "var<storage, read> b: array<vec4<f16>>")
    tiles_m = -(-m // tiling.bm)
    rows_grid = grid_for(tiles_m * splits)
    op_a = OperandTile("a", "m", m, tiling.bm, False, True)
    op_b = OperandTile("b", "n", n, tiling.bn, True, True)
    loads, stores = halves_loads(tiling, kp, np_)
    values = {
        "BINDINGS": declared,
        "M": m,
        "N": n,
        "K": k,
        "BM": tiling.bm,
        "BN": tiling.bn,
        "BK": tiling.bk,
        "TILES_M": tiles_m,
        "TILES": tiles_m,
        "SPLITS": splits,
        "K_PART": split_part(k, splits),
        "GRID_Y": max(rows_grid[0], 1),
        "A_SCALAR": False,
        "B_SCALAR": False,
        "A_BATCH_STRIDE": "0u",
        "B_BATCH_STRIDE": "0u",
        "A_INDEX": "0u",
        "B_INDEX": "0u",
        "FUNCTIONS": helper_functions([tree]),
        "A_READS": "",
        "PROLOGUE": "x",
        "READS": reads,
        "EPILOGUE": epilogue,
        "STORE4": store4_function(m, n, tiling.bm, tiling.bn, vector_out),
        "KP": kp,
        "A_PLANE": graph[a].type.numel // 4,
        "B_PLANE": graph[b].type.numel // 4,
        "A_TOPS": graph[a_top].type.numel,
        "B_TOPS": graph[b_top].type.numel,
        "A_SIZE": tiling.staged_halves("a"),
        "B_SIZE": tiling.staged_halves("b"),
        "LOADS": "\n        ".join(loads),
        "STAGE": "\n        ".join(stores),
        **subgroup_blocks(op_a, op_b, tiling),
    }
    label = f"split_matmul {m}x{k}x{n}" + ("" if attrs["epilogue"] == "$acc" else f" {attrs['epilogue']}")
    label += f" in {splits} parts of K" if splits > 1 else ""
    grid = (-(-n // tiling.bn), rows_grid[0], rows_grid[1])
    return KernelSpec(
        node.id,
        label,
        render("matmul_halves", values),
        "matmul_halves",
        tuple(bindings),
        grid,
        (tiling.threads, 1, 1),
        workgroup_memory=tiling.workgroup_bytes,
    )
