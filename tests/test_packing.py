"""Packed sequences: the varlen forward equals attending each document alone and equals the
block-diagonal causal mask; a plain causal mask leaks across documents; positions restart per
document; first-fit packing never overfills a row; the padding and packing counts add up.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_course import MultiHeadAttention, causal_mask, scaled_dot_product_attention
from mha_course.parallel.packing import (
    attention_work,
    chunk_lengths,
    cu_seqlens,
    document_ids,
    pack_first_fit,
    packed_positions,
    speeches,
    varlen_attention,
    varlen_mask,
)

lengths_st = st.lists(st.integers(1, 7), min_size=1, max_size=5)


@given(lengths=lengths_st, causal=st.booleans(), seed=st.integers(0, 50))
def test_varlen_attention_equals_each_document_alone_and_the_block_mask(lengths, causal, seed):
    rng = np.random.default_rng(seed)
    cu = cu_seqlens(lengths)
    total = int(cu[-1])
    q, k, v = (rng.normal(size=(3, total, d)) for d in (4, 4, 5))
    out = varlen_attention(q, k, v, cu, causal=causal)
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        alone = scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b],
                                             mask=causal_mask(b - a) if causal else None)[0]
        np.testing.assert_allclose(out[:, a:b], alone, atol=1e-12)
    masked = scaled_dot_product_attention(q, k, v, mask=varlen_mask(cu, causal=causal))[0]
    np.testing.assert_allclose(out, masked, atol=1e-12)


@given(lengths=st.lists(st.integers(1, 6), min_size=2, max_size=4), seed=st.integers(0, 50))
def test_a_plain_causal_mask_leaks_and_the_block_mask_does_not(lengths, seed):
    rng = np.random.default_rng(seed)
    cu = cu_seqlens(lengths)
    layer = MultiHeadAttention(8, 2, rope="half", rng=seed)
    x = rng.normal(size=(int(cu[-1]), 8))
    x2 = x.copy()
    x2[: cu[1]] += 1.0  # change document 0 only
    pos = packed_positions(cu)
    for mask, leaks in ((causal_mask(int(cu[-1])), True), (varlen_mask(cu), False)):
        later = slice(int(cu[1]), None)
        moved = np.abs(layer(x, mask=mask)[0][later] - layer(x2, mask=mask)[0][later]).max()
        assert (moved > 1e-9) == leaks
    # with the block mask, each document equals itself alone at positions 0..n-1 (RoPE)
    out = layer(x, mask=varlen_mask(cu))[0]
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        np.testing.assert_allclose(out[a:b], layer(x[a:b], mask=causal_mask(b - a))[0],
                                   atol=1e-12)
    assert pos.tolist() == [i for n in lengths for i in range(n)]


def test_cu_seqlens_document_ids_and_positions():
    cu = cu_seqlens([3, 1, 4])
    assert cu.tolist() == [0, 3, 4, 8]
    assert document_ids(cu).tolist() == [0, 0, 0, 1, 2, 2, 2, 2]
    assert packed_positions(cu).tolist() == [0, 1, 2, 0, 0, 1, 2, 3]
    assert varlen_mask(cu, causal=False).sum() == 9 + 1 + 16
    assert varlen_mask(cu).sum() == 6 + 1 + 10


@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60), L=st.integers(8, 40))
def test_first_fit_never_overfills_and_places_every_document_once(lengths, L):
    pieces = chunk_lengths(lengths, L)
    assert pieces.sum() == sum(lengths) and pieces.max() <= L
    rows = pack_first_fit(pieces, L)
    assert sorted(i for r in rows for i in r) == list(range(len(pieces)))
    assert all(pieces[r].sum() <= L for r in rows)
    # first fit decreasing: no two rows could be merged
    fill = sorted(int(pieces[r].sum()) for r in rows)
    assert len(fill) < 2 or fill[0] + fill[1] > L


def test_attention_work_counts():
    n, L = [3, 1, 4, 2], 4
    pad = attention_work(n, L, "pad")
    assert pad == {"rows": 4, "tokens": 16, "pairs": 4 * 10}
    useful = attention_work(n, L, "useful")
    assert useful["tokens"] == 10 and useful["pairs"] == 6 + 1 + 10 + 3
    causal = attention_work(n, L, "pack_causal")
    assert causal["rows"] == len(pack_first_fit(n, L)) == 3  # [4], [3, 1], [2]
    assert causal["pairs"] == 3 * 10
    assert attention_work(n, L, "pack_varlen") == {"rows": 3, "tokens": 10, "pairs": 20}


def test_speeches_split_on_blank_lines():
    text = "First Citizen:\nBefore we proceed.\n\nAll:\nSpeak, speak.\n\n\nB:\nx\ny\n"
    assert speeches(text) == ["First Citizen:\nBefore we proceed.", "All:\nSpeak, speak.",
                              "B:\nx\ny"]


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match=r"cu_seqlens: lengths=\[3, 0\]"):
        cu_seqlens([3, 0])
    with pytest.raises(ValueError, match=r"varlen_mask: cu_seqlens=\[1, 3\]"):
        varlen_mask([1, 3])
    q = np.zeros((5, 2))
    with pytest.raises(ValueError, match=r"varlen_attention: q has 5 packed tokens and k 5; "
                                         r"cu_seqlens=\[0, 2, 4\] describes 4"):
        varlen_attention(q, q, q, [0, 2, 4])
    with pytest.raises(ValueError, match=r"pack_first_fit: a document of 9 tokens does not fit"):
        pack_first_fit([9], 8)
    with pytest.raises(ValueError, match=r"attention_work: how='trim'"):
        attention_work([1], 4, "trim")
