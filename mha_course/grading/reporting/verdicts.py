"""Verdicts: from nbval's per-cell records to one verdict per exercise, with the reason in words.

Pure functions over plain records, so the decisions are unit-tested in milliseconds
(``tests/test_verdicts.py``); :mod:`mha_course.grading.running.check` only runs nbval and calls
them.

A record is what :mod:`mha_course.grading.running.nbval_plugin` writes for one code cell::

    {"cell": 7, "ok": False, "message": "<nbval's failure message>",
     "error": {"ename": "CheckFailed", "evalue": "Exercise 03.2: ...", "traceback": [...]},
     "got": "<text the cell printed>", "expected": "<text the solution printed>"}

``error`` is None when the kernel reported no exception; a cell nbval did not run has no
record (None). A record may also say which of the kernel's limits was reached while the cell
ran (``"limit": "the memory limit of 4 GiB per kernel was reached (...)"``); the verdict's
message then ends with it. Cells have roles
(:class:`~mha_course.grading.authoring.notebooks.CellRole`): ``setup``, ``solution`` (the learner's
answer), ``check``, ``own`` (the learner's own cell, run before the answer) and the reference's
other cells.

Whose output is compared (the rule, enforced where it can be certain: in the kernel, see
:mod:`mha_course.grading.running.kernel`): a cell's output is what its own code printed,
synchronously,
in the thread that runs it. Anything else (a thread or a subprocess the notebook left running, a
carriage-return progress bar drawn by a thread, output of an earlier cell arriving late) is
background output: sent under a parent no cell has, so it is never compared, never fails a
setup cell, an ungraded cell or another exercise, and never decides a grade; a record may say
it arrived (``"background": True``) and the run then carries :data:`BACKGROUND_NOTE`. A graded
cell's own extra output costs no points when every line the solution printed is there, in
order, and nothing false can hide behind it (:func:`extra_output`): a note names the cell and
the first extra line. Output that changes or breaks up the solution's lines fails the cell. A
setup cell that printed only extra lines does not stop the check (a note says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..authoring.notebooks import CellRole, clean

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
#: What each status means, for the legend under the table.
STATUS_MEANING = {
    "passed": "passed",
    "failed": "failed",
    "not attempted": "not attempted (the stub is still there)",
    "timed out": "timed out",
    "crashed": "the kernel died",
    "not checked": "not checked (a cell did not run)",
    "missing": "missing (no cell for it in the notebook)",
    "error": "the notebook could not be read or checked",
}
#: What the nbval plugin puts in a cell's failure message when the kernel died running it.
KERNEL_DIED = "MHA_COURSE_KERNEL_DIED"
#: nbval's message for a cell whose kernel was already dead when the cell was due to run.
DEAD_ON_START = "Kernel dead on test start"
#: Longest line a report shows (the rest is replaced by a count).
LINE_CAP = 300


@dataclass
class Verdict:
    """The result of one exercise: a status from :data:`STATUS_SHORT`, a message, notes."""

    exercise: str
    status: str
    message: str = ""
    notes: list[str] = field(default_factory=list)


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
    #: Notes about the whole run (background output ignored, a setup cell's extra lines).
    notes: list[str] = field(default_factory=list)


def cap_line(line: str, limit: int = LINE_CAP) -> str:
    """``line`` cut to ``limit`` characters, saying how many more there were.

    >>> cap_line("abcdefghij", 4)
    'abcd... (6 more characters)'
    """
    if len(line) <= limit:
        return line
    return line[:limit] + f"... ({len(line) - limit} more characters)"


def trim(lines: list[str], limit: int = 12) -> list[str]:
    """``lines`` without trailing blanks, cut to ``limit`` lines (each to :data:`LINE_CAP`).

    >>> trim(["a", "b", "c", "d", ""], limit=3)
    ['a', 'b', '... (2 more lines)']
    """
    lines = [cap_line(line.rstrip()) for line in lines]
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


def with_limit(message: str, record: dict | None) -> str:
    """``message``, and on its own line the limit the record says was reached, if any."""
    limit = (record or {}).get("limit")
    return f"{message}\n{limit}" if limit else message


_IN_FUNCTION = re.compile(r"\(in your function `([^`\n]{1,100})`\)")
_CELL_FRAME = re.compile(r"^Cell In\[\d+\], line \d+, in ([A-Za-z_][\w.]*)")


def timed_out_function(record: dict) -> str | None:
    """The learner's function that was running when a cell timed out, if the record says.

    The grader names it in its message (``(in your function `double`)``); nbval's record of an
    interrupted cell has the kernel's traceback, whose innermost frame in a notebook cell is
    the learner's (the checks live in the package's files).

    >>> timed_out_function({"message": "Timeout of 5 seconds exceeded executing cell (in your "
    ...                                "function `double`)"})
    'double'
    >>> timed_out_function({"message": "Timeout of 5 seconds", "error": {"traceback": [
    ...     "Cell In[2], line 1", "Cell In[1], line 2, in double(x)"]}})
    'double'
    """
    found = _IN_FUNCTION.search(record.get("message", ""))
    if found:
        return found.group(1)
    names = [m.group(1) for frame in ((record.get("error") or {}).get("traceback") or [])
             if (m := _CELL_FRAME.match(clean(frame)))]
    return names[-1] if names else None


def kernel_died(record: dict) -> bool:
    """Whether the record says the kernel was lost: it died, or ignored the timeout's interrupt."""
    message = record.get("message", "")
    return any(m in message for m in (KERNEL_DIED, DEAD_ON_START, "Failed to interrupt kernel"))


