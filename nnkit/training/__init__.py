"""Training: the loop helpers (minibatches, predictions, accuracy) and the recipes the tour,
the examples and the benchmarks share, one module per model family: ``mlp`` (digits),
``vit`` (the digits ViT), ``bert`` (pretraining and fine-tuning epochs) and ``recurrent``
(the adding problem)."""

from __future__ import annotations

from .bert import finetune_head, head_accuracy, pretrain_epoch, text_batches, unigram_accuracy
from .loops import accuracy, minibatches, predict_classes
from .mlp import train_mlp_digits
from .recurrent import train_adding_problem
from .vit import DIGITS_VIT, make_digits_vit, train_vit

__all__ = [
    "minibatches",
    "accuracy",
    "predict_classes",
    "train_mlp_digits",
    "DIGITS_VIT",
    "make_digits_vit",
    "train_vit",
    "pretrain_epoch",
    "finetune_head",
    "head_accuracy",
    "unigram_accuracy",
    "text_batches",
    "train_adding_problem",
]
