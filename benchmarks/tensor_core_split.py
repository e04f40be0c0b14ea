"""Can the tensor cores compute an fp32 product? A probe of the split-f16 GEMM through Dawn's
subgroup matrices (f16 × f16 → f32, 16×16×16), timed beside torch fp32
(TF32 off) in one process on the same GPU. Not used by the compiler.

    python benchmarks/tensor_core_split.py [--shapes 4096,lm-up] [--toggles disable_robustness] [--json F]
    python benchmarks/tensor_core_split.py --validate    (Dawn's Null backend: Tint compiles every kernel)

It needs wgpudawn (the `dawn` extra) and a GPU with subgroup matrices.

The method: each operand is split per row along K (A's rows, B's columns) into a power-of-two scale
and two f16 halves, x = s·(hi + lo): s puts the row's largest |x| just under 2^15 (f16's range ends
at 65504, and a row of small gradients would otherwise fall into f16's subnormals), hi is x/s with
its f32 mantissa cut to f16's 10 bits (a bit mask), lo = f16(x/s − hi). Then
C = sa·sb·(Ah·Bh + Ah·Bl + Al·Bh) with f32 accumulators: three MMAs for each of one f16 product,
the dropped Al·Bl about 2^-22 of |a||b|. Kernels: `split_rows` (a workgroup a row, the operand
stored K-contiguous), `split_cols` (the operand stored [K, rows]: a weight gradient's Aᵀ, a
forward product's B; transposed through a 64×64 workgroup tile), both writing [rows, Kp] halves
(Kp: K padded to 64 with zeros), and `split_cols_kept` (B's halves in B's own [K, N] layout);
`split_gemm`: BM×BN tiles of 2×2 subgroups, each SM×SN 16×16 matrices, hi and lo of both
operands staged through workgroup memory per BK slice of K, the result scaled on its way out
through a per-subgroup 16×16 staging matrix; optional split-K into partials.

Why the bit mask: hi = f16(v), lo = f16(v − f32(hi)) gave lo = 0 on the H200 (the driver folds
f32(f16(v)) to v), so the "split" product was exactly as coarse as plain f16 (max error 7e-5
of |A||B| at 4096³, the same as the one-product kernel); with the mask, A's split error is 2.4e-7.

Measured on the H200 with this script, 2026-12-03 (wgpudawn 0.32.0.4; inputs N(0,1) with row or
column magnitudes spread over 10^-6…10^1; error: max |C − C64| / (|A|·|B|) over sampled rows;
ms of the GEMM alone, the best variant's, and of the conversions apart: A's and B's, B's
whichever layout that variant reads). `--shapes 4096,lm-up,lm-head,gpt2-qkv,gpt2-fc` at 16:58
UTC with Dawn's default robustness, and `--shapes 4096,lm-up,gpt2-qkv --toggles
disable_robustness,disable_workgroup_init` at 17:00 (what the compiler's opt-in for kernels
without bounds checks would give them):

M×K×N: torch fp32 ms | the split, best variant: ms (TFLOP/s, variant), with checks; without
    | f16 alone TFLOP/s with / without checks | conversions ms with / without | error (numpy fp32's)
4096³: 2.692 | 2.368 (58.0, 128x128); 1.922 (71.5, 128x128 B kept) | 138.9 / 216.0 | 0.611 / 0.317
    | 4.0e-6 (1.2e-7)
2048×576×1536: 0.091 | 0.074 (48.9, 64x64 B kept); 0.062 (58.4, same) | 87.4 / 105.6 | 0.070 / 0.047
    | 1.9e-6 (3.4e-7)
576×2048×1536 Aᵀ·G: 0.098 | 0.080 (45.0, 64x64 B kept); 0.073 (49.4, same) | 42.7 / 57.0
    | 0.350 / 0.193 | 3.1e-6 (1.9e-7)
2048×768×2304: 0.179 | 0.157 (46.1, 64x64 B kept); 0.137 (52.9, same) | 84.9 / 103.2 | 0.086 / 0.050
    | 2.7e-6 (3.9e-7)
2048×768×3072: 0.221 | 0.199 (48.6, 128x128) | 96.6 | 0.065 | 2.1e-6 (3.4e-7)
2048×576×49152: 2.455 | 2.489 (46.6, 128x128) | 100.0 | 0.282 | 2.2e-6 (5.0e-7)
2048×49152×576 G·Bᵀ in 4 parts: 2.451 | 2.616 (44.3, 128x128) | 78.2 | 0.451 | 3.0e-6 (3.0e-8);
    in one part 3.487 (33.3) and 1.2e-5
49152×2048×576 Aᵀ·G: 2.697 | 2.139 (54.2, 64x64 B kept) | 116.2 | 0.241 | 2.7e-6 (1.9e-7)

"B kept": B's halves in B's own [K, N] layout, staged as [k][n] tiles (`b_kept`); else [N, K]
staged as [n][k] and loaded column-major. Its 128x128 tile is the slowest variant with the checks
and the fastest without (4096³: 37.7 → 71.5 TFLOP/s). `split_cols` and `split_cols_kept` run a
workgroup per 64 rows over all of K (64 workgroups for 4096 rows: 0.5 ms where the bytes take
~0.04); a real one would split K too.

What it says: with Dawn's checks the split GEMM alone runs at 0.94-1.26× torch fp32's speed,
without them 1.30-1.48× (the compiler's fp32 SIMT kernels: 0.62-0.95×, `bench gemm` in
docs/performance-log.md); its conversions, as separate kernels, cost more than that gain at the
LM's sizes (2048×576×1536: 0.062 + 0.047 ms against torch's 0.091). Its error is 6-100× fp32's
(2-4e-6 of |A||B|), from the tensor cores' f32 accumulation (the split itself is exact to 2.4e-7),
growing with K unless K is split. The one-product f16 kernel reaches 216 TFLOP/s without checks
(the probe's best: 259), so the split's three MMAs, not its staging, now bound it. A training step
would gain only where the producer of each operand writes its halves and scales itself (an epilogue
that knows its row's largest |x|), with Dawn as the backend. """

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

