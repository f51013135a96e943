"""Figures shared by the lessons: attention-weight heatmaps with token labels.

Used from ``notebooks/03_single_head_attention.ipynb`` on. This module (and ``explorer``) are
the only ones that import matplotlib.
"""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import numpy as np

from ._validate import fail, validate_shape

#: The example sentence of the source article, used by lessons 03 and 04 and the explorer.
SENTENCE = "the animal didn't cross the street because it was too tired"
#: The sentence split on spaces: 11 tokens.
TOKENS = tuple(SENTENCE.split())


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
