"""Hugging Face checkpoints: ``from_pretrained`` and ``save_pretrained`` for BERT and ViT.

A checkpoint folder in the Hugging Face layout holds ``config.json`` (the architecture's
hyper-parameters) and ``model.safetensors`` (the weights, named after transformers' modules):
what transformers' ``save_pretrained`` writes and what ``huggingface-cli download MODEL
--local-dir FOLDER`` fetches. This module reads such a folder into nnkit's models and writes
them back, without transformers or torch, and without the network:

- ``config.json``'s fields become constructor arguments (``bert_arguments``,
  ``vit_arguments``). A field whose value nnkit cannot represent exactly (an activation
  other than the exact GELU, relative position embeddings, a decoder, an untied MLM
  decoder, separate attention and hidden dropout rates) is refused by name: a checkpoint
  either runs exactly or not at all.
- The weights are read by nnkit's own safetensors reader (no pickle: a folder with only
  ``pytorch_model.bin`` is refused) and renamed by a table per architecture (``_Entry``:
  one nnkit tensor from one or more checkpoint tensors). BERT's and ViT's separate query,
  key and value projections (H, H) each are stacked into ``in_proj_weight`` (3H, H) in q, k,
  v order; ViT's patch-embedding convolution weight (D, C, p, p) is flattened to the Linear
  (D, C p p) that ``patchify``'s (c, y, x) order needs; the MLM decoder is the word
  embedding (tied, as in the checkpoint). The older names ``LayerNorm.gamma``/``beta`` and
  checkpoints without the ``bert.``/``vit.`` prefix (``BertModel``, ``ViTModel``) load too.
- Heads that the file lacks (a classifier on a pretraining checkpoint, the pooler of a
  token-classification checkpoint) keep their fresh initialisation and are listed in a
  ``NewlyInitializedWarning``, as transformers' "newly initialized" warning; tensors of the
  file that the model has no place for (the MLM head when loading ``Bert``) are listed in an
  ``UnusedWeightsWarning``.
- Nothing is half-loaded: a bad folder, config field or tensor raises (naming the file and
  the field or tensor) before a model is returned, and the model is built under nnkit's
  allocation budget, so a config that asks for more memory than its weights file holds is
  refused before it allocates.

Shapes: BERT's embeddings (V, H), (P, H), (types, H); each layer's q/k/v (H, H) -> in_proj
(3H, H), feed-forward (I, H) and (H, I); ViT's ``cls_token`` (1, 1, D), ``position_embeddings``
(1, n + 1, D), patch projection (D, C, ph, pw) -> (D, C ph pw).
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._budget import BudgetExceeded, allocation_budget
from .._safetensors import read_file, write_file
from ..nn.layers import _dtype
from .bert import (
    Bert,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .preprocess import preprocess_arguments
from .vit import ViT

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "NewlyInitializedWarning",
    "UnusedWeightsWarning",
    "load_pretrained",
    "save_pretrained",
    "read_config",
    "read_weights",
    "bert_arguments",
    "vit_arguments",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PREPROCESSOR_FILE = "preprocessor_config.json"  # a ViT's image preprocessing
INDEX_FILE = "model.safetensors.index.json"  # sharded checkpoints: name -> shard file
_PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
            "flax_model.msgpack")
_MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few kB; refuse to parse a huge one
MAX_BYTES = 256 << 20  # what building may allocate beyond the weights' elements


class NewlyInitializedWarning(UserWarning):
    """Parameters the checkpoint lacks, kept at their fresh initialisation (train them)."""


class UnusedWeightsWarning(UserWarning):
    """Tensors of the checkpoint that the model being loaded has no place for."""


# ----- the folder ------------------------------------------------------------------------------
def _folder(folder) -> Path:
    path = Path(os.fspath(folder))
    if not path.is_dir():
        raise FileNotFoundError(f"'{path}' is not a folder: from_pretrained reads a checkpoint "
                                f"folder holding {CONFIG_FILE} and {WEIGHTS_FILE} (e.g. one "
                                "written by save_pretrained or huggingface-cli download)")
    return path


def read_config(folder) -> tuple[Path, dict]:
    """``(path, fields)`` of ``folder/config.json``; FileNotFoundError or ValueError naming it."""
    path = _folder(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"'{path}' does not exist: a checkpoint folder needs "
                                f"{CONFIG_FILE} (the architecture) beside {WEIGHTS_FILE}")
    return path, _read_json(path)


def _read_json(path: Path) -> dict:
    """The JSON object of a (small) config file; ValueError naming it otherwise."""
    if path.stat().st_size > _MAX_CONFIG_BYTES:
        raise ValueError(f"'{path}' is {path.stat().st_size} bytes long, more than the "
                         f"{_MAX_CONFIG_BYTES} a config file may have; it is not a config")
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"'{path}' nests JSON too deeply to be a config") from None
    except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError
        raise ValueError(f"'{path}' is not valid JSON ({exc})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"'{path}' holds a JSON {type(fields).__name__}, not an object of "
                         "config fields")
    return fields


def read_weights(folder) -> tuple[Path, dict]:
    """``(path, {name: ndarray})`` of ``folder/model.safetensors`` (or of the shards that
    ``model.safetensors.index.json`` lists), read by nnkit's safetensors reader (bfloat16
    as float32). A folder with pickled weights only is refused: convert them first."""
    folder = _folder(folder)
    path = folder / WEIGHTS_FILE
    if path.is_file():
        return path, read_file(path)[0]
    index = folder / INDEX_FILE
    if index.is_file():
        return index, _read_shards(index)
    pickled = [name for name in _PICKLED if (folder / name).is_file()]
    if pickled:
        raise FileNotFoundError(
            f"'{folder}' holds {pickled[0]} but no {WEIGHTS_FILE}: nnkit reads safetensors "
            "only, never pickle (loading a pickle can run any code). Convert the checkpoint "
            "to safetensors once, where you trust it, e.g. with transformers: "
            "AutoModel.from_pretrained(folder).save_pretrained(folder, "
            "safe_serialization=True)")
    raise FileNotFoundError(f"'{path}' does not exist: a checkpoint folder needs "
                            f"{WEIGHTS_FILE} (the weights) beside {CONFIG_FILE}")


def _read_shards(index: Path) -> dict:
    """The tensors of a sharded checkpoint: every shard file its weight_map names."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (ValueError, AttributeError, RecursionError):
        weight_map = None
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) and v == Path(v).name for v in weight_map.values()):
        raise ValueError(f"'{index}': field 'weight_map' must map tensor names to shard files "
                         "in the same folder")
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        part = read_file(index.parent / shard)[0]
        for name in part:
            if name in tensors:
                raise ValueError(f"'{index}': tensor '{name}' is in more than one shard")
        tensors.update(part)
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise ValueError(f"'{index}': field 'weight_map' lists tensor '{missing[0]}', which "
                         "no shard holds")
    return tensors


