"""Checks for the exercises of lesson 08, learning (``solutions/08_learning.ipynb``).

The lesson is ``notebooks/08_learning.ipynb``; each ``check_*`` is called by an exercise's check
cell (see :mod:`mha_course.checks`). The references come from the package at check time:
:func:`mha_course.backward.softmax_jacobian`, :func:`mha_course.backward.attention_backward`,
:func:`mha_course.gradient_check`, :func:`mha_course.models.train.adam_step` and
:func:`mha_course.models.specialisation.pattern_score`; exercise 08.6's (a head with a learned
sink logit, which the package does not have) is :func:`sink_attention_grads` below, which
``tests/test_checks_lesson08.py`` checks against central differences.
"""

from __future__ import annotations

import math

import numpy as np

from .. import causal_mask, gradient_check, scaled_dot_product_attention, softmax
from ..backward import attention_backward, softmax_jacobian
from ..models.specialisation import pattern_score
from ..models.train import adam_step
from .harness import call, check_rng, compare, fail, fmt, fmt_shape, passed

__all__ = [
    "check_adam_step",
    "check_attention_grads",
    "check_find_bug",
    "check_previous_token_score",
    "check_sink_grads",
    "check_softmax_jacobian",
]


# ---------------------------------------------------------------------------------- 08.1
def check_softmax_jacobian(fn) -> None:
    """Exercise 08.1: ``softmax_jacobian(p)``: (..., S) -> (..., S, S), diag(p) − p pᵀ."""
    ex = "08.1"
    rng = check_rng(801)
    probes = [("p of shape (5,)", softmax(rng.normal(size=5))),
              ("a batch p of shape (2, 3, 4)", softmax(rng.normal(size=(2, 3, 4)))),
              ("a nearly one-hot p of shape (6,)", softmax(rng.normal(size=6) * 30))]
    for label, p in probes:
        want = softmax_jacobian(p)
        got = call(ex, fn, (p.copy(),), ("p",),
                   forbid={"mha_course.backward.softmax_jacobian": "write the Jacobian "
                           "yourself"})
        eye = np.eye(p.shape[-1])
        outer = p[..., :, None] * p[..., None, :]

        def rows_sum_to_zero(arr, label=label):
            sums = arr.sum(axis=-1)
            if not np.allclose(sums, 0, atol=1e-9):
                i = np.unravel_index(int(np.argmax(np.abs(sums))), sums.shape)
                raise fail(ex, f"{label}: row {i[-1]} of your Jacobian sums to {fmt(sums[i])}, "
                               "not 0. The weights always sum to 1, so raising one score "
                               "moves the others down by as much: each row of J sums to 0")

        compare(
            ex, got, want, f"your Jacobian for {label}", "(..., S, S)",
            variants=[
                ("only diag(p): the off-diagonal entries are −p_i·p_j (raising score j "
                 "lowers every other weight)", lambda p=p, eye=eye: p[..., :, None] * eye),
                ("only the diagonal p_i(1 − p_i): the off-diagonal entries −p_i·p_j are "
                 "missing", lambda p=p, eye=eye, o=outer: (p[..., :, None] - o) * eye),
                ("diag(p) is missing: J = diag(p) − p pᵀ", lambda o=outer: -o),
                ("the sign is flipped: J = diag(p) − p pᵀ, not p pᵀ − diag(p)",
                 lambda p=p, eye=eye, o=outer: o - p[..., :, None] * eye),
            ],
            shape_hints={(p.size, p.size): "np.outer flattens its inputs, so a batch gives "
                                           "one (N, N) matrix: use p[..., :, None] * "
                                           "p[..., None, :] for p pᵀ row by row"}
            if p.ndim > 1 else None,
            props=[rows_sum_to_zero],
        )
    passed(ex, "diag(p) − p pᵀ matches mha_course.backward.softmax_jacobian for p (5,), a batch "
               "(2, 3, 4) and a nearly one-hot p; every row sums to 0")


# ---------------------------------------------------------------------------------- 08.2
def _grads_variant(q, k, v, grad_out, softmax_step="full", scale="divide"):
    d_k = q.shape[-1]
    _, weights = scaled_dot_product_attention(q, k, v)
    dweights = grad_out @ v.T
    if softmax_step == "full":
        dscores = weights * (dweights - (dweights * weights).sum(-1, keepdims=True))
    elif softmax_step == "diagonal":
        dscores = weights * dweights
    else:
        dscores = dweights
    factor = {"divide": 1 / math.sqrt(d_k), "none": 1.0, "multiply": math.sqrt(d_k),
              "d_k": 1 / d_k}[scale]
    return dscores @ k * factor, weights.T @ grad_out


