"""Checks for the exercises of lesson 07, FlashAttention on a CPU
(``solutions/07_flash_attention.ipynb``).

The lesson is ``notebooks/07_flash_attention.ipynb``; each ``check_*`` is called by an
exercise's check cell (see :mod:`mha_course.checks`). The references come from the package at
check time: :func:`mha_course.logsumexp` and :func:`mha_course.tiled_attention` (its
``return_lse``, which also gives every chunk's result for 07.6, and its ``on_tile`` report,
which counts the tiles the causal walk visits).
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import logsumexp, scaled_dot_product_attention, tiled_attention
from .harness import call, check_rng, compare, fail, fmt, fmt_shape, passed

__all__ = [
    "check_block_size_for_cache",
    "check_causal_tiles_skipped",
    "check_combine",
    "check_merge_chunks",
    "check_online_update",
    "check_tiled_one_head",
]


# ---------------------------------------------------------------------------------- 07.1
def _stats(x) -> tuple[float, float]:
    """(m, l) of scores x: their max and sum of exp(x - m), from the package's logsumexp."""
    x = np.asarray(x, dtype=float)
    if not np.isfinite(x).any():
        return -math.inf, 0.0
    m = float(x.max())
    return m, float(np.exp(logsumexp(x) - m))


def _pair(ex, got, what):
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        kind = f"a {type(got).__name__} of {len(got)}" if isinstance(got, (tuple, list)) \
            else type(got).__name__
        raise fail(ex, f"{what}: your function returned {kind}; expected a tuple (m, l)")
    try:
        return np.array([float(got[0]), float(got[1])])
    except (TypeError, ValueError):
        raise fail(ex, f"{what}: m and l must be numbers; got {got!r}") from None


def check_online_update(fn) -> None:
    """Exercise 07.1: ``online_update(m, l, x_block) -> (m_new, l_new)`` for one row."""
    ex = "07.1"
    rng = check_rng(701)
    row = rng.normal(size=11) * 3
    row[7] += 6  # a new maximum arrives in a later block
    probes = [  # (label, seen so far, new block)
        ("from the start (m = -inf, l = 0) with a block of 3", row[:0], row[:3]),
        ("after 3 scores, a block of 4 that raises the max", row[:3], row[3:7] + 5),
        ("after 7 scores, a block of 1", row[:7], row[7:8]),
        ("after 8 scores, a block whose max is below m", row[:8], row[8:] - 4),
        ("after 5 scores, a fully masked block (all -inf)", row[:5], np.full(3, -np.inf)),
        ("with scores near 1000 (exp(1000) overflows)", row[:4] + 1000, row[4:9] + 1000),
    ]
    for label, seen, block in probes:
        m, l_ = _stats(seen)
        want = np.array(_stats(np.concatenate([seen, block])))
        got = _pair(ex, call(ex, fn, (m, l_, block.copy()), ("m", "l", "x_block")), label)
        m_new = max(m, float(block.max()))
        compare(
            ex, got, want, f"your (m_new, l_new) {label}", "(m, l)",
            variants=[
                ("the old sum was not rescaled: when the max grows from m to m_new, multiply "
                 "l by exp(m - m_new) before adding the block's terms",
                 lambda m_new=m_new, l_=l_, block=block: (m_new, l_ + np.exp(block - m_new)
                                                          .sum())),
                ("the rescaling factor is upside down: it is exp(m - m_new) <= 1, not "
                 "exp(m_new - m)",
                 lambda m=m, m_new=m_new, l_=l_, block=block: (
                     m_new, l_ * np.exp(m_new - m) + np.exp(block - m_new).sum())),
                ("the block's terms use the old max: compute exp(x_block - m_new) with the new "
                 "max m_new = max(m, max(x_block))",
                 lambda m=m, m_new=m_new, l_=l_, block=block: (
                     m_new, l_ * np.exp(m - m_new) + np.exp(block - m).sum())),
                ("m_new must be the max of the old m and the block's max, not the block's "
                 "max alone", lambda m=m, l_=l_, block=block: (
                     float(block.max()), l_ * np.exp(m - block.max())
                     + np.exp(block - block.max()).sum())),
            ],
            nan_message=("exp(-inf - (-inf)) is NaN: at the start m = -inf, so the rescale "
                         "factor must be exp(m - m_new) with m_new finite; for a fully masked "
                         "block, m_new = m and exp(-inf - m) = 0 is fine")
            if not np.isfinite(block).all() or m == -math.inf else
            ("an exp overflowed: subtract the new max before exp, exp(x_block - m_new) "
             "<= 1"),
        )
    # The update applied block by block gives the softmax of the whole row.
    m, l_ = -math.inf, 0.0
    for s0 in range(0, len(row), 4):
        m, l_ = _pair(ex, call(ex, fn, (m, l_, row[s0 : s0 + 4].copy()), ("m", "l", "x_block")),
                      f"block {s0 // 4 + 1} of the row")
    compare(ex, np.array([m, l_]), np.array(_stats(row)),
            "your (m, l) after updating block by block over a row of 11 scores", "(m, l)")
    passed(ex, "6 single updates (start, new max, block of 1, masked block, scores near "
               "1000) match mha_course.logsumexp; blocks of 4 over a row of 11 give its "
               "softmax's m and l")


