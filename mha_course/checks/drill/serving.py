"""Checks for lesson 15's spot-the-bug drill: the serving bugs (15.19 to 15.21).

Taught with ``notebooks/10_serving.ipynb``. A prefix cache whose keys forget the prefix, a
speculative decoder that does not roll its target's cache back, and a speculative sampler that
resamples from the wrong distribution. Like :mod:`mha_course.checks.drill.decoding`, each
check states the first property the learner's function breaks, by name, with the evidence,
computes its reference now (generating alone, the exact output distribution), probes several
sizes, and names the likely mistake of a known wrong fix.
"""

from __future__ import annotations

import numpy as np

from ...serving.decoder import ContiguousCache, Decoder, generate_alone
from ...serving.paged import PagedStore
from ...serving.scheduler import CostModel, Request, serve
from .. import properties as P
from ..harness import call, fail, fmt, passed
from ..measure import check_rng

__all__ = ["check_prefix_keys", "check_speculative_rollback", "check_speculative_residual"]

PREFIX = "a prefix-cache hit reproduces exactly the outputs computed without the cache"
FULL = "only full blocks get a key: a partly filled block is still being written"
HITS = "equal prefixes get equal keys, so a repeated prefix is found"
SPEC_GREEDY = "greedy speculative decoding emits exactly the target's greedy tokens"
SPEC_SAMPLE = "speculative sampling emits the target's distribution exactly"
DIST = "what a rejection draws from is a distribution: non-negative, summing to 1"


# --------------------------------------------------------------- 15.19 keys that forget
class _LongestKeyCache:
    """A prefix cache that finds a prompt's longest cached prefix by the key of its last block:
    ``index[key of block i] = the blocks 0..i`` (a key must stand for the whole prefix)."""

    def __init__(self, store: PagedStore, keys):
        self.store, self.keys, self.index = store, keys, {}
        self.hits: list[int] = []

    def lookup(self, prompt):
        keys = self.keys(np.asarray(prompt)[:-1], self.store.block_size)
        for i in range(len(keys) - 1, -1, -1):  # the longest first
            if keys[i] in self.index:
                self.hits.append(i + 1)
                return list(self.index[keys[i]])
        self.hits.append(0)
        return []

    def insert(self, prompt, seq):
        table = seq.block_table
        for i, key in enumerate(self.keys(np.asarray(prompt), self.store.block_size)):
            if key not in self.index and i < len(table):
                self.index[key] = tuple(table[:i + 1])
                for block in table[:i + 1]:
                    self.store.retain(block)

    def evict_one(self, keep=()):
        return False


