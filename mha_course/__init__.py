"""mha_course: from matrix multiplication to multi-head attention, in NumPy.

The helper package of the course: each module implements one concept exactly as its lesson
teaches it (the module docstring names the lesson). Lessons write each concept inline, show it
equals the function here, and import it from then on. The README has a map of the modules.
"""

from .attention import (
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
    sliding_window_mask,
)
from .backward import attention_backward, gradient_check, softmax_jacobian
from .block import dropout, layer_norm, residual
from .cost import attention_flops, kv_cache_bytes, mla_cache_bytes, param_count
from .heads import merge_heads, split_heads
from .kv_cache import KVCache
from .linear_attention import elu_feature_map, linear_attention
from .mla import LatentCache, MultiHeadLatentAttention
from .multihead import MultiHeadAttention
from .paged_cache import PagedKVCache
from .positions import alibi_bias, alibi_slopes, apply_rope, rope_permutation, sinusoidal_positions
from .softmax import log_softmax, logsumexp, softmax
from .tasks import make_batch
from .tiled import tiled_attention
from .tiny_model import TinyTransformer

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
    "rope_permutation",
    "scaled_dot_product_attention",
    "sinusoidal_positions",
    "sliding_window_mask",
    "softmax",
    "softmax_jacobian",
    "split_heads",
    "tiled_attention",
]

__version__ = "0.1.0"
