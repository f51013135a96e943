"""The activation memory of attention in training, per device: what the backward pass keeps.

Taught in ``notebooks/11_parallel.ipynb`` (section 6); the table of
:func:`attention_activation_bytes` in ``notebooks/deep_dives/11a_parallel_at_scale.ipynb``
(section 6).

Korthikanti et al. (2022, "Reducing activation recomputation in large transformer models",
arXiv:2205.05198, Table 2) count, for one layer with sequence length ``s``, micro-batch ``b``,
width ``h`` and ``a`` heads, 16-bit activations (2 bytes) and 1-byte dropout masks, what the
attention block stores for its backward pass: the input of the Q/K/V projections (``2sbh``),
``Q`` and ``K`` (``4sbh``), the softmax's output (``2as²b``), its dropout mask (``as²b``) and
the dropout's output (``2as²b``), ``V`` (``2sbh``), the input of the output projection
(``2sbh``) and the output dropout's mask (``sbh``): ``11sbh + 5as²b`` bytes. Then:

- **tensor parallelism** over ``t`` devices divides everything between the column- and the
  row-parallel matrices by ``t``; the projections' input and the last dropout mask stay
  replicated (``3sbh``);
- **sequence parallelism** (theirs: the LayerNorm and dropout regions split along the
  sequence) divides those replicated parts by ``t`` as well;
- **selective recomputation** (theirs too) keeps none of the ``5as²b`` terms and recomputes
  them in the backward pass; FlashAttention never stores them in the first place and keeps one
  float32 log-sum-exp per head and query instead (``4asb``);
- **full recomputation** keeps only the layer's input (``2sbh``) and reruns the forward;
- **context parallelism** (ring attention, Ulysses) over ``c`` devices splits the sequence, so
  every term is divided by ``c``.

Megatron-LM's own estimator (``megatron/training/theoretical_memory_usage.py``) uses the same
Table 2. :func:`attention_activation_bytes` returns the terms by name, so the lesson prints the
formula beside the number; with ``g`` K/V heads (GQA) ``K`` and ``V`` shrink to ``g / a`` of
their size.
"""

from __future__ import annotations

from .._validate import fail, validate_positive_int

#: The recomputation strategies :func:`attention_activation_bytes` knows.
RECOMPUTE = ("none", "selective", "flash", "full")


def attention_activation_bytes(s, b, h, a, *, g=None, t=1, sequence_parallel=False, c=1,
                               recompute="none", dropout=True, bytes_per_value=2) -> dict:
    """What one layer's attention block stores for the backward pass, per device, in bytes.

    Parameters
    ----------
    s, b, h, a : int
        Sequence length, micro-batch size, model width ``d_model`` and number of heads.
    g : int, optional
        K/V heads (GQA); default ``a``.
    t : int
        Tensor-parallel devices (must divide ``a``).
    sequence_parallel : bool
        Megatron's sequence parallelism: the replicated parts split over the ``t`` devices too.
    c : int
        Context-parallel devices (the sequence split by ring attention or Ulysses).
    recompute : {"none", "selective", "flash", "full"}
    dropout : bool
        Attention dropout (the paper's GPT-3 setting; Llama has none: no masks, no dropout
        output).
    bytes_per_value : int
        2 for bf16/fp16 activations.

    Returns
    -------
    dict of str to int
        Each stored tensor's bytes by name, and ``"total"``.

    Raises
    ------
    ValueError
        If a size is not a positive integer, ``t`` does not divide ``a``, or ``recompute`` is
        unknown.

    Examples
    --------
    >>> m = attention_activation_bytes(2048, 1, 12288, 96)
    >>> m["total"] == 11 * 2048 * 12288 + 5 * 96 * 2048**2
    True
    >>> full = attention_activation_bytes(2048, 1, 12288, 96, recompute="full")
    >>> full["total"] == 2 * 2048 * 12288
    True
    """
    func = "attention_activation_bytes"
    s, b, h, a, t, c = (validate_positive_int(func, n, v) for n, v in
                        (("s", s), ("b", b), ("h", h), ("a", a), ("t", t), ("c", c)))
    g = a if g is None else validate_positive_int(func, "g", g)
    if a % t:
        raise fail(func, f"t={t} must divide a={a}: each device holds whole heads")
    if recompute not in RECOMPUTE:
        raise fail(func, f"recompute={recompute!r}; expected one of {', '.join(RECOMPUTE)}")
    v = validate_positive_int(func, "bytes_per_value", bytes_per_value)
    tokens = s * b
    rep = t if sequence_parallel else 1  # the replicated parts: split only with SP
    kv = h * g // a  # the width of K (and of V): g heads of h / a
    if recompute == "full":
        terms = {"layer input": v * tokens * h // rep}
    else:
        terms = {"input of the Q/K/V projections": v * tokens * h // rep,
                 "Q and K": v * tokens * (h + kv) // t,
                 "V": v * tokens * kv // t}
        if recompute == "none":
            terms["softmax output"] = v * a * s * s * b // t
            if dropout:
                terms["softmax dropout mask"] = a * s * s * b // t
                terms["softmax dropout output"] = v * a * s * s * b // t
        elif recompute == "flash":
            terms["log-sum-exp (float32)"] = 4 * a * s * b // t
        terms["input of the output projection"] = v * tokens * h // t
        if dropout:
            terms["output dropout mask"] = tokens * h // rep
    terms = {name: n // c for name, n in terms.items()}
    terms["total"] = sum(terms.values())
    return terms
