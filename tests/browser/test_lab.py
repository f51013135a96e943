"""The course as a learner meets it: JupyterLab in Chromium runs every lesson, and the h / d_k
explorer of lesson 04 redraws when its sliders move.

Run with ``pytest tests/browser``; screenshots land in each test's temporary folder (paths are
printed; ``-s`` shows them as they are taken).
"""

from __future__ import annotations

import re
import warnings
from itertools import pairwise

import nbformat
import pytest

import mha_course

from .labdriver import LESSONS_DIR as LESSONS
from .labdriver import RAISES_MARK, lessons, panel_id

pytestmark = pytest.mark.browser

TIMEOUT_MS = 30_000  # expect() waits 5 s by default; a redraw after a kernel round trip may not


@pytest.mark.parametrize("lesson", [p.name for p in lessons()])
def test_lesson_runs_all_cells_in_jupyterlab_without_errors(run_lesson, lab_server, lesson):
    if lab_server.tagged.get(lesson):
        warnings.warn(
            f"{lesson}: code cells {lab_server.tagged[lesson]} say {RAISES_MARK} but lack the "
            "'raises-exception' tag, so JupyterLab's Run All stops there for learners; "
            "the test tagged its copy",
            stacklevel=1,
        )
    run = run_lesson(lesson)
    print(f"\n{lesson}: seconds {run.seconds}")
    for shot in run.screenshots:
        print(f"screenshot of {lesson} after Run All: {shot}")
    if run.tab.blocked:
        print(f"blocked requests (not to 127.0.0.1): {run.tab.blocked}")
    if not lesson.startswith("04_"):  # lesson 04 stays open for the explorer test
        run_lesson.release(lesson)

    ran = [c for c in run.cells if c["source"].strip()]
    # The deliberate errors: cells tagged raises-exception in the lesson file (nbval's marker).
    cells = nbformat.read(LESSONS / lesson, as_version=4).cells
    deliberate = {i for i, cell in enumerate(cells)
                  if "raises-exception" in cell.metadata.get("tags", [])
                  or RAISES_MARK in cell.get("source", "")}
    unexpected = {c["index"]: c["errors"] for c in ran
                  if c["errors"] and c["index"] not in deliberate}
    assert not unexpected, f"{lesson}: error output in cells {unexpected}"
    silent = [c["index"] for c in ran if c["index"] in deliberate and not c["errors"]]
    assert not silent, f"{lesson}: cells {silent} are tagged raises-exception but raised nothing"
    # A fresh kernel numbers the cells 1..N: every cell ran, in order, after the deliberate error.
    assert [c["count"] for c in ran] == list(range(1, len(ran) + 1)), [
        (c["index"], c["prompt"]) for c in ran
    ]
    for c in ran:
        # Rendered stderr that is neither a warning stream nor an expected error is a rendering
        # error ("Javascript Error: ...").
        allowed = c["outputs"].count("stream:stderr") + len(c["errors"])
        assert c["dom_stderr"] <= allowed, f"cell {c['index']} renders an error: {c['text'][:500]}"
        assert "Error displaying widget" not in c["text"], f"cell {c['index']}: {c['text'][:500]}"
        # Without the ipywidgets lab extension a widget falls back to its text repr.
        assert c["rendered_widgets"] >= c["widget_views"], (
            f"cell {c['index']}: {c['widget_views']} widget(s) not rendered: {c['text'][:300]}"
        )


# --- lesson 04: the h / d_k explorer -----------------------------------------------------------

LINE = re.compile(
    r"h=(?P<h>\d+)\s+d_k=(?P<d_k>\d+)\s+d_model=(?P<d_model>\d+)\s*\|\s*"
    r"heads drawn: (?P<heads>\d+)\s*\|\s*parameters: (?P<params>[\d,]+)"
)


def _line_for(h: int, d_k: int) -> re.Pattern:
    return re.compile(rf"h={h}\s+d_k={d_k}\s+d_model=\d+\s*\|\s*heads drawn: \d+")


def _summary(output) -> dict[str, int]:
    match = LINE.search(output.text_content())
    assert match, f"no summary line in the explorer output: {output.text_content()[:500]!r}"
    return {k: int(v.replace(",", "")) for k, v in match.groupdict().items()}


def _figure(output) -> str:
    """The explorer's figure, as the image's data URL (one image per redraw)."""
    from playwright.sync_api import expect

    image = output.locator("img")
    expect(image).to_have_count(1, timeout=TIMEOUT_MS)
    return image.get_attribute("src")


def _slider(explorer, label: str):
    return explorer.locator(".widget-slider").filter(
        has=explorer.page.locator(".widget-label", has_text=re.compile(rf"^\s*{label}\s*$"))
    )


def _press_to(handle, target: int) -> None:
    """Move a slider with the keyboard: focus its handle and press arrows until ``target``."""
    handle.focus()
    now = int(handle.get_attribute("aria-valuenow").split(".")[0])
    key = "ArrowRight" if target > now else "ArrowLeft"
    for _ in range(abs(target - now)):
        handle.press(key)
    from playwright.sync_api import expect

    expect(handle).to_have_attribute("aria-valuenow", re.compile(rf"^{target}(\.0+)?$"))


