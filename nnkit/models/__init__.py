"""Complete models built from ``nk.nn`` layers (``nk.models``).

``Bert`` with its pretraining and fine-tuning heads (Devlin et al. 2018) and ``ViT``
(Dosovitskiy et al. 2020) build on ``nn.TransformerEncoderLayer``; ``MambaModel`` and
``MambaForCausalLM`` (Gu and Dao 2023) on ``nn.Mamba``. ``Seq2Seq`` (RNN
encoder-decoder with Bahdanau attention) and ``TransformerTranslator`` (Vaswani et al. 2017)
share the decoding functions ``greedy_decode`` and ``beam_search``,
which work over any model with ``encode``, ``decode_step`` and ``reorder_cache``
(``nnkit.models.decoding``).
"""

from .bert import (
    Bert,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    best_span,
    mask_tokens,
)
from .decoding import beam_search, greedy_decode, length_penalty, sequence_log_prob
from .mamba import MambaConfig, MambaForCausalLM, MambaModel
from .preprocess import ViTImageProcessor, vit_preprocess
from .sentence import SentenceEncoder
from .seq2seq import Seq2Seq
from .translator import TransformerTranslator
from .vit import ViT, patchify

__all__ = [
    "Seq2Seq",
    "TransformerTranslator",
    "greedy_decode",
    "beam_search",
    "sequence_log_prob",
    "length_penalty",
    "Bert",
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertForQuestionAnswering",
    "mask_tokens",
    "best_span",
    "ViT",
    "patchify",
    "vit_preprocess",
    "ViTImageProcessor",
    "SentenceEncoder",
    "MambaConfig",
    "MambaModel",
    "MambaForCausalLM",
]
