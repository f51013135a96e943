"""Exercise tools: generate ``exercises/`` from ``solutions/``, check a learner's work, bundle.

Not taught in a lesson: this is the machinery behind ``make exercises``, ``make check EX=03`` and
``python -m mha_course generate|check|assign`` (see ``mha_course/__main__.py``). The notebook
format it reads is the contract in the course's exercise-format brief: every exercise cell of a
solution notebook carries ``metadata["mha_course"] = {"exercise": "03.2", "role": ROLE}`` with
ROLE one of ``setup``, ``task``, ``solution``, ``check``, ``text``, and each solution cell holds
one region between ``### BEGIN SOLUTION`` and ``### END SOLUTION``.

Three jobs:

- :func:`generate` turns each solution notebook into an exercise notebook: the solution region
  becomes ``raise NotImplementedError("Exercise 03.2: <task>")``, outputs are cleared.
- :func:`check_notebook` copies the matching solution notebook to a temporary folder, puts the
  learner's solution cells in it (matched by exercise id), runs strict nbval on the copy in a
  subprocess and turns nbval's per-cell results into one verdict per exercise. The learner's own
  outputs are never trusted and the learner's file is never written.
- :func:`build_bundle` / :func:`assign` put chosen exercises from several lessons into one
  assignment notebook that :func:`check_notebook` can check.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
ROLES = ("setup", "task", "solution", "check", "text")
ID_RE = re.compile(r"^(\d\d)\.([1-9]\d*)$")
LESSON_RE = re.compile(r"^\d\d$")
ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
DEFAULT_TIMEOUT = 30
#: Cell-level statuses and how the summary table shows them.
STATUS_SHORT = {
    "passed": "pass",
    "failed": "FAIL",
    "not attempted": "—",
    "timed out": "TIMEOUT",
    "crashed": "CRASH",
    "not checked": "?",
    "missing": "·",
    "error": "ERROR",
}


class ExerciseError(Exception):
    """A problem with a notebook or a command, reported as one clear line (exit code 2)."""


# --------------------------------------------------------------------------------------------
# Reading notebooks and their exercise metadata


def course_root() -> Path:
    """Return the folder holding ``solutions/``: the current folder, else the package's parent."""
    for candidate in (Path.cwd(), Path(__file__).resolve().parent.parent):
        if (candidate / "solutions").is_dir():
            return candidate
    return Path.cwd()


