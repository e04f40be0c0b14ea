"""The torch.nn surface (meganeura/nn/): nn.Module's API and printing, the containers, tied
weights, the simple modules and mn.summary, against PyTorch (tests/reference/nn/modules.json and
modules.npz, written by scripts/make_module_references.py).

Forward values run the traced module on the numpy interpreter in float64 (no device), against
torch's float64 values. A module whose functional form another change adds (F.elu, F.conv1d,
F.interpolate, F.l1_loss, F.cross_entropy's weight…) is skipped here until that form exists:
its test then runs as written."""

from __future__ import annotations

import inspect
import json
import os
import re
import warnings
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter, interpreted_steps

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import compile_plan, trace_step
from meganeura.ir.interpret import interpret
from meganeura.pytorch_names import MissingName

HERE = os.path.dirname(__file__)
REFERENCES = json.load(open(os.path.join(HERE, "reference", "nn", "modules.json")))
ARRAYS = np.load(os.path.join(HERE, "reference", "nn", "modules.npz"))
NAMESPACE = {"nn": nn, "OrderedDict": OrderedDict, "torch": SimpleNamespace(tensor=np.array)}


def build(constructor: str):
    """A module from the constructor text the torch references were made with."""
    return eval(constructor, dict(NAMESPACE))


def arrays(prefix: str) -> dict[str, np.ndarray]:
    return {key[len(prefix) :]: ARRAYS[key] for key in ARRAYS.files if key.startswith(prefix)}


# ---------------------------------------------------------------------------------------------
# Printing and the module tree


@pytest.mark.parametrize("constructor, text", REFERENCES["reprs"], ids=[r[0] for r in REFERENCES["reprs"]])
def test_modules_print_as_pytorch_prints_them(constructor, text):
    assert repr(build(constructor)) == text


