"""Recurrent layers with PyTorch's names, signatures, parameters and initialisation: RNN, LSTM,
GRU, RNNCell, LSTMCell, GRUCell. A PyTorch state_dict of each loads unchanged.

A layer is unrolled over the static sequence length: the input's projection of every time step
is one matmul before the loop; a step is the hidden state's matmul and, for the LSTM and the GRU,
one fused cell (ir/ops/recurrent.py), whose gradient is one kernel too.

>>> from meganeura import nn
>>> [(name, p.shape) for name, p in nn.LSTM(10, 20, num_layers=2).named_parameters()][:4]
[('weight_ih_l0', (80, 10)), ('weight_hh_l0', (80, 20)), ('bias_ih_l0', (80,)), ('bias_hh_l0', (80,))]
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from meganeura import functional as F
from meganeura.ir.op import ShapeError
from meganeura.ir.trace import user_source_line
from meganeura.nn import init
from meganeura.nn.module import Module
from meganeura.parameter import Parameter
from meganeura.tensor import Tensor, apply, apply_results, lift

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def empty_parameter(*shape: int) -> Parameter:
    """A parameter of `shape` for reset_parameters to fill."""
    return Parameter(np.zeros(shape, np.float32))


def reset_recurrent(module: Module) -> None:
    """Every parameter of a recurrent layer or cell U(−1/√hidden_size, 1/√hidden_size), as torch."""
    bound = 1.0 / math.sqrt(module.hidden_size) if module.hidden_size > 0 else 0.0
    for param in module.parameters():
        init.uniform_(param, -bound, bound)


class RNNBase(Module):
    """The parameters and the unrolled forward of torch's RNN, LSTM and GRU: per layer and
    direction weight_ih_l{k}[_reverse] [gates·H, input], weight_hh_l{k} [gates·H, H], bias_ih_l{k},
    bias_hh_l{k}, all U(−1/√H, 1/√H)."""

    def __init__(
        self,
        mode: str,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
    ) -> None:
        super().__init__()
        at = user_source_line()
        name = mode.split("_")[0]
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1:
            raise ValueError(
                f"{at}: dropout should be a number in range [0, 1] representing the probability of an element "
                "being zeroed"
            )
        if dropout > 0 and num_layers == 1:
            warnings.warn(
                "dropout option adds dropout after all but last recurrent layer, so non-zero dropout expects "
                f"num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                stacklevel=3,
            )
        for what, value in (("hidden_size", hidden_size), ("num_layers", num_layers)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
                raise TypeError(f"{at}: {what} should be of type int, got: {type(value).__name__}")
            if value <= 0:
                raise ValueError(f"{at}: {what} must be greater than zero")
        if proj_size:
            raise NotImplementedError(f"{at}: {name}: proj_size is not supported (only 0)")
        self.mode = mode
        self.input_size, self.hidden_size = int(input_size), int(hidden_size)
        self.num_layers, self.bias, self.batch_first = int(num_layers), bool(bias), bool(batch_first)
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bool(bidirectional), 0
        directions = 2 if bidirectional else 1
        gates = RECURRENT_GATES[mode] * self.hidden_size
        for layer in range(self.num_layers):
            layer_input = self.input_size if layer == 0 else self.hidden_size * directions
            for direction in range(directions):
                suffix = f"_l{layer}{'_reverse' if direction else ''}"
                setattr(self, "weight_ih" + suffix, empty_parameter(gates, layer_input))
                setattr(self, "weight_hh" + suffix, empty_parameter(gates, self.hidden_size))
                if self.bias:
                    setattr(self, "bias_ih" + suffix, empty_parameter(gates))
                    setattr(self, "bias_hh" + suffix, empty_parameter(gates))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's: every parameter U(−1/√hidden_size, 1/√hidden_size)."""
        reset_recurrent(self)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if self.mode == "RNN_RELU":
            text += ", nonlinearity='relu'"
        for name, default in (("bias", True), ("batch_first", False), ("bidirectional", False)):
            if getattr(self, name) != default:
                text += f", {name}={getattr(self, name)}"
        if self.dropout:
            text += f", dropout={self.dropout}"
        return text

    def layer_weights(self, layer: int, direction: int) -> tuple:
        suffix = f"_l{layer}{'_reverse' if direction else ''}"
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        return tuple(getattr(self, name + suffix, None) for name in names)

    def run(self, input, hx, at: str):
        """(output, h_n, c_n or None) of the unrolled layers, torch's layouts, batched or not."""
        x = lift(input)
        name = self.mode.split("_")[0]
        if x.ndim not in (2, 3):
            raise ShapeError(f"{at}: {name}: Expected input to be 2D or 3D, got {x.ndim}D instead")
        batched = x.ndim == 3
        batch_first = self.batch_first and batched
        if not batched:
            x = F.unsqueeze(x, 1)
        if x.shape[-1] != self.input_size:
            raise ShapeError(
                f"{at}: {name}: input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                f"got {x.shape[-1]}"
            )
        directions = 2 if self.bidirectional else 1
        batch = x.shape[0] if batch_first else x.shape[1]
        state_shape = (self.num_layers * directions, batch, self.hidden_size)
        h0, c0 = self.initial_states(hx, batched, state_shape, at)
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                index = layer * directions + direction
                h_start = None if h0 is None else h0[index]
                c_start = None if c0 is None else c0[index]
                steps, h_last, c_last = self.run_direction(x, layer, direction, h_start, c_start, batch_first)
                outputs.append(steps)
                h_n.append(h_last)
                c_n.append(c_last)
            x = outputs[0] if directions == 1 else F.cat(outputs, -1)
            if layer < self.num_layers - 1 and self.training and self.dropout > 0:
                x = F.dropout(x, self.dropout)
        h_n = F.cat([F.unsqueeze(h, 0) for h in h_n], 0)
        c_n = F.cat([F.unsqueeze(c, 0) for c in c_n], 0) if self.mode == "LSTM" else None
        if not batched:
            x, h_n = F.squeeze(x, 1), F.squeeze(h_n, 1)
            c_n = None if c_n is None else F.squeeze(c_n, 1)
        return x, h_n, c_n

    def initial_states(self, hx, batched: bool, shape: tuple[int, ...], at: str):
        """(h0, c0) as [layers·directions, N, H] Tensors (None: zeros), checked as torch does."""
        if hx is None:
            return None, None
        lstm = self.mode == "LSTM"
        if lstm and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
            raise TypeError(f"{at}: LSTM: hx must be a tuple (h_0, c_0)")
        states = [lift(h) for h in hx] if lstm else [lift(hx)]
        for index, state in enumerate(states):
            what = f"hidden[{index}]" if lstm else "hidden"
            rank = 3 if batched else 2
            if state.ndim != rank:
                kind = "batched 3-D" if batched else "unbatched 2-D"
                raise ShapeError(
                    f"{at}: For {kind} input, hx{' and cx' if lstm else ''} should also be {rank}-D but got "
                    f"{state.ndim}-D tensor{'s' if lstm else ''}"
                )
            expected = shape if batched else (shape[0], shape[2])
            if state.shape != expected:
                raise ShapeError(f"{at}: Expected {what} size {expected}, got {list(state.shape)}")
        if not batched:
            states = [F.unsqueeze(s, 1) for s in states]
        return (states[0], states[1]) if lstm else (states[0], None)

    def run_direction(self, x: Tensor, layer: int, direction: int, h, c, batch_first: bool):
        """(the hidden states of every step stacked as the input is, h_T, c_T) of one direction of a layer."""
        w_ih, w_hh, b_ih, b_hh = self.layer_weights(layer, direction)
        time_dim = 1 if batch_first else 0
        steps = x.shape[time_dim]
        batch = x.shape[1 - time_dim]
        # The input's projection for every step at once; the LSTM's and the RNN's hidden bias is
        # added there too (the GRU needs it inside r·(W_hn·h + b_hn)).
        projected = F.linear(x, w_ih, b_ih)
        if b_hh is not None and self.mode != "GRU":
            projected = projected + b_hh
        if h is None:
            h = F.broadcast_to(0.0, (batch, self.hidden_size))
        if c is None and self.mode == "LSTM":
            c = lift(0.0)
        order = range(steps - 1, -1, -1) if direction else range(steps)
        hidden = [None] * steps
        for t in order:
            gx = projected[:, t] if batch_first else projected[t]
            h, c = self.cell_step(gx, h, c, w_hh, b_hh)
            hidden[t] = h
        stacked = F.cat([F.unsqueeze(state, time_dim) for state in hidden], time_dim)
        return stacked, h, c

    def cell_step(self, gx: Tensor, h: Tensor, c, w_hh, b_hh) -> tuple[Tensor, Tensor | None]:
        """(h', c') of one step from the input's projection gx (with its biases) and the state."""
        if self.mode == "GRU":
            return apply("gru_cell", gx, F.linear(h, w_hh, b_hh), h), None
        gates = gx + F.matmul(h, F.transpose2d(w_hh))
        if self.mode == "LSTM":
            return apply_results("lstm_cell", gates, c)
        return (F.tanh(gates) if self.mode == "RNN_TANH" else F.relu(gates)), None


