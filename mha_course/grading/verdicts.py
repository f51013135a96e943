"""Verdicts: from nbval's per-cell records to one verdict per exercise, with the reason in words.

Pure functions over plain records, so the decisions are unit-tested in milliseconds
(``tests/test_verdicts.py``); :mod:`mha_course.grading.check` only runs nbval and calls them.

A record is what :mod:`mha_course.grading.nbval_plugin` writes for one code cell::

    {"cell": 7, "ok": False, "message": "<nbval's failure message>",
     "error": {"ename": "CheckFailed", "evalue": "Exercise 03.2: ...", "traceback": [...]},
     "got": "<text the cell printed>", "expected": "<text the solution printed>"}

``error`` is None when the kernel reported no exception; a cell nbval did not run has no
record (None).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .notebooks import CellRole, clean

#: Cell-level statuses and how the summary table shows them.
STATUS_SHORT = {
    "passed": "pass",
    "failed": "FAIL",
    "not attempted": "—",
    "timed out": "TIMEOUT",
    "crashed": "CRASH",
    "not checked": "?",
    "missing": "·",
    "error": "ERROR",
}
#: What the nbval plugin puts in a cell's failure message when the kernel died running it.
KERNEL_DIED = "MHA_COURSE_KERNEL_DIED"


@dataclass
class Verdict:
    """The result of one exercise: a status from :data:`STATUS_SHORT` and a message."""

    exercise: str
    status: str
    message: str = ""


@dataclass
class NotebookResult:
    """The verdicts for one learner notebook, or the one-line error that stopped its check."""

    path: Path
    reference: str = ""
    verdicts: list[Verdict] = field(default_factory=list)
    error: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def all_passed(self) -> bool:
        return not self.error and all(v.status == "passed" for v in self.verdicts)


@dataclass
class RunVerdicts:
    """What one nbval run decided (see :func:`judge_run`)."""

    #: One verdict per exercise, in the notebook's order.
    verdicts: dict[str, Verdict]
    #: The exercise during which the kernel was lost (later cells ran in a dead kernel), or None.
    lost_at: str | None = None
    #: Set when a cell outside the exercises (a setup cell) failed: nothing could be checked.
    error: str = ""


def trim(lines: list[str], limit: int = 12) -> list[str]:
    """``lines`` without trailing blanks, cut to ``limit`` lines with a "... more" line.

    >>> trim(["a", "b", "c", "d", ""], limit=3)
    ['a', 'b', '... (2 more lines)']
    """
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) > limit:
        lines = lines[: limit - 1] + [f"... ({len(lines) - limit + 1} more lines)"]
    return lines


def failure_message(exercise: str, record: dict, role: CellRole) -> str:
    """What went wrong in the cell of ``record``, for the report (several lines at most).

    A check's own message (an error whose text starts with ``Exercise NN.M: ``, or a check's
    ``Exercise NN.M asks you to ...`` about a forbidden call) is shown as it is; another error
    is quoted with the line that raised it; an output mismatch shows the expected and the
    printed text.
    """
    error = record.get("error")
    prefix = f"Exercise {exercise}: "
    if error:
        ename, evalue = error["ename"], clean(error["evalue"])
        # IPython compiles each cell under a numbered file name: say "line 3 of the cell" instead
        evalue = re.sub(r"\(\d+\.py, line (\d+)\)", r"(line \1 of the cell)", evalue)
        if evalue.startswith(prefix):  # a check's own message says it all
            return "\n".join(trim(evalue[len(prefix):].split("\n")))
        if ename == "CheckFailed" and evalue.startswith(f"Exercise {exercise} asks you to "):
            return "\n".join(trim(evalue.split("\n")))  # a forbidden call, in its own words
        lines = [f"{ename}: {evalue}".rstrip() + f"  (raised in {role.label})"]
        frames = [clean(t) for t in error.get("traceback", [])[:-1]]
        if frames:  # the innermost frame: where it went wrong
            frame = [ln for ln in frames[-1].split("\n") if ln.strip()]
            arrow = [ln for ln in frame if ln.lstrip().startswith("---->")]
            lines += ["  " + frame[0].strip()] + ["  " + ln.strip() for ln in arrow[:1]]
        return "\n".join(trim(lines))
    message = record.get("message", "")
    if "Cell outputs differ" in message:
        expected = record.get("expected", "").rstrip("\n").split("\n")
        got = record.get("got", "").rstrip("\n").split("\n")
        return "\n".join(
            [f"{role.label} printed something other than the solution's output"]
            + ["  expected: " + ln for ln in trim(expected, 6)]
            + ["  got:      " + ln for ln in trim(got, 6)]
            + ["(a print() inside your function shows up here: remove it)"]
        )
    return "\n".join(trim(clean(message).split("\n"), 6))


def kernel_died(record: dict) -> bool:
    """Whether the record says the kernel died (or could not be interrupted after a timeout)."""
    message = record.get("message", "")
    return KERNEL_DIED in message or "Failed to interrupt kernel" in message


def exercise_verdict(exercise: str, cells, timeout: float) -> tuple[Verdict, bool]:
    """Verdict for one exercise from ``[(record or None, role)]``; second value: kernel lost.

    In order: a dead kernel or a timeout in any cell; the exercise's own stub (not attempted);
    the first failing cell (another exercise's stub, a check's message, an error, an output
    that differs); a cell that did not run (not checked); else passed.
    """
    for record, role in cells:
        if record is None or record["ok"]:
            continue
        message = record.get("message", "")
        if KERNEL_DIED in message:
            return Verdict(exercise, "crashed", f"the kernel died while running {role.label} "
                           "(os._exit, sys.exit in a thread, a segfault or out of memory?)"), True
        if message.startswith("Timeout of"):
            return Verdict(exercise, "timed out",
                           f"TIMED OUT after {timeout:g} s in {role.label}"), kernel_died(record)
    for record, _ in cells:
        error = (record or {}).get("error") or {}
        evalue = clean(error.get("evalue", ""))
        stub = evalue.startswith(f"Exercise {exercise}:")
        if error.get("ename") == "NotImplementedError" and stub:
            return Verdict(exercise, "not attempted"), False
    for record, role in cells:
        if record is None or record["ok"]:
            continue
        error = record.get("error") or {}
        other = re.match(r"Exercise (\d\d\.\d+):", clean(error.get("evalue", "")))
        if error.get("ename") == "NotImplementedError" and other:
            return Verdict(exercise, "failed", f"this exercise uses Exercise {other.group(1)}, "
                           "which still raises NotImplementedError: do that one first"), False
        return Verdict(exercise, "failed", failure_message(exercise, record, role)), False
    if any(record is None for record, _ in cells):
        return Verdict(exercise, "not checked", "a cell of this exercise did not run"), False
    return Verdict(exercise, "passed"), False



def judge_run(order, roles, records, timeout: float, backstop: bool = False,
              decided=None) -> RunVerdicts:
    """Turn one nbval run's records into a verdict per exercise.

    Parameters
    ----------
    order : list of str
        The exercise ids, in the notebook's order.
    roles : list of CellRole
        One per code cell of the notebook that ran, by index (see ``merge_learner``).
    records : dict of int to dict
        The plugin's record per code cell index; a cell that did not run has none.
    timeout : float
        The cell timeout, for the "TIMED OUT after ..." message.
    backstop : bool
        Whether the whole run was stopped: exercises that were not checked then timed out.
    decided : dict of str to Verdict, optional
        Verdicts from earlier runs (an exercise that killed the kernel, stubbed out since).

    Returns
    -------
    RunVerdicts
        ``error`` set when a setup cell failed; ``lost_at`` set when the kernel was lost during
        an exercise, whose later exercises ran in a dead kernel and are "not checked" here.
    """
    decided = decided or {}
    cells_of: dict[str, list] = {x: [] for x in order}
    for index, role in enumerate(roles):
        record = records.get(index)
        if role.exercise is None:
            if record is not None and not record["ok"]:
                return RunVerdicts({}, error=f"{role.label} failed, so nothing could be checked: "
                                   + failure_message("", record, role).split("\n")[0])
            continue
        cells_of[role.exercise].append((record, role))
    verdicts: dict[str, Verdict] = {}
    lost_at = None
    for exercise in order:
        if exercise in decided:
            verdicts[exercise] = decided[exercise]
            continue
        verdict, lost = exercise_verdict(exercise, cells_of[exercise], timeout)
        verdicts[exercise] = verdict
        if lost:
            lost_at = exercise
            break  # later cells ran in a dead kernel
    for exercise in order:
        verdict = verdicts.get(exercise, Verdict(exercise, "not checked"))
        if backstop and verdict.status == "not checked":
            verdict = Verdict(exercise, "timed out", "TIMED OUT: the whole check ran too long")
        verdicts[exercise] = verdict
    return RunVerdicts({x: verdicts[x] for x in order}, lost_at)