SUBGROUP_MATRIX = "chromium-experimental-subgroup-matrix"


def split_rows(rows: int, k: int, kp: int, rows_padded: int, threads: int = 128) -> str:
    """X f32 [rows, K] (K % 4 == 0) → H, L f16 [rows_padded, Kp], S f32 [rows_padded] (the scale s)."""
    k4, kp4 = k // 4, kp // 4
    return f"""enable f16;
@group(0) @binding(0) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> H: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read_write> L: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
var<workgroup> part: array<f32, {threads}>;
@compute @workgroup_size({threads})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {{
  let r = wg.x + wg.y * 65535u;
  if (r >= {rows_padded}u) {{ return; }}
  let live = r < {rows}u;
  var m = 0.0;
  if (live) {{
    for (var k = t; k < {k4}u; k += {threads}u) {{
      let x = abs(X[r * {k4}u + k]);
      m = max(m, max(max(x.x, x.y), max(x.z, x.w)));
    }}
  }}
  part[t] = m;
  workgroupBarrier();
  for (var w = {threads // 2}u; w > 0u; w = w / 2u) {{
    if (t < w) {{ part[t] = max(part[t], part[t + w]); }}
    workgroupBarrier();
  }}
  var e = 0;
  if (part[0] > 0.0) {{ e = frexp(part[0]).exp; }}
  let up = ldexp(1.0, 15 - e);
  if (t == 0u) {{ S[r] = ldexp(1.0, e - 15); }}
  for (var k = t; k < {kp4}u; k += {threads}u) {{
    var v = vec4<f32>(0.0);
    if (live && k < {k4}u) {{ v = X[r * {k4}u + k] * up; }}
    let hi = bitcast<vec4<f32>>(bitcast<vec4<u32>>(v) & vec4<u32>(0xFFFFE000u));
    H[r * {kp4}u + k] = vec4<f16>(hi);
    L[r * {kp4}u + k] = vec4<f16>(v - hi);
  }}
}}
"""


