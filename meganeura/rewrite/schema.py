"""The egglog sorts of the rewrite stage, as egglog program text, and helpers to write terms.

The stage talks to egglog through its program-text interface (`egglog.bindings.EGraph`,
`parse_and_run_program`): building terms through egglog-python's expression objects costs about
a millisecond per IR node; loading fact tables and building the terms with rules costs about
ten microseconds (see `encode.py`). Rules are egglog text too, one family per module.

Two sorts:

`Term`: a tensor value. Every encoded IR node gets an e-class, named by the tag `(Ref id)` (never
extracted). Constructors:

    (Ref i64)                          tag of IR node `id`
    (Const f64)                        an f32 scalar constant
    (Unary fn x) (Binary fn x y)       elementwise ops (`fn` a function of `ir/expr.py`)
    (Matmul a b ta tb)                 batched matmul with transpose flags
    (Permute x "1,0") (Reshape x "4,5")
    (Reduce kind "0,1" keepdim x)      sum/max over axes
    (Attention q k v causal scale)     the fused attention op (made by the recognition rules)
    (Rope x cos sin)                   rotary embeddings (made by the recognition rules)
    (Unfold x "kh,kw,sh,sw,ph,pw,H,W") (Fold c "kh,kw,sh,sw,ph,pw,H,W")   im2col and its adjoint
                                       (H, W: the image's size)
    (SgdStep p d lr wd) (MomentumBuffer buf g p momentum wd) (AdamMoment m g p beta order wd)
    (LogSoftmax x axis) (LogSoftmaxGrad y g axis) (Pick x labels) (ScatterRows g labels classes)
    (CrossEntropyRows logits labels) (CrossEntropyRowsGrad logits labels g)    (`ROW_CONSTRUCTORS`)
    (OpN op attrs x0 … xN-1)           any other op (N ≤ 6); `attrs` indexes Encoding.attrs_table
    (Kernel body "4,5")                a pointwise kernel of that shape
    (MatmulKernel a b ta tb epilogue)  a matmul whose result goes through an epilogue
    (MatmulPrologue p "M,K" b ta tb epilogue)  the same with A computed while it is loaded: A is
                                       the Pw body p over A's stored shape "M,K" (a prologue)
    (ReduceKernel kind axes keepdim "in_shape" prologue epilogue)
    (ConvKernel mode a b "geometry" chunks epilogue)   an implicit-GEMM convolution (`conv.py`)

`Pw`: the body of a kernel, an elementwise expression (the `Pw` nodes mirror `ir/expr.py`):

    (Load t)                           tensor t, broadcast to the kernel's shape
    (Lit f64)  (Acc)  (R)              a literal, the matmul accumulator, the reduction result
    (PUnary fn p) (PBinary fn p q)
    (Replace p t e)                    p with every (Load t) replaced by e: a helper of the matmul
                                       epilogue rules, expanded by them, never extracted

`(mentions p t)`: Pw class p loads t (directly or below), for t a matmul kernel's result.

Design notes. Expression functions are one constructor per arity with the function's name as
an argument (`(PUnary "relu" p)`), not one constructor per function: lifting, inlining and
epilogue rules are then one rule per arity, a pattern can still name a function (silu's
`(PUnary "sigmoid" x)`), and a function added to `ir/expr.py` needs no change here. `Kernel`
carries its shape: a body alone does not fix it (broadcast_to(x, s) is `(Kernel (Load x) s)`,
and two bodies that read the same tensors must not merge two kernels of different shapes).
`ReduceKernel` carries the shape it reduces, for the same reason.

Shapes, permutations and axes are written as comma-separated text ("4,5"; "" for a scalar).
Facts: `(shape t)` is the shape of every Term e-class (set at encode time for each IR node;
rules only ever union new terms into existing classes, so every class has one).
`(perm_compose p q)` and `(perm_inverse p q)` are filled by the encoder for the permutation pairs
the graph composes (see `algebra.py`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

MAX_GENERIC_ARITY = 6

# IR ops of the softmax/cross-entropy family that the reductions rules match, typed so that the
# rules can guard on their int attributes: constructor -> (op, tensor operands, int attributes),
# the attributes after the operands: (LogSoftmax x axis), (ScatterRows g labels classes).
ROW_CONSTRUCTORS: dict[str, tuple[str, int, tuple[str, ...]]] = {
    "LogSoftmax": ("log_softmax", 1, ("axis",)),
    "LogSoftmaxGrad": ("log_softmax_grad", 2, ("axis",)),
    "Pick": ("pick", 2, ()),
    "ScatterRows": ("scatter_rows", 2, ("classes",)),
    "CrossEntropyRows": ("cross_entropy_rows", 2, ()),
    "CrossEntropyRowsGrad": ("cross_entropy_rows_grad", 3, ()),
}

# Term constructors and their argument sorts, in order (the encoder writes one fact table each).
TERM_CONSTRUCTORS: dict[str, tuple[str, ...]] = {
    "Ref": ("i64",),
    "Const": ("f64",),
    "Unary": ("String", "Term"),
    "Binary": ("String", "Term", "Term"),
    "Matmul": ("Term", "Term", "bool", "bool"),
    "Permute": ("Term", "String"),
    "Reshape": ("Term", "String"),
    "Reduce": ("String", "String", "bool", "Term"),
    "SgdStep": ("Term", "Term", "f64", "f64"),
    "MomentumBuffer": ("Term", "Term", "Term", "f64", "f64"),
    "AdamMoment": ("Term", "Term", "Term", "f64", "i64", "f64"),
    "Attention": ("Term", "Term", "Term", "bool", "f64"),
    "Rope": ("Term", "Term", "Term"),
    "Unfold": ("Term", "String"),
    "Fold": ("Term", "String"),
    **{name: ("Term",) * arity + ("i64",) * len(keys) for name, (_, arity, keys) in ROW_CONSTRUCTORS.items()},
    **{f"Op{n}": ("String", "i64", *("Term",) * n) for n in range(MAX_GENERIC_ARITY + 1)},
    "Kernel": ("Pw", "String"),
    "MatmulKernel": ("Term", "Term", "bool", "bool", "Pw"),
    "MatmulPrologue": ("Pw", "String", "Term", "bool", "bool", "Pw"),
    "ReduceKernel": ("String", "String", "bool", "String", "Pw", "Pw"),
    "ConvKernel": ("String", "Term", "Term", "String", "i64", "Pw"),
}
PW_CONSTRUCTORS: dict[str, tuple[str, ...]] = {
    "Lit": ("f64",),
    "Acc": (),
    "R": (),
    "PUnary": ("String", "Pw"),
    "PBinary": ("String", "Pw", "Pw"),
    "Load": ("Term",),
    "Replace": ("Pw", "Term", "Pw"),
}
CONSTRUCTORS = (*TERM_CONSTRUCTORS, *PW_CONSTRUCTORS)


def _variant(name: str, sorts: tuple[str, ...]) -> str:
    return f"({name}{''.join(' ' + sort for sort in sorts)})" if sorts else f"({name})"


_PW_BASE = ("Lit", "Acc", "R", "PUnary", "PBinary")
SCHEMA = (
    "(datatype Pw " + " ".join(_variant(n, PW_CONSTRUCTORS[n]) for n in _PW_BASE) + ")\n"
    "(datatype Term\n  "
    + "\n  ".join(_variant(n, sorts) for n, sorts in TERM_CONSTRUCTORS.items())
    + ")\n"
    + "".join(
        f"(constructor {n} ({' '.join(sorts)}) Pw)\n" for n, sorts in PW_CONSTRUCTORS.items() if n not in _PW_BASE
    )
    + """(function shape (Term) String :merge old)
