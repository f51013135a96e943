"""The h / d_k explorer: per-head weights, parameters, FLOPs and weights memory, with sliders.

Taught in ``notebooks/04_multi_head_attention.ipynb``.

Three layers, so each can be tested on its own:

- :func:`~mha_course.widgets.plotting.plot_heads` (in :mod:`mha_course.widgets.plotting`,
  importable from here too) draws an (h, T, S) stack of weights as a grid of heatmaps with one
  shared colorbar, fast enough to redraw 16 heads interactively.
- :func:`draw_explorer` is a pure function (no widgets): it builds a seeded, untrained
  :class:`~mha_course.MultiHeadAttention` on fixed toy embeddings of the example sentence and
  returns the figure and a summary dict; :func:`summary_line` prints that summary in one line.
- :func:`explorer` wraps :func:`draw_explorer` in ipywidgets: the controls and the numbers
  (parameters, FLOPs, weights) in a column beside the picture, at one fixed size.

**The initialisation.** The explorer's layer draws ``W_q``, ``W_k``, ``W_v`` with variance
``1 / d_model`` (fan-in, "LeCun normal") and ``W_o`` with variance ``1 / (h·d_v)``. On token
vectors of unit variance each query and key entry then has variance 1 whatever ``h`` and
``d_k`` are, so ``q·k / √d_k`` has variance 1 (lesson 03, §4): the sliders change the number and
the width of the heads, not how peaked they are. The package's default (Xavier uniform on each
matrix; PyTorch's ``nn.MultiheadAttention`` draws Xavier over its stacked ``in_proj_weight``
instead, deep dive 04a §5) has variance ``2 / (d_model + h·d_k)`` for ``W_q``, which shrinks as
``h·d_k`` grows and washes every head out to near-uniform weights when ``d_k`` is raised without
holding ``d_model`` (``init="xavier"`` shows it).

**The colour scale** runs from 0 to 1 by default, the same in every setting (and in every heatmap
of lesson 03), so a peakier setting looks peakier; ``autoscale=True`` (the widget's "autoscale
colours" box, whose tooltip says so) stretches it to the largest weight rounded up to a tenth, to
see the detail of flat heads.

**The d_k slider** is greyed out while "hold d_model" is ticked, since ``d_k = d_model / h`` then;
the line under it (:func:`d_k_note`) says so, and what ``d_k`` is.

The figures are :class:`matplotlib.figure.Figure` objects that pyplot does not track, so a
redraw never leaves an open figure behind (memory stays flat while the sliders move).
"""

from __future__ import annotations

import html
import math

import numpy as np
from matplotlib.figure import Figure

from .._validate import fail, validate_positive_int
from ..cost import attention_flops, param_count
from ..multihead import MultiHeadAttention
from .plotting import HEAD_LABEL, TOKENS, figure_png, plot_heads, show_message

#: Seed of the toy embeddings (fixed, so only the layer's ``seed`` changes the heads).
EMBEDDING_SEED = 2017
#: Resolution of the PNG the widget shows.
WIDGET_DPI = 100
#: Size of the explorer's figure in inches (630 x 470 pixels at WIDGET_DPI): with the controls
#: beside it the widget is 900 pixels wide and 474 high, so it fits a 1366 x 768 screen below
#: JupyterLab's bars with the file browser open (tests/browser measures it).
FIGSIZE = (6.3, 4.7)
#: Width of the controls column, in pixels.
CONTROLS_WIDTH = 260
#: The initialisations :func:`draw_explorer` knows.
INITS = ("fan_in", "xavier")
#: The widget's checkbox that stretches the colour scale to the largest weight: a label short
#: enough for the controls column (tests/browser checks it is not cut off), the rest in its tooltip.
AUTOSCALE_LABEL = "autoscale colours"
AUTOSCALE_TOOLTIP = ("Stretch the colour scale from 0 to the largest weight (rounded up to a "
                     "tenth) instead of 0 to 1, to see the detail of flat heads")
#: The checkbox that ties d_k to d_model / h.
HOLD_LABEL = "hold d_model (d_k = d_model / h)"
#: Height of the line under the d_k slider (:func:`d_k_note`, at most two lines), in pixels.
NOTE_HEIGHT = 32


