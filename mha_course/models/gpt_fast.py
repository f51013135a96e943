"""The GPT's training step and forward pass ordered for speed, beside the readable ones.

Taught in ``notebooks/09_tiny_gpt.ipynb`` (its speed section); tested equal to ``GPT.forward``
and ``GPT.loss_and_grads`` in ``tests/test_gpt.py``.

``GPT.forward`` / ``GPT.backward`` are the lesson's recipe: each block calls
``MultiHeadAttention.forward(..., return_cache=True)`` and ``.backward``, and
:mod:`mha_course.block`'s ``rms_norm``, ``swiglu`` and their backward passes, validating every
input and keeping every intermediate array by name. :func:`fast_loss_and_grads` computes the same
loss and gradients with the same formulas, ordered for the machine (as nanoGPT keeps its manual
attention beside the flash call):

1. **Fewer, larger matrix products.** ``W_q``, ``W_k``, ``W_v`` are applied as one
   (d_model, (h + 2g)·d_k) product, ``W_gate`` and ``W_up`` as one (d_model, 2·d_ff) product;
   the grouped query heads of one K/V head are stacked into one (h/g·T, d_k) matrix, so the
   scores of a group are one product against its keys.
2. **No validation, no copies of the weights.** Inputs are checked once per step, not in every
   layer; RoPE's cosines and sines are computed once per length and reused.
3. **In-place softmax and masking.** The scores become the weights in their own buffer; the
   causal mask is added as a precomputed (T, T) array of 0 and -inf.
4. **The embedding's gradient by a matrix product** (one-hot ids, transposed, times dL/dx)
   instead of an unbuffered scatter-add.

The gradients equal the readable path's to round-off (float64: about 1e-13 relative).
"""

from __future__ import annotations

import functools

import numpy as np

from ..positions import rope_angles
from .tiny_model import cross_entropy

__all__ = ["fast_logits", "fast_loss_and_grads"]


@functools.lru_cache(maxsize=32)
def _tables(T: int, d_k: int, base: float, layout: str, dtype_name: str):
    """RoPE's (T, d_k) cosines and sines, laid out to multiply q directly, and the causal mask
    as a (T, T) array of 0 and -inf."""
    dtype = np.dtype(dtype_name)
    theta = rope_angles(np.arange(T), d_k, base)  # (T, d_k/2)
    cos, sin = np.cos(theta), np.sin(theta)
    if layout == "half":  # pair j = (j, j + d_k/2)
        cos, sin = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)
    else:  # pair j = (2j, 2j + 1)
        cos, sin = np.repeat(cos, 2, -1), np.repeat(sin, 2, -1)
    mask = np.where(np.tril(np.ones((T, T), dtype=bool)), 0.0, -np.inf)
    return cos.astype(dtype), sin.astype(dtype), mask.astype(dtype)


def _rotate(x: np.ndarray, layout: str) -> np.ndarray:
    """The pair rotation by 90° that RoPE mixes in: (a, b) -> (-b, a) for every pair."""
    out = np.empty_like(x)
    if layout == "half":
        d = x.shape[-1] // 2
        np.negative(x[..., d:], out=out[..., :d])
        out[..., d:] = x[..., :d]
    else:
        np.negative(x[..., 1::2], out=out[..., 0::2])
        out[..., 1::2] = x[..., 0::2]
    return out


def _rope(x, cos, sin, layout):
    return x * cos + _rotate(x, layout) * sin


def _rope_backward(dy, cos, sin, layout):
    # y = x cos + R(x) sin with R^T = -R:  dx = dy cos - R(dy sin)
    return dy * cos - _rotate(dy * sin, layout)


def _rms(x, w, eps):
    r = 1.0 / np.sqrt(np.einsum("...i,...i->...", x, x)[..., None] / x.shape[-1] + eps)
    xhat = x * r
    return xhat * w, xhat, r


def _rms_backward(dy, xhat, r, w):
    g = dy * w
    dx = r * (g - xhat * (np.einsum("...i,...i->...", g, xhat)[..., None] / xhat.shape[-1]))
    return dx, np.einsum("ni,ni->i", dy, xhat)


def _sigmoid(a):
    return 0.5 * (1.0 + np.tanh(0.5 * a))  # = 1 / (1 + e^-a), without overflow


