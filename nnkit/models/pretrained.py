"""Hugging Face checkpoints: ``from_pretrained`` and ``save_pretrained`` for BERT, ViT and Mamba.

A checkpoint folder in the Hugging Face layout holds ``config.json`` (the architecture's
hyper-parameters) and ``model.safetensors`` (the weights, named after transformers' modules):
what transformers' ``save_pretrained`` writes and what ``huggingface-cli download MODEL
--local-dir FOLDER`` fetches. This module reads such a folder into nnkit's models and writes
them back, without transformers or torch, and without the network:

- ``config.json``'s fields become constructor arguments (``bert_arguments``,
  ``vit_arguments``, ``mamba_arguments``). A field whose value nnkit cannot represent
  exactly (an activation other than the exact GELU, or than SiLU for Mamba, relative
  position embeddings, a decoder, an untied MLM decoder, separate attention and hidden
  dropout rates) is refused by name: a checkpoint
  either runs exactly or not at all.
- The weights are read by nnkit's own safetensors reader (no pickle: a folder with only
  ``pytorch_model.bin`` is refused) and renamed by a table per architecture (``_Entry``:
  one nnkit tensor from one or more checkpoint tensors). BERT's and ViT's separate query,
  key and value projections (H, H) each are stacked into ``in_proj_weight`` (3H, H) in q, k,
  v order; ViT's patch-embedding convolution weight (D, C, p, p) is flattened to the Linear
  (D, C p p) that ``patchify``'s (c, y, x) order needs; the MLM decoder is the word
  embedding (tied, as in the checkpoint). Mamba's names are transformers' own (under
  ``backbone.``; a ``MambaModel`` file's bare names and the older ``embedding.weight`` load
  too), its tied ``lm_head`` the embedding. The older names ``LayerNorm.gamma``/``beta`` and
  checkpoints without the ``bert.``/``vit.`` prefix (``BertModel``, ``ViTModel``) load too.
- Heads that the file lacks (a classifier on a pretraining checkpoint, the pooler of a
  token-classification checkpoint) keep their fresh initialisation and are listed in a
  ``NewlyInitializedWarning``, as transformers' "newly initialized" warning; tensors of the
  file that the model has no place for (the MLM head when loading ``Bert``) are listed in an
  ``UnusedWeightsWarning``.
- Nothing is half-loaded: a bad folder, config field or tensor raises (naming the file and
  the field or tensor) before a model is returned. The folder is untrusted: a config whose
  encoder needs more parameters than the file holds is refused before anything is built;
  the rest (new heads, label names) is built under nnkit's allocation budget (the file's
  tensors the model uses, plus ``max_bytes``); tensors are read only after their dtype and
  shape are checked, and only those the model uses.

Shapes: BERT's embeddings (V, H), (P, H), (types, H); each layer's q/k/v (H, H) -> in_proj
(3H, H), feed-forward (I, H) and (H, I); ViT's ``cls_token`` (1, 1, D), ``position_embeddings``
(1, n + 1, D), patch projection (D, C, ph, pw) -> (D, C ph pw).
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._budget import MAX_BYTES, BudgetExceeded, allocation_budget, reserve
from .._files import ensure_folder, quote, read_json, write_atomic
from .._safetensors import read_header, write_file
from ..nn.layers import _dtype
from .bert import (
    Bert,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from .mamba import MambaConfig, MambaForCausalLM, MambaModel
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
    "mamba_arguments",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PREPROCESSOR_FILE = "preprocessor_config.json"  # a ViT's image preprocessing
INDEX_FILE = "model.safetensors.index.json"  # sharded checkpoints: name -> shard file
_PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5",
            "flax_model.msgpack")
_MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few kB; refuse to parse a huge one


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
    if not path.exists():
        raise FileNotFoundError(f"'{path}' does not exist: a checkpoint folder needs "
                                f"{CONFIG_FILE} (the architecture) beside {WEIGHTS_FILE}")
    return path, read_json(path, _MAX_CONFIG_BYTES)


def read_weights(folder) -> tuple[Path, dict]:
    """``(path, {name: ndarray})`` of ``folder/model.safetensors`` (or of the shards that
    ``model.safetensors.index.json`` lists), read by nnkit's safetensors reader (bfloat16
    as float32). A folder with pickled weights only is refused: convert them first."""
    path, entries = _weight_entries(folder)
    return path, {name: entry.read() for name, entry in entries.items()}


def _weight_entries(folder) -> tuple[Path, dict]:
    """``(path, {name: TensorEntry})``: the checkpoint's tensors described, none read."""
    folder = _folder(folder)
    path = folder / WEIGHTS_FILE
    if path.exists():
        return path, read_header(path)[0]
    index = folder / INDEX_FILE
    if index.exists():
        return index, _shard_entries(index)
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