class RNN(RNNBase):
    """torch.nn.RNN: h' = tanh(W_ih·x + b_ih + W_hh·h + b_hh) (or relu), unrolled over the
    sequence; forward(input, hx=None) returns (output, h_n)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        nonlinearity: str = "tanh",
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
    ) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(
                f"{user_source_line()}: Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'."
            )
        super().__init__(
            f"RNN_{nonlinearity.upper()}",
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout,
            bidirectional,
        )
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx=None) -> tuple[Tensor, Tensor]:
        output, h_n, _ = self.run(input, hx, user_source_line())
        return output, h_n


class LSTM(RNNBase):
    """torch.nn.LSTM (gates i, f, g, o), unrolled over the sequence; forward(input, hx=None)
    returns (output, (h_n, c_n)). Not supported: proj_size (NotImplementedError)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
        proj_size: int = 0,
    ) -> None:
        super().__init__(
            "LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, proj_size
        )

    def forward(self, input: Tensor, hx=None) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, h_n, c_n = self.run(input, hx, user_source_line())
        return output, (h_n, c_n)


class GRU(RNNBase):
    """torch.nn.GRU (gates r, z, n; n = tanh(W_in·x + b_in + r ⊙ (W_hn·h + b_hn))), unrolled
    over the sequence; forward(input, hx=None) returns (output, h_n)."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        num_layers: int = 1,
        bias: bool = True,
        batch_first: bool = False,
        dropout: float = 0.0,
        bidirectional: bool = False,
    ) -> None:
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional)

    def forward(self, input: Tensor, hx=None) -> tuple[Tensor, Tensor]:
        output, h_n, _ = self.run(input, hx, user_source_line())
        return output, h_n


class RNNCellBase(Module):
    """The parameters of torch's cells: weight_ih [num_chunks·H, input], weight_hh
    [num_chunks·H, H], bias_ih and bias_hh [num_chunks·H], all U(−1/√H, 1/√H)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.bias = int(input_size), int(hidden_size), bool(bias)
        gates = num_chunks * self.hidden_size
        self.weight_ih = empty_parameter(gates, self.input_size)
        self.weight_hh = empty_parameter(gates, self.hidden_size)
        self.bias_ih = empty_parameter(gates) if bias else None
        self.bias_hh = empty_parameter(gates) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's: every parameter U(−1/√hidden_size, 1/√hidden_size)."""
        reset_recurrent(self)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if not self.bias:
            text += ", bias=False"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            text += f", nonlinearity={self.nonlinearity!r}"
        return text

    def cell_input(self, input, at: str) -> tuple[Tensor, bool]:
        """(input as [N, input_size], whether it was batched), checked as torch's cells do."""
        x = lift(input)
        if x.ndim not in (1, 2):
            raise ShapeError(f"{at}: {type(self).__name__}: Expected input to be 1D or 2D, got {x.ndim}D instead")
        if x.shape[-1] != self.input_size:
            raise ShapeError(f"{at}: input has inconsistent input_size: got {x.shape[-1]} expected {self.input_size}")
        return (x if x.ndim == 2 else F.unsqueeze(x, 0)), x.ndim == 2

    def cell_state(self, state, batched: bool, batch: int, at: str) -> Tensor:
        """A hidden or cell state as [N, H] (checked: [N, H], or [H] for unbatched input)."""
        state = lift(state)
        expected = (batch, self.hidden_size) if batched else (self.hidden_size,)
        if state.shape != expected:
            raise ShapeError(f"{at}: {type(self).__name__}: expected a hidden state {list(expected)}, got {state.type}")
        return state if batched else F.unsqueeze(state, 0)

    def zeros(self, batch: int) -> Tensor:
        return F.broadcast_to(0.0, (batch, self.hidden_size))


