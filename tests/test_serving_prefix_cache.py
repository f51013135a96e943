"""Prefix caching over the paged cache: random shared prefixes leave every output unchanged,
hits are counted, a block's key stands for its whole prefix, and PagedKVCache's new sharing
and rollback calls keep the reference counts right."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course import MultiHeadAttention, PagedKVCache
from mha_course.serving.decoder import Decoder, generate_alone
from mha_course.serving.paged import PagedStore
from mha_course.serving.prefix_cache import PrefixCache, block_keys
from mha_course.serving.scheduler import CostModel, Request, serve

DEC = Decoder.random(vocab=11, d_model=16, n_layers=2, h=4, n_kv_heads=2, rng=7)
COST = CostModel(1e-3, 1e-4, 1e-5, 1e-8)


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 20), st.lists(st.tuples(st.integers(0, 2), st.integers(1, 8),
                                              st.integers(1, 5)), min_size=1, max_size=6),
       st.integers(2, 5), st.sampled_from(["continuous", "chunked"]), st.integers(0, 9999))
def test_random_shared_prefixes_leave_every_output_unchanged(n_shared, shapes, block, policy,
                                                             seed):
    rng = np.random.default_rng(seed)
    headers = [rng.integers(0, DEC.vocab, n_shared) for _ in range(3)]
    requests = [Request(i, np.concatenate([headers[j], rng.integers(0, DEC.vocab, n)]), m,
                        0.002 * i, 0.7, seed=i) for i, (j, n, m) in enumerate(shapes)]
    cache = PrefixCache(PagedStore(DEC, n_blocks=40, block_size=block))
    result = serve(DEC, requests, policy, cost=COST, max_batch=3, token_budget=6,
                   prefix_cache=cache)
    for r in requests:
        assert result.requests[r.rid].tokens == generate_alone(
            DEC, r.prompt, r.max_new_tokens, temperature=0.7, seed=r.seed)
    assert 0 <= cache.hit_rate <= 1


def test_a_repeated_header_hits_every_full_block_but_one_token_is_always_computed():
    header = np.arange(12) % DEC.vocab
    requests = [Request(i, np.concatenate([header, [i % DEC.vocab]]), 3, 0.01 * i)
                for i in range(4)]
    cache = PrefixCache(PagedStore(DEC, n_blocks=32, block_size=4))
    result = serve(DEC, requests, "continuous", cost=COST, prefix_cache=cache)
    assert [r.prefix_hit_tokens for r in result.requests.values()] == [0, 12, 12, 12]
    exact = Request(9, header, 2, 1.0)  # the whole prompt cached: its last block is recomputed
    again = serve(DEC, [exact], "continuous", cost=COST, prefix_cache=cache)
    assert again.requests[9].prefix_hit_tokens == 8


def test_block_keys_chain_the_prefix():
    a, b = block_keys([1, 2, 3, 4], 2), block_keys([5, 6, 3, 4], 2)
    assert a[1] != b[1] and len(block_keys([1, 2, 3], 2)) == 1
    assert block_keys([1, 2, 3, 4], 2) == a  # deterministic


def test_eviction_releases_only_blocks_that_nothing_else_holds():
    store = PagedStore(DEC, n_blocks=6, block_size=2)
    cache = PrefixCache(store)
    seq = store.new_sequence()
    DEC.step(np.arange(5), seq)
    cache.insert(np.arange(5), seq)  # 2 full blocks indexed
    assert len(cache) == 2 and not cache.evict_one()  # seq still holds them
    store.free(seq)
    assert cache.evict_one() and cache.evict_one() and not cache.evict_one()
    assert store.free_blocks == 6


def test_paged_cache_add_sequence_retain_release_and_truncate():
    layer = MultiHeadAttention(8, 2, rng=0)  # g = 2, d_k = 4
    pool = PagedKVCache(layer, n_blocks=6, block_size=2)
    a = pool.add_sequence()
    k = np.random.default_rng(0).normal(size=(2, 5, 4))
    pool.append(a, k, k)
    b = pool.add_sequence(blocks=pool.block_table(a)[:2])  # shares a's two full blocks
    assert pool.len_of(b) == 4 and [pool.ref_count(x) for x in pool.block_table(a)] == [2, 2, 1]
    pool.append(b, k[:, :1], k[:, :1])
    np.testing.assert_array_equal(pool.gather(b)[0][:, :4], k[:, :4])
    pool.truncate(a, 3)  # a keeps 3 positions: its third block is freed
    assert pool.block_table(a) == pool.block_table(b)[:2] and pool.free_blocks == 3
    pool.truncate(b, 3)  # into a shared block: the next append copies it first
    pool.append(b, k[:, 4:5], k[:, 4:5])
    np.testing.assert_array_equal(pool.gather(a)[0], k[:, :3])
    pool.retain(pool.block_table(a)[0])
    pool.free(a)
    pool.free(b)
    assert pool.free_blocks == 5
    with pytest.raises(ValueError, match="PagedKVCache.add_sequence: block 5 is not a live"):
        pool.add_sequence(blocks=[5])
    with pytest.raises(ValueError, match=r"PagedKVCache.truncate: length=4 must be between 0"):
        pool.truncate(pool.add_sequence(), 4)


def _serve_and_free(cache, prompt):
    """Lesson 10's server for one request: look up, prefill the rest, index, free."""
    blocks = cache.lookup(prompt)
    seq = cache.store.new_sequence(blocks)
    DEC.step(np.asarray(prompt)[len(blocks) * cache.store.block_size:], seq)
    cache.insert(prompt, seq)
    cache.store.free(seq)


def test_eviction_shortens_a_shared_prefix_from_its_end():
    # A system prompt of 3 blocks, then 4 questions of 2 blocks each: the questions' blocks go
    # first, then the prompt's from its last block; a new request always finds what is left.
    rng = np.random.default_rng(3)
    system = rng.integers(0, 11, 6)
    cache = PrefixCache(PagedStore(DEC, n_blocks=64, block_size=2))
    for _ in range(4):
        _serve_and_free(cache, np.concatenate([system, rng.integers(0, 11, 5)]))
    probe = np.concatenate([system, [1, 2]])
    found = []
    while cache.evict_one():
        found.append(len(cache.lookup(probe)))
    assert found == [3] * 8 + [2, 1, 0]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9)), min_size=1, max_size=10),
       st.integers(0, 9999))
def test_eviction_never_strands_a_block_behind_an_evicted_one(turns, seed):
    # Branching prompts over shared headers; after every eviction each indexed block's
    # predecessor in its chain is still indexed (a key stands for its whole prefix).
    rng = np.random.default_rng(seed)
    headers = [rng.integers(0, 11, n) for n in (4, 7, 9)]
    cache = PrefixCache(PagedStore(DEC, n_blocks=256, block_size=2))
    parent = {}
    for h, extra in turns:
        prompt = np.concatenate([headers[h], rng.integers(0, 11, extra + 1)])
        keys = block_keys(prompt, 2)
        parent.update(zip(keys[1:], keys[:-1], strict=False))
        _serve_and_free(cache, prompt)
    while cache.evict_one():
        assert all(parent[k] in cache.index for k in cache.index if k in parent)
    assert len(cache) == 0
