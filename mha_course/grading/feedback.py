"""Feedback for each student: a Markdown file with what passed, what failed and why.

Not taught in a lesson: ``python -m mha_course check SUBMISSIONS --assignment A --feedback DIR``
writes one file per student (:func:`write_feedback`) from their
:class:`~mha_course.grading.gradebook.GradeRow`: the score, a table of the exercises with
their points, and for each exercise that did not pass the checker's own words (what is wrong
and the likely mistake), as the student's local check says it. Nothing in a file names a path
of the instructor's machine (:func:`scrub`): the submissions folder, the course, the home
folder and the temporary folders are cut to file names.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from .assignment import Assignment, number
from .gradebook import GradeRow

#: Statuses as the feedback says them.
SAID = {"passed": "passed", "failed": "not yet right", "not attempted": "not attempted",
        "timed out": "ran too long", "crashed": "crashed the kernel", "not checked":
        "could not be checked", "missing": "missing", "error": "could not be read"}
_UNSAFE = re.compile(r'[\x00-\x1f<>:"/\\|?*]+')


def scrub(text: str, roots=()) -> str:
    """``text`` without the folders of this machine: ``roots``, the home and temp folders.

    >>> scrub("error: /home/ta/subs/bob.ipynb: not JSON", ["/home/ta/subs"])
    'error: bob.ipynb: not JSON'
    """
    found = {str(Path(r)) for r in roots if str(r)}
    found |= {str(Path.home()), tempfile.gettempdir(), os.getcwd()}
    for root in sorted((r for r in found if len(r) > 1), key=len, reverse=True):
        text = text.replace(root + os.sep, "").replace(root, "")
    return re.sub(r"(?<![\w.])/(?:tmp|var|private)/[^\s'\"`),]+/", "", text)


def file_name(row: GradeRow, taken: set) -> str:
    """A safe, unique file name for a student's feedback: ``<id> <name>.md`` (or the name)."""
    base = " ".join(p for p in (row.student_id, row.student) if p) or "student"
    base = _UNSAFE.sub("_", base).strip(" .") or "student"
    name, n = f"{base}.md", 2
    while name.casefold() in taken:
        name, n = f"{base} ({n}).md", n + 1
    taken.add(name.casefold())
    return name


def feedback_markdown(row: GradeRow, assignment: Assignment, catalog: dict, roots=()) -> str:
    """The feedback file of one student (Markdown)."""
    title = assignment.title or "Assignment " + " ".join(assignment.exercises)
    who = row.student + (f" ({row.student_id})" if row.student_id else "")
    lines = [f"# Feedback: {title}", "", f"- Student: {who}",
             f"- Notebook{'s' if len(row.files) != 1 else ''}: "
             + (", ".join(row.files) or "none"),
             f"- Score: {number(row.total)} / {number(row.max_points)} points "
             f"({number(row.percent)} %)" + (" — handed in late" if row.late else ""), "",
             "| Exercise | Points | Result |", "|---|---|---|"]
    for exercise, verdict in row.verdicts.items():
        info = catalog.get(exercise)
        name = f"{exercise} {info.title}" if info is not None and info.title else exercise
        said = SAID.get(verdict.status, verdict.status)
        lines.append(f"| {name} | {number(row.points[exercise])} / "
                     f"{number(assignment.points[exercise])} | {said} |")
    for exercise, verdict in row.verdicts.items():
        if verdict.status == "passed" and not verdict.notes:
            continue
        info = catalog.get(exercise)
        heading = f"## Exercise {exercise}" + (f": {info.title}" if info and info.title else "")
        lines += ["", heading, "", f"**{SAID.get(verdict.status, verdict.status).capitalize()}**"
                  + (": what the check says:" if verdict.message else ".")]
        if verdict.message:
            lines += ["", "```", scrub(verdict.message, roots), "```"]
        lines += [f"- Note: {scrub(note, roots)}" for note in verdict.notes]
    if row.notes:
        lines += ["", "## Notes", ""] + [f"- {scrub(note, roots)}" for note in row.notes]
    lines += ["", "Check your notebook yourself before you hand it in: "
              "`.venv/bin/python -m mha_course check YOUR_NOTEBOOK.ipynb` prints the same "
              "messages.", ""]
    return "\n".join(lines)


def write_feedback(rows, folder: str | Path, assignment: Assignment, catalog: dict,
                   roots=()) -> list[Path]:
    """One Markdown file per row into ``folder`` (created); return the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    taken: set = set()
    written = []
    for row in rows:
        path = folder / file_name(row, taken)
        path.write_text(feedback_markdown(row, assignment, catalog, roots), encoding="utf-8")
        written.append(path)
    return written
