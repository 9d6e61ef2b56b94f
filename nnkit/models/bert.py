"""BERT (Devlin et al. 2018; notes §6.5): a bidirectional transformer encoder,
pretrained by masked language modelling and next-sentence prediction, then fine-tuned.

    X_0 = LayerNorm(E_word[ids] + E_pos[0..T-1] + E_type[segments])      (then dropout)
    X_l = EncoderLayer_l(X_{l-1})      post-norm, GELU feed-forward, l = 1..L
    pooled = tanh(W_p X_L[:, 0] + b_p)                                    (the [CLS] token)

Padding (``attention_mask`` 0) is a key padding mask in every layer: no position attends to
a padded one, so padded tokens never change the outputs at real positions.

Pretraining heads (``BertForPreTraining``):

    MLM:  logits = LayerNorm(gelu(W_t X_L + b_t)) E_word^T + b_v          (B, T, V)
    NSP:  logits = W_n pooled + b_n                                        (B, 2)

The MLM decoder is the word-embedding matrix itself (weight tying, Press & Wolf 2017): one
Parameter, trained by both uses. ``mask_tokens`` picks the MLM targets: 15% of the
non-special tokens, of which 80% become [MASK], 10% a random token, 10% stay unchanged
(notes §6.5, footnote 11); labels are -100 (ignored by the loss) everywhere else.

Fine-tuning heads take a ``Bert`` (e.g. ``copy.deepcopy(pretrained.bert)``):
``BertForSequenceClassification`` (a Linear on the pooled [CLS] vector),
``BertForTokenClassification`` (a Linear on every token) and ``BertForQuestionAnswering``
(start and end logits per token; ``best_span`` picks the best valid answer span).

Parameters are initialised as the original BERT: weights N(0, 0.02), biases 0, LayerNorm
weight 1 and bias 0, the padding row of the word embedding 0.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from .. import functional as F
from .._random import get_rng
from .._validation import check_array, check_scalar
from ..autograd import Tensor
from ..nn import init
from ..nn.attention import MultiheadAttention
from ..nn.layers import Dropout, Embedding, LayerNorm, Linear, _dtype
from ..nn.module import Module, Parameter
from ..nn.transformer import TransformerEncoder, TransformerEncoderLayer
from ._hub import PretrainedMixin
from .decoding import check_ids

__all__ = [
    "Bert",
    "BertEmbeddings",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "PreTrainingOutput",
    "ClassifierOutput",
    "QuestionAnsweringOutput",
    "mask_tokens",
    "best_span",
    "IGNORE_INDEX",
]

IGNORE_INDEX = -100  # label of the positions a loss ignores, as torch's cross_entropy
INIT_STD = 0.02


# ----- outputs -------------------------------------------------------------------------------
@dataclass
class PreTrainingOutput:
    """mlm_logits Tensor (B, T, V); nsp_logits Tensor (B, 2); loss scalar Tensor or None."""

    mlm_logits: Tensor
    nsp_logits: Tensor
    loss: Tensor | None = None


@dataclass
class ClassifierOutput:
    """logits Tensor (B, C) or (B, T, C); loss scalar Tensor or None."""

    logits: Tensor
    loss: Tensor | None = None


@dataclass
class QuestionAnsweringOutput:
    """start_logits, end_logits Tensors (B, T); loss scalar Tensor or None."""

    start_logits: Tensor
    end_logits: Tensor
    loss: Tensor | None = None


# ----- initialisation ------------------------------------------------------------------------
def _init_bert_weights(module: Module, std: float = INIT_STD) -> None:
    """BERT's initialisation on every sub-module: N(0, std) weights, zero biases."""
    for m in module.modules():
        if isinstance(m, Linear):
            init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                init.zeros_(m.bias)
        elif isinstance(m, Embedding):
            init.normal_(m.weight, 0.0, std)
            if m.padding_idx is not None:
                m.weight.data[m.padding_idx] = 0
        elif isinstance(m, MultiheadAttention):  # out_proj is a Linear, handled above
            for w in (m.in_proj_weight, m.q_proj_weight, m.k_proj_weight, m.v_proj_weight):
                if w is not None:
                    init.normal_(w, 0.0, std)
            if m.in_proj_bias is not None:
                init.zeros_(m.in_proj_bias)
        elif isinstance(m, LayerNorm) and m.weight is not None:
            init.ones_(m.weight)
            if m.bias is not None:
                init.zeros_(m.bias)


