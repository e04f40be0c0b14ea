"""The algebra family: each rule, on random shapes and values where it applies, keeps what the
graph computes (numpy interpreter) and fires; guards keep rules from firing where they must not."""

from __future__ import annotations

from conftest import (
    PROPERTY,
    check_rewrite,
    const,
    dims,
    kernels,
    leaf,
    live_nodes,
    matmul,
    node,
    operands,
    ops,
    seeds,
)
from hypothesis import given
from hypothesis import strategies as st

from meganeura.ir.graph import Graph
from meganeura.rewrite import optimize

batches = st.lists(dims, min_size=0, max_size=2).map(tuple)


def swap(rank: int) -> tuple[int, ...]:
    return (*range(rank - 2), rank - 1, rank - 2)


@PROPERTY
@given(batch=batches, mkn=st.tuples(dims, dims, dims), flags=st.tuples(st.booleans(), st.booleans()), seed=seeds)
def test_fold_transpose_a(batch, mkn, flags, seed):
    m, k, n = mkn
    ta, tb = flags
    graph = Graph()
    a, b = operands(graph, batch, m, k, n, not ta, tb)  # a is stored the other way round
    transposed = node(graph, "permute", (a,), perm=swap(len(batch) + 2))
    graph.outputs["y"] = matmul(graph, transposed, b, ta, tb)
    fused, report = check_rewrite(graph, "fold_transpose_a", seed)
    assert "permute" not in ops(fused) and report.rule("fold_transpose_a").uses == 1


@PROPERTY
@given(batch=batches, mkn=st.tuples(dims, dims, dims), flags=st.tuples(st.booleans(), st.booleans()), seed=seeds)
def test_fold_transpose_b(batch, mkn, flags, seed):
    m, k, n = mkn
    ta, tb = flags
    graph = Graph()
    a, b = operands(graph, batch, m, k, n, ta, not tb)
    transposed = node(graph, "permute", (b,), perm=swap(len(batch) + 2))
    graph.outputs["y"] = matmul(graph, a, transposed, ta, tb)
    fused, report = check_rewrite(graph, "fold_transpose_b", seed)
    assert "permute" not in ops(fused) and report.rule("fold_transpose_b").uses == 1


@PROPERTY
@given(batch=batches, mkn=st.tuples(dims, dims, dims), flags=st.tuples(st.booleans(), st.booleans()), seed=seeds)
def test_transpose_product(batch, mkn, flags, seed):
    m, k, n = mkn
    graph = Graph()
    a, b = operands(graph, batch, m, k, n, *flags)
    graph.outputs["y"] = node(graph, "permute", (matmul(graph, a, b, *flags),), perm=swap(len(batch) + 2))
    fused, report = check_rewrite(graph, "transpose_product", seed)
    assert ops(fused).count("matmul") == 1 and "permute" not in ops(fused)
    assert report.rule("transpose_product").uses == 1


def test_permute_that_is_not_a_last_two_swap_is_not_folded():
    graph = Graph()
    a = leaf(graph, "a", (3, 2, 4))  # permute (1,0,2) moves the batch dim: no matmul layout reads it
    b = leaf(graph, "b", (2, 4, 5))
    graph.outputs["y"] = matmul(graph, node(graph, "permute", (a,), perm=(1, 0, 2)), b)
    fused, report = check_rewrite(graph)
    assert "permute" in ops(fused)
    assert report.rule("fold_transpose_a").matches == 0 and report.rule("fold_transpose_b").matches == 0


permutations = st.integers(2, 4).flatmap(
    lambda rank: st.tuples(
        st.permutations(range(rank)), st.permutations(range(rank)), st.lists(dims, min_size=rank, max_size=rank)
    )
)


@PROPERTY
@given(perms=permutations, seed=seeds)
def test_compose_permutes(perms, seed):
    p, q, shape = perms
    if [p[i] for i in q] == sorted(p):
        q = list(reversed(q)) if len(q) > 2 else q
    graph = Graph()
    x = leaf(graph, "x", tuple(shape))
    inner = node(graph, "permute", (x,), perm=tuple(p))
    graph.outputs["y"] = node(graph, "exp", (node(graph, "permute", (inner,), perm=tuple(q)),))
    composed = tuple(p[i] for i in q)
    fused, report = check_rewrite(graph, None, seed)
    if composed == tuple(range(len(p))):
        assert "permute" not in ops(fused)
    elif tuple(p) != tuple(range(len(p))) and tuple(q) != tuple(range(len(q))):
        assert report.rule("compose_permutes").matches > 0
        assert ops(fused).count("permute") == 1


