"""The h / d_k explorer: per-head weights, parameters, FLOPs and weights memory, with sliders.

Taught in ``notebooks/04_multi_head_attention.ipynb``.

Three layers, so each can be tested on its own:

- :func:`plot_heads` draws an (h, T, S) stack of weights as a grid of heatmaps with token labels
  on the outer axes only and ONE shared colorbar (fast enough to redraw 16 heads interactively).
- :func:`draw_explorer` is a pure function (no widgets): it builds a seeded, untrained
  :class:`~mha_course.MultiHeadAttention` on fixed toy embeddings of the example sentence and
  returns the figure and a summary dict; :func:`summary_line` prints that summary in one line.
- :func:`explorer` wraps :func:`draw_explorer` in ipywidgets sliders.

The figures are :class:`matplotlib.figure.Figure` objects that pyplot does not track, so a
redraw never leaves an open figure behind (memory stays flat while the sliders move).
"""

from __future__ import annotations

import base64
import math
import textwrap

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from ._validate import fail, validate_positive_int, validate_shape
from .cost import attention_flops, param_count
from .multihead import MultiHeadAttention
from .plotting import TOKENS, figure_png

#: Seed of the toy embeddings (fixed, so only the layer's ``seed`` changes the heads).
EMBEDDING_SEED = 2017
#: Resolution of the PNG the widget shows: 100 dpi keeps token labels legible at h = 6..16 while
#: a redraw at h = 16 stays well under 0.3 s (0.13 s measured by benchmarks/explorer_redraw.py).
WIDGET_DPI = 100

_HEAD_LABEL = "head "  # axes labels "head 1".."head h": how heads_drawn is counted
#: Size of every heads figure in inches: fixed, so the widget does not jump as h changes.
FIGSIZE = (7.5, 7.0)
# Margins and gap between panels, in inches; font size of the token labels, in points.
_LEFT, _RIGHT, _BOTTOM, _TOP, _GAP, _FONT = 0.95, 1.05, 0.9, 0.55, 0.28, 7


def toy_embeddings(d_model: int, tokens=TOKENS) -> np.ndarray:
    """Fixed random embeddings of ``tokens``, one row per token, shape (T, d_model).

    Examples
    --------
    >>> toy_embeddings(48).shape
    (11, 48)
    """
    d_model = validate_positive_int("toy_embeddings", "d_model", d_model)
    return np.random.default_rng(EMBEDDING_SEED).normal(size=(len(tokens), d_model))


