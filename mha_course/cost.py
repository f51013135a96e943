"""What attention costs: parameters, floating-point operations and KV-cache memory.

Taught in ``notebooks/04_multi_head_attention.ipynb`` (parameters and FLOPs); the ``n_kv_heads``
options, :func:`kv_cache_bytes` and :func:`mla_cache_bytes` in ``notebooks/06_decoding.ipynb``
(the KV cache, MQA and GQA, MLA).

FLOPs count a multiply-add as 2 operations, so an (m, n) @ (n, p) matmul costs ``2·m·n·p``.
The softmax (about 5 operations per weight: max, subtract, exp, sum, divide) is not in the
total: it is not a matmul, and it is the part that *does* grow with ``h`` (``h·T·S`` weights).

Real models' configurations (:data:`MODELS`) and the size of their KV caches, taught in
``notebooks/06_decoding.ipynb``, are the second half of this module.

:data:`MODELS` holds, for each model, the fields of its published ``config.json`` (Hugging Face
names) that decide the cache; :func:`cache_bytes` turns a configuration into bytes with
:func:`~mha_course.cost.kv_cache_bytes` and :func:`~mha_course.cost.mla_cache_bytes`, so every
number the lesson prints is computed from these fields, not typed in. The rules:

- standard or grouped-query attention caches a key and a value of ``head_dim`` per K/V head and
  layer: ``2·num_key_value_heads·head_dim`` values a token (``head_dim`` defaults to
  ``hidden_size / num_attention_heads``, as in Llama's and Mistral's configs, which omit it);
- MLA (DeepSeek-V2/V3; the config has ``kv_lora_rank``) caches ``kv_lora_rank +
  qk_rope_head_dim`` values per layer and token, whatever the number of heads;
- a layer with a sliding window (``sliding_window``; ``layer_types`` says which layers have one,
  otherwise all do) holds at most ``sliding_window`` tokens, in a rolling buffer.

Where the values come from, and which are less certain, is in each entry's ``"source"``. The
DeepSeek entries also carry what their attention layer needs beyond the cache: ``rms_norm_eps``
(the latent RMSNorms') and ``rope_scaling`` (YaRN, whose ``mscale_all_dim`` sharpens the softmax:
:func:`~mha_course.variants.rope_scaling.mla_softmax_scale`); :func:`mla_layer_options` turns
them into :class:`~mha_course.variants.mla.MultiHeadLatentAttention` arguments.
"""

from __future__ import annotations

from ._validate import fail, validate_positive_int
from .heads import head_dims, kv_head_count


def param_count(d_model, h, d_k=None, d_v=None, bias=False, n_kv_heads=None) -> int:
    """Number of parameters of :class:`~mha_course.MultiHeadAttention`.

    ``W_q``, ``W_k``: d_model·h·d_k each; ``W_v``: d_model·h·d_v; ``W_o``: h·d_v·d_model; with
    biases, h·d_k + h·d_k + h·d_v + d_model more. With d_k = d_v = d_model / h this is
    ``4·d_model²`` (+ ``4·d_model``), whatever ``h`` is. With ``g = n_kv_heads`` key/value heads
    (GQA), ``W_k`` and ``W_v`` (and ``b_k``, ``b_v``) have ``g`` heads instead of ``h``.

    Parameters
    ----------
    d_model, h : int
    d_k, d_v : int, optional
        Defaults as in :class:`~mha_course.MultiHeadAttention`.
    bias : bool, default False
    n_kv_heads : int, optional
        Key/value heads ``g`` (a divisor of ``h``); default ``h``.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        As :class:`~mha_course.MultiHeadAttention`.

    Examples
    --------
    >>> param_count(512, 8), param_count(512, 8, bias=True)
    (1048576, 1050624)
    >>> param_count(512, 8, n_kv_heads=1)  # MQA: W_k and W_v shrink to one head each
    589824
    """
    d_model, h, d_k, d_v = head_dims("param_count", d_model, h, d_k, d_v)
    g = kv_head_count("param_count", h, n_kv_heads)
    weights = d_model * h * d_k + d_model * g * (d_k + d_v) + h * d_v * d_model
    biases = h * d_k + g * (d_k + d_v) + d_model if bias else 0
    return weights + biases


