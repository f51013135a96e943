"""What a token costs: the bytes and FLOPs of a decode step and of a prefill, and their time.

Taught in ``notebooks/10_serving.ipynb`` (§1); lesson 06 §4 introduced the arithmetic intensity
of a step. Counting rules (a multiply-add is 2 FLOPs):

- **weights.** A step multiplies every token of the batch by every weight matrix (attention,
  MLP, output head): ``2 · matmul_params`` FLOPs per token, while the weights are read **once**
  for the whole batch. The embedding table is not a matrix product: a step reads only the rows
  of its tokens, so it is left out of the bytes (review D19 of lesson 06);
- **the cache.** Each sequence reads its own keys and values: ``2·L·g·d_head`` numbers per
  cached token, and each query head spends ``4·d_head`` FLOPs per key (score and weighted sum),
  so a cached value serves the ``h/g`` query heads of its group;
- **time** on a roofline: ``max(bytes / bandwidth, FLOPs / peak)``; a step is memory-bound
  when the first is larger. Activations and the one new key and value written are ignored
  (a few megabytes against gigabytes).

Prefill of ``T`` tokens reads the weights once for ``T`` tokens and runs causal attention over
them (``T(T+1)/2`` query-key pairs): its intensity grows with ``T``, so it is compute-bound.

The GPU numbers are NVIDIA's datasheet figures for the H100 SXM (:data:`GPUS`, with the source).
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import fail, validate_positive_int
from ..cost import head_dim, kv_cache_bytes, param_count

#: Datasheet numbers of GPUs (dense: without 2:4 structured sparsity).
GPUS: dict[str, dict] = {
    "H100 SXM": {
        "flops_per_s": 989e12, "bytes_per_s": 3.35e12, "sms": 132, "memory_bytes": 80e9,
        "source": "NVIDIA H100 Tensor Core GPU datasheet: BF16 Tensor Core 1,979 TFLOP/s with "
                  "sparsity (989 dense, half of it), GPU memory bandwidth 3.35 TB/s, 80 GB "
                  "HBM3; 132 SMs (NVIDIA Hopper architecture whitepaper, H100 SXM5)",
    },
}


def model_sizes(config: dict) -> dict[str, int]:
    """Parameter counts of a Llama-style config (``hidden_size``, ``intermediate_size``, ...).

    Returns a dict: ``"attention"`` and ``"mlp"`` per layer, ``"embedding"`` (the input table),
    ``"head"`` (the output head, 0 when tied), ``"norms"``, ``"matmul"`` (every weight a token
    is multiplied by: layers and head) and ``"total"``.

    Examples
    --------
    >>> from mha_course.cost import MODELS
    >>> model_sizes(MODELS["Llama 3 8B"])["total"]
    8030261248
    """
    func = "model_sizes"
    need = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
            "vocab_size")
    missing = [n for n in need if n not in config]
    if missing:
        raise fail(func, f"config has no {missing}; expected config.json fields {list(need)} "
                         "(and num_key_value_heads, head_dim when the model has them)")
    L, d, h, d_ff, vocab = (validate_positive_int(func, f"config[{n!r}]", config[n])
                            for n in need)
    g = config.get("num_key_value_heads", h)
    attention = param_count(d, h, head_dim(config), n_kv_heads=g)
    mlp = 3 * d * d_ff  # gate, up, down (SwiGLU)
    embedding = vocab * d
    head = 0 if config.get("tie_word_embeddings", False) else vocab * d
    norms = L * 2 * d + d
    matmul = L * (attention + mlp) + (head or embedding)  # a tied head still multiplies
    return {"attention": attention, "mlp": mlp, "embedding": embedding, "head": head,
            "norms": norms, "matmul": matmul,
            "total": L * (attention + mlp) + embedding + head + norms}


def decode_step_cost(config: dict, batch: int, context: int, bytes_per_value: int = 2) -> dict:
    """FLOPs and bytes of one decode step: ``batch`` sequences, each with ``context`` keys.

    Returns
    -------
    dict
        ``"flops"``, ``"weight_bytes"``, ``"cache_bytes"``, ``"bytes"`` (their sum),
        ``"intensity"`` (FLOPs per byte), and the FLOPs split into ``"weight_flops"`` and
        ``"attention_flops"``.

    Examples
    --------
    >>> from mha_course.cost import MODELS
    >>> c = decode_step_cost(MODELS["Llama 3 8B"], batch=1, context=1)
    >>> round(c["intensity"], 2)  # one token: about one FLOP per byte of bf16 weights
    1.0
    """
    func = "decode_step_cost"
    batch = validate_positive_int(func, "batch", batch)
    context = validate_positive_int(func, "context", context)
    sizes = model_sizes(config)
    L, h = config["num_hidden_layers"], config["num_attention_heads"]
    d_head, g = head_dim(config), config.get("num_key_value_heads", h)
    weight_flops = 2 * sizes["matmul"] * batch
    attention_flops = 4 * L * h * d_head * context * batch  # scores + weighted sum
    weight_bytes = (sizes["matmul"] + sizes["norms"]) * bytes_per_value
    cache = kv_cache_bytes(L, g, d_head, context, batch, bytes_per_value)
    flops = weight_flops + attention_flops
    return {"flops": flops, "weight_flops": weight_flops, "attention_flops": attention_flops,
            "weight_bytes": weight_bytes, "cache_bytes": cache, "bytes": weight_bytes + cache,
            "intensity": flops / (weight_bytes + cache)}


def prefill_cost(config: dict, T: int, bytes_per_value: int = 2) -> dict:
    """FLOPs and bytes of prefilling one prompt of ``T`` tokens (causal attention).

    Bytes: the weights, read once, and the ``T`` tokens' keys and values, written once.

    Examples
    --------
    >>> from mha_course.cost import MODELS
    >>> decode = decode_step_cost(MODELS["Llama 3 8B"], 1, 2048)["intensity"]
    >>> prefill = prefill_cost(MODELS["Llama 3 8B"], 2048)["intensity"]
    >>> bool(prefill > 500 * decode)
    True
    """
    T = validate_positive_int("prefill_cost", "T", T)
    sizes = model_sizes(config)
    L, h = config["num_hidden_layers"], config["num_attention_heads"]
    d_head, g = head_dim(config), config.get("num_key_value_heads", h)
    flops = 2 * sizes["matmul"] * T + 4 * L * h * d_head * (T * (T + 1) // 2)
    weight_bytes = (sizes["matmul"] + sizes["norms"]) * bytes_per_value
    cache = kv_cache_bytes(L, g, d_head, T, 1, bytes_per_value)
    return {"flops": flops, "weight_bytes": weight_bytes, "cache_bytes": cache,
            "bytes": weight_bytes + cache, "intensity": flops / (weight_bytes + cache)}


def roofline_time(cost: dict, gpu: dict) -> dict:
    """Time of a cost on a GPU's roofline: ``{"memory_s", "compute_s", "time_s", "bound"}``.

    ``bound`` is ``"memory"`` when reading the bytes takes longer than the FLOPs.
    """
    memory = cost["bytes"] / gpu["bytes_per_s"]
    compute = cost["flops"] / gpu["flops_per_s"]
    return {"memory_s": memory, "compute_s": compute, "time_s": max(memory, compute),
            "bound": "memory" if memory >= compute else "compute"}


def critical_batch(config: dict, context: int, gpu: dict, bytes_per_value: int = 2,
                   largest: int = 1 << 20):
    """The smallest batch at which a decode step at ``context`` becomes compute-bound.

    None when no batch up to ``largest`` gets there: the cache's bytes grow with the batch as
    fast as its FLOPs, so at long contexts the intensity levels off below the GPU's balance.

    Examples
    --------
    >>> from mha_course.cost import MODELS
    >>> critical_batch(MODELS["Llama 3 8B"], 1, GPUS["H100 SXM"]) > 250
    True
    >>> critical_batch(MODELS["Llama 3 8B"], 32768, GPUS["H100 SXM"]) is None
    True
    """
    balance = gpu["flops_per_s"] / gpu["bytes_per_s"]
    if decode_step_cost(config, largest, context, bytes_per_value)["intensity"] < balance:
        return None
    lo, hi = 1, largest  # the intensity grows with the batch: bisect
    while lo < hi:
        mid = (lo + hi) // 2
        if decode_step_cost(config, mid, context, bytes_per_value)["intensity"] >= balance:
            hi = mid
        else:
            lo = mid + 1
    return lo


def fit_step_time(batches, seconds) -> dict:
    """Least-squares ``t(B) = fixed + per_token · B`` through measured step times.

    ``fixed`` is what a step costs whatever the batch (reading the weights, launching the
    work); ``per_token`` what each sequence adds. ``crossover = fixed / per_token`` is the batch
    at which the two are equal: below it a step's time barely grows with the batch (the
    memory-bound, or overhead-bound, regime), above it the time grows in proportion.

    Examples
    --------
    >>> fit = fit_step_time([1, 2, 4, 8], [1.1, 1.2, 1.4, 1.8])
    >>> round(fit["fixed"], 3), round(fit["per_token"], 3), round(fit["crossover"], 1)
    (1.0, 0.1, 10.0)
    """
    B = np.asarray(batches, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if B.shape != t.shape or B.size < 2:
        raise fail("fit_step_time", f"batches and seconds have shapes {B.shape} and {t.shape}; "
                                    "expected two equal 1-d arrays of at least 2 points")
    per_token, fixed = np.polyfit(B, t, 1)
    crossover = fixed / per_token if per_token > 0 else math.inf
    return {"fixed": float(fixed), "per_token": float(per_token), "crossover": float(crossover)}
