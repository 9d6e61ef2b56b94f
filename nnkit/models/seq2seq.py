"""RNN encoder-decoder with Bahdanau's additive attention (notes §5.3).

Notation of notes §5.3: the encoder maps x_1..x_m to annotations zeta_1..zeta_m; the decoder's
state z_{i-1} summarises zeta and y_1..y_{i-1}; attention lets the decoder look back at every
annotation at every step,

    e_ij = MLP(z_{i-1}, zeta_j) = v^T tanh(W z_{i-1} + U zeta_j + b),
    a_ij = softmax_j(e_ij),        c_i = sum_j a_ij zeta_j,
    z_i = GRU([E y_{i-1}, c_i], z_{i-1}),
    logits_i = W_o [z_i, c_i, E y_{i-1}] + b_o,     y_i ~ softmax(logits_i)

(Bahdanau et al. 2014). The encoder is bidirectional, zeta_j = [h_j forward, h_j backward];
each direction runs over the sentence's own tokens only, so padding never changes a result
(the backward GRU reads each row reversed within its length), and z_0 = tanh(W_0 [last
forward state, last backward state]). Training is teacher forcing: the decoder reads the
reference y_{i-1}, not its own guess.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

import numpy as np

from .. import functional as F
from .._validation import check_scalar
from ..autograd import Tensor, concat, stack, where
from ..nn.layers import Embedding, Linear
from ..nn.module import Module
from ..nn.recurrent import GRU
from .decoding import DecodingMethods, check_ids, check_src, check_tokens

__all__ = ["Seq2Seq", "Seq2SeqCache"]


@dataclass
class Seq2SeqCache:
    """Everything ``decode_step`` needs; every field has the batch on axis 0.

    Attributes
    ----------
    annotations : Tensor (B, S, 2H)
        zeta_j, the encoder's outputs.
    keys : Tensor (B, S, A)
        U zeta_j + b, computed once per sentence.
    mask : ndarray (B, S) bool
        True at real tokens, False at padding.
    state : Tensor (B, H)
        The decoder's z_{i-1}.
    attention : Tensor (B, S) or None
        a_ij of the last step.
    """

    annotations: Tensor
    keys: Tensor
    mask: np.ndarray
    state: Tensor
    attention: Tensor | None = None


class Seq2Seq(DecodingMethods, Module):
    """GRU encoder-decoder with additive attention, trained by teacher forcing.

    Parameters
    ----------
    src_vocab_size, tgt_vocab_size : int
    embed_dim : int
        E, the size of both embeddings.
    hidden_size : int
        H, each encoder direction's and the decoder's state size.
    attention_size : int or None
        A, the attention MLP's hidden size (default H).
    pad_id, bos_id, eos_id : int
        Special ids (shared by both vocabularies).
    dtype : float32 (default) or float64

    Notes
    -----
    Submodules: ``src_embed``, ``tgt_embed`` (Embedding), ``encoder_forward``,
    ``encoder_backward`` (GRU, batch_first), ``init_state`` (W_0), ``attn_query`` (W),
    ``attn_key`` (U, b), ``attn_score`` (v), ``decoder`` (GRU over [E y, c]), ``out`` (W_o).

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> from nnkit.models import Seq2Seq
    >>> model = Seq2Seq(10, 8, embed_dim=4, hidden_size=6)
    >>> src = np.array([[3, 4, 5], [6, 7, 0]])             # (B, S), 0 pads
    >>> tgt_in = np.array([[1, 3, 4], [1, 5, 0]])          # <bos> + target, (B, T)
    >>> model(src, tgt_in).shape                           # logits (B, T, V)
    (2, 3, 8)
    >>> model.greedy_decode(src, max_len=4).shape[0]
    2
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, embed_dim: int = 32,
                 hidden_size: int = 64, attention_size: int | None = None, pad_id: int = 0,
                 bos_id: int = 1, eos_id: int = 2, dtype=None):
        super().__init__()
        for name, value in (("src_vocab_size", src_vocab_size),
                            ("tgt_vocab_size", tgt_vocab_size), ("embed_dim", embed_dim),
                            ("hidden_size", hidden_size)):
            check_scalar(value, name=name, kind=numbers.Integral, low=1)
        A = hidden_size if attention_size is None else attention_size
        check_scalar(A, name="attention_size", kind=numbers.Integral, low=1)
        for name, value in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id)):
            check_scalar(value, name=name, kind=numbers.Integral, low=0,
                         high=min(src_vocab_size, tgt_vocab_size) - 1)
        self.src_vocab_size, self.tgt_vocab_size = int(src_vocab_size), int(tgt_vocab_size)
        self.hidden_size, self.pad_id, self.bos_id, self.eos_id = (
            int(hidden_size), int(pad_id), int(bos_id), int(eos_id))
        E, H = embed_dim, hidden_size
        self.src_embed = Embedding(src_vocab_size, E, padding_idx=pad_id, dtype=dtype)
        self.encoder_forward = GRU(E, H, batch_first=True, dtype=dtype)
        self.encoder_backward = GRU(E, H, batch_first=True, dtype=dtype)
        self.init_state = Linear(2 * H, H, dtype=dtype)
        self.attn_query = Linear(H, A, bias=False, dtype=dtype)
        self.attn_key = Linear(2 * H, A, dtype=dtype)
        self.attn_score = Linear(A, 1, bias=False, dtype=dtype)
        self.tgt_embed = Embedding(tgt_vocab_size, E, padding_idx=pad_id, dtype=dtype)
        self.decoder = GRU(E + 2 * H, H, batch_first=True, dtype=dtype)
        self.out = Linear(H + 2 * H + E, tgt_vocab_size, dtype=dtype)

    # ----- encoder --------------------------------------------------------------------------
    def encode(self, src) -> Seq2SeqCache:
        """Annotations, attention keys and z_0 of ``src`` (B, S) int (right-padded)."""
        src = check_src(src, self.src_vocab_size, self.pad_id)
        B, S = src.shape
        mask = src != self.pad_id  # (B, S)
        lengths = mask.sum(axis=1)
        rows = np.arange(B)
        # reversing each row within its length (pads stay at the end) is its own inverse
        j = np.arange(S)
        flip = np.where(j < lengths[:, None], lengths[:, None] - 1 - j, j)  # (B, S)
        embedded = self.src_embed(src)  # (B, S, E)
        fwd, _ = self.encoder_forward(embedded)  # (B, S, H)
        bwd_rev, _ = self.encoder_backward(embedded[rows[:, None], flip])  # reversed rows
        bwd = bwd_rev[rows[:, None], flip]  # (B, S, H), back in source order
        last = lengths - 1
        z0 = F.tanh(self.init_state(concat([fwd[rows, last], bwd_rev[rows, last]], axis=-1)))
        annotations = concat([fwd, bwd], axis=-1)  # (B, S, 2H): zeta_j
        return Seq2SeqCache(annotations, self.attn_key(annotations), mask, z0)

    # ----- decoder --------------------------------------------------------------------------
    def attend(self, state, cache: Seq2SeqCache):
        """a_ij = softmax_j(v^T tanh(W z_{i-1} + U zeta_j + b)) and c_i = sum_j a_ij zeta_j.

        Returns (context (B, 2H), weights (B, S)); padding gets weight 0.
        """
        query = self.attn_query(state)  # (B, A)
        energy = self.attn_score(F.tanh(cache.keys + query.unsqueeze(1)))  # (B, S, 1)
        energy = where(cache.mask, energy.squeeze(-1), -np.inf)  # (B, S)
        weights = F.softmax(energy, axis=-1)
        context = (weights.unsqueeze(1) @ cache.annotations).squeeze(1)  # (B, 2H)
        return context, weights

    def decode_step(self, tokens, cache: Seq2SeqCache):
        """One decoder step: ``tokens`` (B,) int y_{i-1} -> (logits (B, V), next cache)."""
        tokens = check_tokens(tokens, self.tgt_vocab_size, len(cache.mask))
        embedded = self.tgt_embed(tokens)  # (B, E)
        context, weights = self.attend(cache.state, cache)
        step_in = concat([embedded, context], axis=-1).unsqueeze(1)  # (B, 1, E + 2H)
        _, h = self.decoder(step_in, cache.state.unsqueeze(0))  # h (1, B, H)
        state = h.squeeze(0)  # z_i
        logits = self.out(concat([state, context, embedded], axis=-1))  # (B, V)
        return logits, replace(cache, state=state, attention=weights)

    def reorder_cache(self, cache: Seq2SeqCache, rows) -> Seq2SeqCache:
        """The cache of batch rows ``rows`` (B',) int, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return Seq2SeqCache(cache.annotations[rows], cache.keys[rows], cache.mask[rows],
                            cache.state[rows],
                            None if cache.attention is None else cache.attention[rows])

    def forward(self, src, tgt_in, return_attention: bool = False):
        """Teacher-forced logits.

        Parameters
        ----------
        src : array (B, S) int
        tgt_in : array (B, T) int
            ``<bos>`` followed by the reference without its last token (``tgt[:, :-1]``).
        return_attention : bool
            Also return a (B, T, S) Tensor of the attention weights a_ij.

        Returns
        -------
        logits : Tensor (B, T, V), and the weights with ``return_attention``.
        """
        cache = self.encode(src)
        tgt_in = check_ids(tgt_in, "tgt_in", self.tgt_vocab_size, len(cache.mask))
        logits, weights = [], []
        for t in range(tgt_in.shape[1]):
            step_logits, cache = self.decode_step(tgt_in[:, t], cache)
            logits.append(step_logits)
            weights.append(cache.attention)
        logits = stack(logits, axis=1)  # (B, T, V)
        return (logits, stack(weights, axis=1)) if return_attention else logits

    def extra_repr(self) -> str:
        return (f"src_vocab_size={self.src_vocab_size}, tgt_vocab_size={self.tgt_vocab_size}, "
                f"hidden_size={self.hidden_size}")

