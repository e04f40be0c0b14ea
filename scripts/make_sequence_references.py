"""Write the PyTorch references of tests/test_sequence_modules.py: tests/reference/sequence_modules.npz.

    /tmp/torch311/bin/python scripts/make_sequence_references.py

This script imports only torch and numpy (never meganeura). For every case below it builds the
torch module (MultiheadAttention, the Transformer's layers, stacks and whole, RNN, LSTM, GRU
and their cells) in float64, loads parameters drawn from a seeded numpy generator (float32
values, so that meganeura starts from the same numbers), runs it on seeded inputs, and takes the
gradient of loss = Σₖ sum(outputₖ · weightₖ) over its outputs (the tensors of its result, in
order, None skipped) with fixed random weights. The file holds, per case `<c>`:

    <c>/meta            a JSON string: the module, its constructor's arguments, the call (see
                        CALLS), train or eval, the torch version
    <c>/init/<name>     every entry of the module's state_dict, in its order (float32)
    <c>/input/<name>    the call's inputs (float32; a boolean mask as 1.0 where True)
    <c>/weight/<k>      the loss weight of output k
    <c>/output/<k>      output k (float64)
    <c>/grad/<name>     d loss / d parameter, for every parameter (float64)
    <c>/loss            the loss (float64)

The call of a case lists the forward's arguments by position and by name: {"input": name} is an
input tensor, {"mask": name} an input boolean mask, a list a tuple of such (an LSTM's hx), and
anything else a Python value. Deterministic: the same bytes every run.
"""

from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

PATH = Path(__file__).resolve().parent.parent / "tests" / "reference" / "sequence_modules.npz"


def x(name):
    return {"input": name}


def mask(name):
    return {"mask": name}


