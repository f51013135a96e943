"""The sliding-window mask: its definition, its bottom-right alignment, and the windowed forward
against a decode with a rolling buffer (against PyTorch's ``F.scaled_dot_product_attention``,
explicit masks and ``enable_gqa=True``: ``tests/test_torch_parity.py``'s gold table).

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

from mha_course import causal_mask, sliding_window_mask

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