# ---------------------------------------------------------------------------------- 07.2
def _partial(q, k, v, keep):
    """(m, l, acc) of each query over the keys in `keep` (bool (T, S)), from the package."""
    scores = q @ k.T / math.sqrt(q.shape[-1])
    out, lse = tiled_attention(q, k, v, mask=keep, block_size=4, return_lse=True)
    m = np.where(keep, scores, -np.inf).max(axis=-1)  # (T,)
    l_ = np.where(np.isfinite(m), np.exp(lse - np.where(np.isfinite(m), m, 0.0)), 0.0)
    return m, l_, out * l_[:, None]


def check_combine(fn) -> None:
    """Exercise 07.2: ``combine(a, b) -> (m, l, acc)`` of two partial results."""
    ex = "07.2"
    rng = check_rng(702)
    for T, S, d_k, d_v, split in ((3, 7, 4, 5, 3), (5, 6, 2, 2, 4)):
        q, k, v = rng.normal(size=(T, d_k)) * 2, rng.normal(size=(S, d_k)), \
            rng.normal(size=(S, d_v))
        first = np.zeros((T, S), dtype=bool)
        first[:, :split] = True
        first[0, :] = True  # query 0: every key in part a, none in part b
        a = _partial(q, k, v, first)
        b = _partial(q, k, v, ~first)
        want_m, want_l, want_acc = _partial(q, k, v, np.ones((T, S), dtype=bool))
        label = f"for T={T} queries, d_v={d_v}"
        got = call(ex, fn, (a, b), ("a", "b"))
        if not isinstance(got, (tuple, list)) or len(got) != 3:
            raise fail(ex, f"your function returned {type(got).__name__}; expected a tuple "
                           "(m, l, acc)")
        (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
        m = np.maximum(m_a, m_b)
        ca, cb = np.exp(m_a - m), np.exp(m_b - m)
        compare(ex, got[0], want_m, f"your m {label}", "(T,)",
                variants=[("m is the larger of the two maxima: np.maximum(m_a, m_b)",
                           lambda m_a=m_a, m_b=m_b: np.minimum(m_a, m_b))])
        compare(ex, got[1], want_l, f"your l {label}", "(T,)",
                variants=[
                    ("the sums were added without rescaling: each part's l is relative to its "
                     "own max; multiply l_a by exp(m_a - m) and l_b by exp(m_b - m) first",
                     lambda l_a=l_a, l_b=l_b: l_a + l_b),
                    ("the rescaling factors are upside down: exp(m_a - m) <= 1, not "
                     "exp(m - m_a)", lambda l_a=l_a, l_b=l_b, ca=ca, cb=cb: l_a / ca + l_b / cb),
                ])
        compare(ex, got[2], want_acc, f"your acc {label}", "(T, d_v)",
                variants=[
                    ("acc was added without rescaling: acc_a and acc_b are relative to their "
                     "own maxima like l; multiply each by its factor (as a column: c[:, None])",
                     lambda acc_a=acc_a, acc_b=acc_b: acc_a + acc_b),
                    ("you normalised acc: keep it unnormalised (Σ exp(x - m) v); the division "
                     "by l happens once, at the very end",
                     lambda acc_a=acc_a, acc_b=acc_b, ca=ca, cb=cb, l_a=l_a, l_b=l_b: (
                         (acc_a * ca[:, None] + acc_b * cb[:, None])
                         / (l_a * ca + l_b * cb)[:, None])),
                ],
                shape_hints={(d_v, T): "acc keeps the shape (T, d_v) of its inputs"})
        compare(ex, np.asarray(got[2]) / np.asarray(got[1])[:, None],
                scaled_dot_product_attention(q, k, v)[0], f"your acc / l {label}", "(T, d_v)")
    passed(ex, "two splits (T=3, d_v=5 and T=5, d_v=2; one query with no key in part b) "
               "combine to the (m, l, acc) of all keys; acc / l is attention's output")


# ---------------------------------------------------------------------------------- 07.3
def _tiled_variant(q, k, v, block, rescale_acc=True, rescale_l=True, scale=True,
                   last_block=True, divide=True):
    T, d_k = q.shape
    S = k.shape[0]
    out = np.empty((T, v.shape[-1]))
    stop = S if last_block else S - S % block if S % block else S
    for t0 in range(0, T, block):
        qb = q[t0 : t0 + block] / (math.sqrt(d_k) if scale else 1.0)
        m = np.full(len(qb), -np.inf)
        l_ = np.zeros(len(qb))
        acc = np.zeros((len(qb), v.shape[-1]))
        for s0 in range(0, stop, block):
            x = qb @ k[s0 : s0 + block].T
            m_new = np.maximum(m, x.max(axis=-1))
            p = np.exp(x - m_new[:, None])
            alpha = np.exp(m - m_new)
            l_ = (l_ * alpha if rescale_l else l_) + p.sum(axis=-1)
            acc = (acc * alpha[:, None] if rescale_acc else acc) + p @ v[s0 : s0 + block]
            m = m_new
        out[t0 : t0 + block] = acc / l_[:, None] if divide else acc
    return out


#: Exercise 07.3 asks for the tile loop itself: no library attention or softmax may do it.
_OWN_TILED = dict.fromkeys(
    ["mha_course.tiled_attention", "mha_course.scaled_dot_product_attention",
     "mha_course.softmax", "scipy.special.softmax", "torch"],
    "write the tile loop yourself",
)


def check_tiled_one_head(fn) -> None:
    """Exercise 07.3: ``tiled_one_head(q, k, v, block)`` -> (T, d_v), no (T, S) array."""
    ex = "07.3"
    rng = check_rng(703)
    for T, S, d_k, d_v, block in ((7, 10, 4, 3, 3), (12, 5, 6, 2, 4), (9, 9, 5, 4, 9),
                                  (4, 6, 3, 5, 1)):
        q, k, v = (rng.normal(size=(T, d_k)) * 1.5, rng.normal(size=(S, d_k)),
                   rng.normal(size=(S, d_v)))
        want = tiled_attention(q, k, v, block_size=block)
        label = f"for q {fmt_shape(q.shape)}, k {fmt_shape(k.shape)}, block={block}"
        got = call(ex, fn, (q, k, v, block), ("q", "k", "v", "block"), forbid=_OWN_TILED)
        compare(
            ex, got, want, f"your output {label}", "(T, d_v)",
            variants=[
                ("acc was not rescaled when the max grew: multiply acc by "
                 "alpha = exp(m_old - m_new) (as a column) before adding p @ v",
                 lambda a=(q, k, v, block): _tiled_variant(*a, rescale_acc=False)),
                ("l was not rescaled when the max grew: l = alpha * l + p.sum(axis=-1)",
                 lambda a=(q, k, v, block): _tiled_variant(*a, rescale_l=False)),
                ("scores not scaled by √d_k: divide q (or each tile) by sqrt(d_k)",
                 lambda a=(q, k, v, block): _tiled_variant(*a, scale=False)),
                ("the last, shorter key block is missing: range(0, S, block) with slices "
                 "k[s0:s0 + block] covers the tail",
                 lambda a=(q, k, v, block): _tiled_variant(*a, last_block=False)),
                ("the output was not divided by l at the end: out = acc / l",
                 lambda a=(q, k, v, block): _tiled_variant(*a, divide=False)),
            ],
        )
    # Memory: a (T, S) float64 array would be 2 MiB here; the loop should hold far less.
    n, block = 512, 32
    q, k, v = (rng.normal(size=(n, 16)) for _ in range(3))
    measure: dict = {}
    call(ex, fn, (q, k, v, block), ("q", "k", "v", "block"), measure=measure)
    peak = measure["peak"]
    full = n * n * 8
    if peak >= full / 2:
        raise fail(ex, f"at T = S = {n}, block={block} your function held {fmt(peak / 2**20)} "
                       f"MiB at its peak, at least half of one (T, S) array ({fmt(full / 2**20)}"
                       " MiB). Likely mistake: you computed all the scores at once; compute one "
                       "(block, block) tile at a time inside the loop over key blocks")
    passed(ex, "4 shapes (T != S, block 1, a block as large as S, blocks that do not divide S) "
               "match mha_course.tiled_attention; at T = S = 512 the peak memory stays below "
               "half of one (T, S) array")


# ---------------------------------------------------------------------------------- 07.4
def _visited(T, S, block, causal=True) -> int:
    seen = []
    tiled_attention(np.zeros((T, 1)), np.zeros((S, 1)), np.zeros((S, 1)), causal=causal,
                    block_size=block, on_tile=seen.append)
    return len(seen)


def check_causal_tiles_skipped(fn) -> None:
    """Exercise 07.4: ``causal_tiles_skipped(T, S, block)`` -> int."""
    ex = "07.4"
    probes = [(8, 8, 2), (1024, 1024, 128), (1000, 1000, 128), (256, 1024, 128), (10, 3, 4),
              (7, 7, 7), (5, 5, 1)]
    for T, S, block in probes:
        n_q, n_k = -(-T // block), -(-S // block)
        want = n_q * n_k - _visited(T, S, block)  # the package's walk, counted
        got = call(ex, fn, (T, S, block), ("T", "S", "block"))
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral,
                                                                      np.integer)):
            raise fail(ex, f"for T={T}, S={S}, block={block} you returned {got!r} "
                           f"({type(got).__name__}); expected an int")
        if got == want:
            continue
        nb = n_q
        guesses = {
            n_q * n_k - want: "you returned the tiles visited; the task asks for the tiles "
                              "skipped (all tiles minus visited)",
            nb * (nb - 1) // 2: "nb·(nb-1)/2 assumes T = S with square blocks; count per "
                                "query block instead, with the bottom-right alignment",
            n_q * n_k - _visited_top_left(T, S, block): "you aligned the causal mask top-left "
                              "(query t sees keys s <= t); the package aligns it bottom-right: "
                              "query t sees keys s <= t + (S - T)",
        }
        hint = guesses.get(int(got)) if got != want else None
        raise fail(ex, f"for T={T}, S={S}, block={block} you returned {got}; the causal walk "
                       f"skips {want} of {n_q * n_k} tiles"
                       + (f". Likely mistake: {hint}" if hint else ""))
    passed(ex, "T = S (blocks that divide and do not), T < S, T > S, one tile and block 1: "
               "the skipped tiles match tiled_attention's causal walk")