(function perm_compose (String String) String :merge old)
(relation perm_inverse (String String))
(relation mentions (Pw Term))
"""
)

TERM_SORT = "Term"
PW_SORT = "Pw"
REF = "Ref"


def f64(value: float) -> str:
    """An egglog f64 literal (egglog reads `inf`, `-inf` and `NaN`)."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def boolean(value: bool) -> str:
    return "true" if value else "false"


def ints(values: Iterable[int]) -> str:
    """A tuple of ints as egglog string text: (4, 5) -> `"4,5"`."""
    return '"' + ",".join(str(int(v)) for v in values) + '"'


def parse_ints(text: str) -> tuple[int, ...]:
    """The inverse of `ints` (without the quotes)."""
    return tuple(int(v) for v in text.split(",")) if text else ()


def string(text: str) -> str:
    """An egglog string literal (only identifiers and digit lists are ever written)."""
    if '"' in text or "\\" in text:
        raise ValueError(f"egglog string {text!r} needs escaping, which the encoder does not do")
    return f'"{text}"'


def ref(node_id: int) -> str:
    return f"(Ref {node_id})"


def swap_last_two(rank: int) -> tuple[int, ...]:
    """The permutation exchanging the last two dims of a rank-`rank` tensor."""
    return (*range(rank - 2), rank - 1, rank - 2)
