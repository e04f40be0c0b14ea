"""Time one training step (forward, backward, SGD with momentum) of the ResNet of
examples/resnet_digits.py in meganeura and, when installed, in PyTorch on the same machine, same
model, same batch. Prints milliseconds per step and the ratio.

    python benchmarks/conv_step.py [--batch 32] [--width 16] [--size 8] [--channels 1] [--steps 50]

Absolute times hold only for the adapter they were taken on; compare the ratio.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

import meganeura as mn
import meganeura.functional as F
from meganeura import optim
from meganeura.runtime import default_device

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))
from resnet_digits import ResNet  # noqa: E402
from side_by_side import print_side_by_side, seconds_per_step, torch_seconds_per_step  # noqa: E402


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def time_meganeura(args, x, y) -> float:
    model = ResNet(args.width, args.classes, in_channels=args.channels)
    inputs = {"x": mn.f32[x.shape], "y": mn.i32[args.batch]}
    optimizer = optim.SGD(lr=0.01, momentum=0.9)
    program = mn.compile(model, loss=loss_fn, inputs=inputs, optimizer=optimizer)
    return seconds_per_step(lambda: program.train_step(x=x, y=y), args.steps)


def torch_resnet(torch, width: int, classes: int, channels: int):
    """The same network in torch.nn (torchvision's BasicBlock, written out)."""
    nn, functional = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                projection = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
                self.downsample = nn.Sequential(projection, nn.BatchNorm2d(cout))

        def forward(self, x):
            out = self.bn2(self.conv2(functional.relu(self.bn1(self.conv1(x)))))
            return functional.relu(out + (x if self.downsample is None else self.downsample(x)))

    return nn.Sequential(
        nn.Conv2d(channels, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        Block(width, width),
        Block(width, 2 * width, stride=2),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, classes),
    )


def time_torch(args, x, y):
    def build(torch):
        return torch_resnet(torch, args.width, args.classes, args.channels)

    return torch_seconds_per_step(build, lambda torch, p: torch.optim.SGD(p, lr=0.01, momentum=0.9), x, y, args.steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--size", type=int, default=8, help="image height and width")
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch, args.channels, args.size, args.size)).astype(np.float32)
    y = rng.integers(0, args.classes, size=args.batch).astype(np.int32)
    print(f"adapter: {default_device().describe()}")
    print(f"ResNet width {args.width}, images {args.channels}x{args.size}x{args.size}, batch {args.batch}")
    print_side_by_side(time_meganeura(args, x, y), time_torch(args, x, y))


if __name__ == "__main__":
    main()
