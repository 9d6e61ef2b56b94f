"""What a Hugging Face user types first runs as written on nnkit's tokenizer and models.

- ``tok(texts, padding=True)``, ``enc["input_ids"]``, ``model(**enc)``: the tokenizer is
  callable with BertTokenizerFast's arguments, its BatchEncoding a Mapping with transformers'
  keys (nnkit's attribute names kept), BERT models take those keys as keywords, ViT takes
  ``pixel_values``; the call equals BertTokenizerFast's output over every padding,
  truncation, max_length and return_tensors choice on single texts, batches and pairs;
- ``SentenceEncoder.from_pretrained`` of a sentence-transformers folder equals
  sentence-transformers' ``encode`` on tiny random checkpoints (each pooling mode, with and
  without Normalize), and refuses hostile modules.json files by name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import pytest
from helpers import import_transformers
from test_text_hostile import _folder, _tokenizer_json

import nnkit as nk
from nnkit.models import Bert, BertForSequenceClassification, SentenceEncoder, ViT
from nnkit.models.sentence import _POOLING_FIELDS, POOLING_MODES
from nnkit.text import BatchEncoding, WordPieceTokenizer

A = ["The cats sat.", "a b", "", "ab ab ba x", "<x1> the cat", "x <s> new"]
B = ["a", "the cats sat . a b ab", "x", "", "b b", "cat cat cat"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _folder(tmp_path_factory.mktemp("tok"), tokenizer_json=_tokenizer_json())


@pytest.fixture(scope="module")
def tok(folder):
    return WordPieceTokenizer.from_pretrained(folder)


def _plain(enc):
    if isinstance(enc, Exception):
        return "error"
    return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in enc.items()}


def _called(tokenizer, *args, **kwargs):
    try:
        return tokenizer(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 -- both must refuse the same calls
        return exc


# ----- the snippets, as written ----------------------------------------------------------------
def test_the_snippets_run_as_written(tok):
    texts = ["the cats sat.", "a b"]
    enc = tok(texts, padding=True)
    assert isinstance(enc, Mapping) and list(enc) == ["input_ids", "token_type_ids",
                                                      "attention_mask"]
    assert enc["input_ids"] == [[2, 5, 6, 7, 8, 9, 3], [2, 10, 11, 3, 0, 0, 0]]
    assert enc["attention_mask"][1] == [1, 1, 1, 1, 0, 0, 0] and len(enc) == 3
    assert enc.ids is enc["input_ids"] is enc.input_ids  # the old names are aliases
    assert enc[1].tokens == enc.encodings[1].tokens == tuple(enc.tokens(1))
    bert = Bert(len(tok), 16, 1, 2, 32, 16, dropout=0.0).eval()
    seq, pooled = bert(**enc)
    ref, _ = bert(np.array(enc["input_ids"]), np.array(enc["token_type_ids"]),
                  np.array(enc["attention_mask"]))
    np.testing.assert_array_equal(seq.data, ref.data)
    classifier = BertForSequenceClassification(bert, 3).eval()
    assert classifier(**tok(texts, padding=True, return_tensors="np")).logits.shape == (2, 3)
    assert dict(enc) == {k: enc[k] for k in enc.keys()}


def test_encode_batch_keeps_its_arrays_and_attributes(tok):
    batch = tok.encode_batch(["the cats", "a"])
    assert isinstance(batch, BatchEncoding) and batch.ids.shape == (2, 5)
    assert batch["input_ids"] is batch.ids and batch["attention_mask"] is batch.attention_mask
    assert len(batch.encodings) == 2


def test_single_text_is_unbatched_unless_np(tok):
    enc = tok("a b")
    assert enc["input_ids"] == [2, 10, 11, 3] and enc.token_type_ids == [0, 0, 0, 0]
    arrays = tok("a b", return_tensors="np")
    assert arrays["input_ids"].shape == (1, 4) and arrays["input_ids"].dtype == np.int64
    with pytest.raises(ValueError, match="different lengths"):
        tok(["a b", "a"], return_tensors="np")
    with pytest.raises(ValueError, match="return_tensors"):
        tok("a", return_tensors="pt")


def test_vit_takes_pixel_values_from_its_processor():
    vit = ViT(8, 4, 3, 5, dim=16, depth=1, heads=2, mlp_dim=32).eval()
    images = np.random.default_rng(0).integers(0, 256, (2, 11, 9, 3), dtype=np.uint8)
    inputs = vit.image_processor()(images)
    assert set(inputs) == {"pixel_values"}
    np.testing.assert_array_equal(vit(**inputs).data, vit(vit.preprocess(images)).data)
    np.testing.assert_array_equal(
        inputs["pixel_values"], nk.models.ViTImageProcessor(size=8)(images)["pixel_values"])
    with pytest.raises(TypeError, match="one of the two"):
        vit(inputs["pixel_values"], pixel_values=inputs["pixel_values"])


# ----- equal to BertTokenizerFast ----------------------------------------------------------
@pytest.mark.parametrize("padding", [False, True, "longest", "max_length", "do_not_pad"])
def test_call_equals_bert_tokenizer_fast(tok, folder, padding):
    theirs = import_transformers().BertTokenizerFast.from_pretrained(folder)
    calls = [(A[0],), (A,), (A[0], B[0]), (A, B), (A[3], B[1]), (A[1], "")]
    compared = 0
    for truncation in (None, False, True, "longest_first", "only_first", "only_second",
                       "do_not_truncate"):
        for max_length in (None, 0, 2, 3, 4, 5, 9):
            if padding == "max_length" and max_length is None:
                continue
            for args in calls:
                for return_tensors in (None, "np"):
                    kwargs = dict(padding=padding, truncation=truncation,
                                  max_length=max_length, return_tensors=return_tensors)
                    ref = _called(theirs, *args, **kwargs)
                    if (return_tensors and not isinstance(ref, Exception)
                            and np.asarray(ref["input_ids"], dtype=object).ndim != 2):
                        continue  # transformers returns ragged arrays as a list; nnkit refuses
                    ours = _called(tok, *args, **kwargs)
                    assert _plain(ours) == _plain(ref), (args, kwargs, ours)
                    compared += 1
    assert compared > 300


def test_call_without_special_tokens_equals_bert_tokenizer_fast(tok, folder):
    theirs = import_transformers().BertTokenizerFast.from_pretrained(folder)
    for max_length in (None, 0, 1, 3):
        kwargs = dict(add_special_tokens=False, truncation=True, max_length=max_length,
                      padding=True)
        assert _plain(tok(A, B, **kwargs)) == _plain(theirs(A, B, **kwargs))


# ----- SentenceEncoder -------------------------------------------------------------------------
def _sentence_folder(tmp_path, modes, normalize, max_seq_length=None):
    """A tiny random BERT saved by sentence-transformers with ``modes`` pooling."""
    transformers = import_transformers()
    st = pytest.importorskip("sentence_transformers")
    import torch
    from sentence_transformers.sentence_transformer import modules as st_modules

    torch.manual_seed(len(modes) + normalize)
    config = transformers.BertConfig(vocab_size=len(_tokenizer_json()["model"]["vocab"]),
                                     hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=24)
    base = tmp_path / "base"
    transformers.BertModel(config).save_pretrained(base)
    _folder(base, tokenizer_json=_tokenizer_json())
    module = st_modules.Transformer(str(base), max_seq_length=max_seq_length)
    modules = [module, st_modules.Pooling(16, pooling_mode=modes)]
    if normalize:
        modules.append(st_modules.Normalize())
    model = st.SentenceTransformer(modules=modules, device="cpu")
    model.save(str(tmp_path / "st"))
    return tmp_path / "st", model


@pytest.mark.parametrize("modes, normalize, max_seq_length", [
    (("mean",), True, None), (("cls",), False, 6),
    (("max", "mean_sqrt_len_tokens"), False, None), (("mean", "cls", "weightedmean"), True, 5)])
def test_sentence_encoder_equals_sentence_transformers(tmp_path, modes, normalize,
                                                       max_seq_length):
    path, theirs = _sentence_folder(tmp_path, list(modes), normalize, max_seq_length)
    ours = SentenceEncoder.from_pretrained(path)
    texts = A + B
    ref = theirs.encode(texts, batch_size=4)
    got = ours.encode(texts, batch_size=3)
    assert got.dtype == np.float32 and got.shape == ref.shape == (12, 16 * len(modes))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=2e-6)
    single = ours.encode(A[0], normalize_embeddings=True)
    np.testing.assert_allclose(single, theirs.encode(A[0], normalize_embeddings=True),
                               rtol=1e-5, atol=2e-6)
    assert ours.encode([]).shape == (0, ours.dim)
    if list(modes) == sorted(modes, key=POOLING_MODES.index):  # the older boolean fields
        config = path / "1_Pooling" / "config.json"
        config.write_text(json.dumps({"word_embedding_dimension": 16, **{
            field: mode in modes for field, mode in _POOLING_FIELDS.items()}}))
        np.testing.assert_allclose(SentenceEncoder.from_pretrained(path).encode(texts), ref,
                                   rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("modules, match", [
    ({"not": "a list"}, "not a list of modules"),
    ([{"type": "os.system", "path": ""}], "field 'type'"),
    ([{"type": "sentence_transformers.models.Transformer", "path": "../x"}], "field 'path'"),
    ([{"type": "sentence_transformers.models.Transformer", "path": 7}], "expected a string"),
    ([{"type": "sentence_transformers.models.Dense", "path": "2_Dense"}], "field 'type'"),
    ([{"type": "sentence_transformers.models.Transformer", "path": ""}], "no Pooling"),
])
def test_hostile_modules_json_is_refused_by_name(tmp_path, modules, match):
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match=match) as error:
        SentenceEncoder.from_pretrained(tmp_path)
    assert "modules.json" in str(error.value)


@pytest.mark.parametrize("config, match", [
    ({"word_embedding_dimension": 16, "pooling_mode_mean_tokens": "yes"}, "expected a boolean"),
    ({"word_embedding_dimension": 15, "pooling_mode_mean_tokens": True}, "hidden size is 16"),
    ({"word_embedding_dimension": 16}, "no pooling mode"),
    ({"word_embedding_dimension": 16, "pooling_mode": "__import__"}, "pooling_mode"),
])
def test_hostile_pooling_config_is_refused_by_name(tmp_path, config, match):
    bert = Bert(len(_tokenizer_json()["model"]["vocab"]), 16, 1, 2, 32, 16)
    bert.save_pretrained(tmp_path)
    _folder(tmp_path, tokenizer_json=_tokenizer_json())
    _folder(tmp_path / "1_Pooling", config_json=config)
    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(ValueError, match=match):
        SentenceEncoder.from_pretrained(tmp_path)
