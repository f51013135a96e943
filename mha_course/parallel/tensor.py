"""Tensor parallelism (Megatron-LM): one layer's heads split over p devices.

Taught in ``notebooks/11_parallel.ipynb`` (section 2); the bias, lesson 09's model and a
Llama-3-70B-like layer in ``notebooks/deep_dives/11a_parallel_at_scale.ipynb`` (section 2).

Shoeybi et al. (2019, "Megatron-LM", arXiv:1909.08053) split a transformer layer so that each block
needs one all-reduce in the forward pass and one in the backward pass:

- **attention**: ``W_q``, ``W_k`` and ``W_v`` are split by columns (*column-parallel*), a whole
  number of heads per device, so each device attends with its own heads and needs nothing from
  the others; ``W_o`` is split by rows (*row-parallel*), the rows that read those heads, so each
  device's ``concat_i @ W_o_i`` is one term of ``concat @ W_o``. An **all-reduce** sums the
  terms. The bias ``b_o`` is added once, after the sum (added on every device before it, it
  would count ``p`` times);
- **the MLP** (SwiGLU here): ``W_gate`` and ``W_up`` column-parallel, ``W_down`` row-parallel,
  one all-reduce;
- **backward**: the input's gradient is the sum of every device's partial ``dx``: one
  all-reduce per block again; every weight's gradient stays on its device.

With grouped-query attention (``g = n_kv_heads < h``) query head ``i`` reads K/V head
``i // (h / g)``. Device ``j`` holds query heads ``j·h/p .. (j+1)·h/p - 1``; when ``p`` divides
``g`` it holds their ``g / p`` K/V heads, and when ``p > g`` (and ``g`` divides ``p``) its query
heads all sit in one group and it holds a copy of that one K/V head, replicated on ``p / g``
devices. Any other ``(h, g, p)`` would cut a group in two: refused, as vLLM's attention layers
do (``assert tp_size % total_num_kv_heads == 0``).
"""

from __future__ import annotations

import numpy as np

from .. import MultiHeadAttention, causal_mask, rms_norm, swiglu
from .._validate import fail, refuse_layer_scale, validate_positive_int
from ..block import swiglu_backward
from .collectives import Meta, is_meta


def kv_heads_per_device(h: int, n_kv_heads: int, p: int) -> tuple[int, bool]:
    """How many K/V heads each of ``p`` devices holds, and whether they are replicated copies.

    Returns ``(g / p, False)`` when ``p`` divides ``g``, ``(1, True)`` when ``g`` divides
    ``p``; raises otherwise.

    Raises
    ------
    ValueError
        If ``p`` does not divide ``h``, or neither of ``p`` and ``g`` divides the other.

    Examples
    --------
    >>> kv_heads_per_device(64, 8, 4), kv_heads_per_device(64, 8, 16)
    ((2, False), (1, True))
    """
    func = "tensor parallelism"
    h, g, p = (validate_positive_int(func, n, v) for n, v in
               (("h", h), ("n_kv_heads", n_kv_heads), ("p", p)))
    if h % p:
        raise fail(func, f"p={p} devices cannot share h={h} query heads: p must divide h, "
                         "each device holds whole heads")
    if g % p == 0:
        return g // p, False
    if p % g == 0:
        return 1, True
    raise fail(func, f"p={p} and n_kv_heads={g}: one must divide the other (a K/V head is "
                     "either split off whole or replicated), or a group of query heads would "
                     "be cut across two devices")


