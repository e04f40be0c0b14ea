"""`compile()`: trace a model (and loss and optimizer) into one step graph, optimise it with the
e-graph, and hand the plan to the GPU runtime. `Program` is what the user gets back.

>>> import meganeura as mn
>>> from meganeura import nn
>>> spec = mn.f32[32, 64]
>>> spec.shape, spec.dtype
((32, 64), 'f32')
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meganeura import checkpoint, gate, nn
from meganeura.codegen.compiled import CompiledStep
from meganeura.explain import StepReport
from meganeura.ir.autodiff import GradBuilder, gradients
from meganeura.ir.graph import Graph, TensorType
from meganeura.ir.op import ShapeError
from meganeura.ir.ops.random import RNG_STATE, rng_state
from meganeura.ir.trace import Tracer, tracing, user_source_line
from meganeura.optim import Optimizer, ParamGrad
from meganeura.passes import compile_step
from meganeura.target import GENERIC, Target
from meganeura.tensor import Tensor
from meganeura.weights import IncompatibleKeys, load_state


@dataclass(frozen=True)
class InputSpec:
    """The shape and dtype of one named input, written `mn.f32[32, 64]` or `mn.i32[32]`."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def type(self) -> TensorType:
        return TensorType(self.shape, self.dtype)

    def __str__(self) -> str:
        return str(self.type)


class DTypeSpec:
    """`mn.f32` / `mn.i32`: index it with a shape to get an InputSpec."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype

    def __getitem__(self, shape) -> InputSpec:
        if not isinstance(shape, tuple):
            shape = (shape,)
        if any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in shape):
            raise ValueError(f"{self.dtype}[...] needs positive integer dimensions, got {shape}")
        return InputSpec(tuple(shape), self.dtype)

    def __repr__(self) -> str:
        return f"mn.{self.dtype}"

    def __eq__(self, other: object) -> bool:
        """`x.dtype == mn.long`: a spec equals its dtype's name (Tensor.dtype is "f32" or "i32") and
        its aliases (mn.int64 is mn.i32)."""
        name = other.dtype if isinstance(other, DTypeSpec) else other
        return isinstance(name, str) and name == self.dtype

    def __hash__(self) -> int:
        return hash(self.dtype)


f32 = DTypeSpec("f32")
i32 = DTypeSpec("i32")


@dataclass
class TracedStep:
    """What tracing produced: the step graph and the persistent values it reads and updates."""

    graph: Graph
    parameters: dict[str, nn.Parameter]  # every parameter and module buffer (nn.Buffer), in state_dict order
    initial_states: dict[str, np.ndarray]
    label_bounds: dict[str, LabelBound]  # i32 input -> the rows it may index, its ignored value, its use
    recognition: Any = None  # the RewriteReport of the recognition pass on the forward graph, if it ran
    timings: dict[str, float] = field(default_factory=dict)  # seconds: trace, recognize, autodiff
    # The gate's own states (meganeura/gate.py: gradient accumulators, the micro-step counter),
    # beside the optimizer's initial_states: checkpoints keep them, optimizer_state_dict() does not.
    step_states: dict[str, np.ndarray] = field(default_factory=dict)
    finite_checks: tuple[str, ...] = ()  # what each count of the `nonfinite` output is of
    optimizer: Any = None  # the live optimizer whose hyper-parameter vectors the step reads
    # Every name the model's state_dict() writes (a tied parameter under each of its names), for
    # Program.state_dict/load_state_dict; `parameters` holds each value once, under its first name.
    state_names: dict[str, nn.Parameter] = field(default_factory=dict)
    frozen: tuple[str, ...] = ()  # the parameters with requires_grad=False: no gradient, no update


def clipped_gradients(builder: GradBuilder, params: list[ParamGrad], max_norm: float) -> tuple[list[ParamGrad], int]:
    """`params` with each gradient scaled by min(1, max_norm / (‖g‖₂ + 1e-6)) — the norm over all
    of them, torch.nn.utils.clip_grad_norm_'s formula — and the node of that norm."""
    squares = []
    for p in params:
        grad = p.grad
        squares.append(
            builder.emit("sum", [builder.emit("mul", [grad, grad])], axes=tuple(range(builder.graph[grad].type.rank)))
        )
    total = squares[0]
    for square in squares[1:]:
        total = builder.emit("add", [total, square])
    norm = builder.emit("sqrt", [total])
    ratio = builder.emit("div", [builder.const(max_norm), builder.emit("add", [norm, builder.const(1e-6)])])
    scale = builder.emit("clamp", [ratio, builder.const(0.0), builder.const(1.0)])
    clipped = [ParamGrad(p.name, p.node, builder.emit("mul", [p.grad, scale]), p.parameter) for p in params]
    return clipped, norm


