"""Fixtures for the browser tests: a private JupyterLab server and Debian's Chromium.

The server runs on 127.0.0.1, on a free port, with a random token, and keeps its config,
runtime, data, settings and workspaces in a pytest temporary folder. It serves an unchanged copy
of the lessons (so nothing in the checkout changes, and a cell that lacks its tag fails as it
would for a learner). Teardown stops it and its kernels even when a test fails. Every page may
only talk to 127.0.0.1: other requests are blocked and recorded, and the tests fail on them.

Without Chromium or playwright the tests skip, saying how to enable them; with
``MHA_COURSE_REQUIRE_BROWSER=1`` (CI) they fail instead.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mha_course.grading.running.run import descendants  # the kernel-process walker of the checker

from .labdriver import (
    LESSONS_DIR,
    cell_report,
    close_notebook,
    notebooks,
    open_lab,
    open_notebook,
    run_all,
    screenshot_notebook,
    shutdown_kernel,
    wait_for_kernel,
    wait_for_widgets,
)

CHROMIUM = Path(os.environ.get("MHA_COURSE_CHROMIUM", "/usr/bin/chromium"))
# Without the background-networking flags Chromium keeps calling home on a closed network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER_START_TIMEOUT = 60  # seconds


def _missing_browser() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright, or pip install -e '.[test]')"
    if not CHROMIUM.is_file():
        return f"Chromium not found at {CHROMIUM} (sudo apt-get install chromium)"
    return None


def require(condition: bool, reason: str) -> None:
    """Skip (learner's machine) or fail (CI: MHA_COURSE_REQUIRE_BROWSER=1) unless ``condition``."""
    if condition:
        return
    if os.environ.get("MHA_COURSE_REQUIRE_BROWSER") == "1":
        pytest.fail(f"MHA_COURSE_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def require_browser() -> None:
    """Skip (learner's machine) or fail (CI: MHA_COURSE_REQUIRE_BROWSER=1) without a browser."""
    reason = _missing_browser()
    require(reason is None, f"browser tests need Chromium and playwright: {reason}")


# --- the JupyterLab server ---------------------------------------------------------------------


@dataclass
class LabServer:
    url: str  # http://127.0.0.1:PORT/
    token: str
    root: Path  # the served copy of the course
    log: Path  # the server's stdout and stderr

    def lab_url(self, path: str) -> str:
        return f"{self.url}{path}?token={self.token}"

    def api(self, path: str, method: str = "GET", timeout: float = 5.0):
        """Call the REST API with the token; return the decoded JSON (or None)."""
        req = urllib.request.Request(
            f"{self.url}api/{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body else None


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a server a test starts)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy_lessons(dest: Path) -> None:
    """Copy the lessons (and the app's notebook) byte for byte: the test runs what a learner
    opens."""
    dest.mkdir(parents=True)
    for src in notebooks():
        shutil.copyfile(src, dest / src.name)
    # the deep dives too (the lessons link them; a widget test opens the one that holds its widget)
    dives = sorted((LESSONS_DIR / "deep_dives").glob("*.ipynb"))
    if dives:
        (dest / "deep_dives").mkdir()
        for src in dives:
            shutil.copyfile(src, dest / "deep_dives" / src.name)


def _write_user_settings(settings_dir: Path) -> None:
    """Temp user settings: no news or update check (a toast would cover the page), and no
    autosave: the tests run and close notebooks without saving them, and an autosave still in
    flight when a panel is closed fails with a "File Save Error: Disposed" dialog that covers the
    page for the tests after it (seen once on a loaded machine)."""
    settings = {
        "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
        "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
            "fetchNews": "false",
            "checkForUpdates": False,
        },
        "@jupyterlab/extensionmanager-extension/plugin.jupyterlab-settings": {"enabled": False},
    }
    for rel, value in settings.items():
        path = settings_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_server(proc: subprocess.Popen, server: LabServer | None) -> None:
    """Shut the server and its kernels down politely, then by signal."""
    kids = descendants(proc.pid)
    if server is not None and proc.poll() is None:
        try:  # shuts down every kernel, then the server
            server.api("shutdown", method="POST")
        except (OSError, urllib.error.URLError):
            pass
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    deadline = time.monotonic() + 5
    for pid in kids:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not _alive(pid):
                break
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory) -> LabServer:
    require_browser()  # no server when the tests will skip anyway
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "course"
    _copy_lessons(root / "notebooks")
    dirs = {
        name: base / name.lower()
        for name in (
            "JUPYTER_CONFIG_DIR",
            "JUPYTER_DATA_DIR",
            "JUPYTER_RUNTIME_DIR",
            "JUPYTERLAB_SETTINGS_DIR",
            "JUPYTERLAB_WORKSPACES_DIR",
        )
    }
    for d in dirs.values():
        d.mkdir()
    _write_user_settings(dirs["JUPYTERLAB_SETTINGS_DIR"])

    port, token = free_port(), secrets.token_hex(24)
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        # window.jupyterapp, so the test can run commands and read the notebook model
        "--LabApp.expose_app_in_browser=True",
        # no announcements feed and no update check: the server must not call out either
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
    ]  # fmt: skip
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {**os.environ, **{k: str(v) for k, v in dirs.items()}}
    # The python3 kernelspec says "python": make sure it is this environment's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("JUPYTER_PATH", None)
    log = base / "jupyter-server.log"
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=log_file, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    server = None
    try:
        candidate = LabServer(f"http://127.0.0.1:{port}/", token, root, log)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{log.read_text()}")
            try:
                candidate.api("status", timeout=2)
                break
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer in time:\n{log.read_text()}")
                time.sleep(0.25)
        server = candidate
        print(f"\nJupyterLab {server.url} serving {root}; log: {log}")
        yield server
    finally:
        _stop_server(proc, server)


