"""Code generation: lowering IR nodes to WGSL kernels (KernelSpec) and planning their buffers."""

from meganeura.codegen.buffers import BufferPlan, plan_buffers
from meganeura.codegen.kernel import Binding, KernelSpec
from meganeura.codegen.lower import lower_graph, lower_node

__all__ = ["Binding", "BufferPlan", "KernelSpec", "lower_graph", "lower_node", "plan_buffers"]
