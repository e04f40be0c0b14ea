"""Our steps on one backend, for side-by-side runs of the backends in turn (runtime/backend.py):

    for b in wgpu dawn; do python benchmarks/backend_ab.py $b smollm2,gpt2,resnet18; done
    python benchmarks/backend_ab.py dawn+disable_robustness smollm2   (Dawn device toggles after +)

Per workload: compile and 3 steps (their losses, which should agree across backends to the bit),
the median wall time of 20 steps, and one profiled step (`Program.profile`: the GPU time as one
pass, and the sum of a pass per kernel, which reads high on Dawn). `--json`-like records go to
$OUT/backend_ab_<backend>.json, kernel times by label included. Our side only.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from collections import defaultdict

backend, *toggles = sys.argv[1].split("+")
os.environ["MEGANEURA_BACKEND"] = backend  # before meganeura picks its backend at import

import numpy as np  # noqa: E402

import meganeura as mn  # noqa: E402
from meganeura.bench.workloads import STEPS  # noqa: E402
from meganeura.runtime import device  # noqa: E402

device.DAWN_ENABLE = tuple(toggles)
records = {}
for name in sys.argv[2].split(","):
    workload = STEPS[name].build()
    batch = workload.batch(np.random.default_rng(0))
    start = time.perf_counter()
    program = mn.compile(workload.model, loss=workload.loss, inputs=workload.inputs, optimizer=workload.optimizer)
    losses = [float(program.train_step(**batch)) for _ in range(3)]
    seconds = time.perf_counter() - start
    walls = []
    for _ in range(20):
        begin = time.perf_counter()
        program.train_step(**batch)
        walls.append(time.perf_counter() - begin)
    profile = program.profile(warmup=2, **batch)
    labels = defaultdict(lambda: [0, 0, 0])  # label -> [dispatches, ns, flops]
    for kernel in profile.kernels:
        row = labels[kernel.label]
        row[0], row[1], row[2] = row[0] + 1, row[1] + kernel.ns, row[2] + kernel.flops
    records[name] = {
        "adapter": device.default_device().describe(),
        "pass_ms": (profile.step_ns or 0) / 1e6,
        "per_kernel_ms": profile.total_ns / 1e6,
        "wall_ms": 1e3 * float(np.median(walls)),
        "losses": losses,
        "labels": dict(labels),
    }
    print(
        f"{sys.argv[1]} {name} on {records[name]['adapter']}: GPU one pass {records[name]['pass_ms']:.2f} ms "
        f"(a pass per kernel {records[name]['per_kernel_ms']:.2f}), wall {records[name]['wall_ms']:.2f} ms, "
        f"losses {[round(x, 7) for x in losses]} (compile and 3 steps {seconds:.0f} s)",
        flush=True,
    )
    del program, profile, workload, batch
    gc.collect()
    with open(os.path.join(os.environ.get("OUT", "."), f"backend_ab_{sys.argv[1].replace('+', '_')}.json"), "w") as f:
        json.dump(records, f)