# --- the browser -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def browser():
    require_browser()
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    try:
        chromium = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()
    finally:
        pw.stop()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so fixtures can tell a failed test."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@dataclass
class Tab:
    """A browser tab in its own context, with what it logged and what it was refused."""

    context: object
    page: object
    console: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.context.close()


def new_tab(browser) -> Tab:
    """A fresh tab that may only talk to 127.0.0.1, logging its console."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(30_000)
    tab = Tab(context, None)

    def only_localhost(route):
        url = urllib.parse.urlsplit(route.request.url)
        if url.scheme in ("data", "blob") or url.hostname == "127.0.0.1":
            route.continue_()
        else:
            tab.blocked.append(route.request.url)
            route.abort()

    context.route("**/*", only_localhost)
    tab.page = context.new_page()
    tab.page.on("console", lambda msg: tab.console.append(f"[{msg.type}] {msg.text}"))
    tab.page.on("pageerror", lambda exc: tab.console.append(f"[pageerror] {exc}"))
    return tab


@dataclass
class LessonRun:
    """A lesson opened in JupyterLab and run with Run All; its panel and kernel stay open."""

    name: str
    path: str  # relative to the server root
    tab: Tab
    cells: list[dict]  # labdriver.cell_report right after the run
    screenshots: list[Path]
    seconds: dict[str, float]  # time spent opening, waiting for the kernel, running, shooting
    blocked: list[str]  # requests away from 127.0.0.1 while the lesson opened and ran


@pytest.fixture(scope="session")
def lab_tab(browser, lab_server):
    """One tab with JupyterLab loaded (loading it takes seconds); lessons open in it in turn."""
    tab = new_tab(browser)
    try:
        open_lab(tab.page, lab_server)
        yield tab
    finally:
        tab.close()


@pytest.fixture(scope="session")
def _lesson_runs(lab_tab, lab_server):
    """Each lesson runs once per session; the explorer test reuses lesson 04's run."""
    page = lab_tab.page
    runs: dict[str, LessonRun] = {}
    broken: list[str] = []  # paths of failed runs, left open for the failure screenshot

    def run(name: str, folder: Path) -> LessonRun:
        if name in runs:
            return runs[name]
        path = f"notebooks/{name}"
        seconds, clock = {}, time.monotonic()

        def lap(what: str) -> None:
            nonlocal clock
            seconds[what], clock = round(time.monotonic() - clock, 1), time.monotonic()

        first_blocked = len(lab_tab.blocked)
        try:
            open_notebook(page, path)
            lap("open")
            kernel = wait_for_kernel(page, lab_server, path)
            assert kernel == "python3", f"{name} runs on kernel {kernel!r}, not python3"
            lap("kernel")
            run_all(page, path)
            wait_for_widgets(page, path)
            cells = cell_report(page, path)
            lap("run all")
            stem = folder / name.removesuffix(".ipynb")  # a deep dive's: deep_dives/NNx_...
            stem.parent.mkdir(parents=True, exist_ok=True)
            shots = screenshot_notebook(page, path, stem)
            lap("screenshots")
        except BaseException:
            broken.append(path)
            raise
        runs[name] = LessonRun(name, path, lab_tab, cells, shots, seconds,
                               lab_tab.blocked[first_blocked:])
        return runs[name]

    def release(name: str) -> None:
        """Close the lesson and stop its kernel (the two cores are shared)."""
        lesson = runs.pop(name, None)
        if lesson is not None:
            close_notebook(page, lesson.path)
            shutdown_kernel(lab_server, lesson.path)

    run.release = release
    yield run
    for name in list(runs):
        release(name)
    for path in broken:
        shutdown_kernel(lab_server, path)


@pytest.fixture
def run_lesson(_lesson_runs, lab_tab, lab_server, request, tmp_path):
    """``run_lesson(name) -> LessonRun``; on failure saves the console log and a screenshot."""
    first_line = len(lab_tab.console)

    def run(name: str) -> LessonRun:
        return _lesson_runs(name, tmp_path)

    run.release = _lesson_runs.release
    yield run
    failed = any(
        getattr(request.node, f"rep_{when}", None) is not None
        and getattr(request.node, f"rep_{when}").failed
        for when in ("setup", "call")
    )
    if not failed:
        return
    log = tmp_path / "browser-console.log"
    lines = lab_tab.console[first_line:] + [f"[blocked request] {u}" for u in lab_tab.blocked]
    log.write_text("\n".join(lines) + "\n")
    print(f"browser console log (this test): {log}\n{log.read_text()}")
    if not lab_tab.page.is_closed():
        shot = tmp_path / "failure.png"
        lab_tab.page.screenshot(path=shot)
        print(f"screenshot at failure: {shot}")
    print(f"server log: {lab_server.log}")
