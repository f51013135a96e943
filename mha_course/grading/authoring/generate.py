"""Generating ``exercises/`` from ``solutions/``: stubs, validation, generate and verify.

:func:`generate` turns each solution notebook into an exercise notebook: the solution region
becomes ``raise NotImplementedError("Exercise 03.2: <task>")`` and outputs are cleared.
:func:`write_references` writes the package's ``references/``: each solution notebook with its
outputs (what a learner's cells must print) but without its answers (:func:`redact_source`),
what ``python -m mha_course check`` checks a learner's notebook against where there is no
``solutions/`` folder (a learner who installed only the wheel).
:func:`find_stale` is what ``python -m mha_course generate --verify`` (and the staleness test)
compare against. Every solution notebook is first validated against the format contract (see
:mod:`mha_course.grading.authoring.notebooks`), so a malformed one stops with one clear line.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import nbformat

from .notebooks import (
    BEGIN,
    END,
    ID_RE,
    LESSON_RE,
    ROLES,
    ExerciseError,
    defined_names,
    id_key,
    info,
    lesson_of,
    nb_info,
    notebook_text,
    read_notebook,
)

#: Where the references learners check against ship: ``mha_course/grading/references/``,
#: written by ``python -m mha_course generate`` from ``solutions/`` (never edited by hand).
REFERENCES = Path(__file__).resolve().parents[1] / "references"
#: nbval's sanitize file, shipped beside the references (a wheel has no ``tests/``).
SANITIZE = "nbval_sanitize.cfg"


def stub_source(source: str, exercise: str, task: str, where: str = "") -> str:
    """Replace the one BEGIN/END SOLUTION region of ``source`` by a ``NotImplementedError`` stub.

    The stub sits at the indentation of the BEGIN line and names the exercise and its task.

    Raises
    ------
    ExerciseError
        When the markers are missing, unbalanced, out of order or there is more than one region.
    """
    lines = source.split("\n")
    begins = [i for i, line in enumerate(lines) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if not begins and not ends:
        raise ExerciseError(f"{where}no '{BEGIN}' / '{END}' markers in this solution cell")
    if len(begins) != len(ends):
        raise ExerciseError(
            f"{where}unbalanced markers: {len(begins)} '{BEGIN}' and {len(ends)} '{END}'"
        )
    if len(begins) > 1:
        raise ExerciseError(f"{where}{len(begins)} solution regions; one per cell is allowed")
    b, e = begins[0], ends[0]
    if e < b:
        raise ExerciseError(f"{where}'{END}' comes before '{BEGIN}'")
    indent = lines[b][: len(lines[b]) - len(lines[b].lstrip())]
    message = json.dumps(f"Exercise {exercise}: {task}", ensure_ascii=False)
    stub = f"{indent}raise NotImplementedError({message})"
    return "\n".join(lines[:b] + [stub] + lines[e + 1 :])


def validate_solution_notebook(nb, path: str | Path) -> str:
    """Validate a solution notebook against the format contract; return its lesson number ("03").

    Raises
    ------
    ExerciseError
        Naming the file, the cell and what is wrong.
    """
    path = Path(path)
    lesson = nb_info(nb).get("lesson")
    if not isinstance(lesson, str) or not LESSON_RE.match(lesson):
        raise ExerciseError(
            f'{path}: notebook metadata needs "mha_course": {{"lesson": "NN"}} '
            f"(got {nb.metadata.get('mha_course')!r})"
        )
    if not path.name.startswith(f"{lesson}_"):
        raise ExerciseError(
            f"{path}: lesson is {lesson!r} but the file name does not start with {lesson}_"
        )
    roles: dict[str, set[str]] = {}
    for index, cell in enumerate(nb.cells):
        meta = info(cell)
        if not meta:
            continue
        where = f"{path}: cell {index}: "
        role = meta.get("role")
        if role not in ROLES:
            raise ExerciseError(f"{where}role {role!r} is not one of {', '.join(ROLES)}")
        if role in ("setup", "text"):
            if role == "setup" and cell.cell_type != "code":
                raise ExerciseError(f"{where}a setup cell must be a code cell")
            continue
        exercise = meta.get("exercise")
        if not isinstance(exercise, str) or not ID_RE.match(exercise):
            raise ExerciseError(f'{where}exercise id {exercise!r} is not of the form "NN.M"')
        if lesson_of(exercise) != lesson:
            raise ExerciseError(f"{where}exercise {exercise} in the notebook of lesson {lesson}")
        where = f"{path}: cell {index} (exercise {exercise}): "
        roles.setdefault(exercise, set()).add(role)
        want_type = "markdown" if role == "task" else "code"
        if cell.cell_type != want_type:
            raise ExerciseError(f"{where}a {role} cell must be a {want_type} cell")
        if role == "solution":
            task = meta.get("task")
            if not isinstance(task, str) or not task.strip():
                raise ExerciseError(f'{where}solution cell has no "task" in its metadata')
            if "\n" in task:
                raise ExerciseError(f'{where}"task" must be one line')
            stub_source(cell.source, exercise, task, where)
    if not roles:
        raise ExerciseError(f"{path}: no exercise cells (cell metadata 'mha_course')")
    for exercise, have in sorted(roles.items()):
        missing = {"task", "solution", "check"} - have
        if missing:
            raise ExerciseError(
                f"{path}: exercise {exercise} has no {' and no '.join(sorted(missing))} cell"
            )
    return lesson


def make_exercise_notebook(nb):
    """Return the exercise notebook for a (validated) solution notebook; ``nb`` is not changed."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        cell.metadata.pop("execution", None)  # nbclient's timestamps: not part of the source
        if cell.cell_type != "code":
            continue
        cell.outputs = []
        cell.execution_count = None
        meta = info(cell)
        if meta.get("role") == "solution":
            cell.source = stub_source(cell.source, meta["exercise"], meta["task"])
    return out


