"""Encoder-decoder transformer for translation (notes §6.1-6.4; Vaswani et al. 2017).

    X = E_src x * sqrt(d) + P,           Xi = Encoder(X)            (self-attention + MLP) x N
    Y = E_tgt y_{<i} * sqrt(d) + P,      logits_i = W Decoder(Y, Xi)_i
                                         (causal self-attention, cross-attention to Xi, MLP) x N

P is the sinusoidal positional encoding p[t, 2k] = sin(t / 10000^(2k/d)),
p[t, 2k+1] = cos(t / 10000^(2k/d)). The layers are ``nn.TransformerEncoder`` /
``nn.TransformerDecoder`` with torch's layer names, so the decoder's parameters are the
ones ``decode_step`` uses.

Incremental decoding with a key/value cache
-------------------------------------------
With the causal mask, position i's output never depends on later positions, so decoding
token i needs only its own queries: ``decode_step`` computes q, k, v for the new token alone
with each layer's ``self_attn.in_proj_weight``/``in_proj_bias``, appends k, v to that layer's
cache and attends over the cached prefix; the cross-attention keys and values of the memory
are computed once, in ``encode``. One step costs O(i) instead of the O(i^2) of re-running the
decoder over the prefix, and gives the same logits as ``forward`` (the tests check it).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import numpy as np

from .. import functional as F
from .._validation import check_scalar
from ..autograd import Tensor, concat
from ..functional.attention import sinusoidal_positional_encoding
from ..nn.attention import attention_with_weights
from ..nn.layers import Embedding, LayerNorm, Linear
from ..nn.module import Module
from ..nn.transformer import (
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    generate_square_subsequent_mask,
)
from .decoding import DecodingMethods, check_ids, check_src, check_tokens

__all__ = ["TransformerTranslator", "TranslatorCache"]


@dataclass
class TranslatorCache:
    """What ``decode_step`` needs; batch on axis 0 of every array.

    Attributes
    ----------
    memory_mask : ndarray (B, 1, 1, S) float
        0 at source tokens, -inf at padding (added to the cross-attention scores).
    cross_kv : list of (k, v) Tensors (B, N, S, d), one pair per decoder layer
        The memory's keys and values, computed once.
    self_kv : list of (k, v) Tensors (B, N, t, d)
        Keys and values of the t tokens decoded so far, per layer.
    position : int
        t, the position of the next token.
    attention : Tensor (B, S) or None
        The last layer's cross-attention weights (mean over heads) of the last step.
    """

    memory_mask: np.ndarray
    cross_kv: list
    self_kv: list = field(default_factory=list)
    position: int = 0
    attention: Tensor | None = None


class TransformerTranslator(DecodingMethods, Module):
    """Transformer encoder-decoder over token ids, with a key/value cache for decoding.

    Parameters
    ----------
    src_vocab_size, tgt_vocab_size : int
    d_model : int
    nhead : int
        Heads (d_model divisible by nhead).
    num_encoder_layers, num_decoder_layers : int
    dim_feedforward : int
    dropout : float
    norm_first : bool
        Pre-norm layers (Xiong et al. 2020) instead of the paper's post-norm.
    max_len : int
        Longest source or target sequence (rows of the positional table).
    pad_id, bos_id, eos_id : int
    dtype : float32 (default) or float64

    Submodules: ``src_embed``, ``tgt_embed``, ``encoder`` (``nn.TransformerEncoder`` with a
    final ``norm``), ``decoder`` (``nn.TransformerDecoder`` with a final ``norm``), ``generator``
    (Linear d_model -> tgt_vocab_size). Layers are batch-first.

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> from nnkit.models import TransformerTranslator
    >>> model = TransformerTranslator(10, 8, d_model=16, nhead=2, dim_feedforward=32)
    >>> src = np.array([[3, 4, 5], [6, 7, 0]])
    >>> model(src, np.array([[1, 3], [1, 4]])).shape                  # (B, T, V)
    (2, 2, 8)
    >>> model.beam_search(src, beam_size=3, max_len=4).shape[0]
    2
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, d_model: int = 64,
                 nhead: int = 4, num_encoder_layers: int = 2, num_decoder_layers: int = 2,
                 dim_feedforward: int = 128, dropout: float = 0.1, norm_first: bool = False,
                 max_len: int = 256, pad_id: int = 0, bos_id: int = 1, eos_id: int = 2,
                 dtype=None):
        super().__init__()
        for name, value in (("src_vocab_size", src_vocab_size),
                            ("tgt_vocab_size", tgt_vocab_size), ("d_model", d_model),
                            ("max_len", max_len)):
            check_scalar(value, name=name, kind=numbers.Integral, low=1)
        for name, value in (("pad_id", pad_id), ("bos_id", bos_id), ("eos_id", eos_id)):
            check_scalar(value, name=name, kind=numbers.Integral, low=0,
                         high=min(src_vocab_size, tgt_vocab_size) - 1)
        self.src_vocab_size, self.tgt_vocab_size = int(src_vocab_size), int(tgt_vocab_size)
        self.d_model, self.max_len = int(d_model), int(max_len)
        self.pad_id, self.bos_id, self.eos_id = int(pad_id), int(bos_id), int(eos_id)
        layer_args = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward,
                          dropout=dropout, batch_first=True, norm_first=norm_first, dtype=dtype)
        self.src_embed = Embedding(src_vocab_size, d_model, padding_idx=pad_id, dtype=dtype)
        self.tgt_embed = Embedding(tgt_vocab_size, d_model, padding_idx=pad_id, dtype=dtype)
        self.encoder = TransformerEncoder(TransformerEncoderLayer(**layer_args),
                                          num_encoder_layers, LayerNorm(d_model, dtype=dtype))
        self.decoder = TransformerDecoder(TransformerDecoderLayer(**layer_args),
                                          num_decoder_layers, LayerNorm(d_model, dtype=dtype))
        self.generator = Linear(d_model, tgt_vocab_size, dtype=dtype)
        self.register_buffer("positions", sinusoidal_positional_encoding(
            max_len, d_model, dtype=self.generator.weight.dtype).numpy())  # (max_len, d)
        for table in (self.src_embed, self.tgt_embed):  # N(0, 1/d), so sqrt(d) E y ~ N(0, 1)
            table.weight.data *= 1.0 / math.sqrt(d_model)

    # ----- embeddings -------------------------------------------------------------------------
    def _embed(self, table: Embedding, ids, start: int = 0):
        """table(ids) * sqrt(d) + P[start : start + T]; ids (B, T) -> (B, T, d)."""
        T = ids.shape[1]
        if start + T > self.max_len:
            raise ValueError(f"a sequence of {start + T} tokens is longer than max_len="
                             f"{self.max_len}; build the model with a larger max_len")
        return table(ids) * math.sqrt(self.d_model) + self.positions[start : start + T]

    # ----- full (teacher-forced) pass -------------------------------------------------------
    def memory(self, src):
        """The encoder's output Xi (B, S, d) and the source padding mask (B, S) bool."""
        src = check_src(src, self.src_vocab_size, self.pad_id)
        pad = src == self.pad_id
        return self.encoder(self._embed(self.src_embed, src), src_key_padding_mask=pad), pad

    def forward(self, src, tgt_in):
        """Teacher-forced logits (B, T, V) of ``tgt_in`` (B, T) = ``<bos>`` + target[:-1].

        The decoder runs over the whole prefix at once under the causal mask.
        """
        memory, pad = self.memory(src)
        tgt_in = check_ids(tgt_in, "tgt_in", self.tgt_vocab_size, memory.shape[0])
        T = tgt_in.shape[1]
        causal = generate_square_subsequent_mask(T, dtype=memory.dtype)
        out = self.decoder(self._embed(self.tgt_embed, tgt_in), memory, tgt_mask=causal,
                           memory_key_padding_mask=pad, tgt_is_causal=True)
        return self.generator(out)

    # ----- incremental decoding -------------------------------------------------------------
    def encode(self, src) -> TranslatorCache:
        """Run the encoder once and project the memory to every decoder layer's k, v."""
        memory, pad = self.memory(src)
        mask = np.where(pad, -np.inf, 0.0).astype(memory.dtype)[:, None, None, :]  # (B,1,1,S)
        cross = [self._memory_kv(layer.multihead_attn, memory) for layer in self.decoder.layers]
        empty = np.zeros((memory.shape[0], 0, self.d_model), dtype=memory.dtype)
        self_kv = [tuple(_heads(Tensor(empty), layer.self_attn.num_heads) for _ in range(2))
                   for layer in self.decoder.layers]
        return TranslatorCache(mask, cross, self_kv)

    @staticmethod
    def _memory_kv(attn, memory):
        E = attn.embed_dim
        w, b = attn.in_proj_weight, attn.in_proj_bias
        kv = _project(memory, w[E:], None if b is None else b[E:])  # (B, S, 2E)
        return _heads(kv[..., :E], attn.num_heads), _heads(kv[..., E:], attn.num_heads)

    def decode_step(self, tokens, cache: TranslatorCache):
        """Logits (B, V) of the next token after ``tokens`` (B,), and the extended cache."""
        tokens = check_tokens(tokens, self.tgt_vocab_size, len(cache.memory_mask))
        x = self._embed(self.tgt_embed, tokens[:, None], start=cache.position)  # (B, 1, d)
        self_kv, weights = [], None
        for layer, kv, cross in zip(self.decoder.layers, cache.self_kv, cache.cross_kv,
                                    strict=True):
            x, kv, weights = _decoder_layer_step(layer, x, kv, cross, cache.memory_mask)
            self_kv.append(kv)
        if self.decoder.norm is not None:
            x = self.decoder.norm(x)
        logits = self.generator(x.squeeze(1))  # (B, V)
        attention = None if weights is None else weights.mean(axis=1)[:, 0]  # (B, S)
        return logits, TranslatorCache(cache.memory_mask, cache.cross_kv, self_kv,
                                       cache.position + 1, attention)

    def reorder_cache(self, cache: TranslatorCache, rows) -> TranslatorCache:
        """The cache of batch rows ``rows`` (B',) int, in that order."""
        rows = np.asarray(rows, dtype=np.int64)
        return TranslatorCache(
            cache.memory_mask[rows],
            [(k[rows], v[rows]) for k, v in cache.cross_kv],
            [(k[rows], v[rows]) for k, v in cache.self_kv],
            cache.position,
            None if cache.attention is None else cache.attention[rows])

    def extra_repr(self) -> str:
        return (f"src_vocab_size={self.src_vocab_size}, tgt_vocab_size={self.tgt_vocab_size}, "
                f"d_model={self.d_model}")


