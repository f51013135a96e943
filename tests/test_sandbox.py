"""Isolation: one submission cannot change another's verdict or file, the solutions or the checkout.

The first tests check the pieces in milliseconds (the bwrap command line, the snapshot of the
package, stopping a run's processes). Then two classes of submissions are checked end to end:

- with the sandbox (bubblewrap), a hostile submission tries each attack of issue 10: append a
  fake check to the package's checks, rewrite the solutions, rewrite a classmate's notebook,
  forge report records from a background thread, open a network connection, write into the
  course checkout. Each fails, and its classmate's verdicts are what they would be alone.
  Without bwrap these tests are skipped, unless ``MHA_COURSE_REQUIRE_SANDBOX=1`` (CI sets it).
- without the sandbox (``--no-sandbox``), the same writes to temporary copies succeed on disk,
  but no verdict changes (every run uses the snapshots taken when the command started) and the
  command warns which files changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
from cli_helpers import run_cli_split as run_cli

from mha_course.grading.running import check as check_module
from mha_course.grading.running import sandbox
from mha_course.grading.running.check import Checker
from mha_course.grading.running.run import RUN_MARK, stop_run
from mha_course.grading.running.sandbox import Library, RunFolders, bwrap_command, kernel_spec

ROOT = Path(__file__).resolve().parent.parent
EXERCISE_03 = ROOT / "exercises" / "03_single_head_attention.ipynb"
#: Lesson 03's exercises: a classmate who left every stub gets one "not attempted" line each,
#: and one more in the summary ("0 of N passed; N not attempted.").
N_EXERCISES_03 = len({c.metadata["mha_course"]["exercise"]
                      for c in nbformat.read(EXERCISE_03, as_version=4).cells
                      if c.metadata.get("mha_course", {}).get("role") == "solution"})
PASS_33 = ("Exercise 03.3 passed: (T, T) bool masks for T = 1, 4, 7 match "
           "mha_course.causal_mask")
FAKE_CHECK = f"\ndef check_causal_mask(fn):\n    print({PASS_33!r})\n"


def require_sandbox() -> str:
    bwrap, why = sandbox.choose_sandbox(True)
    if bwrap is None:
        if os.environ.get("MHA_COURSE_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"MHA_COURSE_REQUIRE_SANDBOX=1 but {why}", pytrace=False)
        pytest.skip(f"needs the sandbox, and {why} (set MHA_COURSE_REQUIRE_SANDBOX=1 to make "
                    "this a failure, as CI does)")
    return bwrap




# ------------------------------------------------------------------------------ the pieces


def test_the_bwrap_command_hides_what_it_must_and_binds_only_the_runs_folders(tmp_path):
    folders = RunFolders(tmp_path / "run").make()
    in_tmp = tmp_path / "course"
    in_tmp.mkdir()
    solutions = (ROOT / "solutions").resolve()
    args = bwrap_command("/usr/bin/bwrap", folders, hidden=[solutions, in_tmp, Path("/")])
    text = " ".join(args)
    for flag in ("--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session",
                 "--ro-bind / /", "--tmpfs /tmp", "--unsetenv JPY_PARENT_PID"):
        assert flag in text, flag
    if not str(solutions).startswith("/tmp/"):
        assert f"--tmpfs {solutions}" in text and f"--remount-ro {solutions}" in text
    assert f"--tmpfs {in_tmp}" not in text  # inside /tmp: already hidden by the private /tmp
    assert "--remount-ro /tmp " not in text  # the private /tmp stays the kernel's to write
    lib, kernel = folders.lib.resolve(), folders.kernel.resolve()
    assert f"--ro-bind {lib} {lib}" in text and f"--bind {kernel} {kernel}" in text
    assert str(folders.work.resolve()) not in text  # it works in its private /tmp instead
    assert "--tmpfs / " not in text + " "  # "/" itself is never hidden
    assert args[args.index("--chdir") + 1] == "/tmp/work" and args[-1] == "--"
    assert "--dir /tmp/work" in text and "--unshare-cgroup-try" in text
    sized = bwrap_command("/usr/bin/bwrap", folders, disk=12345)
    assert sized[sized.index("--size") + 1:sized.index("--size") + 4] == [
        "12345", "--tmpfs", "/tmp"]  # the disk limit bounds /tmp, the home and working folder
    if os.geteuid() == 0:
        assert "--cap-drop ALL" in text  # root without capabilities cannot remount rw


def test_the_python_installation_is_bound_back_when_a_hidden_folder_holds_it(tmp_path):
    folders = RunFolders(tmp_path / "run").make()
    prefix = Path(sys.prefix).resolve()
    args = bwrap_command("/usr/bin/bwrap", folders, hidden=[prefix.parent])
    text = " ".join(args)
    if not str(prefix.parent).startswith("/tmp"):
        assert f"--tmpfs {prefix.parent}" in text
    assert f"--ro-bind {prefix} {prefix}" in text


def test_the_kernel_spec_talks_ipc_and_is_interrupted_by_message_only_in_the_sandbox(tmp_path):
    folders = RunFolders(tmp_path).make()
    plain = kernel_spec(folders, None)
    assert plain["argv"][1:4] == ["-m", "mha_course.grading.running.kernel", "-f"]
    assert (plain["transport"], plain["interrupt_mode"]) == ("tcp", "signal")
    boxed = kernel_spec(folders, "/usr/bin/bwrap")
    assert boxed["argv"][0] == "/usr/bin/bwrap"
    assert boxed["argv"][-3] == "mha_course.grading.running.kernel"
    assert (boxed["transport"], boxed["interrupt_mode"]) == ("ipc", "message")
    assert boxed["cwd"] == str(folders.work.resolve())


def test_the_library_snapshot_writes_sources_and_compiled_files_and_sees_changes(tmp_path):
    package = tmp_path / "src" / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    (package / "data.cfg").write_text("x")
    library = Library.snapshot(package)
    assert sorted(library.files) == ["pkg/__init__.py", f"pkg/__pycache__/__init__."
                                     f"{sys.implementation.cache_tag}.pyc", "pkg/data.cfg"]
    library.write(tmp_path / "lib")
    out = subprocess.run([sys.executable, "-c", "import pkg; print(pkg.VALUE)"],
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "lib")},
                         capture_output=True, text=True, check=True)
    assert out.stdout == "1\n"
    assert library.changed(package) == []
    (package / "__init__.py").write_text("VALUE = 2\n")
    assert library.changed(package) == [str(package / "__init__.py")]


def test_the_checker_hides_the_checkout_solutions_home_and_submissions(tmp_path):
    solutions = ROOT / "tests" / "data" / "solutions"
    checker = Checker.create(solutions, hidden=[tmp_path])
    hidden = set(checker.isolation.hidden)
    assert {ROOT, solutions, Path.home(), tmp_path} <= hidden | {Path.cwd()}
    assert checker.isolation.library.files["mha_course/checks/harness.py"] == (
        ROOT / "mha_course" / "checks" / "harness.py").read_bytes()


def test_the_guard_restores_changed_and_deleted_files_and_keeps_what_it_found(tmp_path):
    nb = nbformat.writes(nbformat.v4.new_notebook()).encode()
    files = {name: tmp_path / name for name in ("ada.ipynb", "bob.ipynb", "mine.ipynb",
                                                "gone.ipynb", "checks.py")}
    for name, path in files.items():
        path.write_bytes(b"x = 1\n" if name.endswith(".py") else nb)
    os.utime(files["ada.ipynb"], ns=(10**18, 10**18))
    guard = sandbox.FileGuard(restore=True)
    for name, path in files.items():
        guard.add(path, own=name in ("mine.ipynb", "gone.ipynb"))
    assert guard.verify(("zed.ipynb",)) == []
    files["ada.ipynb"].write_text("{}")  # a classmate's notebook emptied by a submission
    files["checks.py"].write_text("x = 2\n")  # the grader's file
    files["mine.ipynb"].write_bytes(nb.replace(b'"cells": []', b'"cells": [] '))  # a save
    files["gone.ipynb"].unlink()  # a learner's own notebook deleted by their code
    (tmp_path / "bob.ipynb.changed-during-check").write_text("an older one")
    files["bob.ipynb"].write_text("not json")
    changes = {c.path.name: c for c in guard.verify(("zed.ipynb", "amy.ipynb"))}
    assert sorted(changes) == ["ada.ipynb", "bob.ipynb", "checks.py", "gone.ipynb", "mine.ipynb"]
    for name in ("ada.ipynb", "bob.ipynb", "gone.ipynb"):
        assert files[name].read_bytes() == nb and changes[name].restored
    assert files["checks.py"].read_text() == "x = 1\n"
    assert files["ada.ipynb"].stat().st_mtime_ns == 10**18  # its time stamp too
    assert (tmp_path / "ada.ipynb.changed-during-check").read_text() == "{}"
    assert (tmp_path / "bob.ipynb.changed-during-check").read_text() == "an older one"
    assert (tmp_path / "bob.ipynb.changed-during-check-2").read_text() == "not json"
    assert changes["gone.ipynb"].kept is None
    assert not changes["mine.ipynb"].restored and files["mine.ipynb"].read_bytes() != nb
    assert changes["ada.ipynb"].describe() == (
        f"{files['ada.ipynb']}: changed while amy.ipynb, zed.ipynb were being checked; restored "
        "as it was before the check, the changed bytes kept in ada.ipynb.changed-during-check "
        "beside it")
    assert changes["mine.ipynb"].describe().endswith("; left as it is now")
    assert guard.verify(()) == []  # each change is reported once
    boxed = sandbox.FileGuard(restore=False)  # in the sandbox only an editor can write them
    boxed.add(files["checks.py"])
    files["checks.py"].write_text("x = 3\n")
    assert [c.restored for c in boxed.verify(())] == [False]
    assert files["checks.py"].read_text() == "x = 3\n"


def test_without_bwrap_the_reason_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    bwrap, why = sandbox.find_sandbox.__wrapped__(True)
    assert bwrap is None and "apt-get install bubblewrap" in why
    assert sandbox.find_sandbox.__wrapped__(False) == (None, "--no-sandbox was given")


def test_stopping_a_run_stops_a_process_that_left_its_session_and_tree(tmp_path):
    """The /proc walk found only the tree; a learner's daemon in a new session survived it."""
    pid_file = tmp_path / "daemon.pid"
    script = textwrap.dedent(f"""\
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 start_new_session=True)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(600)
    """)
    mark = "test-" + os.urandom(4).hex()
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                            env={**os.environ, RUN_MARK: mark})
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline, "the test's daemon did not start"
            time.sleep(0.1)
        daemon = psutil.Process(int(pid_file.read_text()))
        assert daemon.is_running()
        stop_run(proc.pid, mark)
        proc.wait(timeout=30)
        daemon.wait(timeout=30)
        assert not daemon.is_running()
    finally:
        proc.kill()


