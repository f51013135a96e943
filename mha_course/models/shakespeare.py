"""Lesson 09's recipes and what they ship: the Shakespeare GPT, the h = 1 vs h = 4 study, the
induction probes.

Taught in ``notebooks/09_tiny_gpt.ipynb``. Each recipe is a dict (the model's config, its seeds,
its training); the script trains from it, seeded, with a ``tqdm`` bar, on one BLAS thread::

    python -m mha_course.models.shakespeare checkpoint   # RECIPE -> shakespeare_gpt.npz
    python -m mha_course.models.shakespeare study        # STUDY_RECIPE -> head_count_study.json
    python -m mha_course.models.shakespeare probes       # PROBE_RECIPE -> induction_probes.npz

- :data:`RECIPE`: the model lesson 09 samples from and reads: 2 blocks, ``d_model`` 96, 4 query
  heads sharing 2 key/value heads (GQA), SwiGLU, RoPE, context 256; Adam on random windows of
  the training split. :func:`load_shakespeare_gpt` returns it and its tokenizer;
  :func:`checkpoint_info` what the recipe recorded (steps, seconds, the loss curve, the
  validation loss on the whole validation split).
- :data:`STUDY_RECIPE`: h = 1 against h = 4 at equal parameters (``d_model`` 64, 2 blocks:
  ``h · d_k = d_model`` either way, so every weight matrix has the same shape) and an equal
  budget (the same steps, batches and learning rate), for three seeds each;
  :func:`load_study` returns the table.
- :data:`PROBE_RECIPE`: lesson 09's induction probe: a 2-block, 64-wide model trained on plain
  windows and, from the same seeds, with a quarter of its windows repeating their first half
  (:func:`~mha_course.models.gpt_train.repeat_first_half`); :func:`load_probes` returns both.

Each file also stores the first training losses of every run; ``tests/test_shakespeare.py``
retrains those steps from the recipe and compares, checks the shipped checkpoint's validation
loss (<= 1.70 nats per character) and runs the study on a cheap setting.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import numpy as np

from .._validate import fail
from .corpus import load_text, split
from .gpt import GPT, GPTConfig
from .gpt_train import evaluate, train_gpt
from .tokenizer import CharTokenizer

__all__ = ["CHECKPOINT", "PROBES", "PROBE_RECIPE", "RECIPE", "STUDY", "STUDY_RECIPE",
           "build_model", "checkpoint_info", "corpus", "load_probes", "load_shakespeare_gpt",
           "load_study", "run_study", "train_recipe"]

HERE = Path(__file__).parent
CHECKPOINT = HERE / "shakespeare_gpt.npz"
STUDY = HERE / "head_count_study.json"
PROBES = HERE / "induction_probes.npz"
COMMAND = "python -m mha_course.models.shakespeare"
#: Training losses stored per run, for the test that retrains them.
FIRST_STEPS = 8

#: The shipped model and its training.
RECIPE = {
    "config": {"vocab_size": 65, "d_model": 96, "n_layers": 2, "h": 4, "n_kv_heads": 2,
               "context_length": 256},
    "model_seed": 0, "train_seed": 0, "steps": 1500, "batch_size": 8, "T": 256, "lr": 3e-3,
    "repeat_fraction": 0.0,
}
#: h = 1 against h = 4, equal parameters and budget.
STUDY_RECIPE = {
    "config": {"vocab_size": 65, "d_model": 64, "n_layers": 2, "context_length": 128},
    "heads": [1, 4], "seeds": [0, 1, 2], "steps": 800, "batch_size": 16, "T": 128, "lr": 3e-3,
}
#: The induction probe: a 2-block, 64-wide model trained twice, once with a quarter of its
#: windows repeating their first half.
PROBE_RECIPE = {
    "config": {"vocab_size": 65, "d_model": 64, "n_layers": 2, "h": 4, "context_length": 64},
    "model_seed": 0, "train_seed": 0, "steps": 800, "batch_size": 32, "T": 64, "lr": 3e-3,
    "repeat_fraction": 0.25,
}


@functools.lru_cache(maxsize=1)
def corpus() -> tuple[CharTokenizer, np.ndarray, np.ndarray]:
    """Tiny Shakespeare's tokenizer and its training and validation ids (the fixed 90/10 split).

    Examples
    --------
    >>> tok, train, val = corpus()
    >>> tok.vocab_size, len(train), len(val)
    (65, 1003854, 111540)
    """
    text = load_text()
    tok = CharTokenizer.from_text(text)
    train, val = split(tok.encode(text))
    return tok, train, val


def build_model(recipe, dtype=np.float32) -> GPT:
    """The untrained, seeded model of ``recipe``."""
    return GPT(GPTConfig(**recipe["config"]), rng=recipe["model_seed"], dtype=dtype)


def train_recipe(recipe, *, steps=None, progress=True, val_every=None):
    """Build ``recipe``'s model and train it on the training split; return (model, history).

    ``steps`` overrides the recipe's (a test retrains the first few steps). A recipe with a
    ``bos_id`` opens every window with it, one with ``repeat_lengths`` repeats spans of random
    lengths (deep dive 13d's model); lesson 09's recipes have neither.
    """
    _, train_ids, val_ids = corpus()
    model = build_model(recipe)
    history = train_gpt(model, train_ids, steps=steps or recipe["steps"],
                        batch_size=recipe["batch_size"], T=recipe["T"], lr=recipe["lr"],
                        warmup=max(1, recipe["steps"] // 20), seed=recipe["train_seed"],
                        repeat_fraction=recipe.get("repeat_fraction", 0.0),
                        repeat_lengths=recipe.get("repeat_lengths"),
                        bos_id=recipe.get("bos_id"),
                        val_ids=val_ids if val_every else None, eval_every=val_every,
                        progress=progress)
    return model, history


def _meta(recipe, model, history, extra) -> dict:
    return {"recipe": recipe, "command": COMMAND, "steps": int(len(history.loss)),
            "seconds": round(history.seconds, 1), "n_params": model.n_params,
            "first_losses": [float(x) for x in history.loss[:FIRST_STEPS]], **extra}


def make_checkpoint(path=CHECKPOINT, recipe=RECIPE, progress=True):
    """Train :data:`RECIPE` and write the checkpoint (float32) with what the run recorded."""
    _, _, val_ids = corpus()
    model, history = train_recipe(recipe, progress=progress, val_every=250)
    val_loss = evaluate(model, val_ids)
    meta = _meta(recipe, model, history, {
        "val_loss": round(float(val_loss), 4),
        "loss_curve": [round(float(x), 4) for x in history.loss],
        "eval_steps": history.eval_steps.tolist(),
        "eval_loss": [round(float(x), 4) for x in history.eval_loss]})
    model.save(path, **meta)
    return model, meta


def _read_meta(path, func: str) -> dict:
    if not Path(path).exists():
        raise fail(func, f"{path} does not exist: make it with {COMMAND}")
    with np.load(path) as data:
        return {key[len("meta/"):]: json.loads(str(data[key])) for key in data.files
                if key.startswith("meta/")}


def checkpoint_info(path=CHECKPOINT) -> dict:
    """What the recipe recorded with the shipped model: ``recipe``, ``steps``, ``seconds``,
    ``n_params``, ``val_loss`` (whole validation split), ``loss_curve``, ``eval_steps``,
    ``eval_loss`` (the first 64 validation windows, during training), ``first_losses``."""
    return _read_meta(path, "checkpoint_info")


def load_shakespeare_gpt(dtype=np.float32, path=CHECKPOINT) -> tuple[GPT, CharTokenizer]:
    """The shipped Shakespeare GPT and its tokenizer.

    Raises
    ------
    ValueError
        If the file is missing or was made with another recipe than :data:`RECIPE`.

    Examples
    --------
    >>> model, tok = load_shakespeare_gpt()
    >>> model.config.d_model, tok.vocab_size
    (96, 65)
    """
    if Path(path) == CHECKPOINT and checkpoint_info(path)["recipe"] != RECIPE:
        raise fail("load_shakespeare_gpt", f"{path} was made with another recipe than RECIPE: "
                                           f"make it again with {COMMAND} checkpoint")
    return GPT.load(path, dtype=dtype), corpus()[0]


# ------------------------------------------------------------------- the h = 1 vs h = 4 study
def study_run(recipe, h: int, seed: int) -> dict:
    """The single-model recipe of one cell (h, seed) of the study."""
    return {"config": {**recipe["config"], "h": h}, "model_seed": seed, "train_seed": seed,
            **{k: recipe[k] for k in ("steps", "batch_size", "T", "lr")},
            "repeat_fraction": 0.0}


def run_study(recipe=STUDY_RECIPE, progress=True, keep=None):
    """Train every (h, seed) of ``recipe``; return the table (and the recipe it came from).

    Parameters
    ----------
    keep : (h, seed), optional
        Also return that run's model (the study's h = 4, seed 0 is the plain induction probe).

    Returns
    -------
    table : dict
        ``recipe``, ``command`` and ``rows``: one dict per run with ``h``, ``d_k``, ``seed``,
        ``n_params``, ``val_loss`` (whole validation split, windows of ``T``), ``seconds`` and
        ``first_losses``.
    kept : (GPT, dict) or None
        The kept run's model and what it recorded, when ``keep`` is given.
    """
    _, _, val_ids = corpus()
    rows, kept = [], None
    for h in recipe["heads"]:
        for seed in recipe["seeds"]:
            run = study_run(recipe, h, seed)
            model, history = train_recipe(run, progress=progress)
            if keep == (h, seed):
                kept = (model, _meta(run, model, history, {}))
            rows.append({"h": h, "d_k": model.config.d_k, "seed": seed,
                         "n_params": model.n_params,
                         "val_loss": round(float(evaluate(model, val_ids, recipe["T"])), 4),
                         "seconds": round(history.seconds, 1),
                         "first_losses": [float(x) for x in history.loss[:FIRST_STEPS]]})
    table = {"recipe": recipe, "command": f"{COMMAND} study", "rows": rows}
    return (table, kept) if keep is not None else table


def load_study(path=STUDY) -> dict:
    """The shipped h = 1 vs h = 4 table (:func:`run_study`'s result, as JSON).

    Raises
    ------
    ValueError
        If the file is missing or was made with another recipe than :data:`STUDY_RECIPE`.
    """
    if not Path(path).exists():
        raise fail("load_study", f"{path} does not exist: make it with {COMMAND} study")
    table = json.loads(Path(path).read_text())
    if Path(path) == STUDY and table["recipe"] != STUDY_RECIPE:
        raise fail("load_study", f"{path} was made with another recipe: make it again with "
                                 f"{COMMAND} study")
    return table


# ----------------------------------------------------------------------- the induction probes
def save_probes(models: dict, meta: dict, path=PROBES) -> None:
    """Write the probe models (float32) and what their runs recorded to one file."""
    arrays = {f"{name}/{k}": p.astype(np.float32) for name, model in models.items()
              for k, p in model.parameters().items()}
    arrays["config"] = np.array(json.dumps(PROBE_RECIPE["config"]))
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)


def make_probes(path=PROBES, progress=True, plain=None) -> dict:
    """Train the repeated-window probe (and the plain one, unless ``plain`` = (model, meta)
    is given: the study's h = 4, seed 0 run) and write both to ``path``."""
    models, meta = {}, {}
    if plain is None:
        plain = train_recipe({**PROBE_RECIPE, "repeat_fraction": 0.0}, progress=progress)
        plain = (plain[0], _meta({**PROBE_RECIPE, "repeat_fraction": 0.0}, *plain, {}))
    models["plain"], meta["plain"] = plain
    model, history = train_recipe(PROBE_RECIPE, progress=progress)
    models["repeat"], meta["repeat"] = model, _meta(PROBE_RECIPE, model, history, {})
    save_probes(models, meta, path)
    return meta


def load_probes(path=PROBES, dtype=np.float32) -> dict:
    """``{"plain": GPT, "repeat": GPT}``: the probe trained on plain windows and the one trained
    with a quarter of them repeated (the same seeds); and ``"meta"``, what each run recorded."""
    if not Path(path).exists():
        raise fail("load_probes", f"{path} does not exist: make it with {COMMAND} probes")
    with np.load(path) as data:
        config = GPTConfig(**json.loads(str(data["config"])))
        out = {"meta": json.loads(str(data["meta"]))}
        for name in ("plain", "repeat"):
            params = {k[len(name) + 1:]: data[k] for k in data.files
                      if k.startswith(name + "/")}
            out[name] = GPT.from_parameters(config, params, dtype=dtype)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="+", choices=["checkpoint", "study", "probes", "all"],
                        help="what to make (study and probes together share a run)")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    progress = not args.no_progress
    start = time.perf_counter()
    if {"checkpoint", "all"} & set(args.what):
        _, meta = make_checkpoint(progress=progress)
        print(f"{CHECKPOINT.name}: {meta['steps']} steps in {meta['seconds']:.0f} s, "
              f"validation loss {meta['val_loss']:.4f} nats/char, {meta['n_params']:,} "
              f"parameters, {CHECKPOINT.stat().st_size / 1e6:.2f} MB")
    if {"study", "all"} & set(args.what):
        table = run_study(progress=progress)
        STUDY.write_text(json.dumps(table, indent=1) + "\n")
        for row in table["rows"]:
            print(f"h={row['h']} seed={row['seed']}: val {row['val_loss']:.4f} "
                  f"({row['n_params']:,} parameters, {row['seconds']:.0f} s)")
    if {"probes", "all"} & set(args.what):
        meta = make_probes(progress=progress)
        print(f"{PROBES.name}: " + ", ".join(f"{k} {v['seconds']:.0f} s" for k, v in
                                            meta.items()))
    print(f"done in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