def _visited_top_left(T, S, block) -> int:
    return sum(min(-(-S // block), -(-min(t0 + block, T) // block))
               for t0 in range(0, T, block))


# ---------------------------------------------------------------------------------- 07.5
def _working_set(block, h, d_k, d_v, dtype) -> int:
    """Bytes of the arrays one tile step touches, from the arrays themselves."""
    shapes = [(h, block, block), (h, block, d_k), (h, block, d_k), (h, block, d_v),
              (h, block, d_v)]  # scores, q block, k block, v block, acc
    return sum(np.empty(s, dtype=dtype).nbytes for s in shapes)


def check_block_size_for_cache(fn) -> None:
    """Exercise 07.5: ``block_size_for_cache(cache_bytes, h, d_k, d_v, itemsize)`` -> int."""
    ex = "07.5"
    dtypes = {2: np.float16, 4: np.float32, 8: np.float64}
    probes = [(2 * 2**20, 8, 64, 64, 4), (2 * 2**20, 8, 64, 64, 8), (256 * 2**10, 1, 64, 64, 4),
              (32 * 2**20, 32, 128, 128, 2), (48 * 2**10, 4, 16, 8, 8), (100, 8, 64, 64, 4)]
    for cache, h, d_k, d_v, itemsize in probes:
        dtype = dtypes[itemsize]
        want = 1
        while _working_set(2 * want, h, d_k, d_v, dtype) <= cache:
            want *= 2
        got = call(ex, fn, (cache, h, d_k, d_v, itemsize),
                   ("cache_bytes", "h", "d_k", "d_v", "itemsize"))
        if isinstance(got, (bool, np.bool_)) or not isinstance(got, (numbers.Integral,
                                                                      np.integer)):
            raise fail(ex, f"you returned {got!r} ({type(got).__name__}); expected an int")
        if got == want:
            continue
        label = (f"for a {cache:,}-byte cache, h={h}, d_k={d_k}, d_v={d_v}, itemsize="
                 f"{itemsize}")
        hints = []
        if got == 2 * want:
            hints.append(f"block {got} needs {_working_set(got, h, d_k, d_v, dtype):,} bytes, "
                         "more than the cache: return the largest power of two that FITS")
        if got & (got - 1):
            hints.append("the block must be a power of two (1, 2, 4, ...)")
        if _working_set(got, 1, d_k, d_v, dtype) <= cache < _working_set(got, h, d_k, d_v,
                                                                           dtype):
            hints.append("every head's tile is in the working set: multiply by h")
        raise fail(ex, f"{label} you returned {got}; expected {want} (its working set is "
                       f"{_working_set(want, h, d_k, d_v, dtype):,} bytes)"
                       + (f". Likely mistake: {hints[0]}" if hints else ""))
    passed(ex, "6 caches and shapes (2, 4 and 8 bytes per number, 1 to 32 heads, a cache too "
               "small for any tile) give the largest power-of-two block whose working set fits")


# ---------------------------------------------------------------------------------- 07.6
def _chunk_results(q, k, v, mask, starts):
    """(outs (C, T, d_v), lses (C, T)) of attention over each chunk of the keys, and the whole
    (out, lse), all from :func:`mha_course.tiled_attention` with ``return_lse=True``."""
    bounds = [*starts, k.shape[0]]
    parts = [tiled_attention(q, k[s0:s1], v[s0:s1], mask=mask[:, s0:s1], return_lse=True)
             for s0, s1 in zip(bounds[:-1], bounds[1:], strict=True)]
    whole = tiled_attention(q, k, v, mask=mask, return_lse=True)
    return np.stack([o for o, _ in parts]), np.stack([lse for _, lse in parts]), whole


def _merge_variant(outs, lses, weights="right", lse="right"):
    """Known wrong merges, for the messages (computed with NumPy warnings off by the caller)."""
    m = np.where(np.isfinite(lses.max(axis=0)), lses.max(axis=0), 0.0)
    w = np.exp(lses - m)
    total = w.sum(axis=0)
    right_lse = m + np.log(total)
    lse_out = {"right": right_lse, "max": lses.max(axis=0), "sum": lses.sum(axis=0),
               "unshifted": np.log(np.exp(lses).sum(axis=0))}[lse]
    share = {"right": w / np.where(total > 0, total, 1.0), "equal": np.full_like(w, 1 / len(w)),
             "unnormalised": np.exp(lses), "unscaled": w}[weights]
    return (share[..., None] * outs).sum(axis=0), lse_out


def check_merge_chunks(fn) -> None:
    """Exercise 07.6: ``merge_chunks(outs, lses) -> (out, lse)`` of the whole key range."""
    ex = "07.6"
    rng = check_rng(706)
    # (T, S, d_k, d_v, chunk starts, score scale, what is special)
    probes = [(2, 10, 4, 5, (0, 4, 7), 1.0, "3 chunks"),
              (5, 12, 3, 2, (0, 3, 6, 9), 1.5, "4 chunks; query 1 has no key in chunk 2"),
              (1, 9, 6, 4, (0, 5), 3000.0, "one query (decoding), scores so large that "
                                           "exp(lse) overflows"),
              (3, 8, 5, 2, (0, 2, 4, 6), 1.0, "query 2 has no allowed key in any chunk")]
    for T, S, d_k, d_v, starts, scale, label in probes:
        q = rng.normal(size=(T, d_k)) * scale
        k, v = rng.normal(size=(S, d_k)), rng.normal(size=(S, d_v))
        mask = np.ones((T, S), dtype=bool)
        if "chunk 2" in label:
            mask[1, starts[2]:starts[3]] = False
        if "any chunk" in label:
            mask[2] = False
        outs, lses, (want_out, want_lse) = _chunk_results(q, k, v, mask, starts)
        got = call(ex, fn, (outs, lses), ("outs", "lses"))
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            kind = f"a {type(got).__name__} of {len(got)}" if isinstance(got, (tuple, list)) \
                else type(got).__name__
            raise fail(ex, f"your function returned {kind}; expected a tuple (out, lse)")
        what = f"for {len(starts)} chunks of S={S} keys, T={T}, d_v={d_v} ({label})"
        nan = ("a query with no allowed key in any chunk has every lse_i = -inf: its lse is "
               "-inf and its output 0. Shifting by a max of -inf gives -inf - (-inf) = NaN, so "
               "shift such a query by 0" if "any chunk" in label else
               "an exp overflowed: shift by the largest lse_i before exp (lse = m + log "
               "sum exp(lse_i - m))")
        for part, name in ((got[1], "lse"), (got[0], "out")):
            try:
                arr = np.asarray(part, dtype=float)
            except (TypeError, ValueError):
                continue  # not numbers: compare() below says so
            if np.isnan(arr).any():
                raise fail(ex, f"your {name} {what} holds NaN. Likely mistake: {nan}")
        compare(ex, got[1], want_lse, f"your lse {what}", "(T,)", nan_message=nan, variants=[
            ("the lse of all the keys is log(sum_i exp(lse_i)), not the largest lse_i",
             lambda o=outs, s=lses: _merge_variant(o, s, lse="max")[1]),
            ("each lse_i is the log of a sum: merge them with a log-sum-exp, not by adding "
             "them", lambda o=outs, s=lses: _merge_variant(o, s, lse="sum")[1]),
            ("exp(lse_i) overflowed: shift by the largest lse_i first, lse = m + log "
             "sum exp(lse_i - m)", lambda o=outs, s=lses: _merge_variant(o, s, lse="unshifted")[1]),
        ], shape_hints={(len(starts),): "lse has one number per query, (T,), not one per chunk",
                        lses.shape: "lse has one number per query, (T,), not one per chunk "
                                    "and query: merge over the chunk axis"})
        compare(ex, got[0], want_out, f"your out {what}", "(T, d_v)", nan_message=nan,
                variants=[
                    ("the chunks were weighted equally: chunk i's weight is exp(lse_i - lse), "
                     "its share of the whole sum", lambda o=outs, s=lses: _merge_variant(
                         o, s, weights="equal")[0]),
                    ("the weights exp(lse_i) were not normalised: divide by their sum "
                     "(weight_i = exp(lse_i - lse)), and shift by the largest lse_i first",
                     lambda o=outs, s=lses: _merge_variant(o, s, weights="unnormalised")[0]),
                    ("the weights exp(lse_i - m) do not add up to 1: divide them by their sum",
                     lambda o=outs, s=lses: _merge_variant(o, s, weights="unscaled")[0]),
                ],
                shape_hints={(len(starts), T, d_v): "sum over the chunk axis: out is (T, d_v)"})
    passed(ex, "3 and 4 chunks, a query with no key in one chunk or in all, and scores so large "
               "that exp(lse) overflows: (out, lse) equal one tiled_attention call over all keys")
