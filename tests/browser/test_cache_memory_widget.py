"""The KV-cache memory widget of lesson 06's deep dive 06b in a real JupyterLab: the summary and
the picture redraw when a slider moves and when a preset is chosen, the numbers are the package's,
and the widget fits a 1366-pixel-wide screen. The deep dive is run, checked and closed here
(``test_lab.py``'s generic check runs the numbered lessons).
"""

from __future__ import annotations

import re

import pytest

from mha_course.widgets.cache_memory import draw_cache_memory, preset, summary_line

from .labdriver import LESSONS_DIR, panel_id

pytestmark = pytest.mark.browser

TIMEOUT_MS = 30_000


def _lesson_06() -> str:
    """Deep dive 06b, which holds the widget (``deep_dives/06b_*.ipynb``, as the lab opens it)."""
    found = sorted((LESSONS_DIR / "deep_dives").glob("06b_*.ipynb"))
    if not found:
        pytest.skip("deep dive 06b (notebooks/deep_dives/06b_*.ipynb) does not exist")
    return f"deep_dives/{found[0].name}"


def _line(output) -> str:
    text = output.text_content()
    match = re.search(r"your setting: .*?smallest: [^\n|]*?(?:GiB|MiB|KiB| B)", text)
    assert match, f"no summary line in the widget output: {text[:400]!r}"
    return match.group(0)


def _figure(output) -> str:
    from playwright.sync_api import expect

    image = output.locator("img")
    expect(image).to_have_count(1, timeout=TIMEOUT_MS)
    return image.get_attribute("src")


def test_cache_memory_widget_redraws_for_sliders_and_presets(run_lesson, tmp_path):
    from playwright.sync_api import expect

    lesson = _lesson_06()
    run = run_lesson(lesson)
    page = run.tab.page
    notebook = page.locator(f'[id="{panel_id(page, run.path)}"]')
    widget = (notebook.locator(".widget-vbox")
              .filter(has=page.locator(".widget-label", has_text=re.compile(r"^\s*preset\s*$")))
              .last)
    expect(widget).to_be_visible(timeout=TIMEOUT_MS)
    widget.scroll_into_view_if_needed()
    output = widget.locator(".widget-output")
    expect(output).to_contain_text("your setting:", timeout=TIMEOUT_MS)

    start = draw_cache_memory(**preset("Llama 3 8B"), seq_len=8192)[1]
    assert _line(output) == summary_line(start)
    figures = [_figure(output)]
    box = widget.bounding_box()
    assert box["width"] <= 1366, f"the widget is {box['width']} px wide"
    controls = widget.locator(".widget-hbox").first.bounding_box()
    assert controls["y"] + 3 * controls["height"] < box["y"] + 768, "controls out of view"
    shot = tmp_path / "cache_memory_start.png"
    widget.screenshot(path=shot)
    print(f"\nscreenshot of the cache-memory widget: {shot}")

    # 1. The tokens slider, moved with the keyboard to 128k: the line and the picture follow.
    tokens = widget.locator(".widget-slider").filter(
        has=page.locator(".widget-label", has_text=re.compile(r"^\s*tokens\s*$")))
    handle = tokens.locator(".noUi-handle")
    handle.focus()
    for _ in range(4):  # 8k -> 16k -> 32k -> 64k -> 128k
        handle.press("ArrowRight")
    want = summary_line(draw_cache_memory(**preset("Llama 3 8B"), seq_len=131072)[1])
    expect(output).to_contain_text(want.split(" | ")[0], timeout=TIMEOUT_MS)
    assert _line(output) == want
    figures.append(_figure(output))

    # 2. A preset: DeepSeek-V2 loads its MLA latent; the line is computed from its config.
    widget.locator("select").first.select_option("DeepSeek-V2")
    want = summary_line(draw_cache_memory(**preset("DeepSeek-V2"), seq_len=131072)[1])
    expect(output).to_contain_text(want.split(" | ")[0], timeout=TIMEOUT_MS)
    assert _line(output) == want
    assert "(67.5 KiB/token)" in want
    figures.append(_figure(output))
    shot = tmp_path / "cache_memory_deepseek.png"
    widget.screenshot(path=shot)
    print(f"screenshot after choosing DeepSeek-V2 at 128k tokens: {shot}")

    assert figures[0] != figures[1] != figures[2], "a figure was not redrawn"
    run_lesson.release(lesson)  # the generic check of test_lab.py runs only the numbered lessons
