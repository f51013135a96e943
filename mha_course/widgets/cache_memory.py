"""The KV-cache memory widget: how many bytes a decoder keeps, for a setting and for real models.

Taught in ``notebooks/06_decoding.ipynb``.

- :func:`draw_cache_memory` is a pure function (no widgets): it computes the cache of "your
  setting" (layers, K/V heads, head dim, or an MLA latent; an optional sliding window) and of
  every model in :data:`~mha_course.cost.MODELS`, at one sequence length, batch and
  dtype, with :func:`~mha_course.cost.cache_bytes`, and draws them as one bar chart;
  :func:`summary_line` says in one line what it drew.
- :func:`cache_memory_widget` wraps it in ipywidgets: sliders for layers, K/V heads, head dim,
  sequence length and batch, a dtype choice, and presets that load each model's configuration
  into the controls.

The figure has a fixed size, so the widget does not move while the controls change.
"""

from __future__ import annotations

import base64

import numpy as np
from matplotlib.figure import Figure

from .._validate import fail, validate_positive_int
from ..cost import MODELS, cache_bytes, head_dim, is_mla, values_per_layer_token
from .plotting import figure_png

#: Bytes per cached value for each dtype the widget offers.
DTYPES = {"fp32": 4, "bf16": 2, "fp8": 1}
#: Sequence lengths of the widget's slider, 1k to 128k tokens.
SEQ_LENS = tuple(2**k for k in range(10, 18))
#: Which layers a window applies to: every layer (Mistral 7B v0.1) or every other one (gpt-oss).
WINDOWED = {"all layers": ("sliding_attention",),
            "every other layer": ("sliding_attention", "full_attention")}
#: Size of the figure in inches (fixed: the widget keeps its size between control values).
FIGSIZE = (8.6, 4.0)
SETTING = "your setting"


def setting_config(n_layers, n_kv_heads, head_dim, *, mla=False, d_c=512, d_rope=64,
                   window=None, windowed="all layers") -> dict:
    """A config.json-style dict for the widget's own setting (see :data:`MODELS`).

    Examples
    --------
    >>> setting_config(32, 8, 128)["num_key_value_heads"]
    8
    >>> sorted(setting_config(60, 1, 128, mla=True))[:3]
    ['kv_lora_rank', 'num_hidden_layers', 'qk_rope_head_dim']
    """
    func = "setting_config"
    config = {"num_hidden_layers": validate_positive_int(func, "n_layers", n_layers)}
    if mla:
        config["kv_lora_rank"] = validate_positive_int(func, "d_c", d_c)
        config["qk_rope_head_dim"] = validate_positive_int(func, "d_rope", d_rope)
    else:
        config["num_key_value_heads"] = validate_positive_int(func, "n_kv_heads", n_kv_heads)
        config["head_dim"] = validate_positive_int(func, "head_dim", head_dim)
    if window is not None:
        if windowed not in WINDOWED:
            raise fail(func, f"windowed={windowed!r} is not one of {list(WINDOWED)}")
        config["sliding_window"] = validate_positive_int(func, "window", window)
        config["layer_types"] = WINDOWED[windowed]
    return config


def preset(name: str) -> dict:
    """The widget's control values for a model of :data:`MODELS` (its layers, heads, window).

    Examples
    --------
    >>> values = preset("gpt-oss-120b")
    >>> values["n_layers"], values["n_kv_heads"], values["head_dim"], values["window"]
    (36, 8, 64, 128)
    """
    if name not in MODELS:
        raise fail("preset", f"{name!r} is not one of {list(MODELS)}")
    config = MODELS[name]
    mla = is_mla(config)
    pattern = tuple(config.get("layer_types", ("sliding_attention",)))
    return {
        "n_layers": config["num_hidden_layers"],
        "n_kv_heads": 1 if mla else config["num_key_value_heads"],
        "head_dim": config["qk_nope_head_dim"] if mla else head_dim(config),
        "mla": mla,
        "d_c": config.get("kv_lora_rank", 512),
        "d_rope": config.get("qk_rope_head_dim", 64),
        "window": config.get("sliding_window"),
        "windowed": next((k for k, v in WINDOWED.items() if v == pattern), "all layers"),
    }


