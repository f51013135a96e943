"""Checks for the exercises of lesson 09, a tiny GPT (``solutions/09_tiny_gpt.ipynb``).

The lesson is ``notebooks/09_tiny_gpt.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`). The references come from the package at check time:
:func:`mha_course.block.rms_norm_backward`, :func:`mha_course.rms_norm` and
:func:`mha_course.swiglu`, :func:`mha_course.serving.sampling.top_p_filter`, and the uncached
``GPT.generate`` of :mod:`mha_course.models.gpt` on small seeded models; exercise 09.6's OV
circuit (deep dive ``notebooks/deep_dives/09c_heads_as_circuits.ipynb``) is computed here from
its definition, ``E W_V^{i // (h/g)} W_O^i W_U``.
"""

from __future__ import annotations

import numpy as np

from .. import (
    apply_rope,
    causal_mask,
    merge_heads,
    rms_norm,
    scaled_dot_product_attention,
    split_heads,
    swiglu,
)
from ..block import rms_norm_backward, sigmoid
from ..models.gpt import GPT, GPTConfig
from ..serving.sampling import next_token, top_p_filter
from ..softmax import softmax
from .harness import call, compare, fail, passed
from .measure import check_rng

__all__ = ["check_cached_sampling", "check_decode_positions", "check_ov_circuit",
           "check_rms_norm_backward", "check_swiglu_sublayer", "check_top_p"]

GPT_CALLS = ("generate", "forward", "__call__", "step", "loss", "loss_and_grads",
             "attention_weights")


def _models(seed: int):
    """Two small seeded models whose sizes all differ: GQA and MHA, both RoPE layouts."""
    return [GPT(GPTConfig(vocab_size=13, d_model=24, n_layers=2, h=6, n_kv_heads=3, d_ff=20,
                          context_length=48), rng=seed),
            GPT(GPTConfig(vocab_size=11, d_model=16, n_layers=1, h=2, d_ff=12,
                          context_length=48, rope="interleaved"), rng=seed + 1)]


def _ids(ex, got, shape, what):
    if got is None:
        raise fail(ex, f"your function returned None instead of {what}: did you forget "
                       "`return`?")
    arr = np.asarray(got)
    if arr.shape != shape:
        hint = ""
        if arr.shape == (shape[0] - 1,) or (arr.ndim == 1 and arr.size < shape[0]):
            hint = (" Likely mistake: return the prompt followed by the n_new new tokens "
                    "(T0 + n_new ids)")
        raise fail(ex, f"{what}: shape {arr.shape}; expected (T0 + n_new,) = {shape}.{hint}")
    if arr.dtype.kind not in "iu":
        raise fail(ex, f"{what}: dtype {arr.dtype}; expected integer token ids")
    return arr


def _first_difference(got, want, T0) -> str:
    t = int(np.argmax(got != want))
    return (f"token {t} (the {t - T0 + 1}th new one) is {int(got[t])}, the uncached loop's is "
            f"{int(want[t])}")


# ---------------------------------------------------------------------------------- 09.1
def check_rms_norm_backward(fn) -> None:
    """Exercise 09.1: ``rms_norm_backward(grad_y, x, weight, eps) -> (dx, dweight)``."""
    ex = "09.1"
    rng = check_rng(901)
    for shape, eps in (((2, 3, 5), 1e-5), ((4, 7), 0.1), ((6,), 1e-5)):
        _rms_case(ex, fn, rng, shape, eps)
    passed(ex, "dx and dweight match mha_course.block.rms_norm_backward for x (2, 3, 5), "
               "(4, 7) with eps = 0.1, and (6,)")


