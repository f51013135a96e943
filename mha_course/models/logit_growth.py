"""Lesson 13's training runs: attention-logit growth at a high learning rate, and its two cures,
plus the trained sink and gate models; the recipes and what they ship.

Taught in ``notebooks/13_attention_2025.ipynb``. The runs are recipes (seeded, ``tqdm``, one
BLAS thread)::

    python -m mha_course.models.logit_growth growth   # GROWTH_RECIPE -> logit_growth.json
    python -m mha_course.models.logit_growth sinks    # SINK_RECIPE -> sink_models.npz

:func:`train_variant` is lesson 09's training loop (:func:`~mha_course.models.gpt_train.train_gpt`:
the same random windows, warm-up and cosine schedule, gradient clipping and Adam, step for step;
``tests/test_logit_growth.py`` checks the losses are equal) with two additions a study of
instability needs: every ``log_every`` steps it records each head's largest logit and mean
entropy on that step's batch, and a loss that stops being finite ends the run and is recorded
(``diverged_at``) instead of raising.

- :data:`GROWTH_RECIPE`: lesson 09's architecture at ``d_model`` 64 (400 steps on windows of
  64 characters) trained at a learning rate ten times lesson 09's, three ways: the plain
  block, QK-norm, and soft-capping at Gemma 2's 50 (and the plain block at lesson 09's rate,
  for scale). :func:`load_growth` returns the curves.
- :data:`SINK_RECIPE`: the same model trained at lesson 09's rate three ways: plain, with learned
  sinks (gpt-oss) and with a headwise output gate (Qiu et al. 2025); :func:`load_sink_models`
  returns the three models, to measure where their heads put their weight.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

from .._validate import fail, validate_positive_int
from .corpus import random_windows
from .gpt import GPTConfig
from .gpt_train import learning_rate
from .gpt_variants import BlockVariant, VariantGPT
from .shakespeare import corpus
from .train import Adam

__all__ = ["GROWTH", "GROWTH_RECIPE", "SINK_MODELS", "SINK_RECIPE", "VariantHistory",
           "load_growth", "load_sink_models", "make_growth", "make_sink_models",
           "train_variant"]

HERE = Path(__file__).parent
GROWTH = HERE / "logit_growth.json"
SINK_MODELS = HERE / "sink_models.npz"
COMMAND = "python -m mha_course.models.logit_growth"
#: Training losses stored per run, for the test that retrains them.
FIRST_STEPS = 6

_CONFIG = {"vocab_size": 65, "d_model": 64, "n_layers": 2, "h": 4, "n_kv_heads": 4,
           "context_length": 128}

#: Logit growth and its cures.
GROWTH_RECIPE = {
    "config": _CONFIG, "model_seed": 0, "train_seed": 0, "steps": 400, "batch_size": 16,
    "T": 64, "log_every": 10, "grad_clip": 1.0,
    "runs": {
        "baseline, lr 3e-3": {"lr": 3e-3, "variant": {}},
        "baseline, lr 3e-2": {"lr": 3e-2, "variant": {}},
        "QK-norm, lr 3e-2": {"lr": 3e-2, "variant": {"qk_norm": True}},
        "soft-cap 50, lr 3e-2": {"lr": 3e-2, "variant": {"softcap": 50.0}},
    },
}
#: Where trained heads put their weight: plain, sinks, gate.
SINK_RECIPE = {
    "config": _CONFIG, "model_seed": 0, "train_seed": 0, "steps": 400, "batch_size": 16,
    "T": 64, "lr": 3e-3, "grad_clip": 1.0,
    "runs": {"baseline": {}, "sinks": {"sinks": True}, "gate": {"gate": "headwise"}},
}


@dataclass
class VariantHistory:
    """What :func:`train_variant` recorded.

    Attributes
    ----------
    loss : ndarray, shape (steps_run,)
        Every step's training loss before its update (nats per character).
    log_steps : ndarray of int, shape (n_logs,)
        The steps whose batch was measured.
    max_logit, entropy, sink_mass : ndarray, shape (n_logs, n_layers, h)
        Each head's largest raw logit ``q·k/√d_k``, mean entropy (nats) and mean sink weight.
    diverged_at : int or None
        The step whose loss was not finite (the run stopped there), or None.
    seconds : float
    """

    loss: np.ndarray
    log_steps: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    max_logit: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    entropy: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    sink_mass: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    diverged_at: int | None = None
    seconds: float = 0.0


def train_variant(model, train_ids, *, steps, batch_size=32, T=None, lr=3e-3, warmup=None,
                  grad_clip=1.0, seed=0, log_every=10, progress=True,
                  blas_threads=1, stop_after=None) -> VariantHistory:
    """Train a :class:`~mha_course.models.gpt_variants.VariantGPT` in place with lesson 09's
    loop, recording every head's logits and entropy every ``log_every`` steps.

    The parameters mean what they mean in :func:`~mha_course.models.gpt_train.train_gpt`
    (``warmup`` defaults to ``steps // 20``); a step whose loss is not finite stops the run.
    ``stop_after`` ends the run early on the same schedule (a test retrains the first steps).

    Returns
    -------
    VariantHistory
    """
    func = "train_variant"
    steps = validate_positive_int(func, "steps", steps)
    batch_size = validate_positive_int(func, "batch_size", batch_size)
    log_every = validate_positive_int(func, "log_every", log_every)
    T = model.config.context_length if T is None else validate_positive_int(func, "T", T)
    warmup = max(1, steps // 20) if warmup is None else validate_positive_int(func, "warmup",
                                                                              warmup)
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise fail(func, f"lr={lr!r} must be a positive number")
    rng = np.random.default_rng(seed)
    optimiser = Adam(model.parameters(), lr=lr, beta2=0.99)
    losses, log_steps, logs = [], [], []
    diverged = None
    bar = range(steps if stop_after is None else min(steps, stop_after))
    if progress:
        from tqdm.auto import tqdm  # a widget in Jupyter, text elsewhere: chosen when used

        bar = tqdm(bar, desc="training", unit="step", mininterval=0.5)
    start = time.perf_counter()
    with threadpool_limits(limits=blas_threads, user_api="blas"):
        for step in bar:
            optimiser.lr = learning_rate(step, steps, lr, warmup)
            x, y = random_windows(train_ids, batch_size, T, rng)
            measure = step % log_every == 0 or step + 1 == steps
            with np.errstate(over="ignore", invalid="ignore"):
                if measure:
                    loss, grads, stats = model.loss_and_grads(x, y, stats=True)
                else:
                    loss, grads = model.loss_and_grads(x, y)
            if not math.isfinite(loss):
                diverged = step
                break
            losses.append(loss)
            if measure:
                log_steps.append(step)
                logs.append(stats)
            if grad_clip is not None:
                norm = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
                if norm > grad_clip:
                    grads = {name: g * (grad_clip / norm) for name, g in grads.items()}
            optimiser.step(grads)
            if progress and step % 10 == 0:
                bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
    seconds = time.perf_counter() - start
    if progress:
        bar.close()

    def stacked(key):
        return np.array([[blk[key] for blk in log] for log in logs], dtype=float).reshape(
            len(logs), model.config.n_layers, model.config.h)

    return VariantHistory(np.array(losses), np.array(log_steps, dtype=int), stacked("max_logit"),
                          stacked("entropy"), stacked("sink_mass"), diverged, seconds)


def build_variant(recipe, variant: dict, dtype=np.float32) -> VariantGPT:
    """The untrained, seeded model of ``recipe`` with ``variant``'s switches."""
    return VariantGPT(GPTConfig(**recipe["config"]), BlockVariant(**variant),
                      rng=recipe["model_seed"], dtype=dtype)


def run(recipe, name: str, *, stop_after=None, progress=True):
    """Train run ``name`` of ``recipe`` (only its first ``stop_after`` steps when given);
    return ``(model, history)``."""
    spec = recipe["runs"][name]
    variant = spec.get("variant", spec) if "lr" in spec else spec
    lr = spec.get("lr", recipe.get("lr"))
    _, train_ids, _ = corpus()
    model = build_variant(recipe, variant)
    history = train_variant(model, train_ids, steps=recipe["steps"], stop_after=stop_after,
                            batch_size=recipe["batch_size"], T=recipe["T"], lr=lr,
                            warmup=max(1, recipe["steps"] // 20), seed=recipe["train_seed"],
                            grad_clip=recipe["grad_clip"],
                            log_every=recipe.get("log_every", recipe["steps"]),
                            progress=progress)
    return model, history


def _round(a, digits=4):
    return np.round(np.asarray(a, dtype=float), digits).tolist()


def make_growth(path=GROWTH, recipe=GROWTH_RECIPE, progress=True) -> dict:
    """Train every run of :data:`GROWTH_RECIPE`; write and return the curves."""
    out = {"recipe": recipe, "command": f"{COMMAND} growth", "runs": {}}
    for name in recipe["runs"]:
        _, hist = run(recipe, name, progress=progress)
        out["runs"][name] = {
            "loss": _round(hist.loss), "log_steps": hist.log_steps.tolist(),
            "max_logit": _round(hist.max_logit, 3), "entropy": _round(hist.entropy),
            "diverged_at": hist.diverged_at, "seconds": round(hist.seconds, 1),
            "first_losses": [float(x) for x in hist.loss[:FIRST_STEPS]]}
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    return out


def load_growth(path=GROWTH) -> dict:
    """The curves :func:`make_growth` wrote: ``runs[name]`` holds ``loss`` (per step),
    ``log_steps``, ``max_logit`` and ``entropy`` (per log, layer and head), ``diverged_at``,
    ``seconds``."""
    if not Path(path).exists():
        raise fail("load_growth", f"{path} does not exist: make it with {COMMAND} growth")
    return json.loads(Path(path).read_text())


def make_sink_models(path=SINK_MODELS, recipe=SINK_RECIPE, progress=True) -> dict:
    """Train every run of :data:`SINK_RECIPE`; save the models (float32) in one ``.npz``."""
    arrays, meta = {}, {"recipe": recipe, "command": f"{COMMAND} sinks", "runs": {}}
    for name in recipe["runs"]:
        model, hist = run(recipe, name, progress=progress)
        for key, p in model.parameters().items():
            arrays[f"{name}/{key}"] = p
        meta["runs"][name] = {"variant": asdict(model.variant), "seconds": round(hist.seconds, 1),
                              "final_loss": round(float(hist.loss[-20:].mean()), 4),
                              "first_losses": [float(x) for x in hist.loss[:FIRST_STEPS]]}
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(Path(path), **arrays)
    return meta


def load_sink_models(path=SINK_MODELS) -> tuple[dict[str, VariantGPT], dict]:
    """The three models :func:`make_sink_models` trained, by run name, and what it recorded."""
    if not Path(path).exists():
        raise fail("load_sink_models", f"{path} does not exist: make it with {COMMAND} sinks")
    with np.load(Path(path)) as data:
        meta = json.loads(str(data["meta"]))
        config = GPTConfig(**meta["recipe"]["config"])
        models = {}
        for name, info in meta["runs"].items():
            params = {key[len(name) + 1:]: data[key] for key in data.files
                      if key.startswith(f"{name}/")}
            models[name] = VariantGPT.from_parameters(config, params,
                                                      variant=BlockVariant(**info["variant"]))
    return models, meta


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["growth", "sinks"])
    args = parser.parse_args(argv)
    if args.what == "growth":
        out = make_growth()
        for name, r in out["runs"].items():
            print(f"{name}: {r['seconds']} s, final loss {r['loss'][-1]}, "
                  f"diverged at {r['diverged_at']}")
    else:
        meta = make_sink_models()
        print(json.dumps(meta["runs"], indent=1))


if __name__ == "__main__":
    main()