def read_notebook(path: str | Path) -> nbformat.NotebookNode:
    """Read a notebook, or raise :class:`ExerciseError` with a one-line reason."""
    path = Path(path)
    if not path.exists():
        raise ExerciseError(f"{path}: no such file")
    if path.is_dir():
        raise ExerciseError(f"{path}: is a folder, not a notebook")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ExerciseError(f"{path}: cannot read it ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ExerciseError(
            f"{path}: not a notebook: the file is not valid JSON "
            f"(line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("cells"), list):
        raise ExerciseError(f"{path}: not a notebook: no list of cells in the JSON")
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


def _lesson_of(exercise: str) -> str:
    return exercise.split(".")[0]


def _id_key(exercise: str) -> tuple[int, int]:
    lesson, number = exercise.split(".")
    return int(lesson), int(number)


# --------------------------------------------------------------------------------------------
# Generating exercises from solutions


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
    """Check a solution notebook against the format contract; return its lesson number ("03").

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
        if _lesson_of(exercise) != lesson:
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
    solutions_dir: str | Path, out_dir: str | Path, force: bool = False
) -> list[tuple[Path, bool]]:
    """Write one exercise notebook per solution notebook into ``out_dir``.

    Every solution notebook is validated before anything is written, so a bad one writes
    nothing. Files whose bytes would not change are left alone; a file holding a learner's work
    (see :func:`learner_work`) is only overwritten with ``force``. Returns ``(path, changed)``.
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
    return written


def find_stale(solutions_dir: str | Path, exercises_dir: str | Path) -> list[str]:
    """Return the exercise files that differ from what ``generate`` would write (empty: fresh)."""
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
    return stale


# --------------------------------------------------------------------------------------------
# Bundles of exercises across lessons (assign)


def load_solutions(solutions_dir: str | Path) -> dict[str, tuple[Path, nbformat.NotebookNode]]:
    """Return ``{lesson: (path, notebook)}`` for every valid solution notebook."""
    found = {}
    for path in solution_paths(solutions_dir):
        nb = read_notebook(path)
        found[validate_solution_notebook(nb, path)] = (path, nb)
    return found


def exercise_ids(solutions: dict) -> list[str]:
    """Every exercise id in the loaded solutions, sorted."""
    cells = [c for _, nb in solutions.values() for c in nb.cells]
    ids = {info(c)["exercise"] for c in cells if "exercise" in info(c)}
    return sorted(ids, key=_id_key)


def build_bundle(ids, solutions_dir: str | Path, stub: bool = True):
    """One notebook holding the chosen exercises (sorted by id) and the setup cells they need.

    With ``stub=True`` it is the assignment handed out (stubs, no outputs); with ``stub=False`` it
    is the reference the checker runs (solutions and their outputs). Both have the same cells,
    ids and metadata, so the checker maps one onto the other.
    """
    solutions = load_solutions(solutions_dir)
    known = exercise_ids(solutions)
    wanted = []
    for exercise in ids:
        if exercise not in known:
            raise ExerciseError(
                f"unknown exercise {exercise!r}; known exercises: {' '.join(known) or '(none)'}"
            )
        if exercise not in wanted:
            wanted.append(exercise)
    if not wanted:
        raise ExerciseError("no exercises chosen")
    wanted.sort(key=_id_key)
    first_nb = solutions[_lesson_of(wanted[0])][1]
    bundle = nbformat.v4.new_notebook()
    for key in ("kernelspec", "language_info"):
        if key in first_nb.metadata:
            bundle.metadata[key] = copy.deepcopy(first_nb.metadata[key])
    bundle.metadata["mha_course"] = {"assignment": wanted}
    title = nbformat.v4.new_markdown_cell(
        f"# Assignment: exercises {', '.join(wanted)}\n\n"
        "Fill in each cell that raises `NotImplementedError`, run its check cell, and when you are "
        "done check the whole notebook with\n\n"
        "```\npython -m mha_course check THIS_FILE.ipynb\n```"
    )
    title.id = "assignment-title"
    bundle.cells.append(title)
    seen_ids = {title.id}
    for lesson in sorted({_lesson_of(x) for x in wanted}):
        path, nb = solutions[lesson]
        chosen = [x for x in wanted if _lesson_of(x) == lesson]
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


def assign(ids, out: str | Path, solutions_dir: str | Path, force: bool = False) -> Path:
    """Write the assignment notebook for ``ids`` to ``out`` (refuses to overwrite unless force)."""
    out = Path(out)
    if out.suffix != ".ipynb":
        raise ExerciseError(f"{out}: the assignment file name must end in .ipynb")
    if out.exists() and not force:
        raise ExerciseError(f"{out} already exists; use --force to overwrite it")
    text = notebook_text(build_bundle(ids, solutions_dir, stub=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8", newline="\n")
    return out


# --------------------------------------------------------------------------------------------
# Checking a learner's notebook

#: Written into the temporary folder as conftest.py of the nbval run. It records, for every
#: notebook cell nbval runs, whether it passed and what it printed, as JSON lines; and it makes
#: nbval notice a dead kernel within a second instead of waiting for the cell timeout.
_CONFTEST = r'''
import json
import os
import time
from queue import Empty

import pytest

_REPORT = os.environ["MHA_COURSE_CHECK_REPORT"]

try:
    from nbval import kernel as _nbval_kernel

    _original_await_reply = _nbval_kernel.RunningKernel.await_reply

    def _await_reply(self, msg_id, timeout=None):
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        while True:
            step = 1.0 if deadline is None else min(1.0, deadline - time.monotonic())
            if step <= 0:
                raise Empty
            try:
                return _original_await_reply(self, msg_id, timeout=step)
            except Empty:
                if not self.is_alive():
                    raise RuntimeError("MHA_COURSE_KERNEL_DIED") from None

    _nbval_kernel.RunningKernel.await_reply = _await_reply
except (ImportError, AttributeError):  # another nbval: fall back to its own timeout
    pass


def _text(outputs):
    parts = []
    for out in outputs or []:
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(out.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "text/plain" in data:
                text = data["text/plain"]
                parts.append(text if isinstance(text, str) else "".join(text))
                parts.append("\n")
    return "".join(parts)


def pytest_runtest_makereport(item, call):  # returns None: pytest still makes its own report
    if call.when != "call" or not hasattr(item, "cell_num"):
        return
    record = {"cell": item.cell_num, "ok": True, "message": "", "error": None}
    if call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
        record["ok"] = False
        record["message"] = str(call.excinfo.value)
    outputs = getattr(item, "test_outputs", None) or []
    for out in outputs:
        if out.get("output_type") == "error":
            record["error"] = {
                "ename": out.get("ename", ""),
                "evalue": out.get("evalue", ""),
                "traceback": list(out.get("traceback", [])),
            }
    record["got"] = _text(outputs)
    record["expected"] = _text(item.cell.get("outputs"))
    with open(_REPORT, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
'''


@dataclass
class Verdict:
    """The result of one exercise: a status from :data:`STATUS_SHORT` and a message."""

    exercise: str
    status: str
    message: str = ""


@dataclass
class NotebookResult:
    """The verdicts for one learner notebook, or the one-line error that stopped its check."""

    path: Path
    reference: str = ""
    verdicts: list[Verdict] = field(default_factory=list)
    error: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def all_passed(self) -> bool:
        return not self.error and all(v.status == "passed" for v in self.verdicts)


@dataclass
class _CellRole:
    exercise: str | None
    role: str
    label: str


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
        lessons = {_lesson_of(info(c)["exercise"]) for c in learner_nb.cells
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
        roles.append(_CellRole(owner, role, label))
    return merged, roles


def _descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (Linux /proc; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_nbval(nb, cell_timeout: float, sanitize: Path | None = None, total_timeout=None):
    """Run strict nbval on ``nb`` in a subprocess; return ``(records by cell, hit the backstop)``.

    ``total_timeout`` is the backstop for the whole run (kernel start included); when it is
    reached the pytest process and its kernel are killed. A run in which no cell ran at all
    (the kernel did not start: a port race or a slow start on a loaded machine) is tried once
    more, then reported as an error with nbval's last lines, never as exercises "not checked".
    """
    for _attempt in (1, 2):
        records, backstop, tail = _run_nbval_once(nb, cell_timeout, sanitize, total_timeout)
        if records or backstop:
            return records, backstop
    raise ExerciseError("nbval could not run the notebook: " + " / ".join(tail))


def _run_nbval_once(nb, cell_timeout, sanitize, total_timeout):
    if total_timeout is None:
        n_code = sum(c.cell_type == "code" for c in nb.cells)
        total_timeout = 90 + n_code * (cell_timeout + 10)
    with tempfile.TemporaryDirectory(prefix="mha-course-check-") as tmp:
        tmp = Path(tmp)
        nb_path = tmp / "submission.ipynb"
        nb_path.write_text(notebook_text(nb), encoding="utf-8")
        (tmp / "conftest.py").write_text(_CONFTEST, encoding="utf-8")
        (tmp / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        report = tmp / "report.jsonl"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "FORCE_COLOR")}
        env.update(MHA_COURSE_CHECK_REPORT=str(report), NO_COLOR="1", PY_COLORS="0",
                   TERM="dumb", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", JUPYTER_PLATFORM_DIRS="1")
        cmd = [sys.executable, "-m", "pytest", "-p", "nbval.plugin", "--nbval",
               "--nbval-current-env", "-p", "no:cacheprovider", "--color=no", "-q",
               "--nbval-cell-timeout", str(cell_timeout), "-c", str(tmp / "pytest.ini"),
               "--rootdir", str(tmp)]
        if sanitize is not None:
            cmd += ["--nbval-sanitize-with", str(sanitize)]
        cmd.append(str(nb_path))
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        backstop = False
        try:
            output, _ = proc.communicate(timeout=total_timeout)
        except subprocess.TimeoutExpired:
            backstop = True
            for pid in [proc.pid, *_descendants(proc.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            output, _ = proc.communicate()
        records = {}
        if report.exists():
            for line in report.read_text(encoding="utf-8").splitlines():
                record = json.loads(line)
                records[record["cell"]] = record
        tail = ANSI_RE.sub("", output.decode("utf-8", "replace")).strip().splitlines()[-5:]
        return records, backstop, tail


def _clean(text: str) -> str:
    return ANSI_RE.sub("", text or "")


def _trim(lines: list[str], limit: int = 12) -> list[str]:
    lines = [line.rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    if len(lines) > limit:
        lines = lines[: limit - 1] + [f"... ({len(lines) - limit + 1} more lines)"]
    return lines


def _failure_message(exercise: str, record: dict, role: _CellRole) -> str:
    error = record.get("error")
    prefix = f"Exercise {exercise}: "
    if error:
        ename, evalue = error["ename"], _clean(error["evalue"])
        # IPython compiles each cell under a numbered file name: say "line 3 of the cell" instead
        evalue = re.sub(r"\(\d+\.py, line (\d+)\)", r"(line \1 of the cell)", evalue)
        if evalue.startswith(prefix):  # a check's own message says it all
            return "\n".join(_trim(evalue[len(prefix):].split("\n")))
        lines = [f"{ename}: {evalue}".rstrip() + f"  (raised in {role.label})"]
        frames = [_clean(t) for t in error.get("traceback", [])[:-1]]
        if frames:  # the innermost frame: where it went wrong
            frame = [ln for ln in frames[-1].split("\n") if ln.strip()]
            arrow = [ln for ln in frame if ln.lstrip().startswith("---->")]
            lines += ["  " + frame[0].strip()] + ["  " + ln.strip() for ln in arrow[:1]]
        return "\n".join(_trim(lines))
    message = record.get("message", "")
    if "Cell outputs differ" in message:
        expected = record.get("expected", "").rstrip("\n").split("\n")
        got = record.get("got", "").rstrip("\n").split("\n")
        return "\n".join(
            [f"{role.label} printed something other than the solution's output"]
            + ["  expected: " + ln for ln in _trim(expected, 6)]
            + ["  got:      " + ln for ln in _trim(got, 6)]
            + ["(a print() inside your function shows up here: remove it)"]
        )
    return "\n".join(_trim(_clean(message).split("\n"), 6))


def _died(record: dict) -> bool:
    message = record.get("message", "")
    return "MHA_COURSE_KERNEL_DIED" in message or "Failed to interrupt kernel" in message


def _verdict(exercise, cells, timeout) -> tuple[Verdict, bool]:
    """Verdict for one exercise from ``[(record or None, role)]``; second value: kernel lost."""
    for record, role in cells:
        if record is None or record["ok"]:
            continue
        message = record.get("message", "")
        if "MHA_COURSE_KERNEL_DIED" in message:
            return Verdict(exercise, "crashed", f"the kernel died while running {role.label} "
                           "(os._exit, sys.exit in a thread, a segfault or out of memory?)"), True
        if message.startswith("Timeout of"):
            return Verdict(exercise, "timed out",
                           f"TIMED OUT after {timeout:g} s in {role.label}"), _died(record)
    for record, _ in cells:
        error = (record or {}).get("error") or {}
        evalue = _clean(error.get("evalue", ""))
        stub = evalue.startswith(f"Exercise {exercise}:")
        if error.get("ename") == "NotImplementedError" and stub:
            return Verdict(exercise, "not attempted"), False
    for record, role in cells:
        if record is None or record["ok"]:
            continue
        error = record.get("error") or {}
        other = re.match(r"Exercise (\d\d\.\d+):", _clean(error.get("evalue", "")))
        if error.get("ename") == "NotImplementedError" and other:
            return Verdict(exercise, "failed", f"this exercise uses Exercise {other.group(1)}, "
                           "which still raises NotImplementedError: do that one first"), False
        return Verdict(exercise, "failed", _failure_message(exercise, record, role)), False
    if any(record is None for record, _ in cells):
        return Verdict(exercise, "not checked", "a cell of this exercise did not run"), False
    return Verdict(exercise, "passed"), False


def check_notebook(
    path: str | Path,
    solutions_dir: str | Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    sanitize: Path | None = None,
) -> NotebookResult:
    """Check one learner notebook against its solution; never writes ``path``.

    Raises
    ------
    ExerciseError
        For a missing, broken or foreign notebook (the caller reports it and exits with 2).
    """
    path = Path(path)
    root = course_root()
    solutions_dir = Path(solutions_dir) if solutions_dir is not None else root / "solutions"
    if sanitize is None and (root / "tests" / "nbval_sanitize.cfg").is_file():
        sanitize = root / "tests" / "nbval_sanitize.cfg"
    learner = read_notebook(path)
    ref, label = reference_for(learner, path, solutions_dir)
    result = NotebookResult(path=path, reference=label)
    order = []
    for cell in ref.cells:
        exercise = info(cell).get("exercise")
        if exercise and exercise not in order:
            order.append(exercise)
    decided: dict[str, Verdict] = {}
    for _ in range(len(order) + 1):
        merged, roles = merge_learner(ref, learner, stubbed=set(decided))
        records, backstop = run_nbval(merged, timeout, sanitize)
        cells_of: dict[str, list] = {x: [] for x in order}
        lost_at = None
        for index, role in enumerate(roles):
            record = records.get(index)
            if role.exercise is None:
                if record is not None and not record["ok"] and lost_at is None:
                    result.error = (f"{role.label} failed, so nothing could be checked: "
                                    + _failure_message("", record, role).split("\n")[0])
                    return result
                continue
            cells_of[role.exercise].append((record, role))
        verdicts = {}
        for exercise in order:
            if exercise in decided:
                verdicts[exercise] = decided[exercise]
                continue
            verdict, lost = _verdict(exercise, cells_of[exercise], timeout)
            verdicts[exercise] = verdict
            if lost and lost_at is None:
                lost_at = exercise
                decided[exercise] = verdict
                break  # later cells ran in a dead kernel: run again with this one stubbed out
        if backstop:
            for exercise in order:
                if verdicts.get(exercise, Verdict(exercise, "not checked")).status == "not checked":
                    verdicts[exercise] = Verdict(exercise, "timed out",
                                                 "TIMED OUT: the whole check ran too long")
        if lost_at is None or lost_at == order[-1] or backstop:
            result.verdicts = [verdicts.get(x, Verdict(x, "not checked")) for x in order]
            return result
    result.verdicts = [decided.get(x, Verdict(x, "not checked")) for x in order]
    return result


# --------------------------------------------------------------------------------------------
# Reports


def format_result(result: NotebookResult, timeout: float) -> str:
    """The plain-text report for one notebook."""
    head = f"{result.path}"
    if result.error:
        return f"{head}: ERROR: {result.error}"
    lines = [f"{head} (checked against {result.reference}; cell timeout {timeout:g} s)"]
    for v in result.verdicts:
        text = {
            "passed": "passed",
            "not attempted": "not attempted",
            "failed": f"FAILED: {v.message}",
            "timed out": v.message,
            "crashed": f"CRASHED: {v.message}",
        }.get(v.status, f"{v.status}: {v.message}")
        body = text.split("\n")
        lines.append(f"  Exercise {v.exercise}  {body[0]}")
        lines += [" " * (len(v.exercise) + 13) + ln for ln in body[1:]]
    counts = {}
    for v in result.verdicts:
        counts[v.status] = counts.get(v.status, 0) + 1
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if s != "passed")
    lines.append(f"  {counts.get('passed', 0)} of {len(result.verdicts)} passed"
                 + (f"; {summary}" if summary else "") + ".")
    return "\n".join(lines)


def collect_submissions(paths) -> list[tuple[str, list[Path]]]:
    """``[(submission name, notebooks)]``: each file, or each entry of a folder, is one."""
    subs = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for entry in sorted(path.iterdir()):
                if entry.name.startswith("."):
                    continue
                if entry.is_dir():
                    subs.append((entry.name, sorted(entry.rglob("*.ipynb"))))
                elif entry.suffix == ".ipynb":
                    subs.append((entry.stem, [entry]))
        else:
            subs.append((path.stem, [path]))
    return subs


def summary_table(rows: dict[str, dict[str, str]], exercises: list[str]) -> str:
    """Plain-text table: one row per submission, one column per exercise."""
    name_w = max([len("submission")] + [len(n) for n in rows])
    col_w = max([7] + [len(x) for x in exercises])
    columns = "  ".join(x.ljust(col_w) for x in exercises)
    head = "submission".ljust(name_w) + "  " + columns + "  passed"
    lines = [head, "-" * len(head)]
    for name, statuses in rows.items():
        cells = [STATUS_SHORT[statuses.get(x, "missing")].ljust(col_w) for x in exercises]
        passed = sum(s == "passed" for s in statuses.values())
        lines.append(name.ljust(name_w) + "  " + "  ".join(cells) + f"  {passed}/{len(exercises)}")
    lines.append("pass = passed, FAIL = failed, — = not attempted, TIMEOUT = timed out, "
                 "CRASH = kernel died, · = no such exercise in the submission, ERROR = unreadable")
    return "\n".join(lines)


def csv_text(rows: dict[str, dict[str, str]], exercises: list[str]) -> str:
    """CSV: ``submission, <one column per exercise>, passed``; cells hold the status words."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["submission", *exercises, "passed"])
    for name, statuses in rows.items():
        writer.writerow([name, *(statuses.get(x, "missing") for x in exercises),
                         sum(s == "passed" for s in statuses.values())])
    return buf.getvalue()


def sort_ids(ids) -> list[str]:
    """Exercise ids in lesson order."""
    return sorted(set(ids), key=_id_key)
