"""The serving wing: what a server does around the attention. Lesson 10.

Taught in ``notebooks/10_serving.ipynb``. What lives here:

- ``decoder``: a decoder-only model as a server sees it (run chunk by chunk over a cache; built
  from lesson 09's GPT, or with random weights for tests), and the contiguous cache that
  generating one request alone uses;
- ``paged_cache``: the paged KV cache (PagedAttention, vLLM), taught in lesson 06
  (``notebooks/06_decoding.ipynb``): many sequences' keys and values in one pool of blocks;
  ``paged`` runs the decoder's layers over one such pool per layer, in lockstep;
- ``sampling``: choosing the next token (greedy, temperature, top-k, top-p, one inverse-CDF
  draw), taught in lesson 09 (``notebooks/09_tiny_gpt.ipynb``) and used by every generator;
- ``roofline``: the bytes and FLOPs of a decode step and of a prefill, and their time on a GPU
  from its datasheet;
- ``scheduler``: requests, a paged KV cache for many sequences, static and continuous batching
  and chunked prefill, under a cost model, with throughput, TTFT and TPOT;
- ``prefix_cache``: block hashing over the paged cache, so requests that share a prefix reuse
  its blocks;
- ``radix_cache``: a radix tree of token sequences (SGLang's RadixAttention), reusing any
  shared prefix token by token, taught in deep dive 10d
  (``notebooks/deep_dives/10d_serving_at_scale.ipynb``);
- ``speculative``: draft and verify, greedy and rejection sampling, the acceptance-rate
  formula, a tree-attention mask;
- ``split_kv``: Flash-Decoding's split of the cache into chunks, combined by log-sum-exp, and
  the occupancy that motivates it;
- ``quantized`` and ``eviction``: smaller caches, by quantised K and V (int8, an 8-bit float)
  and by eviction at a fixed budget (sliding window, StreamingLLM's sinks, H2O, SnapKV), as
  caches the decoder runs over.

What it may import: the attention itself (the package's top-level modules: the layer, its
caches, masks, positions, the block, the softmax), the kernels' tiled loop, the parallel wing's
log-sum-exp merge, and NumPy (``ml_dtypes`` for the 8-bit float). Never the models wing (a model
reaches it as the top level's layers and blocks, so this wing sits below the models), the checks,
the grading tools or the widgets, which may build on it. Import from
the module, not from the package's ``__init__``.
"""
