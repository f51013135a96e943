"""Limits on what one submission may use, and a hostile class checked in one folder.

The first tests check the pieces in milliseconds: sizes, the messages, which mechanism this
machine has, the shell prefix that puts a kernel into its cgroups, a real (small) fork bomb
stopped by the process limit outside any checker.

Then one folder of fixture-lesson-98 submissions is checked twice, in the sandbox and without it
(``--no-sandbox``), with small limits (--memory 1G --processes 48 --disk 64M --timeout 5) so the
machine stays responsive: a memory hog, a fork bomb, a disk filler and a submission whose own
cell rewrites two classmates' notebooks and the solution it is graded against. Each hostile
submission loses only the exercise that hit a limit, with a message naming the limit; every
honest classmate's verdict is what it would be alone; afterwards every submission and the
solutions are byte-identical to what they were (without the sandbox: restored, the changed
bytes kept beside them and the report naming who was being checked).

The fork bomb runs only where this machine enforces the process limit (a pids cgroup as root,
RLIMIT_NPROC in the sandbox otherwise); elsewhere it is skipped, unless the sandbox is required
(``MHA_COURSE_REQUIRE_SANDBOX=1``, as in CI).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest
from cli_helpers import run_cli_split as run_cli

from mha_course.grading.authoring.generate import generate
from mha_course.grading.authoring.notebooks import info
from mha_course.grading.cli import main
from mha_course.grading.running import check as check_module
from mha_course.grading.running import limits as lim
from mha_course.grading.running import sandbox
from mha_course.grading.running.limits import KernelCgroups, Limits, find_enforcement

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "solutions"
TEST_LIMITS = Limits(memory=1024**3, processes=48, disk=64 * 1024**2)
LIMIT_FLAGS = ("--memory", "1G", "--processes", "48", "--disk", "64M", "--timeout", "5")

RIGHT = {"98.1": "def double(x):\n    return x * 2", "98.2": "answer = 6 * 7"}
WRONG_98_1 = "def double(x):\n    return x + x + 1"
HOG = textwrap.dedent("""\
    def double(x):
        hoard = [bytearray(64 * 1024**2) for _ in range(64)]  # 4 GiB, 64 MiB at a time
        return 2 * x""")
BOMB = textwrap.dedent("""\
    import os, signal, time

    def double(x):
        while True:  # every copy forks again, until the process limit says no
            try:
                if os.fork() == 0:
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
            except OSError:
                time.sleep(0.01)""")
FILLER = textwrap.dedent("""\
    def double(x):
        block = b"x" * 1024**2
        with open("filler.bin", "wb") as f:  # 1 GiB into the working folder
            for _ in range(1024):
                f.write(block)
        return 2 * x""")


def rewriter_cell(victims, solution) -> str:
    """An own cell that makes each victim's 98.1 wrong on disk and empties the solution."""
    return textwrap.dedent(f"""\
        import json
        for path in {[str(v) for v in victims]!r}:
            try:
                nb = json.load(open(path))
                for c in nb["cells"]:
                    if c["metadata"].get("mha_course", {{}}).get("role") == "solution":
                        c["source"] = "def double(x):\\n    return 0\\nanswer = 0"
                json.dump(nb, open(path, "w"))
            except OSError as exc:
                print("rewrite failed:", exc)
        try:
            open({str(solution)!r}, "w").write("{{}}")
        except OSError as exc:
            print("rewrite failed:", exc)""")


def require_sandbox() -> None:
    bwrap, why = sandbox.choose_sandbox(True)
    if bwrap is None:
        if os.environ.get("MHA_COURSE_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"MHA_COURSE_REQUIRE_SANDBOX=1 but {why}", pytrace=False)
        pytest.skip(why)


def submission(exercises: Path, target: Path, answers: dict, own_cell: str | None = None):
    nb = nbformat.read(exercises / "98_fixture.ipynb", as_version=4)
    for cell in nb.cells:
        meta = info(cell)
        if meta.get("role") == "solution" and meta["exercise"] in answers:
            cell.source = answers[meta["exercise"]]
    if own_cell is not None:
        first = next(i for i, c in enumerate(nb.cells) if info(c).get("role") == "solution")
        nb.cells.insert(first, nbformat.v4.new_code_cell(own_cell))
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, target)
    return target




