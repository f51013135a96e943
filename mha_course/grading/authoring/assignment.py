"""The instructor's assignment file: what is graded, for how many points, by when.

Not taught in a lesson: ``python -m mha_course assign`` writes it beside the assignment
notebook (``homework1.ipynb`` -> ``homework1.assignment.json``), and ``python -m mha_course
check SUBMISSIONS --assignment homework1.assignment.json`` grades every submission against it:
its exercises are the gradebook's columns and its points the totals, whatever a submission's
own metadata says. The nbgrader and Gradescope exports read the same file.

Why JSON: the standard library reads and writes it on every Python the course supports (TOML
can only be read, and only from 3.11), it is the format of the notebook metadata that carries
the same data to the students' copy, and a spreadsheet or an LMS script reads it as easily.

The file (format version 1)::

    {
     "format": "mha-course-assignment",
     "version": 1,
     "title": "Week 2: attention",
     "due": "2025-03-14T23:59:00",
     "exercises": [{"id": "03.1", "points": 1}, {"id": "04.5", "points": 4}],
     "notebook": "homework1.ipynb",
     "probe_seed": null
    }

``due`` is ISO 8601 (a date alone means 23:59:59 that day; no offset means the grading
machine's local time), or null. ``probe_seed`` (an integer, or null) makes grading run every
check a second time with its random inputs drawn from other seeds, which the students' local
checks never used. ``points`` may be fractional; they default to the exercise's stars (★ = 1,
★★ = 2, ★★★ = 3).

Public API:

- :class:`Assignment` (frozen): ``exercises`` (ids, in lesson order), ``points`` (``{id:
  points}``), ``title``, ``due``, ``notebook``, ``probe_seed``; ``max_points``,
  ``due_datetime()``, ``to_dict()``;
- :func:`make_assignment` ``(ids, catalog, points=None, title="", due=None, ...)``: from ids
  as typed (``"3.1, 4.5"``) and the :func:`~mha_course.grading.authoring.catalog.exercises` catalog;
- :func:`parse_points` ``("03.1=2,4.5=4") -> {"03.1": 2, "04.5": 4}``; :func:`parse_due`;
- :func:`load_assignment` ``(path)``: the JSON file, or the assignment notebook ``assign``
  wrote (it carries the same data in its metadata); :func:`save_assignment` ``(assignment,
  path, force=False)``; :func:`assignment_path_for` ``(notebook) -> the JSON file's path``;
- :func:`from_dict`: the same checks on data already loaded (the notebook metadata).

Every problem raises a :class:`ValueError` that names the file and the field.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, time
from pathlib import Path

from .catalog import normal_id, parse_ids
from .notebooks import ID_RE, id_key

FORMAT = "mha-course-assignment"
VERSION = 1
#: The notebook metadata key (under ``mha_course``) that carries the assignment's data.
NOTEBOOK_KEY = "assignment_info"
SUFFIX = ".assignment.json"
_KEYS = {"format", "version", "title", "due", "exercises", "notebook", "probe_seed"}


@dataclass(frozen=True)
class Assignment:
    """What the instructor decided (see the module docstring)."""

    exercises: tuple[str, ...]
    points: dict = field(default_factory=dict)
    title: str = ""
    due: str | None = None
    notebook: str | None = None
    probe_seed: int | None = None

    @property
    def max_points(self) -> float:
        return sum(self.points[x] for x in self.exercises)

    def due_datetime(self) -> datetime | None:
        """The due date as a datetime (naive = local time), or None."""
        return datetime.fromisoformat(self.due) if self.due else None

    def to_dict(self) -> dict:
        """The JSON object of the file."""
        return {"format": FORMAT, "version": VERSION, "title": self.title, "due": self.due,
                "exercises": [{"id": x, "points": self.points[x]} for x in self.exercises],
                "notebook": self.notebook, "probe_seed": self.probe_seed}


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a number of points >= 0, got {value!r}")
    return int(value) if float(value).is_integer() else float(value)


def number(value: float) -> str:
    """A number for the CSV: ``2``, ``2.5`` (no ``2.0``).

    >>> number(2.0), number(2.5), number(71.42857)
    ('2', '2.5', '71.43')
    """
    value = round(float(value), 2)
    return str(int(value)) if value.is_integer() else f"{value:g}"


def parse_points(text) -> dict[str, float]:
    """``"03.1=2,4.5=4"`` (or a list of such strings) -> ``{"03.1": 2, "04.5": 4}``.

    >>> parse_points("3.1=2, 04.5=0.5")
    {'03.1': 2, '04.5': 0.5}

    Raises
    ------
    ValueError
        For an item that is not ``ID=POINTS`` or points that are not a number >= 0.
    """
    parts = [text] if isinstance(text, str) else list(text or [])
    points = {}
    for item in (t for part in parts for t in re.split(r"[,;\s]+", part) if t):
        exercise, sep, value = item.partition("=")
        exercise = normal_id(exercise.strip())
        if not sep or not ID_RE.match(exercise):
            raise ValueError(f"--points: {item!r} is not ID=POINTS (e.g. 03.1=2)")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"--points: {item!r}: {value!r} is not a number") from None
        points[exercise] = _number(number, f"--points: the points of {exercise}")
    return points


def parse_due(text: str | None) -> str | None:
    """An ISO 8601 date or date and time, normalised; a date alone means 23:59:59 that day.

    >>> parse_due("2025-03-14")
    '2025-03-14T23:59:59'
    >>> parse_due("2025-03-14 18:00+01:00")
    '2025-03-14T18:00:00+01:00'

    Raises
    ------
    ValueError
        When ``text`` is not such a date.
    """
    if text is None or not str(text).strip():
        return None
    text = str(text).strip()
    try:
        if re.fullmatch(r"\d{4}-\d\d-\d\d", text):
            return datetime.combine(datetime.fromisoformat(text).date(),
                                    time(23, 59, 59)).isoformat()
        return datetime.fromisoformat(text.replace(" ", "T", 1)).isoformat()
    except ValueError:
        raise ValueError(f"due date {text!r} is not an ISO 8601 date or date and time "
                         "(e.g. 2025-03-14 or 2025-03-14T23:59 or 2025-03-14T23:59+01:00)"
                         ) from None


def make_assignment(ids, catalog: dict, points=None, title: str = "", due=None,
                    notebook: str | None = None, probe_seed: int | None = None) -> Assignment:
    """An assignment of ``ids`` (as typed: ``"3.1, 4.5"``, a list, lessons), points by stars.

    ``catalog`` is what :func:`mha_course.grading.authoring.catalog.exercises` returned; ``points``
    overrides the default points (``{id: points}`` or the text of :func:`parse_points`).

    Raises
    ------
    ValueError
        For an unknown id, a points override for an exercise not in the assignment, a bad
        due date or probe seed.
    """
    chosen = parse_ids(ids, known=list(catalog))
    overrides = parse_points(points) if isinstance(points, (str, list)) else dict(points or {})
    extra = sorted(set(overrides) - set(chosen), key=id_key)
    if extra:
        raise ValueError(f"--points names {' '.join(extra)}, which the assignment does not "
                         f"have (it has {' '.join(chosen)})")
    table = {x: _number(overrides.get(x, catalog[x].points), f"the points of {x}")
             for x in chosen}
    if probe_seed is not None and (isinstance(probe_seed, bool)
                                   or not isinstance(probe_seed, int) or probe_seed < 0):
        raise ValueError(f"the probe seed must be an integer >= 0, got {probe_seed!r}")
    return Assignment(tuple(chosen), table, str(title or "").strip(), parse_due(due),
                      notebook, probe_seed)


def from_dict(data, where: str = "the assignment") -> Assignment:
    """An :class:`Assignment` from the file's JSON object, every field checked.

    Raises
    ------
    ValueError
        Starting with ``where`` (the file's name), naming the field that is wrong.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not an assignment (expected a JSON object)")
    if data.get("format") != FORMAT:
        raise ValueError(f"{where}: not an assignment file (\"format\" is "
                         f"{data.get('format')!r}, expected {FORMAT!r})")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"{where}: \"version\" must be an integer, got {version!r}")
    if version > VERSION:
        raise ValueError(f"{where}: format version {version}, written by a newer mha-course "
                         f"(this one reads version {VERSION}); update the course")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown field{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)} (known: {', '.join(sorted(_KEYS))})")
    items = data.get("exercises")
    if not isinstance(items, list) or not items:
        raise ValueError(f"{where}: \"exercises\" must be a non-empty list of "
                         '{"id": "03.1", "points": 1}')
    ids, points = [], {}
    for n, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"id", "points"}:
            raise ValueError(f"{where}: exercises[{n}] must be {{\"id\": ..., \"points\": ...}}"
                             f", got {item!r}")
        exercise = item["id"]
        if not isinstance(exercise, str) or not ID_RE.match(exercise):
            raise ValueError(f"{where}: exercises[{n}].id {exercise!r} is not an id like 03.1")
        if exercise in points:
            raise ValueError(f"{where}: exercise {exercise} is listed twice")
        points[exercise] = _number(item["points"], f"{where}: exercises[{n}].points")
        ids.append(exercise)
    title = data.get("title") or ""
    if not isinstance(title, str):
        raise ValueError(f"{where}: \"title\" must be a string, got {title!r}")
    try:
        due = parse_due(data.get("due"))
    except ValueError as exc:
        raise ValueError(f"{where}: \"due\": {exc}") from None
    notebook = data.get("notebook")
    if notebook is not None and not isinstance(notebook, str):
        raise ValueError(f"{where}: \"notebook\" must be a file name or null, got {notebook!r}")
    seed = data.get("probe_seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"{where}: \"probe_seed\" must be an integer >= 0 or null, got {seed!r}")
    return Assignment(tuple(sorted(ids, key=id_key)), points, title, due, notebook, seed)


