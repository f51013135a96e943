"""The tile stepper: tiled attention on a small example, one tile at a time, with a slider.

Taught in ``notebooks/07_flash_attention.ipynb``.

It shows what :func:`mha_course.tiled_attention` holds after each (block × block) tile: which
tiles of the (T, S) score matrix have been visited (and, with ``causal``, which are skipped), and
for each query of the current block the running max ``m``, the running sum ``l`` and how far the
output so far, ``acc / l``, still is from the final output. The numbers come from the package's
own loop (its ``on_tile`` report), not from a copy of it.

Three layers, as in :mod:`mha_course.widgets.explorer`:

- :func:`tile_states` runs the example and returns every tile's state;
- :func:`step_state` picks one tile's numbers; :func:`draw_tile_step` is a pure function (no
  widgets) that draws them and returns the figure and that summary dict; :func:`step_summary`
  prints the summary in one line;
- :func:`tile_stepper` wraps :func:`draw_tile_step` in ipywidgets controls.
"""

from __future__ import annotations

import base64

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .._validate import fail, validate_positive_int
from ..attention import causal_mask, scaled_dot_product_attention
from ..kernels.tiled import tiled_attention
from .plotting import figure_png

#: The example: one head, T = S = 9 positions, d_k = 4, d_v = 3, fixed seed.
T_EXAMPLE, D_K, D_V, SEED = 9, 4, 3, 7
#: Block sizes the widget offers (9 positions: 1 is the element-by-element online softmax).
BLOCKS = (1, 2, 3, 4, 9)
#: Size of every stepper figure in inches: fixed, so the widget does not jump between steps.
FIGSIZE = (10.6, 4.8)


def example_qkv(T: int = T_EXAMPLE, seed: int = SEED):
    """The stepper's example: q, k of shape (T, 4) and v of shape (T, 3), entries N(0, 1.5²).

    Examples
    --------
    >>> [a.shape for a in example_qkv()]
    [(9, 4), (9, 4), (9, 3)]
    """
    T = validate_positive_int("example_qkv", "T", T)
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(T, D_K)) * 1.5
    k = rng.normal(size=(T, D_K)) * 1.5
    v = rng.normal(size=(T, D_V))
    return q, k, v


def tile_states(block_size: int = 3, causal: bool = False, T: int = T_EXAMPLE, seed: int = SEED):
    """Run :func:`mha_course.tiled_attention` on the example and keep every tile's state.

    Returns
    -------
    dict
        ``"states"``: the list of ``on_tile`` reports (``queries``, ``keys``, ``m``, ``l``,
        ``acc``), one per visited tile, in order; ``"out"`` (T, d_v) and ``"lse"`` (T,) as
        returned; ``"scores"`` (T, S), the scaled scores (for drawing only; the loop never
        holds them); ``"allowed"`` (T, S) bool; ``"reference"``, standard attention's output.

    Raises
    ------
    ValueError
        If ``block_size`` or ``T`` is not an integer >= 1.

    Examples
    --------
    >>> run = tile_states(block_size=3, causal=True)
    >>> len(run["states"]), run["out"].shape
    (6, (9, 3))
    """
    block = validate_positive_int("tile_states", "block_size", block_size)
    q, k, v = example_qkv(T, seed)
    states = []
    out, lse = tiled_attention(q, k, v, causal=causal, block_size=block, return_lse=True,
                               on_tile=states.append)
    allowed = causal_mask(T) if causal else np.ones((T, T), dtype=bool)
    reference, _ = scaled_dot_product_attention(q, k, v, mask=allowed)
    return {"states": states, "out": out, "lse": lse, "scores": q @ k.T / np.sqrt(D_K),
            "allowed": allowed, "reference": reference, "block_size": block, "causal": causal}


