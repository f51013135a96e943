"""Lesson 15's drill, the serving bugs from lesson 10 (15.19 to 15.21,
:mod:`mha_course.checks.drill.serving`): a fix that hides the symptom still fails, named.

The broken functions and the solutions come from ``solutions/15_interview_drill.ipynb``
through ``tests/drill_cells.py``; the drill's contract (each broken function fails naming
the property it breaks, each solution passes, the stub is "not attempted") is tested once,
over all 26 exercises, by ``tests/test_checks_drill.py``.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from drill_cells import CHECKS

from mha_course import checks
from mha_course.checks import CheckFailed, drill


# ------------------------------------------------------------ fixes that hide the symptom
def _block(tokens, i, bs):
    return tuple(int(t) for t in tokens[i * bs:(i + 1) * bs])


def keys_with_the_index(tokens, bs):  # "number the blocks": still blind to the prefix
    return [hash((i, _block(tokens, i, bs))) for i in range(len(tokens) // bs)]


def keys_of_partial_blocks_too(tokens, bs):
    n_blocks = -(-len(tokens) // bs)  # the last, partly filled block too
    return [hash(tuple(int(t) for t in tokens[:(i + 1) * bs])) for i in range(n_blocks)]


_counter = itertools.count()


def keys_never_equal(tokens, bs):  # collision-free by construction, and never a hit
    return [next(_counter) for _ in range(len(tokens) // bs)]


def _speculative(target, draft, prompt, n_new, k, keep):
    return drill.serving._speculative(target, draft, np.asarray(prompt), n_new, k, keep)


def verify_from_p(p, q, x):
    return min(1.0, p[x] / q[x]), p


def verify_adjusting_one_token(p, q, x):
    r = p.copy()
    r[x] = max(0.0, p[x] - q[x])
    return min(1.0, p[x] / q[x]), r / r.sum()


def verify_unnormalised(p, q, x):
    return min(1.0, p[x] / q[x]), np.maximum(p - q, 0.0)


WRONG_FIXES = [
    ("15.19", keys_with_the_index, drill.serving.PREFIX, "vllm-project/vllm PR #12603"),
    ("15.19", keys_of_partial_blocks_too, drill.serving.FULL, "only the full blocks"),
    ("15.19", keys_never_equal, drill.serving.HITS, None),
    ("15.20", functools.partial(_speculative, keep=lambda n, a: n + a),
     drill.serving.SPEC_GREEDY, "lablup/mlxcel#994"),
    ("15.20", functools.partial(_speculative, keep=lambda n, a: 0), drill.serving.SPEC_GREEDY,
     "paiml/aprender PR #2014"),
    ("15.21", verify_from_p, drill.serving.SPEC_SAMPLE, "SafeAILab/EAGLE#329"),
    ("15.21", verify_adjusting_one_token, drill.serving.SPEC_SAMPLE, "SafeAILab/EAGLE#20"),
    ("15.21", verify_unnormalised, drill.serving.DIST, "normalise the residual"),
]


@pytest.mark.parametrize("ex, wrong, prop, named", WRONG_FIXES,
                         ids=[f"{ex}-{w.func.__name__ if hasattr(w, 'func') else w.__name__}-{i}"
                              for i, (ex, w, _, _) in enumerate(WRONG_FIXES)])
def test_a_fix_that_hides_the_symptom_still_fails_and_is_named(ex, wrong, prop, named):
    with pytest.raises(CheckFailed) as info:
        getattr(checks, CHECKS[ex])(wrong)
    message = str(info.value)
    assert message.startswith(f"Exercise {ex}: property violated: {prop}. "), message
    if named:
        assert "Likely mistake" in message and named in message, message
