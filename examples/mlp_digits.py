"""Train an MLP classifier on scikit-learn's 8×8 digits (bundled, no download) with meganeura.

    python examples/mlp_digits.py [--epochs 20] [--batch 32] [--lr 1e-3]

Prints the adapter, the rewrites the e-graph chose, the loss as it falls and the held-out
accuracy, and saves the loss curve as a PNG (out/mlp_digits_loss.png; needs matplotlib). The
loop is `program.fit` (a progress bar when run in a terminal).
Set MEGANEURA_ADAPTER (a substring of the adapter name, or "cpu"/"gpu") to choose
the adapter.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from sklearn.datasets import load_digits

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.fit import loss_curve_saved
from meganeura.runtime import default_device


class MLP(nn.Module):
    def __init__(self, n_in: int = 64, hidden: int = 128, n_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, n_classes)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def load_split(seed: int = 0, test_fraction: float = 0.2):
    """Digits scaled to [0, 1], shuffled and split into (train, test) pairs of (x, y)."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (x[train], y[train]), (x[test], y[test])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="out/mlp_digits_loss.png", help="where to save the loss curve ('' for none)")
    args = parser.parse_args()

    print(f"adapter: {default_device().describe()}")
    (x_train, y_train), (x_test, y_test) = load_split(args.seed)
    print(f"data: {len(x_train)} training and {len(x_test)} held-out digits, 64 features, 10 classes")

    mn.manual_seed(args.seed)
    model = MLP()
    start = time.perf_counter()
    program = mn.compile(
        model,
        loss=loss_fn,
        inputs={"x": mn.f32[args.batch, 64], "y": mn.i32[args.batch]},
        optimizer=optim.Adam(lr=args.lr),
    )
    predict = mn.compile(model, inputs={"x": mn.f32[len(x_test), 64]})
    print(f"compiled in {time.perf_counter() - start:.2f} s\n")
    print(program.report())
    print()

    rng = np.random.default_rng(args.seed)
    steps_per_epoch = len(x_train) // args.batch  # the last partial batch is dropped

    def shuffled(epoch: int):
        order = rng.permutation(len(x_train))
        for step in range(steps_per_epoch):
            batch = order[step * args.batch : (step + 1) * args.batch]
            yield {"x": x_train[batch], "y": y_train[batch]}

    def evaluate(_program) -> dict[str, float]:
        accuracy = float((predict(x=x_test).argmax(axis=1) == y_test).mean())
        epoch_losses = [loss for _, loss in history_losses[-steps_per_epoch:]]
        print(f"epoch {len(history_losses) // steps_per_epoch:3d}  loss {np.mean(epoch_losses):.4f}  "
              f"held-out accuracy {accuracy:.3f}")  # fmt: skip
        return {"held-out accuracy": accuracy}

    history_losses = []
    start = time.perf_counter()
    history = program.fit(
        shuffled, epochs=args.epochs, evaluate=evaluate, progress=sys.stderr.isatty(),
        callbacks=[lambda event: history_losses.append((event.step, event.loss))],
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    steps = args.epochs * steps_per_epoch
    print(f"\ntrained {steps} steps in {elapsed:.1f} s ({1000 * elapsed / steps:.2f} ms per step, with evaluation)")
    print(f"held-out accuracy: {history.evaluations[-1][1]['held-out accuracy']:.3f}")
    if args.plot:
        print(loss_curve_saved(history.losses, args.plot, "MLP on the 8x8 digits", history.evaluations))


if __name__ == "__main__":
    main()
