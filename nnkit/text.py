"""WordPiece tokenization for BERT (notes §6.5), in plain Python.

Text goes through two stages, as in BERT's reference tokenizer:

1. **Basic tokenization**: drop control characters, map every whitespace to a space, put
   spaces around CJK ideographs, lowercase and strip accents (NFD, drop combining marks),
   split on whitespace, then split every punctuation character into its own token.
2. **WordPiece**: each basic token (a "word") is cut greedily, longest match first, into
   pieces from the vocabulary; pieces after the first carry the ``##`` prefix
   ("unaffable" -> "un", "##aff", "##able"). A word that cannot be cut, or is longer than
   ``max_input_chars_per_word``, becomes ``[UNK]``.

Training builds the vocabulary bottom-up: start from the characters (each as ``c`` for the
start of a word and ``##c`` for inside one), then repeatedly merge the adjacent pair with the
best score into a new piece until ``vocab_size`` is reached. ``criterion="frequency"``
scores a pair by its count (byte-pair-encoding style, what the ``tokenizers`` package's
WordPiece trainer does); ``criterion="likelihood"`` by ``count(ab) / (count(a) count(b))``
(the WordPiece language-model criterion of Schuster and Nakajima), which favours rare
pairs of rare pieces and so needs a larger ``min_frequency``. Ties go to the
lexicographically smallest pair, so training is deterministic.

The special tokens are ``[PAD] [UNK] [CLS] [SEP] [MASK]``; a trained vocabulary gives them
ids 0..4. Vocabularies are saved and loaded as BERT's ``vocab.txt`` (one token per line,
the line number is the id), so a vocabulary from BERT itself loads too.

Examples
--------
>>> tok = WordPieceTokenizer.train(["the cat sat.", "the cats sat on the mat."],
...                                 vocab_size=40)
>>> enc = tok.encode("The cats sat.", "on the mat")
>>> enc.tokens
('[CLS]', 'the', 'cat', '##s', 'sat', '.', '[SEP]', 'o', '##n', 'the', 'm', '##at', '[SEP]')
>>> enc.token_type_ids.tolist()
[0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]
>>> tok.decode(enc.ids)
'the cats sat. on the mat'
>>> tok.vocab_size  # training stopped early: no pair left twice
30
"""

from __future__ import annotations

import functools
import json
import numbers
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._budget import MAX_BYTES
from ._files import ensure_folder, quote, read_bytes, read_json, write_atomic
from ._validation import check_bool, check_choice, check_scalar

__all__ = [
    "PAD_TOKEN",
    "UNK_TOKEN",
    "CLS_TOKEN",
    "SEP_TOKEN",
    "MASK_TOKEN",
    "SPECIAL_TOKENS",
    "Encoding",
    "BatchEncoding",
    "WordPieceTokenizer",
    "basic_tokenize",
]

PAD_TOKEN, UNK_TOKEN, CLS_TOKEN = "[PAD]", "[UNK]", "[CLS]"
SEP_TOKEN, MASK_TOKEN = "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, CLS_TOKEN, SEP_TOKEN, MASK_TOKEN)
SPECIAL_ROLES = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
PREFIX = "##"
IGNORE_INDEX = -100
# Padding makes max_length tokens per encoding; a longer pad is refused before anything is
# allocated.
_MAX_PAD_LENGTH = 2**24
_TRUNCATIONS = (False, True, "longest_first", "only_first", "only_second", "do_not_truncate")
_PADDINGS = (False, True, "longest", "max_length", "do_not_pad")
# Bytes one padded token costs at the peak of encode (tracemalloc, 2**18 to 2**20 tokens): 48
# held by the Encoding (three int64 arrays, three tuples of pointers), 32 by the lists it is
# built from.
_PAD_TOKEN_BYTES = 80


# ----------------------------------------------------------------------------------------
# Basic tokenization (BERT's normalizer and pre-tokenizer, as the tokenizers package runs them)
# ----------------------------------------------------------------------------------------
# Where Python's BERT tokenizer and the Rust one (what transformers' BertTokenizerFast runs)
# disagree, nnkit follows the Rust one: CJK extension B-F is U+2B920..U+2CEAF (not
# U+2B820), lowercasing is per character (a word-final capital sigma becomes "σ", not
# Python's "ς"), accents are stripped before lowercasing, and U+2028/U+2029 count as
# whitespace. Character classes come from Python's unicodedata, whose Unicode version may
# differ from the Rust crate's for characters assigned recently.
_CJK_RANGES = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
               (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_CLEAN = {**{c: None for c in range(32) if chr(c) not in "\t\n\r"}, 0x7F: None,
                ord("\t"): " ", ord("\n"): " ", ord("\r"): " "}  # for str.translate
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[^A-Za-z0-9]")  # ASCII: non-alphanumerics are marks
_CHAR_OUT: dict = {}  # (character, split CJK) -> what cleaning makes of it
_PUNCTUATION: dict = {}  # character -> is it punctuation


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) in ("Zs", "Zl", "Zp")


def _is_control(ch: str) -> bool:
    if ch in "\t\n\r":
        return False
    return unicodedata.category(ch).startswith("C")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    # All non-alphanumeric ASCII counts as punctuation ('$', '^', '`' are not Unicode 'P').
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_cjk(cp: int) -> bool:
    return any(low <= cp <= high for low, high in _CJK_RANGES)


def _char_out(ch: str, cjk: bool) -> str:
    """What cleaning makes of one character: '' (dropped), ' ', ' ch ' (CJK) or ch."""
    key = (ch, cjk)
    out = _CHAR_OUT.get(key)
    if out is None:
        cp = ord(ch)
        if cp == 0 or cp == 0xFFFD or _is_control(ch):
            out = ""
        elif _is_whitespace(ch):
            out = " "
        elif cjk and _is_cjk(cp):
            out = f" {ch} "
        else:
            out = ch
        if len(_CHAR_OUT) < 1 << 16:
            _CHAR_OUT[key] = out
    return out


def _clean(text: str, cjk: bool = True) -> str:
    """Drop NUL, U+FFFD and control (C*) characters; whitespace -> ' '; spaces around CJK
    ideographs (when ``cjk``)."""
    if text.isascii():
        return text.translate(_ASCII_CLEAN)
    return "".join([_char_out(ch, cjk) for ch in text])


def _strip_accents(text: str) -> str:
    if text.isascii():
        return text
    return "".join(c for c in unicodedata.normalize("NFD", text)
                   if unicodedata.category(c) != "Mn")


def _lower(text: str) -> str:
    """Lowercase character by character (Python's str.lower maps a word-final capital
    sigma to the final form; per character, as the Rust tokenizer, it is always σ)."""
    if "\u03a3" in text:
        return "".join([c.lower() for c in text])
    return text.lower()


def _split_punctuation(word: str) -> list[str]:
    if word.isascii():
        return _ASCII_WORD.findall(word)
    pieces, current = [], []
    for ch in word:
        punct = _PUNCTUATION.get(ch)
        if punct is None:
            punct = _is_punctuation(ch)
            if len(_PUNCTUATION) < 1 << 16:
                _PUNCTUATION[ch] = punct
        if punct:
            if current:
                pieces.append("".join(current))
                current = []
            pieces.append(ch)
        else:
            current.append(ch)
    if current:
        pieces.append("".join(current))
    return pieces


def _normalize(text: str, lowercase: bool, strip_accents: bool, cjk: bool) -> str:
    """BERT's normalizer: clean, space out CJK, strip accents, lowercase (in this order)."""
    text = _clean(text, cjk)
    if strip_accents:
        text = _strip_accents(text)
    return _lower(text) if lowercase else text


def _prefix_table(tokens, limit: int, cut: int = 0) -> dict:
    """A trie of ``token[cut:]`` for every token, flattened into one dict: each prefix of at
    most ``limit`` characters maps to its token where it is one, else to '' (it only begins
    one). Less memory than nested dicts for short pieces; ``_longest`` walks it."""
    table: dict = {}
    for token in tokens:
        body = token[cut:]
        for end in range(1, min(len(body), limit + 1)):
            table.setdefault(body[:end], "")
        if body and len(body) <= limit:
            table[body] = token
    return table


def _longest(table: dict, text: str, start: int) -> str:
    """The token of the longest prefix of ``text[start:]`` in ``table`` ('' for none): the
    walk stops where no token goes on, so it reads at most the longest piece's length."""
    found, end, stop = "", start + 1, len(text)
    while end <= stop:
        hit = table.get(text[start:end])
        if hit is None:
            break
        if hit:
            found = hit
        end += 1
    return found


class _Matcher:
    """Finds tokens written in a text, leftmost-longest (as the tokenizers package finds
    added tokens): a regex of their first characters jumps to the candidates, a prefix table
    walks from each."""

    def __init__(self, tokens):
        tokens = {t for t in tokens if t}
        self._table = _prefix_table(tokens, max(map(len, tokens), default=0))
        firsts = "".join(sorted({re.escape(t[0]) for t in tokens}))
        self._first = re.compile(f"[{firsts}]") if firsts else None

    def split(self, text: str) -> list[tuple[str, bool]]:
        """``text`` cut at the tokens written in it: [(segment, is_token)], no empty segment."""
        parts, done, pos = [], 0, 0
        while self._first is not None and (m := self._first.search(text, pos)) is not None:
            token = _longest(self._table, text, m.start())
            if not token:
                pos = m.start() + 1
                continue
            if m.start() > done:
                parts.append((text[done:m.start()], False))
            parts.append((token, True))
            done = pos = m.start() + len(token)
        if done < len(text):
            parts.append((text[done:], False))
        return parts


@functools.lru_cache(maxsize=64)
def _cached_matcher(tokens: tuple) -> _Matcher:
    return _Matcher(tokens)


