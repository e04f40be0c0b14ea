"""A compiler fuzzer: random well-typed training steps and inference programs, built from the op
set through the DSL (random shapes, broadcasting, shared subexpressions, residual paths, several
outputs), each compiled with the e-graph and checked three ways:

- the optimized graph and the traced one agree under the numpy interpreter (outputs and updates);
- for a smaller sample, the compiled kernels on the device (lavapipe) agree with the interpreter;
- compiling stays under a bound per IR node (a guard against blow-ups such as the quadratic
  e-graph of residual streams, not a performance figure: those are in benchmarks/).

A program is plain data (`Program`: input and parameter shapes, then steps that name their
operands by index into the values so far), so hypothesis shrinks a failure to a small program and
prints it; every failure found stays below as an `@example` of the test that found it.
CI runs the fixed example budget below, derandomized (tests/conftest.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import assert_same_results
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import compile_plan
from meganeura.ir.interpret import interpret
from meganeura.runtime import Executable, default_device
from meganeura.target import Target

INTERPRETER_EXAMPLES = int(os.environ.get("MEGANEURA_FUZZ_EXAMPLES", 100))
DEVICE_EXAMPLES = max(1, INTERPRETER_EXAMPLES // 5)
# A guard against extraction blowing up (50 residual blocks once took 166 s), not a speed claim:
# typical is ~1 ms a node (benchmarks/compile_scale.py). Wall time on a loaded 2-core machine
# (two test suites at once) reached 1.43 s for 19 nodes, over the 1.0 s this allowed before.
SECONDS_PER_NODE = 0.01
FIXED_SECONDS = 3.0

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Program:
    """Inputs and parameters (shapes), then steps (op name, operand indices, an integer argument).
    An operand index counts back from the newest value (0: the previous step's result) over the
    inputs, parameters and earlier steps, modulo their number, so small indices make chains and
    residual paths, and an index used twice a shared subexpression; outputs count the same way."""

    inputs: tuple[Shape, ...]
    params: tuple[Shape, ...]
    steps: tuple[tuple[str, tuple[int, ...], int], ...]
    outputs: tuple[int, ...]  # values the loss (or the inference program) returns
    optimizer: str | None = "adamw"  # a key of OPTIMIZERS, or None for an inference program


# -- the ops a step may be: each takes tensors (and an integer) and returns one, or None where it
# does not apply to these shapes (the step then falls back to `tanh` of its first operand)


def broadcastable(a: Shape, b: Shape) -> bool:
    return all(x == y or 1 in (x, y) for x, y in zip(a[::-1], b[::-1], strict=False))


def binary(fn):
    return lambda a, b, k: fn(a, b) if broadcastable(a.shape, b.shape) else None


def reduction(fn):
    def apply(a, b, k):
        if not a.shape:
            return None
        return fn(a, k % len(a.shape), bool(k & 4))

    return apply


def matmul(a, b, k):
    if len(a.shape) >= 2 and len(b.shape) == 2 and a.shape[-1] == b.shape[0]:
        return a @ b
    if len(a.shape) >= 2 and len(b.shape) == 2 and a.shape[-1] == b.shape[1]:
        return a @ b.T
    if len(a.shape) >= 2 and a.shape == b.shape:  # batched: scores a·bᵀ, or aᵀ·b
        return a @ b.transpose(-1, -2) if k & 1 else a.transpose(-1, -2) @ b
    if len(a.shape) >= 2:  # a Gram matrix, a·aᵀ or aᵀ·a
        return a @ a.transpose(-1, -2) if k & 2 else a.transpose(-1, -2) @ a
    return None


def linear(a, b, k):
    if len(b.shape) == 2 and a.shape and a.shape[-1] == b.shape[1]:
        return F.linear(a, b)
    return None


def attention(a, b, k):
    """Self-attention with a as queries and b (or a) as keys and values, one head per batch row."""
    if len(a.shape) != 3:
        return None
    kv = b if b.shape == a.shape else a
    return F.scaled_dot_product_attention(
        a.unsqueeze(1), kv.unsqueeze(1), kv.unsqueeze(1), is_causal=bool(k & 1)
    ).squeeze(1)


def norm(a, b, k):
    if not a.shape:
        return None
    weight = b if b.shape == a.shape[-1:] else None
    if k & 1:
        return F.rms_norm(a, a.shape[-1:], weight, eps=1e-3)
    return F.layer_norm(a, a.shape[-1:], weight, eps=1e-3)


def reshape(a, b, k):
    if len(a.shape) < 2:
        return None
    return a.reshape(*a.shape[:-2], a.shape[-2] * a.shape[-1]) if k & 1 else a.reshape(-1, a.shape[-1])


def concat(a, b, k):
    if len(a.shape) != len(b.shape) or not a.shape:
        return None
    dim = k % len(a.shape)
    if any(x != y for i, (x, y) in enumerate(zip(a.shape, b.shape, strict=True)) if i != dim):
        return None
    return mn.cat([a, b], dim)


def transpose(a, b, k):
    return a.transpose(-1, -2) if len(a.shape) >= 2 else None


def flatten(a, b, k):
    return a.flatten() if len(a.shape) >= 2 else a.unsqueeze(0)


def slice_last(a, b, k):
    if not a.shape or a.shape[-1] < 2:
        return None
    return a[..., : 1 + k % (a.shape[-1] - 1)]


def normalize(a, b, k):
    if not a.shape:
        return None
    centred = a - F.mean(a, -1, keepdim=True)
    return centred * F.rsqrt(F.mean(centred * centred, -1, keepdim=True) + 1e-3)


OPS = {
    # elementwise, safe on any input (bounded where the function grows fast)
    "relu": lambda a, b, k: F.relu(a),
    "tanh": lambda a, b, k: F.tanh(a),
    "sigmoid": lambda a, b, k: F.sigmoid(a),
    "silu": lambda a, b, k: F.silu(a),
    "gelu": lambda a, b, k: F.gelu(a),
    "abs": lambda a, b, k: F.abs(a),
    "neg": lambda a, b, k: -a,
    "exp": lambda a, b, k: F.exp(F.tanh(a)),
    "log": lambda a, b, k: F.log(a * a + 1.0),
    "sqrt": lambda a, b, k: F.sqrt(a * a + 0.5),
    "leaky_relu": lambda a, b, k: F.leaky_relu(a, 0.1),
    "softplus": lambda a, b, k: F.softplus(a),
    "clamp": lambda a, b, k: a.clamp(-0.5 - k % 3, 0.5 + k % 2),
    "scale": lambda a, b, k: a * (0.5 + k % 4),
    # binary, broadcasting
    "add": binary(lambda a, b: a + b),
    "sub": binary(lambda a, b: a - b),
    "mul": binary(lambda a, b: a * b),
    "div": binary(lambda a, b: a / (b * b + 1.0)),
    "where": binary(lambda a, b: mn.where(a > b, a, b * 0.5)),
    "mask": binary(lambda a, b: (a >= b) * a + (a != b) * 0.25),
    "residual": binary(lambda a, b: a + F.tanh(b)),
    # reductions and rows
    "sum": reduction(lambda a, dim, keep: F.sum(a, dim, keep)),
    "mean": reduction(lambda a, dim, keep: F.mean(a, dim, keep)),
    "amax": reduction(lambda a, dim, keep: F.amax(a, dim, keep)),
    "softmax": lambda a, b, k: F.softmax(a, -1) if a.shape else None,
    "log_softmax": lambda a, b, k: F.log_softmax(a, -1) if a.shape else None,
    "normalize": normalize,
    "norm": norm,
    # products and layouts
    "matmul": matmul,
    "linear": linear,
    "attention": attention,
    "reshape": reshape,
    "concat": concat,
    "transpose": transpose,
    "flatten": flatten,
    "slice": slice_last,
}


def run_program(program: Program, values: list):
    """Run the steps on `values` (inputs and parameters, as Tensors); every value."""
    for name, operands, k in program.steps:
        a, b = (values[-1 - i % len(values)] for i in operands)
        out = OPS[name](a, b, k)
        values.append(out if out is not None else F.tanh(a))
    return values


class Fuzzed(nn.Module):
    def __init__(self, program: Program, rng: np.random.Generator) -> None:
        super().__init__()
        self.program = program
        for i, shape in enumerate(program.params):
            setattr(self, f"w{i}", nn.Parameter(rng.normal(size=shape).astype(np.float32) * 0.5))

    def forward(self, **inputs):
        values = run_program(
            self.program,
            [inputs[f"x{i}"] for i in range(len(self.program.inputs))]
            + [getattr(self, f"w{i}") for i in range(len(self.program.params))],
        )
        chosen = [values[-1 - i % len(values)] for i in self.program.outputs]
        return chosen[0] if len(chosen) == 1 else tuple(chosen)


def loss_of(program: Program):
    def loss(model, **inputs):
        outputs = model(**inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return sum(F.mean(out * (0.5 + index)) for index, out in enumerate(outputs))  # several heads

    return loss


# -- the strategy

# Adam's eps is large here: a gradient that is zero in exact arithmetic (the sum over a row of
# log_softmax's gradient) is rounding noise of either sign, which eps=1e-8 would turn into a full
# step of ±lr, so the device and the interpreter would disagree about nothing (found by the fuzzer).
OPTIMIZERS = {
    "adamw": lambda: optim.AdamW(lr=1e-2, eps=1e-3, weight_decay=0.1),
    "sgd": lambda: optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01),
}

OP_MENU = sorted(OPS) + ["matmul", "linear", "transpose", "attention", "norm"] * 2  # the kernels with rules


@st.composite
def programs(draw) -> Program:
    """Shapes are drawn from a few shared sizes (batch, rows, features, another width) so that
    broadcasts, matmuls and concatenations line up often; sizes go down to 1 for ragged edges."""
    b, n, d, e = (draw(st.integers(1, size)) for size in (3, 5, 6, 4))
    pool = [(b, n, d), (n, d), (d,), (1, d), (n, 1), (b, 1, d), (d, e), (e, d), (), (b, n, e), (n, e)]
    shape = st.sampled_from(pool)
    weight = st.sampled_from([(d, e), (e, d), (d,), (d, d)]) | shape  # parameters: mostly weights
    inputs = tuple(draw(st.lists(shape, min_size=1, max_size=2)))
    params = tuple(draw(st.lists(weight, min_size=1, max_size=3)))
    index = st.integers(0, 7) | st.integers(0, 63)  # mostly recent values
    step = st.tuples(st.sampled_from(OP_MENU), st.tuples(index, index), st.integers(0, 7))
    steps = tuple(draw(step) for _ in range(draw(st.integers(2, 20))))
    outputs = tuple(draw(st.lists(st.integers(0, 2) | index, min_size=1, max_size=3)))
    return Program(inputs, params, steps, outputs, draw(st.sampled_from([*OPTIMIZERS, None])))


FUZZ_TARGET = Target("fuzz", compute_units=8, max_storage_buffers=31)  # a small adapter: fill matters


def compile_program(program: Program, target: Target = FUZZ_TARGET):
    rng = np.random.default_rng(len(program.steps))
    model = Fuzzed(program, rng)
    specs = {f"x{i}": mn.f32[shape] for i, shape in enumerate(program.inputs)}
    optimizer = OPTIMIZERS[program.optimizer]() if program.optimizer else None
    loss = loss_of(program) if optimizer else None
    started = time.perf_counter()
    compilation = compile_plan(model, loss, specs, optimizer, target=target)
    return compilation, time.perf_counter() - started


def feed(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"x{i}": rng.normal(size=shape).astype(np.float32) for i, shape in enumerate(program.inputs)}


def fuzz(examples: int) -> settings:
    """The loaded profile (tests/conftest.py) with this example budget; programs are large draws."""
    return settings(
        settings.default,
        max_examples=examples,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@fuzz(INTERPRETER_EXAMPLES)
@given(program=programs())
@example(Program(inputs=((),), params=((),), steps=(("abs", (0, 0), 0),), outputs=(0,)))  # a reduction of a scalar
@example(  # ((wᵀ)ᵀ)ᵀ is wᵀ, an output: cancel_permutes subsumed wᵀ's only e-node
    Program(
        inputs=((1, 1, 1),),
        params=((1, 1),),
        steps=(("transpose", (0, 0), 0), ("transpose", (0, 0), 0), ("abs", (0, 0), 0), ("transpose", (1, 0), 0)),
        outputs=(0,),
        optimizer=None,
    )
)
@example(Program(((2,),), ((3, 2),), (("linear", (1, 0), 0),), (0,)))  # F.linear of a vector: raised "rank >= 2"
def test_optimized_plans_compute_what_the_traced_step_computes(program):
    compilation, seconds = compile_program(program)
    traced = compilation.traced
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    assert_same_results(traced.graph, compilation.fused_graph, feed(program), params, traced.initial_states, tol=1e-4)
    nodes = len(traced.graph)
    assert seconds < FIXED_SECONDS + SECONDS_PER_NODE * nodes, f"{seconds:.2f} s for {nodes} IR nodes"


@pytest.mark.gpu
@fuzz(DEVICE_EXAMPLES)
@given(program=programs())
@example(  # w1's gradient is exactly zero (a row's sum of log_softmax's gradient): see OPTIMIZERS
    Program(((1, 1, 1),), ((1, 2), (2, 1)), (("add", (0, 1), 0), ("log_softmax", (0, 0), 0)), (0,), "adamw")
)
def test_compiled_kernels_compute_what_the_interpreter_computes(program):
    compilation, _ = compile_program(program, default_device().target)
    traced = compilation.traced
    params = {name: p.numpy() for name, p in traced.parameters.items()}
    inputs = feed(program)
    expected = interpret(traced.graph, inputs, params, {**traced.initial_states, **params})
    executable = Executable(
        compilation.compiled, default_device(), traced.parameters, traced.initial_states, canary_words=4
    )
    got = executable.run(inputs, read=tuple(traced.graph.outputs))
    for name, value in expected.outputs.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    for name, value in expected.updates.items():
        np.testing.assert_allclose(executable.read_state(name), value, rtol=1e-4, atol=1e-5, err_msg=name)
    assert executable.changed_canaries() == []
