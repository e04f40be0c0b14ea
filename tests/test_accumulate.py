"""compile(accumulate=k) (meganeura/gate.py): k train_steps add gradient/k into accumulators and
the k-th applies the update with their sum — `(loss / k).backward()` k times, then
`optimizer.step()`, in PyTorch. Checked against one step on the k-times-larger batch (a mean
loss: the same update up to float32 rounding), against the SGD formula with the gradients of
single steps, with clipping of the accumulated gradient, and across a checkpoint taken mid-cycle."""

from __future__ import annotations

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.bench.harness import preload_torch
from meganeura.checkpoint import CheckpointError
from meganeura.gate import ACCUMULATOR_SUFFIX, MICRO_STEP

pytestmark = pytest.mark.gpu
preload_torch()  # where torch is installed: imported before the device opens (harness.py says why)

MICRO, K, N_IN, CLASSES = 5, 3, 6, 4  # a micro-batch of 5 rows (no tile multiple), 3 per update
RNG = np.random.default_rng(11)
BATCHES = [
    {"x": RNG.normal(size=(MICRO, N_IN)).astype(np.float32) * 2, "y": RNG.integers(0, CLASSES, MICRO).astype(np.int32)}
    for _ in range(2 * K)
]
OPTIMIZERS = {
    "adam": lambda: optim.Adam(lr=1e-2),
    "sgd momentum": lambda: optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-2),
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(N_IN, 9)
        self.fc2 = nn.Linear(9, CLASSES)

    def forward(self, x):
        return self.fc2(F.tanh(self.fc1(x)))


def ce(model, x, y):
    return F.cross_entropy(model(x), y)


def spec(rows: int) -> dict:
    return {"x": mn.f32[rows, N_IN], "y": mn.i32[rows]}


def program(rows: int, optimizer, seed: int = 0, **options):
    mn.manual_seed(seed)  # the same initial weights for every program of a seed
    return mn.compile(Net(), ce, spec(rows), optimizer, **options)


def whole(batches: list[dict]) -> dict:
    """The micro-batches as one batch."""
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def assert_close(a: dict, b: dict, rtol: float = 2e-5, atol: float = 2e-6) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_k_accumulated_steps_make_the_update_of_one_step_on_the_k_times_larger_batch(optimizer):
    accumulating = program(MICRO, OPTIMIZERS[optimizer](), accumulate=K)
    large = program(K * MICRO, OPTIMIZERS[optimizer]())
    for cycle in range(2):
        start = accumulating.state_dict()
        losses = []
        for index, batch in enumerate(BATCHES[cycle * K : (cycle + 1) * K]):
            losses.append(accumulating.train_step(**batch))
            if index < K - 1:  # mid-cycle: nothing is updated yet
                for name, value in accumulating.state_dict().items():
                    np.testing.assert_array_equal(value, start[name], err_msg=name)
                assert accumulating.micro_step == index + 1
        assert accumulating.micro_step == 0
        large_loss = large.train_step(**whole(BATCHES[cycle * K : (cycle + 1) * K]))
        # Each micro-batch's own loss, unscaled: equal sizes, so their mean is the large batch's.
        assert np.mean(losses) == pytest.approx(large_loss, rel=1e-5)
        assert_close(accumulating.state_dict(), large.state_dict())
        assert_close(accumulating.optimizer_state_dict(), large.optimizer_state_dict(), atol=1e-6)
    assert accumulating.steps == 2 * K and large.steps == 2


def test_the_update_is_lr_times_the_mean_of_the_micro_batch_gradients_and_losses_are_unscaled():
    """SGD at lr 1 without momentum: one plain step from θ gives θ − g; the accumulated cycle
    must give θ − (g₁ + g₂ + g₃)/3 and return each micro-batch's loss at θ."""
    plain = program(MICRO, optim.SGD(lr=1.0), seed=4)
    accumulating = program(MICRO, optim.SGD(lr=1.0), seed=4, accumulate=K)
    theta = plain.state_dict()
    grads, plain_losses = [], []
    for batch in BATCHES[:K]:
        plain.load_state_dict(theta)
        plain_losses.append(plain.train_step(**batch))
        grads.append({name: theta[name] - value for name, value in plain.state_dict().items()})
    losses = [accumulating.train_step(**batch) for batch in BATCHES[:K]]
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    expected = {name: theta[name] - sum(g[name] for g in grads) / K for name in theta}
    assert_close(accumulating.state_dict(), expected, rtol=1e-5, atol=1e-6)


