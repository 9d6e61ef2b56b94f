"""A small real corpus that ships with nnkit, and seeded BERT tasks built from it.

Three public-domain books ship in ``nnkit/data`` (see its ``README.md`` for where each file
was taken from and its checksum), all from the Canterbury compression corpus:

* Lewis Carroll's *Alice's Adventures in Wonderland* (1865), Project Gutenberg's
  "Millennium Fulcrum Edition 2.9" (etext #11, ``alice29.txt``). :func:`load_corpus`
  cleans it into 1,303 sentences; the fine-tuning tasks below are built from it.
* Shakespeare's *As You Like It* (``asyoulik.txt``), cleaned by :func:`play_sentences`.
* Milton's *Paradise Lost* (``plrabn12.txt``), cleaned by :func:`verse_sentences`.

:func:`load_documents` gives the three as pretraining documents of equal size;
:func:`corpus_tokenizer` is trained on them and :func:`next_sentence_task` (the masked-LM
and NSP pretraining pairs) is built from them.

Tasks (each split into train/test by blocks of consecutive sentences, so no sentence of the
test split appears, even as a duplicate text, in the train split):

* :func:`next_sentence_task` -- NSP pairs as in BERT: b is the true next sentence of a's
  document (label 0) or a random sentence of the same split from a different document
  (label 1); half of each document's pairs are negatives.
* :func:`sentence_order_task` -- two consecutive sentences of Alice in order (0) or
  swapped (1).
* :func:`sentiment_task` -- a sentence is labelled positive (1) or negative (0) when it has
  more words from :data:`POSITIVE_WORDS` than :data:`NEGATIVE_WORDS` or the reverse;
  sentences with a tie are left out, and the classes are balanced by seeded subsampling.
* :func:`tagging_task` -- part-of-speech-like tags (:data:`TAG_NAMES`) from word lists and
  suffix rules; one label on the first WordPiece of each word, -100 on ``##`` pieces,
  special tokens and padding.
* :func:`span_task` -- extractive QA: the question is a sentence with a name replaced by
  "who", the context that sentence plus the next; labels are the (start, end) token
  positions of the name in the context.

All tasks return a :class:`TextTask` of fixed-length (n, T) int64 arrays ready for a BERT.
"""

from __future__ import annotations

import functools
import numbers
import re
from dataclasses import dataclass
from importlib import resources

import numpy as np

from .._random import get_rng
from .._validation import check_bool, check_scalar
from ..text import IGNORE_INDEX, WordPieceTokenizer, basic_tokenize

__all__ = [
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
]

CORPUS_FILE = "alice29.txt"
CORPUS_SOURCE = (
    "Lewis Carroll, Alice's Adventures in Wonderland (1865), Project Gutenberg etext #11, "
    "Millennium Fulcrum Edition 2.9 (alice29.txt, as in the Canterbury corpus); public domain"
)

# Words that occur at least twice in the corpus, so that a model can meet each of them in
# training and in testing.
POSITIVE_WORDS = frozenset(
    "good please glad best eagerly bright pleased kind politely nice interesting grin thank "
    "prizes honour hope grinned grand friend eager delight wonderful smiled smile safe proud "
    "pleasure nicely lovely love laughing laughed gently friends fine delightful delighted "
    "beautiful agree".split()
)
NEGATIVE_WORDS = frozenset(
    "poor cried hastily anxiously mad afraid tears offended timidly shouted puzzled angrily "
    "tired nonsense frightened trembling melancholy executed dreadfully wrong stupid sleepy "
    "sighed shriek sadly nervous impatiently angry uncomfortable sobs sigh sharply screamed "
    "savage dead confused worse sulky sobbing severely sad hurt hoarse execution cry cross "
    "beheaded wretched unhappy ugly sulkily sorrow scream rude miserable hate fright "
    "dreadful crying bad alarm".split()
)

TAG_NAMES = ("O", "PUNCT", "DET", "PRON", "PREP", "CONJ", "NAME", "ADV", "ING", "ED")
_CLOSED_CLASSES = {
    "DET": "the a an this that these those every each some any no".split(),
    "PRON": ("i me my mine you your yours he him his she her hers it its we us our they "
             "them their myself herself himself itself yourself themselves").split(),
    "PREP": ("of in on at to for with by from into upon about over under through after "
             "before down up out off near").split(),
    "CONJ": "and or but nor if because though although than".split(),
}
_WORD_CLASS = {w: tag for tag, words in _CLOSED_CLASSES.items() for w in words}
_ABBREVIATIONS = ("Mr", "Mrs", "Dr", "St", "Ms")


