"""Lowering of the elementwise ops (one per function of ir/functions.py, and broadcast_to), the
fused `pointwise` kernel, the causal mask and `rand`: one thread per output element
(shaders/elementwise.wgsl), each input read at an index expression of the element through
broadcasting; a thread per 4 neighbouring elements where the output's rows are whole vec4s of
f32 (`runs_vec4s`): 16-byte loads and stores, a quarter of the threads and index arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence

from meganeura.codegen.common import (
    Operands,
    Vec4Reads,
    broadcast_strides,
    elementwise_kernel,
    expression_code,
    index_expr,
    shape_text,
)
from meganeura.codegen.expressions import helper_functions
from meganeura.codegen.kernel import KernelSpec
from meganeura.codegen.random import random_value
from meganeura.codegen.registry import ELEMENTWISE_WORKGROUP, lowering
from meganeura.ir.expr import Expr, variables
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.functions import FUNCTIONS
from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.ops.leaves import CAUSAL_MASK_VALUE


def runs_vec4s(operands: Sequence[TensorType], result: TensorType) -> bool:
    """Whether an elementwise kernel runs a thread per 4 neighbouring output elements: an f32
    result whose last axis is a multiple of 4 long, from f32 inputs. Broadcasting keeps such 4
    together: an input that runs along the last axis holds them as 4 neighbouring words, 16-byte
    aligned (one vec4 load), an input broadcast along it one value for all 4. On the H200
    (2026-12-03, 18:55 UTC, `benchmarks/plan_ab.py --workloads resnet18,smollm2,gpt2` with this
    function returning False as the other variant; one profiled step's GPU time as one pass):
    SmolLM2 72.39 → 71.64 ms (swiglu 8x256x1536 1.001 → 0.763 ms a step, its add 8x256x576
    0.574 → 0.486), GPT-2 58.64 → 58.32, ResNet-18 21.56 → 21.14 (its batch-norm pointwise
    kernels)."""
    return (
        result.dtype == "f32"
        and len(result.shape) > 0
        and result.shape[-1] % 4 == 0
        and all(operand.dtype == "f32" for operand in operands)
    )


def pointwise_workgroups(attrs: dict, operands: Sequence[TensorType], results: tuple[TensorType, ...]) -> int:
    """A workgroup of 256 threads per 256 output elements, or per 1024 where a thread takes 4."""
    per_thread = 4 if runs_vec4s(operands, results[0]) else 1
    return -(-results[0].numel // (per_thread * ELEMENTWISE_WORKGROUP))


@lowering(*FUNCTIONS, "broadcast_to", workgroups=pointwise_workgroups)
def lower_elementwise(graph: Graph, node: Node) -> KernelSpec:
    """An elementwise op, or broadcast_to: a one-function `pointwise` kernel."""
    if node.op in FUNCTIONS:
        tree: Expr = (node.op, *(("$", str(i)) for i in range(FUNCTIONS[node.op].arity)))
    else:  # broadcast_to (f32 or i32)
        tree = ("$", "0")
    return thread_per_element(graph, node, tree, f"{node.op} {shape_text(node.shape)}")


@lowering("pointwise", workgroups=pointwise_workgroups)
def lower_pointwise(graph: Graph, node: Node) -> KernelSpec:
    """`pointwise`: one expression over inputs broadcast to the output shape."""
    text = node.attr("expr")
    return thread_per_element(graph, node, parse_expr(text), f"pointwise {shape_text(node.shape)} {text}")


def thread_per_element(graph: Graph, node: Node, tree: Expr, label: str) -> KernelSpec:
    """out[i] = tree($0, $1, … at i), the inputs broadcast to the output shape by index expressions."""
    if runs_vec4s([graph[i].type for i in node.inputs], node.type):
        return thread_per_vec4(graph, node, tree, label)
    operands = Operands(graph)
    reads, value = expression_code(tree, lambda name: operands.read(node.inputs[int(name)], node.shape))
    return elementwise_kernel(graph, node, operands, reads, value, helper_functions([tree]), label)


def thread_per_vec4(graph: Graph, node: Node, tree: Expr, label: str) -> KernelSpec:
    """out[i] = the 4 outputs 4i .. 4i + 3 (`runs_vec4s`), tree evaluated once per component: an
    input along the last axis read as one vec4, one broadcast along it as one scalar for all 4
    (from a vec4 binding by component where another input reads the same buffer as vec4s)."""
    shape = node.shape
    shape4 = (*shape[:-1], shape[-1] // 4)  # the output in vec4s: `i` counts them
    inputs = {name: node.inputs[int(name)] for name in variables(tree)}
    strides = {name: broadcast_strides(graph[inputs[name]].shape, shape) for name in inputs}
    operands = Operands(graph)
    reads = Vec4Reads(graph, node, operands, {inputs[name] for name in inputs if strides[name][-1] == 1})

    def read(name: str) -> tuple[str, list[str]]:
        if strides[name][-1] == 1:  # every other stride a multiple of the last axis, so of 4
            vector = index_expr("i", shape4, (*(s // 4 for s in strides[name][:-1]), 1))
            return reads.components(name, inputs[name], "", vector)
        return reads.components(name, inputs[name], index_expr("i", shape4, (*strides[name][:-1], 0)), None)

    lets, parts = reads.per_component(tree, read)
    scalar_names = frozenset(b.name for b in operands.bindings if b.name not in reads.vector_names())
    return elementwise_kernel(
        graph,
        node,
        operands,
        lets,
        f"vec4<f32>({', '.join(parts)})",
        helper_functions([tree]),
        f"{label} (vec4)",
        vec4=True,
        scalar_names=scalar_names,
    )


@lowering("rand", workgroups=pointwise_workgroups)
def lower_rand(graph: Graph, node: Node) -> KernelSpec:
    """rand: each element drawn at its flat index (codegen/random.py) and written."""
    operands = Operands(graph)
    value = random_value(node, operands.binding_of(node.inputs[0])[0], "i")
    return elementwise_kernel(graph, node, operands, "", value, "", f"rand {shape_text(node.shape)}")


@lowering("causal_mask")
def lower_causal_mask(graph: Graph, node: Node) -> KernelSpec:
    """causal_mask [rows, cols]: 0 where col ≤ row, CAUSAL_MASK_VALUE above the diagonal."""
    rows, cols = node.shape
    reads = f"let row = i / {cols}u;\n    let col = i % {cols}u;"
    value = f"select(0.0, {CAUSAL_MASK_VALUE:.1f}, col > row)"
    return elementwise_kernel(graph, node, Operands(graph), reads, value, "", f"causal_mask [{rows},{cols}]")
