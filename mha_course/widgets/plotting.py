"""Figures shared by the lessons: attention-weight heatmaps with token labels.

Used from ``notebooks/03_single_head_attention.ipynb`` on: one heatmap (:func:`plot_weights`),
panels side by side (:func:`plot_weights_panels`), a grid of heads with one colorbar that can be
redrawn in place (:func:`plot_heads`, the explorer's picture), and :func:`figure_png` for the
widgets. Only this module and the widget modules (``explorer``, ``stepper``, ``cache_memory``)
import matplotlib.
"""

from __future__ import annotations

import io
import math
import textwrap

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from .._validate import fail, validate_shape

#: The example sentence of the source article, used by lessons 03 and 04 and the explorer.
SENTENCE = "the animal didn't cross the street because it was too tired"
#: The sentence split on spaces: 11 tokens.
TOKENS = tuple(SENTENCE.split())
#: Default size of a :func:`plot_heads` figure in inches.
HEADS_FIGSIZE = (7.5, 7.0)
#: :func:`plot_heads` labels its heatmap axes "head 1".."head h" (how a caller counts them).
HEAD_LABEL = "head "
# plot_heads' margins in inches (left: query labels, right: colorbar, bottom: key labels, top:
# title) and the smallest gap between panels.
_LEFT, _RIGHT, _BOTTOM, _TOP, _GAP = 0.75, 0.85, 0.7, 0.42, 0.16
# The colorbar sits this far right of the grid, this wide; the axis names this far outside the
# token labels (inches), so the picture stays one block, whatever the grid.
_CB_GAP, _CB_WIDTH, _NAME_GAP = 0.15, 0.14, 0.08


