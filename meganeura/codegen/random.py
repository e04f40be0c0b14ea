"""Random values in kernels (ir/ops/random.py): the WGSL call that draws one element of a random
tensor, wherever a kernel reads it.

A `philox` node has no buffer: a kernel that reads it at element index `index` (its flat index in
the random tensor's own shape, as every read of a broadcast input is indexed) binds the RNG
state leaf instead and calls the Philox helpers of shaders/philox.wgsl, which `render` appends
to any module that calls them (`RANDOM_CALL`). A `rand` node is the same draw written to a buffer
(its lowering is in codegen/elementwise.py).
"""

from __future__ import annotations

from meganeura.ir.graph import Graph, Node

RANDOM_CALL = "mn_random_"  # the prefix of the WGSL functions that draw (shaders/philox.wgsl)
RANDOM_HELPERS = "philox"  # the template holding them


def random_value(node: Node, state: str, index: str) -> str:
    """The WGSL f32 of random node `node` (rand or philox) at element `index`, its RNG state bound as `state`."""
    words = f"bitcast<vec4<u32>>(vec4<i32>({state}[0u], {state}[1u], {state}[2u], {state}[3u]))"
    function = "normal" if node.attr("normal") else "uniform"
    return f"{RANDOM_CALL}{function}({words}, {node.attr('stream')}u, {index})"


def is_random(graph: Graph, node_id: int) -> bool:
    """Whether a value is drawn where it is read (a `philox` node: no buffer of its own)."""
    return graph[node_id].op == "philox"
