"""The h / d_k explorer of lesson 04: the pure drawing function, its summary line, the widget."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pytest

import mha_course
from mha_course.explorer import draw_explorer, explorer, plot_heads, summary_line
from mha_course.plotting import TOKENS

T = len(TOKENS)


@pytest.mark.parametrize("h", [1, 2, 3, 4, 6, 8, 12, 16])
def test_heads_drawn_is_counted_from_the_figure_and_equals_h(h):
    fig, summary = draw_explorer(h, d_k=7)
    heatmaps = [ax for ax in fig.axes if ax.get_visible() and ax.images
                and ax.get_label().startswith("head ")]
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


def test_non_divisor_h_with_hold_shows_the_package_error_instead_of_raising():
    with pytest.raises(ValueError) as excinfo:
        mha_course.MultiHeadAttention(48, 5)
    fig, summary = draw_explorer(5, d_k=12, d_model=48, hold_d_model=True)
    assert summary["error"] == str(excinfo.value)
    assert summary["heads_drawn"] == 0
    shown = " ".join(t.get_text() for t in fig.texts).replace("\n", " ")
    assert "d_model=48 is not divisible by h=5" in shown
    assert "heads drawn: 0" in summary_line(summary)
    assert "d_model=48 is not divisible by h=5; pass d_k explicitly" in summary_line(summary)


def test_invalid_sizes_raise_value_error_naming_the_function():
    with pytest.raises(ValueError, match="draw_explorer: h=0 must be an integer >= 1"):
        draw_explorer(0, 12)
    with pytest.raises(ValueError, match="draw_explorer: d_k=0 must be an integer >= 1"):
        draw_explorer(4, 0, hold_d_model=False)


def test_summary_line_names_heads_drawn_and_parameters_with_thousands_separators():
    _, summary = draw_explorer(4, 12)
    line = summary_line(summary)
    assert line.startswith("h=4  d_k=12  d_model=48 | ")
    assert "| heads drawn: 4 |" in line
    assert "| parameters: 9,216 |" in line
    assert f"| FLOPs total: {mha_course.attention_flops(T, 48, 4)['total']:,} |" in line
    assert line.endswith("weights (h, T, T) = (4, 11, 11) = 484 values")
    _, big = draw_explorer(16, 64, hold_d_model=False)
    assert re.search(r"parameters: 196,608 \|", summary_line(big))
    assert "= 1,936 values" in summary_line(big)


def test_redrawing_into_a_figure_reuses_its_axes_and_hides_the_spares():
    fig, _ = draw_explorer(16, 3)
    n_axes = len(fig.axes)
    again, summary = draw_explorer(2, 24, fig=fig)
    assert again is fig
    assert len(fig.axes) == n_axes  # nothing added
    assert summary["heads_drawn"] == 2
    visible = [ax for ax in fig.axes if ax.get_visible() and ax.get_label().startswith("head ")]
    np.testing.assert_array_equal(visible[1].images[0].get_array(), summary["weights"][1])


def test_plot_heads_rejects_labels_that_do_not_match_the_weights():
    with pytest.raises(ValueError, match=r"plot_heads: weights has shape \(2, 3, 3\)"):
        plot_heads(np.zeros((2, 3, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="titles has 1 entries; expected h=2"):
        plot_heads(np.zeros((2, 2, 2)), ["a", "b"], titles=["x"])


# ----------------------------------------------------------------------------- the widget
def _widgets(box):
    sliders, hold, out = box.children[0].children, box.children[1], box.children[2]
    return {s.description: s for s in sliders}, hold, out


def _text(out):
    return "".join(o.get("text", "") for o in out.outputs if o["output_type"] == "stream")


def _has_png(out):
    return any("image/png" in o.get("data", {}) for o in out.outputs)


def test_explorer_widgets_match_the_documented_interface():
    box = explorer()
    sliders, hold, out = _widgets(box)
    assert type(box).__name__ == "VBox"
    assert (sliders["h"].min, sliders["h"].max) == (1, 16)
    assert (sliders["d_k"].min, sliders["d_k"].max) == (1, 64)
    assert not sliders["h"].continuous_update and not sliders["d_k"].continuous_update
    assert hold.description == "hold d_model fixed (d_k = d_model / h)"
    assert hold.value and sliders["d_k"].disabled
    assert "heads drawn: 4" in _text(out) and _has_png(out)


def test_moving_the_h_slider_redraws_the_output():
    box = explorer()
    sliders, _, out = _widgets(box)
    sliders["h"].value = 8
    assert "heads drawn: 8" in _text(out)
    assert sliders["d_k"].value == 6  # follows d_model // h while held
    assert "parameters: 9,216" in _text(out)
    assert len(out.outputs) == 2 and _has_png(out)  # replaced, not appended


def test_unholding_d_model_lets_the_d_k_slider_change_the_parameter_count():
    box = explorer()
    sliders, hold, out = _widgets(box)
    hold.value = False
    assert not sliders["d_k"].disabled
    sliders["h"].value = 5
    sliders["d_k"].value = 7
    text = _text(out)
    assert "h=5  d_k=7" in text and "heads drawn: 5" in text
    assert f"parameters: {mha_course.param_count(48, 5, 7):,}" in text
    hold.value = True
    assert sliders["d_k"].disabled and sliders["d_k"].value == 48 // 5
    assert "heads drawn: 0" in _text(out)
    assert "not divisible by h=5" in _text(out)


def test_explorer_redraws_leave_no_pyplot_figures_open():
    before = plt.get_fignums()
    box = explorer()
    sliders, _, _ = _widgets(box)
    for h in (16, 2, 8):
        sliders["h"].value = h
    assert plt.get_fignums() == before
