"""Lesson 09's GPT with the attention block of 2025: QK-norm, soft-capping, learned sinks and an
output gate, each switchable, with its backward pass by hand.

Taught in ``notebooks/13_attention_2025.ipynb``.

:class:`VariantGPT` is a :class:`~mha_course.models.gpt.GPT` (the same embeddings, RMSNorm,
SwiGLU, RoPE, GQA, head and parameters) whose attention adds what a :class:`BlockVariant`
switches on, in the order real models apply them::

    q, k = split(a W_q), split(a W_k)              # a = rms_norm(x): the block's input
    q, k = qk_norm(q, q_norm), qk_norm(k, k_norm)  # qk_norm: per head, over d_k (Qwen3, Gemma 3),
    q, k = rope(q), rope(k)                        #   with the config's eps, as Qwen3's q_norm
    s = q kᵀ · scale                               # the logits that grow; scale: 1/√d_k, or
                                                   #   Gemma 2's query_pre_attn_scalar**-0.5
    z = c · tanh(s / c)                            # softcap: Gemma 2's c = 50
    p = softmax([z | mask, sink_i])[:, :-1]        # sinks: gpt-oss, one logit per head
    o = p v
    o = o ⊙ σ(a W_gate_attn)                       # gate: Qiu et al. 2025 (headwise or
    x = x + merge(o) W_o                           #   elementwise), as in Qwen3-Next

With every switch off it is lesson 09's model exactly (``loss_and_grads`` equal to
``GPT.loss_and_grads``, tested). New parameters per block ``i``: ``L{i}.q_norm`` and
``L{i}.k_norm`` (d_k,), ``L{i}.sinks`` (h,), ``L{i}.W_gate_attn`` (d_model, h) for a headwise gate
or (d_model, h·d_k) for an elementwise one. The gradients are tested against PyTorch autograd
(``tests/test_gpt_variants.py``).

``forward(..., stats=True)`` also returns, per block, the largest raw logit ``s``, the largest
logit after the cap and the mean entropy of every head: what lesson 13 §1 plots over training.
The model has no KV-cache path: ``generate`` reruns the prefix (``use_cache=False``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .._validate import fail
from ..attention import causal_mask, sdpa_unchecked
from ..block import sigmoid
from ..heads import merge_heads, split_heads
from ..positions import apply_rope
from ..variants.entropy import attention_entropy
from ..variants.logit_control import qk_norm, qk_norm_backward, soft_cap, soft_cap_backward
from ..variants.sinks import softmax_with_sink_backward
from .gpt import GPT, GPTConfig
from .tiny_model import cross_entropy

__all__ = ["BlockVariant", "VariantGPT"]


@dataclass(frozen=True)
class BlockVariant:
    """Which of the 2025 changes an attention block makes.

    Parameters
    ----------
    qk_norm : bool
        RMSNorm on each head's queries and keys, with learned gains, before RoPE.
    softcap : float, optional
        ``c`` of ``c · tanh(s / c)`` on the scaled logits, before the mask.
    scale : float, optional
        What multiplies ``q kᵀ``; default (None) ``1/√d_k``. Gemma 2, the soft-capping model,
        uses ``query_pre_attn_scalar**-0.5`` (27B: ``144**-0.5`` with ``d_k = 128``; Hugging Face
        ``Gemma2Attention``: ``self.scaling = config.query_pre_attn_scalar**-0.5``).
    sinks : bool
        One learned sink logit per head in the softmax's denominator.
    gate : {None, "headwise", "elementwise"}
        A sigmoid gate on each head's output, computed from the block's normalised input.

    Examples
    --------
    >>> BlockVariant(qk_norm=True).name
    'qk_norm'
    >>> BlockVariant(softcap=50.0, sinks=True).name
    'softcap50+sinks'
    >>> BlockVariant(softcap=50.0, scale=0.25).name
    'softcap50+scale0.25'
    """

    qk_norm: bool = False
    softcap: float | None = None
    sinks: bool = False
    gate: str | None = None
    scale: float | None = None

    def __post_init__(self):
        func = "BlockVariant"
        if self.softcap is not None and not (isinstance(self.softcap, (int, float))
                                             and math.isfinite(self.softcap)
                                             and self.softcap > 0):
            raise fail(func, f"softcap={self.softcap!r} must be None or a positive number")
        if self.gate not in (None, "headwise", "elementwise"):
            raise fail(func, f"gate={self.gate!r} must be None, 'headwise' or 'elementwise'")
        if self.scale is not None and not (isinstance(self.scale, (int, float))
                                           and not isinstance(self.scale, bool)
                                           and math.isfinite(self.scale) and self.scale > 0):
            raise fail(func, f"scale={self.scale!r} must be None (1/sqrt(d_k)) or a positive "
                             "number")

    @property
    def name(self) -> str:
        """A short label: ``baseline`` or the switches joined by ``+``."""
        parts = (["qk_norm"] if self.qk_norm else []) + (
            [f"softcap{self.softcap:g}"] if self.softcap is not None else []) + (
            ["sinks"] if self.sinks else []) + ([f"gate_{self.gate}"] if self.gate else []) + (
            [f"scale{self.scale:g}"] if self.scale is not None else [])
        return "+".join(parts) or "baseline"


class VariantGPT(GPT):
    """Lesson 09's GPT whose attention blocks make the changes of ``variant``.

    Parameters
    ----------
    config : GPTConfig
    variant : BlockVariant, optional
        Default: no change (lesson 09's model).
    rng : int or numpy.random.Generator, optional
        Seeds lesson 09's parameters first (the same draws as ``GPT(config, rng)``), then the
        new ones: norms' gains 1, sinks 0, the gate's weights normal with standard deviation
        0.02 (every gate starts near σ(0) = 0.5).
    dtype : numpy dtype, default float64

    Examples
    --------
    >>> c = GPTConfig(vocab_size=11, d_model=16, n_layers=2, h=4, n_kv_heads=2)
    >>> m = VariantGPT(c, BlockVariant(qk_norm=True, sinks=True, gate="headwise"), rng=0)
    >>> m.forward(np.zeros((3, 5), dtype=int)).shape, m.n_params - GPT(c, rng=0).n_params
    ((3, 5, 11), 152)
    """

    def __init__(self, config: GPTConfig, variant: BlockVariant | None = None, rng=None,
                 dtype=np.float64):
        rng = np.random.default_rng(rng)
        super().__init__(config, rng=rng, dtype=dtype)
        self.variant = BlockVariant() if variant is None else variant
        if not isinstance(self.variant, BlockVariant):
            raise fail("VariantGPT", f"variant is a {type(variant).__name__}; expected a "
                                     "BlockVariant")
        c, v, self.extra = config, self.variant, []
        for _ in range(c.n_layers):
            extra = {}
            if v.qk_norm:
                extra["q_norm"] = np.ones(c.d_k, dtype=self.dtype)
                extra["k_norm"] = np.ones(c.d_k, dtype=self.dtype)
            if v.sinks:
                extra["sinks"] = np.zeros(c.h, dtype=self.dtype)
            if v.gate:
                width = c.h if v.gate == "headwise" else c.h * c.d_k
                extra["W_gate_attn"] = (0.02 * rng.normal(size=(c.d_model, width))
                                        ).astype(self.dtype)
            self.extra.append(extra)

    # ---------------------------------------------------------------------------- parameters
    def parameters(self) -> dict[str, np.ndarray]:
        """Lesson 09's parameters, then each block's new ones (see the module docstring)."""
        params = super().parameters()
        for i, extra in enumerate(self.extra):
            params.update((f"L{i}.{name}", p) for name, p in extra.items())
        return params

    @classmethod
    def from_parameters(cls, config: GPTConfig, params, dtype=None,
                        variant: BlockVariant | None = None) -> VariantGPT:
        """A model of ``config`` and ``variant`` holding copies of ``params``."""
        dtype = np.asarray(params["W_E"]).dtype if dtype is None else dtype
        model = cls(config, variant, rng=0, dtype=dtype)
        model.load_parameters(params)
        return model

    def astype(self, dtype) -> VariantGPT:
        """A copy of the model in ``dtype``."""
        return VariantGPT.from_parameters(self.config, self.parameters(), dtype, self.variant)

    def save(self, path, **metadata) -> None:
        """As ``GPT.save``, with the variant stored beside the config."""
        super().save(path, variant=asdict(self.variant), **metadata)

    @classmethod
    def load(cls, path, dtype=None) -> VariantGPT:
        """The model :meth:`save` wrote."""
        with np.load(Path(path)) as data:
            config = GPTConfig.from_dict(json.loads(str(data["config"])))
            variant = BlockVariant(**json.loads(str(data["meta/variant"])))
            params = {key[len("param/"):]: data[key] for key in data.files
                      if key.startswith("param/")}
        return cls.from_parameters(config, params, dtype, variant)

    @property
    def scale(self) -> float:
        """What multiplies ``q kᵀ``: the variant's ``scale``, or ``1/√d_k``."""
        v = self.variant.scale
        return 1.0 / math.sqrt(self.config.d_k) if v is None else float(v)

    # ------------------------------------------------------------------------ forward pass
    def _attention(self, i: int, a: np.ndarray, mask: np.ndarray, head_mask, keep: bool):
        """Block ``i``'s attention on its normalised input ``a`` (B, T, d_model): the hook of
        ``GPT._run``. Returns ``(out, saved, (s, p, p_sink))``; ``head_mask`` (h,) scales
        each head's (gated) output before ``W_o``."""
        c, v, attn, extra = self.config, self.variant, self.blocks[i].attn, self.extra[i]
        T = a.shape[-2]
        r = c.h // c.n_kv_heads
        positions = np.arange(T)
        q0 = split_heads(a @ attn.W_q, c.h)  # (B, T, h·d_k) -> (B, h, T, d_k)
        k0 = split_heads(a @ attn.W_k, c.n_kv_heads)  # (B, g, T, d_k)
        v_g = split_heads(a @ attn.W_v, c.n_kv_heads)  # (B, g, T, d_k)
        q1 = qk_norm(q0, extra["q_norm"], c.eps) if v.qk_norm else q0  # the config's eps
        k1 = qk_norm(k0, extra["k_norm"], c.eps) if v.qk_norm else k0
        q = apply_rope(q1, positions, base=c.rope_base, layout=c.rope)
        k = np.repeat(apply_rope(k1, positions, base=c.rope_base, layout=c.rope), r, axis=-3)
        vv = np.repeat(v_g, r, axis=-3)  # (B, h, T, d_k): query head j reads K/V head j // r
        kept = {}

        def logits(s, q_idx, kv_idx):
            """The score_mod: keeps the raw logits s = q kᵀ · scale (B, h, T, T), which the
            stats and the backward read, and soft-caps them (Gemma 2) when the variant does."""
            if v.softcap is None:
                kept["s"] = s.copy()  # the kernel softmaxes its own buffer in place
                return s
            kept["s"] = s
            return soft_cap(s, v.softcap)  # z = c · tanh(s / c), a new array

        # Lesson 03's attention (its kernel: the model made these arrays) with the score hook
        # and, for gpt-oss's sinks, one sink logit per head in the softmax: (h,) -> (h, 1, 1).
        sink = extra["sinks"][:, None, None] if v.sinks else None
        attended = sdpa_unchecked(q, k, vv, mask, self.scale, score_mod=logits, sink=sink)
        o, p, p_sink = attended if v.sinks else (*attended, None)  # (B, h, T, d_k), (B, h, T, T)
        s = kept["s"]
        gate = None
        if v.gate:
            g_lin = a @ extra["W_gate_attn"]  # (B, T, h) or (B, T, h·d_k)
            gate = sigmoid(g_lin)
            g_heads = (np.swapaxes(gate, -1, -2)[..., None] if v.gate == "headwise"
                       else split_heads(gate, c.h))  # (B, h, T, 1) or (B, h, T, d_k)
            o_out = o * g_heads
        else:
            o_out = o
        if head_mask is not None:
            o_out = o_out * head_mask[:, None, None]
        concat = merge_heads(o_out)  # (B, T, h·d_k)
        out = concat @ attn.W_o
        saved = None
        if keep:
            saved = {"a": a, "q0": q0, "k0": k0, "q1": q1, "k1": k1, "q": q, "k": k, "vv": vv,
                     "s": s, "p": p, "p_sink": p_sink, "o": o, "gate": gate, "concat": concat}
        return out, saved, (s, p, p_sink)

    def _head_stats(self, s, p, p_sink, mask) -> dict[str, np.ndarray]:
        lead = tuple(range(s.ndim - 3)) + (s.ndim - 2, s.ndim - 1)  # every axis but the head's
        z = soft_cap(s, self.variant.softcap) if self.variant.softcap is not None else s
        raw = np.where(mask, s, -np.inf).max(axis=lead)
        capped = np.where(mask, z, -np.inf).max(axis=lead)
        rows = attention_entropy(p)  # (..., h, T); the sink's share is one more outcome:
        rows = rows if p_sink is None else rows + attention_entropy(p_sink[..., None])
        entropy = rows.mean(axis=tuple(range(rows.ndim - 2)) + (rows.ndim - 1,))
        sink_mass = (np.zeros_like(entropy) if p_sink is None
                     else p_sink.mean(axis=tuple(range(p_sink.ndim - 2)) + (p_sink.ndim - 1,)))
        return {"max_logit": raw, "max_capped_logit": capped, "entropy": entropy,
                "sink_mass": sink_mass}

    def forward(self, tokens, *, head_mask=None, return_cache=False, stats=False):
        """Logits for the next token at every position.

        Parameters
        ----------
        tokens : ndarray of int, shape (..., T)
        head_mask : array_like, shape (n_layers, h), optional
            Multiplies each head's (gated) output before ``W_o``; evaluation only.
        return_cache : bool
            Also return what :meth:`backward` needs.
        stats : bool
            Also return one dict per block: ``max_logit`` (h,) the largest raw logit
            ``q·k·scale``, ``max_capped_logit`` (h,) after the cap, ``entropy`` (h,) the mean
            entropy of the heads' rows (the sink's share counted as one more outcome),
            ``sink_mass`` (h,) the mean weight on the sink.

        Returns
        -------
        logits : ndarray, shape (..., T, V)
        cache : dict, with ``return_cache=True``
        stats : list of dict, with ``stats=True`` (last)
        """
        logits, cache, infos = self._run("VariantGPT.forward", tokens, head_mask, return_cache)
        result = (logits,)
        if return_cache:
            result += (cache,)
        if stats:
            mask = causal_mask(logits.shape[-2])
            result += ([self._head_stats(*info, mask) for info in infos],)
        return result[0] if len(result) == 1 else result

    __call__ = forward

    # ------------------------------------------------------------------------ backward pass
    def _attention_backward(self, i: int, dout: np.ndarray, sv: dict, grads: dict):
        """Gradients of block ``i``'s attention; returns dL/da."""
        c, v, attn, extra = self.config, self.variant, self.blocks[i].attn, self.extra[i]
        d_model, r = c.d_model, c.h // c.n_kv_heads
        a = sv["a"]
        flat_a = a.reshape(-1, d_model)
        grads[f"L{i}.W_o"] = sv["concat"].reshape(-1, c.h * c.d_k).T @ dout.reshape(-1, d_model)
        do_out = split_heads(dout @ attn.W_o.T, c.h)  # (B, h, T, d_k)
        da = np.zeros_like(a)
        if v.gate:
            gate = sv["gate"]
            if v.gate == "headwise":
                g_heads = np.swapaxes(gate, -1, -2)[..., None]  # (B, h, T, 1)
                dg = np.swapaxes((do_out * sv["o"]).sum(axis=-1), -1, -2)  # (B, T, h)
            else:
                g_heads = split_heads(gate, c.h)
                dg = merge_heads(do_out * sv["o"])  # (B, T, h·d_k)
            do = do_out * g_heads
            dg_lin = dg * gate * (1.0 - gate)
            grads[f"L{i}.W_gate_attn"] = flat_a.T @ dg_lin.reshape(flat_a.shape[0], -1)
            da += dg_lin @ extra["W_gate_attn"].T
        else:
            do = do_out
        p, vv = sv["p"], sv["vv"]
        dp = do @ np.swapaxes(vv, -1, -2)  # (B, h, T, T)
        dvv = np.swapaxes(p, -1, -2) @ do  # (B, h, T, d_k)
        if v.sinks:
            dz, grads[f"L{i}.sinks"] = softmax_with_sink_backward(dp, p, sv["p_sink"])
        else:
            dz = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
        ds = soft_cap_backward(dz, sv["s"], v.softcap) if v.softcap is not None else dz
        ds = ds * self.scale
        dq = ds @ sv["k"]  # (B, h, T, d_k)
        dk = np.swapaxes(ds, -1, -2) @ sv["q"]  # (B, h, T, d_k)
        T = a.shape[-2]
        back = -np.arange(T)  # RoPE is a rotation: its transpose turns by minus the angle
        dq1 = apply_rope(dq, back, base=c.rope_base, layout=c.rope)
        group = dk.shape[:-3] + (c.n_kv_heads, r) + dk.shape[-2:]
        dk1 = apply_rope(dk.reshape(group).sum(axis=-3), back, base=c.rope_base, layout=c.rope)
        dv_g = dvv.reshape(group).sum(axis=-3)  # (B, g, T, d_k): summed over each group
        if v.qk_norm:
            dq0, grads[f"L{i}.q_norm"] = qk_norm_backward(dq1, sv["q0"], extra["q_norm"], c.eps)
            dk0, grads[f"L{i}.k_norm"] = qk_norm_backward(dk1, sv["k0"], extra["k_norm"], c.eps)
        else:
            dq0, dk0 = dq1, dk1
        for name, d_heads, W in (("W_q", dq0, attn.W_q), ("W_k", dk0, attn.W_k),
                                 ("W_v", dv_g, attn.W_v)):
            d_flat = merge_heads(d_heads)  # (B, T, heads·d_k)
            grads[f"L{i}.{name}"] = flat_a.T @ d_flat.reshape(flat_a.shape[0], -1)
            da += d_flat @ W.T
        return da

    def loss_and_grads(self, tokens, targets, *, stats=False):
        """Mean cross-entropy over every position and every parameter's gradient (and, with
        ``stats``, the per-block statistics of :meth:`forward`)."""
        out = self.forward(tokens, return_cache=True, stats=stats)
        logits, cache = out[0], out[1]
        targets = np.asarray(targets)
        if targets.shape != logits.shape[:-1]:
            raise fail("VariantGPT.loss_and_grads", f"targets has shape {targets.shape}; "
                                                    f"expected {logits.shape[:-1]}")
        flat = logits.reshape(-1, 1, logits.shape[-1])
        loss, dflat = cross_entropy(flat, targets.reshape(-1, 1), np.ones((flat.shape[0], 1)))
        grads = self.backward(dflat.reshape(logits.shape), cache)
        return (loss, grads, out[2]) if stats else (loss, grads)

    def attention_weights(self, tokens) -> list[np.ndarray]:
        """Every block's weights on the real keys (..., h, T, T); with sinks, rows sum to
        less than 1."""
        _, cache = self.forward(tokens, return_cache=True)
        return [s["att"]["p"] for s in cache["blocks"]]

    def sink_weights(self, tokens) -> list[np.ndarray]:
        """Every block's weight on its learned sink (..., h, T); zeros without sinks."""
        _, cache = self.forward(tokens, return_cache=True)
        return [s["att"]["p_sink"] if s["att"]["p_sink"] is not None
                else np.zeros(s["att"]["p"].shape[:-1]) for s in cache["blocks"]]

    # ---------------------------------------------------------------- no cached inference
    def init_cache(self, batch_shape=(), max_len=None):
        """Not available: the variants' attention has no cached path here."""
        raise fail("VariantGPT.init_cache", "the variant blocks have no KV-cache path; "
                                            "generate(..., use_cache=False) reruns the prefix")

    def step(self, tokens, caches):
        """Not available (see :meth:`init_cache`)."""
        raise fail("VariantGPT.step", "the variant blocks have no KV-cache path; "
                                      "generate(..., use_cache=False) reruns the prefix")

    def generate(self, prompt, n_new: int, temperature: float = 1.0, top_k=None, top_p=None,
                 rng=None, use_cache: bool = False):
        """As ``GPT.generate``, rerunning the whole prefix at every step."""
        if use_cache:
            self.init_cache()  # raises
        return super().generate(prompt, n_new, temperature, top_k, top_p, rng, use_cache=False)

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", variant={self.variant.name})"

