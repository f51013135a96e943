"""Validate at the boundary, trust inside: a forward checks its input once, its kernels never.

Every public function of ``mha_course._validate`` is wrapped with a counter wherever a module of
the package bound it (``from ._validate import ...`` copies the name), then one layer forward
runs. The kernels it calls on checked input (``split_heads_unchecked``, ``rope_unchecked``,
``sdpa_unchecked``, ``softmax_inplace``) must not enter the validators again.
"""

from __future__ import annotations

import collections
import inspect
import sys

import numpy as np
import pytest

import mha_course
from mha_course import MultiHeadAttention, _validate, causal_mask
from mha_course.models.gpt import GPT, GPTConfig


@pytest.fixture
def validator_calls(monkeypatch):
    """A Counter of validator entries, by validator name, from now until the test ends."""
    calls = collections.Counter()
    public = {name: f for name, f in vars(_validate).items()
              if inspect.isfunction(f) and f.__module__ == _validate.__name__
              and not name.startswith("_")}

    def counting(name, f):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return f(*args, **kwargs)
        return wrapper

    wrapped = {name: counting(name, f) for name, f in public.items()}
    originals = {id(f): name for name, f in public.items()}
    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith(mha_course.__name__):
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and id(value) in originals and value is public[originals[id(value)]]:
                monkeypatch.setattr(module, attr, wrapped[originals[id(value)]])
    return calls


def test_the_counter_sees_a_public_function_validate(validator_calls):
    q, k, v, mask = np.ones((2, 4)), np.ones((3, 4)), np.ones((3, 5)), causal_mask(2, 3)
    validator_calls.clear()
    mha_course.scaled_dot_product_attention(q, k, v, mask=mask)
    assert validator_calls["validate_mask"] == 1
    assert sum(validator_calls.values()) >= 7  # q, k, v as floats and shaped, the mask


def test_one_layer_forward_with_rope_gqa_and_a_mask_validates_at_most_8_times(validator_calls):
    layer = MultiHeadAttention(32, 4, n_kv_heads=2, rope="half", rng=0)
    x, mask = np.random.default_rng(0).normal(size=(2, 6, 32)), causal_mask(6)
    validator_calls.clear()  # the layer's and the mask's construction validated their sizes
    out, weights = layer(x, mask=mask)
    assert out.shape == (2, 6, 32) and weights.shape == (2, 4, 6, 6)
    assert sum(validator_calls.values()) <= 8, dict(validator_calls)
    assert validator_calls["validate_mask"] == 1, dict(validator_calls)


def test_the_layer_still_refuses_a_bad_mask_once_by_its_own_name():
    layer = MultiHeadAttention(8, 2, n_kv_heads=1, rope="half", rng=0)
    with pytest.raises(ValueError, match=r"^MultiHeadAttention: mask has shape \(4, 4\); "
                                         r"expected a shape that broadcasts to"):
        layer(np.ones((3, 8)), mask=np.ones((4, 4), dtype=bool))


def test_a_gpt_forward_validates_each_layer_once(validator_calls):
    model = GPT(GPTConfig(vocab_size=11, d_model=32, n_layers=2, h=4, n_kv_heads=2), rng=0)
    tokens = np.zeros((2, 8), dtype=int)
    validator_calls.clear()
    model.forward(tokens)
    # the causal mask is built once and checked once per layer, never again inside a layer
    assert validator_calls["validate_mask"] == 2, dict(validator_calls)
