"""Speculative decoding: a small draft model proposes k tokens, the target verifies them at once.

Taught in ``notebooks/10_serving.ipynb`` (§4). Leviathan, Kalman & Matias (ICML 2023, "Fast
Inference from Transformers via Speculative Decoding") and Chen et al. (2023, "Accelerating
Large Language Model Decoding with Speculative Sampling"). One round, with ``last`` the last
emitted token and both caches holding everything before it:

1. the draft decodes ``k`` tokens ``d_1 .. d_k`` one at a time (cheap: a small model);
2. the target runs **one** pass over the chunk ``[last, d_1, .., d_k]`` over its cache: ``k + 1``
   queries at positions ``n .. n + k`` with the bottom-right causal mask, which gives its
   distributions ``p_1 .. p_{k+1}`` after every prefix of the draft;
3. greedy: accept while ``d_i = argmax p_i``, then emit ``argmax p_{a+1}`` (a correction, or a
   bonus token when all ``k`` were accepted). Sampling: accept ``d_i`` with probability
   ``min(1, p_i(d_i) / q_i(d_i))``; at the first rejection emit a token drawn from the residual
   ``norm(max(0, p_i - q_i))`` and stop; after ``k`` acceptances draw the bonus from
   ``p_{k+1}``. Either way a round emits 1 to ``k + 1`` tokens, and the emitted tokens have the
   target's distribution exactly (:func:`output_distribution` computes it);
4. both caches are rolled back to the accepted tokens (``truncate``).

With an acceptance rate ``α`` per drafted token (independent across positions, the paper's
assumption) a round emits ``(1 - α^(k+1)) / (1 - α)`` tokens on average
(:func:`expected_tokens_per_round`; Leviathan et al., equation 1), and with a draft step
costing ``c`` target steps the speed-up is that over ``k·c + 1`` (:func:`improvement_factor`,
their Theorem 3.8). Several drafted branches can
be verified in one pass with a tree-attention mask (:func:`tree_mask`, as SpecInfer and Medusa
do): each node sees the cache and its own ancestors.
"""

from __future__ import annotations

import numpy as np

from .._validate import fail, validate_positive_int
from ..heads import attend_heads
from .decoder import ContiguousCache
from .sampling import draw, probabilities


