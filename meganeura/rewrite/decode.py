"""The extracted plan → a new IR Graph.

Each materialised e-class becomes one IR node, in rank order (a topological order that follows
the original graph). How each chosen option reads back:
- `Kernel` → `pointwise(inputs…, expr=…, shape=…)`, `$i` numbering the distinct tensors the
  expanded body loads in first-use order; a body that is one elementwise op over loads only goes
  back to that primitive op (`add %3 %4` reads better than `pointwise … {expr=add($0,$1)}`), and
  a body that is a single load to `broadcast_to`;
- `MatmulKernel` → `matmul` when the epilogue is `$acc`, else `fused_matmul(a, b, extras…,
  epilogue=…)`;
- `MatmulPrologue` → `fused_matmul(x, b, extras…, epilogue=…, prologue=…)`: x is the prologue's
  earliest load of A's full stored shape (`$a`); the extras are the epilogue's loads, then those
  only the prologue reads, numbered `$0…` in that order for both expressions. A prologue that
  only reads A (A stored) goes back to `matmul`/`fused_matmul` without one;
- `ReduceKernel` → `sum`/`max` when the prologue is a plain load and the epilogue `$r`, else
  `fused_reduce`;
- the other e-nodes → their own op, attributes read back from the e-node or the encoder's table.
Every node's type is re-inferred with the op table and must equal its e-class's type (a rule that
broke this would be unsound: decoding fails loudly).

Outputs and updates are remapped by e-class; every input/param/state leaf is kept. A node's
`sources` are the user source lines of every original IR node it covers: the nodes of its own
e-class, plus the nodes the plan no longer materialises whose values flowed into it (the matmul
and the add folded into a fused matmul, the chain inlined into a pointwise kernel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meganeura.ir.expr import format_expr
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.ops import infer_type, launches_kernel
from meganeura.rewrite.encode import PwTree
from meganeura.rewrite.extract import Extractor, tree_loads
from meganeura.rewrite.schema import ROW_CONSTRUCTORS

OPTIMIZER_ATTRS = {
    "SgdStep": ("sgd_step", ("lr", "weight_decay")),
    "MomentumBuffer": ("momentum_buffer", ("momentum", "weight_decay")),
    "AdamMoment": ("adam_moment", ("beta", "order", "weight_decay")),
}


def expr_of(tree: PwTree, loads: list[int], named: dict[int, str] | None = None) -> Any:
    """An `ir/expr.py` tree of a plan's Pw tree; each new loaded e-class is appended to `loads`
    (except those `named` maps to a `$` name of their own)."""
    kind = tree[0]
    if kind == "load":
        if named and tree[1] in named:
            return ("$", named[tree[1]])
        if tree[1] not in loads:
            loads.append(tree[1])
        return ("$", str(loads.index(tree[1])))
    if kind == "lit":
        return float(tree[1])
    if kind == "acc":
        return ("$", "acc")
    if kind == "r":
        return ("$", "r")
    return (tree[1], *(expr_of(child, loads, named) for child in tree[2:]))


def single_op(tree: PwTree) -> bool:
    """Whether a body is one elementwise op whose operands are all loads."""
    return tree[0] in ("unary", "binary") and all(child[0] == "load" for child in tree[2:])


def original_op(extractor: Extractor, eclass: int, tree: PwTree):
    """The e-class's own IR node when the kernel fused nothing into it: it reads the same tensors,
    or more of them, all buffers the plan keeps anyway (adam_moment reads p even when its weight
    decay is 0). Its op (adam_moment, sgd_step, sub…) reads better than a pointwise expression,
    and the runtime updates optimizer ops in place.
    """
    loads = tree_loads(tree)
    class_of_ir = extractor.view.class_of_ir
    for node_id in extractor.ir_ids[eclass]:
        node = extractor.graph[node_id]
        if node.op in ("pointwise", "broadcast_to") or not launches_kernel(node.op):
            continue
        inputs = [class_of_ir[i] for i in node.inputs]
        extra = set(inputs) - loads
        if loads <= set(inputs) and all(c in extractor.current and extractor.leafish[c] for c in extra):
            return node.op, inputs, node.attr_dict
    return None


def ir_node(extractor: Extractor, eclass: int) -> tuple[str, list[int], dict[str, Any]]:
    """(op, input e-classes, attributes) of the IR node computing one materialised e-class."""
    option = extractor.option(eclass)
    node = option.node
    op, prims, children = node.op, node.primitives, list(node.children)
    shape = extractor.type[eclass].shape
    if op.startswith("Op") and op[2:].isdigit():
        return prims[0], children, dict(extractor.encoding.attrs_table[prims[1]])
    if op == "Const":
        for node_id in extractor.ir_ids[eclass]:
            if extractor.graph[node_id].op == "const":
                return "const", [], extractor.graph[node_id].attr_dict
        return "const", [], {"value": prims[0]}
    if op == "Reshape":
        return "reshape", children, {"shape": prims[0]}
    if op == "Permute":
        return "permute", children, {"perm": prims[0]}
    if op == "Matmul":
        return "matmul", children, {"transpose_a": prims[0], "transpose_b": prims[1]}
    if op == "Attention":
        return "attention", children, {"causal": prims[0], "scale": prims[1]}
    if op == "Rope":
        return "rope", children, {}
    if op in ("Unfold", "Fold"):
        kh, kw, sh, sw, ph, pw, height, width = prims[0]
        attrs = {"kernel": (kh, kw), "stride": (sh, sw), "padding": (ph, pw)}
        return (
            ("unfold", children, attrs)
            if op == "Unfold"
            else ("fold", children, {**attrs, "output_size": (height, width)})
        )
    if op == "ConvKernel":
        kh, kw, sh, sw, ph, pw, height, width = prims[1]
        loads = []
        attrs = {
            "mode": prims[0],
            "kernel": (kh, kw),
            "stride": (sh, sw),
            "padding": (ph, pw),
            "image": (height, width),
        }
        if prims[2] > 1:
            attrs["chunks"] = prims[2]
        epilogue = format_expr(expr_of(extractor.tree(children[2], False), loads))
        if epilogue != "$acc":
            attrs["epilogue"] = epilogue
        return "conv_gemm", [*children[:2], *loads], attrs
    if op == "Reduce":
        return prims[0], children, {"axes": prims[1], "keepdim": prims[2]}
    if op in ("Unary", "Binary"):
        return prims[0], children, {}
    if op in OPTIMIZER_ATTRS:
        name, keys = OPTIMIZER_ATTRS[op]
        return name, children, dict(zip(keys, prims, strict=True))
    if op in ROW_CONSTRUCTORS:
        name, _, keys = ROW_CONSTRUCTORS[op]
        return name, children, dict(zip(keys, prims, strict=True))
    if op == "Kernel":
        tree = extractor.tree(children[0], True)
        if tree[0] == "load":
            return "broadcast_to", [tree[1]], {"shape": shape}
        original = original_op(extractor, eclass, tree)
        if original is not None:
            return original
        if single_op(tree):
            candidate = (tree[1], [child[1] for child in tree[2:]], {})
            operand_types = [extractor.type[c] for c in candidate[1]]
            if infer_type(candidate[0], operand_types, {}) == extractor.type[eclass]:
                return candidate
        loads: list[int] = []
        text = format_expr(expr_of(tree, loads))
        return "pointwise", loads, {"expr": text, "shape": shape}
    if op == "MatmulKernel":
        flags = {"transpose_a": prims[0], "transpose_b": prims[1]}
        tree = extractor.tree(children[2], False)
        if tree == ("acc",):
            return "matmul", children[:2], flags
        loads = []
        text = format_expr(expr_of(tree, loads))
        return "fused_matmul", [*children[:2], *loads], {**flags, "epilogue": text}
    if op == "MatmulPrologue":
        a_shape, ta, tb = prims
        prologue = extractor.prologue_tree(node)
        a = extractor.prologue_operand(tree_loads(prologue), a_shape)
        loads = []
        attrs = {"transpose_a": ta, "transpose_b": tb}
        attrs["epilogue"] = format_expr(expr_of(extractor.tree(children[2], False), loads))
        attrs["prologue"] = format_expr(expr_of(prologue, loads, {a: "a"}))
        if len(a_shape) > len(shape):  # a prologue over a tensor whose rows are A (matmul_prologue_rows)
            return "fused_matmul", [a, children[1], *loads], {**attrs, "flatten_a": True}
        if attrs["prologue"] == "$a":  # A itself: an ordinary matmul kernel
            del attrs["prologue"]
            if attrs["epilogue"] == "$acc":
                return "matmul", [a, children[1]], {"transpose_a": ta, "transpose_b": tb}
        return "fused_matmul", [a, children[1], *loads], attrs
    if op == "ReduceKernel":
        kind, axes, keepdim, in_shape = prims
        prologue = extractor.tree(children[0], False)
        epilogue = extractor.tree(children[1], False)
        if prologue[0] == "load" and epilogue == ("r",):
            return kind, [prologue[1]], {"axes": axes, "keepdim": keepdim}
        loads = []
        prologue_text = format_expr(expr_of(prologue, loads))
        attrs = {
            "kind": kind,
            "axes": axes,
            "keepdim": keepdim,
            "in_shape": in_shape,
            "prologue": prologue_text,
            "epilogue": format_expr(expr_of(epilogue, [])),
        }
        return "fused_reduce", loads, attrs
    raise RuntimeError(f"decode: no IR op for e-node {op}")


def covered_nodes(extractor: Extractor, kept: set[int]) -> dict[int, list[int]]:
    """For each kept e-class, the original IR nodes it computes (its own, and those absorbed into it)."""
    users = extractor.graph.users()
    class_of_ir = extractor.view.class_of_ir
    covered: dict[int, list[int]] = {eclass: [] for eclass in kept}
    for node_id in extractor.encoding.encoded_ids:
        for eclass in absorbing_classes(node_id, users, class_of_ir, kept):
            covered[eclass].append(node_id)
    return covered


def absorbing_classes(node_id: int, users: dict[int, list[int]], class_of_ir: dict[int, int], kept: set[int]):
    """The kept e-classes that compute IR node `node_id`: its own, or else the nearest kept users'."""
    found: set[int] = set()
    seen: set[int] = set()
    stack = [node_id]
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        eclass = class_of_ir.get(current)
        if eclass in kept:
            found.add(eclass)
        elif eclass is not None:
            stack.extend(users[current])
    return found


