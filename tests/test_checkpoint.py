"""Checkpoints (meganeura/checkpoint.py): a resumed run continues with exactly the losses of an
uninterrupted one; writes are atomic; a truncated, foreign or mismatched file is refused with its
reasons and changes nothing."""

from __future__ import annotations

import os

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.checkpoint import CheckpointError

pytest.importorskip("safetensors")
pytestmark = pytest.mark.gpu

BATCH, N_IN, HIDDEN, CLASSES = 16, 6, 12, 4
RNG = np.random.default_rng(3)
BATCHES = [
    {"x": RNG.normal(size=(BATCH, N_IN)).astype(np.float32), "y": RNG.integers(0, CLASSES, BATCH).astype(np.int32)}
    for _ in range(6)
]
OPTIMIZERS = {
    "adam": lambda: optim.Adam(lr=1e-2),
    "adamw": lambda: optim.AdamW(lr=1e-2, weight_decay=0.1),
    "sgd momentum": lambda: optim.SGD(lr=5e-2, momentum=0.9, weight_decay=1e-3),
}


class Net(nn.Module):
    def __init__(self, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.fc1 = nn.Linear(N_IN, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, CLASSES)

    def forward(self, x):
        return self.fc2(F.relu(self.norm(self.fc1(x))))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def program_for(optimizer: str, seed: int, hidden: int = HIDDEN):
    mn.manual_seed(seed)
    spec = {"x": mn.f32[BATCH, N_IN], "y": mn.i32[BATCH]}
    return mn.compile(Net(hidden), ce, spec, OPTIMIZERS[optimizer]())


def snapshot(program) -> dict[str, np.ndarray]:
    return program.state_dict() | {f"optim/{k}": v for k, v in program.optimizer_state_dict().items()}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_resumed_run_continues_with_the_losses_of_an_uninterrupted_one(tmp_path, optimizer):
    whole = program_for(optimizer, seed=1)
    expected = [whole.train_step(**b) for b in BATCHES]
    first = program_for(optimizer, seed=1)
    for b in BATCHES[:3]:
        first.train_step(**b)
    path = tmp_path / "step3.safetensors"
    first.save(path)
    resumed = program_for(optimizer, seed=7)  # other initial weights: the checkpoint must replace them
    resumed.load(path)
    assert resumed.steps == 3
    losses = [resumed.train_step(**b) for b in BATCHES[3:]]
    assert losses == expected[3:]
    assert len(set(expected)) == len(expected)  # every step changed the model
    assert_same(snapshot(resumed), snapshot(whole))


def test_a_checkpoint_holds_parameters_optimizer_state_and_metadata(tmp_path):
    from safetensors import safe_open

    program = program_for("adam", seed=2)
    program.train_step(**BATCHES[0])
    path = tmp_path / "ckpt.safetensors"
    program.save(path)
    with safe_open(str(path), framework="numpy") as file:
        meta, keys = file.metadata(), set(file.keys())
    assert {"fc1.weight", "norm.bias", "optim/fc1.weight.exp_avg", "optim/fc1.weight.exp_avg_sq"} <= keys
    assert meta["format"] == "meganeura-checkpoint" and meta["model"] == "Net" and meta["optimizer"] == "Adam"
    assert meta["steps"] == "1" and '"lr": 0.01' in meta["hyper"]
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]  # no temporary file left


def grouped_adamw(seed: int):
    """AdamW in two parameter groups (the weights decayed, the rest not) and its program."""
    mn.manual_seed(seed)
    model = Net()
    decayed = [model.fc1.weight, model.fc2.weight]
    others = [model.fc1.bias, model.norm.weight, model.norm.bias, model.fc2.bias]
    opt = optim.AdamW([{"params": decayed}, {"params": others, "weight_decay": 0.0}], lr=1e-2, weight_decay=0.1)
    return opt, mn.compile(model, ce, {"x": mn.f32[BATCH, N_IN], "y": mn.i32[BATCH]}, opt)


# Written at commit aadb0a0, when every hyper-parameter of a group was a scalar leaf of its own
# (param_groups.<g>.lr, …), by grouped_adamw(1) after 3 steps of BATCHES and with group 1's lr
# set to 3e-3, on lavapipe. The file keeps the hyper-parameters by name in its metadata, never
# the device's leaves, so the layout of those could change under it.
SCALAR_HYPERS = os.path.join(os.path.dirname(__file__), "reference", "checkpoint_scalar_hypers.safetensors")


