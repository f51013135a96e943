"""Running the course's command line inside the test process, for the tests of its commands.

``run_cli("check", path)`` is ``python -m mha_course check PATH`` without a new interpreter: the
exit code and what it printed. ``make_class()`` loads ``tests/data/make_class.py``, which builds
a class's folder of lesson-03 submissions. :data:`FIXTURES` is the fixture course of
``tests/data/solutions`` and :data:`GOOD`, :data:`WRONG`, :data:`HANG`, :data:`CRASH` a
learner's answers to its exercises 98.1 and 98.2, shared by the grading tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
from pathlib import Path

from mha_course.grading.cli import main

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "solutions"

GOOD = {"98.1": "def double(x):\n    return x * 2", "98.2": "answer = 6 * 7\nprint('debug')"}
WRONG = {"98.1": "def double(x):\n    print('debug')\n    return x + x + 1", "98.2": "answer = 42"}
HANG = {"98.1": "def double(x):\n    while True:\n        pass", "98.2": "answer = 42"}
CRASH = {"98.1": "import os\nos._exit(1)", "98.2": "answer = 42"}


def run_cli_split(*args, cwd=None) -> tuple[int, str, str]:
    """Run ``python -m mha_course ARGS`` in ``cwd`` (the repository by default), in this
    process; return (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old = Path.cwd()
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def run_cli(*args, cwd=None) -> tuple[int, str]:
    """Run ``python -m mha_course ARGS`` in this process; return (exit code, stdout + stderr),
    the two streams interleaved as a terminal shows them."""
    buf = io.StringIO()
    old = Path.cwd()
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            code = main([str(a) for a in args])
    finally:
        os.chdir(old)
    return code, buf.getvalue()


def make_class():
    """The module ``tests/data/make_class.py``."""
    spec = importlib.util.spec_from_file_location("make_class",
                                                  ROOT / "tests" / "data" / "make_class.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
