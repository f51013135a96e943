"""Prefix caching: requests that share a prefix reuse its blocks in the paged KV cache.

Taught in ``notebooks/10_serving.ipynb`` (§3). The keys and values of a prompt's first ``n``
tokens depend on those ``n`` tokens only (causal attention), so two prompts that start alike
(a system prompt, a few-shot header) can share them. As vLLM's automatic prefix caching does,
:class:`PrefixCache` indexes **full** blocks of the paged cache by a hash of the block's
tokens *chained with the hash of the block before it*, so a block's key stands for its whole
prefix, not for its own tokens alone:

    key_0 = H(b"" + tokens of block 0),  key_i = H(key_{i-1} + tokens of block i)

A new request looks up its blocks' keys in order and starts on the cached blocks of its
longest hit (:meth:`PrefixCache.lookup`, at most its prompt minus one token, so one token is
left to compute the logits from); the blocks' reference counts (``PagedKVCache.add_sequence``)
keep them alive while shared. After a prompt is prefilled, its full blocks are indexed
(:meth:`PrefixCache.insert`) and held by the index (``retain``); when the pool runs short, the
least recently used block that nothing but the index holds is released
(:meth:`PrefixCache.evict_one`). A partly filled block is never indexed: its later positions
are still to be written, and may differ between the requests that would share it.

A lookup or an insert marks a chain's blocks as used **tail first** (:meth:`PrefixCache.touch`),
so a chain's first block is always its most recently used and eviction takes chains from their
ends: a key stands for its whole prefix, so evicting a chain's head first would strand the rest,
held but unreachable. vLLM does the same by freeing a finished request's blocks in reverse order
("so that the tail blocks are evicted first", ``KVCacheManager.free`` in
``vllm/v1/core/kv_cache_manager.py``).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from .paged import PagedSequence, PagedStore


def block_keys(tokens, block_size: int) -> list[bytes]:
    """The chained keys of the full blocks of ``tokens`` (SHA-256 digests).

    Examples
    --------
    >>> a = block_keys([1, 2, 3, 4, 5, 6, 7], block_size=2)   # 3 full blocks, one token left
    >>> b = block_keys([9, 9, 3, 4], block_size=2)
    >>> len(a), a[1] == b[1]   # the same tokens 3, 4 after another prefix: another key
    (3, False)
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    keys, parent = [], b""
    for i in range(len(tokens) // block_size):
        parent = hashlib.sha256(parent + tokens[i * block_size:(i + 1) * block_size].tobytes()
                                ).digest()
        keys.append(parent)
    return keys


class PrefixCache:
    """An index of full blocks of a :class:`PagedStore`, by chained hash, with LRU eviction.

    Attributes
    ----------
    store : PagedStore
    queried_blocks, hit_blocks : int
        Full blocks looked up by requests so far, and how many of them were found.

    Examples
    --------
    >>> from mha_course.serving.decoder import Decoder
    >>> dec = Decoder.random(vocab=11, d_model=8, n_layers=1, h=2, rng=0)
    >>> cache = PrefixCache(PagedStore(dec, n_blocks=16, block_size=4))
    >>> first = cache.store.new_sequence()
    >>> _ = dec.step([1, 2, 3, 4, 5, 6, 7, 8, 9], first)
    >>> cache.insert([1, 2, 3, 4, 5, 6, 7, 8, 9], first)   # indexes blocks 0 and 1
    >>> cache.lookup([1, 2, 3, 4, 5, 6, 7, 8, 10, 10]), cache.lookup([1, 2, 3, 4, 0])
    ([0, 1], [0])
    """

    def __init__(self, store: PagedStore):
        self.store = store
        self.index: OrderedDict[bytes, int] = OrderedDict()  # key -> block, oldest use first
        self.queried_blocks = 0
        self.hit_blocks = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.queried_blocks if self.queried_blocks else 0.0

    def lookup(self, prompt) -> list[int]:
        """The cached blocks of the longest cached prefix of ``prompt`` (its full blocks,
        leaving at least one token to compute)."""
        keys = block_keys(np.asarray(prompt)[:-1], self.store.block_size)
        self.queried_blocks += len(keys)
        blocks = []
        for key in keys:
            if key not in self.index:
                break
            blocks.append(self.index[key])
        self.touch(keys[:len(blocks)])
        self.hit_blocks += len(blocks)
        return blocks

    def touch(self, keys) -> None:
        """Mark a chain's blocks (``keys`` in prompt order) as used now, the last first.

        Its first block ends as the most recently used of all, its last as the least of the
        chain: eviction then shortens a cached prefix from its end and never strands a block
        behind an evicted one.
        """
        for key in reversed(keys):
            self.index.move_to_end(key)

    def insert(self, prompt, seq: PagedSequence) -> None:
        """Index the full blocks of ``prompt``, whose keys and values ``seq`` now holds."""
        table = seq.block_table
        keys = block_keys(prompt, self.store.block_size)[:len(table)]
        for key, block in zip(keys, table, strict=False):
            if key not in self.index:
                self.index[key] = block
                self.store.retain(block)
        self.touch(keys)

    def evict_one(self, keep=()) -> bool:
        """Release the least recently used indexed block that only the index holds.

        Returns False when there is none (every indexed block is in use, or in ``keep``).
        """
        keep = set(keep)
        for key, block in self.index.items():
            if block not in keep and self.store.ref_count(block) == 1:
                del self.index[key]
                self.store.release(block)
                return True
        return False

    def __len__(self) -> int:
        return len(self.index)
