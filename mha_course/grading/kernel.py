"""The kernel a learner's notebook runs in: the course's checks loaded first, then ipykernel.

Not taught in a lesson: the checker starts ``python -m mha_course.grading.kernel -f FILE`` (see
:func:`mha_course.grading.sandbox.kernel_spec`) with ``PYTHONPATH`` pointing at the run's
private copy of the package. Importing :mod:`mha_course.checks` here, before the kernel executes
any cell, means that a learner's file named ``mha_course/...`` or ``numpy.py`` in the working
folder cannot replace the checks: the modules are already loaded. Nothing is added to the
notebook's namespace.

Before that, the kernel sets on itself the rlimits the checker asks for in ``MHA_COURSE_LIMITS``
(memory, file size and, inside the sandbox's user namespace, processes: see
:mod:`mha_course.grading.limits`); no learner code has run yet, and without privileges (which the
sandbox drops) a limit cannot be raised again.
"""

from __future__ import annotations

import os
import sys

from mha_course.grading.limits import ENV, apply_rlimits

apply_rlimits(os.environ.pop(ENV, None))

import mha_course.checks  # noqa: E402, F401  (loaded before any learner code runs)


def main() -> None:
    """Start ipykernel as ``python -m ipykernel_launcher`` would."""
    if sys.path and sys.path[0] in ("", ".", os.getcwd()):
        del sys.path[0]  # the working folder holds only what the learner's code writes
    from ipykernel import kernelapp  # ipykernel is a dependency of the checker, not the course

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
