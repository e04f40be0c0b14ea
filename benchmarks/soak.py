"""A long run of the example MLP: resident memory, live wgpu objects and step time, every window.

    python benchmarks/soak.py [--steps 10000] [--window 500] [--warmup 1000]

The model, batch and optimizer are examples/mlp_digits.py's (64-128-10, batch 32, Adam lr 1e-3),
on random batches (the data does not matter here). Every `window` steps it prints the process's
resident set (VmRSS), the live wgpu buffers, bind groups and command encoders
(`wgpu.diagnostics.object_counts`) and the window's ms per step. After `warmup` steps the run
should be flat: the verdict at the end compares the windows after warm-up: resident memory and object counts
of the first and last (growth), and the medians of the two halves' step times.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import wgpu

import meganeura as mn
import meganeura.functional as F
from meganeura import nn, optim
from meganeura.runtime import default_device

WATCHED = ("Buffer", "BindGroup", "CommandEncoder", "ComputePipeline", "ShaderModule")


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(64, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def loss_fn(model, x, y):
    return F.cross_entropy(model(x), y)


def resident_mb() -> float:
    """This process's resident set in MB (Linux /proc)."""
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def object_counts() -> dict[str, int]:
    counts = wgpu.diagnostics.object_counts.get_dict()
    return {name: counts.get(name, {}).get("count", 0) for name in WATCHED}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=1000)
    args = parser.parse_args()
    print(f"adapter: {default_device().describe()}")
    mn.manual_seed(0)
    program = mn.compile(MLP(), loss_fn, {"x": mn.f32[32, 64], "y": mn.i32[32]}, optim.Adam(lr=1e-3))
    rng = np.random.default_rng(0)
    batches = [
        {"x": rng.random((32, 64), dtype=np.float32), "y": rng.integers(0, 10, 32).astype(np.int32)} for _ in range(16)
    ]
    rows = []
    print(f"{'steps':>7} {'RSS MB':>8} " + " ".join(f"{name:>15}" for name in WATCHED) + f" {'ms/step':>8}")
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        loss = program.train_step(**batches[step % len(batches)])
        if step % args.window == 0:
            now = time.perf_counter()
            row = {"steps": step, "rss": resident_mb(), **object_counts(), "ms": (now - start) / args.window * 1e3}
            rows.append(row)
            counts = " ".join(f"{row[name]:>15d}" for name in WATCHED)
            print(f"{step:>7d} {row['rss']:>8.1f} {counts} {row['ms']:>8.3f}   loss {loss:.4f}", flush=True)
            start = time.perf_counter()
    after = [row for row in rows if row["steps"] > args.warmup]
    if len(after) < 2:
        print("too few windows after warm-up for a verdict")
        return
    first, last = after[0], after[-1]
    growth = {name: last[name] - first[name] for name in WATCHED if last[name] != first[name]}
    half = len(after) // 2  # windows are noisy: compare the medians of the two halves
    early, late = np.median([r["ms"] for r in after[:half]]), np.median([r["ms"] for r in after[half:]])
    print(
        f"after warm-up ({first['steps']} → {last['steps']} steps): resident memory "
        f"{last['rss'] - first['rss']:+.1f} MB, objects {growth or 'unchanged'}, "
        f"ms per step (median of each half) {early:.3f} → {late:.3f} (×{late / early:.2f})"
    )


if __name__ == "__main__":
    main()
