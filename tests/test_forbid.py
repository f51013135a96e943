""""Write it yourself": a check fails an answer that calls what its exercise forbids, and says so.

Exercises 01.1 (matmul with loops: no NumPy), 02.1 (softmax: no library softmax) and 04.6
(cross-attention: not by calling the layer), among others, declare what they forbid; the harness
finds a use in the function's source (aliases and helpers included) or while it runs (a
profiler).
"""

from __future__ import annotations

import linecache
import sys
from pathlib import Path

import nbformat
import numpy as np
import numpy as xp
import pytest

import mha_course
from mha_course import checks
from mha_course import softmax as sm
from mha_course.checks import CheckFailed
from mha_course.checks.forbid import resolve, rules_for
from mha_course.checks.harness import call

ROOT = Path(__file__).resolve().parent.parent
LOOPS = "Exercise 01.1 asks you to multiply with three Python loops, without NumPy; your answer "
SOFTMAX = "Exercise 02.1 asks you to write the softmax yourself, with NumPy; your answer calls "
LAYER = ("Exercise 04.6 asks you to compute cross-attention from the layer's weights, not by "
         "calling the layer; your answer calls mha_course.MultiHeadAttention.forward")


# ------------------------------------------------------------------------------- 02.1 answers


def softmax_by_hand(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def masked_softmax_by_hand(x, mask):
    scores = np.where(mask, x, -np.inf)
    m = scores.max(axis=-1, keepdims=True)
    e = np.exp(scores - np.where(np.isfinite(m), m, 0.0))
    total = e.sum(axis=-1, keepdims=True)
    return e / np.where(total == 0, 1.0, total)


def calls_the_package(x):
    return mha_course.softmax(x)


def calls_an_alias(x):
    return sm(x)


def stable(x):
    return sm(x)


def calls_it_in_a_helper(x):
    return stable(x - 0.0)


def imports_it_inside(x):
    from mha_course import softmax as s2

    return s2(x)


def finds_it_by_name(x):  # nothing in the source names it: the profiler sees the call
    return getattr(mha_course, "soft" + "max")(x)


def calls_it_in_a_branch_not_taken(x):
    if x.ndim > 10:
        return mha_course.softmax(x)
    return softmax_by_hand(x)


LIBRARY_SOFTMAX = [
    (calls_the_package, "mha_course.softmax"),
    (calls_an_alias, "sm (mha_course.softmax)"),
    (calls_it_in_a_helper, "sm (mha_course.softmax) in your function `stable`"),
    (imports_it_inside, "s2 (mha_course.softmax)"),
    (finds_it_by_name, "mha_course.softmax"),
    (calls_it_in_a_branch_not_taken, "mha_course.softmax"),
]


@pytest.mark.parametrize(("answer", "called"), LIBRARY_SOFTMAX,
                         ids=[a.__name__ for a, _ in LIBRARY_SOFTMAX])
def test_softmax_may_not_call_a_library_softmax(answer, called, capsys):
    with pytest.raises(CheckFailed) as info:
        checks.check_softmax(answer)
    assert str(info.value) == SOFTMAX + called
    assert capsys.readouterr().out == ""


def test_softmax_by_hand_passes_although_the_check_calls_softmax_itself(capsys):
    checks.check_softmax(softmax_by_hand)  # the reference is mha_course.softmax
    assert capsys.readouterr().out.startswith("Exercise 02.1 passed: ")


def test_the_forbid_message_comes_before_the_likely_mistake():
    with pytest.raises(CheckFailed, match=r"asks you to write the softmax yourself"):
        checks.check_softmax(lambda x: mha_course.softmax(x, axis=-2))  # also the wrong axis


# ------------------------------------------------------------------------------- 01.1 answers


def matmul_loops(a, b):
    if len(a[0]) != len(b):
        raise ValueError(f"inner dimensions {len(a[0])} and {len(b)} differ")
    out = [[0] * len(b[0]) for _ in a]
    for i, row in enumerate(a):
        for k, a_ik in enumerate(row):
            for j in range(len(b[0])):
                out[i][j] += a_ik * b[k][j]
    return out


def matmul_numpy_alias(a, b):
    return (xp.asarray(a) @ xp.asarray(b)).tolist()


def matmul_ufunc_in_loops(a, b):  # a ufunc runs no Python code: only the source shows it
    if len(a[0]) != len(b):
        raise ValueError("inner dimensions differ")
    out = [[0] * len(b[0]) for _ in a]
    for i in range(len(a)):
        for k in range(len(b)):
            for j in range(len(b[0])):
                out[i][j] += int(np.multiply(a[i][k], b[k][j]))
    return out


def matmul_from_the_package(a, b):
    return mha_course.naive.matmul(a, b)


def matmul_in_the_other_loop_order(a, b):
    return mha_course.naive.matmul_ijk(a, b)


MATMUL = [
    (matmul_numpy_alias, LOOPS + "calls xp.asarray (numpy.asarray)"),
    (matmul_ufunc_in_loops, LOOPS + "calls np.multiply (numpy.multiply)"),
    (matmul_from_the_package, "Exercise 01.1 asks you to write the three loops yourself; your "
                              "answer calls mha_course.naive.matmul"),
    (matmul_in_the_other_loop_order, "Exercise 01.1 asks you to write the three loops "
                                     "yourself; your answer calls mha_course.naive.matmul_ijk"),
]


@pytest.mark.parametrize(("answer", "message"), MATMUL, ids=[a.__name__ for a, _ in MATMUL])
def test_matmul_with_loops_may_not_use_numpy_or_the_package(answer, message):
    with pytest.raises(CheckFailed) as info:
        checks.check_matmul_loops(answer)
    assert str(info.value) == message


def test_matmul_with_plain_loops_passes(capsys):
    checks.check_matmul_loops(matmul_loops)
    assert capsys.readouterr().out.startswith("Exercise 01.1 passed: ")


# ------------------------------------------------------------------------------- 04.6 answers


def cross_attention_by_hand(layer, x, context):
    q = mha_course.split_heads(x @ layer.W_q, layer.h)
    k = mha_course.split_heads(context @ layer.W_k, layer.h)
    v = mha_course.split_heads(context @ layer.W_v, layer.h)
    heads, weights = mha_course.scaled_dot_product_attention(q, k, v)
    return mha_course.merge_heads(heads) @ layer.W_o, weights


@pytest.mark.parametrize("answer", [
    lambda layer, x, context: layer(x, context=context),
    lambda layer, x, context: layer.forward(x, context),
    lambda layer, x, context: mha_course.MultiHeadAttention.forward(layer, x, context),
], ids=["layer(...)", "layer.forward(...)", "MultiHeadAttention.forward(layer, ...)"])
def test_cross_attention_may_not_call_the_layer(answer):
    with pytest.raises(CheckFailed) as info:
        checks.check_cross_attention(answer)
    assert str(info.value) == LAYER


def test_cross_attention_from_the_weights_passes(capsys):
    checks.check_cross_attention(cross_attention_by_hand)
    assert capsys.readouterr().out.startswith("Exercise 04.6 passed: ")


# -------------------------------------------------------------------------- the harness itself


def test_checker_calls_before_and_after_the_learners_call_do_not_count():
    x = np.arange(6.0).reshape(2, 3)
    want = mha_course.softmax(x)  # the checker's reference, before
    got = call("99.1", lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True), (x,), ("x",),
               forbid={"mha_course.softmax": "write it yourself"})
    np.testing.assert_allclose(got, mha_course.softmax(x))  # and after
    np.testing.assert_allclose(got, want)


