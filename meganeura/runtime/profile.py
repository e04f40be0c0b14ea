"""GPU time per kernel: what `Executable.profile` measured, as a table by kernel kind and as a
Chrome trace (Perfetto and chrome://tracing open it).

A profiled step runs like any other (same kernels, same buffers, same results), except that
every dispatch gets a compute pass of its own whose start and end write GPU timestamps (the
adapter's `timestamp-query` feature: values in nanoseconds). A query set holds at most 4096
queries, so a step of more than 2048 dispatches uses several. One pass per dispatch adds a
little time per kernel compared with a normal step, where all of them share one pass:
`Program.profile` also times its last warm-up step as one pass (`Profile.step_ns`, from
`Executable.timed_run`), the GPU time a normal step takes; shares are of the kernels' sum.

Each kernel is named by its op and what it fuses (the KernelSpec's label) and the user's
source lines it covers; its bytes and flops are the cost model's (`rewrite/cost.py`: bytes
read and written, matmul flops), from which the table gives the achieved GB/s and TFLOP/s.
GPU clocks idle low: profile after a few warm-up steps (`Program.profile` does).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

MAX_QUERIES = 4096  # per query set (WebGPU's limit)
DISPATCHES_PER_SET = MAX_QUERIES // 2


@dataclass(frozen=True)
class KernelTime:
    """One dispatch of a profiled step."""

    node: int  # the IR node of the fused graph it computes
    kind: str  # its op: fused_matmul, pointwise, attention, …
    label: str  # what it computes, e.g. "fused_matmul 32x64x128 Bᵀ relu(add($acc,$0))"
    sources: tuple[str, ...]  # the user's source lines it covers
    start_ns: int  # from the start of the step's first kernel
    ns: int
    bytes: int  # read and written, as the cost model counts them
    flops: int


@dataclass(frozen=True)
class KindRow:
    """All the kernels of one kind (or of one label, `Profile.by_label`) in a profiled step."""

    kind: str
    count: int
    ns: int
    share: float
    bytes: int
    flops: int

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.ns if self.ns else 0.0  # bytes per ns = GB/s

    @property
    def tflop_per_s(self) -> float:
        return self.flops / self.ns / 1000 if self.ns else 0.0


@dataclass(frozen=True)
class Profile:
    """The kernels of one profiled step, in the order they ran.

    >>> # profile = program.profile(x=xb, y=yb); print(profile); profile.write_chrome_trace("trace.json")
    """

    adapter: str
    kernels: tuple[KernelTime, ...]
    step_ns: int | None = None  # a step's GPU time as one pass (the last warm-up step's), where timed

    @property
    def total_ns(self) -> int:
        """The sum of the kernels' times (the gaps between passes left out)."""
        return sum(k.ns for k in self.kernels)

    def by_kind(self) -> list[KindRow]:
        """One row per kernel kind, the most time first."""
        return self.grouped(lambda kernel: kernel.kind)

    def by_label(self) -> list[KindRow]:
        """One row per distinct kernel (its label: shape, transposes, what it fuses), the most time
        first: where a step runs the same kernel in every layer, this is the table to tune from."""
        return self.grouped(lambda kernel: kernel.label)

    def grouped(self, key) -> list[KindRow]:
        groups: dict[str, list[KernelTime]] = defaultdict(list)
        for kernel in self.kernels:
            groups[key(kernel)].append(kernel)
        total = self.total_ns or 1
        rows = [
            KindRow(
                name,
                len(ks),
                sum(k.ns for k in ks),
                sum(k.ns for k in ks) / total,
                sum(k.bytes for k in ks),
                sum(k.flops for k in ks),
            )
            for name, ks in groups.items()
        ]
        return sorted(rows, key=lambda row: -row.ns)

    def slowest(self, count: int = 10) -> list[KernelTime]:
        """The `count` kernels that took longest."""
        return sorted(self.kernels, key=lambda k: -k.ns)[:count]

    def table(self, top: int = 10) -> str:
        """The time by kernel kind, then the slowest kernels with their source lines."""
        one_pass = f"; {self.step_ns / 1e6:.3f} ms as one pass" if self.step_ns else ""
        lines = [
            f"GPU time of one step on {self.adapter}: {self.total_ns / 1e6:.3f} ms in {len(self.kernels)} "
            f"dispatches, timed a pass each{one_pass}",
            f"  {'kind':<24} {'count':>6} {'ms':>10} {'share':>7} {'GB/s':>9} {'TFLOP/s':>8}",
        ]
        for row in self.by_kind():
            lines.append(
                f"  {row.kind:<24} {row.count:>6} {row.ns / 1e6:>10.3f} {100 * row.share:>6.1f}% "
                f"{row.gb_per_s:>9.1f} {row.tflop_per_s:>8.2f}"
            )
        lines.append(f"  slowest {min(top, len(self.kernels))} kernels:")
        for kernel in self.slowest(top):
            where = ", ".join(kernel.sources[:3]) + (" …" if len(kernel.sources) > 3 else "")
            lines.append(f"    {kernel.ns / 1e6:>9.3f} ms  %{kernel.node:<5} {kernel.label[:70]}  [{where}]")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def chrome_trace(self) -> dict:
        """The step as Chrome trace events: one complete event ("X") per kernel, times in µs."""
        events = [
            {
                "name": kernel.label,
                "cat": kernel.kind,
                "ph": "X",
                "ts": kernel.start_ns / 1000,
                "dur": kernel.ns / 1000,
                "pid": 0,
                "tid": 0,
                "args": {
                    "node": kernel.node,
                    "sources": list(kernel.sources),
                    "bytes": kernel.bytes,
                    "flops": kernel.flops,
                },
            }
            for kernel in self.kernels
        ]
        process = {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": f"meganeura on {self.adapter}"}}
        return {"traceEvents": [process, *events], "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str) -> None:
        """Write `chrome_trace()` as JSON to `path`."""
        with open(path, "w") as file:
            json.dump(self.chrome_trace(), file)


def kernel_times(kernels: list[tuple], stamps: list[int]) -> tuple[KernelTime, ...]:
    """KernelTimes from (node, kind, label, sources, bytes, flops) per dispatch and the
    timestamps written at the start and end of each one's pass."""
    origin = stamps[0] if stamps else 0
    times = []
    for index, (node, kind, label, sources, nbytes, flops) in enumerate(kernels):
        start, end = stamps[2 * index], stamps[2 * index + 1]
        times.append(KernelTime(node, kind, label, sources, start - origin, max(0, end - start), nbytes, flops))
    return tuple(times)
