"""The course's four widgets on one page, for teaching from a projector: ``make app``.

``make app`` serves ``notebooks/app.ipynb`` with Voila (input cells hidden, one kernel per
visitor, 127.0.0.1 behind a token); the same notebook runs in JupyterLab. This module builds
what the page shows, so it can be tested without a server:

- :data:`SECTIONS`: the four widgets in lesson order — the attention stepper (lesson 03), the
  h / d_k explorer (04), the KV-cache memory calculator (06) and the head viewer of lesson 08's
  trained models — each with a tab title and a one-line explanation;
- :func:`course_app` lays them out in tabs, each explanation above its widget. The head viewer's
  models are lesson 08's, trained once and shipped (:mod:`mha_course.models.trained_models`), so a
  visitor's kernel loads them in a fraction of a second instead of training them;
- :func:`start_summaries` says, one line per widget, what it draws when it starts, computed by
  the widgets' pure drawing functions from the settings the widgets start with (:data:`START`):
  the lines the app notebook prints and nbval checks.

Like the widget modules, it imports ipywidgets only when a widget is built.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from .._validate import fail
from ..models.tasks import VOCAB
from ..models.trained_models import held_out, load_models
from . import cache_memory, explorer, head_viewer, stepper

#: The settings every widget starts with (the widget builders' own defaults, named here so
#: :func:`start_summaries` describes exactly what the page shows first).
START = {
    "stepper": {"scale": True, "temperature": 1.0, "mask": "none", "seed": 0},
    "explorer": {"h": 4, "d_model": 48, "seed": 0},
    "cache memory": {"preset": "Llama 3 8B", "seq_len": 8192},
    "head viewer": {"model": "copy", "examples": 8, "example": 0},
}
#: Tasks of the head viewer's models, in the order of its model switch.
HEAD_VIEWER_MODELS = ("copy", "reverse")


@dataclass(frozen=True)
class Section:
    """One widget of the app: its key in :data:`START`, its tab title, lesson and explanation."""

    key: str
    title: str
    lesson: str
    explanation: str


SECTIONS = (
    Section("stepper", "stepper", "03",
            "One head, step by step: the scores q·kᵀ, divided by √d_k and τ, masked, "
            "softmaxed into weights, times the values; one colour scale for all five."),
    Section("explorer", "h and d_k", "04",
            "More heads, or wider ones: every untrained head's weights on one sentence and what "
            "they cost. Hold d_model, and h changes neither the parameters nor the FLOPs."),
    Section("cache memory", "KV cache", "06",
            "The keys and values a decoder keeps while it generates, for your setting and for "
            "real models; presets load each model's configuration."),
    Section("head viewer", "trained heads", "08",
            "Two tiny models trained in NumPy to copy and to reverse: lines from each query "
            "(left) to the keys it attends to (right), one colour per head."),
)


def tab_title(section: Section) -> str:
    """The tab's label, e.g. ``'03 · attention step by step'``.

    Examples
    --------
    >>> tab_title(SECTIONS[1])
    '04 · h and d_k'
    """
    return f"{section.lesson} · {section.title}"


def head_view_inputs(model, batch, example: int):
    """What the head viewer draws for one example of ``batch``: its weights and token labels.

    Returns
    -------
    weights : list of ndarray, each (h, T, T)
        One array per layer, on the example without its padding (``T = 2n + 1``).
    labels : list of str, length T

    Examples
    --------
    >>> from mha_course.models.trained_models import build_model
    >>> weights, labels = head_view_inputs(build_model("copy"), held_out("copy", 2), 0)
    >>> weights[0].shape == (2, len(labels), len(labels))
    True
    """
    n = 2 * int(batch.lengths[example]) + 1  # real positions: n symbols, delimiter, answer
    tokens = batch.tokens[example : example + 1, :n]  # (1, T)
    weights = [w[0] for w in model.attention_weights(tokens)]  # n_layers arrays (h, T, T)
    return weights, [VOCAB[i] for i in tokens[0]]


def start_summaries(models=None) -> list[str]:
    """One line per widget: what it draws when the app starts, from its pure drawing function.

    Parameters
    ----------
    models : dict of str to TinyTransformer, optional
        The head viewer's models (default: :func:`~mha_course.models.trained_models.load_models`).

    Returns
    -------
    list of str
        ``"<tab title>: <summary line>"``, in tab order.

    Examples
    --------
    >>> start_summaries()[0].split(" | ")[0]
    '03 · stepper: scores ÷ 4 (√d_k on, τ=1)'
    """
    models = load_models() if models is None else models
    lines = {}
    s = START["stepper"]
    lines["stepper"] = stepper.stepper_summary_line(stepper.draw_stepper(
        s["scale"], s["temperature"], s["mask"], seed=s["seed"])[1])
    s = START["explorer"]
    lines["explorer"] = explorer.summary_line(explorer.draw_explorer(
        s["h"], s["d_model"] // s["h"], d_model=s["d_model"], seed=s["seed"])[1])
    s = START["cache memory"]
    lines["cache memory"] = cache_memory.summary_line(cache_memory.draw_cache_memory(
        **cache_memory.preset(s["preset"]), seq_len=s["seq_len"])[1])
    s = START["head viewer"]
    batch = held_out(s["model"]).select(range(s["examples"]))
    weights, labels = head_view_inputs(models[s["model"]], batch, s["example"])
    lines["head viewer"] = head_viewer.summary_line(head_viewer.draw_head_view(weights,
                                                                               labels)[1])
    return [f"{tab_title(section)}: {lines[section.key]}" for section in SECTIONS]


def _explanation(section: Section):
    import ipywidgets as widgets

    return widgets.HTML(
        f"<div style='font-size: 14px; line-height: 1.35'>"
        f"{html.escape(section.explanation)} <span style='color: #666'>(lesson "
        f"{section.lesson})</span></div>",
        layout=widgets.Layout(margin="0 0 6px 0"))


def _head_viewer_with_model_switch(models):
    """Lesson 08's head viewer with a switch between the copy and the reverse model.

    The switch sits first in the viewer's row of menus. The copy model's viewer is built at
    once, the reverse model's on first use; each keeps its own toggles and token when switched
    away and back.
    """
    import ipywidgets as widgets

    s = START["head viewer"]
    switch = widgets.ToggleButtons(options=list(HEAD_VIEWER_MODELS), value=s["model"],
                                   style={"button_width": "72px"},
                                   tooltips=[f"the model trained to {t}"
                                             for t in HEAD_VIEWER_MODELS],
                                   layout=widgets.Layout(width="170px", flex="0 0 auto"))
    viewers = {}

    def viewer(task):
        if task not in viewers:
            viewers[task] = head_viewer.head_viewer(
                models[task], held_out(task).select(range(s["examples"])),
                extra_controls=[switch])
        return viewers[task]

    holder = widgets.Box([viewer(s["model"])])

    def on_switch(change):
        holder.children = [viewer(change["new"])]

    switch.observe(on_switch, names="value")
    return holder


def course_app(models=None):
    """The app: one tab per widget of :data:`SECTIONS`, its explanation above it.

    Only the first tab's widget is built at once; each other one is built the first time its
    tab is chosen (then kept), so a visitor's page appears sooner.

    Parameters
    ----------
    models : dict of str to TinyTransformer, optional
        The head viewer's models, ``"copy"`` and ``"reverse"`` (default: the shipped ones,
        :func:`~mha_course.models.trained_models.load_models`).

    Returns
    -------
    ipywidgets.Tab
        Four pages in lesson order; each is a ``VBox`` of its explanation (``HTML``) and, once
        built, the widget, with the settings of :data:`START`; the head viewer's row of menus
        starts with a switch between the copy and the reverse model.

    Raises
    ------
    ValueError
        If ``models`` lacks the copy or the reverse model.

    Examples
    --------
    >>> app = course_app()
    >>> app.titles[0], [len(page.children) for page in app.children]  # one widget built yet
    ('03 · stepper', [2, 1, 1, 1])
    >>> app.selected_index = 1  # choosing a tab builds its widget
    >>> [type(w).__name__ for w in app.children[1].children]
    ['HTML', 'HBox']
    """
    import ipywidgets as widgets

    models = load_models() if models is None else models
    missing = [t for t in HEAD_VIEWER_MODELS if t not in models]
    if missing:
        raise fail("course_app", f"models has {sorted(models)}; expected the "
                                 f"{' and '.join(HEAD_VIEWER_MODELS)} models")
    builders = {
        "stepper": lambda: stepper.stepper_widget(seed=START["stepper"]["seed"]),
        "explorer": lambda: explorer.explorer(d_model=START["explorer"]["d_model"],
                                              seed=START["explorer"]["seed"]),
        "cache memory": lambda: cache_memory.cache_memory_widget(
            START["cache memory"]["preset"]),
        "head viewer": lambda: _head_viewer_with_model_switch(models),
    }
    pages = [widgets.VBox([_explanation(section)], layout=widgets.Layout(padding="6px 4px"))
             for section in SECTIONS]

    def build(index):
        if index is not None and len(pages[index].children) == 1:
            pages[index].children = (*pages[index].children, builders[SECTIONS[index].key]())

    build(0)
    tabs = widgets.Tab(children=pages, titles=[tab_title(s) for s in SECTIONS],
                       selected_index=0)
    tabs.observe(lambda change: build(change["new"]), names="selected_index")
    return tabs
