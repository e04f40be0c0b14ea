"""Train a small diffusion model (DDPM) on scikit-learn's 8×8 digits (bundled, no download) with meganeura.

    python examples/diffusion_digits.py [--epochs 40] [--batch 64] [--lr 2e-3] [--width 16] [--samples out/ddpm.png]

A U-Net denoiser written as PyTorch users write one: sinusoidal features of the timestep
(sin/cos of the fed timesteps times constant frequencies) through an MLP; a 3×3 conv in; a
residual block (GroupNorm → SiLU → conv, plus the projected time embedding, GroupNorm → SiLU →
conv, plus the input) at 8×8 kept as the skip; a stride-2 conv to 4×4 and a residual block; an
nn.ConvTranspose2d back to 8×8, concatenated with the skip (mn.cat) and a residual block; a
GroupNorm → SiLU → conv out. DDPM's objective: x_t = √ᾱ_t·x₀ + √(1 − ᾱ_t)·ε with ε ~ N(0, 1) and
t uniform (both drawn by numpy and fed), the MSE between ε and the model's prediction; Adam.
Pixels are scaled to [−1, 1]; the β schedule is linear, 1e-4 to 0.02 over --timesteps steps.

Prints the adapter, a summary of the e-graph's report (the convolutions are implicit GEMMs,
`conv_*`), and the loss after every epoch; with --samples PATH, draws 64 digits by ancestral
sampling (an inference program that shares the weights, run once per timestep) and saves them
as a PNG (needs matplotlib). On lavapipe (Vulkan on the CPU) a step at the defaults takes about
half a second: there, try --epochs 5 first.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.runtime import default_device


def timestep_frequencies(time_dim: int) -> np.ndarray:
    """exp(−ln(10000)·i/half), i < half = time_dim/2 (diffusers' get_timestep_embedding), float32."""
    half = time_dim // 2
    return np.exp(-math.log(10000.0) * np.arange(half, dtype=np.float64) / half).astype(np.float32)


def betas(timesteps: int) -> np.ndarray:
    """DDPM's linear β schedule, 1e-4 to 0.02 (float64)."""
    return np.linspace(1e-4, 0.02, timesteps)


def noise_schedule(timesteps: int) -> tuple[np.ndarray, np.ndarray]:
    """(√ᾱ_t, √(1 − ᾱ_t)) for t < timesteps, float32."""
    alphas_cumprod = np.cumprod(1.0 - betas(timesteps))
    return np.sqrt(alphas_cumprod).astype(np.float32), np.sqrt(1.0 - alphas_cumprod).astype(np.float32)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, time_dim: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.time_proj = nn.Linear(time_dim, cout)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x, temb):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_proj(F.silu(temb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return h + (x if self.skip is None else self.skip(x))


class UNet(nn.Module):
    """(x_t [b, 1, 8, 8], t [b] int) → the predicted noise [b, 1, 8, 8]."""

    def __init__(self, width: int = 16, groups: int = 8, time_dim: int = 32) -> None:
        super().__init__()
        w, g, td = width, groups, time_dim
        self.time_dim = td
        self.time_mlp = nn.Sequential(nn.Linear(td, 2 * td), nn.SiLU(), nn.Linear(2 * td, 2 * td))
        self.conv_in = nn.Conv2d(1, w, 3, padding=1)
        self.down = ResBlock(w, w, 2 * td, g)
        self.downsample = nn.Conv2d(w, 2 * w, 3, stride=2, padding=1)
        self.mid = ResBlock(2 * w, 2 * w, 2 * td, g)
        self.upsample = nn.ConvTranspose2d(2 * w, w, 2, stride=2)
        self.up = ResBlock(2 * w, w, 2 * td, g)
        self.norm_out = nn.GroupNorm(g, w)
        self.conv_out = nn.Conv2d(w, 1, 3, padding=1)

    def forward(self, x, t):
        args = t.float()[:, None] * mn.tensor(timestep_frequencies(self.time_dim))[None, :]
        temb = self.time_mlp(mn.cat([mn.sin(args), mn.cos(args)], dim=-1))
        skip = self.down(self.conv_in(x), temb)
        h = self.mid(self.downsample(skip), temb)
        h = self.up(mn.cat([self.upsample(h), skip], dim=1), temb)
        return self.conv_out(F.silu(self.norm_out(h)))


def diffusion_loss(timesteps: int):
    """The loss of DDPM's noise objective: (model, x₀, ε, t) → MSE(model(x_t, t), ε)."""

    def loss(model, x, noise, t):
        sqrt_ab, sqrt_1mab = (mn.tensor(table) for table in noise_schedule(timesteps))
        x_t = sqrt_ab[t][:, None, None, None] * x + sqrt_1mab[t][:, None, None, None] * noise
        return F.mse_loss(model(x_t, t), noise)

    return loss


def load_images(seed: int = 0) -> np.ndarray:
    """The digits as images [N, 1, 8, 8] scaled to [−1, 1], shuffled."""
    from sklearn.datasets import load_digits

    x = (load_digits().images / 8.0 - 1.0).astype(np.float32)[:, None]
    return x[np.random.default_rng(seed).permutation(len(x))]


def sample(denoise: mn.Program, count: int, timesteps: int, rng: np.random.Generator) -> np.ndarray:
    """DDPM's ancestral sampling from x_T ~ N(0, 1), σ_t² = β_t: images [count, 1, 8, 8] in [−1, 1]."""
    beta = betas(timesteps)
    alphas_cumprod = np.cumprod(1.0 - beta)
    x = rng.normal(size=(count, 1, 8, 8))
    for t in reversed(range(timesteps)):
        eps = denoise(x=x.astype(np.float32), t=np.full(count, t, np.int32)).astype(np.float64)
        x = (x - beta[t] / np.sqrt(1.0 - alphas_cumprod[t]) * eps) / np.sqrt(1.0 - beta[t])
        if t:
            x += np.sqrt(beta[t]) * rng.normal(size=x.shape)
    return np.clip(x, -1.0, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--timesteps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", default="", help="save 64 sampled digits as this PNG")
    args = parser.parse_args()

    print(f"adapter: {default_device().describe()}")
    images = load_images(args.seed)
    print(f"data: {len(images)} digits, 1×8×8 images in [−1, 1]; {args.timesteps} diffusion steps")

    mn.manual_seed(args.seed)
    model = UNet(args.width)
    b = args.batch
    start = time.perf_counter()
    program = mn.compile(
        model,
        loss=diffusion_loss(args.timesteps),
        inputs={"x": mn.f32[b, 1, 8, 8], "noise": mn.f32[b, 1, 8, 8], "t": mn.i32[b]},
        optimizer=optim.Adam(lr=args.lr),
    )
    print(f"compiled in {time.perf_counter() - start:.2f} s\n\n{program.report().summary()}\n")

    rng = np.random.default_rng(args.seed)
    steps_per_epoch = len(images) // b
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(images))
        losses = []
        for step in range(steps_per_epoch):
            x = images[order[step * b : (step + 1) * b]]
            noise = rng.normal(size=x.shape).astype(np.float32)
            t = rng.integers(0, args.timesteps, b).astype(np.int32)
            losses.append(program.train_step(x=x, noise=noise, t=t))
        print(f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  ({time.perf_counter() - start:.1f} s)")
    if args.samples:
        denoise = mn.compile(model, inputs={"x": mn.f32[64, 1, 8, 8], "t": mn.i32[64]})
        digits = sample(denoise, 64, args.timesteps, rng)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        grid = digits.reshape(8, 8, 8, 8).transpose(0, 2, 1, 3).reshape(64, 64)
        plt.imsave(args.samples, np.kron(grid, np.ones((4, 4))), cmap="gray_r", vmin=-1.0, vmax=1.0)
        print(f"saved 64 sampled digits to {args.samples}")


if __name__ == "__main__":
    main()