def test_a_checkpoint_from_before_the_hyper_parameter_vectors_loads():
    from safetensors import safe_open

    with safe_open(SCALAR_HYPERS, framework="numpy") as file:
        assert not [key for key in file.keys() if "param_groups" in key]
    opt, resumed = grouped_adamw(seed=7)
    resumed.load(SCALAR_HYPERS)
    assert resumed.steps == 3 and [g["lr"] for g in opt.param_groups] == [1e-2, 3e-3]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    whole_opt, whole = grouped_adamw(seed=1)
    for b in BATCHES[:3]:
        whole.train_step(**b)
    whole_opt.param_groups[1]["lr"] = 3e-3
    snapshot_whole, snapshot_resumed = snapshot(whole), snapshot(resumed)
    assert snapshot_whole.keys() == snapshot_resumed.keys()
    assert not [name for name in snapshot_resumed if "param_groups" in name]
    # The file was written on lavapipe by the Adam of its time, which took 1 − β^t in WGSL (pow), so
    # its steps were up to ~6e-5 too long there; now the bias corrections come from the host in
    # double, as torch's (and another device rounds three Adam steps otherwise: on the H200 by up
    # to 2.1e-6 in fc1.weight, measured 2026-12-01). So the resumed state is compared to that.
    rtol, atol = 1e-4, 1e-5
    for name, value in snapshot_whole.items():
        np.testing.assert_allclose(snapshot_resumed[name], value, rtol=rtol, atol=atol, err_msg=name)
    expected = [whole.train_step(**b) for b in BATCHES[3:]]
    np.testing.assert_allclose([resumed.train_step(**b) for b in BATCHES[3:]], expected, rtol=rtol)


def test_a_crash_mid_write_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    program = program_for("adam", seed=2)
    path = tmp_path / "ckpt.safetensors"
    program.save(path)
    before = path.read_bytes()
    program.train_step(**BATCHES[0])

    def crash(*args):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        program.save(path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_truncated_foreign_and_mismatched_files_are_refused_and_change_nothing(tmp_path):
    import safetensors.numpy

    program = program_for("adam", seed=2)
    program.train_step(**BATCHES[0])
    good = tmp_path / "good.safetensors"
    program.save(good)
    program.train_step(**BATCHES[1])
    before = snapshot(program)

    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    foreign = tmp_path / "foreign.safetensors"
    safetensors.numpy.save_file({"w": np.zeros(3, np.float32)}, str(foreign))
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"not a checkpoint at all")
    other = program_for("adam", seed=2, hidden=HIDDEN + 1)
    mismatched = tmp_path / "mismatched.safetensors"
    other.save(mismatched)
    sgd = program_for("sgd momentum", seed=2)
    other_optimizer = tmp_path / "sgd.safetensors"
    sgd.save(other_optimizer)

    cases = [
        (truncated, "not a readable safetensors file"),
        (foreign, "not a meganeura checkpoint"),
        (garbage, "not a readable safetensors file"),
        (mismatched, r"parameter 'fc1.weight': shape \[13, 6\], expected \[12, 6\]"),
        (other_optimizer, "its optimizer is 'SGD'"),
    ]
    for path, message in cases:
        with pytest.raises(CheckpointError, match=message):
            program.load(path)
        assert_same(snapshot(program), before)
    with pytest.raises(CheckpointError, match="optimizer state: missing"):
        program.load(other_optimizer)  # every problem at once: the optimizer's class and its state
    with pytest.raises(FileNotFoundError):
        program.load(tmp_path / "absent.safetensors")


def test_the_optimizer_state_round_trips_as_arrays_and_bad_ones_change_nothing():
    program = program_for("sgd momentum", seed=4)
    program.train_step(**BATCHES[0])
    state = program.optimizer_state_dict()
    assert set(state) == {f"{name}.momentum_buffer" for name in program.state_dict() if "running" not in name}
    assert any(np.abs(v).max() > 0 for v in state.values())
    zeros = {name: np.zeros_like(v) for name, v in state.items()}
    program.load_optimizer_state_dict(zeros)
    assert_same(program.optimizer_state_dict(), zeros)
    bad = dict(zeros)
    bad.pop(next(iter(bad)))
    bad["extra"] = np.zeros(2, np.float32)
    with pytest.raises(CheckpointError, match="missing .*unexpected"):
        program.load_optimizer_state_dict(bad)
    assert_same(program.optimizer_state_dict(), zeros)