# Each case: module, constructor args and kwargs, the inputs' shapes (a "mask" input: a boolean
# mask; an "additive" one: a float mask with -inf where a boolean one would hide), the call, and
# whether the module runs in eval mode.
CASES = {
    "mha_self_weights": {
        "module": "MultiheadAttention", "args": [8, 2], "kwargs": {},
        "inputs": {"q": [5, 3, 8]}, "call": {"args": [x("q"), x("q"), x("q")]},
    },
    "mha_self_fused": {
        "module": "MultiheadAttention", "args": [8, 2], "kwargs": {},
        "inputs": {"q": [5, 3, 8]}, "call": {"args": [x("q"), x("q"), x("q")], "kwargs": {"need_weights": False}},
    },
    "mha_kdim_vdim_per_head": {
        "module": "MultiheadAttention", "args": [8, 4], "kwargs": {"kdim": 6, "vdim": 7},
        "inputs": {"q": [5, 2, 8], "k": [4, 2, 6], "v": [4, 2, 7]},
        "call": {"args": [x("q"), x("k"), x("v")], "kwargs": {"average_attn_weights": False}},
    },
    "mha_batch_first_kv_no_bias": {
        "module": "MultiheadAttention", "args": [6, 3], "kwargs": {"bias": False, "batch_first": True},
        "inputs": {"q": [2, 5, 6], "kv": [2, 4, 6]}, "call": {"args": [x("q"), x("kv"), x("kv")]},
    },
    "mha_three_inputs_fused": {
        "module": "MultiheadAttention", "args": [6, 2], "kwargs": {"batch_first": True},
        "inputs": {"q": [2, 5, 6], "k": [2, 4, 6], "v": [2, 4, 6]},
        "call": {"args": [x("q"), x("k"), x("v")], "kwargs": {"need_weights": False}},
    },
    "mha_masks_weights": {
        "module": "MultiheadAttention", "args": [8, 2], "kwargs": {},
        "inputs": {"q": [5, 3, 8], "attn": ["additive", 5, 5], "pad": ["mask", 3, 5]},
        "call": {"args": [x("q"), x("q"), x("q")], "kwargs": {"attn_mask": x("attn"), "key_padding_mask": mask("pad")}},
    },
    "mha_bool_mask_3d_weights": {
        "module": "MultiheadAttention", "args": [4, 2], "kwargs": {"batch_first": True},
        "inputs": {"q": [2, 3, 4], "kv": [2, 5, 4], "attn": ["mask", 4, 3, 5]},
        "call": {"args": [x("q"), x("kv"), x("kv")], "kwargs": {"attn_mask": mask("attn")}},
    },
    "mha_masks_fused": {
        "module": "MultiheadAttention", "args": [8, 2], "kwargs": {},
        "inputs": {"q": [5, 3, 8], "attn": ["additive", 5, 5], "pad": ["mask", 3, 5]},
        "call": {
            "args": [x("q"), x("q"), x("q")],
            "kwargs": {"attn_mask": x("attn"), "key_padding_mask": mask("pad"), "need_weights": False},
        },
    },
    "mha_causal_fused": {
        "module": "MultiheadAttention", "args": [8, 2], "kwargs": {},
        "inputs": {"q": [5, 3, 8], "causal": ["causal", 5]},
        "call": {
            "args": [x("q"), x("q"), x("q")],
            "kwargs": {"attn_mask": x("causal"), "is_causal": True, "need_weights": False},
        },
    },
    "mha_unbatched_dropout_eval": {
        "module": "MultiheadAttention", "args": [6, 2], "kwargs": {"dropout": 0.5},
        "inputs": {"q": [4, 6], "kv": [3, 6]}, "call": {"args": [x("q"), x("kv"), x("kv")]}, "eval": True,
    },
    "encoder_layer_post_relu": {
        "module": "TransformerEncoderLayer", "args": [8, 2], "kwargs": {"dim_feedforward": 12, "dropout": 0.0},
        "inputs": {"src": [5, 3, 8]}, "call": {"args": [x("src")]},
    },
    "encoder_layer_pre_gelu_batch_first": {
        "module": "TransformerEncoderLayer", "args": [8, 4],
        "kwargs": {"dim_feedforward": 6, "activation": "gelu", "norm_first": True, "batch_first": True, "bias": False},
        "inputs": {"src": [2, 5, 8]}, "call": {"args": [x("src")]}, "eval": True,
    },
    "encoder_layer_padding_mask": {
        "module": "TransformerEncoderLayer", "args": [8, 2], "kwargs": {"dim_feedforward": 12, "dropout": 0.0},
        "inputs": {"src": [5, 3, 8], "pad": ["mask", 3, 5]},
        "call": {"args": [x("src")], "kwargs": {"src_key_padding_mask": mask("pad")}},
    },
    "encoder_causal_norm": {
        "module": "TransformerEncoder", "args": [], "kwargs": {"num_layers": 2},
        "layer": {"args": [8, 2], "kwargs": {"dim_feedforward": 12, "batch_first": True}}, "norm": 8,
        "inputs": {"src": [2, 5, 8], "causal": ["causal", 5]},
        "call": {"args": [x("src")], "kwargs": {"mask": x("causal"), "is_causal": True}}, "eval": True,
    },
    "decoder_layer_causal": {
        "module": "TransformerDecoderLayer", "args": [8, 2], "kwargs": {"dim_feedforward": 12, "dropout": 0.0},
        "inputs": {"tgt": [4, 2, 8], "memory": [5, 2, 8], "causal": ["causal", 4]},
        "call": {"args": [x("tgt"), x("memory")], "kwargs": {"tgt_mask": x("causal"), "tgt_is_causal": True}},
    },
    "decoder_layer_pre_memory_padding": {
        "module": "TransformerDecoderLayer", "args": [8, 2],
        "kwargs": {"dim_feedforward": 12, "dropout": 0.0, "norm_first": True, "batch_first": True},
        "inputs": {"tgt": [2, 4, 8], "memory": [2, 5, 8], "pad": ["mask", 2, 5]},
        "call": {"args": [x("tgt"), x("memory")], "kwargs": {"memory_key_padding_mask": mask("pad")}},
    },
    "transformer": {
        "module": "Transformer", "args": [],
        "kwargs": {
            "d_model": 8, "nhead": 2, "num_encoder_layers": 1, "num_decoder_layers": 2, "dim_feedforward": 12,
            "batch_first": True,
        },
        "inputs": {"src": [2, 5, 8], "tgt": [2, 4, 8], "causal": ["causal", 4]},
        "call": {"args": [x("src"), x("tgt")], "kwargs": {"tgt_mask": x("causal"), "tgt_is_causal": True}},
        "eval": True,
    },
    "rnn_tanh": {
        "module": "RNN", "args": [5, 7], "kwargs": {},
        "inputs": {"x": [6, 3, 5]}, "call": {"args": [x("x")]},
    },
    "rnn_relu_two_layers_no_bias_h0": {
        "module": "RNN", "args": [4, 6, 2], "kwargs": {"nonlinearity": "relu", "bias": False, "batch_first": True},
        "inputs": {"x": [3, 5, 4], "h0": [2, 3, 6]}, "call": {"args": [x("x"), x("h0")]},
    },
    "lstm": {
        "module": "LSTM", "args": [5, 7], "kwargs": {},
        "inputs": {"x": [6, 3, 5]}, "call": {"args": [x("x")]},
    },
    "lstm_two_layers_bidirectional_hx": {
        "module": "LSTM", "args": [4, 5], "kwargs": {"num_layers": 2, "bidirectional": True, "batch_first": True},
        "inputs": {"x": [3, 6, 4], "h0": [4, 3, 5], "c0": [4, 3, 5]},
        "call": {"args": [x("x"), [x("h0"), x("c0")]]},
    },
    "lstm_unbatched_dropout_eval": {
        "module": "LSTM", "args": [3, 4], "kwargs": {"num_layers": 2, "dropout": 0.5, "bias": False},
        "inputs": {"x": [5, 3]}, "call": {"args": [x("x")]}, "eval": True,
    },
    "gru": {
        "module": "GRU", "args": [5, 7], "kwargs": {},
        "inputs": {"x": [6, 3, 5]}, "call": {"args": [x("x")]},
    },
    "gru_two_layers_bidirectional_h0": {
        "module": "GRU", "args": [4, 5], "kwargs": {"num_layers": 2, "bidirectional": True},
        "inputs": {"x": [6, 3, 4], "h0": [4, 3, 5]}, "call": {"args": [x("x"), x("h0")]},
    },
    "rnn_cell": {
        "module": "RNNCell", "args": [5, 7], "kwargs": {"nonlinearity": "relu"},
        "inputs": {"x": [3, 5], "h": [3, 7]}, "call": {"args": [x("x"), x("h")]},
    },
    "lstm_cell": {
        "module": "LSTMCell", "args": [5, 7], "kwargs": {},
        "inputs": {"x": [3, 5], "h": [3, 7], "c": [3, 7]}, "call": {"args": [x("x"), [x("h"), x("c")]]},
    },
    "lstm_cell_zero_state_unbatched": {
        "module": "LSTMCell", "args": [5, 7], "kwargs": {"bias": False},
        "inputs": {"x": [5]}, "call": {"args": [x("x")]},
    },
    "gru_cell": {
        "module": "GRUCell", "args": [5, 7], "kwargs": {},
        "inputs": {"x": [3, 5], "h": [3, 7]}, "call": {"args": [x("x"), x("h")]},
    },
    "gru_cell_zero_state": {
        "module": "GRUCell", "args": [4, 6], "kwargs": {},
        "inputs": {"x": [2, 4]}, "call": {"args": [x("x")]},
    },
}  # fmt: skip


