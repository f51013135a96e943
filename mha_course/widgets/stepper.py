"""The attention stepper: scores -> scaled -> masked -> weights -> output, one panel per step.

Taught in ``notebooks/03_single_head_attention.ipynb``.

One head on a short padded sentence, every intermediate array of
``softmax(mask(q kᵀ / (√d_k · τ))) v`` drawn side by side on ONE colour scale, so a colour means
the same number in every panel: the learner sees the division by √d_k shrink the scores, the
mask replace entries by −∞, the softmax turn each row into numbers in [0, 1], and the output
come out the size of the values.

The colour scale is diverging (blue negative, white 0, red positive) and symmetric-logarithmic:
linear between −1 and 1, logarithmic from 1 to :data:`COLOUR_LIMIT`. Linear where the weights
live (a weight of 0.5 is half-way to full colour, not a faint tint), logarithmic beyond, so the
unscaled scores (several times larger) still fit without clipping. Every cell also prints its
number; −∞ (masked) is drawn grey.

Three layers, as in :mod:`mha_course.widgets.explorer`:

- :func:`attention_intermediates` computes the five arrays (the softmax and the weighted sum are
  the package's :func:`~mha_course.scaled_dot_product_attention`);
- :func:`draw_stepper` is a pure function that draws them and returns the figure and a summary
  dict; :func:`stepper_summary_line` prints that summary in one line (what nbval checks);
- :func:`stepper_widget` wraps it in controls (√d_k on/off, temperature, mask).
"""

from __future__ import annotations

import html
import math

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import ListedColormap, SymLogNorm
from matplotlib.figure import Figure

from .._validate import fail, validate_positive_int
from ..attention import causal_mask, padding_mask, scaled_dot_product_attention
from .plotting import figure_png

#: The sentence the stepper attends over: four words padded to six positions.
STEPPER_TOKENS = ("the", "animal", "was", "tired", "<pad>", "<pad>")
#: Real tokens before the padding.
STEPPER_LENGTH = 4
#: Widths of the token vectors, queries/keys and values (d_k = 16, so √d_k = 4).
D_MODEL, D_K, D_V = 16, 16, 4
#: The masks the stepper offers.
MASKS = ("none", "causal", "padding")
#: The temperatures the widget offers (any positive number works in :func:`draw_stepper`).
TEMPERATURES = (0.25, 0.5, 1.0, 2.0, 4.0)
#: The colour scale runs from -COLOUR_LIMIT to +COLOUR_LIMIT (symmetric-log, linear within ±1).
COLOUR_LIMIT = 16.0
#: Size of the figure in inches and the resolution of the widget's PNG: 960 x 320 pixels.
FIGSIZE = (9.6, 3.2)
DPI = 100
STEPS = ("scores", "scaled", "masked", "weights", "output")

_CMAP = "RdBu_r"
_MASKED_COLOUR = "0.72"  # grey: not a number on the scale
# Layout in inches: left margin (query labels), gap between panels, right margin (colorbar),
# bottom margin (key labels), top margin (titles); font size of the cell numbers.
_LEFT, _GAP, _RIGHT, _BOTTOM, _TOP = 0.5, 0.12, 0.8, 0.7, 0.72
# A cell's number has at most 4 characters ("-2.4", ".35", "−∞"); the font makes 4 characters
# and some air exactly one cell wide (review D42: the numbers were 6 pt at notebook width).
_CHARS = 4.6
_MONO_ADVANCE = 0.602  # width of a DejaVu Sans Mono character, in ems
_LABEL_FONT = 8  # token labels, colorbar ticks