def test_the_weights_are_stored_under_bare_names_and_load_into_a_module(tmp_path):
    from safetensors import safe_open

    program = program_for("adam", seed=5)
    program.train_step(**BATCHES[0])
    path = tmp_path / "ckpt.safetensors"
    program.save(path)
    with safe_open(str(path), framework="numpy") as file:
        assert file.metadata()["version"] == "2"
        stored = set(file.keys())
    weights = mn.load_safetensors(path)  # the model's part of the checkpoint
    assert sorted(weights) == sorted(program.state_dict()) and set(weights) <= stored
    assert {name for name in stored - set(weights)} == {n for n in stored if n.startswith("optim/")}
    model = Net()
    model.load_state_dict(weights)  # strict: every name, nothing else
    assert_same(model.state_dict(), program.state_dict())


def test_an_inference_program_loads_the_weights_of_a_training_checkpoint(tmp_path):
    trained = program_for("adamw", seed=6)
    for batch in BATCHES[:2]:
        trained.train_step(**batch)
    path = tmp_path / "ckpt.safetensors"
    trained.save(path)
    mn.manual_seed(9)
    model = Net()
    inference = mn.compile(model, inputs={"x": mn.f32[BATCH, N_IN]})
    inference.load(path)
    assert_same(inference.state_dict(), trained.state_dict())
    reference = mn.compile(trained.compilation.model, inputs={"x": mn.f32[BATCH, N_IN]})
    np.testing.assert_array_equal(inference(x=BATCHES[3]["x"]), reference(x=BATCHES[3]["x"]))
    inference.load(SCALAR_HYPERS)  # and a version-1 checkpoint's
    assert_same(inference.state_dict(), mn.load_safetensors(SCALAR_HYPERS))


def test_a_version_1_checkpoints_weights_load_under_their_bare_names():
    weights = mn.load_safetensors(SCALAR_HYPERS)  # stored as param/<name>
    assert sorted(weights) == sorted(Net().state_dict())
    Net().load_state_dict(weights)


class TiedNet(Net):
    """Net with a second hidden layer whose weight is the first's (tied, as lm_head.weight = wte.weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.back = nn.Linear(HIDDEN, HIDDEN)
        self.back.weight = self.proj.weight

    def forward(self, x):
        h = F.relu(self.norm(self.fc1(x)))
        return self.fc2(self.back(F.relu(self.proj(h))))


def test_tied_weights_are_saved_under_both_names_and_either_restores_them(tmp_path):
    import safetensors.numpy
    from safetensors import safe_open

    mn.manual_seed(1)
    program = mn.compile(TiedNet(), ce, {"x": mn.f32[BATCH, N_IN], "y": mn.i32[BATCH]}, optim.Adam(lr=1e-2))
    program.train_step(**BATCHES[0])
    path = tmp_path / "tied.safetensors"
    program.save(path)
    state = program.state_dict()
    np.testing.assert_array_equal(state["proj.weight"], state["back.weight"])
    mn.manual_seed(2)
    resumed = mn.compile(TiedNet(), ce, {"x": mn.f32[BATCH, N_IN], "y": mn.i32[BATCH]}, optim.Adam(lr=1e-2))
    resumed.load(path)
    assert_same(snapshot(resumed), snapshot(program))
    # A version-1 file kept a tied parameter under its first name only.
    with safe_open(str(path), framework="numpy") as file:
        meta, tensors = file.metadata(), {name: file.get_tensor(name) for name in file.keys()}
    tensors.pop("back.weight")
    old = {(name if "/" in name else f"param/{name}"): value for name, value in tensors.items()}
    v1 = tmp_path / "v1.safetensors"
    safetensors.numpy.save_file(old, str(v1), metadata=meta | {"version": "1"})
    mn.manual_seed(3)
    again = mn.compile(TiedNet(), ce, {"x": mn.f32[BATCH, N_IN], "y": mn.i32[BATCH]}, optim.Adam(lr=1e-2))
    again.load(v1)
    assert_same(snapshot(again), snapshot(program))
    assert [resumed.train_step(**b) for b in BATCHES[1:3]] == [again.train_step(**b) for b in BATCHES[1:3]]
