"""A tiny attention-only transformer in NumPy, with its loss and its backward pass.

Taught in ``notebooks/08_learning.ipynb``.

``tokens (B, T) -> x = W_E[tokens] + W_P[:T]`` (token and learned position embeddings), then
``n_layers`` times ``x = x + attention(x)`` (a :class:`~mha_course.MultiHeadAttention` with a
causal mask, added to the residual stream), then ``logits = x @ W_U`` (the unembedding). No MLP,
no LayerNorm: an attention-only model, as in Elhage et al. (2021), "A Mathematical Framework
for Transformer Circuits", whose two-layer version learns induction heads.

The backward pass reuses each layer's own: ``layer.forward(..., return_cache=True)`` keeps the
saved activations and ``layer.backward`` turns dLoss/dout into dLoss/dx and the parameters'
gradients; the residual connection adds the gradient that flows around the layer to the one
that flows through it. Heads are numbered from 0, as ``L1H2`` = layer 1, head 2.
"""

from __future__ import annotations

import numpy as np

from .._validate import fail, fmt_shape, validate_positive_int
from ..attention import causal_mask
from ..multihead import MultiHeadAttention
from ..softmax import log_softmax

__all__ = ["TinyTransformer", "accuracy", "cross_entropy", "head_label", "token_losses"]


def head_label(layer: int, head: int) -> str:
    """``"L1H2"``: layer 1, head 2 (both counted from 0).

    Examples
    --------
    >>> head_label(0, 3)
    'L0H3'
    """
    return f"L{layer}H{head}"


def cross_entropy(logits, targets, weights=None) -> tuple[float, np.ndarray]:
    """Mean cross-entropy over the scored positions, and its gradient with respect to the logits.

    ``loss = Σ w · (−log softmax(logits)[target]) / Σ w``; its gradient is
    ``w · (softmax(logits) − onehot(target)) / Σ w``. The one cross-entropy of the models wing
    (the tiny model, the GPTs, their fast path and lesson 09's per-head losses).

    Parameters
    ----------
    logits : ndarray of float, shape (..., V)
        (B, T, V) for a batch of sequences; any leading axes.
    targets : ndarray of int, shape (...)
        Each in ``0 .. V-1``.
    weights : ndarray of float, shape (...), optional
        1 where a position is scored, 0 elsewhere (at least one must be positive); every
        position is scored when omitted.

    Returns
    -------
    loss : float
    dlogits : ndarray, shape (..., V)

    Raises
    ------
    ValueError
        If the shapes disagree, a target is not an integer in ``0 .. V-1``, or no position is
        scored.

    Examples
    --------
    >>> loss, dlogits = cross_entropy(np.zeros((1, 2, 4)), np.array([[1, 3]]), np.ones((1, 2)))
    >>> round(loss, 4), dlogits.shape  # uniform over 4 classes: log 4
    (1.3863, (1, 2, 4))
    """
    func = "cross_entropy"
    logits, targets = _logits_and_targets(func, logits, targets)
    weights = np.ones(targets.shape) if weights is None else np.asarray(weights)
    if weights.shape != targets.shape:
        raise fail(func, f"logits {logits.shape}, targets {targets.shape}, weights "
                         f"{weights.shape}; expected (..., V), (...), (...)")
    total = weights.sum()
    if not total > 0:
        raise fail(func, "weights has no positive entry: no position is scored")
    logp = log_softmax(logits)  # (..., V)
    loss = float((weights * _picked_losses(logp, targets)).sum() / total)
    dlogits = np.exp(logp)  # softmax, (..., V)
    np.put_along_axis(dlogits, targets[..., None],
                      np.take_along_axis(dlogits, targets[..., None], axis=-1) - 1, axis=-1)
    dlogits *= (weights / total)[..., None]  # unscored positions get no gradient
    return loss, dlogits


def token_losses(logits, targets) -> np.ndarray:
    """The cross-entropy of every target, ``−log softmax(logits)[target]`` in nats: the terms
    :func:`cross_entropy` averages, shape (...) for logits (..., V) and targets (...).

    Examples
    --------
    >>> token_losses(np.log([[0.5, 0.25, 0.25]]), np.array([1])).round(4).tolist()
    [1.3863]
    """
    logits, targets = _logits_and_targets("token_losses", logits, targets)
    return _picked_losses(log_softmax(logits), targets)


def _logits_and_targets(func, logits, targets) -> tuple[np.ndarray, np.ndarray]:
    """``logits`` (..., V) and integer ``targets`` (...) in ``0 .. V-1``, checked, as arrays."""
    logits, targets = np.asarray(logits), np.asarray(targets)
    if logits.ndim < 1 or targets.shape != logits.shape[:-1]:
        raise fail(func, f"logits has shape {fmt_shape(logits.shape)} and targets "
                         f"{fmt_shape(targets.shape)}; expected (..., V) and (...)")
    if targets.dtype.kind not in "iu" or (targets.size and not (
            0 <= targets.min() and targets.max() < logits.shape[-1])):
        raise fail(func, f"targets must be integers in 0 .. {logits.shape[-1] - 1} (V = "
                         f"{logits.shape[-1]}); got dtype {targets.dtype}"
                         + (f", range {targets.min()} .. {targets.max()}" if targets.size else ""))
    return logits, targets