def step_state(step: int = 0, *, block_size: int = 3, causal: bool = False,
               T: int = T_EXAMPLE, seed: int = SEED) -> dict:
    """The numbers :func:`draw_tile_step` draws for tile number ``step`` (0-based), no figure.

    Returns
    -------
    dict
        ``step``, ``n_steps``, ``queries`` and ``keys`` (the tile's ranges ``(start, stop)``),
        ``m``, ``l`` (the running max and sum of each query of the block after this tile),
        ``error`` (per query of the block, the largest ``|acc / l - final output|``),
        ``final_m``, ``final_l`` (their values once every key is seen), ``block_done`` (this is
        the block's last tile), ``visited`` and ``skipped`` (tiles of the whole walk), and
        ``run``, what :func:`tile_states` returned.

    Raises
    ------
    ValueError
        If ``step`` is out of range, or ``block_size`` or ``T`` is not an integer >= 1.

    Examples
    --------
    >>> s = step_state(5, block_size=3, causal=True)
    >>> s["n_steps"], s["queries"], s["keys"], s["skipped"]
    (6, (6, 9), (6, 9), 3)
    """
    run = tile_states(block_size, causal, T, seed)
    states, block = run["states"], run["block_size"]
    n_steps = len(states)
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) \
            or not 0 <= step < n_steps:
        raise fail("draw_tile_step", f"step={step!r}; expected an integer from 0 to "
                   f"{n_steps - 1} ({n_steps} tiles for block_size={block}, causal={causal})")
    state = states[step]
    (t0, t1), (s0, s1) = state["queries"], state["keys"]
    n_blocks = -(-T // block)
    so_far = state["acc"] / state["l"][:, None]  # (t1-t0, d_v): acc / l after this tile
    final_m = np.where(run["allowed"][t0:t1], run["scores"][t0:t1], -np.inf).max(axis=-1)
    return {
        "step": int(step), "n_steps": n_steps, "queries": (t0, t1), "keys": (s0, s1),
        "m": state["m"], "l": state["l"],
        "error": np.abs(so_far - run["reference"][t0:t1]).max(axis=-1),  # (t1-t0,)
        "final_m": final_m, "final_l": np.exp(run["lse"][t0:t1] - final_m),
        "block_done": step + 1 == n_steps or states[step + 1]["queries"][0] != t0,
        "visited": n_steps, "skipped": n_blocks**2 - n_steps, "run": run,
    }


def draw_tile_step(step: int = 0, *, block_size: int = 3, causal: bool = False,
                   T: int = T_EXAMPLE, seed: int = SEED):
    """Draw the state of tiled attention after tile number ``step`` (0-based) of the example.

    Left: the (T, S) scores as tiles (visited in colour, the current one outlined, the ones
    still to come in light grey, the ones ``causal`` skips in dark grey). Middle: for each query
    of the current block, the largest difference between the output so far, ``acc / l``, and
    the final output: it drops to 0 once the block's last tile is done. Right: for each query
    of the block, the running max ``m`` and sum ``l`` after this tile, and their final values.

    Parameters
    ----------
    step : int
        Which tile, 0 to (number of visited tiles - 1).
    block_size : int, default 3
    causal : bool, default False
    T : int, default 9
        Positions of the example (T = S).
    seed : int, default 7

    Returns
    -------
    fig : matplotlib.figure.Figure
        Not registered with pyplot: nothing to close.
    summary : dict
        What :func:`step_state` returns; :func:`step_summary` prints it in one line.

    Raises
    ------
    ValueError
        As :func:`step_state`.

    Examples
    --------
    >>> fig, summary = draw_tile_step(5, block_size=3, causal=True)
    >>> len(fig.axes), summary["block_done"]
    (4, True)
    """
    summary = step_state(step, block_size=block_size, causal=causal, T=T, seed=seed)
    run = summary["run"]
    states, block = run["states"], run["block_size"]
    n_steps, m, l_ = summary["n_steps"], summary["m"], summary["l"]
    (t0, t1), (s0, s1) = summary["queries"], summary["keys"]
    n_blocks = -(-T // block)
    visited = {(st["queries"][0] // block, st["keys"][0] // block) for st in states}
    done = {(st["queries"][0] // block, st["keys"][0] // block) for st in states[: step + 1]}

    fig = Figure(figsize=FIGSIZE)
    ax_map = fig.add_axes([0.055, 0.12, 0.3, 0.68])
    ax_err = fig.add_axes([0.47, 0.12, 0.13, 0.68])
    ax_txt = fig.add_axes([0.64, 0.12, 0.355, 0.68])

    # Left: the scores, with the tiles' state as an overlay image (one artist, fast to redraw):
    # dark grey = skipped, light grey = still to come, clear = done; the current tile outlined.
    scores = run["scores"]
    lim = float(np.abs(scores).max())
    img = ax_map.imshow(np.where(run["allowed"], scores, np.nan), cmap="coolwarm", vmin=-lim,
                        vmax=lim, interpolation="nearest")
    cbar = fig.colorbar(img, cax=fig.add_axes([0.365, 0.12, 0.01, 0.68]))
    cbar.set_label("score", fontsize=10)
    cbar.ax.tick_params(labelsize=9)
    overlay = np.zeros((T, T, 4))  # RGBA, transparent
    for i in range(n_blocks):
        for j in range(n_blocks):
            rows, cols = slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block)
            if (i, j) not in visited:
                overlay[rows, cols] = (0.45, 0.45, 0.45, 1.0)  # skipped: never computed
            elif (i, j) not in done:
                overlay[rows, cols] = (0.86, 0.86, 0.86, 0.92)  # still to come
    ax_map.imshow(overlay, interpolation="nearest")
    edges = np.arange(0, T + 1, block) - 0.5
    ax_map.vlines(edges, -0.5, T - 0.5, color="0.3", lw=0.6)
    ax_map.hlines(edges, -0.5, T - 0.5, color="0.3", lw=0.6)
    ax_map.add_patch(Rectangle((s0 - 0.5, t0 - 0.5), s1 - s0, t1 - t0, fill=False,
                               edgecolor="black", lw=2.5))
    ax_map.set_xlim(-0.5, T - 0.5)
    ax_map.set_ylim(T - 0.5, -0.5)
    ax_map.set_xticks(range(T))
    ax_map.set_yticks(range(T))
    ax_map.tick_params(labelsize=9)
    ax_map.set_xlabel("key s", fontsize=10)
    ax_map.set_ylabel("query t", fontsize=10)
    # Titles at a fixed height skip matplotlib's per-axes title placement (a costly step).
    ax_map.set_title(f"scores: tile {step + 1} of {n_steps} outlined,\n"
                     f"skipped ({summary['skipped']}) dark, to come light, masked white",
                     fontsize=10, y=1.0, pad=4)

    # Middle: distance of acc / l from the final output, one bar per query row, on one x scale
    # for every step of this walk, so the bars can be compared between steps.
    top = 1.1 * max(float(np.abs(st["acc"] / st["l"][:, None]
                                 - run["reference"][slice(*st["queries"])]).max())
                    for st in states) + 1e-3
    ax_err.barh(np.arange(t0, t1), summary["error"], color="tab:purple", height=0.6)
    ax_err.axhspan(t0 - 0.5, t1 - 0.5, color="0.92", zorder=0)
    ax_err.set_ylim(T - 0.5, -0.5)
    ax_err.set_xlim(0, top)
    ax_err.set_yticks(range(T), labels=[])  # the rows of the map to its left: no labels again
    ax_err.tick_params(labelsize=9)
    ax_err.set_xlabel("max |acc / l - final|", fontsize=10)
    ax_err.set_title("output so far vs final\n(current block of queries)", fontsize=10, y=1.0,
                     pad=4)

    # Right: m and l per query of the block.
    ax_txt.axis("off")
    lines = [f"after tile {step + 1}: queries {t0}-{t1 - 1}, keys {s0}-{s1 - 1}", "",
             f"{'query':>5} {'m':>7} {'final m':>8} {'l':>7} {'final l':>8}"]
    for r in range(t1 - t0):
        lines.append(f"{t0 + r:>5} {_num(m[r]):>7} {_num(summary['final_m'][r]):>8} "
                     f"{_num(l_[r]):>7} {_num(summary['final_l'][r]):>8}")
    lines += ["", "m: running max of the scores seen", "l: running sum of exp(score - m)",
              "block done: out = acc / l is final" if summary["block_done"]
              else "block not done: more key tiles to come"]
    ax_txt.text(0.0, 1.0, "\n".join(lines), family="monospace", fontsize=10, va="top",
                transform=ax_txt.transAxes)
    ax_txt.set_title("running max and sum of the block's queries", fontsize=10, y=1.0, pad=4,
                     loc="left")
    fig.suptitle(f"tiled attention on {T} positions, block_size={block}"
                 f"{', causal' if causal else ''}", fontsize=12)
    return fig, summary


def _num(x) -> str:
    return "-inf" if x == -np.inf else f"{x:.3f}"


def step_summary(summary) -> str:
    """One line that says what :func:`draw_tile_step` drew.

    Examples
    --------
    >>> print(step_summary(draw_tile_step(0, block_size=9)[1]))  # doctest: +ELLIPSIS
    tile 1/1: queries 0-8 x keys 0-8 | m = [...] | l = [...] | max |out - final| = 0.0000 | ...
    """
    (t0, t1), (s0, s1) = summary["queries"], summary["keys"]
    m = ", ".join(_num(x) for x in summary["m"])
    l_ = ", ".join(_num(x) for x in summary["l"])
    return (f"tile {summary['step'] + 1}/{summary['n_steps']}: queries {t0}-{t1 - 1} x keys "
            f"{s0}-{s1 - 1} | m = [{m}] | l = [{l_}] | max |out - final| = "
            f"{float(summary['error'].max()) + 0.0:.4f} | tiles visited {summary['visited']}, "
            f"skipped {summary['skipped']}")


def tile_stepper(*, T: int = T_EXAMPLE, seed: int = SEED):
    """A slider that steps through the tiles of the example, with block size and causal controls.

    Returns
    -------
    ipywidgets.VBox
        Children: a row with the ``tile`` slider, the ``block`` dropdown and the ``causal``
        checkbox, and an ``Output`` that shows :func:`step_summary` and the figure.

    Examples
    --------
    >>> box = tile_stepper()
    >>> [type(w).__name__ for w in box.children]
    ['HBox', 'Output']
    """
    import ipywidgets as widgets

    T = validate_positive_int("tile_stepper", "T", T)
    step = widgets.IntSlider(value=0, min=0, max=len(tile_states(3, False, T, seed)["states"]) - 1,
                             description="tile", continuous_update=False)
    block = widgets.Dropdown(options=[b for b in BLOCKS if b <= T], value=3,
                             description="block_size")
    causal = widgets.Checkbox(value=False, description="causal", indent=False)
    out = widgets.Output()

    busy = []  # non-empty while on_walk moves the slider itself

    def redraw(change=None):
        if busy:
            return
        fig, summary = draw_tile_step(step.value, block_size=block.value, causal=causal.value,
                                      T=T, seed=seed)
        out.outputs = _outputs(summary, figure_png(fig))  # one update: no flicker

    def on_walk(change):  # a new walk: the number of tiles changes; start from its first tile
        n = len(tile_states(block.value, causal.value, T, seed)["states"])
        busy.append(True)
        try:
            step.value = 0
            step.max = n - 1
        finally:
            busy.clear()
        redraw()

    step.observe(redraw, names="value")
    block.observe(on_walk, names="value")
    causal.observe(on_walk, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([step, block, causal]), out])


def _outputs(summary, png: bytes) -> tuple[dict, ...]:
    return (
        {"output_type": "stream", "name": "stdout", "text": step_summary(summary) + "\n"},
        {"output_type": "display_data",
         "data": {"image/png": base64.b64encode(png).decode("ascii"),
                  "text/plain": "<tile stepper figure>"},
         "metadata": {}},
    )