@dataclass
class Decoded:
    """The rewritten graph, the IR node of each materialised e-class, and what each covers."""

    graph: Graph
    node_of_class: dict[int, int]
    covered: dict[int, list[int]]  # e-class -> original IR node ids it computes


def decode(extractor: Extractor) -> Decoded:
    """The IR graph of an extractor's plan (which covers the outputs, updates and leaves)."""
    graph = extractor.graph
    order = extractor.materialised()
    covered = covered_nodes(extractor, set(order))
    result = Graph()
    new_id: dict[int, int] = {}
    for eclass in order:
        op, inputs, attrs = ir_node(extractor, eclass)
        expected = extractor.type[eclass]
        if op in ("input", "param", "state"):
            value_type = expected
        else:
            value_type = infer_type(op, [extractor.type[c] for c in inputs], attrs)
            check_type(op, value_type, expected)
        sources = dict.fromkeys(line for i in sorted(covered[eclass]) for line in graph[i].sources)
        new_id[eclass] = result.add(op, [new_id[c] for c in inputs], value_type, attrs, tuple(sources))
    class_of_ir = extractor.view.class_of_ir
    result.outputs = {name: new_id[class_of_ir[i]] for name, i in graph.outputs.items()}
    result.updates = {name: new_id[class_of_ir[i]] for name, i in graph.updates.items()}
    return Decoded(result, new_id, covered)


def check_type(op: str, actual: TensorType, expected: TensorType) -> None:
    """Fail loudly if a rewritten node's type differs from its e-class's original IR type."""
    if actual != expected:
        raise RuntimeError(f"decode: {op} gives {actual} where the e-class holds {expected} (a rule is unsound)")