# ----- config fields ---------------------------------------------------------------------------
_ABSENT = object()


class _Fields:
    """config.json's fields, read with their types checked; errors name the file and field.

    An absent field takes transformers' default for the architecture (``default``).
    """

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data

    def error(self, name: str, why: str) -> ValueError:
        value = self.data.get(name, "absent")
        return ValueError(f"'{self.path}': field '{name}' = {value!r:.100}: {why}")

    def get(self, name: str, kind: str, default=_ABSENT, nullable: bool = False):
        """The field ``name`` as ``kind``: 'int' (>= 0), 'float' (finite, >= 0), 'bool',
        'str' or 'pair' (an int or [int, int], each >= 1)."""
        if name not in self.data:
            if default is _ABSENT:
                raise ValueError(f"'{self.path}' lacks the field '{name}'")
            return default
        value = self.data[name]
        if value is None and nullable:
            return None
        ok = {
            "int": lambda v: type(v) is int and v >= 0,
            "float": lambda v: type(v) in (int, float) and math.isfinite(v) and v >= 0,
            "bool": lambda v: type(v) is bool,
            "str": lambda v: type(v) is str,
            "pair": lambda v: (type(v) is int and v >= 1) or (
                isinstance(v, list) and len(v) == 2 and all(type(x) is int and x >= 1
                                                             for x in v)),
        }[kind]
        if not ok(value):
            expected = {"int": "an integer >= 0", "float": "a finite number >= 0",
                        "bool": "true or false", "str": "a string",
                        "pair": "an integer >= 1 or a pair [height, width] of them"}[kind]
            raise self.error(name, f"expected {expected}")
        return tuple(value) if kind == "pair" and isinstance(value, list) else value

    def require(self, name: str, allowed: tuple, default, why: str):
        """The field, which must be one of ``allowed`` (nnkit cannot represent the rest)."""
        value = self.data.get(name, default)
        if value not in allowed or type(value) is not type(allowed[0]):
            raise self.error(name, why)
        return value


def _model_type(fields: _Fields, expected: str) -> None:
    model_type = fields.data.get("model_type", _ABSENT)
    if model_type is _ABSENT:
        raise ValueError(f"'{fields.path}' lacks the field 'model_type'; expected "
                         f"'{expected}'")
    if model_type != expected:
        raise fields.error("model_type", f"unknown to this loader, which reads '{expected}' "
                                         "checkpoints (nnkit's BERT loads model_type 'bert', "
                                         "its ViT 'vit')")