def plot_heads(weights, tokens_q=TOKENS, tokens_k=None, *, titles=None, suptitle=None,
               vmax=None, fig=None):
    """Draw (h, T, S) attention weights as a grid of heatmaps with one shared colorbar.

    Token labels go on the left column (queries) and the bottom row (keys) only, the axis names
    and the colorbar appear once per figure, and the figure has a fixed size: that keeps it
    legible and fast to redraw. Pass the returned figure back as ``fig`` to redraw into it: its
    heatmap axes are kept and reused (only the images, titles and positions change), which is
    how the explorer redraws 16 heads in well under 0.3 s.

    Parameters
    ----------
    weights : ndarray, shape (h, T, S)
        One (T, S) matrix per head; rows are queries, columns keys.
    tokens_q : sequence of str, length T
        Query labels. Default: the example sentence.
    tokens_k : sequence of str, length S, optional
        Key labels. Default: ``tokens_q``.
    titles : sequence of str, length h, optional
        Panel titles; default ``"head 1"`` ... ``"head h"``.
    suptitle : str, optional
    vmax : float, optional
        Top of the shared colour scale (default 1, so figures are comparable).
    fig : matplotlib.figure.Figure, optional
        A figure returned by an earlier call, to redraw into; default a new ``Figure`` (not
        tracked by pyplot, so it needs no closing; show it with ``display(fig)``).

    Returns
    -------
    fig : matplotlib.figure.Figure
    axes : list of matplotlib Axes, length h
        The visible heatmap axes, labelled ``"head 1"`` ... (other axes: the colorbar, and
        hidden spare heatmaps kept for reuse).

    Raises
    ------
    ValueError
        If ``weights`` is not 3-D, or the labels or titles do not match its shape.

    Examples
    --------
    >>> fig, axes = plot_heads(np.full((3, 2, 2), 0.5), ["a", "b"])
    >>> len(axes), len(fig.axes)  # three heatmaps and one shared colorbar
    (3, 4)
    """
    func = "plot_heads"
    weights = np.asarray(weights)
    tokens_q = list(tokens_q)
    tokens_k = tokens_q if tokens_k is None else list(tokens_k)
    known = {"T": (len(tokens_q), "tokens_q"), "S": (len(tokens_k), "tokens_k")}
    h, T, S = validate_shape(func, "weights", weights, ("h", "T", "S"), known, batch=False).values()
    titles = [f"{_HEAD_LABEL}{i + 1}" for i in range(h)] if titles is None else list(titles)
    if len(titles) != h:
        raise fail(func, f"titles has {len(titles)} entries; expected h={h}")

    state = getattr(fig, "_heads_state", None)
    if fig is None or state is None or state["tokens"] != (tokens_q, tokens_k):
        fig = fig if fig is not None else Figure(figsize=FIGSIZE)
        fig.clear()
        fig.set_size_inches(*FIGSIZE)
        norm = Normalize(0.0, 1.0)
        state = {"tokens": (tokens_q, tokens_k), "norm": norm, "pool": [], "colorbar": None}
        fig._heads_state = state
        W, H = FIGSIZE
        # One colorbar, one name per axis, at fixed places (no layout engine: it costs a draw).
        cax = fig.add_axes([1 - 0.8 / W, _BOTTOM / H, 0.15 / W, 1 - (_BOTTOM + _TOP) / H])
        state["colorbar"] = fig.colorbar(ScalarMappable(norm, "viridis"), cax=cax,
                                         label="attention weight")
        fig.text(0.5 * (_LEFT + W - _RIGHT) / W, 0.08 / H, "key (attended to)",
                 ha="center", va="bottom", fontsize=_FONT + 1)
        fig.text(0.08 / W, 0.5 * (_BOTTOM + H - _TOP) / H, "query (attending)", rotation=90,
                 ha="left", va="center", fontsize=_FONT + 1)
    pool, norm = state["pool"], state["norm"]
    norm.vmax = 1.0 if vmax is None else float(vmax)
    while len(pool) < h:  # build heatmap axes only once per figure; later calls reuse them
        ax = fig.add_axes([0, 0, 1, 1], label=f"{_HEAD_LABEL}{len(pool) + 1}")
        img = ax.imshow(np.zeros((T, S)), cmap="viridis", norm=norm, interpolation="nearest")
        ax.xaxis.set_visible(False)  # no ticks at all; the labels are the texts below
        ax.yaxis.set_visible(False)
        # Token labels as plain text artists, not tick labels: the tick machinery (locators,
        # tick lines, label bounding boxes) would double the redraw time of 16 panels.
        xs = [ax.text(j, -0.03, tok, transform=ax.get_xaxis_transform(), rotation=90,
                      ha="center", va="top", fontsize=_FONT) for j, tok in enumerate(tokens_k)]
        ys = [ax.text(-0.03, t, tok, transform=ax.get_yaxis_transform(), ha="right",
                      va="center", fontsize=_FONT) for t, tok in enumerate(tokens_q)]
        pool.append((ax, img, xs, ys))

    # Near-square grid, panels of equal size centred in the space between fixed margins.
    W, H = FIGSIZE
    ncols = math.ceil(math.sqrt(h))
    nrows = math.ceil(h / ncols)
    free_w, free_h = W - _LEFT - _RIGHT, H - _BOTTOM - _TOP
    cell = min((free_w - _GAP * (ncols - 1)) / ncols,
               (free_h - _GAP * (nrows - 1)) / nrows * S / T)
    cell_w, cell_h = cell, cell * T / S
    x0 = _LEFT + (free_w - ncols * cell_w - _GAP * (ncols - 1)) / 2
    y_top = H - _TOP - (free_h - nrows * cell_h - _GAP * (nrows - 1)) / 2
    font = {1: _FONT + 3, 2: _FONT + 2}.get(ncols, _FONT)  # bigger labels on bigger panels
    axes = []
    for i, (ax, img, xs, ys) in enumerate(pool):
        if i >= h:
            ax.set_visible(False)
            continue
        r, c = divmod(i, ncols)
        left = x0 + c * (cell_w + _GAP)
        bottom = y_top - (r + 1) * cell_h - r * _GAP
        ax.set_position([left / W, bottom / H, cell_w / W, cell_h / H])
        ax.set_visible(True)
        img.set_data(weights[i])
        # A fixed title height skips matplotlib's per-axes title placement (a costly step).
        ax.set_title(titles[i], fontsize=font + 1, y=1.0, pad=3)
        for texts, show in ((xs, i + ncols >= h), (ys, c == 0)):
            # key labels under the last panel of each column, query labels left of the first
            for text in texts:
                text.set_visible(show)
                if show and text.get_fontsize() != font:
                    text.set_fontsize(font)
        axes.append(ax)
    fig.suptitle(suptitle or "", y=1 - 0.1 / H, va="top", fontsize=11)
    return fig, axes


