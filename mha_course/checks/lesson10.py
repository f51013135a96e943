"""Checks for the exercises of lesson 10, serving attention (``solutions/10_serving.ipynb``).

The lesson is ``notebooks/10_serving.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`). The references are computed at check time by the serving
wing: :func:`~mha_course.serving.roofline.decode_step_cost` and
:func:`~mha_course.serving.roofline.critical_batch` on real configs,
:func:`~mha_course.serving.speculative.improvement_factor` (Leviathan et al.'s Theorem 3.8), and
:func:`~mha_course.serving.speculative.tree_mask` with a decoder's own forward pass for the tree,
and, for deep dive 10d's exercises, :func:`~mha_course.serving.roofline.prefill_cost` against
:func:`~mha_course.cost.cache_bytes` (reload or recompute) and
:class:`~mha_course.serving.radix_cache.RadixCache` (the radix tree).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..cost import MODELS, cache_bytes, head_dim
from ..serving.decoder import ContiguousCache, Decoder
from ..serving.radix_cache import RadixCache
from ..serving.roofline import GPUS, critical_batch, decode_step_cost, model_sizes, prefill_cost
from ..serving.speculative import TreeView, improvement_factor, tree_depths, tree_mask
from .harness import as_array, call, compare, fail, fmt, passed
from .measure import check_rng

__all__ = ["check_best_draft_length", "check_critical_batch",
           "check_decode_step_bytes", "check_radix_tree", "check_reload_crossover",
           "check_tree_verification"]

ROOF = "mha_course.serving.roofline"
TINY = {"num_hidden_layers": 4, "hidden_size": 96, "num_attention_heads": 6,
        "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 65,
        "tie_word_embeddings": True}


def _int(ex, got, what):
    if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral, np.integer)):
        raise fail(ex, f"{what}: you returned {got!r} ({type(got).__name__}); expected an int")
    return int(got)


# -------------------------------------------------------------- 10.1 the bytes of a decode step
def check_decode_step_bytes(fn) -> None:
    """Exercise 10.1: ``decode_step_bytes(config, batch, context, bytes_per_value=2)`` ->
    ``(weight_bytes, cache_bytes)``."""
    ex = "10.1"
    probes = [("Llama 3 8B", dict(MODELS["Llama 3 8B"]), 1, 8192, 2),
              ("Llama 3 70B", dict(MODELS["Llama 3 70B"]), 64, 32768, 2),
              ("a tiny model with tied embeddings", dict(TINY), 3, 100, 4)]
    for name, config, batch, context, width in probes:
        want = decode_step_cost(config, batch, context, width)
        got = call(ex, fn, (config, batch, context), ("config", "batch", "context"),
                   {"bytes_per_value": width}, forbid={ROOF: "count the bytes yourself"})
        if not (isinstance(got, tuple) and len(got) == 2):
            raise fail(ex, f"expected (weight_bytes, cache_bytes); got {type(got).__name__}")
        weights, cache = (_int(ex, g, f"for {name}") for g in got)
        sizes = model_sizes(config)
        h, g = config["num_attention_heads"], config["num_key_value_heads"]
        label = f"for {name}, batch {batch}, context {context:,}, {width} bytes a number"
        w_want, c_want = want["weight_bytes"], want["cache_bytes"]
        wrong_w = [(w_want + sizes["embedding"] * width * (0 if config.get(
                    "tie_word_embeddings") else 1),
                    "you counted the embedding table: a step reads only its tokens' rows of "
                    "it, and multiplies nothing by it (the output head is a separate matrix)"),
                   (w_want - sizes["norms"] * width, "you left out the RMSNorm weights (small, "
                    "but read every step)"),
                   (w_want * batch, "the weights are read once for the whole batch, not once "
                    "per sequence")]
        wrong_c = [(c_want * h // g, "you used num_attention_heads: the cache holds the K/V "
                    "heads, num_key_value_heads"),
                   (c_want // 2, "the cache holds a key AND a value per K/V head"),
                   (c_want // batch, "every sequence in the batch reads its own cache")]
        for got_, want_, wrong, what in ((weights, w_want, wrong_w, "weight_bytes"),
                                         (cache, c_want, wrong_c, "cache_bytes")):
            if got_ != want_:
                why = "; or ".join(m for v, m in wrong if v == got_ and v != want_)
                raise fail(ex, f"{what} {label}: you returned {got_:,}, expected {want_:,}"
                               + (f". Likely mistake: {why}" if why else ""))
    passed(ex, "weights read once, the cache per sequence, for Llama 3 8B and 70B and a tied "
               "tiny model")


# ------------------------------------------------------- 10.2 the critical batch, in closed form
def check_critical_batch(fn) -> None:
    """Exercise 10.2: ``critical_batch_formula(config, context, gpu)`` -> int or None."""
    ex = "10.2"
    gpu = GPUS["H100 SXM"]
    slow = {"flops_per_s": 50e12, "bytes_per_s": 2e12}  # a chip with a balance of 25
    probes = [("Llama 3 70B", MODELS["Llama 3 70B"], 1, gpu),
              ("Llama 3 70B", MODELS["Llama 3 70B"], 2048, gpu),
              ("Llama 3 70B", MODELS["Llama 3 70B"], 32768, gpu),
              ("Llama 3 8B", MODELS["Llama 3 8B"], 4096, slow),
              ("a tiny model", TINY, 700, slow)]
    for name, config, context, chip in probes:
        want = critical_batch(config, context, chip)
        got = call(ex, fn, (dict(config), context, dict(chip)), ("config", "context", "gpu"),
                   forbid={f"{ROOF}.critical_batch": "solve for the batch yourself"})
        label = (f"for {name} at context {context:,} on a chip of "
                 f"{chip['flops_per_s'] / chip['bytes_per_s']:.0f} FLOPs per byte")
        one = decode_step_cost(config, 1, context)
        balance = chip["flops_per_s"] / chip["bytes_per_s"]
        no_cache = math.ceil(balance * one["weight_bytes"] / one["flops"])
        cache_hint = "you left out the cache: its bytes grow with the batch too"
        if want is None:
            if got is not None:
                hint = f". Likely mistake: {cache_hint}" if got == no_cache else ""
                raise fail(ex, f"{label} no batch is compute-bound (the intensity levels off "
                               f"below the chip's balance), so return None; you returned "
                               f"{got!r}{hint}")
            continue
        if got is None:
            raise fail(ex, f"{label} you returned None; a batch of {want:,} is compute-bound")
        got = _int(ex, got, label)
        why = {no_cache: cache_hint,
               want - 1: "round up: the smallest integer batch at or above the solution",
               want + 1: "the smallest batch whose intensity reaches the balance, not exceeds it"}
        if got != want:
            hint = why.get(got)
            raise fail(ex, f"{label} you returned {got:,}, expected {want:,}"
                           + (f". Likely mistake: {hint}" if hint else ""))
    passed(ex, "batch = ⌈β·W / (F - β·C)⌉ or None, matching the roofline's bisection on 5 cases")


# ------------------------------------------------------------- 10.3 the best draft length
def check_best_draft_length(fn) -> None:
    """Exercise 10.3: ``best_draft_length(alpha, c, k_max=16)`` -> ``(k, speedup)``."""
    ex = "10.3"
    for alpha, c, k_max in ((0.8, 0.05, 16), (0.6, 0.2, 16), (0.9, 0.01, 12), (0.3, 0.5, 8),
                            (1.0, 0.1, 10)):
        factors = {k: improvement_factor(alpha, k, c) for k in range(1, k_max + 1)}
        k_best = max(factors, key=factors.get)
        got = call(ex, fn, (alpha, c), ("alpha", "c"), {"k_max": k_max},
                   forbid={"mha_course.serving.speculative.improvement_factor":
                           "write the speed-up yourself"})
        if not (isinstance(got, tuple) and len(got) == 2):
            raise fail(ex, f"expected (k, speedup); got {type(got).__name__}")
        k = _int(ex, got[0], f"k for alpha={alpha}, c={c}")
        label = f"for alpha={alpha}, c={c}, k_max={k_max}"
        if k != k_best:
            wrong = {max(range(1, k_max + 1), key=lambda j: (1 - alpha ** (j + 1)) / (1 - alpha)
                         if alpha < 1 else j + 1):
                     "you left out the draft's cost: each round also runs k draft steps, so "
                     "divide by k·c + 1",
                     max(range(1, k_max + 1), key=lambda j: ((1 - alpha ** j) / (1 - alpha)
                         if alpha < 1 else j) / (j * c + 1)):
                     "a round emits (1 - α^(k+1)) / (1 - α) tokens: the accepted drafts AND the "
                     "target's own token (a correction or the bonus)"}
            hint = wrong.get(k) if k != k_best else None
            raise fail(ex, f"{label} you chose k={k}, the best is k={k_best} (speed-up "
                           f"{fmt(factors[k_best])} against {fmt(factors.get(k, float('nan')))})"
                           + (f". Likely mistake: {hint}" if hint else ""))
        s = float(got[1])
        if not math.isclose(s, factors[k_best], rel_tol=1e-6):
            raise fail(ex, f"{label} the speed-up at k={k_best} is {fmt(factors[k_best])}; you "
                           f"returned {fmt(s)}")
    passed(ex, "the k that maximises (1 - α^(k+1)) / ((1 - α)(k·c + 1)), α = 1 included")


# ------------------------------------------------------------- 10.4 verifying a tree of drafts
def check_tree_verification(fn) -> None:
    """Exercise 10.4: ``tree_mask_and_positions(parents, n_cached)`` -> ``(mask, positions)``."""
    ex = "10.4"
    dec = Decoder.random(vocab=17, d_model=16, n_layers=2, h=4, n_kv_heads=2, rng=1005)
    rng = check_rng(1005)
    for parents, n_cached in (([-1, 0, 1], 5), ([-1, -1, 0, 0, 1], 7),
                              ([-1, 0, 0, 1, 2, -1, 5], 4)):
        N = len(parents)
        want_mask = np.concatenate([np.ones((N, n_cached), bool), tree_mask(parents)], axis=1)
        want_pos = n_cached - 1 + tree_depths(parents)
        got = call(ex, fn, (list(parents), n_cached), ("parents", "n_cached"),
                   forbid={"mha_course.serving.speculative": "build the tree's mask yourself"})
        if not (isinstance(got, tuple) and len(got) == 2):
            raise fail(ex, f"expected (mask, positions); got {type(got).__name__}")
        label = f"for parents {parents} over {n_cached} cached positions"
        causal = np.concatenate([np.ones((N, n_cached), bool), np.tril(np.ones((N, N), bool))],
                                axis=1)
        mask = compare(ex, got[0], want_mask, f"your mask {label}", "(N, n_cached + N)",
                       variants=[("a causal mask over the nodes lets a node see its siblings "
                                  "and their subtrees: a node sees the cache and its own "
                                  "ancestors only", lambda w=causal: w)])
        pos = as_array(ex, got[1], f"your positions {label}", want_pos.shape, "(N,)", "i")
        index_pos = n_cached + np.arange(N)
        if not np.array_equal(pos, want_pos):
            hint = ("a node's position is its depth after the cache, not its index in the list"
                    if np.array_equal(pos, index_pos) else
                    "the cache holds positions 0 .. n_cached - 1 (the last emitted token "
                    "included), so a child of the root sits at n_cached, depth 1 -> "
                    "n_cached - 1 + depth" if np.array_equal(pos, want_pos + 1) else None)
            raise fail(ex, f"your positions {label}: {pos.tolist()}, expected "
                           f"{want_pos.tolist()}" + (f". Likely mistake: {hint}" if hint else ""))
        _tree_equals_branches(ex, dec, rng, parents, n_cached, mask, pos, label)
    passed(ex, "with your mask and positions, one pass gives every branch's logits, each equal "
               "to verifying that branch alone")


class _LearnerTree(TreeView):
    """A read-only view of a cache plus the learner's tree mask and positions."""

    def __init__(self, cache, mask, positions):
        self.cache, self.mask, self.positions, self.length = cache, mask, positions, cache.length