def _softmax_inplace(s):
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def _block_weights(model, i):
    p = model.blocks[i]  # the PreNormBlock
    attn = p.attn
    W_qkv = np.concatenate([attn.W_q, attn.W_k, attn.W_v], axis=1)  # (d_model, (h+2g) d_k)
    W_gu = np.concatenate([p.W_gate, p.W_up], axis=1)  # (d_model, 2 d_ff)
    return attn, p, W_qkv, W_gu


def _forward(model, tokens, head_mask=None, keep=False):
    """The forward pass on (B, T) tokens; returns logits (B·T, V) and, with ``keep``, what the
    backward pass needs."""
    c = model.config
    B, T = tokens.shape
    h, g, d_k = c.h, c.n_kv_heads, c.d_k
    r = h // g
    cos, sin, mask = _tables(T, d_k, c.rope_base, c.rope, model.dtype.name)
    scale = 1.0 / np.sqrt(d_k)
    x = model.W_E[tokens.reshape(-1)]  # (B·T, d_model)
    saved = []
    for i in range(c.n_layers):
        attn, p, W_qkv, W_gu = _block_weights(model, i)
        a, a_hat, a_r = _rms(x, p.attn_norm, c.eps)
        qkv = a @ W_qkv  # (B·T, (h + 2g) d_k)
        q = qkv[:, : h * d_k].reshape(B, T, h, d_k).transpose(0, 2, 1, 3)  # (B, h, T, d_k)
        k = qkv[:, h * d_k : (h + g) * d_k].reshape(B, T, g, d_k).transpose(0, 2, 1, 3)
        v = qkv[:, (h + g) * d_k :].reshape(B, T, g, d_k).transpose(0, 2, 1, 3)  # (B, g, T, d_k)
        q = _rope(q, cos, sin, c.rope).reshape(B, g, r * T, d_k)  # group j: heads j·r .. j·r+r-1
        k = _rope(k, cos, sin, c.rope)  # (B, g, T, d_k)
        w = q @ k.transpose(0, 1, 3, 2)  # (B, g, r·T, T)
        w *= scale
        w.reshape(B, g, r, T, T)[...] += mask
        _softmax_inplace(w)
        heads = w @ v  # (B, g, r·T, d_k)
        if head_mask is not None:
            heads = heads * np.repeat(head_mask[i], T)[None, None, :, None].reshape(
                1, g, r * T, 1).astype(heads.dtype)
        concat = heads.reshape(B, h, T, d_k).transpose(0, 2, 1, 3).reshape(B * T, h * d_k)
        x1 = x + concat @ attn.W_o
        m, m_hat, m_r = _rms(x1, p.mlp_norm, c.eps)
        ab = m @ W_gu  # (B·T, 2 d_ff)
        a_, b_ = ab[:, : c.d_ff], ab[:, c.d_ff :]
        s = _sigmoid(a_)
        act = a_ * s
        hid = act * b_
        x2 = x1 + hid @ p.W_down
        if keep:
            saved.append((a, a_hat, a_r, q, k, v, w, concat, m, m_hat, m_r, a_, b_, s, act, hid,
                          W_qkv, W_gu))
        x = x2
        del q, k, v, w
    xf, xf_hat, xf_r = _rms(x, model.norm_f, c.eps)
    logits = xf @ model.W_U  # (B·T, V)
    return logits, (saved, xf, xf_hat, xf_r)


def fast_logits(model, tokens, head_mask=None) -> np.ndarray:
    """``model.forward(tokens, head_mask=head_mask)`` for (B, T) tokens: logits (B, T, V)."""
    tokens = model.validate_tokens("fast_logits", tokens)
    lead = tokens.shape[:-1]
    flat = tokens.reshape(-1, tokens.shape[-1])
    mask_h = model.validate_head_mask("fast_logits", head_mask)
    logits, _ = _forward(model, flat, mask_h)
    return logits.reshape(*lead, tokens.shape[-1], -1)


