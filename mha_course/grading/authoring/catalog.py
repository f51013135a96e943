"""The course's exercises as data: id, lesson, title, stars, default points, checks, functions.

Not taught in a lesson: the grading tools read it (``assign --list``, the assignment file of
:mod:`mha_course.grading.authoring.assignment`, the gradebook, the nbgrader and Gradescope
exports). It
is read from ``solutions/`` (the single source of the exercises), never kept in a second list.

Public API:

- :class:`ExerciseInfo`: one exercise, frozen: ``id`` ("03.2"), ``lesson`` ("03"), ``title``
  (from the task heading ``## Exercise 03.2 ★★ — <title>``), ``stars`` (1 to 3), ``points``
  (the default: ★ = 1, ★★ = 2, ★★★ = 3), ``checks`` (the check functions its check cell calls,
  ``("check_attention",)``) and ``functions`` (what its solution cell defines, what the learner
  writes: ``("attention",)``), so a notebook whose metadata was lost is still matched;
- :func:`exercises` ``(solutions=None) -> {id: ExerciseInfo}`` in lesson order (``solutions`` is
  the folder, default ``solutions/`` of the course, or what ``load_solutions`` returned);
- :func:`parse_ids` ``("3.1, 03.2 4.5") -> ["03.1", "03.2", "04.5"]``: ids as an instructor
  types them (``3.1`` means ``03.1``; commas or spaces; a lesson ``03`` means all of its
  exercises when ``known`` is given), checked against ``known`` with a :class:`ValueError`
  naming the bad id (and, for an old drill id, where it moved);
- :func:`exercise_of_check` and :func:`exercise_of_function`: which exercise a check cell or a
  solution cell belongs to, by the names it calls or defines.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .generate import load_solutions
from .notebooks import (
    ID_RE,
    course_root,
    defined_names,
    id_key,
    info,
    lesson_of,
    moved_message,
    sort_ids,
)

#: A task heading: ``## Exercise 03.2 ★★ — Scaled dot-product attention with a mask``.
HEADING_RE = re.compile(r"^#+\s*Exercise\s+(\d\d\.\d+)\s*(★*)\s*(?:[—–-]+\s*)?(.*?)\s*$")
#: Default points per star count.
POINTS_PER_STARS = {1: 1, 2: 2, 3: 3}


@dataclass(frozen=True)
class ExerciseInfo:
    """One exercise of the course (see the module docstring)."""

    id: str
    lesson: str
    title: str
    stars: int
    points: int
    checks: tuple[str, ...]
    functions: tuple[str, ...]

    @property
    def label(self) -> str:
        """``03.2 ★★ Scaled dot-product attention with a mask`` (what ``assign --list`` shows)."""
        return f"{self.id} {'★' * self.stars} {self.title}".rstrip()


def called_checks(source: str) -> tuple[str, ...]:
    """The ``check_*`` functions a cell calls (``checks.check_x(f)`` or ``check_x(f)``).

    >>> called_checks("checks.check_attention(attention)\\nprint(1)")
    ('check_attention',)
    >>> called_checks("x = 1")
    ()
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ()
    names: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name.startswith("check_") and name not in names:
            names.append(name)
    return tuple(names)


def _stars_and_title(text: str, exercise: str) -> tuple[int, str]:
    for line in text.split("\n"):
        match = HEADING_RE.match(line.strip())
        if match and match.group(1) == exercise:
            return len(match.group(2)), match.group(3)
    return 0, ""


def exercises(solutions=None) -> dict[str, ExerciseInfo]:
    """Every exercise of the solution notebooks, ``{id: ExerciseInfo}`` in lesson order.

    An exercise whose heading has no star gets 1 star (and 1 point), so no exercise is ever
    worth nothing by accident.
    """
    if solutions is None:
        solutions = course_root() / "solutions"
    found: dict[str, dict] = {}
    for _, (_, nb) in sorted(load_solutions(solutions).items()):
        for cell in nb.cells:
            meta = info(cell)
            exercise = meta.get("exercise")
            if not isinstance(exercise, str) or not ID_RE.match(exercise):
                continue
            entry = found.setdefault(exercise, {"stars": 0, "title": "", "checks": [],
                                                "functions": []})
            role = meta.get("role")
            if role == "task" and not entry["title"]:
                entry["stars"], entry["title"] = _stars_and_title(cell.source, exercise)
            elif role == "check":
                entry["checks"] += [n for n in called_checks(cell.source)
                                    if n not in entry["checks"]]
            elif role == "solution":
                entry["functions"] += [n for n in defined_names(cell.source)
                                       if n not in entry["functions"]]
    out = {}
    for exercise in sorted(found, key=id_key):
        entry = found[exercise]
        stars = min(max(entry["stars"], 1), 3)
        out[exercise] = ExerciseInfo(exercise, lesson_of(exercise), entry["title"], stars,
                                     POINTS_PER_STARS[stars], tuple(entry["checks"]),
                                     tuple(entry["functions"]))
    return out