def basic_tokenize(text: str, lowercase: bool = True, never_split=SPECIAL_TOKENS,
                   strip_accents: bool | None = None,
                   tokenize_chinese_chars: bool = True) -> list[str]:
    """Split ``text`` into words and punctuation marks, as BERT's basic tokenizer.

    Tokens of ``never_split`` (the special tokens) are found in the raw text first, wherever
    they are written ("x[MASK]y" -> x, [MASK], y, as transformers does), and kept whole;
    the text between them is cleaned, its CJK ideographs spaced out, its accents stripped
    (``strip_accents``; None: when ``lowercase``), lowercased, split on whitespace and then
    around every punctuation character.

    >>> basic_tokenize("Héllo, World!  [MASK] isn't x[MASK]y")
    ['hello', ',', 'world', '!', '[MASK]', 'isn', "'", 't', 'x', '[MASK]', 'y']
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    strip = lowercase if strip_accents is None else strip_accents
    words = []
    for segment, special in _cached_matcher(tuple(never_split)).split(text):
        if special:
            words.append(segment)
            continue
        for chunk in _normalize(segment, lowercase, strip, tokenize_chinese_chars).split(" "):
            if chunk:
                words.extend(_split_punctuation(chunk))
    return words


# ----------------------------------------------------------------------------------------
# Encodings
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Encoding:
    """One encoded sequence (or pair): ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``.

    Attributes
    ----------
    ids : ndarray (T,) int64
        Token ids, padded with the ``[PAD]`` id.
    token_type_ids : ndarray (T,) int64
        Segment ids: 0 for ``[CLS]``, sequence a and its ``[SEP]``; 1 for b and its ``[SEP]``;
        0 on padding.
    attention_mask : ndarray (T,) int64
        1 on real tokens, 0 on padding.
    tokens : tuple of str
        The pieces, ``[PAD]`` included.
    word_ids : tuple of (int or None)
        Index of the basic-tokenizer word each token comes from (counted within its own
        sequence), ``None`` for special tokens and padding.
    sequence_ids : tuple of (int or None)
        0 or 1 for tokens of sequence a or b, ``None`` for special tokens and padding.
    """

    ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    tokens: tuple
    word_ids: tuple
    sequence_ids: tuple

    def __len__(self) -> int:
        return len(self.ids)

    def first_piece_mask(self) -> np.ndarray:
        """(T,) bool: True on the first piece of every word (not on ``##`` pieces, specials)."""
        mask = np.zeros(len(self.ids), dtype=bool)
        for t, (w, s) in enumerate(zip(self.word_ids, self.sequence_ids, strict=True)):
            if w is None:
                continue
            mask[t] = t == 0 or (self.word_ids[t - 1], self.sequence_ids[t - 1]) != (w, s)
        return mask

    def word_to_tokens(self, word_index: int, sequence: int = 0) -> tuple[int, int]:
        """``(first, last)`` token positions of word ``word_index`` of ``sequence`` (inclusive).

        Raises ``ValueError`` when the word was truncated away.
        """
        positions = [t for t, (w, s) in enumerate(zip(self.word_ids, self.sequence_ids,
                                                      strict=True))
                     if w == word_index and s == sequence]
        if not positions:
            raise ValueError(f"word {word_index} of sequence {sequence} is not in the encoding "
                             "(truncated, or out of range)")
        return positions[0], positions[-1]


class BatchEncoding(Mapping):
    """Encodings of a batch: a read-only mapping with transformers' keys.

    ``enc["input_ids"]``, ``enc["token_type_ids"]``, ``enc["attention_mask"]``: (B, T) int64
    arrays from :meth:`WordPieceTokenizer.encode_batch` (and from calling the tokenizer with
    ``return_tensors="np"``), or Python lists of ints from calling it without (one list per
    text, or a single list for a single text, as transformers' BatchEncoding holds them).
    ``model(**enc)`` passes them to a BERT model by name. ``enc[i]`` with an int ``i`` is the
    :class:`Encoding` of example ``i``.

    Attributes
    ----------
    ids, input_ids
        The ``"input_ids"`` value (``ids`` is nnkit's older name).
    token_type_ids, attention_mask
        The values of those keys.
    encodings : tuple of Encoding
        The per-example encodings, with their tokens and word ids.
    """

    __slots__ = ("_data", "_encodings")

    def __init__(self, ids, token_type_ids, attention_mask, encodings=()):
        self._data = {"input_ids": ids, "token_type_ids": token_type_ids,
                      "attention_mask": attention_mask}
        self._encodings = tuple(encodings)

    def __getitem__(self, key):
        if isinstance(key, numbers.Integral) and not isinstance(key, bool):
            return self._encodings[key]
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    @property
    def ids(self):
        """The token ids (the ``"input_ids"`` value)."""
        return self._data["input_ids"]

    input_ids = ids

    @property
    def token_type_ids(self):
        """The segment ids (the ``"token_type_ids"`` value)."""
        return self._data["token_type_ids"]

    @property
    def attention_mask(self):
        """1 on real tokens, 0 on padding (the ``"attention_mask"`` value)."""
        return self._data["attention_mask"]

    @property
    def encodings(self) -> tuple:
        """The per-example :class:`Encoding` objects."""
        return self._encodings

    def tokens(self, batch_index: int = 0) -> list[str]:
        """The tokens of example ``batch_index`` (padding included)."""
        return list(self._encodings[batch_index].tokens)

    def word_ids(self, batch_index: int = 0) -> list:
        """Word index of each token of example ``batch_index`` (None for specials, pads)."""
        return list(self._encodings[batch_index].word_ids)

    def __repr__(self) -> str:
        return f"BatchEncoding({self._data!r})"


# ----------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------
def _merged(a: str, b: str) -> str:
    return a + b[len(PREFIX):]


def _word_symbols(word: str) -> list[str]:
    return [word[0]] + [PREFIX + c for c in word[1:]]


class _MergeState:
    """Symbols of every distinct word, the pair counts and where each pair occurs."""

    def __init__(self, word_counts):
        self.words = [_word_symbols(w) for w in word_counts]
        self.counts = list(word_counts.values())
        self.pair_counts: Counter = Counter()
        self.where: dict = {}
        self.symbol_counts: Counter = Counter()
        for i, symbols in enumerate(self.words):
            self._add(i, symbols, +1)

    def _add(self, i: int, symbols: list[str], sign: int) -> None:
        c = sign * self.counts[i]
        for s in symbols:
            self.symbol_counts[s] += c
        for pair in zip(symbols, symbols[1:], strict=False):
            self.pair_counts[pair] += c
            if sign > 0:
                self.where.setdefault(pair, set()).add(i)
            elif self.pair_counts[pair] == 0:
                del self.pair_counts[pair]

    def best_pair(self, criterion: str, min_frequency: int):
        candidates = [(p, c) for p, c in self.pair_counts.items() if c >= min_frequency]
        if not candidates:
            return None
        if criterion == "frequency":
            return min(candidates, key=lambda pc: (-pc[1], pc[0]))[0]
        sc = self.symbol_counts
        return min(candidates, key=lambda pc: (-pc[1] / (sc[pc[0][0]] * sc[pc[0][1]]), pc[0]))[0]

    def merge(self, pair) -> str:
        new = _merged(*pair)
        for i in sorted(self.where.pop(pair, ())):
            old = self.words[i]
            out, k = [], 0
            while k < len(old):
                if k + 1 < len(old) and (old[k], old[k + 1]) == pair:
                    out.append(new)
                    k += 2
                else:
                    out.append(old[k])
                    k += 1
            if len(out) == len(old):
                continue
            self._add(i, old, -1)
            self._add(i, out, +1)
            self.words[i] = out
        return new


# ----------------------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------------------
class WordPieceTokenizer:
    """BERT's WordPiece tokenizer: basic tokenization, then greedy longest-match-first pieces.

    Parameters
    ----------
    vocab : sequence of str or dict str -> int
        The tokens in id order (a list, as in ``vocab.txt``), or a token -> id mapping whose
        ids are exactly 0..n-1. Must contain ``[PAD] [UNK] [CLS] [SEP] [MASK]``.
    lowercase : bool
        Lowercase (and, by default, strip accents) before splitting (BERT "uncased").
    max_input_chars_per_word : int
        Longer words become ``[UNK]`` without being cut.
    strip_accents : bool or None
        Strip accents (NFD, then drop the non-spacing marks); None: when ``lowercase``.
    tokenize_chinese_chars : bool
        Put spaces around CJK ideographs, so each is a word.
    special_tokens : dict, optional
        Other strings for the roles ``pad_token``, ``unk_token``, ``cls_token``,
        ``sep_token``, ``mask_token`` (default ``[PAD]`` ``[UNK]`` ``[CLS]`` ``[SEP]``
        ``[MASK]``); each must be in the vocabulary. Written inside a text they are found
        and kept whole, as transformers does ("x[MASK]y" -> x, [MASK], y).
    model_max_length : int, optional
        The longest input of the model the tokenizer belongs to: the ``max_length`` of
        ``truncation=True`` when none is given.
    clean_up_tokenization_spaces : bool
        ``decode``'s default for its option of the same name (transformers' second
        clean-up pass, off by default as in transformers 5).
    added_tokens : sequence of dict, optional
        Transformers' added tokens: ``{"content": str, "special": bool, "normalized": bool}``
        (``special`` default False, ``normalized`` default ``not special``). Each is found
        whole in the text before WordPiece, leftmost-longest: in the raw text, or with
        ``normalized`` in the normalized text (its content must be normalized already).
        ``decode`` skips the special ones. A content outside ``vocab`` gets the next id:
        ``len(tok)`` counts them, ``vocab_size`` (WordPiece's vocabulary) does not.

    Notes
    -----
    Use :meth:`train` to learn a vocabulary from text, :meth:`load` to read a ``vocab.txt``,
    :meth:`from_pretrained` to read a Hugging Face tokenizer folder.
    """

    def __init__(self, vocab, lowercase: bool = True, max_input_chars_per_word: int = 100, *,
                 strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 special_tokens: dict | None = None, model_max_length: int | None = None,
                 clean_up_tokenization_spaces: bool = False, added_tokens=None):
        check_bool(lowercase, name="lowercase")
        if strip_accents is not None:
            check_bool(strip_accents, name="strip_accents")
        check_bool(tokenize_chinese_chars, name="tokenize_chinese_chars")
        check_bool(clean_up_tokenization_spaces, name="clean_up_tokenization_spaces")
        if model_max_length is not None:
            check_scalar(model_max_length, name="model_max_length", kind=numbers.Integral,
                         low=1)
        self.lowercase = bool(lowercase)
        self.strip_accents = None if strip_accents is None else bool(strip_accents)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.model_max_length = None if model_max_length is None else int(model_max_length)
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self.max_input_chars_per_word = check_scalar(
            max_input_chars_per_word, name="max_input_chars_per_word", kind=numbers.Integral,
            low=1)
        base = self._vocab_list(vocab)
        self.special_tokens = self._special_roles(special_tokens)
        self._added = self._added_flags(added_tokens)
        known = set(base)
        self.itos = base + [t for t in self._added if t not in known]
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self._n_base = len(base)
        missing = [_bare(t) for t in self.special_tokens.values() if t not in self.stoi]
        if missing:
            raise ValueError(f"vocab lacks the special token(s) {', '.join(missing)}; "
                             "a vocabulary must contain all of "
                             f"{' '.join(map(_bare, self.special_tokens.values()))}")
        for token in self.special_tokens.values():  # the roles are always special
            self._added[token] = (True, self._added.get(token, (True, False))[1])
        self._specials = frozenset(t for t, (special, _) in self._added.items() if special)
        self._raw = _Matcher(t for t, (_, normalized) in self._added.items() if not normalized)
        self._normalized = _Matcher(t for t, (_, normalized) in self._added.items()
                                    if normalized)
        limit, cut = self.max_input_chars_per_word, len(PREFIX)
        # a word's first piece (a ## token there is looked up in the other table) and the ##
        # pieces after it, keyed without their ##
        self._starts = _prefix_table([t for t in base if t[:cut] != PREFIX or t == PREFIX],
                                     limit)
        self._continuations = _prefix_table([t for t in base if t[:cut] == PREFIX], limit, cut)
        self._unk = self.special_tokens["unk_token"]
        self._cache: dict = {}

    def _added_flags(self, added_tokens) -> dict:
        """content -> (special, normalized) of ``added_tokens``; a normalized content must be
        what normalizing makes of it."""
        flags = {}
        for entry in added_tokens or ():
            if not isinstance(entry, dict) or set(entry) - {"content", "special", "normalized"}:
                raise TypeError(f"added_tokens items must be dicts with the keys content, "
                                f"special, normalized; got {_shown(entry)}")
            content = entry.get("content")
            _check_token(content, "added_tokens contents")
            special = check_bool(entry.get("special", False), name="added_tokens special")
            normalized = check_bool(entry.get("normalized", not special),
                                    name="added_tokens normalized")
            if content in flags:
                raise ValueError(f"added_tokens has {quote(content)} twice")
            if normalized and self._normal(content) != content:
                raise ValueError(f"added token {quote(content)} is normalized, but normalizing "
                                 f"makes it {quote(self._normal(content))}; give it normalized "
                                 "(or normalized=False)")
            flags[content] = (special, normalized)
        return flags

    def _normal(self, text: str) -> str:
        """``text`` through this tokenizer's normalizer."""
        strip = self.lowercase if self.strip_accents is None else self.strip_accents
        return _normalize(text, self.lowercase, strip, self.tokenize_chinese_chars)

    @staticmethod
    def _special_roles(special_tokens) -> dict:
        """role -> token, the defaults updated with ``special_tokens``."""
        roles = dict(zip(SPECIAL_ROLES, SPECIAL_TOKENS, strict=True))
        if special_tokens is None:
            return roles
        if not isinstance(special_tokens, dict):
            raise TypeError(f"special_tokens must be a dict role -> token, got "
                            f"{type(special_tokens).__name__}")
        for role, token in special_tokens.items():
            if role not in roles:
                raise ValueError(f"special_tokens has the role {role!r}; the roles are "
                                 f"{', '.join(SPECIAL_ROLES)}")
            if not isinstance(token, str) or not token:
                raise ValueError(f"special_tokens[{role!r}] must be a non-empty str, got "
                                 f"{_shown(token)}")
            roles[role] = token
        if len(set(roles.values())) != len(roles):
            raise ValueError("special_tokens gives two roles the same token: "
                             f"{ {role: quote(token) for role, token in roles.items()} }")
        return roles

    @staticmethod
    def _vocab_list(vocab) -> list[str]:
        if isinstance(vocab, dict):
            ids = sorted(vocab.values())
            if ids != list(range(len(ids))):
                raise ValueError("vocab ids must be exactly 0..n-1 with no gaps or repeats")
            items = sorted(vocab.items(), key=lambda kv: kv[1])
            tokens = [t for t, _ in items]
        elif isinstance(vocab, (str, bytes)) or not hasattr(vocab, "__iter__"):
            raise TypeError(f"vocab must be a list of tokens or a dict token -> id, got "
                            f"{type(vocab).__name__}; use WordPieceTokenizer.load(path) for a "
                            "vocab.txt file")
        else:
            tokens = list(vocab)
        for t in tokens:
            _check_token(t, "vocab tokens")
        if len(set(tokens)) != len(tokens):
            dup = next(t for t, c in Counter(tokens).items() if c > 1)
            raise ValueError(f"vocab has the token {quote(dup)} more than once")
        return tokens

    # -- vocabulary --------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """The WordPiece vocabulary's size: ``len(tok)`` less the added tokens beyond it (as
        transformers' ``vocab_size``)."""
        return self._n_base

    def __len__(self) -> int:
        return len(self.itos)

    def get_vocab(self) -> dict:
        """A copy of the token -> id mapping (added tokens included)."""
        return dict(self.stoi)

    pad_token_id = property(lambda self: self.stoi[self.special_tokens["pad_token"]],
                            doc="Id of [PAD].")
    unk_token_id = property(lambda self: self.stoi[self._unk], doc="Id of [UNK].")
    cls_token_id = property(lambda self: self.stoi[self.special_tokens["cls_token"]],
                            doc="Id of [CLS].")
    sep_token_id = property(lambda self: self.stoi[self.special_tokens["sep_token"]],
                            doc="Id of [SEP].")
    mask_token_id = property(lambda self: self.stoi[self.special_tokens["mask_token"]],
                             doc="Id of [MASK].")

    @property
    def special_ids(self) -> tuple[int, ...]:
        """Ids of the five special tokens, in the order [PAD] [UNK] [CLS] [SEP] [MASK]."""
        return tuple(self.stoi[self.special_tokens[r]] for r in SPECIAL_ROLES)

    def token_to_id(self, token: str) -> int:
        """Id of ``token``; the [UNK] id for a token not in the vocabulary."""
        return self.stoi.get(token, self.unk_token_id)

    def id_to_token(self, i: int) -> str:
        """The token with id ``i``; ``ValueError`` outside 0..vocab_size-1."""
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, numbers.Integral):
            raise TypeError(f"token id must be an integer, got {type(i).__name__}")
        if not 0 <= i < len(self.itos):
            raise ValueError(f"token id {i} is outside the vocabulary 0..{len(self.itos) - 1}")
        return self.itos[int(i)]

    # -- training ----------------------------------------------------------------------
    @classmethod
    def train(cls, lines, vocab_size: int = 2000, min_frequency: int = 2,
              lowercase: bool = True, criterion: str = "frequency",
              max_input_chars_per_word: int = 100) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary from ``lines`` (an iterable of str).

        Parameters
        ----------
        lines : iterable of str
            The corpus, e.g. one sentence per item.
        vocab_size : int
            Largest vocabulary (specials + characters + merged pieces). Training stops
            early when no pair occurs ``min_frequency`` times.
        min_frequency : int
            A pair is merged only if it occurs at least this often (counting word counts).
        lowercase : bool
            As in the constructor.
        criterion : {'frequency', 'likelihood'}
            Pair score: its count, or ``count(ab) / (count(a) count(b))``.
        max_input_chars_per_word : int
            As in the constructor; longer words are left out of training too.

        Returns
        -------
        WordPieceTokenizer
            Vocabulary: the specials (ids 0..4), every character of the corpus both as a
            word start ``c`` and as a continuation ``##c`` (sorted), then the merged pieces
            in the order they were made.
        """
        check_scalar(vocab_size, name="vocab_size", kind=numbers.Integral, low=1)
        check_scalar(min_frequency, name="min_frequency", kind=numbers.Integral, low=1)
        check_scalar(max_input_chars_per_word, name="max_input_chars_per_word",
                     kind=numbers.Integral, low=1)
        check_choice(criterion, name="criterion", choices=("frequency", "likelihood"))
        if isinstance(lines, str):
            raise TypeError("lines must be an iterable of str (one item per line), not one "
                            "str; wrap it in a list")
        word_counts: Counter = Counter()
        for line in lines:
            for w in basic_tokenize(line, lowercase=lowercase):
                if w not in SPECIAL_TOKENS and len(w) <= max_input_chars_per_word:
                    word_counts[w] += 1
        word_counts = Counter(dict(sorted(word_counts.items())))  # fixed order
        if not word_counts:
            raise ValueError("lines contain no words to train on")
        state = _MergeState(word_counts)
        chars = {c for word in word_counts for c in word}
        alphabet = sorted(chars | {PREFIX + c for c in chars})  # both forms of every character
        vocab = list(SPECIAL_TOKENS) + alphabet
        if vocab_size < len(vocab):
            raise ValueError(f"vocab_size={vocab_size} is smaller than the {len(SPECIAL_TOKENS)} "
                             f"special tokens plus the {len(alphabet)} characters of the "
                             f"corpus; use vocab_size >= {len(vocab)}")
        known = set(vocab)
        while len(vocab) < vocab_size:
            pair = state.best_pair(criterion, min_frequency)
            if pair is None:
                break
            new = state.merge(pair)
            if new not in known:
                known.add(new)
                vocab.append(new)
        return cls(vocab, lowercase=lowercase, max_input_chars_per_word=max_input_chars_per_word)

    # -- persistence ------------------------------------------------------------------
    def save_vocab(self, path) -> str:
        """Write ``vocab.txt`` (one token per line, line i is id i; the added tokens beyond
        the vocabulary are not in it). ``path`` may be a directory (``vocab.txt`` inside it
        is written); a file or symlink there is replaced, never written through. Returns the
        file's path."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "vocab.txt")
        text = "".join(token + "\n" for token in self.itos[:self._n_base])
        write_atomic(path, lambda f: f.write(text.encode("utf-8")))
        return path

    @classmethod
    def load(cls, path, lowercase: bool = True,
             max_input_chars_per_word: int = 100) -> WordPieceTokenizer:
        """Read a ``vocab.txt`` (BERT's format, at most 64 MiB) or a directory holding one."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "vocab.txt")
        return cls(cls._read_vocab(path), lowercase=lowercase,
                   max_input_chars_per_word=max_input_chars_per_word)

    @staticmethod
    def _read_vocab(path, max_bytes=None) -> list[str]:
        """The tokens of a vocab.txt, in id order (lines end as for Python's text files:
        \\n, \\r\\n or \\r); refused when they would take more than ``max_bytes``."""
        data = read_bytes(path, _VOCAB_FILE_BYTES)
        lines = data.count(b"\n") + data.count(b"\r") + 1
        if max_bytes is not None and lines * _TOKEN_BYTES > max_bytes:
            raise ValueError(f"'{path}' has up to {lines} lines: as tokens they would take "
                             f"about {lines * _TOKEN_BYTES} bytes, more than max_bytes="
                             f"{max_bytes}; pass a larger max_bytes if you trust the file")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, data, exc) from None
        tokens = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        while tokens and tokens[-1] == "":
            tokens.pop()
        return tokens

    # -- Hugging Face folders ----------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder, *, max_bytes=MAX_BYTES) -> WordPieceTokenizer:
        """The tokenizer of a Hugging Face folder (e.g. ``huggingface-cli download
        bert-base-uncased --local-dir FOLDER``), read offline as transformers'
        BertTokenizerFast reads it: its encodings equal that one's, or the folder is refused.

        Reads ``vocab.txt`` (or, without one, ``tokenizer.json``'s WordPiece model and BERT
        normalizer); the added tokens (``tokenizer_config.json``'s ``added_tokens_decoder``,
        else ``tokenizer.json``'s ``added_tokens``); ``tokenizer_config.json``'s settings
        (``do_lower_case``, ``strip_accents``, ``tokenize_chinese_chars``,
        ``model_max_length``, ``clean_up_tokenization_spaces``) and special tokens (every
        ``*_token`` field, ``additional_special_tokens``); ``special_tokens_map.json``,
        whose tokens win over the config's when it has no ``added_tokens_decoder``.

        The folder is untrusted: only regular files are read (vocab.txt and tokenizer.json
        up to 64 MiB, the others up to 16 MiB), every field must have the JSON type
        transformers and the tokenizers package accept, and what nnkit cannot match is
        refused: a ``tokenizer_class`` other than BERT's, a pipeline other than BERT's, a
        vocab.txt disagreeing with tokenizer.json, an added token with ``single_word`` or
        with an id transformers would not give it, a special token outside the vocabulary,
        a non-empty ``added_tokens.json``. Errors name the file and the field and quote at
        most a short prefix of what it holds.

        Parameters
        ----------
        folder : str or os.PathLike
        max_bytes : int >= 0 or None, default 256 MiB
            What the folder may make nnkit allocate: a vocabulary whose tokens and prefix
            tables, or a ``model_max_length`` whose one padded encoding (80 bytes a token),
            would take more is refused at load. None: no limit, for a trusted folder (as
            ``nk.load(path, max_bytes=None)``).
        """
        if max_bytes is not None:
            check_scalar(max_bytes, name="max_bytes", kind=numbers.Integral, low=0)
        folder = Path(os.fspath(folder))
        if not folder.is_dir():
            raise FileNotFoundError(f"'{folder}' is not a folder: from_pretrained reads a "
                                    "tokenizer folder holding vocab.txt (or tokenizer.json)")
        vocab, settings = _folder_arguments(folder, max_bytes)
        try:
            return cls(vocab, **settings)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"'{folder}': {exc}") from None

    def save_pretrained(self, folder) -> Path:
        """Write ``vocab.txt`` and ``tokenizer_config.json`` to ``folder`` (created when
        missing; ValueError when it is a file), which transformers'
        ``BertTokenizerFast.from_pretrained`` and nnkit's ``from_pretrained`` read back into
        the same tokenizer. A file or symlink under either name is replaced, never written
        through. Returns the folder."""
        folder = ensure_folder(folder)
        self.save_vocab(folder / "vocab.txt")
        added = {str(self.stoi[t]): {"content": t, "lstrip": False, "normalized": normalized,
                                     "rstrip": False, "single_word": False, "special": special}
                 for t, (special, normalized) in sorted(self._added.items(),
                                                        key=lambda item: self.stoi[item[0]])}
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
                  "strip_accents": self.strip_accents,
                  "tokenize_chinese_chars": self.tokenize_chinese_chars,
                  **self.special_tokens,
                  "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
                  "added_tokens_decoder": added}
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
        write_atomic(folder / "tokenizer_config.json", lambda f: f.write(text.encode("utf-8")))
        return folder

    # -- encoding ----------------------------------------------------------------------
    def normalize(self, text: str) -> str:
        """The words of ``text`` after basic tokenization, joined as ``decode`` joins
        tokens: what ``decode(encode(text).ids)`` gives back when every word is in the
        vocabulary (special tokens written in ``text`` dropped)."""
        words, added = self._words(text)
        return _join_tokens([w for i, w in enumerate(words)
                             if not (i in added and w in self._specials)])

    def _words(self, text: str) -> tuple[list[str], set]:
        """The words of ``text`` and the positions of the added tokens among them: those
        written in the raw text are cut out first, the rest normalized, the normalized added
        tokens cut out of it, and what is left split on whitespace and around punctuation."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        words, added = [], set()
        for segment, is_added in self._raw.split(text):
            if is_added:
                added.add(len(words))
                words.append(segment)
                continue
            for part, found in self._normalized.split(self._normal(segment)):
                if found:
                    added.add(len(words))
                    words.append(part)
                    continue
                for chunk in part.split(" "):
                    if chunk:
                        words.extend(_split_punctuation(chunk))
        return words, added

    def _word_pieces(self, word: str) -> list[str]:
        """Greedy longest-match-first pieces of one basic token ([UNK] when impossible)."""
        pieces = self._cache.get(word)
        if pieces is not None:
            return pieces
        if len(word) <= self.max_input_chars_per_word:
            pieces = self._cut(word) or [self._unk]
        else:
            pieces = [self._unk]
        if len(self._cache) < 100_000:
            self._cache[word] = pieces
        return pieces

    def _cut(self, word: str) -> list[str] | None:
        """The pieces of ``word``, each the longest the vocabulary has at its start (None when
        a start has none): from each start, a walk of a prefix table that stops where no
        piece goes on, so a word costs its length times the longest piece's at most."""
        piece = _longest(self._starts, word, 0)
        if word[:len(PREFIX)] == PREFIX:  # a ## token written at the start: the longer one
            piece = max(piece, _longest(self._continuations, word, len(PREFIX)), key=len)
        if not piece:
            return None
        pieces, start, stop, get = [piece], len(piece), len(word), self._continuations.get
        while start < stop:  # _longest, inlined: a 1 MB word makes 500k pieces
            piece, end = "", start + 1
            while end <= stop:
                hit = get(word[start:end])
                if hit is None:
                    break
                piece = hit or piece
                end += 1
            if not piece:
                return None
            pieces.append(piece)
            start += len(piece) - len(PREFIX)
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text`` (no special tokens added)."""
        return self._pieces_with_words(text)[0]

    def _pieces_with_words(self, text: str) -> tuple[list[str], list[int]]:
        pieces, words = [], []
        text_words, added = self._words(text)
        for i, w in enumerate(text_words):
            word_pieces = [w] if i in added else self._word_pieces(w)
            pieces += word_pieces
            words += [i] * len(word_pieces)
        return pieces, words

    def encode(self, text: str, pair: str | None = None, max_length: int | None = None,
               truncation: bool | str = False, padding=False,
               add_special_tokens: bool = True) -> Encoding:
        """Encode ``text`` (and ``pair``) as ``[CLS] text [SEP] (pair [SEP])``.

        Parameters
        ----------
        text, pair : str
            The sequence(s); ``pair`` gets segment id 1. An empty ``pair`` is an empty
            second sequence (``[CLS] text [SEP] [SEP]``), as the Rust tokenizer and
            BertTokenizerFast's batch call make it (its one-pair call drops an empty pair).
        max_length : int, optional
            Longest allowed encoding (special tokens counted).
        truncation : bool or {'longest_first', 'only_first', 'only_second', \
'do_not_truncate'}
            Cut the encoding to ``max_length`` (``model_max_length`` when None) by dropping
            tokens from the end of the longer
            sequence (``True``, "longest first": the shorter one keeps up to half of the
            room, rounded down, the longer one the rest), or from the end of ``text``
            (``'only_first'``) or of ``pair`` (``'only_second'``) only: a ``ValueError`` when
            that sequence is too short (it must keep a token) or absent, as the tokenizers
            package's. Without it, an encoding longer than ``max_length`` is a
            ``ValueError``.
        padding : bool or {'longest', 'max_length'}
            ``'max_length'`` (or ``True`` with a ``max_length``) pads with ``[PAD]`` to
            ``max_length`` (at most 2**24 tokens); ``False`` and ``'longest'`` leave one
            sequence unpadded.
        add_special_tokens : bool
            Add ``[CLS]`` and ``[SEP]``.

        Returns
        -------
        Encoding
            ``ids``, ``token_type_ids``, ``attention_mask`` (T,) int64, ``tokens``,
            ``word_ids``, ``sequence_ids``.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if pair is not None and not isinstance(pair, str):
            raise TypeError(f"pair must be a str or None, got {type(pair).__name__}")
        if _strategy(truncation) and max_length is None:
            max_length = self.model_max_length
        pad_to = self._check_lengths(max_length, truncation, padding)
        a, a_words = self._pieces_with_words(text)
        b, b_words = self._pieces_with_words(pair) if pair is not None else ([], [])
        n_special = (3 if pair is not None else 2) if add_special_tokens else 0
        if max_length is not None and len(a) + len(b) + n_special > max_length:
            if not _strategy(truncation):
                raise ValueError(f"the encoding has {len(a) + len(b) + n_special} tokens, more "
                                 f"than max_length={max_length}; pass truncation=True to cut it")
            if max_length < n_special:
                raise ValueError(f"max_length={max_length} cannot hold the {n_special} special "
                                 "tokens")
            keep_a, keep_b = _kept(len(a), len(b), max_length - n_special,
                                   _strategy(truncation), pair is not None)
            a, a_words, b, b_words = a[:keep_a], a_words[:keep_a], b[:keep_b], b_words[:keep_b]
        tokens, types, words, seqs = [], [], [], []

        def extend(pieces, word_ids, seq, segment):
            tokens.extend(pieces)
            types.extend([segment] * len(pieces))
            words.extend(word_ids)
            seqs.extend([seq] * len(pieces))

        def special(token, segment):
            if add_special_tokens:
                extend([token], [None], None, segment)

        cls_token, sep_token = self.special_tokens["cls_token"], self.special_tokens["sep_token"]
        special(cls_token, 0)
        extend(a, a_words, 0, 0)
        special(sep_token, 0)
        if pair is not None:
            extend(b, b_words, 1, 1)
            special(sep_token, 1)
        n_real = len(tokens)
        if pad_to is not None and pad_to > n_real:
            pad = self.special_tokens["pad_token"]
            extend([pad] * (pad_to - n_real), [None] * (pad_to - n_real), None, 0)
        mask = np.zeros(len(tokens), dtype=np.int64)
        mask[:n_real] = 1
        return Encoding(
            ids=np.array([self.stoi[t] for t in tokens], dtype=np.int64),
            token_type_ids=np.array(types, dtype=np.int64),
            attention_mask=mask,
            tokens=tuple(tokens),
            word_ids=tuple(words),
            sequence_ids=tuple(seqs),
        )

    @staticmethod
    def _check_lengths(max_length, truncation, padding) -> int | None:
        """Validate the length options; return the length to pad one sequence to, or None."""
        if max_length is not None:
            check_scalar(max_length, name="max_length", kind=numbers.Integral, low=1)
        check_choice(truncation, name="truncation", choices=_TRUNCATIONS)
        if _strategy(truncation) and max_length is None:
            raise ValueError("truncation=True needs a max_length")
        check_choice(padding, name="padding", choices=(False, True, "longest", "max_length"))
        if padding == "max_length" and max_length is None:
            raise ValueError("padding='max_length' needs a max_length")
        if padding in (True, "max_length") and max_length is not None:
            if max_length > _MAX_PAD_LENGTH:
                raise ValueError(
                    f"max_length={max_length} is too large to pad to: padding={padding!r} "
                    f"makes every encoding max_length tokens long, and nnkit pads to at most "
                    f"{_MAX_PAD_LENGTH} (2**24) tokens; pass padding='longest' (encode_batch) "
                    f"or padding=False to keep max_length as a bound only")
            return max_length
        return None

    def encode_batch(self, texts, pairs=None, max_length: int | None = None,
                     truncation: bool | str = False, padding="longest") -> BatchEncoding:
        """Encode a list of texts (and optional pairs) into (B, T) arrays.

        ``padding='longest'`` (or ``True`` without ``max_length``) pads to the longest
        encoding of the batch; ``'max_length'`` (or ``True`` with ``max_length``) to
        ``max_length``. ``padding=False`` needs every encoding to have the same length.
        """
        if isinstance(texts, str):
            raise TypeError("texts must be a list of str, not one str; use encode for one text")
        texts = list(texts)
        if pairs is not None:
            if isinstance(pairs, str):
                raise TypeError("pairs must be a list of str, not one str")
            pairs = list(pairs)
            if len(pairs) != len(texts):
                raise ValueError(f"pairs has {len(pairs)} items but texts has {len(texts)}")
        else:
            pairs = [None] * len(texts)
        if _strategy(truncation) and max_length is None:
            max_length = self.model_max_length
        pad_to = self._check_lengths(max_length, truncation, padding)
        encodings = [self.encode(t, p, max_length=max_length, truncation=truncation,
                                 padding="max_length" if pad_to is not None else False)
                     for t, p in zip(texts, pairs, strict=True)]
        if padding in (True, "longest") and pad_to is None:
            longest = max((len(e) for e in encodings), default=0)
            encodings = [_pad(e, longest, self.pad_token_id, self.special_tokens["pad_token"])
                         for e in encodings]
        lengths = {len(e) for e in encodings}
        if len(lengths) > 1:
            raise ValueError(f"encodings have different lengths {sorted(lengths)} and "
                             "padding=False; pass padding='longest' or 'max_length'")
        T = lengths.pop() if lengths else 0

        def stack(field):  # (B, T) int64
            if not encodings:
                return np.zeros((0, T), dtype=np.int64)
            return np.stack([getattr(e, field) for e in encodings])

        return BatchEncoding(stack("ids"), stack("token_type_ids"), stack("attention_mask"),
                             tuple(encodings))

    def __call__(self, text, text_pair=None, *, add_special_tokens: bool = True,
                 padding: bool | str = False, truncation: bool | str | None = None,
                 max_length: int | None = None,
                 return_tensors: str | None = None) -> BatchEncoding:
        """Encode as transformers' ``BertTokenizerFast(...)`` does: ``tok(texts, padding=True)``.

        Parameters
        ----------
        text : str or list of str
            One text (values are then one list each, unbatched) or a batch of texts.
        text_pair : str or list of str, optional
            The second sequence(s), one per text (segment id 1). An empty ``text_pair`` with
            a single ``text`` is dropped, as transformers drops it.
        add_special_tokens : bool
            Add ``[CLS]`` and ``[SEP]``.
        padding : bool or {'longest', 'max_length', 'do_not_pad'}
            ``True`` / ``'longest'``: pad to the longest encoding of the batch;
            ``'max_length'``: to ``max_length`` (``model_max_length`` when None), longer
            encodings are left as they are; ``False`` / ``'do_not_pad'``: no padding.
        truncation : bool or {'longest_first', 'only_first', 'only_second', \
'do_not_truncate'}, optional
            As :meth:`encode` (``True`` is ``'longest_first'``) to ``max_length``
            (``model_max_length`` when None; no limit when neither is set). None (default):
            ``'longest_first'`` when ``max_length`` is given and ``padding`` is False, else
            none. A ``max_length`` shorter than the special tokens truncates nothing, as in
            transformers.
        max_length : int, optional
            The length to truncate and to pad (``padding='max_length'``) to; without
            truncation it does not limit the encodings.
        return_tensors : None or 'np'
            None: Python lists of ints; ``'np'``: (B, T) int64 arrays, a single text
            giving B = 1 (the encodings must then have one length: pad or truncate).

        Returns
        -------
        BatchEncoding
            ``"input_ids"``, ``"token_type_ids"``, ``"attention_mask"``.

        Examples
        --------
        >>> tok = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hi", "you"])
        >>> tok(["hi you", "hi"], padding=True)["input_ids"]
        [[2, 5, 6, 3], [2, 5, 3, 0]]
        """
        check_choice(padding, name="padding", choices=_PADDINGS)
        if truncation is None:
            truncation = "longest_first" if max_length is not None and padding is False else False
        check_choice(truncation, name="truncation", choices=_TRUNCATIONS)
        if return_tensors is not None:
            check_choice(return_tensors, name="return_tensors", choices=("np",))
        if max_length is not None:
            check_scalar(max_length, name="max_length", kind=numbers.Integral, low=0)
        batched = not isinstance(text, str)
        texts, pairs = self._call_inputs(text, text_pair, batched)
        strategy = _strategy(truncation)
        limit = max_length if max_length is not None or not strategy else self.model_max_length
        encodings = [self._call_one(t, p, strategy, limit, add_special_tokens)
                     for t, p in zip(texts, pairs, strict=True)]
        encodings = self._call_padded(encodings, padding, max_length)
        return _batch_encoding(encodings, batched, return_tensors)

    @staticmethod
    def _call_inputs(text, text_pair, batched: bool) -> tuple[list, list]:
        """The texts and pairs (None where absent) of a ``__call__``."""
        if not batched:
            if text_pair is not None and not isinstance(text_pair, str):
                raise TypeError(f"text_pair must be a str with a single text, got "
                                f"{type(text_pair).__name__}")
            return [text], [text_pair or None]
        if not isinstance(text, (list, tuple)):
            raise TypeError(f"text must be a str or a list of str, got {type(text).__name__}")
        if text_pair is None:
            return list(text), [None] * len(text)
        if not isinstance(text_pair, (list, tuple)):
            raise TypeError(f"text_pair must be a list of str with a list of texts, got "
                            f"{type(text_pair).__name__}")
        if len(text_pair) != len(text):
            raise ValueError(f"text_pair has {len(text_pair)} items but text has {len(text)}")
        return list(text), list(text_pair)

    def _call_one(self, text, pair, strategy, limit, add_special_tokens: bool) -> Encoding:
        """One unpadded encoding for ``__call__``: truncated to ``limit`` unless that cannot
        hold the special tokens (transformers then leaves it whole)."""
        n_special = (3 if pair is not None else 2) if add_special_tokens else 0
        if not strategy or limit is None or limit < n_special:
            return self.encode(text, pair, add_special_tokens=add_special_tokens)
        if limit == 0:  # no special tokens and nothing kept
            enc = self.encode(text, pair, add_special_tokens=False)
            return Encoding(*(x[:0] for x in (enc.ids, enc.token_type_ids, enc.attention_mask,
                                              enc.tokens, enc.word_ids, enc.sequence_ids)))
        return self.encode(text, pair, max_length=limit, truncation=strategy,
                           add_special_tokens=add_special_tokens)

    def _call_padded(self, encodings: list, padding, max_length) -> list:
        """``encodings`` padded as ``__call__``'s ``padding`` says."""
        if padding is False or padding == "do_not_pad":
            return encodings
        if padding == "max_length":
            length = max_length if max_length is not None else self.model_max_length
            if length is None:
                raise ValueError("padding='max_length' needs a max_length (the tokenizer has "
                                 "no model_max_length)")
            if length:  # 0 pads nothing
                self._check_lengths(length, False, "max_length")
        else:
            length = max((len(e) for e in encodings), default=0)
        pad_token = self.special_tokens["pad_token"]
        return [_pad(e, length, self.pad_token_id, pad_token) for e in encodings]

    # -- decoding ----------------------------------------------------------------------
    def convert_ids_to_tokens(self, ids) -> list[str]:
        """Tokens of ``ids`` (a 1-D sequence of ints)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"ids must be a 1-D sequence of integers; got shape {ids.shape}, "
                             f"dtype {ids.dtype}")
        bad = ids[(ids < 0) | (ids >= len(self.itos))]
        if bad.size:
            raise ValueError(f"ids contains {int(bad[0])}, outside the vocabulary "
                             f"0..{len(self.itos) - 1}")
        return [self.itos[i] for i in ids.tolist()]

    def decode(self, ids, skip_special_tokens: bool = True,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """Text of ``ids``, as transformers' BertTokenizerFast decodes them.

        ``##`` pieces are glued to the piece before, other tokens joined by single spaces,
        and the space before ``.`` ``?`` ``!`` ``,`` (and before ``n't``, ``'m``, ``'s``,
        ``'ve``, ``'re`` tokens) is removed: "the cat ." -> "the cat.".
        ``skip_special_tokens`` drops [PAD] [UNK] [CLS] [SEP] [MASK] first.
        ``clean_up_tokenization_spaces`` (None: the tokenizer's setting) adds transformers'
        second pass over the whole text (" ' " -> "'", " 's" -> "'s", ...).
        """
        tokens = self.convert_ids_to_tokens(ids)
        if skip_special_tokens:
            tokens = [t for t in tokens if t not in self._specials]
        text = _join_tokens(tokens)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        check_bool(clean_up_tokenization_spaces, name="clean_up_tokenization_spaces")
        if clean_up_tokenization_spaces:
            for old, new in _CLEAN_UP_TEXT:
                text = text.replace(old, new)
        return text

    def __repr__(self) -> str:
        return (f"WordPieceTokenizer(vocab_size={self.vocab_size}, lowercase={self.lowercase})")


def _check_token(token, what: str) -> None:
    """A token must be a non-empty str without whitespace (BERT's pre-tokenizer splits there)."""
    if not isinstance(token, str) or not token or any(_is_whitespace(c) for c in token):
        raise ValueError(f"{what} must be non-empty strings without whitespace; got "
                         f"{_shown(token)}")


def _bare(token: str) -> str:
    """``quote(token)`` without the quotes: short and escaped, for lists of tokens."""
    return repr(token[:40])[1:-1] + ("..." if len(token) > 40 else "")


def _shown(value) -> str:
    """A JSON value for a message: ``quote`` of a scalar; a list's or object's kind and size,
    never its repr (it may hold megabytes, which quote would render whole first)."""
    if isinstance(value, dict):
        kind = value.get("type")
        return f"an object of {len(value)} fields" + (
            f" of type {quote(kind)}" if isinstance(kind, str) else "")
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} items"
    return quote(value)


# ----------------------------------------------------------------------------------------
# Hugging Face tokenizer folders: untrusted, so every file is bounded and every field checked
# ----------------------------------------------------------------------------------------
_VOCAB_FILE_BYTES = 64 << 20  # vocab.txt, tokenizer.json (a multilingual one is ~10 MB)
_CONFIG_FILE_BYTES = 16 << 20  # tokenizer_config.json, special_tokens_map.json, ...
_NO_LIMIT = 2**63  # a model_max_length from here up is transformers' "no limit" marker
# Upper bounds of what a vocabulary costs at the peak of building a tokenizer (tracemalloc on
# ASCII, CJK and astral vocabularies): a token (its str, list slot and dict entry), a
# prefix-table entry (dict slot, str header), each plus its characters (1 or 4 bytes each).
_TOKEN_BYTES = 224
_PREFIX_BYTES = 144
# The tokenizer_class names transformers 5.24's AutoTokenizer resolves to BertTokenizer itself
_BERT_CLASSES = frozenset(f"{model}Tokenizer{fast}" for fast in ("", "Fast") for model in
                          ("Bert", "Electra", "LayoutLM", "Lxmert", "MobileBert", "SqueezeBert"))


class _Added(NamedTuple):
    """An added or special token read from a folder; ``where`` names its file and field."""

    content: str
    special: bool
    normalized: bool
    where: str


_REQUIRED = object()


def _field(path, data: dict, name: str, check, expected: str, label: str | None = None,
           default=_REQUIRED):
    """``data[name]`` (``default`` when absent, if given) when ``check`` accepts it; else a
    ValueError naming the file and the field (``label``, default ``name``)."""
    label = label or name
    if name not in data:
        if default is not _REQUIRED:
            return default
        raise ValueError(f"'{path}': field '{label}' is missing: expected {expected}")
    value = data[name]
    if not check(value):
        raise ValueError(f"'{path}': field '{label}' = {_shown(value)}: expected {expected}")
    return value


def _is_bool(value) -> bool:
    return type(value) is bool


def _is_u32(value) -> bool:  # the tokenizers package's ids
    return type(value) is int and 0 <= value < 2**32


def _is_token(value) -> bool:
    return isinstance(value, str) and bool(value) and not any(map(_is_whitespace, value))


_TOKEN = "a non-empty token without whitespace"


def _optional_json(path) -> dict:
    """The JSON object of ``path``, {} when there is no such file (a symlink counts)."""
    return read_json(path, _CONFIG_FILE_BYTES) if os.path.lexists(path) else {}


def _folder_arguments(folder: Path, max_bytes) -> tuple[list, dict]:
    """The vocabulary and WordPieceTokenizer's keyword arguments of a tokenizer folder."""
    config_path = folder / "tokenizer_config.json"
    config = _optional_json(config_path)
    name = config.get("tokenizer_class")
    if name is not None and (not isinstance(name, str) or name not in _BERT_CLASSES):
        raise ValueError(f"'{config_path}': field 'tokenizer_class' = {_shown(name)}: nnkit "
                         "reads BERT's WordPiece tokenizer only: expected one of "
                         f"{', '.join(sorted(_BERT_CLASSES))}, or none")
    vocab, settings, json_added, vocab_path = _folder_vocab(folder, max_bytes)
    settings.update(_config_settings(config_path, config, max_bytes))
    index = {t: i for i, t in enumerate(vocab)}
    added = _added_tokens(folder, config_path, config, json_added, index)
    roles, extras = _special_fields(config_path, config)
    if "added_tokens_decoder" not in config:  # transformers reads the map only then, over it
        map_path = folder / "special_tokens_map.json"
        map_roles, map_extras = _special_fields(map_path, _optional_json(map_path))
        roles.update(map_roles)
        extras += map_extras
    if roles:
        settings["special_tokens"] = {**settings.get("special_tokens", {}),
                                      **{role: e.content for role, e in roles.items()}}
    for e in roles.values():  # one not in the vocabulary: the constructor names it
        if e.content not in added and e.content in index:
            added[e.content] = e
    for e in extras:
        if e.content not in added and e.content not in index:
            raise ValueError(f"{e.where} = {quote(e.content)}: a special token outside the "
                             "vocabulary, which transformers gives a new id and nnkit does "
                             "not; add it to vocab.txt (or to tokenizer.json's added_tokens)")
        added.setdefault(e.content, e)
    _check_normalized(added.values(), settings)
    settings["added_tokens"] = [{"content": e.content, "special": e.special,
                                 "normalized": e.normalized} for e in added.values()]
    _check_memory(vocab_path, vocab, added, settings, max_bytes)
    return vocab, settings


def _folder_vocab(folder: Path, max_bytes):
    """(vocabulary, settings from tokenizer.json, its added tokens or None, the file read)."""
    txt, js = folder / "vocab.txt", folder / "tokenizer.json"
    has_txt, has_js = os.path.lexists(txt), os.path.lexists(js)
    if not (has_txt or has_js):
        raise FileNotFoundError(f"'{txt}' does not exist (nor tokenizer.json): a WordPiece "
                                "tokenizer folder needs its vocabulary")
    from_js, settings, added = [], {}, None
    if has_js:
        from_js, settings, added = _read_tokenizer_json(js, pipeline=not has_txt)
    if not has_txt:
        return from_js, settings, added, js
    vocab = WordPieceTokenizer._read_vocab(txt, max_bytes)
    if has_js and from_js != vocab:
        i = next((i for i, pair in enumerate(zip(vocab, from_js, strict=False))
                  if pair[0] != pair[1]), min(len(vocab), len(from_js)))
        at = [quote(tokens[i]) if i < len(tokens) else "no token" for tokens in (vocab, from_js)]
        raise ValueError(f"'{txt}' and '{js}' (field 'model.vocab') hold different "
                         f"vocabularies: at id {i}, {at[0]} and {at[1]}; transformers reads "
                         "tokenizer.json's: remove the stale file")
    return vocab, {}, added, txt


def _read_tokenizer_json(path, pipeline: bool) -> tuple[list, dict, dict | None]:
    """(vocabulary in id order, settings, added tokens {id: _Added} or None) of a
    tokenizers-package file holding a WordPiece model, and with ``pipeline`` BERT's
    normalizer and pre-tokenizer; each field of the JSON type that package requires."""
    data = read_json(path, _VOCAB_FILE_BYTES, unique_keys=True)
    model = _field(path, data, "model", lambda v: isinstance(v, dict), "an object")
    if model.get("type") != "WordPiece":
        raise ValueError(f"'{path}': field 'model.type' = {_shown(model.get('type'))}: "
                         "nnkit's WordPieceTokenizer reads WordPiece models only")
    vocab = _json_vocab(path, _field(path, model, "vocab", lambda v: isinstance(v, dict),
                                     "an object token -> id", "model.vocab"))
    added = _json_added(path, data["added_tokens"]) if "added_tokens" in data else None
    return vocab, _pipeline_settings(path, data, model) if pipeline else {}, added


def _pipeline_settings(path, data: dict, model: dict) -> dict:
    """WordPieceTokenizer's settings from a tokenizer.json's model, normalizer and
    pre-tokenizer, which must be BERT's."""
    _field(path, model, "continuing_subword_prefix", lambda v: v == PREFIX,
           f"'{PREFIX}' (nnkit's)", "model.continuing_subword_prefix")
    normalizer = _field(path, data, "normalizer", lambda v: isinstance(v, dict) and
                        v.get("type") == "BertNormalizer",
                        "BERT's normalizer, an object of type BertNormalizer")
    pre = _field(path, data, "pre_tokenizer", lambda v: isinstance(v, dict),
                 "BERT's pre-tokenizer, an object of type BertPreTokenizer")
    _field(path, pre, "type", lambda v: v == "BertPreTokenizer", "BertPreTokenizer",
           "pre_tokenizer.type")
    _field(path, normalizer, "clean_text", lambda v: v is True, "true (nnkit always cleans)",
           "normalizer.clean_text")

    def flag(name):
        return _field(path, normalizer, name, _is_bool, "true or false", f"normalizer.{name}")

    return {"lowercase": flag("lowercase"),
            "strip_accents": _field(path, normalizer, "strip_accents",
                                    lambda v: v is None or _is_bool(v), "true, false or null",
                                    "normalizer.strip_accents", default=None),
            "tokenize_chinese_chars": flag("handle_chinese_chars"),
            "max_input_chars_per_word": _field(
                path, model, "max_input_chars_per_word",
                lambda v: type(v) is int and 1 <= v < 2**64, "an integer >= 1",
                "model.max_input_chars_per_word"),
            "special_tokens": {"unk_token": _field(path, model, "unk_token", _is_token, _TOKEN,
                                                   "model.unk_token")}}


def _json_vocab(path, vocab: dict) -> list[str]:
    """The tokens of ``model.vocab`` in id order; its ids must be exactly 0..n-1."""
    tokens = [None] * len(vocab)
    for token, i in vocab.items():
        if not _is_u32(i) or i >= len(tokens) or tokens[i] is not None:
            raise ValueError(f"'{path}': field 'model.vocab' gives {quote(token)} the id "
                             f"{_shown(i)}: expected the ids 0..{len(tokens) - 1}, each once")
        tokens[i] = token
    return tokens


def _json_added(path, value) -> dict:
    """{id: _Added} of tokenizer.json's ``added_tokens`` (every field required, as there)."""
    if not isinstance(value, list):
        raise ValueError(f"'{path}': field 'added_tokens' = {_shown(value)}: expected a list")
    added = {}
    for j, entry in enumerate(value):
        where = f"added_tokens[{j}]"
        if not isinstance(entry, dict):
            raise ValueError(f"'{path}': field '{where}' = {_shown(entry)}: expected an object")
        i = _field(path, entry, "id", _is_u32, "an id 0..2**32-1", f"{where}.id")
        if i in added:
            raise ValueError(f"'{path}': field '{where}.id' = {i}: that id is given twice")
        added[i] = _added_entry(path, where, entry, required=True)
    return added


def _added_entry(path, where: str, entry: dict, *, required: bool, special=None) -> _Added:
    """An AddedToken-like object: its content and flags (each a JSON bool; all ``required``
    in tokenizer.json). ``special`` forces the flag (a special token); ``normalized``
    defaults to ``not special``, as AddedToken's; ``single_word`` is refused."""
    content = _field(path, entry, "content", _is_token, _TOKEN, f"{where}.content")
    flags = {flag: _field(path, entry, flag, _is_bool, "true or false", f"{where}.{flag}")
             for flag in ("special", "normalized", "lstrip", "rstrip", "single_word")
             if required or flag in entry}
    if flags.get("single_word"):
        raise ValueError(f"'{path}': field '{where}.single_word' = true: nnkit cannot match "
                         "single-word tokens as transformers does (it tests its neighbours "
                         "against a Unicode word class); expected false")
    special = flags.get("special", False) if special is None else special
    return _Added(content, special, flags.get("normalized", not special),
                  f"'{path}': field '{where}'")


def _added_tokens(folder, config_path, config, json_added, index) -> dict:
    """{content: _Added} of the folder's added tokens, in id order, from the config's
    ``added_tokens_decoder`` when it has one (transformers then skips tokenizer.json's,
    which must agree) else from tokenizer.json; each id must be the one transformers gives:
    the vocabulary's, or the next new one."""
    if "added_tokens_decoder" in config:
        added = _config_added(config_path, config["added_tokens_decoder"])
        if json_added is not None and _flags_by_id(json_added) != _flags_by_id(added):
            raise ValueError(f"'{config_path}' (field 'added_tokens_decoder') and "
                             f"'{folder / 'tokenizer.json'}' (field 'added_tokens') list "
                             "different added tokens; transformers' classes read one or the "
                             "other: remove the stale one")
    else:
        legacy = folder / "added_tokens.json"
        if _optional_json(legacy):
            raise ValueError(f"'{legacy}': nnkit does not read this legacy file of added "
                             "tokens; move them into tokenizer.json's added_tokens")
        added = json_added or {}
    out, new = {}, len(index)
    for i in sorted(added):
        e = added[i]
        want = index.get(e.content, new)
        if i != want or e.content in out:
            raise ValueError(f"{e.where} = {quote(e.content)} with the id {i}: transformers "
                             f"gives it the id {want} (the vocabulary's, or the next one "
                             "after it), once; fix the id")
        new += e.content not in index
        out[e.content] = e
    return out


def _flags_by_id(added: dict) -> dict:
    return {i: e[:3] for i, e in added.items()}


def _config_added(path, value) -> dict:
    """{id: _Added} of tokenizer_config.json's ``added_tokens_decoder`` {"id": {...}}."""
    if not isinstance(value, dict):
        raise ValueError(f"'{path}': field 'added_tokens_decoder' = {_shown(value)}: expected "
                         "an object id -> token")
    added = {}
    for key, entry in value.items():
        where = f"added_tokens_decoder.{key}"
        if not (key.isascii() and key.isdigit()) or int(key) >= 2**32 or int(key) in added:
            raise ValueError(f"'{path}': field '{_bare(where)}': expected a decimal id "
                             "0..2**32-1, each once")
        if not isinstance(entry, dict):
            raise ValueError(f"'{path}': field '{_bare(where)}' = {_shown(entry)}: expected an "
                             "object")
        added[int(key)] = _added_entry(path, _bare(where), entry, required=False)
    return added


def _special_fields(path, fields: dict) -> tuple[dict, list]:
    """({role: _Added}, [_Added]) of a config's or special_tokens_map.json's special tokens:
    the five roles, then the other tokens transformers makes special (every ``*_token``
    field holding a token, ``additional_special_tokens``, ``extra_special_tokens``)."""
    roles, extras = {}, []
    for key, value in fields.items():
        if key in ("additional_special_tokens", "extra_special_tokens") and value is not None:
            items = list(value.values()) if isinstance(value, dict) else value
            if not isinstance(items, list):
                raise ValueError(f"'{path}': field '{key}' = {_shown(value)}: expected a list "
                                 "of tokens")
            extras += [_special_entry(path, f"{key}[{j}]", v) for j, v in enumerate(items)]
        elif key in SPECIAL_ROLES:
            roles[key] = _special_entry(path, key, value)
        elif key.endswith("_token") and value is not None and (
                key in ("bos_token", "eos_token") or isinstance(value, str)
                or isinstance(value, dict) and "content" in value):  # else no token: ignored
            extras.append(_special_entry(path, _bare(key), value))
    return roles, extras


def _special_entry(path, field: str, value) -> _Added:
    """A special token: a string, or an AddedToken-like object (``normalized`` default
    false)."""
    if isinstance(value, dict):
        return _added_entry(path, field, value, required=False, special=True)
    _field(path, {field: value}, field, _is_token,
           f"{_TOKEN}, or an object with its \"content\"")
    return _Added(value, True, False, f"'{path}': field '{field}'")


def _config_settings(path, config: dict, max_bytes) -> dict:
    """WordPieceTokenizer's settings from a tokenizer_config.json's fields."""
    out = {}
    for name, arg, check, expected in (
            ("do_lower_case", "lowercase", _is_bool, "true or false"),
            ("strip_accents", "strip_accents", lambda v: v is None or _is_bool(v),
             "true, false or null"),
            ("tokenize_chinese_chars", "tokenize_chinese_chars", _is_bool, "true or false"),
            ("clean_up_tokenization_spaces", "clean_up_tokenization_spaces", _is_bool,
             "true or false")):
        if name in config:
            out[arg] = _field(path, config, name, check, expected)
    length = config.get("model_max_length")
    if length is None or (type(length) in (int, float) and length >= _NO_LIMIT):
        return out  # transformers' "no limit"
    _field(path, config, "model_max_length", lambda v: type(v) is int and v >= 1,
           "an integer >= 1 (or null)")
    if max_bytes is not None and length * _PAD_TOKEN_BYTES > max_bytes:
        raise ValueError(f"'{path}': field 'model_max_length' = {length}: one encoding padded "
                         f"to it (padding='max_length') takes {length * _PAD_TOKEN_BYTES} "
                         f"bytes, more than max_bytes={max_bytes}; pass a larger max_bytes (or "
                         "None) to from_pretrained if you trust the folder")
    out["model_max_length"] = length
    return out


def _check_normalized(entries, settings: dict) -> None:
    """Refuse a normalized added token that normalizing changes: transformers would match
    its normalized form, which nnkit does not."""
    lowercase = settings.get("lowercase", True)
    strip = settings.get("strip_accents")
    for e in entries:
        normal = _normalize(e.content, lowercase, lowercase if strip is None else strip,
                            settings.get("tokenize_chinese_chars", True))
        if e.normalized and normal != e.content:
            raise ValueError(f"{e.where} = {quote(e.content)} is normalized, and normalizing "
                             f"makes it {quote(normal)}: nnkit matches normalized tokens "
                             "that normalizing leaves as they are; write it normalized")


def _token_bytes(token: str, limit: int, cut: int = 0) -> int:
    """An upper bound of what ``token`` costs: its str, and the entries of its prefixes (up
    to ``limit`` characters, after its first ``cut``) in a prefix table."""
    width = 1 if token.isascii() else 4
    m = max(0, min(len(token) - cut, limit))
    return _TOKEN_BYTES + width * len(token) + m * _PREFIX_BYTES + width * m * (m + 1) // 2


def _check_memory(path, vocab, added, settings, max_bytes) -> None:
    """Refuse a vocabulary whose tokens and prefix tables would take more than
    ``max_bytes`` (a long piece costs the square of its length)."""
    if max_bytes is None:
        return
    limit = settings.get("max_input_chars_per_word", 100)
    cut = len(PREFIX)
    need = sum(_token_bytes(t, limit, cut if t[:cut] == PREFIX else 0) for t in vocab)
    need += sum(_token_bytes(t, len(t)) for t in added)
    if need > max_bytes:
        raise ValueError(f"'{path}': its {len(vocab)} tokens (up to "
                         f"{max(map(len, vocab), default=0)} characters) would take about "
                         f"{need} bytes with the lookup tables of their prefixes (up to "
                         f"max_input_chars_per_word={limit}), more than max_bytes="
                         f"{max_bytes}; pass a larger max_bytes if you trust the folder")


# The WordPiece decoder's clean-up of each token (its leading space included), and
# transformers' optional second pass over the whole text (clean_up_tokenization_spaces).
_CLEAN_UP_TOKEN = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                   (" n't", "n't"), (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"),
                   (" 've", "'ve"), (" 're", "'re"))
_CLEAN_UP_TEXT = tuple(pair for pair in _CLEAN_UP_TOKEN if pair[0] != " do not")


def _join_tokens(tokens) -> str:
    """WordPiece tokens as text: a ``##`` piece glued to the one before, every other token
    after a space, then each token's space before punctuation removed."""
    parts = []
    for i, token in enumerate(tokens):
        if i:
            token = token[len(PREFIX):] if token.startswith(PREFIX) else " " + token
        if token[:1] == " ":
            for old, new in _CLEAN_UP_TOKEN:
                token = token.replace(old, new)
        parts.append(token)
    return "".join(parts)


def _not_utf8(path, data: bytes, exc: UnicodeDecodeError) -> ValueError:
    """The error for a vocabulary file that is not UTF-8: the file, the first bad byte's
    offset in the file and its line (``data`` is the whole file)."""
    start, reason = exc.start, exc.reason
    line = data.count(b"\n", 0, start) + 1
    return ValueError(f"'{path}' is not UTF-8 text: byte 0x{data[start]:02x} at offset {start} "
                      f"(line {line}) cannot be decoded ({reason}); expected a vocab.txt "
                      f"encoded in UTF-8, one token per line (re-encode it, e.g. "
                      f"iconv -f latin1 -t utf-8)")


def _longest_first(n_a: int, n_b: int, budget: int) -> tuple[int, int]:
    """Lengths kept when a pair of ``n_a`` and ``n_b`` tokens must fit ``budget``: the
    shorter sequence (``a`` on a tie) keeps up to half the budget (rounded down), the longer
    one the rest -- what removing tokens one at a time from the longer one gives, with the
    ``tokenizers`` package's rounding."""
    if n_a + n_b <= budget:
        return n_a, n_b
    if n_a <= n_b:
        keep_a = min(n_a, budget // 2)
        return keep_a, budget - keep_a
    keep_b = min(n_b, budget // 2)
    return budget - keep_b, keep_b


def _strategy(truncation) -> str | None:
    """The truncation strategy of a ``truncation`` argument, None for none."""
    if truncation is True:
        return "longest_first"
    return None if truncation is False or truncation == "do_not_truncate" else truncation


def _kept(n_a: int, n_b: int, budget: int, strategy: str, has_pair: bool) -> tuple[int, int]:
    """Lengths of ``a`` and ``b`` kept under ``strategy`` for ``budget`` tokens (the special
    tokens already taken off), as the tokenizers package truncates: a zero budget empties
    both; ``only_first`` and ``only_second`` cut one sequence, which must keep a token."""
    if budget == 0:
        return 0, 0
    if strategy == "longest_first":
        return _longest_first(n_a, n_b, budget)
    excess = n_a + n_b - budget
    if strategy == "only_second" and not has_pair:
        raise ValueError(f"truncation='only_second' needs a second sequence: the text has "
                         f"{excess} tokens too many and no pair to cut them from")
    target = n_a if strategy == "only_first" else n_b
    if target <= excess:
        which = "first" if strategy == "only_first" else "second"
        raise ValueError(f"truncation={strategy!r}: the {which} sequence has {target} tokens, "
                         f"too few to remove the {excess} that max_length needs gone")
    if strategy == "only_first":
        return n_a - excess, n_b
    return n_a, n_b - excess


def _batch_encoding(encodings: list, batched: bool, return_tensors) -> BatchEncoding:
    """``__call__``'s result: lists of ints (one list per text, or one list unbatched), or
    (B, T) int64 arrays for ``return_tensors='np'``."""
    fields = ("ids", "token_type_ids", "attention_mask")
    if return_tensors == "np":
        lengths = sorted({len(e) for e in encodings})
        if len(lengths) > 1:
            raise ValueError(f"the encodings have different lengths {lengths}; return_tensors="
                             "'np' needs one: pass padding=True (or truncation with padding="
                             "'max_length')")
        T = lengths[0] if lengths else 0
        values = [np.stack([getattr(e, f) for e in encodings]) if encodings
                  else np.zeros((0, T), dtype=np.int64) for f in fields]
    else:
        values = [[getattr(e, f).tolist() for e in encodings] for f in fields]
        if not batched:
            values = [v[0] for v in values]
    return BatchEncoding(*values, tuple(encodings))


def _pad(enc: Encoding, length: int, pad_id: int, pad_token: str) -> Encoding:
    extra = length - len(enc)
    if extra <= 0:
        return enc
    zeros = np.zeros(extra, dtype=np.int64)
    return Encoding(
        ids=np.concatenate([enc.ids, np.full(extra, pad_id, dtype=np.int64)]),
        token_type_ids=np.concatenate([enc.token_type_ids, zeros]),
        attention_mask=np.concatenate([enc.attention_mask, zeros]),
        tokens=enc.tokens + (pad_token,) * extra,
        word_ids=enc.word_ids + (None,) * extra,
        sequence_ids=enc.sequence_ids + (None,) * extra,
    )
