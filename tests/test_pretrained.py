"""Hugging Face checkpoints (nnkit.models.pretrained): from_pretrained and save_pretrained.

With transformers installed (a test-only dependency), tiny random checkpoints are built by
transformers itself, saved as config.json + model.safetensors, and loaded by nnkit:

- BERT (every head class, and the bare encoder from BertModel's unprefixed names) and ViT
  (ViTForImageClassification, ViTModel): logits and hidden states equal transformers' to
  1e-5 in float32 and 1e-12 in float64 (the HF model cast with .double());
- the other direction: nnkit's save_pretrained, read by transformers' from_pretrained, gives
  the same outputs (float32 and float64);
- the older names LayerNorm.gamma/beta, transformers 5's ViT module names, bfloat16 files
  (read as float32), sharded files, qkv_bias=False, other layer_norm_eps;
- missing heads are initialised and reported, unused tensors reported.

Without transformers: bfloat16 reading, ViT's new constructor arguments under nk.save, and
every refusal (a folder without config.json or model.safetensors, pickled weights only,
unknown model_type, fields nnkit cannot represent, mismatched shapes and layer counts, a
config asking for more memory than its weights) on checkpoints that nnkit writes itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from helpers import edit_config, import_transformers

import nnkit as nk
from nnkit._safetensors import read_file, write_file
from nnkit.models import (
    Bert,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    ViT,
)
from nnkit.models.pretrained import NewlyInitializedWarning, UnusedWeightsWarning

TOL = {np.float32: 1e-5, np.float64: 1e-12}
BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            vocab_size=99, max_position_embeddings=64, type_vocab_size=2)
VIT = dict(image_size=8, patch_size=2, hidden_size=32, num_hidden_layers=2,
           num_attention_heads=4, intermediate_size=37, num_channels=3)


def _perturb(torch, model, seed=0):
    """Random weights everywhere (transformers initialises biases to 0 and LayerNorms to
    1/0, which would leave their mapping untested)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model.eval()


def _inputs(B=3, T=11, vocab=99, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, vocab, (B, T))
    ids[:, 0] = 2
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    types = np.zeros_like(ids)
    types[:, 6:] = 1
    return ids, types, mask


def _images(shape=(2, 3, 8, 8), dtype=np.float32, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _close(ours, theirs, dtype):
    ours = ours.numpy() if hasattr(ours, "numpy") and not hasattr(ours, "detach") else ours
    theirs = theirs.detach().numpy() if hasattr(theirs, "detach") else theirs
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=TOL[dtype], atol=TOL[dtype])


