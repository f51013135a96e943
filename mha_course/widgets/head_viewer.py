"""The head viewer: lines from each token to the tokens it attends to, one colour per head.

Taught in ``notebooks/08_learning.ipynb``; lesson 09 (``notebooks/09_tiny_gpt.ipynb``) reads
its GPT's heads on lines of a play with it (:func:`head_viewer` takes lesson 08's task examples
or windows of token ids, and a tokenizer for the labels).

Like bertviz's "head view" (Vig, 2019), drawn with matplotlib alone, so nothing is fetched from
the network. For each layer, the tokens are listed twice: on the left the queries (the tokens
attending), on the right the keys (the tokens attended to). A line joins query ``t`` to key
``s`` in the colour of its head, as opaque as the weight ``weights[head, t, s]`` (lines under
:data:`MIN_WEIGHT` are left out). Selecting a token keeps only its lines.

Three layers, so each can be tested on its own:

- :func:`draw_head_view` is a pure function: one example's weights in, a figure and a summary
  out; :func:`summary_line` prints the summary in one line (what a notebook cell checks).
- :class:`HeadViewPainter` renders the same picture as PNG bytes, fast: the frame (labels,
  titles, legend) is drawn once and kept as pixels, and a redraw only adds the lines, the
  highlights and the title (the PNG equals :func:`draw_head_view`'s, tested pixel for pixel).
- :func:`head_viewer` wraps the painter in ipywidgets: an example menu, a toggle per layer and
  per head (coloured like its lines), a token menu, the summary line (wrapped, never cut off)
  and the picture as a PNG of fixed size.
  It opens on every token, or, for longer windows of text, on one query (``token="last"``).
"""

from __future__ import annotations

import html
import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import to_hex, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from PIL import Image

from .._validate import fail
from ..models.tasks import VOCAB
from ..models.tiny_model import head_label

#: Lines whose weight is below this are not drawn (they would be invisible anyway).
MIN_WEIGHT = 0.02
#: Size of the figure in inches, whatever is shown: the widget does not jump when toggled.
FIGSIZE = (8.0, 5.6)
#: Resolution of the widget's PNG (720 x 504 pixels: fits a 1366 x 768 screen with the controls).
WIDGET_DPI = 90
#: One colour per head, by ``layer * h + head`` (matplotlib's "tab10", then "Dark2").
COLORS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
          "tab:pink", "tab:olive", "tab:cyan", "#1b9e77", "#d95f02", "#7570b3", "#e7298a",
          "#66a61e", "#e6ab02", "#a6761d")


def head_color(layer: int, head: int, h: int) -> str:
    """The colour of head ``head`` of layer ``layer`` (``h`` heads per layer), as ``#rrggbb``.

    Examples
    --------
    >>> head_color(1, 0, h=2)
    '#2ca02c'
    """
    return to_hex(COLORS[(layer * h + head) % len(COLORS)])


def _validate(weights, tokens):
    func = "draw_head_view"
    weights = [np.asarray(w, dtype=float) for w in weights]
    tokens = [str(t) for t in tokens]
    T = len(tokens)
    if not weights:
        raise fail(func, "weights is empty; expected one (h, T, T) array per layer")
    h = weights[0].shape[0] if weights[0].ndim == 3 else None
    for i, w in enumerate(weights):
        if w.shape != (h, T, T):
            raise fail(func, f"weights[{i}] has shape {w.shape}; expected (h, T, T) = "
                             f"({h}, {T}, {T}) (T from tokens, h from weights[0])")
    return weights, tokens, h


def _choices(func, weights, tokens, layers, heads, token):
    """Validate and normalise the drawing's arguments."""
    weights, tokens, h = _validate(weights, tokens)
    n_layers, T = len(weights), len(tokens)
    layers = sorted(set(range(n_layers) if layers is None else (int(i) for i in layers)))
    if any(not 0 <= i < n_layers for i in layers):
        raise fail(func, f"layers={layers}: the model has layers 0..{n_layers - 1}")
    shown = {(i, j) for i in range(n_layers) for j in range(h)} if heads is None else {
        (int(i), int(j)) for i, j in heads}
    if any(not (0 <= i < n_layers and 0 <= j < h) for i, j in shown):
        raise fail(func, f"heads={sorted(shown)}: the model has layers 0..{n_layers - 1} and "
                         f"heads 0..{h - 1}")
    if token is not None and not 0 <= int(token) < T:
        raise fail(func, f"token={token}: the example has positions 0..{T - 1}")
    token = None if token is None else int(token)
    shown = {(i, j) for i, j in shown if i in layers}  # a hidden layer hides its heads
    return weights, tokens, h, layers, shown, token


