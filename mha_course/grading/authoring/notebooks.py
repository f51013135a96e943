"""Reading and writing notebooks, and the exercise metadata of their cells.

The bottom layer of the grading tools: every other module of :mod:`mha_course.grading` builds on
these. The notebook format is the contract in the course's exercise-format brief: every exercise
cell of a solution notebook carries ``metadata["mha_course"] = {"exercise": "03.2", "role":
ROLE}`` with ROLE one of ``setup``, ``task``, ``solution``, ``check``, ``text``, and each
solution cell holds one region between ``### BEGIN SOLUTION`` and ``### END SOLUTION``.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
ROLES = ("setup", "task", "solution", "check", "text")
ID_RE = re.compile(r"^(\d\d)\.([1-9]\d*)$")
LESSON_RE = re.compile(r"^\d\d$")
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class ExerciseError(Exception):
    """A problem with a notebook or a command, reported as one clear line (exit code 2)."""


@dataclass
class CellRole:
    """What a code cell of the notebook the checker runs is: its exercise, role and label.

    ``exercise`` is None for a cell that belongs to no exercise (a setup cell, or a cell
    before the first exercise); ``label`` names the cell in messages ("your solution cell",
    "the check cell `check_x(x)`").
    """

    exercise: str | None
    role: str
    label: str


def course_root() -> Path:
    """Return the folder holding ``solutions/``: the current folder, else the package's parent."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parents[3]):
        if (candidate / "solutions").is_dir():
            return candidate
    return Path.cwd()