def stepper_inputs(seed: int = 0) -> dict:
    """Queries, keys and values of one untrained head on :data:`STEPPER_TOKENS`.

    The token vectors have unit-variance entries and ``W_q``, ``W_k``, ``W_v`` entries of
    variance ``1 / d_model``, so queries and keys have entries of variance about 1 and the raw
    scores ``q·k`` a standard deviation of about ``√d_k = 4`` (lesson 03, §4a). Both ``<pad>``
    positions share one random vector.

    Parameters
    ----------
    seed : int, default 0

    Returns
    -------
    dict
        ``q`` (T, d_k), ``k`` (T, d_k), ``v`` (T, d_v), ``tokens`` (length T), ``length``.

    Raises
    ------
    ValueError
        If ``seed`` is not a non-negative integer.

    Examples
    --------
    >>> inputs = stepper_inputs()
    >>> inputs["q"].shape, inputs["v"].shape, inputs["length"]
    ((6, 16), (6, 4), 4)
    """
    seed = validate_positive_int("stepper_inputs", "seed", seed, minimum=0)
    rng = np.random.default_rng(seed)
    T = len(STEPPER_TOKENS)
    x = rng.normal(size=(T, D_MODEL))  # (T, d_model)
    x[STEPPER_LENGTH:] = x[STEPPER_LENGTH]  # every <pad> is the same token
    W_q, W_k, W_v = (rng.normal(scale=1 / math.sqrt(D_MODEL), size=(D_MODEL, d))
                     for d in (D_K, D_K, D_V))
    return {"q": x @ W_q, "k": x @ W_k, "v": x @ W_v,  # (T, d_k), (T, d_k), (T, d_v)
            "tokens": STEPPER_TOKENS, "length": STEPPER_LENGTH}


def stepper_mask(kind: str, T: int = len(STEPPER_TOKENS), length: int = STEPPER_LENGTH):
    """The boolean mask named by ``kind``: None, causal (T, T), or padding (1, T).

    Raises
    ------
    ValueError
        If ``kind`` is not one of :data:`MASKS`.

    Examples
    --------
    >>> stepper_mask("padding").astype(int)
    array([[1, 1, 1, 1, 0, 0]])
    """
    if kind not in MASKS:
        raise fail("stepper_mask", f"kind={kind!r}; expected one of {', '.join(MASKS)}")
    if kind == "none":
        return None
    if kind == "causal":
        return causal_mask(T)  # (T, T)
    return padding_mask([length], T)[0]  # (1, 1, S) -> (1, S): broadcasts over the queries


def attention_intermediates(q, k, v, *, scale=True, temperature=1.0, mask=None) -> dict:
    """Every intermediate array of one attention head, in order.

    ``scores = q kᵀ``; ``scaled = scores / (√d_k · τ)`` (or ``scores / τ`` with ``scale=False``);
    ``masked`` = ``scaled`` with −∞ where ``mask`` is False; ``weights = softmax(masked)`` by
    row; ``output = weights v``.

    Parameters
    ----------
    q : ndarray, shape (T, d_k)
    k : ndarray, shape (S, d_k)
    v : ndarray, shape (S, d_v)
    scale : bool, default True
        Divide by √d_k.
    temperature : float, default 1.0
        τ > 0: divides the scores too (τ < 1 sharpens the weights, τ > 1 flattens them).
    mask : ndarray of bool, broadcastable to (T, S), optional
        True where a query may attend to a key.

    Returns
    -------
    dict
        ``scores``, ``scaled``, ``masked`` and ``weights`` (T, S); ``output`` (T, d_v);
        ``divisor`` (the number the scores were divided by).

    Raises
    ------
    ValueError
        If ``temperature`` is not a positive number, or the shapes or mask do not fit (raised by
        :func:`~mha_course.scaled_dot_product_attention`, which names what it got).

    Examples
    --------
    >>> inputs = stepper_inputs()
    >>> steps = attention_intermediates(inputs["q"], inputs["k"], inputs["v"],
    ...                                 mask=stepper_mask("causal"))
    >>> steps["weights"].shape, steps["output"].shape, steps["divisor"]
    ((6, 6), (6, 4), 4.0)
    """
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating)) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise fail("attention_intermediates",
                   f"temperature={temperature!r}; expected a number > 0")
    q, k = np.asarray(q, dtype=float), np.asarray(k, dtype=float)
    d_k = q.shape[-1]
    divisor = (math.sqrt(d_k) if scale else 1.0) * float(temperature)
    # The package's one attention path does the softmax and the weighted sum. It divides by
    # √d_k itself, so q is rescaled to make its softmax input exactly scores / divisor.
    output, weights = scaled_dot_product_attention(q * (math.sqrt(d_k) / divisor), k, v, mask)
    scores = q @ k.T  # (T, d_k) @ (d_k, S) -> (T, S)
    scaled = scores / divisor
    masked = scaled if mask is None else np.where(mask, scaled, -np.inf)  # (T, S)
    return {"scores": scores, "scaled": scaled, "masked": masked, "weights": weights,
            "output": output, "divisor": divisor}