def fast_loss_and_grads(model, tokens, targets):
    """``model.loss_and_grads(tokens, targets)`` for (B, T) tokens, ordered for speed.

    Returns
    -------
    loss : float
        Mean cross-entropy over every position.
    grads : dict of str to ndarray
        Named as ``model.parameters()``.
    """
    tokens = model.validate_tokens("fast_loss_and_grads", tokens)
    targets = np.asarray(targets)
    if tokens.ndim != 2 or targets.shape != tokens.shape:
        raise ValueError(f"fast_loss_and_grads: tokens {tokens.shape} and targets "
                         f"{targets.shape}; expected two (B, T) arrays")
    c = model.config
    B, T = tokens.shape
    h, g, d_k = c.h, c.n_kv_heads, c.d_k
    r = h // g
    N = B * T
    cos, sin, _ = _tables(T, d_k, c.rope_base, c.rope, model.dtype.name)
    scale = 1.0 / np.sqrt(d_k)
    logits, (saved, xf, xf_hat, xf_r) = _forward(model, tokens, keep=True)
    loss, dlogits = cross_entropy(logits, targets.reshape(-1))  # over every position
    grads = {"W_U": xf.T @ dlogits}
    dx, grads["norm_f"] = _rms_backward(dlogits @ model.W_U.T, xf_hat, xf_r, model.norm_f)
    for i in reversed(range(c.n_layers)):
        p = model.blocks[i]  # the PreNormBlock
        attn = p.attn
        (a, a_hat, a_r, q, k, v, w, concat, m, m_hat, m_r, a_, b_, s, act, hid,
         W_qkv, W_gu) = saved[i]
        # the MLP: x2 = x1 + (silu(m W_gate) * (m W_up)) W_down
        grads[f"L{i}.W_down"] = hid.T @ dx
        dh = dx @ p.W_down.T  # (N, d_ff)
        dab = np.empty((N, 2 * c.d_ff), dtype=dx.dtype)
        np.multiply(dh * b_, s * (1.0 + a_ * (1.0 - s)), out=dab[:, : c.d_ff])
        np.multiply(dh, act, out=dab[:, c.d_ff :])
        dW_gu = m.T @ dab
        grads[f"L{i}.W_gate"], grads[f"L{i}.W_up"] = dW_gu[:, : c.d_ff], dW_gu[:, c.d_ff :]
        dm, grads[f"L{i}.mlp_norm"] = _rms_backward(dab @ W_gu.T, m_hat, m_r, p.mlp_norm)
        dx1 = dx + dm
        # attention: x1 = x + concat W_o
        grads[f"L{i}.W_o"] = concat.T @ dx1
        dheads = (dx1 @ attn.W_o.T).reshape(B, T, h, d_k).transpose(0, 2, 1, 3)
        dheads = dheads.reshape(B, g, r * T, d_k)
        dw = dheads @ v.transpose(0, 1, 3, 2)  # (B, g, r·T, T)
        dv = w.transpose(0, 1, 3, 2) @ dheads  # (B, g, T, d_k): summed over the group
        dw -= np.einsum("...ts,...ts->...t", dw, w)[..., None]
        dw *= w  # dL/dscores, through the softmax
        dw *= scale
        dq = dw @ k  # (B, g, r·T, d_k)
        dk = dw.transpose(0, 1, 3, 2) @ q  # (B, g, T, d_k)
        dq = _rope_backward(dq.reshape(B, h, T, d_k), cos, sin, c.rope)
        dk = _rope_backward(dk, cos, sin, c.rope)
        dqkv = np.empty((B, T, (h + 2 * g) * d_k), dtype=dx.dtype)
        dqkv[..., : h * d_k] = dq.transpose(0, 2, 1, 3).reshape(B, T, h * d_k)
        dqkv[..., h * d_k : (h + g) * d_k] = dk.transpose(0, 2, 1, 3).reshape(B, T, g * d_k)
        dqkv[..., (h + g) * d_k :] = dv.transpose(0, 2, 1, 3).reshape(B, T, g * d_k)
        dqkv = dqkv.reshape(N, -1)
        dW_qkv = a.T @ dqkv
        grads[f"L{i}.W_q"] = dW_qkv[:, : h * d_k]
        grads[f"L{i}.W_k"] = dW_qkv[:, h * d_k : (h + g) * d_k]
        grads[f"L{i}.W_v"] = dW_qkv[:, (h + g) * d_k :]
        da, grads[f"L{i}.attn_norm"] = _rms_backward(dqkv @ W_qkv.T, a_hat, a_r,
                                                     p.attn_norm)
        dx = dx1 + da
    onehot = np.zeros((N, c.vocab_size), dtype=dx.dtype)
    onehot[np.arange(N), tokens.reshape(-1)] = 1.0
    grads["W_E"] = onehot.T @ dx  # each row: the sum over the positions of its token
    return loss, {name: grads[name] for name in model.parameters()}
