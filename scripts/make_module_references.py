"""Write the PyTorch references of tests/test_init.py, tests/test_modules.py and tests/test_freeze.py:
tests/reference/nn/modules.json (formulas, printing, module trees) and
tests/reference/nn/modules.npz (values), in a folder of their own: tests/reference/*.npz are the
training scenarios of tests/test_torch_reference.py.

    /tmp/torch311/bin/python scripts/make_module_references.py

Like scripts/make_torch_references.py, this imports only torch and numpy, runs torch on the CPU
in float64 with one thread, takes every input from seeded numpy generators, and writes the npz
with fixed zip dates, so running it again rewrites the same bytes.

modules.json holds:
    gains       [nonlinearity, param, torch.nn.init.calculate_gain(nonlinearity, param)]
    fans        [shape, fan_in, fan_out] from torch.nn.init._calculate_fan_in_and_fan_out
    draws       [call, shape, distribution, a, b]: the arguments an init function passed to
                Tensor.uniform_ (a, b = low, high) or Tensor.normal_ (mean, std), recorded by
                wrapping those methods: the bounds and scales torch computes, exactly
    defaults    [constructor, [[shape, distribution, a, b], ...]]: the same for the draws a
                module's constructor makes (its reset_parameters)
    reprs       [constructor, repr(module)]
    tree        the names a model with a shared submodule and tied weights gives to
                named_modules, named_parameters, state_dict, … (see `module_tree`)
    loss_cases, activation_cases, layer_cases
                the constructors (and inputs' names or shapes) of the forward cases below
modules.npz holds, by scenario prefix:
    freeze/     a 2-layer MLP whose first layer is frozen (requires_grad_(False)), 4 AdamW steps
                with weight decay over model.parameters(): init/<name>, x<k>, y<k>, loss [4],
                final/<name>
    embedding/  nn.Embedding(padding_idx=2) under a linear head, 3 SGD steps: init/, ids<k>, y<k>,
                loss, final/
    batchnorm1d/ nn.BatchNorm1d on [N, C] and [N, C, L] in training, 2 SGD steps (MSE): init/,
                x<k>, target<k>, loss, final/ (parameters and running statistics)
    loss/<case>/ input, target, output of each loss module case (`LOSS_CASES`)
    act/<case>/  input, output of each activation module case (`ACTIVATION_CASES`)
    layer/<case>/ input, parameters, output of each conv/pool/upsample case (`LAYER_CASES`)
"""

from __future__ import annotations

import json
import math
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reference_npz import write_npz  # noqa: E402  (a sibling: numpy and the standard library only)

REFERENCE_DIR = Path(__file__).resolve().parent.parent / "tests" / "reference" / "nn"
torch.set_num_threads(1)

# ---------------------------------------------------------------------------------------------
# nn.init: gains, fans, and the bounds torch draws with


GAINS = [
    ("linear", None), ("conv1d", None), ("conv2d", None), ("conv_transpose2d", None), ("sigmoid", None),
    ("tanh", None), ("relu", None), ("leaky_relu", None), ("leaky_relu", 0.2), ("leaky_relu", 3), ("selu", None),
    ("leaky_relu", math.sqrt(5)),
]  # fmt: skip
FAN_SHAPES = [(3, 5), (7, 2), (6, 4, 3), (4, 3, 5, 2), (5, 2, 3, 2, 2), (1, 1)]
INIT_CALLS = [
    ("uniform_", (4, 5), {"a": -0.3, "b": 0.7}),
    ("normal_", (4, 5), {"mean": 0.5, "std": 2.0}),
    ("xavier_uniform_", (7, 3), {}),
    ("xavier_uniform_", (6, 4, 3, 2), {"gain": 2.5}),
    ("xavier_normal_", (7, 3), {}),
    ("xavier_normal_", (6, 4, 3), {"gain": 0.5}),
    ("kaiming_uniform_", (7, 3), {}),
    ("kaiming_uniform_", (6, 4, 3, 2), {"a": math.sqrt(5)}),
    ("kaiming_uniform_", (6, 4, 3), {"mode": "fan_out", "nonlinearity": "relu"}),
    ("kaiming_uniform_", (5, 8), {"a": 0.1, "nonlinearity": "leaky_relu"}),
    ("kaiming_normal_", (7, 3), {}),
    ("kaiming_normal_", (6, 4, 3, 2), {"mode": "fan_out", "nonlinearity": "relu"}),
    ("kaiming_normal_", (5, 8), {"nonlinearity": "tanh"}),
]
MODULE_DEFAULTS = [
    "nn.Linear(5, 3)",
    "nn.Conv2d(4, 6, 3)",
    "nn.Conv1d(4, 6, 3)",
    "nn.Conv1d(4, 6, 5, groups=2)",
    "nn.ConvTranspose1d(4, 6, 3)",
    "nn.ConvTranspose1d(4, 6, 3, groups=2)",
    "nn.ConvTranspose2d(4, 6, (3, 2))",
    "nn.ConvTranspose2d(6, 9, 3, groups=3, bias=False)",
    "nn.Embedding(7, 3)",
]


