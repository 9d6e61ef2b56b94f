"""Sentence embeddings from a sentence-transformers folder (``SentenceEncoder``).

A sentence-transformers model folder lists its modules in ``modules.json``: a Transformer
(a Hugging Face BERT folder, at the root ``""`` or in a subfolder such as
``0_Transformer``), a Pooling module (``1_Pooling/config.json``: which of the CLS token, the
mean, the max, the mean divided by sqrt(length), the position-weighted mean or the last token
of the final hidden states make the embedding: the ``pooling_mode_*`` booleans concatenate
them in ``POOLING_MODES`` order, a ``pooling_mode`` list in its own order) and optionally a
Normalize module (unit L2 norm). ``SentenceEncoder.from_pretrained`` reads such a folder with
nnkit's own BERT and tokenizer loading; ``encode`` gives what sentence-transformers' ``encode``
gives.

The folder is untrusted input: the module types named in ``modules.json`` are compared with
the three known names, never imported; every field read has its JSON type and value checked
(a ValueError names the file and the field); module paths must stay inside the folder.
"""

from __future__ import annotations

import json
import math
import numbers
import warnings
from pathlib import Path

import numpy as np

from .._budget import MAX_BYTES
from .._files import quote, read_bytes, read_json
from .._validation import check_bool, check_scalar
from ..autograd import no_grad
from ..text import WordPieceTokenizer
from .bert import Bert
from .pretrained import NewlyInitializedWarning

__all__ = ["SentenceEncoder", "POOLING_MODES"]

# sentence-transformers' pooling modes, in the order their vectors are concatenated
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_POOLING_FIELDS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean",
                   "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean",
                   "pooling_mode_lasttoken": "lasttoken"}
_MODULE_KINDS = ("Transformer", "Pooling", "Normalize")
_JSON_LIMIT = 1 << 20  # modules.json and the small configs


