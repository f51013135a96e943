"""Build a class's folder of lesson-03 submissions, to time the checker on something realistic.

    python tests/data/make_class.py OUT [--n 30]
    python -m mha_course check OUT --jobs 2 --timeout 30 [--no-sandbox]

Each learner answers exercises 03.1 to 03.6 of ``exercises/03_single_head_attention.ipynb``:
mostly right, some with a classic mistake, some not attempted; one learner's 03.2 hangs and
one learner's 03.4 crashes the kernel. The mix is fixed (no randomness), so two timings see the
same class. ``tests/test_exercise_tools.py`` checks that the folder is built as described.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
LESSON = ROOT / "exercises" / "03_single_head_attention.ipynb"

RIGHT = {
    "03.1": "def attention_scores(q, k):\n"
            "    return q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])",
    "03.2": "def attention(q, k, v, mask=None):\n"
            "    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])\n"
            "    if mask is not None:\n"
            "        mask = np.broadcast_to(mask, scores.shape)\n"
            "    weights = mha_course.softmax(scores, mask=mask)\n"
            "    return weights @ v, weights",
    "03.3": "def causal_mask(T):\n    return np.tril(np.ones((T, T), dtype=bool))",
    "03.4": "def padding_mask(lengths, S):\n"
            "    return (np.arange(S)[None, :] < np.asarray(lengths)[:, None])[:, None, :]",
    "03.5": "def causal_self_attention(x, W_q, W_k, W_v, lengths):\n"
            "    T = x.shape[-2]\n"
            "    q, k, v = x @ W_q, x @ W_k, x @ W_v\n"
            "    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])\n"
            "    real = np.arange(T)[None, :] < np.asarray(lengths)[:, None]\n"
            "    mask = np.tril(np.ones((T, T), dtype=bool)) & real[:, None, :]\n"
            "    weights = mha_course.softmax(scores, mask=mask)\n"
            "    return weights @ v, weights",
    "03.6": "def choose_scale(q, k):\n    return 1 / (q * k).sum(axis=-1).std()",
}
WRONG = {
    "03.1": ["def attention_scores(q, k):\n    return q @ np.swapaxes(k, -1, -2)",
             "def attention_scores(q, k):\n    return q @ np.swapaxes(k, -1, -2) / 2.0"],
    "03.2": ["def attention(q, k, v, mask=None):\n"
             "    w = mha_course.softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]))\n"
             "    if mask is not None:\n"
             "        w = w * mask\n"
             "    return w @ v, w",
             "def attention(q, k, v, mask=None):\n"
             "    scores = q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1])\n"
             "    if mask is not None:\n"
             "        scores = np.where(mask, scores, -np.inf)\n"
             "    w = mha_course.softmax(scores)\n"
             "    return w @ v, w"],
    "03.3": ["def causal_mask(T):\n    return np.tril(np.ones((T, T), dtype=bool), k=-1)",
             "def causal_mask(T):\n    return np.triu(np.ones((T, T), dtype=bool))"],
    "03.4": ["def padding_mask(lengths, S):\n"
             "    return (np.arange(S)[None, :] <= np.asarray(lengths)[:, None])[:, None, :]",
             "def padding_mask(lengths, S):\n"
             "    return np.arange(S)[None, :] < np.asarray(lengths)[:, None]"],
    "03.5": ["def causal_self_attention(x, W_q, W_k, W_v, lengths):\n"
             "    T = x.shape[-2]\n"
             "    q, k, v = x @ W_q, x @ W_k, x @ W_v\n"
             "    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(x.shape[-1])\n"
             "    real = np.arange(T)[None, :] < np.asarray(lengths)[:, None]\n"
             "    mask = np.tril(np.ones((T, T), dtype=bool)) & real[:, None, :]\n"
             "    weights = mha_course.softmax(scores, mask=mask)\n"
             "    return weights @ v, weights"],
    "03.6": ["def choose_scale(q, k):\n    return 1 / np.sqrt(q.shape[-1])",
             "def choose_scale(q, k):\n    return 1 / (q * k).sum(axis=-1).var()"],
}
HANG = "def attention(q, k, v, mask=None):\n    while True:\n        pass"
CRASH = "import os\nos._exit(1)"
EXERCISES = sorted(RIGHT)


def answers_of(learner: int, n: int) -> dict[str, str | None]:
    """What learner ``learner`` of ``n`` typed for each exercise (None: left the stub)."""
    answers = {}
    for j, exercise in enumerate(EXERCISES):
        if (learner + 2 * j) % 5 == 0:
            wrong = WRONG[exercise]
            answers[exercise] = wrong[learner % len(wrong)]
        elif (learner + j) % 9 == 4:
            answers[exercise] = None
        else:
            answers[exercise] = RIGHT[exercise]
    if learner == n // 3:
        answers["03.2"] = HANG
    if learner == 2 * n // 3:
        answers["03.4"] = CRASH
    return answers


def make_class(out: Path, n: int = 30) -> list[Path]:
    """Write ``n`` learners' notebooks into ``out`` (created); return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for learner in range(n):
        nb = nbformat.read(LESSON, as_version=4)
        answers = answers_of(learner, n)
        for cell in nb.cells:
            meta = cell.metadata.get("mha_course", {})
            if meta.get("role") == "solution" and answers.get(meta["exercise"]) is not None:
                cell.source = answers[meta["exercise"]]
        path = out / f"learner{learner:02d}.ipynb"
        nbformat.write(nb, path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--n", type=int, default=30)
    args = parser.parse_args()
    print(f"wrote {len(make_class(args.out, args.n))} notebooks into {args.out}")
