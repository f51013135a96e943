"""Feedback for each student: a Markdown file with what passed, what failed and why.

Not taught in a lesson: ``python -m mha_course check SUBMISSIONS --assignment A --feedback DIR``
writes one file per student (:func:`write_feedback`) from their
:class:`~mha_course.grading.reporting.gradebook.GradeRow`: the score, a table of the exercises with
their points, and for each exercise that did not pass the checker's own words (what is wrong
and the likely mistake), as the student's local check says it. Nothing in a file names a path
of the instructor's machine (:func:`scrub`): the course's own files read ``mha_course/...``,
installed packages ``<site-packages>/...`` and Python's own ``<python>/...``; the submissions
folder, the course checkout, the home folder (also as a kernel writes it, ``~/...``) and the
temporary folders are cut to file names.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from ..authoring.assignment import Assignment, number
from .gradebook import GradeRow

#: Statuses as the feedback says them.
SAID = {"passed": "passed", "failed": "not yet right", "not attempted": "not attempted",
        "timed out": "ran too long", "crashed": "crashed the kernel", "not checked":
        "could not be checked", "missing": "missing", "error": "could not be read"}
#: The last paragraph: how a student checks their work again (a check cell works wherever the
#: notebook runs; the whole-notebook check needs the course folder, which holds the solutions).
FOOTER = ("Check your work before you hand it in: restart the kernel and run all cells; each "
          "exercise's check cell prints `Exercise NN.M passed` or says what is wrong. In a copy "
          "of the course (the folder you cloned), `.venv/bin/python -m mha_course check "
          "YOUR_NOTEBOOK.ipynb`, run in that folder, checks the whole notebook and prints "
          "these messages.")
_UNSAFE = re.compile(r'[\x00-\x1f<>:"/\\|?*]+')
#: The characters a path's part may hold in a message (not a space, quote, bracket or colon).
_PART = r"[^\s'\"`()\[\],:;/]+"
#: An absolute (or ``~/``) path up to the folder that holds the course's package.
_COURSE_PACKAGE = re.compile(rf"(?<![\w.<>~/])~?(?:/{_PART})+/(?=mha_course/)")
#: ... up to an installed package (``.../site-packages/``, Debian's ``dist-packages``).
_SITE_PACKAGES = re.compile(rf"(?<![\w.<>~/])~?(?:/{_PART})*/(?:site|dist)-packages/")
#: ... up to Python's standard library (``/usr/lib/python3.12/``, a pyenv's).
_PYTHON_LIB = re.compile(rf"(?<![\w.<>~/])~?(?:/{_PART})*/lib/python3(?:\.\d+)?/")
#: The folders of a path in the home folder (the file name stays).
_HOME_PATH = re.compile(rf"(?<![\w.<>])~/(?:{_PART}/)*")
#: The folders of a path in a temporary folder.
_TEMP_PATH = re.compile(rf"(?<![\w.])/(?:tmp|var|private)/(?:{_PART}/)*")
#: The course checkout this module belongs to (in a wheel: the site-packages folder).
_COURSE_ROOT = Path(__file__).resolve().parents[3]


def scrub(text: str, roots=()) -> str:
    """``text`` without the folders of this machine (see the module docstring).

    >>> scrub("error: /home/ta/subs/bob.ipynb: not JSON", ["/home/ta/subs"])
    'error: bob.ipynb: not JSON'
    >>> scrub("File ~/trial/course/.venv/lib/python3.12/site-packages/numpy/_core/x.py:57")
    'File <site-packages>/numpy/_core/x.py:57'
    >>> scrub("File /opt/course/.venv/lib/python3.12/site-packages/mha_course/checks/c.py:3")
    'File mha_course/checks/c.py:3'
    """
    # the course's own modules, wherever they are installed (a checkout, a wheel in a venv)
    text = _COURSE_PACKAGE.sub("", text)
    text = _SITE_PACKAGES.sub("<site-packages>/", text)
    text = _PYTHON_LIB.sub("<python>/", text)
    found = {str(Path(r)) for r in roots if str(r)}
    found |= {os.getcwd(), str(_COURSE_ROOT)}
    temp = tempfile.gettempdir()
    if not _TEMP_PATH.match(temp + "/x/"):  # else cut below, to the file name
        found.add(temp)
    home = str(Path.home())
    found.discard(home)  # cut below, to the file name, as a kernel's ``~/...`` is
    for root in sorted((r for r in found if len(r) > 1), key=len, reverse=True):
        text = text.replace(root + os.sep, "").replace(root, "")
    if len(home) > 1:  # the home folder becomes ``~``, as IPython writes it, then is cut below
        text = re.sub(re.escape(home) + r"(?=/|\b|$)", "~", text)
    text = _HOME_PATH.sub("", text)
    return _TEMP_PATH.sub("", text)


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
    reasons = {v.message for v in row.verdicts.values()}
    if (len(row.verdicts) > 1 and len(reasons) == 1 and not any(v.notes for v in
                                                                row.verdicts.values())
            and all(v.status == "error" for v in row.verdicts.values())):
        # nothing could be graded, for one reason (no notebook, not a notebook): say it once
        lines += ["", f"**No exercise could be graded**: {scrub(reasons.pop(), roots)}"]
        verdicts = {}
    else:
        verdicts = row.verdicts
    for exercise, verdict in verdicts.items():
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
    lines += ["", FOOTER, ""]
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