def test_a_package_that_is_not_installed_is_skipped():
    assert resolve("surely_not_installed_pkg.softmax") is None
    got = call("99.1", masked_softmax_by_hand, (np.ones((2, 3)), np.ones((2, 3), bool)),
               ("x", "mask"), forbid={"surely_not_installed_pkg.softmax": "write it yourself"})
    assert got.shape == (2, 3)


def test_an_import_inside_the_function_of_a_package_not_loaded_is_matched_by_name():
    def uses_it(x):
        import surely_not_installed_pkg as lib

        return lib.softmax(x)

    with pytest.raises(CheckFailed, match=r"^Exercise 99\.1 asks you to write it yourself; your "
                                          r"answer calls lib\.softmax "
                                          r"\(surely_not_installed_pkg\.softmax\)$"):
        call("99.1", uses_it, (1.0,), ("x",),
             forbid={"surely_not_installed_pkg.softmax": "write it yourself"})


def test_a_whole_package_is_forbidden_below_its_top_level():
    rules = rules_for({"numpy": "do it by hand"})
    assert rules[0].module == "numpy" and rules[0].folder.endswith("numpy/")

    def norm(v):
        return float(np.linalg.norm(v))

    with pytest.raises(CheckFailed, match=r"calls np\.linalg\.norm \(numpy\.linalg.*norm\)$"):
        call("99.1", norm, ([3.0, 4.0],), ("v",), forbid={"numpy": "do it by hand"})


