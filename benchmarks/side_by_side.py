"""What the side-by-side benchmarks share: timing a training step, and the same step in PyTorch.

Both sides read the loss back every step (ours returns it from `train_step`; PyTorch's
`loss.item()` synchronises), so a step is timed from submission to a result on the host.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def seconds_per_step(step: Callable[[], object], steps: int, warmup: int = 3) -> float:
    """Mean wall time of `step()` over `steps` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def torch_seconds_per_step(build_model, make_optimizer, x: np.ndarray, y: np.ndarray, steps: int):
    """(seconds per cross-entropy training step, device) in PyTorch, fp32 (TF32 off, as our kernels
    compute), on CUDA when there is one; None when torch is not installed. `build_model(torch)`
    returns the torch.nn model, `make_optimizer(torch, parameters)` its optimizer."""
    try:
        import torch
    except ImportError:
        return None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build_model(torch).to(device)
    optimizer = make_optimizer(torch, model.parameters())
    tx = torch.tensor(x, device=device)
    ty = torch.tensor(y, device=device, dtype=torch.long)

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        optimizer.step()
        return loss.item()

    return seconds_per_step(step, steps), device


def print_side_by_side(ours: float, reference) -> None:
    """Our time per step, PyTorch's (when measured) and the ratio."""
    print(f"meganeura: {1000 * ours:.3f} ms/step")
    if reference is not None:
        theirs, device = reference
        print(f"pytorch ({device}, fp32): {1000 * theirs:.3f} ms/step")
        print(f"ratio meganeura/pytorch: {ours / theirs:.2f}")
