"""How long the course's widgets take to redraw, and how big they are, at every setting.

Run from the repository root::

    .venv/bin/python benchmarks/explorer_redraw.py [--repeats 5]

1. Lesson 04's h / d_k explorer, at every h from 1 to 16 (d_model = 48 held, so 5, 7, 9, ...
   show the error message instead of heads): one redraw is what the widget does when a slider
   is released, ``draw_explorer`` into the widget's own figure (its 16 heatmap axes already
   exist) plus rendering the PNG the ``Image`` shows. The target is <= 0.3 s. The widget's
   height is fixed by its layout; the PNG's pixel size is printed for every h to show it never
   changes (the 1366 x 768 screen the widget must fit leaves about 530 pixels below
   JupyterLab's bars).
2. The explorer's largest attention weight at (h, d_k) = (8, 6), (16, 12), (16, 64) with
   d_model not held, under the package's Xavier initialisation (what the explorer used before)
   and the fan-in initialisation it uses now: Xavier's variance shrinks with h·d_k and washes
   the heads out.
3. Lesson 03's attention stepper, at every mask with the scaling on and off.

Wall time and CPU time are both printed (min and median over repeats): on a shared 2-core
machine the wall time includes waiting for the CPU; the CPU time is what the redraw itself
costs (inflated too when other processes share the core's caches). Not a test: numbers differ
from run to run; the verdict compares the median CPU time with the target.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time

import numpy as np
from PIL import Image

from mha_course.widgets.explorer import FIGSIZE, TOKENS, WIDGET_DPI, draw_explorer, explorer
from mha_course.widgets.plotting import figure_png, plot_heads
from mha_course.widgets.stepper import DPI as STEPPER_DPI
from mha_course.widgets.stepper import MASKS, draw_stepper

TARGET_S = 0.3


def timed(fn, repeats):
    """(min wall, median wall, median cpu) of ``repeats`` calls of ``fn``, in seconds."""
    walls, cpus = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return min(walls), statistics.median(walls), statistics.median(cpus)


def png_size(png: bytes) -> tuple[int, int]:
    return Image.open(io.BytesIO(png)).size


def explorer_section(repeats: int) -> float:
    T = len(TOKENS)
    widget_fig, _ = plot_heads(np.zeros((16, T, T)), figsize=FIGSIZE)  # as explorer() does
    figure_png(widget_fig, dpi=WIDGET_DPI)  # warm the font cache and the renderer
    box = explorer()
    print(f"1. explorer redraw (draw_explorer + PNG), d_model=48 held, T={T}, {repeats} repeats")
    print(f"   widget layout: height {box.layout.height}, controls {box.children[0].layout.width} "
          f"wide, picture {box.children[1].layout.width} x {box.children[1].layout.height}")
    print(f"{'h':>5} {'drawn':>6} {'min wall':>9} {'median':>8} {'med cpu':>8} {'PNG (px)':>10}")
    worst, sizes = 0.0, set()
    for h in range(1, 17):
        box.children[0].children[0].value = h  # the widget itself redraws too
        fig, summary = draw_explorer(h, 0, fig=widget_fig)
        png = figure_png(fig, dpi=WIDGET_DPI)
        best, median, cpu = timed(
            lambda h=h: figure_png(draw_explorer(h, 0, fig=widget_fig)[0], dpi=WIDGET_DPI),
            repeats)
        worst = max(worst, cpu)
        drawn = summary["heads_drawn"] if summary["error"] is None else "error"
        w, hgt = png_size(png)
        sizes.add((w, hgt))
        print(f"{h:>5} {drawn!s:>6} {best:>8.3f}s {median:>7.3f}s {cpu:>7.3f}s {w:>5}x{hgt:<4}")
    print(f"   PNG sizes seen: {sorted(sizes)} (FIGSIZE {FIGSIZE} in at {WIDGET_DPI} dpi); "
          f"slowest median CPU {worst:.3f} s: "
          f"{'meets' if worst <= TARGET_S else 'MISSES'} the {TARGET_S} s target")
    return worst


def init_section() -> None:
    print("\n2. largest attention weight, d_model=48 not held (uniform over 11 keys: 0.091)")
    print(f"{'(h, d_k)':>10} {'xavier (before)':>16} {'fan-in (now)':>13}")
    for h, d_k in [(8, 6), (16, 12), (16, 64)]:
        before = draw_explorer(h, d_k, hold_d_model=False, init="xavier")[1]["largest_weight"]
        after = draw_explorer(h, d_k, hold_d_model=False, init="fan_in")[1]["largest_weight"]
        print(f"{f'({h}, {d_k})':>10} {before:>16.3f} {after:>13.3f}")


def stepper_section(repeats: int) -> float:
    fig, _ = draw_stepper()
    png = figure_png(fig, dpi=STEPPER_DPI)
    print(f"\n3. stepper redraw (draw_stepper + PNG), {repeats} repeats; PNG {png_size(png)} px")
    print(f"{'mask':>8} {'scale':>6} {'min wall':>9} {'median':>8} {'med cpu':>8}")
    worst = 0.0
    for mask in MASKS:
        for scale in (True, False):
            best, median, cpu = timed(
                lambda m=mask, s=scale: figure_png(draw_stepper(s, 0.5, m, fig=fig)[0],
                                                   dpi=STEPPER_DPI), repeats)
            worst = max(worst, cpu)
            print(f"{mask:>8} {scale!s:>6} {best:>8.3f}s {median:>7.3f}s {cpu:>7.3f}s")
    print(f"   slowest median CPU {worst:.3f} s: "
          f"{'meets' if worst <= TARGET_S else 'MISSES'} the {TARGET_S} s target")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    explorer_section(args.repeats)
    init_section()
    stepper_section(args.repeats)


if __name__ == "__main__":
    main()
