"""The conformance table: every item of the PyTorch surface that meganeura covers (and the items
it does not, with the reason), each with cases written once as text that is valid PyTorch and
valid meganeura ("port a model by changing its imports").

This module is data: it imports neither torch nor meganeura, so that three programs share it:

- scripts/make_conformance_references.py evaluates every case with torch (float64) and stores
  inputs, outputs and gradients in tests/reference/conformance.npz;
- tests/test_conformance.py evaluates every case with meganeura (the numpy interpreter in float64,
  and compiled on the device) and compares;
- scripts/conformance_table.py writes docs/supported-ops.md's list and the unsupported items of
  the README's limits from `markdown_sections()` (a test checks that both agree).

An expression is evaluated with these names: `torch` (meganeura's side: `meganeura`), `F`
(`torch.nn.functional` / `meganeura.functional`), `nn`, `optim`, `lr_scheduler`, `math`, and the
case's inputs. A module case builds `m` from its `module` text first (torch's parameters are loaded
into meganeura's module); an optimizer case builds `opt` from `params` (p and q, two parameters);
a scheduler case builds `sched` from `opt`; an init case fills `w`.

Inputs are described, not stored here: `normal(3, 5)` is a seeded standard normal of that shape
(float32 values, so that the float32 device run starts from torch's numbers), `uniform(lo, hi,
*shape)`, `positive`, `away` (|x| in [0.5, 2], either sign), `special` (normals with NaN, +inf and
-inf placed in), `tied` (small whole numbers: ties), `probs` (in [0.05, 0.95]), `ints(lo, hi,
*shape)` (int64 in torch, int32 here), `values([...])` (given numbers). Every float input gets a
gradient unless the case names `grads=`; the gradient is that of Σ_k Σ(out_k · r_k) for a fixed
random cotangent r_k per output (0 where the output is not finite).

`compare=` says what is compared with torch: "values" (outputs and gradients; the default), or
"sample" (random numbers: meganeura's generator is not torch's, so the outputs' distribution is
compared, two-sample Kolmogorov-Smirnov, and no gradients; InitCase has its own modes). torch
computes in float64 unless a case says `torch_dtype="float32"` (where torch's result depends on
the dtype). Every supported case runs on the numpy interpreter; `device=` says whether it also
runs on the device: None (the default) for an item's first supported case, the cases of NaN and
±inf inputs and the random ones; True or False to choose (lavapipe compiles each kernel afresh,
0.1 s for most, 2-4 s for a product's or a convolution's: the device run takes the cases that
reach other kernels, and device=False keeps a module or a variant whose kernels another case
compiles off it).

What meganeura lacks is marked, with the reason, by item name (UNSUPPORTED) or by case id
(UNSUPPORTED_CASES, `<item name>[<index>]`); a case that passes on the interpreter but fails on
the device is marked in DEVICE_FAILS. The test asserts that every marked case still fails, so a
mark cannot outlive its reason; the README's limits list them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = {  # category: its heading in docs/supported-ops.md
    "tensor": "Tensor operations (`torch.*`, `torch.Tensor.*`)",
    "functional": "Functions (`torch.nn.functional`)",
    "loss": "Losses (`torch.nn.functional`, `torch.nn`)",
    "module": "Modules (`torch.nn`)",
    "init": "Initialisation (`torch.nn.init`)",
    "optimizer": "Optimizers (`torch.optim`)",
    "scheduler": "Schedulers (`torch.optim.lr_scheduler`)",
}

# Tolerances: meganeura's float64 interpreter against torch's float64 (the formulas may differ in
# the order of their additions), and the float32 device against torch's float64 (relative to the
# larger of 1 and the result's largest finite magnitude for atol).
# (torch's RMSNorm with eps=None takes its dtype's machine epsilon: float64's 2.2e-16 in the
# reference, float32's 1.2e-7 here: ~1e-7 relative in the values, ~1e-6 in the gradients, which
# those cases allow.)
# (HARDSIGMOID: torch's backward multiplies by 1.0f / 6.0f, float32's 1/6, in float64 too: 3e-8
# relative.)
RTOL, ATOL = 1e-9, 1e-12
DEVICE_RTOL, DEVICE_ATOL = 1e-5, 5e-6  # every case on lavapipe stays within 9e-7 of its scale


@dataclass(frozen=True)
class Case:
    """One expression (and the module it calls, for module items), its inputs and tolerances."""

    expr: str
    inputs: dict = field(default_factory=dict)  # name -> input description (see the module docstring)
    module: str = ""  # the module's constructor text: the expression calls it as `m`
    train: bool = True  # the module's mode
    grads: tuple[str, ...] | None = None  # the inputs differentiated; None: every float input
    compare: str = "values"
    device: bool | None = None  # whether it runs on the device too (None: the module docstring's rule)
    device_fails: str = ""  # why compiling or running it on the device fails (a bug): kept off the device run
    rtol: float = RTOL
    atol: float = ATOL
    device_rtol: float = DEVICE_RTOL
    device_atol: float = DEVICE_ATOL
    unsupported: str = ""  # why meganeura fails this case (its item is otherwise supported)
    # The dtype torch computes in: float64, or float32 where the semantics depend on it
    # (torch.nan_to_num's default replaces ±inf by the dtype's largest finite number).
    torch_dtype: str = "float64"

    def fingerprint(self) -> str:
        """What torch's side depends on (the reference is current while this is unchanged)."""
        return repr((self.expr, self.inputs, self.module, self.train, self.grads, self.compare, self.torch_dtype))


@dataclass(frozen=True)
class OptimizerCase:
    """`optimizer` (text over `params` = [p, q], or p and q) takes `steps` steps of the loss
    ½·Σ(p·s − a)² + Σ(q·b) with new s, a, b each step, from the same p and q as torch; with a
    `scheduler` (text over `opt`), sched.step() after each step. The parameters after each step are
    compared."""

    optimizer: str
    scheduler: str = ""
    steps: int = 4
    device_rtol: float = 2e-5  # ‖Δp − Δp_torch‖ / ‖Δp_torch‖ per step (Δ from the start)
    unsupported: str = ""

    def fingerprint(self) -> str:
        return repr((self.optimizer, self.scheduler, self.steps))


@dataclass(frozen=True)
class SchedulerCase:
    """`scheduler` (text over `opt`, built from `optimizer` over `params`) stepped `steps` times
    (`sched.step(metric)` with `metrics` when given, ReduceLROnPlateau's); the learning rates of
    every group after each step are compared (on the host: no device)."""

    optimizer: str
    scheduler: str
    steps: int = 12
    metrics: tuple[float, ...] = ()
    unsupported: str = ""

    def fingerprint(self) -> str:
        return repr((self.optimizer, self.scheduler, self.steps, self.metrics))


@dataclass(frozen=True)
class InitCase:
    """`expr` fills `w` (a parameter of `shape`, zeros before), or is a number (calculate_gain).

    `compare`: "values" (a deterministic fill); "sample" (a distribution: `expr` is drawn again and
    again until SAMPLE_SIZE numbers, and their `distribution_summary` is compared with torch's);
    "bounded" (a sample whose support is bounded, uniform or truncated: its extremes must be
    torch's too); "gram" (nn.init.orthogonal_: a sample, and one draw's W·Wᵀ or Wᵀ·W)."""

    expr: str
    shape: tuple[int, ...] = ()
    compare: str = "values"
    unsupported: str = ""

    def fingerprint(self) -> str:
        return repr((self.expr, self.shape, self.compare))


@dataclass(frozen=True)
class Item:
    """A PyTorch name as a user writes it, its category and cases; `unsupported` says why
    meganeura does not have it (then its cases document what a port would need and must fail
    loudly); `note` says what differs or what is compared instead of values."""

    name: str
    category: str
    cases: tuple
    unsupported: str = ""
    note: str = ""

    def case_ids(self) -> list[str]:
        return [f"{self.name}[{index}]" for index in range(len(self.cases))]


def case_seed(case_id: str) -> int:
    """The seed of a case's inputs, cotangents and draws: from its id, so that adding a case does
    not change the others' numbers (and stable across Python versions, unlike hash())."""
    return int.from_bytes(case_id.encode(), "little") % (2**32 - 5)


# ---------------------------------------------------------------------------------------------
# Input descriptions (plain tuples, generated by the reference script with a seeded generator)


def normal(*shape: int) -> tuple:
    return ("normal", shape)


def uniform(low: float, high: float, *shape: int) -> tuple:
    return ("uniform", shape, low, high)


def positive(*shape: int) -> tuple:
    return ("uniform", shape, 0.1, 2.0)


def away(*shape: int) -> tuple:
    return ("away", shape)


def special(*shape: int) -> tuple:
    return ("special", shape)


def tied(*shape: int) -> tuple:
    return ("tied", shape)


def probs(*shape: int) -> tuple:
    return ("uniform", shape, 0.05, 0.95)


def ints(low: int, high: int, *shape: int) -> tuple:
    return ("ints", shape, low, high)


def values(data) -> tuple:
    return ("values", data)


OPTIONS = {
    "module", "train", "grads", "compare", "device", "device_fails", "rtol", "atol", "device_rtol", "device_atol",
    "unsupported", "torch_dtype",
}  # fmt: skip


def case(expr: str, **kwargs) -> Case:
    """A case: keyword arguments are its inputs, except Case's options (OPTIONS)."""
    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    inputs = {k: v for k, v in kwargs.items() if k not in OPTIONS}
    return Case(expr, inputs, **options)


def mod(module: str, expr: str = "m(x)", **kwargs) -> Case:
    """A module case: `module` builds m, `expr` calls it."""
    return case(expr, module=module, **kwargs)