def _activation(fields: _Fields) -> None:
    fields.require("hidden_act", ("gelu", "gelu_python"), "gelu",
                   "nnkit's BERT and ViT use the exact (erf) GELU; other activations "
                   "(gelu_new, the tanh approximation, relu, ...) would change the outputs")


def _dropout(fields: _Fields, default: float) -> float:
    hidden = fields.get("hidden_dropout_prob", "float", default)
    attention = fields.get("attention_probs_dropout_prob", "float", default)
    if hidden != attention:
        raise fields.error("attention_probs_dropout_prob",
                           f"differs from hidden_dropout_prob = {hidden}; nnkit's encoder "
                           "layers have one dropout rate")
    if hidden >= 1:
        raise fields.error("hidden_dropout_prob", "a dropout rate must be < 1")
    return float(hidden)


def _heads_divide(fields: _Fields, hidden: int, heads: int) -> None:
    if heads < 1 or hidden < 1 or hidden % heads:
        raise fields.error("num_attention_heads", f"must be >= 1 and divide hidden_size = "
                                                  f"{hidden}")


def _labels(fields: _Fields, num_labels=None) -> tuple[int, dict]:
    """``(num_labels, id2label {int: str})`` from id2label (or num_labels, default 2)."""
    id2label = fields.data.get("id2label")
    if id2label is not None:
        if not isinstance(id2label, dict) or not all(
                isinstance(k, str) and k.isdigit() and isinstance(v, str)
                for k, v in id2label.items()) or \
                sorted(int(k) for k in id2label) != list(range(len(id2label))):
            raise fields.error("id2label", 'expected {"0": label, "1": label, ...} numbering '
                                           "the labels from 0")
        labels = {int(k): v for k, v in id2label.items()}
    else:
        n = fields.get("num_labels", "int", 2)
        labels = {i: f"LABEL_{i}" for i in range(n)}
    if num_labels is not None and num_labels != len(labels):
        labels = {i: f"LABEL_{i}" for i in range(num_labels)}
    if not labels:
        raise fields.error("id2label", "a classifier needs at least one label")
    return len(labels), labels


def bert_arguments(fields: _Fields) -> dict:
    """``Bert``'s constructor arguments from a BERT config.json (transformers' defaults for
    absent fields); refuses what nnkit's BERT cannot run exactly, naming the field."""
    _model_type(fields, "bert")
    _activation(fields)
    fields.require("position_embedding_type", ("absolute",), "absolute",
                   "nnkit's BERT has absolute (learned) position embeddings only")
    fields.require("is_decoder", (False,), False, "nnkit's BERT is an encoder (no causal mask)")
    fields.require("add_cross_attention", (False,), False,
                   "nnkit's BERT has no cross-attention")
    hidden = fields.get("hidden_size", "int", 768)
    heads = fields.get("num_attention_heads", "int", 12)
    _heads_divide(fields, hidden, heads)
    pad = fields.get("pad_token_id", "int", 0, nullable=True)
    if pad is None:
        raise fields.error("pad_token_id", "nnkit's BERT needs a padding id (its embedding "
                                           "row gets no gradient)")
    return dict(vocab_size=fields.get("vocab_size", "int", 30522), hidden_size=hidden,
                num_layers=fields.get("num_hidden_layers", "int", 12), num_heads=heads,
                intermediate_size=fields.get("intermediate_size", "int", 3072),
                max_position=fields.get("max_position_embeddings", "int", 512),
                type_vocab_size=fields.get("type_vocab_size", "int", 2),
                dropout=_dropout(fields, 0.1),
                layer_norm_eps=float(fields.get("layer_norm_eps", "float", 1e-12)),
                pad_token_id=pad)


def vit_arguments(fields: _Fields, num_labels=None) -> dict:
    """``ViT``'s constructor arguments from a ViT config.json (transformers' defaults for
    absent fields); ``num_labels`` overrides the checkpoint's label count."""
    _model_type(fields, "vit")
    _activation(fields)
    hidden = fields.get("hidden_size", "int", 768)
    heads = fields.get("num_attention_heads", "int", 12)
    _heads_divide(fields, hidden, heads)
    return dict(image_size=fields.get("image_size", "pair", 224),
                patch_size=fields.get("patch_size", "pair", 16),
                in_channels=fields.get("num_channels", "int", 3),
                num_classes=_labels(fields, num_labels)[0], dim=hidden,
                depth=fields.get("num_hidden_layers", "int", 12), heads=heads,
                mlp_dim=fields.get("intermediate_size", "int", 3072),
                dropout=_dropout(fields, 0.0), pool="cls",
                layer_norm_eps=float(fields.get("layer_norm_eps", "float", 1e-12)),
                qkv_bias=fields.get("qkv_bias", "bool", True))