def _rms_case(ex, fn, rng, shape, eps):
    d = shape[-1]
    x, grad_y = rng.normal(size=shape), rng.normal(size=shape)
    weight = 1.0 + 0.5 * rng.normal(size=d)
    want_dx, want_dw = rms_norm_backward(grad_y, x, weight, eps)
    got = call(ex, fn, (grad_y, x, weight, eps), ("grad_y", "x", "weight", "eps"),
               forbid={"mha_course.block.rms_norm_backward": "write the backward pass "
                       "yourself", "mha_course.block.layer_norm_backward": "write the "
                       "backward pass yourself"})
    if not isinstance(got, tuple) or len(got) != 2:
        raise fail(ex, f"your function returned {type(got).__name__}; expected a tuple "
                       "(dx, dweight)")
    label = f"for x of shape {shape}, eps={eps}"
    ms = (x * x).mean(-1, keepdims=True)
    r = 1 / np.sqrt(ms + eps)
    xhat = x * r
    g = grad_y * weight
    compare(ex, got[1], want_dw, f"your dweight {label}", "(d_model,)",
            variants=[("dweight is grad_y · x̂ summed over every position, where x̂ = x / "
                       "rms(x) is the normalised x (before the weight), not x itself",
                       lambda: (grad_y * x).reshape(-1, d).sum(0))],
            shape_hints={shape: "sum grad_y · x̂ over every leading axis: the weight is "
                                "shared by all positions, so its gradient adds theirs up"}
            if len(shape) > 1 else None)
    compare(
        ex, got[0], want_dx, f"your dx {label}", "(..., d_model)",
        variants=[
            ("r = 1/rms(x) depends on x too: dx = r·(g − x̂·mean(g·x̂)), not just r·g",
             lambda: r * g),
            ("that is LayerNorm's backward: RMSNorm subtracts no mean, so there is no "
             "− mean(g) term", lambda: r * (g - g.mean(-1, keepdims=True)
                                             - xhat * (g * xhat).mean(-1, keepdims=True))),
            ("the weight is missing: the gradient reaching x̂ is g = grad_y · weight",
             lambda: r * (grad_y - xhat * (grad_y * xhat).mean(-1, keepdims=True))),
            ("the sum over the features, not their mean: mean(x²) divides by d_model, and "
             "so does its derivative", lambda: r * (g - xhat * (g * xhat).sum(-1,
                                                                           keepdims=True))),
        ])


# ---------------------------------------------------------------------------------- 09.2
def check_swiglu_sublayer(fn) -> None:
    """Exercise 09.2: ``mlp_sublayer(x, norm_weight, W_gate, W_up, W_down, eps)``: the MLP half
    of a pre-norm block, ``x + swiglu(rms_norm(x))``."""
    ex = "09.2"
    rng = check_rng(902)
    for shape, d_ff in (((2, 3, 6), 10), ((5, 4), 7)):
        _sublayer_case(ex, fn, rng, shape, d_ff)
    passed(ex, "x + SwiGLU(RMSNorm(x)) matches the package for x (2, 3, 6) with d_ff = 10 and "
               "(5, 4) with d_ff = 7")


def _sublayer_case(ex, fn, rng, shape, d_ff):
    d = shape[-1]
    x = rng.normal(size=shape)
    w = 1.0 + 0.3 * rng.normal(size=d)
    W_gate, W_up = rng.normal(size=(2, d, d_ff))
    W_down = rng.normal(size=(d_ff, d))
    eps = 1e-5
    m = rms_norm(x, w, eps)
    want = x + swiglu(m, W_gate, W_up, W_down)
    got = call(ex, fn, (x, w, W_gate, W_up, W_down, eps),
               ("x", "norm_weight", "W_gate", "W_up", "W_down", "eps"),
               forbid={"mha_course.swiglu": "write SwiGLU yourself",
                       "mha_course.block.swiglu": "write SwiGLU yourself",
                       "mha_course.block.silu": "write SiLU yourself"})
    a, b = m @ W_gate, m @ W_up
    compare(
        ex, got, want, f"your sublayer for x of shape {shape}, d_ff={d_ff}",
        "(..., d_model)",
        variants=[
            ("the residual is missing: the sublayer returns x + MLP(RMSNorm(x))",
             lambda: swiglu(m, W_gate, W_up, W_down)),
            ("post-norm: a pre-norm block normalises the sublayer's input, x + "
             "MLP(RMSNorm(x)), not the sum", lambda: rms_norm(x + swiglu(x, W_gate, W_up,
                                                                          W_down), w, eps)),
            ("the input was not normalised: MLP(RMSNorm(x)), not MLP(x)",
             lambda: x + swiglu(x, W_gate, W_up, W_down)),
            ("the gate is silu(x W_gate) * (x W_up): SiLU goes on the gate projection, not "
             "on W_up's", lambda: x + (a * sigmoid(b) * b) @ W_down),
            ("sigmoid(a) · b is the original GLU; SwiGLU gates with silu(a) = a · sigmoid(a)",
             lambda: x + (sigmoid(a) * b) @ W_down),
            ("ReLU instead of SiLU", lambda: x + (np.maximum(a, 0) * b) @ W_down),
        ])


