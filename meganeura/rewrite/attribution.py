"""What the chosen plan owes to each rule and each family: rule uses, and savings per family.

egglog does not record which rule created an e-node, so uses are read off the plan's structure,
rule by rule (`rule_uses`):
- lift rules (`lift_unary`, `lift_binary`, `lift_broadcast`, `lift_*` optimizer updates,
  `lift_matmul`, `lift_reduce`): the IR nodes of that kind that the plan computes inside a
  fused kernel (one that computes more than one launching IR node, transposes not counted);
- `fuse_pointwise`: the producers the plan inlines into kernel bodies (each counted once);
- `const_literal`: the constants the plan reads as literals; `silu`/`swiglu`: silu and swiglu in
  the plan's bodies whose Pw e-class also holds the product form the rule matched;
- `matmul_epilogue` (and its helpers `matmul_mentions`, `matmul_substitute`): the fused matmuls
  of the plan (a matmul kernel with an epilogue other than `$acc`);
- `matmul_prologue`: the matmuls of the plan that compute their A operand in a prologue (a
  `MatmulPrologue` e-node whose A is stored is an ordinary matmul kernel, no use);
- `reduce_epilogue_unary`/`_literal`: the ops on the path from the epilogue's root to `$r` in
  the plan's fused reductions;
- `cross_entropy_forward`/`_backward`: the plan's cross_entropy_rows(_grad) kernels that compute
  an IR node of another op (the neg of nll_loss, the log_softmax_grad of its gradient);
- `fold_transpose_a`/`_b`, `transpose_product`: matmuls of the plan that read an operand through
  the folded transpose (or compute a transposed product), compared with the IR matmul they cover;
- `compose_permutes`, `merge_reshapes`: permutes/reshapes of the plan that read a different
  input than their IR node did;
- `cancel_permutes`, `drop_reshape`, `fold_constants`, `mul_one`, `add_zero`, `sub_zero`,
  `div_one`: the IR nodes of the rule's pattern that were merged into the e-class of their result
  (so the plan never computes them); for `drop_reshape`, reshapes merged with the value they
  reshape back (reshape(reshape(x, s), shape of x)).

Savings per family (`family_savings`): the total saving, cost(input graph) − cost(plan), split
exactly between the families. The input graph's cost is split per e-class: the cost of the
first IR node of each e-class, plus the cost of any further IR node merged into an e-class
(duplicates and identities), which counts for algebra. Then, per e-class:
- computed by the plan: (input cost − plan cost) goes to the family of the plan's e-node — a
  pointwise kernel to pointwise, a matmul kernel with an epilogue to matmul, a reduction with an
  epilogue or a fused cross-entropy kernel to reductions (a reduction with only a fused prologue
  to pointwise), anything else (a matmul with folded transposes…) to algebra. This difference
  is negative when a kernel reads more to fuse more; the kernels it made unnecessary carry the
  matching gain:
- not computed by the plan: its whole input cost goes to the family that made it unnecessary:
  algebra for permutes, reshapes, constant expressions; otherwise the family of the kernel that
  absorbed it (the nearest computed consumer): a matmul or reduction absorbed into a kernel goes
  where that kernel's own difference goes (a transposed product computed directly: algebra; an
  epilogue: matmul or reductions); inside a matmul or reduction kernel, the elementwise nodes
  downstream of the matmul/reduction are its epilogue (matmul/reductions), the A operand that a
  prologue recomputes is the prologue's (matmul), and the others were inlined into it
  (pointwise); what a fused cross-entropy kernel absorbs (the log-probabilities,
  pick, the one-hot scatter) goes to reductions.
Dispatches and flops are split the same way, so each family's line says how many kernels it
removed and what traffic it saved net of the extra reads its fused kernels make.
"""

from __future__ import annotations

from collections import Counter

from meganeura.ir.expr import BINARY_FUNCTIONS, UNARY_FUNCTIONS
from meganeura.ir.graph import Graph
from meganeura.ir.ops import launches_kernel
from meganeura.rewrite.cost import Cost, node_cost
from meganeura.rewrite.decode import Decoded
from meganeura.rewrite.extract import Extractor
from meganeura.rewrite.report import FamilyStats
from meganeura.rewrite.rules import FAMILIES
from meganeura.rewrite.schema import ROW_CONSTRUCTORS, swap_last_two

