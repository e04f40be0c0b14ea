"""The e-graph schema, generated: one constructor per op (from its declaration), the kernel forms
(`kernels.py`), the Pw constructors (`sorts.py`), and the fact tables that load an IR graph.

An op's constructor is `(Name [tag] operand… attribute…)` (`ir.op.EGraphForm`): operands are
Terms, attributes keep their declared order and types (integer tuples as text "4,5", one field
per attribute). Ops that share a constructor through a tag (`(Unary "exp" x)`, `(Reduce "sum" x
axes keepdim)`) have the same operands and attributes; an op with a variable number of operands
has one constructor per arity (`Concat2` … `Concat6`).

Rules name constructors through `term(op, …)` (keyword arguments by field name), so that they
follow the declarations. Facts every rule may read: `(shape t)`, the shape of every Term e-class
of one result (set at encode time for each IR node; rules only ever union new terms into
existing classes, so every such class has one); `(perm_compose p q)` and `(perm_inverse p q)` for
the permutation pairs the graph composes (`algebra.py`); `(mentions p t)`, how deep below Pw class p a load of t lies
(the epilogue rules).
"""

from __future__ import annotations

from meganeura.ir.op import OPS, Op
from meganeura.rewrite.kernels import KERNEL_FORMS
from meganeura.rewrite.sorts import (
    PW,
    PW_CONSTRUCTORS,
    REF,
    TERM,
    Constructor,
    Field,
    attribute,
    operand,
)


def op_constructors(op: Op) -> dict[int, Constructor]:
    """The constructor of each arity an op has in the e-graph (none for the fused kernels)."""
    form = op.egraph
    if form is None:
        return {}
    head = (Field("op", "tag", "String"),) if form.tag is not None else ()
    attrs = tuple(attribute(a) for a in op.attrs)
    constructors = {}
    for arity in range(op.min_operands, op.max_operands + 1):
        if op.fixed_arity:
            operands = tuple(operand(name) for name in op.operands)
        else:
            operands = tuple(operand(f"x{i}") for i in range(arity))
        name = form.constructor if op.fixed_arity else f"{form.constructor}{arity}"
        constructors[arity] = Constructor(name, TERM, head + operands + attrs, op.name, form.tag)
    return constructors


def build_constructors() -> tuple[dict[str, Constructor], dict[str, dict[int, Constructor]], dict[tuple, str]]:
    by_name: dict[str, Constructor] = {REF: Constructor(REF, TERM, (Field("id", "attr", "i64"),))}
    by_op: dict[str, dict[int, Constructor]] = {}
    by_tag: dict[tuple[str, str], str] = {}  # (shared constructor, tag) -> op
    for op in OPS.values():
        for arity, constructor in op_constructors(op).items():
            by_op.setdefault(op.name, {})[arity] = constructor
            if constructor.tag is not None:
                shared = by_name.setdefault(constructor.name, constructor)
                if shared.sorts != constructor.sorts:
                    raise ValueError(f"ops sharing constructor {constructor.name} differ in fields: {op.name}")
                by_tag[(constructor.name, constructor.tag)] = op.name
            elif constructor.name in by_name:
                raise ValueError(f"constructor {constructor.name} is generated twice")
            else:
                by_name[constructor.name] = constructor
    for constructor in (*KERNEL_FORMS, *PW_CONSTRUCTORS):
        by_name[constructor.name] = constructor
    return by_name, by_op, by_tag


CONSTRUCTORS, OP_CONSTRUCTORS, OP_OF_TAG = build_constructors()
TERM_CONSTRUCTORS = {n: c for n, c in CONSTRUCTORS.items() if c.sort == TERM}


def constructor_of(op: str, arity: int) -> Constructor:
    """The constructor that encodes `op` with `arity` operands (KeyError for fused kernels)."""
    try:
        return OP_CONSTRUCTORS[op][arity]
    except KeyError:
        raise KeyError(f"op {op!r} with {arity} operands has no e-graph constructor") from None


