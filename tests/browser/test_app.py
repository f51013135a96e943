"""``make app`` in a real browser: Voila serves the course's four widgets on one page, keyboard
only, nothing leaves 127.0.0.1, and Ctrl-C stops the server and its kernels.

The module runs the Makefile's ``app`` recipe itself, as an instructor would, with this
interpreter's environment (``VENV=sys.prefix``, and ``-o $(VENV)/.installed-app`` so make
installs nothing), on a free port (``APP_PORT``), with Jupyter's config, data and runtime
folders in a temporary folder and ``BROWSER=true`` (no browser window). It reads the URL with
its token from the log, loads the page in Chromium (1366 x 650 pixels: a 1366 x 768 laptop
screen less the browser's bars) and then

- checks the page: four tabs in lesson order, no code, no error output, no "Error displaying
  widget", no console error, the checked summary lines equal to the package's;
- drives each widget by keyboard only (Tab bar: arrow keys and Enter; sliders: arrow keys;
  check boxes and buttons: Space; menus: arrow keys) and checks that the numbers it shows are
  the package's and that its picture's bytes change at every step;
- counts kernels: one per visitor, stopped when the visitor leaves;
- stops the server as README says, with Ctrl-C: SIGINT to the process group of ``make app``,
  by its PID. Every kernel it started must be gone.

Every request the pages make away from 127.0.0.1 is aborted and fails the test; so does a
violation of the page's Content-Security-Policy (the browser refuses those requests before
Playwright sees them). Screenshots of each widget land in the tests' temporary folders (paths
printed; ``-s`` shows them). The time from starting ``make app`` to the first rendered widget is
printed too.
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
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

from mha_course import param_count
from mha_course.grading.running.run import descendants
from mha_course.models.trained_models import held_out, load_models
from mha_course.widgets.app import SECTIONS, START, head_view_inputs, start_summaries, tab_title
from mha_course.widgets.cache_memory import draw_cache_memory, preset
from mha_course.widgets.cache_memory import summary_line as cache_line
from mha_course.widgets.head_viewer import draw_head_view
from mha_course.widgets.head_viewer import summary_line as head_line
from mha_course.widgets.stepper import draw_stepper, stepper_summary_line

from .conftest import free_port, new_tab, require, require_browser
from .labdriver import REPO

pytestmark = pytest.mark.browser

START_TIMEOUT = 120  # seconds until make app prints its URL (a busy two-core machine)
RENDER_TIMEOUT_MS = 120_000  # until the first widget is drawn: a fresh kernel runs the notebook
TIMEOUT_MS = 30_000  # a redraw after a kernel round trip
VIEWPORT = {"width": 1366, "height": 650}  # a 1366 x 768 screen less the browser's bars
APP_NOTEBOOK = REPO / "notebooks" / "app.ipynb"
URL = re.compile(r"(http://127\.0\.0\.1:(\d+))/\?token=([0-9a-f]+)")

# Records every Content-Security-Policy violation of a page (the browser blocks those requests
# itself, so the route that records blocked requests never sees them).
CSP_LISTENER = """
window.__mhaCsp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__mhaCsp.push(e.violatedDirective + ' ' + e.blockedURI));
"""
# The bytes of an image as the page has them (a blob: or data: URL), as "sha256:length".
IMAGE_DIGEST = """async (img) => {
  const bytes = await (await fetch(img.src)).arrayBuffer();
  const hash = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  return Array.from(hash, b => b.toString(16).padStart(2, '0')).join('') + ':' + bytes.byteLength;
}"""


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _restore_sigint() -> None:
    # A shell's background job starts with SIGINT ignored; Ctrl-C must reach make app here.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class App:
    proc: subprocess.Popen
    url: str  # with the token
    base: str  # http://127.0.0.1:PORT
    token: str
    log: Path
    started: float  # time.monotonic() just before make app started
    url_seconds: float  # until the URL was printed
    first_widget_seconds: float | None = None
    seen_kernels: set[int] = field(default_factory=set)

    def kernels(self) -> list[int]:
        """PIDs of the kernels the server runs now (its ipykernel descendants)."""
        found = []
        for pid in descendants(self.proc.pid):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"ipykernel_launcher" in cmdline and _alive(pid):
                found.append(pid)
        self.seen_kernels.update(found)
        return found

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _stop(app: App, sig: int, timeout: float) -> bool:
    """Send ``sig`` to make app's process group; True if make exited within ``timeout``."""
    if app.proc.poll() is None:
        os.killpg(app.proc.pid, sig)
    try:
        app.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return True


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """``make app`` on a free port; stopped (with its kernels) when the module is done."""
    require_browser()
    venv = Path(sys.prefix)
    require(shutil.which("make") is not None, "make is not installed")
    require((venv / "bin" / "voila").is_file(),
             f"no voila in {venv}/bin (pip install -e '.[app]' or '.[test]')")
    base = tmp_path_factory.mktemp("make-app")
    env = {**os.environ, "BROWSER": "true"}  # webbrowser would start a real one
    for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR"):
        (base / name.lower()).mkdir()
        env[name] = str(base / name.lower())
    env.pop("JUPYTER_PATH", None)
    log = base / "make-app.log"
    cmd = ["make", "--no-print-directory", "-o", f"{venv}/.installed-app", "app",
           f"VENV={venv}", f"APP_PORT={free_port()}"]
    started = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,  # its own process group, ours to stop
                                preexec_fn=_restore_sigint)
    app = None
    try:
        deadline = started + START_TIMEOUT
        while not (found := URL.search(log.read_text(errors="replace"))):
            if proc.poll() is not None:
                pytest.fail(f"make app exited with {proc.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"make app printed no URL with a token in time:\n{log.read_text()}")
            time.sleep(0.1)
        app = App(proc, found[0], found[1], found[3], log, started,
                  round(time.monotonic() - started, 1))
        print(f"\nmake app printed its URL after {app.url_seconds} s; log: {log}")
        yield app
    finally:
        kids = descendants(proc.pid) + sorted(app.seen_kernels if app else ())
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # make, the shell and voila; voila stops kernels
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for pid in kids:  # by PID: a kernel left behind (it runs in a session of its own)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Visit:
    """A visitor's page, with what it logged, was refused, and violated."""

    tab: object  # conftest.Tab

    @property
    def page(self):
        return self.tab.page

    def problems(self) -> list[str]:
        csp = self.page.evaluate("() => window.__mhaCsp || []") if not self.page.is_closed() \
            else []
        return ([f"request left 127.0.0.1 (blocked): {u}" for u in self.tab.blocked]
                + [f"Content-Security-Policy refused: {v}" for v in csp]
                + [line for line in self.tab.console
                   if line.startswith(("[error]", "[pageerror]"))])


def _visit(browser, app: App) -> Visit:
    """Open the app in a fresh browser context; return once its first widget is drawn."""
    tab = new_tab(browser)
    tab.context.add_init_script(CSP_LISTENER)
    tab.page.set_viewport_size(VIEWPORT)
    tab.page.goto(app.url)
    tab.page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.widget-image'))"
        ".some(img => img.complete && img.naturalWidth > 0)",
        timeout=RENDER_TIMEOUT_MS, polling=100)
    return Visit(tab)