def redact_source(source: str, exercise: str, task: str) -> str:
    r"""A solution cell without its answer, for the references a learner's check runs against.

    The solution region keeps its markers but holds only the exercise's stub and, when the
    region is at the cell's top level, ``NAME = ...`` for each name it defines (so the catalog
    still knows which functions an exercise defines); what lies outside the region (a
    signature, a docstring) is what the exercise notebook shows anyway.

    >>> print(redact_source("def f(x):\n    ### BEGIN SOLUTION\n    y = x + 1\n    return y\n"
    ...                     "    ### END SOLUTION", "97.1", "add one"))
    def f(x):
        ### BEGIN SOLUTION
        raise NotImplementedError("Exercise 97.1: add one")
        ### END SOLUTION
    >>> print(redact_source("### BEGIN SOLUTION\ndef g(x):\n    return 2 * x\nanswer = g(21)\n"
    ...                     "### END SOLUTION", "97.2", "double"))
    ### BEGIN SOLUTION
    raise NotImplementedError("Exercise 97.2: double")
    g = ...
    answer = ...
    ### END SOLUTION
    """
    stubbed = stub_source(source, exercise, task)  # validates the markers
    lines = source.split("\n")
    b = next(i for i, line in enumerate(lines) if line.strip() == BEGIN)
    e = next(i for i, line in enumerate(lines) if line.strip() == END)
    indent = lines[b][: len(lines[b]) - len(lines[b].lstrip())]
    names = [] if indent else defined_names("\n".join(lines[b + 1:e]))  # a body's: locals
    stub = stubbed.split("\n")[b]
    return "\n".join(lines[: b + 1] + [stub] + [f"{indent}{n} = ..." for n in names]
                     + lines[e:])


def make_reference_notebook(nb):
    """The reference of a (validated) solution notebook for learners: its outputs (what each
    cell must print), every cell but the answers (:func:`redact_source`)."""
    out = copy.deepcopy(nb)
    for cell in out.cells:
        cell.metadata.pop("execution", None)
        meta = info(cell)
        if cell.cell_type == "code" and meta.get("role") == "solution":
            cell.source = redact_source(cell.source, meta["exercise"], meta["task"])
    return out


def render_references(solutions_dir: str | Path) -> dict[str, str]:
    """``{file name: reference notebook text}`` of every solution notebook (validated)."""
    rendered = {}
    for path in solution_paths(solutions_dir):
        nb = read_notebook(path)
        validate_solution_notebook(nb, path)
        rendered[path.name] = notebook_text(make_reference_notebook(nb))
    return rendered


def write_references(solutions_dir: str | Path, out_dir: str | Path = REFERENCES,
                     sanitize: Path | None = None) -> list[tuple[Path, bool]]:
    """Write :func:`render_references` into ``out_dir`` (the package's ``references/``), with
    nbval's sanitize file; remove references of lessons that are gone. Returns
    ``(path, changed)``."""
    rendered = {name: text.encode("utf-8") for name, text in
                render_references(solutions_dir).items()}
    if sanitize is not None and Path(sanitize).is_file():
        rendered[SANITIZE] = Path(sanitize).read_bytes()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in rendered.items():
        target = out_dir / name
        changed = not target.exists() or target.read_bytes() != data
        if changed:
            target.write_bytes(data)
        written.append((target, changed))
    for old in out_dir.glob("[0-9][0-9]_*.ipynb"):
        if old.name not in rendered:
            old.unlink()
            written.append((old, True))
    return written


def stale_references(solutions_dir: str | Path, out_dir: str | Path = REFERENCES,
                     sanitize: Path | None = None) -> list[str]:
    """The reference files that differ from what :func:`write_references` would write."""
    rendered = {name: text.encode("utf-8") for name, text in
                render_references(solutions_dir).items()}
    if sanitize is not None and Path(sanitize).is_file():
        rendered[SANITIZE] = Path(sanitize).read_bytes()
    out_dir = Path(out_dir)
    stale = [str(out_dir / n) for n, data in rendered.items()
             if not (out_dir / n).is_file() or (out_dir / n).read_bytes() != data]
    stale += [f"{p} (its lesson has no solution notebook)"
              for p in sorted(out_dir.glob("[0-9][0-9]_*.ipynb")) if p.name not in rendered]
    return stale


