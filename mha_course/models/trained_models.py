"""Lesson 08's two tiny models, trained once and shipped, so the app's head viewer starts at once.

The head viewer (:mod:`mha_course.widgets.head_viewer`) needs trained models. Lesson 08
(``notebooks/08_learning.ipynb``, §3.4) trains them in the notebook, a few seconds each. The app
(:mod:`mha_course.widgets.app`, ``make app``) starts a fresh kernel for every visitor, and no
visitor should wait for training, so the app loads these instead: the same two models, built and
trained with the lesson's recipe (:data:`RECIPE`: two layers of two heads, ``d_model`` 32, model
seed 0, 300 steps of Adam on batch seed 0; the copy task on first halves of 3 to 11 symbols, the
reverse task on 3 to 8). They were trained once by this module's script::

    python -m mha_course.models.trained_models

which writes :data:`WEIGHTS` (``trained_models.npz`` beside this module, about 80 KB: every
parameter in float32, the recipe as JSON, each model's held-out accuracy) and prints what it did.
:func:`load_models` refuses a file made with another recipe. ``tests/test_trained_models.py``
checks that the shipped file matches the recipe, that its models do what lesson 08 says (copy and
reverse held-out sequences; a previous-token head feeding an induction head, an anti-diagonal
head), and that training again with the recipe gives models whose heads do the same. Nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from .._validate import fail
from .tasks import VOCAB, Batch, make_batch
from .tiny_model import TinyTransformer
from .train import train

__all__ = ["HELD_OUT_SEED", "RECIPE", "WEIGHTS", "build_model", "held_out", "load_models",
           "save_models", "train_models"]

#: Lesson 08's settings, per task: the model, then its training (``train(model, task,
#: steps=steps, seed=train_seed, n_max=n_max)``).
RECIPE = {
    task: {"n_max": n_max, "d_model": 32, "h": 2, "n_layers": 2, "model_seed": 0,
           "steps": 300, "train_seed": 0}
    for task, n_max in (("copy", 11), ("reverse", 8))
}
#: The shipped weights.
WEIGHTS = Path(__file__).with_name("trained_models.npz")
#: Seed of lesson 08's held-out batches (``make_batch(task, 512, rng=2024, n_max=...)``).
HELD_OUT_SEED = 2024
#: The command that writes :data:`WEIGHTS` (named in error messages).
COMMAND = "python -m mha_course.models.trained_models"


def _settings(func: str, task: str, recipe) -> dict:
    if task not in recipe:
        raise fail(func, f"task={task!r} is not one of {sorted(recipe)}")
    return recipe[task]


def build_model(task: str, recipe=RECIPE) -> TinyTransformer:
    """The untrained, seeded model of ``task``, as lesson 08 builds it.

    Raises
    ------
    ValueError
        If ``task`` is not in ``recipe``.

    Examples
    --------
    >>> build_model("reverse")
    TinyTransformer(vocab_size=19, max_len=17, d_model=32, h=2, n_layers=2)
    """
    s = _settings("build_model", task, recipe)
    return TinyTransformer(vocab_size=len(VOCAB), max_len=2 * s["n_max"] + 1,
                           d_model=s["d_model"], h=s["h"], n_layers=s["n_layers"],
                           rng=s["model_seed"])


def held_out(task: str, size: int = 512, recipe=RECIPE) -> Batch:
    """Lesson 08's held-out batch of ``task`` (seed :data:`HELD_OUT_SEED`): never trained on.

    Raises
    ------
    ValueError
        If ``task`` is not in ``recipe`` or ``size`` is not a positive integer.

    Examples
    --------
    >>> held_out("copy", 8).tokens.shape  # (B, T): T = 2 * 11 + 1
    (8, 23)
    """
    s = _settings("held_out", task, recipe)
    return make_batch(task, size, rng=HELD_OUT_SEED, n_max=s["n_max"])


def train_models(recipe=RECIPE, *, progress=False) -> dict[str, TinyTransformer]:
    """Build and train every model of ``recipe`` (a few seconds each on one core).

    Returns
    -------
    dict of str to TinyTransformer
        One trained model per task.
    """
    models = {}
    for task, s in recipe.items():
        model = build_model(task, recipe)
        train(model, task, steps=s["steps"], seed=s["train_seed"], n_max=s["n_max"],
              progress=progress)
        models[task] = model
    return models


def save_models(models, path=WEIGHTS, recipe=RECIPE) -> Path:
    """Write ``models`` (task -> trained model) to ``path`` as a compressed ``.npz``.

    Each parameter is stored in float32 as ``"<task>/<name>"`` (e.g. ``"copy/L1.W_q"``), with
    ``"recipe"`` (the JSON of ``recipe``) and ``"accuracy/<task>"`` (held-out accuracy).

    Raises
    ------
    ValueError
        If the models' tasks are not the recipe's.
    """
    if sorted(models) != sorted(recipe):
        raise fail("save_models", f"models for {sorted(models)}; the recipe has "
                                  f"{sorted(recipe)}")
    arrays = {"recipe": np.array(json.dumps(recipe, sort_keys=True))}
    for task, model in models.items():
        for name, param in model.parameters().items():
            arrays[f"{task}/{name}"] = param.astype(np.float32)
        arrays[f"accuracy/{task}"] = np.array(model.evaluate(held_out(task, recipe=recipe))
                                              ["accuracy"])
    path = Path(path)
    with open(path, "wb") as f:  # a file object: savez would add ".npz" to another suffix
        np.savez_compressed(f, **arrays)
    return path


def load_models(path=WEIGHTS, recipe=RECIPE) -> dict[str, TinyTransformer]:
    """The trained models stored in ``path``, as float64 :class:`TinyTransformer` objects.

    Returns
    -------
    dict of str to TinyTransformer
        ``"copy"`` and ``"reverse"`` (the tasks of ``recipe``).

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist (the message names the command that writes it).
    ValueError
        If the file was written with another recipe or lacks a parameter.

    Examples
    --------
    >>> models = load_models()
    >>> sorted(models), models["copy"].W_P.shape
    (['copy', 'reverse'], (23, 32))
    """
    func = "load_models"
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{func}: {path} does not exist; write it with `{COMMAND}`")
    with np.load(path) as data:
        stored = json.loads(str(data["recipe"])) if "recipe" in data.files else None
        if stored != json.loads(json.dumps(recipe)):
            raise fail(func, f"{path.name} was trained with the recipe {stored}; the code's is "
                             f"{recipe}: write it again with `{COMMAND}`")
        models = {}
        for task in recipe:
            model = build_model(task, recipe)
            for name, param in model.parameters().items():
                key = f"{task}/{name}"
                if key not in data.files or data[key].shape != param.shape:
                    got = data[key].shape if key in data.files else "nothing"
                    raise fail(func, f"{path.name} holds {got} for {key}; expected shape "
                                     f"{param.shape}")
                param[...] = data[key]  # in place: the model holds this array (float64)
            models[task] = model
    return models


def main(argv=None) -> int:
    """Train the models of :data:`RECIPE` and write them to ``--out`` (default :data:`WEIGHTS`)."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=main.__doc__)
    parser.add_argument("--out", type=Path, default=WEIGHTS, help="the .npz to write")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    models = train_models(progress=True)
    seconds = time.perf_counter() - start
    path = save_models(models, args.out)
    with np.load(path) as data:
        accuracy = {task: float(data[f"accuracy/{task}"]) for task in RECIPE}
    print(f"trained {', '.join(RECIPE)} in {seconds:.1f} s; held-out accuracy {accuracy}; "
          f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
