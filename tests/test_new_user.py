"""What a new user meets first (issue 11, item 10): inputs of other dtypes, layouts and sizes, 0-d
inputs, tensors over the adapter's limits, the training mode after compiling, and PyTorch names
meganeura lacks — each with the error or behaviour it must give, nothing changed by a refusal."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.pytorch_names import MissingName

RNG = np.random.default_rng(11)


class Scaled(nn.Module):
    def __init__(self, width: int = 3) -> None:
        super().__init__()
        self.fc = nn.Linear(width, 2)

    def forward(self, x, scale):
        return self.fc(x) * scale


def scaled_ce(model, x, scale, y):
    return F.cross_entropy(model(x, scale), y)


SPEC = {"x": mn.f32[4, 3], "scale": mn.f32[()], "y": mn.i32[4]}


def program():
    mn.manual_seed(0)
    return mn.compile(Scaled(), scaled_ce, SPEC, optim.Adam(lr=1e-2))


@pytest.mark.gpu
def test_inputs_of_other_dtypes_layouts_and_0d_scalars_are_converted():
    x = RNG.normal(size=(3, 4)).T  # float64, not contiguous
    y = np.array([0, 1, 1, 0], dtype=np.int64)
    reference = program()
    expected = reference.train_step(x=np.ascontiguousarray(x, np.float32), scale=np.float32(2.0), y=y.astype(np.int32))
    for scale in (2.0, 2, np.float64(2.0), np.array(2.0)):
        assert program().train_step(x=x, scale=scale, y=y) == expected, type(scale)


@pytest.mark.gpu
def test_bad_inputs_are_refused_with_their_reason_and_change_nothing():
    p = program()
    before = p.state_dict() | p.optimizer_state_dict()
    x, y = np.zeros((4, 3), np.float32), np.zeros(4, np.int32)
    corpus = [
        ({"x": x[..., None], "scale": 1.0, "y": y}, ValueError, r"'x': expected shape \[4, 3\], got \[4, 3, 1\]"),
        ({"x": x, "scale": 1.0, "y": np.array([0, 1, 2, 0])}, ValueError, r"must lie in \[0, 2\)"),
        ({"x": x, "scale": 1.0, "y": np.full(4, 2**40)}, ValueError, "do not fit in int32"),
        ({"x": x.astype(np.int32), "scale": 1.0, "y": y}, TypeError, "expected floating-point data"),
        ({"x": x, "scale": np.ones(1), "y": y}, ValueError, r"input 'scale': expected shape \[\], got \[1\]"),
        ({"x": x, "y": y}, KeyError, r"missing \['scale'\]"),
    ]  # fmt: skip
    for arrays, error, message in corpus:
        with pytest.raises(error, match=message):
            p.train_step(**arrays)
        after = p.state_dict() | p.optimizer_state_dict()
        assert all(np.array_equal(before[name], after[name]) for name in before), message
    assert p.steps == 0


@pytest.mark.gpu
def test_a_tensor_over_the_adapters_binding_limit_fails_at_compile_naming_it():
    from meganeura.runtime import default_device

    limit = default_device().limits["max-storage-buffer-binding-size"]
    width = int(np.sqrt(limit / 4)) + 64  # a square weight just over the limit

    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(width, width, bias=False)

        def forward(self, x):
            return self.fc(x)

    model = Wide()
    with pytest.raises(ValueError, match=rf"fc.weight: a buffer of {4 * width * width:,} bytes .*{limit:,} bytes"):
        mn.compile(model, lambda m, x: m(x).sum(), {"x": mn.f32[1, width]}, optim.SGD(lr=0.1))


@pytest.mark.gpu
def test_switching_the_mode_after_compiling_warns_where_it_matters():
    class WithNorm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)
            self.norm = nn.BatchNorm2d(2)

        def forward(self, x):
            return self.norm(self.conv(x)).mean()

    model = WithNorm()
    mn.compile(model, lambda m, x: m(x), {"x": mn.f32[2, 1, 4, 4]}, optim.SGD(lr=0.1))
    with pytest.warns(UserWarning, match="keep the mode they were compiled in"):
        model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.eval()  # once per model
        plain = Scaled()
        mn.compile(plain, scaled_ce, SPEC, optim.SGD(lr=0.1))
        plain.eval()  # no BatchNorm: the mode changes nothing, no warning


def test_pytorch_names_meganeura_lacks_say_what_to_use():
    import meganeura.functional as functional

    cases = [
        (lambda: nn.Conv3d(4, 4, 3), r"meganeura.nn has no 'Conv3d' \(PyTorch's torch.nn.Conv3d\): no 3-D convolution"),
        (lambda: functional.grid_sample, r"torch.nn.functional.grid_sample"),
        (lambda: optim.LBFGS, r"torch.optim.LBFGS\): not here: first-order optimizers only"),
        (lambda: nn.Linearr, r"no 'Linearr'; names here that are close: Linear"),
    ]
    for attempt, message in cases:
        with pytest.raises(MissingName, match=message):
            attempt()
    assert not hasattr(nn, "Conv3d") and hasattr(nn, "Linear")  # still an AttributeError for hasattr
