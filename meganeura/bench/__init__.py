"""The side-by-side bench: `python -m meganeura bench [workload ...]` (meganeura/bench/cli.py).

It runs our training step and PyTorch's in one process on the same GPU, the same model from the
same initial weights on the same batch, and prints medians of the step times, the ratios, our
dispatches per step, compile time and top kernel kinds; GEMM alone against torch.mm.

| module | owns |
|---|---|
| `models.py` | the DSL models (SmolLM2-shaped Llama, GPT-2, ResNet stacks, MLPs) |
| `workloads.py` | each workload: model, loss, inputs, optimizer, a seeded batch, its sizes (full and small) |
| `mirrors.py` | their torch.nn mirrors, loading our initial state_dict by name (imports torch) |
| `harness.py` | running and timing both sides, the first-step loss check |
| `gemm.py` | GEMM alone: our matmul kernel vs torch.mm, forward and gradient products |
| `report.py` | the text, Markdown and JSON output |
| `cli.py` | the command line |

Nothing here is imported by `import meganeura`; torch is imported only when it is installed.
"""
