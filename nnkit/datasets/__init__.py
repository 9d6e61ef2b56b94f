"""Small datasets that ship with nnkit or its dependencies (no downloads).

One module per kind: ``digits`` (scikit-learn's bundled 8x8 handwritten digits),
``sequences`` (the adding problem, the copy task and associative recall), ``text`` (the shipped
corpus and its BERT tasks) and ``translation`` (number words to digits).
"""

from __future__ import annotations

from . import digits, sequences, text, translation
from .digits import (
    Split,
    load_digits,
)
from .sequences import (
    ADDING_BASELINE_MSE,
    IGNORE_INDEX,
    adding_problem,
    associative_recall,
    copy_task,
    copy_task_baseline,
)
from .text import (
    CORPUS_FILE,
    CORPUS_SOURCE,
    DOCUMENT_FILES,
    DOCUMENT_SOURCES,
    NEGATIVE_WORDS,
    POSITIVE_WORDS,
    TAG_NAMES,
    TextSplit,
    TextTask,
    corpus_tokenizer,
    load_corpus,
    load_documents,
    next_sentence_task,
    play_sentences,
    sentence_order_task,
    sentiment_label,
    sentiment_task,
    span_task,
    split_sentences,
    strip_gutenberg_boilerplate,
    tagging_task,
    verse_sentences,
    word_tag,
)
from .translation import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    TranslationTask,
    Vocabulary,
    exact_match,
    number_to_words,
    number_translation,
    strip_specials,
)

__all__ = [*digits.__all__, *sequences.__all__, *text.__all__, *translation.__all__]
