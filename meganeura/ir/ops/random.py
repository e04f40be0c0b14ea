"""Random tensors: Philox4x32-10 counter-based random numbers, the same on the device and in numpy.

The generator is Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy
as 1, 2, 3", SC'11; the Random123 library): a keyed bijection of a 128-bit counter, so every
random value is a pure function of where it is drawn, and any kernel can draw (or draw again)
any element by itself. A step's random values come from one persistent leaf, the RNG state:

    state "rng.philox" : i32[4] = (seed_lo, seed_hi, step_lo, step_hi)   (32-bit words, as bits)

which the host writes before every step (`Program`, meganeura/compiler.py); the element at flat
index i (row-major, in the random tensor's own shape) of the random node with stream number s is

    key     = (seed_lo, seed_hi)
    counter = (i, s, step_lo, step_hi)
    bits    = philox4x32_10(counter, key)          (four 32-bit words)
    uniform = (bits[0] >> 8) · 2⁻²⁴                 in [0, 1), exact in f32
    normal  = sqrt(−2·ln u₁)·cos(2π·u₂), u₁ = ((bits[0] >> 8) + 1)·2⁻²⁴ ∈ (0, 1], u₂ = (bits[1] >> 8)·2⁻²⁴

so every element, every random node (stream) and every step draws from its own counter. Tracing
numbers the random nodes of a step 0, 1, 2… (`Tracer.next_stream`).

- `rand(state) {shape, stream, normal}`: a random tensor of a static shape (uniform in [0, 1),
  or standard normal), written to a buffer by its own kernel;
- `philox(state) {shape, stream, normal}`: the same values, computed by every kernel that reads
  them (no kernel or buffer of its own, as a constant is a literal). Made only by the e-graph
  (`regenerate_random`, rewrite/pointwise.py): a random tensor's load becomes its draw, so a
  dropout mask fuses into the kernels that use it and the backward draws it again rather than
  reading a stored mask, where the cost model prices that cheaper (rewrite/cost.py `DRAW_FLOPS`).

Neither has a gradient (the state is not differentiable).
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.op import BOOL, INT, INTS, Attr, Op, ShapeError

FAMILY = "random"
# What the cost model charges for one element drawn (rewrite/cost.py): about 400 32-bit integer
# operations (10 rounds of two 32×32→64-bit products built from 16-bit halves, ~17 operations each,
# the xors and the key schedule), counted double since 32-bit integer multiply-adds issue at half
# the FP32 rate (an H100/H200 SM has 64 INT32 lanes to 128 FP32). At cost.FLOPS_PER_BYTE = 8 a draw
# costs what moving 100 bytes does: regenerating a mask pays against storing it only for small ones.
DRAW_FLOPS = 800
RNG_STATE = "rng.philox"  # the name of the state leaf (layout in the module docstring)
RNG_STATE_TYPE = TensorType((4,), "i32")

# Philox4x32's round multipliers and Weyl key increments (Random123, philox.h).
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
PHILOX_ROUNDS = 10
MASK32 = 0xFFFFFFFF


def philox4x32(counter: np.ndarray, key: np.ndarray, rounds: int = PHILOX_ROUNDS) -> np.ndarray:
    """Philox4x32-`rounds` of counters `counter` [4, n] under `key` [2] (uint32): the words [4, n].

    The 32×32→64 products are numpy uint64 products, split into high and low words."""
    c = [np.asarray(word, dtype=np.uint64) for word in np.asarray(counter, dtype=np.uint32)]
    k0, k1 = (np.uint64(int(word)) for word in np.asarray(key, dtype=np.uint32))
    m0, m1 = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1])
    mask, shift = np.uint64(MASK32), np.uint64(32)
    for index in range(rounds):
        if index:
            k0 = (k0 + np.uint64(PHILOX_W[0])) & mask
            k1 = (k1 + np.uint64(PHILOX_W[1])) & mask
        p0, p1 = m0 * c[0], m1 * c[2]
        c = [(p1 >> shift) ^ c[1] ^ k0, p1 & mask, (p0 >> shift) ^ c[3] ^ k1, p0 & mask]
    return np.stack(c).astype(np.uint32)


def rng_state(seed: int, step: int) -> np.ndarray:
    """The RNG state leaf's value for `seed` and `step` (each taken modulo 2⁶⁴): i32[4] of the words."""
    seed, step = int(seed) % 2**64, int(step) % 2**64
    words = np.array([seed & MASK32, seed >> 32, step & MASK32, step >> 32], dtype=np.uint32)
    return words.view(np.int32)