def test_the_previous_profiler_keeps_running_and_is_restored():
    events = []

    def profiler(frame, event, arg):
        events.append(event)

    sys.setprofile(profiler)
    try:
        call("99.1", matmul_loops, ([[1, 2]], [[3], [4]]), ("a", "b"),
             forbid={"numpy": "do it by hand"})
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)
    assert "call" in events


# ----------------------------------------------------- every solution, as notebook cells run it


SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_every_solution_passes_its_check_with_the_committed_output(path, capsys):
    """Run the solution notebook's code cells in one namespace, with their source in linecache
    as IPython keeps it (so the checks can read it), and compare what they print."""
    nb = nbformat.read(path, as_version=4)
    namespace = {"__name__": "__main__"}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        filename = f"<{path.stem} cell {index}>"
        linecache.cache[filename] = (len(cell.source), None,
                                     cell.source.splitlines(keepends=True), filename)
        exec(compile(cell.source, filename, "exec"), namespace)
        expected = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
        assert capsys.readouterr().out == expected, f"{path.name}, cell {index}"


# -------------------------------------- every exercise whose task says "write it yourself"


def _hand_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _per_head(x, W_q, W_k, W_v, W_o, mask=None):
    heads = [mha_course.scaled_dot_product_attention(x @ W_q[i], x @ W_k[i], x @ W_v[i], mask)
             for i in range(len(W_q))]
    return (np.concatenate([o for o, _ in heads], axis=-1) @ W_o,
            np.stack([w for _, w in heads], axis=1))


def _self_attention_with_package_masks(x, W_q, W_k, W_v, lengths):  # 03.5: fix, not replace
    T = x.shape[-2]
    mask = mha_course.causal_mask(T) & mha_course.padding_mask(lengths, T)
    scores = (x @ W_q) @ np.swapaxes(x @ W_k, -1, -2) / np.sqrt(W_q.shape[-1])
    weights = mha_course.softmax(scores, mask=mask)
    return weights @ (x @ W_v), weights


def _self_attention_fixed(x, W_q, W_k, W_v, lengths):  # 03.5 as the task allows
    T = x.shape[-2]
    real = np.arange(T)[None, :] < np.asarray(lengths)[:, None]  # (B, T)
    mask = np.tril(np.ones((T, T), dtype=bool)) & real[:, None, :]  # (B, T, T)
    scores = (x @ W_q) @ np.swapaxes(x @ W_k, -1, -2) / np.sqrt(W_q.shape[-1])
    weights = mha_course.softmax(scores, mask=mask)
    return weights @ (x @ W_v), weights


def _loss_with_log_softmax(logits, targets):  # 02.4 allows mha_course.log_softmax
    C = logits.shape[-1]
    logp = mha_course.log_softmax(logits).reshape(-1, C)
    t = targets.reshape(-1)
    real = t != -100
    return float(-logp[np.arange(len(t))[real], t[real]].mean())