def plot_weights(weights, tokens_q=TOKENS, tokens_k=None, ax=None, title=None,
                 colorbar=True, vmax=None):
    """Draw one (T, S) matrix of attention weights as a heatmap with token labels.

    Parameters
    ----------
    weights : ndarray, shape (T, S)
        Rows are queries, columns keys.
    tokens_q : sequence of str, length T
        Query labels (y axis). Default: the example sentence.
    tokens_k : sequence of str, length S, optional
        Key labels (x axis). Default: ``tokens_q``.
    ax : matplotlib Axes, optional
        Where to draw; default a new figure.
    title : str, optional
    colorbar : bool, default True
        Add a colorbar labelled "attention weight".
    vmax : float, optional
        Top of the colour scale (default 1, so heatmaps are comparable).

    Returns
    -------
    matplotlib.image.AxesImage

    Raises
    ------
    ValueError
        If ``weights`` is not 2-D or the labels do not match its shape.

    Examples
    --------
    >>> img = plot_weights(np.full((2, 3), 1 / 3), ["a", "b"], ["x", "y", "z"])
    >>> img.get_array().shape
    (2, 3)
    >>> plt.close("all")
    """
    func = "plot_weights"
    weights = np.asarray(weights)
    tokens_k = tokens_q if tokens_k is None else tokens_k
    validate_shape(func, "weights", weights, ("T", "S"),
                {"T": (len(tokens_q), "tokens_q"), "S": (len(tokens_k), "tokens_k")}, batch=False)
    if ax is None:
        _, ax = plt.subplots(figsize=(0.45 * len(tokens_k) + 2, 0.4 * len(tokens_q) + 1.5))
    elif not hasattr(ax, "imshow"):
        raise fail(func, f"ax must be a matplotlib Axes, got {type(ax).__name__}")
    img = ax.imshow(weights, cmap="viridis", vmin=0, vmax=1 if vmax is None else vmax)
    ax.set_xticks(range(len(tokens_k)), labels=tokens_k, rotation=60, ha="right")
    ax.set_yticks(range(len(tokens_q)), labels=tokens_q)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(img, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    return img


def plot_weights_panels(panels, tokens_q=TOKENS, tokens_k=None, titles=None, suptitle=None,
                        vmax=None, figsize=None, spacing=None):
    """Draw several (T, S) weight matrices side by side on one colour scale and one colorbar.

    Used to compare masks (unmasked, causal, padded) or the sequences of a padded batch.

    Parameters
    ----------
    panels : sequence of ndarray, each shape (T, S), or ndarray of shape (P, T, S)
        The matrices to draw, left to right.
    tokens_q : sequence of str, or sequence of P such sequences
        Query labels (y axis): one list shared by every panel, or one list per panel (for a
        padded batch, whose sequences differ). Default: the example sentence.
    tokens_k : same forms as ``tokens_q``, optional
        Key labels (x axis). Default: ``tokens_q``.
    titles : sequence of str, length P, optional
        One title per panel.
    suptitle : str, optional
        A title over the whole figure.
    vmax : float, optional
        Top of the shared colour scale (default 1).
    figsize : (float, float), optional
        The figure's size in inches; default about 0.38 inch per cell plus room for labels.
    spacing : dict, optional
        Padding for the constrained layout (``w_pad``, ``h_pad``, ``wspace``, ``hspace``, in
        inches or fractions as matplotlib takes them), for panels that need more air.

    Returns
    -------
    fig : matplotlib.figure.Figure
    axes : list of matplotlib Axes, length P

    Raises
    ------
    ValueError
        If there are no panels, the number of titles or label lists differs from the number of
        panels, or a panel's shape does not match its labels.

    Examples
    --------
    >>> fig, axes = plot_weights_panels(np.full((2, 3, 3), 1 / 3), ["a", "b", "c"],
    ...                                 titles=["first", "second"])
    >>> len(axes), len(fig.axes)  # two heatmaps and one shared colorbar
    (2, 3)
    >>> plt.close("all")
    """
    func = "plot_weights_panels"
    panels = [np.asarray(p) for p in panels]
    P = len(panels)
    if P == 0:
        raise fail(func, "panels is empty; expected at least one (T, S) matrix")

    def per_panel(name, labels):
        # One shared list of str, or one list per panel.
        if len(labels) and not isinstance(labels[0], str):
            if len(labels) != P:
                raise fail(func, f"{name} has {len(labels)} label lists; expected P={P}")
            return [list(lab) for lab in labels]
        return [list(labels)] * P

    qs = per_panel("tokens_q", tokens_q)
    ks = qs if tokens_k is None else per_panel("tokens_k", tokens_k)
    if titles is not None and len(titles) != P:
        raise fail(func, f"titles has {len(titles)} entries; expected P={P}")
    T_max = max(len(q) for q in qs)
    S_max = max(len(k) for k in ks)
    if figsize is None:
        figsize = (P * (0.38 * S_max + 1.5) + 1.2, 0.38 * T_max + 2.0)
    fig, axes = plt.subplots(1, P, figsize=figsize, squeeze=False, layout="constrained")
    if spacing:
        fig.get_layout_engine().set(**spacing)
    axes = list(axes[0])
    for p, ax in enumerate(axes):
        img = plot_weights(panels[p], qs[p], ks[p], ax=ax, colorbar=False, vmax=vmax,
                           title=None if titles is None else titles[p])
        if p:
            ax.set_ylabel("")
    fig.colorbar(img, ax=axes, fraction=0.046 / P, pad=0.02, label="attention weight")
    if suptitle:
        fig.suptitle(suptitle)
    return fig, axes


def figure_png(fig, dpi: float = 100) -> bytes:
    """Render ``fig`` to PNG bytes: what the widget shows.

    ``fig`` is not tracked by pyplot, so once dropped it is freed like any Python object (no
    ``plt.close`` needed, and no ``fig.clear()``, which would cost as much as drawing it).
    """
    buf = io.BytesIO()
    # Light compression: the PNG is a little larger, and encoding it several times faster.
    fig.savefig(buf, format="png", dpi=dpi, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


def grid_shape(h: int, width: float, height: float, aspect: float = 1.0) -> tuple[int, int]:
    """(rows, columns) that give ``h`` panels of height/width ``aspect`` the most room.

    Among layouts whose panels are within 5 % of the largest, the one with the fewest empty
    slots wins (3 heads: one row of three, not a 2 x 2 grid with an empty corner).

    Examples
    --------
    >>> grid_shape(3, 5.3, 3.6), grid_shape(4, 5.3, 3.6), grid_shape(16, 5.3, 3.6)
    ((1, 3), (2, 2), (3, 6))
    """
    options = []
    for ncols in range(1, h + 1):
        nrows = math.ceil(h / ncols)
        cell = min((width - _GAP * (ncols - 1)) / ncols,
                   (height - 2 * _GAP * (nrows - 1)) / nrows / aspect)
        options.append((cell, nrows * ncols - h, nrows, ncols))
    best = max(cell for cell, *_ in options)
    good = [(empty, -cell, nrows, ncols) for cell, empty, nrows, ncols in options
            if cell >= 0.95 * best]
    _, _, nrows, ncols = min(good)
    return nrows, ncols


def plot_heads(weights, tokens_q=TOKENS, tokens_k=None, *, titles=None, suptitle=None,
               vmax=None, fig=None, figsize=None, colorbar_label="attention weight"):
    """Draw (h, T, S) attention weights as a grid of heatmaps with one shared colorbar.

    Token labels go on the left column (queries) and the bottom row (keys) only, the axis names
    and the colorbar appear once per figure, and the figure has a fixed size: that keeps it
    legible and fast to redraw. The grid is chosen by :func:`grid_shape`. Pass the returned
    figure back as ``fig`` to redraw into it: its heatmap axes are kept and reused (only the
    images, titles and positions change), which is how the explorer redraws 16 heads quickly.

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
    figsize : (float, float), optional
        Size of a new figure in inches; default :data:`HEADS_FIGSIZE`.
    colorbar_label : str, default "attention weight"

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
    titles = [f"{HEAD_LABEL}{i + 1}" for i in range(h)] if titles is None else list(titles)
    if len(titles) != h:
        raise fail(func, f"titles has {len(titles)} entries; expected h={h}")

    state = getattr(fig, "_heads_state", None)
    if fig is None or state is None or state["tokens"] != (tokens_q, tokens_k):
        size = tuple(figsize or (fig.get_size_inches() if fig is not None else HEADS_FIGSIZE))
        fig = fig if fig is not None else Figure(figsize=size)
        fig.clear()
        fig.set_size_inches(*size)
        state = _build_heads_figure(fig, tokens_q, tokens_k, colorbar_label)
    pool, norm = state["pool"], state["norm"]
    norm.vmax = 1.0 if vmax is None else float(vmax)
    state["colorbar"].update_normal(state["colorbar"].mappable)
    state["message"].set_visible(False)
    for artist in state["frame"]:
        artist.set_visible(True)
    while len(pool) < h:  # build heatmap axes only once per figure; later calls reuse them
        pool.append(_new_heatmap(fig, len(pool), T, S, tokens_q, tokens_k, norm))

    # The grid with the most room, panels of equal size centred between fixed margins.
    W, H = state["size"]
    free_w, free_h = W - _LEFT - _RIGHT, H - _BOTTOM - _TOP
    nrows, ncols = grid_shape(h, free_w, free_h, aspect=T / S)
    gap_w, gap_h = _GAP, 2 * _GAP  # rows need room for the panel titles
    cell = min((free_w - gap_w * (ncols - 1)) / ncols,
               (free_h - gap_h * (nrows - 1)) / nrows * S / T)
    cell_w, cell_h = cell, cell * T / S
    x0 = _LEFT + (free_w - ncols * cell_w - gap_w * (ncols - 1)) / 2
    y_top = H - _TOP - (free_h - nrows * cell_h - gap_h * (nrows - 1)) / 2
    # Labels as large as a panel's rows allow, between 5 and 8 points.
    font = max(5.0, min(8.0, 0.8 * 72 * cell_h / T))
    _place_frame(state, x0, y_top, ncols * cell_w + gap_w * (ncols - 1),
                 nrows * cell_h + gap_h * (nrows - 1), font, tokens_q, tokens_k)
    axes = []
    for i, (ax, img, xs, ys) in enumerate(pool):
        if i >= h:
            ax.set_visible(False)
            continue
        r, c = divmod(i, ncols)
        left = x0 + c * (cell_w + gap_w)
        bottom = y_top - (r + 1) * cell_h - r * gap_h
        ax.set_position([left / W, bottom / H, cell_w / W, cell_h / H])
        ax.set_visible(True)
        img.set_data(weights[i])
        # A fixed title height skips matplotlib's per-axes title placement (a costly step).
        ax.set_title(titles[i], fontsize=min(font + 1, 10), y=1.0, pad=2)
        for texts, show in ((xs, i + ncols >= h), (ys, c == 0)):
            # key labels under the last panel of each column, query labels left of the first
            for text in texts:
                text.set_visible(show)
                if show and text.get_fontsize() != font:
                    text.set_fontsize(font)
        axes.append(ax)
    fig.suptitle(suptitle or "", y=1 - 0.08 / H, va="top", fontsize=10)
    return fig, axes


def _place_frame(state, x0, y_top, grid_w, grid_h, font, tokens_q, tokens_k) -> None:
    """Put the colorbar beside the grid and the axis names just outside its token labels."""
    W, H = state["size"]
    cax, key_name, query_name = state["frame"]
    cax.set_position([(x0 + grid_w + _CB_GAP) / W, (y_top - grid_h) / H, _CB_WIDTH / W,
                      grid_h / H])
    # a token label is about 0.6 em wide per character, at `font` points (72 to the inch)
    label = 0.6 * font / 72 * max(len(t) for t in (*tokens_q, *tokens_k)) + 0.05
    query_name.set_position(((x0 - label - _NAME_GAP) / W, (y_top - grid_h / 2) / H))
    key_y = max(y_top - grid_h - label - _NAME_GAP, 0.16)  # never below the figure's edge
    key_name.set_position(((x0 + grid_w / 2) / W, key_y / H))


def _build_heads_figure(fig, tokens_q, tokens_k, colorbar_label) -> dict:
    """The parts of a heads figure that never move: colorbar, axis names, the message text."""
    W, H = fig.get_size_inches()
    norm = Normalize(0.0, 1.0)
    # One colorbar, one name per axis, at fixed places (no layout engine: it costs a draw).
    cax = fig.add_axes([1 - 0.68 / W, _BOTTOM / H, 0.14 / W, 1 - (_BOTTOM + _TOP) / H])
    colorbar = fig.colorbar(ScalarMappable(norm, "viridis"), cax=cax)
    colorbar.set_label(colorbar_label, fontsize=9)
    colorbar.ax.tick_params(labelsize=8)
    # placed for each grid by _place_frame: beside the grid, not at the figure's edges
    names = [fig.text(0.5, 0.04 / H, "key (attended to)", ha="center", va="top", fontsize=8),
             fig.text(0.06 / W, 0.5, "query (attending)", rotation=90, ha="right",
                      va="center", fontsize=8)]
    message = fig.text(0.5, 0.5, "", ha="center", va="center", fontsize=10, color="firebrick",
                       family="monospace", visible=False)
    state = {"tokens": (tokens_q, tokens_k), "norm": norm, "pool": [], "colorbar": colorbar,
             "message": message, "size": (W, H), "frame": [cax, *names]}
    fig._heads_state = state
    return state


def _new_heatmap(fig, index, T, S, tokens_q, tokens_k, norm):
    ax = fig.add_axes([0, 0, 1, 1], label=f"{HEAD_LABEL}{index + 1}")
    img = ax.imshow(np.zeros((T, S)), cmap="viridis", norm=norm, interpolation="nearest",
                    aspect="auto")
    ax.xaxis.set_visible(False)  # no ticks at all; the labels are the texts below
    ax.yaxis.set_visible(False)
    # Token labels as plain text artists, not tick labels: the tick machinery (locators,
    # tick lines, label bounding boxes) would double the redraw time of 16 panels.
    xs = [ax.text(j, -0.03, tok, transform=ax.get_xaxis_transform(), rotation=90,
                  ha="center", va="top", fontsize=7) for j, tok in enumerate(tokens_k)]
    ys = [ax.text(-0.03, t, tok, transform=ax.get_yaxis_transform(), ha="right",
                  va="center", fontsize=7) for t, tok in enumerate(tokens_q)]
    return ax, img, xs, ys


def show_message(fig, message: str, hint: str = "") -> Figure:
    """Hide every heatmap of a heads figure and show ``message`` in its place (same size)."""
    if getattr(fig, "_heads_state", None) is None:
        fig, _ = plot_heads(np.zeros((1, len(TOKENS), len(TOKENS))), fig=fig)
    state = fig._heads_state
    for ax, *_ in state["pool"]:
        ax.set_visible(False)
    for artist in state["frame"]:  # the colorbar and the axis names: nothing to name
        artist.set_visible(False)
    text = "\n".join(textwrap.wrap(message, 48)) + (f"\n\n{hint}" if hint else "")
    state["message"].set_text(text)
    state["message"].set_visible(True)
    fig.suptitle("")
    return fig
