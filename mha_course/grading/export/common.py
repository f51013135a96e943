"""What the nbgrader and Gradescope exports share: the assignment, a wheel of the course, files.

Not taught in a lesson: ``python -m mha_course export nbgrader|gradescope EXERCISES... -o OUT``
(:mod:`mha_course.grading.export.to_nbgrader`, :mod:`mha_course.grading.export.to_gradescope`). Both
take the exercises and their points from one
:class:`~mha_course.grading.authoring.assignment.Assignment`
(:func:`choose`): ids as ``assign`` takes them (``03.1 3.2 '4.1,4.5'``, a lesson ``03``) with
``--points``/``--title``/``--due``, or the ``.assignment.json`` file ``assign`` wrote.

Both ship the course itself as a wheel (:func:`build_wheel`), so the grading machine installs
exactly the checks the instructor tested, from a file, without a checkout: the wheel is built
from the package as it is installed here (the same snapshot the checker runs) and the metadata
of its installed distribution. :func:`checker_requirements` lists what a grading machine must
install besides it: the course's runtime packages without the learner's editor (JupyterLab),
and the checker's own tools (nbval, pytest, ipykernel, ...).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import re
import zipfile
from pathlib import Path

from ..authoring.assignment import Assignment, load_assignment, make_assignment
from ..authoring.catalog import exercises
from ..authoring.notebooks import ExerciseError
from ..running.check import PACKAGE_DIR, package_snapshot

#: The installed distribution the wheel is made from.
DISTRIBUTION = "mha-course"
#: What the checker imports that the course's runtime packages may not bring.
CHECKER_TOOLS = ("pytest>=7.4", "nbval>=0.11", "nbformat>=5.9", "ipykernel>=6", "jupyter_client",
                 "pyzmq", "psutil")
#: Runtime packages a grading machine does not need: the learner's editor.
NOT_FOR_GRADING = ("jupyterlab",)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def choose(ids, assignment_file=None, points=None, title: str = "", due=None,
           solutions=None) -> Assignment:
    """The assignment to export: from ``assignment_file``, or made from ``ids`` (as ``assign``).

    Raises
    ------
    ExerciseError
        For no exercises, both ids and a file, an unknown id, bad points or a bad due date.
    """
    catalog = exercises(solutions)
    try:
        if assignment_file is not None:
            if ids:
                raise ValueError("give exercise ids or --assignment FILE, not both")
            if points or title or due:
                raise ValueError("--points, --title and --due come from the assignment file "
                                 "with --assignment; edit it (or pass ids instead)")
            chosen = load_assignment(assignment_file)
            unknown = [x for x in chosen.exercises if x not in catalog]
            if unknown:
                raise ValueError(f"{assignment_file}: exercises the solutions do not have: "
                                 f"{' '.join(unknown)}")
            return chosen
        if not ids:
            raise ValueError("which exercises? pass ids (03.1 3.2 '4.1,4.5'), a lesson (03), or "
                             "--assignment FILE")
        return make_assignment(ids, catalog, points=points or None, title=title, due=due)
    except ValueError as exc:
        raise ExerciseError(str(exc)) from None


def assignment_name(assignment: Assignment, name: str | None = None) -> str:
    """A name nbgrader and a file system both accept: ``name``, else from the title or ids.

    >>> assignment_name(Assignment(("03.1", "04.5")))
    'mha-03.1-04.5'
    >>> assignment_name(Assignment(("03.1",), title="Week 2: attention!"))
    'week-2-attention'
    """
    if name:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ExerciseError(f"--name {name!r}: use letters, digits, '.', '_' and '-' only")
        return name
    base = re.sub(r"[^a-z0-9]+", "-", assignment.title.lower()).strip("-")
    return base[:60] or "mha-" + "-".join(assignment.exercises)[:60]


def _metadata() -> tuple[importlib.metadata.Distribution, str]:
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise ExerciseError("the course is not installed as a package here, so it cannot be "
                            "exported: run `.venv/bin/python -m pip install -e .` in the course "
                            "folder") from None
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO")
    if not text:
        raise ExerciseError(f"the installed {DISTRIBUTION} has no metadata; reinstall it")
    return dist, text


def wheel_name() -> str:
    """``mha_course-0.1.0-py3-none-any.whl`` for the installed version."""
    dist, _ = _metadata()
    return f"{DISTRIBUTION.replace('-', '_')}-{dist.version}-py3-none-any.whl"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(folder: Path) -> Path:
    """Write a wheel of the installed course into ``folder``; return its path.

    Its files are the package as the checker snapshots it (sources and data, no compiled
    files); its metadata is the installed distribution's (name, version, requirements, the
    ``mha-course`` script), so ``pip install`` treats it as the course's own wheel.
    """
    dist, metadata = _metadata()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / wheel_name()
    info = f"{DISTRIBUTION.replace('-', '_')}-{dist.version}.dist-info"
    files = {rel: data for rel, data in package_snapshot(str(PACKAGE_DIR)).files.items()
             if not rel.endswith(".pyc") and "__pycache__" not in rel}
    for ref in sorted((PACKAGE_DIR / "grading" / "references").glob("*")):  # a learner needs
        if ref.is_file():
            files[f"mha_course/grading/references/{ref.name}"] = ref.read_bytes()
    files[f"{info}/METADATA"] = metadata.encode("utf-8")
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: mha-course export\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    entry_points = dist.read_text("entry_points.txt")
    if entry_points:
        files[f"{info}/entry_points.txt"] = entry_points.encode("utf-8")
    files[f"{info}/top_level.txt"] = b"mha_course\n"
    record = [_record_line(name, data) for name, data in sorted(files.items())]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode("utf-8")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data,
                           compress_type=zipfile.ZIP_DEFLATED)
    return path


def checker_requirements() -> list[str]:
    """What a grading machine installs besides the course's wheel (one requirement a line).

    The course's runtime requirements as installed here, without :data:`NOT_FOR_GRADING`, and
    :data:`CHECKER_TOOLS` not already named; every extra's requirements are left out.
    """
    dist, _ = _metadata()
    out, names = [], set()
    for requirement in dist.requires or []:
        spec, _, marker = requirement.partition(";")
        if "extra" in marker:
            continue
        match = _NAME.match(spec)
        name = match.group(1).lower().replace("_", "-") if match else ""
        if not name or name in NOT_FOR_GRADING or name in names:
            continue
        names.add(name)
        out.append(requirement.strip())
    for tool in CHECKER_TOOLS:
        name = _NAME.match(tool).group(1).lower().replace("_", "-")
        if name not in names:
            names.add(name)
            out.append(tool)
    return out


def refuse_to_overwrite(paths, force: bool) -> None:
    """Raise :class:`ExerciseError` naming the first of ``paths`` that exists, unless force."""
    for path in paths:
        if Path(path).exists() and not force:
            raise ExerciseError(f"{path} already exists; use --force to overwrite it")