@pytest.fixture(scope="module")
def visit(browser, app):
    """The first visitor: the page as ``make app`` serves it, loaded once for the module."""
    visit = _visit(browser, app)
    app.first_widget_seconds = round(time.monotonic() - app.started, 1)
    print(f"\nmake app -> first rendered widget: {app.first_widget_seconds} s "
          f"(URL printed after {app.url_seconds} s)")
    try:
        yield visit
    finally:
        visit.tab.close()


def _tab_page(page, index: int):
    return page.locator(".widget-tab-contents > .widget-box").nth(index)


def _select_tab(page, index: int):
    """Choose tab ``index`` with the keyboard: focus the tab bar, arrow keys, Enter."""
    from playwright.sync_api import expect

    tabs = page.locator(".widget-tab .lm-TabBar-tab")
    focused = page.locator(".widget-tab .lm-TabBar-tab[tabindex='0']")
    at = int(focused.evaluate("t => Array.from(t.parentNode.children).indexOf(t)"))
    focused.focus()
    for _ in range(abs(index - at)):
        page.keyboard.press("ArrowRight" if index > at else "ArrowLeft")
    page.keyboard.press("Enter")
    expect(tabs.nth(index)).to_have_class(re.compile(r"\blm-mod-current\b"), timeout=TIMEOUT_MS)
    section = _tab_page(page, index)
    expect(section).to_be_visible(timeout=TIMEOUT_MS)
    page.evaluate("() => window.scrollTo(0, 0)")
    return section


def _digest(image) -> str:
    return image.evaluate(IMAGE_DIGEST)


