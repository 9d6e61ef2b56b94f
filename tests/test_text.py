"""nk.text (WordPiece tokenizer) and nk.datasets.text (the shipped corpus and its tasks)."""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nnkit.datasets import text as dt
from nnkit.text import (
    SPECIAL_TOKENS,
    WordPieceTokenizer,
    basic_tokenize,
)

SPECIALS = list(SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def corpus():
    return dt.load_corpus()


@pytest.fixture(scope="module")
def tok():
    return dt.corpus_tokenizer()


def _toy(tokens):
    return WordPieceTokenizer(SPECIALS + list(tokens))


# ----- basic tokenization -------------------------------------------------------------------
def test_basic_tokenize_splits_punctuation_lowercases_and_strips_accents():
    assert basic_tokenize("Héllo,World!  Don't\tstop…") == [
        "hello", ",", "world", "!", "don", "'", "t", "stop", "…"]
    assert basic_tokenize("Héllo", lowercase=False) == ["Héllo"]


def test_basic_tokenize_control_whitespace_cjk_and_specials():
    assert basic_tokenize("a\x00b\u200bc\u00a0d\r\ne") == ["abc", "d", "e"]
    assert basic_tokenize("ab中文cd") == ["ab", "中", "文", "cd"]
    assert basic_tokenize("the [MASK] sat [SEP]") == ["the", "[MASK]", "sat", "[SEP]"]
    assert basic_tokenize("$5^2`") == ["$", "5", "^", "2", "`"]  # ASCII symbols split too


# ----- WordPiece encoding -------------------------------------------------------------------
def test_greedy_longest_match_first():
    t = _toy(["un", "##aff", "##able", "u", "##n", "##a", "##f", "##b", "##l", "##e", "aff"])
    assert t.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert t.tokenize("unable") == ["un", "##able"]
    assert t.tokenize("affable") == ["aff", "##able"]


def test_unknown_words_become_unk():
    t = _toy(["un", "##aff", "##able", "the"])
    assert t.tokenize("the unaffablex") == ["the", "[UNK]"]  # 'x' cannot be matched
    assert t.tokenize("zzz un") == ["[UNK]", "un"]
    short = WordPieceTokenizer(SPECIALS + ["a", "##a"], max_input_chars_per_word=4)
    assert short.tokenize("aaaa aaaaa") == ["a", "##a", "##a", "##a", "[UNK]"]


def test_unseen_word_is_cut_into_known_pieces(tok):
    pieces = tok.tokenize("wonderlandish caterpillars")
    assert "[UNK]" not in pieces
    assert any(p.startswith("##") for p in pieces)
    assert tok.decode(tok.encode("wonderlandish caterpillars").ids) == "wonderlandish caterpillars"


def test_specials_have_fixed_ids_after_training(tok):
    assert tok.itos[:5] == SPECIALS
    assert (tok.pad_token_id, tok.unk_token_id, tok.cls_token_id, tok.sep_token_id,
            tok.mask_token_id) == (0, 1, 2, 3, 4)
    assert tok.special_ids == (0, 1, 2, 3, 4)


def test_specials_follow_a_bert_style_vocab_order():
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(3)] + ["[UNK]", "[CLS]", "[SEP]",
                                                              "[MASK]", "hello", "##s"]
    t = WordPieceTokenizer(vocab)
    assert (t.pad_token_id, t.unk_token_id, t.cls_token_id, t.sep_token_id,
            t.mask_token_id) == (0, 4, 5, 6, 7)
    assert t.encode("hellos [MASK]").ids.tolist() == [5, 8, 9, 7, 6]


def test_single_sequence_layout(tok):
    enc = tok.encode("Alice was late.")
    assert enc.tokens == ("[CLS]", "alice", "was", "late", ".", "[SEP]")
    assert enc.token_type_ids.tolist() == [0] * 6
    assert enc.attention_mask.tolist() == [1] * 6
    assert enc.word_ids == (None, 0, 1, 2, 3, None)
    assert enc.ids.dtype == np.int64


def test_pair_has_segment_ids(tok):
    enc = tok.encode("Alice was late.", "The Queen")
    assert enc.tokens == ("[CLS]", "alice", "was", "late", ".", "[SEP]", "the", "queen",
                          "[SEP]")
    assert enc.token_type_ids.tolist() == [0, 0, 0, 0, 0, 0, 1, 1, 1]
    assert enc.sequence_ids == (None, 0, 0, 0, 0, None, 1, 1, None)
    assert enc.word_ids == (None, 0, 1, 2, 3, None, 0, 1, None)
    assert enc.word_to_tokens(1, sequence=1) == (7, 7)


def test_no_special_tokens(tok):
    enc = tok.encode("the queen", add_special_tokens=False)
    assert enc.tokens == ("the", "queen")
    assert tok.encode("alice", add_special_tokens=False).first_piece_mask().tolist() == [True]


def test_first_pieces_and_word_positions():
    t = _toy(["un", "##aff", "##able", "the"])
    enc = t.encode("the unaffable", "unaffable", max_length=12, padding="max_length")
    assert enc.tokens[:9] == ("[CLS]", "the", "un", "##aff", "##able", "[SEP]", "un", "##aff",
                              "##able")
    assert enc.first_piece_mask().tolist() == [False, True, True, False, False, False, True,
                                               False, False, False, False, False]
    assert enc.word_to_tokens(1) == (2, 4) and enc.word_to_tokens(0, sequence=1) == (6, 8)
    with pytest.raises(ValueError, match="word 2 of sequence 0 is not in the encoding"):
        enc.word_to_tokens(2)


