"""The e-graph's kernel forms: the fused kernels the rules build, with expression bodies (Pw).

Every other op has a constructor generated from its declaration (`schema.py`); the fused IR ops
(`pointwise`, `fused_matmul`, `fused_reduce`, `conv_gemm`) are the e-graph's own language,
written here once: their constructors, how an IR node of a fused op is encoded as one (so an
optimized graph can be optimized again), how a plan entry of one decodes back to an IR node, and
what the cost model prices them as.

    (Kernel body "4,5")                              pointwise kernel of that shape
    (MatmulKernel a b ta tb epilogue)                a matmul whose result goes through an epilogue
    (MatmulPrologue prologue "M,K" b ta tb epilogue) the same with A computed while it is loaded: A
                                                     is the body `prologue` over A's stored shape
    (MatmulSplit a b ta tb splits)                   the partials [splits, *batch, M, N] of a matmul
                                                     split along K (rewrite/matmul.py)
    (ReduceKernel kind "axes" keepdim "in_shape" prologue epilogue)
    (ReduceSplit kind "axes" keepdim "in_shape" splits prologue epilogue)
                                                     the partials [splits, *out] of a two-level
                                                     reduction (rewrite/reductions.py)
    (ConvKernel mode a b "kernel" "stride" "padding" "dilation" "image" chunks groups epilogue)
                                                     implicit-GEMM convolution

`Kernel` carries its shape: a body alone does not fix it (broadcast_to(x, s) is `(Kernel (Load x)
s)`, and two bodies that read the same tensors must not merge two kernels of different shapes);
`ReduceKernel` carries the shape it reduces for the same reason.

A class that only a rule's new kernel form computes (the partials of a split reduction, of a split
weight gradient or of a split matmul) has no IR node to take its type from: `form_type` infers it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meganeura.ir.expr import format_expr
from meganeura.ir.expr import parse as parse_expr
from meganeura.ir.graph import Graph, Node, TensorType
from meganeura.ir.op import infer_type
from meganeura.rewrite.plan import Plan, PlanEntry, PwTree
from meganeura.rewrite.sorts import TERM, Constructor, body, operand, primitive

KERNEL = Constructor("Kernel", TERM, (body("body"), primitive("shape", "String", True)))
MATMUL_KERNEL = Constructor(
    "MatmulKernel",
    TERM,
    (operand("a"), operand("b"), primitive("transpose_a", "bool"), primitive("transpose_b", "bool"), body("epilogue")),
)
MATMUL_PROLOGUE = Constructor(
    "MatmulPrologue",
    TERM,
    (
        body("prologue"),
        primitive("a_shape", "String", True),
        operand("b"),
        primitive("transpose_a", "bool"),
        primitive("transpose_b", "bool"),
        body("epilogue"),
    ),
)
MATMUL_SPLIT = Constructor(
    "MatmulSplit",
    TERM,
    (
        operand("a"),
        operand("b"),
        primitive("transpose_a", "bool"),
        primitive("transpose_b", "bool"),
        primitive("splits", "i64"),
    ),
)
REDUCE_KERNEL = Constructor(
    "ReduceKernel",
    TERM,
    (
        primitive("kind", "String"),
        primitive("axes", "String", True),
        primitive("keepdim", "bool"),
        primitive("in_shape", "String", True),
        body("prologue"),
        body("epilogue"),
    ),
)
REDUCE_SPLIT = Constructor(
    "ReduceSplit",
    TERM,
    (
        primitive("kind", "String"),
        primitive("axes", "String", True),
        primitive("keepdim", "bool"),
        primitive("in_shape", "String", True),
        primitive("splits", "i64"),
        body("prologue"),
        body("epilogue"),
    ),
)
CONV_KERNEL = Constructor(
    "ConvKernel",
    TERM,
    (
        primitive("mode", "String"),
        operand("a"),
        operand("b"),
        primitive("kernel", "String", True),
        primitive("stride", "String", True),
        primitive("padding", "String", True),
        primitive("dilation", "String", True),
        primitive("image", "String", True),
        primitive("chunks", "i64"),
        primitive("groups", "i64"),
        body("epilogue"),
    ),
)
KERNEL_FORMS = (KERNEL, MATMUL_KERNEL, MATMUL_PROLOGUE, MATMUL_SPLIT, REDUCE_KERNEL, REDUCE_SPLIT, CONV_KERNEL)

# ---------------------------------------------------------------------------------------------
# Expression trees: ir/expr.py trees <-> Pw trees


def pw_from_expr(tree, names: dict[str, PwTree]) -> PwTree:
    """An `ir/expr.py` tree as a Pw tree; `names` maps `$` names to Pw leaves ("load", node id)…"""
    if isinstance(tree, float):
        return ("lit", tree)
    if tree[0] == "$":
        return names[tree[1]]
    return ("call", tree[0], *(pw_from_expr(arg, names) for arg in tree[1:]))


def expression(tree: PwTree, loads: list[int], named: dict[int, str] | None = None) -> Any:
    """An `ir/expr.py` tree of a plan's Pw tree; each new loaded e-class is appended to `loads`
    and read as `$index` (except those `named` maps to a `$` name of their own)."""
    kind = tree[0]
    if kind == "load":
        if named and tree[1] in named:
            return ("$", named[tree[1]])
        if tree[1] not in loads:
            loads.append(tree[1])
        return ("$", str(loads.index(tree[1])))
    if kind == "lit":
        return float(tree[1])
    if kind in ("acc", "r"):
        return ("$", kind)
    return (tree[1], *(expression(child, loads, named) for child in tree[2:]))


def tree_loads(tree: PwTree) -> list[int]:
    """The e-classes a tree loads, in first-use order."""
    if tree[0] == "load":
        return [tree[1]]
    found: list[int] = []
    if tree[0] == "call":
        for child in tree[2:]:
            found += [c for c in tree_loads(child) if c not in found]
    return found


# ---------------------------------------------------------------------------------------------
# Encoding a fused IR node (an already optimized graph) as its kernel form


def encode_fused(node: Node, graph: Graph) -> tuple[str, tuple]:
    """(constructor, args) of a fused IR node: args are ("T", node id), ("P", Pw tree) or primitives."""
    attrs = node.attr_dict
    loads = {str(index): ("load", i) for index, i in enumerate(node.inputs)}
    if node.op == "pointwise":
        return ("Kernel", (("P", pw_from_expr(parse_expr(attrs["expr"]), loads)), attrs["shape"]))
    if node.op == "fused_matmul":
        a, b = node.inputs[:2]
        extras = {str(index): ("load", i) for index, i in enumerate(node.inputs[2:])}
        epilogue = pw_from_expr(parse_expr(attrs["epilogue"]), {**extras, "acc": ("acc",)})
        flags = (attrs["transpose_a"], attrs["transpose_b"])
        if attrs["splits"] != 1 and attrs["prologue"] == "$a" and not attrs["flatten_a"]:
            return ("MatmulSplit", (("T", a), ("T", b), *flags, attrs["splits"]))
        if attrs["splits"] != 1:
            raise ValueError("a split matmul with a prologue has no kernel form: the rules never make one")
        if attrs["prologue"] == "$a" and not attrs["flatten_a"]:
            return ("MatmulKernel", (("T", a), ("T", b), *flags, ("P", epilogue)))
        prologue = pw_from_expr(parse_expr(attrs["prologue"]), {**extras, "a": ("load", a)})
        return ("MatmulPrologue", (("P", prologue), graph[a].shape, ("T", b), *flags, ("P", epilogue)))
    if node.op == "fused_reduce":
        prologue = pw_from_expr(parse_expr(attrs["prologue"]), loads)
        epilogue = pw_from_expr(parse_expr(attrs["epilogue"]), {**loads, "r": ("r",)})
        fields = (attrs["kind"], attrs["axes"], attrs["keepdim"], attrs["in_shape"])
        if attrs["splits"] != 1:
            return ("ReduceSplit", (*fields, attrs["splits"], ("P", prologue), ("P", epilogue)))
        return ("ReduceKernel", (*fields, ("P", prologue), ("P", epilogue)))
    if node.op == "conv_gemm":
        a, b = node.inputs[:2]
        extras = {str(index): ("load", i) for index, i in enumerate(node.inputs[2:])}
        epilogue = pw_from_expr(parse_expr(attrs["epilogue"]), {**extras, "acc": ("acc",)})
        geometry = (attrs["kernel"], attrs["stride"], attrs["padding"], attrs["dilation"], attrs["image"])
        counts = (attrs["chunks"], attrs["groups"])
        return ("ConvKernel", (attrs["mode"], ("T", a), ("T", b), *geometry, *counts, ("P", epilogue)))
    raise ValueError(f"no kernel form for op {node.op!r}")


# ---------------------------------------------------------------------------------------------
# Decoding a plan entry of a kernel form back to an IR node: (op, input e-classes, attributes)


def prologue_operand(loads, a_shape: tuple[int, ...], plan_types, rank) -> int | None:
    """The tensor a prologue reads as the matmul's A input (`$a`): the earliest of its loads with
    A's full stored shape, or None when it has none (then it is no valid prologue)."""
    full = [s for s in loads if len(plan_types[s]) == 1 and plan_types[s][0].shape == tuple(a_shape)]
    return min(full, key=lambda s: rank[s]) if full else None


