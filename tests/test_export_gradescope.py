"""The Gradescope export, run for real on a folder laid out like Gradescope's ``/autograder``.

``export gradescope`` writes the autograder zip; the zip is unpacked into ``AG/source`` as
Gradescope does, its ``setup.sh`` runs for real (a fresh virtual environment, the course
installed from the wheel in the zip, the checker's packages from the package index; only the
``apt-get`` step is skipped), and its ``run_autograder`` grades a right, a wrong, a crashing
(with an exercise's cell deleted) and an empty submission, each in its own run, as Gradescope
runs it. ``MHA_COURSE_AUTOGRADER_ROOT`` points both scripts at the folder instead of
``/autograder``. Every ``results.json`` is validated against a JSON schema written from
Gradescope's documentation (``tests/data/gradescope_results.schema.json``), and its points per
exercise are those ``python -m mha_course check --assignment`` gives the same notebooks.
"""

from __future__ import annotations

import copy
import csv
import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import nbformat
import pytest
from cli_helpers import make_class, run_cli

from mha_course.grading.export.to_gradescope import ROOT_ENV

ROOT = Path(__file__).resolve().parent.parent
IDS = ["03.1", "03.2", "03.5"]
SCHEMA = json.loads((ROOT / "tests" / "data" / "gradescope_results.schema.json").read_text())
CRASH = "import os\nos._exit(1)"






