"""Hostile checkpoint folders and files: refused quickly and clearly, nothing written outside.

Each case is a small folder built here (no transformers needed) that once made
``from_pretrained`` or ``nk.load`` allocate gigabytes, raise a raw Python error, or write
through a symlink. Each test asserts the error type, that the message names the file and
the field (or tensor), and, where memory was the problem, a bound on the peak allocation.
"""

from __future__ import annotations

import json
import os
import re
import struct
import warnings
import zlib

import numpy as np
import pytest
from helpers import edit_config, peak_and_seconds

import nnkit as nk
from nnkit._safetensors import FileFormatError, read_file, write_file
from nnkit.models import (
    Bert,
    BertForPreTraining,
    BertForSequenceClassification,
    BertForTokenClassification,
    ViT,
)
from nnkit.models.pretrained import (
    NewlyInitializedWarning,
    UnusedWeightsWarning,
    _body_elements,
    bert_arguments,
    vit_arguments,
)

MB = 1 << 20


@pytest.fixture
def bert_folder(tmp_path):
    nk.manual_seed(5)
    return BertForSequenceClassification(Bert(99, 32, 2, 4, 37, 64), 3).save_pretrained(
        tmp_path / "bert")


@pytest.fixture
def vit_folder(tmp_path):
    nk.manual_seed(6)
    return ViT(8, 2, 3, 3, dim=32, depth=2, heads=4, mlp_dim=37).save_pretrained(
        tmp_path / "vit")


def _add_tensor(folder, name, array):
    tensors, meta = read_file(folder / "model.safetensors")
    tensors[name] = array
    write_file(folder / "model.safetensors", tensors, meta)


def _refused(fn, *args, match, error=ValueError, peak=16 * MB, seconds=5.0, **kwargs):
    """``fn(*args)`` raises ``error`` matching ``match``, within ``peak`` bytes and
    ``seconds``."""
    result, used, took = peak_and_seconds(fn, *args, **kwargs)
    assert isinstance(result, error), result
    assert re.search(match, str(result)), str(result)
    assert used < peak, f"peak {used} bytes before the refusal"
    assert took < seconds, f"{took:.1f} s before the refusal"
    return result


# ----- allocation bounded by what the file pays for ---------------------------------------------
@pytest.mark.parametrize("layers", [400, 2000, 10**9])
def test_a_config_asking_for_thousands_of_layers_is_refused_before_building(bert_folder,
                                                                            layers):
    """A tiny file whose config says 2000 layers of a BERT-large width, plus one 1-element
    tensor of the last layer so the layer counts agree, once reached 5.8 GB."""
    edit_config(bert_folder, num_hidden_layers=layers, hidden_size=1024,
                 num_attention_heads=16, intermediate_size=4096)
    _add_tensor(bert_folder, f"bert.encoder.layer.{layers - 1}.x", np.zeros(1, np.float32))
    _refused(BertForSequenceClassification.from_pretrained, bert_folder,
             match=rf"config.json' describes an encoder of \d+ parameters \(hidden_size=1024, "
                   rf"num_hidden_layers={layers}.* holds \d+ elements")
    # the limit does not matter: the config and the file disagree
    _refused(BertForSequenceClassification.from_pretrained, bert_folder, max_bytes=None,
             match=r"the config and the weights do not match")


def test_a_vit_config_asking_for_thousands_of_layers_is_refused(vit_folder):
    edit_config(vit_folder, num_hidden_layers=2000, hidden_size=1024, num_attention_heads=16,
                 intermediate_size=4096)
    _add_tensor(vit_folder, "vit.encoder.layer.1999.x", np.zeros(1, np.float32))
    _refused(ViT.from_pretrained, vit_folder,
             match=r"config.json' describes an encoder .*num_hidden_layers=2000")


def test_a_huge_hidden_size_is_refused_before_any_allocation(bert_folder):
    edit_config(bert_folder, hidden_size=2**20, num_attention_heads=16)
    _refused(BertForSequenceClassification.from_pretrained, bert_folder, peak=4 * MB,
             match=r"config.json' describes an encoder .*hidden_size=1048576")


