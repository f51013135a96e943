"""The h / d_k explorer of lesson 04: the pure drawing function, its summary line, the widget."""

from __future__ import annotations

import io
import pathlib

import matplotlib.pyplot as plt
import nbformat
import numpy as np
import pytest
from PIL import Image

import mha_course
from mha_course.widgets.explorer import (
    AUTOSCALE_LABEL,
    AUTOSCALE_TOOLTIP,
    FIGSIZE,
    HOLD_LABEL,
    WIDGET_DPI,
    colour_top,
    d_k_note,
    draw_explorer,
    explorer,
    explorer_layer,
    summary_items,
    summary_line,
    toy_embeddings,
)
from mha_course.widgets.plotting import TOKENS, figure_png

T = len(TOKENS)
LESSON_04 = pathlib.Path(__file__).resolve().parents[1] / "notebooks/04_multi_head_attention.ipynb"


def _heatmaps(fig):
    return [ax for ax in fig.axes if ax.get_visible() and ax.images
            and ax.get_label().startswith("head ")]


@pytest.mark.parametrize("h", [1, 2, 3, 4, 6, 8, 12, 16])
def test_heads_drawn_is_counted_from_the_figure_and_equals_h(h):
    fig, summary = draw_explorer(h, d_k=7)
    heatmaps = _heatmaps(fig)
    assert len(heatmaps) == h
    assert summary["heads_drawn"] == h
    assert [ax.get_title() for ax in heatmaps] == [f"head {i + 1}" for i in range(h)]


@pytest.mark.parametrize("h", [5, 7, 16])
def test_heads_drawn_equals_h_with_free_d_k(h):
    _, summary = draw_explorer(h, d_k=5, hold_d_model=False)
    assert summary["heads_drawn"] == h
    assert summary["d_k"] == 5


@pytest.mark.parametrize(("h", "d_k", "hold"), [(4, 99, True), (16, 1, True), (5, 7, False),
                                                (3, 64, False)])
def test_param_count_and_flops_equal_the_package(h, d_k, hold):
    _, summary = draw_explorer(h, d_k, d_model=48, hold_d_model=hold)
    used_d_k = 48 // h if hold else d_k
    assert summary["param_count"] == mha_course.param_count(48, h, used_d_k)
    assert summary["flops"] == mha_course.attention_flops(T, 48, h, used_d_k)
    assert summary["weights_shape"] == (h, T, T)
    assert summary["weights_values"] == h * T * T


@pytest.mark.parametrize(("h", "d_model"), [(1, 48), (4, 48), (16, 48), (3, 30)])
def test_hold_d_model_sets_d_k_to_d_model_over_h_and_ignores_the_d_k_given(h, d_model):
    _, summary = draw_explorer(h, d_k=13, d_model=d_model, hold_d_model=True)
    assert summary["d_k"] == d_model // h
    assert summary["param_count"] == 4 * d_model**2


def test_weights_are_those_of_the_seeded_layer_and_rows_sum_to_one():
    _, a = draw_explorer(4, 12, seed=3)
    _, b = draw_explorer(4, 12, seed=3)
    _, c = draw_explorer(4, 12, seed=4)
    np.testing.assert_array_equal(a["weights"], b["weights"])
    assert not np.allclose(a["weights"], c["weights"])
    np.testing.assert_allclose(a["weights"].sum(-1), 1.0)
    layer = explorer_layer(48, 4, seed=3)
    np.testing.assert_allclose(layer(toy_embeddings(48))[1], a["weights"])


# ------------------------------------------------------------------- the initialisation
def _scaled_score_std(h, d_k, init, seeds=range(6)):
    """Spread of q·k/√d_k over the example sentence, pooled over a few seeds."""
    x = toy_embeddings(48)
    scores = []
    for seed in seeds:
        layer = explorer_layer(48, h, d_k, seed=seed, init=init)
        q = mha_course.split_heads(x @ layer.W_q, h)  # (h, T, d_k)
        k = mha_course.split_heads(x @ layer.W_k, h)
        scores.append(q @ k.swapaxes(-1, -2) / np.sqrt(d_k))
    return float(np.std(scores))