class Tied(nn.Module):
    """The reference's model: a shared submodule, tied weights, buffers, a non-persistent buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(7, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.shared = self.blocks[0]
        self.norm = nn.Sequential(nn.BatchNorm1d(4), nn.Identity())
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.wte.weight
        self.register_buffer("table", np.zeros(3), persistent=False)

    def forward(self, ids):
        h = self.norm(self.blocks[1](self.shared(self.wte(ids))))
        return self.head(h)


def test_the_module_tree_is_named_and_walked_as_in_pytorch():
    model, tree = Tied(), REFERENCES["tree"]
    visited = []
    assert model.apply(lambda m: visited.append(type(m).__name__)) is model
    assert visited == tree["apply_order"]
    assert [n for n, _ in model.named_modules()] == tree["named_modules"]
    assert [n for n, _ in model.named_modules(remove_duplicate=False)] == tree["named_modules_all"]
    assert [n for n, _ in model.named_modules(prefix="m")] == tree["named_modules_prefix"]
    assert [n for n, _ in model.named_children()] == tree["named_children"]
    assert [n for n, _ in model.named_parameters()] == tree["named_parameters"]
    assert [n for n, _ in model.named_parameters(remove_duplicate=False)] == tree["named_parameters_all"]
    assert [n for n, _ in model.blocks.named_parameters(prefix="blocks")] == tree["named_parameters_prefix"]
    assert [n for n, _ in model.head.named_parameters(recurse=False)] == tree["named_parameters_local"]
    assert [n for n, _ in model.named_buffers()] == tree["named_buffers"]
    assert list(model.state_dict()) == tree["state_dict"]
    assert sum(p.numel() for p in model.parameters()) == tree["parameter_count"]
    assert repr(model) == tree["repr"]
    assert list(model.children()) == [model.wte, model.blocks, model.shared, model.norm, model.head]
    assert next(model.parameters()) is model.wte.weight  # an iterator, as torch's
    assert len(list(model.modules())) == len(tree["named_modules"])


def test_members_register_and_are_found_by_dotted_name_with_pytorchs_errors():
    model = Tied()
    assert model.get_submodule("") is model and model.get_submodule("norm.0") is model.norm[0]
    assert model.get_parameter("blocks.1.bias") is model.blocks[1].bias
    assert model.get_buffer("norm.0.running_var") is model.norm[0].running_var
    with pytest.raises(AttributeError, match="ModuleList has no attribute `7`"):
        model.get_submodule("blocks.7")
    with pytest.raises(AttributeError, match="`weight` is not an nn.Module"):
        model.get_submodule("head.weight")
    with pytest.raises(AttributeError, match="`running_mean` is not an nn.Parameter"):
        model.get_parameter("norm.0.running_mean")
    with pytest.raises(AttributeError, match="`weight` is not a buffer"):
        model.get_buffer("head.weight")
    extra = nn.Module()
    extra.add_module("fc", nn.Linear(2, 3))
    extra.register_module("act", nn.ReLU())
    extra.register_parameter("scale", nn.Parameter(np.ones(3)))
    extra.register_parameter("unused", None)
    extra.register_buffer("count", np.zeros(()))
    assert [n for n, _ in extra.named_parameters()] == ["scale", "fc.weight", "fc.bias"]
    assert list(extra.state_dict()) == ["scale", "count", "fc.weight", "fc.bias"]
    for call, error, message in [
        (lambda: extra.add_module("scale", nn.ReLU()), KeyError, "attribute 'scale' already exists"),
        (lambda: extra.add_module("a.b", nn.ReLU()), KeyError, 'contain ".", got: a.b'),
        (lambda: extra.add_module("", nn.ReLU()), KeyError, "be empty string"),
        (lambda: extra.add_module(3, nn.ReLU()), TypeError, "module name should be a string. Got int"),
        (lambda: extra.add_module("x", 3), TypeError, "int is not a Module subclass"),
        (lambda: extra.register_parameter("w", np.ones(2)), TypeError, "cannot assign 'ndarray' object to parameter"),
        (lambda: extra.register_buffer("fc", np.ones(2)), KeyError, "attribute 'fc' already exists"),
    ]:
        with pytest.raises(error, match=re.escape(message)):
            call()
    del extra.fc
    assert [n for n, _ in extra.named_children()] == ["act"]
    assert extra.zero_grad() is None  # nothing to clear: each step computes its gradients afresh


def test_forward_hooks_see_and_may_replace_inputs_and_outputs():
    layer = nn.Linear(3, 2)
    seen = []
    pre = layer.register_forward_pre_hook(lambda module, args: (args[0] * 2.0,))
    post = layer.register_forward_hook(lambda module, args, output: seen.append(output.shape) or output + 1.0)
    x = np.array([[1.0, -2.0, 0.5]])
    expected = 2.0 * x @ layer.weight.numpy().T + layer.bias.numpy() + 1.0
    np.testing.assert_allclose(run_module(layer, {"x": x})["output"], expected)
    assert seen == [(1, 2)]
    pre.remove()
    with post:
        pass  # a handle is a context manager that removes its hook
    np.testing.assert_allclose(run_module(layer, {"x": x})["output"], x @ layer.weight.numpy().T + layer.bias.numpy())
    with pytest.raises(NotImplementedError, match="always_call"):
        layer.register_forward_hook(print, always_call=True)


# ---------------------------------------------------------------------------------------------
# Containers


def names(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_children()]


def test_sequential_indexes_slices_and_edits_as_pytorchs():
    a, b, c, d = nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2), nn.Tanh()
    seq = nn.Sequential(a, b, c)
    assert seq[0] is a and seq[-1] is c and len(seq) == 3 and list(seq) == [a, b, c]
    with pytest.raises(IndexError, match="index 3 is out of range"):
        seq[3]
    tail = seq[1:]
    assert isinstance(tail, nn.Sequential) and names(tail) == ["1", "2"] and list(tail) == [b, c]  # names kept
    seq[1] = d
    assert seq[1] is d
    del seq[0]
    assert names(seq) == ["0", "1"] and list(seq) == [d, c] and seq.get_submodule("1") is c
    seq.append(a).insert(0, b)
    assert list(seq) == [b, d, c, a] and names(seq) == ["0", "1", "2", "3"]
    assert seq.pop(1) is d and list(seq) == [b, c, a]
    seq.extend([d])
    assert list(seq + nn.Sequential(a)) == [b, c, a, d, a]
    assert list(nn.Sequential(a, b) * 2) == [a, b, a, b]
    named = nn.Sequential(OrderedDict(first=a, second=b))
    assert names(named) == ["first", "second"] and named[1] is b
    with pytest.raises(ValueError, match="add operator supports only objects of Sequential class"):
        seq + [a]


def test_a_compiled_sequential_takes_its_input_under_any_name():
    seq = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    x = np.array([[1.0, -2.0, 0.5]])
    expected = np.maximum(x @ seq[0].weight.numpy().T + seq[0].bias.numpy(), 0)
    np.testing.assert_allclose(run_module(seq, {"input": x}, positional=False)["output"], expected)
    np.testing.assert_allclose(run_module(seq, {"images": x}, positional=False)["output"], expected)


def test_module_list_and_dict_as_pytorchs():
    layers = [nn.Linear(2, 2) for _ in range(4)]
    listed = nn.ModuleList(layers[:2])
    listed += [layers[2]]
    listed.insert(1, layers[3])
    assert list(listed) == [layers[0], layers[3], layers[1], layers[2]] and names(listed) == ["0", "1", "2", "3"]
    assert list(listed[1:3]) == [layers[3], layers[1]] and names(listed[1:3]) == ["0", "1"]  # renumbered
    del listed[::2]
    assert list(listed) == [layers[3], layers[2]] and names(listed) == ["0", "1"]
    assert listed.pop(-1) is layers[2] and len(listed) == 1
    assert [n for n, _ in nn.ModuleList(layers).named_parameters()][:3] == ["0.weight", "0.bias", "1.weight"]
    mapped = nn.ModuleDict({"b": layers[0], "a": layers[1]})
    mapped.update([("c", layers[2])])
    mapped["d"] = layers[3]
    assert list(mapped) == ["b", "a", "c", "d"] and "c" in mapped and mapped["a"] is layers[1]
    assert list(mapped.keys()) == ["b", "a", "c", "d"] and list(mapped.values())[2] is layers[2]
    assert mapped.pop("a") is layers[1] and "a" not in mapped and [n for n, _ in mapped.items()] == ["b", "c", "d"]
    del mapped["b"]
    assert [n for n, _ in mapped.named_parameters()] == ["c.weight", "c.bias", "d.weight", "d.bias"]
    with pytest.raises(ValueError, match="has length 3; 2 is required"):
        mapped.update([("x", layers[0], 3)])


def test_parameter_list_and_dict_register_and_wrap_arrays():
    listed = nn.ParameterList([np.zeros((3, 4)), nn.Parameter(np.ones(2))])
    listed.append(np.full((2,), 0.5))
    assert all(isinstance(p, nn.Parameter) for p in listed) and len(listed) == 3
    assert [n for n, _ in listed.named_parameters()] == ["0", "1", "2"]
    assert repr(listed).startswith("ParameterList(\n    (0): Parameter containing: [float32 of size 3x4]\n")
    with pytest.raises(RuntimeError, match="ParameterList should not be called"):
        listed()
    mapped = nn.ParameterDict({"b": np.zeros(3), "a": np.zeros((2, 2))})  # a plain dict: sorted, as torch's
    assert list(mapped) == ["a", "b"] and [n for n, _ in mapped.named_parameters()] == ["a", "b"]
    ordered = nn.ParameterDict(OrderedDict(b=np.zeros(3), a=np.zeros(2)))
    assert list(ordered) == ["b", "a"] and ordered.get("z") is None and ordered.pop("b").shape == (3,)
    holder = nn.Module()
    holder.params = mapped
    assert list(holder.state_dict()) == ["params.a", "params.b"]


# ---------------------------------------------------------------------------------------------
# Tied weights


def test_a_tied_parameter_is_in_state_dict_under_both_names_and_loads_from_either():
    model = Tied()
    state = model.state_dict()
    assert state["head.weight"] is state["wte.weight"]  # one array under both names, as torch's one tensor
    table = np.arange(28.0).reshape(7, 4)
    only_head = {k: v for k, v in state.items() if k != "wte.weight"} | {"head.weight": table}
    model.load_state_dict(only_head)
    np.testing.assert_array_equal(model.wte.weight.numpy(), table)
    only_wte = {k: v for k, v in state.items() if k != "head.weight"} | {"wte.weight": table + 1}
    model.load_state_dict(only_wte)
    np.testing.assert_array_equal(model.head.weight.numpy(), table + 1)
    model.load_state_dict(state | {"wte.weight": table, "head.weight": table.copy()})
    conflicting = state | {"wte.weight": table, "head.weight": table + 2}
    with pytest.raises(mn.StateDictError, match="wte.weight and head.weight name one tied parameter"):
        model.load_state_dict(conflicting)
    np.testing.assert_array_equal(model.wte.weight.numpy(), table)  # nothing changed
    neither = {k: v for k, v in state.items() if k not in ("wte.weight", "head.weight")}
    with pytest.raises(mn.StateDictError, match=re.escape("missing keys ['wte.weight', 'head.weight']")):
        model.load_state_dict(neither)
    assert model.load_state_dict(neither, strict=False).missing_keys == ["wte.weight", "head.weight"]


def test_a_program_of_a_tied_model_reads_and_loads_both_names():
    model = Tied().eval()
    program = mn.compile(model, inputs={"ids": mn.i32[3]})
    state = program.state_dict()
    assert list(state) == REFERENCES["tree"]["state_dict"]
    np.testing.assert_array_equal(state["head.weight"], state["wte.weight"])
    table = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    program.load_state_dict({k: v for k, v in state.items() if k != "wte.weight"} | {"head.weight": table})
    np.testing.assert_array_equal(program.state_dict()["wte.weight"], table)
    np.testing.assert_array_equal(model.wte.weight.numpy(), table)


# ---------------------------------------------------------------------------------------------
# Forward values against PyTorch


def spec_of(value: np.ndarray):
    return (mn.i32 if value.dtype.kind in "iu" else mn.f32)[value.shape]


class Positional(nn.Module):
    """Calls `inner` with the inputs by position, as a model's forward calls its layers."""

    def __init__(self, inner: nn.Module, names: list[str]) -> None:
        super().__init__()
        self.inner, self.names = inner, names

    def forward(self, **inputs):
        return self.inner(*(inputs[name] for name in self.names))


