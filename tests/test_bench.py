"""The side-by-side bench (`python -m meganeura bench`, meganeura/bench/): the command line parses
and rejects unknown workloads; every workload runs at its small size and reports real numbers; where
torch is installed, each PyTorch mirror's first-step loss (and its loss after one optimizer update)
matches ours, which is the check that the mirrors are the same models with the same weights (for
the workloads with dropout, whose masks differ on each side, an eval-mode forward's loss); where
it is not, the torch columns say so; a mirror that disagrees gets no ratios.

The bench runs in a child process, as a user runs it: torch must be imported before the WebGPU
device opens (meganeura/bench/harness.py, preload_torch), and this process has usually opened it
already.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time

import pytest

from meganeura.__main__ import main
from meganeura.bench import gemm
from meganeura.bench.harness import LOSS_RTOL, TOP_KINDS, StepResult, TorchRun
from meganeura.bench.report import (
    dropout_costs,
    dropout_text,
    label_share,
    markdown,
    share_line,
    source_digest,
    step_text,
)
from meganeura.bench.workloads import STEPS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_TORCH = importlib.util.find_spec("torch") is not None
STEP_NAMES = list(STEPS)
STOCHASTIC = {"gpt2-dropout", "vit"}  # the workloads with dropout
# The workloads whose attention runs as the fused kernels (labelled attention…): every one (SDPA's
# dropout_p is drawn inside them).
FUSED_ATTENTION = {"smollm2", "gpt2", "gpt2-dropout", "vit", "unet"}


def test_help_lists_every_workload(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    for name in [*STEP_NAMES, "gemm", "all", "--torch-compile", "--small", "--json", "--markdown"]:
        assert name in out


def test_unknown_workloads_are_rejected_with_the_list(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "smollm2", "resnet50"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "unknown workload(s) resnet50" in err
    for name in [*STEP_NAMES, "gemm"]:
        assert name in err


def test_a_bad_share_pattern_is_rejected(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "smollm2", "--share", "attention("])
    assert exit.value.code == 2
    assert "--share 'attention('" in capsys.readouterr().err


def test_bad_gemm_shapes_are_rejected(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "gemm", "--gemm-shapes", "64x64"])
    assert exit.value.code == 2
    assert "MxKxN" in capsys.readouterr().err
    assert gemm.parse_shapes("8x16x24, 3X5X7") == ((8, 16, 24), (3, 5, 7))


def test_the_gemm_products_are_the_forward_and_its_gradients():
    import numpy as np

    rng = np.random.default_rng(0)
    a, b, g = rng.normal(size=(5, 3)), rng.normal(size=(3, 4)), rng.normal(size=(5, 4))
    forward, grad_a, grad_b = gemm.products([(5, 3, 4)])
    assert [p.operands[:2] for p in (forward, grad_a, grad_b)] == [((5, 3), (3, 4)), ((5, 4), (3, 4)), ((5, 3), (5, 4))]
    np.testing.assert_allclose(forward.reference(a, b), a @ b)
    np.testing.assert_allclose(grad_a.reference(g, b), g @ b.T)  # dA of C = A·B
    np.testing.assert_allclose(grad_b.reference(a, g), a.T @ g)  # dB
    assert {p.flops for p in (forward, grad_a, grad_b)} == {2 * 5 * 3 * 4}


HEADER = {"date": "d", "adapter": "a", "torch": "t", "git_commit": "c", "steps": 20, "warmup": 5, "small": False}


def table_row(result: StepResult) -> str:
    """`result`'s line of the Markdown table."""
    table = markdown([result], [], ("fp32", "bf16"), HEADER)
    return next(line for line in table.splitlines() if line.startswith("| toy"))


def result_with_losses(ours: list[float], theirs: list[float]) -> StepResult:
    result = StepResult("toy", "toy", 20, 5, 1.0, 10, 50.0, ours, [50.0] * 20, torch_note="torch (test)")
    result.torch["fp32"] = TorchRun("fp32", ms=25.0, losses=theirs)
    result.torch["bf16"] = TorchRun("bf16", ms=10.0, losses=theirs)
    return result