def test_a_billion_labels_without_id2label_are_refused_before_naming_them(bert_folder):
    edit_config(bert_folder, id2label=None, label2id=None, num_labels=10**9)
    _refused(BertForSequenceClassification.from_pretrained, bert_folder,
             match=r"config.json' describes a model that needs \d+ bytes for .*"
                   r"num_labels=1000000000")


def test_a_new_head_counts_against_max_bytes_and_none_lifts_it(tmp_path):
    folder = Bert(99, 32, 2, 4, 37, 64).save_pretrained(tmp_path / "encoder-only")
    _refused(BertForSequenceClassification.from_pretrained, folder, num_labels=5000,
             max_bytes=10**6, match=r"needs 640000 bytes for a parameter of shape \(5000, 32\)")
    with pytest.warns(NewlyInitializedWarning):
        model = BertForSequenceClassification.from_pretrained(folder, num_labels=5000,
                                                              max_bytes=None)
    assert model.classifier.weight.shape == (5000, 32)
    with pytest.raises(ValueError, match=r"max_bytes must be an int >= 0 or None"):
        Bert.from_pretrained(folder, max_bytes=-1)


@pytest.mark.parametrize("layers", [400, 4000])
def test_nk_load_counts_the_copies_of_an_encoder_layer(tmp_path, layers):
    """A file of a few hundred bytes describing TransformerEncoder(layer, 4000) once built a
    model of gigabytes: deep copies were not counted by the budget."""
    layer = {"__module__": {"class": "nnkit.nn.transformer:TransformerEncoderLayer",
                            "training": True, "args": [256, 4, 1024], "kwargs": {}}}
    text = json.dumps({"format": "nnkit", "format_version": 2, "nnkit_version": "0",
                       "object": {"__module__": {
                           "class": "nnkit.nn.transformer:TransformerEncoder",
                           "training": True, "args": [layer, layers], "kwargs": {},
                           "state": {}, "shared": {}, "tied": {}}},
                       "complex": [], "tensors": {}})
    path = tmp_path / "encoder.safetensors"
    write_file(path, {}, {"nnkit": text, "nnkit_crc32": str(zlib.crc32(text.encode()))})
    assert path.stat().st_size < 600
    _refused(nk.load, path, error=FileFormatError,
             match=rf"TransformerEncoder\(TransformerEncoderLayer\(\.\.\.\), {layers}\) .* "
                   rf"would allocate \d+ bytes for {layers} copies of a "
                   r"TransformerEncoderLayer")


def test_layer_copies_count_their_python_objects_too():
    """Ten thousand layers of width 2 hold 2 MB of parameters but about 130 MB of Python
    objects: the budget counts both, before the first copy."""
    from nnkit._budget import BudgetExceeded, allocation_budget

    layer = nk.nn.TransformerEncoderLayer(2, 1, 4)
    with allocation_budget(10 * MB), pytest.raises(BudgetExceeded,
                                                   match="10000 copies of a Transformer"):
        nk.nn.TransformerEncoder(layer, 10**4)
    with allocation_budget(10 * MB):
        assert len(nk.nn.TransformerEncoder(layer, 100).layers) == 100


def test_body_elements_count_the_built_encoders_parameters():
    """The arithmetic that refuses a config before building equals the built models'."""
    def body(model, skip):
        return sum(p.data.size for name, p in model.named_parameters()
                   if not name.startswith(skip))

    def fields(**data):
        return nk.models.pretrained._Fields("config.json", data)

    for size in (dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=37, vocab_size=99, max_position_embeddings=64,
                      type_vocab_size=3),
                 dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=5, vocab_size=7, max_position_embeddings=9)):
        args = bert_arguments(fields(model_type="bert", **size))
        assert _body_elements(Bert, args) == body(Bert(**args), ("pooler",))
    for qkv_bias in (True, False):
        args = vit_arguments(fields(model_type="vit", image_size=[8, 12], patch_size=[2, 4],
                                    hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=9, num_channels=2, qkv_bias=qkv_bias))
        assert _body_elements(ViT, args) == body(ViT(**args), ("head",))