def op_of(constructor: str, primitives: tuple) -> str | None:
    """The IR op an e-node of `constructor` encodes (None for kernel forms and Pw nodes)."""
    c = CONSTRUCTORS[constructor]
    if c.tag is not None:
        return OP_OF_TAG[(constructor, primitives[0])]
    return c.op


def term(op: str, *operands: str, **attrs: str) -> str:
    """egglog text of op's constructor applied to operand and attribute texts (by field name):
    term("matmul", "a", "b", transpose_a="ta", transpose_b="tb") -> `(Matmul a b ta tb)`."""
    c = constructor_of(op, len(operands))
    args, given = [], iter(operands)
    for f in c.fields:
        if f.kind == "tag":
            args.append(f'"{c.tag}"')
        elif f.kind == "operand":
            args.append(next(given))
        else:
            if f.name not in attrs:
                raise KeyError(f"term({op!r}): no text for attribute {f.name!r}")
            args.append(attrs[f.name])
    return f"({c.name} {' '.join(args)})"


SCHEMA = (
    "(datatype Pw "
    + " ".join(c.declaration() for c in PW_CONSTRUCTORS if c.name not in ("Load", "Replace"))
    + ")\n(datatype Term\n  "
    + "\n  ".join(c.declaration() for c in TERM_CONSTRUCTORS.values())
    + ")\n"
    + "".join(
        f"(constructor {c.name} ({' '.join(c.sorts)}) Pw)\n" for c in PW_CONSTRUCTORS if c.name in ("Load", "Replace")
    )
    + """(function shape (Term) String :merge old)
(function perm_compose (String String) String :merge old)
(relation perm_inverse (String String))
(function mentions (Pw Term) i64 :merge (min old new))
"""
)

# ---------------------------------------------------------------------------------------------
# Fact tables: how an IR graph is loaded (encode.py). One relation per constructor without Pw
# fields, a row per IR node: (id, field…), a Term field as the child's node id, a bool as 0/1.

FACT_CONSTRUCTORS = {
    name: c for name, c in TERM_CONSTRUCTORS.items() if name != REF and all(f.sort != PW for f in c.fields)
}
FACT_SORTS = {TERM: "i64", "bool": "i64"}


def fact_tables() -> str:
    """The fact relations and the `encode` rules that build terms from them."""
    lines = ["(ruleset encode)", "(relation shape_fact (i64 String))"]
    lines.append('(rule ((shape_fact i s)) ((set (shape (Ref i)) s)) :ruleset encode :name "encode_shape")')
    for name, c in FACT_CONSTRUCTORS.items():
        sorts = c.sorts
        columns = " ".join(FACT_SORTS.get(sort, sort) for sort in ("i64", *sorts))
        lines.append(f"(relation {name}_fact ({columns}))")
        flags = [index for index, sort in enumerate(sorts) if sort == "bool"]
        for variant in range(1 << len(flags)):
            query, args = ["i"], []
            for index, sort in enumerate(sorts):
                if sort == "bool":
                    bit = (variant >> flags.index(index)) & 1
                    query.append(str(bit))
                    args.append("true" if bit else "false")
                else:
                    query.append(f"a{index}")
                    args.append(f"(Ref a{index})" if sort == TERM else f"a{index}")
            lines.append(
                f"(rule (({name}_fact {' '.join(query)})) ((union (Ref i) ({name} {' '.join(args)})))"
                f' :ruleset encode :name "encode_{name}#{variant}")'
            )
    return "\n".join(lines)


PROVENANCE_PREFIXES = ("made_", "merged_")  # relations a rule's actions fill (rules.py)


def provenance_tables() -> str:
    """One `made_C` and one `merged_C` relation per constructor: (its fields…, rule name)."""
    lines = []
    for name, c in CONSTRUCTORS.items():
        if name == REF:
            continue
        columns = " ".join((*c.sorts, "String"))
        lines.append(f"(relation made_{name} ({columns}))")
        lines.append(f"(relation merged_{name} ({columns}))")
    return "\n".join(lines)