# ----- input checks --------------------------------------------------------------------------
def _check_attention_mask(attention_mask, shape) -> np.ndarray:
    """attention_mask (B, T) of 0/1 (or bool) -> key padding mask (B, T) bool, True = pad."""
    mask = check_array(attention_mask, name="attention_mask", ndim=2, allow_device=False)
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)} but input_ids has "
                         f"shape {tuple(shape)}")
    if mask.dtype != bool:
        if mask.dtype.kind not in "iuf" or not np.isin(mask, (0, 1)).all():
            raise ValueError("attention_mask must hold 1 (a real token) or 0 (padding), got "
                             f"values {np.unique(mask)[:5]} of dtype {mask.dtype}")
        mask = mask.astype(bool)
    empty = np.flatnonzero(~mask.any(axis=1))
    if empty.size:
        raise ValueError(f"attention_mask row {empty[0]} is all 0: every sequence needs at "
                         "least one real token (its [CLS])")
    return ~mask


def _check_labels(labels, name: str, shape, num_classes: int) -> np.ndarray:
    """Integer labels of ``shape`` in [0, num_classes) or IGNORE_INDEX."""
    labels = check_array(labels, name=name, allow_device=False)
    if labels.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer class indices, got dtype {labels.dtype}")
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(labels.shape)}; expected {tuple(shape)}")
    bad = (labels != IGNORE_INDEX) & ((labels < 0) | (labels >= num_classes))
    if bad.any():
        raise ValueError(f"{name} holds {labels[bad][0]}, outside [0, {num_classes}) and not "
                         f"the ignored label {IGNORE_INDEX}")
    return labels.astype(np.int64, copy=False)


def _masked_mean_ce(logits: Tensor, labels: np.ndarray) -> Tensor:
    """Mean cross-entropy over the rows whose label is not IGNORE_INDEX; 0 when none is.

    logits (N, C), labels (N,). torch's mean would be NaN for an all-ignored batch (a short
    batch can have no masked token); a zero keeps training finite and adds no gradient.
    """
    if not (labels != IGNORE_INDEX).any():
        return (logits * 0.0).sum()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)


# ----- the encoder ---------------------------------------------------------------------------
class BertEmbeddings(Module):
    """word + position + token type embeddings, LayerNorm, dropout: ids (B, T) -> (B, T, H)."""

    def __init__(self, vocab_size: int, hidden_size: int, max_position: int,
                 type_vocab_size: int, dropout: float, layer_norm_eps: float,
                 pad_token_id: int, dtype=None):
        super().__init__()
        self.word_embeddings = Embedding(vocab_size, hidden_size, padding_idx=pad_token_id,
                                         dtype=dtype)
        self.position_embeddings = Embedding(max_position, hidden_size, dtype=dtype)
        self.token_type_embeddings = Embedding(type_vocab_size, hidden_size, dtype=dtype)
        self.norm = LayerNorm(hidden_size, eps=layer_norm_eps, dtype=dtype)
        self.dropout = Dropout(dropout)

    def forward(self, input_ids: np.ndarray, token_type_ids: np.ndarray) -> Tensor:
        """input_ids, token_type_ids (B, T) int64, already checked -> (B, T, H)."""
        T = input_ids.shape[1]
        x = (self.word_embeddings(input_ids) + self.position_embeddings(np.arange(T))
             + self.token_type_embeddings(token_type_ids))  # (B, T, H) + (T, H) + (B, T, H)
        return self.dropout(self.norm(x))


