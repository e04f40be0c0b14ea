"""What the kernel families share: how values are found in buffers, index arithmetic,
bindings, and the one-thread-per-element kernel most of them are built on.

Scalar constants (a `const` node, or a reshape of one) are inlined as WGSL literals where a
kernel reads them elementwise (`Operands`), so they need no buffer; anywhere else they are bound
like any other value and the buffer plan gives them a buffer holding the constant. An `element`
of a vector (a parameter group's hyper-parameters) is read from its vector's binding at a
literal offset, so a kernel reading several elements of one vector binds it once. A random
tensor drawn where it is read (`philox`) is computed at the index of the read, from the RNG state
leaf it binds instead (codegen/random.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from meganeura.codegen.expressions import expr_to_wgsl, literal
from meganeura.codegen.kernel import Binding, KernelSpec, Value
from meganeura.codegen.random import is_random, random_value
from meganeura.codegen.render import render
from meganeura.ir.expr import Expr, variables
from meganeura.ir.graph import Graph, Node
from meganeura.target import Target

# ---------------------------------------------------------------------------------------------
# Values: views, constants


def alias_root(graph: Graph, node_id: int) -> int:
    """The node whose buffer holds `node_id`'s data through reshapes (views of their input)."""
    while graph[node_id].op == "reshape":
        node_id = graph[node_id].inputs[0]
    return node_id


def storage(graph: Graph, node_id: int) -> Value:
    """(node, result index) of the buffer holding node `node_id`'s data: through reshapes, and
    `result` projections (views of one result of a node with several)."""
    node = graph[alias_root(graph, node_id)]
    if node.op == "result":
        return (node.inputs[0], node.attr("index"))
    return (node.id, 0)


def bound_value(graph: Graph, node_id: int) -> tuple[int, int]:
    """(the node a kernel binds to read `node_id`, the offset of `node_id`'s data in it): an
    `element` view is read from its vector, anything else from itself."""
    node = graph[node_id]
    if node.op == "element":
        return node.inputs[0], node.attr("index")
    return node_id, 0


def constant_value(graph: Graph, node_id: int) -> float | int | None:
    """The scalar a value always holds (a const, or a reshape of one), else None."""
    root = graph[alias_root(graph, node_id)]
    return root.attr("value") if root.op == "const" else None


def wgsl_type(dtype: str) -> str:
    return {"f32": "f32", "i32": "i32"}[dtype]


MAX_WORKGROUPS_PER_DIM = 65535  # WebGPU's default maxComputeWorkgroupsPerDimension


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


def coordinate(var: str, inner: int, size: int, outermost: bool) -> str:
    """WGSL for the coordinate of row-major index `var` along a dim of `size` whose steps are
    `inner` elements apart: (var / inner) % size, without the % on the outermost dim (`var` is in
    range)."""
    coord = var if inner == 1 else f"({var} / {inner}u)"
    return coord if outermost else f"({coord} % {size}u)"


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
        coord = coordinate(var, inner, size, position == 0)
        if stride:
            terms.append(coord if stride == 1 else f"{coord} * {stride}u")
        inner *= size
    return " + ".join(reversed(terms)) or "0u"