def read_notebook(path: str | Path, data: bytes | None = None) -> nbformat.NotebookNode:
    """Read a notebook, or raise :class:`ExerciseError` with a one-line reason.

    ``data``, when given, is the file's content read earlier (the checker reads every
    submission before it runs any): ``path`` then only names it in messages.
    """
    path = Path(path)
    if data is None:
        if not path.exists():
            raise ExerciseError(f"{path}: no such file")
        if path.is_dir():
            raise ExerciseError(f"{path}: is a folder, not a notebook")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ExerciseError(f"{path}: cannot read it ({exc})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExerciseError(f"{path}: cannot read it ({exc})") from None
    if not text.strip():
        raise ExerciseError(f"{path}: not a notebook: the file is empty ({len(data)} bytes)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # the whole reason: json's own message ends "... starting at" and needs its position
        at = "" if exc.msg.endswith(" at") else " at"
        raise ExerciseError(
            f"{path}: not a notebook: the file is not valid JSON ({exc.msg}{at} line "
            f"{exc.lineno}, column {exc.colno}; the file may have been cut short or edited by "
            "hand)"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ExerciseError(f"{path}: not a notebook: no list of cells in the JSON")
    version = data.get("nbformat")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ExerciseError(f'{path}: not a notebook: the JSON has no "nbformat" version number')
    if version < 4:
        raise ExerciseError(f"{path}: a notebook of format version {version}; open and save it "
                            "in JupyterLab to convert it to version 4")
    try:
        return nbformat.reads(text, as_version=4)
    except Exception as exc:  # nbformat raises several types for malformed notebooks
        raise ExerciseError(f"{path}: not a readable notebook ({exc})") from None


def info(cell) -> dict:
    """The cell's ``mha_course`` metadata (empty dict when there is none)."""
    meta = cell.get("metadata", {}).get("mha_course")
    return meta if isinstance(meta, dict) else {}


def nb_info(nb) -> dict:
    """The notebook's ``mha_course`` metadata (empty dict when there is none)."""
    meta = nb.get("metadata", {}).get("mha_course")
    return meta if isinstance(meta, dict) else {}


def notebook_text(nb) -> str:
    """The exact text ``nbformat.write`` would produce (indent 1, sorted keys, final newline)."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def lesson_of(exercise: str) -> str:
    """The lesson of an exercise id: ``"03.2"`` -> ``"03"``.

    >>> lesson_of("03.2")
    '03'
    """
    return exercise.split(".")[0]


#: Exercise ids that moved, wave by wave, oldest first: ``(lessons, ids, why)``. ``lessons`` maps
#: an old lesson number to its new one (every ``09.N`` became ``13.N``), ``ids`` maps single
#: ids. An old id is followed through every later wave, so a wave-2 drill id ``09.3`` is now
#: ``15.3``. In wave 3 the interview drill moved from lesson 09 to lesson 13 (so that it stays
#: the course's last stop); in wave 4 lesson 11 split into devices (11) and precision (12), the
#: attention block of 2025 became lesson 13 and the drill lesson 15 (after the rapid questions,
#: lesson 14).
ID_MOVES = (
    ({"09": "13"}, {}, "the interview drill moved from lesson 09 to lesson 13"),
    ({"13": "15", "12": "13"}, {"11.5": "12.1"},
     "wave 4: the drill is lesson 15, the 2025 block 13, precision 12"),
)

#: Lesson numbers whose whole exercise notebook moved: ``{old: (new, why)}``, every wave
#: followed (lesson 09's drill is lesson 15's now, though 09 is the tiny GPT's number again).
MOVED_LESSONS = {"09": ("15", "the interview drill moved from lesson 09 to lesson 13, then 15"),
                 "12": ("13", ID_MOVES[1][2]), "13": ("15", ID_MOVES[1][2])}


def _moves(exercise: str) -> tuple[str, list[str]]:
    lesson, _, number = exercise.partition(".")
    current, why = exercise, []
    for lessons, ids, reason in ID_MOVES:
        lesson, _, number = current.partition(".")
        new = ids.get(current) or (f"{lessons[lesson]}.{number}" if lesson in lessons and number
                                   else current)
        if new != current:
            current = new
            why.append(reason)
    return current, why


def moved_id(exercise: str) -> str | None:
    """Where an exercise id of an earlier wave lives now, or None.

    >>> moved_id("09.3")
    '15.3'
    >>> moved_id("12.2"), moved_id("11.5"), moved_id("13.4")
    ('13.2', '12.1', '15.4')
    >>> moved_id("03.2") is None
    True
    """
    new, _ = _moves(exercise)
    return None if new == exercise else new


def moved_why(exercise: str) -> str:
    """Why an old id moved (the waves' reasons joined), or "" when it did not."""
    return "; then ".join(_moves(exercise)[1])


def moved_message(exercise: str, known) -> str | None:
    """One line for an id that a saved command may still use from before a lesson moved.

    For an id that no longer exists: "12.3 is now 13.3 (...)". For an id that exists again
    in a lesson's new content, a note that it names a different exercise than it used to.
    None when the id never moved or its new home does not exist.

    >>> moved_message("12.3", ["13.3"])
    '12.3 is now 13.3 (wave 4: the drill is lesson 15, the 2025 block 13, precision 12): pass 13.3'
    >>> moved_message("09.3", ["15.3"]).split(": pass")[0].split(" (")[0]
    '09.3 is now 15.3'
    >>> moved_message("13.3", ["13.3", "15.3"])
    'note: 13.3 is an exercise of lesson 13 now; the exercise that was 13.3 before is now 15.3'
    """
    new = moved_id(exercise)
    if new is None or new not in known:
        return None
    lesson = lesson_of(exercise)
    if exercise in known:
        return (f"note: {exercise} is an exercise of lesson {lesson} now; the exercise that was "
                f"{exercise} before is now {new}")
    return f"{exercise} is now {new} ({moved_why(exercise)}): pass {new}"


def id_key(exercise: str) -> tuple[int, int]:
    """Sort key of an exercise id, so that 01.10 comes after 01.9."""
    lesson, number = exercise.split(".")
    return int(lesson), int(number)


def sort_ids(ids) -> list[str]:
    """Exercise ids in lesson order, without repeats.

    >>> sort_ids(["03.2", "01.10", "01.9", "03.2"])
    ['01.9', '01.10', '03.2']
    """
    return sorted(set(ids), key=id_key)


def is_stub(source: str, exercise: str) -> bool:
    """Whether a solution cell still raises the exercise's ``NotImplementedError`` stub.

    >>> is_stub('raise NotImplementedError("Exercise 03.2: write attention")', "03.2")
    True
    >>> is_stub("def f(x):\\n    return 2 * x", "03.2")
    False
    """
    return bool(re.search(r"raise\s+NotImplementedError\(\s*[\"']Exercise "
                          + re.escape(exercise) + r"\b", source))


def first_line(source: str) -> str:
    """The first non-blank line of a cell, stripped and cut to 60 characters, for messages.

    >>> first_line("\\n  import math  \\nx = 1")
    'import math'
    """
    line = next((s.strip() for s in source.split("\n") if s.strip()), "")
    return line if len(line) <= 60 else line[:57] + "..."


def clean(text: str) -> str:
    """``text`` without ANSI colour codes (tracebacks from a kernel are coloured)."""
    return ANSI_RE.sub("", text or "")


def defined_names(source: str) -> tuple[str, ...]:
    """The names a cell defines at its top level (functions, classes, assignments), in order.

    >>> defined_names("import math\\ndef f(x):\\n    return x\\nanswer = 42\\nclass C: pass")
    ('f', 'answer', 'C')
    >>> defined_names("def f(:")
    ()
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    names: list[str] = []
    for node in tree.body:
        found: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = [node.name]
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found = [t.id for t in targets if isinstance(t, ast.Name)]
        names += [n for n in found if n not in names]
    return tuple(names)
