"""The grader's side of grading mode: checks run where the learner's code never ran.

Not taught in a lesson: a pytest plugin of the checker's nbval run (``-p
mha_course.grading.running.grader``, added by :mod:`mha_course.grading.running.check` in grading
mode, that is
``check --assignment``). The checker marks the reference's check cells of the notebook it runs
(cell metadata ``mha_course.grader``); this plugin runs those cells here, in the pytest process,
instead of sending them to the learner's kernel:

- the names the check cell uses come from the reference's setup cells, executed here
  (``checks``, ``np``, ...), except the names the exercises' solution cells define, which
  always come from the kernel: a :class:`~mha_course.grading.running.session.Session` asks
  :func:`mha_course.grading.running.remote.serve` (running in the kernel for the cell) for them, and
  gets values (numbers, arrays, tuples, ...) or proxies whose calls go to the kernel;
- the check itself, its reference results, its comparisons and its printed line all happen
  here, in code the learner's cells never touched, so a check replaced or wrapped in the
  kernel, a patched NumPy or harness, an import hook or a decorator change nothing;
- the cell passes when the check raised nothing and printed what the solution's check printed;
  then, if the assignment asks for it, the check runs again on other random inputs (the probe
  seed) and the instructor's own probes run (a ``probe_03_1(attention_scores)`` function of
  the assignment's probes file), which the learners' local checks never saw;
- a cell that runs longer than nbval's cell timeout is interrupted and reported as nbval
  reports it, naming the learner's function that was running; a kernel that dies is reported
  as the nbval plugin reports it (``KERNEL_DIED``).

What the plugin records for the cell (``test_outputs``, the exception) is what nbval would
record, so :mod:`mha_course.grading.reporting.verdicts` decides as for any other cell.
"""

from __future__ import annotations

import builtins
import contextlib
import inspect
import io
import time
import types

import pytest

from ...checks import measure
from ...checks.harness import CheckFailed
from ..authoring.notebooks import info
from ..reporting.verdicts import KERNEL_DIED
from .session import INTERRUPT_GRACE, KernelLost, RemoteTimeout, Session

try:
    from nbval.plugin import IPyNbCell, NbCellError
except ImportError:  # the plugin is only loaded into nbval runs
    IPyNbCell = NbCellError = None

#: The module name the checker passes to pytest with ``-p``.
PLUGIN = "mha_course.grading.running.grader"


class Names(dict):
    """The check cell's local names: the learner's names from the kernel, the rest from the setup.

    ``exec(code, trusted, Names(...))`` looks a name up here first: a name in ``remote`` (what
    the exercises' solution cells define) is always the kernel's; a name the setup cells
    defined, or a builtin, is the grader's own; any other name is asked of the kernel.
    """

    def __init__(self, session: Session, trusted: dict, remote: set):
        super().__init__()
        self.session, self.trusted, self.remote = session, trusted, remote

    def __missing__(self, name: str):
        if name not in self.remote and (name in self.trusted or hasattr(builtins, name)):
            raise KeyError(name)
        value = self.session.get(name)
        self[name] = value
        return value


class Grader:
    """What the plugin keeps for one notebook: the trusted namespace, the settings, the probes."""

    def __init__(self, nb):
        settings = info(nb).get("grader") or {}
        self.remote = set(settings.get("remote") or [])
        self.probe_seed = settings.get("probe_seed")
        self.trusted: dict = {"__name__": "__grader__"}
        for cell in nb.cells:
            if cell.cell_type == "code" and info(cell).get("role") == "setup":
                exec(compile(_plain(cell.source), "<setup cell>", "exec"), self.trusted)
        self.probes: dict = {}
        if settings.get("probes"):
            exec(compile(settings["probes"], "<the assignment's probes>", "exec"), self.probes)

    def run(self, source: str, exercise: str, session: Session) -> str:
        """Run a check cell with the learner's names from ``session``; return what it printed."""
        code = compile(source, "<check cell>", "exec")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, self.trusted, Names(session, self.trusted, self.remote))
        printed = out.getvalue()
        if self.probe_seed is not None:
            seed = measure.PROBE["seed"]
            measure.PROBE["seed"] = self.probe_seed
            try:
                with contextlib.redirect_stdout(io.StringIO()), _probing("inputs drawn from "
                                                                        "another seed"):
                    exec(code, self.trusted, Names(session, self.trusted, self.remote))
            finally:
                measure.PROBE["seed"] = seed
        probe = self.probes.get("probe_" + exercise.replace(".", "_"))
        if callable(probe):
            params = list(inspect.signature(probe).parameters)
            names = Names(session, self.trusted, self.remote | set(params))
            with contextlib.redirect_stdout(io.StringIO()), _probing("the instructor's own "
                                                                    "probe"):
                probe(*(names[p] for p in params))
        return printed


