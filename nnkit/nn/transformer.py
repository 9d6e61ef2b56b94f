"""Transformer layers (Vaswani et al. 2017), torch-compatible.

``TransformerEncoderLayer``, ``TransformerDecoderLayer``, ``TransformerEncoder``,
``TransformerDecoder`` and ``Transformer`` take torch's constructor arguments and hold
torch's sub-modules (``self_attn``, ``multihead_attn``, ``linear1``, ``dropout``,
``linear2``, ``norm1..3``, ``dropout1..3``, ``layers.{i}``, ``encoder``, ``decoder``), so
``load_state_dict(torch_model.state_dict())`` gives the same numbers.

Post-norm (``norm_first=False``, the paper):  x = norm1(x + SA(x)); x = norm2(x + FF(x)).
Pre-norm (``norm_first=True``, Xiong et al. 2020): x = x + SA(norm1(x)); x = x + FF(norm2(x)).
FF(x) = linear2(dropout(activation(linear1(x)))). The decoder layer adds cross-attention to
the encoder's output (``memory``) between the two, with norm2, and its feed-forward uses norm3.

Masks follow ``nn.MultiheadAttention``: a bool mask is True where attention is NOT allowed,
a float mask is added to the scores; ``generate_square_subsequent_mask(T)`` is the causal
(T, T) float mask (-inf above the diagonal). torch's nested-tensor fast path (which, in eval
mode without gradients, writes zeros at padded positions) does not exist here: every position
is computed.
"""

from __future__ import annotations

import numbers

import numpy as np

from .. import functional as F
from .._backend import array_module
from .._validation import check_input_dtype, check_scalar
from ..autograd import Tensor, as_tensor
from . import init
from .attention import MultiheadAttention
from .layers import Dropout, LayerNorm, Linear, _dtype
from .module import Module, ModuleList, deepcopies

__all__ = [
    "TransformerEncoderLayer",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerDecoder",
    "Transformer",
    "generate_square_subsequent_mask",
]


def generate_square_subsequent_mask(sz: int, dtype=np.float32) -> np.ndarray:
    """The causal mask (sz, sz): 0 on and below the diagonal, -inf above it.

    Position i may attend to positions j <= i. Same values as torch's
    ``nn.Transformer.generate_square_subsequent_mask``.
    """
    check_scalar(sz, name="sz", kind=numbers.Integral, low=0)
    return np.triu(np.full((sz, sz), -np.inf, dtype=_dtype(dtype)), k=1)


def _activation_fn(activation):
    """'relu' -> F.relu, 'gelu' -> F.gelu, or the callable itself (a function or Module)."""
    if isinstance(activation, str):
        if activation == "relu":
            return F.relu
        if activation == "gelu":
            return F.gelu
        raise ValueError(f"activation must be 'relu', 'gelu' or a callable, got {activation!r}")
    if not callable(activation):
        raise TypeError(f"activation must be 'relu', 'gelu' or a callable, got "
                        f"{type(activation).__name__}")
    return activation


def _check_sizes(d_model, nhead, dim_feedforward) -> None:
    check_scalar(d_model, name="d_model", kind=numbers.Integral, low=1)
    check_scalar(nhead, name="nhead", kind=numbers.Integral, low=1)
    check_scalar(dim_feedforward, name="dim_feedforward", kind=numbers.Integral, low=1)
    if d_model % nhead:
        raise ValueError(f"d_model={d_model} is not divisible by nhead={nhead}: each "
                         "attention head gets d_model // nhead features")


def _check_model_inputs(layer: Module, **inputs) -> list[Tensor]:
    """The layer's inputs (name=value) as Tensors of shape (T, N, E), (N, T, E) or (T, E),
    E = ``layer.d_model`` (every shape first), then of the dtype of its parameters."""
    d_model = layer.d_model
    tensors = [as_tensor(x) for x in inputs.values()]
    for name, x in zip(inputs, tensors, strict=True):
        if x.ndim not in (2, 3) or x.shape[-1] != d_model:
            raise ValueError(f"{name} has shape {x.shape} but the layer was built with "
                             f"d_model={d_model}; expected (T, N, {d_model}), (N, T, "
                             f"{d_model}) with batch_first, or (T, {d_model}) unbatched")
    for name, x in zip(inputs, tensors, strict=True):
        if x.dtype.kind == "f":  # other dtypes: the ops' own messages
            check_input_dtype(x, layer.linear1.weight.dtype, name=name,
                              owner=type(layer).__name__)
    return tensors


def _seq_len(x: Tensor, batch_first: bool) -> int:
    if x.ndim == 2:
        return x.shape[0]
    return x.shape[1] if batch_first else x.shape[0]


