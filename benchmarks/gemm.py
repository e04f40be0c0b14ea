"""GEMM alone, side by side with PyTorch fp32 (TF32 off) on the same GPU, same shapes.

    python benchmarks/gemm.py [--shapes 4096x4096x4096,8192x768x3072] [--repeat 10] [--forward-only]

The measurement lives in the package (meganeura/bench/gemm.py; `python -m meganeura bench gemm`
runs the same one with the other workloads): per M×K×N shape, the forward A·B and the gradient
products G·Bᵀ and Aᵀ·G; ours is the median of `repeat` dispatches timed with GPU timestamps,
PyTorch's `repeat` products between two CUDA events; each of our results is checked against numpy.
Defaults: 4096³, the FFN shape 8192×768×3072 and the SmolLM2-shaped LM's projections
(2048×576×1536, 2048×1536×576) and tied head (2048×576×49152).
"""

from __future__ import annotations

import argparse

from meganeura.bench import gemm
from meganeura.bench.harness import preload_torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join("x".join(map(str, shape)) for shape in gemm.SHAPES))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--forward-only", action="store_true", help="only A·B, not the gradient products")
    args = parser.parse_args()
    preload_torch()  # before the device opens (see its comment)
    from meganeura.runtime import default_device

    print(f"adapter: {default_device().describe()}")
    kinds = gemm.PRODUCTS[:1] if args.forward_only else gemm.PRODUCTS
    results = []
    for product in gemm.products(gemm.parse_shapes(args.shapes), kinds):
        results.append(gemm.measure(product, args.repeat))
        print(gemm.table(results[-1:]).splitlines()[1], flush=True)
    print(gemm.table(results))


if __name__ == "__main__":
    main()
