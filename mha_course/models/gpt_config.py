"""The sizes of lesson 09's GPT: a frozen config, and SwiGLU's usual hidden width.

Taught in ``notebooks/09_tiny_gpt.ipynb``; the model itself is :mod:`mha_course.models.gpt`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .._validate import fail, validate_positive_int

__all__ = ["GPTConfig", "swiglu_width"]


def swiglu_width(d_model: int) -> int:
    """SwiGLU's usual hidden width: 8/3 · d_model (as many parameters as a 4·d_model GELU MLP),
    rounded up to a multiple of 8.

    Examples
    --------
    >>> swiglu_width(64), swiglu_width(96)
    (176, 256)
    """
    return 8 * math.ceil(8 * d_model / 3 / 8)


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of a :class:`GPT` (frozen: a model's shape never changes under it).

    Parameters
    ----------
    vocab_size : int
    d_model : int
    n_layers : int
    h : int
        Query heads per block; must divide ``d_model`` (``d_k = d_model / h``, even for RoPE).
    n_kv_heads : int, optional
        Key/value heads (GQA); must divide ``h``; None means ``h``.
    d_ff : int, optional
        SwiGLU's hidden width; None means :func:`swiglu_width` of ``d_model``.
    context_length : int, default 256
        Most positions a forward pass, a cache or a generation may hold.
    rope : {"half", "interleaved"}, default "half"
    rope_base : float, default 10000.0
    eps : float, default 1e-5
        RMSNorm's epsilon.

    Raises
    ------
    ValueError
        If a size is not a positive integer or the heads do not divide as required.

    Examples
    --------
    >>> config = GPTConfig(vocab_size=65, d_model=64, n_layers=2, h=4, n_kv_heads=2)
    >>> config.d_k, config.d_ff, config.n_kv_heads
    (16, 176, 2)
    """

    vocab_size: int
    d_model: int
    n_layers: int
    h: int
    n_kv_heads: int | None = None
    d_ff: int | None = None
    context_length: int = 256
    rope: str = "half"
    rope_base: float = 10000.0
    eps: float = 1e-5

    def __post_init__(self):
        func = "GPTConfig"
        for name in ("vocab_size", "d_model", "n_layers", "h", "context_length"):
            validate_positive_int(func, name, getattr(self, name))
        if self.d_model % self.h:
            raise fail(func, f"d_model={self.d_model} is not divisible by h={self.h}")
        if (self.d_model // self.h) % 2:
            raise fail(func, f"d_k = d_model / h = {self.d_model // self.h} must be even "
                             "(RoPE turns pairs of features)")
        g = self.h if self.n_kv_heads is None else validate_positive_int(
            func, "n_kv_heads", self.n_kv_heads)
        if self.h % g:
            raise fail(func, f"n_kv_heads={g} does not divide h={self.h}")
        object.__setattr__(self, "n_kv_heads", g)
        d_ff = swiglu_width(self.d_model) if self.d_ff is None else validate_positive_int(
            func, "d_ff", self.d_ff)
        object.__setattr__(self, "d_ff", d_ff)
        if self.rope not in ("half", "interleaved"):
            raise fail(func, f"rope={self.rope!r} must be 'half' or 'interleaved'")
        if not (self.rope_base > 1 and self.eps >= 0):
            raise fail(func, f"rope_base={self.rope_base!r} must be > 1 and eps={self.eps!r} "
                             ">= 0")
        object.__setattr__(self, "rope_base", float(self.rope_base))
        object.__setattr__(self, "eps", float(self.eps))

    @property
    def d_k(self) -> int:
        """Per-head width, ``d_model / h``."""
        return self.d_model // self.h

    def to_dict(self) -> dict:
        """The fields as a plain dict (JSON-ready)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d) -> GPTConfig:
        """The config a :meth:`to_dict` wrote."""
        return cls(**d)
