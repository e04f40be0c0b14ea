"""Write tests/reference/conv_pool_attention.npz: PyTorch's values and gradients of the
convolutions, pools and masked attention of tests/test_conv_torch.py.

    /tmp/torch311/bin/python scripts/make_torch_conv_references.py

Imports only torch and numpy (never meganeura). Deterministic: the inputs come from a seeded
numpy generator, torch runs on the CPU in float64 with one thread, and the zip members carry a
fixed date (`make_torch_references.npz_bytes`' form), so running it again rewrites the same bytes.

Each case calls one torch.nn.functional function on its inputs with its keyword arguments and
stores, by name:

    <case>/meta          a JSON string: {"function", "kwargs", "inputs": [names in call order],
                         "grads": [the inputs differentiated]}
    <case>/in/<name>     each input (float64; an attention mask given as bool stays bool)
    <case>/out           the function's output
    <case>/r             a random cotangent of the output's shape
    <case>/grad/<name>   d Σ(out · r) / d input, for each differentiated input
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "reference" / "conv_pool_attention.npz"

# (case, function, {input: shape}, kwargs, differentiated inputs); "w"/"b" are weight and bias.
CASES = [
    ("conv2d_groups_dilation", "conv2d", {"x": (2, 4, 9, 8), "w": (6, 2, 3, 2), "b": (6,)},
     {"stride": [1, 2], "padding": [2, 1], "dilation": [2, 1], "groups": 2}, ["x", "w", "b"]),
    ("conv2d_depthwise", "conv2d", {"x": (2, 3, 7, 6), "w": (3, 1, 3, 3), "b": (3,)},
     {"stride": 2, "padding": 1, "groups": 3}, ["x", "w", "b"]),
    ("conv2d_depthwise_multiplier", "conv2d", {"x": (1, 3, 6, 7), "w": (6, 1, 3, 3)},
     {"padding": [1, 2], "dilation": 2, "groups": 3}, ["x", "w"]),
    ("conv2d_same_even", "conv2d", {"x": (2, 2, 7, 6), "w": (3, 2, 4, 2), "b": (3,)},
     {"padding": "same"}, ["x", "w", "b"]),
    ("conv2d_same_dilated", "conv2d", {"x": (1, 4, 6, 7), "w": (4, 2, 3, 2)},
     {"padding": "same", "dilation": [2, 3], "groups": 2}, ["x", "w"]),
    ("conv2d_stride2_dilation2", "conv2d", {"x": (2, 3, 11, 10), "w": (4, 3, 3, 3)},
     {"stride": 2, "padding": 2, "dilation": 2}, ["x", "w"]),
    ("conv2d_stride3_dilation2", "conv2d", {"x": (1, 2, 12, 11), "w": (3, 2, 3, 3)},
     {"stride": 3, "padding": 1, "dilation": 2}, ["x", "w"]),
    ("conv1d_groups", "conv1d", {"x": (2, 4, 11), "w": (6, 2, 3), "b": (6,)},
     {"stride": 2, "padding": 1, "dilation": 2, "groups": 2}, ["x", "w", "b"]),
    ("conv1d_same", "conv1d", {"x": (2, 3, 9), "w": (2, 3, 4)}, {"padding": "same"}, ["x", "w"]),
    ("conv_transpose2d", "conv_transpose2d", {"x": (2, 4, 5, 4), "w": (4, 3, 3, 2), "b": (3,)},
     {"stride": [2, 1], "padding": [1, 0], "output_padding": [1, 0], "dilation": [1, 2]}, ["x", "w", "b"]),
    ("conv_transpose2d_groups", "conv_transpose2d", {"x": (2, 4, 4, 5), "w": (4, 2, 3, 3), "b": (4,)},
     {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}, ["x", "w", "b"]),
    ("conv_transpose2d_depthwise", "conv_transpose2d", {"x": (1, 3, 4, 4), "w": (3, 1, 2, 2)},
     {"stride": 2, "groups": 3}, ["x", "w"]),
    ("conv_transpose1d", "conv_transpose1d", {"x": (2, 3, 6), "w": (3, 2, 4), "b": (2,)},
     {"stride": 3, "padding": 1, "output_padding": 2}, ["x", "w", "b"]),
    ("max_pool2d_ceil_dilation", "max_pool2d", {"x": (2, 3, 9, 8)},
     {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2, "ceil_mode": True}, ["x"]),
    ("max_pool2d_ceil", "max_pool2d", {"x": (2, 2, 7, 6)},
     {"kernel_size": [3, 2], "stride": 2, "ceil_mode": True}, ["x"]),
    ("avg_pool2d_ceil_exclude", "avg_pool2d", {"x": (2, 3, 8, 7)},
     {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True, "count_include_pad": False}, ["x"]),
    ("avg_pool2d_ceil_include", "avg_pool2d", {"x": (2, 3, 8, 7)},
     {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, ["x"]),
    ("avg_pool2d_divisor", "avg_pool2d", {"x": (1, 2, 7, 5)},
     {"kernel_size": 2, "stride": 1, "padding": 1, "divisor_override": 3}, ["x"]),
    ("max_pool1d", "max_pool1d", {"x": (2, 3, 11)},
     {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2, "ceil_mode": True}, ["x"]),
    ("avg_pool1d", "avg_pool1d", {"x": (2, 3, 10)},
     {"kernel_size": 4, "stride": 3, "padding": 2, "ceil_mode": True, "count_include_pad": False}, ["x"]),
    ("adaptive_avg_pool2d", "adaptive_avg_pool2d", {"x": (2, 3, 7, 5)}, {"output_size": [3, 4]}, ["x"]),
    ("adaptive_avg_pool2d_up", "adaptive_avg_pool2d", {"x": (1, 2, 3, 2)}, {"output_size": [5, None]}, ["x"]),
    ("adaptive_max_pool2d", "adaptive_max_pool2d", {"x": (2, 3, 7, 5)}, {"output_size": [3, 4]}, ["x"]),
    ("adaptive_max_pool2d_up", "adaptive_max_pool2d", {"x": (1, 2, 3, 2)}, {"output_size": [4, 3]}, ["x"]),
    ("adaptive_avg_pool1d", "adaptive_avg_pool1d", {"x": (2, 3, 10)}, {"output_size": 4}, ["x"]),
    ("adaptive_max_pool1d", "adaptive_max_pool1d", {"x": (2, 3, 10)}, {"output_size": 4}, ["x"]),
    ("sdpa_bool_mask", "scaled_dot_product_attention",
     {"query": (2, 4, 5, 8), "key": (2, 2, 6, 8), "value": (2, 2, 6, 8), "attn_mask": (5, 6)},
     {"enable_gqa": True}, ["query", "key", "value"]),
    ("sdpa_float_mask", "scaled_dot_product_attention",
     {"query": (2, 2, 5, 4), "key": (2, 2, 6, 4), "value": (2, 2, 6, 4), "attn_mask": (2, 1, 5, 6)},
     {"scale": 0.3}, ["query", "key", "value", "attn_mask"]),
    ("sdpa_bias", "scaled_dot_product_attention",
     {"query": (1, 3, 4, 4), "key": (1, 3, 7, 4), "value": (1, 3, 7, 4), "attn_mask": (4, 7)},
     {}, ["query", "key", "value", "attn_mask"]),
]  # fmt: skip


def case_inputs(case: str, shapes: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Normal inputs; the masks of the attention cases hide keys, and every key of some rows."""
    inputs = {name: rng.normal(size=shape) for name, shape in shapes.items()}
    if case == "sdpa_bool_mask":  # True takes part; row 1 takes no key (torch gives zeros there)
        keep = rng.random(shapes["attn_mask"]) < 0.6
        keep[:, 0] = True
        keep[1] = False
        inputs["attn_mask"] = keep
    if case == "sdpa_float_mask":  # −inf hides a key; batch 1's row 3 hides them all
        mask = rng.normal(size=shapes["attn_mask"])
        mask[rng.random(mask.shape) < 0.3] = -np.inf
        mask[..., 0] = rng.normal(size=mask.shape[:-1])
        mask[1, 0, 3] = -np.inf
        inputs["attn_mask"] = mask
    return inputs