def check_attention_grads(fn) -> None:
    """Exercise 08.2: ``attention_grads(q, k, v, grad_out) -> (dq, dv)`` for one head."""
    ex = "08.2"
    rng = check_rng(802)
    for T, S, d_k, d_v in ((3, 5, 4, 6), (4, 2, 7, 3)):
        q, k = rng.normal(size=(T, d_k)), rng.normal(size=(S, d_k))
        v, grad_out = rng.normal(size=(S, d_v)), rng.normal(size=(T, d_v))
        _, weights = scaled_dot_product_attention(q, k, v)
        want_dq, _, want_dv = attention_backward(grad_out, q, k, v, weights)
        got = call(ex, fn, (q, k, v, grad_out), ("q", "k", "v", "grad_out"),
                   forbid={"mha_course.backward.attention_backward": "write dV and dQ "
                           "yourself", "mha_course.backward.backward": "write dV and dQ "
                           "yourself", "mha_course.MultiHeadAttention.backward": "write dV and "
                           "dQ yourself"})
        if not isinstance(got, tuple) or len(got) != 2:
            raise fail(ex, f"your function returned {type(got).__name__}; expected a tuple "
                           "(dq, dv)")
        if np.shape(got[0]) == (S, d_v) and np.shape(got[1]) == (T, d_k):
            raise fail(ex, "you returned (dv, dq); return (dq, dv) in that order")
        label = f"for T={T}, S={S}, d_k={d_k}, d_v={d_v}"
        compare(ex, got[1], want_dv, f"your dv {label}", "(S, d_v)",
                shape_hints={(T, d_v): "dv has one row per key: it is weightsᵀ @ grad_out, "
                                       "(S, T) @ (T, d_v)"})

        def var(q=q, k=k, v=v, grad_out=grad_out, **kw):
            return lambda: _grads_variant(q, k, v, grad_out, **kw)[0]

        compare(
            ex, got[0], want_dq, f"your dq {label}", "(T, d_k)",
            variants=[
                ("the 1/√d_k of the scores is missing: scores = q kᵀ/√d_k, so dq = dscores "
                 "@ k / √d_k", var(scale="none")),
                ("you multiplied by √d_k; the scores divide by it, and so does dq",
                 var(scale="multiply")),
                ("you divided by d_k instead of √d_k", var(scale="d_k")),
                ("only the diagonal of the softmax's Jacobian: dscores = weights * (dweights − "
                 "Σ_s dweights·weights), subtract each row's weighted sum",
                 var(softmax_step="diagonal")),
                ("the softmax was skipped: dscores is not dweights; go through the Jacobian "
                 "diag(p) − p pᵀ", var(softmax_step="none")),
            ],
            shape_hints={(T, d_v): "dq = dscores @ k, (T, S) @ (S, d_k): you multiplied by v",
                         (S, d_k): "dq has one row per query: dscores @ k, not dscoresᵀ @ q "
                                   "(that is dk)"},
        )
    passed(ex, "dq and dv match mha_course.backward.attention_backward for (T, S, d_k, d_v) = "
               "(3, 5, 4, 6) and (4, 2, 7, 3)")


# ---------------------------------------------------------------------------------- 08.3
def _attention_loss(which, q, k, v, G):
    """f(x) -> (loss, grad) of loss = Σ out·G with respect to q, k or v, by the package."""

    def f(x):
        args = {"q": q, "k": k, "v": v, which: x}
        out, weights = scaled_dot_product_attention(args["q"], args["k"], args["v"],
                                                    mask=causal_mask(len(q)))
        grads = attention_backward(G, args["q"], args["k"], args["v"], weights)
        return float(np.sum(out * G)), grads["qkv".index(which)]

    return f


def _bugged(f, bug):
    def g(x):
        loss, grad = f(x)
        return loss, bug(grad, x)

    return g


