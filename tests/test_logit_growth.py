"""Lesson 13's recipes (models/logit_growth.py): train_variant is lesson 09's loop step for step,
the shipped curves and models are what the recipes produce (their first steps retrained), and
the shipped results have the shapes and bounds the lesson reads."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.models.gpt import GPT, GPTConfig
from mha_course.models.gpt_train import train_gpt
from mha_course.models.gpt_variants import BlockVariant, VariantGPT
from mha_course.models.logit_growth import (
    FIRST_STEPS,
    GROWTH_RECIPE,
    SINK_RECIPE,
    load_growth,
    load_sink_models,
    run,
    train_variant,
)
from mha_course.models.shakespeare import corpus

SMALL = GPTConfig(vocab_size=65, d_model=16, n_layers=1, h=2, n_kv_heads=2, context_length=16)


def test_train_variant_is_lesson_09s_loop_step_for_step():
    _, train_ids, _ = corpus()
    a, b = GPT(SMALL, rng=0), VariantGPT(SMALL, rng=0)
    h0 = train_gpt(a, train_ids, steps=8, batch_size=4, T=16, lr=3e-3, seed=1, progress=False,
                   fast=False)
    h1 = train_variant(b, train_ids, steps=8, batch_size=4, T=16, lr=3e-3, seed=1,
                       log_every=4, progress=False)
    np.testing.assert_allclose(h1.loss, h0.loss, rtol=1e-10)
    assert h1.log_steps.tolist() == [0, 4, 7]
    assert h1.max_logit.shape == (3, 1, 2) and h1.diverged_at is None


def test_a_diverging_run_is_recorded_not_raised():
    _, train_ids, _ = corpus()
    model = VariantGPT(SMALL, rng=0)
    params = model.parameters()
    params["W_U"][:] = np.inf  # the first loss is not finite
    model.load_parameters(params)
    hist = train_variant(model, train_ids, steps=3, batch_size=2, T=8, progress=False)
    assert hist.diverged_at == 0 and len(hist.loss) == 0


@pytest.mark.parametrize("name", list(GROWTH_RECIPE["runs"]))
def test_the_shipped_growth_curves_are_the_recipes(name):
    shipped = load_growth()["runs"][name]
    assert load_growth()["recipe"] == GROWTH_RECIPE
    _, hist = run(GROWTH_RECIPE, name, stop_after=FIRST_STEPS, progress=False)
    np.testing.assert_allclose(hist.loss, shipped["first_losses"], rtol=1e-5)
    n_logs = len(shipped["log_steps"])
    assert np.asarray(shipped["max_logit"]).shape == (n_logs, 2, 4)
    assert np.asarray(shipped["entropy"]).shape == (n_logs, 2, 4)
    assert (np.asarray(shipped["entropy"]) <= np.log(GROWTH_RECIPE["T"]) + 1e-6).all()


@pytest.mark.parametrize("name", list(SINK_RECIPE["runs"]))
def test_the_shipped_sink_models_are_the_recipes(name):
    models, meta = load_sink_models()
    assert meta["recipe"] == SINK_RECIPE
    assert models[name].variant == BlockVariant(**SINK_RECIPE["runs"][name])
    _, hist = run(SINK_RECIPE, name, stop_after=FIRST_STEPS, progress=False)
    np.testing.assert_allclose(hist.loss, meta["runs"][name]["first_losses"], rtol=1e-5)
    assert meta["runs"][name]["final_loss"] < 2.5  # trained, well below log(65) = 4.17
