r"""Lesson 09's GPT trained so that an attention sink on BOS and an induction head can appear
on Tiny Shakespeare, and what was measured (the sink did; at this budget, no induction head).

Taught in ``notebooks/deep_dives/13d_sink_and_induction_trained.ipynb``. The recipe is a dict
(the model's config, its seeds, its training, as in :mod:`mha_course.models.shakespeare`); the
script trains it, seeded, with a ``tqdm`` bar, on one BLAS thread, together with its control::

    python -m mha_course.models.phenomena      # RECIPE and CONTROL -> phenomena.npz

- :data:`RECIPE`: lesson 09's architecture (2 blocks, ``d_model`` 64, 4 heads, context 64) on
  the 65 characters plus a beginning-of-sequence id :data:`BOS_ID` = 65 that opens every
  training window (``train_gpt(..., bos_id=65)``), and half of the windows repeating a span of
  their text: their first ``L`` characters, ``L`` drawn from 8 to 31 per window, then the text
  that followed (:func:`~mha_course.models.gpt_train.repeat_first_half` with ``lengths``). The
  distance between the copies changes from window to window, so only a look-up by content pays.
- :data:`CONTROL`: the same recipe, the same seeds, without BOS: windows open on whatever
  character the random offset lands on.

The measurements (:func:`measure`; the shipped file stores them and a test recomputes them from
the shipped weights):

- **the sink**: every head's mean attention weight on position 0 for the queries at
  ``t >= T_MIN`` of validation windows (:func:`first_position_mass`), against the weight a
  uniform head would give it (:func:`uniform_mass`); position 0 is BOS for :data:`RECIPE`, a
  character for :data:`CONTROL`;
- **the induction head**: on windows ``[BOS,] r, r`` where ``r`` is a span of ``SPAN`` random
  characters (:func:`repeated_span`), the loss on the second copy against the first
  (:func:`span_copy_losses`), each head's weight on the *induction* key (the position after the
  earlier occurrence of the current character) and on the previous position
  (:func:`span_scores`);
- **ablations**: how much those losses rise when one head is switched off
  (:func:`ablation_rise`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .._validate import fail
from .corpus import eval_windows
from .gpt import GPT, GPTConfig
from .gpt_train import open_with_bos
from .shakespeare import FIRST_STEPS, corpus, train_recipe
from .specialisation import pattern_score
from .text_heads import per_position_losses

__all__ = ["BOS_ID", "CONTROL", "PHENOMENA", "RECIPE", "SPAN", "T_MIN", "ablation_rise",
           "first_position_mass", "load_phenomena", "make_phenomena", "measure", "record",
           "repeated_span", "save_phenomena", "span_copy_losses", "span_scores", "text_windows",
           "uniform_mass"]

HERE = Path(__file__).parent
PHENOMENA = HERE / "phenomena.npz"
COMMAND = "python -m mha_course.models.phenomena"
#: The beginning-of-sequence id: one past Tiny Shakespeare's 65 characters.
BOS_ID = 65
#: Queries counted for the sink: ``t >= T_MIN`` (at ``t = 0`` the weight on position 0 is 1).
T_MIN = 8
#: Length of the random span that is repeated (``[BOS] + 2 · 31`` ids fit the context of 64).
SPAN = 31
#: Windows per measurement.
N_WINDOWS = 64

#: The model trained to show a sink and an induction head.
RECIPE = {
    "config": {"vocab_size": 66, "d_model": 64, "n_layers": 2, "h": 4, "context_length": 64},
    "model_seed": 0, "train_seed": 0, "steps": 3000, "batch_size": 32, "T": 64, "lr": 3e-3,
    "repeat_fraction": 0.5, "repeat_lengths": [8, 31], "bos_id": BOS_ID,
}
#: The control: the same recipe and seeds, no BOS.
CONTROL = {**RECIPE, "bos_id": None}


# ---------------------------------------------------------------------------- measurements
def text_windows(bos_id=None, n: int = N_WINDOWS, T: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` validation windows of ``T`` ids, opened with ``bos_id`` when given
    (:func:`~mha_course.models.gpt_train.open_with_bos`, as in training)."""
    x, y = eval_windows(corpus()[2], T)
    x, y = x[:n], y[:n]
    return (x, y) if bos_id is None else open_with_bos(x, y, bos_id)