def _bug_cases(rng):
    """Lists of candidates (name, f, x): f(x) -> (loss, grad); exactly one grad is wrong."""
    T, d_k, d_v = 4, 3, 5
    q, k, v = rng.normal(size=(T, d_k)), rng.normal(size=(T, d_k)), rng.normal(size=(T, d_v))
    G = rng.normal(size=(T, d_v))
    fq, fk, fv = (_attention_loss(w, q, k, v, G) for w in "qkv")
    x = rng.normal(size=(3, 4))

    def fsin(z):
        return float(np.sum(np.sin(z) * z)), np.cos(z) * z + np.sin(z)

    def fsq(z):
        return float(np.sum(z**2) / 2), z

    bugs = [
        ("dk", "the gradient of k is scaled by √d_k twice",
         [("dq", fq, q), ("dk", _bugged(fk, lambda g, x: g / math.sqrt(d_k)), k),
          ("dv", fv, v), ("x sin x", fsin, x)]),
        ("x sin x", "the product rule lost a term: d(x sin x)/dx = sin x + x cos x",
         [("dv", fv, v), ("x sin x", _bugged(fsin, lambda g, z: np.cos(z) * z), x),
          ("x²/2", fsq, x), ("dq", fq, q)]),
        ("dv", "a small bug: dv is 1% too large",
         [("dq", fq, q), ("x²/2", fsq, x), ("dk", fk, k),
          ("dv", _bugged(fv, lambda g, x: g * 1.01), v)]),
    ]
    return bugs


def check_find_bug(fn) -> None:
    """Exercise 08.3: ``find_bug(candidates) -> name`` of the one gradient that is wrong.

    ``candidates`` is a list of ``(name, f, x)``: ``f(x) -> (loss, grad)``.
    """
    ex = "08.3"
    rng = check_rng(803)
    for want, what, candidates in _bug_cases(rng):
        errors = {name: gradient_check(f, x, eps=1e-5) for name, f, x in candidates}
        got = call(ex, fn, (candidates,), ("candidates",),
                   forbid={"mha_course.gradient_check": "write the gradient check yourself",
                           "mha_course.backward.gradient_check": "write the gradient check "
                           "yourself"})
        names = ", ".join(repr(name) for name, _, _ in candidates)
        if got is None:
            raise fail(ex, "your function returned None instead of a name: did you forget "
                           "`return`?")
        if got not in errors:
            raise fail(ex, f"your function returned {got!r}; expected one of the names {names}")
        if got != want:
            raise fail(
                ex,
                f"among {names} you named {got!r}, whose gradient is right (relative error "
                f"{errors[got]:.1e} by central differences); the wrong one is {want!r} "
                f"({what}: relative error {errors[want]:.1e}). Likely mistake: compare "
                "(f(x + eps·e_i) − f(x − eps·e_i)) / (2·eps) with the analytic gradient for "
                "EVERY element i, and take each candidate's worst relative error")
    passed(ex, "found the wrong gradient among 4 candidates three times (k scaled twice, a "
               "lost product-rule term, dv 1% too large)")


# ---------------------------------------------------------------------------------- 08.4
def _adam_variant(param, grad, m, v, t, lr, beta1, beta2, eps, kind):
    if kind == "sgd":
        return param - lr * grad, m, v
    if kind == "swapped":
        m = beta1 * grad + (1 - beta1) * m
        v = beta2 * grad**2 + (1 - beta2) * v
    else:
        m = beta1 * m + (1 - beta1) * grad
        v = beta2 * v + (1 - beta2) * (np.abs(grad) if kind == "abs" else grad**2)
    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
    if kind == "no_correction":
        m_hat, v_hat = m, v
    if kind == "eps_inside":
        return param - lr * m_hat / np.sqrt(v_hat + eps), m, v
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def check_adam_step(fn) -> None:
    """Exercise 08.4: ``adam_step(param, grad, m, v, t, lr, beta1, beta2, eps)``."""
    ex = "08.4"
    rng = check_rng(804)
    probes = [((3,), 1, 0.1, 0.9, 0.999, 1e-8), ((2, 4), 5, 0.01, 0.8, 0.99, 1e-8),
              ((5,), 3, 0.05, 0.9, 0.999, 1e-2)]
    for shape, t, lr, beta1, beta2, eps in probes:
        param, grad = rng.normal(size=shape), rng.normal(size=shape)
        m = np.zeros(shape) if t == 1 else rng.normal(size=shape) * 0.1
        v = np.zeros(shape) if t == 1 else rng.random(size=shape) * 0.1
        args = (param, grad, m, v, t, lr, beta1, beta2, eps)
        want = adam_step(*args)
        got = call(ex, fn, args, ("param", "grad", "m", "v", "t", "lr", "beta1", "beta2", "eps"),
                   forbid={"mha_course.models.train.adam_step": "write the Adam update yourself",
                           "mha_course.models.train.Adam": "write the Adam update yourself"})
        if not isinstance(got, tuple) or len(got) != 3:
            raise fail(ex, f"your function returned {type(got).__name__}; expected a tuple "
                           "(param, m, v) of new arrays")
        label = f"at t={t} for shape {fmt_shape(shape)} (lr={lr}, β1={beta1}, β2={beta2}, ε={eps})"

        def var(kind, args=args):
            return lambda: _adam_variant(*args, kind=kind)

        variants = [
            ("β1 and β2 are swapped with 1 − β: m = β1·m + (1 − β1)·grad keeps most of the "
             "old moment", var("swapped")),
            ("v must average grad², not |grad|", var("abs")),
        ]
        compare(ex, got[1], want[1], f"your m {label}", "shape of param",
                variants=[(msg, lambda mk=mk: mk()[1]) for msg, mk in variants])
        compare(ex, got[2], want[2], f"your v {label}", "shape of param",
                variants=[(msg, lambda mk=mk: mk()[2]) for msg, mk in variants])
        compare(
            ex, got[0], want[0], f"your new param {label}", "shape of param",
            variants=[(msg, lambda mk=mk: mk()[0]) for msg, mk in [
                ("no bias correction: divide m by (1 − β1ᵗ) and v by (1 − β2ᵗ); at the start "
                 "both moments are biased towards their zero initial value",
                 var("no_correction")),
                ("ε belongs outside the square root: lr·m̂ / (√v̂ + ε)", var("eps_inside")),
                ("this is plain gradient descent, param − lr·grad: Adam divides the averaged "
                 "gradient m̂ by √v̂", var("sgd")),
            ]],
        )
    passed(ex, "param, m and v match mha_course.models.train.adam_step at t = 1, 3 and 5, with "
               "three settings of lr, β1, β2 and ε")