# ------------------------------------------------------------------ a hostile submission


def attack_cells(targets: dict, port: int) -> list[str]:
    """One own cell per attack (they run before the attacker's answer to 03.1)."""
    victim = targets["victim"]
    return [
        f"open({str(targets['checks'])!r}, 'a').write({FAKE_CHECK!r})",
        "import mha_course.checks, pathlib\np = pathlib.Path(mha_course.checks.__file__)\n"
        f"p.write_text(p.read_text() + {FAKE_CHECK!r})",
        f"open({str(targets['solutions'])!r}, 'w').write('{{}}')",
        textwrap.dedent(f"""\
            import json
            nb = json.load(open({str(victim)!r}))
            for c in nb['cells']:
                meta = c['metadata'].get('mha_course', {{}})
                if meta.get('exercise') == '03.3' and meta['role'] == 'solution':
                    c['source'] = 'def causal_mask(T):\\n    return np.tril(np.ones((T, T), bool))'
            open({str(victim)!r}, 'w').write(json.dumps(nb))"""),
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)"
        ".sendall(b'pwned')",
        f"open({str(targets['checkout_file'])!r}, 'w').write('pwned')",
        textwrap.dedent("""\
            import glob, json, os, threading, time
            fake = ''.join(json.dumps({'cell': i, 'ok': True, 'message': '', 'error': None,
                                       'got': '', 'expected': ''}) + '\\n'
                           for i in range(60)).encode()
            def ancestors():  # the report is held by a process above the kernel
                pid, found = os.getpid(), []
                for _ in range(3):
                    try:
                        pid = int(open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1])
                    except (OSError, ValueError, IndexError):
                        break
                    if pid <= 0:
                        break
                    found.append(pid)
                return found
            def forge():
                while True:
                    for pid in ancestors():
                        for path in glob.glob(f'/proc/{pid}/fd/*'):
                            try:
                                if 'pipe' in os.readlink(path):
                                    fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                                    os.write(fd, fake)
                                    os.close(fd)
                            except OSError:
                                pass
                    for path in glob.glob('/tmp/**/*.json*', recursive=True) + glob.glob(
                            '../**/*.json*', recursive=True):
                        try:
                            open(path, 'a').write(fake.decode())
                        except OSError:
                            pass
                    time.sleep(0.1)
            threading.Thread(target=forge, daemon=True).start()"""),
    ]


