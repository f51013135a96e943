"""Lesson 08's head viewer in a real JupyterLab: toggling a head, hiding a layer and choosing a
token redraw the summary and the picture, and the widget fits a 1366 x 768 screen.

The lesson's run is left open for ``test_lab.py``'s generic check of every lesson, which reuses
it (each lesson runs once per session) and then closes it.
"""

from __future__ import annotations

import re

import pytest

from .labdriver import lessons, panel_id

pytestmark = pytest.mark.browser

TIMEOUT_MS = 30_000


def _lesson_08() -> str:
    found = [p.name for p in lessons() if p.name.startswith("08_")]
    if not found:
        pytest.skip("lesson 08 (notebooks/08_*.ipynb) does not exist yet")
    return found[0]


def _figure(widget) -> str:
    from playwright.sync_api import expect

    image = widget.locator("img")
    expect(image).to_have_count(1, timeout=TIMEOUT_MS)
    return image.get_attribute("src")


def test_head_viewer_redraws_for_toggles_and_tokens(run_lesson, tmp_path):
    from playwright.sync_api import expect

    lesson = _lesson_08()
    run = run_lesson(lesson)
    page = run.tab.page
    notebook = page.locator(f'[id="{panel_id(page, run.path)}"]')
    widget = (notebook.locator(".widget-vbox")
              .filter(has=page.locator(".widget-label", has_text=re.compile(r"^\s*example\s*$")))
              .last)
    expect(widget).to_be_visible(timeout=TIMEOUT_MS)
    widget.scroll_into_view_if_needed()
    summary = widget.locator(".widget-html").first
    expect(summary).to_contain_text("heads L0H0 L0H1 L1H0 L1H1 | every token",
                                    timeout=TIMEOUT_MS)
    figures = [_figure(widget)]
    box = widget.bounding_box()
    assert box["width"] <= 1366, f"the widget is {box['width']} px wide"
    assert box["height"] <= 768 - 80, f"the widget is {box['height']} px high"
    shot = tmp_path / "head_viewer_start.png"
    widget.screenshot(path=shot)
    print(f"\nscreenshot of the head viewer: {shot}")

    # 1. Switch head L1H0 off: the summary no longer lists it and the picture changes.
    widget.locator("button", has_text=re.compile(r"L1H0\s*$")).click()
    expect(summary).to_contain_text("heads L0H0 L0H1 L1H1 | every token", timeout=TIMEOUT_MS)
    figures.append(_figure(widget))

    # 2. Hide layer 0: only layer 1's remaining head is drawn.
    widget.locator("button", has_text=re.compile(r"^\s*layer 0\s*$")).click()
    expect(summary).to_contain_text("layers [1] | heads L1H1 | every token", timeout=TIMEOUT_MS)
    figures.append(_figure(widget))

    # 3. Choose a token: its lines only, and its strongest key per head.
    widget.locator("select").nth(1).select_option(index=5)  # index 0 is "every token"
    expect(summary).to_contain_text(re.compile(r"\| token 4 '.' \| \d+ lines \| L1H1 -> \d+"),
                                    timeout=TIMEOUT_MS)
    figures.append(_figure(widget))
    shot = tmp_path / "head_viewer_token.png"
    widget.screenshot(path=shot)
    print(f"screenshot with layer 0 hidden, L1H0 off, token 4 chosen: {shot}")

    # 4. Another example: the token menu goes back to every token, the toggles stay.
    widget.locator("select").first.select_option(index=2)
    expect(summary).to_contain_text("layers [1] | heads L1H1 | every token", timeout=TIMEOUT_MS)
    figures.append(_figure(widget))
    assert len(set(figures)) == len(figures), "a picture was not redrawn"
