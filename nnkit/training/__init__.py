"""Training: the loop helpers (minibatches, predictions, accuracy) and the recipes the tour,
the examples and the benchmarks share, one module per model family: ``mlp`` and ``cnn`` (digits),
``vit`` (the digits ViT), ``bert`` (pretraining and fine-tuning epochs), ``recurrent``
(the adding problem; an LRU read by an MLP or a linear map on a product of delayed inputs)
and ``recall`` (associative recall with DeltaNet, Mamba or attention)."""

from __future__ import annotations

from . import bert, cnn, loops, mlp, recall, recurrent, vit
from .bert import finetune_head, head_accuracy, pretrain_epoch, text_batches, unigram_accuracy
from .cnn import lenet_digits, train_cnn_digits
from .loops import accuracy, minibatches, predict_classes, train_epoch
from .mlp import train_mlp_digits
from .recall import CausalAttention, Recaller, train_recall
from .recurrent import delayed_product, lru_readout_model, train_adding_problem, train_lru_readout
from .vit import make_digits_vit, train_vit

#: The digits model (16 tokens of 2x2 pixels + [CLS], 3 layers, 8 heads of 8 features).
DIGITS_VIT = vit.DIGITS_VIT

__all__ = [*loops.__all__, *mlp.__all__, *cnn.__all__, *recurrent.__all__, *vit.__all__,
           *bert.__all__, *recall.__all__]
