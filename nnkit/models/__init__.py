"""Complete models built from ``nk.nn`` layers (``nk.models``).

``Seq2Seq`` (RNN encoder-decoder with Bahdanau attention) and ``TransformerTranslator``
(Vaswani et al. 2017) share the decoding functions ``greedy_decode`` and ``beam_search``,
which work over any model with ``encode``, ``decode_step`` and ``reorder_cache``
(``nnkit.models.decoding``).
"""

from .decoding import beam_search, greedy_decode, length_penalty, sequence_log_prob
from .seq2seq import Seq2Seq
from .translator import TransformerTranslator

__all__ = [
    "Seq2Seq",
    "TransformerTranslator",
    "greedy_decode",
    "beam_search",
    "sequence_log_prob",
    "length_penalty",
]