def build(case: dict) -> nn.Module:
    """The torch module of a case (default initialisation, replaced by `initial_state`)."""
    if case["module"] == "TransformerEncoder":
        layer = nn.TransformerEncoderLayer(*case["layer"]["args"], **case["layer"]["kwargs"])
        norm = nn.LayerNorm(case["norm"]) if case.get("norm") else None
        return nn.TransformerEncoder(layer, norm=norm, enable_nested_tensor=False, **case["kwargs"])
    return getattr(nn, case["module"])(*case["args"], **case["kwargs"])


def seeded(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(ord(c) * 31**i for i, c in enumerate(name)) % 2**32)


def initial_state(module: nn.Module, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every state_dict entry drawn from U(−0.5, 0.5) as float32 (LayerNorm weights near 1)."""
    state = {}
    for name, value in module.state_dict().items():
        draw = rng.uniform(-0.5, 0.5, size=tuple(value.shape))
        if name.endswith("weight") and value.ndim == 1:  # a norm's scale
            draw = draw + 1.0
        state[name] = draw.astype(np.float32)
    return state


def input_values(case: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The inputs: normal values, boolean masks (as 1.0/0.0, one kept key per row at least),
    additive masks (0 and −inf), causal masks (−inf above the diagonal)."""
    values = {}
    for name, spec in case["inputs"].items():
        kind = spec[0] if isinstance(spec[0], str) else "normal"
        shape = tuple(spec[1:]) if kind != "normal" else tuple(spec)
        if kind == "normal":
            values[name] = rng.normal(size=shape).astype(np.float32)
        elif kind == "causal":
            n = shape[0]
            values[name] = np.where(np.triu(np.ones((n, n)), 1) > 0, -np.inf, 0.0).astype(np.float32)
        else:
            hidden = rng.uniform(size=shape) < 0.35
            hidden[..., 0] = False  # every query keeps a key
            if kind == "mask":
                values[name] = hidden.astype(np.float32)
            else:
                values[name] = np.where(hidden, -np.inf, rng.normal(size=shape)).astype(np.float32)
    return values


def call_value(spec, tensors: dict[str, torch.Tensor]):
    if isinstance(spec, list):
        return tuple(call_value(s, tensors) for s in spec)
    if isinstance(spec, dict) and "input" in spec:
        return tensors[spec["input"]]
    if isinstance(spec, dict) and "mask" in spec:
        return tensors[spec["mask"]] > 0.5
    return spec


def flattened(result) -> list[torch.Tensor]:
    """The tensors of a module's result, in order, None skipped."""
    if result is None:
        return []
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for item in result for t in flattened(item)]