# ---------------------------------------------------------------------------------- 09.3
def _top_p_variant(logits, p, rule):
    probs = softmax(logits)
    order = np.argsort(-probs, axis=-1, kind="stable")
    sp = np.take_along_axis(probs, order, axis=-1)
    cum = np.cumsum(sp, axis=-1)
    keep_sorted = {"drop_crossing": cum < p, "cum_le": cum <= p}[rule]
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, logits, -np.inf)


def check_top_p(fn) -> None:
    """Exercise 09.3: ``top_p_filter(logits, p)``: the nucleus kept, ``-inf`` elsewhere."""
    ex = "09.3"
    rng = check_rng(903)
    probes = [("3 rows of 7 logits, p=0.9", rng.normal(size=(3, 7)) * 2, 0.9),
              ("3 rows of 7 logits, p=0.3", rng.normal(size=(3, 7)) * 2, 0.3),
              ("one row of 10 logits, p=0.75", rng.normal(size=10), 0.75),
              ("a batch (2, 2, 5) with a confident row, p=0.5",
               np.array([[[8.0, 0, 0, 0, 0], [1, 1, 1, 1, 1.0]],
                         [[0, 2, 0, 1, 0.5], [3, 2, 1, 0, -1.0]]]), 0.5),
              ("one row, p=1.0 (keep everything)", rng.normal(size=6), 1.0)]
    for label, logits, p in probes:
        want = top_p_filter(logits, p)
        got = call(ex, fn, (logits.copy(), p), ("logits", "p"),
                   forbid={"mha_course.serving.sampling.top_p_filter": "write the nucleus "
                           "filter yourself",
                           "mha_course.serving.sampling.next_token": "write the nucleus "
                           "filter yourself"})
        arr = np.asarray(got) if got is not None else None
        if arr is not None and arr.shape == want.shape and np.isfinite(arr).all() \
                and not np.isfinite(want).all():
            if np.allclose(arr.sum(-1), 1.0):
                raise fail(ex, f"{label}: you returned probabilities; return the logits, "
                               "with -inf where a token is filtered out (the sampler takes "
                               "the softmax of what you return)")
            raise fail(ex, f"{label}: nothing is -inf, so nothing was filtered; set the logits "
                           "outside the nucleus to -np.inf")
        compare(
            ex, got, want, f"your filtered logits for {label}", "(..., V)",
            variants=[
                ("the token whose probability carries the sum across p was dropped: keep a "
                 "token while the mass of the tokens *before* it is below p (cumsum − own "
                 "probability < p)", lambda lg=logits, p=p: _top_p_variant(lg, p,
                                                                           "drop_crossing")),
                ("cumsum <= p still drops the crossing token (and keeps nothing when the top "
                 "token alone has more than p): compare the mass before each token with p",
                 lambda lg=logits, p=p: _top_p_variant(lg, p, "cum_le")),
                ("the tokens were not sorted by probability: the nucleus is the most probable "
                 "tokens, so sort in decreasing order before the cumulative sum",
                 lambda lg=logits, p=p: np.where(
                     (np.cumsum(softmax(lg), -1) - softmax(lg)) < p, lg, -np.inf)),
            ])
    passed(ex, "the nucleus matches mha_course.serving.sampling.top_p_filter for p = 0.3, 0.5, "
               "0.75, 0.9 and 1.0, on one row, a (3, 7) batch and a (2, 2, 5) batch")


