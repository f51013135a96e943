"""The attention stepper of lesson 03: the steps it computes, the picture it draws, the widget."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from mha_course import causal_mask, scaled_dot_product_attention, softmax
from mha_course.widgets.stepper import (
    FIGSIZE,
    MASKS,
    STEPPER_LENGTH,
    STEPPER_TOKENS,
    STEPS,
    attention_intermediates,
    draw_stepper,
    stepper_inputs,
    stepper_mask,
    stepper_summary_line,
    stepper_widget,
)

T = len(STEPPER_TOKENS)


@pytest.fixture
def qkv():
    rng = np.random.default_rng(1)
    # every size different: T=3 queries, S=5 keys, d_k=4, d_v=6
    return rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 6))


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.0])
def test_each_step_is_the_previous_one_transformed(qkv, scale, temperature):
    q, k, v = qkv
    mask = np.array([[True, True, False, True, False]])  # (1, S): broadcasts over queries
    steps = attention_intermediates(q, k, v, scale=scale, temperature=temperature, mask=mask)
    divisor = (2.0 if scale else 1.0) * temperature  # √d_k = 2
    assert steps["divisor"] == pytest.approx(divisor)
    np.testing.assert_allclose(steps["scores"], q @ k.T)
    np.testing.assert_allclose(steps["scaled"], q @ k.T / divisor)
    assert (np.isneginf(steps["masked"]) == ~np.broadcast_to(mask, (3, 5))).all()
    np.testing.assert_allclose(steps["weights"], softmax(steps["masked"]), atol=1e-12)
    np.testing.assert_allclose(steps["output"], steps["weights"] @ v, atol=1e-12)


def test_scaled_at_temperature_one_is_the_packages_attention(qkv):
    q, k, v = qkv
    mask = causal_mask(3, 5)
    steps = attention_intermediates(q, k, v, mask=mask)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    np.testing.assert_allclose(steps["weights"], weights, rtol=1e-12)
    np.testing.assert_allclose(steps["output"], out, rtol=1e-12)


def test_no_mask_leaves_the_scaled_scores_as_they_are(qkv):
    steps = attention_intermediates(*qkv)
    assert steps["masked"] is steps["scaled"]
    assert np.isfinite(steps["masked"]).all()


@pytest.mark.parametrize("temperature", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_temperature_must_be_a_positive_number(qkv, temperature):
    with pytest.raises(ValueError,
                       match=r"attention_intermediates: temperature=.*expected a number > 0"):
        attention_intermediates(*qkv, temperature=temperature)


def test_wrong_shapes_are_reported_by_the_attention_function(qkv):
    q, k, v = qkv
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: k has shape \(4, 5\)"):
        attention_intermediates(q, k.T, v)


def test_masks_are_none_causal_and_padding_of_the_stepper_sentence():
    assert stepper_mask("none") is None
    np.testing.assert_array_equal(stepper_mask("causal"), causal_mask(T))
    pad = stepper_mask("padding")
    assert pad.shape == (1, T)
    assert pad[0].tolist() == [i < STEPPER_LENGTH for i in range(T)]
    with pytest.raises(ValueError, match="stepper_mask: kind='diagonal'; expected one of none"):
        stepper_mask("diagonal")


def test_inputs_are_seeded_and_give_raw_scores_of_spread_near_root_d_k():
    a, b, c = stepper_inputs(0), stepper_inputs(0), stepper_inputs(1)
    np.testing.assert_array_equal(a["q"], b["q"])
    assert not np.allclose(a["q"], c["q"])
    np.testing.assert_array_equal(a["k"][STEPPER_LENGTH], a["k"][-1])  # one <pad> vector
    # unit-variance q and k entries: raw scores spread like √d_k (= 4), not like 1 or d_k
    spreads = [(s["q"] @ s["k"].T).std() for s in map(stepper_inputs, range(20))]
    assert 2.5 < np.mean(spreads) < 6


# ------------------------------------------------------------------------------ the picture
def _panels(fig):
    return {ax.get_label(): ax for ax in fig.axes if ax.get_label() in STEPS}


def _first_row(ax):
    """The numbers printed in the first row of a panel's cells (one text per cell)."""
    n_cols = ax.images[0].get_array().shape[1]
    return [t.get_text() for t in ax.texts[:n_cols]]


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("scale", [True, False])
def test_each_panel_shows_its_step_and_the_numbers_in_its_cells(mask, scale):
    fig, summary = draw_stepper(scale, 0.5, mask)
    panels = _panels(fig)
    assert list(panels) == list(STEPS)
    for step in STEPS:
        shown = panels[step].images[0].get_array()
        np.testing.assert_array_equal(shown.filled(-np.inf), summary[step])
        first_row = _first_row(panels[step])
        assert len(first_row) == summary[step].shape[1] and all(first_row)
    assert np.isneginf(summary["masked"]).sum() == summary["masked_cells"]
    assert summary["masked_cells"] == {"none": 0, "causal": T * (T - 1) // 2,
                                       "padding": T * (T - STEPPER_LENGTH)}[mask]