def item(category: str, name: str, *cases, unsupported: str = "", note: str = "") -> Item:
    return Item(name, category, tuple(cases), unsupported, note)


def tensor(name, *cases, **kw):
    return item("tensor", name, *cases, **kw)


def functional(name, *cases, **kw):
    return item("functional", "torch.nn.functional." + name, *cases, **kw)


def loss(name, *cases, **kw):
    return item("loss", name, *cases, **kw)


def module(name, *cases, **kw):
    return item("module", "torch.nn." + name, *cases, **kw)


def init(name, *cases, **kw):
    return item("init", "torch.nn.init." + name, *cases, **kw)


def optimizer(name, *cases, **kw):
    return item("optimizer", "torch.optim." + name, *cases, **kw)


def scheduler(name, *cases, **kw):
    return item("scheduler", "torch.optim.lr_scheduler." + name, *cases, **kw)


X = normal(3, 5)
X3 = normal(2, 3, 4)
IMG = normal(2, 3, 7, 6)
SEQ = normal(2, 5, 8)  # [batch, seq, features]
NOT_TORCH_RNG = "random numbers: the same distribution as torch's, not the same numbers (compared by a KS test)"
DROPOUT = "in training the mask's distribution and scale are torch's, not its numbers; in eval the identity"

# ---------------------------------------------------------------------------------------------
# Tensor operations

