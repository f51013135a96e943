"""Deep dive 06c (``notebooks/deep_dives/06c_model_family_layouts.ipynb``) and exercise 06.7.

What the notebook asserts, tested here: its inline masks (causal, sliding window, Llama 4's
chunk) against the package's and against an independent block construction, the chunk boundary
(one key against ``W``), the cache arithmetic of Gemma 3 27B, Llama 4 Scout, CLA2 and YOCO
against :func:`mha_course.cost.cache_bytes`, the receptive field of chunked against windowed
stacks, and its forward pass of lesson 09's model against :class:`~mha_course.models.gpt.GPT`,
mask by mask. Then 06.7's check: the right answer passes, each classic mistake is named.

The notebook's code is read from the notebook itself (its code cells, run here), so what is
tested is what the learner reads.
"""

from __future__ import annotations

import contextlib
import functools
import io
from pathlib import Path

import matplotlib
import nbformat
import numpy as np
import pytest

from mha_course import causal_mask, checks, sliding_window_mask
from mha_course.checks import CheckFailed
from mha_course.checks.lesson06 import reference_chunked_mask
from mha_course.cost import MODELS, cache_bytes
from mha_course.models.gpt import GPT
from mha_course.models.shakespeare import load_shakespeare_gpt

NOTEBOOK = (Path(__file__).resolve().parent.parent / "notebooks" / "deep_dives"
            / "06c_model_family_layouts.ipynb")


def _code_cells() -> list[str]:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


@functools.cache
def _namespace(until: str) -> dict:
    """The notebook's namespace after its code cells up to (not including) the first cell that
    contains ``until``; figures drawn off screen, prints swallowed."""
    matplotlib.use("Agg")
    ns: dict = {"display": lambda *a, **k: None}
    with contextlib.redirect_stdout(io.StringIO()):
        for source in _code_cells():
            if until in source:
                break
            exec(source.replace("%matplotlib inline", ""), ns)  # noqa: S102
    return ns


def _setup_and_sections_1_to_4() -> dict:
    return _namespace("pkg = Path(mha_course.__file__)")


def _with_model() -> dict:
    return _namespace("full = [{")


# ------------------------------------------------------------------------------- the masks
@pytest.mark.parametrize(("T", "size"), [(10, 4), (7, 3), (9, 1), (4, 10), (16, 5), (6, 6)])
def test_the_notebooks_masks_equal_the_package_and_the_block_construction(T, size):
    ns = _setup_and_sections_1_to_4()
    np.testing.assert_array_equal(ns["my_causal_mask"](T), causal_mask(T))
    np.testing.assert_array_equal(ns["my_sliding_mask"](T, size), sliding_window_mask(T, size))
    chunked = ns["my_chunked_mask"](T, size)
    np.testing.assert_array_equal(chunked, reference_chunked_mask(T, size))
    # independently: a causal triangle in each diagonal block of `size`, nothing off the blocks
    blocks = np.zeros((T, T), dtype=bool)
    for start in range(0, T, size):
        stop = min(T, start + size)
        blocks[start:stop, start:stop] = np.tril(np.ones((stop - start,) * 2, dtype=bool))
    np.testing.assert_array_equal(chunked, blocks)
    assert (chunked <= sliding_window_mask(T, size)).all()  # a chunk is inside the window
    assert (chunked == causal_mask(T)).all() == (size >= T)


def test_at_a_chunk_boundary_the_query_sees_one_key_against_the_windows_w():
    ns = _setup_and_sections_1_to_4()
    keys = ns["keys_seen_by"]
    for C in (4, 8192):
        assert keys(C, "chunked", C) == 1 and keys(C, "sliding", C) == C
        assert keys(C - 1, "chunked", C) == keys(C - 1, "sliding", C) == C
    T, C = 12, 4
    chunked, window = reference_chunked_mask(T, C), sliding_window_mask(T, C)
    assert chunked.sum(axis=1).tolist() == [1, 2, 3, 4] * 3
    assert window.sum(axis=1).tolist() == [1, 2, 3] + [4] * 9


def test_a_chunked_stack_never_crosses_a_boundary_a_windowed_one_hops():
    ns = _setup_and_sections_1_to_4()
    moved = ns["moved"]
    assert [moved["sliding", d] for d in range(1, 5)] == [3, 6, 9, 12]
    assert [moved["chunked", d] for d in range(1, 5)] == [3, 3, 3, 3]


# ---------------------------------------------------------------------- the cache arithmetic
def _bytes(per_layer_values, n_global, n_local, N, size, n_bytes=2):
    """2·g·d_head·b·(L_global·N + L_local·min(N, size)), written again."""
    return per_layer_values * n_bytes * (n_global * N + n_local * min(N, size))


@pytest.mark.parametrize("N", [1, 1000, 1024, 1025, 8192, 131_072])
def test_gemma3_and_llama4_caches_follow_the_formula_and_the_package(N):
    ns = _setup_and_sections_1_to_4()
    gemma, llama = ns["GEMMA3_27B"], ns["LLAMA4_SCOUT"]
    assert (gemma["num_hidden_layers"], gemma["num_key_value_heads"], gemma["head_dim"],
            gemma["sliding_window"], gemma["sliding_window_pattern"]) == (62, 16, 128, 1024, 6)
    assert (llama["num_hidden_layers"], llama["num_key_value_heads"], llama["head_dim"],
            llama["attention_chunk_size"], llama["no_rope_layer_interval"]) == (48, 8, 128, 8192, 4)
    layout = ns["layout_cache_bytes"]
    want_g = _bytes(2 * 16 * 128, 10, 52, N, 1024)
    assert layout(2 * 16 * 128, ns["gemma_types"], N, 1024) == want_g
    assert cache_bytes({**gemma, "layer_types": ("sliding_attention",) * 5
                        + ("full_attention",)}, N) == want_g
    want_l = _bytes(2 * 8 * 128, 12, 36, N, 8192)
    assert layout(2 * 8 * 128, ns["llama_types"], N, 8192) == want_l
    assert cache_bytes(ns["package_l4"], N) == want_l