class SentenceEncoder:
    """A BERT, a tokenizer, a pooling and an optional normalisation: sentence embeddings.

    Parameters
    ----------
    bert : Bert
    tokenizer : WordPieceTokenizer
    pooling : str or sequence of str
        Modes of ``POOLING_MODES``; their vectors are concatenated in the order given.
    normalize : bool
        Scale every embedding to unit L2 norm (a Normalize module).
    max_seq_length : int, optional
        Texts are truncated to this many tokens (the BERT's ``max_position`` when None).
    do_lower_case : bool
        Lowercase the texts first (sentence_bert_config.json's field).

    Examples
    --------
    >>> from nnkit.text import WordPieceTokenizer
    >>> tok = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hi", "you"])
    >>> model = SentenceEncoder(Bert(7, 8, 1, 2, 16, 16), tok, normalize=True)
    >>> model.encode(["hi you", "hi"]).shape
    (2, 8)
    """

    def __init__(self, bert: Bert, tokenizer: WordPieceTokenizer, pooling=("mean",),
                 normalize: bool = False, max_seq_length: int | None = None,
                 do_lower_case: bool = False):
        if not isinstance(bert, Bert):
            raise TypeError(f"bert must be a nnkit.models.Bert, got {type(bert).__name__}")
        if not isinstance(tokenizer, WordPieceTokenizer):
            raise TypeError(f"tokenizer must be a WordPieceTokenizer, got "
                            f"{type(tokenizer).__name__}")
        modes = (pooling,) if isinstance(pooling, str) else tuple(pooling)
        unknown = [m for m in modes if m not in POOLING_MODES]
        if not modes or unknown:
            raise ValueError(f"pooling must name one or more of {POOLING_MODES}, got {pooling!r}")
        check_bool(normalize, name="normalize")
        check_bool(do_lower_case, name="do_lower_case")
        if max_seq_length is None:
            max_seq_length = bert.max_position
        check_scalar(max_seq_length, name="max_seq_length", kind=numbers.Integral, low=2,
                     high=bert.max_position)
        self.bert, self.tokenizer = bert, tokenizer
        self.pooling = modes
        self.normalize, self.do_lower_case = normalize, do_lower_case
        self.max_seq_length = int(max_seq_length)
        self.bert.eval()

    @property
    def dim(self) -> int:
        """The embedding width: hidden size times the number of pooling modes."""
        return self.bert.hidden_size * len(self.pooling)

    def get_sentence_embedding_dimension(self) -> int:
        """``dim`` (sentence-transformers' name)."""
        return self.dim

    @classmethod
    def from_pretrained(cls, folder, *, dtype=None,
                        max_bytes: int | None = MAX_BYTES) -> SentenceEncoder:
        """The encoder saved in a sentence-transformers folder (modules.json + modules).

        Parameters
        ----------
        folder : str or os.PathLike
            Holds modules.json; its Transformer module's folder holds a BERT checkpoint
            (config.json, model.safetensors) and its tokenizer (tokenizer.json or
            vocab.txt), read as ``Bert.from_pretrained`` and
            ``WordPieceTokenizer.from_pretrained`` read them.
        dtype : float32 (default) or float64
        max_bytes : int or None
            Passed to both loaders (what loading may allocate beyond the weights).

        Returns
        -------
        SentenceEncoder
        """
        folder = Path(folder)
        paths = _module_paths(folder)
        if "Transformer" not in paths or "Pooling" not in paths:
            raise ValueError(f"'{folder / 'modules.json'}' lists no "
                             f"{'Transformer' if 'Transformer' not in paths else 'Pooling'} "
                             "module; a SentenceEncoder needs a Transformer and a Pooling")
        transformer = paths["Transformer"]
        settings = _transformer_settings(transformer)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NewlyInitializedWarning)  # the unused pooler
            bert = Bert.from_pretrained(transformer, dtype=dtype, max_bytes=max_bytes)
        tokenizer = WordPieceTokenizer.from_pretrained(transformer, max_bytes=max_bytes)
        max_seq_length = settings.get("max_seq_length")
        if max_seq_length is None:
            max_seq_length = min(bert.max_position, tokenizer.model_max_length or math.inf)
        pooling = _pooling_modes(paths["Pooling"] / "config.json", bert.hidden_size)
        return cls(bert, tokenizer, pooling, normalize="Normalize" in paths,
                   max_seq_length=min(max_seq_length, bert.max_position),
                   do_lower_case=settings.get("do_lower_case", False))

    def encode(self, texts, batch_size: int = 32,
               normalize_embeddings: bool = False) -> np.ndarray:
        """Embeddings of ``texts``: (n, dim) float32 for a list of n texts, (dim,) for one.

        Parameters
        ----------
        texts : str or list of str
        batch_size : int
            Texts per forward pass (padded to the longest of their batch).
        normalize_embeddings : bool
            Scale each embedding to unit L2 norm (the model's Normalize module does it
            anyway).

        Returns
        -------
        ndarray (n, dim) or (dim,), float32
        """
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        check_scalar(batch_size, name="batch_size", kind=numbers.Integral, low=1)
        check_bool(normalize_embeddings, name="normalize_embeddings")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            out[start:start + batch_size] = self._embed(texts[start:start + batch_size])
        if normalize_embeddings or self.normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out[0] if single else out

    def _embed(self, texts: list) -> np.ndarray:
        """Pooled embeddings (b, dim) of one batch of texts."""
        for t in texts:
            if not isinstance(t, str):
                raise TypeError(f"texts must be str, got {type(t).__name__}")
        if self.do_lower_case:
            texts = [t.lower() for t in texts]
        enc = self.tokenizer(texts, padding=True, truncation="longest_first",
                             max_length=self.max_seq_length, return_tensors="np")
        with no_grad():
            hidden, _ = self.bert(**enc)
        return _pool(np.asarray(hidden.data, dtype=np.float64), enc["attention_mask"],
                     self.pooling)

    def __call__(self, texts, batch_size: int = 32,
                 normalize_embeddings: bool = False) -> np.ndarray:
        """``encode``."""
        return self.encode(texts, batch_size, normalize_embeddings)

    def __repr__(self) -> str:
        return (f"SentenceEncoder(dim={self.dim}, pooling={self.pooling}, "
                f"normalize={self.normalize}, max_seq_length={self.max_seq_length})")


def _pool(hidden: np.ndarray, mask: np.ndarray, modes: tuple) -> np.ndarray:
    """hidden (b, T, H), mask (b, T) 1/0 (right padding) -> (b, H len(modes))."""
    m = mask.astype(hidden.dtype)[:, :, None]  # (b, T, 1)
    count = np.maximum(m.sum(axis=1), 1e-9)  # (b, 1)
    total = (hidden * m).sum(axis=1)  # (b, H)
    out = []
    for mode in modes:
        if mode == "cls":
            out.append(hidden[:, 0])
        elif mode == "max":
            out.append(np.where(m > 0, hidden, -np.inf).max(axis=1))
        elif mode == "mean":
            out.append(total / count)
        elif mode == "mean_sqrt_len_tokens":
            out.append(total / np.sqrt(count))
        elif mode == "weightedmean":
            w = m * np.arange(1, hidden.shape[1] + 1)[None, :, None]
            out.append((hidden * w).sum(axis=1) / np.maximum(w.sum(axis=1), 1e-9))
        else:  # lasttoken
            last = np.maximum(mask.sum(axis=1) - 1, 0)
            out.append(hidden[np.arange(len(hidden)), last])
    return np.concatenate(out, axis=1)