def test_fan_in_init_keeps_the_score_spread_whatever_h_and_d_k():
    spreads = [_scaled_score_std(h, d_k, "fan_in") for h, d_k in [(1, 4), (8, 6), (16, 12),
                                                                  (16, 64), (3, 48)]]
    assert all(0.75 < s < 1.3 for s in spreads), spreads


def test_xavier_init_washes_the_scores_out_as_h_times_d_k_grows():
    small, large = _scaled_score_std(8, 6, "xavier"), _scaled_score_std(16, 64, "xavier")
    assert large < small / 4  # the misleading picture the fan-in init avoids


@pytest.mark.parametrize(("h", "d_k"), [(8, 6), (16, 12), (16, 64)])
def test_raising_d_k_does_not_flatten_the_heads(h, d_k):
    _, summary = draw_explorer(h, d_k, hold_d_model=False)
    assert summary["largest_weight"] > 0.4
    _, xavier = draw_explorer(h, d_k, hold_d_model=False, init="xavier")
    if h * d_k >= 16 * 64:
        assert xavier["largest_weight"] < 0.25


def test_unknown_init_is_refused_by_name():
    with pytest.raises(ValueError, match="draw_explorer: init='he'; expected one of fan_in"):
        draw_explorer(4, 12, init="he")
    with pytest.raises(ValueError, match="explorer_layer: init='he'; expected one of fan_in"):
        explorer_layer(48, 4, init="he")


# ------------------------------------------------------------------- the picture
def test_colour_scale_is_0_to_1_by_default_in_every_setting():
    # Review D41: a fixed scale, so a peakier setting looks peakier (lesson 03's promise).
    for h, d_k in ((1, 48), (4, 12), (16, 3)):
        fig, summary = draw_explorer(h, d_k)
        assert summary["autoscale"] is False and summary["colour_top"] == 1.0
        assert {ax.images[0].get_clim() for ax in _heatmaps(fig)} == {(0.0, 1.0)}


def test_autoscale_tops_the_colour_scale_at_the_largest_weight_rounded_up():
    fig, summary = draw_explorer(4, 12, autoscale=True)
    top = summary["colour_top"]
    assert summary["autoscale"] is True and top == colour_top(summary["weights"]) < 1.0
    assert summary["largest_weight"] <= top < summary["largest_weight"] + 0.1 + 1e-9
    assert {ax.images[0].get_clim() for ax in _heatmaps(fig)} == {(0.0, top)}
    again, fixed = draw_explorer(4, 12, fig=fig)  # and back to 0-1 in the same figure
    assert fixed["colour_top"] == 1.0
    assert {ax.images[0].get_clim() for ax in _heatmaps(again)} == {(0.0, 1.0)}