@dataclass(frozen=True)
class StepOptions:
    """How the training step treats its gradients before the update (`compile()`'s keywords).

    `clip_grad_norm`: scale every gradient by min(1, max_norm / (‖g‖₂ + 1e-6)), ‖g‖₂ over all
    parameters together, as `torch.nn.utils.clip_grad_norm_` does; the step also outputs the norm
    (`Program.last_grad_norm`). `keep_gradients`: the step also outputs each parameter's
    gradient (clipped, when clipping: PyTorch's p.grad after clip_grad_norm_), for `Program.gradients()`.
    `accumulate`: each step adds gradient/k to accumulators and every k-th step applies the update
    with their sum (clipping, if asked, clips that sum), as `(loss / k).backward()` k times and then
    `optimizer.step()` in PyTorch (meganeura/gate.py).
    `check_finite`: the step counts the NaN/±inf elements of the float inputs, the loss and every
    gradient on the GPU, and applies no update at all unless every count is 0 (meganeura/gate.py);
    `Program.train_step` then raises NonFiniteError naming the first."""

    clip_grad_norm: float | None = None
    keep_gradients: bool = False
    accumulate: int = 1
    check_finite: bool = False

    def __post_init__(self) -> None:
        norm = self.clip_grad_norm
        if norm is not None and not (isinstance(norm, (int, float)) and np.isfinite(norm) and norm > 0):
            raise ValueError(f"clip_grad_norm must be a positive number, got {norm!r}")
        k = self.accumulate
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise ValueError(f"accumulate must be a whole number of steps >= 1, got {k!r}")
        if not isinstance(self.check_finite, (bool, np.bool_)):
            raise TypeError(f"check_finite must be True or False, got {self.check_finite!r}")

    @property
    def trains_only(self) -> bool:
        """Whether an option was set that only a training step (loss= and optimizer=) can have."""
        return self.clip_grad_norm is not None or self.keep_gradients or self.accumulate != 1 or bool(self.check_finite)


def trace_step(
    model: nn.Module,
    loss: Callable[..., Tensor] | None,
    inputs: dict[str, InputSpec],
    optimizer: Optimizer | None,
    recognize: bool = True,
    target: Target = GENERIC,
    options: StepOptions = StepOptions(),
) -> TracedStep:
    """Run the user's model (and loss) on symbolic inputs; append autodiff and the optimizer.

    With `recognize`, the forward graph first goes through the e-graph's recognition rules
    (`rewrite/recognition.py`: hand-written attention and rotary embeddings → the fused
    `attention` and `rope` ops), so that autodiff differentiates the fused ops; this pass only
    runs when the forward has an op such a pattern ends in (`RECOGNIZABLE`). With `options.keep_gradients`,
    each trainable parameter's gradient is also an output (`GRAD_PREFIX` + its name), so that its
    buffer survives the step and `Program.gradients()` can read it.
    """
    check_input_specs(inputs)
    started = time.perf_counter()
    tracer = Tracer()
    parameters = dict(model.named_parameters())
    for name, p in parameters.items():
        tracer.bind(p, tracer.leaf("param", name, p.type))
    # Module buffers (BatchNorm's running statistics) are `state` leaves named by their dotted name;
    # the forward records their new values in graph.updates (nn.Buffer.update).
    for name, buffer in model.named_buffers():
        tracer.bind(buffer, tracer.leaf("state", name, buffer.type))
    symbols = {name: Tensor(tracer, tracer.leaf("input", name, spec.type)) for name, spec in inputs.items()}
    graph = tracer.graph
    initial_states: dict[str, np.ndarray] = {}
    step_states: dict[str, np.ndarray] = {}
    finite_checks: tuple[str, ...] = ()
    with tracing(tracer):
        if loss is not None:
            value = call_user(loss, model, symbols, "loss")
            if not isinstance(value, Tensor) or value.numel() != 1:
                raise ShapeError(f"the loss function must return a single-number Tensor, got {value!r}")
            graph.outputs["loss"] = value.node
        else:
            value = call_user(model, None, symbols, "model")
            values = value if isinstance(value, (tuple, list)) else (value,)
            for index, item in enumerate(values):
                if not isinstance(item, Tensor):
                    raise TypeError(f"the model must return Tensors, got {type(item).__name__} at position {index}")
                graph.outputs["output" if len(values) == 1 else f"output{index}"] = item.node
    traced = time.perf_counter()
    recognition = None
    if recognize and any(node.op in RECOGNIZABLE for node in graph):
        graph, recognition = recognize_forward(graph, target)
        tracer.replace_graph(graph, parameters)
    recognized = time.perf_counter()
    frozen: tuple[str, ...] = ()
    if loss is not None:
        if optimizer is None:
            raise ValueError("compile(loss=...) trains the model: pass optimizer=, e.g. optim.Adam(lr=1e-3)")
        # Frozen parameters (requires_grad=False) are read but not differentiated: autodiff emits
        # only what the trainable ones' gradients need, and the optimizer sees only those.
        frozen = tuple(name for name, p in parameters.items() if not p.requires_grad)
        for p in parameters.values():
            p.compiled_requires_grad.add(p.requires_grad)
        param_nodes = {name: tracer.node_of(p) for name, p in parameters.items() if p.requires_grad}
        grads = gradients(graph, graph.outputs["loss"], list(param_nodes.values()))
        trainable = [
            ParamGrad(name, node, grads[node], parameters[name])
            for name, node in param_nodes.items()
            if grads[node] is not None
        ]
        builder = GradBuilder(graph)
        builder.sources = (user_source_line(),)
        forward_updates = set(graph.updates)  # module buffers (BatchNorm statistics)
        finite = ready = None
        if options.check_finite:
            counts, finite, finite_checks = gate.finiteness(builder, graph, graph.outputs["loss"], trainable)
            graph.outputs[gate.NONFINITE] = counts
        if options.accumulate > 1:
            trainable, ready, step_states = gate.accumulated(builder, trainable, int(options.accumulate))
        if options.clip_grad_norm is not None:
            trainable, norm = clipped_gradients(builder, trainable, options.clip_grad_norm)
            graph.outputs["grad_norm"] = norm
        initial_states = optimizer.build_updates(builder, trainable)
        if options.keep_gradients:
            graph.outputs |= {GRAD_PREFIX + p.name: p.grad for p in trainable}
        if ready is not None:
            updated = [name for name in graph.updates if name not in forward_updates and name not in step_states]
            gate.gate_updates(builder, graph, updated, ready)
        if finite is not None:
            gate.gate_updates(builder, graph, list(graph.updates), finite)
    graph = graph.pruned()
    timings = {
        "trace": traced - started,
        "recognize": recognized - traced,
        "autodiff": time.perf_counter() - recognized,
    }
    # The model remembers the modes it was compiled in: switching later warns (nn.Module.train).
    object.__setattr__(model, "_compiled_modes", getattr(model, "_compiled_modes", frozenset()) | {model.training})
    state = dict(model.named_state())
    bounds = label_bounds(graph)
    step = TracedStep(graph, state, initial_states, bounds, recognition, timings, step_states, finite_checks)
    step.optimizer = optimizer if loss is not None else None
    step.state_names = dict(model.state_items())
    step.frozen = frozen
    return step


