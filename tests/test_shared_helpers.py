"""The helpers the package keeps one copy of (issue 32 item 3): each one's behaviour, pinned,
and the places that used to hold copies shown to call it.

- the cross-entropy: :func:`mha_course.models.tiny_model.cross_entropy` (and its per-position
  terms, :func:`~mha_course.models.tiny_model.token_losses`), used by the tiny model, the GPTs,
  ``gpt_fast`` and lesson 09's per-head losses in ``text_heads``;
- the entropy of a distribution: :func:`mha_course.variants.entropy.attention_entropy`, used by
  ``logit_control.logit_stats``, ``VariantGPT``'s per-head statistics, ``head_capacity`` and the
  interview drill's temperature check;
- ``figure_png`` (:mod:`mha_course.widgets.plotting`), every widget's PNG, the head viewer's too;
- ``fmt_shape`` (:mod:`mha_course._validate`), which the checks' harness re-exports.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest

import mha_course
from mha_course import softmax
from mha_course._validate import fmt_shape
from mha_course.checks import harness
from mha_course.models.gpt import GPT, GPTConfig
from mha_course.models.gpt_fast import fast_logits, fast_loss_and_grads
from mha_course.models.gpt_variants import BlockVariant, VariantGPT
from mha_course.models.text_heads import ablation_losses, per_position_losses
from mha_course.models.tiny_model import cross_entropy, token_losses
from mha_course.variants.entropy import attention_entropy
from mha_course.variants.logit_control import logit_stats
from mha_course.widgets import cache_memory, explorer, head_viewer, stepper, tile_stepper
from mha_course.widgets.plotting import figure_png


# ------------------------------------------------------------------------------ cross-entropy
def _by_definition(logits, targets, weights):
    """−Σ w log p[target] / Σ w, with p = exp(logits) / Σ exp(logits), in float64 loops."""
    total, flat_l = 0.0, logits.reshape(-1, logits.shape[-1]).astype(np.float64)
    flat_t, flat_w = targets.reshape(-1), weights.reshape(-1)
    for row, t, w in zip(flat_l, flat_t, flat_w, strict=True):
        total += -w * (row[t] - np.log(np.exp(row - row.max()).sum()) - row.max())
    return total / flat_w.sum()


@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 5), (2, 2, 3, 4)])
def test_cross_entropy_is_the_weighted_mean_of_minus_log_p_over_any_leading_axes(shape):
    rng = np.random.default_rng(0)
    logits = 3 * rng.normal(size=shape)
    targets = rng.integers(0, shape[-1], size=shape[:-1])
    weights = rng.integers(0, 2, size=shape[:-1]).astype(float)
    weights.flat[0] = 1.0
    loss, dlogits = cross_entropy(logits, targets, weights)
    assert loss == pytest.approx(_by_definition(logits, targets, weights), rel=1e-12)
    assert dlogits.shape == shape
    # the gradient, by central differences on every logit
    eps, numeric = 1e-6, np.zeros(shape)
    for i in np.ndindex(shape):
        up, down = logits.copy(), logits.copy()
        up[i] += eps
        down[i] -= eps
        numeric[i] = (cross_entropy(up, targets, weights)[0]
                      - cross_entropy(down, targets, weights)[0]) / (2 * eps)
    np.testing.assert_allclose(dlogits, numeric, atol=1e-8)


def test_cross_entropy_without_weights_scores_every_position():
    rng = np.random.default_rng(1)
    logits, targets = rng.normal(size=(6, 4)), rng.integers(0, 4, size=6)
    loss, dlogits = cross_entropy(logits, targets)
    want_loss, want_d = cross_entropy(logits, targets, np.ones(6))
    assert loss == want_loss
    np.testing.assert_array_equal(dlogits, want_d)
    assert loss == pytest.approx(token_losses(logits, targets).mean(), rel=1e-14)


def test_cross_entropy_keeps_float32_logits_in_float32():
    logits = np.random.default_rng(2).normal(size=(8, 5)).astype(np.float32)
    loss, dlogits = cross_entropy(logits, np.arange(8) % 5)
    assert dlogits.dtype == np.float32
    assert loss == pytest.approx(_by_definition(logits, np.arange(8) % 5, np.ones(8)), rel=1e-6)


def test_token_losses_are_minus_log_p_of_each_target():
    p = np.array([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]])
    np.testing.assert_allclose(token_losses(np.log(p) + 4.0, np.array([1, 2])),
                               [np.log(4), -np.log(0.8)], rtol=1e-14)
    big = np.array([[0.0, -1000.0]])  # softmax underflows to [1, 0]: the loss is still 1000
    assert token_losses(big, np.array([1]))[0] == pytest.approx(1000.0)


@pytest.mark.parametrize("call, message", [
    (lambda f: f(np.zeros((2, 3, 4)), np.zeros((2, 2), dtype=int)),
     r"logits has shape \(2, 3, 4\) and targets \(2, 2\); expected \(\.\.\., V\) and \(\.\.\.\)"),
    (lambda f: f(np.zeros((2, 4)), np.array([0, 4])),
     r"targets must be integers in 0 \.\. 3 \(V = 4\); got dtype int64, range 0 \.\. 4"),
    (lambda f: f(np.zeros((2, 4)), np.array([-1, 0])), r"targets .*range -1 \.\. 0"),
    (lambda f: f(np.zeros((2, 4)), np.array([0.0, 1.0])), r"targets .*got dtype float64"),
])
@pytest.mark.parametrize("func", [cross_entropy, token_losses])
def test_cross_entropy_and_token_losses_refuse_targets_that_do_not_fit(func, call, message):
    with pytest.raises(ValueError, match=rf"{func.__name__}: {message}"):
        call(func)


def test_cross_entropy_refuses_weights_of_another_shape():
    with pytest.raises(ValueError, match=r"cross_entropy: logits \(2, 4\), targets \(2,\), "
                                         r"weights \(3,\); expected \(\.\.\., V\), \(\.\.\.\), "
                                         r"\(\.\.\.\)"):
        cross_entropy(np.zeros((2, 4)), np.array([0, 1]), np.ones(3))


def test_the_fast_path_and_the_per_head_losses_use_the_shared_cross_entropy():
    model = GPT(GPTConfig(vocab_size=11, context_length=8, d_model=16, n_layers=2, h=2,
                          n_kv_heads=1, d_ff=24), rng=0)
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 11, size=(2, 8)), rng.integers(0, 11, size=(2, 8))
    logits = fast_logits(model, x)
    loss, grads = fast_loss_and_grads(model, x, y)
    assert loss == pytest.approx(cross_entropy(logits, y)[0], rel=1e-6)
    assert loss == pytest.approx(model.loss(x, y), rel=1e-5)
    np.testing.assert_allclose(per_position_losses(model, x, y), token_losses(logits, y),
                               rtol=1e-6)
    full, rise = ablation_losses(model, x, y)
    assert full == pytest.approx(cross_entropy(logits, y)[0], rel=1e-12)
    assert rise.shape == (2, 2)


# ------------------------------------------------------------------------------------ entropy
def test_attention_entropy_is_minus_sum_w_log_w_with_zero_log_zero_zero():
    w = np.array([[1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    np.testing.assert_allclose(attention_entropy(w), [0.0, np.log(4), np.log(2)], atol=1e-15)
    np.testing.assert_allclose(attention_entropy(w.T, axis=0), attention_entropy(w))
    sub = np.array([[0.3, 0.2]])  # a row with a sink: taken as it is
    assert attention_entropy(sub)[0] == pytest.approx(-(0.3 * np.log(0.3) + 0.2 * np.log(0.2)))
    with pytest.raises(ValueError, match=r"attention_entropy: weights holds a negative entry"):
        attention_entropy(np.array([0.5, -0.1, 0.6]))


def test_logit_stats_entropy_is_the_mean_attention_entropy_of_the_live_rows():
    rng = np.random.default_rng(4)
    scores = 2 * rng.normal(size=(2, 3, 5, 5))  # (B, h, T, S)
    mask = np.tril(np.ones((5, 5), dtype=bool))
    got = logit_stats(scores, mask)["entropy"]
    want = attention_entropy(softmax(scores, mask=mask)).mean(axis=(0, 2))  # (h,)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_variant_gpt_entropy_counts_the_sink_as_one_more_outcome():
    config = GPTConfig(vocab_size=11, d_model=16, n_layers=2, h=4, n_kv_heads=2)
    model = VariantGPT(config, BlockVariant(sinks=True), rng=0)
    tokens = np.random.default_rng(5).integers(0, 11, size=(2, 6))
    _, stats = model.forward(tokens, stats=True)
    for w, block in zip(model.attention_weights(tokens), stats, strict=True):  # (B, h, T, T)
        with_sink = np.concatenate([w, 1.0 - w.sum(axis=-1, keepdims=True)], axis=-1)
        np.testing.assert_allclose(block["entropy"],
                                   attention_entropy(with_sink).mean(axis=(0, 2)), rtol=1e-10)
        assert (block["sink_mass"] > 0).all()


# ------------------------------------------------------------------- figure_png and fmt_shape
@pytest.mark.parametrize("dpi", [90, 100])
def test_figure_png_renders_the_figure_at_its_size_times_the_dpi(dpi):
    from matplotlib.figure import Figure
    from PIL import Image

    fig = Figure(figsize=(2.0, 1.5))
    fig.add_subplot().plot([0, 1], [1, 0])
    png = figure_png(fig, dpi=dpi)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert Image.open(io.BytesIO(png)).size == (round(2.0 * dpi), round(1.5 * dpi))


def test_every_widget_renders_with_the_one_figure_png():
    for module in (explorer, stepper, tile_stepper, cache_memory):
        assert module.figure_png is figure_png, module.__name__
    assert not hasattr(head_viewer, "figure_png")


@pytest.mark.parametrize("shape, text", [((), "()"), ((3,), "(3,)"), ((5, 6), "(5, 6)"),
                                         (np.zeros((2, 1, 4)).shape, "(2, 1, 4)"),
                                         ([np.int64(7), 2], "(7, 2)")])
def test_fmt_shape_prints_a_shape_as_python_prints_a_tuple(shape, text):
    assert fmt_shape(shape) == text
    assert harness.fmt_shape is fmt_shape  # the checks' messages use the same one


# ----------------------------------------------------------------------- one definition each
@pytest.mark.parametrize("name", ["cross_entropy", "token_losses", "attention_entropy",
                                  "figure_png", "fmt_shape"])
def test_the_package_defines_each_shared_helper_once(name):
    root = Path(mha_course.__file__).parent
    where = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.match(rf"\s*def {name}\(", line)]
    assert len(where) == 1, where