def test_the_colorbar_sits_beside_the_grid_and_the_axis_names_beside_the_labels():
    # Review D41: no detached colorbar, no axis name at the far edge of the figure.
    for h in (1, 4, 16):
        fig, _ = draw_explorer(h, 12 if 48 % h else 48 // h)
        heat = [ax.get_position() for ax in _heatmaps(fig)]
        right, left = max(b.x1 for b in heat), min(b.x0 for b in heat)
        bar = fig._heads_state["colorbar"].ax.get_position()
        W = fig.get_size_inches()[0]
        assert 0 < (bar.x0 - right) * W < 0.3, (h, (bar.x0 - right) * W)
        assert np.isclose(bar.y0, min(b.y0 for b in heat)) and np.isclose(
            bar.y1, max(b.y1 for b in heat))
        query = next(t for t in fig.texts if t.get_text() == "query (attending)")
        assert 0 < (left - query.get_position()[0]) * W < 1.0, h


@pytest.mark.parametrize("h", [1, 3, 5, 11, 16])
def test_slider_stops_with_and_without_a_layer_render_the_same_size(h):
    fig, _ = draw_explorer(h, 12)  # h = 5, 7, 9, ... show the error in the same figure
    size = Image.open(io.BytesIO(figure_png(fig, dpi=WIDGET_DPI))).size
    assert size == (round(FIGSIZE[0] * WIDGET_DPI), round(FIGSIZE[1] * WIDGET_DPI))


def test_non_divisor_h_with_hold_shows_the_package_error_instead_of_raising():
    with pytest.raises(ValueError) as excinfo:
        mha_course.MultiHeadAttention(48, 5)
    fig, summary = draw_explorer(5, d_k=12, d_model=48, hold_d_model=True)
    assert summary["error"] == str(excinfo.value)
    assert summary["heads_drawn"] == 0 and not _heatmaps(fig)
    shown = " ".join(t.get_text() for t in fig.texts if t.get_visible()).replace("\n", " ")
    assert "d_model=48 is not divisible by h=5" in shown
    assert "heads drawn: 0" in summary_line(summary)
    assert "d_model=48 is not divisible by h=5; pass d_k explicitly" in summary_line(summary)


def test_the_error_then_heads_again_in_one_figure():
    fig, _ = draw_explorer(16, 3)
    again, _ = draw_explorer(5, 3, fig=fig)
    assert again is fig and not _heatmaps(fig)
    again, summary = draw_explorer(8, 3, fig=fig)
    assert len(_heatmaps(fig)) == summary["heads_drawn"] == 8
    assert not any(t.get_visible() and "divisible" in t.get_text() for t in fig.texts)


def test_invalid_sizes_raise_value_error_naming_the_function():
    with pytest.raises(ValueError, match="draw_explorer: h=0 must be an integer >= 1"):
        draw_explorer(0, 12)
    with pytest.raises(ValueError, match="draw_explorer: d_k=0 must be an integer >= 1"):
        draw_explorer(4, 0, hold_d_model=False)


def test_summary_line_has_no_space_inside_a_number_or_a_shape():
    _, summary = draw_explorer(4, 12)
    line = summary_line(summary)
    assert line.startswith("h=4 d_k=12 d_model=48 | heads drawn: 4 | parameters: 9,216 | ")
    assert f"| FLOPs: {mha_course.attention_flops(T, 48, 4)['total']:,} |" in line
    assert "| weights: 4×11×11 = 484 |" in line
    assert line.endswith(f"largest weight: {summary['largest_weight']:.2f}")
    for item in summary_items(summary):
        for word in item.split():
            assert not word.endswith(","), f"a number broken after a comma in {item!r}"
    _, big = draw_explorer(16, 64, hold_d_model=False)
    assert "parameters: 196,608 |" in summary_line(big)
    assert "weights: 16×11×11 = 1,936" in summary_line(big)


def test_redrawing_into_a_figure_reuses_its_axes_and_hides_the_spares():
    fig, _ = draw_explorer(16, 3)
    n_axes = len(fig.axes)
    again, summary = draw_explorer(2, 24, fig=fig)
    assert again is fig
    assert len(fig.axes) == n_axes  # nothing added
    assert summary["heads_drawn"] == 2
    visible = _heatmaps(fig)
    np.testing.assert_array_equal(visible[1].images[0].get_array(), summary["weights"][1])


# ----------------------------------------------------------------------------- the widget
def _widgets(box):
    controls, image = box.children
    h, d_k, note, hold, autoscale, panel = controls.children
    assert autoscale.description == AUTOSCALE_LABEL
    return {"h": h, "d_k": d_k, "autoscale": autoscale, "note": note}, hold, panel, image


def _png_size(image):
    return Image.open(io.BytesIO(image.value)).size


def test_explorer_widgets_match_the_documented_interface():
    box = explorer()
    sliders, hold, panel, image = _widgets(box)
    assert type(box).__name__ == "HBox"
    assert (sliders["h"].min, sliders["h"].max) == (1, 16)
    assert (sliders["d_k"].min, sliders["d_k"].max) == (1, 64)
    assert not sliders["h"].continuous_update and not sliders["d_k"].continuous_update
    assert hold.description == HOLD_LABEL == "hold d_model (d_k = d_model / h)"
    assert hold.value and sliders["d_k"].disabled
    assert "heads drawn: 4" in panel.value and "9,216" in panel.value
    assert _png_size(image) == (round(FIGSIZE[0] * WIDGET_DPI), round(FIGSIZE[1] * WIDGET_DPI))


def test_h_with_and_without_a_layer_keeps_the_widget_and_its_picture_the_same_size():
    box = explorer()
    sliders, hold, panel, image = _widgets(box)
    layouts = (box.layout.height, box.children[0].layout.width, panel.layout.height,
               image.layout.width, image.layout.height)
    sizes = set()
    for h in (16, 5, 1, 7, 12):  # divisors of 48 and not
        sliders["h"].value = h
        sizes.add(_png_size(image))
        assert (box.layout.height, box.children[0].layout.width, panel.layout.height,
                image.layout.width, image.layout.height) == layouts
    assert len(sizes) == 1


def test_moving_the_h_slider_redraws_the_picture_and_the_numbers():
    box = explorer()
    sliders, _, panel, image = _widgets(box)
    before = image.value
    sliders["h"].value = 8
    assert "heads drawn: 8" in panel.value and image.value != before
    assert sliders["d_k"].value == 6  # follows d_model // h while held
    assert "9,216" in panel.value  # parameters: 4·d_model², whatever h


def test_parameters_and_flops_are_shown_large_and_without_line_breaks():
    box = explorer()
    _, _, panel, _ = _widgets(box)
    assert "font-size: 22px" in panel.value
    assert panel.value.count("white-space: nowrap") >= 5
    assert f"{mha_course.attention_flops(T, 48, 4)['total']:,}" in panel.value


def test_unholding_d_model_lets_the_d_k_slider_change_the_parameter_count():
    box = explorer()
    sliders, hold, panel, _ = _widgets(box)
    hold.value = False
    assert not sliders["d_k"].disabled
    sliders["h"].value = 5
    sliders["d_k"].value = 7
    assert "h=5 d_k=7" in panel.value and "heads drawn: 5" in panel.value
    assert f"{mha_course.param_count(48, 5, 7):,}" in panel.value
    hold.value = True
    assert sliders["d_k"].disabled and sliders["d_k"].value == 48 // 5
    assert "heads drawn: 0" in panel.value
    assert "not divisible by h=5" in panel.value


def test_the_autoscale_box_redraws_with_the_colours_stretched_and_back():
    box = explorer()
    controls, _, panel, image = _widgets(box)
    assert not controls["autoscale"].value and "(colour 0–1.0)" in panel.value
    before = image.value
    controls["autoscale"].value = True
    _, summary = draw_explorer(4, 12, autoscale=True)
    assert f"(colour 0–{summary['colour_top']:.1f})" in panel.value and image.value != before
    controls["autoscale"].value = False
    assert "(colour 0–1.0)" in panel.value and image.value == before


def test_explorer_redraws_leave_no_pyplot_figures_open():
    before = plt.get_fignums()
    box = explorer()
    sliders, *_ = _widgets(box)
    for h in (16, 2, 8):
        sliders["h"].value = h
    assert plt.get_fignums() == before


# ----------------------------------------------------- newcomer trial items 7 and 8 (2 Dec 2026)
def test_the_autoscale_label_is_no_longer_than_the_hold_label_and_its_tooltip_explains_it():
    # The long label "autoscale colours (0 to the largest weight)" was cut off in the 250-pixel
    # column; the hold label beside it fits (tests/browser/test_lab.py measures both in Chromium).
    box = explorer()
    sliders, hold, _, _ = _widgets(box)
    assert len(AUTOSCALE_LABEL) <= len(hold.description)
    assert sliders["autoscale"].tooltip == AUTOSCALE_TOOLTIP
    assert "0 to the largest weight" in AUTOSCALE_TOOLTIP
    assert "instead of 0 to 1" in AUTOSCALE_TOOLTIP


@pytest.mark.parametrize(("d_model", "h", "d_k", "hold", "expected"), [
    (48, 4, 12, True, "d_k = d_model / h = 48 / 4 = 12 while 'hold d_model' is ticked"),
    (48, 16, 3, True, "d_k = d_model / h = 48 / 16 = 3 while 'hold d_model' is ticked"),
    (48, 5, 9, True, "48 / 5 is not a whole number: no d_k while 'hold d_model' is ticked"),
    (48, 5, 7, False, "d_k set freely: h·d_k = 5·7 = 35 (d_model = 48)"),
])
def test_d_k_note_says_why_the_slider_is_greyed_or_what_a_free_d_k_gives(d_model, h, d_k, hold,
                                                                          expected):
    note = d_k_note(d_model, h, d_k, hold)
    assert note.startswith(expected)
    assert ("untick it to set d_k" in note) is hold
    assert len(note) <= 90  # two lines of the controls column at 11 px


def test_the_greyed_d_k_slider_has_a_visible_line_and_a_tooltip_that_say_why():
    box = explorer()
    sliders, hold, _, _ = _widgets(box)
    assert sliders["d_k"].disabled
    assert d_k_note(48, 4, 12, True) in sliders["note"].value  # shown under the slider
    assert sliders["d_k"].tooltip == d_k_note(48, 4, 12, True)
    sliders["h"].value = 6  # the line follows h
    assert "48 / 6 = 8 while 'hold d_model' is ticked" in sliders["note"].value
    hold.value = False
    assert not sliders["d_k"].disabled and sliders["d_k"].tooltip is None
    assert "d_k set freely: h·d_k = 6·8 = 48" in sliders["note"].value
    sliders["d_k"].value = 10
    assert "h·d_k = 6·10 = 60" in sliders["note"].value
    hold.value = True
    assert "48 / 6 = 8 while 'hold d_model' is ticked" in sliders["note"].value


def test_the_note_takes_its_height_from_the_panel_so_the_column_keeps_its_height():
    box = explorer()
    controls = box.children[0]
    _, _, panel, image = _widgets(box)
    note = controls.children[2]
    px = [int(w.layout.height.removesuffix("px")) for w in (note, panel)]
    assert controls.layout.height == image.layout.height
    assert sum(px) == int(image.layout.height.removesuffix("px")) - 140


def test_lesson_04s_explorer_cell_shows_the_default_setting():
    # Newcomer item 7: these checks were in the lesson's cell, reaching into the widget; the cell
    # now only shows it, and this test runs that cell's code.
    cells = [c for c in nbformat.read(LESSON_04, as_version=4).cells
             if c.cell_type == "code" and "nbval-ignore-output" in c.metadata.get("tags", [])
             and "explorer(" in c.source]
    assert [c.source.strip() for c in cells] == ["explorer()"]
    box = eval(cells[0].source, {"explorer": explorer})
    sliders, hold, panel, image = _widgets(box)
    assert hold.value and (sliders["h"].value, sliders["d_k"].value) == (4, 12)
    assert "heads drawn: 4" in panel.value and "(colour 0–1.0)" in panel.value
    assert image.value[:4] == b"\x89PNG"
    assert _png_size(image) == (round(FIGSIZE[0] * WIDGET_DPI), round(FIGSIZE[1] * WIDGET_DPI))
