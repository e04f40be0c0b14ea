"""What a horizontal fusion of the products that share an input would give the SmolLM2 step, before
writing the rule: the step as written (q, k and v projections, gate and up projections, each its
own Linear) against the same model with those products written as one product of the
concatenated weights, sliced after (the graph such a rule would produce), one process.

    python benchmarks/merged_projections.py [base,qkv,qkv+gateup] [--small]

Each variant compiles the bench's SmolLM2 step afresh (new initial weights) and prints what
`python -m meganeura bench --no-torch` prints for it: the median step, one profiled step's GPU
time as one pass, dispatches, and the costliest kernels.

On the H200, 2026-12-03 16:47 UTC (tree bc46ed0; these variants, run from a scratch copy of
this file): base 74.27 ms a step (GPU one pass 72.85, 2300 dispatches); q/k/v as one product 73.64
(72.36, 2180): its 2048x576x960 products ran at 24.5-25.5 TFLOP/s (the three it replaced: 15-24);
q/k/v and gate/up 75.67 (74.17): the merged gate/up products together took about 0.7 ms a step
less than the six before (forward 2048x576x3072 6.14 ms, weight gradient 3072x2048x576 Aᵀ 6.90,
input gradient 2048x3072x576 Bᵀ 7.39), and the concat of their gradients (0.77 ms) and the plan
around the slices lost more. Not worth a rule while the kernels run the merged shapes hardly
faster.
"""

from __future__ import annotations

import math
import sys

import numpy as np

import meganeura as mn
from meganeura import functional as F
from meganeura.bench import models, workloads
from meganeura.bench.harness import run_ours

WRITTEN = models.LlamaAttention.forward, models.LlamaMLP.forward


def merged_attention(self, x, cos, sin):
    """LlamaAttention.forward with q, k and v one product of the concatenated weights."""
    batch, seq, _ = x.shape
    nq, nk = self.heads * self.head_dim, self.kv_heads * self.head_dim
    y = F.linear(x, mn.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight], 0))
    q = y[:, :, :nq].reshape(batch, seq, self.heads, self.head_dim).transpose(1, 2)
    k = y[:, :, nq : nq + nk].reshape(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
    v = y[:, :, nq + nk :].reshape(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
    q, k = q * cos + models.rotate_half(q) * sin, k * cos + models.rotate_half(k) * sin
    group = self.heads // self.kv_heads
    k, v = models.repeat_kv(k, group), models.repeat_kv(v, group)
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(self.head_dim)) + mn.causal_mask(seq)
    out = F.softmax(scores, dim=-1) @ v
    return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


def merged_mlp(self, x):
    """LlamaMLP.forward with gate and up one product of the concatenated weights."""
    hidden = self.gate_proj.weight.shape[0]
    y = F.linear(x, mn.cat([self.gate_proj.weight, self.up_proj.weight], 0))
    return self.down_proj(F.silu(y[:, :, :hidden]) * y[:, :, hidden:])


VARIANTS = {
    "base": WRITTEN,
    "qkv": (merged_attention, WRITTEN[1]),
    "qkv+gateup": (merged_attention, merged_mlp),
}


def main() -> None:
    small = "--small" in sys.argv
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    for name in names[0].split(",") if names else VARIANTS:
        models.LlamaAttention.forward, models.LlamaMLP.forward = VARIANTS[name]
        try:
            step = workloads.STEPS["smollm2"].build(small=small)
            result = run_ours(step, step.batch(np.random.default_rng(0)), 5 if small else 20, 5)
        finally:
            models.LlamaAttention.forward, models.LlamaMLP.forward = WRITTEN
        print(
            f"== {name}: {result.ours_ms:.3f} ms a step, GPU {result.gpu_pass_ms} ms as one pass, "
            f"{result.dispatches} dispatches, compiled in {result.compile_s:.1f} s, losses {result.ours_losses}"
        )
        for kernel in (result.top_kernels or [])[:25]:
            print(f"   {kernel.kind[:110]:110s} {kernel.count:4d} {kernel.ms:7.3f} ms {kernel.tflops:6.2f}")


if __name__ == "__main__":
    main()