TENSOR = [
    tensor(
        "torch.add",
        case("x + y", x=X3, y=normal(3, 4)),
        case("torch.add(x, y, alpha=2)", x=X, y=X),
        case("x.add(y, alpha=-0.5)", x=X, y=normal(5)),
    ),
    tensor("torch.sub", case("x - y", x=X3, y=normal(4)), case("2.5 - x", x=X), case("x.sub(y)", x=X, y=X)),
    tensor("torch.mul", case("x * y", x=X3, y=normal(2, 1, 4)), case("x * 3", x=X), case("x.mul(y)", x=X, y=X)),
    tensor(
        "torch.div",
        case("x / y", x=X3, y=away(3, 4)),
        case("1.5 / y", y=away(3, 4)),
        case("x.div(y)", x=X, y=away(3, 5)),
        case("torch.div(x, y, rounding_mode='floor')", x=uniform(-9.0, 9.0, 3, 5), y=away(3, 5)),
        case("x.div(y, rounding_mode='trunc')", x=uniform(-9.0, 9.0, 3, 5), y=away(3, 5)),
    ),
    tensor("torch.neg", case("-x", x=X)),
    tensor(
        "torch.pow",
        case("x ** 2", x=X),
        case("x.pow(3)", x=X),
        case("torch.pow(x, 0.5)", x=positive(3, 5)),
        case("x ** -1.5", x=positive(3, 5)),
        case("x ** y", x=positive(3, 5), y=normal(3, 5)),
        case("2 ** x", x=X),
        case("x ** 2.5", x=special(3, 5)),
    ),
    tensor(
        "torch.matmul",
        case("a @ b", a=normal(3, 4), b=normal(4, 5), device=False),
        case("torch.matmul(a, b)", a=normal(2, 3, 4), b=normal(2, 4, 5)),
        case("a @ b", a=normal(2, 1, 3, 4), b=normal(5, 4, 2), device=True),
        case("a @ v", a=normal(2, 3, 4), v=normal(4)),
        case("v @ b", v=normal(4), b=normal(4, 5)),
    ),
    tensor("torch.abs", case("x.abs()", x=X), case("torch.abs(x)", x=special(3, 5))),
    tensor("torch.exp", case("torch.exp(x)", x=X), case("x.exp()", x=special(3, 5))),
    tensor("torch.log", case("torch.log(x)", x=positive(3, 5)), case("x.log()", x=values([[0.0, 1.0, 2.5]]))),
    tensor(
        "torch.log1p", case("torch.log1p(x)", x=uniform(-0.9, 3.0, 3, 5)), case("x.log1p()", x=uniform(-1e-3, 1e-3, 4))
    ),
    tensor("torch.expm1", case("torch.expm1(x)", x=X)),
    tensor("torch.sqrt", case("torch.sqrt(x)", x=positive(3, 5)), case("x.sqrt()", x=values([[0.0, 4.0, 1e-3]]))),
    tensor("torch.rsqrt", case("torch.rsqrt(x)", x=positive(3, 5))),
    tensor("torch.sin", case("torch.sin(x)", x=X), case("x.sin()", x=uniform(-40.0, 40.0, 6))),
    tensor("torch.cos", case("torch.cos(x)", x=X), case("x.cos()", x=uniform(-40.0, 40.0, 6))),
    tensor("torch.tanh", case("torch.tanh(x)", x=X), case("x.tanh()", x=special(3, 5))),
    tensor("torch.sigmoid", case("torch.sigmoid(x)", x=X), case("x.sigmoid()", x=special(3, 5))),
    tensor("torch.erf", case("torch.erf(x)", x=X)),
    tensor("torch.reciprocal", case("torch.reciprocal(x)", x=away(3, 5))),
    tensor("torch.square", case("torch.square(x)", x=X)),
    tensor("torch.sign", case("torch.sign(x)", x=values([[-2.0, 0.0, 3.0, -0.5]]))),
    tensor("torch.floor", case("torch.floor(x)", x=uniform(-3, 3, 6))),
    tensor("torch.ceil", case("torch.ceil(x)", x=uniform(-3, 3, 6))),
    tensor("torch.round", case("torch.round(x)", x=values([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7]]))),
    tensor("torch.trunc", case("torch.trunc(x)", x=uniform(-3, 3, 6))),
    tensor("torch.isnan", case("torch.isnan(x)", x=special(3, 5))),
    tensor("torch.isinf", case("torch.isinf(x)", x=special(3, 5))),
    tensor("torch.isfinite", case("torch.isfinite(x)", x=special(3, 5))),
    tensor(
        "torch.maximum",
        case("torch.maximum(x, y)", x=X, y=normal(3, 5)),
        case("torch.maximum(x, y)", x=special(3, 5), y=normal(5)),
        case("torch.max(x, y)", x=X, y=normal(3, 5)),
    ),
    tensor(
        "torch.minimum",
        case("torch.minimum(x, y)", x=X, y=normal(3, 5)),
        case("torch.minimum(x, y)", x=special(3, 5), y=normal(5)),
        case("torch.min(x, y)", x=X, y=normal(3, 5)),
    ),
    tensor(
        "torch.clamp",
        case("x.clamp(-0.5, 0.5)", x=X),
        case("torch.clamp(x, min=0.1)", x=X),
        case("x.clamp(max=0.2)", x=X),
        case("torch.clamp(x, -1.0, 1.0)", x=special(3, 5)),
        case("x.clip(0.0, 1.0)", x=X),
    ),
    tensor(
        "torch.where",
        case("torch.where(c > 0, x, y)", c=normal(3, 5), x=X, y=normal(5)),
        case("torch.where(x > 0, x, 0.0)", x=X),
    ),
    tensor("torch.Tensor.masked_fill", case("x.masked_fill(m > 0.5, -2.0)", x=X3, m=normal(3, 4))),
    tensor(
        "comparisons (==, !=, <, <=, >, >=)",
        case("((x > y).float(), (x <= y).float(), (x == y).float(), (x != 0).float())", x=tied(3, 4), y=tied(3, 4)),
    ),
    tensor(
        "torch.sum",
        case("x.sum()", x=X3),
        case("x.sum(dim=1, keepdim=True)", x=X3),
        case("torch.sum(x, (0, 2))", x=X3),
        case("x.sum(-1)", x=special(3, 5)),
    ),
    tensor(
        "torch.mean",
        case("x.mean()", x=X3),
        case("torch.mean(x, dim=-1, keepdim=True)", x=X3),
        case("x.mean((0, 1))", x=special(3, 5)),
    ),
    tensor("torch.amax", case("x.amax(dim=1)", x=X3), case("torch.amax(x, -1)", x=special(3, 5))),
    tensor("torch.amin", case("x.amin(dim=1)", x=X3), case("torch.amin(x, -1)", x=special(3, 5))),
    tensor(
        "torch.max",
        case("x.max()", x=X3),
        case("torch.max(x, 1)", x=normal(3, 6)),
        case("x.max(dim=-1, keepdim=True)", x=tied(3, 6)),
        case("torch.max(x, 1)", x=special(4, 5)),
        case("x.max()", x=special(3, 5)),
    ),
    tensor(
        "torch.min",
        case("x.min()", x=X3),
        case("torch.min(x, 0)", x=normal(4, 6)),
        case("x.min(dim=1)", x=special(4, 5)),
        case("x.min()", x=special(3, 5)),
    ),
    tensor("torch.argmax", case("x.argmax(1)", x=tied(3, 6)), case("torch.argmax(x)", x=X3)),
    tensor("torch.argmin", case("x.argmin(-1)", x=tied(3, 6)), case("torch.argmin(x, dim=0, keepdim=True)", x=X)),
    tensor(
        "torch.var",
        case("x.var(dim=1, unbiased=False)", x=X3),
        case("torch.var(x)", x=X3),
        case("x.var(-1, keepdim=True, correction=0)", x=X3),
        case("torch.var(x, dim=(0, 2))", x=X3),
    ),
    tensor(
        "torch.std",
        case("x.std(dim=1)", x=X3),
        case("torch.std(x, unbiased=False)", x=X3),
        case("x.std(-1, keepdim=True, correction=0)", x=X3),
    ),
    tensor("torch.var_mean", case("torch.var_mean(x, dim=1)", x=X3)),
    tensor(
        "torch.norm",
        case("x.norm()", x=X3),
        case("torch.norm(x, dim=1)", x=X3),
        case("x.norm(p=1, dim=-1)", x=X3),
        case("torch.norm(x, p=float('inf'), dim=0)", x=X),
    ),
    tensor("torch.linalg.vector_norm", case("torch.linalg.vector_norm(x, ord=3, dim=-1)", x=X3)),
    tensor(
        "torch.logsumexp",
        case("torch.logsumexp(x, dim=1)", x=X3),
        case("x.logsumexp(-1, keepdim=True)", x=normal(3, 5)),
        case(
            "torch.logsumexp(x, 1)",
            x=values([[0.0, float("-inf"), 1.0], [float("-inf")] * 3, [float("inf"), 0.0, 1.0]]),
        ),
    ),
    tensor(
        "torch.cumsum",
        case("torch.cumsum(x, 1)", x=X3),
        case("x.cumsum(-1)", x=X3),
        case("torch.cumsum(i, 0)", i=ints(-5, 6, 3, 4)),
    ),
    tensor("torch.cumprod", case("torch.cumprod(x, 1)", x=normal(3, 5))),
    tensor(
        "torch.topk",
        case("torch.topk(x, 3, dim=1)", x=normal(3, 7, 4)),
        case("x.topk(2, largest=False)", x=normal(3, 7)),
    ),
    tensor(
        "torch.sort",
        case("torch.sort(x, dim=1)", x=normal(3, 7)),
        case("x.sort(descending=True, stable=True)", x=tied(3, 6)),
    ),
    tensor("torch.argsort", case("torch.argsort(x, dim=0)", x=normal(5, 3))),
    tensor(
        "torch.gather",
        case("torch.gather(x, 1, i)", x=normal(3, 5, 4), i=ints(0, 5, 3, 2, 4)),
        case("x.gather(-1, i)", x=normal(3, 5), i=ints(0, 5, 3, 7)),
    ),
    tensor(
        "torch.scatter_add",
        case("torch.scatter_add(x, 1, i, s)", x=normal(3, 5), i=ints(0, 5, 3, 4), s=normal(3, 4), device=True),
    ),
    tensor("torch.scatter", case("x.scatter(1, i, 9.0)", x=normal(3, 5), i=values([[0, 3], [4, 4], [2, 1]]))),
    tensor(
        "torch.index_select",
        case("torch.index_select(x, 1, i)", x=normal(4, 6, 3), i=values([5, 0, 2, 2])),
        case("x.index_select(0, i)", x=normal(4, 3), i=values([3, 3, 0])),
    ),
    tensor("torch.take", case("torch.take(x, i)", x=X, i=values([[0, 11], [5, 5]]))),
    tensor(
        "integer-tensor indexing (x[idx])",
        case("x[i]", x=X3, i=values([1, 0, 1])),
        case("x[:, j]", x=X3, j=values([[2], [0]])),
        case("x[i, j]", x=X3, i=values([1, 0, 1]), j=values([[2], [0]])),
        case("x[..., [0, -1]]", x=X3),
    ),
    tensor(
        "slicing (x[a:b], x[..., None])",
        case("x[:, 1:3]", x=X3),
        case("x[1, :, -2:]", x=X3),
        case("x[..., None] * x[:, None]", x=normal(3, 4)),
        case("x[:, ::2]", x=normal(3, 6)),
    ),
    tensor(
        "torch.cat", case("torch.cat([x, y], dim=1)", x=X3, y=normal(2, 2, 4)), case("torch.cat((x, x, y))", x=X, y=X)
    ),
    tensor(
        "torch.stack",
        case("torch.stack([x, y])", x=X, y=X),
        case("torch.stack([x, y, x], dim=-1)", x=X, y=X),
    ),
    tensor(
        "torch.split",
        case("torch.split(x, 2, dim=1)", x=normal(3, 5)),
        case("x.split([1, 3], dim=0)", x=normal(4, 3)),
    ),
    tensor("torch.chunk", case("torch.chunk(x, 3, dim=1)", x=normal(3, 7)), case("x.chunk(2)", x=normal(4, 3))),
    tensor("torch.unbind", case("torch.unbind(x, dim=1)", x=X3)),
    tensor("torch.Tensor.repeat", case("x.repeat(2, 3)", x=normal(2, 3)), case("x.repeat(2, 1, 1)", x=normal(3, 2))),
    tensor("torch.repeat_interleave", case("torch.repeat_interleave(x, 2, dim=1)", x=normal(2, 3))),
    tensor(
        "torch.flip",
        case("torch.flip(x, (0, 2))", x=X3),
        case("x.flip(-1)", x=X3),
        case("(torch.fliplr(x), x.flipud())", x=X),
    ),
    tensor("torch.roll", case("torch.roll(x, (1, -2), (0, 2))", x=X3), case("x.roll(4)", x=X3)),
    tensor("torch.tril", case("torch.tril(x)", x=normal(4, 6)), case("x.tril(-1)", x=normal(2, 4, 6))),
    tensor("torch.triu", case("torch.triu(x, 2)", x=normal(5, 3)), case("x.triu()", x=normal(4, 4))),
    tensor(
        "torch.einsum",
        case("torch.einsum('bij,bjk->bik', a, b)", a=normal(2, 3, 4), b=normal(2, 4, 5), device=False),
        case("torch.einsum('ij->ji', a)", a=normal(3, 4)),
        case("torch.einsum('bhqd,bhkd->bhqk', q, k)", q=normal(2, 2, 3, 4), k=normal(2, 2, 5, 4)),
        case("torch.einsum('i,i->', u, v)", u=normal(5), v=normal(5)),
        case("torch.einsum('ij,j->i', a, v)", a=normal(3, 4), v=normal(4)),
    ),
    tensor("torch.outer", case("torch.outer(u, v)", u=normal(3), v=normal(4))),
    tensor("torch.bmm", case("torch.bmm(a, b)", a=normal(2, 3, 4), b=normal(2, 4, 5), device=False)),
    tensor(
        "torch.arange",
        case("torch.arange(5) * x", x=normal(5)),
        case("torch.arange(2, 11, 3)"),
        case("torch.arange(-1.5, 2.0, 0.5)"),
    ),
    tensor("torch.zeros", case("torch.zeros(3, 4) + x", x=normal(3, 4)), case("torch.zeros_like(x) + 1", x=X)),
    tensor("torch.ones", case("torch.ones(3, 4) * x", x=normal(3, 4)), case("torch.ones_like(x) * x", x=X)),
    tensor(
        "torch.full", case("torch.full((2, 3), -1.5) * x", x=normal(2, 3)), case("torch.full_like(x, 2.5) * x", x=X)
    ),
    tensor("torch.eye", case("torch.eye(3, 5)"), case("torch.eye(4) @ x", x=normal(4, 3))),
    tensor("torch.tensor", case("x * torch.tensor([[0.5, -1.0, 2.0]])", x=normal(4, 3))),
    tensor("torch.reshape", case("x.reshape(4, 6)", x=X3), case("torch.reshape(x, (6, -1))", x=X3)),
    tensor("torch.Tensor.view", case("x.view(-1, 3)", x=X3), case("x.view(2, 12)", x=X3)),
    tensor(
        "torch.Tensor.permute",
        case("x.permute(2, 0, 1)", x=X3),
        case("torch.permute(x, (1, 0, 2))", x=X3),
    ),
    tensor(
        "torch.transpose",
        case("x.transpose(0, 2)", x=X3),
        case("torch.transpose(x, -1, -2)", x=X3),
        case("x.T", x=X),
        case("x.t()", x=X),
        case("x.mT", x=X3),
    ),
    tensor("torch.unsqueeze", case("x.unsqueeze(1)", x=X), case("torch.unsqueeze(x, -1)", x=X)),
    tensor(
        "torch.squeeze",
        case("x.squeeze(1)", x=normal(3, 1, 4)),
        case("torch.squeeze(x)", x=normal(1, 3, 1)),
    ),
    tensor(
        "torch.flatten",
        case("x.flatten()", x=X3),
        case("torch.flatten(x, 1)", x=X3),
        case("x.flatten(0, 1)", x=X3),
    ),
    tensor(
        "torch.Tensor.expand",
        case("x.expand(2, 3, 5)", x=normal(3, 1)),
        case("x.expand_as(y)", x=normal(3, 1), y=X),
    ),
    tensor("torch.broadcast_to", case("torch.broadcast_to(x, (2, 3, 5))", x=normal(5))),
    tensor(
        "torch.Tensor.to (float, long, int)",
        case("x.long()", x=uniform(-50.0, 50.0, 3, 4)),
        case("i.float() * 0.5", i=ints(-100, 100, 3, 4)),
        case("x.to(torch.int64)", x=uniform(-50.0, 50.0, 3, 4)),
    ),
    tensor("torch.softmax", case("x.softmax(-1)", x=X3), case("torch.softmax(x, dim=0)", x=X3)),
    tensor("torch.log_softmax", case("x.log_softmax(-1)", x=X3)),
    tensor(
        "torch.rand, randn, rand_like, randn_like",
        case("torch.rand(64, 64)", compare="sample"),
        case("torch.randn(64, 64)", compare="sample"),
        case("torch.rand_like(x)", x=normal(64, 64), compare="sample"),
        case("torch.randn_like(x) * 2 + 1", x=normal(64, 64), compare="sample"),
        note=NOT_TORCH_RNG,
    ),
    tensor("torch.bernoulli", case("torch.bernoulli(x)", x=probs(64, 64), compare="sample"), note=NOT_TORCH_RNG),
    tensor(
        "torch.mm",
        case("torch.mm(a, b)", a=normal(3, 4), b=normal(4, 5), device=False),
        case("a.mm(b)", a=normal(2, 3), b=normal(3, 2)),
    ),
    tensor(
        "torch.addmm",
        case("torch.addmm(c, a, b, beta=0.5, alpha=2.0)", c=normal(5), a=normal(3, 4), b=normal(4, 5), device=False),
    ),
    tensor("torch.baddbmm", case("torch.baddbmm(c, a, b)", c=normal(2, 3, 5), a=normal(2, 3, 4), b=normal(2, 4, 5))),
    tensor("torch.narrow", case("torch.narrow(x, 1, 1, 2)", x=X3), case("x.narrow(-1, 0, 3)", x=X3)),
    tensor("torch.tile", case("torch.tile(x, (2, 1, 3))", x=normal(3, 2)), case("x.tile((2,))", x=normal(2, 3))),
    tensor("torch.std_mean", case("torch.std_mean(x, dim=-1)", x=X3)),
    tensor("torch.Tensor.detach", case("x.detach() * x", x=X), case("(x * y).detach() + y", x=X, y=X)),
    tensor("torch.Tensor.contiguous", case("x.transpose(0, 1).contiguous().view(-1)", x=X)),
    tensor(
        "torch.Tensor.view_as, reshape_as",
        case("x.view_as(y) + y", x=normal(15), y=X),
        case("x.reshape_as(y)", x=X3, y=normal(4, 6)),
    ),
    tensor("torch.Tensor.type_as", case("i.type_as(x) * x", i=ints(-3, 4, 3, 5), x=X)),
    tensor(
        "torch.Tensor.new_zeros, new_ones, new_full, new_tensor",
        case("x.new_zeros(3, 5) + x.new_ones((3, 5)) * x", x=X),
        case("x.new_full((5,), 2.0) * x - x.new_tensor([1.0, 2.0, 3.0, 4.0, 5.0])", x=X),
    ),
    tensor("torch.as_tensor", case("x * torch.as_tensor([0.5, -1.0, 2.0])", x=normal(4, 3))),
    tensor("torch.selu, celu", case("(torch.selu(x), torch.celu(x))", x=X)),
    tensor(
        "torch.nan_to_num",
        case("torch.nan_to_num(x)", x=special(3, 5), torch_dtype="float32"),
        case("torch.nan_to_num(x, nan=0.5, posinf=2.0, neginf=-3.0)", x=special(3, 5)),
    ),
    tensor("torch.diff", case("torch.diff(x, dim=1)", x=X)),
    tensor("torch.prod", case("x.prod(1)", x=normal(3, 5))),
    tensor("torch.diagonal", case("torch.diagonal(x)", x=normal(4, 4))),
]

