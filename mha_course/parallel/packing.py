"""Packed sequences: several documents in one row, kept apart by ``cu_seqlens``.

Taught in ``notebooks/11_parallel.ipynb`` (section 5); positions and Tiny Shakespeare's speeches
(:func:`speeches`, :func:`attention_work`) in ``notebooks/deep_dives/11a_parallel_at_scale.ipynb``
(section 5).

Training batches are rows of a fixed length ``L``. Padding each document to ``L`` wastes the
padded slots; **packing** puts several documents end to end in one row. The documents must then
stay apart: a token may attend only to earlier tokens *of its own document*. FlashAttention-2's
variable-length API (``flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k,
max_seqlen_q, max_seqlen_k, causal=True)``) describes the packing by the cumulative lengths
``cu_seqlens = [0, n_0, n_0 + n_1, ...]`` and runs each document as its own attention problem;
PyTorch's ``torch.nn.attention.varlen.varlen_attn`` takes the same ``cu_seq_q`` / ``cu_seq_k``.
As a mask, that is the block-diagonal causal mask of :func:`varlen_mask`.

Positions restart at 0 in each document (:func:`packed_positions`), as Hugging Face's
``DataCollatorWithFlattening`` returns them; its flash-attention path also reads the document
boundaries back from where the positions drop to 0.
"""

from __future__ import annotations

import numpy as np

from .._validate import fail, validate_positive_int
from ..attention import scaled_dot_product_attention, validate_qkv


