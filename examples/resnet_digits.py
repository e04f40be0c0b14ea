"""Train a small ResNet on scikit-learn's 8×8 digits (bundled, no download) with meganeura.

    python examples/resnet_digits.py [--epochs 6] [--batch 32] [--lr 0.05] [--width 16] [--seed 0] [--report]

The network is written the way a PyTorch user writes a ResNet by hand (torchvision's BasicBlock,
scaled down to 8×8 images of one channel): a 3×3 stem convolution → BatchNorm2d → relu, a basic
block at full resolution (conv-bn-relu-conv-bn plus the identity, then relu), a basic block that
halves the resolution with a stride-2 convolution and a 1×1 stride-2 convolution + BatchNorm2d
projection on the shortcut, a 2×2 max pool, then global average pooling → flatten → a linear
classifier. Trained with SGD with momentum on NCHW batches [batch, 1, 8, 8] scaled to [0, 1];
the split is the one of examples/mlp_digits.py.

Evaluation runs an inference program compiled from the same model in eval mode: BatchNorm2d
normalises with its running statistics, which the training step updates on the device; the two
programs share the weights and those buffers.

Prints the adapter, a summary of the e-graph's report (`--report` prints all of it: every rule
and every kernel with its source lines), the loss as it falls, the held-out accuracy after every
epoch and the wall time. Set MEGANEURA_ADAPTER (a substring of the adapter name, or "cpu"/"gpu")
to choose the adapter.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.fit import loss_curve_saved
from meganeura.runtime import default_device


class BasicBlock(nn.Module):
    """conv3×3-bn-relu-conv3×3-bn plus the shortcut (identity, or a 1×1 convolution + bn where the
    shape changes), then relu: torchvision's BasicBlock."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), nn.BatchNorm2d(channels)
            )
        else:
            self.downsample = None

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity)


class ResNet(nn.Module):
    """stem → block (8×8) → block, stride 2 (4×4) → max pool (2×2) → global average → linear."""

    def __init__(self, width: int = 16, n_classes: int = 10, in_channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.pool = nn.MaxPool2d(2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(2 * width, n_classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.pool(self.layer2(self.layer1(x)))
        return self.fc(self.flatten(self.avgpool(x)))


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def load_split(seed: int = 0, test_fraction: float = 0.2):
    """Digits as images [N, 1, 8, 8] scaled to [0, 1], shuffled and split into (train, test)
    pairs of (x, y) (the split of examples/mlp_digits.py)."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def compile_training(model: ResNet, batch: int, lr: float, momentum: float = 0.9, rewrite: bool = True) -> mn.Program:
    """The training step: cross-entropy, SGD with momentum (weight decay 5e-4)."""
    inputs = {"x": mn.f32[batch, 1, 8, 8], "y": mn.i32[batch]}
    optimizer = optim.SGD(lr=lr, momentum=momentum, weight_decay=5e-4)
    return mn.compile(model, loss=loss_fn, inputs=inputs, optimizer=optimizer, rewrite=rewrite)


def compile_inference(model: ResNet, batch: int) -> mn.Program:
    """Logits in eval mode (BatchNorm on its running statistics), sharing the model's weights and
    buffers; the model is put back in training mode afterwards."""
    model.eval()
    try:
        return mn.compile(model, inputs={"x": mn.f32[batch, 1, 8, 8]})
    finally:
        model.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--width", type=int, default=16, help="channels of the stem and first block")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", action="store_true", help="print the whole e-graph report (every kernel)")
    parser.add_argument(
        "--plot", default="out/resnet_digits_loss.png", help="where to save the loss curve ('' for none)"
    )
    args = parser.parse_args()

    print(f"adapter: {default_device().describe()}")
    (x_train, y_train), (x_test, y_test) = load_split(args.seed)
    print(f"data: {len(x_train)} training and {len(x_test)} held-out digits, 1×8×8 images, 10 classes")

    mn.manual_seed(args.seed)
    model = ResNet(args.width)
    n_params = sum(p.numpy().size for p in model.parameters())
    print(f"model: ResNet, stem {args.width} channels, blocks {args.width} (8×8) and {2 * args.width} (4×4), "
          f"{n_params:,} parameters")  # fmt: skip
    start = time.perf_counter()
    program = compile_training(model, args.batch, args.lr)
    predict = compile_inference(model, len(x_test))
    print(f"compiled in {time.perf_counter() - start:.2f} s (training step and evaluation programs)\n")
    report = program.report()
    print(report if args.report else report.summary())
    print()

    rng = np.random.default_rng(args.seed)
    steps_per_epoch = len(x_train) // args.batch  # the last partial batch is dropped
    start = time.perf_counter()
    accuracy = float("nan")
    curve, evaluations = [], []
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        losses = []
        for step in range(steps_per_epoch):
            batch = order[step * args.batch : (step + 1) * args.batch]
            losses.append(program.train_step(x=x_train[batch], y=y_train[batch]))
            curve.append((program.steps, losses[-1]))
        accuracy = float((predict(x=x_test).argmax(axis=1) == y_test).mean())
        evaluations.append((program.steps, {"held-out accuracy": accuracy}))
        print(
            f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  held-out accuracy {accuracy:.3f}"
            f"  ({time.perf_counter() - start:.1f} s)"
        )
    elapsed = time.perf_counter() - start
    steps = args.epochs * steps_per_epoch
    print(f"\ntrained {steps} steps in {elapsed:.1f} s ({1000 * elapsed / steps:.1f} ms per step, with evaluation)")
    print(f"held-out accuracy: {accuracy:.3f}")
    if args.plot:
        print(loss_curve_saved(curve, args.plot, "ResNet on the 8x8 digits", evaluations))


if __name__ == "__main__":
    main()
