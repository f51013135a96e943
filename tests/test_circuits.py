"""Deep dive 09c (``notebooks/deep_dives/09c_heads_as_circuits.ipynb``): heads as circuits, and
the backward pass's FLOPs.

The equivalences it asserts, tested here: a head's score is ``x_t W_Q R(-Δ) W_Kᵀ x_sᵀ`` (RoPE's
offset between the two circuits' halves) and its output ``Σ_h A^h X W_V W_O^h``; block 0 of the
shipped model is exactly a (head, token, token, offset) table; what the weights say each block-0
head does (the line-break key, the own-token preference, no copying, bigram-like writes); and the
matmul FLOPs of the package's backward, counted by recompiling ``@`` into a counter: exactly 2x
the forward for the layer, 2.5x for attention's part when P is recomputed, 2x plus the two
products ``swiglu_backward`` recomputes for the GPT.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import math
import textwrap

import numpy as np
import pytest

import mha_course
import mha_course.models.gpt
from mha_course import MultiHeadAttention, apply_rope, attention_flops, causal_mask, rms_norm
from mha_course.backward import attention_backward
from mha_course.models import corpus, shakespeare
from mha_course.models.gpt import GPT, GPTConfig
from mha_course.softmax import softmax

# ------------------------------------------------------------------------- the FLOP counter
MATMULS: list[int] = []


def counted_matmul(a, b):
    out = np.matmul(a, b)
    MATMULS.append(2 * np.shape(a)[-1] * out.size)
    return out


class _AtToCall(ast.NodeTransformer):
    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.MatMult):
            return ast.Call(ast.Name("counted_matmul", ast.Load()), [node.left, node.right], [])
        return node


@contextlib.contextmanager
def counting(*modules):
    """Every ``@`` in the modules' functions counts into MATMULS; restored on exit."""
    saved = []
    try:
        for module in modules:
            module.counted_matmul = counted_matmul
            funcs = [f for f in vars(module).values() if inspect.isfunction(f)]
            funcs += [f for cls in vars(module).values() if inspect.isclass(cls)
                      and cls.__module__ == module.__name__ for f in vars(cls).values()
                      if inspect.isfunction(f)]
            for f in funcs:
                if f.__code__.co_filename != module.__file__:
                    continue
                tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
                if not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult)
                           for n in ast.walk(tree)):
                    continue
                tree.body[0].decorator_list = []
                ns: dict = {}
                exec(compile(ast.fix_missing_locations(_AtToCall().visit(tree)),
                             module.__file__, "exec"), vars(module), ns)
                saved.append((f, f.__code__))
                f.__code__ = ns[f.__name__].__code__
        yield
    finally:
        for f, code in saved:
            f.__code__ = code
        MATMULS.clear()


MODULES = (mha_course.heads, mha_course.attention, mha_course.backward, mha_course.block,
           mha_course.models.gpt)


def _flops(run):
    MATMULS.clear()
    result = run()
    return sum(MATMULS), len(MATMULS), result


def test_the_counter_restores_the_package_and_counts_nothing_outside():
    before = mha_course.backward.backward.__code__
    with counting(*MODULES):
        assert mha_course.backward.backward.__code__ is not before
    assert mha_course.backward.backward.__code__ is before
    MultiHeadAttention(8, 2, rng=0)(np.ones((3, 8)))
    assert MATMULS == []


@pytest.mark.parametrize(("g", "rope"), [(2, "half"), (4, None), (1, "interleaved")])
def test_the_layer_backward_is_exactly_twice_the_forward(g, rope):
    B, T, d, h = 2, 16, 24, 4
    layer = MultiHeadAttention(d, h, rng=0, n_kv_heads=g, rope=rope)
    x = np.random.default_rng(0).normal(size=(B, T, d))
    with counting(*MODULES):
        fwd, n_fwd, (out, saved) = _flops(
            lambda: layer.forward(x, mask=causal_mask(T), return_cache=True))
        bwd, n_bwd, _ = _flops(lambda: layer.backward(np.ones_like(out), saved))
    assert fwd == B * attention_flops(T, d, h, n_kv_heads=g)["total"]
    assert (n_fwd, n_bwd, bwd) == (6, 12, 2 * fwd)