# ----- reading the folder ------------------------------------------------------------------
def _module_paths(folder: Path) -> dict:
    """``{"Transformer" | "Pooling" | "Normalize": folder}`` from modules.json."""
    path = folder / "modules.json"
    data = _read_list(path)
    paths = {}
    for i, entry in enumerate(data):
        where = f"entry {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"'{path}': {where} is not a JSON object")
        kind = _string(path, entry, "type", where)
        name = kind.rsplit(".", 1)[-1]
        if not kind.startswith("sentence_transformers.") or name not in _MODULE_KINDS:
            raise ValueError(f"'{path}': {where} field 'type' = {quote(kind)}: nnkit reads "
                             f"the modules {', '.join(_MODULE_KINDS)} of sentence_transformers "
                             "only")
        if name in paths:
            raise ValueError(f"'{path}': {where} lists a second {name} module")
        paths[name] = _inside(folder, path, _string(path, entry, "path", where), where)
    return paths


def _read_list(path: Path) -> list:
    """modules.json: a JSON list (read_json reads objects only)."""
    data = read_bytes(path, _JSON_LIMIT)
    try:
        value = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"'{path}' is not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(value, list):
        raise ValueError(f"'{path}' holds a JSON {type(value).__name__}, not a list of modules")
    return value


def _string(path: Path, entry: dict, field: str, where: str) -> str:
    value = entry.get(field)
    if not isinstance(value, str):
        raise ValueError(f"'{path}': {where} field {field!r} = {quote(value)}: expected a "
                         "string")
    return value


def _inside(folder: Path, path: Path, relative: str, where: str) -> Path:
    """``folder / relative``, refused unless it is a folder inside ``folder``."""
    parts = Path(relative).parts
    if Path(relative).is_absolute() or ".." in parts or "\\" in relative:
        raise ValueError(f"'{path}': {where} field 'path' = {quote(relative)}: expected a "
                         "relative path inside the folder")
    target = folder / relative
    if not target.resolve().is_relative_to(folder.resolve()) or not target.is_dir():
        raise ValueError(f"'{path}': {where} field 'path' = {quote(relative)}: not a folder "
                         "inside the model folder")
    return target


def _transformer_settings(folder: Path) -> dict:
    """sentence_bert_config.json's max_seq_length and do_lower_case (absent: {})."""
    path = folder / "sentence_bert_config.json"
    if not path.exists():
        return {}
    data = read_json(path, _JSON_LIMIT)
    settings = {}
    length = data.get("max_seq_length")
    if length is not None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 2:
            raise ValueError(f"'{path}': field 'max_seq_length' = {quote(length)}: expected "
                             "an integer >= 2")
        settings["max_seq_length"] = length
    lower = data.get("do_lower_case", False)
    if not isinstance(lower, bool):
        raise ValueError(f"'{path}': field 'do_lower_case' = {quote(lower)}: expected a "
                         "boolean")
    settings["do_lower_case"] = lower
    return settings


def _pooling_modes(path: Path, hidden_size: int) -> tuple:
    """The pooling modes of 1_Pooling/config.json (its booleans, or ``pooling_mode``)."""
    data = read_json(path, _JSON_LIMIT)
    for field in ("word_embedding_dimension", "embedding_dimension"):
        dim = data.get(field, hidden_size)
        if dim != hidden_size or isinstance(dim, bool):
            raise ValueError(f"'{path}': field {field!r} = {quote(dim)}: the BERT's hidden "
                             f"size is {hidden_size}")
    modes = []
    for field, mode in _POOLING_FIELDS.items():
        value = data.get(field, False)
        if not isinstance(value, bool):
            raise ValueError(f"'{path}': field {field!r} = {quote(value)}: expected a boolean")
        if value:
            modes.append(mode)
    if "pooling_mode" in data:
        value = data["pooling_mode"]
        named = [value] if isinstance(value, str) else value
        if not isinstance(named, list) or not named or any(m not in POOLING_MODES
                                                            for m in named):
            raise ValueError(f"'{path}': field 'pooling_mode' = {quote(value)}: expected one "
                             f"or a list of {POOLING_MODES}")
        modes += named
    if not modes:
        raise ValueError(f"'{path}': no pooling mode is set (pooling_mode_mean_tokens, ...)")
    return tuple(modes)