def _shard_entries(index: Path) -> dict:
    """The tensors of a sharded checkpoint: every shard file its weight_map names."""
    weight_map = read_json(index, _MAX_CONFIG_BYTES).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) and v == Path(v).name and v not in ("", ".", "..")
            for v in weight_map.values()):
        raise ValueError(f"'{index}': field 'weight_map' must map tensor names to shard files "
                         "in the same folder")
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        part = read_header(index.parent / shard)[0]
        for name in part:
            if name in tensors:
                raise ValueError(f"'{index}': tensor {quote(name, 80)} is in more than one "
                                 "shard")
        tensors.update(part)
    missing = sorted(set(weight_map) - set(tensors))
    if missing:
        raise ValueError(f"'{index}': field 'weight_map' lists tensor {quote(missing[0], 80)}, "
                         "which no shard holds")
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
                                         "its ViT 'vit', its Mamba 'mamba')")


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


_LABEL_BYTES = 160  # one {i: "LABEL_i"} entry: dict slot, int and str (135 measured)
_ID = re.compile(r"[0-9]{1,9}")  # a label id key of id2label (ASCII digits only)


def _id2label(fields: _Fields) -> dict | None:
    """config.json's id2label as {int: str} (checked), or None when it has none."""
    id2label = fields.data.get("id2label")
    if id2label is None:
        return None
    if not isinstance(id2label, dict) or not all(
            isinstance(k, str) and _ID.fullmatch(k) and isinstance(v, str)
            for k, v in id2label.items()) or \
            sorted(int(k) for k in id2label) != list(range(len(id2label))):
        raise fields.error("id2label", 'expected {"0": label, "1": label, ...} numbering '
                                       "the labels from 0 (ASCII digits)")
    return {int(k): v for k, v in id2label.items()}


def _label_count(fields: _Fields, num_labels=None) -> int:
    """``num_labels`` when given, else how many labels id2label names, else the
    num_labels field (default 2)."""
    id2label = _id2label(fields)
    if num_labels is not None:
        return num_labels
    n = len(id2label) if id2label is not None else fields.get("num_labels", "int", 2)
    if n < 1:
        raise fields.error("id2label" if id2label is not None else "num_labels",
                           "a classifier needs at least one label")
    return n


def _labels(fields: _Fields, num_labels=None) -> dict:
    """id2label {int: str} of a classifier: the file's names when their count is the
    model's, else LABEL_0, LABEL_1, ... (counted against the loading budget before they
    are made: a config may ask for 10**9 of them)."""
    n = _label_count(fields, num_labels)
    id2label = _id2label(fields)
    if id2label is not None and len(id2label) == n:
        return id2label
    reserve(n * _LABEL_BYTES, f"the names of num_labels={n} labels")
    return {i: f"LABEL_{i}" for i in range(n)}


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
                num_classes=_label_count(fields, num_labels), dim=hidden,
                depth=fields.get("num_hidden_layers", "int", 12), heads=heads,
                mlp_dim=fields.get("intermediate_size", "int", 3072),
                dropout=_dropout(fields, 0.0), pool="cls",
                layer_norm_eps=float(fields.get("layer_norm_eps", "float", 1e-12)),
                qkv_bias=fields.get("qkv_bias", "bool", True))