def test_a_mirror_that_disagrees_gets_no_ratios():
    agreeing = result_with_losses([2.0, 1.9], [2.0 * (1 + LOSS_RTOL / 2), 1.9])
    assert agreeing.mirror_ok and agreeing.ratio("fp32") == pytest.approx(2.0) and agreeing.ratio("bf16") == 5.0
    off = result_with_losses([2.0, 1.9], [2.0 * (1 + 3 * LOSS_RTOL), 1.9])
    assert off.mirror_ok is False
    assert off.ratio("fp32") is None and off.ratio("bf16") is None
    text = step_text(off, ("fp32", "bf16"))
    assert "MIRROR MISMATCH" in text and "ours/torch" not in text
    row = table_row(off)
    assert row.split(" | ")[3] == "–" and row.split(" | ")[5] == "–"  # the ratio columns


def stochastic_result(eval_ours: list[float], eval_theirs: list[float]) -> StepResult:
    """A workload with dropout: training losses far apart (each side's own masks)."""
    result = result_with_losses([2.0, 1.9], [2.3, 1.7])
    result.stochastic, result.eval_losses = True, eval_ours
    result.torch["fp32"].eval_losses = eval_theirs
    return result


def test_a_workload_with_dropout_is_checked_by_its_eval_mode_loss():
    """Dropout's masks differ on each side: the check is the eval-mode (dropout-off) loss before any
    update; the training losses are printed, not compared; the losses after an update are reported."""
    agreeing = stochastic_result([2.1, 1.95], [2.1 * (1 + LOSS_RTOL / 2), 1.96])
    assert agreeing.stochastic and agreeing.check == "eval-mode forward (dropout off)"
    assert agreeing.mirror_ok and agreeing.ratio("fp32") == pytest.approx(2.0)  # though 2.0 vs 2.3 in training
    assert agreeing.loss_difference == pytest.approx(LOSS_RTOL / 2 / (1 + LOSS_RTOL / 2))
    assert agreeing.second_loss_difference is None
    assert agreeing.eval_update_difference == pytest.approx(0.01 / 1.96)
    text = step_text(agreeing, ("fp32", "bf16"))
    assert "eval-mode (dropout off) loss before any update: ours 2.100000" in text and "same model" in text
    assert "training losses with dropout (not compared): ours 2.000000, 1.900000; PyTorch fp32 2.300000" in text
    record = agreeing.as_dict()
    assert record["check"] == agreeing.check and record["eval_losses"] == [2.1, 1.95]
    assert record["modes"]["fp32"]["eval_losses"] == [2.1 * (1 + LOSS_RTOL / 2), 1.96]
    assert table_row(agreeing).split(" | ")[8].endswith("(eval)")

    off = stochastic_result([2.1, 1.95], [2.1 * (1 + 3 * LOSS_RTOL), 1.95])
    assert off.mirror_ok is False and off.ratio("fp32") is None and off.ratio("bf16") is None
    assert "MIRROR MISMATCH" in step_text(off, ("fp32", "bf16"))
    unchecked = stochastic_result([2.1, 1.95], [])  # PyTorch's eval-mode loss did not run: no check, no ratios
    assert unchecked.mirror_ok is None and unchecked.ratio("fp32") is None