def _detect_is_causal_mask(mask, is_causal, size) -> bool:
    """``is_causal`` when given; else whether ``mask`` is the (size, size) causal mask."""
    if is_causal is not None:
        return bool(is_causal)
    if mask is None:
        return False
    data = mask.data if isinstance(mask, Tensor) else mask
    xp = array_module(data)
    data = xp.asarray(data)
    if tuple(data.shape) != (size, size):
        return False
    blocked = xp.triu(xp.ones((size, size), dtype=bool), k=1)
    if data.dtype == bool:
        return bool((data == blocked).all())
    return bool((xp.isneginf(data) == blocked).all() and (data[~blocked] == 0).all())


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward network, each with a residual and LayerNorm.

    Parameters
    ----------
    d_model : int
        Model width E.
    nhead : int
        Attention heads (d_model must be divisible by nhead).
    dim_feedforward : int
        Hidden width of the feed-forward network.
    dropout : float
        Dropout after attention, inside and after the feed-forward network, and on the
        attention probabilities.
    activation : 'relu', 'gelu' or a callable (e.g. ``F.gelu`` or ``nn.GELU()``)
    layer_norm_eps : float
    batch_first : bool
        (N, T, E) instead of (T, N, E).
    norm_first : bool
        Pre-norm instead of post-norm.
    bias : bool
        Biases in the Linear layers, the attention and the LayerNorms.
    dtype : float32 (default) or float64

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.nn.transformer import TransformerEncoderLayer
    >>> layer = TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
    >>> layer(np.zeros((3, 5, 8), dtype=np.float32)).shape     # (N, T, E)
    (3, 5, 8)
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 dtype=None):
        super().__init__()
        _check_sizes(d_model, nhead, dim_feedforward)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation_fn(activation)
        self.d_model = d_model
        self.batch_first = bool(batch_first)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        """src (T, N, E), (N, T, E) with batch_first, or (T, E) -> same shape.

        ``src_mask`` (T, T) or (N * nhead, T, T), ``src_key_padding_mask`` (N, T): see
        ``MultiheadAttention``; ``is_causal`` is a hint that ``src_mask`` is causal.
        """
        (x,) = _check_model_inputs(self, src=src)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


