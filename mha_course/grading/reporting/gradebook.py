"""The gradebook: one row per student, points per exercise from the assignment, as numbers.

Not taught in a lesson: grading mode of ``python -m mha_course check`` (``--assignment``)
turns each submission's verdicts into a :class:`GradeRow` with :func:`grade_row` (pure), prints
:func:`gradebook_table` and writes :func:`gradebook_csv`:

- the columns come from the assignment, never from a submission: an exercise the submission
  lacks is "missing" (0 points), one it has beyond the assignment is not a column;
- an exercise that passed earns its points, any other status 0; an unreadable notebook (not
  JSON, not a notebook) earns 0 on every exercise, with status "error";
- the CSV holds numbers a gradebook takes (``student, id, <points per exercise>, total, max,
  percent, late, submitted``), then a status column per exercise for humans, the files graded
  and the notes; with ``excel=True`` it is written with a UTF-8 BOM, so Excel reads accents.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ..authoring.assignment import Assignment, number
from .report import RANK
from .verdicts import BACKGROUND_NOTE, STATUS_SHORT, NotebookResult, Verdict


@dataclass
class GradeRow:
    """One student's grade (see the module docstring)."""

    student: str
    student_id: str
    files: list[str]
    #: ``{exercise: Verdict}`` in the assignment's order: the best of the student's notebooks.
    verdicts: dict = field(default_factory=dict)
    points: dict = field(default_factory=dict)
    total: float = 0
    max_points: float = 0
    late: bool = False
    submitted: str = ""
    notes: list[str] = field(default_factory=list)
    unreadable: bool = False

    @property
    def percent(self) -> float:
        return round(100.0 * self.total / self.max_points, 2) if self.max_points else 0.0

    @property
    def statuses(self) -> dict:
        return {x: v.status for x, v in self.verdicts.items()}


def grade_row(student: str, student_id: str, results, assignment: Assignment,
              late: bool = False, modified: float | None = None, notes=()) -> GradeRow:
    """A student's row from ``[(path, NotebookResult or the error that stopped it)]``."""
    row = GradeRow(student, student_id, [Path(p).name for p, _ in results], late=late,
                   submitted=datetime.fromtimestamp(modified).isoformat(timespec="seconds")
                   if modified is not None else "", notes=list(notes))
    found: dict[str, list[tuple[str, Verdict]]] = {}
    why = "no notebooks in this submission" if not results else ""
    for path, result in results:
        if not isinstance(result, NotebookResult) or result.error:
            row.unreadable = True
            reason = result.error if isinstance(result, NotebookResult) else str(result)
            why = why or reason
            row.notes.append(f"{Path(path).name} could not be graded")
            continue
        # background output is reported to the learner, not in the row: whether any arrived
        # depends on timing, and the same submission must give the same row every time
        row.notes += [f"{Path(path).name}: {n}" if len(results) > 1 else n
                      for n in result.notes if n != BACKGROUND_NOTE]
        for v in result.verdicts:
            found.setdefault(v.exercise, []).append((Path(path).name, v))
    if not results:
        row.unreadable = True
        row.notes.append("no notebooks in this submission")
    for exercise in assignment.exercises:
        candidates = found.get(exercise, [])
        if candidates:
            _, best = min(candidates, key=lambda fv: RANK.index(fv[1].status)
                          if fv[1].status in RANK else len(RANK))
            tried = {v.status for _, v in candidates}
            if len(tried) > 1:
                row.notes.append(f"Exercise {exercise}: " + "; ".join(
                    f"{v.status} in {f}" for f, v in candidates) + f" (the best, {best.status}, "
                    "counts)")
        elif row.unreadable:
            best = Verdict(exercise, "error", why)
        else:
            best = Verdict(exercise, "missing", "not in the notebook you handed in")
        row.verdicts[exercise] = best
        row.points[exercise] = assignment.points[exercise] if best.status == "passed" else 0
    row.total = sum(row.points.values())
    row.max_points = assignment.max_points
    return row


def gradebook_table(rows: list[GradeRow], assignment: Assignment) -> str:
    """Plain text: one row per student, a column per exercise (status), the points."""
    columns = list(assignment.exercises)
    name_w = max([len("student")] + [len(r.student) for r in rows])
    id_w = max([len("id")] + [len(r.student_id) for r in rows])
    col_w = max([7] + [len(x) for x in columns])
    head = ("student".ljust(name_w) + "  " + "id".ljust(id_w) + "  "
            + "  ".join(x.ljust(col_w) for x in columns) + "  points")
    lines = [head, "-" * len(head)]
    for row in rows:
        cells = [STATUS_SHORT.get(row.verdicts[x].status, "?").ljust(col_w) for x in columns]
        lines.append(row.student.ljust(name_w) + "  " + row.student_id.ljust(id_w) + "  "
                     + "  ".join(cells) + f"  {number(row.total)}/{number(row.max_points)}"
                     + (" late" if row.late else ""))
    legend = "; ".join(f"{short} = {status}" for status, short in STATUS_SHORT.items())
    lines.append(legend + ". A passed exercise earns its points, any other status 0.")
    return "\n".join(lines)


def gradebook_csv(rows: list[GradeRow], assignment: Assignment) -> str:
    """The CSV text (see the module docstring): numbers first, then statuses, files and notes."""
    columns = list(assignment.exercises)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["student", "id", *columns, "total", "max", "percent", "late", "submitted",
                     *(f"{x} status" for x in columns), "files", "notes"])
    for row in rows:
        writer.writerow([row.student, row.student_id,
                         *(number(row.points[x]) for x in columns), number(row.total),
                         number(row.max_points), number(row.percent), "1" if row.late else "0",
                         row.submitted, *(row.verdicts[x].status for x in columns),
                         "; ".join(row.files), " | ".join(row.notes)])
    return buf.getvalue()


def write_text(path: Path, text: str, excel: bool = False) -> None:
    """Write ``text`` as UTF-8 (with a BOM for Excel when ``excel``)."""
    Path(path).write_text(text, encoding="utf-8-sig" if excel else "utf-8", newline="")
