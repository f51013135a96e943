"""Lesson 09's exercise checks name each classic mistake.

The generic contract (a right answer passes with one stable line, the stub's
``NotImplementedError`` passes through as "not attempted", ``None`` and an unexpected
exception fail) is bound to lesson 09's right answers, :data:`CORRECT_09`, by
:class:`TestContract` here (``tests/check_contract.py``).
"""

from __future__ import annotations

import numpy as np
import pytest
from check_contract import CheckContract

import mha_course
from mha_course import apply_rope, causal_mask, checks, merge_heads, rms_norm, split_heads
from mha_course.checks import CheckFailed, lesson09
from mha_course.serving import sampling

# ------------------------------------------------------------------ correct implementations


def _rms_backward(grad_y, x, weight, eps=1e-5, kind="right"):
    d = x.shape[-1]
    r = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    x_hat = x * r
    g = grad_y * weight
    dx = r * (g - x_hat * np.mean(g * x_hat, axis=-1, keepdims=True))
    dw = (grad_y * x_hat).reshape(-1, d).sum(axis=0)
    if kind == "r_constant":
        dx = r * g
    if kind == "layer_norm":
        dx = r * (g - g.mean(-1, keepdims=True) - x_hat * np.mean(g * x_hat, -1, keepdims=True))
    if kind == "no_weight":
        dx = r * (grad_y - x_hat * np.mean(grad_y * x_hat, axis=-1, keepdims=True))
    if kind == "dw_unsummed":
        dw = grad_y * x_hat
    if kind == "dw_of_x":
        dw = (grad_y * x).reshape(-1, d).sum(axis=0)
    return dx, dw


def _sublayer(x, w, W_gate, W_up, W_down, eps=1e-5, kind="right"):
    m = rms_norm(x, w, eps)
    if kind == "no_norm":
        m = x
    a, b = m @ W_gate, m @ W_up
    gate = {"right": a / (1 + np.exp(-a)), "sigmoid": 1 / (1 + np.exp(-a)),
            "relu": np.maximum(a, 0)}.get(kind, a / (1 + np.exp(-a)))
    if kind == "gate_on_up":
        a, b = b, a
        gate = a / (1 + np.exp(-a))
    out = (gate * b) @ W_down
    if kind == "no_residual":
        return out
    if kind == "post_norm":
        aa, bb = x @ W_gate, x @ W_up
        return rms_norm(x + (aa / (1 + np.exp(-aa)) * bb) @ W_down, w, eps)
    return x + out


def _top_p(logits, p, kind="right"):
    probs = mha_course.softmax(logits)
    order = np.argsort(-probs, axis=-1, kind="stable")
    sp = np.take_along_axis(probs, order, axis=-1)
    cum = np.cumsum(sp, axis=-1)
    keep_sorted = {"drop_crossing": cum < p, "cum_le": cum <= p}.get(kind, cum - sp < p)
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    if kind == "probabilities":
        return np.where(keep, probs, 0.0) / np.where(keep, probs, 0.0).sum(-1, keepdims=True)
    if kind == "unsorted":
        keep = (np.cumsum(probs, -1) - probs) < p
    return np.where(keep, logits, -np.inf)


def _sample_cached(model, prompt, n_new, temperature, top_k, seed, kind="right"):
    rng = np.random.default_rng(seed)
    caches = model.init_cache()
    logits = model.step(np.asarray(prompt), caches)[-1]
    seq, previous = list(prompt), logits
    for i in range(n_new):
        use = previous if kind == "stale" else logits
        token = int(sampling.next_token(use, temperature, top_k, None, rng))
        seq.append(token)
        previous = logits
        if kind == "whole_sequence":
            logits = model.step(np.array(seq), caches)[-1]
        elif i + 1 < n_new:
            logits = model.step(np.array([token]), caches)[-1]
    return np.array(seq) if kind != "new_only" else np.array(seq[len(prompt):])


