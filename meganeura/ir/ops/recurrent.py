"""Recurrent cells: the elementwise part of one LSTM or GRU time step, and its gradient.

A time step of an unrolled LSTM or GRU (meganeura/nn/rnn.py) is a matmul or two (the
hidden state's projection, with the input's projected for every step at once before the loop)
and these ops: one kernel each way that reads the gates of a hidden unit and writes its new
state. Traced from the elementwise ops instead, a step was ~60 IR nodes and ~17 kernels (the
four gates' slices, activations, products, and in the backward their gradients joined by
concats), and a 256-step unroll took the e-graph's extraction past half a minute; with these
ops it is ~20 nodes and ~8 kernels.

- `lstm_cell(gates [*, 4H], c [*, H]) → (h', c')`: i, f, g, o = the quarters of the gates'
  last dim (PyTorch's order), c' = σ(f)·c + σ(i)·tanh(g), h' = σ(o)·tanh(c'), as torch's
  LSTMCell computes them from the summed pre-activations.
- `lstm_cell_grad(gates, c, dh, dc) → (dgates [*, 4H], dc_prev [*, H])`: its VJP, the
  activations recomputed from the gates; dh and dc broadcast to [*, H] (a scalar 0 where no
  gradient reaches h' or c').
- `gru_cell(gx [*, 3H], gh [*, 3H], h [*, H]) → h'`: r, z, n = the thirds (PyTorch's order) of
  the input's projection gx = W_i·x + b_i and the hidden state's gh = W_h·h + b_h;
  r = σ(gx_r + gh_r), z = σ(gx_z + gh_z), n = tanh(gx_n + r·gh_n), h' = (h − n)·z + n
  (torch's GRUCell, with its rounding).
- `gru_cell_grad(gx, gh, h, dh') → (dgx [*, 3H], dgh [*, 3H], dh [*, H])`: its VJP; dgh's
  r and z thirds equal dgx's, its n third is dgx's times r.

The gradients have no gradient rule of their own (no double backward).
"""

from __future__ import annotations

import numpy as np

from meganeura.ir.functions import sigmoid
from meganeura.ir.graph import TensorType
from meganeura.ir.op import Op, ShapeError, broadcasts_to, require_float

FAMILY = "recurrent"


def hidden_size(gates: TensorType, count: int, op: str) -> int:
    """H of gates [*, count·H], or a ShapeError."""
    if gates.rank < 1 or gates.shape[-1] % count or gates.shape[-1] == 0:
        raise ShapeError(f"{op}: expected gates [*, {count}·hidden], got {gates}")
    return gates.shape[-1] // count


def state_type(gates: TensorType, hidden: int) -> TensorType:
    return TensorType((*gates.shape[:-1], hidden), "f32")


def check_broadcasts(op: str, names: tuple[str, ...], types, state: TensorType) -> None:
    for name, t in zip(names, types, strict=True):
        if not broadcasts_to(t.shape, state.shape):
            raise ShapeError(f"{op}: {name} {t} does not broadcast to the state {state}")


def infer_lstm_cell(types, attrs) -> tuple[TensorType, TensorType]:
    require_float(types, "lstm_cell")
    gates, c = types
    state = state_type(gates, hidden_size(gates, 4, "lstm_cell"))
    check_broadcasts("lstm_cell", ("c",), (c,), state)
    return (state, state)


def infer_lstm_cell_grad(types, attrs) -> tuple[TensorType, TensorType]:
    require_float(types, "lstm_cell_grad")
    gates = types[0]
    state = state_type(gates, hidden_size(gates, 4, "lstm_cell_grad"))
    check_broadcasts("lstm_cell_grad", ("c", "dh", "dc"), types[1:], state)
    return (TensorType(gates.shape, "f32"), state)


def infer_gru_cell(types, attrs) -> TensorType:
    require_float(types, "gru_cell")
    gx, gh, h = types
    state = state_type(gx, hidden_size(gx, 3, "gru_cell"))
    if gh.shape != gx.shape:
        raise ShapeError(f"gru_cell: gh {gh} must match gx {gx}")
    check_broadcasts("gru_cell", ("h",), (h,), state)
    return state


def infer_gru_cell_grad(types, attrs) -> tuple[TensorType, TensorType, TensorType]:
    require_float(types, "gru_cell_grad")
    gx, gh = types[:2]
    state = state_type(gx, hidden_size(gx, 3, "gru_cell_grad"))
    if gh.shape != gx.shape:
        raise ShapeError(f"gru_cell_grad: gh {gh} must match gx {gx}")
    check_broadcasts("gru_cell_grad", ("h", "dh"), types[2:], state)
    return (TensorType(gx.shape, "f32"), TensorType(gx.shape, "f32"), state)


def parts(x: np.ndarray, count: int) -> list[np.ndarray]:
    """The `count` equal parts of x's last dim."""
    return np.split(x, count, axis=-1)


