"""Adam and the training loop of the tiny model, with a progress bar.

Taught in ``notebooks/08_learning.ipynb``.

:func:`adam_step` is one update of Adam (Kingma & Ba, 2015) as a pure function, written as the
paper's Algorithm 1; :class:`Adam` keeps its moments for a dict of parameters and updates them
in place. :func:`train` draws a fresh batch of a task (:mod:`mha_course.models.tasks`) at every
step, takes the gradients from the model's backward pass (:class:`~mha_course.models.tiny_model
.TinyTransformer`, which reuses each attention layer's ``backward``) and records the loss and
accuracy, with a ``tqdm`` progress bar (``tqdm.auto``: a widget in JupyterLab, text in a
terminal).

The model's matrices are tiny (a few thousand numbers), and NumPy's BLAS spreads each product
over every core it finds; on a busy 2-core machine that made one training step 5-20 times
slower than one thread (measured while writing lesson 08). :func:`train` therefore limits BLAS
to ``blas_threads`` threads (default 1) while it runs, with ``threadpoolctl``; with one thread
the same seed also gives the same numbers on every run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from .._validate import fail, validate_positive_int
from .tasks import VOCAB, make_batch
from .tiny_model import accuracy, cross_entropy

__all__ = ["Adam", "History", "adam_step", "train"]


def adam_step(param, grad, m, v, t, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
    """One Adam update; returns new arrays ``(param, m, v)`` and changes none of its inputs.

    ``m = β1·m + (1−β1)·g``, ``v = β2·v + (1−β2)·g²``, ``m̂ = m/(1−β1ᵗ)``, ``v̂ = v/(1−β2ᵗ)``,
    ``param = param − lr·m̂/(√v̂ + ε)``.

    Parameters
    ----------
    param, grad, m, v : ndarray, all of one shape
        The parameter, its gradient, and Adam's first and second moments (zeros at the start).
    t : int
        The step number, counted from 1 (the bias corrections divide by ``1 − βᵗ``).
    lr, beta1, beta2, eps : float

    Returns
    -------
    param, m, v : ndarray

    Raises
    ------
    ValueError
        If ``t`` is not an integer >= 1 or the shapes differ.

    Examples
    --------
    >>> p, m, v = adam_step(np.array([1.0]), np.array([0.5]), np.zeros(1), np.zeros(1), t=1,
    ...                     lr=0.1)
    >>> p.round(6).tolist()  # the first step moves every parameter by about lr
    [0.9]
    """
    func = "adam_step"
    t = validate_positive_int(func, "t", t)
    shapes = {name: np.shape(a) for name, a in zip("param grad m v".split(),
                                                   (param, grad, m, v), strict=True)}
    if len(set(shapes.values())) != 1:
        raise fail(func, f"param, grad, m and v must have one shape; got {shapes}")
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad**2
    m_hat = m / (1 - beta1**t)  # bias correction: m and v start at 0
    v_hat = v / (1 - beta2**t)
    return param - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


class Adam:
    """Adam over a dict of parameter arrays, updated in place.

    Parameters
    ----------
    params : dict of str to ndarray
        E.g. ``model.parameters()``: the arrays themselves.
    lr, beta1, beta2, eps : float
        As :func:`adam_step`.

    Examples
    --------
    >>> w = np.ones(3)
    >>> opt = Adam({"w": w}, lr=0.1)
    >>> opt.step({"w": np.array([1.0, -1.0, 0.0])})
    >>> w.round(4).tolist()  # in place
    [0.9, 1.1, 1.0]
    """

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8):
        self.params = params
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.m = {name: np.zeros_like(p) for name, p in params.items()}
        self.v = {name: np.zeros_like(p) for name, p in params.items()}
        self.t = 0

    def step(self, grads) -> None:
        """Update every parameter from its gradient (``grads`` has the same names)."""
        self.t += 1
        for name, p in self.params.items():
            new, self.m[name], self.v[name] = adam_step(
                p, grads[name], self.m[name], self.v[name], self.t,
                self.lr, self.beta1, self.beta2, self.eps)
            p[...] = new  # in place: the model holds this very array


@dataclass
class History:
    """What :func:`train` recorded.

    Attributes
    ----------
    loss, accuracy : ndarray, shape (steps,)
        Loss and accuracy of every step's training batch (before that step's update).
    eval_steps : ndarray of int
        The steps after which the held-out batch was scored.
    eval_accuracy : ndarray
        Accuracy on the held-out batch after each of ``eval_steps``.
    seconds : float
        Wall-clock time of the loop.
    """

    loss: np.ndarray
    accuracy: np.ndarray
    eval_steps: np.ndarray
    eval_accuracy: np.ndarray
    seconds: float = field(default=0.0)


def train(model, task="mixed", steps=400, *, batch_size=64, lr=1e-2, cooldown=0.2, seed=0,
          n_min=3, n_max=8, eval_every=25, eval_size=256, progress=True,
          blas_threads=1) -> History:
    """Train ``model`` with Adam on fresh batches of ``task``; return the loss and accuracy.

    Parameters
    ----------
    model : TinyTransformer
        Built with ``vocab_size = len(VOCAB)`` and ``max_len >= 2 * n_max + 1``.
    task : {"copy", "reverse", "mixed"}, default "mixed"
    steps : int, default 400
    batch_size : int, default 64
    lr : float, default 1e-2
        The learning rate, constant until the last ``cooldown`` fraction of the steps, then
        falling linearly to 0 (a "cool-down", as in warmup-stable-decay schedules): the
        weights settle instead of jittering at the end.
    cooldown : float, default 0.2
    seed : int, default 0
        Seed of the training batches (the held-out batch uses ``seed + 1``; the model's own
        seed is separate).
    n_min, n_max : int
        The range of sequence lengths (see :func:`~mha_course.models.tasks.make_batch`).
    eval_every, eval_size : int
        Score a fixed held-out batch of ``eval_size`` examples every ``eval_every`` steps.
    progress : bool, default True
        Show a ``tqdm.auto`` progress bar.
    blas_threads : int or None, default 1
        BLAS threads while training (None: leave NumPy's setting alone).

    Returns
    -------
    History

    Raises
    ------
    ValueError
        If the model's vocabulary or position table does not fit the task, a size is not a
        positive integer, or the loss stops being finite (then training stops at that step
        with a message, rather than running on with NaN).
    """
    func = "train"
    for name, value in (("steps", steps), ("batch_size", batch_size),
                        ("eval_every", eval_every), ("eval_size", eval_size)):
        validate_positive_int(func, name, value)
    if model.vocab_size != len(VOCAB):
        raise fail(func, f"the model has vocab_size={model.vocab_size}; the tasks use "
                         f"{len(VOCAB)} tokens ({''.join(VOCAB)!r}): build it with "
                         "vocab_size=len(VOCAB)")
    if model.max_len < 2 * n_max + 1:
        raise fail(func, f"sequences of n_max={n_max} have T={2 * n_max + 1} positions; the "
                         f"model's position table holds max_len={model.max_len}")
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise fail(func, f"lr={lr!r} must be a positive number")
    if not (isinstance(cooldown, (int, float)) and 0 <= cooldown <= 1):
        raise fail(func, f"cooldown={cooldown!r} must be a fraction of the steps, 0 to 1")
    rng = np.random.default_rng(seed)
    held_out = make_batch(task, eval_size, seed + 1, n_min=n_min, n_max=n_max)
    optimiser = Adam(model.parameters(), lr=lr)
    losses, accuracies, eval_steps, eval_accuracy = [], [], [], []
    bar = range(steps)
    if progress:
        from tqdm.auto import tqdm  # a widget in Jupyter, text elsewhere: chosen when used

        bar = tqdm(bar, desc=f"training on {task}", unit="step", mininterval=0.25)
    start = time.perf_counter()
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        for step in bar:
            optimiser.lr = lr * min(1.0, (steps - step) / (cooldown * steps + 1e-12))
            batch = make_batch(task, batch_size, rng, n_min=n_min, n_max=n_max)
            logits, cache = model.forward(batch.tokens, return_cache=True)
            loss, dlogits = cross_entropy(logits, batch.targets, batch.weights)
            if not math.isfinite(loss):
                raise fail(func, f"the loss is {loss} at step {step}: training diverged "
                                 f"(lr={lr} too large?); the model's parameters are "
                                 "no longer usable")
            losses.append(loss)
            accuracies.append(accuracy(logits, batch.targets, batch.weights))
            optimiser.step(model.backward(dlogits, cache))
            if (step + 1) % eval_every == 0 or step + 1 == steps:
                eval_steps.append(step + 1)
                eval_accuracy.append(model.evaluate(held_out)["accuracy"])
                if progress:
                    bar.set_postfix(loss=f"{loss:.3f}", held_out_acc=f"{eval_accuracy[-1]:.2f}",
                                    refresh=False)
    seconds = time.perf_counter() - start
    if progress:
        bar.close()
    return History(np.array(losses), np.array(accuracies), np.array(eval_steps),
                   np.array(eval_accuracy), seconds)