def generate(name: str) -> dict[str, np.ndarray]:
    case = CASES[name]
    rng = seeded(name)
    torch.manual_seed(0)
    module = build(case).double()
    init = initial_state(module, rng)
    module.load_state_dict({k: torch.from_numpy(v.astype(np.float64)) for k, v in init.items()})
    module.train(not case.get("eval", False))
    inputs = input_values(case, rng)
    tensors = {k: torch.from_numpy(v.astype(np.float64)) for k, v in inputs.items()}
    call = case["call"]
    args = [call_value(a, tensors) for a in call.get("args", [])]
    kwargs = {k: call_value(v, tensors) for k, v in call.get("kwargs", {}).items()}
    outputs = flattened(module(*args, **kwargs))
    weights = [rng.normal(size=tuple(out.shape)).astype(np.float32) for out in outputs]
    loss = sum((out * torch.from_numpy(w.astype(np.float64))).sum() for out, w in zip(outputs, weights, strict=True))
    loss.backward()
    meta = {key: case[key] for key in case if key != "inputs"}
    meta |= {"inputs": case["inputs"], "torch": torch.__version__.split("+")[0]}
    arrays = {f"{name}/meta": np.array(json.dumps(meta, sort_keys=True))}
    arrays |= {f"{name}/init/{k}": v for k, v in init.items()}
    arrays |= {f"{name}/input/{k}": v for k, v in inputs.items()}
    for index, (out, w) in enumerate(zip(outputs, weights, strict=True)):
        arrays[f"{name}/weight/{index}"] = w
        arrays[f"{name}/output/{index}"] = out.detach().numpy()
    for pname, param in module.named_parameters():
        arrays[f"{name}/grad/{pname}"] = param.grad.numpy()
    arrays[f"{name}/loss"] = np.array(loss.item())
    return arrays


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """np.savez_compressed's format with a fixed date on every member (the same bytes every run)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    names = argv or list(CASES)
    arrays = {}
    for name in names:
        arrays |= generate(name)
    PATH.parent.mkdir(parents=True, exist_ok=True)
    PATH.write_bytes(npz_bytes(arrays))
    print(f"{PATH.name}: {len(names)} cases, {PATH.stat().st_size} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
