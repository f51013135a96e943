"""The head viewer's shipped models (``mha_course/models/trained_models.npz``): they match the
recipe in the code, they do what lesson 08 says trained models do, and training again with the
recipe gives models whose heads do the same.

Lesson 08 says that training is deterministic on one machine and that other machines (other BLAS
builds) may differ in the second decimal of a pattern score; the retraining test therefore
compares what the heads do (every pattern score within 0.1), not the bits, and prints how far the
weights are from the shipped ones (0 where the file was made: it stores float32).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mha_course.models.specialisation import pattern_scores
from mha_course.models.trained_models import (
    RECIPE,
    WEIGHTS,
    build_model,
    held_out,
    load_models,
    save_models,
    train_models,
)


@pytest.fixture(scope="module")
def shipped():
    return load_models()


def layer_scores(model, batch):
    return [pattern_scores(w, batch.tokens, batch.lengths)
            for w in model.attention_weights(batch.tokens)]


def test_the_shipped_file_is_small_and_records_the_recipe_and_accuracy():
    assert WEIGHTS.stat().st_size < 200 * 1024
    with np.load(WEIGHTS) as data:
        assert json.loads(str(data["recipe"])) == RECIPE
        for task in RECIPE:
            assert float(data[f"accuracy/{task}"]) >= 0.95
            assert data[f"{task}/W_E"].dtype == np.float32


def test_shipped_models_have_the_recipes_shapes(shipped):
    assert sorted(shipped) == sorted(RECIPE)
    for task, model in shipped.items():
        fresh = build_model(task)
        for name, param in model.parameters().items():
            assert param.shape == fresh.parameters()[name].shape
            assert param.dtype == np.float64
            assert not np.array_equal(param, fresh.parameters()[name]), f"{task} {name} untrained"


@pytest.mark.parametrize("task", list(RECIPE))
def test_shipped_models_solve_their_task_on_held_out_sequences(shipped, task):
    assert shipped[task].evaluate(held_out(task))["accuracy"] >= 0.95


def test_shipped_copy_model_has_a_previous_token_head_feeding_an_induction_head(shipped):
    layer0, layer1 = layer_scores(shipped["copy"], held_out("copy"))
    assert layer0["previous-token"].max() >= 0.8
    assert layer1["induction"].max() >= 0.9


def test_shipped_reverse_model_has_an_anti_diagonal_head_in_layer_1(shipped):
    _, layer1 = layer_scores(shipped["reverse"], held_out("reverse"))
    assert layer1["anti-diagonal"].max() >= 0.8
    assert layer1["induction"].max() < 0.2


def test_training_with_the_recipe_gives_heads_that_do_what_the_shipped_ones_do(shipped):
    retrained = train_models()
    for task, model in retrained.items():
        gap = max(float(np.abs(p.astype(np.float32) - shipped[task].parameters()[name]).max())
                  for name, p in model.parameters().items())
        print(f"{task}: largest weight difference from the shipped file {gap:.2g}")
        batch = held_out(task)
        for i, (mine, theirs) in enumerate(zip(layer_scores(model, batch),
                                               layer_scores(shipped[task], batch), strict=True)):
            for pattern, score in mine.items():
                np.testing.assert_allclose(score, theirs[pattern], atol=0.1,
                                           err_msg=f"{task} layer {i} {pattern}")


def test_save_then_load_keeps_every_parameter_to_float32(tmp_path):
    models = {task: build_model(task) for task in RECIPE}
    path = save_models(models, tmp_path / "models.npz")
    loaded = load_models(path)
    for task, model in models.items():
        for name, param in model.parameters().items():
            np.testing.assert_array_equal(loaded[task].parameters()[name],
                                          param.astype(np.float32).astype(np.float64))


def test_a_file_of_another_recipe_is_refused_with_the_command_that_rewrites_it(tmp_path):
    other = {task: {**s, "steps": s["steps"] + 1} for task, s in RECIPE.items()}
    path = save_models({task: build_model(task, other) for task in other},
                       tmp_path / "old.npz", recipe=other)
    with pytest.raises(ValueError, match=r"load_models: old\.npz was trained with the recipe "
                                         r".*'steps': 301.*"
                                         r"python -m mha_course\.models\.trained_models"):
        load_models(path)


def test_a_missing_file_names_the_command_that_writes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"load_models: .*none\.npz does not exist; "
                                                r"write it with `python -m mha_course"):
        load_models(tmp_path / "none.npz")


def test_a_file_without_a_parameter_is_refused(tmp_path):
    path = save_models({task: build_model(task) for task in RECIPE}, tmp_path / "full.npz")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files if k != "reverse/W_U"}
    np.savez(tmp_path / "partial.npz", **arrays)
    with pytest.raises(ValueError, match=r"load_models: partial\.npz holds nothing for "
                                         r"reverse/W_U; expected shape \(32, 19\)"):
        load_models(tmp_path / "partial.npz")


def test_saving_models_of_other_tasks_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"save_models: models for \['copy'\]; the recipe has "
                                         r"\['copy', 'reverse'\]"):
        save_models({"copy": build_model("copy")}, tmp_path / "x.npz")


def test_an_unknown_task_is_refused():
    with pytest.raises(ValueError, match=r"build_model: task='sort' is not one of "
                                         r"\['copy', 'reverse'\]"):
        build_model("sort")
