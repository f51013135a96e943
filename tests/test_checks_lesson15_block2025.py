"""Lesson 15's drill, the 2025 attention block from lesson 13 (15.25 and 15.26,
:mod:`mha_course.checks.drill.block2025`): each named wrong fix is recognised.

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


# ------------------------------------------------------------------ named wrong fixes
def _capped(q, k, v, mask, cap, kind):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = {"removed": s, "clip": np.clip(s, -cap, cap)}[kind]
    w = mha_course.softmax(np.where(mask, s, -np.inf))
    return w @ v, w


def _qk(x, h, gain, eps, kind):
    heads = x.reshape(*x.shape[:-1], h, x.shape[-1] // h)
    if kind == "no_gain":
        return (heads / np.sqrt((heads * heads).mean(-1, keepdims=True) + eps)).reshape(x.shape)
    return (heads / np.sqrt((heads * heads).mean(-3, keepdims=True) + eps) * gain
            ).reshape(x.shape)


WRONG_FIXES = [
    ("cap-removed", "check_softcap_before_mask",
     lambda q, k, v, m, c: _capped(q, k, v, m, c, "removed"), r"the cap was removed"),
    ("cap-clipped", "check_softcap_before_mask",
     lambda q, k, v, m, c: _capped(q, k, v, m, c, "clip"), r"a hard clip at ±cap"),
    ("qk-no-gain", "check_per_head_qk_norm", lambda x, h, g, e: _qk(x, h, g, e, "no_gain"),
     r"the gain is gone"),
    ("qk-over-tokens", "check_per_head_qk_norm", lambda x, h, g, e: _qk(x, h, g, e, "tokens"),
     r"the norm now runs over the tokens"),
]


@pytest.mark.parametrize(("name", "check", "fn", "match"), WRONG_FIXES,
                         ids=[w[0] for w in WRONG_FIXES])
def test_each_named_wrong_fix_is_recognised(name, check, fn, match):
    with pytest.raises(CheckFailed, match=match):
        getattr(checks, check)(fn)
