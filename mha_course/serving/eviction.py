"""A smaller cache by eviction: keep ``budget`` positions per layer and K/V head, drop the rest.

Taught in ``notebooks/deep_dives/10c_smaller_cache.ipynb`` (§2) of lesson 10; deep dive 06b §1–§2 of
lesson 06 introduced the window and the
sinks. :class:`EvictingCache` decodes token by token; after each token, a layer whose K/V head
holds more than ``budget`` positions drops one, chosen by the policy:

- ``"window"``: the oldest (a sliding window of ``budget``, deep dive 06b §1);
- ``"sinks"``: the oldest after the first ``n_sinks`` (StreamingLLM, Xiao et al., ICLR 2024,
  with 4 sinks), and positions **inside the cache**: the kept keys are rotated at positions
  ``0 .. n-1`` in order and the query at ``n - 1``, not at their places in the text (the
  paper's §3.2);
- ``"h2o"``: the "heavy hitters" of H2O (Zhang et al., NeurIPS 2023): each position's attention
  weight summed over every query so far (and over the query heads of its group); the
  ``recent`` newest are always kept, and of the others the one with the least accumulated
  weight goes;
- ``"snapkv"``: SnapKV's observation-window vote (Li et al., NeurIPS 2024): a position's score is
  the weight the last ``obs_window`` queries gave it, max-pooled over ``pool`` neighbours; the
  ``obs_window`` newest are kept. SnapKV compresses a prompt once, after prefill; here the vote
  is recomputed at every token, so that all four policies hold the same budget while decoding.

Each K/V head keeps its own positions (H2O and SnapKV select per head); for the window and the
sinks every head keeps the same ones. ``positions="original"`` rotates every key at its place in
the text (the default except for ``"sinks"``).
"""

from __future__ import annotations

import numpy as np

from .._validate import fail, validate_positive_int
from ..heads import attend_heads

POLICIES = ("window", "sinks", "h2o", "snapkv")


def max_pool(x, width: int):
    """Max over a window of ``width`` neighbours along the last axis (same length, ``width``
    odd; the window is cut at the ends).

    Examples
    --------
    >>> max_pool(np.array([0.0, 3.0, 0.0, 0.0, 1.0]), 3).tolist()
    [3.0, 3.0, 3.0, 1.0, 1.0]
    """
    half = width // 2
    n = x.shape[-1]
    padded = np.concatenate([np.full(x.shape[:-1] + (half,), -np.inf), x,
                             np.full(x.shape[:-1] + (half,), -np.inf)], axis=-1)
    return np.max(np.stack([padded[..., i:i + n] for i in range(width)]), axis=0)


