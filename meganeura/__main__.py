"""Command line: `python -m meganeura devices | explain | profile | bench` (each with `--help`).

devices lists the adapters wgpu offers, each with its backend, type, features and limits and what
the compiler plans for on it, and marks the one a program runs on by default
(meganeura/runtime/device.py: the high-performance adapter, or the one MEGANEURA_ADAPTER names).
`--all-limits` prints every limit, `--json` everything as JSON.

explain runs SCRIPT until it first asks a compiled program to run (nothing runs on the GPU, no device
is opened), prints the report of every program it compiled — the rewrites the e-graph chose,
costs, e-graph figures, kernels with the source lines they cover. With `--out DIR` it also writes
each step graph there as DOT, and as SVG when Graphviz's `dot` is installed; with `--wgsl`, it
prints the WGSL of every kernel, in the order they run. Plans are made for the generic target
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
import json
import os
import runpy
import shutil
import subprocess
import sys
import textwrap

from meganeura import compiler
from meganeura.bench import cli as bench_cli


def explain(script: str, script_args: list[str], out_dir: str | None, wgsl: bool = False) -> int:
    """Trace and optimise the programs `script` compiles; print their reports; write pictures of
    the step graphs into `out_dir` when one is given (and nothing at all otherwise)."""
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
        if out_dir is not None:
            write_pictures(report, os.path.join(out_dir, f"{stem}-{index}"))
            print()
    if out_dir is None:
        print("(pass --out DIR to write a picture of each step: DOT, and SVG with Graphviz)")
    return 0


def write_pictures(report, path_stem: str) -> None:
    """`path_stem`.dot of the report's step graph, and .svg when Graphviz's `dot` is installed."""
    os.makedirs(os.path.dirname(path_stem) or ".", exist_ok=True)
    dot_path = path_stem + ".dot"
    with open(dot_path, "w") as file:
        file.write(report.to_dot())
    print(f"wrote {dot_path}")
    if shutil.which("dot"):
        svg_path = path_stem + ".svg"
        subprocess.run(["dot", "-Tsvg", dot_path, "-o", svg_path], check=True)
        print(f"wrote {svg_path}")
    else:
        print("(install Graphviz for an SVG: `dot` was not found)")


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


# The limits the compiler relies on or raises (runtime/device.py's RAISED_LIMITS and these two),
# printed by `devices` unless --all-limits asks for every one.
SIZE_LIMITS = ("max-buffer-size", "max-storage-buffer-binding-size", "max-compute-workgroup-storage-size")


def adapter_record(adapter, chosen: bool) -> dict:
    """One adapter as plain data: its info, features, limits, target and whether it is the default."""
    from meganeura.runtime.device import adapter_name
    from meganeura.target import target_for

    info = dict(adapter.info)
    limits = dict(adapter.limits)
    target = target_for(adapter_name(adapter), info.get("adapter_type", ""), limits)
    return {
        "name": adapter_name(adapter),
        "backend": info.get("backend_type"),
        "type": info.get("adapter_type"),
        "vendor": info.get("vendor"),
        "driver": info.get("description"),
        "default": chosen,
        "features": sorted(adapter.features),
        "limits": limits,
        "target": {
            "compute_units": target.compute_units,
            "max_storage_buffers": target.max_storage_buffers,
            "cpu": target.cpu,
            "tuning": target.tuning,
            "workgroup_memory": target.workgroup_memory,
        },
    }


def default_adapter_info():
    """The info of the adapter programs run on by default, and why that one (or None and the error
    that says why there is none)."""
    from meganeura.runtime.device import ADAPTER_ENV, select_adapter

    wanted = os.environ.get(ADAPTER_ENV, "").strip()
    try:
        chosen = select_adapter()
    except RuntimeError as error:
        return None, str(error)
    reason = (
        f"{ADAPTER_ENV}={wanted!r}" if wanted else f"wgpu's high-performance adapter; set {ADAPTER_ENV} for another"
    )
    return dict(chosen.info), reason


def limit_text(name: str, value: int) -> str:
    if name in SIZE_LIMITS or name.endswith("-size") and value >= 1024:
        for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value >= scale:
                return f"{value / scale:g} {unit}" if value % scale == 0 else f"{value:,} B"
    return f"{value:,}"


def adapter_text(index: int, record: dict, all_limits: bool, reason: str) -> str:
    from meganeura.runtime.device import RAISED_LIMITS

    target = record["target"]
    lines = [
        f"{'*' if record['default'] else ' '} {index}  {record['name']}",
        f"     backend {record['backend']}, type {record['type']}, vendor {record['vendor'] or '-'}, "
        f"driver {record['driver'] or '-'}",
    ]
    if record["default"]:
        lines.append(f"     default: {reason}")
    lines.append(
        f"     plans for: {target['compute_units']} compute units, {target['max_storage_buffers']} storage buffers "
        f"and {target['workgroup_memory']} bytes of workgroup memory per kernel, tuning {target['tuning']}"
        + (", CPU kernels" if target["cpu"] else "")
    )
    lines.append(wrapped(f"features ({len(record['features'])})", record["features"] or ["none"]))
    names = sorted(record["limits"]) if all_limits else [n for n in RAISED_LIMITS if n in record["limits"]]
    limits = [f"{n} {limit_text(n, record['limits'][n])}" for n in names]
    lines.append(wrapped("limits" if all_limits else "limits (those meganeura raises)", limits))
    return "\n".join(lines)


def wrapped(label: str, items: list[str]) -> str:
    """`label: a, b, c…` indented under an adapter and wrapped at 100 columns, names unbroken."""
    return textwrap.fill(
        ", ".join(items),
        width=100,
        initial_indent=f"     {label}: ",
        subsequent_indent="       ",
        break_on_hyphens=False,
        break_long_words=False,
    )


def devices(all_limits: bool = False, as_json: bool = False) -> int:
    """Print every adapter the backend offers, the default marked; 1 when there is no default."""
    from meganeura.runtime.backend import wgpu

    adapters = wgpu.gpu.enumerate_adapters_sync()
    default, reason = default_adapter_info()
    records = [adapter_record(a, default is not None and dict(a.info) == default) for a in adapters]
    if as_json:
        print(
            json.dumps(
                {
                    "adapters": records,
                    "default_reason": reason if default else None,
                    "error": None if default else reason,
                },
                indent=1,
            )
        )
    else:
        package = f"{wgpu.__name__} {wgpu.__version__}"
        print(f"{len(records)} adapter{'s' * (len(records) != 1)} ({package}); * marks the default")
        for index, record in enumerate(records):
            print(adapter_text(index, record, all_limits, reason))
    if default is None:
        print(f"no default adapter: {reason}", file=sys.stderr)
        return 1
    if not any(r["default"] for r in records):  # wgpu chose one it does not enumerate
        print(f"the default adapter is not in this list: {default}", file=sys.stderr)
    return 0


def parser_of() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line's parser, and its bench subparser (bench_cli.run reports errors through it)."""
    parser = argparse.ArgumentParser(
        prog="python -m meganeura",
        description="meganeura's command line: list the adapters, explain, profile or benchmark a model.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{devices,explain,profile,bench}")
    devices_parser = commands.add_parser(
        "devices",
        help="list the adapters with their backend, features and limits; * marks the default",
        description="The adapters the WebGPU backend offers (wgpu-native, or Dawn under MEGANEURA_BACKEND=dawn), "
        "each with its backend, type, features, limits and what the compiler plans for on it; * marks the one "
        "programs run on by default (the high-performance adapter, or the one MEGANEURA_ADAPTER names: a "
        "substring of its name, or gpu / cpu).",
    )
    devices_parser.add_argument("--all-limits", action="store_true", help="print every limit, not only those raised")
    devices_parser.add_argument("--json", action="store_true", help="print everything as JSON")
    explain_parser = commands.add_parser(
        "explain",
        help="print the compile report of a model script (nothing runs on the GPU)",
        description="Run SCRIPT until it first runs a compiled program, and print the report of every "
        "program it compiled: the rewrites the e-graph chose, costs, and the kernels with the source "
        "lines they cover. Nothing is written unless --out is given.",
    )
    explain_parser.add_argument("script")
    explain_parser.add_argument(
        "--out", metavar="DIR", help="write each step's picture there (.dot, and .svg with Graphviz)"
    )
    explain_parser.add_argument("--wgsl", action="store_true", help="also print every kernel's WGSL")
    explain_parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    profile_parser = commands.add_parser(
        "profile",
        help="time every kernel of a model script's step on the GPU",
        description=f"Run SCRIPT on the device; the first program to reach step {compiler.TRACE_AFTER + 1} "
        "has every kernel of that step timed with GPU timestamps: the time by kernel kind, the slowest "
        "kernels with their source lines, and a Chrome trace (open it in https://ui.perfetto.dev).",
    )
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
    return parser, bench_parser


def main(argv: list[str] | None = None) -> int:
    parser, bench_parser = parser_of()
    options = parser.parse_args(argv)
    if options.command == "devices":
        return devices(options.all_limits, options.json)
    if options.command == "bench":
        return bench_cli.run(options, bench_parser)
    if options.command == "profile":
        return profile(options.script, options.args, options.trace)
    return explain(options.script, options.args, options.out, options.wgsl)


if __name__ == "__main__":
    sys.exit(main())