LIFTS = {
    "lift_broadcast": ("broadcast_to",),
    "lift_sgd_step": ("sgd_step",),
    "lift_momentum_buffer": ("momentum_buffer",),
    "lift_adam_moment": ("adam_moment",),
    "lift_matmul": ("matmul", "fused_matmul"),
    "lift_reduce": ("sum", "max", "fused_reduce"),
}
FUSING_KERNELS = ("Kernel", "MatmulKernel", "MatmulPrologue", "ReduceKernel", "ConvKernel")
CONV_RULES = {"forward": "conv_forward", "grad_input": "conv_grad_input", "grad_weight": "conv_grad_weight"}
CROSS_ENTROPY_RULES = {  # the fused cross-entropy e-nodes -> the rule that puts them in a class
    "CrossEntropyRows": "cross_entropy_forward",
    "CrossEntropyRowsGrad": "cross_entropy_backward",
}
IDENTITIES = {  # rule -> (op, position of the constant, constant)
    "mul_one": (("mul", 1, 1.0), ("mul", 0, 1.0)),
    "add_zero": (("add", 1, 0.0), ("add", 0, 0.0)),
    "sub_zero": (("sub", 1, 0.0),),
    "div_one": (("div", 1, 1.0),),
}


def lift_rule(op: str) -> str | None:
    if op in UNARY_FUNCTIONS:
        return "lift_unary"
    if op in BINARY_FUNCTIONS:
        return "lift_binary"
    for name, ops in LIFTS.items():
        if op in ops:
            return name
    return None


def path_ops(tree, leaf: tuple) -> list[tuple]:
    """The ops of an expression tree on the path from its root to `leaf` (("acc",) or ("r",))."""
    if tree == leaf:
        return []
    if tree[0] not in ("unary", "binary"):
        return None  # type: ignore[return-value]
    for child in tree[2:]:
        below = path_ops(child, leaf)
        if below is not None:
            return [tree, *below]
    return None  # type: ignore[return-value]


def rule_uses(extractor: Extractor, decoded: Decoded) -> Counter:
    """Per named rule, how many of its results the plan uses (see the module docstring)."""
    uses: Counter = Counter()
    graph = extractor.graph
    class_of_ir = extractor.view.class_of_ir
    pw_nodes = extractor.view.nodes
    fused_nodes: set[int] = set()
    inlined: set[int] = set()
    literals: set[int] = set()
    for eclass, covered in decoded.covered.items():
        launching = [i for i in covered if launches_kernel(graph[i].op) and graph[i].op != "permute"]
        if len(launching) > 1 and extractor.option(eclass).node.op in FUSING_KERNELS:
            fused_nodes.update(launching)
        option = extractor.option(eclass)
        node = option.node
        bodies = []
        if node.op == "Kernel":
            bodies.append((node.children[0], True))
        elif node.op == "MatmulKernel":
            bodies.append((node.children[2], False))
            if extractor.tree(node.children[2], False) != ("acc",):
                for name in ("matmul_epilogue", "matmul_mentions", "matmul_substitute"):
                    uses[name] += 1
        elif node.op == "MatmulPrologue":
            bodies.append((node.children[2], False))
            if extractor.prologue_tree(node)[0] != "load":
                bodies.append((node.children[0], False))
                rows = len(node.primitives[0]) > extractor.type[eclass].rank  # A is the rows of the prologue's shape
                uses["matmul_prologue_rows" if rows else "matmul_prologue"] += 1
            if extractor.tree(node.children[2], False) != ("acc",):
                for name in ("matmul_epilogue", "matmul_mentions", "matmul_substitute"):
                    uses[name] += 1
        elif node.op == "ConvKernel":
            bodies.append((node.children[2], False))
            uses[CONV_RULES[node.primitives[0]]] += 1
            if extractor.tree(node.children[2], False) != ("acc",):
                for name in ("conv_epilogue", "conv_mentions", "matmul_substitute"):
                    uses[name] += 1
        elif node.op == "ReduceKernel":
            bodies.extend(((node.children[0], False), (node.children[1], False)))
            epilogue = extractor.tree(node.children[1], False)
            for op in path_ops(epilogue, ("r",)) or []:
                uses["reduce_epilogue_unary" if op[0] == "unary" else "reduce_epilogue_literal"] += 1
        for body, is_root in bodies:
            for event in extractor.events(body, is_root):
                if event[0] == "inline":
                    inlined.add(event[1])
                elif event[0] == "lit" and extractor.pw[event[1]].loads:
                    literals.add(event[1])
                elif event[0] == "node":
                    _, pw_class, enode = event
                    name = {"silu": "silu", "swiglu": "swiglu"}.get(enode.primitives[0] if enode.primitives else "")
                    if name and any(n.op == "PBinary" and n.primitives[0] == "mul" for n in pw_nodes.get(pw_class, ())):
                        uses[name] += 1
        if node.op in ("Matmul", "MatmulKernel", "MatmulPrologue"):
            uses.update(transpose_uses(extractor, eclass, covered, node))
        rep = graph[extractor.ir_ids[eclass][0]]
        if node.op in CROSS_ENTROPY_RULES and rep.op != ROW_CONSTRUCTORS[node.op][0]:
            uses[CROSS_ENTROPY_RULES[node.op]] += 1
        if node.op == "Attention" and rep.op != "attention":
            uses["recognize_causal_attention" if node.primitives[0] else "recognize_attention"] += 1
        if node.op == "Rope" and rep.op != "rope":
            uses["recognize_rope"] += 1
        if node.op == "Permute" and rep.op == "permute" and class_of_ir[rep.inputs[0]] != node.children[0]:
            uses["compose_permutes"] += 1
        if node.op == "Reshape" and rep.op == "reshape" and class_of_ir[rep.inputs[0]] != node.children[0]:
            uses["merge_reshapes"] += 1
        if node.op == "Reshape" and rep.op in ("unfold", "fold"):
            uses["pointwise_conv"] += 1
    uses["fuse_pointwise"] = len(inlined)
    uses["const_literal"] = len(literals)
    for i in fused_nodes:
        name = lift_rule(graph[i].op)
        if name:
            uses[name] += 1
    uses.update(merge_uses(extractor))
    return uses


