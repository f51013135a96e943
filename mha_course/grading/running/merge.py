"""The notebook the checker runs: the reference with the learner's cells put in.

:func:`reference_for` finds the solution notebook (or, for an assignment, builds the bundle of
solutions) that a learner's notebook answers; :func:`merge_learner` copies it and puts in the
learner's answers, so every output compared is the solution's, never the learner's saved one,
and the learner's file is never written.

Answers are found where learners put them (:func:`classify`, pure):

- a learner's cell is matched to the reference by cell id first (so a cell whose metadata was
  lost still counts), then by its exercise metadata (a copied cell keeps it);
- the learner's own code cells (imports, helpers: no metadata, no id or source of the
  reference) run too, in the notebook's order, just before the answer or check cell that
  follows them; own cells after the learner's last answer are not run;
- an answer wins over a cell that still holds the stub; several answers all run, in order (as
  they would in the notebook, so the last definition is the one checked), with a note;
- an exercise whose solution cell is gone from the learner's notebook is reported "missing".
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ..authoring.bundle import build_bundle
from ..authoring.catalog import called_checks, exercise_of_check, exercise_of_function
from ..authoring.generate import load_solutions, stub_source
from ..authoring.notebooks import (
    ID_RE,
    LESSON_RE,
    CellRole,
    ExerciseError,
    defined_names,
    first_line,
    info,
    is_stub,
    lesson_of,
    moved_id,
    moved_why,
    nb_info,
    sort_ids,
)


def reference_for(learner_nb, path: Path, solutions):
    """Return ``(reference notebook, label)``: the solution (or bundle) the learner's file is for.

    ``solutions`` is the folder of solution notebooks or what ``load_solutions`` returned.

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
        return build_bundle(assignment, solutions, stub=False), label
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
    loaded = load_solutions(solutions)
    if lesson not in loaded:
        known = " ".join(sorted(loaded)) or "(none)"
        raise ExerciseError(f"{path}: lesson {lesson} has no solution notebook "
                            f"(the lessons with exercises are {known})")
    solution_path, ref = loaded[lesson]
    try:
        label = str(solution_path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        label = str(solution_path)
    return copy.deepcopy(ref), label


_MARKER_RE = re.compile(r"^\s*#+\s*(NBVAL_\w+|PYTEST_VALIDATE_\w+)\s*$", re.MULTILINE)


@dataclass
class LearnerCell:
    """A code cell of the learner's notebook that the checker will run (see :func:`classify`).

    ``kind`` is "answer" (for ``exercise``; ``target`` is the id of the reference solution cell
    it replaces when matched by id), "check" (a check cell: only a place marker), "own", or
    "extra" (grading mode: a cell of an exercise the assignment does not have, not run).
    ``number`` counts the learner's cells from 1, for messages.
    """

    number: int
    source: str
    kind: str
    exercise: str | None = None
    target: str | None = None
    label: str = ""
    note: str = ""


@dataclass
class Merged:
    """What :func:`merge_learner` returns: the notebook to run and what each code cell is."""

    notebook: nbformat.NotebookNode
    roles: list[CellRole]
    #: Exercises with no solution cell at all in the learner's notebook.
    missing: set = field(default_factory=set)
    #: Notes per exercise (several answers), for the report.
    notes: dict = field(default_factory=dict)
    #: Exercises of the learner's notebook that the reference does not have (not run).
    ignored: list = field(default_factory=list)


def _norm(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().split("\n"))


def normalised(source: str) -> str:
    r"""A cell's source as :func:`classify` compares it (outer and trailing blanks stripped).

    >>> normalised("check(f)  \n\n")
    'check(f)'
    """
    return _norm(source)


def _moved_note(exercise, hit) -> str:
    if not (isinstance(exercise, str) and ID_RE.match(exercise)) or exercise == hit:
        return ""
    why = f" ({moved_why(exercise)})" if moved_id(exercise) == hit else ""
    return (f"your notebook's Exercise {exercise} was graded as Exercise {hit}{why}: its cells "
            "call and define what that exercise checks")


def _by_name(cell, role, exercise, catalog, solution_exercises):
    """``(role, exercise, note)`` of a learner's cell in grading mode (``catalog`` given).

    A cell that calls an assigned exercise's check is that exercise's check cell, one that
    defines its function is its answer, whatever its metadata says or lacks (an editor dropped
    it; an old id such as the drill's 13.N is graded as 15.N, with a note). A cell whose
    metadata names an exercise the assignment does not have, and that matches none of the
    assigned ones, is "extra": it is not run.
    """
    if not catalog:
        return role, exercise, ""
    if exercise in solution_exercises and exercise in catalog:
        mine = catalog[exercise]
        if role == "solution" and not set(defined_names(cell.source)) & set(mine.functions):
            other = exercise_of_function(cell.source, catalog)
            if other is not None:
                return "solution", other, _moved_note(exercise, other)
        if role == "check" and not set(called_checks(cell.source)) & set(mine.checks):
            other = exercise_of_check(cell.source, catalog)
            if other is not None:
                return "check", other, _moved_note(exercise, other)
        return role, exercise, ""
    hit, kind = exercise_of_check(cell.source, catalog), "check"
    if hit is None:
        hit, kind = exercise_of_function(cell.source, catalog), "solution"
    if hit is not None:
        return kind, hit, _moved_note(exercise, hit)
    if isinstance(exercise, str) and ID_RE.match(exercise):
        return "extra", exercise, ""
    return role, exercise, ""


def classify(ref, learner, catalog=None, course=frozenset()) -> list[LearnerCell]:
    """The learner's code cells that matter, in their order, each an answer, a check or own.

    ``catalog`` (grading mode: ``{id: ExerciseInfo}`` of the reference's exercises) also
    places cells by the checks they call and the functions they define (see :func:`_by_name`);
    cells of exercises the reference does not have are then returned as "extra" (not run).
    ``course`` holds the sources (see :func:`course_sources`) of the course's own cells: a
    learner's cell that is one of them (a lesson notebook's demo cell) is not the learner's.
    """
    by_id = {c.get("id"): c for c in ref.cells if c.get("id")}
    solution_exercises = {info(c)["exercise"] for c in ref.cells
                          if info(c).get("role") == "solution"}
    ref_sources = {_norm(c.source) for c in ref.cells
                   if c.cell_type == "code" and info(c).get("role") != "solution"}
    ref_checks = {_norm(c.source): info(c)["exercise"] for c in ref.cells
                  if info(c).get("role") == "check"}
    found = []
    for number, cell in enumerate(learner.cells, start=1):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        ref_cell = by_id.get(cell.get("id")) if cell.get("id") else None
        meta = info(ref_cell) if ref_cell is not None else info(cell)
        role, exercise = meta.get("role"), meta.get("exercise")
        if ref_cell is not None and ref_cell.cell_type != "code":
            role = None
        note, source = "", _norm(cell.source)
        if ref_cell is None and source in ref_checks:
            role, exercise = "check", ref_checks[source]  # a check cell whose id was lost
        elif ref_cell is None and source not in ref_sources and source not in course:
            role, exercise, note = _by_name(cell, role, exercise, catalog, solution_exercises)
        if ref_cell is not None and catalog and role == "solution":
            note = _moved_note(info(cell).get("exercise"), exercise)  # an old id, same cell
        if role == "extra":
            found.append(LearnerCell(number, cell.source, "extra", exercise))
        elif role == "solution" and exercise in solution_exercises:
            target = cell.get("id") if ref_cell is not None else None
            found.append(LearnerCell(number, cell.source, "answer", exercise, target,
                                     note=note))
        elif role == "check" and exercise in solution_exercises:
            found.append(LearnerCell(number, cell.source, "check", exercise))
        elif source in ref_sources or source in course:
            continue  # a reference cell (its id lost, or unchanged): the reference's runs
        elif role == "setup":
            label = f"your changed setup cell `{first_line(cell.source)}`"
            found.append(LearnerCell(number, cell.source, "own", label=label))
        elif ref_cell is None:
            found.append(LearnerCell(number, cell.source, "own",
                                     label=f"your cell `{first_line(cell.source)}`"))
    return found


def _groups(cells: list[LearnerCell]) -> dict[str, list[LearnerCell]]:
    """``{exercise: cells}``: each own cell joins the exercise of the next answer or check."""
    groups, pending = {}, []
    for cell in cells:
        if cell.kind == "extra":
            continue
        if cell.kind == "own":
            pending.append(cell)
            continue
        group = groups.setdefault(cell.exercise, [])
        for own in pending:
            own.exercise = cell.exercise
        group += pending
        pending = []
        if cell.kind == "answer":
            group.append(cell)
    return groups


def _code_cell(source: str, cell_id: str):
    cell = nbformat.v4.new_code_cell(source)
    cell.id = cell_id
    cell.metadata["tags"] = ["nbval-ignore-output"]
    return cell


def course_sources(solutions) -> frozenset:
    """The code cells of every solution notebook but their answers, as :func:`classify` compares
    them (trailing blanks stripped)."""
    return frozenset(_norm(c.source) for _, nb in load_solutions(solutions).values()
                     for c in nb.cells
                     if c.cell_type == "code" and info(c).get("role") != "solution")


def merge_learner(ref, learner, stubbed=(), catalog=None, course=frozenset()) -> Merged:
    """The notebook the checker runs: ``ref`` with the learner's answers and own cells put in.

    See the module docstring for how cells are found. An exercise in ``stubbed`` (one that
    killed the kernel in an earlier run) gets its stub and none of the learner's cells. Every
    learner cell is tagged ``nbval-ignore-output`` (what it prints is not compared) and nbval
    markers in it are neutralised.
    """
    merged = copy.deepcopy(ref)
    found = classify(ref, learner, catalog, course)
    groups = _groups(found)
    ignored = sort_ids({c.exercise for c in found if c.kind == "extra"})
    solution_ids: dict[str, list[str]] = {}
    for cell in merged.cells:
        if info(cell).get("role") == "solution":
            solution_ids.setdefault(info(cell)["exercise"], []).append(cell.get("id"))
    plan: dict[str | None, list[LearnerCell]] = {}  # reference cell id -> the cells put there
    missing, notes = set(), {}
    for exercise, ids in solution_ids.items():
        group = groups.get(exercise, [])
        answers = [c for c in group if c.kind == "answer"]
        if exercise in stubbed:
            continue
        if not answers:
            missing.add(exercise)
            continue
        per_cell = {i: [c for c in answers if c.target == i] for i in ids}
        free = [c for c in answers if c.target not in per_cell]
        for i in ids:  # answers without a matching id fill the solution cells in order
            if not per_cell[i] and free:
                per_cell[i] = [free.pop(0)]
        if free:
            per_cell[ids[-1]] += free
        for c in answers:
            if c.note and c.note not in notes.get(exercise, []):
                notes.setdefault(exercise, []).append(c.note)
        for i in ids:
            per_cell[i].sort(key=lambda c: c.number)  # the learner's order
            real = [c for c in per_cell[i] if not is_stub(c.source, exercise)]
            chosen = real or per_cell[i][:1]
            if len(real) > 1:
                numbers = ", ".join(str(c.number) for c in real[:-1]) + f" and {real[-1].number}"
                notes.setdefault(exercise, []).append(
                    f"cells {numbers} of your notebook all answer Exercise {exercise}; they "
                    "ran in that order, so the last one's definitions were checked")
            for n, c in enumerate(chosen, start=1):
                c.label = "your solution cell" + (
                    f" (cell {c.number}, answer {n} of {len(chosen)})" if len(chosen) > 1 else "")
            plan[i] = chosen
        own = [c for c in group if c.kind == "own"] if any(
            not is_stub(c.source, exercise) for c in answers) else []
        plan[ids[0]] = sorted(own + plan.get(ids[0], []), key=lambda c: c.number)

    cells, roles, current, extra = [], [], None, 0
    for cell in merged.cells:
        meta = info(cell)
        if meta.get("exercise"):
            current = meta["exercise"]
        if cell.cell_type != "code":
            cells.append(cell)
            continue
        role = meta.get("role", "text")
        if role != "solution":
            cells.append(cell)
            line = first_line(cell.source)
            label = {"check": f"the check cell `{line}`",
                     "setup": f"the setup cell `{line}`"}.get(role, f"the cell `{line}`")
            roles.append(CellRole(None if role == "setup" else current, role, label))
            continue
        exercise = meta["exercise"]
        put = plan.get(cell.get("id"), [])
        if not any(item.kind == "answer" for item in put):  # stubbed, missing, not filled
            stub = stub_source(cell.source, exercise, meta["task"])
            put = [*put, LearnerCell(0, stub, "answer", exercise, label="your solution cell")]
        first_answer = True
        for item in put:
            source = _MARKER_RE.sub(r"# (\1 ignored by the checker)", item.source)
            if item.kind == "answer" and first_answer:
                first_answer = False
                out = cell
                out.source = source
                tags = [t for t in out.metadata.get("tags", []) if not t.startswith("nbval-")
                        and t != "raises-exception"]
                out.metadata["tags"] = tags + ["nbval-ignore-output"]
            else:
                extra += 1
                out = _code_cell(source, f"mha-course-learner-{extra}")
            cells.append(out)
            roles.append(CellRole(exercise, "own" if item.kind == "own" else "solution",
                                  item.label))
    merged.cells = cells
    return Merged(merged, roles, missing, notes, ignored)