GRAD_PREFIX = "grad:"  # the outputs that keep_gradients adds: "grad:fc1.weight"

# Ops that the recognition rules' patterns end in (attention's softmax, rotate_half's concat):
# a forward graph without any skips the pass.
RECOGNIZABLE = ("softmax", "concat")


def recognize_forward(graph: Graph, target: Target = GENERIC):
    """The forward graph with the recognition rules applied (extraction chooses), and the report."""
    from meganeura import rewrite as rewrite_stage

    recognized, report = rewrite_stage.optimize(graph, schedule=(("recognition",),), target=target)
    if not report.uses_family("recognition"):
        return graph, report  # nothing recognised: keep the traced graph as it is
    return recognized, report


def call_user(fn: Callable, model: nn.Module | None, symbols: dict[str, Tensor], what: str):
    """Call the user's loss (model, **inputs) or model (**inputs), explaining a name mismatch."""
    try:
        return fn(model, **symbols) if model is not None else fn(**symbols)
    except TypeError as error:
        if "argument" in str(error) and ("unexpected" in str(error) or "missing" in str(error)):
            raise TypeError(
                f"the {what} was called with inputs {sorted(symbols)} (the names in compile(inputs=...)): {error}"
            ) from None
        raise


def check_input_specs(inputs: dict[str, InputSpec]) -> None:
    if not isinstance(inputs, dict) or not inputs:
        raise ValueError('compile() needs inputs={"name": mn.f32[...], ...}')
    for name, spec in inputs.items():
        if not isinstance(spec, InputSpec):
            raise TypeError(f"input {name!r}: expected a spec such as mn.f32[32, 64], got {spec!r}")


@dataclass(frozen=True)
class LabelBound:
    """What an i32 input used directly as indices may hold: values in [0, rows), or one of
    `ignored` (the ignore_index of nll_loss / cross_entropy, where every use ignores it)."""

    rows: int
    what: str
    ignored: frozenset[int] = frozenset()

    def bad_values(self, values: np.ndarray) -> np.ndarray:
        allowed = (values >= 0) & (values < self.rows)
        for value in self.ignored:
            allowed |= values == value
        return values[~allowed]

    def describe(self) -> str:
        ignored = "".join(f" or {value}" for value in sorted(self.ignored))
        return f"{self.what} must lie in [0, {self.rows}){ignored}"


def label_bounds(graph: Graph) -> dict[str, LabelBound]:
    """For each i32 input used directly as indices (class labels, embedding ids): the number of
    rows it may index (the smallest over its uses), the ignore_index every use skips (class labels
    only), and what it is used as. Checked on every step."""
    bounds: dict[str, LabelBound] = {}
    for node in graph:
        if node.op in ("cross_entropy_rows", "pick") and graph[node.inputs[0]].shape:  # a scalar has no classes
            index, limit, what = node.inputs[1], graph[node.inputs[0]].shape[-1], "class labels"
            ignored = frozenset({node.attr("ignore_index")})
        elif node.op == "gather":
            index, limit, what = node.inputs[1], graph[node.inputs[0]].shape[0], "embedding ids"
            ignored = frozenset()
        else:
            continue
        if graph[index].op == "input":
            name = graph[index].attr("name")
            seen = bounds.get(name, LabelBound(limit, what, ignored))
            uses = seen.what if what in seen.what else f"{seen.what} and {what}"
            bounds[name] = LabelBound(min(seen.rows, limit), uses, seen.ignored & ignored)
    return bounds


