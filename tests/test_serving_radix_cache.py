"""The radix-tree prefix cache (deep dive 10d §3): matches equal a brute-force longest common
prefix, the tree holds exactly the distinct prefixes, eviction takes unlocked leaves only, least
recently used first, the inline tree of the notebook gives the same hit counts, and against
lesson 10's block-hash PrefixCache it reuses the same prefixes un-rounded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_course.serving.decoder import Decoder
from mha_course.serving.paged import PagedStore
from mha_course.serving.prefix_cache import PrefixCache, block_keys
from mha_course.serving.radix_cache import RadixCache


def lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ----------------------------------------------------------- the notebook's inline tree (§3)
class Node:
    def __init__(self, tokens, parent):
        self.tokens, self.parent = tokens, parent
        self.children = {}
        self.ref, self.last_used = 0, 0


class MyRadix:
    """Deep dive 10d §3's inline radix tree, cell for cell."""

    def __init__(self, capacity):
        self.root, self.capacity, self.clock = Node((), None), capacity, 0
        self.root.ref = 1

    def walk(self, tokens, split):
        node, path, n = self.root, [], 0
        while n < len(tokens) and tokens[n] in node.children:
            child = node.children[tokens[n]]
            k = 0
            while k < len(child.tokens) and n + k < len(tokens) \
                    and child.tokens[k] == tokens[n + k]:
                k += 1
            if k < len(child.tokens):
                if not split:
                    return path + [child], n + k
                head = Node(child.tokens[:k], node)
                head.ref, head.last_used = child.ref, child.last_used
                node.children[tokens[n]] = head
                child.tokens, child.parent = child.tokens[k:], head
                head.children[child.tokens[0]] = child
                child = head
            path.append(child)
            n, node = n + k, child
        return path, n

    def touch(self, path):
        self.clock += 1
        for nd in path:
            nd.last_used = self.clock

    def match(self, tokens):
        path, n = self.walk(tuple(tokens), split=False)
        self.touch(path)
        return n

    def hold(self, tokens, delta):
        path, n = self.walk(tuple(tokens), split=True)
        for nd in path:
            nd.ref += delta
        return n

    def nodes(self):
        stack, out = list(self.root.children.values()), []
        while stack:
            out.append(stack.pop())
            stack.extend(out[-1].children.values())
        return out

    def held(self):
        return sum(len(nd.tokens) for nd in self.nodes())

    def insert(self, tokens):
        tokens = tuple(int(t) for t in tokens)
        path, n = self.walk(tokens, split=True)
        if n < len(tokens):
            parent = path[-1] if path else self.root
            path.append(Node(tokens[n:], parent))
            parent.children[tokens[n]] = path[-1]
        self.touch(path)
        for nd in path:
            nd.ref += 1
        while self.capacity is not None and self.held() > self.capacity:
            leaves = [nd for nd in self.nodes() if not nd.children and nd.ref == 0]
            if not leaves:
                break
            lru = min(leaves, key=lambda nd: nd.last_used)
            del lru.parent.children[lru.tokens[0]]
        for nd in path:
            nd.ref -= 1
        return n


def _workload(seed, n=40, vocab=50):
    rng = np.random.default_rng(seed)
    headers = [rng.integers(0, vocab, m) for m in (30, 45, 60, 80)]
    return [np.concatenate([headers[rng.integers(4)], rng.integers(0, vocab, rng.integers(1, 40))])
            for _ in range(n)]


@pytest.mark.parametrize("seed, capacity", [(10, 300), (11, 120), (12, None)])
def test_the_inline_tree_and_the_package_agree_request_by_request(seed, capacity):
    workload = _workload(seed)
    mine, pkg = MyRadix(capacity), RadixCache(capacity)
    hits_mine, hits_pkg = [], []
    for i, p in enumerate(workload):
        hits_mine.append(mine.match(p[:-1]))
        hits_pkg.append(pkg.match(p[:-1]))
        assert mine.insert(p) == pkg.insert(p)
        mine.hold(p, +1)
        pkg.lock(p)
        if i >= 2:
            mine.hold(workload[i - 2], -1)
            pkg.unlock(workload[i - 2])
        assert mine.held() == pkg.tokens_held
    assert hits_mine == hits_pkg
    assert sum(hits_pkg) == pkg.hit_tokens and pkg.queried_tokens == sum(len(p) - 1
                                                                        for p in workload)
    if capacity is not None:
        assert pkg.evicted_tokens > 0
        for p in workload[-2:]:  # the last two finish: now everything may go
            pkg.unlock(p)
        if pkg.tokens_held > capacity:  # it was over only while its leaves were locked
            pkg.evict(pkg.tokens_held - capacity)
        assert pkg.tokens_held <= capacity
    else:
        assert pkg.evicted_tokens == 0