def _picked_losses(logp, targets) -> np.ndarray:
    """``−logp[..., target]``: (..., V) log-probabilities, (...) targets -> (...)."""
    return -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def accuracy(logits, targets, weights) -> float:
    """The fraction of scored positions whose largest logit is the target.

    Examples
    --------
    >>> accuracy(np.eye(3)[None], np.array([[0, 2, 2]]), np.ones((1, 3)))
    0.6667
    """
    hit = np.asarray(logits).argmax(axis=-1) == targets  # (B, T)
    return round(float((hit * weights).sum() / np.sum(weights)), 4)


class TinyTransformer:
    """Token and position embeddings, ``n_layers`` causal attention layers, an unembedding.

    Parameters
    ----------
    vocab_size : int
        Number of token ids (``V``).
    max_len : int
        Rows of the position table: the longest sequence the model accepts.
    d_model : int, default 32
    h : int, default 4
        Heads per layer (``d_k = d_model // h``).
    n_layers : int, default 2
    rng : int or numpy.random.Generator, optional
        Seed of the initial parameters: embeddings with entries of variance 1, the unembedding
        of variance ``1/d_model``, the layers as :class:`~mha_course.MultiHeadAttention` draws
        them (no biases).

    Attributes
    ----------
    W_E : ndarray, shape (V, d_model)
    W_P : ndarray, shape (max_len, d_model)
    layers : list of MultiHeadAttention
    W_U : ndarray, shape (d_model, V)

    Raises
    ------
    ValueError
        If a size is not a positive integer (or ``h`` does not divide ``d_model``).

    Examples
    --------
    >>> model = TinyTransformer(vocab_size=19, max_len=17, rng=0)
    >>> model.forward(np.zeros((2, 5), dtype=int)).shape  # (B, T, V)
    (2, 5, 19)
    >>> sum(p.size for p in model.parameters().values())
    9952
    """

    def __init__(self, vocab_size, max_len, d_model=32, h=4, n_layers=2, *, rng=None):
        func = "TinyTransformer"
        self.vocab_size = validate_positive_int(func, "vocab_size", vocab_size)
        self.max_len = validate_positive_int(func, "max_len", max_len)
        self.d_model = validate_positive_int(func, "d_model", d_model)
        self.h = validate_positive_int(func, "h", h)
        self.n_layers = validate_positive_int(func, "n_layers", n_layers)
        rng = np.random.default_rng(rng)
        self.W_E = rng.normal(size=(self.vocab_size, self.d_model))
        self.W_P = rng.normal(size=(self.max_len, self.d_model))
        self.layers = [MultiHeadAttention(self.d_model, self.h, rng=rng)
                       for _ in range(self.n_layers)]
        self.W_U = rng.normal(size=(self.d_model, self.vocab_size)) / np.sqrt(self.d_model)

    def parameters(self) -> dict[str, np.ndarray]:
        """Every parameter array by name: ``W_E``, ``W_P``, ``L0.W_q`` … ``L1.W_o``, ``W_U``.

        The arrays themselves, not copies: an optimiser that updates them in place trains
        the model.
        """
        params = {"W_E": self.W_E, "W_P": self.W_P}
        for i, layer in enumerate(self.layers):
            params.update((f"L{i}.{name}", p) for name, p in layer.parameters().items())
        params["W_U"] = self.W_U
        return params

    def _validate_tokens(self, func: str, tokens) -> np.ndarray:
        tokens = np.asarray(tokens)
        if tokens.dtype.kind not in "iu" or tokens.ndim < 1:
            raise fail(func, f"tokens has dtype {tokens.dtype} and shape {tokens.shape}; "
                             "expected integer token ids of shape (..., T)")
        T = tokens.shape[-1]
        if T > self.max_len:
            raise fail(func, f"tokens has T={T} positions; the position table W_P holds "
                             f"max_len={self.max_len}: build the model with max_len >= {T}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            bad = tokens.max() if tokens.max() >= self.vocab_size else tokens.min()
            raise fail(func, f"tokens holds the id {int(bad)}, but the vocabulary has "
                             f"vocab_size={self.vocab_size} tokens (ids 0..{self.vocab_size - 1})"
                             "; was the model built for another task's vocabulary?")
        return tokens

    def forward(self, tokens, *, ablate=(), return_cache=False):
        """Logits for the next token at every position.

        Parameters
        ----------
        tokens : ndarray of int, shape (..., T)
            Token ids, ``0 <= id < vocab_size``, ``T <= max_len``.
        ablate : iterable of (layer, head), optional
            Heads whose output is set to zero (their columns of the concatenated heads, before
            ``W_o``): what the model does without them. Evaluation only.
        return_cache : bool, default False
            Also return what :meth:`backward` needs (not with ``ablate``).

        Returns
        -------
        logits : ndarray, shape (..., T, V)
        cache : dict, only with ``return_cache=True``
            ``"tokens"``, ``"saved"`` (one :class:`~mha_course.backward.SavedActivations` per
            layer) and ``"x"`` (the residual stream before the unembedding).

        Raises
        ------
        ValueError
            If a token id is outside the vocabulary, ``T`` exceeds ``max_len``, a head to
            ablate does not exist, or ``ablate`` is combined with ``return_cache``.
        """
        func = "TinyTransformer.forward"
        tokens = self._validate_tokens(func, tokens)
        off = {}
        for item in ablate:
            layer, head = (int(i) for i in item)
            if not (0 <= layer < self.n_layers and 0 <= head < self.h):
                raise fail(func, f"ablate holds {head_label(layer, head)}; the model has layers "
                                 f"0..{self.n_layers - 1} and heads 0..{self.h - 1}")
            off.setdefault(layer, []).append(head)
        if off and return_cache:
            raise fail(func, "ablate= is for evaluation; backward needs the unablated forward")
        T = tokens.shape[-1]
        x = self.W_E[tokens] + self.W_P[:T]  # (..., T) -> (..., T, d_model)
        mask = causal_mask(T)  # (T, T), the same for every head and example
        saved = []
        for i, layer in enumerate(self.layers):
            if i in off:  # the layer's one head_mask: those heads' outputs are 0 before W_o
                keep = np.ones(self.h)
                keep[off[i]] = 0.0
                out, _ = layer.forward(x, mask=mask, head_mask=keep)  # (..., T, d_model)
            else:
                out, cache = layer.forward(x, mask=mask, return_cache=True)
                saved.append(cache)
            x = x + out  # the residual stream
        logits = x @ self.W_U  # (..., T, d_model) @ (d_model, V) -> (..., T, V)
        if return_cache:
            return logits, {"tokens": tokens, "saved": saved, "x": x}
        return logits

    __call__ = forward

    def attention_weights(self, tokens) -> list[np.ndarray]:
        """Every layer's attention weights on ``tokens``: a list of ``n_layers`` arrays
        (..., h, T, T)."""
        _, cache = self.forward(tokens, return_cache=True)
        return [saved.weights for saved in cache["saved"]]

    def backward(self, dlogits, cache) -> dict[str, np.ndarray]:
        """Gradients of the loss with respect to every parameter, named as :meth:`parameters`.

        Parameters
        ----------
        dlogits : ndarray, shape (..., T, V)
            dLoss/dlogits (e.g. from :func:`cross_entropy`).
        cache : dict
            From ``forward(tokens, return_cache=True)``.
        """
        func = "TinyTransformer.backward"
        x = cache["x"]
        if np.shape(dlogits) != (*x.shape[:-1], self.vocab_size):
            raise fail(func, f"dlogits has shape {np.shape(dlogits)}; expected (..., T, V) = "
                             f"{(*x.shape[:-1], self.vocab_size)}")
        grads = {}
        # logits = x @ W_U: summed over every example and position -> (d_model, V)
        grads["W_U"] = x.reshape(-1, self.d_model).T @ dlogits.reshape(-1, self.vocab_size)
        dx = dlogits @ self.W_U.T  # (..., T, V) @ (V, d_model) -> (..., T, d_model)
        for i in reversed(range(self.n_layers)):
            layer = self.layers[i]
            layer_grads = layer.backward(dx, cache["saved"][i])
            for name in layer.parameters():
                grads[f"L{i}.{name}"] = layer_grads[name]
            dx = dx + layer_grads["x"]  # around the layer (residual) + through it
        tokens = cache["tokens"]
        grads["W_P"] = np.zeros_like(self.W_P)
        # (..., T, d_model) summed over the batch axes -> (T, d_model)
        grads["W_P"][: tokens.shape[-1]] = dx.reshape(-1, *dx.shape[-2:]).sum(axis=0)
        grads["W_E"] = np.zeros_like(self.W_E)
        # each row of W_E collects the gradients of the positions that hold its token
        np.add.at(grads["W_E"], tokens, dx)
        return {name: grads[name] for name in self.parameters()}

    def loss_and_grads(self, batch) -> tuple[float, dict[str, np.ndarray]]:
        """Cross-entropy on a :class:`~mha_course.models.tasks.Batch`, and every parameter's
        gradient."""
        logits, cache = self.forward(batch.tokens, return_cache=True)
        loss, dlogits = cross_entropy(logits, batch.targets, batch.weights)
        return loss, self.backward(dlogits, cache)

    def evaluate(self, batch, ablate=()) -> dict[str, float]:
        """Loss and accuracy on ``batch`` (optionally with heads ablated)."""
        logits = self.forward(batch.tokens, ablate=ablate)
        loss, _ = cross_entropy(logits, batch.targets, batch.weights)
        return {"loss": loss, "accuracy": accuracy(logits, batch.targets, batch.weights)}

    def __repr__(self) -> str:
        return (f"TinyTransformer(vocab_size={self.vocab_size}, max_len={self.max_len}, "
                f"d_model={self.d_model}, h={self.h}, n_layers={self.n_layers})")
