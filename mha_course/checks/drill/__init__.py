"""Checks for lesson 15's spot-the-bug drill (``solutions/15_interview_drill.ipynb``), one module
per group of exercises:

- :mod:`~mha_course.checks.drill.attention`: the attention and layer bugs (15.1 to 15.8);
- :mod:`~mha_course.checks.drill.decoding`: the decoding bugs (15.9 to 15.14);
- :mod:`~mha_course.checks.drill.timed_build`: the timed build (15.15);
- :mod:`~mha_course.checks.drill.generation`: the generation bugs (15.16 to 15.18);
- :mod:`~mha_course.checks.drill.serving`: the serving bugs (15.19 to 15.21);
- :mod:`~mha_course.checks.drill.parallel`: attention across devices and packed rows (15.22 to
  15.24);
- :mod:`~mha_course.checks.drill.block2025`: the 2025 attention block (15.25, 15.26).

Each spot-the-bug check runs the learner's fix against the property tests of
:mod:`mha_course.checks.properties` and names the first property it breaks, with the evidence;
:func:`diagnose` prints what a check says about a broken function instead of raising (the drill
runs it on each broken function it hands out).

Examples
--------
>>> from mha_course.checks import drill
>>> drill.diagnose(drill.check_causal_off_by_one, lambda T: None)  # doctest: +ELLIPSIS
Exercise 15.2: ...
"""

from ..harness import CheckFailed
from .attention import *  # noqa: F403
from .block2025 import *  # noqa: F403
from .decoding import *  # noqa: F403
from .generation import *  # noqa: F403
from .parallel import *  # noqa: F403
from .serving import *  # noqa: F403
from .timed_build import *  # noqa: F403


def diagnose(check, fn) -> None:
    """Run ``check(fn)`` and print what it says instead of raising: which property a broken
    function breaks (the drill runs it on each broken function it hands out)."""
    try:
        check(fn)
    except CheckFailed as exc:
        print(exc)


__all__ = ["diagnose", *sorted(name for name in dir() if name.startswith("check_"))]