def cu_seqlens(lengths) -> np.ndarray:
    """``[0, n_0, n_0 + n_1, ...]``: where each document starts in the packed row (int64).

    Raises
    ------
    ValueError
        If a length is not a positive integer.

    Examples
    --------
    >>> cu_seqlens([3, 1, 4]).tolist()
    [0, 3, 4, 8]
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths < 1).any():
        raise fail("cu_seqlens", f"lengths={lengths.tolist()!r}; expected a 1-D list of "
                                 "positive integers, one per document")
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def _validate_cu(func: str, cu) -> np.ndarray:
    cu = np.asarray(cu)
    if (cu.ndim != 1 or cu.size < 2 or cu.dtype.kind not in "iu" or cu[0] != 0
            or (np.diff(cu) < 1).any()):
        raise fail(func, f"cu_seqlens={cu.tolist()!r}; expected [0, n_0, n_0 + n_1, ...], "
                         "increasing integers starting at 0 (build it with cu_seqlens(lengths))")
    return cu.astype(np.int64)


def document_ids(cu) -> np.ndarray:
    """The document each packed token belongs to: (total,) ints.

    Examples
    --------
    >>> document_ids([0, 3, 4, 8]).tolist()
    [0, 0, 0, 1, 2, 2, 2, 2]
    """
    cu = _validate_cu("document_ids", cu)
    return np.repeat(np.arange(cu.size - 1), np.diff(cu))


def packed_positions(cu) -> np.ndarray:
    """Each token's position within its own document: (total,) ints restarting at 0.

    Examples
    --------
    >>> packed_positions([0, 3, 4, 8]).tolist()
    [0, 1, 2, 0, 0, 1, 2, 3]
    """
    cu = _validate_cu("packed_positions", cu)
    return np.arange(cu[-1]) - np.repeat(cu[:-1], np.diff(cu))


def varlen_mask(cu, causal: bool = True) -> np.ndarray:
    """The block-diagonal mask of a packed row: token ``t`` may attend to token ``s`` iff they
    are in the same document (and, with ``causal``, ``s <= t``). Shape (total, total), bool.

    Examples
    --------
    >>> varlen_mask([0, 2, 3]).astype(int).tolist()
    [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    """
    doc = document_ids(_validate_cu("varlen_mask", cu))
    mask = doc[:, None] == doc[None, :]
    if causal:
        mask &= np.tri(doc.size, dtype=bool)
    return mask


def varlen_attention(q, k, v, cu, causal: bool = True) -> np.ndarray:
    """Attention over packed documents, each document on its own (FlashAttention-2's varlen
    forward, in NumPy): ``q`` (..., total, d_k), ``k`` (..., total, d_k), ``v``
    (..., total, d_v) -> (..., total, d_v). Never builds the (total, total) mask: each
    document's (n_i, n_i) attention is computed alone, so the work is ``Σ n_i²``, not
    ``total²``.

    Raises
    ------
    ValueError
        On shapes :func:`mha_course.scaled_dot_product_attention` refuses, a bad ``cu_seqlens``,
        or a packed length that is not ``cu_seqlens[-1]``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> q = k = v = rng.normal(size=(2, 5, 4))
    >>> out = varlen_attention(q, k, v, [0, 2, 5])
    >>> alone = scaled_dot_product_attention(q[:, 2:], k[:, 2:], v[:, 2:],
    ...                                      mask=np.tri(3, dtype=bool))[0]
    >>> bool(np.allclose(out[:, 2:], alone))
    True
    """
    func = "varlen_attention"
    q, k, v, _, batch, (T, S, d_k, d_v) = validate_qkv(func, q, k, v, None)
    cu = _validate_cu(func, cu)
    if not T == S == cu[-1]:
        raise fail(func, f"q has {T} packed tokens and k {S}; cu_seqlens={cu.tolist()} "
                         f"describes {int(cu[-1])}")
    out = np.empty((*batch, T, d_v), dtype=np.result_type(q, k, v))
    for a, b in zip(cu[:-1], cu[1:], strict=True):  # one document at a time
        n = b - a
        out[..., a:b, :] = scaled_dot_product_attention(
            q[..., a:b, :], k[..., a:b, :], v[..., a:b, :],
            mask=np.tri(n, dtype=bool) if causal else None)[0]
    return out


# --------------------------------------------------------------------- what packing saves
def speeches(text: str) -> list[str]:
    """A play's speeches: a speaker's line and the lines after it, up to the next blank line
    (the layout of Tiny Shakespeare).

    Examples
    --------
    >>> speeches("A:\\nHi.\\n\\nB:\\nNo.\\nGo.\\n")
    ['A:\\nHi.', 'B:\\nNo.\\nGo.']
    """
    return [s.strip("\n") for s in text.split("\n\n") if s.strip()]


def chunk_lengths(lengths, L) -> np.ndarray:
    """Documents longer than a row of ``L`` tokens cut into pieces of at most ``L``."""
    L = validate_positive_int("chunk_lengths", "L", L)
    pieces = [[L] * (n // L) + ([n % L] if n % L else []) for n in np.asarray(lengths).tolist()]
    return np.array([x for piece in pieces for x in piece], dtype=np.int64)


def pack_first_fit(lengths, L) -> list[list[int]]:
    """Pack documents (each of at most ``L`` tokens) into rows of ``L``: first-fit decreasing.

    The longest document first, each into the first row with room for it, a new row when none
    has; returns the rows as lists of document indices.

    Raises
    ------
    ValueError
        If a document is longer than ``L`` (cut it first: :func:`chunk_lengths`).

    Examples
    --------
    >>> pack_first_fit([5, 3, 4, 2, 1], 6)
    [[0, 4], [2, 3], [1]]
    """
    func = "pack_first_fit"
    L = validate_positive_int(func, "L", L)
    lengths = np.asarray(lengths, dtype=np.int64)
    if (lengths > L).any() or (lengths < 1).any():
        raise fail(func, f"a document of {int(lengths.max())} tokens does not fit a row of "
                         f"L={L}; cut long documents with chunk_lengths(lengths, L) first")
    room = np.zeros(lengths.size, dtype=np.int64)  # free tokens left in each row so far
    rows: list[list[int]] = []
    for i in np.argsort(-lengths, kind="stable"):
        fits = room[: len(rows)] >= lengths[i]
        r = int(fits.argmax()) if fits.any() else len(rows)  # the first row with room
        if r == len(rows):  # none: open a new row
            rows.append([])
            room[r] = L
        rows[r].append(int(i))
        room[r] -= lengths[i]
    return rows


def attention_work(lengths, L, how: str) -> dict[str, int]:
    """Tokens and (query, key) pairs a causal batch of these documents costs, four ways.

    Parameters
    ----------
    lengths : sequence of int
        Document lengths, each at most ``L``.
    L : int
        The row length (the model's context).
    how : {"pad", "pack_causal", "pack_varlen", "useful"}
        ``"pad"``: one row of ``L`` per document, padded (every slot costs);
        ``"pack_causal"``: rows packed by :func:`pack_first_fit`, attended with a plain causal
        mask over the whole row (the leak, and the cost of full rows);
        ``"pack_varlen"``: the same rows with ``cu_seqlens`` (pairs only inside documents, the
        rows' unfilled tails not computed);
        ``"useful"``: what the documents themselves need.

    Returns
    -------
    dict
        ``rows``, ``tokens`` (slots the projections and the MLP process) and ``pairs`` (causal
        (query, key) pairs the attention scores).

    Examples
    --------
    >>> attention_work([3, 1], 4, "pad"), attention_work([3, 1], 4, "pack_varlen")
    ({'rows': 2, 'tokens': 8, 'pairs': 20}, {'rows': 1, 'tokens': 4, 'pairs': 7})
    """
    func = "attention_work"
    L = validate_positive_int(func, "L", L)
    n = np.asarray(lengths, dtype=np.int64)
    if how == "useful":
        return {"rows": 0, "tokens": int(n.sum()), "pairs": int((n * (n + 1) // 2).sum())}
    if how == "pad":
        return {"rows": int(n.size), "tokens": int(n.size * L),
                "pairs": int(n.size * (L * (L + 1) // 2))}
    if how not in ("pack_causal", "pack_varlen"):
        raise fail(func, f"how={how!r}; expected 'pad', 'pack_causal', 'pack_varlen' or "
                         "'useful'")
    rows = pack_first_fit(n, L)
    if how == "pack_causal":
        return {"rows": len(rows), "tokens": len(rows) * L,
                "pairs": len(rows) * (L * (L + 1) // 2)}
    return {"rows": len(rows), "tokens": int(n.sum()), "pairs": int((n * (n + 1) // 2).sum())}
