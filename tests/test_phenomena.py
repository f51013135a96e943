"""Deep dive 13d's trained model (``mha_course.models.phenomena``): the shipped file records its
recipes and refuses another; the recipe reproduces its first training steps; the shipped
measurements come back from the shipped weights; each measurement equals the inline computation
the deep dive writes; and the measurement functions on hand-built attention patterns.

Retraining compares the first steps' losses, not the bits (another BLAS may differ in the last
digits; the warm-up does not depend on the total number of steps), as ``test_shakespeare.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mha_course.models import phenomena as P
from mha_course.models.tiny_model import token_losses


@pytest.fixture(scope="module")
def shipped():
    return P.load_phenomena()


def test_the_file_is_small_float32_and_records_both_recipes(shipped):
    assert P.PHENOMENA.stat().st_size <= 2 * 1024 * 1024
    meta = shipped["meta"]
    assert meta["bos"]["recipe"] == P.RECIPE and meta["control"]["recipe"] == P.CONTROL
    assert P.CONTROL == {**P.RECIPE, "bos_id": None}  # the control differs in BOS only
    for run in meta.values():
        assert run["steps"] == P.RECIPE["steps"] and run["seconds"] > 0
        assert run["command"] == P.COMMAND and len(run["first_losses"]) == P.FIRST_STEPS
    with np.load(P.PHENOMENA) as data:
        assert all(data[k].dtype == np.float32 for k in data.files if "/" in k)
    assert shipped["bos"].config.vocab_size == P.BOS_ID + 1


def test_a_file_made_with_another_recipe_is_refused(tmp_path):
    with np.load(P.PHENOMENA) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(str(arrays["meta"]))
    meta["bos"]["recipe"] = {**meta["bos"]["recipe"], "steps": 10}
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(tmp_path / "other.npz", **arrays)
    with pytest.raises(ValueError, match="load_phenomena: .* other recipes than RECIPE"):
        P.load_phenomena(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="does not exist: make it with python -m"):
        P.load_phenomena(tmp_path / "missing.npz")


@pytest.mark.parametrize("name", ["bos", "control"])
def test_the_recipe_reproduces_the_first_steps(shipped, name):
    meta = shipped["meta"][name]
    _, history = P.train_recipe(meta["recipe"], steps=P.FIRST_STEPS, progress=False)
    np.testing.assert_allclose(history.loss, meta["first_losses"], rtol=1e-3)


@pytest.mark.parametrize("name", ["bos", "control"])
def test_the_shipped_measurements_come_back_from_the_shipped_weights(shipped, name):
    stored = shipped["meta"][name]["measured"]
    again = P.measure(shipped[name], shipped["meta"][name]["recipe"]["bos_id"])
    assert again.keys() == stored.keys()
    for key, value in stored.items():
        if key.endswith("_head"):
            assert again[key] == value, key
        elif key == "copy":
            for part in ("first", "second"):
                assert again[key][part] == pytest.approx(value[part], abs=2e-3), key
        else:
            np.testing.assert_allclose(again[key], value, atol=2e-3, err_msg=key)


def test_the_measurements_equal_the_inline_forms_of_the_deep_dive(shipped):
    model = shipped["bos"]
    x, y = P.text_windows(P.BOS_ID)
    assert (x[:, 0] == P.BOS_ID).all() and (y[:, :-1] == x[:, 1:]).all()
    weights = model.attention_weights(x)
    inline = np.stack([w[:, :, P.T_MIN:, 0].mean(axis=(0, 2)) for w in weights])
    np.testing.assert_allclose(P.first_position_mass(weights), inline, rtol=1e-5, atol=1e-6)
    T = x.shape[1]
    assert P.uniform_mass(T) == pytest.approx(np.mean([1 / (t + 1) for t in range(P.T_MIN, T)]))
    sx, sy = P.repeated_span(bos_id=P.BOS_ID)
    L = P.SPAN
    first = np.arange(1, L)  # the queries that predict r[1:], first copy (BOS at 0)
    second = first + L
    losses = token_losses(model.forward(sx), sy)
    copies = P.span_copy_losses(model, sx, sy, offset=1)
    assert copies["first"] == pytest.approx(losses[:, first].mean(), rel=1e-4)
    assert copies["second"] == pytest.approx(losses[:, second].mean(), rel=1e-4)
    sw = model.attention_weights(sx)
    scores = P.span_scores(sw, offset=1)
    induction = np.stack([w[:, :, second, second - L + 1].mean(axis=(0, 2)) for w in sw])
    previous = np.stack([w[:, :, second, second - 1].mean(axis=(0, 2)) for w in sw])
    np.testing.assert_allclose(scores["induction"], induction, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scores["previous"], previous, rtol=1e-5, atol=1e-6)
    layer, head = shipped["meta"]["bos"]["measured"]["induction_head"]
    mask = np.ones((model.config.n_layers, model.config.h))
    mask[layer, head] = 0.0
    rise = (token_losses(model.forward(sx, head_mask=mask), sy)[:, second].mean()
            - losses[:, second].mean())
    assert P.ablation_rise(model, sx, sy, second)[layer, head] == pytest.approx(rise, abs=1e-4)


def test_the_sink_appears_on_bos_and_not_in_the_control(shipped):
    bos, control = (shipped["meta"][n]["measured"] for n in ("bos", "control"))
    assert np.max(bos["first_mass"]) > 5 * bos["uniform"]
    assert np.max(control["first_mass"]) < bos["uniform"]


# ----------------------------------------------------------------- on hand-built patterns
def test_first_position_mass_counts_the_queries_from_t_min():
    T = 6
    sink = np.zeros((2, 1, T, T))
    sink[..., 0] = 1.0  # every query on position 0
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    mass = P.first_position_mass([sink, np.broadcast_to(uniform, (2, 1, T, T))], t_min=2)
    np.testing.assert_allclose(mass, [[1.0], [P.uniform_mass(T, 2)]])
    with pytest.raises(ValueError, match=r"first_position_mass: weights \(2, 1, 6, 6\) with "
                                         r"t_min=6; expected"):
        P.first_position_mass([sink], t_min=6)


def test_a_perfect_induction_pattern_scores_one_and_the_spans_repeat():
    L = 5
    x, y = P.repeated_span(3, L, bos_id=9, vocab=6, rng=1)
    assert x.shape == y.shape == (3, 2 * L + 1) and (x[:, 0] == 9).all()
    np.testing.assert_array_equal(x[:, 1 : L + 1], x[:, L + 1 :])
    np.testing.assert_array_equal(y[:, :-1], x[:, 1:])
    T = x.shape[1]
    induction = np.zeros((3, 2, T, T))
    for t in range(T):
        induction[:, 0, t, max(t - L + 1, 0) if t >= L + 1 else t] = 1.0
        induction[:, 1, t, max(t - 1, 0)] = 1.0
    scores = P.span_scores([induction], L, offset=1)
    np.testing.assert_allclose(scores["induction"], [[1.0, 0.0]])
    np.testing.assert_allclose(scores["previous"], [[0.0, 1.0]])