class StopExplain(BaseException):
    """Raised in explain mode when a script first tries to run a program.

    A BaseException, as KeyboardInterrupt and SystemExit are: a script that wraps its training step
    in `try: ... except Exception:` (to log and go on) must not swallow it and go on to the next
    step, or to code that needs the step's results."""


_EXPLAIN: list[list[Program]] = []
TRACE_AFTER = 3  # MEGANEURA_TRACE profiles a program's step after this many (GPU clocks idle low)
_TRACED: list[str] = []  # where MEGANEURA_TRACE wrote its trace in this process, once written


@contextlib.contextmanager
def explain_only() -> Iterator[list[Program]]:
    """Within this block, compile() traces and optimises but builds nothing on the GPU; programs
    are collected in the yielded list and running one raises StopExplain."""
    programs: list[Program] = []
    _EXPLAIN.append(programs)
    try:
        yield programs
    finally:
        _EXPLAIN.pop()


MAX_SHAPES = 8  # the input-shape plans a program keeps by default (compile(max_shapes=...))


@dataclass
class Compilation:
    """Everything `compile()` decides before a device is involved: the traced step, the graph the
    e-graph made of it with its report, the lowered kernels and buffer plan, and how long each
    stage took (seconds: trace, recognize, autodiff, encode, saturate, extract, decode, lower),
    and the model, loss and optimizer it was made from (a checkpoint names their classes; a program
    compiles its other input shapes from them: shape_plans.py)."""

    inputs: dict[str, InputSpec]
    traced: TracedStep
    fused_graph: Graph
    rewrite_report: Any  # meganeura.rewrite.RewriteReport
    compiled: CompiledStep
    timings: dict[str, float]
    target: Target = GENERIC
    model: nn.Module | None = None
    optimizer: Optimizer | None = None
    options: StepOptions = StepOptions()
    loss: Callable[..., Tensor] | None = None

    @property
    def total_s(self) -> float:
        return sum(self.timings.values())


def compile_plan(
    model: nn.Module,
    loss: Callable[..., Tensor] | None = None,
    inputs: dict[str, InputSpec] | None = None,
    optimizer: Optimizer | None = None,
    rewrite: bool = True,
    target: Target = GENERIC,
    options: StepOptions = StepOptions(),
) -> Compilation:
    """`compile()` up to the plan, with no device: trace, optimize for `target` (the adapter the
    cost model prices kernels for, meganeura/target.py), lower and plan the buffers."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"compile() expects an nn.Module, got {type(model).__name__}")
    with cyclic_gc_paused():
        return compilation_of(model, loss, inputs or {}, optimizer, rewrite, target, options)


@contextlib.contextmanager
def cyclic_gc_paused():
    """Python's cyclic garbage collector off for a while (back on after, if it was on).

    Compiling allocates hundreds of thousands of small objects that live until it ends (IR nodes,
    e-nodes, memoised expansions); each collection walks them all again, which cost 0.3 s of the
    2.3 s that the SmolLM2-shaped step took to compile (benchmarks/compile_scale.py). Nothing a
    compilation builds needs the collector: what is garbage is freed by reference counting, or at
    the next collection after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def compilation_of(
    model: nn.Module,
    loss: Callable[..., Tensor] | None,
    inputs: dict,
    optimizer: Optimizer | None,
    rewrite: bool,
    target: Target,
    options: StepOptions = StepOptions(),
) -> Compilation:
    from meganeura import rewrite as rewrite_stage

    traced = trace_step(model, loss, inputs, optimizer, recognize=rewrite, target=target, options=options)
    fused_graph, report = rewrite_stage.optimize(traced.graph, enabled=rewrite, target=target)
    if traced.recognition is not None and rewrite:
        report.merge_recognition(traced.recognition)
    lowering = time.perf_counter()
    compiled = compile_step(fused_graph, target)
    timings = dict(traced.timings)
    if report.enabled:
        timings |= {"encode": report.encode_s, "saturate": report.saturate_s, "extract": report.extract_s}
        timings |= {"decode": report.decode_s, "report": report.report_s}
    timings["lower"] = time.perf_counter() - lowering
    return Compilation(
        dict(inputs), traced, fused_graph, report, compiled, timings, target, model, optimizer, options, loss=loss
    )


