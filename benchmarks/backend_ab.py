"""Our steps on one backend, for side-by-side runs of the backends in turn (runtime/backend.py):

    for b in wgpu dawn; do python benchmarks/backend_ab.py $b smollm2,gpt2,resnet18; done
    python benchmarks/backend_ab.py dawn+disable_robustness smollm2   (Dawn device toggles after +)

Per workload, as `python -m meganeura bench --no-torch` measures it (bench/harness.py `run_ours`):
the first losses (which should agree across backends to the bit), the median wall time of 20
steps, and one profiled step (the GPU time as one pass, and the sum of a pass per kernel, which
reads high on Dawn). What bench cannot do is set Dawn's device toggles. The records, each
kernel's time by label included, go to $OUT/backend_ab_<backend>.json. Our side only.
"""

from __future__ import annotations

import json
import os
import sys

backend, *toggles = sys.argv[1].split("+")
os.environ["MEGANEURA_BACKEND"] = backend  # before meganeura picks its backend at import

import numpy as np  # noqa: E402

from meganeura.bench.harness import run_ours  # noqa: E402
from meganeura.bench.workloads import STEPS  # noqa: E402
from meganeura.runtime import device  # noqa: E402

device.DAWN_ENABLE = tuple(toggles)
records = {}
for name in sys.argv[2].split(","):
    workload = STEPS[name].build()
    result = run_ours(workload, workload.batch(np.random.default_rng(0)), steps=20, warmup=5)
    records[name] = {**result.as_dict(), "adapter": device.default_device().describe(), "label_ms": result.label_ms}
    print(
        f"{sys.argv[1]} {name} on {records[name]['adapter']}: GPU one pass {result.gpu_pass_ms or 0:.2f} ms "
        f"(a pass per kernel {result.gpu_ms or 0:.2f}), wall {result.ours_ms:.2f} ms, "
        f"losses {[round(float(x), 7) for x in result.ours_losses]} (compile {result.compile_s:.1f} s)",
        flush=True,
    )
    with open(os.path.join(os.environ.get("OUT", "."), f"backend_ab_{sys.argv[1].replace('+', '_')}.json"), "w") as f:
        json.dump(records, f)