def first_position_mass(weights, t_min: int = T_MIN) -> np.ndarray:
    """Every head's mean attention weight on position 0, over the queries at ``t >= t_min``.

    Parameters
    ----------
    weights : list of ndarray, each (B, h, T, T)
        One block's attention weights per entry (``GPT.attention_weights``).
    t_min : int
        The first query counted (the query at 0 can only read position 0: its weight is 1).

    Returns
    -------
    ndarray, shape (n_layers, h)

    Examples
    --------
    >>> uniform = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    >>> first_position_mass([uniform[None, None]], t_min=2).round(3).tolist()
    [[0.292]]
    """
    out = []
    for w in weights:
        w = np.asarray(w)
        if w.ndim != 4 or w.shape[-1] != w.shape[-2] or not 0 < t_min < w.shape[-1]:
            raise fail("first_position_mass", f"weights {w.shape} with t_min={t_min}; expected "
                                              "(B, h, T, T) with 0 < t_min < T")
        t = np.arange(w.shape[2])
        keys = np.broadcast_to(np.where(t >= t_min, 0, -1), (w.shape[0], w.shape[2]))
        out.append(pattern_score(w, keys))
    return np.stack(out)


def uniform_mass(T: int, t_min: int = T_MIN) -> float:
    """The weight on position 0 of a head that spreads evenly over the keys it can see: the
    mean of ``1 / (t + 1)`` over ``t = t_min .. T - 1``.

    Examples
    --------
    >>> round(uniform_mass(4, 2), 3)
    0.292
    """
    return float(np.mean(1.0 / (np.arange(t_min, T) + 1)))