def _generate_greedy(model, prompt, n_new, kind="right"):
    c, P = model.config, model.parameters()
    keys, values = [None] * c.n_layers, [None] * c.n_layers

    def run(chunk, cached):
        x = P["W_E"][chunk]
        T = len(chunk)
        positions = {"right": cached, "zero": 0, "generated": max(0, cached - len(prompt))}[
            kind] + np.arange(T)
        for i, attn in enumerate(block.attn for block in model.blocks):
            a = rms_norm(x, P[f"L{i}.attn_norm"], c.eps)
            q = apply_rope(split_heads(a @ attn.W_q, c.h), positions, layout=c.rope)
            k = apply_rope(split_heads(a @ attn.W_k, c.n_kv_heads), positions, layout=c.rope)
            v = split_heads(a @ attn.W_v, c.n_kv_heads)
            keys[i] = k if keys[i] is None else np.concatenate([keys[i], k], axis=-2)
            values[i] = v if values[i] is None else np.concatenate([values[i], v], axis=-2)
            k_all = np.repeat(keys[i], c.h // c.n_kv_heads, axis=-3)
            v_all = np.repeat(values[i], c.h // c.n_kv_heads, axis=-3)
            heads, _ = mha_course.scaled_dot_product_attention(
                q, k_all, v_all, mask=causal_mask(T, k_all.shape[-2]))
            x = x + merge_heads(heads) @ attn.W_o
            x = x + mha_course.swiglu(rms_norm(x, P[f"L{i}.mlp_norm"], c.eps),
                                      P[f"L{i}.W_gate"], P[f"L{i}.W_up"], P[f"L{i}.W_down"])
        return rms_norm(x, P["norm_f"], c.eps) @ P["W_U"]

    seq = list(prompt)
    logits = run(np.array(prompt), 0)
    for _ in range(n_new):
        nxt = int(np.argmax(logits[-1]))
        seq.append(nxt)
        logits = run(np.array([nxt]), len(seq) - 1)
    return np.array(seq)


def _ov_circuit(E, W_v, W_o, W_U, head, h, kind="right"):
    d_k = W_o.shape[0] // h
    g = W_v.shape[1] // d_k
    kv = {"no_gqa": head, "modulo": head % g}.get(kind, head // (h // g))
    W_V = W_v[:, kv * d_k:(kv + 1) * d_k]
    if kind == "reshape":
        W_V = W_v.reshape(g, -1, d_k)[kv]
    o = kv if kind == "o_of_kv" else head
    OV = W_V @ W_o[o * d_k:(o + 1) * d_k]
    if kind == "transposed":
        OV = OV.T
    if kind == "no_unembedding":
        return E @ OV
    if kind == "no_embedding":
        return OV @ W_U
    M = E @ OV @ W_U
    return M.T if kind == "rows_cols" else M


CORRECT_09 = {
    "09.1": ("check_rms_norm_backward", _rms_backward),
    "09.2": ("check_swiglu_sublayer", _sublayer),
    "09.3": ("check_top_p", _top_p),
    "09.4": ("check_cached_sampling", _sample_cached),
    "09.5": ("check_decode_positions", _generate_greedy),
    "09.6": ("check_ov_circuit", _ov_circuit),
}


class TestContract(CheckContract):
    MODULE, CORRECT = lesson09, CORRECT_09


def _kind(f, kind):
    return lambda *a: f(*a, kind=kind)


MISTAKES = [
    ("rms-r-constant", "check_rms_norm_backward", _kind(_rms_backward, "r_constant"),
     r"r = 1/rms\(x\) depends on x too"),
    ("rms-layer-norm", "check_rms_norm_backward", _kind(_rms_backward, "layer_norm"),
     r"that is LayerNorm's backward"),
    ("rms-no-weight", "check_rms_norm_backward", _kind(_rms_backward, "no_weight"),
     r"the weight is missing"),
    ("rms-dw-unsummed", "check_rms_norm_backward", _kind(_rms_backward, "dw_unsummed"),
     r"sum grad_y · x̂ over every leading axis"),
    ("rms-dw-of-x", "check_rms_norm_backward", _kind(_rms_backward, "dw_of_x"),
     r"not x itself"),
    ("rms-calls-the-package", "check_rms_norm_backward",
     lambda g, x, w, eps: mha_course.block.rms_norm_backward(g, x, w, eps),
     r"asks you to write the backward pass yourself; your answer calls "
     r"mha_course\.block\.rms_norm_backward"),
    ("mlp-no-residual", "check_swiglu_sublayer", _kind(_sublayer, "no_residual"),
     r"the residual is missing"),
    ("mlp-post-norm", "check_swiglu_sublayer", _kind(_sublayer, "post_norm"), r"post-norm"),
    ("mlp-no-norm", "check_swiglu_sublayer", _kind(_sublayer, "no_norm"),
     r"the input was not normalised"),
    ("mlp-sigmoid-gate", "check_swiglu_sublayer", _kind(_sublayer, "sigmoid"),
     r"the original GLU"),
    ("mlp-relu", "check_swiglu_sublayer", _kind(_sublayer, "relu"), r"ReLU instead of SiLU"),
    ("mlp-gate-on-up", "check_swiglu_sublayer", _kind(_sublayer, "gate_on_up"),
     r"SiLU goes on the gate projection"),
    ("mlp-calls-swiglu", "check_swiglu_sublayer",
     lambda x, w, g, u, d, eps: x + mha_course.swiglu(rms_norm(x, w, eps), g, u, d),
     r"asks you to write SwiGLU yourself; your answer calls mha_course\.swiglu"),
    ("top-p-drops-crossing", "check_top_p", _kind(_top_p, "drop_crossing"),
     r"the token whose probability carries the sum across p was dropped"),
    ("top-p-cum-le", "check_top_p", _kind(_top_p, "cum_le"), r"cumsum <= p|carries the sum"),
    ("top-p-unsorted", "check_top_p", _kind(_top_p, "unsorted"),
     r"the tokens were not sorted by probability"),
    ("top-p-probabilities", "check_top_p", _kind(_top_p, "probabilities"),
     r"you returned probabilities"),
    ("top-p-calls-the-package", "check_top_p", lambda lg, p: sampling.top_p_filter(lg, p),
     r"your answer calls .*mha_course\.serving\.sampling\.top_p_filter"),
    ("cached-stale-logits", "check_cached_sampling", _kind(_sample_cached, "stale"),
     r"chosen from the logits of the step before"),
    ("cached-whole-sequence", "check_cached_sampling", _kind(_sample_cached, "whole_sequence"),
     r"pass model.step only the new tokens"),
    ("cached-new-only", "check_cached_sampling", _kind(_sample_cached, "new_only"),
     r"return the prompt followed by the n_new new tokens"),
    ("cached-calls-generate", "check_cached_sampling",
     lambda m, p, n, t, k, seed: m.generate(p, n, temperature=t, top_k=k, rng=seed),
     r"your answer calls .*generate"),
    ("positions-zero", "check_decode_positions", _kind(_generate_greedy, "zero"),
     r"cached == uncached.*every chunk is rotated as if it started at position 0"),
    ("positions-generated", "check_decode_positions", _kind(_generate_greedy, "generated"),
     r"the offset counts only the generated tokens"),
    ("positions-calls-step", "check_decode_positions",
     lambda m, p, n: m.generate(p, n, temperature=0),
     r"fix the colleague's loop, not replace it"),
    ("ov-o-of-kv-head", "check_ov_circuit", _kind(_ov_circuit, "o_of_kv"),
     r"W_O's slice of the wrong head"),
    ("ov-no-gqa", "check_ov_circuit", _kind(_ov_circuit, "no_gqa"),
     r"GQA: query head i reads K/V head i // \(h // g\)"),
    ("ov-modulo", "check_ov_circuit", _kind(_ov_circuit, "modulo"),
     r"not K/V head i or i % g"),
    ("ov-reshape", "check_ov_circuit", _kind(_ov_circuit, "reshape"),
     r"without a transpose mixes its rows"),
    ("ov-transposed", "check_ov_circuit", _kind(_ov_circuit, "transposed"),
     r"transposes swapped"),
    ("ov-rows-cols", "check_ov_circuit", _kind(_ov_circuit, "rows_cols"),
     r"rows and columns swapped"),
    ("ov-no-unembedding", "check_ov_circuit", _kind(_ov_circuit, "no_unembedding"),
     r"forgetting the unembedding"),
    ("ov-no-embedding", "check_ov_circuit", _kind(_ov_circuit, "no_embedding"),
     r"forgetting the embedding"),
]


@pytest.mark.parametrize(("name", "check", "fn", "match"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_named_mistake_is_recognised(name, check, fn, match):
    with pytest.raises(CheckFailed, match=match):
        getattr(checks, check)(fn)
