"""Intake: a folder of submissions as an LMS download has it, turned into one entry per student.

Not taught in a lesson: folder mode of ``python -m mha_course check`` reads the folders with
:func:`collect` (pure file-system reads, no notebook is parsed here). It

- takes every ``.ipynb`` file (``.IPYNB`` too) and every sub-folder as a submission, and lists
  every other file it skips with the reason: not a notebook, a hidden file, a system folder
  (``__MACOSX``, ``.ipynb_checkpoints``);
- reads the student behind a file name: Canvas's ``name_LATE_userid_submissionid_file`` (the
  ``LATE`` marker makes the submission late), Moodle's ``Full Name_id_assignsubmission_file_...``
  (a file, or a folder of files), a browser's duplicate ``alice (1).ipynb``; names are
  NFC-normalised, so an accent typed two ways is one student;
- maps names to student ids with a roster (:func:`read_roster`: a CSV with a ``file`` and an
  ``id`` column, and an optional ``name``);
- keeps, of several copies of one student's notebook, the newest (by modification time) and
  lists the others;
- marks a submission late by the LMS marker, or when ``deadline`` is given and its newest
  notebook was modified after it;
- orders the submissions as a gradebook lists students: in the roster's order when a roster is
  given (students not in it after, by name), else by the name shown, ignoring case
  (Canvas's ``andersalice_12345_...`` shows as ``andersalice``: a roster gives real names).

``jay.ipynb`` and a folder ``jay/`` stay two submissions (a folder is a student's own).
"""

from __future__ import annotations

import csv
import re
import unicodedata
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

#: System folders an archive or Jupyter adds, with what they are.
SYSTEM = {"__MACOSX": "macOS archive metadata", ".ipynb_checkpoints": "Jupyter's autosaved "
          "checkpoints"}
CANVAS_RE = re.compile(r"^(?P<name>[^_]+)_(?P<late>LATE_)?(?P<uid>\d+)_(?P<sid>\d+)_(?P<file>.+)$")
MOODLE_RE = re.compile(r"^(?P<name>.+?)_(?P<pid>\d+)_assign(?:submission|feedback)_[a-z]+_"
                       r"(?P<file>.*)$")
COPY_RE = re.compile(r"\s*\(\d+\)$")


def nfc(text: str) -> str:
    """``text`` in Unicode NFC: "é" typed as one character or as "e" and an accent is one name.

    >>> nfc("Jose\\u0301") == "José"
    True
    """
    return unicodedata.normalize("NFC", text)


@dataclass
class Student:
    """Who a file name says handed it in: a display name, an id, and the LMS's late marker."""

    name: str
    id: str = ""
    late: bool = False
    lms: str = ""


def parse_name(name: str) -> Student:
    """The student behind a submission's file or folder name (without ``.ipynb``).

    >>> parse_name("lovelaceada_LATE_12345_67890_homework1")
    Student(name='lovelaceada', id='12345', late=True, lms='Canvas')
    >>> parse_name("Ada Lovelace_4242_assignsubmission_file_")
    Student(name='Ada Lovelace', id='4242', late=False, lms='Moodle')
    >>> parse_name("alice (1)")
    Student(name='alice', id='', late=False, lms='')
    """
    name = nfc(name)
    match = CANVAS_RE.match(name)
    if match:
        return Student(match.group("name"), match.group("uid"), bool(match.group("late")),
                       "Canvas")
    match = MOODLE_RE.match(name)
    if match:
        return Student(match.group("name").strip(), match.group("pid"), False, "Moodle")
    return Student(COPY_RE.sub("", name).strip() or name)


def read_roster(path: str | Path) -> dict[str, Student]:
    """A roster CSV: ``{file or name, case-folded and NFC: Student(name, id)}``.

    Its header names the columns: ``file`` (a file name, a student's folder, or the name a
    file starts with; ``login`` or ``name`` are taken when there is no ``file``), ``id`` (or
    ``student id``, ``sis user id``) and optionally ``name`` (the name shown). UTF-8, with or
    without a BOM (Excel's).

    Raises
    ------
    ValueError
        For a missing file, no usable header, or a row without its key or id.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the roster ({exc})") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise ValueError(f"{path}: the roster is empty")
    header = [nfc(h).strip().casefold() for h in rows[0]]

    def column(*names):
        return next((header.index(n) for n in names if n in header), None)

    key = column("file", "filename", "login", "username", "name")
    sid = column("id", "student id", "student_id", "sis user id", "sis_user_id")
    shown = column("name", "student", "full name")
    if key is None or sid is None:
        raise ValueError(f"{path}: the roster needs a header with a 'file' (or 'login', "
                         f"'name') column and an 'id' column; got {', '.join(rows[0])}")
    roster = {}
    for n, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) <= max(key, sid) or not row[key].strip() or not row[sid].strip():
            raise ValueError(f"{path}: line {n} has no {rows[0][key]} or no {rows[0][sid]}")
        name = row[shown].strip() if shown is not None and shown < len(row) else row[key]
        roster[_fold(Path(row[key].strip()).name)] = Student(nfc(name.strip()),
                                                               row[sid].strip())
    return roster


def _fold(text: str) -> str:
    text = nfc(text).strip()
    if text.lower().endswith(".ipynb"):
        text = text[:-6]
    return text.rstrip("/").casefold()


@dataclass
class Submission:
    """One student's hand-in: a notebook, or a folder of notebooks, and who it is from."""

    name: str
    notebooks: list[Path]
    source: Path
    folder: bool = False
    student_id: str = ""
    late: bool = False
    #: Older copies of this student's notebook that were not graded (newest first).
    copies: list[Path] = field(default_factory=list)
    #: When its newest notebook was last modified (seconds since the epoch), or None.
    modified: float | None = None
    notes: list[str] = field(default_factory=list)
    #: Its line in the roster (0 first), or None: the gradebook lists students in that order.
    roster_line: int | None = None