def repeated_span(n: int = N_WINDOWS, span: int = SPAN, *, bos_id=None, vocab: int = 65,
                  rng=0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` windows ``[BOS,] r, r`` of a span ``r`` of ``span`` random ids below ``vocab``
    (uniform), and their targets (the next id; the last one's is ``r[0]`` again).

    The first copy cannot be predicted from text statistics; the second can, by looking up what
    followed the current id in the first copy.

    Returns
    -------
    x, y : ndarray of int64, shape (n, 2 · span + (1 if bos_id is not None else 0))

    Examples
    --------
    >>> x, y = repeated_span(1, 3, bos_id=9, vocab=5, rng=0)
    >>> x.tolist(), y.tolist()
    ([[9, 4, 3, 2, 4, 3, 2]], [[4, 3, 2, 4, 3, 2, 4]])
    """
    r = np.random.default_rng(rng).integers(0, vocab, size=(n, span))
    head = [np.full((n, 1), bos_id, dtype=np.int64)] if bos_id is not None else []
    stream = np.concatenate([*head, r, r, r[:, :1]], axis=1)
    return stream[:, :-1], stream[:, 1:]


def _copies(span: int, offset: int) -> tuple[np.ndarray, np.ndarray]:
    """The query positions that predict ``r[1:]`` in the first copy and again in the second."""
    first = np.arange(offset, offset + span - 1)
    return first, first + span


def span_copy_losses(model, x, y, span: int = SPAN, offset: int = 0) -> dict[str, float]:
    """Mean loss on the same characters in the first and the second copy of
    :func:`repeated_span`'s windows (``offset`` = 1 when they open with BOS).

    The queries counted predict ``r[1:]``: positions ``offset .. offset + span − 2`` in the first
    copy, the same plus ``span`` in the second.
    """
    first, second = _copies(span, offset)
    losses = per_position_losses(model, x, y)
    return {"first": float(losses[:, first].mean()), "second": float(losses[:, second].mean())}


def span_scores(weights, span: int = SPAN, offset: int = 0) -> dict[str, np.ndarray]:
    """Each head's mean weight, over the second copy's queries, on the *induction* key (the
    position after the earlier occurrence of the query's id: ``t − span + 1``) and on the
    *previous* position ``t − 1``.

    Returns
    -------
    dict
        ``{"induction": (n_layers, h), "previous": (n_layers, h)}``.
    """
    _, second = _copies(span, offset)
    out = {}
    for name, shift in (("induction", 1 - span), ("previous", -1)):
        scores = []
        for w in weights:
            keys = np.full(w.shape[2], -1)
            keys[second] = second + shift
            scores.append(pattern_score(w, np.broadcast_to(keys, (w.shape[0], w.shape[2]))))
        out[name] = np.stack(scores)
    return out


def ablation_rise(model, x, y, positions=None) -> np.ndarray:
    """How much the mean loss over ``positions`` (default: all) rises with each head off.

    Returns
    -------
    ndarray, shape (n_layers, h)
        ``loss(head (i, j) switched off by head_mask) − loss``.
    """
    c = model.config
    cols = slice(None) if positions is None else positions

    def loss(mask):
        return float(per_position_losses(model, x, y, head_mask=mask)[:, cols].mean())

    full = loss(None)
    rise = np.zeros((c.n_layers, c.h))
    for i in range(c.n_layers):
        for j in range(c.h):
            mask = np.ones((c.n_layers, c.h))
            mask[i, j] = 0.0
            rise[i, j] = loss(mask) - full
    return rise


def measure(model, bos_id=None) -> dict:
    """Every number the deep dive reads off ``model`` (trained with ``bos_id``, or without).

    Returns
    -------
    dict of lists and floats (JSON-ready, rounded to 4 decimals)
        ``first_mass`` (n_layers, h) and ``uniform``: the sink; ``text_loss`` and
        ``ablation_text`` (n_layers, h): the loss on the validation windows and its rise per
        head switched off; ``copy`` {first, second}, ``induction`` and ``previous`` (n_layers,
        h), ``ablation_second_copy`` (n_layers, h): the repeated random span; ``sink_head``,
        ``induction_head`` (the best induction score), ``previous_head`` (the best previous
        score in an earlier block than the induction head): [block, head].
    """
    offset = 0 if bos_id is None else 1
    T = model.config.context_length
    tx, ty = text_windows(bos_id, T=T)
    mass = first_position_mass(model.attention_weights(tx))
    sx, sy = repeated_span(bos_id=bos_id)
    scores = span_scores(model.attention_weights(sx), offset=offset)
    _, second = _copies(SPAN, offset)
    ind = np.unravel_index(np.argmax(scores["induction"]), mass.shape)
    prev_scores = scores["previous"][: max(ind[0], 1)]
    prev = np.unravel_index(np.argmax(prev_scores), prev_scores.shape)
    text_losses = per_position_losses(model, tx, ty)

    def r(a):
        return np.round(np.asarray(a, dtype=float), 4).tolist()

    return {"first_mass": r(mass), "uniform": round(uniform_mass(T), 4),
            "sink_head": [int(i) for i in np.unravel_index(np.argmax(mass), mass.shape)],
            "text_loss": round(float(text_losses[:, offset:].mean()), 4),
            "ablation_text": r(ablation_rise(model, tx, ty, np.arange(offset, T))),
            "copy": {k: round(v, 4) for k, v in
                     span_copy_losses(model, sx, sy, offset=offset).items()},
            "induction": r(scores["induction"]), "previous": r(scores["previous"]),
            "induction_head": [int(i) for i in ind], "previous_head": [int(i) for i in prev],
            "ablation_second_copy": r(ablation_rise(model, sx, sy, second))}


# ------------------------------------------------------------------------- recipe and file
def record(recipe, model, history) -> dict:
    """What a run of ``recipe`` records: the recipe, its seconds, steps, first losses, the mean
    loss of its last 100 steps, and :func:`measure`'s numbers on the float32 model."""
    return {"recipe": recipe, "command": COMMAND, "steps": int(len(history.loss)),
            "seconds": round(history.seconds, 1), "n_params": model.n_params,
            "first_losses": [float(v) for v in history.loss[:FIRST_STEPS]],
            "last_loss": round(float(history.loss[-100:].mean()), 4),
            "measured": measure(model.astype(np.float32), recipe["bos_id"])}


def save_phenomena(runs: dict, path=PHENOMENA) -> None:
    """Write ``{"bos": (model, meta), "control": (model, meta)}`` to ``path`` (float32)."""
    arrays = {f"{name}/{k}": p.astype(np.float32) for name, (model, _) in runs.items()
              for k, p in model.parameters().items()}
    arrays["config"] = np.array(json.dumps(RECIPE["config"]))
    arrays["meta"] = np.array(json.dumps({name: meta for name, (_, meta) in runs.items()}))
    np.savez(path, **arrays)


def make_phenomena(path=PHENOMENA, progress=True) -> dict:
    """Train :data:`RECIPE` and :data:`CONTROL`, measure both, write them to ``path``; return
    what each run recorded."""
    runs = {}
    for name, recipe in (("bos", RECIPE), ("control", CONTROL)):
        model, history = train_recipe(recipe, progress=progress)
        runs[name] = (model, record(recipe, model, history))
    save_phenomena(runs, path)
    return {name: meta for name, (_, meta) in runs.items()}


def load_phenomena(path=PHENOMENA, dtype=np.float32) -> dict:
    """``{"bos": GPT, "control": GPT, "meta": {...}}``: the model trained with BOS, its
    control, and what each run recorded (``recipe``, ``seconds``, ``steps``, ``first_losses``,
    ``last_loss``, ``measured``: :func:`measure`'s numbers).

    Raises
    ------
    ValueError
        If the file is missing or was made with other recipes than :data:`RECIPE` and
        :data:`CONTROL`.

    Examples
    --------
    >>> shipped = load_phenomena()
    >>> shipped["bos"].config.vocab_size, shipped["meta"]["bos"]["recipe"]["bos_id"]
    (66, 65)
    """
    func = "load_phenomena"
    if not Path(path).exists():
        raise fail(func, f"{path} does not exist: make it with {COMMAND}")
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        recipes = {name: meta.get(name, {}).get("recipe") for name in ("bos", "control")}
        if recipes != {"bos": RECIPE, "control": CONTROL}:
            raise fail(func, f"{path} was made with other recipes than RECIPE and CONTROL: "
                             f"make it again with {COMMAND}")
        config = GPTConfig(**json.loads(str(data["config"])))
        out = {"meta": meta}
        for name in ("bos", "control"):
            params = {k[len(name) + 1:]: data[k] for k in data.files
                      if k.startswith(name + "/")}
            out[name] = GPT.from_parameters(config, params, dtype=dtype)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    meta = make_phenomena(progress=not args.no_progress)
    for name, run in meta.items():
        m = run["measured"]
        print(f"{name}: {run['steps']} steps in {run['seconds']:.0f} s, last loss "
              f"{run['last_loss']:.3f}; mass on position 0 (t >= {T_MIN}) "
              f"{np.max(m['first_mass']):.3f} at {m['sink_head']} (uniform {m['uniform']:.3f}); "
              f"random span: first copy {m['copy']['first']:.3f}, second "
              f"{m['copy']['second']:.3f}; induction {np.max(m['induction']):.3f} at "
              f"{m['induction_head']}, previous {np.max(m['previous']):.3f} at "
              f"{m['previous_head']}")
    print(f"{PHENOMENA.name}: {PHENOMENA.stat().st_size / 1e6:.2f} MB, done in "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