def _lesson_04() -> str:
    found = [p.name for p in lessons() if p.name.startswith("04_")]
    if not found:
        pytest.skip("lesson 04 (notebooks/04_*.ipynb) does not exist yet")
    return found[0]


def test_explorer_redraws_when_h_and_d_k_change(run_lesson, tmp_path):
    from playwright.sync_api import expect

    lesson = _lesson_04()
    run = run_lesson(lesson)
    page = run.tab.page
    try:
        notebook = page.locator(f'[id="{panel_id(page, run.path)}"]')
        h_label = re.compile(r"^\s*h\s*$")
        explorer = (
            notebook.locator(".widget-vbox")
            .filter(has=page.locator(".widget-label", has_text=h_label))
            .filter(has=page.locator(".widget-checkbox"))
            .last
        )
        expect(explorer).to_be_visible(timeout=TIMEOUT_MS)
        output = explorer.locator(".widget-output")
        expect(output).to_contain_text("heads drawn:", timeout=TIMEOUT_MS)
        h_handle = _slider(explorer, "h").locator(".noUi-handle")
        d_k_readout = _slider(explorer, "d_k").locator(".widget-readout")
        hold = explorer.locator(".widget-checkbox input[type=checkbox]")

        start = _summary(output)
        d_model = start["d_model"]
        assert start["heads"] == start["h"]
        assert start["params"] == mha_course.param_count(d_model, start["h"], start["d_k"])
        assert hold.is_checked(), "the explorer should start with d_model held fixed"

        figures = [_figure(output)]

        # 1. h moves (keyboard on the handle) to the nearest other divisor of d_model;
        #    d_k follows d_model // h and the parameter count stays 4 * d_model**2.
        h1 = min(
            (h for h in range(1, 17) if d_model % h == 0 and h != start["h"]),
            key=lambda h: abs(h - start["h"]),
        )
        _press_to(h_handle, h1)
        expect(output).to_contain_text(_line_for(h1, d_model // h1), timeout=TIMEOUT_MS)
        after_h = _summary(output)
        assert after_h["heads"] == h1
        assert after_h["params"] == mha_course.param_count(d_model, h1) == 4 * d_model**2
        expect(d_k_readout).to_have_text(str(d_model // h1), timeout=TIMEOUT_MS)
        figures.append(_figure(output))
        shot = tmp_path / f"explorer_h{h1}_d_k{d_model // h1}.png"
        explorer.screenshot(path=shot)
        print(f"\nscreenshot of the explorer at h={h1}, d_k={d_model // h1}: {shot}")

        # 2. An h that does not divide d_model: no heads, the package's message instead.
        h_bad = min((h for h in range(1, 17) if d_model % h), key=lambda h: (abs(h - h1), h))
        _press_to(h_handle, h_bad)
        expect(output).to_contain_text(
            re.compile(rf"h={h_bad}\b.*heads drawn: 0.*not divisible by h={h_bad}"),
            timeout=TIMEOUT_MS,
        )
        figures.append(_figure(output))

        # 3. "hold d_model fixed" off; type d_k into its readout: now this h works, with
        #    4 * d_model * h * d_k parameters.
        hold.uncheck()
        expect(d_k_readout).to_have_attribute("contenteditable", "true", timeout=TIMEOUT_MS)
        d_k2 = 20 if d_model // h1 != 20 else 24
        d_k_readout.click()
        d_k_readout.press("Control+a")
        d_k_readout.press_sequentially(str(d_k2))
        d_k_readout.press("Enter")
        expect(output).to_contain_text(_line_for(h_bad, d_k2), timeout=TIMEOUT_MS)
        after_d_k = _summary(output)
        assert after_d_k["heads"] == h_bad
        assert after_d_k["params"] == mha_course.param_count(d_model, h_bad, d_k2)
        assert after_d_k["params"] != after_h["params"]
        figures.append(_figure(output))

        # 4. With d_k free, each head adds 4 * d_model * d_k parameters and one heatmap.
        h2 = h_bad + 1 if h_bad < 16 else h_bad - 1
        _press_to(h_handle, h2)
        expect(output).to_contain_text(_line_for(h2, d_k2), timeout=TIMEOUT_MS)
        after_h2 = _summary(output)
        assert after_h2["heads"] == h2
        assert after_h2["params"] == mha_course.param_count(d_model, h2, d_k2)
        assert after_h2["params"] - after_d_k["params"] == 4 * d_model * d_k2 * (h2 - h_bad)
        figures.append(_figure(output))
        shot = tmp_path / f"explorer_h{h2}_d_k{d_k2}.png"
        explorer.screenshot(path=shot)
        print(f"screenshot of the explorer at h={h2}, d_k={d_k2}: {shot}")

        # Every change drew a new picture.
        assert all(a != b for a, b in pairwise(figures)), "a figure was not redrawn"
    finally:
        run_lesson.release(lesson)
