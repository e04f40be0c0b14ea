"""The three attention kernels alone, each tile configuration timed with GPU timestamps in one
process, side by side with PyTorch's SDPA forward + backward at the same shape.

    PYTHONPATH=. python benchmarks/attention.py [--shapes smollm2,gpt2] [--repeat 20] [--seq 256]
        [--batch 8] [--kernels attention,attention_grad_q,attention_grad_kv] [--per-query-head]
        [--scores]

Shapes (both causal, head_dim 64, seq 256, batch 8): smollm2, 9 query heads over 3 KV heads
(SmolLM2-135M's attention); gpt2, 12 heads MHA (GPT-2 small's). For every kernel (attention,
attention_grad_q, attention_grad_kv) and every tile configuration (BR query rows × BC key rows /
threads, codegen/attention_tiles.py) that fits the device's workgroup memory, `repeat` dispatches
of that kernel run in one step and the median dispatch time is printed (Executable.profile: a
compute pass per dispatch with timestamps), after two warm-up steps (GPU clocks idle low). The
per-layer total of the chosen configurations (attention_tiles.CHOSEN, the adapter's tuning family
where they fit) and of the fastest of each kernel close the table. Each configuration's first
result is checked against the ops' numpy semantics (float64); a wrong one is marked and left out
of the totals. PyTorch (fp32, when torch and CUDA are there): SDPA forward and forward + backward,
`repeat` iterations between CUDA events.

With --scores, dK/dV also writes dS (`attention_grad_kv(…, scores=True)`) and the table adds the
matmul that then gives dQ (passes/attention_scores.py), so that the per-layer totals compare
the two routes: forward + dQ kernel + dK/dV against forward + dK/dV writing dS + the matmul.

With --ablate, each kernel's chosen configuration is timed instead with parts of its code taken
out (ABLATIONS: the dS stores, the rows' D and lse staging, the output update, the score tile, the
causal mask), to see where its time goes: those results are wrong by design and only timed. An
ablation whose pattern no longer matches the generated WGSL stops the run (it would time the
whole kernel under another name). On the H200 (2026-12-02, SmolLM2 shapes, dK/dV per query head
writing dS at 32x32/128p, ms): whole 0.1945; without the dS stores 0.169, without the rows'
staging 0.166, without the output update 0.145, without the score tile 0.128, not causal (every
key tile walks all query tiles: 1.78× the work) 0.326; the forward 64x32/256p 0.102, without the
output update 0.067, without the score tile 0.071, not causal 0.148. The rows' D was then rebuilt
in the kernel from O, loaded beside dO for every query tile a workgroup walks; with D read as an
operand instead (an ablation then, the kernels' form since; 32x32/256p, ms): SmolLM2 0.1649 →
0.1378, GPT-2 0.2076 → 0.1825.

On a CPU adapter (lavapipe) the GPU kernels are forced (the compiler would pick attention_rows);
use small --seq/--batch there.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import re

import numpy as np

from meganeura.codegen import attention_tiles
from meganeura.codegen import matmul as codegen_matmul
from meganeura.codegen import transformer as codegen_transformer
from meganeura.codegen.attention_tiles import KINDS, Tiles, layout_of, per_thread_work
from meganeura.codegen.gemm_table import GemmTiling
from meganeura.ir.graph import TensorType
from meganeura.ir.ops.transformer import (
    attention_delta,
    evaluate_attention,
    evaluate_attention_grad_kv,
    evaluate_attention_grad_q,
)
from meganeura.ir.trace import Tracer
from meganeura.passes import compile_step
from meganeura.runtime import Executable, default_device

SHAPES = {"smollm2": (9, 3), "gpt2": (12, 12)}  # (query heads, KV heads)
HEAD_DIM = 64

# The sweep: tiles × threads; configurations that do not divide or fit are left out per kernel.
SWEEP_TILES = ((64, 64), (64, 32), (32, 64), (32, 32), (32, 16), (16, 32), (16, 16), (16, 8), (8, 16))
SWEEP_THREADS = (64, 128, 256, 512)  # 32 was the slowest of every kernel on the H200
# --scores: the dQ matmul's tilings timed beside the table's (codegen/gemm_table.py GemmTiling:
# BM, BN, BK, RM, RN, prefetch); its output is [G·Sq, D], 64 columns at head_dim 64.
SCORES_MATMUL_TILINGS = tuple(
    GemmTiling(*c)
    for c in (
        (64, 64, 16, 2, 2, True), (64, 64, 16, 2, 2, False), (64, 64, 16, 1, 1, False), (64, 64, 32, 1, 1, False),
        (32, 64, 16, 1, 1, False), (32, 64, 32, 1, 1, False), (128, 64, 16, 2, 1, False), (64, 64, 16, 2, 1, False),
        (128, 64, 16, 2, 2, False), (32, 32, 16, 1, 1, False),
    )
)  # fmt: skip


# --ablate: (name, kernel, flag values or placeholder texts replaced before rendering, (pattern,
# replacement) applied to the rendered WGSL, dK/dV writes dS). Written against shaders/attention.wgsl
# and codegen/attention_tiles.py as they are: a pattern that matches nothing is an error.
ABLATIONS = (
    ("whole", "attention_grad_kv", {}, (), True),
    ("no dS stores", "attention_grad_kv", {}, (), False),
    ("no rows' D and lse", "attention_grad_kv", {}, ((r"stage_rows\([^)]*\);", ""),), True),
    ("no output update", "attention_grad_kv", {"DKV_UPDATE": ""}, (), True),
    ("no score tile", "attention_grad_kv", {"SCORES": ""}, (), True),
    ("not causal", "attention_grad_kv", {"CAUSAL": False}, (), True),
    ("whole", "attention", {}, (), False),
    ("no output update", "attention", {"O_UPDATE": ""}, (), False),
    ("no score tile", "attention", {"SCORES": ""}, (), False),
    ("not causal", "attention", {"CAUSAL": False}, (), False),
)


@contextlib.contextmanager
def ablated(values: dict, patterns: tuple[tuple[str, str], ...]):
    """Attention kernels rendered with `values` replacing the template's and `patterns` substituted
    in the text (ValueError where a pattern matches nothing)."""
    original = codegen_transformer.render

    def render(template, given):
        text = original(template, {**given, **values})
        for pattern, replacement in patterns:
            text, count = re.subn(pattern, replacement, text)
            if not count:
                raise ValueError(f"ablation pattern {pattern!r} matches nothing in the {template} kernel")
        return text

    codegen_transformer.render = render
    try:
        yield
    finally:
        codegen_transformer.render = original


def ablate(device, target, q_shape, kv_shape, inputs, repeat: int, kinds: list[str]) -> None:
    """Print the time of each kernel's chosen configuration with each of ABLATIONS."""
    per_query_head = q_shape[1] != kv_shape[1]
    for name, kind, values, patterns, scores in ABLATIONS:
        if kind not in kinds:
            continue
        tiles = attention_tiles.tiles_for(kind, HEAD_DIM, target)
        with ablated(values, patterns):
            ms, _ = kernel_ms(device, target, kind, tiles, q_shape, kv_shape, inputs, repeat, per_query_head, scores)
        print(f"  {kind:<18} {tiles!s:<12} {name:<22} {ms:>9.4f} ms", flush=True)