class Program:
    """A compiled step on the GPU: `train_step(**arrays)` for training, `program(**arrays)` for inference.

    Inputs of shapes other than the declared ones (same ranks and dtypes) compile a plan for
    those shapes once, sharing the parameters, module buffers, optimizer and gate states with the
    declared plan (meganeura/shape_plans.py; `dynamic=False` refuses them). `compilation`,
    `traced`, `graph`, `fused_graph`, `rewrite_report`, `compiled`, `executable` and `report()`
    are the declared shapes' plan; `plans` holds them all."""

    def __init__(
        self, compilation: Compilation, dynamic: bool = True, max_shapes: int = MAX_SHAPES, seed: int | None = None
    ) -> None:
        from meganeura.shape_plans import ShapePlans

        self.compilation = compilation
        self.inputs = compilation.inputs
        self.traced = compilation.traced
        self.graph = self.traced.graph
        self.fused_graph, self.rewrite_report = compilation.fused_graph, compilation.rewrite_report
        self.compiled: CompiledStep = compilation.compiled
        self.is_training = "loss" in self.graph.outputs
        traced = self.traced
        self.runs = 0  # steps run, for MEGANEURA_TRACE
        self.steps = 0  # train steps run (or restored from a checkpoint); a skipped one does not count
        # Steps k of compile(accumulate=k), and how many of the current cycle have run (the
        # device's counter, mirrored: a checkpoint restores both).
        self.accumulate = int(compilation.options.accumulate)
        self.micro_step = 0
        # Optimizer updates applied (torch's state["step"]): a refused step and the micro-steps
        # before a cycle's last do not count. The next step applies update optimizer_steps + 1,
        # whose scalars (Adam's bias corrections…) write_hypers writes first; a checkpoint or an
        # optimizer state loaded sets it (checkpoint.load_optimizer_state).
        self.optimizer_steps = 0
        # The gradients' global 2-norm before clipping, of the last step (compile(clip_grad_norm=…)).
        self.last_grad_norm: float | None = None
        # What a step reads back: a training step its loss, the clipped norm and the NaN/inf counts
        # where compiled with them; an inference program its outputs.
        outputs = self.graph.outputs
        extra = tuple(name for name in ("grad_norm", gate.NONFINITE) if name in outputs)
        self.step_reads = ("loss", *extra) if self.is_training else tuple(outputs)
        # The hyper-parameter values on the device, to write only those that changed.
        self.hypers_written: dict[str, Any] = dict(traced.initial_states)
        self.hypers_key: tuple | None = None  # (hyper_key, step_key) when they were last written
        # The random numbers' seed and step counter (ir/ops/random.py), for a program that draws
        # any: the host writes both into the RNG state leaf before each run (`draw_step`).
        self.rng_seed: int | None = None
        self.rng_step = 0
        self.requested_seed = checked_seed(seed)
        if RNG_STATE in self.compiled.leaf_types:
            self.program_seed()
        self.trace_path = os.environ.get("MEGANEURA_TRACE")
        # The optimizer's and the gate's states on the device by name, which every plan binds.
        self.shared_states: dict[str, Any] = {}
        if _EXPLAIN:
            _EXPLAIN[-1].append(self)
            self.executable = None
        else:
            self.executable = self.new_executable(compilation)
        self.plans = ShapePlans(compilation, self.executable, self.new_executable, dynamic, max_shapes)
        self.last_plan = self.plans.declared  # the plan of the last step run (gradients() reads it)

    def new_executable(self, compilation: Compilation):
        """The executable of one of this program's plans on the device: the model's parameters and
        buffers shared with every program of it, the optimizer's and gate's states with this
        program's other plans."""
        from meganeura import runtime

        traced = compilation.traced
        states = {**traced.initial_states, **traced.step_states}
        if RNG_STATE in compilation.compiled.leaf_types:
            states[RNG_STATE] = rng_state(self.program_seed(), self.rng_step)
        return runtime.Executable(
            compilation.compiled, runtime.default_device(), traced.parameters, states, shared_states=self.shared_states
        )

    def program_seed(self) -> int:
        """The seed of this program's random numbers, chosen when a plan first draws any
        (compile(seed=...), else the next of mn.manual_seed's program seeds)."""
        if self.rng_seed is None:
            self.rng_seed = nn.next_program_seed() if self.requested_seed is None else self.requested_seed
        return self.rng_seed

    @property
    def dynamic(self) -> bool:
        """Whether inputs of new shapes compile a plan for them (compile(dynamic=...))."""
        return self.plans.dynamic

    def run(self, values: dict[str, np.ndarray], read: tuple[str, ...]) -> dict[str, np.ndarray]:
        """One step on the device; with MEGANEURA_TRACE set, the first program to reach its
        TRACE_AFTER + 1-th step profiles it and writes the trace there (once per process)."""
        executable = self.executable_of(values)
        self.write_hypers(executable)
        self.draw_step(executable)
        self.runs += 1
        path = self.trace_path
        if path and self.runs == TRACE_AFTER + 1 and not _TRACED:
            _TRACED.append(path)
            if not executable.device.has_timestamps:  # a trace was asked for, not a failed run
                print(f"MEGANEURA_TRACE: {executable.device.describe()} has no timestamp queries", file=sys.stderr)
                return executable.run(values, read)
            out, profile = executable.profile(values, read)
            profile.write_chrome_trace(path)
            print(f"{profile}\nwrote the Chrome trace of step {self.runs} to {path}", file=sys.stderr)
            return out
        return executable.run(values, read)

    def write_hypers(self, executable) -> None:
        """Write the hyper-parameter vector of each parameter group whose values for this step
        differ from the last step's into its leaf (a few bytes each; nothing is recompiled): the
        optimizer's values and those torch derives from them and the step count in double
        (Optimizer.hyper_fields), for update optimizer_steps + 1. Queued before the step's
        submission, so a step stays one submission and reads nothing back."""
        optimizer = self.traced.optimizer
        if optimizer is None:
            return
        step = self.optimizer_steps + 1
        # ~3 µs, against ~35 for checking and building the vectors
        key = (optimizer.hyper_key(), optimizer.step_key(step))
        if key == self.hypers_key:
            return
        checked = self.hypers_key is not None and key[0] == self.hypers_key[0]  # only the step moved
        written = self.hypers_written
        for name, value in optimizer.hyper_values(step, checked).items():
            if name in executable.states and not np.array_equal(written.get(name), value):
                executable.write_state(name, value)
                written[name] = value
        self.hypers_key = key

    def draw_step(self, executable) -> None:
        """Write the RNG state of the run about to start — the seed and this run's step counter —
        into its leaf (16 bytes, with the step's other writes: no readback, one submission), and
        advance the counter, so that every run draws fresh numbers (ir/ops/random.py)."""
        if self.rng_seed is None or RNG_STATE not in executable.states:
            return
        executable.write_state(RNG_STATE, rng_state(self.rng_seed, self.rng_step))
        self.rng_step += 1

    def profile(self, warmup: int = 3, **arrays: np.ndarray):
        """Run `warmup` steps, then one more with every kernel timed on the GPU (runtime/profile.py):
        its Profile, to print (time by kernel kind, the slowest kernels with their source lines) or
        to write as a Chrome trace (`profile.write_chrome_trace("trace.json")`). The last warm-up
        step is timed as one pass, as steps run (`Profile.step_ns`). The steps are real: a training
        program trains on `arrays` warmup + 1 times.

        >>> # print(program.profile(x=xb, y=yb))
        """
        values = self.check_inputs(arrays)
        executable = self.executable_of(values)
        step_ns = None
        for index in range(warmup):
            if index == warmup - 1 and executable.device.has_timestamps:
                self.write_hypers(executable)
                self.draw_step(executable)
                self.runs += 1
                out, step_ns = executable.timed_run(values, self.step_reads)
            else:
                out = self.run(values, self.step_reads)
            if self.is_training:
                self.step_done(out)
        self.write_hypers(executable)
        self.draw_step(executable)
        self.runs += 1
        out, profile = executable.profile(values, self.step_reads)
        if self.is_training:
            self.step_done(out)
        return dataclasses.replace(profile, step_ns=step_ns)

    def require_executable(self, plan=None):
        """The GPU executable (the declared shapes' plan's, or `plan`'s: all bind the same state); in
        explain mode (none was built) stop the user's script instead."""
        executable = self.executable if plan is None else plan.executable
        if executable is None:
            raise StopExplain()
        return executable

    def executable_of(self, values: dict[str, np.ndarray]):
        """The executable of the plan for `values` (from check_inputs), now the last plan run."""
        self.last_plan = self.plans.of(values)
        return self.require_executable(self.last_plan)

    def train_step(self, **arrays: np.ndarray) -> float:
        """Run forward, backward and the optimizer update once; return the loss.

        With compile(accumulate=k) the update runs on every k-th call, with the gradients of the
        k micro-batches (the loss returned is each micro-batch's own, unscaled). With
        check_finite=True a step that meets a NaN or infinity changes nothing and raises
        gate.NonFiniteError."""
        if not self.is_training:
            raise RuntimeError("this program was compiled without loss=: call it, program(**inputs), to run the model")
        return self.step_done(self.run(self.check_inputs(arrays), self.step_reads))

    def step_done(self, out: dict[str, np.ndarray]) -> float:
        """Account for a training step that ran (train_step, profile): refuse one that met a NaN
        or infinity, count it, follow the accumulation cycle; its loss."""
        loss = float(out["loss"].reshape(()))
        if gate.NONFINITE in out:
            self.refuse_nonfinite(out[gate.NONFINITE], loss)
        self.steps += 1
        self.micro_step = (self.micro_step + 1) % self.accumulate
        if self.micro_step == 0:  # this step applied the update
            self.optimizer_steps += 1
            if self.traced.optimizer is not None:  # what the host keeps across updates follows (NAdam's mu_product)
                self.traced.optimizer.applied(self.optimizer_steps)
        if "grad_norm" in out and self.micro_step == 0:  # the norm that clipping used: of the accumulated sum
            self.last_grad_norm = float(out["grad_norm"].reshape(()))
        return loss

    def refuse_nonfinite(self, counts: np.ndarray, loss: float) -> None:
        """Raise NonFiniteError naming the first non-finite value of a step (which changed nothing)."""
        error = gate.nonfinite_error(counts, self.traced.finite_checks, loss, self.accumulate > 1)
        if error is not None:
            raise error

    def __call__(self, **arrays: np.ndarray):
        """Run the model on `arrays`; return its output as numpy (a tuple for several outputs)."""
        if self.is_training:
            raise RuntimeError("this is a training program: use train_step(**inputs)")
        out = self.run(self.check_inputs(arrays), self.step_reads)
        results = tuple(out[name] for name in self.step_reads)
        return results[0] if len(results) == 1 else results

    def check_inputs(self, arrays: dict[str, Any]) -> dict[str, np.ndarray]:
        """Every declared input, with the declared dtype and rank and the shapes of a plan (compiled
        now for new shapes, when dynamic); anything else is an error."""
        missing = [name for name in self.inputs if name not in arrays]
        unknown = [name for name in arrays if name not in self.inputs]
        if missing or unknown:
            raise KeyError(
                f"inputs do not match compile(inputs=...): missing {missing}, unknown {unknown}; "
                f"expected {{{', '.join(f'{k}: {v}' for k, v in self.inputs.items())}}}"
            )
        plan = self.plans.plan_for(arrays).compilation
        checked = {}
        for name, spec in plan.inputs.items():
            checked[name] = coerce_input(name, arrays[name], spec)
            if name in plan.traced.label_bounds:
                bound = plan.traced.label_bounds[name]
                bad = bound.bad_values(checked[name])
                if bad.size:
                    raise ValueError(
                        f"input {name!r}: {bound.describe()}, got {bad.size} value(s) outside, in "
                        f"[{bad.min()}, {bad.max()}]"
                    )
        return checked

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the model's current parameters and buffers by PyTorch-style name, as the
        model's state_dict() names them (a tied parameter under each of its names, one array)."""
        values: dict[int, np.ndarray] = {}
        for p in self.traced.state_names.values():
            if id(p) not in values:
                values[id(p)] = p.numpy()
        return {name: values[id(p)] for name, p in self.traced.state_names.items()}

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Replace the parameters and buffers, as `nn.Module.load_state_dict` (numpy arrays or torch
        tensors; every mismatch reported at once, nothing written unless everything fits; with
        `strict=False` the names skipped are returned; a tied parameter takes either name or both)."""
        return load_state(self.traced.state_names, state, strict)

    def gradients(self) -> dict[str, np.ndarray]:
        """The gradient of the loss with respect to each trainable parameter in the last
        `train_step`, by name (copies read back now). Only a program compiled with
        `keep_gradients=True` keeps them: there they are outputs of the step, whose buffers
        survive it, and nothing is read back unless this is called; a step compiled without the
        flag neither keeps nor reads them."""
        from meganeura.runtime.executable import read_buffer

        if not self.is_training:
            raise RuntimeError("gradients() is for a training program (compiled with loss= and optimizer=)")
        names = [name for name in self.graph.outputs if name.startswith(GRAD_PREFIX)]
        if not names:
            raise RuntimeError("this program does not keep its gradients: compile it with keep_gradients=True")
        executable = self.require_executable(self.last_plan)
        if self.runs == 0:
            raise RuntimeError("gradients() reads the last step's gradients, and no step has run yet")
        gradients = {}
        for name in names:
            buffer, _, type = executable.outputs[name]
            gradients[name.removeprefix(GRAD_PREFIX)] = read_buffer(executable.device, buffer, type)
        return gradients

    def fit(self, batches, epochs: int = 1, **options):
        """Run the training loop over `batches` for `epochs`: a tqdm progress bar, callbacks,
        evaluation, checkpoints every N steps and resume (meganeura/fit.py); returns the History.

        >>> # history = program.fit([{"x": xb, "y": yb}, ...], epochs=5, checkpoint="run.safetensors",
        >>> #                       checkpoint_every=100, resume=True)
        """
        from meganeura.fit import fit

        return fit(self, batches, epochs, **options)

    def save(self, path) -> None:
        """Write a checkpoint — parameters, buffers, optimizer state, step count — to `path`
        atomically (meganeura/checkpoint.py; a safetensors file)."""
        checkpoint.save(self, path)

    def load(self, path) -> None:
        """Restore a checkpoint written by `save`; a file that does not fit is refused, every
        reason named, and nothing changes."""
        checkpoint.load(self, path)

    def optimizer_state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the optimizer's state (moments, momentum buffers, step counts) by name."""
        return checkpoint.optimizer_state(self)

    def load_optimizer_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Replace the optimizer's state; every name, shape and dtype is checked before any write."""
        checkpoint.load_optimizer_state(self, state)

    def report(self) -> StepReport:
        """The rewrites the e-graph chose, costs, e-graph figures and the kernels with their source lines,
        of the declared shapes' plan; the input shapes compiled (`shapes`)."""
        plans = self.plans
        shapes, limit = plans.shapes(), plans.max_shapes if plans.dynamic else None
        return StepReport(
            self.rewrite_report, self.graph, self.fused_graph, compiled=self.compiled, shapes=shapes, max_shapes=limit
        )


