"""Small datasets that ship with nnkit or its dependencies (no downloads).

One module per kind: ``digits`` (scikit-learn's bundled 8x8 handwritten digits),
``sequences`` (the adding problem and the copy task), ``text`` (the shipped corpus and its
BERT tasks) and ``translation`` (number words to digits).
"""

from __future__ import annotations

from .digits import (
    Split,
    load_digits,
)
from .sequences import (
    ADDING_BASELINE_MSE,
    adding_problem,
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

__all__ = [
    "Split",
    "load_digits",
    "adding_problem",
    "copy_task",
    "ADDING_BASELINE_MSE",
    "copy_task_baseline",
    "CORPUS_FILE",
    "CORPUS_SOURCE",
    "DOCUMENT_FILES",
    "DOCUMENT_SOURCES",
    "POSITIVE_WORDS",
    "NEGATIVE_WORDS",
    "TAG_NAMES",
    "TextSplit",
    "TextTask",
    "strip_gutenberg_boilerplate",
    "split_sentences",
    "load_corpus",
    "play_sentences",
    "verse_sentences",
    "load_documents",
    "corpus_tokenizer",
    "next_sentence_task",
    "sentence_order_task",
    "sentiment_label",
    "sentiment_task",
    "word_tag",
    "tagging_task",
    "span_task",
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "Vocabulary",
    "TranslationTask",
    "number_to_words",
    "strip_specials",
    "number_translation",
    "exact_match",
]
