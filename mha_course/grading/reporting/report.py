"""Reports: one notebook's verdicts as text, and the instructor's table (printed and CSV).

Pure functions of :class:`~mha_course.grading.reporting.verdicts.NotebookResult` and of
:class:`Row`,
so folder mode's decisions are unit-tested in milliseconds (``tests/test_verdicts.py``):

- :func:`collect_submissions`: each notebook of a folder is a submission, and so is each
  sub-folder (every notebook in it, at any depth); hidden and system folders
  (``.ipynb_checkpoints``, ``__MACOSX``) are skipped; ``jay.ipynb`` and ``jay/`` stay apart
  (:mod:`mha_course.grading.reporting.intake` does the reading);
- :func:`combine`: a submission's notebooks give one row, the best result per exercise, with a
  note where two notebooks disagree; an unreadable notebook is an ERROR;
- :func:`summary_table` and :func:`csv_text`: one row per submission, one column per
  exercise; each row counts its passes out of the exercises of its own notebooks.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path

from ..running.check import NOT_IN_WRONG_NOTEBOOK, WRONG_NOTEBOOK
from .intake import Submission, collect
from .verdicts import STATUS_MEANING, STATUS_SHORT, NotebookResult, cap_line, trim

#: Best first: the status a submission's row keeps when its notebooks disagree.
RANK = ["passed", "failed", "timed out", "crashed", "error", "not checked", "not attempted",
        "missing"]
#: Statuses that show the learner tried (two different ones in two notebooks: a conflict).
ATTEMPTED = {"passed", "failed", "timed out", "crashed"}


def format_result(result: NotebookResult, timeout: float) -> str:
    """The plain-text report for one notebook."""
    head = f"{result.path}"
    if result.error:
        return f"{head}: ERROR: {cap_line(result.error)}"
    lines = [f"{head} (checked against {result.reference}; cell timeout {timeout:g} s)"]
    wrong = [n for n in result.notes if n.startswith(WRONG_NOTEBOOK)]
    lines += [f"  {cap_line(note.replace(WRONG_NOTEBOOK, 'WRONG NOTEBOOK: ', 1))}"
              for note in wrong]  # said once, first, instead of a MISSING line per exercise
    absent = [v.exercise for v in result.verdicts
              if v.status == "missing" and v.message == NOT_IN_WRONG_NOTEBOOK]
    if absent:
        lines.append(f"  Exercises {' '.join(absent)}  MISSING: not in this notebook")
    for v in result.verdicts:
        if v.exercise in absent:
            continue
        text = {
            "passed": "passed",
            "not attempted": "not attempted",
            "failed": f"FAILED: {v.message}",
            "timed out": v.message,
            "crashed": f"CRASHED: {v.message}",
            "missing": f"MISSING: {v.message}",
            "error": f"ERROR: {v.message}",
        }.get(v.status, f"{v.status}: {v.message}")
        body = trim(text.split("\n")) + [cap_line(f"note: {note}") for note in v.notes]
        indent = " " * (len(v.exercise) + 13)
        lines.append(f"  Exercise {v.exercise}  {body[0]}")
        lines += [indent + ln for ln in body[1:]]
    lines += [f"  note: {cap_line(note)}" for note in result.notes if note not in wrong]
    counts = {}
    for v in result.verdicts:
        counts[v.status] = counts.get(v.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if s != "passed")
    lines.append(f"  {counts.get('passed', 0)} of {len(result.verdicts)} passed"
                 + (f"; {summary}" if summary else "") + ".")
    return "\n".join(lines)


def collect_submissions(paths) -> list[Submission]:
    """The submissions in ``paths``: each file, or each entry of a folder, is one (see
    :func:`mha_course.grading.reporting.intake.collect`, which also lists what it skipped)."""
    return collect(paths).submissions


@dataclass
class Row:
    """One submission in the table: the best status per exercise of its notebooks."""

    name: str
    statuses: dict = field(default_factory=dict)
    #: The exercises of its own notebooks: what its pass count is out of.
    exercises: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    #: A notebook could not be read: the exercises it may have held show ERROR.
    unreadable: bool = False


def combine(name: str, results) -> Row:
    """One row from ``[(path, NotebookResult or the exception that stopped it)]``."""
    row = Row(name)
    seen: dict[str, list] = {}
    if not results:
        row.unreadable = True
        row.notes.append("no notebooks in this submission")
    for path, result in results:
        if not isinstance(result, NotebookResult):
            row.unreadable = True
            row.notes.append(f"{Path(path).name}: ERROR: {result}")
            continue
        for v in result.verdicts:
            seen.setdefault(v.exercise, []).append((Path(path).name, v.status))
    for exercise, found in seen.items():
        best = min((status for _, status in found), key=RANK.index)
        row.statuses[exercise] = best
        row.exercises.append(exercise)
        tried = {status for _, status in found if status in ATTEMPTED}
        if len(tried) > 1:
            row.notes.append(f"Exercise {exercise}: " + "; ".join(
                f"{status} in {file}" for file, status in found) + f" (the best, {best}, counts)")
    return row


def _cell(row: Row, exercise: str) -> str:
    """A status word for the CSV: "" when the exercise is not in the row's notebooks."""
    if exercise in row.statuses:
        return row.statuses[exercise]
    return "error" if row.unreadable else ""


def _total(row: Row, columns) -> int:
    return len(columns) if row.unreadable else len(row.exercises)


def legend() -> str:
    """What every symbol of :func:`summary_table` means."""
    parts = [f"{STATUS_SHORT[s]} = {STATUS_MEANING[s]}" for s in STATUS_SHORT]
    return ("; ".join(parts) + "; blank = not in this submission's notebooks. A row's passes "
            "count out of the exercises of its own notebooks.")


def summary_table(rows: list[Row], columns: list[str]) -> str:
    """Plain-text table: one row per submission, one column per exercise, and the legend."""
    name_w = max([len("submission")] + [len(r.name) for r in rows])
    col_w = max([7] + [len(x) for x in columns])
    head = "submission".ljust(name_w) + "  " + "  ".join(x.ljust(col_w) for x in columns)
    head += "  passed"
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = [(STATUS_SHORT[_cell(row, x)] if _cell(row, x) else "").ljust(col_w)
                 for x in columns]
        passed = sum(s == "passed" for s in row.statuses.values())
        lines.append(row.name.ljust(name_w) + "  " + "  ".join(cells)
                     + f"  {passed}/{_total(row, columns)}")
    lines.append(legend())
    return "\n".join(lines)


def csv_text(rows: list[Row], columns: list[str]) -> str:
    """CSV: ``submission, <one column per exercise>, passed, total``; cells hold status words."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["submission", *columns, "passed", "total"])
    for row in rows:
        writer.writerow([row.name, *(_cell(row, x) for x in columns),
                         sum(s == "passed" for s in row.statuses.values()),
                         _total(row, columns)])
    return buf.getvalue()