def _unchained(tokens, block_size):
    return [hash(tuple(int(t) for t in tokens[i * block_size:(i + 1) * block_size]))
            for i in range(len(tokens) // block_size)]


def _indexed(tokens, block_size):
    return [hash((i, tuple(int(t) for t in tokens[i * block_size:(i + 1) * block_size])))
            for i in range(len(tokens) // block_size)]


def check_prefix_keys(fn) -> None:
    """Exercise 15.19: ``block_keys(tokens, block_size)`` -> one hashable key per full block."""
    ex = "15.19"
    dec = Decoder.random(vocab=13, d_model=16, n_layers=2, h=4, n_kv_heads=2, rng=1320)

    def keys_of(tokens, block_size):
        got = call(ex, fn, (np.asarray(tokens), block_size), ("tokens", "block_size"),
                   forbid={"mha_course.serving.prefix_cache": "write the keys yourself"})
        try:
            out = [k if not isinstance(k, (list, np.ndarray)) else tuple(np.ravel(k).tolist())
                   for k in got]
            {hash(k) for k in out}
        except TypeError:
            raise fail(ex, f"expected a list of hashable keys; got {type(got).__name__}") from None
        return out

    for bs, n in ((4, 10), (3, 11), (5, 5)):
        tokens = np.arange(n) % 13
        got = keys_of(tokens, bs)
        if len(got) != n // bs:
            likely = None if len(got) != -(-n // bs) else (
                "key only the full blocks, as vLLM's prefix caching does: a partly filled one "
                "still changes as tokens arrive")
            raise P.violated(ex, FULL, f"{n} tokens in blocks of {bs} have {n // bs} full "
                             f"blocks; you returned {len(got)} keys", likely)
    header_a, header_b, middle = [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 10, 10]
    prompts = [header_a + middle + [3, 1], header_b + middle + [4, 2], header_a + middle + [6],
               header_b + [11, 12, 11, 12] + [0, 5, 7], header_b + [11, 12, 11, 12] + middle + [2]]
    for bs, prompts_ in ((4, prompts), (2, [p + [1, 2] for p in prompts])):
        store = PagedStore(dec, n_blocks=64, block_size=bs)
        cache = _LongestKeyCache(store, keys_of)
        requests = [Request(i, np.array(p), 4, arrival=10.0 * i) for i, p in enumerate(prompts_)]
        served = serve(dec, requests, "continuous", cost=CostModel(1.0, 0, 0, 0), max_batch=1,
                       prefix_cache=cache)
        for i, p in enumerate(prompts_):
            alone = generate_alone(dec, np.array(p), 4)
            mine = served.requests[i].tokens
            if mine != alone:
                common = max([_common_blocks(p, q, bs) for q in prompts_[:i]] + [0])
                likely = None
                if keys_of(p, bs) == _indexed(p, bs) or _same_pattern(keys_of, _indexed,
                                                                      prompts_, bs):
                    likely = ("a block's index says where it sits, not what comes before it: "
                              "chain each key to the one before it (vllm-project/vllm PR "
                              "#12603)")
                raise P.violated(ex, PREFIX, f"in blocks of {bs}, request {i} reused "
                                 f"{cache.hits[i]} cached blocks, but no earlier prompt shares "
                                 f"more than {common} leading full blocks with it; its tokens "
                                 f"{mine} against {alone} computed without the cache", likely)
        want_hits = [0, 0, 2, 1, 2] if bs == 4 else None
        if want_hits is not None:
            P.require(ex, HITS, cache.hits != want_hits and f"requests 2, 3 and 4 repeat "
                      f"{want_hits[2:]} full blocks of earlier prompts; your keys found "
                      f"{cache.hits[2:]}", None)
    passed(ex, "a key for each full block that stands for its whole prefix: hits where the "
               "prefix repeats, and outputs unchanged")


def _common_blocks(p, q, bs) -> int:
    """How many leading full blocks two prompts share."""
    n = 0
    while (n + 1) * bs <= min(len(p), len(q)) and p[n * bs:(n + 1) * bs] == q[n * bs:(n + 1) * bs]:
        n += 1
    return n


def _same_pattern(mine, other, prompts, bs) -> bool:
    """Whether two key functions say 'same key' for the same pairs of (prompt, block)."""
    a = [mine(np.array(p), bs) for p in prompts]
    b = [other(np.array(p), bs) for p in prompts]
    pairs = [(i, x, j, y) for i in range(len(prompts)) for j in range(len(prompts))
             for x in range(min(len(a[i]), len(b[i]))) for y in range(min(len(a[j]), len(b[j])))]
    return all((a[i][x] == a[j][y]) == (b[i][x] == b[j][y]) for i, x, j, y in pairs)


# ------------------------------------------------------------ 15.20 the target's rollback
def _speculative(target, draft, prompt, n_new, k, keep=lambda n, a: n + 1 + a):
    """Greedy speculative decoding whose target cache keeps ``keep(n, a)`` positions after a
    round (right: n + 1 + a; the wrong fixes below)."""
    tc, dc = ContiguousCache(target), ContiguousCache(draft)
    if len(prompt) > 1:
        target.step(prompt[:-1], tc)
        draft.step(prompt[:-1], dc)
    last, out = int(prompt[-1]), []
    while len(out) < n_new:
        n, nd, drafts, token = tc.length, dc.length, [], last
        for _ in range(k):
            token = int(np.argmax(draft.step([token], dc)[-1]))
            drafts.append(token)
        rows = target.step(np.array([last, *drafts]), tc)
        a = 0
        while a < k and int(np.argmax(rows[a])) == drafts[a]:
            a += 1
        emitted = drafts[:a] + [int(np.argmax(rows[a]))]
        if keep is not None:
            tc.truncate(min(tc.length, max(0, keep(n, a))))
        if a == k:
            draft.step([drafts[-1]], dc)
        else:
            dc.truncate(nd + 1 + a)
        out += emitted
        last = emitted[-1]
    return out[:n_new]


def check_speculative_rollback(fn) -> None:
    """Exercise 15.20: ``speculative_greedy(target, draft, prompt, n_new, k)`` -> list of ints."""
    ex = "15.20"
    rng = check_rng(1321)
    target, draft = (Decoder.random(vocab=11, d_model=16, n_layers=2, h=4, n_kv_heads=2,
                                    rng=1321) for _ in range(2))
    noise = np.random.default_rng(5)
    for t_layer, d_layer in zip(target.blocks, draft.blocks, strict=True):
        for layer in (t_layer, d_layer):  # sharper attention: what a cache holds matters
            layer.attn.W_q, layer.attn.W_o = layer.attn.W_q * 3, layer.attn.W_o * 3
        d_layer.W_down = d_layer.W_down + 0.3 * noise.normal(size=d_layer.W_down.shape)
    wrong = [("the target's cache rolled back one position too far: it must keep `last` and the "
              "a accepted drafts, n + 1 + a positions (lablup/mlxcel#994 rewound its draft "
              "cache by too many)", lambda n, a: n + a),
             ("a reset empties the whole cache (paiml/aprender PR #2014): roll it back to the "
              "accepted length instead", lambda n, a: 0)]
    for prompt_len, n_new, k in ((5, 14, 3), (1, 9, 2), (8, 12, 5)):
        prompt = rng.integers(0, 11, prompt_len)
        want = generate_alone(target, prompt, n_new)
        got = call(ex, fn, (target, draft, prompt, n_new, k),
                   ("target", "draft", "prompt", "n_new", "k"),
                   forbid={"mha_course.serving.speculative": "write the rounds yourself"})
        try:
            got = [int(t) for t in got]
        except (TypeError, ValueError):
            raise fail(ex, f"expected a list of token ids; got {type(got).__name__}") from None
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                         min(len(got), len(want)))
            likely = next((m for m, keep in wrong
                           if _speculative(target, draft, prompt, n_new, k, keep) == got), None)
            raise P.violated(ex, SPEC_GREEDY, f"prompt of {prompt_len} tokens, k={k}: your "
                             f"tokens {got} against the target's greedy {want}, first "
                             f"different at {first}", likely)
    passed(ex, "after each round the target keeps n + 1 + a positions: greedy output "
               "identical to the target's, for k = 3, 2, 5")


# ----------------------------------------------------------- 15.21 the rejection's residual
def check_speculative_residual(fn) -> None:
    """Exercise 15.21: ``verify_one(p, q, x)`` -> ``(accept_probability, replacement)``."""
    ex = "15.21"
    rng = check_rng(1322)
    for V in (3, 6, 11):
        for _ in range(2):
            p = rng.dirichlet(np.ones(V))
            q = rng.dirichlet(np.ones(V) * 0.5)
            _one_pair(ex, fn, p, q)
    passed(ex, "accept with min(1, p/q), replace from norm(max(0, p - q)): the emitted token "
               "has the target's distribution, for 6 pairs (p, q)")


def _one_pair(ex, fn, p, q):
    V = len(p)
    label = f"for a vocabulary of {V} (p {np.round(p, 3).tolist()}, q {np.round(q, 3).tolist()})"
    emitted = np.zeros(V)
    for x in range(V):
        got = call(ex, fn, (p.copy(), q.copy(), x), ("p", "q", "x"),
                   forbid={"mha_course.serving.speculative": "write the rule yourself"})
        if not (isinstance(got, tuple) and len(got) == 2):
            raise fail(ex, f"expected (accept_probability, replacement); got {type(got).__name__}")
        a, r = float(got[0]), np.asarray(got[1], dtype=float)
        if r.shape != (V,) or not 0 <= a <= 1:
            raise fail(ex, f"{label}, drafted token {x}: expected a probability in [0, 1] and a "
                           f"replacement of shape ({V},); got {fmt(a)} and {r.shape}")
        bad = abs(r.sum() - 1) > 1e-9 or (r < -1e-12).any()
        if bad and a < 1:
            resid = np.maximum(p - q, 0)
            likely = ("normalise the residual: max(0, p - q) sums to the total variation, not 1"
                      if np.allclose(r, resid) else None)
            raise P.violated(ex, DIST, f"{label}, drafted token {x}: your replacement sums to "
                             f"{fmt(r.sum())}", likely)
        emitted += q[x] * a * np.eye(V)[x] + q[x] * (1 - a) * r
    found = np.abs(emitted - p).max()
    if found > 1e-9:
        y = int(np.argmax(np.abs(emitted - p)))
        accept_ok = all(np.isclose(float(call(ex, fn, (p.copy(), q.copy(), x), ("p", "q", "x"))[0]),
                                   min(1.0, p[x] / q[x])) for x in range(V))
        rows = [np.asarray(call(ex, fn, (p.copy(), q.copy(), x), ("p", "q", "x"))[1], float)
                for x in range(V)]
        likely = None
        if accept_ok and all(np.allclose(r, p) for r in rows):
            likely = ("on a rejection draw from the residual norm(max(0, p - q)), what p has "
                      "beyond q, not from p itself (SafeAILab/EAGLE#329)")
        elif accept_ok and all(np.allclose(r, _eagle20(p, q, x)) for x, r in enumerate(rows)):
            likely = ("subtract q from p for every token, not only the rejected one "
                      "(SafeAILab/EAGLE#20)")
        raise P.violated(ex, SPEC_SAMPLE, f"{label}: the emitted token has probability "
                         f"{fmt(emitted[y])} of being token {y}, the target gives it "
                         f"{fmt(p[y])}", likely)


def _eagle20(p, q, x):
    r = p.copy()
    r[x] = max(0.0, p[x] - q[x])
    return r / r.sum()
