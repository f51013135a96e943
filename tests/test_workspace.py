"""The learner's copies in ``my-work/`` (issue 34 item 7): ``make lab`` opens them, so a learner's
saved lessons and exercises survive ``git pull``; nothing of the learner's is overwritten or
deleted, and ``make check EX=NN`` checks the learner's copy."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mha_course.grading.cli import lesson_notebook, main
from mha_course.grading.workspace import MANIFEST, WORKSPACE, course_notebooks, sync

ROOT = Path(__file__).resolve().parents[1]


def _course(tmp_path: Path) -> Path:
    """A small course: two lessons, a deep dive, an appendix, the app, two exercise notebooks."""
    root = tmp_path / "course"
    for rel in ("notebooks/01_a.ipynb", "notebooks/02_b.ipynb", "notebooks/deep_dives/02a_c.ipynb",
                "notebooks/appendix_x.ipynb", "notebooks/app.ipynb", "exercises/01_a.ipynb",
                "exercises/02_b.ipynb"):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"cells": [], "v": rel}))
    (root / "solutions").mkdir()
    return root


def test_a_first_sync_copies_every_lesson_deep_dive_appendix_and_exercise_but_not_the_app(
        tmp_path):
    root = _course(tmp_path)
    lines = sync(root)
    work = root / WORKSPACE
    got = sorted(p.relative_to(work).as_posix() for p in work.rglob("*.ipynb"))
    assert got == ["exercises/01_a.ipynb", "exercises/02_b.ipynb", "notebooks/01_a.ipynb",
                   "notebooks/02_b.ipynb", "notebooks/appendix_x.ipynb",
                   "notebooks/deep_dives/02a_c.ipynb"]
    assert lines == [f"copied 6 notebook(s) into {work}/"]
    assert sync(root) == []  # nothing to do the second time


def test_an_update_refreshes_untouched_copies_and_keeps_changed_ones(tmp_path):
    root = _course(tmp_path)
    sync(root)
    work = root / WORKSPACE
    (work / "notebooks/01_a.ipynb").write_text("my answers")  # the learner saved lesson 01
    for rel in ("notebooks/01_a.ipynb", "notebooks/02_b.ipynb"):  # git pull changed both
        (root / rel).write_text("course, new")
    lines = sync(root)
    assert (work / "notebooks/01_a.ipynb").read_text() == "my answers"
    assert (work / "notebooks/02_b.ipynb").read_text() == "course, new"
    assert any("refreshed 1" in line and "notebooks/02_b.ipynb" in line for line in lines)
    kept = [line for line in lines if line.startswith("kept your")]
    assert len(kept) == 1 and "notebooks/01_a.ipynb" in kept[0] and "newer version" in kept[0]
    assert sync(root) == kept  # said again until the learner acts; still nothing overwritten
    assert (work / "notebooks/01_a.ipynb").read_text() == "my answers"
    # the learner renames the copy to take the new one: the new version is copied, theirs stays
    (work / "notebooks/01_a.ipynb").rename(work / "notebooks/01_a.mine.ipynb")
    assert sync(root) == [f"copied 1 notebook(s) into {work}/"]
    assert (work / "notebooks/01_a.ipynb").read_text() == "course, new"
    assert (work / "notebooks/01_a.mine.ipynb").read_text() == "my answers"


def test_a_changed_copy_of_an_unchanged_lesson_is_kept_silently(tmp_path):
    root = _course(tmp_path)
    sync(root)
    (root / WORKSPACE / "exercises/01_a.ipynb").write_text("half done")
    assert sync(root) == []
    assert (root / WORKSPACE / "exercises/01_a.ipynb").read_text() == "half done"


def test_a_renamed_lesson_leaves_the_learners_copy_in_place(tmp_path):
    root = _course(tmp_path)
    sync(root)
    (root / "notebooks/02_b.ipynb").rename(root / "notebooks/02_renamed.ipynb")
    lines = sync(root)
    work = root / WORKSPACE
    assert (work / "notebooks/02_b.ipynb").exists()
    assert (work / "notebooks/02_renamed.ipynb").exists()
    assert any("no longer has notebooks/02_b.ipynb" in line for line in lines)


def test_copies_without_a_manifest_count_as_the_learners(tmp_path):
    root = _course(tmp_path)
    work = root / WORKSPACE / "notebooks"
    work.mkdir(parents=True)
    (work / "01_a.ipynb").write_text("made before the manifest existed")
    sync(root)
    assert (work / "01_a.ipynb").read_text() == "made before the manifest existed"
    assert json.loads((root / WORKSPACE / MANIFEST).read_text())  # recorded from now on


def test_a_file_where_the_workspace_should_be_is_a_clear_error(tmp_path, capsys):
    root = _course(tmp_path)
    (root / WORKSPACE).write_text("not a folder")
    assert main(["workspace", "--root", str(root)]) == 2
    assert "workspace: " in capsys.readouterr().err
    assert (root / WORKSPACE).read_text() == "not a folder"


def test_make_check_checks_the_learners_copy_first(tmp_path):
    root = _course(tmp_path)
    assert lesson_notebook("1", root) == root / "exercises/01_a.ipynb"
    sync(root)
    assert lesson_notebook("1", root) == root / WORKSPACE / "exercises/01_a.ipynb"
    assert lesson_notebook("02", root) == root / WORKSPACE / "exercises/02_b.ipynb"


def test_the_course_copies_every_lesson_and_exercise_notebook_it_has():
    names = course_notebooks(ROOT)
    assert "notebooks/01_matmul.ipynb" in names and "exercises/01_matmul.ipynb" in names
    assert "notebooks/app.ipynb" not in names
    assert any(n.startswith("notebooks/deep_dives/") for n in names)


def test_make_lab_syncs_first_opens_my_work_and_git_ignores_it():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in recipe.splitlines()[1:]]
    assert lines[0] == "$(BIN)/python -m mha_course workspace"
    assert re.search(r'--ServerApp\.root_dir="\$\(CURDIR\)/my-work"', recipe)
    assert "/my-work/" in (ROOT / ".gitignore").read_text().splitlines()
    ignored = subprocess.run(["git", "check-ignore", "-q", "my-work/notebooks/01_matmul.ipynb"],
                             cwd=ROOT, capture_output=True)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0, "git would track the learner's copies"


def test_the_command_line_runs_it(tmp_path):
    root = _course(tmp_path)
    done = subprocess.run([sys.executable, "-m", "mha_course", "workspace", "--root", str(root)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "copied 6 notebook(s)" in done.stdout
