"""Solutions reach only the grader (issue 33 item 3; the trial's item 4).

A learner who installed only the wheel checks their notebook against the references the package
ships (``mha_course/grading/references/``): each solution notebook with its outputs (what a
cell must print) and every cell but the answers, whose region holds only the exercise's stub.
``python -m mha_course generate`` writes them from ``solutions/``; here they are compared with a
fresh rendering (in sync), searched for answers (none), and a wheel built from the project (no
``solutions/`` beside it) checks a correct notebook and a wrong one from a folder of its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mha_course.grading.authoring.generate import (
    BEGIN,
    END,
    REFERENCES,
    render_references,
    stale_references,
)
from mha_course.grading.authoring.notebooks import info

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
SANITIZE = ROOT / "tests" / "nbval_sanitize.cfg"


def test_the_references_are_what_generate_writes_from_the_solutions():
    stale = stale_references(SOLUTIONS, REFERENCES, sanitize=SANITIZE)
    assert stale == [], f"run `python -m mha_course generate`: {stale}"


def region(source: str) -> list[str]:
    lines = source.split("\n")
    b = next(i for i, line in enumerate(lines) if line.strip() == BEGIN)
    e = next(i for i, line in enumerate(lines) if line.strip() == END)
    return [line.strip() for line in lines[b + 1:e] if line.strip()]


def test_no_answer_reaches_the_references_and_every_output_does():
    rendered = render_references(SOLUTIONS)
    checked = 0
    for name, text in rendered.items():
        ref = json.loads(text)["cells"]
        sol = json.loads((SOLUTIONS / name).read_text(encoding="utf-8"))["cells"]
        assert len(ref) == len(sol), name
        for mine, theirs in zip(ref, sol, strict=True):
            assert mine.get("outputs") == theirs.get("outputs"), (name, mine.get("id"))
            meta = mine["metadata"].get("mha_course", {})
            if meta.get("role") != "solution":
                assert mine["source"] == theirs["source"], (name, mine.get("id"))
                continue
            body = region("".join(mine["source"]))
            assert body[0].startswith(f'raise NotImplementedError("Exercise {meta["exercise"]}')
            assert all(line.endswith(" = ...") for line in body[1:]), (name, body)
            answer = [line for line in region("".join(theirs["source"]))
                      if not line.startswith("#")]
            assert answer and not set(answer) & set(body), (name, meta["exercise"])
            checked += 1
    assert checked >= 60  # every lesson's exercises, not a handful


@pytest.fixture(scope="module")
def wheel_site(tmp_path_factory):
    """The project built into a wheel (pip, setuptools, no network), unpacked into a folder as
    ``pip install --target`` would: the package alone, no ``solutions/`` anywhere near it."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "mha_course", src / "mha_course",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", tmp / "dist", src],
                           capture_output=True, text=True, timeout=600, cwd=tmp)
    assert build.returncode == 0, build.stdout + build.stderr
    wheel = next((tmp / "dist").glob("mha_course-*.whl"))
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(site)
    return {"site": site, "names": names, "tmp": tmp}


def test_the_wheel_ships_the_references_and_no_solution(wheel_site):
    names = wheel_site["names"]
    assert "mha_course/grading/references/03_single_head_attention.ipynb" in names
    assert "mha_course/grading/references/nbval_sanitize.cfg" in names
    assert not [n for n in names if n.startswith(("solutions/", "exercises/"))]


def test_a_learner_with_only_the_wheel_checks_their_notebook(wheel_site):
    """The trial: with only the wheel, `check` failed: "…/solutions: no such folder"."""
    learner = wheel_site["tmp"] / "learner"
    learner.mkdir()
    right = learner / "01_matmul.ipynb"
    shutil.copy(SOLUTIONS / "01_matmul.ipynb", right)  # every answer right
    nb = json.loads(right.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if info(cell).get("exercise") == "01.4" and info(cell).get("role") == "solution":
            cell["source"] = ("def flops_chain(shapes):\n"
                              "    return 0\n")
    wrong = learner / "wrong" / "01_matmul.ipynb"
    wrong.parent.mkdir()
    wrong.write_text(json.dumps(nb), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env["PYTHONPATH"] = str(wheel_site["site"])
    where = subprocess.run([sys.executable, "-c", "import mha_course; print(mha_course.__file__)"],
                           capture_output=True, text=True, cwd=learner, env=env, check=True)
    assert where.stdout.startswith(str(wheel_site["site"])), where.stdout
    run = subprocess.run([sys.executable, "-m", "mha_course", "check", right, wrong,
                          "--jobs", "2"], capture_output=True, text=True, cwd=learner, env=env,
                         timeout=900)
    out = run.stdout + run.stderr
    assert "no such folder of solution notebooks" not in out, out
    assert "checked against" in out and "references/01_matmul.ipynb" in out, out
    right_report, wrong_report = out.split(str(wrong), 1)[0], out.split(str(wrong), 1)[1]
    assert "6 of 6 passed." in right_report, out
    assert "Exercise 01.4  FAILED" in wrong_report and "5 of 6 passed" in wrong_report, out
    assert run.returncode == 1  # the wrong notebook's failure
