"""A Hugging Face tokenizer folder is hostile input to WordPieceTokenizer.from_pretrained.

- memory: a ``model_max_length`` whose padded encoding would not fit in ``max_bytes`` is
  refused at load (and the per-token figure bounds what padding really allocates); files
  are size-bounded; a vocabulary whose prefix tables would not fit is refused;
- time: the greedy longest-match-first cut walks prefix tables, so a 1 MB word under a
  10**9 ``max_input_chars_per_word`` takes well under a second; it equals the old cubic
  search (transcribed below as the naive twin) on random vocabularies and words;
- what transformers reads, nnkit reads the same way (``tokenizer_class``,
  special_tokens_map.json, added tokens, extra special tokens) or refuses by name; every
  tokenizer.json field nnkit reads has the JSON type the tokenizers package requires;
- errors are ValueErrors naming the file and the field, quoting a short prefix of content;
- saving replaces a planted symlink instead of writing through it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time

import pytest
from helpers import import_transformers, peak_and_seconds
from hypothesis import given, settings
from hypothesis import strategies as st

from nnkit._budget import MAX_BYTES
from nnkit.text import PREFIX, SPECIAL_TOKENS, WordPieceTokenizer, _Matcher

MB = 1 << 20
SPECIALS = list(SPECIAL_TOKENS)
WORDS = ["the", "cat", "##s", "sat", ".", "a", "b", "##a", "##b", "ab", "##ab", "<", ">", "x",
         "<unk>", "<s>", "</s>", "<foo>", "new"]
VOCAB = SPECIALS + WORDS
TEXTS = ["The cats sat.", "the <x1> cat <X1>", "the<x1>cat<x2>s", "a <x2> b", "<x1><x2><x1>",
         "[MASK]<x1>[mask] <unk> <UNK>", "x<s>y </s> <foo>", "ab ab ba", ""]


# ----- folders ---------------------------------------------------------------------------------
def _added(i, content, special=False, normalized=True, **flags):
    return {"id": i, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special, **flags}


def _tokenizer_json(vocab=VOCAB, added=(), **model):
    """A tokenizer.json the tokenizers package reads: BERT's pipeline, no post-processor."""
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [_added(i, t, True, False) for i, t in enumerate(SPECIALS)]
            + list(added),
            "normalizer": {"type": "BertNormalizer", "clean_text": True,
                           "handle_chinese_chars": True, "strip_accents": None,
                           "lowercase": True},
            "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": None,
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
            "model": {"type": "WordPiece", "unk_token": "[UNK]",
                      "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                      "vocab": {t: i for i, t in enumerate(vocab)}, **model}}


def _folder(path, **files):
    """A folder of ``files`` (name with '.' as '_': dicts as JSON, str as text)."""
    path.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        name = name.replace("_json", ".json").replace("vocab_txt", "vocab.txt")
        text = content if isinstance(content, str) else json.dumps(content)
        (path / name).write_text(text, encoding="utf-8")
    return path


def _vocab_txt(tokens=VOCAB):
    return "\n".join(tokens) + "\n"


def _refused(folder, field, file="tokenizer_config.json", **kwargs):
    """The message of the ValueError from_pretrained raises; asserts it names the file and
    the field and came fast and small."""
    result, peak, seconds = peak_and_seconds(WordPieceTokenizer.from_pretrained, folder,
                                             **kwargs)
    assert isinstance(result, ValueError), result
    message = str(result)
    assert f"'{folder / file}'" in message and f"field '{field}'" in message, message
    assert peak < 8 * MB and seconds < 2, (peak, seconds)
    return message


def _same(ours, theirs, texts=TEXTS):
    """Our encodings (single and paired), length and decoding equal transformers' ones."""
    for a, b in zip(texts, texts[::-1], strict=True):
        for enc, ref in ((ours.encode(a), theirs(a)),
                         (ours.encode(a, b), {k: v[0] for k, v in theirs([a], [b]).items()})):
            assert enc.ids.tolist() == ref["input_ids"], (a, enc.tokens)
            assert enc.token_type_ids.tolist() == ref["token_type_ids"], a
            assert enc.attention_mask.tolist() == ref["attention_mask"], a
        ids = ours.encode(a).ids.tolist()
        for skip in (True, False):
            assert ours.decode(ids, skip) == theirs.decode(ids, skip_special_tokens=skip), a
    assert (len(ours), ours.vocab_size) == (len(theirs), theirs.vocab_size)


def _both(folder):
    """transformers' BertTokenizerFast and AutoTokenizer of ``folder`` (skips without it)."""
    transformers = import_transformers()
    return (transformers.BertTokenizerFast.from_pretrained(folder),
            transformers.AutoTokenizer.from_pretrained(folder))


# ----- 1. memory -------------------------------------------------------------------------------
def test_a_model_max_length_past_max_bytes_is_refused_at_load(tmp_path):
    # padding to 2**24 tokens allocated 4.9 GB, then MemoryError
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(), tokenizer_config_json={
        "model_max_length": 2**24})
    message = _refused(folder, "model_max_length")
    assert f"= {2**24}:" in message and f"takes {80 * 2**24} bytes" in message
    assert f"max_bytes={MAX_BYTES}" in message and "None" in message
    trusted = WordPieceTokenizer.from_pretrained(folder, max_bytes=None)
    assert trusted.model_max_length == 2**24
    assert trusted.encode("a b", truncation=True).tokens == ("[CLS]", "a", "b", "[SEP]")


