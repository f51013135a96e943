"""The KV-cache memory widget of lesson 06: the pure drawing function, its summary line, the
presets, and the ipywidgets controls."""

from __future__ import annotations

import numpy as np
import pytest

from mha_course import kv_cache_bytes, mla_cache_bytes
from mha_course.cost import MODELS, cache_bytes
from mha_course.widgets.cache_memory import (
    DTYPES,
    FIGSIZE,
    SEQ_LENS,
    cache_memory_widget,
    draw_cache_memory,
    fmt_bytes,
    preset,
    summary_line,
)


def bar_widths(fig):
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    return dict(zip(labels, (p.get_width() for p in ax.patches), strict=True))


@pytest.mark.parametrize("seq_len", [1024, 8192, 131072])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_bars_are_the_cache_bytes_of_the_setting_and_of_every_model(seq_len, dtype):
    fig, summary = draw_cache_memory(40, 4, 96, seq_len=seq_len, batch=3, dtype=dtype)
    width = DTYPES[dtype]
    assert summary["bytes"]["your setting"] == kv_cache_bytes(40, 4, 96, seq_len, 3, width)
    for name, config in MODELS.items():
        assert summary["bytes"][name] == cache_bytes(config, seq_len, 3, width)
    scale = 2**30 if summary["unit"] == "GiB" else 2**20
    drawn = bar_widths(fig)
    assert summary["bars"] == len(drawn) == 1 + len(MODELS)
    for name, n_bytes in summary["bytes"].items():
        assert drawn[name] == pytest.approx(n_bytes / scale)
    assert tuple(fig.get_size_inches()) == FIGSIZE


def test_mla_setting_counts_the_latent_and_the_rope_key():
    _, summary = draw_cache_memory(60, 99, 99, seq_len=4096, mla=True, d_c=512, d_rope=64)
    assert summary["bytes"]["your setting"] == mla_cache_bytes(60, 512, 64, 4096)
    assert summary["bytes"]["your setting"] == summary["bytes"]["DeepSeek-V2"]
    assert summary["bytes_per_token"]["your setting"] == 60 * 576 * 2


def test_a_window_caps_the_setting_on_the_layers_it_applies_to():
    _, every = draw_cache_memory(32, 8, 128, seq_len=131072, window=4096)
    _, half = draw_cache_memory(32, 8, 128, seq_len=131072, window=4096,
                                windowed="every other layer")
    assert every["bytes"]["your setting"] == kv_cache_bytes(32, 8, 128, 4096)
    assert half["bytes"]["your setting"] == (kv_cache_bytes(16, 8, 128, 4096)
                                             + kv_cache_bytes(16, 8, 128, 131072))


@pytest.mark.parametrize("name", list(MODELS))
def test_each_preset_reproduces_its_models_bar(name):
    _, summary = draw_cache_memory(**preset(name), seq_len=131072, batch=2)
    assert summary["bytes"]["your setting"] == summary["bytes"][name]


def test_summary_line_says_what_was_drawn():
    _, summary = draw_cache_memory(32, 8, 128, seq_len=8192)
    line = summary_line(summary)
    assert line.startswith("your setting: 1.00 GiB (128.0 KiB/token) at 8,192 tokens × batch 1, "
                           "bf16 | bars drawn: 7 | ")
    assert "largest model: Llama 3 70B 2.50 GiB" in line
    assert "smallest: gpt-oss-120b 292.5 MiB" in line


def test_fmt_bytes_uses_binary_units():
    assert [fmt_bytes(n) for n in (512, 2048, 3 * 2**20, 2**30)] == [
        "512 B", "2.0 KiB", "3.0 MiB", "1.00 GiB"]


@pytest.mark.parametrize("kwargs, message", [
    ({"dtype": "fp16"}, "draw_cache_memory: dtype='fp16' is not one of ['fp32', 'bf16', 'fp8']"),
    ({"seq_len": 0}, "draw_cache_memory: seq_len=0 must be an integer >= 1"),
    ({"n_layers": 0}, "setting_config: n_layers=0 must be an integer >= 1"),
    ({"window": 0}, "setting_config: window=0 must be an integer >= 1"),
])
def test_bad_settings_are_named_errors(kwargs, message):
    args = {"n_layers": 2, "n_kv_heads": 2, "head_dim": 8, **kwargs}
    with pytest.raises(ValueError) as info:
        draw_cache_memory(**args)
    assert str(info.value) == message


