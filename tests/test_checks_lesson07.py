"""The checks of lesson 07: each passes a right answer and names each classic wrong one.

The generic contract (a right answer passes with one stable line, the stub's
``NotImplementedError`` passes through as "not attempted", ``None`` and an unexpected
exception fail) is bound to lesson 07's right answers, :data:`CORRECT_07`, by
:class:`TestContract` here (``tests/check_contract.py``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from check_contract import CheckContract

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed, lesson07

# ------------------------------------------------------------------ correct implementations


def _online_update(m, l, x_block):
    m_new = max(m, float(np.max(x_block)))
    return m_new, l * math.exp(m - m_new) + float(np.exp(x_block - m_new).sum())


def _combine(a, b, rescale_l=True, rescale_acc=True, normalise=False):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = np.maximum(m_a, m_b)
    c_a, c_b = np.exp(m_a - m), np.exp(m_b - m)
    l = l_a * c_a + l_b * c_b if rescale_l else l_a + l_b
    acc = acc_a * c_a[:, None] + acc_b * c_b[:, None] if rescale_acc else acc_a + acc_b
    return m, l, acc / l[:, None] if normalise else acc


def _whole_matrix(q, k, v, block):  # the whole (T, S) matrix at once, with the package
    return mha_course.softmax(q @ k.T / math.sqrt(q.shape[-1])) @ v


def _tiled(q, k, v, block, rescale_acc=True, scale=True, tail=True):
    T, d_k = q.shape
    S, d_v = v.shape
    out = np.empty((T, d_v))
    stop = S if tail or S % block == 0 else S - S % block
    for t0 in range(0, T, block):
        qb = q[t0 : t0 + block] / (math.sqrt(d_k) if scale else 1.0)
        m, l, acc = np.full(len(qb), -np.inf), np.zeros(len(qb)), np.zeros((len(qb), d_v))
        for s0 in range(0, stop, block):
            x = qb @ k[s0 : s0 + block].T
            m_new = np.maximum(m, x.max(axis=-1))
            p = np.exp(x - m_new[:, None])
            alpha = np.exp(m - m_new)
            l = l * alpha + p.sum(axis=-1)
            acc = (acc * alpha[:, None] if rescale_acc else acc) + p @ v[s0 : s0 + block]
            m = m_new
        out[t0 : t0 + block] = acc / l[:, None]
    return out


def _causal_visited(T, S, block, top_left=False):
    visited = 0
    for t0 in range(0, T, block):
        t1 = min(t0 + block, T)
        last = min(S, t1 if top_left else t1 + (S - T))
        visited += -(-max(last, 0) // block)
    return visited


def _causal_skipped(T, S, block):
    return -(-T // block) * -(-S // block) - _causal_visited(T, S, block)


def _block_for_cache(cache, h, d_k, d_v, itemsize, heads=True, overshoot=False):
    def ws(b):
        return itemsize * (h if heads else 1) * (b * b + 2 * b * d_k + 2 * b * d_v)

    b = 1
    while ws(2 * b) <= cache:
        b *= 2
    return 2 * b if overshoot else b


def _merge(outs, lses, weights="right", lse="right"):
    m = lses.max(axis=0)
    m = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(lses - m)
    total = w.sum(axis=0)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        lse_out = {"right": m + np.log(total), "max": lses.max(axis=0),
                   "sum": lses.sum(axis=0), "unshifted": np.log(np.exp(lses).sum(axis=0))}[lse]
        share = {"right": w / np.where(total > 0, total, 1.0),
                 "equal": np.full_like(w, 1 / len(w)), "unnormalised": np.exp(lses),
                 "unscaled": w}[weights]
        return (share[..., None] * outs).sum(axis=0), lse_out


def _merge_nan_on_empty(outs, lses):  # shifts by a max of -inf: NaN for a query with no key
    with np.errstate(all="ignore"):
        m = lses.max(axis=0)
        w = np.exp(lses - m)
        return (w / w.sum(axis=0))[..., None].__mul__(outs).sum(axis=0), m + np.log(w.sum(0))


CORRECT_07 = {
    "07.1": ("check_online_update", _online_update),
    "07.2": ("check_combine", _combine),
    "07.3": ("check_tiled_one_head", _tiled),
    "07.4": ("check_causal_tiles_skipped", _causal_skipped),
    "07.5": ("check_block_size_for_cache", _block_for_cache),
    "07.6": ("check_merge_chunks", _merge),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson07, CORRECT_07


def _check(name):
    return getattr(checks, name)


def _no_rescale(m, l, x_block):
    m_new = max(m, float(np.max(x_block)))
    return m_new, l + float(np.exp(x_block - m_new).sum())


def _upside_down(m, l, x_block):
    m_new = max(m, float(np.max(x_block)))
    return m_new, l * math.exp(m_new - m) + float(np.exp(x_block - m_new).sum())


def _old_max_terms(m, l, x_block):
    m_new = max(m, float(np.max(x_block)))
    with np.errstate(all="ignore"):
        return m_new, l * math.exp(m - m_new) + float(np.exp(x_block - m).sum())


def _no_shift(m, l, x_block):  # no max at all: exp of raw scores (m is ignored, l absolute)
    with np.errstate(all="ignore"):
        m_new = max(m, float(np.max(x_block)))
        return m_new, l + float(np.exp(x_block).sum())


MISTAKES = [
    ("update-no-rescale", "check_online_update", _no_rescale, r"old sum was not rescaled"),
    ("update-upside-down", "check_online_update", _upside_down, r"upside down"),
    ("update-old-max", "check_online_update", _old_max_terms, r"block's terms use the old max"),
    ("update-block-max-only", "check_online_update",
     lambda m, l, x: _online_update(-math.inf, 0.0, x) if l == 0 else
     (float(np.max(x)), l * math.exp(m - np.max(x)) + float(np.exp(x - np.max(x)).sum())),
     r"not the block's max alone"),
    ("update-no-shift", "check_online_update", _no_shift, r"Exercise 07.1: your \(m_new"),
    ("combine-no-rescale", "check_combine", lambda a, b: _combine(a, b, rescale_l=False),
     r"sums were added without rescaling"),
    ("combine-acc-no-rescale", "check_combine", lambda a, b: _combine(a, b, rescale_acc=False),
     r"acc was added without rescaling"),
    ("combine-min", "check_combine",
     lambda a, b: (np.minimum(a[0], b[0]), *_combine(a, b)[1:]), r"larger of the two maxima"),
    ("combine-normalised", "check_combine", lambda a, b: _combine(a, b, normalise=True),
     r"you normalised acc"),
    ("combine-buggy-from-the-task", "check_combine",
     lambda a, b: (np.maximum(a[0], b[0]), a[1] + b[1], a[2] + b[2]),
     r"sums were added without rescaling"),
    ("tiled-acc-no-rescale", "check_tiled_one_head",
     lambda q, k, v, block: _tiled(q, k, v, block, rescale_acc=False), r"acc was not rescaled"),
    ("tiled-unscaled", "check_tiled_one_head",
     lambda q, k, v, block: _tiled(q, k, v, block, scale=False), r"not scaled by √d_k"),
    ("tiled-missing-tail", "check_tiled_one_head",
     lambda q, k, v, block: _tiled(q, k, v, block, tail=False), r"last, shorter key block"),
    ("tiled-whole-matrix", "check_tiled_one_head", _whole_matrix,
     r"asks you to write the tile loop yourself; your answer calls mha_course.softmax"),
    ("tiled-calls-the-package", "check_tiled_one_head",
     lambda q, k, v, block: mha_course.tiled_attention(q, k, v, block_size=block),
     r"your answer calls mha_course.tiled_attention"),
    ("causal-visited-not-skipped", "check_causal_tiles_skipped", _causal_visited,
     r"you returned the tiles visited"),
    ("causal-top-left", "check_causal_tiles_skipped",
     lambda T, S, block: -(-T // block) * -(-S // block)
     - _causal_visited(T, S, block, top_left=True), r"aligned the causal mask top-left"),
    ("causal-square-formula", "check_causal_tiles_skipped",
     lambda T, S, block: (-(-T // block)) * (-(-T // block) - 1) // 2,
     r"nb·\(nb-1\)/2 assumes T = S"),
    ("block-overshoot", "check_block_size_for_cache",
     lambda *a: _block_for_cache(*a, overshoot=True), r"largest power of two that FITS"),
    ("block-one-head", "check_block_size_for_cache",
     lambda *a: _block_for_cache(*a, heads=False), r"multiply by h"),
    ("merge-equal-weights", "check_merge_chunks",
     lambda o, s: _merge(o, s, weights="equal"), r"chunks were weighted equally"),
    ("merge-unnormalised", "check_merge_chunks",
     lambda o, s: _merge(o, s, weights="unnormalised"), r"weights exp\(lse_i\) were not normal"),
    ("merge-weights-not-summing-to-one", "check_merge_chunks",
     lambda o, s: _merge(o, s, weights="unscaled"), r"do not add up to 1"),
    ("merge-lse-max", "check_merge_chunks", lambda o, s: _merge(o, s, lse="max"),
     r"not the largest lse_i"),
    ("merge-lse-sum", "check_merge_chunks", lambda o, s: _merge(o, s, lse="sum"),
     r"not by adding them"),
    ("merge-lse-overflows", "check_merge_chunks", lambda o, s: _merge(o, s, lse="unshifted"),
     r"exp\(lse_i\) overflowed"),
    ("merge-nan-for-a-query-with-no-key", "check_merge_chunks", _merge_nan_on_empty,
     r"no allowed key in any chunk.*shift such a query by 0"),
    ("merge-per-chunk-lse", "check_merge_chunks", lambda o, s: (_merge(o, s)[0], s),
     r"one number per query"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_check_names_the_likely_mistake(check, wrong, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        _check(check)(wrong)
    assert str(info.value).startswith("Exercise 07.")
    assert capsys.readouterr().out == ""


def test_the_whole_matrix_fails_on_memory_even_without_a_forbidden_call(capsys):
    def full_scores(q, k, v, block):  # numpy only: the (T, S) scores at once
        s = q @ k.T / math.sqrt(q.shape[-1])
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        return (p / p.sum(axis=-1, keepdims=True)) @ v

    with pytest.raises(CheckFailed, match=r"computed all the scores at once"):
        checks.check_tiled_one_head(full_scores)


def test_the_block_size_check_reports_a_non_power_of_two(capsys):
    with pytest.raises(CheckFailed, match=r"must be a power of two"):
        checks.check_block_size_for_cache(lambda *a: _block_for_cache(*a) + 3)