@PROPERTY
@given(
    rank_shape=st.integers(2, 4).flatmap(
        lambda r: st.tuples(st.permutations(range(r)), st.lists(dims, min_size=r, max_size=r))
    ),
    seed=seeds,
)
def test_cancel_permutes(rank_shape, seed):
    p, shape = rank_shape
    inverse = tuple(sorted(range(len(p)), key=lambda i: p[i]))
    graph = Graph()
    x = leaf(graph, "x", tuple(shape))
    back = node(graph, "permute", (node(graph, "permute", (x,), perm=tuple(p)),), perm=inverse)
    graph.outputs["y"] = node(graph, "exp", (back,))
    fused, report = check_rewrite(graph, "cancel_permutes", seed)
    assert ops(fused) == ["input", "exp"]
    # When p is its own inverse (a swap), the pair also matches the other way round, with the
    # inner permute as x (the rule subsumes nothing, see its comment): both permutes the plan no
    # longer computes are merged away by it, two uses.
    self_inverse = tuple(p[i] for i in p) == tuple(range(len(p)))
    assert report.rule("cancel_permutes").uses == (2 if self_inverse else 1)


def factorizations(total: int) -> list[tuple[int, ...]]:
    shapes = [(total,)]
    for d in range(2, total + 1):
        if total % d == 0:
            shapes.append((d, total // d))
            shapes.append((1, d, total // d))
    return shapes


@st.composite
def three_shapes(draw) -> tuple[tuple[int, ...], ...]:
    """Three different shapes of one number of elements (so that both reshapes do something)."""
    total = draw(st.sampled_from([t for t in range(2, 25) if len(factorizations(t)) >= 3]))
    return tuple(draw(st.permutations(factorizations(total)))[:3])


@PROPERTY
@given(shapes=three_shapes(), seed=seeds)
def test_merge_reshapes(shapes, seed):
    first, middle, last = shapes
    graph = Graph()
    x = leaf(graph, "x", first)
    twice = node(graph, "reshape", (node(graph, "reshape", (x,), shape=middle),), shape=last)
    graph.outputs["y"] = node(graph, "exp", (twice,))
    fused, report = check_rewrite(graph, "merge_reshapes", seed)
    assert report.rule("merge_reshapes").uses == 1
    (reshape,) = live_nodes(fused, "reshape")
    assert fused[reshape.inputs[0]].op == "input"


@PROPERTY
@given(shape=st.lists(dims, min_size=1, max_size=3).map(tuple), seed=seeds)
def test_drop_reshape(shape, seed):
    graph = Graph()
    x = leaf(graph, "x", shape)
    graph.outputs["y"] = node(graph, "exp", (node(graph, "reshape", (x,), shape=shape),))
    fused, report = check_rewrite(graph, "drop_reshape", seed)
    assert "reshape" not in ops(fused) and report.rule("drop_reshape").uses == 1


@PROPERTY
@given(
    fn=st.sampled_from(["add", "sub", "mul", "div", "neg"]),
    values=st.tuples(st.floats(-4, 4, width=32), st.floats(0.25, 4, width=32)),
    shape=st.lists(dims, min_size=0, max_size=2).map(tuple),
    seed=seeds,
)
def test_fold_constants(fn, values, shape, seed):
    graph = Graph()
    x = leaf(graph, "x", shape)
    a, b = const(graph, values[0]), const(graph, values[1])
    folded = node(graph, fn, (a,) if fn == "neg" else (a, b))
    graph.outputs["y"] = node(graph, "mul", (x, folded))
    fused, report = check_rewrite(graph, "fold_constants", seed)
    assert report.rule("fold_constants").uses == 1
    assert kernels(fused) <= 1  # x·c in one kernel (none when c folds to 1: mul_one)


def test_constant_times_a_tensor_is_not_folded():
    graph = Graph()
    x = leaf(graph, "x", (3,))
    graph.outputs["y"] = node(graph, "mul", (x, const(graph, 2.0)))
    _, report = check_rewrite(graph)
    assert report.rule("fold_constants").matches == 0


IDENTITY_CASES = {
    "mul_one": [("mul", 1.0, False), ("mul", 1.0, True)],
    "add_zero": [("add", 0.0, False), ("add", 0.0, True)],
    "sub_zero": [("sub", 0.0, False)],
    "div_one": [("div", 1.0, False)],
}


@PROPERTY
@given(
    case=st.sampled_from([(rule, case) for rule, cases in IDENTITY_CASES.items() for case in cases]),
    shape=st.lists(dims, min_size=0, max_size=3).map(tuple),
    seed=seeds,
)
def test_identities(case, shape, seed):
    rule, (fn, value, constant_first) = case
    graph = Graph()
    x = leaf(graph, "x", shape)
    c = const(graph, value)
    identity = node(graph, fn, (c, x) if constant_first else (x, c))
    graph.outputs["y"] = node(graph, "exp", (identity,))
    fused, report = check_rewrite(graph, rule, seed)
    assert ops(fused) == ["input", "exp"] and report.rule(rule).uses == 1


def test_identity_with_another_constant_does_not_fire():
    graph = Graph()
    x = leaf(graph, "x", (2, 3))
    graph.outputs["y"] = node(graph, "exp", (node(graph, "mul", (x, const(graph, 2.0))),))
    fused, report = check_rewrite(graph)
    assert report.rule("mul_one").matches == 0 and kernels(fused) == 1


def test_identity_whose_result_is_an_output_still_gives_that_output():
    graph = Graph()
    x = leaf(graph, "x", (2, 3))
    graph.outputs["same"] = node(graph, "add", (x, const(graph, 0.0)))
    fused, report = check_rewrite(graph, "add_zero")
    assert fused[fused.outputs["same"]].op == "input" and kernels(fused) == 0


def test_common_subexpression_is_computed_once():
    graph = Graph()
    x, w = leaf(graph, "x", (4, 3)), leaf(graph, "w", (3, 5))
    first, second = matmul(graph, x, w), matmul(graph, x, w)
    graph.outputs["y"] = node(graph, "sub", (first, second))
    fused, report = check_rewrite(graph)
    assert report.cse_merged == 1 and ops(fused).count("matmul") + ops(fused).count("fused_matmul") == 1


def test_algebra_alone_keeps_elementwise_ops_unfused():
    graph = Graph()
    x = leaf(graph, "x", (3,))
    graph.outputs["y"] = node(graph, "exp", (node(graph, "relu", (x,)),))
    fused, _ = optimize(graph, schedule=(("algebra",),))
    assert ops(fused) == ["input", "relu", "exp"]


@st.composite
def split_gradients(draw):
    """A tensor's shape, an axis, the sizes of its parts along it (2 to 4, covering it or not),
    and the order in which their slice_grads are added."""
    rank = draw(st.integers(1, 3))
    shape = list(draw(st.lists(dims, min_size=rank, max_size=rank)))
    axis = draw(st.integers(0, rank - 1))
    sizes = draw(st.lists(st.integers(1, 4), min_size=2, max_size=4))
    covered = draw(st.booleans())
    shape[axis] = sum(sizes) + (0 if covered else draw(st.integers(1, 3)))
    # Each part added next to the ones added before it (a split's gradients are accumulated in
    # the order of its parts, either way): the rule joins neighbours, it does not reorder a sum.
    first = draw(st.integers(0, len(sizes) - 1))
    low, high, order = first, first, [first]
    while len(order) < len(sizes):
        grow_up = high + 1 < len(sizes) and (low == 0 or draw(st.booleans()))
        low, high = (low, high + 1) if grow_up else (low - 1, high)
        order.append(high if grow_up else low)
    return tuple(shape), axis, tuple(sizes), covered, tuple(order)


def slice_grads_added(shape, axis, sizes, order) -> Graph:
    """The gradients of the parts of a tensor of `shape` (each an input of its part's shape),
    each written into zeros of the whole (slice_grad) and added up in `order`."""
    graph = Graph()
    parts, offset = [], 0
    for index, size in enumerate(sizes):
        part_shape = tuple(size if d == axis else n for d, n in enumerate(shape))
        g = leaf(graph, f"g{index}", part_shape)
        starts = tuple(offset if d == axis else 0 for d in range(len(shape)))
        stops = tuple(offset + size if d == axis else n for d, n in enumerate(shape))
        steps = (1,) * len(shape)
        parts.append(node(graph, "slice_grad", (g,), shape=shape, starts=starts, stops=stops, steps=steps))
        offset += size
    total = parts[order[0]]
    for index in order[1:]:
        total = node(graph, "add", (total, parts[index]))
    graph.outputs["grad"] = total
    return graph


@PROPERTY
@given(case=split_gradients(), seed=seeds)
def test_join_slice_grads(case, seed):
    """Added slice_grads of neighbouring parts are one slice_grad of their concat; where the parts
    cover the whole tensor (`drop_full_slice_grad`), one concat of every part (`flatten_concats`
    for three or more)."""
    shape, axis, sizes, covered, order = case
    fused, report = check_rewrite(slice_grads_added(shape, axis, sizes, order), "join_slice_grads", seed)
    computed = [op for op in ops(fused) if op != "input"]
    if covered:
        assert computed == ["concat"], fused
        (joined,) = [n for n in fused if n.op == "concat"]
        assert len(joined.inputs) == len(sizes)  # one concat of every part, in order along the axis
        assert [fused[i].attr("name") for i in joined.inputs] == [f"g{i}" for i in range(len(sizes))]
    else:  # the parts' concat written into zeros of the whole
        assert computed.count("slice_grad") == 1 and "add" not in computed and "pointwise" not in computed, fused
        assert report.rule("drop_full_slice_grad").matches == 0


def two_slice_grads_added(part: tuple[int, int], whole: tuple[int, int], columns, steps) -> Graph:
    """Two [2, n] gradients written into zeros of `whole` at the column ranges `columns`, added."""
    graph = Graph()
    parts = []
    for index, (start, stop) in enumerate(columns):
        g = leaf(graph, f"g{index}", part)
        parts.append(node(graph, "slice_grad", (g,), shape=whole, starts=(0, start), stops=(2, stop), steps=steps))
    graph.outputs["grad"] = node(graph, "add", tuple(parts))
    return graph


def test_slice_grads_of_parts_that_are_not_neighbours_are_not_joined():
    """Parts with a gap between them, or taken with a step, are added as before."""
    for graph in (
        two_slice_grads_added((2, 3), (2, 9), ((0, 3), (4, 7)), (1, 1)),
        two_slice_grads_added((2, 2), (2, 8), ((0, 4), (4, 8)), (1, 2)),
    ):
        fused, report = check_rewrite(graph)
        assert report.rule("join_slice_grads").matches == 0 and "concat" not in ops(fused)


@PROPERTY
@given(bshd=st.tuples(dims, dims, dims, st.sampled_from([2, 4, 6])), gradient=st.booleans(), seed=seeds)
def test_rope_layout(bshd, gradient, seed):
    """rope of the [b, s, h, d] → [b, h, s, d] transpose reads x seq-first; the transpose back of
    rope_grad is rope_grad writing seq-first: the permute kernel goes, the values stay."""
    b, s, h, d = bshd
    graph = Graph()
    cos, sin = leaf(graph, "cos", (s, d)), leaf(graph, "sin", (s, d))
    if gradient:
        g = leaf(graph, "g", (b, h, s, d))
        graph.outputs["y"] = node(graph, "permute", (node(graph, "rope_grad", (g, cos, sin)),), perm=(0, 2, 1, 3))
    else:
        x = leaf(graph, "x", (b, s, h, d))
        graph.outputs["y"] = node(graph, "rope", (node(graph, "permute", (x,), perm=(0, 2, 1, 3)), cos, sin))
    fused, report = check_rewrite(graph, "rope_layout", seed)
    (rope,) = [n for n in fused if n.op in ("rope", "rope_grad") and n.id in fused.live_ids()]
    assert "permute" not in ops(fused) and rope.attr("seq_first") and report.rule("rope_layout").uses == 1


def test_a_permute_of_rope_other_than_the_seq_heads_swap_stays():
    graph = Graph()
    x, cos = leaf(graph, "x", (2, 3, 4, 6)), leaf(graph, "cos", (4, 6))
    graph.outputs["y"] = node(graph, "rope", (node(graph, "permute", (x,), perm=(1, 0, 2, 3)), cos, cos))
    fused, report = check_rewrite(graph)
    assert "permute" in ops(fused) and report.rule("rope_layout").matches == 0