# ----- name tables -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Entry:
    """One nnkit tensor ``ours`` and the checkpoint tensors ``theirs`` it is made of.

    kind: 'copy' (one tensor, same layout), 'qkv' (query, key, value stacked on axis 0),
    'patch' (a conv weight (D, C, ph, pw) flattened to (D, C ph pw)). ``fields`` are the
    config fields that size it (for the messages); ``optional`` tensors (heads, the pooler)
    may be missing from a file and then keep their initialisation.
    """

    ours: str
    theirs: tuple
    kind: str = "copy"
    fields: tuple = ("hidden_size",)
    optional: bool = False


def _pairs(ours: str, theirs: str, **kw) -> list[_Entry]:
    """The weight and the bias of one layer."""
    return [_Entry(f"{ours}.{s}", (f"{theirs}.{s}",), **kw) for s in ("weight", "bias")]


def _qkv(ours: str, theirs: str, names=("query", "key", "value")) -> list[_Entry]:
    return [_Entry(f"{ours}.in_proj_{s}", tuple(f"{theirs}.{n}.{s}" for n in names), "qkv")
            for s in ("weight", "bias")]


def _bert_entries(ours: str, num_layers: int) -> list[_Entry]:
    """BERT's encoder: nnkit names under ``ours`` from the names under ``bert.``."""
    e, t = f"{ours}embeddings.", "bert.embeddings."
    out = [_Entry(f"{e}word_embeddings.weight", (f"{t}word_embeddings.weight",),
                  fields=("vocab_size", "hidden_size")),
           _Entry(f"{e}position_embeddings.weight", (f"{t}position_embeddings.weight",),
                  fields=("max_position_embeddings", "hidden_size")),
           _Entry(f"{e}token_type_embeddings.weight", (f"{t}token_type_embeddings.weight",),
                  fields=("type_vocab_size", "hidden_size")),
           *_pairs(f"{e}norm", f"{t}LayerNorm")]
    for i in range(num_layers):
        a, b = f"{ours}encoder.layers.{i}.", f"bert.encoder.layer.{i}."
        out += [*_qkv(f"{a}self_attn", f"{b}attention.self"),
                *_pairs(f"{a}self_attn.out_proj", f"{b}attention.output.dense"),
                *_pairs(f"{a}norm1", f"{b}attention.output.LayerNorm"),
                *_pairs(f"{a}linear1", f"{b}intermediate.dense",
                        fields=("intermediate_size", "hidden_size")),
                *_pairs(f"{a}linear2", f"{b}output.dense",
                        fields=("hidden_size", "intermediate_size")),
                *_pairs(f"{a}norm2", f"{b}output.LayerNorm")]
    return out + _pairs(f"{ours}pooler", "bert.pooler.dense", optional=True)


def _vit_entries(num_layers: int) -> list[_Entry]:
    t = "vit.embeddings."
    out = [_Entry("cls_token", (f"{t}cls_token",)),
           _Entry("pos_embed", (f"{t}position_embeddings",),
                  fields=("image_size", "patch_size", "hidden_size")),
           _Entry("patch_embed.weight", (f"{t}patch_embeddings.projection.weight",), "patch",
                  fields=("hidden_size", "num_channels", "patch_size")),
           _Entry("patch_embed.bias", (f"{t}patch_embeddings.projection.bias",))]
    for i in range(num_layers):
        a, b = f"encoder.layers.{i}.", f"vit.encoder.layer.{i}."
        out += [*_pairs(f"{a}norm1", f"{b}layernorm_before"),
                *_qkv(f"{a}self_attn", f"{b}attention.attention"),
                *_pairs(f"{a}self_attn.out_proj", f"{b}attention.output.dense"),
                *_pairs(f"{a}norm2", f"{b}layernorm_after"),
                *_pairs(f"{a}linear1", f"{b}intermediate.dense",
                        fields=("intermediate_size", "hidden_size")),
                *_pairs(f"{a}linear2", f"{b}output.dense",
                        fields=("hidden_size", "intermediate_size"))]
    return out + [*_pairs("encoder.norm", "vit.layernorm"),
                  *_pairs("head", "classifier", fields=("num_labels", "hidden_size"),
                          optional=True)]


_MLM = [*_pairs("mlm_dense", "cls.predictions.transform.dense", optional=True),
        *_pairs("mlm_norm", "cls.predictions.transform.LayerNorm", optional=True),
        _Entry("mlm_bias", ("cls.predictions.bias",), fields=("vocab_size",), optional=True),
        *_pairs("nsp", "cls.seq_relationship", fields=("2 (next-sentence classes)",
                                                       "hidden_size"), optional=True)]
_CLASSIFIER = _pairs("classifier", "classifier", fields=("num_labels", "hidden_size"),
                     optional=True)
_QA = _pairs("qa_outputs", "qa_outputs", fields=("num_labels", "hidden_size"), optional=True)