def test_the_per_token_figure_bounds_what_padding_allocates(tmp_path):
    n = 2**16
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(), tokenizer_config_json={
        "model_max_length": n})
    tok = WordPieceTokenizer.from_pretrained(folder, max_bytes=80 * n)
    batch, peak, _ = peak_and_seconds(tok.encode_batch, ["a b"], padding="max_length",
                                      truncation=True)
    assert batch.ids.shape == (1, n) and peak <= 80 * n + 4096, peak  # + the unpadded part
    _refused(folder, "model_max_length", max_bytes=80 * n - 1)


@pytest.mark.parametrize("marker", [1000000000000000019884624838656, 2**63, 2**64 + 1, None])
def test_no_limit_markers_are_ignored(tmp_path, marker):
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(),
                     tokenizer_config_json={"model_max_length": marker})
    assert WordPieceTokenizer.from_pretrained(folder).model_max_length is None


@pytest.mark.parametrize("value", ["512", 512.0, 0, -1, True, [512]])
def test_a_wrongly_typed_model_max_length_is_refused(tmp_path, value):
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(),
                     tokenizer_config_json={"model_max_length": value})
    assert "expected an integer >= 1" in _refused(folder, "model_max_length")


def test_max_bytes_must_be_an_int_or_none(tmp_path):
    folder = _folder(tmp_path, vocab_txt=_vocab_txt())
    with pytest.raises(TypeError, match="max_bytes must be an integer"):
        WordPieceTokenizer.from_pretrained(folder, max_bytes="1")
    with pytest.raises(ValueError, match="max_bytes must be >= 0"):
        WordPieceTokenizer.from_pretrained(folder, max_bytes=-1)


@pytest.mark.parametrize("name, size", [("vocab.txt", 64 * MB + 1), ("tokenizer.json", 64 * MB + 1),
                                        ("tokenizer_config.json", 16 * MB + 1),
                                        ("special_tokens_map.json", 16 * MB + 1)])
def test_files_past_their_size_bound_are_refused_before_reading(tmp_path, name, size):
    folder = _folder(tmp_path, vocab_txt=_vocab_txt())
    with open(folder / name, "wb") as f:
        f.truncate(size)  # sparse: nothing is written
    error, peak, seconds = peak_and_seconds(WordPieceTokenizer.from_pretrained, folder)
    assert isinstance(error, ValueError), error
    assert f"'{folder / name}' is {size} bytes long, more than the {size - 1}" in str(error)
    assert peak < MB and seconds < 1


def test_a_vocabulary_past_max_bytes_is_refused_before_its_tables(tmp_path):
    # prefix tables cost the square of a piece's length under a huge word limit
    long_token = "a" * 3000
    folder = _folder(tmp_path, tokenizer_json=_tokenizer_json(
        VOCAB + [long_token], max_input_chars_per_word=10**9))
    error, peak, seconds = peak_and_seconds(WordPieceTokenizer.from_pretrained, folder,
                                            max_bytes=2 * MB)
    assert isinstance(error, ValueError), error
    assert str(error).startswith(f"'{folder / 'tokenizer.json'}': its 25 tokens (up to 3000 "
                                 "characters) would take about")
    assert "max_input_chars_per_word=1000000000" in str(error) and peak < MB
    assert WordPieceTokenizer.from_pretrained(folder).tokenize(long_token) == [long_token]
    lines = _folder(tmp_path / "lines", vocab_txt=_vocab_txt(VOCAB + [f"w{i}" for i in
                                                                     range(20000)]))
    error, peak, _ = peak_and_seconds(WordPieceTokenizer.from_pretrained, lines, max_bytes=MB)
    assert isinstance(error, ValueError) and "has up to 20025 lines" in str(error), error
    assert peak < MB  # refused before the lines were split