def _tree_equals_branches(ex, dec, rng, parents, n_cached, mask, positions, label):
    context = rng.integers(0, dec.vocab, n_cached)
    nodes = rng.integers(0, dec.vocab, len(parents))
    cache = ContiguousCache(dec)
    dec.step(context, cache)
    rows = dec.step(nodes, _LearnerTree(cache, mask, positions))
    for j in range(len(parents)):
        path, i = [], j
        while i >= 0:
            path.insert(0, int(nodes[i]))
            i = parents[i]
        want = dec.forward(np.concatenate([context, path]))[-1]
        if not np.allclose(rows[j], want, rtol=1e-8, atol=1e-10):
            raise fail(ex, f"{label}: node {j}'s logits from the tree pass differ from verifying "
                           f"its branch {path} alone")


# ---------------------------------------------- 10.5 reload or recompute an offloaded cache
def _first(wins, largest: int = 1 << 40):
    """The smallest T in 1 .. largest with ``wins(T)`` (monotone: False, then True), or None."""
    if not wins(largest):
        return None
    lo, hi = 1, largest
    while lo < hi:
        mid = (lo + hi) // 2
        if wins(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _crossover_reference(config, gpu, link, width):
    """Reload (cache bytes / link) beats recompute (prefill FLOPs / peak) from this T on.

    Reload is linear in T, recompute linear plus the causal attention's T(T+1)/2 pairs, so the
    comparison turns once and stays: bisection finds the first T."""
    return _first(lambda T: cache_bytes(config, T, 1, width) / link
                  < prefill_cost(config, T, width)["flops"] / gpu["flops_per_s"])


def _crossover_variant(config, gpu, link, width, kv_factor=1.0, heads=None, pairs="causal"):
    """The crossover under a classic mistake (the cache's size, the pairs counted)."""
    L, h = config["num_hidden_layers"], config["num_attention_heads"]
    g = heads or config.get("num_key_value_heads", h)
    kv = 2 * L * g * head_dim(config) * width * kv_factor
    two_m = 2 * model_sizes(config)["matmul"]
    per_pair = 4 * L * h * head_dim(config)
    count = {"causal": lambda T: T * (T + 1) // 2, "square": lambda T: T * T,
             "none": lambda T: 0}[pairs]
    return _first(lambda T: kv * T / link < (two_m * T + per_pair * count(T)) / gpu["flops_per_s"])


def check_reload_crossover(fn) -> None:
    """Exercise 10.5: ``reload_crossover(config, gpu, link_bytes_per_s, bytes_per_value=2)`` ->
    the smallest prompt length at which reloading its cache beats recomputing it."""
    ex = "10.5"
    h100 = GPUS["H100 SXM"]
    slow_chip = {"flops_per_s": 1e12, "bytes_per_s": 1e11}
    probes = [("Llama 3 8B", MODELS["Llama 3 8B"], h100, 7.45e9, 2, "an NVMe SSD (7.45 GB/s)"),
              ("Llama 3 8B", MODELS["Llama 3 8B"], h100, 2e9, 2, "a 2 GB/s disk"),
              ("Llama 3 70B", MODELS["Llama 3 70B"], h100, 7.45e9, 2, "an NVMe SSD"),
              ("Llama 3 8B", MODELS["Llama 3 8B"], h100, 63e9, 2, "PCIe 5 x16 (63 GB/s)"),
              ("a tiny model", TINY, slow_chip, 1e8, 4, "a 0.1 GB/s link, fp32 cache")]
    for name, config, gpu, link, width, what in probes:
        want = _crossover_reference(config, gpu, link, width)
        got = call(ex, fn, (dict(config), dict(gpu), link), ("config", "gpu", "link_bytes_per_s"),
                   {"bytes_per_value": width},
                   forbid={f"{ROOF}.prefill_cost": "count the prefill's FLOPs yourself"})
        label = f"for {name} on {what}"
        if got is None:
            raise fail(ex, f"{label} you returned None; reload wins from T = {want:,} (the "
                           "attention's T(T+1)/2 pairs make recompute grow faster than any "
                           "reload, so there is always a crossover)")
        got = _int(ex, got, label)
        if got == want:
            continue
        hints = {
            _crossover_variant(config, gpu, link, width, pairs="none"):
                "you left out the attention's T(T+1)/2 query-key pairs (4·L·h·d_head FLOPs "
                "each): recompute grows as T², so a long enough prompt always reloads faster",
            _crossover_variant(config, gpu, link, width, pairs="square"):
                "a causal prefill has T(T+1)/2 query-key pairs, not T²",
            _crossover_variant(config, gpu, link, width, kv_factor=0.5):
                "the cache holds a key AND a value per K/V head, layer and token",
            _crossover_variant(config, gpu, link, width, heads=config["num_attention_heads"]):
                "the cache has num_key_value_heads heads (GQA), not num_attention_heads",
            want - 1: "return the first T at which reloading is faster, not the last at "
                      "which recomputing is",
        }
        hint = hints.get(got) if got != want else None
        raise fail(ex, f"{label} you returned T = {got:,}; reload beats recompute from "
                       f"T = {want:,}" + (f". Likely mistake: {hint}" if hint else ""))
    passed(ex, "the first prompt length at which reloading the cache beats recomputing it, on "
               "5 models and links")


# --------------------------------------------------------------- 10.6 a radix-tree prefix cache
def _lcp(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _radix_probes():
    rng = check_rng(1006)
    hand = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2], [7, 7, 7], [1, 2, 3, 4, 5, 6], [7, 7, 7],
            [1, 2, 3, 4]]
    probes = [("7 hand-written prompts (a split, a prefix of a prompt, a repeat)", hand)]
    for n, vocab in ((30, 6), (25, 40)):
        headers = [rng.integers(0, vocab, m).tolist() for m in (5, 9, 14)]
        prompts = [headers[int(rng.integers(3))] + rng.integers(0, vocab, int(rng.integers(0, 8)))
                   .tolist() for _ in range(n)]
        prompts = [p for p in prompts if p]
        probes.append((f"{len(prompts)} seeded prompts over a vocabulary of {vocab}", prompts))
    return probes


