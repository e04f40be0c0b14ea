"""Command line: `python -m meganeura explain [--out DIR] [--wgsl] SCRIPT [ARGS...]` and
`python -m meganeura profile [--trace FILE] SCRIPT [ARGS...]`.

explain runs SCRIPT until it first asks a compiled program to run (nothing runs on the GPU, no device
is opened), prints the report of every program it compiled — the rewrites the e-graph chose,
costs, e-graph figures, kernels with the source lines they cover — and writes each step graph
as DOT, and as SVG when Graphviz's `dot` is installed. With `--wgsl`, it also prints the WGSL of
every kernel, in the order they run. Plans are made for the generic target
(`meganeura.target.GENERIC`); a run on a device plans for that device.

profile runs SCRIPT on the device with MEGANEURA_TRACE set: the first program to reach its 4th
step times every kernel of that step with GPU timestamps, prints the time by kernel kind (count,
time, share, GB/s, TFLOP/s) and the slowest kernels with their source lines, and writes a
Chrome trace (open it in https://ui.perfetto.dev). See meganeura/runtime/profile.py.

bench runs our training step and PyTorch's side by side on the same GPU, same model, same initial
weights and batch, and GEMM alone (`python -m meganeura bench --help` lists the workloads; see
meganeura/bench/cli.py).
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import subprocess
import sys

from meganeura import compiler
from meganeura.bench import cli as bench_cli


def explain(script: str, script_args: list[str], out_dir: str, wgsl: bool = False) -> int:
    """Trace and optimise the programs `script` compiles; print their reports; write pictures."""
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    with compiler.explain_only() as programs:
        try:
            runpy.run_path(script, run_name="__main__")
        except compiler.StopExplain:
            pass
    if not programs:
        print(f"{script} compiled no program (mn.compile was never called)", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(script))[0]
    for index, program in enumerate(programs):
        kind = "training step" if program.is_training else "inference"
        print(f"=== program {index}: {kind}, inputs {', '.join(f'{k}: {v}' for k, v in program.inputs.items())}")
        target = program.compilation.target
        units, buffers = target.compute_units, target.max_storage_buffers
        print(f"planned for {target.name}: {units} compute units, {buffers} buffers per kernel")
        report = program.report()
        print(report)
        print()
        if wgsl:
            print(f"--- WGSL of program {index}: {len(program.compiled.kernels)} kernels, in the order they run")
            print(program.compiled.wgsl())
            print()
        dot_path = os.path.join(out_dir, f"{stem}-{index}.dot")
        with open(dot_path, "w") as file:
            file.write(report.to_dot())
        print(f"wrote {dot_path}")
        if shutil.which("dot"):
            svg_path = dot_path[:-4] + ".svg"
            subprocess.run(["dot", "-Tsvg", dot_path, "-o", svg_path], check=True)
            print(f"wrote {svg_path}")
        else:
            print("(install Graphviz for an SVG: `dot` was not found)")
        print()
    return 0


def profile(script: str, script_args: list[str], trace: str) -> int:
    """Run `script` with MEGANEURA_TRACE=`trace` (the runtime prints the table and writes the trace)."""
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    os.environ["MEGANEURA_TRACE"] = trace
    runpy.run_path(script, run_name="__main__")
    if not compiler._TRACED:
        steps = compiler.TRACE_AFTER + 1
        print(f"{script}: no program ran {steps} steps, so no step was profiled", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meganeura", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    explain_parser = commands.add_parser("explain", help="print the compile report of a model script")
    explain_parser.add_argument("script")
    explain_parser.add_argument("--out", default="out/explain", help="folder for the .dot/.svg files")
    explain_parser.add_argument("--wgsl", action="store_true", help="also print every kernel's WGSL")
    explain_parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    profile_parser = commands.add_parser("profile", help="time every kernel of a model script's step on the GPU")
    profile_parser.add_argument("script")
    profile_parser.add_argument("--trace", default="trace.json", help="where to write the Chrome trace")
    profile_parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    bench_parser = commands.add_parser(
        "bench",
        help="time our training step against PyTorch's on the same GPU, same weights and batch",
        description="Our training step and PyTorch's side by side (meganeura/bench/cli.py).",
        epilog=bench_cli.workload_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench_cli.add_arguments(bench_parser)
    options = parser.parse_args(argv)
    if options.command == "bench":
        return bench_cli.run(options, bench_parser)
    if options.command == "profile":
        return profile(options.script, options.args, options.trace)
    return explain(options.script, options.args, options.out, options.wgsl)


if __name__ == "__main__":
    sys.exit(main())
