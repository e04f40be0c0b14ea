"""program.fit (meganeura/fit.py): the loop, its callbacks and evaluations, checkpoints with resume,
partial batches (trained on; skipped with dynamic=False), and the progress bar's optional dependency."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

pytest.importorskip("safetensors")
pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(9)
BATCHES = [
    {"x": RNG.normal(size=(8, 4)).astype(np.float32), "y": RNG.integers(0, 3, 8).astype(np.int32)} for _ in range(5)
]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def program_for(seed: int, dynamic: bool = True):
    mn.manual_seed(seed)
    return mn.compile(Net(), ce, {"x": mn.f32[8, 4], "y": mn.i32[8]}, optim.Adam(lr=1e-2), dynamic=dynamic)


def test_fit_runs_every_batch_of_every_epoch_with_callbacks_and_evaluations():
    program = program_for(1)
    reference = program_for(1)
    expected = [reference.train_step(**b) for _ in range(2) for b in BATCHES]
    events = []
    history = program.fit(
        BATCHES, epochs=2, callbacks=[events.append], evaluate=lambda p: {"first": p.state_dict()["fc2.bias"][0]},
        eval_every=3, progress=False,
    )  # fmt: skip
    assert [loss for _, loss in history.losses] == expected
    assert [e.step for e in events] == list(range(1, 11)) and [e.epoch for e in events] == [0] * 5 + [1] * 5
    assert [step for step, _ in history.evaluations] == [3, 5, 6, 9, 10]  # every 3 steps and each epoch's end
    assert history.evaluations[-1][1]["first"] == pytest.approx(float(program.state_dict()["fc2.bias"][0]))


def test_an_interrupted_fit_resumes_from_its_checkpoint_with_the_same_losses(tmp_path):
    path = tmp_path / "run.safetensors"
    whole = program_for(2).fit(BATCHES, epochs=3, progress=False)
    first = program_for(2)
    first.fit(BATCHES[:3], epochs=1, checkpoint=path, checkpoint_every=2, progress=False)  # stops after 3 steps
    assert path.exists()
    resumed = program_for(5)  # other weights: the checkpoint replaces them
    history = resumed.fit(BATCHES, epochs=3, checkpoint=path, resume=True, progress=False)
    assert resumed.steps == 15
    assert history.losses == whole.losses[3:]


def test_a_partial_last_batch_is_trained_on():
    partial = {"x": BATCHES[0]["x"][:5], "y": BATCHES[0]["y"][:5]}
    feeds = [*BATCHES[:2], partial]
    reference = program_for(3)
    expected = [reference.train_step(**b) for _ in range(2) for b in feeds]
    program = program_for(3)
    history = program.fit(feeds, epochs=2, progress=False)
    assert [loss for _, loss in history.losses] == expected and [s for s, _ in history.losses] == list(range(1, 7))
    assert history.skipped_batches == 0 and program.steps == 6
    assert program.report().shapes == [{"x": (8, 4), "y": (8,)}, {"x": (5, 4), "y": (5,)}]
    for name, value in reference.state_dict().items():
        np.testing.assert_array_equal(program.state_dict()[name], value, err_msg=name)


def test_a_partial_last_batch_is_skipped_with_a_warning_without_dynamic_shapes():
    program = program_for(3, dynamic=False)
    partial = {"x": BATCHES[0]["x"][:5], "y": BATCHES[0]["y"][:5]}
    with pytest.warns(UserWarning, match="compile a program at that size"):
        history = program.fit([*BATCHES[:2], partial], epochs=2, progress=False)
    assert history.skipped_batches == 2 and program.steps == 4


def test_the_progress_bar_is_tqdm_when_installed_and_a_clear_error_when_asked_for_without_it(monkeypatch, capsys):
    pytest.importorskip("tqdm")
    program_for(4).fit(BATCHES[:2], progress=True)
    assert "loss=" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match="pip install tqdm"):
        program_for(4).fit(BATCHES[:2], progress=True)
    assert program_for(4).fit(BATCHES[:2]).losses  # progress=None: no bar, no error


def test_fit_refuses_what_it_cannot_do():
    program = program_for(4)
    with pytest.raises(ValueError, match="need checkpoint="):
        program.fit(BATCHES, resume=True)
    with pytest.raises(ValueError, match="epochs must be"):
        program.fit(BATCHES, epochs=0)
    inference = mn.compile(Net(), inputs={"x": mn.f32[8, 4]})
    with pytest.raises(RuntimeError, match="fit\\(\\) trains"):
        inference.fit(BATCHES)