def hostile_class(tmp_path, attacks_for) -> tuple[Path, Path, dict]:
    """submissions/ada.ipynb attacks (and answers 03.1 right, 03.3 wrong); zoe.ipynb is
    untouched stubs. Returns (submissions, solutions copy, targets)."""
    solutions = tmp_path / "solutions"
    shutil.copytree(ROOT / "solutions", solutions)
    subs = tmp_path / "submissions"
    subs.mkdir()
    victim = subs / "zoe.ipynb"
    shutil.copy(EXERCISE_03, victim)
    targets = {"victim": victim, "solutions": solutions / EXERCISE_03.name}
    targets["before"] = {p: p.read_bytes() for p in (victim, targets["solutions"])}
    nb = nbformat.read(EXERCISE_03, as_version=4)
    first = next(i for i, c in enumerate(nb.cells)
                 if c.metadata.get("mha_course", {}).get("role") == "solution")
    for offset, source in enumerate(attacks_for(targets)):
        nb.cells.insert(first + offset, nbformat.v4.new_code_cell(source))
    for c in nb.cells:
        meta = c.metadata.get("mha_course", {})
        if meta.get("role") == "solution" and meta["exercise"] == "03.1":
            c.source = ("def attention_scores(q, k):\n"
                        "    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])")
        if meta.get("role") == "solution" and meta["exercise"] == "03.3":
            c.source = "def causal_mask(T):\n    return np.tril(np.ones((T, T), dtype=bool), k=-1)"
    nbformat.write(nb, subs / "ada.ipynb")
    return subs, solutions, targets