def reports_of(out: str) -> dict[str, str]:
    reports = {}
    for block in ("\n" + out).split("\n== ")[1:]:
        name, _, body = block.partition("\n")
        reports[name] = body.split("\nsubmission  ")[0]
    return reports


# ------------------------------------------------------------------------------ the pieces


def test_sizes_parse_and_print_and_a_bad_one_says_how_to_write_it():
    assert lim.parse_size("1.5G") == 1536 * 1024**2
    assert lim.parse_size("64m") == 64 * 1024**2
    with pytest.raises(ValueError, match="write it as 4G, 512M or a number of bytes"):
        lim.parse_size("lots")
    assert Limits().describe() == "memory 4 GiB, 256 processes, disk 1 GiB"
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(io.StringIO()) as err:
        main(["check", "x.ipynb", "--memory", "lots"])
    assert exit_.value.code == 2
    assert "argument --memory: 'lots' is not a size: write it as 4G" in err.getvalue()


def test_each_limit_has_its_own_words():
    words = {
        ("MemoryError", ""): "the memory limit of 1 GiB per kernel was reached (raise it with "
                             "--memory)",
        ("BlockingIOError", "[Errno 11] Resource temporarily unavailable"):
            "the process limit of 48 per kernel was reached (raise it with --processes)",
        ("RuntimeError", "can't start new thread"):
            "the process limit of 48 per kernel was reached (raise it with --processes)",
        ("OSError", "[Errno 28] No space left on device"):
            "the disk limit of 64 MiB per kernel was reached (raise it with --disk)",
        ("OSError", "[Errno 27] File too large"):
            "the disk limit of 64 MiB per kernel was reached (raise it with --disk)",
        # grading mode: the learner's error arrives inside the grader's check verdict
        ("CheckFailed", "Exercise 03.1: your function raised MemoryError: Unable to allocate "
                        "1.00 GiB for an array"):
            "the memory limit of 1 GiB per kernel was reached (raise it with --memory)",
        ("CheckFailed", "Exercise 03.4: your function raised OSError: [Errno 28] No space left "
                        "on device"):
            "the disk limit of 64 MiB per kernel was reached (raise it with --disk)",
    }
    for (ename, evalue), expected in words.items():
        assert lim.limit_message(TEST_LIMITS, ename, evalue) == expected
    assert lim.limit_message(Limits(None, None, None), "MemoryError", "") is None


