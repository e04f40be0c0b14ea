"""`python -m meganeura bench [workload ...]`: our training step and PyTorch's side by side in one
process on the same GPU, same model, same initial weights and batch (meganeura/bench/harness.py),
and GEMM alone (meganeura/bench/gemm.py).

Options: --steps (timed steps, medians; ≥ 20 for a result worth quoting), --warmup, --small (every
workload at a size that runs in seconds on lavapipe), --torch-compile (adds torch.compile: it
compiles for minutes), --no-torch, --json FILE, --markdown, --repeat and --gemm-shapes (GEMM).
A workload that raises is printed with its traceback and the others still run; the JSON file is
rewritten after every workload (a run stopped part way keeps what it measured). The exit status
is 1 when a workload raised, a mirror's checked loss differs from ours or a GEMM result is wrong.
When `<name>` and `<name>-dropout` both ran (gpt2 and gpt2-dropout), what dropout adds to the step
is printed, ours and PyTorch's, and recorded (`dropout_cost`).
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import traceback

from meganeura.bench import gemm as gemm_bench
from meganeura.bench.harness import preload_torch, run_step_workload
from meganeura.bench.report import (
    dropout_costs,
    dropout_text,
    gemm_text,
    header,
    label_share,
    markdown,
    settings_text,
    source_digest,
    step_text,
)
from meganeura.bench.workloads import STEPS

GEMM = "gemm"
ALL = "all"


def workload_names() -> list[str]:
    return [*STEPS, GEMM]


def workload_help() -> str:
    lines = ["workloads:"]
    for name, step in STEPS.items():
        lines.append(f"  {name:<12} {step.summary}")
    lines.append(f"  {GEMM:<12} GEMM alone: 4096³, 8192×768×3072 and the LM's 2048×576×1536, 2048×1536×576,")
    lines.append(f"  {'':<12} 2048×576×49152, each with its gradient products G·Bᵀ and Aᵀ·G")
    lines.append(f"  {ALL:<12} every one of them (the default)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workloads", nargs="*", metavar="workload", help=f"any of {', '.join(workload_names())}, {ALL}")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per side (their median is reported)")
    parser.add_argument(
        "--warmup", type=int, default=5, help="untimed steps first (at least 2: the loss check; at least 0.5 s of them)"
    )
    parser.add_argument("--small", action="store_true", help="small sizes: every workload in seconds on lavapipe")
    parser.add_argument("--torch-compile", action="store_true", help="also time torch.compile (compiles for minutes)")
    parser.add_argument("--no-torch", action="store_true", help="our side only")
    parser.add_argument(
        "--torch-threads", type=int, metavar="N", help="torch's CPU threads (without CUDA; default: torch's choice)"
    )
    parser.add_argument("--json", metavar="FILE", help="write every number to FILE")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables (for the README)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=10,
        help="GEMM: products back to back in one timed pass (ours), between two CUDA events (torch)",
    )
    parser.add_argument("--gemm-shapes", metavar="MxKxN,...", help="GEMM: these shapes instead of the defaults")
    parser.add_argument(
        "--source-digest", action="store_true", help="print the digest of this source tree (a JSON record's) and exit"
    )
    parser.add_argument(
        "--share",
        action="append",
        default=[],
        metavar="REGEX",
        help="also print (and record) the ms and step share of the kernels whose label matches REGEX (repeatable)",
    )


def chosen_workloads(parser: argparse.ArgumentParser, names: list[str]) -> list[str]:
    """The workloads named (all by default), in the order given; an unknown name is an error that lists them."""
    if not names or ALL in names:
        return workload_names()
    unknown = [name for name in names if name not in workload_names()]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(workload_names())}, {ALL}")
    return list(dict.fromkeys(names))


def run(options: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if options.source_digest:
        print(source_digest())
        return 0
    names = chosen_workloads(parser, options.workloads)
    if options.steps < 1 or options.warmup < 0 or options.repeat < 1:
        parser.error("--steps and --repeat must be at least 1, --warmup at least 0")
    if options.gemm_shapes:
        try:
            gemm_bench.parse_shapes(options.gemm_shapes)
        except ValueError as error:
            parser.error(str(error))
    for pattern in options.share:
        try:
            re.compile(pattern)
        except re.error as error:
            parser.error(f"--share {pattern!r}: {error}")
    if not options.no_torch:
        preload_torch(options.torch_threads)  # before the device opens: see its comment
    from meganeura.runtime import default_device

    adapter = default_device().describe()
    record = header(adapter, options.steps, max(options.warmup, 2), options.small)
    source = record["source_digest"][:12]
    print(f"adapter: {adapter} ({settings_text(record['settings'])})")
    print(f"{record['torch']}; commit {record['git_commit']}, source {source}")
    if options.steps < 20:
        print(f"(only {options.steps} timed steps: fewer than the 20 a quoted result takes)")
    modes = ("fp32", "bf16", "compile") if options.torch_compile else ("fp32", "bf16")
    steps, gemms, failed, errors = [], [], [], []
    for name in names:
        print(flush=True)
        try:
            if name == GEMM:
                gemms = run_gemm(options)
                print(gemm_text(gemms), flush=True)
                failed += [g.product.label() for g in gemms if g.max_error > gemm_bench.CHECK_RTOL]
            else:
                workload = STEPS[name].build(options.small)
                result = run_step_workload(workload, options.steps, options.warmup, modes, not options.no_torch)
                if result.gpu_ms:  # over every kernel the profiled step ran, not only the top ones
                    result.shares = {p: label_share(p, result.label_ms, result.gpu_ms) for p in options.share}
                steps.append(result)
                print(step_text(result, modes), flush=True)
                if result.torch and not result.mirror_ok:
                    failed.append(f"{name} (the mirror's {result.check} loss)")
        except Exception:  # noqa: BLE001  (printed in full; the other workloads still run)
            traceback.print_exc()
            errors.append({"workload": name, "error": traceback.format_exc(limit=-3)})
            failed.append(f"{name} (raised)")
        gc.collect()
        if options.json:  # after every workload: a run stopped part way keeps what it measured
            write_json(options.json, record, modes, steps, gemms, errors)
    costs = dropout_costs(steps)
    if costs:
        print("\n" + dropout_text(costs))
    if options.markdown:
        print("\n" + markdown(steps, gemms, modes, record))
    if options.json:
        print(f"wrote {options.json}")
    if failed:
        print(f"FAILED checks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def write_json(path: str, record: dict, modes, steps, gemms, errors) -> None:
    data = record | {
        "modes": list(modes),
        "workloads": [r.as_dict() for r in steps],
        "dropout_cost": dropout_costs(steps),
        "gemm": [g.as_dict() for g in gemms],
        "errors": errors,
    }
    with open(path, "w") as file:
        json.dump(data, file, indent=1)


def run_gemm(options: argparse.Namespace) -> list[gemm_bench.GemmResult]:
    if options.gemm_shapes:
        shapes = gemm_bench.parse_shapes(options.gemm_shapes)  # checked in run()
    else:
        shapes = gemm_bench.SMALL_SHAPES if options.small else gemm_bench.SHAPES
    return [gemm_bench.measure(p, options.repeat, not options.no_torch) for p in gemm_bench.products(shapes)]
