"""No sandbox is not no protection (issue 33 item 2; the trial's items 2 and 3).

Without bubblewrap (``--no-sandbox``, or ``MHA_COURSE_SANDBOX=off``, as in a Docker or
Gradescope container whose seccomp profile forbids it), a class of the fixture lessons (97, 98)
is graded against an assignment. Its hostile students read the solutions (and run them), rewrite
the assignment file, write into the solutions folder and into ``/tmp``:

- as root (Gradescope, Docker, CI), each kernel runs as an unprivileged user of its own
  (:mod:`mha_course.grading.running.account`): every attack fails with "Permission denied", earns
  nothing, and shows in the student's report; what the kernel left in ``/tmp`` is removed and
  reported by path; the solutions' permissions are given back after the command. These tests
  need root and are skipped otherwise, saying so.
- as the checker's own user (a laptop; ``MHA_COURSE_KERNEL_USER=same`` as root), the writes
  succeed, but the assignment is restored and reported and never used, and a new file in the
  solutions folder is reported by path.

This machine's Python may live under a home folder other users cannot enter (pyenv in
``/root``); the root-only tests then let other users pass through (``o+x``, not list) the folders
on the way to it while they run, as an instructor whose Python lives there would have to.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from cli_helpers import run_cli_split as run_cli

from mha_course.grading.running import check as check_module
from mha_course.grading.running.account import (
    USER_ENV,
    Accounts,
    Lockdown,
    _other_reaches,
    drop_privileges,
    sweep,
)
from mha_course.grading.running.sandbox import SANDBOX_ENV

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "solutions"
RIGHT = {"97.1": "def square(x):\n    return x * x", "98.1": "def double(x):\n    return x * 2",
         "98.2": "answer = 6 * 7"}
NOT_ROOT = ("needs root: only root can run a kernel as another user (a laptop's checker cannot, "
            "and the README says so); CI and containers run as root")


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def answered(base: Path, target: Path, answers: dict) -> Path:
    nb = json.loads(base.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("mha_course", {})
        if meta.get("role") == "solution" and meta.get("exercise") in answers:
            cell["source"] = answers[meta["exercise"]]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(nb), encoding="utf-8")
    return target


def hostile_class(tmp: Path) -> dict:
    """The course's fixture solutions, an assignment of 97.1, 98.1, 98.2 and five students."""
    solutions = tmp / "solutions"
    shutil.copytree(FIXTURES, solutions)
    code, out, err = run_cli("assign", "97.1", "98.1", "98.2", "-o", tmp / "hw1.ipynb",
                             "--title", "Homework 1", "--solutions", solutions, cwd=tmp)
    assert code == 0, out + err
    spec = tmp / "hw1.assignment.json"
    litter = Path("/tmp") / f"{tmp.name}-litter.txt"  # world-writable (pytest's folder is not)
    steal = ("import json\n"
             f"nb = json.load(open({str(solutions / '98_fixture.ipynb')!r}))\n"
             "for cell in nb['cells']:\n"
             "    if cell['metadata'].get('mha_course', {}).get('role') == 'solution':\n"
             "        exec(''.join(cell['source']))\n")
    rewrite = (f"open({str(spec)!r}, 'w').write(open({str(spec)!r}).read()"
               ".replace('\"points\": 1', '\"points\": 100'))\nanswer = 6 * 7")
    scatter = (f"open({str(litter)!r}, 'w').write('left behind')\n"
               f"open({str(solutions / 'new.py')!r}, 'w').write('x = 1')\nanswer = 6 * 7")
    subs = tmp / "submissions"
    answered(tmp / "hw1.ipynb", subs / "honest.ipynb", RIGHT)
    answered(tmp / "hw1.ipynb", subs / "reader.ipynb", {"98.1": steal, "98.2": steal})
    answered(tmp / "hw1.ipynb", subs / "rewriter.ipynb", {**RIGHT, "98.2": rewrite})
    answered(tmp / "hw1.ipynb", subs / "scatter.ipynb", {**RIGHT, "98.2": scatter})
    return {"solutions": solutions, "spec": spec, "subs": subs, "litter": litter,
            "spec_bytes": spec.read_bytes()}


