"""A radix-tree prefix cache (SGLang's RadixAttention): reuse any cached prefix, token by token.

Taught in ``notebooks/deep_dives/10d_serving_at_scale.ipynb`` (§3); lesson 10 §3's
:class:`~mha_course.serving.prefix_cache.PrefixCache` is the block-hash cache it is compared
with. Zheng et al. (NeurIPS 2024, "SGLang: Efficient Execution of Structured Language Model
Programs", https://arxiv.org/abs/2312.07104) keep the token sequences whose keys and values are
cached in a **radix tree** (a compressed trie):

- every edge is labelled by a *run* of token ids, and a node's children start with different
  tokens, so a prompt walks down at most one path (:meth:`RadixCache.match`: the longest cached
  prefix, at token granularity, not whole blocks);
- inserting a sequence that leaves an edge part-way **splits** the edge's node in two: the shared
  part becomes a new parent of the old node and of the new branch (:meth:`RadixCache.insert`);
- a running request **locks** the path of the prefix it uses (a reference count per node,
  :meth:`RadixCache.lock` / :meth:`RadixCache.unlock`);
- when the cache is over its capacity (in tokens), the least recently used **leaf** with no
  lock is evicted, whole, and its parent may become a leaf in turn (:meth:`RadixCache.evict`).
  Only leaves go: an inner node is a prefix of something still cached.

The tree holds token ids only: in a server each node also owns the cache slots of its tokens
(SGLang's default page holds one token), which is what :attr:`RadixCache.tokens_held` counts.
"""

from __future__ import annotations

import numpy as np

from .._validate import fail, fmt_shape, validate_positive_int


class _Node:
    __slots__ = ("tokens", "children", "parent", "ref", "last_used")

    def __init__(self, tokens: tuple, parent: _Node | None, tick: int):
        self.tokens, self.parent, self.children = tokens, parent, {}
        self.ref, self.last_used = 0, tick