# ----- 2. time: the greedy cut walks prefix tables ---------------------------------------------
def _naive_pieces(vocab: set, word: str, limit: int, unk="[UNK]") -> list[str]:
    """nnkit's old cut, transcribed: from each start, every end from the word's end down."""
    if len(word) > limit:
        return [unk]
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = word[start:end] if start == 0 else PREFIX + word[start:end]
            if piece in vocab:
                break
            end -= 1
        if end == start:
            return [unk]
        pieces.append(piece)
        start = end
    return pieces


_PIECE = st.text("ab#c", min_size=1, max_size=5)


@settings(max_examples=300, deadline=None)
@given(pieces=st.sets(_PIECE | _PIECE.map(lambda p: PREFIX + p), max_size=20),
       words=st.lists(st.text("ab#c", min_size=1, max_size=12), min_size=1, max_size=10),
       limit=st.integers(1, 14))
def test_the_cut_equals_the_old_greedy_longest_match(pieces, words, limit):
    vocab = SPECIALS + sorted(pieces - set(SPECIALS))
    tok = WordPieceTokenizer(vocab, max_input_chars_per_word=limit)
    for word in words:
        assert tok._word_pieces(word) == _naive_pieces(set(vocab), word, limit), word
        assert tok._word_pieces(word) == _naive_pieces(set(vocab), word, limit)  # cached


@settings(max_examples=200, deadline=None)
@given(tokens=st.sets(st.text("ab[]", min_size=1, max_size=4), max_size=8),
       text=st.text("ab[] ", max_size=30))
def test_added_token_matching_equals_a_leftmost_longest_regex(tokens, text):
    ordered = sorted(tokens, key=lambda t: (-len(t), t))
    regex = re.compile("(" + "|".join(map(re.escape, ordered)) + ")") if ordered else None
    parts = regex.split(text) if regex else [text]
    expected = [(part, i % 2 == 1) for i, part in enumerate(parts) if part]
    assert _Matcher(tokens).split(text) == expected


def _seconds(fn, *args):
    start = time.perf_counter()  # not peak_and_seconds: tracemalloc slows 500k slices 7-fold
    return fn(*args), time.perf_counter() - start


def test_a_1mb_word_under_a_huge_limit_is_cut_in_linear_time(tmp_path):
    # the old cubic search: 0.2 s for 1 KB, 9 s for 4 KB, minutes for 1 MB
    folder = _folder(tmp_path, tokenizer_json=_tokenizer_json(max_input_chars_per_word=10**9))
    tok = WordPieceTokenizer.from_pretrained(folder)
    word = "ab" * 500_000
    pieces, seconds = _seconds(tok.tokenize, word)
    assert pieces == ["ab"] + ["##ab"] * 499_999 and seconds < 2, seconds  # 0.75 s here
    unknown, seconds = _seconds(tok.tokenize, word + "z")
    assert unknown == ["[UNK]"] and seconds < 2, seconds
    pieces, peak, _ = peak_and_seconds(tok.tokenize, "ba" * 50_000)  # 100 KB, 50k pieces
    assert len(pieces) == 50_001 and peak < 4 * MB, peak


def test_a_long_word_is_cut_as_the_tokenizers_package_cuts_it(tmp_path):
    # transformers' AutoTokenizer runs tokenizer.json as it is when the folder names no class
    folder = _folder(tmp_path, tokenizer_json=_tokenizer_json(max_input_chars_per_word=10**9))
    tok = WordPieceTokenizer.from_pretrained(folder)
    theirs = _both(folder)[1]
    for text in ["ab" * 150 + "a", "ab" * 150 + "z", "ba" * 120, "The cats sat."]:
        assert tok.encode(text, add_special_tokens=False).ids.tolist() == theirs(
            text, add_special_tokens=False)["input_ids"], text