def recorded_draws(run) -> list[list]:
    """The (shape, distribution, a, b) of every Tensor.uniform_/normal_ call `run()` makes."""
    calls: list[list] = []
    uniform, normal = torch.Tensor.uniform_, torch.Tensor.normal_

    def record_uniform(tensor, a=0.0, b=1.0, generator=None):
        calls.append([list(tensor.shape), "uniform", float(a), float(b)])
        return uniform(tensor, a, b, generator=generator)

    def record_normal(tensor, mean=0.0, std=1.0, generator=None):
        calls.append([list(tensor.shape), "normal", float(mean), float(std)])
        return normal(tensor, mean, std, generator=generator)

    torch.Tensor.uniform_, torch.Tensor.normal_ = record_uniform, record_normal
    try:
        run()
    finally:
        torch.Tensor.uniform_, torch.Tensor.normal_ = uniform, normal
    return calls


def init_references() -> dict:
    draws = []
    for name, shape, kwargs in INIT_CALLS:
        (call,) = recorded_draws(lambda n=name, s=shape, k=kwargs: getattr(nn.init, n)(torch.empty(s), **k))
        draws.append([name, list(shape), kwargs, *call[1:]])
    return {
        "gains": [[n, p, nn.init.calculate_gain(n, p)] for n, p in GAINS],
        "fans": [[list(s), *nn.init._calculate_fan_in_and_fan_out(torch.empty(s))] for s in FAN_SHAPES],
        "draws": draws,
        "defaults": [[expr, recorded_draws(lambda e=expr: eval(e))] for expr in MODULE_DEFAULTS],
    }


# ---------------------------------------------------------------------------------------------
# Printing and module trees