def run_module(module: nn.Module, inputs: dict[str, np.ndarray], positional: bool = True) -> dict[str, np.ndarray]:
    """`module(*inputs.values())` (with `positional`, else `module(**inputs)`) traced and run on
    the numpy interpreter in float64."""
    model = Positional(module, list(inputs)) if positional else module
    traced = trace_step(model, None, {name: spec_of(v) for name, v in inputs.items()}, None, recognize=False)
    values = {name: p.numpy().astype(np.float64) for name, p in traced.parameters.items()}
    feeds = {name: v if v.dtype.kind in "iu" else v.astype(np.float64) for name, v in inputs.items()}
    return interpret(traced.graph, feeds, values, values, dtype=np.float64).outputs


def needs(function: str, *options: str) -> None:
    """Skip until F.<function> (with those keyword options) exists in this branch."""
    fn = getattr(F, function, None)
    if fn is None:
        pytest.skip(f"F.{function} is not in this branch yet")
    missing = [o for o in options if o not in inspect.signature(fn).parameters]
    if missing:
        pytest.skip(f"F.{function} has no {missing} in this branch yet")


LOSS_FUNCTIONS = {
    "CrossEntropyLoss": "cross_entropy", "NLLLoss": "nll_loss", "MSELoss": "mse_loss", "L1Loss": "l1_loss",
    "SmoothL1Loss": "smooth_l1_loss", "HuberLoss": "huber_loss", "BCELoss": "binary_cross_entropy",
    "BCEWithLogitsLoss": "binary_cross_entropy_with_logits", "KLDivLoss": "kl_div",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFERENCES["loss_cases"]))
