"""Autoregressive decoding for any encoder-decoder: greedy search and beam search.

Notes §5.3 factors a translation as p(y_{1:n} | x) = prod_i p(y_i | x, y_{1:i-1});
a decoder produces one factor per call. Decoding only needs four things of a model, so the
functions here work for ``Seq2Seq``, ``TransformerTranslator`` and anything else that has:

``pad_id``, ``bos_id``, ``eos_id`` : int
    Special target ids.
``encode(src) -> cache``
    Read the source once (``src`` (B, S) int ids, right-padded) and return what the decoder
    needs before its first token: for an RNN its initial state, for a transformer the
    cross-attention keys/values and an empty self-attention key/value cache.
``decode_step(tokens (B,) int, cache) -> (logits Tensor (B, V), cache)``
    Feed the previous token of every row and get the next-token logits, extending the cache
    by this one position (nothing about the prefix is recomputed).
``reorder_cache(cache, rows (B',) int) -> cache``
    The cache of rows ``rows`` (a gather along the batch axis): beam search copies a
    sentence's cache to its beams and follows the beams' parents with it.

Scores are natural-log probabilities under the model, sum_i log p(y_i | x, y_{<i}), counting
every emitted token including ``<eos>``.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Any, Protocol

import numpy as np

from .. import functional as F
from .._validation import check_array, check_scalar
from ..autograd import no_grad

__all__ = ["Decodable", "DecodingMethods", "greedy_decode", "beam_search", "sequence_log_prob",
           "length_penalty", "check_src", "check_ids", "check_tokens"]


def check_ids(ids, name: str, vocab_size: int, batch: int | None = None,
              ndim: int = 2) -> np.ndarray:
    """``ids`` as an int64 array of rank ``ndim`` with values in [0, vocab_size), or raise."""
    ids = check_array(ids, name=name, ndim=ndim, allow_device=False)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if batch is not None and ids.shape[0] != batch:
        raise ValueError(f"{name} has shape {ids.shape}: {ids.shape[0]} rows, but the batch "
                         f"has {batch}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"{name} holds ids in [{ids.min()}, {ids.max()}], outside the "
                         f"vocabulary [0, {vocab_size})")
    return ids.astype(np.int64, copy=False)


def check_tokens(tokens, vocab_size: int, batch: int) -> np.ndarray:
    """One token per row: (batch,) int64 in [0, vocab_size)."""
    return check_ids(tokens, "tokens", vocab_size, batch, ndim=1)


def check_src(src, vocab_size: int, pad_id: int) -> np.ndarray:
    """Source ids (B, S) int64, right-padded with ``pad_id``, every row non-empty."""
    src = check_ids(src, "src", vocab_size)
    if 0 in src.shape:
        raise ValueError(f"src has shape {src.shape}; expected (B, S) with B >= 1 and S >= 1")
    real = src != pad_id
    empty = np.flatnonzero(~real.any(axis=1))
    if empty.size:
        raise ValueError(f"src row {empty[0]} holds only padding (pad_id={pad_id}); every "
                         "sentence needs at least one token")
    gaps = np.flatnonzero((real[:, 1:] & ~real[:, :-1]).any(axis=1))
    if gaps.size:
        raise ValueError(f"src row {gaps[0]} has a token after a pad (pad_id={pad_id}); pad "
                         "on the right only: [tokens..., pad, pad]")
    return src


class Decodable(Protocol):
    """What ``greedy_decode`` and ``beam_search`` need of a model (see the module docstring)."""

    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, src) -> Any: ...

    def decode_step(self, tokens, cache) -> tuple[Any, Any]: ...

    def reorder_cache(self, cache, rows) -> Any: ...


@contextlib.contextmanager
def _inference(model):
    """Evaluation mode (no dropout) and no graph, restoring the training flag afterwards."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        with no_grad():
            yield
    finally:
        if hasattr(model, "train"):
            model.train(was_training)


def _log_probs(logits) -> np.ndarray:
    """log softmax of the (B, V) logits as a float64 NumPy array."""
    return np.asarray(F.log_softmax(logits, axis=-1).numpy(), dtype=np.float64)


def _check_max_len(max_len) -> int:
    return int(check_scalar(max_len, name="max_len", kind=numbers.Integral, low=1))


def _batch_size(src) -> int:
    src = np.asarray(src)
    if src.ndim != 2:
        raise ValueError(f"src must be 2-D (B, S) token ids, got shape {src.shape}; "
                         "wrap one sentence as src[None]")
    return src.shape[0]


def length_penalty(length, alpha: float):
    """GNMT's length normalisation lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016).

    A hypothesis is ranked by log p(Y | x) / lp(Y); alpha = 0 ranks by log p alone (which
    favours short outputs), larger alpha favours longer ones.
    """
    return ((5.0 + np.asarray(length, dtype=np.float64)) / 6.0) ** alpha


