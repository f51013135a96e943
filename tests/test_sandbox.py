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
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from mha_course.grading import sandbox
from mha_course.grading.check import Checker
from mha_course.grading.cli import main
from mha_course.grading.run import RUN_MARK, stop_run
from mha_course.grading.sandbox import Library, RunFolders, bwrap_command, kernel_spec

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
    bwrap, why = sandbox.find_sandbox(True)
    if bwrap is None:
        if os.environ.get("MHA_COURSE_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"MHA_COURSE_REQUIRE_SANDBOX=1 but {why}", pytrace=False)
        pytest.skip(why)
    return bwrap


def run_cli(*args, cwd):
    out, err = io.StringIO(), io.StringIO()
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


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
    lib, work = folders.lib.resolve(), folders.work.resolve()
    assert f"--ro-bind {lib} {lib}" in text and f"--bind {work} {work}" in text
    assert "--tmpfs / " not in text + " "  # "/" itself is never hidden
    assert args[args.index("--chdir") + 1] == str(work) and args[-1] == "--"
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
    assert plain["argv"][1:4] == ["-m", "mha_course.grading.kernel", "-f"]
    assert (plain["transport"], plain["interrupt_mode"]) == ("tcp", "signal")
    boxed = kernel_spec(folders, "/usr/bin/bwrap")
    assert boxed["argv"][0] == "/usr/bin/bwrap" and boxed["argv"][-3] == "mha_course.grading.kernel"
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
    assert notes and all(error in line for line in notes), ada


def test_without_the_sandbox_no_write_changes_a_verdict_and_the_command_says_so(tmp_path):
    """Writes succeed on disk without bwrap; the snapshots keep every verdict honest."""
    def attacks(targets):  # only temporary files here: nothing outside tmp_path is written
        cells = attack_cells({**targets, "checks": tmp_path / "unused", "checkout_file":
                              tmp_path / "unused"}, 1)
        return [cells[1], cells[2], cells[3]]  # own package copy, solutions, classmate

    subs, solutions, targets = hostile_class(tmp_path, attacks)
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
    assert json.loads(targets["solutions"].read_text()) == {}
    assert code == 0  # a folder's run: every submission read and graded, whatever its score
