"""Embedding lookup (gather / scatter_add), slicing (slice / slice_grad) and concatenation (concat):
numpy semantics against direct numpy indexing, shape errors naming the user's line, gradients by
finite differences mid-chain, WGSL kernels against the interpreter on lavapipe (odd sizes), and a
compiled training step through the e-graph."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, check, emit, gradcheck, one_op, trace_leaf, typed_leaf

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.interpret import interpret
from meganeura.ir.op import ShapeError
from meganeura.ir.trace import Tracer, tracing
from meganeura.tensor import apply

RNG = np.random.default_rng(0)

INDEXES = {
    "x[..., 1:4]": lambda x: x[..., 1:4],
    "x[:, -1]": lambda x: x[:, -1],
    "x[1:3, ::2]": lambda x: x[1:3, ::2],
    "x[-1, None, 2:, 4]": lambda x: x[-1, None, 2:, 4],
    "x[0]": lambda x: x[0],
    "x[1, -2, 3]": lambda x: x[1, -2, 3],
    "x[::3, 1::2, -4:-1:2]": lambda x: x[::3, 1::2, -4:-1:2],
    "x[..., 0, :]": lambda x: x[..., 0, :],
    "x[...]": lambda x: x[...],
    "x[:, 3:1]": lambda x: x[:, 3:1],
    "x[-10:10]": lambda x: x[-10:10],
    "x[..., None]": lambda x: x[..., None],
    "x[:, None, -3::2]": lambda x: x[:, None, -3::2],
}


def traced(fn, **leaves):
    """Trace fn(*leaf tensors) and return (graph, output node)."""
    tracer = Tracer()
    with tracing(tracer):
        tensors = [
            trace_leaf(tracer, "input", name, TensorType(v.shape, "i32" if v.dtype == np.int32 else "f32"))
            for name, v in leaves.items()
        ]
        out = fn(*tensors)
    tracer.graph.outputs["out"] = out.node
    return tracer.graph


@pytest.mark.parametrize("index", sorted(INDEXES))
def test_slicing_follows_numpy(index):
    x = RNG.normal(size=(4, 5, 7))
    graph = traced(INDEXES[index], x=x)
    got = interpret(graph, {"x": x}, dtype=np.float64).outputs["out"]
    expected = INDEXES[index](x)
    assert got.shape == expected.shape and np.array_equal(got, expected)
    assert [n.op for n in graph].count("slice") <= 1


def test_full_slices_emit_nothing_and_bad_indexes_fail_on_the_users_line():
    tracer = Tracer()
    with tracing(tracer):
        x = trace_leaf(tracer, "input", "x", TensorType((3, 4)))
        assert x[:].node == x.node and x[..., :].node == x.node
        with pytest.raises(IndexError, match=r"test_indexing\.py:\d+: index 3 is out of range"):
            x[3]
        with pytest.raises(IndexError, match=r"test_indexing\.py:\d+: too many indices"):
            x[0, 0, 0]
        with pytest.raises(ValueError, match=r"test_indexing\.py:\d+: slice step must be positive"):
            x[::-1]
        with pytest.raises(TypeError, match="unsupported index"):
            x[x]


def test_cat_follows_numpy_and_checks_shapes():
    a, b, c = RNG.normal(size=(2, 3, 4)), RNG.normal(size=(2, 1, 4)), RNG.normal(size=(2, 5, 4))
    graph = traced(lambda a, b, c: mn.cat([a, b, c], dim=-2), a=a, b=b, c=c)
    got = interpret(graph, {"a": a, "b": b, "c": c}, dtype=np.float64).outputs["out"]
    assert np.array_equal(got, np.concatenate([a, b, c], axis=1))
    many = [RNG.normal(size=(2, i + 1)) for i in range(8)]  # more than one concat node takes
    graph = traced(lambda *xs: F.cat(xs, 1), **{f"x{i}": v for i, v in enumerate(many)})
    got = interpret(graph, {f"x{i}": v for i, v in enumerate(many)}, dtype=np.float64).outputs["out"]
    assert np.array_equal(got, np.concatenate(many, axis=1))
    with pytest.raises(ShapeError, match=r"test_indexing\.py:\d+: cat: f32\[2,3,5\] does not match"):
        traced(lambda a, d: F.cat([a, d], 1), a=a, d=RNG.normal(size=(2, 3, 5)))


def test_embedding_follows_numpy_and_checks_dtypes():
    weight = RNG.normal(size=(7, 3))
    ids = np.array([[0, 6, 2], [2, 2, 1]], np.int32)
    tracer = Tracer()
    with tracing(tracer):
        w = trace_leaf(tracer, "input", "w", TensorType((7, 3)))
        i = trace_leaf(tracer, "input", "ids", TensorType((2, 3), "i32"))
        tracer.graph.outputs["out"] = F.embedding(i, w).node
        with pytest.raises(ShapeError, match=r"test_indexing\.py:\d+: embedding: expected i32 indices"):
            F.embedding(w, w)
        with pytest.raises(ShapeError, match=r"test_indexing\.py:\d+: embedding: expected an f32 weight"):
            F.embedding(i, trace_leaf(tracer, "input", "v", TensorType((7,))))
    got = interpret(tracer.graph, {"w": weight, "ids": ids}, dtype=np.float64).outputs["out"]
    assert np.array_equal(got, weight[ids])
    layer = nn.Embedding(50, 8)
    assert layer.weight.shape == (50, 8) and abs(layer.weight.numpy().std() - 1.0) < 0.15
    assert [name for name, _ in layer.named_parameters()] == ["weight"]


# -- gradients, mid-chain ---------------------------------------------------------------------


@pytest.mark.parametrize("index", sorted(set(INDEXES) - {"x[:, 3:1]"}))
def test_slicing_gradients(index):
    assert gradcheck(INDEXES[index], [(4, 5, 7)], np.random.default_rng(3)) < 1e-6


def test_slice_grad_gradient():
    def op(g):
        return apply("slice_grad", g, shape=(5, 6), starts=(1, 0), stops=(5, 5), steps=(2, 3))

    assert gradcheck(op, [(2, 2)], np.random.default_rng(4)) < 1e-6


def test_cat_gradients():
    rng = np.random.default_rng(5)
    assert gradcheck(lambda a, b, c: F.cat([a, b, c], 1), [(2, 3, 4), (2, 1, 4), (2, 2, 4)], rng) < 1e-6
    assert gradcheck(lambda a: F.cat([a, a[:, :1], a], -1), [(3, 2)], rng) < 1e-6  # one input used thrice


def test_embedding_and_scatter_add_gradients():
    rng = np.random.default_rng(6)
    ids = np.array([[0, 4, 2], [2, 2, 1], [4, 4, 4]], np.int32)  # repeats, and rows never used (3, 5)
    assert gradcheck(lambda w, labels: F.embedding(labels, w), [(6, 5)], rng, labels=ids) < 1e-6
    scatter = lambda g, labels: apply("scatter_add", g, labels, apply("sort_ids", labels), num=6)  # noqa: E731
    assert gradcheck(scatter, [(3, 3, 5)], rng, labels=ids) < 1e-6


# -- kernels on the device --------------------------------------------------------------------


@pytest.mark.parametrize("num, dim, ids_shape", [(1, 1, (1,)), (7, 3, (2, 5)), (65, 33, (3, 7, 11))])
def test_gather_and_scatter_add_kernels(num, dim, ids_shape):
    ids = RNG.integers(0, num, size=ids_shape).astype(np.int32)
    check(
        one_op("gather", [(num, dim), ids_shape], ["f32", "i32"]),
        {"x0": RNG.normal(size=(num, dim)).astype(np.float32), "x1": ids},
    )
    graph = scatter_graph((*ids_shape, dim), ids_shape, num)
    check(graph, {"x0": RNG.normal(size=(*ids_shape, dim)).astype(np.float32), "x1": ids}, rtol=1e-5, atol=1e-5)


def test_gather_gives_nan_and_scatter_add_skips_bad_ids():
    ids = np.array([0, -1, 4, 3, 3], np.int32)
    gather = one_op("gather", [(4, 3), (5,)], ["f32", "i32"])
    check(gather, {"x0": RNG.normal(size=(4, 3)).astype(np.float32), "x1": ids})
    scatter = scatter_graph((5, 3), (5,), num=4)
    check(scatter, {"x0": RNG.normal(size=(5, 3)).astype(np.float32), "x1": ids})


def scatter_graph(g_shape, ids_shape, num: int) -> Graph:
    """out = scatter_add(x0, x1, sort_ids(x1)) and sorted = sort_ids(x1), both checked."""
    graph = Graph()
    g, ids = typed_leaf(graph, "input", "x0", g_shape), typed_leaf(graph, "input", "x1", ids_shape, "i32")
    order = emit(graph, "sort_ids", [ids])
    graph.outputs["sorted"] = order
    graph.outputs["out"] = emit(graph, "scatter_add", [g, ids, order], num=num)
    return graph


@pytest.mark.parametrize("n", [1, 2, 255, 256, 257, 700])
def test_sort_ids_is_a_stable_sort_on_the_device(n):
    # few distinct values (long runs of ties), negatives and ids past any table: all sorted,
    # ties by position, every rank written once; the same bytes on a second run
    ids = RNG.integers(-2, 9, size=n).astype(np.int32)
    graph = Graph()
    graph.outputs["out"] = emit(graph, "sort_ids", [typed_leaf(graph, "input", "x0", (n,), "i32")])
    executable = check(graph, {"x0": ids})
    expected = np.stack([np.sort(ids, kind="stable"), np.argsort(ids, kind="stable")])
    first = executable.run({"x0": ids}, read=("out",))["out"]
    np.testing.assert_array_equal(first, expected)
    np.testing.assert_array_equal(executable.run({"x0": ids}, read=("out",))["out"], first)


def test_scatter_add_sums_a_row_in_order_of_position_with_one_id_repeated():
    # every id the same (one run of 300) but two, which fall outside the table: the run's sum is
    # the interpreter's up to float32 rounding, rows without ids are exact zeros
    ids = np.full(300, 2, np.int32)
    ids[[5, 200]] = [-1, 7]
    g = RNG.normal(size=(300, 4)).astype(np.float32)
    executable = check(scatter_graph((300, 4), (300,), num=5), {"x0": g, "x1": ids}, rtol=1e-5, atol=1e-5)
    out = executable.run({"x0": g, "x1": ids}, read=("out",))["out"]
    assert np.all(out[[0, 1, 3, 4]] == 0.0)
    np.testing.assert_allclose(out[2], g[ids == 2].sum(0), rtol=1e-5, atol=1e-5)


SLICES = [
    ((5, 7), (1, 0), (4, 7), (1, 3)),
    ((3, 4, 9), (0, 1, 2), (3, 4, 9), (2, 2, 4)),
    ((2, 3, 5, 7), (1, 0, 4, 1), (2, 3, 5, 6), (1, 1, 1, 1)),
    ((33, 1, 17), (3, 0, 16), (30, 1, 17), (5, 1, 1)),
]


@pytest.mark.parametrize("shape, starts, stops, steps", SLICES, ids=str)
def test_slice_and_slice_grad_kernels(shape, starts, stops, steps):
    attrs = {"starts": starts, "stops": stops, "steps": steps}
    graph = one_op("slice", [shape], **attrs)
    check(graph, {"x0": RNG.normal(size=shape).astype(np.float32)})
    out_shape = graph[graph.outputs["out"]].shape
    graph = one_op("slice_grad", [out_shape], shape=shape, **attrs)
    check(graph, {"x0": RNG.normal(size=out_shape).astype(np.float32)})


def test_slice_of_i32():
    ids = RNG.integers(-5, 5, size=(3, 7)).astype(np.int32)
    check(one_op("slice", [(3, 7)], ["i32"], starts=(1, 2), stops=(3, 7), steps=(1, 2)), {"x0": ids})


@pytest.mark.parametrize(
    "shapes, axis",
    [
        ([(3, 5), (3, 2)], 1),
        ([(2, 3, 5), (1, 3, 5), (4, 3, 5)], 0),
        ([(2, 1, 3), (2, 4, 3), (2, 3, 3)], 1),
        ([(7,)], 0),
    ],
    ids=str,
)
def test_concat_kernel(shapes, axis):
    check(
        one_op("concat", shapes, axis=axis),
        {f"x{i}": RNG.normal(size=s).astype(np.float32) for i, s in enumerate(shapes)},
    )


def test_concat_of_i32_and_repeated_inputs():
    graph = Graph()
    x = typed_leaf(graph, "input", "x", (2, 3), "i32")
    graph.outputs["out"] = emit(graph, "concat", [x, x, x], axis=1)
    check(graph, {"x": RNG.integers(-9, 9, size=(2, 3)).astype(np.int32)})


# -- end to end: a tiny language model with an embedding, slices and cat, through the e-graph -----

VOCAB, SEQ, DIM, BATCH = 11, 6, 8, 3


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.mix = nn.Linear(DIM, DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, ids):
        h = self.embed(ids)  # [batch, seq, dim]
        half = DIM // 2
        rotated = mn.cat([-h[..., half:], h[..., :half]], dim=-1)
        h = F.silu(self.mix(h + 0.5 * rotated))
        return self.head(h[:, -1])  # the last position's logits


def lm_loss(model, ids, y):
    return F.cross_entropy(model(ids), y)


@pytest.mark.parametrize("rewrite", [True, False], ids=["fused", "unfused"])
def test_tiny_lm_gpu_steps_follow_the_interpreter(rewrite):
    mn.manual_seed(0)
    program = mn.compile(
        TinyLM(),
        loss=lm_loss,
        inputs={"ids": mn.i32[BATCH, SEQ], "y": mn.i32[BATCH]},
        optimizer=optim.Adam(lr=1e-2),
        rewrite=rewrite,
    )
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ)).astype(np.int32)
    y = rng.integers(0, VOCAB, size=BATCH).astype(np.int32)
    losses = assert_steps_follow_interpreter(program, [{"ids": ids, "y": y}] * 4)
    assert losses[-1] < losses[0]
    with pytest.raises(ValueError, match=r"input 'ids': embedding ids must lie in \[0, 11\)"):
        program.train_step(ids=np.full((BATCH, SEQ), VOCAB, np.int32), y=y)
