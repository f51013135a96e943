"""Bundles of exercises across lessons: the assignment notebook and its reference.

``python -m mha_course assign 01.1 03.2 -o hw.ipynb`` writes :func:`build_bundle` with stubs;
the checker builds the same bundle with the solutions (``stub=False``) as the reference a
submitted assignment is run against.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from .assignment import NOTEBOOK_KEY, number
from .generate import exercise_ids, load_solutions, stub_source
from .notebooks import ExerciseError, id_key, info, lesson_of, moved_message, notebook_text


def build_bundle(ids, solutions, stub: bool = True, assignment=None):
    """One notebook holding the chosen exercises (sorted by id) and the setup cells they need.

    ``solutions`` is the folder of solution notebooks, or what ``load_solutions`` returned.
    With ``stub=True`` it is the assignment handed out (stubs, no outputs); with ``stub=False``
    it is the reference the checker runs (solutions and their outputs). Both have the same cells,
    ids and metadata, so the checker maps one onto the other. ``assignment`` (an
    :class:`~mha_course.grading.authoring.assignment.Assignment`) adds its title, due date and
    points to
    the first cell and its data to the notebook's metadata (``check --assignment`` accepts the
    notebook for the file).
    """
    solutions = load_solutions(solutions)
    known = exercise_ids(solutions)
    wanted = []
    for exercise in ids:
        if exercise not in known:
            moved = moved_message(exercise, known)
            if moved:
                raise ExerciseError(moved)
            raise ExerciseError(
                f"unknown exercise {exercise!r}; known exercises: {' '.join(known) or '(none)'}"
            )
        if exercise not in wanted:
            wanted.append(exercise)
    if not wanted:
        raise ExerciseError("no exercises chosen")
    wanted.sort(key=id_key)
    first_nb = solutions[lesson_of(wanted[0])][1]
    bundle = nbformat.v4.new_notebook()
    for key in ("kernelspec", "language_info"):
        if key in first_nb.metadata:
            bundle.metadata[key] = copy.deepcopy(first_nb.metadata[key])
    bundle.metadata["mha_course"] = {"assignment": wanted}
    heading = f"# Assignment: exercises {', '.join(wanted)}"
    about = ""
    if assignment is not None:
        bundle.metadata["mha_course"][NOTEBOOK_KEY] = assignment.to_dict()
        heading = f"# {assignment.title}" if assignment.title else heading
        points = ", ".join(f"{x}: {number(assignment.points[x])}" for x in wanted)
        about = (f"Points: {points} ({number(assignment.max_points)} in all)."
                 + (f" Due: {assignment.due.replace('T', ' ')}." if assignment.due else "")
                 + "\n\n")
    title = nbformat.v4.new_markdown_cell(
        f"{heading}\n\n{about}"
        "Fill in each cell that raises `NotImplementedError`, run its check cell, and when you are "
        "done check the whole notebook from the course folder with\n\n"
        "```\n.venv/bin/python -m mha_course check THIS_FILE.ipynb\n```"
    )
    title.id = "assignment-title"
    bundle.cells.append(title)
    seen_ids = {title.id}
    for lesson in sorted({lesson_of(x) for x in wanted}):
        path, nb = solutions[lesson]
        chosen = [x for x in wanted if lesson_of(x) == lesson]
        cells = [c for c in nb.cells if info(c).get("role") == "setup"]
        cells += [c for x in chosen for c in nb.cells if info(c).get("exercise") == x]
        for cell in cells:
            cell = copy.deepcopy(cell)
            cell.metadata.pop("execution", None)
            new_id = cell.get("id") or f"l{lesson}"
            while new_id in seen_ids:  # cell ids must be unique within a notebook
                new_id += "-x"
            cell.id = new_id
            seen_ids.add(new_id)
            if stub and cell.cell_type == "code":
                cell.outputs = []
                cell.execution_count = None
                meta = info(cell)
                if meta.get("role") == "solution":
                    cell.source = stub_source(cell.source, meta["exercise"], meta["task"])
            bundle.cells.append(cell)
    return bundle


def assign(ids, out: str | Path, solutions_dir: str | Path, force: bool = False,
           assignment=None) -> Path:
    """Write the assignment notebook for ``ids`` to ``out`` (refuses to overwrite unless force)."""
    out = Path(out)
    if out.suffix != ".ipynb":
        raise ExerciseError(f"{out}: the assignment file name must end in .ipynb")
    if out.exists() and not force:
        raise ExerciseError(f"{out} already exists; use --force to overwrite it")
    text = notebook_text(build_bundle(ids, solutions_dir, stub=True, assignment=assignment))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8", newline="\n")
    return out

