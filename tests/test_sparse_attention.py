"""Sparse attention (lesson 13): top-k masks (against torch.topk in
``tests/test_torch_parity.py``), the lightning indexer against
its sum written out, NSA's block selection keeping the forced blocks and staying causal, each
NSA branch against PyTorch SDPA on its mask, mass kept and FLOPs against counts by hand."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import causal_mask, sliding_window_mask, softmax
from mha_course.variants.sparse_attention import (
    compress_kv,
    lightning_index,
    mass_kept,
    nsa_attention,
    select_blocks,
    sparse_flops,
    topk_mask,
)


def test_topk_mask_never_keeps_a_masked_key(rng):
    s = rng.normal(size=(6, 6))
    keep = topk_mask(s, 3, causal_mask(6))
    assert not (keep & ~causal_mask(6)).any()
    np.testing.assert_array_equal(keep.sum(-1), np.minimum(np.arange(1, 7), 3))


def test_lightning_index_is_the_weighted_sum_of_relu_dots(rng):
    T, S, H, d = 4, 6, 3, 5
    q, k, w = rng.normal(size=(T, H, d)), rng.normal(size=(S, d)), rng.normal(size=(T, H))
    ref = np.array([[sum(w[t, j] * max(q[t, j] @ k[s], 0.0) for j in range(H))
                     for s in range(S)] for t in range(T)])
    np.testing.assert_allclose(lightning_index(q, k, w), ref, rtol=1e-12)


def test_compress_kv_averages_each_block(rng):
    k, v = rng.normal(size=(2, 12, 3)), rng.normal(size=(2, 12, 4))
    k_c, v_c, ends = compress_kv(k, v, 4)
    np.testing.assert_allclose(k_c[:, 1], k[:, 4:8].mean(1), rtol=1e-12)
    np.testing.assert_allclose(v_c[:, 2], v[:, 8:12].mean(1), rtol=1e-12)
    assert ends.tolist() == [3, 7, 11]


def test_select_blocks_keeps_first_and_own_block_and_the_best_others(rng):
    T, block, n_blocks = 16, 4, 4
    imp = rng.uniform(size=(T, n_blocks))
    keep = select_blocks(imp, 3, block, T)
    assert not (keep & ~causal_mask(T)).any()
    for t in range(T):
        own = t // block
        kept_blocks = {s // block for s in np.flatnonzero(keep[t])}
        assert 0 in kept_blocks and own in kept_blocks
        others = [b for b in range(own) if b != 0]
        best = sorted(others, key=lambda b: -imp[t, b])[: max(0, 3 - len({0, own}))]
        assert kept_blocks == {0, own} | set(best)


@pytest.mark.torch
def test_each_nsa_branch_is_sdpa_on_its_mask(torch, rng):
    T, d = 16, 4
    q, k, v = (rng.normal(size=(2, T, d)) for _ in range(3))
    gates = rng.uniform(size=(2, T, 3))
    out, parts = nsa_attention(q, k, v, block=4, n_select=2, window=5, gates=gates)
    F = torch.nn.functional
    tq, tk, tv = map(torch.tensor, (q, k, v))
    sel = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.tensor(parts["selected"]))
    win = F.scaled_dot_product_attention(tq, tk, tv,
                                         attn_mask=torch.tensor(sliding_window_mask(T, 5)))
    np.testing.assert_allclose(parts["sel"], sel.numpy(), rtol=1e-10)
    np.testing.assert_allclose(parts["win"], win.numpy(), rtol=1e-10)
    k_c, v_c, ends = compress_kv(k, v, 4)
    cm = ends[None, :] <= np.arange(T)[:, None]
    live = cm.any(-1)  # queries before the first whole block have no compressed keys
    cmp = F.scaled_dot_product_attention(tq, torch.tensor(k_c), torch.tensor(v_c),
                                         attn_mask=torch.tensor(cm)).numpy()
    np.testing.assert_allclose(parts["cmp"][:, live], cmp[:, live], rtol=1e-10)
    ref = gates[..., :1] * parts["cmp"] + gates[..., 1:2] * sel.numpy() + gates[..., 2:] * (
        win.numpy())
    np.testing.assert_allclose(out, ref, rtol=1e-10)


def test_a_shared_selection_is_the_same_for_every_head_of_a_group(rng):
    q, k, v = rng.normal(size=(4, 16, 4)), rng.normal(size=(1, 16, 4)), rng.normal(size=(1, 16, 4))
    _, parts = nsa_attention(q, k, v, block=4, n_select=2, window=4, shared_axis=0)
    assert all((parts["selected"][i] == parts["selected"][0]).all() for i in range(4))


def test_mass_kept_and_flops_are_the_counts_by_hand(rng):
    w = softmax(rng.normal(size=(5, 8)), mask=causal_mask(5, 8))
    keep = topk_mask(w, 2, causal_mask(5, 8))
    np.testing.assert_allclose(mass_kept(w, keep), np.sort(w, -1)[:, -2:].sum(-1), rtol=1e-12)
    np.testing.assert_allclose(mass_kept(w, causal_mask(5, 8)), 1.0, rtol=1e-12)
    f = sparse_flops(5, 8, 4, 6, 2, index_heads=3, d_index=2)
    pairs = sum(range(4, 9))  # query t sees 4 + t keys
    assert f["full"] == pairs * 20 and f["sparse"] == 5 * 2 * 20
    assert f["indexer"] == pairs * (2 * 3 * 2 + 2 * 3)
    assert f["ratio"] == pytest.approx((f["sparse"] + f["indexer"]) / f["full"])
