"""A character-level tokenizer: one token id per distinct character of a corpus.

Taught in ``notebooks/09_tiny_gpt.ipynb``.

A language model reads integers, not text. The simplest tokenizer gives every distinct character
of the training text its own id, in sorted order: Tiny Shakespeare has 65 of them (``"\\n"``,
``" "``, punctuation, digits ``3``, letters), so the model's vocabulary is 65 and one character
is one position of the sequence. (Byte-pair encodings merge frequent pairs into longer tokens: a
bigger vocabulary, a shorter sequence; lesson 09 stays with characters so the heads can be read
character by character.)

:meth:`CharTokenizer.encode` refuses a character it has never seen with a ``ValueError`` that
names it and its position, rather than mapping it to some other id.
"""

from __future__ import annotations

import numpy as np

from .._validate import fail

__all__ = ["CharTokenizer", "display_char"]

#: How :func:`display_char` shows characters that print as nothing.
VISIBLE = {"\n": "↵", " ": "␣", "\t": "⇥"}


def display_char(ch: str) -> str:
    """A character as a label a figure can show: ``"\\n"`` as ``↵``, a space as ``␣``.

    Examples
    --------
    >>> [display_char(c) for c in "a \\n"]
    ['a', '␣', '↵']
    """
    return VISIBLE.get(ch, ch)


class CharTokenizer:
    """Characters to token ids and back.

    Parameters
    ----------
    chars : str or sequence of str
        The vocabulary: distinct single characters, id ``i`` for ``chars[i]``.

    Attributes
    ----------
    chars : str
        The vocabulary in id order.
    vocab_size : int

    Raises
    ------
    ValueError
        If ``chars`` is empty, holds a string that is not one character, or a repeat.

    Examples
    --------
    >>> tok = CharTokenizer.from_text("hello world")
    >>> tok.chars, tok.vocab_size
    (' dehlorw', 8)
    >>> ids = tok.encode("hold")
    >>> ids.tolist(), tok.decode(ids)
    ([3, 5, 4, 1], 'hold')
    """

    def __init__(self, chars):
        func = "CharTokenizer"
        chars = list(chars)
        if not chars:
            raise fail(func, "chars is empty; expected at least one character")
        for i, ch in enumerate(chars):
            if not isinstance(ch, str) or len(ch) != 1:
                raise fail(func, f"chars[{i}] is {ch!r}; expected a single character")
        if len(set(chars)) != len(chars):
            seen, repeats = set(), []
            for ch in chars:
                if ch in seen:
                    repeats.append(ch)
                seen.add(ch)
            raise fail(func, f"chars repeats {repeats!r}; each character needs one id")
        self.chars = "".join(chars)
        self.vocab_size = len(chars)
        self._ids = {ch: i for i, ch in enumerate(chars)}
        # a lookup table over code points, for a fast encode of long texts
        self._table = np.full(max(map(ord, chars)) + 1, -1, dtype=np.int64)
        self._table[[ord(ch) for ch in chars]] = np.arange(len(chars))

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer of ``text``: its distinct characters, sorted (so ``"\\n"`` is id 0 in
        Tiny Shakespeare, and ``" "`` id 1)."""
        if not isinstance(text, str) or not text:
            raise fail("CharTokenizer.from_text", "text must be a non-empty str")
        return cls(sorted(set(text)))

    def encode(self, text: str) -> np.ndarray:
        """Token ids of ``text``, shape (len(text),), int64.

        Raises
        ------
        ValueError
            If ``text`` is not a str or holds a character outside the vocabulary, e.g.
            ``CharTokenizer.encode: text[3] is 'é', not in the vocabulary of 65 characters``.
        """
        func = "CharTokenizer.encode"
        if not isinstance(text, str):
            raise fail(func, f"text is a {type(text).__name__}; expected a str")
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
        inside = codes < len(self._table)
        ids = np.full(len(codes), -1, dtype=np.int64)
        ids[inside] = self._table[codes[inside]]
        if (ids < 0).any():
            i = int(np.flatnonzero(ids < 0)[0])
            raise fail(func, f"text[{i}] is {text[i]!r}, not in the vocabulary of "
                             f"{self.vocab_size} characters ({self.chars!r})")
        return ids

    def decode(self, ids) -> str:
        """The text of token ids (any integer array or sequence, flattened).

        Raises
        ------
        ValueError
            If an id is not an integer in ``0 .. vocab_size - 1``.
        """
        func = "CharTokenizer.decode"
        ids = np.asarray(ids)
        if ids.size and ids.dtype.kind not in "iu":
            raise fail(func, f"ids has dtype {ids.dtype}; expected integer token ids")
        ids = ids.reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids.min() if ids.min() < 0 else ids.max())
            raise fail(func, f"ids holds {bad}; expected ids 0 .. {self.vocab_size - 1}")
        return "".join(self.chars[i] for i in ids)

    def labels(self, ids) -> list[str]:
        """One printable label per token (:func:`display_char`), e.g. for the head viewer."""
        return [display_char(ch) for ch in self.decode(ids)]

    def __eq__(self, other) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __hash__(self) -> int:
        return hash(self.chars)

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"