# ----- huge tensors -------------------------------------------------------------------------------
def test_a_tensor_larger_than_memory_is_refused_by_name_before_reading(tmp_path, monkeypatch):
    """The machine's memory is made 1 MiB here: a 4 MiB tensor is then refused by name, never
    allocated (numpy's own message named neither the file nor the tensor)."""
    from nnkit import _safetensors

    path = tmp_path / "huge.safetensors"
    write_file(path, {"weight": np.zeros((1024, 1024), np.float32)})
    monkeypatch.setattr(_safetensors, "_physical_memory", lambda: MB)
    _refused(nk.load, path, error=MemoryError,
             match=r"huge.safetensors': tensor 'weight' of shape \(1024, 1024\) needs 4194304 "
                   r"bytes, more than this machine could allocate \(it has 1048576 bytes")


def test_a_huge_tensor_the_model_does_not_use_is_never_read(bert_folder):
    """from_pretrained reads only the tensors the model has a place for, after checking
    their shapes: a 64 MiB extra tensor costs neither memory nor time."""
    _add_tensor(bert_folder, "cls.extra", np.zeros((16, MB), np.float32))
    with pytest.warns(UnusedWeightsWarning, match="cls.extra"):
        (model, info), used, took = peak_and_seconds(
            BertForSequenceClassification.from_pretrained, bert_folder,
            output_loading_info=True)
    assert info["unexpected_keys"] == ["cls.extra"]
    assert used < 16 * MB and took < 5


# ----- raw or misleading errors -----------------------------------------------------------------
def _raw_file(path, header: bytes, data: bytes = b""):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)