# ---------------------------------------------------------------------------------------------
# torch.nn.functional

FUNCTIONAL = [
    functional(
        "linear",
        case("F.linear(x, w, b)", x=X3, w=normal(6, 4), b=normal(6)),
        case("F.linear(x, w)", x=X, w=normal(2, 5)),
    ),
    functional(
        "relu",
        case("F.relu(x)", x=X),
        case("F.relu(x)", x=special(3, 5)),
        case("torch.relu(x)", x=X),
    ),
    functional("relu6", case("F.relu6(x * 4)", x=X)),
    functional("leaky_relu", case("F.leaky_relu(x, 0.2)", x=X), case("F.leaky_relu(x)", x=special(3, 5))),
    functional("elu", case("F.elu(x, alpha=0.7)", x=X), case("F.elu(x)", x=special(3, 5))),
    functional("selu", case("F.selu(x)", x=X)),
    functional("celu", case("F.celu(x, alpha=1.5)", x=X)),
    functional("gelu", case("F.gelu(x)", x=X), case("F.gelu(x, approximate='tanh')", x=X)),
    functional("silu", case("F.silu(x)", x=X)),
    functional("mish", case("F.mish(x)", x=X)),
    functional(
        "softplus",
        case("F.softplus(x)", x=uniform(-30.0, 30.0, 4, 5)),
        case("F.softplus(x, beta=2.0, threshold=5.0)", x=X),
    ),
    functional("hardtanh", case("F.hardtanh(x)", x=normal(3, 5)), case("F.hardtanh(x, -0.5, 0.25)", x=special(3, 5))),
    functional("hardswish", case("F.hardswish(x * 3)", x=X)),
    functional("hardsigmoid", case("F.hardsigmoid(x * 3)", x=X, rtol=1e-7)),  # HARDSIGMOID
    functional("logsigmoid", case("F.logsigmoid(x)", x=X)),
    functional("sigmoid, tanh", case("(F.sigmoid(x), F.tanh(x))", x=X)),
    functional("softsign", case("F.softsign(x)", x=X)),
    functional("tanhshrink", case("F.tanhshrink(x)", x=X)),
    functional("softshrink", case("F.softshrink(x)", x=X), case("F.softshrink(x, 0.8)", x=X)),
    functional("hardshrink", case("F.hardshrink(x, lambd=0.3)", x=X)),
    functional("glu", case("F.glu(x)", x=normal(3, 6)), case("F.glu(x, dim=0)", x=normal(4, 3))),
    functional(
        "softmax",
        case("F.softmax(x, dim=-1)", x=X3),
        case("F.softmax(x, dim=1)", x=X3),
        case("F.softmax(x, -1)", x=values([[0.0, float("-inf"), 1.0, 2.0], [float("-inf"), 0.5, float("-inf"), 0.0]])),
    ),
    functional("log_softmax", case("F.log_softmax(x, dim=-1)", x=X3), case("F.log_softmax(x, 0)", x=X3)),
    functional("softmin", case("F.softmin(x, dim=1)", x=X3)),
    functional(
        "layer_norm",
        case("F.layer_norm(x, (4,), w, b)", x=X3, w=normal(4), b=normal(4)),
        case("F.layer_norm(x, (3, 4))", x=X3),
        case("F.layer_norm(x, (4,), eps=0.1)", x=X3),
    ),
    functional(
        "rms_norm",
        case("F.rms_norm(x, (4,), w)", x=X3, w=normal(4), rtol=1e-6, atol=2e-6),  # eps=None: RTOL's note
        case("F.rms_norm(x, (4,), eps=1e-3)", x=X3),
    ),
    functional("group_norm", case("F.group_norm(x, 2, w, b)", x=normal(2, 4, 3, 5), w=normal(4), b=normal(4))),
    functional(
        "batch_norm",
        case("F.batch_norm(x, None, None, w, b, training=True)", x=normal(4, 3, 5), w=normal(3), b=normal(3)),
        case(
            "F.batch_norm(x, rm, rv, w, b)",
            x=normal(4, 3),
            rm=normal(3),
            rv=positive(3),
            w=normal(3),
            b=normal(3),
            grads=("x", "w", "b"),
        ),
    ),
    functional("instance_norm", case("F.instance_norm(x)", x=normal(2, 3, 5))),
    functional(
        "normalize",
        case("F.normalize(x)", x=X3),
        case("F.normalize(x, p=1, dim=-1)", x=X3),
        case("F.normalize(x, dim=0, eps=0.5)", x=normal(3, 4)),
    ),
    functional(
        "cosine_similarity",
        case("F.cosine_similarity(x, y)", x=X3, y=X3),
        case("F.cosine_similarity(x, y, dim=-1)", x=X3, y=normal(3, 4)),
    ),
    functional("pairwise_distance", case("F.pairwise_distance(x, y)", x=normal(4, 5), y=normal(4, 5))),
    functional(
        "embedding",
        case("F.embedding(i, w)", i=ints(0, 6, 3, 4), w=normal(6, 5)),
        case("F.embedding(i, w, padding_idx=0)", i=ints(0, 6, 3, 4), w=normal(6, 5)),
    ),
    functional(
        "one_hot",
        case("F.one_hot(i, 5)", i=ints(0, 5, 3, 4)),
        case("F.one_hot(i, 4).float() * x", i=ints(0, 4, 3), x=normal(3, 4)),
    ),
    functional(
        "pad",
        case("F.pad(x, (1, 2))", x=X3),
        case("F.pad(x, (1, 0, 2, 1), value=-1.5)", x=X3),
        case("F.pad(x, (2, 1), mode='reflect')", x=X3, device=True),
        case("F.pad(x, (1, 1, 2, 0), mode='replicate')", x=IMG, device=True),
        case("F.pad(x, (1, 2), mode='circular')", x=X3, device=True),
    ),
    functional(
        "interpolate",
        case("F.interpolate(x, scale_factor=2)", x=normal(2, 3, 4, 5)),
        case("F.interpolate(x, size=(5, 7), mode='nearest')", x=normal(2, 3, 4, 5)),
        case("F.interpolate(x, scale_factor=2, mode='bilinear')", x=normal(2, 3, 4, 5)),
        case("F.interpolate(x, size=(7, 3), mode='bilinear', align_corners=True)", x=normal(2, 3, 4, 5), device=True),
        case("F.interpolate(x, size=9, mode='linear')", x=normal(2, 3, 5)),
    ),
    functional(
        "conv1d",
        case("F.conv1d(x, w, b)", x=normal(2, 3, 9), w=normal(4, 3, 3), b=normal(4)),
        case("F.conv1d(x, w, stride=2, padding=1, dilation=2)", x=normal(2, 3, 9), w=normal(4, 3, 3), device=False),
        case("F.conv1d(x, w, groups=3, padding='same')", x=normal(2, 3, 8), w=normal(6, 1, 3), device=True),
    ),
    functional(
        "conv2d",
        case("F.conv2d(x, w, b)", x=IMG, w=normal(4, 3, 3, 3), b=normal(4)),
        case("F.conv2d(x, w, stride=2, padding=1)", x=IMG, w=normal(4, 3, 3, 3)),
        case("F.conv2d(x, w, padding=2, dilation=2)", x=IMG, w=normal(4, 3, 3, 3), device=False),
        case(
            "F.conv2d(x, w, groups=2, padding=(1, 0))",
            x=normal(2, 4, 6, 5),
            w=normal(6, 2, 3, 2),
        ),
        case("F.conv2d(x, w, groups=4)", x=normal(2, 4, 6, 5), w=normal(4, 1, 3, 3), device=True),
        case("F.conv2d(x, w, padding='same')", x=IMG, w=normal(2, 3, 3, 3)),
    ),
    functional(
        "conv_transpose1d",
        case("F.conv_transpose1d(x, w, b, stride=2)", x=normal(2, 3, 5), w=normal(3, 4, 3), b=normal(4), device=False),
    ),
    functional(
        "conv_transpose2d",
        case("F.conv_transpose2d(x, w, b)", x=normal(2, 3, 4, 5), w=normal(3, 2, 3, 3), b=normal(2)),
        case(
            "F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1)",
            x=normal(2, 3, 4, 5),
            w=normal(3, 2, 3, 3),
        ),
        case(
            "F.conv_transpose2d(x, w, groups=2, dilation=2)", x=normal(2, 4, 4, 3), w=normal(4, 3, 2, 2), device=False
        ),
    ),
    functional("unfold", case("F.unfold(x, 3, padding=1)", x=IMG), case("F.unfold(x, (2, 3), stride=2)", x=IMG)),
    functional("fold", case("F.fold(x, (4, 5), 2)", x=normal(2, 12, 12))),
    functional(
        "max_pool2d",
        case("F.max_pool2d(x, 2)", x=IMG),
        case("F.max_pool2d(x, 3, stride=2, padding=1)", x=IMG),
        case("F.max_pool2d(x, 2, ceil_mode=True)", x=IMG, device=True),
        case("F.max_pool2d(x, 2, dilation=2)", x=IMG, device=True),
        case("F.max_pool2d(x, 2)", x=special(2, 2, 4, 4)),
    ),
    functional(
        "avg_pool2d",
        case("F.avg_pool2d(x, 2)", x=IMG),
        case("F.avg_pool2d(x, 3, stride=2, padding=1)", x=IMG),
        case("F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False)", x=IMG, device=True),
        case("F.avg_pool2d(x, 2, ceil_mode=True)", x=IMG),
    ),
    functional(
        "max_pool1d",
        case("F.max_pool1d(x, 2)", x=normal(2, 3, 9)),
        case("F.max_pool1d(x, 3, stride=2, padding=1)", x=normal(2, 3, 9)),
    ),
    functional("avg_pool1d", case("F.avg_pool1d(x, 3, stride=2)", x=normal(2, 3, 9))),
    functional(
        "adaptive_avg_pool2d",
        case("F.adaptive_avg_pool2d(x, 1)", x=IMG),
        case("F.adaptive_avg_pool2d(x, (3, 2))", x=IMG, device=True),
        case("F.adaptive_avg_pool2d(x, 4)", x=IMG),
    ),
    functional("adaptive_avg_pool1d", case("F.adaptive_avg_pool1d(x, 4)", x=normal(2, 3, 9), device=False)),
    functional(
        "adaptive_max_pool2d",
        case("F.adaptive_max_pool2d(x, 1)", x=IMG),
        case("F.adaptive_max_pool2d(x, (3, 2))", x=IMG, device=True),
    ),
    functional(
        "scaled_dot_product_attention",
        case(
            "F.scaled_dot_product_attention(q, k, v)", q=normal(2, 2, 5, 4), k=normal(2, 2, 6, 4), v=normal(2, 2, 6, 4)
        ),
        case(
            "F.scaled_dot_product_attention(q, k, v, is_causal=True)",
            q=normal(2, 2, 5, 4),
            k=normal(2, 2, 5, 4),
            v=normal(2, 2, 5, 4),
        ),
        case(
            "F.scaled_dot_product_attention(q, k, v, scale=0.3)",
            q=normal(1, 2, 5, 4),
            k=normal(1, 2, 5, 4),
            v=normal(1, 2, 5, 4),
        ),
        case(
            "F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)",
            q=normal(1, 4, 5, 4),
            k=normal(1, 2, 5, 4),
            v=normal(1, 2, 5, 4),
        ),
        case(
            "F.scaled_dot_product_attention(q, k, v, attn_mask=m > 0)",
            q=normal(2, 2, 5, 4),
            k=normal(2, 2, 6, 4),
            v=normal(2, 2, 6, 4),
            m=normal(5, 6),
            grads=("q", "k", "v"),
            device=True,
        ),
        case(
            "F.scaled_dot_product_attention(q, k, v, attn_mask=m)",
            q=normal(2, 2, 5, 4),
            k=normal(2, 2, 6, 4),
            v=normal(2, 2, 6, 4),
            m=normal(2, 1, 5, 6),
            device=True,
        ),
        case(
            "F.scaled_dot_product_attention(q, k, v, dropout_p=0.3)",
            q=normal(1, 1, 32, 4),
            k=normal(1, 1, 32, 4),
            v=normal(1, 1, 32, 4),
            compare="sample",
        ),
    ),
    functional(
        "dropout",
        case("F.dropout(x, 0.3, training=False)", x=X),
        case("F.dropout(x, p=0.3)", x=uniform(1.0, 1.0, 64, 64), compare="sample"),
        case("F.dropout(x, 0.7, True)", x=uniform(1.0, 1.0, 64, 64), compare="sample"),
        note=DROPOUT,
    ),
    functional("dropout2d", case("F.dropout2d(x, 0.5, training=False)", x=IMG)),
    functional("dropout1d", case("F.dropout1d(x, 0.5, training=False)", x=normal(2, 3, 5))),
    functional("adaptive_max_pool1d", case("F.adaptive_max_pool1d(x, 4)", x=normal(2, 3, 9))),
]

