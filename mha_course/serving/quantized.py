"""A smaller cache by quantisation: int8 keys and values (KIVI's axes) and an 8-bit float.

Taught in ``notebooks/10_serving.ipynb`` (§6). A cached key or value in bf16 costs 2 bytes;
in 8 bits, 1 (plus a few scales). The error depends on **which axis shares a scale**. Liu et
al. (ICML 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache") found that
keys have a few *channels* with large magnitudes (the same channels in every token) while
values have no such channels: so keys are quantised **per channel** (one scale per channel,
over a group of tokens) and values **per token** (one scale per token, over its channels).
Symmetric int8: ``x ≈ scale · round(x / scale)``, ``scale = max|x| / 127`` over the shared axis.

The 8-bit float is OCP's E4M3 (``ml_dtypes.float8_e4m3fn``: 4 exponent bits, 3 mantissa
bits, largest value 448), a plain cast with scale 1: its relative error is about the same at
every magnitude (a float), where int8's absolute error is about the same (``scale / 2``).

:class:`QuantizedCache` stores a sequence's keys (rotated) and values quantised as they arrive
and hands attention the dequantised arrays. Keys per channel need several tokens to share a
scale: they are quantised ``group`` tokens at a time, and the latest tokens of an unfilled group
stay in full precision until it fills (as KIVI keeps its most recent tokens).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .._validate import fail
from ..attention import causal_mask
from ..heads import attend_heads

FP8 = ml_dtypes.float8_e4m3fn
FP8_MAX = float(ml_dtypes.finfo(FP8).max)  # 448
SCHEMES = ("int8-channel", "int8-token", "fp8", "none")


def quantize_int8(x, axis: int):
    """Symmetric int8 with one scale per slice along ``axis`` reduced: ``(q, scale)``.

    ``axis=-2`` shares a scale over the tokens (per channel); ``axis=-1`` over the channels
    (per token). ``x ≈ q * scale``.

    Examples
    --------
    >>> x = np.array([[1.0, -2.0], [0.5, 4.0]])
    >>> q, s = quantize_int8(x, axis=-1)   # per row
    >>> q.tolist(), np.round(s.ravel(), 4).tolist()
    ([[64, -127], [16, 127]], [0.0157, 0.0315])
    """
    x = np.asarray(x, dtype=np.float64)
    amax = np.abs(x).max(axis=axis, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    q = np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
    return q, scale


def quantize(x, scheme: str):
    """``x`` (..., n, d) through ``scheme`` and back: what attention reads from the cache."""
    if scheme == "none":
        return np.asarray(x)
    if scheme == "fp8":
        x = np.asarray(x)
        if np.abs(x).max(initial=0.0) > FP8_MAX:
            raise fail("quantize", f"a value of {np.abs(x).max():.4g} exceeds E4M3's largest, "
                                   f"{FP8_MAX:g}: scale it first")
        return x.astype(FP8).astype(x.dtype)
    if scheme in ("int8-channel", "int8-token"):
        q, scale = quantize_int8(x, axis=-2 if scheme == "int8-channel" else -1)
        return (q * scale).astype(np.asarray(x).dtype)
    raise fail("quantize", f"scheme={scheme!r}; expected one of {SCHEMES}")


def bytes_per_value(scheme: str, d: int, group: int, scale_bytes: int = 2) -> float:
    """Bytes per cached number, the scales included (``scale_bytes`` each, fp16).

    bf16 (``"none"``): 2. ``"int8-channel"``: 1 + one scale per channel per ``group`` tokens.
    ``"int8-token"``: 1 + one scale per token per ``d`` channels. ``"fp8"``: 1.
    """
    return {"none": 2.0, "fp8": 1.0, "int8-channel": 1.0 + scale_bytes / group,
            "int8-token": 1.0 + scale_bytes / d}[scheme]


class QuantizedCache:
    """A sequence's cache with quantised keys and values (the decoder's cache protocol).

    Parameters
    ----------
    decoder : Decoder
    keys, values : str
        Schemes of :data:`SCHEMES`: KIVI's choice is ``keys="int8-channel"``,
        ``values="int8-token"``; ``"fp8"`` for both is the 8-bit float.
    group : int
        Tokens that share a per-channel scale.

    Examples
    --------
    >>> from mha_course.serving.decoder import ContiguousCache, Decoder
    >>> dec = Decoder.random(vocab=11, d_model=16, n_layers=1, h=2, rng=0)
    >>> tokens = np.arange(10)
    >>> exact = dec.step(tokens, ContiguousCache(dec))
    >>> int8 = dec.step(tokens, QuantizedCache(dec, "int8-channel", "int8-token", group=4))
    >>> bool(0 < np.abs(int8 - exact).max() < 0.05)
    True
    """

    def __init__(self, decoder, keys: str = "int8-channel", values: str = "int8-token",
                 group: int = 32):
        for name, scheme in (("keys", keys), ("values", values)):
            if scheme not in SCHEMES:
                raise fail("QuantizedCache", f"{name}={scheme!r}; expected one of {SCHEMES}")
        self.decoder, self.key_scheme, self.value_scheme, self.group = (
            decoder, keys, values, int(group))
        n = decoder.n_layers
        self.length = 0
        self._k = [None] * n  # the exact (rotated) keys of the group still open
        self._kq = [None] * n  # what attention reads: dequantised keys and values
        self._vq = [None] * n

    def attend(self, layer: int, q, k, v):
        """q (h, T, d_k), k (g, T, d_k), v (g, T, d_v), unrotated -> heads (h, T, d_v)."""
        attn = self.decoder.blocks[layer].attn
        positions = self.length + np.arange(q.shape[-2])
        q, k = attn._rope(q, positions), attn._rope(k, positions)
        # the open group's exact keys, then the new ones: (g, n_open + T, d_k)
        K = k if self._k[layer] is None else np.concatenate([self._k[layer], k], axis=-2)
        if self.key_scheme == "int8-channel":  # close every full group of `group` tokens
            closed = K.shape[-2] // self.group * self.group
            new = [quantize(K[..., a:a + self.group, :], self.key_scheme)
                   for a in range(0, closed, self.group)]
        else:  # per token, or a cast: each token on its own, nothing stays open
            closed, new = K.shape[-2], [quantize(K, self.key_scheme)]
        old = [] if self._kq[layer] is None else [self._kq[layer]]
        self._kq[layer] = np.concatenate(old + new, axis=-2) if old + new else K[..., :0, :]
        self._k[layer] = K[..., closed:, :]  # kept exact until its group fills
        vq = quantize(v, self.value_scheme)
        self._vq[layer] = vq if self._vq[layer] is None else np.concatenate(
            [self._vq[layer], vq], axis=-2)
        keys = np.concatenate([self._kq[layer], self._k[layer]], axis=-2)  # (g, S, d_k)
        S = keys.shape[-2]
        return attend_heads(q, keys, self._vq[layer], causal_mask(q.shape[-2], S), attn.scale)[0]

    def advance(self, n: int) -> None:
        self.length += n