class RNNCell(RNNCellBase):
    """torch.nn.RNNCell: h' = tanh(W_ih·x + b_ih + W_hh·h + b_hh) (or relu)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh") -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"{user_source_line()}: Unknown nonlinearity: {nonlinearity}")
        super().__init__(input_size, hidden_size, bias, 1)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx=None) -> Tensor:
        at = user_source_line()
        x, batched = self.cell_input(input, at)
        h = self.zeros(x.shape[0]) if hx is None else self.cell_state(hx, batched, x.shape[0], at)
        pre = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)
        out = F.tanh(pre) if self.nonlinearity == "tanh" else F.relu(pre)
        return out if batched else F.squeeze(out, 0)


class LSTMCell(RNNCellBase):
    """torch.nn.LSTMCell: forward(input, hx=None) with hx = (h, c); returns (h', c')."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        super().__init__(input_size, hidden_size, bias, 4)

    def forward(self, input: Tensor, hx=None) -> tuple[Tensor, Tensor]:
        at = user_source_line()
        x, batched = self.cell_input(input, at)
        if hx is None:
            h, c = self.zeros(x.shape[0]), lift(0.0)
        else:
            h, c = (self.cell_state(s, batched, x.shape[0], at) for s in hx)
        gates = F.linear(x, self.weight_ih, self.bias_ih) + F.linear(h, self.weight_hh, self.bias_hh)
        h_new, c_new = apply_results("lstm_cell", gates, c)
        return (h_new, c_new) if batched else (F.squeeze(h_new, 0), F.squeeze(c_new, 0))


class GRUCell(RNNCellBase):
    """torch.nn.GRUCell: forward(input, hx=None) returns h'."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        super().__init__(input_size, hidden_size, bias, 3)

    def forward(self, input: Tensor, hx=None) -> Tensor:
        at = user_source_line()
        x, batched = self.cell_input(input, at)
        h = self.zeros(x.shape[0]) if hx is None else self.cell_state(hx, batched, x.shape[0], at)
        gx = F.linear(x, self.weight_ih, self.bias_ih)
        out = apply("gru_cell", gx, F.linear(h, self.weight_hh, self.bias_hh), h)
        return out if batched else F.squeeze(out, 0)