# ---------------------------------------------------------------------------------------------
# Losses, functional and modules

REDUCTIONS = ("mean", "sum", "none")
LOGITS, LABELS = normal(4, 5), ints(0, 5, 4)

LOSS = [
    loss(
        "torch.nn.functional.cross_entropy",
        case("F.cross_entropy(x, y)", x=LOGITS, y=LABELS),
        *[case(f"F.cross_entropy(x, y, reduction='{r}')", x=LOGITS, y=LABELS) for r in REDUCTIONS],
        case("F.cross_entropy(x, y, label_smoothing=0.1)", x=LOGITS, y=LABELS, device=True),
        case("F.cross_entropy(x, y, ignore_index=2)", x=normal(6, 5), y=ints(0, 4, 6), device=True),
        case("F.cross_entropy(x, y, weight=w)", x=LOGITS, y=LABELS, w=positive(5), grads=("x",)),
        case("F.cross_entropy(x, y)", x=normal(2, 5, 3), y=ints(0, 5, 2, 3), device=True),
        case("F.cross_entropy(x, p.softmax(-1))", x=LOGITS, p=normal(4, 5), device=True),
    ),
    loss(
        "torch.nn.functional.nll_loss",
        *[case(f"F.nll_loss(x.log_softmax(-1), y, reduction='{r}')", x=LOGITS, y=LABELS) for r in REDUCTIONS],
        case("F.nll_loss(x, y, ignore_index=1)", x=LOGITS, y=LABELS),
    ),
    loss(
        "torch.nn.functional.mse_loss",
        *[case(f"F.mse_loss(x, y, reduction='{r}')", x=X3, y=X3) for r in REDUCTIONS],
    ),
    loss("torch.nn.functional.l1_loss", *[case(f"F.l1_loss(x, y, reduction='{r}')", x=X3, y=X3) for r in REDUCTIONS]),
    loss(
        "torch.nn.functional.smooth_l1_loss",
        *[case(f"F.smooth_l1_loss(x, y, reduction='{r}')", x=X3, y=X3) for r in REDUCTIONS],
        case("F.smooth_l1_loss(x, y, beta=0.5)", x=X3, y=X3),
    ),
    loss(
        "torch.nn.functional.huber_loss",
        *[case(f"F.huber_loss(x, y, reduction='{r}')", x=X3, y=X3) for r in REDUCTIONS],
        case("F.huber_loss(x, y, delta=0.4)", x=X3, y=X3),
    ),
    loss(
        "torch.nn.functional.binary_cross_entropy",
        *[case(f"F.binary_cross_entropy(p, y, reduction='{r}')", p=probs(3, 4), y=probs(3, 4)) for r in REDUCTIONS],
        case("F.binary_cross_entropy(p, y, weight=w)", p=probs(3, 4), y=probs(3, 4), w=positive(4), grads=("p", "y")),
    ),
    loss(
        "torch.nn.functional.binary_cross_entropy_with_logits",
        *[
            case(f"F.binary_cross_entropy_with_logits(x, y, reduction='{r}')", x=normal(3, 4), y=probs(3, 4))
            for r in REDUCTIONS
        ],
        case(
            "F.binary_cross_entropy_with_logits(x, y, pos_weight=w)",
            x=normal(3, 4),
            y=probs(3, 4),
            w=positive(4),
            grads=("x", "y"),
        ),
    ),
    loss(
        "torch.nn.functional.kl_div",
        *[
            case(f"F.kl_div(x.log_softmax(-1), y.softmax(-1), reduction='{r}')", x=LOGITS, y=LOGITS)
            for r in ("batchmean", "sum", "mean", "none")
        ],
        case(
            "F.kl_div(x.log_softmax(-1), y.log_softmax(-1), log_target=True, reduction='batchmean')", x=LOGITS, y=LOGITS
        ),
    ),
    loss(
        "torch.nn.functional.gaussian_nll_loss",
        case("F.gaussian_nll_loss(x, y, v)", x=X, y=X, v=positive(3, 5)),
        *[
            case(f"F.gaussian_nll_loss(x, y, v, full=True, reduction='{r}')", x=X, y=X, v=positive(3, 5))
            for r in REDUCTIONS
        ],
    ),
    loss(
        "torch.nn.functional.poisson_nll_loss",
        case("F.poisson_nll_loss(x, y)", x=X, y=positive(3, 5)),
        *[
            case(f"F.poisson_nll_loss(x, y, log_input=False, reduction='{r}')", x=positive(3, 5), y=positive(3, 5))
            for r in REDUCTIONS
        ],
    ),
    loss(
        "torch.nn.functional.margin_ranking_loss",
        case(
            "F.margin_ranking_loss(x, y, t.sign(), margin=0.2)", x=normal(6), y=normal(6), t=away(6), grads=("x", "y")
        ),
        *[
            case(
                f"F.margin_ranking_loss(x, y, t.sign(), reduction='{r}')",
                x=normal(6),
                y=normal(6),
                t=away(6),
                grads=("x", "y"),
            )
            for r in REDUCTIONS
        ],
    ),
    loss(
        "torch.nn.functional.cosine_embedding_loss",
        case("F.cosine_embedding_loss(x, y, t.sign())", x=X, y=X, t=away(3), grads=("x", "y")),
        *[
            case(
                f"F.cosine_embedding_loss(x, y, t.sign(), margin=0.3, reduction='{r}')",
                x=X,
                y=X,
                t=away(3),
                grads=("x", "y"),
            )
            for r in REDUCTIONS
        ],
    ),
    loss(
        "torch.nn.functional.triplet_margin_loss",
        case("F.triplet_margin_loss(a, p, n)", a=X, p=X, n=X),
        *[case(f"F.triplet_margin_loss(a, p, n, margin=2.0, p=1, reduction='{r}')", a=X, p=X, n=X) for r in REDUCTIONS],
    ),
    loss(
        "torch.nn.CrossEntropyLoss",
        mod("nn.CrossEntropyLoss(label_smoothing=0.05)", "m(x, y)", x=LOGITS, y=LABELS),
        mod("nn.CrossEntropyLoss(reduction='sum')", "m(x, y)", x=LOGITS, y=LABELS),
    ),
    loss("torch.nn.NLLLoss", mod("nn.NLLLoss()", "m(x.log_softmax(-1), y)", x=LOGITS, y=LABELS)),
    loss(
        "torch.nn.MSELoss",
        mod("nn.MSELoss()", "m(x, y)", x=X, y=X),
        mod("nn.MSELoss(reduction='none')", "m(x, y)", x=X, y=X),
    ),
    loss("torch.nn.L1Loss", mod("nn.L1Loss()", "m(x, y)", x=X, y=X)),
    loss("torch.nn.SmoothL1Loss", mod("nn.SmoothL1Loss(beta=0.3)", "m(x, y)", x=X, y=X)),
    loss("torch.nn.HuberLoss", mod("nn.HuberLoss(delta=0.5, reduction='sum')", "m(x, y)", x=X, y=X)),
    loss("torch.nn.BCELoss", mod("nn.BCELoss()", "m(p, y)", p=probs(3, 4), y=probs(3, 4))),
    loss("torch.nn.BCEWithLogitsLoss", mod("nn.BCEWithLogitsLoss()", "m(x, y)", x=normal(3, 4), y=probs(3, 4))),
    loss(
        "torch.nn.KLDivLoss",
        mod("nn.KLDivLoss(reduction='batchmean')", "m(x.log_softmax(-1), y.softmax(-1))", x=LOGITS, y=LOGITS),
    ),
]

