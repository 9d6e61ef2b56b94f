"""Recurrent layers: ``nn.RNN`` (Elman), ``nn.LSTM``, ``nn.GRU``, torch-compatible.

Constructor arguments, parameter names (``weight_ih_l{k}``, ``weight_hh_l{k}``,
``bias_ih_l{k}``, ``bias_hh_l{k}``, ``..._reverse``), shapes, gate order and default
initialisation U(-1/sqrt(H), 1/sqrt(H)) are torch's, so
``model.load_state_dict(torch_model.state_dict())`` ports the weights and gives the same
numbers. Each layer-direction is one autograd node whose forward and backward through time
are the fused kernels of ``nnkit.kernels.recurrent``.

The notation of notes §5 and torch's  (and underline the heading to the new length: 38 '-')
--------------------------------------------
Elman RNN, z_t = phi(U z_{t-1} + V x_t): the state z_t is torch's h_t, U = ``weight_hh``,
V = ``weight_ih`` (torch adds the biases ``bias_hh``, ``bias_ih``); the output map
G[W](z) = psi(W z) is not part of the layer (add an ``nn.Linear``).

LSTM (notes §5.1): the cell state z_t is torch's c_t, the hidden state zeta_t is torch's
h_t; x~_t = [zeta_{t-1}, x_t], so each matrix of notes §5.1 is a pair of row blocks of
[``weight_hh``, ``weight_ih``]: F (forget gate) = rows [H, 2H) (f), G (the gate that lets new
information in) = rows [0, H) (i), V (new content, tanh) = rows [2H, 3H) (g), H (output
gate) = rows [3H, 4H) (o). The tanh(U z_t) of notes §5.1 is torch's plain tanh(c_t) (U = I).

GRU (notes §5.1): its z_t is torch's h_t, its sigma(G x~_t) is torch's update gate z (rows
[H, 2H)), its zeta_t = sigma(H [z_{t-1}, x_t]) is the reset gate r (rows [0, H)) and the
new content z~_t = tanh(V [zeta_t * z_{t-1}, x_t]) is n (rows [2H, 3H)), except that torch
applies r after the matrix product: n = tanh(W_in x + b_in + r * (W_hn h + b_hn)).
"""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import threading

import numpy as np

from .. import functional as F
from .._backend import array_module
from .._validation import check_bool, check_choice, check_input_dtype, check_scalar
from ..autograd import Tensor, apply_op, as_tensor, concat, records, stack
from ..kernels import recurrent as K
from . import init
from .module import Module, Parameter

__all__ = ["RNN", "LSTM", "GRU", "record_hidden_grads"]

_GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}
_recorder = threading.local()


@contextlib.contextmanager
def record_hidden_grads():
    """Within the block, every recurrent layer run forward registers its total dL/dh_t.

    Yields a dict ``{(id(module), layer, direction): array (T, B, H)}``: each layer-direction
    that runs its forward inside the block puts a zeros array there, which its backward
    (whenever it runs, inside the block or after it) fills with the hidden-state gradient
    of every step; zeros where no gradient reaches the layer (``nk.analysis`` reads it).
    """
    previous = getattr(_recorder, "store", None)
    _recorder.store = {}
    try:
        yield _recorder.store
    finally:
        _recorder.store = previous


def _layer_op(cell, x, h0, c0, params, nonlinearity, reverse, tag=None):
    """One layer-direction as one autograd node, the kernel pair of ``nnkit.kernels
    .recurrent`` as it is: (y (T, B, H), h_T (B, H)), and c_T (B, H) for the LSTM, as
    Tensors. Inside ``record_hidden_grads`` the backward also fills the store's array under
    ``tag``."""
    biases = tuple(params[2:]) if len(params) == 4 else (None, None)
    states = (h0, c0) if cell == "LSTM" else (h0,)
    parents = (x, *states, params[0], params[1], *biases)
    name = cell.lower()
    forward, backward = getattr(K, f"{name}_forward"), getattr(K, f"{name}_backward")
    store = getattr(_recorder, "store", None)
    if store is not None:
        hidden = array_module(x.data).zeros((x.shape[0], *h0.shape), dtype=x.data.dtype)
        store[tag] = hidden
        backward = functools.partial(backward, hidden_grads=hidden)
    options = {"nonlinearity": nonlinearity} if cell == "RNN" else {}
    keep = records(tuple(p for p in parents if p is not None))  # else no cache is kept
    return apply_op(name, forward, backward, parents, reverse=reverse, keep_cache=keep,
                    **options)