# ---------------------------------------------------------------------------------- 09.4
def check_cached_sampling(fn) -> None:
    """Exercise 09.4: ``sample_cached(model, prompt, n_new, temperature, top_k, seed)``: the
    prompt and ``n_new`` sampled tokens, through the model's KV caches."""
    ex = "09.4"
    for model, (T0, n_new, temperature, top_k, seed) in zip(
            _models(904), ((5, 30, 0.8, 5, 1), (1, 25, 1.3, None, 2)), strict=True):
        prompt = np.random.default_rng(seed).integers(0, model.config.vocab_size, size=T0)
        want = model.generate(prompt, n_new, temperature=temperature, top_k=top_k, rng=seed,
                              use_cache=False)
        got = call(ex, fn, (model, prompt, n_new, temperature, top_k, seed),
                   ("model", "prompt", "n_new", "temperature", "top_k", "seed"),
                   hint=_cache_hint,
                   forbid={f"mha_course.models.gpt.GPT.{m}": "write the cached loop with "
                           "model.init_cache and model.step" for m in ("generate", "forward",
                                                                       "__call__")})
        label = f"for a prompt of {T0} tokens and {n_new} new ones"
        got = _ids(ex, got, want.shape, f"your tokens {label}")
        if (got == want).all():
            continue
        stale = _stale_logits(model, prompt, n_new, temperature, top_k, seed)
        if stale is not None and (got == stale).all():
            raise fail(ex, f"{label}: likely mistake: each token was chosen from the logits of "
                           "the step before: after appending a token, run model.step on it "
                           "and choose the next token from that step's last logits")
        if (got[:T0] != prompt).any():
            raise fail(ex, f"{label}: your sequence does not start with the prompt")
        raise fail(ex, f"{label}: your tokens differ from the uncached loop (model.generate "
                       "with use_cache=False and the same seed): "
                       f"{_first_difference(got, want, T0)}. Prefill the prompt with one "
                       "model.step, choose each token with sampling.next_token(logits[-1], "
                       "temperature, top_k, None, rng) from one default_rng(seed), then "
                       "model.step on that one token")
    passed(ex, "cached sampling equals the uncached loop token for token: a GQA model "
               "(top-k 5, temperature 0.8) and an interleaved-RoPE model (temperature 1.3)")


def _cache_hint(exc) -> str | None:
    text = str(exc)
    if "exceed context_length" in text or "cached +" in text:
        return ("the caches already hold every earlier token: pass model.step only the new "
                "tokens (the whole prompt once, then one token at a time)")
    return None


def _stale_logits(model, prompt, n_new, temperature, top_k, seed):
    """The sequence a loop makes when it chooses from the prefill's logits twice (off by one)."""
    try:
        rng = np.random.default_rng(seed)
        caches = model.init_cache()
        logits = model.step(prompt, caches)[-1]
        seq, previous = list(prompt), logits
        for _ in range(n_new):
            nxt = int(next_token(previous, temperature, top_k, None, rng))
            seq.append(nxt)
            previous = logits
            logits = model.step(np.array([nxt]), caches)[-1]
        return np.array(seq)
    except Exception:
        return None