def decode_matmul_kernel(entry: PlanEntry, plan: Plan):
    prims = entry.node.primitives
    a, b = entry.node.children[:2]
    flags = {"transpose_a": prims[0], "transpose_b": prims[1]}
    (epilogue,) = entry.bodies
    if epilogue == ("acc",):
        return "matmul", [a, b], flags
    loads: list[int] = []
    text = format_expr(expression(epilogue, loads))
    return "fused_matmul", [a, b, *loads], {**flags, "epilogue": text}


def decode_matmul_prologue(entry: PlanEntry, plan: Plan):
    a_shape, ta, tb = entry.node.primitives
    b = entry.node.children[1]
    prologue, epilogue = entry.bodies
    buffers = [s for s in tree_loads(prologue) if plan.entries[s].node.op != "Philox"]  # not drawn in place
    a = prologue_operand(buffers, a_shape, plan.types, plan.rank)
    loads: list[int] = []
    attrs = {"transpose_a": ta, "transpose_b": tb}
    attrs["epilogue"] = format_expr(expression(epilogue, loads))
    attrs["prologue"] = format_expr(expression(prologue, loads, {a: "a"}))
    out_rank = len(plan.type(entry.eclass).shape)
    if len(a_shape) > out_rank:  # a prologue over a tensor whose rows are A (matmul_prologue_rows)
        return "fused_matmul", [a, b, *loads], {**attrs, "flatten_a": True}
    if attrs["prologue"] == "$a":  # A itself: an ordinary matmul kernel
        del attrs["prologue"]
        if attrs["epilogue"] == "$acc":
            return "matmul", [a, b], {"transpose_a": ta, "transpose_b": tb}
    return "fused_matmul", [a, b, *loads], attrs


