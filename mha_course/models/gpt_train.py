"""Training the GPT on text: random windows, Adam, a warm-up and cosine schedule, clipping.

Taught in ``notebooks/09_tiny_gpt.ipynb``.

:func:`train_gpt` draws ``batch_size`` random windows of the training ids at every step
(:func:`~mha_course.models.corpus.random_windows`; with ``repeat_fraction`` a share of them
repeat their first half, the induction probe of deep dive 09a §5; with ``bos_id`` every window
opens with a beginning-of-sequence id, :func:`open_with_bos`, the sink of deep dive 13d), takes
the loss and gradients (the fast step of :mod:`mha_course.models.gpt_fast` by default, or the
readable ``GPT.loss_and_grads``: the same numbers, tested), clips the gradients' global norm, and
updates every parameter with lesson 08's :class:`~mha_course.models.train.Adam`. The learning
rate warms up linearly, then follows a cosine down to a tenth of its peak. BLAS runs on
``blas_threads`` threads (default 1: tiny matrices gain nothing from more, and one thread makes a
seeded run repeat exactly on one machine). :func:`evaluate` is the mean loss over windows that
cover a split once (:func:`~mha_course.models.corpus.eval_windows`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from .._validate import fail, validate_positive_int
from .corpus import eval_windows, random_windows
from .gpt_fast import fast_logits, fast_loss_and_grads
from .tiny_model import cross_entropy
from .train import Adam

__all__ = ["GPTHistory", "evaluate", "learning_rate", "open_with_bos", "repeat_first_half",
           "train_gpt"]


@dataclass
class GPTHistory:
    """What :func:`train_gpt` recorded.

    Attributes
    ----------
    loss : ndarray, shape (steps,)
        Every step's training loss (before that step's update), nats per character.
    eval_steps, eval_loss : ndarray
        Steps after which the validation windows were scored, and their mean loss.
    seconds : float
        Wall-clock time of the loop.
    """

    loss: np.ndarray
    eval_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    eval_loss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    seconds: float = 0.0


def learning_rate(step: int, steps: int, lr: float, warmup: int) -> float:
    """Linear warm-up over ``warmup`` steps to ``lr``, then a cosine down to ``lr / 10``.

    Examples
    --------
    >>> [round(learning_rate(s, 100, 1.0, 10), 3) for s in (0, 9, 10, 55, 99)]
    [0.1, 1.0, 1.0, 0.542, 0.1]
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - 1 - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


def repeat_first_half(x, y, fraction: float, rng,
                      lengths=None) -> tuple[np.ndarray, np.ndarray]:
    """Make a ``fraction`` of the windows repeat their first half: ``w[T/2:] = w[:T/2]``.

    With ``lengths = (lo, hi)`` each chosen window repeats its first ``L`` ids instead, ``L``
    drawn uniformly from ``lo .. hi`` (``hi <= T/2``) per window, and then goes on with the
    text that followed them: ``w = s[:L], s[:T + 1 - L]`` for the window's stretch ``s``. The
    copy then sits at a distance that changes from window to window, so a head that always
    looks back ``T/2`` no longer finds it: only a look-up by content (an induction head) does.

    ``x`` and ``y`` (B, T) come from one stretch of text of ``T + 1`` ids per row; the chosen
    rows become that stretch's first ``T/2`` ids twice, so in the second half the next character
    is always the one that followed the same character ``T/2`` positions earlier: a pattern only
    an induction head (or a head that looks back exactly ``T/2``) can use.

    Examples
    --------
    >>> x, y = np.arange(8)[None], np.arange(1, 9)[None]
    >>> [a.tolist() for a in repeat_first_half(x, y, 1.0, rng=0)]
    [[[0, 1, 2, 3, 0, 1, 2, 3]], [[1, 2, 3, 0, 1, 2, 3, 0]]]
    """
    B, T = x.shape
    half = T // 2
    rng = np.random.default_rng(rng)
    rows = rng.random(B) < fraction
    x, y = x.copy(), y.copy()
    if lengths is not None:
        stretch = np.concatenate([x, y[:, -1:]], axis=1)  # the T + 1 ids of each window
        for b, L in zip(np.flatnonzero(rows), rng.integers(lengths[0], lengths[1] + 1,
                                                             size=int(rows.sum())), strict=True):
            stream = np.concatenate([stretch[b, :L], stretch[b, : T + 1 - L]])
            x[b], y[b] = stream[:T], stream[1:]
        return x, y
    # T + 1 ids per row: the first half twice, then its first id (or two, for an odd T)
    stream = np.concatenate([x[rows, :half], x[rows, :half], x[rows, : T + 1 - 2 * half]],
                            axis=1)
    x[rows], y[rows] = stream[:, :T], stream[:, 1 : T + 1]
    return x, y