def check_radix_tree(fn) -> None:
    """Exercise 10.6: ``radix_insert_and_match(prompts)`` -> ``(reused, n_nodes)``."""
    ex = "10.6"
    for label, prompts in _radix_probes():
        cache = RadixCache()
        want = [cache.insert(p) for p in prompts]  # what each prompt found before its insert
        got = call(ex, fn, ([list(p) for p in prompts],), ("prompts",),
                   forbid={"mha_course.serving.radix_cache": "build the radix tree yourself"})
        if not (isinstance(got, tuple) and len(got) == 2):
            raise fail(ex, f"expected (reused, n_nodes); got {type(got).__name__}")
        reused = [_int(ex, r, f"reused for {label}") for r in list(got[0])]
        if reused != want:
            i = next((j for j, (a, b) in enumerate(zip(reused, want, strict=False)) if a != b),
                     min(len(reused), len(want)))
            wrong = {tuple(len(p) for p in prompts):
                     "match BEFORE you insert: a prompt always finds itself afterwards",
                     tuple([0] + [_lcp(p, q) for p, q in zip(prompts[1:], prompts, strict=False)]):
                     "the tree holds every earlier prompt, not only the last one: the longest "
                     "prefix shared with ANY of them"}
            hint = wrong.get(tuple(reused))
            shown = (f"prompt {i} ({prompts[i]}) found {reused[i]} tokens, expected {want[i]}"
                     if i < min(len(reused), len(want))
                     else f"{len(reused)} counts for {len(want)} prompts")
            raise fail(ex, f"for {label}: {shown}" + (f". Likely mistake: {hint}" if hint else ""))
        n_nodes = _int(ex, got[1], f"n_nodes for {label}")
        if n_nodes != cache.n_nodes:
            per_token = len({tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)})
            hint = ("edges carry RUNS of tokens: a chain of single-child nodes is one edge (that "
                    "is a trie, one node per token)" if n_nodes == per_token else
                    "a prompt that leaves an edge part-way, or ends inside it, splits that edge "
                    "into two nodes" if n_nodes < cache.n_nodes else None)
            raise fail(ex, f"for {label}: your tree has {n_nodes} nodes, a radix tree of these "
                           f"prompts has {cache.n_nodes} (the root not counted)"
                           + (f". Likely mistake: {hint}" if hint else ""))
    passed(ex, "the longest cached prefix of each prompt and the radix tree's node count, on 3 "
               "workloads")
