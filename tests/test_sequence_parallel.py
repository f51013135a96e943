"""Sequence parallelism: ring attention (three layouts) and Ulysses equal full attention,
causal included, with GQA; their bytes equal their formulas; the causal work of a plain ring is
unbalanced and the zig-zag and striped layouts balance it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from mha_course import causal_mask, logsumexp, scaled_dot_product_attention
from mha_course.parallel.collectives import Cluster, expected_bytes, meta
from mha_course.parallel.ring import (
    LAYOUTS,
    load_balance,
    merge_partials,
    ring_attention,
    sequence_layout,
)
from mha_course.parallel.ulysses import ulysses_attention

HEADS = [(h, g) for h in (1, 2, 4, 6, 8) for g in range(1, h + 1) if h % g == 0]


def full_attention(q, k, v, causal):
    h, g = q.shape[-3], k.shape[-3]
    k, v = np.repeat(k, h // g, axis=-3), np.repeat(v, h // g, axis=-3)
    mask = causal_mask(q.shape[-2]) if causal else None
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return scaled_dot_product_attention(q, k, v, mask=mask)[0], logsumexp(scores, mask=mask)


def qkv(rng, h, g, T, d_k=4, d_v=3):
    return (rng.normal(size=(2, h, T, d_k)) * 1.5, rng.normal(size=(2, g, T, d_k)),
            rng.normal(size=(2, g, T, d_v)))


@given(p=st.integers(1, 5), T=st.integers(1, 13), heads=st.sampled_from(HEADS),
       layout=st.sampled_from(LAYOUTS), causal=st.booleans(), seed=st.integers(0, 50))
def test_ring_attention_equals_full_attention(p, T, heads, layout, causal, seed):
    if p > T:
        p = T
    rng = np.random.default_rng(seed)
    h, g = heads
    q, k, v = qkv(rng, h, g, T)
    pos = sequence_layout(T, p, layout)
    cluster = Cluster(p)
    out, lse, work = ring_attention(cluster, [q[..., i, :] for i in pos],
                                    [k[..., i, :] for i in pos], [v[..., i, :] for i in pos],
                                    pos, causal=causal)
    want, want_lse = full_attention(q, k, v, causal)
    for i, o, l_ in zip(pos, out, lse, strict=True):
        np.testing.assert_allclose(o, want[..., i, :], atol=1e-12)
        np.testing.assert_allclose(l_, want_lse[..., i], atol=1e-12)
    # p - 1 ring passes: at step s device i forwards the K and V block of device i - s
    block = [k[..., i, :].nbytes + v[..., i, :].nbytes for i in pos]
    for i in range(p):
        assert cluster.sent[i] == sum(block[(i - s) % p] for s in range(p - 1))
    assert work.sum() == (T * (T + 1) // 2 if causal else T * T)


@given(p=st.integers(1, 6), T=st.integers(1, 40))
def test_every_layout_is_a_permutation_of_the_sequence(p, T):
    for layout in LAYOUTS:
        if p > T:
            with pytest.raises(ValueError, match="a device would hold nothing"):
                sequence_layout(T, p, layout)
            continue
        pos = sequence_layout(T, p, layout)
        assert sorted(np.concatenate(pos).tolist()) == list(range(T))
        assert all((np.diff(a) > 0).all() for a in pos)


def test_zigzag_gives_device_i_chunks_i_and_2p_minus_1_minus_i():
    pos = sequence_layout(16, 4, "zigzag")
    assert [a.tolist() for a in pos][0] == [0, 1, 14, 15]
    assert [a.tolist() for a in pos][3] == [6, 7, 8, 9]
    assert [a.tolist() for a in sequence_layout(9, 3, "striped")] == [[0, 3, 6], [1, 4, 7],
                                                                      [2, 5, 8]]


@pytest.mark.parametrize("p", [2, 4, 8])
def test_causal_plain_ring_is_unbalanced_and_zigzag_is_not(p):
    T = 64 * p
    eff = {}
    for layout in LAYOUTS:
        pos = sequence_layout(T, p, layout)
        kv = [meta((1, len(i), 4)) for i in pos]
        _, _, work = ring_attention(Cluster(p), [meta((1, len(i), 4)) for i in pos], kv, kv, pos,
                                    causal=True)
        eff[layout] = load_balance(work)["efficiency"]
        assert work.sum() == T * (T + 1) // 2
    assert eff["zigzag"] == 1.0
    assert eff["striped"] > 0.95
    # plain ring, blocks of c: step 0 costs a causal block c(c+1)/2, each later step a full c²
    # (the last device always sees a whole earlier block), against T(T+1)/2 / p of ideal work:
    # efficiency (pc + 1) / (c + 1 + 2(p - 1)c), about p / (2p - 1)
    c = T // p
    assert eff["contiguous"] == round((p * c + 1) / (c + 1 + 2 * (p - 1) * c), 4)


def test_merge_partials_is_lesson_07s_combine_in_out_lse_form():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(9, 4)), rng.normal(size=(9, 2))
    parts = []
    for idx in (slice(0, 4), slice(4, 9)):
        scores = q @ k[idx].T / 2.0
        parts += [scaled_dot_product_attention(q, k[idx], v[idx])[0], logsumexp(scores)]
    out, lse = merge_partials(*parts)
    np.testing.assert_allclose(out, scaled_dot_product_attention(q, k, v)[0], atol=1e-12)
    np.testing.assert_allclose(lse, logsumexp(q @ k.T / 2.0), atol=1e-12)


def test_merge_partials_with_empty_parts_never_gives_nan():
    out, lse = merge_partials(np.ones((2, 3)), np.array([0.5, -np.inf]), np.zeros((2, 3)),
                              np.array([-np.inf, -np.inf]))
    assert out.tolist() == [[1.0] * 3, [0.0] * 3]
    assert lse.tolist() == [0.5, -np.inf]
    big, _ = merge_partials(np.ones((1, 1)), np.array([900.0]), np.zeros((1, 1)),
                            np.array([-900.0]))
    assert big.tolist() == [[1.0]]  # exp(1800) would overflow a naive merge


@given(p=st.integers(1, 4), T=st.integers(4, 12), heads=st.sampled_from(HEADS),
       causal=st.booleans(), seed=st.integers(0, 50))
def test_ulysses_equals_full_attention(p, T, heads, causal, seed):
    h, g = heads
    assume(not (h % p or (g % p and p % g)))  # Ulysses' head rule (tested below)
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, h, g, T)
    cut = [np.array_split(a, p, axis=-2) for a in (q, k, v)]
    cluster = Cluster(p)
    out = ulysses_attention(cluster, *cut, causal=causal)
    np.testing.assert_allclose(np.concatenate(out, axis=-2), full_attention(q, k, v, causal)[0],
                               atol=1e-12)
    assert [n for n, _ in cluster.log] == ["all_to_all"] * 4
    if T % p == 0:  # each all-to-all sends (p - 1) / p of what a device holds
        g_sent = max(g, p)  # K/V heads repeated up to p when g < p
        n = 2 * (T // p) * 8  # batch 2, T / p tokens, float64
        held = [n * h * 4, n * g_sent * 4, n * g_sent * 3, n * h * 3]  # q, k, v, out
        assert cluster.sent.tolist() == [sum(expected_bytes("all_to_all", b, p)
                                             for b in held)] * p


def test_ulysses_needs_p_to_divide_the_heads():
    q = np.zeros((6, 8, 4))
    with pytest.raises(ValueError, match=r"p=4 devices cannot share h=6 heads"):
        ulysses_attention(Cluster(4), np.array_split(q, 4, axis=-2),
                          np.array_split(q, 4, axis=-2), np.array_split(q, 4, axis=-2))


def test_bytes_at_128k_tokens_for_a_llama_3_70b_like_layer():
    """Ring: (p-1) blocks of K and V; Ulysses: (p-1)/p of q, k, v and the output."""
    T, p, h, g, d = 131072, 8, 64, 8, 128
    pos = sequence_layout(T, p, "zigzag")
    ring, uly = Cluster(p), Cluster(p)
    kv = [meta((g, len(i), d), np.float16) for i in pos]
    ring_attention(ring, [meta((h, len(i), d), np.float16) for i in pos], kv, kv, pos, True)
    assert ring.sent.tolist() == [(p - 1) * 2 * (T // p) * g * d * 2] * p
    qs = [meta((h, T // p, d), np.float16)] * p
    ks = [meta((g, T // p, d), np.float16)] * p
    ulysses_attention(uly, qs, ks, ks, causal=True)
    assert uly.sent.tolist() == [(p - 1) * (T // p) * (2 * h + 2 * g) * d * 2 // p] * p
