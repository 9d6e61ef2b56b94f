"""Layers and containers (``nk.nn``), torch-compatible names and ``state_dict`` layouts."""

from . import conv, deltanet, init, layers, linear_recurrent, loss, mamba, module, transformer
from .attention import MultiheadAttention
from .conv import AvgPool2d, Conv1d, Conv2d, MaxPool2d
from .deltanet import DeltaNet, DeltaNetState, ShortConvolution
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
from .mamba import Mamba, MambaState, RMSNorm
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

__all__ = ["init", *module.__all__, *layers.__all__, *loss.__all__, *conv.__all__,
           *linear_recurrent.__all__, *mamba.__all__, *deltanet.__all__, "RNN", "LSTM", "GRU",
           "MultiheadAttention", *transformer.__all__]