def test_what_dropout_adds_pairs_a_workload_with_its_dropout_variant():
    base = result_with_losses([2.0, 1.9], [2.0, 1.9])
    base.name, base.ours_ms = "gpt2", 40.0
    dropped = stochastic_result([2.0, 1.9], [2.0, 1.9])
    dropped.name, dropped.ours_ms = "gpt2-dropout", 50.0
    dropped.torch["fp32"].ms, dropped.torch["bf16"].ms = 30.0, None
    costs = dropout_costs([base, dropped, result_with_losses([1.0], [1.0])])
    assert costs == {
        "gpt2-dropout": {
            "meganeura": {"ms": 10.0, "relative": 0.25},
            "torch fp32": {"ms": 5.0, "relative": 0.2},  # bf16 has no time with dropout: left out
        }
    }
    assert dropout_text(costs) == (
        "== what dropout adds to gpt2's step: meganeura +10.000 ms (+25.0%), torch fp32 +5.000 ms (+20.0%)"
    )
    assert dropout_costs([dropped]) == {}  # without the step it adds to


def test_the_table_keeps_three_digits_of_a_short_step():
    """A sub-millisecond step keeps its digits in the table (0.508 ms read 0.5); long ones a tenth."""
    result = result_with_losses([2.0, 1.9], [2.0, 1.9])
    result.ours_ms, result.torch["fp32"].ms, result.torch["bf16"].ms = 0.5083, 1.3344, 114.84
    row = next(
        line for line in markdown([result], [], ("fp32", "bf16"), HEADER).splitlines() if line.startswith("| toy")
    )
    assert row.split(" | ")[1:6] == ["0.508", "1.33", "0.38", "114.8", "0.00"]


def test_a_result_names_the_settings_it_ran_under(monkeypatch):
    """The opt-ins change what our step runs: the record and the table's line name those set."""
    from meganeura.bench import report

    for name in report.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    assert report.header("a", 20, 5, False)["settings"] == {}
    monkeypatch.setenv("MEGANEURA_BACKEND", "dawn")
    monkeypatch.setenv("MEGANEURA_TENSOR_CORES", " 1")
    record = report.header("a", 20, 5, False)
    assert record["settings"] == {"MEGANEURA_BACKEND": "dawn", "MEGANEURA_TENSOR_CORES": "1"}
    first = markdown([], [], ("fp32",), record).splitlines()[0]
    assert first.endswith("MEGANEURA_BACKEND=dawn MEGANEURA_TENSOR_CORES=1; medians of 20 steps after 5 warm-up")
    assert "default settings;" in markdown([], [], ("fp32",), {**record, "settings": {}}).splitlines()[0]