class EvictingCache:
    """A sequence's cache of at most ``budget`` positions per layer and K/V head.

    Parameters
    ----------
    decoder : Decoder
    budget : int
    policy : {"window", "sinks", "h2o", "snapkv"}
    n_sinks : int, default 4
    recent : int, optional
        Newest positions H2O always keeps; default ``budget // 2``.
    obs_window, pool : int, default 8 and 5
        SnapKV's observation window and pooling width.
    positions : {"original", "cache"}, optional
        Default ``"cache"`` for ``"sinks"``, ``"original"`` otherwise.

    Examples
    --------
    >>> from mha_course.serving.decoder import Decoder
    >>> dec = Decoder.random(vocab=11, d_model=8, n_layers=1, h=2, rng=0)
    >>> cache = EvictingCache(dec, budget=6, policy="sinks", n_sinks=2)
    >>> _ = dec.step(np.arange(10), cache)
    >>> cache.kept_positions(0).tolist()   # 2 sinks and the 4 newest, every K/V head
    [[0, 1, 6, 7, 8, 9], [0, 1, 6, 7, 8, 9]]
    """

    def __init__(self, decoder, budget: int, policy: str, *, n_sinks: int = 4, recent=None,
                 obs_window: int = 8, pool: int = 5, positions=None):
        func = "EvictingCache"
        if policy not in POLICIES:
            raise fail(func, f"policy={policy!r}; expected one of {POLICIES}")
        self.budget = validate_positive_int(func, "budget", budget)
        self.n_sinks = validate_positive_int(func, "n_sinks", n_sinks, minimum=0)
        self.recent = self.budget // 2 if recent is None else int(recent)
        self.obs_window, self.pool = int(obs_window), int(pool)
        keep_new = {"sinks": self.n_sinks, "h2o": self.recent, "snapkv": self.obs_window}
        if keep_new.get(policy, 0) >= self.budget:
            raise fail(func, f"budget={budget} must exceed what {policy!r} always keeps "
                             f"({keep_new[policy]})")
        self.positions = positions or ("cache" if policy == "sinks" else "original")
        if self.positions not in ("original", "cache"):
            raise fail(func, f"positions={positions!r}; expected 'original' or 'cache'")
        self.decoder, self.policy, self.length = decoder, policy, 0
        n = decoder.n_layers
        self._raw = [None] * n  # (g, n, d_k): keys before RoPE
        self._rot = [None] * n  # (g, n, d_k): keys rotated at their original positions
        self._v = [None] * n  # (g, n, d_v)
        self._pos = [None] * n  # (g, n): original positions, increasing along axis 1
        self._score = [None] * n  # (g, n): H2O's accumulated weight
        self._votes = [None] * n  # (g, n, obs_window): the last queries' weights (SnapKV)

    def kept_positions(self, layer: int) -> np.ndarray:
        """(g, n) the original positions each K/V head of ``layer`` holds now."""
        return self._pos[layer].copy()

    def attend(self, layer: int, q, k, v):
        """Token by token: append, attend, then evict to the budget. -> heads (h, T, d_v)."""
        return np.concatenate([self._one(layer, q[..., t:t + 1, :], k[..., t:t + 1, :],
                                         v[..., t:t + 1, :], self.length + t)
                               for t in range(q.shape[-2])], axis=-2)

    def _one(self, li, q, k, v, pos):
        attn = self.decoder.blocks[li].attn
        g = k.shape[-3]
        new_pos = np.full((g, 1), pos)
        k_rot = attn._rope(k, np.array([pos]))
        if self._raw[li] is None:
            self._raw[li], self._rot[li], self._v[li], self._pos[li] = k, k_rot, v, new_pos
            self._score[li] = np.zeros((g, 1))
            self._votes[li] = np.zeros((g, 1, self.obs_window))
        else:
            cat = np.concatenate
            self._raw[li] = cat([self._raw[li], k], axis=-2)
            self._rot[li] = cat([self._rot[li], k_rot], axis=-2)
            self._v[li] = cat([self._v[li], v], axis=-2)
            self._pos[li] = cat([self._pos[li], new_pos], axis=-1)
            self._score[li] = cat([self._score[li], np.zeros((g, 1))], axis=-1)
            self._votes[li] = cat([self._votes[li], np.zeros((g, 1, self.obs_window))], axis=1)
        n = self._pos[li].shape[-1]
        if self.positions == "cache":  # slots 0 .. n-1 in order, the query in the last
            keys, q = attn._rope(self._raw[li]), attn._rope(q, np.array([n - 1]))
        else:
            keys, q = self._rot[li], attn._rope(q, np.array([pos]))
        # (h, 1, d_v), (h, 1, n)
        heads, weights = attend_heads(q, keys, self._v[li], None, attn.scale)
        w = weights[:, 0, :].reshape(g, -1, n).sum(axis=1)  # (g, n): summed over each group
        self._score[li] += w
        self._votes[li] = np.concatenate([self._votes[li][..., 1:], w[..., None]], axis=-1)
        if n > self.budget:
            self._evict(li)
        return heads

    def _evict(self, li):
        g, n = self._pos[li].shape
        if self.policy == "window":
            drop = np.zeros(g, dtype=int)
        elif self.policy == "sinks":
            drop = np.full(g, self.n_sinks)
        else:
            keep_new = self.recent if self.policy == "h2o" else self.obs_window
            score = (self._score[li] if self.policy == "h2o"
                     else max_pool(self._votes[li].sum(axis=-1), self.pool))
            drop = np.argmin(score[:, : n - keep_new], axis=-1)  # (g,): among the older ones
        keep = np.ones((g, n), dtype=bool)
        keep[np.arange(g), drop] = False
        for name in ("_raw", "_rot", "_v", "_votes"):
            arr = getattr(self, name)[li]
            getattr(self, name)[li] = arr[keep].reshape(g, n - 1, *arr.shape[2:])
        for name in ("_pos", "_score"):
            arr = getattr(self, name)[li]
            getattr(self, name)[li] = arr[keep].reshape(g, n - 1)

    def advance(self, n: int) -> None:
        self.length += n