def describe(config: dict) -> str:
    """A setting in words, e.g. ``'32 layers × 8 K/V heads × head dim 128'``.

    Examples
    --------
    >>> describe(setting_config(60, 1, 128, mla=True))
    '60 layers × MLA latent (d_c 512 + d_rope 64)'
    """
    text = f"{config['num_hidden_layers']} layers × "
    if is_mla(config):
        text += f"MLA latent (d_c {config['kv_lora_rank']} + d_rope {config['qk_rope_head_dim']})"
    else:
        text += f"{config['num_key_value_heads']} K/V heads × head dim {head_dim(config)}"
    if config.get("sliding_window"):
        which = next(k for k, v in WINDOWED.items() if v == tuple(config["layer_types"]))
        text += f", window {config['sliding_window']} on {which}"
    return text


def fmt_bytes(n: float) -> str:
    """Bytes in binary units: ``'512.0 MiB'``, ``'2.50 GiB'``.

    Examples
    --------
    >>> fmt_bytes(131072), fmt_bytes(2.5 * 2**30)
    ('128.0 KiB', '2.50 GiB')
    """
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def draw_cache_memory(n_layers=32, n_kv_heads=8, head_dim=128, seq_len=8192, batch=1,
                      dtype="bf16", *, mla=False, d_c=512, d_rope=64, window=None,
                      windowed="all layers"):
    """Draw the KV cache of a setting beside the real models', as one bar chart.

    Parameters
    ----------
    n_layers, n_kv_heads, head_dim : int
        The setting: each layer caches ``2·n_kv_heads·head_dim`` values a token.
    seq_len, batch : int
        Tokens per sequence and sequences; the same for every bar.
    dtype : {"fp32", "bf16", "fp8"}
    mla : bool, default False
        The setting is MLA: each layer caches ``d_c + d_rope`` values a token instead
        (``n_kv_heads`` and ``head_dim`` are then not used).
    d_c, d_rope : int
    window : int, optional
        A sliding window: a windowed layer caches at most ``window`` tokens.
    windowed : {"all layers", "every other layer"}

    Returns
    -------
    fig : matplotlib.figure.Figure
        Not registered with pyplot (nothing to close); fixed size :data:`FIGSIZE`.
    summary : dict
        ``"bytes"``: {bar name: bytes}, ``"your setting"`` first, then the models;
        ``"bytes_per_token"``: {name: bytes a token adds at the start, before any window
        fills}; ``"seq_len"``, ``"batch"``, ``"dtype"``, ``"config"`` (the setting's),
        ``"bars"`` (counted from the figure) and ``"unit"`` of the axis.

    Raises
    ------
    ValueError
        If a size is not a positive integer or ``dtype`` / ``windowed`` is unknown.

    Examples
    --------
    >>> fig, summary = draw_cache_memory(32, 8, 128, seq_len=8192)
    >>> summary["bars"], summary["bytes"]["your setting"] == summary["bytes"]["Llama 3 8B"]
    (7, True)
    """
    func = "draw_cache_memory"
    if dtype not in DTYPES:
        raise fail(func, f"dtype={dtype!r} is not one of {list(DTYPES)}")
    seq_len = validate_positive_int(func, "seq_len", seq_len)
    batch = validate_positive_int(func, "batch", batch)
    config = setting_config(n_layers, n_kv_heads, head_dim, mla=mla, d_c=d_c, d_rope=d_rope,
                            window=window, windowed=windowed)
    configs = {SETTING: config, **MODELS}
    width = DTYPES[dtype]
    sizes = {name: cache_bytes(c, seq_len, batch, width) for name, c in configs.items()}
    per_token = {name: c["num_hidden_layers"] * values_per_layer_token(c) * width
                 for name, c in configs.items()}

    top = max(sizes.values())
    unit, scale = ("GiB", 2**30) if top >= 2**30 else ("MiB", 2**20)
    names = list(sizes)[::-1]  # barh draws bottom-up: "your setting" on top
    values = np.array([sizes[n] for n in names]) / scale
    fig = Figure(figsize=FIGSIZE)
    ax = fig.add_axes([0.2, 0.14, 0.56, 0.72])
    colors = ["tab:orange" if n == SETTING else "tab:blue" for n in names]
    bars = ax.barh(names, values, color=colors, label="cache")
    ax.set_xlim(0, values.max() * 1.02)
    for bar, name in zip(bars, names, strict=True):
        ax.text(1.02, bar.get_y() + bar.get_height() / 2,
                f"{fmt_bytes(sizes[name])}  ({fmt_bytes(per_token[name])}/token)",
                transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    ax.set_xlabel(f"KV cache ({unit}), {dtype}")
    ax.set_title(f"KV cache at {seq_len:,} tokens × batch {batch}, {dtype}\n"
                 f"your setting: {describe(config)}", fontsize=10)
    fig.text(0.99, 0.02, "(per token: one sequence, before any window fills)", ha="right",
             fontsize=7, color="0.35")
    ax.tick_params(axis="y", labelsize=9)
    summary = {
        "config": config, "seq_len": seq_len, "batch": batch, "dtype": dtype, "unit": unit,
        "bytes": sizes, "bytes_per_token": per_token,
        "bars": len(ax.patches),  # counted from the figure
    }
    return fig, summary


def summary_line(summary) -> str:
    """One line that says what :func:`draw_cache_memory` drew.

    Examples
    --------
    >>> summary_line(draw_cache_memory(32, 8, 128, seq_len=8192)[1]).split(" | ")[:2]
    ['your setting: 1.00 GiB (128.0 KiB/token) at 8,192 tokens × batch 1, bf16', 'bars drawn: 7']
    """
    sizes = summary["bytes"]
    mine = sizes[SETTING]
    largest = max((n for n in sizes if n != SETTING), key=sizes.get)
    smallest = min((n for n in sizes if n != SETTING), key=sizes.get)
    return (f"{SETTING}: {fmt_bytes(mine)} ({fmt_bytes(summary['bytes_per_token'][SETTING])}"
            f"/token) at {summary['seq_len']:,} tokens × batch {summary['batch']}, "
            f"{summary['dtype']} | bars drawn: {summary['bars']} | largest model: {largest} "
            f"{fmt_bytes(sizes[largest])} | smallest: {smallest} {fmt_bytes(sizes[smallest])}")


def _outputs(summary, png: bytes) -> tuple[dict, ...]:
    return (
        {"output_type": "stream", "name": "stdout", "text": summary_line(summary) + "\n"},
        {"output_type": "display_data", "metadata": {},
         "data": {"image/png": base64.b64encode(png).decode("ascii"),
                  "text/plain": "<cache memory figure>"}},
    )


def cache_memory_widget(preset_name="Llama 3 8B"):
    """Controls for a KV-cache configuration, redrawing :func:`draw_cache_memory` on change.

    Sliders: layers, K/V heads, head dim (or, for MLA, the latent ``d_c`` and RoPE key
    ``d_rope``), sequence length (1k to 128k) and batch; a dtype choice; a sliding window and
    which layers have it; and presets that load each real model's configuration. Every slider
    uses ``continuous_update=False`` (one redraw on release).

    Returns
    -------
    ipywidgets.VBox
        Children: three rows of controls (``HBox``) and an ``Output`` with the summary line and
        the figure.

    Examples
    --------
    >>> box = cache_memory_widget()
    >>> [type(w).__name__ for w in box.children]
    ['HBox', 'HBox', 'HBox', 'Output']
    """
    import ipywidgets as widgets

    start = preset(preset_name)
    style = {"description_width": "72px"}
    layout = widgets.Layout(width="300px")

    def slider(description, value, lo, hi, step=1):
        return widgets.IntSlider(value=value, min=lo, max=hi, step=step, description=description,
                                 continuous_update=False, style=style, layout=layout)

    c = {
        "preset": widgets.Dropdown(options=["custom", *MODELS], value=preset_name,
                                   description="preset", style=style, layout=layout),
        "n_layers": slider("layers", start["n_layers"], 1, 128),
        "n_kv_heads": slider("K/V heads", start["n_kv_heads"], 1, 128),
        "head_dim": slider("head dim", start["head_dim"], 16, 256, 16),
        "mla": widgets.ToggleButtons(options=[("K, V per head", False), ("MLA latent", True)],
                                     value=start["mla"], style={"button_width": "120px"}),
        "d_c": slider("d_c (MLA)", start["d_c"], 64, 1024, 64),
        "d_rope": slider("d_rope", start["d_rope"], 16, 128, 16),
        "seq_len": widgets.SelectionSlider(
            options=[(f"{n // 1024}k", n) for n in SEQ_LENS], value=8192, description="tokens",
            continuous_update=False, style=style, layout=layout),
        "batch": slider("batch", 1, 1, 64),
        "dtype": widgets.ToggleButtons(options=list(DTYPES), value="bf16",
                                       style={"button_width": "60px"}),
        # 0 stands for "no window" (a Dropdown shows None as an empty box)
        "window": widgets.Dropdown(options=[("none", 0), ("128", 128), ("1024", 1024),
                                            ("4096", 4096)], value=start["window"] or 0,
                                   description="window", style=style, layout=layout),
        "windowed": widgets.Dropdown(options=list(WINDOWED), value=start["windowed"],
                                     description="windowed", style=style, layout=layout),
    }
    out = widgets.Output(layout=widgets.Layout(min_height="430px"))
    state = {"loading": False}
    keys = ("n_layers", "n_kv_heads", "head_dim", "mla", "d_c", "d_rope", "window", "windowed")

    def sync_enabled():
        mla = c["mla"].value
        c["n_kv_heads"].disabled = c["head_dim"].disabled = mla
        c["d_c"].disabled = c["d_rope"].disabled = not mla
        c["windowed"].disabled = not c["window"].value

    def redraw(change=None):
        sync_enabled()
        values = {k: c[k].value for k in (*keys, "seq_len", "batch", "dtype")}
        values["window"] = values["window"] or None
        fig, summary = draw_cache_memory(**values)
        out.outputs = _outputs(summary, figure_png(fig))  # one update: no flicker

    def on_control(change):
        if state["loading"]:
            return
        if change["owner"] in [c[k] for k in keys] and c["preset"].value != "custom":
            state["loading"] = True  # the setting no longer is the preset's
            c["preset"].value = "custom"
            state["loading"] = False
        redraw()

    def on_preset(change):
        if state["loading"] or change["new"] == "custom":
            return
        state["loading"] = True  # set every control, then draw once
        for key, value in preset(change["new"]).items():
            c[key].value = (value or 0) if key == "window" else value
        state["loading"] = False
        redraw()

    for key, control in c.items():
        control.observe(on_preset if key == "preset" else on_control, names="value")
    redraw()
    return widgets.VBox([  # rows at most 1200 px wide: a 1366-px screen shows them whole
        widgets.HBox([c["preset"], c["n_layers"], c["seq_len"], c["batch"]]),
        widgets.HBox([c["mla"], c["n_kv_heads"], c["head_dim"], c["dtype"]]),
        widgets.HBox([c["d_c"], c["d_rope"], c["window"], c["windowed"]]),
        out,
    ])