def toy_embeddings(d_model: int, tokens=TOKENS) -> np.ndarray:
    """Fixed random embeddings of ``tokens``, one row per token, shape (T, d_model).

    Entries have variance 1 (the scale a LayerNorm produces).

    Examples
    --------
    >>> toy_embeddings(48).shape
    (11, 48)
    """
    d_model = validate_positive_int("toy_embeddings", "d_model", d_model)
    return np.random.default_rng(EMBEDDING_SEED).normal(size=(len(tokens), d_model))


def explorer_layer(d_model, h, d_k=None, *, seed=0, init="fan_in") -> MultiHeadAttention:
    """The explorer's seeded, untrained layer.

    Parameters
    ----------
    d_model, h : int
    d_k : int, optional
        Default ``d_model // h`` (then ``h`` must divide ``d_model``).
    seed : int, default 0
    init : {"fan_in", "xavier"}, default "fan_in"
        ``"fan_in"``: ``W_q``, ``W_k``, ``W_v`` with variance ``1 / d_model`` and ``W_o`` with
        ``1 / (h·d_v)``, so the scores' spread does not depend on ``h`` or ``d_k``.
        ``"xavier"``: the package's default, Xavier uniform on each matrix, variance
        ``2 / (fan_in + fan_out)`` (not PyTorch's, which draws its stacked ``in_proj_weight``).

    Returns
    -------
    MultiHeadAttention

    Raises
    ------
    ValueError
        As :class:`~mha_course.MultiHeadAttention`, or if ``init`` is unknown.

    Examples
    --------
    >>> explorer_layer(48, 16, 64).W_q.shape
    (48, 1024)
    """
    if init not in INITS:
        raise fail("explorer_layer", f"init={init!r}; expected one of {', '.join(INITS)}")
    layer = MultiHeadAttention(d_model, h, d_k, rng=seed)  # validates the sizes
    if init == "fan_in":
        rng = np.random.default_rng(seed)
        for name, fan_in in (("W_q", d_model), ("W_k", d_model), ("W_v", d_model),
                             ("W_o", layer.h * layer.d_v)):
            shape = getattr(layer, name).shape
            setattr(layer, name, rng.normal(scale=1 / math.sqrt(fan_in), size=shape))
    return layer


def colour_top(weights) -> float:
    """Top of the colour scale: the largest weight rounded up to a tenth (at least 0.2).

    Examples
    --------
    >>> colour_top(np.array([0.1, 0.62])), colour_top(np.array([0.05])), colour_top(np.ones(2))
    (0.7, 0.2, 1.0)
    """
    return float(min(1.0, max(0.2, math.ceil(float(np.max(weights)) * 10 - 1e-9) / 10)))