def test_the_printed_ratios_and_per_token_growth():
    ns = _setup_and_sections_1_to_4()
    assert ns["gemma_bytes"] == 10 * 8192 * 131_072 + 52 * 8192 * 1024
    assert round(ns["as_global"] / ns["gemma_bytes"], 1) == 6.0
    assert ns["per_token_g"] == 80 * 1024  # KiB a token past the window adds
    assert round(ns["llama_all_global"] / ns["llama_bytes"], 1) == 3.4
    bytes_b = ns["bytes_b"]
    full = bytes_b["Llama 3 8B as shipped"]
    assert full == cache_bytes(MODELS["Llama 3 8B"], 131_072)
    assert bytes_b["CLA2 (pairs share)"] * 2 == full
    # YOCO: 16 windows of 1024 plus one global layer of N, per 2·g·d_head·b
    assert bytes_b["YOCO (L/2 SWA + 1 shared global)"] == 2048 * 2 * (16 * 1024 + 131_072)
    assert round(full / bytes_b["YOCO (L/2 SWA + 1 shared global)"], 1) == 28.4


def test_reach_of_an_interleaved_stack_is_everything_from_the_first_global_layer():
    ns = _setup_and_sections_1_to_4()
    reach = ns["reach"]
    assert reach(["local"] * 5 + ["global"], 1024, 131_072) == [
        1024, 2047, 3070, 4093, 5116, 131_072]
    assert reach(["local"] * 32, 4096, 10**6)[-1] == 32 * 4095 + 1  # 06b's Mistral number


# ------------------------------------------------------- the forward of lesson 09's model
class _MaskedGPT(GPT):
    """The package's GPT with one mask per block, through its attention hook."""

    masks: list = []

    def _attention(self, i, a, mask, head_mask, keep):
        return self.blocks[i].attn.forward(a, mask=self.masks[i])[0], None, None


@pytest.fixture(scope="module")
def model_and_windows():
    ns = _with_model()
    model, _ = load_shakespeare_gpt(dtype=np.float32)
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(ns["val_ids"]) - 65, size=3)
    x = np.stack([ns["val_ids"][s : s + 64] for s in starts])
    return ns, model, x


@pytest.mark.parametrize("kind", ["causal", "sliding", "chunked"])
def test_the_notebooks_forward_is_the_package_models_mask_by_mask(model_and_windows, kind):
    ns, model, x = model_and_windows
    T = x.shape[-1]
    mask = {"causal": causal_mask(T), "sliding": sliding_window_mask(T, 16),
            "chunked": reference_chunked_mask(T, 16)}[kind]
    masked = _MaskedGPT.from_parameters(model.config, model.parameters())
    masked.masks = [mask, causal_mask(T)]
    want = masked.forward(x)
    got = ns["forward"](x, [{"mask": mask}, {"mask": causal_mask(T)}])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    if kind == "causal":
        np.testing.assert_allclose(got, model.forward(x), rtol=1e-4, atol=1e-4)


def test_yoco_with_one_cross_layer_is_local_then_global(model_and_windows):
    ns, _, x = model_and_windows
    T = x.shape[-1]
    local, glob = sliding_window_mask(T, 16), causal_mask(T)
    a = ns["forward"](x, [{"mask": local}, {"mask": glob}])
    b = ns["forward"](x, [{"mask": local}, {"mask": glob, "kv": 1}])
    np.testing.assert_array_equal(a, b)
    cla = ns["forward"](x, [{"mask": glob}, {"mask": glob, "kv": 0}])
    assert np.abs(cla - ns["forward"](x, [{"mask": glob}, {"mask": glob}])).max() > 0.1


# ------------------------------------------------------------------------ exercise 06.7
def _chunk_variant(rule):
    def mask(T, chunk):
        t, s = np.arange(T)[:, None], np.arange(T)[None, :]
        return {
            "right": (s <= t) & (s // chunk == t // chunk),
            "sliding": (s <= t) & (t - s < chunk),
            "late": (s <= t) & ((s - 1) // chunk == (t - 1) // chunk),
            "early": (s <= t) & ((s + 1) // chunk == (t + 1) // chunk),
            "blocks only": s // chunk == t // chunk,
            "strict": (s < t) & (s // chunk == t // chunk),
            "future": (s <= t + 1) & (s // chunk == t // chunk),
            "ints": ((s <= t) & (s // chunk == t // chunk)).astype(int),
        }[rule]
    return mask


def test_the_right_chunked_mask_passes(capsys):
    checks.check_chunked_mask(_chunk_variant("right"))
    assert capsys.readouterr().out.startswith("Exercise 06.7 passed:")


@pytest.mark.parametrize(("rule", "pattern"), [
    ("sliding", r"a sliding window instead of a chunk"),
    ("late", r"chunk boundaries off by one"),
    ("early", r"chunk boundaries off by one"),
    ("blocks only", r"not causal within the chunk"),
    ("strict", r"a token must be able to attend to itself"),
    ("future", r"would see the future key .*Not causal within the chunk"),
    ("ints", r"expected bool"),
])
def test_the_check_names_each_classic_mistake(rule, pattern, capsys):
    with pytest.raises(CheckFailed, match=pattern) as info:
        checks.check_chunked_mask(_chunk_variant(rule))
    assert str(info.value).startswith("Exercise 06.7:")
    assert capsys.readouterr().out == ""
