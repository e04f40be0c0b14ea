"""Train a small Vision Transformer on scikit-learn's 8×8 digits (bundled, no download) with meganeura.

    python examples/vit_digits.py [--epochs 15] [--batch 32] [--lr 1e-3] [--dim 32] [--layers 2] [--seed 0]

The network is torchvision's VisionTransformer scaled down to 8×8 images of one channel and
written with PyTorch's modules: 4×4 patches embedded by a strided nn.Conv2d (`conv_proj`), a
learned class token (nn.Parameter) before them, a learned positional embedding, dropout, a stack
of nn.TransformerEncoderLayer (pre-LN, GELU, batch_first, dropout 0.1 on the attention weights
and both branches), a final LayerNorm and a linear head on the class token; cross-entropy on the
labels, AdamW.

Prints the adapter, a summary of the e-graph's report (the dropout masks are regenerated where
they are read: `regenerate_random`; the patch embedding is an implicit-GEMM convolution), the
loss and the held-out accuracy (an eval-mode program: no dropout) after every epoch.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.runtime import default_device


class ViT(nn.Module):
    def __init__(
        self, patch: int = 4, dim: int = 32, heads: int = 4, layers: int = 2, mlp: int = 64, dropout: float = 0.1,
        classes: int = 10, image: int = 8, eps: float = 1e-5,
    ) -> None:  # fmt: skip
        super().__init__()
        self.conv_proj = nn.Conv2d(1, dim, patch, stride=patch)
        self.class_token = nn.Parameter(np.zeros((1, 1, dim), np.float32))
        self.pos_embedding = nn.Parameter(np.zeros((1, (image // patch) ** 2 + 1, dim), np.float32))
        nn.init.normal_(self.pos_embedding, std=0.02)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                dim, heads, mlp, dropout, activation="gelu", layer_norm_eps=eps, batch_first=True, norm_first=True
            )
            for _ in range(layers)
        )
        self.ln = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)  # [b, patches, dim]
        x = mn.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.dropout(x + self.pos_embedding)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x)[:, 0])


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def load_split(seed: int = 0, test_fraction: float = 0.2):
    """Digits as images [N, 1, 8, 8] scaled to [0, 1] and labels, split as examples/resnet_digits.py."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    return (x[order[n_test:]], y[order[n_test:]]), (x[order[:n_test]], y[order[:n_test]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(f"adapter: {default_device().describe()}")
    (x_train, y_train), (x_test, y_test) = load_split(args.seed)
    print(f"data: {len(x_train)} training and {len(x_test)} held-out digits, 1×8×8 images, 10 classes")

    mn.manual_seed(args.seed)
    model = ViT(dim=args.dim, mlp=2 * args.dim, layers=args.layers)
    start = time.perf_counter()
    program = mn.compile(
        model,
        loss=loss_fn,
        inputs={"x": mn.f32[args.batch, 1, 8, 8], "y": mn.i32[args.batch]},
        optimizer=optim.AdamW(lr=args.lr, weight_decay=0.05),
    )
    model.eval()
    predict = mn.compile(model, inputs={"x": mn.f32[len(x_test), 1, 8, 8]})
    model.train()
    print(f"compiled in {time.perf_counter() - start:.2f} s\n\n{program.report().summary()}\n")

    rng = np.random.default_rng(args.seed)
    steps_per_epoch = len(x_train) // args.batch
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(len(x_train))
        losses = []
        for step in range(steps_per_epoch):
            batch = order[step * args.batch : (step + 1) * args.batch]
            losses.append(program.train_step(x=x_train[batch], y=y_train[batch]))
        accuracy = float((predict(x=x_test).argmax(axis=1) == y_test).mean())
        print(
            f"epoch {epoch:3d}  loss {np.mean(losses):.4f}  held-out accuracy {accuracy:.3f}"
            f"  ({time.perf_counter() - start:.1f} s)"
        )


if __name__ == "__main__":
    main()