def test_loss_modules_give_pytorchs_values(case):
    constructor, _, _ = REFERENCES["loss_cases"][case]
    criterion = build(constructor)
    used = [option for option in ("weight", "pos_weight", "ignore_index", "label_smoothing") if option in constructor]
    needs(LOSS_FUNCTIONS[type(criterion).__name__], *used)
    ref = arrays(f"loss/{case}/")
    out = run_module(criterion, {"input": ref["input"], "target": ref["target"]})["output"]
    np.testing.assert_allclose(out, ref["output"], rtol=1e-7, atol=1e-12)


def test_loss_modules_keep_pytorchs_arguments_and_state():
    weighted = nn.CrossEntropyLoss(weight=np.array([0.5, 2.0]), ignore_index=3, label_smoothing=0.1)
    assert (weighted.reduction, weighted.ignore_index, weighted.label_smoothing) == ("mean", 3, 0.1)
    assert list(weighted.state_dict()) == ["weight"]  # a buffer, as torch's
    assert list(nn.BCEWithLogitsLoss(pos_weight=np.ones(3)).state_dict()) == ["pos_weight"]
    assert nn.CrossEntropyLoss().state_dict() == {}
    with pytest.warns(UserWarning, match="please use reduction='sum' instead"):
        assert nn.MSELoss(size_average=False).reduction == "sum"
    assert nn.HuberLoss(delta=2.0).delta == 2.0 and nn.SmoothL1Loss(beta=0.5).beta == 0.5
    assert nn.KLDivLoss(reduction="batchmean", log_target=True).log_target