def mamba_arguments(fields: _Fields) -> dict:
    """``MambaConfig``'s fields from a Mamba config.json (transformers' defaults for absent
    fields); refuses what nnkit's Mamba cannot run exactly, naming the field."""
    _model_type(fields, "mamba")
    fields.require("hidden_act", ("silu",), "silu",
                   "Mamba's mixer gates with SiLU; nnkit's runs no other activation")
    hidden = fields.get("hidden_size", "int", 768)
    rank = fields.data.get("time_step_rank", "auto")
    if rank != "auto":
        rank = fields.get("time_step_rank", "int")
    positive = {"hidden_size": hidden}
    for name, default in (("vocab_size", 50280), ("state_size", 16), ("expand", 2),
                          ("conv_kernel", 4)):
        positive[name] = fields.get(name, "int", default)
    for name, value in {**positive, "time_step_rank": 1 if rank == "auto" else rank}.items():
        if value < 1:
            raise fields.error(name, "must be >= 1")
    eps = float(fields.get("layer_norm_epsilon", "float", 1e-5))
    if eps <= 0:
        raise fields.error("layer_norm_epsilon", "must be > 0")
    ids = {name: fields.get(name, "int", 0, nullable=True)
           for name in ("pad_token_id", "bos_token_id", "eos_token_id")}
    return dict(**positive, time_step_rank=rank,
                num_hidden_layers=fields.get("num_hidden_layers", "int", 32),
                layer_norm_epsilon=eps, **ids, hidden_act="silu",
                use_bias=fields.get("use_bias", "bool", False),
                use_conv_bias=fields.get("use_conv_bias", "bool", True),
                residual_in_fp32=fields.get("residual_in_fp32", "bool", True),
                tie_word_embeddings=fields.get("tie_word_embeddings", "bool", True),
                **_time_step_init(fields))


def _time_step_init(fields: _Fields) -> dict:
    """The step-size initialisation fields (they size nothing; kept for save_pretrained)."""
    floats = {name: float(fields.get(name, "float", default)) for name, default in
              (("time_step_scale", 1.0), ("time_step_min", 0.001), ("time_step_max", 0.1),
               ("time_step_floor", 1e-4))}
    if not 0 < floats["time_step_min"] <= floats["time_step_max"]:
        raise fields.error("time_step_min", "must be > 0 and <= time_step_max")
    scheme = fields.require("time_step_init_scheme", ("random", "constant"), "random",
                            "expected 'random' or 'constant'")
    return dict(**floats, time_step_init_scheme=scheme)


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


_MIXER = (("in_proj.weight", ("intermediate_size", "hidden_size")),
          ("in_proj.bias", ("intermediate_size", "use_bias")),
          ("conv1d.weight", ("intermediate_size", "conv_kernel")),
          ("conv1d.bias", ("intermediate_size", "use_conv_bias")),
          ("x_proj.weight", ("time_step_rank", "state_size", "intermediate_size")),
          ("dt_proj.weight", ("intermediate_size", "time_step_rank")),
          ("dt_proj.bias", ("intermediate_size",)),
          ("A_log", ("intermediate_size", "state_size")),
          ("D", ("intermediate_size",)),
          ("out_proj.weight", ("hidden_size", "intermediate_size")),
          ("out_proj.bias", ("hidden_size", "use_bias")))


def _mamba_entries(ours: str, num_layers: int) -> list[_Entry]:
    """Mamba's backbone: nnkit names under ``ours`` from the names under ``backbone.`` (the
    same names; every optional bias listed, ``_entries`` keeps those the model has)."""
    t = "backbone."
    out = [_Entry(f"{ours}embeddings.weight", (f"{t}embeddings.weight",),
                  fields=("vocab_size", "hidden_size"))]
    for i in range(num_layers):
        a = f"layers.{i}."
        out += [_Entry(f"{ours}{a}norm.weight", (f"{t}{a}norm.weight",))]
        out += [_Entry(f"{ours}{a}mixer.{name}", (f"{t}{a}mixer.{name}",), fields=sizes)
                for name, sizes in _MIXER]
    return out + [_Entry(f"{ours}norm_f.weight", (f"{t}norm_f.weight",))]


_LM_HEAD = _Entry("lm_head.weight", ("lm_head.weight",), fields=("vocab_size", "hidden_size"),
                  optional=True)
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
    prefix: str = ""  # the checkpoint's base-model prefix when not model_type
    layer: str = "encoder.layer"  # the checkpoint's layer list under the prefix
    default_layers: int = 12  # transformers' num_hidden_layers default

    @property
    def base(self) -> str:
        return self.prefix or self.model_type


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
    MambaModel: _Architecture("mamba", "MambaModel", (), prefix="backbone", layer="layers",
                              default_layers=32),
    MambaForCausalLM: _Architecture("mamba", "MambaForCausalLM", (_LM_HEAD,),
                                    prefix="backbone", layer="layers", default_layers=32),
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
    elif base in (MambaModel, MambaForCausalLM):
        ours = "" if base is MambaModel else "backbone."
        table = _mamba_entries(ours, model.config.num_hidden_layers) + list(arch.heads)
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
_BODY = ("embeddings.", "encoder.", "pooler.", "layernorm.", "layers.", "norm_f.",
         "embedding.")