# ----- one decoder layer, one new position --------------------------------------------------
def _project(x, weight, bias):
    return F.linear(x, weight, bias)


def _heads(x, num_heads):
    """(B, L, E) -> (B, N, L, E/N)."""
    B, L, E = x.shape
    return x.reshape(B, L, num_heads, E // num_heads).transpose(0, 2, 1, 3)  # (B, N, L, d)


def _merge(x):
    """(B, N, L, d) -> (B, L, N * d)."""
    B, N, L, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, L, N * d)  # (B, L, E)


def _self_attention_step(attn, x, kv):
    """Causal self-attention of the new position x (B, 1, E) over the cached prefix + itself."""
    qkv = _project(x, attn.in_proj_weight, attn.in_proj_bias)  # (B, 1, 3E)
    E, N = attn.embed_dim, attn.num_heads
    q, k, v = (_heads(qkv[..., i * E:(i + 1) * E], N) for i in range(3))  # (B, N, 1, d)
    k, v = concat([kv[0], k], axis=2), concat([kv[1], v], axis=2)  # (B, N, t + 1, d)
    p = attn.dropout if attn.training else 0.0
    out, _ = attention_with_weights(q, k, v, None, p)  # every cached position is allowed
    return attn.out_proj(_merge(out)), (k, v)