def _font(T: int) -> int:
    return 10 if T <= 18 else 8 if T <= 32 else 7 if T <= 40 else 6


def _frame(fig, tokens, n_layers, h, layers, shown):
    """What does not change when a token is chosen: axes, labels, titles, legend."""
    T, font = len(tokens), _font(len(tokens))
    width = 0.9 / n_layers
    axes = []
    for i in range(n_layers):
        ax = fig.add_axes([0.05 + i * width, 0.1, width * 0.9, 0.8])
        ax.set_xlim(-0.45, 1.45)
        ax.set_ylim(-T + 0.4, 1.3)
        ax.set_axis_off()
        visible = i in layers
        ax.set_title(f"layer {i}" + ("" if visible else " (hidden)"), fontsize=11,
                     color="black" if visible else "0.6")
        for t, label in enumerate(tokens):
            ax.text(-0.03, -t, label, ha="right", va="center", fontsize=font)
            ax.text(1.03, -t, label, ha="left", va="center", fontsize=font)
        ax.text(-0.03, 0.75, "query", ha="right", va="bottom", fontsize=8, color="0.4")
        ax.text(1.03, 0.75, "key", ha="left", va="bottom", fontsize=8, color="0.4")
        axes.append(ax)
    handles = [Patch(color=head_color(i, j, h), label=head_label(i, j))
               for i in range(n_layers) for j in range(h) if (i, j) in shown]
    if handles:
        fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8),
                   fontsize=9, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return axes


def _foreground(fig, axes, weights, tokens, h, shown, token, title):
    """What a token changes: the lines, the highlighted labels, the title.

    Returns the new artists (in drawing order) and the ``top`` dict of the summary.
    """
    T, font = len(tokens), _font(len(tokens))
    artists, top = [], {}
    for i, ax in enumerate(axes):
        segments, colors = [], []
        for j in range(h):
            if (i, j) not in shown:
                continue
            w = weights[i][j]  # (T, T)
            rows = range(T) if token is None else [token]
            rgba = np.array(to_rgba(head_color(i, j, h)))
            # each head's lines a little apart, so two heads on the same pair both show
            dy = (j - (h - 1) / 2) * min(0.15, 0.6 / h)
            for t in rows:
                for s in np.flatnonzero(w[t] >= MIN_WEIGHT):
                    segments.append([(0.0, -t + dy), (1.0, -s + dy)])
                    colors.append((*rgba[:3], 0.15 + 0.85 * min(w[t, s], 1.0)))
            if token is None:
                received = w.sum(axis=0)  # total weight each key receives
                key = int(np.argmax(received))
                top[head_label(i, j)] = (key, round(float(received[key] / T), 4))
            else:
                key = int(np.argmax(w[token]))
                top[head_label(i, j)] = (key, round(float(w[token, key]), 4))
        if segments:
            artists.append(ax.add_collection(LineCollection(segments, colors=colors,
                                                            linewidths=2.0)))
        if token is None or not any(layer == i for layer, _ in shown):
            continue
        # highlights drawn over the plain labels: the chosen query, each head's strongest key
        artists.append(ax.text(-0.03, -token, tokens[token], ha="right", va="center",
                               fontsize=font, fontweight="bold",
                               bbox={"boxstyle": "round,pad=0.15", "fc": "#ffe08a",
                                     "ec": "none"}))
        for key in sorted({key for label, (key, _) in top.items()
                           if label.startswith(f"L{i}H")}):
            artists.append(ax.text(1.03, -key, tokens[key], ha="left", va="center",
                                   fontsize=font, fontweight="bold",
                                   bbox={"boxstyle": "square,pad=0.05", "fc": "white",
                                         "ec": "none"}))
    chosen = "every token" if token is None else f"token {token} {tokens[token]!r}"
    artists.append(fig.suptitle(title or f"attention from {chosen}", fontsize=12))
    return artists, top


