"""DeltaNet's token mixer (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta
Rule over Sequence Length"), as flash-linear-attention's ``fla.layers.DeltaNet``: its
constructor arguments and parameter names, so ``load_state_dict`` takes its weights.

For an input x (batch, T, hidden_size), H heads of dk = key_dim / H and dv = value_dim / H:

    q = act(conv_q(q_proj x)),  k = act(conv_k(k_proj x)),  v = silu(conv_v(v_proj x))
                                          causal depthwise convolutions of conv_size taps
    q, k = l2norm(q), l2norm(k)           per head: x / sqrt(sum(x^2) + 1e-6)
    beta = sigmoid(b_proj x)              (batch, T, H); ones without use_beta
    S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = dk^-1/2 S_t^T q_t
    o = rms_norm(o) * o_norm.weight       per head; times silu(g_proj x) with use_gate
    output = o_proj(o)                    (batch, T, hidden_size)

``F.delta_rule`` runs the recurrence (chunked or step by step), differentiable in everything.
``DeltaNet.step`` decodes one token in O(1); its ``DeltaNetState`` holds the last conv_size
inputs of each convolution (batch, channels, conv_size) and the recurrent state
S (batch, H, dk, dv), plain arrays (no autograd), in fla's cache layouts.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from .. import functional as F
from .._backend import array_module
from .._validation import check_bool, check_choice, check_input_dtype, check_scalar
from ..autograd import Tensor, as_tensor, concat, no_grad, where
from .conv import Conv1d
from .layers import Linear, _dtype
from .mamba import RMSNorm
from .module import Module

__all__ = ["DeltaNet", "DeltaNetState", "ShortConvolution"]

_L2_EPS = 1e-6  # fla's l2norm inside its delta-rule kernels


class ShortConvolution(Conv1d):
    """fla's ``ShortConvolution``: a causal depthwise convolution over time on
    (batch, T, channels), optionally followed by SiLU.

        y[:, t, c] = act(bias[c] + sum_j weight[c, 0, j] x[:, t - (K - 1) + j, c])

    with x zero (or the given cache) before the start, K = ``kernel_size``.

    Parameters
    ----------
    hidden_size : int
        Channels.
    kernel_size : int
        K, the taps.
    bias : bool
    activation : 'silu' or None
    dtype : float32 (default) or float64

    Attributes
    ----------
    weight : Parameter (hidden_size, 1, kernel_size); bias : Parameter (hidden_size,) or None
    """

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False,
                 activation: str | None = "silu", dtype=None):
        super().__init__(hidden_size, hidden_size, kernel_size, groups=hidden_size,
                         bias=bias, dtype=dtype)
        self.hidden_size = int(hidden_size)
        self.activation = None if activation is None else check_choice(
            activation, name="activation", choices=("silu", "swish"))

    def forward(self, x, cache=None) -> tuple[Tensor, object]:
        """The convolution over whole sequences.

        Parameters
        ----------
        x : Tensor (batch, T, hidden_size)
        cache : array or Tensor (batch, hidden_size, kernel_size) or None
            The last K inputs before x, oldest first (zeros when None).

        Returns
        -------
        y : Tensor (batch, T, hidden_size);  the new cache : array (batch, hidden_size, K)
        """
        x = as_tensor(x)
        K = self.kernel_size[0]
        xt = x.swapaxes(1, 2)  # (batch, D, T)
        xp = array_module(xt.data)
        if cache is None:
            cache = xp.zeros((*xt.shape[:2], K), dtype=xt.dtype)
        cache = as_tensor(cache)
        padded = concat([cache[..., 1:], xt], axis=-1) if K > 1 else xt  # (batch, D, K-1+T)
        y = F.conv1d(padded, self.weight, self.bias, groups=self.hidden_size)  # (batch, D, T)
        if self.activation is not None:
            y = _silu(y)
        window = xp.concatenate([cache.data, xt.data], axis=-1)[..., -K:]  # (batch, D, K)
        return y.swapaxes(1, 2), window

    def step(self, x_t, cache):
        """One token on arrays: x_t (batch, hidden_size), cache (batch, hidden_size, K) ->
        (y_t (batch, hidden_size), new cache)."""
        xp = array_module(x_t)
        window = xp.concatenate([cache[..., 1:], x_t[..., None]], axis=-1)  # (batch, D, K)
        y = (window * self.weight.data[:, 0, :]).sum(-1)
        if self.bias is not None:
            y = y + self.bias.data
        if self.activation is not None:
            y = y * _sigmoid(xp, y)
        return y, window

    def extra_repr(self) -> str:
        return super().extra_repr() + f", activation={self.activation}"


class DeltaNetState(NamedTuple):
    """The decoding state of one ``DeltaNet`` layer (arrays of the layer's dtype and device),
    in fla's cache layouts."""

    conv_state: tuple | None  # (q, k, v): (batch, channels, conv_size) each, oldest first;
    #                           None without short convolutions
    recurrent_state: object  # (batch, num_heads, head_k_dim, head_v_dim): S


class DeltaNet(Module):
    """The DeltaNet mixer, (batch, T, hidden_size) -> same (see the module docstring).

    Parameters
    ----------
    hidden_size : int
    expand_k, expand_v : float
        key_dim = int(hidden_size expand_k), value_dim = int(hidden_size expand_v), each
        divisible by ``num_heads``.
    num_heads : int
        H; head_k_dim = key_dim / H, head_v_dim = value_dim / H.
    use_beta : bool
        beta = sigmoid(b_proj x), else ones.
    use_gate : bool
        An output gate: o_norm(o) * silu(g_proj x) (fla's ``FusedRMSNormGated``).
    use_short_conv : bool
        Short causal convolutions on q, k, v (else SiLU on v, and on q, k for 'silu').
    conv_size : int
    conv_bias : bool
    allow_neg_eigval : bool
        beta times 2 (eigenvalues of I - beta k k^T in [-1, 1]).
    qk_activation : 'silu', 'relu', 'elu' (elu + 1) or 'identity'
    qk_norm : 'l2' (x / sqrt(sum(x^2) + 1e-6) per head) or 'sum' (x / sum(x))
    norm_eps : float
        The output RMS norm's epsilon.
    mode : 'auto' (recurrent on the CPU, chunk on a GPU), 'chunk' or 'recurrent'
        ('fused_recurrent' is taken as 'recurrent')
        How ``F.delta_rule`` runs; equal to rounding.
    chunk_size : int
    dtype : float32 (default) or float64

    Attributes
    ----------
    q_proj, k_proj : Linear (hidden_size -> key_dim, no bias);
    v_proj : Linear (hidden_size -> value_dim, no bias);
    b_proj : Linear (hidden_size -> num_heads, no bias), with use_beta;
    q_conv1d, k_conv1d : ShortConvolution (key_dim, 1, conv_size);
    v_conv1d : ShortConvolution (value_dim, 1, conv_size), with use_short_conv;
    g_proj : Linear (hidden_size -> value_dim, no bias), with use_gate;
    o_norm : RMSNorm (head_v_dim,); o_proj : Linear (value_dim -> hidden_size, no bias)

    Examples
    --------
    >>> import numpy as np, nnkit as nk
    >>> layer = nk.nn.DeltaNet(hidden_size=8, num_heads=2)
    >>> layer(np.zeros((2, 5, 8), np.float32)).shape
    (2, 5, 8)
    """

    def __init__(self, hidden_size: int = 1024, expand_k: float = 1.0, expand_v: float = 1.0,
                 num_heads: int = 4, use_beta: bool = True, use_gate: bool = False,
                 use_short_conv: bool = True, conv_size: int = 4, conv_bias: bool = False,
                 allow_neg_eigval: bool = False, qk_activation: str = "silu",
                 qk_norm: str = "l2", norm_eps: float = 1e-5, mode: str = "auto",
                 chunk_size: int = 64, dtype=None):
        super().__init__()
        size = dict(kind=numbers.Integral, low=1)
        self.hidden_size = int(check_scalar(hidden_size, name="hidden_size", **size))
        self.num_heads = H = int(check_scalar(num_heads, name="num_heads", **size))
        self.expand_k = float(check_scalar(expand_k, name="expand_k", low=0.0,
                                           low_inclusive=False))
        self.expand_v = float(check_scalar(expand_v, name="expand_v", low=0.0,
                                           low_inclusive=False))
        self.key_dim = int(self.hidden_size * self.expand_k)
        self.value_dim = int(self.hidden_size * self.expand_v)
        for name, dim in (("key_dim", self.key_dim), ("value_dim", self.value_dim)):
            if dim < H or dim % H:
                raise ValueError(f"{name}={dim} (hidden_size times expand) must be a positive "
                                 f"multiple of num_heads={H}")
        self.head_k_dim, self.head_v_dim = self.key_dim // H, self.value_dim // H
        self.use_beta = check_bool(use_beta, name="use_beta")
        self.use_gate = check_bool(use_gate, name="use_gate")
        self.use_short_conv = check_bool(use_short_conv, name="use_short_conv")
        self.allow_neg_eigval = check_bool(allow_neg_eigval, name="allow_neg_eigval")
        self.conv_size = int(check_scalar(conv_size, name="conv_size", **size))
        self.conv_bias = check_bool(conv_bias, name="conv_bias")
        self.qk_activation = check_choice(qk_activation, name="qk_activation",
                                          choices=("silu", "relu", "elu", "identity"))
        self.qk_norm = check_choice(qk_norm, name="qk_norm", choices=("l2", "sum"))
        self.norm_eps = float(check_scalar(norm_eps, name="norm_eps", low=0.0))
        mode = check_choice(mode, name="mode", choices=("auto", "chunk", "recurrent",
                                                         "fused_recurrent"))
        self.mode = "recurrent" if mode == "fused_recurrent" else mode
        self.chunk_size = int(check_scalar(chunk_size, name="chunk_size", **size))
        self._build(_dtype(dtype))

    def _build(self, dtype) -> None:
        D, Dk, Dv = self.hidden_size, self.key_dim, self.value_dim
        self.q_proj = Linear(D, Dk, bias=False, dtype=dtype)
        self.k_proj = Linear(D, Dk, bias=False, dtype=dtype)
        self.v_proj = Linear(D, Dv, bias=False, dtype=dtype)
        if self.use_beta:
            self.b_proj = Linear(D, self.num_heads, bias=False, dtype=dtype)
        if self.use_short_conv:
            qk_act = "silu" if self.qk_activation == "silu" else None
            conv = dict(kernel_size=self.conv_size, bias=self.conv_bias, dtype=dtype)
            self.q_conv1d = ShortConvolution(Dk, activation=qk_act, **conv)
            self.k_conv1d = ShortConvolution(Dk, activation=qk_act, **conv)
            self.v_conv1d = ShortConvolution(Dv, activation="silu", **conv)
        if self.use_gate:
            self.g_proj = Linear(D, Dv, bias=False, dtype=dtype)
        self.o_norm = RMSNorm(self.head_v_dim, eps=self.norm_eps, dtype=dtype)
        self.o_proj = Linear(Dv, D, bias=False, dtype=dtype)

    @property
    def dtype(self) -> np.dtype:
        return self.o_proj.weight.dtype

    # ----- the full sequence -----------------------------------------------------------------
    def forward(self, x, initial_state: DeltaNetState | None = None,
                output_final_state: bool = False):
        """The mixer over whole sequences.

        Parameters
        ----------
        x : Tensor or array (batch, T, hidden_size)
        initial_state : DeltaNetState or None
            The state after earlier tokens (from ``forward(..., output_final_state=True)`` or
            ``step``); zeros when None.
        output_final_state : bool
            Also return the ``DeltaNetState`` after the last token.

        Returns
        -------
        Tensor (batch, T, hidden_size), differentiable in x and every parameter; with
        ``output_final_state``, ``(output, DeltaNetState)``.
        """
        x = as_tensor(x)
        if x.ndim != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"x must have shape (batch, T, hidden_size={self.hidden_size}), "
                             f"got {x.shape}")
        check_input_dtype(x, self.dtype, name="x", owner="DeltaNet")
        output_final_state = check_bool(output_final_state, name="output_final_state")
        B, T, _ = x.shape
        if initial_state is not None:
            self._check_state(initial_state, B)
        H, dk, dv = self.num_heads, self.head_k_dim, self.head_v_dim
        q, k, v, windows = self._qkv(x, None if initial_state is None
                                     else initial_state.conv_state)
        q = q.reshape(B, T, H, dk).swapaxes(1, 2)  # (B, H, T, dk)
        k = k.reshape(B, T, H, dk).swapaxes(1, 2)
        v = v.reshape(B, T, H, dv).swapaxes(1, 2)  # (B, H, T, dv)
        q, k = self._feature(q), self._feature(k)
        beta = self._beta(x).swapaxes(1, 2)  # (B, H, T)
        o, final = F.delta_rule(q, k, v, beta, scale=dk ** -0.5,
                                initial_state=None if initial_state is None
                                else initial_state.recurrent_state,
                                output_final_state=output_final_state, mode=self.mode,
                                chunk_size=self.chunk_size)
        o = self.o_norm(o.swapaxes(1, 2))  # (B, T, H, dv)
        if self.use_gate:
            o = o * _silu(self.g_proj(x).reshape(B, T, H, dv))
        out = self.o_proj(o.reshape(B, T, H * dv))
        if not output_final_state:
            return out
        return out, DeltaNetState(windows, final.data)

    def _qkv(self, x: Tensor, conv_state):
        """The projections and short convolutions: q, k (B, T, key_dim), v (B, T, value_dim)
        and the convolutions' new windows (or None)."""
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if not self.use_short_conv:
            if self.qk_activation == "silu":
                q, k = _silu(q), _silu(k)
            return q, k, _silu(v), None
        cq, ck, cv = (None, None, None) if conv_state is None else conv_state
        q, wq = self.q_conv1d(q, cq)
        k, wk = self.k_conv1d(k, ck)
        v, wv = self.v_conv1d(v, cv)
        return q, k, v, (wq, wk, wv)

    def _feature(self, x: Tensor) -> Tensor:
        """fla's order: the non-SiLU activation, then the per-head norm over the last axis."""
        if self.qk_activation == "relu":
            x = x.relu()
        elif self.qk_activation == "elu":  # elu(x) + 1
            x = where(x.data > 0, x + 1, x.clip(max=0).exp())
        if self.qk_norm == "sum":
            return x / x.sum(axis=-1, keepdims=True)
        return x / ((x * x).sum(axis=-1, keepdims=True) + _L2_EPS).sqrt()

    def _beta(self, x: Tensor) -> Tensor:
        """beta (B, T, H)."""
        if self.use_beta:
            beta = self.b_proj(x).sigmoid()
        else:
            xp = array_module(x.data)
            beta = as_tensor(xp.ones((*x.shape[:2], self.num_heads), dtype=x.dtype))
        return beta * 2 if self.allow_neg_eigval else beta

    # ----- one token at a time ---------------------------------------------------------------
    def initial_state(self, batch: int) -> DeltaNetState:
        """Zero state for ``batch`` sequences (before the first token)."""
        xp = array_module(self.o_proj.weight.data)
        conv = None
        if self.use_short_conv:
            conv = tuple(xp.zeros((batch, c, self.conv_size), dtype=self.dtype)
                         for c in (self.key_dim, self.key_dim, self.value_dim))
        S = xp.zeros((batch, self.num_heads, self.head_k_dim, self.head_v_dim),
                     dtype=self.dtype)
        return DeltaNetState(conv, S)

    def _check_state(self, state, batch: int) -> None:
        want = self.initial_state(batch)
        ok = isinstance(state, tuple) and len(state) == 2 and \
            tuple(state[1].shape) == want[1].shape
        if ok and self.use_short_conv:
            ok = isinstance(state[0], tuple) and len(state[0]) == 3 and all(
                tuple(a.shape) == b.shape for a, b in zip(state[0], want[0], strict=True))
        elif ok:
            ok = state[0] is None
        if not ok:
            conv = None if want[0] is None else [a.shape for a in want[0]]
            raise ValueError(f"state must be a DeltaNetState (conv_state {conv}, "
                             f"recurrent_state {want[1].shape}) for batch {batch}")

    def step(self, x_t, state: DeltaNetState | None = None):
        """One decoding step in O(1) time and memory: the output for token t from x_t and the
        state after token t - 1 (plain arrays, no gradient).

        Parameters
        ----------
        x_t : array or Tensor (batch, hidden_size)
        state : DeltaNetState or None
            The state after the previous token (``initial_state`` when None).

        Returns
        -------
        (y_t (batch, hidden_size) array, new DeltaNetState); the given state is not modified.
        """
        x_t = x_t.data if isinstance(x_t, Tensor) else x_t
        xp = array_module(self.o_proj.weight.data)
        x_t = xp.asarray(x_t)
        if x_t.ndim != 2 or x_t.shape[-1] != self.hidden_size:
            raise ValueError(f"x_t must have shape (batch, hidden_size={self.hidden_size}), "
                             f"got {x_t.shape}")
        check_input_dtype(x_t, self.dtype, name="x_t", owner="DeltaNet")
        state = self.initial_state(x_t.shape[0]) if state is None else state
        self._check_state(state, x_t.shape[0])
        with no_grad():
            return self._step(xp, x_t, state)

    def _step(self, xp, x_t, state: DeltaNetState):
        B, H, dk, dv = x_t.shape[0], self.num_heads, self.head_k_dim, self.head_v_dim
        q, k, v = (x_t @ p.weight.data.T for p in (self.q_proj, self.k_proj, self.v_proj))
        windows = None
        if self.use_short_conv:
            cq, ck, cv = state.conv_state
            (q, wq), (k, wk), (v, wv) = (self.q_conv1d.step(q, cq), self.k_conv1d.step(k, ck),
                                         self.v_conv1d.step(v, cv))
            windows = (wq, wk, wv)
        else:
            if self.qk_activation == "silu":
                q, k = q * _sigmoid(xp, q), k * _sigmoid(xp, k)
            v = v * _sigmoid(xp, v)
        with no_grad():
            q = self._feature(as_tensor(q.reshape(B, H, dk))).data
            k = self._feature(as_tensor(k.reshape(B, H, dk))).data
            beta = self._beta(as_tensor(x_t[:, None])).data[:, 0]  # (B, H)
        v = v.reshape(B, H, dv)
        S = state.recurrent_state
        error = v - xp.einsum("bhk,bhkv->bhv", k, S)  # v_t - S^T k_t
        S = S + beta[..., None, None] * k[..., :, None] * error[..., None, :]
        o = dk ** -0.5 * xp.einsum("bhk,bhkv->bhv", q, S)  # (B, H, dv)
        w = self.o_norm.weight.data
        o = o / xp.sqrt((o * o).mean(-1, keepdims=True) + self.norm_eps) * w
        if self.use_gate:
            g = (x_t @ self.g_proj.weight.data.T).reshape(B, H, dv)
            o = o * (g * _sigmoid(xp, g))
        y = o.reshape(B, H * dv) @ self.o_proj.weight.data.T
        return y, DeltaNetState(windows, S)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, "
                f"key_dim={self.key_dim}, value_dim={self.value_dim}, "
                f"use_beta={self.use_beta}, use_gate={self.use_gate}, "
                f"use_short_conv={self.use_short_conv}, conv_size={self.conv_size}, "
                f"qk_activation={self.qk_activation!r}, qk_norm={self.qk_norm!r}, "
                f"mode={self.mode!r}")


def _silu(x: Tensor) -> Tensor:
    return x * F.sigmoid(x)


def _sigmoid(xp, x):
    return 0.5 * (xp.tanh(0.5 * x) + 1)  # no overflow for large |x|
