"""The sliding-window mask: its definition, its bottom-right alignment, and the windowed forward
against PyTorch's ``F.scaled_dot_product_attention`` (explicit masks, ``enable_gqa=True``) and
against a decode with a rolling buffer.

``sliding_window_mask(T, window, S)``: query ``t`` sits at position ``p = S - T + t`` and may
attend to key ``s`` iff ``p - window < s <= p``.
"""

from __future__ import annotations

import functools

import conftest
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_course import causal_mask, scaled_dot_product_attention, sliding_window_mask

# Every dimension different: B=2, h=6, g in {6, 3, 2, 1}, d_k=4, d_v=5, d_model=14.
B, H, D_K, D_V, D_MODEL = 2, 6, 4, 5, 14
random_layer = functools.partial(
    conftest.random_layer, d_model=D_MODEL, h=H, d_k=D_K, d_v=D_V, bias=True
)


def mask_by_definition(T, window, S):
    """Entry by entry, from the definition: p - window < s <= p with p = S - T + t."""
    out = np.zeros((T, S), dtype=bool)
    for t in range(T):
        p = S - T + t
        for s in range(S):
            out[t, s] = p - window < s <= p
    return out


@given(T=st.integers(1, 9), extra=st.integers(0, 6), window=st.integers(1, 12))
def test_mask_follows_its_definition(T, extra, window):
    S = T + extra
    mask = sliding_window_mask(T, window, S)
    assert mask.dtype == bool and mask.shape == (T, S)
    np.testing.assert_array_equal(mask, mask_by_definition(T, window, S))
    # every query sees itself and min(window, p + 1) keys in all
    assert mask[np.arange(T), S - T + np.arange(T)].all()
    np.testing.assert_array_equal(mask.sum(-1), np.minimum(window, S - T + np.arange(T) + 1))


@given(T=st.integers(1, 9), extra=st.integers(0, 6), window=st.integers(1, 20))
def test_mask_is_the_causal_mask_minus_the_old_keys(T, extra, window):
    S = T + extra
    mask = sliding_window_mask(T, window, S)
    causal = causal_mask(T, S)
    assert not (mask & ~causal).any()  # never the future
    if window >= S:
        np.testing.assert_array_equal(mask, causal)


def test_bottom_right_alignment_for_a_chunk_over_a_longer_cache():
    # 3 new tokens at positions 4, 5, 6 over 7 keys, window 3
    np.testing.assert_array_equal(sliding_window_mask(3, 3, 7).astype(int), [
        [0, 0, 1, 1, 1, 0, 0],
        [0, 0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 1, 1, 1],
    ])
    # the last rows of the square mask: the chunk's rows of the full sequence
    np.testing.assert_array_equal(sliding_window_mask(3, 3, 7), sliding_window_mask(7, 3)[-3:])


@pytest.mark.parametrize("args, message", [
    ((4, 0), "sliding_window_mask: window=0 must be an integer >= 1"),
    ((4, -1), "sliding_window_mask: window=-1 must be an integer >= 1"),
    ((4, 2.5), "sliding_window_mask: window=2.5 must be an integer >= 1"),
    ((0, 2), "sliding_window_mask: T=0 must be an integer >= 1"),
    ((4, 2, 0), "sliding_window_mask: S=0 must be an integer >= 1"),
])
def test_bad_sizes_are_named_errors(args, message):
    with pytest.raises(ValueError, match="^" + message.replace(".", r"\.") + "$"):
        sliding_window_mask(*args)


# ----------------------------------------------------------------------- against PyTorch
@pytest.mark.torch
@pytest.mark.parametrize("g", [6, 3, 2, 1])
@pytest.mark.parametrize("window", [1, 3, 8])
def test_windowed_forward_matches_torch_sdpa_with_enable_gqa(torch, rng, g, window):
    T = 8
    layer = random_layer(rng, n_kv_heads=g)
    x = rng.normal(size=(B, T, D_MODEL))
    mask = sliding_window_mask(T, window)
    out, weights = layer(x, mask=mask)
    P = {name: torch.from_numpy(p) for name, p in layer.parameters().items()}
    xt = torch.from_numpy(x)

    def heads(W, b, n):  # (B, T, n*d) -> (B, n, T, d)
        return (xt @ W + b).unflatten(-1, (n, -1)).transpose(-3, -2)

    q, k, v = heads(P["W_q"], P["b_q"], H), heads(P["W_k"], P["b_k"], g), heads(
        P["W_v"], P["b_v"], g)
    # torch's bool attn_mask says True = may attend, like ours
    o = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.from_numpy(mask), enable_gqa=True)
    ref = o.transpose(-3, -2).flatten(-2) @ P["W_o"] + P["b_o"]
    assert float(np.max(np.abs(out - ref.numpy()))) <= 1e-12
    # the weights, from torch's own matmul and softmax over the same masked scores
    kk = k.repeat_interleave(H // g, dim=-3)  # query head i reads K/V head i // (h/g)
    scores = (q @ kk.transpose(-1, -2)) / np.sqrt(D_K)
    ref_w = torch.softmax(scores.masked_fill(~torch.from_numpy(mask), float("-inf")), dim=-1)
    assert float(np.max(np.abs(weights - ref_w.numpy()))) <= 1e-12


@pytest.mark.torch
def test_a_chunk_over_a_longer_cache_matches_torch_with_the_bottom_right_mask(torch, rng):
    # torch's is_causal=True aligns the triangle top-left; the explicit bottom-right mask is
    # what a chunk of new tokens over a cache needs, and what ours gives.
    T, S, window = 3, 7, 4
    q, k, v = rng.normal(size=(2, H, T, D_K)), rng.normal(size=(2, H, S, D_K)), rng.normal(
        size=(2, H, S, D_V))
    qt, kt, vt = (torch.from_numpy(a) for a in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for mask in (causal_mask(T, S), sliding_window_mask(T, window, S)):
        ours, _ = scaled_dot_product_attention(q, k, v, mask=mask)
        theirs = sdpa(qt, kt, vt, attn_mask=torch.from_numpy(mask))
        assert float(np.max(np.abs(ours - theirs.numpy()))) <= 1e-12
    top_left = sdpa(qt, kt, vt, is_causal=True).numpy()
    np.testing.assert_allclose(
        top_left, scaled_dot_product_attention(q, k, v, mask=np.tril(np.ones((T, S), bool)))[0],
        rtol=0, atol=1e-12)
    bottom_right, _ = scaled_dot_product_attention(q, k, v, causal_mask(T, S))
    assert np.abs(top_left - bottom_right).max() > 0.1  # the two alignments really differ