def philox_bits(state: np.ndarray, shape: tuple[int, ...], stream: int) -> np.ndarray:
    """The Philox words [4, *shape] of a random node's elements (counters in the module docstring)."""
    words = np.asarray(state).astype(np.int32).view(np.uint32).reshape(4)
    count = int(np.prod(shape, dtype=np.int64))
    counter = np.empty((4, count), dtype=np.uint32)
    counter[0] = np.arange(count, dtype=np.uint32)
    counter[1] = np.uint32(stream & MASK32)
    counter[2], counter[3] = words[2], words[3]
    return philox4x32(counter, words[:2]).reshape((4, *shape))


UNIT = np.float32(2.0**-24)
TWO_PI = np.float32(2.0 * np.pi)


def uniform(bits: np.ndarray) -> np.ndarray:
    """f32 in [0, 1) from the top 24 bits of each word (exact: 24 bits fit an f32's mantissa)."""
    return (bits >> np.uint32(8)).astype(np.float32) * UNIT


def normal(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Standard normal f32 by Box–Muller from two words: sqrt(−2·ln u₁)·cos(2π·u₂), u₁ ∈ (0, 1]."""
    u1 = ((first >> np.uint32(8)).astype(np.float32) + np.float32(1.0)) * UNIT
    u2 = uniform(second)
    return np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(TWO_PI * u2)


def draw(state: np.ndarray, shape: tuple[int, ...], stream: int, normal_: bool = False) -> np.ndarray:
    """The values of a random node (`rand`/`philox`) under RNG state `state` (f32, `shape`)."""
    bits = philox_bits(state, tuple(shape), stream)
    return (normal(bits[0], bits[1]) if normal_ else uniform(bits[0])).astype(np.float32)


def infer_random(name: str):
    def infer(types, attrs) -> TensorType:
        (state,) = types
        if state != RNG_STATE_TYPE:
            raise ShapeError(f"{name}: expected the RNG state {RNG_STATE_TYPE}, got {state}")
        if any(d < 0 for d in attrs["shape"]):
            raise ShapeError(f"{name}: sizes must be non-negative, got {list(attrs['shape'])}")
        if not 0 <= attrs["stream"] <= MASK32:
            raise ShapeError(f"{name}: stream {attrs['stream']} does not fit 32 bits")
        return TensorType(tuple(attrs["shape"]), "f32")

    return infer


def evaluate_random(state, shape, stream, normal):
    return draw(state, shape, stream, normal)


def describe_random(node) -> str:
    kind = "normal" if node.attr("normal") else "uniform"
    return f"{kind} {list(node.attr('shape'))} stream {node.attr('stream')}"


RANDOM_ATTRS = (Attr("shape", INTS), Attr("stream", INT), Attr("normal", BOOL, False))

RAND = Op(
    "rand",
    family=FAMILY,
    infer=infer_random("rand"),
    evaluate=evaluate_random,
    operands=("state",),
    attrs=RANDOM_ATTRS,
    flops=lambda operands, results, attrs: results[0].numel * DRAW_FLOPS,
    describe=describe_random,
    doc="a random tensor (uniform in [0, 1), or standard normal) of stream `stream`, drawn into a buffer",
)

PHILOX = Op(
    "philox",
    family=FAMILY,
    infer=infer_random("philox"),
    evaluate=evaluate_random,
    operands=("state",),
    attrs=RANDOM_ATTRS,
    kernel=False,
    describe=describe_random,
    doc="a random tensor computed by every kernel that reads it (made by the e-graph from `rand`)",
)


@RAND.vjp
def _rand_vjp(b, node, g):
    return [None]


@PHILOX.vjp
def _philox_vjp(b, node, g):
    return [None]