def _fmt(value: float, step: str) -> str:
    """A cell's number, at most four characters wide: '−∞', '.35', '1.0', '-2.4', '13'."""
    if not np.isfinite(value):
        return "−∞"
    if step == "weights":
        if value == 0:
            return "0"
        return "1" if value >= 0.995 else f"{value:.2f}".lstrip("0")
    if abs(value) >= 9.95:
        return f"{value:.0f}"
    return f"{value:.1f}".replace("-0.0", "0.0")


def _build(fig: Figure, tokens, d_v: int) -> dict:
    """Axes, images and texts of the five panels; built once per figure, then updated."""
    W, H = FIGSIZE
    T = len(tokens)
    norm = SymLogNorm(linthresh=1.0, linscale=2.0, vmin=-COLOUR_LIMIT, vmax=COLOUR_LIMIT, base=16)
    # RdBu_r without its darkest ends, so black digits stay readable on every cell.
    cmap = ListedColormap(colormaps[_CMAP](np.linspace(0.1, 0.9, 256)), name="stepper")
    cmap = cmap.with_extremes(bad=_MASKED_COLOUR)
    columns = [T, T, T, T, d_v]
    free_w = W - _LEFT - _RIGHT - _GAP * (len(columns) - 1)
    cell = min(free_w / sum(columns), (H - _BOTTOM - _TOP) / T)
    # One text artist per cell, centred in it: the font size makes _CHARS characters exactly
    # one cell wide, so the numbers are as large as the cells allow.
    font = cell * 72 / (_CHARS * _MONO_ADVANCE)
    x = _LEFT
    panels = []
    for step, n_cols in zip(STEPS, columns, strict=True):
        ax = fig.add_axes([x / W, _BOTTOM / H, n_cols * cell / W, T * cell / H], label=step)
        img = ax.imshow(np.zeros((T, n_cols)), cmap=cmap, norm=norm, interpolation="nearest",
                        aspect="auto")
        ax.xaxis.set_visible(False)
        ax.yaxis.set_visible(False)
        # thin white lines between the cells, so that two 4-character numbers never touch
        ax.vlines(np.arange(n_cols - 1) + 0.5, -0.5, T - 0.5, colors="white", linewidths=0.8)
        ax.hlines(np.arange(T - 1) + 0.5, -0.5, n_cols - 0.5, colors="white", linewidths=0.8)
        cells = [[ax.text(j, i, "", ha="center", va="center", fontsize=font,
                          family="monospace") for j in range(n_cols)] for i in range(T)]
        keys = [f"v{j}" for j in range(n_cols)] if step == "output" else tokens
        for j, label in enumerate(keys):
            ax.text(j, T - 0.4, label, ha="center", va="top", rotation=90, fontsize=_LABEL_FONT)
        if step == "scores":
            for i, label in enumerate(tokens):
                ax.text(-0.6, i, label, ha="right", va="center", fontsize=_LABEL_FONT)
        panels.append({"ax": ax, "img": img, "cells": cells})
        x += n_cols * cell + _GAP
    cax = fig.add_axes([(W - _RIGHT + 0.2) / W, _BOTTOM / H, 0.12 / W, T * cell / H])
    bar = fig.colorbar(ScalarMappable(norm, cmap), cax=cax)
    ticks = [-16, -4, -1, 0, 0.5, 1, 4, 16]
    bar.set_ticks(ticks, labels=[f"{t:g}" for t in ticks])
    bar.ax.tick_params(labelsize=_LABEL_FONT - 1)
    bar.set_label("value (grey: −∞)", fontsize=_LABEL_FONT - 1)
    fig.text(_LEFT / W, 0.03, "rows: queries · columns: keys (output: value features)",
             fontsize=_LABEL_FONT - 1, va="bottom")
    return {"panels": panels, "tokens": tuple(tokens), "d_v": d_v}


