"""A compiled step on a device: every buffer, pipeline and bind group made once from a
`CompiledStep` (codegen/compiled.py: the kernels and the buffer plan, plain data); `run` submits
one command buffer (the inputs' copies from their staging buffer, runtime/uploads.py, one compute
pass, readback copies, end-of-step state copies; on Dawn the pass cut into a few command buffers,
SUBMIT_PARTS) and records the next step's while the GPU runs.

Parameters live in device buffers: the Executable points each `nn.Parameter.storage` at its
buffer, and an Executable compiled later from the same model on the same device binds that same
buffer, so programs share weights without copies. Module buffers (`nn.Buffer`, e.g. BatchNorm's
running statistics) are `state` leaves given among the parameters: they are shared the same way,
and their end-of-step updates land in the shared buffer. The other states (the optimizer's
moments and step counts, its hyper-parameter vectors, the gate's accumulators) belong to one
program: the executables of one program compiled for several input shapes share them through
`shared_states` (compiler.Program, shape_plans.py), so that every shape updates one optimizer state.
"""

from __future__ import annotations

import time

import numpy as np

from meganeura.codegen.buffers import BufferPlan
from meganeura.codegen.compiled import CompiledStep
from meganeura.codegen.kernel import KernelSpec
from meganeura.ir.graph import TensorType
from meganeura.ir.ops.constants import constant_array
from meganeura.parameter import Buffer, Parameter
from meganeura.runtime.backend import NAME as BACKEND
from meganeura.runtime.backend import wgpu
from meganeura.runtime.device import Device
from meganeura.runtime.encoding import recorder
from meganeura.runtime.mapping import read_after_submit
from meganeura.runtime.profile import DISPATCHES_PER_SET, Profile, kernel_times
from meganeura.runtime.uploads import input_staging, numpy_dtype, staged_array

BUFFER_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
MAP_ALIGN = 8  # WebGPU's alignment of mapAsync offsets
record = recorder()

# On Dawn a step goes to the queue as up to SUBMIT_PARTS command buffers of at least PART_DISPATCHES
# dispatches each, one submit each, so that the GPU starts on the first part while Dawn prepares
# the next: it turns a command buffer into Vulkan commands when it is submitted (about 3 µs a
# dispatch on the H200), not when it is recorded. wgpu-native does that work while recording,
# which runs ahead (`record_next`): one part. On the H200, 2026-12-04 (benchmarks/plan_ab.py,
# Dawn without robustness, MEGANEURA_TENSOR_CORES=1, wall ms a step with 1 / 4 / 8 / 16 equal
# parts): GPT-2 47.1 / 44.5 / 44.3 / 44.2 against 43.1 of GPU time as one pass; SmolLM2 71.1 /
# 64.6 / 63.5 / 63.4 against 61.8; with the f32 kernels 58.2 → 55.9 and 72.2 → 68.0 (1 → 8).
# wgpu-native, 1 → 8: GPT-2 57.7 → 57.5, SmolLM2 71.2 → 71.7.
SUBMIT_PARTS = 8
PART_DISPATCHES = 64