def _canonical(tensors: dict, base: str, path: Path) -> dict:
    """The file's tensors under the names the tables use: the base-model prefix added to a
    bare encoder's names (``BertModel``/``ViTModel`` files), ``LayerNorm.gamma``/``beta``
    -> ``weight``/``bias``, transformers 5's ViT module names -> its file names; the
    ``position_ids`` buffers of older files (0..P-1, not weights) dropped; Mamba's older
    ``embedding.weight`` -> ``embeddings.weight`` (as transformers' load hook)."""
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
        new = re.sub(r"^backbone\.embedding\.weight$", "backbone.embeddings.weight", new)
        for pattern, replace in _VIT_RENAMES:
            new = pattern.sub(replace, new)
        if new in out:
            raise ValueError(f"'{path}' holds both {quote(name, 80)} and another name of the "
                             f"same tensor ({quote(new, 80)}); the file is inconsistent")
        out[new] = array
    return out


def _layer_count(tensors: dict, arch: _Architecture) -> int:
    """How many encoder layers the file holds (1 + the largest index; an index of more than
    9 digits is no layer's, and the name is refused later as one the model has no place for)."""
    pattern = re.compile(rf"^{arch.base}\.{re.escape(arch.layer)}\.([0-9]{{1,9}})\.")
    indices = {int(m[1]) for m in map(pattern.match, tensors) if m}
    return max(indices) + 1 if indices else 0


def _body_elements(base, args: dict) -> int:
    """The parameters of the encoder that ``args`` describe, without the optional pooler
    and heads: what the checkpoint must hold for the model to load."""
    if base in (MambaModel, MambaForCausalLM):
        return _mamba_elements(MambaConfig(**args))
    if base is ViT:
        D, I, L = args["dim"], args["mlp_dim"], args["depth"]
        (H, W), (ph, pw) = (_pair(args["image_size"]), _pair(args["patch_size"]))
        patches = (H // ph) * (W // pw)
        embeddings = D + (patches + 1) * D + D * args["in_channels"] * ph * pw + D
        qkv_bias = 3 * D if args["qkv_bias"] else 0
        layer = 4 * D * D + qkv_bias + D + 2 * I * D + I + D + 4 * D  # attention, MLP, norms
        return embeddings + L * layer + 2 * D
    H, I, L = args["hidden_size"], args["intermediate_size"], args["num_layers"]
    embeddings = (args["vocab_size"] + args["max_position"] + args["type_vocab_size"]) * H + 2 * H
    layer = 4 * H * H + 4 * H + 2 * I * H + I + H + 4 * H  # attention, MLP, norms
    return embeddings + L * layer


def _mamba_elements(c: MambaConfig) -> int:
    """The parameters of Mamba's backbone (the LM's tied head adds none)."""
    H, E, N, R, K = (c.hidden_size, c.intermediate_size, c.state_size, c.time_step_rank,
                     c.conv_kernel)
    bias, conv_bias = (E * 2 + H) * c.use_bias, E * c.use_conv_bias
    mixer = 2 * E * H + E * K + (R + 2 * N) * E + E * R + E + E * N + E + H * E
    return c.vocab_size * H + c.num_hidden_layers * (H + mixer + bias + conv_bias) + H


def _pair(value) -> tuple:
    return (value, value) if isinstance(value, int) else tuple(value)


def _has_place(base, arch: _Architecture, layers: int):
    """A test of checkpoint names: is this one in the tables of a model of ``layers``
    encoder layers? Costs the file's names, not the layers (a config may say 10**9)."""
    def names(n):
        if base is ViT:
            return {t for e in _vit_entries(n) for t in e.theirs}
        if base in (MambaModel, MambaForCausalLM):
            return {t for e in _mamba_entries("", n) + list(arch.heads) for t in e.theirs}
        table = _bert_entries("" if base is Bert else "bert.", n) + list(arch.heads)
        return {t for e in table for t in e.theirs}

    outside = names(0)
    layer = re.compile(rf"^{arch.base}\.{re.escape(arch.layer)}\.([0-9]{{1,9}})\.(.*)$")
    inside = {layer.match(t)[2] for t in names(1) - outside}

    def test(name: str) -> bool:
        m = layer.match(name)
        return name in outside if m is None else int(m[1]) < layers and m[2] in inside
    return test


def _sizes(fields: _Fields) -> str:
    """The config's sizing fields, for messages."""
    names = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size",
             "max_position_embeddings", "image_size", "patch_size", "num_labels",
             "state_size", "expand", "conv_kernel", "time_step_rank")
    return ", ".join(f"{n}={fields.data[n]!r:.40}" for n in names if n in fields.data)