class Bert(PretrainedMixin, Module):
    """The BERT encoder: embeddings, a post-norm GELU transformer encoder, the [CLS] pooler.

    Parameters
    ----------
    vocab_size : int
        V, the WordPiece vocabulary size.
    hidden_size : int
        H, the model width.
    num_layers : int
        L, encoder layers.
    num_heads : int
        Attention heads (hidden_size divisible by num_heads).
    intermediate_size : int
        Hidden width of each layer's feed-forward network (4 H in the paper).
    max_position : int
        Longest sequence (rows of the learned position table).
    type_vocab_size : int
        Segment ids (2: sentence A and sentence B).
    dropout : float
        On the embeddings, the attention probabilities and every residual branch.
    layer_norm_eps : float
    pad_token_id : int
        The [PAD] id (its embedding row starts at 0 and gets no gradient from the lookup).
    dtype : float32 (default) or float64

    Notes
    -----
    Submodules: ``embeddings`` (``word_embeddings``, ``position_embeddings``,
    ``token_type_embeddings``, ``norm``, ``dropout``), ``encoder``
    (``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer(activation='gelu',
    norm_first=False, batch_first=True)``), ``pooler`` (Linear H -> H, then tanh).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.models import Bert
    >>> bert = Bert(vocab_size=30, hidden_size=16, num_layers=2, num_heads=2,
    ...             intermediate_size=32, max_position=12)
    >>> ids = np.array([[2, 7, 8, 3, 0], [2, 9, 3, 10, 3]])          # [CLS] ... [SEP], 0 = pad
    >>> seq, pooled = bert(ids, attention_mask=(ids != 0).astype(int))
    >>> seq.shape, pooled.shape                                      # (B, T, H), (B, H)
    ((2, 5, 16), (2, 16))
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
                 intermediate_size: int, max_position: int, type_vocab_size: int = 2,
                 dropout: float = 0.1, layer_norm_eps: float = 1e-12, pad_token_id: int = 0,
                 dtype=None):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("hidden_size", hidden_size),
                            ("num_heads", num_heads), ("intermediate_size", intermediate_size),
                            ("max_position", max_position),
                            ("type_vocab_size", type_vocab_size)):
            check_scalar(value, name=name, kind=numbers.Integral, low=1)
        check_scalar(num_layers, name="num_layers", kind=numbers.Integral, low=0)
        check_scalar(pad_token_id, name="pad_token_id", kind=numbers.Integral, low=0,
                     high=vocab_size - 1)
        check_scalar(dropout, name="dropout", low=0.0, high=1.0, high_inclusive=False)
        if hidden_size % num_heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by num_heads="
                             f"{num_heads}: each head gets hidden_size // num_heads features")
        self.vocab_size, self.hidden_size = int(vocab_size), int(hidden_size)
        self.num_layers, self.num_heads = int(num_layers), int(num_heads)
        self.intermediate_size, self.max_position = int(intermediate_size), int(max_position)
        self.type_vocab_size, self.pad_token_id = int(type_vocab_size), int(pad_token_id)
        self.layer_norm_eps, self.dropout_p = float(layer_norm_eps), float(dropout)
        self.embeddings = BertEmbeddings(vocab_size, hidden_size, max_position,
                                         type_vocab_size, dropout, layer_norm_eps,
                                         pad_token_id, dtype)
        layer = TransformerEncoderLayer(hidden_size, num_heads, intermediate_size, dropout,
                                        activation="gelu", layer_norm_eps=layer_norm_eps,
                                        batch_first=True, norm_first=False, dtype=dtype)
        self.encoder = TransformerEncoder(layer, num_layers)
        self.pooler = Linear(hidden_size, hidden_size, dtype=dtype)
        _init_bert_weights(self)

    @property
    def dtype(self) -> np.dtype:
        return _dtype(self.pooler.weight.dtype)

    def check_inputs(self, input_ids, token_type_ids=None, attention_mask=None):
        """Validated (input_ids, token_type_ids, key_padding_mask or None).

        input_ids (B, T) int in [0, vocab_size) with 1 <= T <= max_position; token_type_ids
        (B, T) int in [0, type_vocab_size) (zeros when None); attention_mask (B, T) 1/0.
        """
        ids = check_ids(input_ids, "input_ids", self.vocab_size)
        B, T = ids.shape
        if B == 0 or T == 0:
            raise ValueError(f"input_ids has shape {ids.shape}; expected (B, T) with B, T >= 1")
        if T > self.max_position:
            raise ValueError(f"input_ids has T={T} tokens per sequence, longer than "
                             f"max_position={self.max_position}; truncate the sequences or "
                             "build the model with a larger max_position")
        if token_type_ids is None:
            types = np.zeros_like(ids)
        else:
            types = check_ids(token_type_ids, "token_type_ids", self.type_vocab_size, B)
            if types.shape != ids.shape:
                raise ValueError(f"token_type_ids has shape {types.shape} but input_ids has "
                                 f"shape {ids.shape}")
        padding = None if attention_mask is None else _check_attention_mask(attention_mask,
                                                                            ids.shape)
        if padding is not None and not padding.any():
            padding = None  # nothing to mask: the fused attention runs without a mask
        return ids, types, padding

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        """input_ids (B, T) int -> (sequence_output (B, T, H), pooled (B, H)).

        ``token_type_ids`` (B, T): 0 for sentence A, 1 for sentence B (zeros when None);
        ``attention_mask`` (B, T): 1 for real tokens, 0 for padding (all real when None).
        """
        ids, types, padding = self.check_inputs(input_ids, token_type_ids, attention_mask)
        x = self.embeddings(ids, types)  # (B, T, H)
        x = self.encoder(x, src_key_padding_mask=padding)  # (B, T, H)
        pooled = F.tanh(self.pooler(x[:, 0]))  # (B, H): the [CLS] position
        return x, pooled

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, hidden_size={self.hidden_size}, "
                f"num_layers={self.num_layers}, num_heads={self.num_heads}")


# ----- pretraining ---------------------------------------------------------------------------
class BertForPreTraining(PretrainedMixin, Module):
    """BERT with the masked-LM head (decoder tied to the word embedding) and the NSP head.

    Same arguments as ``Bert``. Submodules: ``bert``, ``mlm_dense`` (H -> H), ``mlm_norm``,
    ``nsp`` (H -> 2); parameter ``mlm_bias`` (V,). The MLM decoder weight is
    ``bert.embeddings.word_embeddings.weight`` (``decoder_weight``), not a copy.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.models import BertForPreTraining
    >>> model = BertForPreTraining(30, 16, 1, 2, 32, max_position=8)
    >>> ids = np.array([[2, 7, 8, 3, 9, 3]])
    >>> out = model(ids, mlm_labels=np.array([[-100, 7, -100, -100, -100, -100]]),
    ...             next_sentence_labels=np.array([1]))
    >>> out.mlm_logits.shape, out.nsp_logits.shape, out.loss.shape
    ((1, 6, 30), (1, 2), ())
    """

    def __init__(self, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int,
                 intermediate_size: int, max_position: int, type_vocab_size: int = 2,
                 dropout: float = 0.1, layer_norm_eps: float = 1e-12, pad_token_id: int = 0,
                 dtype=None):
        super().__init__()
        self.bert = Bert(vocab_size, hidden_size, num_layers, num_heads, intermediate_size,
                         max_position, type_vocab_size, dropout, layer_norm_eps, pad_token_id,
                         dtype)
        self.mlm_dense = Linear(hidden_size, hidden_size, dtype=dtype)
        self.mlm_norm = LayerNorm(hidden_size, eps=layer_norm_eps, dtype=dtype)
        self.mlm_bias = Parameter(np.zeros(vocab_size, dtype=_dtype(dtype)))
        self.nsp = Linear(hidden_size, 2, dtype=dtype)
        _init_bert_weights(self.mlm_dense)
        _init_bert_weights(self.nsp)

    @property
    def decoder_weight(self) -> Parameter:
        """The MLM decoder (V, H): the word-embedding Parameter itself (tied)."""
        return self.bert.embeddings.word_embeddings.weight

    def mlm_head(self, sequence_output) -> Tensor:
        """(..., H) -> MLM logits (..., V)."""
        h = self.mlm_norm(F.gelu(self.mlm_dense(sequence_output)))
        return F.linear(h, self.decoder_weight, self.mlm_bias)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, mlm_labels=None,
                next_sentence_labels=None, masked_only: bool = False) -> PreTrainingOutput:
        """Logits of both heads and, given labels, the summed loss.

        Parameters
        ----------
        input_ids, token_type_ids, attention_mask : (B, T), as ``Bert.forward``
        mlm_labels : (B, T) int, optional
            The original id at masked positions, -100 elsewhere (``mask_tokens``).
        next_sentence_labels : (B,) int in {0, 1}, optional
        masked_only : bool
            Run the MLM head only at the labelled positions, as the original BERT's
            pretraining does (it gathers ``masked_lm_positions`` first): ``mlm_logits`` is
            then (N, V) for the N labelled positions in row-major order, i.e. the rows of
            ``mlm_labels[mlm_labels != -100]``. Same loss and gradients, about 1/p times
            less work in the head. Needs ``mlm_labels``.

        Returns
        -------
        PreTrainingOutput
            mlm_logits (B, T, V) (or (N, V) with ``masked_only``), nsp_logits (B, 2),
            loss = mean MLM cross-entropy over the labelled positions + mean NSP
            cross-entropy (each term only when its labels are given; None when neither is).
        """
        if masked_only and mlm_labels is None:
            raise ValueError("masked_only=True needs mlm_labels (it keeps the labelled "
                             "positions only)")
        seq, pooled = self.bert(input_ids, token_type_ids, attention_mask)  # (B, T, H)
        nsp_logits = self.nsp(pooled)  # (B, 2)
        loss = None
        if mlm_labels is None:
            mlm_logits = self.mlm_head(seq)  # (B, T, V)
        else:
            labels = _check_labels(mlm_labels, "mlm_labels", seq.shape[:2],
                                   self.bert.vocab_size)
            if masked_only:
                rows = np.nonzero(labels != IGNORE_INDEX)
                mlm_logits = self.mlm_head(seq[rows])  # (N, V)
                loss = _masked_mean_ce(mlm_logits, labels[rows])
            else:
                mlm_logits = self.mlm_head(seq)  # (B, T, V)
                loss = _masked_mean_ce(mlm_logits.reshape(-1, mlm_logits.shape[-1]),
                                       labels.reshape(-1))
        if next_sentence_labels is not None:
            labels = _check_labels(next_sentence_labels, "next_sentence_labels",
                                   (seq.shape[0],), 2)
            nsp_loss = _masked_mean_ce(nsp_logits, labels)
            loss = nsp_loss if loss is None else loss + nsp_loss
        return PreTrainingOutput(mlm_logits, nsp_logits, loss)


def mask_tokens(ids, mask_id: int, vocab_size: int, special_ids=(), p: float = 0.15,
                rng=None):
    """BERT's masked-LM corruption: choose targets, replace 80/10/10.

    Each token whose id is not in ``special_ids`` is chosen independently with probability
    ``p``. A chosen token becomes ``mask_id`` with probability 0.8, a random non-special id
    (uniform over [0, vocab_size) minus ``special_ids``) with probability 0.1, and stays
    unchanged with probability 0.1. Its label is the original id; every other label is -100.

    Parameters
    ----------
    ids : int array (..., T), e.g. (B, T)
    mask_id : int
        The [MASK] id.
    vocab_size : int
    special_ids : iterable of int
        Never chosen ([PAD], [CLS], [SEP], [MASK], ...) and never drawn as random tokens.
    p : float in [0, 1]
    rng : numpy Generator, int seed or None (nnkit's global generator)

    Returns
    -------
    masked_ids : int64 array, shape of ``ids``
    labels : int64 array, shape of ``ids``: the original id where chosen, -100 elsewhere

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.models import mask_tokens
    >>> ids = np.array([[2, 5, 6, 7, 3, 0]])
    >>> masked, labels = mask_tokens(ids, mask_id=4, vocab_size=10, special_ids=(0, 2, 3, 4),
    ...                              p=0.5, rng=0)
    >>> bool(((labels == -100) | (labels == ids)).all())
    True
    """
    check_scalar(vocab_size, name="vocab_size", kind=numbers.Integral, low=1)
    check_scalar(mask_id, name="mask_id", kind=numbers.Integral, low=0, high=vocab_size - 1)
    check_scalar(p, name="p", low=0.0, high=1.0)
    ids = check_ids(ids, "ids", vocab_size, ndim=None)
    special = np.unique(np.asarray(list(special_ids), dtype=np.int64))
    if special.size and (special.min() < 0 or special.max() >= vocab_size):
        raise ValueError(f"special_ids must lie in [0, {vocab_size}), got {special.tolist()}")
    ordinary = np.setdiff1d(np.arange(vocab_size), special)  # ids a random token may take
    if ordinary.size == 0:
        raise ValueError(f"special_ids {special.tolist()} cover the whole vocabulary: no id "
                         "is left to choose or to draw as a random token")
    rng = get_rng(rng)
    chosen = (rng.random(ids.shape) < p) & ~np.isin(ids, special)
    action = rng.random(ids.shape)  # < 0.8: [MASK]; < 0.9: random; else unchanged
    random_ids = ordinary[rng.integers(0, ordinary.size, ids.shape)]
    masked = np.where(chosen & (action < 0.8), mask_id, ids)
    masked = np.where(chosen & (action >= 0.8) & (action < 0.9), random_ids, masked)
    labels = np.where(chosen, ids, IGNORE_INDEX)
    return masked.astype(np.int64), labels.astype(np.int64)


# ----- fine-tuning heads ---------------------------------------------------------------------
def _check_bert(bert) -> Bert:
    if not isinstance(bert, Bert):
        raise TypeError(f"bert must be an nnkit.models.Bert (e.g. pretrained.bert), got "
                        f"{type(bert).__name__}")
    return bert


def _head(bert: Bert, out_features: int, name: str) -> Linear:
    check_scalar(out_features, name=name, kind=numbers.Integral, low=1)
    layer = Linear(bert.hidden_size, out_features, dtype=bert.dtype)
    _init_bert_weights(layer)
    return layer


def _dropout_p(bert: Bert, classifier_dropout):
    return bert.dropout_p if classifier_dropout is None else classifier_dropout


class _BertClassifier(PretrainedMixin, Module):
    """The encoder, dropout and a Linear classifier: the two classification heads' body."""

    def __init__(self, bert: Bert, num_labels: int, classifier_dropout: float | None = None):
        super().__init__()
        self.bert = _check_bert(bert)
        self.num_labels = int(num_labels)
        self.dropout = Dropout(_dropout_p(bert, classifier_dropout))
        self.classifier = _head(bert, num_labels, "num_labels")

    def _classify(self, features, labels, label_shape) -> ClassifierOutput:
        """Logits of ``features`` (..., H); the mean cross-entropy over the labelled places
        when ``labels`` of ``label_shape`` is given."""
        logits = self.classifier(self.dropout(features))
        loss = None
        if labels is not None:
            labels = _check_labels(labels, "labels", label_shape, self.num_labels)
            loss = _masked_mean_ce(logits.reshape(-1, self.num_labels), labels.reshape(-1))
        return ClassifierOutput(logits, loss)


class BertForSequenceClassification(_BertClassifier):
    """A Linear classifier on the pooled [CLS] vector: logits (B, num_labels).

    Parameters
    ----------
    bert : Bert
        The encoder (shared, not copied: pass ``copy.deepcopy(pretrained.bert)`` to keep
        the pretrained model unchanged).
    num_labels : int
    classifier_dropout : float, optional
        Dropout on the pooled vector (the encoder's dropout when None).

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.models import Bert, BertForSequenceClassification
    >>> model = BertForSequenceClassification(Bert(30, 16, 1, 2, 32, 8), num_labels=3)
    >>> model(np.array([[2, 7, 3], [2, 9, 3]]), labels=np.array([0, 2])).logits.shape
    (2, 3)
    """

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                labels=None) -> ClassifierOutput:
        """logits (B, num_labels); loss = mean cross-entropy when ``labels`` (B,) is given."""
        _, pooled = self.bert(input_ids, token_type_ids, attention_mask)
        return self._classify(pooled, labels, pooled.shape[:1])