def extra_output(record: dict, role: CellRole) -> str | None:
    """The note for a cell that printed what the solution printed and more, else None.

    Every line the solution printed is there, in order, and the cell raised nothing: the other
    lines came from a print() the learner left in their function. :func:`exercise_verdict`
    accepts this only where it proves nothing false: in a check cell (the check prints its line
    only after every comparison passed, so a check cell must show that line), or in another
    cell of an exercise whose check passed (even one where the solution printed nothing).
    """
    extra = extra_lines(record)
    if extra is None or (role.role == "check" and not record.get("expected", "").strip()):
        return None
    sample = cap_line(extra[0], 60) if extra else ""
    return (f"your code printed {len(extra)} more line{'s' if len(extra) != 1 else ''} in "
            f"{role.label} (the first: {sample!r}); remove the leftover print()")


#: The note of a run during which background output arrived. Whether any arrived depends on
#: timing (a thread that writes once, late), so the gradebook leaves it out
#: (:func:`mha_course.grading.reporting.gradebook.grade_row`): the learner's report shows it.
BACKGROUND_NOTE = ("background output from your notebook (a thread, a subprocess or a progress "
                   "bar still writing after its cell) was ignored: only what a cell's own code "
                   "printed is compared")


def extra_lines(record: dict) -> list[str] | None:
    """The lines a cell printed besides the solution's, when every line the solution printed is
    there in order and the cell raised nothing; else None (the output really differs).

    >>> extra_lines({"ok": False, "message": "Cell outputs differ", "expected": "a\\nb\\n",
    ...              "got": "a\\nx\\nb\\n"})
    ['x']
    >>> extra_lines({"ok": False, "message": "Cell outputs differ", "expected": "a\\n",
    ...              "got": "a.\\n"}) is None
    True
    """
    if record.get("error") or "Cell outputs differ" not in record.get("message", ""):
        return None
    expected = [ln for ln in record.get("expected", "").split("\n") if ln.strip()]
    position, extra = 0, []
    for line in record.get("got", "").split("\n"):
        if position < len(expected) and line == expected[position]:
            position += 1
        elif line.strip():
            extra.append(line)
    return extra if position == len(expected) else None


def background_note(records) -> str | None:
    """:data:`BACKGROUND_NOTE` if any record says background output arrived, else None."""
    return BACKGROUND_NOTE if any((r or {}).get("background") for r in records) else None


def setup_extra_note(record: dict, role: CellRole) -> str | None:
    """The note for a cell outside the exercises that printed only extra lines, else None.

    Such a cell runs only the solution's code: what it printed besides the solution's output
    came from the notebook's own code (a patched function, a hook) and proves nothing about
    any exercise, so the check goes on.

    >>> role = CellRole(None, "setup", "the setup cell")
    >>> setup_extra_note({"ok": False, "message": "Cell outputs differ", "expected": "",
    ...                   "got": "hi\\n"}, role)
    "the setup cell printed 1 line the solution's does not (the first: 'hi'); ignored"
    """
    extra = extra_lines(record)
    if not extra:
        return None
    return (f"{role.label} printed {len(extra)} line{'s' if len(extra) != 1 else ''} the "
            f"solution's does not (the first: {cap_line(extra[0], 60)!r}); ignored")


