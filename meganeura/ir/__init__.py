"""The tensor IR: graph data, the op table, tracing, autodiff and the numpy interpreter."""

from meganeura.ir.graph import Graph, Node, TensorType, format_graph
from meganeura.ir.interpret import Result, interpret
from meganeura.ir.ops import OPS, ShapeError, infer_type, launches_kernel, op_def

__all__ = [
    "Graph", "Node", "TensorType", "format_graph", "Result", "interpret", "OPS", "ShapeError",
    "infer_type", "launches_kernel", "op_def",
]  # fmt: skip