#: (exercise's check, an answer that calls what the task asks to write, the end of the message)
PACKAGE_CALLS = [
    ("check_softmax", lambda x: mha_course.softmax(x),
     "write the softmax yourself, with NumPy; your answer calls mha_course.softmax"),
    ("check_softmax", lambda x: np.exp(mha_course.log_softmax(x)),
     "write the softmax yourself, with NumPy; your answer calls mha_course.log_softmax"),
    ("check_softmax", lambda x: np.exp(x - mha_course.logsumexp(x, keepdims=True)),
     "write the softmax yourself, with NumPy; your answer calls mha_course.logsumexp"),
    ("check_softmax", lambda x: np.array(mha_course.naive.softmax_rows(x.reshape(-1, x.shape[-1])
                                                                       .tolist())).reshape(x.shape),
     "write the softmax yourself, with NumPy; your answer calls mha_course.naive.softmax_rows"),
    ("check_log_softmax", lambda x: mha_course.log_softmax(x),
     "compute log-sum-exp yourself, with NumPy; your answer calls mha_course.log_softmax"),
    ("check_log_softmax", lambda x: x - mha_course.logsumexp(x, keepdims=True),
     "compute log-sum-exp yourself, with NumPy; your answer calls mha_course.logsumexp"),
    ("check_attention", lambda q, k, v, mask=None:
     mha_course.scaled_dot_product_attention(q, k, v, mask),
     "write scaled dot-product attention yourself (mha_course.softmax is allowed); your answer "
     "calls mha_course.scaled_dot_product_attention"),
    ("check_causal_mask", lambda T: mha_course.causal_mask(T),
     "build the causal mask yourself, with NumPy; your answer calls mha_course.causal_mask"),
    ("check_padding_mask", lambda lengths, S: mha_course.padding_mask(lengths, S),
     "build the padding mask yourself, with NumPy; your answer calls mha_course.padding_mask"),
    ("check_split_heads", lambda x, h: mha_course.split_heads(x, h),
     "split the heads yourself, with reshape and transpose; your answer calls "
     "mha_course.split_heads"),
    ("check_merge_heads", lambda x: mha_course.merge_heads(x),
     "merge the heads yourself, with transpose and reshape; your answer calls "
     "mha_course.merge_heads"),
    ("check_fuse_heads", lambda W: mha_course.MultiHeadAttention.from_per_head(
        W, W, W, np.zeros((W.shape[0] * W.shape[2], W.shape[1]))).W_q,
     "lay the heads side by side yourself, with NumPy; your answer calls "
     "mha_course.MultiHeadAttention.from_per_head"),
    ("check_param_count", lambda d_model, h, d_k, d_v, bias:
     mha_course.param_count(d_model, h, d_k, d_v, bias=bias),
     "count the parameters yourself, from the shapes; your answer calls mha_course.param_count"),
    ("check_param_count", lambda d_model, h, d_k, d_v, bias: sum(
        p.size for p in mha_course.MultiHeadAttention(d_model, h, d_k, d_v, bias=bias)
        .parameters().values()),
     "count the parameters yourself, from the shapes; your answer calls "
     "mha_course.MultiHeadAttention"),
    ("check_mha_forward", lambda x, W_q, W_k, W_v, W_o, mask=None:
     mha_course.MultiHeadAttention.from_per_head(W_q, W_k, W_v, W_o)(x, mask=mask),
     "write the multi-head forward yourself (mha_course.scaled_dot_product_attention is "
     "allowed); your answer calls mha_course.MultiHeadAttention"),
    ("check_matmul_shape", lambda a, b: xp.broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1]),
     "work out the shape from the rules, without NumPy; your answer calls "
     "xp.broadcast_shapes (numpy.broadcast_shapes)"),
    ("check_matmul_shape", lambda a, b: np.matmul(np.empty(a), np.empty(b)).shape,
     "work out the shape from the rules, without NumPy; your answer calls np.matmul "
     "(numpy.matmul)"),
    ("check_causal_self_attention", lambda x, W_q, W_k, W_v, lengths:
     mha_course.scaled_dot_product_attention(
         x @ W_q, x @ W_k, x @ W_v,
         mask=np.tril(np.ones((x.shape[1],) * 2, bool)) & (
             np.arange(x.shape[1]) < np.asarray(lengths)[:, None])[:, None, :]),
     "fix the colleague's attention yourself (mha_course.softmax is allowed); your answer "
     "calls mha_course.scaled_dot_product_attention"),
    ("check_causal_self_attention", _self_attention_with_package_masks,
     "fix the colleague's attention yourself (mha_course.softmax is allowed); your answer "
     "calls mha_course.causal_mask"),
]


@pytest.mark.parametrize(("check", "answer", "ending"), PACKAGE_CALLS,
                         ids=[f"{c}-{e.rsplit(' ', 1)[-1]}" for c, _, e in PACKAGE_CALLS])