def _check_paid(base, args: dict, tensors: dict, has_place, config_path: Path,
                weights_path: Path, fields: _Fields) -> int:
    """The elements of the file's tensors that the model has a place for; refuses a config
    whose encoder needs more (whatever max_bytes: the config and the file disagree)."""
    paid = sum(tensor.size for name, tensor in tensors.items() if has_place(name))
    need = _body_elements(base, args)
    if need > paid:
        raise ValueError(f"'{config_path}' describes an encoder of {need} parameters "
                         f"({_sizes(fields)}) but '{weights_path}' holds {paid} elements for "
                         "it; the config and the weights do not match")
    return paid


# ----- loading ---------------------------------------------------------------------------------
def _build(cls, base, args: dict, fields: _Fields, dtype, num_labels):
    """The nnkit model of class ``cls`` with the base model ``args`` (fresh weights)."""
    if base in (MambaModel, MambaForCausalLM):
        return cls(MambaConfig(**args), dtype=dtype)
    if base is ViT:
        model = cls(**args, dtype=dtype)
        model.id2label = _labels(fields, num_labels)
        return model
    if base in (Bert, BertForPreTraining):
        if base is BertForPreTraining:
            fields.require("tie_word_embeddings", (True,), True,
                           "nnkit's MLM decoder is the word embedding itself (tied)")
        return cls(**args, dtype=dtype)
    if base is BertForQuestionAnswering:
        if _label_count(fields) != 2:
            raise fields.error("id2label" if "id2label" in fields.data else "num_labels",
                               "question answering has 2 labels (start, end)")
        return cls(Bert(**args, dtype=dtype))
    id2label = _labels(fields, num_labels)
    dropout = fields.get("classifier_dropout", "float", None, nullable=True)
    model = cls(Bert(**args, dtype=dtype), len(id2label), dropout)
    model.id2label = id2label
    return model


def _built(cls, base, args: dict, fields: _Fields, dtype, num_labels, budget,
           weights_path: Path):
    """``_build`` under the allocation ``budget`` (None: no limit); its refusals as
    ValueErrors naming config.json (and the field where one is to blame)."""
    config_path = fields.path
    try:
        with allocation_budget(budget) if budget is not None else contextlib.nullcontext():
            return _build(cls, base, args, fields, dtype, num_labels)
    except BudgetExceeded as exc:
        raise ValueError(f"'{config_path}' describes a model that needs {exc.nbytes} bytes for "
                         f"{exc.what} ({_sizes(fields)}), more than '{weights_path}' holds "
                         f"plus max_bytes; pass a larger max_bytes (or None) if you trust the "
                         "folder") from None
    except MemoryError:
        raise MemoryError(f"'{config_path}' describes a model ({_sizes(fields)}) that this "
                          f"machine could not allocate") from None
    except (TypeError, ValueError) as exc:
        if str(exc).startswith(f"'{config_path}'"):
            raise
        raise ValueError(f"'{config_path}': its fields do not make a valid {cls.__name__} "
                         f"({exc})") from None


def _arguments(base, fields: _Fields, num_labels) -> dict:
    """The base model's constructor arguments (BERT's, ViT's or Mamba's), checked."""
    if base in (MambaModel, MambaForCausalLM):
        if num_labels is not None:
            raise ValueError(f"num_labels is for classifiers; {base.__name__} has no labels")
        return mamba_arguments(fields)
    return vit_arguments(fields, num_labels) if base is ViT else bert_arguments(fields)