def submit_parts(dispatches: int) -> int:
    """How many command buffers a step of `dispatches` goes to the queue in (above)."""
    if BACKEND != "dawn":
        return 1
    return max(1, min(SUBMIT_PARTS, dispatches // PART_DISPATCHES))


CANARY = 0x7F7FDEAD  # 3.4e38, near f32's largest: read past a value's end, it shows as huge or inf results


def read_buffer(device: Device, buffer: wgpu.GPUBuffer, type: TensorType) -> np.ndarray:
    """The current contents of `buffer` as an array of `type` (waits for queued work)."""
    data = device.queue.read_buffer(buffer, 0, max(4, type.nbytes))
    return np.frombuffer(data, numpy_dtype(type.dtype), count=type.numel).reshape(type.shape).copy()


def write_buffer(device: Device, buffer: wgpu.GPUBuffer, type: TensorType, value: np.ndarray, what: str) -> None:
    """Upload `value` into `buffer`, checking its shape against `type`."""
    array = staged_array(type, value, what)
    if array.size:
        device.queue.write_buffer(buffer, 0, array)


class DeviceStorage:
    """A Parameter's value in a device buffer (the `nn.ParameterStorage` protocol)."""

    def __init__(self, device: Device, buffer: wgpu.GPUBuffer, type: TensorType) -> None:
        self.device = device
        self.buffer = buffer
        self.type = type

    def read(self) -> np.ndarray:
        return read_buffer(self.device, self.buffer, self.type)

    def write(self, value: np.ndarray) -> None:
        write_buffer(self.device, self.buffer, self.type, value, "parameter")


# `heat` doubles its command buffers until each keeps the GPU busy this long: long enough that the
# host's submits leave no gaps for the clocks to fall in, short enough to stop near `seconds`.
HEAT_BUFFER_SECONDS = 0.02


class Executable:
    """One compiled step with all its device objects made once.

    `run(inputs, read)` uploads the inputs, runs every kernel in one compute pass (`parts` of it
    on Dawn) and returns the outputs named in `read`; parameters and optimizer states are updated
    on the device.

    With `canary_words` (for tests), every buffer gets that many extra words after its data,
    filled with CANARY, and every binding spans its whole buffer, so that a kernel writing past the
    end of a value its buffer holds (an index ≥ its elements: a bound off by one) changes them
    instead of being clamped into the value; `changed_canaries()` lists the buffers where that
    happened.

    With `shared_states` (a program's executables for several input shapes), each state leaf
    (not a module buffer) found there binds that storage's buffer and keeps its value (its
    initial value is not uploaded), and each one this executable creates is added there.
    """

    record_ahead = True  # record step N+1's commands while the GPU runs step N (see run)

    def __init__(
        self,
        step: CompiledStep,
        device: Device,
        parameters: dict[str, Parameter],
        initial_states: dict[str, np.ndarray],
        canary_words: int = 0,
        shared_states: dict[str, DeviceStorage] | None = None,
    ) -> None:
        self.step = step
        self.canary_words = canary_words
        # (Canary buffers are larger than a shared one: an executable with them shares nothing.)
        self.shared_states = shared_states if shared_states is not None and not canary_words else {}
        self.graph = step.graph
        self.device = device
        self.kernels: list[KernelSpec] = step.kernels
        self.plan: BufferPlan = step.plan
        self.leaf_types = step.leaf_types
        self.check_bindings()
        self.check_workgroup_memory()
        self.check_sizes()
        self.check_leaves(parameters, initial_states)  # before any Parameter is moved to the device
        self.inherited = self.inherited_states(parameters)
        self.buffers = self.create_buffers(parameters)
        self.write_canaries()
        self.inputs = {name: self.buffers[b] for name, b in self.plan.leaf_buffers("input").items()}
        self.states = {
            **{name: self.buffers[b] for name, b in self.plan.leaf_buffers("param").items()},
            **{name: self.buffers[b] for name, b in self.plan.leaf_buffers("state").items()},
        }
        self.upload_leaves(initial_states)
        self.share_states(parameters)
        # The inputs' staging buffer (runtime/uploads.py), None where they go by queue.write_buffer.
        staged = {name: (buffer, self.leaf_types[name]) for name, buffer in self.inputs.items()}
        self.staging = input_staging(device.device, staged, device.limits.get("max-buffer-size"))
        self.dispatches = [self.prepare_dispatch(spec) for spec in self.plan.schedule]
        self.parts = submit_parts(len(self.dispatches))
        self.copies = [(self.buffers[c.source], self.buffers[c.target], c.nbytes) for c in self.plan.copies]
        self.outputs, self.readback = self.prepare_readback()
        self.readback_plans: dict[tuple[str, ...], tuple] = {}
        self.recorded: tuple[tuple[str, ...], list[wgpu.GPUCommandBuffer]] | None = None  # the next step's, by `read`

    # -- construction ---------------------------------------------------------------------------

    def check_sizes(self) -> None:
        """Fail before creating anything if a buffer is larger than this device can create or bind
        (a tensor over `max-storage-buffer-binding-size`: 128 MiB on lavapipe), naming the tensors."""
        binding = self.device.limits.get("max-storage-buffer-binding-size")
        largest = self.device.limits.get("max-buffer-size")
        for slot in self.plan.buffers:
            for limit, what in ((largest, "max-buffer-size"), (binding, "max-storage-buffer-binding-size")):
                if limit is not None and slot.nbytes > limit:
                    names = slot.name or ", ".join(f"%{node}" for node, _ in slot.values[:4])
                    raise ValueError(
                        f"{names}: a buffer of {slot.nbytes:,} bytes ({slot.role}) is over {self.device.describe()}'s "
                        f"{what} of {limit:,} bytes; nothing was allocated. Use a smaller batch or model, or an "
                        "adapter with larger limits (python -m meganeura devices lists them)"
                    )

    def check_bindings(self) -> None:
        """Fail before creating anything if a kernel binds more buffers than this device allows
        (a step compiled for another target)."""
        limit = self.device.limits.get("max-storage-buffers-per-shader-stage")
        worst = max(self.kernels, key=lambda spec: len(spec.bindings), default=None)
        if limit is not None and worst is not None and len(worst.bindings) > limit:
            raise ValueError(
                f"kernel %{worst.node} ({worst.label[:100]}) binds {len(worst.bindings)} storage buffers, "
                f"{self.device.describe()} allows {limit}: the step was compiled for {self.step.target.name} "
                "(compile it with this device's target: mn.compile does)"
            )

    def check_workgroup_memory(self) -> None:
        """Fail before creating anything if a kernel's workgroup arrays are larger than this device
        allows (a step compiled for another target): wgpu does not refuse such a pipeline, and a
        driver may run it wrong or crash."""
        limit = self.device.limits.get("max-compute-workgroup-storage-size")
        worst = max(self.kernels, key=lambda spec: spec.workgroup_memory, default=None)
        if limit is not None and worst is not None and worst.workgroup_memory > limit:
            raise ValueError(
                f"kernel %{worst.node} ({worst.label[:100]}) needs {worst.workgroup_memory} bytes of workgroup "
                f"memory, {self.device.describe()} allows {limit} (max-compute-workgroup-storage-size): the step "
                f"was compiled for {self.step.target.name} (compile it with this device's target: mn.compile does)"
            )

    def check_leaves(self, parameters: dict[str, Parameter], initial_states: dict[str, np.ndarray]) -> None:
        """Every parameter and state of the graph is given, with the graph's shape."""
        shared = {name: p for name, p in parameters.items() if isinstance(p, Buffer)}
        for role, given in (("param", parameters), ("state", {**initial_states, **shared})):
            names = self.plan.leaf_buffers(role)
            missing = [name for name in names if name not in given]
            if missing:
                raise KeyError(f"the graph reads {role}s {missing}, which were not given; got {sorted(given)}")
            for name in names:
                shape = given[name].type.shape if isinstance(given[name], Parameter) else np.shape(given[name])
                if tuple(shape) != self.leaf_types[name].shape:
                    raise ValueError(f"{role} {name}: the graph needs {self.leaf_types[name]}, got shape {list(shape)}")

    def inherited_states(self, parameters: dict[str, Parameter]) -> dict[str, DeviceStorage]:
        """The program's states (not module buffers) this graph reads that `shared_states` already
        holds, checked against the graph's types before anything is created."""
        inherited = {}
        for name in self.plan.leaf_buffers("state"):
            storage = self.shared_states.get(name)
            if storage is None or isinstance(parameters.get(name), Buffer):
                continue
            if storage.device is not self.device or storage.type != self.leaf_types[name]:
                raise ValueError(
                    f"state {name}: the program's buffer holds {storage.type} on {storage.device.describe()}, "
                    f"this graph needs {self.leaf_types[name]} on {self.device.describe()}"
                )
            inherited[name] = storage
        return inherited

    def share_states(self, parameters: dict[str, Parameter]) -> None:
        """Add the states this executable created to `shared_states`, for the program's next one."""
        for name, index in self.plan.leaf_buffers("state").items():
            if name not in self.inherited and not isinstance(parameters.get(name), Buffer):
                self.shared_states[name] = DeviceStorage(self.device, self.buffers[index], self.leaf_types[name])

    def create_buffers(self, parameters: dict[str, Parameter]) -> list[wgpu.GPUBuffer]:
        """One device buffer per plan slot; a parameter's slot is its shared storage buffer, a state's
        the program's buffer for it where it has one (`shared_states`)."""
        buffers = []
        for slot in self.plan.buffers:
            if slot.role == "param" or (slot.role == "state" and isinstance(parameters.get(slot.name), Buffer)):
                buffers.append(self.parameter_buffer(slot.name, parameters[slot.name], slot.nbytes))
            elif slot.role == "state" and slot.name in self.inherited:
                buffers.append(self.inherited[slot.name].buffer)
            else:
                label = f"#{slot.index} {slot.role} {slot.name}".strip()
                size = slot.nbytes + 4 * self.canary_words
                buffers.append(self.device.device.create_buffer(label=label, size=size, usage=BUFFER_USAGE))
        return buffers

    def write_canaries(self) -> None:
        if self.canary_words:
            words = np.full(self.canary_words, CANARY, np.uint32)
            for slot, buffer in zip(self.plan.buffers, self.buffers, strict=True):
                self.device.queue.write_buffer(buffer, slot.nbytes, words.tobytes())

    def changed_canaries(self) -> list[str]:
        """The buffers whose canary words a kernel overwrote (with `canary_words`), with what they hold."""
        changed = []
        for slot, buffer in zip(self.plan.buffers, self.buffers, strict=True):
            words = np.frombuffer(self.device.queue.read_buffer(buffer, slot.nbytes, 4 * self.canary_words), np.uint32)
            if (words != CANARY).any():
                changed.append(f"#{slot.index} {slot.role} {slot.name}: {[hex(w) for w in words[:4]]}")
        return changed

    def parameter_buffer(self, name: str, param: Parameter, nbytes: int) -> wgpu.GPUBuffer:
        """The parameter's buffer on this device: its current storage if it has one here, else a new one."""
        storage = param.storage
        if isinstance(storage, DeviceStorage) and storage.device is self.device and not self.canary_words:
            if storage.type != param.type:
                raise ValueError(
                    f"parameter {name}: its device buffer holds {storage.type}, the graph needs {param.type}"
                )
            return storage.buffer
        size = nbytes + 4 * self.canary_words
        buffer = self.device.device.create_buffer(label=f"param {name}", size=size, usage=BUFFER_USAGE)
        new_storage = DeviceStorage(self.device, buffer, param.type)
        new_storage.write(param.numpy())  # reads the old storage (host or another device) first
        param.storage = new_storage
        return buffer

    def upload_leaves(self, initial_states: dict[str, np.ndarray]) -> None:
        """Initial optimizer states, and the constants that kernels read from buffers."""
        for name, index in self.plan.leaf_buffers("state").items():
            # A module buffer's shared storage holds its value, and so does the buffer of a state
            # the program's executable for another shape made (its current value, not the initial).
            if name not in initial_states or name in self.inherited:
                continue
            write_buffer(self.device, self.buffers[index], self.leaf_types[name], initial_states[name], f"state {name}")
        for slot in self.plan.buffers:
            if slot.role == "const":
                node = self.graph[slot.values[0][0]]
                value = constant_array(node)
                write_buffer(self.device, self.buffers[slot.index], node.type, value, f"constant %{node.id}")

    def prepare_dispatch(self, spec: KernelSpec) -> tuple[wgpu.GPUComputePipeline, wgpu.GPUBindGroup, tuple]:
        """(pipeline, bind group, grid) for one kernel, bound by its spec's binding table."""
        pipeline, layout = self.device.pipeline(spec)
        group = self.device.device.create_bind_group(layout=layout, entries=self.binding_entries(spec))
        return pipeline, group, spec.grid

    def binding_entries(self, spec: KernelSpec) -> list[dict]:
        """The bind group entries of `spec`'s binding table, in its order (a buffer bound
        read_write and again in the same dispatch is a plan error)."""
        slots = [self.plan.slot(b) for b in spec.bindings]
        for binding, slot in zip(spec.bindings, slots, strict=True):
            if binding.access == "read_write" and slots.count(slot) > 1:
                raise ValueError(f"{spec.label}: buffer #{slot} is bound twice, once read_write (plan error)")
        return [
            {
                "binding": index,
                "resource": {
                    "buffer": self.buffers[slot],
                    "offset": 0,
                    "size": self.buffers[slot].size if self.canary_words else max(4, self.value_nbytes(b)),
                },
            }
            for index, (b, slot) in enumerate(zip(spec.bindings, slots, strict=True))
        ]

    def value_nbytes(self, binding) -> int:
        return self.graph[binding.value].types[binding.index].nbytes

    def prepare_readback(self) -> tuple[dict[str, tuple[wgpu.GPUBuffer, int, TensorType]], wgpu.GPUBuffer | None]:
        """Each output's (buffer, offset in the readback buffer, type), and the readback buffer."""
        outputs, offset = {}, 0
        for name, value in self.graph.outputs.items():
            outputs[name] = (self.buffers[self.plan.node_slot[value]], offset, self.graph[value].type)
            offset += -(-max(4, self.graph[value].type.nbytes) // MAP_ALIGN) * MAP_ALIGN
        if not outputs:
            return outputs, None
        usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
        return outputs, self.device.device.create_buffer(label="readback", size=offset, usage=usage)

    def readback_plan(self, read: tuple[str, ...]) -> tuple[list[tuple], int, int]:
        """The copies into the readback buffer for `read`, and the byte range to map."""
        plan = self.readback_plans.get(read)
        if plan is None:
            unknown = [name for name in read if name not in self.outputs]
            if unknown:
                raise KeyError(f"cannot read {unknown}: the graph's outputs are {list(self.outputs)}")
            copies = [
                (self.outputs[name][0], self.outputs[name][1], max(4, self.outputs[name][2].nbytes)) for name in read
            ]
            start = min(offset for _, offset, _ in copies)
            end = max(offset + nbytes for _, offset, nbytes in copies)
            plan = self.readback_plans[read] = (copies, start, end - start)
        return plan

    # -- running --------------------------------------------------------------------------------

    def run(self, inputs: dict[str, np.ndarray], read: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """Upload `inputs`, run the step (one submit, or `parts` on Dawn: SUBMIT_PARTS), and return
        the outputs named in `read`.

        While the GPU runs the step, the host records the next step's command buffers (for the same
        `read`), so a loop of steps pays the recording once, hidden behind the GPU's work."""
        read, copies, start, size = self.upload(inputs, read)
        self.submit(self.commands_for(read, copies))
        if self.record_ahead:
            self.record_next(read, copies)
        return self.read_outputs(read, start, size)

    def submit(self, commands: list[wgpu.GPUCommandBuffer]) -> None:
        """Submit a step's command buffers, one submit each (SUBMIT_PARTS); then ask for the
        inputs' staging buffer mapped again."""
        for buffer in commands:
            self.device.queue.submit([buffer])
        if self.staging is not None:
            self.staging.request()

    def step_commands(
        self, copies: list[tuple], timestamps: dict | None = None, parts: int = 1
    ) -> list[wgpu.GPUCommandBuffer]:
        """One step's command buffers: the inputs' copies from their staging buffer, every dispatch
        in `parts` compute passes of about equal counts, a command buffer each (one pass, writing
        `timestamps`, a pass's timestamp_writes, where given), then `copies` and the end-of-step
        state copies."""
        if timestamps is not None and parts != 1:
            raise ValueError("a step's timestamps are one pass's: parts must be 1")
        count = len(self.dispatches)
        bounds = [count * i // parts for i in range(parts + 1)]
        buffers = []
        for i in range(parts):
            encoder = self.device.device.create_command_encoder()
            if i == 0:
                self.encode_uploads(encoder)
            compute = encoder.begin_compute_pass(timestamp_writes=timestamps)
            self.encode_dispatches(compute, self.dispatches[bounds[i] : bounds[i + 1]])
            compute.end()
            if i == parts - 1:
                self.encode_copies(encoder, copies)
            buffers.append(encoder.finish())
        return buffers

    def timed_run(self, inputs: dict[str, np.ndarray], read: tuple[str, ...] = ()) -> tuple[dict, int]:
        """`run`, with the step's one compute pass writing GPU timestamps at its start and end:
        the outputs named in `read`, and the step's GPU time in ns as a normal step runs it (no
        pass per dispatch, unlike `profile`). A step recorded ahead is dropped (it has no
        timestamps); the next `run` records anew."""
        self.require_timestamps("timing")
        read, copies, start, size = self.upload(inputs, read)
        self.recorded = None
        writes, resolve, stamps = pass_timestamps(self.device.device, "step timestamps")
        self.submit([*self.step_commands(copies, writes), resolve])
        outputs = self.read_outputs(read, start, size)
        return outputs, pass_ns(self.device.device, stamps)

    def record_next(self, read: tuple[str, ...], copies: list[tuple]) -> None:
        """Record the next step's commands now. A command buffer names buffers, not their
        contents, so the next call's uploads and any state written in between still reach it
        (queue writes run before the submit that follows them)."""
        try:
            self.recorded = (read, self.step_commands(copies, parts=self.parts))
        except Exception:  # recorded again in the next call, which raises it there, for that step
            self.recorded = None

    def take_recorded(self, read: tuple[str, ...]) -> list[wgpu.GPUCommandBuffer] | None:
        """The command buffers recorded ahead for `read`, once (a command buffer is submitted once)."""
        recorded, self.recorded = self.recorded, None
        return recorded[1] if recorded is not None and recorded[0] == read else None

    def commands_for(self, read: tuple[str, ...], copies: list[tuple]) -> list[wgpu.GPUCommandBuffer]:
        """This step's command buffers: those recorded ahead for `read`, else recorded now."""
        return self.take_recorded(read) or self.step_commands(copies, parts=self.parts)

    def heat(self, inputs: dict[str, np.ndarray], seconds: float = 0.1) -> None:
        """Keep the GPU busy with the step's kernels for at least `seconds` of wall time, then wait
        for it. Its clocks idle low (an H200 at 345 MHz), and fall again while it waits on the
        host: fresh 4096³ products in one process, each run behind its 128 MB upload, had an H200
        at 435-945 MHz after two or three of them, running the product at 7-17 TFLOP/s instead of
        38 (docs/performance-log.md, 2026-12-04). So the inputs are uploaded once, then only the
        step's dispatches are submitted, in command buffers doubled in length until each keeps
        the GPU busy HEAT_BUFFER_SECONDS. For timing only: the state it leaves is not that of
        whole steps (no end-of-step state copies)."""
        self.run(inputs)
        repeats, start = 1, time.perf_counter()
        while time.perf_counter() - start < seconds:
            began = time.perf_counter()
            self.submit_and_wait([self.repeated_commands(repeats)])
            if time.perf_counter() - began < HEAT_BUFFER_SECONDS:
                repeats *= 2

    def repeated_ns(self, inputs: dict[str, np.ndarray], count: int) -> float:
        """The GPU time in ns of the step's dispatches, each run `count` times back to back in one
        compute pass after one upload of `inputs`, by the pass's timestamps: the mean of a run.
        How a kernel is timed warm (after `heat`), like PyTorch's `count` products between two
        CUDA events; only for steps whose kernels give the same result run again (no state)."""
        self.require_timestamps("timing")
        if count < 1:
            raise ValueError(f"repeated_ns needs a count of at least 1, got {count}")
        self.run(inputs)
        writes, resolve, stamps = pass_timestamps(self.device.device, "repeated timestamps")
        self.device.queue.submit([self.repeated_commands(count, writes), resolve])
        return pass_ns(self.device.device, stamps) / count

    def repeated_commands(self, count: int, timestamps: dict | None = None) -> wgpu.GPUCommandBuffer:
        """A command buffer of one compute pass that runs the step's dispatches `count` times (no
        uploads, no copies), writing `timestamps` (a pass's timestamp_writes) where given."""
        encoder = self.device.device.create_command_encoder()
        compute = encoder.begin_compute_pass(timestamp_writes=timestamps)
        for _ in range(count):
            self.encode_dispatches(compute, self.dispatches)
        compute.end()
        return encoder.finish()

    def submit_and_wait(self, commands: list[wgpu.GPUCommandBuffer]) -> None:
        self.device.queue.submit(commands)
        # A 4-byte read waits for the GPU (wgpu-py 0.32's on_submitted_work_done_sync fails in cffi).
        self.device.queue.read_buffer(self.buffers[0], 0, 4)

    def profile(self, inputs: dict[str, np.ndarray], read: tuple[str, ...] = ()) -> tuple[dict, Profile]:
        """`run`, with every dispatch in a compute pass of its own that writes GPU timestamps at its
        start and end: the outputs named in `read`, and the time of each kernel (runtime/profile.py)."""
        self.require_timestamps("profiling")
        read, copies, start, size = self.upload(inputs, read)
        device = self.device.device
        encoder = device.create_command_encoder()
        self.encode_uploads(encoder)
        stamp_buffers = []
        for first in range(0, len(self.dispatches), DISPATCHES_PER_SET):
            chunk = self.dispatches[first : first + DISPATCHES_PER_SET]
            queries = device.create_query_set(label="kernel timestamps", type="timestamp", count=2 * len(chunk))
            for index, dispatch in enumerate(chunk):
                writes = {
                    "query_set": queries,
                    "beginning_of_pass_write_index": 2 * index,
                    "end_of_pass_write_index": 2 * index + 1,
                }
                compute = encoder.begin_compute_pass(timestamp_writes=writes)
                self.encode_dispatches(compute, [dispatch])
                compute.end()
            stamp_buffers.append(resolve_stamps(device, encoder, queries, 2 * len(chunk)))
        self.encode_copies(encoder, copies)
        self.submit([encoder.finish()])
        outputs = self.read_outputs(read, start, size)
        stamps = [stamp for buffer in stamp_buffers for stamp in read_stamps(device, buffer)]
        return outputs, Profile(self.device.describe(), kernel_times(self.kernel_facts(), stamps))

    def require_timestamps(self, what: str) -> None:
        """Refuse `what` (profiling, timing) on an adapter without the timestamp-query feature."""
        if not self.device.has_timestamps:
            adapter = self.device.describe()
            raise RuntimeError(f"{what} needs the adapter's timestamp-query feature, which {adapter} lacks")

    def kernel_facts(self) -> list[tuple]:
        """(node, op, label, source lines, bytes, flops) of each dispatch, in run order."""
        facts = []
        for spec in self.plan.schedule:
            node = self.graph[spec.node]
            bytes_, flops = self.priced(spec.node)
            facts.append((spec.node, node.op, spec.label, node.sources, bytes_, flops))
        return facts

    def priced(self, node_id: int) -> tuple[int, int]:
        """The bytes and flops the cost model gives a kernel's node (0, 0 for a step lowered
        without its pricing: `codegen.compiled.lower_step` called alone)."""
        if self.step.pricing is None:
            return 0, 0
        cost = self.step.pricing(self.graph, node_id)
        return cost.bytes, cost.flops

    def upload(self, inputs: dict[str, np.ndarray], read: tuple[str, ...]) -> tuple[tuple[str, ...], list, int, int]:
        """Check and upload `inputs`; the outputs to read, their copies and the range to map."""
        if inputs.keys() != self.inputs.keys():
            missing = [name for name in self.inputs if name not in inputs]
            unknown = [name for name in inputs if name not in self.inputs]
            raise KeyError(f"inputs do not match the graph: missing {missing}, unknown {unknown}")
        read = tuple(read)
        copies, start, size = self.readback_plan(read) if read else ([], 0, 0)
        if self.staging is not None:
            self.staging.write(inputs)
        else:
            for name, buffer in self.inputs.items():
                write_buffer(self.device, buffer, self.leaf_types[name], inputs[name], f"input {name!r}")
        return read, copies, start, size

    def encode_uploads(self, encoder: wgpu.GPUCommandEncoder) -> None:
        """The inputs' copies from their staging buffer, first in a step's commands (none without one)."""
        if self.staging is not None:
            self.staging.encode(encoder)

    @staticmethod
    def encode_dispatches(compute: wgpu.GPUComputePassEncoder, dispatches: list[tuple]) -> None:
        """Record `dispatches` into the pass (runtime/encoding.py: the backend's C calls where available)."""
        record(compute, dispatches)

    def encode_copies(self, encoder: wgpu.GPUCommandEncoder, copies: list[tuple]) -> None:
        """The readback copies of the outputs asked for, then the end-of-step state copies."""
        # Outputs are read before the state copies, so an output that is an updated leaf's old
        # value still reads as the old value.
        for source, offset, nbytes in copies:
            encoder.copy_buffer_to_buffer(source, 0, self.readback, offset, nbytes)
        for source, target, nbytes in self.copies:
            encoder.copy_buffer_to_buffer(source, 0, target, 0, nbytes)

    def read_outputs(self, read: tuple[str, ...], start: int, size: int) -> dict[str, np.ndarray]:
        """Map the readback range once and slice out each requested output."""
        if not read:
            return {}
        data = read_after_submit(self.device.device, self.readback, start, size)
        results = {}
        for name in read:
            _, offset, type = self.outputs[name]
            array = np.frombuffer(data, numpy_dtype(type.dtype), count=type.numel, offset=offset - start)
            results[name] = array.reshape(type.shape)
        return results

    # -- state access ---------------------------------------------------------------------------

    def read_state(self, name: str) -> np.ndarray:
        """The current value of an optimizer state or parameter of this graph."""
        return read_buffer(self.device, self.state_buffer(name), self.leaf_types[name])

    def write_state(self, name: str, value: np.ndarray) -> None:
        """Overwrite an optimizer state or parameter of this graph."""
        write_buffer(self.device, self.state_buffer(name), self.leaf_types[name], value, f"state {name}")

    def state_buffer(self, name: str) -> wgpu.GPUBuffer:
        if name not in self.states:
            raise KeyError(f"no state or parameter {name!r}; this graph has {list(self.states)}")
        return self.states[name]


def pass_timestamps(device: wgpu.GPUDevice, label: str) -> tuple[dict, wgpu.GPUCommandBuffer, wgpu.GPUBuffer]:
    """For timing one compute pass: its `timestamp_writes` (at its start and end), the command
    buffer that resolves them (submitted after the pass's) and the buffer `pass_ns` reads."""
    queries = device.create_query_set(label=label, type="timestamp", count=2)
    writes = {"query_set": queries, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}
    encoder = device.create_command_encoder()
    stamps = resolve_stamps(device, encoder, queries, 2)
    return writes, encoder.finish(), stamps


def pass_ns(device: wgpu.GPUDevice, stamps: wgpu.GPUBuffer) -> int:
    """The GPU time in ns of a pass timed by `pass_timestamps`, after its submit (waits for it)."""
    begin, end = read_stamps(device, stamps)
    return max(0, end - begin)


def resolve_stamps(device: wgpu.GPUDevice, encoder: wgpu.GPUCommandEncoder, queries, count: int) -> wgpu.GPUBuffer:
    """A mappable buffer that `encoder` fills with the `count` timestamps of `queries` (u64 each)."""
    nbytes = 8 * count
    usage = wgpu.BufferUsage
    resolved = device.create_buffer(size=nbytes, usage=usage.QUERY_RESOLVE | usage.COPY_SRC)
    readable = device.create_buffer(size=nbytes, usage=usage.MAP_READ | usage.COPY_DST)
    encoder.resolve_query_set(queries, 0, count, resolved, 0)
    encoder.copy_buffer_to_buffer(resolved, 0, readable, 0, nbytes)
    return readable


def read_stamps(device: wgpu.GPUDevice, buffer: wgpu.GPUBuffer) -> list[int]:
    """The timestamps (ns) in a `resolve_stamps` buffer, after its submit."""
    return np.frombuffer(read_after_submit(device, buffer, 0, buffer.size), np.uint64).astype(np.int64).tolist()
