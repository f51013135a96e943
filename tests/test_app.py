"""The app of ``make app`` without a server: its tabs, what each widget shows when it starts (the
lines the app notebook prints and nbval checks), the head viewer's model switch, and the
settings Voila reads (127.0.0.1 only, the page template, the Content-Security-Policy).

``tests/browser/test_app.py`` serves the same app with ``make app`` and drives it in Chromium.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import ipywidgets as widgets
import pytest
from traitlets.config.loader import PyFileConfigLoader

from mha_course.models.trained_models import load_models
from mha_course.widgets import app as app_module
from mha_course.widgets import cache_memory, explorer, head_viewer, stepper
from mha_course.widgets.app import SECTIONS, START, course_app, start_summaries, tab_title

ROOT = Path(__file__).resolve().parents[1]
VOILA_APP = ROOT / "mha_course" / "widgets" / "voila_app"
WIDGET_MODULES = {"stepper": stepper, "explorer": explorer, "cache memory": cache_memory,
                  "head viewer": head_viewer}


@pytest.fixture(scope="module")
def models():
    return load_models()


@pytest.fixture(scope="module")
def app(models):
    return course_app(models)


@pytest.fixture(scope="module")
def lines(models):
    return dict(zip([s.key for s in SECTIONS], start_summaries(models), strict=True))


def page(app, key):
    """The tab of ``key``, chosen (which builds its widget, as a visitor's click does)."""
    index = [s.key for s in SECTIONS].index(key)
    app.selected_index = index
    return app.children[index]


def test_four_tabs_in_lesson_order_each_named_after_its_lesson(app):
    assert app.titles == tuple(tab_title(s) for s in SECTIONS)
    assert [s.lesson for s in SECTIONS] == sorted(s.lesson for s in SECTIONS)
    for section in SECTIONS:  # the lesson each tab names is the one its module says
        doc = WIDGET_MODULES[section.key].__doc__
        assert f"Taught in ``notebooks/{section.lesson}_" in doc, section.key


def test_only_the_first_tab_is_built_until_another_is_chosen(models):
    app = course_app(models)
    assert [len(tab.children) for tab in app.children] == [2, 1, 1, 1]
    app.selected_index = 2
    assert [len(tab.children) for tab in app.children] == [2, 1, 2, 1]
    built = app.children[2].children[1]
    app.selected_index = 0
    app.selected_index = 2  # chosen again: the same widget, as the visitor left it
    assert app.children[2].children[1] is built


def test_each_tab_shows_a_one_line_explanation_above_its_widget(app):
    for section in SECTIONS:
        explanation, widget = page(app, section.key).children
        assert isinstance(explanation, widgets.HTML)
        assert html.escape(section.explanation) in explanation.value
        assert "\n" not in section.explanation and len(section.explanation) <= 160
        assert isinstance(widget, widgets.Box)


def test_the_stepper_starts_as_its_summary_line_says(app, lines):
    box = page(app, "stepper").children[1]
    controls, summary, _ = box.children
    scale, temperature, mask = controls.children
    start = START["stepper"]
    assert (scale.value, temperature.value, mask.value) == (
        start["scale"], start["temperature"], start["mask"])
    for item in lines["stepper"].split(": ", 1)[1].split(" | "):
        assert html.escape(item) in summary.value


def test_the_explorer_starts_as_its_summary_line_says(app, lines):
    box = page(app, "explorer").children[1]
    h_slider, d_k_slider, _note, hold, autoscale, panel = box.children[0].children
    assert h_slider.value == START["explorer"]["h"] and hold.value and not autoscale.value
    assert d_k_slider.value == START["explorer"]["d_model"] // START["explorer"]["h"]
    first, heads, params, flops = lines["explorer"].split(": ", 1)[1].split(" | ")[:4]
    assert first in panel.value and heads in panel.value
    assert params.split(": ")[1] in panel.value and flops.split(": ")[1] in panel.value


def test_the_cache_calculator_starts_as_its_summary_line_says(app, lines):
    box = page(app, "cache memory").children[1]
    out = box.children[-1]
    assert box.children[0].children[0].value == START["cache memory"]["preset"]
    assert box.children[0].children[2].value == START["cache memory"]["seq_len"]
    assert out.outputs[0]["text"] == lines["cache memory"].split(": ", 1)[1] + "\n"


def test_the_head_viewer_starts_as_its_summary_line_says(app, lines):
    viewer = page(app, "head viewer").children[1].children[0]
    summary = viewer.children[2]
    assert html.escape(lines["head viewer"].split(": ", 1)[1]) in summary.value


def test_the_head_viewer_switches_models_and_keeps_each_viewers_state(models):
    app = course_app(models)
    holder = page(app, "head viewer").children[1]
    copy_viewer = holder.children[0]
    switch = copy_viewer.children[0].children[0]
    assert isinstance(switch, widgets.ToggleButtons) and switch.value == "copy"
    token = copy_viewer.children[0].children[2]
    token.value = 3
    switch.value = "reverse"
    reverse_viewer = holder.children[0]
    assert reverse_viewer is not copy_viewer
    assert reverse_viewer.children[0].children[0] is switch  # the switch sits in both rows
    example = reverse_viewer.children[0].children[1]
    assert all("<" in label for label, _ in example.options)  # reversal examples: x<x
    switch.value = "copy"
    assert holder.children[0] is copy_viewer and token.value == 3


def test_an_app_without_both_models_is_refused(models):
    with pytest.raises(ValueError, match=r"course_app: models has \['copy'\]; expected the "
                                         r"copy and reverse models"):
        course_app({"copy": models["copy"]})


def test_start_summaries_are_the_drawing_functions_lines(lines):
    # the explorer's, computed here from START, as the notebook's checked cell prints it
    s = START["explorer"]
    want = explorer.summary_line(explorer.draw_explorer(s["h"], s["d_model"] // s["h"],
                                                        d_model=s["d_model"])[1])
    assert lines["explorer"] == f"04 · h and d_k: {want}"
    assert list(lines) == [s.key for s in SECTIONS]


# --- what Voila reads ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def voila_config():
    return PyFileConfigLoader("voila.py", path=str(VOILA_APP)).load_config()


def test_voila_binds_127_0_0_1_without_trying_other_ports(voila_config):
    assert voila_config.Voila.ip == "127.0.0.1"
    assert voila_config.Voila.port_retries == 0
    assert voila_config.VoilaConfiguration.show_tracebacks is False
    assert voila_config.VoilaConfiguration.strip_sources is True


def test_the_page_may_only_talk_to_its_server(voila_config):
    csp = voila_config.Voila.tornado_settings["headers"]["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    for name, sources in directives.items():
        for source in sources.split():
            assert source in {"'self'", "'unsafe-inline'", "'unsafe-eval'", "data:", "blob:"}, (
                f"{name} allows {source}")


def test_kernels_of_visitors_who_left_are_stopped(voila_config):
    hook = voila_config.VoilaConfiguration.prelaunch_hook

    class Handler:
        read = False

        @property
        def xsrf_token(self):
            Handler.read = True  # tornado sets the _xsrf cookie here
            return b"token"

    assert hook(Handler(), notebook=None, cwd=".") is None and Handler.read
    manager = voila_config.MappingKernelManager
    assert manager.cull_connected is False and manager.cull_idle_timeout > 0


def test_the_page_template_is_voilas_lab_template_without_its_cdn_links(voila_config):
    name = voila_config.VoilaConfiguration.template
    ours = VOILA_APP / "voila" / "templates" / name
    assert '"base_template": "lab"' in (ours / "conf.json").read_text()
    template = (ours / "index.html.j2").read_text()
    assert "extends 'voila/templates/lab/index.html.j2'" in template
    assert "http" not in re.sub(r"\{#.*?#\}", "", template, flags=re.S)  # outside comments
    replaced = re.findall(r"\{%-? block (\w+)", template)
    assert replaced == ["notebook_css", "html_head_js_mermaidjs"]
    # The installed Voila still has those blocks, and still links the CDN we leave out.
    lab = Path(sys.prefix) / "share" / "jupyter" / "voila" / "templates" / "lab" / "index.html.j2"
    if not lab.is_file():
        pytest.skip(f"Voila's lab template is not at {lab}")
    theirs = lab.read_text()
    assert "block notebook_css" in theirs and "cdn.jsdelivr.net" in theirs


def test_make_app_serves_the_app_notebook_with_these_settings():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\napp:", 1)[1].split("\n\n", 1)[0]
    assert "voila notebooks/app.ipynb" in recipe
    assert 'JUPYTER_PATH="$(CURDIR)/mha_course/widgets/voila_app' in recipe  # where the template is
    assert '--Voila.config_file_paths="$(CURDIR)/mha_course/widgets/voila_app"' in recipe
    assert re.search(r"--token\b(?!=)", recipe), "make app must generate a token"
    assert "--Voila.log_level=INFO" in recipe  # prints the URL with its token


def test_the_app_module_imports_no_widgets_until_it_builds_them():
    assert "ipywidgets" not in app_module.__dict__