@dataclass(frozen=True)
class _Architecture:
    """How one nnkit class maps to a transformers class: the checkpoint's base-model
    prefix, transformers' class name, the head entries, and whether its encoder has the
    pooler (transformers' token-classification and QA models have none)."""

    model_type: str
    hf_class: str
    heads: tuple
    pooler: bool = True


_ARCHITECTURES = {
    Bert: _Architecture("bert", "BertModel", ()),
    BertForPreTraining: _Architecture("bert", "BertForPreTraining", tuple(_MLM)),
    BertForSequenceClassification: _Architecture("bert", "BertForSequenceClassification",
                                                 tuple(_CLASSIFIER)),
    BertForTokenClassification: _Architecture("bert", "BertForTokenClassification",
                                              tuple(_CLASSIFIER), pooler=False),
    BertForQuestionAnswering: _Architecture("bert", "BertForQuestionAnswering", tuple(_QA),
                                            pooler=False),
    ViT: _Architecture("vit", "ViTForImageClassification", ()),
}


def _architecture(cls) -> tuple[type, _Architecture]:
    for base in cls.__mro__:
        if base in _ARCHITECTURES:
            return base, _ARCHITECTURES[base]
    raise TypeError(f"{cls.__name__} has no Hugging Face counterpart; from_pretrained and "
                    f"save_pretrained work for {', '.join(c.__name__ for c in _ARCHITECTURES)}")


def _entries(model) -> list[_Entry]:
    """The table of ``model``: every entry whose nnkit tensor the model has."""
    base, arch = _architecture(type(model))
    if base is ViT:
        table = _vit_entries(model.depth)
    else:
        bert = model if base is Bert else model.bert
        table = _bert_entries("" if base is Bert else "bert.", bert.num_layers)
        table += list(arch.heads)
    own = model.state_dict()
    return [e for e in table if e.ours in own]


# ----- checkpoint names --------------------------------------------------------------------------
_VIT_RENAMES = (  # transformers 5's module names -> the names its files hold
    (re.compile(r"^vit\.layers\.(\d+)\.attention\.([qkv])_proj\."),
     lambda m: f"vit.encoder.layer.{m[1]}.attention.attention."
               f"{ {'q': 'query', 'k': 'key', 'v': 'value'}[m[2]]}."),
    (re.compile(r"^vit\.layers\.(\d+)\.attention\.o_proj\."),
     lambda m: f"vit.encoder.layer.{m[1]}.attention.output.dense."),
    (re.compile(r"^vit\.layers\.(\d+)\.mlp\.fc1\."),
     lambda m: f"vit.encoder.layer.{m[1]}.intermediate.dense."),
    (re.compile(r"^vit\.layers\.(\d+)\.mlp\.fc2\."),
     lambda m: f"vit.encoder.layer.{m[1]}.output.dense."),
    (re.compile(r"^vit\.layers\.(\d+)\.(layernorm_before|layernorm_after)\."),
     lambda m: f"vit.encoder.layer.{m[1]}.{m[2]}."),
)
_BODY = ("embeddings.", "encoder.", "pooler.", "layernorm.", "layers.")


def _canonical(tensors: dict, base: str, path: Path) -> dict:
    """The file's tensors under the names the tables use: the base-model prefix added to a
    bare encoder's names (``BertModel``/``ViTModel`` files), ``LayerNorm.gamma``/``beta``
    -> ``weight``/``bias``, transformers 5's ViT module names -> its file names; the
    ``position_ids`` buffers of older files (0..P-1, not weights) dropped."""
    prefixed = any(name.startswith(f"{base}.") for name in tensors)
    out = {}
    for name, array in tensors.items():
        if name.endswith("position_ids"):
            continue
        new = name
        if not prefixed and new.startswith(_BODY):
            new = f"{base}.{new}"
        new = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", new)
        new = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", new)
        for pattern, replace in _VIT_RENAMES:
            new = pattern.sub(replace, new)
        if new in out:
            raise ValueError(f"'{path}' holds both '{name}' and another name of the same "
                             f"tensor ('{new}'); the file is inconsistent")
        out[new] = array
    return out


def _layer_count(tensors: dict, base: str) -> int:
    """How many encoder layers the file holds (1 + the largest index)."""
    pattern = re.compile(rf"^{base}\.encoder\.layer\.(\d+)\.")
    indices = {int(m[1]) for m in map(pattern.match, tensors) if m}
    return max(indices) + 1 if indices else 0