ACTIVATION_FUNCTIONS = {
    "mish": "mish", "hardswish": "hardswish", "hardsigmoid": "hardsigmoid", "elu": "elu", "hardtanh": "hardtanh",
    "relu6": "hardtanh",
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFERENCES["activation_cases"]))
def test_activation_modules_give_pytorchs_values(case):
    if case in ACTIVATION_FUNCTIONS:
        needs(ACTIVATION_FUNCTIONS[case])
    ref = arrays(f"act/{case}/")
    out = run_module(build(REFERENCES["activation_cases"][case]), {"input": ref["input"]})["output"]
    np.testing.assert_allclose(out, ref["output"], rtol=1e-7, atol=1e-12)


def test_softmax_without_dim_picks_pytorchs_implicit_dim_and_warns():
    x = np.random.default_rng(0).normal(size=(2, 3, 4))
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax has been deprecated"):
        out = run_module(nn.Softmax(), {"input": x})["output"]
    np.testing.assert_allclose(out, np.exp(x) / np.exp(x).sum(0, keepdims=True), rtol=1e-12)  # dim 0 for 3-d


LAYER_FUNCTIONS = {
    "Conv1d": ("conv1d",), "ConvTranspose1d": ("conv_transpose1d",), "ConvTranspose2d": ("conv_transpose2d",),
    "MaxPool1d": ("max_pool1d",), "AvgPool1d": ("avg_pool1d",), "AdaptiveAvgPool1d": ("adaptive_avg_pool1d",),
    "AdaptiveMaxPool2d": ("adaptive_max_pool2d",), "Upsample": ("interpolate",),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(REFERENCES["layer_cases"]))
def test_layer_modules_give_pytorchs_values(case):
    constructor, _ = REFERENCES["layer_cases"][case]
    layer = build(constructor)
    for function in LAYER_FUNCTIONS[type(layer).__name__]:
        needs(function)
    if "padding_mode" in constructor:
        needs("pad")
    ref = arrays(f"layer/{case}/")
    layer.load_state_dict({name: value for name, value in ref.items() if name not in ("input", "output")})
    out = run_module(layer, {"input": ref["input"]})["output"]
    np.testing.assert_allclose(out, ref["output"], rtol=1e-7, atol=1e-12)