def draw_explorer(h, d_k, *, d_model=48, hold_d_model=True, seed=0, init="fan_in",
                  autoscale=False, fig=None):
    """Draw one setting of the explorer: every head's weights on the example sentence.

    Parameters
    ----------
    h : int
        Number of heads.
    d_k : int
        Query/key (and value) width per head; ignored when ``hold_d_model`` is True.
    d_model : int, default 48
    hold_d_model : bool, default True
        Use ``d_k = d_model // h`` (the paper's choice: cost independent of ``h``). If ``h``
        does not divide ``d_model`` the figure shows the package's error message instead.
    seed : int, default 0
        Seed of the layer's random (untrained) weights.
    init : {"fan_in", "xavier"}, default "fan_in"
        The layer's initialisation (:func:`explorer_layer`; the module docstring says why
        fan-in).
    autoscale : bool, default False
        False: the colour scale runs from 0 to 1, the same for every setting. True: from 0 to
        :func:`colour_top` of the weights (their largest, rounded up to a tenth).
    fig : matplotlib.figure.Figure, optional
        A heads figure from an earlier call to redraw into (see :func:`plot_heads`); the
        explorer passes its own so a redraw only updates images. Default: a new figure.

    Returns
    -------
    fig : matplotlib.figure.Figure
        Not registered with pyplot: nothing to close. Always :data:`FIGSIZE` (unless ``fig`` has
        another size): when ``h`` does not divide a held ``d_model``, the same figure shows the
        error message instead of heatmaps.
    summary : dict
        ``h``, ``d_k``, ``d_model``, ``init``, ``heads_drawn`` (counted from the figure's
        heatmap axes), ``param_count``, ``flops`` (the :func:`~mha_course.attention_flops`
        dict), ``weights_shape`` (h, T, T), ``weights_values`` (h·T·T), ``weights`` (the
        array), ``largest_weight``, ``autoscale``, ``colour_top`` (top of the colour scale: 1.0,
        or :func:`colour_top` of the weights when ``autoscale``) and ``error`` (None, or the
        message shown instead of heatmaps).

    Raises
    ------
    ValueError
        If ``h``, ``d_k`` (when used) or ``d_model`` is not a positive integer, or ``init`` is
        unknown.

    Examples
    --------
    >>> fig, summary = draw_explorer(h=4, d_k=99)
    >>> summary["d_k"], summary["heads_drawn"], summary["weights_shape"]
    (12, 4, (4, 11, 11))
    """
    func = "draw_explorer"
    h = validate_positive_int(func, "h", h)
    d_model = validate_positive_int(func, "d_model", d_model)
    d_k = None if hold_d_model else validate_positive_int(func, "d_k", d_k)
    if init not in INITS:
        raise fail(func, f"init={init!r}; expected one of {', '.join(INITS)}")
    autoscale = bool(autoscale)
    summary = {"h": h, "d_k": d_k, "d_model": d_model, "init": init, "heads_drawn": 0,
               "param_count": None, "flops": None, "weights_shape": None, "weights_values": 0,
               "weights": None, "largest_weight": None, "autoscale": autoscale,
               "colour_top": None, "error": None}
    try:
        layer = explorer_layer(d_model, h, d_k, seed=seed, init=init)
    except ValueError as exc:  # e.g. h does not divide d_model while d_model is held
        summary["error"] = str(exc)
        fig = show_message(fig if fig is not None else Figure(figsize=FIGSIZE), str(exc),
                           "Choose an h that divides d_model, or untick\n'hold d_model' and set "
                           "d_k yourself.")
        return fig, summary
    _, weights = layer(toy_embeddings(d_model))  # (h, T, T)
    top = colour_top(weights) if autoscale else 1.0
    fig, _ = plot_heads(
        weights,
        fig=fig,
        figsize=FIGSIZE,
        vmax=top,
        suptitle=f"untrained heads ({init.replace('_', '-')} init): h={h}, d_k={layer.d_k}, "
                 f"d_model={d_model}",
    )
    summary.update(
        d_k=layer.d_k,
        heads_drawn=sum(1 for ax in fig.axes if ax.get_visible() and ax.images
                        and ax.get_label().startswith(HEAD_LABEL)),
        param_count=param_count(d_model, h, layer.d_k),
        flops=attention_flops(len(TOKENS), d_model, h, layer.d_k),
        weights_shape=weights.shape,
        weights_values=int(weights.size),
        weights=weights,
        largest_weight=float(weights.max()),
        colour_top=top,
    )
    return fig, summary


def d_k_note(d_model, h, d_k, hold) -> str:
    """The line under the widget's d_k slider: why it is greyed out, or what a free d_k gives.

    Parameters
    ----------
    d_model, h, d_k : int
        The explorer's width, its h slider and its d_k slider.
    hold : bool
        Whether "hold d_model" is ticked (then the d_k slider is disabled).

    Returns
    -------
    str
        Plain text, short enough for two lines of the controls column.

    Examples
    --------
    >>> d_k_note(48, 4, 12, hold=True)
    "d_k = d_model / h = 48 / 4 = 12 while 'hold d_model' is ticked (untick it to set d_k)"
    >>> d_k_note(48, 5, 9, hold=True)
    "48 / 5 is not a whole number: no d_k while 'hold d_model' is ticked (untick it to set d_k)"
    >>> d_k_note(48, 5, 7, hold=False)
    'd_k set freely: h·d_k = 5·7 = 35 (d_model = 48)'
    """
    if not hold:
        return f"d_k set freely: h·d_k = {h}·{d_k} = {h * d_k} (d_model = {d_model})"
    held = "while 'hold d_model' is ticked (untick it to set d_k)"
    if d_model % h:
        return f"{d_model} / {h} is not a whole number: no d_k {held}"
    return f"d_k = d_model / h = {d_model} / {h} = {d_model // h} {held}"