def column_scales(rows: int, k: int, tile: str = "") -> str:
    """The opening of a kernel over X f32 [K, rows] whose workgroup takes 64 neighbouring columns
    c0…c0+63: each column's scale written to S and its inverse left in `up` (4 threads a column
    find its largest |x|), ending on the barrier after them. `tile`: more workgroup arrays."""
    return f"""enable f16;
@group(0) @binding(0) var<storage, read> X: array<f32>;
@group(0) @binding(1) var<storage, read_write> H: array<f16>;
@group(0) @binding(2) var<storage, read_write> L: array<f16>;
@group(0) @binding(3) var<storage, read_write> S: array<f32>;
var<workgroup> part: array<f32, 256>;
var<workgroup> up: array<f32, 64>;
{tile}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) t: u32) {{
  let c0 = wg.x * 64u;
  var m = 0.0;
  if (c0 + t % 64u < {rows}u) {{
    for (var k = t / 64u; k < {k}u; k += 4u) {{ m = max(m, abs(X[k * {rows}u + c0 + t % 64u])); }}
  }}
  part[t] = m;
  workgroupBarrier();
  if (t < 64u) {{
    let mx = max(max(part[t], part[t + 64u]), max(part[t + 128u], part[t + 192u]));
    var e = 0;
    if (mx > 0.0) {{ e = frexp(mx).exp; }}
    up[t] = ldexp(1.0, 15 - e);
    S[c0 + t] = ldexp(1.0, e - 15);
  }}
  workgroupBarrier();
"""


def split_cols(rows: int, k: int, kp: int, rows_padded: int) -> str:
    """X f32 [K, rows] → H, L f16 [rows_padded, Kp] (transposed), S f32 [rows_padded]; 64 rows a
    workgroup, through a 64×64 tile."""
    return (
        column_scales(rows, k, f"var<workgroup> tile: array<f32, {64 * 65}>;")
        + f"""  for (var k0 = 0u; k0 < {kp}u; k0 += 64u) {{
    for (var i = 0u; i < 16u; i++) {{
      let kk = (t + 256u * i) / 64u;
      let cc = (t + 256u * i) % 64u;
      var v = 0.0;
      if (k0 + kk < {k}u && c0 + cc < {rows}u) {{ v = X[(k0 + kk) * {rows}u + c0 + cc]; }}
      tile[cc * 65u + kk] = v * up[cc];
    }}
    workgroupBarrier();
    for (var i = 0u; i < 16u; i++) {{
      let cc = (t + 256u * i) / 64u;
      let kk = (t + 256u * i) % 64u;
      let v = tile[cc * 65u + kk];
      let hi = bitcast<f32>(bitcast<u32>(v) & 0xFFFFE000u);
      H[(c0 + cc) * {kp}u + k0 + kk] = f16(hi);
      L[(c0 + cc) * {kp}u + k0 + kk] = f16(v - hi);
    }}
    workgroupBarrier();
  }}
}}
"""
    )


def split_cols_kept(rows: int, k: int, kp: int, rows_padded: int) -> str:
    """X f32 [K, rows] → H, L f16 [Kp, rows_padded] (the same layout), S f32 [rows_padded]; 64
    columns a workgroup."""
    return (
        column_scales(rows, k)
        + f"""  let c = c0 + t % 64u;
  for (var k = t / 64u; k < {kp}u; k += 4u) {{
    var v = 0.0;
    if (k < {k}u && c < {rows}u) {{ v = X[k * {rows}u + c] * up[t % 64u]; }}
    let hi = bitcast<f32>(bitcast<u32>(v) & 0xFFFFE000u);
    H[k * {rows_padded}u + c] = f16(hi);
    L[k * {rows_padded}u + c] = f16(v - hi);
  }}
}}
"""
    )


