"""Side by side with PyTorch (skipped where torch is not installed, e.g. in CI; run on the GPU
machine, which has it): same init, same batches, same optimizer — same losses and weights."""

from __future__ import annotations

import numpy as np
import pytest

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim

torch = pytest.importorskip("torch")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 20)
        self.fc2 = nn.Linear(20, 5)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def torch_mlp(state):
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.ReLU(), torch.nn.Linear(20, 5)).double()
    names = {"0.weight": "fc1.weight", "0.bias": "fc1.bias", "2.weight": "fc2.weight", "2.bias": "fc2.bias"}
    model.load_state_dict({k: torch.tensor(state[v], dtype=torch.float64) for k, v in names.items()})
    return model, names


OPTIMIZERS = {
    "sgd": (lambda: optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-3),
            lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3)),
    "adam": (lambda: optim.Adam(lr=1e-2, weight_decay=1e-3), lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3)),
    "adamw": (lambda: optim.AdamW(lr=1e-2), lambda p: torch.optim.AdamW(p, lr=1e-2)),
}  # fmt: skip


@pytest.mark.parametrize("loss_name", ["cross_entropy", "mse_loss"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_matches_pytorch(name, loss_name):
    ours_opt, torch_opt = OPTIMIZERS[name]
    mn.manual_seed(3)
    model = MLP()
    if loss_name == "cross_entropy":
        inputs = {"x": mn.f32[8, 12], "y": mn.i32[8]}

        def loss_fn(m, x, y):
            return F.cross_entropy(m(x), y)
    else:
        inputs = {"x": mn.f32[8, 12], "y": mn.f32[8, 5]}

        def loss_fn(m, x, y):
            return F.mse_loss(m(x), y)

    program = mn.compile(model, loss=loss_fn, inputs=inputs, optimizer=ours_opt())
    reference, names = torch_mlp(program.state_dict())
    opt = torch_opt(reference.parameters())
    rng = np.random.default_rng(0)
    for step in range(5):
        x = rng.normal(size=(8, 12)).astype(np.float32)
        if loss_name == "cross_entropy":
            y = rng.integers(0, 5, size=8).astype(np.int32)
            target = torch.tensor(y, dtype=torch.long)
            torch_loss_fn = torch.nn.functional.cross_entropy
        else:
            y = rng.normal(size=(8, 5)).astype(np.float32)
            target = torch.tensor(y, dtype=torch.float64)
            torch_loss_fn = torch.nn.functional.mse_loss
        ours = program.train_step(x=x, y=y)
        opt.zero_grad()
        loss = torch_loss_fn(reference(torch.tensor(x, dtype=torch.float64)), target)
        loss.backward()
        opt.step()
        assert ours == pytest.approx(loss.item(), rel=1e-4, abs=1e-5), f"step {step}"
    state = program.state_dict()
    for torch_name, value in reference.state_dict().items():
        np.testing.assert_allclose(state[names[torch_name]], value.numpy(), rtol=1e-3, atol=1e-5)