# ---------------------------------------------------------------------------------- 08.5
def _causal_weights(rng, h, T, sharp=1.0):
    scores = rng.normal(size=(h, T, T)) * sharp
    return softmax(scores, mask=np.broadcast_to(causal_mask(T), (h, T, T)))


def check_previous_token_score(fn) -> None:
    """Exercise 08.5: ``previous_token_score(weights)``: (h, T, T) -> (h,)."""
    ex = "08.5"
    rng = check_rng(805)
    perfect = np.stack([np.eye(6, k=-1), np.eye(6)])  # head 0: previous token; head 1: itself
    perfect[0, 0, 0] = 1.0  # query 0 has only itself to attend to
    probes = [("random causal weights (2, 5, 5)", _causal_weights(rng, 2, 5)),
              ("random causal weights (3, 7, 7)", _causal_weights(rng, 3, 7, sharp=3.0)),
              ("a previous-token head and a diagonal head (2, 6, 6)", perfect)]
    for label, weights in probes:
        h, T, _ = weights.shape
        keys = np.arange(-1, T - 1)[None]  # query t -> key t - 1; query 0 not counted
        want = pattern_score(weights[None], keys)
        got = call(ex, fn, (weights.copy(),), ("weights",))

        def in_unit_interval(arr, label=label):
            if (arr < -1e-12).any() or (arr > 1 + 1e-9).any():
                i = int(np.argmax((arr < 0) | (arr > 1)))
                raise fail(ex, f"{label}: your score of head {i} is {fmt(arr[i])}; a score is "
                               "a mean of weights, between 0 and 1: take the mean over the "
                               "queries, not the sum")

        compare(
            ex, got, want, f"your scores for {label}", "(h,)",
            variants=[
                ("that is the weight on the token itself (the diagonal); the previous token "
                 "of query t is key t − 1", lambda w=weights: np.diagonal(w, axis1=1, axis2=2)
                 [:, 1:].mean(-1)),
                ("query 0 has no previous token, so leave it out: average over t = 1 … T − 1 "
                 "(you divided by T)", lambda w=weights, T=T:
                 np.diagonal(w, offset=-1, axis1=1, axis2=2).sum(-1) / T),
                ("a sum, not a mean: divide by the T − 1 queries that have a previous token",
                 lambda w=weights: np.diagonal(w, offset=-1, axis1=1, axis2=2).sum(-1)),
                ("you read the weights as (key, query): rows are queries, so the previous "
                 "token of query t is weights[:, t, t − 1]",
                 lambda w=weights: np.diagonal(w, offset=1, axis1=1, axis2=2).mean(-1)),
            ],
            shape_hints={(): "one score per head: average over the queries only, not over "
                             "the heads too", (1,): "one score per head, shape (h,)",
                         (T - 1,): "one score per head: you averaged over the heads instead "
                                   "of over the queries", (h, T - 1): "average the weights "
                                                                       "on t − 1 over the "
                                                                       "queries (axis -1)"},
            props=[in_unit_interval],
        )
    passed(ex, "previous-token scores match mha_course.models.specialisation.pattern_score for "
               "random weights (2, 5, 5) and (3, 7, 7), and are exactly 1 and 0 for a "
               "previous-token head and a diagonal head")


