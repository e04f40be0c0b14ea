"""GEMM alone, side by side with PyTorch fp32 (TF32 off) on the same GPU, same shapes: the bench's
`gemm` workload and benchmarks/gemm.py.

A shape is M×K×N of C = A·B (A [M, K], B [K, N], row-major). Each shape is measured as three
products: the forward A·B and the two gradient products of a training step, dA = G·Bᵀ
(M×N·N×K) and dB = Aᵀ·G (K×M·M×N), with G [M, N]; the transposes are operand flags of one
matmul, as autodiff emits them (ir/ops/matmul.py), and strided views on PyTorch's side (cuBLAS
reads them transposed). All three do 2·M·N·K flops.

Ours: the product as the compiler plans it for the adapter (the e-graph may split a narrow output
over a long K into partials and their sum: both kernels count), after HEAT_SECONDS of it back to
back, timed as `repeat` products back to back in one compute pass between two GPU timestamps
(Executable.repeated_ns): the mean, and the median of TIMINGS such passes. Its result is checked
against numpy. PyTorch: `repeat` products between two CUDA events (the mean), after warm-up; on a
machine without CUDA, torch on the CPU timed by the wall clock (not a GPU-vs-GPU ratio).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from meganeura.ir.graph import TensorType
from meganeura.ir.trace import Tracer
from meganeura.passes import compile_step
from meganeura.rewrite import optimize
from meganeura.runtime import Executable, default_device

SHAPES: tuple[tuple[int, int, int], ...] = (
    (4096, 4096, 4096),
    (8192, 768, 3072),  # GPT-2's FFN at batch 8 × seq 1024
    (2048, 576, 1536),  # the SmolLM2-shaped LM's gate/up projections (batch 8 × seq 256)
    (2048, 1536, 576),  # its down projection
    (2048, 576, 49152),  # its tied head
)
SMALL_SHAPES: tuple[tuple[int, int, int], ...] = ((128, 96, 80), (64, 72, 200), (64, 200, 72))  # ragged
PRODUCTS = ("A·B", "G·Bᵀ", "Aᵀ·G")  # forward, dA, dB
CHECK_RTOL = 1e-3  # of the largest |value|: a wrong kernel is off by far more, fp32 rounding by far less
# Ours is timed after this long of its kernels back to back (Executable.heat): GPU clocks idle
# low and fall while the GPU waits on uploads. Timed the old way — a 0.05 s heat of whole runs, each
# behind its 128 MB upload, then a product per submit — the 4096³ product read 7-17 TFLOP/s
# instead of 38 from the third fresh executable of a process on, the H200 at 435-945 MHz.
HEAT_SECONDS = 0.3
TIMINGS = 3  # of `repeat` products back to back in one pass each: their median


@dataclass(frozen=True)
class Product:
    """One matmul: its operands as stored and their transpose flags."""

    shape: tuple[int, int, int]  # the M×K×N of the forward it belongs to
    name: str  # one of PRODUCTS

    @property
    def operands(self) -> tuple[tuple[int, int], tuple[int, int], bool, bool]:
        """(stored shape of the left operand, of the right one, transpose_a, transpose_b)."""
        m, k, n = self.shape
        return {
            "A·B": ((m, k), (k, n), False, False),
            "G·Bᵀ": ((m, n), (k, n), False, True),
            "Aᵀ·G": ((m, k), (m, n), True, False),
        }[self.name]

    @property
    def flops(self) -> int:
        m, k, n = self.shape
        return 2 * m * k * n

    def label(self) -> str:
        m, k, n = self.shape
        return f"{m}x{k}x{n} {self.name}"

    def reference(self, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        _, _, ta, tb = self.operands
        return (left.T if ta else left) @ (right.T if tb else right)


@dataclass
class GemmResult:
    product: Product
    ours_s: float
    max_error: float  # of our first result, relative to the largest |value| of numpy's
    torch_s: float | None
    torch_note: str  # where torch ran, or why it did not

    @property
    def ours_tflops(self) -> float:
        return self.product.flops / self.ours_s / 1e12

    @property
    def torch_tflops(self) -> float | None:
        return None if self.torch_s is None else self.product.flops / self.torch_s / 1e12

    def as_dict(self) -> dict:
        return {
            "product": self.product.label(),
            "shape": list(self.product.shape),
            "kind": self.product.name,
            "flops": self.product.flops,
            "ours_ms": 1e3 * self.ours_s,
            "ours_tflops": self.ours_tflops,
            "max_error": self.max_error,
            "torch_ms": None if self.torch_s is None else 1e3 * self.torch_s,
            "torch_tflops": self.torch_tflops,
            "torch": self.torch_note,
            "ratio": None if self.torch_s is None else self.ours_s / self.torch_s,
        }


def operand_values(product: Product, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    left, right, _, _ = product.operands
    return rng.normal(size=left).astype(np.float32), rng.normal(size=right).astype(np.float32)


def ours_seconds(product: Product, repeat: int, values=None) -> tuple[float, float]:
    """(the median time of the product over `repeat` profiled runs, the max error of its result
    relative to numpy's largest |value|). The product is planned as the compiler plans it for the
    adapter: where the e-graph splits it along K (rewrite/matmul.py `matmul_split_k`), its time
    is the split kernel's and the sum's of its partials together."""
    left_shape, right_shape, ta, tb = product.operands
    tracer = Tracer()  # builds the graph node by node, each typed by its op's declaration
    graph = tracer.graph
    a = tracer.leaf("input", "a", TensorType(left_shape))
    b = tracer.leaf("input", "b", TensorType(right_shape))
    graph.outputs["c"] = tracer.emit("matmul", [a, b], transpose_a=ta, transpose_b=tb)
    device = default_device()
    planned, _ = optimize(graph, target=device.target)
    executable = Executable(compile_step(planned, device.target), device, {}, {})
    left, right = values if values is not None else operand_values(product)
    inputs = {"a": left, "b": right}
    got = executable.run(inputs, ("c",))["c"]
    expected = product.reference(left, right)
    error = float(np.abs(got - expected).max() / max(float(np.abs(expected).max()), 1e-30))
    executable.heat(inputs, HEAT_SECONDS)
    times = sorted(executable.repeated_ns(inputs, repeat) for _ in range(TIMINGS))
    return times[len(times) // 2] / 1e9, error


def torch_seconds(product: Product, repeat: int, values=None) -> tuple[float | None, str]:
    """(PyTorch's seconds per product, where it ran) or (None, why not)."""
    try:
        import torch
    except ImportError:
        return None, "torch not installed"
    on_gpu = torch.cuda.is_available()
    device = "cuda" if on_gpu else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    left, right = values if values is not None else operand_values(product)
    a, b = torch.as_tensor(left, device=device), torch.as_tensor(right, device=device)
    _, _, ta, tb = product.operands
    a, b = (a.t() if ta else a), (b.t() if tb else b)
    for _ in range(3):
        a @ b
    if not on_gpu:  # each product timed alone, the median: the CPU's first calls and threads vary
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - started)
        return sorted(times)[len(times) // 2], "cpu (no CUDA): not a GPU-vs-GPU ratio"
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / repeat, f"cuda ({torch.cuda.get_device_name()}), fp32, TF32 off"


def measure(product: Product, repeat: int, with_torch: bool = True) -> GemmResult:
    values = operand_values(product)
    ours, error = ours_seconds(product, repeat, values)
    theirs, note = torch_seconds(product, repeat, values) if with_torch else (None, "not measured")
    return GemmResult(product, ours, error, theirs, note)


def products(shapes, kinds=PRODUCTS) -> list[Product]:
    return [Product(tuple(shape), kind) for shape in shapes for kind in kinds]


def parse_shapes(text: str) -> tuple[tuple[int, int, int], ...]:
    """ "4096x4096x4096,8192x768x3072" → ((4096, 4096, 4096), (8192, 768, 3072))."""
    shapes = []
    for item in text.split(","):
        parts = item.strip().lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(f"a GEMM shape is MxKxN with positive integers, got {item!r}")
        shapes.append(tuple(int(p) for p in parts))
    return tuple(shapes)


def table(results: list[GemmResult]) -> str:
    """One line per product: our TFLOP/s, PyTorch's, the ratio of times (ours / PyTorch)."""
    columns = f"{'ours ms':>9} {'TFLOP/s':>8} {'torch ms':>9} {'TFLOP/s':>8} {'ours/torch':>10} {'error':>8}"
    lines = [f"  {'product':<24} {columns}"]
    for r in results:
        theirs = (
            f"{1e3 * r.torch_s:>9.3f} {r.torch_tflops:>8.3f} {r.ours_s / r.torch_s:>10.2f}"
            if r.torch_s is not None
            else f"{'-':>9} {'-':>8} {'-':>10}"
        )
        flag = "" if r.max_error <= CHECK_RTOL else "  WRONG RESULT"
        lines.append(
            f"  {r.product.label():<24} {1e3 * r.ours_s:>9.3f} {r.ours_tflops:>8.3f} {theirs} {r.max_error:>8.1e}{flag}"
        )
    notes = sorted({r.torch_note for r in results})
    lines.append(f"  (torch: {'; '.join(notes)})")
    return "\n".join(lines)