def test_padding_to_max_length(tok):
    enc = tok.encode("the queen", "alice", max_length=8, padding="max_length")
    assert enc.tokens[-2:] == ("[PAD]", "[PAD]")
    assert enc.ids[-2:].tolist() == [0, 0]
    assert enc.attention_mask.tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert enc.token_type_ids.tolist() == [0, 0, 0, 0, 1, 1, 0, 0]
    assert tok.decode(enc.ids) == "the queen alice"


def test_truncation_longest_first(tok):
    a, b = "one two three four five six", "alice queen"
    enc = tok.encode(a, b, max_length=9, truncation=True)
    # room 6 for 6 + 2 words: the shorter keeps min(2, 6 // 2), the longer the rest
    assert enc.tokens == ("[CLS]", "one", "two", "three", "four", "[SEP]", "alice", "queen",
                          "[SEP]")
    enc = tok.encode(a, b, max_length=7, truncation=True)
    assert enc.tokens == ("[CLS]", "one", "two", "[SEP]", "alice", "queen", "[SEP]")
    enc = tok.encode(a, "one two three four five six seven", max_length=9, truncation=True)
    assert len(enc) == 9 and enc.token_type_ids.sum() == 4  # 3 from b + its [SEP]
    enc = tok.encode(a, max_length=4, truncation=True, padding="max_length")
    assert enc.tokens == ("[CLS]", "one", "two", "[SEP]")


def test_too_long_without_truncation_is_an_error(tok):
    with pytest.raises(ValueError, match="max_length=3.*truncation=True"):
        tok.encode("the queen said", max_length=3)
    with pytest.raises(ValueError, match="cannot hold the 3 special"):
        tok.encode("the", "queen", max_length=2, truncation=True)


def test_encode_batch_pads_to_longest_and_to_max_length(tok):
    batch = tok.encode_batch(["the queen", "alice"], ["said", "was very late ."])
    assert batch.ids.shape == (2, 8)
    assert batch.attention_mask.sum(axis=1).tolist() == [6, 8]
    assert batch.ids[0, 6:].tolist() == [0, 0]
    assert batch.token_type_ids[1].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
    batch = tok.encode_batch(["the queen", "alice"], max_length=6, padding="max_length")
    assert batch.ids.shape == (2, 6)
    with pytest.raises(ValueError, match="different lengths"):
        tok.encode_batch(["the queen", "alice"], padding=False)
    assert tok.encode_batch([]).ids.shape == (0, 0)


def test_decode_glues_pieces_and_skips_specials(tok):
    ids = tok.encode("unbelievably curious", "queen").ids
    assert tok.decode(ids) == "unbelievably curious queen"
    assert tok.decode(ids, skip_special_tokens=False) == (
        "[CLS] unbelievably curious [SEP] queen [SEP]")


def test_corpus_round_trips(tok, corpus):
    for sentence in corpus:  # every character of the corpus is in its vocabulary
        assert tok.decode(tok.encode(sentence).ids) == tok.normalize(sentence)


@settings(max_examples=40)
@given(data=st.data())
def test_round_trip_of_in_vocabulary_text(data):
    t = _toy(["the", "queen", "said", "off", "##f", "with", "her", "head", "!", ",", "'",
              "al", "##ice", "##s", "q"])
    words = data.draw(st.lists(st.sampled_from(
        ["The", "queen", "QUEEN", "said", "off", "offf", "with", "her", "head!", ",", "'",
         "Alice", "alices", "q", "qs"]), max_size=12))
    text = data.draw(st.sampled_from([" ", "  ", "\t", "\n"])).join(words)
    enc = t.encode(text)
    assert "[UNK]" not in enc.tokens
    assert t.decode(enc.ids) == t.normalize(text)
    inner = t.normalize(text)  # decode drops the space before . ? ! , as transformers does
    space = "" if inner[:1] in ("", ".", "?", "!", ",") else " "
    assert t.decode(enc.ids, skip_special_tokens=False) == f"[CLS]{space}{inner} [SEP]"
    masked = t.encode(text + " [MASK]")
    assert masked.tokens[-2:] == ("[MASK]", "[SEP]")