class BertForTokenClassification(_BertClassifier):
    """A Linear classifier on every token: logits (B, T, num_labels).

    Same arguments as ``BertForSequenceClassification``. Labels (B, T) use -100 for the
    positions that carry no label (specials, padding, WordPiece continuations).
    """

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                labels=None) -> ClassifierOutput:
        """logits (B, T, num_labels); loss = mean cross-entropy over labelled tokens."""
        seq, _ = self.bert(input_ids, token_type_ids, attention_mask)
        return self._classify(seq, labels, seq.shape[:2])


class BertForQuestionAnswering(PretrainedMixin, Module):
    """Span extraction: start and end logits per token, from one Linear H -> 2.

    Parameters
    ----------
    bert : Bert
        The encoder (shared, not copied).

    The loss, given ``start_positions`` and ``end_positions`` (B,), is the mean of the two
    cross-entropies over the T positions (Devlin et al.); ``best_span`` decodes.
    """

    def __init__(self, bert: Bert):
        super().__init__()
        self.bert = _check_bert(bert)
        self.qa_outputs = _head(bert, 2, "out_features")

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                start_positions=None, end_positions=None) -> QuestionAnsweringOutput:
        """start_logits, end_logits (B, T); loss when both position arrays (B,) are given."""
        seq, _ = self.bert(input_ids, token_type_ids, attention_mask)
        logits = self.qa_outputs(seq)  # (B, T, 2)
        start, end = logits[..., 0], logits[..., 1]  # (B, T) each
        loss = None
        if (start_positions is None) != (end_positions is None):
            raise ValueError("give both start_positions and end_positions, or neither")
        if start_positions is not None:
            B, T = start.shape
            s = _check_labels(start_positions, "start_positions", (B,), T)
            e = _check_labels(end_positions, "end_positions", (B,), T)
            loss = (_masked_mean_ce(start, s) + _masked_mean_ce(end, e)) * 0.5
        return QuestionAnsweringOutput(start, end, loss)

    @staticmethod
    def best_span(start_logits, end_logits, max_answer_len: int = 30, context_mask=None):
        """``nnkit.models.best_span``."""
        return best_span(start_logits, end_logits, max_answer_len, context_mask)