@dataclass(frozen=True, eq=False)
class TextSplit:
    """One split of a task.

    Attributes
    ----------
    input_ids, token_type_ids, attention_mask : ndarray (n, T) int64
        As :meth:`WordPieceTokenizer.encode` with ``padding='max_length'``.
    labels : ndarray int64
        (n,) for classification, (n, T) for tagging (-100 where not scored), (n, 2) start
        and end token positions (inclusive) for span extraction.
    texts : tuple of tuple of str
        The raw text of each example: ``(a,)`` or ``(a, b)``.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    labels: np.ndarray
    texts: tuple

    def __len__(self) -> int:
        return len(self.labels)


@dataclass(frozen=True, eq=False)
class TextTask:
    """A task: its name, train and test :class:`TextSplit`, and the label names."""

    name: str
    train: TextSplit
    test: TextSplit
    label_names: tuple

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


# ----------------------------------------------------------------------------------------
# The corpus
# ----------------------------------------------------------------------------------------
_START_MARKERS = (re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M),
                  re.compile(r"^\*END\*THE SMALL PRINT.*$", re.M))
_END_MARKERS = (re.compile(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", re.M),
                re.compile(r"^End of (the )?Project Gutenberg.*$", re.M | re.I))


def strip_gutenberg_boilerplate(text: str) -> str:
    """The text between Project Gutenberg's start and end markers (all of it when absent).

    Handles the modern ``*** START OF THE PROJECT GUTENBERG EBOOK ... ***`` /
    ``*** END OF ...`` lines and the older ``*END*THE SMALL PRINT!`` header and
    ``End of Project Gutenberg's ...`` footer.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = text.replace("\r\n", "\n")
    for marker in _START_MARKERS:
        m = marker.search(text)
        if m:
            text = text[m.end():]
            break
    for marker in _END_MARKERS:
        m = marker.search(text)
        if m:
            text = text[:m.start()]
            break
    return text


def _prose_paragraphs(text: str) -> list[tuple[int, str]]:
    """(chapter, paragraph) of running prose, chapters counted from 0: chapter headings and
    titles, verse (every line indented four or more spaces), the title block and lines
    without lowercase letters left out."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    kept, skip_next, chapter = [], False, -1
    for p in paragraphs:
        lines = [ln for ln in p.split("\n") if ln.strip()]
        if re.fullmatch(r"\s*CHAPTER [IVXLC]+\.?\s*", lines[0]):
            chapter, skip_next = chapter + 1, True  # the chapter's title follows
            continue
        if skip_next or chapter < 0:
            skip_next = False
            continue
        if all(re.match(r" {4,}", ln) for ln in lines) or not re.search(r"[a-z]", p):
            continue
        kept.append((chapter, _join_lines(ln.strip() for ln in lines)))
    return kept


def _join_lines(lines) -> str:
    """Join with spaces, but glue a word hyphenated across a line break ("waistcoat-" /
    "pocket" -> "waistcoat-pocket")."""
    out = ""
    for line in lines:
        if re.search(r"[A-Za-z]-$", out[-2:]):  # the tail only: linear time
            out += line
        else:
            out = f"{out} {line}" if out else line
    return out


def _normalise_prose(paragraph: str) -> str:
    paragraph = paragraph.replace("`", "'")
    paragraph = re.sub(r"_(\w[^_]*?)_", r"\1", paragraph)  # _I_ (emphasis) -> I
    paragraph = paragraph.replace("--", " -- ")
    return re.sub(r"\s+", " ", paragraph).strip()


_SENTENCE_END = re.compile(r"(?<=[.!?])['\")\]]*\s+(?=['\"(]?[A-Z])")


def split_sentences(paragraph: str, min_words: int = 3) -> list[str]:
    """Split a paragraph after ``.``, ``!`` or ``?`` (and closing quotes) when a capital
    letter follows; not after Mr., Mrs., Dr., St.; sentences with fewer than ``min_words``
    words that contain a letter are dropped.

    >>> split_sentences("'Oh dear! Oh dear! I shall be late!' said Mr. Rabbit. Yes.", 2)
    ["'Oh dear!", 'Oh dear!', "I shall be late!' said Mr. Rabbit."]
    """
    pieces, start = [], 0
    for m in _SENTENCE_END.finditer(paragraph):
        before = paragraph[start:m.start()]
        if re.search(r"\b(" + "|".join(_ABBREVIATIONS) + r")\.$", before.rstrip("'\")]")):
            continue
        pieces.append(paragraph[start:m.end()].strip())
        start = m.end()
    pieces.append(paragraph[start:].strip())
    return [s for s in pieces
            if sum(bool(re.search(r"[A-Za-z]", w)) for w in s.split()) >= min_words]


@functools.lru_cache(maxsize=1)
def _corpus_with_chapters() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The sentences and, for each, its chapter (0..11)."""
    raw = resources.files("nnkit").joinpath("data", CORPUS_FILE).read_text(encoding="ascii")
    text = strip_gutenberg_boilerplate(raw)
    pairs = [(c, s) for c, p in _prose_paragraphs(text)
             for s in split_sentences(_normalise_prose(p))]
    return tuple(s for _, s in pairs), tuple(c for c, _ in pairs)