@pytest.fixture(scope="module")
def sandboxed_attack(tmp_path_factory):
    require_sandbox()
    tmp = tmp_path_factory.mktemp("hostile")
    checks_file = ROOT / "mha_course" / "checks" / "__init__.py"
    checkout_file = ROOT / "pwned-by-a-submission.txt"
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    port = server.getsockname()[1]

    def attacks(targets):
        targets.update(checks=checks_file, checkout_file=checkout_file)
        return attack_cells(targets, port)

    subs, solutions, targets = hostile_class(tmp, attacks)
    before = {p: p.read_bytes() for p in (checks_file, targets["victim"], targets["solutions"])}
    try:
        code, out, err = run_cli("check", subs, "--jobs", 1, "--solutions", solutions,
                                 "--csv", tmp / "results.csv", cwd=tmp)
    finally:  # whatever happened, leave the checkout as it was
        changed = {p for p, data in before.items() if p.read_bytes() != data}
        checks_file.write_bytes(before[checks_file])
        wrote_checkout = checkout_file.exists()
        checkout_file.unlink(missing_ok=True)
        try:
            server.accept()
            connected = True
        except BlockingIOError:
            connected = False
        server.close()
    return {"code": code, "out": out, "err": err, "changed": changed, "connected": connected,
            "wrote_checkout": wrote_checkout}


def ada_and_zoe(out: str) -> tuple[str, str]:
    ada = out[out.index("== ada"):out.index("== zoe")]
    zoe = out[out.index("== zoe"):out.index("submission  ")]
    return ada, zoe


def test_the_sandbox_stops_every_attack_and_the_classmates_verdicts_stand(sandboxed_attack):
    run = sandboxed_attack
    assert run["changed"] == set(), "a submission changed files on disk"
    assert not run["wrote_checkout"] and not run["connected"]
    ada, zoe = ada_and_zoe(run["out"])
    # the classmate: stubs everywhere, so every exercise is "not attempted"
    assert zoe.count("not attempted") == N_EXERCISES_03 + 1, zoe  # each, and the summary
    # the attacker: forged records, a fake check on disk and in its own copy changed nothing
    assert "Exercise 03.1  passed" in ada
    assert "Exercise 03.3  FAILED: your mask for T=4" in ada
    assert "warning: these files changed" not in run["err"]
    assert "WITHOUT a sandbox" not in run["err"]


