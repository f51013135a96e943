"""A decoder-only model as a server sees it: its blocks, run chunk by chunk over a cache.

Taught in ``notebooks/10_serving.ipynb``. Lesson 09's GPT (``mha_course.models.gpt``) is a
pre-norm decoder: a token embedding, blocks of ``x + attn(rms_norm(x))`` and
``x + swiglu(rms_norm(x))`` whose attention is the package's :class:`~mha_course.MultiHeadAttention`
(causal, RoPE, GQA), a final RMSNorm and an output head. A server needs more ways to run it than
the model offers: over a *paged* cache shared by many sequences, over a quantised or an evicting
cache, a ragged batch of chunks of different lengths in one pass, a cache it can roll back.
:class:`Decoder` holds the same weights under the same names (``W_E``, ``blocks`` of
:class:`~mha_course.block.PreNormBlock`, ``norm_f``, ``W_U``): the model's own blocks,
:meth:`Decoder.from_model`, or random ones for tests, :meth:`Decoder.random`. It runs them two
ways:

- :meth:`Decoder.forward`: the whole sequence at once through each layer's own
  ``MultiHeadAttention.forward`` with a causal mask (the reference);
- :meth:`Decoder.step` / :meth:`Decoder.step_many`: new tokens over a cache. Every layer
  projects the new tokens of *all* sequences in one matrix product (a server's flattened batch)
  (the layer's own projection, ``MultiHeadAttention._project``) and hands each sequence's
  queries, keys and values to that sequence's cache, which stores them and attends
  (``cache.attend``, with the layer's RoPE and :func:`~mha_course.multihead.attend_heads`). Any
  object with ``length`` (positions already stored),
  ``attend(layer, q, k, v)`` and ``advance(n)`` is a cache: :class:`ContiguousCache` here, the
  paged, quantised and evicting caches in the other modules of this wing.

Keys and values reach the cache *unrotated*, with RoPE applied by the cache
(the layer's ``_rope``), so that a cache that evicts positions can choose which positions its
keys sit at (StreamingLLM's positions inside the cache). A cache that keeps every position
rotates each key once, at its true position, as lesson 06 §3 does: :class:`ContiguousCache` is a
:class:`~mha_course.KVCache` per layer and attends through the layer's own cached step.
"""

from __future__ import annotations

import functools

import numpy as np

from .._validate import fail, validate_positive_int
from ..attention import causal_mask
from ..block import PreNormBlock, rms_norm
from ..heads import merge_heads
from ..kv_cache import KVCache
from ..multihead import MultiHeadAttention
from .sampling import next_token