def solution_paths(solutions_dir: str | Path) -> list[Path]:
    """The solution notebooks (``NN_*.ipynb``), sorted by name."""
    solutions_dir = Path(solutions_dir)
    if not solutions_dir.is_dir():
        raise ExerciseError(f"{solutions_dir}: no such folder of solution notebooks")
    return sorted(p for p in solutions_dir.glob("[0-9][0-9]_*.ipynb") if p.is_file())


def render_exercises(solutions_dir: str | Path) -> dict[str, str]:
    """Validate every solution notebook and return ``{file name: exercise notebook text}``."""
    rendered = {}
    for path in solution_paths(solutions_dir):
        nb = read_notebook(path)
        validate_solution_notebook(nb, path)
        rendered[path.name] = notebook_text(make_exercise_notebook(nb))
    return rendered


def learner_work(path: Path) -> str:
    """Why ``path`` looks like a learner's work rather than a generated file ("" if it does not).

    A generated exercise notebook has no outputs and every solution cell still holds its stub.
    """
    try:
        nb = read_notebook(path)
    except ExerciseError:
        return ""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.get("outputs") or cell.get("execution_count") is not None:
            return "it has outputs"
        if info(cell).get("role") == "solution" and "raise NotImplementedError(" not in cell.source:
            return f"exercise {info(cell).get('exercise')} has been answered"
    return ""


def generate(
    solutions_dir: str | Path, out_dir: str | Path, force: bool = False,
    references: Path | None = None, sanitize: Path | None = None,
) -> list[tuple[Path, bool]]:
    """Write one exercise notebook per solution notebook into ``out_dir``.

    Every solution notebook is validated before anything is written, so a bad one writes
    nothing. Files whose bytes would not change are left alone; a file holding a learner's work
    (see :func:`learner_work`) is only overwritten with ``force``. With ``references`` (the
    course's own, :data:`REFERENCES`), :func:`write_references` writes them too, with the
    ``sanitize`` file. Returns ``(path, changed)``.
    """
    rendered = render_exercises(solutions_dir)
    if not rendered:
        raise ExerciseError(f"{solutions_dir}: no solution notebooks (NN_*.ipynb)")
    out_dir = Path(out_dir)
    if not force:
        for name in rendered:
            why = learner_work(out_dir / name) if (out_dir / name).exists() else ""
            if why:
                raise ExerciseError(
                    f"{out_dir / name} looks like your work ({why}); nothing was written. "
                    "Save it elsewhere, or use --force to overwrite it"
                )
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered.items():
        target = out_dir / name
        data = text.encode("utf-8")
        changed = not target.exists() or target.read_bytes() != data
        if changed:
            target.write_bytes(data)
        written.append((target, changed))
    if references is not None:
        written += write_references(solutions_dir, references, sanitize)
    return written


def default_solutions(root: Path) -> Path:
    """The solutions a command uses by default: the checkout's ``solutions/``, else (a learner
    with only the wheel) the references the package ships (the solutions without answers)."""
    folder = Path(root) / "solutions"
    if folder.is_dir() or not any(REFERENCES.glob("[0-9][0-9]_*.ipynb")):
        return folder
    return REFERENCES


def find_stale(solutions_dir: str | Path, exercises_dir: str | Path,
               references: Path | None = None, sanitize: Path | None = None) -> list[str]:
    """Return the exercise files that differ from what ``generate`` would write (empty: fresh);
    with ``references``, the reference files too (:func:`stale_references`)."""
    rendered = render_exercises(solutions_dir)
    exercises_dir = Path(exercises_dir)
    stale = []
    for name, text in rendered.items():
        target = exercises_dir / name
        if not target.exists():
            stale.append(f"{target} is missing")
        elif target.read_bytes() != text.encode("utf-8"):
            stale.append(f"{target} differs from its solution")
    if exercises_dir.is_dir():
        for extra in sorted(exercises_dir.glob("*.ipynb")):
            if extra.name not in rendered:
                stale.append(f"{extra} has no solution notebook")
    if references is not None:
        stale += stale_references(solutions_dir, references, sanitize)
    return stale


def load_solutions(solutions) -> dict[str, tuple[Path, nbformat.NotebookNode]]:
    """Return ``{lesson: (path, notebook)}`` for every valid solution notebook.

    ``solutions`` is the folder, or such a dict already loaded (returned as it is): the checker
    loads the solutions once and checks every submission against that snapshot, so a file
    changed on disk during a batch changes no verdict.
    """
    if isinstance(solutions, dict):
        return solutions
    found = {}
    for path in solution_paths(solutions):
        nb = read_notebook(path)
        lesson = validate_solution_notebook(nb, path)
        if lesson in found:
            raise ExerciseError(f"{solutions}: two solution notebooks for lesson {lesson}: "
                                f"{found[lesson][0].name} and {path.name}")
        found[lesson] = (path, nb)
    return found


def exercise_ids(solutions: dict) -> list[str]:
    """Every exercise id in the loaded solutions, sorted."""
    cells = [c for _, nb in solutions.values() for c in nb.cells]
    ids = {info(c)["exercise"] for c in cells if "exercise" in info(c)}
    return sorted(ids, key=id_key)