@pytest.mark.parametrize(("needle", "error"), [
    (f"'{ROOT}/mha_course/checks/__init__.py'", "FileNotFoundError"),  # the checkout is hidden
    ("pwned-by-a-submission.txt", "Read-only file system"),  # and read-only
    ("lib/mha_course/checks/__init__.py", "Read-only file system"),  # the run's own copy
    (f"solutions/{EXERCISE_03.name}", "FileNotFoundError"),  # the solutions are hidden
    ("zoe.ipynb", "FileNotFoundError"),  # so is the classmate's notebook
    ("import socket", "Connection refused"),  # no network
], ids=["checkout-checks", "checkout-file", "own-package-copy", "solutions", "classmate",
        "network"])
def test_each_attack_fails_inside_the_sandbox_with_a_note(sandboxed_attack, needle, error):
    ada, _ = ada_and_zoe(sandboxed_attack["out"])
    notes = [line for line in ada.split("\n") if "note:" in line and needle in line]
    if needle == "pwned-by-a-submission.txt" and ROOT.is_relative_to(tempfile.gettempdir()):
        # A checkout under /tmp lies under the sandbox's own empty /tmp: the write lands there,
        # or finds no folder, and never on disk (test_the_sandbox_stops_every_attack_... checks
        # that nothing was written).
        assert all("Read-only" in line or "FileNotFoundError" in line for line in notes), ada
        return
    assert notes and all(error in line for line in notes), ada