class ProbeFailed(CheckFailed):
    """A check failed on the instructor's probe inputs (not the ones the learner's check used)."""


@contextlib.contextmanager
def _probing(what: str):
    """Say, in a failure, that it came from a probe the learner's own check did not run."""
    try:
        yield
    except CheckFailed as exc:
        raise ProbeFailed(f"{exc}\n(found by {what}: your own check did not use these "
                          "inputs)") from exc
    except AssertionError as exc:
        raise ProbeFailed(f"{exc}\n(found by {what})") from exc


def _plain(source: str) -> str:
    """A setup cell without IPython's magics and shell lines (the grader runs plain Python)."""
    return "\n".join(line for line in source.split("\n")
                     if not line.lstrip().startswith(("%", "!")))


def graded_runtest(item) -> None:
    """nbval's ``runtest`` for a check cell the grader runs (see the module docstring)."""
    kernel = item.parent.kernel
    if not kernel.is_alive():
        raise RuntimeError("Kernel dead on test start")
    grader = getattr(item.parent, "mha_course_grader", None)
    if grader is None:
        grader = item.parent.mha_course_grader = Grader(item.parent.nb)
    timeout = float(item.config.option.nbval_cell_timeout or 30)
    session = Session(kernel, time.monotonic() + timeout)
    item.test_outputs = outputs = []
    printed, error, lost = "", None, None
    try:
        session.start()
        printed = grader.run(item.cell.source, info(item.cell).get("exercise", ""), session)
    except RemoteTimeout as exc:
        item.parent.timed_out = True
        where = f" (in your function `{exc.function}`)" if exc.function != "the check" else ""
        if exc.interrupted:
            lost = f"Timeout of {timeout:g} seconds exceeded executing cell{where}"
        else:
            lost = (f"Timeout of {timeout:g} seconds exceeded while executing cell. Failed to "
                    f"interrupt kernel in {INTERRUPT_GRACE:g} seconds, so failing without "
                    f"traceback.{where}")
    except KernelLost:
        raise RuntimeError(KERNEL_DIED) from None
    except Exception as exc:  # the check's verdict (CheckFailed), or the learner's NameError
        error = exc
    finally:
        kernel_printed = session.finish() if kernel.is_alive() else ""
        item.mha_background = session.background
    if not kernel.is_alive() and lost is None:
        raise RuntimeError(KERNEL_DIED)
    text = printed + kernel_printed
    if text:
        outputs.append({"output_type": "stream", "name": "stdout", "text": text})
    if lost is not None:
        raise NbCellError(item.cell_num, lost, item.cell.source)
    if error is not None:
        outputs.append({"output_type": "error", "ename": type(error).__name__,
                        "evalue": str(error), "traceback": []})
        raise NbCellError(item.cell_num, "Cell execution caused an exception",
                          item.cell.source)
    expected = "".join(o.get("text", "") for o in item.cell.get("outputs", [])
                       if o.get("output_type") == "stream")
    if item.sanitize(printed) != item.sanitize(expected) or kernel_printed:
        raise NbCellError(item.cell_num, "Cell outputs differ", item.cell.source)


def pytest_collection_modifyitems(session, config, items) -> None:
    """Give every check cell the checker marked for the grader :func:`graded_runtest`."""
    if IPyNbCell is None:
        return
    for item in items:
        if isinstance(item, IPyNbCell) and info(item.cell).get("grader"):
            item.runtest = types.MethodType(graded_runtest, item)


pytest_collection_modifyitems = pytest.hookimpl(trylast=True)(pytest_collection_modifyitems)
