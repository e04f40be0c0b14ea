"""How a reduction's kernel reads four values at a time on a GPU (codegen/reduce.py decides
where: `reduces_vec4s`, `rows_vec4s`; shaders/reduce.wgsl runs them):

- `ItemReads`: an item is four neighbouring outputs along the innermost dim, which the reduction
  keeps: `o` counts vec4s of the output, the prologue and the epilogue are evaluated once per
  component, and the whole item is one `vec4<f32>`;
- `RowReads`: a reduction over the innermost dim alone walks each row a vec4 at a time: `r` counts
  vec4s of the row, and a lane reduces the four components of each before the lanes combine.

Either way the inputs are read as the elementwise vec4 kernels read theirs (codegen/common.py
`Vec4Reads`): one that runs along the innermost dim as one vec4, one broadcast along it as one
scalar for the four.
"""

from __future__ import annotations

from meganeura.codegen.common import Operands, Read, Vec4Reads, broadcast_strides, index_expr, sum_terms
from meganeura.ir.expr import Expr, variables
from meganeura.ir.graph import Graph, Node
from meganeura.ir.op import normalize_axes


def along_innermost(graph: Graph, node: Node, tree: Expr, shape: tuple[int, ...]) -> set[int]:
    """The inputs `tree` reads that run along the innermost dim of `shape` (broadcast to it)."""
    return {
        node.inputs[int(name)]
        for name in variables(tree) - {"r"}
        if broadcast_strides(graph[node.inputs[int(name)]].shape, shape)[-1] == 1
    }


class ItemReads(Vec4Reads):
    """Items of four neighbouring outputs (`reduces_vec4s`): the prologue's inputs at (o, r), the
    epilogue's at output vec4 o."""

    def __init__(
        self,
        graph: Graph,
        node: Node,
        operands: Operands,
        in_shape: tuple[int, ...],
        axes,
        prologue: Expr,
        epilogue: Expr,
    ) -> None:
        along = along_innermost(graph, node, prologue, in_shape) | along_innermost(graph, node, epilogue, node.shape)
        super().__init__(graph, node, operands, along)
        self.axes = normalize_axes(axes, len(in_shape))
        self.kept = [d for d in range(len(in_shape)) if d not in self.axes]
        self.in_shape = in_shape
        sizes = [in_shape[d] for d in self.kept]
        self.kept4 = (*sizes[:-1], sizes[-1] // 4)
        self.out4 = (*node.shape[:-1], node.shape[-1] // 4)

    def read(self, name: str) -> tuple[str, list[str]]:
        """Prologue input $name at (o, r)."""
        source = self.node.inputs[int(name)]
        strides = broadcast_strides(self.graph[source].shape, self.in_shape)
        kept, reduced = [strides[d] for d in self.kept], tuple(strides[d] for d in self.axes)
        sizes = tuple(self.in_shape[d] for d in self.axes)
        if kept[-1] == 1:  # every other stride is a multiple of the innermost dim, so of 4
            vector = sum_terms(
                index_expr("o", self.kept4, (*(s // 4 for s in kept[:-1]), 1)),
                index_expr("r", sizes, tuple(s // 4 for s in reduced)),
            )
            return self.components(name, source, "", vector)
        element = sum_terms(index_expr("o", self.kept4, (*kept[:-1], 0)), index_expr("r", sizes, reduced))
        return self.components(name, source, element, None)

    def read_out(self, name: str) -> tuple[str, list[str]]:
        """Epilogue input $name at output vec4 o (`$r`: the reduced vec4, `value`)."""
        if name == "r":
            return "", [f"value.{c}" for c in "xyzw"]
        source = self.node.inputs[int(name)]
        strides = broadcast_strides(self.graph[source].shape, self.node.shape)
        if strides[-1] == 1:
            vector = index_expr("o", self.out4, (*(s // 4 for s in strides[:-1]), 1))
            return self.components(name, source, "", vector)
        return self.components(name, source, index_expr("o", self.out4, (*strides[:-1], 0)), None)

    def vector(self, tree: Expr, read: Read) -> tuple[str, str]:
        """(`let` statements, the vec4 expression of `tree`)."""
        lets, parts = self.per_component(tree, read)
        return lets, f"vec4<f32>({', '.join(parts)})"


class RowReads(Vec4Reads):
    """Rows walked a vec4 at a time (`rows_vec4s`): the prologue's inputs at row o, vec4 r of it."""

    def __init__(self, graph: Graph, node: Node, operands: Operands, in_shape: tuple[int, ...], prologue: Expr) -> None:
        super().__init__(graph, node, operands, along_innermost(graph, node, prologue, in_shape))
        self.in_shape, self.kept = in_shape, tuple(in_shape[:-1])

    def read(self, name: str) -> tuple[str, list[str]]:
        """Prologue input $name at row o, vec4 r of it."""
        source = self.node.inputs[int(name)]
        strides = broadcast_strides(self.graph[source].shape, self.in_shape)
        if strides[-1] == 1:  # the row's stride is a multiple of its length, so of 4
            vector = sum_terms(index_expr("o", self.kept, tuple(s // 4 for s in strides[:-1])), "r")
            return self.components(name, source, "", vector)
        return self.components(name, source, index_expr("o", self.kept, strides[:-1]), None)

    def combined(self, tree: Expr, combine: str) -> tuple[str, str]:
        """(`let` statements, f32 expression): `tree` per component, the four combined as
        (x ⊕ y) ⊕ (z ⊕ w), `combine` a format of `{a}` and `{b}`."""
        lets, (x, y, z, w) = self.per_component(tree, self.read)
        return lets, combine.format(a=combine.format(a=x, b=y), b=combine.format(a=z, b=w))
