"""What the bench prints and writes: a text block per workload, a Markdown table (for the
README) and a JSON record of every number with when, where and on what it was measured."""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
import re
import subprocess
from pathlib import Path

from meganeura.bench.gemm import GemmResult
from meganeura.bench.gemm import table as gemm_table
from meganeura.bench.harness import LOSS_RTOL, MODE_TITLES, StepResult


def step_text(result: StepResult, modes: tuple[str, ...]) -> str:
    """Our time, PyTorch's per mode with the ratios, the mirror check, dispatches, compile time
    and the top kernel kinds."""
    lines = [
        f"== {result.name}: {result.title}",
        f"  meganeura: {result.ours_ms:.3f} ms/step (median of {result.steps} after {result.warmup} warm-up), "
        f"{result.dispatches} dispatches per step, compiled in {result.compile_s:.2f} s, "
        f"{result.parameters:,} parameters",
    ]
    if result.torch:
        lines.append(f"  {result.torch_note}")
    if result.torch:
        lines.append(mirror_line(result))
    elif result.stochastic and result.eval_losses:  # what the mirror check compares, where torch ran
        before, after = result.eval_losses
        lines.append(f"  eval-mode (dropout off) loss: {before:.6f} before any update, {after:.6f} after one")
    for mode in modes:
        run = result.torch.get(mode)
        title = MODE_TITLES[mode]
        if run is None:
            why = result.torch_note if not result.torch else "not run (--torch-compile)"
            lines.append(f"  {title:<32} {why}")
        elif run.ms is None:
            lines.append(f"  {title:<32} {run.note}")
        else:
            ratio = result.ratio(mode)
            shown = f"ours/torch {ratio:.2f}" if ratio is not None else "no ratio: the mirror check failed"
            extra = f"  (first step {run.first_ms:.0f} ms: compiling)" if mode == "compile" else ""
            lines.append(f"  {title:<32} {run.ms:>10.3f} ms/step   {shown}{extra}")
    if result.top_kinds:
        one_pass = f"; {result.gpu_pass_ms:.3f} ms as one pass, as steps run" if result.gpu_pass_ms else ""
        profiled = f"one profiled step, {result.gpu_ms:.3f} ms of GPU time, a pass per dispatch{one_pass}"
        lines.append(f"  top kernel kinds ({profiled}):")
        for row in result.top_kinds:
            share = f"{100 * row.share:>6.1f}%"
            lines.append(f"    {row.kind:<24} {row.count:>5}× {row.ms:>10.3f} ms {share} {row.tflops:>8.3g} TFLOP/s")
    elif result.profile_note:
        lines.append(f"  {result.profile_note}")
    lines += [share_line(pattern, share) for pattern, share in result.shares.items()]
    return "\n".join(lines)


def label_share(pattern: str, label_ms: dict[str, float], gpu_ms: float) -> dict:
    """The distinct kernels (of all the profiled step ran: `StepResult.label_ms`) whose label
    matches the regex `pattern`: how many, their ms a step and their share of its GPU time (a pass
    per kernel). How docs/performance-log.md measures attention's share of SmolLM2's step."""
    matched = {label: ms for label, ms in label_ms.items() if re.search(pattern, label)}
    total = sum(matched.values())
    return {"kernels": len(matched), "ms": total, "share": total / gpu_ms if gpu_ms else 0.0}


def share_line(pattern: str, share: dict) -> str:
    """`label_share`'s figures as a line of the bench's output."""
    matched = f"{share['kernels']} kernels matching {pattern!r}"
    return f"    {matched}: {share['ms']:.3f} ms, {100 * share['share']:.1f}% of the step"


def mirror_line(result: StepResult) -> str:
    run = result.torch["fp32"]
    if not run.losses:
        return f"  mirror check: PyTorch fp32 did not run ({run.note})"
    if result.stochastic:
        return stochastic_mirror_line(result, run)
    ours, theirs = result.ours_losses, run.losses
    verdict = "same model" if result.mirror_ok else f"MIRROR MISMATCH (> {LOSS_RTOL:g}): ratios withheld"
    line = (
        f"  first-step loss: ours {ours[0]:.6f}, PyTorch fp32 {theirs[0]:.6f}, "
        f"relative difference {result.loss_difference:.1e}: {verdict}"
    )
    if result.second_loss_difference is not None:
        line += f"; after one update {ours[1]:.6f} vs {theirs[1]:.6f} ({result.second_loss_difference:.1e})"
    return line