# ----- loading ---------------------------------------------------------------------------------
def _build(cls, base, fields: _Fields, dtype, num_labels):
    """The nnkit model of class ``cls`` that ``fields`` describe (fresh weights)."""
    if base is ViT:
        model = cls(**vit_arguments(fields, num_labels), dtype=dtype)
        model.id2label = _labels(fields, num_labels)[1]
        return model
    args = bert_arguments(fields)
    if base in (Bert, BertForPreTraining):
        if base is BertForPreTraining:
            fields.require("tie_word_embeddings", (True,), True,
                           "nnkit's MLM decoder is the word embedding itself (tied)")
        return cls(**args, dtype=dtype)
    bert = Bert(**args, dtype=dtype)
    if base is BertForQuestionAnswering:
        if _labels(fields)[0] != 2:
            raise fields.error("id2label" if "id2label" in fields.data else "num_labels",
                               "question answering has 2 labels (start, end)")
        return cls(bert)
    n, id2label = _labels(fields, num_labels)
    dropout = fields.get("classifier_dropout", "float", None, nullable=True)
    model = cls(bert, n, dropout)
    model.id2label = id2label
    return model


def _gather(entry: _Entry, tensors: dict, path: Path, fields: _Fields, shape, dtype):
    """The nnkit array of ``entry`` from the file's tensors, shape checked; None when an
    optional entry is absent."""
    present = [name in tensors for name in entry.theirs]
    if not any(present):
        if entry.optional:
            return None
        raise ValueError(f"'{path}' lacks the tensor '{entry.theirs[0]}' (for nnkit's "
                         f"'{entry.ours}'); the file does not hold a complete checkpoint of "
                         f"this architecture ({fields.path.name} says model_type "
                         f"{fields.data.get('model_type')!r})")
    if not all(present):
        name = entry.theirs[present.index(False)]
        raise ValueError(f"'{path}' lacks the tensor '{name}' beside "
                         f"'{entry.theirs[present.index(True)]}'")
    arrays = [tensors[name] for name in entry.theirs]
    for name, array in zip(entry.theirs, arrays, strict=True):
        if array.dtype.kind != "f":
            raise ValueError(f"'{path}': tensor '{name}' has dtype {array.dtype}; weights "
                             "must be floating-point")
    expected = _their_shapes(entry, shape)
    for name, array, want in zip(entry.theirs, arrays, expected, strict=True):
        if tuple(array.shape) != want:
            sizes = ", ".join(f"{f}={fields.data[f]}" for f in entry.fields
                              if f in fields.data)
            raise ValueError(f"'{path}': tensor '{name}' has shape {tuple(array.shape)} but "
                             f"'{fields.path}' ({sizes or ', '.join(entry.fields)}) needs "
                             f"{want}; the config and the weights do not match")
    array = np.concatenate(arrays, axis=0) if entry.kind == "qkv" else arrays[0]
    return np.asarray(array, dtype=dtype)


