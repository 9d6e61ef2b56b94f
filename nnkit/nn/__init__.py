"""Layers and containers (``nk.nn``), torch-compatible names and ``state_dict`` layouts."""

from . import init
from .attention import MultiheadAttention
from .conv import AvgPool2d, Conv1d, Conv2d, MaxPool2d
from .layers import (
    GELU,
    Dropout,
    Embedding,
    Flatten,
    Identity,
    LayerNorm,
    Linear,
    ReLU,
    Residual,
    Sigmoid,
    Softmax,
    Tanh,
)
from .linear_recurrent import LRU, MinGRU, MinLSTM
from .loss import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from .module import Module, ModuleList, Parameter, Sequential
from .recurrent import GRU, LSTM, RNN
from .transformer import (
    Transformer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    generate_square_subsequent_mask,
)

__all__ = [
    "init",
    "Module",
    "Parameter",
    "Sequential",
    "ModuleList",
    "Linear",
    "Embedding",
    "LayerNorm",
    "Dropout",
    "ReLU",
    "Sigmoid",
    "Tanh",
    "GELU",
    "Softmax",
    "Flatten",
    "Identity",
    "Residual",
    "MSELoss",
    "CrossEntropyLoss",
    "BCEWithLogitsLoss",
    "Conv1d",
    "Conv2d",
    "MaxPool2d",
    "AvgPool2d",
    "MinGRU",
    "MinLSTM",
    "LRU",
    "RNN",
    "LSTM",
    "GRU",
    "MultiheadAttention",
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
    "generate_square_subsequent_mask",
]