# ----------------------------------------------------------------- one position, exactly
def acceptance_probability(p, q) -> np.ndarray:
    """``min(1, p(x) / q(x))`` for every token ``x`` with ``q(x) > 0`` (0 where ``q(x) = 0``)."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(q > 0, np.minimum(1.0, p / np.where(q > 0, q, 1.0)), 0.0)


def residual_distribution(p, q) -> np.ndarray:
    """``norm(max(0, p - q))``: what a rejection draws from (``p`` itself when ``p = q``)."""
    p, q = np.asarray(p, float), np.asarray(q, float)
    r = np.maximum(p - q, 0.0)
    total = r.sum(axis=-1, keepdims=True)
    return np.where(total > 0, r / np.where(total > 0, total, 1.0), p)


def output_distribution(p, q, accept=acceptance_probability,
                        resample=residual_distribution) -> np.ndarray:
    """The exact distribution of the token one verification emits at a position.

    The draft proposes ``x`` with probability ``q(x)``; it is kept with probability
    ``a(x) = accept(p, q)[x]``, else the token is drawn from ``resample(p, q)``::

        P(y) = q(y) a(y) + (Σ_x q(x) (1 - a(x))) · resample(p, q)[y]

    With the rule of Leviathan et al. this is ``p`` for every ``q``: ``q(y) min(1, p/q) =
    min(p, q)``, and the rejected mass ``Σ max(0, q - p) = Σ max(0, p - q)`` is spread as
    ``max(0, p - q)``. Pass another ``accept`` or ``resample`` to see a wrong rule fail.

    Examples
    --------
    >>> p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
    >>> np.round(output_distribution(p, q), 12) + 0.0
    array([0.5, 0.3, 0.2])
    >>> np.round(output_distribution(p, q, resample=lambda p, q: p), 4) + 0.0  # a wrong rule
    array([0.4 , 0.32, 0.28])
    """
    p, q = np.asarray(p, float), np.asarray(q, float)
    a = accept(p, q)
    rejected = (q * (1.0 - a)).sum(axis=-1, keepdims=True)
    return q * a + rejected * resample(p, q)


def acceptance_rate(p, q) -> float:
    """``β = Σ_x min(p(x), q(x))``: the chance a drafted token is accepted (1 - TV(p, q))."""
    return float(np.minimum(np.asarray(p, float), np.asarray(q, float)).sum())


def expected_tokens_per_round(alpha, k: int):
    """``(1 - α^(k+1)) / (1 - α)``: tokens a round emits when each draft is accepted with
    probability ``α`` (``k + 1`` when ``α = 1``).

    Examples
    --------
    >>> expected_tokens_per_round(0.0, 4), expected_tokens_per_round(1.0, 4)
    (1.0, 5.0)
    >>> round(expected_tokens_per_round(0.8, 4), 4)
    3.3616
    """
    alpha = np.asarray(alpha, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(alpha < 1, (1 - alpha ** (k + 1)) / np.where(alpha < 1, 1 - alpha, 1.0),
                       k + 1.0)
    return float(out) if out.ndim == 0 else out


def improvement_factor(alpha, k: int, c: float) -> float:
    """Leviathan et al.'s Theorem 3.8: the expected speed-up of speculative decoding over the
    target alone, ``(1 - α^(k+1)) / ((1 - α)(k·c + 1))``, when a draft step costs ``c`` target
    steps and a verification pass costs one.

    Examples
    --------
    >>> round(improvement_factor(0.8, 4, 0.05), 3)   # 3.36 tokens a round for 1.2 steps' cost
    2.801
    """
    return expected_tokens_per_round(alpha, k) / (k * c + 1.0)


# ---------------------------------------------------------------------- whole generation
def _choose(logits, temperature, rng):
    """(token, distribution) of the draft: greedy or sampled by the inverse CDF."""
    if temperature == 0:
        token = int(np.argmax(logits))
        return token, None
    q = probabilities(logits, temperature)
    return int(draw(q, rng)), q


def verify(rows, drafts, qs, temperature: float, rng, rule=None) -> list[int]:
    """The tokens one round emits, from the target's rows and the draft's proposals.

    ``rows`` (k + 1, vocab): the target's logits after ``last`` and after each draft prefix;
    ``drafts`` the k proposed tokens; ``qs`` the draft's distributions they were drawn from
    (None when greedy). Greedy: accept while ``d_i`` is the argmax, then the argmax of the
    next row. Sampling: accept ``d_i`` when a uniform falls below ``accept(p_i, q_i)[d_i]``,
    else draw from ``resample(p_i, q_i)`` and stop; after k acceptances, a bonus from
    ``p_{k+1}``. ``rule = (accept, resample)`` defaults to Leviathan et al.'s.

    Examples
    --------
    >>> rows = np.log(np.array([[0.1, 0.9], [0.8, 0.2], [0.5, 0.5]]))
    >>> verify(rows, [1, 1], None, 0.0, None)   # d_1 = 1 is the argmax, d_2 = 1 is not
    [1, 0]
    """
    accept, resample = rule or (acceptance_probability, residual_distribution)
    emitted = []
    for i, d in enumerate(drafts):
        if temperature == 0:
            if int(np.argmax(rows[i])) != d:
                return emitted + [int(np.argmax(rows[i]))]
        else:
            p = probabilities(rows[i], temperature)
            if not rng.random() < accept(p, qs[i])[d]:
                return emitted + [int(draw(resample(p, qs[i]), rng))]
        emitted.append(int(d))
    last = rows[len(drafts)]  # every draft accepted: a bonus token from the last row
    return emitted + [int(np.argmax(last)) if temperature == 0
                      else int(draw(probabilities(last, temperature), rng))]


def speculative_generate(target, draft, prompt, n_new: int, k: int, *, temperature: float = 0.0,
                         seed=None, rule=None):
    """Generate ``n_new`` tokens after ``prompt`` with ``target``, drafting ``k`` at a time.

    Parameters
    ----------
    target, draft : Decoder
        The same vocabulary.
    prompt : sequence of int
        At least one token.
    n_new, k : int
    temperature : float
        0: greedy (the output equals the target's greedy output); else both models sample at
        this temperature and rejection sampling keeps the target's distribution.
    seed : int, optional
    rule : (accept, resample), optional
        Replace the acceptance rule (for the tests' mutants).

    Returns
    -------
    tokens : list of int
    stats : dict
        ``"rounds"``, ``"drafted"`` (draft tokens the target looked at, up to the first
        rejection), ``"accepted"``, ``"emitted"`` per round (list), ``"alpha"``
        (accepted / drafted).
    """
    func = "speculative_generate"
    n_new = validate_positive_int(func, "n_new", n_new)
    k = validate_positive_int(func, "k", k)
    prompt = np.asarray(prompt)
    if prompt.ndim != 1 or len(prompt) < 1:
        raise fail(func, f"prompt has shape {prompt.shape}; expected (T,) with T >= 1")
    accept, resample = rule or (acceptance_probability, residual_distribution)
    rng = np.random.default_rng(seed)
    tc, dc = ContiguousCache(target), ContiguousCache(draft)
    if len(prompt) > 1:
        target.step(prompt[:-1], tc)
        draft.step(prompt[:-1], dc)
    last, out = int(prompt[-1]), []
    stats = {"rounds": 0, "drafted": 0, "accepted": 0, "emitted": []}
    while len(out) < n_new:
        n = tc.length  # both caches hold everything before `last`
        drafts, qs, token = [], [], last
        for _ in range(k):
            d, q = _choose(draft.step([token], dc)[-1], temperature, rng)
            drafts.append(d)
            qs.append(q)
            token = d
        rows = target.step(np.array([last, *drafts]), tc)  # (k + 1, vocab): p_1 .. p_{k+1}
        emitted = verify(rows, drafts, qs, temperature, rng, (accept, resample))
        stats["drafted"] += min(len(emitted), k)
        stats["accepted"] += len(emitted) - 1
        a = len(emitted) - 1  # drafts accepted this round
        tc.truncate(n + 1 + a)  # keep `last` and the accepted drafts
        if a == k:
            draft.step([drafts[-1]], dc)  # the draft never saw its own last token
        else:
            dc.truncate(n + 1 + a)
        stats["rounds"] += 1
        stats["emitted"].append(len(emitted))
        out.extend(emitted)
        last = emitted[-1]
    stats["alpha"] = stats["accepted"] / stats["drafted"] if stats["drafted"] else 0.0
    return out[:n_new], stats


# ------------------------------------------------------------------------- tree attention
def tree_mask(parents) -> np.ndarray:
    """Which drafted node may attend to which: ``mask[j, i]`` iff ``i`` is ``j`` or an ancestor.

    ``parents[j]`` is the index of node ``j``'s parent, ``-1`` for a child of the last emitted
    token; parents come before their children. Depth of node ``j`` = its position after the
    cache.

    Examples
    --------
    >>> tree_mask([-1, -1, 0, 0, 1]).astype(int)   # two first tokens, three continuations
    array([[1, 0, 0, 0, 0],
           [0, 1, 0, 0, 0],
           [1, 0, 1, 0, 0],
           [1, 0, 0, 1, 0],
           [0, 1, 0, 0, 1]])
    """
    parents = [int(p) for p in parents]
    N = len(parents)
    mask = np.eye(N, dtype=bool)
    for j, p in enumerate(parents):
        if not -1 <= p < j:
            raise fail("tree_mask", f"parents[{j}]={p}; a parent must come before its child "
                                    "(or be -1)")
        if p >= 0:
            mask[j] |= mask[p]
    return mask


def tree_depths(parents) -> np.ndarray:
    """Depth of each node (1 for a child of the last emitted token)."""
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return np.array(depth)


class TreeView:
    """A read-only view of a :class:`ContiguousCache` plus a tree of drafted tokens.

    The cache holds ``n`` positions, the last emitted token included; node ``j`` of the tree
    sits at position ``n - 1 + depth(j)`` and attends to every cached position and to its
    ancestors (:func:`tree_mask`). Nothing is written to the cache.
    """

    def __init__(self, cache: ContiguousCache, parents):
        self.cache, self.parents = cache, list(parents)
        self.length = cache.length
        self.positions = cache.length - 1 + tree_depths(self.parents)
        N = len(self.parents)  # every cached position, then the tree's own
        self.mask = np.concatenate([np.ones((N, self.length), bool), tree_mask(self.parents)],
                                   axis=1)

    def attend(self, layer: int, q, k, v):
        attn = self.cache.decoder.blocks[layer].attn
        q, k = attn._rope(q, self.positions), attn._rope(k, self.positions)
        K = np.concatenate([self.cache.keys[layer], k], axis=-2)  # (g, n + N, d_k)
        V = np.concatenate([self.cache.values[layer], v], axis=-2)
        return attend_heads(q, K, V, self.mask, attn.scale)[0]

    def advance(self, n: int) -> None:
        """A view stores nothing."""


def verify_tree(target, cache: ContiguousCache, tokens, parents) -> np.ndarray:
    """The target's logits at every node of a drafted tree, in one pass: (N, vocab).

    Row ``j`` is the target's prediction after the path root .. ``j`` (the cache holds the
    context up to and including the last emitted token).
    """
    return target.step(np.asarray(tokens), TreeView(cache, parents))
