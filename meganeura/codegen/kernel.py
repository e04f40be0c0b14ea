"""The kernel ABI: what the code generator hands the runtime for one dispatch.

A KernelSpec is plain data derived from one IR node (rarely two, see `also_writes`): the full WGSL source, its storage
bindings (in binding order, all in group 0) and the dispatch grid. Sizes are baked into the
WGSL as constants, so there is no uniform buffer; the runtime binds purely by this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Binding:
    """One storage buffer binding: the IR value (node id) bound there and how the kernel uses it."""

    name: str  # the WGSL variable name, e.g. "a", "bias", "out"
    value: int  # IR node id whose buffer is bound
    access: str  # "read" or "read_write"


@dataclass(frozen=True)
class KernelSpec:
    """One dispatch: computes IR node `node` into its buffer.

    `also_writes` are further IR nodes the same dispatch computes, each into its own buffer (the
    attention forward writes its log-sum-exp too). `inplace_input`, when set, is the id of an
    input whose buffer the kernel updates in place:
    the output binding holds that input's value on entry (optimizer updates work this way,
    because WebGPU forbids binding one buffer both read-only and read-write in a dispatch).
    """

    node: int
    label: str  # human-readable, e.g. "fused_matmul 32x64x128 Bᵀ relu(add($acc,$0))"
    wgsl: str
    entry_point: str
    bindings: tuple[Binding, ...]
    grid: tuple[int, int, int]
    workgroup_size: tuple[int, int, int]
    inplace_input: int | None = None
    also_writes: tuple[int, ...] = ()

    @property
    def written(self) -> tuple[int, ...]:
        """Every IR node whose value this dispatch writes."""
        return (self.node, *self.also_writes)
