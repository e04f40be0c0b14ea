"""Lowering: one IR node to one KernelSpec (WGSL text, bindings, grid), by a table op → function.

Each lowering function reads the node's shapes and attributes, bakes them into a template from
`shaders/` and lists the buffers the kernel binds. Elementwise values (the unary and binary ops,
`pointwise`, matmul epilogues, reduction prologues/epilogues) are expression trees turned into
WGSL by `codegen/expressions.py`. Scalar constants (a `const` node, or a reshape of one) are
inlined as WGSL literals where the kernel reads them elementwise, so they need no buffer;
anywhere else they are bound like any other value and the buffer plan gives them a buffer
holding the constant.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from meganeura.codegen.expressions import (
    BINARY_WGSL,
    UNARY_WGSL,
    expr_to_wgsl,
    helper_functions,
    literal,
)
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.render import render
from meganeura.ir.expr import Expr, variables
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node
from meganeura.ir.ops import CAUSAL_MASK_VALUE, launches_kernel, matmul_a_view, matmul_dims, normalize_axes

MAX_WORKGROUPS_PER_DIM = 65535  # WebGPU's default maxComputeWorkgroupsPerDimension


# ---------------------------------------------------------------------------------------------
# Values: aliases, constants, literals


def alias_root(graph: Graph, node_id: int) -> int:
    """The node whose buffer holds `node_id`'s data: reshapes are views of their input."""
    while graph[node_id].op == "reshape":
        node_id = graph[node_id].inputs[0]
    return node_id


def constant_value(graph: Graph, node_id: int) -> float | int | None:
    """The scalar a value always holds (a const, or a reshape of one), else None."""
    root = graph[alias_root(graph, node_id)]
    return root.attr("value") if root.op == "const" else None