def test_a_duplicated_header_field_is_refused(tmp_path):
    path = tmp_path / "dup.safetensors"
    _raw_file(path, b'{"w": {"dtype": "F32", "dtype": "I32", "shape": [1], '
                    b'"data_offsets": [0, 4]}}', b"\0" * 4)
    with pytest.raises(FileFormatError, match=r"dup.safetensors': the header has the key "
                                              r"'dtype' twice"):
        read_file(path)
    _raw_file(path, b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                    b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', b"\0" * 4)
    with pytest.raises(FileFormatError, match=r"the header has the key 'w' twice"):
        nk.load(path)


def test_a_header_over_the_limit_is_called_that_not_truncated(tmp_path):
    path = tmp_path / "big-header.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 150 * MB) + b"{}")
    with pytest.raises(FileFormatError, match=r"declares a 157286400-byte header, more than "
                                              r"the 104857600 bytes a safetensors header may"):
        read_file(path)


def test_an_id2label_key_of_non_ascii_digits_is_named(bert_folder):
    edit_config(bert_folder, id2label={"0": "a", "1": "b", "²": "c"},
                 label2id={"a": 0, "b": 1, "c": 2})
    with pytest.raises(ValueError, match=r"config.json': field 'id2label' = .*ASCII digits"):
        BertForSequenceClassification.from_pretrained(bert_folder)


def test_a_tensor_with_a_5000_digit_layer_index_is_refused_by_a_short_name(bert_folder):
    name = f"bert.encoder.layer.{'9' * 5000}.x"
    _add_tensor(bert_folder, name, np.zeros(1, np.float32))
    error = _refused(BertForSequenceClassification.from_pretrained, bert_folder,
                     match=r"holds the tensor 'bert.encoder.layer.999.*'\.\.\., which the "
                           r"model .* has no place for")
    assert len(str(error)) < 600


def test_unused_tensor_names_are_cut_short_in_the_warning(bert_folder):
    for i in range(30):
        _add_tensor(bert_folder, f"cls.extra{i}.{'x' * 1000}", np.zeros(1, np.float32))
    with pytest.warns(UnusedWeightsWarning, match=r"\.\.\. \(30 in all\)") as caught:
        BertForSequenceClassification.from_pretrained(bert_folder)
    assert len(str(caught[0].message)) < 3000


@pytest.mark.parametrize("cls", [Bert, BertForTokenClassification, BertForPreTraining])
def test_other_bert_classes_load_under_the_paid_budget(bert_folder, cls):
    """The budget counts the file's tensors that the model uses; heads it lacks fit in
    max_bytes, and the tensors it has no place for are only reported."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnusedWeightsWarning)
        warnings.simplefilter("ignore", NewlyInitializedWarning)
        model = cls.from_pretrained(bert_folder, max_bytes=1 << 20)
    assert model.state_dict()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
@pytest.mark.parametrize("name", ["config.json", "model.safetensors"])
def test_a_fifo_or_device_in_the_folder_is_refused_never_opened(bert_folder, name):
    """Opening a FIFO would block for ever, reading /dev/zero would never end."""
    (bert_folder / name).unlink()
    os.mkfifo(bert_folder / name)
    _refused(BertForSequenceClassification.from_pretrained, bert_folder,
             match=rf"{name}' is not a regular file")
    if os.path.exists("/dev/zero"):
        (bert_folder / name).unlink()
        (bert_folder / name).symlink_to("/dev/zero")
        _refused(BertForSequenceClassification.from_pretrained, bert_folder,
                 match=rf"{name}' is not a regular file")


def test_save_pretrained_onto_a_file_is_a_value_error(tmp_path, bert_folder):
    model = BertForSequenceClassification.from_pretrained(bert_folder)
    target = tmp_path / "a-file"
    target.write_text("keep me")
    with pytest.raises(ValueError, match=r"cannot save to '.*a-file': it is a file, not a "
                                         r"folder"):
        model.save_pretrained(target)
    assert target.read_text() == "keep me"


# ----- writes never follow symlinks ------------------------------------------------------------
def _plant(folder, names, outside):
    """Symlinks ``folder/name`` -> ``outside`` for each name; returns their paths."""
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).symlink_to(outside)
    return [folder / name for name in names]


def test_save_pretrained_replaces_symlinks_and_never_writes_through_them(tmp_path,
                                                                         bert_folder):
    model = BertForSequenceClassification.from_pretrained(bert_folder)
    outside = tmp_path / "victim.txt"
    outside.write_text("secret")
    target = tmp_path / "out"
    pid = os.getpid()
    links = _plant(target, ["config.json", "model.safetensors", f".config.json.{pid}.tmp",
                            f".model.safetensors.{pid}.tmp"], outside)
    model.save_pretrained(target)
    assert outside.read_text() == "secret"
    for path in links[:2]:
        assert path.is_file() and not path.is_symlink(), path
    again = BertForSequenceClassification.from_pretrained(target)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[key], value, err_msg=key)


def test_vit_preprocessor_config_is_written_atomically_too(tmp_path, vit_folder):
    model = ViT.from_pretrained(vit_folder)
    model.preprocessing = {"size": 8}
    outside = tmp_path / "victim.txt"
    outside.write_text("secret")
    target = tmp_path / "out"
    _plant(target, ["preprocessor_config.json"], outside)
    model.save_pretrained(target)
    assert outside.read_text() == "secret"
    assert not (target / "preprocessor_config.json").is_symlink()


def test_nk_save_replaces_a_symlink_at_its_path(tmp_path):
    outside = tmp_path / "victim.txt"
    outside.write_text("secret")
    path = tmp_path / "ckpt.safetensors"
    path.symlink_to(outside)
    nk.save({"step": 3}, path)
    assert outside.read_text() == "secret"
    assert not path.is_symlink() and nk.load(path)["step"] == 3


def test_temporary_files_are_created_exclusively(tmp_path, monkeypatch):
    """Even a symlink under the exact temporary name the writer draws is not followed."""
    from nnkit import _files

    outside = tmp_path / "victim.txt"
    outside.write_text("secret")
    names = iter(["aaaaaaaa", "bbbbbbbb"])
    monkeypatch.setattr(_files.secrets, "token_hex", lambda n: next(names))
    planted = tmp_path / f".ckpt.safetensors.{_files._HOST}-{os.getpid()}-aaaaaaaa.tmp"
    planted.symlink_to(outside)
    nk.save({"step": 1}, tmp_path / "ckpt.safetensors")
    assert outside.read_text() == "secret"
    assert planted.is_symlink()  # left alone: a live writer's name, not followed
    assert nk.load(tmp_path / "ckpt.safetensors")["step"] == 1
