"""The delta rule (lesson 13): the recurrence against the update written out with plain
matrices, the parallel (triangular-solve) form against the recurrence with and without the
gate, exact storage of orthonormal keys, carried state, and named errors."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course.variants.delta_rule import delta_rule, delta_rule_parallel, l2_normalize


def by_hand(q, k, v, beta, alpha):
    S = np.zeros((k.shape[-1], v.shape[-1]))
    out = []
    for t in range(len(k)):
        kt = k[t] / np.linalg.norm(k[t])
        qt = q[t] / np.linalg.norm(q[t])
        S = alpha[t] * (np.eye(len(kt)) - beta[t] * np.outer(kt, kt)) @ S + beta[t] * np.outer(
            kt, v[t])
        out.append(S.T @ qt)
    return np.array(out), S


@pytest.mark.parametrize("gated", [False, True])
def test_recurrent_and_parallel_forms_equal_the_update_by_hand(gated, rng):
    T, d_k, d_v = 9, 4, 3
    q, k, v = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k)), rng.normal(size=(T, d_v))
    beta = rng.uniform(0.1, 1.0, size=T)
    alpha = rng.uniform(0.5, 1.0, size=T) if gated else np.ones(T)
    ref, S_ref = by_hand(q, k, v, beta, alpha)
    out, S = delta_rule(q, k, v, beta, alpha if gated else None)
    np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(S, S_ref, rtol=1e-10, atol=1e-12)
    par = delta_rule_parallel(q, k, v, beta, alpha if gated else None)
    np.testing.assert_allclose(par, ref, rtol=1e-8, atol=1e-10)


def test_batched_inputs_and_a_carried_state(rng):
    q, k, v = rng.normal(size=(2, 3, 8, 4)), rng.normal(size=(2, 3, 8, 4)), rng.normal(
        size=(2, 3, 8, 5))
    full, S = delta_rule(q, k, v, 0.7)
    first, S1 = delta_rule(q[..., :5, :], k[..., :5, :], v[..., :5, :], 0.7)
    rest, S2 = delta_rule(q[..., 5:, :], k[..., 5:, :], v[..., 5:, :], 0.7, state=S1)
    np.testing.assert_allclose(np.concatenate([first, rest], -2), full, rtol=1e-12)
    np.testing.assert_allclose(S2, S, rtol=1e-12)
    np.testing.assert_allclose(delta_rule_parallel(q, k, v, 0.7), full, rtol=1e-8, atol=1e-10)


def test_orthonormal_keys_are_stored_exactly_and_overwritten(rng):
    d = 6
    keys = np.linalg.qr(rng.normal(size=(d, d)))[0]
    vals = rng.normal(size=(d, 3))
    _, S = delta_rule(keys, keys, vals)
    np.testing.assert_allclose(keys @ S, vals, atol=1e-12)
    new = rng.normal(size=(1, 3))  # writing key 2 again replaces its value
    _, S2 = delta_rule(keys[2:3], keys[2:3], new, state=S)
    np.testing.assert_allclose(keys[2] @ S2, new[0], atol=1e-12)
    np.testing.assert_allclose(keys[0] @ S2, vals[0], atol=1e-12)


def test_bad_steps_are_named_errors(rng):
    x = rng.normal(size=(3, 2))
    with pytest.raises(ValueError, match="delta_rule: beta"):
        delta_rule(x, x, x, beta=1.5)
    with pytest.raises(ValueError, match="delta_rule_parallel: alpha"):
        delta_rule_parallel(x, x, x, alpha=0.0)
    np.testing.assert_allclose(np.linalg.norm(l2_normalize(x), axis=-1), 1.0)