def _cross_attention_step(attn, x, cross, memory_mask):
    """Attention of x (B, 1, E) over the memory's cached keys/values (B, N, S, d)."""
    E, N = attn.embed_dim, attn.num_heads
    b = attn.in_proj_bias
    q = _heads(_project(x, attn.in_proj_weight[:E], None if b is None else b[:E]), N)
    p = attn.dropout if attn.training else 0.0
    out, weights = attention_with_weights(q, cross[0], cross[1], memory_mask, p)
    return attn.out_proj(_merge(out)), weights  # weights (B, N, 1, S)


def _decoder_layer_step(layer: TransformerDecoderLayer, x, kv, cross, memory_mask):
    """``layer.forward`` for the newest position only; same sub-modules, same order."""
    if layer.norm_first:
        sa, kv = _self_attention_step(layer.self_attn, layer.norm1(x), kv)
        x = x + layer.dropout1(sa)
        ca, weights = _cross_attention_step(layer.multihead_attn, layer.norm2(x), cross,
                                            memory_mask)
        x = x + layer.dropout2(ca)
        return x + layer._ff_block(layer.norm3(x)), kv, weights
    sa, kv = _self_attention_step(layer.self_attn, x, kv)
    x = layer.norm1(x + layer.dropout1(sa))
    ca, weights = _cross_attention_step(layer.multihead_attn, x, cross, memory_mask)
    x = layer.norm2(x + layer.dropout2(ca))
    return layer.norm3(x + layer._ff_block(x)), kv, weights
