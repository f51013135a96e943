"""The state-space view (deep dive 13c): causal linear attention with a decay as a masked
(1-semiseparable) matrix, as a recurrence and as a chunked scan, each equal to the others; the
FLOPs of each counted as its code runs and equal to ``ssd_flops``; the deep dive's numbers at
Mamba-2's sizes; the gated delta rule as a recurrence with matrices, equal to the package's gated
forms, still ``d_k``-semiseparable but not a scalar mask times ``QKᵀ``; named errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mha_course import causal_mask
from mha_course.variants.delta_rule import delta_rule, delta_rule_parallel
from mha_course.variants.ssd import (
    decay_mask,
    ssd_chunked,
    ssd_flops,
    ssd_quadratic,
    ssd_recurrent,
)


def inputs(rng, T, d_k=3, d_v=2, batch=()):
    q, k = rng.normal(size=batch + (T, d_k)), rng.normal(size=batch + (T, d_k))
    return q, k, rng.normal(size=batch + (T, d_v)), rng.uniform(0.5, 1.0, size=batch + (T,))


def block_ranks(A):
    return [int(np.linalg.matrix_rank(A[m:, :m], tol=1e-9 * np.abs(A).max()))
            for m in range(1, len(A))]


def by_hand(q, k, v, a):
    """o_t = Σ_{j≤t} (a_{j+1}⋯a_t)(q_t·k_j) v_j, with the products taken one by one."""
    return np.array([sum(np.prod(a[j + 1:t + 1]) * (q[t] @ k[j]) * v[j] for j in range(t + 1))
                     for t in range(len(q))])


# ------------------------------------------------------------------ the mask

def test_decay_mask_is_the_products_and_the_causal_mask_without_decay(rng):
    a = rng.uniform(0.5, 1.0, 9)
    want = np.array([[np.prod(a[j + 1:t + 1]) if j <= t else 0.0 for j in range(9)]
                     for t in range(9)])
    np.testing.assert_allclose(decay_mask(a), want, rtol=1e-12)
    assert (decay_mask(np.ones(7)) == causal_mask(7)).all()
    g = np.cumprod(a)
    np.testing.assert_allclose(decay_mask(a), np.tril(g[:, None] / g[None, :]), rtol=1e-12)


def test_the_mask_is_1_semiseparable_and_the_attention_matrix_d_k_semiseparable(rng):
    q, k, _, a = inputs(rng, 12, d_k=3)
    L = decay_mask(a)
    assert max(block_ranks(L)) == 1
    assert max(block_ranks(L * (q @ k.T))) == 3
    assert max(block_ranks(np.tril(rng.normal(size=(12, 12))))) == 6


def test_decay_mask_takes_batch_axes(rng):
    a = rng.uniform(0.5, 1.0, (2, 3, 5))
    got = decay_mask(a)
    assert got.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(got[1, 2], decay_mask(a[1, 2]), rtol=1e-12)


# ------------------------------------------------------------------ the three forms

@pytest.mark.parametrize("decay", [False, True])
def test_quadratic_and_recurrent_equal_the_sum_by_hand(decay, rng):
    q, k, v, a = inputs(rng, 10)
    a = a if decay else np.ones(10)
    want = by_hand(q, k, v, a)
    np.testing.assert_allclose(ssd_quadratic(q, k, v, a if decay else None), want, rtol=1e-10)
    out, S = ssd_recurrent(q, k, v, a if decay else None)
    np.testing.assert_allclose(out, want, rtol=1e-10)
    np.testing.assert_allclose(S, k.T @ (decay_mask(a)[-1][:, None] * v), rtol=1e-10)


@pytest.mark.parametrize("C", [1, 2, 3, 4, 5, 12, 13, 100])
def test_chunked_equals_the_recurrence_for_every_chunk_size(C, rng):
    q, k, v, a = inputs(rng, 12, d_k=4, d_v=3)
    S0 = rng.normal(size=(4, 3))
    want, S_want = ssd_recurrent(q, k, v, a, state=S0)
    got, S_got = ssd_chunked(q, k, v, a, C, state=S0)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(S_got, S_want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ssd_chunked(q, k, v, a, C)[0], ssd_quadratic(q, k, v, a),
                               rtol=1e-10, atol=1e-12)


def test_the_forms_take_batch_axes_and_broadcast_the_decay(rng):
    q, k, v, a = inputs(rng, 9, batch=(2, 3))
    quad = ssd_quadratic(q, k, v, a)
    np.testing.assert_allclose(ssd_recurrent(q, k, v, a)[0], quad, rtol=1e-10)
    np.testing.assert_allclose(ssd_chunked(q, k, v, a, 4)[0], quad, rtol=1e-10)
    np.testing.assert_allclose(quad[1, 2], ssd_quadratic(q[1, 2], k[1, 2], v[1, 2], a[1, 2]),
                               rtol=1e-12)
    per_head = rng.uniform(0.5, 1.0, (3, 1))  # one decay per head, the same at every token
    np.testing.assert_allclose(ssd_chunked(q, k, v, per_head, 2)[0],
                               ssd_quadratic(q, k, v, per_head), rtol=1e-10)


def test_a_carried_state_continues_the_sequence(rng):
    q, k, v, a = inputs(rng, 11)
    whole, S_whole = ssd_recurrent(q, k, v, a)
    first, S_mid = ssd_chunked(q[:7], k[:7], v[:7], a[:7], 3)
    rest, S_end = ssd_chunked(q[7:], k[7:], v[7:], a[7:], 3, state=S_mid)
    np.testing.assert_allclose(np.concatenate([first, rest]), whole, rtol=1e-10)
    np.testing.assert_allclose(S_end, S_whole, rtol=1e-10)


def test_reading_before_the_write_is_the_strictly_lower_mask(rng):
    """The off-by-one the deep dive shows: decay, read, then write."""
    q, k, v, a = inputs(rng, 8)
    S, out = np.zeros((3, 2)), []
    for t in range(8):
        S = a[t] * S
        out.append(S.T @ q[t])
        S = S + np.outer(k[t], v[t])
    np.testing.assert_allclose(np.array(out), (np.tril(decay_mask(a), -1) * (q @ k.T)) @ v,
                               rtol=1e-10)
    assert not np.allclose(np.array(out), ssd_recurrent(q, k, v, a)[0])


# ------------------------------------------------------------------ FLOPs

class Counter:
    """The forms of the deep dive, written with a FLOP counter (2 per multiply-add)."""

    def __init__(self):
        self.n = 0

    def mm(self, x, y):
        self.n += 2 * x.shape[0] * x.shape[1] * y.shape[1]
        return x @ y

    def ew(self, z):
        self.n += z.size
        return z

    def masked(self, q, k, v, a):
        return self.mm(self.ew(decay_mask(a) * self.mm(q, k.T)), v)

    def recurrent(self, q, k, v, a):
        S, out = np.zeros((k.shape[1], v.shape[1])), []
        for t in range(len(k)):
            S = self.ew(self.ew(a[t] * S) + self.ew(np.outer(k[t], v[t])))
            out.append(self.mm(q[t][None], S)[0])
        return np.array(out)

    def chunked(self, q, k, v, a, C):
        S, out = np.zeros((k.shape[1], v.shape[1])), []
        for s in range(0, len(k), C):
            qc, kc, vc, ac = q[s:s + C], k[s:s + C], v[s:s + C], a[s:s + C]
            g = np.cumprod(ac)
            out.append(self.ew(self.masked(qc, kc, vc, ac) + self.ew(g[:, None] * self.mm(qc, S))))
            kw = self.ew((g[-1] / g)[:, None] * kc)
            S = self.ew(self.ew(g[-1] * S) + self.mm(kw.T, vc))
        return np.concatenate(out)


@pytest.mark.parametrize(("T", "d_k", "d_v"), [(12, 3, 2), (20, 4, 6), (9, 5, 5), (1, 2, 3)])
@pytest.mark.parametrize("C", [1, 3, 4, 32])
def test_ssd_flops_equal_the_flops_counted_as_the_code_runs(T, d_k, d_v, C, rng):
    q, k, v, a = inputs(rng, T, d_k, d_v)
    counts = {}
    for name, run in (("quadratic", lambda c: c.masked(q, k, v, a)),
                      ("recurrent", lambda c: c.recurrent(q, k, v, a)),
                      ("chunked", lambda c: c.chunked(q, k, v, a, C))):
        c = Counter()
        np.testing.assert_allclose(run(c), ssd_quadratic(q, k, v, a), rtol=1e-9, atol=1e-12)
        counts[name] = c.n
    assert ssd_flops(T, d_k, d_v, C) == counts


@pytest.mark.parametrize(("T", "d_k", "d_v", "C"), [(1024, 128, 64, 256), (96, 8, 8, 8),
                                                     (4096, 64, 64, 64)])
def test_the_closed_forms_when_the_chunk_divides_T(T, d_k, d_v, C):
    f = ssd_flops(T, d_k, d_v, C)
    assert f["quadratic"] == 2 * T**2 * (d_k + d_v) + T**2
    assert f["recurrent"] == 5 * T * d_k * d_v
    assert f["chunked"] == (T * (2 * C * (d_k + d_v) + C + 4 * d_k * d_v + 2 * d_v + d_k)
                            + T // C * 2 * d_k * d_v)
    assert ssd_flops(T, d_k, d_v, 1)["chunked"] > f["recurrent"]  # C = 1 decays every token too
    assert ssd_flops(T, d_k, d_v, T)["chunked"] > f["quadratic"]  # C = T adds the state's work


def test_the_deep_dives_numbers_at_mamba2s_sizes():
    d_k, d_v, C = 128, 64, 256  # mamba_ssm/modules/mamba2.py: d_state, headdim, chunk_size
    T_rec = next(T for T in range(1, 4096) if ssd_flops(T, d_k, d_v, C)["quadratic"]
                 > ssd_flops(T, d_k, d_v, C)["recurrent"])
    assert T_rec == 107 == math.ceil(5 * d_k * d_v / (2 * (d_k + d_v) + 1))
    f = ssd_flops(65536, d_k, d_v, C)
    assert round(f["chunked"] / f["recurrent"], 2) == 3.21
    per_token = f["chunked"] / 65536
    assert next(T for T in range(1, 4096)
                if ssd_flops(T, d_k, d_v, C)["quadratic"] > T * per_token) == 342
    best = min(range(1, 257), key=lambda c: ssd_flops(16384, d_k, d_v, c)["chunked"])
    assert best == 7
    assert round(ssd_flops(16384, d_k, d_v, best)["chunked"]
                 / ssd_flops(16384, d_k, d_v, best)["recurrent"], 2) == 0.93
    for T in (256, 1024, 65536):
        g = ssd_flops(T, d_k, d_v, C)
        assert min(g, key=g.get) == "recurrent"
    g = ssd_flops(64, d_k, d_v, C)
    assert min(g, key=g.get) == "quadratic"


# ------------------------------------------------------------------ the gated delta rule

def gated_delta_by_matrices(q, k, v, beta, alpha):
    d_k = k.shape[1]
    A = [alpha[t] * (np.eye(d_k) - beta[t] * np.outer(k[t], k[t])) for t in range(len(k))]
    S, out = np.zeros((d_k, v.shape[1])), []
    for t in range(len(k)):
        S = A[t] @ S + beta[t] * np.outer(k[t], v[t])
        out.append(S.T @ q[t])
    M = np.zeros((len(k), len(k)))
    for t in range(len(k)):
        P = np.eye(d_k)
        for j in range(t, -1, -1):
            M[t, j] = q[t] @ P @ (beta[j] * k[j])
            P = P @ A[j]
    return np.array(out), M


def test_the_gated_delta_rule_is_a_recurrence_with_matrices_and_not_a_scalar_mask(rng):
    q, k, v, _ = inputs(rng, 12, d_k=3, d_v=2)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    beta, alpha = rng.uniform(0.3, 1.0, 12), rng.uniform(0.6, 1.0, 12)
    out, M = gated_delta_by_matrices(q, k, v, beta, alpha)
    np.testing.assert_allclose(delta_rule(q, k, v, beta, alpha)[0], out, rtol=1e-10)
    np.testing.assert_allclose(delta_rule_parallel(q, k, v, beta, alpha), out, rtol=1e-8)
    np.testing.assert_allclose(M @ v, out, rtol=1e-10)
    assert max(block_ranks(M)) == 3  # still d_k-semiseparable: it chunks
    implied = np.tril(M / (q @ (beta[:, None] * k).T))
    assert max(block_ranks(implied)) > 1  # but no 1-semiseparable mask L with M = L ∘ Q(βK)ᵀ


def test_with_a_scalar_transition_the_delta_recurrence_is_the_masked_form(rng):
    """A_t = a_t I (no k kᵀ term) gives back §1: M = L ∘ Q(βK)ᵀ."""
    q, k, v, a = inputs(rng, 10)
    beta = rng.uniform(0.3, 1.0, 10)
    S, out = np.zeros((3, 2)), []
    for t in range(10):
        S = a[t] * np.eye(3) @ S + beta[t] * np.outer(k[t], v[t])
        out.append(S.T @ q[t])
    np.testing.assert_allclose(np.array(out), ssd_quadratic(q, beta[:, None] * k, v, a),
                               rtol=1e-10)


# ------------------------------------------------------------------ errors

@pytest.mark.parametrize(("call", "match"), [
    (lambda q, k, v, a: ssd_quadratic(q, k[:, :2], v, a),
     r"^ssd_quadratic: q \(6, 3\), k \(6, 2\)"),
    (lambda q, k, v, a: ssd_recurrent(q, k, v[:4], a), r"^ssd_recurrent: .*v \(4, 2\); expected"),
    (lambda q, k, v, a: ssd_chunked(q, k, v, a[:4], 2), r"^ssd_chunked: a has shape \(4,\); "
                                                         r"expected \(\.\.\., T\) = \(6,\)"),
    (lambda q, k, v, a: ssd_chunked(q, k, v, a, 0), r"^ssd_chunked: chunk=0 must be an integer"),
    (lambda q, k, v, a: ssd_chunked(q, k, v, 1.5 * a, 2), r"^ssd_chunked: a must lie in \(0, 1\]"),
    (lambda q, k, v, a: ssd_recurrent(q, k, v, a, state=np.zeros((2, 3))),
     r"^ssd_recurrent: state has shape \(2, 3\); expected \(\.\.\., d_k, d_v\) = \(3, 2\)"),
    (lambda q, k, v, a: decay_mask(np.array(0.5)), r"^decay_mask: a has shape \(\); expected"),
    (lambda q, k, v, a: ssd_flops(10, 4, 4, 2.5), r"^ssd_flops: chunk=2.5 must be an integer"),
])
def test_errors_name_the_function_the_argument_and_the_shape(call, match, rng):
    q, k, v, a = inputs(rng, 6)
    with pytest.raises(ValueError, match=match):
        call(q, k, v, a)