def lstm_activations(gates: np.ndarray, c: np.ndarray):
    """(i, f, g, o, c', tanh(c')) of an LSTM step."""
    i, f, g, o = parts(gates, 4)
    i, f, g, o = sigmoid(i), sigmoid(f), np.tanh(g), sigmoid(o)
    c_new = f * c + i * g
    return i, f, g, o, c_new, np.tanh(c_new)


def evaluate_lstm_cell(gates, c):
    _, _, _, o, c_new, tanh_c = lstm_activations(gates, c)
    return o * tanh_c, np.broadcast_to(c_new, o.shape).copy()


def evaluate_lstm_cell_grad(gates, c, dh, dc):
    i, f, g, o, _, tanh_c = lstm_activations(gates, c)
    one = gates.dtype.type(1)
    dc_total = dc + dh * o * (one - tanh_c * tanh_c)
    grads = (
        dc_total * g * i * (one - i),
        dc_total * c * f * (one - f),
        dc_total * i * (one - g * g),
        dh * tanh_c * o * (one - o),
    )
    shape = i.shape
    dgates = np.concatenate([np.broadcast_to(part, shape) for part in grads], axis=-1)
    return dgates, np.broadcast_to(dc_total * f, shape).copy()


def gru_activations(gx: np.ndarray, gh: np.ndarray):
    """(r, z, n) of a GRU step."""
    (xr, xz, xn), (hr, hz, hn) = parts(gx, 3), parts(gh, 3)
    r, z = sigmoid(xr + hr), sigmoid(xz + hz)
    return r, z, np.tanh(xn + r * hn)


def evaluate_gru_cell(gx, gh, h):
    _, z, n = gru_activations(gx, gh)
    return (h - n) * z + n


def evaluate_gru_cell_grad(gx, gh, h, dh):
    r, z, n = gru_activations(gx, gh)
    one = gx.dtype.type(1)
    shape = z.shape
    dz = dh * (h - n) * z * (one - z)
    dn = dh * (one - z) * (one - n * n)
    dr = dn * parts(gh, 3)[2] * r * (one - r)
    dgx = np.concatenate([np.broadcast_to(part, shape) for part in (dr, dz, dn)], axis=-1)
    dgh = np.concatenate([np.broadcast_to(part, shape) for part in (dr, dz, dn * r)], axis=-1)
    return dgx, dgh, np.broadcast_to(dh * z, shape).copy()


def cell_flops(per_unit: int):
    """`per_unit` flops (transcendental functions counted as one) per hidden unit of each row."""

    def flops(operands, results, attrs) -> int:
        return per_unit * results[-1].numel

    return flops


LSTM_CELL = Op(
    "lstm_cell",
    family=FAMILY,
    infer=infer_lstm_cell,
    evaluate=evaluate_lstm_cell,
    operands=("gates", "c"),
    flops=cell_flops(12),
    doc="(h', c') of an LSTM step from its gates [*, 4H] (i, f, g, o) and cell state c",
)
LSTM_CELL_GRAD = Op(
    "lstm_cell_grad",
    family=FAMILY,
    infer=infer_lstm_cell_grad,
    evaluate=evaluate_lstm_cell_grad,
    operands=("gates", "c", "dh", "dc"),
    flops=cell_flops(30),
    doc="(dgates, dc_prev) of an LSTM step: lstm_cell's VJP",
)
GRU_CELL = Op(
    "gru_cell",
    family=FAMILY,
    infer=infer_gru_cell,
    evaluate=evaluate_gru_cell,
    operands=("gx", "gh", "h"),
    flops=cell_flops(12),
    doc="h' of a GRU step from the input's and the hidden state's projections [*, 3H] (r, z, n)",
)
GRU_CELL_GRAD = Op(
    "gru_cell_grad",
    family=FAMILY,
    infer=infer_gru_cell_grad,
    evaluate=evaluate_gru_cell_grad,
    operands=("gx", "gh", "h", "dh"),
    flops=cell_flops(30),
    doc="(dgx, dgh, dh) of a GRU step: gru_cell's VJP",
)


@LSTM_CELL.vjp
def _lstm_cell(b, node, grads):
    dh, dc = grads
    if dh is None and dc is None:
        return [None, None]
    gates, c = node.inputs
    zero = b.const(0.0)
    grad = b.emit("lstm_cell_grad", [gates, c, zero if dh is None else dh, zero if dc is None else dc])
    return [b.result(grad, 0), b.unbroadcast(b.result(grad, 1), b.shape(c))]


@GRU_CELL.vjp
def _gru_cell(b, node, g):
    gx, gh, h = node.inputs
    grad = b.emit("gru_cell_grad", [gx, gh, h, g])
    return [b.result(grad, 0), b.result(grad, 1), b.unbroadcast(b.result(grad, 2), b.shape(h))]
