"""Kernels of an nn.Sequential name the lines that constructed its layers (the command line's
tests join them in the next commit)."""

from __future__ import annotations

import os

import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.compiler import explain_only
from meganeura.ir.op import ShapeError

HERE = os.path.basename(__file__)


# -- source lines of nn.Sequential ----------------------------------------------------------------


def line_of(marker: str) -> str:
    """`test_cli.py:N` of the line of this file that ends with `# marker`."""
    with open(__file__) as file:
        numbers = [n for n, line in enumerate(file, 1) if line.rstrip().endswith(f"# {marker}")]
    assert len(numbers) == 1, marker
    return f"{HERE}:{numbers[0]}"


def explained(model, loss_fn):
    with explain_only():
        program = mn.compile(
            model, loss=loss_fn, inputs={"x": mn.f32[5, 6], "y": mn.i32[5]}, optimizer=optim.SGD(lr=0.1)
        )
    return program.report().kernels


def test_kernels_of_a_sequential_name_the_lines_that_constructed_its_layers():
    model = nn.Sequential(
        nn.Linear(6, 7),  # first layer
        nn.ReLU(),  # activation
        nn.Sequential(nn.Linear(7, 3)),  # nested layer
    )
    loss = line_of("the loss")
    kernels = explained(model, lambda m, x, y: F.cross_entropy(m(x), y))  # the loss
    first, activation, nested = line_of("first layer"), line_of("activation"), line_of("nested layer")
    forward = [k for k in kernels if k.op == "fused_matmul" and "transpose_b" in k.what]
    assert [set(k.sources) for k in forward] == [{first, activation}, {nested}]  # linear+relu fused, then the last
    sources = {source for k in kernels for source in k.sources}
    assert {first, activation, nested, loss} <= sources  # the backward keeps the layers' lines too
    cross_entropy = [k for k in kernels if k.op == "cross_entropy_rows"]
    assert cross_entropy and all(k.sources == (loss,) for k in cross_entropy)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)  # block's layer

    def forward(self, x):
        return self.fc(x)  # block's forward


def test_a_layer_called_from_user_code_keeps_the_calling_line():
    kernels = explained(nn.Sequential(Block()), lambda m, x, y: F.cross_entropy(m(x), y))
    forward = [k for k in kernels if k.op == "fused_matmul" and "transpose_b" in k.what]
    assert [k.sources for k in forward] == [(line_of("block's forward"),)]
    assert line_of("block's layer") not in {s for k in kernels for s in k.sources}


def test_a_shape_error_inside_a_sequential_names_the_layer():
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(9, 3))  # mismatched layers
    with pytest.raises(ShapeError) as error:
        explained(model, lambda m, x, y: F.cross_entropy(m(x), y))
    assert str(error.value).startswith(line_of("mismatched layers") + ":")
