"""Plan variants of whole training steps, side by side in one process: each variant sets module
attributes (a tuning constant, a table entry, a rule function), compiles the bench's steps again
and profiles one step of each; it prints the profiled step's GPU time and the kernels whose time
moved against the first variant.

    PYTHONPATH=. python benchmarks/plan_ab.py [--workloads smollm2,gpt2] [--steps 3] [--moved 0.15]
        --variant base= \\
        --variant "fine24=meganeura.codegen.matmul.FINE_FILL=24" \\
        --variant "kv128=meganeura.codegen.attention_tiles.CHOSEN[
            ('hopper','attention_grad_kv',64)]=Tiles(32,32,128,True)"  (on one line)

A variant is NAME=ASSIGNMENTS, the assignments `;`-separated (so no `;` in an expression), each
`module.attribute=expression` or `module.attribute[key]=expression`, the expression evaluated in
that module's namespace (its names, `lambda`s over them and its imports are there; a lambda that
calls the attribute it replaces sees itself). Every variant starts from the original values: each
is undone before the next. Why in one process: the device's pipelines are cached by their WGSL
text, so a variant compiles only its own kernels (15-30 s a SmolLM2 variant on the H200, against
about 130 s for a `python -m meganeura bench smollm2 --no-torch` process), and the GPU time of
one profiled step repeats to a few hundredths of a millisecond between two runs of one variant
(SmolLM2 91.10 and 91.12 ms, 2026-12-02) where a step's wall time moves by milliseconds, and
where kernels timed alone (benchmarks/gemm_tune.py) drift through a sweep.

Each variant's workload is built afresh (new initial weights: the losses printed differ by that,
not by the variant). Our side only: `python -m meganeura bench` measures against PyTorch.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import re
import time
from dataclasses import dataclass

import numpy as np

from meganeura.bench.harness import run_ours
from meganeura.bench.report import label_share, share_line
from meganeura.bench.workloads import STEPS

TARGET = re.compile(r"^(?P<module>[A-Za-z_][\w.]*)\.(?P<attr>[A-Za-z_]\w*)(?:\[(?P<key>.+)\])?$")


@dataclass(frozen=True)
class Assignment:
    """`module.attr = expression`, or `module.attr[key] = expression`."""

    module: str
    attr: str
    key: str | None
    expression: str

    def apply(self) -> tuple:
        """Set the value; returns what undoes it."""
        module = importlib.import_module(self.module)
        namespace = vars(module)
        value = eval(self.expression, namespace)  # noqa: S307 - the command line's own code
        if self.key is None:
            previous = getattr(module, self.attr)
            setattr(module, self.attr, value)
            return (module, self.attr, None, previous)
        container = getattr(module, self.attr)
        key = eval(self.key, namespace)  # noqa: S307
        previous = container[key] if key in container else _MISSING
        container[key] = value
        return (module, self.attr, key, previous)


_MISSING = object()


def undo(record: tuple) -> None:
    module, attr, key, previous = record
    if key is None:
        setattr(module, attr, previous)
    elif previous is _MISSING:
        del getattr(module, attr)[key]
    else:
        getattr(module, attr)[key] = previous


def parse_variant(text: str) -> tuple[str, list[Assignment]]:
    """NAME=ASSIGNMENTS (see the module docstring) into the name and its assignments."""
    name, _, rest = text.partition("=")
    assignments = []
    for part in filter(None, (p.strip() for p in rest.split(";"))):
        left, sep, expression = part.partition("=")
        match = TARGET.match(left.strip())
        if not sep or match is None:
            raise SystemExit(f"variant {name!r}: {part!r} is not module.attribute[=key]=expression")
        module, attr = match["module"], match["attr"]
        assignments.append(Assignment(module, attr, match["key"], expression.strip()))
    if not name:
        raise SystemExit(f"variant {text!r} has no name")
    return name, assignments


def ms_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def moved_kernels(before: dict[str, float], after: dict[str, float], threshold: float) -> list[str]:
    """Lines for the kernels (by label, of the 40 costliest of each side) whose ms a step moved by
    more than `threshold`, or that only one side has."""
    lines = []
    for label in sorted(set(before) | set(after), key=lambda k: -max(before.get(k, 0.0), after.get(k, 0.0))):
        a, b = before.get(label), after.get(label)
        if a is None or b is None or abs(a - b) > threshold:
            lines.append(f"    {label[:100]:<100} {ms_text(a)} -> {ms_text(b)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="smollm2,gpt2", help=f"any of {', '.join(STEPS)}")
    parser.add_argument("--variant", action="append", required=True, help="NAME=module.attr=expression;…")
    parser.add_argument("--steps", type=int, default=3, help="timed steps before the profiled one")
    parser.add_argument("--moved", type=float, default=0.15, help="ms a step: report kernels that moved more")
    parser.add_argument("--small", action="store_true", help="the workloads' small sizes (a smoke test on lavapipe)")
    parser.add_argument("--share", help="a regex: print the ms and step share of the kernels whose label matches")
    args = parser.parse_args()
    variants = [parse_variant(text) for text in args.variant]
    for workload_name in args.workloads.split(","):
        first: dict[str, float] | None = None
        for name, assignments in variants:
            records = [a.apply() for a in assignments]
            try:
                started = time.perf_counter()
                workload = STEPS[workload_name].build(small=args.small)
                batch = workload.batch(np.random.default_rng(0))
                result = run_ours(workload, batch, args.steps, 2)
            finally:
                for record in reversed(records):
                    undo(record)
            kernels = {row.kind: row.ms for row in result.top_kernels}
            gpu = f"{result.gpu_ms:.2f} ms GPU" if result.gpu_ms else "no timestamps"
            gpu += f" ({result.gpu_pass_ms:.2f} as one pass)" if result.gpu_pass_ms else ""
            print(
                f"{workload_name} {name:<20} {gpu}, wall {result.ours_ms:.1f} ms, losses "
                f"{[round(x, 6) for x in result.ours_losses]} ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
            if args.share and result.gpu_ms:  # over every kernel, not only the top ones
                print(share_line(args.share, label_share(args.share, result.label_ms, result.gpu_ms)), flush=True)
            if first is None:
                first = kernels
            else:
                print("\n".join(moved_kernels(first, kernels, args.moved)), flush=True)
            del workload, batch, result
            gc.collect()


if __name__ == "__main__":
    main()
