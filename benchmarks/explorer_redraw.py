"""How long one redraw of lesson 04's h / d_k explorer takes, at h = 1, 8 and 16.

Run from the repository root::

    .venv/bin/python benchmarks/explorer_redraw.py

A redraw is what the widget does when a slider is released: ``draw_explorer`` (build the seeded
layer, run it on the example sentence, update the heatmaps) plus rendering the figure to the PNG
the ``Output`` shows. Two cases are timed:

- "widget": drawing into the explorer's own figure, whose 16 heatmap axes already exist (what a
  learner waits for; the target is <= 0.3 s at h = 16);
- "fresh": a new figure each time (the static call in the notebook), for comparison.

Wall time and CPU time are both printed (min and median over repeats): on a shared 2-core machine
the wall time includes waiting for the CPU; the CPU time is what the redraw itself costs.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from mha_course.explorer import TOKENS, draw_explorer, figure_png, plot_heads

TARGET_S = 0.3
REPEATS = 7


def timed(fn, repeats=REPEATS):
    """(min wall, median wall, min cpu) of ``repeats`` calls of ``fn``, in seconds."""
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), statistics.median(walls), min(cpus)


def main() -> None:
    T = len(TOKENS)
    widget_fig, _ = plot_heads(np.zeros((16, T, T)))  # as explorer() builds it, once
    figure_png(widget_fig)  # warm the font cache and the renderer
    print(f"explorer redraw (draw_explorer + PNG), d_model=48, T={T}, {REPEATS} repeats")
    print(f"{'h':>3} {'case':>7} {'min wall':>9} {'median':>8} {'min cpu':>8}")
    worst = 0.0
    for h in (1, 8, 16):
        cases = {
            "widget": lambda h=h: figure_png(draw_explorer(h, 0, fig=widget_fig)[0]),
            "fresh": lambda h=h: figure_png(draw_explorer(h, 0)[0]),
        }
        for name, fn in cases.items():
            best, median, cpu = timed(fn)
            if name == "widget" and h == 16:
                worst = median
            print(f"{h:>3} {name:>7} {best:>8.3f}s {median:>7.3f}s {cpu:>7.3f}s")
    verdict = "meets" if worst <= TARGET_S else "MISSES"
    print(f"widget redraw at h=16: median {worst:.3f} s, {verdict} the {TARGET_S} s target")


if __name__ == "__main__":
    main()