def test_id_lookups_and_bad_ids(tok):
    assert tok.id_to_token(tok.token_to_id("alice")) == "alice"
    assert tok.token_to_id("notaword") == tok.unk_token_id
    with pytest.raises(ValueError, match=r"outside the vocabulary 0\.\."):
        tok.decode([2, tok.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([-1])
    with pytest.raises(ValueError, match="1-D sequence of integers"):
        tok.decode([[1, 2]])
    with pytest.raises(ValueError, match="outside"):
        tok.id_to_token(10**6)


# ----- training ------------------------------------------------------------------------------
def test_training_is_deterministic_and_fills_the_vocabulary(corpus):
    a = WordPieceTokenizer.train(corpus[:300], vocab_size=400)
    b = WordPieceTokenizer.train(list(corpus[:300]), vocab_size=400)
    assert a.itos == b.itos
    assert a.vocab_size == len(a) == 400
    assert len(set(a.itos)) == 400
    chars = {c for s in corpus[:300] for w in basic_tokenize(s) for c in w}
    assert chars | {"##" + c for c in chars} <= set(a.itos)
    assert a.tokenize("xanadu") != ["[UNK]"]  # 'x' starts no corpus word but is in the vocab


def test_frequency_and_likelihood_criteria_by_hand():
    lines = ["xy xy xy zy zw"]  # x:3, z:2, ##y:4, ##w:1; pairs xy:3, zy:1, zw:1
    base = 5 + 8 + 1  # specials, w x y z and ##w ##x ##y ##z, one merge
    freq = WordPieceTokenizer.train(lines, vocab_size=base, min_frequency=1)
    assert freq.itos[5:] == ["##w", "##x", "##y", "##z", "w", "x", "y", "z", "xy"]  # count 3
    like = WordPieceTokenizer.train(lines, vocab_size=base, min_frequency=1,
                                    criterion="likelihood")
    assert like.itos[-1] == "zw"  # 1 / (2 * 1) beats 3 / (3 * 4)


def test_min_frequency_stops_training_early():
    t = WordPieceTokenizer.train(["ab ab cd"], vocab_size=100, min_frequency=2)
    alphabet = ["##a", "##b", "##c", "##d", "a", "b", "c", "d"]
    assert t.itos[5:] == alphabet + ["ab"]
    t = WordPieceTokenizer.train(["ab ab cd"], vocab_size=100, min_frequency=3)
    assert t.itos[5:] == alphabet


def test_merges_make_whole_words(tok):
    for word in ("alice", "queen", "the", "said", "rabbit", "hatter"):
        assert tok.tokenize(word) == [word]


def test_training_bad_input():
    with pytest.raises(ValueError, match="vocab_size=6 is smaller.*vocab_size >= 9"):
        WordPieceTokenizer.train(["ab a"], vocab_size=6)
    with pytest.raises(TypeError, match="iterable of str"):
        WordPieceTokenizer.train("the text", vocab_size=50)
    with pytest.raises(ValueError, match="no words"):
        WordPieceTokenizer.train(["  ", "[MASK]"], vocab_size=50)
    with pytest.raises(ValueError, match="criterion must be one of"):
        WordPieceTokenizer.train(["ab"], criterion="bpe")
    with pytest.raises(ValueError, match="min_frequency must be >= 1"):
        WordPieceTokenizer.train(["ab"], min_frequency=0)


# ----- vocabulary files -----------------------------------------------------------------------
def test_save_and_load_vocab(tok, tmp_path):
    path = tok.save_vocab(tmp_path)
    assert path.endswith("vocab.txt")
    lines = open(path, encoding="utf-8").read().split("\n")
    assert lines[:5] == SPECIALS and lines[-1] == "" and len(lines) == tok.vocab_size + 1
    loaded = WordPieceTokenizer.load(path)
    assert loaded.itos == tok.itos
    text = "The Mock Turtle sighed deeply, unbelievably."
    assert np.array_equal(loaded.encode(text).ids, tok.encode(text).ids)
    assert WordPieceTokenizer.load(tmp_path).itos == tok.itos


def test_vocab_validation():
    with pytest.raises(ValueError, match=r"lacks the special token\(s\) \[MASK\]"):
        WordPieceTokenizer(SPECIALS[:4] + ["a"])
    with pytest.raises(ValueError, match="'a' more than once"):
        WordPieceTokenizer(SPECIALS + ["a", "a"])
    with pytest.raises(ValueError, match="without whitespace"):
        WordPieceTokenizer(SPECIALS + ["a b"])
    with pytest.raises(TypeError, match="WordPieceTokenizer.load"):
        WordPieceTokenizer("vocab.txt")
    with pytest.raises(ValueError, match="0..n-1"):
        WordPieceTokenizer({t: i + 1 for i, t in enumerate(SPECIALS)})
    t = WordPieceTokenizer({t: i for i, t in enumerate(SPECIALS + ["a"])})
    assert t.tokenize("a") == ["a"]


def test_encode_bad_input(tok):
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode(["a"])
    with pytest.raises(TypeError, match="pair must be a str"):
        tok.encode("a", 3)
    with pytest.raises(ValueError, match="truncation=True needs a max_length"):
        tok.encode("a", truncation=True)
    with pytest.raises(ValueError, match="padding='max_length' needs a max_length"):
        tok.encode("a", padding="max_length")
    with pytest.raises(ValueError, match="padding must be one of"):
        tok.encode("a", padding="left")
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        tok.encode("a", max_length=0)
    with pytest.raises(ValueError, match="pairs has 1 items but texts has 2"):
        tok.encode_batch(["a", "b"], ["c"])


def test_padding_to_a_huge_max_length_is_refused_before_allocating(tok):
    # a bare MemoryError came out of the padding lists before
    for call in (lambda: tok.encode("the queen", max_length=2**40, padding="max_length"),
                 lambda: tok.encode_batch(["a", "b"], max_length=2**40, padding=True)):
        with pytest.raises(ValueError, match=r"max_length=1099511627776 is too large to pad "
                                             r"to: .*at most 16777216 .*padding='longest'"):
            call()
    # as a bound alone (truncation, or padding to the longest) it allocates nothing
    assert len(tok.encode("the queen", max_length=2**40, truncation=True)) == 4
    assert tok.encode_batch(["the", "the queen"], max_length=2**40,
                            padding="longest").ids.shape == (2, 4)


def test_loading_a_vocab_that_is_not_utf8_names_the_file_and_byte(tmp_path):
    # a raw UnicodeDecodeError ("'utf-8' codec can't decode byte 0xe9 ...") came out before
    path = tmp_path / "vocab.txt"
    path.write_bytes("\n".join(SPECIALS + ["caf"]).encode() + b"\xe9\nb\n")  # Latin-1 'é'
    with pytest.raises(ValueError, match=r"vocab.txt' is not UTF-8 text: byte 0xe9 at offset "
                                         r"34 \(line 6\) .*expected a vocab.txt encoded in "
                                         r"UTF-8") as info:
        WordPieceTokenizer.load(path)
    assert not isinstance(info.value, UnicodeDecodeError)
    assert str(path) in str(info.value)


def test_matches_the_tokenizers_package(tok, corpus, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    path = tok.save_vocab(tmp_path)
    theirs = tokenizers.BertWordPieceTokenizer(path, lowercase=True)
    texts = list(corpus[:200]) + ["Héllo, wonderlandish [MASK] xylophone!", "a\tb  c"]
    for a, b in zip(texts[::2], texts[1::2], strict=True):
        mine = tok.encode(a, b)
        other = theirs.encode(a, b)
        assert mine.ids.tolist() == other.ids
        assert mine.token_type_ids.tolist() == other.type_ids
    words = "one two three four five six seven eight".split()
    for n_a, n_b, max_length in [(3, 8, 5), (8, 3, 5), (4, 4, 7), (0, 6, 4), (6, 1, 9),
                                 (2, 7, 3), (7, 7, 10), (5, 2, 6)]:
        a, b = " ".join(words[:n_a]), " ".join(words[:n_b])
        theirs.enable_truncation(max_length=max_length)
        mine = tok.encode(a, b, max_length=max_length, truncation=True)
        assert mine.ids.tolist() == theirs.encode(a, b).ids, (n_a, n_b, max_length)


# ----- the corpus -----------------------------------------------------------------------------
def test_corpus_loads_clean_and_deterministic(corpus):
    assert isinstance(corpus, list) and len(corpus) > 1000
    assert corpus == dt.load_corpus()
    sentences, chapters = dt.load_corpus(return_chapters=True)
    assert sentences == corpus and chapters == sorted(chapters)
    assert set(chapters) == set(range(12))  # the book's twelve chapters
    with pytest.raises(TypeError, match="return_chapters must be a bool"):
        dt.load_corpus("yes")
    assert corpus[0].startswith("Alice was beginning to get very tired")
    text = " ".join(corpus)
    for leftover in ("CHAPTER", "Gutenberg", "`", "_", "MILLENNIUM", "THE END", "\n", "  "):
        assert leftover not in text
    assert all(len(s.split()) >= 3 for s in corpus)
    assert "waistcoat-pocket" in text.lower() and "- pocket" not in text.lower()


def test_corpus_source_is_named_next_to_the_file():
    data = resources.files("nnkit").joinpath("data")
    raw = data.joinpath(dt.CORPUS_FILE).read_bytes()
    readme = data.joinpath("README.md").read_text(encoding="utf-8")
    assert len(raw) < 1_000_000
    assert hashlib.sha256(raw).hexdigest() in readme
    for fact in ("Lewis Carroll", "Project Gutenberg etext #11", "public domain",
                 "MILLENNIUM FULCRUM EDITION 2.9", "brotli-1.2.1"):
        assert fact in readme
    assert "Lewis Carroll" in dt.CORPUS_SOURCE and "Gutenberg" in dt.CORPUS_SOURCE
    assert b"Lewis Carroll" in raw[:400] and b"FULCRUM EDITION 2.9" in raw[:400]


def test_every_document_is_shipped_with_its_checksum_and_author():
    data = resources.files("nnkit").joinpath("data")
    readme = data.joinpath("README.md").read_text(encoding="utf-8")
    raws = [data.joinpath(name).read_bytes() for name in dt.DOCUMENT_FILES]
    assert dt.DOCUMENT_FILES[0] == dt.CORPUS_FILE and "lcet10.txt" not in dt.DOCUMENT_FILES
    assert sum(map(len, raws)) < 1_000_000
    for name, raw, source, author in zip(dt.DOCUMENT_FILES, raws, dt.DOCUMENT_SOURCES,
                                         ("Lewis Carroll", "Shakespeare", "Milton"),
                                         strict=True):
        assert f"## {name}" in readme and hashlib.sha256(raw).hexdigest() in readme
        assert author in source and "public domain" in source
        assert f"{len(raw):,} bytes" in readme
    assert b"AS YOU LIKE IT" in raws[1][:40] and b"Paradise Lost by John Milton" in raws[2][:200]


def test_strip_gutenberg_boilerplate():
    modern = ("Title: X\r\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\r\nbody text\r\n"
              "*** END OF THE PROJECT GUTENBERG EBOOK X ***\r\nlicence")
    assert dt.strip_gutenberg_boilerplate(modern).strip() == "body text"
    old = "header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\nbody\n" \
          "End of Project Gutenberg's X\nfooter"
    assert dt.strip_gutenberg_boilerplate(old).strip() == "body"
    assert dt.strip_gutenberg_boilerplate("just text") == "just text"
    with pytest.raises(TypeError, match="text must be a str"):
        dt.strip_gutenberg_boilerplate(b"bytes")


def test_split_sentences():
    text = "'Oh dear! Oh dear! I shall be late!' said Mr. Rabbit. Yes."
    assert dt.split_sentences(text, min_words=2) == [
        "'Oh dear!", "Oh dear!", "I shall be late!' said Mr. Rabbit."]
    assert dt.split_sentences(text) == ["I shall be late!' said Mr. Rabbit."]  # >= 3 words
    assert dt.split_sentences("It was late. (Very late.) Then it ended.", min_words=1) == [
        "It was late.", "(Very late.)", "Then it ended."]
    assert dt.split_sentences("no split. here it is") == ["no split. here it is"]


PLAY = """\tA PLAY\n\n\tDRAMATIS PERSONAE\n\nDUKE\tthe duke.\n\n\nACT I\n\n\n
SCENE I\tA room.\n\n\t[Enter DUKE and First Lord]\n\nDUKE\tWhat news, my lord? Speak
\tto me now.\n\nFirst Lord\tThe king is dead. [Aside] Long live
\tthe king!\n\n\t[Exit DUKE, weeping,\n\tand others]\n\n\tI alone remain here.
\n\tA PLAY\n\nACT II\n\n\tSONG.\nDUKE\tUnder the green tree we lie.\n"""


def test_play_sentences_by_hand():
    assert dt.play_sentences(PLAY) == [
        "What news, my lord?", "Speak to me now.", "The king is dead.",
        "Long live the king!", "I alone remain here.", "Under the green tree we lie."]
    with pytest.raises(ValueError, match="no 'ACT I' line"):
        dt.play_sentences("DUKE\tHello there, my lord.")
    with pytest.raises(TypeError, match="text must be a str"):
        dt.play_sentences(b"ACT I")


VERSE = ("Intro text about the etext. It has sentences too.\r\n\r\nBook I \r\n\r\n"
         "Of arms I sing, and of the\r\nMan who came. He went away\r\nTo distant lands.\r\n"
         "  Now a new paragraph\r\nbegins right here, with no end\r\n\r\nBook II\r\n\r\n"
         "The second book is short.\r\n\r\n[The End]\x1a\x1a\r\n")


def test_verse_sentences_by_hand():
    assert dt.verse_sentences(VERSE, return_books=True) == (
        ["Of arms I sing, and of the Man who came.", "He went away To distant lands.",
         "Now a new paragraph begins right here, with no end", "The second book is short."],
        [0, 0, 0, 1])
    with pytest.raises(ValueError, match="no 'Book I' line"):
        dt.verse_sentences("Of arms I sing, and of the Man.")
    with pytest.raises(TypeError, match="text must be a str"):
        dt.verse_sentences(None)


def _read(name):
    return resources.files("nnkit").joinpath("data", name).read_text(encoding="ascii")


def test_the_shipped_play_is_cleaned():
    sentences = dt.play_sentences(_read("asyoulik.txt"))
    assert len(sentences) > 1000 and all(len(s.split()) >= 3 for s in sentences)
    assert sentences[0].startswith("As I remember, Adam, it was upon this fashion")
    assert sentences[-1].endswith("bid me farewell.")
    text = " ".join(sentences)
    for leftover in ("[", "]", "\t", "  ", "ACT", "SCENE", "SONG", "EPILOGUE", "DRAMATIS",
                     "Exeunt", "Enter ", "AS YOU LIKE IT", "Orchard of Oliver's house"):
        assert leftover not in text, leftover
    for name in ("ROSALIND", "ORLANDO", "DUKE SENIOR", "TOUCHSTONE", "First Lord"):
        assert name not in text, name  # speaker tags (the speeches say "Rosalind")
    assert "Rosalind" in text and "Under the greenwood tree" in text  # a song stays


def test_the_shipped_poem_is_cleaned():
    sentences, books = dt.verse_sentences(_read("plrabn12.txt"), return_books=True)
    assert len(sentences) > 1000 and all(len(s.split()) >= 3 for s in sentences)
    assert books == sorted(books) and set(books) == set(range(12))
    assert sentences[0].startswith("Of Man's first disobedience, and the fruit Of that")
    assert sentences[-1].endswith("Through Eden took their solitary way.")
    text = " ".join(sentences)
    for leftover in ("Gutenberg", "etext", "Book I", "[The End]", "\x1a", "\r", "  "):
        assert leftover not in text, leftover


def test_load_documents_are_balanced_runs_of_each_book(corpus):
    documents = dt.load_documents()
    assert documents == dt.load_documents() and len(documents) == len(dt.DOCUMENT_FILES)
    full = [corpus, dt.play_sentences(_read("asyoulik.txt")),
            dt.verse_sentences(_read("plrabn12.txt"))]
    assert len({len(doc) for doc in documents}) == 1
    assert len(documents[0]) == min(map(len, full))
    for doc, whole in zip(documents, full, strict=True):
        assert doc and all(s.strip() for s in doc)
        starts = []  # each 10 sentences are consecutive in the book, the runs in book order
        for k in range(0, len(doc), 10):
            run = doc[k:k + 10]
            after = starts[-1] + 10 if starts else 0
            starts.append(next(i for i in range(after, len(whole))
                               if whole[i:i + len(run)] == run))
        assert starts[0] == 0 and starts[-1] > 0.9 * len(whole)  # spread over the whole work
    small = dt.load_documents(sentences_per_document=200)
    assert [len(doc) for doc in small] == [200] * 3
    with pytest.raises(ValueError, match="sentences_per_document must be >= 20"):
        dt.load_documents(sentences_per_document=5)


def test_tokenizer_is_trained_on_all_documents(tok):
    for word in ("alice", "rosalind", "thou", "satan", "heaven"):
        assert tok.tokenize(word) == [word], word


# ----- tasks ----------------------------------------------------------------------------------
TASKS = [dt.next_sentence_task, dt.sentence_order_task, dt.sentiment_task, dt.tagging_task,
         dt.span_task]


@pytest.fixture(scope="module")
def tasks(tok):
    return {f.__name__: f(tok, random_state=0) for f in TASKS}


def _sentences_of(split):
    return {t for texts in split.texts for t in texts}


@pytest.mark.parametrize("make", TASKS, ids=lambda f: f.__name__)
def test_task_shapes_and_masks(make, tasks, tok):
    task = tasks[make.__name__]
    for split in (task.train, task.test):
        n, T = split.input_ids.shape
        assert n == len(split) == len(split.texts) > 20
        assert split.token_type_ids.shape == split.attention_mask.shape == (n, T)
        assert split.input_ids.dtype == split.labels.dtype == np.int64
        assert np.all(split.input_ids[split.attention_mask == 0] == tok.pad_token_id)
        assert np.all(split.input_ids[:, 0] == tok.cls_token_id)
        lengths = split.attention_mask.sum(axis=1)
        assert np.all(split.attention_mask == (np.arange(T) < lengths[:, None]))
        assert np.all(split.input_ids[np.arange(n), lengths - 1] == tok.sep_token_id)
    assert len(task.train) > 3 * len(task.test)


@pytest.mark.parametrize("make", TASKS, ids=lambda f: f.__name__)
def test_task_is_deterministic_by_seed_and_splits_are_disjoint(make, tasks, tok):
    task = tasks[make.__name__]
    again = make(tok, random_state=0)
    other = make(tok, random_state=1)
    for name in ("train", "test"):
        a, b = getattr(task, name), getattr(again, name)
        assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.labels, b.labels)
        assert a.texts == b.texts
    assert task.test.texts != other.test.texts
    if make is dt.span_task:  # questions are rewritten sentences: compare the contexts
        train = {s for _, c in task.train.texts for s in dt.split_sentences(c, 0)}
        test = {s for _, c in task.test.texts for s in dt.split_sentences(c, 0)}
    else:
        train, test = _sentences_of(task.train), _sentences_of(task.test)
    assert not train & test


def _documents_of_texts():
    documents = dt.load_documents()
    doc_of = {s: d for d, doc in enumerate(documents) for s in doc}
    assert len(doc_of) == len(set().union(*map(set, documents)))  # none in two documents
    following = {(a, b) for doc in documents for a, b in zip(doc, doc[1:], strict=False)}
    return doc_of, following


def test_next_sentence_pairs_follow_bert(tasks):
    task = tasks["next_sentence_task"]
    doc_of, following = _documents_of_texts()
    assert task.label_names == ("is_next", "not_next")
    for split in (task.train, task.test):
        a_doc = np.array([doc_of[a] for a, _ in split.texts])
        b_doc = np.array([doc_of[b] for _, b in split.texts])
        for (a, b), label in zip(split.texts, split.labels, strict=True):
            if label == 0:  # the true next sentence of the same document
                assert (a, b) in following
            else:  # a sentence of another document
                assert doc_of[a] != doc_of[b] and (a, b) not in following
        for d in range(3):  # half of each document's examples are negatives ...
            n_neg, n = split.labels[a_doc == d].sum(), (a_doc == d).sum()
            assert n > 50 and abs(2 * n_neg - n) <= 1
            # ... and b's document alone does not give the label away
            shares = [np.mean(b_doc[split.labels == y] == d) for y in (0, 1)]
            assert abs(shares[0] - shares[1]) < 0.06, (d, shares)
        assert len(set(a_doc[:60].tolist())) == 3  # shuffled: a prefix mixes the documents
    assert np.all(task.train.token_type_ids.max(axis=1) == 1)


def test_next_sentence_split_holds_out_blocks_of_every_document(tasks, tok):
    task = tasks["next_sentence_task"]
    doc_of, _ = _documents_of_texts()
    train, test = _sentences_of(task.train), _sentences_of(task.test)
    for d in range(3):
        n_train = sum(doc_of[s] == d for s in train)
        n_test = sum(doc_of[s] == d for s in test)
        assert 0.12 < n_test / (n_train + n_test) < 0.28, (d, n_train, n_test)
    small = dt.next_sentence_task(tok, sentences_per_document=100, random_state=3)
    assert small.train.labels.size > 200 and small.test.labels.size > 30
    assert not _sentences_of(small.train) & _sentences_of(small.test)
    again = dt.next_sentence_task(tok, sentences_per_document=100, random_state=3)
    assert again.test.texts == small.test.texts and again.train.texts == small.train.texts
    with pytest.raises(ValueError, match="leaves a split without two consecutive"):
        dt.next_sentence_task(tok, sentences_per_document=20, test_size=0.9)


def test_sentence_order_labels(tasks, corpus):
    task = tasks["sentence_order_task"]
    pairs = set(zip(corpus, corpus[1:], strict=False))
    for (a, b), label in zip(task.train.texts, task.train.labels, strict=True):
        assert ((b, a) if label else (a, b)) in pairs
    assert 0.4 < task.train.labels.mean() < 0.6


def test_sentiment_labels_follow_the_lexicon(tasks):
    task = tasks["sentiment_task"]
    for split in (task.train, task.test):
        for (text,), label in zip(split.texts, split.labels, strict=True):
            assert dt.sentiment_label(text) == label
        assert split.labels.sum() * 2 == len(split)  # balanced
    assert dt.sentiment_label("She was glad and pleased, not sad.") == 1
    assert dt.sentiment_label("The Queen was angry.") == 0
    assert dt.sentiment_label("The Queen was angry but glad.") is None


def test_tagging_labels_align_to_first_pieces(tasks, tok):
    task = tasks["tagging_task"]
    split = task.train
    n_scored = 0
    for ids, labels, (text,) in zip(split.input_ids, split.labels, split.texts, strict=True):
        tokens = [tok.itos[i] for i in ids]
        words = basic_tokenize(text)
        k = 0
        for t, (token, label) in enumerate(zip(tokens, labels, strict=True)):
            if token in SPECIAL_TOKENS or token.startswith("##"):
                assert label == -100, (text, t, token)
                continue
            word = token
            j = t + 1
            while j < len(tokens) and tokens[j].startswith("##"):
                word += tokens[j][2:]
                j += 1
            assert word == words[k]
            assert task.label_names[label] == dt.word_tag(word)
            k += 1
            n_scored += 1
        assert k == len(words)
    assert set(np.unique(split.labels)) == {-100} | set(range(len(dt.TAG_NAMES)))
    assert n_scored > 5000


def test_word_tags_by_hand():
    tags = [dt.word_tag(w) for w in "the queen , she slowly said something walked cat".split()]
    assert tags == ["DET", "NAME", "PUNCT", "PRON", "ADV", "O", "ING", "ED", "NAME"]


def test_span_labels_point_at_the_name(tasks, tok):
    task = tasks["span_task"]
    for split in (task.train, task.test):
        for ids, types, (start, end), (question, context) in zip(
                split.input_ids, split.token_type_ids, split.labels, split.texts, strict=True):
            assert 0 < start <= end < len(ids)
            assert types[start] == types[end] == 1
            answer = tok.decode(ids[start:end + 1])
            assert dt.word_tag(answer.split()[0]) == "NAME"
            q = question.split()
            filled = [tok.normalize(" ".join(q[:k] + [answer] + q[k + 1:]))
                      for k, w in enumerate(q) if w == "who"]
            assert any(f in tok.normalize(context) for f in filled)


def test_task_bad_input(tok):
    with pytest.raises(TypeError, match="tokenizer must be a WordPieceTokenizer"):
        dt.sentiment_task(tokenizer="bert")
    with pytest.raises(ValueError, match="test_size must be < 1"):
        dt.tagging_task(tok, test_size=1.0)
    with pytest.raises(ValueError, match="max_length must be >= 8"):
        dt.next_sentence_task(tok, max_length=4)
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        dt.corpus_tokenizer(vocab_size=0)


# ----- Hugging Face folders and transformers' BertTokenizerFast ---------------------------------
HARD_TEXTS = [
    "", "   \t\n ", "the [MASK] sat", "x[MASK]y", "[MASK][MASK]", "the [mask] sat", "[MASK",
    "[CLS] inside [SEP] text [PAD]", "Héllo Çafé naïve Ångström e\u0301t\u00e9",
    "我爱北京天安门 and 東京", "ext \U0002b820\U0002b920\U00020000\uf900 x",
    "a\x00b\x07c\u200bd\u200de\ufeff f\u00adg\x85h\u2028i\u2029j\u3000k\ufffdl\x0bm\x1fn",
    "ΟΔΟΣ ΣΑΣ Σ σς", "İstanbul STRASSE ß ﬁne", "🙂 ok 🙂🙂", "e.g., U.S.A.! don't $5^2` #hash",
    "a" * 100, "a" * 101, "b" * 101 + "!", "é" * 60, "é" * 101, "word " * 40,
    "Alice said, \"Off with her head!\" -- and the Queen?",
]


@pytest.fixture(scope="module")
def hard_tok(tok):
    """The corpus vocabulary plus every character of HARD_TEXTS (both forms, both cases)."""
    chars = set("".join(HARD_TEXTS)) | set("".join(HARD_TEXTS).lower())
    chars |= {c for t in HARD_TEXTS for c in __import__("unicodedata").normalize("NFD", t)}
    chars = sorted(c for c in chars if not c.isspace() and c.isprintable())
    extra = [c for c in chars] + [f"##{c}" for c in chars] + ["n't", "'s", "'m", "##'s",
                                                              "strasse", "##nbul"]
    vocab = list(tok.itos) + [t for t in dict.fromkeys(extra) if t not in tok.stoi]
    return WordPieceTokenizer(vocab)


def _hf_tokenizer(folder):
    transformers = pytest.importorskip("transformers")
    return transformers.BertTokenizerFast.from_pretrained(folder)


def _same_encoding(ours, theirs):
    assert ours.ids.tolist() == theirs["input_ids"]
    assert ours.token_type_ids.tolist() == theirs["token_type_ids"]
    assert ours.attention_mask.tolist() == theirs["attention_mask"]


@pytest.mark.parametrize("settings", [
    dict(lowercase=True), dict(lowercase=False), dict(lowercase=False, strip_accents=True),
    dict(lowercase=True, strip_accents=False), dict(lowercase=True, tokenize_chinese_chars=False),
])
def test_encodings_equal_bert_tokenizer_fast_on_hard_text(hard_tok, corpus, tmp_path, settings):
    ours = WordPieceTokenizer(hard_tok.itos, **settings)
    theirs = _hf_tokenizer(ours.save_pretrained(tmp_path / "tok"))
    texts = HARD_TEXTS + list(corpus[:60])
    for text in texts:
        _same_encoding(ours.encode(text), theirs(text))
    for a, b in zip(texts[::2], texts[1::2], strict=False):
        _same_encoding(ours.encode(a, b), theirs(a, b))
    mask = ours.encode("the [MASK] sat, x[MASK]y")
    assert mask.ids.tolist().count(ours.mask_token_id) == 2


def test_truncation_and_padding_equal_bert_tokenizer_fast(tok, corpus, tmp_path):
    theirs = _hf_tokenizer(tok.save_pretrained(tmp_path / "tok"))
    texts = list(corpus[:40])
    for max_length in (3, 4, 5, 8, 13, 30):
        for a, b in zip(texts[::2], texts[1::2], strict=True):
            _same_encoding(tok.encode(a, b, max_length=max_length, truncation=True),
                           theirs(a, b, max_length=max_length, truncation="longest_first"))
        _same_encoding(tok.encode(texts[0], max_length=max_length, truncation=True),
                       theirs(texts[0], max_length=max_length, truncation=True))
    batch = tok.encode_batch(texts[:8], texts[8:16])
    ref = theirs(texts[:8], texts[8:16], padding="longest")
    assert batch.ids.tolist() == ref["input_ids"]
    assert batch.token_type_ids.tolist() == ref["token_type_ids"]
    assert batch.attention_mask.tolist() == ref["attention_mask"]
    batch = tok.encode_batch(texts[:8], max_length=12, truncation=True, padding="max_length")
    ref = theirs(texts[:8], max_length=12, truncation=True, padding="max_length")
    assert batch.ids.tolist() == ref["input_ids"]
    assert batch.attention_mask.tolist() == ref["attention_mask"]


@settings(max_examples=150, deadline=None)
@given(text=st.lists(st.sampled_from(list("ab cX.,'!?#é\u0301ΣσİßÉ\u200b\x00\x85\u2028"
                                          "\u3000我\U0002b820\U0002b920[]")
                                     + ["[MASK]", "[SEP]", "[mask]", "a" * 50]),
                     max_size=30).map("".join))
def test_random_hard_text_equals_bert_tokenizer_fast(hard_tok, tmp_path_factory, text):
    theirs = _hf_tokenizer(_hard_folder(hard_tok, tmp_path_factory))
    _same_encoding(hard_tok.encode(text), theirs(text))
    # a pair through the batch call: its one-pair call drops an empty pair ("" is falsy),
    # the batch call and the Rust tokenizer keep it as an empty second sequence, as nnkit
    pair = theirs([text], [text[::-1]])
    _same_encoding(hard_tok.encode(text, text[::-1]), {k: v[0] for k, v in pair.items()})


_FOLDERS: dict = {}


def _hard_folder(tokenizer, factory):
    if id(tokenizer) not in _FOLDERS:
        _FOLDERS[id(tokenizer)] = tokenizer.save_pretrained(factory.mktemp("hard"))
    return _FOLDERS[id(tokenizer)]


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_decode_equals_bert_tokenizer_fast(hard_tok, tmp_path_factory, data):
    theirs = _hf_tokenizer(_hard_folder(hard_tok, tmp_path_factory))
    pool = [hard_tok.stoi[t] for t in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", ".", ",",
                                       "!", "?", "'", "n't", "'s", "'m", "##'s", "the",
                                       "##s", "alice", "a", "##a", "do")]
    ids = data.draw(st.lists(st.sampled_from(pool) | st.integers(0, hard_tok.vocab_size - 1),
                             max_size=20))
    for skip in (True, False):
        for clean in (True, False):
            assert hard_tok.decode(ids, skip, clean) == theirs.decode(
                ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean), (ids, skip,
                                                                                       clean)


def test_save_and_from_pretrained_keep_the_settings(hard_tok, tmp_path):
    ours = WordPieceTokenizer(hard_tok.itos, lowercase=False, strip_accents=True,
                              tokenize_chinese_chars=False, model_max_length=7,
                              clean_up_tokenization_spaces=True)
    back = WordPieceTokenizer.from_pretrained(ours.save_pretrained(tmp_path / "t"))
    for name in ("itos", "lowercase", "strip_accents", "tokenize_chinese_chars",
                 "model_max_length", "clean_up_tokenization_spaces", "special_tokens"):
        assert getattr(back, name) == getattr(ours, name), name
    assert len(back.encode("a b c d e f g h i j", truncation=True)) == 7  # model_max_length


def test_from_pretrained_reads_a_tokenizer_json_and_other_special_tokens(tmp_path):
    vocab = ["<pad>", "<unk>", "<s>", "</s>", "<mask>", "the", "cat", ".", "##s"]
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps({
        "model": {"type": "WordPiece", "vocab": {t: i for i, t in enumerate(vocab)},
                  "unk_token": "<unk>", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 5},
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "lowercase": True,
                       "handle_chinese_chars": True, "strip_accents": None},
        "pre_tokenizer": {"type": "BertPreTokenizer"}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "pad_token": "<pad>", "cls_token": "<s>", "sep_token": "</s>",
        "mask_token": {"__type": "AddedToken", "content": "<mask>", "lstrip": False}}))
    tok = WordPieceTokenizer.from_pretrained(folder)
    assert tok.encode("The cats<mask>.").tokens == ("<s>", "the", "cat", "##s", "<mask>", ".",
                                                     "</s>")
    assert tok.tokenize("catsss") == ["<unk>"]  # longer than max_input_chars_per_word=5
    assert tok.decode(tok.encode("the cats.").ids) == "the cats."


