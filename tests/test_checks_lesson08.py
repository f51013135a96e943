"""Lesson 08's exercise checks name each classic mistake.

The generic contract (a right answer passes with one stable line, the stub's
``NotImplementedError`` passes through as "not attempted", ``None`` and an unexpected
exception fail) is bound to lesson 08's right answers, :data:`CORRECT_08`, by
:class:`TestContract` here (``tests/check_contract.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from check_contract import CheckContract

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, lesson08

# ------------------------------------------------------------------ correct implementations


def _jacobian(p):
    return p[..., :, None] * np.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :]


def _attention_grads(q, k, v, grad_out, softmax_step="full", scale=True, dv_transposed=True):
    d_k = q.shape[-1]
    weights = mha_course.softmax(q @ k.T / math.sqrt(d_k))
    dweights = grad_out @ v.T
    if softmax_step == "full":
        dscores = weights * (dweights - (dweights * weights).sum(axis=-1, keepdims=True))
    elif softmax_step == "diagonal":
        dscores = weights * dweights
    else:
        dscores = dweights
    dq = dscores @ k / (math.sqrt(d_k) if scale else 1.0)
    return dq, (weights.T @ grad_out if dv_transposed else weights @ grad_out)


def _numerical(f, x, eps=1e-6):
    x = x.copy()
    num = np.zeros_like(x)
    for i in range(x.size):
        old = x.flat[i]
        x.flat[i] = old + eps
        plus = f(x)[0]
        x.flat[i] = old - eps
        minus = f(x)[0]
        x.flat[i] = old
        num.flat[i] = (plus - minus) / (2 * eps)
    return num


def _find_bug(candidates, threshold=None):
    errors = {}
    for name, f, x in candidates:
        num, ana = _numerical(f, x), f(x.copy())[1]
        errors[name] = (np.abs(num - ana) / np.maximum(np.abs(num) + np.abs(ana), 1e-300)).max()
    if threshold is not None:  # the first one over a threshold, not the worst
        return next((n for n, e in errors.items() if e > threshold), next(iter(errors)))
    return max(errors, key=errors.get)


def _adam(param, grad, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, kind="right"):
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    if kind == "no_correction":
        m_hat, v_hat = m, v
    if kind == "eps_inside":
        return param - lr * m_hat / np.sqrt(v_hat + eps), m, v
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def _previous_token_score(weights):
    return np.diagonal(weights, offset=-1, axis1=1, axis2=2).mean(axis=-1)


def _sink_grads(q, k, v, b, grad_out, kind="right"):
    # written apart from mha_course.checks.lesson08.sink_attention_grads: a logit column for b
    d_k = q.shape[-1]
    logits = np.concatenate([q @ k.T / math.sqrt(d_k), np.full((len(q), 1), b)], axis=-1)
    p = mha_course.softmax(logits)  # (T, S + 1): the sink is the last entry of every row
    values = np.concatenate([v, np.zeros((1, v.shape[1]))])  # the sink's value is 0
    dp = grad_out @ values.T  # (T, S + 1)
    dz = p * (dp - np.sum(dp * p, axis=-1, keepdims=True))
    dq, db = dz[:, :-1] @ k / math.sqrt(d_k), float(dz[:, -1].sum())
    if kind == "db_sign":
        db = -db
    if kind == "db_per_query":
        db = dz[:, -1]
    return dq, db


CORRECT_08 = {
    "08.1": ("check_softmax_jacobian", _jacobian),
    "08.2": ("check_attention_grads", _attention_grads),
    "08.3": ("check_find_bug", _find_bug),
    "08.4": ("check_adam_step", _adam),
    "08.5": ("check_previous_token_score", _previous_token_score),
    "08.6": ("check_sink_grads", _sink_grads),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson08, CORRECT_08


def _check(name):
    return getattr(checks, name)


def _outer_jacobian(p):  # np.outer flattens a batch
    return np.diag(p) - np.outer(p, p) if p.ndim == 1 else np.eye(p.size) - np.outer(p, p)


def _adam_in_place(param, grad, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
    m *= beta1
    m += (1 - beta1) * grad
    v *= beta2
    v += (1 - beta2) * grad**2
    return param - lr * (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps), m, v


MISTAKES = [
    ("jacobian-diag-only", "check_softmax_jacobian",
     lambda p: p[..., :, None] * np.eye(p.shape[-1]), r"only diag\(p\)"),
    ("jacobian-no-diag", "check_softmax_jacobian",
     lambda p: -p[..., :, None] * p[..., None, :], r"diag\(p\) is missing"),
    ("jacobian-sign", "check_softmax_jacobian", lambda p: -_jacobian(p), r"sign is flipped"),
    ("jacobian-p(1-p)-only", "check_softmax_jacobian",
     lambda p: np.eye(p.shape[-1]) * (p * (1 - p))[..., :, None], r"only the diagonal p_i"),
    ("jacobian-np-outer", "check_softmax_jacobian", _outer_jacobian, r"np\.outer flattens"),
    ("jacobian-calls-the-package", "check_softmax_jacobian",
     mha_course.backward.softmax_jacobian, r"asks you to write the Jacobian yourself; your "
     r"answer calls mha_course\.backward\.softmax_jacobian"),
    ("jacobian-rows-do-not-sum-to-zero", "check_softmax_jacobian",
     lambda p: _jacobian(p) + 0.01 * np.eye(p.shape[-1]), r"sums to 0\.0100, not 0"),
    ("grads-no-scale", "check_attention_grads",
     lambda *a: _attention_grads(*a, scale=False), r"1/√d_k of the scores is missing"),
    ("grads-diagonal-jacobian", "check_attention_grads",
     lambda *a: _attention_grads(*a, softmax_step="diagonal"), r"only the diagonal of the "
     r"softmax's Jacobian"),
    ("grads-no-softmax", "check_attention_grads",
     lambda *a: _attention_grads(*a, softmax_step="none"), r"the softmax was skipped"),
    ("grads-dv-not-transposed", "check_attention_grads",
     lambda *a: _attention_grads(*a, dv_transposed=False), r"weightsᵀ @ grad_out|raised"),
    ("grads-swapped", "check_attention_grads",
     lambda *a: _attention_grads(*a)[::-1], r"you returned \(dv, dq\)"),
    ("grads-call-the-package", "check_attention_grads",
     lambda q, k, v, g: mha_course.backward.attention_backward(
         g, q, k, v, mha_course.scaled_dot_product_attention(q, k, v)[1])[::2],
     r"your answer calls mha_course\.backward\.attention_backward"),
    ("bug-threshold-too-loose", "check_find_bug", lambda c: _find_bug(c, threshold=0.1),
     r"you named 'dq', whose gradient is right .* the wrong one is 'dv'"),
    ("bug-not-a-name", "check_find_bug", lambda c: 3, r"returned 3; expected one of the names"),
    ("bug-calls-the-package", "check_find_bug",
     lambda c: max(c, key=lambda nfx: mha_course.gradient_check(nfx[1], nfx[2]))[0],
     r"asks you to write the gradient check yourself; your answer calls "
     r"mha_course\.gradient_check"),
    ("adam-no-correction", "check_adam_step", lambda *a: _adam(*a, kind="no_correction"),
     r"no bias correction"),
    ("adam-eps-inside", "check_adam_step", lambda *a: _adam(*a, kind="eps_inside"),
     r"ε belongs outside the square root"),
    ("adam-sgd", "check_adam_step",
     lambda p, g, m, v, t, lr, *rest: (p - lr * g, *_adam(p, g, m, v, t, lr, *rest)[1:]),
     r"plain gradient descent"),
    ("adam-swapped-betas", "check_adam_step",
     lambda p, g, m, v, t, lr, b1, b2, eps: _adam(p, g, m, v, t, lr, 1 - b1, 1 - b2, eps),
     r"β1 and β2 are swapped"),
    ("adam-in-place", "check_adam_step", _adam_in_place, r"changed its argument `m` in place"),
    ("adam-calls-the-package", "check_adam_step", mha_course.models.train.adam_step,
     r"your answer calls mha_course\.models\.train\.adam_step"),
    ("score-diagonal", "check_previous_token_score",
     lambda w: np.diagonal(w, axis1=1, axis2=2)[:, 1:].mean(-1), r"weight on the token itself"),
    ("score-over-T", "check_previous_token_score",
     lambda w: np.diagonal(w, offset=-1, axis1=1, axis2=2).sum(-1) / w.shape[-1],
     r"query 0 has no previous token"),
    ("score-sum", "check_previous_token_score",
     lambda w: np.diagonal(w, offset=-1, axis1=1, axis2=2).sum(-1), r"a sum, not a mean"),
    ("score-transposed", "check_previous_token_score",
     lambda w: np.diagonal(w, offset=1, axis1=1, axis2=2).mean(-1), r"\(key, query\)"),
    ("score-over-heads", "check_previous_token_score",
     lambda w: np.diagonal(w, offset=-1, axis1=1, axis2=2).mean(0), r"averaged over the heads"),
    ("sink-left-out", "check_sink_grads",
     lambda q, k, v, b, g: (_attention_grads(q, k, v, g)[0], 0.0), r"plain attention's gradient"),
    ("sink-weights-renormalised", "check_sink_grads",
     lambda q, k, v, b, g: (_attention_grads(q, k, v, g)[0], _sink_grads(q, k, v, b, g)[1]),
     r"whether e\^b was left out or the weights were rescaled"),
    ("sink-db-sign", "check_sink_grads", lambda *a: _sink_grads(*a, kind="db_sign"),
     r"your db .* the sign is flipped"),
    ("sink-db-per-query", "check_sink_grads", lambda *a: _sink_grads(*a, kind="db_per_query"),
     r"b is one number shared by every query"),
    ("sink-dq-transposed", "check_sink_grads",
     lambda q, k, v, b, g: (_sink_grads(q, k, v, b, g)[0].T, _sink_grads(q, k, v, b, g)[1]),
     r"your dq .* shape"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        _check(check)(wrong)
    assert str(info.value).startswith("Exercise 08.")
    assert capsys.readouterr().out == ""


def test_a_loose_threshold_misses_only_the_tiny_bug():
    # The 1% bug shows a relative error near 5e-3: far above a right gradient's 1e-9, far below
    # a "> 0.1 means wrong" rule of thumb. The first two cases are caught by such a rule.
    cases = lesson08._bug_cases(np.random.default_rng(803))
    assert [_find_bug(c, threshold=0.1) == want for want, _, c in cases] == [True, True, False]
    assert all(_find_bug(c) == want for want, _, c in cases)


@pytest.mark.parametrize("b", [0.5, -1.5, 3.0])
def test_the_sink_reference_matches_central_differences(b):
    # Exercise 08.6 has no package reference: the check's own must be right, and agree with
    # this file's, written another way.
    rng = np.random.default_rng(86)
    q, k, v, g = (rng.normal(size=s) for s in ((3, 4), (5, 4), (5, 6), (3, 6)))

    def loss(q_, b_):
        d_k = q_.shape[-1]
        e = np.exp(q_ @ k.T / math.sqrt(d_k))
        return float(np.sum(g * (e / (e.sum(-1, keepdims=True) + math.exp(b_)) @ v)))

    dq, db = lesson08.sink_attention_grads(q, k, v, b, g)
    eps = 1e-6
    num_q = np.zeros_like(q)
    for i in range(q.size):
        up, down = q.copy(), q.copy()
        up.flat[i] += eps
        down.flat[i] -= eps
        num_q.flat[i] = (loss(up, b) - loss(down, b)) / (2 * eps)
    np.testing.assert_allclose(dq, num_q, atol=1e-8)
    assert math.isclose(db, (loss(q, b + eps) - loss(q, b - eps)) / (2 * eps), abs_tol=1e-8)
    other_dq, other_db = _sink_grads(q, k, v, b, g)
    np.testing.assert_allclose(dq, other_dq, atol=1e-12)
    assert math.isclose(db, other_db, abs_tol=1e-12)