def exercise_verdict(exercise: str, cells, timeout: float) -> tuple[Verdict, bool]:
    """Verdict for one exercise from ``[(record or None, role)]``; second value: kernel lost.

    In order: a dead kernel or a timeout in any cell; the exercise's own stub, or nbgrader's
    bare ``NotImplementedError()`` (not attempted);
    the first failing cell other than the learner's own (another exercise's stub, a check's
    message, an error, an output that differs); a cell that did not run (not checked); else
    passed. A check cell that printed its line and more passes with a note; a failing own
    cell becomes a note.
    """
    for record, role in cells:
        if record is None or record["ok"]:
            continue
        message = record.get("message", "")
        if KERNEL_DIED in message or DEAD_ON_START in message:
            when = "while running" if KERNEL_DIED in message else "before"
            return Verdict(exercise, "crashed", with_limit(
                f"the kernel died {when} {role.label} (os._exit, sys.exit in a thread, a "
                "segfault or out of memory?)", record)), True
        if message.startswith("Timeout of"):
            lost = kernel_died(record)
            function = timed_out_function(record)
            where = role.label if function is None else (
                f"your function `{function}` (called by {role.label})" if role.role == "check"
                else f"your function `{function}`, in {role.label}")
            return Verdict(exercise, "timed out", with_limit(
                f"TIMED OUT after {timeout:g} s in {where}"
                + ("; it ignored the interrupt, so its kernel was stopped" if lost else ""),
                record)), lost
    for record, _ in cells:
        error = (record or {}).get("error") or {}
        evalue = clean(error.get("evalue", ""))
        # the course's stub names its exercise; nbgrader's (``raise NotImplementedError()``
        # under ``# YOUR CODE HERE``, in an exported assignment) says nothing
        stub = evalue.startswith(f"Exercise {exercise}:") or not evalue
        if error.get("ename") == "NotImplementedError" and stub:
            return Verdict(exercise, "not attempted"), False
    notes = []
    for record, role in cells:
        if role.role == "own" and record is not None and not record["ok"]:
            first = failure_message(exercise, record, role).split("\n")[0]
            notes.append(f"{first}; the check went on without it")
    checked = any(role.role == "check" and record is not None
                  and (record["ok"] or extra_output(record, role) is not None)
                  for record, role in cells)
    for record, role in cells:
        if record is None or record["ok"] or role.role == "own":
            continue
        note = extra_output(record, role) if role.role == "check" or checked else None
        if note is not None:
            if not any(n.endswith("remove the leftover print()") for n in notes):
                notes.append(note)  # one print shows in several cells: one note is enough
            continue
        error = record.get("error") or {}
        other = re.match(r"Exercise (\d\d\.\d+):", clean(error.get("evalue", "")))
        if error.get("ename") == "NotImplementedError" and other:
            return Verdict(exercise, "failed", f"this exercise uses Exercise {other.group(1)}, "
                           "which still raises NotImplementedError: do that one first",
                           notes), False
        return Verdict(exercise, "failed", with_limit(failure_message(exercise, record, role),
                                                      record), notes), False
    if any(record is None for record, role in cells if role.role != "own"):
        return Verdict(exercise, "not checked", "a cell of this exercise did not run",
                       notes), False
    return Verdict(exercise, "passed", "", notes), False


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
        ``error`` set when a setup cell failed while the kernel was alive; ``lost_at`` set
        when the kernel was lost during an exercise: every later cell (a bundle's next setup
        cell included) ran in a dead kernel, so the later exercises are "not checked" here.
    """
    decided = decided or {}
    lost = next((i for i, _ in enumerate(roles)
                 if records.get(i) is not None and not records[i]["ok"]
                 and kernel_died(records[i])), None)
    culprit, died_after = None, ""
    if lost is not None:
        between = DEAD_ON_START in records[lost].get("message", "")  # no cell was running
        records = {i: r for i, r in records.items() if i < lost or (i == lost and not between)}
        culprit, died_after = roles[lost].exercise, roles[lost].label
        if between or culprit is None:
            # died between cells: a thread or a process started by the last cell that ran
            before = [i for i in range(lost) if roles[i].exercise is not None]
            if before:
                culprit = roles[before[-1]].exercise
                died_after = roles[before[-1]].label
            elif culprit is None:
                return RunVerdicts({}, error=f"the kernel died in {roles[lost].label}, so "
                                   "nothing could be checked")
    cells_of: dict[str, list] = {x: [] for x in order}
    notes = [note] if (note := background_note(records.values())) else []
    for index, role in enumerate(roles):
        record = records.get(index)
        if role.exercise is None:
            if record is not None and not record["ok"] and index != lost:
                if (note := setup_extra_note(record, role)) is not None:
                    notes.append(note)
                    continue
                return RunVerdicts({}, error=f"{role.label} failed, so nothing could be checked: "
                                   + failure_message("", record, role).split("\n")[0])
            continue
        cells_of[role.exercise].append((record, role))
    verdicts: dict[str, Verdict] = {}
    for exercise in order:
        if exercise in decided:
            verdicts[exercise] = decided[exercise]
            continue
        verdict, _ = exercise_verdict(exercise, cells_of[exercise], timeout)
        if exercise == culprit and verdict.status not in ("crashed", "timed out"):
            verdict = Verdict(exercise, "crashed", f"the kernel died after {died_after} had "
                              "run (a thread or a process your code started?)")
        if lost is not None and verdict.status == "not checked" and exercise != culprit:
            verdict = Verdict(exercise, "not checked", "the kernel died in an earlier exercise")
        verdicts[exercise] = verdict
    for exercise, verdict in verdicts.items():
        if backstop and verdict.status == "not checked":
            verdicts[exercise] = Verdict(exercise, "timed out",
                                         "TIMED OUT: the whole check ran too long")
    return RunVerdicts(verdicts, culprit if culprit in verdicts else None, notes=notes)
