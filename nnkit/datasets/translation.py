"""A seeded toy translation task: English number words to digits (notes §6.4).

"three hundred five thousand forty two" -> "3 0 5 0 4 2". The source language has 30 words
(zero .. nineteen, twenty .. ninety, hundred, thousand), the target language the ten
digits. Sources are at most 9 words, targets at most 6 digits, and the mapping needs
reordering and insertion that a model must learn from the data: "five thousand seven"
writes two zeros that no word names, and each digit is aligned with one or two source words,
which an attention heatmap shows.

Both vocabularies share the special ids ``PAD_ID = 0``, ``BOS_ID = 1`` and ``EOS_ID = 2``.
Target rows are ``[BOS, digits..., EOS, PAD...]``, so a decoder reads ``tgt[:, :-1]``
(teacher forcing) and is trained to predict ``tgt[:, 1:]`` with ``ignore_index=PAD_ID``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .._random import get_rng
from .._validation import check_array, check_scalar

__all__ = [
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "Vocabulary",
    "TranslationTask",
    "number_to_words",
    "strip_specials",
    "number_translation",
    "exact_match",
]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIALS = ("<pad>", "<bos>", "<eos>")

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()
_MAX_VALUE = 999_999


class Vocabulary:
    """Tokens <-> integer ids; ids 0, 1, 2 are ``<pad>``, ``<bos>``, ``<eos>``.

    Parameters
    ----------
    tokens : sequence of str
        The ordinary tokens, in id order from 3 on (no duplicates, no specials).

    Examples
    --------
    >>> v = Vocabulary(["a", "b"])
    >>> v.encode(["b", "a"]).tolist(), v.decode([1, 4, 3, 2, 0]), len(v)
    ([4, 3], ['b', 'a'], 5)
    """

    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    def __init__(self, tokens):
        tokens = list(tokens)
        if len(set(tokens)) != len(tokens) or set(tokens) & set(SPECIALS):
            raise ValueError("tokens must be distinct and must not include "
                             f"{', '.join(SPECIALS)}")
        self.itos = list(SPECIALS) + tokens
        self.stoi = {t: i for i, t in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, words) -> np.ndarray:
        """Ids (n,) int64 of the ``words``; an unknown word is a ``ValueError``."""
        try:
            return np.array([self.stoi[w] for w in words], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"word {exc.args[0]!r} is not in the vocabulary") from None

    def decode(self, ids) -> list[str]:
        """Tokens of ``ids`` up to the first ``<eos>``, leaving out ``<pad>`` and ``<bos>``."""
        return [self.itos[i] for i in strip_specials(ids)]


def strip_specials(ids) -> list[int]:
    """The ids (a 1-D sequence) up to the first ``EOS_ID``, without ``PAD_ID``/``BOS_ID``."""
    kept = []
    for i in np.asarray(ids).reshape(-1).tolist():
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            kept.append(i)
    return kept


SOURCE_VOCAB = Vocabulary(_ONES + _TENS + ["hundred", "thousand"])
TARGET_VOCAB = Vocabulary([str(d) for d in range(10)])


def _below_thousand(n: int) -> list[str]:
    words = []
    if n >= 100:
        words += [_ONES[n // 100], "hundred"]
        n %= 100
    if n >= 20:
        words.append(_TENS[n // 10 - 2])
        n %= 10
        if n:
            words.append(_ONES[n])
    elif n or not words:
        words.append(_ONES[n])
    return words


def number_to_words(n: int) -> list[str]:
    """English words of 0 <= n <= 999999, without "and" or hyphens.

    Examples
    --------
    >>> " ".join(number_to_words(305042))
    'three hundred five thousand forty two'
    >>> number_to_words(0), number_to_words(1000)
    (['zero'], ['one', 'thousand'])
    """
    n = check_scalar(n, name="n", kind=numbers.Integral, low=0, high=_MAX_VALUE)
    thousands, rest = divmod(int(n), 1000)
    if not thousands:
        return _below_thousand(rest)
    return _below_thousand(thousands) + ["thousand"] + (_below_thousand(rest) if rest else [])


@dataclass(frozen=True)
class TranslationTask:
    """A train/test split of a translation task.

    Attributes
    ----------
    src_train, src_test : ndarray (N, S) int64
        Source ids, right-padded with ``PAD_ID``.
    tgt_train, tgt_test : ndarray (N, T) int64
        ``[BOS, target ids..., EOS, PAD...]``.
    values_train, values_test : ndarray (N,) int64
        The numbers the sentences spell.
    src_vocab, tgt_vocab : Vocabulary
    """

    src_train: np.ndarray
    tgt_train: np.ndarray
    src_test: np.ndarray
    tgt_test: np.ndarray
    values_train: np.ndarray
    values_test: np.ndarray
    src_vocab: Vocabulary
    tgt_vocab: Vocabulary


def _pad(rows, width) -> np.ndarray:
    out = np.full((len(rows), width), PAD_ID, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _encode_pairs(values):
    src = [SOURCE_VOCAB.encode(number_to_words(v)) for v in values]
    tgt = [np.concatenate([[BOS_ID], TARGET_VOCAB.encode(list(str(v))), [EOS_ID]])
           for v in values]
    return src, tgt


def _draw_distinct_numbers(n, max_value, rng) -> np.ndarray:
    """``n`` distinct numbers in [0, max_value], each digit count about equally likely.

    Weighted sampling without replacement by the Gumbel top-k trick: key = log w + Gumbel,
    keep the n largest; w(v) = 1 / (how many numbers in [0, max_value] have v's digit count).
    """
    values = np.arange(max_value + 1)
    digits = np.ones(values.size, dtype=np.int64)  # digit count of each value
    for power in range(1, len(str(max_value))):
        digits[10**power:] += 1
    counts = np.bincount(digits)
    keys = -np.log(counts[digits]) + rng.gumbel(size=values.size)
    chosen = np.argpartition(-keys, n - 1)[:n]
    return rng.permutation(values[np.sort(chosen)])  # sorted first: independent of argpartition


def number_translation(n_train: int = 4000, n_test: int = 1000, max_value: int = _MAX_VALUE,
                       random_state=0) -> TranslationTask:
    """Number words -> digits, ``n_train`` + ``n_test`` distinct numbers (seeded).

    The numbers are drawn without replacement from [0, ``max_value``] so that every digit
    count is about equally likely (short numbers are not drowned by the many six-digit
    ones), then split: no sentence of the test split occurs in the training split.

    Parameters
    ----------
    n_train, n_test : int >= 1
        Sizes of the splits; together at most ``max_value + 1``.
    max_value : int in [9, 999999]
    random_state : int, Generator or None
        The same seed gives the same task.

    Returns
    -------
    TranslationTask

    Examples
    --------
    >>> task = number_translation(n_train=5, n_test=2, random_state=0)
    >>> task.src_train.shape[0], task.tgt_test.shape[0]
    (5, 2)
    >>> words = task.src_vocab.decode(task.src_train[0])
    >>> digits = task.tgt_vocab.decode(task.tgt_train[0])
    >>> number_to_words(int("".join(digits))) == words
    True
    """
    n_train = check_scalar(n_train, name="n_train", kind=numbers.Integral, low=1)
    n_test = check_scalar(n_test, name="n_test", kind=numbers.Integral, low=1)
    max_value = check_scalar(max_value, name="max_value", kind=numbers.Integral, low=9,
                             high=_MAX_VALUE)
    if n_train + n_test > max_value + 1:
        raise ValueError(f"n_train + n_test = {n_train + n_test} distinct numbers do not fit "
                         f"in [0, max_value={max_value}]; lower them or raise max_value")
    values = _draw_distinct_numbers(n_train + n_test, int(max_value), get_rng(random_state))
    src, tgt = _encode_pairs(values.tolist())
    S, T = max(map(len, src)), max(map(len, tgt))
    src, tgt = _pad(src, S), _pad(tgt, T)
    return TranslationTask(src[:n_train], tgt[:n_train], src[n_train:], tgt[n_train:],
                           values[:n_train].astype(np.int64), values[n_train:].astype(np.int64),
                           SOURCE_VOCAB, TARGET_VOCAB)


def exact_match(predicted, reference) -> float:
    """Fraction of rows whose tokens up to ``<eos>`` (specials left out) are all equal.

    Parameters
    ----------
    predicted, reference : array (N, *) int
        Decoder outputs (``BOS`` optional) and references ``[BOS, ..., EOS, PAD...]``; the
        widths may differ.
    """
    predicted = check_array(predicted, name="predicted", ndim=2)
    reference = check_array(reference, name="reference", ndim=2)
    if predicted.shape[0] != reference.shape[0]:
        raise ValueError(f"predicted has {predicted.shape[0]} rows but reference has "
                         f"{reference.shape[0]}")
    if predicted.shape[0] == 0:
        raise ValueError("exact_match of zero rows is undefined")
    hits = [strip_specials(p) == strip_specials(r)
            for p, r in zip(predicted, reference, strict=True)]
    return float(np.mean(hits))