def attention_flops(T, d_model, h, d_k=None, d_v=None, S=None, n_kv_heads=None) -> dict[str, int]:
    """Matmul FLOPs of one multi-head attention forward pass, by term.

    Parameters
    ----------
    T : int
        Query positions.
    d_model, h : int
    d_k, d_v : int, optional
        Defaults as in :class:`~mha_course.MultiHeadAttention`.
    S : int, optional
        Key/value positions (default ``T``, self-attention).
    n_kv_heads : int, optional
        Key/value heads ``g`` (a divisor of ``h``); default ``h``. GQA shrinks only the K and V
        projections (``h`` becomes ``g`` in their term); every query head still scores and
        averages over all ``S`` keys, so the other terms do not change.

    Returns
    -------
    dict of str to int
        ``"projections"`` (Q, K and V: ``2·T·d_model·h·d_k + 2·S·d_model·g·(d_k + d_v)``),
        ``"scores"`` (``2·h·T·S·d_k``), ``"weighted_sum"`` (``2·h·T·S·d_v``),
        ``"output_projection"`` (``2·T·h·d_v·d_model``) and ``"total"``. With
        d_k = d_v = d_model / h the total is ``8·n·d_model² + 4·n²·d_model`` for n = T = S:
        it does not depend on ``h``.

    Raises
    ------
    ValueError
        If a size is not a positive integer, or as :class:`~mha_course.MultiHeadAttention`.

    Examples
    --------
    >>> attention_flops(T=10, d_model=512, h=8)["total"] == 8 * 10 * 512**2 + 4 * 10**2 * 512
    True
    """
    func = "attention_flops"
    T = validate_positive_int(func, "T", T)
    S = T if S is None else validate_positive_int(func, "S", S)
    d_model, h, d_k, d_v = head_dims(func, d_model, h, d_k, d_v)
    g = kv_head_count(func, h, n_kv_heads)
    terms = {
        "projections": 2 * T * d_model * h * d_k + 2 * S * d_model * g * (d_k + d_v),
        "scores": 2 * h * T * S * d_k,
        "weighted_sum": 2 * h * T * S * d_v,
        "output_projection": 2 * T * h * d_v * d_model,
    }
    terms["total"] = sum(terms.values())
    return terms


def kv_cache_bytes(n_layers, n_kv_heads, d_k, seq_len, batch=1, bytes_per_value=2) -> int:
    """Bytes a decoder's KV cache holds: ``2·n_layers·n_kv_heads·d_k·seq_len·batch·bytes``.

    Every layer keeps, for every token seen so far, one key and one value vector of width
    ``d_k`` per key/value head (the 2 counts K and V; values are assumed as wide as keys). It
    grows linearly with the sequence and the batch, and GQA/MQA shrink it by ``h / n_kv_heads``.

    Parameters
    ----------
    n_layers : int
        Attention layers of the model.
    n_kv_heads : int
        Key/value heads per layer (``h`` without GQA, 1 for MQA).
    d_k : int
        Width of one key (and one value) per head.
    seq_len : int
        Tokens in the cache (prompt plus generated).
    batch : int, default 1
        Sequences decoded together.
    bytes_per_value : int, default 2
        2 for fp16/bf16, 4 for fp32, 1 for an 8-bit cache.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If an argument is not a positive integer.

    Examples
    --------
    >>> kv_cache_bytes(n_layers=32, n_kv_heads=32, d_k=128, seq_len=4096) / 2**30  # GiB
    2.0
    """
    func = "kv_cache_bytes"
    sizes = {
        "n_layers": n_layers,
        "n_kv_heads": n_kv_heads,
        "d_k": d_k,
        "seq_len": seq_len,
        "batch": batch,
        "bytes_per_value": bytes_per_value,
    }
    total = 2
    for name, value in sizes.items():
        total *= validate_positive_int(func, name, value)
    return total


