"""Lesson 08's head viewer: the pure drawing function, its summary line, and the widget."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import causal_mask, softmax
from mha_course.models.tasks import make_batch
from mha_course.models.tiny_model import TinyTransformer
from mha_course.widgets.head_viewer import (
    FIGSIZE,
    MIN_WEIGHT,
    WIDGET_DPI,
    HeadViewPainter,
    draw_head_view,
    head_color,
    head_viewer,
    summary_line,
)
from mha_course.widgets.plotting import figure_png

T = 7
LABELS = list("abc>abc")


def random_weights(seed=0, n_layers=2, h=3):
    rng = np.random.default_rng(seed)
    return [softmax(rng.normal(size=(h, T, T)) * 2, mask=np.broadcast_to(causal_mask(T), (h, T, T)))
            for _ in range(n_layers)]


def expected_lines(weights, heads, token=None):
    rows = slice(None) if token is None else slice(token, token + 1)
    return sum(int((weights[i][j][rows] >= MIN_WEIGHT).sum()) for i, j in heads)


def test_every_weight_above_the_threshold_is_one_line():
    weights = random_weights()
    every = [(i, j) for i in range(2) for j in range(3)]
    _, summary = draw_head_view(weights, LABELS)
    assert summary["lines"] == expected_lines(weights, every)
    assert summary["heads"] == ["L0H0", "L0H1", "L0H2", "L1H0", "L1H1", "L1H2"]
    assert summary["layers"] == [0, 1] and summary["token"] is None


@pytest.mark.parametrize("token", [0, 3, 6])
def test_a_selected_token_keeps_only_its_lines_and_names_each_heads_strongest_key(token):
    weights = random_weights(seed=1)
    _, summary = draw_head_view(weights, LABELS, token=token)
    every = [(i, j) for i in range(2) for j in range(3)]
    assert summary["lines"] == expected_lines(weights, every, token)
    for (i, j), (label, (key, weight)) in zip(every, summary["top"].items(), strict=True):
        assert label == f"L{i}H{j}"
        assert key == int(np.argmax(weights[i][j][token]))
        assert weight == pytest.approx(weights[i][j][token].max(), abs=1e-4)
        assert key <= token  # causal: never a future key


def test_hidden_layers_and_heads_draw_nothing_but_keep_their_place():
    weights = random_weights(seed=2)
    fig_all, _ = draw_head_view(weights, LABELS)
    fig, summary = draw_head_view(weights, LABELS, layers=[1], heads=[(0, 0), (1, 2)])
    assert summary["lines"] == expected_lines(weights, [(1, 2)])
    assert summary["heads"] == ["L1H2"]
    assert [ax.get_title() for ax in fig.axes] == ["layer 0 (hidden)", "layer 1"]
    assert fig.get_size_inches().tolist() == list(FIGSIZE) == fig_all.get_size_inches().tolist()
    _, none = draw_head_view(weights, LABELS, heads=[])
    assert none["lines"] == 0 and none["heads"] == []


def test_summary_line_says_what_was_drawn():
    weights = random_weights(seed=3, n_layers=1, h=1)
    _, summary = draw_head_view(weights, LABELS, token=4)
    key = int(np.argmax(weights[0][0][4]))
    assert summary_line(summary) == (
        f"layers [0] | heads L0H0 | token 4 'a' | {summary['lines']} lines | "
        f"L0H0 -> {key} {LABELS[key]!r} ({weights[0][0][4, key]:.2f})")


def test_each_head_has_its_own_colour():
    colours = {head_color(i, j, h=4) for i in range(3) for j in range(4)}
    assert len(colours) == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"token": 7}, r"draw_head_view: token=7: the example has positions 0..6"),
     ({"layers": [2]}, r"draw_head_view: layers=\[2\]: the model has layers 0..1"),
     ({"heads": [(0, 3)]}, r"draw_head_view: heads=\[\(0, 3\)\]: the model has layers 0..1 and "
                           r"heads 0..2")],
)
def test_bad_choices_raise_named_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw_head_view(random_weights(), LABELS, **kwargs)


def test_weights_that_do_not_match_the_tokens_raise():
    with pytest.raises(ValueError, match=r"draw_head_view: weights\[0\] has shape \(3, 7, 7\); "
                                         r"expected \(h, T, T\) = \(3, 6, 6\)"):
        draw_head_view(random_weights(), LABELS[:-1])


def test_widget_toggles_and_menus_redraw_the_summary_and_the_picture():
    model = TinyTransformer(19, 9, d_model=8, h=2, n_layers=2, rng=0)
    batch = make_batch("copy", 3, rng=0, n_max=4)
    box = head_viewer(model, batch)
    menus, toggles, summary, image = box.children
    example, token = menus.children
    layer_buttons = [c for c in toggles.children if "layer" in getattr(c, "description", "")]
    head_buttons = {c.description.removeprefix("■ "): c for c in toggles.children
                    if getattr(c, "description", "").startswith("■")}
    assert list(head_buttons) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert [b.style.text_color for b in head_buttons.values()] == [
        head_color(i, j, h=2) for i in range(2) for j in range(2)]
    assert image.layout.width == f"{int(FIGSIZE[0] * WIDGET_DPI)}px"
    assert summary.layout.width == image.layout.width
    assert summary.layout.overflow is None and summary.layout.height is None  # never cut off
    assert "heads L0H0 L0H1 L1H0 L1H1 | every token" in summary.value
    first = image.value

    head_buttons["L1H0"].value = False
    assert "heads L0H0 L0H1 L1H1 |" in summary.value and image.value != first
    layer_buttons[0].value = False
    assert "layers [1] | heads L1H1 |" in summary.value
    token.value = 5
    assert "| token 5 " in summary.value
    example.value = 2
    assert token.value == -1 and "every token" in summary.value  # a new example: all tokens
    n = 2 * batch.lengths[2] + 1
    assert [label for label, _ in token.options][1:] == [
        f"{t}: {c}" for t, c in enumerate("".join(np.array(list("abcdefghijklmnop><."))[
            batch.tokens[2, :n]]))]


def test_widget_reads_a_gpt_on_windows_of_text():
    from mha_course.models.gpt import GPT, GPTConfig
    from mha_course.models.tokenizer import CharTokenizer

    tok = CharTokenizer.from_text("KING:\nWhat news?\n")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=8, n_layers=2, h=2,
                          context_length=32), rng=0)
    windows = np.stack([tok.encode("KING:\nWhat news?"), tok.encode("What news?\nKING:")])
    box = head_viewer(model, windows, tok)
    menus, toggles, summary, image = box.children
    example, token = menus.children
    assert [label for label, _ in example.options] == ["0: KING:↵What␣news?",
                                                       "1: What␣news?↵KING:"]
    assert [label for label, _ in token.options][1:6] == ["0: K", "1: I", "2: N", "3: G", "4: :"]
    assert "heads L0H0 L0H1 L1H0 L1H1 | every token | " in summary.value
    token.value = 5
    assert "| token 5 &#x27;↵&#x27; |" in summary.value and image.value  # html-escaped
    with pytest.raises(ValueError, match=r"head_viewer: batch has shape \(16,\)"):
        head_viewer(model, windows[0], tok)


def test_the_widget_can_open_on_each_examples_last_token():
    from mha_course.models.gpt import GPT, GPTConfig
    from mha_course.models.tokenizer import CharTokenizer

    tok = CharTokenizer.from_text("KING:\nWhat news?\n")
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=8, n_layers=2, h=2,
                          context_length=32), rng=0)
    windows = np.stack([tok.encode("KING:\nWhat news?"), tok.encode("What news?\nKING:")])
    menus, _, summary, image = head_viewer(model, windows, tok, token="last").children
    example, token = menus.children
    assert token.value == 15 and "| token 15 &#x27;?&#x27; |" in summary.value and image.value
    token.value = -1
    assert "| every token |" in summary.value
    example.value = 1  # another example opens on its last token again
    assert token.value == 15 and "| token 15 &#x27;:&#x27; |" in summary.value
    menus, _, summary, _ = head_viewer(model, windows, tok, token=4).children
    assert menus.children[1].value == 4 and "| token 4 &#x27;:&#x27; |" in summary.value
    for bad in (16, -1, "first"):
        with pytest.raises(ValueError, match=r"head_viewer: token=.*expected None \(every "
                                             r"token\), 'last' or a position 0\.\.15"):
            head_viewer(model, windows, tok, token=bad)


def pixels(png: bytes) -> np.ndarray:
    import io

    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"))


def test_the_painter_draws_exactly_what_draw_head_view_draws():
    weights = random_weights(seed=4)
    painter = HeadViewPainter()
    states = [{}, {"token": 3}, {"token": 5, "heads": [(0, 1), (1, 0), (1, 2)]},
              {"layers": [0]}, {"token": 0}, {}]  # the frame is reused and rebuilt
    for kwargs in states:
        png, summary = painter.png(weights, LABELS, **kwargs)
        fig, want = draw_head_view(weights, LABELS, **kwargs)
        assert summary == want, kwargs
        np.testing.assert_array_equal(pixels(png), pixels(figure_png(fig, dpi=WIDGET_DPI)),
                                      err_msg=str(kwargs))