def attention_step(kind: str, q_shape, kv_shape, repeat: int, per_query_head: bool = False, scores: bool = False):
    """A graph of `repeat` `kind` kernels on the same inputs (the backward reads the rows' D and
    lse as inputs); `per_query_head`: dK/dV's per-query-head form (as the compiler splits a grouped one);
    `scores`: dK/dV writing dS too."""
    tracer = Tracer()
    graph = tracer.graph
    q = tracer.leaf("input", "q", TensorType(q_shape))
    k = tracer.leaf("input", "k", TensorType(kv_shape))
    v = tracer.leaf("input", "v", TensorType(kv_shape))
    attrs = {"causal": True, "scale": 1.0 / np.sqrt(q_shape[-1])}
    if per_query_head and kind == "attention_grad_kv":
        attrs["per_query_head"] = True
    if scores and kind == "attention_grad_kv":
        attrs["scores"] = True
    operands = [q, k, v]
    if kind != "attention":
        delta = tracer.leaf("input", "delta", TensorType(q_shape[:3]))
        lse = tracer.leaf("input", "lse", TensorType(q_shape[:3]))
        d_o = tracer.leaf("input", "do", TensorType(q_shape))
        operands += [delta, lse, d_o]
    for index in range(repeat):
        node = tracer.emit(kind, operands, **attrs)
        several = kind != "attention_grad_q"  # the forward and dK/dV have two results
        graph.outputs[f"r{index}"] = tracer.emit("result", [node], index=0) if several else node
    return graph


def step_inputs(q_shape, kv_shape) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    q, k, v, d_o = (rng.normal(size=s).astype(np.float32) for s in (q_shape, kv_shape, kv_shape, q_shape))
    o, lse = evaluate_attention(q, k, v, causal=True, scale=1.0 / np.sqrt(q_shape[-1]))
    delta = attention_delta(o, d_o).astype(np.float32)
    return {"q": q, "k": k, "v": v, "delta": delta, "lse": lse.astype(np.float32), "do": d_o}