def mla_cache_bytes(n_layers, d_c, d_rope, seq_len, batch=1, bytes_per_value=2) -> int:
    """Bytes of a multi-head latent attention (MLA) cache: ``n_layers·(d_c + d_rope)·seq_len·
    batch·bytes``.

    MLA (DeepSeek-V2, :class:`~mha_course.variants.mla.MultiHeadLatentAttention`) caches, per
    layer and token, one latent vector ``c`` of width ``d_c`` from which every head's key and
    value are reconstructed (or into which they are absorbed), plus one RoPE key of width ``d_rope``
    shared by all heads: no factor 2 and no head count. Forgetting ``d_rope`` is a classic
    mistake: DeepSeek-V2 caches 512 + 64 = 576 values per layer per token, not 512.

    Parameters
    ----------
    n_layers : int
        Attention layers of the model.
    d_c : int
        Width of the compressed key/value latent (``kv_lora_rank`` in DeepSeek's configs).
    d_rope : int
        Width of the decoupled RoPE key (``qk_rope_head_dim``).
    seq_len : int
        Tokens in the cache.
    batch : int, default 1
        Sequences decoded together.
    bytes_per_value : int, default 2
        2 for fp16/bf16, 4 for fp32, 1 for an 8-bit cache.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If an argument is not a positive integer.

    Examples
    --------
    >>> mla_cache_bytes(n_layers=60, d_c=512, d_rope=64, seq_len=1)  # DeepSeek-V2, bf16
    69120
    >>> kv_cache_bytes(n_layers=60, n_kv_heads=128, d_k=128, seq_len=1)  # its 128 heads as MHA
    3932160
    """
    func = "mla_cache_bytes"
    sizes = {"n_layers": n_layers, "d_c": d_c, "d_rope": d_rope, "seq_len": seq_len,
             "batch": batch, "bytes_per_value": bytes_per_value}
    n = {name: validate_positive_int(func, name, value) for name, value in sizes.items()}
    per_token = n["d_c"] + n["d_rope"]  # one latent and one shared RoPE key, per layer
    return n["n_layers"] * per_token * n["seq_len"] * n["batch"] * n["bytes_per_value"]


# Real models' attention configurations and their KV caches (lesson 06).
#: Fields of each model's config.json that decide its KV cache (Hugging Face names), with a note
#: on where they come from. ``layer_types`` is spelled as a pattern repeated over the layers.
MODELS: dict[str, dict] = {
    "Llama 3 8B": {
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 8192,
        "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
        "source": "meta-llama/Meta-Llama-3-8B config.json (Llama 3.1 8B: the same attention, "
                  "max_position_embeddings 131072)",
    },
    "Llama 3 70B": {
        "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64,
        "num_key_value_heads": 8, "max_position_embeddings": 8192,
        "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False,
        "source": "meta-llama/Meta-Llama-3-70B config.json (Llama 3.1 70B: the same attention, "
                  "max_position_embeddings 131072)",
    },
    "Mistral 7B v0.1": {
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "sliding_window": 4096, "max_position_embeddings": 32768,
        "source": "mistralai/Mistral-7B-v0.1 config.json (v0.2 and later: sliding_window null)",
    },
    "DeepSeek-V2": {
        "num_hidden_layers": 60, "hidden_size": 5120, "num_attention_heads": 128,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "q_lora_rank": 1536, "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                         "mscale_all_dim": 0.707},
        "source": "deepseek-ai/DeepSeek-V2 config.json; DeepSeek-V2 paper (arXiv:2405.04434), "
                  "section 2.1",
    },
    "DeepSeek-V3": {
        "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
        "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "q_lora_rank": 1536, "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6, "rope_theta": 10000,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "source": "deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 report (arXiv:2412.19437); "
                  "DeepSeek-V3 inference/model.py (ModelArgs: rope_factor 40, mscale 1.0, "
                  "original_seq_len 4096)",
    },
    "gpt-oss-120b": {
        "num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 64, "sliding_window": 128,
        "layer_types": ("sliding_attention", "full_attention"), "max_position_embeddings": 131072,
        "source": "openai/gpt-oss-120b config.json and model card (August 2025): layers "
                  "alternate a 128-token window and full attention, the first one windowed "
                  "(the defaults of Hugging Face transformers' GptOssConfig, which are this "
                  "model's, agree: 36 layers, 64 / 8 heads, head_dim 64, sliding_window 128)",
    },
}


def _field(func: str, config: dict, name: str) -> int:
    if name not in config:
        raise fail(func, f"config has no {name!r}; expected a config.json-style dict with "
                         "num_hidden_layers, num_attention_heads, num_key_value_heads (or "
                         "kv_lora_rank and qk_rope_head_dim for MLA) and hidden_size or head_dim")
    return validate_positive_int(func, f"config[{name!r}]", config[name])


def head_dim(config: dict) -> int:
    """``head_dim`` of a config, or ``hidden_size // num_attention_heads`` when it has none.

    Examples
    --------
    >>> head_dim(MODELS["Llama 3 8B"]), head_dim(MODELS["gpt-oss-120b"])
    (128, 64)
    """
    func = "head_dim"
    if "head_dim" in config:
        return _field(func, config, "head_dim")
    return _field(func, config, "hidden_size") // _field(func, config, "num_attention_heads")