class ContiguousCache:
    """The cache of one sequence generated alone (or of ``batch`` sequences of equal length):
    one :class:`~mha_course.KVCache` per layer, every key and value in order.

    Keys are stored rotated at their positions, shape (g, S, d_k), or (batch, g, S, d_k) with
    ``batch`` (for :meth:`Decoder.step_batch`); each layer attends through its
    ``MultiHeadAttention``'s own cached step. :meth:`truncate` drops the last positions
    (speculative decoding rolls rejected drafts back with it).

    Examples
    --------
    >>> dec = Decoder.random(vocab=11, d_model=8, n_layers=2, h=2, rng=0)
    >>> cache = ContiguousCache(dec)
    >>> dec.step([1, 2, 3], cache).shape, cache.length
    ((3, 11), 3)
    >>> cache.truncate(1); cache.length, cache.keys[0].shape
    (1, (2, 1, 4))
    """

    def __init__(self, decoder: Decoder, batch: int | None = None):
        self.decoder = decoder
        self.length = 0
        lead = () if batch is None else (validate_positive_int("ContiguousCache", "batch", batch),)
        dtype = decoder.W_E.dtype  # a float32 model's cache stays float32
        self.caches = [KVCache(block.attn, lead, dtype=dtype) for block in decoder.blocks]

    @property
    def keys(self) -> list[np.ndarray]:
        """Per layer, the stored (rotated) keys (..., g, S, d_k)."""
        return [c.keys for c in self.caches]

    @property
    def values(self) -> list[np.ndarray]:
        """Per layer, the stored values (..., g, S, d_v)."""
        return [c.values for c in self.caches]

    def attend(self, layer: int, q, k, v):
        """Store the chunk's keys and values (T new positions) and attend over all of them.

        q (..., h, T, d_k), k (..., g, T, d_k), v (..., g, T, d_v), unrotated -> heads
        (..., h, T, d_v): the middle of ``MultiHeadAttention.step``.
        """
        return self.decoder.blocks[layer].attn._attend_cached(q, k, v, self.caches[layer])[0]

    def advance(self, n: int) -> None:
        """``n`` new positions are now stored in every layer."""
        self.length += n

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions of every layer (0 <= length <= self.length)."""
        for c in self.caches:
            c.truncate(length, "ContiguousCache.truncate")
        self.length = length


class Decoder:
    """A decoder-only transformer's weights, run whole or chunk by chunk over caches.

    Parameters
    ----------
    W_E : ndarray, shape (vocab, d_model)
        The token embedding.
    blocks : list of PreNormBlock
        Lesson 09's blocks (``GPT.blocks``), each with its ``MultiHeadAttention``.
    norm_f : ndarray, shape (d_model,)
    W_U : ndarray, shape (d_model, vocab)
        The output head (``W_E.T`` for tied weights).
    eps : float, default 1e-5
        RMSNorm's epsilon.

    Examples
    --------
    >>> dec = Decoder.random(vocab=13, d_model=16, n_layers=2, h=4, n_kv_heads=2, rng=0)
    >>> tokens = np.array([3, 1, 4, 1, 5])
    >>> full = dec.forward(tokens)                      # (T, vocab)
    >>> cache = ContiguousCache(dec)
    >>> chunked = np.concatenate([dec.step(tokens[:2], cache), dec.step(tokens[2:], cache)])
    >>> full.shape, bool(np.allclose(full, chunked))
    ((5, 13), True)
    """

    def __init__(self, W_E, blocks, norm_f, W_U, eps: float = 1e-5):
        self.W_E = np.asarray(W_E)
        self.blocks = list(blocks)
        self.norm_f = np.asarray(norm_f)
        self.W_U = np.asarray(W_U)
        self.eps = float(eps)
        for block in self.blocks:
            block.eps = self.eps
        self.vocab, self.d_model = self.W_E.shape

    # ------------------------------------------------------------------ building one
    @classmethod
    def random(cls, vocab, d_model, n_layers, h, n_kv_heads=None, d_ff=None, *, rng=None,
               rope="half", dtype=np.float64):
        """A decoder with random weights (for tests and for timing a wider model).

        Weights ~ N(0, 1/fan_in), norms 1; ``d_ff`` defaults to ``4 * d_model``.
        """
        func = "Decoder.random"
        vocab, d_model, n_layers, h = (validate_positive_int(func, name, n) for name, n in
                                       (("vocab", vocab), ("d_model", d_model),
                                        ("n_layers", n_layers), ("h", h)))
        d_ff = 4 * d_model if d_ff is None else validate_positive_int(func, "d_ff", d_ff)
        rng = np.random.default_rng(rng)

        def normal(n_in, n_out):
            return (rng.normal(size=(n_in, n_out)) / np.sqrt(n_in)).astype(dtype)

        blocks = []
        for _ in range(n_layers):
            attn = MultiHeadAttention(d_model, h, n_kv_heads=n_kv_heads, rope=rope, rng=rng)
            for name, W in attn.parameters().items():
                setattr(attn, name, W.astype(dtype))
            ones = np.ones(d_model, dtype)
            blocks.append(PreNormBlock(attn, ones, ones, normal(d_model, d_ff),
                                       normal(d_model, d_ff), normal(d_ff, d_model)))
        W_E = rng.normal(size=(vocab, d_model)).astype(dtype)
        return cls(W_E, blocks, np.ones(d_model, dtype), normal(d_model, vocab))

    @classmethod
    def from_model(cls, model):
        """The decoder of lesson 09's GPT: its own blocks and arrays, shared, not copied.

        Duck typing, so the serving wing never imports the models wing: the model needs
        ``W_E``, ``blocks`` (:class:`~mha_course.block.PreNormBlock` each), ``norm_f``, ``W_U``
        and ``config.eps``.

        Raises
        ------
        ValueError
            If the model lacks one of these.
        """
        try:
            return cls(model.W_E, model.blocks, model.norm_f, model.W_U, model.config.eps)
        except AttributeError as err:
            raise fail("Decoder.from_model", f"cannot read the blocks of a "
                       f"{type(model).__name__} ({err}); expected lesson 09's GPT: W_E, blocks "
                       "(PreNormBlock each), norm_f, W_U and config.eps") from None

    # -------------------------------------------------------------------- running it
    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def _tokens(self, func: str, tokens) -> np.ndarray:
        tokens = np.asarray(tokens)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise fail(func, f"tokens has shape {tokens.shape} and dtype {tokens.dtype}; "
                             "expected a 1-d array of token ids")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab):
            raise fail(func, f"token ids must lie in 0..{self.vocab - 1}; got "
                             f"{tokens.min()}..{tokens.max()}")
        return tokens

    def forward(self, tokens) -> np.ndarray:
        """Logits of every position, the whole sequence at once: tokens (T,) -> (T, vocab)."""
        tokens = self._tokens("Decoder.forward", tokens)
        x = self.W_E[tokens]  # (T, d_model)
        mask = causal_mask(len(tokens))
        for block in self.blocks:
            x = block(x, mask)  # each block's own forward, causal
        return self._logits(x)

    def _logits(self, x):
        """The final RMSNorm and the output head: (..., d_model) -> (..., vocab)."""
        return rms_norm(x, self.norm_f, self.eps) @ self.W_U

    def step(self, tokens, cache) -> np.ndarray:
        """Logits of ``tokens`` (T,) appended to ``cache`` -> (T, vocab); the cache grows by T."""
        return self.step_many([tokens], [cache])[0]

    def step_batch(self, tokens, cache: ContiguousCache) -> np.ndarray:
        """``batch`` sequences of equal length at once: tokens (B, T) over a
        ``ContiguousCache(decoder, batch=B)`` -> logits (B, T, vocab).

        One 2-d matrix product per weight for all ``B·T`` tokens, ``(B·T, d_model) @ W`` (a
        ``(B, T, d_model)`` array times ``W`` would run as ``B`` separate products, matrix-vector
        ones at ``T = 1``), and one batched attention: the decode step whose time deep dive 10a §1
        measures against the batch size.
        """
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise fail("Decoder.step_batch", f"tokens has shape {tokens.shape}; expected (B, T)")
        B, T = tokens.shape
        x = self.W_E[tokens.reshape(-1)]  # (B·T, d_model): one row per token
        for li, block in enumerate(self.blocks):
            x = block(x, attention=functools.partial(self._batch_attention, li, cache, B, T))
        cache.advance(T)
        return self._logits(x).reshape(B, T, -1)

    def _batch_attention(self, li: int, cache, B: int, T: int, a):
        """Block ``li``'s attention for :meth:`step_batch`: a (B·T, d_model) -> (B·T, d_model),
        every product a 2-d one, attention batched by the cache."""
        attn = self.blocks[li].attn
        qkv = (p.reshape(B, T, -1) for p in attn._project(a, a, a.dtype))  # (B, T, n·d)
        heads = cache.attend(li, *attn._heads(*qkv))  # (B, h, T, d_v)
        return attn._output(merge_heads(heads).reshape(B * T, -1), a.dtype)

    def step_many(self, chunks, caches, last_only: bool = False) -> list[np.ndarray]:
        """One pass over a ragged batch: ``chunks[i]`` (T_i,) appended to ``caches[i]``.

        The projections and MLPs of all ``ΣT_i`` tokens are one matrix product per weight, as in
        a server's flattened batch; attention is per sequence, by its cache.

        Returns
        -------
        list of ndarray
            ``(T_i, vocab)`` logits per chunk, or ``(vocab,)`` of its last token with
            ``last_only=True`` (a server samples from the last position only).
        """
        func = "Decoder.step_many"
        if len(chunks) != len(caches):
            raise fail(func, f"{len(chunks)} chunks but {len(caches)} caches; one cache each")
        chunks = [self._tokens(func, c) for c in chunks]
        if any(len(c) == 0 for c in chunks):
            raise fail(func, "every chunk needs at least one token")
        bounds = np.cumsum([0] + [len(c) for c in chunks])
        x = self.W_E[np.concatenate(chunks)]  # (N, d_model), N = ΣT_i
        for li, block in enumerate(self.blocks):
            x = block(x, attention=functools.partial(self._ragged_attention, li, caches, bounds))
        for cache, chunk in zip(caches, chunks, strict=True):
            cache.advance(len(chunk))
        if last_only:
            return list(self._logits(x[bounds[1:] - 1]))  # the last token of each chunk
        logits = self._logits(x)  # (N, vocab)
        return [logits[bounds[i]:bounds[i + 1]] for i in range(len(chunks))]

    def _ragged_attention(self, li: int, caches, bounds, a):
        """Block ``li``'s attention for :meth:`step_many`: a (N, d_model) -> (N, d_model); one
        product per weight for all N tokens, attention per sequence by its cache."""
        attn = self.blocks[li].attn
        q_all, k_all, v_all = attn._project(a, a, a.dtype)  # (N, h·d_k | g·d_k | g·d_v)
        heads = []
        for i, cache in enumerate(caches):
            s = slice(bounds[i], bounds[i + 1])
            qkv = attn._heads(q_all[s], k_all[s], v_all[s])  # (h | g, T_i, d)
            heads.append(merge_heads(cache.attend(li, *qkv)))  # (T_i, h·d_v)
        return attn._output(np.concatenate(heads), a.dtype)  # (N, d_model)

    # ------------------------------------------------------------------- sizes
    def parameters(self) -> dict[str, np.ndarray]:
        """Every weight by name, as lesson 09's ``GPT.parameters()`` names them (``W_E``,
        ``L{i}.attn_norm``, ``L{i}.W_q`` .. ``L{i}.W_down``, ``norm_f``, ``W_U``)."""
        params = {"W_E": self.W_E}
        for i, block in enumerate(self.blocks):
            params.update({f"L{i}.{name}": W for name, W in block.parameters().items()})
        return {**params, "norm_f": self.norm_f, "W_U": self.W_U}

    def parameter_count(self, embedding: bool = True) -> int:
        """Parameters; ``embedding=False`` leaves out the embedding table, of which a step
        reads only the rows of its tokens."""
        n = sum(p.size for p in self.parameters().values())
        return n - (0 if embedding else self.W_E.size)

    def weight_bytes(self) -> int:
        """Bytes a decode step reads for the weights: all but the embedding table."""
        return self.parameter_count(embedding=False) * self.W_E.dtype.itemsize


def generate_alone(decoder: Decoder, prompt, n_new: int, *, temperature: float = 0.0,
                   seed=None) -> list[int]:
    """Generate ``n_new`` tokens after ``prompt`` for one request alone (the reference).

    Prefill the prompt in one chunk over a :class:`ContiguousCache`, then one token at a time:
    greedy (``temperature=0``) or sampled with ``sample_token(logits, temperature, rng)`` from
    ``np.random.default_rng(seed)``, one uniform number per token.
    """
    rng = np.random.default_rng(seed)
    cache = ContiguousCache(decoder)
    logits = decoder.step(np.asarray(prompt), cache)[-1]
    out = []
    for _ in range(n_new):
        token = sample_token(logits, temperature, rng)
        out.append(token)
        if len(out) < n_new:
            logits = decoder.step(np.array([token]), cache)[-1]
    return out


def sample_token(logits, temperature: float, rng) -> int:
    """Greedy (``temperature=0``: the argmax) or one draw from the softmax of
    ``logits / temperature``: lesson 09's :func:`~mha_course.serving.sampling.next_token`."""
    return int(next_token(logits, temperature, rng=rng))
