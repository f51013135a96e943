"""What attention costs: parameters, floating-point operations and KV-cache memory.

Taught in ``notebooks/04_multi_head_attention.ipynb`` (parameters and FLOPs); the ``n_kv_heads``
options, :func:`kv_cache_bytes` and :func:`mla_cache_bytes` in ``notebooks/06_decoding.ipynb``
(the KV cache, MQA and GQA, MLA).

FLOPs count a multiply-add as 2 operations, so an (m, n) @ (n, p) matmul costs ``2·m·n·p``.
The softmax (about 5 operations per weight: max, subtract, exp, sum, divide) is not in the
total: it is not a matmul, and it is the part that *does* grow with ``h`` (``h·T·S`` weights).
"""

from __future__ import annotations

from ._validate import validate_positive_int
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

    MLA (DeepSeek-V2, :class:`~mha_course.mla.MultiHeadLatentAttention`) caches, per layer and
    token, one latent vector ``c`` of width ``d_c`` from which every head's key and value are
    reconstructed (or into which they are absorbed), plus one RoPE key of width ``d_rope``
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