def greedy_decode(model: Decodable, src, max_len: int = 50, return_scores: bool = False):
    """Pick the most probable next token at every step until ``<eos>`` or ``max_len``.

    Parameters
    ----------
    model : Decodable
        In evaluation mode for the call (dropout off), restored afterwards.
    src : array (B, S) int
        Source ids, right-padded with the model's pad id.
    max_len : int >= 1
        Most tokens to emit per row (``<eos>`` included).
    return_scores : bool
        Also return log p(output | src) per row.

    Returns
    -------
    ids : ndarray (B, L) int64
        The outputs without ``<bos>``: tokens, then ``<eos>`` (unless ``max_len`` cut the row
        short), then pad ids; L <= max_len is the longest row.
    scores : ndarray (B,) float64, only with ``return_scores``
    """
    max_len = _check_max_len(max_len)
    B = _batch_size(src)
    out = np.full((B, max_len), model.pad_id, dtype=np.int64)
    scores = np.zeros(B)
    with _inference(model):
        cache = model.encode(src)
        alive = np.arange(B)  # rows of ``out`` still decoding, in cache order
        tokens = np.full(B, model.bos_id, dtype=np.int64)
        steps = 0
        for t in range(max_len):
            steps = t + 1
            logits, cache = model.decode_step(tokens, cache)
            logp = _log_probs(logits)  # (len(alive), V)
            tokens = logp.argmax(axis=-1)
            out[alive, t] = tokens
            scores[alive] += logp[np.arange(len(alive)), tokens]
            going = tokens != model.eos_id
            if not going.any():
                break
            if not going.all():  # drop finished rows from the batch
                keep = np.flatnonzero(going)
                alive, tokens = alive[keep], tokens[keep]
                cache = model.reorder_cache(cache, keep)
    out = out[:, :steps]
    return (out, scores) if return_scores else out


def beam_search(model: Decodable, src, beam_size: int = 4, alpha: float = 0.0,
                max_len: int = 50, return_scores: bool = False):
    """Keep the ``beam_size`` most probable prefixes per sentence; return the best finished one.

    At each step every live prefix of a sentence is extended by every token; of the
    2 * beam_size best extensions (by log-probability), those ending in ``<eos>`` that rank
    among the best beam_size are finished hypotheses, and the best beam_size others live
    on. A sentence stops when beam_size hypotheses have finished (or at ``max_len``, where the
    live ones count as finished); the answer is the finished hypothesis with the largest
    log p(Y | x) / lp(Y) (``length_penalty``). With ``beam_size=1`` this is greedy search.

    Parameters
    ----------
    model : Decodable
    src : array (B, S) int
    beam_size : int >= 1
    alpha : float >= 0
        Length normalisation exponent (0: rank by log-probability alone).
    max_len : int >= 1
    return_scores : bool
        Also return the chosen outputs' log p(Y | x) (not length-normalised).

    Returns
    -------
    ids : ndarray (B, L) int64, as ``greedy_decode``
    scores : ndarray (B,) float64, only with ``return_scores``
    """
    K = int(check_scalar(beam_size, name="beam_size", kind=numbers.Integral, low=1))
    alpha = float(check_scalar(alpha, name="alpha", low=0.0))
    max_len = _check_max_len(max_len)
    B = _batch_size(src)
    with _inference(model):
        cache = model.reorder_cache(model.encode(src), np.repeat(np.arange(B), K))
        search = _BeamState(B, K, model.bos_id, model.eos_id)
        for _ in range(max_len):
            logits, cache = model.decode_step(search.tokens(), cache)
            parents = search.advance(_log_probs(logits))
            if search.all_done():
                break
            cache = model.reorder_cache(cache, parents)
    return search.best(alpha, model.pad_id, return_scores)


