"""mha_course: from matrix multiplication to multi-head attention, in NumPy.

The helper package of the course: each module implements one concept exactly as its lesson
teaches it (the module docstring names the lesson). Lessons write each concept inline, show it
equals the function here, and import it from then on. The README has a map of the modules.
The package is imported from lesson 01 (``notebooks/01_matmul.ipynb``) on; this ``__init__``
re-exports names whose modules say which lesson teaches them.

The package is in wings, and imports point down this list:

- ``mha_course.widgets``: what draws (plots, the stepper, explorer, tile stepper, cache-memory
  calculator, head viewer, the app); may import everything below;
- ``mha_course.grading`` and ``mha_course.checks``: what judges (the checker, its sandbox and
  reports; one check module per lesson, the interview drill's in ``checks.drill``); may import
  the models and the attention;
- ``mha_course.models``: what learns (tasks, the tiny model, the GPT and its variants, training,
  specialisation scores, shipped weights); may import serving, the variants and the attention;
- ``mha_course.serving`` (lesson 10: the decoder, paged and compressed caches, scheduling,
  speculative and split-KV decoding; lesson 09's sampling) and ``mha_course.parallel``
  (lesson 11: simulated devices and collectives, tensor, ring and Ulysses parallelism,
  activation memory, packing; lesson 12: precision): attention as a server and a cluster run
  it; may import the kernels and the attention (serving also the parallel wing's log-sum-exp
  merge);
- ``mha_course.variants``: the attention of recent models (MLA, RoPE scaling, sinks, logit
  control, gated, sparse, linear attention and the delta rule, entropy); may import the top level;
- ``mha_course.kernels`` (lesson 07): the same attention ordered for a machine, FlashAttention-2's
  tiled loop and every fast path, each tested equal to the readable one; may import the top level;
- the top level, here: the attention itself, what lessons 01 to 07 teach (softmax, masks, heads,
  positions, the block, the layer, its backward pass, caches, costs and real configurations);
  NumPy only.

This ``__init__`` re-exports the names the lessons use, from the top level and from the models
wing (``TinyTransformer``, ``make_batch``); the widgets are imported from ``mha_course.widgets``,
so ``import mha_course`` never loads matplotlib.
"""

from .attention import (
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from .backward import attention_backward, gradient_check, softmax_jacobian
from .block import dropout, layer_norm, residual, rms_norm, swiglu
from .cost import attention_flops, kv_cache_bytes, mla_cache_bytes, param_count
from .heads import merge_heads, split_heads
from .kernels.tiled import tiled_attention
from .kv_cache import KVCache
from .models.tasks import make_batch
from .models.tiny_model import TinyTransformer
from .multihead import MultiHeadAttention
from .positions import alibi_bias, alibi_slopes, apply_rope, rope_permutation, sinusoidal_positions
from .serving.paged_cache import PagedKVCache
from .softmax import log_softmax, logsumexp, softmax
from .variants.linear_attention import elu_feature_map, linear_attention
from .variants.mla import LatentCache, MultiHeadLatentAttention

__all__ = [
    "KVCache",
    "LatentCache",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "PagedKVCache",
    "TinyTransformer",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "attention_backward",
    "attention_flops",
    "causal_mask",
    "dropout",
    "elu_feature_map",
    "gradient_check",
    "kv_cache_bytes",
    "layer_norm",
    "linear_attention",
    "log_softmax",
    "logsumexp",
    "make_batch",
    "merge_heads",
    "mla_cache_bytes",
    "padding_mask",
    "param_count",
    "residual",
    "rms_norm",
    "rope_permutation",
    "scaled_dot_product_attention",
    "sinusoidal_positions",
    "sliding_window_mask",
    "softmax",
    "softmax_jacobian",
    "split_heads",
    "swiglu",
    "tiled_attention",
]

__version__ = "0.1.0"