class _RNNBase(Module):
    """Shared constructor, parameters and stacking/bidirectional logic."""

    mode: str  # the cell, "RNN", "LSTM" or "GRU": set by each subclass

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, dtype=None):
        super().__init__()
        self.input_size = check_scalar(input_size, name="input_size", kind=numbers.Integral,
                                       low=1)
        self.hidden_size = check_scalar(hidden_size, name="hidden_size",
                                        kind=numbers.Integral, low=1)
        self.num_layers = check_scalar(num_layers, name="num_layers", kind=numbers.Integral,
                                       low=1)
        self.dropout = float(check_scalar(dropout, name="dropout", low=0.0, high=1.0))
        self.bias = check_bool(bias, name="bias")
        self.batch_first = check_bool(batch_first, name="batch_first")
        self.bidirectional = check_bool(bidirectional, name="bidirectional")
        dtype = np.dtype(np.float32 if dtype is None else dtype)
        if dtype.kind != "f":
            raise TypeError(f"dtype must be float32 or float64, got {dtype}")
        G, H = _GATES[self.mode], hidden_size
        for k in range(num_layers):
            layer_in = input_size if k == 0 else H * self.num_directions
            for sfx in self._suffixes():
                setattr(self, f"weight_ih_l{k}{sfx}", Parameter.empty((G * H, layer_in), dtype))
                setattr(self, f"weight_hh_l{k}{sfx}", Parameter.empty((G * H, H), dtype))
                if self.bias:
                    setattr(self, f"bias_ih_l{k}{sfx}", Parameter.empty(G * H, dtype))
                    setattr(self, f"bias_hh_l{k}{sfx}", Parameter.empty(G * H, dtype))
        self.reset_parameters()

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _suffixes(self):
        return ("", "_reverse") if self.bidirectional else ("",)

    def reset_parameters(self) -> None:
        """Every parameter ~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)), as torch."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def _layer_params(self, k, sfx):
        names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if self.bias else [])
        return [getattr(self, f"{n}_l{k}{sfx}") for n in names]

    # ----- validation -------------------------------------------------------------------
    def _check_x(self, x):
        x = as_tensor(x)
        name = type(self).__name__
        check_input_dtype(x, self.weight_ih_l0.dtype, name="x", owner=name)
        layout = "(B, T, input_size)" if self.batch_first else "(T, B, input_size)"
        if x.ndim not in (2, 3):
            raise ValueError(f"x has shape {x.shape} but {name} expects a 3-D input of shape "
                             f"{layout} (or 2-D (T, input_size) unbatched)")
        if x.shape[-1] != self.input_size:
            raise ValueError(f"x has shape {x.shape}, {x.shape[-1]} features, but {name} was "
                             f"built with input_size={self.input_size}; expected shape "
                             f"{layout.replace('input_size', str(self.input_size))}")
        t_axis = 1 if (self.batch_first and x.ndim == 3) else 0
        if x.shape[t_axis] == 0:
            raise ValueError(f"x has shape {x.shape}: an empty sequence (T = 0); expected "
                             f"shape {layout} with T >= 1")
        return x

    def _check_state(self, s, name, batch, dtype, unbatched, xp=np):
        L = self.num_layers * self.num_directions
        shape = (L, self.hidden_size) if unbatched else (L, batch, self.hidden_size)
        if s is None:  # zeros where x lives
            return Tensor(xp.zeros((L, batch, self.hidden_size), dtype))
        s = as_tensor(s)
        if s.shape != shape:
            raise ValueError(
                f"{name} has shape {s.shape} but expected {shape} = (num_layers * "
                f"num_directions, {'' if unbatched else 'B, '}hidden_size) for "
                f"{type(self).__name__}(num_layers={self.num_layers}, "
                f"bidirectional={self.bidirectional}, hidden_size={self.hidden_size})")
        if s.dtype != dtype:
            raise TypeError(f"{name} has dtype {s.dtype} but the parameters are {dtype}")
        return s.unsqueeze(1) if unbatched else s

    # ----- forward ------------------------------------------------------------------------
    def _run(self, x, hx):
        """x (T, B, F) tensor, hx list of state tensors (L*D, B, H) -> output, finals."""
        finals = [[] for _ in hx]
        inp = x
        for k in range(self.num_layers):
            outs = []
            for d, sfx in enumerate(self._suffixes()):
                idx = k * self.num_directions + d
                states = [s[idx] for s in hx]
                y, *last = _layer_op(self.mode, inp, states[0],
                                     states[1] if len(states) > 1 else None,
                                     self._layer_params(k, sfx),
                                     getattr(self, "nonlinearity", ""), reverse=d == 1,
                                     tag=(id(self), k, d))
                for f, state in zip(finals, last, strict=True):  # h_T (and c_T)
                    f.append(state)
                outs.append(y)
            inp = outs[0] if len(outs) == 1 else concat(outs, axis=-1)
            if self.dropout and self.training and k < self.num_layers - 1:
                inp = F.dropout(inp, self.dropout, training=True)
        return inp, [stack(f, axis=0) for f in finals]

    def _forward(self, x, hx_list, names):
        x = self._check_x(x)
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(1)  # (T, 1, F)
        elif self.batch_first:
            x = x.swapaxes(0, 1)  # (B, T, F) -> (T, B, F)
        batch = x.shape[1]
        xp = array_module(x.data)
        states = [self._check_state(s, n, batch, x.dtype, unbatched, xp)
                  for s, n in zip(hx_list, names, strict=True)]
        out, finals = self._run(x, states)
        if unbatched:
            return out.squeeze(1), [f.squeeze(1) for f in finals]
        if self.batch_first:
            out = out.swapaxes(0, 1)  # (T, B, D*H) -> (B, T, D*H)
        return out, finals

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        for name, default in (("bias", True), ("batch_first", False), ("dropout", 0.0),
                              ("bidirectional", False)):
            if getattr(self, name) != default:
                s += f", {name}={getattr(self, name)}"
        return s


_SHAPES_DOC = """
    Parameters
    ----------
    input_size : int
        Features of x (F).
    hidden_size : int
        Features of the hidden state (H).
    num_layers : int
        Stacked layers: layer k > 0 reads layer k-1's output (z_{t,l} = phi(U_l z_{t-1,l} +
        V_l z_{t,l-1}) in notes §5).
    bias : bool
        Add ``bias_ih`` and ``bias_hh``.
    batch_first : bool
        x and output are (B, T, .) instead of (T, B, .); the states keep (L*D, B, H).
    dropout : float
        Dropout on the outputs of every layer but the last, in training mode (as torch).
    bidirectional : bool
        Add a reverse direction per layer; outputs are concatenated (D = 2).
    dtype : float32 (default) or float64

    Notes
    -----
    Shapes:

    - x : (T, B, F), (B, T, F) with batch_first, or (T, F) unbatched
    - output : (T, B, D * H) (batch_first: (B, T, D * H)), h_t of the last layer
    - h_0, h_n (and c_0, c_n) : (num_layers * D, B, H), ordered layer by layer, forward then
      reverse; h_n[k * D + d] is the last state that direction reached (t = T-1 forward,
      t = 0 reverse).

    Parameters (as torch): weight_ih_l{k}[_reverse] (G*H, F or D*H), weight_hh_l{k} (G*H, H),
    bias_ih_l{k}, bias_hh_l{k} (G*H,), all ~ U(-1/sqrt(H), 1/sqrt(H)).
