"""DAG-aware extraction: which value each e-class is computed by, and which kernels inline what.

A plan picks, for every Term e-class, one *option*: an e-node, and for a pointwise kernel
(`Kernel`) also a mode:
- stored: the kernel writes its result and the kernels that use it read (load) it;
- inline: kernels whose body loads it recompute it instead (the `fuse_pointwise` equivalence);
  it is written only if something else needs it (a root, a matmul operand, a reduction…).
The plan then determines everything else:
- a kernel's body (a Pw e-class) is expanded into an expression tree: below the root, a Pw
  e-class holding `(Load s)` is inlined (expanded further) when s is in inline mode, read as a
  tensor otherwise; other Pw e-classes are expanded through one fixed e-node per class (the
  smallest, with the earliest loads: `PwInfo.inline_node`);
- a matmul's A operand is read like a load too when the matmul kernel has a prologue form
  (`MatmulPrologue`, whose prologue class holds `(Load A)`): A in inline mode is recomputed in the
  prologue (`Extractor.prologue_tree`), so one switch of A's mode moves every such matmul reading
  A to recomputing it, and A's kernel is dropped when nothing else needs it; A stored is read as
  is. The `MatmulKernel` twin of a `MatmulPrologue` is no option of its own (it reads A the same
  way as the stored mode). A recomputed A must still have a load of A's full stored shape (the
  matmul's A input, `$a`); an outer-product body has none, and the matmul then reads A stored;
- the materialised e-classes are those reached from the roots (outputs, updates, leaves) through
  the tensors each materialised kernel reads;
- the plan's cost is the sum of `cost.py`'s kernel cost over the materialised e-classes, each
  paid once (DAG cost), with the reads of a kernel the distinct tensors of its expanded body.

Acyclicity: each Term e-class has a rank, the smallest id of the IR nodes in it. An option is
valid only if every tensor it reads or inlines has a smaller rank, so any plan of valid options
is acyclic (the cycle t ≡ Kernel(F), F ∋ Load(t) is ruled out, as are the self-loops that
identities leave, x ≡ x·1). A fused kernel (a pointwise, matmul, reduction or conv kernel form)
is valid only if it binds at most the target's storage buffers (`Target.max_storage_buffers`:
its distinct tensors read, constants aside and the elements of one vector counted once, as
codegen binds them, and its results): inlining a long chain (the
gradient of a residual stream recomputed in a prologue) could otherwise read more tensors than
lavapipe's 32 bindings. Options are checked when the plan's cost is evaluated.

Search: start from the input graph's own plan (each IR node's own e-node, kernels stored), then
local search: for each e-class in rank order, try each other option and keep it if the plan's
cost drops. Ties are broken by a secondary count, the reads of tensors that a kernel computes
rather than buffers or views (so that a matmul reads a weight rather than a transposed copy
that another matmul still reads: the first switch frees nothing, the second frees the copy),
then by the number of values kept (so that reshape(reshape(x)) becomes one view), then by the
elementwise work, expression ops × the elements each is computed for (so that rsqrt of a row's
mean is computed once per row, in the reduction's epilogue, rather than for every element of a
consumer that could inline it for the same traffic: a matmul prologue). When no single switch
of a kernel's e-class helps, one compound move is tried, once per e-class: its mode toggled
(stored ↔ inline) and then each e-class reading it switched to its best option given that
(`switch_and_repair`), kept only if the plan's cost drops. Switching A back to stored from the
prologues of its matmuls pays only together with its weight gradient reading A directly instead
of a transposed product and a permute. (Compound moves are tried only where a reader has an
option with a prologue: `prologue_readers`.) Switches are evaluated incrementally: reference counts
of readers decide which values are materialised, and a change of mode re-expands only the
kernels that inlined or loaded that e-class; a rejected switch is undone from a journal of its
changes (`rollback`), without evaluating anything again. Passes repeat, each over the e-classes near the
previous pass's accepted switches, until no switch helps (or `max_passes`). The result is
always a complete, acyclic plan (the start is one, and every step keeps one; `Extractor.check`
makes sure).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import infer_type, op_def
from meganeura.rewrite.cost import Cost, Pricing, kernel_flops, pricing
from meganeura.rewrite.encode import Encoding, TermData
from meganeura.rewrite.kernels import form_type, priced_as, prologue_operand, tree_loads
from meganeura.rewrite.plan import Plan, PlanEntry, Provenance, PwTree
from meganeura.rewrite.pointwise import LIFTED
from meganeura.rewrite.schema import CONSTRUCTORS, op_of
from meganeura.rewrite.sorts import PW_CALLS, TERM, ENode
from meganeura.rewrite.view import EGraphView
from meganeura.target import GENERIC, Target

INVALID = 10**30  # the units of an invalid option: a move that makes one is always undone
MAX_PASSES = 6
NO_RANK = 1 << 62
# What the journal records (`Extractor.log`), with what undoing it needs.
CHOICE, CURRENT, REFCOUNT, MEMO, ADDED, CREATED, POPPED, REMOVED, USES = range(9)
MISSING = object()
# The forms of `Option.form`
PLAIN, POINTWISE, MATMUL, REDUCE, PROLOGUE = range(5)
FORMS = {"Kernel": POINTWISE, "MatmulKernel": MATMUL, "ConvKernel": MATMUL, "ReduceKernel": REDUCE}
FORMS["ReduceSplit"] = REDUCE
FORMS["MatmulPrologue"] = PROLOGUE
FORMS["MatmulSplit"] = PLAIN  # reads its operands as stored, like an unfused op
PW_CALL_NODES = ("PUnary", "PBinary", "PTernary")


@dataclass(frozen=True)
class Option:
    """One way to compute an e-class: an e-node, and (for a pointwise kernel) whether it is inlined.

    `op` is the IR op the e-node is priced and decoded as, `flops` its arithmetic and `pricing`
    its cost apart from its reads (static: they depend on shapes only); `launches` is whether it
    runs a kernel (leaves, reshapes and projections are buffers or views)."""

    node: ENode
    inline: bool = False
    op: str = ""
    flops: int = 0
    pricing: Pricing = Pricing(False)
    # How `Extractor.evaluate` reads it, fixed by the e-node: its form (one of FORMS), the Term
    # classes it reads besides its bodies, whether their ranks are below the e-class's, and the
    # elements its prologue runs over (a reduction's input, a matmul's A).
    form: int = field(default=0, compare=False)
    terms: tuple[int, ...] = field(default=(), compare=False)
    terms_ok: bool = field(default=True, compare=False)
    prologue_numel: int = field(default=0, compare=False)

    @property
    def launches(self) -> bool:
        return self.pricing.launches


@dataclass
class PwInfo:
    """One Pw e-class: the tensors it may load, its literal, and the e-node it is expanded through."""

    loads: list[int] = field(default_factory=list)  # Term classes s with (Load s) here, by rank
    literal: float | None = None
    inline_node: ENode | None = None


class Expansion(NamedTuple):
    """What expanding a Pw body reads: distinct tensors, the largest rank touched, validity, and
    its size in expression ops (loads and literals are free)."""

    loads: frozenset = frozenset()
    max_rank: int = -1
    ok: bool = True
    ops: int = 0


EMPTY = Expansion()
BAD = Expansion(ok=False)


def merge(parts: Iterable[Expansion]) -> Expansion:
    loads: set[int] = set()
    max_rank = -1
    ops = 0
    for part in parts:
        if not part.ok:
            return BAD
        loads |= part.loads
        max_rank = max(max_rank, part.max_rank)
        ops += part.ops
    return Expansion(frozenset(loads), max_rank, True, ops)


class Evaluation(NamedTuple):
    reads: frozenset
    units: int
    nonleaf_reads: int
    valid: bool
    work: int = 0  # elementwise work: expression ops × elements (a tie-break, see `search`)


class Extractor:
    """The plan search over one saturated e-graph."""

    def __init__(self, view: EGraphView, encoding: Encoding, target: Target = GENERIC) -> None:
        self.view = view
        self.target = target
        self.graph: Graph = encoding.graph
        self.encoding = encoding
        graph = self.graph
        self.ir_ids: dict[int, list[int]] = {}
        for node_id in encoding.encoded_ids:
            self.ir_ids.setdefault(view.class_of_ir[node_id], []).append(node_id)
        count = view.eclass_count
        self.rank = [NO_RANK] * count
        self.types: list[tuple[TensorType, ...] | None] = [None] * count
        self.type: list[TensorType | None] = [None] * count  # for e-classes of one result
        self.leafish = [False] * count
        for eclass, ids in self.ir_ids.items():
            self.rank[eclass] = 2 * ids[0]
            self.types[eclass] = graph[ids[0]].types
            # Tie-break (see `search`): reading a buffer or a view beats reading a computed copy.
            self.leafish[eclass] = any(not op_def(graph[i].op).kernel for i in ids)
        self.derive_classes()
        for eclass, types in enumerate(self.types):
            self.type[eclass] = types[0] if types is not None and len(types) == 1 else None
        self.nbytes = [sum(t.nbytes for t in ts) if ts is not None else 0 for ts in self.types]
        self.numel = [t.numel if t is not None else 0 for t in self.type]
        self.results = [len(ts) if ts is not None else 0 for ts in self.types]
        self.constant = self.constant_classes()
        self.drawn = self.drawn_classes()
        self.bound_as = self.bound_classes()
        self.read_bytes = [0 if self.constant[c] or self.drawn[c] else self.nbytes[c] for c in range(count)]
        # A random tensor drawn in place costs its readers a draw per element, not bytes (cost.py).
        self.draws = [self.numel[c] if self.drawn[c] else 0 for c in range(count)]
        for eclass in range(count):
            self.leafish[eclass] = self.leafish[eclass] or self.drawn[eclass]
        self.pw: dict[int, PwInfo] = {}
        self.options: dict[int, list[Option]] = {}
        self.read_pw_classes()
        self.choose_inline_nodes()
        self.build_options()
        # plan state
        self.choice: dict[int, int] = {}
        self.refcount = [0] * count
        self.current: dict[int, Evaluation] = {}  # materialised classes -> their evaluation
        self.memo: dict[int, Expansion] = {}
        self.dependents: dict[int, set[int]] = {}  # Pw class -> keys whose evaluation used its memo
        self.mode_dependents: dict[int, set[int]] = {}  # Term class -> keys that consulted its mode
        self.uses: dict[int, list[tuple[dict, int]]] = {}  # key -> where its evaluation registered
        self.frames: list[list[tuple[dict, int]]] = []  # the registrations of the keys being evaluated
        self.stack: set[int] = set()
        self.total = 0
        self.total2 = 0
        self.total3 = 0
        self.roots: list[int] = []
        self.touched: list[int] = []  # e-classes materialised or dropped by the current switch
        self.log: list[tuple] = []  # every change of the plan state since the last `commit`

    # -- e-graph facts ---------------------------------------------------------------------

    def derive_classes(self) -> None:
        """Rank and type the Term e-classes that rules made and no IR node is in (the tuple of an
        attention that recognition built, the partials of a split reduction, the transforms and
        the product of a Winograd convolution, a random tensor's draw): such a class ranks just
        before the earliest ranked e-class with an e-node reading it, directly or by a load that is
        one of its bodies (ranks of IR e-classes are even, twice their
        first IR node's id), and takes the type its op infers from its e-node's operands (a
        kernel form's, `kernels.form_type`). Ranks go down from the IR classes and types up
        from the leaves, each to a fixed point, since a made class may read made classes only (a
        Winograd product reads its two transforms); a made class left untyped is left unranked,
        so nothing reads it. Ranks may then tie with an IR class's; a tie is never a valid read
        (reads rank strictly lower), so plans stay acyclic."""
        view = self.view
        made = []
        while True:
            readers: dict[int, int] = {}
            for eclass, nodes in view.nodes.items():
                if self.rank[eclass] == NO_RANK or view.is_pw[eclass]:
                    continue
                for node in nodes:
                    for child in node.children:
                        if not view.is_pw[child] and self.rank[child] == NO_RANK:
                            readers[child] = min(readers.get(child, NO_RANK), self.rank[eclass])
                        elif view.is_pw[child]:  # a made class loaded by a body (regenerate_random's draw)
                            for load in view.nodes.get(child, ()):
                                loaded = load.children[0] if load.op == "Load" else None
                                if loaded is not None and self.rank[loaded] == NO_RANK:
                                    readers[loaded] = min(readers.get(loaded, NO_RANK), self.rank[eclass])
            if not readers:
                break
            for eclass, reader in readers.items():
                self.rank[eclass] = reader - 1
                made.append(eclass)
        while any([self.derive_type(eclass) for eclass in made if self.types[eclass] is None]):
            pass
        for eclass in made:
            if self.types[eclass] is None:
                self.rank[eclass] = NO_RANK

    def derive_type(self, eclass: int) -> bool:
        """Type a made e-class from the first of its e-nodes whose operands are typed; whether it could."""
        for node in self.view.nodes.get(eclass, ()):
            op = op_of(node.op, node.primitives) if node.op in CONSTRUCTORS else None
            if op is None and node.op in FORMS:  # a kernel form (the partials of a split)
                inferred = self.form_type(node)
                if inferred is not None:
                    self.types[eclass] = (inferred,)
                    return True
                continue
            children = [self.types[c] for c in node.children]
            if op is None or any(t is None or len(t) != 1 for t in children):
                continue
            constructor = CONSTRUCTORS[node.op]
            primitives = zip(constructor.primitives, node.primitives, strict=True)
            attrs = {f.name: v for f, v in primitives if f.kind == "attr"}
            inferred = infer_type(op, [t[0] for t in children], attrs)
            self.types[eclass] = inferred if isinstance(inferred, tuple) else (inferred,)
            return True
        return False

    def form_type(self, node: ENode) -> TensorType | None:
        """The type of a kernel-form e-node from its primitives and Term children (`kernels.form_type`)."""
        fields = CONSTRUCTORS[node.op].children
        terms = [self.types[c] for c, f in zip(node.children, fields, strict=True) if f.sort == TERM]
        if any(t is not None and len(t) != 1 for t in terms):
            return None
        return form_type(node.op, node.primitives, [t[0] if t is not None else None for t in terms])

    def read_pw_classes(self) -> None:
        for eclass, nodes in self.view.nodes.items():
            if not self.view.is_pw[eclass]:
                continue
            info = self.pw.setdefault(eclass, PwInfo())
            for node in nodes:
                if node.op == "Load":
                    if self.rank[node.children[0]] != NO_RANK:
                        info.loads.append(node.children[0])
                elif node.op == "Lit":
                    info.literal = node.primitives[0]
            info.loads.sort(key=lambda s: self.rank[s])

    def child_key(self, pw_class: int, keys: dict[int, tuple[int, int]]) -> tuple[int, int]:
        """(rank, size) of a Pw class below a root: the earliest tensor it may load, and its size
        when fully inlined (so swiglu(g, u) beats mul(silu(g), u) when silu(g) is inlined)."""
        info = self.pw.get(pw_class)
        if info is None:  # no extractable e-node (e.g. a `Replace` a stopped saturation left): unusable
            return (NO_RANK, 1)
        if info.literal is not None:
            return (-1, 1)
        inlined = keys.get(pw_class, (NO_RANK, 1))
        if info.loads:
            return (self.rank[info.loads[0]], inlined[1])
        return inlined

    def choose_inline_nodes(self) -> None:
        """Per Pw class, the non-load e-node with the earliest loads, then the fewest nodes (a fixpoint)."""
        keys: dict[int, tuple[int, int]] = {}
        candidates = {
            eclass: [n for n in self.view.nodes[eclass] if n.op != "Load"]
            for eclass in self.pw
            if self.view.nodes.get(eclass)
        }
        for _ in range(64):
            changed = False
            for eclass, nodes in candidates.items():
                best = keys.get(eclass)
                chosen = None
                for node in nodes:
                    rank, size = -1, 1
                    for child in node.children:
                        child_rank, child_size = self.child_key(child, keys)
                        rank, size = max(rank, child_rank), size + child_size
                    if rank >= NO_RANK:
                        continue
                    if best is None or (rank, size) < best:
                        best, chosen = (rank, size), node
                if chosen is not None:
                    keys[eclass] = best
                    self.pw[eclass].inline_node = chosen
                    changed = True
            if not changed:
                break

    def constant_classes(self) -> list[bool]:
        """Per e-class, whether its value is a scalar constant (a Const, or a reshape of one):
        reading it costs nothing, as kernels inline it (`cost.constant_node` on the IR side)."""
        constant = [False] * self.view.eclass_count
        for eclass in sorted(self.ir_ids, key=lambda c: self.rank[c]):
            for node in self.view.nodes.get(eclass, ()):
                if node.op == "Const" or (node.op == "Reshape" and constant[node.children[0]]):
                    constant[eclass] = True
        return constant

    def drawn_classes(self) -> list[bool]:
        """Per e-class, whether it is a random tensor drawn where it is read (a `Philox`, made by
        `regenerate_random`): reading it binds the RNG state and costs a draw per element."""
        drawn = [False] * self.view.eclass_count
        for eclass, nodes in self.view.nodes.items():
            if any(node.op == "Philox" for node in nodes):
                drawn[eclass] = True
        return drawn

    def bound_classes(self) -> list[int]:
        """Per e-class, the e-class a kernel binds to read it: an `element`'s vector (a kernel
        reading several elements of one vector binds it once: `codegen.common.bound_value`), the
        RNG state of a random tensor drawn in place (`codegen.common.Operands.read_at`), else
        itself."""
        bound = list(range(self.view.eclass_count))
        for eclass, nodes in self.view.nodes.items():
            for node in nodes:
                if node.op in ("Element", "Philox"):
                    bound[eclass] = node.children[0]
        return bound

    def build_options(self) -> None:
        view = self.view
        for eclass, nodes in view.nodes.items():
            if view.is_pw[eclass] or self.rank[eclass] == NO_RANK:
                continue
            has_kernel = any(n.op == "Kernel" for n in nodes)
            options = []
            for node in nodes:
                if node.op in LIFTED and has_kernel:
                    continue  # the kernel's stored mode computes the same thing
                if node.op in ("Matmul", "Reduce") and self.twin(node) is not None:
                    continue  # the kernel twin with a trivial epilogue computes the same thing
                if node.op == "MatmulKernel" and self.prologue_twin(node) is not None:
                    continue  # its prologue form reads A the same way while A is stored
                option = self.option_of(node)
                options.append(option)
                if node.op == "Kernel":
                    options.append(dataclasses.replace(option, inline=True))
            self.options[eclass] = options

    def option_of(self, node: ENode) -> Option:
        """The stored option of an e-node, priced on the target."""
        op, attrs, operands = self.priced_as(node)
        out = self.types[node.eclass]
        flops = kernel_flops(op, attrs, operands, out) if op_def(op).flops and None not in operands else 0
        form = FORMS.get(node.op, PLAIN)
        terms = {MATMUL: node.children[:2], PROLOGUE: node.children[1:2], PLAIN: node.children}.get(form, ())
        numel = {REDUCE: 3, PROLOGUE: 0}
        prologue_numel = TensorType(node.primitives[numel[form]]).numel if form in numel else 0
        terms_ok = all(self.rank[t] < self.rank[node.eclass] for t in terms)
        cost = pricing(op, attrs, operands, out, flops, self.target)
        return Option(node, False, op, flops, cost, form, terms, terms_ok, prologue_numel)

    def priced_as(self, node: ENode) -> tuple[str, dict, list]:
        """(the IR op an e-node decodes to, its attributes, its operand types), for `cost.pricing`."""
        constructor = CONSTRUCTORS[node.op]
        children_types = [
            self.type[c] for c, f in zip(node.children, constructor.children, strict=True) if f.sort == TERM
        ]
        out = self.types[node.eclass]
        if constructor.op is None and constructor.tag is None:  # a kernel form
            op, attrs, operands = priced_as(node.op, node.primitives, children_types, out)
        else:
            op = op_of(node.op, node.primitives)
            attrs = {f.name: value for f, value in zip(constructor.primitives, node.primitives, strict=True)}
            operands = children_types
        return op, attrs, operands

    def twin(self, node: ENode) -> ENode | None:
        """The kernel e-node with a trivial epilogue (and prologue) of a Matmul or Reduce e-node."""
        view = self.view
        if node.op == "Matmul":
            acc = view.find("Acc", (), ())
            key = ("MatmulKernel", (*node.children, acc), node.primitives)
        else:
            load = view.find("Load", node.children, ())
            r = view.find("R", (), ())
            source = self.type[node.children[0]]
            if source is None:
                return None
            key = ("ReduceKernel", (load, r), (*node.primitives, source.shape))  # (kind, axes, keepdim, in_shape)
        eclass = view.find(*key)
        return ENode(key[0], eclass, key[1], key[2]) if eclass == node.eclass else None

    def prologue_twin(self, node: ENode) -> ENode | None:
        """The `MatmulPrologue` e-node of a `MatmulKernel` whose prologue is the load of its A operand."""
        a, b, epilogue = node.children
        load = self.view.find("Load", (a,), ())
        if load is None or self.type[a] is None:
            return None
        key = ("MatmulPrologue", (load, b, epilogue), (self.type[a].shape, *node.primitives))
        eclass = self.view.find(*key)
        return ENode(key[0], eclass, key[1], key[2]) if eclass == node.eclass else None

    # -- expansion of kernel bodies -------------------------------------------------------------

    def inline_mode(self, s: int) -> bool:
        index = self.choice.get(s)
        return index is not None and self.options[s][index].inline

    def root(self, pw_class: int) -> Expansion:
        """Expand a Pw class through its inline node (as a kernel body, or an inlined producer)."""
        found = self.memo.get(pw_class)
        if found is not None:
            return found
        info = self.pw.get(pw_class)
        if info is None or pw_class in self.stack:
            return BAD
        node = info.inline_node
        if node is None:  # only loads (a broadcast kernel's body): read the earliest
            if not info.loads:
                return BAD
            s = info.loads[0]
            result = Expansion(frozenset((s,)), self.rank[s])
            self.set_memo(pw_class, result)
            return result
        self.stack.add(pw_class)
        self.frames.append([])
        result = merge(self.child(child, pw_class) for child in node.children)
        self.set_uses(pw_class, self.frames.pop())
        if result.ok and node.op in PW_CALL_NODES:
            result = result._replace(ops=result.ops + 1)
        self.stack.discard(pw_class)
        self.set_memo(pw_class, result)
        return result

    def child(self, pw_class: int, parent: int) -> Expansion:
        """Expand a Pw class below the root of a body: a literal, a load, or an inlined producer."""
        info = self.pw.get(pw_class)
        if info is None:
            return BAD
        if info.literal is not None:
            return EMPTY
        if info.loads:
            for s in info.loads:
                self.register(self.mode_dependents, s, parent)
            for s in info.loads:
                if self.inline_mode(s):
                    self.register(self.dependents, pw_class, parent)
                    inner = self.root(pw_class)
                    if not inner.ok:
                        return BAD
                    return Expansion(inner.loads, max(inner.max_rank, self.rank[s]), True, inner.ops)
            s = info.loads[0]
            return Expansion(frozenset((s,)), self.rank[s])
        self.register(self.dependents, pw_class, parent)
        return self.root(pw_class)

    # -- evaluating options ------------------------------------------------------------------------

    def evaluate(self, eclass: int) -> Evaluation:
        """The reads and cost of the e-class's chosen option, its uses of modes and memos recorded."""
        self.frames.append([])
        evaluation = self.evaluation(eclass)
        self.set_uses(eclass, self.frames.pop())
        return evaluation

    def evaluation(self, eclass: int) -> Evaluation:
        """The reads and cost of the e-class's chosen option (priced by `cost.price`)."""
        option = self.options[eclass][self.choice[eclass]]
        if not option.terms_ok:
            return Evaluation(frozenset(), INVALID, 0, False)
        children = option.node.children
        form = option.form
        out_numel = self.numel[eclass]
        if form == POINTWISE:
            self.register(self.dependents, children[0], eclass)
            expansion = self.root(children[0])
            work = expansion.ops * out_numel
        elif form == MATMUL:
            expansion = self.child(children[2], eclass)
            work = expansion.ops * out_numel
        elif form == REDUCE:
            prologue, epilogue = self.child(children[0], eclass), self.child(children[1], eclass)
            expansion = merge((prologue, epilogue))
            work = prologue.ops * option.prologue_numel + epilogue.ops * out_numel
        elif form == PROLOGUE:
            loaded, finish = self.prologue_expansion(option.node, eclass), self.child(children[2], eclass)
            expansion = merge((loaded, finish))
            work = loaded.ops * option.prologue_numel + finish.ops * out_numel
        else:
            expansion = EMPTY
            work = 0
        if not expansion.ok or expansion.max_rank >= self.rank[eclass]:
            return Evaluation(frozenset(), INVALID, 0, False)
        terms = option.terms
        reads = expansion.loads.union(terms) if terms else expansion.loads
        if not option.launches:
            return Evaluation(reads, 0, 0, True)
        read_bytes = self.read_bytes
        # A matmul binds `a` and `b` apart even where they are one tensor (x·xᵀ): one more, to be safe.
        written = self.results[eclass] + (form == MATMUL or form == PROLOGUE)
        if form != PLAIN and len(reads) + written > self.target.max_storage_buffers:
            constant, bound_as = self.constant, self.bound_as
            bound = len({bound_as[s] for s in reads if not constant[s]}) + written  # constants are literals
            if bound > self.target.max_storage_buffers:
                return Evaluation(frozenset(), INVALID, 0, False)  # more buffers than a kernel may bind
        draws = self.draws
        units = option.pricing.units(sum([read_bytes[s] for s in reads]), sum([draws[s] for s in reads]))
        leafish = self.leafish
        return Evaluation(reads, units, sum([1 for s in reads if not leafish[s]]), True, work)

    def prologue_operand(self, loads: Iterable[int], a_shape: tuple[int, ...]) -> int | None:
        """The tensor a prologue reads as the matmul's A input (`$a`), see `kernels.prologue_operand`
        (never a random tensor drawn in place: A is read from a buffer)."""
        return prologue_operand([s for s in loads if not self.drawn[s]], a_shape, self.types, self.rank)

    def prologue_expansion(self, node: ENode, parent: int) -> Expansion:
        """What the A operand of a `MatmulPrologue` reads: A's producer, recomputed when A is in
        inline mode and the recomputation loads a tensor of A's shape, else A as stored."""
        loaded = self.child(node.children[0], parent)
        if not loaded.ok or self.prologue_operand(loaded.loads, node.primitives[0]) is not None:
            return loaded
        a = self.prologue_operand(self.pw[node.children[0]].loads, node.primitives[0])
        return BAD if a is None else Expansion(frozenset((a,)), self.rank[a])

    def prologue_tree(self, node: ENode) -> PwTree:
        """The expression tree the plan computes A with in a `MatmulPrologue` (see `prologue_expansion`)."""
        tree = self.tree(node.children[0], False)
        if self.prologue_operand(tree_loads(tree), node.primitives[0]) is None:
            return ("load", self.prologue_operand(self.pw[node.children[0]].loads, node.primitives[0]))
        return tree

    # -- plan state: a journal, so that a rejected move is undone without evaluating anything ---------

    def set_current(self, key: int, evaluation: Evaluation | None) -> None:
        """Record e-class `key` as materialised with `evaluation` (None: no longer materialised)."""
        self.log.append((CURRENT, key, self.current.get(key, MISSING)))
        if evaluation is None:
            del self.current[key]
        else:
            self.current[key] = evaluation

    def set_memo(self, pw_class: int, expansion: Expansion | None) -> None:
        """Memoise (or, with None, forget) the expansion of a Pw class."""
        old = self.memo.get(pw_class, MISSING)
        if expansion is None:
            if old is MISSING:
                return
            del self.memo[pw_class]
        else:
            self.memo[pw_class] = expansion
        self.log.append((MEMO, pw_class, old))

    def register(self, table: dict[int, set[int]], key: int, parent: int) -> None:
        """Note in `table` (`dependents` or `mode_dependents`) that the evaluation of `parent` (the
        key being evaluated) used `key`."""
        members = table.get(key)
        if members is None:
            members = table[key] = set()
            self.log.append((CREATED, table, key))
        if parent not in members:
            members.add(parent)
            self.log.append((ADDED, members, parent))
        self.frames[-1].append((table, key))

    def set_uses(self, key: int, uses: list[tuple[dict, int]]) -> None:
        """Record where `key`'s evaluation (or memo) registered itself, for `forget`."""
        old = self.uses.get(key, MISSING)
        if old is MISSING and not uses:
            return
        self.log.append((USES, key, old))
        self.uses[key] = uses

    def forget(self, parent: int) -> None:
        """Take `parent` out of every table its evaluation registered in: that evaluation (or
        memo) is gone, so a change of what it used need not re-evaluate it. (Left in, such stale
        entries made a change of one class re-evaluate every later block of a residual stream.)"""
        where = self.uses.pop(parent, None)
        if where is None:
            return
        self.log.append((USES, parent, where))
        for table, key in where:
            members = table.get(key)
            if members is not None and parent in members:
                members.discard(parent)
                self.log.append((REMOVED, members, parent))

    def pop_dependents(self, table: dict[int, set[int]], key: int) -> set[int] | tuple:
        """Take the keys that used `key` out of `table` (they are about to be re-evaluated)."""
        members = table.pop(key, None)
        if members is None:
            return ()
        self.log.append((POPPED, table, key, members))
        return members

    def checkpoint(self) -> tuple[int, int, int, int]:
        return (len(self.log), self.total, self.total2, self.total3)

    def rollback(self, mark: tuple[int, int, int, int]) -> None:
        """Undo every change since `checkpoint()` returned `mark`, newest first."""
        length, self.total, self.total2, self.total3 = mark
        log = self.log
        while len(log) > length:
            entry = log.pop()
            kind = entry[0]
            if kind == CURRENT:
                if entry[2] is MISSING:
                    del self.current[entry[1]]
                else:
                    self.current[entry[1]] = entry[2]
            elif kind == REFCOUNT:
                self.refcount[entry[1]] -= entry[2]
            elif kind == MEMO:
                if entry[2] is MISSING:
                    del self.memo[entry[1]]
                else:
                    self.memo[entry[1]] = entry[2]
            elif kind == ADDED:
                entry[1].discard(entry[2])
            elif kind == CREATED:
                del entry[1][entry[2]]
            elif kind == REMOVED:
                entry[1].add(entry[2])
            elif kind == USES:
                if entry[2] is MISSING:
                    del self.uses[entry[1]]
                else:
                    self.uses[entry[1]] = entry[2]
            elif kind == POPPED:
                entry[1][entry[2]] = entry[3]
            else:  # CHOICE
                self.choice[entry[1]] = entry[2]

    def commit(self) -> None:
        """Keep the changes made so far (nothing before this can be rolled back)."""
        self.log.clear()

    # -- plan state: reference counts --------------------------------------------------------------

    def incref(self, eclass: int) -> None:
        stack = [eclass]
        while stack:
            s = stack.pop()
            self.refcount[s] += 1
            self.log.append((REFCOUNT, s, 1))
            if self.refcount[s] == 1:
                self.touched.append(s)
                evaluation = self.evaluate(s)
                self.set_current(s, evaluation)
                self.total += evaluation.units
                self.total2 += evaluation.nonleaf_reads
                self.total3 += evaluation.work
                stack.extend(evaluation.reads)

    def decref(self, eclass: int) -> None:
        stack = [eclass]
        while stack:
            s = stack.pop()
            self.refcount[s] -= 1
            self.log.append((REFCOUNT, s, -1))
            if self.refcount[s] == 0:
                self.touched.append(s)
                evaluation = self.current[s]
                self.set_current(s, None)
                self.forget(s)
                self.total -= evaluation.units
                self.total2 -= evaluation.nonleaf_reads
                self.total3 -= evaluation.work
                stack.extend(evaluation.reads)

    def invalidate(self, keys: Iterable[int]) -> set[int]:
        """Drop the memos that depend on `keys`; the Term classes whose evaluation must be redone."""
        affected: set[int] = set()
        queue = list(keys)
        seen: set[int] = set()
        while queue:
            key = queue.pop()
            if key in seen:
                continue
            seen.add(key)
            if self.view.is_pw[key]:
                self.set_memo(key, None)
                self.forget(key)
                queue.extend(self.pop_dependents(self.dependents, key))
            else:
                affected.add(key)
        return affected

    def set_option(self, eclass: int, index: int) -> None:
        """Switch an e-class to another option, updating the materialised set and the totals."""
        old = self.options[eclass][self.choice[eclass]]
        self.log.append((CHOICE, eclass, self.choice[eclass]))
        self.choice[eclass] = index
        affected = {eclass}
        if old.inline != self.options[eclass][index].inline:
            affected |= self.invalidate(self.pop_dependents(self.mode_dependents, eclass))
        increments: list[int] = []
        decrements: list[int] = []
        self.touched.extend(affected)
        for key in affected:
            self.forget(key)
            before = self.current.get(key)
            if before is None:
                continue
            after = self.evaluate(key)
            self.set_current(key, after)
            self.total += after.units - before.units
            self.total2 += after.nonleaf_reads - before.nonleaf_reads
            self.total3 += after.work - before.work
            increments.extend(after.reads - before.reads)
            decrements.extend(before.reads - after.reads)
        for s in increments:
            self.incref(s)
        for s in decrements:
            self.decref(s)

    # -- search --------------------------------------------------------------------------------------

    def objective(self) -> tuple[int, int, int, int]:
        """What the search minimises: cost, then reads of computed tensors, then values kept, then
        elementwise work."""
        return (self.total, self.total2, len(self.current), self.total3)

    def start(self, roots: list[int], choice: dict[int, int]) -> None:
        self.choice = dict(choice)
        self.roots = roots
        for root in roots:
            self.incref(root)
        self.commit()

    def search(self, max_passes: int = MAX_PASSES, deadline: float | None = None) -> int:
        """Local search over single switches; returns the number of passes run.

        The first pass tries every e-class with alternatives, in rank order; later passes only
        the e-classes near an accepted switch (those it touched, and the ones reading them).
        """
        candidates = [c for c, opts in self.options.items() if len(opts) > 1]
        readers = self.readers()
        worklist = set(candidates)
        passes = 0
        compounds_tried: set[int] = set()
        while worklist and passes < max_passes:
            passes += 1
            touched: set[int] = set()
            for eclass in sorted(worklist, key=lambda c: self.rank[c]):
                if len(self.options[eclass]) < 2:
                    continue
                if self.refcount[eclass] == 0 and not self.mode_dependents.get(eclass):
                    continue  # neither computed nor inlined anywhere: its choice changes nothing
                current = start = self.choice[eclass]
                for index in range(len(self.options[eclass])):
                    if index == self.choice[eclass]:
                        continue
                    before = self.objective()
                    self.touched = []
                    # What the option read before: their other readers may now pay to switch too
                    # (the last reader of a tensor frees it).
                    old_reads = self.current[eclass].reads if eclass in self.current else frozenset()
                    mark = self.checkpoint()
                    self.set_option(eclass, index)
                    if self.objective() < before:
                        current = index
                        touched.add(eclass)
                        touched.update(self.touched)
                        touched.update(old_reads)
                    else:
                        self.rollback(mark)
                    self.commit()
                toggle = self.mode_twin(eclass)
                if (
                    current == start
                    and toggle is not None
                    and eclass not in compounds_tried
                    and self.prologue_readers(eclass, readers)
                ):
                    compounds_tried.add(eclass)
                    self.touched = []
                    changed = self.switch_and_repair(eclass, toggle, readers.get(eclass, set()))
                    inline = self.choice[eclass] if self.option(eclass).inline else self.mode_twin(eclass)
                    changed += self.switch_and_repair(eclass, inline, readers.get(eclass, set()), detach=True)
                    self.commit()
                    if changed:
                        touched.update(changed)
                        touched.update(self.touched)
            if deadline is not None and time.perf_counter() > deadline:
                break
            worklist = set()
            for eclass in touched:
                worklist.add(eclass)
                worklist.update(readers.get(eclass, ()))
        return passes

    def prologue_readers(self, eclass: int, readers: dict[int, set[int]]) -> bool:
        """Whether a class reading `eclass` has an option with a prologue (a matmul's or a
        reduction's), which may recompute `eclass` there: only then does a compound move on
        `eclass` pay. Its readers' other options follow a switch of its mode by themselves (a
        pointwise kernel or an epilogue inlines what it loads in inline mode); on the four
        models of benchmarks/compile_scale.py the moves this leaves out never changed a plan."""
        return any(
            option.form in (PROLOGUE, REDUCE)
            for reader in readers.get(eclass, ())
            if reader != eclass
            for option in self.options[reader]
        )

    def mode_twin(self, eclass: int) -> int | None:
        """The index of the chosen kernel's other mode (stored ↔ inline), if it is a kernel."""
        option = self.options[eclass][self.choice[eclass]]
        if option.node.op != "Kernel":
            return None
        twin = dataclasses.replace(option, inline=not option.inline)
        return next((i for i, o in enumerate(self.options[eclass]) if o == twin), None)

    def switch_and_repair(self, eclass: int, index: int, readers: set[int], detach: bool = False) -> list[int]:
        """A compound move: switch `eclass` (a kernel's mode), then each class reading it to its best
        option given that; kept if the plan gets cheaper (the classes changed are returned), else
        undone. A matmul that recomputes A in its prologue while A's mode is inline may make a
        switch of A back to stored pay only together with a switch of A's other readers (a weight
        gradient that reads A as B, instead of a transposed product and a permute).

        With `detach`, each reader takes its best option among those that no longer read `eclass`
        (directly or through a view of it, a reshape): switching several readers away pays only
        all together (three projections that recompute a normalised input in their prologues
        drop its kernel only when the last one stops reading it), which greedy repair, one
        reader at a time, never reaches."""
        repairable = [
            reader
            for reader in sorted(readers - {eclass}, key=lambda c: self.rank[c])
            if len(self.options[reader]) > 1 and (self.refcount[reader] or self.mode_dependents.get(reader))
        ]
        if not repairable:
            return []
        before = self.objective()
        mark = self.checkpoint()
        changed = [eclass]
        self.set_option(eclass, index)
        avoided = {eclass, *self.views_of(eclass, readers)} if detach else set()
        for reader in repairable:
            if reader in avoided:
                continue
            start = best_index = self.choice[reader]
            best = None if self.reads_any(reader, avoided) else self.objective()
            for candidate in range(len(self.options[reader])):
                if candidate == best_index:
                    continue
                tried = self.checkpoint()
                self.set_option(reader, candidate)
                if not self.reads_any(reader, avoided) and (best is None or self.objective() < best):
                    best, best_index = self.objective(), candidate
                else:
                    self.rollback(tried)
            if best_index != start:
                changed.append(reader)
        if self.objective() < before:
            return changed
        self.rollback(mark)
        return []

    def views_of(self, eclass: int, readers: set[int]) -> set[int]:
        """The classes among `readers` that the plan computes as a view of `eclass` (a reshape)."""
        views = set()
        for reader in readers:
            evaluation = self.current.get(reader)
            if evaluation is not None and not self.option(reader).launches and eclass in evaluation.reads:
                views.add(reader)
        return views

    def reads_any(self, eclass: int, targets: set[int]) -> bool:
        """Whether the plan's option for `eclass` reads any of `targets`."""
        evaluation = self.current.get(eclass)
        return evaluation is not None and not targets.isdisjoint(evaluation.reads)

    def readers(self) -> dict[int, set[int]]:
        """For each Term e-class, the e-classes with an option reading it (directly or through a
        body's load) — the ones whose best option may change when it changes."""
        loaded_in: dict[int, set[int]] = {}
        for pw_class, info in self.pw.items():
            for s in info.loads:
                loaded_in.setdefault(pw_class, set()).add(s)
        parents_of_pw: dict[int, set[int]] = {}
        for eclass, nodes in self.view.nodes.items():
            if self.view.is_pw[eclass]:
                for node in nodes:
                    for child in node.children:
                        parents_of_pw.setdefault(child, set()).add(eclass)
        result: dict[int, set[int]] = {}
        for eclass, options in self.options.items():
            for option in options:
                for child in option.node.children:
                    if not self.view.is_pw[child]:
                        result.setdefault(child, set()).add(eclass)
                        continue
                    # the loads of the body, and one level of inlining below it
                    for pw in (child, *(c for n in self.view.nodes.get(child, ()) for c in n.children)):
                        for s in loaded_in.get(pw, ()):
                            result.setdefault(s, set()).add(eclass)
        return result

    # -- the chosen plan ------------------------------------------------------------------------

    def check(self) -> None:
        """Fail loudly unless the plan computes every root with valid options (acyclic, complete)."""
        missing = [root for root in self.roots if root not in self.current]
        invalid = [c for c, evaluation in self.current.items() if not evaluation.valid]
        if missing or invalid:
            raise RuntimeError(f"extraction: plan misses roots {missing} or has invalid options at {invalid}")

    def materialised(self) -> list[int]:
        """The e-classes the plan computes, in rank order (a topological order)."""
        return sorted(self.current, key=lambda c: self.rank[c])

    def option(self, eclass: int) -> Option:
        return self.options[eclass][self.choice[eclass]]

    def tree(self, pw_class: int, is_root: bool) -> PwTree:
        """The expression tree the plan computes for a Pw class (leaves: ("load", Term class)…)."""
        info = self.pw[pw_class]
        if not is_root:
            if info.literal is not None:
                return ("lit", info.literal)
            if info.loads:
                if not any(self.inline_mode(s) for s in info.loads):
                    return ("load", info.loads[0])
        node = info.inline_node
        if node is None:
            return ("load", info.loads[0])
        if node.op == "Lit":
            return ("lit", node.primitives[0])
        if node.op == "Acc":
            return ("acc",)
        if node.op == "R":
            return ("r",)
        children = tuple(self.tree(child, False) for child in node.children)
        return ("call", node.primitives[0], *children)

    def bodies(self, node: ENode) -> tuple[tuple[PwTree, ...], list[tuple]]:
        """The expanded Pw fields of a chosen e-node, as the plan computes them, and the events of
        their expansion (`events`)."""
        events: list[tuple] = []
        if node.op == "Kernel":
            events += self.events(node.children[0], True)
            return (self.tree(node.children[0], True),), events
        if node.op == "MatmulPrologue":
            prologue = self.prologue_tree(node)
            if prologue == self.tree(node.children[0], False):  # else A is read as stored
                events += self.events(node.children[0], False)
            events += self.events(node.children[2], False)
            return (prologue, self.tree(node.children[2], False)), events
        trees = []
        for child, f in zip(node.children, CONSTRUCTORS[node.op].children, strict=True):
            if f.sort != TERM:
                events += self.events(child, False)
                trees.append(self.tree(child, False))
        return tuple(trees), events

    def stored_a_twin(self, node: ENode) -> ENode | None:
        """For a `MatmulPrologue` whose prologue reads A as stored, the `MatmulKernel` of its e-class
        over the same B, transposes and epilogue: the plan computes that plain matmul kernel."""
        if node.op != "MatmulPrologue":
            return None
        a = self.prologue_operand(self.pw[node.children[0]].loads, node.primitives[0])
        if self.prologue_tree(node) != ("load", a):
            return None
        b, epilogue = node.children[1], node.children[2]
        for other in self.view.nodes.get(node.eclass, ()):
            same = other.children == (a, b, epilogue) and other.primitives == node.primitives[1:]
            if other.op == "MatmulKernel" and same:
                return other
        return None

    def plain_forms(self, node: ENode) -> tuple[ENode, ...]:
        """The plain e-nodes a kernel form computes, wherever they are, the plainest first: for a
        matmul kernel (with any prologue or epilogue) the `Matmul` over the same operands and
        transposes and its `MatmulKernel` with epilogue `$acc`; for a reduction kernel whose
        prologue is a plain load, the `Reduce` of that load; for a convolution kernel, the one with
        epilogue `$acc` (credit for the rules that made them, attribution.py)."""
        view = self.view
        found: list[ENode] = []

        def add(op: str, children: tuple[int, ...], primitives: tuple) -> None:
            eclass = view.find(op, children, primitives)
            if eclass is not None:
                found.append(ENode(op, eclass, children, primitives))

        if node.op in ("MatmulKernel", "MatmulPrologue"):
            if node.op == "MatmulKernel":
                a, b = node.children[:2]
            else:
                a = self.prologue_operand(self.pw[node.children[0]].loads, node.primitives[0])
                b = node.children[1]
            flags = node.primitives[-2:]
            acc = view.find("Acc", (), ())
            if a is not None:
                add("Matmul", (a, b), flags)
                if acc is not None:
                    add("MatmulKernel", (a, b, acc), flags)
        elif node.op == "ReduceKernel":
            loads = self.pw[node.children[0]].loads
            if loads:
                add("Reduce", (loads[0],), node.primitives[:3])
        elif node.op == "ConvKernel":
            acc = view.find("Acc", (), ())
            if acc is not None:
                add("ConvKernel", (*node.children[:2], acc), node.primitives)
        return tuple(found)

    def plan(self) -> Plan:
        """The chosen plan as an immutable value (plan.py)."""
        entries: dict[int, PlanEntry] = {}
        inline: set[int] = set()
        for eclass in self.materialised():
            option = self.option(eclass)
            node = self.stored_a_twin(option.node) or option.node
            if node is not option.node:
                option = self.option_of(node)
            bodies, events = self.bodies(node)
            terms = [c for c, f in zip(node.children, CONSTRUCTORS[node.op].children, strict=True) if f.sort == TERM]
            reads = list(dict.fromkeys([*terms, *(c for tree in bodies for c in tree_loads(tree))]))
            if set(reads) != self.current[eclass].reads:
                evaluated = sorted(self.current[eclass].reads)
                raise RuntimeError(
                    f"extraction: the plan's entry for e-class {eclass} reads {reads}, its evaluation {evaluated}"
                )
            read_bytes = sum(self.read_bytes[c] for c in reads)
            cost = option.pricing.cost(read_bytes, sum(self.draws[c] for c in reads))
            through = tuple(event[2] for event in events if event[0] == "node")
            literals = tuple(dict.fromkeys(event[1] for event in events if event[0] == "lit"))
            inlined = tuple(dict.fromkeys(event[1] for event in events if event[0] == "inline"))
            inline.update(inlined)
            plain = self.plain_forms(node)
            entries[eclass] = PlanEntry(eclass, node, bodies, tuple(reads), cost, through, inlined, plain, literals)
        total = Cost()
        for entry in entries.values():
            total = total + entry.cost
        view = self.view
        provenance = Provenance(
            MappingProxyType({key: frozenset(rules) for key, rules in view.made.items()}),
            MappingProxyType({key: frozenset(rules) for key, rules in view.merged.items()}),
        )
        merges_in: dict[int, list] = {}
        for key, rules in view.merged.items():
            eclass = view.by_key.get(key, view.subsumed.get(key))
            if eclass is not None and view.is_pw[eclass]:
                merges_in.setdefault(eclass, []).append((key, frozenset(rules)))
        own = {i: own_node(term, view, kept_only=False) for i, term in self.encoding.terms.items()}
        created_in: dict[int, list[ENode]] = {}
        for key in view.made:
            eclass = view.by_key.get(key)
            if eclass is not None and not view.is_pw[eclass]:
                created_in.setdefault(eclass, []).append(ENode(key[0], eclass, key[1], key[2]))
        return Plan(
            entries=MappingProxyType(entries),
            inline=MappingProxyType({c: self.option(c).node for c in sorted(inline, key=lambda c: self.rank[c])}),
            roots=tuple(self.roots),
            cost=total,
            source=self.graph,
            class_of_ir=MappingProxyType(dict(view.class_of_ir)),
            ir_ids=MappingProxyType({c: tuple(ids) for c, ids in self.ir_ids.items()}),  # IR e-classes only
            types=MappingProxyType({c: t for c, t in enumerate(self.types) if t is not None}),
            rank=MappingProxyType({c: r for c, r in enumerate(self.rank) if r != NO_RANK}),
            provenance=provenance,
            own=MappingProxyType(own),
            created_in=MappingProxyType({c: tuple(nodes) for c, nodes in created_in.items()}),
            merges_in=MappingProxyType({c: tuple(m) for c, m in merges_in.items()}),
            target=self.target,
        )

    def events(self, pw_class: int, is_root: bool):
        """The expansion of a Pw class as events, for the report: ("inline", s) for each producer
        inlined, ("load", s), ("lit", Pw class), ("node", Pw class, e-node) for each e-node used."""
        info = self.pw[pw_class]
        if not is_root:
            if info.literal is not None:
                yield ("lit", pw_class)
                return
            if info.loads:
                inlined = [s for s in info.loads if self.inline_mode(s)]
                if not inlined:
                    yield ("load", info.loads[0])
                    return
                yield ("inline", inlined[0])
        node = info.inline_node
        if node is None:
            yield ("load", info.loads[0])
            return
        yield ("node", pw_class, node)
        for child in node.children:
            yield from self.events(child, False)


def input_choice(extractor: Extractor, view: EGraphView, encoding: Encoding) -> dict[int, int]:
    """The input graph's own plan: each IR node's own e-node (kernels stored).

    Elementwise ops map to their lifted kernel, matmuls and reductions to their kernel twins.
    A class whose own e-node is not an option (or not a valid one) takes its cheapest valid one.
    """
    choice: dict[int, int] = {}
    for node_id in encoding.encoded_ids:
        eclass = view.class_of_ir[node_id]
        if eclass in choice:
            continue
        options = extractor.options[eclass]
        wanted = own_node(encoding.terms[node_id], view)
        if wanted is not None and wanted.op in ("Matmul", "Reduce"):
            wanted = extractor.twin(wanted) or wanted
        if wanted is not None and wanted.op == "MatmulKernel":
            wanted = extractor.prologue_twin(wanted) or wanted
        index = next((i for i, o in enumerate(options) if o.node == wanted and not o.inline), None)
        if index is None:  # an elementwise op (or optimizer update): its lifted kernel, stored
            index = next((i for i, o in enumerate(options) if o.node.op == "Kernel" and not o.inline), 0)
        choice[eclass] = index
    for eclass in extractor.options:  # e-classes only rules made (an attention's tuple): their first option
        choice.setdefault(eclass, 0)
    # Validity (ranks) of the input plan's options: repair the rare class merged into an earlier one.
    for eclass in sorted(choice, key=lambda c: extractor.rank[c]):
        extractor.choice = choice
        if not extractor.evaluate(eclass).valid:
            for index in range(len(extractor.options[eclass])):
                choice[eclass] = index
                if extractor.evaluate(eclass).valid:
                    break
    extractor.memo.clear()
    extractor.dependents.clear()
    extractor.mode_dependents.clear()
    extractor.uses.clear()
    return choice


def own_node(term: TermData, view: EGraphView, kept_only: bool = True) -> ENode | None:
    """The e-node of an encoded term (children resolved to e-classes), or None if absent (with
    `kept_only=False`, also the e-node a rule subsumed, its e-class -1)."""
    constructor, args = term
    children: list[int] = []
    primitives: list = []
    for arg in args:
        if isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "T":
            children.append(view.class_of_ir[arg[1]])
        elif isinstance(arg, tuple) and len(arg) == 2 and arg[0] == "P":
            pw = pw_class_of(arg[1], view)
            if pw is None:
                return None
            children.append(pw)
        else:
            primitives.append(arg)
    key = (constructor, tuple(children), tuple(primitives))
    eclass = view.find(*key)
    if eclass is None:
        return None if kept_only else ENode(constructor, -1, *key[1:])
    return ENode(constructor, eclass, *key[1:])


def pw_class_of(tree: PwTree, view: EGraphView) -> int | None:
    kind = tree[0]
    if kind == "load":
        return view.find("Load", (view.class_of_ir[tree[1]],), ())
    if kind == "lit":
        return view.find("Lit", (), (tree[1],))
    if kind == "acc":
        return view.find("Acc", (), ())
    if kind == "r":
        return view.find("R", (), ())
    children = [pw_class_of(child, view) for child in tree[2:]]
    if any(child is None for child in children):
        return None
    return view.find(PW_CALLS[len(children)], tuple(children), (tree[1],))