def decode_matmul_split(entry: PlanEntry, plan: Plan):
    ta, tb, splits = entry.node.primitives
    a, b = entry.node.children
    return "fused_matmul", [a, b], {"transpose_a": ta, "transpose_b": tb, "splits": splits}


def decode_reduce_kernel(entry: PlanEntry, plan: Plan):
    kind, axes, keepdim, in_shape = entry.node.primitives
    prologue, epilogue = entry.bodies
    # The plain reduction of a load, where the load is of the reduced shape (a load broadcast to
    # in_shape, a bias's gradient through a mean, is summed over its copies: a fused_reduce).
    if prologue[0] == "load" and epilogue == ("r",) and plan.types[prologue[1]][0].shape == tuple(in_shape):
        return kind, [prologue[1]], {"axes": axes, "keepdim": keepdim}
    loads: list[int] = []
    attrs = {
        "kind": kind,
        "axes": axes,
        "keepdim": keepdim,
        "in_shape": in_shape,
        "prologue": format_expr(expression(prologue, loads)),
        "epilogue": format_expr(expression(epilogue, loads)),  # its extras after the prologue's inputs
    }
    return "fused_reduce", loads, attrs


def decode_reduce_split(entry: PlanEntry, plan: Plan):
    kind, axes, keepdim, in_shape, splits = entry.node.primitives
    prologue, epilogue = entry.bodies
    loads: list[int] = []
    attrs = {
        "kind": kind,
        "axes": axes,
        "keepdim": keepdim,
        "in_shape": in_shape,
        "prologue": format_expr(expression(prologue, loads)),
        "epilogue": format_expr(expression(epilogue, loads)),
        "splits": splits,
    }
    return "fused_reduce", loads, attrs


def conv_kernel_attrs(primitives: tuple) -> dict:
    """The conv_gemm attributes of a ConvKernel's primitives (all but the epilogue)."""
    return dict(
        zip(("mode", "kernel", "stride", "padding", "dilation", "image", "chunks", "groups"), primitives, strict=True)
    )