class TensorParallelAttention:
    """A :class:`~mha_course.MultiHeadAttention` layer split over ``p`` devices by heads.

    Parameters
    ----------
    layer : MultiHeadAttention
        The single-device layer (self-attention; RoPE and GQA allowed).
    p : int
        Number of devices.

    Attributes
    ----------
    shards : list of MultiHeadAttention
        Device ``j``'s layer: ``h / p`` query heads, its K/V heads, the rows of ``W_o`` that read
        its heads, and no output bias.
    query_heads, kv_heads : list of list of int
        The global heads each device holds.
    b_o : ndarray or None
        The output bias, added once after the all-reduce.

    Examples
    --------
    >>> from mha_course.parallel.collectives import Cluster
    >>> layer = MultiHeadAttention(16, 4, rng=0)
    >>> tp = TensorParallelAttention(layer, 2)
    >>> x = np.ones((3, 16))
    >>> out = tp.forward(Cluster(2), x)
    >>> bool(np.allclose(out[1], layer(x)[0]))
    True
    """

    def __init__(self, layer, p):
        if not isinstance(layer, MultiHeadAttention):
            raise fail("TensorParallelAttention", f"layer is a {type(layer).__name__}; "
                                                  "expected a MultiHeadAttention")
        refuse_layer_scale("TensorParallelAttention", layer)
        self.layer, self.p = layer, validate_positive_int("TensorParallelAttention", "p", p)
        h, g = layer.h, layer.n_kv_heads
        g_local, replicated = kv_heads_per_device(h, g, self.p)
        per = layer.per_head()  # W_q (h, d_model, d_k), W_k (g, ...), W_o (h, d_v, d_model)
        h_local, group = h // self.p, h // g
        self.query_heads = [list(range(j * h_local, (j + 1) * h_local)) for j in range(self.p)]
        self.kv_heads = [[qh[0] // group] if replicated else
                         list(range(j * g_local, (j + 1) * g_local))
                         for j, qh in enumerate(self.query_heads)]
        self.b_o = None if layer.b_o is None else layer.b_o.copy()
        self.shards = []
        for qh, kh in zip(self.query_heads, self.kv_heads, strict=True):
            biases = {}
            if layer.bias:  # the column-parallel biases split with their columns; b_o: none
                biases = {"b_q": [layer.b_q.reshape(h, -1)[i] for i in qh],
                          "b_k": [layer.b_k.reshape(g, -1)[i] for i in kh],
                          "b_v": [layer.b_v.reshape(g, -1)[i] for i in kh],
                          "b_o": np.zeros(layer.d_model)}
            W_o = per["W_o"][qh].reshape(-1, layer.d_model)  # (h_local*d_v, d_model): its rows
            self.shards.append(MultiHeadAttention.from_per_head(
                per["W_q"][qh], per["W_k"][kh], per["W_v"][kh], W_o, **biases,
                rope=layer.rope, rope_base=layer.rope_base))

    def __repr__(self) -> str:
        return (f"TensorParallelAttention(p={self.p}, heads per device={len(self.query_heads[0])}"
                f", K/V heads per device={len(self.kv_heads[0])})")

    def weight_bytes(self) -> list[int]:
        """Bytes of the parameters each device holds."""
        return [sum(a.nbytes for a in s.parameters().values()) for s in self.shards]

    def partial_outputs(self, x, mask=None) -> list:
        """What each device computes before the all-reduce: its heads' term of ``concat @ W_o``.

        ``x`` (..., T, d_model) is replicated (every device has the whole input); a
        :class:`~mha_course.parallel.collectives.Meta` placeholder gives placeholders.
        """
        if is_meta(x):
            return [Meta(x.shape, x.dtype) for _ in range(self.p)]
        return [shard(x, mask=mask)[0] for shard in self.shards]

    def forward(self, cluster, x, mask=None) -> list:
        """The layer's output on every device: partial outputs, one all-reduce, then ``b_o``."""
        _check_cluster("TensorParallelAttention.forward", cluster, self.p)
        out = cluster.all_reduce(self.partial_outputs(x, mask))
        if self.b_o is not None and not is_meta(x):
            out = [o + self.b_o.astype(o.dtype, copy=False) for o in out]
        return out

    def backward(self, cluster, x, grad_out, mask=None) -> tuple[list, list]:
        """One training step's backward: returns ``(dx on every device, each device's weight
        gradients)``. Each device runs its shard's backward on the (replicated) ``grad_out``;
        the partial input gradients are summed by one all-reduce."""
        _check_cluster("TensorParallelAttention.backward", cluster, self.p)
        grads = []
        for shard in self.shards:
            _, saved = shard.forward(x, mask=mask, return_cache=True)
            grads.append(shard.backward(grad_out, saved))
        dx = cluster.all_reduce([g.pop("x") for g in grads])
        for g in grads:
            g.pop("b_o", None)  # not a parameter of the shard: b_o lives outside the sum
        return dx, grads


class TensorParallelSwiGLU:
    """The SwiGLU MLP split over ``p`` devices: ``W_gate`` and ``W_up`` by columns, ``W_down``
    by rows, one all-reduce.

    Examples
    --------
    >>> from mha_course.parallel.collectives import Cluster
    >>> rng = np.random.default_rng(0)
    >>> W = rng.normal(size=(4, 6)), rng.normal(size=(4, 6)), rng.normal(size=(6, 4))
    >>> mlp = TensorParallelSwiGLU(*W, p=3)
    >>> bool(np.allclose(mlp.forward(Cluster(3), np.ones((2, 4)))[0], swiglu(np.ones((2, 4)), *W)))
    True
    """

    def __init__(self, W_gate, W_up, W_down, p):
        func = "TensorParallelSwiGLU"
        self.p = validate_positive_int(func, "p", p)
        d_ff = np.shape(W_gate)[-1]
        if d_ff % self.p:
            raise fail(func, f"p={self.p} does not divide d_ff={d_ff}: each device holds "
                             "d_ff / p columns of W_gate and W_up and as many rows of W_down")
        cols = np.array_split(np.arange(d_ff), self.p)
        self.shards = [(W_gate[:, c], W_up[:, c], W_down[c, :]) for c in cols]

    def partial_outputs(self, x) -> list:
        if is_meta(x):
            return [Meta(x.shape, x.dtype) for _ in range(self.p)]
        return [swiglu(x, *w) for w in self.shards]

    def forward(self, cluster, x) -> list:
        _check_cluster("TensorParallelSwiGLU.forward", cluster, self.p)
        return cluster.all_reduce(self.partial_outputs(x))

    def backward(self, cluster, x, grad_out) -> tuple[list, list]:
        """``(dx on every device, each device's {W_gate, W_up, W_down} gradients)``."""
        _check_cluster("TensorParallelSwiGLU.backward", cluster, self.p)
        grads = [swiglu_backward(grad_out, x, *w) for w in self.shards]
        dx = cluster.all_reduce([g.pop("x") for g in grads])
        return dx, grads


class TensorParallelGPT:
    """Every block of a GPT split over ``p`` devices: attention by heads, the MLP by columns and
    rows, two all-reduces per block; the embedding, the norms and the output head replicated.

    The model is taken by duck typing: lesson 09's :class:`~mha_course.models.gpt.GPT` (or
    anything with its ``config`` (``eps``), ``W_E``, ``blocks`` (each with ``attn``, a
    :class:`~mha_course.MultiHeadAttention`, and ``attn_norm``, ``mlp_norm``, ``W_gate``,
    ``W_up``, ``W_down``: a :class:`~mha_course.block.PreNormBlock`), ``norm_f`` and ``W_U``),
    whose forward is
    pre-norm: ``x += attention(rms_norm(x))``, ``x += swiglu(rms_norm(x))``, then
    ``rms_norm(x) @ W_U``.
    """

    def __init__(self, model, p):
        self.model, self.p = model, validate_positive_int("TensorParallelGPT", "p", p)
        self.attention = [TensorParallelAttention(block.attn, self.p) for block in model.blocks]
        self.mlps = [TensorParallelSwiGLU(b.W_gate, b.W_up, b.W_down, self.p)
                     for b in model.blocks]

    def forward(self, cluster, tokens) -> list:
        """Logits (..., T, V) on every device. The residual stream is replicated: after each
        all-reduce every device holds the same ``x``, so it is carried once here."""
        _check_cluster("TensorParallelGPT.forward", cluster, self.p)
        m, eps = self.model, self.model.config.eps
        tokens = np.asarray(tokens)
        mask = causal_mask(tokens.shape[-1])
        x = m.W_E[tokens]  # (..., T) -> (..., T, d_model), on every device
        for attention, mlp, block in zip(self.attention, self.mlps, m.blocks, strict=True):
            outs = attention.forward(cluster, rms_norm(x, block.attn_norm, eps), mask)
            x = x + outs[0]
            outs = mlp.forward(cluster, rms_norm(x, block.mlp_norm, eps))
            x = x + outs[0]
        logits = rms_norm(x, m.norm_f, eps) @ m.W_U
        return [logits] * self.p


def _check_cluster(func: str, cluster, p: int) -> None:
    if getattr(cluster, "p", None) != p:
        raise fail(func, f"cluster has p={getattr(cluster, 'p', None)} devices; expected "
                         f"p={p}, as the layer was split")