def summary_items(summary) -> list[str]:
    """The summary as short items, none containing a space inside a number or a shape.

    Examples
    --------
    >>> summary_items(draw_explorer(h=4, d_k=12)[1])[:3]
    ['h=4 d_k=12 d_model=48', 'heads drawn: 4', 'parameters: 9,216']
    """
    d_k = "-" if summary["d_k"] is None else summary["d_k"]
    items = [f"h={summary['h']} d_k={d_k} d_model={summary['d_model']}",
             f"heads drawn: {summary['heads_drawn']}"]
    if summary.get("error"):
        return [*items, f"error: {summary['error']}"]
    h, T, S = summary["weights_shape"]
    return [*items,
            f"parameters: {summary['param_count']:,}",
            f"FLOPs: {summary['flops']['total']:,}",
            f"weights: {h}×{T}×{S} = {summary['weights_values']:,}",
            f"largest weight: {summary['largest_weight']:.2f}"]


def summary_line(summary) -> str:
    """One line that says what :func:`draw_explorer` drew.

    Examples
    --------
    >>> summary_line(draw_explorer(h=4, d_k=12)[1])  # doctest: +NORMALIZE_WHITESPACE
    'h=4 d_k=12 d_model=48 | heads drawn: 4 | parameters: 9,216 | FLOPs: 225,984 |
     weights: 4×11×11 = 484 | largest weight: 0.59'
    """
    return " | ".join(summary_items(summary))


def _panel_html(summary) -> str:
    """The numbers column of the widget: big parameters and FLOPs, then the rest.

    Every piece is its own block, separated by newlines, so the text reads item by item.
    """
    head = f"<div style='{_LINE}'>{html.escape(summary_items(summary)[0])}</div>"
    if summary.get("error"):
        error = html.escape(summary["error"])
        return "\n".join([
            f"<div style='{_BOX}'>", head,
            f"<div style='{_LINE}'>heads drawn: {summary['heads_drawn']}</div>",
            f"<div style='color: firebrick; margin-top: 6px'>error: {error}</div>", "</div>"])
    d_model, h, d_k = summary["d_model"], summary["h"], summary["d_k"]
    _, T, S = summary["weights_shape"]
    rows = [
        ("parameters", f"{summary['param_count']:,}", f"4·d_model·h·d_k = 4·{d_model}·{h}·{d_k}"),
        ("FLOPs (T=11)", f"{summary['flops']['total']:,}", "8·T·d_model·h·d_k + 4·T²·h·d_k"),
        ("weights", f"{summary['weights_values']:,}", f"h×T×T = {h}×{T}×{S}"),
    ]
    parts = [f"<div style='{_BOX}'>", head]
    for name, value, note in rows:
        parts += ["<div style='margin-top: 6px'>",
                  f"<div style='font-size: 12px; color: #555'>{name}</div>",
                  f"<div style='font-size: 22px; font-weight: 600; {_LINE}'>{value}</div>",
                  f"<div style='font-size: 11px; color: #555; {_LINE}'>{html.escape(note)}</div>",
                  "</div>"]
    parts += [f"<div style='margin-top: 6px; {_LINE}'>heads drawn: {summary['heads_drawn']}</div>",
              f"<div style='{_LINE}'>largest weight: {summary['largest_weight']:.2f} "
              f"(colour 0–{summary['colour_top']:.1f})</div>", "</div>"]
    return "\n".join(parts)


_BOX = "font-family: sans-serif; font-size: 13px; line-height: 1.3"
_LINE = "white-space: nowrap"
_NOTE = "font-family: sans-serif; font-size: 11px; line-height: 1.3; color: #555"


