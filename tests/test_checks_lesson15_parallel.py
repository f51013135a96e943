"""Lesson 15's drill, attention across devices and packed rows from lesson 11 (15.22 to
15.24, :mod:`mha_course.checks.drill.parallel`): each known wrong fix is named.

The broken functions and the solutions come from ``solutions/15_interview_drill.ipynb``
through ``tests/drill_cells.py``; the drill's contract (each broken function fails naming
the property it breaks, each solution passes, the stub is "not attempted") is tested once,
over all 26 exercises, by ``tests/test_checks_drill.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mha_course
from mha_course import checks
from mha_course.checks import CheckFailed


# ---------------------------------------------------------------------- the named wrong fixes
def _terms(concat_shards, W_o_shards):
    return [c @ W for c, W in zip(concat_shards, W_o_shards, strict=True)]


def _row_no_all_reduce(cluster, cs, ws, b_o):
    return [t + b_o for t in _terms(cs, ws)]


def _row_average(cluster, cs, ws, b_o):
    return [s / cluster.p + b_o for s in cluster.all_reduce(_terms(cs, ws))]


def _row_gather_everything(cluster, cs, ws, b_o):
    concat, W_o = cluster.all_gather(cs, axis=1), cluster.all_gather(ws, axis=0)
    return [c @ w + b_o for c, w in zip(concat, W_o, strict=True)]


def _packed(layer, x, lengths, reset, block):
    total = x.shape[0]
    doc = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)])[doc]
    pos = np.arange(total) - starts if reset else np.arange(total)
    mask = mha_course.causal_mask(total)
    if block:
        mask = mask & (doc[:, None] == doc[None, :])
    return layer(x + mha_course.sinusoidal_positions(total, layer.d_model)[pos], mask=mask)[0]


def _merge(out_a, a, out_b, b, how):
    if how != "base2":
        a, b = a * np.log(2), b * np.log(2)
    with np.errstate(all="ignore"):
        if how == "added":
            lse = a + b
        elif how == "log1p":
            lse = a + np.log(1 + np.exp(b - a))
        elif how == "base2":  # base 2 throughout: the output is right, lse stays base 2
            lse = np.logaddexp2(a, b)
            return (np.exp2(a - lse)[:, None] * out_a + np.exp2(b - lse)[:, None] * out_b), lse
        return np.exp(a - lse)[:, None] * out_a + np.exp(b - lse)[:, None] * out_b, lse


WRONG_FIXES = [
    ("row-no-all-reduce", "check_row_parallel_bias", _row_no_all_reduce,
     r"the all-reduce is gone.*sglang PR #14811"),
    ("row-average", "check_row_parallel_bias", _row_average, r"averaging the sum"),
    ("row-gather-everything", "check_row_parallel_bias", _row_gather_everything,
     r"property violated: one all-reduce of the \(T, d_model\) output"),
    ("row-package-layer", "check_row_parallel_bias",
     lambda c, cs, ws, b: mha_course.parallel.tensor.TensorParallelAttention(None, 1),
     r"asks you to fix the row-parallel projection yourself"),
    ("packed-reset-only", "check_packed_documents",
     lambda layer, x, lengths: _packed(layer, x, lengths, True, False),
     r"packed documents are independent.*restarting the positions is half the fix"),
    ("packed-mask-only", "check_packed_documents",
     lambda layer, x, lengths: _packed(layer, x, lengths, False, True),
     r"equals the document run alone.*the block-diagonal mask is half the fix"),
    ("packed-uses-the-package", "check_packed_documents",
     lambda layer, x, lengths: layer(x, mask=mha_course.parallel.packing.varlen_mask(
         mha_course.parallel.packing.cu_seqlens(lengths)))[0],
     r"asks you to build the mask and positions yourself"),
    ("merge-added", "check_lse_merge", lambda *a: _merge(*a, "added"),
     r"the two log-sum-exps were added.*ring-flash-attention#20"),
    ("merge-log1p", "check_lse_merge", lambda *a: _merge(*a, "log1p"),
     r"finite input gives finite output.*ring-flash-attention PR #30"),
    ("merge-lse-left-in-base-2", "check_lse_merge", lambda *a: _merge(*a, "base2"),
     r"the merged log-sum-exp is log.*tokenspeed PR #571"),
]


@pytest.mark.parametrize(("check", "wrong", "pattern"), [w[1:] for w in WRONG_FIXES],
                         ids=[w[0] for w in WRONG_FIXES])
def test_a_known_wrong_fix_is_named(check, wrong, pattern, capsys):
    import mha_course.parallel.packing  # noqa: F401  (the names the wrong fixes reach for)
    import mha_course.parallel.tensor  # noqa: F401

    with pytest.raises(CheckFailed, match=pattern):
        getattr(checks, check)(wrong)
    assert capsys.readouterr().out == ""
