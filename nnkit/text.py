"""WordPiece tokenization for BERT (notes, section 6.5), in plain Python.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
# Padding makes max_length tokens per encoding (Python tuples and int64 arrays, about 100
# bytes a token); a longer pad is refused before anything is allocated.
_MAX_PAD_LENGTH = 2**24


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


def _special_pattern(tokens) -> re.Pattern | None:
    """A regex matching any of ``tokens``, longest first (leftmost-longest, as transformers
    finds added tokens in raw text)."""
    tokens = sorted({t for t in tokens if t}, key=lambda t: (-len(t), t))
    return re.compile("(" + "|".join(map(re.escape, tokens)) + ")") if tokens else None


@functools.lru_cache(maxsize=64)
def _cached_pattern(tokens: tuple):
    return _special_pattern(tokens)


def _split_specials(text: str, pattern) -> list[tuple[str, bool]]:
    """``text`` cut at the special tokens written in it: [(segment, is_special)]."""
    if pattern is None:
        return [(text, False)]
    parts = pattern.split(text)  # text, special, text, special, ..., text
    return [(part, i % 2 == 1) for i, part in enumerate(parts) if part]


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
    for segment, special in _split_specials(text, _cached_pattern(tuple(never_split))):
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


@dataclass(frozen=True, eq=False)
class BatchEncoding:
    """Encodings stacked to a batch: ``ids``, ``token_type_ids``, ``attention_mask`` are
    (B, T) int64; ``encodings`` keeps the per-example :class:`Encoding` objects."""

    ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    encodings: tuple

    def __len__(self) -> int:
        return len(self.encodings)


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

    Use :meth:`train` to learn a vocabulary from text, :meth:`load` to read a ``vocab.txt``,
    :meth:`from_pretrained` to read a Hugging Face tokenizer folder.
    """

    def __init__(self, vocab, lowercase: bool = True, max_input_chars_per_word: int = 100, *,
                 strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
                 special_tokens: dict | None = None, model_max_length: int | None = None,
                 clean_up_tokenization_spaces: bool = False):
        self.itos = self._vocab_list(vocab)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        self.special_tokens = self._special_roles(special_tokens)
        missing = [t for t in self.special_tokens.values() if t not in self.stoi]
        if missing:
            raise ValueError(f"vocab lacks the special token(s) {', '.join(missing)}; "
                             "a vocabulary must contain all of "
                             f"{' '.join(self.special_tokens.values())}")
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
        self._specials = frozenset(self.special_tokens.values())
        self._pattern = _special_pattern(self._specials)
        self._unk = self.special_tokens["unk_token"]
        self._cache: dict = {}

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
                                 f"{token!r}")
            roles[role] = token
        if len(set(roles.values())) != len(roles):
            raise ValueError(f"special_tokens gives two roles the same token: {roles}")
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
            if not isinstance(t, str) or not t or any(_is_whitespace(c) for c in t):
                raise ValueError(f"vocab tokens must be non-empty strings without whitespace; "
                                 f"got {t!r}")
        if len(set(tokens)) != len(tokens):
            dup = next(t for t, c in Counter(tokens).items() if c > 1)
            raise ValueError(f"vocab has the token {dup!r} more than once")
        return tokens

    # -- vocabulary --------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.itos)

    def __len__(self) -> int:
        return len(self.itos)

    def get_vocab(self) -> dict:
        """A copy of the token -> id mapping."""
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
        """Write ``vocab.txt`` (one token per line, line i is id i). ``path`` may be a
        directory (``vocab.txt`` inside it is written). Returns the file's path."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "vocab.txt")
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            for token in self.itos:
                f.write(token + "\n")
        return path

    @classmethod
    def load(cls, path, lowercase: bool = True,
             max_input_chars_per_word: int = 100) -> WordPieceTokenizer:
        """Read a ``vocab.txt`` (BERT's format) or a directory holding one."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "vocab.txt")
        return cls(cls._read_vocab(path), lowercase=lowercase,
                   max_input_chars_per_word=max_input_chars_per_word)

    @staticmethod
    def _read_vocab(path: str) -> list[str]:
        """The tokens of a vocab.txt, in id order."""
        try:
            with open(path, encoding="utf-8") as f:
                tokens = [line.rstrip("\r\n") for line in f]
        except UnicodeDecodeError as exc:
            raise _not_utf8(path, exc) from None
        while tokens and tokens[-1] == "":
            tokens.pop()
        return tokens

    # -- Hugging Face folders ----------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder) -> WordPieceTokenizer:
        """The tokenizer of a Hugging Face folder (e.g. ``huggingface-cli download
        bert-base-uncased --local-dir FOLDER``), read without the network.

        The vocabulary comes from ``vocab.txt`` (or, when the folder has none, from the
        WordPiece model of ``tokenizer.json``, as transformers 5 writes it); the settings
        from ``tokenizer_config.json`` when present: ``do_lower_case``, ``strip_accents``,
        ``tokenize_chinese_chars``, the special tokens (``unk_token``, ``sep_token``,
        ``pad_token``, ``cls_token``, ``mask_token``), ``model_max_length`` and
        ``clean_up_tokenization_spaces`` (transformers' defaults for absent fields).
        Encodings then equal transformers' BertTokenizerFast ones (ids, token types,
        attention masks, truncation and padding). Errors name the file and the field.
        """
        folder = Path(os.fspath(folder))
        if not folder.is_dir():
            raise FileNotFoundError(f"'{folder}' is not a folder: from_pretrained reads a "
                                    "tokenizer folder holding vocab.txt (or tokenizer.json)")
        config_path = folder / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.is_file() else {}
        settings = {}
        if (folder / "vocab.txt").is_file():
            vocab = cls._read_vocab(str(folder / "vocab.txt"))
        elif (folder / "tokenizer.json").is_file():
            vocab, settings = _read_tokenizer_json(folder / "tokenizer.json")
        else:
            raise FileNotFoundError(f"'{folder / 'vocab.txt'}' does not exist (nor "
                                    "tokenizer.json): a WordPiece tokenizer folder needs its "
                                    "vocabulary")
        fields = _tokenizer_settings(config_path, config)  # over tokenizer.json's
        specials = {**settings.pop("special_tokens", {}), **fields.pop("special_tokens", {})}
        settings.update(fields)
        if specials:
            settings["special_tokens"] = specials
        try:
            return cls(vocab, **settings)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"'{folder}': {exc}") from None

    def save_pretrained(self, folder) -> Path:
        """Write ``vocab.txt`` and ``tokenizer_config.json`` to ``folder`` (created when
        missing), which transformers' ``BertTokenizerFast.from_pretrained`` and nnkit's
        ``from_pretrained`` read back into the same tokenizer. Returns the folder."""
        folder = Path(os.fspath(folder))
        folder.mkdir(parents=True, exist_ok=True)
        self.save_vocab(folder / "vocab.txt")
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.lowercase,
                  "strip_accents": self.strip_accents,
                  "tokenize_chinese_chars": self.tokenize_chinese_chars,
                  **self.special_tokens,
                  "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces}
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
            f.write("\n")
        return folder

    # -- encoding ----------------------------------------------------------------------
    def normalize(self, text: str) -> str:
        """The words of ``text`` after basic tokenization, joined as ``decode`` joins
        tokens: what ``decode(encode(text).ids)`` gives back when every word is in the
        vocabulary (special tokens written in ``text`` dropped)."""
        return _join_tokens([w for w in self._words(text) if w not in self._specials])

    def _words(self, text: str) -> list[str]:
        """``basic_tokenize`` with this tokenizer's settings and special tokens."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        strip = self.lowercase if self.strip_accents is None else self.strip_accents
        words = []
        for segment, special in _split_specials(text, self._pattern):
            if special:
                words.append(segment)
                continue
            normal = _normalize(segment, self.lowercase, strip, self.tokenize_chinese_chars)
            for chunk in normal.split(" "):
                if chunk:
                    words.extend(_split_punctuation(chunk))
        return words

    def _word_pieces(self, word: str) -> list[str]:
        """Greedy longest-match-first pieces of one basic token ([UNK] when impossible)."""
        pieces = self._cache.get(word)
        if pieces is not None:
            return pieces
        if word in self._specials:
            pieces = [word]
        elif len(word) > self.max_input_chars_per_word:
            pieces = [self._unk]
        else:
            pieces, start = [], 0
            while start < len(word):
                end = len(word)
                while end > start:
                    piece = word[start:end] if start == 0 else PREFIX + word[start:end]
                    if piece in self.stoi:
                        break
                    end -= 1
                if end == start:  # no piece matches here: the whole word is unknown
                    pieces = [self._unk]
                    break
                pieces.append(piece)
                start = end
        if len(self._cache) < 100_000:
            self._cache[word] = pieces
        return pieces

    def tokenize(self, text: str) -> list[str]:
        """The WordPiece tokens of ``text`` (no special tokens added)."""
        return [p for w in self._words(text) for p in self._word_pieces(w)]

    def _pieces_with_words(self, text: str) -> tuple[list[str], list[int]]:
        pieces, words = [], []
        for i, w in enumerate(self._words(text)):
            for p in self._word_pieces(w):
                pieces.append(p)
                words.append(i)
        return pieces, words

    def encode(self, text: str, pair: str | None = None, max_length: int | None = None,
               truncation: bool = False, padding=False,
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
        truncation : bool
            Cut the encoding to ``max_length`` (``model_max_length`` when None) by dropping
            tokens from the end of the longer
            sequence ("longest first": the shorter one keeps up to half of the room, rounded
            down, the longer one the rest). Without it, an encoding longer than
            ``max_length`` is a ``ValueError``.
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
        if truncation is True and max_length is None:
            max_length = self.model_max_length
        pad_to = self._check_lengths(max_length, truncation, padding)
        a, a_words = self._pieces_with_words(text)
        b, b_words = self._pieces_with_words(pair) if pair is not None else ([], [])
        n_special = (3 if pair is not None else 2) if add_special_tokens else 0
        if max_length is not None and len(a) + len(b) + n_special > max_length:
            if not truncation:
                raise ValueError(f"the encoding has {len(a) + len(b) + n_special} tokens, more "
                                 f"than max_length={max_length}; pass truncation=True to cut it")
            if max_length < n_special:
                raise ValueError(f"max_length={max_length} cannot hold the {n_special} special "
                                 "tokens")
            keep_a, keep_b = _longest_first(len(a), len(b), max_length - n_special)
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
        check_bool(truncation, name="truncation")
        if truncation and max_length is None:
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
                     truncation: bool = False, padding="longest") -> BatchEncoding:
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
        if truncation is True and max_length is None:
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


def _read_json(path) -> dict:
    """A JSON object from ``path``; ValueError naming the file otherwise."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except RecursionError:
        raise ValueError(f"'{path}' nests JSON too deeply") from None
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError
        raise ValueError(f"'{path}' is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"'{path}' holds a JSON {type(data).__name__}, not an object")
    return data


def _field(path, data: dict, name: str, check, expected: str):
    """``data[name]`` when ``check`` accepts it; ValueError naming the file and field."""
    value = data[name]
    if not check(value):
        raise ValueError(f"'{path}': field '{name}' = {value!r:.100}: expected {expected}")
    return value


def _tokenizer_settings(path, config: dict) -> dict:
    """WordPieceTokenizer's keyword arguments from a tokenizer_config.json's fields."""
    out, specials = {}, {}
    is_bool = (lambda v: type(v) is bool, "true or false")
    for name, arg, (check, expected) in (
            ("do_lower_case", "lowercase", is_bool),
            ("strip_accents", "strip_accents", (lambda v: v is None or type(v) is bool,
                                                "true, false or null")),
            ("tokenize_chinese_chars", "tokenize_chinese_chars", is_bool),
            ("clean_up_tokenization_spaces", "clean_up_tokenization_spaces", is_bool)):
        if name in config:
            out[arg] = _field(path, config, name, check, expected)
    for role in SPECIAL_ROLES:
        if config.get(role) is not None:
            token = config[role]
            if isinstance(token, dict):  # an AddedToken, as older transformers write them
                token = token.get("content")
            if not isinstance(token, str) or not token:
                raise ValueError(f"'{path}': field '{role}' = {config[role]!r:.100}: "
                                 "expected a token string (or an object with its content)")
            specials[role] = token
    if specials:
        out["special_tokens"] = specials
    length = config.get("model_max_length")
    if type(length) is int and 1 <= length <= _MAX_PAD_LENGTH:  # else: "no limit" markers
        out["model_max_length"] = length
    return out


def _read_tokenizer_json(path) -> tuple[dict, dict]:
    """(vocab {token: id}, settings) of a tokenizers-package file holding a BERT WordPiece
    pipeline; anything else is refused naming its field."""
    data = _read_json(path)
    model = data.get("model")
    if not isinstance(model, dict) or model.get("type") != "WordPiece":
        raise ValueError(f"'{path}': field 'model.type' = "
                         f"{model.get('type') if isinstance(model, dict) else model!r:.100}: "
                         "nnkit's WordPieceTokenizer reads WordPiece models only")
    if model.get("continuing_subword_prefix", PREFIX) != PREFIX:
        raise ValueError(f"'{path}': field 'model.continuing_subword_prefix' = "
                         f"{model['continuing_subword_prefix']!r:.100}: nnkit uses '{PREFIX}'")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not all(type(i) is int for i in vocab.values()):
        raise ValueError(f"'{path}': field 'model.vocab' must map tokens to integer ids")
    normalizer = data.get("normalizer") or {}
    if normalizer.get("type") != "BertNormalizer" or normalizer.get("clean_text") is False:
        raise ValueError(f"'{path}': field 'normalizer' = {normalizer!r:.200}: nnkit runs "
                         "BERT's normalizer (BertNormalizer with clean_text) only")
    pre = data.get("pre_tokenizer") or {}
    if pre.get("type") != "BertPreTokenizer":
        raise ValueError(f"'{path}': field 'pre_tokenizer' = {pre!r:.200}: nnkit runs BERT's "
                         "pre-tokenizer (BertPreTokenizer) only")
    settings = {"lowercase": bool(normalizer.get("lowercase", True)),
                "strip_accents": normalizer.get("strip_accents"),
                "tokenize_chinese_chars": bool(normalizer.get("handle_chinese_chars", True))}
    chars = model.get("max_input_chars_per_word", 100)
    if type(chars) is int and chars >= 1:
        settings["max_input_chars_per_word"] = chars
    if isinstance(model.get("unk_token"), str):
        settings["special_tokens"] = {"unk_token": model["unk_token"]}
    return vocab, settings


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


def _not_utf8(path: str, exc: UnicodeDecodeError) -> ValueError:
    """The error for a vocabulary file that is not UTF-8: the file, the first bad byte's
    offset in the file and its line (``exc`` counts from the start of a read chunk)."""
    data, start, reason = exc.object, exc.start, exc.reason
    with open(path, "rb") as f:
        whole = f.read()
    try:
        whole.decode("utf-8")
    except UnicodeDecodeError as full:
        data, start, reason = whole, full.start, full.reason
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