class _BeamState:
    """Live prefixes (B, K), their log-probabilities and each sentence's finished list."""

    def __init__(self, B, K, bos_id, eos_id):
        self.B, self.K, self.eos_id = B, K, eos_id
        self.prefixes = np.full((B, K, 0), bos_id, dtype=np.int64)  # (B, K, t)
        self.scores = np.full((B, K), -np.inf)
        self.scores[:, 0] = 0.0  # one live prefix, <bos>, per sentence at the start
        self.finished = [[] for _ in range(B)]  # (sequence, log p) per sentence
        self.done = np.zeros(B, dtype=bool)
        self._last = np.full(B * K, bos_id, dtype=np.int64)

    def tokens(self) -> np.ndarray:
        """(B * K,) the last token of every live prefix (<bos> first)."""
        return self._last

    def advance(self, logp) -> np.ndarray:
        """Extend by one token given logp (B * K, V); return the parent row of each new row."""
        B, K = self.B, self.K
        V = logp.shape[-1]
        cand = (self.scores[:, :, None] + logp.reshape(B, K, V)).reshape(B, K * V)
        top = np.argsort(-cand, axis=1, kind="stable")[:, : 2 * K]  # (B, 2K), ties: low id
        parents = np.repeat(np.arange(B) * K, K)  # dead rows just copy beam 0
        new_prefixes = np.repeat(self.prefixes[:, :1], K, axis=1)
        new_tokens = np.full((B, K), self.eos_id, dtype=np.int64)
        new_scores = np.full((B, K), -np.inf)
        for b in np.flatnonzero(~self.done):
            live = 0
            for rank, flat in enumerate(top[b]):
                score = cand[b, flat]
                if live == K or not score > -np.inf:  # impossible (or NaN) from here on
                    break
                k, token = divmod(int(flat), V)
                if token == self.eos_id:
                    if rank < K:
                        self.finished[b].append((self._extend(b, k, token), score))
                    continue
                parents[b * K + live] = b * K + k
                new_prefixes[b, live] = self.prefixes[b, k]
                new_tokens[b, live], new_scores[b, live] = token, score
                live += 1
            if len(self.finished[b]) >= K or live == 0:
                self.done[b] = True
        self.prefixes = np.concatenate([new_prefixes, new_tokens[:, :, None]], axis=2)
        self.scores = np.where(self.done[:, None], -np.inf, new_scores)
        self._last = new_tokens.reshape(-1)
        return parents

    def _extend(self, b, k, token) -> np.ndarray:
        return np.append(self.prefixes[b, k], token)

    def all_done(self) -> bool:
        return bool(self.done.all())

    def best(self, alpha, pad_id, return_scores):
        """The best hypothesis per sentence by log p / lp (live prefixes count at the end)."""
        chosen, scores = [], np.zeros(self.B)
        for b in range(self.B):
            pool = list(self.finished[b])
            if not self.done[b]:
                pool += [(self.prefixes[b, k], self.scores[b, k]) for k in range(self.K)
                         if np.isfinite(self.scores[b, k])]
            if not pool:  # every continuation was impossible (-inf or NaN log-probabilities)
                pool = [(np.zeros(0, dtype=np.int64), -np.inf)]
            ranked = [score / length_penalty(len(seq), alpha) for seq, score in pool]
            seq, scores[b] = pool[int(np.argmax(ranked))]  # first of equals: found earliest
            chosen.append(seq)
        out = np.full((self.B, max(1, *(len(s) for s in chosen))), pad_id, dtype=np.int64)
        for b, seq in enumerate(chosen):
            out[b, : len(seq)] = seq
        return (out, scores) if return_scores else out


def sequence_log_prob(model: Decodable, src, tgt) -> np.ndarray:
    """log p(tgt | src) under the model, by teacher forcing through ``decode_step``.

    Parameters
    ----------
    src : array (B, S) int
    tgt : array (B, T) int
        Outputs in the format ``greedy_decode`` returns: tokens, ``<eos>``, pad ids (no
        ``<bos>``); the pads after ``<eos>`` are not scored.

    Returns
    -------
    ndarray (B,) float64
    """
    tgt = check_array(tgt, name="tgt", ndim=2)
    if tgt.dtype.kind not in "iu":
        raise TypeError(f"tgt must hold integer token ids, got dtype {tgt.dtype}")
    B = _batch_size(src)
    if tgt.shape[0] != B:
        raise ValueError(f"tgt has {tgt.shape[0]} rows but src has {B}")
    ended = np.cumsum(tgt == model.eos_id, axis=1) - (tgt == model.eos_id)  # eos before t
    counted = ended == 0  # up to and including the first <eos>
    total = np.zeros(B)
    with _inference(model):
        cache = model.encode(src)
        tokens = np.full(B, model.bos_id, dtype=np.int64)
        for t in range(tgt.shape[1]):
            logits, cache = model.decode_step(tokens, cache)
            logp = _log_probs(logits)
            if t == 0 and tgt.size and (tgt.min() < 0 or tgt.max() >= logp.shape[1]):
                raise ValueError(f"tgt holds ids in [{tgt.min()}, {tgt.max()}], outside the "
                                 f"target vocabulary [0, {logp.shape[1]})")
            total += np.where(counted[:, t], logp[np.arange(B), tgt[:, t]], 0.0)
            tokens = tgt[:, t]
    return total


class DecodingMethods:
    """``model.greedy_decode(...)`` and ``model.beam_search(...)`` for a ``Decodable`` model:
    the module functions above with the model bound."""

    def greedy_decode(self, src, max_len: int = 50, return_scores: bool = False):
        """``nnkit.models.greedy_decode`` with this model."""
        return greedy_decode(self, src, max_len, return_scores)

    def beam_search(self, src, beam_size: int = 4, alpha: float = 0.0, max_len: int = 50,
                    return_scores: bool = False):
        """``nnkit.models.beam_search`` with this model."""
        return beam_search(self, src, beam_size, alpha, max_len, return_scores)