def test_masked_cells_are_grey_and_say_minus_infinity():
    fig, summary = draw_stepper(mask="padding")
    masked = _panels(fig)["masked"]
    row = _first_row(masked)
    assert row[STEPPER_LENGTH:] == ["−∞"] * (T - STEPPER_LENGTH)
    grey = masked.images[0].get_cmap().get_bad()
    assert grey[0] == grey[1] == grey[2] != 1.0


def test_the_numbers_are_legible_and_fit_their_cells():
    # Review D42: at notebook width the cell numbers were about 6 pt.
    fig, _ = draw_stepper(False, 0.25, "causal")  # the widest numbers: "-10", "-2.4", "−∞"
    renderer = FigureCanvasAgg(fig).get_renderer()
    for ax in _panels(fig).values():
        n_cols = ax.images[0].get_array().shape[1]
        cell_px = ax.get_window_extent(renderer).width / n_cols
        cells = ax.texts[: n_cols * T]
        assert min(t.get_fontsize() for t in cells) >= 7.0
        widest = max(t.get_window_extent(renderer).width for t in cells if t.get_text())
        assert widest < 0.95 * cell_px, (ax.get_label(), widest, cell_px)
        labels = ax.texts[n_cols * T:]
        assert labels and min(t.get_fontsize() for t in labels) >= 8


def test_all_panels_share_one_colour_scale():
    fig, _ = draw_stepper()
    norms = {id(ax.images[0].norm) for ax in _panels(fig).values()}
    assert len(norms) == 1


def test_padding_mask_puts_no_weight_on_pad_and_rows_sum_to_one():
    _, none = draw_stepper(mask="none")
    _, padded = draw_stepper(mask="padding")
    assert none["pad_weight"] > 0.01
    assert padded["pad_weight"] == 0.0
    np.testing.assert_allclose(padded["row_sums"], 1.0)


def test_scaling_off_divides_by_one_and_sharpens_the_weights():
    _, on = draw_stepper(True)
    _, off = draw_stepper(False)
    assert (on["divisor"], off["divisor"]) == (4.0, 1.0)
    np.testing.assert_allclose(off["scaled"], on["scaled"] * 4)
    assert off["weights"].max(axis=-1).mean() > on["weights"].max(axis=-1).mean()


def test_redrawing_into_the_figure_keeps_its_axes_and_size():
    fig, _ = draw_stepper()
    n_axes = len(fig.axes)
    for args in [(False, 4.0, "causal"), (True, 0.25, "padding")]:
        again, summary = draw_stepper(*args, fig=fig)
        assert again is fig and len(fig.axes) == n_axes
        assert tuple(fig.get_size_inches()) == FIGSIZE
        np.testing.assert_array_equal(
            _panels(fig)["weights"].images[0].get_array(), summary["weights"])


def test_summary_line_states_scale_mask_and_the_largest_weight():
    _, summary = draw_stepper(False, 2.0, "causal")
    line = stepper_summary_line(summary)
    weight, query, key = summary["largest"]
    assert line.startswith("scores ÷ 2 (√d_k off, τ=2) | mask causal: 15 cells −∞ | ")
    assert f"largest weight {weight:.2f} ({query}→{key})" in line
    assert line.endswith("most weight on <pad>: 0.00")


# ------------------------------------------------------------------------------ the widget
def _png_size(image):
    return Image.open(io.BytesIO(image.value)).size


def test_widget_redraws_on_every_control_and_keeps_its_size():
    box = stepper_widget()
    (scale, temperature, mask), summary, image = box.children[0].children, *box.children[1:]
    assert not temperature.continuous_update
    size = _png_size(image)
    assert size == (round(FIGSIZE[0] * 100), round(FIGSIZE[1] * 100))
    seen = {(summary.value, image.value)}
    for control, value in ((scale, False), (temperature, 0.25), (mask, "causal"),
                           (mask, "padding")):
        control.value = value
        assert (summary.value, image.value) not in seen, f"{control.description} did not redraw"
        seen.add((summary.value, image.value))
        assert _png_size(image) == size
    assert "mask padding: 12 cells −∞" in summary.value
    assert "τ=0.25" in summary.value and "√d_k off" in summary.value


def test_widget_summary_never_breaks_inside_an_item():
    box = stepper_widget()
    html = box.children[1].value
    assert html.count("white-space: nowrap") == 5
    assert "&lt;pad&gt;" in html


def test_widget_leaves_no_pyplot_figure_open():
    before = plt.get_fignums()
    box = stepper_widget()
    box.children[0].children[2].value = "causal"
    assert plt.get_fignums() == before