def load_assignment(path: str | Path) -> Assignment:
    """Read an assignment: the ``.assignment.json`` file, or the notebook ``assign`` wrote.

    Raises
    ------
    ValueError
        Naming the file: missing, unreadable, not JSON, not an assignment, a bad field.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such assignment file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read it ({exc})") from None
    except json.JSONDecodeError as exc:
        at = "" if exc.msg.endswith(" at") else " at"
        raise ValueError(f"{path}: not valid JSON ({exc.msg}{at} line {exc.lineno}, column "
                         f"{exc.colno})") from None
    if path.suffix.lower() == ".ipynb":
        meta = data.get("metadata", {}).get("mha_course", {}) if isinstance(data, dict) else {}
        spec = meta.get(NOTEBOOK_KEY) if isinstance(meta, dict) else None
        if spec is None:
            raise ValueError(f"{path}: a notebook without an assignment in its metadata (was it "
                             "written by `python -m mha_course assign`? pass its "
                             f"{SUFFIX} file instead)")
        return from_dict(spec, str(path))
    return from_dict(data, str(path))


def assignment_text(assignment: Assignment) -> str:
    """The file's text: indented JSON, keys in a fixed order, a final newline."""
    return json.dumps(assignment.to_dict(), indent=1, ensure_ascii=False) + "\n"


def save_assignment(assignment: Assignment, path: str | Path, force: bool = False) -> Path:
    """Write ``assignment`` to ``path`` (refuses to overwrite unless ``force``).

    Raises
    ------
    ValueError
        When ``path`` exists and ``force`` is not set.
    """
    path = Path(path)
    if path.exists() and not force:
        raise ValueError(f"{path} already exists; use --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(assignment_text(assignment), encoding="utf-8", newline="\n")
    return path


def assignment_path_for(notebook: str | Path) -> Path:
    """Where ``assign`` writes the assignment of ``notebook``: beside it, ``.assignment.json``.

    >>> assignment_path_for("out/hw1.ipynb").as_posix()
    'out/hw1.assignment.json'
    """
    notebook = Path(notebook)
    return notebook.with_name(notebook.stem + SUFFIX)