def test_conv_transpose_output_size_picks_the_output_padding_as_pytorch():
    needs("conv_transpose1d")
    ref = arrays("layer/conv_transpose1d_output_size/")
    layer = nn.ConvTranspose1d(4, 6, 3, stride=2)
    layer.load_state_dict({name: ref[name] for name in ("weight", "bias")})
    traced_input = ref["input"]

    class WithSize(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = layer

        def forward(self, input):
            return self.up(input, output_size=[12])

    np.testing.assert_allclose(run_module(WithSize(), {"input": traced_input})["output"], ref["output"], rtol=1e-7)


def test_layer_constructors_check_their_arguments_as_pytorch():
    for make, message in [
        (lambda: nn.Conv1d(3, 4, 3, groups=2), "in_channels must be divisible by groups"),
        (lambda: nn.Conv1d(4, 3, 3, groups=2), "out_channels must be divisible by groups"),
        (lambda: nn.Conv1d(4, 4, 3, stride=2, padding="same"), "padding='same' is not supported for strided"),
        (lambda: nn.Conv1d(4, 4, 3, padding="full"), "Invalid padding string 'full'"),
        (lambda: nn.Conv1d(4, 4, 3, padding_mode="mirror"), "padding_mode must be one of"),
        (lambda: nn.ConvTranspose2d(4, 4, 3, padding_mode="reflect"), 'Only "zeros" padding mode is supported'),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            make()
    with pytest.raises(NotImplementedError, match="max_norm and scale_grad_by_freq are not supported"):
        nn.Embedding(4, 2, max_norm=1.0)
    conv = nn.ConvTranspose2d(4, 6, (3, 2), stride=2, groups=2)
    assert conv.weight.shape == (4, 3, 3, 2) and conv.stride == (2, 2) and conv.output_padding == (0, 0)
    assert nn.Conv1d(4, 6, 3, groups=2, bias=False).weight.shape == (6, 2, 3) and nn.Conv1d(4, 6, 3).kernel_size == (3,)
    assert nn.AvgPool1d(3).stride == (3,) and nn.MaxPool1d(3).stride == 3
    assert nn.Upsample(scale_factor=2).scale_factor == 2.0 and nn.Upsample(size=4).scale_factor is None


def test_unflatten_and_identity():
    x = np.arange(24.0).reshape(2, 12)
    np.testing.assert_array_equal(run_module(nn.Unflatten(1, (3, -1)), {"input": x})["output"], x.reshape(2, 3, 4))
    np.testing.assert_array_equal(run_module(nn.Identity(54, unused=True), {"input": x})["output"], x)
    with pytest.raises(mn.ShapeError, match=re.escape("Provided sizes [5, 2] don't multiply up to the size of dim 1")):
        run_module(nn.Unflatten(1, (5, 2)), {"input": x})


# ---------------------------------------------------------------------------------------------
# Training with the new layers, against PyTorch


class EmbeddingNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(7, 5, padding_idx=2)
        self.head = nn.Linear(5, 3)

    def forward(self, ids):
        return self.head(self.emb(ids).mean(1))


def ce(model, ids, y):
    return F.cross_entropy(model(ids), y)


def test_embedding_padding_row_starts_at_zero_and_gets_no_gradient():
    assert not nn.Embedding(7, 5, padding_idx=-1).weight.numpy()[6].any()
    model = EmbeddingNet()
    model.load_state_dict(arrays("embedding/init/"))
    feeds = [{"ids": ARRAYS[f"embedding/ids{k}"], "y": ARRAYS[f"embedding/y{k}"]} for k in range(3)]
    traced = trace_step(model, ce, {"ids": mn.i32[4, 6], "y": mn.i32[4]}, optim.SGD(lr=0.5, momentum=0.5))
    losses, final = interpreted_steps(traced, feeds)
    np.testing.assert_allclose(losses, ARRAYS["embedding/loss"], rtol=1e-7)
    for name, value in arrays("embedding/final/").items():
        np.testing.assert_allclose(final[name], value, rtol=1e-7, atol=1e-9, err_msg=name)
    assert not final["emb.weight"][2].any()
    program = mn.compile(model, ce, {"ids": mn.i32[4, 6], "y": mn.i32[4]}, optim.SGD(lr=0.5, momentum=0.5))
    assert_steps_follow_interpreter(program, feeds)
    assert not program.state_dict()["emb.weight"][2].any()


@pytest.mark.parametrize("padding_idx", [0, 3, -1])
def test_embedding_padding_at_either_end_looks_up_as_pytorch(padding_idx):
    table = nn.Embedding(4, 2, padding_idx=padding_idx)
    ids = np.array([[0, 1], [2, 3], [3, 3]], np.int32)
    out = run_module(table, {"input": ids})["output"]
    np.testing.assert_array_equal(out, table.weight.numpy()[ids])
    assert repr(table) == f"Embedding(4, 2, padding_idx={padding_idx % 4})"


def test_embedding_with_a_loaded_padding_row_reads_it_and_keeps_it():
    model = EmbeddingNet()
    model.emb.weight.copy_(np.arange(35, dtype=np.float32).reshape(7, 5) / 10)
    ids = np.array([[2, 1, 2, 0, 3, 2]] * 4, np.int32)
    program = mn.compile(model, ce, {"ids": mn.i32[4, 6], "y": mn.i32[4]}, optim.SGD(lr=0.5), keep_gradients=True)
    program.train_step(ids=ids, y=np.zeros(4, np.int32))
    assert not program.gradients()["emb.weight"][2].any() and program.gradients()["emb.weight"][1].any()
    np.testing.assert_array_equal(program.state_dict()["emb.weight"][2], np.arange(10, 15, dtype=np.float32) / 10)
    predict = mn.compile(model.emb, inputs={"input": mn.i32[1, 6]})
    np.testing.assert_array_equal(predict(input=ids[:1]), program.state_dict()["emb.weight"][ids[:1]])


class BatchNormNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.bn = nn.BatchNorm1d(5)
        self.seq_bn = nn.BatchNorm1d(3, momentum=None)

    def forward(self, x, seq):
        return self.bn(self.fc(x)), self.seq_bn(seq)


def bn_loss(model, x, seq, target):
    out, seq_out = model(x, seq)
    return F.mse_loss(out, target) + (seq_out * seq_out).mean()


def test_batch_norm_1d_trains_as_pytorchs_on_n_c_and_n_c_l():
    model = BatchNormNet()
    model.load_state_dict(arrays("batchnorm1d/init/"))
    feeds = [{key: ARRAYS[f"batchnorm1d/{key}{k}"] for key in ("x", "seq", "target")} for k in range(2)]
    spec = {"x": mn.f32[8, 6], "seq": mn.f32[4, 3, 7], "target": mn.f32[8, 5]}
    traced = trace_step(model, bn_loss, spec, optim.SGD(lr=0.1))
    losses, final = interpreted_steps(traced, feeds)
    np.testing.assert_allclose(losses, ARRAYS["batchnorm1d/loss"], rtol=1e-7)
    for name, value in arrays("batchnorm1d/final/").items():
        np.testing.assert_allclose(final[name], value, rtol=1e-7, atol=1e-9, err_msg=name)
    program = mn.compile(model, bn_loss, spec, optim.SGD(lr=0.1))
    assert_steps_follow_interpreter(program, feeds)
    assert program.state_dict()["seq_bn.num_batches_tracked"] == 2
    with pytest.raises(ValueError, match=re.escape("BatchNorm1d: expected 2D or 3D input (got 4D input)")):
        trace_step(nn.BatchNorm1d(3), None, {"x": mn.f32[2, 3, 4, 5]}, None)


# ---------------------------------------------------------------------------------------------
# mn.summary


def test_summary_lists_layers_totals_and_the_planned_memory(capsys):
    model = Tied()
    model.blocks[1].requires_grad_(False)
    spec = {"ids": mn.i32[5], "y": mn.i32[5]}

    def loss(model, ids, y):
        return F.cross_entropy(model(ids), y)

    result = mn.summary(model, spec, loss=loss, optimizer=optim.Adam(lr=1e-3))
    printed = capsys.readouterr().out
    assert printed.strip() == str(result).strip()
    rows = [(layer.name, layer.type, layer.output_shape, layer.params, layer.trainable) for layer in result.layers]
    assert rows == [
        ("", "Tied", [5, 7], 0, 0),
        ("wte", "Embedding", [5, 4], 28, 28),
        ("blocks.0", "Linear", [5, 4], 20, 20),
        ("blocks.1", "Linear", [5, 4], 20, 0),
        ("norm", "Sequential", [5, 4], 0, 0),
        ("norm.0", "BatchNorm1d", [5, 4], 8, 8),
        ("norm.1", "Identity", [5, 4], 0, 0),
        ("head", "Linear", [5, 7], 0, 0),  # its weight is wte's, counted there
    ]
    assert (result.total_params, result.trainable_params, result.frozen_params) == (76, 56, 20)
    assert result.buffer_elements == 4 + 4 + 1 + 3 and result.step == "training step"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.blocks[1].requires_grad_(True)  # a summary is no program: nothing was compiled to warn about
        model.blocks[1].requires_grad_(False)
    plan = compile_plan(model, loss, spec, optim.Adam(lr=1e-3)).compiled.plan
    assert result.memory_total == plan.total_bytes and result.kernels == len(plan.schedule)
    assert sum(result.memory.values()) == plan.total_bytes
    assert result.memory["parameters"] == 4 * (28 + 2 * 20 + 8)  # each parameter once
    assert "  wte (Embedding)" in printed and "20 (20 frozen)" in printed and "Frozen params: 20" in printed


def test_summary_of_an_inference_program_needs_no_loss():
    result = mn.summary(nn.Sequential(nn.Linear(3, 4), nn.ReLU()), {"x": mn.f32[2, 3]}, verbose=False)
    assert [layer.output_shape for layer in result.layers] == [[2, 4], [2, 4], [2, 4]]
    assert result.step == "inference program" and result.total_params == 16 and result.memory["parameters"] == 64


def test_the_names_added_here_no_longer_raise_pytorch_hints():
    for name in ("Identity", "SiLU", "Softmax", "LogSoftmax", "LeakyReLU", "Softplus", "Conv1d", "ConvTranspose2d",
                 "BatchNorm1d", "ModuleDict", "CrossEntropyLoss", "MSELoss", "NLLLoss"):  # fmt: skip
        assert isinstance(getattr(nn, name), type)
    with pytest.raises(MissingName, match="torch.nn.Conv3d"):
        nn.Conv3d  # noqa: B018
