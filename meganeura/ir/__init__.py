"""The tensor IR: graph data, the op declarations and the op set, tracing, autodiff and the numpy interpreter."""

from meganeura.ir import ops  # noqa: F401  (registers every op)
from meganeura.ir.graph import Graph, Node, TensorType, format_graph
from meganeura.ir.interpret import Result, interpret
from meganeura.ir.op import OPS, Op, ShapeError, infer_type, launches_kernel, op_def

__all__ = [
    "Graph", "Node", "TensorType", "format_graph", "Result", "interpret", "OPS", "Op", "ShapeError",
    "infer_type", "launches_kernel", "op_def",
]  # fmt: skip