def stochastic_mirror_line(result: StepResult, run) -> str:
    """The check of a workload with dropout: the eval-mode losses, and the training losses shown
    uncompared (each side draws its own masks)."""
    if not run.eval_losses:
        return f"  mirror check: PyTorch fp32's eval-mode loss did not run ({run.note})"
    ours, theirs = result.eval_losses, run.eval_losses
    verdict = "same model" if result.mirror_ok else f"MIRROR MISMATCH (> {LOSS_RTOL:g}): ratios withheld"
    lines = [
        f"  eval-mode (dropout off) loss before any update: ours {ours[0]:.6f}, PyTorch fp32 {theirs[0]:.6f}, "
        f"relative difference {result.loss_difference:.1e}: {verdict}",
    ]
    if result.eval_update_difference is not None:
        lines.append(
            f"  after one update (each side's own dropout masks: not checked) {ours[1]:.6f} vs {theirs[1]:.6f} "
            f"({result.eval_update_difference:.1e})"
        )
    train = ", ".join(f"{loss:.6f}" for loss in result.ours_losses)
    torch_train = ", ".join(f"{loss:.6f}" for loss in run.losses)
    lines.append(f"  training losses with dropout (not compared): ours {train}; PyTorch fp32 {torch_train}")
    return "\n".join(lines)


def dropout_costs(steps: list[StepResult]) -> dict[str, dict]:
    """What dropout adds to a step: for each `<name>-dropout` result whose `<name>` ran too, the
    difference of their median steps, ours and each PyTorch mode's (ms, and relative to the step
    without dropout)."""
    by_name = {result.name: result for result in steps}
    costs = {}
    for name, with_dropout in by_name.items():
        base = by_name.get(name.removesuffix("-dropout")) if name.endswith("-dropout") else None
        if base is None:
            continue
        sides = {"meganeura": (base.ours_ms, with_dropout.ours_ms)}
        for mode, run in base.torch.items():
            other = with_dropout.torch.get(mode)
            if run.ms is not None and other is not None and other.ms is not None:
                sides[f"torch {mode}"] = (run.ms, other.ms)
        costs[name] = {side: {"ms": b - a, "relative": (b - a) / a} for side, (a, b) in sides.items()}
    return costs


def dropout_text(costs: dict[str, dict]) -> str:
    lines = []
    for name, sides in costs.items():
        parts = [f"{side} {c['ms']:+.3f} ms ({100 * c['relative']:+.1f}%)" for side, c in sides.items()]
        lines.append(f"== what dropout adds to {name.removesuffix('-dropout')}'s step: " + ", ".join(parts))
    return "\n".join(lines)


def gemm_text(results: list[GemmResult]) -> str:
    return "== gemm: our matmul kernel vs torch.mm (fp32, TF32 off), forward and gradient products\n" + gemm_table(
        results
    )