def transpose_uses(extractor: Extractor, eclass: int, covered: list[int], node) -> Counter:
    """`fold_transpose_a/b` and `transpose_product` uses of one matmul of the plan."""
    graph = extractor.graph
    class_of_ir = extractor.view.class_of_ir
    uses: Counter = Counter()
    matmuls = [i for i in covered if graph[i].op in ("matmul", "fused_matmul")]
    if not matmuls:
        return uses
    m = graph[matmuls[-1]]
    a0, b0 = class_of_ir[m.inputs[0]], class_of_ir[m.inputs[1]]
    ta0, tb0 = bool(m.attr("transpose_a")), bool(m.attr("transpose_b"))
    rep = graph[extractor.ir_ids[eclass][0]]
    if rep.op == "permute" and class_of_ir[rep.inputs[0]] == class_of_ir[m.id]:
        uses["transpose_product"] += 1
        a0, b0, ta0, tb0 = b0, a0, not tb0, not ta0
    a, b = node.children[:2]
    if node.op == "MatmulPrologue":  # the A operand is the tensor whose producer the prologue computes
        a, b = prologue_source(extractor, node), node.children[1]
    for name, original, chosen in (("fold_transpose_a", a0, a), ("fold_transpose_b", b0, b)):
        if original != chosen and is_transpose_of(extractor, original, chosen):
            uses[name] += 1
    return uses


def prologue_source(extractor: Extractor, node) -> int | None:
    """The A operand whose producer a `MatmulPrologue` e-node computes (the class its body loads)."""
    return extractor.prologue_operand(extractor.pw[node.children[0]].loads, node.primitives[0])


def is_transpose_of(extractor: Extractor, eclass: int, source: int) -> bool:
    """Whether an IR node of e-class `eclass` is a last-two-dims transpose of e-class `source`."""
    graph = extractor.graph
    for i in extractor.ir_ids.get(eclass, ()):
        node = graph[i]
        if node.op == "permute" and tuple(node.attr("perm")) == swap_last_two(node.type.rank):
            if extractor.view.class_of_ir[node.inputs[0]] == source:
                return True
    return False


def merge_uses(extractor: Extractor) -> Counter:
    """Uses of the rules that merge an IR node into the e-class of its result."""
    graph = extractor.graph
    class_of_ir = extractor.view.class_of_ir
    uses: Counter = Counter()
    for node_id in extractor.encoding.encoded_ids:
        node = graph[node_id]
        eclass = class_of_ir[node_id]
        if node.op == "permute" and graph[node.inputs[0]].op == "permute":
            if eclass == class_of_ir[graph[node.inputs[0]].inputs[0]]:
                uses["cancel_permutes"] += 1
        elif node.op == "reshape":
            below = graph[node.inputs[0]]
            while below.op == "reshape" and class_of_ir[below.id] != eclass:
                below = graph[below.inputs[0]]
            if class_of_ir[below.id] == eclass:  # merged with the value it reshapes (back)
                uses["drop_reshape"] += 1
        elif node.op in BINARY_FUNCTIONS or node.op == "neg":
            constant_class = any(n.op == "Const" for n in extractor.view.nodes.get(eclass, ()))
            if node.inputs and all(graph[i].op == "const" for i in node.inputs) and constant_class:
                uses["fold_constants"] += 1
                continue
            for name, patterns in IDENTITIES.items():
                for op, position, value in patterns:
                    if node.op != op or len(node.inputs) != 2:
                        continue
                    constant = graph[node.inputs[position]]
                    other = node.inputs[1 - position]
                    if constant.op == "const" and constant.attr("value") == value and eclass == class_of_ir[other]:
                        uses[name] += 1
    return uses