# ------------------------------------------------------------ properties against brute force
seqs = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=12), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(seqs, st.lists(st.integers(0, 3), max_size=12))
def test_match_is_the_longest_common_prefix_with_any_inserted_sequence(inserted, query):
    cache = RadixCache()
    for i, s in enumerate(inserted):
        assert cache.insert(s) == max([lcp(s, t) for t in inserted[:i]], default=0)
    assert cache.match(query) == max(lcp(query, s) for s in inserted)
    prefixes = {tuple(s[:i]) for s in inserted for i in range(1, len(s) + 1)}
    assert cache.tokens_held == len(prefixes)  # one slot per distinct prefix (a trie's nodes)
    leaves = sorted({tuple(s) for s in inserted if s
                     and not any(len(t) > len(s) and t[:len(s)] == s for t in inserted)})
    assert cache.sequences() == leaves
    for node in cache._nodes():  # no empty edge; children start with different tokens
        assert len(node.tokens) >= 1
        assert len({child.tokens[0] for child in node.children.values()}) == len(node.children)


@settings(max_examples=40, deadline=None)
@given(seqs, st.integers(1, 20), st.integers(0, 11))
def test_eviction_takes_unlocked_leaves_only_and_keeps_matches_consistent(inserted, n, locked):
    cache = RadixCache()
    for s in inserted:
        cache.insert(s)
    keep = inserted[locked % len(inserted)]
    cache.lock(keep)
    before = cache.tokens_held
    freed = cache.evict(n)
    assert cache.tokens_held == before - freed
    assert cache.match(keep) == len(keep)  # locked: still whole
    remaining = cache.sequences()
    for s in inserted:  # what is left answers like a brute force over what is left
        assert cache.match(s) == max([lcp(s, t) for t in remaining], default=0)
    cache.unlock(keep)
    cache.evict(10_000)
    assert cache.tokens_held == 0 and cache.n_nodes == 0


def test_the_least_recently_used_leaf_goes_first_and_whole():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6, 7])
    cache.insert([9, 9])
    cache.match([1, 2, 3, 4])  # used last: leaves by age [5 6 7], [9 9], [3 4]
    assert cache.evict(1) == 3 and cache.sequences() == [(1, 2, 3, 4), (9, 9)]
    assert cache.evict(1) == 2 and cache.sequences() == [(1, 2, 3, 4)]
    # an inner node goes only once it is a leaf: [3 4], then [1 2]
    assert cache.n_nodes == 2 and cache.evict(3) == 4 and cache.sequences() == []


def test_a_locked_path_survives_and_a_split_inherits_its_lock():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4])
    assert cache.lock([1, 2, 3, 4]) == 4
    cache.insert([1, 2, 7])  # splits the locked node after [1 2]
    assert cache.evict(100) == 1  # only the unlocked leaf [7]
    assert cache.sequences() == [(1, 2, 3, 4)]
    assert cache.unlock([1, 2, 3, 4]) == 4
    assert cache.evict(100) == 4


def test_capacity_evicts_on_insert_but_never_the_new_path():
    cache = RadixCache(capacity=6)
    cache.insert([1, 2, 3])
    cache.insert([4, 5, 6])
    cache.insert([7, 8, 9, 10])  # over by 4: the oldest leaf [1 2 3] goes, then [4 5 6]
    assert cache.sequences() == [(7, 8, 9, 10)] and cache.evicted_tokens == 6
    cache.insert(list(range(20, 30)))  # longer than the capacity: kept, it is the new path
    assert cache.sequences() == [tuple(range(20, 30))]