# ---------------------------------------------------------------------------------- 09.5
def _rotated_decode(model, prompt, n_new, offset_rule):
    """The colleague's loop with a given rule for the chunk's RoPE positions."""
    c, P = model.config, model.parameters()
    keys, values = [None] * c.n_layers, [None] * c.n_layers
    generated = [0]

    def run(chunk, cached):
        x = P["W_E"][chunk]
        T = len(chunk)
        positions = {"zero": np.arange(T), "right": cached + np.arange(T),
                     "generated": generated[0] + np.arange(T)}[offset_rule]
        for i, attn in enumerate(block.attn for block in model.blocks):
            a = rms_norm(x, P[f"L{i}.attn_norm"], c.eps)
            q = apply_rope(split_heads(a @ attn.W_q, c.h), positions, layout=c.rope)
            k = apply_rope(split_heads(a @ attn.W_k, c.n_kv_heads), positions, layout=c.rope)
            v = split_heads(a @ attn.W_v, c.n_kv_heads)
            keys[i] = k if keys[i] is None else np.concatenate([keys[i], k], axis=-2)
            values[i] = v if values[i] is None else np.concatenate([values[i], v], axis=-2)
            k_all = np.repeat(keys[i], c.h // c.n_kv_heads, axis=-3)
            v_all = np.repeat(values[i], c.h // c.n_kv_heads, axis=-3)
            heads, _ = scaled_dot_product_attention(q, k_all, v_all,
                                                    mask=causal_mask(T, k_all.shape[-2]))
            x = x + merge_heads(heads) @ attn.W_o
            x = x + swiglu(rms_norm(x, P[f"L{i}.mlp_norm"], c.eps), P[f"L{i}.W_gate"],
                           P[f"L{i}.W_up"], P[f"L{i}.W_down"])
        return rms_norm(x, P["norm_f"], c.eps) @ P["W_U"]

    seq = list(prompt)
    logits = run(np.array(prompt), 0)
    for _ in range(n_new):
        nxt = int(np.argmax(logits[-1]))
        seq.append(nxt)
        logits = run(np.array([nxt]), len(seq) - 1)
        generated[0] += 1
    return np.array(seq)


def check_decode_positions(fn) -> None:
    """Exercise 09.5: ``generate_greedy(model, prompt, n_new)``, the colleague's cached loop
    with its bug fixed: equal to greedy generation that recomputes the whole sequence."""
    ex = "09.5"
    for model, T0, n_new in zip(_models(905), (6, 3), (20, 16), strict=True):
        prompt = np.random.default_rng(T0).integers(0, model.config.vocab_size, size=T0)
        want = model.generate(prompt, n_new, temperature=0, use_cache=False)
        got = call(ex, fn, (model, prompt, n_new), ("model", "prompt", "n_new"),
                   forbid={**{f"mha_course.models.gpt.GPT.{m}": "fix the colleague's loop, "
                              "not replace it by the model's own" for m in GPT_CALLS},
                           "mha_course.MultiHeadAttention.step": "fix the colleague's loop, not "
                           "replace it by the layer's"})
        label = f"for a prompt of {T0} tokens and {n_new} new ones"
        got = _ids(ex, got, want.shape, f"your tokens {label}")
        if (got == want).all():
            continue
        property_ = ("cached == uncached: every token must be the one greedy decoding gives "
                     "when it recomputes the whole sequence")
        for rule, mistake in (
                ("zero", "every chunk is rotated as if it started at position 0: a token "
                         "decoded after L cached ones sits at position L"),
                ("generated", "the offset counts only the generated tokens: the prompt's "
                              "tokens are in the cache too, so the offset is the number of "
                              "tokens cached, prompt included")):
            if (got == _rotated_decode(model, prompt, n_new, rule)).all():
                raise fail(ex, f"{label}: breaks {property_}: "
                               f"{_first_difference(got, want, T0)}. Likely mistake: {mistake}")
        raise fail(ex, f"{label}: breaks {property_}: {_first_difference(got, want, T0)}")
    passed(ex, "the cached loop equals recomputing the sequence, for a GQA model (half-split "
               "RoPE) and an interleaved-RoPE model, over 20 and 16 new tokens")


# ---------------------------------------------------------------------------------- 09.6
def _ov_reference(E, W_v, W_o, W_U, head, h, rule="right"):
    """``E W_V^{kv} W_O^{head} W_U`` from the fused matrices, or one known wrong variant."""
    d_k = W_o.shape[0] // h
    g = W_v.shape[1] // d_k
    kv = {"right": head // (h // g), "no_gqa": head, "modulo": head % g}.get(rule, head // (h // g))
    if not 0 <= kv < g:
        return None
    W_V = W_v[:, kv * d_k:(kv + 1) * d_k]  # (d_model, d_k): K/V head kv's columns
    if rule == "reshape":
        W_V = W_v.reshape(g, W_v.shape[0], d_k)[kv]
    o = kv if rule == "o_of_kv" else head
    W_O = W_o[o * d_k:(o + 1) * d_k]  # (d_k, d_model): the rows that read head o
    OV = W_V @ W_O
    if rule == "transposed":
        OV = OV.T
    M = E @ OV @ W_U
    return M.T if rule == "rows_cols" else M


def check_ov_circuit(fn) -> None:
    """Exercise 09.6: ``ov_circuit(E, W_v, W_o, W_U, head, h)``: head ``head``'s OV circuit
    through the embedding and the unembedding, ``E W_V^{head // (h/g)} W_O^{head} W_U`` (V, V)."""
    ex = "09.6"
    rng = check_rng(906)
    cases = [("h = 4 over g = 2 K/V heads, head 1", 7, 10, 4, 2, 3, 1),
             ("h = 4 over g = 2 K/V heads, head 2", 7, 10, 4, 2, 3, 2),
             ("h = 3, one K/V head (MQA), head 2", 6, 9, 3, 1, 4, 2),
             ("h = g = 2 (no GQA), head 1", 5, 8, 2, 2, 3, 1)]
    for label, V, d, h, g, d_k, head in cases:
        E = rng.normal(size=(V, d))
        W_v, W_o = rng.normal(size=(d, g * d_k)), rng.normal(size=(h * d_k, d))
        W_U = rng.normal(size=(d, V))
        args = (E, W_v, W_o, W_U, head, h)
        got = call(ex, fn, args, ("E", "W_v", "W_o", "W_U", "head", "h"))
        gqa = ("GQA: query head i reads K/V head i // (h // g) (neighbouring query heads share "
               "one), not K/V head i or i % g")
        compare(
            ex, got, _ov_reference(*args), f"your OV circuit for {label}", "(V, V)",
            variants=[
                ("W_O's slice of the wrong head: W_O^i is the rows i·d_k:(i+1)·d_k of W_o, "
                 "those of the query head i, not of its K/V head",
                 lambda a=args: _ov_reference(*a, rule="o_of_kv")),
                (gqa, lambda a=args: _ov_reference(*a, rule="no_gqa")),
                (gqa, lambda a=args: _ov_reference(*a, rule="modulo")),
                ("W_v (d_model, g·d_k) holds K/V head j in its columns j·d_k:(j+1)·d_k; "
                 "reshaping it to (g, d_model, d_k) without a transpose mixes its rows",
                 lambda a=args: _ov_reference(*a, rule="reshape")),
                ("transposes swapped: the OV circuit is W_V W_O (read with W_V, write with "
                 "W_O), you used its transpose W_Oᵀ W_Vᵀ",
                 lambda a=args: _ov_reference(*a, rule="transposed")),
                ("rows and columns swapped: row b is the attended token, column c the "
                 "logit it moves (E ... W_U, not its transpose)",
                 lambda a=args: _ov_reference(*a, rule="rows_cols")),
            ],
            shape_hints={(V, d): "forgetting the unembedding: E W_V W_O is in the residual "
                                 "stream (V, d_model); multiply by W_U to reach the logits",
                         (d, V): "forgetting the embedding: W_V W_O W_U starts from the "
                                 "residual stream; put E in front to start from tokens",
                         (d, d): "that is W_OV alone (d_model, d_model): put E in front and "
                                 "W_U behind"})
    passed(ex, "E W_V W_O W_U matches for GQA (heads 1 and 2 of 4 over 2), MQA and plain "
               "multi-head attention")