def case_arrays(case: str, function: str, shapes: dict, kwargs: dict, grads: list[str], seed: int) -> dict:
    rng = np.random.default_rng(seed)
    inputs = case_inputs(case, shapes, rng)
    tensors = {name: torch.tensor(value, requires_grad=name in grads) for name, value in inputs.items()}
    call = {key: tuple(value) if isinstance(value, list) else value for key, value in kwargs.items()}
    out = getattr(F, function)(*tensors.values(), **call)
    r = rng.normal(size=tuple(out.shape))
    (out * torch.tensor(r)).sum().backward()
    meta = {"function": function, "kwargs": kwargs, "inputs": list(inputs), "grads": grads}
    arrays = {f"{case}/meta": np.array(json.dumps(meta, sort_keys=True))}
    arrays.update({f"{case}/in/{name}": value for name, value in inputs.items()})
    arrays[f"{case}/out"] = out.detach().numpy()
    arrays[f"{case}/r"] = r
    arrays.update({f"{case}/grad/{name}": tensors[name].grad.numpy() for name in grads})
    return arrays


def generate() -> dict[str, np.ndarray]:
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    arrays = {"torch_version": np.array(torch.__version__)}
    for seed, (case, function, shapes, kwargs, grads) in enumerate(CASES):
        arrays.update(case_arrays(case, function, shapes, kwargs, grads, seed))
    return arrays


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """np.savez_compressed's format with a fixed date on every member (bytes that depend only on the arrays)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, member.getvalue())
    return buffer.getvalue()


if __name__ == "__main__":
    arrays = generate()
    REFERENCE.write_bytes(npz_bytes(arrays))
    print(f"{REFERENCE.name}: {len(CASES)} cases, {REFERENCE.stat().st_size} bytes (torch {torch.__version__})")