def ceil_to(x: int, step: int) -> int:
    return -(-x // step) * step


def left_load(name: str, row: str, ld: int) -> str:
    return f"subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&{name}s, {row}, false, {ld}u)"


def right_load(name: str, offset: str, ld: int, column_major: bool) -> str:
    major = "true" if column_major else "false"
    return f"subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&{name}s, {offset}, {major}, {ld}u)"


def split_gemm(m, n, kp, sm=4, sn=4, bk=32, products=3, splits=1, pad=8, b_kept=False):
    """C [splits, M, N] = sa·sb·(Ah·Bh + Ah·Bl + Al·Bh) over part z of K (`products` 1: Ah·Bh alone),
    2×2 subgroups of sm×sn 16×16 matrices; the grid. A's halves are [Mp, Kp]; B's [Np, Kp], staged
    as [n][k] tiles and loaded column-major, or with `b_kept` [Kp, Np], staged as [k][n] tiles (the
    probe's layout, vec4 loads along n stored as 4 neighbouring halves) and loaded row-major."""
    np4 = ceil_to(n, 128) // 4
    bm, bn, threads, ld, ldb = 32 * sm, 32 * sn, 128, bk + pad, 32 * sn + pad
    part = ceil_to(ceil_to(kp, splits) // splits, bk)  # each part of K whole BK slices
    names = ["AH", "AL", "BH", "BL"] if products == 3 else ["AH", "BH"]
    lines = [
        "enable f16;\nenable subgroups;\nenable chromium_experimental_subgroup_matrix;",
        "diagnostic(off, chromium_experimental.subgroup_matrix_uniformity);",
    ]
    w = lines.append
    for i, name in enumerate(names):
        w(f"@group(0) @binding({i}) var<storage, read> {name}: array<vec4<f16>>;")
    w(f"@group(0) @binding({len(names)}) var<storage, read> SA: array<f32>;")
    w(f"@group(0) @binding({len(names) + 1}) var<storage, read> SB: array<f32>;")
    w(f"@group(0) @binding({len(names) + 2}) var<storage, read_write> C: array<f32>;")
    for name in names:
        size = bm * ld if name[0] == "A" else (bk * ldb if b_kept else bn * ld)
        w(f"var<workgroup> {name}s: array<f16, {size}>;")
    w("var<workgroup> Es: array<f32, 1024>;")
    w(f"@compute @workgroup_size({threads})")
    w("fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) tid: u32,")
    w("        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {")
    w(f"  let m0 = wg.y * {bm}u; let n0 = wg.x * {bn}u; let z = wg.z;")
    w(f"  let bm = (sg / 2u) * {16 * sm}u; let bn = (sg % 2u) * {16 * sn}u;")
    for i in range(sm):
        for j in range(sn):
            w(f"  var c{i}_{j} = subgroup_matrix_result<f32, 16, 16>();")
    per_row = bk // 4  # vec4 units of K in a tile row
    for side, rows in (("a", bm), ("b", bn)):
        for u in range(rows * per_row // threads):
            unit = f"(tid + {u * threads}u)"
            if side == "b" and b_kept:  # unit: 4 n of one k
                w(f"  let br{u} = {unit} / {bn // 4}u; let bc{u} = {unit} % {bn // 4}u;")
                w(f"  let bg{u} = br{u} * {np4}u + n0 / 4u + bc{u};")
                w(f"  let bo{u} = br{u} * {ldb}u + bc{u} * 4u;")
                continue
            w(f"  let {side}r{u} = {unit} / {per_row}u; let {side}c{u} = {unit} % {per_row}u;")
            w(f"  let {side}g{u} = ({'m0' if side == 'a' else 'n0'} + {side}r{u}) * {kp // 4}u + {side}c{u};")
            w(f"  let {side}o{u} = {side}r{u} * {ld}u + {side}c{u} * 4u;")
    w(f"  for (var kt = z * {part}u; kt < min({kp}u, (z + 1u) * {part}u); kt += {bk}u) {{")
    for name in names:
        side = name[0].lower()
        for u in range((bm if side == "a" else bn) * per_row // threads):
            advance = f"kt * {np4}u" if (side == "b" and b_kept) else "kt / 4u"
            w(f"    let p{name}{u} = {name}[{side}g{u} + {advance}];")
    for name in names:
        side = name[0].lower()
        step = 1
        for u in range((bm if side == "a" else bn) * per_row // threads):
            stores = (f"{name}s[{side}o{u} + {q * step}u] = p{name}{u}.{'xyzw'[q]};" for q in range(4))
            w("    " + " ".join(stores))
    w("    workgroupBarrier();")
    for kk in range(0, bk, 16):

        def left(name, i, kk=kk):
            return left_load(name, f"(bm + {16 * i}u) * {ld}u + {kk}u", ld)

        def right(name, j, kk=kk):
            if b_kept:
                return right_load(name, f"{kk * ldb}u + bn + {16 * j}u", ldb, False)
            return right_load(name, f"(bn + {16 * j}u) * {ld}u + {kk}u", ld, True)

        def mma(a, b, kk=kk):
            for i in range(sm):
                for j in range(sn):
                    w(f"    c{i}_{j} = subgroupMatrixMultiplyAccumulate({a}{i}_{kk}, {b}{j}_{kk}, c{i}_{j});")

        for i in range(sm):
            w(f"    let ah{i}_{kk} = {left('AH', i)};")
        for j in range(sn):
            w(f"    let bh{j}_{kk} = {right('BH', j)};")
        if products == 3:  # the small terms first
            for j in range(sn):
                w(f"    let bl{j}_{kk} = {right('BL', j)};")
            mma("ah", "bl")
            for i in range(sm):
                w(f"    let al{i}_{kk} = {left('AL', i)};")
            mma("al", "bh")
        mma("ah", "bh")
    w("    workgroupBarrier();")
    w("  }")
    for i in range(sm):
        for j in range(sn):
            w(f"  subgroupMatrixStore(&Es, sg * 256u, c{i}_{j}, false, 16u);")
            w("  workgroupBarrier();")
            w("  for (var e = 0u; e < 8u; e++) {")
            w("    let idx = lane + 32u * e;")
            w(f"    let gr = m0 + bm + {16 * i}u + idx / 16u; let gc = n0 + bn + {16 * j}u + idx % 16u;")
            scaled = "Es[sg * 256u + idx] * SA[gr] * SB[gc]"
            w(f"    if (gr < {m}u && gc < {n}u) {{ C[z * {m * n}u + gr * {n}u + gc] = {scaled}; }}")
            w("  }")
            w("  workgroupBarrier();")
    w("}")
    return "\n".join(lines), (-(-n // bn), -(-m // bm), splits)


# (name, M, K, N, layout): "kn" B stored [K, N] (a forward product); "nk" B stored [N, K] (G·Wᵀ);
# "tt" A stored [K, M] and B [K, N] (a weight gradient Aᵀ·G)
SHAPES = [
    ("4096^3", 4096, 4096, 4096, "kn"),
    ("lm-up 2048x576x1536", 2048, 576, 1536, "kn"),
    ("lm-down 2048x1536x576", 2048, 1536, 576, "kn"),
    ("lm-up-dW 576x2048x1536", 576, 2048, 1536, "tt"),
    ("lm-head 2048x576x49152", 2048, 576, 49152, "kn"),
    ("lm-head-dX 2048x49152x576", 2048, 49152, 576, "nk"),
    ("lm-head-dW 49152x2048x576", 49152, 2048, 576, "tt"),
    ("gpt2-qkv 2048x768x2304", 2048, 768, 2304, "kn"),
    ("gpt2-fc 2048x768x3072", 2048, 768, 3072, "kn"),
    ("lm-kv 2048x576x192", 2048, 576, 192, "kn"),
]
VARIANTS = [  # name, split_gemm keywords
    ("split 128x128", dict(sm=4, sn=4)),
    ("split 64x64", dict(sm=2, sn=2)),
    ("split 128x128 B kept", dict(sm=4, sn=4, b_kept=True)),
    ("split 64x64 B kept", dict(sm=2, sn=2, b_kept=True)),
    ("f16 alone 128x128", dict(sm=4, sn=4, products=1)),
    ("f16 alone 128x128 B kept", dict(sm=4, sn=4, products=1, b_kept=True)),
]


class Gpu:
    """A Dawn device with f16, subgroups and subgroup matrices, and the few calls the probe makes."""

    def __init__(self, validate: bool, toggles: tuple[str, ...] = ()) -> None:
        self.validate = validate
        if validate:
            os.environ["WGPU_BACKEND_TYPE"] = "Null"
        import wgpudawn
        from wgpudawn.backends.dawn import extras

        extras.set_instance_extras(enable_toggles=["allow_unsafe_apis", "vulkan_enable_f16_on_nvidia"])
        adapter = wgpudawn.gpu.request_adapter_sync(power_preference="high-performance")
        features = [f for f in ("subgroups", "shader-f16", SUBGROUP_MATRIX) if f in adapter.features]
        if SUBGROUP_MATRIX not in features:
            sys.exit(f"{adapter.summary}: no {SUBGROUP_MATRIX}")
        raised = ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size")
        limits = {name: adapter.limits[name] for name in raised}
        self.device = extras.request_device_sync(
            adapter, required_features=features, required_limits=limits, enable_toggles=list(toggles)
        )
        self.usage = wgpudawn.BufferUsage
        self.sync = self.buffer(16)
        self.summary = adapter.summary

    def buffer(self, nbytes: int, data: np.ndarray | None = None):
        usage = self.usage.STORAGE | self.usage.COPY_SRC | self.usage.COPY_DST
        buffer = self.device.create_buffer(size=max(16, nbytes), usage=usage)
        if data is not None:
            self.device.queue.write_buffer(buffer, 0, np.ascontiguousarray(data).tobytes())
        return buffer

    def job(self, wgsl: str, buffers: list, grid: tuple[int, int, int]):
        module = self.device.create_shader_module(code=wgsl)
        if self.validate:  # Tint has compiled it; the Null adapter's limits would refuse the pipeline
            return None
        pipeline = self.device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        entries = [{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(buffers)]
        group = self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        return pipeline, group, grid

    def run(self, jobs: list, repeats: int = 1) -> None:
        encoder = self.device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        for _ in range(repeats):
            for pipeline, group, grid in jobs:
                compute.set_pipeline(pipeline)
                compute.set_bind_group(0, group)
                compute.dispatch_workgroups(*grid)
        compute.end()
        self.device.queue.submit([encoder.finish()])
        self.device.queue.read_buffer(self.sync, 0, 4)

    def seconds(self, jobs: list) -> float:
        """The best of 3 batches of back-to-back runs (about 0.1 s a batch), per run."""
        self.run(jobs)
        started = time.perf_counter()
        self.run(jobs, 3)
        repeats = int(min(200, max(5, 0.1 / max((time.perf_counter() - started) / 3, 1e-6))))
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            self.run(jobs, repeats)
            best = min(best, (time.perf_counter() - started) / repeats)
        return best

    def read(self, buffer, dtype) -> np.ndarray:
        return np.frombuffer(self.device.queue.read_buffer(buffer), dtype)


def spread(rng, rows: int, cols: int, axis: int) -> np.ndarray:
    """N(0,1) with magnitudes 10^-6…10^1 along `axis` (rows: 0) and 10^-2…1 along the other."""
    x = rng.standard_normal((rows, cols))
    along, across = ((rows, 1), (1, cols)) if axis == 0 else ((1, cols), (rows, 1))
    return (x * 10.0 ** rng.uniform(-6, 1, along) * 10.0 ** rng.uniform(-2, 0, across)).astype(np.float32)


def torch_seconds(m: int, k: int, n: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(m, k, device="cuda"), torch.randn(k, n, device="cuda")
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(3):
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - started) / 20)
    return best


def probe_shape(gpu: Gpu, rng, validate: bool, name: str, m: int, k: int, n: int, layout: str) -> dict:
    kp, record = -(-k // 64) * 64, dict(shape=name, m=m, k=k, n=n, layout=layout, runs=[])
    a, b = spread(rng, m, k, 0), spread(rng, k, n, 1)
    stored = {"A": a.T if layout == "tt" else a, "B": b.T if layout == "nk" else b}
    by_rows = {"A": layout != "tt", "B": layout == "nk"}
    halves, conversions = {}, []
    for side, rows in (("A", m), ("B", n)):
        padded = -(-rows // 128) * 128
        x = gpu.buffer(4 if validate else stored[side].nbytes, None if validate else stored[side])
        size = 4 if validate else padded * kp * 2  # the Null adapter's buffers are small
        hi, lo, scale = gpu.buffer(size), gpu.buffer(size), gpu.buffer(padded * 4)
        if by_rows[side]:
            wgsl, grid = split_rows(rows, k, kp, padded), (min(padded, 65535), -(-padded // 65535), 1)
        else:
            wgsl, grid = split_cols(rows, k, kp, padded), (padded // 64, 1, 1)
        job = gpu.job(wgsl, [x, hi, lo, scale], grid)
        halves[side] = (hi, lo, scale)
        conversions.append(job)
        if side == "B" and not by_rows[side]:  # B [K, N] also kept as it is stored
            kept = (gpu.buffer(size), gpu.buffer(size), gpu.buffer(padded * 4))
            halves["B kept"] = kept
            kept_job = gpu.job(split_cols_kept(rows, k, kp, padded), [x, *kept], (padded // 64, 1, 1))
            if not validate:
                record["convert_kept_ms"] = 1e3 * gpu.seconds([kept_job])
    if not validate:
        record["convert_ms"] = [1e3 * gpu.seconds([job]) for job in conversions]
        hi, lo = gpu.read(halves["A"][0], np.float16), gpu.read(halves["A"][1], np.float16)
        scale = gpu.read(halves["A"][2], np.float32)
        whole = (hi.reshape(-1, kp)[:m, :k].astype(np.float64) + lo.reshape(-1, kp)[:m, :k]) * scale[:m, None]
        record["split_error_A"] = float(np.max(np.abs(whole - a) / np.abs(a).max(1, keepdims=True)))
    rows = np.unique(np.r_[0:8, m - 8 : m, rng.integers(0, m, 16)])
    exact = a[rows].astype(np.float64) @ b.astype(np.float64)
    norm = np.abs(a[rows]).astype(np.float64) @ np.abs(b).astype(np.float64)
    norm[norm == 0] = 1
    record["numpy_f32_error"] = float(np.max(np.abs(a[rows] @ b - exact) / norm))
    for variant, options in VARIANTS:
        if options.get("b_kept") and "B kept" not in halves:
            continue
        b_halves = halves["B kept" if options.get("b_kept") else "B"]
        for splits in (1, 4) if k >= 4096 and m * n <= 2048 * 2048 else (1,):
            wgsl, grid = split_gemm(m, n, kp, splits=splits, **options)
            c = gpu.buffer(4 if validate else splits * m * n * 4)
            operands = [halves["A"][0], b_halves[0]]
            if options.get("products", 3) == 3:
                operands = [halves["A"][0], halves["A"][1], b_halves[0], b_halves[1]]
            job = gpu.job(wgsl, operands + [halves["A"][2], b_halves[2], c], grid)
            if validate:
                continue
            seconds = gpu.seconds([job])
            product = gpu.read(c, np.float32).reshape(splits, m, n).sum(0)
            error = float(np.max(np.abs(product[rows] - exact) / norm))
            tflops = 2 * m * n * k / seconds / 1e12
            record["runs"].append(dict(variant=variant, splits=splits, ms=1e3 * seconds, tflops=tflops, error=error))
            timing = f"{1e3 * seconds:8.3f} ms {tflops:7.2f} TFLOP/s"
            print(f"{name:28s} {variant:24s} {splits} part(s) {timing} error {error:.1e}")
    if not validate:
        torch_s = torch_seconds(m, k, n)
        record["torch_ms"] = torch_s and 1e3 * torch_s
        print(
            f"{name:28s} conversions {sum(record['convert_ms']):.3f} ms (B kept: {record.get('convert_kept_ms')}), "
            f"A's split error {record['split_error_A']:.1e}, numpy fp32 error {record['numpy_f32_error']:.1e}, "
            f"torch fp32 {record['torch_ms']} ms"
        )
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", help="comma-separated substrings of the shape names to run")
    parser.add_argument("--validate", action="store_true", help="only compile every kernel (Dawn's Null backend)")
    parser.add_argument("--toggles", default="", help="Dawn device toggles, comma-separated (disable_robustness)")
    parser.add_argument("--json")
    args = parser.parse_args()
    gpu = Gpu(args.validate, tuple(t for t in args.toggles.split(",") if t))
    print(gpu.summary)
    rng = np.random.default_rng(0)
    wanted = args.shapes.split(",") if args.shapes else None
    records = []
    for shape in SHAPES:
        if wanted and not any(w in shape[0] for w in wanted):
            continue
        if args.validate:
            probe_shape(gpu, rng, True, *shape)
            print("compiled", shape[0])
            continue
        records.append(probe_shape(gpu, rng, False, *shape))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