def _corpus_sentences() -> tuple[str, ...]:
    return _corpus_with_chapters()[0]


def load_corpus(return_chapters: bool = False):
    """The shipped corpus as a list of sentences, in book order (deterministic).

    With ``return_chapters``, also a list of the chapter (0..11) of each sentence.

    Source: :data:`CORPUS_SOURCE` (details in ``nnkit/data/README.md``). Cleaning: Project
    Gutenberg boilerplate, the title block, chapter headings and titles and verse removed;
    line breaks joined; ````quote'`` marks made ``'quote'``, ``_emphasis_`` underscores
    dropped; split by :func:`split_sentences`.
    """
    check_bool(return_chapters, name="return_chapters")
    sentences, chapters = _corpus_with_chapters()
    return (list(sentences), list(chapters)) if return_chapters else list(sentences)


# ----------------------------------------------------------------------------------------
# The pretraining documents: Alice, a play and an epic poem
# ----------------------------------------------------------------------------------------
_PLAY_HEADING = re.compile(r"^(ACT|SCENE)\b|^\s*[A-Z][A-Z .]+$")  # ACT II, SCENE I, SONG.
_PLAY_SPEAKER = re.compile(r"^[A-Z][A-Za-z]*(?: [A-Za-z]+)*\t")  # "DUKE SENIOR<tab>"
_STAGE_DIRECTION = re.compile(r"\[[^\]]*\]")
_VERSE_BOOK = re.compile(r"^Book [IVXL]+[ \t]*$", re.M)


def _play_speeches(lines) -> list[str]:
    """The speeches of a play, one string each: a speech starts at its speaker's tag and
    runs, over blank lines and stage directions, to the next tag or heading."""
    speeches, current = [], []
    for line in lines:
        heading = _PLAY_HEADING.match(line)
        tag = None if heading else _PLAY_SPEAKER.match(line)
        if heading or tag:
            speeches.append(current)
            current = []
            if heading:
                continue
            line = line[tag.end():]
        if line.strip():
            current.append(line.strip())
    speeches.append(current)
    joined = (_STAGE_DIRECTION.sub(" ", _join_lines(speech)) for speech in speeches)
    return [s for s in joined if re.search(r"[a-z]", s)]