# ----- 3. what transformers reads, read the same way -------------------------------------------
def test_a_tokenizer_class_other_than_berts_is_refused(tmp_path):
    # a BertJapaneseTokenizer with subword_tokenizer_type character cuts into characters
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(), tokenizer_config_json={
        "tokenizer_class": "BertJapaneseTokenizer", "subword_tokenizer_type": "character"})
    message = _refused(folder, "tokenizer_class")
    assert "= 'BertJapaneseTokenizer': nnkit reads BERT's WordPiece tokenizer only" in message
    for name in ["DistilBertTokenizer", "bert", "", 5, ["BertTokenizer"]]:
        _folder(folder, tokenizer_config_json={"tokenizer_class": name})
        _refused(folder, "tokenizer_class")
    for name in ["BertTokenizer", "BertTokenizerFast", "ElectraTokenizerFast", None]:
        _folder(folder, tokenizer_config_json={"tokenizer_class": name})
        assert WordPieceTokenizer.from_pretrained(folder).tokenize("cats") == ["cat", "##s"]


def test_the_accepted_class_names_are_berttokenizer_in_transformers(tmp_path):
    transformers = import_transformers()
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    from nnkit.text import _BERT_CLASSES
    assert all(tokenizer_class_from_name(name) is transformers.BertTokenizer
               for name in _BERT_CLASSES)
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(),
                     tokenizer_config_json={"tokenizer_class": "ElectraTokenizer"})
    _same(WordPieceTokenizer.from_pretrained(folder), _both(folder)[1])


@pytest.mark.parametrize("with_decoder", [False, True])
def test_special_tokens_map_is_read_with_transformers_precedence(tmp_path, with_decoder):
    # the map's tokens win over the config's, unless the config has added_tokens_decoder
    config = {"tokenizer_class": "BertTokenizer", "unk_token": "[UNK]",
              **({"added_tokens_decoder": {}} if with_decoder else {})}
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(), tokenizer_config_json=config,
                     special_tokens_map_json={"unk_token": "<unk>", "mask_token": {
                         "content": "<s>", "normalized": True}})
    ours = WordPieceTokenizer.from_pretrained(folder)
    assert ours.special_tokens["unk_token"] == ("[UNK]" if with_decoder else "<unk>")
    for theirs in _both(folder):
        _same(ours, theirs)


@pytest.mark.parametrize("value, field, expected", [
    (5, "unk_token", "expected a non-empty token without whitespace, or an object"),
    (None, "unk_token", "expected a non-empty token"),
    ("a b", "unk_token", "expected a non-empty token"),
    ({"content": "<unk>", "normalized": "yes"}, "unk_token.normalized", "expected true or"),
    ({"content": 5}, "unk_token.content", "expected a non-empty token")])
def test_a_wrongly_typed_special_token_is_refused(tmp_path, value, field, expected):
    # transformers fails on them (a null unk_token: "Missing [UNK] token from the vocabulary")
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(),
                     special_tokens_map_json={"unk_token": value})
    assert expected in _refused(folder, field, "special_tokens_map.json")


def test_added_tokens_of_tokenizer_json_are_honoured(tmp_path):
    # a token <x1> added with a new id came out as three [UNK]
    added = [_added(len(VOCAB), "<x1>", lstrip=True, rstrip=True),
             _added(len(VOCAB) + 1, "<x2>", special=True, normalized=False),
             _added(VOCAB.index("new"), "new", special=True)]
    folder = _folder(tmp_path, tokenizer_json=_tokenizer_json(added=added),
                     tokenizer_config_json={"tokenizer_class": "BertTokenizer"})
    ours = WordPieceTokenizer.from_pretrained(folder)
    assert ours.encode("the<X1>cat <x2>", add_special_tokens=False).tokens == (
        "the", "<x1>", "cat", "<x2>")
    assert (len(ours), ours.vocab_size, ours.token_to_id("<x2>")) == (26, 24, 25)
    for theirs in _both(folder):
        _same(ours, theirs, TEXTS + ["news new renew NEW"])


def test_added_tokens_of_the_config_are_honoured(tmp_path):
    decoder = {str(len(VOCAB)): {"content": "<x1>", "special": False},
               str(len(VOCAB) + 1): {"content": "<x2>", "special": True, "normalized": False}}
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(), tokenizer_config_json={
        "tokenizer_class": "BertTokenizer", "added_tokens_decoder": decoder})
    ours = WordPieceTokenizer.from_pretrained(folder)
    for theirs in _both(folder):
        _same(ours, theirs)
    back = WordPieceTokenizer.from_pretrained(ours.save_pretrained(tmp_path / "back"))
    assert back.itos == ours.itos and back._added == ours._added
    _same(back, _both(tmp_path / "back")[0])