def test_every_write_it_yourself_exercise_fails_a_call_to_the_package(check, answer, ending,
                                                                       capsys):
    with pytest.raises(CheckFailed) as info:
        getattr(checks, check)(answer)
    message = str(info.value)
    assert message.startswith("Exercise ") and " asks you to " in message
    assert message.endswith(ending), message
    assert capsys.readouterr().out == ""


def test_softmax_exercises_fail_pytorchs_softmax(torch):
    def torch_softmax(x):
        return torch.softmax(torch.from_numpy(x), dim=-1).numpy()

    def torch_masked(x):
        s = torch.from_numpy(np.where(x > -1e300, x, -np.inf))
        return torch.nan_to_num(torch.nn.functional.softmax(s, dim=-1)).numpy()

    def torch_loss(logits, targets):
        C = logits.shape[-1]
        return float(torch.nn.functional.cross_entropy(
            torch.from_numpy(logits.reshape(-1, C)), torch.from_numpy(targets.reshape(-1)),
            ignore_index=-100))

    with pytest.raises(CheckFailed, match=r"^Exercise 02\.1 asks you to write the softmax "
                                          r"yourself, with NumPy; your answer calls torch\."):
        checks.check_softmax(torch_softmax)
    with pytest.raises(CheckFailed, match=r"^Exercise 02\.1 asks you to write the softmax "
                                          r"yourself, with NumPy; your answer calls torch\."):
        checks.check_softmax(torch_masked)
    with pytest.raises(CheckFailed, match=r"^Exercise 02\.4 asks you to fix the loss with NumPy "
                                          r"\(mha_course\.log_softmax is allowed\); your answer "
                                          r"calls torch\."):
        checks.check_cross_entropy(torch_loss)


ALLOWED = [
    ("check_softmax_temperature", lambda x, tau: mha_course.softmax(x / tau)),
    ("check_softmax_temperature", lambda x, tau: _hand_softmax(x / tau)),
    ("check_attention", lambda q, k, v, mask=None: (
        lambda w: (w @ v, w))(mha_course.softmax(
            q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]),
            mask=None if mask is None else np.broadcast_to(mask, q.shape[:-1] + k.shape[-2:-1])))),
    ("check_causal_self_attention", _self_attention_fixed),
    ("check_cross_entropy", _loss_with_log_softmax),
    ("check_mha_forward", _per_head),
]


@pytest.mark.parametrize(("check", "answer"), ALLOWED,
                         ids=[f"{c}-{i}" for i, (c, _) in enumerate(ALLOWED)])
def test_tasks_that_allow_the_package_accept_it(check, answer, capsys):
    getattr(checks, check)(answer)
    assert " passed: " in capsys.readouterr().out


TASK_WORDS = {  # exercise -> words its task must contain, so the learner knows the rule
    "02.1": "check fails an answer that calls",
    "02.2": "You may use `mha_course.softmax`",
    "02.3": "check fails an answer that calls",
    "02.4": "PyTorch is not: the check fails an answer that calls it",
    "03.2": "The check fails an answer that calls",
    "03.3": "The check fails an answer that calls",
    "03.4": "The check fails an answer that calls",
    "03.5": "the package's attention and masks are not (`scaled_dot_product_attention`, "
            "`causal_mask`, `padding_mask`). The check fails an answer that calls one of them",
    "04.1": "The check fails an answer that calls",
    "04.2": "The check fails an answer that calls",
    "04.3": "The check fails an answer that calls",
    "04.4": "The check fails an answer that calls",
    "04.5": "The check fails an answer that calls",
    "04.6": "not by calling `layer` itself",
    "01.1": "no NumPy",
    "01.6": "without NumPy: the check fails an answer that calls it",
}


@pytest.mark.parametrize("exercise", sorted(TASK_WORDS))
def test_each_task_says_what_it_forbids_or_allows(exercise):
    tasks = {}
    for path in sorted((ROOT / "solutions").glob("0[1-4]_*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            meta = cell.metadata.get("mha_course", {})
            if meta.get("role") == "task":
                tasks[meta["exercise"]] = " ".join(cell.source.split())
    assert TASK_WORDS[exercise] in tasks[exercise], tasks[exercise]