def test_transformers_5_tokenizer_folder_loads(tok, tmp_path):
    theirs = _hf_tokenizer(tok.save_pretrained(tmp_path / "a"))
    theirs.save_pretrained(tmp_path / "b")  # transformers 5: tokenizer.json, no vocab.txt
    ours = WordPieceTokenizer.from_pretrained(tmp_path / "b")
    assert ours.itos == tok.itos
    text = "Alice was beginning to get very tired [MASK]!"
    _same_encoding(ours.encode(text), theirs(text))


def test_tokenizer_folder_errors_name_the_file_and_field(tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        WordPieceTokenizer.from_pretrained(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"vocab.txt' does not exist \(nor tokenizer"):
        WordPieceTokenizer.from_pretrained(tmp_path / "empty")
    folder = tok.save_pretrained(tmp_path / "t")
    (folder / "tokenizer_config.json").write_text('{"do_lower_case": "yes"}')
    with pytest.raises(ValueError, match=r"tokenizer_config.json': field 'do_lower_case' = "
                                         r"'yes': expected true or false"):
        WordPieceTokenizer.from_pretrained(folder)
    (folder / "tokenizer_config.json").write_text('{"mask_token": "<mask>"}')
    with pytest.raises(ValueError, match=r"t': vocab lacks the special token\(s\) <mask>"):
        WordPieceTokenizer.from_pretrained(folder)
    (folder / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match=r"tokenizer_config.json' is not valid JSON"):
        WordPieceTokenizer.from_pretrained(folder)
    (folder / "tokenizer_config.json").unlink()
    (folder / "vocab.txt").unlink()
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(ValueError, match=r"field 'model.type' = 'BPE': .*WordPiece models only"):
        WordPieceTokenizer.from_pretrained(folder)


def test_special_tokens_inside_text_and_greek_sigma_by_hand():
    t = _toy(["the", "sat", "x", "y", "[", "mask", "]", "σ", "ο", "δ", "##ο", "##δ", "##σ"])
    assert t.tokenize("the [MASK] sat x[MASK]y") == ["the", "[MASK]", "sat", "x", "[MASK]",
                                                      "y"]
    assert t.tokenize("[mask]") == ["[", "mask", "]"]  # not the special token: as written
    assert t.tokenize("ΟΔΟΣ") == ["ο", "##δ", "##ο", "##σ"]  # per character: never final ς
    # U+2B820 is outside the Rust tokenizer's CJK ranges (U+2B920 is inside): one word with
    # the ASCII letter beside it, as BertTokenizerFast splits it
    assert basic_tokenize("a\U0002b820b a\U0002b920b") == ["a\U0002b820b", "a", "\U0002b920",
                                                             "b"]