def test_recomputing_p_as_flashattention_does_costs_2_5x_attentions_forward():
    rng = np.random.default_rng(1)
    B, h, T, dk = 2, 3, 10, 4
    q, k, v, dout = (rng.normal(size=(B, h, T, dk)) for _ in range(4))
    mask = causal_mask(T)
    s = np.where(mask, q @ np.swapaxes(k, -1, -2) / math.sqrt(dk), -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    weights = softmax(s)
    with counting(*MODULES):
        plain, _, g_plain = _flops(lambda: attention_backward(dout, q, k, v, weights))

        def flash():
            sc = counted_matmul(q, np.swapaxes(k, -1, -2)) / math.sqrt(dk)
            p = np.where(mask, np.exp(sc - lse[..., None]), 0.0)
            return attention_backward(dout, q, k, v, p)

        recomputed, n, g_flash = _flops(flash)
    forward = 2 * (2 * B * h * T * T * dk)                     # scores and weighted sum
    assert plain == 2 * forward and 2 * recomputed == 5 * forward and n == 5
    for a, b in zip(g_plain, g_flash, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_the_gpt_backward_is_twice_the_forward_plus_the_swiglu_recomputation():
    c = GPTConfig(vocab_size=11, d_model=16, n_layers=2, h=4, n_kv_heads=2, context_length=32)
    model = GPT(c, rng=0)
    B, T = 2, 12
    tokens = np.random.default_rng(2).integers(0, c.vocab_size, size=(B, T))
    with counting(*MODULES):
        fwd, _, (logits, cache) = _flops(lambda: model.forward(tokens, return_cache=True))
        bwd, _, grads = _flops(lambda: model.backward(np.ones(logits.shape), cache))
    attn = attention_flops(T, c.d_model, c.h, n_kv_heads=c.n_kv_heads)["total"]
    mlp = 6 * T * c.d_model * c.d_ff                                   # SwiGLU's 3 products
    closed = B * (c.n_layers * (attn + mlp) + 2 * T * c.d_model * c.vocab_size)
    assert fwd == closed
    assert bwd == 2 * fwd + B * c.n_layers * 2 * (2 * T * c.d_model * c.d_ff)
    ref_logits, ref_cache = model.forward(tokens, return_cache=True)   # the counter changed nothing
    ref = model.backward(np.ones(ref_logits.shape), ref_cache)
    assert all(np.array_equal(grads[k], ref[k]) for k in ref)


# ------------------------------------------------------------------------------ the circuits
def test_scores_and_outputs_through_the_two_circuits_equal_the_layers():
    rng = np.random.default_rng(3)
    d, h, g, T = 16, 4, 2, 9
    layer = MultiHeadAttention(d, h, rng=4, n_kv_heads=g, rope="half")
    x = rng.normal(size=(T, d))
    out, w = layer(x, mask=causal_mask(T))
    per = layer.per_head()
    for i in range(h):
        q, k = x @ per["W_q"][i], x @ per["W_k"][i // (h // g)]
        rotated = apply_rope(q) @ apply_rope(k).T
        for t in range(T):
            for s in range(t + 1):
                assert np.isclose(q[t] @ apply_rope(k[s:s + 1], np.array([s - t]))[0],
                                  rotated[t, s])
        np.testing.assert_allclose(x @ (per["W_q"][i] @ per["W_k"][i // (h // g)].T) @ x.T,
                                   q @ k.T, atol=1e-12)
    W_OV = [per["W_v"][i // (h // g)] @ per["W_o"][i] for i in range(h)]
    np.testing.assert_allclose(sum(w[i] @ x @ W_OV[i] for i in range(h)), out, atol=1e-12)


@pytest.fixture(scope="module")
def shipped():
    model, tok = shakespeare.load_shakespeare_gpt()
    m64 = model.astype(np.float64)
    c, P = m64.config, m64.parameters()
    per = m64.blocks[0].attn.per_head()
    kv = [i // (c.h // c.n_kv_heads) for i in range(c.h)]
    E0 = rms_norm(P["W_E"], P["L0.attn_norm"], c.eps)
    T = 64
    table = np.empty((c.h, c.vocab_size, c.vocab_size, T))
    for i in range(c.h):
        k_rot = apply_rope(np.repeat((E0 @ per["W_k"][kv[i]])[:, None], T, axis=1),
                           -np.arange(T))
        table[i] = np.einsum("ad,bjd->abj", E0 @ per["W_q"][i], k_rot) / math.sqrt(c.d_k)
    train_ids, val_ids = corpus.split(tok.encode(corpus.load_text()))
    return m64, tok, table, train_ids, val_ids, kv


def test_block_0_of_the_shipped_model_is_exactly_its_token_token_offset_table(shipped):
    m64, _, table, _, val_ids, _ = shipped
    T = table.shape[-1]
    x = corpus.eval_windows(val_ids, T)[0][:3]
    weights = m64.attention_weights(x)[0]
    dlt = np.arange(T)[:, None] - np.arange(T)[None, :]
    for n in range(3):
        sc = table[:, x[n][:, None], x[n][None, :], np.clip(dlt, 0, None)]
        np.testing.assert_allclose(softmax(np.where(dlt >= 0, sc, -np.inf)), weights[n],
                                   atol=1e-12)


def test_what_the_weights_say_block_0s_heads_do(shipped):
    m64, tok, table, train_ids, _, kv = shipped
    c, P = m64.config, m64.parameters()
    V = c.vocab_size
    p = np.bincount(train_ids, minlength=V) / len(train_ids)
    key_pref = np.einsum("a,iabj->ib", p, table[..., 1:21])
    nl = tok.chars.index("\n")
    assert int(np.argmax(key_pref[:, nl] - (key_pref * p).sum(-1))) == 3   # L0H3: line breaks
    assert int(np.argmax(key_pref[3])) == nl
    same = [np.mean([table[i, a, a, 0] for a in range(V) if p[a] > 1e-3])
            - p @ table[i, :, :, 0] @ p for i in range(c.h)]
    assert int(np.argmax(same)) == 0                                        # L0H0: its own token
    assert same[1] < 0 and same[2] < 0                     # L0H1, L0H2: off their own token
    S_pos = np.einsum("a,b,iabj->ij", p, p, table)
    assert np.isin(S_pos.argmax(1), (0, 1)).all()                           # near keys
    assert (S_pos[:, 1] < S_pos[:, 0]).all()               # RoPE alone: no previous-token pull
    # OV: no head copies; every block-0 head writes bigram-like predictions
    U = P["norm_f"][:, None] * P["W_U"]
    frequent = np.bincount(train_ids, minlength=V) > 1000
    n = np.ones((V, V))
    np.add.at(n, (train_ids[:-1], train_ids[1:]), 1)
    bigram = np.log(n / n.sum(1, keepdims=True))
    bigram = (bigram - bigram.mean(1, keepdims=True))[frequent]
    for b in range(c.n_layers):
        per = m64.blocks[b].attn.per_head()
        E = rms_norm(P["W_E"], P[f"L{b}.attn_norm"], c.eps)
        for i in range(c.h):
            M = E @ per["W_v"][kv[i]] @ per["W_o"][i] @ U
            eig = np.linalg.eigvals(M)
            assert eig.real.sum() / np.abs(eig).sum() < 0.3
            assert np.mean(M.argmax(1)[frequent] == np.arange(V)[frequent]) <= 0.05
            r = np.corrcoef((M - M.mean(1, keepdims=True))[frequent].ravel(), bigram.ravel())[0, 1]
            assert r > 0.2 if b == 0 else abs(r) < 0.1
