"""The kernel ABI: what the code generator hands the runtime for one dispatch.

A KernelSpec is plain data derived from one IR node: the full WGSL source, its storage bindings
(in binding order, all in group 0) and the dispatch grid. Sizes are baked into the WGSL as
constants, so there is no uniform buffer; the runtime binds purely by this table. A node with
several results (an attention's output and log-sum-exp) is one dispatch that writes one buffer
per result.
"""

from __future__ import annotations

from dataclasses import dataclass

Value = tuple[int, int]  # (node id, result index): one buffer's worth of data


@dataclass(frozen=True)
class Binding:
    """One storage buffer binding: the IR value bound there and how the kernel uses it.

    `value` is a node id (a view such as a reshape or a `result` projection names the data it
    views); `index` picks a result of a node with several, for the buffers a kernel writes."""

    name: str  # the WGSL variable name, e.g. "a", "bias", "out"
    value: int
    access: str  # "read" or "read_write"
    index: int = 0


# The kernels that may run without runtime bounds checks, by entry point: tests/test_bounds.py runs
# each in whole training steps at ragged shapes with every array index checked against its
# array's length, and finds none out of bounds. The split products (`matmul_halves`) read halves
# padded to whole tiles (ir/ops/halves.py), so no load needs a check, and run at ragged shapes on
# the H200 (tests/test_matmul_halves.py); the checker covers their subgroup-matrix loads and
# stores too, on a device with f16 subgroup matrices (run on the H200 through Dawn on 2026-12-04:
# none out of bounds; CI has no such device and skips it).
TRUSTED_ENTRY_POINTS = frozenset(
    {
        "attention", "attention_grad_kv", "attention_grad_q", "conv_gemm", "cross_entropy_rows",
        "cross_entropy_rows_grad", "elementwise", "lines", "log_softmax", "log_softmax_grad", "matmul", "matmul_halves",
        "multi_top", "optimizer_update", "recurrent", "reduce_columns", "reduce_rows", "reduce_serial", "reduce_tree",
        "scatter_add", "softmax", "softmax_grad", "sort_ids", "split_halves", "transpose", "winograd",
    }
)  # fmt: skip


@dataclass(frozen=True)
class KernelSpec:
    """One dispatch: computes IR node `node` into the buffers of its results.

    `inplace_input`, when set, is the id of an input whose buffer the kernel updates in place:
    the output binding holds that input's value on entry (optimizer updates work this way,
    because WebGPU forbids binding one buffer both read-only and read-write in a dispatch).
    A kernel of several results says it per result in `inplace_inputs` (result index → the
    input it replaces, or None): a multi-tensor optimizer update replaces many leaves at once.
    `trusted` (its entry point is one of TRUSTED_ENTRY_POINTS) marks a kernel whose indexing the
    suite checks at ragged shapes, so that it may run without the shader compiler's runtime bounds
    checks when the user opts in (`MEGANEURA_UNCHECKED_KERNELS=1`, runtime/device.py);
    `keeps_checks` one measured faster with them, which keeps them where the backend decides per
    module (wgpu-native; not Dawn).
    `workgroup_memory` is the bytes of its workgroup arrays where they grow with a tile
    configuration picked for the target (attention, matmul, conv), so that the runtime refuses a
    step planned for more than its device offers (wgpu does not check it: lavapipe ran a
    43520-byte kernel on a device limited to 32768, out of spec); 0 for the kernels whose arrays
    are a word per thread at most.
    """

    node: int
    label: str  # human-readable, e.g. "fused_matmul 32x64x128 Bᵀ relu(add($acc,$0))"
    wgsl: str
    entry_point: str
    bindings: tuple[Binding, ...]
    grid: tuple[int, int, int]
    workgroup_size: tuple[int, int, int]
    inplace_input: int | None = None
    results: int = 1
    keeps_checks: bool = False
    inplace_inputs: tuple[int | None, ...] = ()
    workgroup_memory: int = 0

    @property
    def trusted(self) -> bool:
        return self.entry_point in TRUSTED_ENTRY_POINTS

    def inplace_of(self, index: int) -> int | None:
        """The input whose buffer result `index` is written into in place (None: a buffer of its own)."""
        if self.inplace_inputs:
            return self.inplace_inputs[index]
        return self.inplace_input if index == 0 else None

    @property
    def inplace_reads(self) -> tuple[int, ...]:
        """Every input that the kernel replaces in place (it reads their old values)."""
        found = (*self.inplace_inputs, self.inplace_input)
        return tuple(i for i in found if i is not None)

    @property
    def written(self) -> tuple[Value, ...]:
        """Every value this dispatch writes: one per result of its node."""
        return tuple((self.node, index) for index in range(self.results))