def open_with_bos(x, y, bos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Open every window with ``bos_id``: ``x = [BOS, w_0 .. w_{T-2}]``, ``y = [w_0 .. w_{T-1}]``.

    ``x`` (B, T) holds ``w_0 .. w_{T-1}`` (``y`` is ``x`` shifted by one, so it is not needed
    again): the window keeps its length, loses its last input and gains a first query whose
    target is the window's first character. Trusts its inputs (:func:`train_gpt` validates).

    Examples
    --------
    >>> x, y = np.arange(4)[None], np.arange(1, 5)[None]
    >>> [a.tolist() for a in open_with_bos(x, y, 9)]
    [[[9, 0, 1, 2]], [[0, 1, 2, 3]]]
    """
    bos = np.full((x.shape[0], 1), bos_id, dtype=x.dtype)
    return np.concatenate([bos, x[:, :-1]], axis=1), x.copy()


def evaluate(model, ids, T=None, *, batch_size=32, max_windows=None, head_mask=None,
             blas_threads=1) -> float:
    """Mean loss (nats per token) over consecutive windows of ``T`` ids that cover ``ids`` once.

    The forward pass is :func:`~mha_course.models.gpt_fast.fast_logits` (equal to
    ``model.forward``, tested), in batches of ``batch_size`` windows.

    Parameters
    ----------
    model : GPT
    ids : ndarray of int, shape (N,)
    T : int, optional
        Window length; default the model's ``context_length``.
    batch_size : int
        Windows per forward pass.
    max_windows : int, optional
        Score only the first ``max_windows`` windows (a quicker estimate).
    head_mask : array_like, optional
        As ``GPT.forward``.
    blas_threads : int or None, default 1
        BLAS threads while it runs (None: leave NumPy's setting alone).
    """
    T = model.config.context_length if T is None else T
    x, y = eval_windows(ids, T)
    if max_windows is not None:
        x, y = x[:max_windows], y[:max_windows]
    total = 0.0
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        for i in range(0, len(x), batch_size):
            xb, yb = x[i : i + batch_size], y[i : i + batch_size]
            logits = fast_logits(model, xb, head_mask=head_mask)  # = model.forward, tested
            total += cross_entropy(logits, yb, np.ones(yb.shape))[0] * len(xb)
    return total / len(x)


def train_gpt(model, train_ids, *, steps, batch_size=32, T=None, lr=3e-3, warmup=None,
              grad_clip=1.0, seed=0, repeat_fraction=0.0, repeat_lengths=None, bos_id=None,
              val_ids=None,
              eval_every=None, eval_windows_max=64, progress=True, fast=True,
              blas_threads=1) -> GPTHistory:
    """Train ``model`` in place with Adam on random windows of ``train_ids``.

    Parameters
    ----------
    model : GPT
    train_ids : ndarray of int, shape (N,)
    steps, batch_size : int
    T : int, optional
        Window length; default the model's ``context_length``.
    lr : float
        Peak learning rate (:func:`learning_rate`).
    warmup : int, optional
        Warm-up steps; default ``steps // 20`` (at least 1).
    grad_clip : float or None
        Scale the gradients down when their global norm exceeds this.
    seed : int
        Seed of the windows (the model's initial parameters have their own).
    repeat_fraction : float
        Share of windows that repeat their first half (:func:`repeat_first_half`).
    repeat_lengths : (int, int), optional
        Repeat a span of random length in ``lo .. hi`` instead (:func:`repeat_first_half`'s
        ``lengths``); ``2 <= lo <= hi <= T / 2``.
    bos_id : int, optional
        A beginning-of-sequence id that opens every window (:func:`open_with_bos`, after the
        repeat, so repeated spans stay); must be below the model's ``vocab_size``. None (the
        default) trains on the windows as drawn.
    val_ids : ndarray of int, optional
        Scored every ``eval_every`` steps and at the end (the first ``eval_windows_max``
        windows of :func:`evaluate`).
    progress : bool
        A ``tqdm.auto`` bar.
    fast : bool
        Use :func:`~mha_course.models.gpt_fast.fast_loss_and_grads` (else the readable
        ``model.loss_and_grads``).

    Returns
    -------
    GPTHistory

    Raises
    ------
    ValueError
        On a bad size, or when the loss stops being finite.
    """
    func = "train_gpt"
    steps = validate_positive_int(func, "steps", steps)
    batch_size = validate_positive_int(func, "batch_size", batch_size)
    T = model.config.context_length if T is None else validate_positive_int(func, "T", T)
    warmup = max(1, steps // 20) if warmup is None else validate_positive_int(func, "warmup",
                                                                              warmup)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise fail(func, f"lr={lr!r} must be a positive number")
    if repeat_lengths is not None and not (
            len(repeat_lengths) == 2
            and all(isinstance(v, (int, np.integer)) for v in repeat_lengths)
            and 2 <= repeat_lengths[0] <= repeat_lengths[1] <= T // 2):
        raise fail(func, f"repeat_lengths={repeat_lengths!r} must be (lo, hi) with "
                         f"2 <= lo <= hi <= T/2 = {T // 2}")
    if bos_id is not None and not (isinstance(bos_id, (int, np.integer))
                                   and 0 <= bos_id < model.config.vocab_size):
        raise fail(func, f"bos_id={bos_id!r} must be an id in [0, vocab_size="
                         f"{model.config.vocab_size})")
    rng = np.random.default_rng(seed)
    optimiser = Adam(model.parameters(), lr=lr, beta2=0.99)
    step_fn = fast_loss_and_grads if fast else (lambda m, x, y: m.loss_and_grads(x, y))
    losses, eval_steps, eval_loss = [], [], []
    bar = range(steps)
    if progress:
        from tqdm.auto import tqdm  # a widget in Jupyter, text elsewhere: chosen when used

        bar = tqdm(bar, desc="training", unit="step", mininterval=0.5)
    start = time.perf_counter()
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        for step in bar:
            optimiser.lr = learning_rate(step, steps, lr, warmup)
            x, y = random_windows(train_ids, batch_size, T, rng)
            if repeat_fraction:
                x, y = repeat_first_half(x, y, repeat_fraction, rng, repeat_lengths)
            if bos_id is not None:
                x, y = open_with_bos(x, y, bos_id)
            loss, grads = step_fn(model, x, y)
            if not math.isfinite(loss):
                raise fail(func, f"the loss is {loss} at step {step}: training diverged "
                                 f"(lr={lr} too large?)")
            losses.append(loss)
            if grad_clip is not None:
                norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
                if norm > grad_clip:
                    grads = {name: g * (grad_clip / norm) for name, g in grads.items()}
            optimiser.step(grads)
            last = step + 1 == steps
            if val_ids is not None and eval_every and ((step + 1) % eval_every == 0 or last):
                eval_steps.append(step + 1)
                eval_loss.append(evaluate(model, val_ids, T, max_windows=eval_windows_max))
                if progress:
                    bar.set_postfix(loss=f"{loss:.3f}", val=f"{eval_loss[-1]:.3f}",
                                    refresh=False)
            elif progress and step % 10 == 0:
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
    seconds = time.perf_counter() - start
    if progress:
        bar.close()
    return GPTHistory(np.array(losses), np.array(eval_steps, dtype=int), np.array(eval_loss),
                      seconds)
