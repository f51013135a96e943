"""Small tests of the figures the lessons draw: right number of images, labels match tokens."""

import matplotlib.pyplot as plt
import numpy as np
import pytest

from mha_course.widgets.plotting import (
    HEADS_FIGSIZE,
    TOKENS,
    grid_shape,
    plot_heads,
    plot_weights,
    plot_weights_panels,
)

plt.switch_backend("Agg")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _ticklabels(axis):
    return [t.get_text() for t in axis.get_ticklabels()]


def test_example_sentence_has_eleven_tokens():
    assert len(TOKENS) == 11
    assert TOKENS[7] == "it" and TOKENS[1] == "animal"


def test_plot_weights_labels_rows_with_queries_and_columns_with_keys():
    q, k = ["a", "b", "c"], ["v", "w", "x", "y", "z"]
    img = plot_weights(np.full((3, 5), 0.2), q, k, title="t")
    ax = img.axes
    assert _ticklabels(ax.yaxis) == q
    assert _ticklabels(ax.xaxis) == k
    assert ax.get_title() == "t"
    assert len(ax.figure.axes) == 2  # the heatmap and its colorbar


def test_plot_weights_without_colorbar_draws_one_axes():
    img = plot_weights(np.eye(3), ["a", "b", "c"], colorbar=False)
    assert len(img.axes.figure.axes) == 1


def test_plot_weights_refuses_labels_that_do_not_match_the_shape():
    with pytest.raises(ValueError, match=r"plot_weights: weights has shape \(3, 5\)"):
        plot_weights(np.zeros((3, 5)), ["a", "b", "c"], ["x", "y"])


def test_panels_draw_one_image_per_matrix_and_one_shared_colorbar():
    weights = np.full((3, 2, 5), 0.2)
    fig, axes = plot_weights_panels(weights, ["a", "b"], list("vwxyz"), titles=["1", "2", "3"])
    assert len(axes) == 3
    assert [len(ax.get_images()) for ax in axes] == [1, 1, 1]
    assert len(fig.axes) == 4  # three heatmaps + one colorbar
    assert [ax.get_title() for ax in axes] == ["1", "2", "3"]
    for ax, w in zip(axes, weights, strict=True):
        np.testing.assert_array_equal(ax.get_images()[0].get_array(), w)


def test_panels_accept_one_label_list_per_panel():
    long, short = ["the", "animal", "was"], ["it", "was", "<pad>"]
    fig, axes = plot_weights_panels([np.eye(3), np.eye(3)], [long, short])
    assert _ticklabels(axes[0].yaxis) == long and _ticklabels(axes[0].xaxis) == long
    assert _ticklabels(axes[1].yaxis) == short and _ticklabels(axes[1].xaxis) == short


def test_panels_share_one_colour_scale():
    _, axes = plot_weights_panels([np.eye(2) * 0.5, np.eye(2)], ["a", "b"], vmax=0.5)
    assert {ax.get_images()[0].get_clim() for ax in axes} == {(0.0, 0.5)}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"panels": []}, "panels is empty"),
        ({"panels": [np.eye(2)] * 2, "titles": ["only one"]}, "titles has 1 entries; expected P=2"),
        ({"panels": [np.eye(2)] * 2, "tokens_q": [["a", "b"]] * 3},
         "tokens_q has 3 label lists; expected P=2"),
        ({"panels": [np.eye(2), np.eye(3)], "tokens_q": ["a", "b"]},
         r"weights has shape \(3, 3\)"),
    ],
)
def test_panels_refuse_inconsistent_arguments(kwargs, message):
    kwargs.setdefault("tokens_q", ["a", "b"])
    with pytest.raises(ValueError, match=message):
        plot_weights_panels(**kwargs)


def test_panels_take_a_size_and_spacing():
    fig, _ = plot_weights_panels(np.full((2, 3, 3), 1 / 3), ["a", "b", "c"], figsize=(7, 3),
                                 spacing={"w_pad": 0.2, "wspace": 0.1})
    assert tuple(fig.get_size_inches()) == (7, 3)
    assert fig.get_layout_engine().get()["wspace"] == 0.1


# ------------------------------------------------------------------ a grid of heads
@pytest.mark.parametrize(("h", "rows_cols"), [(1, (1, 1)), (2, (1, 2)), (3, (1, 3)),
                                              (4, (2, 2)), (6, (2, 3)), (8, (2, 4))])
def test_small_head_counts_fill_their_grid(h, rows_cols):
    assert grid_shape(h, 5.3, 3.6) == rows_cols


@pytest.mark.parametrize("h", range(1, 17))
def test_grid_holds_every_head_with_less_than_a_row_spare(h):
    nrows, ncols = grid_shape(h, 5.3, 3.6)
    assert nrows * ncols >= h > (nrows - 1) * ncols


def test_plot_heads_rejects_labels_that_do_not_match_the_weights():
    with pytest.raises(ValueError, match=r"plot_heads: weights has shape \(2, 3, 3\)"):
        plot_heads(np.zeros((2, 3, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="titles has 1 entries; expected h=2"):
        plot_heads(np.zeros((2, 2, 2)), ["a", "b"], titles=["x"])


def test_plot_heads_takes_a_figure_size():
    fig, _ = plot_heads(np.full((3, 2, 2), 0.5), ["a", "b"], figsize=(9, 3))
    assert tuple(fig.get_size_inches()) == (9, 3)


def test_plot_heads_defaults_to_its_figure_size_and_one_colorbar():
    fig, axes = plot_heads(np.full((3, 11, 11), 1 / 11))
    assert tuple(fig.get_size_inches()) == HEADS_FIGSIZE
    assert len(axes) == 3 and len(fig.axes) == 4