def test_extra_special_tokens_are_split_out_as_transformers_does(tmp_path):
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(), tokenizer_config_json={
        "tokenizer_class": "BertTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "foo_token": {"__type": "AddedToken", "content": "<foo>"}, "add_bos_token": True,
        "additional_special_tokens": ["new"]})
    ours = WordPieceTokenizer.from_pretrained(folder)
    assert ours.tokenize("x<s>y <foo>new") == ["x", "<s>", "[UNK]", "<foo>", "new"]
    for theirs in _both(folder):
        _same(ours, theirs)
    _folder(folder, tokenizer_config_json={"eos_token": "<zz>"})
    assert "a special token outside the vocabulary" in _refused(folder, "eos_token")


@pytest.mark.parametrize("entry, field, expected", [
    (_added(24, "<x1>", single_word=True), "added_tokens[5].single_word", "expected false"),
    (_added(25, "<x1>"), "added_tokens[5]", "gives it the id 24"),
    (_added(24, "cat"), "added_tokens[5]", "gives it the id 6"),
    (_added(24, "<X1>"), "added_tokens[5]", "makes it '<x1>'"),
    (_added(24, "x y"), "added_tokens[5].content", "expected a non-empty token"),
    (_added(24, "<x1>", special="yes"), "added_tokens[5].special", "expected true or false"),
    (_added("24", "<x1>"), "added_tokens[5].id", "expected an id"),
    ({"id": 24, "content": "<x1>"}, "added_tokens[5].special", "is missing")])
def test_added_tokens_nnkit_cannot_match_are_refused_by_name(tmp_path, entry, field, expected):
    folder = _folder(tmp_path, tokenizer_json=_tokenizer_json(added=[entry]))
    assert expected in _refused(folder, field, "tokenizer.json")


def test_disagreeing_vocabularies_and_added_tokens_are_refused(tmp_path):
    folder = _folder(tmp_path, vocab_txt=_vocab_txt(VOCAB[:-1] + ["old"]),
                     tokenizer_json=_tokenizer_json())
    message = _refused(folder, "model.vocab", "vocab.txt")
    assert f"'{folder / 'tokenizer.json'}'" in message and "'old' and 'new'" in message
    _folder(folder, vocab_txt=_vocab_txt(), tokenizer_json=_tokenizer_json(
        added=[_added(24, "<x1>")]), tokenizer_config_json={"added_tokens_decoder": {}})
    assert "list different added tokens" in _refused(folder, "added_tokens_decoder")
    _folder(folder, tokenizer_json=_tokenizer_json(), tokenizer_config_json={},
            added_tokens_json={"<x1>": 24})
    error, _, _ = peak_and_seconds(WordPieceTokenizer.from_pretrained, folder)
    assert f"'{folder / 'added_tokens.json'}': nnkit does not read" in str(error)


_TOKENIZERS_REFUSE = [
    ("normalizer", "lowercase", "false"), ("normalizer", "lowercase", 0),
    ("normalizer", "handle_chinese_chars", "no"), ("normalizer", "clean_text", "yes"),
    ("normalizer", "strip_accents", "x"), ("normalizer", "lowercase", None),
    ("model", "max_input_chars_per_word", "5"), ("model", "max_input_chars_per_word", 5.0),
    ("model", "max_input_chars_per_word", -1), ("model", "max_input_chars_per_word", True),
    ("model", "max_input_chars_per_word", 2**64), ("model", "unk_token", 5),
    ("model", "unk_token", None), ("model", "continuing_subword_prefix", 5),
    ("model", "vocab", {"a": "1"}), ("model", "vocab", {"a": 1.0}), ("model", "vocab", []),
    (None, "normalizer", []), (None, "normalizer", "BertNormalizer"),
    (None, "pre_tokenizer", "BertPreTokenizer"), (None, "pre_tokenizer", []),
    (None, "added_tokens", {}), (None, "added_tokens", None)]


@pytest.mark.parametrize("part, name, value", _TOKENIZERS_REFUSE)
def test_a_tokenizer_json_field_the_tokenizers_package_refuses_is_refused(tmp_path, part, name,
                                                                         value):
    # "lowercase": "false" lowercased, "max_input_chars_per_word": "5" became 100, ...
    data = _tokenizer_json()
    (data[part] if part else data)[name] = value
    folder = _folder(tmp_path, tokenizer_json=data)
    field = f"{part}.{name}" if part else name
    message = _refused(folder, field, "tokenizer.json")
    assert "expected" in message and "Error" not in message
    tokenizers = pytest.importorskip("tokenizers")
    with pytest.raises(Exception, match="expected|did not match|invalid"):
        tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_a_huge_wrong_value_is_described_not_echoed(tmp_path):
    data = _tokenizer_json()
    data["normalizer"] = [0] * 200_000
    folder = _folder(tmp_path, tokenizer_json=data)
    message = _refused(folder, "normalizer", "tokenizer.json")
    assert "= a list of 200000 items: expected BERT's normalizer" in message
    assert len(message) < 300 and "0, 0" not in message


