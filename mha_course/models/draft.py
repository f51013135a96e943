"""Lesson 10's draft model: a smaller Shakespeare GPT, trained by lesson 09's recipe.

Taught in ``notebooks/10_serving.ipynb`` (§4, speculative decoding), where it drafts tokens for
lesson 09's model (:func:`~mha_course.models.shakespeare.load_shakespeare_gpt`) to verify.
:data:`DRAFT_RECIPE` is lesson 09's recipe format (:data:`~mha_course.models.shakespeare.RECIPE`)
at a smaller config: one block, ``d_model`` 32, two query heads sharing one K/V head (MQA),
the same vocabulary, context 256 and training loop. It is made by::

    python -m mha_course.models.draft      # DRAFT_RECIPE -> shakespeare_draft.npz

which calls lesson 09's :func:`~mha_course.models.shakespeare.make_checkpoint` with this recipe
(seeded, with a ``tqdm`` bar, on one BLAS thread) and stores what the run recorded beside the
weights; ``tests/test_draft.py`` retrains its first steps from the recipe and compares them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .._validate import fail
from .gpt import GPT
from .shakespeare import checkpoint_info, make_checkpoint

HERE = Path(__file__).parent
DRAFT = HERE / "shakespeare_draft.npz"
COMMAND = "python -m mha_course.models.draft"

#: The draft: lesson 09's recipe, smaller.
DRAFT_RECIPE = {
    "config": {"vocab_size": 65, "d_model": 32, "n_layers": 1, "h": 2, "n_kv_heads": 1,
               "context_length": 256},
    "model_seed": 0, "train_seed": 0, "steps": 1200, "batch_size": 16, "T": 256, "lr": 3e-3,
    "repeat_fraction": 0.0,
}


def draft_info(path=DRAFT) -> dict:
    """What the recipe recorded with the shipped draft (as lesson 09's ``checkpoint_info``)."""
    return checkpoint_info(path)


def load_draft_gpt(dtype=np.float32, path=DRAFT) -> GPT:
    """The shipped draft model.

    Raises
    ------
    ValueError
        If the file is missing or was made with another recipe than :data:`DRAFT_RECIPE`.

    Examples
    --------
    >>> draft = load_draft_gpt()
    >>> draft.config.d_model, draft.config.n_layers, draft.config.vocab_size
    (32, 1, 65)
    """
    if not Path(path).exists():
        raise fail("load_draft_gpt", f"{path} does not exist: make it with {COMMAND}")
    if Path(path) == DRAFT and draft_info(path)["recipe"] != DRAFT_RECIPE:
        raise fail("load_draft_gpt", f"{path} was made with another recipe than DRAFT_RECIPE: "
                                     f"make it again with {COMMAND}")
    return GPT.load(path, dtype=dtype)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    _, meta = make_checkpoint(DRAFT, DRAFT_RECIPE, progress=not args.no_progress)
    print(f"wrote {DRAFT}: {meta['steps']} steps in {meta['seconds']} s, validation loss "
          f"{meta['val_loss']} nats per character, {meta['n_params']:,} parameters")


if __name__ == "__main__":
    main()