def _load(cls, folder, **kw):
    """from_pretrained with the warnings recorded: (model, [warning messages])."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = cls.from_pretrained(folder, **kw)
    return model, [w for w in caught if issubclass(w.category, (NewlyInitializedWarning,
                                                                 UnusedWeightsWarning))]


def _torch_dtype(torch, dtype):
    return torch.float64 if dtype == np.float64 else torch.float32


# ----- checkpoints built by transformers ---------------------------------------------------------
HF_BERT = {"BertModel": Bert, "BertForPreTraining": BertForPreTraining,
           "BertForSequenceClassification": BertForSequenceClassification,
           "BertForTokenClassification": BertForTokenClassification,
           "BertForQuestionAnswering": BertForQuestionAnswering}


@pytest.fixture(scope="module")
def hf_checkpoints(tmp_path_factory):
    """{HF class name: (folder, HF model in eval mode)} for BERT's and ViT's classes."""
    transformers = import_transformers()
    import torch

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("hf")
    out = {}
    for i, name in enumerate([*HF_BERT, "ViTForImageClassification", "ViTModel"]):
        if name.startswith("Bert"):
            config = transformers.BertConfig(**BERT, num_labels=2 if "Answering" in name else 3)
        else:
            config = transformers.ViTConfig(**VIT, num_labels=3)
        model = _perturb(torch, getattr(transformers, name)(config), seed=i)
        model.save_pretrained(root / name, safe_serialization=True)
        out[name] = (root / name, model)
    return out


def _bert_outputs(torch, hf, ids, types, mask):
    with torch.no_grad():
        return hf(torch.tensor(ids), attention_mask=torch.tensor(mask),
                  token_type_ids=torch.tensor(types))


def _compare_bert(torch, name, model, hf, dtype):
    ids, types, mask = _inputs()
    theirs = _bert_outputs(torch, hf.to(_torch_dtype(torch, dtype)), ids, types, mask)
    with nk.no_grad():
        ours = model(ids, types, mask)
    if name == "BertModel":
        _close(ours[0], theirs.last_hidden_state, dtype)
        _close(ours[1], theirs.pooler_output, dtype)
    elif name == "BertForPreTraining":
        _close(ours.mlm_logits, theirs.prediction_logits, dtype)
        _close(ours.nsp_logits, theirs.seq_relationship_logits, dtype)
    elif name == "BertForQuestionAnswering":
        _close(ours.start_logits, theirs.start_logits, dtype)
        _close(ours.end_logits, theirs.end_logits, dtype)
    else:
        _close(ours.logits, theirs.logits, dtype)
    bert = model if name == "BertModel" else model.bert
    with nk.no_grad():  # the encoder's hidden states too
        seq, _ = bert(ids, types, mask)
    base = hf if name == "BertModel" else hf.bert
    with torch.no_grad():
        hidden = base(torch.tensor(ids), attention_mask=torch.tensor(mask),
                      token_type_ids=torch.tensor(types)).last_hidden_state
    _close(seq, hidden, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(HF_BERT))
def test_bert_checkpoints_give_transformers_outputs(hf_checkpoints, name, dtype):
    import torch

    folder, hf = hf_checkpoints[name]
    model, caught = _load(HF_BERT[name], folder, dtype=dtype)
    assert caught == [], [str(w.message) for w in caught]
    assert model.training is False
    assert model.state_dict()[next(iter(model.state_dict()))].dtype == dtype
    _compare_bert(torch, name, model, hf, dtype)


def test_mlm_decoder_is_tied_after_loading(hf_checkpoints):
    folder, _ = hf_checkpoints["BertForPreTraining"]
    model = BertForPreTraining.from_pretrained(folder)
    assert model.decoder_weight is model.bert.embeddings.word_embeddings.weight


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vit_checkpoint_gives_transformers_logits_and_hidden_states(hf_checkpoints, dtype):
    import torch

    folder, hf = hf_checkpoints["ViTForImageClassification"]
    model, caught = _load(ViT, folder, dtype=dtype)
    assert caught == []
    assert model.layer_norm_eps == 1e-12 and model.id2label == {0: "LABEL_0", 1: "LABEL_1",
                                                                 2: "LABEL_2"}
    images = _images(dtype=dtype)
    hf = hf.to(_torch_dtype(torch, dtype))
    with torch.no_grad():
        theirs = hf(torch.tensor(images), output_hidden_states=True)
        last = hf.vit(torch.tensor(images)).last_hidden_state
    with nk.no_grad():
        _close(model(images), theirs.logits, dtype)
        _close(model.encoder(model.embed(images)), last, dtype)


def test_vit_model_checkpoint_initialises_the_head_and_reports_the_pooler(hf_checkpoints):
    import torch

    folder, hf = hf_checkpoints["ViTModel"]
    model, caught = _load(ViT, folder)
    messages = {w.category: str(w.message) for w in caught}
    assert "['head.weight', 'head.bias']" in messages[NewlyInitializedWarning]
    assert "vit.pooler.dense.weight" in messages[UnusedWeightsWarning]
    images = _images()
    with torch.no_grad():
        last = hf(torch.tensor(images)).last_hidden_state
    with nk.no_grad():
        _close(model.encoder(model.embed(images)), last, np.float32)
    with pytest.warns(NewlyInitializedWarning), pytest.warns(UnusedWeightsWarning):
        model, info = ViT.from_pretrained(folder, output_loading_info=True)
    assert info["missing_keys"] == ["head.weight", "head.bias"]
    assert set(info["unexpected_keys"]) == {"vit.pooler.dense.weight", "vit.pooler.dense.bias"}


def test_heads_missing_from_a_pretraining_checkpoint_are_initialised_and_reported(
        hf_checkpoints):
    import torch

    folder, hf = hf_checkpoints["BertForPreTraining"]
    model, caught = _load(BertForSequenceClassification, folder, num_labels=5)
    assert model.classifier.weight.shape == (5, 32)
    messages = {w.category: str(w.message) for w in caught}
    assert "['classifier.weight', 'classifier.bias']" in messages[NewlyInitializedWarning]
    assert "cls.seq_relationship.weight" in messages[UnusedWeightsWarning]
    ids, types, mask = _inputs()
    with nk.no_grad():  # the encoder is the checkpoint's all the same
        seq, pooled = model.bert(ids, types, mask)
    theirs = _bert_outputs(torch, hf.float().bert, ids, types, mask)
    _close(seq, theirs.last_hidden_state, np.float32)
    _close(pooled, theirs.pooler_output, np.float32)


# ----- nnkit -> transformers ---------------------------------------------------------------------
def _randomise(model, seed=0):
    """Every nnkit parameter moved off its initialisation (biases, LayerNorms included)."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data = (p.data + 0.05 * rng.standard_normal(p.shape)).astype(p.dtype)
    return model.eval()


