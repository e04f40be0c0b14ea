"""Pooling beyond the defaults: max_pool2d with dilation and ceil_mode, avg_pool2d with ceil_mode,
count_include_pad=False and divisor_override, the 1-D pools, and the adaptive pools (uneven
windows): against numpy loops written from PyTorch's kernels, their gradients by finite
differences mid-chain, and their kernels against the interpreter at ragged shapes on the default
adapter. (Values against PyTorch itself: test_conv_torch.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check, emit, gradcheck, one_op, run_traced, typed_leaf

import meganeura.functional as F
from meganeura.ir.graph import Graph
from meganeura.ir.interpret import interpret
from meganeura.ir.ops.image import adaptive_windows, pool_output_size

RNG = np.random.default_rng(23)


def out_size(extent, k, s, p, d, ceil):
    """torch's pooling_output_shape."""
    count = (extent + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    return count - 1 if ceil and (count - 1) * s >= extent + p else count


def pool_loops(x, g, kernel, stride, padding, dilation=(1, 1), ceil=False, include=True, divisor=0):
    """(max, avg, max grad, avg grad) by torch's CPU loops: max over the dilated window's image
    pixels (the first maximum, strict >, takes the gradient); avg over the window clipped to the
    padded image, divided by divisor_override, that window's size (count_include_pad) or its
    image pixels."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    ho, wo = out_size(h, kh, sh, ph, dh, ceil), out_size(w, kw, sw, pw, dw, ceil)
    out_max, out_avg = np.zeros((n, c, ho, wo)), np.zeros((n, c, ho, wo))
    grad_max, grad_avg = np.zeros(x.shape), np.zeros(x.shape)
    for oh in range(ho):
        for ow in range(wo):
            hs, ws = oh * sh - ph, ow * sw - pw
            pixels = [
                (hs + i * dh, ws + j * dw)
                for i in range(kh)
                for j in range(kw)
                if 0 <= hs + i * dh < h and 0 <= ws + j * dw < w
            ]
            he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
            clipped = (min(he, h) - max(hs, 0)) * (min(we, w) - max(ws, 0))
            share = divisor or ((he - hs) * (we - ws) if include else clipped)
            for b in range(n):
                for ch in range(c):
                    values = [x[b, ch, y, xx] for y, xx in pixels]
                    arg = pixels[int(np.argmax(values))]
                    out_max[b, ch, oh, ow] = max(values)
                    grad_max[b, ch, arg[0], arg[1]] += g[b, ch, oh, ow]
                    out_avg[b, ch, oh, ow] = sum(values) / share
                    for y, xx in pixels:
                        grad_avg[b, ch, y, xx] += g[b, ch, oh, ow] / share
    return out_max, out_avg, grad_max, grad_avg


# (image, kernel, stride, padding, dilation, ceil_mode, count_include_pad, divisor)
OPTIONS = [
    ((9, 8), (3, 3), (2, 2), (1, 1), (2, 2), True, True, 0),
    ((7, 6), (3, 2), (2, 2), (0, 0), (1, 1), True, False, 0),
    ((8, 7), (3, 3), (2, 2), (1, 1), (1, 1), True, False, 0),
    ((8, 7), (3, 3), (2, 2), (1, 1), (1, 1), True, True, 0),
    ((7, 5), (2, 2), (1, 1), (1, 1), (1, 1), False, True, 3),
    ((11, 10), (4, 3), (3, 2), (2, 1), (1, 3), True, False, 0),
    ((6, 9), (2, 3), (3, 3), (1, 0), (2, 1), False, True, 0),
]


def options_id(option) -> str:
    image, kernel, stride, padding, dilation, ceil, include, divisor = option
    flags = "-ceil" * ceil + "-exclude" * (not include) + f"-div{divisor}" * bool(divisor)
    window = f"k{kernel[0]}{kernel[1]}-s{stride[0]}{stride[1]}-p{padding[0]}{padding[1]}-d{dilation[0]}{dilation[1]}"
    return f"{image[0]}x{image[1]}-{window}{flags}"


def option_graph(x_shape, option) -> Graph:
    """Outputs max, avg, max_grad, avg_grad of input `x` and upstream gradients `gm` (max) and `ga` (avg)."""
    _, kernel, stride, padding, dilation, ceil, include, divisor = option
    window = {"kernel": kernel, "stride": stride, "padding": padding, "ceil_mode": ceil}
    maximum, average = {**window, "dilation": dilation}, {**window, "count_include_pad": include, "divisor": divisor}
    graph = Graph()
    x = typed_leaf(graph, "input", "x", x_shape)
    graph.outputs["max"] = emit(graph, "max_pool2d", [x], **maximum)
    graph.outputs["avg"] = emit(graph, "avg_pool2d", [x], **average)
    gm = typed_leaf(graph, "input", "gm", graph[graph.outputs["max"]].shape)
    ga = typed_leaf(graph, "input", "ga", graph[graph.outputs["avg"]].shape)
    graph.outputs["max_grad"] = emit(graph, "max_pool2d_grad", [x, gm], **maximum)
    graph.outputs["avg_grad"] = emit(graph, "avg_pool2d_grad", [ga], **average, image=x_shape[2:])
    return graph


def feeds_for(graph: Graph, dtype=np.float64) -> dict[str, np.ndarray]:
    """Normal values for every input of `graph` (x and the two upstream gradients)."""
    return {n.attr("name"): RNG.normal(size=n.shape).astype(dtype) for n in graph if n.op == "input"}


@pytest.mark.parametrize("option", OPTIONS, ids=options_id)
def test_pool_options_match_torchs_loops(option):
    image, kernel, stride, padding, dilation, ceil, include, divisor = option
    graph = option_graph((2, 3, *image), option)
    feeds = feeds_for(graph)
    got = interpret(graph, feeds, dtype=np.float64).outputs
    max_out, _, max_grad, _ = pool_loops(feeds["x"], feeds["gm"], kernel, stride, padding, dilation, ceil)
    _, avg_out, _, avg_grad = pool_loops(
        feeds["x"], feeds["ga"], kernel, stride, padding, (1, 1), ceil, include, divisor
    )
    for name, value in (("max", max_out), ("avg", avg_out), ("max_grad", max_grad), ("avg_grad", avg_grad)):
        np.testing.assert_allclose(got[name], value, rtol=1e-12, atol=1e-12, err_msg=name)
    assert pool_output_size(image, kernel, stride, padding, dilation, ceil, "pool") == got["max"].shape[2:]


@pytest.mark.parametrize("option", OPTIONS, ids=options_id)
def test_pool_option_kernels_match_the_interpreter(option):
    image = option[0]
    graph = option_graph((3, 5, image[0] + 2, image[1] + 1), option)
    check(graph, feeds_for(graph, np.float32))


def test_pool_option_gradients_mid_chain():
    ops = [
        lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True),
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda x: F.avg_pool2d(x, (3, 2), (2, 1), (1, 0), ceil_mode=True),
        lambda x: F.avg_pool2d(x, 2, 1, 1, divisor_override=3),
    ]
    for index, op in enumerate(ops):
        assert gradcheck(op, [(2, 2, 8, 7)], np.random.default_rng(index)) < 1e-6, index
    assert gradcheck(lambda x: F.max_pool1d(x, 3, 2, 1, dilation=2, ceil_mode=True), [(2, 3, 9)], RNG) < 1e-6
    assert (
        gradcheck(lambda x: F.avg_pool1d(x, 4, 3, 2, ceil_mode=True, count_include_pad=False), [(2, 3, 10)], RNG) < 1e-6
    )


# -- adaptive pools ---------------------------------------------------------------------------------


def adaptive_loops(x, g, size):
    """(avg, max, max grad) by torch's adaptive loops: windows [⌊i·H/oh⌋, ⌈(i + 1)·H/oh⌉); the
    maximum's index as torch's CPU kernel keeps it (`val > max || isnan(val)`: the first maximum,
    or the last NaN)."""
    n, c, h, w = x.shape
    oh, ow = size
    avg, top = np.zeros((n, c, oh, ow)), np.zeros((n, c, oh, ow))
    grad = np.zeros(x.shape)
    for i in range(oh):
        hs, he = i * h // oh, -(-(i + 1) * h // oh)
        for j in range(ow):
            ws, we = j * w // ow, -(-(j + 1) * w // ow)
            for b in range(n):
                for ch in range(c):
                    window = x[b, ch, hs:he, ws:we]
                    avg[b, ch, i, j] = window.mean()
                    best, arg = -np.inf, (hs, ws)
                    for y in range(hs, he):
                        for xx in range(ws, we):
                            if x[b, ch, y, xx] > best or np.isnan(x[b, ch, y, xx]):
                                best, arg = x[b, ch, y, xx], (y, xx)
                    top[b, ch, i, j] = best
                    grad[b, ch, arg[0], arg[1]] += g[b, ch, i, j]
    return avg, top, grad


ADAPTIVE = [((7, 5), (3, 4)), ((3, 2), (5, 3)), ((9, 9), (3, 3)), ((5, 7), (1, 7)), ((6, 4), (4, 3))]


def adaptive_graph(x_shape, size) -> Graph:
    graph = Graph()
    x = typed_leaf(graph, "input", "x", x_shape)
    graph.outputs["max"] = emit(graph, "adaptive_max_pool2d", [x], output_size=size)
    g = typed_leaf(graph, "input", "g", graph[graph.outputs["max"]].shape)
    graph.outputs["max_grad"] = emit(graph, "adaptive_max_pool2d_grad", [x, g], output_size=size)
    return graph


@pytest.mark.parametrize("image, size", ADAPTIVE)
def test_adaptive_pools_match_torchs_loops(image, size):
    x, g = RNG.normal(size=(2, 3, *image)), RNG.normal(size=(2, 3, *size))
    x[0, 0, 0, :2] = np.nan  # NaN propagates, and the last NaN of a window takes its gradient
    x[1, 1] = np.round(x[1, 1])  # ties: the first maximum in scan order takes it
    avg, top, grad = adaptive_loops(x, g, size)
    got = interpret(adaptive_graph(x.shape, size), {"x": x, "g": g}, dtype=np.float64).outputs
    np.testing.assert_allclose(got["max"], top, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got["max_grad"], grad, rtol=1e-12, atol=1e-12)
    traced = run_traced(lambda x: {"avg": F.adaptive_avg_pool2d(x, size)}, {"x": np.nan_to_num(x)})
    np.testing.assert_allclose(traced["avg"], adaptive_loops(np.nan_to_num(x), g, size)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("image, size", ADAPTIVE)
def test_adaptive_kernels_match_the_interpreter(image, size):
    x = RNG.normal(size=(3, 5, *image)).astype(np.float32)
    x[0, 0, 0, :2] = np.nan
    x[1, 1] = np.round(x[1, 1])
    g = RNG.normal(size=(3, 5, *size)).astype(np.float32)
    check(adaptive_graph(x.shape, size), {"x": x, "g": g})
    for extent, count in zip(image, size, strict=True):
        check(one_op("adaptive_pool_matrix", [], size=extent, output_size=count), {})


def test_adaptive_windows_are_torchs():
    assert [list(v) for v in adaptive_windows(5, 3)] == [[0, 1, 3], [2, 4, 5]]
    assert [list(v) for v in adaptive_windows(2, 4)] == [[0, 0, 1, 1], [1, 1, 2, 2]]


def test_adaptive_pool_gradients_mid_chain():
    assert gradcheck(lambda x: F.adaptive_avg_pool2d(x, (3, 4)), [(2, 2, 7, 5)], RNG) < 1e-6
    assert gradcheck(lambda x: F.adaptive_max_pool2d(x, (3, 4)), [(2, 2, 7, 5)], RNG) < 1e-6
    assert gradcheck(lambda x: F.adaptive_avg_pool2d(x, (4, None)), [(1, 2, 3, 5)], RNG) < 1e-6
    assert gradcheck(lambda x: F.adaptive_avg_pool1d(x, 4), [(2, 3, 10)], RNG) < 1e-6
    assert gradcheck(lambda x: F.adaptive_max_pool1d(x, 3), [(2, 3, 7)], RNG) < 1e-6