def test_clipping_clips_the_accumulated_gradient():
    clip = 0.05  # well under the gradients' norm (about 1), so the clipping acts
    accumulating = program(MICRO, optim.SGD(lr=1.0), seed=2, accumulate=K, clip_grad_norm=clip)
    large = program(K * MICRO, optim.SGD(lr=1.0), seed=2, clip_grad_norm=clip)
    for batch in BATCHES[: K - 1]:
        accumulating.train_step(**batch)
        assert accumulating.last_grad_norm is None  # no update yet, so no norm was clipped
    accumulating.train_step(**BATCHES[K - 1])
    large.train_step(**whole(BATCHES[:K]))
    assert large.last_grad_norm > 10 * clip
    assert accumulating.last_grad_norm == pytest.approx(large.last_grad_norm, rel=1e-5)
    assert_close(accumulating.state_dict(), large.state_dict())


def test_a_checkpoint_mid_cycle_resumes_exactly(tmp_path):
    pytest.importorskip("safetensors")
    path = tmp_path / "run.safetensors"
    first = program(MICRO, optim.Adam(lr=1e-2), seed=7, accumulate=K)
    for batch in BATCHES[:2]:  # two thirds into the first cycle
        first.train_step(**batch)
    first.save(path)
    after = [first.train_step(**batch) for batch in BATCHES[2:]]
    resumed = program(MICRO, optim.Adam(lr=1e-2), seed=8, accumulate=K)  # other weights until loaded
    resumed.load(path)
    assert resumed.micro_step == 2 and resumed.steps == 2
    assert [resumed.train_step(**batch) for batch in BATCHES[2:]] == after
    for name, value in first.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[name], value, err_msg=name)
    # The accumulators are the step's, not the optimizer's: optimizer_state_dict() is PyTorch's.
    state = first.optimizer_state_dict()
    assert MICRO_STEP not in state and not any(name.endswith(ACCUMULATOR_SUFFIX) for name in state)
    # A program without accumulation cannot resume mid-cycle: refused, naming why, and unchanged.
    plain = program(MICRO, optim.Adam(lr=1e-2), seed=9)
    weights = plain.state_dict()
    with pytest.raises(CheckpointError, match=r"gradient accumulation state .*: unexpected \['accumulate.micro_step'"):
        plain.load(path)
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)


def test_accumulate_needs_a_whole_number_of_steps_and_a_training_step():
    for bad in (0, -2, 2.5, True, "2"):
        with pytest.raises(ValueError, match="accumulate must be a whole number of steps >= 1"):
            mn.compile(Net(), ce, spec(MICRO), optim.SGD(lr=1.0), accumulate=bad)
    with pytest.raises(ValueError, match="pass loss= and optimizer="):
        mn.compile(Net(), inputs=spec(MICRO), accumulate=2)


def test_side_by_side_with_pytorch_loss_over_k_backward_then_step():
    torch = pytest.importorskip("torch")
    accumulating = program(MICRO, optim.Adam(lr=1e-2), seed=5, accumulate=K)
    start = accumulating.state_dict()
    reference = torch.nn.Sequential(torch.nn.Linear(N_IN, 9), torch.nn.Tanh(), torch.nn.Linear(9, CLASSES))
    names = {"0.weight": "fc1.weight", "0.bias": "fc1.bias", "2.weight": "fc2.weight", "2.bias": "fc2.bias"}
    reference.load_state_dict({ours: torch.from_numpy(start[theirs].copy()) for ours, theirs in names.items()})
    adam = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for cycle in range(2):
        for batch in BATCHES[cycle * K : (cycle + 1) * K]:
            ours = accumulating.train_step(**batch)
            loss = torch.nn.functional.cross_entropy(
                reference(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]).long()
            )
            (loss / K).backward()
            assert ours == pytest.approx(loss.item(), rel=1e-5)
        adam.step()
        adam.zero_grad()
        theirs = {names[name]: value.detach().numpy() for name, value in reference.state_dict().items()}
        assert_close(accumulating.state_dict(), theirs)