# ---------------------------------------------------------------------------------- 08.6
def sink_attention_grads(q, k, v, b, grad_out, kind="right"):
    """(dq, db) of one head with a learned sink logit ``b`` (gpt-oss, deep dive 06b §2).

    weights = the first S entries of softmax([q kᵀ/√d_k, b]) row by row, out = weights @ v (the
    sink has no value); L with dL/dout = ``grad_out``. ``kind`` gives the known wrong versions
    the check names: ``"no_sink"`` (plain attention: the sink left out, or the weights rescaled
    to sum to 1 over the keys, which is the same), ``"db_sign"``, ``"db_per_query"`` (not
    summed over the queries).
    """
    d_k = q.shape[-1]
    scores = q @ k.T / math.sqrt(d_k)  # (T, S)
    m = np.maximum(scores.max(axis=-1), b if kind != "no_sink" else -np.inf)  # (T,)
    e = np.exp(scores - m[:, None])  # (T, S)
    e_sink = np.exp(b - m) if kind != "no_sink" else np.zeros(len(q))  # (T,)
    total = e.sum(axis=-1) + e_sink
    p, p_sink = e / total[:, None], e_sink / total  # (T, S), (T,): [p, p_sink] rows sum to 1
    D = np.sum(grad_out * (p @ v), axis=-1)  # (T,): Σ_s p·dp = dO_t · out_t, as in deep dive 08a §4
    dscores = p * (grad_out @ v.T - D[:, None])  # the sink's own dp is 0: it has no value
    db = -p_sink * D  # (T,): the sink's score, through the same Jacobian
    db = {"db_sign": -db.sum(), "db_per_query": db}.get(kind, db.sum())
    return dscores @ k / math.sqrt(d_k), db


def check_sink_grads(fn) -> None:
    """Exercise 08.6: ``sink_attention_grads(q, k, v, b, grad_out) -> (dq, db)``."""
    ex = "08.6"
    rng = check_rng(806)
    for T, S, d_k, d_v, b in ((3, 5, 4, 6, 0.5), (4, 2, 7, 3, -1.5), (2, 6, 3, 4, 3.0)):
        q, k = rng.normal(size=(T, d_k)), rng.normal(size=(S, d_k))
        v, grad_out = rng.normal(size=(S, d_v)), rng.normal(size=(T, d_v))
        want_dq, want_db = sink_attention_grads(q, k, v, b, grad_out)
        got = call(ex, fn, (q.copy(), k.copy(), v.copy(), b, grad_out.copy()),
                   ("q", "k", "v", "b", "grad_out"))
        if not isinstance(got, tuple) or len(got) != 2:
            raise fail(ex, f"your function returned {type(got).__name__}; expected a tuple "
                           "(dq, db)")
        label = f"for T={T}, S={S}, d_k={d_k}, d_v={d_v}, b={b}"

        def var(kind, i, q=q, k=k, v=v, b=b, grad_out=grad_out):
            return lambda: sink_attention_grads(q, k, v, b, grad_out, kind)[i]

        no_sink = ("that is plain attention's gradient (weights that sum to 1 over the keys, "
                   "whether e^b was left out or the weights were rescaled): the sink's e^b "
                   "belongs in every row's denominator, so the weights on the keys sum to "
                   "1 − p_sink")
        compare(ex, got[0], want_dq, f"your dq {label}", "(T, d_k)",
                variants=[(no_sink, var("no_sink", 0))],
                shape_hints={(S, d_k): "dq has one row per query: dscores @ k / √d_k, "
                                       "(T, S) @ (S, d_k)"})
        compare(ex, got[1], want_db, f"your db {label}", "a number",
                variants=[("the sign is flipped: raising b moves weight to the sink, which "
                           "carries nothing, so db_t = p_sink,t · (0 − D_t)",
                           var("db_sign", 1)),
                          (no_sink, var("no_sink", 1))],
                shape_hints={(T,): "b is one number shared by every query of the head: sum "
                                   "the T queries' contributions", (1,): "return db as a "
                                                                        "number, not an array"})
    passed(ex, "dq and db match the reference for (T, S, d_k, d_v) = (3, 5, 4, 6), "
               "(4, 2, 7, 3) and (2, 6, 3, 4), with b = 0.5, −1.5 and 3.0 (a sink that takes "
               "most of the weight)")