# ---------------------------------------------------------------------------------------------
# torch.nn modules (torch's parameters are loaded into meganeura's module)

MHA_INPUTS = {"q": normal(2, 5, 8), "k": normal(2, 6, 8), "v": normal(2, 6, 8)}

MODULE = [
    module("Linear", mod("nn.Linear(5, 3)", x=normal(2, 4, 5), device=False), mod("nn.Linear(5, 3, bias=False)", x=X)),
    module("Bilinear", mod("nn.Bilinear(3, 4, 2)", "m(x, y)", x=normal(5, 3), y=normal(5, 4))),
    module(
        "Conv1d",
        mod("nn.Conv1d(3, 4, 3)", x=normal(2, 3, 9), device=False),
        mod("nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, dilation=2)", x=normal(2, 4, 9)),
    ),
    module(
        "Conv2d",
        mod("nn.Conv2d(3, 4, 3, stride=2, padding=1)", x=IMG, device=False),
        mod("nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False)", x=normal(2, 4, 5, 6)),
        mod("nn.Conv2d(3, 2, (3, 2), dilation=(2, 1), padding='same')", x=IMG),
    ),
    module("ConvTranspose1d", mod("nn.ConvTranspose1d(3, 2, 4, stride=2, padding=1)", x=normal(2, 3, 5), device=False)),
    module(
        "ConvTranspose2d",
        mod("nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1)", x=normal(2, 3, 4, 5), device=False),
        mod("nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2)", x=normal(2, 4, 3, 3)),
    ),
    module(
        "BatchNorm1d",
        mod("nn.BatchNorm1d(4)", x=normal(6, 4)),
        mod("nn.BatchNorm1d(4, momentum=0.3)", x=normal(3, 4, 5)),
        mod("nn.BatchNorm1d(4)", x=normal(6, 4), train=False),
    ),
    module("BatchNorm2d", mod("nn.BatchNorm2d(3)", x=IMG), mod("nn.BatchNorm2d(3, affine=False)", x=IMG, train=False)),
    module("LayerNorm", mod("nn.LayerNorm(4)", x=X3), mod("nn.LayerNorm((3, 4), elementwise_affine=False)", x=X3)),
    module("RMSNorm", mod("nn.RMSNorm(4)", x=X3, rtol=1e-6, atol=2e-6), mod("nn.RMSNorm(4, eps=1e-2)", x=X3)),
    module("GroupNorm", mod("nn.GroupNorm(2, 4)", x=normal(2, 4, 3, 5))),
    module("InstanceNorm1d", mod("nn.InstanceNorm1d(3)", x=normal(2, 3, 5))),
    module("InstanceNorm2d", mod("nn.InstanceNorm2d(3, affine=True)", x=IMG)),
    module(
        "Embedding",
        mod("nn.Embedding(10, 4)", x=ints(0, 10, 3, 5)),
        mod("nn.Embedding(10, 4, padding_idx=0)", x=ints(0, 10, 3, 5)),
    ),
    module(
        "Dropout",
        mod("nn.Dropout(0.3)", x=X, train=False),
        mod("nn.Dropout(0.25)", x=uniform(1.0, 1.0, 64, 64), compare="sample"),
        note=DROPOUT,
    ),
    module(
        "Dropout1d, Dropout2d",
        mod("nn.Dropout1d(0.5)", x=normal(2, 3, 5), train=False),
        mod("nn.Dropout2d()", x=IMG, train=False),
    ),
    module("Identity", mod("nn.Identity()", x=X)),
    module(
        "Parameter, ParameterList, ParameterDict",
        mod("nn.ParameterList([nn.Parameter(torch.zeros(5)), nn.Parameter(torch.ones(5))])", "x * m[1] + m[0]", x=X),
        mod("nn.ParameterDict({'scale': nn.Parameter(torch.randn(5))})", "x * m['scale']", x=X),
    ),
    module("Flatten", mod("nn.Flatten()", x=IMG), mod("nn.Flatten(0, 1)", x=X3)),
    module("Unflatten", mod("nn.Unflatten(2, (2, 2))", x=X3)),
    module("Sequential", mod("nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))", x=X, device=False)),
    module(
        "ModuleList",
        mod("nn.ModuleList([nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2)])", "m[2](m[1](m[0](x)))", x=X, device=False),
    ),
    module(
        "ModuleDict",
        mod("nn.ModuleDict({'proj': nn.Linear(5, 4), 'act': nn.SiLU()})", "m['act'](m['proj'](x))", x=X, device=False),
    ),
    module("ReLU", mod("nn.ReLU()", x=X)),
    module("ReLU6", mod("nn.ReLU6()", x=normal(3, 5))),
    module("LeakyReLU", mod("nn.LeakyReLU(0.1)", x=X)),
    module("ELU", mod("nn.ELU(alpha=0.5)", x=X)),
    module("SELU", mod("nn.SELU()", x=X)),
    module("GELU", mod("nn.GELU()", x=X), mod("nn.GELU(approximate='tanh')", x=X)),
    module("SiLU", mod("nn.SiLU()", x=X)),
    module("Mish", mod("nn.Mish()", x=X)),
    module("Sigmoid", mod("nn.Sigmoid()", x=X)),
    module("Tanh", mod("nn.Tanh()", x=X)),
    module("Hardtanh", mod("nn.Hardtanh(-0.5, 0.5)", x=X)),
    module("Hardswish", mod("nn.Hardswish()", x=X)),
    module("Hardsigmoid", mod("nn.Hardsigmoid()", x=X, rtol=1e-7)),  # HARDSIGMOID
    module("Softplus", mod("nn.Softplus(beta=2.0)", x=X)),
    module("Softmax", mod("nn.Softmax(dim=-1)", x=X3), mod("nn.Softmax(dim=1)", x=X3)),
    module("LogSoftmax", mod("nn.LogSoftmax(dim=1)", x=X)),
    module("MaxPool1d", mod("nn.MaxPool1d(3, stride=2)", x=normal(2, 3, 9))),
    module("MaxPool2d", mod("nn.MaxPool2d(2)", x=IMG), mod("nn.MaxPool2d(3, stride=2, padding=1)", x=IMG)),
    module("AvgPool1d", mod("nn.AvgPool1d(2)", x=normal(2, 3, 9))),
    module("AvgPool2d", mod("nn.AvgPool2d(2)", x=IMG), mod("nn.AvgPool2d(3, stride=1, padding=1)", x=IMG)),
    module("AdaptiveAvgPool1d", mod("nn.AdaptiveAvgPool1d(3)", x=normal(2, 3, 9), device=False)),
    module(
        "AdaptiveAvgPool2d",
        mod("nn.AdaptiveAvgPool2d(1)", x=IMG),
        mod("nn.AdaptiveAvgPool2d((2, 3))", x=IMG),
    ),
    module("AdaptiveMaxPool2d", mod("nn.AdaptiveMaxPool2d((3, 2))", x=IMG)),
    module(
        "Upsample",
        mod("nn.Upsample(scale_factor=2)", x=normal(2, 3, 3, 4)),
        mod("nn.Upsample(size=(5, 6), mode='bilinear')", x=normal(2, 3, 3, 4)),
    ),
    module(
        "MultiheadAttention",
        mod("nn.MultiheadAttention(8, 2, batch_first=True)", "m(q, k, v)", **MHA_INPUTS, device=False),
        mod("nn.MultiheadAttention(8, 2, batch_first=True)", "m(q, k, v, need_weights=False)[0]", **MHA_INPUTS),
        mod("nn.MultiheadAttention(8, 2)", "m(x, x, x, average_attn_weights=False)", x=normal(5, 2, 8)),
        mod(
            "nn.MultiheadAttention(8, 4, batch_first=True, bias=False)",
            "m(q, k, v, key_padding_mask=(pad > 1.0))",
            pad=values([[0.0, 0.0, 0.0, 0.0, 2.0, 2.0], [0.0, 2.0, 0.0, 0.0, 0.0, 0.0]]),
            grads=("q", "k", "v"),
            **MHA_INPUTS,
        ),
        mod(
            "nn.MultiheadAttention(8, 2, batch_first=True)",
            "m(x, x, x, attn_mask=nn.Transformer.generate_square_subsequent_mask(5), is_causal=True)",
            x=normal(2, 5, 8),
        ),
        mod(
            "nn.MultiheadAttention(8, 2, batch_first=True, kdim=6, vdim=4)",
            "m(q, k, v)",
            q=normal(2, 5, 8),
            k=normal(2, 3, 6),
            v=normal(2, 3, 4),
        ),
    ),
    module(
        "TransformerEncoderLayer",
        mod("nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)", x=SEQ),
        mod("nn.TransformerEncoderLayer(8, 2, 16, 0.0, activation='gelu', batch_first=True, norm_first=True)", x=SEQ),
        mod(
            "nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True)",
            "m(x, src_mask=nn.Transformer.generate_square_subsequent_mask(5), is_causal=True)",
            x=SEQ,
        ),
        mod("nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)", x=SEQ, train=False),
    ),
    module(
        "TransformerEncoder",
        mod(
            "nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16, 0.0, batch_first=True), 2, "
            "enable_nested_tensor=False)",
            x=SEQ,
            device=False,
        ),
    ),
    module(
        "LSTM",
        mod("nn.LSTM(8, 6, batch_first=True)", x=SEQ),
        mod("nn.LSTM(8, 6, num_layers=2)", x=normal(5, 2, 8)),
        mod("nn.LSTM(8, 6, batch_first=True)", "m(x, (h, c))", x=SEQ, h=normal(1, 2, 6), c=normal(1, 2, 6)),
        mod("nn.LSTM(8, 5, batch_first=True, bidirectional=True)", x=SEQ),
    ),
    module(
        "GRU",
        mod("nn.GRU(8, 6, batch_first=True)", x=SEQ, device=False),
        mod("nn.GRU(8, 6, num_layers=2)", "m(x, h)", x=normal(5, 2, 8), h=normal(2, 2, 6)),
    ),
    module("RNN", mod("nn.RNN(8, 6, batch_first=True)", x=SEQ, device=False)),
    module("LSTMCell", mod("nn.LSTMCell(8, 6)", x=normal(2, 8), device=False)),
    module("GRUCell", mod("nn.GRUCell(8, 6)", x=normal(2, 8), device=False)),
]

