"""Train a variational autoencoder on scikit-learn's 8×8 digits (bundled, no download) with meganeura.

    python examples/vae_digits.py [--epochs 30] [--batch 64] [--lr 1e-3] [--hidden 128] [--latent 8] [--seed 0]

The model is pytorch/examples' VAE (vae/main.py) scaled to 64 pixels, written as there: an
encoder fc1 → relu → (fc21: μ, fc22: log σ²), the reparameterisation z = μ + ε·exp(½·log σ²) with
ε = mn.randn_like(std) drawn inside the training step (Philox on the device, fresh every step,
the same for the same seed), a decoder fc3 → relu → fc4 → sigmoid, and the loss
binary_cross_entropy(recon, x, reduction="sum") + KL(q(z|x) ‖ N(0, 1)), trained with Adam on the
pixels scaled to [0, 1].

Prints the adapter, a summary of the e-graph's report (the random draw is regenerated where it
is read: `regenerate_random`), the loss per digit after every epoch with the held-out loss
(an inference program that shares the weights), and, with --samples PATH, saves a grid of
digits decoded from z ~ N(0, 1) as a PNG (needs matplotlib).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import load_digits

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.runtime import default_device


class VAE(nn.Module):
    def __init__(self, hidden: int = 128, latent: int = 8, pixels: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(pixels, hidden)
        self.fc21 = nn.Linear(hidden, latent)
        self.fc22 = nn.Linear(hidden, latent)
        self.fc3 = nn.Linear(latent, hidden)
        self.fc4 = nn.Linear(hidden, pixels)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = mn.exp(0.5 * logvar)
        eps = mn.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return F.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x)
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    """Reconstruction + KL divergence, summed over the batch (pytorch/examples' loss_function)."""
    bce = F.binary_cross_entropy(recon_x, x, reduction="sum")
    kld = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum()
    return bce + kld


def vae_loss(model, x):
    recon_batch, mu, logvar = model(x)
    return loss_function(recon_batch, x, mu, logvar)


class Decoder(nn.Module):
    """The VAE's decoder alone, to sample digits from z ~ N(0, 1) (it shares the VAE's weights)."""

    def __init__(self, vae: VAE) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, z):
        return self.vae.decode(z)


def load_split(seed: int = 0, test_fraction: float = 0.2):
    """Digits as [N, 64] pixels scaled to [0, 1], shuffled and split into (train, test)."""
    x = (load_digits().data / 16.0).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    return x[order[n_test:]], x[order[:n_test]]


def held_out_loss(predict: mn.Program, x: np.ndarray) -> float:
    """The loss per digit of the held-out set, from the inference program's (recon, μ, log σ²)."""
    recon, mu, logvar = (np.asarray(a, np.float64) for a in predict(x=x))
    recon = np.clip(recon, np.exp(-100.0), 1.0 - 1e-7)  # torch clamps each log at −100
    bce = -np.sum(x * np.log(recon) + (1.0 - x) * np.log(1.0 - recon))
    kld = -0.5 * np.sum(1.0 + logvar - mu**2 - np.exp(logvar))
    return float((bce + kld) / len(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--latent", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", default="", help="save 64 digits decoded from the prior as this PNG")
    args = parser.parse_args()

    print(f"adapter: {default_device().describe()}")
    x_train, x_test = load_split(args.seed)
    print(f"data: {len(x_train)} training and {len(x_test)} held-out digits, 64 pixels in [0, 1]")

    mn.manual_seed(args.seed)
    model = VAE(args.hidden, args.latent)
    start = time.perf_counter()
    program = mn.compile(
        model, loss=vae_loss, inputs={"x": mn.f32[args.batch, 64]}, optimizer=optim.Adam(lr=args.lr), seed=args.seed
    )
    predict = mn.compile(model, inputs={"x": mn.f32[len(x_test), 64]}, seed=args.seed + 1)
    print(f"compiled in {time.perf_counter() - start:.2f} s\n\n{program.report().summary()}\n")

    rng = np.random.default_rng(args.seed)
    steps_per_epoch = len(x_train) // args.batch
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        losses = [
            program.train_step(x=x_train[order[step * args.batch : (step + 1) * args.batch]])
            for step in range(steps_per_epoch)
        ]
        print(
            f"epoch {epoch:3d}  loss per digit {np.mean(losses) / args.batch:7.3f}  "
            f"held-out {held_out_loss(predict, x_test):7.3f}  ({time.perf_counter() - start:.1f} s)"
        )
    if args.samples:
        sample = mn.compile(Decoder(model), inputs={"z": mn.f32[64, args.latent]})
        digits = sample(z=np.random.default_rng(args.seed).normal(size=(64, args.latent)).astype(np.float32))
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        grid = digits.reshape(8, 8, 8, 8).transpose(0, 2, 1, 3).reshape(64, 64)
        plt.imsave(args.samples, np.kron(grid, np.ones((4, 4))), cmap="gray_r", vmin=0.0, vmax=1.0)
        print(f"saved 64 digits sampled from the prior to {args.samples}")


if __name__ == "__main__":
    main()
