"""Where a check run writes its results, decided before any work starts.

Not taught in a lesson: ``python -m mha_course check`` calls :func:`plan_outputs` before it
checks anything, so a run that could not write its results refuses at once (exit code 2)
instead of after minutes of work:

- an explicit ``--csv FILE`` that exists is refused unless ``--force`` (then the old file is
  kept as ``FILE.bak``, ``FILE.bak2``, ... when the new one is written: :func:`backup`);
- the default ``results.csv`` of folder mode, when it exists, becomes ``results-2.csv`` (the
  first free name), announced at the start;
- a ``--feedback DIR`` that holds files is refused unless ``--force``;
- nothing is ever written into a submissions folder (or over a submission), and a file's
  folder must exist and be writable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..authoring.notebooks import ExerciseError


@dataclass
class Outputs:
    """The run's result files (None: not written) and the notes to print first."""

    csv: Path | None = None
    feedback: Path | None = None
    notes: tuple = ()


def _inside(path: Path, folder: Path) -> bool:
    path, folder = path.resolve(), folder.resolve()
    return path == folder or folder in path.parents


def _refuse_inside(path: Path, what: str, submissions) -> None:
    for folder in submissions:
        if _inside(path, folder):
            raise ExerciseError(f"{what} {path} is inside the submissions folder {folder}: the "
                                "checker never writes there; choose a place outside it")


def _writable_folder(path: Path, what: str) -> None:
    folder = path.parent if path.parent != Path("") else Path(".")
    if not folder.is_dir():
        raise ExerciseError(f"{what} {path}: no folder {folder}; create it first")
    if not os.access(folder, os.W_OK):
        raise ExerciseError(f"{what} {path}: the folder {folder} is not writable")


def free_name(path: Path) -> Path:
    """``path``, or ``stem-2.suffix``, ``stem-3.suffix``, ...: the first that does not exist."""
    n = 2
    candidate = path
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        n += 1
    return candidate


def plan_outputs(csv: Path | None, feedback: Path | None, force: bool, folder_mode: bool,
                 paths) -> Outputs:
    """Decide the result files (see the module docstring), or raise :class:`ExerciseError`."""
    submissions = [Path(p) for p in paths if Path(p).is_dir()]
    files = {Path(p).resolve() for p in paths if not Path(p).is_dir()}
    notes = []
    if csv is None and folder_mode:
        csv = free_name(Path("results.csv"))
        if csv != Path("results.csv"):
            notes.append(f"results.csv exists, so this run writes {csv} (use --csv FILE to "
                         "choose, or --force to replace results.csv)")
            if force:
                csv, notes = Path("results.csv"), []
    elif csv is not None and csv.exists() and not force:
        raise ExerciseError(f"{csv} already exists; use --force to overwrite it (the old one "
                            "is kept as a .bak file) or choose another --csv")
    if csv is not None:
        _refuse_inside(csv, "the CSV", submissions)
        if csv.resolve() in files or csv.suffix.lower() == ".ipynb":
            raise ExerciseError(f"the CSV {csv} would overwrite a notebook; choose another name")
        if csv.is_dir():
            raise ExerciseError(f"the CSV {csv} is a folder; pass a file name")
        _writable_folder(csv, "the CSV")
    if feedback is not None:
        _refuse_inside(feedback, "the feedback folder", submissions)
        if feedback.exists() and not feedback.is_dir():
            raise ExerciseError(f"the feedback folder {feedback} is a file")
        if feedback.is_dir() and any(feedback.iterdir()) and not force:
            raise ExerciseError(f"the feedback folder {feedback} is not empty; use --force to "
                                "overwrite the files in it, or choose another folder")
        _writable_folder(feedback, "the feedback folder")
    return Outputs(csv, feedback, tuple(notes))


def backup(path: Path) -> Path | None:
    """Move an existing ``path`` to ``path.bak`` (or ``.bak2``, ...); return where, or None."""
    if not path.exists():
        return None
    target, n = path.with_name(path.name + ".bak"), 2
    while target.exists():
        target = path.with_name(f"{path.name}.bak{n}")
        n += 1
    path.replace(target)
    return target