# ---------------------------------------------------------------------------------------------
# torch.nn.init (meganeura draws from numpy: distributions are compared, not numbers)

INIT = [
    init(
        "calculate_gain",
        InitCase("nn.init.calculate_gain('leaky_relu', 0.2)"),
        InitCase("nn.init.calculate_gain('tanh')"),
    ),
    init(
        "constant_, ones_, zeros_",
        InitCase("nn.init.constant_(w, 0.3)", (3, 4)),
        InitCase("nn.init.ones_(w)", (5,)),
        InitCase("nn.init.zeros_(w)", (2, 2)),
    ),
    init("eye_", InitCase("nn.init.eye_(w)", (3, 5))),
    init("dirac_", InitCase("nn.init.dirac_(w)", (4, 4, 3, 3)), InitCase("nn.init.dirac_(w, groups=2)", (4, 2, 3))),
    init("uniform_", InitCase("nn.init.uniform_(w, -0.5, 2.0)", (64, 64), "bounded"), note=NOT_TORCH_RNG),
    init("normal_", InitCase("nn.init.normal_(w, 0.5, 2.0)", (64, 64), "sample"), note=NOT_TORCH_RNG),
    init(
        "trunc_normal_",
        InitCase("nn.init.trunc_normal_(w, std=0.5, a=-0.4, b=0.8)", (64, 64), "bounded"),
        note=NOT_TORCH_RNG,
    ),
    init("xavier_uniform_", InitCase("nn.init.xavier_uniform_(w, gain=2.0)", (48, 96), "bounded"), note=NOT_TORCH_RNG),
    init("xavier_normal_", InitCase("nn.init.xavier_normal_(w)", (16, 8, 3, 3), "sample"), note=NOT_TORCH_RNG),
    init(
        "kaiming_uniform_",
        InitCase("nn.init.kaiming_uniform_(w, a=math.sqrt(5))", (64, 48), "bounded"),
        InitCase("nn.init.kaiming_uniform_(w, mode='fan_out', nonlinearity='relu')", (64, 48), "bounded"),
        note=NOT_TORCH_RNG,
    ),
    init(
        "kaiming_normal_",
        InitCase("nn.init.kaiming_normal_(w, nonlinearity='relu')", (64, 48), "sample"),
        note=NOT_TORCH_RNG,
    ),
    init("orthogonal_", InitCase("nn.init.orthogonal_(w, gain=1.5)", (24, 40), "gram"), note=NOT_TORCH_RNG),
    init("sparse_", InitCase("nn.init.sparse_(w, 0.25)", (64, 64), "sample"), note=NOT_TORCH_RNG),
]

# ---------------------------------------------------------------------------------------------
# torch.optim and its schedulers

OPTIMIZER = [
    optimizer(
        "SGD",
        OptimizerCase("optim.SGD(params, lr=0.1)"),
        OptimizerCase("optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.05)"),
        OptimizerCase("optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True)"),
        OptimizerCase("optim.SGD(params, lr=0.1, momentum=0.8, dampening=0.3)"),
        OptimizerCase("optim.SGD([{'params': [p]}, {'params': [q], 'lr': 0.01}], lr=0.1, momentum=0.5)"),
    ),
    optimizer(
        "Adam",
        OptimizerCase("optim.Adam(params, lr=0.01)"),
        OptimizerCase("optim.Adam(params, lr=0.01, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.1)"),
        OptimizerCase("optim.Adam(params, lr=0.01, betas=(0.9, 0.8), amsgrad=True)", steps=6),
    ),
    optimizer(
        "AdamW",
        OptimizerCase("optim.AdamW(params, lr=0.01)"),
        OptimizerCase("optim.AdamW(params, lr=0.01, betas=(0.8, 0.7), weight_decay=0.3, amsgrad=True)", steps=6),
    ),
    optimizer(
        "RMSprop",
        OptimizerCase("optim.RMSprop(params, lr=0.01)"),
        OptimizerCase("optim.RMSprop(params, lr=0.01, alpha=0.9, momentum=0.5, centered=True, weight_decay=0.1)"),
    ),
    optimizer(
        "Adagrad",
        OptimizerCase("optim.Adagrad(params, lr=0.1)"),
        OptimizerCase("optim.Adagrad(params, lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.2)"),
    ),
    optimizer(
        "Adamax",
        OptimizerCase("optim.Adamax(params, lr=0.01)"),
        OptimizerCase("optim.Adamax(params, lr=0.01, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.1)"),
    ),
    optimizer(
        "NAdam",
        OptimizerCase("optim.NAdam(params, lr=0.01)"),
        OptimizerCase("optim.NAdam(params, lr=0.01, betas=(0.8, 0.9), weight_decay=0.1, momentum_decay=0.01)"),
        OptimizerCase("optim.NAdam(params, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True)"),
    ),
    optimizer(
        "RAdam",
        OptimizerCase("optim.RAdam(params, lr=0.01)"),
        OptimizerCase(  # rectified from step 6 on
            "optim.RAdam(params, lr=0.01, betas=(0.9, 0.9), weight_decay=0.1, decoupled_weight_decay=True)", steps=8
        ),
    ),
    optimizer(
        "Adadelta",
        OptimizerCase("optim.Adadelta(params)"),
        OptimizerCase("optim.Adadelta(params, lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.1)"),
    ),
    optimizer(
        "Optimizer (its learning rate set by a scheduler between steps)",
        OptimizerCase("optim.SGD(params, lr=0.1, momentum=0.9)", "lr_scheduler.StepLR(opt, 2, gamma=0.5)", steps=5),
        OptimizerCase("optim.AdamW(params, lr=0.01)", "lr_scheduler.CosineAnnealingLR(opt, T_max=4)", steps=5),
    ),
]