def _their_shapes(entry: _Entry, shape) -> list[tuple]:
    """The shapes the checkpoint tensors of ``entry`` must have for nnkit's ``shape``."""
    if entry.kind == "qkv":
        return [(shape[0] // 3, *shape[1:])] * 3
    return [tuple(shape)]


def _patch_shape(model: ViT) -> tuple:
    return (model.dim, model.in_channels, *model.patch_size)


def _tied_decoder(tensors: dict, used: set) -> None:
    """The MLM decoder tensors a file may hold beside what they are tied to (the word
    embedding, the MLM bias): used when equal to it, reported as unused otherwise (as
    transformers, which ties them after loading); an older file's only MLM bias is taken."""
    pairs = (("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
             ("cls.predictions.decoder.bias", "cls.predictions.bias"))
    for name, tied in pairs:
        if name not in tensors:
            continue
        if name.endswith("bias") and tied not in tensors:  # an older file's only MLM bias
            tensors[tied] = tensors[name]
            used.add(name)
        elif tied in tensors and tensors[name].shape == tensors[tied].shape and \
                np.array_equal(tensors[name], tensors[tied]):
            used.add(name)


def _check_unused(unused: list, base: str, path: Path, fields: _Fields) -> None:
    """Unused tensors of the encoder itself mean the config and the file disagree."""
    body = [n for n in unused if n.startswith((f"{base}.encoder.", f"{base}.embeddings."))]
    if body:
        raise ValueError(f"'{path}' holds the tensor '{body[0]}', which the model that "
                         f"'{fields.path}' describes has no place for (num_hidden_layers="
                         f"{fields.data.get('num_hidden_layers')}, qkv_bias="
                         f"{fields.data.get('qkv_bias', True)}); the config and the weights "
                         "do not match")


def load_pretrained(cls, folder, *, dtype=None, num_labels=None, max_bytes=MAX_BYTES,
                    output_loading_info: bool = False):
    """``cls`` (one of nnkit's BERT classes or ``ViT``) built from a Hugging Face folder.

    Parameters
    ----------
    cls : type
    folder : str or os.PathLike
        Holds config.json and model.safetensors (or model.safetensors.index.json + shards).
    dtype : float32 (default) or float64
        The model's dtype (float16 and bfloat16 weights are widened exactly).
    num_labels : int, optional
        A classifier of this many labels instead of the checkpoint's (a new head: the file
        must then not hold one of another size).
    max_bytes : int >= 0
        What building may allocate beyond the file's elements in ``dtype`` (new heads,
        temporaries); a config that asks for more is refused before it allocates.
    output_loading_info : bool
        Also return ``{"missing_keys": [...], "unexpected_keys": [...]}``: the nnkit
        parameters left at their initialisation and the file's unused tensors.

    Returns
    -------
    The model in eval mode (as transformers returns it), or ``(model, info)``.
    """
    base, arch = _architecture(cls)
    dtype = _dtype(dtype)
    if num_labels is not None and (isinstance(num_labels, bool) or
                                   not isinstance(num_labels, numbers.Integral) or
                                   num_labels < 1):
        raise ValueError(f"num_labels must be an int >= 1, got {num_labels!r:.100}")
    config_path, data = read_config(folder)
    fields = _Fields(config_path, data)
    _model_type(fields, arch.model_type)
    weights_path, raw = read_weights(folder)
    tensors = _canonical(raw, arch.model_type, weights_path)
    layers = _layer_count(tensors, arch.model_type)
    declared = fields.get("num_hidden_layers", "int", 12)
    if layers != declared:
        raise fields.error("num_hidden_layers", f"but '{weights_path}' holds {layers} encoder "
                                                "layers; the config and the weights do not "
                                                "match")
    elements = sum(int(a.size) for a in tensors.values())
    try:
        with allocation_budget(elements * dtype.itemsize + max_bytes):
            model = _build(cls, base, fields, dtype, num_labels)
    except BudgetExceeded as exc:
        raise ValueError(f"'{config_path}' describes a model that needs {exc.nbytes} bytes "
                         f"for {exc.what}, more than '{weights_path}' holds plus max_bytes="
                         f"{max_bytes}; the config does not match the weights (pass a larger "
                         "max_bytes if you trust them)") from None
    except (TypeError, ValueError) as exc:
        if str(exc).startswith(f"'{config_path}'"):
            raise
        raise ValueError(f"'{config_path}': its fields do not make a valid {cls.__name__} "
                         f"({exc})") from None
    if base is ViT and (config_path.parent / PREPROCESSOR_FILE).is_file():
        path = config_path.parent / PREPROCESSOR_FILE
        model.preprocessing = preprocess_arguments(path, _read_json(path))
    own = model.state_dict()
    used, state, missing = set(), {}, []
    if base is BertForPreTraining:
        _tied_decoder(tensors, used)
    for entry in _entries(model):
        shape = _patch_shape(model) if entry.kind == "patch" else own[entry.ours].shape
        array = _gather(entry, tensors, weights_path, fields, shape, dtype)
        if array is None:
            if arch.pooler or ".pooler." not in f".{entry.ours}":  # else unused by forward
                missing.append(entry.ours)
            continue
        if entry.kind == "patch":
            array = array.reshape(own[entry.ours].shape)
        state[entry.ours] = array
        used.update(entry.theirs)
    unused = [name for name in tensors if name not in used]
    _check_unused(unused, arch.model_type, weights_path, fields)
    model.load_state_dict(state, strict=False)
    model.eval()
    if missing:
        warnings.warn(f"{cls.__name__}: '{weights_path}' does not hold {missing}; these "
                      "parameters are newly initialised: train the model before using it "
                      "for predictions", NewlyInitializedWarning, stacklevel=3)
    if unused:
        warnings.warn(f"{cls.__name__}: tensors of '{weights_path}' not used: {unused} (the "
                      f"checkpoint holds parts that {cls.__name__} does not have)",
                      UnusedWeightsWarning, stacklevel=3)
    if output_loading_info:
        return model, {"missing_keys": missing, "unexpected_keys": unused}
    return model


# ----- saving ----------------------------------------------------------------------------------
def _bert_config(bert: Bert) -> dict:
    return {"model_type": "bert", "vocab_size": bert.vocab_size,
            "hidden_size": bert.hidden_size, "num_hidden_layers": bert.num_layers,
            "num_attention_heads": bert.num_heads, "intermediate_size": bert.intermediate_size,
            "hidden_act": "gelu", "hidden_dropout_prob": bert.dropout_p,
            "attention_probs_dropout_prob": bert.dropout_p,
            "max_position_embeddings": bert.max_position,
            "type_vocab_size": bert.type_vocab_size, "initializer_range": 0.02,
            "layer_norm_eps": bert.layer_norm_eps, "pad_token_id": bert.pad_token_id,
            "position_embedding_type": "absolute"}


def _label_config(model, n: int) -> dict:
    id2label = getattr(model, "id2label", None)
    if not isinstance(id2label, dict) or sorted(id2label) != list(range(n)):
        id2label = {i: f"LABEL_{i}" for i in range(n)}
    return {"id2label": {str(i): str(id2label[i]) for i in range(n)},
            "label2id": {str(id2label[i]): i for i in range(n)}}


def _config(model, base, arch: _Architecture) -> dict:
    """config.json of ``model``: transformers' fields for the same architecture."""
    if base is ViT:
        if model.pool != "cls":
            raise ValueError(f"ViT(pool={model.pool!r}) has no Hugging Face counterpart: "
                             "transformers' ViT classifies from the [CLS] token (pool='cls')")
        config = {"model_type": "vit", "hidden_size": model.dim,
                  "num_hidden_layers": model.depth, "num_attention_heads": model.heads,
                  "intermediate_size": model.encoder.layers[0].linear1.out_features,
                  "hidden_act": "gelu", "hidden_dropout_prob": model.dropout_p,
                  "attention_probs_dropout_prob": model.dropout_p, "initializer_range": 0.02,
                  "layer_norm_eps": model.layer_norm_eps,
                  "image_size": _int_or_pair(model.image_size),
                  "patch_size": _int_or_pair(model.patch_size),
                  "num_channels": model.in_channels, "qkv_bias": model.qkv_bias,
                  **_label_config(model, model.num_classes)}
    else:
        bert = model if base is Bert else model.bert
        config = _bert_config(bert)
        if base is BertForPreTraining:
            config["tie_word_embeddings"] = True
        if base in (BertForSequenceClassification, BertForTokenClassification):
            if model.dropout.p != bert.dropout_p:
                config["classifier_dropout"] = model.dropout.p
            config.update(_label_config(model, model.num_labels))
    dtype = np.dtype(model.state_dict()[next(iter(model.state_dict()))].dtype)
    return {"architectures": [arch.hf_class], **config, "dtype": dtype.name}


def _int_or_pair(pair):
    return pair[0] if pair[0] == pair[1] else list(pair)


def _tensors(model, base, arch: _Architecture) -> dict:
    """The checkpoint tensors of ``model``, by transformers' names."""
    own = model.state_dict()
    out = {}
    for entry in _entries(model):
        if not arch.pooler and ".pooler." in f".{entry.theirs[0]}":
            continue
        array = np.asarray(own[entry.ours])
        if entry.kind == "qkv":
            for name, part in zip(entry.theirs, np.split(array, 3, axis=0), strict=True):
                out[name] = part
        elif entry.kind == "patch":
            out[entry.theirs[0]] = array.reshape(_patch_shape(model))
        else:
            out[entry.theirs[0]] = array
    return out


def save_pretrained(model, folder) -> Path:
    """Write ``folder/config.json`` and ``folder/model.safetensors`` in the Hugging Face
    layout, so that transformers' ``from_pretrained(folder)`` (and nnkit's) rebuilds the same
    model; the folder is created when missing. A ViT with ``preprocessing`` (loaded from a
    checkpoint that had it, or set) also gets its preprocessor_config.json. Returns the
    folder."""
    base, arch = _architecture(type(model))
    config = _config(model, base, arch)
    tensors = {name: np.ascontiguousarray(a) for name, a in _tensors(model, base, arch).items()}
    folder = Path(os.fspath(folder))
    folder.mkdir(parents=True, exist_ok=True)
    write_file(folder / WEIGHTS_FILE, tensors, {"format": "pt"})
    _write_json(folder / CONFIG_FILE, config)
    if base is ViT and getattr(model, "preprocessing", None):
        _write_json(folder / PREPROCESSOR_FILE, _preprocessor_config(model.preprocessing))
    return folder


def _preprocessor_config(args: dict) -> dict:
    """preprocessor_config.json's fields for ``vit_preprocess`` arguments."""
    size = args.get("size", 224)
    height, width = (size, size) if isinstance(size, numbers.Integral) else size
    return {"image_processor_type": "ViTImageProcessor",
            "do_resize": bool(args.get("do_resize", True)),
            "size": {"height": int(height), "width": int(width)},
            "resample": int(args.get("resample", 2)),
            "do_rescale": bool(args.get("do_rescale", True)),
            "rescale_factor": float(args.get("rescale_factor", 1 / 255)),
            "do_normalize": bool(args.get("do_normalize", True)),
            "image_mean": [float(v) for v in args.get("mean", (0.5, 0.5, 0.5))],
            "image_std": [float(v) for v in args.get("std", (0.5, 0.5, 0.5))]}


def _write_json(path: Path, data: dict) -> None:
    """Write ``data`` as indented JSON, atomically (temporary file + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