def grade(tmp: Path, cls: dict, monkeypatch, *extra) -> tuple[int, str, str, dict]:
    """``check SUBMISSIONS --assignment ... --no-sandbox`` against a copy of the package."""
    shutil.copytree(ROOT / "mha_course", tmp / "package" / "mha_course",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(check_module, "PACKAGE_DIR", tmp / "package" / "mha_course")
    csv_path = tmp / "out" / "results.csv"
    csv_path.parent.mkdir(exist_ok=True)
    code, out, err = run_cli("check", cls["subs"], "--assignment", cls["spec"], "--solutions",
                             cls["solutions"], "--csv", csv_path, *extra, cwd=tmp)
    rows = {}
    if csv_path.exists():
        lines = csv_path.read_text(encoding="utf-8").splitlines()
        head = lines[0].split(",")
        rows = {line.split(",")[0]: dict(zip(head, line.split(","), strict=False))
                for line in lines[1:]}
    return code, out, err, rows


@pytest.fixture(scope="module")
def python_for_all():
    """Root only: let other users pass through the folders on the way to this Python."""
    if not is_root():
        pytest.skip(NOT_ROOT)
    opened = []
    for base in {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(),
                 Path(sys.executable).resolve().parent}:
        for folder in [*reversed(base.parents), base]:
            mode = stat.S_IMODE(folder.stat().st_mode)
            if not mode & stat.S_IXOTH:
                os.chmod(folder, mode | stat.S_IXOTH)
                opened.append((folder, mode))
    try:
        accounts, why = Accounts.find()
        if accounts is None:
            pytest.skip(f"kernels cannot run as users of their own here: {why}")
        yield accounts
    finally:
        for folder, mode in reversed(opened):
            os.chmod(folder, mode)


# ------------------------------------------------------------------ as root: users of their own


@contextlib.contextmanager
def open_folder():
    """A folder in /tmp every user may enter (pytest's own are its owner's alone), so that
    only the checker's permissions keep a kernel out of the class's files."""
    tmp = Path(tempfile.mkdtemp(prefix="mha-course-test-"))
    tmp.chmod(0o755)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def as_root(python_for_all):
    with open_folder() as tmp:
        cls = hostile_class(tmp)
        modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (cls["solutions"], cls["subs"])}
        assert all(_other_reaches(p) for p in modes)  # readable to all, until the check
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv(USER_ENV, raising=False)
            code, out, err, rows = grade(tmp, cls, patch, "--no-sandbox", "--jobs", "2")
        yield {**cls, "code": code, "out": out, "err": err, "rows": rows, "modes": modes,
               "after": {p: stat.S_IMODE(p.stat().st_mode) for p in modes},
               "spec_after": cls["spec"].read_bytes(),
               "new_file": (cls["solutions"] / "new.py").exists()}


def report_of(out: str, name: str) -> str:
    start = out.index(f"== {name}")
    end = out.find("\n== ", start + 1)
    return out[start:] if end < 0 else out[start:end]


def test_as_root_the_command_says_each_kernel_runs_as_a_user_of_its_own(as_root):
    assert as_root["code"] == 0, as_root["out"] + as_root["err"]
    assert "each kernel as an unprivileged user of its own" in as_root["err"]
    assert "WITHOUT a sandbox" not in as_root["err"]
    assert as_root["rows"]["honest"]["total"] == "4"


def test_as_root_a_notebook_that_reads_the_solutions_earns_nothing_and_is_reported(as_root):
    report = report_of(as_root["out"], "reader")
    assert "Permission denied" in report and "98_fixture.ipynb" in report, report
    assert as_root["rows"]["reader"]["98.1"] != "passed"
    assert as_root["rows"]["reader"]["total"] == "0"


