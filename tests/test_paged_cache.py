"""The paged KV cache: ``PagedKVCache`` against a plain dict of arrays.

Whatever order sequences are added, appended to and freed in, each sequence's gathered keys and
values must be exactly what was appended to it, the pool must hold ``ceil(len / block_size)``
blocks per live sequence (distinct blocks, once ``fork`` shares them, with a copy before a
shared block is written), freed blocks must be reused, and a full pool or an unknown id must
be refused with a message that says what was needed, before anything changes. Attention over the
gathered keys must equal the ordinary ``KVCache`` decode of the same sequence.
"""

from __future__ import annotations

import functools

import conftest
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mha_course import PagedKVCache, scaled_dot_product_attention
from mha_course.heads import group_heads, kv_for_groups, merge_heads, split_heads, ungroup_heads

D_MODEL, H, D_K, D_V = 12, 4, 3, 5
random_layer = functools.partial(conftest.random_layer, d_model=D_MODEL, h=H, d_k=D_K, d_v=D_V)


def kv(rng, g, n, dtype=np.float64):
    return (rng.normal(size=(g, n, D_K)).astype(dtype), rng.normal(size=(g, n, D_V)).astype(dtype))


def ceil_div(a, b):
    return -(-a // b)


# ------------------------------------------------------------------ against a plain model
OPS = st.lists(
    st.tuples(st.sampled_from(["add", "append", "free", "fork"]), st.integers(0, 10**6),
              st.integers(1, 9)),
    min_size=1, max_size=30,
)


@given(ops=OPS, block_size=st.integers(1, 5), n_kv_heads=st.sampled_from([1, 2, 4]),
       seed=st.integers(0, 2**16))
def test_random_interleaved_operations_match_a_dict_of_arrays(ops, block_size, n_kv_heads, seed):
    # blocks in use == sum of ceil(len / block_size) while no sequence was forked; with forks,
    # the distinct blocks of all tables, each table holding ceil(len / block_size) of them
    rng = np.random.default_rng(seed)
    layer = random_layer(rng, n_kv_heads=n_kv_heads)
    g = layer.n_kv_heads
    cache = PagedKVCache(layer, n_blocks=40, block_size=block_size)
    model: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    forked = False
    for op, pick, n in ops:
        live = sorted(model)
        if op == "add" or not live:
            model[cache.add_sequence()] = (np.empty((g, 0, D_K)), np.empty((g, 0, D_V)))
        elif op == "append":
            seq = live[pick % len(live)]
            k, v = kv(rng, g, n)
            table, n_old = cache.block_table(seq), cache.len_of(seq)
            need = ceil_div(n_old + n, block_size) - len(table)
            need += n_old % block_size != 0 and cache.ref_count(table[-1]) > 1  # copy-on-write
            if need > cache.free_blocks:
                with pytest.raises(ValueError, match=r"PagedKVCache\.append: the pool is full"):
                    cache.append(seq, k, v)
            else:
                cache.append(seq, k, v)
                old_k, old_v = model[seq]
                model[seq] = (np.concatenate([old_k, k], 1), np.concatenate([old_v, v], 1))
        elif op == "fork":
            model[cache.fork(live[pick % len(live)])] = model[live[pick % len(live)]]
            forked = True
        else:
            seq = live[pick % len(live)]
            cache.free(seq)
            del model[seq]
        assert sorted(cache.sequences) == sorted(model)
        for seq, (want_k, want_v) in model.items():
            got_k, got_v = cache.gather(seq)
            assert got_k.shape == want_k.shape and got_v.shape == want_v.shape
            np.testing.assert_array_equal(got_k, want_k)
            np.testing.assert_array_equal(got_v, want_v)
            assert cache.len_of(seq) == want_k.shape[1]
        for seq, (k, _) in model.items():
            table = cache.block_table(seq)
            assert len(table) == len(set(table)) == ceil_div(k.shape[1], block_size)
        owned = [b for seq in model for b in cache.block_table(seq)]
        in_use = len(set(owned))
        if not forked:
            assert in_use == len(owned) == sum(ceil_div(k.shape[1], block_size)
                                               for k, _ in model.values())
        assert cache.blocks_in_use == in_use and cache.free_blocks == 40 - in_use
        for b in set(owned):
            assert cache.ref_count(b) == owned.count(b)


# ------------------------------------------------------------------------------ blocks
def test_an_append_spans_block_boundaries_and_sequences_interleave(rng):
    layer = random_layer(rng, n_kv_heads=2)
    cache = PagedKVCache(layer, n_blocks=10, block_size=4)
    a, b = cache.add_sequence(), cache.add_sequence()
    ka, va = kv(rng, 2, 3)
    cache.append(a, ka, va)  # block 0, 3 of 4 slots
    kb, vb = kv(rng, 2, 5)
    cache.append(b, kb, vb)  # blocks 1, 2
    ka2, va2 = kv(rng, 2, 6)
    cache.append(a, ka2, va2)  # fills block 0, then blocks 3, 4
    assert cache.block_table(a) == [0, 3, 4] and cache.block_table(b) == [1, 2]
    np.testing.assert_array_equal(cache.gather(a)[0], np.concatenate([ka, ka2], 1))
    np.testing.assert_array_equal(cache.gather(a)[1], np.concatenate([va, va2], 1))
    np.testing.assert_array_equal(cache.gather(b)[0], kb)
    assert cache.len_of(a) == 9 and cache.blocks_in_use == 5 and cache.free_blocks == 5


def test_a_block_is_taken_only_when_the_last_one_is_full(rng):
    cache = PagedKVCache(random_layer(rng), n_blocks=4, block_size=3)
    s = cache.add_sequence()
    assert cache.blocks_in_use == 0  # an empty sequence owns no block
    used = []
    for _ in range(7):
        cache.append(s, *kv(rng, H, 1))
        used.append(cache.blocks_in_use)
    assert used == [1, 1, 1, 2, 2, 2, 3]


def test_freed_blocks_are_reused(rng):
    cache = PagedKVCache(random_layer(rng), n_blocks=4, block_size=2)
    a, b = cache.add_sequence(), cache.add_sequence()
    cache.append(a, *kv(rng, H, 4))  # blocks 0, 1
    cache.append(b, *kv(rng, H, 4))  # blocks 2, 3: the pool is full
    assert cache.free_blocks == 0
    cache.free(a)
    assert cache.free_blocks == 2 and cache.sequences == [b]
    c = cache.add_sequence()
    kc, vc = kv(rng, H, 3)
    cache.append(c, kc, vc)
    assert sorted(cache.block_table(c)) == [0, 1]  # a's blocks
    np.testing.assert_array_equal(cache.gather(c)[0], kc)
    np.testing.assert_array_equal(cache.gather(c)[1], vc)


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gqa_shapes_and_dtype(rng, n_kv_heads, dtype):
    layer = random_layer(rng, n_kv_heads=n_kv_heads)
    g = layer.n_kv_heads
    cache = PagedKVCache(layer, n_blocks=6, block_size=4)
    s = cache.add_sequence()
    assert cache.gather(s)[0].shape == (g, 0, D_K)
    cache.append(s, *kv(rng, g, 7, dtype))
    k, v = cache.gather(s)
    assert k.shape == (g, 7, D_K) and v.shape == (g, 7, D_V)
    assert k.dtype == v.dtype == cache.dtype == dtype
    assert cache.block_bytes == np.dtype(dtype).itemsize * g * 4 * (D_K + D_V)  # K and V


def test_gather_returns_a_copy(rng):
    cache = PagedKVCache(random_layer(rng), n_blocks=2, block_size=4)
    s = cache.add_sequence()
    k, v = kv(rng, H, 3)
    cache.append(s, k, v)
    got, _ = cache.gather(s)
    got[...] = 0.0
    np.testing.assert_array_equal(cache.gather(s)[0], k)


# ------------------------------------------------------------- attention over the pages
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_attention_over_gathered_pages_equals_decode_step(rng, n_kv_heads):
    layer = random_layer(rng, n_kv_heads=n_kv_heads)
    g = layer.n_kv_heads
    lengths = [5, 9, 3]
    xs = [rng.normal(size=(n, D_MODEL)) for n in lengths]
    paged = PagedKVCache(layer, n_blocks=12, block_size=2)
    ids = [paged.add_sequence() for _ in lengths]
    outs = {i: [] for i in ids}
    for t in range(max(lengths)):  # interleaved: one token of each live sequence per round
        for seq, x in zip(ids, xs, strict=True):
            if t >= len(x):
                continue
            x_t = x[t : t + 1]  # (1, d_model)
            q = split_heads(x_t @ layer.W_q, H)  # (h, 1, d_k)
            paged.append(seq, split_heads(x_t @ layer.W_k, g), split_heads(x_t @ layer.W_v, g))
            k, v = paged.gather(seq)  # (g, n, d_k), (g, n, d_v)
            heads, _ = scaled_dot_product_attention(group_heads(q, g), kv_for_groups(k),
                                                    kv_for_groups(v))
            outs[seq].append(merge_heads(ungroup_heads(heads)) @ layer.W_o)
    for seq, x in zip(ids, xs, strict=True):
        cache = layer.init_cache()
        want = np.concatenate([layer.decode_step(x[t : t + 1], cache)[0] for t in range(len(x))])
        np.testing.assert_allclose(np.concatenate(outs[seq]), want, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(paged.gather(seq)[0], cache.keys)
        np.testing.assert_array_equal(paged.gather(seq)[1], cache.values)


# ------------------------------------------------------------------------------ errors
def test_a_full_pool_is_refused_with_what_was_needed_and_left_unchanged(rng):
    cache = PagedKVCache(random_layer(rng), n_blocks=3, block_size=4)
    a = cache.add_sequence()
    cache.append(a, *kv(rng, H, 6))  # 2 blocks
    b = cache.add_sequence()
    with pytest.raises(ValueError, match=r"PagedKVCache\.append: the pool is full: sequence 1 "
                       r"needs 2 more blocks of 4 positions for 5 new positions, but only 1 of "
                       r"3 blocks are free"):
        cache.append(b, *kv(rng, H, 5))
    assert cache.len_of(b) == 0 and cache.blocks_in_use == 2 and cache.block_table(b) == []
    cache.append(b, *kv(rng, H, 4))  # one block: fits
    assert cache.free_blocks == 0


@pytest.mark.parametrize("method", ["len_of", "gather", "free", "block_table"])
def test_an_unknown_or_freed_id_is_refused(rng, method):
    cache = PagedKVCache(random_layer(rng), n_blocks=2, block_size=4)
    s = cache.add_sequence()
    cache.free(s)
    with pytest.raises(ValueError, match=rf"PagedKVCache\.{method}: unknown seq_id=0; the live "
                       r"sequences are \[\]"):
        getattr(cache, method)(s)
    with pytest.raises(ValueError, match=r"PagedKVCache\.append: unknown seq_id=7"):
        cache.append(7, *kv(rng, H, 1))


def test_bad_shapes_and_arguments_are_refused(rng):
    layer = random_layer(rng, n_kv_heads=2)
    cache = PagedKVCache(layer, n_blocks=2, block_size=4)
    s = cache.add_sequence()
    k, v = kv(rng, 2, 3)
    with pytest.raises(ValueError, match=r"PagedKVCache\.append: k has shape \(4, 3, 3\); "
                       r"expected \(n_kv_heads, T_new, d_k\) with n_kv_heads=2 \(from the cache\)"):
        cache.append(s, np.zeros((4, 3, D_K)), v)
    with pytest.raises(ValueError, match=r"PagedKVCache\.append: v has shape \(2, 2, 5\); "
                       r"expected \(n_kv_heads, T_new, d_v\) with .*T_new=3 \(from k\)"):
        cache.append(s, k, v[:, :2])
    with pytest.raises(ValueError, match=r"PagedKVCache\.append: k has dtype int64"):
        cache.append(s, k.astype(np.int64), v)
    with pytest.raises(ValueError, match=r"at least one position \(T_new >= 1\)"):
        cache.append(s, k[:, :0], v[:, :0])
    assert cache.len_of(s) == 0
    with pytest.raises(ValueError, match=r"PagedKVCache: block_size=0 must be an integer >= 1"):
        PagedKVCache(layer, n_blocks=2, block_size=0)
    with pytest.raises(ValueError, match=r"PagedKVCache: n_blocks=2.5 must be an integer"):
        PagedKVCache(layer, n_blocks=2.5, block_size=4)
    with pytest.raises(ValueError, match=r"PagedKVCache: dtype=int32 must be a real floating"):
        PagedKVCache(layer, n_blocks=2, block_size=4, dtype=np.int32)
    with pytest.raises(ValueError, match=r"PagedKVCache: layer has type str"):
        PagedKVCache("layer", n_blocks=2, block_size=4)


# ------------------------------------------------------------------ sharing: fork, copy-on-write
def test_fork_shares_blocks_and_copies_a_shared_block_before_writing_it(rng):
    cache = PagedKVCache(random_layer(rng), n_blocks=8, block_size=4)
    a = cache.add_sequence()
    k, v = kv(rng, H, 6)
    cache.append(a, k, v)  # blocks 0 (full), 1 (2 of 4)
    b = cache.fork(a)
    assert cache.block_table(b) == [0, 1] and cache.blocks_in_use == 2
    assert cache.ref_count(0) == cache.ref_count(1) == 2
    np.testing.assert_array_equal(cache.gather(b)[0], k)
    kb, vb = kv(rng, H, 3)
    cache.append(b, kb, vb)  # block 1 is shared and partly filled: copied to block 2 first
    assert cache.block_table(b) == [0, 2, 3] and cache.block_table(a) == [0, 1]
    assert cache.ref_count(0) == 2 and cache.ref_count(1) == cache.ref_count(2) == 1
    np.testing.assert_array_equal(cache.gather(a)[0], k)  # the parent did not see b's tokens
    np.testing.assert_array_equal(cache.gather(a)[1], v)
    np.testing.assert_array_equal(cache.gather(b)[0], np.concatenate([k, kb], 1))
    np.testing.assert_array_equal(cache.gather(b)[1], np.concatenate([v, vb], 1))
    ka, va = kv(rng, H, 1)
    cache.append(a, ka, va)  # block 1 is a's alone now: written in place
    assert cache.block_table(a) == [0, 1]
    np.testing.assert_array_equal(cache.gather(b)[0], np.concatenate([k, kb], 1))
    cache.free(a)
    assert cache.ref_count(0) == 1 and cache.blocks_in_use == 3  # block 0 is still b's
    np.testing.assert_array_equal(cache.gather(b)[0], np.concatenate([k, kb], 1))
    cache.free(b)
    assert cache.blocks_in_use == 0 and cache.free_blocks == 8


def test_full_shared_blocks_are_never_copied(rng):
    cache = PagedKVCache(random_layer(rng), n_blocks=4, block_size=2)
    a = cache.add_sequence()
    cache.append(a, *kv(rng, H, 4))  # blocks 0, 1, both full
    b = cache.fork(a)
    cache.append(b, *kv(rng, H, 1))  # a new block for b; nothing copied
    assert cache.block_table(b) == [0, 1, 2] and cache.blocks_in_use == 3


def test_a_copy_on_write_that_does_not_fit_is_refused_and_changes_nothing(rng):
    cache = PagedKVCache(random_layer(rng), n_blocks=2, block_size=4)
    a = cache.add_sequence()
    cache.append(a, *kv(rng, H, 5))  # blocks 0, 1 (1 of 4): the pool is full
    b = cache.fork(a)
    with pytest.raises(ValueError, match=r"PagedKVCache\.append: the pool is full: sequence 1 "
                       r"needs 1 more block \(one to copy a shared block\) of 4 "
                       r"positions for 1 new position, but only 0 of 2 blocks are free"):
        cache.append(b, *kv(rng, H, 1))
    assert cache.block_table(b) == [0, 1] and cache.len_of(b) == 5 and cache.ref_count(1) == 2
    with pytest.raises(ValueError, match=r"PagedKVCache\.fork: unknown seq_id=9"):
        cache.fork(9)