# ----------------------------------------------------------------------------- the widget
def controls(box):
    found = {}
    for row in box.children[:3]:
        for w in row.children:
            found[w.description or type(w).__name__ + str(len(found))] = w
    return found, box.children[3]


def text(out):
    return "".join(o.get("text", "") for o in out.outputs if o["output_type"] == "stream")


def has_png(out):
    return any("image/png" in o.get("data", {}) for o in out.outputs)


def test_widget_controls_match_the_documented_interface():
    box = cache_memory_widget()
    c, out = controls(box)
    for name in ("preset", "layers", "tokens", "batch", "K/V heads", "head dim", "d_c (MLA)",
                 "d_rope", "window", "windowed"):
        assert name in c, name
    for name in ("layers", "tokens", "batch", "K/V heads", "head dim", "d_c (MLA)", "d_rope"):
        assert c[name].continuous_update is False, name
    assert [v for _, v in c["tokens"].options] == list(SEQ_LENS)
    assert c["preset"].value == "Llama 3 8B"
    assert "your setting: 1.00 GiB (128.0 KiB/token) at 8,192 tokens" in text(out)
    assert has_png(out) and len(out.outputs) == 2
    assert c["d_c (MLA)"].disabled and not c["K/V heads"].disabled


def test_moving_a_slider_redraws_and_leaves_the_preset():
    box = cache_memory_widget()
    c, out = controls(box)
    c["tokens"].value = 131072
    assert "at 131,072 tokens" in text(out) and "16.00 GiB" in text(out)
    assert c["preset"].value == "Llama 3 8B"  # the sequence length is not part of a preset
    c["layers"].value = 80
    assert c["preset"].value == "custom"
    assert text(out).startswith("your setting: 40.00 GiB (320.0 KiB/token)")
    assert len(out.outputs) == 2  # replaced, not appended


def test_choosing_a_preset_loads_its_configuration():
    box = cache_memory_widget()
    c, out = controls(box)
    c["preset"].value = "DeepSeek-V2"
    toggles = [w for w in box.children[1].children if type(w).__name__ == "ToggleButtons"]
    assert toggles[0].value is True  # MLA
    assert c["layers"].value == 60 and c["d_c (MLA)"].value == 512 and c["d_rope"].value == 64
    assert c["K/V heads"].disabled and not c["d_c (MLA)"].disabled
    assert "(67.5 KiB/token)" in text(out)
    c["preset"].value = "gpt-oss-120b"
    assert (c["window"].value, c["windowed"].value) == (128, "every other layer")
    assert not c["windowed"].disabled
    assert c["preset"].value == "gpt-oss-120b"
    summary = draw_cache_memory(**preset("gpt-oss-120b"), seq_len=8192)[1]
    assert text(out).startswith(summary_line(summary).split(" | ")[0])
    c["preset"].value = "Llama 3 8B"  # no window: the dropdown says so, "windowed" is off
    assert c["window"].value == 0 and c["window"].label == "none" and c["windowed"].disabled


def test_dtype_and_batch_scale_the_setting():
    box = cache_memory_widget()
    c, out = controls(box)
    c["batch"].value = 4
    dtype = [w for w in box.children[1].children if type(w).__name__ == "ToggleButtons"][1]
    dtype.value = "fp32"
    assert text(out).startswith("your setting: 8.00 GiB")


def test_widget_rows_fit_a_1366_pixel_screen():
    box = cache_memory_widget()
    for row in box.children[:3]:
        widths = []
        for w in row.children:
            if w.layout.width:
                widths.append(int(w.layout.width.rstrip("px")))
            else:  # toggle buttons: their buttons' widths, plus a margin
                widths.append(len(w.options) * int(w.style.button_width.rstrip("px")) + 20)
        assert sum(widths) <= 1300, widths
    assert np.prod(FIGSIZE) * 100**2 < 1366 * 768  # the picture at 100 dpi