REPRS = [
    "nn.Identity()", "nn.SiLU()", "nn.SiLU(inplace=True)", "nn.Mish(True)", "nn.Hardswish(True)", "nn.Hardsigmoid()",
    "nn.LeakyReLU()", "nn.LeakyReLU(0.2, True)", "nn.ELU()", "nn.ELU(0.5, True)", "nn.Hardtanh()",
    "nn.Hardtanh(-2, 3, True)", "nn.ReLU6()", "nn.ReLU6(True)", "nn.Softplus()", "nn.Softplus(2, 10)",
    "nn.Softmax()", "nn.Softmax(1)", "nn.LogSoftmax(-1)", "nn.Unflatten(1, (2, 3))", "nn.Unflatten(-1, [2, -1])",
    "nn.ReLU()", "nn.ReLU(inplace=True)", "nn.Sigmoid()", "nn.Tanh()", "nn.GELU()", "nn.Flatten()",
    "nn.BatchNorm1d(4)", "nn.BatchNorm2d(3, momentum=None, affine=False)", "nn.BatchNorm1d(5, bias=False)",
    "nn.GroupNorm(2, 4)", "nn.LayerNorm(4, bias=False)", "nn.LayerNorm([2, 3])", "nn.RMSNorm(4)",
    "nn.Embedding(5, 3)", "nn.Embedding(5, 3, padding_idx=-1)", "nn.Embedding(5, 3, sparse=True)",
    "nn.Linear(3, 2)", "nn.Linear(3, 2, bias=False)",
    "nn.MaxPool1d(3)", "nn.MaxPool1d(3, 2, 1)", "nn.AvgPool1d(3)", "nn.AvgPool1d(3, 2, 1, True, False)",
    "nn.AdaptiveAvgPool1d(4)", "nn.AdaptiveMaxPool2d((2, 3))", "nn.AdaptiveMaxPool2d(2, True)",
    "nn.MaxPool2d(2)", "nn.MaxPool2d(3, 2, 1)", "nn.AvgPool2d(3, 2, 1)", "nn.AdaptiveAvgPool2d(1)",
    "nn.Upsample(scale_factor=2)", "nn.Upsample(size=(4, 5), mode='bilinear', align_corners=True)",
    "nn.Upsample(scale_factor=(2, 3), mode='bilinear')",
    "nn.Conv1d(4, 6, 3)", "nn.Conv1d(4, 6, 3, 2, 1, 2, 2, False)", "nn.Conv1d(4, 6, 3, padding='same')",
    "nn.Conv1d(4, 6, 3, padding=1, padding_mode='reflect')",
    "nn.ConvTranspose1d(4, 6, 3, 2, 1, 1, 2, False, 2)", "nn.ConvTranspose2d(4, 6, 3)",
    "nn.ConvTranspose2d(4, 6, (3, 2), stride=2, output_padding=1)",
    "nn.CrossEntropyLoss()", "nn.CrossEntropyLoss(label_smoothing=0.1)", "nn.NLLLoss()", "nn.MSELoss()",
    "nn.L1Loss()", "nn.SmoothL1Loss(beta=0.5)", "nn.HuberLoss(delta=2.0)", "nn.BCELoss()", "nn.BCEWithLogitsLoss()",
    "nn.KLDivLoss()",
    "nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2)])", "nn.ModuleList()",
    "nn.ModuleList([nn.ReLU(), nn.ReLU(), nn.ReLU()])",
    "nn.ModuleDict({'x': nn.ReLU(), 'y': nn.Linear(1, 2)})",
    "nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 1)))", "nn.Sequential()",
    "nn.Sequential(OrderedDict(a=nn.ReLU(), b=nn.Tanh()))",
    "nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))[1:]",
    "nn.Sequential(nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]), nn.ReLU())",
]  # fmt: skip