"""


class RNN(_RNNBase):
    mode = "RNN"
    __doc__ = """Elman RNN: h_t = phi(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh), G = 1.

    ``nonlinearity`` is 'tanh' (default) or 'relu'. ``forward(x, h0=None) -> (output, h_n)``.
    """ + _SHAPES_DOC + """
    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> rnn = nk.nn.RNN(3, 5, num_layers=2)
    >>> out, h_n = rnn(np.zeros((7, 2, 3), np.float32))
    >>> out.shape, h_n.shape
    ((7, 2, 5), (2, 2, 5))
    """

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, dtype=None):
        nl = check_choice(nonlinearity, name="nonlinearity", choices=("tanh", "relu"))
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, dtype)
        self.nonlinearity = nl

    def forward(self, x, h0=None):
        out, (h_n,) = self._forward(x, [h0], ["h0"])
        return out, h_n

    def extra_repr(self) -> str:
        extra = "" if self.nonlinearity == "tanh" else f", nonlinearity={self.nonlinearity!r}"
        return super().extra_repr() + extra


class LSTM(_RNNBase):
    mode = "LSTM"
    __doc__ = """LSTM, gates (i, f, g, o), G = 4::

        i, f, o = sigmoid(.), g = tanh(.)  of  x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh
        c_t = f * c_{t-1} + i * g,   h_t = o * tanh(c_t)

    ``forward(x, hx=None) -> (output, (h_n, c_n))`` with ``hx = (h_0, c_0)``.
    """ + _SHAPES_DOC + """
    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> lstm = nk.nn.LSTM(3, 5, bidirectional=True)
    >>> out, (h_n, c_n) = lstm(np.zeros((7, 2, 3), np.float32))
    >>> out.shape, c_n.shape
    ((7, 2, 10), (2, 2, 5))
    """

    def forward(self, x, hx=None):
        if hx is None:
            hx = (None, None)
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise TypeError(f"LSTM's hx must be a tuple (h0, c0), got {type(hx).__name__}")
        out, (h_n, c_n) = self._forward(x, list(hx), ["h0", "c0"])
        return out, (h_n, c_n)


class GRU(_RNNBase):
    mode = "GRU"
    __doc__ = """GRU, gates (r, z, n), G = 3::

        r = sigmoid(W_ir x + b_ir + W_hr h + b_hr),  z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
        n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),  h_t = (1 - z) * n + z * h_{t-1}

    ``forward(x, h0=None) -> (output, h_n)``.
    """ + _SHAPES_DOC + """
    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> gru = nk.nn.GRU(3, 5, batch_first=True)
    >>> out, h_n = gru(np.zeros((2, 7, 3), np.float32))
    >>> out.shape, h_n.shape
    ((2, 7, 5), (1, 2, 5))
    """

    def forward(self, x, h0=None):
        out, (h_n,) = self._forward(x, [h0], ["h0"])
        return out, h_n