def cell(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def ms_cell(value: float | None) -> str:
    """A step's milliseconds: a tenth where that is under 1% of it, else three significant digits
    (the MLP's 0.508 ms step would read 0.5)."""
    return "–" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def markdown(steps: list[StepResult], gemms: list[GemmResult], modes: tuple[str, ...], header: dict) -> str:
    """The results as Markdown tables: the training steps, then the GEMMs."""
    out = [
        f"Measured {header['date']} on {header['adapter']} ({header['torch']}), commit {header['git_commit'][:12]}"
        f" (source {header.get('source_digest', 'unknown')[:12]}), {settings_text(header.get('settings', {}))}; "
        f"medians of {header['steps']} steps after {header['warmup']} warm-up"
        + (" — small sizes (--small)" if header["small"] else ""),
        "",
    ]
    if steps:
        titles = {"fp32": "PyTorch eager fp32", "bf16": "PyTorch eager bf16", "compile": "torch.compile"}
        head = ["workload", "meganeura ms"]
        for mode in modes:
            head += [f"{titles[mode]} ms", f"ours / {titles[mode].removeprefix('PyTorch ')}"]
        head += ["dispatches", "compile s", "first-loss diff", "top kernels (share, TFLOP/s)"]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in steps:
            row = [r.name, ms_cell(r.ours_ms)]
            for mode in modes:
                run = r.torch.get(mode)
                if run is None and not r.torch:  # no torch at all: say why in its columns
                    row += [r.torch_note, "–"]
                else:
                    row += [ms_cell(run.ms if run else None), cell(r.ratio(mode))]
            diff = r.loss_difference
            kinds = ", ".join(f"{k.kind} {100 * k.share:.0f}% {k.tflops:.3g}" for k in r.top_kinds[:3])
            shown = "–" if diff is None else f"{diff:.0e}" + (" (eval)" if r.stochastic else "")
            row += [str(r.dispatches), cell(r.compile_s), shown, kinds or "–"]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    if gemms:
        out += [
            "| GEMM (M×K×N, product) | meganeura TFLOP/s | PyTorch fp32 TFLOP/s | ours / PyTorch (time) |",
            "|---|---|---|---|",
        ]
        for g in gemms:
            ratio = None if g.torch_s is None else g.ours_s / g.torch_s
            theirs = "–" if g.torch_tflops is None else f"{g.torch_tflops:.3g}"
            out.append(f"| {g.product.label()} | {g.ours_tflops:.3g} | {theirs} | {cell(ratio)} |")
        out.append("")
    return "\n".join(out)


def git_commit() -> str:
    """The checkout's commit (with -dirty for uncommitted changes), or "unknown" for an installed package."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = subprocess.run(
            ["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def source_digest(package: Path | None = None, shaders: Path | None = None) -> str:
    """SHA-256 of the code that ran: every .py file of the package and every WGSL template, by path
    relative to its folder, in sorted order. A copy of a checkout whose git metadata is stale (a
    device's copy of the work tree) still names its source by it: `python -m meganeura bench
    --source-digest` at a commit prints that commit's, to compare with a JSON record's."""
    from meganeura.codegen.render import PACKAGE_DIR, SHADER_DIRS

    package = package or PACKAGE_DIR
    shaders = shaders or next((folder for folder in SHADER_DIRS if folder.is_dir()), SHADER_DIRS[-1])
    digest = hashlib.sha256()
    for folder, pattern in ((package, "*.py"), (shaders, "*.wgsl")):
        for path in sorted(folder.rglob(pattern)):
            digest.update(f"{folder.name}/{path.relative_to(folder).as_posix()}".encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def torch_version() -> str:
    from meganeura.bench.harness import torch_available

    if not torch_available():
        return "torch not installed"
    import torch

    where = f"cuda {torch.version.cuda}, {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "no CUDA"
    return f"torch {torch.__version__} ({where})"


# The environment settings that change what our step runs (runtime/backend.py, runtime/device.py):
# a result names those in effect, so that a run with the opt-ins is not read as the default's.
SETTINGS = ("MEGANEURA_BACKEND", "MEGANEURA_TENSOR_CORES", "MEGANEURA_UNCHECKED_KERNELS", "MEGANEURA_ADAPTER")


def settings() -> dict[str, str]:
    """The SETTINGS set in the environment (none: the defaults)."""
    return {name: os.environ[name].strip() for name in SETTINGS if os.environ.get(name, "").strip()}


def settings_text(values: dict[str, str]) -> str:
    """`NAME=value …`, or "default settings"."""
    return " ".join(f"{name}={value}" for name, value in values.items()) or "default settings"


def header(adapter: str, steps: int, warmup: int, small: bool) -> dict:
    """When, where and on what: the JSON record's first fields."""
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "source_digest": source_digest(),
        "adapter": adapter,
        "settings": settings(),
        "torch": torch_version(),
        "python": platform.python_version(),
        "host": platform.node(),
        "steps": steps,
        "warmup": warmup,
        "small": small,
    }