def _error_figure(message: str) -> Figure:
    fig = Figure(figsize=(8.0, 2.2))
    text = "\n".join(textwrap.wrap(message, 70))
    fig.text(0.5, 0.62, text, ha="center", va="center", fontsize=11, color="firebrick",
             family="monospace")
    fig.text(0.5, 0.2, "Choose an h that divides d_model, or untick 'hold d_model fixed'\n"
             "and set d_k yourself.", ha="center", va="center", fontsize=10)
    return fig


def draw_explorer(h, d_k, *, d_model=48, hold_d_model=True, seed=0, fig=None):
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
    fig : matplotlib.figure.Figure, optional
        A heads figure from an earlier call to redraw into (see :func:`plot_heads`); the
        explorer passes its own so a redraw only updates images. Default: a new figure.

    Returns
    -------
    fig : matplotlib.figure.Figure
        Not registered with pyplot: nothing to close. When ``h`` does not divide a held
        ``d_model``, a small new figure that shows the error (``fig`` is left as it was).
    summary : dict
        ``h``, ``d_k``, ``d_model``, ``heads_drawn`` (counted from the figure's heatmap axes),
        ``param_count``, ``flops`` (the :func:`~mha_course.attention_flops` dict),
        ``weights_shape`` (h, T, T), ``weights_values`` (h·T·T), ``weights`` (the array) and
        ``error`` (None, or the message shown instead of heatmaps).

    Raises
    ------
    ValueError
        If ``h``, ``d_k`` (when used) or ``d_model`` is not a positive integer.

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
    summary = {"h": h, "d_k": d_k, "d_model": d_model, "heads_drawn": 0, "param_count": None,
               "flops": None, "weights_shape": None, "weights_values": 0, "weights": None,
               "error": None}
    try:
        layer = MultiHeadAttention(d_model, h, d_k, rng=seed)
    except ValueError as exc:  # e.g. h does not divide d_model while d_model is held
        summary["error"] = str(exc)
        return _error_figure(str(exc)), summary
    _, weights = layer(toy_embeddings(d_model))  # (h, T, T)
    fig, _ = plot_heads(
        weights,
        fig=fig,
        suptitle=f"untrained heads on the example sentence: h={h}, d_k={layer.d_k}, "
                 f"d_model={d_model}",
    )
    summary.update(
        d_k=layer.d_k,
        heads_drawn=sum(1 for ax in fig.axes if ax.get_visible() and ax.images
                        and ax.get_label().startswith(_HEAD_LABEL)),
        param_count=param_count(d_model, h, layer.d_k),
        flops=attention_flops(len(TOKENS), d_model, h, layer.d_k),
        weights_shape=weights.shape,
        weights_values=int(weights.size),
        weights=weights,
    )
    return fig, summary


def summary_line(summary) -> str:
    """One line that says what :func:`draw_explorer` drew.

    Examples
    --------
    >>> summary_line(draw_explorer(h=4, d_k=12)[1])  # doctest: +NORMALIZE_WHITESPACE
    'h=4  d_k=12  d_model=48 | heads drawn: 4 | parameters: 9,216 | FLOPs total: 225,984 |
     weights (h, T, T) = (4, 11, 11) = 484 values'
    """
    d_k = "-" if summary["d_k"] is None else summary["d_k"]
    head = f"h={summary['h']}  d_k={d_k}  d_model={summary['d_model']}"
    if summary.get("error"):
        return f"{head} | heads drawn: {summary['heads_drawn']} | error: {summary['error']}"
    return (
        f"{head} | heads drawn: {summary['heads_drawn']} | "
        f"parameters: {summary['param_count']:,} | "
        f"FLOPs total: {summary['flops']['total']:,} | "
        f"weights (h, T, T) = {tuple(summary['weights_shape'])} = "
        f"{summary['weights_values']:,} values"
    )


def _outputs(summary, png: bytes) -> tuple[dict, ...]:
    """The Output widget's content: the summary line as text, then the figure as a PNG."""
    return (
        {"output_type": "stream", "name": "stdout", "text": summary_line(summary) + "\n"},
        {
            "output_type": "display_data",
            "data": {"image/png": base64.b64encode(png).decode("ascii"),
                     "text/plain": "<explorer figure>"},
            "metadata": {},
        },
    )


def explorer(*, d_model=48, seed=0):
    """Sliders for ``h`` and ``d_k`` that redraw every head's weights on the example sentence.

    While "hold d_model fixed" is ticked (the default), the ``d_k`` slider is disabled and
    follows ``d_model // h``; an ``h`` that does not divide ``d_model`` shows the package's error
    message. Untick it to set ``d_k`` freely (then parameters and FLOPs change with ``h·d_k``).
    The sliders use ``continuous_update=False``: dragging redraws once, on release.

    Parameters
    ----------
    d_model : int, default 48
    seed : int, default 0
        Seed of the layer's random (untrained) weights.

    Returns
    -------
    ipywidgets.VBox
        Children: a row with the ``h`` and ``d_k`` sliders, the checkbox, and an ``Output``
        that shows :func:`summary_line` and the figure.

    Examples
    --------
    >>> box = explorer()
    >>> [type(w).__name__ for w in box.children]
    ['HBox', 'Checkbox', 'Output']
    """
    import ipywidgets as widgets

    d_model = validate_positive_int("explorer", "d_model", d_model)
    h0 = 4 if d_model % 4 == 0 else 1
    h_slider = widgets.IntSlider(value=h0, min=1, max=16, description="h",
                                 continuous_update=False)
    d_k_slider = widgets.IntSlider(value=max(1, min(64, d_model // h0)), min=1, max=64,
                                   description="d_k", continuous_update=False, readout=True,
                                   disabled=True)
    hold = widgets.Checkbox(value=True, description="hold d_model fixed (d_k = d_model / h)",
                            indent=False)
    out = widgets.Output()
    # One figure for the widget's life, with all 16 heatmap axes built up front: a redraw then
    # only moves axes and swaps images (see plot_heads), and memory does not grow.
    heads_fig, _ = plot_heads(np.zeros((16, len(TOKENS), len(TOKENS))))

    def redraw(change=None):
        fig, summary = draw_explorer(h_slider.value, d_k_slider.value, d_model=d_model,
                                     hold_d_model=hold.value, seed=seed, fig=heads_fig)
        out.outputs = _outputs(summary, figure_png(fig))  # one update: no flicker

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
    redraw()
    return widgets.VBox([widgets.HBox([h_slider, d_k_slider]), hold, out])
