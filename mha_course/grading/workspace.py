"""The learner's own copies: ``make lab`` opens ``my-work/``, never the course's tracked notebooks,
so lessons and exercises a learner ran, edited and saved survive ``git pull``.

``python -m mha_course workspace`` (``make lab`` runs it first) copies every lesson, deep dive,
appendix and exercise notebook of the course into ``my-work/``, in the same layout
(``my-work/notebooks/``, ``my-work/notebooks/deep_dives/``, ``my-work/exercises/``), so the
notebooks' relative links keep working. ``my-work/`` is in ``.gitignore``. The rules:

- a notebook the learner has no copy of is copied (a new lesson after ``git pull``, or one the
  learner deleted to start it again);
- a copy the learner has not changed since it was made (its hash is the one recorded in
  ``my-work/.copies.json``) is refreshed when the course's notebook changed;
- a copy the learner changed is never overwritten: when the course's notebook changed too, the
  command says so and how to take the new one (rename the copy, run it again);
- nothing in ``my-work/`` is ever deleted: a copy whose notebook the course renamed or removed
  stays, and the command names it.

``make check EX=03`` checks ``my-work/exercises/03_*.ipynb`` when it exists (see
:func:`mha_course.grading.cli.lesson_notebook`). Lessons 01 to 15 teach; this is plumbing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

#: The folder of the learner's copies, under the course's root.
WORKSPACE = "my-work"
MANIFEST = ".copies.json"
#: The course's folders whose notebooks are copied (the app's page is the instructors').
FOLDERS = ("notebooks", "notebooks/deep_dives", "exercises")
SKIP = {"notebooks/app.ipynb"}


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def course_notebooks(root: Path) -> list[str]:
    """The notebooks a learner gets a copy of, as paths relative to the course's root."""
    names = [f"{folder}/{p.name}" for folder in FOLDERS
             for p in sorted((root / folder).glob("*.ipynb"))]
    return [n for n in names if n not in SKIP]


def _copy(src: Path, dest: Path) -> None:
    """Copy through a temporary file beside ``dest``, so a stopped copy leaves no half file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".copy-", suffix=".ipynb", dir=dest.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def sync(root: Path, workspace: Path | None = None) -> list[str]:
    """Bring ``my-work/`` up to date with the course; return one line per thing worth saying.

    Never overwrites a copy the learner changed, never deletes anything in the workspace.
    """
    root = Path(root)
    work = Path(workspace) if workspace is not None else root / WORKSPACE
    if work.exists() and not work.is_dir():
        raise ValueError(f"workspace: {work} exists and is not a folder")
    work.mkdir(parents=True, exist_ok=True)
    manifest_path = work / MANIFEST
    try:
        recorded = json.loads(manifest_path.read_text(encoding="utf-8"))
        if not isinstance(recorded, dict):
            recorded = {}
    except (OSError, ValueError):
        recorded = {}
    copied, refreshed, messages = [], [], []
    current = course_notebooks(root)
    for rel in current:
        src, dest = root / rel, work / rel
        source_hash = _hash(src)
        if not dest.exists():
            _copy(src, dest)
            copied.append(rel)
        else:
            mine = _hash(dest)
            if mine == source_hash:
                pass
            elif recorded.get(rel) == mine:  # an untouched copy of an older version
                _copy(src, dest)
                refreshed.append(rel)
            else:  # the learner's work
                if recorded.get(rel) != source_hash:
                    messages.append(
                        f"kept your {WORKSPACE}/{rel}: the course has a newer version; to take "
                        f"it, rename yours (e.g. to {Path(rel).stem}.mine.ipynb) and run "
                        "`make lab` again")
                continue  # the recorded hash stays the one the learner's copy came from
        recorded[rel] = source_hash
    for rel in sorted(set(recorded) - set(current)):
        if (work / rel).exists():
            messages.append(f"kept your {WORKSPACE}/{rel}: the course no longer has {rel} "
                            "(renamed or removed); your copy stays")
    manifest_path.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n",
                             encoding="utf-8")
    head = []
    if copied:
        head.append(f"copied {len(copied)} notebook(s) into {work}/")
    if refreshed:
        head.append(f"refreshed {len(refreshed)} copy(ies) you had not changed: "
                    + ", ".join(refreshed))
    return head + messages