def test_the_source_digest_names_the_code_and_the_templates(tmp_path, capsys):
    """A record names the source that ran by a digest of the package's .py files and the WGSL
    templates: a copy of the tree has the same one, a changed template or module another; the
    CLI prints this checkout's (to compare with a record made on a device's copy)."""
    import shutil

    from meganeura.codegen.render import PACKAGE_DIR, template_path

    package, shaders = tmp_path / "meganeura", tmp_path / "shaders"
    shutil.copytree(PACKAGE_DIR, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(template_path("reduce").parent, shaders)
    here = source_digest()
    assert len(here) == 64 and source_digest(package, shaders) == here
    (shaders / "reduce.wgsl").write_text((shaders / "reduce.wgsl").read_text() + "\n")
    changed = source_digest(package, shaders)
    assert changed != here
    (package / "bench" / "new_module.py").write_text("")
    assert source_digest(package, shaders) not in (here, changed)
    assert main(["bench", "--source-digest"]) == 0 and capsys.readouterr().out.strip() == here


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """`python -m meganeura bench --small all` in a child process: (return code, stdout, JSON record)."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "meganeura", "bench", "--small", "--steps", "3", "--warmup", "2", "--repeat", "3"]
    command += [
        "--torch-threads",
        "1",
        "--json",
        str(out),
        "--markdown",
        "--share",
        "^attention",
        "all",
    ]  # torch's pool stalls beside lavapipe
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def finite_positive(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and value > 0


@pytest.mark.gpu
def test_our_step_keeps_every_kernels_time_for_shares():
    """run_ours keeps each distinct kernel's time (`label_ms`, what plan_ab.py --share sums): all
    of them, the top ones among them, adding up to the profiled step's GPU time."""
    import numpy as np

    from meganeura.bench.harness import run_ours

    workload = STEPS["smollm2"].build(small=True)
    result = run_ours(workload, workload.batch(np.random.default_rng(0)), 2, 2)
    assert result.label_ms and math.isclose(sum(result.label_ms.values()), result.gpu_ms, rel_tol=1e-6)
    assert all(math.isclose(result.label_ms[k.kind], k.ms) for k in result.top_kernels)
    assert any(label.startswith("attention_grad_kv") for label in result.label_ms)
    assert 0 < result.gpu_pass_ms < 2 * max(result.times_ms)  # ms too: one pass, about a step's wall time at most


@pytest.mark.gpu
def test_the_eval_mode_loss_is_the_step_without_dropout():
    """gpt2-dropout's eval-mode loss before any update is gpt2's first training loss from the same
    weights (the eval program drops nothing and starts from the weights the training program does);
    its training steps drop (their loss is another), and its eval-mode loss after one update is
    lower. The model is back in training mode after its eval program compiled."""
    import numpy as np

    from meganeura import nn
    from meganeura.bench.harness import run_ours

    results = {}
    for name in ("gpt2", "gpt2-dropout"):
        nn.manual_seed(7)  # the same initial weights: Dropout draws none
        workload = STEPS[name].build(small=True)
        results[name] = run_ours(workload, workload.batch(np.random.default_rng(0)), 1, 2)
        assert workload.model.training and all(module.training for module in workload.model.modules())
    plain, dropped = results["gpt2"], results["gpt2-dropout"]
    assert not plain.stochastic and plain.eval_losses == [] and dropped.stochastic
    assert dropped.eval_losses[0] == pytest.approx(plain.ours_losses[0], rel=1e-5)
    assert abs(dropped.ours_losses[0] - dropped.eval_losses[0]) > 1e-3
    assert dropped.eval_losses[1] < dropped.eval_losses[0]


@pytest.mark.gpu
def test_every_workload_runs_and_reports_real_numbers(bench_run):
    stdout, record = bench_run
    assert record["small"] and record["steps"] == 3 and record["adapter"] in stdout
    assert len(record["git_commit"]) >= 7 and record["date"][:2] == "20"
    assert record["source_digest"] == source_digest() and f"source {source_digest()[:12]}" in stdout
    assert [w["workload"] for w in record["workloads"]] == STEP_NAMES
    for w in record["workloads"]:
        assert finite_positive(w["ours_ms"]) and finite_positive(w["compile_s"]), w["workload"]
        assert len(w["ours_times_ms"]) == 3 and w["dispatches"] > 10
        assert all(math.isfinite(loss) and loss > 0 for loss in w["ours_losses"])
        assert w["stochastic"] == (w["workload"] in STOCHASTIC) and w["parameters"] > 0
        # One update on the same batch lowers its loss (with dropout: the eval-mode loss, each
        # training step drawing its own masks).
        checked = w["eval_losses"] if w["stochastic"] else w["ours_losses"]
        assert len(checked) == 2 and checked[1] < checked[0], w["workload"]
        kinds = w["top_kinds"]
        assert 1 <= len(kinds) <= TOP_KINDS and sum(k["share"] for k in kinds) <= 1 + 1e-9
        assert kinds == sorted(kinds, key=lambda k: -k["ms"]) and all(k["ms"] > 0 for k in kinds)
        assert any(k["tflops"] > 0 for k in kinds)  # a matmul among them, its flops counted
        kernels = w["top_kernels"]  # by label, the most time first, within the step's GPU time
        assert 1 <= len(kernels) <= 40 and kernels == sorted(kernels, key=lambda k: -k["ms"])
        assert sum(k["ms"] for k in kernels) <= w["gpu_ms"] * (1 + 1e-9)
        assert finite_positive(w["gpu_one_pass_ms"])  # the warm-up step before it, as one pass
        share = w["shares"]["^attention"]  # --share: the attention kernels over every kernel the step ran
        attention = w["workload"] in FUSED_ATTENTION
        assert (share["kernels"] > 0) == attention and 0 <= share["ms"] < w["gpu_ms"], w["workload"]
        assert math.isclose(share["share"], share["ms"] / w["gpu_ms"]) and "matching '^attention'" in stdout
        if attention:  # the forward, dQ's kernel or product, dK/dV: at least the forward and dK/dV
            assert share["kernels"] >= 2 and share["ms"] >= sum(
                k["ms"] for k in kernels if k["kind"].startswith("attention")
            )
        assert f"== {w['workload']}:" in stdout
        assert any(line.startswith(f"| {w['workload']} |") for line in stdout.splitlines())  # the Markdown row
    assert record["dropout_cost"].keys() == {"gpt2-dropout"}  # gpt2 and gpt2-dropout both ran
    assert "== what dropout adds to gpt2's step: meganeura " in stdout
    products = record["gemm"]
    assert len(products) == 3 * len(gemm.SMALL_SHAPES)
    for p in products:
        assert finite_positive(p["ours_tflops"]) and p["max_error"] < gemm.CHECK_RTOL, p["product"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_each_mirror_starts_from_our_weights_and_matches_our_loss(bench_run):
    stdout, record = bench_run
    for w in record["workloads"]:
        name = w["workload"]
        assert w["mirror_ok"] is True, name
        assert w["loss_difference"] < 1e-4, name  # fp32 on both sides: rounding only
        if w["stochastic"]:  # the eval-mode loss is the check; after an update that saw other masks, close
            assert w["check"] == "eval-mode forward (dropout off)" and w["second_loss_difference"] is None, name
            assert w["eval_update_difference"] < 5e-2, name
            assert len(w["modes"]["fp32"]["eval_losses"]) == 2 and f"== {name}:" in stdout
        else:
            assert w["second_loss_difference"] < 1e-3, name  # the optimizer update agrees too
        for mode in ("fp32", "bf16"):
            run = w["modes"][mode]
            assert finite_positive(run["ms"]) and finite_positive(run["ratio"]), (name, mode, run["note"])
        bf16 = w["modes"]["bf16"]["losses"][0]
        assert abs(bf16 - w["ours_losses"][0]) / w["ours_losses"][0] < 0.05  # same weights, bf16 rounding
        assert "compile" not in w["modes"]  # only with --torch-compile
    for p in record["gemm"]:
        assert finite_positive(p["torch_tflops"]) and finite_positive(p["ratio"])
    if not record["workloads"][0]["torch_on_gpu"]:
        assert "ratios are NOT GPU-vs-GPU" in stdout


@pytest.mark.gpu
@pytest.mark.skipif(HAS_TORCH, reason="torch is installed")
def test_without_torch_our_side_runs_and_the_torch_columns_say_so(bench_run):
    stdout, record = bench_run
    assert record["torch"] == "torch not installed"
    for w in record["workloads"]:
        assert w["torch"] == "torch not installed" and w["modes"] == {} and w["mirror_ok"] is None
    assert stdout.count("torch not installed") >= 2 * len(STEP_NAMES)
    assert all(p["torch"] == "torch not installed" and p["torch_ms"] is None for p in record["gemm"])


@pytest.mark.gpu
def test_gemm_tune_times_split_pairs_as_bench_gemm_does(tmp_path):
    """benchmarks/gemm_tune.py --splits … --runs N: every (tiling, parts) pair of a ragged product
    timed, checked against numpy, its time the sum of the product's and the sum's parts."""
    out = tmp_path / "tune.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, os.path.join("benchmarks", "gemm_tune.py"), "--steps", "", "--extra", "96x200x72"]
    command += ["--splits", "1,2", "--runs", "2", "--tilings", "64x64/k16 8x8", "--json", str(out)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["split_rows"]
    assert row["product"] == "96x200x72" and row["flops"] == 2 * 96 * 200 * 72
    assert {"64x64/k16 8x8 S1", "64x64/k16 8x8 S2"} <= row["pairs"].keys()  # the tiling named, and the table's
    for key, pair in row["pairs"].items():
        assert finite_positive(pair["seconds"]) and pair["error"] < 1e-5 and pair["splits"] in (1, 2), key
        assert pair["product_s"] + pair["sum_s"] == pytest.approx(pair["seconds"]), key
        assert (pair["sum_s"] == 0) == (pair["splits"] == 1), key
    assert row["best"] in row["pairs"] and f"planner      {row['planned']}" in done.stdout


def test_plan_ab_variants_set_module_attributes_and_undo_them():
    """benchmarks/plan_ab.py: a variant's assignments (an attribute, a dict entry, new or
    replaced) take effect, and undoing them restores every original value."""
    spec = importlib.util.spec_from_file_location("plan_ab", os.path.join(ROOT, "benchmarks", "plan_ab.py"))
    plan_ab = importlib.util.module_from_spec(spec)
    sys.modules["plan_ab"] = plan_ab  # its dataclass looks its module up there
    try:
        spec.loader.exec_module(plan_ab)
    finally:
        del sys.modules["plan_ab"]
    from meganeura.codegen import attention_tiles, matmul

    key, new_key = ("hopper", "attention_grad_kv", 64), ("hopper", "attention_grad_kv", 80)
    chosen, fill = attention_tiles.CHOSEN[key], matmul.FINE_FILL
    name, assignments = plan_ab.parse_variant(
        "v=meganeura.codegen.attention_tiles.CHOSEN[('hopper','attention_grad_kv',64)]=Tiles(16,16,64);"
        "meganeura.codegen.attention_tiles.CHOSEN[('hopper','attention_grad_kv',80)]=Tiles(8,8,64);"
        "meganeura.codegen.matmul.FINE_FILL=FINE_FILL*2"
    )
    assert name == "v" and [a.attr for a in assignments] == ["CHOSEN", "CHOSEN", "FINE_FILL"]
    records = [a.apply() for a in assignments]
    assert attention_tiles.CHOSEN[key] == attention_tiles.Tiles(16, 16, 64)
    assert attention_tiles.CHOSEN[new_key] == attention_tiles.Tiles(8, 8, 64) and matmul.FINE_FILL == 2 * fill
    for record in reversed(records):
        plan_ab.undo(record)
    assert attention_tiles.CHOSEN[key] == chosen and new_key not in attention_tiles.CHOSEN
    assert matmul.FINE_FILL == fill
    assert plan_ab.parse_variant("base=") == ("base", [])
    with pytest.raises(SystemExit, match="not module.attribute"):
        plan_ab.parse_variant("bad=FINE_FILL")
    kernels = {"attention q 8x9": 3.0, "matmul 2048x576x576": 6.0, "attention_grad_kv q 8x9": 1.0}
    share = label_share("^attention", kernels, 40.0)  # what plan_ab.py --share and bench --share print
    assert share == {"kernels": 2, "ms": 4.0, "share": 0.1}
    assert share_line("^attention", share).endswith("2 kernels matching '^attention': 4.000 ms, 10.0% of the step")


def test_warm_up_runs_its_steps_and_at_least_its_seconds():
    """A short step is warmed by time as well as by count: GPU clocks ramp over hundreds of ms."""
    from meganeura.bench.harness import warm_up

    calls = []
    warm_up(lambda: calls.append(time.perf_counter()), 3, seconds=0.0)
    assert len(calls) == 3  # the count alone where the time is no longer

    calls.clear()
    started = time.perf_counter()
    warm_up(lambda: (calls.append(1), time.sleep(0.002)), 3, seconds=0.05)
    assert time.perf_counter() - started >= 0.05
    assert len(calls) > 3  # more steps than asked, until the time had passed