def normal_id(token: str) -> str:
    """``3.1`` -> ``03.1``; ``3`` -> ``03``; anything else unchanged."""
    match = re.fullmatch(r"(\d{1,2})(?:\.(\d+))?", token)
    if not match:
        return token
    lesson = match.group(1).zfill(2)
    return f"{lesson}.{int(match.group(2))}" if match.group(2) is not None else lesson


def parse_ids(text, known=None) -> list[str]:
    """Exercise ids as an instructor types them, normalised, in lesson order, without repeats.

    ``text`` is a string (``"3.1, 03.2 4.5"``) or a list of such strings (a command line's
    arguments). With ``known`` (ids, or what :func:`exercises` returned) every id is checked
    and a lesson number (``03``) stands for all of that lesson's exercises.

    >>> parse_ids("3.1, 03.2 4.5")
    ['03.1', '03.2', '04.5']
    >>> parse_ids(["03", "1.2"], known=["01.2", "03.1", "03.2"])
    ['01.2', '03.1', '03.2']
    >>> parse_ids("3.9", known=["03.1"])
    Traceback (most recent call last):
    ...
    ValueError: unknown exercise '03.9'; known exercises: 03.1

    Raises
    ------
    ValueError
        For a token that is not an id, an unknown id or lesson, or no ids at all.
    """
    parts = [text] if isinstance(text, str) else list(text)
    tokens = [t for part in parts for t in re.split(r"[,;\s]+", str(part)) if t]
    known_ids = list(known) if known is not None else None
    wanted = []
    for token in tokens:
        exercise = normal_id(token)
        if re.fullmatch(r"\d\d", exercise) and known_ids is not None:
            of_lesson = [x for x in known_ids if lesson_of(x) == exercise]
            if not of_lesson:
                lessons = " ".join(sorted({lesson_of(x) for x in known_ids})) or "(none)"
                raise ValueError(f"lesson {exercise} has no exercises; the lessons with "
                                 f"exercises are {lessons}")
            wanted += of_lesson
            continue
        if not ID_RE.match(exercise):
            raise ValueError(f"{token!r} is not an exercise id (write it as 03.2 or 3.2)")
        if known_ids is not None and exercise not in known_ids:
            moved = moved_message(exercise, known_ids)
            if moved:
                raise ValueError(moved)
            raise ValueError(f"unknown exercise {exercise!r}; known exercises: "
                             f"{' '.join(known_ids) or '(none)'}")
        wanted.append(exercise)
    if not wanted:
        raise ValueError("no exercise ids given")
    return sort_ids(wanted)


def exercise_of_check(source: str, candidates: dict[str, ExerciseInfo]) -> str | None:
    """The exercise among ``candidates`` whose check ``source`` calls (None if none or several).

    >>> ex = {"03.1": ExerciseInfo("03.1", "03", "", 1, 1, ("check_a",), ("a",))}
    >>> exercise_of_check("checks.check_a(a)", ex)
    '03.1'
    """
    called = set(called_checks(source))
    hits = [x for x, e in candidates.items() if called & set(e.checks)]
    return hits[0] if len(hits) == 1 else None


def exercise_of_function(source: str, candidates: dict[str, ExerciseInfo]) -> str | None:
    """The exercise among ``candidates`` whose function ``source`` defines (None if none/several).

    >>> ex = {"03.1": ExerciseInfo("03.1", "03", "", 1, 1, ("check_a",), ("a",))}
    >>> exercise_of_function("def a(q, k):\\n    return q", ex)
    '03.1'
    """
    names = set(defined_names(source))
    hits = [x for x, e in candidates.items() if names & set(e.functions)]
    return hits[0] if len(hits) == 1 else None