def draw_stepper(scale=True, temperature=1.0, mask="none", *, seed=0, fig=None):
    """Draw the five steps of one head on :data:`STEPPER_TOKENS`, on one colour scale.

    Parameters
    ----------
    scale : bool, default True
        Divide the scores by √d_k (= 4 here).
    temperature : float, default 1.0
        τ > 0, dividing the scores as well.
    mask : {"none", "causal", "padding"}, default "none"
    seed : int, default 0
        Seed of the token vectors and the head's random (untrained) weights.
    fig : matplotlib.figure.Figure, optional
        A figure returned by an earlier call, to redraw into (only images and numbers change).
        Default: a new ``Figure``, not tracked by pyplot (show it with ``display(fig)``).

    Returns
    -------
    fig : matplotlib.figure.Figure
    summary : dict
        ``scale``, ``divisor``, ``temperature``, ``mask``, the five arrays (as
        :func:`attention_intermediates`), ``masked_cells`` (how many entries are −∞), ``largest``
        (the largest weight and its query and key tokens), ``pad_weight`` (the most weight any
        real query puts on a ``<pad>`` key) and ``row_sums``.

    Raises
    ------
    ValueError
        If ``mask`` is not one of :data:`MASKS` or ``temperature`` is not a positive number.

    Examples
    --------
    >>> fig, summary = draw_stepper(mask="padding")
    >>> summary["divisor"], summary["masked_cells"], summary["pad_weight"]
    (4.0, 12, 0.0)
    """
    inputs = stepper_inputs(seed)
    tokens, length = inputs["tokens"], inputs["length"]
    m = stepper_mask(mask, len(tokens), length)
    steps = attention_intermediates(inputs["q"], inputs["k"], inputs["v"], scale=bool(scale),
                                    temperature=temperature, mask=m)
    state = getattr(fig, "_stepper_state", None)
    if fig is None or state is None:
        fig = fig if fig is not None else Figure(figsize=FIGSIZE)
        fig.clear()
        fig.set_size_inches(*FIGSIZE)
        state = fig._stepper_state = _build(fig, tokens, inputs["v"].shape[-1])
    root_d_k = math.sqrt(inputs["q"].shape[-1])
    tau = float(temperature)
    divide = (f"÷ (√d_k·τ) = ÷ {steps['divisor']:g}" if scale
              else f"÷ τ = ÷ {tau:g} (no √d_k)")
    titles = {
        "scores": "1. scores\nq·kᵀ",
        "scaled": f"2. scaled\n{divide}",
        "masked": "3. masked\n−∞ where not allowed" if mask != "none" else "3. masked\n(no mask)",
        "weights": "4. weights\nsoftmax of each row",
        "output": "5. output\nweights @ v",
    }
    for step, panel in zip(STEPS, state["panels"], strict=True):
        values = steps[step]
        panel["img"].set_data(np.ma.masked_invalid(values))
        for row, texts in zip(values, panel["cells"], strict=True):
            for value, text in zip(row, texts, strict=True):
                text.set_text(_fmt(value, step))
        panel["ax"].set_title(titles[step], fontsize=9, loc="left", pad=3)
    fig.suptitle(f"one head on a padded sentence: √d_k = {root_d_k:g}, "
                 f"scaling {'on' if scale else 'off'}, τ = {tau:g}, mask: {mask}",
                 fontsize=9, y=0.985, va="top")

    weights = steps["weights"]
    i, j = np.unravel_index(np.argmax(weights), weights.shape)
    summary = {
        "scale": bool(scale), "divisor": steps["divisor"], "temperature": tau, "mask": mask,
        **{step: steps[step] for step in STEPS},
        "masked_cells": int(np.isneginf(steps["masked"]).sum()),
        "largest": (float(weights[i, j]), tokens[i], tokens[j]),
        "pad_weight": float(weights[:length, length:].max()),
        "row_sums": weights.sum(axis=-1),
    }
    return fig, summary


