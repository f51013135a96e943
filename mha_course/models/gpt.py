"""A tiny decoder-only GPT built from the package's own layer: forward, backward, cache, sampling.

Taught in ``notebooks/09_tiny_gpt.ipynb``.

The model (Llama's block, at toy size)::

    x = W_E[tokens]                                        # (B, T) -> (B, T, d_model)
    for each of n_layers blocks (pre-norm):
        x = x + attention(rms_norm(x, attn_norm))          # causal, RoPE, GQA
        x = x + swiglu(rms_norm(x, mlp_norm), W_gate, W_up, W_down)
    logits = rms_norm(x, norm_f) @ W_U                     # (B, T, d_model) -> (B, T, V)

``attention`` is a :class:`~mha_course.MultiHeadAttention` per block (``rope=config.rope``,
``n_kv_heads=config.n_kv_heads``, no biases) run with :func:`~mha_course.causal_mask`; RMSNorm
and SwiGLU are :mod:`mha_course.block`'s, with their backward passes. Positions come only from
RoPE, so there is no position table and the model runs at any length up to
``config.context_length`` (a copy with a longer ``context_length`` runs the same weights
further, at positions it never trained on).

Public API (what lessons 09 to 12 rely on)
------------------------------------------

``GPTConfig(vocab_size, d_model, n_layers, h, n_kv_heads=None, d_ff=None, context_length=256,
rope="half", rope_base=10000.0, eps=1e-5)``
    Frozen; ``d_ff=None`` gives SwiGLU's usual width, 8/3 · d_model rounded up to a multiple
    of 8. ``config.to_dict()`` / ``GPTConfig.from_dict(d)``.
``GPT(config, rng=None, dtype=np.float64)``
    ``.config``, ``.blocks`` (one :class:`~mha_course.block.PreNormBlock` per block: its
    ``.attn``, a :class:`~mha_course.MultiHeadAttention`, ``.attn_norm``, ``.mlp_norm``,
    ``.W_gate``, ``.W_up``, ``.W_down``),
    ``.dtype``, ``.n_params``.
``model.parameters() -> dict``
    Every parameter by name, the arrays themselves (an optimiser updates them in place):
    ``W_E`` (V, d_model); per block ``i``: ``L{i}.attn_norm`` (d_model,), ``L{i}.W_q``
    (d_model, h·d_k), ``L{i}.W_k``, ``L{i}.W_v`` (d_model, g·d_k), ``L{i}.W_o`` (h·d_k,
    d_model), ``L{i}.mlp_norm``, ``L{i}.W_gate``, ``L{i}.W_up`` (d_model, d_ff), ``L{i}.W_down``
    (d_ff, d_model); ``norm_f`` (d_model,); ``W_U`` (d_model, V). ``GPT.from_parameters(config,
    params)`` builds a model from such a dict (e.g. sharded and gathered, or edited);
    ``model.load_parameters(params)`` copies one in.
``model.forward(tokens, *, head_mask=None, return_cache=False)``
    ``tokens`` (..., T) ints -> logits (..., T, V). ``head_mask`` (n_layers, h) scales each
    head's output before ``W_o`` (0 ablates it; evaluation only). ``return_cache=True`` returns
    ``(logits, cache)`` for :meth:`GPT.backward`.
``model.backward(dlogits, cache) -> dict``
    Every parameter's gradient, named as :meth:`GPT.parameters`.
``model.loss_and_grads(tokens, targets) -> (loss, grads)``; ``model.loss(tokens, targets)``
    Mean cross-entropy over every position, in nats per token.
``model.attention_weights(tokens) -> list``
    One (..., h, T, T) array per block.
``model.init_cache(batch_shape=(), max_len=None) -> list[KVCache]``
    One cache per block. ``model.step(tokens_chunk, caches)`` -> logits (..., T, V) for a chunk
    of any length ``T >= 1`` (a prefill, one decode step, or ``k`` drafted tokens to verify),
    at positions offset by what the caches hold; equal to the matching rows of the uncached
    forward (:meth:`MultiHeadAttention.step <mha_course.MultiHeadAttention.step>` is the
    attention of one block).
``model.generate(prompt, n_new, temperature=1.0, top_k=None, top_p=None, rng=None,
use_cache=True)``
    The prompt followed by ``n_new`` tokens (:func:`mha_course.serving.sampling.next_token`).
``model.save(path)`` / ``GPT.load(path, dtype=None)``
    An ``.npz`` with every parameter and the config as JSON.

Shape letters: ``B`` batch (any leading axes ``...``), ``T`` positions, ``V`` vocabulary, ``h``
query heads, ``g`` key/value heads, ``d_k = d_model / h``, ``d_ff`` the MLP's width.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .._validate import fail, validate_positive_int
from ..attention import causal_mask
from ..block import PreNormBlock, rms_norm, rms_norm_backward, swiglu_backward
from ..kv_cache import KVCache
from ..multihead import MultiHeadAttention
from ..serving.sampling import next_token
from .gpt_config import GPTConfig, swiglu_width
from .tiny_model import cross_entropy

__all__ = ["GPT", "GPTConfig", "swiglu_width"]


class GPT:
    """A decoder-only transformer: embeddings, pre-RMSNorm blocks of attention and SwiGLU, a head.

    Parameters
    ----------
    config : GPTConfig
    rng : int or numpy.random.Generator, optional
        Seed of the initial parameters: ``W_E`` and ``W_U`` normal with standard deviation
        0.02 (GPT-2's), each block's attention as :class:`~mha_course.MultiHeadAttention`
        draws it (Xavier uniform), ``W_gate``/``W_up`` normal with variance ``1/d_model``,
        ``W_down`` with variance ``1/d_ff``; ``W_o`` and ``W_down`` (the projections into the
        residual stream) scaled by ``1/sqrt(2·n_layers)`` (GPT-2's); norms 1.
    dtype : numpy dtype, default float64
        Of every parameter and computation (float32 trains faster; float64 for gradient checks).

    Examples
    --------
    >>> model = GPT(GPTConfig(vocab_size=11, d_model=16, n_layers=2, h=4, n_kv_heads=2), rng=0)
    >>> model.forward(np.zeros((3, 5), dtype=int)).shape
    (3, 5, 11)
    >>> model.n_params
    6576
    """

    def __init__(self, config: GPTConfig, rng=None, dtype=np.float64):
        if not isinstance(config, GPTConfig):
            raise fail("GPT", f"config is a {type(config).__name__}; expected a GPTConfig")
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise fail("GPT", f"dtype={dtype} must be a floating dtype")
        c, self.config, self.dtype = config, config, dtype
        rng = np.random.default_rng(rng)
        self.W_E = (0.02 * rng.normal(size=(c.vocab_size, c.d_model))).astype(dtype)
        self.blocks = []  # one PreNormBlock each: its attention, two norms, its SwiGLU
        residual_scale = 1.0 / math.sqrt(2 * c.n_layers)
        for _ in range(c.n_layers):
            attn = MultiHeadAttention(c.d_model, c.h, rng=rng, n_kv_heads=c.n_kv_heads,
                                      rope=c.rope, rope_base=c.rope_base)
            attn.W_o = attn.W_o * residual_scale
            for name in ("W_q", "W_k", "W_v", "W_o"):
                setattr(attn, name, getattr(attn, name).astype(dtype))
            W_gate = rng.normal(size=(c.d_model, c.d_ff)) / math.sqrt(c.d_model)
            W_up = rng.normal(size=(c.d_model, c.d_ff)) / math.sqrt(c.d_model)
            W_down = rng.normal(size=(c.d_ff, c.d_model)) * residual_scale / math.sqrt(c.d_ff)
            self.blocks.append(PreNormBlock(
                attn, np.ones(c.d_model, dtype=dtype), np.ones(c.d_model, dtype=dtype),
                W_gate.astype(dtype), W_up.astype(dtype), W_down.astype(dtype), c.eps))
        self.norm_f = np.ones(c.d_model, dtype=dtype)
        self.W_U = (0.02 * rng.normal(size=(c.d_model, c.vocab_size))).astype(dtype)

    # ---------------------------------------------------------------------------- parameters
    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter array by name (see the module docstring), the arrays themselves."""
        params = {"W_E": self.W_E}
        for i, block in enumerate(self.blocks):
            params.update((f"L{i}.{name}", p) for name, p in block.parameters().items())
        params["norm_f"] = self.norm_f
        params["W_U"] = self.W_U
        return params

    @property
    def n_params(self) -> int:
        """Number of parameters (numbers, not arrays)."""
        return sum(p.size for p in self.parameters().values())

    def load_parameters(self, params) -> None:
        """Copy ``params`` (a dict named as :meth:`parameters`, every name present) into the
        model, in place and in the model's dtype.

        Raises
        ------
        ValueError
            If a name is missing or extra, or a shape differs.
        """
        func = "GPT.load_parameters"
        mine = self.parameters()
        missing, extra = sorted(set(mine) - set(params)), sorted(set(params) - set(mine))
        if missing or extra:
            raise fail(func, f"params is missing {missing} and has unknown {extra}")
        for name, p in mine.items():
            new = np.asarray(params[name])
            if new.shape != p.shape:
                raise fail(func, f"params[{name!r}] has shape {new.shape}; expected {p.shape}")
            p[...] = new

    @classmethod
    def from_parameters(cls, config: GPTConfig, params, dtype=None) -> GPT:
        """A model of ``config`` holding copies of ``params`` (dtype: theirs, unless given)."""
        dtype = np.asarray(params["W_E"]).dtype if dtype is None else dtype
        model = cls(config, rng=0, dtype=dtype)
        model.load_parameters(params)
        return model

    def astype(self, dtype) -> GPT:
        """A copy of the model in ``dtype``."""
        return GPT.from_parameters(self.config, self.parameters(), dtype=dtype)

    # ------------------------------------------------------------------------ forward pass
    def validate_tokens(self, func: str, tokens, offset: int = 0) -> np.ndarray:
        """``tokens`` as an int array (..., T) that fits the vocabulary and the context, or a
        ``ValueError`` naming ``func`` (``offset``: positions already cached)."""
        tokens = np.asarray(tokens)
        if tokens.dtype.kind not in "iu" or tokens.ndim < 1 or tokens.shape[-1] < 1:
            raise fail(func, f"tokens has dtype {tokens.dtype} and shape {tokens.shape}; "
                             "expected integer token ids of shape (..., T) with T >= 1")
        T, c = tokens.shape[-1], self.config
        if offset + T > c.context_length:
            raise fail(func, f"{offset} cached + T={T} new positions exceed context_length="
                             f"{c.context_length}; use a GPTConfig with a longer context_length"
                             " (RoPE has no position table)" if offset else
                             f"tokens has T={T} positions; the model's context_length is "
                             f"{c.context_length}")
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            bad = int(tokens.max() if tokens.max() >= c.vocab_size else tokens.min())
            raise fail(func, f"tokens holds the id {bad}; the vocabulary has vocab_size="
                             f"{c.vocab_size} (ids 0..{c.vocab_size - 1})")
        return tokens

    def validate_head_mask(self, func: str, head_mask):
        """``head_mask`` as a float (n_layers, h) array (None stays None), or a ``ValueError``."""
        if head_mask is None:
            return None
        m = np.asarray(head_mask, dtype=self.dtype)
        shape = (self.config.n_layers, self.config.h)
        if m.shape != shape:
            raise fail(func, f"head_mask has shape {m.shape}; expected (n_layers, h) = {shape}")
        return m

    def forward(self, tokens, *, head_mask=None, return_cache=False):
        """Logits for the next token at every position.

        Parameters
        ----------
        tokens : ndarray of int, shape (..., T)
            ``0 <= id < vocab_size``, ``1 <= T <= context_length``.
        head_mask : array_like, shape (n_layers, h), optional
            Multiplies each head's output before ``W_o`` (0: the head is ablated).
        return_cache : bool, default False
            Also return what :meth:`backward` needs (not with ``head_mask``).

        Returns
        -------
        logits : ndarray, shape (..., T, V)
        cache : dict, with ``return_cache=True``

        Raises
        ------
        ValueError
            On ids outside the vocabulary, too many positions, a wrong ``head_mask``.
        """
        logits, cache, _ = self._run("GPT.forward", tokens, head_mask, return_cache)
        return (logits, cache) if return_cache else logits

    def _run(self, func: str, tokens, head_mask, return_cache: bool):
        """The forward pass every variant shares: ``(logits, cache, infos)``.

        Each block is its :class:`~mha_course.block.PreNormBlock`, with the attention half
        through the hook :meth:`_attention` (lesson 13's ``VariantGPT`` overrides it);
        ``infos`` holds what the hook returns beside the output, one entry per block.
        """
        tokens = self.validate_tokens(func, tokens)
        mask_h = self.validate_head_mask(func, head_mask)
        if mask_h is not None and return_cache:
            raise fail(func, "head_mask is for evaluation; backward needs the unmasked forward")
        c = self.config
        mask = causal_mask(tokens.shape[-1])
        x = self.W_E[tokens]  # (..., T) -> (..., T, d_model)
        saved, infos = [], []
        for i, block in enumerate(self.blocks):
            kept = []  # what the hook keeps for the backward pass, and its info

            def attention(a, i=i, kept=kept):
                row = None if mask_h is None else mask_h[i]
                out, att, info = self._attention(i, a, mask, row, return_cache)
                kept += [att, info]
                return out

            x1 = block.with_attention(x, attention)  # x + attention(rms_norm(x))
            saved.append({"x": x, "att": kept[0], "x1": x1})
            infos.append(kept[1])
            x = block.with_mlp(x1)  # x1 + swiglu(rms_norm(x1))
        xf = rms_norm(x, self.norm_f, c.eps)
        logits = xf @ self.W_U  # (..., T, d_model) @ (d_model, V) -> (..., T, V)
        return logits, {"tokens": tokens, "blocks": saved, "x": x, "xf": xf}, infos

    def _attention(self, i: int, a, mask, head_mask, keep: bool):
        """Block ``i``'s attention on its normalised input ``a``: ``(out, saved, info)``.

        ``saved`` is what :meth:`_attention_backward` needs (with ``keep``), ``info`` None here.
        ``head_mask`` (h,) scales each head's output before ``W_o`` (the layer's own).
        """
        attn = self.blocks[i].attn
        if head_mask is not None or not keep:
            return attn.forward(a, mask=mask, head_mask=head_mask)[0], None, None
        out, att = attn.forward(a, mask=mask, return_cache=True)
        return out, att, None

    def _attention_backward(self, i: int, dout, att, grads: dict):
        """Gradients of block ``i``'s attention into ``grads``; returns dL/da."""
        attn = self.blocks[i].attn
        ga = attn.backward(dout, att)
        for name in attn.parameters():
            grads[f"L{i}.{name}"] = ga[name]
        return ga["x"]

    __call__ = forward

    def backward(self, dlogits, cache) -> dict[str, np.ndarray]:
        """Gradients of the loss with respect to every parameter, by hand, named as
        :meth:`parameters`.

        Parameters
        ----------
        dlogits : ndarray, shape (..., T, V)
            dLoss/dlogits (e.g. from :func:`~mha_course.models.tiny_model.cross_entropy`).
        cache : dict
            From ``forward(tokens, return_cache=True)``.
        """
        func = f"{type(self).__name__}.backward"
        c, xf = self.config, cache["xf"]
        if np.shape(dlogits) != (*xf.shape[:-1], c.vocab_size):
            raise fail(func, f"dlogits has shape {np.shape(dlogits)}; expected (..., T, V) = "
                             f"{(*xf.shape[:-1], c.vocab_size)}")
        dlogits = np.asarray(dlogits, dtype=self.dtype)
        # (B·T, d_model)ᵀ @ (B·T, V) -> (d_model, V), summed over every position
        grads = {"W_U": xf.reshape(-1, c.d_model).T @ dlogits.reshape(-1, c.vocab_size)}
        dx, grads["norm_f"] = rms_norm_backward(dlogits @ self.W_U.T, cache["x"], self.norm_f,
                                                c.eps)
        for i in reversed(range(c.n_layers)):
            block, s = self.blocks[i], cache["blocks"][i]
            # x2 = x1 + swiglu(rms_norm(x1)): around the MLP and through it
            m = rms_norm(s["x1"], block.mlp_norm, c.eps)
            g = swiglu_backward(dx, m, block.W_gate, block.W_up, block.W_down)
            dx1, grads[f"L{i}.mlp_norm"] = rms_norm_backward(g["x"], s["x1"], block.mlp_norm,
                                                             c.eps)
            dx1 = dx1 + dx
            for name in ("W_gate", "W_up", "W_down"):
                grads[f"L{i}.{name}"] = g[name]
            # x1 = x + attention(rms_norm(x))
            da = self._attention_backward(i, dx1, s["att"], grads)
            dx, grads[f"L{i}.attn_norm"] = rms_norm_backward(da, s["x"], block.attn_norm, c.eps)
            dx = dx + dx1
        grads["W_E"] = np.zeros_like(self.W_E)
        np.add.at(grads["W_E"], cache["tokens"], dx)  # each row: the positions of its token
        return {name: grads[name] for name in self.parameters()}

    def loss(self, tokens, targets, *, head_mask=None) -> float:
        """Mean cross-entropy of ``targets`` (..., T) given ``tokens`` (..., T), in nats."""
        logits = self.forward(tokens, head_mask=head_mask)
        flat = logits.reshape(-1, 1, logits.shape[-1])
        targets = np.asarray(targets).reshape(-1, 1)
        return cross_entropy(flat, targets, np.ones(targets.shape))[0]

    def loss_and_grads(self, tokens, targets) -> tuple[float, dict[str, np.ndarray]]:
        """Mean cross-entropy over every position and every parameter's gradient."""
        logits, cache = self.forward(tokens, return_cache=True)
        B_T = logits.shape[:-1]
        targets = np.asarray(targets)
        if targets.shape != B_T:
            raise fail("GPT.loss_and_grads", f"targets has shape {targets.shape}; expected "
                                             f"{B_T}, the shape of tokens")
        flat = logits.reshape(-1, 1, logits.shape[-1])
        loss, dflat = cross_entropy(flat, targets.reshape(-1, 1), np.ones((flat.shape[0], 1)))
        return loss, self.backward(dflat.reshape(logits.shape), cache)

    def attention_weights(self, tokens) -> list[np.ndarray]:
        """Every block's attention weights on ``tokens``: ``n_layers`` arrays (..., h, T, T)."""
        _, cache = self.forward(tokens, return_cache=True)
        return [s["att"].weights for s in cache["blocks"]]

    # ------------------------------------------------------------------- cached inference
    def init_cache(self, batch_shape=(), max_len=None) -> list[KVCache]:
        """One empty KV cache per block (``max_len`` defaults to ``context_length``)."""
        max_len = self.config.context_length if max_len is None else max_len
        return [block.attn.init_cache(batch_shape, max_len=max_len, dtype=self.dtype)
                for block in self.blocks]

    def step(self, tokens, caches) -> np.ndarray:
        """Logits for a chunk of ``T >= 1`` new tokens that follow what ``caches`` hold.

        Parameters
        ----------
        tokens : ndarray of int, shape (..., T)
            ``...`` is the caches' batch shape.
        caches : list of KVCache
            From :meth:`init_cache`, updated in place (every block's, in step).

        Returns
        -------
        ndarray, shape (..., T, V)
            Equal to ``forward(all_tokens)[..., L0:L0 + T, :]`` where ``L0`` tokens were
            cached before.

        Raises
        ------
        ValueError
            If the caches are not this model's, disagree in length, or would outgrow
            ``context_length``.
        """
        func = "GPT.step"
        if len(caches) != len(self.blocks) or any(
                not isinstance(cc, KVCache) or cc.layer is not block.attn
                or cc.window is not None for cc, block in zip(caches, self.blocks, strict=False)):
            raise fail(func, "caches must be this model's init_cache() (one per block)")
        L0 = caches[0].tokens_seen
        if any(cc.tokens_seen != L0 for cc in caches):
            raise fail(func, f"the caches hold {[cc.tokens_seen for cc in caches]} positions; "
                             "every block's must hold the same")
        tokens = self.validate_tokens(func, tokens, offset=L0)
        if tokens.shape[:-1] != caches[0].batch_shape:
            raise fail(func, f"tokens has shape {tokens.shape}; expected (..., T) with ... = "
                             f"{caches[0].batch_shape} (from the caches)")
        c = self.config
        x = self.W_E[tokens]  # (..., T, d_model)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = block.step(x, cache)  # the caches were checked above
        return rms_norm(x, self.norm_f, c.eps) @ self.W_U

    def generate(self, prompt, n_new: int, temperature: float = 1.0, top_k=None, top_p=None,
                 rng=None, use_cache: bool = True) -> np.ndarray:
        """The prompt followed by ``n_new`` generated tokens.

        Parameters
        ----------
        prompt : ndarray of int, shape (..., T0)
        n_new : int
            ``T0 + n_new <= context_length``.
        temperature, top_k, top_p
            As :func:`~mha_course.serving.sampling.next_token` (``temperature=0``: greedy).
        rng : int or numpy.random.Generator, optional
            Seed of the sampling (one uniform number per sequence and step).
        use_cache : bool, default True
            Prefill the prompt into KV caches and decode one token at a time; False reruns
            the whole sequence at every step (the same tokens, at O(T²) more work).

        Returns
        -------
        ndarray of int64, shape (..., T0 + n_new)
        """
        func = "GPT.generate"
        prompt = self.validate_tokens(func, prompt)
        n_new = validate_positive_int(func, "n_new", n_new, minimum=0)
        T0 = prompt.shape[-1]
        if T0 + n_new > self.config.context_length:
            raise fail(func, f"T0={T0} + n_new={n_new} exceeds context_length="
                             f"{self.config.context_length}")
        rng = np.random.default_rng(rng)
        seq = prompt.astype(np.int64)
        caches = self.init_cache(prompt.shape[:-1]) if use_cache else None
        logits = self.step(seq, caches)[..., -1, :] if use_cache else None
        for _ in range(n_new):
            if not use_cache:
                logits = self.forward(seq)[..., -1, :]
            new = next_token(logits, temperature, top_k, top_p, rng)  # (...)
            seq = np.concatenate([seq, new[..., None]], axis=-1)
            if use_cache and seq.shape[-1] < T0 + n_new:
                logits = self.step(new[..., None], caches)[..., -1, :]
        return seq

    # ---------------------------------------------------------------------------- storage
    def save(self, path, **metadata) -> None:
        """Write every parameter and the config (JSON) to an ``.npz``; ``metadata`` values are
        stored as JSON under ``meta/<key>``."""
        arrays = {f"param/{name}": p for name, p in self.parameters().items()}
        arrays["config"] = np.array(json.dumps(self.config.to_dict()))
        for key, value in metadata.items():
            arrays[f"meta/{key}"] = np.array(json.dumps(value))
        np.savez(Path(path), **arrays)

    @classmethod
    def load(cls, path, dtype=None) -> GPT:
        """The model :meth:`save` wrote (in its stored dtype unless ``dtype`` is given)."""
        with np.load(Path(path)) as data:
            config = GPTConfig.from_dict(json.loads(str(data["config"])))
            params = {key[len("param/"):]: data[key] for key in data.files
                      if key.startswith("param/")}
        return cls.from_parameters(config, params, dtype=dtype)

    def __repr__(self) -> str:
        c = self.config
        return (f"GPT(vocab_size={c.vocab_size}, d_model={c.d_model}, n_layers={c.n_layers}, "
                f"h={c.h}, n_kv_heads={c.n_kv_heads}, d_ff={c.d_ff}, context_length="
                f"{c.context_length}, dtype={self.dtype})")