def play_sentences(text: str) -> list[str]:
    """The spoken sentences of a play laid out as ``asyoulik.txt`` (Shakespeare's *As You
    Like It* in the Canterbury corpus), in order.

    Layout: a speech starts with the speaker's name and a tab (``ROSALIND<tab>...``),
    further lines start with a tab; headings are ``ACT I``, ``SCENE II<tab>place`` and
    all-capital lines (the running title, ``SONG.``, ``EPILOGUE``); stage directions are in
    square brackets (``[Exit DENNIS]``, also inside a speech and over line breaks).

    Cleaning: everything before the first ``ACT I`` (title, cast list) dropped; headings,
    speaker names and stage directions dropped; each speech's lines joined (a speech goes on
    after a stage direction until the next speaker) and split by :func:`split_sentences`,
    so no sentence spans two speakers. Songs stay, as part of the singer's speech.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = text.replace("\r\n", "\n")
    start = re.search(r"^ACT I\s*$", text, re.M)
    if start is None:
        raise ValueError("text has no 'ACT I' line: not a play in the asyoulik.txt layout")
    speeches = _play_speeches(text[start.end():].split("\n"))
    return [s for speech in speeches for s in split_sentences(_normalise_prose(speech))]


def verse_sentences(text: str, return_books: bool = False):
    """The sentences of a long poem laid out as ``plrabn12.txt`` (Milton's *Paradise Lost*,
    Project Gutenberg's 1992 release, in the Canterbury corpus), in order.

    Layout: an introduction, then books headed ``Book I`` .. ``Book XII`` of one verse line
    per text line, a verse paragraph starting with an indented line; ``[The End]`` last.

    Cleaning: the introduction, the book headings and ``[The End]`` (and anything after
    it) dropped; the lines of each verse paragraph joined and split by
    :func:`split_sentences`. With ``return_books``, also the book (0..11) of each sentence.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = text.replace("\r\n", "\n").split("[The End]")[0]
    books = _VERSE_BOOK.split(text)[1:]  # [0] is the introduction
    if not books:
        raise ValueError("text has no 'Book I' line: not a poem in the plrabn12.txt layout")
    sentences, book_of = [], []
    for book, body in enumerate(books):
        for paragraph in re.split(r"\n(?=[ \t]+\S)|\n[ \t]*\n", body):
            lines = [ln.strip() for ln in paragraph.split("\n") if ln.strip()]
            found = split_sentences(_normalise_prose(_join_lines(lines))) if lines else []
            sentences += found
            book_of += [book] * len(found)
    return (sentences, book_of) if return_books else sentences


DOCUMENT_FILES = ("alice29.txt", "asyoulik.txt", "plrabn12.txt")
DOCUMENT_SOURCES = (
    CORPUS_SOURCE,
    "William Shakespeare, As You Like It (c. 1599; First Folio 1623), plain-text edition "
    "kept in the Canterbury corpus (asyoulik.txt); public domain",
    "John Milton, Paradise Lost (1667/1674), Project Gutenberg's February 1992 release "
    "(plrabn12.txt, as in the Canterbury corpus); public domain",
)


def _read_data(name: str) -> str:
    return resources.files("nnkit").joinpath("data", name).read_text(encoding="ascii")


@functools.lru_cache(maxsize=1)
def _full_documents() -> tuple[tuple[str, ...], ...]:
    """Every cleaned sentence of each of :data:`DOCUMENT_FILES`, in order."""
    return (_corpus_sentences(), tuple(play_sentences(_read_data(DOCUMENT_FILES[1]))),
            tuple(verse_sentences(_read_data(DOCUMENT_FILES[2]))))


def _even_runs(n: int, size: int, run: int = 10) -> list[int]:
    """Indices of about ``size`` of ``n`` sentences: runs of ``run`` consecutive sentences
    spread evenly over the whole document (all ``n`` when ``size >= n``)."""
    if size >= n:
        return list(range(n))
    k = -(-size // run)  # number of runs
    starts = [(n - run) * j // max(k - 1, 1) for j in range(k)]
    return sorted({i for s in starts for i in range(s, s + run)})[:size]


@functools.lru_cache(maxsize=4)
def _documents(sentences_per_document: int | None) -> tuple[tuple[str, ...], ...]:
    full = _full_documents()
    size = min(map(len, full)) if sentences_per_document is None else sentences_per_document
    return tuple(tuple(doc[i] for i in _even_runs(len(doc), size)) for doc in full)


def load_documents(sentences_per_document: int | None = None) -> list[list[str]]:
    """The pretraining corpus: one list of sentences per document of
    :data:`DOCUMENT_FILES` (Alice as :func:`load_corpus`, the play by
    :func:`play_sentences`, the poem by :func:`verse_sentences`), deterministic.

    Documents are cut to the same size, ``sentences_per_document`` (default: the smallest
    document's, the play's 1,226 sentences), by keeping runs of 10 consecutive sentences
    spread evenly over the whole work. Equal sizes keep next-sentence prediction honest:
    when every document gives as many first segments, the random second segments of
    negatives are spread over the documents like the true next ones, so the document of b
    alone says nothing about the label -- only whether a and b share a document does.
    Unequal sizes would let a model guess "is next" from b being in the big document.
    """
    if sentences_per_document is not None:
        check_scalar(sentences_per_document, name="sentences_per_document",
                     kind=numbers.Integral, low=20)
        sentences_per_document = int(sentences_per_document)
    return [list(doc) for doc in _documents(sentences_per_document)]


@functools.lru_cache(maxsize=8)
def _corpus_vocab(vocab_size: int, min_frequency: int) -> tuple[str, ...]:
    texts = [s for doc in _documents(None) for s in doc]
    tok = WordPieceTokenizer.train(texts, vocab_size=vocab_size, min_frequency=min_frequency)
    return tuple(tok.itos)


def corpus_tokenizer(vocab_size: int = 2000, min_frequency: int = 2) -> WordPieceTokenizer:
    """A lowercasing WordPiece tokenizer trained on the pretraining text,
    :func:`load_documents` (Alice, the play and the poem, equal shares), with
    ``criterion='frequency'`` (a few seconds the first time; the vocabulary is cached).

    >>> tok = corpus_tokenizer()
    >>> tok.vocab_size, tok.tokenize("The Mock Turtle sighed deeply.")
    (2000, ['the', 'mock', 'turtle', 'sigh', '##ed', 'deep', '##ly', '.'])
    """
    check_scalar(vocab_size, name="vocab_size", kind=numbers.Integral, low=1)
    check_scalar(min_frequency, name="min_frequency", kind=numbers.Integral, low=1)
    return WordPieceTokenizer(list(_corpus_vocab(int(vocab_size), int(min_frequency))))


# ----------------------------------------------------------------------------------------
# Splits and encoding
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Blocks:
    """Sentence indices of each split, as runs of consecutive sentences (blocks)."""

    train: list
    test: list


def _split_blocks(sentences, test_size: float, rng, block_size: int = 10) -> _Blocks:
    """Seeded split of consecutive-sentence blocks; test sentences whose text also occurs
    in train are removed from the test blocks (so splits are disjoint as texts too)."""
    n = len(sentences)
    starts = list(range(0, n, block_size))
    order = rng.permutation(len(starts))
    n_test = max(1, int(round(test_size * len(starts))))
    test_ids = set(order[:n_test].tolist())
    train, test = [], []
    for b, s in enumerate(starts):
        (test if b in test_ids else train).append(list(range(s, min(s + block_size, n))))
    train_texts = {sentences[i] for block in train for i in block}
    test = [[i for i in block if sentences[i] not in train_texts] for block in test]
    return _Blocks(train, [block for block in test if block])


def _split_document_blocks(documents, test_size: float, rng, block_size: int = 10):
    """:func:`_split_blocks` of each document (so each holds out the same share), the
    sentences numbered through all documents; test texts that occur in the train split of
    any document are removed. Returns (sentences, document of each, _Blocks)."""
    sentences, doc_of, train, test = [], [], [], []
    for d, doc in enumerate(documents):
        blocks, offset = _split_blocks(doc, test_size, rng, block_size), len(sentences)
        train += [[offset + i for i in block] for block in blocks.train]
        test += [[offset + i for i in block] for block in blocks.test]
        sentences += doc
        doc_of += [d] * len(doc)
    train_texts = {sentences[i] for block in train for i in block}
    test = [[i for i in block if sentences[i] not in train_texts] for block in test]
    return sentences, doc_of, _Blocks(train, [block for block in test if block])


def _consecutive_pairs(blocks) -> list[tuple[int, int]]:
    return [(i, j) for block in blocks for i, j in zip(block, block[1:], strict=False)
            if j == i + 1]


def _check_common(tokenizer, max_length, test_size, random_state):
    if tokenizer is None:
        tokenizer = corpus_tokenizer()
    elif not isinstance(tokenizer, WordPieceTokenizer):
        raise TypeError(f"tokenizer must be a WordPieceTokenizer or None, got "
                        f"{type(tokenizer).__name__}")
    check_scalar(max_length, name="max_length", kind=numbers.Integral, low=8)
    check_scalar(test_size, name="test_size", kind=numbers.Real, low=0, high=1,
                 low_inclusive=False, high_inclusive=False)
    return tokenizer, get_rng(random_state)


def _stack(encodings, labels, texts) -> TextSplit:
    T = len(encodings[0].ids) if encodings else 0

    def field(name):
        if not encodings:
            return np.zeros((0, T), dtype=np.int64)
        return np.stack([getattr(e, name) for e in encodings])

    return TextSplit(field("ids"), field("token_type_ids"), field("attention_mask"),
                     np.asarray(labels, dtype=np.int64), tuple(texts))


def _encode_classification(tokenizer, examples, max_length) -> TextSplit:
    """examples: list of ((a,) or (a, b), label); truncated and padded to max_length."""
    encodings = [tokenizer.encode(*texts, max_length=max_length, truncation=True,
                                  padding="max_length") for texts, _ in examples]
    return _stack(encodings, [label for _, label in examples], [t for t, _ in examples])


# ----------------------------------------------------------------------------------------
# Tasks
# ----------------------------------------------------------------------------------------
def _nsp_triples(pairs, pools, doc_of, rng) -> list[tuple[int, int, int]]:
    """(a, b, label) sentence indices: for half of each document's consecutive ``pairs``
    (seeded) b is the next sentence (label 0); for the other half b is drawn from the
    ``pools`` (sentence indices per document) of a uniformly chosen other document (1)."""
    triples = []
    for d in range(len(pools)):
        mine = [(i, j) for i, j in pairs if doc_of[i] == d]
        negative = np.zeros(len(mine), dtype=bool)
        negative[rng.permutation(len(mine))[:len(mine) // 2]] = True
        others = [e for e in range(len(pools)) if e != d and pools[e]]
        for (i, j), neg in zip(mine, negative, strict=True):
            if neg:
                pool = pools[others[int(rng.integers(len(others)))]]
                triples.append((i, pool[int(rng.integers(len(pool)))], 1))
            else:
                triples.append((i, j, 0))
    return triples


def next_sentence_task(tokenizer=None, max_length: int = 64, test_size: float = 0.2,
                       random_state=0, sentences_per_document: int | None = None) -> TextTask:
    """Next-sentence prediction pairs ``[CLS] a [SEP] b [SEP]``, built as BERT's
    pretraining data: from several documents (:func:`load_documents`: Alice, a play, an
    epic poem, ``sentences_per_document`` sentences each).

    Every two consecutive sentences (a, next) of a split give one example: (a, next) with
    label 0 ("is_next"), or (a, r) with label 1 ("not_next"), r a random sentence of the
    same split from a *different document* (the other document drawn uniformly, then the
    sentence). In each split, exactly half of each document's examples are negatives
    (seeded), and documents are of equal size, so neither a's nor b's document alone
    predicts the label; a model must tell whether a and b come from the same document
    (topic, vocabulary, style), as BERT's NSP does. Each document is split into train and
    test by blocks of 10 consecutive sentences (the same share of each document held out;
    texts that occur in train are removed from test); examples are shuffled (seeded), so
    any prefix of a split mixes the documents. Labels (n,) int64.
    """
    tokenizer, rng = _check_common(tokenizer, max_length, test_size, random_state)
    documents = load_documents(sentences_per_document)
    sentences, doc_of, blocks = _split_document_blocks(documents, test_size, rng)

    def build(split_blocks):
        pairs = _consecutive_pairs(split_blocks)
        if not pairs:
            raise ValueError(f"test_size={test_size} with sentences_per_document="
                             f"{sentences_per_document} leaves a split without two "
                             "consecutive sentences")
        pools = [[] for _ in documents]  # sentence indices of each document in this split
        for i in (i for block in split_blocks for i in block):
            pools[doc_of[i]].append(i)
        examples = [((sentences[i], sentences[j]), label)
                    for i, j, label in _nsp_triples(pairs, pools, doc_of, rng)]
        examples = [examples[t] for t in rng.permutation(len(examples))]
        return _encode_classification(tokenizer, examples, max_length)

    return TextTask("next_sentence", build(blocks.train), build(blocks.test),
                    ("is_next", "not_next"))


def sentence_order_task(tokenizer=None, max_length: int = 64, test_size: float = 0.2,
                        random_state=0) -> TextTask:
    """Two consecutive sentences in book order (label 0) or swapped (label 1), half and
    half. Labels (n,) int64."""
    tokenizer, rng = _check_common(tokenizer, max_length, test_size, random_state)
    sentences = _corpus_sentences()
    blocks = _split_blocks(sentences, test_size, rng)

    def build(split_blocks):
        examples = []
        for i, j in _consecutive_pairs(split_blocks):
            swapped = int(rng.random() < 0.5)
            a, b = (sentences[j], sentences[i]) if swapped else (sentences[i], sentences[j])
            examples.append(((a, b), swapped))
        return _encode_classification(tokenizer, examples, max_length)

    return TextTask("sentence_order", build(blocks.train), build(blocks.test),
                    ("in_order", "swapped"))


def sentiment_label(sentence: str) -> int | None:
    """1 if ``sentence`` has more :data:`POSITIVE_WORDS` than :data:`NEGATIVE_WORDS`, 0 if
    fewer, None on a tie (both counted on lowercased words)."""
    words = basic_tokenize(sentence)
    pos = sum(w in POSITIVE_WORDS for w in words)
    neg = sum(w in NEGATIVE_WORDS for w in words)
    return None if pos == neg else int(pos > neg)


def sentiment_task(tokenizer=None, max_length: int = 64, test_size: float = 0.2,
                   random_state=0) -> TextTask:
    """Lexicon sentiment: sentences labelled by :func:`sentiment_label` (ties left out),
    classes balanced in each split by seeded subsampling of the larger one. Labels (n,)."""
    tokenizer, rng = _check_common(tokenizer, max_length, test_size, random_state)
    sentences = _corpus_sentences()
    blocks = _split_blocks(sentences, test_size, rng)

    def build(split_blocks):
        by_label = {0: [], 1: []}
        for i in (i for block in split_blocks for i in block):
            label = sentiment_label(sentences[i])
            if label is not None:
                by_label[label].append(i)
        n = min(len(by_label[0]), len(by_label[1]))
        chosen = sorted((i, label) for label, ids in by_label.items()
                        for i in sorted(rng.choice(ids, size=n, replace=False).tolist()))
        return _encode_classification(tokenizer, [((sentences[i],), label)
                                                  for i, label in chosen], max_length)

    return TextTask("sentiment", build(blocks.train), build(blocks.test),
                    ("negative", "positive"))


@functools.lru_cache(maxsize=1)
def _corpus_names() -> frozenset:
    """Lowercased words written capitalised (not all capitals) in the middle of sentences
    -- right after a word, not after a quote, bracket or colon -- at least twice and more
    often than lowercase there."""
    capital, lower = {}, {}
    for s in _corpus_sentences():
        words = basic_tokenize(s, lowercase=False)
        for prev, w in zip(words, words[1:], strict=False):
            if not w.isalpha() or not prev.isalpha() or w == "I":
                continue
            key = w.lower()
            if w[0].isupper() and (len(w) == 1 or w[1:].islower()):
                capital[key] = capital.get(key, 0) + 1
            elif w.islower():
                lower[key] = lower.get(key, 0) + 1
    return frozenset(w for w, c in capital.items()
                     if c >= 2 and len(w) >= 2 and c > lower.get(w, 0))


def word_tag(word: str) -> str:
    """The tag of one lowercased word: PUNCT, a closed class (DET PRON PREP CONJ), NAME
    (words the corpus writes capitalised mid-sentence), then suffixes -ly ADV, -ing ING,
    -ed ED; O otherwise."""
    if not any(c.isalnum() for c in word):
        return "PUNCT"
    if word in _WORD_CLASS:
        return _WORD_CLASS[word]
    if word in _corpus_names():
        return "NAME"
    if len(word) >= 5 and word.endswith("ly"):
        return "ADV"
    if len(word) >= 6 and word.endswith("ing"):
        return "ING"
    if len(word) >= 5 and word.endswith("ed"):
        return "ED"
    return "O"


def _word_labels(enc, tags_by_sequence) -> np.ndarray:
    """(T,) labels: the tag id on each word's first piece, -100 elsewhere."""
    labels = np.full(len(enc.ids), IGNORE_INDEX, dtype=np.int64)
    first = enc.first_piece_mask()
    for t in np.flatnonzero(first):
        labels[t] = tags_by_sequence[enc.sequence_ids[t]][enc.word_ids[t]]
    return labels


def tagging_task(tokenizer=None, max_length: int = 64, test_size: float = 0.2,
                 random_state=0) -> TextTask:
    """Part-of-speech-like tagging of single sentences with :func:`word_tag`.

    Labels (n, T) int64: the index in :data:`TAG_NAMES` on the first WordPiece of every
    word, -100 on ``##`` continuation pieces, ``[CLS]``, ``[SEP]`` and padding. Sentences
    longer than ``max_length`` tokens are left out.
    """
    tokenizer, rng = _check_common(tokenizer, max_length, test_size, random_state)
    sentences = _corpus_sentences()
    blocks = _split_blocks(sentences, test_size, rng)
    tag_ids = {t: k for k, t in enumerate(TAG_NAMES)}

    def build(split_blocks):
        encodings, labels, texts = [], [], []
        for i in (i for block in split_blocks for i in block):
            enc = tokenizer.encode(sentences[i])
            if len(enc) > max_length:
                continue
            enc = tokenizer.encode(sentences[i], max_length=max_length, padding="max_length")
            words = basic_tokenize(sentences[i], lowercase=tokenizer.lowercase)
            tags = [tag_ids[word_tag(w.lower())] for w in words]
            encodings.append(enc)
            labels.append(_word_labels(enc, {0: tags}))
            texts.append((sentences[i],))
        labels = np.stack(labels) if labels else np.zeros((0, max_length), dtype=np.int64)
        return _stack(encodings, labels, texts)  # labels (n, T)

    return TextTask("tagging", build(blocks.train), build(blocks.test), TAG_NAMES)


def _name_runs(words) -> list[tuple[int, int]]:
    """(first, last) word indices of maximal runs of NAME words."""
    runs, k = [], 0
    while k < len(words):
        if word_tag(words[k].lower()) == "NAME":
            j = k
            while j + 1 < len(words) and word_tag(words[j + 1].lower()) == "NAME":
                j += 1
            runs.append((k, j))
            k = j + 1
        else:
            k += 1
    return runs


def _occurrences(words, phrase) -> int:
    n = len(phrase)
    return sum(words[k:k + n] == phrase for k in range(len(words) - n + 1))


def span_task(tokenizer=None, max_length: int = 96, test_size: float = 0.2,
              random_state=0) -> TextTask:
    """Extractive QA: ``[CLS] question [SEP] context [SEP]``.

    For a sentence with a name (a run of NAME words, see :func:`word_tag`; one run chosen
    at random), the question is the sentence with that name replaced by "who" and the
    context is the sentence followed by the next one of its block (when there is one).
    Only names that occur once in the context are used. Labels (n, 2) int64: token
    positions of the answer's first and last piece (inclusive) in the encoding. Examples
    longer than ``max_length`` are left out.
    """
    tokenizer, rng = _check_common(tokenizer, max_length, test_size, random_state)
    sentences = _corpus_sentences()
    blocks = _split_blocks(sentences, test_size, rng)
    lower = tokenizer.lowercase

    def build(split_blocks):
        encodings, labels, texts = [], [], []
        for block in split_blocks:
            for pos, i in enumerate(block):
                words = basic_tokenize(sentences[i], lowercase=lower)
                runs = _name_runs(words)
                if not runs:
                    continue
                first, last = runs[int(rng.integers(len(runs)))]
                nxt = block[pos + 1] if pos + 1 < len(block) else None
                context = sentences[i] if nxt is None else f"{sentences[i]} {sentences[nxt]}"
                context_words = basic_tokenize(context, lowercase=lower)
                if _occurrences(context_words, words[first:last + 1]) != 1:
                    continue
                question = " ".join(words[:first] + ["who"] + words[last + 1:])
                enc = tokenizer.encode(question, context)
                if len(enc) > max_length:
                    continue
                enc = tokenizer.encode(question, context, max_length=max_length,
                                       padding="max_length")
                start = enc.word_to_tokens(first, sequence=1)[0]
                end = enc.word_to_tokens(last, sequence=1)[1]
                encodings.append(enc)
                labels.append((start, end))
                texts.append((question, context))
        labels = np.asarray(labels, dtype=np.int64).reshape(-1, 2)
        return _stack(encodings, labels, texts)

    return TextTask("span", build(blocks.train), build(blocks.test), ("start", "end"))