class Tied(nn.Module):
    """A shared submodule (blocks.0 is shared), tied weights (head.weight is wte.weight), buffers,
    and a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(7, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.shared = self.blocks[0]
        self.norm = nn.Sequential(nn.BatchNorm1d(4), nn.Identity())
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.wte.weight
        self.register_buffer("table", torch.zeros(3), persistent=False)


def module_tree() -> dict:
    model = Tied()
    visited: list[str] = []
    model.apply(lambda m: visited.append(type(m).__name__))
    return {
        "named_modules": [name for name, _ in model.named_modules()],
        "named_modules_all": [name for name, _ in model.named_modules(remove_duplicate=False)],
        "named_modules_prefix": [name for name, _ in model.named_modules(prefix="m")],
        "named_children": [name for name, _ in model.named_children()],
        "named_parameters": [name for name, _ in model.named_parameters()],
        "named_parameters_all": [name for name, _ in model.named_parameters(remove_duplicate=False)],
        "named_parameters_prefix": [name for name, _ in model.blocks.named_parameters(prefix="blocks")],
        "named_parameters_local": [name for name, _ in model.head.named_parameters(recurse=False)],
        "named_buffers": [name for name, _ in model.named_buffers()],
        "state_dict": list(model.state_dict()),
        "parameter_count": sum(p.numel() for p in model.parameters()),
        "apply_order": visited,
        "repr": repr(model),
    }


# ---------------------------------------------------------------------------------------------
# Training scenarios


def tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.tensor(value, dtype=torch.float64) for name, value in arrays.items()}


def train(model, init, feeds, optimizer, loss_fn) -> tuple[list[float], dict[str, np.ndarray]]:
    """Load `init`, take one step per feed (float64); the losses and the final state_dict."""
    model.double()
    model.load_state_dict(tensors(init))
    losses = []
    for feed in feeds:
        optimizer.zero_grad()
        loss = loss_fn(model, feed)
        losses.append(loss.item())
        loss.backward()
        optimizer.step()
    return losses, {name: value.detach().numpy() for name, value in model.state_dict().items()}


def scenario_arrays(prefix, init, feeds, losses, final) -> dict[str, np.ndarray]:
    arrays = {f"{prefix}/init/{name}": value for name, value in init.items()}
    for step, feed in enumerate(feeds):
        arrays |= {f"{prefix}/{key}{step}": value for key, value in feed.items()}
    arrays[f"{prefix}/loss"] = np.array(losses)
    arrays |= {f"{prefix}/final/{name}": value for name, value in final.items()}
    return arrays


def freeze_scenario() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4001)
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(6, 10), act=nn.Tanh(), fc2=nn.Linear(10, 4)))
    init = {name: rng.normal(0, 0.5, p.shape).astype(np.float32) for name, p in model.state_dict().items()}
    feeds = [
        {"x": rng.normal(size=(8, 6)).astype(np.float32), "y": rng.integers(0, 4, 8).astype(np.int32)} for _ in range(4)
    ]
    model.fc1.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)

    def loss_fn(m, feed):
        return F.cross_entropy(m(torch.tensor(feed["x"], dtype=torch.float64)), torch.tensor(feed["y"]).long())

    losses, final = train(model, init, feeds, optimizer, loss_fn)
    return scenario_arrays("freeze", init, feeds, losses, final)


class EmbeddingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 5, padding_idx=2)
        self.head = nn.Linear(5, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def embedding_scenario() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4002)
    model = EmbeddingNet()
    init = {name: rng.normal(0, 0.5, p.shape).astype(np.float32) for name, p in model.state_dict().items()}
    init["emb.weight"][2] = 0.0  # the padding row, as nn.Embedding initialises it
    feeds = [
        {"ids": rng.integers(0, 7, (4, 6)).astype(np.int32), "y": rng.integers(0, 3, 4).astype(np.int32)}
        for _ in range(3)
    ]
    for feed in feeds:
        feed["ids"][:, -2:] = 2  # padding at the end of every row, as a padded batch has
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)

    def loss_fn(m, feed):
        return F.cross_entropy(m(torch.tensor(feed["ids"]).long()), torch.tensor(feed["y"]).long())

    losses, final = train(model, init, feeds, optimizer, loss_fn)
    return scenario_arrays("embedding", init, feeds, losses, final)


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.bn = nn.BatchNorm1d(5)
        self.seq_bn = nn.BatchNorm1d(3, momentum=None)

    def forward(self, x, seq):
        return self.bn(self.fc(x)), self.seq_bn(seq)


def batchnorm_scenario() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4003)
    model = BatchNormNet()
    init = {
        name: (rng.normal(0, 0.5, p.shape) + (1.0 if "var" in name else 0.0)).astype(np.float32)
        for name, p in model.state_dict().items()
        if "num_batches" not in name
    }
    init |= {"bn.num_batches_tracked": np.array(0), "seq_bn.num_batches_tracked": np.array(0)}
    feeds = [
        {
            "x": rng.normal(size=(8, 6)).astype(np.float32),
            "seq": rng.normal(1.0, 2.0, size=(4, 3, 7)).astype(np.float32),
            "target": rng.normal(size=(8, 5)).astype(np.float32),
        }
        for _ in range(2)
    ]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def loss_fn(m, feed):
        out, seq = m(*(torch.tensor(feed[k], dtype=torch.float64) for k in ("x", "seq")))
        return F.mse_loss(out, torch.tensor(feed["target"], dtype=torch.float64)) + (seq * seq).mean()

    model.double()
    model.load_state_dict({k: torch.tensor(v) if v.dtype.kind == "i" else torch.tensor(v, dtype=torch.float64)
                           for k, v in init.items()})  # fmt: skip
    losses, final = train(model, init, feeds, optimizer, loss_fn)
    return scenario_arrays("batchnorm1d", init, feeds, losses, final)


# ---------------------------------------------------------------------------------------------
# Forward values of loss, activation and layer modules

LOSS_CASES = {
    "ce": ("nn.CrossEntropyLoss()", "logits", "labels"),
    "ce_sum": ("nn.CrossEntropyLoss(reduction='sum')", "logits", "labels"),
    "ce_none": ("nn.CrossEntropyLoss(reduction='none')", "logits", "labels"),
    "ce_weight": ("nn.CrossEntropyLoss(weight=torch.tensor([0.5, 2.0, 1.0, 0.25]))", "logits", "labels"),
    "ce_ignore": ("nn.CrossEntropyLoss(ignore_index=1)", "logits", "labels"),
    "ce_smooth": ("nn.CrossEntropyLoss(label_smoothing=0.2)", "logits", "labels"),
    "nll": ("nn.NLLLoss()", "log_probs", "labels"),
    "nll_sum": ("nn.NLLLoss(reduction='sum')", "log_probs", "labels"),
    "nll_weight": ("nn.NLLLoss(weight=torch.tensor([0.5, 2.0, 1.0, 0.25]))", "log_probs", "labels"),
    "mse": ("nn.MSELoss()", "values", "targets"),
    "mse_none": ("nn.MSELoss(reduction='none')", "values", "targets"),
    "l1": ("nn.L1Loss()", "values", "targets"),
    "smooth_l1": ("nn.SmoothL1Loss(beta=0.5)", "values", "targets"),
    "huber": ("nn.HuberLoss(delta=0.7, reduction='sum')", "values", "targets"),
    "bce": ("nn.BCELoss()", "probs", "binary"),
    "bce_weight": ("nn.BCELoss(weight=torch.tensor([0.5, 2.0, 1.0, 0.25]))", "probs", "binary"),
    "bce_logits": ("nn.BCEWithLogitsLoss(pos_weight=torch.tensor([0.5, 2.0, 1.0, 3.0]))", "logits", "binary"),
    "kl": ("nn.KLDivLoss(reduction='batchmean')", "log_probs", "probs_target"),
    "kl_log": ("nn.KLDivLoss(reduction='sum', log_target=True)", "log_probs", "log_probs_target"),
}

ACTIVATION_CASES = {
    "silu": "nn.SiLU()", "mish": "nn.Mish()", "hardswish": "nn.Hardswish()", "hardsigmoid": "nn.Hardsigmoid()",
    "leaky_relu": "nn.LeakyReLU(0.2)", "elu": "nn.ELU(0.5)", "hardtanh": "nn.Hardtanh(-0.5, 0.75)",
    "relu6": "nn.ReLU6()", "softplus": "nn.Softplus(2.0, 1.5)", "softmax": "nn.Softmax(dim=1)",
    "log_softmax": "nn.LogSoftmax(dim=0)", "identity": "nn.Identity()", "unflatten": "nn.Unflatten(1, (1, 5))",
    "relu": "nn.ReLU()",
}  # fmt: skip

LAYER_CASES = {
    "conv1d": ("nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2)", (2, 4, 11)),
    "conv1d_same_reflect": ("nn.Conv1d(3, 2, 3, padding='same', padding_mode='reflect')", (2, 3, 7)),
    "conv_transpose1d": ("nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)", (2, 4, 5)),
    "conv_transpose2d": ("nn.ConvTranspose2d(4, 6, (3, 2), stride=2, padding=1, output_padding=1)", (2, 4, 3, 4)),
    "conv_transpose2d_dilated": ("nn.ConvTranspose2d(2, 3, 3, dilation=2, bias=False)", (1, 2, 4, 3)),
    "max_pool1d": ("nn.MaxPool1d(3, 2, 1)", (2, 3, 9)),
    "avg_pool1d": ("nn.AvgPool1d(3, 2, 1)", (2, 3, 9)),
    "adaptive_avg_pool1d": ("nn.AdaptiveAvgPool1d(4)", (2, 3, 10)),
    "adaptive_max_pool2d": ("nn.AdaptiveMaxPool2d((2, 3))", (2, 3, 7, 8)),
    "upsample_nearest": ("nn.Upsample(scale_factor=2)", (1, 2, 3, 4)),
    "upsample_bilinear_corners": ("nn.Upsample(size=(5, 7), mode='bilinear', align_corners=True)", (1, 2, 3, 4)),
    "upsample_bilinear": ("nn.Upsample(scale_factor=2, mode='bilinear')", (1, 2, 3, 4)),
}


def loss_inputs(rng) -> dict[str, np.ndarray]:
    logits = rng.normal(0, 2.0, (6, 4))
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    target_logits = rng.normal(0, 1.0, (6, 4))
    log_probs_target = target_logits - np.log(np.exp(target_logits).sum(1, keepdims=True))
    return {
        "logits": logits, "log_probs": log_probs, "labels": rng.integers(0, 4, 6).astype(np.int32),
        "values": rng.normal(0, 1.5, (6, 4)), "targets": rng.normal(0, 1.5, (6, 4)),
        "probs": 1 / (1 + np.exp(-logits)), "binary": (rng.random((6, 4)) < 0.5).astype(np.float64),
        "probs_target": np.exp(log_probs_target), "log_probs_target": log_probs_target,
    }  # fmt: skip


def as_torch(value: np.ndarray) -> torch.Tensor:
    return torch.tensor(value).long() if value.dtype.kind == "i" else torch.tensor(value, dtype=torch.float64)


def forward_references() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4004)
    arrays: dict[str, np.ndarray] = {}
    inputs = loss_inputs(rng)
    for case, (expr, input_name, target_name) in LOSS_CASES.items():
        module = eval(expr).double()
        out = module(as_torch(inputs[input_name]), as_torch(inputs[target_name]))
        arrays |= {f"loss/{case}/input": inputs[input_name], f"loss/{case}/target": inputs[target_name]}
        arrays[f"loss/{case}/output"] = out.detach().numpy()
    # Activation inputs include each function's kinks (0, ±3, hardtanh's bounds) and large values.
    x = np.concatenate([rng.normal(0, 3.0, 28), [0.0, 3.0, -3.0, 6.0, -0.5, 0.75, 25.0, -25.0]]).reshape(4, 9)
    for case, expr in ACTIVATION_CASES.items():
        shaped = x.reshape(4, 9)[:, :5] if case == "unflatten" else x
        arrays[f"act/{case}/input"] = shaped
        arrays[f"act/{case}/output"] = eval(expr)(torch.tensor(shaped)).numpy()
    for case, (expr, shape) in LAYER_CASES.items():
        torch.manual_seed(0)
        module = eval(expr).double()
        layer_input = rng.normal(size=shape)
        arrays[f"layer/{case}/input"] = layer_input
        for name, value in module.state_dict().items():
            arrays[f"layer/{case}/{name}"] = value.numpy()
        arrays[f"layer/{case}/output"] = module(torch.tensor(layer_input)).detach().numpy()
    out = nn.ConvTranspose1d(4, 6, 3, stride=2).double()
    arrays |= {f"layer/conv_transpose1d_output_size/{n}": v.detach().numpy() for n, v in out.state_dict().items()}
    arrays["layer/conv_transpose1d_output_size/input"] = value = rng.normal(size=(2, 4, 5))
    arrays["layer/conv_transpose1d_output_size/output"] = out(torch.tensor(value), output_size=[12]).detach().numpy()
    return arrays


# ---------------------------------------------------------------------------------------------


def main() -> None:
    torch.manual_seed(0)
    references = init_references()
    references["reprs"] = [[expr, repr(eval(expr))] for expr in REPRS]
    references["tree"] = module_tree()
    references["loss_cases"] = {case: list(spec) for case, spec in LOSS_CASES.items()}
    references["activation_cases"] = ACTIVATION_CASES
    references["layer_cases"] = {case: [expr, list(shape)] for case, (expr, shape) in LAYER_CASES.items()}
    references["torch"] = torch.__version__.split("+")[0]
    REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
    (REFERENCE_DIR / "modules.json").write_text(json.dumps(references, indent=1, sort_keys=True) + "\n")
    arrays = freeze_scenario() | embedding_scenario() | batchnorm_scenario() | forward_references()
    write_npz(REFERENCE_DIR / "modules.npz", arrays)
    print(f"modules.json: {len(references['reprs'])} reprs; modules.npz: {len(arrays)} arrays")


if __name__ == "__main__":
    main(*sys.argv[1:])