def _new_picture(image, previous: str) -> str:
    """Wait until the picture's bytes differ from ``previous``; return their digest."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while True:
        image.page.wait_for_function(
            "(img) => img.complete && img.naturalWidth > 0", arg=image.element_handle(),
            timeout=TIMEOUT_MS)
        now = _digest(image)
        if now != previous:
            return now
        assert time.monotonic() < deadline, "the picture's bytes did not change"
        image.page.wait_for_timeout(200)


def _slider(box, label: str):
    return box.locator(".widget-slider").filter(
        has=box.page.locator(".widget-label", has_text=re.compile(rf"^\s*{label}\s*$")))


def _press(locator, key: str, times: int = 1) -> None:
    locator.focus()
    for _ in range(times):
        locator.press(key)


def _shoot(locator, tmp_path, name: str) -> None:
    shot = tmp_path / f"{name}.png"
    locator.screenshot(path=shot)
    print(f"screenshot: {shot}")


def _assert_clean(visit: Visit) -> None:
    problems = visit.problems()
    assert not problems, "\n".join(problems)


# --- the server ------------------------------------------------------------------------------


def test_make_app_serves_on_127_0_0_1_behind_a_token(app):
    assert len(app.token) >= 32
    opener = urllib.request.build_opener(type("NoRedirect", (urllib.request.HTTPRedirectHandler,),
                                              {"redirect_request": lambda *a, **k: None}))
    with pytest.raises(urllib.error.HTTPError) as refused:  # no token: no page, no kernel
        opener.open(f"{app.base}/", timeout=10)
    assert refused.value.code in (302, 403), refused.value.code
    assert "/login" in refused.value.headers.get("Location", "/login")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        port = int(app.base.rsplit(":", 1)[1])
        assert s.connect_ex(("127.0.0.2", port)) != 0, "the app answers on 127.0.0.2"
    assert app.kernels() == [], "a kernel runs before anyone visited"


def test_the_page_shows_four_widgets_without_code_or_errors(app, visit, tmp_path):
    page = visit.page
    titles = page.locator(".widget-tab .lm-TabBar-tab").all_inner_texts()
    assert [t.strip() for t in titles] == [tab_title(s) for s in SECTIONS]
    text = page.evaluate("() => document.body.innerText")
    for cell in nbformat.read(APP_NOTEBOOK, as_version=4).cells:
        if cell.cell_type == "code":  # input cells hidden: no line of code on the page
            for line in filter(None, (raw.strip() for raw in cell.source.splitlines())):
                assert line not in text, f"the page shows code: {line!r}"
    assert page.locator(".jp-InputPrompt, .jp-CodeMirrorEditor, .cm-editor").count() == 0
    assert page.locator('[data-mime-type="application/vnd.jupyter.stderr"]').count() == 0
    for message in ("Error displaying widget", "Traceback", "There was an error"):
        assert message not in text, f"the page says {message!r}"
    assert page.locator(".widget-tab .widget-image").count() == 1  # the stepper; the other
    # tabs' widgets are built when their tab is first chosen
    # The lines the notebook prints (what nbval checks) are the package's.
    for line in start_summaries():
        assert line in text, f"the page does not print {line!r}"
    tabs_text = page.locator(".widget-tab-contents").text_content()  # the hidden tabs' too
    for section in SECTIONS:
        assert section.explanation in tabs_text
    _shoot(page, tmp_path, "app_first_view")
    _assert_clean(visit)


# --- the four widgets, keyboard only ---------------------------------------------------------


def test_stepper_redraws_by_keyboard(visit, tmp_path):
    from playwright.sync_api import expect

    box = _select_tab(visit.page, 0)
    summary = box.locator(".widget-html").filter(has_text="scores ÷")
    image = box.locator(".widget-image")
    start = START["stepper"]
    expect(summary).to_contain_text("√d_k on, τ=1)", timeout=TIMEOUT_MS)
    expect(box.locator(".widget-checkbox")).to_be_in_viewport(ratio=1.0)
    pictures = [_digest(image)]

    def expect_line(scale, temperature, mask):
        line = stepper_summary_line(draw_stepper(scale, temperature, mask,
                                                 seed=start["seed"])[1])
        for item in line.split(" | "):
            expect(summary).to_contain_text(item, timeout=TIMEOUT_MS)
        pictures.append(_new_picture(image, pictures[-1]))

    _press(_slider(box, "τ").locator(".noUi-handle"), "ArrowRight")  # τ: 1 -> 2
    expect_line(True, 2.0, "none")
    _press(box.locator(".widget-checkbox input"), "Space")  # divide by √d_k: off
    expect_line(False, 2.0, "none")
    _press(box.locator("select"), "ArrowDown")  # mask: none -> causal
    expect_line(False, 2.0, "causal")
    _shoot(box, tmp_path, "stepper_tau2_unscaled_causal")
    assert len(set(pictures)) == len(pictures)
    _assert_clean(visit)


def test_explorer_redraws_by_keyboard(visit, tmp_path):
    from playwright.sync_api import expect

    box = _select_tab(visit.page, 1)
    panel = box.locator(".widget-html").filter(has_text="heads drawn:")
    image = box.locator(".widget-image")
    d_model, h = START["explorer"]["d_model"], START["explorer"]["h"]
    expect(panel).to_contain_text(f"h={h} d_k={d_model // h} d_model={d_model}",
                                  timeout=TIMEOUT_MS)
    for label in ("h", "d_k"):
        expect(_slider(box, label)).to_be_in_viewport(ratio=1.0)
    expect(image).to_be_in_viewport(ratio=1.0)  # the explorer fits the screen whole
    pictures = [_digest(image)]

    def expect_setting(h, d_k):
        expect(panel).to_contain_text(f"h={h} d_k={d_k} d_model={d_model}", timeout=TIMEOUT_MS)
        expect(panel).to_contain_text(f"{param_count(d_model, h, d_k):,}", timeout=TIMEOUT_MS)
        expect(panel).to_contain_text(f"heads drawn: {h}", timeout=TIMEOUT_MS)
        pictures.append(_new_picture(image, pictures[-1]))

    _press(_slider(box, "h").locator(".noUi-handle"), "ArrowLeft")  # h: 4 -> 3, d_k follows
    expect_setting(h - 1, d_model // (h - 1))
    hold = box.locator(".widget-checkbox").filter(has_text="hold d_model").locator("input")
    _press(hold, "Space")  # hold d_model: off
    expect(hold).not_to_be_checked()
    # the d_k slider is enabled once the kernel has answered
    expect(_slider(box, "d_k").locator(".widget-readout")).to_have_attribute(
        "contenteditable", "true", timeout=TIMEOUT_MS)
    _press(_slider(box, "d_k").locator(".noUi-handle"), "ArrowRight", times=2)
    expect_setting(h - 1, d_model // (h - 1) + 2)
    _shoot(box, tmp_path, f"explorer_h{h - 1}_d_k{d_model // (h - 1) + 2}")
    # the colours run 0-1 until "autoscale colours" is ticked (review D41)
    expect(panel).to_contain_text("(colour 0–1.0)", timeout=TIMEOUT_MS)
    autoscale = box.locator(".widget-checkbox").filter(has_text="autoscale").locator("input")
    _press(autoscale, "Space")
    expect(autoscale).to_be_checked()
    expect(panel).not_to_contain_text("(colour 0–1.0)", timeout=TIMEOUT_MS)
    pictures.append(_new_picture(image, pictures[-1]))
    assert len(set(pictures)) == len(pictures)
    _assert_clean(visit)


def test_cache_memory_redraws_by_keyboard(visit, tmp_path):
    from playwright.sync_api import expect

    box = _select_tab(visit.page, 2)
    output = box.locator(".widget-output")
    image = output.locator("img")
    start = START["cache memory"]
    expect(output).to_contain_text(cache_line(draw_cache_memory(
        **preset(start["preset"]), seq_len=start["seq_len"])[1]), timeout=TIMEOUT_MS)
    expect(box.locator("select").first).to_be_in_viewport(ratio=1.0)
    pictures = [_digest(image)]

    _press(_slider(box, "tokens").locator(".noUi-handle"), "ArrowRight")  # 8k -> 16k tokens
    seq_len = start["seq_len"] * 2
    expect(output).to_contain_text(cache_line(draw_cache_memory(
        **preset(start["preset"]), seq_len=seq_len)[1]), timeout=TIMEOUT_MS)
    pictures.append(_new_picture(image, pictures[-1]))
    _press(box.locator("select").first, "ArrowDown")  # the next preset
    expect(box.locator("select").first).to_have_value("Llama 3 70B", timeout=TIMEOUT_MS)
    line = cache_line(draw_cache_memory(**preset("Llama 3 70B"), seq_len=seq_len)[1])
    expect(output).to_contain_text(line, timeout=TIMEOUT_MS)
    assert "(320.0 KiB/token)" in line  # Llama 3 70B: 80 layers x 8 K/V heads x 128 x 2 x bf16
    pictures.append(_new_picture(image, pictures[-1]))
    _shoot(box, tmp_path, "cache_memory_llama70b_16k")
    assert len(set(pictures)) == len(pictures)
    _assert_clean(visit)


def test_head_viewer_redraws_by_keyboard(visit, tmp_path):
    from playwright.sync_api import expect

    box = _select_tab(visit.page, 3)
    summary = box.locator(".widget-html").filter(has_text="layers [")
    image = box.locator(".widget-image")
    start = START["head viewer"]
    models = load_models()

    def line(task, token=None, heads=None):
        batch = held_out(task).select(range(start["examples"]))
        weights, labels = head_view_inputs(models[task], batch, start["example"])
        return head_line(draw_head_view(weights, labels, heads=heads, token=token)[1])

    expect(summary).to_have_text(line(start["model"]), timeout=TIMEOUT_MS)
    expect(box.locator("select").first).to_be_in_viewport(ratio=1.0)
    expect(box.locator("button", has_text="L1H1")).to_be_in_viewport(ratio=1.0)
    pictures = [_digest(image)]

    _press(box.locator("button", has_text=re.compile(r"L1H0\s*$")), "Space")  # head L1H0 off
    shown = [(0, 0), (0, 1), (1, 1)]
    expect(summary).to_have_text(line("copy", heads=shown), timeout=TIMEOUT_MS)
    pictures.append(_new_picture(image, pictures[-1]))
    _press(box.locator("select").nth(1), "ArrowDown", times=4)  # token menu: token 3
    expect(summary).to_have_text(line("copy", token=3, heads=shown), timeout=TIMEOUT_MS)
    pictures.append(_new_picture(image, pictures[-1]))
    _shoot(box, tmp_path, "head_viewer_copy_token3_without_L1H0")

    # The reverse model: its own viewer, every head on, every token.
    _press(box.locator(".widget-toggle-buttons button", has_text="reverse"), "Space")
    expect(summary).to_have_text(line("reverse"), timeout=TIMEOUT_MS)
    expect(box.locator("select").first).to_contain_text("<")  # reversal examples: a<a
    image = box.locator(".widget-image")  # the reverse viewer's own picture
    pictures.append(_new_picture(image, pictures[-1]))
    _shoot(box, tmp_path, "head_viewer_reverse")
    assert len(set(pictures)) == len(pictures)
    _assert_clean(visit)


# --- kernels ---------------------------------------------------------------------------------


def test_each_visitor_gets_a_kernel_and_leaving_stops_it(browser, app, visit):
    from playwright.sync_api import expect

    assert len(app.kernels()) == 1, "the first visitor should have one kernel"
    second = _visit(browser, app)
    try:
        assert len(app.kernels()) == 2, "a second visitor should get a kernel of their own"
        # The first visitor changed the stepper; the second one's starts afresh.
        box = _tab_page(second.page, 0)
        expect(box.locator(".widget-html").filter(has_text="scores ÷")).to_contain_text(
            "scores ÷ 4 (√d_k on, τ=1)", timeout=TIMEOUT_MS)
        _assert_clean(second)
    finally:
        second.page.close(run_before_unload=True)  # the page asks the server to stop its kernel
    deadline = time.monotonic() + 30
    while len(app.kernels()) != 1:
        assert time.monotonic() < deadline, f"kernels still running: {app.kernels()}"
        time.sleep(0.25)
    second.tab.close()


def test_ctrl_c_stops_make_app_and_its_kernels(app, visit):
    kernels = app.kernels()
    assert kernels, "the visitor's kernel should still run"
    assert _stop(app, signal.SIGINT, timeout=60), f"make app ignored Ctrl-C:\n{app.log_text()}"
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in app.seen_kernels):
        assert time.monotonic() < deadline, (
            f"kernels left running after Ctrl-C: "
            f"{[p for p in app.seen_kernels if _alive(p)]}\n{app.log_text()}")
        time.sleep(0.25)
    assert "Kernel shutdown" in app.log_text()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        assert s.connect_ex(("127.0.0.1", int(app.base.rsplit(":", 1)[1]))) != 0