def family_of_kept(extractor: Extractor, eclass: int) -> str:
    """The family credited with the difference in cost of an e-class the plan computes."""
    node = extractor.option(eclass).node
    if node.op == "Kernel":
        return "pointwise"
    if node.op == "MatmulPrologue" and extractor.prologue_tree(node)[0] != "load":
        return "matmul"
    if node.op in ("MatmulKernel", "MatmulPrologue"):
        return "algebra" if extractor.tree(node.children[2], False) == ("acc",) else "matmul"
    if node.op == "ReduceKernel":
        return "pointwise" if extractor.tree(node.children[1], False) == ("r",) else "reductions"
    if node.op in CROSS_ENTROPY_RULES:
        return "reductions"
    if node.op == "ConvKernel":
        return "conv"
    recognized = {"Attention": "attention", "Rope": "rope"}
    if node.op in recognized and extractor.graph[extractor.ir_ids[eclass][0]].op != recognized[node.op]:
        return "recognition"
    return "algebra"


def family_of_eliminated(extractor: Extractor, eclass: int, absorbing: dict[int, list[int]], graph: Graph) -> str:
    """The family credited with an e-class the plan no longer computes."""
    rep = graph[extractor.ir_ids[eclass][0]]
    if rep.op in ("permute", "reshape", "const") or any(n.op == "Const" for n in extractor.view.nodes.get(eclass, ())):
        return "algebra"
    kernels = absorbing.get(rep.id)
    if not kernels:
        return "algebra"
    kernel = min(kernels, key=lambda c: extractor.rank[c])
    node = extractor.option(kernel).node
    if node.op == "ConvKernel" or rep.op in ("unfold", "fold"):
        return "conv"
    if rep.op in ("matmul", "fused_matmul", "sum", "max", "fused_reduce"):
        return family_of_kept(extractor, kernel)
    if node.op == "MatmulPrologue" and eclass == prologue_source(extractor, node):
        return "matmul"
    if node.op in ("MatmulKernel", "MatmulPrologue", "ReduceKernel"):
        family = "reductions" if node.op == "ReduceKernel" else "matmul"
        anchors = ("sum", "max", "fused_reduce") if node.op == "ReduceKernel" else ("matmul", "fused_matmul")
        return family if downstream_of(graph, rep.id, anchors, kernel, extractor, absorbing) else "pointwise"
    if node.op == "Kernel":
        return "pointwise"
    if node.op in CROSS_ENTROPY_RULES:
        return "reductions"
    if node.op in ("Attention", "Rope"):
        return "recognition"
    return "algebra"


def downstream_of(graph: Graph, node_id: int, anchors, kernel: int, extractor: Extractor, absorbing) -> bool:
    """Whether IR node `node_id` is (or reads, through nodes absorbed into `kernel`) an anchor op."""
    stack, seen = [node_id], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        if graph[current].op in anchors:
            return True
        for i in graph[current].inputs:
            if kernel in absorbing.get(i, ()) and extractor.view.class_of_ir[i] != kernel:
                stack.append(i)
    return False


def family_savings(extractor: Extractor, decoded: Decoded) -> list[FamilyStats]:
    """Cost(input graph) − cost(plan), split between the rule families (see the module docstring)."""
    graph = extractor.graph
    saved = {family: Cost() for family in FAMILIES}
    absorbing: dict[int, list[int]] = {}
    for eclass, covered in decoded.covered.items():
        for i in covered:
            absorbing.setdefault(i, []).append(eclass)
    for eclass, ids in extractor.ir_ids.items():
        for duplicate in ids[1:]:
            saved["algebra"] += node_cost(graph, duplicate)
        before = node_cost(graph, ids[0])
        if eclass in decoded.node_of_class:
            after = node_cost(decoded.graph, decoded.node_of_class[eclass])
            family = family_of_kept(extractor, eclass)
            saved[family] = saved[family] + before - after
        else:
            family = family_of_eliminated(extractor, eclass, absorbing, graph)
            saved[family] = saved[family] + before
    return [FamilyStats(family, saved[family]) for family in FAMILIES]
