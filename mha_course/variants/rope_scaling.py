"""Stretching RoPE's context: the frequencies of NTK-aware scaling, YaRN and Llama 3.1's rule.

Taught in ``notebooks/05_layer_to_model.ipynb`` (§7, in brief) and its deep dive
``notebooks/deep_dives/05b_stretching_the_context.ipynb`` (§2–§4; Llama 3.1's rule is exercise
05.3).

A model trained with RoPE on ``L`` positions turns feature pair ``j`` by ``p · θ_j`` with
``θ_j = base**(-2j/d)`` (:func:`~mha_course.positions.rope_angles`). Run at ``s·L`` positions,
the slow pairs (wavelength ``λ_j = 2π/θ_j`` longer than ``L``) reach angles training never
produced. Each method here returns new per-pair frequencies ``θ'_j`` (shape ``(d/2,)``) that a
model then uses in place of ``θ_j``:

- position interpolation (Chen et al. 2023) divides every position by ``s``, i.e. every
  frequency: ``θ_j / s`` (nothing to compute here: ``rope_angles(positions / s, ...)``);
- :func:`ntk_base`: NTK-aware scaling (bloc97, 2023) keeps the formula and raises the base to
  ``base · s**(d/(d-2))``, so the fastest pair is unchanged and the slowest turns ``s`` times
  slower;
- :func:`yarn_frequencies`: YaRN's "NTK-by-parts" interpolation (Peng et al. 2023, §3.2)
  blends *no* interpolation (``θ_j``) with position interpolation (``θ_j / s``) pair by pair,
  by how many turns a pair makes within ``L``, ``r_j = L / λ_j``:
  ``θ'_j = (1 - γ(r_j)) · θ_j / s + γ(r_j) · θ_j`` with the ramp ``γ(r) = 0`` for ``r < α``,
  ``1`` for ``r > β`` and ``(r - α) / (β - α)`` between (α = 1, β = 32 for Llama models). It is
  a blend of "leave alone" and PI, not of PI and NTK-aware scaling.
  :func:`yarn_attention_factor` is its second part (§3.4): the logits are divided by a
  temperature ``t`` with ``sqrt(1/t) = 0.1 · ln(s) + 1`` (the reference code multiplies the
  cosines and sines by this factor, so ``q · k`` grows by its square);
- :func:`mla_softmax_scale`: where DeepSeek-V2/V3 put that factor. Their RoPE covers only the
  ``d_rope`` part of each query and key, so scaling the rotation would miss the ``d_k`` part;
  instead the softmax scale ``1/√(d_k + d_rope)`` is multiplied by ``mscale²``, with
  ``mscale = 0.1 · mscale_all_dim · ln(s) + 1`` from the config's ``rope_scaling``
  (:func:`yarn_attention_factor` with its ``mscale`` argument; Hugging Face
  ``DeepseekV3Attention.__init__``, DeepSeek-V3's ``inference/model.py`` ``MLA.__init__``);
- :func:`llama3_frequencies`: Llama 3.1's ``rope_scaling`` (``"rope_type": "llama3"``: factor 8,
  low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192), written as
  Meta's ``apply_scaling``: pairs whose wavelength is shorter than ``L / high_freq_factor`` are
  left alone, pairs longer than ``L / low_freq_factor`` are divided by the factor, and between
  them ``smooth = (L / λ - low_freq_factor) / (high_freq_factor - low_freq_factor)`` blends the
  two. That is YaRN's ramp with α = low_freq_factor and β = high_freq_factor, and no
  temperature.

The formula of :func:`yarn_frequencies` is the paper's, continuous in ``r``. The authors' code
(jquesnelle/yarn, and Hugging Face's ``"yarn"`` rope type) puts the same ramp linearly in the
pair index between the pairs where ``r = β`` and ``r = α``, rounded outward to whole pairs, so
the pairs inside the ramp get slightly different blends; the pairs it leaves alone and the pairs
it interpolates fully are the same.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import fail, validate_positive_int

__all__ = [
    "llama3_frequencies",
    "mla_softmax_scale",
    "ntk_base",
    "rope_frequencies",
    "yarn_attention_factor",
    "yarn_frequencies",
    "yarn_ramp",
]


def _number(func: str, name: str, value, *, above: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise fail(func, f"{name}={value!r} must be a number > {above:g}")
    if not value > above or not math.isfinite(value):
        raise fail(func, f"{name}={value!r} must be a number > {above:g}")
    return float(value)


def _even_width(func: str, d) -> int:
    d = validate_positive_int(func, "d", d)
    if d % 2:
        raise fail(func, f"d={d} must be even: RoPE turns pairs of features")
    return d


def rope_frequencies(d: int, base: float = 10000.0) -> np.ndarray:
    """RoPE's radians per position for each feature pair: ``θ_j = base**(-2j/d)``.

    Parameters
    ----------
    d : int
        The rotated (even) width; there are ``d / 2`` pairs.
    base : float, default 10000.0

    Returns
    -------
    ndarray of float64, shape (d/2,)
        From 1 (pair 0) down to ``base**(-(d-2)/d)``.

    Raises
    ------
    ValueError
        If ``d`` is not a positive even integer or ``base`` is not a number > 1.

    Examples
    --------
    >>> rope_frequencies(4, base=100.0).tolist()
    [1.0, 0.1]
    """
    func = "rope_frequencies"
    d = _even_width(func, d)
    base = _number(func, "base", base, above=1.0)
    return base ** (-2.0 * np.arange(d // 2) / d)


def ntk_base(base: float, factor: float, d: int) -> float:
    """NTK-aware scaling's new base for ``factor`` times the context: ``base · s**(d/(d-2))``.

    Examples
    --------
    >>> round(ntk_base(10000.0, 4.0, 64))
    41829
    """
    func = "ntk_base"
    d = _even_width(func, d)
    if d < 4:
        raise fail(func, f"d={d} must be at least 4 (the exponent is d/(d-2))")
    base = _number(func, "base", base, above=1.0)
    factor = _number(func, "factor", factor, above=0.0)
    return base * factor ** (d / (d - 2))


def yarn_ramp(r, alpha: float = 1.0, beta: float = 32.0) -> np.ndarray:
    """YaRN's ramp ``γ(r)``: 0 below ``alpha`` turns, 1 above ``beta``, linear between.

    Parameters
    ----------
    r : array_like of float
        Turns a pair makes within the trained length, ``L / λ``.
    alpha, beta : float
        The two thresholds, ``0 < alpha < beta`` (YaRN: 1 and 32 for Llama).

    Returns
    -------
    ndarray of float64, the shape of ``r``

    Examples
    --------
    >>> yarn_ramp([0.5, 1.0, 16.5, 32.0, 64.0]).tolist()
    [0.0, 0.0, 0.5, 1.0, 1.0]
    """
    func = "yarn_ramp"
    alpha = _number(func, "alpha", alpha, above=0.0)
    beta = _number(func, "beta", beta, above=alpha)
    return np.clip((np.asarray(r, dtype=float) - alpha) / (beta - alpha), 0.0, 1.0)


def yarn_frequencies(d: int, factor: float, original_max_position: int, base: float = 10000.0,
                     alpha: float = 1.0, beta: float = 32.0) -> np.ndarray:
    """YaRN's per-pair frequencies ("NTK-by-parts", Peng et al. 2023, §3.2).

    ``θ'_j = (1 - γ(r_j)) · θ_j / s + γ(r_j) · θ_j`` with ``r_j = L / λ_j`` the turns pair ``j``
    makes within the trained length ``L`` and ``γ`` :func:`yarn_ramp`: a pair that turns more
    than ``beta`` times keeps its frequency, a pair that turns less than ``alpha`` times is
    interpolated as position interpolation does (``θ_j / s``), and the ones between are blended.

    Parameters
    ----------
    d : int
        Rotated (even) width.
    factor : float
        ``s``, the new context over the trained one (> 0; 1 changes nothing).
    original_max_position : int
        ``L``, the trained context.
    base : float, default 10000.0
    alpha, beta : float, default 1 and 32

    Returns
    -------
    ndarray of float64, shape (d/2,)

    Raises
    ------
    ValueError
        If a size is not a positive integer (``d`` even) or a number is out of range.

    Examples
    --------
    >>> theta = rope_frequencies(64)
    >>> yarn = yarn_frequencies(64, 4.0, 2048)
    >>> bool(yarn[0] == theta[0]), bool(np.isclose(yarn[-1], theta[-1] / 4))
    (True, True)
    """
    func = "yarn_frequencies"
    theta = rope_frequencies(d, base)
    factor = _number(func, "factor", factor, above=0.0)
    L = validate_positive_int(func, "original_max_position", original_max_position)
    turns = L * theta / (2 * np.pi)  # r_j = L / λ_j
    gamma = yarn_ramp(turns, alpha, beta)
    return (1.0 - gamma) * theta / factor + gamma * theta


def yarn_attention_factor(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor ``sqrt(1/t) = 0.1 · mscale · ln(s) + 1`` (1 when ``s <= 1``), §3.4.

    The logits ``q · k / sqrt(d)`` are divided by the temperature ``t``, i.e. multiplied by the
    square of this factor (the reference code scales both the query's and the key's rotation by
    it). ``mscale`` is the coefficient DeepSeek's configs add (``rope_scaling["mscale"]`` and
    ``["mscale_all_dim"]``: 0.707 in DeepSeek-V2, 1.0 in V3); the paper's formula is
    ``mscale = 1``. The same function as Hugging Face's ``yarn_get_mscale(scale, mscale)``.

    Parameters
    ----------
    factor : float
        ``s``, the new context over the trained one (> 0).
    mscale : float, default 1.0
        >= 0.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``factor`` is not a number > 0 or ``mscale`` is negative.

    Examples
    --------
    >>> round(yarn_attention_factor(4.0), 4), yarn_attention_factor(1.0)
    (1.1386, 1.0)
    >>> round(yarn_attention_factor(40.0, mscale=0.707), 4)
    1.2608
    """
    func = "yarn_attention_factor"
    factor = _number(func, "factor", factor, above=0.0)
    if isinstance(mscale, (bool, np.bool_)) or not isinstance(
            mscale, (int, float, np.integer, np.floating)) or not 0 <= mscale < math.inf:
        raise fail(func, f"mscale={mscale!r} must be a finite number >= 0")
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def mla_softmax_scale(qk_head_dim: int, rope_scaling: dict | None = None) -> float:
    """DeepSeek's softmax scale: ``qk_head_dim**-0.5``, times ``mscale²`` under YaRN.

    ``qk_head_dim`` is the width of each head's dot product, ``d_k + d_rope``
    (``qk_nope_head_dim + qk_rope_head_dim``: 192 in DeepSeek-V2 and V3). When the config's
    ``rope_scaling`` has a non-zero ``mscale_all_dim``, the scale is multiplied by
    ``m²`` with ``m = yarn_attention_factor(factor, mscale_all_dim)``, exactly as Hugging Face's
    ``DeepseekV3Attention.__init__`` does::

        self.scaling = self.qk_head_dim ** (-0.5)
        if self.config.rope_scaling is not None:
            mscale_all_dim = self.config.rope_scaling.get("mscale_all_dim", 0)
            ...
            if mscale_all_dim:
                mscale = yarn_get_mscale(scaling_factor, mscale_all_dim)
                self.scaling = self.scaling * mscale * mscale

    Parameters
    ----------
    qk_head_dim : int
    rope_scaling : dict, optional
        The config's ``rope_scaling`` (``"factor"`` and, for the YaRN temperature,
        ``"mscale_all_dim"``); None: no scaling.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        If ``qk_head_dim`` is not a positive integer, ``rope_scaling`` is not a dict with a
        ``"factor"`` > 0, or its ``"mscale_all_dim"`` is negative.

    Examples
    --------
    >>> v3 = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0}
    >>> round(mla_softmax_scale(192) ** -2, 1), round(mla_softmax_scale(192, v3) * 192 ** 0.5, 4)
    (192.0, 1.8739)
    """
    func = "mla_softmax_scale"
    d = validate_positive_int(func, "qk_head_dim", qk_head_dim)
    scale = d ** -0.5
    if rope_scaling is None:
        return scale
    if not isinstance(rope_scaling, dict) or "factor" not in rope_scaling:
        raise fail(func, f"rope_scaling={rope_scaling!r}; expected None or a config's "
                         "rope_scaling dict with a 'factor' (and 'mscale_all_dim' for YaRN's "
                         "temperature)")
    factor = _number(func, "rope_scaling['factor']", rope_scaling["factor"], above=0.0)
    mscale_all_dim = rope_scaling.get("mscale_all_dim", 0) or 0
    if mscale_all_dim:
        m = yarn_attention_factor(factor, _number(func, "rope_scaling['mscale_all_dim']",
                                                  mscale_all_dim, above=0.0))
        scale = scale * m * m
    return scale