@contextlib.contextmanager
def package_copy(folder: Path):
    """The checker runs (and guards) a copy of the package in ``folder``, not the checkout's:
    without the sandbox the checker restores a package file that changed during a run, and an
    edit made to the checkout while the tests run must not be taken for a submission's."""
    shutil.copytree(ROOT / "mha_course", folder / "mha_course",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(check_module, "PACKAGE_DIR", folder / "mha_course")
        yield folder / "mha_course"


def test_without_the_sandbox_no_write_changes_a_verdict_and_the_command_says_so(tmp_path,
                                                                               monkeypatch):
    """Writes succeed on disk without bwrap, the kernel running as the checker's user (a
    laptop; as root see test_protection.py); the snapshots keep every verdict honest."""
    monkeypatch.setenv("MHA_COURSE_KERNEL_USER", "same")
    def attacks(targets):  # only temporary files here: nothing outside tmp_path is written
        cells = attack_cells({**targets, "checks": tmp_path / "unused", "checkout_file":
                              tmp_path / "unused"}, 1)
        return [cells[1], cells[2], cells[3]]  # own package copy, solutions, classmate

    subs, solutions, targets = hostile_class(tmp_path, attacks)
    with package_copy(tmp_path / "package"):
        code, out, err = run_cli("check", subs, "--jobs", 1, "--no-sandbox", "--solutions",
                                 solutions, "--csv", tmp_path / "results.csv", cwd=tmp_path)
    ada, zoe = ada_and_zoe(out)
    assert zoe.count("not attempted") == N_EXERCISES_03 + 1, zoe
    # its own copy of the package changed on disk, but the checks were loaded before its code
    # ran: its wrong answer still fails
    assert "Exercise 03.3  FAILED: your mask for T=4" in ada
    assert err.count("learners' code runs WITHOUT a sandbox: --no-sandbox was given") == 1
    assert "warning: these files changed on disk during the check" in err
    assert str(targets["solutions"]) in err and str(targets["victim"]) in err
    # both written files were put back after the attacker's run; what it wrote is kept beside
    for path in (targets["solutions"], targets["victim"]):
        assert f"{path}: changed while " in err and "restored as it was before the check" in err
        assert path.read_bytes() == targets["before"][path]
    kept = targets["solutions"].with_name(targets["solutions"].name + ".changed-during-check")
    assert json.loads(kept.read_text()) == {}
    assert code == 0  # a folder's run: every submission read and graded, whatever its score


# ------------------------------------------------------------------ stopping a command


HUNG = "def double(x):\n    while True:\n        pass"


def hung_notebook(tmp_path) -> Path:
    from mha_course.grading.authoring.generate import generate

    exercises = tmp_path / "exercises"
    generate(ROOT / "tests" / "data" / "solutions", exercises)
    nb = nbformat.read(exercises / "98_fixture.ipynb", as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("mha_course", {})
        if meta.get("role") == "solution" and meta["exercise"] == "98.1":
            cell.source = HUNG
    path = tmp_path / "hung.ipynb"
    nbformat.write(nb, path)
    return path


def tagged(tag: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MHA_COURSE_TEST_TAG") == tag and proc.status() != "zombie":
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def spins(proc: psutil.Process) -> bool:
    """Whether ``proc`` is the kernel (not bwrap or the launcher) and has spun for 1 s."""
    try:
        cmd = proc.cmdline()
        return (cmd[:3] == [sys.executable, "-m", "mha_course.grading.running.kernel"]
                and proc.cpu_times().user > 1.0)
    except (psutil.Error, OSError, IndexError):
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_a_run_with_a_hung_kernel_at_once_and_leaves_nothing(tmp_path, sig):
    """Ctrl-C took 22 s and printed a traceback; SIGTERM left pytest, bwrap and a kernel
    spinning, and temporary folders behind (issue 26)."""
    notebook = hung_notebook(tmp_path)
    tag, tmp = uuid.uuid4().hex, tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "MHA_COURSE_TEST_TAG": tag}
    proc = subprocess.Popen([sys.executable, "-m", "mha_course", "check", notebook,
                             "--solutions", ROOT / "tests" / "data" / "solutions",
                             "--timeout", "600"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:  # until the kernel spins in the learner's loop
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            if any(spins(p) for p in tagged(tag)):
                break
            time.sleep(0.2)
        assert len(tagged(tag)) >= 3  # the command, pytest and the kernel (and bwrap)
        start = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig
    lines = [ln for ln in err.splitlines() if not ln.startswith("note: ")]
    assert lines == [f"stopped by {signal.Signals(sig).name}: 1 run in progress stopped, their "
                     "processes killed and temporary folders removed"], err
    assert took < 2.0, f"stopping took {took:.2f} s"
    for _ in range(50):  # killed processes vanish once their parent or init reaps them
        if not tagged(tag):
            break
        time.sleep(0.1)
    assert tagged(tag) == []
    assert list(tmp.iterdir()) == []


# ------------------------------------------------------- a checkout and a Python under /tmp


@pytest.fixture
def checkout_in_tmp():
    """The course (package, solutions, test fixtures) copied under /tmp, with a virtual
    environment of its own there: a learner's ``git clone ... /tmp/x && cd /tmp/x && make``.
    The environment borrows this one's packages (a .pth file), so nothing is installed."""
    base = Path(tempfile.mkdtemp(prefix="mha-course-clone-", dir="/tmp"))
    try:
        clone = base / "x"
        for part in ("mha_course", "solutions", "exercises", "tests/data"):
            shutil.copytree(ROOT / part, clone / part,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy(ROOT / "tests" / "nbval_sanitize.cfg", clone / "tests")
        venv = clone / ".venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
        purelib = subprocess.run([venv / "bin" / "python", "-c",
                                  "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        ours = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
        Path(purelib, "borrowed.pth").write_text(
            "".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
        yield clone, venv / "bin" / "python"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_checkout_under_tmp_is_sandboxed_and_its_errors_are_one_line(checkout_in_tmp):
    """The probe hid the checkout's own .venv under the private /tmp, so a fresh clone in
    /tmp ran unsandboxed and the one-line error test failed there (issue 25)."""
    require_sandbox()
    clone, python = checkout_in_tmp
    broken = clone / "broken.ipynb"
    broken.write_text('{"cells": [')
    fixtures = clone / "tests" / "data" / "solutions"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run([python, "-c", "import sys, mha_course; print(sys.prefix, "
                            "mha_course.__file__)"], cwd=clone, capture_output=True, text=True,
                           env=env, check=True)
    assert probe.stdout.split() == [str(clone / ".venv"), str(clone / "mha_course" /
                                                                "__init__.py")]
    out = subprocess.run([python, "-m", "mha_course", "check", broken, "--solutions", fixtures],
                         cwd=clone, capture_output=True, text=True, env=env)
    assert out.returncode == 2
    assert out.stdout == "" and out.stderr.startswith(f"error: {broken}: not a notebook: the "
                                                      "file is not valid JSON")
    assert out.stderr.count("\n") == 1, out.stderr  # no "WITHOUT a sandbox" note either
    out = subprocess.run([python, "-m", "mha_course", "check", fixtures / "98_fixture.ipynb",
                          "--solutions", fixtures], cwd=clone, capture_output=True, text=True,
                         env=env)
    assert "WITHOUT a sandbox" not in out.stderr, out.stderr
    assert "2 of 2 passed." in out.stdout, out.stdout + out.stderr