def test_as_root_a_notebook_cannot_rewrite_the_assignment(as_root):
    assert as_root["spec_after"] == as_root["spec_bytes"]
    report = report_of(as_root["out"], "rewriter")
    assert "Exercise 98.2  FAILED: PermissionError" in report and "assignment.json" in report
    assert as_root["rows"]["rewriter"]["total"] == "2"  # 97.1 and 98.1, one point each


def test_as_root_what_a_kernel_writes_is_refused_or_removed_and_reported(as_root):
    report = report_of(as_root["out"], "scatter")
    assert "Permission denied" in report and "new.py" in report, report
    assert not as_root["new_file"]
    assert not as_root["litter"].exists()
    assert (f"{as_root['litter']}: written by a kernel while {as_root['subs'] / 'scatter.ipynb'}"
            f" was being checked; removed") in as_root["err"]


def test_as_root_the_private_folders_get_their_permissions_back(as_root):
    assert as_root["after"] == as_root["modes"]


# --------------------------------------------------------- as the checker's user (a laptop)


@pytest.fixture(scope="module")
def as_you(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("same-user")
    cls = hostile_class(tmp)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(USER_ENV, "same")
        patch.setenv(SANDBOX_ENV, "off")
        code, out, err, rows = grade(tmp, cls, patch, "--jobs", "1")
    cls["litter"].unlink(missing_ok=True)
    return {**cls, "code": code, "out": out, "err": err, "rows": rows}


def test_as_your_user_the_command_says_plainly_that_the_kernel_can_read_what_you_can(as_you):
    assert as_you["code"] == 0, as_you["out"] + as_you["err"]
    assert (f"learners' code runs WITHOUT a sandbox: {SANDBOX_ENV}=off was set; it can read "
            "and write whatever you can") in as_you["err"]


def test_as_your_user_a_rewritten_assignment_is_restored_reported_and_never_used(as_you):
    spec = as_you["spec"]
    assert spec.read_bytes() == as_you["spec_bytes"]
    assert (f"{spec}: changed while {as_you['subs'] / 'rewriter.ipynb'} was being checked; "
            "restored as it was before the check") in as_you["err"]
    assert as_you["rows"]["rewriter"]["total"] == "4"  # the assignment read at the start
    assert as_you["rows"]["honest"]["total"] == "4"


def test_as_your_user_a_file_written_into_the_solutions_is_reported_by_path(as_you):
    assert (f"{as_you['solutions'] / 'new.py'}: written while "
            f"{as_you['subs'] / 'scatter.ipynb'} was being checked") in as_you["err"]


# --------------------------------------------------------------------------- the parts


def test_lockdown_closes_what_others_could_read_keeps_the_way_to_python_and_gives_it_back():
    if not is_root():
        pytest.skip(NOT_ROOT)  # chmod works for owners too, but only root is a kernel's "other"
    with open_folder() as tmp:
        lockdown_of(tmp)


def lockdown_of(tmp_path: Path) -> None:
    course = tmp_path / "course"
    (course / "solutions").mkdir(parents=True)
    (course / "solutions" / "a.ipynb").write_text("{}")
    (course / ".venv" / "bin").mkdir(parents=True)
    (course / "README.md").write_text("hi")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    for path in (course, course / "solutions", course / ".venv", course / ".venv" / "bin"):
        path.chmod(0o755)
    before = {p: stat.S_IMODE(p.stat().st_mode) for p in [course, *course.rglob("*"), private]}
    lock = Lockdown([course, private], keep_open=[course / ".venv" / "bin"])
    mode = {p: stat.S_IMODE(p.stat().st_mode) for p in before}
    assert mode[course] == 0o751  # passed through to the venv, not listed
    assert mode[course / "solutions"] == 0o750 and mode[course / "README.md"] == 0o640
    assert mode[course / ".venv"] == 0o751 and mode[course / ".venv" / "bin"] == 0o755
    assert mode[private] == 0o700 and not [x for x in lock.locked if x.path == private]
    lock.close()
    assert {p: stat.S_IMODE(p.stat().st_mode) for p in before} == before


def test_sweep_removes_only_what_the_kernels_user_wrote_where_it_could(python_for_all):
    uid = python_for_all.lease()
    try:
        with open_folder() as tmp:
            swept_by(uid, tmp)
    finally:
        python_for_all.release(uid)


def swept_by(uid: int, tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    tmp_path.chmod(0o755)
    mine = shared / "the-checkers.txt"
    mine.write_text("kept")
    subprocess.run([sys.executable, "-c", "import os, sys; os.makedirs(sys.argv[1]); "
                    "open(sys.argv[2], 'w').write('x')", str(shared / "dir" / "deep"),
                    str(shared / "theirs.txt")], user=uid, group=uid, extra_groups=[],
                   check=True, cwd="/")
    found = sweep(uid, [tmp_path])
    assert sorted(found) == [shared / "dir", shared / "theirs.txt"]
    assert mine.read_text() == "kept" and sorted(shared.iterdir()) == [mine]


def test_the_kernel_becomes_its_user_for_good_before_any_learner_code(python_for_all):
    uid = python_for_all.lease()
    try:
        with open_folder() as tmp:
            becomes(uid, tmp)
    finally:
        python_for_all.release(uid)
    with pytest.raises(SystemExit, match="could not become an unprivileged user"):
        drop_privileges("not-a-user", [])


def becomes(uid: int, tmp_path: Path) -> None:
    connection = tmp_path / "kernel.json"
    connection.write_text('{"key": "secret"}')
    connection.chmod(0o600)
    work = tmp_path / "work"
    work.mkdir()
    code = ("import os, sys\n"
            "from mha_course.grading.running.account import drop_privileges\n"
            "argv = ['-f', sys.argv[1]]\n"
            "drop_privileges(sys.argv[2], argv)\n"
            "print(os.getuid(), os.getgid(), os.getgroups(), open(argv[1]).read())\n"
            "try:\n    os.setuid(0)\nexcept PermissionError:\n    print('stays')\n")
    run = subprocess.run([sys.executable, "-c", code, str(connection), f"{uid}:{uid}"],
                         cwd=work, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.stdout.split("\n")[:2] == [f'{uid} {uid} [] {{"key": "secret"}}', "stays"]


def test_gradescope_without_the_sandbox_hands_no_solutions_to_the_kernel(python_for_all):
    """The trial's item 2: an answer that execs the solutions scored 35/35 without bwrap."""
    with open_folder() as tmp:
        gradescope_attack(tmp)


def gradescope_attack(tmp: Path) -> None:
    from mha_course.grading.authoring.assignment import assignment_text, load_assignment
    from mha_course.grading.export.to_gradescope import run_autograder

    (tmp / "class").mkdir()
    cls = hostile_class(tmp / "class")
    ag = tmp / "autograder"
    source = ag / "source"
    shutil.copytree(cls["solutions"], source / "solutions")
    (source / "solutions" / "new.py").unlink(missing_ok=True)
    (source / "assignment.json").write_text(assignment_text(load_assignment(cls["spec"])))
    (source / "autograder.json").write_text('{"timeout": 30, "starter": "hw1.ipynb"}')
    steal = ("import json\n"
             f"nb = json.load(open({str(source / 'solutions' / '98_fixture.ipynb')!r}))\n"
             "for cell in nb['cells']:\n"
             "    if cell['metadata'].get('mha_course', {}).get('role') == 'solution':\n"
             "        exec(''.join(cell['source']))\n")
    answered(cls["subs"].parent / "hw1.ipynb", ag / "submission" / "hw1.ipynb",
             {"97.1": RIGHT["97.1"], "98.1": steal, "98.2": steal})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SANDBOX_ENV, "off")
        patch.delenv(USER_ENV, raising=False)
        data = run_autograder(ag)
    scores = {t["number"]: t["score"] for t in data["tests"]}
    assert scores == {"97.1": 1, "98.1": 0, "98.2": 0}, data
    assert "Permission denied" in next(t["output"] for t in data["tests"]
                                       if t["number"] == "98.1")
    assert stat.S_IMODE((source / "solutions").stat().st_mode) & 0o005  # given back after

