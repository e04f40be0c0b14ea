"""Time one MLP training step (forward, backward, Adam) in meganeura and, when installed, in PyTorch
on the same machine, same model, same batch. Prints milliseconds per step and the ratio.

    python benchmarks/mlp_step.py [--batch 256] [--hidden 1024] [--layers 3] [--steps 50]

Absolute times hold only for the adapter they were taken on; compare the ratio.
"""

from __future__ import annotations

import argparse

import numpy as np
from side_by_side import print_side_by_side, seconds_per_step, torch_seconds_per_step  # (this script's folder)

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.runtime import default_device


class MLP(nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int, layers: int) -> None:
        super().__init__()
        sizes = [n_in] + [hidden] * (layers - 1) + [n_out]
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)])

    def forward(self, x):
        for index, layer in enumerate(self.layers):
            x = layer(x)
            if index < len(self.layers) - 1:
                x = F.relu(x)
        return x


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def time_meganeura(args, x, y) -> float:
    model = MLP(args.inputs, args.hidden, args.classes, args.layers)
    program = mn.compile(
        model,
        loss=loss_fn,
        inputs={"x": mn.f32[args.batch, args.inputs], "y": mn.i32[args.batch]},
        optimizer=optim.Adam(lr=1e-4),
    )
    return seconds_per_step(lambda: program.train_step(x=x, y=y), args.steps)


def time_torch(args, x, y):
    def build(torch):
        layers = []
        sizes = [args.inputs] + [args.hidden] * (args.layers - 1) + [args.classes]
        for index, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
            layers.append(torch.nn.Linear(a, b))
            if index < len(sizes) - 2:
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers)

    return torch_seconds_per_step(build, lambda torch, p: torch.optim.Adam(p, lr=1e-4), x, y, args.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--inputs", type=int, default=784)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.inputs)).astype(np.float32)
    y = rng.integers(0, args.classes, size=args.batch).astype(np.int32)
    print(f"adapter: {default_device().describe()}")
    print(f"MLP {args.inputs}-{'-'.join([str(args.hidden)] * (args.layers - 1))}-{args.classes}, batch {args.batch}")
    print_side_by_side(time_meganeura(args, x, y), time_torch(args, x, y))


if __name__ == "__main__":
    main()