@dataclass
class Intake:
    """What :func:`collect` found: the submissions, and every file it skipped with why."""

    submissions: list[Submission] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _why_skipped(entry: Path) -> str:
    if entry.name in SYSTEM:
        return SYSTEM[entry.name]
    if entry.name.startswith("."):
        return "a hidden file" if entry.is_file() else "a hidden folder"
    if entry.name.startswith("__"):
        return "a system folder"
    if entry.is_file() and entry.suffix.lower() != ".ipynb":
        return "not a notebook (.ipynb)"
    if not entry.is_file() and not entry.is_dir():
        return "not a file or a folder"
    return ""


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _label(entry: Path, base: Path) -> str:
    try:
        rel = entry.relative_to(base).as_posix()
    except ValueError:
        rel = entry.name
    return rel + ("/" if entry.is_dir() else "")


def _folder_notebooks(folder: Path, base: Path, skipped: list) -> list[Path]:
    """Every notebook under a student's folder; what else is there goes to ``skipped``."""
    found = []
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        hidden = next((p for p in parts[:-1] if _why_skipped(folder / p)), None)
        if hidden is not None:
            continue  # inside a skipped folder: the folder itself is listed once
        why = _why_skipped(path)
        if why:
            skipped.append((_label(path, base), why))
        elif path.is_file():
            found.append(path)
    return found


def collect(paths, roster: dict | None = None, deadline: datetime | None = None) -> Intake:
    """The submissions in ``paths`` (files, and folders whose entries are submissions).

    ``roster`` is what :func:`read_roster` returned; ``deadline`` (naive = local time) marks a
    submission late when its newest notebook was modified after it.
    """
    intake = Intake()
    found: list[Submission] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            student = parse_name(path.stem)
            found.append(Submission(nfc(path.stem), [path], path, student_id=student.id,
                                    late=student.late, modified=_mtime(path)))
            continue
        for entry in sorted(path.iterdir()):
            why = _why_skipped(entry)
            if why:
                intake.skipped.append((_label(entry, path), why))
                continue
            is_folder = entry.is_dir()
            notebooks = (_folder_notebooks(entry, path, intake.skipped) if is_folder
                         else [entry])
            student = parse_name(entry.name if is_folder else entry.stem)
            times = [t for t in map(_mtime, notebooks) if t is not None]
            found.append(Submission(student.name, notebooks, entry, is_folder, student.id,
                                    student.late, modified=max(times) if times else None))
    for sub in found:
        _apply_roster(sub, roster)
    intake.submissions = _newest_copies(found)
    intake.submissions.sort(key=lambda s: (s.roster_line is None, s.roster_line or 0,
                                           s.name.casefold()))  # stable: one name, file order
    _keep_apart(intake.submissions)
    if deadline is not None:
        stamp = deadline.timestamp()
        for sub in intake.submissions:
            if sub.modified is not None and sub.modified > stamp:
                sub.late = True
    return intake


def _apply_roster(sub: Submission, roster: dict | None) -> None:
    if not roster:
        return
    stem = sub.source.name if sub.folder else sub.source.stem
    for key in (_fold(stem), _fold(COPY_RE.sub("", nfc(stem))), _fold(sub.name)):
        if key in roster:
            sub.name, sub.student_id = roster[key].name, roster[key].id
            sub.roster_line = list(roster).index(key)
            return
    if not sub.student_id:
        sub.notes.append(f"{sub.source.name} is not in the roster")


def _newest_copies(found: list[Submission]) -> list[Submission]:
    """One submission per student file: the newest copy; the others listed on it."""
    groups: dict[tuple, list[Submission]] = {}
    for sub in found:
        key = ("folder", sub.source) if sub.folder else (
            "id", sub.student_id) if sub.student_id else ("name", sub.name.casefold())
        groups.setdefault(key, []).append(sub)
    kept = []
    for subs in groups.values():
        subs.sort(key=lambda s: (s.modified or 0.0, -len(s.source.name)), reverse=True)
        newest = subs[0]
        for older in subs[1:]:
            newest.copies.append(older.source)
            newest.notes.append(f"{older.source.name} is an older copy of {newest.source.name}"
                                "; only the newest is graded")
        kept.append(newest)
    order = {id(sub): n for n, sub in enumerate(found)}
    return sorted(kept, key=lambda s: order[id(s)])


def _keep_apart(subs: list[Submission]) -> None:
    """Rows whose names clash (``jay.ipynb`` and ``jay/``) are named by their file instead."""
    for longer in (lambda s: s.source.name + ("/" if s.folder else ""), lambda s: str(s.source)):
        counts: dict[str, int] = {}
        for sub in subs:
            counts[sub.name] = counts.get(sub.name, 0) + 1
        for sub in subs:
            if counts[sub.name] > 1:
                sub.name = longer(sub)
