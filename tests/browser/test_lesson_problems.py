"""The verdict on a lesson's run in JupyterLab, on made-up cell reports (no browser needed)."""

from __future__ import annotations

from .labdriver import RAISES_TAG, lesson_problems


def cell(index, count, *, errors=(), tags=(), source="x = 1", outputs=None, **extra):
    report = {"index": index, "count": count, "source": source, "tags": list(tags),
              "errors": list(errors), "outputs": outputs or [], "dom_stderr": len(errors),
              "widget_views": 0, "rendered_widgets": 0, "text": ""}
    report.update(extra)
    return report


def test_a_clean_run_has_no_problems():
    cells = [cell(0, 1), cell(2, 2, errors=["ValueError: no"], tags=[RAISES_TAG]), cell(3, 3)]
    assert lesson_problems(cells, []) == []


def test_an_error_without_the_tag_fails_and_says_run_all_stops_there():
    cells = [cell(0, 1), cell(1, 2, errors=["ValueError: no"]), cell(2, None)]
    problems = lesson_problems(cells, [])
    assert any("cell 1 raised 'ValueError: no' without the 'raises-exception' tag" in p
               for p in problems)
    assert any("cells [2] never ran" in p for p in problems)


def test_a_tagged_cell_that_raises_nothing_fails():
    problems = lesson_problems([cell(0, 1, tags=[RAISES_TAG])], [])
    assert problems == ["cell 0 is tagged 'raises-exception' but raised nothing"]


def test_a_comment_is_not_a_tag():
    cells = [cell(0, 1, errors=["ValueError: no"], source="# NBVAL_RAISES_EXCEPTION\nf()")]
    assert "without the 'raises-exception' tag" in lesson_problems(cells, [])[0]


def test_blocked_requests_fail_the_lesson():
    problems = lesson_problems([cell(0, 1)], ["https://cdn.example.org/x.js"])
    assert problems == ["request left 127.0.0.1 (blocked): https://cdn.example.org/x.js"]


def test_unrendered_widgets_and_rendering_errors_fail():
    cells = [cell(0, 1, widget_views=1, rendered_widgets=0, text="VBox(children=...)"),
             cell(1, 2, dom_stderr=1, text="Javascript Error: x")]
    problems = lesson_problems(cells, [])
    assert any("widget(s) not rendered" in p for p in problems)
    assert any("cell 1 renders an error" in p for p in problems)


def test_empty_cells_are_not_counted():
    assert lesson_problems([cell(0, 1), cell(1, None, source="  \n"), cell(2, 2)], []) == []