def _nnkit_bert(name, dtype):
    nk.manual_seed(3)
    args = dict(vocab_size=99, hidden_size=32, num_layers=2, num_heads=4,
                intermediate_size=37, max_position=64, dtype=dtype)
    cls = HF_BERT[name]
    if name in ("BertModel", "BertForPreTraining"):
        return _randomise(cls(**args))
    bert = Bert(**args)
    model = cls(bert) if name == "BertForQuestionAnswering" else cls(bert, 3)
    return _randomise(model)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", list(HF_BERT))
def test_bert_save_pretrained_loads_in_transformers(tmp_path, name, dtype):
    transformers = import_transformers()
    import torch

    model = _nnkit_bert(name, dtype)
    model.save_pretrained(tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    assert config["architectures"] == [name] and config["model_type"] == "bert"
    hf = getattr(transformers, name).from_pretrained(
        tmp_path / "ckpt", dtype=_torch_dtype(torch, dtype)).eval()
    _compare_bert(torch, name, model, hf, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing missing, nothing unused
        again = HF_BERT[name].from_pretrained(tmp_path / "ckpt", dtype=dtype)  # and back
    for key, value in model.state_dict().items():
        if ".pooler." in f".{key}" and name in ("BertForTokenClassification",
                                                "BertForQuestionAnswering"):
            assert "pooler" not in str(hf.state_dict().keys())  # transformers' has none
            continue
        np.testing.assert_array_equal(again.state_dict()[key], value, err_msg=key)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vit_save_pretrained_loads_in_transformers(tmp_path, dtype):
    transformers = import_transformers()
    import torch

    nk.manual_seed(4)
    model = _randomise(ViT((8, 6), (2, 3), 3, 4, dim=32, depth=2, heads=4, mlp_dim=37,
                           dtype=dtype, layer_norm_eps=1e-6))
    model.id2label = {0: "cat", 1: "dog", 2: "owl", 3: "eel"}
    model.save_pretrained(tmp_path / "vit")
    hf = transformers.ViTForImageClassification.from_pretrained(
        tmp_path / "vit", dtype=_torch_dtype(torch, dtype)).eval()
    assert hf.config.id2label[2] == "owl" and hf.config.layer_norm_eps == 1e-6
    images = _images((2, 3, 8, 6), dtype)
    with torch.no_grad():
        theirs = hf(torch.tensor(images)).logits
    with nk.no_grad():
        _close(model(images), theirs, dtype)


def test_vit_without_qkv_bias_round_trips_through_transformers(tmp_path):
    transformers = import_transformers()
    import torch

    config = transformers.ViTConfig(**VIT, qkv_bias=False, num_labels=2, layer_norm_eps=1e-6)
    hf = _perturb(torch, transformers.ViTForImageClassification(config))
    hf.save_pretrained(tmp_path / "a")
    model, caught = _load(ViT, tmp_path / "a")
    assert caught == [] and model.qkv_bias is False
    assert model.encoder.layers[0].self_attn.in_proj_bias is None
    images = _images()
    with torch.no_grad():
        theirs = hf(torch.tensor(images)).logits
    with nk.no_grad():
        _close(model(images), theirs, np.float32)
    model.save_pretrained(tmp_path / "b")
    back = transformers.ViTForImageClassification.from_pretrained(tmp_path / "b").eval()
    with torch.no_grad():
        _close(model(images).numpy(), back(torch.tensor(images)).logits, np.float32)


# ----- other files: older names, bfloat16, shards ------------------------------------------------
def _rewrite(folder, rename=None, convert=None, drop=()):
    """Rewrite folder/model.safetensors with renamed, converted or dropped tensors."""
    path = folder / "model.safetensors"
    tensors, metadata = read_file(path)
    out = {}
    for name, array in tensors.items():
        if name in drop:
            continue
        out[rename(name) if rename else name] = convert(array) if convert else array
    write_file(path, out, metadata)


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_older_layer_norm_names_load(hf_checkpoints, tmp_path):
    folder = _copy(hf_checkpoints["BertForPreTraining"][0], tmp_path / "old")
    _rewrite(folder, rename=lambda n: n.replace("LayerNorm.weight", "LayerNorm.gamma")
             .replace("LayerNorm.bias", "LayerNorm.beta"))
    assert "bert.embeddings.LayerNorm.gamma" in read_file(folder / "model.safetensors")[0]
    old = BertForPreTraining.from_pretrained(folder)
    new = BertForPreTraining.from_pretrained(hf_checkpoints["BertForPreTraining"][0])
    for key, value in new.state_dict().items():
        np.testing.assert_array_equal(old.state_dict()[key], value, err_msg=key)


def test_transformers_5_vit_module_names_load(hf_checkpoints, tmp_path):
    folder = _copy(hf_checkpoints["ViTForImageClassification"][0], tmp_path / "v5")

    def rename(name):
        for old, new in ((".attention.attention.query.", ".attention.q_proj."),
                         (".attention.attention.key.", ".attention.k_proj."),
                         (".attention.attention.value.", ".attention.v_proj."),
                         (".attention.output.dense.", ".attention.o_proj."),
                         (".intermediate.dense.", ".mlp.fc1."), (".output.dense.", ".mlp.fc2.")):
            name = name.replace(old, new)
        return name.replace("vit.encoder.layer.", "vit.layers.")

    _rewrite(folder, rename=rename)
    a = ViT.from_pretrained(folder)
    b = ViT.from_pretrained(hf_checkpoints["ViTForImageClassification"][0])
    for key, value in b.state_dict().items():
        np.testing.assert_array_equal(a.state_dict()[key], value, err_msg=key)


def test_bfloat16_checkpoint_loads_as_float32(tmp_path):
    transformers = import_transformers()
    import torch

    hf = _perturb(torch, transformers.BertForPreTraining(transformers.BertConfig(**BERT)))
    hf.to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    header = (tmp_path / "bf16" / "model.safetensors").read_bytes()[:4000]
    assert b'"BF16"' in header
    model, caught = _load(BertForPreTraining, tmp_path / "bf16")
    assert caught == []
    hf = hf.float()  # the bfloat16 values, widened as nnkit widens them
    embedding = hf.bert.embeddings.word_embeddings.weight.detach().numpy()
    np.testing.assert_array_equal(model.bert.embeddings.word_embeddings.weight.data,
                                  embedding)
    ids, types, mask = _inputs()
    theirs = _bert_outputs(torch, hf, ids, types, mask)
    with nk.no_grad():
        _close(model(ids, types, mask).mlm_logits, theirs.prediction_logits, np.float32)


def test_safetensors_reads_bfloat16_exactly(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, np.inf, 9.18355e-41, 65280.0],
                      dtype=np.float32)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    assert (bits.astype(np.uint32) << 16 == values.view(np.uint32)).all()  # exact bfloat16
    header = json.dumps({"x": {"dtype": "BF16", "shape": [2, 4],
                               "data_offsets": [0, bits.nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "bf16.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + bits.tobytes())
    tensors, _ = read_file(path)
    assert tensors["x"].dtype == np.float32 and tensors["x"].shape == (2, 4)
    np.testing.assert_array_equal(tensors["x"].reshape(-1), values)
    assert nk.load(path)["x"].dtype == np.float32


def test_sharded_checkpoint_loads(hf_checkpoints, tmp_path):
    transformers = import_transformers()

    folder, _ = hf_checkpoints["BertForPreTraining"]
    hf = transformers.BertForPreTraining.from_pretrained(folder)
    hf.save_pretrained(tmp_path / "shards", max_shard_size="20KB")
    assert (tmp_path / "shards" / "model.safetensors.index.json").is_file()
    assert not (tmp_path / "shards" / "model.safetensors").exists()
    a = BertForPreTraining.from_pretrained(tmp_path / "shards")
    b = BertForPreTraining.from_pretrained(folder)
    for key, value in b.state_dict().items():
        np.testing.assert_array_equal(a.state_dict()[key], value, err_msg=key)


# ----- refusals (checkpoints written by nnkit, no transformers needed) ---------------------------
@pytest.fixture
def bert_folder(tmp_path):
    nk.manual_seed(5)
    model = BertForPreTraining(99, 32, 2, 4, 37, 64)
    return model.save_pretrained(tmp_path / "bert")


@pytest.fixture
def vit_folder(tmp_path):
    nk.manual_seed(6)
    return ViT(8, 2, 3, 3, dim=32, depth=2, heads=4, mlp_dim=37).save_pretrained(
        tmp_path / "vit")


def test_nnkit_round_trip_without_transformers(bert_folder, vit_folder):
    model = BertForPreTraining.from_pretrained(bert_folder)
    ids, types, mask = _inputs()
    again = BertForPreTraining.from_pretrained(model.save_pretrained(bert_folder.parent / "b"))
    with nk.no_grad():
        np.testing.assert_array_equal(model(ids, types, mask).mlm_logits.numpy(),
                                      again(ids, types, mask).mlm_logits.numpy())
    vit = ViT.from_pretrained(vit_folder)
    assert (vit.layer_norm_eps, vit.image_size, vit.num_classes) == (1e-5, (8, 8), 3)


def test_missing_folder_and_files_are_named(tmp_path, bert_folder):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        Bert.from_pretrained(tmp_path / "nowhere")
    no_config = _copy(bert_folder, tmp_path / "no_config")
    (no_config / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"no_config/config.json' does not exist"):
        Bert.from_pretrained(no_config)
    no_weights = _copy(bert_folder, tmp_path / "no_weights")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no_weights/model.safetensors' does not exist"):
        Bert.from_pretrained(no_weights)


def test_pickled_weights_are_refused_with_the_conversion_advice(tmp_path, bert_folder):
    folder = _copy(bert_folder, tmp_path / "pickled")
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(FileNotFoundError, match=r"pytorch_model.bin but no model.safetensors"
                                                r".*never pickle.*safe_serialization=True"):
        BertForPreTraining.from_pretrained(folder)


@pytest.mark.parametrize("fields, match", [
    (dict(model_type="roberta"), r"field 'model_type' = 'roberta': unknown"),
    (dict(model_type=None), r"lacks the field 'model_type'"),
    (dict(hidden_act="gelu_new"), r"field 'hidden_act' = 'gelu_new': .*exact \(erf\) GELU"),
    (dict(position_embedding_type="relative_key"), r"field 'position_embedding_type'"),
    (dict(is_decoder=True), r"field 'is_decoder' = True"),
    (dict(tie_word_embeddings=False), r"field 'tie_word_embeddings' = False: .*tied"),
    (dict(attention_probs_dropout_prob=0.2), r"field 'attention_probs_dropout_prob' = 0.2"),
    (dict(hidden_size="32"), r"field 'hidden_size' = '32': expected an integer"),
    (dict(num_attention_heads=5), r"field 'num_attention_heads' = 5: must .* divide"),
    (dict(num_hidden_layers=3), r"field 'num_hidden_layers' = 3: but .* holds 2 encoder"),
    (dict(hidden_size=16, num_attention_heads=2),
     r"tensor 'bert.embeddings.word_embeddings.weight' has shape \(99, 32\) but .*config.json"
     r"' \(vocab_size=99, hidden_size=16\) needs \(99, 16\)"),
    (dict(intermediate_size=40), r"tensor 'bert.encoder.layer.0.intermediate.dense.weight' "
                                 r"has shape \(37, 32\) .*\(40, 32\)"),
    (dict(vocab_size=10**10), r"config.json' describes an encoder of \d+ parameters .*"
                              r"vocab_size=10000000000.* holds 21263 elements"),
    (dict(pad_token_id=None), None),  # absent: transformers' default 0, loads
])
def test_config_fields_nnkit_cannot_run_exactly_are_refused(bert_folder, fields, match):
    edit_config(bert_folder, **fields)
    if match is None:
        BertForPreTraining.from_pretrained(bert_folder)
        return
    with pytest.raises(ValueError, match=match):
        BertForPreTraining.from_pretrained(bert_folder)


def test_a_vit_checkpoint_is_not_a_bert(vit_folder, bert_folder):
    with pytest.raises(ValueError, match=r"field 'model_type' = 'vit'.*reads 'bert'"):
        Bert.from_pretrained(vit_folder)
    with pytest.raises(ValueError, match=r"field 'model_type' = 'bert'.*reads 'vit'"):
        ViT.from_pretrained(bert_folder)


def test_bad_json_and_bad_tensors_are_named(tmp_path, bert_folder):
    folder = _copy(bert_folder, tmp_path / "json")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config.json' is not valid JSON"):
        Bert.from_pretrained(folder)
    folder = _copy(bert_folder, tmp_path / "dropped")
    _rewrite(folder, drop={"bert.encoder.layer.1.attention.self.key.weight"})
    with pytest.raises(ValueError, match=r"lacks the tensor 'bert.encoder.layer.1.attention"
                                         r".self.key.weight' beside"):
        Bert.from_pretrained(folder)
    folder = _copy(bert_folder, tmp_path / "ints")
    _rewrite(folder, convert=lambda a: a.astype(np.int32) if a.ndim == 1 else a)
    with pytest.raises(ValueError, match=r"has dtype int32; weights must be floating-point"):
        Bert.from_pretrained(folder)
    folder = _copy(bert_folder, tmp_path / "extra")
    tensors, meta = read_file(folder / "model.safetensors")
    tensors["bert.encoder.layer.2.output.dense.bias"] = np.zeros(32, np.float32)
    write_file(folder / "model.safetensors", tensors, meta)
    with pytest.raises(ValueError, match=r"num_hidden_layers' = 2: but .* holds 3 encoder"):
        Bert.from_pretrained(folder)


def test_unused_vit_bias_when_config_says_no_qkv_bias(vit_folder):
    edit_config(vit_folder, qkv_bias=False)
    with pytest.raises(ValueError, match=r"holds the tensor 'vit.encoder.layer.0.attention."
                                         r"attention.query.bias', which the model .* has no "
                                         r"place for"):
        ViT.from_pretrained(vit_folder)


def test_vit_with_mean_pooling_has_no_hugging_face_counterpart(tmp_path):
    model = ViT(8, 2, 3, 3, dim=8, depth=1, heads=2, mlp_dim=8, pool="mean")
    with pytest.raises(ValueError, match=r"pool='mean'\) has no Hugging Face counterpart"):
        model.save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m" / "config.json").exists()


def test_vit_layer_norm_eps_and_qkv_bias_survive_nk_save(tmp_path):
    nk.manual_seed(7)
    model = ViT(8, 2, 3, 3, dim=8, depth=2, heads=2, mlp_dim=8, layer_norm_eps=1e-12,
                qkv_bias=False)
    assert model.encoder.norm.eps == 1e-12 and model.encoder.layers[1].norm2.eps == 1e-12
    assert "encoder.layers.1.self_attn.in_proj_bias" not in model.state_dict()
    nk.save(model, tmp_path / "vit.safetensors")
    back = nk.load(tmp_path / "vit.safetensors")
    assert (back.layer_norm_eps, back.qkv_bias) == (1e-12, False)
    images = _images()
    with nk.no_grad():
        np.testing.assert_array_equal(back.eval()(images).numpy(), model.eval()(images).numpy())


def test_loading_and_saving_import_neither_torch_nor_transformers(bert_folder, tmp_path):
    script = f"""
import sys
import nnkit as nk
from nnkit.models import BertForPreTraining, ViT
from nnkit.text import WordPieceTokenizer
model = BertForPreTraining.from_pretrained({str(bert_folder)!r})
model.save_pretrained({str(tmp_path / "again")!r})
ViT(8, 2, 3, 3, dim=8, depth=1, heads=2, mlp_dim=8).save_pretrained({str(tmp_path / "v")!r})
WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]).save_pretrained(
    {str(tmp_path / "t")!r})
WordPieceTokenizer.from_pretrained({str(tmp_path / "t")!r})
print(sorted(m for m in ("torch", "transformers", "tokenizers", "safetensors")
             if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


# ----- image preprocessing and position interpolation -------------------------------------------
def _pil_processor(transformers, **kwargs):
    """transformers' PIL-based ViT image processor (5.x names it ViTImageProcessorPil)."""
    pytest.importorskip("PIL")
    cls = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor
    return cls(**kwargs)


@pytest.mark.parametrize("resample", [2, 3])
@pytest.mark.parametrize("shape, size", [((37, 53, 3), 24), ((10, 7, 3), (16, 20)),
                                         ((64, 64, 3), 64), ((300, 200, 3), (32, 17)),
                                         ((5, 40, 3), (5, 9))])
def test_vit_preprocess_equals_transformers_image_processor(shape, size, resample):
    transformers = import_transformers()
    from nnkit.models import vit_preprocess

    size2 = (size, size) if isinstance(size, int) else size
    processor = _pil_processor(transformers, size={"height": size2[0], "width": size2[1]},
                               resample=resample, image_mean=[0.4, 0.5, 0.6],
                               image_std=[0.2, 0.3, 0.25])
    images = [np.random.default_rng(i).integers(0, 256, shape, dtype=np.uint8)
              for i in range(2)]
    theirs = processor(images=images, return_tensors="np")["pixel_values"]
    ours = vit_preprocess(images, size, mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.25],
                          resample=resample)
    assert ours.shape == theirs.shape and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs)


def test_preprocessor_config_is_loaded_with_the_checkpoint(hf_checkpoints, tmp_path):
    transformers = import_transformers()

    folder = _copy(hf_checkpoints["ViTForImageClassification"][0], tmp_path / "vit")
    processor = _pil_processor(transformers, size={"height": 8, "width": 8}, resample=3,
                               image_mean=[0.1, 0.2, 0.3], image_std=[0.9, 0.8, 0.7])
    processor.save_pretrained(folder)
    model = ViT.from_pretrained(folder)
    assert model.preprocessing["resample"] == 3 and model.preprocessing["size"] == (8, 8)
    image = np.random.default_rng(0).integers(0, 256, (30, 20, 3), dtype=np.uint8)
    np.testing.assert_array_equal(model.preprocess(image),
                                  processor(images=image, return_tensors="np")["pixel_values"])
    model.save_pretrained(tmp_path / "again")  # and written back with the checkpoint
    again = ViT.from_pretrained(tmp_path / "again")
    assert again.preprocessing == model.preprocessing
    np.testing.assert_array_equal(
        _pil_processor(transformers).from_pretrained(tmp_path / "again")(
            images=image, return_tensors="np")["pixel_values"], again.preprocess(image))
    with open(folder / "preprocessor_config.json", "w") as f:
        json.dump({"size": {"shortest_edge": 224}, "do_center_crop": True}, f)
    with pytest.raises(ValueError, match=r"preprocessor_config.json': field 'size'"):
        ViT.from_pretrained(folder)


def test_vit_preprocess_bad_input():
    from nnkit.models import vit_preprocess

    image = np.zeros((4, 4, 3), np.uint8)
    with pytest.raises(ValueError, match="resample=1"):
        vit_preprocess(image, 2, resample=1)
    with pytest.raises(ValueError, match="mean and std need 3 values"):
        vit_preprocess(image, 2, mean=[0.5], std=[0.5])
    with pytest.raises(ValueError, match="do_resize=False"):
        vit_preprocess(image, 2, do_resize=False)
    with pytest.raises(ValueError, match=r"got shape \(1, 1, 4, 4, 3\)"):
        vit_preprocess(image[None, None], 2)
    assert vit_preprocess(image.astype(np.float64) / 255, 4, do_rescale=False,
                          dtype=np.float64).dtype == np.float64


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(12, 12), (6, 10), (8, 8), (4, 4), (10, 6)])
def test_position_interpolation_equals_transformers(hf_checkpoints, shape, dtype):
    import torch

    folder, hf = hf_checkpoints["ViTForImageClassification"]
    model = ViT.from_pretrained(folder, dtype=dtype)
    images = _images((2, 3, *shape), dtype)
    hf = hf.to(_torch_dtype(torch, dtype))
    with torch.no_grad():
        theirs = hf(torch.tensor(images), interpolate_pos_encoding=True).logits
    with nk.no_grad():
        _close(model(images, interpolate_pos_encoding=True), theirs, dtype)
    if shape != (8, 8):
        with pytest.raises(ValueError, match="interpolate_pos_encoding=True"):
            model(images)


def test_position_interpolation_is_differentiable():
    nk.manual_seed(8)
    model = ViT(4, 2, 1, 2, dim=4, depth=1, heads=2, mlp_dim=4, dtype=np.float64)
    images = _images((1, 1, 6, 4), np.float64)
    nk.gradcheck(lambda pos: model.embed(images, interpolate_pos_encoding=True),
                 [model.pos_embed], eps=1e-6, atol=1e-8, rtol=1e-6)


# ----- the examples on tiny checkpoints ---------------------------------------------------------
def _example(name):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fill_mask_example_gives_transformers_probabilities(tmp_path, capsys):
    transformers = import_transformers()
    import torch

    from nnkit.text import SPECIAL_TOKENS, WordPieceTokenizer

    words = ["the", "capital", "of", "france", "is", "paris", ".", "man", "worked", "as", "a"]
    vocab = [*SPECIAL_TOKENS, *words, *(f"w{i}" for i in range(99 - 5 - len(words)))]
    folder = WordPieceTokenizer(vocab).save_pretrained(tmp_path / "bert")
    config = transformers.BertConfig(**BERT)
    hf = _perturb(torch, transformers.BertForMaskedLM(config))
    hf.save_pretrained(folder)
    text = "the capital of france is [MASK]."
    results = _example("bert_fill_mask").main([str(folder), text, "--top-k", "3"])
    assert "[MASK] 1:" in capsys.readouterr().out
    theirs_tok = transformers.BertTokenizerFast.from_pretrained(folder)
    enc = theirs_tok(text, return_tensors="pt")
    with torch.no_grad():
        logits = hf(**enc).logits[0]
    position = enc["input_ids"][0].tolist().index(theirs_tok.mask_token_id)
    probs = torch.softmax(logits[position].double(), -1).numpy()
    best = np.argsort(-probs)[:3]
    assert [t for t, _ in results[0]] == theirs_tok.convert_ids_to_tokens(best.tolist())
    np.testing.assert_allclose([p for _, p in results[0]], probs[best], rtol=1e-5, atol=1e-6)


def test_vit_classify_example_gives_transformers_probabilities(hf_checkpoints, tmp_path,
                                                               capsys):
    transformers = import_transformers()
    import torch

    folder = _copy(hf_checkpoints["ViTForImageClassification"][0], tmp_path / "vit")
    processor = _pil_processor(transformers, size={"height": 8, "width": 8})
    processor.save_pretrained(folder)
    image = np.random.default_rng(3).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    np.save(tmp_path / "image.npy", image)
    results = _example("vit_classify").main([str(folder), str(tmp_path / "image.npy")])
    assert "LABEL_" in capsys.readouterr().out
    hf = hf_checkpoints["ViTForImageClassification"][1].float()
    pixels = processor(images=image, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        probs = torch.softmax(hf(pixels).logits[0].double(), -1).numpy()
    best = np.argsort(-probs)
    assert [label for label, _ in results] == [hf.config.id2label[int(i)] for i in best]
    np.testing.assert_allclose([p for _, p in results], probs[best], rtol=1e-5, atol=1e-6)