def _gather(entry: _Entry, tensors: dict, path: Path, fields: _Fields, shape, dtype):
    """The nnkit array of ``entry`` from the file's tensors (``TensorEntry``s: dtype and
    shape checked before any is read); None when an optional entry is absent."""
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
    found = [tensors[name] for name in entry.theirs]
    for name, tensor in zip(entry.theirs, found, strict=True):
        if tensor.dtype.kind != "f":
            raise ValueError(f"'{path}': tensor '{name}' has dtype {tensor.dtype}; weights "
                             "must be floating-point")
    expected = _their_shapes(entry, shape)
    for name, tensor, want in zip(entry.theirs, found, expected, strict=True):
        if tuple(tensor.shape) != want:
            sizes = ", ".join(f"{f}={fields.data[f]!r:.40}" for f in entry.fields
                              if f in fields.data)
            raise ValueError(f"'{path}': tensor '{name}' has shape {tuple(tensor.shape)} but "
                             f"'{fields.path}' ({sizes or ', '.join(entry.fields)}) needs "
                             f"{want}; the config and the weights do not match")
    arrays = [tensor.read() for tensor in found]
    array = np.concatenate(arrays, axis=0) if entry.kind == "qkv" else arrays[0]
    return np.asarray(array, dtype=dtype)