def grid_for(workgroups: int) -> tuple[int, int, int]:
    """A dispatch grid of `workgroups`, folded into y when x would exceed the per-dimension limit."""
    x = max(1, min(workgroups, MAX_WORKGROUPS_PER_DIM))
    return (x if workgroups else 0, -(-workgroups // x) if workgroups else 1, 1)


def bindings_wgsl(graph: Graph, bindings: list[Binding], vec4_names: set[str] = frozenset()) -> str:
    """The WGSL declarations of `bindings`, numbered in order, all in group 0; the f32 ones named in
    `vec4_names` as arrays of vec4 (a kernel that loads or stores them 16 bytes at a time)."""
    lines = []
    for index, binding in enumerate(bindings):
        access = "read" if binding.access == "read" else "read_write"
        element = wgsl_type(graph[binding.value].types[binding.index].dtype)
        element = f"vec4<{element}>" if binding.name in vec4_names else element
        lines.append(f"@group(0) @binding({index}) var<storage, {access}> {binding.name}: array<{element}>;")
    return "\n".join(lines)


class Operands:
    """The buffers a kernel reads elementwise: one read binding per distinct value, named `x0`, `x1`…
    in order of first use, and literals instead of bindings for scalar constants; the elements of
    one vector share its binding (`bound_value`)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.bindings: list[Binding] = []
        self.names: dict[int, str] = {}

    def bound(self, node_id: int, name: str) -> None:
        """`node_id` is already bound as `name` (a matmul's `a` or `b`): read it there, so that a
        kernel binds each buffer once (its bindings are the distinct values it reads)."""
        self.names.setdefault(node_id, name)

    def read_at(self, node_id: int, index: str) -> str:
        """A WGSL expression for input `node_id` at buffer index `index` (a literal for constants)."""
        node = self.graph[node_id]
        value = constant_value(self.graph, node_id)
        if value is not None:
            return literal(value, node.dtype)
        if is_random(self.graph, node_id):  # drawn here, from the RNG state (codegen/random.py)
            return random_value(node, self.binding_of(node.inputs[0])[0], index)
        name, offset = self.binding_of(node_id)
        return f"{name}[{sum_terms(f'{offset}u', index) if offset else index}]"

    def binding_of(self, node_id: int) -> tuple[str, int]:
        """(the binding that reads `node_id`, bound on first use; the offset of its data there)."""
        bound, offset = bound_value(self.graph, node_id)
        if bound not in self.names:
            self.names[bound] = f"x{len(self.bindings)}"
            self.bindings.append(Binding(self.names[bound], bound, "read"))
        return self.names[bound], offset

    def read(self, node_id: int, out_shape: tuple[int, ...], var: str = "i") -> str:
        """Input `node_id` at row-major output element `var`, broadcast to `out_shape`."""
        if constant_value(self.graph, node_id) is not None:
            return self.read_at(node_id, "")
        node = self.graph[node_id]
        return self.read_at(node_id, index_expr(var, out_shape, broadcast_strides(node.shape, out_shape)))


Read = Callable[[str], tuple[str, list[str]]]  # $name → (its `let`, "" for a literal; its four components)


class Vec4Reads:
    """The reads of a kernel that computes four neighbouring values at once (codegen/elementwise.py's
    vec4 kernels, codegen/reduce_vec4.py's reductions): which values it takes as vec4s (`vectors`,
    those read `along` the innermost dim, fixed before any read so that a scalar read of the same
    buffer knows its binding's type) and how each input is read: as one vec4, or as one scalar for
    all four components (by component from its vec4 binding where another read takes it as vec4s)."""

    def __init__(self, graph: Graph, node: Node, operands: Operands, along: set[int]) -> None:
        self.graph, self.node, self.operands = graph, node, operands
        self.vectors = {bound_value(graph, i)[0] for i in along if constant_value(graph, i) is None}

    def vector_names(self) -> set[str]:
        """The bindings that are arrays of vec4."""
        return {self.operands.names[value] for value in self.vectors if value in self.operands.names}

    def components(self, name: str, source: int, element: str, vector: str | None) -> tuple[str, list[str]]:
        """(a `let` loading $name, "" for a literal; its four components): `source` at vec4 index
        `vector`, or the scalar at element index `element` for all four."""
        constant = constant_value(self.graph, source)
        if constant is not None:
            return "", [literal(constant, "f32")] * 4
        if is_random(self.graph, source):  # drawn here: four draws along the row, or one for all four
            node = self.graph[source]
            state = self.operands.binding_of(node.inputs[0])[0]
            if vector is None:
                return f"let v_{name} = {random_value(node, state, element)};", [f"v_{name}"] * 4
            draws = ", ".join(random_value(node, state, f"({vector}) * 4u + {c}u") for c in range(4))
            return f"let v_{name} = vec4<f32>({draws});", [f"v_{name}.{c}" for c in "xyzw"]
        binding, offset = self.operands.binding_of(source)
        if vector is not None:
            return f"let v_{name} = {binding}[{vector}];", [f"v_{name}.{c}" for c in "xyzw"]
        flat = sum_terms(f"{offset}u", element) if offset else element
        if bound_value(self.graph, source)[0] in self.vectors:
            return f"let v_{name} = {binding}[({flat}) / 4u][({flat}) % 4u];", [f"v_{name}"] * 4
        return f"let v_{name} = {binding}[{flat}];", [f"v_{name}"] * 4

    @staticmethod
    def per_component(tree: Expr, read: Read) -> tuple[str, list[str]]:
        """(`let` statements, the four f32 expressions of `tree`, one per component)."""
        lets, parts = [], {}
        for name in sorted(variables(tree), key=variable_order):
            let, parts[name] = read(name)
            lets += [let] if let else []
        return "\n    ".join(lets), [expr_to_wgsl(tree, lambda name, c=c: parts[name][c]) for c in range(4)]


def sum_terms(*terms: str) -> str:
    """WGSL u32 sum of index terms, leaving out zeros."""
    kept = [term for term in terms if term != "0u"]
    return " + ".join(kept) or "0u"


def variable_order(name: str) -> tuple:
    """Sort key of an expression's variables: `$0`, `$1`, … in number order, then named ones."""
    return (not name.isdigit(), int(name) if name.isdigit() else 0, name)


def expression_code(tree: Expr, read: Callable[[str], str]) -> tuple[str, str]:
    """(`let` statements, f32 expression) computing `tree`, where `read(name)` is the WGSL of `$name`.

    A buffer read becomes one `let` (so an input that the expression uses twice is loaded once);
    literals and plain names are inlined.
    """
    names = sorted(variables(tree), key=variable_order)
    lets, values = [], {}
    for name in names:
        text = read(name)
        if "[" in text:
            lets.append(f"let v_{name} = {text};")
            text = f"v_{name}"
        values[name] = text
    return "\n    ".join(lets), expr_to_wgsl(tree, values.__getitem__)


def output_binding(node: Node, name: str = "out", index: int = 0) -> Binding:
    return Binding(name, node.id, "read_write", index)


def shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


def elementwise_kernel(
    graph: Graph,
    node: Node,
    operands: Operands,
    reads: str,
    value: str,
    functions: str,
    label: str,
    vec4: bool = False,
    scalar_names: frozenset[str] = frozenset(),
) -> KernelSpec:
    """A thread per output element; with `vec4`, per 4 neighbouring ones, every binding an array
    of vec4 but those named in `scalar_names` (`i` then counts vec4s: the caller's index
    arithmetic is in vec4s too)."""
    bindings = operands.bindings + [output_binding(node)]
    numel = node.type.numel // 4 if vec4 else node.type.numel
    grid = grid_for(-(-numel // 256))
    vec4_names = {b.name for b in bindings if b.name not in scalar_names} if vec4 else frozenset()
    wgsl = render(
        "elementwise",
        {
            "BINDINGS": bindings_wgsl(graph, bindings, vec4_names),
            "NUMEL": numel,
            "GRID_X": max(grid[0], 1),
            "FUNCTIONS": functions,
            "READS": reads,
            "VALUE": value,
        },
    )
    return KernelSpec(node.id, label, wgsl, "elementwise", tuple(bindings), grid, (256, 1, 1))


# WebGPU's default maxBindingsPerBindGroup, which runtime/device.py does not raise: an adapter may
# offer more storage buffers per stage (the H200's Vulkan driver does) than one bind group holds.
MAX_BINDINGS_PER_GROUP = 1000


def binding_limit(target: Target) -> int:
    """Storage buffers a kernel of many members (a multi-tensor update, a split of many operands)
    may bind on `target`."""
    return min(target.max_storage_buffers, MAX_BINDINGS_PER_GROUP)


def merged_sources(sources: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    """The members' source lines, each once, in order."""
    return tuple(dict.fromkeys(line for lines in sources for line in lines))