def layer_windows(config: dict) -> list:
    """The sliding window of each layer (None for a layer that attends to every token).

    Examples
    --------
    >>> layer_windows(MODELS["gpt-oss-120b"])[:4]
    [128, None, 128, None]
    """
    n_layers = _field("layer_windows", config, "num_hidden_layers")
    window = config.get("sliding_window")
    if window is None:
        return [None] * n_layers
    window = _field("layer_windows", config, "sliding_window")
    pattern = config.get("layer_types") or ("sliding_attention",)
    return [window if pattern[i % len(pattern)] == "sliding_attention" else None
            for i in range(n_layers)]


def is_mla(config: dict) -> bool:
    """Whether the config describes multi-head latent attention (it has ``kv_lora_rank``)."""
    return "kv_lora_rank" in config


def values_per_layer_token(config: dict) -> int:
    """Numbers one layer caches per token: ``2·n_kv_heads·head_dim``, or ``d_c + d_rope`` (MLA).

    Examples
    --------
    >>> values_per_layer_token(MODELS["Llama 3 8B"]), values_per_layer_token(MODELS["DeepSeek-V2"])
    (2048, 576)
    """
    if is_mla(config):
        return (_field("values_per_layer_token", config, "kv_lora_rank")
                + _field("values_per_layer_token", config, "qk_rope_head_dim"))
    return 2 * _field("values_per_layer_token", config, "num_key_value_heads") * head_dim(config)


def mla_layer_options(config: dict) -> dict:
    """The :class:`~mha_course.variants.mla.MultiHeadLatentAttention` arguments of an MLA config.

    ``d_c`` = ``kv_lora_rank``, ``d_rope`` = ``qk_rope_head_dim``, ``d_k`` =
    ``qk_nope_head_dim``, ``d_v`` = ``v_head_dim``, ``d_cq`` = ``q_lora_rank`` (None: queries
    projected directly), ``eps`` = ``rms_norm_eps``, ``rope_base`` = ``rope_theta``,
    ``rope_scaling`` as it is.

    Examples
    --------
    >>> opts = mla_layer_options(MODELS["DeepSeek-V3"])
    >>> opts["d_c"], opts["d_rope"], opts["d_k"], opts["d_cq"], opts["eps"]
    (512, 64, 128, 1536, 1e-06)
    """
    func = "mla_layer_options"
    if not is_mla(config):
        raise fail(func, "config has no 'kv_lora_rank'; expected an MLA config (DeepSeek-V2/V3)")
    names = {"d_model": "hidden_size", "h": "num_attention_heads", "d_c": "kv_lora_rank",
             "d_rope": "qk_rope_head_dim", "d_k": "qk_nope_head_dim", "d_v": "v_head_dim"}
    options = {arg: _field(func, config, field) for arg, field in names.items()}
    q_lora = config.get("q_lora_rank")
    options["d_cq"] = None if q_lora is None else _field(func, config, "q_lora_rank")
    options["eps"] = float(config.get("rms_norm_eps", 1e-6))
    options["rope_base"] = float(config.get("rope_theta", 10000.0))
    options["rope_scaling"] = config.get("rope_scaling")
    return options


def cache_bytes(config: dict, seq_len, batch=1, bytes_per_value=2) -> int:
    """Bytes of a model's KV cache for ``batch`` sequences of ``seq_len`` tokens.

    Computed layer by layer with :func:`~mha_course.cost.kv_cache_bytes` (or
    :func:`~mha_course.cost.mla_cache_bytes`), each layer holding ``min(seq_len, window)``
    tokens when it has a sliding window.

    Parameters
    ----------
    config : dict
        config.json fields, as in :data:`MODELS`.
    seq_len, batch : int
    bytes_per_value : int, default 2
        2 for bf16/fp16.

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If a needed field is missing or not a positive integer, or a size is not a positive
        integer.

    Examples
    --------
    >>> cache_bytes(MODELS["Llama 3 8B"], seq_len=1) // 1024  # KiB per token, bf16
    128
    >>> mistral = MODELS["Mistral 7B v0.1"]  # a 4096-token window in every layer
    >>> cache_bytes(mistral, 131072) == cache_bytes(mistral, 4096)
    True
    """
    func = "cache_bytes"
    seq_len = validate_positive_int(func, "seq_len", seq_len)
    total = 0
    for window in layer_windows(config):
        tokens = seq_len if window is None else min(seq_len, window)
        if is_mla(config):
            total += mla_cache_bytes(1, config["kv_lora_rank"], config["qk_rope_head_dim"],
                                     tokens, batch, bytes_per_value)
        else:
            total += kv_cache_bytes(1, _field(func, config, "num_key_value_heads"),
                                    head_dim(config), tokens, batch, bytes_per_value)
    return total