def stepper_summary_line(summary) -> str:
    """One line that says what :func:`draw_stepper` drew (rounded numbers only).

    Examples
    --------
    >>> stepper_summary_line(draw_stepper(mask="causal")[1])  # doctest: +ELLIPSIS
    'scores ÷ 4 (√d_k on, τ=1) | mask causal: 15 cells −∞ | scaled range ... | largest weight ...'
    """
    s = summary
    scaled = s["scaled"]
    weight, query, key = s["largest"]
    return (
        f"scores ÷ {s['divisor']:g} (√d_k {'on' if s['scale'] else 'off'}, "
        f"τ={s['temperature']:g}) | mask {s['mask']}: {s['masked_cells']} cells −∞ | "
        f"scaled range {scaled.min():.1f}..{scaled.max():.1f} | "
        f"largest weight {weight:.2f} ({query}→{key}) | "
        f"most weight on <pad>: {s['pad_weight']:.2f}"
    )


def _summary_html(line: str) -> str:
    """The summary line on two lines that never break inside an item (a number, a token)."""
    parts = [html.escape(p) for p in line.split(" | ")]
    items = [f"<span style='white-space: nowrap'>{p}</span>" for p in parts]
    return ("<div style='font-family: monospace; font-size: 12px; line-height: 18px'>"
            + " | ".join(items[:2]) + "<br>" + " | ".join(items[2:]) + "</div>")


def stepper_widget(*, seed: int = 0):
    """Controls for √d_k scaling, temperature and mask that redraw :func:`draw_stepper`.

    Parameters
    ----------
    seed : int, default 0

    Returns
    -------
    ipywidgets.VBox
        Children: an ``HBox`` of the controls (a "divide by √d_k" checkbox, a temperature
        ``SelectionSlider`` over :data:`TEMPERATURES`, a mask ``Dropdown``), an ``HTML``
        line with :func:`stepper_summary_line`, and an ``Image`` with the figure (960 x 320
        pixels at every setting).

    Examples
    --------
    >>> box = stepper_widget()
    >>> [type(w).__name__ for w in box.children]
    ['HBox', 'HTML', 'Image']
    """
    import ipywidgets as widgets

    scale = widgets.Checkbox(value=True, description="divide by √d_k", indent=False,
                             layout=widgets.Layout(width="140px", flex="0 0 auto"))
    temperature = widgets.SelectionSlider(options=[(f"{t:g}", t) for t in TEMPERATURES],
                                          value=1.0, description="τ", continuous_update=False,
                                          layout=widgets.Layout(width="260px", flex="0 0 auto"))
    mask = widgets.Dropdown(options=list(MASKS), value="none", description="mask",
                            style={"description_width": "40px"},
                            layout=widgets.Layout(width="180px", flex="0 0 auto"))
    width, height = (round(FIGSIZE[0] * DPI), round(FIGSIZE[1] * DPI))
    summary = widgets.HTML(layout=widgets.Layout(width=f"{width}px", height="40px"))
    image = widgets.Image(format="png", width=width, height=height,
                          layout=widgets.Layout(width=f"{width}px", height=f"{height}px"))
    fig, _ = draw_stepper(seed=seed)  # one figure for the widget's life

    def redraw(change=None):
        _, s = draw_stepper(scale.value, temperature.value, mask.value, seed=seed, fig=fig)
        image.value = figure_png(fig, dpi=DPI)
        summary.value = _summary_html(stepper_summary_line(s))  # last, as in the explorer

    for control in (scale, temperature, mask):
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([scale, temperature, mask]), summary, image],
                        layout=widgets.Layout(width=f"{width + 10}px"))