@pytest.mark.parametrize("part, name, value, setting", [
    ("normalizer", "strip_accents", True, ("strip_accents", True)),
    ("normalizer", "lowercase", False, ("lowercase", False)),
    ("model", "max_input_chars_per_word", 2**64 - 1, ("max_input_chars_per_word", 2**64 - 1)),
    ("model", "unk_token", "<unk>", ("_unk", "<unk>"))])
def test_well_typed_tokenizer_json_fields_are_read(tmp_path, part, name, value, setting):
    data = _tokenizer_json()
    data[part][name] = value
    folder = _folder(tmp_path, tokenizer_json=data)
    pytest.importorskip("tokenizers").Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert getattr(WordPieceTokenizer.from_pretrained(folder), setting[0]) == setting[1]


# ----- 4. raw errors and echoed content --------------------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_special_file_as_vocab_is_refused_without_blocking(tmp_path):
    folder = _folder(tmp_path)
    os.mkfifo(folder / "vocab.txt")  # opening it for reading would block
    for target in (None, "/dev/zero"):
        if target is not None:
            (folder / "vocab.txt").unlink()
            (folder / "vocab.txt").symlink_to(target)
        error, _, seconds = peak_and_seconds(WordPieceTokenizer.from_pretrained, folder)
        assert isinstance(error, ValueError), error
        assert f"'{folder / 'vocab.txt'}' is not a regular file" in str(error)
        assert seconds < 1


def test_errors_quote_a_short_prefix_of_what_a_symlinked_file_holds(tmp_path):
    secret = "list:x:38:38:Mailing List Manager:/var/list:/usr/sbin/nologin-" + "s" * 200
    (tmp_path / "passwd").write_text(f"root:x:0:0::/root:/bin/bash\n{secret}\n")
    folder = _folder(tmp_path / "t")
    (folder / "vocab.txt").symlink_to(tmp_path / "passwd")
    error, _, _ = peak_and_seconds(WordPieceTokenizer.from_pretrained, folder)
    assert isinstance(error, ValueError) and "without whitespace" in str(error), error
    assert secret[:40] in str(error) and secret[40:60] not in str(error)
    (folder / "vocab.txt").unlink()
    (folder / "vocab.txt").write_text(_vocab_txt())
    (tmp_path / "secret.json").write_text(json.dumps({"do_lower_case": secret,
                                                      "mask_token": secret.replace(" ", "")}))
    (folder / "tokenizer_config.json").symlink_to(tmp_path / "secret.json")
    assert secret[40:60] not in _refused(folder, "do_lower_case")
    (tmp_path / "secret.json").write_text(json.dumps({"mask_token": secret.replace(" ", "")}))
    error, _, _ = peak_and_seconds(WordPieceTokenizer.from_pretrained, folder)
    assert "vocab lacks the special token(s)" in str(error) and len(str(error)) < 400, error


# ----- 5. writes that followed symlinks --------------------------------------------------------
def test_saving_replaces_planted_symlinks_instead_of_writing_through_them(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    folder = tmp_path / "saved"
    folder.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json"):
        (folder / name).symlink_to(outside)
    tok = WordPieceTokenizer(VOCAB, lowercase=False, model_max_length=9)
    tok.save_pretrained(folder)
    assert outside.read_text() == "precious\n"
    for name in ("vocab.txt", "tokenizer_config.json"):
        assert stat.S_ISREG(os.lstat(folder / name).st_mode), name
    back = WordPieceTokenizer.from_pretrained(folder)
    assert (back.itos, back.lowercase, back.model_max_length) == (tok.itos, False, 9)
    (folder / "vocab.txt").unlink()
    (folder / "vocab.txt").symlink_to(outside)
    assert tok.save_vocab(folder) == str(folder / "vocab.txt")
    assert outside.read_text() == "precious\n" and not (folder / "vocab.txt").is_symlink()


def test_saving_onto_a_file_names_it(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=f"cannot save to '{re.escape(str(tmp_path / 'file'))}'"
                                         ": it is a file"):
        WordPieceTokenizer(VOCAB).save_pretrained(tmp_path / "file")