def coerce_input(name: str, value: Any, spec: InputSpec) -> np.ndarray:
    """`value` as a contiguous array of the spec's dtype, or a TypeError/ValueError saying why not."""
    array = np.asarray(float(value) if spec.dtype == "f32" and type(value) in (int, bool) else value)
    if array.shape != spec.shape:
        hint = ""
        if array.ndim == len(spec.shape) and array.shape[1:] == spec.shape[1:]:
            hint = (
                f"; a compiled step has static shapes: for batches of {array.shape[0]}, compile another program "
                f"with {name}: mn.{spec.dtype}[{', '.join(map(str, array.shape))}] (it shares the model's weights)"
            )
        raise ValueError(f"input {name!r}: expected shape {list(spec.shape)}, got {list(array.shape)}{hint}")
    if spec.dtype == "f32":
        if not (np.issubdtype(array.dtype, np.floating)):
            raise TypeError(f"input {name!r}: expected floating-point data for {spec}, got {array.dtype}")
        return np.asarray(array, dtype=np.float32, order="C")  # (ascontiguousarray makes 0-d 1-d)
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"input {name!r}: expected integer data for {spec}, got {array.dtype}")
    fits = np.can_cast(array.dtype, np.int32)  # int32 and narrower: no values to check
    if array.size and not fits and (array.min() < np.iinfo(np.int32).min or array.max() > np.iinfo(np.int32).max):
        raise ValueError(f"input {name!r}: values do not fit in int32")
    return np.asarray(array, dtype=np.int32, order="C")


