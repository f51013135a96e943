"""How long one redraw of lesson 08's head viewer takes.

Run from the repository root::

    .venv/bin/python benchmarks/head_viewer_redraw.py

A redraw is what the widget does when the token menu changes: ``HeadViewPainter.png`` draws the
lines for every weight above 0.02, the highlights and the title over the pixels of the frame it
kept (labels, titles, legend), and encodes the PNG. A toggle of a layer or a head also redraws
the frame once ("new frame" below). For comparison, "fresh figure" is ``draw_head_view`` plus
``figure_png``: the static call in the notebook. The weights are computed once when the widget
is built, so they are not part of a redraw.
The worst case is timed: an untrained model (its weights are spread out, so it has the most
lines) on the longest sequence of the lesson's copy task (T = 23), every token shown, two layers
of two heads; then the same with one token selected, and with 4 heads per layer.

Wall time and CPU time are both printed (min and median over repeats): on a shared 2-core machine
the wall time includes waiting for the CPU; the CPU time is what the redraw itself costs.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from mha_course.models.tasks import VOCAB, make_batch
from mha_course.models.tiny_model import TinyTransformer
from mha_course.widgets.head_viewer import WIDGET_DPI, HeadViewPainter, draw_head_view
from mha_course.widgets.plotting import figure_png

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
    batch = make_batch("copy", 64, rng=0, n_max=11)
    b = int(np.argmax(batch.lengths))  # a longest example: T = 2 * 11 + 1
    n = 2 * batch.lengths[b] + 1
    labels = [VOCAB[i] for i in batch.tokens[b, :n]]
    print(f"head viewer redraw (draw_head_view + PNG), T={n}, {REPEATS} repeats")
    print(f"{'case':>38} {'lines':>6} {'min wall':>9} {'median':>8} {'min cpu':>8}")
    worst = 0.0
    for h in (2, 4):
        model = TinyTransformer(len(VOCAB), 23, d_model=32, h=h, n_layers=2, rng=0)
        weights = [w[b, :, :n, :n] for w in model.attention_weights(batch.tokens)]
        # warm the font cache and the renderer
        figure_png(draw_head_view(weights, labels)[0], WIDGET_DPI)
        painter = HeadViewPainter()
        for name, token in (("every token", None), ("one token", n // 2)):
            lines = draw_head_view(weights, labels, token=token)[1]["lines"]
            cases = {
                "widget": lambda weights=weights, token=token, painter=painter: painter.png(
                    weights, labels, token=token),
                "widget, new frame": lambda weights=weights, token=token: HeadViewPainter().png(
                    weights, labels, token=token),
                "fresh figure": lambda weights=weights, token=token: figure_png(
                    draw_head_view(weights, labels, token=token)[0], WIDGET_DPI),
            }
            for case, fn in cases.items():
                best, median, cpu = timed(fn)
                if case != "fresh figure":
                    worst = max(worst, cpu)
                label = f"h={h}, {name}, {case}"
                print(f"{label:>38} {lines:>6} {best:>8.3f}s {median:>7.3f}s {cpu:>7.3f}s")
    verdict = "meets" if worst <= TARGET_S else "MISSES"
    print(f"slowest widget redraw {worst:.3f} s of CPU time: {verdict} the {TARGET_S} s target "
          "(on a busy machine the wall time adds the wait for a core)")


if __name__ == "__main__":
    main()