def _summary(layers, shown, token, tokens, lines, top):
    return {
        "layers": layers,
        "heads": [head_label(i, j) for i, j in sorted(shown)],
        "token": token,
        "token_label": None if token is None else tokens[token],
        "lines": lines,
        "top": top,
        "tokens": tokens,
    }


def draw_head_view(weights, tokens, *, layers=None, heads=None, token=None, title=None):
    """Draw one example's attention as lines from queries (left) to keys (right), per layer.

    Parameters
    ----------
    weights : sequence of ndarray, each of shape (h, T, T)
        One array per layer: that layer's weights on this example (e.g.
        ``model.attention_weights(tokens[None])[layer][0]``).
    tokens : sequence of str, length T
        The labels of the positions.
    layers : iterable of int, optional
        The layers to draw (default all); the others keep their place, empty.
    heads : iterable of (layer, head), optional
        The heads to draw (default all; a head of a hidden layer is not drawn).
    token : int, optional
        A query position: draw only its lines and highlight it (default: every query's lines).
    title : str, optional

    Returns
    -------
    fig : matplotlib.figure.Figure
        Not tracked by pyplot (no need to close it).
    summary : dict
        ``layers``, ``heads`` (labels ``"L0H1"`` of the heads drawn), ``token`` (None or the
        position), ``lines`` (line segments drawn, counted from the figure) and ``top``: for
        each head drawn, ``(key, weight)`` of its largest weight from the selected token (from
        every query when none is selected: then the key that receives the most weight in
        total, with the mean weight it gets).

    Raises
    ------
    ValueError
        If the weights do not match the tokens, or a layer, head or token does not exist.

    Examples
    --------
    >>> previous = np.eye(4, k=-1)[None] + np.eye(4)[None] * [[1, 0, 0, 0]]  # (1, 4, 4)
    >>> fig, summary = draw_head_view([previous], list("ab>a"), token=2)
    >>> summary["lines"], summary["top"]
    (1, {'L0H0': (1, 1.0)})
    """
    weights, tokens, h, layers, shown, token = _choices(
        "draw_head_view", weights, tokens, layers, heads, token)
    fig = Figure(figsize=FIGSIZE)
    axes = _frame(fig, tokens, len(weights), h, layers, shown)
    _, top = _foreground(fig, axes, weights, tokens, h, shown, token, title)
    # the count is read back from the figure itself, so the summary says what was drawn
    lines = sum(len(c.get_segments()) for ax in fig.axes for c in ax.collections)
    return fig, _summary(layers, shown, token, tokens, lines, top)


class HeadViewPainter:
    """Renders :func:`draw_head_view`'s picture fast enough for a widget, pixel for pixel.

    The frame (labels, titles, legend) is drawn once per example and choice of layers and heads,
    and kept as pixels; choosing a token only draws the lines, the highlighted labels and the
    title over a copy of them (matplotlib's "blitting"). ``tests/test_head_viewer.py`` checks
    that the PNG equals ``draw_head_view``'s, saved at the same resolution.
    """

    #: Frames kept (one per example and choice of layers and heads), so toggling back is fast.
    KEEP = 16

    def __init__(self, dpi=WIDGET_DPI):
        self.dpi = dpi
        self._frames = {}

    def png(self, weights, tokens, *, layers=None, heads=None, token=None, title=None):
        """PNG bytes of ``draw_head_view(weights, tokens, ...)`` at ``dpi``, and its summary.

        Raises
        ------
        ValueError
            As :func:`draw_head_view`.
        """
        weights, tokens, h, layers, shown, token = _choices(
            "HeadViewPainter.png", weights, tokens, layers, heads, token)
        key = (tuple(tokens), len(weights), h, tuple(layers), tuple(sorted(shown)))
        if key not in self._frames:  # a new frame: draw it once, keep its pixels
            if len(self._frames) >= self.KEEP:
                self._frames.pop(next(iter(self._frames)))  # the oldest
            fig = Figure(figsize=FIGSIZE, dpi=self.dpi)
            canvas = FigureCanvasAgg(fig)
            axes = _frame(fig, tokens, len(weights), h, layers, shown)
            canvas.draw()
            self._frames[key] = (fig, canvas, axes, canvas.copy_from_bbox(fig.bbox))
        fig, canvas, axes, background = self._frames[key]
        canvas.restore_region(background)
        artists, top = _foreground(fig, axes, weights, tokens, h, shown, token, title)
        renderer = canvas.get_renderer()
        lines = 0
        for artist in artists:
            artist.draw(renderer)
            if isinstance(artist, LineCollection):
                lines += len(artist.get_segments())
        for artist in artists:
            artist.remove()  # the next call starts from the frame again
        width, height = canvas.get_width_height()
        buf = io.BytesIO()
        Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA",
                         0, 1).save(buf, format="png", compress_level=1)
        return buf.getvalue(), _summary(layers, shown, token, tokens, lines, top)