SGD2 = "optim.SGD([{'params': [p]}, {'params': [q], 'lr': 0.03}], lr=0.1, momentum=0.9)"
ADAMW = "optim.AdamW(params, lr=0.1)"
SCHEDULER = [
    scheduler("StepLR", SchedulerCase(SGD2, "lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)")),
    scheduler("MultiStepLR", SchedulerCase(SGD2, "lr_scheduler.MultiStepLR(opt, milestones=[2, 5, 5, 9], gamma=0.3)")),
    scheduler("ExponentialLR", SchedulerCase(ADAMW, "lr_scheduler.ExponentialLR(opt, gamma=0.9)")),
    scheduler("CosineAnnealingLR", SchedulerCase(SGD2, "lr_scheduler.CosineAnnealingLR(opt, T_max=5, eta_min=0.001)")),
    scheduler("LinearLR", SchedulerCase(ADAMW, "lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=4)")),
    scheduler("LambdaLR", SchedulerCase(SGD2, "lr_scheduler.LambdaLR(opt, lambda e: 0.9 ** e + 0.01 * e)")),
    scheduler(
        "SequentialLR",
        SchedulerCase(
            ADAMW,
            "lr_scheduler.SequentialLR(opt, [lr_scheduler.LinearLR(opt, 0.1, total_iters=3), "
            "lr_scheduler.CosineAnnealingLR(opt, T_max=6)], milestones=[3])",
        ),
    ),
    scheduler("OneCycleLR", SchedulerCase(SGD2, "lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=12)", steps=11)),
    scheduler(
        "ReduceLROnPlateau",
        SchedulerCase(
            SGD2,
            "lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=1, threshold=0.01)",
            metrics=(1.0, 0.9, 0.95, 0.899, 0.91, 0.92, 0.5, 0.6, 0.6, 0.6, 0.4, 0.45),
        ),
        SchedulerCase(
            SGD2,
            "lr_scheduler.ReduceLROnPlateau(opt, mode='max', factor=0.1, patience=0, cooldown=1, min_lr=1e-3)",
            metrics=(0.1, 0.2, 0.2, 0.1, 0.1, 0.1, 0.3, 0.3, 0.3, 0.3, 0.3, 0.3),
        ),
    ),
    scheduler(
        "CosineAnnealingWarmRestarts",
        SchedulerCase(SGD2, "lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=3, T_mult=2)"),
    ),
    scheduler("PolynomialLR", SchedulerCase(ADAMW, "lr_scheduler.PolynomialLR(opt, total_iters=6, power=2.0)")),
    scheduler("ConstantLR", SchedulerCase(ADAMW, "lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=3)")),
    scheduler("CyclicLR", SchedulerCase(SGD2, "lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=3)")),
]

ITEMS: list[Item] = TENSOR + FUNCTIONAL + LOSS + MODULE + INIT + OPTIMIZER + SCHEDULER

# ---------------------------------------------------------------------------------------------
# What meganeura does not have (an item's cases then document the port and must fail loudly).
# Keyed by item name; the README's limits list them with the reason.

UNSUPPORTED: dict[str, str] = {  # by item
}  # fmt: skip

UNSUPPORTED_CASES: dict[str, str] = {  # by case id: the cases that fail in an item that is supported
}  # fmt: skip

# The cases that fail on the device (a bug): kept off the device run, listed in the README's limits.
DEVICE_FAILS: dict[str, str] = {}


def items() -> list[Item]:
    """Every item, with `unsupported` filled from UNSUPPORTED and its cases' from UNSUPPORTED_CASES
    (and `device_fails` from DEVICE_FAILS)."""
    from dataclasses import replace

    def marked(item: Item, case_id: str, case):
        if case_id in UNSUPPORTED_CASES:
            case = replace(case, unsupported=UNSUPPORTED_CASES[case_id])
        if case_id in DEVICE_FAILS:
            case = replace(case, device_fails=DEVICE_FAILS[case_id])
        return case

    return [
        replace(
            i,
            unsupported=UNSUPPORTED.get(i.name, i.unsupported),
            cases=tuple(marked(i, case_id, c) for case_id, c in zip(i.case_ids(), i.cases, strict=True)),
        )
        for i in ITEMS
    ]


def cases() -> dict[str, tuple[Item, object]]:
    """Every case by its id (`<item name>[<index>]`), with its item."""
    return {case_id: (i, c) for i in items() for case_id, c in zip(i.case_ids(), i.cases, strict=True)}


# ---------------------------------------------------------------------------------------------
# Distributions (nn.init's samples): what torch's side stores and meganeura's is compared on

SAMPLE_SIZE = 2**18  # numbers drawn per init case: scales are then compared to ~1%, bounds to 0.1%
LEVELS = 1001  # the quantiles stored


def draws_needed(shape: tuple[int, ...]) -> int:
    """How many times an init case fills its parameter: SAMPLE_SIZE numbers at least."""
    size = 1
    for d in shape:
        size *= d
    return -(-SAMPLE_SIZE // size)


def distribution_summary(values, points=None) -> dict:
    """A sample's quantiles at LEVELS evenly spaced probabilities (`points`: its empirical CDF
    there instead, to compare with another sample's quantiles), and its moments: mean, std,
    kurtosis, the fraction of exact zeros, min, max."""
    import numpy as np

    values = np.sort(np.asarray(values, np.float64).ravel())
    if points is None:
        points = np.quantile(values, np.linspace(0.0, 1.0, LEVELS))
    spread = values.std()
    kurtosis = float(((values - values.mean()) ** 4).mean() / spread**4) if spread > 0 else 1.0
    moments = [values.mean(), spread, kurtosis, float(np.mean(values == 0)), values[0], values[-1], values.size]
    return {
        "points": np.asarray(points, np.float64),
        "cdf": np.searchsorted(values, points, "right") / values.size,
        "moments": np.array(moments, np.float64),
    }


# ---------------------------------------------------------------------------------------------
# The documents' sections (scripts/conformance_table.py writes them into docs/supported-ops.md and
# the README's limits; tests/test_conformance.py checks that both hold them)

SHORT_PREFIXES = (
    ("torch.nn.functional.", "F."),
    ("torch.nn.init.", "nn.init."),
    ("torch.nn.", "nn."),
    ("torch.optim.lr_scheduler.", "lr_scheduler."),
    ("torch.optim.", "optim."),
)


def short_name(name: str) -> str:
    """The name as a ported script writes it (`F.elu`, `nn.LSTM`, `optim.SGD`)."""
    for prefix, short in SHORT_PREFIXES:
        if name.startswith(prefix):
            return short + name[len(prefix) :]
    return name


def wrapped(text: str, indent: str = "  ") -> str:
    import textwrap

    return textwrap.fill(text, 110, subsequent_indent=indent, break_on_hyphens=False, break_long_words=False)


def case_text(case, shapes: bool = False) -> str:
    """The case as a user writes it (`shapes`: with its inputs' shapes)."""
    if isinstance(case, Case):
        text = f"`{case.module}: {case.expr}`" if case.module else f"`{case.expr}`"
        described = [
            f"{name} {list(d[1])}" + (" with NaN and ±inf" if d[0] == "special" else "")
            for name, d in case.inputs.items()
            if d[0] != "values"
        ]
        return text + (f" ({', '.join(described)})" if shapes and described else "")
    if isinstance(case, (OptimizerCase, SchedulerCase)):
        return f"`{case.scheduler or case.optimizer}`"
    return f"`{case.expr}`"


def by_reason(pairs) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for reason, text in pairs:
        grouped.setdefault(reason, []).append(text)
    return grouped


def markdown_sections() -> tuple[str, str]:
    """(the "Supported PyTorch surface" list, the unsupported items for the limits), as markdown."""
    every = items()
    supported = [i for i in every if not i.unsupported]
    count = sum(1 for i in supported for c in i.cases if not c.unsupported)
    lines = [
        wrapped(
            f"{len(supported)} items of PyTorch's surface, in {count} cases, each written once as text that is "
            "both PyTorch and meganeura (`F.elu(x, alpha=0.7)`, `x.var(dim=1, unbiased=False)`), are checked "
            "against PyTorch's values and gradients (`tests/conformance.py`, the table; "
            "`tests/test_conformance.py`, on the numpy interpreter in float64 and compiled on lavapipe in "
            "float32). This list is generated from the table (`python scripts/conformance_table.py`).",
            "",
        ),
        "",
    ]
    for category, heading in CATEGORIES.items():
        names = [f"`{short_name(i.name)}`" for i in supported if i.category == category]
        if names:
            lines.append(wrapped(f"- {heading}, {len(names)}: " + ", ".join(names) + "."))
    for note, names in by_reason((i.note, f"`{short_name(i.name)}`") for i in supported if i.note).items():
        lines.append(wrapped(f"- {', '.join(names)}: {note}."))
    limits = []
    unsupported = by_reason((i.unsupported, f"`{short_name(i.name)}`") for i in every if i.unsupported)
    for reason, names in unsupported.items():
        limits.append(wrapped(f"- Not supported ({reason}): {', '.join(names)}."))
    cases = by_reason((c.unsupported, case_text(c, True)) for i in supported for c in i.cases if c.unsupported)
    for reason, texts in cases.items():
        limits.append(wrapped(f"- Not supported ({reason}): {', '.join(texts)}."))
    failing = [
        (c.device_fails, case_text(c, True)) for i in supported for c in i.cases if getattr(c, "device_fails", "")
    ]
    for reason, texts in by_reason(failing).items():
        limits.append(wrapped(f"- Fails to compile or run on the device ({reason}): {', '.join(texts)}."))
    return "\n".join(lines) + "\n", "\n".join(limits) + ("\n" if limits else "")
