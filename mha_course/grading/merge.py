"""The notebook the checker runs: the reference with the learner's solution cells put in.

:func:`reference_for` finds the solution notebook (or, for an assignment, builds the bundle of
solutions) that a learner's notebook answers; :func:`merge_learner` copies it and puts in the
learner's solution cells, so every output compared is the solution's, never the learner's saved
one, and the learner's file is never written.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

from .bundle import build_bundle
from .generate import stub_source, validate_solution_notebook
from .notebooks import (
    ID_RE,
    LESSON_RE,
    CellRole,
    ExerciseError,
    info,
    lesson_of,
    nb_info,
    read_notebook,
    sort_ids,
)


def reference_for(learner_nb, path: Path, solutions_dir: str | Path):
    """Return ``(reference notebook, label)``: the solution (or bundle) the learner's file is for.

    Raises
    ------
    ExerciseError
        For a foreign notebook or one whose lesson has no solution notebook.
    """
    meta = nb_info(learner_nb)
    assignment = meta.get("assignment")
    if assignment is not None:
        if not isinstance(assignment, list) or not all(isinstance(x, str) for x in assignment):
            raise ExerciseError(f"{path}: metadata mha_course.assignment is not a list of ids")
        label = f"the solutions of exercises {' '.join(sort_ids(assignment))}"
        return build_bundle(assignment, solutions_dir, stub=False), label
    lesson = meta.get("lesson")
    if lesson is None:
        lessons = {lesson_of(info(c)["exercise"]) for c in learner_nb.cells
                   if isinstance(info(c).get("exercise"), str) and ID_RE.match(info(c)["exercise"])}
        if len(lessons) == 1:
            lesson = lessons.pop()
        elif re.match(r"^\d\d_", path.name) and lessons:
            lesson = path.name[:2]
    if not isinstance(lesson, str) or not LESSON_RE.match(lesson):
        raise ExerciseError(
            f"{path}: not a course exercise notebook (no mha_course metadata and no exercise cells)"
        )
    matches = sorted(Path(solutions_dir).glob(f"{lesson}_*.ipynb"))
    if len(matches) != 1:
        raise ExerciseError(
            f"{path}: lesson {lesson}: expected one solution notebook "
            f"{solutions_dir}/{lesson}_*.ipynb, found {len(matches)}"
        )
    ref = read_notebook(matches[0])
    validate_solution_notebook(ref, matches[0])
    try:
        label = str(matches[0].resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        label = str(matches[0])
    return ref, label


_MARKER_RE = re.compile(r"^\s*#+\s*(NBVAL_\w+|PYTEST_VALIDATE_\w+)\s*$", re.MULTILINE)


def merge_learner(ref, learner, stubbed=()):
    """The notebook the checker runs: ``ref`` with the learner's solution cells put in.

    Learner cells are matched by cell id first, then by exercise id and position among that
    exercise's solution cells. A missing cell, or an exercise in ``stubbed``, gets the stub.
    Solution cells are tagged ``nbval-ignore-output`` (a learner's print must not fail them);
    nbval markers in the learner's code are neutralised. Returns ``(notebook, roles by code
    cell index)``.
    """
    merged = copy.deepcopy(ref)
    by_id, by_exercise = {}, {}
    for cell in learner.cells:
        meta = info(cell)
        if cell.cell_type != "code" or meta.get("role") != "solution":
            continue
        if cell.get("id"):
            by_id[cell.id] = (meta.get("exercise"), cell)
        by_exercise.setdefault(meta.get("exercise"), []).append(cell)
    roles, position, current = [], {}, None
    for cell in merged.cells:
        meta = info(cell)
        if meta.get("exercise"):
            current = meta["exercise"]
        if cell.cell_type != "code":
            continue
        role = meta.get("role", "text")
        first_line = next((s.strip() for s in cell.source.split("\n") if s.strip()), "")
        if role == "solution":
            exercise = meta["exercise"]
            k = position.get(exercise, 0)
            position[exercise] = k + 1
            found = by_id.get(cell.get("id"))
            if found is not None and found[0] == exercise:
                source = found[1].source
            elif k < len(by_exercise.get(exercise, [])):
                source = by_exercise[exercise][k].source
            else:
                source = None
            if source is None or exercise in stubbed:
                source = stub_source(cell.source, exercise, meta["task"])
            cell.source = _MARKER_RE.sub(r"# (\1 ignored by the checker)", source)
            tags = [t for t in cell.metadata.get("tags", []) if not t.startswith("nbval-")]
            cell.metadata["tags"] = tags + ["nbval-ignore-output"]
            label = "your solution cell"
        elif role == "check":
            label = f"the check cell `{first_line}`"
        elif role == "setup":
            label = f"the setup cell `{first_line}`"
        else:
            label = f"the cell `{first_line[:60]}`"
        owner = None if role == "setup" else current
        roles.append(CellRole(owner, role, label))
    return merged, roles