def summary_line(summary) -> str:
    """One line that says what :func:`draw_head_view` drew.

    Examples
    --------
    >>> previous = np.eye(4, k=-1)[None] + np.eye(4)[None] * [[1, 0, 0, 0]]
    >>> summary_line(draw_head_view([previous], list("ab>a"), token=2)[1])
    "layers [0] | heads L0H0 | token 2 '>' | 1 lines | L0H0 -> 1 'b' (1.00)"
    """
    tokens = summary["tokens"]
    chosen = ("every token" if summary["token"] is None
              else f"token {summary['token']} {summary['token_label']!r}")
    what = "strongest" if summary["token"] is None else "->"
    tops = "; ".join(f"{label} {what} {key} {tokens[key]!r} ({weight:.2f})"
                     for label, (key, weight) in summary["top"].items())
    return (f"layers {summary['layers']} | heads {' '.join(summary['heads']) or '-'} | "
            f"{chosen} | {summary['lines']} lines" + (f" | {tops}" if tops else ""))


def head_viewer(model, batch, vocab=VOCAB, *, token=None, extra_controls=()):
    """The interactive head viewer for ``model`` on the examples of ``batch``.

    Parameters
    ----------
    model : TinyTransformer or GPT
        Anything with ``attention_weights(tokens)`` (one (B, h, T, T) array per layer),
        ``n_layers`` (or ``config.n_layers``) and ``h`` (or ``config.h``).
    batch : Batch or ndarray of int, shape (B, T)
        Lesson 08's task examples (e.g. ``make_batch("copy", 8, rng=1)``), each shown without
        its padding (its ``2n + 1`` positions); or windows of token ids (lesson 09's lines of a
        play), each shown whole.
    vocab : sequence of str, or a tokenizer, default :data:`mha_course.models.tasks.VOCAB`
        The label of every token id; a tokenizer with ``labels(ids)`` (lesson 09's
        :class:`~mha_course.models.tokenizer.CharTokenizer`, which shows a space as ``␣`` and
        a line break as ``↵``).
    token : None, int or "last", default None
        The query each example opens on (and returns to when another example is chosen): None
        for every token (readable on lesson 08's short examples), ``"last"`` for the example's
        last position (lesson 09's windows of text, where every token's lines are a tangle),
        or a position.
    extra_controls : sequence of ipywidgets.Widget, optional
        Put first in the row of the example and token menus (the app's model switch).

    Returns
    -------
    ipywidgets.VBox
        Children: a row with the example and token menus, a row of layer and head toggles
        (each head's toggle in its colour), the summary line, and the picture.

    Raises
    ------
    ValueError
        If ``batch`` is neither a Batch nor a (B, T) array of token ids, or ``token`` is not
        None, "last" or a position of every example.
    """
    import ipywidgets as widgets

    if hasattr(batch, "lengths"):  # lesson 08's Batch: each example without its padding
        tokens = batch.tokens  # (B, T)
        lengths = 2 * batch.lengths + 1  # real positions of each example
    else:  # windows of text: every position is real
        tokens = np.asarray(batch)
        if tokens.ndim != 2 or tokens.dtype.kind not in "iu":
            raise fail("head_viewer", f"batch has shape {tokens.shape} and dtype {tokens.dtype};"
                                      " expected a Batch or token ids of shape (B, T)")
        lengths = np.full(len(tokens), tokens.shape[1])
    if not (token is None or token == "last" or (
            isinstance(token, (int, np.integer)) and 0 <= token < min(lengths))):
        raise fail("head_viewer", f"token={token!r}; expected None (every token), 'last' or a "
                                  f"position 0..{min(lengths) - 1} of every example")

    def start(b):  # the token menu's value when example b is chosen (-1: every token)
        return -1 if token is None else int(lengths[b] - 1 if token == "last" else token)

    def labels(ids):
        return list(vocab.labels(ids)) if hasattr(vocab, "labels") else [vocab[i] for i in ids]

    weights = model.attention_weights(tokens)  # n_layers arrays (B, h, T, T), computed once
    config = getattr(model, "config", model)  # a GPT keeps its sizes in its config
    n_layers, h = config.n_layers, config.h

    def name(row):
        text = "".join(row)
        return text if len(text) <= 32 else text[:31] + "…"

    names = [name(labels(row[:n])) for row, n in zip(tokens, lengths, strict=True)]
    example = widgets.Dropdown(options=[(f"{b}: {name}", b) for b, name in enumerate(names)],
                               value=0, description="example",
                               layout=widgets.Layout(width="260px"))
    menu = widgets.Dropdown(description="token", layout=widgets.Layout(width="200px"))
    layer_toggles = [widgets.ToggleButton(value=True, description=f"layer {i}",
                                          layout=widgets.Layout(width="80px"))
                     for i in range(n_layers)]
    head_toggles = {}
    for i in range(n_layers):
        for j in range(h):
            # the square and the name in the head's colour (a pressed toggle's own grey
            # background would hide a button colour)
            button = widgets.ToggleButton(value=True, description=f"■ {head_label(i, j)}",
                                          tooltip=f"show or hide head {head_label(i, j)}",
                                          layout=widgets.Layout(width="78px"))
            button.style.text_color = head_color(i, j, h)
            button.style.font_weight = "bold"
            head_toggles[i, j] = button
    width, height = (int(FIGSIZE[0] * WIDGET_DPI), int(FIGSIZE[1] * WIDGET_DPI))
    # as wide as the picture, room for three lines, and more when eight heads' keys need them
    # (never cut off: the picture moves down a line instead)
    summary = widgets.HTML(layout=widgets.Layout(width=f"{width}px", min_height="54px"))
    image = widgets.Image(format="png", layout=widgets.Layout(width=f"{width}px",
                                                              height=f"{height}px"))

    def token_options(b):
        row = labels(tokens[b, : lengths[b]])
        return [("every token", -1)] + [(f"{t}: {label}", t) for t, label in enumerate(row)]

    painter = HeadViewPainter()

    def redraw(change=None):
        b = example.value
        n = lengths[b]
        chosen = None if menu.value in (None, -1) else menu.value
        png, info = painter.png(
            [w[b, :, :n, :n] for w in weights], labels(tokens[b, :n]),
            layers=[i for i, t in enumerate(layer_toggles) if t.value],
            heads=[key for key, t in head_toggles.items() if t.value],
            token=chosen)
        image.value = png  # the picture first: once the summary changes, so has the picture
        summary.value = ("<div style='font-family: monospace; font-size: 12px; "
                         f"line-height: 1.4'>{html.escape(summary_line(info))}</div>")

    def on_example(change):
        menu.unobserve(redraw, names="value")
        menu.options = token_options(example.value)
        menu.value = start(example.value)
        menu.observe(redraw, names="value")
        redraw()

    menu.options = token_options(0)
    menu.value = start(0)
    example.observe(on_example, names="value")
    menu.observe(redraw, names="value")
    for toggle in [*layer_toggles, *head_toggles.values()]:
        toggle.observe(redraw, names="value")
    redraw()
    toggles = widgets.HBox([*layer_toggles, widgets.Label("heads:"), *head_toggles.values()])
    return widgets.VBox([widgets.HBox([*extra_controls, example, menu]), toggles, summary, image])