def llama3_frequencies(d: int, base: float = 500000.0, factor: float = 8.0,
                       low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                       original_max_position: int = 8192) -> np.ndarray:
    """Llama 3.1's ``rope_scaling`` (``rope_type="llama3"``): per-pair frequencies.

    With ``λ_j = 2π / θ_j`` and ``L = original_max_position``: ``θ_j`` where ``λ_j < L /
    high_freq_factor``; ``θ_j / factor`` where ``λ_j > L / low_freq_factor``; between them
    ``(1 - smooth) · θ_j / factor + smooth · θ_j`` with ``smooth = (L / λ_j - low_freq_factor) /
    (high_freq_factor - low_freq_factor)`` (Meta's ``apply_scaling``; Hugging Face's
    ``_compute_llama3_parameters``). The defaults are Llama 3.1's config.

    Parameters
    ----------
    d : int
        Rotated (even) width: 128 for Llama 3.1.
    base : float, default 500000.0
    factor : float, default 8.0
    low_freq_factor, high_freq_factor : float, default 1.0 and 4.0
        ``0 < low_freq_factor < high_freq_factor``.
    original_max_position : int, default 8192

    Returns
    -------
    ndarray of float64, shape (d/2,)

    Raises
    ------
    ValueError
        If a size is not a positive integer (``d`` even) or a number is out of range.

    Examples
    --------
    >>> theta, new = rope_frequencies(128, 500000.0), llama3_frequencies(128)
    >>> int((new == theta).sum()), int(np.isclose(new, theta / 8).sum())
    (29, 29)
    """
    func = "llama3_frequencies"
    theta = rope_frequencies(d, base)
    factor = _number(func, "factor", factor, above=0.0)
    low = _number(func, "low_freq_factor", low_freq_factor, above=0.0)
    high = _number(func, "high_freq_factor", high_freq_factor, above=low)
    L = validate_positive_int(func, "original_max_position", original_max_position)
    wavelength = 2 * np.pi / theta
    smooth = (L / wavelength - low) / (high - low)
    blended = (1.0 - smooth) * theta / factor + smooth * theta
    return np.where(wavelength < L / high, theta,
                    np.where(wavelength > L / low, theta / factor, blended))