def compile(
    model: nn.Module,
    loss: Callable[..., Tensor] | None = None,
    inputs: dict[str, InputSpec] | None = None,
    optimizer: Optimizer | None = None,
    rewrite: bool = True,
    *,
    clip_grad_norm: float | None = None,
    keep_gradients: bool = False,
    accumulate: int = 1,
    check_finite: bool = False,
    seed: int | None = None,
    dynamic: bool = True,
    max_shapes: int = MAX_SHAPES,
) -> Program:
    """Compile a training step (with `loss` and `optimizer`) or an inference program (without).

    The loss function receives the model and the inputs by name: `loss(model, x=..., y=...)`.
    Programs compiled from the same model share its parameters on the GPU. `rewrite=False`
    skips the e-graph (every op becomes its own kernel), for comparisons. The plan is made for
    the adapter the program runs on (its compute units and binding limit: meganeura/target.py).
    `clip_grad_norm=max_norm` clips the gradients' global 2-norm before the update as
    `torch.nn.utils.clip_grad_norm_(parameters, max_norm)` does (`program.last_grad_norm`).
    `keep_gradients=True` keeps each step's parameter gradients for `program.gradients()`.
    `accumulate=k` applies the update every k-th `train_step`, with the gradients of the k
    micro-batches averaged, as `(loss / k).backward()` k times and then `optimizer.step()`.
    `check_finite=True` checks the float inputs, the loss and every gradient for NaN/inf on the GPU;
    a step that finds one updates nothing and `train_step` raises `mn.NonFiniteError` naming it.
    `seed` seeds the random numbers the step draws (mn.rand, F.dropout…: Philox4x32-10, a fresh
    stream every step, the same numbers for the same seed); None takes the next seed of
    `mn.manual_seed`'s sequence. The seed and the step counter are part of checkpoints.
    `dynamic=True`: inputs of other shapes than `inputs` declares (same ranks and dtypes) compile a
    plan for their shapes once, which shares the parameters and the optimizer state (a run that
    alternates shapes trains as PyTorch does); at most `max_shapes` plans are kept, the least
    recently used other one evicted with a warning (meganeura/shape_plans.py). `dynamic=False`
    refuses inputs of other shapes.
    """
    from meganeura import runtime

    options = StepOptions(
        clip_grad_norm=clip_grad_norm, keep_gradients=keep_gradients, accumulate=accumulate, check_finite=check_finite
    )
    if options.trains_only and (optimizer is None or loss is None):
        raise ValueError(
            "clip_grad_norm, keep_gradients, accumulate and check_finite act on a training step's gradients: "
            "pass loss= and optimizer= too"
        )
    from meganeura.shape_plans import check_max_shapes

    check_max_shapes(dynamic, max_shapes)  # before compiling
    target = GENERIC if _EXPLAIN else runtime.default_device().target
    checked_seed(seed)
    compilation = compile_plan(model, loss, inputs, optimizer, rewrite, target, options)
    return Program(compilation, dynamic, max_shapes, seed=seed)


def checked_seed(seed: int | None) -> int | None:
    """A program's seed modulo 2⁶⁴ (as torch.manual_seed takes negative ones), or a TypeError."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    return int(seed) % 2**64
