"""Smoke test of examples/char_lm.py: a tiny Llama-style character model (embedding, RMSNorm,
causal GQA attention with RoPE written out (recognised as the fused attention op), SwiGLU, tied
head) trains on the GPU step for step like the numpy interpreter, with and without the e-graph's
fusions, and samples characters of its vocabulary from a short prompt, without padding (the
sampling program compiles each window length once)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from conftest import assert_steps_follow_interpreter

import meganeura as mn

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "char_lm.py")
spec = importlib.util.spec_from_file_location("char_lm", EXAMPLE)
char_lm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(char_lm)

BATCH, SEQ, DIM, LAYERS = 2, 8, 16, 2
TEXT = "def f(x):\n    return x * 2\n\nclass A:\n    pass\n" * 20


def tiny_model(vocab_size: int, seed: int = 0):
    mn.manual_seed(seed)
    return char_lm.CharLlama(vocab_size, dim=DIM, layers=LAYERS, heads=4, kv_heads=2)


def test_data_functions():
    vocab, train, val = char_lm.split_data(TEXT, val_fraction=0.25)
    assert vocab.decode(vocab.encode("def x")) == "def x"
    assert len(train) + len(val) == len(TEXT) and len(val) == len(TEXT) // 4
    p = np.bincount(val, minlength=len(vocab)) / len(val)
    expected = -sum(q * np.log(q) for q in p if q > 0)
    assert char_lm.unigram_entropy(val, len(vocab)) == pytest.approx(expected)
    tokens, targets = char_lm.get_batch(train, BATCH, SEQ, np.random.default_rng(0))
    assert tokens.shape == (BATCH, SEQ) and targets.shape == (BATCH * SEQ,)
    np.testing.assert_array_equal(tokens[:, 1:], targets.reshape(BATCH, SEQ)[:, :-1])
    assert set(char_lm.load_text(2000)) <= set("\n\t" + "".join(map(chr, range(32, 127))))


@pytest.mark.parametrize("rewrite", [True, False], ids=["fused", "unfused"])
def test_five_gpu_steps_follow_the_interpreter_and_sampling_uses_the_vocabulary(rewrite):
    vocab, train, _ = char_lm.split_data(TEXT, val_fraction=0.25)
    model = tiny_model(len(vocab))
    program = char_lm.compile_training(model, BATCH, SEQ, lr=1e-2, rewrite=rewrite)
    tables = char_lm.fixed_inputs(model, SEQ)
    tokens, targets = char_lm.get_batch(train, BATCH, SEQ, np.random.default_rng(0))
    batches = [{"tokens": tokens, "targets": targets, **tables}] * 5  # one batch: the loss must fall
    losses = assert_steps_follow_interpreter(program, batches)
    assert losses[-1] < losses[0]
    if not rewrite:
        return
    assert program.report().rewrite.rule("swiglu").uses > 0  # silu(gate(x)) · up(x), as written
    generate = char_lm.compile_sampling(model, SEQ)
    text = char_lm.sample(generate, vocab, vocab.encode("def"), 12, SEQ, tables, seed=0)
    assert len(text) == 12 and set(text) <= set(vocab.chars)
    # No padding: the prompt of 3 grew one id a step to the context of 8, each length compiled
    # once, and then the window slid at length 8.
    assert generate.report().shapes == [char_shapes(SEQ)] + [char_shapes(n) for n in range(3, SEQ)]
    short = tokens[:1, :3]
    exact = mn.compile(model, inputs=char_lm.model_inputs(model, 1, 3), dynamic=False)
    tables3 = {name: table[:3] for name, table in tables.items()}
    np.testing.assert_array_equal(generate(tokens=short, **tables3), exact(tokens=short, **tables3))


def char_shapes(length: int) -> dict:
    """The input shapes of the sampling program at a window of `length` ids."""
    head_dim = DIM // 4
    return {"tokens": (1, length), "cos": (length, head_dim), "sin": (length, head_dim)}