def decode_conv_kernel(entry: PlanEntry, plan: Plan):
    a, b = entry.node.children[:2]
    (epilogue,) = entry.bodies
    loads: list[int] = []
    attrs = {**conv_kernel_attrs(entry.node.primitives), "epilogue": format_expr(expression(epilogue, loads))}
    return "conv_gemm", [a, b, *loads], attrs


def decode_kernel(entry: PlanEntry, plan: Plan):
    """A pointwise kernel: `broadcast_to` for a body that is one load, else `pointwise`; decode.py
    first tries the e-class's own op (elementwise primitives read better than expressions)."""
    (tree,) = entry.bodies
    shape = entry.node.primitives[0]
    if tree[0] == "load":
        return "broadcast_to", [tree[1]], {"shape": shape}
    loads: list[int] = []
    text = format_expr(expression(tree, loads))
    return "pointwise", loads, {"expr": text, "shape": shape}


DECODERS: dict[str, Callable[[PlanEntry, Plan], tuple[str, list[int], dict]]] = {
    "Kernel": decode_kernel,
    "MatmulKernel": decode_matmul_kernel,
    "MatmulPrologue": decode_matmul_prologue,
    "MatmulSplit": decode_matmul_split,
    "ReduceKernel": decode_reduce_kernel,
    "ReduceSplit": decode_reduce_split,
    "ConvKernel": decode_conv_kernel,
}

# ---------------------------------------------------------------------------------------------
# Pricing: the IR op a kernel form is priced as, its attributes, and the operands of its flops


def priced_as(op: str, primitives: tuple, children_types: list, out: tuple[TensorType, ...]):
    """(IR op, attributes, operand types) of a kernel-form e-node, as `cost.pricing` takes them:
    enough for its flops and its workgroups (`children_types`: the types of its Term children, in
    field order; the operands a body reads do not change either)."""
    if op == "Kernel":
        return "pointwise", {}, []
    if op == "MatmulKernel":
        ta, tb = primitives
        attrs = {"transpose_a": ta, "transpose_b": tb, "flatten_a": False}
        return "fused_matmul", attrs, children_types[:2]
    if op == "MatmulPrologue":
        a_shape, ta, tb = primitives
        attrs = {"transpose_a": ta, "transpose_b": tb, "flatten_a": len(a_shape) > out[0].rank}
        return "fused_matmul", attrs, [TensorType(tuple(a_shape)), children_types[0]]
    if op == "MatmulSplit":
        ta, tb, splits = primitives
        return (
            "fused_matmul",
            {"transpose_a": ta, "transpose_b": tb, "flatten_a": False, "splits": splits},
            children_types,
        )
    if op == "ReduceKernel":
        kind, axes, keepdim, in_shape = primitives
        return "fused_reduce", {"kind": kind, "axes": axes, "keepdim": keepdim, "in_shape": in_shape}, []
    if op == "ReduceSplit":
        kind, axes, keepdim, in_shape, splits = primitives
        attrs = {"kind": kind, "axes": axes, "keepdim": keepdim, "in_shape": in_shape, "splits": splits}
        return "fused_reduce", attrs, []
    if op == "ConvKernel":
        return "conv_gemm", conv_kernel_attrs(primitives), children_types[:2]
    raise ValueError(f"{op} is not a kernel form")


def form_type(op: str, primitives: tuple, term_types: list) -> TensorType | None:
    """The type of a kernel-form e-node (`term_types`: the types of its Term children, in field
    order), or None where it cannot be told without the bodies (a pointwise kernel's dtype, an
    epilogue's extras). Only the forms that rules put in new e-classes need one."""
    if op == "ReduceSplit":
        kind, axes, keepdim, in_shape, splits = primitives
        attrs = {"kind": kind, "axes": axes, "keepdim": keepdim, "in_shape": in_shape, "splits": splits}
        return infer_type("fused_reduce", [], {**attrs, "prologue": "1.0", "epilogue": "$r"})
    if op == "MatmulSplit" and len(term_types) == 2 and None not in term_types:
        ta, tb, splits = primitives
        attrs = {"transpose_a": ta, "transpose_b": tb, "splits": splits, "epilogue": "$acc", "prologue": "$a"}
        return infer_type("fused_matmul", term_types, attrs)
    if op == "ConvKernel" and len(term_types) == 2 and None not in term_types:
        return infer_type("conv_gemm", term_types, {**conv_kernel_attrs(primitives), "epilogue": "$acc"})
    return None