class TransformerDecoderLayer(Module):
    """Masked self-attention, cross-attention to ``memory`` and a feed-forward network.

    Same parameters as ``TransformerEncoderLayer``; sub-modules ``self_attn``,
    ``multihead_attn``, ``linear1``, ``linear2``, ``norm1..3``, ``dropout1..3``.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.nn.transformer import TransformerDecoderLayer
    >>> layer = TransformerDecoderLayer(8, 2, dim_feedforward=16)
    >>> tgt, memory = np.zeros((4, 3, 8), np.float32), np.zeros((6, 3, 8), np.float32)
    >>> layer(tgt, memory).shape                                  # (T, N, E)
    (4, 3, 8)
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True,
                 dtype=None):
        super().__init__()
        _check_sizes(d_model, nhead, dim_feedforward)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout,
                                            batch_first=batch_first, bias=bias, dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout,
                                                 batch_first=batch_first, bias=bias,
                                                 dtype=dtype)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm_first = bool(norm_first)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation_fn(activation)
        self.d_model = d_model
        self.batch_first = bool(batch_first)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False):
        """tgt (T, N, E), memory (S, N, E) (batch first: (N, T, E), (N, S, E)) -> like tgt.

        ``tgt_mask`` (T, T), ``memory_mask`` (T, S) (or per head, (N * nhead, ., .)),
        ``tgt_key_padding_mask`` (N, T), ``memory_key_padding_mask`` (N, S).
        """
        x, memory = _check_model_inputs(self, tgt=tgt, memory=memory)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask,
                                   tgt_is_causal)
            x = x + self._mha_block(self.norm2(x), memory, memory_mask,
                                    memory_key_padding_mask, memory_is_causal)
            return x + self._ff_block(self.norm3(x))
        x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                           memory_is_causal))
        return self.norm3(x + self._ff_block(x))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           is_causal=is_causal, need_weights=False)[0]
        return self.dropout1(x)

    def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal=False):
        x = self.multihead_attn(x, mem, mem, attn_mask=attn_mask,
                                key_padding_mask=key_padding_mask, is_causal=is_causal,
                                need_weights=False)[0]
        return self.dropout2(x)

    def _ff_block(self, x):
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout3(x)


def _clones(module: Module, n: int) -> ModuleList:
    return ModuleList(deepcopies(module, n))


class TransformerEncoder(Module):
    """``num_layers`` deep copies of ``encoder_layer`` (all start equal, as torch), then ``norm``.

    ``enable_nested_tensor`` and ``mask_check`` are accepted for torch compatibility; nnkit
    has no nested tensors, so they change nothing.
    """

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm=None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        if not isinstance(encoder_layer, Module):
            raise TypeError(f"encoder_layer must be a Module, got "
                            f"{type(encoder_layer).__name__}")
        check_scalar(num_layers, name="num_layers", kind=numbers.Integral, low=0)
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        """src (T, N, E) or (N, T, E) -> same shape. ``is_causal=None`` detects a causal
        ``mask`` (equal to ``generate_square_subsequent_mask(T)``)."""
        output = as_tensor(src)
        if self.layers:
            batch_first = self.layers[0].self_attn.batch_first
            is_causal = _detect_is_causal_mask(mask, is_causal, _seq_len(output, batch_first))
        for layer in self.layers:
            output = layer(output, src_mask=mask, is_causal=is_causal,
                           src_key_padding_mask=src_key_padding_mask)
        if self.norm is not None:
            output = self.norm(output)
        return output


class TransformerDecoder(Module):
    """``num_layers`` deep copies of ``decoder_layer``, then ``norm``."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm=None):
        super().__init__()
        if not isinstance(decoder_layer, Module):
            raise TypeError(f"decoder_layer must be a Module, got "
                            f"{type(decoder_layer).__name__}")
        check_scalar(num_layers, name="num_layers", kind=numbers.Integral, low=0)
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, tgt_is_causal=None, memory_is_causal=False):
        """tgt (T, N, E), memory (S, N, E) (or batch first) -> like tgt."""
        output = as_tensor(tgt)
        if self.layers:
            batch_first = self.layers[0].self_attn.batch_first
            tgt_is_causal = _detect_is_causal_mask(tgt_mask, tgt_is_causal,
                                                   _seq_len(output, batch_first))
        for layer in self.layers:
            output = layer(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask,
                           memory_key_padding_mask=memory_key_padding_mask,
                           tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
        if self.norm is not None:
            output = self.norm(output)
        return output


class Transformer(Module):
    """Encoder-decoder transformer, torch's ``nn.Transformer`` (final LayerNorms included).

    Parameters
    ----------
    d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout
        As torch (defaults 512, 8, 6, 6, 2048, 0.1).
    activation, layer_norm_eps, batch_first, norm_first, bias, dtype
        As torch (defaults 'relu', 1e-5, False, False, True).
    custom_encoder, custom_decoder : Module, optional
        Used instead of the built encoder / decoder.

    Notes
    -----
    Every parameter with more than one dimension is re-initialised ``xavier_uniform_``, as torch.

    Examples
    --------
    >>> import numpy as np
    >>> from nnkit.nn.transformer import Transformer
    >>> model = Transformer(8, 2, 1, 1, dim_feedforward=16, batch_first=True)
    >>> src, tgt = np.zeros((2, 5, 8), np.float32), np.zeros((2, 3, 8), np.float32)
    >>> model(src, tgt).shape
    (2, 3, 8)
    """

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", custom_encoder=None,
                 custom_decoder=None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, dtype=None):
        super().__init__()
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                      batch_first, norm_first, bias, dtype)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            self.encoder = TransformerEncoder(
                TransformerEncoderLayer(*layer_args), num_encoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            self.decoder = TransformerDecoder(
                TransformerDecoderLayer(*layer_args), num_decoder_layers,
                LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype))
        self._reset_parameters()
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = bool(batch_first)

    def _reset_parameters(self) -> None:
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)

    generate_square_subsequent_mask = staticmethod(generate_square_subsequent_mask)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None, src_is_causal=None, tgt_is_causal=None,
                memory_is_causal: bool = False):
        """src (S, N, E), tgt (T, N, E) (batch first: (N, S, E), (N, T, E)) -> (T, N, E).

        Masks: ``src_mask`` (S, S), ``tgt_mask`` (T, T), ``memory_mask`` (T, S),
        ``*_key_padding_mask`` (N, S) / (N, T) / (N, S); see ``MultiheadAttention``.
        """
        src, tgt = as_tensor(src), as_tensor(tgt)
        if src.ndim != tgt.ndim:
            raise ValueError(f"src {src.shape} and tgt {tgt.shape} must both be batched (3-D) "
                             "or both unbatched (2-D)")
        b = 0 if self.batch_first else 1
        if src.ndim == 3 and src.shape[b] != tgt.shape[b]:
            raise ValueError(f"src {src.shape} and tgt {tgt.shape} have different batch sizes "
                             f"(axis {b}, batch_first={self.batch_first})")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise ValueError(f"src {src.shape} and tgt {tgt.shape} must have "
                             f"d_model={self.d_model} features")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask,
                            tgt_is_causal=tgt_is_causal, memory_is_causal=memory_is_causal)
