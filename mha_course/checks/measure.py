"""What a check measures beyond its result: where its random inputs come from, and memory.

Not taught in a lesson: part of the exercise checks' machinery (see
:mod:`mha_course.checks.harness`, which imports these).

- :func:`check_rng` is the generator every check draws its inputs from. The grader of
  ``python -m mha_course check --assignment`` (:mod:`mha_course.grading.running.grader`) can set a
  probe seed (``PROBE["seed"]``): each check then runs a second time on inputs drawn from
  ``(its seed, the probe seed)``, the same kinds of inputs with values the learners' local
  checks never used. A seed a check passes to the learner's function (dropout's) is not a
  ``check_rng`` seed, so it stays what the exercise says.
- :func:`traced` measures the peak memory a block held (tracemalloc), for a check that asks
  how much memory the learner's function needs (07.3): the harness measures only the
  learner's call, in the process where it runs (the learner's kernel in grading mode).
"""

from __future__ import annotations

import contextlib
import tracemalloc

import numpy as np

#: Set by the grader (``check --assignment`` with a probe seed, see
#: :mod:`mha_course.grading.running.grader`): every check then draws its inputs from other seeds
#: than
#: the learners' local checks use (:func:`check_rng`).
PROBE = {"seed": None}


def check_rng(seed: int) -> np.random.Generator:
    """The generator a check draws its inputs from: ``np.random.default_rng(seed)``.

    When the grader sets a probe seed (``PROBE["seed"]``), the generator draws from
    ``(seed, probe seed)`` instead: the same kinds of inputs, values learners never saw.

    >>> float(check_rng(7).normal()) == float(np.random.default_rng(7).normal())
    True
    """
    probe = PROBE["seed"]
    return np.random.default_rng(seed if probe is None else [seed, int(probe)])



@contextlib.contextmanager
def traced(into: dict | None):
    """Put the peak memory (tracemalloc) the block held above its start into ``into["peak"]``."""
    if into is None:
        yield
        return
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    try:
        yield
    finally:
        into["peak"] = max(0, tracemalloc.get_traced_memory()[1] - start)
        if not was_tracing:
            tracemalloc.stop()