def wgsl_type(dtype: str) -> str:
    return {"f32": "f32", "i32": "i32"}[dtype]


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def broadcast_strides(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a row-major `shape` seen through broadcasting to `out_shape` (0 on broadcast dims)."""
    padded = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides = row_major_strides(padded)
    return tuple(0 if d == 1 and o != 1 else s for d, o, s in zip(padded, out_shape, strides, strict=True))


def index_expr(var: str, sizes: tuple[int, ...], strides: tuple[int, ...]) -> str:
    """WGSL for Σ_d coord_d · strides[d], where `var` is a row-major index over `sizes`.

    Adjacent dims that are contiguous (or both broadcast) are merged first, so the common cases
    come out as `i`, `i % 128u` or `0u`.
    """
    merged: list[tuple[int, int]] = []
    for size, stride in zip(sizes, strides, strict=True):
        if size == 1:
            continue
        if merged and merged[-1][1] == stride * size:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    terms, inner = [], 1
    for position in range(len(merged) - 1, -1, -1):
        size, stride = merged[position]
        coord = var if inner == 1 else f"({var} / {inner}u)"
        if position > 0:  # the outermost coordinate needs no wrap: `var` is in range
            coord = f"({coord} % {size}u)"
        if stride:
            terms.append(coord if stride == 1 else f"{coord} * {stride}u")
        inner *= size
    return " + ".join(reversed(terms)) or "0u"


def grid_for(workgroups: int) -> tuple[int, int, int]:
    """A dispatch grid of `workgroups`, folded into y when x would exceed the per-dimension limit."""
    x = max(1, min(workgroups, MAX_WORKGROUPS_PER_DIM))
    return (x if workgroups else 0, -(-workgroups // x) if workgroups else 1, 1)


def bindings_wgsl(graph: Graph, bindings: list[Binding]) -> str:
    """The WGSL declarations of `bindings`, numbered in order, all in group 0."""
    lines = []
    for index, binding in enumerate(bindings):
        access = "read" if binding.access == "read" else "read_write"
        element = wgsl_type(graph[binding.value].dtype)
        lines.append(f"@group(0) @binding({index}) var<storage, {access}> {binding.name}: array<{element}>;")
    return "\n".join(lines)


class Operands:
    """The buffers a kernel reads elementwise: one read binding per distinct value, named `x0`, `x1`…
    in order of first use, and literals instead of bindings for scalar constants."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.bindings: list[Binding] = []
        self.names: dict[int, str] = {}

    def read_at(self, node_id: int, index: str) -> str:
        """A WGSL expression for input `node_id` at buffer index `index` (a literal for constants)."""
        node = self.graph[node_id]
        value = constant_value(self.graph, node_id)
        if value is not None:
            return literal(value, node.dtype)
        if node_id not in self.names:
            self.names[node_id] = f"x{len(self.bindings)}"
            self.bindings.append(Binding(self.names[node_id], node_id, "read"))
        return f"{self.names[node_id]}[{index}]"

    def read(self, node_id: int, out_shape: tuple[int, ...], var: str = "i") -> str:
        """Input `node_id` at row-major output element `var`, broadcast to `out_shape`."""
        if constant_value(self.graph, node_id) is not None:
            return self.read_at(node_id, "")
        node = self.graph[node_id]
        return self.read_at(node_id, index_expr(var, out_shape, broadcast_strides(node.shape, out_shape)))


def sum_terms(*terms: str) -> str:
    """WGSL u32 sum of index terms, leaving out zeros."""
    kept = [term for term in terms if term != "0u"]
    return " + ".join(kept) or "0u"


def expression_code(tree: Expr, read: Callable[[str], str]) -> tuple[str, str]:
    """(`let` statements, f32 expression) computing `tree`, where `read(name)` is the WGSL of `$name`.

    A buffer read becomes one `let` (so an input that the expression uses twice is loaded once);
    literals and plain names are inlined.
    """
    names = sorted(variables(tree), key=lambda name: (not name.isdigit(), int(name) if name.isdigit() else 0, name))
    lets, values = [], {}
    for name in names:
        text = read(name)
        if "[" in text:
            lets.append(f"let v_{name} = {text};")
            text = f"v_{name}"
        values[name] = text
    return "\n    ".join(lets), expr_to_wgsl(tree, values.__getitem__)


def output_binding(node: Node) -> Binding:
    return Binding("out", node.id, "read_write")


# The attributes a fused node may carry: anything else (e.g. the retired `activation` of
# fused_matmul) would be silently ignored by the kernel, so it is refused instead.
FUSED_ATTRS = {
    "fused_matmul": {"transpose_a", "transpose_b", "epilogue", "prologue", "flatten_a"},
    "pointwise": {"expr", "shape"},
    "fused_reduce": {"kind", "axes", "keepdim", "in_shape", "prologue", "epilogue"},
}


def check_fused_attrs(node: Node) -> None:
    unknown = sorted(set(node.attr_dict) - FUSED_ATTRS.get(node.op, set(node.attr_dict)))
    if unknown:
        raise NotImplementedError(
            f"{node.op} %{node.id} has attributes {unknown} that its kernel does not implement "
            f"(it reads {sorted(FUSED_ATTRS[node.op])})"
        )


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


# ---------------------------------------------------------------------------------------------
# One thread per output element: unary, binary, broadcast_to, pointwise, permute

VALUE_0: Expr = ("$", "0")


def lower_elementwise(graph: Graph, node: Node) -> KernelSpec:
    """A unary or binary op, or broadcast_to: a one-function `pointwise` kernel."""
    if node.op in UNARY_WGSL:
        tree: Expr = (node.op, VALUE_0)
    elif node.op in BINARY_WGSL:
        tree = (node.op, VALUE_0, ("$", "1"))
    else:  # broadcast_to (f32 or i32)
        tree = VALUE_0
    return thread_per_element(graph, node, tree, f"{node.op} {shape_text(node.shape)}")


def lower_pointwise(graph: Graph, node: Node) -> KernelSpec:
    """`pointwise`: one expression over inputs broadcast to the output shape."""
    text = node.attr("expr")
    return thread_per_element(graph, node, parse_expr(text), f"pointwise {shape_text(node.shape)} {text}")


def thread_per_element(graph: Graph, node: Node, tree: Expr, label: str) -> KernelSpec:
    """out[i] = tree($0, $1, … at i), the inputs broadcast to the output shape by index expressions."""
    operands = Operands(graph)
    reads, value = expression_code(tree, lambda name: operands.read(node.inputs[int(name)], node.shape))
    return elementwise_kernel(graph, node, operands, reads, value, helper_functions([tree]), label)


def lower_permute(graph: Graph, node: Node) -> KernelSpec:
    """`permute` (any rank, any dtype): output element i reads the input at its permuted index."""
    source = graph[node.inputs[0]]
    perm = tuple(node.attr("perm"))
    strides = row_major_strides(source.shape)
    operands = Operands(graph)
    value = operands.read_at(source.id, index_expr("i", node.shape, tuple(strides[p] for p in perm)))
    label = f"permute {shape_text(source.shape)} perm={perm}"
    return elementwise_kernel(graph, node, operands, "", value, "", label)


def elementwise_kernel(
    graph: Graph, node: Node, operands: Operands, reads: str, value: str, functions: str, label: str
) -> KernelSpec:
    bindings = operands.bindings + [output_binding(node)]
    numel = node.type.numel
    grid = grid_for(-(-numel // 256))
    wgsl = render(
        "elementwise",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "NUMEL": numel,
            "GRID_X": max(grid[0], 1),
            "FUNCTIONS": functions,
            "READS": reads,
            "VALUE": value,
        },
    )
    return KernelSpec(node.id, label, wgsl, "elementwise", tuple(bindings), grid, (256, 1, 1))


# ---------------------------------------------------------------------------------------------
# Matmul and fused_matmul


def matmul_tiling(m: int, n: int, batch: int = 1) -> dict[str, int]:
    """Workgroup shape and register tile: the smallest tile that covers small outputs, 64×64 for
    most, 64×128 when there are workgroups enough to fill a large GPU anyway (measured on an H200:
    13 TFLOP/s for 64×64 and 16 for 64×128 at 4096³; 64×64 wins at 1024³)."""
    bm = next((size for size in (8, 16, 32) if m <= size), 64)
    bn = next((size for size in (16, 32) if n <= size), 64)
    if bm == 64 and batch * -(-m // 64) * -(-n // 128) >= 512:
        bn = 128
    wg_y, tm = {8: (8, 1), 16: (8, 2), 32: (16, 2), 64: (16, 4)}[bm]
    wg_x, nv = {16: (4, 1), 32: (8, 1), 64: (16, 1), 128: (16, 2)}[bn]
    return {"WG_X": wg_x, "WG_Y": wg_y, "TM": tm, "NV": nv, "BK": 16}


def register_tile(tm: int, nv: int, wg_x: int, wg_y: int) -> dict[str, str]:
    """The unrolled per-thread code of matmul.wgsl: TM × NV vec4 accumulators, their update, their store."""
    pairs = [(i, j) for i in range(tm) for j in range(nv)]
    declare = [f"var acc_{i}_{j} = vec4<f32>(0.0);" for i, j in pairs]
    loads = [f"let b_{j} = tile_b[b_row + {j * wg_x}u];" for j in range(nv)]
    loads += [f"let a_{i} = vec4<f32>(tile_a[a_row + {i * wg_y}u]);" for i in range(tm)]
    fmas = [f"acc_{i}_{j} = fma(a_{i}, b_{j}, acc_{i}_{j});" for i, j in pairs]
    stores = [f"store4(bat, row0 + {i * wg_y}u, col0 + {4 * j * wg_x}u, acc_{i}_{j});" for i, j in pairs]
    return {
        "ACCUMULATORS": "\n    ".join(declare),
        "MULTIPLY": "\n            ".join(loads + fmas),
        "STORE": "\n    ".join(stores),
    }


def lower_matmul(graph: Graph, node: Node) -> KernelSpec:
    """Tiled, register-blocked, batched matmul with transposes, a prologue and an epilogue expression.

    `fused_matmul` inputs are (a, b, *extras); its `epilogue` reads `$acc` and the extras `$0…`,
    each broadcast to the output [*batch, M, N] and indexed by the element's (bat, row, col).
    Its `prologue` reads `$a`, the stored element of A, and extras broadcast to A's stored shape,
    indexed by the element's stored coordinates (row k, column m when A is transposed); it runs
    while A's tile is staged, so the A the product uses is never written. With `flatten_a` the
    stored A [..., K] is the matrix of its rows: a row index runs over all its leading dims.
    """
    a, b, *extras = node.inputs
    transpose_a = bool(node.attr("transpose_a", False))
    transpose_b = bool(node.attr("transpose_b", False))
    flatten_a = bool(node.attr("flatten_a", False))
    a_view = matmul_a_view(graph[a].type, node.attr_dict)
    batch, m, k, n = matmul_dims([a_view, graph[b].type], node.attr_dict, node.op)
    batches = math.prod(batch)
    epilogue_text = node.attr("epilogue", "$acc") if node.op == "fused_matmul" else "$acc"
    prologue_text = node.attr("prologue", "$a") if node.op == "fused_matmul" else "$a"
    tree = parse_expr(epilogue_text)
    prologue_tree = parse_expr(prologue_text)
    operands = Operands(graph)

    def read(name: str) -> str:
        if name == "acc":
            return "x"
        extra = extras[int(name)]
        strides = broadcast_strides(graph[extra].shape, node.shape)
        index = sum_terms(
            index_expr("bat", batch, strides[:-2]),
            index_expr("row", (m,), strides[-2:-1]),
            index_expr("col", (n,), strides[-1:]),
        )
        return operands.read_at(extra, index)

    stored_rows, stored_cols = ("k", "m") if transpose_a else ("m", "k")
    a_shape = graph[a].shape
    a_batch = a_view.shape[:-2]  # () when A is 2-D and shared by every matrix of the batch
    # A stored row: one index over the dims before the last (all of them when A is flattened).
    row_dims = a_shape[:-1] if flatten_a else a_shape[-2:-1]

    def read_for_a(name: str) -> str:
        if name == "a":
            return "x"
        extra = extras[int(name)]
        strides = broadcast_strides(graph[extra].shape, a_shape)
        index = sum_terms(
            index_expr("bat", a_batch, strides[: len(a_batch)]),
            index_expr(stored_rows, row_dims, strides[len(a_batch) : -1]),
            index_expr(stored_cols, a_shape[-1:], strides[-1:]),
        )
        return operands.read_at(extra, index)

    reads, epilogue = expression_code(tree, read)
    a_reads, prologue = expression_code(prologue_tree, read_for_a)
    bindings = [Binding("a", a, "read"), Binding("b", b, "read"), *operands.bindings, output_binding(node)]
    tiling = matmul_tiling(m, n, batches)
    bm, bn = tiling["WG_Y"] * tiling["TM"], tiling["WG_X"] * tiling["NV"] * 4
    tiles_m = -(-m // bm)
    rows_grid = grid_for(tiles_m * batches)  # (row tile, batch) pairs, folded over y and z
    wgsl = render(
        "matmul",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "M": m,
            "N": n,
            "K": k,
            "TILES_M": tiles_m,
            "TILES": tiles_m * batches,
            "GRID_Y": max(rows_grid[0], 1),
            **tiling,
            # Stage along the operand's contiguous axis so neighbouring threads read neighbouring words.
            # A 2-D operand beside a batched one is shared: the same matrix for every batch.
            "A_BATCH_STRIDE": "(M * K)" if len(a_batch) else "0u",
            "B_BATCH_STRIDE": "(K * N)" if len(graph[b].shape) > 2 else "0u",
            "A_INDEX": "k * M + m" if transpose_a else "m * K + k",
            "A_STAGE": "let k = s / BM; let m = s % BM;" if transpose_a else "let m = s / BK; let k = s % BK;",
            "B_INDEX": "n * K + k" if transpose_b else "k * N + n",
            "B_STAGE": "let n = s / BK; let k = s % BK;" if transpose_b else "let k = s / BN; let n = s % BN;",
            "FUNCTIONS": helper_functions([tree, prologue_tree]),
            "A_READS": a_reads,
            "PROLOGUE": prologue,
            "READS": reads,
            "EPILOGUE": epilogue,
            **register_tile(tiling["TM"], tiling["NV"], tiling["WG_X"], tiling["WG_Y"]),
        },
    )
    label = f"{node.op} {shape_text(batch) + '×' if batch else ''}{m}x{k}x{n}"
    label += " Aᵀ" * transpose_a + " Bᵀ" * transpose_b + ("" if epilogue_text == "$acc" else f" {epilogue_text}")
    label += "" if prologue_text == "$a" else f" A={prologue_text}"
    grid = (-(-n // bn), rows_grid[0], rows_grid[1])
    return KernelSpec(node.id, label, wgsl, "matmul", tuple(bindings), grid, (tiling["WG_X"], tiling["WG_Y"], 1))


# ---------------------------------------------------------------------------------------------
# Reductions: sum, max, fused_reduce

REDUCE_INIT = {"sum": "0.0", "max": literal(float("-inf"))}
REDUCE_COMBINE = {"sum": "a + b", "max": "max(a, b)"}


def reduce_plan(outs: int, r: int, innermost_reduced: bool) -> tuple[str, int]:
    """(entry point, workgroup size): a workgroup per output for long rows, a thread per output otherwise.

    A workgroup per output wins when the reduction is long and contiguous (the workgroup reads
    one row together) or when there are too few outputs to fill the device; a thread per output
    wins for short reductions over many outputs, where neighbouring threads read neighbours.
    """
    if r > 64 and (innermost_reduced or outs < 1024):
        return "reduce_tree", 256 if r >= 256 else 128
    return "reduce_serial", 64


def lower_reduce(graph: Graph, node: Node) -> KernelSpec:
    """`sum`, `max` or `fused_reduce` over any axes: kept dims index the output, reduced dims are
    combined. `fused_reduce` reduces prologue($0, $1, … broadcast to in_shape) and writes epilogue($r)."""
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
    outs, r = math.prod(kept_sizes), math.prod(reduced_sizes)
    operands = Operands(graph)

    def read(name: str) -> str:
        source = node.inputs[int(name)]
        strides = broadcast_strides(graph[source].shape, in_shape)
        base = index_expr("o", kept_sizes, tuple(strides[d] for d in kept))
        offset = index_expr("r", reduced_sizes, tuple(strides[d] for d in axes))
        return operands.read_at(source, sum_terms(base, offset))

    reads, value = expression_code(prologue, read)
    _, finish = expression_code(epilogue, lambda name: "value")
    entry, wg = reduce_plan(outs, r, bool(in_shape) and (len(in_shape) - 1) in axes)
    grid = grid_for(outs if entry == "reduce_tree" else -(-outs // wg))
    bindings = operands.bindings + [output_binding(node)]
    wgsl = render(
        "reduce",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "OUTS": outs,
            "R": r,
            "WG": wg,
            "GRID_X": max(grid[0], 1),
            "FUNCTIONS": helper_functions([prologue, epilogue]),
            "READS": reads,
            "PROLOGUE": value,
            "INIT": REDUCE_INIT[kind],
            "COMBINE": REDUCE_COMBINE[kind],
            "EPILOGUE": finish,
        },
    )
    keep = ", keepdim" if node.attr("keepdim", False) else ""
    label = f"{kind} {shape_text(in_shape)} axes={axes}{keep} ({entry})"
    if node.op == "fused_reduce":
        label = f"fused_reduce {label} of {prologue_text} then {epilogue_text}"
    return KernelSpec(node.id, label, wgsl, entry, tuple(bindings), grid, (wg, 1, 1))


# ---------------------------------------------------------------------------------------------
# Cross-entropy


def lower_cross_entropy(graph: Graph, node: Node) -> KernelSpec:
    """Softmax cross-entropy per row (forward) or its gradient (backward): a workgroup per row."""
    logits, labels = node.inputs[:2]
    rows, classes = graph[logits].shape
    is_grad = node.op == "cross_entropy_rows_grad"
    bindings = [Binding("logits", logits, "read"), Binding("labels", labels, "read")]
    grad_at = "0.0"
    if is_grad:
        grad = node.inputs[2]
        value = constant_value(graph, grad)
        if value is not None:
            grad_at = literal(value)
        else:
            bindings.append(Binding("grad", grad, "read"))
            grad_at = "grad[row]"
    bindings.append(output_binding(node))
    wg = min(256, max(32, 1 << (classes - 1).bit_length()))
    grid = grid_for(rows)
    wgsl = render(
        "cross_entropy",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "ROWS": rows,
            "C": classes,
            "WG": wg,
            "GRID_X": max(grid[0], 1),
            "GRAD": is_grad,
            "GRAD_AT": grad_at,
        },
    )
    return KernelSpec(node.id, f"{node.op} {rows}x{classes}", wgsl, node.op, tuple(bindings), grid, (wg, 1, 1))


# ---------------------------------------------------------------------------------------------
# Softmax family along one axis (a workgroup per row), and label indexing (a thread per element)

ROW_OPS = ("softmax", "log_softmax", "softmax_grad", "log_softmax_grad")


def lower_rows(graph: Graph, node: Node) -> KernelSpec:
    """softmax, log_softmax or a gradient of one along any axis: rows are strided, never transposed."""
    shape = node.shape
    (axis,) = normalize_axes(node.attr("axis"), len(shape))
    classes, inner = shape[axis], math.prod(shape[axis + 1 :])
    rows = node.type.numel // max(classes, 1)
    names = ("y", "g") if node.op.endswith("_grad") else ("x",)
    bindings = [Binding(name, value, "read") for name, value in zip(names, node.inputs, strict=True)]
    bindings.append(output_binding(node))
    wg = min(256, max(32, 1 << (classes - 1).bit_length()))
    grid = grid_for(rows)
    values = {"BINDINGS": bindings_wgsl(graph, bindings), "ROWS": rows, "C": classes, "INNER": inner}
    flags = {op.upper(): op == node.op for op in ROW_OPS}
    flags["FORWARD"] = not node.op.endswith("_grad")
    wgsl = render("softmax", {**values, "WG": wg, "GRID_X": max(grid[0], 1), **flags})
    label = f"{node.op} {shape_text(shape)} axis={axis}"
    return KernelSpec(node.id, label, wgsl, node.op, tuple(bindings), grid, (wg, 1, 1))


NAN = literal(float("nan"))


def lower_pick(graph: Graph, node: Node) -> KernelSpec:
    """pick: out[i] = x[i, labels[i]] (NaN for a label outside [0, classes))."""
    x, labels = node.inputs
    classes = graph[x].shape[1]
    operands = Operands(graph)
    value = operands.read_at(x, f"i * {classes}u + min(u32(label), {classes - 1}u)")
    reads = f"let label = {operands.read_at(labels, 'i')};"
    value = f"select({NAN}, {value}, label >= 0i && label < {classes}i)"
    return elementwise_kernel(graph, node, operands, reads, value, "", f"pick {shape_text(graph[x].shape)}")


def lower_scatter_rows(graph: Graph, node: Node) -> KernelSpec:
    """scatter_rows: out[i, c] = g[i] where c == labels[i], else 0 (a row of NaN for a bad label)."""
    g, labels = node.inputs
    classes = node.shape[1]
    operands = Operands(graph)
    reads = f"let row = i / {classes}u;\n    let label = {operands.read_at(labels, 'row')};"
    hit = f"select(0.0, {operands.read_at(g, 'row')}, i32(i % {classes}u) == label)"
    value = f"select({NAN}, {hit}, label >= 0i && label < {classes}i)"
    return elementwise_kernel(graph, node, operands, reads, value, "", f"scatter_rows {shape_text(node.shape)}")


def lower_gather(graph: Graph, node: Node) -> KernelSpec:
    """gather (embedding lookup): out[j, c] = table[ids[j], c] (NaN for an id outside [0, num))."""
    table, ids = node.inputs
    num, dim = graph[table].shape
    operands = Operands(graph)
    reads = f"let row = i / {dim}u;\n    let sel = {operands.read_at(ids, 'row')};"
    value = operands.read_at(table, f"min(u32(sel), {num - 1}u) * {dim}u + i % {dim}u")
    value = f"select({NAN}, {value}, sel >= 0i && sel < {num}i)"
    return elementwise_kernel(graph, node, operands, reads, value, "", f"gather {shape_text(node.shape)}")


def lower_scatter_add(graph: Graph, node: Node) -> KernelSpec:
    """scatter_add (gather's gradient), deterministic and without atomics: one thread per (row,
    column) of the [num, dim] table scans all n ids and sums, in order, the gradient rows whose
    id selects its row. It reads n·num·dim ids (from cache: every thread reads the same ones) and
    n·dim gradient values in all, so it costs O(n·num) per column: cheap for a small vocabulary
    (a character LM), quadratic-ish for large vocabularies × long batches (a sort by id, then a
    segmented sum, would be the next step)."""
    g, ids = node.inputs
    dim = node.shape[1]
    n = graph[ids].type.numel
    operands = Operands(graph)
    ids_at, g_at = operands.read_at(ids, "j"), operands.read_at(g, f"j * {dim}u + col")
    reads = (
        f"let row = i32(i / {dim}u);\n    let col = i % {dim}u;\n    var total = 0.0;\n"
        f"    for (var j = 0u; j < {n}u; j++) {{\n"
        f"        if ({ids_at} == row) {{\n            total += {g_at};\n        }}\n    }}"
    )
    label = f"scatter_add {shape_text(graph[g].shape)} -> {shape_text(node.shape)}"
    return elementwise_kernel(graph, node, operands, reads, "total", "", label)


def lower_causal_mask(graph: Graph, node: Node) -> KernelSpec:
    """causal_mask [rows, cols]: 0 where col ≤ row, CAUSAL_MASK_VALUE above the diagonal."""
    rows, cols = node.shape
    reads = f"let row = i / {cols}u;\n    let col = i % {cols}u;"
    value = f"select(0.0, {CAUSAL_MASK_VALUE:.1f}, col > row)"
    return elementwise_kernel(graph, node, Operands(graph), reads, value, "", f"causal_mask [{rows},{cols}]")


def lower_slice(graph: Graph, node: Node) -> KernelSpec:
    """slice (any rank, any dtype): output element i reads the input at start + coordinate·step per dim."""
    source = graph[node.inputs[0]]
    starts, steps = node.attr("starts"), node.attr("steps")
    strides = row_major_strides(source.shape)
    offset = sum(a * s for a, s in zip(starts, strides, strict=True))
    operands = Operands(graph)
    stepped = tuple(s * t for s, t in zip(strides, steps, strict=True))
    index = sum_terms(index_expr("i", node.shape, stepped), f"{offset}u")
    value = operands.read_at(source.id, index)
    spans = ",".join(f"{a}:{b}:{s}" for a, b, s in zip(starts, node.attr("stops"), steps, strict=True))
    return elementwise_kernel(graph, node, operands, "", value, "", f"slice {shape_text(source.shape)}[{spans}]")


def lower_slice_grad(graph: Graph, node: Node) -> KernelSpec:
    """slice_grad: a thread per element of the sliced tensor's shape writes g there when the
    element lies on the slice, else 0."""
    g = node.inputs[0]
    starts, stops, steps = node.attr("starts"), node.attr("stops"), node.attr("steps")
    shape, g_strides = node.shape, row_major_strides(graph[g].shape)
    operands = Operands(graph)
    lines, conditions, terms, inner = [], [], [], 1
    for d in range(len(shape) - 1, -1, -1):
        size, start, stop, step = shape[d], starts[d], stops[d], steps[d]
        if (start, stop, step) == (0, size, 1) and size == 1:
            continue
        coord = "i" if inner == 1 else f"(i / {inner}u)"
        lines.append(f"let c{d} = {coord if d == 0 else f'({coord} % {size}u)'};")
        if (start, stop, step) != (0, size, 1):
            conditions.append(f"c{d} >= {start}u && c{d} < {stop}u")
            if step != 1:
                conditions.append(f"(c{d} - {start}u) % {step}u == 0u")
        position = f"c{d}" if start == 0 else f"(c{d} - {start}u)"
        position = position if step == 1 else f"({position} / {step}u)"
        terms.append(position if g_strides[d] == 1 else f"{position} * {g_strides[d]}u")
        inner *= size
    index = " + ".join(reversed(terms)) or "0u"
    lines.append(f"let on_slice = {' && '.join(conditions) or 'true'};")
    lines.append(f"var value = 0.0;\n    if (on_slice) {{\n        value = {operands.read_at(g, index)};\n    }}")
    spans = ",".join(f"{a}:{b}:{s}" for a, b, s in zip(starts, stops, steps, strict=True))
    label = f"slice_grad {shape_text(shape)}[{spans}]"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "value", "", label)


def lower_concat(graph: Graph, node: Node) -> KernelSpec:
    """concat (any dtype) along `axis`: output element i reads the input its axis coordinate falls in."""
    axis, shape = node.attr("axis"), node.shape
    inner, total = math.prod(shape[axis + 1 :]), shape[axis]
    operands = Operands(graph)
    lines = [
        f"let a = (i / {inner}u) % {total}u;",
        f"let outer = i / {inner * total}u;",
        f"let inner = i % {inner}u;",
        f"var value: {wgsl_type(node.dtype)};",
    ]
    offset = 0
    for position, x in enumerate(node.inputs):
        size = graph[x].shape[axis]
        index = f"outer * {size * inner}u + (a - {offset}u) * {inner}u + inner"
        read = f"value = {operands.read_at(x, index)};"
        if position == len(node.inputs) - 1:
            lines.append(f"{'else ' if position else ''}{{\n        {read}\n    }}")
        else:
            lines.append(f"{'else ' if position else ''}if (a < {offset + size}u) {{\n        {read}\n    }}")
        offset += size
    label = f"concat {' '.join(shape_text(graph[x].shape) for x in node.inputs)} axis={axis}"
    return elementwise_kernel(graph, node, operands, "\n    ".join(lines), "value", "", label)


# ---------------------------------------------------------------------------------------------
# Optimizer updates


def updates_in_place(graph: Graph, node: Node, users: dict[int, list[int]] | None = None) -> bool:
    """Whether `node` may overwrite its first input's buffer: it must be that leaf's update and
    no one may need the leaf's old value after it (a reader downstream of `node`, an output)."""
    target = graph[node.inputs[0]]
    if target.op not in ("param", "state") or graph.updates.get(target.attr("name")) != node.id:
        return False
    if any(alias_root(graph, i) == target.id for i in list(node.inputs[1:]) + list(graph.outputs.values())):
        return False
    users = users if users is not None else graph.users()
    readers, stack = set(), [target.id]
    while stack:  # every reader of the leaf's buffer, through reshapes
        for user in users[stack.pop()]:
            if graph[user].op == "reshape":
                stack.append(user)
            elif user != node.id:
                readers.add(user)
    downstream, stack = set(), [node.id]
    while stack:
        for user in users[stack.pop()]:
            if user not in downstream:
                downstream.add(user)
                stack.append(user)
    return not (readers & downstream)


OPTIMIZER_HYPERS = {
    "sgd_step": ("lr", "weight_decay"),
    "momentum_buffer": ("momentum", "weight_decay"),
    "adam_moment": ("beta", "weight_decay"),
    "adam_step": ("lr", "beta1", "beta2", "eps", "weight_decay"),
}


def lower_optimizer(graph: Graph, node: Node, users: dict[int, list[int]] | None = None) -> KernelSpec:
    """An elementwise optimizer update, in place on the parameter/state it replaces when allowed."""
    inplace = updates_in_place(graph, node, users)
    operands = Operands(graph)
    values = {}
    for position, input_id in enumerate(node.inputs):
        if position == 0 and inplace:
            values["V0"] = "out[i]"
        else:
            values[f"V{position}"] = operands.read(input_id, node.shape)
    bindings = operands.bindings + [output_binding(node)]
    hypers = {name.upper(): literal(node.attr(name, 0.0)) for name in OPTIMIZER_HYPERS[node.op]}
    flags = {op.upper(): op == node.op for op in OPTIMIZER_HYPERS}
    numel = node.type.numel
    grid = grid_for(-(-numel // 256))
    wgsl = render(
        "optimizer",
        {
            "BINDINGS": bindings_wgsl(graph, bindings),
            "NUMEL": numel,
            "GRID_X": max(grid[0], 1),
            **values,
            **hypers,
            **flags,
            "G_POWER": "g" if node.attr("order", 1) == 1 else "g * g",
        },
    )
    label = f"{node.op} {shape_text(node.shape)}{' in place' if inplace else ''}"
    return KernelSpec(
        node.id,
        label,
        wgsl,
        "optimizer_update",
        tuple(bindings),
        grid,
        (256, 1, 1),
        inplace_input=node.inputs[0] if inplace else None,
    )


# ---------------------------------------------------------------------------------------------
# The table


LOWERINGS: dict[str, Callable[..., KernelSpec]] = {
    **{op: lower_elementwise for op in (*UNARY_WGSL, *BINARY_WGSL, "broadcast_to")},
    "matmul": lower_matmul,
    "fused_matmul": lower_matmul,
    "pointwise": lower_pointwise,
    "permute": lower_permute,
    "sum": lower_reduce,
    "max": lower_reduce,
    "fused_reduce": lower_reduce,
    "cross_entropy_rows": lower_cross_entropy,
    "cross_entropy_rows_grad": lower_cross_entropy,
    **{op: lower_rows for op in ROW_OPS},
    "pick": lower_pick,
    "scatter_rows": lower_scatter_rows,
    "gather": lower_gather,
    "scatter_add": lower_scatter_add,
    "slice": lower_slice,
    "causal_mask": lower_causal_mask,
    "slice_grad": lower_slice_grad,
    "concat": lower_concat,
    **{op: lower_optimizer for op in OPTIMIZER_HYPERS},
}


def lower_node(
    graph: Graph, node_id: int, users: dict[int, list[int]] | None = None, siblings: tuple[int, ...] = ()
) -> KernelSpec:
    """The kernel that computes node `node_id` (pass `users` = graph.users() to save recomputing it),
    and the `siblings` it computes too (attention only, see `sibling_kernels`)."""
    node = graph[node_id]
    if siblings:
        return lower_attention(graph, node, siblings)
    lowering = LOWERINGS.get(node.op)
    check_fused_attrs(node)
    if lowering is None:
        raise NotImplementedError(
            f"no GPU kernel for op {node.op!r} (node %{node_id}); the code generator lowers {sorted(LOWERINGS)}"
        )
    if lowering is lower_optimizer:
        return lower_optimizer(graph, node, users)
    return lowering(graph, node)


def lower_graph(graph: Graph) -> list[KernelSpec]:
    """A kernel for every live node that computes something (not leaves, not reshapes), in graph
    order; a node that another node's kernel computes (`sibling_kernels`) has none of its own."""
    live = graph.live_ids()
    users = graph.users()
    launching = [n.id for n in graph if n.id in live and launches_kernel(n.op)]
    host_of = sibling_kernels(graph, launching)
    siblings_of: dict[int, list[int]] = {}
    for sibling, host in host_of.items():
        siblings_of.setdefault(host, []).append(sibling)
    return [
        lower_node(graph, node_id, users, tuple(siblings_of.get(node_id, ())))
        for node_id in launching
        if node_id not in host_of
    ]


# The plain image ops (unfold, fold) are lowered in their own module, which imports from this one.
from meganeura.codegen.lower_image import IMAGE_LOWERINGS  # noqa: E402

LOWERINGS.update(IMAGE_LOWERINGS)


# The implicit-GEMM convolution kernels live in their own module, which imports this one.
from meganeura.codegen.lower_conv import CONV_GEMM_ATTRS, lower_conv_gemm  # noqa: E402

LOWERINGS["conv_gemm"] = lower_conv_gemm
FUSED_ATTRS["conv_gemm"] = CONV_GEMM_ATTRS


# The pooling ops (max_pool2d, avg_pool2d and their gradients) are lowered in their own module.
from meganeura.codegen.lower_pool import POOL_LOWERINGS  # noqa: E402

LOWERINGS.update(POOL_LOWERINGS)


# The transformer ops (rope, attention) are lowered in their own module, which imports this one;
# lower_node and lower_graph call into it for the attention kernels that write two nodes.
from meganeura.codegen.lower_transformer import (  # noqa: E402
    TRANSFORMER_LOWERINGS,
    lower_attention,
    sibling_kernels,
)

LOWERINGS.update(TRANSFORMER_LOWERINGS)
