"""Code generation: lowering IR nodes to WGSL kernels (KernelSpec), one registry entry per op
family (`registry.py`), and planning their buffers (`buffers.py`)."""

from meganeura.codegen.buffers import BufferPlan, plan_buffers
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.lower import lower_graph, lower_node

__all__ = ["Binding", "BufferPlan", "KernelSpec", "lower_graph", "lower_node", "plan_buffers"]
