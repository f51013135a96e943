"""What lesson 09's recipes ship: the Shakespeare GPT (small, <= 1.70 nats per character on the
validation split, its first training steps reproduced from the recipe), the h = 1 vs h = 4 table
(equal parameters and budget, three seeds each, its runs reproduced on a cheap setting), and the
induction probes (the repeated-window model predicts a passage's second copy better than its
first; the plain one does not).

Retraining compares the first steps' losses, not the bits: another BLAS may differ in the last
digits, and the warm-up's learning rate does not depend on the total number of steps, so the
first steps of a run are the first steps of the shipped run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mha_course.models import shakespeare as S
from mha_course.models.gpt_train import evaluate
from mha_course.models.text_heads import copy_losses, repeated_windows


@pytest.fixture(scope="module")
def shipped():
    return S.load_shakespeare_gpt()


def test_the_checkpoint_is_small_float32_and_records_its_recipe():
    assert S.CHECKPOINT.stat().st_size <= 5 * 1024 * 1024
    info = S.checkpoint_info()
    assert info["recipe"] == S.RECIPE and info["steps"] == S.RECIPE["steps"]
    assert info["command"] == S.COMMAND and info["seconds"] > 0
    assert len(info["loss_curve"]) == info["steps"] and len(info["first_losses"]) == S.FIRST_STEPS
    with np.load(S.CHECKPOINT) as data:
        assert all(data[k].dtype == np.float32 for k in data.files if k.startswith("param/"))


def test_the_checkpoint_reaches_1_70_nats_per_character_on_the_validation_split(shipped):
    model, tok = shipped
    _, _, val = S.corpus()
    loss = evaluate(model, val)  # every window of 256 that covers the split
    assert loss <= 1.70
    assert loss == pytest.approx(S.checkpoint_info()["val_loss"], abs=2e-3)
    assert tok.vocab_size == model.config.vocab_size == 65


def test_the_checkpoint_writes_speaker_lines_and_real_words(shipped):
    model, tok = shipped
    text = tok.decode(model.astype(np.float64).generate(tok.encode("ROMEO:\n"), 200, top_k=10,
                                                        rng=0))
    words = [w for w in text.replace("\n", " ").split(" ") if w.isalpha()]
    train_words = set(tok.decode(S.corpus()[1][:300_000]).split())
    assert "\n" in text[8:] and sum(w in train_words for w in words) / len(words) > 0.5


def test_the_recipe_reproduces_the_checkpoints_first_steps():
    _, history = S.train_recipe(S.RECIPE, steps=S.FIRST_STEPS, progress=False)
    np.testing.assert_allclose(history.loss, S.checkpoint_info()["first_losses"], rtol=1e-3)


def test_the_study_table_has_three_seeds_each_at_equal_parameters_and_budget():
    table = S.load_study()
    assert table["recipe"] == S.STUDY_RECIPE and table["command"].endswith(" study")
    rows = table["rows"]
    assert sorted((r["h"], r["seed"]) for r in rows) == sorted(
        (h, s) for h in S.STUDY_RECIPE["heads"] for s in S.STUDY_RECIPE["seeds"])
    assert len(S.STUDY_RECIPE["seeds"]) >= 3 and len({r["n_params"] for r in rows}) == 1
    assert all(r["d_k"] * r["h"] == S.STUDY_RECIPE["config"]["d_model"] for r in rows)
    assert all(1.0 < r["val_loss"] < 3.0 for r in rows)


@pytest.mark.parametrize(("h", "seed"), [(1, 0), (4, 2)])
def test_the_recipe_reproduces_the_study_runs_first_steps(h, seed):
    row = next(r for r in S.load_study()["rows"] if (r["h"], r["seed"]) == (h, seed))
    _, history = S.train_recipe(S.study_run(S.STUDY_RECIPE, h, seed), steps=S.FIRST_STEPS,
                                progress=False)
    np.testing.assert_allclose(history.loss, row["first_losses"], rtol=1e-3)


def test_the_study_runs_on_a_cheap_setting():
    cheap = {**S.STUDY_RECIPE, "config": {**S.STUDY_RECIPE["config"], "d_model": 16,
                                          "n_layers": 1}, "steps": 3, "seeds": [0], "T": 32}
    table = S.run_study(cheap, progress=False)
    assert json.loads(json.dumps(table))["recipe"] == cheap
    assert [(r["h"], r["seed"]) for r in table["rows"]] == [(1, 0), (4, 0)]
    assert table["rows"][0]["n_params"] == table["rows"][1]["n_params"]
    assert all(len(r["first_losses"]) == 3 for r in table["rows"])


def test_the_probes_show_what_repeated_windows_teach():
    probes = S.load_probes()
    for name in ("plain", "repeat"):
        assert probes["meta"][name]["recipe"]["repeat_fraction"] == (
            S.PROBE_RECIPE["repeat_fraction"] if name == "repeat" else 0.0)
    _, _, val = S.corpus()
    x, y = repeated_windows(val, S.PROBE_RECIPE["T"], n=64)
    plain, repeat = (copy_losses(probes[n], x, y) for n in ("plain", "repeat"))
    assert plain["second"] > plain["first"]  # no look-up: the second copy is no easier
    assert repeat["second"] < repeat["first"] - 0.05  # the repeated windows taught one
    assert repeat["second"] < plain["second"] - 0.05


@pytest.mark.parametrize("name", ["plain", "repeat"])
def test_the_recipe_reproduces_the_probes_first_steps(name):
    meta = S.load_probes()["meta"][name]
    _, history = S.train_recipe(meta["recipe"], steps=S.FIRST_STEPS, progress=False)
    np.testing.assert_allclose(history.loss, meta["first_losses"], rtol=1e-3)
