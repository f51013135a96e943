"""Lesson 07's tile stepper: the states it shows are tiled_attention's, its drawing and widget."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pytest

from mha_course import causal_mask, logsumexp, scaled_dot_product_attention
from mha_course.widgets.tile_stepper import (
    draw_tile_step,
    example_qkv,
    step_state,
    step_summary,
    tile_states,
    tile_stepper,
)

T = 9


@pytest.mark.parametrize(("block", "causal", "n_tiles"),
                         [(1, False, 81), (1, True, 45), (2, False, 25), (2, True, 15),
                          (3, False, 9), (3, True, 6), (4, True, 6), (9, True, 1)])
def test_the_walk_visits_the_tiles_the_causal_mask_does_not_skip(block, causal, n_tiles):
    run = tile_states(block, causal)
    assert len(run["states"]) == n_tiles
    summary = step_state(0, block_size=block, causal=causal)
    n_blocks = -(-T // block)
    assert summary["visited"] == n_tiles and summary["skipped"] == n_blocks**2 - n_tiles


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [1, 2, 3, 4, 9])
def test_every_step_shows_the_running_max_and_sum_of_the_keys_seen(block, causal):
    q, k, v = example_qkv()
    scores = q @ k.T / np.sqrt(q.shape[-1])
    allowed = causal_mask(T) if causal else np.ones((T, T), bool)
    final = scaled_dot_product_attention(q, k, v, mask=allowed)[0]
    n = len(tile_states(block, causal)["states"])
    for step in range(n):
        s = step_state(step, block_size=block, causal=causal)
        (t0, t1), (_, s1) = s["queries"], s["keys"]
        seen = np.where(allowed[t0:t1, :s1], scores[t0:t1, :s1], -np.inf)
        np.testing.assert_allclose(s["m"], seen.max(axis=-1), rtol=1e-12)
        np.testing.assert_allclose(s["l"], np.exp(seen - seen.max(axis=-1, keepdims=True))
                                   .sum(axis=-1), rtol=1e-12)
        np.testing.assert_allclose(s["final_m"] + np.log(s["final_l"]),
                                   logsumexp(np.where(allowed, scores, -np.inf))[t0:t1],
                                   rtol=1e-12)
        if s["block_done"]:  # the block's last tile: its output is final
            assert s["error"].max() < 1e-12
            assert s["keys"][1] == (min(T, t1) if causal else T)
        else:
            assert s["keys"][1] < T
        assert s["error"].shape == (t1 - t0,)
        assert np.all(np.isfinite(final[t0:t1]))


def test_summary_line_says_which_tile_and_its_numbers():
    _, s = draw_tile_step(5, block_size=3, causal=True)
    line = step_summary(s)
    assert line.startswith("tile 6/6: queries 6-8 x keys 6-8 | m = [")
    assert line.endswith("| max |out - final| = 0.0000 | tiles visited 6, skipped 3")
    assert not re.search(r"\d\.\d{4,}\D*\|? m", line)  # rounded numbers only
    assert "l = [" + ", ".join(f"{x:.3f}" for x in s["l"]) + "]" in line


def test_the_figure_has_the_three_panels_and_outlines_the_current_tile():
    fig, s = draw_tile_step(2, block_size=4, causal=False)
    titles = [ax.get_title() or ax.get_title(loc="left") for ax in fig.axes]
    assert "scores: tile 3 of 9 outlined" in titles[0]
    assert titles[1] == "output so far vs final\n(current block of queries)"
    assert titles[2] == "running max and sum of the block's queries"
    thick = [p for p in fig.axes[0].patches if p.get_linewidth() > 2]
    assert len(thick) == 1
    assert (thick[0].get_x(), thick[0].get_y()) == (8 - 0.5, 0 - 0.5)  # keys 8.., queries 0..
    assert s["queries"] == (0, 4) and s["keys"] == (8, 9)
    assert plt.get_fignums() == []  # not tracked by pyplot


@pytest.mark.parametrize(("step", "message"),
                         [(6, r"step=6; expected an integer from 0 to 5 \(6 tiles for "
                              r"block_size=3, causal=True\)"),
                          (-1, r"step=-1; expected an integer from 0 to 5"),
                          (1.0, r"step=1.0; expected an integer")])
def test_a_step_out_of_range_is_refused_with_the_range(step, message):
    with pytest.raises(ValueError, match="^draw_tile_step: " + message):
        draw_tile_step(step, block_size=3, causal=True)
    with pytest.raises(ValueError, match="^draw_tile_step: " + message):
        step_state(step, block_size=3, causal=True)


def test_bad_block_size_names_the_function():
    with pytest.raises(ValueError, match="^tile_states: block_size=0 must be an integer >= 1$"):
        draw_tile_step(0, block_size=0)


# ----------------------------------------------------------------------------- the widget
def _parts(box):
    step, block, causal = box.children[0].children
    return step, block, causal, box.children[1]


def _text(out):
    return "".join(o.get("text", "") for o in out.outputs if o["output_type"] == "stream")


def test_widget_controls_and_first_picture():
    box = tile_stepper()
    step, block, causal, out = _parts(box)
    assert (step.min, step.max, step.value) == (0, 8, 0)
    assert not step.continuous_update
    assert block.value == 3 and not causal.value
    assert _text(out).startswith("tile 1/9: queries 0-2 x keys 0-2")
    assert any("image/png" in o.get("data", {}) for o in out.outputs)


def test_moving_the_slider_and_switching_causal_redraw():
    box = tile_stepper()
    step, block, causal, out = _parts(box)
    step.value = 8
    assert _text(out).startswith("tile 9/9: queries 6-8 x keys 6-8")
    causal.value = True  # a shorter walk: back to its first tile, slider range shrinks
    assert (step.value, step.max) == (0, 5)
    assert _text(out).startswith("tile 1/6:") and "skipped 3" in _text(out)
    block.value = 1
    assert step.max == 44 and _text(out).startswith("tile 1/45:")
    assert len(out.outputs) == 2  # replaced, not appended
