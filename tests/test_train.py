"""Adam and the training loop of lesson 08 (``mha_course.models.train``), apart from the training
claims (those are in ``tests/test_tiny_model.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.models.tasks import VOCAB
from mha_course.models.tiny_model import TinyTransformer
from mha_course.models.train import Adam, adam_step, train


def test_adam_step_is_kingma_and_ba_algorithm_1_and_changes_no_input():
    rng = np.random.default_rng(0)
    param, grad = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
    m, v = rng.normal(size=(2, 3)) * 0.1, rng.random((2, 3)) * 0.1
    before = [a.copy() for a in (param, grad, m, v)]
    new, m1, v1 = adam_step(param, grad, m, v, t=4, lr=0.02, beta1=0.8, beta2=0.99, eps=1e-6)
    want_m = 0.8 * m + 0.2 * grad
    want_v = 0.99 * v + 0.01 * grad**2
    want = param - 0.02 * (want_m / (1 - 0.8**4)) / (np.sqrt(want_v / (1 - 0.99**4)) + 1e-6)
    np.testing.assert_allclose(m1, want_m)
    np.testing.assert_allclose(v1, want_v)
    np.testing.assert_allclose(new, want)
    for a, b in zip((param, grad, m, v), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_first_adam_step_moves_every_parameter_by_lr_whatever_its_gradient():
    grad = np.array([1e-4, -3.0, 250.0])
    new, _, _ = adam_step(np.zeros(3), grad, np.zeros(3), np.zeros(3), t=1, lr=0.1, eps=0.0)
    np.testing.assert_allclose(new, -0.1 * np.sign(grad))


def test_adam_updates_the_callers_arrays_in_place():
    w = np.ones(3)
    opt = Adam({"w": w}, lr=0.5)
    opt.step({"w": np.array([2.0, -2.0, 0.0])})
    np.testing.assert_allclose(w, [0.5, 1.5, 1.0])
    assert opt.t == 1


def test_adam_step_refuses_mismatched_shapes_and_a_zero_step_number():
    z = np.zeros(2)
    with pytest.raises(ValueError, match=r"adam_step: param, grad, m and v must have one shape"):
        adam_step(z, np.zeros(3), z, z, t=1)
    with pytest.raises(ValueError, match=r"adam_step: t=0 must be an integer >= 1"):
        adam_step(z, z, z, z, t=0)


def test_the_learning_rate_is_constant_then_cools_down_to_near_zero():
    model = TinyTransformer(len(VOCAB), 9, d_model=8, h=2, rng=0)
    seen = []
    original = Adam.step

    def spy(self, grads):
        seen.append(self.lr)
        original(self, grads)

    Adam.step = spy
    try:
        train(model, "copy", 10, batch_size=4, lr=0.1, cooldown=0.4, n_max=4, eval_every=10,
              eval_size=8, progress=False)
    finally:
        Adam.step = original
    np.testing.assert_allclose(seen, [0.1] * 6 + [0.1, 0.075, 0.05, 0.025])


def test_history_records_every_step_and_the_held_out_scores():
    model = TinyTransformer(len(VOCAB), 9, d_model=8, h=2, rng=0)
    history = train(model, "mixed", 12, batch_size=4, n_max=4, eval_every=5, eval_size=8,
                    progress=False)
    assert history.loss.shape == history.accuracy.shape == (12,)
    np.testing.assert_array_equal(history.eval_steps, [5, 10, 12])
    assert history.eval_accuracy.shape == (3,) and history.seconds > 0
    assert np.all((history.accuracy >= 0) & (history.accuracy <= 1))


def test_a_progress_bar_is_drawn_only_when_asked(capsys):
    model = TinyTransformer(len(VOCAB), 9, d_model=8, h=2, rng=0)
    train(model, "copy", 3, batch_size=4, n_max=4, eval_size=8, progress=False)
    assert capsys.readouterr().err == ""
    train(model, "copy", 3, batch_size=4, n_max=4, eval_size=8, progress=True)
    assert "training on copy" in capsys.readouterr().err  # tqdm's text bar outside Jupyter


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"steps": 0}, r"train: steps=0 must be an integer >= 1"),
     ({"lr": -1.0}, r"train: lr=-1.0 must be a positive number"),
     ({"lr": float("nan")}, r"train: lr=nan must be a positive number"),
     ({"cooldown": 1.5}, r"train: cooldown=1.5 must be a fraction of the steps, 0 to 1"),
     ({"task": "sort"}, r"make_batch: task='sort' is not one of")],
)
def test_bad_arguments_raise_named_errors(kwargs, message):
    model = TinyTransformer(len(VOCAB), 9, d_model=8, h=2, rng=0)
    args = {"task": "copy", "steps": 2, "n_max": 4, "progress": False} | kwargs
    with pytest.raises(ValueError, match=message):
        train(model, args.pop("task"), args.pop("steps"), **args)