def expected_result(kind: str, inputs: dict[str, np.ndarray], per_query_head: bool = False) -> np.ndarray:
    """The first result of `kind` in float64 (the ops' numpy semantics), to check each configuration."""
    values = {name: value.astype(np.float64) for name, value in inputs.items()}
    q, k, v = values["q"], values["k"], values["v"]
    scale = 1.0 / np.sqrt(q.shape[-1])
    if kind == "attention":
        return evaluate_attention(q, k, v, causal=True, scale=scale)[0]
    backward = (q, k, v, values["delta"], values["lse"], values["do"])
    if kind == "attention_grad_q":
        return evaluate_attention_grad_q(*backward, causal=True, scale=scale)
    return evaluate_attention_grad_kv(*backward, causal=True, scale=scale, per_query_head=per_query_head)[0]


def kernel_ms(
    device,
    target,
    kind: str,
    tiles: Tiles,
    q_shape,
    kv_shape,
    inputs,
    repeat: int,
    per_query_head: bool = False,
    scores: bool = False,
) -> tuple[float, float]:
    """The median time of one `kind` dispatch with `tiles` (which fit `target`) in ms, and the
    largest error of its first result relative to the largest magnitude of the expected one."""
    key = (target.tuning, kind, q_shape[-1])
    saved = attention_tiles.CHOSEN.get(key)
    attention_tiles.CHOSEN[key] = tiles
    try:
        graph = attention_step(kind, q_shape, kv_shape, repeat, per_query_head, scores)
        # without per_query_head: the grouped kernel itself, not the per-head one the plan may split it into
        executable = Executable(compile_step(graph, target, per_query_head=per_query_head), device, {}, {})
    finally:
        if saved is None:
            del attention_tiles.CHOSEN[key]
        else:
            attention_tiles.CHOSEN[key] = saved
    used = {name: value for name, value in inputs.items() if name in {"q", "k", "v"} or kind != "attention"}
    got = executable.run(used, read=("r0",))["r0"]
    executable.heat(used, 0.1)  # GPU clocks idle low while the pipeline compiles
    _, profile = executable.profile(used)
    times = sorted(kernel.ns for kernel in profile.kernels if kernel.kind == kind)
    expected = expected_result(kind, used, per_query_head)
    error = float(np.abs(got - expected).max() / np.abs(expected).max())
    return times[len(times) // 2] / 1e6, error


def scores_matmul_ms(
    device, target, q_shape, kv_shape, inputs, repeat: int, tiling: GemmTiling | None = None
) -> tuple[float, float, str]:
    """The median time of the matmul that gives dQ from dS (passes/attention_scores.py) in ms, its
    error against dQ's numpy semantics (as `kernel_ms`), and its kernel's label; with `tiling`
    forced instead of the table's."""
    b, h, sq, d = q_shape
    _, hkv, skv, _ = kv_shape
    tracer = Tracer()
    graph = tracer.graph
    ds = tracer.leaf("input", "ds", TensorType((b, hkv, skv, h // hkv * sq)))
    k = tracer.leaf("input", "k", TensorType(kv_shape))
    for index in range(repeat):
        graph.outputs[f"r{index}"] = tracer.emit("matmul", [ds, k], transpose_a=True)
    original = codegen_matmul.gemm_tiling
    if tiling is not None:
        codegen_matmul.gemm_tiling = lambda *_, **__: tiling
    try:
        executable = Executable(compile_step(graph, target), device, {}, {})
    finally:
        codegen_matmul.gemm_tiling = original
    values = {name: value.astype(np.float64) for name, value in inputs.items()}
    backward = [values[name] for name in ("q", "k", "v", "delta", "lse", "do")]
    scale = 1.0 / np.sqrt(d)
    _, _, scores = evaluate_attention_grad_kv(*backward, causal=True, scale=scale, scores=True)
    used = {"ds": scores.astype(np.float32), "k": inputs["k"]}
    got = executable.run(used, read=("r0",))["r0"].reshape(q_shape)
    executable.heat(used, 0.1)
    _, profile = executable.profile(used)
    times = sorted(kernel.ns for kernel in profile.kernels if kernel.kind == "matmul")
    expected = evaluate_attention_grad_q(*backward, causal=True, scale=scale)
    error = float(np.abs(got - expected).max() / np.abs(expected).max())
    return times[len(times) // 2] / 1e6, error, executable.kernels[0].label


def torch_ms(q_shape, kv_shape, repeat: int) -> tuple[float, float] | None:
    """PyTorch SDPA (fp32, causal, GQA) forward, and forward + backward, in ms; None without CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    import torch.nn.functional as tf

    q = torch.randn(q_shape, device="cuda", requires_grad=True)
    k = torch.randn(kv_shape, device="cuda", requires_grad=True)
    v = torch.randn(kv_shape, device="cuda", requires_grad=True)
    grad = torch.randn(q_shape, device="cuda")
    gqa = q_shape[1] != kv_shape[1]

    def forward():
        return tf.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def both():
        forward().backward(grad)

    timings = []
    for fn in (forward, both):
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            fn()
        end.record()
        torch.cuda.synchronize()
        timings.append(start.elapsed_time(end) / repeat)
    return timings[0], timings[1]


def sweep(kind: str, d: int, target) -> list[Tiles]:
    """The configurations of the sweep that `kind`'s kernel can take at head_dim d on `target`,
    the chosen one first."""
    chosen = attention_tiles.tiles_for(kind, d, target)
    options = [Tiles(br, bc, t, p) for br, bc in SWEEP_TILES for t in SWEEP_THREADS for p in (False, True)]
    fitting = [t for t in options if t != chosen and attention_tiles.fits(kind, t, d, target)]
    return [chosen, *fitting]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="smollm2,gpt2")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--kernels", default=",".join(KINDS))
    parser.add_argument(
        "--per-query-head",
        action="store_true",
        help="dK/dV per query head (what the compiler dispatches for GQA on the H200); without, the grouped kernel",
    )
    parser.add_argument("--scores", action="store_true", help="dK/dV writes dS, and the dQ matmul of it is timed")
    parser.add_argument("--ablate", action="store_true", help="the chosen tiles with parts of each kernel taken out")
    args = parser.parse_args()
    device = default_device()
    # The tiled GPU kernels, on any adapter, in all the workgroup memory the device offers.
    target = dataclasses.replace(device.target, cpu=False)
    # Sweep wider than the compiler's own register limits: more registers a thread.
    attention_tiles.MAX_SCORES = attention_tiles.MAX_OUTPUT_VEC4 = 32
    print(
        f"adapter: {device.describe()}, workgroup memory {target.workgroup_memory} bytes, tuning {target.tuning}, "
        f"{args.repeat} dispatches a kernel"
    )
    for name in args.shapes.split(","):
        heads, kv_heads = SHAPES[name]
        q_shape = (args.batch, heads, args.seq, HEAD_DIM)
        kv_shape = (args.batch, kv_heads, args.seq, HEAD_DIM)
        inputs = step_inputs(q_shape, kv_shape)
        print(f"\n{name}: q {q_shape} kv {kv_shape} causal")
        if args.ablate:
            ablate(device, target, q_shape, kv_shape, inputs, args.repeat, args.kernels.split(","))
            continue
        print(f"  {'kernel':<18} {'tiles':<12} {'per thread':<12} {'bytes':>6} {'ms':>9} {'rel err':>8}")
        chosen_total, best_total = 0.0, 0.0
        for kind in args.kernels.split(","):
            results = []
            configurations = sweep(kind, HEAD_DIM, target)
            for index, tiles in enumerate(configurations):
                layout = layout_of(kind, tiles, HEAD_DIM, target.workgroup_memory)
                ms, error = kernel_ms(
                    device,
                    target,
                    kind,
                    tiles,
                    q_shape,
                    kv_shape,
                    inputs,
                    args.repeat,
                    args.per_query_head,
                    args.scores,
                )
                wrong = error > 1e-4  # f32 against float64: ~1e-6 when right
                if not wrong:
                    results.append((ms, tiles))
                mark = " (chosen)" if index == 0 else ""
                mark += " WRONG: left out" if wrong else ""
                used = attention_tiles.workgroup_bytes(kind, tiles, HEAD_DIM)
                work = per_thread_work(layout)
                print(f"  {kind:<18} {tiles!s:<12} {work:<12} {used:>6} {ms:>9.4f} {error:>8.1e}{mark}", flush=True)
            chosen_total += results[0][0] if results and results[0][1] == configurations[0] else float("nan")
            best_ms, best_tiles = min(results, key=lambda r: r[0])
            best_total += best_ms
            print(f"  {kind:<18} fastest {best_tiles}: {best_ms:.4f} ms")
        print(f"  per layer, chosen tiles: {chosen_total:.4f} ms; fastest of each kernel: {best_total:.4f} ms")
        if args.scores:
            ms, error, label = scores_matmul_ms(device, target, q_shape, kv_shape, inputs, args.repeat)
            print(f"  dQ as the matmul of dS: {ms:.4f} ms, rel err {error:.1e} ({label}, the table's tiling)")
            for tiling in SCORES_MATMUL_TILINGS:
                ms, error, _ = scores_matmul_ms(device, target, q_shape, kv_shape, inputs, args.repeat, tiling)
                print(f"    with {tiling!s:<24} {ms:.4f} ms, rel err {error:.1e}", flush=True)
        theirs = torch_ms(q_shape, kv_shape, args.repeat)
        if theirs is not None:
            print(f"  pytorch fp32 SDPA: forward {theirs[0]:.4f} ms, forward + backward {theirs[1]:.4f} ms")


if __name__ == "__main__":
    main()