# ---------------------------------------------------------- against lesson 10's block hashes
def _serve_both(prompts, cache_class=PrefixCache, block=16, vocab=1000):
    dec = Decoder.random(vocab=vocab, d_model=8, n_layers=1, h=2, rng=0)
    blocks = cache_class(PagedStore(dec, n_blocks=1024, block_size=block))
    radix = RadixCache()
    reused_b, reused_r = [], []
    for p in prompts:
        hit = blocks.lookup(p)
        seq = blocks.store.new_sequence(hit)
        dec.step(p[len(hit) * block:], seq)
        blocks.insert(p, seq)
        blocks.store.free(seq)
        reused_b.append(len(hit) * block)
        reused_r.append(radix.match(p[:-1]))
        radix.insert(p)
    return blocks, radix, reused_b, reused_r


def _shared_and_chats(seed=36, vocab=1000):
    """Deep dive 10d §3's two workloads, drawn in the notebook's order."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, 200)
    shared = [np.concatenate([system, rng.integers(0, vocab, rng.integers(10, 41))])
              for _ in range(16)]
    chats, chat_system = [], rng.integers(0, vocab, 50)
    for i in range(24):
        parent = rng.integers(-1, i) if i else -1
        start = chat_system if parent < 0 else chats[parent]
        chats.append(np.concatenate([start, rng.integers(0, vocab, rng.integers(10, 61))]))
    return system, shared, chats


def test_radix_reuses_the_longest_prefix_and_blocks_round_it_down():
    system, shared, chats = _shared_and_chats()
    for prompts in (shared, chats):
        blocks, radix, reused_b, reused_r = _serve_both(prompts)
        best = [max([lcp(p[:-1], q) for q in prompts[:i]], default=0)
                for i, p in enumerate(prompts)]
        assert reused_r == best
        assert reused_b == [16 * (n // 16) for n in best]
        assert len(blocks) * 16 <= radix.tokens_held
        assert radix.tokens_held == len({tuple(p[:i]) for p in prompts
                                         for i in range(1, len(p) + 1)})
    _, _, reused_b, reused_r = _serve_both(shared)
    assert reused_r[1:] == [200] * 15 and reused_b[1:] == [192] * 15  # the notebook's (a)


class _HeadFirst(PrefixCache):
    """Deep dive 10d §3's mistake: a chain touched in prompt order, so its head is the oldest."""

    def touch(self, keys):
        for key in keys:
            self.index.move_to_end(key)


def _evict_until_the_prompt_is_cut(blocks, keys):
    n = 0
    while all(k in blocks.index for k in keys):
        assert blocks.evict_one()
        n += 1
    return n


def test_head_first_eviction_strands_a_chain_tail_first_and_the_radix_tree_keep_the_prefix():
    system, shared, _ = _shared_and_chats()
    keys = block_keys(system, 16)
    probe = np.concatenate([system, [1, 2]])
    wrong, _, _, _ = _serve_both(shared, _HeadFirst)
    assert _evict_until_the_prompt_is_cut(wrong, keys) == 24  # the notebook's 24
    assert keys[0] not in wrong.index and all(k in wrong.index for k in keys[1:])
    assert wrong.lookup(probe) == []  # the rest: held, unreachable
    blocks, radix, _, _ = _serve_both(shared)
    held = len(blocks)
    assert _evict_until_the_prompt_is_cut(blocks, keys) == held - len(keys) + 1
    assert len(blocks.lookup(probe)) == len(keys) - 1  # only the prompt's last block went
    questions = radix.tokens_held - 200
    while radix.tokens_held > 200:
        assert radix.match(system) == 200
        radix.evict(1)
    assert radix.evicted_tokens == questions and radix.evict(1) == 200


# --------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("call, message", [
    (lambda c: c.insert([[1, 2], [3, 4]]), r"RadixCache.insert: tokens has shape \(2, 2\)"),
    (lambda c: c.match([0.5, 1.5]), r"RadixCache.match: tokens has shape \(2,\) and dtype "
                                     r"float64; expected \(T,\) token ids"),
    (lambda c: c.unlock([1, 2]), r"RadixCache.unlock: the 2 cached tokens .* are not locked"),
    (lambda c: c.evict(0), r"RadixCache.evict: n_tokens"),
])
def test_bad_input_is_refused_naming_the_call(call, message):
    cache = RadixCache()
    cache.insert([1, 2, 3])
    with pytest.raises(ValueError, match=message):
        call(cache)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match=r"RadixCache: capacity"):
        RadixCache(capacity=0)