def test_the_schema_accepts_the_documented_example_and_rejects_what_the_docs_do_not_allow():
    documented = {"score": 44.0, "execution_time": 136, "output": "Text", "output_format":
                  "simple_format", "test_output_format": "text", "test_name_format": "text",
                  "visibility": "after_due_date", "stdout_visibility": "visible",
                  "extra_data": {}, "tests": [{"score": 2.0, "max_score": 2.0, "status": "passed",
                                               "name": "Your name here", "name_format": "text",
                                               "number": "1.1", "output": "Giant string",
                                               "output_format": "text", "tags": ["tag1"],
                                               "visibility": "visible", "extra_data": {}}],
                  "leaderboard": [{"name": "Accuracy", "value": .926},
                                  {"name": "Time", "value": 15.1, "order": "asc"},
                                  {"name": "Stars", "value": "*****"}]}
    jsonschema.validate(documented, SCHEMA)
    jsonschema.validate({"tests": [{"name": "Compilation check", "status": "passed",
                                    "score": 0}]}, SCHEMA)
    for bad in ({"tests": [{"name": "no score anywhere"}]}, {"score": 1, "grade": 1},
                {"score": 1, "tests": [{"score": 1, "status": "ok"}]},
                {"score": 1, "visibility": "public"}, {"score": "10"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    """The exported zip unpacked into AG/source and its setup.sh run, as Gradescope builds it."""
    tmp = tmp_path_factory.mktemp("gradescope")
    out = tmp / "export" / "autograder.zip"
    code, text = run_cli("export", "gradescope", *IDS, "-o", out, "--name", "hw1", "--title",
                         "Week 2", "--points", "03.5=4", cwd=ROOT)
    assert code == 0, text
    ag = tmp / "autograder"
    source = ag / "source"
    with zipfile.ZipFile(out) as archive:
        names = archive.namelist()
        for entry in archive.infolist():
            archive.extract(entry, source)
            mode = (entry.external_attr >> 16) & 0o777
            if mode:
                os.chmod(source / entry.filename, mode)
    shutil.copy(source / "run_autograder", ag / "run_autograder")  # Gradescope copies it there
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({ROOT_ENV: str(ag), "MHA_COURSE_SKIP_APT": "1",
                "MHA_COURSE_PYTHON": sys.executable})
    setup = subprocess.run(["bash", source / "setup.sh"], env=env, capture_output=True,
                           text=True, timeout=1800)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    return {"ag": ag, "env": env, "names": names, "zip": out, "text": text,
            "starter": out.with_name("hw1.ipynb")}


def test_the_zip_has_gradescopes_two_scripts_at_its_root_and_what_they_need(autograder):
    names = autograder["names"]
    assert {"setup.sh", "run_autograder", "requirements.txt", "assignment.json",
            "autograder.json", "hw1.ipynb", "nbval_sanitize.cfg",
            "solutions/03_single_head_attention.ipynb",
            "wheels/mha_course-0.1.0-py3-none-any.whl"} <= set(names)
    assert not [n for n in names if n.startswith("solutions/") and "03_" not in n]
    source = autograder["ag"] / "source"
    for script in ("setup.sh", "run_autograder"):
        assert (source / script).stat().st_mode & stat.S_IXUSR
        assert (source / script).read_text().startswith("#!/usr/bin/env bash\n")
    requirements = (source / "requirements.txt").read_text().split()
    assert "nbval>=0.11" in requirements and not any(r.startswith("jupyterlab")
                                                     for r in requirements)
    assert autograder["starter"].is_file()
    starter = nbformat.read(autograder["starter"], as_version=4)
    assert "BEGIN SOLUTION" not in autograder["starter"].read_text()
    assert starter.metadata["mha_course"]["assignment"] == IDS
    venv_python = autograder["ag"] / "venv" / "bin" / "python"
    where = subprocess.run([venv_python, "-c", "import mha_course; print(mha_course.__file__)"],
                           capture_output=True, text=True, cwd=autograder["ag"],
                           env=autograder["env"], check=True).stdout
    assert "/venv/lib/" in where and "site-packages" in where  # from the wheel, not a checkout
    code, text = run_cli("export", "gradescope", "03.1", "-o", autograder["zip"], cwd=ROOT)
    assert code == 2 and "already exists; use --force" in text


def submissions(starter: Path) -> dict[str, bytes | None]:
    classes = make_class()
    right = {x: classes.RIGHT[x] for x in IDS}
    plans = {"right": right, "wrong": {**right, "03.1": classes.WRONG["03.1"][0]},
             "crashing": {**right, "03.2": CRASH, "03.5": None}}
    out = {}
    base = nbformat.read(starter, as_version=4)
    for name, answers in plans.items():
        nb = copy.deepcopy(base)
        cells = []
        for cell in nb.cells:
            meta = cell.metadata.get("mha_course", {})
            if meta.get("role") == "solution" and meta["exercise"] in answers:
                if answers[meta["exercise"]] is None:
                    continue  # the student deleted the cell
                cell.source = answers[meta["exercise"]]
            cells.append(cell)
        nb.cells = cells
        out[name] = nbformat.writes(nb).encode()
    out["empty"] = None
    return out


@pytest.fixture(scope="module")
def graded(autograder, tmp_path_factory):
    """run_autograder on each submission, and the course checker on the same notebooks."""
    ag, env = autograder["ag"], autograder["env"]
    notebooks = submissions(autograder["starter"])
    results, stdout = {}, {}
    for name, data in notebooks.items():
        shutil.rmtree(ag / "submission", ignore_errors=True)
        shutil.rmtree(ag / "results", ignore_errors=True)
        (ag / "submission").mkdir()
        (ag / "results").mkdir()
        if data is None:
            (ag / "submission" / "notes.txt").write_text("I forgot the notebook")
        else:
            (ag / "submission" / "hw1.ipynb").write_bytes(data)
        (ag / "submission_metadata.json").write_text(json.dumps(
            {"users": [{"name": f"Student {name}", "email": "", "id": 1}]}))
        run = subprocess.run([ag / "run_autograder"], cwd=ag, env=env, capture_output=True,
                             text=True, timeout=1800)
        assert run.returncode == 0, run.stdout + run.stderr
        stdout[name] = run.stdout
        results[name] = json.loads((ag / "results" / "results.json").read_text())
    class_dir = tmp_path_factory.mktemp("ours")
    for name, data in notebooks.items():
        (class_dir / "submissions" / name).mkdir(parents=True)
        if data is not None:
            (class_dir / "submissions" / name / "hw1.ipynb").write_bytes(data)
    code, report = run_cli("check", class_dir / "submissions", "--assignment", ag / "source" /
                           "assignment.json", "--csv", class_dir / "ours.csv", "--jobs", 2,
                           cwd=ROOT)
    with open(class_dir / "ours.csv", newline="") as f:
        ours = {row["student"]: row for row in csv.DictReader(f)}
    return {"results": results, "stdout": stdout, "ours": ours, "report": report}


def test_every_results_json_follows_gradescopes_schema(graded):
    for name, data in graded["results"].items():
        jsonschema.validate(data, SCHEMA)
        assert [t["number"] for t in data["tests"]] == IDS, name
        assert [t["max_score"] for t in data["tests"]] == [1, 2, 4]
        assert data["score"] == sum(t["score"] for t in data["tests"])


def test_gradescope_gives_the_points_the_course_checker_gives(graded):
    results, ours = graded["results"], graded["ours"]
    expected = {"right": [1, 2, 4], "wrong": [0, 2, 4], "crashing": [1, 0, 0], "empty": [0, 0, 0]}
    for name, points in expected.items():
        assert [t["score"] for t in results[name]["tests"]] == points, results[name]
        assert [float(ours[name][x]) for x in IDS] == points, graded["report"]
        assert [t["status"] for t in results[name]["tests"]] == [
            "passed" if p else "failed" for p in points]


def test_each_test_says_what_the_checker_says(graded):
    wrong = graded["results"]["wrong"]["tests"][0]
    assert wrong["name"] == "Exercise 03.1 ★ — Scaled scores"
    assert wrong["output"].startswith("not yet right: your scores for q (2, 3, 4)")
    assert "Likely mistake: scores not scaled by √d_k" in wrong["output"]
    crash = graded["results"]["crashing"]["tests"]
    assert crash[1]["output"].startswith("crashed the kernel: the kernel died")
    assert crash[2]["output"].startswith("missing")
    assert graded["results"]["right"]["tests"][2]["output"] == "passed"
    empty = graded["results"]["empty"]
    assert "no notebook (.ipynb) in the submission: upload your hw1.ipynb" in empty["output"]
    feedback = graded["results"]["wrong"]["output"]
    assert graded["results"]["wrong"]["output_format"] == "md"
    assert "Student wrong" in feedback and "6 / 7 points" in feedback
    for data in graded["results"].values():  # no path of the grading machine in what students see
        text = json.dumps(data)
        assert "/autograder" not in text and str(ROOT) not in text and "/tmp/" not in text