def best_span(start_logits, end_logits, max_answer_len: int = 30, context_mask=None):
    """The answer span maximising start_logits[s] + end_logits[e] over the valid spans.

    A span (s, e) is valid when s <= e < s + max_answer_len and both ends lie in the
    context (``context_mask`` True; every position when None).

    Parameters
    ----------
    start_logits, end_logits : Tensor or array (B, T)
    max_answer_len : int >= 1
        Longest answer, in tokens.
    context_mask : bool array (B, T), optional
        True at the context's tokens (e.g. segment 1, not [SEP], not padding).

    Returns
    -------
    start, end : int64 arrays (B,), inclusive token indices

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.models import best_span
    >>> s = np.array([[0.0, 5.0, 1.0, 0.0]]); e = np.array([[9.0, 0.0, 1.0, 2.0]])
    >>> best_span(s, e, max_answer_len=2)   # (1, 0) would score 14 but ends before it starts
    (array([0]), array([0]))
    """
    check_scalar(max_answer_len, name="max_answer_len", kind=numbers.Integral, low=1)
    s = check_array(getattr(start_logits, "data", start_logits), name="start_logits", ndim=2,
                    allow_device=False).astype(np.float64)
    e = check_array(getattr(end_logits, "data", end_logits), name="end_logits", ndim=2,
                    allow_device=False).astype(np.float64)
    if s.shape != e.shape:
        raise ValueError(f"start_logits {s.shape} and end_logits {e.shape} must have the "
                         "same shape (B, T)")
    B, T = s.shape
    pos = np.arange(T)
    length = pos[None, :] - pos[:, None]  # (T, T): e - s for start s (rows), end e (columns)
    valid = np.broadcast_to((length >= 0) & (length < max_answer_len), (B, T, T))
    if context_mask is not None:
        ctx = check_array(context_mask, name="context_mask", ndim=2, allow_device=False)
        if ctx.shape != s.shape:
            raise ValueError(f"context_mask has shape {ctx.shape}; expected {s.shape}")
        ctx = ctx.astype(bool)
        valid = valid & ctx[:, :, None] & ctx[:, None, :]  # (B, T, T)
    no_span = np.flatnonzero(~valid.reshape(B, -1).any(axis=1))
    if no_span.size:
        raise ValueError(f"row {no_span[0]} has no valid span: its context_mask selects no "
                         "token")
    scores = np.where(valid, s[:, :, None] + e[:, None, :], -np.inf)  # (B, T, T)
    flat = scores.reshape(B, -1).argmax(axis=1)
    return flat // T, flat % T
