"""``make lab`` serves the course on 127.0.0.1 behind a token: the real command, started and
stopped by this test.

The test runs the Makefile's ``lab`` recipe with this interpreter's environment
(``VENV=sys.prefix``, and ``-o $(VENV)/.installed`` so make does not reinstall the course), on a
free port, with Jupyter's config, data and runtime folders in a temporary folder and
``BROWSER=true`` so no browser window opens. It reads the URL with the token from the server's
log, fetches ``/lab`` and the API with and without the token (the served folder is the learner's
``my-work/``, which the recipe fills first), checks that nothing answers on another loopback
address, and stops the process group it started, by its PID.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import free_port, require
from .labdriver import REPO, lessons

START_TIMEOUT = 90  # seconds; a busy two-core machine starts JupyterLab slowly


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # let the 302 surface as an HTTPError


def _fetch(url: str, token: str | None = None) -> tuple[int, str, str]:
    """(status, Location header, body) of a GET, without following redirects."""
    headers = {"Authorization": f"token {token}"} if token else {}
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status, resp.headers.get("Location", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Location", ""), ""


@pytest.fixture
def make_lab(tmp_path):
    """Start ``make lab``; yield (process, log path, port asked for); stop its process group."""
    venv = Path(sys.prefix)
    require(shutil.which("make") is not None, "make is not installed")
    require((venv / "bin" / "jupyter").is_file(), f"no jupyter in {venv}/bin")
    port = free_port()
    env = {**os.environ, "BROWSER": "true"}  # webbrowser would start a real one
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR",
                 "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        (tmp_path / name.lower()).mkdir()
        env[name] = str(tmp_path / name.lower())
    env.pop("JUPYTER_PATH", None)
    log = tmp_path / "make-lab.log"
    cmd = ["make", "--no-print-directory", "-o", f"{venv}/.installed", "lab", f"VENV={venv}",
           f"PORT={port}"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group, ours to stop
    try:
        yield proc, log, port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # make and the jupyter it started
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_make_lab_serves_the_course_with_token_auth_on_localhost(make_lab):
    proc, log, port = make_lab
    url_re = re.compile(r"(http://127\.0\.0\.1:(\d+))/lab\S*\?token=([0-9a-f]+)")
    deadline = time.monotonic() + START_TIMEOUT
    while not (found := url_re.search(log.read_text(errors="replace"))):
        assert proc.poll() is None, f"make lab exited with {proc.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no URL with a token in time:\n{log.read_text()}"
        time.sleep(0.25)
    base, served_port, token = found[1], int(found[2]), found[3]
    print(f"\nmake lab printed {found[0][:60]}... (asked for port {port})")
    assert len(token) >= 32

    # The URL can be logged a moment before a loaded machine's server accepts: retry a refused
    # connection while the server runs (a server that died or never listens still fails).
    deadline = time.monotonic() + 30
    while True:
        try:
            status, _, body = _fetch(f"{base}/lab?token={token}")
            break
        except urllib.error.URLError as err:
            refused = isinstance(err.reason, ConnectionRefusedError)
            assert refused and proc.poll() is None and time.monotonic() < deadline, \
                f"{err}; make lab's log:\n{log.read_text(errors='replace')}"
            time.sleep(0.5)
    assert status == 200 and "JupyterLab" in body, status
    status, location, _ = _fetch(f"{base}/lab")
    assert status == 302 and "/login" in location, (status, location)
    status, _, _ = _fetch(f"{base}/api/contents/notebooks")
    assert status == 403, status

    status, _, body = _fetch(f"{base}/api/contents/notebooks", token=token)
    assert status == 200, status
    served = sorted(re.findall(r'"name": ?"(\d\d_[^"]+\.ipynb)"', body))
    assert served == [p.name for p in lessons()], served
    # the learner's copies (my-work/), not the course's tracked files, are what JupyterLab opens
    status, _, body = _fetch(f"{base}/api/contents", token=token)
    top = set(re.findall(r'"name": ?"([^"]+)"', body))
    assert status == 200 and {"notebooks", "exercises"} <= top and "mha_course" not in top, top
    assert (REPO / "my-work" / "notebooks" / lessons()[0].name).is_file()

    # Bound to 127.0.0.1 only: another loopback address gets no answer.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.2", served_port)) != 0, "the server answers on 127.0.0.2"