def test_the_kernel_is_told_its_rlimits_and_sets_them_on_itself(tmp_path):
    assert lim.kernel_env(TEST_LIMITS, nproc=False) == f"as={1024**3},fsize={64 * 1024**2}"
    assert lim.kernel_env(TEST_LIMITS, nproc=True).endswith(",nproc=48")
    code = ("import resource; from mha_course.grading.running.limits import apply_rlimits; "
            "apply_rlimits('as=3000000000,fsize=1000'); "
            "print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit("
            "resource.RLIMIT_FSIZE))\nwith open('f', 'wb') as f:\n    f.write(b'x' * 2000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.stdout.startswith("(3000000000, 3000000000) (1000, 1000)")
    assert "[Errno 27] File too large" in out.stderr
    assert (tmp_path / "f").stat().st_size == 1000


def test_this_machine_says_what_enforces_each_limit():
    enforcement = find_enforcement(TEST_LIMITS, sandboxed=True)
    if os.geteuid() == 0:
        assert "pids" in enforcement.cgroups or enforcement.missing
        assert not enforcement.nproc_in_sandbox  # RLIMIT_NPROC does not apply to root
    else:
        assert enforcement.nproc_in_sandbox
    unsandboxed = find_enforcement(TEST_LIMITS, sandboxed=False)
    assert any("only the size of each file" in m for m in unsandboxed.missing)


def test_a_real_fork_bomb_stops_at_the_process_limit_of_its_cgroup(tmp_path):
    """What stops a fork bomb here, outside the checker: the launcher puts the bomb into a
    pids cgroup before it runs (as root RLIMIT_NPROC would not stop it)."""
    enforcement = find_enforcement(Limits(None, 24, None), sandboxed=False)
    if "pids" not in enforcement.cgroups:
        pytest.skip("no pids cgroup can be made here (not root, or no cgroup access)")
    cgroups = KernelCgroups(Limits(None, 24, None), enforcement)
    bomb = textwrap.dedent("""\
        import os, sys, time
        made = 0
        for _ in range(1000):
            try:
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                made += 1
            except OSError as exc:
                print(made, exc.errno, flush=True)
                break
        """)
    proc = subprocess.Popen(lim.launcher(cgroups.procs_files()) + [sys.executable, "-c", bomb],
                            stdout=subprocess.PIPE, text=True)
    try:
        made, errno_ = map(int, proc.stdout.readline().split())
        assert made == 23 and errno_ == 11  # 24 tasks: the bomb and 23 copies
        assert cgroups.hit() == ["processes"]
    finally:
        cgroups.remove()  # kills the copies still sleeping
        proc.stdout.close()
        proc.wait(timeout=60)
    assert not any(f.exists() for f in cgroups.unique())


# ------------------------------------------------------------------ a hostile class


@pytest.fixture(scope="module", params=["sandbox", "no-sandbox"])
def hostile_class(request, tmp_path_factory):
    """abe rewrites zoe's and bob's notebooks and the solution; hog, bomb and filler each hit
    a limit in 98.1; bob is honest and wrong in 98.1; zoe is honest and right."""
    boxed = request.param == "sandbox"
    if boxed:
        require_sandbox()
    enforcement = find_enforcement(TEST_LIMITS, sandboxed=boxed)
    bomb_stoppable = "pids" in enforcement.cgroups or enforcement.nproc_in_sandbox
    if not bomb_stoppable and (not boxed or os.environ.get("MHA_COURSE_REQUIRE_SANDBOX") != "1"):
        pytest.skip("this machine cannot stop a fork bomb " + ("in" if boxed else "outside")
                    + " the sandbox: " + "; ".join(enforcement.missing))
    assert bomb_stoppable, enforcement.missing
    tmp = tmp_path_factory.mktemp(request.param)
    solutions = tmp / "solutions"
    shutil.copytree(FIXTURES, solutions)
    exercises = tmp / "exercises"
    generate(solutions, exercises)
    subs = tmp / "submissions"
    zoe = submission(exercises, subs / "zoe.ipynb", RIGHT)
    bob = submission(exercises, subs / "bob.ipynb", {**RIGHT, "98.1": WRONG_98_1})
    solution = solutions / "98_fixture.ipynb"
    submission(exercises, subs / "abe.ipynb", RIGHT, rewriter_cell([zoe, bob], solution))
    submission(exercises, subs / "hog.ipynb", {**RIGHT, "98.1": HOG})
    submission(exercises, subs / "bomb.ipynb", {**RIGHT, "98.1": BOMB})
    submission(exercises, subs / "filler.ipynb", {**RIGHT, "98.1": FILLER})
    before = {p: p.read_bytes() for p in [*subs.iterdir(), *solutions.iterdir()]}
    args = ["check", subs, "--jobs", 2, "--solutions", solutions, "--csv", tmp / "results.csv",
            *LIMIT_FLAGS] + ([] if boxed else ["--no-sandbox"])
    with pytest.MonkeyPatch.context() as patch:  # without the sandbox the checker restores
        # the package files a run changed: let it guard a copy, not the checkout being edited
        shutil.copytree(ROOT / "mha_course", tmp / "package" / "mha_course",
                        ignore=shutil.ignore_patterns("__pycache__"))
        patch.setattr(check_module, "PACKAGE_DIR", tmp / "package" / "mha_course")
        patch.setenv("MHA_COURSE_KERNEL_USER", "same")  # as a laptop: abe's writes succeed
        code, out, err = run_cli(*args, cwd=tmp)
    after = {p: p.read_bytes() if p.exists() else None for p in before}
    return {"boxed": boxed, "code": code, "out": out, "err": err, "reports": reports_of(out),
            "before": before, "after": after, "subs": subs, "solution": solution,
            "zoe": zoe, "bob": bob}


def test_each_hostile_submission_loses_only_the_exercise_that_hit_a_limit(hostile_class):
    reports = hostile_class["reports"]
    assert "Exercise 98.1  FAILED: MemoryError" in reports["hog"], reports["hog"]
    assert "the memory limit of 1 GiB per kernel was reached (raise it with --memory)" in \
        reports["hog"]
    assert "Exercise 98.1  TIMED OUT after 5 s" in reports["bomb"], reports["bomb"]
    assert "the process limit of 48 per kernel was reached (raise it with --processes)" in \
        reports["bomb"]
    assert "Exercise 98.1  FAILED: OSError" in reports["filler"], reports["filler"]
    assert "the disk limit of 64 MiB per kernel was reached (raise it with --disk)" in \
        reports["filler"]
    for name in ("hog", "bomb", "filler", "abe"):
        assert "Exercise 98.2  passed" in reports[name], reports[name]
    assert "Exercise 98.1  passed" in reports["abe"]


def test_honest_classmates_get_their_own_verdicts(hostile_class):
    reports = hostile_class["reports"]
    assert "Exercise 98.1  passed" in reports["zoe"] and "2 of 2 passed." in reports["zoe"]
    assert "Exercise 98.1  FAILED: double(3) returned 7, not 6." in reports["bob"]
    assert "Exercise 98.2  passed" in reports["bob"]


def test_every_file_is_byte_identical_afterwards(hostile_class):
    run = hostile_class
    changed = [p for p, data in run["before"].items() if run["after"][p] != data]
    assert changed == [], changed
    kept = sorted(p.name for p in run["subs"].iterdir() if "changed-during-check" in p.name)
    assert kept == []  # nothing is ever written into the submissions folder
    aside = run["subs"].parent / "results.changed-during-check"  # beside the CSV, named after it
    if run["boxed"]:  # nothing could write them: nothing to restore
        assert not aside.exists() and "warning: these files changed" not in run["err"]
        assert "rewrite failed" not in run["out"]  # own cells' prints are not shown
    else:  # written, then restored; the changed bytes kept with the results; who is named
        assert sorted(p.name for p in aside.iterdir()) == ["bob.ipynb", "zoe.ipynb"]
        assert 'return 0' in (aside / "zoe.ipynb").read_text()
        warning = run["err"][run["err"].index("warning: these files changed"):]
        for path in (run["zoe"], run["bob"], run["solution"]):
            line = next(ln for ln in warning.splitlines() if ln.startswith(f"  {path}: "))
            kept_in = (r"\S+\.changed-during-check beside it" if path == run["solution"] else
                       rf"{re.escape(str(aside / path.name))} \(nothing is written into the "
                       r"submissions folder\)")
            assert re.match(r"  \S+: changed while (\S+, )*\S+/abe\.ipynb(, \S+)* (was|were) "
                            r"being checked; restored as it was before the check, the changed "
                            rf"bytes kept in {kept_in}$", line), line
        assert (run["solution"].parent / "98_fixture.ipynb.changed-during-check").read_text() \
            == "{}"
