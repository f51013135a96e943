"""Lesson 10's draft model: the shipped file is what its recipe makes (the first training steps
retrained and compared), small, and better than a bigram model on the validation split."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from mha_course.models.draft import DRAFT, DRAFT_RECIPE, draft_info, load_draft_gpt
from mha_course.models.gpt_train import evaluate
from mha_course.models.shakespeare import (
    CHECKPOINT,
    FIRST_STEPS,
    RECIPE,
    checkpoint_info,
    corpus,
    train_recipe,
)


def test_the_shipped_draft_was_made_by_its_recipe_and_is_small():
    info = draft_info()
    assert info["recipe"] == DRAFT_RECIPE and info["steps"] == DRAFT_RECIPE["steps"]
    assert DRAFT.stat().st_size < 1_000_000
    draft = load_draft_gpt()
    target_params = checkpoint_info(CHECKPOINT)["n_params"]  # lesson 09's model, the target
    assert draft.n_params == info["n_params"] < 0.1 * target_params  # a small fraction of it
    assert draft.config.vocab_size == RECIPE["config"]["vocab_size"]


def test_its_first_training_steps_retrain_to_the_recorded_losses():
    _, history = train_recipe(DRAFT_RECIPE, steps=FIRST_STEPS, progress=False)
    np.testing.assert_allclose(history.loss, draft_info()["first_losses"], rtol=1e-5)


def test_its_validation_loss_is_the_recorded_one_and_beats_a_bigram_model():
    _, _, val = corpus()
    with threadpool_limits(limits=1, user_api="blas"):  # small matrices: faster on one thread
        loss = evaluate(load_draft_gpt(), val)
    assert loss == pytest.approx(draft_info()["val_loss"], abs=1e-3)
    assert loss < 2.48  # the bigram model of the same split


def test_a_missing_draft_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(ValueError, match="python -m mha_course.models.draft"):
        load_draft_gpt(path=tmp_path / "none.npz")