def explorer(*, d_model=48, seed=0):
    """Sliders for ``h`` and ``d_k`` that redraw every head's weights on the example sentence.

    While "hold d_model" is ticked (the default), the ``d_k`` slider is disabled and
    follows ``d_model // h``, and the line under it says so (:func:`d_k_note`); an ``h`` that does
    not divide ``d_model`` shows the package's error message in the picture's place, at the same
    size. Untick it to set ``d_k`` freely (then
    parameters and FLOPs change with ``h·d_k``). The sliders use ``continuous_update=False``:
    dragging redraws once, on release. The layer uses the fan-in initialisation
    (:func:`explorer_layer`), so raising ``d_k`` does not wash the heads out. The colours run
    from 0 to 1 in every setting, so settings compare; tick "autoscale colours" to stretch them
    to the largest weight instead (its tooltip says so).

    Parameters
    ----------
    d_model : int, default 48
    seed : int, default 0
        Seed of the layer's random (untrained) weights.

    Returns
    -------
    ipywidgets.HBox
        Children: a ``VBox`` of fixed width (:data:`CONTROLS_WIDTH`) with the ``h`` and ``d_k``
        sliders, an ``HTML`` line under ``d_k`` (:func:`d_k_note`), the "hold d_model" and
        "autoscale colours" checkboxes and an ``HTML`` panel with the parameters, FLOPs and
        weights in large type; and an ``Image`` of fixed size (:data:`FIGSIZE` at
        :data:`WIDGET_DPI`) with the heads.

    Examples
    --------
    >>> box = explorer()
    >>> [type(w).__name__ for w in box.children]
    ['VBox', 'Image']
    >>> [type(w).__name__ for w in box.children[0].children]
    ['IntSlider', 'IntSlider', 'HTML', 'Checkbox', 'Checkbox', 'HTML']
    """
    import ipywidgets as widgets

    d_model = validate_positive_int("explorer", "d_model", d_model)
    h0 = 4 if d_model % 4 == 0 else 1
    slider_layout = widgets.Layout(width=f"{CONTROLS_WIDTH - 10}px")
    h_slider = widgets.IntSlider(value=h0, min=1, max=16, description="h",
                                 continuous_update=False, layout=slider_layout)
    d_k_slider = widgets.IntSlider(value=max(1, min(64, d_model // h0)), min=1, max=64,
                                   description="d_k", continuous_update=False, readout=True,
                                   disabled=True, layout=slider_layout)
    note = widgets.HTML(layout=widgets.Layout(width=f"{CONTROLS_WIDTH - 10}px",
                                              height=f"{NOTE_HEIGHT}px", overflow="hidden"))
    hold = widgets.Checkbox(value=True, description=HOLD_LABEL, indent=False, layout=slider_layout)
    autoscale = widgets.Checkbox(value=False, description=AUTOSCALE_LABEL,
                                 tooltip=AUTOSCALE_TOOLTIP, indent=False, layout=slider_layout)
    width, height = (round(s * WIDGET_DPI) for s in FIGSIZE)
    panel = widgets.HTML(layout=widgets.Layout(width=f"{CONTROLS_WIDTH - 10}px",
                                               height=f"{height - 140 - NOTE_HEIGHT}px",
                                               overflow="hidden"))
    image = widgets.Image(format="png", width=width, height=height,
                          layout=widgets.Layout(width=f"{width}px", height=f"{height}px",
                                                min_width=f"{width}px"))
    # One figure for the widget's life, with all 16 heatmap axes built up front: a redraw then
    # only moves axes and swaps images (see plot_heads), and memory does not grow.
    heads_fig, _ = plot_heads(np.zeros((16, len(TOKENS), len(TOKENS))), figsize=FIGSIZE)

    def redraw(change=None):
        fig, summary = draw_explorer(h_slider.value, d_k_slider.value, d_model=d_model,
                                     hold_d_model=hold.value, seed=seed,
                                     autoscale=autoscale.value, fig=heads_fig)
        image.value = figure_png(fig, dpi=WIDGET_DPI)
        text = d_k_note(d_model, h_slider.value, d_k_slider.value, hold.value)
        note.value = f"<div style='{_NOTE}'>{html.escape(text, quote=False)}</div>"
        d_k_slider.tooltip = text if hold.value else None
        panel.value = _panel_html(summary)  # last: once the numbers change, so has the picture

    def on_h(change):
        if hold.value:  # the d_k slider follows; its own observer ignores it while held
            d_k_slider.value = max(1, min(64, d_model // change["new"]))
        redraw()

    def on_d_k(change):
        if not hold.value:
            redraw()

    def on_hold(change):
        d_k_slider.disabled = change["new"]
        if change["new"]:
            d_k_slider.value = max(1, min(64, d_model // h_slider.value))
        redraw()

    h_slider.observe(on_h, names="value")
    d_k_slider.observe(on_d_k, names="value")
    hold.observe(on_hold, names="value")
    autoscale.observe(redraw, names="value")
    redraw()
    controls = widgets.VBox([h_slider, d_k_slider, note, hold, autoscale, panel],
                            layout=widgets.Layout(width=f"{CONTROLS_WIDTH}px",
                                                  min_width=f"{CONTROLS_WIDTH}px",
                                                  height=f"{height}px"))
    return widgets.HBox([controls, image],
                        layout=widgets.Layout(height=f"{height + 4}px", align_items="flex-start"))