def _common(a: tuple, b: tuple) -> int:
    """Length of the common prefix of two token runs."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class RadixCache:
    """Token sequences in a radix tree, with LRU eviction of unlocked leaves.

    Parameters
    ----------
    capacity : int, optional
        Tokens the tree may hold; None: no limit. :meth:`insert` evicts down to it.

    Attributes
    ----------
    queried_tokens, hit_tokens : int
        Tokens looked up by :meth:`match` so far, and how many of them were found.

    Examples
    --------
    >>> cache = RadixCache()
    >>> cache.insert([1, 2, 3, 4, 5]), cache.insert([1, 2, 3, 9])   # tokens already cached
    (0, 3)
    >>> cache.match([1, 2, 3, 9, 7]), cache.match([1, 2, 8])
    (4, 2)
    >>> cache.tokens_held, cache.n_nodes   # [1 2 3] -> [4 5] and [9]
    (6, 3)
    """

    def __init__(self, capacity: int | None = None):
        self.capacity = (None if capacity is None
                         else validate_positive_int("RadixCache", "capacity", capacity))
        self._tick = 0
        self.root = _Node((), None, 0)
        self.root.ref = 1  # the root is never evicted
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.evicted_tokens = 0

    # ------------------------------------------------------------------ validation, walking
    @staticmethod
    def _tokens(func: str, tokens) -> tuple:
        arr = np.asarray(tokens)
        if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
            raise fail(func, f"tokens has shape {fmt_shape(arr.shape)} and dtype {arr.dtype}; "
                             "expected (T,) token ids (integers)")
        return tuple(int(t) for t in arr)

    def _walk(self, tokens: tuple, split: bool):
        """The nodes on the path of ``tokens``' longest cached prefix, and its length.

        With ``split``, a match ending part-way along an edge splits that edge's node, so the
        path ends exactly at the matched length."""
        node, path, n = self.root, [], 0
        while n < len(tokens):
            child = node.children.get(tokens[n])
            if child is None:
                break
            k = _common(child.tokens, tokens[n:])
            if k < len(child.tokens):
                if not split:
                    path.append(child)
                    n += k
                    break
                child = self._split(child, k)
            path.append(child)
            n += k
            node = child
        return path, n

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut ``node``'s edge after ``k`` tokens: a new parent holds the first ``k``."""
        parent = node.parent
        head = _Node(node.tokens[:k], parent, node.last_used)
        head.ref = node.ref  # whatever locks the node locks the path through its head
        parent.children[node.tokens[0]] = head
        node.tokens, node.parent = node.tokens[k:], head
        head.children[node.tokens[0]] = node
        return head

    def _touch(self, path) -> None:
        self._tick += 1
        for node in path:
            node.last_used = self._tick

    # ------------------------------------------------------------------------- public calls
    def match(self, tokens) -> int:
        """Length of the longest cached prefix of ``tokens`` (counted in the hit rate; the
        path is marked used now)."""
        tokens = self._tokens("RadixCache.match", tokens)
        path, n = self._walk(tokens, split=False)
        self._touch(path)
        self.queried_tokens += len(tokens)
        self.hit_tokens += n
        return n

    def insert(self, tokens) -> int:
        """Add ``tokens`` to the tree; returns how many of them were cached already.

        With a capacity, least recently used unlocked leaves are then evicted until the tree
        fits (never the path just inserted)."""
        tokens = self._tokens("RadixCache.insert", tokens)
        path, n = self._walk(tokens, split=True)
        if n < len(tokens):
            parent = path[-1] if path else self.root
            leaf = _Node(tokens[n:], parent, self._tick)
            parent.children[tokens[n]] = leaf
            path.append(leaf)
        self._touch(path)
        if self.capacity is not None and self.tokens_held > self.capacity:
            for node in path:
                node.ref += 1
            self.evict(self.tokens_held - self.capacity)
            for node in path:
                node.ref -= 1
        return n

    def lock(self, tokens) -> int:
        """A running request uses the cached prefix of ``tokens``: lock its path (no eviction
        until :meth:`unlock`). Returns the locked length."""
        path, n = self._walk(self._tokens("RadixCache.lock", tokens), split=True)
        for node in path:
            node.ref += 1
        self._touch(path)
        return n

    def unlock(self, tokens) -> int:
        """Undo one :meth:`lock` of the same ``tokens``; returns the unlocked length."""
        func = "RadixCache.unlock"
        path, n = self._walk(self._tokens(func, tokens), split=True)
        if any(node.ref < 1 for node in path):
            raise fail(func, f"the {n} cached tokens of this prefix are not locked; expected "
                             "the tokens of an earlier lock()")
        for node in path:
            node.ref -= 1
        return n

    def evictable(self) -> list:
        """The leaves no running request holds, least recently used first."""
        leaves, stack = [], [self.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if not node.children and node.ref == 0:
                leaves.append(node)
        return sorted(leaves, key=lambda nd: nd.last_used)

    def evict(self, n_tokens: int) -> int:
        """Evict least recently used unlocked leaves, whole, until ``n_tokens`` are freed or
        none is left; returns the tokens freed."""
        n_tokens = validate_positive_int("RadixCache.evict", "n_tokens", n_tokens)
        freed = 0
        while freed < n_tokens:
            leaves = self.evictable()
            if not leaves:
                break
            leaf = leaves[0]
            del leaf.parent.children[leaf.tokens[0]]
            freed += len(leaf.tokens)
        self.evicted_tokens += freed
        return freed

    # ----------------------------------------------------------------------------- sizes
    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    @property
    def tokens_held(self) -> int:
        """Tokens (cache slots) the tree holds: the lengths of all its edges."""
        return sum(len(node.tokens) for node in self._nodes())

    @property
    def n_nodes(self) -> int:
        """Nodes of the tree, the root left out."""
        return sum(1 for _ in self._nodes())

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    def sequences(self) -> list[tuple]:
        """Every cached sequence that ends at a leaf (the tree's contents), sorted."""
        out, stack = [], [(self.root, ())]
        while stack:
            node, prefix = stack.pop()
            prefix = prefix + node.tokens
            if not node.children and node is not self.root:
                out.append(prefix)
            stack.extend((child, prefix) for child in node.children.values())
        return sorted(out)