def _their_shapes(entry: _Entry, shape) -> list[tuple]:
    """The shapes the checkpoint tensors of ``entry`` must have for nnkit's ``shape``."""
    if entry.kind == "qkv":
        return [(shape[0] // 3, *shape[1:])] * 3
    return [tuple(shape)]


def _patch_shape(model: ViT) -> tuple:
    return (model.dim, model.in_channels, *model.patch_size)


def _tied_lm_head(tensors: dict, used: set) -> None:
    """A Mamba LM file's ``lm_head.weight`` beside the embedding it is tied to: used when
    equal to it, else reported as unused (transformers ties them after loading)."""
    name, tied = "lm_head.weight", "backbone.embeddings.weight"
    if name in tensors and tied in tensors and tensors[name].shape == tensors[tied].shape \
            and np.array_equal(tensors[name].read(), tensors[tied].read()):
        used.add(name)


def _tied_decoder(tensors: dict, used: set) -> None:
    """The MLM decoder tensors a file may hold beside what they are tied to (the word
    embedding, the MLM bias): used when equal to it, reported as unused otherwise (as
    transformers, which ties them after loading); an older file's only MLM bias is taken.
    Read only when their shapes are the same (so the file pays for them)."""
    pairs = (("cls.predictions.decoder.weight", "bert.embeddings.word_embeddings.weight"),
             ("cls.predictions.decoder.bias", "cls.predictions.bias"))
    for name, tied in pairs:
        if name not in tensors:
            continue
        if name.endswith("bias") and tied not in tensors:  # an older file's only MLM bias
            tensors[tied] = tensors[name]
            used.add(name)
        elif tied in tensors and tensors[name].shape == tensors[tied].shape and \
                np.array_equal(tensors[name].read(), tensors[tied].read()):
            used.add(name)


def _check_unused(unused: list, base: str, path: Path, fields: _Fields) -> None:
    """Unused tensors of the encoder itself mean the config and the file disagree."""
    if base == "backbone":  # Mamba: every tensor under it is the backbone's
        body = [n for n in unused if n.startswith("backbone.")]
        if body:
            raise ValueError(f"'{path}' holds the tensor {quote(body[0], 80)}, which the "
                             f"model that '{fields.path}' describes has no place for "
                             f"({_sizes(fields)}, use_bias="
                             f"{fields.data.get('use_bias', False)!r:.40}, use_conv_bias="
                             f"{fields.data.get('use_conv_bias', True)!r:.40}); the config "
                             "and the weights do not match")
        return
    body = [n for n in unused if n.startswith((f"{base}.encoder.", f"{base}.embeddings."))]
    if body:
        raise ValueError(f"'{path}' holds the tensor {quote(body[0], 80)}, which the model "
                         f"that '{fields.path}' describes has no place for (num_hidden_layers="
                         f"{fields.data.get('num_hidden_layers')!r:.40}, qkv_bias="
                         f"{fields.data.get('qkv_bias', True)!r:.40}); the config and the "
                         "weights do not match")


def _listed(names: list, most: int = 20) -> str:
    """Names for a warning: each cut short, at most ``most`` of them."""
    shown = ", ".join(quote(n, 80) for n in names[:most])
    return f"[{shown}{f', ... ({len(names)} in all)' if len(names) > most else ''}]"


def load_pretrained(cls, folder, *, dtype=None, num_labels=None, max_bytes=MAX_BYTES,
                    output_loading_info: bool = False):
    """``cls`` (one of nnkit's BERT classes, ``ViT``, ``MambaModel`` or
    ``MambaForCausalLM``) built from a Hugging Face folder.

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
    max_bytes : int >= 0 or None
        What loading may allocate beyond the file's tensors that the model uses (new heads,
        label names, a preprocessor's images); a config that asks for more is refused
        before it allocates. None lifts the limit (for folders you trust). A config whose
        encoder needs more parameters than the file holds is refused whatever the limit.
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
    if max_bytes is not None and (isinstance(max_bytes, bool) or
                                  not isinstance(max_bytes, numbers.Integral) or max_bytes < 0):
        raise ValueError(f"max_bytes must be an int >= 0 or None, got {max_bytes!r:.100}")
    config_path, data = read_config(folder)
    fields = _Fields(config_path, data)
    _model_type(fields, arch.model_type)
    weights_path, found = _weight_entries(folder)
    tensors = _canonical(found, arch.base, weights_path)
    layers = _layer_count(tensors, arch)
    declared = fields.get("num_hidden_layers", "int", arch.default_layers)
    if layers != declared:
        raise fields.error("num_hidden_layers", f"but '{weights_path}' holds {layers} encoder "
                                                "layers; the config and the weights do not "
                                                "match")
    args = _arguments(base, fields, num_labels)
    paid = _check_paid(base, args, tensors, _has_place(base, arch, layers), config_path,
                       weights_path, fields)
    budget = None if max_bytes is None else paid * dtype.itemsize + max_bytes
    model = _built(cls, base, args, fields, dtype, num_labels, budget, weights_path)
    if base is ViT and (config_path.parent / PREPROCESSOR_FILE).exists():
        path = config_path.parent / PREPROCESSOR_FILE
        model.preprocessing = preprocess_arguments(
            path, read_json(path, _MAX_CONFIG_BYTES), num_channels=model.in_channels,
            max_bytes=max_bytes)
    own = model.state_dict()
    table = _entries(model)
    used = {name for entry in table for name in entry.theirs if name in tensors}
    if base is BertForPreTraining:
        _tied_decoder(tensors, used)
    if base is MambaForCausalLM and model.config.tie_word_embeddings:
        _tied_lm_head(tensors, used)
    unused = [name for name in tensors if name not in used]
    _check_unused(unused, arch.base, weights_path, fields)
    state, missing = {}, []
    for entry in table:
        shape = _patch_shape(model) if entry.kind == "patch" else own[entry.ours].shape
        array = _gather(entry, tensors, weights_path, fields, shape, dtype)
        if array is None:
            if arch.pooler or ".pooler." not in f".{entry.ours}":  # else unused by forward
                missing.append(entry.ours)
            continue
        if entry.kind == "patch":
            array = array.reshape(own[entry.ours].shape)
        state[entry.ours] = array
    model.load_state_dict(state, strict=False)
    model.eval()
    if missing:
        warnings.warn(f"{cls.__name__}: '{weights_path}' does not hold {missing}; these "
                      "parameters are newly initialised: train the model before using it "
                      "for predictions", NewlyInitializedWarning, stacklevel=3)
    if unused:
        warnings.warn(f"{cls.__name__}: tensors of '{weights_path}' not used: "
                      f"{_listed(unused)} (the checkpoint holds parts that {cls.__name__} "
                      "does not have)", UnusedWeightsWarning, stacklevel=3)
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


def _mamba_config(config: MambaConfig) -> dict:
    fields = config.to_dict()
    return {"model_type": "mamba", **fields, "intermediate_size": config.intermediate_size}


def _config(model, base, arch: _Architecture) -> dict:
    """config.json of ``model``: transformers' fields for the same architecture."""
    if base in (MambaModel, MambaForCausalLM):
        config = _mamba_config(model.config)
    elif base is ViT:
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
    folder = ensure_folder(folder)
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
    """Write ``data`` as indented JSON, atomically (a symlink at ``path`` is replaced)."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))
