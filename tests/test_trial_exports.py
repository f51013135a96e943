"""The exports after the instructor's trial of 2 December 2026 (items 5, 8, 10 and 14).

- item 5: nbgrader dropped a whole submission when a slow cell's output came after its IOPub
  timeout (4 s): the exported ``nbgrader_config.py`` sets it to the cell timeout, read back by
  traitlets' loader and, where nbgrader is installed, by nbgrader's own ``Execute``;
- item 8: the due date reaches nbgrader's gradebook through the command the export's README
  gives (run for real, where nbgrader is installed), with an explicit UTC offset;
- item 10: feedback names no folder of the grading machine, even in a kernel's traceback
  (``File ~/.../course/.venv/...``);
- item 14: an empty Gradescope submission says why once; the footer tells a student what
  works without the course's checkout; ``setup.sh`` installs the course after its packages and
  without its dependencies, so pip never complains about the missing JupyterLab.

nbgrader is looked for as ``tests/test_export_nbgrader.py`` does (``MHA_COURSE_NBGRADER``, or
``.venv-nbgrader``); without it those tests skip, unless ``MHA_COURSE_REQUIRE_NBGRADER=1``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import pytest
from cli_helpers import run_cli
from traitlets.config import Config

from mha_course.grading.authoring.assignment import Assignment, assignment_text, make_assignment
from mha_course.grading.authoring.catalog import exercises
from mha_course.grading.authoring.notebooks import CellRole, course_root
from mha_course.grading.export.to_gradescope import SETUP_SH, run_autograder
from mha_course.grading.export.to_nbgrader import (
    NBGRADER_VERSION,
    config_text,
    nbgrader_due,
    readme_text,
)
from mha_course.grading.reporting.feedback import FOOTER, feedback_markdown, scrub
from mha_course.grading.reporting.gradebook import grade_row
from mha_course.grading.reporting.verdicts import NotebookResult, Verdict, failure_message

ROOT = Path(__file__).resolve().parent.parent
IDS = ["03.1", "03.2"]
DUE = "2030-01-01T23:59:59+01:00"


def nbgrader_executable() -> Path:
    """The nbgrader to test with; skip (or fail when CI requires it) without one."""
    for candidate in (os.environ.get("MHA_COURSE_NBGRADER"),
                      ROOT / ".venv-nbgrader" / "bin" / "nbgrader"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    why = f"nbgrader is not installed: `make nbgrader` puts nbgrader {NBGRADER_VERSION} there"
    if os.environ.get("MHA_COURSE_REQUIRE_NBGRADER") == "1":
        pytest.fail(f"MHA_COURSE_REQUIRE_NBGRADER=1 but {why}", pytrace=False)
    pytest.skip(why)


def run_nbgrader_env(executable: Path, args, cwd: Path) -> str:
    env = {**os.environ, "PATH": f"{executable.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    course = tmp_path_factory.mktemp("trial-nbgrader") / "course"
    code, out = run_cli("export", "nbgrader", *IDS, "-o", course, "--name", "hw1",
                        "--due", DUE, cwd=ROOT)
    assert code == 0, out
    return course


def loaded_config(text: str) -> Config:
    config = Config()
    exec(compile(text, "nbgrader_config.py", "exec"), {"get_config": lambda: config})
    return config


# ---------------------------------------------------------------- item 5: the IOPub timeout


def test_the_exported_config_waits_for_a_cells_output_as_long_as_for_the_cell(exported):
    text = (exported / "nbgrader_config.py").read_text()
    assert "c.Execute.iopub_timeout = 30" in text and "c.Execute.timeout = 30" in text
    config = loaded_config(text)
    assert config.Execute.iopub_timeout == config.Execute.timeout == 30
    # a fractional timeout is rounded up, never down (nbgrader's traits are integers)
    longer = loaded_config(config_text("hw1", 45.5))
    assert longer.Execute.timeout == longer.Execute.iopub_timeout == 46


def test_nbgraders_execute_preprocessor_gets_the_exported_iopub_timeout(exported):
    executable = nbgrader_executable()
    python = executable.parent / "python"
    code = (
        "import json, sys\n"
        "from traitlets.config.loader import PyFileConfigLoader\n"
        "from nbgrader.preprocessors import Execute\n"
        "config = PyFileConfigLoader('nbgrader_config.py', path=sys.argv[1]).load_config()\n"
        "ex = Execute(config=config)\n"
        "default = Execute()\n"
        "print(json.dumps({'iopub': ex.iopub_timeout, 'timeout': ex.timeout,\n"
        "                  'raise': ex.raise_on_iopub_timeout,\n"
        "                  'default_iopub': default.iopub_timeout}))\n")
    got = json.loads(run_nbgrader_env(executable, [python, "-c", code, exported], exported))
    assert got["default_iopub"] == 4  # nbgrader's default: what dropped the trial's submission
    # nbgrader raises on an IOPub timeout (and drops the submission): the wait is the cell's
    assert got["raise"] is True and got["iopub"] == got["timeout"] == 30


# ---------------------------------------------------------------- item 8: the due date


def test_a_due_date_without_an_offset_gets_this_machines():
    naive = Assignment(("03.1",), due="2030-01-01T23:59:59")
    due = nbgrader_due(naive)
    assert datetime.fromisoformat(due) == datetime(2030, 1, 1, 23, 59, 59).astimezone()
    assert datetime.fromisoformat(due).utcoffset() is not None
    assert nbgrader_due(Assignment(("03.1",), due=DUE)) == DUE
    assert nbgrader_due(Assignment(("03.1",))) is None
    assert "duedate" not in config_text("hw1", 30) and "--duedate=" + DUE in config_text(
        "hw1", 30, DUE)
    undated = readme_text("hw1", make_assignment(["03.1"], exercises()), "course.whl")
    assert "The assignment has no due date" in undated and "--duedate=" in undated


def test_the_readme_registers_the_due_date_and_nbgraders_gradebook_takes_it(exported, tmp_path):
    readme = (exported / "README.md").read_text()
    commands = re.findall(r"nbgrader db assignment add (\S+) --duedate=(\S+)", readme)
    assert commands == [("hw1", DUE)], readme
    steps = [int(m) for m in re.findall(r"^(\d+)\. ", readme, flags=re.M)]
    assert steps == list(range(1, len(steps) + 1))
    assert readme.index("db assignment add") < readme.index("nbgrader generate_assignment hw1")
    executable = nbgrader_executable()
    course = tmp_path / "course"
    shutil.copytree(exported, course)
    run_nbgrader_env(executable, [executable, "db", "assignment", "add", "hw1",
                                  f"--duedate={DUE}"], course)
    run_nbgrader_env(executable, [executable, "generate_assignment", "hw1"], course)
    listed = run_nbgrader_env(executable, [executable, "db", "assignment", "list"], course)
    # nbgrader keeps due dates in UTC: 23:59:59 at UTC+01:00 is 22:59:59 UTC
    assert "hw1 (due: 2030-01-01 22:59:59)" in listed, listed
    expected = datetime.fromisoformat(DUE).astimezone(timezone.utc).replace(tzinfo=None)
    assert f"hw1 (due: {expected})" in listed


# ---------------------------------------------------------------- item 10: no path in feedback


def test_a_traceback_through_the_graders_venv_and_checkout_names_none_of_its_folders(tmp_path):
    home, checkout = str(Path.home()), str(course_root())
    frames = [
        "\x1b[0;31mValueError\x1b[0m  Traceback (most recent call last)\n"
        "Cell \x1b[0;32mIn[4], line 2\x1b[0m\n----> 2 scores(q, k)\n",
        f"File \x1b[0;32m{home}/teaching/course/mha_course/checks/attention.py:40\x1b[0m, in "
        "\x1b[0;36mcheck\x1b[0;34m(fn)\x1b[0m\n---> 40 out = fn(q, k)\n",
        "File \x1b[0;32m~/trial/course/.venv/lib/python3.12/site-packages/numpy/_core/"
        "fromnumeric.py:57\x1b[0m, in \x1b[0;36m_wrapfunc\x1b[0;34m(obj)\x1b[0m\n"
        "---> 57 return bound(*args)\n",
        "ValueError: shapes (2,3) and (4,3) not aligned"]
    record = {"error": {"ename": "ValueError", "evalue": "shapes (2,3) and (4,3) not aligned",
                        "traceback": frames}}
    message = failure_message("03.1", record, CellRole("03.1", "solution", "your solution cell"))
    assert "~/trial/course/.venv/lib/python3.12/site-packages/numpy" in message  # as the trial
    message += (f"\n  File {home}/teaching/course/mha_course/checks/attention.py:40"
                f"\n  File {checkout}/mha_course/grading/running/run.py:12"
                f"\n  File {home}/course/.venv/lib/python3.11/site-packages/nbval/plugin.py:9"
                "\n  File /usr/lib/python3.11/json/decoder.py:337"
                f"\n  File {home}/.pyenv/versions/3.11.9/lib/python3.11/ast.py:50"
                f"\n  see {home}/private/notes.txt and {tmp_path}/k/42.py")
    catalog = exercises()
    hw = make_assignment(IDS, catalog)
    where = tmp_path / "subs" / "bob.ipynb"
    result = NotebookResult(where, "", [Verdict("03.1", "failed", message),
                                        Verdict("03.2", "passed")])
    text = feedback_markdown(grade_row("Bob", "", [(where, result)], hw), hw, catalog,
                             roots=[tmp_path / "subs"])
    assert text.rstrip().endswith(FOOTER)
    text = text.rstrip()[:-len(FOOTER)]  # the footer names `.venv/bin/python` on purpose
    for leak in (home, checkout, str(tmp_path), ".venv", "~", "trial/", "teaching", ".pyenv",
                 "private/", "/usr/lib"):
        assert leak not in text, leak
    for neutral in ("<site-packages>/numpy/_core/fromnumeric.py:57",
                    "mha_course/checks/attention.py:40", "mha_course/grading/running/run.py:12",
                    "<site-packages>/nbval/plugin.py:9", "<python>/json/decoder.py:337",
                    "<python>/ast.py:50", "see notes.txt and 42.py"):
        assert neutral in text, neutral
    assert "shapes (2,3) and (4,3) not aligned" in text
    assert scrub("/tmp/x.ipynb: not JSON; see /tmp/a/b/y.py") == "x.ipynb: not JSON; see y.py"
    # a plain message is left as it is
    assert scrub("q has shape (2, 3) ~ expected (2, 4): see lesson 03") == (
        "q has shape (2, 3) ~ expected (2, 4): see lesson 03")


# ---------------------------------------------------------------- item 14: Gradescope polish


def test_the_footer_says_what_works_without_the_courses_checkout():
    catalog = exercises()
    hw = make_assignment(IDS, catalog)
    where = Path("bob.ipynb")
    result = NotebookResult(where, "", [Verdict("03.1", "failed", "wrong"),
                                        Verdict("03.2", "passed")])
    text = feedback_markdown(grade_row("Bob", "", [(where, result)], hw), hw, catalog)
    assert text.rstrip().endswith(FOOTER)
    first = FOOTER.split(". ")[0]
    assert "restart the kernel and run all cells" in first and ".venv" not in first
    assert "check cell prints `Exercise NN.M passed`" in FOOTER
    assert "In a copy of the course" in FOOTER  # the whole-notebook check needs the checkout


def test_setup_installs_the_packages_first_and_the_course_without_its_dependencies():
    lines = [ln for ln in SETUP_SH.splitlines() if "pip install" in ln]
    assert len(lines) == 2, lines
    requirements, course = lines
    assert '-r "$AG/source/requirements.txt"' in requirements
    assert "--no-deps" in course and "wheels/*.whl" in course
    # pip warns about what an installed package lacks only while resolving dependencies: with
    # the course installed last and --no-deps, it never reports the missing JupyterLab
    assert "--no-deps" not in requirements


def test_an_empty_submission_says_why_once(tmp_path):
    root = tmp_path / "autograder"
    source, submission = root / "source", root / "submission"
    (source / "solutions").mkdir(parents=True)
    submission.mkdir()
    (submission / "notes.txt").write_text("I forgot the notebook")
    lesson = course_root() / "solutions" / "03_single_head_attention.ipynb"
    shutil.copy(lesson, source / "solutions" / lesson.name)
    hw = make_assignment(IDS, exercises())
    (source / "assignment.json").write_text(assignment_text(hw))
    (source / "autograder.json").write_text(json.dumps({"name": "hw1", "starter": "hw1.ipynb",
                                                        "timeout": 30}))
    data = run_autograder(root)
    why = "no notebook (.ipynb) in the submission: upload your hw1.ipynb"
    assert data["score"] == 0 and [t["score"] for t in data["tests"]] == [0, 0]
    output = data["output"]
    assert output.count(why) == 1, output
    assert "no notebooks in this submission" not in output
    assert "## Notes" not in output and "## Exercise" not in output  # nothing else to say
    assert f"**No exercise could be graded**: {why}" in output
    for test in data["tests"]:  # each test still says why it has no points
        assert test["output"].endswith(why) and test["status"] == "failed"
    assert json.loads((root / "results" / "results.json").read_text()) == data
